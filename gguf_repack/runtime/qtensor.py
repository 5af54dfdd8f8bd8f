"""QTensor: a quantized weight kept in rp1 planes, with the operations an engine needs.

The planes are the only storage: dequantize, matmul and embedding read them directly (the
backend chooses how), and row permutations, tensor-parallel shards and expert slices are
plain indexing of the planes, exact by construction.
"""

from __future__ import annotations

import numpy as np
import torch

from gguf_repack.errors import RepackError
from gguf_repack.format.layout import plane_shapes
from gguf_repack.format.type_table import TYPES_BY_NAME, GGMLType

from . import backends

_TORCH_DTYPES = {np.dtype("<f2"): torch.float16, np.dtype("<f4"): torch.float32,
                 np.dtype("<i4"): torch.int32, np.dtype("<i2"): torch.int16,
                 np.dtype("u1"): torch.uint8}


def plane_torch_dtype(field) -> torch.dtype:
    return _TORCH_DTYPES[field.plane_dtype]


class QTensor:
    """A quantized tensor of torch shape (E..., N, K) in GGML type `qtype`.

    `planes[field]` has shape [E..., K / block_size, N, count] (layout rp1)."""

    def __init__(self, qtype: GGMLType | str, shape, planes: dict[str, torch.Tensor]):
        self.qtype = TYPES_BY_NAME[qtype] if isinstance(qtype, str) else qtype
        self.shape = torch.Size(shape)
        if not self.qtype.is_quantized:
            raise RepackError(f"{self.qtype.name} is not a quantized type")
        expected = plane_shapes(tuple(self.shape), self.qtype)
        if set(planes) != set(expected):
            raise RepackError(f"{self.qtype.name} planes must be {sorted(expected)}, got {sorted(planes)}")
        for f in self.qtype.fields:
            p = planes[f.name]
            if tuple(p.shape) != expected[f.name] or p.dtype != plane_torch_dtype(f):
                raise RepackError(
                    f"{self.qtype.name} plane {f.name!r}: expected {plane_torch_dtype(f)} "
                    f"{list(expected[f.name])}, got {p.dtype} {list(p.shape)}")
        self.planes = {f.name: planes[f.name] for f in self.qtype.fields}

    # -- description -------------------------------------------------------------------
    @property
    def block_size(self) -> int:
        return self.qtype.block_size

    @property
    def device(self) -> torch.device:
        return next(iter(self.planes.values())).device

    @property
    def nbytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.planes.values())

    def __repr__(self) -> str:
        return f"QTensor({self.qtype.name}, shape={list(self.shape)}, device={self.device})"

    def _with(self, shape, planes) -> "QTensor":
        return QTensor(self.qtype, shape, planes)

    def to(self, device) -> "QTensor":
        return self._with(self.shape, {k: p.to(device) for k, p in self.planes.items()})

    # -- math --------------------------------------------------------------------------
    def dequantize(self, dtype: torch.dtype = torch.float32, backend: str = "auto") -> torch.Tensor:
        """The weights, shape `self.shape`. In float32, bit-exact with gguf.quants.dequantize;
        other dtypes are that value rounded once."""
        return backends.get(backend, self.device, self.qtype.name).dequantize(self, dtype)

    def matmul(self, x: torch.Tensor, backend: str = "auto") -> torch.Tensor:
        """x @ W.T for x of shape (..., K): result (..., N) in x's dtype, accumulated in float32."""
        if len(self.shape) != 2:
            raise RepackError(f"matmul needs a 2-D weight, this one is {list(self.shape)}"
                              + (" (use .expert(e))" if len(self.shape) > 2 else ""))
        if x.shape[-1] != self.shape[1]:
            raise RepackError(f"matmul: x has {x.shape[-1]} features, the weight expects {self.shape[1]}")
        return backends.get(backend, self.device, self.qtype.name).matmul(self, x)

    def expert_matmul(self, x: torch.Tensor, expert_ids: torch.Tensor,
                      backend: str = "auto", routed_experts: int | None = None) -> torch.Tensor:
        """Each routed token's product with its experts, for an expert stack W of shape
        (E, N, K): x of shape (T, K) (one input per token, as for gate and up) or (T, k, K) (one
        per token and slot, as for down), `expert_ids` (T, k). Result (T, k, N) in x's dtype,
        accumulated in float32: out[t, j] = x[t (, j)] @ W[expert_ids[t, j]].T. Routing weights
        are the caller's. An id of -1 (an expert of another rank, under expert parallelism)
        gives zeros. Experts no token chose are never read: the torch backend groups the
        tokens by expert, one product per expert chosen; the Triton one sorts them by expert
        into tiles, one launch for all (gguf_repack_kernels.expert_matmul). `routed_experts`:
        the experts the model's router chooses among, where the stack holds fewer (expert
        parallelism); the kernels' path and tile follow the rows an expert gets, which come
        from it. The result does not depend on it."""
        if len(self.shape) != 3:
            raise RepackError(f"expert_matmul needs a 3-D expert stack, this one is {list(self.shape)}")
        experts, n, k = self.shape
        # int32 or int64 as the router gave them (a conversion would be a launch a product)
        ids = expert_ids.to(device=x.device)
        if ids.dtype not in (torch.int32, torch.int64):
            ids = ids.long()
        if ids.dim() != 2 or x.shape[0] != ids.shape[0] or x.dim() not in (2, 3) \
                or (x.dim() == 3 and x.shape[1] != ids.shape[1]) or x.shape[-1] != k:
            raise RepackError(f"expert_matmul: x {list(x.shape)} and expert_ids {list(ids.shape)} do "
                              f"not fit a stack of {experts} experts of [{n}, {k}]")
        if routed_experts is not None and routed_experts < experts:
            raise RepackError(f"expert_matmul: routed_experts {routed_experts} is fewer than the "
                              f"stack's {experts} experts")
        # Each backend refuses an id outside -1..E-1 (the message below): the Triton one on
        # the device, with no host sync (a CUDA graph's capture forbids one), as part of its
        # launches; on a GPU a bad id is then a device-side assert
        try:
            backend_class = backends.get(backend, self.device, self.qtype.name)
            return backend_class.expert_matmul(self, x, ids, routed_experts)
        except RuntimeError as e:  # CPU tensors: raised at once
            if str(e).startswith("expert_matmul: expert ids must be in"):
                raise RepackError(str(e)) from None
            raise

    def embedding(self, ids: torch.Tensor, dtype: torch.dtype = torch.float32,
                  backend: str = "auto") -> torch.Tensor:
        """Rows of W for integer ids of any shape: result ids.shape + (K,)."""
        if len(self.shape) != 2:
            raise RepackError(f"embedding needs a 2-D weight, this one is {list(self.shape)}")
        return backends.get(backend, self.device, self.qtype.name).embedding(self, ids, dtype)

    # -- exact structural operations ---------------------------------------------------
    def index_rows(self, rows: torch.Tensor | list[int]) -> "QTensor":
        """The rows `rows` of W, in that order (a permutation, or any selection)."""
        rows = torch.as_tensor(rows, dtype=torch.long, device=self.device)
        shape = (*self.shape[:-2], len(rows), self.shape[-1])
        return self._with(shape, {k: p.index_select(-2, rows) for k, p in self.planes.items()})

    def index_blocks(self, blocks: torch.Tensor | list[int]) -> "QTensor":
        """W with its columns reordered by whole blocks: block j of each row is block
        `blocks[j]` of W's (a permutation of the K / block_size blocks)."""
        blocks = torch.as_tensor(blocks, dtype=torch.long, device=self.device)
        if sorted(blocks.tolist()) != list(range(self.shape[-1] // self.block_size)):
            raise RepackError(f"index_blocks: not a permutation of the {self.shape[-1] // self.block_size} "
                              f"blocks of a row")
        return self._with(self.shape, {k: p.index_select(-3, blocks) for k, p in self.planes.items()})

    def shard(self, dim: int, rank: int, world_size: int) -> "QTensor":
        """Piece `rank` of `world_size` equal pieces along `dim` (torch order): the rows
        dimension (N, for column parallelism), the last one (K, row parallelism; pieces
        must hold whole blocks), or the experts of a 3-D stack (dim 0, expert parallelism)."""
        ndim = len(self.shape)
        dim = dim + ndim if dim < 0 else dim
        if not 0 <= rank < world_size:
            raise RepackError(f"shard: rank {rank} is not in 0..{world_size - 1}")
        size = self.shape[dim] if 0 <= dim < ndim else None
        if dim == ndim - 1:
            if size % world_size or (size // world_size) % self.block_size:
                raise RepackError(
                    f"shard: K={size} cannot be split {world_size} ways on {self.qtype.name} block "
                    f"boundaries ({self.block_size} weights per block)")
            width = size // world_size // self.block_size
            planes = {k: p.narrow(-3, rank * width, width) for k, p in self.planes.items()}
            shape = (*self.shape[:-1], size // world_size)
        elif dim == ndim - 2 and ndim >= 2:
            if size % world_size:
                raise RepackError(f"shard: N={size} rows cannot be split evenly {world_size} ways")
            rows = size // world_size
            planes = {k: p.narrow(-2, rank * rows, rows) for k, p in self.planes.items()}
            shape = (*self.shape[:-2], rows, self.shape[-1])
        elif dim == 0 and ndim == 3:  # the experts of a stack: expert parallelism
            if size % world_size:
                raise RepackError(f"shard: {size} experts cannot be split evenly {world_size} ways")
            count = size // world_size
            planes = {k: p.narrow(0, rank * count, count) for k, p in self.planes.items()}
            shape = (count, *self.shape[1:])
        else:
            raise RepackError(f"shard: dim {dim} of a {ndim}-D tensor; only N (rows), K (columns) "
                              f"or the experts of a 3-D stack")
        return self._with(shape, planes)

    def expert(self, e: int) -> "QTensor":
        """Expert `e` of a 3-D expert stack (E, N, K): a 2-D QTensor."""
        if len(self.shape) < 3:
            raise RepackError(f"expert: a {len(self.shape)}-D tensor has no expert dimension")
        if not 0 <= e < self.shape[0]:
            raise RepackError(f"expert {e} is out of range 0..{self.shape[0] - 1}")
        return self._with(self.shape[1:], {k: p[e] for k, p in self.planes.items()})


def add_expert_bias(y: torch.Tensor, bias: torch.Tensor | None, ids: torch.Tensor) -> torch.Tensor:
    """An expert_matmul result y (T, k, N) plus each slot's expert's bias (E, N); another
    rank's expert (-1) adds none. What both engines' expert layers add (gpt-oss)."""
    if bias is None:
        return y
    return y + torch.where(ids[..., None] >= 0, bias[ids.clamp(min=0)], 0).to(y.dtype)


def interleave(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """gate and up as columns g0 u0 g1 u1 ...: how gpt-oss's gating (transformers' and vLLM's
    own code) takes them."""
    return torch.stack([gate, up], dim=-1).flatten(-2)


def join_rows(tensors: list[QTensor]) -> QTensor:
    """The rows of `tensors` one after another (along N): gate and up of an expert stack as one
    weight, as engines fuse them. Exact: the planes are concatenated, the blocks unchanged.
    The tensors must share their type, K and leading (expert) dimensions."""
    first = tensors[0]
    for t in tensors[1:]:
        if t.qtype is not first.qtype or t.shape[:-2] != first.shape[:-2] or t.shape[-1] != first.shape[-1]:
            raise RepackError(f"join_rows: {t!r} cannot follow {first!r} (same type, K and experts needed)")
    shape = (*first.shape[:-2], sum(t.shape[-2] for t in tensors), first.shape[-1])
    return first._with(shape, {k: torch.cat([t.planes[k] for t in tensors], dim=-2) for k in first.planes})
