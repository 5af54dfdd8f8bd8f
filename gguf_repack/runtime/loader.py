"""load(out): an output directory as {GGUF tensor name -> QTensor | torch.Tensor}.

The directory is read through format.output_dir.OutputDir (manifest, records, shards, plane
checks: the same reader as verify and export). Tensors are materialized on first access,
each from its own byte ranges of the memory-mapped safetensors shards: loading a model and
touching one tensor reads only that tensor.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from gguf_repack.converter.reader import read_gguf_header
from gguf_repack.errors import FormatError
from gguf_repack.format.manifest import TensorRecord
from gguf_repack.format.output_dir import OutputDir

from .qtensor import QTensor


def load(path: str | os.PathLike, device: str | torch.device = "cpu", *,
         verify: bool = False) -> "RepackedModel":
    """Open a gguf-repack output directory. With `verify=True`, every tensor's checksum is
    recomputed from its planes first, and a mismatch raises FormatError."""
    path = Path(path)
    if verify:
        from gguf_repack.converter.rebuild import verify as run_verify

        report = run_verify(path)
        if not report.ok:
            raise FormatError(f"{path}: verify failed: " + "; ".join(report.mismatches))
    return RepackedModel(path, torch.device(device))


class RepackedModel(Mapping):
    """The tensors of an output directory by GGUF name, plus `.config`, `.metadata` and
    `.manifest`. Quantized tensors are QTensors; plain ones (norms, F16/F32 weights) are
    torch tensors."""

    def __init__(self, path: Path, device: torch.device):
        self.path, self.device = path, device
        self._dir = OutputDir(path)
        self.manifest = self._dir.manifest
        self._records = self._dir.records
        self._cache: dict[str, QTensor | torch.Tensor] = {}
        self._shards: dict[str, Any] = {}

    # -- Mapping -----------------------------------------------------------------------
    def __getitem__(self, name: str) -> QTensor | torch.Tensor:
        if name not in self._cache:
            record = self._records.get(name)
            if record is None:
                raise KeyError(name)
            self._cache[name] = self._materialize(record)
        return self._cache[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._records)

    def __len__(self) -> int:
        return len(self._records)

    def __repr__(self) -> str:
        return f"RepackedModel({str(self.path)!r}, {len(self)} tensors, device={self.device})"

    def record(self, name: str) -> TensorRecord:
        """The manifest's record of tensor `name` (type, shape, planes), without reading it."""
        return self._records[name]

    @property
    def loaded(self) -> list[str]:
        """Names of the tensors read so far."""
        return list(self._cache)

    # -- model information -------------------------------------------------------------
    @cached_property
    def config(self) -> dict | None:
        """config.json (written for engines), parsed, or None when absent."""
        config = self.path / "config.json"
        return json.loads(config.read_text()) if config.is_file() else None

    @cached_property
    def metadata(self) -> dict[str, Any]:
        """The GGUF key/values of the (first) source file as Python values."""
        source = self.manifest["sources"][0]
        header = (self.path / source["header"]["file"]).read_bytes()
        gguf = read_gguf_header(header, self.path / source["header"]["file"], source["size"])
        return {key: kv.python_value for key, kv in gguf.kvs.items()}

    # -- reading -----------------------------------------------------------------------
    def _shard(self, name: str):
        if name not in self._shards:
            from safetensors import safe_open

            self._dir.entries(name)  # inside the directory, and its header checked
            shard = self.path / name
            try:
                self._shards[name] = safe_open(shard, framework="pt", device=str(self.device))
            except Exception as e:  # SafetensorError: a damaged header, bytes no entry owns
                raise FormatError(f"{shard}: not a readable safetensors shard ({e})") from None
        return self._shards[name]

    def _materialize(self, record: TensorRecord) -> QTensor | torch.Tensor:
        self._dir.check_planes(record)  # its type, layout and planes, before any read
        shard = self._shard(record.shard)
        try:
            planes = {p.field: shard.get_tensor(p.key) for p in record.planes}
        except Exception as e:  # safetensors reports a missing key as a plain exception
            raise FormatError(f"{self.path / record.shard}: cannot read tensor "
                              f"{record.name!r} ({e})") from None
        if record.layout == "plain":
            return planes["data"]
        return QTensor(record.type, record.shape, planes)
