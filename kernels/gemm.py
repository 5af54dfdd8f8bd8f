"""Kernel family: GEMM for larger M, BM x BN tiles, tl.dot on dequantized weight tiles,
float32 accumulation. fp16/bf16 activations use the tensor cores in their dtype; float32
ones are multiplied in full float32 (IEEE), as the torch backend does.

With SPLIT_K > 1, program (., ., s) takes block columns s, s + SPLIT_K, ... and adds its
partial sums atomically into a float32 output: at small M there are too few tiles to give
every SM two programs, and only two or more programs on an SM let one's MMA run while
another dequantizes (configs.gemm_config)."""

import triton
import triton.language as tl

from .fields import tile_columns


# The batch size only masks rows: one compiled variant serves every value of it.
@triton.jit(do_not_specialize=["M"])
def gemm_kernel(P0, P1, P2, P3, P4, TABLE, X, OUT, M, N, B, stride_xm, stride_om,
                BLOCK: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                IEEE: tl.constexpr, DQ: tl.constexpr, SPLIT_K: tl.constexpr,
                XRUN: tl.constexpr = 0):
    ms = tl.program_id(0) * BM + tl.arange(0, BM)
    rows = tl.program_id(1) * BN + tl.arange(0, BN)
    mask = rows < N
    cols = tile_columns(BLOCK, XRUN)  # x's columns in the order of DQ's (registry.py)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    # a for loop from 0 (Triton pipelines it; Triton 3.6's interpreter cannot start a range
    # at a program id); SPLIT_K divides B (configs.gemm_config)
    for i in range(0, B // SPLIT_K):
        j = tl.program_id(2) + i * SPLIT_K
        w = DQ(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N)  # [BN, BLOCK] float32
        x = tl.load(X + ms[:, None].to(tl.int64) * stride_xm + j * BLOCK + cols[None, :],
                    mask=(ms < M)[:, None], other=0.0)
        if IEEE:
            acc = tl.dot(x.to(tl.float32), tl.trans(w), acc, input_precision="ieee")
        else:
            acc = tl.dot(x, tl.trans(w).to(x.dtype), acc)
    out = OUT + ms[:, None].to(tl.int64) * stride_om + rows[None, :]
    out_mask = (ms < M)[:, None] & mask[None, :]
    if SPLIT_K == 1:
        tl.store(out, acc.to(OUT.dtype.element_ty), mask=out_mask)
    else:
        tl.atomic_add(out, acc, mask=out_mask)
