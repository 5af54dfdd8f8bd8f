"""The `gguf_repack` method for vLLM's fused mixture-of-experts layers: expert stacks kept in rp1
planes.

Each stack is held as this rank's planes, `rp1_<stack>_<field>` of shape [local experts,
K/block, N, count]: `w13` (gate and up joined along N, as vLLM and transformers fuse them, when
they share a GGUF type; else `w1` and `w3`) and `w2` (down). Tensor parallel: each expert's N
rows of gate and up, and whole blocks of down's K (the intermediate width), as vLLM splits its
own; expert parallel: the experts of this rank (vLLM's expert map). Expert biases (gpt-oss) are
float parameters `rp1_bias_<gate|up|down>`, each rank its rows of gate's and up's, down's on
rank 0 alone (the ranks' partial sums are added). The stacks are not routed through the model's
`load_weights` (whose expert mapping is for float checkpoints): the plugin's loader places each
one (`place_stack`, `place_bias`). The product is `QTensor.expert_matmul`: on CPU tokens grouped
by expert, on CUDA the Triton expert kernels; experts no token chose are never read.

Float expert stacks (an F32, F16 or BF16 file's) are held and computed by vLLM's own unquantized
fused-MoE method (`RepackFloatMoEMethod`: its `w13_weight` [local experts, 2 x N, K] and
`w2_weight` in the activation dtype, its kernels), placed by the same loader with the same split.
A model may mix the two, layer by layer (a file whose first layers' stacks are F16, the rest
quantized); one layer's gate, up and down must be all float or all quantized.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn import Parameter
from vllm.model_executor.layers.activation import SwigluOAIAndMul
from vllm.model_executor.layers.fused_moe import FusedMoEMethodBase, UnquantizedFusedMoEMethod

from gguf_repack.format.type_table import TYPES_BY_NAME, GGMLType
from gguf_repack.runtime.qtensor import QTensor, add_expert_bias, interleave, plane_torch_dtype

from .names import PLANE


# an opaque custom op, as the linear layers' products (vLLM compiles the model)
@torch.library.custom_op("gguf_repack::rp1_expert_matmul", mutates_args=())
def rp1_expert_matmul(x: torch.Tensor, ids: torch.Tensor, routed_experts: int, planes: list[torch.Tensor],
                      qtype: str, experts: int, n: int, k: int) -> torch.Tensor:
    fields = TYPES_BY_NAME[qtype].fields
    stack = QTensor(qtype, (experts, n, k), {f.name: p for f, p in zip(fields, planes)})
    return stack.expert_matmul(x, ids, routed_experts=routed_experts)


@rp1_expert_matmul.register_fake
def _(x, ids, routed_experts, planes, qtype, experts, n, k):
    return x.new_empty((ids.shape[0], ids.shape[1], n))


def _call(stack: QTensor):
    return [stack.planes[f.name] for f in stack.qtype.fields], stack.qtype.name, *stack.shape


def _silu_and_mul():
    return lambda gate, up: F.silu(gate) * up


def _gelu_tanh_and_mul():  # (Gemma 4's experts)
    return lambda gate, up: F.gelu(gate, approximate="tanh") * up


def _swigluoai():
    """gpt-oss's clamped SwiGLU, vLLM's own (which takes gate and up interleaved); made while
    the model is built, where vLLM's custom ops may be."""
    op = SwigluOAIAndMul()
    return lambda gate, up: op.forward_native(interleave(gate, up))


def local_experts(layer) -> torch.Tensor | None:
    """This rank's experts (global ids, in local slot order) under expert parallelism."""
    expert_map = layer.expert_map  # global expert -> local slot, -1 elsewhere (EP)
    if expert_map is None:
        return None
    local = torch.argsort(expert_map.cpu().masked_fill(expert_map.cpu() < 0, 1 << 30))
    return local[: int((expert_map >= 0).sum())]


def check_loaded(method, layer) -> None:
    """Every stack (and expert bias) of the layer was placed: never a layer computing on the
    zeros (or the uninitialized memory) it was made with."""
    missing = {"gate", "up", "down"} - layer.rp1_loaded
    if method.moe.has_bias:
        missing |= {"gate biases", "up biases", "down biases"} - layer.rp1_loaded
    if missing:
        raise ValueError(f"gguf_repack: {method.prefix}: no {', '.join(sorted(missing))} expert "
                         f"stack was loaded")


# vLLM's activation name -> a maker of activation(gate, up)
ACTIVATIONS = {"silu": _silu_and_mul, "gelu_tanh": _gelu_tanh_and_mul, "swigluoai": _swigluoai}
BIAS = PLANE + "bias_"


