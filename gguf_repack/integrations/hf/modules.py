"""torch.nn modules whose weight stays quantized: QuantLinear and QuantEmbedding.

The rp1 planes are registered as (non-persistent) buffers, so `model.to(device)`, `.buffers()`
and memory accounting see them like any other tensor; the QTensor is rebuilt from them on each
call, which costs nothing (it is a dict of the same tensors).
"""

from __future__ import annotations

import torch
from torch import nn

from gguf_repack.runtime.qtensor import QTensor

_PREFIX = "plane_"


class _HoldsQTensor(nn.Module):
    def _hold(self, weight: QTensor, backend: str) -> None:
        self.qtype, self.weight_shape, self.backend = weight.qtype, tuple(weight.shape), backend
        for field, plane in weight.planes.items():
            self.register_buffer(_PREFIX + field, plane, persistent=False)

    @property
    def qweight(self) -> QTensor:
        planes = {f.name: getattr(self, _PREFIX + f.name) for f in self.qtype.fields}
        return QTensor(self.qtype, self.weight_shape, planes)


class QuantLinear(_HoldsQTensor):
    """`nn.Linear` over a quantized weight of shape (out_features, in_features):
    y = x @ W.T (+ bias), accumulated in float32, returned in x's dtype."""

    def __init__(self, weight: QTensor, bias: torch.Tensor | None = None, backend: str = "auto"):
        super().__init__()
        if len(weight.shape) != 2:
            raise ValueError(f"QuantLinear needs a 2-D weight, got {list(weight.shape)}")
        self.out_features, self.in_features = weight.shape
        self._hold(weight, backend)
        self.register_parameter("bias", None if bias is None else nn.Parameter(bias, requires_grad=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.qweight.matmul(x, backend=self.backend)
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"qtype={self.qtype.name}, bias={self.bias is not None}")


class QuantEmbedding(_HoldsQTensor):
    """`nn.Embedding` over a quantized table of shape (num_embeddings, embedding_dim). `scale`
    keeps a scaled embedding's factor (Gemma's sqrt(hidden_size)), applied the way the module
    it replaces applies it: after the lookup, in the output dtype."""

    def __init__(self, weight: QTensor, dtype: torch.dtype = torch.float32,
                 scale: torch.Tensor | None = None, backend: str = "auto"):
        super().__init__()
        self.num_embeddings, self.embedding_dim = weight.shape
        self.dtype = dtype
        self._hold(weight, backend)
        self.register_buffer("embed_scale", scale, persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out = self.qweight.embedding(ids, self.dtype, backend=self.backend)
        return out if self.embed_scale is None else out * self.embed_scale.to(self.dtype)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, qtype={self.qtype.name}"
