"""A bounded scanner for GGUF headers: magic, version, key/values and tensor infos.

Why our own: gguf's GGUFReader parses a 262k-token vocabulary one element at a time (about
10 s for Gemma 3); this scanner walks the same header in a fraction of a second, and checks
every count, length, dimension and offset against the file size before it allocates
anything, so a hostile header cannot make it allocate or loop without bound. String arrays
are stepped over by their lengths and decoded only when asked for. The `gguf` package
supplies the constants (value types, quant types and sizes); its GGUFReader is the
reference that the tests compare this scanner with.

Only the header is read here. Tensor data stays in the file; `TensorInfo.file_offset`
says where.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf.constants import GGUFValueType

from gguf_repack.errors import FormatError
from gguf_repack.format.type_table import GGMLType, ggml_type

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS

_SCALARS: dict[GGUFValueType, str] = {
    GGUFValueType.UINT8: "<u1", GGUFValueType.INT8: "<i1",
    GGUFValueType.UINT16: "<u2", GGUFValueType.INT16: "<i2",
    GGUFValueType.UINT32: "<u4", GGUFValueType.INT32: "<i4",
    GGUFValueType.UINT64: "<u8", GGUFValueType.INT64: "<i8",
    GGUFValueType.FLOAT32: "<f4", GGUFValueType.FLOAT64: "<f8",
    GGUFValueType.BOOL: "<u1",
}
_STRUCT_CODES = {GGUFValueType.UINT8: "B", GGUFValueType.INT8: "b", GGUFValueType.UINT16: "H",
                 GGUFValueType.INT16: "h", GGUFValueType.UINT32: "I", GGUFValueType.INT32: "i",
                 GGUFValueType.UINT64: "Q", GGUFValueType.INT64: "q", GGUFValueType.FLOAT32: "f",
                 GGUFValueType.FLOAT64: "d", GGUFValueType.BOOL: "?"}

SPLIT_NAME = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


class StringArray:
    """An array of GGUF strings kept as its raw bytes; decoded on first use."""

    def __init__(self, raw: bytes, count: int):
        self.raw, self.count = raw, count
        self._items: list[str] | None = None

    def __len__(self) -> int:
        return self.count

    def __iter__(self):
        return iter(self.items)

    def __getitem__(self, i):
        return self.items[i]

    @property
    def items(self) -> list[str]:
        if self._items is None:
            items, pos, raw = [], 0, self.raw
            for _ in range(self.count):
                (n,) = struct.unpack_from("<Q", raw, pos)
                items.append(raw[pos + 8 : pos + 8 + n].decode("utf-8", errors="replace"))
                pos += 8 + n
            self._items = items
        return self._items

    def __repr__(self) -> str:
        return f"StringArray({self.count} strings)"


@dataclass
class KV:
    key: str
    type: GGUFValueType
    value: Any  # int/float/bool/str; numpy array, StringArray or list (nested) for arrays
    item_type: GGUFValueType | None = None  # for arrays

    @property
    def python_value(self) -> Any:
        """JSON-friendly: numpy arrays and string arrays as lists."""
        return _to_python(self.value)


def _to_python(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, StringArray):
        return value.items
    if isinstance(value, list):
        return [_to_python(v) for v in value]
    return value


@dataclass
class TensorInfo:
    name: str
    dims: tuple[int, ...]  # ggml order: ne0 (the contiguous one) first
    type: GGMLType
    offset: int  # relative to the data section, as stored
    file_offset: int  # absolute
    nbytes: int

    @property
    def shape(self) -> tuple[int, ...]:
        """Torch order: (E..., N, K)."""
        return tuple(reversed(self.dims))

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.dims:
            n *= d
        return n


@dataclass
class GGUFFile:
    path: Path
    size: int
    version: int
    kvs: dict[str, KV]
    tensors: list[TensorInfo]
    header_size: int  # magic through the last tensor info
    alignment: int
    data_offset: int  # start of the data section (header_size padded to the alignment)

    def get(self, key: str, default: Any = None) -> Any:
        kv = self.kvs.get(key)
        return default if kv is None else kv.value

    @property
    def split_count(self) -> int:
        return int(self.get("split.count", 0) or 0)


class _Cursor:
    """Reads little-endian values from a buffer, refusing to read past its end."""

    def __init__(self, buf, path: Path):
        self.buf, self.pos, self.size, self.path = buf, 0, len(buf), path

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise FormatError(
                f"{self.path}: truncated or corrupt at offset {self.pos}: {what} needs {n} bytes, "
                f"the file has {self.size - self.pos} left")

    def unpack(self, fmt: str, what: str):
        n = struct.calcsize(fmt)
        self.need(n, what)
        values = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return values

    def u32(self, what: str) -> int:
        return self.unpack("<I", what)[0]

    def u64(self, what: str) -> int:
        return self.unpack("<Q", what)[0]

    def bytes(self, n: int, what: str) -> bytes:
        self.need(n, what)
        out = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return out

    def string(self, what: str) -> str:
        start = self.pos
        n = self.u64(f"length of {what}")
        if n > self.size - self.pos:
            raise FormatError(f"{self.path}: {what} at offset {start} claims {n} bytes, "
                              f"but only {self.size - self.pos} remain in the file")
        raw = self.bytes(n, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise FormatError(f"{self.path}: {what} at offset {start} is not valid UTF-8") from None


def read_gguf(path: str | os.PathLike) -> GGUFFile:
    """Scan and validate one GGUF file's header; tensor data is not read."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if path.is_dir():
            raise FormatError(f"{path}: is a directory, not a GGUF file")
        if not path.is_file():
            raise FormatError(f"{path}: not a regular file")
        with open(path, "rb") as f:
            if size == 0:
                raise FormatError(f"{path}: empty file, not a GGUF file")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                return _scan(memoryview(mm), path, size)
    except FileNotFoundError:
        raise FormatError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise FormatError(f"{path}: is a directory, not a GGUF file") from None
    except PermissionError:
        raise FormatError(f"{path}: permission denied") from None


