"""The one reader of an output directory: its manifest and tensor records (each type checked
against the type table, by name and id), its shards (inside the directory, their safetensors
headers read strictly), each tensor's planes checked against what its type needs, and each
tensor's source bytes rebuilt from its planes (the inverse of convert), a bounded chunk at a
time. `load`, `verify`, `export` and `inspect` all read through it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from gguf_repack.errors import FormatError

from .layout import blocks_shape, plane_shapes, unpack
from .manifest import TensorRecord, read_manifest
from .safetensors_io import Entry, pread_into, read_header, st_dtype
from .type_table import TYPES_BY_NAME, GGMLType

CHUNK_BYTES = 16 << 20


class OutputDir:
    """An opened gguf-repack output directory. Use as a context manager when reading bytes
    (`entry`, `source_chunks`: shard files stay open until `close`)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.manifest = read_manifest(self.path)
        self.sources: list[dict] = self.manifest["sources"]
        try:
            self.tensors = [TensorRecord.from_json(t) for t in self.manifest["tensors"]]
        except (TypeError, KeyError, AttributeError) as e:
            raise FormatError(f"{self.path}/manifest.json: malformed tensor record ({e})") from None
        self.records = {t.name: t for t in self.tensors}
        for t in self.tensors:
            self.qtype(t)
        self._entries: dict[str, dict[str, Entry]] = {}
        self._fds: dict[str, int] = {}

    def __enter__(self) -> "OutputDir":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def qtype(self, t: TensorRecord) -> GGMLType:
        qtype = TYPES_BY_NAME.get(t.type) if isinstance(t.type, str) else None
        if qtype is None or qtype.id != t.type_id:
            raise FormatError(f"{self.path}: tensor {t.name!r} has type {t.type} "
                              f"(id {t.type_id}), unknown to this gguf-repack")
        # the layout its type is stored in (FORMAT.md 4.1, 4.2): a later layout's planes read
        # as rp1 would rebuild wrong bytes, so verify and export refuse them as load does
        layout = "rp1" if qtype.is_quantized else "plain"
        if t.layout != layout:
            raise FormatError(f"{self.path}: tensor {t.name!r} has layout {t.layout!r}; this "
                              f"gguf-repack reads {qtype.name} in layout {layout!r}")
        return qtype

    def shard_path(self, shard: str) -> Path:
        """A shard file the manifest names, which must lie inside the directory."""
        path = self.path / shard
        if path.resolve().parent != self.path.resolve():
            raise FormatError(f"{self.path}: the manifest names a shard outside the directory: "
                              f"{shard!r}")
        if not path.is_file():
            raise FormatError(f"{self.path}: missing shard {shard!r}")
        return path

    def entries(self, shard: str) -> dict[str, Entry]:
        """The safetensors entries of a shard, its header checked (safetensors_io.read_header)."""
        if shard not in self._entries:
            self._entries[shard] = read_header(self.shard_path(shard))[0]
        return self._entries[shard]

    def plane_entry(self, t: TensorRecord, key: str) -> Entry:
        entry = self.entries(t.shard).get(key)
        if entry is None:
            raise FormatError(f"{self.path / t.shard}: no entry {key!r} for tensor {t.name!r}")
        return entry

    def entry(self, t: TensorRecord, key: str) -> tuple[int, Entry]:
        """File descriptor and safetensors entry of one plane."""
        entry = self.plane_entry(t, key)
        if t.shard not in self._fds:
            self._fds[t.shard] = os.open(self.path / t.shard, os.O_RDONLY)
        return self._fds[t.shard], entry

    def check_planes(self, t: TensorRecord) -> None:
        """Every plane of a quantized tensor is in its shard with the dtype and shape that its
        type needs (an output written with another type table would not be)."""
        qtype = self.qtype(t)
        if not qtype.is_quantized:
            if [p.field for p in t.planes] != ["data"]:
                raise FormatError(f"{self.path}/manifest.json: plain tensor {t.name!r} must have "
                                  f"one plane, 'data'")
            self.plane_entry(t, t.planes[0].key)
            return
        keys = {p.field: p.key for p in t.planes}
        expected = plane_shapes(tuple(t.shape), qtype)
        for f in qtype.fields:
            if f.name not in keys:
                raise FormatError(f"{self.path}/manifest.json: tensor {t.name!r} has no plane "
                                  f"{f.name!r}, which {qtype.name} needs")
            entry = self.plane_entry(t, keys[f.name])
            if (entry.dtype, entry.shape) != (st_dtype(f.plane_dtype), expected[f.name]):
                raise FormatError(
                    f"{self.path / t.shard}: tensor {t.name!r}: plane {f.name!r} is not the "
                    f"{st_dtype(f.plane_dtype)} {list(expected[f.name])} that {qtype.name} needs "
                    f"(an output written with another type table?)")

    def source_chunks(self, t: TensorRecord) -> Iterator[tuple[int, np.ndarray]]:
        """(offset in the tensor's source bytes, uint8 array) pieces, in order, that together
        are exactly the tensor's bytes in the source GGUF file."""
        qtype = self.qtype(t)
        if not qtype.is_quantized:
            fd, e = self.entry(t, t.planes[0].key)
            for off in range(0, e.nbytes, CHUNK_BYTES):
                buf = np.empty(min(CHUNK_BYTES, e.nbytes - off), np.uint8)
                pread_into(fd, buf, e.offset + off, str(self.path / t.shard))
                yield off, buf
            return
        *lead, n_rows, n_blocks, type_size = blocks_shape(tuple(t.shape), qtype)
        row_bytes = n_blocks * type_size
        rows_per_chunk = max(1, CHUNK_BYTES // max(row_bytes, 1))
        self.check_planes(t)
        planes = {p.field: self.entry(t, p.key) for p in t.planes}
        for r in range(int(np.prod(lead, dtype=np.int64))):
            for n0 in range(0, n_rows, rows_per_chunk):
                rows = min(rows_per_chunk, n_rows - n0)
                chunk = {}
                for f in qtype.fields:
                    fd, e = planes[f.name]
                    plane = np.empty((n_blocks, rows, f.count), f.plane_dtype)
                    base = e.offset + r * n_blocks * n_rows * f.size
                    if rows == n_rows:
                        pread_into(fd, plane, base)
                    else:
                        for b in range(n_blocks):
                            pread_into(fd, plane[b], base + (b * n_rows + n0) * f.size)
                    chunk[f.name] = plane
                yield (r * n_rows + n0) * row_bytes, unpack(chunk, qtype).reshape(-1)

    def header_bytes(self, i: int) -> bytes:
        return (self.path / self.sources[i]["header"]["file"]).read_bytes()

    def gap_bytes(self, i: int) -> Iterator[tuple[int, bytes | None]]:
        """(offset, bytes) for each gap of source i; None for a gap of zeros."""
        source = self.sources[i]
        stored = (self.path / source["gaps_file"]).read_bytes() if source["gaps_file"] else b""
        for gap in source["gaps"]:
            at = gap["stored_at"]
            yield gap["offset"], (None if at is None else stored[at : at + gap["length"]])
