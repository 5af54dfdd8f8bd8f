"""Kernel family: GEMV for small M (where dispatch.matmul_path takes it:
configs.matmul_choice), split-K over block columns, float32 accumulation, no tensor cores
(at small M the weight read is the whole cost).

`prepare_x_kernel` makes x float32 with its sums of 16 (for the sub-blocks' mins), once per
call; then `gemv_dot_kernel` runs the type's `dot` function (formats_*.py) on each block
column: each tensor is 1-D over the tile's rows, so a thread owns BN / (32 * num_warps)
whole rows and every x value it loads serves all of them. The dot function multiplies one
block column by x straight from the packed fields, with the block's scales applied once per
sub-block, not per weight. A program takes XR rows of x (grid axis 2; configs.gemv_x_rows:
1 at M = 1, 2 at M = 2, else 4): the dot function is called for each row on the same block
column, and the compiler loads and unpacks the weights once for all of them (the same
loads and the same pure arithmetic: common subexpressions), so a weight tile is unpacked
once per XR rows of x, and read again from L2 by the next program of rows. What this buys is
measured from the SASS: `scripts/inspect_kernels.py --sass`, `scripts/estimate_paths.py`.

With SPLIT_K > 1 the partial sums are added atomically into a float32 workspace, and the last
program of each tile writes the total in x's dtype (split_k.py): with x's preparation, which
zeroes that workspace, a product is two launches.
"""

import triton
import triton.language as tl

from .split_k import add_partial_sums, zero_share


@triton.jit
def check_expert_ids(IDS, NIDS, E, OK, BK: tl.constexpr):
    """OK[0] = 1 if every one of the NIDS expert ids at IDS is in -1..E-1, else 0: for the
    expert GEMV (moe.py), by program (0, 0) of its x's preparation, so that one assert after
    it (dispatch.py) refuses a bad id without a launch of its own or a host sync."""
    if (tl.program_id(0) == 0) & (tl.program_id(1) == 0):
        bad = 0
        for start in range(0, NIDS, BK):
            at = start + tl.arange(0, BK)
            ids = tl.load(IDS + at, mask=at < NIDS, other=0)
            bad += tl.sum(((ids < -1) | (ids >= E)).to(tl.int32))
        tl.store(OK, (bad == 0).to(tl.int32))


