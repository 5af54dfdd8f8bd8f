"""Legacy block types: 32 weights, one f16 scale (and min), 4/5/8-bit quants."""

import triton
import triton.language as tl

from .fields import (
    byte_pairs_f16,
    bytes_f16,
    f16_half,
    f16_halves,
    field16_pair_in_words,
    field_bytes,
    field_f16,
    field_h,
    field_run,
    field_word,
    fragment_order_32,
    mac4,
    mac_bytes,
    mac_nibbles,
    nibbles,
    nibbles_f16,
    opaque_zero,
    row_word,
    row_zero,
    scale_f16,
    shr,
    spread4,
    words4,
    x_sum,
)
from .registry import register


@triton.jit
def nibbles_dot(P, j, rows, mask, N, XB, OFFSET: tl.constexpr):
    """sum((q - OFFSET) x) over a block of 16 bytes of nibbles (ggml's order: byte i holds
    weights i and 16 + i)."""
    w = words4(P, j, rows, mask, N, 4, 0)
    low = tl.zeros(rows.shape, tl.float32)
    high = tl.zeros(rows.shape, tl.float32)
    z = opaque_zero(N)
    for c in tl.static_range(4):
        low, high = mac_nibbles(low, high, w[c], XB, 4 * c, 16 + 4 * c, OFFSET, z)
    return low + high


@triton.jit
def q4_0_dot(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, XB, SB, part, PARTS: tl.constexpr):
    s = nibbles_dot(P1, j, rows, mask, N, XB, 8)
    return scale_f16(P0, j, rows, mask, N) * s


@triton.jit
def nibbles_f16_block(P, j, rows, mask, N, DT: tl.constexpr = tl.float16, LESS: tl.constexpr = 0):
    """A 16-byte field of nibbles, each less LESS, exactly, float16 (or DT) [R, 32] in ggml's
    order, unpacked a word at a time (fields.nibbles_f16)."""
    w = field_run(P, j, rows, mask, N, 4, 0, 4, tl.int32)
    return nibbles_f16(w, 4, opaque_zero(N), DT, LESS)


@triton.jit
def q4_0_half(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, DT: tl.constexpr):
    # q - 8 exactly, then one rounding: the float32 weight's (bfloat16: d rounded to bfloat16
    # first: two roundings)
    return field_h(P0, j, rows, mask, N, DT) * nibbles_f16_block(P1, j, rows, mask, N, DT, 8)


@register("Q4_0", 32, ("d", "qs"), dot=q4_0_dot, dequant_half=q4_0_half)
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


@triton.jit
def q4_1_dot(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, XB, SB, part, PARTS: tl.constexpr):
    # d * q + m per weight: d * sum(q x) + m * sum(x)
    s = nibbles_dot(P2, j, rows, mask, N, XB, 0)
    return scale_f16(P0, j, rows, mask, N) * s + scale_f16(P1, j, rows, mask, N) * x_sum(SB, 0, 32)


@triton.jit
def q4_1_half(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, DT: tl.constexpr):
    q = nibbles_f16_block(P2, j, rows, mask, N, DT)
    d, m = field16_pair_in_words(P0, P1, j, rows, mask, N)
    return f16_half(d).to(DT)[:, None] * q + f16_half(m).to(DT)[:, None]


@register("Q4_1", 32, ("d", "m", "qs"), dot=q4_1_dot, dequant_half=q4_1_half)
@triton.jit
def q4_1(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N):
    d = field_f16(P0, j, rows, mask, N)
    m = field_f16(P1, j, rows, mask, N)
    q = nibbles(field_bytes(P2, j, rows, mask, N, 16))
    return d * q.to(tl.float32) + m


@triton.jit
def q5_dot(qh_plane, qs_plane, j, rows, mask, N, XB, OFFSET: tl.constexpr):
    """Q5_0/Q5_1's sum(q * x): byte b of qs word c holds weights 4c + b (low
    nibble) and 16 + 4c + b (high nibble), whose fifth bits are bits 4c + b and 16 + 4c + b
    of qh; each byte's 5-bit value is assembled in place, then read as one field."""
    qh = row_word(qh_plane, j, rows, mask, N, 1, 0)
    w = words4(qs_plane, j, rows, mask, N, 4, 0)
    s = tl.zeros(rows.shape, tl.float32)
    z = opaque_zero(N)
    qh = qh | (w[0] & z)
    for c in tl.static_range(4):
        low = (w[c] & 0x0F0F0F0F) | spread4(shr(qh, 4 * c))
        high = (shr(w[c], 4) & 0x0F0F0F0F) | spread4(shr(qh, 16 + 4 * c))
        s = mac4(s, low, XB, 4 * c, 0, 8, 5, OFFSET, z)
        s = mac4(s, high, XB, 16 + 4 * c, 0, 8, 5, OFFSET, z)
    return s


@triton.jit
def q5_0_dot(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, XB, SB, part, PARTS: tl.constexpr):
    s = q5_dot(P1, P2, j, rows, mask, N, XB, 16)
    return scale_f16(P0, j, rows, mask, N) * s


