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

import click

from . import __version__
from .errors import RepackError


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
            where = f"{e.filename}: " if e.filename else ""
            _fail(f"{where}{e.strerror or e}")
        except KeyboardInterrupt:
            _fail("interrupted", 130)
    return wrapper


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
@click.option("--max-shard-size", default="4GB", show_default=True,
              help="Largest safetensors file (a tensor larger than this gets a file of its own).")
@click.option("--weights-only", is_flag=True,
              help="Skip config.json, generation_config.json and the tokenizer files.")
@click.option("--progress/--no-progress", default=None,
              help="Progress bars on stderr (default: when stderr is a terminal).")
@_REVISION
@_reports_errors
def convert(src, out, force, max_shard_size, progress, weights_only, revision):
    """Convert SOURCE into OUT_DIR, with config.json and tokenizer files for engines (these
    need the `hf` extra). SOURCE is a GGUF file (or the first shard of a split set), a Hub
    reference (owner/repo:Q4_K_M, owner/repo/path/file.gguf), or a directory: then every
    model under it goes to OUT_DIR/<name>/, models already converted from the same file are
    skipped, and the exit code is 1 if any failed."""
    if progress is None:
        progress = sys.stderr.isatty()
    options = dict(force=force, max_shard_size=parse_size(max_shard_size), progress=progress,
                   weights_only=weights_only)
    if os.path.isdir(src) and revision is None:
        from .converter.archive import convert_archive

        summary = convert_archive(src, out, say=click.echo,
                                  warn=lambda line: click.echo(line, err=True), **options)
        click.echo(summary.table())
        sys.exit(1 if summary.failed else 0)
    from .converter.writer import convert as run
    from .sources import resolve_source

    source = resolve_source(src, revision, progress=progress)
    click.echo(run(source.path, out, origins=source.origins, **options).line())


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
@click.argument("out", metavar="OUT_DIR")
@click.option("--against", metavar="SOURCE", default=None,
              help="Also compare every tensor with this source's bytes (a GGUF file or a Hub "
                   "reference).")
@_REVISION
@_reports_errors
def verify(out, against, revision):
    """Recompute checksums from the planes. Exit 0 when all match, 1 when any does not."""
    from .converter.rebuild import verify as run
    from .format.manifest import read_manifest
    from .sources import resolve_source

    for source in read_manifest(out)["sources"]:
        if source.get("origin"):
            click.echo(f"{source['file']}: from {_origin_line(source['origin'])}")
    source = None
    if against is not None:
        source = resolve_source(against, revision, progress=sys.stderr.isatty())
    elif revision is not None:
        raise RepackError("--revision applies to --against's Hub reference")
    report = run(out, against=source.path if source else None)
    for line in report.mismatches:
        click.echo(f"mismatch: {line}")
    if not report.ok:
        click.echo(f"verify: {len(report.mismatches)} mismatch(es) in {report.checked} checks",
                   err=True)
        sys.exit(1)
    click.echo(f"verify: ok, {report.checked} checks"
               + (f", identical to {source.label}" if source else ""))


@main.command()
@click.argument("out", metavar="OUT_DIR")
@click.argument("dest", metavar="BACK.gguf")
@click.option("--force", is_flag=True, help="Overwrite existing files.")
@_reports_errors
def export(out, dest, force):
    """Rebuild the source GGUF file(s), byte for byte, from OUT_DIR."""
    from .converter.rebuild import export as run

    for path in run(out, dest, force=force):
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