class RepackMoEMethod(FusedMoEMethodBase):
    """Routed experts of gate, up and down stacks of GGUF types `qtypes`, act(x @ gate.T + b) *
    (x @ up.T + b) @ down.T + b per chosen expert, weighted by the router: SiLU and mul (Mixtral,
    Qwen2-MoE, Qwen3-MoE) or gpt-oss's clamped SwiGLU with biases."""

    def __init__(self, moe, qtypes: tuple[GGMLType, GGMLType, GGMLType], prefix: str):
        super().__init__(moe)
        self.qtypes, self.prefix = qtypes, prefix

    def create_weights(self, layer, num_experts: int, hidden_size: int,
                       intermediate_size_per_partition: int, params_dtype: torch.dtype,
                       **extra_weight_attrs):
        if not self.moe.is_act_and_mul or layer.activation.value not in ACTIVATIONS:
            raise ValueError(f"gguf_repack: {self.prefix}: experts with activation "
                             f"{layer.activation.value!r} are not supported yet "
                             f"({', '.join(ACTIVATIONS)} are)")
        self.activation = ACTIVATIONS[layer.activation.value]()
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
        if self.moe.has_bias:
            for role, n in (("gate", inter), ("up", inter), ("down", hidden_size)):
                bias = torch.zeros(num_experts, n, dtype=torch.float32)
                layer.register_parameter(BIAS + role, Parameter(bias, requires_grad=False))

    def stack(self, layer, name: str) -> QTensor:
        qtype, shape = layer.rp1_stacks[name]
        return QTensor(qtype, shape, {f.name: getattr(layer, f"{PLANE}{name}_{f.name}").data
                                      for f in qtype.fields})

    def place_bias(self, layer, role: str, bias: torch.Tensor) -> None:
        """This rank's part of the file's `role` expert biases ([E, N]): its experts, its rows
        of gate's and up's; down's on TP rank 0 only, as the ranks' products are summed."""
        target = getattr(layer, BIAS + role, None)
        if target is None:
            raise ValueError(f"gguf_repack: {self.prefix}: the file has {role} expert biases, "
                             f"the model's experts layer has none")
        local = local_experts(layer)
        if local is not None:
            bias = bias.index_select(0, local)
        parallel = self.moe.moe_parallel_config
        if role != "down":
            rows = target.shape[1]
            bias = bias[:, parallel.tp_rank * rows:(parallel.tp_rank + 1) * rows]
        elif parallel.tp_rank != 0:
            bias = torch.zeros_like(bias)
        if bias.shape != target.shape:
            raise ValueError(f"gguf_repack: {self.prefix}: the file's {role} expert biases "
                             f"{list(bias.shape)} do not fit {list(target.shape)}")
        target.data.copy_(bias)
        layer.rp1_loaded.add(role + " biases")

    def place_stack(self, layer, role: str, stack: QTensor) -> None:
        """Put this rank's part of the file's whole `role` stack (gate, up or down; [E, N, K])
        into the layer's planes."""
        local = local_experts(layer)
        if local is not None:
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
        check_loaded(self, layer)
        layer.rp1_weights = {name: self.stack(layer, name) for name in layer.rp1_stacks}

    def get_fused_moe_quant_config(self, layer):
        return None  # no modular kernel: apply computes the experts itself

    def apply(self, layer, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
              shared_experts=None, shared_experts_input=None) -> torch.Tensor:
        ids = topk_ids.long()
        # the experts the router chose among: under expert parallelism the model's, which the
        # expert map spans (global id -> local slot), not this rank's stack; the kernels choose
        # their path by the rows an expert gets, which come from the model's count
        weights = layer.rp1_weights
        routed = weights["w2"].shape[0]
        if layer.expert_map is not None:
            ids = layer.expert_map[ids].long()
            routed = layer.expert_map.shape[0]
        if layer.apply_router_weight_on_input:
            # Llama 4 (top-1, as vLLM allows it): the router's weight scales the expert's input,
            # not its output; vLLM's modular kernels do this in a prepare step, which this
            # method does not go through
            if topk_weights.shape[-1] != 1:
                raise ValueError("gguf_repack: the router's weight on the experts' input needs top-1")
            x = x * topk_weights.to(x.dtype)
        if "w13" in weights:
            gate, up = rp1_expert_matmul(x, ids, routed, *_call(weights["w13"])).chunk(2, dim=-1)
        else:
            gate = rp1_expert_matmul(x, ids, routed, *_call(weights["w1"]))
            up = rp1_expert_matmul(x, ids, routed, *_call(weights["w3"]))
        gate = add_expert_bias(gate, getattr(layer, BIAS + "gate", None), ids)
        up = add_expert_bias(up, getattr(layer, BIAS + "up", None), ids)
        down = rp1_expert_matmul(self.activation(gate, up), ids, routed, *_call(weights["w2"]))
        down = add_expert_bias(down, getattr(layer, BIAS + "down", None), ids)
        if layer.apply_router_weight_on_input:  # (applied to the input above)
            return down.sum(dim=1).to(x.dtype)
        return (down * topk_weights.unsqueeze(-1).to(down.dtype)).sum(dim=1).to(x.dtype)



