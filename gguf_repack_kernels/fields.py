"""Triton helpers every type's dequant function uses: reading a field of the rp1 planes
(one contiguous run per row, so a tile reads it with vector loads) and joining tiles in
ggml's weight order. Each loader casts the plane pointer to the element type it reads."""

import os

import numpy as np
import triton
import triton.language as tl

# Whether triton.jit runs these functions in its interpreter (decided, as Triton decides it,
# when the module is imported): the interpreter cannot run inline PTX, so `dot4` has a
# plain-integer twin for it.
INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")


@triton.jit
def field_run(P, j, rows, mask, N, COUNT: tl.constexpr, START: tl.constexpr,
              LEN: tl.constexpr, DTYPE: tl.constexpr):
    """Elements START..START+LEN of a field of COUNT DTYPE elements per block, as
    [len(rows), LEN]: one contiguous run per row (vector loads)."""
    base = (j * N + rows).to(tl.int64) * COUNT + START
    ptr = P.to(tl.pointer_type(DTYPE)) + base[:, None] + tl.arange(0, LEN)[None, :]
    return tl.load(ptr, mask=mask[:, None], other=0)


@triton.jit
def field(P, j, rows, mask, N, COUNT: tl.constexpr, DTYPE: tl.constexpr):
    """A whole field of COUNT DTYPE elements per block, as [len(rows), COUNT]."""
    return field_run(P, j, rows, mask, N, COUNT, 0, COUNT, DTYPE)


@triton.jit
def field_bytes(P, j, rows, mask, N, COUNT: tl.constexpr):
    """A byte field of COUNT bytes per block as uint8 [len(rows), COUNT]."""
    return field_run(P, j, rows, mask, N, COUNT, 0, COUNT, tl.uint8)


@triton.jit
def field16_in_word(P, j, rows, mask, N):
    """A field of one 16-bit scalar per block (a scale) as int32 [len(rows)], the scalar in
    its low half: read as the aligned 32-bit word that holds it. A tile's rows then load 4
    bytes a thread, which Triton's pipeliner copies ahead asynchronously; it takes no load
    under 32 bits a thread, and a float16 scale a row, loaded alone, was a synchronous load
    in every K step of the fused tiles: a full memory latency each (BENCHMARKS.md, "Scales
    in words"). The launcher makes every plane a whole number of words an expert
    (dispatch._plane_args)."""
    at = j * N + rows  # (int32, then int64, as every plane's index)
    word = tl.load(P.to(tl.pointer_type(tl.int32)) + (at >> 1).to(tl.int64), mask=mask, other=0)
    return word >> half_shift(j, rows, N)


@triton.jit
def half_shift(j, rows, N):
    """16 where element j * N + row of a 16-bit field is the high half of its word, else 0:
    its parity is that of j * N (j's and N's) and the row's, so the row's part stays out of
    the K loop, where the index's own would cost an add a row a step."""
    return ((rows ^ (j & N)) & 1) * 16


@triton.jit
def field16_pair_in_words(PA, PB, j, rows, mask, N):
    """Two fields of one 16-bit scalar per block (a scale and a min), each as
    field16_in_word's int32 [len(rows)], read in one [len(rows), 2] load of the two words:
    one tensor, so Triton gives both scalars one layout. Loaded apart in words, Q4_K's
    float16 tiles had their scales computed in the swapped tile's replicated fragment layout
    (sm_90, the BM = 32 tile: 586 -> 2105 instructions a step, spilling); together, 613."""
    at = j * N + rows
    first = tl.arange(0, 2)[None, :] == 0
    planes = tl.where(first, PA.to(tl.pointer_type(tl.int32)), PB.to(tl.pointer_type(tl.int32)))
    words = tl.load(planes + (at >> 1).to(tl.int64)[:, None], mask=mask[:, None], other=0)
    return tl.split(words >> half_shift(j, rows, N)[:, None])


@triton.jit
def f16_half(w):
    """The float16 in the low half of int32 w."""
    return w.to(tl.int16).to(tl.float16, bitcast=True)


@triton.jit
def f16_of_word(w):
    """The float16 in the low half of int32 w, as float32."""
    return f16_half(w).to(tl.float32)


@triton.jit
def field_f16(P, j, rows, mask, N):
    """A float16 scale field as float32 [len(rows), 1], one float16 a row: a synchronous load
    in a K loop. For the float32 dequant functions of the 32-weight types, IQ4_NL and the
    ternary ones (the tiles' for bfloat16 x): read in words (field_f16_words), Triton lays
    their whole weight tile out anew and sends it through shared memory (Q4_0's BM = 16 tile:
    923 -> 1231 instructions a step, sm_90)."""
    base = (j * N + rows).to(tl.int64)
    ptr = P.to(tl.pointer_type(tl.float16)) + base
    return tl.load(ptr, mask=mask, other=0.0).to(tl.float32)[:, None]


@triton.jit
def field_f16_words(P, j, rows, mask, N):
    """field_f16 read in words (field16_in_word): copied ahead by the pipeliner."""
    return f16_of_word(field16_in_word(P, j, rows, mask, N))[:, None]


