"""load(out): an output directory as {GGUF tensor name -> QTensor | torch.Tensor}.

Tensors are materialized on first access, each from its own byte ranges of the memory-mapped
safetensors shards: loading a model and touching one tensor reads only that tensor.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from .errors import FormatError
from .manifest import TensorRecord, read_manifest
from .qtensor import QTensor
from .reader import read_gguf_header
from .type_table import TYPES_BY_NAME


def load(path: str | os.PathLike, device: str | torch.device = "cpu", *,
         verify: bool = False) -> "RepackedModel":
    """Open a gguf-repack output directory. With `verify=True`, every tensor's checksum is
    recomputed from its planes first, and a mismatch raises FormatError."""
    path = Path(path)
    if verify:
        from .rebuild import verify as run_verify

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
        self.manifest = read_manifest(path)
        try:
            self._records = {t["name"]: TensorRecord.from_json(t) for t in self.manifest["tensors"]}
        except TypeError as e:
            raise FormatError(f"{path}/manifest.json: malformed tensor record ({e})") from None
        for r in self._records.values():
            if r.type not in TYPES_BY_NAME:
                raise FormatError(f"{path}: tensor {r.name!r} has type {r.type}, unknown to "
                                  f"this gguf-repack")
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

            shard = self.path / name
            if shard.resolve().parent != self.path.resolve() or not shard.is_file():
                raise FormatError(f"{self.path}: missing or misplaced shard {name!r}")
            try:
                self._shards[name] = safe_open(shard, framework="pt", device=str(self.device))
            except Exception as e:  # SafetensorError: a damaged header, bytes no entry owns
                raise FormatError(f"{shard}: not a readable safetensors shard ({e})") from None
        return self._shards[name]

    def _materialize(self, record: TensorRecord) -> QTensor | torch.Tensor:
        shard = self._shard(record.shard)
        try:
            planes = {p.field: shard.get_tensor(p.key) for p in record.planes}
        except Exception as e:  # safetensors reports a missing key as a plain exception
            raise FormatError(f"{self.path / record.shard}: cannot read tensor "
                              f"{record.name!r} ({e})") from None
        if record.layout == "plain":
            return planes["data"]
        if record.layout != "rp1":
            raise FormatError(f"{self.path}: tensor {record.name!r} has layout "
                              f"{record.layout!r}, unknown to this gguf-repack")
        return QTensor(record.type, record.shape, planes)
