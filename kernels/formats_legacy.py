"""Legacy block types: 32 weights, one f16 scale (and min), 4/5/8-bit quants."""

import triton
import triton.language as tl

from .fields import field_bytes, field_f16, field_word, nibbles
from .registry import register


@register("Q4_0", 32, ("d", "qs"))
@triton.jit
def q4_0(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N):
    d = field_f16(P0, j, rows, mask, N)
    q = nibbles(field_bytes(P1, j, rows, mask, N, 16)).to(tl.int8) - 8
    return d * q.to(tl.float32)


@triton.jit
def fifth_bits(P, j, rows, mask, N):
    """Q5's qh word -> int32 [len(rows), 32]: bit i of qh is weight i's fifth bit, moved to
    bit 4 so that it ORs onto the nibble."""
    qh = field_word(P, j, rows, mask, N, 1, 0)
    return ((qh[:, None] >> tl.arange(0, 32)[None, :]) & 1) << 4


@register("Q4_1", 32, ("d", "m", "qs"))
@triton.jit
def q4_1(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N):
    d = field_f16(P0, j, rows, mask, N)
    m = field_f16(P1, j, rows, mask, N)
    q = nibbles(field_bytes(P2, j, rows, mask, N, 16))
    return d * q.to(tl.float32) + m


@register("Q5_0", 32, ("d", "qh", "qs"))
@triton.jit
def q5_0(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N):
    d = field_f16(P0, j, rows, mask, N)
    q = nibbles(field_bytes(P2, j, rows, mask, N, 16)) | fifth_bits(P1, j, rows, mask, N)
    return d * (q - 16).to(tl.float32)


@register("Q5_1", 32, ("d", "m", "qh", "qs"))
@triton.jit
def q5_1(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N):
    d = field_f16(P0, j, rows, mask, N)
    m = field_f16(P1, j, rows, mask, N)
    q = nibbles(field_bytes(P3, j, rows, mask, N, 16)) | fifth_bits(P2, j, rows, mask, N)
    return d * q.to(tl.float32) + m


@register("Q8_0", 32, ("d", "qs"))
@triton.jit
def q8_0(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N):
    d = field_f16(P0, j, rows, mask, N)
    q = field_bytes(P1, j, rows, mask, N, 32).to(tl.int8, bitcast=True)
    return d * q.to(tl.float32)
