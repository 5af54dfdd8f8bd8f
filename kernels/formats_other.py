"""Ternary (TQ1_0, TQ2_0) and FP4 microscaling (MXFP4, NVFP4) types.

Every small value table here is a few integer operations, cheaper than a gather from memory.
"""

import triton
import triton.language as tl

from .fields import concat, field_bytes, field_f16, field_run, nibbles
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


@register("TQ1_0", 256, ("qs", "qh", "d"))
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


@register("TQ2_0", 256, ("qs", "d"))
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


@triton.jit
def e2m1_doubled(code):
    """4-bit E2M1 code -> twice its value as float32 (gguf-py's kvalues): 0, 1, 2, 3, 4, 6,
    8, 12, negated by bit 3. From magnitude code 2 up, bit 0 is the mantissa (2 or 3) and
    bits 1..2 the exponent. Negated as an integer so that code 8 gives +0.0, as the table
    does, not -0.0 (a different product with the scale, bitwise)."""
    m = (code & 7).to(tl.int32)
    mag = tl.where(m < 2, m, (2 + (m & 1)) << ((m >> 1) - 1))
    return tl.where((code & 8) != 0, -mag, mag).to(tl.float32)


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


@register("MXFP4", 32, ("e", "qs"))
@triton.jit
def mxfp4(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N):
    scale = e8m0_half(field_bytes(P0, j, rows, mask, N, 1))  # [R, 1]
    return e2m1_doubled(nibbles(field_bytes(P1, j, rows, mask, N, 16))) * scale


@register("NVFP4", 64, ("d", "qs"))
@triton.jit
def nvfp4(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N):
    # Four sub-blocks of 16 weights, each 8 bytes of nibbles (low ones first) and its own
    # scale byte.
    scale = ue4m3_half(field_bytes(P0, j, rows, mask, N, 4))[:, :, None]  # [R, 4, 1]
    qs = tl.reshape(field_bytes(P1, j, rows, mask, N, 32), (rows.shape[0], 4, 8))
    both = tl.permute(tl.join(qs & 0x0F, qs >> 4), (0, 1, 3, 2))  # [R, 4, 2, 8]
    codes = tl.reshape(both, (rows.shape[0], 4, 16))
    return tl.reshape(e2m1_doubled(codes) * scale, (rows.shape[0], 64))
