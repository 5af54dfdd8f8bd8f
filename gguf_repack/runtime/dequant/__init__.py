"""The torch backend's dequantizers: one function per GGML type, over rp1 planes.

Each function takes the planes of M blocks, flattened to [M, count] in their plane dtypes
(float16 scales as float16, byte fields as int32 words: `.view(torch.uint8)` gives the
block's bytes back in order), and returns float32 [M, block_size]. It must equal
`gguf.quants.dequantize` bit for bit, so it does the same float32 operations in the same
order as gguf-py (llama.cpp's Python reference); any vectorized PyTorch is fine otherwise.

`dequantize_planes` does the layout: planes [E..., B, N, count] -> weights [E..., N, K].
Adding a type: write its function in the family's module and decorate it with `@register`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from gguf_repack.format.type_table import TYPES_BY_NAME, GGMLType

Planes = dict[str, torch.Tensor]
Dequantizer = Callable[[Planes], torch.Tensor]

DEQUANTIZERS: dict[str, Dequantizer] = {}


def register(type_name: str) -> Callable[[Dequantizer], Dequantizer]:
    assert type_name in TYPES_BY_NAME, type_name

    def wrap(fn: Dequantizer) -> Dequantizer:
        assert type_name not in DEQUANTIZERS, type_name
        DEQUANTIZERS[type_name] = fn
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
    rows = {name: p.transpose(-2, -3).reshape(-1, p.shape[-1]) for name, p in planes.items()}
    m, device = n * b * _prod(lead), planes[qtype.fields[0].name].device
    if device.type != "cpu":
        out = fn(rows)
    else:
        # numpy asks the kernel for huge pages for a large array; torch's allocator does not
        # (unless THP_MEM_ALLOC_ENABLE is set before its first allocation).
        out = torch.from_numpy(np.empty((m, qtype.block_size), np.float32))
        step = max(1, CPU_CHUNK_BYTES // (4 * qtype.block_size))
        for i in range(0, m, step):
            out[i : i + step] = fn({name: r[i : i + step] for name, r in rows.items()})
    assert out.dtype == torch.float32 and out.shape == (m, qtype.block_size)
    return out.view(*lead, n, b * qtype.block_size)


def _prod(dims) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def _load_families() -> None:
    # Each module registers its types on import.
    from . import iquants, kquants, legacy, microscaling, ternary  # noqa: F401


_load_families()
