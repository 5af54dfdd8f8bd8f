#!/usr/bin/env python3
"""GPU benchmark of the rp1 kernels: one command, under 8 minutes on one GPU.

    python scripts/bench_gpu.py [--out bench-out] [--runs 50]
    python scripts/bench_gpu.py --smoke      # CPU, Triton's interpreter, tiny shapes: checks
                                             # the script itself, times mean nothing

For each type and shape (N, K) and batch M, timed side by side with CUDA events (median of
--runs after warm-up): the rp1 kernel (gguf_repack_kernels.matmul), the raw-layout kernel
that reads GGUF's own blocks (Q4_0, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_XS; M <= 8), fp16
torch.matmul with the dense weight, and dequantize-then-matmul; where the fused tile runs
and the blocks are under 128 weights, that tile with one block a K step as well (the tile
before configs.gemm_step_blocks: what the longer K step gains, measured on the device); at
M = 128 and 256 the fused tile the rule names there, past configs.FUSED_MAX_M. A
device-to-device copy measured in the same run gives the bandwidth baseline. Reported: GB/s
of weight bytes and its fraction of copy bandwidth for M <= 8, TFLOP/s above, and the
ratios. Each timing cycles through copies of its weight that together are three times the
L2 cache (a 4096 x 4096 Q4_K weight is 9.4 MB, an H200's L2 60 MB): the bytes come from
device memory, as a model's weights do, not from the cache. Writes bench_gpu.json and
bench_gpu.md into --out after every weight (a run stopped early keeps what it measured).

Types Q4_0, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_XS at every shape; every other type at 4096 x 4096.
First, for those six types, the expert products of a 128-expert stack (EXPERT_STACK) at 1 to
256 tokens of 8 experts each: the bytes of the experts touched over the time, against the
copy bandwidth (issue #31's MoE measure), and what each product launches.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path

FULL_TYPES = ["Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"]
SHAPES = [(4096, 4096), (14336, 4096), (4096, 14336)]
# the batch sweep of scripts/inspect_kernels.py --batch-sweep (issue #31): measured here
# beside what it estimates from the SASS
BATCHES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 2048]
GEMV_M = 8
# the M at which the product with bfloat16 x is timed too (the BM = 16 and 32 tiles), for the
# types with bfloat16 dequant functions
BF16_BATCHES = (16, 32)
# the M past configs.FUSED_MAX_M at which the fused tile MATMUL_RULE names there (the cap
# lifted) is timed too: the cap came from an H200 run whose swapped tiles had every wgmma
# serialized by ptxas (gemm.py, MMA_PIPELINED); whether it still holds is this column's to say.
# (Q4_K's BM = 128 tile still has them serialized, with every Triton: configs.NO_STEP_PROMISE)
FUSED_PAST_CAP = (128, 256)


@contextlib.contextmanager
def fused_cap_lifted():
    """configs.FUSED_MAX_M out of the way: the rule's fused tile at any M."""
    cap = kernels.configs.FUSED_MAX_M
    kernels.configs.FUSED_MAX_M = 1 << 30
    try:
        yield
    finally:
        kernels.configs.FUSED_MAX_M = cap


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("bench-out"))
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--types", default=None, help="comma-separated subset")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--short", action="store_true",
                    help="4096 x 4096 only, every M of the sweep (scripts/gpu_check.py)")
    return ap.parse_args()


ARGS = parse() if __name__ == "__main__" else None
if ARGS is not None and ARGS.smoke:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from ggml_blocks import random_blocks  # noqa: E402
from raw_layout_kernels import RAW_DEQUANT, raw_matmul  # noqa: E402

import gguf_repack_kernels as kernels  # noqa: E402
from gguf_repack.format.layout import pack  # noqa: E402
from gguf_repack.format.type_table import TYPES_BY_NAME  # noqa: E402


