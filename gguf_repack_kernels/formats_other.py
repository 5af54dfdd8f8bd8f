"""Ternary (TQ1_0, TQ2_0) and FP4 microscaling (MXFP4, NVFP4) types.

Every small value table here is a few integer operations, cheaper than a gather from memory.
"""

from functools import cache

import numpy as np
import torch
import triton
import triton.language as tl

from .fields import (
    INTERPRETED,
    bf16_pair,
    bf16_pair_words,
    bits_at,
    byte_in_word16,
    concat,
    dot4,
    dot4_2bit,
    f16_halves,
    field_bytes,
    field_f16,
    field_run,
    field_word,
    fragment_order_256,
    int8_words,
    lookup16,
    lookup16_nibbles_int8,
    lookup16_ptx,
    lookup_run_dot_int8,
    nibbles,
    opaque_zero,
    row_u8,
    row_word,
    row_words,
    row_zero,
    scale_f16,
    split4,
    swap_middle_bytes,
    words4,
    x4,
    x8_scale,
    x8_words,
    x_sum,
)
from .formats_kquants import by_thread_and_field, qs_fields_half
from .registry import register


@triton.jit
def cat4(a, b, c, d):
    return concat(concat(a, b), concat(c, d))


# --- Ternary ------------------------------------------------------------------------------


@triton.jit
def trits(b):
    """Bytes already multiplied by 3**j (wrapped to 8 bits) -> their trit j as -1, 0, 1: the
    byte is a base-3 fraction scaled to 256, so `* 3 >> 8` reads its leading digit."""
    return ((b.to(tl.uint8).to(tl.int16) * 3) >> 8) - 1


def tq1_digits() -> np.ndarray:
    """Every byte's 5 base-3 digits as ggml reads them (digit k: ((v * 3**k) % 256 * 3) >> 8,
    less 1), float32 [256, 5]."""
    v = np.arange(256, dtype=np.int64)[:, None] * (3 ** np.arange(5))[None, :]
    return (((v % 256) * 3 >> 8) - 1).astype(np.float32)


@cache
def tq1_table(device: torch.device) -> torch.Tensor:
    """For the GEMV: per byte value a row of 4 words, its 5 digits as bfloat16 (two a word,
    low half first; -1, 0, 1 are exact) and 3 zeros."""
    rows = np.zeros((256, 8), np.float32)
    rows[:, :5] = tq1_digits()
    return torch.from_numpy(bf16_pair_words(rows)).to(device)


@triton.jit
def digit_rows(TABLE, w):
    """The digit rows of the 4 bytes of w (tq1_table), each as its 4 words: 16 int32 [R]."""
    return (split4(row_words(TABLE, 0, bits_at(w, 0, 8, 0), 4)),
            split4(row_words(TABLE, 0, bits_at(w, 8, 8, 0), 4)),
            split4(row_words(TABLE, 0, bits_at(w, 16, 8, 0), 4)),
            split4(row_words(TABLE, 0, bits_at(w, 24, 8, 0), 4)))


