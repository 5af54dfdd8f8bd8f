"""The baseline for the benchmarks: GEMV kernels that read GGUF's own array-of-blocks bytes,
[N, B, type_size] per weight, as engines do today. Same tiling and arithmetic as the rp1
GEMV family (kernels/gemv.py); only the addressing differs, so a timing difference is the
layout's. Q4_0 and Q8_0 only (benchmark use, not part of the package)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _f16_at(ptr, mask):
    """A float16 stored at an address with no alignment promise: two byte loads."""
    lo, hi = tl.split(tl.load(ptr[:, None] + tl.arange(0, 2)[None, :], mask=mask[:, None], other=0))
    return (lo.to(tl.uint16) | (hi.to(tl.uint16) << 8)).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _raw_q8_0(RAW, j, rows, mask, B):
    block = RAW + (rows.to(tl.int64) * B + j) * 34  # 34-byte blocks: nothing is aligned
    scale = _f16_at(block, mask)
    q = tl.load(block[:, None] + 2 + tl.arange(0, 32)[None, :], mask=mask[:, None], other=0)
    return scale[:, None] * q.to(tl.int8, bitcast=True).to(tl.float32)


@triton.jit
def _raw_q4_0(RAW, j, rows, mask, B):
    block = RAW + (rows.to(tl.int64) * B + j) * 18
    scale = _f16_at(block, mask)
    b = tl.load(block[:, None] + 2 + tl.arange(0, 16)[None, :], mask=mask[:, None], other=0)
    both = tl.join(b & 0x0F, b >> 4)
    q = tl.reshape(tl.permute(both, (0, 2, 1)), (b.shape[0], 32)).to(tl.int8) - 8
    return scale[:, None] * q.to(tl.float32)


@triton.jit
def raw_gemv_kernel(RAW, X, OUT, M, N, B, stride_xm, stride_om, BN: tl.constexpr,
                    M_PAD: tl.constexpr, SPLIT_K: tl.constexpr, DQ: tl.constexpr):
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    mask = rows < N
    ms = tl.arange(0, M_PAD)
    cols = tl.arange(0, 32)
    acc = tl.zeros((M_PAD, BN), dtype=tl.float32)
    for j in range(tl.program_id(1), B, SPLIT_K):
        w = DQ(RAW.to(tl.pointer_type(tl.uint8)), j, rows, mask, B)
        x = tl.load(X + ms[:, None] * stride_xm + j * 32 + cols[None, :],
                    mask=(ms < M)[:, None], other=0.0).to(tl.float32)
        acc += tl.sum(x[:, None, :] * w[None, :, :], axis=2)
    out = OUT + ms[:, None] * stride_om + rows[None, :]
    tl.atomic_add(out, acc, mask=(ms < M)[:, None] & mask[None, :])


RAW_DEQUANT = {"Q8_0": _raw_q8_0, "Q4_0": _raw_q4_0}


def raw_matmul(x: torch.Tensor, raw: torch.Tensor, type_name: str, shape,
               bn: int = 64, split_k: int = 1) -> torch.Tensor:
    """x @ W.T with W given as its GGUF bytes (uint8 [N, B * type_size]); M <= 8."""
    n, k = shape
    b = k // 32
    x2 = x.reshape(-1, k).contiguous()
    m = x2.shape[0]
    out = torch.zeros(m, n, dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(n, bn), split_k)
    raw_gemv_kernel[grid](raw, x2, out, m, n, b, x2.stride(0), out.stride(0), BN=bn,
                          M_PAD=triton.next_power_of_2(m), SPLIT_K=split_k,
                          DQ=RAW_DEQUANT[type_name])
    return out.to(x.dtype)
