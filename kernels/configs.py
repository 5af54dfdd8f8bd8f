"""Launch configurations, kept apart from the kernels. Defaults are chosen by block size
(256-weight blocks make 8x wider tiles than 32-weight ones); GPU measurements
(scripts/bench_gpu.py) are what should tune them."""

from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path

# Tiles measured on a GPU: scripts/tune_kernels.py (which scripts/gpu_check.py runs) times the
# candidates below for each type side by side, checks each against the default tile's result,
# and writes the fastest as tuned_configs.json; committed here, it replaces the default tile
# of the types and tile kinds it names (the split-K rule still fits K to the GPU's SMs). None
# is committed yet: no GPU has run the tuner.
TUNED_CONFIGS = Path(__file__).with_name("tuned_configs.json")


def tuned() -> dict:
    """{tile kind: {type: tile}} from the tuner's file, {} without one. Tile kinds: "gemv"
    (ROWS, PARTS, num_warps) and "gemm_bm16", "gemm_bm32", "gemm_bm64" (BN, num_warps,
    num_stages)."""
    return _tiles(TUNED_CONFIGS)


@cache
def _tiles(path: Path) -> dict:
    return json.loads(path.read_text())["tiles"] if path.exists() else {}


# What the tuner tries (each candidate is a compile on first use: the sets are small)
GEMV_CANDIDATES = [{"ROWS": rows, "PARTS": parts, "num_warps": 4}
                   for rows in (1, 2, 4) for parts in (1, 2, 4)]
GEMM_CANDIDATES = {
    16: [{"BN": bn, "num_warps": 4, "num_stages": st} for bn in (32, 64, 128) for st in (2, 3)],
    32: [{"BN": bn, "num_warps": 4, "num_stages": st} for bn in (32, 64) for st in (2, 3)],
    64: [{"BN": bn, "num_warps": w, "num_stages": 2} for bn in (32, 64, 128) for w in (4, 8)]}


# Three paths for x @ W.T, by M (dispatch.matmul_path): up to GEMV_MAX_M the GEMV family
# (split-K, no tensor cores: the weight read is the whole cost); then the fused GEMM family
# (tensor cores, each weight tile dequantized once per BM rows of x); from
# dequantize_matmul_min_m on, the weight dequantized once, into x's dtype, by the dequantize
# family, then torch.matmul (cuBLAS).
GEMV_MAX_M = 8


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


