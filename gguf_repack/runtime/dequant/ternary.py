"""Ternary types (TQ1_0, TQ2_0): weights in {-1, 0, 1} times one f16 scale."""

from __future__ import annotations

import torch

from . import Planes, register

# On CPU every full-size temporary costs page faults on top of its pass, so the trits are
# worked out in place in the narrowest integer type and become float32 only once.


def _scaled(d: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """d * q for small integers q: one float32 product per weight, as gguf-py computes it."""
    return q.float().mul_(d.float())


def _base3_shifted(b: torch.Tensor, n_digits: int) -> list[torch.Tensor]:
    """[M, n] bytes -> b * 3**j, wrapped to 8 bits, for j < n_digits: one [M, n] piece per
    digit, in the digit-major order of ggml's weights.

    A byte holds its trits as a base-3 fraction scaled to 256, so multiplying it by 3**j
    (mod 256) drops the first j of them, and `* 3 >> 8` then reads trit j off the top."""
    return [b * 3**j for j in range(n_digits)]


@register("TQ1_0")
def tq1_0(p: Planes) -> torch.Tensor:
    qs, qh = p["qs"].view(torch.uint8), p["qh"].view(torch.uint8)
    # 5 trits in each of the first 48 bytes, 4 in each of the last 4: 32*5 + 16*5 + 4*4 = 256.
    pieces = [*_base3_shifted(qs[:, :32], 5), *_base3_shifted(qs[:, 32:], 5),
              *_base3_shifted(qh, 4)]
    q = torch.cat(pieces, dim=-1).to(torch.int16).mul_(3).bitwise_right_shift_(8).sub_(1)
    return _scaled(p["d"], q)


@register("TQ2_0")
def tq2_0(p: Planes) -> torch.Tensor:
    qs = p["qs"].view(torch.uint8)
    m = qs.shape[0]
    # Each 32-byte half holds 4 groups of 32 weights, group g in bits 2g..2g+1. Raw code 3,
    # which valid data never holds, gives 2, as in gguf-py. (On CPU a shift by a Python
    # scalar is vectorized; by a broadcast tensor of shift amounts it ran twice as slow.)
    halves = qs.view(m, 2, 32)
    codes = torch.stack([halves >> s for s in (0, 2, 4, 6)], dim=2).bitwise_and_(0x03)
    return _scaled(p["d"], codes.view(m, 256).view(torch.int8).sub_(1))
