"""export (output directory -> the source GGUF files, byte for byte) and verify."""

from __future__ import annotations

import hashlib
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from gguf_repack.errors import FormatError, OutputError
from gguf_repack.format.manifest import TENSOR_CHECKSUMS, sha256_file
from gguf_repack.format.output_dir import OutputDir
from gguf_repack.format.safetensors_io import pread_into, pwrite_all

from .reader import SPLIT_NAME, open_gguf

PASSED, FAILED = "passed", "failed"


def export(out_dir: str | os.PathLike, dest: str | os.PathLike, *, force: bool = False) -> list[Path]:
    """Rebuild the source GGUF file(s) from `out_dir` and check their sha256.

    `dest` is the file to write; for a split source it is the first shard's path
    (NAME-00001-of-0000N.gguf) or a directory, and every shard is written beside it.
    Returns the paths written."""
    with OutputDir(out_dir) as od:
        targets = _targets(od, Path(dest))
        for t in targets:
            if t.exists() and not force:
                raise OutputError(f"{t}: already exists (use --force to overwrite)")
            if not t.parent.is_dir():
                raise OutputError(f"{t}: directory {t.parent} does not exist")
        tmps = [t.with_name(f".{t.name}.tmp-{uuid.uuid4().hex[:12]}") for t in targets]
        try:
            for i, tmp in enumerate(tmps):
                _write_source(od, i, tmp)
            for tmp, t in zip(tmps, targets):
                os.replace(tmp, t)
        except BaseException:
            for tmp in tmps:
                tmp.unlink(missing_ok=True)
            raise
    return targets


def _targets(od: OutputDir, dest: Path) -> list[Path]:
    names = [s["file"] for s in od.sources]
    for n in names:  # names come from the manifest: never let one point outside `dest`
        if not isinstance(n, str) or Path(n).name != n or n in ("", ".", ".."):
            raise FormatError(f"{od.path}: source file name {n!r} in the manifest is not a "
                              f"plain file name")
    if dest.is_dir():
        return [dest / n for n in names]
    if len(names) == 1:
        return [dest]
    m = SPLIT_NAME.match(dest.name)
    if not m or int(m["no"]) != 1 or int(m["count"]) != len(names):
        raise OutputError(f"{dest}: the source is split into {len(names)} shards; give a "
                          f"directory or a first-shard name NAME-00001-of-{len(names):05d}.gguf")
    return [dest.with_name(f"{m['prefix']}-{i:05d}-of-{len(names):05d}.gguf")
            for i in range(1, len(names) + 1)]


def _write_source(od: OutputDir, i: int, path: Path) -> None:
    source = od.sources[i]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        pwrite_all(fd, od.header_bytes(i), 0)
        for offset, data in od.gap_bytes(i):
            if data is not None:
                pwrite_all(fd, data, offset)
        for t in od.tensors:
            if t.source["file"] == i:
                for off, chunk in od.source_chunks(t):
                    pwrite_all(fd, chunk, t.source["offset"] + off)
        os.ftruncate(fd, source["size"])  # zero gaps at the end
    finally:
        os.close(fd)
    digest = sha256_file(path)
    if digest != source["sha256"]:
        raise FormatError(f"{od.path}: rebuilt {source['file']} has sha256 {digest}, the "
                          f"source had {source['sha256']}: the output is damaged "
                          f"(run gguf-repack verify)")


@dataclass
class Check:
    """One check of verify: a tensor (its checksum, and its bytes against the source's), or a
    source file's header. What the machine-readable reports (gguf_repack/reports) list."""

    kind: str  # "tensor" | "header"
    name: str  # the tensor's GGUF name, or the source file's name
    status: str = PASSED  # PASSED | FAILED
    reason: str | None = None  # why it failed, one line
    type: str | None = None
    shape: list[int] | None = None
    algorithm: str | None = None  # of the checksum: xxh3_128 (manifest v2, v3), sha256 (v1, headers)
    expected: str | None = None  # as the manifest records it
    found: str | None = None  # as computed now

    def fail(self, reason: str) -> None:
        self.reason = reason if self.status == PASSED else f"{self.reason}; {reason}"
        self.status = FAILED

    @property
    def line(self) -> str:
        return f"{'header of ' if self.kind == 'header' else ''}{self.name}: {self.reason}"


