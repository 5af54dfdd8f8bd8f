"""IQ types: importance-weighted quants over lattice grids and non-linear value tables.

Each type reads one int32 lookup table, built once per device from gguf-py's own class
attributes so it cannot drift from the reference:

* grid rows as signed bytes, four to a word (every grid value is a small integer, so the
  byte -> float32 conversion in the kernel gives gguf-py's float exactly); a row is then
  one (4-wide grids) or two (8-wide grids) gathers instead of one per weight;
* the 128 ksigns bytes (7-bit sign index -> 8 sign bits), at offset 0, grid after them;
* IQ4's 16 kvalues;
* for the GEMV's dot functions, after those: the grid again as bfloat16 rows (IQ1_M: grid +
  1/8, then grid - 1/8) and the sign bytes as bfloat16 sign bits (see _grid_table).

The float32 arithmetic repeats gguf-py's (and the torch backend's) operations in their order;
only the integer unpacking is arranged freely.
"""

from functools import cache

import numpy as np
import torch
import triton
import triton.language as tl

from .fields import (
    INTERPRETED,
    bf16_pairs_scaled,
    bits_at,
    byte_pairs_f16,
    byte_pairs_scaled_f16,
    byte_pairs_times_f16,
    dot4,
    f16_halves,
    f16_pair_word,
    field,
    field16_in_word,
    field_f16,
    field_f16_words,
    field_h,
    field_run,
    fragment_order_32,
    fragment_order_256,
    fragment_order_runs8,
    gather_word_pairs,
    gather_words,
    int8_words,
    lookup16,
    lookup16_bf16,
    lookup16_bf16_words,
    lookup16_bytes,
    lookup16_nibbles,
    lookup16_ptx,
    lookup16_words,
    lookup_run_dot_int8,
    nibbles,
    opaque_zero,
    row_u16,
    row_word,
    row_words,
    row_zero,
    scale_f16,
    shr,
    signed_byte_pairs_shifted_bf16,
    signed_byte_pairs_shifted_f16,
    words2,
    words4,
    x8_scale,
    x8_words,
)
from .registry import register

KSIGNS = tl.constexpr(128)  # ksigns entries; a table holding them puts its grid after

# -- tables ----------------------------------------------------------------------------


def _grid_words(name: str) -> np.ndarray:
    """gguf-py's decoded grid of type `name`, each row as signed bytes packed in int32 words."""
    import gguf.quants

    cls = getattr(gguf.quants, name)
    cls.init_grid()
    grid = cls.grid.reshape(cls.grid_shape)
    as_bytes = grid.astype(np.int8)
    assert np.array_equal(as_bytes.astype(np.float32), grid), name  # integers: bytes are exact
    return np.ascontiguousarray(as_bytes).view("<i4").reshape(-1).astype(np.int32)


def _ksigns() -> np.ndarray:
    import gguf.quants

    return np.frombuffer(gguf.quants.IQ2_XXS.ksigns, dtype=np.uint8).astype(np.int32)


def _kvalues() -> np.ndarray:
    import gguf.quants

    return np.array(gguf.quants.IQ4_NL.kvalues, dtype=np.int32)


def _table(*parts):
    """A table function (device -> int32 tensor) of the concatenated parts, built lazily
    (gguf's grids are decoded on first use) and kept per device."""

    @cache
    def table(device: torch.device) -> torch.Tensor:
        words = np.concatenate([part() for part in parts])
        return torch.from_numpy(words).to(device)

    return table


def _grid(name):
    return lambda: _grid_words(name)


# The GEMV's (dot functions') tables, after the dequant tables: the grid types' GEMVs take
# int8 x and read the dequant's byte grid, 4 weights a DP4A; for the IQ2 and IQ3 types each sign
# byte's 8 bits as byte masks follow, which pick the negative weights' bytes out of a grid row
# (signed_row8_dot_int8).


def _all_sign_bytes() -> np.ndarray:
    return np.arange(256, dtype=np.int32)


def _sign_masks8(sign_bytes):
    """For each sign byte its 8 bits as byte masks, two words (0xFF a byte where set): what
    an int8-x GEMV ANDs a grid row's bytes with (signed_row8_dot_int8)."""
    def part():
        bits = (sign_bytes()[:, None] >> np.arange(8)[None, :]) & 1
        return (bits.astype(np.uint8) * np.uint8(0xFF)).view("<i4").reshape(-1).astype(np.int32)

    return part


