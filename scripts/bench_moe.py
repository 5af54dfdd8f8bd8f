#!/usr/bin/env python3
"""A mixture-of-experts model through transformers on CPU: `gguf_repack.hf.load_model(out)`
(expert stacks stay quantized, QuantExperts) vs transformers' GGUF path
(`from_pretrained(gguf_file=...)`, every weight dequantized to float32), side by side.

    python scripts/bench_moe.py [--layers 8] [--experts 32] [--prefill 128] [--decode 32] [--repeat 1]

There is no real MoE GGUF small enough for the package index, so the model is written here as
llama.cpp's converter writes Qwen3-MoE (tests/hf_models.write_moe: hidden 256, expert width
768, top 2, experts in Q4_K / Q6_K / IQ4_XS / Q8_0 / MXFP4, random weights), then converted
(outside the timing). Each side runs in a fresh process: seconds from before `import torch` to
the first generated token and peak RSS (VmHWM), then, in the same process, prefill of a
128-token prompt and 32 greedy decode steps at batch 1 (tokens/s; --prefill, --decode), and
the bytes its model holds (parameters and buffers) against the file's tensor bytes.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))
from benchutil import last_json_line, machine_line, run_measured  # noqa: E402
from hf_models import tokenizer_kvs, write_moe  # noqa: E402

from gguf_repack.models import fetch  # noqa: E402

# argv: load target, "ours"/"theirs", prefill tokens, decode steps; prints one JSON line
RUN = """
import time; t0 = time.perf_counter()
import json, sys, torch
from pathlib import Path
from transformers import AutoModelForCausalLM
target, side, n_prefill, n_decode = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if side == "ours":
    from gguf_repack.hf import load_model
    model = load_model(target)
else:
    model = AutoModelForCausalLM.from_pretrained(target.parent, gguf_file=target.name, dtype=torch.float32)
with torch.no_grad():
    first = model.generate(torch.tensor([[1, 100, 200, 300]]), max_new_tokens=1, do_sample=False)
    seconds = time.perf_counter() - t0
    prompt = torch.randint(1000, 20000, (1, n_prefill), generator=torch.Generator().manual_seed(0))
    model(prompt)  # warm
    t = time.perf_counter(); model(prompt); prefill = time.perf_counter() - t
    t = time.perf_counter()
    out = model.generate(prompt[:, :8], max_new_tokens=n_decode, min_new_tokens=n_decode, do_sample=False)
    decode = time.perf_counter() - t
held = sum(x.numel() * x.element_size() for x in [*model.parameters(), *model.buffers()])
print(json.dumps({"seconds": seconds, "token": first[0, -1].item(), "prefill_tps": n_prefill / prefill,
                  "decode_tps": n_decode / decode, "held": held, "tokens": out[0, 8:].tolist()}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--prefill", type=int, default=128, help="prompt tokens of the prefill")
    ap.add_argument("--decode", type=int, default=32, help="greedy decode steps")
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    from gguf_repack import convert

    work = Path(tempfile.mkdtemp(prefix="bench-moe-"))
    try:
        src = write_moe(work / "qwen3moe.gguf", "qwen3moe", tokenizer_kvs(fetch("smollm2")),
                        np.random.default_rng(0), layers=args.layers, experts=args.experts)
        out = work / "out"
        convert(src, out)
        file_bytes = sum(t["source"]["nbytes"]
                         for t in json.loads((out / "manifest.json").read_text())["tensors"])
        runs = {"ours": [], "theirs": []}
        for _ in range(args.repeat):
            sizes = [str(args.prefill), str(args.decode)]
            runs["ours"].append(run_measured(["-c", RUN, str(out), "ours", *sizes]))
            runs["theirs"].append(run_measured(["-c", RUN, str(src), "theirs", *sizes]))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    best = {k: min(v, key=lambda r: last_json_line(r[2])["seconds"]) for k, v in runs.items()}
    ours, theirs = (last_json_line(best[k][2]) for k in ("ours", "theirs"))
    same = "same" if ours["tokens"] == theirs["tokens"] else "DIFFERENT"
    rows = [("`load_model(out)`", ours, best["ours"][1]),
            ("transformers `from_pretrained(gguf_file=...)`", theirs, best["theirs"][1])]
    lines = [machine_line(), "",
             f"Qwen3-MoE written by tests/hf_models.write_moe: {args.layers} layers, {args.experts} "
             f"experts (top 2), hidden 256, expert width 768; file tensor bytes "
             f"{file_bytes / 2**20:.1f} MiB; best of {args.repeat}, a fresh process each:", "",
             f"| path | seconds to first token | peak RSS MiB | held / file bytes | prefill "
             f"{args.prefill} tok/s | decode tok/s (batch 1) |", "| --- | --- | --- | --- | --- | --- |"]
    for label, r, rss in rows:
        lines.append(f"| {label} | {r['seconds']:.2f} | {rss:.0f} | {r['held'] / file_bytes:.2f}x | "
                     f"{r['prefill_tps']:.0f} | {r['decode_tps']:.1f} |")
    lines.append(f"| ratio (ours / theirs) | {ours['seconds'] / theirs['seconds']:.2f}x | "
                 f"{best['ours'][1] / best['theirs'][1]:.2f}x | {ours['held'] / theirs['held']:.2f}x | "
                 f"{ours['prefill_tps'] / theirs['prefill_tps']:.2f}x | "
                 f"{ours['decode_tps'] / theirs['decode_tps']:.2f}x ({same} {args.decode} greedy tokens) |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