@triton.jit
def digit(row, K: tl.constexpr):
    """Digit K of a byte's digit row (its 4 words of bfloat16 pairs) as float32 [R]."""
    return bf16_pair(row[K // 2])[K % 2]


@triton.jit
def mac_digits(acc, w, TABLE, XB, DIGITS: tl.constexpr, FIRST: tl.constexpr, STRIDE: tl.constexpr):
    """acc + digit k of byte b of w times x[FIRST + STRIDE k + b], k < DIGITS: a run of
    ggml's TQ1_0 bytes holds its weights digit-major."""
    r = digit_rows(TABLE, w)
    for k in tl.static_range(DIGITS):
        x0, x1, x2, x3 = x4(XB, FIRST + STRIDE * k)
        acc += digit(r[0], k) * x0
        acc += digit(r[1], k) * x1
        acc += digit(r[2], k) * x2
        acc += digit(r[3], k) * x3
    return acc


@triton.jit
def tq1_0_dot(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, XB, SB, part, PARTS: tl.constexpr):
    """TQ1_0: qs bytes 0..31 hold 5 digits each (weights 32k + l), qs bytes 32..47 5 each
    (160 + 16k + l), qh's 4 bytes 4 each (240 + 4k + l); each byte's digits are one row of
    tq1_table."""
    acc = tl.zeros(rows.shape, tl.float32)
    for q in tl.static_range(2):
        w = words4(P0, j, rows, mask, N, 12, 4 * q)
        for c in tl.static_range(4):
            acc = mac_digits(acc, w[c], TABLE, XB, 5, 16 * q + 4 * c, 32)
    w = words4(P0, j, rows, mask, N, 12, 8)
    for c in tl.static_range(4):
        acc = mac_digits(acc, w[c], TABLE, XB, 5, 160 + 4 * c, 16)
    qh = row_word(P1, j, rows, mask, N, 1, 0) | (w[0] & opaque_zero(N))
    acc = mac_digits(acc, qh, TABLE, XB, 4, 240, 4)
    return scale_f16(P2, j, rows, mask, N) * acc


# 1024 + y (two float16 lanes) times 3/256 (0x2200) plus 1013.5 (0x63EB), rounded once
TRIT_PAIR_PTX = tl.constexpr("fma.rn.f16x2 $0, $1, $2, $3;")


# a word's bytes 0, 1 and 2, 3 in 16-bit lanes: 0x00b100b0, 0x00b300b2
BYTE_LANES_PTX = tl.constexpr("prmt.b32 $0, $2, 0, 0x4140; prmt.b32 $1, $2, 0, 0x4342;")


@triton.jit
def byte_lanes(w):
    """int32 [...] -> int32 [..., 2]: pair e of each word's bytes (2e, 2e + 1), each in a
    16-bit lane (one PRMT a pair)."""
    if INTERPRETED:
        return tl.join((w & 0xFF) | ((w << 8) & 0xFF0000), ((w >> 16) & 0xFF) | ((w >> 8) & 0xFF0000))
    else:
        lo, hi = tl.inline_asm_elementwise(BYTE_LANES_PTX, "=r,=r,r", [w], dtype=(tl.int32, tl.int32),
                                           is_pure=True, pack=1)
        return tl.join(lo, hi)


@triton.jit
def trit_pairs(u, M, Z, DT: tl.constexpr):
    """Words of two 16-bit lanes, each a byte b (u: 0x00bb00bb), times 3**k (M, up to 81:
    no lane carries) -> DT [..., 2] of the bits of float16 1026 + digit k of each lane's byte
    (ggml's ((b 3**k) % 256 * 3) >> 8). The lane's low byte y = (b 3**k) % 256 goes under
    float16's exponent (1024 + y, one LOP3), and one HFMA rounds 1024 + y times 3/256 plus
    1013.5 = 1025.5 + 3y/256 to the integer 1026 + floor(3y/256): the only tie, y = 0, goes
    to 1026, even. As bfloat16 the same bits are (1 + (2 + digit) / 128) 2**73
    (tq1_0_half)."""
    v = ((u * M) & (0x00FF00FF + Z)) | (0x64006400 + Z)
    if INTERPRETED:  # the exact product and sum in float32, rounded once to float16, as HFMA2
        r = (f16_halves(v, tl.float16).to(tl.float32) * 0.01171875 + 1013.5).to(tl.float16)
        return r.to(tl.int16, bitcast=True).to(DT, bitcast=True)
    else:
        r = tl.inline_asm_elementwise(TRIT_PAIR_PTX, "=r,r,r,r", [v, 0x22002200 + Z, 0x63EB63EB + Z],
                                      dtype=tl.int32, is_pure=True, pack=1)
        return f16_halves(r, DT)


@triton.jit
def tq1_0_trits_half(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, DT: tl.constexpr):
    """TQ1_0's digits in its fragment order (tq1_0_half), as DT bits of float16 1026 + digit
    (trit_pairs): [R, c, word s, slot k, lane pair e, half]."""
    c = tl.arange(0, 4)[:, None]
    w = tl.arange(0, 4)[None, :]
    # word s of thread c: qs words 2c, 2c + 1, 8 + c (and 8 + c again, for qh's word)
    at = tl.where(w < 2, 2 * c + w, 8 + c)
    base = (j * N + rows).to(tl.int64)[:, None, None]
    qs = tl.load(P0.to(tl.pointer_type(tl.int32)) + base * 12 + at[None], mask=mask[:, None, None], other=0)
    qh = field_word(P1, j, rows, mask, N, 1, 0)[:, None, None]
    words = tl.where(w[None] < 3, qs, qh)
    Z = row_zero(rows)[:, None, None, None, None]
    s = tl.arange(0, 4)[:, None]
    k = tl.arange(0, 4)[None, :]
    # row s < 3: word s, digit k; row 3: word k, digit 4 (qh's: digit c)
    src = tl.where((s == 3)[None, None], words[:, :, None, :], words[:, :, :, None])  # [R, c, s, k]
    pow3 = tl.where(k == 0, 1, tl.where(k == 1, 3, tl.where(k == 2, 9, 27)))  # [1, k]
    c3 = tl.where(c == 0, 1, tl.where(c == 1, 3, tl.where(c == 2, 9, 27)))[:, :, None]  # [c, 1, 1]
    m = tl.where(s == 3, tl.where(k == 3, c3, 81), pow3)  # [c, s, k]
    u = byte_lanes(src)  # [R, c, s, k, lane pair e]
    return trit_pairs(u, m[None, :, :, :, None], Z, DT)  # [R, c, s, k, e, half]


# float16: 1026 + digit less 1027 is digit - 1. bfloat16: the float16 bits of 1026 + digit
# read as bfloat16, (1 + (2 + digit) / 128) 2**73, less (1 + 3 / 128) 2**73 is (digit - 1)
# 2**66 exactly, which d 2**-66 scales (no conversion a pair)
TQ1_BASE_F16 = tl.constexpr(1027.0)
TQ1_BASE_BF16 = tl.constexpr(1.0234375 * 2.0 ** 73)
TQ1_SCALE_BF16 = tl.constexpr(2.0 ** -66)


@triton.jit
def tq1_0_half(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, DT: tl.constexpr):
    """TQ1_0 for the fused GEMM's tiles with float16 (or bfloat16) x, in its own fragment
    order (fields.tile_columns, RUN = -4): an MMA fragment's thread c takes qs words 2c and
    2c + 1 (of the run of 32 bytes, 5 digits a byte), qs word 8 + c (of the run of 16) and
    digit c of qh's 4 bytes: 64 weights, its k = 2c, 2c + 1, 2c + 8, 2c + 9 of each 16. As
    [R, c, word s, slot k, lane pair e, half]: digits 0..3 of words a0, a1, b, then in the
    fourth row digit 4 of a0, a1, b and digit c of qh. A word's bytes 0, 1 and 2, 3 go into
    16-bit lanes (byte_lanes: a PRMT each); the lanes times 3**digit are one IMAD, then
    trit_pairs (a LOP3 and an HFMA), less a constant and times d (an HADD and an HMUL):
    exact in float16 (d times -1, 0 or 1), d rounded once in bfloat16. d is loaded alone
    and broadcast as Q2_K's scales are (read in its word, Triton sent the whole weight tile
    through shared memory: 501 -> 1737 instructions a step, BM = 16, float16 x). The tiles
    of BM >= 64 take the float32 function (this one spilled in their K loop: 21-45 loads);
    the BM = 16 tile tq1_0_digits_half and d after the MMA."""
    R: tl.constexpr = rows.shape[0]
    q = tq1_0_trits_half(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, DT)
    BASE: tl.constexpr = TQ1_BASE_BF16 if DT == tl.bfloat16 else TQ1_BASE_F16
    SCALE: tl.constexpr = TQ1_SCALE_BF16 if DT == tl.bfloat16 else 1.0
    d = field_f16(P2, j, rows, mask, N) * SCALE
    d = tl.reshape(tl.broadcast_to(d, (R, 16)).to(DT), (R, 4, 1, 4, 1, 1))
    q = (q - BASE) * d
    return fragment_order_256(tl.reshape(q, (R, 4, 8, 2, 2, 2)))


@triton.jit
def tq1_0_digits_half(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, DT: tl.constexpr):
    """tq1_0_half without d: digit - 1 (bfloat16: times 2**66), exactly, in the same order;
    the BM = 16 tile multiplies each block's MMA sum by tq1_0_block_scale (gemm.py's
    BLOCK_SCALE): an HMUL a pair of weights less, 8 FFMAs a thread a block more."""
    R: tl.constexpr = rows.shape[0]
    q = tq1_0_trits_half(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, DT)
    BASE: tl.constexpr = TQ1_BASE_BF16 if DT == tl.bfloat16 else TQ1_BASE_F16
    return fragment_order_256(tl.reshape(q - BASE, (R, 4, 8, 2, 2, 2)))


@triton.jit
def tq1_0_block_scale(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, DT: tl.constexpr):
    """Each row's d for block column j, float32 [len(rows)], for tq1_0_digits_half's DT."""
    SCALE: tl.constexpr = TQ1_SCALE_BF16 if DT == tl.bfloat16 else 1.0
    return tl.reshape(field_f16(P2, j, rows, mask, N), (rows.shape[0],)) * SCALE


@register("TQ1_0", 256, ("qs", "qh", "d"), table=tq1_table, dot=tq1_0_dot, dequant_half=tq1_0_half,
          f16_nibble_run=-4, wide_f16="float32", scaled_after=(tq1_0_digits_half, tq1_0_block_scale))
@triton.jit
def tq1_0(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N):
    # ggml's weight order is digit-major within each of three byte runs: qs[0:32] holds 5
    # trits a byte (weights 0..159), qs[32:48] 5 (160..239), qh[0:4] 4 (240..255). Neither
    # 48 bytes nor 5 digits is a power of two, so the 256 weights are assembled from pieces
    # of 16 and 32 by pairwise concatenation. uint8 products wrap, which drops the digits before j.
    a = field_run(P0, j, rows, mask, N, 48, 0, 32, tl.uint8)
    b = field_run(P0, j, rows, mask, N, 48, 32, 16, tl.uint8)
    h = field_bytes(P1, j, rows, mask, N, 4)
    first = cat4(a, a * 3, a * 9, a * 27)
    qh = cat4(h, h * 3, h * 9, h * 27)
    rest = concat(concat(a * 81, concat(b, b * 3)), concat(concat(b * 9, b * 27), concat(b * 81, qh)))
    q = trits(concat(first, rest))
    return q.to(tl.float32) * field_f16(P2, j, rows, mask, N)


@triton.jit
def tq2_0_dot(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, XB, SB, part, PARTS: tl.constexpr):
    """TQ2_0 (int8 x): weight 128h + 32g + l is bits 2g..2g+1 of byte 32h + l, less 1:
    d * (sum(q x) - sum(x)), the 2-bit fields multiplied where they lie, 4 a DP4A (as
    Q2_K's)."""
    acc = tl.zeros(rows.shape, tl.float32)
    for h in tl.static_range(2):
        w_lo = words4(P0, j, rows, mask, N, 16, 8 * h)  # bytes 32h + l, l < 16
        w_hi = words4(P0, j, rows, mask, N, 16, 8 * h + 4)  # l >= 16
        for g in tl.static_range(4):
            at = 128 * h + 32 * g
            s = dot4_2bit(tl.zeros(rows.shape, tl.int32), w_lo[0], w_lo[1], w_lo[2], w_lo[3],
                          XB, at, g)
            s = dot4_2bit(s, w_hi[0], w_hi[1], w_hi[2], w_hi[3], XB, at + 16, g)
            acc += s.to(tl.float32) * (x8_scale(XB, 256, at) * (1.0 / (1 << (2 * g))))
    return scale_f16(P1, j, rows, mask, N) * (acc - x_sum(SB, 0, 256))


@triton.jit
def tq2_0_half(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, DT: tl.constexpr):
    """TQ2_0 for the fused GEMM's tiles with float16 (or bfloat16) x, in Q2_K's 2-bit fragment
    order (fields.tile_columns, RUN = -2): its qs bytes are Q2_K's (field g of byte 32h + l is
    weight 128h + 32g + l), unpacked as formats_kquants.q2_k_half unpacks them, two fields a
    shift and a LOP3 under float16's exponent, less 1025 (code - 1, exactly), times d: exact in
    float16 (d times -1, 0 or 1), and in bfloat16 d's one rounding. d is loaded alone and
    broadcast as Q2_K's scales are (by_thread_and_field): read in its word, or multiplied as
    [R, 1], the product sent the weight tile through shared memory (sm_90, BM = 16: 1274
    instructions a step and spills, against 389). Not behind the kWidth fence (947, spilling).
    The 64-row tiles take the float32 function (the expert one spilled in its K loop)."""
    R: tl.constexpr = rows.shape[0]
    d = field_f16(P1, j, rows, mask, N)  # [R, 1]
    dl = by_thread_and_field(tl.broadcast_to(d, (R, 16)).to(DT))
    q = tq2_0_codes_less_one(P0, j, rows, mask, N, DT) * dl
    return fragment_order_256(tl.reshape(q, (R, 4, 8, 2, 2, 2)))


@triton.jit
def tq2_0_codes_less_one(P0, j, rows, mask, N, DT: tl.constexpr):
    """TQ2_0's codes less 1, exactly, DT [R, c, i, k, s1, half] (qs_fields_half's order)."""
    return qs_fields_half(P0, j, rows, mask, N, DT, 1)


@triton.jit
def tq2_0_digits_half(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, DT: tl.constexpr):
    """tq2_0_half without d: code - 1, exactly, in the same order, for the BM = 16 tile, which
    multiplies each block's MMA sum by tq2_0_block_scale (gemm.py's BLOCK_SCALE)."""
    R: tl.constexpr = rows.shape[0]
    q = tq2_0_codes_less_one(P0, j, rows, mask, N, DT)
    return fragment_order_256(tl.reshape(q, (R, 4, 8, 2, 2, 2)))


@triton.jit
def tq2_0_block_scale(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, DT: tl.constexpr):
    """Each row's d for block column j, float32 [len(rows)]."""
    return tl.reshape(field_f16(P1, j, rows, mask, N), (rows.shape[0],))


@register("TQ2_0", 256, ("qs", "d"), dot=tq2_0_dot, x_int8=True, dequant_half=tq2_0_half,
          f16_nibble_run=-2, wide_f16="float32", scaled_after=(tq2_0_digits_half, tq2_0_block_scale))
@triton.jit
def tq2_0(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N):
    # Each 32-byte half holds 4 groups of 32 weights, group g in bits 2g..2g+1. Raw code 3,
    # which valid data never holds, gives 2, as in the torch backend.
    halves = tl.reshape(field_bytes(P0, j, rows, mask, N, 64), (rows.shape[0], 2, 1, 32))
    shifts = (2 * tl.arange(0, 4)).to(tl.uint8)[None, None, :, None]
    codes = tl.reshape((halves >> shifts) & 0x03, (rows.shape[0], 256))
    q = codes.to(tl.int8) - 1
    return q.to(tl.float32) * field_f16(P1, j, rows, mask, N)


# --- FP4 microscaling ---------------------------------------------------------------------


E2M1_DOUBLED = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12]
E2M1_PTX = tl.constexpr(lookup16_ptx(E2M1_DOUBLED))


@triton.jit
def e2m1_doubled(code, TABLE):
    """4-bit E2M1 code -> twice its value as float32 (gguf-py's kvalues): 0, 1, 2, 3, 4, 6,
    8, 12, negated by bit 3; code 8 gives +0.0, as gguf-py's table does. Looked up 4 codes at
    a time from the instruction stream (fields.lookup16); the table's first 16 words are
    these values for the interpreter."""
    return lookup16(code, TABLE, E2M1_PTX)


@triton.jit
def e2m1_f16(w, RUN: tl.constexpr, Z, DT: tl.constexpr = tl.float16):
    """int32 [R, n] (the words of n * 4 bytes of E2M1 codes, read as runs of RUN words) ->
    float16 [R, 8n], twice each code's value (gguf-py's kvalues; +0.0 for code 8), exactly,
    in ggml's order: per run, every byte's low nibble, then every high one. Built from the
    codes' bits, a word at a time, as fields.nibbles_f16 unpacks nibbles: a code is a
    float16 of its own, its sign bit put at bit 15 and its 2 exponent and 1 mantissa bits at
    bits 11-9 giving its value times 2**-14 exactly (E2M1's exponent 0 is float16's
    subnormal: 0.5 * 2**-14); two shifts (one for the top pair of a word) and two LOP3s a
    pair of codes, then one HFMA2, times 2**15 plus +0.0 (which turns code 8's -0.0 into
    +0.0). Against a lookup (lookup16: 13 instructions for 4 codes and 2 moves of its table;
    and an order of its own, in which the weight tile went through shared memory on its way
    to a wgmma), sm_90 SASS: BENCHMARKS.md "FP4 from its bits". Z: opaque_zero (keeps the
    two masks in registers). DT bfloat16: the same, its exponent and mantissa bits at 8-6
    (bfloat16's 7 mantissa bits to float16's 10), its value times 2**-126 (exponent 0 the
    subnormal 0.5 * 2**-126), times 2**127."""
    R: tl.constexpr = w.shape[0]
    n: tl.constexpr = w.shape[1]
    t = swap_middle_bytes(w)[:, :, None, None]  # bytes 0, 2, 1, 3: a pair's codes 16 bits apart
    high = tl.arange(0, 2)[None, None, :, None]  # low or high nibbles
    pair = tl.arange(0, 2)[None, None, None, :]  # bytes 0, 1 or 2, 3 of the word
    # the pair's codes at bits 12-15 and 28-31, their sign bits where float16's are: the
    # exponent and mantissa bits are those 3 below, shifted 3 right (one shift from where
    # they lie in t, where first shifting each pair to bits 0-3 and then to its two places
    # took three: 19 -> 15 integer instructions a word, MXFP4's BM = 32 tile 771 -> 707 a
    # step). Written as four explicit shifts joined, the tile's layout changed and sent
    # MXFP4's weights through shared memory again.
    top = t << (12 - 4 * high - 8 * pair)
    if DT == tl.bfloat16:
        v = (top & (-0x7FFF8000 + Z)) | ((top >> 6) & (0x01C001C0 + Z))
        q = f16_halves(v, DT) * 1.7014118346046923e38 + 0.0  # 2**127
    else:
        v = (top & (-0x7FFF8000 + Z)) | ((top >> 3) & (0x0E000E00 + Z))  # 0x80008000
        q = f16_halves(v) * 32768.0 + 0.0
    q = tl.reshape(q, (R, n // RUN, RUN, 2, 2, 2))  # [R, run, word, high, pair, half]
    return tl.reshape(tl.permute(q, (0, 1, 3, 2, 4, 5)), (R, 8 * n))


@triton.jit
def e8m0_half(e):
    """E8M0 byte -> 2**(e - 128) as float32, from its bits: e = 0 and 1 give the subnormals
    2**-128 and 2**-127, and e = 255 (E8M0's NaN) the finite 2**127, as gguf-py decodes."""
    e = e.to(tl.int32)
    bits = tl.where(e < 2, 0x00200000 << e, (e - 1) << 23)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def ue4m3_half(x):
    """UE4M3 byte -> half its value as float32, as gguf-py decodes it: the sign bit ignored,
    0x7F (E4M3's NaN) gives 0. Every value is a float32 exactly, built from its bits when
    normal ((1 + man/8) * 2**(exp - 8)) and as man * 2**-10 when subnormal."""
    x = x.to(tl.int32)
    exp, man = (x >> 3) & 0xF, x & 0x7
    normal = (((exp + 119) << 23) | (man << 20)).to(tl.float32, bitcast=True)
    value = tl.where(exp == 0, man.to(tl.float32) * 0.0009765625, normal)
    return tl.where(x == 0x7F, 0.0, value)


def e8m0_f16_scale_pairs() -> np.ndarray:
    """For each E8M0 byte e, the two float16 powers of two that mxfp4_f16 scales a doubled
    E2M1 value by, one word each (2**a in the low half, 2**b in the high one): 2**(e - 128)
    reaches far outside float16's range, so a = e - 128 clamped to -14..11 leaves every
    doubled value (1 to 12) a normal float16 exactly, and b = (e - 128) - a clamped to
    -24..15 rounds once. Where b is clamped the product is 0 or infinite either way
    (12 * 2**-38 < 2**-25; 2**26). A table: the clamps and conversions cost the tile's loop
    some 9 instructions a row and block (sm_90 SASS), its load 3."""
    k = np.arange(256) - 128
    a = np.clip(k, -14, 11)
    b = np.clip(k - a, -24, 15)
    halves = [np.exp2(p.astype(np.float64)).astype(np.float16).view(np.uint16).astype(np.uint32)
              for p in (a, b)]
    return (halves[0] | halves[1] << 16).view(np.int32)


@cache
def e2m1_table(device: torch.device) -> torch.Tensor:
    """Twice the 16 E2M1 values (OCP microscaling; gguf-py's kvalues), for the GEMV's
    lookups and the interpreter's (on a GPU the dequant functions take them from the
    instruction stream); then mxfp4_f16's 256 float16 scale pairs (e8m0_f16_scale_pairs)."""
    words = np.concatenate([np.array(E2M1_DOUBLED, np.int32), e8m0_f16_scale_pairs()])
    return torch.from_numpy(words).to(device)


def ue4m3_halves() -> np.ndarray:
    """Every UE4M3 scale byte's value, halved, as float32, decoded as gguf-py does (bits 0-6
    only, 0x7F alone is 0): subnormals man * 2**-10, normals (1 + man/8) * 2**(exp - 8)."""
    x = np.arange(256)
    exp, man = (x >> 3) & 0xF, (x & 7).astype(np.float64)
    value = np.where(exp == 0, man * 2.0**-10, (1 + man / 8) * 2.0 ** (exp - 8))
    return np.where(x == 0x7F, 0.0, value).astype(np.float32)


# where nvfp4_table's float16 scales start: after the 16 E2M1 values and 256 float32 scales
NVFP4_F16_SCALES = tl.constexpr(16 + 256)


@cache
def nvfp4_table(device: torch.device) -> torch.Tensor:
    """E2M1 values (16 int32), then the 256 halved UE4M3 scales (float32 bits): the GEMV
    looks a block's 4 scales up instead of decoding them; then the same as float16 (a word
    each, in its low half), for the fused GEMM's tiles (nvfp4_f16)."""
    halves = ue4m3_halves()
    as_f16 = halves.astype(np.float16).view(np.uint16).astype(np.int32)  # exact: 2**-10 .. 224
    words = np.concatenate([np.array(E2M1_DOUBLED, np.int32), halves.view(np.int32), as_f16])
    return torch.from_numpy(words).to(device)


E2M1_W0, E2M1_W1, E2M1_W2, E2M1_W3 = (tl.constexpr(w) for w in int8_words(E2M1_DOUBLED))


@triton.jit
def mxfp4_dot(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, XB, SB, part, PARTS: tl.constexpr):
    """MXFP4 (int8 x): the doubled E2M1 values as int8, 8 a lookup and 4 a DP4A
    (fields.lookup_run_dot_int8), times 2**(e - 128) and x's scale."""
    s = lookup_run_dot_int8(TABLE, E2M1_W0, E2M1_W1, E2M1_W2, E2M1_W3, P1, j, rows, mask, N, XB, 4, 0)
    return (e8m0_half(row_u8(P0, j, rows, mask, N)) * x8_scale(XB, 32, 0)) * s.to(tl.float32)


@triton.jit
def e8m0_row_byte(P, j, rows, mask, N, IN_HALVES: tl.constexpr):
    """MXFP4's one E8M0 byte a row of block column j, int32 [R]: loaded as [R] and broadcast
    by the caller (as field_h does: row_u8's layout, or field_bytes' [R, 1], sent the GEMM's
    tile through shared memory, 16-19 more instructions), or IN_HALVES from the 16-bit word
    that holds it (fields.byte_in_word16)."""
    at = (j * N + rows).to(tl.int64)
    if IN_HALVES:
        return byte_in_word16(P, at >> 1, (at & 1).to(tl.int32), mask) & 255
    else:
        return tl.load(P.to(tl.pointer_type(tl.uint8)) + at, mask=mask, other=0).to(tl.int32)


@triton.jit
def mxfp4_f16(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, IN_HALVES: tl.constexpr):
    """The float32 weights rounded to float16, bit for bit, computed in float16: the doubled
    E2M1 values times the two float16 powers of two of the row's E8M0 byte (rounding once),
    looked up from TABLE (e8m0_f16_scale_pairs, after the 16 E2M1 values)."""
    e = e8m0_row_byte(P0, j, rows, mask, N, IN_HALVES)
    pair = tl.load(TABLE.to(tl.pointer_type(tl.int32)) + 16 + e)[:, None]
    scale_a = pair.to(tl.int16).to(tl.float16, bitcast=True)
    scale_b = (pair >> 16).to(tl.int16).to(tl.float16, bitcast=True)
    q = e2m1_f16(field_run(P1, j, rows, mask, N, 4, 0, 4, tl.int32), 4, opaque_zero(N))
    return q * scale_a * scale_b


@triton.jit
def mxfp4_bf16(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, IN_HALVES: tl.constexpr):
    """The float32 weights rounded to bfloat16, bit for bit, computed in bfloat16: the doubled
    E2M1 values times 2**(e - 128), which bfloat16 holds for every E8M0 byte (2**-128 and
    2**-127 subnormal; e = 255 the finite 2**127, as gguf-py decodes), so one product rounds
    once. Its bits from e's, as e8m0_half's."""
    e = e8m0_row_byte(P0, j, rows, mask, N, IN_HALVES)
    bits = tl.where(e < 2, 0x20 << e, (e - 1) << 7)
    scale = bits.to(tl.int16).to(tl.bfloat16, bitcast=True)[:, None]
    q = e2m1_f16(field_run(P1, j, rows, mask, N, 4, 0, 4, tl.int32), 4, opaque_zero(N), tl.bfloat16)
    return q * scale


@triton.jit
def mxfp4_half(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, DT: tl.constexpr):
    if DT == tl.bfloat16:
        return mxfp4_bf16(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, False)
    else:
        return mxfp4_f16(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, False)


@triton.jit
def mxfp4_half_m16(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, DT: tl.constexpr):
    """The BM = 16 tile's (registry.py's narrow_f16): E8M0 bytes read in 16-bit words."""
    if DT == tl.bfloat16:
        return mxfp4_bf16(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, True)
    else:
        return mxfp4_f16(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, True)


@register("MXFP4", 32, ("e", "qs"), table=e2m1_table, dot=mxfp4_dot, x_int8=True, dequant_half=mxfp4_half,
          narrow_f16=mxfp4_half_m16)
@triton.jit
def mxfp4(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N):
    scale = e8m0_half(field_bytes(P0, j, rows, mask, N, 1))  # [R, 1]
    return e2m1_doubled(nibbles(field_bytes(P1, j, rows, mask, N, 16)), TABLE) * scale


@triton.jit
def nvfp4_dot(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, XB, SB, part, PARTS: tl.constexpr):
    """NVFP4 (int8 x): four sub-blocks of 16, sub-block s qs bytes 8s..8s+7 (weights 16s + i
    in the low nibbles, 16s + 8 + i in the high ones) and byte s of d, its UE4M3 scale; the
    doubled E2M1 values as int8, 8 a lookup and 4 a DP4A (fields.lookup16_nibbles_int8), each
    sub-block's sum times its scale, each 32's times x's."""
    scales = row_word(P0, j, rows, mask, N, 1, 0)
    Z = opaque_zero(N)
    acc = tl.zeros(rows.shape, tl.float32)
    for half in tl.static_range(2):
        w = words4(P1, j, rows, mask, N, 8, 4 * half)
        by_scale = tl.zeros(rows.shape, tl.float32)
        for t in tl.static_range(2):
            s = 2 * half + t
            xs = x8_words(XB, 16 * s)  # x[16s..16s+15]
            isum = tl.zeros(rows.shape, tl.int32)
            for c in tl.static_range(2):  # byte b of word 2t + c: byte 4c + b of the sub-block
                lo, hi = lookup16_nibbles_int8(w[2 * t + c], TABLE, E2M1_W0, E2M1_W1, E2M1_W2, E2M1_W3, Z)
                isum = dot4(lo, xs[c], isum, A_SIGNED=True)
                isum = dot4(hi, xs[2 + c], isum, A_SIGNED=True)
            scale = tl.load(TABLE.to(tl.pointer_type(tl.float32)) + 16 + ((scales >> (8 * s)) & 0xFF))
            by_scale += scale * isum.to(tl.float32)
        acc += x8_scale(XB, 64, 32 * half) * by_scale
    return acc


@triton.jit
def nvfp4_codes(P1, j, rows, mask, N):
    """Four sub-blocks of 16 weights, each 8 bytes of nibbles (low ones first): [R, 4, 16]."""
    qs = tl.reshape(field_bytes(P1, j, rows, mask, N, 32), (rows.shape[0], 4, 8))
    both = tl.permute(tl.join(qs & 0x0F, qs >> 4), (0, 1, 3, 2))  # [R, 4, 2, 8]
    return tl.reshape(both, (rows.shape[0], 4, 16))


@triton.jit
def nvfp4_half(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, DT: tl.constexpr):
    # the halved UE4M3 scales lie in 2**-10 .. 224 and the values are small integers: both
    # float16 exactly (and bfloat16: 3 mantissa bits), so their product rounds once, as the
    # float32 one converted does; looked up (nvfp4_table's third part) where the decode took
    # some 9 instructions a scale
    codes = field_bytes(P0, j, rows, mask, N, 4).to(tl.int32)
    scale = tl.load(TABLE.to(tl.pointer_type(tl.int32)) + NVFP4_F16_SCALES + codes).to(tl.int16)
    scale = scale.to(tl.float16, bitcast=True).to(DT)[:, :, None]
    # sub-block s: words 2s, 2s + 1, columns 16s..16s+15
    q = e2m1_f16(field_run(P1, j, rows, mask, N, 8, 0, 8, tl.int32), 2, opaque_zero(N), DT)
    return tl.reshape(tl.reshape(q, (rows.shape[0], 4, 16)) * scale, (rows.shape[0], 64))


@register("NVFP4", 64, ("d", "qs"), table=nvfp4_table, dot=nvfp4_dot, x_int8=True, dequant_half=nvfp4_half)
@triton.jit
def nvfp4(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N):
    # each sub-block of 16 weights has its own scale byte
    scale = ue4m3_half(field_bytes(P0, j, rows, mask, N, 4))[:, :, None]  # [R, 4, 1]
    codes = nvfp4_codes(P1, j, rows, mask, N)
    return tl.reshape(e2m1_doubled(codes, TABLE) * scale, (rows.shape[0], 64))
