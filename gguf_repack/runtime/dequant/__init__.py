"""The torch backend's dequantizers: one function per GGML type, over rp1 planes.

Each function takes the planes of M blocks, flattened to [M, count] in their plane dtypes
(float16 scales as float16, byte fields as int32 words: `.view(torch.uint8)` gives the
block's bytes back in order), and returns float32 [M, block_size]; one registered with
`into=True` is also given that float32 `out` to fill and return (its last operation writes
there, which saves copying every chunk into the output). It must equal
`gguf.quants.dequantize` bit for bit, so it does the same float32 operations in the same
order as gguf-py (llama.cpp's Python reference); any vectorized PyTorch is fine otherwise.

`dequantize_planes` does the layout: planes [E..., B, N, count] -> weights [E..., N, K].
Adding a type: write its function in the family's module and decorate it with `@register`.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import numpy as np
import torch

from gguf_repack.format.type_table import TYPES_BY_NAME, GGMLType

Planes = dict[str, torch.Tensor]
Dequantizer = Callable[..., torch.Tensor]  # fn(planes), or fn(planes, out) if `into`

DEQUANTIZERS: dict[str, Dequantizer] = {}
WRITES_INTO: set[str] = set()  # the types whose function takes `out`


def register(type_name: str, *, into: bool = False) -> Callable[[Dequantizer], Dequantizer]:
    assert type_name in TYPES_BY_NAME, type_name

    def wrap(fn: Dequantizer) -> Dequantizer:
        assert type_name not in DEQUANTIZERS, type_name
        DEQUANTIZERS[type_name] = fn
        if into:
            WRITES_INTO.add(type_name)
        return fn

    return wrap


def dequantizer(qtype: GGMLType) -> Dequantizer:
    try:
        return DEQUANTIZERS[qtype.name]
    except KeyError:
        raise NotImplementedError(
            f"no torch dequantizer for {qtype.name} (gguf-py, the reference, has none either)"
        ) from None


# On the CPU, blocks are dequantized in chunks of about this much float32 into one output:
# a chunk's temporaries stay in cache and their memory is reused, where whole-tensor
# temporaries would each be a fresh allocation whose page faults cost more than the
# arithmetic done in them.
CPU_CHUNK_BYTES = 2 << 20


def dequantize_planes(planes: Planes, qtype: GGMLType) -> torch.Tensor:
    """rp1 planes {field: [E..., B, N, count]} -> float32 weights [E..., N, B * block_size]."""
    fn = dequantizer(qtype)
    *lead, b, n, _ = planes[qtype.fields[0].name].shape
    # Put the (small) planes in row order first, so the (8x larger) float32 result comes out
    # in its final order without another copy.
    rows = {name: _row_order(p) for name, p in planes.items()}
    m, device = n * b * _prod(lead), planes[qtype.fields[0].name].device
    into = qtype.name in WRITES_INTO
    if device.type != "cpu":
        if into:
            out = fn(rows, torch.empty(m, qtype.block_size, device=device))
        else:
            out = fn(rows)
    else:
        # numpy asks the kernel for huge pages for a large array; torch's allocator does not
        # (unless THP_MEM_ALLOC_ENABLE is set before its first allocation).
        out = torch.from_numpy(np.empty((m, qtype.block_size), np.float32))
        step = max(1, CPU_CHUNK_BYTES // (4 * qtype.block_size))
        for i in range(0, m, step):
            chunk = {name: r[i : i + step] for name, r in rows.items()}
            if into:
                fn(chunk, out[i : i + step])
            else:
                out[i : i + step] = fn(chunk)
    assert out.dtype == torch.float32 and out.shape == (m, qtype.block_size)
    return out.view(*lead, n, b * qtype.block_size)


# -- shared unpacking -------------------------------------------------------------------


@cache
def _level_pairs(levels: tuple[float, ...], device: torch.device) -> torch.Tensor:
    """16 levels -> int64 [256]: byte i -> (levels[i & 15], levels[i >> 4]), the two float32
    side by side (the low nibble's first)."""
    t = torch.tensor(levels, dtype=torch.float32)
    i = torch.arange(256)
    return torch.stack([t[i & 15], t[i >> 4]], -1).view(torch.int64).view(-1).to(device)


def nibble_levels(levels: tuple[float, ...], words: torch.Tensor, run: int) -> torch.Tensor:
    """[M, n] int32 words of 4-bit codes -> float32 [M, 8n]: per run of `run` words, the level
    of every byte's low nibble in order, then of every high one (ggml's order).

    Neighbouring codes are looked up in pairs: masks and shifts on whole words put byte 2k's
    nibble and byte 2k+1's into one 8-bit index (a 16-bit lane each) of a table of level
    pairs, which halves the gathers; index_select, torch's fastest gather on the CPU, costs
    about the same per element whatever its width."""
    m = words.shape[0]
    w = words.view(m, -1, 1, run)
    idx = words.new_empty(m, w.shape[1], 2, run)
    lo = w & 0x0F0F0F0F
    torch.bitwise_and(lo | (lo >> 4), 0x00FF00FF, out=idx[:, :, :1])
    hi = (w >> 4) & 0x0F0F0F0F
    torch.bitwise_and(hi | (hi >> 4), 0x00FF00FF, out=idx[:, :, 1:])
    pairs = _level_pairs(levels, words.device).index_select(0, idx.view(torch.int16).view(-1).int())
    return pairs.view(torch.float32).view(m, -1)


_WORDS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _row_order(p: torch.Tensor) -> torch.Tensor:
    """A plane [E..., B, N, count] -> [E... * N * B, count]: each block's field in row order.

    On the CPU a copy that moves `count` elements at a time pays a fixed cost per field; for
    a block of 32 weights that cost, not the bytes, was most of the copy. So each field is
    moved as one element: torch's 2-D transpose (a blocked copy) for a field of 1, 2, 4 or 8
    bytes viewed as one integer, numpy's copy of its fixed-size raw bytes for a wider one
    (torch has no such type). Both move bytes and never look at their values."""
    count = p.shape[-1]
    if p.device.type != "cpu":
        return p.transpose(-2, -3).reshape(-1, count)
    width = count * p.element_size()
    if width in _WORDS:
        word = p.view(_WORDS[width]).squeeze(-1)  # [E..., B, N]
        return word.transpose(-1, -2).contiguous().view(-1).view(p.dtype).view(-1, count)
    a = p.numpy()
    fields = a.view(np.dtype((np.void, width)))  # [E..., B, N, 1]
    rows = np.ascontiguousarray(np.swapaxes(fields, -2, -3)).view(a.dtype)
    return torch.from_numpy(rows).view(-1, count)


def _prod(dims) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def _load_families() -> None:
    # Each module registers its types on import.
    from . import iquants, kquants, legacy, microscaling, ternary  # noqa: F401


_load_families()
