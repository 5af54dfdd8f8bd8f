"""Kernel family: GEMM for larger M, BM x BN tiles, tl.dot on dequantized weight tiles,
float32 accumulation. fp16/bf16 activations use the tensor cores in their dtype; float32
ones are multiplied in full float32 (IEEE), as the torch backend does.

Two orientations (configs.swap_ab, by BM). At BM = 16 x is the MMA's A operand and the
weight tile its B (out = x @ w.T). From BM = 32 on the weight tile is the A operand and x the
B (out.T = w @ x.T, "swap AB" as Marlin and Machete do at small batch): on sm_90 a wgmma takes
A from registers, so the dequantized weights go from the dequant function to the tensor cores
without a trip through shared memory, at the full HGMMA rate, its 64-row side filled by the
weight tile whatever the batch (estimated from the sm_90 SASS: BENCHMARKS.md, "Paths by M").

A step of the K loop takes STEP_BLOCKS block columns (128 weights of the 32- and 64-weight
blocks: configs.gemm_step_blocks): the loop's own instructions (addresses, the pipeline's waits,
the MMA's fences) then serve that many blocks, and each stage of the pipeline has that many
blocks' planes in flight.

With SPLIT_K > 1, program (., ., s) takes block columns s, s + SPLIT_K, ... and adds its
partial sums atomically into a float32 workspace, the tile's last program writing the total
in x's dtype (split_k.py): at small M there are too few tiles to give every SM two programs,
and only two or more programs on an SM let one's MMA run while another dequantizes
(configs.gemm_config).

MMA_PIPELINED (configs.mma_pipelined) promises the compiler that the K loop runs at least once
(B >= SPLIT_K * STEP_BLOCKS, which dispatch.py ensures: it launches nothing for K = 0).
Without the promise, the path that skips the loop gives the accumulator its zeros after the
loop, and ptxas serializes every wgmma of the kernel for it: "(C7515) Potential Performance
Loss: wgmma.mma_async instructions are serialized due to non wgmma instructions defining
accumulator registers of a wgmma between start and end of the pipeline stage" (ptxas -v).
Serialized, each wgmma waits for the one before it (a `WARPGROUP.DEPBAR.LE gsb0, 0x0`, a wait
for none in flight, before each HGMMA in the SASS: 16 a K step in Q4_K's swapped BM = 32 tile;
with the promise none, two waits a step that leave one in flight; aot.loop_mma_drains).
Which tiles get it depends on the Triton version (configs.NO_STEP_PROMISE)."""

import triton
import triton.language as tl

from .fields import INTERPRETED, tile_columns
from .split_k import add_partial_sums

# An identity the compiler cannot look through: a "mov" it must keep (impure). Triton sizes
# both MMA operands' register fragments (kWidth) from what it finds behind either operand:
# the narrowest load, halved where a tt.join lies between (AccelerateMatmul's
# computeOrigBitWidth). A weight tile unpacked from 32-bit words through joins can get kWidth 4
# (a toy tile of one join: 4 with Triton 3.6 and 3.7, 2 with 3.9), and then x's 16-bit tile,
# read from shared memory as the BM = 16 tile's A operand, is loaded by scalar loads and
# register moves instead of ldmatrix (Q8_0's tile at sm_90 with Triton 3.6: 82 moves a K step).
# Behind the fence the weight tile is only its own 16 bits: kWidth 2. The fence also keeps the
# dot operand's layout from reaching back into the dequant function, which most types' tiles
# depend on (their unpacking is ordered for the fragments: Q4_0's BM = 16 tile issues twice as
# much fenced), so it is for configs.KWIDTH_FENCE's tiles only.
KWIDTH_FENCE_PTX = tl.constexpr("mov.b32 $0, $1;")


@triton.jit
def kwidth_fence(w):
    """w itself, 16-bit values (two a register), in a form Triton cannot see through."""
    if INTERPRETED:
        return w
    else:
        return tl.inline_asm_elementwise(KWIDTH_FENCE_PTX, "=r,r", [w], dtype=w.dtype, is_pure=False, pack=2)


@triton.jit
def tile_product(acc, x, w, IEEE: tl.constexpr, SWAP: tl.constexpr, FENCE: tl.constexpr = False):
    """acc + x [BM, BLOCK] times the dequantized weight tile w [BN, BLOCK]: acc is [BM, BN],
    or with SWAP [BN, BM] (the weight tile as the MMA's A operand). FENCE: the 16-bit weight
    tile through kwidth_fence (configs.kwidth_fence: the tiles that issue less so, measured)."""
    if SWAP:
        if IEEE:
            acc = tl.dot(w, tl.trans(x.to(tl.float32)), acc, input_precision="ieee")
        elif FENCE:
            acc = tl.dot(kwidth_fence(w.to(x.dtype)), tl.trans(x), acc)
        else:
            acc = tl.dot(w.to(x.dtype), tl.trans(x), acc)
    else:
        if IEEE:
            acc = tl.dot(x.to(tl.float32), tl.trans(w), acc, input_precision="ieee")
        elif FENCE:
            acc = tl.dot(x, tl.trans(kwidth_fence(w.to(x.dtype))), acc)
        else:
            # (transposed, then converted: Triton 3.6 spills 78 bytes in IQ1_S's BM = 64
            # tile the other way round)
            acc = tl.dot(x, tl.trans(w).to(x.dtype), acc)
    return acc


