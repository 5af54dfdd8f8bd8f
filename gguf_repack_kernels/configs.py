"""Launch configurations, kept apart from the kernels. Defaults are chosen by block size
(256-weight blocks make 8x wider tiles than 32-weight ones); GPU measurements
(scripts/bench_gpu.py) are what should tune them. The tensor-core tiles are chosen for the
device they run on and the activations' dtype: a tile must fit the shared memory a block of
that device may have (`fit_shared_memory`)."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path


@dataclass(frozen=True)
class Device:
    """What a launch configuration depends on: the compute capability (90 for sm_90, 0 for
    Triton's interpreter), the shared memory a block may have in bytes (the opt-in maximum,
    which is what Triton checks a kernel's shared memory against at its first launch; 0: no
    limit) and the SMs to fill."""

    capability: int
    shared_memory: int
    sms: int

    @property
    def name(self) -> str:
        """The key of its tuned tiles: "sm90", or "interpreter"."""
        return f"sm{self.capability}" if self.capability else "interpreter"


# The GPUs the kernels are compiled for ahead of time (aot.py, scripts/inspect_kernels.py),
# by capability: the opt-in shared memory per block of the CUDA programming guide's table
# (163 KB at 8.0, 99 KB at 8.6, 8.9 and 12.0, 227 KB at 9.0: the SM's 164 / 100 / 228 KB
# less the 1 KB the driver reserves per block) and the SMs of one product of each: A100,
# RTX 3090, RTX 4090 (an L40S has 142), H100 SXM / H200, RTX 5090.
KNOWN_DEVICES = {
    80: Device(80, 166_912, 108),
    86: Device(86, 101_376, 82),
    89: Device(89, 101_376, 128),
    90: Device(90, 232_448, 132),
    120: Device(120, 101_376, 170),
}
# CPU tensors run under Triton's interpreter: one "SM" (no parallel hardware to fill) and no
# shared memory to run out of
INTERPRETER = Device(0, 0, 1)


def device_of(device) -> Device:
    """The Device record of a torch device: the interpreter's for a CPU one, else read from
    torch.cuda.get_device_properties once per GPU."""
    if device.type != "cuda":
        return INTERPRETER
    import torch

    return _cuda_device(device.index if device.index is not None else torch.cuda.current_device())


@cache
def _cuda_device(index: int) -> Device:
    import torch

    props = torch.cuda.get_device_properties(index)
    capability = props.major * 10 + props.minor
    # torch exposes cudaDevAttrMaxSharedMemoryPerBlockOptin as shared_memory_per_block_optin
    # on CUDA builds; without it, the capability's known value, else the 48 KB every block
    # gets without opting in
    shared = getattr(props, "shared_memory_per_block_optin", 0) or (
        KNOWN_DEVICES[capability].shared_memory if capability in KNOWN_DEVICES
        else props.shared_memory_per_block)
    return Device(capability, shared, props.multi_processor_count)


def triton_version() -> tuple[int, int]:
    """(major, minor) of the installed Triton ("3.6.0", "3.9.0+git...": (3, 6), (3, 9)), read
    without importing it; (0, 0) where no "triton" distribution is found (a build under
    another name), which takes the oldest version's tiles: those spill with none measured.
    Some tiles depend on it (below): the same kernel compiles to other code, and spills
    registers where another version does not."""
    try:
        found = re.match(r"(\d+)\.(\d+)", version("triton"))
    except PackageNotFoundError:
        found = None
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


# The Triton the tiles are chosen for (tests set it to check another version's choices)
TRITON = triton_version()


def on_this_triton(from_triton: dict, type_name: str) -> bool:
    """Whether the installed Triton is at or past the version `from_triton` ({type: (major,
    minor)}, the tables below) names for the type: a tile or function it spills with before."""
    return TRITON >= from_triton.get(type_name, (0, 0))


# Activation dtypes by their short names (Triton's): fp16, bf16, fp32
ACTS = {"torch.float16": "fp16", "torch.bfloat16": "bf16", "torch.float32": "fp32"}


def act_name(dtype) -> str:
    """"fp16", "bf16" or "fp32" of a torch dtype (or of that name already)."""
    name = str(dtype)
    if name in ACTS.values():
        return name
    try:
        return ACTS[name]
    except KeyError:
        raise ValueError(f"activations of dtype {dtype}: float16, bfloat16 or float32") from None


# Tiles measured on a GPU: scripts/tune_kernels.py (which scripts/gpu_check.py runs) times the
# candidates below for each type side by side, checks each against the default tile's result,
# and writes the fastest as tuned_configs.json; committed here, it replaces the default tile
# of the types and tile kinds it names on the device and activation dtype it was tuned on
# (the split-K rule still fits K to the GPU's SMs). None is committed yet: no GPU has run
# the tuner.
TUNED_CONFIGS = Path(__file__).with_name("tuned_configs.json")


def tuned(device: Device, dtype) -> dict:
    """{tile kind: {type: tile}} from the tuner's file for this device's capability and this
    activation dtype ("tiles" keyed "sm90/fp16", ...), {} without one. Tile kinds: "gemv"
    (ROWS, PARTS, num_warps) and "gemm_bm16", "gemm_bm32", "gemm_bm64" (BN, num_warps,
    num_stages, STEP_BLOCKS)."""
    return _tiles(TUNED_CONFIGS).get(tuned_key(device, dtype), {})


def tuned_key(device: Device, dtype) -> str:
    return f"{device.name}/{act_name(dtype)}"


@cache
def _tiles(path: Path) -> dict:
    return json.loads(path.read_text())["tiles"] if path.exists() else {}


# What the tuner tries (each candidate is a compile on first use: the sets are small)
GEMV_CANDIDATES = [{"ROWS": rows, "PARTS": parts, "num_warps": 4}
                   for rows in (1, 2, 4) for parts in (1, 2, 4)]
# and K whole (SPLIT_K 1): no float32 atomics, no workspace, fewer threads a row (split K is
# two launches a product too, since it is finished in the kernel: split_k.py; it was four
# when the H200's first timings put the GEMV's 11-15 us near their fixed cost, BENCHMARKS.md)
GEMV_CANDIDATES += [{"ROWS": 1, "PARTS": parts, "num_warps": warps, "SPLIT_K": 1}
                    for warps in (1, 2) for parts in (1, 2, 4)]
# and K split further, until 4 or 8 programs an SM (the rule's 2 is the default): the same
# timings took about as long for Q8_0 as for Q4_0 (12.3 against 10.9 us, twice the bytes),
# as if a program's few K-loop iterations each waited a full memory latency with one small
# load of each plane in flight; more programs an SM put more of the weight in flight at
# once, for more float32 atomics
GEMV_CANDIDATES += [{"ROWS": rows, "PARTS": parts, "num_warps": 4, "PROGRAMS_PER_SM": programs}
                    for rows in (2, 4) for parts in (1, 2) for programs in (4, 8)]
# and the K loop under Triton's software pipeliner (gemv.gemv_dot_row's STAGES): the next
# iteration's planes in flight while one computes, for 6-8% more loop instructions (sm_90:
# scripts/gemv_stages.py). Only for blocks of 32 weights: the pipeliner took 45 s (2 stages) and
# 113 s (3) to compile Q4_K's loop (3 s without; Q4_0's under 1 s), too long a first call for
# the 256-weight types (BENCHMARKS.md)
GEMV_CANDIDATES += [{"ROWS": 4, "PARTS": 1, "num_warps": 4, "STAGES": stages} for stages in (2, 3)]
GEMV_STAGES_BLOCK = 32
GEMM_CANDIDATES = {
    16: [{"BN": bn, "num_warps": 4, "num_stages": st} for bn in (32, 64, 128) for st in (2, 3)],
    32: [{"BN": bn, "num_warps": 4, "num_stages": st} for bn in (32, 64) for st in (2, 3)],
    64: [{"BN": bn, "num_warps": w, "num_stages": 2} for bn in (32, 64, 128) for w in (4, 8)]}
# and, at the default BN, K split until 4 or 8 programs an SM (the rule's 2 is the default) and
# 4 pipeline stages: at M = 2-16 the H200 took about a microsecond for each K iteration of a
# program (Q4_0's BM = 16 tile, 16 iterations at 2 programs an SM and 2 stages: 15.8-17.7 us;
# Q8_0's BM = 32 tile: 24-26 us), as if each iteration waited a memory latency with one
# iteration's planes in flight; more programs an SM and more stages put more in flight, for
# more float32 atomics and shared memory (BENCHMARKS.md "Launches a product")
# (three a tile: stages alone, programs alone, both; the tuner's time on a GPU is short)
for _bm in (16, 32, 64):
    GEMM_CANDIDATES[_bm] += [{"PROGRAMS_PER_SM": p, "num_stages": st} for p, st in ((2, 4), (4, 2), (8, 4))]
# and a K step of one block (the tiles before GEMM_STEP_WEIGHTS) and of eight, for the types
# whose blocks are under 128 weights only (scripts/tune_kernels.py offers these to no other)
for _bm in (16, 32, 64):
    GEMM_CANDIDATES[_bm] += [{"STEP_BLOCKS": step} for step in (1, 8)]


# Three paths for x @ W.T, by M (dispatch.matmul_path): the GEMV family (split-K, no tensor
# cores: the weight read is the whole cost, but a program per 1, 2 or 4 rows of x, each
# dequantizing the whole weight again: gemv_x_rows); the fused GEMM family (tensor cores,
# each weight tile dequantized once per BM rows of x, BM = 16, 32 or 64); the weight
# dequantized once, into x's dtype, by the dequantize family, then torch.matmul (cuBLAS).
# Which one, and which BM, at each M
# is the SASS estimate's (MATMUL_RULE); for the types it has not covered, GEMV up to
# GEMV_MAX_M, then BM = 16 / 32 / 64 by M, then from dequantize_matmul_min_m on
# dequantize+matmul.
GEMV_MAX_M = 8

# The fastest choice at each M by the SASS estimate for a 4096 x 4096 weight on an H200
# (gguf_repack_kernels/aot.py: matmul_path_estimates; BENCHMARKS.md "Paths by M"), per type: (largest M,
# choice) pairs in increasing M, the last one (None) for every M beyond. Choices:
# "gemv", "gemm_bm16", "gemm_bm32", "gemm_bm64", "gemm_bm128" (the swapped tile of
# SWAP_AB_TYPES only; BM = 64 for float32 x), "dequantize+matmul". Estimated at
# aot.PATH_MS and beyond, each boundary at the last estimated M of a run. Generated by
#     python scripts/estimate_paths.py --write-configs
# (rewrites what lies between the two marker lines). Estimates, not timings: GPU timings
# (scripts/bench_gpu.py) should replace them.
# BEGIN estimate_paths --write-configs
MATMUL_RULE: dict[str, tuple] = {
    'IQ1_M': ((4, 'gemv'), (16, 'gemm_bm16'), (96, 'gemm_bm32'), (None, 'dequantize+matmul')),
    'IQ1_S': ((8, 'gemv'), (16, 'gemm_bm16'), (96, 'gemm_bm32'), (None, 'dequantize+matmul')),
    'IQ2_S': ((4, 'gemv'), (16, 'gemm_bm16'), (96, 'gemm_bm32'), (None, 'dequantize+matmul')),
    'IQ2_XS': (
        (4, 'gemv'),
        (16, 'gemm_bm16'),
        (32, 'gemm_bm32'),
        (64, 'gemm_bm64'),
        (96, 'gemm_bm32'),
        (None, 'dequantize+matmul'),
    ),
    'IQ2_XXS': ((4, 'gemv'), (16, 'gemm_bm16'), (96, 'gemm_bm32'), (None, 'dequantize+matmul')),
    'IQ3_S': (
        (4, 'gemv'),
        (16, 'gemm_bm16'),
        (32, 'gemm_bm32'),
        (64, 'gemm_bm64'),
        (96, 'gemm_bm32'),
        (None, 'dequantize+matmul'),
    ),
    'IQ3_XXS': ((4, 'gemv'), (16, 'gemm_bm16'), (96, 'gemm_bm32'), (None, 'dequantize+matmul')),
    'IQ4_NL': (
        (2, 'gemv'),
        (16, 'gemm_bm16'),
        (32, 'gemm_bm32'),
        (192, 'gemm_bm64'),
        (None, 'dequantize+matmul'),
    ),
    'IQ4_XS': (
        (2, 'gemv'),
        (16, 'gemm_bm16'),
        (32, 'gemm_bm32'),
        (128, 'gemm_bm64'),
        (None, 'dequantize+matmul'),
    ),
    'MXFP4': (
        (2, 'gemv'),
        (16, 'gemm_bm16'),
        (32, 'gemm_bm32'),
        (64, 'gemm_bm64'),
        (128, 'gemm_bm128'),
        (192, 'gemm_bm64'),
        (256, 'gemm_bm128'),
        (None, 'dequantize+matmul'),
    ),
    'NVFP4': (
        (2, 'gemv'),
        (32, 'gemm_bm32'),
        (64, 'gemm_bm64'),
        (128, 'gemm_bm128'),
        (192, 'gemm_bm64'),
        (256, 'gemm_bm128'),
        (None, 'dequantize+matmul'),
    ),
    'Q2_K': (
        (4, 'gemv'),
        (16, 'gemm_bm16'),
        (32, 'gemm_bm32'),
        (64, 'gemm_bm64'),
        (128, 'gemm_bm128'),
        (192, 'gemm_bm64'),
        (None, 'dequantize+matmul'),
    ),
    'Q3_K': (
        (4, 'gemv'),
        (16, 'gemm_bm16'),
        (32, 'gemm_bm32'),
        (64, 'gemm_bm64'),
        (128, 'gemm_bm128'),
        (None, 'dequantize+matmul'),
    ),
    'Q4_0': (
        (1, 'gemv'),
        (16, 'gemm_bm16'),
        (32, 'gemm_bm32'),
        (256, 'gemm_bm64'),
        (None, 'dequantize+matmul'),
    ),
    'Q4_1': (
        (1, 'gemv'),
        (16, 'gemm_bm16'),
        (32, 'gemm_bm32'),
        (64, 'gemm_bm64'),
        (128, 'gemm_bm128'),
        (192, 'gemm_bm64'),
        (384, 'gemm_bm128'),
        (None, 'dequantize+matmul'),
    ),
    'Q4_K': (
        (1, 'gemv'),
        (16, 'gemm_bm16'),
        (32, 'gemm_bm32'),
        (64, 'gemm_bm64'),
        (384, 'gemm_bm128'),
        (None, 'dequantize+matmul'),
    ),
    'Q5_0': (
        (1, 'gemv'),
        (16, 'gemm_bm16'),
        (32, 'gemm_bm32'),
        (192, 'gemm_bm64'),
        (None, 'dequantize+matmul'),
    ),
    'Q5_1': (
        (1, 'gemv'),
        (16, 'gemm_bm16'),
        (32, 'gemm_bm32'),
        (64, 'gemm_bm64'),
        (128, 'gemm_bm128'),
        (192, 'gemm_bm64'),
        (256, 'gemm_bm128'),
        (None, 'dequantize+matmul'),
    ),
    'Q5_K': (
        (1, 'gemv'),
        (16, 'gemm_bm16'),
        (32, 'gemm_bm32'),
        (64, 'gemm_bm64'),
        (384, 'gemm_bm128'),
        (None, 'dequantize+matmul'),
    ),
    'Q6_K': (
        (1, 'gemv'),
        (16, 'gemm_bm16'),
        (32, 'gemm_bm32'),
        (64, 'gemm_bm64'),
        (128, 'gemm_bm128'),
        (192, 'gemm_bm64'),
        (384, 'gemm_bm128'),
        (None, 'dequantize+matmul'),
    ),
    'Q8_0': (
        (2, 'gemv'),
        (16, 'gemm_bm16'),
        (32, 'gemm_bm32'),
        (64, 'gemm_bm64'),
        (128, 'gemm_bm128'),
        (192, 'gemm_bm64'),
        (384, 'gemm_bm128'),
        (None, 'dequantize+matmul'),
    ),
    'TQ1_0': ((1, 'gemv'), (16, 'gemm_bm16'), (192, 'gemm_bm64'), (None, 'dequantize+matmul')),
    'TQ2_0': (
        (4, 'gemv'),
        (16, 'gemm_bm16'),
        (32, 'gemm_bm32'),
        (64, 'gemm_bm64'),
        (128, 'gemm_bm128'),
        (192, 'gemm_bm64'),
        (256, 'gemm_bm128'),
        (None, 'dequantize+matmul'),
    ),
}
# END estimate_paths --write-configs


# Measured on an H200 (scripts/bench_gpu.py --short, CUDA-graph replays, 4096 x 4096, fp16 x;
# BENCHMARKS.md "GPU"): past M = 64 every fused tile the estimate chose lost to dequantize +
# matmul, for all six types timed (Q4_0, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_XS): at M = 128 by 1.4-1.8x,
# at 256 by 1.8-2.9x (the swapped BM = 128 tile, estimated at 0.97x fp16, ran at 0.21-0.31x).
# So no fused tile beyond this M, whatever MATMUL_RULE's estimate says, for every type: the
# tiles are one family (gemm.py), and the others were not timed.
FUSED_MAX_M = 64


def matmul_choice(type_name: str, block_size: int, m: int) -> str:
    """The path, and for the fused GEMM its BM, that x @ W.T takes at M rows of x: MATMUL_RULE's
    choice for the type, else the default rule (GEMV_MAX_M, BM by M, dequantize_matmul_min_m);
    dequantize+matmul past FUSED_MAX_M either way."""
    rule = MATMUL_RULE.get(type_name)
    if rule is not None:
        choice = next(choice for top, choice in rule if top is None or m <= top)
        return "dequantize+matmul" if choice.startswith("gemm") and m > FUSED_MAX_M else choice
    if m <= GEMV_MAX_M:
        return "gemv"
    if m >= dequantize_matmul_min_m(block_size) or m > FUSED_MAX_M:
        return "dequantize+matmul"
    return f"gemm_bm{16 if m <= 16 else 32 if m <= 32 else 64}"


def gemm_bm(type_name: str, block_size: int, m: int) -> int:
    """The fused GEMM's BM at M rows: the rule's where it takes the fused GEMM there, else BM
    by M (16 up to 16, 32 up to 32, else 64: a launch at an M the rule gives another path,
    as the tuner's or the AOT compiles')."""
    choice = matmul_choice(type_name, block_size, m)
    if choice.startswith("gemm_bm"):
        return int(choice[len("gemm_bm"):])
    return 16 if m <= 16 else 32 if m <= 32 else 64


def dequantize_matmul_min_m(block_size: int) -> int:
    """The fused GEMM dequantizes every weight M / BM times, and issuing that costs more
    than the tensor cores' time for the tile (0.12-0.34 of an fp16 matmul's speed per SM);
    dequantizing once costs about the weight written as fp16 and read back (9 us for a
    4096 x 4096 Q4_K on an H200). Estimated from the SASS (scripts/inspect_kernels.py --sass,
    BENCHMARKS.md "GEMM paths"), dequantize-then-matmul gets ahead from M = 64-256 by type:
    the median is 128 for the 32- and 64-weight blocks and 192 for the 256-weight ones.
    GPU timings (scripts/bench_gpu.py) should replace these."""
    return 192 if block_size >= 256 else 128


def dequantize_config(block_size: int) -> dict:
    # 32 rows of a wider block still give each thread 8+ contiguous bytes of a quant plane
    # (vector loads; seen in the PTX for NVFP4 and TQ1_0, which get scalar ones at 16 rows)
    return {"BN": 64 if block_size <= 32 else 32, "num_warps": 4}


def embedding_config(block_size: int) -> dict:
    return {"BI": 16 if block_size <= 32 else 4, "num_warps": 4}


# BN of the M <= 16 tile where the block-size default spills registers in the sm_90 SASS
# (Q8_0: 5 at BN = 128; IQ3_XXS at 64)
GEMM_M16_BN = {"Q8_0": 64, "IQ3_XXS": 32}

# BN of the BM = 16 tile with float16 x where the type's float16 dequant function takes a
# wider one than the float32 function can (sm_90 SASS: Q4_K 769 loop instructions for
# 16 x 64 x 256, 1271 for 16 x 128, 0.65 -> 0.79 of the bytes' bound, 192 registers, no
# spills; the float32 function spills at BN = 128 with float32 x; IQ3_XXS's float16 function
# 0.24 -> 0.40 at 64, BENCHMARKS.md "The grid types in float16")
GEMM_M16_BN_F16 = {"Q4_K": 128, "IQ3_XXS": 64}
# the same with bfloat16 x, where the type's bfloat16 function does as its float16 one
GEMM_M16_BN_BF16 = {"Q4_K": 128, "IQ3_XXS": 64}
# Triton 3.6 and 3.7 (the GPU machine's 3.6, vLLM installs' of torch 2.10-2.11) spill
# registers in Q4_K's 16 x 128 tile, in both dtypes (36 bytes, LDL in the K loop; 3.8 and 3.9
# none): there the float32 function's BN, 64 (no spills, 0.73 of the bytes' bound against the
# spilling tile's 0.83, sm_90 SASS; BENCHMARKS.md "Triton 3.6")
GEMM_M16_WIDE_FROM_TRITON = {"Q4_K": (3, 8)}


# The types whose BM = 32 and 64 tiles, with float16 or bfloat16 x, take the weight tile as
# the MMA's A operand (gemm.py, "swap AB"), at BN = 64: their dequantized weights reach the
# wgmma from registers (sm_90 SASS, fp16 x, the fraction of the bytes' bound its issue allows
# per tile, BENCHMARKS.md "Batched decode kernels"). Not for float32 x: its IEEE dot runs on FMAs, and the
# swapped 64 x 64 tile spills (Q4_K: 14,240 bytes).
SWAP_AB_TYPES = frozenset(["IQ1_M", "IQ1_S", "IQ2_S", "IQ2_XS", "IQ2_XXS", "IQ3_S", "IQ3_XXS",
                           "IQ4_NL", "IQ4_XS", "MXFP4", "NVFP4", "Q2_K", "Q3_K", "Q4_0", "Q4_1", "Q4_K",
                           "Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0", "TQ1_0", "TQ2_0"])


# The swapped BM = 128 tile (where MATMUL_RULE takes "gemm_bm128": one pass over the weight
# for up to 128 rows, where BM = 64 makes two): BN = 128 over 8 warps (two warpgroups, each
# its 64 weight rows) for 256-weight blocks, BN = 64 over 4 warps for the others and for
# BM128_NARROW (sm_90 SASS, fp16 x: Q6_K's 128-wide tile spills 10 bytes, its 64-wide one
# none, at 0.92 of the bytes' bound). Not for BM128_SPILLS, whose tile spills registers at
# both (IQ4_XS: 34 / 55 bytes); it takes BM = 64 there.
BM128_SPILLS = frozenset(["IQ4_XS"])
BM128_NARROW = frozenset(["Q6_K"])
# The swapped BM = 64 tile over two warpgroups alike (BN = 128, 8 warps: half the accumulator
# a thread of BN = 64 over 4), for types whose half-precision function needs more registers
# than the 4-warp tile leaves: there they took the float32 one (registry.py, wide_f16); this
# tile takes their BM < 64 one (dispatch.gemm_dequant). sm_90 SASS, fp16 x, warp-instructions
# a weight byte (the bound its issue allows), Triton 3.9: Q2_K 0.72 -> 0.43 (0.30 -> 0.51),
# TQ2_0 0.72 -> 0.41 (0.30 -> 0.53), TQ1_0 1.72 -> 0.67 (0.13 -> 0.33); Triton 3.6 0.30 ->
# 0.38, 0.24 -> 0.52, 0.12 -> 0.33; no spills with either, bfloat16 x alike. Q3_K's at 3
# pipeline stages (its loads then kept in shared memory: at 2 the tile spills 22-35 bytes):
# 0.72 -> 0.45 (0.30 -> 0.49), Triton 3.6 0.29 -> 0.48. Not the grid types and IQ1 (72-449
# bytes), nor BM = 128 (BM = 128 x BN = 128: Q2_K, TQ2_0 82-94 bytes). {type: stages};
# BENCHMARKS.md "The BM = 64 tile over two warpgroups".
BM64_TWO_WARPGROUPS = {"Q2_K": 2, "Q3_K": 3, "TQ1_0": 2, "TQ2_0": 2}
# Swapped at BM = 32 only (with their half-precision functions, float16 or bfloat16 x): the
# grid types' swapped 64-row tiles spill (sm_90, fp16 x: IQ2_XXS 72 bytes with its float16
# function, 31 with the float32 one), and so did their swapped 32-row ones with the float32
# function (11-38 bytes, bfloat16 x before their bfloat16 functions); their plain tiles with
# the float32 function do not (IQ2_XXS's BM = 64: 904 instructions a step; BENCHMARKS.md
# "The grid types in float16", "bfloat16 x at float16's speed"). IQ1_M's with its
# half-precision function alike: the plain BM = 32 tile spills 120 bytes, the swapped one
# none (886 instructions a step, 0.22 of the bytes' bound; BENCHMARKS.md "IQ1_M in float16")
SWAP_AB_BM32_ONLY = frozenset(["IQ1_M", "IQ1_S", "IQ2_S", "IQ2_XS", "IQ2_XXS", "IQ3_S", "IQ3_XXS"])
# and not swapped at all before this Triton: IQ3_S's swapped BM = 32 tile spills 27 bytes in
# its K loop with Triton 3.6 (3.7 on: none); the plain one (BN = 32) none (sm_90 SASS, fp16 x:
# 0.15 of the bytes' bound against the spilling tile's 0.24)
SWAP_AB_FROM_TRITON = {"IQ3_S": (3, 7)}


# The types whose BM = 16 and 32 tiles take their half-precision dequant function only from
# this Triton on: Triton 3.6 spills 23-124 bytes in IQ4_XS's with it, in the K loop (3.7 on:
# none); its float32 function spills none there, at about the same issue (sm_90 SASS: 0.30 of
# the bytes' bound, against 0.29-0.33 spilling; Triton 3.9: 0.51-0.71 with the half-precision
# function). Not the BM = 64 tile's wide_f16 (IQ4_XS's nibble groups: no spills with 3.6, 0.50).
# dispatch.gemm_dequant reads it.
HALF_DEQUANT_FROM_TRITON = {"IQ4_XS": (3, 7)}


def half_dequant_allowed(type_name: str) -> bool:
    """Whether the tiles may take the type's half-precision dequant function with this Triton."""
    return on_this_triton(HALF_DEQUANT_FROM_TRITON, type_name)


