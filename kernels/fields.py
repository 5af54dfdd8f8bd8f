"""Triton helpers every type's dequant function uses: reading a field of the rp1 planes
(one contiguous run per row, so a tile reads it with vector loads) and joining tiles in
ggml's weight order. Each loader casts the plane pointer to the element type it reads."""

import triton
import triton.language as tl


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
def field_f16(P, j, rows, mask, N):
    """A float16 scale field as float32 [len(rows), 1]."""
    base = (j * N + rows).to(tl.int64)
    ptr = P.to(tl.pointer_type(tl.float16)) + base
    return tl.load(ptr, mask=mask, other=0.0).to(tl.float32)[:, None]


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
def nibbles(b):
    """uint8 [R, n] -> [R, 2n]: every byte's low nibble, then every high one (ggml's order)."""
    return concat(b & 0x0F, b >> 4)