@triton.jit
def block_product(acc, x, w, IEEE: tl.constexpr, SWAP: tl.constexpr, FENCE: tl.constexpr,
                  BLOCK_SCALE: tl.constexpr, DQ_DT: tl.constexpr, P0, P1, P2, P3, P4, TABLE, j, rows,
                  mask, N):
    """tile_product for one block column j; with BLOCK_SCALE (registry.py's scaled_after: w
    without the block's scale), the block's MMA sum times each weight row's scale, added."""
    if BLOCK_SCALE is None:
        return tile_product(acc, x, w, IEEE, SWAP, FENCE)
    else:
        scale = BLOCK_SCALE(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, DQ_DT)
        part = tile_product(tl.zeros(acc.shape, tl.float32), x, w, IEEE, SWAP, FENCE)
        if SWAP:
            return acc + part * scale[:, None]
        else:
            return acc + part * scale[None, :]


@triton.jit
def dequant_tile(DQ: tl.constexpr, DQ_DT: tl.constexpr, P0, P1, P2, P3, P4, TABLE, j, rows, mask, N):
    """The weight tile of DQ, a type's float32 function (DQ_DT float32) or its half-precision
    one, asked for DQ_DT (registry.py; dispatch.gemm_dequant picks both)."""
    if DQ_DT == tl.float32:
        return DQ(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N)
    else:
        return DQ(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, DQ_DT)


@triton.jit
def tile_result(acc, SWAP: tl.constexpr):
    """The [BM, BN] result of a tile's accumulator (tile_product's orientation)."""
    if SWAP:
        acc = tl.trans(acc)
    return acc


# The batch size only masks rows: one compiled variant serves every value of it.
@triton.jit(do_not_specialize=["M"])
def gemm_kernel(P0, P1, P2, P3, P4, TABLE, X, OUT, SUMS, COUNTS, M, N, B, stride_xm, stride_om,
                BLOCK: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                IEEE: tl.constexpr, DQ: tl.constexpr, SPLIT_K: tl.constexpr,
                XRUN: tl.constexpr = 0, SWAP: tl.constexpr = False, STEP_BLOCKS: tl.constexpr = 1,
                DQ_DT: tl.constexpr = tl.float32, FENCE: tl.constexpr = False,
                MMA_PIPELINED: tl.constexpr = False, BLOCK_SCALE: tl.constexpr = None):
    # SUMS (float32, OUT's strides) and COUNTS [tiles] int32, zeroed: the split-K workspace
    # (split_k.py), which the tiles' last programs leave zeroed again (dispatch.py keeps it)
    ms = tl.program_id(0) * BM + tl.arange(0, BM)
    rows = tl.program_id(1) * BN + tl.arange(0, BN)
    mask = rows < N
    cols = tile_columns(BLOCK, XRUN)  # x's columns in the order of DQ's (registry.py)
    # rows past M and N read row M - 1 and N - 1 again (never stored): loads without a mask
    xms = tl.minimum(ms, M - 1)
    wrows = tl.minimum(rows, N - 1)
    every = tl.full(rows.shape, 1, tl.int1)
    if SWAP:
        acc = tl.zeros((BN, BM), dtype=tl.float32)
    else:
        acc = tl.zeros((BM, BN), dtype=tl.float32)
    # a for loop from 0 (Triton pipelines it; Triton 3.6's interpreter cannot start a range
    # at a program id). A step of it takes STEP_BLOCKS consecutive block columns
    # (configs.gemm_step_blocks), program (., ., s) the steps s, s + SPLIT_K, ...;
    # SPLIT_K * STEP_BLOCKS divides B (configs.gemm_config)
    steps = B // (SPLIT_K * STEP_BLOCKS)
    if MMA_PIPELINED:
        tl.assume(steps > 0)
    for i in range(0, steps):
        for b in tl.static_range(STEP_BLOCKS):
            j = (tl.program_id(2) + i * SPLIT_K) * STEP_BLOCKS + b
            w = dequant_tile(DQ, DQ_DT, P0, P1, P2, P3, P4, TABLE, j, wrows, every, N)  # [BN, BLOCK]
            x = tl.load(X + xms[:, None].to(tl.int64) * stride_xm + j * BLOCK + cols[None, :])
            acc = block_product(acc, x, w, IEEE, SWAP, FENCE, BLOCK_SCALE, DQ_DT, P0, P1, P2, P3, P4,
                                TABLE, j, wrows, every, N)
    offsets = ms[:, None].to(tl.int64) * stride_om + rows[None, :]
    out_mask = (ms < M)[:, None] & mask[None, :]
    if SPLIT_K == 1:
        tl.store(OUT + offsets, tile_result(acc, SWAP).to(OUT.dtype.element_ty), mask=out_mask)
    else:
        add_partial_sums(tile_result(acc, SWAP), SUMS, OUT, offsets, out_mask, COUNTS, 2, SPLIT_K,
                         CLEAN=True)
