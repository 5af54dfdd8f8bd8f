"""Split K finished inside the kernel that splits it (CUTLASS's "serial" split K, with atomics).

The SPLIT_K programs of one output tile add their partial sums atomically into a float32
workspace and then count themselves on the tile's counter; the program that counts last reads
the whole sum back and writes it in the output's dtype. A product is then one launch (beside
x's preparation, which zeroes the workspace, or the fused GEMM's workspace that its last
programs leave zeroed: dispatch.py) where it took three: a zeroed
float32 output, the kernel's atomics into it, a cast to x's dtype after. At decode, where
these kernels run, a product's device time is a few microseconds and its launches' fixed cost
a good part of it (the H200's timings, BENCHMARKS.md "GPU"); an eager caller (transformers'
generate) pays Python's and the driver's cost once a launch.

What makes the last program's read see every program's sums: each thread's adds are done
before the program's barrier, the counter is taken with acquire-release semantics at GPU
scope (its release orders the barrier's adds before the count; its acquire, in the last
program, orders the count before the read), and the read goes to L2 (".cg"), where the
atomics were done, not to a stale line of the SM's own L1."""

import triton
import triton.language as tl


@triton.jit
def add_partial_sums(acc, SUMS, OUT, offsets, mask, COUNTS, SPLIT_AXIS: tl.constexpr,
                     SPLIT_K: tl.constexpr, CLEAN: tl.constexpr = False):
    """This program's partial sums `acc` into SUMS + offsets (float32: the workspace has the
    output's strides, so one offset tensor serves both), then its tile's counter in COUNTS
    (int32, one a tile: the grid's other two axes, SPLIT_AXIS being the split's) up by one;
    the tile's last program stores the total at OUT + offsets, in the output's dtype. `mask`:
    the live elements. (The counter's address is made here, after the K loop, from the
    program's ids: made before, ptxas kept it across the loop in local memory, 2-6 bytes of
    Q6_K's and Q8_0's GEMV at sm_90 and sm_120.) With CLEAN the last program leaves the tile's
    workspace as it found it, its sums and counter zero again, for the next launch that
    takes the same workspace (dispatch.py keeps one for the fused GEMM: no zeroing launch);
    every other program of the tile has counted itself by then, and reads nothing more."""
    tl.atomic_add(SUMS + offsets, acc, mask=mask, sem="relaxed")
    tl.debug_barrier()  # every thread's adds, before the program counts itself
    if SPLIT_AXIS == 1:
        tile = tl.program_id(2) * tl.num_programs(0) + tl.program_id(0)
    else:
        tile = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
    arrived = tl.atomic_add(COUNTS + tile, 1, sem="acq_rel")
    if arrived == SPLIT_K - 1:
        total = tl.load(SUMS + offsets, mask=mask, other=0.0, cache_modifier=".cg")
        tl.store(OUT + offsets, total.to(OUT.dtype.element_ty), mask=mask)
        if CLEAN:
            tl.store(SUMS + offsets, tl.zeros_like(total), mask=mask)
            tl.store(COUNTS + tile, 0)


@triton.jit
def zero_share(Z, ZN, BK: tl.constexpr):
    """Program (i, j) of a launch zeroes its share of Z[0:ZN] (float32, or anything of 4-byte
    elements: zero is the same bits), BK elements a step: x's preparation zeroes the split-K
    workspace of the product it prepares for, rather than a launch of its own."""
    programs = tl.num_programs(0) * tl.num_programs(1)
    program = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
    share = tl.cdiv(ZN, programs)
    start = program * share
    end = tl.minimum(start + share, ZN)
    for offset in range(0, share, BK):
        at = start + offset + tl.arange(0, BK)
        tl.store(Z + at, tl.zeros((BK,), dtype=tl.float32), mask=at < end)
