"""Legacy block types: 32 weights, one f16 scale (and min), 4/5/8-bit quants."""

from __future__ import annotations

import torch

from . import Planes, register


def _nibble_words(qs: torch.Tensor) -> torch.Tensor:
    """[M, 4] int32 words of 16 bytes -> [M, 8] words of 32 bytes, low nibbles first, then
    high, as ggml orders them:
    shifting and masking whole words does four bytes per operation, and the mask drops every
    bit that a shift carried over from the next byte. (Writing into halves of one buffer is
    twice as fast as torch.cat of two.)"""
    out = qs.new_empty(qs.shape[0], 2, 4)
    torch.bitwise_and(qs, 0x0F0F0F0F, out=out[:, 0])
    torch.bitwise_and(qs >> 4, 0x0F0F0F0F, out=out[:, 1])
    return out.view(-1, 8)


def _fifth_bit_words(qh: torch.Tensor) -> torch.Tensor:
    """[M, 1] int32 -> [M, 8] words of 32 bytes, byte i holding bit i of qh (weight i's fifth
    bit) at bit 4. Multiplying a 4-bit group by 0x204081 adds copies of it shifted 0, 7, 14
    and 21 bits, which never overlap: bit b of the group lands on bit 8b, the low bit of byte b."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=qh.device)
    return ((((qh >> shifts) & 0xF) * 0x204081) & 0x01010101) << 4


# The float stages below work in place, in the output chunk (`into`): the output is the only
# full-size float32 buffer, and on the CPU allocating one costs more than the arithmetic.
# In-place `q *= d` is `d * q` (IEEE products commute), so the rounding is gguf-py's.


@register("Q4_0", into=True)
def q4_0(p: Planes, out: torch.Tensor) -> torch.Tensor:
    d = p["d"].float()
    return out.copy_(_nibble_words(p["qs"]).view(torch.int8).sub_(8)).mul_(d)


@register("Q8_0", into=True)
def q8_0(p: Planes, out: torch.Tensor) -> torch.Tensor:
    d = p["d"].float()
    return out.copy_(p["qs"].view(torch.int8)).mul_(d)


@register("Q4_1", into=True)
def q4_1(p: Planes, out: torch.Tensor) -> torch.Tensor:
    d, m = p["d"].float(), p["m"].float()
    return out.copy_(_nibble_words(p["qs"]).view(torch.uint8)).mul_(d).add_(m)


@register("Q5_0", into=True)
def q5_0(p: Planes, out: torch.Tensor) -> torch.Tensor:
    d = p["d"].float()
    q = _nibble_words(p["qs"])
    q |= _fifth_bit_words(p["qh"])
    return out.copy_(q.view(torch.int8).sub_(16)).mul_(d)


@register("Q5_1", into=True)
def q5_1(p: Planes, out: torch.Tensor) -> torch.Tensor:
    d, m = p["d"].float(), p["m"].float()
    q = _nibble_words(p["qs"])
    q |= _fifth_bit_words(p["qh"])
    return out.copy_(q.view(torch.uint8)).mul_(d).add_(m)
