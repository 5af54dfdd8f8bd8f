"""Ternary types (TQ1_0, TQ2_0): weights in {-1, 0, 1} times one f16 scale."""

from __future__ import annotations

from functools import cache

import torch

from . import Planes, register

# On CPU every full-size temporary costs page faults on top of its pass, so the trits are
# worked out in place in the narrowest integer type and become float32 only once, in the
# output itself.


def _scaled(d: torch.Tensor, q: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """d * q for small integers q: one float32 product per weight, as gguf-py computes it."""
    return out.copy_(q).mul_(d.float())


@cache
def _tq1_powers(device: torch.device) -> torch.Tensor:
    """uint8 [256]: the power of 3 each of TQ1_0's weights multiplies its byte by, in ggml's
    weight order: 3**j for digit j of bytes 0-31, then of bytes 32-47 (both j < 5), then of
    the 4 qh bytes (j < 4)."""
    powers = [3**j for n_digits, width in ((5, 32), (5, 16), (4, 4))
              for j in range(n_digits) for _ in range(width)]
    return torch.tensor(powers, dtype=torch.uint8, device=device)


@register("TQ1_0", into=True)
def tq1_0(p: Planes, out: torch.Tensor) -> torch.Tensor:
    # A byte holds its trits as a base-3 fraction scaled to 256, so multiplying it by 3**j
    # (mod 256, as gguf-py's uint8 product wraps) drops the first j of them, and `* 3 >> 8`
    # then reads trit j off the top. Each weight's byte is laid out first, in weight order
    # (digit-major: 32 bytes 5 times, 16 bytes 5 times, 4 bytes 4 times), copied as whole
    # int32 words; then every step is one pass over the whole block: the power of 3, and
    # trit - 1 = (3x - 256) >> 8 in int16 (an arithmetic shift rounds down).
    qs, qh = p["qs"], p["qh"]  # 12 words (48 bytes), 1 word (4 bytes)
    x = torch.cat([qs[:, :8]] * 5 + [qs[:, 8:]] * 5 + [qh] * 4, dim=-1).view(torch.uint8)
    x.mul_(_tq1_powers(x.device))
    q = x.to(torch.int16).mul_(3).sub_(256).bitwise_right_shift_(8)
    return _scaled(p["d"], q, out)


@register("TQ2_0", into=True)
def tq2_0(p: Planes, out: torch.Tensor) -> torch.Tensor:
    qs = p["qs"].view(torch.uint8)
    m = qs.shape[0]
    # Each 32-byte half holds 4 groups of 32 weights, group g in bits 2g..2g+1. Raw code 3,
    # which valid data never holds, gives 2, as in gguf-py. (On CPU a shift by a Python
    # scalar is vectorized; by a broadcast tensor of shift amounts it ran twice as slow.)
    halves = qs.view(m, 2, 32)
    codes = torch.stack([halves >> s for s in (0, 2, 4, 6)], dim=2).bitwise_and_(0x03)
    return _scaled(p["d"], codes.view(m, 256).view(torch.int8).sub_(1), out)
