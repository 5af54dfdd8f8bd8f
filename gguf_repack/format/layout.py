"""Layout rp1: GGUF's array of blocks, re-tiled as one plane per block field.

A quantized tensor of torch shape (E..., N, K) with B = K / block_size blocks per row is, in
GGUF, the bytes [E..., N, B, type_size]. rp1 stores each field f of the block as the plane
[E..., B, N, count_f] in the field's plane dtype: for one block column b, field f of every
row lies in one contiguous run, so a GPU tile of rows at column b reads each field with
coalesced, aligned vector loads, and scales lie apart from quants.

The layout is a permutation of bytes: no bit changes, nothing is reordered inside a word.
`pack` and `unpack` are exact inverses; a test checks that on every type. Row operations
(permutation, a split along N) are an index on dim -2 of every plane; a split along K is a
slice of dim -3, on block boundaries only.
"""

from __future__ import annotations

import numpy as np

from .type_table import GGMLType

LAYOUT = "rp1"


def as_rows(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Torch shape (E..., N, K) of a tensor, as the layout sees it: a 1-D tensor (K,) is one
    row, (1, K). The one place this rule lives; the backends pass the result to the kernels."""
    return (1, *shape) if len(shape) == 1 else tuple(shape)


def blocks_shape(shape: tuple[int, ...], qtype: GGMLType) -> tuple[int, ...]:
    """GGUF byte shape [E..., N, B, type_size] of a tensor of torch shape (E..., N, K)."""
    *lead, n, k = as_rows(shape)
    return (*lead, n, k // qtype.block_size, qtype.type_size)


def plane_shapes(shape: tuple[int, ...], qtype: GGMLType) -> dict[str, tuple[int, ...]]:
    """rp1 plane shapes [E..., B, N, count] of a tensor of torch shape (E..., N, K)."""
    *lead, n, b, _ = blocks_shape(shape, qtype)
    return {f.name: (*lead, b, n, f.count) for f in qtype.fields}


# Rows re-tiled at a time: about 1 MiB of blocks, so that every field of a tile is copied
# while the tile is still in cache (2-3x faster than one pass per field over the whole array).
TILE_BYTES = 1 << 20


def _field_view(blocks: np.ndarray, f) -> np.ndarray:
    """Field f of every block, [E..., N, B], as opaque f.size-byte items (they copy several
    times faster than unaligned numbers) over the same memory."""
    return blocks[..., f.offset : f.offset + f.size].view(f"V{f.size}")[..., 0]


def pack(blocks: np.ndarray, qtype: GGMLType, out: np.ndarray | None = None
         ) -> dict[str, np.ndarray]:
    """[E..., N, B, type_size] uint8 GGUF blocks -> {field: [E..., B, N, count] plane}.

    `out`, a uint8 buffer of at least blocks.nbytes, holds the planes one after another
    (a caller re-tiling chunk after chunk reuses one buffer: a fresh allocation per chunk
    costs a page fault and a zeroed page per 4 KiB, more than the copy itself)."""
    assert blocks.dtype == np.uint8 and blocks.shape[-1] == qtype.type_size, blocks.shape
    *lead, n, b, _ = blocks.shape
    blocks = np.ascontiguousarray(blocks)
    if out is None:
        planes = {f.name: np.empty((*lead, b, n), f"V{f.size}") for f in qtype.fields}
    else:
        assert out.dtype == np.uint8 and out.nbytes >= blocks.nbytes, (out.dtype, out.nbytes)
        planes, start = {}, 0
        for f in qtype.fields:
            size = blocks.nbytes // qtype.type_size * f.size
            planes[f.name] = out[start : start + size].view(f"V{f.size}").reshape(*lead, b, n)
            start += size
    rows = max(1, TILE_BYTES // max(1, b * qtype.type_size))
    for n0 in range(0, n, rows):
        tile = blocks[..., n0 : n0 + rows, :, :]
        for f in qtype.fields:
            planes[f.name][..., n0 : n0 + rows] = np.swapaxes(_field_view(tile, f), -1, -2)
    return {f.name: planes[f.name].view(f.plane_dtype).reshape(*lead, b, n, f.count)
            for f in qtype.fields}


def unpack(planes: dict[str, np.ndarray], qtype: GGMLType) -> np.ndarray:
    """{field: [E..., B, N, count] plane} -> [E..., N, B, type_size] uint8 GGUF blocks."""
    *lead, b, n, _ = planes[qtype.fields[0].name].shape
    blocks = np.empty((*lead, n, b, qtype.type_size), np.uint8)
    for f in qtype.fields:
        plane = np.ascontiguousarray(planes[f.name]).view(f"V{f.size}")[..., 0]  # [E..., B, N]
        _field_view(blocks, f)[...] = np.swapaxes(plane, -1, -2)
    return blocks
