"""K-quants: 256-weight super-blocks with packed 4/6/8-bit sub-block scales."""

import triton
import triton.language as tl

from .fields import concat, field_bytes, field_f16
from .registry import register


@triton.jit
def bit_fields(b, GROUPS: tl.constexpr, WIDTH: tl.constexpr):
    """uint8 [R, n], read as GROUPS runs of bytes -> [R, 8 * n // WIDTH]: ggml stores a run
    once for all its WIDTH-bit fields, so the weights are, per run, field 0 of every byte,
    then field 1 of every byte, and so on (lowest bits first)."""
    FIELDS: tl.constexpr = 8 // WIDTH
    run = tl.reshape(b, (b.shape[0], GROUPS, 1, b.shape[1] // GROUPS))
    shifts = (tl.arange(0, FIELDS) * WIDTH).to(tl.uint8)
    f = (run >> shifts[None, None, :, None]) & ((1 << WIDTH) - 1)
    return tl.reshape(f, (b.shape[0], FIELDS * b.shape[1]))


@triton.jit
def per_weight(s, SUB: tl.constexpr):
    """One value per sub-block [R, S] -> repeated over its SUB weights, [R, S * SUB]."""
    return tl.reshape(tl.broadcast_to(s[:, :, None], (s.shape[0], s.shape[1], SUB)),
                      (s.shape[0], s.shape[1] * SUB))


@triton.jit
def scale_bytes(P, j, rows, mask, N):
    """A 12-byte scale field as int32 [R, 4] thrice: bytes 0-3, 4-7 and 8-11. Read as one
    16-byte row per block (the last 4 masked off) and regrouped inside the tile: loading
    each word as its own [R] vector lets Triton give those vectors layouts in which every
    thread reloads every row's words (seen in the GEMV PTX: ~100 loads per block column)."""
    cols = tl.arange(0, 16)
    base = (j * N + rows).to(tl.int64) * 12
    ptr = P.to(tl.pointer_type(tl.uint8)) + base[:, None] + cols[None, :]
    b = tl.load(ptr, mask=mask[:, None] & (cols < 12)[None, :], other=0).to(tl.int32)
    by_word = tl.permute(tl.reshape(b, (b.shape[0], 4, 4)), (0, 2, 1))  # [R, byte, word]
    even, odd = tl.split(tl.reshape(by_word, (b.shape[0], 4, 2, 2)))  # words 0, 2 and 1, 3
    b0, b2 = tl.split(even)
    b1, _ = tl.split(odd)
    return b0, b1, b2


@triton.jit
def scales_mins(P, j, rows, mask, N):
    """Q4_K/Q5_K's 12 scale bytes -> 8 six-bit scales and 8 six-bit mins, int32 [R, 8] each.
    Bytes 0-3 hold scales 0-3 and bytes 4-7 mins 0-3 in their low 6 bits; those of
    sub-blocks 4-7 take their low 4 bits from the nibbles of bytes 8-11 and their top 2
    from the top bits of bytes 0-3 and 4-7."""
    b0, b1, b2 = scale_bytes(P, j, rows, mask, N)
    sc = concat(b0 & 63, (b2 & 15) | ((b0 >> 2) & 48))
    mn = concat(b1 & 63, (b2 >> 4) | ((b1 >> 2) & 48))
    return sc, mn


@triton.jit
def q3_scales(P, j, rows, mask, N):
    """Q3_K's 12 scale bytes -> 16 six-bit scales less their bias of 32, int32 [R, 16].
    Scale i takes its low 4 bits from nibble i // 8 of byte i % 8, its top 2 from 2-bit
    field i // 4 of byte 8 + i % 4."""
    b0, b1, b2 = scale_bytes(P, j, rows, mask, N)
    low = concat(concat(b0 & 15, b1 & 15), concat(b0 >> 4, b1 >> 4))
    top = concat(concat(b2 & 3, (b2 >> 2) & 3), concat((b2 >> 4) & 3, b2 >> 6))
    return (low | (top << 4)) - 32


@register("Q2_K", 256, ("scales", "qs", "d", "dmin"))
@triton.jit
def q2_k(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N):
    sc = field_bytes(P0, j, rows, mask, N, 16)
    dl = field_f16(P2, j, rows, mask, N) * (sc & 15).to(tl.float32)
    ml = field_f16(P3, j, rows, mask, N) * (sc >> 4).to(tl.float32)
    q = bit_fields(field_bytes(P1, j, rows, mask, N, 64), 2, 2).to(tl.float32)
    return q * per_weight(dl, 16) - per_weight(ml, 16)


@register("Q3_K", 256, ("hmask", "qs", "scales", "d"))
@triton.jit
def q3_k(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N):
    dl = field_f16(P3, j, rows, mask, N) * q3_scales(P2, j, rows, mask, N).to(tl.float32)
    q = bit_fields(field_bytes(P1, j, rows, mask, N, 64), 2, 2)
    # A clear hmask bit is what subtracts 4: q = low - 4 * (1 - high).
    q |= bit_fields(field_bytes(P0, j, rows, mask, N, 32), 1, 1) << 2
    return (q.to(tl.int32) - 4).to(tl.float32) * per_weight(dl, 16)


@triton.jit
def scaled_minus_min(P0, P1, P2, j, rows, mask, N, q):
    """Q4_K/Q5_K: (d * scale) * q - dmin * min, over 8 sub-blocks of 32."""
    sc, mn = scales_mins(P2, j, rows, mask, N)
    dl = field_f16(P0, j, rows, mask, N) * sc.to(tl.float32)
    ml = field_f16(P1, j, rows, mask, N) * mn.to(tl.float32)
    return q.to(tl.float32) * per_weight(dl, 32) - per_weight(ml, 32)


@register("Q4_K", 256, ("d", "dmin", "scales", "qs"))
@triton.jit
def q4_k(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N):
    q = bit_fields(field_bytes(P3, j, rows, mask, N, 128), 4, 4)
    return scaled_minus_min(P0, P1, P2, j, rows, mask, N, q)


@register("Q5_K", 256, ("d", "dmin", "scales", "qh", "qs"))
@triton.jit
def q5_k(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N):
    q = bit_fields(field_bytes(P4, j, rows, mask, N, 128), 4, 4)
    q |= bit_fields(field_bytes(P3, j, rows, mask, N, 32), 1, 1) << 4
    return scaled_minus_min(P0, P1, P2, j, rows, mask, N, q)


@register("Q6_K", 256, ("ql", "qh", "scales", "d"))
@triton.jit
def q6_k(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N):
    sc = field_bytes(P2, j, rows, mask, N, 16).to(tl.int8, bitcast=True)
    dl = field_f16(P3, j, rows, mask, N) * sc.to(tl.float32)
    q = bit_fields(field_bytes(P0, j, rows, mask, N, 128), 2, 4)
    q |= bit_fields(field_bytes(P1, j, rows, mask, N, 64), 2, 2) << 4
    return (q.to(tl.int32) - 32).to(tl.float32) * per_weight(dl, 16)
