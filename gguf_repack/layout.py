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


def blocks_shape(shape: tuple[int, ...], qtype: GGMLType) -> tuple[int, ...]:
    """GGUF byte shape [E..., N, B, type_size] of a tensor of torch shape (E..., N, K).
    A 1-D tensor is one row (N = 1)."""
    *lead, n, k = (1, *shape) if len(shape) == 1 else shape
    return (*lead, n, k // qtype.block_size, qtype.type_size)


def plane_shapes(shape: tuple[int, ...], qtype: GGMLType) -> dict[str, tuple[int, ...]]:
    """rp1 plane shapes [E..., B, N, count] of a tensor of torch shape (E..., N, K)."""
    *lead, n, b, _ = blocks_shape(shape, qtype)
    return {f.name: (*lead, b, n, f.count) for f in qtype.fields}


def pack(blocks: np.ndarray, qtype: GGMLType) -> dict[str, np.ndarray]:
    """[E..., N, B, type_size] uint8 GGUF blocks -> {field: [E..., B, N, count] plane}."""
    assert blocks.dtype == np.uint8 and blocks.shape[-1] == qtype.type_size, blocks.shape
    records = np.ascontiguousarray(blocks).view(qtype.struct_dtype)[..., 0]  # [E..., N, B]
    return {f.name: np.ascontiguousarray(np.swapaxes(records[f.name], -1, -2))
            .view(f.plane_dtype).reshape(*records.shape[:-2], records.shape[-1],
                                         records.shape[-2], f.count)
            for f in qtype.fields}


def unpack(planes: dict[str, np.ndarray], qtype: GGMLType) -> np.ndarray:
    """{field: [E..., B, N, count] plane} -> [E..., N, B, type_size] uint8 GGUF blocks."""
    first = planes[qtype.fields[0].name]
    *lead, b, n, _ = first.shape
    records = np.empty((*lead, n, b), dtype=qtype.struct_dtype)
    for f in qtype.fields:
        plane = np.ascontiguousarray(planes[f.name]).view(f"V{f.size}")[..., 0]  # [E..., B, N]
        records[f.name] = np.swapaxes(plane, -1, -2)
    return records.view(np.uint8).reshape(*lead, n, b, qtype.type_size)