# The BM = 16 tile takes the type's narrow_f16 (registry.py) from this Triton on, its
# dequant_half before. Q3_K's scales read in 16-bit words (formats_kquants.q3_k_half_m16),
# sm_90 SASS, fp16 x, loop instructions a step: Triton 3.9 970 -> 794 (x's tile read by
# ldmatrix), Triton 3.6 922 -> 1081; 3.7 and 3.8 not measured (BENCHMARKS.md "Q3_K's scales
# in halves"). MXFP4's E8M0 bytes read in 16-bit words (formats_other.mxfp4_half_m16):
# Triton 3.9 fp16 / bf16 x 737 / 714 -> 687 / 638, Triton 3.6 776 / 769 -> 751 / 793.
# dispatch.gemm_dequant reads it.
NARROW_F16_FROM_TRITON = {"Q3_K": (3, 9), "MXFP4": (3, 9)}


def narrow_half_allowed(type_name: str) -> bool:
    """Whether the BM = 16 tile may take the type's narrow_f16 with this Triton."""
    return on_this_triton(NARROW_F16_FROM_TRITON, type_name)


# The tiles (BM: types) that take the 16-bit weight tile through gemm.kwidth_fence. BM = 16
# (x the MMA's A operand, read from shared memory): these types' unpacking is not ordered for
# the fragments, and behind the fence x's tile is read by ldmatrix (sm_90 SASS, loop
# instructions a K step, fp16 / bf16 x, Triton 3.9: Q5_K 730 / 740 -> 569 / 579, 0.84 ->
# 1.00 of the bytes' bound; Q6_K 660 -> 498; Q2_K 655 / 674 -> 521 / 588, 0.45 / 0.43 ->
# 0.56 / 0.50; Q8_0 278 / 409 -> 262 / 334; Triton 3.6 alike: Q8_0 357 -> 260). The other
# types' tiles issue up to twice as much fenced (Q4_0: 488 -> 982; TQ2_0's, fenced while it
# had the float32 function alone, 818 -> 729, with its float16 one 389 -> 947, spilling).
# BM = 32 and 64, every type measured fenced (BENCHMARKS.md "The kWidth fence past 16 rows"):
# one tile gained, Q2_K's swapped BM = 64 one with its float32 function (the weight tile the
# A operand: 1108 -> 956, 0.26 -> 0.31 with Triton 3.9; the same unfenced on 3.6-3.8: 975,
# 901, 918), fenced until that tile ran over two warpgroups with its float16 function
# (BM64_TWO_WARPGROUPS: fenced 576, unfenced 580; Triton 3.6 824 / 769); every other issues
# the same or up to 3.7x more, 22 of them spilling. (IQ1_M's plain BM = 32 tile gained too
# with its float32 function, 1073 -> 965 from Triton 3.8 on; with its half-precision one it
# is swapped, unfenced: SWAP_AB_BM32_ONLY.)
KWIDTH_FENCE = {16: frozenset(["Q2_K", "Q5_K", "Q6_K", "Q8_0"])}