def _grid_table(name, signs=None, dequant_ksigns=False):
    """(table function, word offset of the GEMV's sign masks) of grid type `name`: the
    dequant's parts ([ksigns,] grid as bytes), then [the byte masks of each sign byte: of
    ksigns, or of every byte] for the GEMV."""
    import gguf.quants

    rows, width = getattr(gguf.quants, name).grid_shape
    parts = ([_ksigns] if dequant_ksigns else []) + [_grid(name)]
    if signs is not None:
        parts.append(_sign_masks8(signs))
    return _table(*parts), tl.constexpr((128 if dequant_ksigns else 0) + rows * width // 4)


IQ2_XXS_TABLE, IQ2_XXS_SIGN_MASKS = _grid_table("IQ2_XXS", _ksigns, True)
IQ2_XS_TABLE, IQ2_XS_SIGN_MASKS = _grid_table("IQ2_XS", _ksigns, True)
IQ2_S_TABLE, IQ2_S_SIGN_MASKS = _grid_table("IQ2_S", _all_sign_bytes)
IQ3_XXS_TABLE, IQ3_XXS_SIGN_MASKS = _grid_table("IQ3_XXS", _ksigns, True)
IQ3_S_TABLE, IQ3_S_SIGN_MASKS = _grid_table("IQ3_S", _all_sign_bytes)


def _grid_plus_delta(name):
    """The IQ1 grid's rows (-1, 0, 1) as 8 g + 1 (rows 0..2047), then 8 g - 1 (2048..4095),
    signed bytes: 8 (g + delta), delta = +-1/8, in integers. The GEMV's (int8 x) rows, numbered
    by the 11-bit grid row with the delta's sign on top: a DP4A of 4 weights takes the delta
    too, where sum(g x) and sum(x) took a DP4A each (IQ1_M: a sign every 8 weights) or a float
    multiply-add by x's sums (IQ1_S: every 32)."""
    def part():
        g = _grid_words(name).view(np.int8).astype(np.int32)
        rows = np.concatenate([8 * g + 1, 8 * g - 1]).astype(np.int8)
        return rows.view("<i4").astype(np.int32)

    return part


IQ1_S_TABLE = _table(_grid("IQ1_S"), _grid_plus_delta("IQ1_S"))
IQ1_M_TABLE = _table(_grid("IQ1_M"), _grid_plus_delta("IQ1_M"))
IQ1_DELTA_GRID = tl.constexpr(2048 * 8 // 4)  # the word where _grid_plus_delta's rows begin


# -- shared unpacking ------------------------------------------------------------------


@triton.jit
def bitfields(x, SHIFT: tl.constexpr, K: tl.constexpr, MASK: tl.constexpr):
    """Unsigned [R, n] -> int32 [R, n * K]: (x >> (k * SHIFT)) & MASK for k < K, per element,
    in that order."""
    shifts = tl.arange(0, K) * SHIFT
    fields = (x.to(tl.uint32)[:, :, None] >> shifts[None, None, :].to(tl.uint32)) & MASK
    return tl.reshape(fields.to(tl.int32), (x.shape[0], x.shape[1] * K))


@triton.jit
def grid_rows(TABLE, idx, WORDS: tl.constexpr, AT: tl.constexpr):
    """Grid row numbers [R, n] -> float32 [R, n * 4 * WORDS], the rows laid end to end; a row
    is WORDS int32 words at TABLE + AT, four signed bytes each (little-endian)."""
    words = tl.load(TABLE.to(tl.pointer_type(tl.int32)) + AT
                    + idx[:, :, None] * WORDS + tl.arange(0, WORDS)[None, None, :])
    # shift a byte to the top, then back down arithmetically: sign extension
    up = (24 - 8 * tl.arange(0, 4))[None, None, None, :]
    values = (words[:, :, :, None] << up) >> 24
    return tl.reshape(values.to(tl.float32), (idx.shape[0], idx.shape[1] * 4 * WORDS))


@triton.jit
def sign_factors(signs):
    """Sign bytes [R, n] -> float32 [R, 8n]: per byte, its bits LSB first as -1.0 where set and
    1.0 where clear (gguf-py multiplies by these; a product with -1.0 is the exact negation)."""
    bits = bitfields(signs, 1, 8, 1)
    return tl.where(bits != 0, -1.0, 1.0)


@triton.jit
def ksign_factors(TABLE, idx):
    """7-bit ksigns indices [R, n] -> float32 [R, 8n] sign factors (the table's first part)."""
    return sign_factors(tl.load(TABLE.to(tl.pointer_type(tl.int32)) + idx))


KVALUES_PTX = tl.constexpr(lookup16_ptx(_kvalues()))
KVALUES_F16_PTX = tl.constexpr(lookup16_ptx(_kvalues(), f16=True))
# the kvalues as 4 words of bytes, + 128 each (fields.lookup16_bytes)
KW0, KW1, KW2, KW3 = (tl.constexpr(w) for w in lookup16_words(_kvalues()))
KVALUES_F16_HIGH_PTX = tl.constexpr(lookup16_ptx(_kvalues(), f16=True, high=True))
KVALUES_BF16_PTX = tl.constexpr(lookup16_ptx(_kvalues(), bf16=True))
KVALUES_BF16_HIGH_PTX = tl.constexpr(lookup16_ptx(_kvalues(), bf16=True, high=True))
# the kvalues' bfloat16 bits as 4 words of their low bytes, 4 of their high ones
# (fields.lookup16_bf16)
KL0, KL1, KL2, KL3, KH0, KH1, KH2, KH3 = (tl.constexpr(w) for w in lookup16_bf16_words(_kvalues()))


@triton.jit
def kvalue(TABLE, q):
    """IQ4's kvalues[q] as float32 (the table's first 16 words, in the interpreter)."""
    return lookup16(q, TABLE, KVALUES_PTX)


@triton.jit
def per_group(scale, x):
    """scale [R, g] times x [R, n], each scale applying to its run of n / g weights."""
    R: tl.constexpr = x.shape[0]
    G: tl.constexpr = scale.shape[1]
    w = scale[:, :, None] * tl.reshape(x, (R, G, x.shape[1] // G))
    return tl.reshape(w, (R, x.shape[1]))


@triton.jit
def signed(db, grid, signs):
    """gguf-py's `db * grid * signs`, left to right; db [R, g] per run of weights."""
    R: tl.constexpr = grid.shape[0]
    G: tl.constexpr = db.shape[1]
    RUN: tl.constexpr = grid.shape[1] // G
    w = db[:, :, None] * tl.reshape(grid, (R, G, RUN)) * tl.reshape(signs, (R, G, RUN))
    return tl.reshape(w, (R, grid.shape[1]))


@triton.jit
def scale_2bit(d, s):
    """gguf-py's 2-bit lattice scale d * (0.5 + s) * 0.25, float32 in that order."""
    return d * (0.5 + s.to(tl.float32)) * 0.25


# -- 4-bit non-linear ------------------------------------------------------------------


# the kvalues as 4 words of int8 bytes (fields.lookup16_nibbles_int8)
K8W0, K8W1, K8W2, K8W3 = (tl.constexpr(w) for w in int8_words(_kvalues()))


@triton.jit
def iq4_nl_dot(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, XB, SB, part, PARTS: tl.constexpr):
    """IQ4_NL (int8 x): the kvalues as int8, 8 a lookup and 4 a DP4A
    (fields.lookup_run_dot_int8), times d and x's scale."""
    s = lookup_run_dot_int8(TABLE, K8W0, K8W1, K8W2, K8W3, P1, j, rows, mask, N, XB, 4, 0)
    return (scale_f16(P0, j, rows, mask, N) * x8_scale(XB, 32, 0)) * s.to(tl.float32)


@triton.jit
def iq4_nl_f16(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N):
    """IQ4_NL for the fused GEMM with float16 x, in the fragment order of a 32-weight block
    (fields.fragment_order_32): qs word c's low nibbles (j = 0), then its high ones shifted
    down (j = 1), looked up 4 at a time (fields.lookup16_bytes: kvalue + 128 a byte), two
    bytes at a time under float16's exponent (1024 + kvalue + 128), 1152 off exactly, then
    d: one rounding."""
    z = row_zero(rows)[:, None, None]
    w = field_run(P1, j, rows, mask, N, 4, 0, 4, tl.int32)  # [R, 4]
    codes = shr(w[:, :, None], 4 * tl.arange(0, 2)[None, None, :])  # [R, c, j]
    b = lookup16_bytes(codes, TABLE, KW0, KW1, KW2, KW3, z)
    q = fragment_order_32(f16_halves(byte_pairs_f16(b, z))) - 1152.0
    return field_h(P0, j, rows, mask, N) * q


@triton.jit
def iq4_nl_bf16(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N):
    """IQ4_NL for the fused GEMM with bfloat16 x, as iq4_nl_f16 (its order), the kvalues
    looked up as bfloat16 bits, 4 codes a word (fields.lookup16_bf16: exact), then a PRMT a
    pair and times d rounded to bfloat16 (fields.bf16_pairs_scaled): two roundings."""
    R: tl.constexpr = rows.shape[0]
    z = row_zero(rows)[:, None, None]
    w = field_run(P1, j, rows, mask, N, 4, 0, 4, tl.int32)  # [R, 4]
    codes = shr(w[:, :, None], 4 * tl.arange(0, 2)[None, None, :])  # [R, c, j]
    lo, hi = lookup16_bf16(codes, TABLE, KL0, KL1, KL2, KL3, KH0, KH1, KH2, KH3, z)
    d = f16_pair_word(field_h(P0, j, rows, mask, N, tl.bfloat16))[:, :, None]  # [R, 1, 1]
    q = f16_halves(bf16_pairs_scaled(tl.reshape(lo, (R, 8)), tl.reshape(hi, (R, 8)),
                                     row_zero(rows)[:, None], d), tl.bfloat16)
    return fragment_order_32(tl.reshape(q, (R, 4, 2, 2, 2)))


@triton.jit
def iq4_nl_half(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, DT: tl.constexpr):
    if DT == tl.bfloat16:
        return iq4_nl_bf16(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N)
    else:
        return iq4_nl_f16(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N)


@register("IQ4_NL", 32, ("d", "qs"), table=_table(_kvalues), dot=iq4_nl_dot, x_int8=True,
          dequant_half=iq4_nl_half, f16_nibble_run=-1)
@triton.jit
def iq4_nl(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N):
    d = field_f16(P0, j, rows, mask, N)
    return d * kvalue(TABLE, nibbles(field(P1, j, rows, mask, N, 16, tl.uint8)))


@triton.jit
def iq4_xs_dot(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, XB, SB, part, PARTS: tl.constexpr):
    """The 256 // PARTS weights of part `part` (int8 x): 8 sub-blocks of 32 in all, each 16 qs
    bytes (low nibbles, then high ones) and a 6-bit scale less 32, its low 4 bits in scales_l
    and its high 2 in scales_h; a sub-block's kvalues times x as iq4_nl_dot's."""
    SUBS: tl.constexpr = 8 // PARTS
    high_bits = row_u16(P1, j, rows, mask, N)
    low_bits = row_word(P2, j, rows, mask, N, 1, 0)
    acc = tl.zeros(rows.shape, tl.float32)
    for t in tl.static_range(SUBS):
        sub = SUBS * part + t
        # int8 x: the sub-block's 32 values at XB + 32 sub, their scale after the block's 256
        s = lookup_run_dot_int8(TABLE, K8W0, K8W1, K8W2, K8W3, P3, j, rows, mask, N, XB + 32 * sub, 32,
                                4 * sub)
        x_scale = tl.load((XB + 256).to(tl.pointer_type(tl.float32)) + sub)
        scale = ((low_bits >> (4 * sub)) & 15) | (((high_bits >> (2 * sub)) & 3) << 4)
        acc += ((scale - 32).to(tl.float32) * x_scale) * s.to(tl.float32)
    return scale_f16(P0, j, rows, mask, N) * acc


@triton.jit
def iq4_xs_scales(P0, P1, P2, j, rows, mask, N):
    """d times each sub-block's 6-bit scale less 32 (low 4 bits in scales_l, high 2 in
    scales_h), float32 [R, 8]."""
    d = field_f16_words(P0, j, rows, mask, N)
    hi = bitfields(field16_in_word(P1, j, rows, mask, N)[:, None], 2, 8, 0x03)  # (bits 0-15)
    lo = bitfields(field(P2, j, rows, mask, N, 1, tl.uint32), 4, 8, 0x0F)
    return d * ((lo | (hi << 4)) - 32).to(tl.float32)


@triton.jit
def iq4_xs_codes(P3, j, rows, mask, N):
    """The 256 codes, [R * 8, 32]: 8 runs of 16 bytes, each byte's low nibbles then its high
    ones, 32 weights a run."""
    R: tl.constexpr = rows.shape[0]
    return nibbles(tl.reshape(field(P3, j, rows, mask, N, 128, tl.uint8), (R * 8, 16)))


@triton.jit
def iq4_xs_half(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, DT: tl.constexpr):
    """IQ4_XS for the fused GEMM's tiles of BM <= 32 with float16 (or bfloat16) x, in Q4_K's
    fragment order (fields.fragment_order_256): an MMA fragment's thread c unpacks qs bytes
    32c..32c+31, sub-blocks 2c and 2c + 1 (8 runs of 16 bytes, each an IQ4_NL block's
    nibbles), looked up as iq4_nl_f16 looks up (4 codes a word, two bytes a PRMT under
    float16's exponent, 1152 off exactly, here with the scale in the same asm:
    fields.byte_pairs_scaled_f16). Word i = 4 ihi + ilo of the thread's 8 holds, in nibble
    s0, weights 64c + 32 ihi + 16 s0 + 4 ilo + byte: Q4_K's word 4 s0 + ilo, nibble ihi, so
    one permutation of the thread's own registers puts them where tile_columns(256, -1)
    reads x. d times the sub-block's scale is rounded to float16, then times the value: two
    roundings where the float32 function has one (within the GEMM's tolerance). In bfloat16
    the kvalues are looked up as their bfloat16 bits (fields.lookup16_bf16: a whole byte does
    not fit under bfloat16's exponent) and scaled a pair at a time (fields.bf16_pairs_scaled)."""
    R: tl.constexpr = rows.shape[0]
    dl = iq4_xs_scales(P0, P1, P2, j, rows, mask, N).to(DT)  # [R, 8]: sub-block 2c + ihi
    z = row_zero(rows)[:, None]
    w = field_run(P3, j, rows, mask, N, 32, 0, 32, tl.int32)  # [R, 32]
    codes = tl.reshape(shr(w[:, :, None], 4 * tl.arange(0, 2)[None, None, :]), (R, 64))  # [R, (word, s0)]
    scale = tl.reshape(tl.broadcast_to(dl[:, :, None], (R, 8, 8)), (R, 64))
    if DT == tl.bfloat16:
        lo, hi = lookup16_bf16(codes, TABLE, KL0, KL1, KL2, KL3, KH0, KH1, KH2, KH3, z)
        pairs = bf16_pairs_scaled(lo, hi, z, f16_pair_word(scale)[:, :, None])
    else:
        pairs = byte_pairs_scaled_f16(lookup16_bytes(codes, TABLE, KW0, KW1, KW2, KW3, z), z, scale, 1152.0)
    q = tl.reshape(f16_halves(pairs, DT), (R, 4, 2, 4, 2, 2, 2))  # [R, (c, ihi, ilo, s0), s1, half]
    # [R, c, ihi, ilo, s0, s1, half] -> Q4_K's [R, c, i' = 4 s0 + ilo, s1, s0' = ihi, half]
    return fragment_order_256(tl.reshape(tl.permute(q, (0, 1, 4, 3, 5, 2, 6)), (R, 4, 8, 2, 2, 2)))


@triton.jit
def iq4_xs_half_nibble_groups(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, DT: tl.constexpr):
    """IQ4_XS for the fused GEMM's tiles of BM >= 64 with float16 (or bfloat16) x, in
    nibble-group order: there iq4_xs_half's lookups in registers, beside the 64-row
    accumulator, spill (sm_90, 56 bytes in the K loop), and this one's trip through shared
    memory does not. d times the sub-block's scale is rounded to DT, then times the value, as
    iq4_xs_half."""
    dl = iq4_xs_scales(P0, P1, P2, j, rows, mask, N).to(DT)
    # in nibble-group order (registry.py): sub-block s is still columns 32s..32s+31
    b = field(P3, j, rows, mask, N, 128, tl.uint8)
    z = row_zero(rows)[:, None, None]
    if DT == tl.bfloat16:
        q = lookup16_nibbles(b, TABLE, KVALUES_BF16_PTX, KVALUES_BF16_HIGH_PTX, tl.bfloat16, z,
                             KL0, KL1, KL2, KL3, KH0, KH1, KH2, KH3)
    else:
        q = lookup16_nibbles(b, TABLE, KVALUES_F16_PTX, KVALUES_F16_HIGH_PTX, tl.float16, z,
                             KW0, KW1, KW2, KW3)
    return per_group(dl, q)


@register("IQ4_XS", 256, ("d", "scales_h", "scales_l", "qs"), table=_table(_kvalues),
          dot=iq4_xs_dot, dot_parts=(1, 2, 4, 8), x_int8=True, dequant_half=iq4_xs_half,
          f16_nibble_run=-1, wide_f16=(iq4_xs_half_nibble_groups, 16))
@triton.jit
def iq4_xs(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N):
    dl = iq4_xs_scales(P0, P1, P2, j, rows, mask, N)
    q = kvalue(TABLE, iq4_xs_codes(P3, j, rows, mask, N))
    return per_group(dl, tl.reshape(q, (rows.shape[0], 256)))


# -- the lattice types' GEMV (int8 x): grid rows as bytes, signs as byte masks -----------


@triton.jit
def signed_bytes(g, m):
    """Grid bytes g (1 to 127 each: every grid's values are) with those under m's 0xFF bytes
    negated, as signed bytes: -g = (g ^ 0xFF) + 1, and no carry leaves a byte, since g >= 1.
    Three instructions a word, where the sum less twice the negative part costs a DP4A a
    word for each row of x: what the GEMV at more than one row of x takes (dot_rows)."""
    return (g ^ m) + (m & 0x01010101)


@triton.jit
def signed_words_dot(total, negative, g0, g1, m0, m1, x0, x1, SIGNED: tl.constexpr):
    """8 grid bytes (words g0, g1) and their signs' byte masks (m0, m1) times x's words x0, x1:
    (total + the bytes times x, negative + those under the masks times x), the sum less twice
    the negative part; SIGNED: the signed bytes times x into total, negative as it is."""
    if SIGNED:
        total = dot4(signed_bytes(g0, m0), x0, total, True)
        return dot4(signed_bytes(g1, m1), x1, total, True), negative
    total = dot4(g0, x0, total, True)
    total = dot4(g1, x1, total, True)
    negative = dot4(g0 & m0, x0, negative, True)
    return total, dot4(g1 & m1, x1, negative, True)


@triton.jit
def signed_row8_dot_int8(total, negative, TABLE, GRID: tl.constexpr, idx, MASKS: tl.constexpr, sidx,
                         x0, x1, SIGNED: tl.constexpr = False):
    """(total + grid row idx times x, negative + the row where signed times x), 8 weights:
    the row's 8 bytes from the byte grid at word GRID (two words, 4 a DP4A), its signs'
    byte masks row sidx of the table at word MASKS (_sign_masks8: one gather, where making
    them from the sign byte took some 10 instructions, 3 of them its parity): signed_words_dot."""
    g0, g1 = tl.split(row_words(TABLE, GRID, idx, 2))
    m0, m1 = tl.split(row_words(TABLE, MASKS, sidx, 2))
    return signed_words_dot(total, negative, g0, g1, m0, m1, x0, x1, SIGNED)


@triton.jit
def iq2_xxs_dot(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, XB, SB, part, PARTS: tl.constexpr,
                SIGNED: tl.constexpr = False):
    """IQ2_XXS (int8 x): 8 groups of 32 weights, each two qs words: 4 grid row numbers (a
    byte per 8 weights), then 4 seven-bit ksigns indices (their sign byte: the index, its
    parity at bit 7, ksigns_byte) and the group's 4-bit scale s on top;
    d * (0.5 + s) * 0.25 * sum(grid * signs * x) per group, the grid rows as bytes (the
    dequant's, after its 128 ksigns words), 4 weights a DP4A (signed_row8_dot_int8)."""
    acc = tl.zeros(rows.shape, tl.float32)
    for c in tl.static_range(4):
        w = words4(P1, j, rows, mask, N, 16, 4 * c)
        for h in tl.static_range(2):
            g = 2 * c + h
            total = tl.zeros(rows.shape, tl.int32)
            negative = tl.zeros(rows.shape, tl.int32)
            for r in tl.static_range(4):
                if r % 2 == 0:
                    xw = x8_words(XB, 32 * g + 8 * r)  # x of rows r and r + 1
                total, negative = signed_row8_dot_int8(
                    total, negative, TABLE, 128, bits_at(w[2 * h], 8 * r, 8, 0), IQ2_XXS_SIGN_MASKS,
                    bits_at(w[2 * h + 1], 7 * r, 7, 0), xw[2 * (r % 2)], xw[2 * (r % 2) + 1], SIGNED)
            scale = (shr(w[2 * h + 1], 28).to(tl.float32) + 0.5) * x8_scale(XB, 256, 32 * g)
            acc += scale * (total - 2 * negative).to(tl.float32)
    return scale_f16(P0, j, rows, mask, N) * 0.25 * acc



@triton.jit
def iq2_xxs_dot_rows(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, XB, SB, part, PARTS: tl.constexpr):
    """iq2_xxs_dot in signed bytes (signed_bytes), the GEMV's at more than one row of x."""
    return iq2_xxs_dot(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, XB, SB, part, PARTS, True)

@triton.jit
def iq2_xs_dot(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, XB, SB, part, PARTS: tl.constexpr,
               SIGNED: tl.constexpr = False):
    """IQ2_XS (int8 x): a 16-bit qs value per 8 weights (9-bit grid row, 7-bit ksigns index),
    a 4-bit scale s per 16 (scales nibble c for qs word c): d * (0.5 + s) * 0.25 *
    sum(grid * signs * x), 4 weights a DP4A (signed_row8_dot_int8)."""
    sc0, sc1 = words2(P2, j, rows, mask, N, 2, 0)
    acc = tl.zeros(rows.shape, tl.float32)
    for q in tl.static_range(4):
        w = words4(P1, j, rows, mask, N, 16, 4 * q)
        for c in tl.static_range(4):
            if c % 2 == 0:
                xw = x8_words(XB, 64 * q + 16 * c)  # x of these 16 weights and the next 16
                xs = x8_scale(XB, 256, 64 * q + 16 * c)
            else:
                xw = x8_words(XB, 64 * q + 16 * c)
            total = tl.zeros(rows.shape, tl.int32)
            negative = tl.zeros(rows.shape, tl.int32)
            for h in tl.static_range(2):
                total, negative = signed_row8_dot_int8(
                    total, negative, TABLE, 128, bits_at(w[c], 16 * h, 9, 0), IQ2_XS_SIGN_MASKS,
                    bits_at(w[c], 16 * h + 9, 7, 0), xw[2 * h], xw[2 * h + 1], SIGNED)
            scale = shr(sc0 if q < 2 else sc1, 4 * (4 * (q % 2) + c)) & 15
            acc += ((scale.to(tl.float32) + 0.5) * xs) * (total - 2 * negative).to(tl.float32)
    return scale_f16(P0, j, rows, mask, N) * 0.25 * acc



@triton.jit
def iq2_xs_dot_rows(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, XB, SB, part, PARTS: tl.constexpr):
    """iq2_xs_dot in signed bytes (signed_bytes), the GEMV's at more than one row of x."""
    return iq2_xs_dot(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, XB, SB, part, PARTS, True)

@triton.jit
def iq2_s_dot(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, XB, SB, part, PARTS: tl.constexpr,
              SIGNED: tl.constexpr = False):
    """IQ2_S (int8 x): per 8 weights k, a grid row numbered by qs byte k (low 8 bits) and bits
    2k of qh (top 2), and sign byte 32 + k of qs; a 4-bit scale s per 16:
    d * (0.5 + s) * 0.25 * sum(grid * signs * x), 4 weights a DP4A (signed_row8_dot_int8)."""
    qh0, qh1 = words2(P2, j, rows, mask, N, 2, 0)
    sc0, sc1 = words2(P3, j, rows, mask, N, 2, 0)
    acc = tl.zeros(rows.shape, tl.float32)
    for q in tl.static_range(2):  # groups of 8 weights 16q .. 16q + 15
        w = words4(P1, j, rows, mask, N, 16, 4 * q)
        sg = words4(P1, j, rows, mask, N, 16, 8 + 4 * q)
        for c in tl.static_range(4):
            xs = x8_scale(XB, 256, 128 * q + 32 * c)
            for half in tl.static_range(2):
                xw = x8_words(XB, 128 * q + 32 * c + 16 * half)
                total = tl.zeros(rows.shape, tl.int32)
                negative = tl.zeros(rows.shape, tl.int32)
                for b2 in tl.static_range(2):
                    b = 2 * half + b2
                    idx = (bits_at(w[c], 8 * b, 8, 0)
                           | bits_at(qh0 if q == 0 else qh1, 2 * (4 * c + b), 2, 8))
                    total, negative = signed_row8_dot_int8(
                        total, negative, TABLE, 0, idx, IQ2_S_SIGN_MASKS, bits_at(sg[c], 8 * b, 8, 0),
                        xw[2 * b2], xw[2 * b2 + 1], SIGNED)
                scale = shr(sc0 if q == 0 else sc1, 4 * (2 * c + half)) & 15
                acc += ((scale.to(tl.float32) + 0.5) * xs) * (total - 2 * negative).to(tl.float32)
    return scale_f16(P0, j, rows, mask, N) * 0.25 * acc



@triton.jit
def iq2_s_dot_rows(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, XB, SB, part, PARTS: tl.constexpr):
    """iq2_s_dot in signed bytes (signed_bytes), the GEMV's at more than one row of x."""
    return iq2_s_dot(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, XB, SB, part, PARTS, True)

@triton.jit
def signed_rows4_dot_int8(total, negative, TABLE, MASKS: tl.constexpr, a, b, sidx, x0, x1,
                          SIGNED: tl.constexpr = False):
    """signed_row8_dot_int8 for a 4-wide byte grid (at word 0: one word a row): rows a then
    b, 8 weights, their signs' byte masks row sidx of the table at word MASKS."""
    # (each a [R, 1] row reduced, as fields.row_load: a 1-D gather took another layout, and a
    # shared-memory round trip a value, 258 STS and LDS a loop)
    g0 = tl.sum(row_words(TABLE, 0, a, 1), axis=1)
    g1 = tl.sum(row_words(TABLE, 0, b, 1), axis=1)
    m0, m1 = tl.split(row_words(TABLE, MASKS, sidx, 2))
    return signed_words_dot(total, negative, g0, g1, m0, m1, x0, x1, SIGNED)


@triton.jit
def iq3_xxs_dot(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, XB, SB, part, PARTS: tl.constexpr,
                SIGNED: tl.constexpr = False):
    """IQ3_XXS (int8 x): a grid row (4 wide) per qs byte 0..63; per 32 weights an aux word
    (qs word 16 + group) of 4 seven-bit ksigns indices (one per 8 weights) and a 4-bit scale
    s on top: d * (0.5 + s) * 0.5 * sum(grid * signs * x), 4 weights a DP4A (the byte grid
    after the dequant's 128 ksigns words)."""
    acc = tl.zeros(rows.shape, tl.float32)
    for c in tl.static_range(4):  # groups 2c, 2c + 1
        w = words4(P1, j, rows, mask, N, 24, 4 * c)
        aux_words = words4(P1, j, rows, mask, N, 24, 16 + 4 * (c // 2))
        for h in tl.static_range(2):
            aux = aux_words[2 * (c % 2) + h]
            total = tl.zeros(rows.shape, tl.int32)
            negative = tl.zeros(rows.shape, tl.int32)
            for r in tl.static_range(4):  # 8 weights: bytes 2 (r % 2), +1 of word 2h + r // 2
                if r % 2 == 0:
                    xw = x8_words(XB, 64 * c + 32 * h + 8 * r)  # x of r and r + 1
                word = w[2 * h + r // 2]
                total, negative = signed_rows4_dot_int8(
                    total, negative, TABLE + 128, IQ3_XXS_SIGN_MASKS - 128,
                    bits_at(word, 16 * (r % 2), 8, 0), bits_at(word, 16 * (r % 2) + 8, 8, 0),
                    bits_at(aux, 7 * r, 7, 0), xw[2 * (r % 2)], xw[2 * (r % 2) + 1], SIGNED)
            scale = (shr(aux, 28).to(tl.float32) + 0.5) * x8_scale(XB, 256, 64 * c + 32 * h)
            acc += scale * (total - 2 * negative).to(tl.float32)
    return scale_f16(P0, j, rows, mask, N) * 0.5 * acc



@triton.jit
def iq3_xxs_dot_rows(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, XB, SB, part, PARTS: tl.constexpr):
    """iq3_xxs_dot in signed bytes (signed_bytes), the GEMV's at more than one row of x."""
    return iq3_xxs_dot(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, XB, SB, part, PARTS, True)

@triton.jit
def iq3_s_dot(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, XB, SB, part, PARTS: tl.constexpr,
              SIGNED: tl.constexpr = False):
    """IQ3_S (int8 x): a grid row (4 wide) per qs byte k (low 8 bits) and bit k of qh (the
    ninth); a sign byte per 8 weights; a 4-bit scale s per 32: d * (1 + 2 s) *
    sum(grid * signs * x), 4 weights a DP4A."""
    qh0, qh1 = words2(P2, j, rows, mask, N, 2, 0)
    scales = row_word(P4, j, rows, mask, N, 1, 0) | (qh0 & opaque_zero(N))
    acc = tl.zeros(rows.shape, tl.float32)
    for c in tl.static_range(4):  # groups 2c, 2c + 1
        w = words4(P1, j, rows, mask, N, 16, 4 * c)
        signs = words4(P3, j, rows, mask, N, 8, 4 * (c // 2))
        high = qh0 if c < 2 else qh1
        for h in tl.static_range(2):
            g8 = 2 * c + h
            total = tl.zeros(rows.shape, tl.int32)
            negative = tl.zeros(rows.shape, tl.int32)
            for r in tl.static_range(4):
                if r % 2 == 0:
                    xw = x8_words(XB, 32 * g8 + 8 * r)  # x of r and r + 1
                word = w[2 * h + r // 2]
                k = 8 * g8 + 2 * r  # the first of the two grid rows
                a = bits_at(word, 16 * (r % 2), 8, 0) | bits_at(high, k % 32, 1, 8)
                b = bits_at(word, 16 * (r % 2) + 8, 8, 0) | bits_at(high, k % 32 + 1, 1, 8)
                total, negative = signed_rows4_dot_int8(
                    total, negative, TABLE, IQ3_S_SIGN_MASKS, a, b,
                    bits_at(signs[2 * (c % 2) + h], 8 * r, 8, 0), xw[2 * (r % 2)], xw[2 * (r % 2) + 1],
                    SIGNED)
            scale = shr(scales, 4 * g8) & 15
            xs = x8_scale(XB, 256, 32 * g8)
            acc += ((2 * scale + 1).to(tl.float32) * xs) * (total - 2 * negative).to(tl.float32)
    return scale_f16(P0, j, rows, mask, N) * acc



@triton.jit
def iq3_s_dot_rows(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, XB, SB, part, PARTS: tl.constexpr):
    """iq3_s_dot in signed bytes (signed_bytes), the GEMV's at more than one row of x."""
    return iq3_s_dot(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, XB, SB, part, PARTS, True)

@triton.jit
def iq1_s_dot(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, XB, SB, part, PARTS: tl.constexpr):
    """IQ1_S (int8 x): per 32 weights a 16-bit qh value (four 3-bit grid row highs, a 3-bit
    scale s, the delta's sign on top) and 4 qs bytes (grid row lows):
    d * (2 s + 1) * sum((grid + delta) x), delta = +-1/8: the grid rows as 8 (grid + delta),
    signed bytes (_grid_plus_delta, numbered with the delta's sign as bit 11), 4 a DP4A."""
    acc = tl.zeros(rows.shape, tl.float32)
    for qq in tl.static_range(2 // PARTS):  # halves of 128 weights: q = part with PARTS 2
        q = (2 // PARTS) * part + qq
        w = words4(P1, j, rows, mask, N, 8, 4 * q)
        qh = words2(P2, j, rows, mask, N, 4, 2 * q)
        for c in tl.static_range(4):  # group 4q + c: half c % 2 of qh word c // 2
            s = tl.zeros(rows.shape, tl.int32)
            delta = bits_at(qh[c // 2], 16 * (c % 2) + 15, 1, 11)
            for r in tl.static_range(4):
                if r % 2 == 0:
                    xw = x8_words(XB, 128 * q + 32 * c + 8 * r)  # for rows r and r + 1
                idx = (bits_at(w[c], 8 * r, 8, 0) | bits_at(qh[c // 2], 16 * (c % 2) + 3 * r, 3, 8)
                       | delta)
                g0, g1 = tl.split(row_words(TABLE, IQ1_DELTA_GRID, idx, 2))
                s = dot4(g0, xw[2 * (r % 2)], s, True)
                s = dot4(g1, xw[2 * (r % 2) + 1], s, True)
            scale = 2 * (shr(qh[c // 2], 16 * (c % 2) + 12) & 7) + 1
            acc += scale.to(tl.float32) * (s.to(tl.float32) * x8_scale(XB, 256, 128 * q + 32 * c))
    return scale_f16(P0, j, rows, mask, N) * 0.125 * acc


@triton.jit
def iq1_m_dot(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, XB, SB, part, PARTS: tl.constexpr):
    """IQ1_M (int8 x): per 8 weights a qs byte (grid row low 8 bits) and a qh nibble (3 high
    bits, the delta's sign); per 16 a 3-bit scale s; d's 16 bits are the top nibbles of the 4
    scale half-words: d * (2 s + 1) * sum((grid + delta) x), delta = +-1/8. The grid rows as
    8 (grid + delta), signed bytes (_grid_plus_delta: the nibble whole is the row's top 4
    bits), 4 a DP4A."""
    sc0, sc1 = words2(P2, j, rows, mask, N, 2, 0)
    d_bits = ((shr(sc0, 12) & 0xF) | (shr(sc0, 24) & 0xF0) | (shr(sc1, 4) & 0xF00)
              | (shr(sc1, 16) & 0xF000))
    d = d_bits.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
    acc = tl.zeros(rows.shape, tl.float32)
    for qq in tl.static_range(2 // PARTS):  # halves of 128 weights: q = part with PARTS 2
        q = (2 // PARTS) * part + qq
        w = words4(P0, j, rows, mask, N, 8, 4 * q)
        qh = words2(P1, j, rows, mask, N, 4, 2 * q)
        word = tl.where(q == 0, sc0, sc1)
        for c in tl.static_range(4):  # qs word 4q + c: weights 128q + 32c ..
            by_scale = tl.zeros(rows.shape, tl.int32)
            for half in tl.static_range(2):  # 16 weights, one scale
                xw = x8_words(XB, 128 * q + 32 * c + 16 * half)
                s = tl.zeros(rows.shape, tl.int32)
                for r2 in tl.static_range(2):
                    r = 2 * half + r2  # byte r of the qs word: 8 weights
                    idx = bits_at(w[c], 8 * r, 8, 0) | bits_at(qh[c // 2], 4 * ((4 * c + r) % 8), 4, 8)
                    g0, g1 = tl.split(row_words(TABLE, IQ1_DELTA_GRID, idx, 2))
                    s = dot4(g1, xw[2 * r2 + 1], dot4(g0, xw[2 * r2], s, True), True)
                t = 2 * c + half  # of 8 scales in word q, 3 bits each, 4 per 16-bit half
                scale = shr(word, 16 * (t // 4) + 3 * (t % 4)) & 7
                by_scale += (2 * scale + 1) * s
            acc += by_scale.to(tl.float32) * x8_scale(XB, 256, 128 * q + 32 * c)
    return d * 0.125 * acc


# -- 2-bit lattices, 8 weights per grid row --------------------------------------------


@triton.jit
def ksigns_byte(idx):
    """7-bit ksigns indices (int32) -> their sign bytes: ksigns[i] is i with its parity at bit
    7 (a POPC and two operations, where a lookup is a gather through the L1)."""
    if INTERPRETED:
        p = idx ^ (idx >> 4)
        p = p ^ (p >> 2)
        parity = (p ^ (p >> 1)) & 1
    else:
        parity = tl.inline_asm_elementwise("popc.b32 $0, $1;", "=r,r", [idx], dtype=tl.int32,
                                           is_pure=True, pack=1) & 1
    return idx | (parity << 7)


@triton.jit
def sign_words(signs):
    """Sign bytes (a bit per weight), int32 [R, n] -> int32 [R, n, 4]: word w holds the sign
    of weight 2w at bit 15 and of weight 2w + 1 at bit 31, where a float16 pair has them.
    The byte times 2**(15 - 2w) + 2**(30 - 2w) puts its bit 2w at 15 and bit 2w + 1 at 31
    (the two copies do not overlap): one IMAD a word, where a table's sign words cost a
    gather of 16 bytes every 8 weights, through the L1 and shared memory."""
    w = tl.arange(0, 4)[None, None, :]
    return (signs[:, :, None] * ((1 << (15 - 2 * w)) + (1 << (30 - 2 * w)))) & -0x7FFF8000  # 0x80008000


@triton.jit
def grid_words(TABLE, idx, WORDS: tl.constexpr, AT: tl.constexpr, IN_STEP: tl.constexpr = False):
    """Grid row numbers [R, n] -> int32 [R, 8n / (4 WORDS), 2]: the rows of a grid of 4 WORDS
    bytes a row (the dequant's part, at word AT, even), gathered whole, as the words of each
    run of 8 weights. IN_STEP: gathered in the K step itself (fields.gather_words,
    gather_word_pairs), not copied ahead through shared memory by Triton's pipeliner: fewer
    instructions and registers a step for IQ3_XXS, IQ3_S, IQ1_S and IQ1_M (sm_90, BM = 16 and
    32: 4-7% fewer; IQ3_XXS's swapped BM = 32 tile 254 -> 168 registers), more for IQ2_XXS
    (3-4%) and IQ2_XS's BM = 16 tile (32%), and IQ2_S's spilled (BENCHMARKS.md "The grid
    rows gathered in the K step")."""
    table = TABLE.to(tl.pointer_type(tl.int32)) + AT
    if WORDS == 2:
        ptr = table + idx * 2
        if IN_STEP:
            return gather_word_pairs(ptr)
        else:
            return tl.load(ptr[:, :, None] + tl.arange(0, 2)[None, None, :])
    else:  # two rows a run: gathered as [R, run, row] (a [R, rows, 1] gather reshaped sent
        # the IQ3_XXS tile's weights through shared memory)
        ptr = table + tl.reshape(idx, (idx.shape[0], idx.shape[1] // 2, 2))
        if IN_STEP:
            return gather_words(ptr)
        else:
            return tl.load(ptr)


@triton.jit
def signed_grid8_f16(words, signs, db, Z, DT: tl.constexpr = tl.float16):
    """Runs of 8 grid values (words [R, n, 2] of their bytes, all positive: grid_words),
    their sign bytes [R, n] (int32) and scales db (float16 [R, g], one per n / g runs) -> float16
    [R, 8n] in the 8-weight runs' fragment order (fields.tile_columns, RUN = -3): in each 32
    weights, an MMA fragment's thread c (k = 2c, 2c + 1, 2c + 8, 2c + 9 of each 16) takes run
    c, so each thread unpacks the rows it gathered itself and its weights reach the MMA from
    registers.
    Two bytes a PRMT under float16's exponent, 1024 off exactly, times db with the pair's
    signs XORed in: one rounding (the grid values are small integers). Z: row_zero [R, 1].
    DT bfloat16: db bfloat16, the bytes under its exponent (the grid values are under 128),
    128 off.
    The grid as bytes, 8 of them an 8-weight run through the L1 and shared memory, where
    float16 rows (16 bytes) and sign words looked up (16 more) took fewer instructions
    (IQ2_XXS's BM = 16 tile, sm_90, d loaded alone in both: 517 against 704 a step) but 4
    times the bytes (BENCHMARKS.md "The grid types in float16")."""
    R: tl.constexpr = words.shape[0]
    n: tl.constexpr = words.shape[1]
    G: tl.constexpr = db.shape[1]
    pairs = tl.reshape(sign_words(signs), (R, G, n // G, 4))  # word 2a + b: bytes 4a + 2b, +1
    BASE: tl.constexpr = 128.0 if DT == tl.bfloat16 else 1024.0
    scales = tl.reshape(f16_pair_word(db)[:, :, None, None] ^ pairs, (R, 2 * n, 2))
    q = f16_halves(byte_pairs_times_f16(tl.reshape(words, (R, 2 * n)), Z, scales, BASE, DT), DT)
    return fragment_order_runs8(tl.reshape(q, (R, n // 4, 4, 2, 2, 2)))


@triton.jit
def iq2_xxs_half(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, DT: tl.constexpr):
    """IQ2_XXS for the fused GEMM with float16 (or bfloat16) x, in the 8-weight runs' fragment order
    (signed_grid8_f16): db = d * (0.5 + scale) * 0.25 rounded to float16 once a group of 32,
    then its product with each grid value: two roundings where the float32 function has one
    (within the GEMM's tolerance, as IQ4_XS's)."""
    R: tl.constexpr = rows.shape[0]
    d = field_h(P0, j, rows, mask, N).to(tl.float32)  # in its word: copied ahead
    idx_words, aux = tl.split(tl.reshape(field(P1, j, rows, mask, N, 16, tl.uint32), (R, 8, 2)))
    db = scale_2bit(d, aux >> 28).to(DT)  # [R, 8]
    words = grid_words(TABLE, bitfields(idx_words, 8, 4, 0xFF), 2, KSIGNS)
    return signed_grid8_f16(words, ksigns_byte(bitfields(aux, 7, 4, 0x7F)), db, row_zero(rows)[:, None], DT)


@register("IQ2_XXS", 256, ("d", "qs"), table=IQ2_XXS_TABLE, dot=iq2_xxs_dot, x_int8=True,
          dot_rows=iq2_xxs_dot_rows, dequant_half=iq2_xxs_half, f16_nibble_run=-3, wide_f16="float32")
@triton.jit
def iq2_xxs(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N):
    R: tl.constexpr = rows.shape[0]
    d = field_f16_words(P0, j, rows, mask, N)
    # 8 groups of 32 weights in two words each: 4 grid index bytes, then an aux word holding
    # four 7-bit ksigns indices and the group's 4-bit scale on top
    idx_words, aux = tl.split(tl.reshape(field(P1, j, rows, mask, N, 16, tl.uint32), (R, 8, 2)))
    db = scale_2bit(d, aux >> 28)
    grid = grid_rows(TABLE, bitfields(idx_words, 8, 4, 0xFF), 2, KSIGNS)
    return signed(db, grid, ksign_factors(TABLE, bitfields(aux, 7, 4, 0x7F)))


@triton.jit
def iq2_xs_half(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, DT: tl.constexpr):
    """IQ2_XS for the fused GEMM with float16 (or bfloat16) x, as iq2_xxs_f16: a 16-bit field a grid row
    (9-bit row, 7-bit ksigns index), a 4-bit scale every 16 weights."""
    d = field_h(P0, j, rows, mask, N).to(tl.float32)  # in its word: copied ahead
    q = field(P1, j, rows, mask, N, 32, tl.uint16).to(tl.int32)
    scales = bitfields(field(P2, j, rows, mask, N, 2, tl.uint32), 4, 8, 0x0F)
    db = scale_2bit(d, scales).to(DT)  # [R, 16]
    return signed_grid8_f16(grid_words(TABLE, q & 0x1FF, 2, KSIGNS), ksigns_byte(q >> 9), db,
                            row_zero(rows)[:, None], DT)


@register("IQ2_XS", 256, ("d", "qs", "scales"), table=IQ2_XS_TABLE, dot=iq2_xs_dot, x_int8=True,
          dot_rows=iq2_xs_dot_rows, dequant_half=iq2_xs_half, f16_nibble_run=-3, wide_f16="float32")
@triton.jit
def iq2_xs(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N):
    d = field_f16_words(P0, j, rows, mask, N)
    q = field(P1, j, rows, mask, N, 32, tl.uint16).to(tl.int32)  # 9-bit grid, 7-bit ksigns
    db = scale_2bit(d, bitfields(field(P2, j, rows, mask, N, 2, tl.uint32), 4, 8, 0x0F))
    grid = grid_rows(TABLE, q & 0x1FF, 2, KSIGNS)
    return signed(db, grid, ksign_factors(TABLE, q >> 9))


@triton.jit
def iq2_s_half(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, DT: tl.constexpr):
    """IQ2_S for the fused GEMM with float16 (or bfloat16) x, as iq2_xxs_f16: a 10-bit grid row (its low
    byte in qs, 2 bits in qh) and a sign byte every 8 weights, a 4-bit scale every 16."""
    d = field_h(P0, j, rows, mask, N).to(tl.float32)  # in its word: copied ahead
    low = bitfields(field_run(P1, j, rows, mask, N, 16, 0, 8, tl.uint32), 8, 4, 0xFF)
    signs = bitfields(field_run(P1, j, rows, mask, N, 16, 8, 8, tl.uint32), 8, 4, 0xFF)
    idx = low | (bitfields(field(P2, j, rows, mask, N, 2, tl.uint32), 2, 16, 0x03) << 8)
    db = scale_2bit(d, bitfields(field(P3, j, rows, mask, N, 2, tl.uint32), 4, 8, 0x0F)).to(DT)
    return signed_grid8_f16(grid_words(TABLE, idx, 2, 0), signs, db, row_zero(rows)[:, None], DT)


@register("IQ2_S", 256, ("d", "qs", "qh", "scales"), table=IQ2_S_TABLE, dot=iq2_s_dot, x_int8=True,
          dot_rows=iq2_s_dot_rows, dequant_half=iq2_s_half, f16_nibble_run=-3, wide_f16="float32")
@triton.jit
def iq2_s(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N):
    d = field_f16_words(P0, j, rows, mask, N)
    # qs: 32 grid index low bytes, then 32 sign bytes (a bit per weight); qh: 2 bits an index
    low = field_run(P1, j, rows, mask, N, 64, 0, 32, tl.uint8).to(tl.int32)
    signs = field_run(P1, j, rows, mask, N, 64, 32, 32, tl.uint8)
    idx = low | (bitfields(field(P2, j, rows, mask, N, 2, tl.uint32), 2, 16, 0x03) << 8)
    db = scale_2bit(d, bitfields(field(P3, j, rows, mask, N, 2, tl.uint32), 4, 8, 0x0F))
    return signed(db, grid_rows(TABLE, idx, 2, 0), sign_factors(signs))


# -- 3-bit lattices, 4 weights per grid row --------------------------------------------


@triton.jit
def iq3_xxs_half(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, DT: tl.constexpr):
    """IQ3_XXS for the fused GEMM with float16 (or bfloat16) x, as iq2_xxs_f16: two 4-wide grid rows an
    8-weight run, db = d * (0.5 + scale) * 0.5."""
    d = field_h(P0, j, rows, mask, N).to(tl.float32)  # in its word: copied ahead
    idx = bitfields(field_run(P1, j, rows, mask, N, 24, 0, 16, tl.uint32), 8, 4, 0xFF)
    aux = field_run(P1, j, rows, mask, N, 24, 16, 8, tl.uint32)
    db = (d * (0.5 + (aux >> 28).to(tl.float32)) * 0.5).to(DT)
    words = grid_words(TABLE, idx, 1, KSIGNS, IN_STEP=True)
    return signed_grid8_f16(words, ksigns_byte(bitfields(aux, 7, 4, 0x7F)), db, row_zero(rows)[:, None], DT)


@register("IQ3_XXS", 256, ("d", "qs"), table=IQ3_XXS_TABLE, dot=iq3_xxs_dot, x_int8=True,
          dot_rows=iq3_xxs_dot_rows, dequant_half=iq3_xxs_half, f16_nibble_run=-3, wide_f16="float32")
@triton.jit
def iq3_xxs(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N):
    d = field_f16_words(P0, j, rows, mask, N)
    # qs: 64 grid index bytes, then 8 aux words as in IQ2_XXS
    idx = field_run(P1, j, rows, mask, N, 96, 0, 64, tl.uint8).to(tl.int32)
    aux = field_run(P1, j, rows, mask, N, 24, 16, 8, tl.uint32)
    db = d * (0.5 + (aux >> 28).to(tl.float32)) * 0.5
    signs = ksign_factors(TABLE, bitfields(aux, 7, 4, 0x7F))  # four indices an aux word
    return signed(db, grid_rows(TABLE, idx, 1, KSIGNS), signs)


@triton.jit
def iq3_s_half(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, DT: tl.constexpr):
    """IQ3_S for the fused GEMM with float16 (or bfloat16) x, as iq3_xxs_f16: two 9-bit 4-wide grid rows
    (low byte in qs, the high bit in qh) and a sign byte every 8 weights, db = d * (1 + 2 *
    scale) every 32."""
    d = field_h(P0, j, rows, mask, N).to(tl.float32)  # in its word: copied ahead
    low = bitfields(field(P1, j, rows, mask, N, 16, tl.uint32), 8, 4, 0xFF)
    idx = low | (bitfields(field(P2, j, rows, mask, N, 2, tl.uint32), 1, 32, 0x01) << 8)
    signs = bitfields(field(P3, j, rows, mask, N, 8, tl.uint32), 8, 4, 0xFF)
    scale = bitfields(field(P4, j, rows, mask, N, 1, tl.uint32), 4, 8, 0x0F)
    db = (d * (1 + 2 * scale).to(tl.float32)).to(DT)
    words = grid_words(TABLE, idx, 1, 0, IN_STEP=True)
    return signed_grid8_f16(words, signs, db, row_zero(rows)[:, None], DT)


@register("IQ3_S", 256, ("d", "qs", "qh", "signs", "scales"), table=IQ3_S_TABLE, dot=iq3_s_dot, x_int8=True,
          dot_rows=iq3_s_dot_rows, dequant_half=iq3_s_half, f16_nibble_run=-3, wide_f16="float32")
@triton.jit
def iq3_s(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N):
    d = field_f16_words(P0, j, rows, mask, N)
    low = field(P1, j, rows, mask, N, 64, tl.uint8).to(tl.int32)
    idx = low | (bitfields(field(P2, j, rows, mask, N, 8, tl.uint8), 1, 8, 0x01) << 8)
    signs = sign_factors(field(P3, j, rows, mask, N, 32, tl.uint8))
    # gguf-py forms 1 + 2 * scale in integers (exact), then one float multiply
    scale = bitfields(field(P4, j, rows, mask, N, 1, tl.uint32), 4, 8, 0x0F)
    db = d * (1 + 2 * scale).to(tl.float32)
    return signed(db, grid_rows(TABLE, idx, 1, 0), signs)


# -- 1-bit lattices: dl * (grid + delta), delta = +-1/8 ---------------------------------


@triton.jit
def shifted(grid, negative):
    """gguf-py's grid + delta, float32: `negative` [R, n] picks -1/8 over +1/8 for each of
    the n runs of grid [R, m]."""
    R: tl.constexpr = grid.shape[0]
    n: tl.constexpr = negative.shape[1]
    delta = tl.where(negative, -0.125, 0.125)
    return tl.reshape(tl.reshape(grid, (R, n, grid.shape[1] // n)) + delta[:, :, None],
                      grid.shape)


@triton.jit
def per_word(x, WORDS: tl.constexpr):
    """[R, n] -> [R, WORDS]: each value repeated for its WORDS / n words."""
    R: tl.constexpr = x.shape[0]
    n: tl.constexpr = x.shape[1]
    return tl.reshape(tl.broadcast_to(x[:, :, None], (R, n, WORDS // n)), (R, WORDS))


@triton.jit
def shifted_grid8_half(words, delta, dl, Z, DT: tl.constexpr):
    """IQ1_S's and IQ1_M's weights, (grid + delta) * dl, for the fused GEMM: words int32
    [R, 64] (each 8-weight run's grid row, two words of signed bytes -1, 0, 1), delta float32
    [R, a] (+-1/8) and dl float32 [R, b] (the scale), each for its 64 / a and 64 / b words,
    a >= b -> DT [R, 256] in the 8-weight runs' fragment order (as signed_grid8_f16): dl
    rounded to DT, then one rounding of each weight. float16: fields.signed_byte_pairs_
    shifted_f16; bfloat16: fields.signed_byte_pairs_shifted_bf16, with the delta's product
    with dl (a power of two times dl: rounded as dl is). Z: row_zero, [R, 1]."""
    R: tl.constexpr = words.shape[0]
    dl = per_word(dl, delta.shape[1])  # a scale for each delta
    if DT == tl.bfloat16:
        delta = delta * dl
    deltas = per_word(f16_pair_word(delta.to(DT)), 64)[:, :, None]
    scales = per_word(f16_pair_word(dl.to(DT)), 64)[:, :, None]
    if DT == tl.bfloat16:
        pairs = signed_byte_pairs_shifted_bf16(words, Z, deltas, scales)
    else:
        pairs = signed_byte_pairs_shifted_f16(words, Z, deltas, scales)
    return fragment_order_runs8(tl.reshape(f16_halves(pairs, DT), (R, 8, 4, 2, 2, 2)))


@triton.jit
def iq1_s_half(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, DT: tl.constexpr):
    """IQ1_S for the fused GEMM with float16 (or bfloat16) x, in the 8-weight runs' fragment
    order (as the other grid types, signed_grid8_f16): each run's signed grid bytes (-1, 0,
    1) gathered whole, two a PRMT under float16's exponent, plus the group's delta (+-1/8,
    exact), times dl = d * (2 * scale + 1) rounded to float16: two roundings where the
    float32 function has one (within the GEMM's tolerance). In bfloat16: the bytes plus one,
    then grid * dl + delta * dl in one fma, the delta's product exact
    (fields.signed_byte_pairs_shifted_bf16)."""
    R: tl.constexpr = rows.shape[0]
    d = field_h(P0, j, rows, mask, N).to(tl.float32)  # in its word: copied ahead
    # a 16-bit word per 32 weights: four 3-bit index highs, a 3-bit scale, the delta's sign
    qh = bitfields(field(P2, j, rows, mask, N, 4, tl.uint32), 16, 2, 0xFFFF)  # [R, 8]
    dl = d * (2 * ((qh >> 12) & 0x07) + 1).to(tl.float32)
    delta = tl.where((qh & 0x8000) != 0, -0.125, 0.125)
    idx = bitfields(field(P1, j, rows, mask, N, 8, tl.uint32), 8, 4, 0xFF) | (bitfields(qh, 3, 4, 0x07) << 8)
    # [R, (32 weights, run c, word a)]
    words = tl.reshape(grid_words(TABLE, idx, 2, 0, IN_STEP=True), (R, 64))
    return shifted_grid8_half(words, delta, dl, row_zero(rows)[:, None], DT)


@register("IQ1_S", 256, ("d", "qs", "qh"), table=IQ1_S_TABLE, dot=iq1_s_dot,
          dot_parts=(1, 2), x_int8=True, dequant_half=iq1_s_half,
          f16_nibble_run=-3, wide_f16="float32")
@triton.jit
def iq1_s(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N):
    d = field_f16_words(P0, j, rows, mask, N)
    # a 16-bit word per 32 weights: four 3-bit index highs, a 3-bit scale, the delta's sign
    qh = field(P2, j, rows, mask, N, 8, tl.uint16).to(tl.int32)
    dl = d * (2 * ((qh >> 12) & 0x07) + 1).to(tl.float32)
    idx = field(P1, j, rows, mask, N, 32, tl.uint8).to(tl.int32) | (bitfields(qh, 3, 4, 0x07) << 8)
    return per_group(dl, shifted(grid_rows(TABLE, idx, 2, 0), (qh & 0x8000) != 0))


@triton.jit
def iq1_m_scales(P2, j, rows, mask, N):
    """IQ1_M's d times each 16 weights' 3-bit scale, 2 * scale + 1, float32 [R, 16] (exact):
    its four 16-bit scale words (read as two 32-bit ones) hold four 3-bit scales each and a
    nibble of the float16 d on top."""
    s = bitfields(field(P2, j, rows, mask, N, 2, tl.uint32), 16, 2, 0xFFFF)  # [R, 4]
    d_bits = tl.sum((s >> 12) << (4 * tl.arange(0, 4))[None, :], axis=1)  # disjoint: sum is OR
    d = d_bits.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)[:, None]
    return d * (2 * bitfields(s, 3, 4, 0x07) + 1).to(tl.float32)


@triton.jit
def iq1_m_half(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, DT: tl.constexpr):
    """IQ1_M for the fused GEMM with float16 (or bfloat16) x, as iq1_s_half (its grid, its
    order, its PTX), with IQ1_M's fields: dl = d * (2 * scale + 1) every 16 weights
    (iq1_m_scales) rounded to DT, and a qh nibble every 8 weights, its 3 low bits the grid
    row's high bits and its top bit the delta's sign (-1/8 where set): two roundings where the
    float32 function has one, as IQ1_S."""
    R: tl.constexpr = rows.shape[0]
    dl = iq1_m_scales(P2, j, rows, mask, N)  # [R, 16]
    nib = bitfields(field(P1, j, rows, mask, N, 4, tl.uint32), 4, 8, 0x0F)  # [R, 32]: a row each
    idx = bitfields(field(P0, j, rows, mask, N, 8, tl.uint32), 8, 4, 0xFF) | ((nib & 0x07) << 8)
    words = tl.reshape(grid_words(TABLE, idx, 2, 0, IN_STEP=True), (R, 64))  # [R, (row, word a)]
    delta = tl.where((nib & 0x08) != 0, -0.125, 0.125)  # [R, 32]
    return shifted_grid8_half(words, delta, dl, row_zero(rows)[:, None], DT)


@register("IQ1_M", 256, ("qs", "qh", "scales"), table=IQ1_M_TABLE, dot=iq1_m_dot, x_int8=True,
          dot_parts=(1, 2), dequant_half=iq1_m_half, f16_nibble_run=-3, wide_f16="float32")
@triton.jit
def iq1_m(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N):
    # scales: four 16-bit words, each four 3-bit scales and a nibble of the f16 d on top
    s = field(P2, j, rows, mask, N, 4, tl.uint16).to(tl.int32)
    d_bits = tl.sum((s >> 12) << (4 * tl.arange(0, 4))[None, :], axis=1)  # disjoint: sum is OR
    d = d_bits.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)[:, None]
    dl = d * (2 * bitfields(s, 3, 4, 0x07) + 1).to(tl.float32)
    # a qh nibble per grid row: 3 index high bits, then the delta's sign
    nib = bitfields(field(P1, j, rows, mask, N, 16, tl.uint8), 4, 2, 0x0F)
    idx = field(P0, j, rows, mask, N, 32, tl.uint8).to(tl.int32) | ((nib & 0x07) << 8)
    return per_group(dl, shifted(grid_rows(TABLE, idx, 2, 0), (nib & 0x08) != 0))