@dataclass
class VerifyReport:
    path: Path | None = None  # the output directory
    sources: list[dict] = field(default_factory=list)  # the manifest's source records
    checks: list[Check] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # faults of the whole comparison, one line each

    @property
    def checked(self) -> int:
        return len(self.checks)

    @property
    def mismatches(self) -> list[str]:
        """One line per failed check, then each problem of the whole comparison."""
        return [c.line for c in self.checks if c.status == FAILED] + self.problems

    @property
    def ok(self) -> bool:
        return not self.mismatches


def verify(out_dir: str | os.PathLike, against: str | os.PathLike | None = None) -> VerifyReport:
    """Recompute every tensor's checksum from its planes, and the headers' sha256; with
    `against`, also compare every rebuilt tensor and header with that GGUF model's bytes.

    Returns a report; raises RepackError only when the input cannot be read at all."""
    with OutputDir(out_dir) as od:
        report = VerifyReport(od.path, od.sources)
        source_set = open_gguf(against) if against is not None else None
        if source_set is not None and len(source_set.files) != len(od.sources):
            report.problems.append(f"{against}: {len(source_set.files)} file(s), the output "
                                   f"was made from {len(od.sources)}")
            source_set = None
        by_name = {}
        if source_set is not None:
            by_name = {t.name: (i, t) for i, t in source_set.tensors}
        fds = [os.open(f.path, os.O_RDONLY) for f in source_set.files] if source_set else []
        try:
            for i, source in enumerate(od.sources):
                report.checks.append(_verify_header(od, i, source, source_set))
            for t in od.tensors:
                report.checks.append(_verify_tensor(od, t, by_name, fds))
        finally:
            for fd in fds:
                os.close(fd)
    return report


def _verify_header(od: OutputDir, i: int, source: dict, source_set) -> Check:
    check = Check("header", source["file"], algorithm="sha256", expected=source["header"]["sha256"])
    try:
        header = od.header_bytes(i)
    except OSError as e:
        check.fail(f"unreadable ({e.strerror})")
        return check
    check.found = hashlib.sha256(header).hexdigest()
    if check.found != check.expected:
        check.fail("checksum mismatch")
    elif source_set is not None:
        with open(source_set.files[i].path, "rb") as f:
            if f.read(len(header)) != header:
                check.fail(f"differs from {source_set.files[i].path}")
    return check


def _verify_tensor(od: OutputDir, t, by_name: dict, fds: list[int]) -> Check:
    check = Check("tensor", t.name, type=t.type, shape=list(t.shape))
    try:
        check.algorithm, check.expected = t.checksum()
    except FormatError as e:
        check.fail(str(e))
        return check
    h = TENSOR_CHECKSUMS[check.algorithm]()
    src = by_name.get(t.name) if by_name else None
    if by_name and src is None:
        check.fail("not in the source model")
    elif src is not None and (src[1].type.name != t.type or list(src[1].dims) != t.ggml_dims):
        check.fail(f"source has {src[1].type.name} {list(src[1].dims)}, output has {t.type} "
                   f"{t.ggml_dims}")
        src = None
    differs = False
    try:
        for off, chunk in od.source_chunks(t):
            h.update(chunk)
            if src is not None and not differs:
                ref = chunk.copy()
                pread_into(fds[src[0]], ref, src[1].file_offset + off)
                differs = not (ref == chunk).all()
    except FormatError as e:
        check.fail(f"unreadable ({e})")
        return check
    check.found = h.hexdigest()
    if check.found != check.expected:
        check.fail("checksum mismatch (planes damaged)")
    elif differs:
        check.fail("differs from the source file's bytes")
    return check