# The swapped tiles (swap_ab: the dequantized weights the wgmmas' A operand, in registers)
# promise the compiler a non-empty K loop, so that ptxas keeps their wgmmas in flight together
# (gemm.py, MMA_PIPELINED), but these, from the Triton named ({BM: {type: (major, minor)}};
# sm_90 SASS, fp16 x, BENCHMARKS.md "Which wgmmas wait for each other, by Triton version"):
# - at BM = 64 and 128 the ones that spill in their K loop with the promise, their A operands
#   then all live at once: they keep one wgmma at a time. Triton 3.9: Q4_K's BM = 64 tile 44
#   bytes, IQ4_XS's 18; at BM = 128 (past FUSED_MAX_M: bench_gpu.py's "fused past the cap")
#   Q4_K's 88, Q6_K's 56. Triton 3.6 spills in the loop of Q4_K's BM = 128 tile only (58
#   bytes, 21 loads a step); 3.7 and 3.8 in Q4_K's BM = 64 tile (4 and 18 bytes), not in
#   IQ4_XS's.
# - Q3_K's BM = 128 tile, whose wgmmas ptxas keeps in flight without it (3.6 and 3.9; with it
#   Triton 3.9 spills 16 bytes where it spilled 12, outside the loop).
# - at BM = 32, from Triton 3.7 on, two whose wgmmas ptxas does not serialize without it, and
#   which issue more with it (3.9: IQ4_XS 754 -> 789 instructions a step with bfloat16 x,
#   IQ1_M 841 -> 871). Triton 3.6 serializes IQ4_XS's (its float32 dequant function there:
#   HALF_DEQUANT_FROM_TRITON), 1570 -> 1584 with the promise, and not IQ1_M's.
# The plain tiles (both operands from shared memory) gain nothing by it: ptxas serialized none
# of theirs.
NO_STEP_PROMISE = {32: {"IQ4_XS": (3, 7), "IQ1_M": (0, 0)},
                   64: {"Q4_K": (3, 7), "IQ4_XS": (3, 9)},
                   128: {"Q3_K": (0, 0), "Q4_K": (0, 0), "Q6_K": (3, 7)}}


