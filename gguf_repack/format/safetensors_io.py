"""Streaming safetensors files: the header is planned up front, the data written in pieces.

The `safetensors` package's writer wants every tensor of a file in memory at once; a 4 GB
shard would then cost 4 GB of RAM. The format is simple enough to stream: an 8-byte
little-endian header length, a JSON header naming each tensor's dtype, shape and byte range,
then the data, contiguous and without holes. The files written here are read back by the
`safetensors` package itself in the tests.

Entries are ordered by element size, largest first, so every tensor starts at an offset
aligned to its own element size: a memory map can be viewed as any of them without a copy.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass

import numpy as np

from gguf_repack.errors import FormatError

_NUMPY_TO_ST = {"<f2": "F16", "<f4": "F32", "<f8": "F64", "|i1": "I8", "<i2": "I16",
                "<i4": "I32", "<i8": "I64", "|u1": "U8", "<u2": "U16", "<u4": "U32",
                "<u8": "U64"}
ST_ITEMSIZE = {"F16": 2, "BF16": 2, "F32": 4, "F64": 8, "I8": 1, "I16": 2, "I32": 4, "I64": 8,
               "U8": 1, "U16": 2, "U32": 4, "U64": 8, "BOOL": 1}
# safetensors dtype -> numpy dtype holding the same bytes (bfloat16 as its 16 raw bits)
ST_NUMPY = {"F16": "<f2", "BF16": "<u2", "F32": "<f4", "F64": "<f8", "I8": "i1", "I16": "<i2",
            "I32": "<i4", "I64": "<i8", "U8": "u1", "U16": "<u2", "U32": "<u4", "U64": "<u8",
            "BOOL": "u1"}


def st_dtype(dtype: np.dtype) -> str:
    return _NUMPY_TO_ST[np.dtype(dtype).str]


@dataclass
class Entry:
    key: str
    dtype: str  # safetensors dtype name
    shape: tuple[int, ...]
    offset: int = 0  # absolute, in the file

    @property
    def nbytes(self) -> int:
        n = ST_ITEMSIZE[self.dtype]
        for d in self.shape:
            n *= d
        return n


def layout_file(entries: list[Entry], metadata: dict[str, str] | None = None) -> bytes:
    """Order `entries`, set their absolute offsets, and return the file's header bytes."""
    entries.sort(key=lambda e: -ST_ITEMSIZE[e.dtype])  # stable: keeps tensor order per size
    header: dict = {"__metadata__": dict(metadata or {})}
    pos = 0
    for e in entries:
        header[e.key] = {"dtype": e.dtype, "shape": list(e.shape),
                         "data_offsets": [pos, pos + e.nbytes]}
        e.offset = pos
        pos += e.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # data starts 8-byte aligned
    start = 8 + len(raw)
    for e in entries:
        e.offset += start
    return struct.pack("<Q", len(raw)) + raw


def read_header(path: str | os.PathLike) -> tuple[dict[str, Entry], dict[str, str]]:
    """Entries (with absolute offsets) and metadata of a safetensors file, checked."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            raw_len = f.read(8)
            if len(raw_len) < 8:
                raise FormatError(f"{path}: truncated safetensors file")
            (n,) = struct.unpack("<Q", raw_len)
            if n > size - 8:
                raise FormatError(f"{path}: safetensors header length {n} exceeds the file")
            header = json.loads(f.read(n))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FormatError(f"{path}: unreadable safetensors header ({e})") from None
    except FileNotFoundError:
        raise FormatError(f"{path}: missing") from None
    metadata = header.pop("__metadata__", {}) or {}
    entries, ranges = {}, []
    for key, spec in header.items():
        try:
            begin, stop = spec["data_offsets"]
            e = Entry(key, spec["dtype"], tuple(spec["shape"]), 8 + n + begin)
            ok = stop - begin == e.nbytes and 0 <= begin and 8 + n + stop <= size
        except (KeyError, TypeError, ValueError):
            ok = False
        if not ok:
            raise FormatError(f"{path}: bad safetensors entry {key!r}: {spec}")
        entries[key] = e
        ranges.append((begin, stop, key))
    # the data is contiguous and without holes, and ends the file (as safetensors requires):
    # bytes no entry owns, or two entries sharing bytes, mean a damaged or foreign file
    at = 0
    for begin, stop, key in sorted(ranges):
        if begin != at:
            raise FormatError(f"{path}: safetensors entry {key!r} starts at data byte {begin}, "
                              f"expected {at}: a hole or an overlap in the data")
        at = stop
    if 8 + n + at != size:
        raise FormatError(f"{path}: safetensors data ends at byte {8 + n + at} of a "
                          f"{size}-byte file")
    return entries, metadata


def _bytes_view(data) -> memoryview:
    if isinstance(data, np.ndarray):
        data = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    return memoryview(data).cast("B")


def pread_into(fd: int, out: np.ndarray, offset: int, path: str = "") -> None:
    """Fill the contiguous array `out` from the file at `offset`."""
    view = _bytes_view(out)
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n == 0:
            raise FormatError(f"{path}: unexpected end of file at offset {offset + done}")
        done += n


def pwrite_all(fd: int, data, offset: int) -> None:
    view = _bytes_view(data)
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], offset + done)
