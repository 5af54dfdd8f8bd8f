"""convert: GGUF -> an rp1 output directory, streaming, atomically.

Order of work, and why:
1. Scan and validate every source header (and split shard) before anything is created, so
   bad input leaves nothing behind.
2. Plan every safetensors entry and shard, so each file's header is written first and the
   data then streams in: memory stays bounded by `CHUNK_BYTES`, whatever the model's size.
3. Each source file is mapped into memory (no read copies: the page cache is re-tiled in
   place). A background thread computes each file's sha256 over the map (hashlib releases the
   GIL) while two writer threads checksum each tensor's bytes (xxh3-128), re-tile and write
   them. The two hashes were half of convert's time when both were sha256. (A source that
   another process truncates while it is converted ends the process with SIGBUS, as any
   reader of a mapped file; with reads it was an error line.)
4. The engine files (config.json, tokenizer, generation config) come from transformers' GGUF
   conversion, fed with the values already scanned (gguf_repack.integrations.hf.engine_files); without
   the `hf` extra, or for a model transformers cannot describe, they are skipped and the
   summary says so. `weights_only=True` skips them on purpose.
5. Everything goes into a temporary sibling directory; the manifest is written last and the
   directory renamed into place. An interrupted run leaves no output, only its temporary
   directory (removed on any error this process sees).
"""

from __future__ import annotations

import errno
import hashlib
import json
import mmap
import os
import shutil
import sys
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gguf_repack import __version__
from gguf_repack.errors import FormatError, OutputError
from gguf_repack.format.layout import LAYOUT, blocks_shape, pack, plane_shapes
from gguf_repack.format.manifest import (
    FORMAT,
    INDEX,
    MANIFEST_VERSION,
    TENSOR_CHECKSUM,
    TENSOR_CHECKSUMS,
    PlaneRecord,
    TensorRecord,
    gaps_name,
    header_name,
    is_output_dir,
    shard_name,
    write_manifest,
)
from gguf_repack.format.safetensors_io import Entry, layout_file, pwrite_all, st_dtype

from .reader import GGUFSet, TensorInfo, open_gguf

CHUNK_BYTES = 16 << 20  # source bytes re-tiled at a time
# write errors that mean the output's filesystem will not take it (the file is not named by
# pwrite's OSError, so the message names the output)
_OUTPUT_FULL = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EROFS}
DEFAULT_MAX_SHARD_SIZE = 4_000_000_000
WRITERS = 2  # threads re-tiling and writing tensors (the project's machines have 2 cores)


@dataclass
class ConvertSummary:
    output: Path
    n_tensors: int
    types: Counter
    bytes_in: int
    bytes_out: int
    seconds: float
    engine_files: list[str] = field(default_factory=list)
    engine_files_skipped: str | None = None  # why, when they were not written
    # metadata of the file that config.json does not carry, each named
    engine_file_warnings: list[str] = field(default_factory=list)

    def line(self) -> str:
        types = ", ".join(f"{n} {t}" for t, n in self.types.most_common())
        line = (f"converted {self.n_tensors} tensors ({types}): {_mb(self.bytes_in)} -> "
                f"{_mb(self.bytes_out)} in {self.seconds:.2f} s -> {self.output}")
        if self.engine_files:
            line += f"\nengine files: {', '.join(self.engine_files)}"
        if self.engine_files_skipped:
            line += f"\nskipped config.json and tokenizer: {self.engine_files_skipped}"
        for note in self.engine_file_warnings:
            line += f"\nwarning: {note}"
        return line


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


@dataclass
class _Planned:
    source: int  # index into the set's files
    info: TensorInfo
    entries: list[Entry]  # one per plane (rp1), or the tensor itself (plain)
    shard: int = 0