def mma_pipelined(type_name: str, bm: int, dtype) -> bool:
    """Whether the BM-row tile for x of `dtype` promises the compiler a non-empty K loop
    (gemm.py): the swapped tiles, but NO_STEP_PROMISE's with this Triton."""
    unpromised = NO_STEP_PROMISE.get(bm, {})
    return swap_ab(type_name, bm, dtype) and not (type_name in unpromised
                                                  and on_this_triton(unpromised, type_name))


def two_warpgroups(type_name: str, bm: int, dtype) -> bool:
    """Whether the swapped BM = 64 tile for x of `dtype` runs over two warpgroups, with its
    BM < 64 dequant function (BM64_TWO_WARPGROUPS)."""
    return bm == 64 and type_name in BM64_TWO_WARPGROUPS and swap_ab(type_name, bm, dtype)


def tile_warps(type_name: str, bm: int, bn: int, dtype) -> int:
    """The fused and the expert GEMM's warps for a BM x BN tile: 8 for the swapped tiles over
    two warpgroups (BM = 128 with BN = 128, and two_warpgroups), else 4."""
    return 8 if (bm == 128 and bn == 128) or (two_warpgroups(type_name, bm, dtype) and bn == 128) else 4


def tile_stages(type_name: str, bm: int, dtype) -> int:
    """The fused and the expert GEMM's pipeline stages: 2, but for a tile over two warpgroups
    its type's (BM64_TWO_WARPGROUPS)."""
    return BM64_TWO_WARPGROUPS[type_name] if two_warpgroups(type_name, bm, dtype) else 2


def kwidth_fence(type_name: str, bm: int, dtype) -> bool:
    """Whether the BM-row tile for x of `dtype` fences its weight tile (gemm.tile_product)."""
    return act_name(dtype) != "fp32" and type_name in KWIDTH_FENCE.get(bm, ())


def swap_ab(type_name: str, bm: int, dtype) -> bool:
    """Whether the BM-row tile for x of `dtype` multiplies w @ x.T (see above). BM = 128 is a
    swapped tile only."""
    return (bm >= 32 and type_name in SWAP_AB_TYPES and act_name(dtype) != "fp32"
            and on_this_triton(SWAP_AB_FROM_TRITON, type_name)
            and not (bm == 128 and type_name in BM128_SPILLS)
            and not (type_name in SWAP_AB_BM32_ONLY and bm > 32))


def gemm_bn(type_name: str, block_size: int, bm: int, dtype) -> int:
    """The default BN of the fused GEMM's (and the expert GEMM's) BM-row tile for x of
    `dtype`: from BM = 32 on 32, or where the tile is swapped (swap_ab) 64, and 128 for
    blocks under 256 weights (a 64-row tile of them left each warp 16 weights an iteration
    against some 90 instructions of the loop's own: sm_90 SASS, fp16 x, Q4_0 at BM = 32
    0.50 -> 0.78 of the bytes' bound, Q8_0 0.75 -> 1.0, IQ4_NL 0.40 -> 0.51; 128 for
    256-weight blocks spills, Q4_K 31 bytes); at BM = 16 wider, by block size and type (see
    above)."""
    if bm == 128:
        return 128 if block_size >= 256 and type_name not in BM128_NARROW else 64
    if bm != 16:
        if not swap_ab(type_name, bm, dtype):
            return 32
        return 128 if block_size < 256 or two_warpgroups(type_name, bm, dtype) else 64
    half = {"fp16": GEMM_M16_BN_F16, "bf16": GEMM_M16_BN_BF16}.get(act_name(dtype), {})
    if type_name in half and on_this_triton(GEMM_M16_WIDE_FROM_TRITON, type_name):
        return half[type_name]
    return GEMM_M16_BN.get(type_name, 64 if block_size >= 256 else 128)


