"""Backends compute with QTensors: "torch" (pure PyTorch over the planes, any device, the
reference) and, with the kernels, "triton". "auto" picks triton on CUDA, torch elsewhere.
"""

from __future__ import annotations

import torch

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

    @staticmethod
    def embedding(qt, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        flat = ids.reshape(-1).to(device=qt.device, dtype=torch.long)
        out = torch.empty(flat.numel(), qt.shape[1], dtype=dtype, device=qt.device)
        rows = max(1, CHUNK_BYTES // (4 * qt.shape[1]))
        for i in range(0, flat.numel(), rows):
            picked = {f: p.index_select(-2, flat[i : i + rows]) for f, p in qt.planes.items()}
            out[i : i + rows] = dequantize_planes(picked, qt.qtype).to(dtype)
        return out.reshape(*ids.shape, qt.shape[1])


def get(name: str, device: torch.device):
    """The backend object for `name` ("auto", "torch" or "triton") on `device`."""
    if name not in NAMES:
        raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(NAMES)}")
    if name == "triton":
        raise NotImplementedError(
            "backend 'triton' is not available yet: the Triton kernels (gguf_repack_kernels) "
            "are not built; use backend='torch'")
    return TorchBackend