def gemm_config(type_name: str, block_size: int, m: int, n: int, n_blocks: int,
                sms: int, tile: dict | None = None) -> dict:
    """The fused GEMM's tile. Its time is the issue of its dequantization, so what counts is
    how many programs run at once and how much of a program's work is its own overhead
    (addresses, barriers, copies): BN = 32 from M = 17 on (BN = 64 left half the SMs idle at
    M = 128 for N = 4096), 2 pipeline stages (3 took Q4_K's tile to 121 KB of shared memory,
    one program per SM, whose MMA then never overlaps another's dequantization). At M <= 16
    a wider tile halves the overhead per weight (BN = 64, or 128 for blocks under 256
    weights, whose tiles are small) and split K restores the programs it takes away: K is
    split (in a power of two that divides the block columns) up to 2 programs an SM, not
    beyond: each split adds M x N float32 atomics. Larger tiles (BM = 128, 8 warps) cut the
    instructions per MMA but leave SMs idle below M = 256 (BENCHMARKS.md, "GEMM paths").
    `tile` (BN, num_warps, num_stages), else the tuned one (tuned_configs.json), replaces the
    default."""
    bm = 16 if m <= 16 else 32 if m <= 32 else 64
    bn = GEMM_M16_BN.get(type_name, 64 if block_size >= 256 else 128) if bm == 16 else 32
    cfg = {"BN": bn, "num_warps": 4, "num_stages": 2,
           **(tile or tuned().get(f"gemm_bm{bm}", {}).get(type_name, {}))}
    tiles = -(-m // bm) * -(-n // cfg["BN"])
    split_k = 1
    while tiles * split_k * 2 <= 2 * sms and n_blocks % (2 * split_k) == 0:
        split_k *= 2
    return {"BM": bm, **cfg, "SPLIT_K": split_k}


# The dot GEMV (gemv_dot_kernel, M <= GEMV_MAX_M). Each thread owns ROWS rows (BN = 128 x ROWS, 4 warps):
# every x value a thread loads serves all its rows, so more rows mean fewer instructions
# per weight byte, more registers and fewer programs. A 256-weight block can be taken in
# PARTS calls, each a loop iteration, which keeps the registers of more rows in bounds.
# Chosen from scripts/inspect_kernels.py --sass (instructions per byte under the H200
# budget, registers under 128 so that 4 programs fit an SM, no spills); the defaults are
# 4 rows, whole blocks.
GEMV_ROWS = {"Q2_K": 2, "Q3_K": 1, "Q4_K": 2, "Q5_K": 2, "Q6_K": 2, "TQ1_0": 1, "TQ2_0": 2,
             **dict.fromkeys(["IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S"], 2)}
GEMV_PARTS = {"IQ4_XS": 4, "IQ1_M": 2}


def gemv_dot_config(type_name: str, m: int, n: int, n_blocks: int, sms: int,
                    tile: dict | None = None) -> dict:
    """The dot GEMV at M rows of x (a program each): BN rows a program, PARTS calls a block
    column, split K until about 2 programs per SM (a small matrix at batch 1 still fills the
    GPU). `tile` (ROWS, PARTS, num_warps), else the tuned one, replaces the default."""
    cfg = {"ROWS": GEMV_ROWS.get(type_name, 4), "PARTS": GEMV_PARTS.get(type_name, 1), "num_warps": 4,
           **(tile or tuned().get("gemv", {}).get(type_name, {}))}
    warps, parts = cfg["num_warps"], cfg["PARTS"]
    bn = 32 * warps * cfg["ROWS"]
    tiles = -(-n // bn)
    split_k = 1
    while tiles * split_k * m < 2 * sms and split_k * 2 <= n_blocks * parts:
        split_k *= 2
    return {"BN": bn, "PARTS": parts, "SPLIT_K": split_k, "num_warps": warps}


# The expert products (moe.py) run as GEMVs, a program per (token, slot) pair, while experts
# get at most this many rows on average: as the dense GEMV up to GEMV_MAX_M rows, each row
# re-reads its expert's weights (from L2 when they repeat), where a tile would dequantize
# them once for up to 16 rows at 0.46-1.0 of the bandwidth (its issue bound at sm_90,
# BENCHMARKS.md); decode (a few tokens, k experts each) is this path.
MOE_GEMV_MAX_ROWS = GEMV_MAX_M

# The largest batch (in tokens) vLLM captures in CUDA graphs by default (its
# max_capture_size, 512). Up to it the expert products read nothing of the routing on the
# host: the path, the tile and the launch grid come from the shapes (dispatch.expert_path).
# Past it (prefill, run without graphs) long runs an expert take the dequantize-then-matmul
# path, which loops over the chosen experts on the host.
MOE_GRAPH_MAX_TOKENS = 512


def routed_rows_per_expert(pairs: int, n_experts: int) -> float:
    """The rows an expert that any pair chose gets on average, were the (token, slot) pairs
    routed uniformly at random: pairs / E[experts chosen], E[chosen] = E (1 - (1 - 1/E)^pairs).
    From the shapes alone (the real routing would need the host to read it): one batch size,
    one path and tile, whatever the routing. Routing is seldom uniform; the estimate only
    picks between tiles that are each right for every routing."""
    if pairs == 0:
        return 0.0
    chosen = n_experts * -math.expm1(pairs * math.log1p(-1 / n_experts)) if n_experts > 1 else 1.0
    return pairs / max(chosen, 1.0)


def moe_config(type_name: str, block_size: int, rows_per_expert: float) -> dict:
    """The expert GEMM's tile (moe.py), by the routed rows an expert gets on average: at
    decode (a few) the fused GEMM's M <= 16 tile, whose padding rows cost issue but no weight
    bytes; for longer runs the BM = 32 / 64 tiles, up to dequantize_matmul_min_m rows an
    expert, where prefill's long runs take each chosen expert dequantized, then torch.matmul
    (dispatch.expert_matmul). No split K: the experts' tiles are the parallelism. Not
    measured on a GPU yet."""
    bm = 16 if rows_per_expert <= 16 else 32 if rows_per_expert <= 32 else 64
    bn = GEMM_M16_BN.get(type_name, 64 if block_size >= 256 else 128) if bm == 16 else 32
    return {"BM": bm, "BN": bn, "num_warps": 4, "num_stages": 2}
