"""Backends compute with QTensors: "torch" (pure PyTorch over the planes, any device, the
reference) and, with the kernels, "triton". "auto" picks triton on CUDA, torch elsewhere.
"""

from __future__ import annotations

import os

import torch

from gguf_repack.errors import RepackError
from gguf_repack.format.layout import as_rows

from .dequant import dequantize_planes

# Rows of float32 weights dequantized at a time by the torch backend's matmul and
# embedding: a 1 GB quantized tensor never needs its whole float32 copy in memory.
CHUNK_BYTES = 64 << 20

NAMES = ("auto", "torch", "triton")


class TorchBackend:
    name = "torch"

    @staticmethod
    def dequantize(qt, dtype: torch.dtype) -> torch.Tensor:
        out = dequantize_planes(qt.planes, qt.qtype).reshape(qt.shape)
        return out if dtype == torch.float32 else out.to(dtype)

    @classmethod
    def matmul(cls, qt, x: torch.Tensor) -> torch.Tensor:
        n, k = qt.shape
        xf = x.reshape(-1, k).to(torch.float32)
        out = torch.empty(xf.shape[0], n, dtype=torch.float32, device=x.device)
        rows = max(1, CHUNK_BYTES // (4 * k))
        for n0 in range(0, n, rows):
            n1 = min(n, n0 + rows)
            w = dequantize_planes({f: p[..., n0:n1, :] for f, p in qt.planes.items()}, qt.qtype)
            out[:, n0:n1] = xf @ w.T
        return out.reshape(*x.shape[:-1], n).to(x.dtype)

    @classmethod
    def expert_matmul(cls, qt, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Pairs grouped by expert, one 2-D product (bounded memory) per expert chosen."""
        n, k = qt.shape[1:]
        flat_ids = ids.reshape(-1)
        rows = x.reshape(-1, k) if x.dim() == 3 else x.repeat_interleave(ids.shape[1], dim=0)
        out = torch.zeros(flat_ids.numel(), n, dtype=x.dtype, device=x.device)
        order = torch.argsort(flat_ids, stable=True)
        chosen, counts = torch.unique_consecutive(flat_ids[order], return_counts=True)
        start = 0
        for e, count in zip(chosen.tolist(), counts.tolist()):
            picked = order[start:start + count]
            start += count
            if e >= 0:
                out[picked] = cls.matmul(qt.expert(e), rows[picked])
        return out.reshape(*ids.shape, n)

    @staticmethod
    def embedding(qt, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        flat = ids.reshape(-1).to(device=qt.device, dtype=torch.long)
        out = torch.empty(flat.numel(), qt.shape[1], dtype=dtype, device=qt.device)
        rows = max(1, CHUNK_BYTES // (4 * qt.shape[1]))
        for i in range(0, flat.numel(), rows):
            picked = {f: p.index_select(-2, flat[i : i + rows]) for f, p in qt.planes.items()}
            out[i : i + rows] = dequantize_planes(picked, qt.qtype).to(dtype)
        return out.reshape(*ids.shape, qt.shape[1])


class TritonBackend:
    """gguf_repack_kernels (kernels/): CUDA tensors, or CPU ones under TRITON_INTERPRET=1."""

    name = "triton"

    @staticmethod
    def _planes(qt):
        return {k: p.contiguous() for k, p in qt.planes.items()}

    @classmethod
    def dequantize(cls, qt, dtype: torch.dtype) -> torch.Tensor:
        import gguf_repack_kernels as kernels

        return kernels.dequantize(cls._planes(qt), qt.qtype.name, as_rows(qt.shape),
                                  dtype).reshape(qt.shape)

    @classmethod
    def matmul(cls, qt, x: torch.Tensor) -> torch.Tensor:
        import gguf_repack_kernels as kernels

        return kernels.matmul(x, cls._planes(qt), qt.qtype.name, tuple(qt.shape))

    @classmethod
    def expert_matmul(cls, qt, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        import gguf_repack_kernels as kernels

        return kernels.expert_matmul(x, ids, cls._planes(qt), qt.qtype.name, tuple(qt.shape))

    @classmethod
    def embedding(cls, qt, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        import gguf_repack_kernels as kernels

        return kernels.embedding(ids.to(qt.device), cls._planes(qt), qt.qtype.name,
                                 tuple(qt.shape), dtype)


def _triton_usable(device: torch.device) -> str | None:
    """None when the triton backend can run on `device`, else why not."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return "triton is not installed"
    if device.type == "cuda":
        return None
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1":
        return None
    return (f"the Triton kernels run on CUDA tensors, or on CPU ones under Triton's interpreter "
            f"(TRITON_INTERPRET=1 before triton is imported); this tensor is on {device}")


def get(name: str, device: torch.device, type_name: str | None = None):
    """The backend for `name` ("auto", "torch" or "triton") on `device`: auto is triton on
    CUDA (for the types it has kernels for), torch elsewhere."""
    if name not in NAMES:
        raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(NAMES)}")
    if name == "torch":
        return TorchBackend
    if name == "auto":
        if device.type != "cuda" or _triton_usable(device) is not None:
            return TorchBackend
        import gguf_repack_kernels as kernels

        return TritonBackend if type_name in kernels.FORMATS else TorchBackend
    why = _triton_usable(device)
    if why is not None:
        raise RepackError(f"backend 'triton' is not usable here: {why}")
    return TritonBackend