class Timer:
    """Seconds per call of fn, the median of `runs`. On a GPU, `calls` calls are captured in
    one CUDA graph and replayed between CUDA events: the device's time, as an engine that
    captures its decode step (vLLM) sees it. A single eager call between two events measures
    Python and the launch instead (on an H200, 100-300 us for any kernel here: the first run
    of gpu_check.py), so `eager` times `calls` calls back to back with the host's clock, the
    cost per call of a program that does not capture. In smoke mode, perf_counter (the
    interpreter: the times mean nothing)."""

    def __init__(self, device: torch.device, runs: int, calls: int = 24):
        self.device, self.runs, self.calls = device, runs, calls

    def __call__(self, fn) -> float:
        fn()  # warm-up (and compilation)
        if self.device.type != "cuda":
            t = time.perf_counter()
            for _ in range(self.runs):
                fn()
            return (time.perf_counter() - t) / self.runs
        side = torch.cuda.Stream()  # warm-up off the capturing stream, as torch asks
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(self.calls):
                fn()
        graph.replay()
        times = []
        for _ in range(self.runs):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3 / self.calls)
        del graph
        return statistics.median(times)

    def eager(self, fn) -> float:
        """Seconds per call of `calls` calls back to back, synchronized once: the larger of the
        host's cost per call (Python, the launch) and the device's."""
        fn()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(self.calls):
            fn()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter() - t) / self.calls


def kernel_breakdown(fn, device: torch.device, calls: int = 20) -> dict | str | None:
    """{kernel name: device microseconds per call} over `calls` eager calls of fn, from
    torch's profiler (CUPTI): what one product launches (the GEMV: x's preparation, which
    zeroes the split-K workspace, and the GEMV itself; split_k.py) and what each costs on
    the device, beside the graph replay's time per call (the gaps between kernels are the
    rest). None on CPU; the error's text if the profiler fails (the bench goes on)."""
    if device.type != "cuda":
        return None
    try:
        from torch.profiler import ProfilerActivity, profile

        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
        return {e.key[:80]: round(e.device_time_total / calls, 2) for e in prof.key_averages()
                if e.device_time_total > 0}
    except Exception as e:  # a measurement, not the bench: reported, not raised
        return f"{type(e).__name__}: {e}"[:300]


