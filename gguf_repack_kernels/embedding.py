"""Kernel family: embedding, the rows of a weight picked by id and dequantized."""

import triton
import triton.language as tl


# The number of ids only masks rows: one compiled variant serves every value of it.
@triton.jit(do_not_specialize=["n_ids"])
def gather_rows_kernel(P0, P1, P2, P3, P4, TABLE, IDS, OUT, N, B, n_ids,
                       BLOCK: tl.constexpr, BI: tl.constexpr, DQ: tl.constexpr):
    """One program per tile of ids x block column: dequant functions take any row indices."""
    i = tl.program_id(0) * BI + tl.arange(0, BI)
    j = tl.program_id(1)
    mask = i < n_ids
    rows = tl.load(IDS + i, mask=mask, other=0).to(tl.int32)
    w = DQ(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N)
    cols = j * BLOCK + tl.arange(0, BLOCK)
    out = OUT + i[:, None].to(tl.int64) * (B * BLOCK) + cols[None, :]
    tl.store(out, w.to(OUT.dtype.element_ty), mask=mask[:, None])
