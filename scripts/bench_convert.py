#!/usr/bin/env python3
"""Convert benchmark: time against cp, peak memory against file size, output size.

    python scripts/bench_convert.py [--repeat 7] [--big-gib 2] [--workdir DIR]

1. Time: `gguf-repack convert --weights-only` of the Gemma 3 file vs `cp` of the same file,
   page cache warm, alternating in one run; median of --repeat runs each. Reported for the CLI
   (a fresh process, interpreter start included) and for `gguf_repack.convert()` in a warm
   process. Then the whole CLI convert, engine files (config, tokenizer) included.
2. Peak RSS of a convert process on a synthetic GGUF of --big-gib GiB and on one of a quarter
   of that size (both written here, tensor by tensor), each minus the peak RSS of a process
   that only imports gguf_repack: streaming means the two stay about equal.
3. Output size (weights, manifest, header) over source size, for both real models.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from benchutil import machine_line, peak_rss_mib  # noqa: E402

from gguf_repack.models import GEMMA, SMOLLM2, fetch  # noqa: E402


def timed(cmd: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def write_synthetic(path: Path, total_bytes: int) -> int:
    """A GGUF of mixed Q4_K / Q8_0 / F16 tensors (4096 x 4096 each) of about total_bytes,
    written with gguf's GGUFWriter one tensor at a time."""
    import gguf
    from gguf.constants import GGML_QUANT_SIZES
    from gguf.constants import GGMLQuantizationType as Q

    kinds = [Q.Q4_K, Q.Q8_0, Q.F16]
    n, k = 4096, 4096
    plan, size = [], 0
    while size < total_bytes:
        qtype = kinds[len(plan) % len(kinds)]
        bs, ts = GGML_QUANT_SIZES[qtype]
        nbytes = n * k // bs * ts
        plan.append((f"blk.{len(plan)}.weight", qtype, nbytes))
        size += nbytes
    w = gguf.GGUFWriter(str(path), "llama")
    for name, qtype, nbytes in plan:
        w.add_tensor_info(name, (n, nbytes // n), np.dtype(np.uint8), nbytes, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(0)
    for _, _, nbytes in plan:
        w.write_tensor_data(rng.integers(0, 256, nbytes, dtype=np.uint8))
    w.close()
    return path.stat().st_size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--big-gib", type=float, default=2.0)
    ap.add_argument("--workdir", type=Path, default=None)
    args = ap.parse_args()

    from gguf_repack import convert

    gemma = fetch(GEMMA)
    smollm2 = fetch(SMOLLM2)
    work = Path(tempfile.mkdtemp(prefix="bench-convert-", dir=args.workdir))
    cli = [sys.executable, "-m", "gguf_repack", "convert", "--force", "--no-progress"]
    try:
        # 1. time vs cp
        out, copy = work / "gemma-out", work / "gemma-copy.gguf"
        subprocess.run(["cat", str(gemma)], check=True, stdout=subprocess.DEVNULL)  # warm
        cp_t, cli_t, lib_t, full_t = [], [], [], []
        for _ in range(args.repeat):  # each run writes a fresh target; deleting is not timed
            copy.unlink(missing_ok=True)
            cp_t.append(timed(["cp", str(gemma), str(copy)]))
            shutil.rmtree(out, ignore_errors=True)
            cli_t.append(timed([*cli, "--weights-only", str(gemma), str(out)]))
            shutil.rmtree(out, ignore_errors=True)
            t = time.perf_counter()
            convert(gemma, out, weights_only=True)
            lib_t.append(time.perf_counter() - t)
            shutil.rmtree(out, ignore_errors=True)
            full_t.append(timed([*cli, str(gemma), str(out)]))
        cp_s, cli_s, lib_s, full_s = map(statistics.median, (cp_t, cli_t, lib_t, full_t))

        # 2. peak RSS vs file size
        base = peak_rss_mib(["-c", "import gguf_repack, gguf_repack.cli"])
        rss = {}
        for label, gib in (("big", args.big_gib), ("quarter", args.big_gib / 4)):
            src = work / f"synthetic-{label}.gguf"
            size = write_synthetic(src, int(gib * 2**30))
            peak = peak_rss_mib([*cli[1:], str(src), str(work / f"synthetic-{label}-out")])
            rss[label] = (size, peak)
            shutil.rmtree(work / f"synthetic-{label}-out")
            src.unlink()

        # 3. output size
        sizes = {}
        for model in (smollm2, gemma):
            o = work / f"{model.stem}-out"
            summary = convert(model, o, force=True)
            engine = sum((o / name).stat().st_size for name in summary.engine_files)
            sizes[model.name] = (model.stat().st_size, summary.bytes_out - engine, engine)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    lines = [
        machine_line(),
        "",
        f"Convert vs cp, Gemma 3 270M Q4_K_M ({gemma.stat().st_size / 1e6:.1f} MB), page cache warm, "
        f"median of {args.repeat}:",
        "",
        "| what | seconds | ratio to cp |",
        "| --- | --- | --- |",
        f"| `cp` | {cp_s:.3f} | 1.00 |",
        f"| `gguf-repack convert --weights-only` (new process) | {cli_s:.3f} | {cli_s / cp_s:.2f} |",
        f"| `gguf_repack.convert(weights_only=True)` (warm process) | {lib_s:.3f} | {lib_s / cp_s:.2f} |",
        f"| `gguf-repack convert` with config and tokenizer (new process) | {full_s:.3f} | "
        f"{full_s / cp_s:.2f} |",
        "",
        f"Peak RSS of `gguf-repack convert` (baseline: a process that only imports gguf_repack, "
        f"{base:.0f} MiB):",
        "",
        "| source | size | peak RSS | above baseline |",
        "| --- | --- | --- | --- |",
    ]
    for label, (size, peak) in rss.items():
        lines.append(f"| synthetic ({label}) | {size / 2**30:.2f} GiB | {peak:.0f} MiB "
                     f"| {peak - base:.0f} MiB |")
    lines += ["", "Output size (weights, manifest, header) over source size; the engine files "
              "(tokenizer.json mostly) come on top:", "",
              "| model | source bytes | output bytes | ratio | engine files bytes |",
              "| --- | --- | --- | --- | --- |"]
    for name, (src_b, out_b, engine_b) in sizes.items():
        lines.append(f"| {name} | {src_b:,} | {out_b:,} | {out_b / src_b:.4f} | {engine_b:,} |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
