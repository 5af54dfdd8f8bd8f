"""Kernel family: products of routed tokens with an expert stack, one launch for all experts
(the manner of vLLM's fused_moe). The stack's planes are [E, B, N, count]; the (token, slot)
pairs are sorted by expert and each expert's run padded to the tile's BM rows, on the device
(dispatch._sorted_by_expert), so every BM-row tile belongs to one expert: the program reads that
expert's planes at its offset, gathers its rows of x, dequantizes each weight tile once for
the BM rows, and scatters its results to the pairs' output rows. Experts no token chose have
no tile: their weights are never read.

At decode most experts get a token or two, and a BM-row tile would be mostly padding, its
dequantization's issue the bound (0.29-1.0 of the bandwidth by type, where the GEMV reaches
0.76-1.0: BENCHMARKS.md): there each (token, slot) pair is a program of the GEMV (gemv.py's
body, the type's dot function) on its expert's planes, `moe_gemv_kernel`. dispatch.py chooses
by the rows an expert gets (dispatch.expert_path).
"""

import triton
import triton.language as tl

from .fields import tile_columns
from .gemm import tile_product, tile_result
from .gemv import gemv_dot_row


@triton.jit
def moe_gemv_kernel(P0, P1, P2, P3, P4, TABLE, S0, S1, S2, S3, S4, XF, XS, PAIR_EXPERT, PAIR_X,
                    OUT, N, B, stride_om, BLOCK: tl.constexpr, BN: tl.constexpr,
                    SPLIT_K: tl.constexpr, PARTS: tl.constexpr, DOT: tl.constexpr,
                    XSTRIDE: tl.constexpr):
    # program (., ., pair): the pair's row of the prepared x (gemv.py) times its expert
    pair = tl.program_id(2)
    e = tl.load(PAIR_EXPERT + pair).to(tl.int64)
    if e >= 0:  # -1: another rank's expert, its output row stays zero
        x = tl.load(PAIR_X + pair).to(tl.int64)
        gemv_dot_row(P0 + e * S0, P1 + e * S1, P2 + e * S2, P3 + e * S3, P4 + e * S4, TABLE,
                     XF + x * B * XSTRIDE, XS + x * B * (BLOCK // 16), OUT + pair * stride_om,
                     N, B, BLOCK, BN, SPLIT_K, PARTS, DOT, XSTRIDE)


@triton.jit
def moe_gemm_kernel(P0, P1, P2, P3, P4, TABLE, S0, S1, S2, S3, S4, X, X_ROWS, OUT_ROWS,
                    TILE_EXPERT, OUT, N, B, stride_xm, stride_om,
                    BLOCK: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                    IEEE: tl.constexpr, DQ: tl.constexpr, XRUN: tl.constexpr = 0,
                    SWAP: tl.constexpr = False):
    # S0..S4: each plane's elements per expert (in the launch tensor's element type, before
    # the dequant function casts the pointer); X_ROWS / OUT_ROWS: each sorted slot's row of x
    # and of the output, -1 for padding; TILE_EXPERT: each BM-row tile's expert
    e = tl.load(TILE_EXPERT + tl.program_id(0)).to(tl.int64)
    if e < 0:  # past the last expert's tiles: the grid is sized from the shapes alone
        return
    slots = tl.program_id(0) * BM + tl.arange(0, BM)
    x_rows = tl.load(X_ROWS + slots)
    out_rows = tl.load(OUT_ROWS + slots)
    live = x_rows >= 0
    rows = tl.program_id(1) * BN + tl.arange(0, BN)
    mask = rows < N
    cols = tile_columns(BLOCK, XRUN)  # x's columns in the order of DQ's (registry.py)
    p0, p1, p2, p3, p4 = P0 + e * S0, P1 + e * S1, P2 + e * S2, P3 + e * S3, P4 + e * S4
    if SWAP:  # the weight tile as the MMA's A operand (gemm.py, configs.swap_ab)
        acc = tl.zeros((BN, BM), dtype=tl.float32)
    else:
        acc = tl.zeros((BM, BN), dtype=tl.float32)
    for j in range(0, B):
        w = DQ(p0, p1, p2, p3, p4, TABLE, j, rows, mask, N)  # [BN, BLOCK]
        x = tl.load(X + x_rows[:, None].to(tl.int64) * stride_xm + j * BLOCK + cols[None, :],
                    mask=live[:, None], other=0.0)
        acc = tile_product(acc, x, w, IEEE, SWAP)
    out = OUT + out_rows[:, None].to(tl.int64) * stride_om + rows[None, :]
    tl.store(out, tile_result(acc, SWAP).to(OUT.dtype.element_ty), mask=live[:, None] & mask[None, :])