@triton.jit
def q5_1_dot(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, XB, SB, part, PARTS: tl.constexpr):
    s = q5_dot(P2, P3, j, rows, mask, N, XB, 0)
    return scale_f16(P0, j, rows, mask, N) * s + scale_f16(P1, j, rows, mask, N) * x_sum(SB, 0, 32)


@triton.jit
def five_bit_f16(qh_plane, qs_plane, j, rows, mask, N, DT: tl.constexpr = tl.float16):
    """Q5_0/Q5_1's 32 five-bit values as 1024 + each, float16 [R, 32] in the fragment order
    of a 32-weight block (fields.fragment_order_32, tile_columns(32, -1)): byte b of qs word
    c holds weights 4c + b (low nibble, j = 0) and 16 + 4c + b (high, j = 1), whose fifth
    bits, qh bits 4c + b and 16 + 4c + b, spread4 puts above each byte's nibble; then the
    bytes go to float16 two at a time (fields.byte_pairs_f16). Each thread of an MMA fragment
    takes one word: its bytes reach the tensor cores in registers. (bfloat16: 128 + each.)"""
    z = row_zero(rows)[:, None]
    w = field_run(qs_plane, j, rows, mask, N, 4, 0, 4, tl.int32)  # [R, 4]
    qh = field_word(qh_plane, j, rows, mask, N, 1, 0).to(tl.uint32, bitcast=True)[:, None, None]
    c = tl.arange(0, 4)[None, :, None]
    high = tl.arange(0, 2)[None, None, :]  # j
    q = ((shr(w[:, :, None], 4 * high) & 0x0F0F0F0F)
         | spread4((qh >> (4 * c + 16 * high)).to(tl.int32, bitcast=True)))  # [R, c, j]
    return fragment_order_32(f16_halves(byte_pairs_f16(q, z[:, :, None], DT), DT))  # [R, c, j, h, half]


@triton.jit
def q5_0_half(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, DT: tl.constexpr):
    # (1024 + q) - 1040 = q - 16 exactly, then one rounding: the float32 weight's (bfloat16:
    # (128 + q) - 144, and d rounded to bfloat16 first)
    BIAS: tl.constexpr = 144.0 if DT == tl.bfloat16 else 1040.0
    return field_h(P0, j, rows, mask, N, DT) * (five_bit_f16(P1, P2, j, rows, mask, N, DT) - BIAS)


@register("Q5_0", 32, ("d", "qh", "qs"), dot=q5_0_dot, dequant_half=q5_0_half,
          f16_nibble_run=-1)
@triton.jit
def q5_0(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N):
    d = field_f16(P0, j, rows, mask, N)
    q = nibbles(field_bytes(P2, j, rows, mask, N, 16)) | fifth_bits(P1, j, rows, mask, N)
    return d * (q - 16).to(tl.float32)


@triton.jit
def q5_1_half(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, DT: tl.constexpr):
    BASE: tl.constexpr = 128.0 if DT == tl.bfloat16 else 1024.0
    q = five_bit_f16(P2, P3, j, rows, mask, N, DT) - BASE
    d, m = field16_pair_in_words(P0, P1, j, rows, mask, N)
    return f16_half(d).to(DT)[:, None] * q + f16_half(m).to(DT)[:, None]


@register("Q5_1", 32, ("d", "m", "qh", "qs"), dot=q5_1_dot, dequant_half=q5_1_half, f16_nibble_run=-1)
@triton.jit
def q5_1(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N):
    d = field_f16(P0, j, rows, mask, N)
    m = field_f16(P1, j, rows, mask, N)
    q = nibbles(field_bytes(P3, j, rows, mask, N, 16)) | fifth_bits(P2, j, rows, mask, N)
    return d * q.to(tl.float32) + m


@triton.jit
def q8_0_dot(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, XB, SB, part, PARTS: tl.constexpr):
    s = tl.zeros(rows.shape, tl.float32)
    z = opaque_zero(N)
    for half in tl.static_range(2):
        w = words4(P1, j, rows, mask, N, 8, 4 * half)
        for c in tl.static_range(4):
            # signed bytes: flipping each top bit makes them q + 128, unsigned
            s = mac_bytes(s, w[c] ^ -0x7F7F7F80, XB, 16 * half + 4 * c, 128, z)
    return scale_f16(P0, j, rows, mask, N) * s


@triton.jit
def q8_0_half(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, DT: tl.constexpr):
    tl.static_assert(DT == tl.float16)  # a byte fills bfloat16's mantissa: float16 only
    # signed bytes with their top bit flipped are q + 128, unsigned: (1024 + q + 128) - 1152
    # = q exactly, then one rounding (the float32 weight's)
    z = opaque_zero(N)
    w = field_run(P1, j, rows, mask, N, 8, 0, 8, tl.int32) ^ (-0x7F7F7F80 + z)
    return field_h(P0, j, rows, mask, N) * (bytes_f16(w, z) - 1152.0)


@register("Q8_0", 32, ("d", "qs"), dot=q8_0_dot, dequant_half=q8_0_half, half_acts=("fp16",))
@triton.jit
def q8_0(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N):
    d = field_f16(P0, j, rows, mask, N)
    q = field_bytes(P1, j, rows, mask, N, 32).to(tl.int8, bitcast=True)
    return d * q.to(tl.float32)
