"""Kernel family: GEMV for small M (M <= configs.GEMV_MAX_M), split-K over block columns,
float32 accumulation, no tensor cores (at small M the weight read is the whole cost).

`prepare_x_kernel` makes x float32 with its sums of 16 (for the sub-blocks' mins), once per
call; then `gemv_dot_kernel` runs the type's `dot` function (formats_*.py) on each block
column: each tensor is 1-D over the tile's rows, so a thread owns BN / (32 * num_warps)
whole rows and every x value it loads serves all of them. The dot function multiplies one
block column by x straight from the packed fields, with the block's scales applied once per
sub-block, not per weight. A program takes one row of x (grid axis 2): at M up to 8 a weight
tile is unpacked once per row of x, and read again from L2. What this buys is measured from
the SASS: `scripts/inspect_kernels.py --sass`.

With SPLIT_K > 1 the partial sums are added atomically into a float32 output.
"""

import triton
import triton.language as tl


@triton.jit
def prepare_x_kernel(X, XF, XS, K, stride_xm, BK: tl.constexpr):
    """The dot GEMV's x: row program_id(0) of X as float32 into XF [M, K], and the sum of
    every 16 of its values into XS [M, K // 16] (K is a multiple of 32). Done once here, not
    by every thread of the GEMV for its own rows: there each conversion and each sum of x
    cost as much issue as a weight's FFMA (llama.cpp's quantize_q8_1 is the same idea)."""
    m = tl.program_id(0)
    cols = tl.program_id(1) * BK + tl.arange(0, BK)
    live = cols < K
    x = tl.load(X + m * stride_xm + cols, mask=live, other=0.0).to(tl.float32)
    tl.store(XF + m * K + cols, x, mask=live)
    sums = tl.sum(tl.reshape(x, (BK // 16, 16)), axis=1)
    groups = tl.program_id(1) * (BK // 16) + tl.arange(0, BK // 16)
    tl.store(XS + m * (K // 16) + groups, sums, mask=groups < K // 16)


@triton.jit
def gemv_dot_kernel(P0, P1, P2, P3, P4, TABLE, XF, XS, OUT, N, B, stride_om,
                    BLOCK: tl.constexpr, BN: tl.constexpr, SPLIT_K: tl.constexpr,
                    PARTS: tl.constexpr, DOT: tl.constexpr):
    # XF, XS: prepare_x_kernel's float32 x and its sums of 16, rows of B * BLOCK and
    # B * BLOCK // 16
    XF += tl.program_id(2) * B * BLOCK
    XS += tl.program_id(2) * B * (BLOCK // 16)
    OUT += tl.program_id(2) * stride_om
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    mask = rows < N
    acc = tl.zeros((BN,), dtype=tl.float32)
    i = tl.program_id(1)  # over (block column, part) pairs
    while i < B * PARTS:
        j = i // PARTS
        acc += DOT(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, XF + j * BLOCK,
                   XS + j * (BLOCK // 16), i % PARTS, PARTS)
        i += SPLIT_K
    if SPLIT_K == 1:
        tl.store(OUT + rows, acc.to(OUT.dtype.element_ty), mask=mask)
    else:
        tl.atomic_add(OUT + rows, acc, mask=mask)
