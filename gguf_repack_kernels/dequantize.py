"""Kernel family: dequantize a whole weight (one program per tile of rows x block column)."""

import triton
import triton.language as tl


@triton.jit
def dequantize_kernel(P0, P1, P2, P3, P4, TABLE, OUT, N, B,
                      BLOCK: tl.constexpr, BN: tl.constexpr, DQ: tl.constexpr):
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    j = tl.program_id(1)
    mask = rows < N
    w = DQ(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N)
    cols = j * BLOCK + tl.arange(0, BLOCK)
    out = OUT + rows[:, None].to(tl.int64) * (B * BLOCK) + cols[None, :]
    tl.store(out, w.to(OUT.dtype.element_ty), mask=mask[:, None])
