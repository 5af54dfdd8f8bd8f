#!/usr/bin/env python3
"""The dispatcher's own host time a product, without a GPU: gguf_repack_kernels.matmul and
expert_matmul with every Triton launch replaced by a no-op, on CPU tensors (a 4096 x 4096
weight; experts of 64 rows, so that the torch ops' own work on the CPU stays small). What an eager caller
(transformers' generate, prefill outside graphs) pays in Python beside Triton's launcher and
the driver, once a product; a CUDA graph pays none of it.

    python scripts/bench_host.py [--types Q4_K,Q8_0] [--calls 3000]

Microseconds a call, the median of 5 rounds of --calls calls, on this machine's CPU (a ratio
to compare commits on one machine, not a GPU host's time)."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from ggml_blocks import random_blocks  # noqa: E402

import gguf_repack_kernels as kernels  # noqa: E402
from gguf_repack.format.layout import pack  # noqa: E402
from gguf_repack.format.type_table import TYPES_BY_NAME  # noqa: E402

KERNELS = ("gemv_dot_kernel", "prepare_x_kernel", "prepare_x_q8_kernel", "gemm_kernel", "dequantize_kernel",
           "moe_gemv_kernel", "moe_gemv_rows_kernel", "moe_gemm_kernel", "sort_by_expert_kernel")


class _NoLaunch:
    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def stub_launches() -> None:
    """Every kernel of the dispatcher a no-op, on an H200's record (132 SMs: K split as there)."""
    if not hasattr(kernels.dispatch, "_assert_ids"):  # an older commit's dispatcher
        kernels.dispatch._assert_ids = lambda ok, n_experts: None
    for name in KERNELS:
        if hasattr(kernels.dispatch, name):
            setattr(kernels.dispatch, name, _NoLaunch())
    kernels.dispatch._device = lambda device: kernels.configs.KNOWN_DEVICES[90]
    # the ids' verdict is never written without the kernel: assert on a true one, the same call
    real_assert, true = kernels.dispatch._assert_ids, torch.ones(1, dtype=torch.int32)
    kernels.dispatch._assert_ids = lambda ok, n_experts: real_assert(true, n_experts)



def time_call(fn, calls: int) -> float:
    for _ in range(min(calls, 200)):
        fn()
    rounds = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        rounds.append((time.perf_counter() - t) / calls)
    return statistics.median(rounds) * 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default="Q4_K,Q8_0")
    ap.add_argument("--calls", type=int, default=3000)
    args = ap.parse_args(argv)
    stub_launches()
    rng = np.random.default_rng(0)
    print("| type | product | us a call |")
    print("| --- | --- | --- |")
    for name in args.types.split(","):
        qtype = TYPES_BY_NAME[name]
        planes, stack = ({f: torch.from_numpy(v) for f, v in pack(random_blocks(qtype.id, shape, rng),
                                                                     qtype).items()}
                         for shape in ((4096, 4096), (8, 64, 4096)))
        for m in (1, 16):
            x = torch.randn(m, 4096).half()
            us = time_call(lambda: kernels.matmul(x, planes, name, (4096, 4096)), args.calls)
            print(f"| {name} | matmul, M = {m} ({kernels.dispatch.matmul_path(name, m)}) | {us:.1f} |")
        for tokens in (1, 256):  # one token's experts: the GEMV a pair; then the tiles
            x = torch.randn(tokens, 4096).half()
            ids = torch.randint(0, 8, (tokens, 2), dtype=torch.int32)
            path = kernels.dispatch.expert_path(name, tokens, 2, 8)
            us = time_call(lambda: kernels.expert_matmul(x, ids, stack, name, (8, 64, 4096)), args.calls)
            print(f"| {name} | expert_matmul, {tokens} tokens x 2 of 8 experts ({path}) | {us:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
