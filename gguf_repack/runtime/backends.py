"""Backends compute with QTensors: "torch" (pure PyTorch over the planes, any device, the
reference) and, with the kernels, "triton". "auto" picks triton on CUDA, torch elsewhere.

The environment variable GGUF_REPACK_BACKEND (auto, torch or triton; unset is auto) decides
what "auto" means, wherever it is asked for: the engines' layers (transformers' QuantLinear,
QuantEmbedding and QuantExperts, loaded with backend="auto"; vLLM's custom ops, whose worker
processes inherit the environment) and QTensor's own default. "torch" keeps the torch backend
on CUDA too; "triton" takes the path a GPU takes on any device: the Triton kernels for the
types that have them, the torch backend for the others. On CPU tensors that is Triton's
interpreter, which TRITON_INTERPRET=1 must select before the kernels are imported (a
RepackError says so otherwise): the GPU's code, end to end, on a machine without one. An
explicit backend="torch" or "triton" is not affected.
"""

from __future__ import annotations

import os
import sys

import torch

from gguf_repack.errors import RepackError
from gguf_repack.format.layout import as_rows

from .dequant import dequantize_planes

# Rows of float32 weights dequantized at a time by the torch backend's matmul and
# embedding: a 1 GB quantized tensor never needs its whole float32 copy in memory.
CHUNK_BYTES = 64 << 20

NAMES = ("auto", "torch", "triton")
ENV = "GGUF_REPACK_BACKEND"  # what "auto" means (module docstring)


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
    def expert_matmul(cls, qt, x: torch.Tensor, ids: torch.Tensor,
                      routed_experts: int | None = None) -> torch.Tensor:
        """Pairs grouped by expert, one 2-D product (bounded memory) per expert chosen (the
        same whatever the model's expert count: `routed_experts` only steers the kernels)."""
        experts, n, k = qt.shape
        flat_ids = ids.reshape(-1)
        if flat_ids.numel() and not ((flat_ids >= -1) & (flat_ids < experts)).all():  # (host reads below)
            raise RepackError(f"expert_matmul: expert ids must be in -1..{experts - 1}")
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
    """gguf_repack_kernels (gguf_repack_kernels/): CUDA tensors, or CPU ones under TRITON_INTERPRET=1."""

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
    def expert_matmul(cls, qt, x: torch.Tensor, ids: torch.Tensor,
                      routed_experts: int | None = None) -> torch.Tensor:
        import gguf_repack_kernels as kernels

        return kernels.expert_matmul(x, ids, cls._planes(qt), qt.qtype.name, tuple(qt.shape), routed_experts)

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
        if _kernels_interpreted() is False:
            return ("the Triton kernels were imported before TRITON_INTERPRET=1 was set, so they "
                    "are compiled for a GPU, not interpreted; set it before anything imports "
                    "triton or gguf_repack_kernels")
        return None
    return (f"the Triton kernels run on CUDA tensors, or on CPU ones under Triton's interpreter "
            f"(TRITON_INTERPRET=1 before triton is imported); this tensor is on {device}")


_interpreted: bool | None = None


def _kernels_interpreted() -> bool | None:
    """Whether the kernels were made for Triton's interpreter (Triton decides it when a kernel
    is defined, from TRITON_INTERPRET then); None while they are not imported yet."""
    global _interpreted
    if _interpreted is None:
        modules = [m for name, m in list(sys.modules.items())
                   if name.startswith("gguf_repack_kernels.") and m is not None]
        if not modules:
            return None
        from triton.runtime.interpreter import InterpretedFunction
        from triton.runtime.jit import JITFunction

        kernels = [v for m in modules for v in vars(m).values()
                   if isinstance(v, (InterpretedFunction, JITFunction))]
        if not kernels:
            return None
        _interpreted = isinstance(kernels[0], InterpretedFunction)
    return _interpreted


def chosen() -> str:
    """What "auto" means in this process: $GGUF_REPACK_BACKEND, auto when unset."""
    name = os.environ.get(ENV, "").strip().lower() or "auto"
    if name not in NAMES:
        raise RepackError(f"{ENV}={os.environ[ENV]!r}: choose one of {', '.join(NAMES)}")
    return name


def get(name: str, device: torch.device, type_name: str | None = None):
    """The backend for `name` ("auto", "torch" or "triton") on `device`: auto is triton on
    CUDA (for the types it has kernels for), torch elsewhere, unless GGUF_REPACK_BACKEND says
    otherwise (module docstring)."""
    if name not in NAMES:
        raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(NAMES)}")
    if name == "torch":
        return TorchBackend
    if name == "auto":
        forced = chosen()
        if forced == "torch":
            return TorchBackend
        if forced == "triton":
            why = _triton_usable(device)
            if why is not None:
                raise RepackError(f"{ENV}=triton: the triton backend is not usable here: {why}")
        elif device.type != "cuda" or _triton_usable(device) is not None:
            return TorchBackend
        import gguf_repack_kernels as kernels

        return TritonBackend if type_name in kernels.FORMATS else TorchBackend
    why = _triton_usable(device)
    if why is not None:
        raise RepackError(f"backend 'triton' is not usable here: {why}")
    return TritonBackend