@triton.jit
def byte_in_word16(P, words, b, mask):
    """Byte b (an int tensor) of the run of bytes that starts at 16-bit word `words` (int64)
    of P, as int32: read as the 16-bit word that holds it, the byte in the result's low 8
    bits (above them the word's other byte or none: the caller masks). A tile's narrowest load
    behind its weights sizes both MMA operands' register fragments (kWidth, gemm.py's fence
    note): a byte load there gave the BM = 16 tile's x, the A operand from shared memory,
    scalar loads and 4 register moves an MMA instead of ldmatrix; 16-bit loads do not (Q3_K,
    MXFP4). Loads under 4 bytes are left to the K loop by the pipeliner: a wait a step, as
    for a 16-bit scale. (With b a column's constant, its word and shift are too: an offset
    in bytes split at run time cost Q3_K's tile 13 instructions a step.)"""
    word = tl.load(P.to(tl.pointer_type(tl.uint16)) + words + b // 2, mask=mask, other=0).to(tl.int32)
    return word >> 8 * (b % 2)


@triton.jit
def field_word(P, j, rows, mask, N, COUNT: tl.constexpr, WORD: tl.constexpr):
    """Word WORD of a field of `COUNT` int32 words per block, as int32 [len(rows)]: for bit
    fields that are unpacked by shifting the whole word."""
    base = (j * N + rows).to(tl.int64) * COUNT + WORD
    return tl.load(P.to(tl.pointer_type(tl.int32)) + base, mask=mask, other=0)


@triton.jit
def concat(a, b):
    """[R, n] twice -> [R, 2n]: all of a, then all of b (tl.cat may reorder elements)."""
    return tl.reshape(tl.permute(tl.join(a, b), (0, 2, 1)), (a.shape[0], 2 * a.shape[1]))


@triton.jit
def field_h(P, j, rows, mask, N, DT: tl.constexpr = tl.float16):
    """A float16 scale field as DT [len(rows), 1] (for the half dequant functions: float16,
    or rounded to bfloat16)."""
    return f16_half(field16_in_word(P, j, rows, mask, N)).to(DT)[:, None]


# --- nibbles to float16 a word at a time (the fused GEMM's float16 dequant functions) -----
#
# Unpacking byte by byte costs a PRMT per byte to widen it to 16 bits, and more to pair the
# halves for the MMA: in the SASS of the BM = 16 tile that was most of what Q4_0 issued
# (49 PRMT and 38 IMAD for 32 weights a thread, against 64 instructions of arithmetic). A
# 32-bit word holds two float16 halves, so two nibbles go under float16's exponent of 1024 at
# once (Marlin's and FasterTransformer's trick): with the word's middle bytes swapped (one
# PRMT), (word >> s) & 0x000F000F | 0x64006400 is 1024 + a nibble of two neighbouring bytes
# in one register, for s = 0, 8 (low nibbles) and 4, 12 (high ones): one shift and one LOP3
# for two weights, already paired as the MMA takes them.
#
# The same serves bfloat16 x (vLLM's default), `DT` choosing the type: bfloat16 has 7
# mantissa bits to float16's 10, so its exponent of 128 (0x4300) holds any value under 128
# exactly (a nibble, Q5's 5 bits, Q6_K's 6; not a whole byte), 0x43004300 | two of them is
# 128 + each, and the arithmetic after it is the same in bfloat16 (HFMA2.BF16, sm_80+).
# Each function states its constants for both, `X: tl.constexpr = .. if DT == tl.bfloat16
# else ..`: a helper's return value would be a tensor, and a float32 one promotes the
# half-precision arithmetic it meets to float32.

# prmt.b32 with selector 0x3120: bytes [b0, b1, b2, b3] -> [b0, b2, b1, b3]
SWAP_MIDDLE_BYTES_PTX = tl.constexpr("prmt.b32 $0, $1, 0, 0x3120;")
# a word as its two float16 halves (a register pair for ptxas; no instruction)
F16_HALVES_PTX = tl.constexpr("mov.b32 {$0, $1}, $2;")


@triton.jit
def swap_middle_bytes(w):
    """int32 words with their bytes [b0, b1, b2, b3] -> [b0, b2, b1, b3]: one PRMT."""
    if INTERPRETED:
        return (w & -16776961) | ((w & 0x0000FF00) << 8) | ((w >> 8) & 0x0000FF00)
    else:
        return tl.inline_asm_elementwise(SWAP_MIDDLE_BYTES_PTX, "=r,r", [w], dtype=tl.int32,
                                         is_pure=True, pack=1)


@triton.jit
def f16_halves(v, DT: tl.constexpr = tl.float16):
    """int32 [...] holding two float16 (or DT) bit patterns -> DT [..., 2]: the low half,
    then the high one."""
    if INTERPRETED:
        lo = (v & 0xFFFF).to(tl.int16).to(DT, bitcast=True)
        hi = ((v >> 16) & 0xFFFF).to(tl.int16).to(DT, bitcast=True)
    elif DT == tl.bfloat16:  # (inline_asm_elementwise takes a dtype, not a constexpr of one)
        lo, hi = tl.inline_asm_elementwise(F16_HALVES_PTX, "=h,=h,r", [v],
                                           dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=1)
    else:
        lo, hi = tl.inline_asm_elementwise(F16_HALVES_PTX, "=h,=h,r", [v],
                                           dtype=(tl.float16, tl.float16), is_pure=True, pack=1)
    return tl.join(lo, hi)


@triton.jit
def nibbles_f16(w, RUN: tl.constexpr, Z, DT: tl.constexpr = tl.float16, LESS: tl.constexpr = 0):
    """int32 [R, n] (the words of n * 4 bytes of nibbles, read as runs of RUN words) ->
    float16 (or DT) [R, 8n], each nibble less LESS, exactly, in ggml's order: per run, every
    byte's low nibble, then every high one. Z: opaque_zero (keeps the masks in registers).
    In float16 a high nibble is left at bits 4-7, under an exponent that makes bit 4 worth 1
    (64 + the nibble, a low one 1024 + it): a shift by 8 a word, not one a pair of weights."""
    R: tl.constexpr = w.shape[0]
    n: tl.constexpr = w.shape[1]
    t = swap_middle_bytes(w)[:, :, None, None]
    high = tl.arange(0, 2)[None, None, :, None]  # low or high nibbles
    pair = tl.arange(0, 2)[None, None, None, :]  # bytes 0, 1 or 2, 3 of the word
    if DT == tl.bfloat16:  # (bit 7 is an exponent bit there)
        v = (t >> (4 * high + 8 * pair)) & (0x000F000F + Z) | (0x43004300 + Z)
        q = f16_halves(v, DT) - (128.0 + LESS)
    else:
        ones = ((25 - 4 * high) << 10) * 0x10001
        v = (t >> (8 * pair)) & (0x000F000F << 4 * high) | (ones + Z)
        q = f16_halves(v, DT) - f16_halves((ones | (LESS << 4 * high) * 0x10001) + Z, DT)
    q = tl.reshape(q, (R, n // RUN, RUN, 2, 2, 2))  # [R, run, word, high, pair, half]
    return tl.reshape(tl.permute(q, (0, 1, 3, 2, 4, 5)), (R, 8 * n))


@triton.jit
def nibbles_f16_fragments(w, Z, DT: tl.constexpr = tl.float16):
    """int32 [R, 32] (the 128 bytes of a 256-weight block's nibbles, 4 runs of 32 bytes:
    run c's byte b holds weights 64c + b and 64c + 32 + b) -> float16 (or DT) [R, 4, 8, 2, 2,
    2], each nibble exactly, as (run c, word i, byte pair s1, high nibble s0, half)."""
    R: tl.constexpr = w.shape[0]
    t = swap_middle_bytes(w)[:, :, None]
    s = tl.arange(0, 4)[None, None, :]  # (lo b0, lo b1), (hi ..), (lo b2, lo b3), (hi ..)
    if DT == tl.bfloat16:
        v = (t >> (4 * s)) & (0x000F000F + Z) | (0x43004300 + Z)
        return tl.reshape(f16_halves(v, DT) - 128.0, (R, 4, 8, 2, 2, 2))  # [R, c, i, s1, s0, half]
    # float16: the high nibbles left at bits 4-7, under an exponent that makes bit 4 worth 1
    # (64 + each): a shift by 8 a word, not one a pair
    high = s % 2
    ones = ((25 - 4 * high) << 10) * 0x10001
    v = (t >> (8 * (s // 2))) & (0x000F000F << 4 * high) | (ones + Z)
    return tl.reshape(f16_halves(v, DT) - f16_halves(ones + Z, DT), (R, 4, 8, 2, 2, 2))


@triton.jit
def fragment_order_256(q):
    """[R, c, i, s1, s0, half] (nibbles_f16_fragments) -> [R, 256] in the order
    tile_columns(256, -1) reads x: column 32i + 16 s1 + 8 s0 + 2c + half, so that an MMA
    fragment's thread c (k = 2c, 2c + 1, 2c + 8, 2c + 9 of each 16) takes run c's bytes only."""
    R: tl.constexpr = q.shape[0]
    return tl.reshape(tl.permute(q, (0, 2, 3, 4, 1, 5)), (R, 256))


@triton.jit
def fragment_order_32(q):
    """[R, c, j, h, half] of a 32-weight block (word c of its 16 bytes of nibbles, low nibbles
    j = 0 or high j = 1, byte pair h: weight 16j + 4c + 2h + half) -> [R, 32] in the order
    tile_columns(32, -1) reads x: column 16j + 8h + 2c + half, so that an MMA fragment's
    thread c (k = 2c, 2c + 1, 2c + 8, 2c + 9 of each 16) takes word c's bytes only."""
    R: tl.constexpr = q.shape[0]
    return tl.reshape(tl.permute(q, (0, 2, 3, 1, 4)), (R, 32))


@triton.jit
def fragment_order_runs8(q):
    """[R, g, c, a, b, half] (run c of 8 weights in each 32, word a, byte pair b: weight
    32g + 8c + 4a + 2b + half) -> [R, 32 g] in the order tile_columns(256, -3) reads x, so
    that an MMA fragment's thread c (k = 2c, 2c + 1, 2c + 8, 2c + 9 of each 16) takes run c."""
    R: tl.constexpr = q.shape[0]
    return tl.reshape(tl.permute(q, (0, 1, 3, 4, 2, 5)), (R, 32 * q.shape[1]))


# --- whole bytes to float16 a word at a time (Q5_x, Q6_K, Q8_0) ----------------------------
#
# Where a weight's bits are assembled into a byte first (a nibble and its fifth or fifth and
# sixth bits, or Q8_0's byte as it is), a PRMT puts two bytes under float16's exponent of
# 1024 at once: with b = 0x64646464, selector 0x4140 gives bytes [b0, 0x64, b1, 0x64], two
# float16 halves 1024 + b0 and 1024 + b1, and 0x4342 the same of b2, b3: two PRMTs for four
# weights, paired as the MMA takes them, in the bytes' order.
BYTES_F16_PTX = tl.constexpr("prmt.b32 $0, $2, $3, 0x4140; prmt.b32 $1, $2, $3, 0x4342;")


@triton.jit
def bytes_f16(w, Z, DT: tl.constexpr = tl.float16):
    """int32 [R, n] -> float16 [R, 4n]: 1024 + each byte (unsigned), exactly, in the bytes'
    order; bfloat16: 128 + each, bytes under 128 only. Z: opaque_zero (keeps 0x64646464 in a
    register, not rematerialized a PRMT)."""
    R: tl.constexpr = w.shape[0]
    n: tl.constexpr = w.shape[1]
    ONES: tl.constexpr = 0x43004300 if DT == tl.bfloat16 else 0x64006400
    EXPONENTS: tl.constexpr = 0x43434343 if DT == tl.bfloat16 else 0x64646464
    if INTERPRETED:
        lo = (w & 0xFF) | ((w << 8) & 0xFF0000) | ONES
        hi = (shr(w, 16) & 0xFF) | (shr(w, 8) & 0xFF0000) | ONES
    else:
        lo, hi = tl.inline_asm_elementwise(BYTES_F16_PTX, "=r,=r,r,r", [w, EXPONENTS + Z],
                                           dtype=(tl.int32, tl.int32), is_pure=True, pack=1)
    q = tl.join(f16_halves(lo, DT), f16_halves(hi, DT))  # [R, n, byte within the half, half]
    return tl.reshape(tl.permute(q, (0, 1, 3, 2)), (R, 4 * n))


# BYTES_F16_PTX's PRMT with its selector from a register: 0x4140 gives bytes 0, 1 and
# 0x4342 bytes 2, 3, each under the exponent byte 0x64 of b
BYTE_PAIR_F16_PTX = tl.constexpr("prmt.b32 $0, $1, $2, $3;")


@triton.jit
def byte_pairs_f16(w, Z, DT: tl.constexpr = tl.float16):
    """int32 [R, a, b] -> int32 [R, a, b, 2]: pair h of each word, bytes 2h and 2h + 1, as two
    float16 halves 1024 + each (unsigned), exactly: one PRMT a pair, as bytes_f16's, but the
    new last dimension made by broadcasting, not by joining two tensors (a join here sent the
    swapped tiles' weights through shared memory: 128 STS a step for Q5_0). Z: a zero of w's
    shape or one that broadcasts to it (row_zero). DT bfloat16: 128 + each, bytes under 128."""
    h = tl.arange(0, 2)[None, None, None, :]
    ONES: tl.constexpr = 0x43004300 if DT == tl.bfloat16 else 0x64006400
    EXPONENTS: tl.constexpr = 0x43434343 if DT == tl.bfloat16 else 0x64646464
    if INTERPRETED:
        b = shr(w[:, :, :, None], 16 * h)
        return (b & 0xFF) | ((b << 8) & 0xFF0000) | (ONES + Z[:, :, :, None])
    else:
        return tl.inline_asm_elementwise(
            BYTE_PAIR_F16_PTX, "=r,r,r,r",
            [w[:, :, :, None], EXPONENTS + Z[:, :, :, None], 0x4140 + 0x202 * h],
            dtype=tl.int32, is_pure=True, pack=1)


# byte_pairs_f16's PRMT, then the pair less a bias and times a scale, both float16 pairs: in
# one asm statement because as tensor operations after f16_halves' join (a subtraction and a
# product with a per-row or per-sub-block scale) Triton lays the weight tile out anew and
# sends it through shared memory (IQ4_XS's BM = 16 tile: 2,029 instructions a step and
# spills, against 669 here; a constant factor alone does not do it)
BYTE_PAIR_SCALED_F16_PTX = tl.constexpr(
    "{ .reg .b32 t; prmt.b32 t, $1, $2, $3; sub.f16x2 t, t, $4; mul.f16x2 $0, t, $5; }")


# the same in bfloat16 (its exponent byte 0x43: bytes under 128), as fmas: sm_80 has no sub
# or mul of bfloat16 pairs (sm_90's are fmas too); the pair plus -BIAS, exactly, then times
# the scale plus -0.0 (a product's sign and zero kept), rounded once
BYTE_PAIR_SCALED_BF16_PTX = tl.constexpr(
    "{ .reg .b32 t, one, nz; mov.b32 one, 0x3F803F80; mov.b32 nz, 0x80008000; "
    "prmt.b32 t, $1, $2, $3; fma.rn.bf16x2 t, t, one, $4; fma.rn.bf16x2 $0, t, $5, nz; }")


# byte_pairs_f16's PRMT of bytes made unsigned by + 128 (signed ones XORed with 0x80), then
# less the 1152 that leaves them exact, plus a delta and times a scale, float16 pairs each: the
# 1-bit grids' (grid + delta) * scale (the delta is not exact in 1152 - delta)
BYTE_PAIR_SHIFTED_F16_PTX = tl.constexpr(
    "{ .reg .b32 t; prmt.b32 t, $1, $2, $3; sub.f16x2 t, t, $4; add.f16x2 t, t, $5; "
    "mul.f16x2 $0, t, $6; }")


@triton.jit
def f16_pair_word(x):
    """float16 (or bfloat16) [...] -> int32 [...]: x in both halves of a word (a pair)."""
    bits = x.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    return bits | (bits << 16)


@triton.jit
def byte_pairs_scaled_f16(w, Z, scale, BIAS: tl.constexpr):
    """int32 [R, n] -> int32 [R, n, 2]: byte_pairs_f16's pair h of each word, each half less
    BIAS (exactly: 1024 + byte - BIAS is a small integer) and times `scale` (float16 [R, n],
    or one that broadcasts to it), rounded once. Z: row_zero, [R, 1]."""
    return byte_pairs_times_f16(w, Z, f16_pair_word(scale)[:, :, None], BIAS)


@triton.jit
def byte_pairs_times_f16(w, Z, scales, BIAS: tl.constexpr, DT: tl.constexpr = tl.float16):
    """byte_pairs_scaled_f16 with a scale for each half: `scales` int32 [R, n, 2] (or one
    that broadcasts to it), float16 pairs, pair h's for pair h of each word. DT bfloat16:
    bfloat16 pairs, bytes under 128, BIAS from 128 + each."""
    h = tl.arange(0, 2)[None, None, :]
    if INTERPRETED:  # byte_pairs_f16's pairs, then the float16 arithmetic the PTX does
        pair = tl.reshape(byte_pairs_f16(w[:, :, None], Z[:, :, None], DT), (w.shape[0], w.shape[1], 2))
        lo = (pair.to(tl.int16).to(DT, bitcast=True) - BIAS) * scales.to(tl.int16).to(DT, bitcast=True)
        hi = (shr(pair, 16).to(tl.int16).to(DT, bitcast=True) - BIAS) \
            * shr(scales, 16).to(tl.int16).to(DT, bitcast=True)
        return (lo.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF) \
            | (hi.to(tl.int16, bitcast=True).to(tl.int32) << 16)
    elif DT == tl.bfloat16:
        negative_bias = f16_pair_word(tl.full((1,), -BIAS, tl.bfloat16))[None, None, :] + Z[:, :, None]
        return tl.inline_asm_elementwise(
            BYTE_PAIR_SCALED_BF16_PTX, "=r,r,r,r,r,r",
            [w[:, :, None], 0x43434343 + Z[:, :, None], 0x4140 + 0x202 * h, negative_bias, scales],
            dtype=tl.int32, is_pure=True, pack=1)
    else:
        bias = f16_pair_word(tl.full((1,), BIAS, tl.float16))[None, None, :] + Z[:, :, None]
        return tl.inline_asm_elementwise(
            BYTE_PAIR_SCALED_F16_PTX, "=r,r,r,r,r,r",
            [w[:, :, None], 0x64646464 + Z[:, :, None], 0x4140 + 0x202 * h, bias, scales],
            dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def signed_byte_pairs_shifted_f16(w, Z, deltas, scales):
    """int32 [R, n] of signed bytes -> int32 [R, n, 2]: pair h of each word, bytes 2h and
    2h + 1, as two float16 halves (byte + delta) * scale, `deltas` and `scales` float16 pairs
    (int32 [R, n, 2] or ones that broadcast to it): the byte exact, plus the delta exact
    (IQ1's +-1/8 on -1, 0, 1), times the scale rounded once. Z: row_zero, [R, 1]."""
    h = tl.arange(0, 2)[None, None, :]
    u = w ^ (-0x7F7F7F80 + Z)  # 0x80808080: byte + 128, unsigned
    bias = f16_pair_word(tl.full((1,), 1152.0, tl.float16))[None, None, :] + Z[:, :, None]
    if INTERPRETED:
        pair = tl.reshape(byte_pairs_f16(u[:, :, None], Z[:, :, None]), (w.shape[0], w.shape[1], 2))
        lo = (f16_half(pair) - 1152.0 + f16_half(deltas)) * f16_half(scales)
        hi = (f16_half(shr(pair, 16)) - 1152.0 + f16_half(shr(deltas, 16))) * f16_half(shr(scales, 16))
        return (lo.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF) \
            | (hi.to(tl.int16, bitcast=True).to(tl.int32) << 16)
    else:
        return tl.inline_asm_elementwise(
            BYTE_PAIR_SHIFTED_F16_PTX, "=r,r,r,r,r,r,r",
            [u[:, :, None], 0x64646464 + Z[:, :, None], 0x4140 + 0x202 * h, bias, deltas, scales],
            dtype=tl.int32, is_pure=True, pack=1)


# the same in bfloat16 for bytes of -1, 0 and 1 made 0, 1 and 2: under bfloat16's exponent
# byte, 129 off (exact), then times the scale plus the delta times the scale in one fma (the
# delta is a power of two, so its product with the scale is exact): (g + delta) * scale,
# rounded once
BYTE_PAIR_SHIFTED_BF16_PTX = tl.constexpr(
    "{ .reg .b32 t, one; mov.b32 one, 0x3F803F80; prmt.b32 t, $1, $2, $3; "
    "fma.rn.bf16x2 t, t, one, $4; fma.rn.bf16x2 $0, t, $5, $6; }")


@triton.jit
def signed_byte_pairs_shifted_bf16(w, Z, scaled_deltas, scales):
    """signed_byte_pairs_shifted_f16 in bfloat16 for bytes of -1, 0 and 1 (IQ1's grids):
    `scales` and `scaled_deltas` (each delta times its scale, exact: the deltas are +-1/8)
    bfloat16 pairs. Each byte plus 1 (XOR 0x80, then 0x7F off: no byte borrows) under
    bfloat16's exponent, 129 off, times the scale plus the scaled delta: one rounding."""
    h = tl.arange(0, 2)[None, None, :]
    u = (w ^ (-0x7F7F7F80 + Z)) - 0x7F7F7F7F  # byte + 1: 0, 1, 2
    if INTERPRETED:  # the pairs, then the fma the PTX does (in float32: exact, one rounding)
        pair = tl.reshape(byte_pairs_f16(u[:, :, None], Z[:, :, None], tl.bfloat16),
                          (w.shape[0], w.shape[1], 2))
        halves = []
        for k in tl.static_range(2):
            v = shr(pair, 16 * k).to(tl.int16).to(tl.bfloat16, bitcast=True).to(tl.float32) - 129.0
            s = shr(scales, 16 * k).to(tl.int16).to(tl.bfloat16, bitcast=True).to(tl.float32)
            ds = shr(scaled_deltas, 16 * k).to(tl.int16).to(tl.bfloat16, bitcast=True).to(tl.float32)
            halves.append((v * s + ds).to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF)
        return halves[0] | (halves[1] << 16)
    else:
        negative_bias = f16_pair_word(tl.full((1,), -129.0, tl.bfloat16))[None, None, :] + Z[:, :, None]
        return tl.inline_asm_elementwise(
            BYTE_PAIR_SHIFTED_BF16_PTX, "=r,r,r,r,r,r,r",
            [u[:, :, None], 0x43434343 + Z[:, :, None], 0x4140 + 0x202 * h, negative_bias, scales,
             scaled_deltas],
            dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def nibbles(b):
    """uint8 [R, n] -> [R, 2n]: every byte's low nibble, then every high one (ggml's order)."""
    return concat(b & 0x0F, b >> 4)


# --- GEMV helpers (M <= 8): one row per tensor element, scalars of x, exact integer fields ---
#
# The decode GEMV keeps every tensor 1-D over the tile's rows (no layout conversions, each
# thread owns whole rows), reads x as uniform scalars (one conversion per value per thread,
# shared by the thread's rows), and turns a bit field into float32 without I2F, whose
# throughput is a sixteenth of an FFMA's: OR the field, in place, into the mantissa of
# 2**23 (one LOP3), then one FFMA scales it down by its bit position and subtracts 2**23 and
# the type's offset, exactly. Fields need no shift unless they reach past bit 22.


@triton.jit
def words4(P, j, rows, mask, N, COUNT: tl.constexpr, FIRST):
    """Words FIRST..FIRST+3 of a field of COUNT int32 words per block, one 16-byte load per
    row, as four int32 [len(rows)] (FIRST a multiple of 4)."""
    base = (j * N + rows).to(tl.int64) * COUNT + FIRST
    w = tl.load(P.to(tl.pointer_type(tl.int32)) + base[:, None] + tl.arange(0, 4)[None, :],
                mask=mask[:, None], other=0)
    return split4(w)


@triton.jit
def words2(P, j, rows, mask, N, COUNT: tl.constexpr, FIRST):
    """Words FIRST, FIRST+1 of a field of COUNT int32 words per block, one 8-byte load per
    row, as two int32 [len(rows)] (FIRST even)."""
    base = (j * N + rows).to(tl.int64) * COUNT + FIRST
    w = tl.load(P.to(tl.pointer_type(tl.int32)) + base[:, None] + tl.arange(0, 2)[None, :],
                mask=mask[:, None], other=0)
    w0, w1 = tl.split(w)
    return w0, w1


@triton.jit
def row_words(TABLE, AT: tl.constexpr, idx, WORDS: tl.constexpr):
    """Row idx [R] of a table of WORDS-word rows at word AT, as int32 [R, WORDS]: one 8- or
    16-byte load per row (the multiply by WORDS is what tells Triton that the row is
    aligned; ptxas folds it into the mask that made idx)."""
    cols = tl.arange(0, WORDS)[None, :]
    return tl.load(TABLE.to(tl.pointer_type(tl.int32)) + AT + idx[:, None] * WORDS + cols)


@triton.jit
def split4(v):
    """[R, 4] -> its 4 columns as [R] each."""
    a, b = tl.split(tl.reshape(v, (v.shape[0], 2, 2)))
    v0, v2 = tl.split(a)
    v1, v3 = tl.split(b)
    return v0, v1, v2, v3


@triton.jit
def row_load(ptr, mask, other):
    """One element per row, loaded as a [len(rows), 1] tile and reduced to 1-D. A 1-D load
    at contiguous rows is vectorized over 4 rows per thread, while words4's loads give each
    thread whole rows 128 apart; mixing those layouts costs a shared-memory round trip per
    value derived from the load (BAR, STS, LDSM in the SASS). The tile's slice is words4's."""
    return tl.sum(tl.load(ptr[:, None], mask=mask[:, None], other=other), axis=1)


# A gather from a small table the L1 holds (the grid types' rows), in a form Triton's
# pipeliner leaves alone: it turns a tl.load whose value feeds a tl.dot into an asynchronous
# copy to shared memory, a read back and both addresses, gathers too (IQ3_XXS's BM = 16 tile,
# sm_90: 48 LDGSTS and 60 LDS a K step, against 32 LDG this way). The table is read only:
# ld.global.nc, through the read-only path.
GATHER_WORD_PTX = tl.constexpr("ld.global.nc.b32 $0, [$1];")
GATHER_WORD_PAIR_PTX = tl.constexpr("ld.global.nc.v2.b32 {$0, $1}, [$2];")


@triton.jit
def gather_words(ptr):
    """The int32 word at each of `ptr` (int32 pointers), loaded in the K step itself (above)."""
    if INTERPRETED:
        return tl.load(ptr)
    else:
        return tl.inline_asm_elementwise(GATHER_WORD_PTX, "=r,l", [ptr], dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def gather_word_pairs(ptr):
    """The two int32 words at each of `ptr` (int32 pointers, 8-byte aligned), [..., 2], in one
    load a pair, as gather_words."""
    if INTERPRETED:
        return tl.join(tl.load(ptr), tl.load(ptr + 1))
    else:
        w0, w1 = tl.inline_asm_elementwise(GATHER_WORD_PAIR_PTX, "=r,=r,l", [ptr],
                                           dtype=(tl.int32, tl.int32), is_pure=True, pack=1)
        return tl.join(w0, w1)


@triton.jit
def scale_f16(P, j, rows, mask, N):
    """A float16 scale field as float32 [len(rows)] (the GEMV's 1-D form of field_f16)."""
    ptr = P.to(tl.pointer_type(tl.float16)) + (j * N + rows).to(tl.int64)
    return row_load(ptr, mask, 0.0).to(tl.float32)


@triton.jit
def row_word(P, j, rows, mask, N, COUNT: tl.constexpr, WORD: tl.constexpr):
    """Word WORD of a field of COUNT int32 words per block, as int32 [len(rows)], in the
    GEMV's layout (see row_load)."""
    base = (j * N + rows).to(tl.int64) * COUNT + WORD
    return row_load(P.to(tl.pointer_type(tl.int32)) + base, mask, 0)


@triton.jit
def scalars4(v):
    """A [4] vector -> its 4 elements as scalars (loaded as one vector, used one by one)."""
    a, b = tl.split(tl.reshape(v, (2, 2)))
    v0, v2 = tl.split(a)
    v1, v3 = tl.split(b)
    return v0, v1, v2, v3


@triton.jit
def x4(XB, AT: tl.constexpr):
    """x[AT..AT+3] of the block at XB (prepare_x_kernel's float32 x) as four float32 scalars
    (one vector load)."""
    return scalars4(tl.load(XB + AT + tl.arange(0, 4)))


@triton.jit
def x_sum(SB, AT: tl.constexpr, COUNT: tl.constexpr):
    """x[AT] + ... + x[AT + COUNT - 1] of the block, from prepare_x_kernel's sums of 16 (SB
    points at the block's first; AT and COUNT multiples of 16): what a sub-block's min
    multiplies."""
    total = tl.load(SB + AT // 16)
    # scalar loads added one by one: a tl.sum over a loaded vector spreads it over the
    # threads and gathers it back with shuffles
    for i in tl.static_range(1, COUNT // 16):
        total += tl.load(SB + AT // 16 + i)
    return total


# --- GEMV with int8 x (types whose weights are too few bits for a float per weight) ---
#
# A 2- or 3-bit weight leaves the GEMV about 3 instructions per weight at the H200 budget,
# and a float multiply-add of each weight spends that on its own. A 4-bit code that indexes
# a table (MXFP4, NVFP4, IQ4_NL, IQ4_XS) costs a gather and a float multiply-add a weight; as int8
# the table's values come 8 a word by PRMTs (lookup16_nibbles_int8), 4 a DP4A. For those types x is
# quantized per 32 values to int8 once per call (prepare_x_q8_kernel, as gguf-py's Q8_0 and
# llama.cpp's q8_1 do) and 4 weights at a time are multiplied by one DP4A: a mask puts 4
# fields, one per byte, where DP4A reads them. The block's x is then XSTRIDE bytes:
# BLOCK int8 values and the float32 scale of each 32.


@triton.jit
def dot4(a, b, c, A_SIGNED: tl.constexpr = False):
    """c + the sum of the 4 bytes of a (unsigned, or signed with A_SIGNED) times those of b
    (signed), int32 [R]: one PTX dp4a; in the interpreter the same sum spelled out."""
    if INTERPRETED:
        for i in tl.static_range(4):
            if A_SIGNED:
                ai = (a << (24 - 8 * i)) >> 24
            else:
                ai = (a >> (8 * i)) & 255
            c += ai * ((b << (24 - 8 * i)) >> 24)
        return c
    elif A_SIGNED:
        return tl.inline_asm_elementwise("dp4a.s32.s32 $0, $1, $2, $3;", "=r,r,r,r",
                                         [a, b, c], dtype=tl.int32, is_pure=True, pack=1)
    else:
        return tl.inline_asm_elementwise("dp4a.u32.s32 $0, $1, $2, $3;", "=r,r,r,r",
                                         [a, b, c], dtype=tl.int32, is_pure=True, pack=1)


def byte_words(table) -> tuple[int, ...]:
    """Bytes (0..255 each, a multiple of 4 of them) as int32 words, byte k in byte k % 4 of
    word k // 4: a table as registers for PRMT lookups."""
    words = (sum(int(table[4 * w + i]) << (8 * i) for i in range(4)) for w in range(len(table) // 4))
    return tuple(w - (1 << 32) if w >= 1 << 31 else w for w in words)  # as int32


def lookup16_words(values) -> tuple[int, ...]:
    """A table of 16 small integers as lookup16_bytes takes it: 4 int32 words of its bytes,
    value + 128 each as an unsigned byte."""
    assert len(values) == 16 and all(-128 <= int(v) < 128 for v in values)
    return byte_words([(int(v) + 128) & 0xFF for v in values])


def int8_words(values) -> tuple[int, ...]:
    """A table of 16 int8 values as 4 int32 words of their bytes (value k in byte k % 4 of
    word k // 4), for lookup16_nibbles_int8."""
    assert len(values) == 16 and all(-128 <= int(v) < 128 for v in values)
    return byte_words([int(v) & 0xFF for v in values])


# A word's 8 nibble codes ($2: byte b's low nibble, then its high one) -> their values in a
# 16-entry int8 table (4 registers of its bytes, $3..$6) as signed bytes for DP4A: the low
# nibbles' in $0, the high ones' in $1, each in byte order. Each half of 4 codes is looked up
# by two PRMTs (codes 0-7 in the table's first two words, 8-15 in its last two; bit 3 of a
# PRMT selector would replicate a sign instead, so it is masked off), a third picks by bit 3,
# two more put the low and the high nibbles' values apart (llama.cpp's
# get_int_from_table_16 does the same): 13 instructions for 8 weights
LOOKUP16_NIBBLES_INT8_PTX = tl.constexpr(
    "{ .reg .b32 q, s, l, h, a, b; "
    "and.b32 q, $2, 0x77777777; shr.u32 s, $2, 1; and.b32 s, s, 0x44444444; or.b32 s, s, 0x32103210; "
    "prmt.b32 l, $3, $4, q; prmt.b32 h, $5, $6, q; prmt.b32 a, l, h, s; "
    "shr.u32 q, q, 16; shr.u32 s, s, 16; "
    "prmt.b32 l, $3, $4, q; prmt.b32 h, $5, $6, q; prmt.b32 b, l, h, s; "
    "prmt.b32 $0, a, b, 0x6420; prmt.b32 $1, a, b, 0x7531; }")


@triton.jit
def lookup16_nibbles_int8(w, TABLE, T0: tl.constexpr, T1: tl.constexpr, T2: tl.constexpr,
                          T3: tl.constexpr, Z):
    """int32 words of 8 nibble codes each -> (low nibbles' values, high nibbles' values), int32
    words of 4 signed bytes each (LOOKUP16_NIBBLES_INT8_PTX): T0..T3 = int8_words(VALUES);
    TABLE holds VALUES as int32 from word 0, for the interpreter. Z: a zero that keeps the
    table words in registers (opaque_zero)."""
    if INTERPRETED:
        lo = w & 0
        hi = w & 0
        for i in tl.static_range(4):
            vl = tl.load(TABLE.to(tl.pointer_type(tl.int32)) + ((w >> (8 * i)) & 15))
            vh = tl.load(TABLE.to(tl.pointer_type(tl.int32)) + ((w >> (8 * i + 4)) & 15))
            lo |= (vl & 0xFF) << (8 * i)
            hi |= (vh & 0xFF) << (8 * i)
        return lo, hi
    else:
        return tl.inline_asm_elementwise(LOOKUP16_NIBBLES_INT8_PTX, "=r,=r,r,r,r,r,r",
                                         [w, T0 + Z, T1 + Z, T2 + Z, T3 + Z],
                                         dtype=(tl.int32, tl.int32), is_pure=True, pack=1)


@triton.jit
def lookup_run_dot_int8(TABLE, T0: tl.constexpr, T1: tl.constexpr, T2: tl.constexpr,
                        T3: tl.constexpr, P, j, rows, mask, N, XB, COUNT: tl.constexpr, FIRST):
    """sum(table[q] x) as int32 over a run of 16 bytes of nibbles
    (words FIRST..FIRST+3 of a field of COUNT words; byte i: weights i and 16 + i) times
    x[0..31] at XB (int8), the table's values int8 (T0..T3 = int8_words(VALUES)): 8 codes a
    lookup16_nibbles_int8, 4 weights a DP4A."""
    w = words4(P, j, rows, mask, N, COUNT, FIRST)
    xl = x8_words(XB, 0)
    xh = x8_words(XB, 16)
    Z = opaque_zero(N)
    acc = tl.zeros(rows.shape, tl.int32)
    for c in tl.static_range(4):
        lo, hi = lookup16_nibbles_int8(w[c], TABLE, T0, T1, T2, T3, Z)
        acc = dot4(lo, xl[c], acc, A_SIGNED=True)
        acc = dot4(hi, xh[c], acc, A_SIGNED=True)
    return acc


# lookup16_ptx's lookup of 4 codes ($1) in a table given as 4 registers ($2..$5): the two
# halves looked up by two PRMTs, one LOP3 picking by bit 3; the 4 looked-up bytes out ($0)
LOOKUP16_BYTES_PTX = tl.constexpr(
    "{ .reg .b32 s, t, lo, hi, m; "
    "and.b32 s, $1, 0x07070707; shr.u32 t, s, 4; or.b32 s, s, t; "
    "prmt.b32 s, s, s, 0x0020; prmt.b32 lo, $2, $3, s; prmt.b32 hi, $4, $5, s; "
    "shl.b32 m, $1, 4; prmt.b32 m, m, m, 0xBA98; lop3.b32 $0, hi, lo, m, 0xE4; }")


@triton.jit
def lookup16_bytes(codes, TABLE, W0: tl.constexpr, W1: tl.constexpr, W2: tl.constexpr,
                   W3: tl.constexpr, Z):
    """int32 words of 4 codes (bits 0-3 of each byte; the rest ignored) -> int32 words of the
    4 values looked up, each + 128 as an unsigned byte. W0..W3: lookup16_words(VALUES), given
    to the PTX as registers made from the zero Z (row_zero, broadcast to codes' shape): made
    once, where lookup16_ptx's table in the instruction stream costs 4 moves a lookup (some
    120 a K step of IQ4_NL's swapped tile, in the SASS). TABLE holds VALUES as int32 from
    word 0, for the interpreter."""
    if INTERPRETED:
        r = codes * 0
        for k in tl.static_range(4):
            v = tl.load(TABLE.to(tl.pointer_type(tl.int32)) + (shr(codes, 8 * k) & 15))
            r = r | (((v + 128) & 0xFF) << (8 * k))
        return r
    else:
        return tl.inline_asm_elementwise(LOOKUP16_BYTES_PTX, "=r,r,r,r,r,r",
                                         [codes, W0 + Z, W1 + Z, W2 + Z, W3 + Z],
                                         dtype=tl.int32, is_pure=True, pack=1)


def lookup16_bf16_words(values) -> tuple[int, ...]:
    """A table of 16 small integers (|v| < 256: exact in bfloat16) as lookup16_bf16 takes it:
    8 int32 words, the low bytes of the values' bfloat16 bits, then their high bytes."""
    bits = [int(np.array(float(v), np.float32).view(np.uint32)) >> 16 for v in values]
    assert len(bits) == 16 and all(abs(int(v)) < 256 for v in values)
    return byte_words([b & 0xFF for b in bits] + [b >> 8 for b in bits])


# LOOKUP16_BYTES_PTX's lookup in two tables at once, the low ($3..$6) and the high ($7..$10)
# bytes of 16 bfloat16 values, by the same selector and the same pick by bit 3: the 4 codes'
# low bytes out ($0), their high bytes ($1). bfloat16's 7-bit mantissa cannot hold a whole
# byte under its exponent (the trick float16 plays with 1024 + byte), so the table holds the
# bfloat16 values themselves, exact for IQ4's kvalues: 6 instructions for 4 values where the
# whole byte made exact in two pieces (the low 7 bits under the exponent, then less 128 or
# 256 by the top bit) took 3 a pair more (BENCHMARKS.md, "IQ4's kvalues as bfloat16 bits")
LOOKUP16_BF16_PTX = tl.constexpr(
    "{ .reg .b32 s, t, lo, hi, m; "
    "and.b32 s, $2, 0x07070707; shr.u32 t, s, 4; or.b32 s, s, t; prmt.b32 s, s, s, 0x0020; "
    "shl.b32 m, $2, 4; prmt.b32 m, m, m, 0xBA98; "
    "prmt.b32 lo, $3, $4, s; prmt.b32 hi, $5, $6, s; lop3.b32 $0, hi, lo, m, 0xE4; "
    "prmt.b32 lo, $7, $8, s; prmt.b32 hi, $9, $10, s; lop3.b32 $1, hi, lo, m, 0xE4; }")


@triton.jit
def lookup16_bf16(codes, TABLE, L0: tl.constexpr, L1: tl.constexpr, L2: tl.constexpr,
                  L3: tl.constexpr, H0: tl.constexpr, H1: tl.constexpr, H2: tl.constexpr,
                  H3: tl.constexpr, Z):
    """int32 words of 4 codes (bits 0-3 of each byte; the rest ignored) -> two int32 words:
    the low bytes and the high bytes of the 4 values' bfloat16 bits (bf16_pairs_scaled
    interleaves them). L0..H3: lookup16_bf16_words(VALUES), registers made from the zero Z
    (row_zero, broadcast to codes' shape), as lookup16_bytes' table. TABLE holds VALUES as
    int32 from word 0, for the interpreter."""
    if INTERPRETED:
        lo = codes * 0
        hi = codes * 0
        for k in tl.static_range(4):
            v = tl.load(TABLE.to(tl.pointer_type(tl.int32)) + (shr(codes, 8 * k) & 15))
            bits = v.to(tl.float32).to(tl.int32, bitcast=True) >> 16
            lo = lo | ((bits & 0xFF) << (8 * k))
            hi = hi | (((bits >> 8) & 0xFF) << (8 * k))
        return lo, hi
    else:
        return tl.inline_asm_elementwise(
            LOOKUP16_BF16_PTX, "=r,=r,r,r,r,r,r,r,r,r,r",
            [codes, L0 + Z, L1 + Z, L2 + Z, L3 + Z, H0 + Z, H1 + Z, H2 + Z, H3 + Z],
            dtype=(tl.int32, tl.int32), is_pure=True, pack=1)


# bfloat16 pair h of 4 values given as their low bytes ($1) and high bytes ($2): one PRMT
# interleaves them (selector $3: 0x5140 for values 0, 1, 0x7362 for 2, 3), then times the
# scale pair ($4) plus -0.0 (a product's sign and zero kept), rounded once
BF16_PAIR_SCALED_PTX = tl.constexpr(
    "{ .reg .b32 t, nz; mov.b32 nz, 0x80008000; prmt.b32 t, $1, $2, $3; "
    "fma.rn.bf16x2 $0, t, $4, nz; }")


@triton.jit
def bf16_pairs_scaled(lo, hi, Z, scales):
    """lookup16_bf16's words of low and high bytes, int32 [R, n] each -> int32 [R, n, 2]:
    pair h of each 4 values (values 2h and 2h + 1) as bfloat16 halves times `scales`
    (bfloat16 pairs, int32 [R, n, 2] or ones that broadcast to it), rounded once. Z:
    row_zero, [R, 1]."""
    h = tl.arange(0, 2)[None, None, :]
    if INTERPRETED:  # the values, then the bfloat16 product the PTX makes
        lo_h = shr(lo[:, :, None], 16 * h)
        hi_h = shr(hi[:, :, None], 16 * h)
        v0 = ((lo_h & 0xFF) | ((hi_h & 0xFF) << 8)).to(tl.int16).to(tl.bfloat16, bitcast=True)
        v1 = (((lo_h >> 8) & 0xFF) | (hi_h & 0xFF00)).to(tl.int16).to(tl.bfloat16, bitcast=True)
        p0 = v0 * scales.to(tl.int16).to(tl.bfloat16, bitcast=True)
        p1 = v1 * shr(scales, 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
        return (p0.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF) \
            | (p1.to(tl.int16, bitcast=True).to(tl.int32) << 16)
    else:
        return tl.inline_asm_elementwise(
            BF16_PAIR_SCALED_PTX, "=r,r,r,r,r",
            [lo[:, :, None], hi[:, :, None], 0x5140 + 0x2222 * h + Z[:, :, None], scales],
            dtype=tl.int32, is_pure=True, pack=1)


def lookup16_ptx(values, f16: bool = False, high: bool = False, bf16: bool = False) -> str:
    """PTX for `lookup16` (float32) and `lookup16_half` (float16 with f16, bfloat16 with
    bf16): 4 codes (0..15, one a byte of the input register) -> values[code], for a table of
    16 small integers (IQ4's kvalues, E2M1's doubled values). The table is 4 words of its
    bytes, each XOR 0x80 (value + 128 as an unsigned byte): two PRMTs look 4 codes up in its
    halves, a LOP3 picks by bit 3 (the way llama.cpp's get_int_from_table_16 looks up,
    without its int8 dot). As float32 the words are in the instruction stream ($0..$3 out,
    input $4): one PRMT per code puts its byte under a float32's exponent, 0x4B0000XX =
    2**23 + XX, and one FADD takes 2**23 + 128 off, exactly: 17 instructions for 4 weights,
    where a gather costs a shared-memory store, a barrier and a load per weight. As float16
    ($0, $1, two each, input $2) the words come in as registers, $3, $7, $11, $15
    (lookup16_half: its pack of 4 codes gives each 32-bit operand 4 registers, all one
    value): one PRMT puts a pair of bytes under float16's exponent of 1024 (0x64XX 0x64YY)
    and one HSUB2 takes 1152 off both. Only bits 0-3 of each byte are read (bit 3 through a
    shift by 4), so a byte of two packed nibbles is looked up by its low one as it is; with
    `high`, by its high one (bits 4-6 shifted down, bit 7 in place): the nibbles need no
    unpacking beforehand, which Triton does byte by byte (four instructions a byte, seen in
    the SASS). As bfloat16 (the same outputs and input as float16), whose 7-bit mantissa
    cannot hold a byte under its exponent: the table is the low bytes of the values'
    bfloat16 bits ($3, $7, $11, $15), and a second table of their high bytes ($19, $23, $27,
    $31: lookup16_bf16_words) is looked up by the same selectors (two PRMTs and a LOP3 more),
    two PRMTs interleaving them into pairs."""
    table = [(int(v) + 128) & 0xFF for v in values]
    assert len(table) == 16 and all(-128 <= int(v) < 128 for v in values)
    words = [sum(table[4 * w + i] << (8 * i) for i in range(4)) for w in range(4)]
    codes = "$2" if f16 or bf16 else "$4"
    if f16 or bf16:  # lookup16_half's operands
        words_in = "".join(f"mov.b32 a{i}, ${3 + 4 * i}; " for i in range(4))
    else:
        words_in = "".join(f"mov.b32 a{i}, {words[i]:#010x}; " for i in range(4))
    if bf16:
        consts = "".join(f"mov.b32 b{i}, ${19 + 4 * i}; " for i in range(4))
        convert = ("prmt.b32 lo, b0, b1, s; prmt.b32 hi, b2, b3, s; lop3.b32 t, hi, lo, m, 0xE4; "
                   "prmt.b32 $0, r, t, 0x5140; prmt.b32 $1, r, t, 0x7362; ")
    elif f16:
        consts = "mov.b32 c, 0x00000064; mov.b32 k, 0x64806480; "
        convert = ("prmt.b32 t, r, c, 0x4140; sub.f16x2 $0, t, k; "
                   "prmt.b32 t, r, c, 0x4342; sub.f16x2 $1, t, k; ")
    else:
        consts = "mov.b32 c, 0x4B000000; "
        convert = "".join(f"prmt.b32 t, r, c, 0x765{k}; sub.f32 ${k}, t, 0f4B000080; " for k in range(4))
    # the low 3 bits of the 4 codes (the selector nibbles), and bit 3 of each code
    # replicated over its byte (which half of the table)
    if high:
        select = f"shr.u32 s, {codes}, 4; and.b32 s, s, 0x07070707; "
        half = f"prmt.b32 m, {codes}, {codes}, 0xBA98; "
    else:
        select = f"and.b32 s, {codes}, 0x07070707; "
        half = f"shl.b32 m, {codes}, 4; prmt.b32 m, m, m, 0xBA98; "
    return ("{ .reg .b32 s, t, lo, hi, m, r, a0, a1, a2, a3, b0, b1, b2, b3, c, k; "
            + words_in + consts + select +
            "shr.u32 t, s, 4; or.b32 s, s, t; "
            "prmt.b32 s, s, s, 0x0020; prmt.b32 lo, a0, a1, s; prmt.b32 hi, a2, a3, s; "
            + half + "lop3.b32 r, hi, lo, m, 0xE4; " + convert + "}")


@triton.jit
def lookup16_nibbles(b, TABLE, PTX_LOW: tl.constexpr, PTX_HIGH: tl.constexpr, DT: tl.constexpr, Z,
                     T0: tl.constexpr, T1: tl.constexpr, T2: tl.constexpr, T3: tl.constexpr,
                     T4: tl.constexpr = 0, T5: tl.constexpr = 0, T6: tl.constexpr = 0,
                     T7: tl.constexpr = 0):
    """Both nibbles of every byte looked up (lookup16_half), straight from the packed bytes:
    uint8 [R, n] -> DT [R, 2n] in *nibble-group order*: for each 4 bytes, the values of their
    4 low nibbles, then of their 4 high ones. That is the order the lookups leave in
    registers (a lookup takes 4 bytes a register): ggml's order (all low nibbles, then all
    high ones) would cost a shuffle of every value, so the GEMM reads x in this order instead
    (tile_columns). PTX_LOW and PTX_HIGH: lookup16_half's PTX for DT, and the same with
    high=True; Z and T0..T7 as lookup16_half takes them (Z [R, 1, 1])."""
    R: tl.constexpr = b.shape[0]
    G: tl.constexpr = b.shape[1] // 4
    b4 = tl.reshape(b, (R, G, 4))
    if INTERPRETED:
        b4_low = b4 & 0x0F
        b4_high = b4 >> 4
    else:
        b4_low = b4
        b4_high = b4
    low = lookup16_half(b4_low, TABLE, PTX_LOW, DT, Z, T0, T1, T2, T3, T4, T5, T6, T7)
    high = lookup16_half(b4_high, TABLE, PTX_HIGH, DT, Z, T0, T1, T2, T3, T4, T5, T6, T7)
    return tl.reshape(tl.permute(tl.join(low, high), (0, 1, 3, 2)), (R, 8 * G))


@triton.jit
def tile_columns(BLOCK: tl.constexpr, RUN: tl.constexpr):
    """The column of x (within a block) that each column of a dequant function's tile
    multiplies: in order, or with RUN > 0 the nibble-group order of lookup16_nibbles for a
    block whose nibbles come in runs of RUN bytes (a run's low nibbles are weights 2*RUN*r + i,
    its high ones 2*RUN*r + RUN + i): for RUN = 16, 0-3, 16-19, 4-7, 20-23, ... x is read in
    that order at no cost; only its loads narrow to 4 elements. RUN = -1: the fragment order
    of fragment_order_32 or fragment_order_256, by BLOCK (registry.py); x's loads narrow to
    pairs of elements there. RUN = -2: the fragment order of Q2_K's 2-bit fields. RUN = -3:
    the fragment order of 8-weight grid rows, thread c (k = 2c, 2c + 1, 2c + 8, 2c + 9 of
    each 16) taking row c of each 32 weights. RUN = -4: TQ1_0's (formats_other.tq1_0_half)."""
    c = tl.arange(0, BLOCK)
    if RUN == -4:  # TQ1_0's fragment order (formats_other.tq1_0_half): thread t, word s, slot k
        t = (c // 2) % 4
        s = c // 64
        k = (c // 16) % 4
        a = s // 2  # (arithmetic, not tl.where: x's loads keep their pairs)
        b = s // 3
        c = ((1 - a) * (32 * k + 8 * t + 4 * s) + (a - b) * (160 + 16 * k + 4 * t)
             + b * (128 + 8 * t + 4 * k + (k // 2) * (64 + 12 * k - 4 * t))
             + 2 * ((c // 8) % 2) + c % 2)
    elif RUN == -1 and BLOCK == 256:  # fragment order (fragment_order_256)
        c = (64 * ((c // 2) % 4) + 32 * ((c // 8) % 2) + 4 * (c // 32) + 2 * ((c // 16) % 2)
             + c % 2)
    elif RUN == -3:  # 8-weight rows' fragment order (formats_iquants.signed_grid8_f16)
        c = 32 * (c // 32) + 8 * ((c // 2) % 4) + 4 * ((c // 16) % 2) + 2 * ((c // 8) % 2) + c % 2
    elif RUN == -2:  # 2-bit fragment order (formats_kquants.q2_k_f16): thread t, word i, field k
        t = (c // 2) % 4
        g = c // 16  # 4i + k
        c = 128 * (t // 2) + 32 * (g % 4) + 16 * (t % 2) + 4 * (g // 4) + 2 * ((c // 8) % 2) + c % 2
    elif RUN < 0:  # fragment order of a 32-weight block (fragment_order_32)
        c = 16 * (c // 16) + 4 * ((c // 2) % 4) + 2 * ((c // 8) % 2) + c % 2
    elif RUN > 0:
        g4 = 4 * (c // 8)
        c = 2 * RUN * (g4 // RUN) + g4 % RUN + RUN * ((c // 4) % 2) + c % 4
    return c


@triton.jit
def lookup16(codes, TABLE, PTX: tl.constexpr):
    """VALUES[code] for uint8 codes 0..15 (any shape whose last dimension is a multiple of
    4), as float32 (exact: the values are small integers): `PTX` is lookup16_ptx(VALUES), and
    TABLE holds VALUES as int32 from word 0, for the interpreter, which cannot run PTX and
    reads them from there."""
    if INTERPRETED:
        return tl.load(TABLE.to(tl.pointer_type(tl.int32)) + codes.to(tl.int32)).to(tl.float32)
    else:  # 4 codes a register in, 4 float32 registers out
        return tl.inline_asm_elementwise(PTX, "=r,=r,=r,=r,r", [codes], dtype=tl.float32,
                                         is_pure=True, pack=4)


@triton.jit
def lookup16_half(codes, TABLE, PTX: tl.constexpr, DT: tl.constexpr, Z,
                  T0: tl.constexpr, T1: tl.constexpr, T2: tl.constexpr, T3: tl.constexpr,
                  T4: tl.constexpr = 0, T5: tl.constexpr = 0, T6: tl.constexpr = 0,
                  T7: tl.constexpr = 0):
    """lookup16 as float16 or bfloat16 (DT): PTX is lookup16_ptx(VALUES, f16=True) or
    lookup16_ptx(VALUES, bf16=True), whose table words come in as registers made from the
    zero Z (row_zero, broadcast to codes' shape), as lookup16_bytes' do: T0..T3 =
    lookup16_words(VALUES) for float16, T0..T7 = lookup16_bf16_words(VALUES) for bfloat16.
    In the instruction stream ptxas kept them in uniform registers and copied them into
    vector ones for every lookup (IQ4_XS's BM = 64 tile, bfloat16 x: 116 copies a K step)."""
    if INTERPRETED:
        return tl.load(TABLE.to(tl.pointer_type(tl.int32)) + codes.to(tl.int32)).to(DT)
    elif DT == tl.bfloat16:  # 4 codes a register in; 2 registers of 2 bfloat16 out
        return tl.inline_asm_elementwise(
            PTX, "=r,=r,r" + ",r" * 32,
            [codes, T0 + Z, T1 + Z, T2 + Z, T3 + Z, T4 + Z, T5 + Z, T6 + Z, T7 + Z],
            dtype=tl.bfloat16, is_pure=True, pack=4)
    else:  # the same, float16
        return tl.inline_asm_elementwise(PTX, "=r,=r,r" + ",r" * 16, [codes, T0 + Z, T1 + Z, T2 + Z, T3 + Z],
                                         dtype=tl.float16, is_pure=True, pack=4)


@triton.jit
def dot4_2bit(acc, w0, w1, w2, w3, XB, AT: tl.constexpr, K: tl.constexpr):
    """acc + the 2-bit fields at bit 2K of each byte of words w0..w3 (16 weights, byte b of
    word c weight 4c + b), each times 4**K where it lies, times x[AT..AT+15] (int8): 4 DP4A
    and 4 masks, no shift. The 4**K is the caller's to take out, once per x scale."""
    x0, x1, x2, x3 = x8_words(XB, AT)
    if K < 3:
        MASK: tl.constexpr = 0x03030303 << (2 * K)
    else:
        MASK: tl.constexpr = 0xC0C0C0C0 - (1 << 32)  # as the int32 it is
    acc = dot4(w0 & MASK, x0, acc)
    acc = dot4(w1 & MASK, x1, acc)
    acc = dot4(w2 & MASK, x2, acc)
    return dot4(w3 & MASK, x3, acc)


@triton.jit
def x8_words(XB, AT: tl.constexpr):
    """x[AT..AT+15] of the block at XB (prepare_x_q8_kernel's int8 x) as four int32 words,
    4 values each (one 16-byte load, the same address in every lane)."""
    return scalars4(tl.load(XB.to(tl.pointer_type(tl.int32)) + AT // 4 + tl.arange(0, 4)))


ROW_ZERO_PTX = tl.constexpr("shr.s32 $0, $1, 31;")


@triton.jit
def row_zero(rows):
    """0 in each element of `rows` (int32, none negative), in a form neither LLVM nor ptxas
    can fold: a per-thread value. opaque_zero's is uniform, and where registers are scarce
    ptxas keeps the constants made from it in uniform registers, copying one into a vector
    register before each LOP3 that needs two (seen in the swapped K-quant tiles: some 70
    copies a step); made from this one, they stay in vector registers."""
    if INTERPRETED:
        return rows >> 31
    else:
        return tl.inline_asm_elementwise(ROW_ZERO_PTX, "=r,r", [rows], dtype=tl.int32,
                                         is_pure=True, pack=1)


@triton.jit
def x8_scale(XB, BLOCK: tl.constexpr, AT: tl.constexpr):
    """The float32 scale of x[AT..AT+31]'s int8 values (AT a multiple of 32)."""
    return tl.load((XB + BLOCK).to(tl.pointer_type(tl.float32)) + AT // 32)


@triton.jit
def opaque_zero(N):
    """0, for N >= 0, in a form the compilers cannot fold. A LOP3 takes one immediate and an
    FFMA one, and `(w & mask) | magic` and `v * scale - offset` have two each: as literals,
    ptxas rematerializes one of them before every instruction (a MOV per weight, seen in
    the SASS); offset by this zero, they are computed once, outside the loop, and stay in
    registers."""
    return N >> 31


@triton.jit
def shr(w, K: tl.constexpr):
    """w >> K, logical (zeros in from the top): int32 >> is arithmetic, and ptxas spends a
    sign extension (SGXT) on it before a mask."""
    return (w.to(tl.uint32, bitcast=True) >> K).to(tl.int32, bitcast=True)


@triton.jit
def bits_at(w, P: tl.constexpr, WIDTH: tl.constexpr, AT: tl.constexpr):
    """((w >> P) & (2**WIDTH - 1)) << AT, by one shift (none when P == AT) and one mask: a
    field put where a table row number wants it, ready to OR with the row number's other
    fields."""
    if AT >= P:
        v = w << (AT - P)
    else:
        v = shr(w, P - AT)
    return v & (((1 << WIDTH) - 1) << AT)


@triton.jit
def field_value(w, P: tl.constexpr, WIDTH: tl.constexpr, OFFSET: tl.constexpr, Z):
    """((w >> P) & (2**WIDTH - 1)) - OFFSET, exact, as float32 [len(w)]; Z: opaque_zero()."""
    if P + WIDTH > 23:
        w = shr(w, 16)
        E: tl.constexpr = P - 16
    else:
        E: tl.constexpr = P
    # 2**23 + field * 2**E, exactly: the field in place in the mantissa
    v = ((w & ((((1 << WIDTH) - 1) << E) + Z)) | (0x4B000000 + Z)).to(tl.float32, bitcast=True)
    # (2**(23-E) + field) - (2**(23-E) + OFFSET): one FFMA, the result exact
    return v * (1.0 / (1 << E)) - ((1 << (23 - E)) + OFFSET + Z).to(tl.float32)


@triton.jit
def mac4(acc, w, XB, AT: tl.constexpr, P: tl.constexpr, STEP: tl.constexpr,
         WIDTH: tl.constexpr, OFFSET: tl.constexpr, Z):
    """acc + four WIDTH-bit fields of word w, at bits P, P + STEP, P + 2 STEP, P + 3 STEP,
    less OFFSET, times x[AT..AT+3]."""
    x0, x1, x2, x3 = x4(XB, AT)
    acc += field_value(w, P, WIDTH, OFFSET, Z) * x0
    acc += field_value(w, P + STEP, WIDTH, OFFSET, Z) * x1
    acc += field_value(w, P + 2 * STEP, WIDTH, OFFSET, Z) * x2
    acc += field_value(w, P + 3 * STEP, WIDTH, OFFSET, Z) * x3
    return acc


@triton.jit
def mac_nibbles(low, high, w, XB, LOW: tl.constexpr, HIGH: tl.constexpr,
                OFFSET: tl.constexpr, Z):
    """The 8 nibbles of word w (4 bytes) less OFFSET times their x: byte b's low nibble
    multiplies x[LOW + b] into `low`, its high nibble x[HIGH + b] into `high` (ggml's split
    of a run of bytes into two runs of weights). The three nibbles above bit 19 are read
    from w >> 16: one shift for all of them."""
    t = shr(w, 16)
    x0, x1, x2, x3 = x4(XB, LOW)
    low += field_value(w, 0, 4, OFFSET, Z) * x0
    low += field_value(w, 8, 4, OFFSET, Z) * x1
    low += field_value(w, 16, 4, OFFSET, Z) * x2
    low += field_value(t, 8, 4, OFFSET, Z) * x3
    x0, x1, x2, x3 = x4(XB, HIGH)
    high += field_value(w, 4, 4, OFFSET, Z) * x0
    high += field_value(w, 12, 4, OFFSET, Z) * x1
    high += field_value(t, 4, 4, OFFSET, Z) * x2
    high += field_value(t, 12, 4, OFFSET, Z) * x3
    return low, high


@triton.jit
def mac_bytes(acc, w, XB, AT: tl.constexpr, OFFSET: tl.constexpr, Z):
    """acc + the 4 bytes of word w less OFFSET times x[AT..AT+3]."""
    return mac4(acc, w, XB, AT, 0, 8, 8, OFFSET, Z)


@triton.jit
def spread4(t):
    """Bits 0..3 of t to bits 4, 12, 20 and 28 (above each byte's low nibble): the four
    shifted copies a multiply makes do not overlap, and the mask keeps one bit of each."""
    return ((t & 0xF) * 0x02040810) & 0x10101010


@triton.jit
def row_u16(P, j, rows, mask, N):
    """A 16-bit field (one per block) as int32 [len(rows)], in the GEMV's layout."""
    ptr = P.to(tl.pointer_type(tl.uint16)) + (j * N + rows).to(tl.int64)
    return row_load(ptr, mask, 0).to(tl.int32)


@triton.jit
def row_u8(P, j, rows, mask, N):
    """An 8-bit field (one per block) as int32 [len(rows)], in the GEMV's layout."""
    ptr = P.to(tl.pointer_type(tl.uint8)) + (j * N + rows).to(tl.int64)
    return row_load(ptr, mask, 0).to(tl.int32)


def bf16_pair_words(values: np.ndarray) -> np.ndarray:
    """Host side of bf16_pair: float32 values (each exact in bfloat16) as bfloat16 halves, two
    to an int32 word, the first in the low half: the lookup tables of the GEMV."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    assert not (bits & 0xFFFF).any()  # exact: bfloat16 is the top half of float32
    return (bits >> 16).astype(np.uint16).view("<i4").reshape(-1).astype(np.int32)


@triton.jit
def bf16_pair(w):
    """The two bfloat16 values of word w (low half first) as float32 [R]: one shift or one
    mask each (a bfloat16 is the top half of its float32). Kept in 32-bit integers: as
    16-bit values, LLVM packs the halves of two rows into one register (a PRMT each)."""
    lo = (w << 16).to(tl.float32, bitcast=True)
    hi = (w & -65536).to(tl.float32, bitcast=True)
    return lo, hi