class RepackFloatMoEMethod(UnquantizedFusedMoEMethod):
    """Float expert stacks in vLLM's own unquantized fused-MoE method: its parameters (w13_weight
    [local experts, 2 x N, K], w2_weight [local experts, K, N], gpt-oss's w13_bias and w2_bias)
    in the activation dtype, its kernels (on CPU vLLM's grouped GEMM, on CUDA its Triton fused
    MoE), filled by the plugin's loader (`place_stack`, `place_bias`) with the quantized
    method's split: each rank its rows of every expert's gate and up, its columns of down
    (the ranks' products are summed); gate and up one after the other along N, or interleaved
    row by row for gpt-oss's SwiGLU (vLLM's `swigluoai` takes them so, as the model's own loader
    places them)."""

    def __init__(self, moe, prefix: str):
        super().__init__(moe)
        self.prefix = prefix

    def create_weights(self, layer, num_experts: int, hidden_size: int,
                       intermediate_size_per_partition: int, params_dtype: torch.dtype,
                       **extra_weight_attrs):
        super().create_weights(layer, num_experts, hidden_size, intermediate_size_per_partition,
                               params_dtype, **extra_weight_attrs)
        layer.rp1_loaded = set()
        # a backend that rounds the sizes up (vLLM's weights are made empty): the rows and
        # columns beyond the file's stay zeros
        if (hidden_size, intermediate_size_per_partition) != self._sizes():
            layer.w13_weight.data.zero_()
            layer.w2_weight.data.zero_()

    def _sizes(self) -> tuple[int, int]:
        """The file's hidden size and this rank's intermediate width (vLLM's, before padding)."""
        return self.moe.hidden_dim_unpadded, self.moe.intermediate_size_per_partition_unpadded

    def _gate_up(self, layer, w13: torch.Tensor, role: str) -> torch.Tensor:
        """The rows of `role` (gate or up) in w13 ([experts, 2 x N(padded), ...]), a view."""
        inter = self._sizes()[1]
        if layer.activation.value == "swigluoai":  # interleaved: gate 0, up 0, gate 1, ...
            return w13[:, (0 if role == "gate" else 1):2 * inter:2]
        return w13.narrow(1, 0 if role == "gate" else w13.shape[1] // 2, inter)

    def _rank_part(self, tensor: torch.Tensor, dim: int) -> torch.Tensor:
        """This rank's piece of `tensor` along `dim` (vLLM's own split: equal pieces)."""
        parallel = self.moe.moe_parallel_config
        size = tensor.shape[dim] // parallel.tp_size
        return tensor.narrow(dim, parallel.tp_rank * size, size)

    def place_stack(self, layer, role: str, stack: torch.Tensor) -> None:
        """This rank's part of the file's whole `role` stack (gate, up or down; [E, N, K],
        float), in the layer's dtype."""
        local = local_experts(layer)
        if local is not None:
            stack = stack.index_select(0, local)
        hidden, inter = self._sizes()
        if role == "down":  # row parallel: this rank's columns of the intermediate width
            part = self._rank_part(stack, 2)
            target = layer.w2_weight.data[:, :hidden, :inter]
        else:  # column parallel: each expert's rows
            part = self._rank_part(stack, 1)
            target = self._gate_up(layer, layer.w13_weight.data, role)[:, :, :hidden]
        if part.shape != target.shape:
            raise ValueError(f"gguf_repack: {self.prefix}: the file's {role} stack "
                             f"{list(stack.shape)} does not fit this rank's {list(target.shape)}")
        target.copy_(part)
        layer.rp1_loaded.add(role)

    def place_bias(self, layer, role: str, bias: torch.Tensor) -> None:
        """This rank's part of the file's `role` expert biases ([E, N]): its rows of gate's and
        up's; down's on TP rank 0 only, as the ranks' products are summed."""
        if not self.moe.has_bias:
            raise ValueError(f"gguf_repack: {self.prefix}: the file has {role} expert biases, "
                             f"the model's experts layer has none")
        local = local_experts(layer)
        if local is not None:
            bias = bias.index_select(0, local)
        hidden, inter = self._sizes()
        if role == "down":
            target = layer.w2_bias.data[:, :hidden]
            if self.moe.moe_parallel_config.tp_rank != 0:
                bias = torch.zeros_like(bias)
        else:
            bias = self._rank_part(bias, 1)
            target = self._gate_up(layer, layer.w13_bias.data, role)
        if bias.shape != target.shape:
            raise ValueError(f"gguf_repack: {self.prefix}: the file's {role} expert biases "
                             f"{list(bias.shape)} do not fit {list(target.shape)}")
        target.copy_(bias)
        layer.rp1_loaded.add(role + " biases")

    def process_weights_after_loading(self, layer) -> None:
        check_loaded(self, layer)
        super().process_weights_after_loading(layer)