# --- Shared memory of the tensor-core tiles (gemm_kernel, moe_gemm_kernel) ---------------
# What Triton allocates for them (CompiledKernel.metadata.shared, which it checks against the
# device's opt-in limit at the first launch, raising OutOfResources) was measured from AOT
# compiles of every type (scripts/inspect_kernels.py --arch 80,86,89,90,120 --act
# fp16,bf16,fp32): x's BM x BLOCK tile in some buffers, the dequantized weight's BN x BLOCK
# tile once, and per row of BN, per pipeline stage after the first, the planes' loads that
# the pipeline keeps in shared memory (SHARED_ROW_BYTES: a block's bytes, more for the
# lattice types, whose lookups add their own). By how the dot is lowered:
# - float32 x: tl.dot in IEEE float32 runs on FMAs, no tensor cores, at every capability
#   (the same bytes at sm_80 ... sm_120): float32 tiles, x's in num_stages - 1 buffers (one
#   at 1 stage). The BM = 64 tile of a 256-weight block is 96 KB of operands alone: with
#   the planes, 98.5-110 KB for 15 of the 23 types, more than the 99 KB a block may have on
#   sm_86/89/120 (RTX 3090/4090/5090, L40S).
# - float16 / bfloat16 x at sm_90 (wgmma): x's tile in num_stages buffers (wgmma reads it
#   from shared memory), 2 bytes a value.
# - float16 / bfloat16 x elsewhere (mma.sync): at most that of float32 at 2 bytes a value
#   (Triton reuses some of it at sm_80-89 and sm_120: up to 40% less was measured).
# The estimate equals the compiles' count for float32 and sm_90 and bounds the rest (the
# slow test, tests/test_kernels_ptx.py, holds every launched tile to it).
# (With a word a row for each 16-bit scale the dequant function reads in words,
# fields.field16_in_word: those the pipeline now copies ahead too. Q3_K's 116 -> 128 for its
# BM = 16 tile's scales read in 16-bit words, q3_k_half_m16: 49,152 bytes at sm_80-120.)
SHARED_ROW_BYTES = {
    "IQ1_M": 268, "IQ1_S": 276, "IQ2_S": 302, "IQ2_XS": 398, "IQ2_XXS": 452, "IQ3_S": 298,
    "IQ3_XXS": 420, "IQ4_NL": 20, "IQ4_XS": 140, "MXFP4": 16, "NVFP4": 36, "Q2_K": 88,
    "Q3_K": 128, "Q4_0": 20, "Q4_1": 24, "Q4_K": 152, "Q5_0": 24, "Q5_1": 28, "Q5_K": 184,
    "Q6_K": 212, "Q8_0": 36, "TQ1_0": 48, "TQ2_0": 64}


def shared_memory_estimate(type_name: str, block_size: int, bm: int, bn: int, num_stages: int,
                           capability: int, dtype, step_blocks: int = 1) -> int:
    """Bytes of shared memory Triton allocates for a gemm_kernel / moe_gemm_kernel tile, from
    its shape (the model above, for a K step of `step_blocks` blocks: each block's tiles and
    planes its own): never less than a compile measures."""
    act = act_name(dtype)
    size = 4 if act == "fp32" else 2
    # x in num_stages buffers where the MMA reads it from shared memory as it is (wgmma's
    # operand, and the B operand of a swapped tile at every capability: measured)
    swapped = swap_ab(type_name, bm, dtype)
    x_buffers = (num_stages if (capability == 90 and act != "fp32") or swapped
                 else max(1, num_stages - 1))
    pipeline = step_blocks * (size * block_size * (x_buffers * bm + bn)
                              + (num_stages - 1) * bn * SHARED_ROW_BYTES.get(type_name, 512))
    # a swapped tile's float32 accumulator is transposed through shared memory at the end
    # (IQ4_NL's BM = 128 tile at sm_80: 32,768 bytes, more than its pipeline's)
    return max(pipeline, 4 * bm * bn) if swapped else pipeline


def fit_shared_memory(type_name: str, block_size: int, cfg: dict, device: Device, dtype) -> dict:
    """`cfg` (BM, BN, num_stages, STEP_BLOCKS ...) if its estimate fits the device's shared
    memory, else the nearest that does: a K step of fewer blocks first (down to one: the
    step only amortizes the loop's own instructions), then fewer pipeline stages at the same
    BN, then BN halved (down to 16, the dot's least), each BN from the stages asked for
    down. Stages before BN: x's
    tile is the bulk of the bytes (float32 x at BM = 64: 64 KB an iteration, against 4.6 KB
    of Q4_K weights at BN = 32), and each halving of BN doubles how often it is read per
    weight; at 1 stage no loads are kept in shared memory (float32 Q4_K at BM = 64: 96 KB,
    from 100.5). Not timed on a GPU: either way such a tile takes an SM of 100 KB alone.
    The interpreter has no limit; a tile within the limit is kept exactly."""
    if not device.shared_memory:
        return cfg

    def fits(bn, stages, step):
        return shared_memory_estimate(type_name, block_size, cfg["BM"], bn, stages, device.capability,
                                      dtype, step) <= device.shared_memory

    step = cfg.get("STEP_BLOCKS", 1)
    while step > 1 and not fits(cfg["BN"], cfg["num_stages"], step):
        step //= 2
    if "STEP_BLOCKS" in cfg:
        cfg = {**cfg, "STEP_BLOCKS": step}
    bn = cfg["BN"]
    while bn >= 16:
        for stages in range(cfg["num_stages"], 0, -1):
            if fits(bn, stages, step):
                return {**cfg, "BN": bn, "num_stages": stages}
        bn //= 2
    return cfg  # nothing smaller fits either: Triton will say so at launch


def _tuned_tile(kind: str, type_name: str, block_size: int, bm: int, default: dict,
                device: Device, dtype) -> dict:
    """The default tile, or the tuned one of this device and dtype where there is one that
    fits the device (a tile tuned with more shared memory than this GPU has is not used)."""
    tile = {**default, **tuned(device, dtype).get(kind, {}).get(type_name, {})}
    if tile == default or not device.shared_memory or shared_memory_estimate(
            type_name, block_size, bm, tile["BN"], tile["num_stages"], device.capability,
            dtype, tile.get("STEP_BLOCKS", 1)) <= device.shared_memory:
        return tile
    return default