def convert(src: str | os.PathLike, out: str | os.PathLike, *, force: bool = False,
            max_shard_size: int = DEFAULT_MAX_SHARD_SIZE, progress: bool = False,
            weights_only: bool = False, origins: list[dict] | None = None) -> ConvertSummary:
    """Convert the GGUF model at `src` (a file, or the first shard of a split set) into the
    output directory `out`, with config.json and tokenizer files for engines unless
    `weights_only`. `origins` (gguf_repack.sources): per source file, where it was downloaded
    from, recorded in the manifest; its sha256 must be the file's. Raises RepackError for bad
    input or an unusable `out`."""
    t0 = time.perf_counter()
    gset = open_gguf(src)
    if origins is not None and len(origins) != len(gset.files):
        raise FormatError(f"{src}: {len(gset.files)} file(s), but {len(origins)} origins given")
    out = Path(out)
    _check_output(out, force)
    planned = _plan(gset)
    n_shards = _assign_shards(planned, max_shard_size)

    tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:12]}"
    try:
        tmp.mkdir()
    except OSError as e:
        raise OutputError(f"{out}: cannot create the output ({e.strerror})") from None
    hasher = None
    try:
        maps = [_MappedSource(f.path) for f in gset.files]
        for f, m in zip(gset.files, maps):
            if m.stat.st_size != f.size:
                raise FormatError(f"{f.path}: changed while it was being converted ({f.size:,} "
                                  f"bytes when its header was read, {m.stat.st_size:,} now); "
                                  f"run again")
        hasher = _FileHasher(maps)
        hasher.start()
        tensor_checksums = _write_shards(maps, planned, n_shards, tmp, progress)
        index = {"metadata": {"total_size": sum(e.nbytes for p in planned for e in p.entries)},
                 "weight_map": {e.key: shard_name(p.shard + 1, n_shards)
                                for p in planned for e in p.entries}}
        (tmp / INDEX).write_text(json.dumps(index, indent=1) + "\n")
        sources = [_write_source_record(f, i, tmp, m.stat.st_mtime_ns)
                   for i, (f, m) in enumerate(zip(gset.files, maps))]
        (engine_files, notes), skipped = (
            (([], []), "--weights-only") if weights_only else _engine_files(gset, tmp))
        hasher.join_checked()
        for i, (source, digest) in enumerate(zip(sources, hasher.sha256)):
            source["sha256"] = digest
            if origins is not None:
                source["origin"] = origins[i]
                if origins[i].get("sha256") not in (None, digest):
                    raise FormatError(f"{gset.files[i].path}: sha256 {digest}, but its origin "
                                      f"says {origins[i]['sha256']} (the file changed?)")
        tensors = [_tensor_record(p, n_shards, digest)
                   for p, digest in zip(planned, tensor_checksums)]
        write_manifest(tmp, {
            "format": FORMAT, "format_version": MANIFEST_VERSION,
            "created_by": f"gguf-repack {__version__}",
            "sources": sources,
            "shards": [shard_name(i + 1, n_shards) for i in range(n_shards)],
            "tensors": [t.to_json() for t in tensors],
        })
        _move_into_place(tmp, out, force)
    except BaseException as e:
        if hasher is not None:
            hasher.cancel.set()
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError) and e.errno in _OUTPUT_FULL:
            raise OutputError(f"{out}: cannot write the output ({e.strerror}); nothing was "
                              f"left behind") from None
        raise
    bytes_out = sum(f.stat().st_size for f in out.iterdir())
    return ConvertSummary(out, len(planned), Counter(p.info.type.name for p in planned),
                          gset.size, bytes_out, time.perf_counter() - t0, engine_files,
                          None if weights_only else skipped, notes)


def _engine_files(gset: GGUFSet, tmp: Path) -> tuple[tuple[list[str], list[str]], str | None]:
    """((files written, warnings about the metadata), why none were written)"""
    from .engine_files import EngineFilesSkipped, why_not, write_engine_files

    reason = why_not(gset.first)
    if reason:
        return ([], []), reason
    try:
        return write_engine_files(gset, tmp), None
    except EngineFilesSkipped as e:
        return ([], []), str(e)


def _check_output(out: Path, force: bool) -> None:
    if out.exists() or out.is_symlink():
        if not force:
            raise OutputError(f"{out}: already exists (use --force to replace a previous "
                              f"gguf-repack output)")
        if not out.is_dir() or out.is_symlink() or not is_output_dir(out):
            raise OutputError(f"{out}: exists and is not a gguf-repack output directory; "
                              f"--force only replaces those")
    if not out.parent.is_dir():
        raise OutputError(f"{out}: parent directory {out.parent} does not exist")


def _plan(gset: GGUFSet) -> list[_Planned]:
    planned, keys = [], {}
    for source, info in gset.tensors:
        qtype = info.type
        if qtype.is_quantized:
            shapes = plane_shapes(info.shape, qtype)
            entries = [Entry(f"{info.name}.{f.name}", st_dtype(f.plane_dtype), shapes[f.name])
                       for f in qtype.fields]
        else:
            entries = [Entry(info.name, qtype.plain_dtype, info.shape)]
        for e in entries:
            if e.key in keys:
                raise FormatError(f"{gset.files[source].path}: tensor {info.name!r} would be "
                                  f"stored under the key {e.key!r}, which tensor "
                                  f"{keys[e.key]!r} already uses")
            keys[e.key] = info.name
        planned.append(_Planned(source, info, entries))
    return planned


def _assign_shards(planned: list[_Planned], max_shard_size: int) -> int:
    shard, size = 0, 0
    for p in planned:
        n = sum(e.nbytes for e in p.entries)
        if size and size + n > max_shard_size:
            shard, size = shard + 1, 0
        p.shard, size = shard, size + n
    return shard + 1


