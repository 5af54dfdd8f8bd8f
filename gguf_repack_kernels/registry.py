"""One entry per GGML type: its block size, the order of its planes, its Triton dequant
function and (for grid types) a lookup table.

A dequant function has one signature for every type, so every kernel family can call it:

    dq(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N) -> float32 [len(rows), block_size]

P0..P4 are the planes in `fields` order (unused ones are any valid pointer), each laid out
[B, N, count] contiguous, and each cast by the function to the element type it reads (the
launch's pointer types are not relied on); `j` is the block column, `rows` the row indices (any, not only a
contiguous range: the embedding gathers), `mask` which of them are real. The element of
field f for block (j, n) starts at P_f + (j * N + n) * count.

Each type also has a dot function, for the GEMV at M <= 8 (gemv.py's gemv_dot_kernel):

    dot(P0, P1, P2, P3, P4, TABLE, j, rows, mask, N, XB, SB, part, PARTS) -> float32 [len(rows)]

the product of part `part` (of PARTS equal runs of weights, PARTS a constexpr) of block
column j of each row with the same part of x[j * block_size:][:block_size] (XB points at the
block's first element of x made float32, SB at the first of its sums of 16, both by
gemv.py's prepare_x_kernel; for an `x_int8` type XB points at its int8 x and their scales,
see fields.py's "GEMV with int8 x"): the same weights, multiplied straight from the packed fields, with
the scales applied once per sub-block. configs.GEMV_PARTS says how many calls a block takes
(a 256-weight block in parts lets a thread own more rows at the same registers); `dot_parts`
says which PARTS the dot function supports. `dot_rows`, where a type has one, is the dot
function the GEMV takes at more than one row of x a program (gemv.gemv_dot_rows): the same
product, in a form that does more for the weights and less for each row of x, which pays
where the weights' part is done once for all the rows (the compiler's common
subexpressions): the grid types' signed grid bytes (formats_iquants.signed_row8_dot_int8).

A type may have a half-precision dequant function, `dequant_half`, for the fused GEMM with
float16 and bfloat16 x: the same signature and DT, the x dtype (a constexpr: tl.float16 or
tl.bfloat16), last; DT [len(rows), block_size]. In float16 it is computed in float16 (small integers or table
values made float16 exactly by a bit trick, then the scale: one rounding, so the weights are
the float32 ones rounded to float16, as the float32 function and a conversion give them;
where a min is added (Q4_1, Q5_1) or a scale is itself a product (IQ4_XS) the rounding
differs, within the GEMM's tolerance). It spares the GEMM converting every weight to float32
and back, which is most of what it issues at small M. A float16 function that looks its
nibbles up in place (fields.lookup16_nibbles) returns the block's weights in nibble-group
order, not ggml's: `f16_nibble_run` says so (the bytes' runs), and the GEMM reads x in that
order (fields.tile_columns). `f16_nibble_run` = -1 is the fragment order (Q4_K, Q5_0, Q5_1,
IQ4_NL):
the weights ordered so that each thread of an MMA fragment, which holds k = 2c, 2c + 1,
2c + 8 and 2c + 9 of every 16 (c = lane % 4), takes its weights from the c-th quarter of the
block's bytes alone (fields.fragment_order_256, fragment_order_32): it unpacks its own words,
with the scales of its own sub-blocks, and nothing moves between threads or through shared
memory on the way to the tensor cores. -2 and -3 are fragment orders of the same kind for
other unpackings: Q2_K's and Q3_K's 2-bit fields (-2), the grid types' runs of 8 weights,
thread c taking run c of every 32 (-3, formats_iquants.signed_grid8_f16), and TQ1_0's base-3
digits, thread c taking a quarter of each run of bytes (-4, formats_other.tq1_0_half). Where that
function needs more registers than a 64-row tile's accumulator leaves (IQ4_XS's lookups,
Q2_K, the grid types, TQ1_0), `wide_f16` names the one the tiles of BM >= 64 take, with its order
("float32": the type's float32 function; else one taking DT, float16 or bfloat16), but for a
BM = 64 tile over two warpgroups, which has the registers (configs.BM64_TWO_WARPGROUPS).

In bfloat16 (vLLM's default activation dtype) the same function, in the same order, unpacks
under bfloat16's exponent (fields.py: 128 + a value under 128, exactly) and does its
arithmetic in bfloat16. A float16 scale is itself rounded to bfloat16 first (7 mantissa bits
to its 10), so a weight is within two bfloat16 roundings where float16 rounds once
(tests/test_kernels.py holds each type's bound). `half_acts` names the x dtypes the function
takes: not bfloat16 for Q8_0 (its values fill a byte; at the bytes' bound with the float32
function), which takes the float32 function there, as a type does from BM = 64 on with
bfloat16 x where its `wide_f16` is "float32" (IQ4's table values fill a byte too: they are
looked up as their bfloat16 bits, fields.lookup16_bf16; IQ1_S's -1, 0, 1 are made 0, 1, 2).

A type whose one scale a block is all that multiplies its weights (TQ1_0's and TQ2_0's d)
may leave it to the MMA's sum: `scaled_after` = (dequant_half without it, the block's scale
as float32 [len(rows)], both taking DT), which the fused GEMM's BM = 16 tile takes (gemm.py's
BLOCK_SCALE): a block's products summed by the tensor cores, then times each row's scale,
once a block, where the weights took a multiply a pair.

`narrow_f16` stands in for dequant_half in the BM = 16 tile (the same order, dtypes and
values) where a function laid out for that tile alone issues less there than the one the
swapped tiles take: Q3_K's and MXFP4's scale bytes read in 16-bit words there
(formats_kquants.q3_k_half_m16, formats_other.mxfp4_half_m16; configs.NARROW_F16_FROM_TRITON
names the Triton from which), Q2_K's as runs of bytes there and in words in the swapped
tiles (q2_k_half_m16). x's tile is the BM = 16 tile's MMA operand from shared memory, read by
ldmatrix only where the narrowest load behind the weights is 16 bits or more (gemm.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

MAX_PLANES = 5


@dataclass(frozen=True)
class Format:
    name: str
    block_size: int
    fields: tuple[str, ...]
    dequant: object  # a triton JITFunction
    dot: object  # a triton JITFunction for the GEMV (M <= 8), see above
    table: Callable[[torch.device], torch.Tensor] | None = None  # lookup table, per device
    dot_parts: tuple[int, ...] = (1,)  # the PARTS its dot function supports
    x_int8: bool = False  # its dot function multiplies x quantized per 32 to int8
    dequant_half: object = None  # the fused GEMM's dequant for float16 and bfloat16 x, see above
    f16_nibble_run: int = 0  # its columns' order: 0 ggml's, < 0 fragment orders, else nibble groups
    # (function, its f16_nibble_run) for the tiles of BM >= 64, where dequant_half spills there
    wide_f16: tuple[object, int] | None = None
    half_acts: tuple[str, ...] = ("fp16", "bf16")  # the x dtypes dequant_half takes
    # (dequant_half without the block's scale, the scale): the BM = 16 tile's, see above
    scaled_after: tuple[object, object] | None = None
    dot_rows: object = None  # the GEMV's dot function at more than one row of x, see above
    narrow_f16: object = None  # dequant_half's stand-in in the BM = 16 tile, see above

    def gemv_dot(self, x_rows: int):
        """The dot function of the GEMV at x_rows rows of x a program."""
        return self.dot_rows if x_rows > 1 and self.dot_rows is not None else self.dot

    def half_dequant(self, act: str):
        """dequant_half where it takes x of `act` ("fp16", "bf16"), else None."""
        return self.dequant_half if act in self.half_acts else None

    @property
    def x_stride(self) -> int:
        """Elements of prepared x a block takes: float32 values, or int8 values and the
        float32 scale of each 32 (in bytes)."""
        return self.block_size + self.block_size // 8 if self.x_int8 else self.block_size


FORMATS: dict[str, Format] = {}


def register(name: str, block_size: int, fields: tuple[str, ...], *, dot,
             table: Callable[[torch.device], torch.Tensor] | None = None,
             dot_parts: tuple[int, ...] = (1,), x_int8: bool = False, dequant_half=None,
             f16_nibble_run: int = 0, wide_f16: tuple[object, int] | str | None = None,
             half_acts: tuple[str, ...] = ("fp16", "bf16"),
             scaled_after: tuple[object, object] | None = None, dot_rows=None, narrow_f16=None):
    """Decorator for a @triton.jit dequant function (put it above @triton.jit)."""
    assert len(fields) <= MAX_PLANES

    def wrap(fn):
        assert name not in FORMATS, name
        wide = (fn, 0) if wide_f16 == "float32" else wide_f16
        FORMATS[name] = Format(name, block_size, fields, fn, dot, table, dot_parts, x_int8,
                               dequant_half, f16_nibble_run, wide, half_acts, scaled_after,
                               dot_rows, narrow_f16)
        return fn

    return wrap