def gemm_config(type_name: str, block_size: int, m: int, n: int, n_blocks: int,
                device: Device, dtype, tile: dict | None = None, bm: int | None = None) -> dict:
    """The fused GEMM's tile on `device` (a Device: device_of, or KNOWN_DEVICES for AOT) for
    x of `dtype`. Its time is the issue of its dequantization, so what counts is
    how many programs run at once and how much of a program's work is its own overhead
    (addresses, barriers, copies): BN = 32 from M = 17 on (BN = 64 left half the SMs idle at
    M = 128 for N = 4096), 2 pipeline stages (3 took Q4_K's tile to 121 KB of shared memory,
    one program per SM, whose MMA then never overlaps another's dequantization). At M <= 16
    a wider tile halves the overhead per weight (BN = 64, or 128 for blocks under 256
    weights, whose tiles are small) and split K restores the programs it takes away: K is
    split (in a power of two that divides the block columns) up to 2 programs an SM, not
    beyond: each split adds M x N float32 atomics (a tile's PROGRAMS_PER_SM says another
    count: the tuner's candidates). From BM = 32 on the swapped tile (swap_ab)
    is BN = 64, or 128 (gemm_bn; at BM = 128 and 256-weight blocks, over two warpgroups).
    A K step takes gemm_step_blocks block columns. `tile` (BN, num_warps, num_stages,
    STEP_BLOCKS) replaces the default as given (the tuner's
    candidates); else the tuned one (tuned_configs.json) where it fits; the result is fitted
    to the device's shared memory (fit_shared_memory: float32 x's BM = 64 tile of 256-weight
    blocks does not fit the 99 KB of sm_86/89/120). The tile's BM (16, 32, 64 or 128): `bm`, or
    `tile`'s "BM" (the tuner's pin: a tile of only BM is that BM's default), else the one the
    estimate's rule picks at this M (gemm_bm)."""
    if tile is not None and "BM" in tile:
        bm = bm or tile["BM"]
        tile = {k: v for k, v in tile.items() if k != "BM"} or None
    bm = bm or gemm_bm(type_name, block_size, m)
    if bm == 128 and not swap_ab(type_name, bm, dtype):
        bm = 64  # BM = 128 is a swapped tile only (swap_ab): float32 x takes BM = 64 there
    bn = gemm_bn(type_name, block_size, bm, dtype)
    default = {"BN": bn, "num_warps": tile_warps(type_name, bm, bn, dtype),
               "num_stages": tile_stages(type_name, bm, dtype),
               "STEP_BLOCKS": gemm_step_blocks(block_size)}
    if tile is not None:
        cfg = {"BM": bm, **default, **tile}
    else:
        cfg = fit_shared_memory(type_name, block_size, {"BM": bm, **_tuned_tile(
            f"gemm_bm{bm}", type_name, block_size, bm, default, device, dtype)}, device, dtype)
    programs_per_sm = cfg.get("PROGRAMS_PER_SM", 2)
    cfg = {k: v for k, v in cfg.items() if k != "PROGRAMS_PER_SM"}
    # the step (the default's, or a tile's own: the tuner's, tuned for another K) divides K
    cfg["STEP_BLOCKS"] = step = dividing_step(cfg["STEP_BLOCKS"], n_blocks)
    steps = n_blocks // step
    tiles = -(-m // bm) * -(-n // cfg["BN"])
    return {**cfg, "SPLIT_K": gemm_split_k(tiles, steps, programs_per_sm, device.sms)}


# The last wave of programs: a split that leaves it this much emptier than the next split's
# is passed over (see gemm_split_k)
WAVE_GAIN = 0.05


def wave_fill(programs: int, sms: int) -> float:
    """The busiest SM's share of the work when `programs` equal programs spread over `sms`:
    programs / (sms x ceil(programs / sms)). 224 programs on 132 SMs: 0.85 (92 SMs run two,
    40 one); 896: 0.97."""
    return programs / (sms * -(-programs // sms))


def gemm_split_k(tiles: int, steps: int, programs_per_sm: int, sms: int) -> int:
    """The fused GEMM's split of K (a power of two dividing its `steps` K steps): doubled while
    the `tiles` output tiles times it stay within `programs_per_sm` programs an SM (2 by
    default: one program's MMA runs while another dequantizes), then doubled further, up to
    4x that many programs, where the last wave fills the SMs better by WAVE_GAIN or more
    (the time is the busiest SM's: wave_fill). 4096 x 4096 at BM = 16 (32 tiles of BN = 128):
    8, 256 programs, 0.97 of the SMs' work; 14336 x 4096 (112 tiles): 2 would run 224
    programs, the busiest SM 2 of them where the average is 1.7 (0.85), 8 runs 896 (0.97).
    Each split adds M x N float32 partial sums, added atomically in L2 (split_k.py): K is
    split at all only while tiles <= 2 x programs_per_sm x sms, which bounds the workspace
    (dispatch.py) to M x N of such products."""
    split_k = 1
    while tiles * split_k * 2 <= programs_per_sm * sms and steps % (2 * split_k) == 0:
        split_k *= 2
    return split_for_the_last_wave(split_k, tiles, 4 * programs_per_sm * sms, sms,
                                   lambda split: steps % split == 0)


def split_for_the_last_wave(split_k: int, tiles: int, most_programs: int, sms: int, allowed) -> int:
    """`split_k` doubled, while `tiles` x it stays within `most_programs` and allowed(split) holds,
    to the split whose last wave fills the SMs best, by WAVE_GAIN or more over the one before
    (wave_fill): the fused GEMM's split (gemm_split_k; the GEMV's is gemv_split)."""
    best, more = split_k, split_k * 2
    while tiles * more <= most_programs and allowed(more):
        if wave_fill(tiles * more, sms) >= wave_fill(tiles * best, sms) + WAVE_GAIN:
            best = more
        more *= 2
    return best


# The weights a K step of the fused GEMM and the expert tiles takes (gemm.py's STEP_BLOCKS):
# 128, four blocks of 32 weights or two of 64 (256-weight blocks take one). A step of one
# 32-weight block left its program a 2.3 KB load of Q4_0's planes in flight a stage (at BN =
# 128) and some 90 warp-instructions of the loop's own (addresses, the pipeline's waits, the
# MMA's fences) for 32 weights. The H200's timings (BENCHMARKS.md "GPU") took about a
# microsecond a K step for Q4_0's BM = 16 tile, whatever the M: one latency a step. sm_90
# SASS, fp16 x, the fraction of the bytes' bound the loop's issue allows at 1 -> 4 blocks a
# step: Q4_0 BM = 16 / 32 / 64 0.92 / 0.80 / 0.76 -> 1.0 / 0.92 / 0.91, Q8_0 1.0 (0.17 ->
# 0.13 instructions a byte), Q5_0 0.70 -> 0.77-0.84, IQ4_NL 0.50-0.57 -> 0.54-0.65; NVFP4
# (64 weights) at 2 blocks 0.51-0.53 -> 0.53-0.59; no spills (BENCHMARKS.md "K steps").
GEMM_STEP_WEIGHTS = 128


def gemm_step_blocks(block_size: int) -> int:
    """Block columns a K step of the fused GEMM (and of the expert tiles) takes: GEMM_STEP_WEIGHTS
    of weights (gemm_config and moe_config fit it to the weight's block columns)."""
    return max(1, GEMM_STEP_WEIGHTS // block_size)


def dividing_step(step: int, n_blocks: int) -> int:
    """`step` (a power of two), or the largest power of two below it that divides `n_blocks`."""
    while n_blocks % step:
        step //= 2
    return step


# The dot GEMV (gemv_dot_kernel, at the M matmul_choice takes it). Each thread owns ROWS rows
# (BN = 128 x ROWS, 4 warps):
# every x value a thread loads serves all its rows, so more rows mean fewer instructions
# per weight byte, more registers and fewer programs. A 256-weight block can be taken in
# PARTS calls, each a loop iteration, which keeps the registers of more rows in bounds.
# Chosen from scripts/inspect_kernels.py --sass (instructions per byte under the H200
# budget, registers under 128 so that 4 programs fit an SM, no spills); the defaults are
# 4 rows, whole blocks.
GEMV_ROWS = {"Q2_K": 2, "Q3_K": 1, "Q4_K": 2, "Q5_K": 2, "Q6_K": 2, "TQ1_0": 1, "TQ2_0": 2,
             **dict.fromkeys(["IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S"], 2)}
GEMV_PARTS = {"IQ4_XS": 4, "IQ1_M": 2}
# From M = 2 on a program takes XR rows of x (gemv.gemv_dot_rows): 2 at M = 2, else 4. The
# weights are loaded and unpacked once for them all, so an x row more costs its x loads and
# multiply-adds only (Q2_K's GEMV at sm_90, loop instructions a weight row and x row: 2.5 at
# one x row a program, 1.95 at 2, 1.6 at 4; IQ2_XXS 4.8, 3.2, 2.3; BENCHMARKS.md "x rows a
# GEMV program"). XR accumulators a weight row want registers: then ROWS = GEMV_XR_ROWS, 1
# unless 2 issued less at both XR without a spill (sm_90; 2 spilled in every K-quant's loop
# but Q2_K's and Q3_K's, and in the grid types')
GEMV_XR_ROWS = dict.fromkeys(["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_XS", "IQ1_M", "TQ2_0"], 2)
# Fewer x rows where more spilled, by compute capability (ptxas for sm_80, Triton 3.9; sm_86,
# 89, 90 and 120 spilled none at 4): at 4, Q4_K, Q5_K, Q6_K and TQ1_0 spilled 239-3176 bytes
# in the K loop, IQ1_M and IQ4_XS 3-4 bytes outside it; at 2, Q6_K 14 and TQ1_0 82 in the loop
GEMV_X_ROWS_MAX = {80: {**dict.fromkeys(["Q4_K", "Q5_K", "IQ1_M", "IQ4_XS"], 2), "Q6_K": 1, "TQ1_0": 1}}


def gemv_x_rows(m: int, type_name: str = "", capability: int = 90) -> int:
    """Rows of x a GEMV program takes at M rows of x: 1, 2 at M = 2, else 4, at most
    GEMV_X_ROWS_MAX's for the type on a GPU of that compute capability."""
    rows = 1 if m <= 1 else 2 if m == 2 else 4
    return min(rows, GEMV_X_ROWS_MAX.get(capability, {}).get(type_name, 4))


def gemv_dot_config(type_name: str, m: int, n: int, n_blocks: int, device: Device, dtype,
                    tile: dict | None = None, x_rows: int | None = None) -> dict:
    """The dot GEMV at M rows of x (a program each) on `device`: BN rows a program, PARTS
    calls a block column, and the split of K (with, at one row of x, the rows a thread) that
    leaves the busiest SM the least work (gemv_split). `tile` (ROWS, PARTS, num_warps, and
    PROGRAMS_PER_SM or SPLIT_K where it says), else the one tuned for this device and x's
    dtype, replaces the default. No tl.dot: its shared memory is a few KB at most (the tests'
    AOT compiles), nothing to fit."""
    given = tile or tuned(device, dtype).get("gemv", {}).get(type_name, {})
    cfg = {"ROWS": GEMV_ROWS.get(type_name, 4), "PARTS": GEMV_PARTS.get(type_name, 1), "num_warps": 4,
           "PROGRAMS_PER_SM": 2, **given}
    x_rows = x_rows or cfg.get("XR", gemv_x_rows(m, type_name, device.capability))
    if x_rows > 1 and "XR" not in given:  # a tile for one x row a program (the tuner's, M = 1)
        cfg["ROWS"] = GEMV_XR_ROWS.get(type_name, 1)
    groups = -(-m // x_rows)
    warps, parts, rows = cfg["num_warps"], cfg["PARTS"], cfg["ROWS"]
    steps = n_blocks * parts
    if "SPLIT_K" in cfg:  # a tile that says (the tuner's K-whole candidates)
        split_k = max(1, min(cfg["SPLIT_K"], steps))
    else:
        # one row a thread is the other choice at one row of x, where the rows are the
        # default's (GEMV_ROWS) and not a tile's
        fewer_rows = x_rows == 1 and rows > 1 and "ROWS" not in given
        rows, split_k = gemv_split(n, groups, steps, 32 * warps, (rows, 1) if fewer_rows else (rows,),
                                   cfg["PROGRAMS_PER_SM"], device.sms)
    return {"BN": 32 * warps * rows, "PARTS": parts, "SPLIT_K": split_k, "num_warps": warps,
            "STAGES": cfg.get("STAGES", 1), "XR": x_rows}


# The GEMV's split of K, by the busiest SM's work in its K loop (the estimate's issue,
# aot._issue_seconds): its programs x a program's K steps x the rows a program. Enough
# programs for the GPU first (PROGRAMS_PER_SM an SM, 2 by default: one's loads in flight
# while another computes; or K split whole), at most 4 times that, the fewest programs among
# equals: 4096 x 4096 in Q4_0 (8 tiles of 512 rows) in 64, 512 programs; the FFN's 14336
# rows (28 tiles) in 32 (896 programs, 7 an SM, 0.97 of the busiest's work the average's,
# where 16 left 4 on the busiest for 3.4). Splits are powers of two, and the K steps halved
# while even: every program the same K steps where K is not a power of two's blocks.
# Qwen3-30B-A3B's expert down stack (2048 x 768) at one token, 8 pairs: Q4_0's 24 block
# columns in 16 left 4 programs of 2 steps on the busiest SM (0.73 of it the average's),
# 12 leaves 3 (0.97). Q4_K's 3 columns of 256-row tiles (2 a thread): 192 programs, 2 of
# one step on the busiest (0.73), at any split; with one row a thread, 384 programs of 128
# rows, 3 on the busiest (0.97). A row at one row a thread costs more instructions in the K
# loop: GEMV_ONE_ROW_COST, an eighth (sm_90, the expert GEMV: the 256-weight block types
# taken whole 0.96-1.15 times a row, Q4_K 1035 for 128 rows against 1968 for 256; IQ4_XS, 4
# parts a block, and the 32-weight types up to 1.19, 1.33 with int8 x and a table, IQ4_NL and
# MXFP4, but their K steps are many and split evenly: BENCHMARKS.md "The GEMV's split by the
# busiest SM"). A choice with more programs is taken for WAVE_GAIN or more less work only.
GEMV_ONE_ROW_COST = 1.125


def gemv_splits(steps: int) -> list[int]:
    """The splits of `steps` K steps the GEMV may take: the powers of two up to it, and it
    halved while even (24: 1, 2, 4, 8, 16 and 24, 12, 6, 3)."""
    splits = {1 << j for j in range(steps.bit_length())}
    while True:
        splits.add(steps)
        if steps % 2:
            return sorted(splits)
        steps //= 2


def gemv_split(n: int, groups: int, steps: int, threads: int, rows_choices: tuple, programs_per_sm: int,
               sms: int) -> tuple[int, int]:
    """(rows a thread, split of K) for the GEMV of `n` rows, `groups` programs a weight tile
    before the split (rows of x by XR, or expert pairs), `steps` K steps (block columns x
    PARTS), `threads` a program, rows a thread from `rows_choices` (the first the default):
    the least busiest-SM work (above), more programs for WAVE_GAIN less work only."""
    candidates = []
    for rows in rows_choices:
        tiles = -(-n // (threads * rows))
        enough = min(programs_per_sm * sms, tiles * groups * steps)  # K split whole at most
        for split in gemv_splits(steps):
            programs = tiles * groups * split
            if enough <= programs and (split == 1 or programs <= 4 * programs_per_sm * sms):
                work = -(-programs // sms) * -(-steps // split) * threads * rows
                cost = 1 if rows == rows_choices[0] else GEMV_ONE_ROW_COST
                candidates.append((programs, work * cost, rows, split))
    candidates.sort()
    best = candidates[0]
    for cand in candidates[1:]:
        if cand[1] <= best[1] * (1 - WAVE_GAIN):
            best = cand
    return best[2], best[3]


# The expert products (moe.py) take, by the rows the experts chosen get on average
# (routed_rows_per_expert), a GEMV a (token, slot) pair or BM-row tiles of one expert each.
# Each pair's GEMV reads its expert's weights again (the pairs of one expert lie apart in the
# launch), where a tile reads them once for up to BM rows but issues a BM-row tile's
# dequantization. Which one, and which BM, is the estimate's (aot.expert_path_estimates;
# scripts/estimate_paths.py --experts --write-configs: MOE_RULE, (largest rows, choice)
# pairs, one rule by type fitted to Qwen3-30B-A3B's and DeepSeek-V3's expert stacks at 1-512
# tokens, BENCHMARKS.md "Expert products by rows an expert"); the types it has not covered
# take MOE_DEFAULT_RULE. One token's experts (a row each) always take the GEMV: decode at
# batch 1, as the dense rule keeps the GEMV at M = 1.
MOE_DEFAULT_RULE = ((1.0, "gemv"), (16, "tiles_bm16"), (32, "tiles_bm32"), (None, "tiles_bm64"))

# BEGIN estimate_paths --experts --write-configs
MOE_RULE: dict[str, tuple] = {
    'IQ1_M': (
        (1.24, 'gemv'),
        (2.302, 'gemv_x2'),
        (4.07, 'gemv_x4'),
        (8.003, 'tiles_bm16'),
        (32.001, 'tiles_bm32'),
        (None, 'tiles_bm64'),
    ),
    'IQ1_S': (
        (1.256, 'gemv'),
        (2.302, 'gemv_x2'),
        (4.07, 'gemv_x4'),
        (8.003, 'tiles_bm16'),
        (32.001, 'tiles_bm32'),
        (None, 'tiles_bm64'),
    ),
    'IQ2_S': (
        (1.256, 'gemv'),
        (1.568, 'gemv_x2'),
        (2.302, 'gemv_x4'),
        (8.003, 'tiles_bm16'),
        (32.001, 'tiles_bm32'),
        (None, 'tiles_bm64'),
    ),
    'IQ2_XS': (
        (1.256, 'gemv'),
        (1.568, 'gemv_x2'),
        (4.07, 'gemv_x4'),
        (8.003, 'tiles_bm16'),
        (32.001, 'tiles_bm32'),
        (None, 'tiles_bm64'),
    ),
    'IQ2_XXS': (
        (1.256, 'gemv'),
        (1.568, 'gemv_x2'),
        (4.07, 'gemv_x4'),
        (8.003, 'tiles_bm16'),
        (32.001, 'tiles_bm32'),
        (None, 'tiles_bm64'),
    ),
    'IQ3_S': (
        (1.115, 'gemv'),
        (1.568, 'gemv_x2'),
        (4.07, 'gemv_x4'),
        (8.003, 'tiles_bm16'),
        (32.001, 'tiles_bm32'),
        (None, 'tiles_bm64'),
    ),
    'IQ3_XXS': (
        (1.24, 'gemv'),
        (1.568, 'gemv_x2'),
        (4.07, 'gemv_x4'),
        (8.003, 'tiles_bm16'),
        (32.001, 'tiles_bm32'),
        (None, 'tiles_bm64'),
    ),
    'IQ4_NL': (
        (1.115, 'gemv'),
        (1.568, 'gemv_x2'),
        (8.003, 'tiles_bm16'),
        (16.001, 'tiles_bm32'),
        (None, 'tiles_bm64'),
    ),
    'IQ4_XS': (
        (1.115, 'gemv'),
        (1.568, 'gemv_x2'),
        (8.003, 'tiles_bm16'),
        (16.001, 'tiles_bm32'),
        (None, 'tiles_bm64'),
    ),
    'MXFP4': (
        (1.24, 'gemv'),
        (1.568, 'gemv_x2'),
        (8.003, 'tiles_bm16'),
        (16.001, 'tiles_bm32'),
        (None, 'tiles_bm64'),
    ),
    'NVFP4': ((1.099, 'gemv'), (1.568, 'gemv_x2'), (16.001, 'tiles_bm32'), (None, 'tiles_bm64')),
    'Q2_K': ((1.0, 'gemv'), (2.302, 'gemv_x2'), (8.003, 'tiles_bm16'), (None, 'tiles_bm64')),
    'Q3_K': (
        (1.0, 'gemv'),
        (1.568, 'gemv_x2'),
        (4.07, 'gemv_x4'),
        (8.003, 'tiles_bm16'),
        (16.001, 'tiles_bm32'),
        (None, 'tiles_bm64'),
    ),
    'Q4_0': ((1.016, 'gemv'), (8.003, 'tiles_bm16'), (16.001, 'tiles_bm32'), (None, 'tiles_bm64')),
    'Q4_1': ((1.016, 'gemv'), (8.003, 'tiles_bm16'), (16.001, 'tiles_bm32'), (None, 'tiles_bm64')),
    'Q4_K': ((1.115, 'gemv'), (16.001, 'tiles_bm32'), (None, 'tiles_bm64')),
    'Q5_0': ((1.0, 'gemv'), (8.003, 'tiles_bm16'), (16.001, 'tiles_bm32'), (None, 'tiles_bm64')),
    'Q5_1': ((1.0, 'gemv'), (8.003, 'tiles_bm16'), (16.001, 'tiles_bm32'), (None, 'tiles_bm64')),
    'Q5_K': ((1.0, 'gemv'), (8.003, 'tiles_bm16'), (16.001, 'tiles_bm32'), (None, 'tiles_bm64')),
    'Q6_K': ((1.0, 'gemv'), (8.003, 'tiles_bm16'), (16.001, 'tiles_bm32'), (None, 'tiles_bm64')),
    'Q8_0': ((1.0, 'gemv'), (16.001, 'tiles_bm32'), (None, 'tiles_bm64')),
    'TQ1_0': ((1.099, 'gemv'), (8.003, 'tiles_bm16'), (None, 'tiles_bm64')),
    'TQ2_0': ((1.0, 'gemv'), (1.568, 'gemv_x2'), (16.001, 'tiles_bm16'), (None, 'tiles_bm64')),
}
# END estimate_paths --experts --write-configs


def moe_choice(type_name: str, rows_per_expert: float) -> str:
    """"gemv", "gemv_x<XR>" or "tiles_bm<BM>": how the expert products of `type_name` run when
    the experts chosen get `rows_per_expert` rows on average (MOE_RULE, else
    MOE_DEFAULT_RULE): the GEMV a (token, slot) pair, the GEMV on XR of an expert's rows a
    program (the pairs sorted by expert into tiles of XR slots: moe.moe_gemv_rows_kernel),
    or the tensor-core tiles."""
    if rows_per_expert <= 1.0:
        return "gemv"
    rule = MOE_RULE.get(type_name, MOE_DEFAULT_RULE)
    return next(choice for top, choice in rule if top is None or rows_per_expert <= top)


def moe_gemv_x_rows(type_name: str, rows_per_expert: float, capability: int = 90) -> int:
    """The rows of x an expert GEMV program takes (1: a (token, slot) pair; 2 or 4: that many
    of an expert's slots), by moe_choice, at most GEMV_X_ROWS_MAX's for the type on a GPU of
    that compute capability (the dense GEMV's cap: the same loop); 1 where it names a tile."""
    choice = moe_choice(type_name, rows_per_expert)
    if not choice.startswith("gemv_x"):
        return 1
    return gemv_x_rows(int(choice[len("gemv_x"):]), type_name, capability)  # (2 -> 2, 4 -> 4, capped)


# The largest batch (in tokens) vLLM captures in CUDA graphs by default (its
# max_capture_size, 512). Up to it the expert products read nothing of the routing on the
# host: the path, the tile and the launch grid come from the shapes (dispatch.expert_path).
# Past it (prefill, run without graphs) long runs an expert take the dequantize-then-matmul
# path, which loops over the chosen experts on the host.
MOE_GRAPH_MAX_TOKENS = 512


def experts_chosen(tokens: int, top: int, n_experts: int) -> float:
    """The experts that `tokens` tokens choose between them, `top` distinct ones each, on
    average were each token's chosen uniformly at random: E (1 - (1 - top / E)^tokens)."""
    if tokens == 0 or top == 0:
        return 0.0
    if tokens == 1 or top >= n_experts:
        return float(min(top, n_experts))
    return n_experts * -math.expm1(tokens * math.log1p(-top / n_experts))


def routed_rows_per_expert(tokens: int, top: int, n_experts: int) -> float:
    """The rows an expert that any token chose gets on average: tokens x top / experts_chosen
    (1 for one token), `n_experts` the experts the router chooses among (the model's: under
    expert parallelism a local expert gets what any expert gets; top is capped at it, a row
    an expert a token at most). From the shapes alone (the real routing would need the host
    to read it): one batch size, one path and tile, whatever the routing. Routing is seldom
    uniform; the estimate only picks between tiles that are each right for every routing."""
    top = min(top, n_experts)
    chosen = experts_chosen(tokens, top, n_experts)
    return tokens * top / chosen if chosen else 0.0


@cache
def expert_tiles(tokens: int, top: int, n_experts: int, bm: int) -> float:
    """The BM-row tiles the expert sort makes (moe.py: ceil(rows / BM) an expert chosen), on
    average over routings in which each token picks `top` distinct experts of `n_experts`
    uniformly: an expert's rows are Binomial(tokens, top / E). From the shapes alone, as
    routed_rows_per_expert: what the expert tiles' split of K is chosen for (moe_config) and
    what the estimate counts (aot.expert_path_estimates)."""
    p = min(1.0, top / n_experts)
    if p >= 1.0:
        return n_experts * -(-tokens // bm)
    mean = tokens * p
    top_x = min(tokens, int(mean + 12 * math.sqrt(mean * (1 - p)) + 2 * bm + 1))
    log_p, log_q = math.log(p), math.log1p(-p)
    expected = 0.0
    for x in range(1, top_x + 1):
        log_pmf = (math.lgamma(tokens + 1) - math.lgamma(x + 1) - math.lgamma(tokens - x + 1)
                   + x * log_p + (tokens - x) * log_q)
        expected += math.exp(log_pmf) * -(-x // bm)
    return n_experts * expected


def moe_config(type_name: str, block_size: int, rows_per_expert: float, device: Device,
               dtype, n_blocks: int | None = None, bm: int | None = None, n: int | None = None,
               routing: tuple[int, int, int] | None = None) -> dict:
    """The expert GEMM's tile (moe.py) on `device` for x of `dtype`: of BM `bm`, else the BM
    moe_choice names at the routed rows an expert gets on average (from shapes alone: no data
    is read; where it names the GEMV, BM by rows: 16 up to 16, 32 up to 32, else 64), up to
    dequantize_matmul_min_m rows an expert, where prefill's long runs take each chosen expert
    dequantized, then torch.matmul (dispatch.expert_matmul); a tile's padding rows cost issue
    but no weight bytes. The tile is the dense GEMM's of the same BM, its K step too
    (`n_blocks`: the expert's block columns, None for a K step of GEMM_STEP_WEIGHTS), fitted
    to the device's shared memory alike (the expert kernel allocates what gemm_kernel does:
    measured).

    SPLIT_K as the dense GEMM's (gemm_split_k), for the output tiles the sort makes on
    average (`routing`: tokens, top, the router's experts; expert_tiles x ceil(n / BN)): at a
    few tokens the experts' tiles are too few for the SMs (Qwen3-30B-A3B's gate_up stack at 2
    tokens: some 16 tiles of 12 BN-column programs, 192 on 132 SMs, the busiest SM two
    programs' K loops where the average is 1.45). Without `routing` (or `n`): 1. Not timed on
    a GPU yet."""
    if bm is None:
        choice = moe_choice(type_name, rows_per_expert)
        bm = int(choice[len("tiles_bm"):]) if choice.startswith("tiles_bm") else \
            16 if rows_per_expert <= 16 else 32 if rows_per_expert <= 32 else 64
    bn = gemm_bn(type_name, block_size, bm, dtype)
    step = gemm_step_blocks(block_size)
    if n_blocks is not None:
        step = dividing_step(step, n_blocks)
    cfg = fit_shared_memory(type_name, block_size, {"BM": bm, "BN": bn, "num_warps": tile_warps(type_name, bm, bn, dtype),
                                                     "num_stages": tile_stages(type_name, bm, dtype),
                                                     "STEP_BLOCKS": step}, device, dtype)
    split_k = 1
    if routing is not None and n is not None and n_blocks is not None:
        tiles = math.ceil(expert_tiles(*routing, cfg["BM"])) * -(-n // cfg["BN"])
        split_k = gemm_split_k(tiles, n_blocks // cfg["STEP_BLOCKS"], 2, device.sms)
    return {**cfg, "SPLIT_K": split_k}