class _MappedSource:
    """A source file's bytes, mapped read-only (its header was validated: every tensor lies
    inside it): re-tiled and hashed where they lie in the page cache, with no read copies.
    Each reader releases the pages it is done with: mapped pages count in the process's
    resident memory, which would otherwise grow to the file's size."""

    def __init__(self, path: Path):
        with open(path, "rb") as f:
            # the mtime the manifest records: taken before any mapped byte is hashed, so that
            # a later change of the file makes an archive's rerun look at it again
            self.stat = os.fstat(f.fileno())
            self.map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self.map.madvise(mmap.MADV_SEQUENTIAL)
        self.bytes = np.frombuffer(self.map, np.uint8)

    def __len__(self) -> int:
        return len(self.bytes)

    def view(self, start: int, n: int) -> np.ndarray:
        return self.bytes[start : start + n]

    def release(self, start: int, n: int) -> None:
        """Unmap [start, start + n) from this process (the page cache keeps the file; a later
        read of a page another reader dropped maps it again)."""
        first = start - start % mmap.PAGESIZE
        self.map.madvise(mmap.MADV_DONTNEED, first, start + n - first)


def _write_shards(maps: list[_MappedSource], planned: list[_Planned], n_shards: int, tmp: Path,
                  progress: bool) -> list[str]:
    """Write every shard; returns the checksum of each tensor's source bytes, in plan order.

    Tensors go to WRITERS threads: every byte's place is planned, numpy's re-tiling and the
    writes release the GIL, and the source file's sha256 holds one core only until it is
    done."""
    bar = _progress_bar(sum(p.info.nbytes for p in planned), progress)
    fds: list[int] = []
    pool = ThreadPoolExecutor(WRITERS, thread_name_prefix="gguf-repack-write")
    try:
        for shard in range(n_shards):
            header = layout_file([e for p in planned if p.shard == shard for e in p.entries],
                                 {"format": "pt", "producer": FORMAT})
            fds.append(os.open(tmp / shard_name(shard + 1, n_shards), os.O_WRONLY | os.O_CREAT,
                               0o644))
            pwrite_all(fds[-1], header, 0)

        def write(p: _Planned) -> str:
            copy = _write_rp1 if p.info.type.is_quantized else _write_plain
            return copy(maps[p.source], fds[p.shard], p)

        futures = [pool.submit(write, p) for p in planned]
        for future, p in zip(futures, planned):
            future.result()  # in plan order: the first failure is raised, the rest cancelled
            bar.update(p.info.nbytes)
        return [f.result() for f in futures]
    finally:
        pool.shutdown(cancel_futures=True)
        bar.close()
        for fd in fds:
            os.close(fd)


def _progress_bar(total: int, enabled: bool):
    if not enabled:
        class _Off:
            def update(self, n): ...
            def close(self): ...
        return _Off()
    from tqdm import tqdm  # imported only when shown: it costs 50 ms of start-up

    return tqdm(total=total, unit="B", unit_scale=True, desc="convert", file=sys.stderr)


_buffers = threading.local()


def _chunk_buffer() -> np.ndarray:
    """This thread's buffer for the planes of one chunk, allocated once and reused."""
    buf = getattr(_buffers, "planes", None)
    if buf is None:
        buf = _buffers.planes = np.empty(CHUNK_BYTES, np.uint8)
    return buf