@triton.jit
def prepare_x_kernel(X, XF, XS, K, stride_xm, Z, ZN, IDS, NIDS, E, OK, BK: tl.constexpr,
                     CHECK_IDS: tl.constexpr = False):
    """The dot GEMV's x: row program_id(0) of X as float32 into XF [M, K], and the sum of
    every 16 of its values into XS [M, K // 16] (K is a multiple of 32). Done once here, not
    by every thread of the GEMV for its own rows: there each conversion and each sum of x
    cost as much issue as a weight's FFMA (llama.cpp's quantize_q8_1 is the same idea).
    And the rest of what the GEMV needs before it runs, so that a product is two launches:
    Z[0:ZN] zeroed (the split-K workspace, split_k.py); for the expert GEMV (CHECK_IDS) its
    ids checked (check_expert_ids)."""
    zero_share(Z, ZN, BK)
    if CHECK_IDS:
        check_expert_ids(IDS, NIDS, E, OK, BK)
    m = tl.program_id(0)
    cols = tl.program_id(1) * BK + tl.arange(0, BK)
    live = cols < K
    x = tl.load(X + m * stride_xm + cols, mask=live, other=0.0).to(tl.float32)
    tl.store(XF + m * K + cols, x, mask=live)
    sums = tl.sum(tl.reshape(x, (BK // 16, 16)), axis=1)
    groups = tl.program_id(1) * (BK // 16) + tl.arange(0, BK // 16)
    tl.store(XS + m * (K // 16) + groups, sums, mask=groups < K // 16)


@triton.jit
def round_half_away(v):
    """v rounded to the nearest integer, halves away from zero (C's roundf, gguf-py's
    np_roundf), spelled as gguf-py spells it so that every float rounds the same way."""
    a = tl.abs(v)
    whole = tl.floor(a)
    r = whole + tl.floor(2 * (a - whole))
    return tl.where(v < 0, -r, r)


@triton.jit
def prepare_x_q8_kernel(X, XQ, XS, K, stride_xm, Z, ZN, IDS, NIDS, E, OK, BLOCK: tl.constexpr,
                        XSTRIDE: tl.constexpr, BK: tl.constexpr, CHECK_IDS: tl.constexpr = False):
    """The int8 GEMV's x (fields.py, "GEMV with int8 x"): row program_id(0) of X quantized
    per 32 values exactly as gguf-py's Q8_0 quantizes (d = max|x| / 127, q = roundf(x / d),
    d kept as float16), into XQ [M, K / BLOCK, XSTRIDE] bytes: each block's BLOCK values,
    then its float32 d's; and XS [M, K // 16], the sums of 16 of q * d (exact: 11 bits of
    sum times an 11-bit d) for the sub-blocks' mins. And Z and the ids as prepare_x_kernel."""
    zero_share(Z, ZN, BK)
    if CHECK_IDS:
        check_expert_ids(IDS, NIDS, E, OK, BK)
    m = tl.program_id(0)
    cols = tl.program_id(1) * BK + tl.arange(0, BK)
    live = cols < K
    x = tl.load(X + m * stride_xm + cols, mask=live, other=0.0).to(tl.float32)
    x32 = tl.reshape(x, (BK // 32, 32))
    # divisions rounded as IEEE (and numpy) round them: Triton's `/` is div.full.f32, within
    # 2 ulp, and an ulp can move a value across a rounding half
    d = tl.math.div_rn(tl.max(tl.abs(x32), axis=1), 127.0)
    inv = tl.where(d == 0, 0.0, tl.math.div_rn(1.0, tl.where(d == 0, 1.0, d)))
    q = round_half_away(x32 * inv[:, None])
    d = d.to(tl.float16).to(tl.float32)
    block_at = m * (K // BLOCK) * XSTRIDE + (cols // BLOCK) * XSTRIDE
    tl.store(XQ + block_at + cols % BLOCK, tl.reshape(q, (BK,)).to(tl.int8), mask=live)
    firsts = tl.program_id(1) * BK + tl.arange(0, BK // 32) * 32  # of each 32
    d_at = m * (K // BLOCK) * XSTRIDE + (firsts // BLOCK) * XSTRIDE + BLOCK
    tl.store((XQ + d_at).to(tl.pointer_type(tl.float32)) + (firsts % BLOCK) // 32, d,
             mask=firsts < K)
    sums = tl.sum(tl.reshape(q, (BK // 32, 2, 16)), axis=2) * d[:, None]
    groups = tl.program_id(1) * (BK // 16) + tl.arange(0, BK // 16)
    tl.store(XS + m * (K // 16) + groups, tl.reshape(sums, (BK // 16,)), mask=groups < K // 16)


@triton.jit(do_not_specialize=["M"])
def gemv_dot_kernel(P0, P1, P2, P3, P4, TABLE, XF, XS, OUT, SUMS, COUNTS, N, B, stride_om, M,
                    BLOCK: tl.constexpr, BN: tl.constexpr, SPLIT_K: tl.constexpr,
                    PARTS: tl.constexpr, DOT: tl.constexpr, XSTRIDE: tl.constexpr,
                    STAGES: tl.constexpr = 1, XR: tl.constexpr = 1):
    # XF, XS: the prepared x (prepare_x_kernel's float32 x, XSTRIDE = BLOCK elements a
    # block, or prepare_x_q8_kernel's int8 x and scales, XSTRIDE bytes a block) and the sums
    # of 16 of x, rows of B * XSTRIDE and B * BLOCK // 16; SUMS (float32, OUT's strides) and
    # COUNTS [cdiv(M, XR), tiles] int32, zeroed: the split-K workspace (split_k.py). Program
    # (., ., g) takes rows g XR .. g XR + XR - 1 of x (gemv_dot_rows).
    first = tl.program_id(2) * XR
    gemv_dot_rows(P0, P1, P2, P3, P4, TABLE, XF + first * B * XSTRIDE,
                  XS + first * B * (BLOCK // 16), OUT, SUMS, COUNTS,
                  tl.minimum(XR, M - first), N, B, stride_om, BLOCK, BN, SPLIT_K, PARTS, DOT,
                  XSTRIDE, STAGES, XR)


@triton.jit
def gemv_dot_row(P0, P1, P2, P3, P4, TABLE, XF, XS, OUT, SUMS, COUNTS, N, B, stride_om,
                 BLOCK: tl.constexpr, BN: tl.constexpr, SPLIT_K: tl.constexpr, PARTS: tl.constexpr,
                 DOT: tl.constexpr, XSTRIDE: tl.constexpr, STAGES: tl.constexpr = 1):
    """One row of x (XF, XS at its first block) times BN rows of the weight (P0..P4 at its
    first block column) into row program_id(2) of OUT: gemv_dot_rows at XR = 1, for the
    expert GEMV (moe.py)."""
    gemv_dot_rows(P0, P1, P2, P3, P4, TABLE, XF, XS, OUT, SUMS, COUNTS, 1, N, B, stride_om,
                  BLOCK, BN, SPLIT_K, PARTS, DOT, XSTRIDE, STAGES, 1)


@triton.jit
def row_dot(P0, P1, P2, P3, P4, TABLE, XF, XS, j, rows, mask, N, part, B, xrow,
            BLOCK: tl.constexpr, PARTS: tl.constexpr, DOT: tl.constexpr, XSTRIDE: tl.constexpr):
    """DOT of block column j for row `xrow` of the program's rows of x (XF, XS at the first)."""
    return DOT(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, XF + (xrow * B + j) * XSTRIDE,
               XS + (xrow * B + j) * (BLOCK // 16), part, PARTS)


@triton.jit
def rows_dot(acc0, acc1, acc2, acc3, P0, P1, P2, P3, P4, TABLE, XF, XS, i, rows, mask, N, B,
             x0, x1, x2, x3, BLOCK: tl.constexpr, PARTS: tl.constexpr, DOT: tl.constexpr,
             XSTRIDE: tl.constexpr, XR: tl.constexpr):
    """The accumulators of XR (2 or 4) rows of x plus their DOT of (block column, part) pair i:
    x rows x0..x3 (from XF, XS; x2 and x3 read only at XR = 4)."""
    j = i // PARTS
    acc0 += row_dot(P0, P1, P2, P3, P4, TABLE, XF, XS, j, rows, mask, N, i % PARTS, B, x0,
                    BLOCK, PARTS, DOT, XSTRIDE)
    acc1 += row_dot(P0, P1, P2, P3, P4, TABLE, XF, XS, j, rows, mask, N, i % PARTS, B, x1,
                    BLOCK, PARTS, DOT, XSTRIDE)
    if XR > 2:
        acc2 += row_dot(P0, P1, P2, P3, P4, TABLE, XF, XS, j, rows, mask, N, i % PARTS, B, x2,
                        BLOCK, PARTS, DOT, XSTRIDE)
        acc3 += row_dot(P0, P1, P2, P3, P4, TABLE, XF, XS, j, rows, mask, N, i % PARTS, B, x3,
                        BLOCK, PARTS, DOT, XSTRIDE)
    return acc0, acc1, acc2, acc3


@triton.jit
def gemv_dot_rows(P0, P1, P2, P3, P4, TABLE, XF, XS, OUT, SUMS, COUNTS, live_rows, N, B,
                  stride_om, BLOCK: tl.constexpr, BN: tl.constexpr, SPLIT_K: tl.constexpr,
                  PARTS: tl.constexpr, DOT: tl.constexpr, XSTRIDE: tl.constexpr,
                  STAGES: tl.constexpr = 1, XR: tl.constexpr = 1, X_ROWS=None, OUT_ROWS=None):
    """XR rows of x (1, 2 or 4) times BN rows of the weight (P0..P4 at its first block column)
    into XR rows of OUT (with SPLIT_K > 1 through SUMS and COUNTS, the split-K workspace:
    split_k.py): the GEMV's body, shared with the expert GEMVs (moe.py). The rows: consecutive
    from XF, XS into rows program_id(2) XR.. of OUT, the first `live_rows` of them real, the
    rest reading the last real one again and not stored; or, given X_ROWS and OUT_ROWS (XR >
    1: the expert sort's slots, moe.py), x's rows X_ROWS[0..XR) into OUT's rows
    OUT_ROWS[0..XR), a slot of -1 reading the first one's x and not stored. Each x row is DOT
    called again on the same block column: its weight loads and its unpacking are the same
    values, computed once by the compiler (common subexpressions), so a row more costs its
    x's loads and multiply-adds, not the weights' unpacking again.
    The output rows' addresses are made after the K loop, as the split-K counter's is:
    values made before it live across the loop, where ptxas may park them in local memory.
    STAGES > 1 (a tuner's candidate, configs.GEMV_CANDIDATES): the K loop under Triton's
    software pipeliner, STAGES - 1 iterations' planes loaded ahead (into
    shared memory, by asynchronous copies), for more bytes in flight a program."""
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    mask = rows < N
    if XR == 1:  # the one-row GEMV's code as it was before programs took rows of x
        gemv_dot_one_row(P0, P1, P2, P3, P4, TABLE, XF, XS, OUT, SUMS, COUNTS, rows, mask, N, B,
                         stride_om, BLOCK, SPLIT_K, PARTS, DOT, XSTRIDE, STAGES)
        return
    if X_ROWS is None:  # x's rows as offsets from the first: past the live ones, the last
        last = live_rows - 1
        x0, x1, x2, x3 = 0, tl.minimum(1, last), tl.minimum(2, last), tl.minimum(3, last)
    else:  # the slots' rows; a slot's first is a pair's, padding (-1) reads it again (int32,
        # as the dense GEMV's offsets: int64 cost Q6_K's 4-row loop 5% more instructions)
        x0 = tl.load(X_ROWS)
        x1 = slot_row(X_ROWS, 1, x0)
        x2 = slot_row(X_ROWS, 2 % XR, x0)
        x3 = slot_row(X_ROWS, 3 % XR, x0)
    acc0 = tl.zeros((BN,), dtype=tl.float32)
    acc1 = tl.zeros((BN,), dtype=tl.float32)
    acc2 = tl.zeros((BN,), dtype=tl.float32)
    acc3 = tl.zeros((BN,), dtype=tl.float32)
    if STAGES == 1:
        i = tl.program_id(1)  # over (block column, part) pairs
        while i < B * PARTS:
            acc0, acc1, acc2, acc3 = rows_dot(acc0, acc1, acc2, acc3, P0, P1, P2, P3, P4, TABLE, XF, XS,
                                              i, rows, mask, N, B, x0, x1, x2, x3, BLOCK, PARTS, DOT,
                                              XSTRIDE, XR)
            i += SPLIT_K
    else:  # the same pairs, as a counted loop from 0 (what the pipeliner takes)
        iterations = (B * PARTS - tl.program_id(1) + SPLIT_K - 1) // SPLIT_K
        for it in tl.range(0, iterations, num_stages=STAGES):
            acc0, acc1, acc2, acc3 = rows_dot(acc0, acc1, acc2, acc3, P0, P1, P2, P3, P4, TABLE, XF, XS,
                                              tl.program_id(1) + it * SPLIT_K, rows, mask, N, B,
                                              x0, x1, x2, x3, BLOCK, PARTS, DOT, XSTRIDE, XR)
    r = tl.arange(0, XR)[:, None]
    acc = tl.where(r == 0, acc0[None, :], acc1[None, :])
    if XR > 2:
        acc = tl.where(r == 2, acc2[None, :], tl.where(r == 3, acc3[None, :], acc))
    if OUT_ROWS is None:
        out_row = (tl.program_id(2) * XR + r).to(tl.int64)
        live = (r < live_rows) & mask[None, :]
    else:
        out_row = tl.load(OUT_ROWS + r).to(tl.int64)
        live = (out_row >= 0) & mask[None, :]
    at = out_row * stride_om + rows[None, :]
    if SPLIT_K == 1:
        tl.store(OUT + at, acc.to(OUT.dtype.element_ty), mask=live)
    else:
        add_partial_sums(acc, SUMS, OUT, at, live, COUNTS, 1, SPLIT_K)


@triton.jit
def slot_row(X_ROWS, slot, first):
    """The row of x of an expert slot (the sort's X_ROWS), or `first` where it is padding."""
    row = tl.load(X_ROWS + slot)
    return tl.where(row >= 0, row, first)


@triton.jit
def gemv_dot_one_row(P0, P1, P2, P3, P4, TABLE, XF, XS, OUT, SUMS, COUNTS, rows, mask, N, B,
                     stride_om, BLOCK: tl.constexpr, SPLIT_K: tl.constexpr,
                     PARTS: tl.constexpr, DOT: tl.constexpr, XSTRIDE: tl.constexpr,
                     STAGES: tl.constexpr):
    """gemv_dot_rows at XR = 1: one accumulator, row program_id(2) stored."""
    acc = tl.zeros(rows.shape, dtype=tl.float32)
    if STAGES == 1:
        i = tl.program_id(1)  # over (block column, part) pairs
        while i < B * PARTS:
            j = i // PARTS
            acc += DOT(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, XF + j * XSTRIDE,
                       XS + j * (BLOCK // 16), i % PARTS, PARTS)
            i += SPLIT_K
    else:  # the same pairs, as a counted loop from 0 (what the pipeliner takes)
        iterations = (B * PARTS - tl.program_id(1) + SPLIT_K - 1) // SPLIT_K
        for it in tl.range(0, iterations, num_stages=STAGES):
            i = tl.program_id(1) + it * SPLIT_K
            j = i // PARTS
            acc += DOT(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, XF + j * XSTRIDE,
                       XS + j * (BLOCK // 16), i % PARTS, PARTS)
    at = tl.program_id(2).to(tl.int64) * stride_om + rows
    if SPLIT_K == 1:
        tl.store(OUT + at, acc.to(OUT.dtype.element_ty), mask=mask)
    else:
        add_partial_sums(acc, SUMS, OUT, at, mask, COUNTS, 1, SPLIT_K)
