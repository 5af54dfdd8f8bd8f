"""Kernel family: products of routed tokens with an expert stack, one launch for all experts
(the manner of vLLM's fused_moe). The stack's planes are [E, B, N, count]; the (token, slot)
pairs are sorted by expert and each expert's run padded to the tile's BM rows, on the device
(sort_by_expert_kernel), so every BM-row tile belongs to one expert: the program reads that
expert's planes at its offset, gathers its rows of x, dequantizes each weight tile once for
the BM rows, and scatters its results to the pairs' output rows. Experts no token chose have
no tile: their weights are never read.

At decode with few tokens the experts chosen get a row each, and a BM-row tile would be
mostly padding, its dequantization's issue the bound: there each (token, slot) pair is a
program of the GEMV (gemv.py's body, the type's dot function) on its expert's planes,
`moe_gemv_kernel`. Each pair's GEMV reads its expert's weights again, so from a row or two an
expert, the same sort into tiles of 2 or 4 slots makes each tile a GEMV program on its
expert's rows (`moe_gemv_rows_kernel`: the dense GEMV's rows of x a program), and past a few
rows the tensor-core tiles read less; dispatch.py chooses by the rows an expert gets on
average (dispatch.expert_path, configs.MOE_RULE: the estimate's rule).
"""

import triton
import triton.language as tl

from .fields import tile_columns
from .gemm import block_product, dequant_tile, tile_result
from .gemv import gemv_dot_row, gemv_dot_rows
from .split_k import add_partial_sums