def _write_rp1(src: _MappedSource, dst_fd: int, p: _Planned) -> str:
    """Re-tile one tensor, a chunk of whole rows at a time, into its planes; returns the
    checksum of its source bytes."""
    qtype, info = p.info.type, p.info
    *lead, n_rows, n_blocks, type_size = blocks_shape(info.shape, qtype)
    n_lead = int(np.prod(lead, dtype=np.int64))
    row_bytes = n_blocks * type_size
    rows_per_chunk = max(1, CHUNK_BYTES // max(row_bytes, 1))
    fields = list(zip(qtype.fields, p.entries))
    digest = TENSOR_CHECKSUMS[TENSOR_CHECKSUM]()
    for r in range(n_lead):
        for n0 in range(0, n_rows, rows_per_chunk):
            rows = min(rows_per_chunk, n_rows - n0)
            start = info.file_offset + (r * n_rows + n0) * row_bytes
            blocks = src.view(start, rows * row_bytes).reshape(rows, n_blocks, type_size)
            digest.update(blocks)
            # each [B, rows, count]; a row longer than a chunk gets a buffer of its own
            buf = _chunk_buffer() if blocks.nbytes <= CHUNK_BYTES else None
            planes = pack(blocks, qtype, buf)
            for f, entry in fields:
                run = f.size  # bytes of one row's field, per block column
                base = entry.offset + r * n_blocks * n_rows * run
                plane = planes[f.name]
                if rows == n_rows:
                    pwrite_all(dst_fd, plane, base)
                else:
                    for b in range(n_blocks):
                        pwrite_all(dst_fd, plane[b], base + (b * n_rows + n0) * run)
            src.release(start, rows * row_bytes)
    return digest.hexdigest()


def _write_plain(src: _MappedSource, dst_fd: int, p: _Planned) -> str:
    """Copy a plain tensor as it is; returns the checksum of its bytes."""
    digest = TENSOR_CHECKSUMS[TENSOR_CHECKSUM]()
    n, start, dst = p.info.nbytes, p.info.file_offset, p.entries[0].offset
    for done in range(0, n, CHUNK_BYTES):
        size = min(CHUNK_BYTES, n - done)
        buf = src.view(start + done, size)
        digest.update(buf)
        pwrite_all(dst_fd, buf, dst + done)
        src.release(start + done, size)
    return digest.hexdigest()


def _write_source_record(f, i: int, tmp: Path, mtime_ns: int) -> dict:
    """The verbatim header and every byte no tensor covers (padding, usually zero), so that
    export needs nothing but the output directory."""
    with open(f.path, "rb") as src:
        header = src.read(f.header_size)
        covered = sorted((t.file_offset, t.file_offset + t.nbytes) for t in f.tensors)
        gaps, stored, pos = [], bytearray(), f.header_size
        for start, end in covered + [(f.size, f.size)]:
            if start > pos:
                src.seek(pos)
                data = src.read(start - pos)
                gap = {"offset": pos, "length": start - pos, "stored_at": None}
                if any(data):
                    gap["stored_at"] = len(stored)
                    stored += data
                gaps.append(gap)
            pos = max(pos, end)
    (tmp / header_name(i)).write_bytes(header)
    if stored:
        (tmp / gaps_name(i)).write_bytes(stored)
    return {
        "file": f.path.name, "size": f.size, "mtime_ns": mtime_ns, "sha256": None,
        "gguf_version": f.version, "alignment": f.alignment, "data_offset": f.data_offset,
        "n_tensors": len(f.tensors),
        "header": {"file": header_name(i), "size": f.header_size,
                   "sha256": hashlib.sha256(header).hexdigest()},
        "gaps": gaps, "gaps_file": gaps_name(i) if stored else None,
    }


def _tensor_record(p: _Planned, n_shards: int, checksum: str) -> TensorRecord:
    info, qtype = p.info, p.info.type
    if qtype.is_quantized:
        planes = [PlaneRecord(f.name, e.key, e.dtype, list(e.shape))
                  for f, e in zip(qtype.fields, p.entries)]
    else:
        e = p.entries[0]
        planes = [PlaneRecord("data", e.key, e.dtype, list(e.shape))]
    return TensorRecord(
        name=info.name, type=qtype.name, type_id=qtype.id, ggml_dims=list(info.dims),
        shape=list(info.shape), layout=LAYOUT if qtype.is_quantized else "plain",
        shard=shard_name(p.shard + 1, n_shards), planes=planes,
        source={"file": p.source, "offset": info.file_offset, "nbytes": info.nbytes,
                TENSOR_CHECKSUM: checksum})


class _FileHasher(threading.Thread):
    """sha256 of each source file, over its map, beside the main thread's work."""

    def __init__(self, maps: list[_MappedSource]):
        super().__init__(daemon=True, name="gguf-repack-hash")
        self.maps = maps
        self.sha256: list[str] = []
        self.error: BaseException | None = None
        self.cancel = threading.Event()  # set when the conversion fails: stop reading

    def run(self) -> None:
        try:
            for source in self.maps:
                h = hashlib.sha256()
                for start in range(0, len(source), CHUNK_BYTES):
                    if self.cancel.is_set():
                        return
                    size = min(CHUNK_BYTES, len(source) - start)
                    h.update(source.view(start, size))
                    source.release(start, size)
                self.sha256.append(h.hexdigest())
        except BaseException as e:  # re-raised in the main thread
            self.error = e

    def join_checked(self) -> None:
        self.join()
        if self.error is not None:
            raise self.error


def _move_into_place(tmp: Path, out: Path, force: bool) -> None:
    if force and out.exists():
        old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:12]}"
        os.rename(out, old)
        try:
            os.rename(tmp, out)
        except BaseException:
            os.rename(old, out)  # the previous output stays as it was
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        try:
            os.rename(tmp, out)
        except OSError as e:
            raise OutputError(f"{out}: could not move the output into place ({e.strerror})") from None