def copy_bandwidth(device, timer, nbytes: int) -> float:
    """Bytes moved per second (read + write) by a device-to-device copy."""
    a = torch.empty(nbytes, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    return 2 * nbytes / timer(lambda: b.copy_(a))


def rotation(tensor_of, nbytes: int, device: torch.device):
    """An endless cycle over copies of one weight (tensor_of() makes each) that together
    hold three times the device's L2 cache, so that a timed call reads device memory."""
    l2 = torch.cuda.get_device_properties(device).L2_cache_size if device.type == "cuda" else 0
    return itertools.cycle([tensor_of() for _ in range(max(1, -(-3 * l2 // nbytes)))])


def bench_weight(name, n, k, batches, device, timer, copy_bw, rng) -> list[dict]:
    qtype = TYPES_BY_NAME[name]
    blocks = random_blocks(qtype.id, (n, k), rng)
    q_bytes = blocks.nbytes
    planes = rotation(lambda: {f: torch.from_numpy(v).to(device)
                               for f, v in pack(blocks, qtype).items()}, q_bytes, device)
    raw = rotation(lambda: torch.from_numpy(blocks.reshape(n, -1)).to(device), q_bytes, device)
    first = next(planes)
    dense = rotation(lambda: kernels.dequantize(first, name, (n, k), torch.float16),
                     2 * n * k, device)
    rows = []
    for m in batches:
        x = torch.randn(m, k, dtype=torch.float16, device=device)
        t = {"rp1": timer(lambda: kernels.matmul(x, next(planes), name, (n, k))),
             "fp16": timer(lambda: x @ next(dense).T),
             "dequant+matmul": timer(lambda: x @ kernels.dequantize(next(planes), name, (n, k),
                                                                     torch.float16).T)}
        if name in RAW_DEQUANT and m <= GEMV_M:
            t["raw"] = timer(lambda: raw_matmul(x, next(raw), name, (n, k)))
        if kernels.dispatch.matmul_path(name, m) == "gemm" and \
                kernels.FORMATS[name].block_size < kernels.configs.GEMM_STEP_WEIGHTS:
            # the fused tile as it was before K steps of 128 weights (configs.gemm_step_blocks):
            # a block column a step, side by side with the default
            t["one-block steps"] = timer(lambda: kernels.matmul(x, next(planes), name, (n, k),
                                                                tile={"STEP_BLOCKS": 1}))
        if m in FUSED_PAST_CAP:
            with fused_cap_lifted():
                if kernels.dispatch.matmul_path(name, m) == "gemm":
                    t["fused past the cap"] = timer(lambda: kernels.matmul(x, next(planes), name, (n, k)))
        if m in BF16_BATCHES and kernels.FORMATS[name].half_dequant("bf16") is not None:
            # bfloat16 x (vLLM's default), the tiles' bfloat16 dequant functions (registry.py)
            xb = x.bfloat16()
            t["rp1 bf16 x"] = timer(lambda: kernels.matmul(xb, next(planes), name, (n, k)))
        t["rp1 eager"] = timer.eager(lambda: kernels.matmul(x, next(planes), name, (n, k)))
        # what the rp1 product launches, each kernel's device time (at the GEMV's M and 16)
        breakdown = kernel_breakdown(lambda: kernels.matmul(x, next(planes), name, (n, k)),
                                     device) if m in (1, 16) else None
        t["fp16 eager"] = timer.eager(lambda: x @ next(dense).T)
        row = {"type": name, "N": n, "K": k, "M": m, "seconds": t,
               "vs_fp16": t["fp16"] / t["rp1"],
               "vs_raw": t["raw"] / t["rp1"] if "raw" in t else None}
        if breakdown is not None:
            row["rp1_kernels_us"] = breakdown
        if m <= GEMV_M:
            row["GB/s"] = q_bytes / t["rp1"] / 1e9
            row["copy_fraction"] = q_bytes / t["rp1"] / copy_bw
        else:
            row["TFLOP/s"] = 2 * m * n * k / t["rp1"] / 1e12
            row["fp16 TFLOP/s"] = 2 * m * n * k / t["fp16"] / 1e12
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)
    return rows


# The expert products (gguf_repack_kernels.expert_matmul) of a stack shaped as Qwen3-30B-A3B's
# gate (or up) projections: 128 experts of 768 x 2048, 8 a token; at decode (a GEMV a pair)
# and past it (the tiles). Issue #31's measure: the bytes of the experts the tokens touched,
# over the time, against the device's copy bandwidth. Where the experts chosen get more than
# a row each, the path configs.MOE_RULE does not take is timed too ("other path": the GEMV on
# 4 of an expert's rows for the tiles, the rule's first tile for the GEMV), so that a GPU says where the rule,
# fitted to an estimate, should cross over.
EXPERT_STACK = (128, 768, 2048)
EXPERT_TOP = 8
EXPERT_TOKENS = [1, 8, 16, 32, 64, 256]  # 1 to 16 rows an expert (1.2-2.3: the rule's crossovers)


@contextlib.contextmanager
def expert_choice(name: str, choice: str):
    """configs.MOE_RULE's rule for `name` replaced by one choice at every rows an expert."""
    rules = kernels.configs.MOE_RULE
    saved = rules.get(name)
    rules[name] = ((None, choice),)
    try:
        yield
    finally:
        if saved is None:
            del rules[name]
        else:
            rules[name] = saved


def other_expert_choice(name: str, tokens: int, top: int, experts: int) -> str | None:
    """The choice the rule does not take at this batch: the GEMV on 4 of an expert's rows a
    program where it takes tiles, else its first tile; none where the experts chosen get a
    row each (the GEMV whatever the rule)."""
    if kernels.configs.routed_rows_per_expert(tokens, top, experts) <= 1.0:
        return None
    if kernels.dispatch.expert_path(name, tokens, top, experts) == "tiles":
        return "gemv_x4"
    rule = kernels.configs.MOE_RULE.get(name, kernels.configs.MOE_DEFAULT_RULE)
    return next(choice for _, choice in rule if choice.startswith("tiles"))


def bench_experts(name, device, timer, copy_bw, rng, smoke: bool) -> list[dict]:
    qtype = TYPES_BY_NAME[name]
    shape = (4, 32, qtype.block_size) if smoke else EXPERT_STACK  # (smoke: the interpreter)
    experts, n, k = shape
    top = 2 if smoke else EXPERT_TOP
    blocks = random_blocks(qtype.id, shape, rng)
    per_expert = blocks.nbytes // experts
    stacks = rotation(lambda: {f: torch.from_numpy(v).to(device) for f, v in pack(blocks, qtype).items()},
                      blocks.nbytes, device)
    rows = []
    for tokens in ([1] if smoke else EXPERT_TOKENS):
        # each token's experts distinct, uniformly random (vLLM's top-k gives int32 ids)
        ids = torch.stack([torch.randperm(experts, generator=torch.Generator().manual_seed(t))[:top]
                           for t in range(tokens)]).to(torch.int32).to(device)
        x = torch.randn(tokens, k, dtype=torch.float16, device=device)
        touched = int(ids.unique().numel()) * per_expert
        t = {"rp1": timer(lambda: kernels.expert_matmul(x, ids, next(stacks), name, shape)),
             "rp1 eager": timer.eager(lambda: kernels.expert_matmul(x, ids, next(stacks), name, shape))}
        breakdown = kernel_breakdown(lambda: kernels.expert_matmul(x, ids, next(stacks), name, shape), device)
        other = other_expert_choice(name, tokens, top, experts)
        if other is not None:
            with expert_choice(name, other):
                t["other path"] = timer(lambda: kernels.expert_matmul(x, ids, next(stacks), name, shape))
        row = {"type": name, "experts": shape, "top": top, "tokens": tokens,
               "rows_per_expert": kernels.configs.routed_rows_per_expert(tokens, top, experts),
               "path": kernels.dispatch.expert_path(name, tokens, top, experts), "other_path": other,
               "seconds": t, "touched_bytes": touched, "GB/s": touched / t["rp1"] / 1e9,
               "copy_fraction": touched / t["rp1"] / copy_bw}
        if breakdown is not None:
            row["rp1_kernels_us"] = breakdown
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)
    return rows


def experts_markdown(rows: list[dict]) -> str:
    lines = ["", "", f"Expert products, a stack of {rows[0]['experts'][0]} experts of "
             f"{rows[0]['experts'][1]} x {rows[0]['experts'][2]}, {rows[0]['top']} a token, random "
             "distinct experts per token: the bytes of the experts touched over the time (graph "
             "replays), against the device's copy bandwidth", "",
             "| type | tokens | path | rp1 | touched MB | GB/s (of copy) | rp1 eager "
             "| launches (device us) | other path (configs.MOE_RULE's not taken) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        kernels_us = r.get("rp1_kernels_us")
        launched = (", ".join(f"{k} {v}" for k, v in kernels_us.items()) if isinstance(kernels_us, dict)
                    else kernels_us or "-")
        lines.append(f"| {r['type']} | {r['tokens']} | {r['path']} | {r['seconds']['rp1'] * 1e6:.1f} us | "
                     f"{r['touched_bytes'] / 1e6:.1f} | {r['GB/s']:.0f} ({100 * r['copy_fraction']:.0f}%) | "
                     f"{r['seconds']['rp1 eager'] * 1e6:.1f} us | {launched} | "
                     + (f"{r['other_path']} {r['seconds']['other path'] * 1e6:.1f} us |"
                        if r.get("other_path") else "- |"))
    return "\n".join(lines)


def markdown(rows: list[dict], copy_bw: float, device_name: str) -> str:
    lines = [f"Device: {device_name}; device-to-device copy: {copy_bw / 1e9:.0f} GB/s. Times per "
             "call replayed from a CUDA graph; eager: back-to-back calls, Python and launch "
             "included", "",
             "| type | N x K | M | rp1 | GB/s (of copy) or TFLOP/s | vs fp16 matmul | vs raw layout "
             "| dequant+matmul | rp1, one block a K step | rp1, bf16 x | fused tile past FUSED_MAX_M "
             "| rp1 eager | fp16 eager |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        perf = (f"{r['GB/s']:.0f} GB/s ({100 * r['copy_fraction']:.0f}%)" if "GB/s" in r
                else f"{r['TFLOP/s']:.1f} TFLOP/s")
        raw = f"{r['vs_raw']:.2f}x" if r["vs_raw"] else "-"
        one_block = (f"{r['seconds']['one-block steps'] * 1e6:.1f} us"
                     if "one-block steps" in r["seconds"] else "-")
        bf16 = f"{r['seconds']['rp1 bf16 x'] * 1e6:.1f} us" if "rp1 bf16 x" in r["seconds"] else "-"
        fused = (f"{r['seconds']['fused past the cap'] * 1e6:.1f} us"
                 if "fused past the cap" in r["seconds"] else "-")
        lines.append(f"| {r['type']} | {r['N']} x {r['K']} | {r['M']} | "
                     f"{r['seconds']['rp1'] * 1e6:.1f} us | {perf} | {r['vs_fp16']:.2f}x | {raw} | "
                     f"{r['seconds']['dequant+matmul'] * 1e6:.1f} us | {one_block} | {bf16} | {fused} | "
                     f"{r['seconds']['rp1 eager'] * 1e6:.1f} us | "
                     f"{r['seconds']['fp16 eager'] * 1e6:.1f} us |")
    broken = [r for r in rows if r.get("rp1_kernels_us")]
    if broken:
        lines += ["", "What one rp1 product launches, device microseconds per call (torch's profiler, "
                  "eager calls; the graph replay's time per call is the table's rp1):", ""]
        lines += [f"- {r['type']} M={r['M']}: " + (
            ", ".join(f"{name} {us}" for name, us in r["rp1_kernels_us"].items())
            if isinstance(r["rp1_kernels_us"], dict) else r["rp1_kernels_us"]) for r in broken]
    return "\n".join(lines)


def main(args: argparse.Namespace) -> None:
    rng = np.random.default_rng(0)
    if args.smoke:
        device, runs = torch.device("cpu"), 1
        plan = [(t, 64, 2 * TYPES_BY_NAME[t].block_size, [1, 16, 128])
                for t in (args.types.split(",") if args.types else sorted(kernels.FORMATS))]
        copy_bytes, device_name = 1 << 20, "CPU (Triton interpreter, smoke test)"
    else:
        if not torch.cuda.is_available():
            raise SystemExit("error: no CUDA device (use --smoke to check the script on CPU)")
        device, runs = torch.device("cuda"), args.runs
        types = args.types.split(",") if args.types else sorted(kernels.FORMATS)
        plan = [(t, n, k, BATCHES) for t in types
                for (n, k) in (SHAPES if t in FULL_TYPES else SHAPES[:1])]
        if args.short:
            plan = [(t, *SHAPES[0], BATCHES) for t in types]
        copy_bytes, device_name = 1 << 30, torch.cuda.get_device_name(device)
    timer = Timer(device, runs, calls=2 if args.smoke else 24)  # (smoke: the eager calls interpreted)
    copy_bw = copy_bandwidth(device, timer, copy_bytes)
    rows, expert_rows = [], []
    args.out.mkdir(parents=True, exist_ok=True)

    def write() -> str:
        (args.out / "bench_gpu.json").write_text(json.dumps(
            {"device": device_name, "copy_GB/s": copy_bw / 1e9, "rows": rows, "expert_rows": expert_rows},
            indent=1))
        table = markdown(rows, copy_bw, device_name) + (experts_markdown(expert_rows) if expert_rows else "")
        (args.out / "bench_gpu.md").write_text(table + "\n")
        return table

    # the expert products first (one weight a type, #31's MoE measure), then the dense sweep
    for name in dict.fromkeys(t for t, *_ in plan):
        if name in FULL_TYPES or args.smoke:
            expert_rows += bench_experts(name, device, timer, copy_bw, rng, args.smoke)
            table = write()
    for name, n, k, batches in plan:
        rows += bench_weight(name, n, k, batches, device, timer, copy_bw, rng)
        table = write()
    print(table)


if __name__ == "__main__":
    main(ARGS)
