"""The gguf-repack command line: a thin layer over the library.

Exit codes: 0 success; 1 verify found a mismatch; 2 bad input or an unusable output,
reported as one line ``error: <message>`` on stderr, never a traceback.
"""

from __future__ import annotations

import functools
import json
import os
import re
import sys
import time
from pathlib import Path

import click

from . import __version__
from .errors import RepackError, one_line


def _fail(message: str, code: int = 2):
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def _reports_errors(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except RepackError as e:
            _fail(str(e))
        except BrokenPipeError:  # `gguf-repack inspect ... | head`: the reader left; not an error
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(0)
        except OSError as e:  # disk full, permissions, I/O errors
            _fail(one_line(e))
        except KeyboardInterrupt:
            _fail("interrupted", 130)
    return wrapper


_REPORT = click.option("--report", "reports", multiple=True, metavar="FILE",
                       help="Also write a report: FILE.json (schema: gguf_repack/reports/"
                            "report.schema.json) or FILE.xml (JUnit); repeat for both.")


class _Reporting:
    """--report FILE...: the command's report, written when it ends, however it ends: passed
    (exit 0), failed (1), or an input it could not read (2: one error case naming it)."""

    def __init__(self, paths, command: str, target):
        from .reports import Report, check_report_paths

        self.paths = check_report_paths(paths)
        self.report, self.target = Report(command), str(target)

    def __enter__(self):
        return self.report

    def __exit__(self, kind, error, tb):
        from .reports import error_suite

        if self.paths and not isinstance(error, KeyboardInterrupt):
            if isinstance(error, (RepackError, OSError)):
                self.report.suites.append(error_suite(self.target, one_line(error)))
            for path in self.paths:
                self.report.write(path)
        return False


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
          "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}


def parse_size(text: str) -> int:
    """'4GB' -> 4_000_000_000, '512MiB' -> 536_870_912, '1000' -> 1000."""
    m = _SIZE.match(text)
    if not m:
        raise click.BadParameter(f"{text!r} is not a size like 4GB, 500MB or 1GiB")
    unit = (m[2] or "").lower().removesuffix("b")
    if unit not in _UNITS:
        raise click.BadParameter(f"{text!r}: unknown unit")
    return int(float(m[1]) * _UNITS[unit])


class _OneLineErrors(click.Group):
    """Usage mistakes, too, come out as one `error: ...` line (and exit code 2)."""

    def main(self, *args, **kwargs):
        try:
            return super().main(*args, standalone_mode=False, **kwargs)
        except click.UsageError as e:
            hint = f" (see '{e.ctx.command_path} --help')" if e.ctx is not None else ""
            _fail(e.format_message() + hint)
        except click.exceptions.Abort:
            _fail("aborted", 130)
        except click.exceptions.Exit as e:
            sys.exit(e.exit_code)


@click.group(cls=_OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gguf-repack")
def main():
    """Re-tile GGUF models, losslessly, into a planar layout for batched GPU inference."""


_REVISION = click.option("--revision", default=None, metavar="REV",
                         help="Branch, tag or commit of a Hub reference (default: main).")


@main.command()
@click.argument("src", metavar="SOURCE")
@click.argument("out", metavar="OUT_DIR")
@click.option("--force", is_flag=True, help="Replace OUT_DIR if it is a previous gguf-repack output.")
@click.option("--checksum", is_flag=True,
              help="With a directory SOURCE: decide that a converted model is unchanged by its "
                   "files' sha256 (reading every file), not by their size and mtime.")
@click.option("--max-shard-size", default="4GB", show_default=True,
              help="Largest safetensors file (a tensor larger than this gets a file of its own).")
@click.option("--weights-only", is_flag=True,
              help="Skip config.json, generation_config.json and the tokenizer files.")
@click.option("--progress/--no-progress", default=None,
              help="Progress bars on stderr (default: when stderr is a terminal).")
@_REVISION
@_REPORT
@_reports_errors
def convert(src, out, force, checksum, max_shard_size, progress, weights_only, revision, reports):
    """Convert SOURCE into OUT_DIR, with config.json and tokenizer files for engines (these
    need the `hf` extra). SOURCE is a GGUF file (or the first shard of a split set), a Hub
    reference (owner/repo:Q4_K_M, owner/repo/path/file.gguf), or a directory: then every
    model under it goes to OUT_DIR/<name>/, models already converted from the same files
    are skipped (the same size and mtime, else the same sha256; with --checksum, the same
    sha256), and the exit code is 1 if any failed."""
    archive = os.path.isdir(src) and revision is None
    if checksum and not archive:
        raise RepackError("--checksum applies to a directory SOURCE (it decides which models "
                          "of an archive are unchanged)")
    if progress is None:
        progress = sys.stderr.isatty()
    options = dict(force=force, max_shard_size=parse_size(max_shard_size), progress=progress,
                   weights_only=weights_only)
    from .reports import error_suite, from_output

    with _Reporting(reports, "convert", src) as report:
        if archive:
            from .converter.archive import FAILED, convert_archive

            summary = convert_archive(src, out, checksum=checksum, say=click.echo,
                                      warn=lambda line: click.echo(line, err=True), **options)
            for r in summary.results:
                report.suites.append(
                    error_suite(str(r.model.path), r.detail) if r.status == FAILED
                    else from_output(Path(out) / r.model.name, str(r.model.path), r.seconds))
            click.echo(summary.table())
            sys.exit(1 if summary.failed else 0)
        from .converter.writer import convert as run
        from .sources import resolve_source

        source = resolve_source(src, revision, progress=progress)
        summary = run(source.path, out, origins=source.origins, **options)
        report.suites.append(from_output(out, source.label, summary.seconds))
        click.echo(summary.line())


@main.command()
@click.argument("path", metavar="PATH")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for machines.")
@_REVISION
@_reports_errors
def inspect(path, as_json, revision):
    """Summarize a GGUF file (local or a Hub reference) or an output directory: metadata and
    a tensor table."""
    from .converter.describe import describe
    from .sources import resolve_source

    source = resolve_source(path, revision, progress=sys.stderr.isatty())
    info = describe(source.path)
    if source.origins:  # a Hub reference; an output directory has its own, from its manifest
        info["origin"] = source.origins
    if as_json:
        click.echo(json.dumps(info, indent=1, default=str))
        return
    click.echo(f"{info['path']}: {info['kind']}")
    for origin in info.get("origin") or []:
        click.echo(f"  from {_origin_line(origin)}")
    for f in info["files"]:
        click.echo(f"  file {f['file']}: {f['size']:,} bytes, {f['tensors']} tensors")
    for key, value in info.get("summary", {}).items():
        click.echo(f"  {key} = {value}")
    click.echo(f"  {info['engines']}")
    if "format" in info:
        click.echo(f"  format {info['format']}, {len(info['shards'])} shard(s), "
                   f"{info['output_bytes']:,} bytes")
    types = ", ".join(f"{n} {t}" for t, n in info["types"].items())
    click.echo(f"  {len(info['tensors'])} tensors ({types}), {info['tensor_bytes']:,} bytes")
    width = max([len(t["name"]) for t in info["tensors"]] + [4])
    click.echo(f"\n{'name':<{width}}  {'type':<8} {'shape':<20} {'bpw':>7} {'bytes':>14}")
    for t in info["tensors"]:
        bpw = f"{t['bits_per_weight']:.4g}" if t["bits_per_weight"] is not None else "?"
        shape = "x".join(map(str, t["shape"]))
        click.echo(f"{t['name']:<{width}}  {t['type']:<8} {shape:<20} {bpw:>7} {t['bytes']:>14,}")


def _origin_line(origin: dict) -> str:
    return f"{origin['hub']}@{origin['revision'][:12]}:{origin['path']} ({origin['endpoint']})"


@main.command()
@click.argument("paths", metavar="OUT_DIR...", nargs=-1, required=True)
@click.option("--against", metavar="SOURCE", default=None,
              help="Also compare every tensor with this source's bytes (a GGUF file or a Hub "
                   "reference; with --recursive, the directory of source models).")
@click.option("--recursive", "-r", is_flag=True,
              help="Verify every output directory under each OUT_DIR (as `convert DIR OUT_ROOT` "
                   "writes them).")
@_REVISION
@_REPORT
@_reports_errors
def verify(paths, against, recursive, revision, reports):
    """Recompute checksums from the planes of one or more output directories (a file inside
    one stands for its directory, as pre-commit passes them). Exit 0 when all match, 1 when
    any does not, 2 when an output cannot be read."""
    from .converter.archive import verify_each, verify_tree
    from .reports import error_suite, from_verify
    from .sources import resolve_source

    if (against is not None or revision is not None) and len(paths) > 1:
        raise RepackError("--against and --revision take one OUT_DIR")
    if revision is not None and (against is None or recursive):
        raise RepackError("--revision applies to --against's Hub reference")
    source = None
    with _Reporting(reports, "verify", paths[0]) as report:
        if recursive:
            entries = [e for root in paths for e in verify_tree(root, against)]
        else:
            if against is not None:
                source = resolve_source(against, revision, progress=sys.stderr.isatty())
            entries, elsewhere = verify_each(paths, source.path if source else None)
            for path in elsewhere:
                click.echo(f"verify: {path}: not in a gguf-repack output directory, not checked")
            if not entries:
                click.echo("verify: no gguf-repack output among the paths given")
                sys.exit(0)
        for e in entries:
            label = source.label if source else (str(e.source) if e.source else None)
            report.suites.append(error_suite(str(e.out), e.error) if e.error is not None
                                 else from_verify(e.report, label, e.seconds))
        code = _print_verify(entries, many=len(entries) > 1 or recursive,
                             against=source.label if source else None)
    sys.exit(code)


def _print_verify(entries, many: bool, against: str | None) -> int:
    """What a person reads; the exit code: 2 if any output was unreadable, else 1 if any
    check failed, else 0."""
    for e in entries:
        where = f"{e.out}: " if many else ""
        if e.error is not None:
            click.echo(f"error: {e.error}", err=True)
            continue
        for s in e.report.sources:
            if s.get("origin"):
                click.echo(f"{where}{s['file']}: from {_origin_line(s['origin'])}")
        for line in e.report.mismatches:
            click.echo(f"mismatch: {where}{line}")
    failed = [e for e in entries if e.error is None and not e.report.ok]
    unreadable = [e for e in entries if e.error is not None]
    checks = sum(e.report.checked for e in entries if e.report)
    if not many:
        [e] = entries
        if unreadable:
            return 2
        if failed:
            click.echo(f"verify: {len(e.report.mismatches)} mismatch(es) in {checks} checks", err=True)
            return 1
        click.echo(f"verify: ok, {checks} checks" + (f", identical to {against}" if against else ""))
        return 0
    click.echo(f"verify: {len(entries)} output(s): {len(entries) - len(failed) - len(unreadable)} "
               f"ok, {len(failed)} failed, {len(unreadable)} unreadable; {checks} checks")
    return 2 if unreadable else 1 if failed else 0


@main.command()
@click.argument("out", metavar="OUT_DIR")
@click.argument("dest", metavar="BACK.gguf")
@click.option("--force", is_flag=True, help="Overwrite existing files.")
@_REPORT
@_reports_errors
def export(out, dest, force, reports):
    """Rebuild the source GGUF file(s), byte for byte, from OUT_DIR (each checked against the
    sha256 its manifest records before it is put in place)."""
    from .converter.rebuild import export as run
    from .format.manifest import read_manifest
    from .reports import Case, Suite, source_files

    with _Reporting(reports, "export", out) as report:
        t0 = time.perf_counter()
        written = run(out, dest, force=force)
        sources = read_manifest(out)["sources"]
        report.suites.append(Suite(str(out), str(dest), source_files(sources), [
            Case("file", str(path), checksum={"algorithm": "sha256", "expected": s["sha256"],
                                              "found": s["sha256"]})
            for path, s in zip(written, sources)], time.perf_counter() - t0))
        for path in written:
            click.echo(f"wrote {path}")


@main.command()
@click.argument("model", default="smollm2", metavar="[MODEL]")
@click.option("--out", metavar="OUT_DIR", default=None,
              help="Where to convert to (default: ./<model name>-rp1; reused when it already "
                   "holds this model).")
@click.option("--prompt", default="Write one sentence about the ocean.", show_default=True)
@click.option("--max-new-tokens", default=24, show_default=True, type=click.IntRange(1, 512))
@_reports_errors
def demo(model, out, prompt, max_new_tokens):
    """Fetch a small real model (smollm2 or gemma), convert, verify, load it with quantized
    weights and generate a short greedy completion, with timings. Needs the hf extra."""
    from .converter.engine_files import hf_available
    from .demo import run_demo

    missing = hf_available()
    if missing:
        raise RepackError(f"demo needs the hf extra: {missing}")
    run_demo(model, out, prompt, max_new_tokens, say=click.echo)
