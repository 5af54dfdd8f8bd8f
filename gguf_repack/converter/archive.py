"""Archives: convert every GGUF model under a directory into OUT_ROOT/<name>/, and verify every
output directory under a root (against the directory of sources).

A model whose output already exists, complete (it has its manifest), for an unchanged source
is skipped, so an interrupted run picks up where it stopped and a rerun of an unchanged archive
reads no model's bytes. "Unchanged" is decided as rsync decides it:
- every file of the same name, size and mtime as the manifest records (version 3): skipped
  without reading the files;
- else, names and sizes the same (an mtime that differs: a `touch`, a copy that did not keep
  it; a manifest older than version 3, which records none; or `--checksum`): the files are
  hashed, and the same sha256 as the manifest records is a skip too. The output is left as it
  is (a skip writes nothing), so such a model is hashed again on every run;
- else (another size, another sha256) the output is another source's: an error, unless
  `force` replaces it.
A model that fails is reported with its one-line error and the run goes on; the caller exits 1
if any failed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gguf_repack.errors import FormatError, OutputError, RepackError, one_line
from gguf_repack.format.manifest import (
    OUTPUT_MARKER,
    looks_like_output,
    read_manifest,
    sha256_file,
)
from gguf_repack.sources.archive import ArchiveModel, find_models

from .rebuild import VerifyReport, verify
from .writer import DEFAULT_MAX_SHARD_SIZE, convert

CONVERTED, SKIPPED, FAILED = "converted", "skipped", "failed"
# What decided that a skipped model's source is unchanged
BY_SIZE_AND_MTIME, BY_SHA256 = "size and mtime", "sha256"


@dataclass
class ModelResult:
    model: ArchiveModel
    status: str
    bytes: int
    seconds: float
    detail: str  # the convert summary's first line, why it was skipped, or the error
    rule: str | None = None  # a skip's: BY_SIZE_AND_MTIME or BY_SHA256


@dataclass
class ArchiveSummary:
    root: Path
    out_root: Path
    results: list[ModelResult] = field(default_factory=list)

    @property
    def failed(self) -> list[ModelResult]:
        return [r for r in self.results if r.status == FAILED]

    def table(self) -> str:
        """The closing table: per outcome (a skip per the rule that decided it), models,
        source bytes, seconds."""
        rows = [(CONVERTED, [r for r in self.results if r.status == CONVERTED])]
        rows += [(f"{SKIPPED}: unchanged ({rule})",
                  [r for r in self.results if r.status == SKIPPED and r.rule == rule])
                 for rule in (BY_SIZE_AND_MTIME, BY_SHA256)]
        rows += [(FAILED, self.failed), ("total", self.results)]
        width = max(len(label) for label, _ in rows)
        lines = [f"{'':<{width}} {'models':>6} {'bytes':>16} {'seconds':>9}"]
        for label, results in rows:
            lines.append(f"{label:<{width}} {len(results):>6} "
                         f"{sum(r.bytes for r in results):>16,} "
                         f"{sum(r.seconds for r in results):>9.1f}")
        return "\n".join(lines)


def convert_archive(root: str | os.PathLike, out_root: str | os.PathLike, *, force: bool = False,
                    checksum: bool = False, max_shard_size: int = DEFAULT_MAX_SHARD_SIZE,
                    weights_only: bool = False, progress: bool = False,
                    say: Callable[[str], None] = print,
                    warn: Callable[[str], None] = print) -> ArchiveSummary:
    """Convert every model under `root`; `say` gets one line per model (with the run's
    overall progress), `warn` each failure's `error: ...` line. `checksum`: decide that an
    output's source is unchanged by the files' sha256 even where their size and mtime are
    the manifest's (rsync's --checksum)."""
    root, out_root = Path(root), Path(out_root)
    if not root.is_dir():
        raise RepackError(f"{root}: not a directory")
    if out_root.exists() and not out_root.is_dir():
        raise OutputError(f"{out_root}: exists and is not a directory")
    models = find_models(root, skip=out_root if out_root.exists() else None)
    if not models:
        raise RepackError(f"{root}: no .gguf files under it")
    total = sum(m.size for m in models)
    say(f"{len(models)} model(s), {total / 1e9:.2f} GB under {root} -> {out_root}")
    summary, done, names = ArchiveSummary(root, out_root), 0, set()
    for i, model in enumerate(models, 1):
        t0 = time.perf_counter()
        size, rule = model.size, None
        try:
            if model.name in names:
                raise OutputError(f"{model.path}: its output name {model.name!r} is taken by "
                                  f"another model of the archive")
            names.add(model.name)
            status, detail, rule = _convert_one(model, out_root / model.name, force=force,
                                                checksum=checksum, max_shard_size=max_shard_size,
                                                weights_only=weights_only, progress=progress)
        except (RepackError, OSError) as e:
            status, detail = FAILED, one_line(e)
            warn(f"error: {detail}")
        result = ModelResult(model, status, size, time.perf_counter() - t0, detail, rule)
        summary.results.append(result)
        done += size
        say(f"[{i}/{len(models)}, {done / max(total, 1):.0%} of bytes] {model.name}: {status} "
            f"in {result.seconds:.1f} s" + (f": {detail}" if status == SKIPPED else ""))
    return summary


def _convert_one(model: ArchiveModel, out: Path, *, force: bool, checksum: bool,
                 **options) -> tuple[str, str, str | None]:
    """(status, detail, the rule that decided a skip)"""
    if out.exists():
        same = _compare_sources(model, out, checksum)
        if same is None:
            if not force:
                raise OutputError(f"{out}: already exists and is not a complete gguf-repack "
                                  f"output (an interrupted run leaves none; remove it)")
        elif same.unchanged:
            return SKIPPED, same.detail, same.rule
        elif not force:
            raise OutputError(f"{out}: already exists, converted from a different source "
                              f"({same.detail}); --force replaces it")
    out.parent.mkdir(parents=True, exist_ok=True)
    summary = convert(model.path, out, force=force, **options)
    return CONVERTED, summary.line().splitlines()[0], None


@dataclass
class _Comparison:
    unchanged: bool
    rule: str | None  # what decided an unchanged source: BY_SIZE_AND_MTIME or BY_SHA256
    detail: str  # why, for the person


def _compare_sources(model: ArchiveModel, out: Path, checksum: bool) -> _Comparison | None:
    """Whether the complete output at `out` was converted from these very files, and by which
    rule (the module's docstring); None when `out` is not a complete output."""
    try:
        manifest = read_manifest(out)
    except FormatError:
        return None
    records = manifest["sources"]
    stats = [f.stat() for f in model.files]
    if [(s.get("file"), s.get("size")) for s in records] != \
            [(f.name, st.st_size) for f, st in zip(model.files, stats)]:
        return _Comparison(False, None, "file names or sizes differ from its manifest's")
    recorded = [s.get("mtime_ns") for s in records]
    if checksum:
        why = "--checksum"
    elif not all(type(t) is int for t in recorded):
        why = f"its manifest, version {manifest['format_version']}, records no mtime"
    elif all(st.st_mtime_ns == t for st, t in zip(stats, recorded)):
        return _Comparison(True, BY_SIZE_AND_MTIME, f"unchanged ({BY_SIZE_AND_MTIME})")
    else:
        why = "the mtime differs from its manifest's, so each run hashes it"
    if all(sha256_file(f) == s.get("sha256") for f, s in zip(model.files, records)):
        return _Comparison(True, BY_SHA256, f"unchanged ({BY_SHA256}; {why})")
    return _Comparison(False, None, "sha256 differs")


@dataclass
class TreeEntry:
    """One output directory of a tree verify: its report, or why it could not be read."""

    out: Path
    source: Path | None  # the matching source model, with `against`
    report: VerifyReport | None
    error: str | None  # unreadable: the one-line error
    seconds: float


def verify_each(paths: list, against: Path | None = None) -> tuple[list[TreeEntry], list[Path]]:
    """verify each output directory, and the directory of each file given (pre-commit passes
    the files a commit changes); an unreadable one is an entry with its error. Returns the
    entries and the files that lie in no gguf-repack output (a Hugging Face model's shards,
    which share our shard names), which the caller names."""
    outs, elsewhere = [], []
    for p in map(Path, paths):
        if p.is_file() and not looks_like_output(p.parent):
            elsewhere.append(p)
        else:
            outs.append(p.parent if p.is_file() else p)
    entries = []
    for out in dict.fromkeys(outs):
        t0 = time.perf_counter()
        try:
            report, error = verify(out, against=against), None
        except RepackError as e:
            report, error = None, str(e)
        entries.append(TreeEntry(out, against, report, error, time.perf_counter() - t0))
    return entries, elsewhere


def output_dirs(root: Path) -> list[Path]:
    """Every directory under `root` that holds an output's files (its manifest, or shards and
    headers left without one: an incomplete output is listed, to be reported, not passed
    over); hidden directories (a convert's temporaries) aside."""
    if not root.is_dir():
        what = "no such directory" if not root.exists() else "not a directory"
        raise RepackError(f"{root}: {what}")
    found = []
    for directory, subdirs, names in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if not d.startswith("."))
        if any(OUTPUT_MARKER.match(n) for n in names):
            found.append(Path(directory))
            subdirs[:] = []  # an output holds no outputs
    return found


