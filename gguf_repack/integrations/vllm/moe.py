"""The `gguf_repack` method for vLLM's fused mixture-of-experts layers: expert stacks kept in rp1
planes.

Each stack is held as this rank's planes, `rp1_<stack>_<field>` of shape [local experts,
K/block, N, count]: `w13` (gate and up joined along N, as vLLM and transformers fuse them, when
they share a GGUF type; else `w1` and `w3`) and `w2` (down). Tensor parallel: each expert's N
rows of gate and up, and whole blocks of down's K (the intermediate width), as vLLM splits its
own; expert parallel: the experts of this rank (vLLM's expert map). The stacks are not routed
through the model's `load_weights` (whose expert mapping is for float checkpoints): the plugin's
loader places each one (`place_stack`). The product is `QTensor.expert_matmul`: tokens grouped
by expert, experts no token chose never read.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn import Parameter
from vllm.model_executor.layers.fused_moe import FusedMoEMethodBase

from gguf_repack.format.type_table import TYPES_BY_NAME, GGMLType
from gguf_repack.runtime.qtensor import QTensor, plane_torch_dtype

from .quant import PLANE


# an opaque custom op, as the linear layers' products (vLLM compiles the model)
@torch.library.custom_op("gguf_repack::rp1_expert_matmul", mutates_args=())
def rp1_expert_matmul(x: torch.Tensor, ids: torch.Tensor, planes: list[torch.Tensor], qtype: str,
                      experts: int, n: int, k: int) -> torch.Tensor:
    fields = TYPES_BY_NAME[qtype].fields
    stack = QTensor(qtype, (experts, n, k), {f.name: p for f, p in zip(fields, planes)})
    return stack.expert_matmul(x, ids)


@rp1_expert_matmul.register_fake
def _(x, ids, planes, qtype, experts, n, k):
    return x.new_empty((ids.shape[0], ids.shape[1], n))


def _call(stack: QTensor):
    return [stack.planes[f.name] for f in stack.qtype.fields], stack.qtype.name, *stack.shape


class RepackMoEMethod(FusedMoEMethodBase):
    """Routed experts of gate, up and down stacks of GGUF types `qtypes`, act(x @ gate.T) *
    (x @ up.T) @ down.T per chosen expert, weighted by the router (SiLU: Mixtral, Qwen2-MoE,
    Qwen3-MoE)."""

    def __init__(self, moe, qtypes: tuple[GGMLType, GGMLType, GGMLType], prefix: str):
        super().__init__(moe)
        self.qtypes, self.prefix = qtypes, prefix

    def create_weights(self, layer, num_experts: int, hidden_size: int,
                       intermediate_size_per_partition: int, params_dtype: torch.dtype,
                       **extra_weight_attrs):
        if not self.moe.is_act_and_mul or layer.activation.value != "silu":
            raise ValueError(f"gguf_repack: {self.prefix}: experts with activation "
                             f"{layer.activation.value!r} are not supported yet (SiLU and mul are)")
        gate, up, down = self.qtypes
        inter = intermediate_size_per_partition
        for qtype, k in ((gate, hidden_size), (down, inter)):
            if k % qtype.block_size:
                raise ValueError(f"gguf_repack: {self.prefix}: {k} input features per rank is not "
                                 f"a whole number of {qtype.name} blocks ({qtype.block_size}); use "
                                 f"another tensor_parallel_size")
        stacks = {"w13": (gate, 2 * inter, hidden_size)} if gate is up else \
            {"w1": (gate, inter, hidden_size), "w3": (up, inter, hidden_size)}
        stacks["w2"] = (down, hidden_size, inter)
        layer.rp1_stacks = {name: (qtype, (num_experts, n, k)) for name, (qtype, n, k) in stacks.items()}
        for name, (qtype, (experts, n, k)) in layer.rp1_stacks.items():
            for field in qtype.fields:
                plane = torch.zeros(experts, k // qtype.block_size, n, field.count,
                                    dtype=plane_torch_dtype(field))
                layer.register_parameter(f"{PLANE}{name}_{field.name}", Parameter(plane, requires_grad=False))
        layer.rp1_loaded = set()

    def stack(self, layer, name: str) -> QTensor:
        qtype, shape = layer.rp1_stacks[name]
        return QTensor(qtype, shape, {f.name: getattr(layer, f"{PLANE}{name}_{f.name}").data
                                      for f in qtype.fields})

    def place_stack(self, layer, role: str, stack: QTensor) -> None:
        """Put this rank's part of the file's whole `role` stack (gate, up or down; [E, N, K])
        into the layer's planes."""
        expert_map = layer.expert_map  # global expert -> local slot, -1 elsewhere (EP)
        if expert_map is not None:
            local = torch.argsort(expert_map.cpu().masked_fill(expert_map.cpu() < 0, 1 << 30))
            local = local[: int((expert_map >= 0).sum())]
            stack = QTensor(stack.qtype, (len(local), *stack.shape[1:]),
                            {f: p.index_select(0, local) for f, p in stack.planes.items()})
        parallel = self.moe.moe_parallel_config
        rank, size = parallel.tp_rank, parallel.tp_size
        if role == "down":  # row parallel: whole blocks of the intermediate width
            name, part, offset = "w2", stack.shard(-1, rank, size), 0
        else:  # column parallel: each expert's rows
            part = stack.shard(1, rank, size)
            name = "w13" if "w13" in layer.rp1_stacks else {"gate": "w1", "up": "w3"}[role]
            offset = part.shape[1] if name == "w13" and role == "up" else 0
        target = self.stack(layer, name)
        if part.qtype is not target.qtype or part.shape[0] != target.shape[0] \
                or part.shape[2] != target.shape[2]:
            raise ValueError(f"gguf_repack: {self.prefix}: the file's {role} stack "
                             f"{part.qtype.name} {list(part.shape)} does not fit "
                             f"{target.qtype.name} {list(target.shape)}")
        for field, plane in part.planes.items():
            target.planes[field].narrow(2, offset, part.shape[1]).copy_(plane)
        layer.rp1_loaded.add(role)

    def process_weights_after_loading(self, layer) -> None:
        missing = {"gate", "up", "down"} - layer.rp1_loaded
        if missing:
            raise ValueError(f"gguf_repack: {self.prefix}: no {', '.join(sorted(missing))} expert "
                             f"stack was loaded")
        layer.rp1_weights = {name: self.stack(layer, name) for name in layer.rp1_stacks}

    def get_fused_moe_quant_config(self, layer):
        return None  # no modular kernel: apply computes the experts itself

    def apply(self, layer, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
              shared_experts=None, shared_experts_input=None) -> torch.Tensor:
        ids = topk_ids.long()
        if layer.expert_map is not None:
            ids = layer.expert_map[ids].long()
        weights = layer.rp1_weights
        if "w13" in weights:
            gate, up = rp1_expert_matmul(x, ids, *_call(weights["w13"])).chunk(2, dim=-1)
        else:
            gate = rp1_expert_matmul(x, ids, *_call(weights["w1"]))
            up = rp1_expert_matmul(x, ids, *_call(weights["w3"]))
        down = rp1_expert_matmul(F.silu(gate) * up, ids, *_call(weights["w2"]))
        if layer.apply_router_weight_on_input:  # the router weights are in x already
            return down.sum(dim=1).to(x.dtype)
        return (down * topk_weights.unsqueeze(-1).to(down.dtype)).sum(dim=1).to(x.dtype)
