"""IQ types: importance-weighted quants over lattice grids and non-linear value tables.

Each type reads one int32 lookup table, built once per device from gguf-py's own class
attributes so it cannot drift from the reference:

* grid rows as signed bytes, four to a word (every grid value is a small integer, so the
  byte -> float32 conversion in the kernel gives gguf-py's float exactly); a row is then
  one (4-wide grids) or two (8-wide grids) gathers instead of one per weight;
* the 128 ksigns bytes (7-bit sign index -> 8 sign bits), at offset 0, grid after them;
* IQ4's 16 kvalues.

The float32 arithmetic repeats gguf-py's (and the torch backend's) operations in their order;
only the integer unpacking is arranged freely.
"""

from functools import cache

import numpy as np
import torch
import triton
import triton.language as tl

from .fields import (
    field,
    field_f16,
    field_run,
    lookup_run_dot,
    lookup_table,
    nibbles,
    row_u16,
    row_word,
    scale_f16,
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


@triton.jit
def kvalue(TABLE, q):
    return tl.load(TABLE.to(tl.pointer_type(tl.int32)) + q.to(tl.int32)).to(tl.float32)


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


@triton.jit
def iq4_nl_dot(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, XB, SB, part, PARTS: tl.constexpr):
    s = lookup_run_dot(lookup_table(TABLE, 16), P1, j, rows, mask, N, XB, 4, 0)
    return scale_f16(P0, j, rows, mask, N) * s


@register("IQ4_NL", 32, ("d", "qs"), table=_table(_kvalues), dot=iq4_nl_dot)
@triton.jit
def iq4_nl(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N):
    d = field_f16(P0, j, rows, mask, N)
    return d * kvalue(TABLE, nibbles(field(P1, j, rows, mask, N, 16, tl.uint8)))


@triton.jit
def iq4_xs_dot(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, XB, SB, part, PARTS: tl.constexpr):
    """The 256 // PARTS weights of part `part`: 8 sub-blocks of 32 in all, each 16 qs bytes
    (low nibbles, then high ones) and a 6-bit scale less 32, its low 4 bits in scales_l and
    its high 2 in scales_h."""
    SUBS: tl.constexpr = 8 // PARTS
    table = lookup_table(TABLE, 16)
    high_bits = row_u16(P1, j, rows, mask, N)
    low_bits = row_word(P2, j, rows, mask, N, 1, 0)
    acc = tl.zeros(rows.shape, tl.float32)
    for t in tl.static_range(SUBS):
        sub = SUBS * part + t
        s = lookup_run_dot(table, P3, j, rows, mask, N, XB + 32 * sub, 32, 4 * sub)
        scale = ((low_bits >> (4 * sub)) & 15) | (((high_bits >> (2 * sub)) & 3) << 4)
        acc += (scale - 32).to(tl.float32) * s
    return scale_f16(P0, j, rows, mask, N) * acc


@register("IQ4_XS", 256, ("d", "scales_h", "scales_l", "qs"), table=_table(_kvalues),
          dot=iq4_xs_dot, dot_parts=(1, 2, 4, 8))
@triton.jit
def iq4_xs(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N):
    R: tl.constexpr = rows.shape[0]
    d = field_f16(P0, j, rows, mask, N)
    # 6-bit sub-block scales offset by 32: low 4 bits in scales_l, high 2 in scales_h
    hi = bitfields(field(P1, j, rows, mask, N, 1, tl.uint16), 2, 8, 0x03)
    lo = bitfields(field(P2, j, rows, mask, N, 1, tl.uint32), 4, 8, 0x0F)
    dl = d * ((lo | (hi << 4)) - 32).to(tl.float32)
    # 8 runs of 16 bytes, each byte's low nibbles then its high ones: 32 weights a run
    qs = tl.reshape(field(P3, j, rows, mask, N, 128, tl.uint8), (R * 8, 16))
    q = tl.reshape(kvalue(TABLE, nibbles(qs)), (R, 256))
    return per_group(dl, q)


# -- 2-bit lattices, 8 weights per grid row --------------------------------------------


@register("IQ2_XXS", 256, ("d", "qs"), table=_table(_ksigns, _grid("IQ2_XXS")))
@triton.jit
def iq2_xxs(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N):
    R: tl.constexpr = rows.shape[0]
    d = field_f16(P0, j, rows, mask, N)
    # 8 groups of 32 weights in two words each: 4 grid index bytes, then an aux word holding
    # four 7-bit ksigns indices and the group's 4-bit scale on top
    idx_words, aux = tl.split(tl.reshape(field(P1, j, rows, mask, N, 16, tl.uint32), (R, 8, 2)))
    db = scale_2bit(d, aux >> 28)
    grid = grid_rows(TABLE, bitfields(idx_words, 8, 4, 0xFF), 2, KSIGNS)
    return signed(db, grid, ksign_factors(TABLE, bitfields(aux, 7, 4, 0x7F)))


@register("IQ2_XS", 256, ("d", "qs", "scales"), table=_table(_ksigns, _grid("IQ2_XS")))
@triton.jit
def iq2_xs(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N):
    d = field_f16(P0, j, rows, mask, N)
    q = field(P1, j, rows, mask, N, 32, tl.uint16).to(tl.int32)  # 9-bit grid, 7-bit ksigns
    db = scale_2bit(d, bitfields(field(P2, j, rows, mask, N, 2, tl.uint32), 4, 8, 0x0F))
    grid = grid_rows(TABLE, q & 0x1FF, 2, KSIGNS)
    return signed(db, grid, ksign_factors(TABLE, q >> 9))


@register("IQ2_S", 256, ("d", "qs", "qh", "scales"), table=_table(_grid("IQ2_S")))
@triton.jit
def iq2_s(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N):
    d = field_f16(P0, j, rows, mask, N)
    # qs: 32 grid index low bytes, then 32 sign bytes (a bit per weight); qh: 2 bits an index
    low = field_run(P1, j, rows, mask, N, 64, 0, 32, tl.uint8).to(tl.int32)
    signs = field_run(P1, j, rows, mask, N, 64, 32, 32, tl.uint8)
    idx = low | (bitfields(field(P2, j, rows, mask, N, 2, tl.uint32), 2, 16, 0x03) << 8)
    db = scale_2bit(d, bitfields(field(P3, j, rows, mask, N, 2, tl.uint32), 4, 8, 0x0F))
    return signed(db, grid_rows(TABLE, idx, 2, 0), sign_factors(signs))


# -- 3-bit lattices, 4 weights per grid row --------------------------------------------


@register("IQ3_XXS", 256, ("d", "qs"), table=_table(_ksigns, _grid("IQ3_XXS")))
@triton.jit
def iq3_xxs(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N):
    d = field_f16(P0, j, rows, mask, N)
    # qs: 64 grid index bytes, then 8 aux words as in IQ2_XXS
    idx = field_run(P1, j, rows, mask, N, 96, 0, 64, tl.uint8).to(tl.int32)
    aux = field_run(P1, j, rows, mask, N, 24, 16, 8, tl.uint32)
    db = d * (0.5 + (aux >> 28).to(tl.float32)) * 0.5
    signs = ksign_factors(TABLE, bitfields(aux, 7, 4, 0x7F))  # four indices an aux word
    return signed(db, grid_rows(TABLE, idx, 1, KSIGNS), signs)


@register("IQ3_S", 256, ("d", "qs", "qh", "signs", "scales"), table=_table(_grid("IQ3_S")))
@triton.jit
def iq3_s(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N):
    d = field_f16(P0, j, rows, mask, N)
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


@register("IQ1_S", 256, ("d", "qs", "qh"), table=_table(_grid("IQ1_S")))
@triton.jit
def iq1_s(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N):
    d = field_f16(P0, j, rows, mask, N)
    # a 16-bit word per 32 weights: four 3-bit index highs, a 3-bit scale, the delta's sign
    qh = field(P2, j, rows, mask, N, 8, tl.uint16).to(tl.int32)
    dl = d * (2 * ((qh >> 12) & 0x07) + 1).to(tl.float32)
    idx = field(P1, j, rows, mask, N, 32, tl.uint8).to(tl.int32) | (bitfields(qh, 3, 4, 0x07) << 8)
    return per_group(dl, shifted(grid_rows(TABLE, idx, 2, 0), (qh & 0x8000) != 0))


@register("IQ1_M", 256, ("qs", "qh", "scales"), table=_table(_grid("IQ1_M")))
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
