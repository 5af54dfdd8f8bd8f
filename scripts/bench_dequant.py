#!/usr/bin/env python3
"""Dequantize benchmark: the torch backend over rp1 planes vs gguf-py, and load() of a whole
model vs transformers' GGUF loader.

    python scripts/bench_dequant.py [--rows 2048] [--cols 4096] [--repeat 3] [--skip-model]

1. Per type, on the same random valid blocks (rows x cols weights): best-of-N seconds of
   `gguf.quants.dequantize` on the GGUF bytes and of `QTensor.dequantize()` (torch backend)
   on the planes; million weights per second, GB/s of quantized input, and the ratio.
2. A fresh process each: `gguf_repack.load(out)` of the converted Gemma 3 directory plus
   dequantizing every tensor to float32, vs transformers'
   `AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)` on the source file (which
   dequantizes everything to float32): seconds and peak RSS side by side.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from benchutil import best_of, last_json_line, machine_line, run_measured  # noqa: E402

from gguf_repack.models import GEMMA, fetch  # noqa: E402

LOAD_ALL = """
import json, sys, time
t = time.perf_counter()
import gguf_repack
model = gguf_repack.load(sys.argv[1])
n = 0
for name in model:
    w = model[name]
    n += (w.dequantize() if isinstance(w, gguf_repack.QTensor) else w.float()).numel()
print(json.dumps({"seconds": time.perf_counter() - t, "weights": n}))
"""

TRANSFORMERS = """
import json, sys, time
from pathlib import Path
t = time.perf_counter()
from transformers import AutoModelForCausalLM
src = Path(sys.argv[1])
model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name)
n = sum(p.numel() for p in model.parameters())
print(json.dumps({"seconds": time.perf_counter() - t, "weights": n}))
"""


def bench_types(rows: int, cols: int, repeat: int) -> list[str]:
    import gguf.quants
    import torch
    from ggml_blocks import random_blocks
    from gguf.constants import GGMLQuantizationType

    from gguf_repack.format.layout import pack
    from gguf_repack.format.type_table import TYPES
    from gguf_repack.runtime.qtensor import QTensor

    lines = ["| type | gguf-py Mw/s | torch Mw/s | torch GB/s in | ratio |",
             "| --- | --- | --- | --- | --- |"]
    rng = np.random.default_rng(0)
    for qtype in sorted((t for t in TYPES.values() if t.is_quantized), key=lambda t: t.id):
        if GGMLQuantizationType(qtype.id) not in gguf.quants._type_traits:
            continue
        blocks = random_blocks(qtype.id, (rows, cols), rng)
        raw = blocks.reshape(rows, -1)
        qt = QTensor(qtype, (rows, cols),
                     {k: torch.from_numpy(v) for k, v in pack(blocks, qtype).items()})
        ref_s = best_of(lambda: gguf.quants.dequantize(raw, GGMLQuantizationType(qtype.id)), repeat)
        our_s = best_of(lambda: qt.dequantize(backend="torch"), repeat)
        n = rows * cols
        lines.append(f"| {qtype.name} | {n / ref_s / 1e6:.0f} | {n / our_s / 1e6:.0f} | "
                     f"{raw.nbytes / our_s / 1e9:.2f} | {ref_s / our_s:.1f} |")
        print(lines[-1], file=sys.stderr)
    return lines


def bench_model() -> list[str]:
    from gguf_repack import convert

    gemma = fetch(GEMMA)
    work = Path(tempfile.mkdtemp(prefix="bench-dequant-"))
    try:
        out = work / "gemma"
        convert(gemma, out)
        ours = run_measured(["-c", LOAD_ALL, str(out)])
        theirs = run_measured(["-c", TRANSFORMERS, str(gemma)])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = []
    for label, (wall, rss, stdout) in (("`gguf_repack.load()` + dequantize every tensor", ours),
                                       ("transformers `from_pretrained(gguf_file=...)`", theirs)):
        inner = last_json_line(stdout)
        rows.append(f"| {label} | {wall:.2f} | {inner['seconds']:.2f} | {rss:.0f} | "
                    f"{inner['weights']:,} |")
    return ["| what | process seconds | seconds after start-up | peak RSS MiB | weights |",
            "| --- | --- | --- | --- | --- |", *rows,
            "", f"gguf-repack is {theirs[0] / ours[0]:.1f}x faster (process seconds) at "
                f"{ours[1] / theirs[1]:.2f}x transformers' peak RSS."]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=2048)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip-model", action="store_true", help="only the per-type table")
    args = ap.parse_args()
    lines = [machine_line(), "",
             f"Per type, {args.rows} x {args.cols} weights, best of {args.repeat}:", "",
             *bench_types(args.rows, args.cols, args.repeat)]
    if not args.skip_model:
        lines += ["", "Gemma 3 270M Q4_K_M, a fresh process each:", "", *bench_model()]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
