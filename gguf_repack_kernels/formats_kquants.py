"""K-quants: 256-weight super-blocks with packed 4/6/8-bit sub-block scales."""

import triton
import triton.language as tl

from .fields import (
    byte_in_word16,
    bytes_f16,
    concat,
    dot4,
    dot4_2bit,
    f16_halves,
    f16_of_word,
    field16_pair_in_words,
    field_bytes,
    field_f16,
    field_f16_words,
    field_run,
    fragment_order_256,
    mac4,
    mac_nibbles,
    nibbles_f16_fragments,
    opaque_zero,
    row_word,
    row_zero,
    scale_f16,
    shr,
    swap_middle_bytes,
    words4,
    x8_scale,
    x8_words,
    x_sum,
)
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


# --- dot functions for the M = 1 GEMV (gemv.py's gemv_dot_kernel) ------------------------


@triton.jit
def shifted(w, K: tl.constexpr):
    """w << K for K >= 0, logical w >> -K otherwise."""
    if K >= 0:
        return w << K
    else:
        return shr(w, -K)


@triton.jit
def k_scale_min(w0, w1, w2, i):
    """Q4_K/Q5_K's 6-bit scale and min of sub-block i (0..7, any int), as float32, from the
    12 scale bytes as words w0..w2 (scales_mins' bit arrangement): sub-blocks 0-3 have them
    in the low 6 bits of byte i of w0 and w1; 4-7 take their low 4 bits from the nibbles of
    byte i - 4 of w2 and their top 2 from the top of byte i - 4 of w0 and w1."""
    upper = i >> 2
    a = shr(w0, 8 * (i & 3))
    b = shr(w1, 8 * (i & 3))
    c = shr(w2, 8 * (i & 3))
    top = 4 + 2 * upper  # where the 2 top bits are: bits 4-5 (i < 4), 6-7 (i >= 4)
    sc = (tl.where(upper != 0, c, a) & 15) | (((a >> top) & 3) << 4)
    mn = (tl.where(upper != 0, c >> 4, b) & 15) | (((b >> top) & 3) << 4)
    return sc.to(tl.float32), mn.to(tl.float32)


@triton.jit
def q45_k_dot(P0, P1, P2, P3, P4, j, rows, mask, N, XB, SB, part, PARTS: tl.constexpr,
              FIFTH: tl.constexpr):
    """Q4_K/Q5_K, the 4 / PARTS groups of 64 weights of part `part`: d * sum(scale_i
    sum_i(q x)) - dmin * sum(min_i sum_i(x)) over their sub-blocks of 32. Group g's 32 qs
    bytes hold weights 64g + l (low nibbles, sub-block 2g) and 64g + 32 + l (high, 2g + 1);
    Q5_K's fifth bits are bits 2g and 2g + 1 of qh byte l, put above each nibble."""
    GROUPS: tl.constexpr = 4 // PARTS
    z = opaque_zero(N)
    s0 = row_word(P2, j, rows, mask, N, 3, 0)
    s1 = row_word(P2, j, rows, mask, N, 3, 1)
    s2 = row_word(P2, j, rows, mask, N, 3, 2)
    qs_plane = P4 if FIFTH else P3
    by_scale = tl.zeros(rows.shape, tl.float32)
    by_min = tl.zeros(rows.shape, tl.float32)
    for gg in tl.static_range(GROUPS):
        g = GROUPS * part + gg
        XG = XB + 64 * g
        low = tl.zeros(rows.shape, tl.float32)
        high = tl.zeros(rows.shape, tl.float32)
        for h in tl.static_range(2):
            w = words4(qs_plane, j, rows, mask, N, 32, 8 * g + 4 * h)
            if FIFTH:
                qh = words4(P3, j, rows, mask, N, 8, 4 * h)
            for c in tl.static_range(4):
                i = 16 * h + 4 * c
                if FIFTH:
                    bits = shr(qh[c], 2 * g)  # bits 2g and 2g + 1 of each byte, to bits 0, 1
                    lo = (w[c] & 0x0F0F0F0F) | ((bits << 4) & 0x10101010)
                    hi = (shr(w[c], 4) & 0x0F0F0F0F) | ((bits << 3) & 0x10101010)
                    low = mac4(low, lo, XG, i, 0, 8, 5, 0, z)
                    high = mac4(high, hi, XG, i + 32, 0, 8, 5, 0, z)
                else:
                    low, high = mac_nibbles(low, high, w[c], XG, i, i + 32, 0, z)
        sc, mn = k_scale_min(s0, s1, s2, 2 * g)
        by_scale += sc * low
        by_min += mn * x_sum(SB, 64 * g, 32)
        sc, mn = k_scale_min(s0, s1, s2, 2 * g + 1)
        by_scale += sc * high
        by_min += mn * x_sum(SB, 64 * g + 32, 32)
    return scale_f16(P0, j, rows, mask, N) * by_scale - scale_f16(P1, j, rows, mask, N) * by_min


