"""torch.nn modules whose weights stay quantized: QuantLinear, QuantEmbedding, QuantExperts.

The rp1 planes are registered as (non-persistent) buffers, so `model.to(device)`, `.buffers()`
and memory accounting see them like any other tensor; the QTensor is rebuilt from them on each
call, which costs nothing (it is a dict of the same tensors).
"""

from __future__ import annotations

import torch
from torch import nn

from gguf_repack.runtime.qtensor import QTensor, add_expert_bias, join_rows

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

    def __init__(self, weight: QTensor, bias: torch.Tensor | None = None, backend: str = "auto",
                 dtype: torch.dtype = torch.float32):
        super().__init__()
        if len(weight.shape) != 2:
            raise ValueError(f"QuantLinear needs a 2-D weight, got {list(weight.shape)}")
        self.out_features, self.in_features = weight.shape
        self.dtype = dtype
        self._hold(weight, backend)
        self.register_parameter("bias", None if bias is None else nn.Parameter(bias, requires_grad=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.qweight.matmul(x, backend=self.backend)
        return y if self.bias is None else y + self.bias.to(y.dtype)

    @property
    def weight(self) -> torch.Tensor:
        """The weight's shape, dtype and device with no data (a meta tensor): models that read
        `lm_head.weight.dtype` (Mamba) get the compute dtype; any use of its values fails loudly."""
        return torch.empty(self.weight_shape, dtype=self.dtype, device="meta")

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

    @property
    def weight(self) -> torch.Tensor:
        """The table's shape, dtype and device, values NaN (one element, broadcast: no memory):
        models that put the ids on `embed_tokens.weight.device` (Llama 4) find the planes'
        device; any use of its values gives NaN, not numbers."""
        device = getattr(self, _PREFIX + self.qtype.fields[0].name).device
        return torch.full((), float("nan"), dtype=self.dtype, device=device).expand(self.weight_shape)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, qtype={self.qtype.name}"


class QuantExperts(nn.Module):
    """transformers' experts module of Mixtral, Qwen2-MoE, Qwen3-MoE and gpt-oss,
    forward(hidden_states (T, hidden), top_k_index (T, k), top_k_weights (T, k)), over quantized
    expert stacks: gate and up (E, I, hidden), down (E, hidden, I), and per-expert biases where
    the model has them (gpt-oss). Gate and up of one GGUF type are held joined along N
    (transformers' gate_up_proj, exactly: the planes concatenated), one product for both; each
    token meets only its chosen experts (QTensor.expert_matmul). `activation(gate, up)` is the
    model's own: act(gate) * up, or gpt-oss's clamped SwiGLU; act(up) for experts without a
    gate (Nemotron-H's ReLU^2: gate None, stacks up and down)."""

    def __init__(self, gate: QTensor | None, up: QTensor | None, down: QTensor, activation,
                 backend: str = "auto", biases: dict[str, torch.Tensor] | None = None, *,
                 gate_up: QTensor | None = None):
        super().__init__()
        if gate_up is not None:  # (one GGUF tensor of both: Gemma 4's ffn_gate_up_exps)
            if gate is not None or up is not None or gate_up.shape[1] % 2:
                raise ValueError(f"a joined gate_up stack {list(gate_up.shape)} takes no gate or up")
            experts, rows, hidden = gate_up.shape
            gate_shape = up_shape = (experts, rows // 2, hidden)
            stacks = {"gate_up": gate_up}
        elif gate is None:  # experts without a gate (Nemotron-H's): activation(None, up)
            gate_shape = up_shape = tuple(up.shape)
            stacks = {"up": up}
        else:
            gate_shape, up_shape = tuple(gate.shape), tuple(up.shape)
            stacks = {"gate_up": join_rows([gate, up])} if gate.qtype is up.qtype \
                else {"gate": gate, "up": up}
        self.num_experts, self.intermediate_dim, self.hidden_dim = gate_shape
        if up_shape != gate_shape or tuple(down.shape) != (self.num_experts, self.hidden_dim,
                                                           self.intermediate_dim):
            raise ValueError(f"expert stacks do not fit: gate {list(gate_shape)}, up "
                             f"{list(up_shape)}, down {list(down.shape)}")
        self.activation, self.backend = activation, backend
        stacks["down"] = down
        self.stacks = {name: (w.qtype, tuple(w.shape)) for name, w in stacks.items()}
        for name, w in stacks.items():
            for field, plane in w.planes.items():
                self.register_buffer(f"{_PREFIX}{name}_{field}", plane, persistent=False)
        biases = biases or {}
        for name, shape in (("gate", gate_shape), ("up", up_shape), ("down", tuple(down.shape))):
            bias = biases.get(name)
            if bias is not None and tuple(bias.shape) != shape[:2]:
                raise ValueError(f"{name} expert biases {list(bias.shape)} do not fit the stack "
                                 f"{list(shape)}")
            self.register_parameter(f"{name}_bias", None if bias is None
                                    else nn.Parameter(bias, requires_grad=False))

    def stack(self, name: str) -> QTensor:
        qtype, shape = self.stacks[name]
        planes = {f.name: getattr(self, f"{_PREFIX}{name}_{f.name}") for f in qtype.fields}
        return QTensor(qtype, shape, planes)

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        # (DBRX's experts module takes the tokens unflattened, (batch, seq, hidden), and gives
        # them back so)
        shape, hidden_states = hidden_states.shape, hidden_states.reshape(-1, hidden_states.shape[-1])
        # transformers marks another rank's experts (expert parallel) with id num_experts
        ids = torch.where(top_k_index < self.num_experts, top_k_index, -1)
        if "gate_up" in self.stacks:
            gate, up = self.stack("gate_up").expert_matmul(hidden_states, ids, self.backend).chunk(2, dim=-1)
        elif "gate" not in self.stacks and "up" in self.stacks:  # (no gate)
            gate, up = None, self.stack("up").expert_matmul(hidden_states, ids, self.backend)
        else:
            gate = self.stack("gate").expert_matmul(hidden_states, ids, self.backend)
            up = self.stack("up").expert_matmul(hidden_states, ids, self.backend)
        gate, up = add_expert_bias(gate, self.gate_bias, ids), add_expert_bias(up, self.up_bias, ids)
        down = self.stack("down").expert_matmul(self.activation(gate, up), ids, self.backend)
        down = add_expert_bias(down, self.down_bias, ids)
        out = (down * top_k_weights.unsqueeze(-1).to(down.dtype)).sum(dim=1).to(hidden_states.dtype)
        return out.reshape(shape)

    def extra_repr(self) -> str:
        types = ", ".join(f"{name}={qtype.name}" for name, (qtype, _) in self.stacks.items())
        return (f"experts={self.num_experts}, hidden={self.hidden_dim}, "
                f"intermediate={self.intermediate_dim}, {types}")


class EveryExpert(nn.Module):
    """Llama 4's experts module, forward(hidden_states (E * T, hidden)): rows e*T..(e+1)*T - 1
    through expert e, the router's weight applied to the input already (zero for the experts
    not chosen), as transformers' Llama4TextExperts computes it; over a QuantExperts."""

    def __init__(self, experts: QuantExperts):
        super().__init__()
        self.experts = experts

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        rows = hidden_states.shape[0]
        ids = torch.arange(self.experts.num_experts, device=hidden_states.device)
        ids = ids.repeat_interleave(rows // self.experts.num_experts)[:, None]
        return self.experts(hidden_states, ids, torch.ones_like(ids, dtype=hidden_states.dtype))
