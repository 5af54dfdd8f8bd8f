"""Launch configurations, kept apart from the kernels. Defaults are chosen by block size
(256-weight blocks make 8x wider tiles than 32-weight ones); GPU measurements
(scripts/bench_gpu.py) are what should tune them."""

from __future__ import annotations

# M up to this uses the GEMV family (split-K, no tensor cores), above it the GEMM family.
GEMV_MAX_M = 8


def dequantize_config(block_size: int) -> dict:
    # 32 rows of a wider block still give each thread 8+ contiguous bytes of a quant plane
    # (vector loads; seen in the PTX for NVFP4 and TQ1_0, which get scalar ones at 16 rows)
    return {"BN": 64 if block_size <= 32 else 32, "num_warps": 4}


def embedding_config(block_size: int) -> dict:
    return {"BI": 16 if block_size <= 32 else 4, "num_warps": 4}


def gemv_config(block_size: int, n: int, n_blocks: int, sms: int) -> dict:
    """Split K over block columns until the grid has about 4 programs per multiprocessor:
    a small matrix at batch 1 still fills the GPU."""
    bn = 64 if block_size <= 32 else 32
    tiles = -(-n // bn)
    split_k = 1
    while tiles * split_k < 4 * sms and split_k * 2 <= n_blocks:
        split_k *= 2
    return {"BN": bn, "SPLIT_K": split_k, "num_warps": 4}


def gemm_config(block_size: int, m: int) -> dict:
    bm = 16 if m <= 16 else 32 if m <= 32 else 64
    return {"BM": bm, "BN": 64 if block_size <= 32 else 32, "num_warps": 4}