@triton.jit
def moe_gemv_kernel(P0, P1, P2, P3, P4, TABLE, S0, S1, S2, S3, S4, XF, XS, IDS, XDIV, E, OUT, SUMS,
                    COUNTS, N, B, stride_om, BLOCK: tl.constexpr, BN: tl.constexpr,
                    SPLIT_K: tl.constexpr, PARTS: tl.constexpr, DOT: tl.constexpr,
                    XSTRIDE: tl.constexpr):
    # program (., ., pair): the pair's row of the prepared x (gemv.py), pair // XDIV (XDIV:
    # the slots a token has where x is one a token, else 1), times its expert IDS[pair], the
    # routing's own ids (int32 or int64, as given); SUMS (float32, OUT's strides) and COUNTS
    # [pairs, tiles], zeroed: the split-K workspace (split_k.py)
    pair = tl.program_id(2)
    e = tl.load(IDS + pair).to(tl.int64)
    # -1: another rank's expert; out of -1..E-1: refused by the check before this launch
    # (dispatch.py). Neither reads a weight; the row is written, as zeros: every row of the
    # output comes from this launch, none from a zeroing before it
    live = (e >= 0) & (e < E)
    blocks = tl.where(live, B, 0)
    e = tl.where(live, e, 0)
    x = (pair // XDIV).to(tl.int64)
    gemv_dot_row(P0 + e * S0, P1 + e * S1, P2 + e * S2, P3 + e * S3, P4 + e * S4, TABLE,
                 XF + x * B * XSTRIDE, XS + x * B * (BLOCK // 16), OUT, SUMS, COUNTS, N, blocks,
                 stride_om, BLOCK, BN, SPLIT_K, PARTS, DOT, XSTRIDE)


@triton.jit
def moe_gemv_rows_kernel(P0, P1, P2, P3, P4, TABLE, S0, S1, S2, S3, S4, XF, XS, X_ROWS, OUT_ROWS,
                         TILE_EXPERT, E, OUT, SUMS, COUNTS, N, B, stride_om, BLOCK: tl.constexpr,
                         BN: tl.constexpr, SPLIT_K: tl.constexpr, PARTS: tl.constexpr,
                         DOT: tl.constexpr, XSTRIDE: tl.constexpr, XR: tl.constexpr):
    # program (., ., tile): the expert sort's tile of XR slots (sort_by_expert_kernel at BM =
    # XR), its rows of the prepared x (gemv.py) times its expert TILE_EXPERT[tile], the GEMV
    # taking XR rows of x a program (gemv.gemv_dot_rows): an expert's weights read once for
    # every XR of its rows, not once a row. A tile past the last (-1) has nothing to do; the
    # tiles of expert E ("none": another rank's experts) read no weight and write zeros.
    # SUMS (float32, OUT's strides) and COUNTS [tiles, N tiles], zeroed: split K's workspace
    tile = tl.program_id(2)
    e = tl.load(TILE_EXPERT + tile).to(tl.int64)
    if e >= 0:
        live = e < E
        blocks = tl.where(live, B, 0)
        e = tl.where(live, e, 0)
        gemv_dot_rows(P0 + e * S0, P1 + e * S1, P2 + e * S2, P3 + e * S3, P4 + e * S4, TABLE,
                      XF, XS, OUT, SUMS, COUNTS, XR, N, blocks, stride_om, BLOCK, BN, SPLIT_K,
                      PARTS, DOT, XSTRIDE, 1, XR, X_ROWS + tile * XR, OUT_ROWS + tile * XR)


@triton.jit
def sort_by_expert_kernel(IDS, P, E, XDIV, CURSOR, OK, X_ROWS, OUT_ROWS, TILE_EXPERT, MAX_TILES,
                          BM: tl.constexpr, E_PAD: tl.constexpr, BK: tl.constexpr):
    """The routed (token, slot) pairs sorted by expert for the tiles (moe_gemm_kernel), in one
    program: vLLM's moe_align_block_size, for these tiles. IDS: the P = T * k ids as the
    router gave them, -1 another rank's expert; E experts, E_PAD a power of two above E + 1.
    Writes, for MAX_TILES tiles of BM slots: each slot's row of x (pair // XDIV) and of the
    output (the pair), -1 for padding, in X_ROWS and OUT_ROWS; each tile's expert, -1 past the
    last tile, in TILE_EXPERT; OK[0] = 1 if every id is in -1..E-1, else 0 (an assert on it
    follows: dispatch.py). CURSOR: E_PAD int32 of scratch.

    Each expert's pairs get ceil(count / BM) whole tiles, in expert order (an expert no pair
    chose gets none), its pairs the first slots of them; the pairs of another rank's experts
    (and bad ids) get the tiles of expert E, "none", whose rows the tile kernel writes as
    zeros without reading a weight: every row of the output comes from the tiles' launch,
    none from a zeroing before it. A pair takes its slot by an atomic increment of its
    expert's cursor, so the order of the pairs within an expert's tiles is the atomics'
    (which changes no product: the tile's rows are independent). Sized from the shapes alone
    (MAX_TILES = P // BM + min(E + 1, P): dispatch.py), as a CUDA graph needs."""
    experts = tl.arange(0, E_PAD)
    # 1. each expert's pairs: another rank's (-1) and bad ids count as E ("none"), the loads
    # past the last pair as E + 1, which gets no tile
    counts = tl.zeros((E_PAD,), dtype=tl.int32)
    bad = 0
    for start in range(0, P, BK):
        at = start + tl.arange(0, BK)
        e = tl.load(IDS + at, mask=at < P, other=-1)  # (int64 ids checked before narrowing)
        bad += tl.sum(((e < -1) | (e >= E)).to(tl.int32))
        key = tl.where((e >= 0) & (e < E), e, E)
        key = tl.where(at < P, key, E + 1).to(tl.int32)
        counts += tl.histogram(key, E_PAD).to(tl.int32)
    tl.store(OK, (bad == 0).to(tl.int32))
    tiles = tl.where(experts <= E, (counts + BM - 1) // BM, 0)
    tiles_end = tl.cumsum(tiles, 0)
    tl.store(CURSOR + experts, (tiles_end - tiles) * BM)  # each expert's first slot
    # 2. each tile's expert: the count of experts whose tiles end at or before it
    for start in range(0, MAX_TILES, 16):
        tile = start + tl.arange(0, 16)
        before = (tiles_end[None, :] <= tile[:, None]) & (experts <= E)[None, :]
        expert = tl.sum(before.to(tl.int32), axis=1)
        tl.store(TILE_EXPERT + tile, tl.where(expert <= E, expert, -1), mask=tile < MAX_TILES)
    # 3. every slot padding until a pair takes it
    for start in range(0, MAX_TILES * BM, BK):
        at = start + tl.arange(0, BK)
        tl.store(X_ROWS + at, tl.full((BK,), -1, tl.int32), mask=at < MAX_TILES * BM)
        tl.store(OUT_ROWS + at, tl.full((BK,), -1, tl.int32), mask=at < MAX_TILES * BM)
    tl.debug_barrier()  # the cursors and the padding written, before the pairs take slots
    # 4. each pair takes the next slot of its expert's (or of "none"'s)
    for start in range(0, P, BK):
        at = start + tl.arange(0, BK)
        e = tl.load(IDS + at, mask=at < P, other=-1)
        key = tl.where((e >= 0) & (e < E), e, E).to(tl.int32)
        slot = tl.atomic_add(CURSOR + key, 1, mask=at < P, sem="relaxed")
        tl.store(X_ROWS + slot, at // XDIV, mask=at < P)
        tl.store(OUT_ROWS + slot, at, mask=at < P)


@triton.jit
def moe_gemm_kernel(P0, P1, P2, P3, P4, TABLE, S0, S1, S2, S3, S4, X, X_ROWS, OUT_ROWS,
                    TILE_EXPERT, E, OUT, SUMS, COUNTS, N, B, stride_xm, stride_om,
                    BLOCK: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                    IEEE: tl.constexpr, DQ: tl.constexpr, XRUN: tl.constexpr = 0,
                    SWAP: tl.constexpr = False, STEP_BLOCKS: tl.constexpr = 1,
                    DQ_DT: tl.constexpr = tl.float32, FENCE: tl.constexpr = False,
                    MMA_PIPELINED: tl.constexpr = False, SPLIT_K: tl.constexpr = 1,
                    BLOCK_SCALE: tl.constexpr = None):
    # S0..S4: each plane's elements per expert (in the launch tensor's element type, before
    # the dequant function casts the pointer); X_ROWS / OUT_ROWS: each sorted slot's row of x
    # and of the output, -1 for padding; TILE_EXPERT: each BM-row tile's expert, E for the
    # pairs of none of this stack's experts (another rank's: their rows are written as zeros,
    # no weight read). With SPLIT_K > 1, program (t, ., s) takes the K steps s, s + SPLIT_K,
    # ... of tile t (as gemm.py's), its partial sums through SUMS (float32, OUT's strides) and
    # COUNTS (a counter an output tile: grid axes 0 and 1), which the tile's last program
    # leaves zeroed (split_k.py; dispatch.py keeps the workspace)
    e = tl.load(TILE_EXPERT + tl.program_id(0)).to(tl.int64)
    if e < 0:  # past the last tile: the grid is sized from the shapes alone
        return
    slots = tl.program_id(0) * BM + tl.arange(0, BM)
    x_rows = tl.load(X_ROWS + slots)
    out_rows = tl.load(OUT_ROWS + slots)
    live = x_rows >= 0
    rows = tl.program_id(1) * BN + tl.arange(0, BN)
    mask = rows < N
    out = OUT + out_rows[:, None].to(tl.int64) * stride_om + rows[None, :]
    if MMA_PIPELINED:  # the K loop promised a step (gemm.py)
        if e >= E:  # another rank's experts: their rows are zeros here, no weight read (every
            # split's program writes the same zeros; none counts itself on the tile's counter)
            tl.store(out, tl.zeros((BM, BN), OUT.dtype.element_ty), mask=live[:, None] & mask[None, :])
            return
        steps = B // (SPLIT_K * STEP_BLOCKS)
        tl.assume(steps > 0)
    else:  # another rank's experts: no step, zeros. (The early return above, here too, made
        # some unpromised tiles issue 3-5% more: IQ2_XXS's and IQ1_S's BM = 64, IQ1_M's BM = 32)
        steps = tl.where(e < E, B // (SPLIT_K * STEP_BLOCKS), 0)
        e = tl.where(e < E, e, 0)
    cols = tile_columns(BLOCK, XRUN)  # x's columns in the order of DQ's (registry.py)
    # padding slots read x's row 0 and rows past N row N - 1 (never stored): loads without a
    # mask, as gemm.py's
    xrows = tl.maximum(x_rows, 0)
    wrows = tl.minimum(rows, N - 1)
    every = tl.full(rows.shape, 1, tl.int1)
    p0, p1, p2, p3, p4 = P0 + e * S0, P1 + e * S1, P2 + e * S2, P3 + e * S3, P4 + e * S4
    if SWAP:  # the weight tile as the MMA's A operand (gemm.py, configs.swap_ab)
        acc = tl.zeros((BN, BM), dtype=tl.float32)
    else:
        acc = tl.zeros((BM, BN), dtype=tl.float32)
    for i in range(0, steps):  # STEP_BLOCKS block columns a step (gemm.py)
        for b in tl.static_range(STEP_BLOCKS):
            if SPLIT_K == 1:  # (no program id in the loop's addresses: the same SASS as before)
                j = i * STEP_BLOCKS + b
            else:
                j = (tl.program_id(2) + i * SPLIT_K) * STEP_BLOCKS + b
            w = dequant_tile(DQ, DQ_DT, p0, p1, p2, p3, p4, TABLE, j, wrows, every, N)  # [BN, BLOCK]
            x = tl.load(X + xrows[:, None].to(tl.int64) * stride_xm + j * BLOCK + cols[None, :])
            acc = block_product(acc, x, w, IEEE, SWAP, FENCE, BLOCK_SCALE, DQ_DT, p0, p1, p2, p3, p4,
                                TABLE, j, wrows, every, N)
    if SPLIT_K == 1:
        tl.store(out, tile_result(acc, SWAP).to(OUT.dtype.element_ty), mask=live[:, None] & mask[None, :])
    else:
        add_partial_sums(tile_result(acc, SWAP), SUMS, OUT,
                         out_rows[:, None].to(tl.int64) * stride_om + rows[None, :],
                         live[:, None] & mask[None, :], COUNTS, 2, SPLIT_K, CLEAN=True)