def read_gguf_header(header: bytes, path: str | os.PathLike, file_size: int) -> GGUFFile:
    """Scan a header kept apart from its file (an output directory keeps it verbatim);
    `file_size` is the size of the file it came from, for the tensor bounds checks."""
    return _scan(memoryview(header), Path(path), file_size)


def _scan(buf: memoryview, path: Path, size: int) -> GGUFFile:
    try:
        return _scan_header(_Cursor(buf, path), path, size)
    finally:
        buf.release()


def _scan_header(cur: _Cursor, path: Path, size: int) -> GGUFFile:
    magic = cur.bytes(min(4, cur.size), "magic")
    if magic != GGUF_MAGIC:
        raise FormatError(f"{path}: not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})")
    version = cur.u32("version")
    if version not in SUPPORTED_VERSIONS:
        hint = " (a big-endian GGUF file?)" if version & 0xFFFF == 0 else ""
        raise FormatError(f"{path}: unsupported GGUF version {version}{hint}; "
                          f"supported: {', '.join(map(str, SUPPORTED_VERSIONS))}")
    n_tensors = cur.u64("tensor count")
    n_kv = cur.u64("key/value count")
    # Smallest possible entries: a KV is a key length, an empty key and a value type
    # (12 bytes); a tensor info is name length, n_dims, one dim, type, offset (32 bytes).
    remaining = size - cur.pos
    if n_kv * 13 > remaining:
        raise FormatError(f"{path}: key/value count {n_kv} cannot fit in the {remaining} "
                          f"bytes that follow: the file is truncated or the count corrupt")
    if n_tensors * 32 > remaining:
        raise FormatError(f"{path}: tensor count {n_tensors} cannot fit in the {remaining} "
                          f"bytes that follow: the file is truncated or the count corrupt")

    kvs: dict[str, KV] = {}
    for i in range(n_kv):
        start = cur.pos
        key = cur.string(f"key #{i}")
        if key in kvs:
            raise FormatError(f"{path}: duplicate key {key!r} at offset {start}")
        kvs[key] = _read_kv(cur, key)

    alignment = DEFAULT_ALIGNMENT
    if "general.alignment" in kvs:
        kv = kvs["general.alignment"]
        if kv.type != GGUFValueType.UINT32 or kv.value == 0 or kv.value & (kv.value - 1):
            raise FormatError(f"{path}: general.alignment must be a power of two stored as "
                              f"uint32, found {kv.type.name} {kv.value!r}")
        alignment = int(kv.value)

    infos = []
    for i in range(n_tensors):
        infos.append(_read_tensor_info(cur, i))
    header_size = cur.pos
    data_offset = -(-header_size // alignment) * alignment

    tensors = _place_tensors(infos, path, size, alignment, data_offset)
    return GGUFFile(path, size, version, kvs, tensors, header_size, alignment, data_offset)


def _read_kv(cur: _Cursor, key: str) -> KV:
    raw_type = cur.u32(f"value type of {key!r}")
    vtype = _value_type(raw_type, cur, key)
    if vtype != GGUFValueType.ARRAY:
        return KV(key, vtype, _read_scalar(cur, vtype, key))
    value, item_type = _read_array(cur, key, depth=0)
    return KV(key, vtype, value, item_type)


def _value_type(raw: int, cur: _Cursor, key: str) -> GGUFValueType:
    try:
        return GGUFValueType(raw)
    except ValueError:
        raise FormatError(f"{cur.path}: key {key!r} has unknown value type {raw} "
                          f"(before offset {cur.pos})") from None


def _read_scalar(cur: _Cursor, vtype: GGUFValueType, key: str):
    if vtype == GGUFValueType.STRING:
        return cur.string(f"value of {key!r}")
    return cur.unpack("<" + _STRUCT_CODES[vtype], f"value of {key!r}")[0]


def _read_array(cur: _Cursor, key: str, depth: int):
    if depth > 8:
        raise FormatError(f"{cur.path}: key {key!r}: arrays nested deeper than 8 levels")
    item_type = _value_type(cur.u32(f"array item type of {key!r}"), cur, key)
    count = cur.u64(f"array length of {key!r}")
    left = cur.size - cur.pos
    if item_type in _SCALARS:
        itemsize = np.dtype(_SCALARS[item_type]).itemsize
        if count * itemsize > left:
            raise FormatError(f"{cur.path}: array {key!r} claims {count} items "
                              f"({count * itemsize} bytes) but {left} bytes remain")
        arr = np.frombuffer(cur.buf, dtype=_SCALARS[item_type], count=count, offset=cur.pos).copy()
        cur.pos += count * itemsize
        return (arr.astype(bool) if item_type == GGUFValueType.BOOL else arr), item_type
    if item_type == GGUFValueType.STRING:
        if count * 8 > left:
            raise FormatError(f"{cur.path}: string array {key!r} claims {count} items "
                              f"but {left} bytes remain")
        start = cur.pos
        pos, buf, end = cur.pos, cur.buf, cur.size
        unpack = struct.Struct("<Q").unpack_from
        for i in range(count):  # lengths chain, so this walk cannot be vectorized
            if pos + 8 > end:
                raise FormatError(f"{cur.path}: string array {key!r} truncated at item {i}")
            pos += 8 + unpack(buf, pos)[0]
            if pos > end:
                raise FormatError(f"{cur.path}: string array {key!r}: item {i} runs past "
                                  f"the end of the file")
        cur.pos = pos
        return StringArray(bytes(buf[start:pos]), count), item_type
    # An array of arrays: rare, small, read recursively.
    if count * 12 > left:
        raise FormatError(f"{cur.path}: array {key!r} claims {count} nested arrays "
                          f"but {left} bytes remain")
    return [_read_array(cur, key, depth + 1)[0] for _ in range(count)], item_type


def _read_tensor_info(cur: _Cursor, i: int) -> tuple:
    name = cur.string(f"name of tensor #{i}")
    where = f"{cur.path}: tensor {name!r}"
    n_dims = cur.u32(f"n_dims of tensor {name!r}")
    if not 1 <= n_dims <= MAX_DIMS:
        raise FormatError(f"{where}: {n_dims} dimensions, expected 1 to {MAX_DIMS}")
    dims = cur.unpack(f"<{n_dims}Q", f"dims of tensor {name!r}")
    type_id = cur.u32(f"type of tensor {name!r}")
    offset = cur.u64(f"offset of tensor {name!r}")
    return name, dims, type_id, offset


def _place_tensors(infos, path: Path, size: int, alignment: int, data_offset: int):
    tensors, names = [], set()
    for name, dims, type_id, offset in infos:
        where = f"{path}: tensor {name!r}"
        if name in names:
            raise FormatError(f"{where}: duplicate tensor name")
        names.add(name)
        qtype = ggml_type(type_id, where=f"{where}: ")
        n_elements = 1
        for d in dims:
            n_elements *= d
        if n_elements.bit_length() > 62:
            raise FormatError(f"{where}: dims {list(dims)} hold {n_elements} elements, too many")
        if dims[0] % qtype.block_size:
            raise FormatError(f"{where}: first dimension {dims[0]} is not a multiple of "
                              f"{qtype.name}'s block size {qtype.block_size}")
        nbytes = qtype.nbytes(n_elements)
        if offset % alignment:
            raise FormatError(f"{where}: data offset {offset} is not aligned to {alignment}")
        file_offset = data_offset + offset
        if file_offset + nbytes > size:
            raise FormatError(f"{where}: data [{file_offset}, {file_offset + nbytes}) lies "
                              f"outside the file ({size} bytes): truncated?")
        tensors.append(TensorInfo(name, tuple(dims), qtype, offset, file_offset, nbytes))
    by_offset = sorted(tensors, key=lambda t: t.file_offset)
    for a, b in zip(by_offset, by_offset[1:]):
        if b.file_offset < a.file_offset + a.nbytes:
            raise FormatError(f"{path}: tensors {a.name!r} and {b.name!r} overlap "
                              f"(offsets {a.offset} + {a.nbytes} > {b.offset})")
    return tensors


@dataclass
class GGUFSet:
    """A model: one GGUF file, or every shard of a split set in order."""

    files: list[GGUFFile] = field(default_factory=list)

    @property
    def first(self) -> GGUFFile:
        return self.files[0]

    @property
    def tensors(self) -> list[tuple[int, TensorInfo]]:
        return [(i, t) for i, f in enumerate(self.files) for t in f.tensors]

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)


