"""Kernel family: GEMV for small M, split-K over block columns, float32 accumulation.

Each program dequantizes a tile of BN rows one block column at a time and multiplies it
with the M_PAD rows of x in registers (no tensor cores: at small M the weight read is the
whole cost). With SPLIT_K > 1 the partial sums are added atomically into a float32 output.
"""

import triton
import triton.language as tl


# The batch size only masks rows: one compiled variant serves every value of it.
@triton.jit(do_not_specialize=["M"])
def gemv_kernel(P0, P1, P2, P3, P4, TABLE, X, OUT, M, N, B, stride_xm, stride_om,
                BLOCK: tl.constexpr, BN: tl.constexpr, M_PAD: tl.constexpr,
                SPLIT_K: tl.constexpr, DQ: tl.constexpr):
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    mask = rows < N
    ms = tl.arange(0, M_PAD)
    cols = tl.arange(0, BLOCK)
    acc = tl.zeros((M_PAD, BN), dtype=tl.float32)
    for j in range(tl.program_id(1), B, SPLIT_K):
        w = DQ(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N)  # [BN, BLOCK]
        if M_PAD == 1:
            # Decode's case: a 2-D product keeps the weight tile in the layout its loads
            # gave it (the 3-D broadcast below makes threads reload the quants).
            x = tl.load(X + j * BLOCK + cols).to(tl.float32)
            acc += tl.sum(w * x[None, :], axis=1)[None, :]
        else:
            x = tl.load(X + ms[:, None] * stride_xm + j * BLOCK + cols[None, :],
                        mask=(ms < M)[:, None], other=0.0).to(tl.float32)  # [M_PAD, BLOCK]
            acc += tl.sum(x[:, None, :] * w[None, :, :], axis=2)
    out = OUT + ms[:, None] * stride_om + rows[None, :]
    out_mask = (ms < M)[:, None] & mask[None, :]
    if SPLIT_K == 1:
        tl.store(out, acc.to(OUT.dtype.element_ty), mask=out_mask)
    else:
        tl.atomic_add(out, acc, mask=out_mask)