def verify_tree(root: str | os.PathLike, against: str | os.PathLike | None = None) -> list[TreeEntry]:
    """verify every output directory under `root`; with `against` (a directory of GGUF models,
    the archive `convert DIR OUT_ROOT` read), each against the model of its name, and every
    model there without an output is a failed entry too."""
    root = Path(root)
    outs = output_dirs(root)
    models = {}
    if against is not None:
        against = Path(against)
        if not against.is_dir():
            raise RepackError(f"{against}: with --recursive, --against names the directory of "
                              f"source models")
        models = {m.name: m for m in find_models(against)}
    entries = []
    for out in outs:
        t0 = time.perf_counter()
        name = out.relative_to(root).as_posix()
        model = models.pop(name, None)
        try:
            report = verify(out, against=model.path if model else None)
            if against is not None and model is None:
                report.problems.append(f"no source model named {name!r} under {against}")
            entries.append(TreeEntry(out, model.path if model else None, report, None,
                                     time.perf_counter() - t0))
        except RepackError as e:
            entries.append(TreeEntry(out, model.path if model else None, None, str(e),
                                     time.perf_counter() - t0))
    for name, model in models.items():  # sources with no output at all
        report = VerifyReport(root / name, problems=[f"no output for {model.path} (expected at "
                                                     f"{root / name})"])
        entries.append(TreeEntry(root / name, model.path, report, None, 0.0))
    if not entries:
        raise RepackError(f"{root}: no gguf-repack output directories under it")
    return entries
