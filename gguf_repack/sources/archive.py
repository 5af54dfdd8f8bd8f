"""Archives: every GGUF model under a directory, a split set counted once (by its first shard),
each with the output directory name it gets under an output root."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from gguf_repack.converter.reader import SPLIT_NAME


@dataclass
class ArchiveModel:
    path: Path  # the file, or the first shard
    files: list[Path]  # every file of the model found beside it
    name: str  # its output directory, relative to the output root

    @property
    def size(self) -> int:
        return sum(f.stat().st_size for f in self.files)


def find_models(root: Path, skip: Path | None = None) -> list[ArchiveModel]:
    """Every .gguf model under `root`, sorted by name; hidden directories and `skip` (an
    output root inside the archive) are not searched. A split set is one model, named by its
    prefix; a shard without its first shard is still listed, so that its conversion reports
    what is wrong with it rather than leaving it out unseen."""
    skip = skip.resolve() if skip is not None else None
    found: dict[Path, list[Path]] = {}
    for directory, subdirs, names in os.walk(root):
        here = Path(directory)
        subdirs[:] = sorted(d for d in subdirs if not d.startswith(".")
                            and (skip is None or (here / d).resolve() != skip))
        for name in sorted(names):
            if not name.lower().endswith(".gguf") or name.startswith("."):
                continue
            m = SPLIT_NAME.match(name)
            if m and int(m["no"]) > 1 and (here / f"{m['prefix']}-00001-of-{m['count']}.gguf").exists():
                first = here / f"{m['prefix']}-00001-of-{m['count']}.gguf"
                found.setdefault(first, [first]).append(here / name)
                continue
            found.setdefault(here / name, [here / name])
    models = []
    for path, files in sorted(found.items()):
        m = SPLIT_NAME.match(path.name)
        stem = m["prefix"] if m and int(m["no"]) == 1 else path.name[: -len(".gguf")]
        name = (path.parent.relative_to(root) / stem).as_posix()
        models.append(ArchiveModel(path, sorted(set(files)), name))
    return models
