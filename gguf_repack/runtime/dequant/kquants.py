"""K-quants: 256-weight super-blocks with packed 4/6/8-bit sub-block scales."""

from __future__ import annotations

import torch

from . import Planes, register

QK_K = 256

# Quants are unpacked on the int32 words they arrive in: a shift and a mask repeated in every
# byte (0x0F0F0F0F) handle four bytes per operation, and the mask drops the bits a shift
# carried over from the next byte. The float stages work in place, in the output chunk
# (`into`), since the output is the only full-size float32 buffer and on the CPU allocating
# one costs more than the arithmetic; in-place `q *= dl` is `dl * q` (IEEE products
# commute), so the rounding is gguf-py's.


def _fields(words: torch.Tensor, width: int) -> torch.Tensor:
    """[M, G, n] int32 words -> [M, G, 8 // width, n] words of width-bit fields, lowest bits
    first: ggml lays a group's bytes out once per shift, so viewed as bytes, weight (g, k, j)
    is field k of byte j of group g."""
    mask = ((1 << width) - 1) * 0x01010101
    out = words.new_empty(*words.shape[:-1], 8 // width, words.shape[-1])
    for k in range(8 // width):
        torch.bitwise_and(words >> (k * width), mask, out=out[..., k, :])
    return out


def _scales_mins(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K's 12 bytes -> 8 six-bit scales and 8 six-bit mins, uint8 [M, 8] each.
    Bytes 0-3 hold scales 0-3, bytes 4-7 mins 0-3, in their low 6 bits; scales and mins 4-7
    take their low 4 bits from the nibbles of bytes 8-11 and their top 2 bits from the top
    bits of bytes 0-3 and 4-7."""
    sc, mn, lo = scales.view(torch.uint8).reshape(-1, 3, 4).unbind(1)
    return (torch.cat([sc & 63, (lo & 15) | ((sc >> 2) & 48)], -1),
            torch.cat([mn & 63, (lo >> 4) | ((mn >> 2) & 48)], -1))


def _scaled_minus_min(p: Planes, q: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Q4_K/Q5_K: q words [M, 8, 8] (8 sub-blocks of 32 bytes) -> (d * scale) * q - dmin * min."""
    sc, mn = _scales_mins(p["scales"])
    dl = (p["d"].float() * sc.float()).unsqueeze(-1)
    ml = (p["dmin"].float() * mn.float()).unsqueeze(-1)
    out.view(-1, 8, 32).copy_(q.view(torch.uint8)).mul_(dl).sub_(ml)
    return out


@register("Q2_K", into=True)
def q2_k(p: Planes, out: torch.Tensor) -> torch.Tensor:
    sc = p["scales"].view(torch.uint8)
    dl = (p["d"].float() * (sc & 15).float()).unsqueeze(-1)
    ml = (p["dmin"].float() * (sc >> 4).float()).unsqueeze(-1)
    q = _fields(p["qs"].reshape(-1, 2, 8), 2).view(torch.uint8).view(-1, 16, 16)
    out.view(-1, 16, 16).copy_(q).mul_(dl).sub_(ml)
    return out


@register("Q3_K", into=True)
def q3_k(p: Planes, out: torch.Tensor) -> torch.Tensor:
    # 16 six-bit scales biased by 32: low 4 bits from the nibbles of bytes 0-7, top 2 bits
    # from the 2-bit fields of bytes 8-11.
    s = p["scales"].reshape(-1, 1, 3)
    low, high = _fields(s[..., :2], 4).view(-1, 4), _fields(s[..., 2:], 2).view(-1, 4)
    sc = (low | (high << 4)).view(torch.int8) - 32
    dl = (p["d"].float() * sc.float()).unsqueeze(-1)
    q = _fields(p["qs"].reshape(-1, 2, 8), 2).view(-1, 64)
    q |= _fields(p["hmask"].reshape(-1, 1, 8), 1).view(-1, 64) << 2
    # A clear hmask bit is what subtracts 4: q = ql - 4 * (1 - qh).
    q = q.view(torch.int8).sub_(4)
    out.view(-1, 16, 16).copy_(q.view(-1, 16, 16)).mul_(dl)
    return out


@register("Q4_K", into=True)
def q4_k(p: Planes, out: torch.Tensor) -> torch.Tensor:
    return _scaled_minus_min(p, _fields(p["qs"].reshape(-1, 4, 8), 4).view(-1, 8, 8), out)


@register("Q5_K", into=True)
def q5_k(p: Planes, out: torch.Tensor) -> torch.Tensor:
    q = _fields(p["qs"].reshape(-1, 4, 8), 4).view(-1, 8, 8)
    q |= _fields(p["qh"].reshape(-1, 1, 8), 1).view(-1, 8, 8) << 4
    return _scaled_minus_min(p, q, out)


@register("Q6_K", into=True)
def q6_k(p: Planes, out: torch.Tensor) -> torch.Tensor:
    dl = (p["d"].float() * p["scales"].view(torch.int8).float()).unsqueeze(-1)
    q = _fields(p["ql"].reshape(-1, 2, 16), 4).view(-1, 64)
    q |= _fields(p["qh"].reshape(-1, 2, 8), 2).view(-1, 64) << 4
    q = q.view(torch.int8).sub_(32)
    out.view(-1, 16, 16).copy_(q.view(-1, 16, 16)).mul_(dl)
    return out
