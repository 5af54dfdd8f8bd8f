"""Where GGUF models come from: a local file (or the first shard of a split set), a Hugging
Face Hub reference (hub.py), or a directory holding many (archive.py)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from gguf_repack.errors import RepackError

from .hub import is_hub_reference


@dataclass
class Source:
    path: Path  # the file (or first shard) to read
    origins: list[dict] | None  # per file, where it was downloaded from; None for local files
    label: str  # how to name it to a person


def resolve_source(src: str | os.PathLike, revision: str | None = None, *,
                   progress: bool = True) -> Source:
    """A source argument as every command takes it: a local path as it is, or a Hub
    reference, downloaded into the Hub cache (or found there) and checked."""
    if is_hub_reference(str(src)):
        from .hub import resolve

        model = resolve(str(src), revision, progress=progress)
        return Source(model.first, model.origins(), model.describe())
    if revision is not None:
        raise RepackError(f"{src}: --revision applies to Hub references (owner/repo:QUANT), "
                          f"not to a local file")
    return Source(Path(src), None, str(src))