@triton.jit
def q4_k_dot(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, XB, SB, part, PARTS: tl.constexpr):
    return q45_k_dot(P0, P1, P2, P3, P4, j, rows, mask, N, XB, SB, part, PARTS, False)


@triton.jit
def q5_k_dot(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, XB, SB, part, PARTS: tl.constexpr):
    return q45_k_dot(P0, P1, P2, P3, P4, j, rows, mask, N, XB, SB, part, PARTS, True)


@triton.jit
def q2_k_dot(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, XB, SB, part, PARTS: tl.constexpr):
    """Q2_K (int8 x), half n of the block per call (PARTS 2) or both (PARTS 1): weights
    128n + 32k + l are bits 2k..2k+1 of qs byte 32n + l; sub-block 8n + 2k + l // 16 has
    4-bit scale and min in its scale byte: d * sum(scale sum(q x)) - dmin * sum(min sum(x)).
    The 2-bit fields are multiplied where they lie, at bit 2k of each byte (4 a DP4A), and
    the 2**2k taken out once per 32 weights, with x's scale."""
    sc_words = words4(P0, j, rows, mask, N, 4, 0)
    by_scale = tl.zeros(rows.shape, tl.float32)
    by_min = tl.zeros(rows.shape, tl.float32)
    for nn in tl.static_range(2 // PARTS):
        n = (2 // PARTS) * part + nn
        if PARTS == 1:
            sc0 = sc_words[2 * nn]
            sc1 = sc_words[2 * nn + 1]
        else:
            sc0 = tl.where(part == 0, sc_words[0], sc_words[2])
            sc1 = tl.where(part == 0, sc_words[1], sc_words[3])
        w_lo = words4(P1, j, rows, mask, N, 16, 8 * n)  # qs bytes 32n + l, l < 16
        w_hi = words4(P1, j, rows, mask, N, 16, 8 * n + 4)  # l >= 16
        for k in tl.static_range(4):
            sub = tl.zeros(rows.shape, tl.int32)  # both sub-blocks of these 32 weights
            for half in tl.static_range(2):
                w = w_lo if half == 0 else w_hi
                s = dot4_2bit(tl.zeros(rows.shape, tl.int32), w[0], w[1], w[2], w[3], XB,
                              128 * n + 32 * k + 16 * half, k)
                # sub-block 8n + 2k + half: byte (2k + half) % 4 of scale word 2n + k // 2
                byte = shr(sc0 if k < 2 else sc1, 8 * ((2 * k + half) % 4))
                sub += (byte & 15) * s
                by_min += ((byte >> 4) & 15).to(tl.float32) * x_sum(SB, 128 * n + 32 * k + 16 * half, 16)
            by_scale += sub.to(tl.float32) * (x8_scale(XB, 256, 128 * n + 32 * k) * (1.0 / (1 << (2 * k))))
    return scale_f16(P2, j, rows, mask, N) * by_scale - scale_f16(P3, j, rows, mask, N) * by_min


@triton.jit
def q3_k_scale(w0, w1, w2, S: tl.constexpr):
    """Q3_K's 6-bit scale S less 32, int32: low 4 bits nibble S // 8 of scale byte S % 8
    (words w0, w1), top 2 bits 2-bit field S // 4 of byte 8 + S % 4 (w2)."""
    low = shr(w0 if (S % 8) < 4 else w1, 8 * (S % 4) + 4 * (S // 8)) & 15
    top = shr(w2, 8 * (S % 4) + 2 * (S // 4)) & 3
    return (low | (top << 4)) - 32


@triton.jit
def q3_k_dot(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, XB, SB, part, PARTS: tl.constexpr):
    """Q3_K (int8 x, PARTS 1): weights 128n + 32k + l are bits 2k..2k+1 of qs byte 32n + l
    and bit 4n + k of hmask byte l (set: +0, clear: -4); sub-block 8n + 2k + l // 16 has a
    6-bit scale less 32: d * sum(scale (sum(q x) - 4 sum(x))), q the 3-bit field. The field
    is assembled where the 2 low bits lie, at bit e = 2k of each byte (for k = 3 all moved
    down to bit 4, so that it stays in its byte), 4 multiplied by a DP4A, and the 2**e
    taken out once per 32 weights, with x's scale."""
    s0 = row_word(P2, j, rows, mask, N, 3, 0)
    s1 = row_word(P2, j, rows, mask, N, 3, 1)
    s2 = row_word(P2, j, rows, mask, N, 3, 2)
    hm_lo = words4(P0, j, rows, mask, N, 8, 0)  # hmask bytes l < 16
    hm_hi = words4(P0, j, rows, mask, N, 8, 4)  # l >= 16
    by_q = tl.zeros(rows.shape, tl.float32)
    by_x = tl.zeros(rows.shape, tl.float32)  # sum(scale sum(x)), what the 4 multiplies
    for n in tl.static_range(2):
        w_lo = words4(P1, j, rows, mask, N, 16, 8 * n)
        w_hi = words4(P1, j, rows, mask, N, 16, 8 * n + 4)
        for k in tl.static_range(4):
            e = 2 * k if k < 3 else 4  # the field's bit in each byte
            sub = tl.zeros(rows.shape, tl.int32)  # both sub-blocks of these 32 weights
            for half in tl.static_range(2):
                w = w_lo if half == 0 else w_hi
                hm = hm_lo if half == 0 else hm_hi
                xw = x8_words(XB, 128 * n + 32 * k + 16 * half)
                s = tl.zeros(rows.shape, tl.int32)
                for c in tl.static_range(4):
                    # hmask bit 4n + k of each byte, moved to bit e + 2 of its byte
                    high = shifted(hm[c], e + 2 - 4 * n - k) & (0x04040404 << e)
                    if k < 3:
                        q = (w[c] & (0x03030303 << e)) | high
                    else:
                        q = (shr(w[c], 2) & 0x30303030) | high
                    s = dot4(q, xw[c], s)
                scale = q3_k_scale(s0, s1, s2, 8 * n + 2 * k + half)
                sub += scale * s
                by_x += scale.to(tl.float32) * x_sum(SB, 128 * n + 32 * k + 16 * half, 16)
            by_q += sub.to(tl.float32) * (x8_scale(XB, 256, 128 * n + 32 * k) * (1.0 / (1 << e)))
    return scale_f16(P3, j, rows, mask, N) * (by_q - 4 * by_x)


@triton.jit
def signed_byte(w, B: tl.constexpr):
    """Byte B of w as a signed value, float32."""
    return ((w << (24 - 8 * B)) >> 24).to(tl.float32)


@triton.jit
def q6_k_dot(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, XB, SB, part, PARTS: tl.constexpr):
    """Q6_K (a whole block: PARTS 1): d * sum(scale_i sum_i((q - 32) x)) over 16 sub-blocks
    of 16. Half n's weights
    128n + 32k + l (k < 4, l < 32) take 4 bits from ql byte 64n + l (k even) or 64n + 32 + l
    (k odd), low nibble for k < 2, and 2 bits from qh byte 32n + l at bit 2k."""
    z = opaque_zero(N)
    sc = words4(P2, j, rows, mask, N, 4, 0)
    acc = tl.zeros(rows.shape, tl.float32)
    for n in tl.static_range(2):
        for half in tl.static_range(2):  # l < 16, l >= 16: one scale each
            a = words4(P0, j, rows, mask, N, 32, 16 * n + 4 * half)
            b = words4(P0, j, rows, mask, N, 32, 16 * n + 8 + 4 * half)
            qh = words4(P1, j, rows, mask, N, 16, 8 * n + 4 * half)
            for k in tl.static_range(4):
                s = tl.zeros(rows.shape, tl.float32)
                for c in tl.static_range(4):
                    ql = a[c] if k % 2 == 0 else b[c]
                    if k < 2:
                        q = ql & 0x0F0F0F0F
                    else:
                        q = shr(ql, 4) & 0x0F0F0F0F
                    q |= shifted(qh[c], 4 - 2 * k) & 0x30303030
                    s = mac4(s, q, XB, 128 * n + 32 * k + 16 * half + 4 * c, 0, 8, 6, 32, z)
                # the scale of these 16 weights: byte 8n + 2k + half of the 16
                acc += signed_byte(sc[2 * n + k // 2], (2 * k + half) % 4) * s
    return scale_f16(P3, j, rows, mask, N) * acc


@triton.jit
def qs_fragment_words(P, j, rows, mask, N):
    """Q2_K's and Q3_K's 64 qs bytes for their fragment order (q2_k_f16), as
    swap_middle_bytes' words [R, c, i, 1]: thread c's word i is qs word 4c + i, a byte pair's
    fields 16 bits apart."""
    R: tl.constexpr = rows.shape[0]
    w = tl.reshape(field_run(P, j, rows, mask, N, 16, 0, 16, tl.int32), (R, 4, 4))
    return swap_middle_bytes(w)[:, :, :, None]


@triton.jit
def fields_in_place(t, th, Z, DT: tl.constexpr, LESS: tl.constexpr, HIGH: tl.constexpr):
    """The 2-bit fields of qs_fragment_words' t, less LESS, exactly, as DT [R, c, i, k, s1,
    half]; with HIGH, each with a third bit above it from th (Q3_K: field k's at bit k + 2 of
    its byte), less 4 more. Field k is left at its place (bits 2k, 2k + 1 of each byte of a
    half) under an exponent that makes bit 2k worth 1: one LOP3 a pair of weights gives
    2^(MANT - 2k) + field, and a word's second bytes (s1 = 1) take one shift by 8 (moving
    each field to bits 0-1 first cost a shift a pair). bfloat16's 7 mantissa bits hold
    fields 0-2 in place (with HIGH, the third bit too); field 3 moves to field 2's bits.
    sm_90 SASS, loop instructions a step, fp16 / bf16 x (Triton 3.9): Q2_K BM = 16 521 / 588
    -> 474 / 573, swapped BM = 32 621 / 641 -> 576 / 628; Q3_K 793 / 799 -> 747 / 799, 870 /
    870 -> 782 / 790; TQ2_0 328 / 328 -> 280 / 296, 475 / 478 -> 427 / 446. The masks are
    plain constants: made from Z, as `ones` is, Q3_K's swapped tile spilled."""
    R: tl.constexpr = t.shape[0]
    MANT: tl.constexpr = 7 if DT == tl.bfloat16 else 10
    EXP_BIAS: tl.constexpr = 127 if DT == tl.bfloat16 else 15
    s = tl.arange(0, 8)[None, None, None, :]  # (field k, pair s1)
    k = s // 2
    s1 = s % 2
    down = 2 * (k // 3) if DT == tl.bfloat16 else 0 * k
    pos = 2 * k - down  # the field's lowest bit after the shift
    ones = ((EXP_BIAS + MANT - pos) << MANT) * 0x10001
    v = (t >> (8 * s1 + down)) & (0x00030003 << pos) | (ones + Z)
    if HIGH:
        up = k - down - 8 * s1  # bit k + 2 (+ 8 s1) to bit pos + 2
        v |= ((th << tl.maximum(up, 0)) >> tl.maximum(-up, 0)) & (0x00040004 << pos)
        less = (LESS + 4) << pos
    else:
        less = LESS << pos
    # 2^(MANT - 2k) + LESS (+ 4), its bits beside v's (a constant tensor reshaped instead
    # broke TQ2_0's tiles' layouts: the weight tile through shared memory, spilling)
    base = f16_halves((ones | less * 0x10001) + Z, DT)
    return tl.reshape(f16_halves(v, DT) - base, (R, 4, 4, 4, 2, 2))


@triton.jit
def qs_fields_half(P, j, rows, mask, N, DT: tl.constexpr, LESS: tl.constexpr):
    """Q2_K's 64 qs bytes (TQ2_0's alike) in the 2-bit fragment order (q2_k_half), less LESS,
    exactly, as DT [R, c, i, k, s1, half] (fields_in_place)."""
    t = qs_fragment_words(P, j, rows, mask, N)
    Z = row_zero(rows)[:, None, None, None]
    return fields_in_place(t, t, Z, DT, LESS, False)


@triton.jit
def by_thread_and_field(x):
    """[R, 16] by Q2_K's and Q3_K's sub-block 8n + 2k + c % 2 -> [R, c, 1, k, 1, 1], to scale
    their fragment order's [R, c, i, k, s1, half] (q2_k_f16)."""
    R: tl.constexpr = x.shape[0]
    return tl.reshape(tl.permute(tl.reshape(x, (R, 2, 4, 2)), (0, 1, 3, 2)), (R, 4, 1, 4, 1, 1))


@triton.jit
def q2_k_half_scaled(P0, P1, P2, P3, j, rows, mask, N, DT: tl.constexpr, SCALES_IN_HALVES: tl.constexpr):
    """Q2_K for the fused GEMM's tiles of BM <= 32 with float16 (or bfloat16) x, in the 2-bit fragment order
    (fields.tile_columns, RUN = -2): an MMA fragment's thread c unpacks qs bytes 16c..16c+15,
    a word at a time (bytes l = 16 (c % 2)... of half n = c // 2; field k of byte l is
    weight 128n + 32k + l, of sub-block 8n + 2k + c % 2), so it needs 4 of the 16 scales and
    mins. Two fields a shift and a LOP3 under float16's exponent, as fields.nibbles_f16_
    fragments unpacks nibbles; d * scale and dmin * min rounded to float16 once a sub-block,
    then one HFMA a pair, as q4_k_f16 (and as there, d and dmin loaded alone). The scale
    bytes in 16-bit words (fields.byte_in_word16) or as two runs of bytes (SCALES_IN_HALVES: q2_k_half,
    q2_k_half_m16)."""
    R: tl.constexpr = rows.shape[0]
    q = qs_fields_half(P1, j, rows, mask, N, DT, 0)  # [R, c, i, k, s1, half]
    # The weight tile still reaches the MMA through shared memory (sm_90, BM = 16: 16 STS.128
    # a step): with scales that vary by sub-block, Triton's hoisting of the MMA operand's
    # layout back to the loads stops at a value that is not a load or a constant
    # (TRITON_LLVM_DEBUG_ONLY=tritongpu-remove-layout-conversions names it; without scales
    # this unpacking is 301 instructions a step in registers). The scale bytes joined from
    # two loads: 718 -> 655; d and dmin in words: 767 (BENCHMARKS.md "Q2_K in float16").
    if SCALES_IN_HALVES:  # sub-block 8n + 2k + c % 2
        words = (j * N + rows).to(tl.int64)[:, None] * 8
        sc = byte_in_word16(P0, words, tl.arange(0, 16)[None, :], mask[:, None]) & 255
    else:
        sc = concat(field_run(P0, j, rows, mask, N, 16, 0, 8, tl.uint8),
                    field_run(P0, j, rows, mask, N, 16, 8, 8, tl.uint8))
    dl = (field_f16(P2, j, rows, mask, N) * (sc & 15).to(tl.float32)).to(DT)
    ml = (field_f16(P3, j, rows, mask, N) * (sc >> 4).to(tl.float32)).to(DT)
    # [R, c, i, k, s1, half] -> column 16 (4i + k) + 8 s1 + 2c + half: fragment_order_256's
    # permutation of the same registers
    q = q * by_thread_and_field(dl) - by_thread_and_field(ml)
    return fragment_order_256(tl.reshape(q, (R, 4, 8, 2, 2, 2)))


@triton.jit
def q2_k_half(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, DT: tl.constexpr):
    """The swapped BM = 32 tile's (q2_k_half_scaled): the scale bytes read in halves, 728 ->
    621 instructions a step (sm_90, fp16 x, Triton 3.9; 3.6: 820 -> 819)."""
    return q2_k_half_scaled(P0, P1, P2, P3, j, rows, mask, N, DT, True)


@triton.jit
def q2_k_half_m16(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, DT: tl.constexpr):
    """The BM = 16 tile's (q2_k_half_scaled), its weight tile behind gemm.kwidth_fence: the
    scale bytes as two runs (in halves 521 -> 543 instructions a step, sm_90, fp16 x)."""
    return q2_k_half_scaled(P0, P1, P2, P3, j, rows, mask, N, DT, False)


@register("Q2_K", 256, ("scales", "qs", "d", "dmin"), dot=q2_k_dot, dot_parts=(1, 2),
          x_int8=True, dequant_half=q2_k_half, narrow_f16=q2_k_half_m16, f16_nibble_run=-2,
          wide_f16="float32")
@triton.jit
def q2_k(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N):
    sc = field_bytes(P0, j, rows, mask, N, 16)
    dl = field_f16_words(P2, j, rows, mask, N) * (sc & 15).to(tl.float32)
    ml = field_f16_words(P3, j, rows, mask, N) * (sc >> 4).to(tl.float32)
    q = bit_fields(field_bytes(P1, j, rows, mask, N, 64), 2, 2).to(tl.float32)
    return q * per_weight(dl, 16) - per_weight(ml, 16)


@triton.jit
def q3_scales_in_halves(P, j, rows, mask, N):
    """q3_scales, each scale's two bytes read as the 16-bit words that hold them
    (fields.byte_in_word16; 6 distinct words a row), the bits by a shift for its column."""
    s = tl.arange(0, 16)[None, :]
    words = (j * N + rows).to(tl.int64)[:, None] * 6
    low = byte_in_word16(P, words, s % 8, mask[:, None]) >> 4 * (s // 8)
    top = byte_in_word16(P, words, 8 + s % 4, mask[:, None]) >> 2 * (s // 4)
    return ((low & 15) | ((top & 3) << 4)) - 32


@triton.jit
def q3_k_half_scaled(P0, P1, P2, P3, j, rows, mask, N, DT: tl.constexpr, SCALES_IN_HALVES: tl.constexpr):
    """Q3_K for the fused GEMM's tiles of BM <= 32 with float16 (or bfloat16) x, in Q2_K's
    fragment order (q2_k_f16: the same low 2 bits in qs), each field's high bit from hmask
    (bit 4n + k of byte l for weight 128n + 32k + l; thread c reads hmask bytes 16 (c % 2)...)
    put just above its 2-bit field (fields_in_place), less 4 exactly. d times the sub-block's scale is
    rounded to float16, then times the value: two roundings where the float32 function has
    one (within the GEMM's tolerance), as Q6_K's and IQ4_XS's float16 functions. The scales
    from q3_scales_in_halves or q3_scales (SCALES_IN_HALVES: q3_k_half_m16, q3_k_half)."""
    R: tl.constexpr = rows.shape[0]
    t = qs_fragment_words(P1, j, rows, mask, N)
    c = tl.arange(0, 4)[None, :, None]
    word = 4 * (c % 2) + tl.arange(0, 4)[None, None, :]  # thread c's hmask words
    hm = tl.load(P0.to(tl.pointer_type(tl.int32)) + (j * N + rows).to(tl.int64)[:, None, None] * 8 + word,
                 mask=mask[:, None, None], other=0)
    # the bits of half n = c // 2 moved down to bits 0-3 (+ 8 s1), then up by 2: field k's
    # high bit is then bit k + 8 s1 + 2 of a byte pair's half
    th = (shr(swap_middle_bytes(hm), 4 * (c // 2)) << 2)[:, :, :, None]
    q = fields_in_place(t, th, row_zero(rows)[:, None, None, None], DT, 0, True)  # [R, c, i, k, s1, half]
    if SCALES_IN_HALVES:
        sc = q3_scales_in_halves(P2, j, rows, mask, N)
    else:
        sc = q3_scales(P2, j, rows, mask, N)
    # d loaded alone (a memory latency a step): read in words (field_f16_words) the tile spilled
    # (sm_90, BM = 16: 2549 instructions a step against 970)
    dl = (field_f16(P3, j, rows, mask, N) * sc.to(tl.float32)).to(DT)
    return fragment_order_256(tl.reshape(q * by_thread_and_field(dl), (R, 4, 8, 2, 2, 2)))


@triton.jit
def q3_k_half(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, DT: tl.constexpr):
    """The swapped BM = 32 tile's (q3_k_half_scaled): the scales from scale_bytes' 16-byte
    row. Read in halves they cost it 20 instructions a step more (sm_90, fp16 x: 870 -> 890)
    and shared memory past configs.SHARED_ROW_BYTES' estimate."""
    return q3_k_half_scaled(P0, P1, P2, P3, j, rows, mask, N, DT, False)


@triton.jit
def q3_k_half_m16(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, DT: tl.constexpr):
    """The BM = 16 tile's (q3_k_half_scaled), x the MMA's A operand: the scales read in
    halves (q3_scales_in_halves), x's tile then read by ldmatrix (sm_90, fp16 x: 970 -> 794
    instructions a step, 130 register moves fewer)."""
    return q3_k_half_scaled(P0, P1, P2, P3, j, rows, mask, N, DT, True)


@register("Q3_K", 256, ("hmask", "qs", "scales", "d"), dot=q3_k_dot, x_int8=True,
          dequant_half=q3_k_half, narrow_f16=q3_k_half_m16, f16_nibble_run=-2, wide_f16="float32")
@triton.jit
def q3_k(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N):
    dl = field_f16_words(P3, j, rows, mask, N) * q3_scales(P2, j, rows, mask, N).to(tl.float32)
    q = bit_fields(field_bytes(P1, j, rows, mask, N, 64), 2, 2)
    # A clear hmask bit is what subtracts 4: q = low - 4 * (1 - high).
    q |= bit_fields(field_bytes(P0, j, rows, mask, N, 32), 1, 1) << 2
    return (q.to(tl.int32) - 4).to(tl.float32) * per_weight(dl, 16)


@triton.jit
def scaled_minus_min(P0, P1, P2, j, rows, mask, N, q):
    """Q4_K/Q5_K: (d * scale) * q - dmin * min, over 8 sub-blocks of 32."""
    sc, mn = scales_mins(P2, j, rows, mask, N)
    d, dmin = field16_pair_in_words(P0, P1, j, rows, mask, N)
    dl = f16_of_word(d)[:, None] * sc.to(tl.float32)
    ml = f16_of_word(dmin)[:, None] * mn.to(tl.float32)
    return q.to(tl.float32) * per_weight(dl, 32) - per_weight(ml, 32)


@triton.jit
def scaled_minus_min_f16(P0, P1, P2, j, rows, mask, N, q):
    """scaled_minus_min for float16 (or bfloat16) q (R, 8, 32): d * scale and dmin * min
    rounded to q's type once per sub-block, then one HFMA a weight pair."""
    R: tl.constexpr = q.shape[0]
    sc, mn = scales_mins(P2, j, rows, mask, N)
    d, dmin = field16_pair_in_words(P0, P1, j, rows, mask, N)
    dl = (f16_of_word(d)[:, None] * sc.to(tl.float32)).to(q.dtype)
    ml = (f16_of_word(dmin)[:, None] * mn.to(tl.float32)).to(q.dtype)
    return tl.reshape(q * dl[:, :, None] - ml[:, :, None], (R, 256))


@triton.jit
def q4_k_half(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, DT: tl.constexpr):
    """Q4_K for the fused GEMM with float16 (or bfloat16) x, in the fragment order (fields.fragment_order_256,
    registry.py): each thread of an MMA fragment unpacks one 32-byte run of nibbles, a word at
    a time (sub-blocks 2c and 2c + 1 of run c: 2 of the 8 scales and mins a row), d * scale and
    dmin * min rounded to float16 once per sub-block, then one HFMA a weight pair: three
    roundings where the float32 function and a conversion round once (tests/test_kernels.py
    holds the bound). sm_90 SASS, the swapped BM = 32 tile's K step: 791 -> 586
    instructions (BENCHMARKS.md "Each thread its own bytes")."""
    R: tl.constexpr = rows.shape[0]
    w = field_run(P3, j, rows, mask, N, 32, 0, 32, tl.int32)
    q = nibbles_f16_fragments(w, row_zero(rows)[:, None, None], DT)  # [R, c, i, s1, s0, half]
    sc, mn = scales_mins(P2, j, rows, mask, N)  # sub-block 2c + s0
    # d and dmin loaded alone (fields.field_f16), a memory latency each a step: read in words
    # (field16_pair_in_words) they cost 2-8% more instructions a step, and the H200 found
    # this tile issue-bound at M = 16, not waiting (BENCHMARKS.md "Scales in words")
    dl = (field_f16(P0, j, rows, mask, N) * sc.to(tl.float32)).to(DT)
    ml = (field_f16(P1, j, rows, mask, N) * mn.to(tl.float32)).to(DT)
    dl = tl.reshape(dl, (R, 4, 1, 1, 2, 1))
    ml = tl.reshape(ml, (R, 4, 1, 1, 2, 1))
    return fragment_order_256(q * dl - ml)


@register("Q4_K", 256, ("d", "dmin", "scales", "qs"), dot=q4_k_dot, dot_parts=(1, 2, 4),
          dequant_half=q4_k_half, f16_nibble_run=-1)
@triton.jit
def q4_k(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N):
    q = bit_fields(field_bytes(P3, j, rows, mask, N, 128), 4, 4)
    return scaled_minus_min(P0, P1, P2, j, rows, mask, N, q)


@triton.jit
def q5_k_half(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, DT: tl.constexpr):
    """Q5_K for the fused GEMM with float16 (or bfloat16) x, as q4_k_half with each weight's fifth bit: group
    g's qs word c holds the low nibbles of sub-block 2g and the high ones of 2g + 1, whose
    fifth bits are bits 2g and 2g + 1 of each byte of qh word c; OR'd above the nibbles in
    place, then the bytes to float16 a word at a time (fields.bytes_f16)."""
    R: tl.constexpr = rows.shape[0]
    qs = tl.reshape(field_run(P4, j, rows, mask, N, 32, 0, 32, tl.int32), (R, 4, 1, 8))
    qh = field_run(P3, j, rows, mask, N, 8, 0, 8, tl.int32).to(tl.uint32, bitcast=True)
    high = tl.arange(0, 2)[None, None, :, None]  # the high nibbles: sub-block 2g + 1
    fifth = 2 * tl.arange(0, 4)[None, :, None, None] + high  # its bit in each qh byte
    q5 = (((qs.to(tl.uint32, bitcast=True) >> (4 * high)) & 0x0F0F0F0F)
          | (((tl.reshape(qh, (R, 1, 1, 8)) >> fifth) << 4) & 0x10101010))
    BASE: tl.constexpr = 128.0 if DT == tl.bfloat16 else 1024.0
    v = bytes_f16(tl.reshape(q5.to(tl.int32, bitcast=True), (R, 64)), opaque_zero(N), DT)
    q = tl.reshape(v - BASE, (R, 8, 32))
    return scaled_minus_min_f16(P0, P1, P2, j, rows, mask, N, q)


@register("Q5_K", 256, ("d", "dmin", "scales", "qh", "qs"), dot=q5_k_dot, dot_parts=(1, 2, 4),
          dequant_half=q5_k_half)
@triton.jit
def q5_k(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N):
    q = bit_fields(field_bytes(P4, j, rows, mask, N, 128), 4, 4)
    q |= bit_fields(field_bytes(P3, j, rows, mask, N, 32), 1, 1) << 4
    return scaled_minus_min(P0, P1, P2, j, rows, mask, N, q)


@triton.jit
def q6_k_half(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, DT: tl.constexpr):
    """Q6_K for the fused GEMM with float16 (or bfloat16) x: weights 128n + 32k + l take 4
    bits from ql byte 64n + l (k even) or 64n + 32 + l (k odd), low nibble for k < 2, and 2
    bits from qh byte 32n + l at bit 2k, assembled a word (4 weights) at a time, then the
    bytes to float16
    (fields.bytes_f16); d * scale rounded to float16 once a sub-block of 16, then one HMUL a
    weight pair: within two roundings (tests/test_kernels.py holds the bound)."""
    R: tl.constexpr = rows.shape[0]
    ql = field_run(P0, j, rows, mask, N, 32, 0, 32, tl.int32).to(tl.uint32, bitcast=True)
    qh = field_run(P1, j, rows, mask, N, 16, 0, 16, tl.int32).to(tl.uint32, bitcast=True)
    top = tl.arange(0, 2)[None, None, :, None, None]  # k // 2: the high nibbles
    odd = tl.arange(0, 2)[None, None, None, :, None]  # k % 2: ql's second run of 32 bytes
    k = 2 * top + odd
    q6 = (((tl.reshape(ql, (R, 2, 1, 2, 8)) >> (4 * top)) & 0x0F0F0F0F)
          | (((tl.reshape(qh, (R, 2, 1, 1, 8)) >> (2 * k)) << 4) & 0x30303030))
    BIAS: tl.constexpr = 160.0 if DT == tl.bfloat16 else 1056.0
    v = bytes_f16(tl.reshape(q6.to(tl.int32, bitcast=True), (R, 64)), opaque_zero(N), DT)
    q = tl.reshape(v - BIAS, (R, 16, 16))  # (1024 + q) - 1056 = q - 32, exactly
    sc = field_bytes(P2, j, rows, mask, N, 16).to(tl.int8, bitcast=True)
    dl = (field_f16_words(P3, j, rows, mask, N) * sc.to(tl.float32)).to(DT)
    return tl.reshape(q * dl[:, :, None], (R, 256))


@register("Q6_K", 256, ("ql", "qh", "scales", "d"), dot=q6_k_dot, dequant_half=q6_k_half)
@triton.jit
def q6_k(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N):
    sc = field_bytes(P2, j, rows, mask, N, 16).to(tl.int8, bitcast=True)
    dl = field_f16_words(P3, j, rows, mask, N) * sc.to(tl.float32)
    q = bit_fields(field_bytes(P0, j, rows, mask, N, 128), 2, 4)
    q |= bit_fields(field_bytes(P1, j, rows, mask, N, 64), 2, 2) << 4
    return (q.to(tl.int32) - 32).to(tl.float32) * per_weight(dl, 16)