def open_gguf(path: str | os.PathLike) -> GGUFSet:
    """Scan a GGUF model: the file itself, or, given the first shard of a split set
    (``name-00001-of-0000N.gguf``), every shard, checked against each other."""
    first = read_gguf(path)
    count = first.split_count
    if count <= 1:
        return GGUFSet([first])
    path = Path(path)
    m = SPLIT_NAME.match(path.name)
    if not m:
        raise FormatError(f"{path}: split.count is {count}, but the file name does not follow "
                          f"the split pattern NAME-00001-of-{count:05d}.gguf")
    if int(m["count"]) != count:
        raise FormatError(f"{path}: the name says {int(m['count'])} shards, split.count says {count}")
    files = [first]
    for no in range(1, count + 1):
        shard_path = path.with_name(f"{m['prefix']}-{no:05d}-of-{count:05d}.gguf")
        shard = first if no == 1 else _read_shard(shard_path, no, count)
        if int(shard.get("split.no", -1)) != no - 1:
            raise FormatError(f"{shard_path}: split.no is {shard.get('split.no')}, expected "
                              f"{no - 1} for shard {no} of {count}"
                              + (" (give the first shard)" if no == 1 else ""))
        if shard.split_count != count:
            raise FormatError(f"{shard_path}: split.count is {shard.split_count}, "
                              f"the first shard says {count}")
        if no > 1:
            files.append(shard)
    expected = int(first.get("split.tensors.count", -1))
    total = sum(len(f.tensors) for f in files)
    if expected != total:
        raise FormatError(f"{path}: split.tensors.count is {expected}, but the {count} shards "
                          f"hold {total} tensors")
    seen: dict[str, Path] = {}
    for f in files:
        for t in f.tensors:
            if t.name in seen:
                raise FormatError(f"{f.path}: tensor {t.name!r} is also in {seen[t.name]}")
            seen[t.name] = f.path
    return GGUFSet(files)


def _read_shard(path: Path, no: int, count: int) -> GGUFFile:
    if not path.exists():
        raise FormatError(f"{path}: missing shard {no} of {count}")
    return read_gguf(path)
