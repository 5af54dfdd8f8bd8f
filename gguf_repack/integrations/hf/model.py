"""load_model(out): a transformers model whose linear layers, token embedding and expert stacks stay
quantized.

The model is built from the directory's config.json with empty (meta) weights, then every GGUF
tensor is put in place under its transformers name: quantized ones as QuantLinear /
QuantEmbedding modules holding the rp1 planes, float ones (norms, biases) as parameters. No
weight is ever dequantized whole.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import torch
from torch import nn

from gguf_repack.errors import FormatError, RepackError
from gguf_repack.integrations.architectures import describe_support, support
from gguf_repack.integrations.tensor_map import (
    EXPERT_TENSOR,
    MLA_KV_B_PART,
    TensorMapping,
    joined_from_parts,
    kv_b_from_parts,
    meta_model,
    row_part,
    stack_slice,
    without_quantization_config,
)
from gguf_repack.runtime.loader import RepackedModel, load
from gguf_repack.runtime.qtensor import QTensor, interleave

from .modules import EveryExpert, QuantEmbedding, QuantExperts, QuantLinear


def load_model(out: str | os.PathLike, device: str | torch.device = "cpu", *,
               dtype: torch.dtype | None = None, backend: str = "auto", verify: bool = False):
    """The model in output directory `out` as a transformers `PreTrainedModel` (eval mode).
    `dtype` is the compute dtype of activations and float weights, by default
    `default_dtype(device, config)`: float32 on CPU, 16-bit on CUDA; `backend` picks the
    QTensor kernels ("auto": triton on CUDA, torch elsewhere, or what GGUF_REPACK_BACKEND
    says, gguf_repack.runtime.backends)."""
    from transformers import AutoConfig

    out = Path(out)
    repacked = load(out, device, verify=verify)
    arch = repacked.metadata.get("general.architecture")
    if support(arch, repacked.metadata.get(f"{arch}.expert_count", 0)) is None:
        raise RepackError(describe_support(arch))
    if not (out / "config.json").is_file():
        raise FormatError(f"{out}: no config.json (convert it again with the hf extra installed "
                          f"and without --weights-only)")
    config = AutoConfig.from_pretrained(out)
    dtype = dtype or default_dtype(device, config)
    model = empty_model(config, dtype)
    fill_model(model, repacked, dtype=dtype, backend=backend)
    if (out / "generation_config.json").is_file():  # (the end-of-turn tokens, as from_pretrained)
        from transformers import GenerationConfig

        model.generation_config = GenerationConfig.from_pretrained(out)
    return model.to(device).eval()


HALF_DTYPES = (torch.bfloat16, torch.float16)


def default_dtype(device: str | torch.device, config=None) -> torch.dtype:
    """load_model's compute dtype when it is given none: on CUDA, the model's own dtype
    (config.json's `dtype`, or `torch_dtype`) where that is a 16-bit float, else bfloat16;
    float32 on the CPU and any other device."""
    if torch.device(device).type != "cuda":
        return torch.float32
    own = None
    if config is not None:
        own = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(own, str):
        own = getattr(torch, own.removeprefix("torch."), None)
    return own if own in HALF_DTYPES else torch.bfloat16


def empty_model(config, dtype: torch.dtype):
    """The model for `config` with its weights on the meta device (buffers, such as rotary
    frequencies, are real)."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with without_quantization_config(config), init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model


def fill_model(model: nn.Module, repacked: RepackedModel, *, dtype: torch.dtype = torch.float32,
               backend: str = "auto", plain_only: bool = False) -> None:
    """Put every tensor of `repacked` into `model` (built by empty_model) in place; with
    `plain_only`, only the float ones (norms, biases) again, into a model filled before."""
    # a model filled before holds QuantLinear modules, whose parameters are no longer named
    # as transformers' are: its names come from a fresh meta copy then
    mapping = TensorMapping(meta_model(model.config) if plain_only else model, repacked)
    expert_stacks: dict[str, dict[str, QTensor]] = {}  # experts module -> {gate, up, down}
    kv_b_parts: dict[str, dict[str, QTensor | torch.Tensor]] = {}  # MLA kv_b_proj -> {k, v}
    row_parts: dict[str, dict[str, QTensor | torch.Tensor]] = {}  # a ROW_PARTS parameter -> {part: ...}
    dequantized: list[str] = []
    reordered: list[str] = []
    for gguf_name, hf_name in mapping.names:
        tensor = repacked[gguf_name]
        if hf_name in mapping.stacked:  # (one slice of a stacked tensor: Gemma 3n's AltUp)
            tensor = stack_slice(tensor, mapping.stacked[hf_name][1])
        module_name, _, param = hf_name.rpartition(".")
        module = model.get_submodule(module_name)
        role = EXPERT_TENSOR.fullmatch(gguf_name)
        if part := MLA_KV_B_PART.fullmatch(gguf_name):
            kv_b_parts.setdefault(hf_name, {})[part["part"]] = (gguf_name, tensor)
        elif part := row_part(gguf_name, hf_name):
            row_parts.setdefault(hf_name, {})[part] = (gguf_name, tensor)
        elif role and len(tensor.shape) == (3 if role["kind"] == "weight" else 2):
            # an expert stack or its biases: placed with its module's others
            if not plain_only:
                key = role["role"] + ("_bias" if role["kind"] == "bias" else "")
                expert_stacks.setdefault(module_name, {})[key] = (
                    mapping.quantized(gguf_name, tensor) if isinstance(tensor, QTensor)
                    else mapping.plain(gguf_name, tensor, dtype))
        elif not isinstance(tensor, QTensor):
            _place_plain(module, param, hf_name, mapping.plain(gguf_name, tensor, dtype))
        elif len(tensor.shape) == 2 and not _computes_on_quantized(module, param):
            # a module that cannot compute on a quantized weight (a convolution; llama.cpp keeps
            # those float32, other tools may not): this one tensor dequantized, said below
            value = mapping.plain(gguf_name, tensor.dequantize(torch.float32), dtype)
            _place_plain(module, param, hf_name, value)
            dequantized.append(f"{gguf_name} ({type(module).__name__})")
        elif not plain_only and not mapping.columns_on_blocks(gguf_name, tensor):
            # columns the converter reordered across blocks (Qwen3.5's ssm_out in a K-quant):
            # this one tensor dequantized, said below
            value = mapping.plain(gguf_name, tensor.dequantize(torch.float32), dtype)
            _place_plain(module, param, hf_name, value)
            reordered.append(gguf_name)
        elif not plain_only:
            weight = mapping.quantized(gguf_name, tensor, conv1d=_is_conv1d(module))
            _place_quantized(model, module_name, module, param, gguf_name, weight, dtype, backend)
    joined = _place_kv_b(model, kv_b_parts, mapping, dtype)
    if not plain_only:
        for hf_name, found in row_parts.items():
            weight, dequantized_parts = joined_from_parts(hf_name, found, mapping, dtype)
            module_name, _, param = hf_name.rpartition(".")
            if isinstance(weight, QTensor):
                _place_quantized(model, module_name, model.get_submodule(module_name), param,
                                 min(name for name, _ in found.values()), weight, dtype, backend)
            else:
                _place_plain(model.get_submodule(module_name), param, hf_name, weight)
                reordered += dequantized_parts
    if plain_only:
        return
    if dequantized:
        warnings.warn(f"gguf_repack: {len(dequantized)} quantized tensors are held dequantized, "
                      f"their modules compute on float weights only: {', '.join(dequantized)}",
                      stacklevel=3)
    if reordered:
        warnings.warn(f"gguf_repack: {len(reordered)} quantized tensors are held dequantized: "
                      f"llama.cpp's converter split or reordered them so that no order of whole "
                      f"blocks of one type undoes it (Qwen3.5's ssm_out in K-quants; Qwen3-Next's "
                      f"attn_qkv and attn_gate, Granite's shared expert's gate and up, of two "
                      f"types): {', '.join(reordered)}", stacklevel=3)
    if joined:
        warnings.warn(f"gguf_repack: {len(joined)} quantized MLA kv_b_proj weights are held "
                      f"dequantized: llama.cpp stores their key rows transposed (attn_k_b), "
                      f"quantized along the other axis, which no row order of the blocks "
                      f"undoes: {', '.join(joined)}", stacklevel=3)
    for module_name, stacks in expert_stacks.items():
        _place_experts(model, module_name, stacks, backend)
    for hf_name, value in mapping.from_metadata.items():  # (Apertus's xIELU parameters)
        module_name, _, param = hf_name.rpartition(".")
        _place_plain(model.get_submodule(module_name), param, hf_name, value.to(dtype))
    _tie_output_embeddings(model, backend)
    # (buffers such as rotary frequencies are the model's own business, not the checkpoint's)
    missing = [n for n, t in model.named_parameters() if t.is_meta]
    if missing:
        raise FormatError(f"{repacked.path}: no tensor for {len(missing)} model weights "
                          f"({', '.join(missing[:4])}{', ...' if len(missing) > 4 else ''})")


def _place_plain(module, param: str, hf_name: str, value: torch.Tensor) -> None:
    current = getattr(module, param, None)
    if current is not None and current.shape != value.shape:
        raise FormatError(f"{hf_name}: the GGUF tensor has shape {list(value.shape)}, the model "
                          f"expects {list(current.shape)}")
    if param in module._buffers:  # (DeepSeek-V3's e_score_correction_bias: a buffer there)
        module._buffers[param] = value
    else:
        module._parameters[param] = nn.Parameter(value, requires_grad=False)


def _place_kv_b(model, parts: dict[str, dict], mapping: TensorMapping, dtype) -> list[str]:
    """MLA's kv_b_proj weights joined from llama.cpp's two parts (tensor_map.kv_b_from_parts).
    Returns the names of the GGUF parts that were quantized."""
    quantized = []
    for hf_name, found in parts.items():
        weight, dequantized = kv_b_from_parts(hf_name, found, mapping, dtype)
        quantized += dequantized
        module_name, _, param = hf_name.rpartition(".")
        _place_plain(model.get_submodule(module_name), param, hf_name, weight)
    return quantized


def _place_quantized(model, module_name, module, param, gguf_name, weight: QTensor,
                     dtype, backend) -> None:
    if param != "weight" or len(weight.shape) != 2:
        raise RepackError(f"{gguf_name}: a quantized {list(weight.shape)} tensor for {module_name}."
                          f"{param} is not supported yet (expert stacks need a MoE module)")
    # transformers' Conv1D (GPT-2) holds (in, out): the (out, in) weight is a linear layer's
    expected = tuple(module.weight.shape)[::-1] if _is_conv1d(module) else tuple(module.weight.shape)
    if tuple(weight.shape) != expected:
        raise FormatError(f"{gguf_name}: shape {list(weight.shape)} does not fit {module_name} "
                          f"{list(module.weight.shape)}")
    if isinstance(module, nn.Embedding):
        new = QuantEmbedding(weight, dtype, scale=_embed_scale(module), backend=backend)
    elif isinstance(module, nn.Linear) or _is_conv1d(module):
        bias = module.bias if module.bias is not None and not module.bias.is_meta else None
        new = QuantLinear(weight, bias, backend=backend, dtype=dtype)
    else:
        raise RepackError(f"{gguf_name}: {module_name} is a {type(module).__name__}, which cannot "
                          f"hold a quantized weight yet")
    model.set_submodule(module_name, new)


def _computes_on_quantized(module, param: str) -> bool:
    """Whether `module.param` can be a quantized weight: a linear layer's (transformers'
    Conv1D is one) or an embedding's (a scaled one too: QuantEmbedding keeps the scale), or one
    of ours already (a model filled before). Not a linear layer that computes more than
    x @ W.T + b (NOT_PLAIN_LINEAR), which a QuantLinear would not."""
    linear = isinstance(module, nn.Linear) and type(module).__name__ not in NOT_PLAIN_LINEAR
    return param == "weight" and (linear or isinstance(module, (nn.Embedding, QuantLinear, QuantEmbedding))
                                  or _is_conv1d(module))


# transformers' nn.Linear subclasses whose forward computes more than the product: Llama 4's
# router returns its top-k scores with the logits
NOT_PLAIN_LINEAR = {"Llama4Router"}


def _is_conv1d(module) -> bool:
    from transformers.pytorch_utils import Conv1D

    return isinstance(module, Conv1D)


def _place_experts(model, module_name: str, stacks: dict[str, QTensor | torch.Tensor],
                   backend: str) -> None:
    """An experts module of transformers' MoE models made a QuantExperts over the file's
    stacks (and their biases, gpt-oss's)."""
    module = model.get_submodule(module_name)
    if type(module).__name__ in EXPERT_WEIGHT_HOLDERS:  # (the experts module is its parent)
        module_name = module_name.rpartition(".")[0]
        module = model.get_submodule(module_name)
    arch = model.config.model_type
    kind = type(module).__name__
    biases = {role.removesuffix("_bias"): stacks.pop(role) for role in list(stacks) if role.endswith("_bias")}
    if kind in UNGATED_EXPERT_MODULES:
        needs, said = [{"up", "down"}], "up and down (no gate)"
    else:
        needs, said = [{"gate", "up", "down"}, {"gate_up", "down"}], "gate, up and down (or gate_up and down)"
    if set(stacks) not in needs:
        raise FormatError(f"{module_name}: the file has expert stacks {sorted(stacks)}; a "
                          f"{arch} experts module needs {said}")
    if kind not in EXPERT_MODULES:
        raise RepackError(f"{arch}: its experts ({module_name}, {kind}) cannot run on quantized "
                          f"stacks yet; {', '.join(sorted(EXPERT_MODULES))} can")
    if set(biases) not in (set(), {"gate", "up", "down"}) or bool(biases) != EXPERT_MODULES[kind]:
        raise FormatError(f"{module_name}: the file has expert biases for {sorted(biases) or 'none'}; "
                          f"{kind} has {'gate, up and down' if EXPERT_MODULES[kind] else 'none'}")
    plain = [isinstance(t, torch.Tensor) for t in stacks.values()]
    if all(plain):  # float stacks (F16, F32): transformers' own module, in its layout
        _fill_float_experts(module, kind, stacks, biases)
    elif any(plain):
        raise RepackError(f"{module_name}: expert stacks partly float, partly quantized are not "
                          f"supported yet")
    else:
        experts = QuantExperts(stacks.get("gate"), stacks.get("up"), stacks["down"], _activation(module),
                               backend=backend, biases=biases, gate_up=stacks.get("gate_up"))
        model.set_submodule(module_name, EveryExpert(experts) if kind in EVERY_EXPERT_MODULES else experts)


# transformers' experts modules that compute act(x @ gate.T + b) * (x @ up.T + b) @ down.T + b per
# expert, weighted by the router: what QuantExperts computes; whether they have biases
EXPERT_MODULES = {"MixtralExperts": False, "Qwen2MoeExperts": False, "Qwen3MoeExperts": False,
                  "GptOssExperts": True, "DeepseekV2Experts": False, "DeepseekV3Experts": False,
                  "Glm4MoeExperts": False, "OlmoeExperts": False, "GraniteMoeExperts": False,
                  "Ernie4_5_MoeExperts": False, "MiniMaxM2Experts": False, "Llama4TextExperts": False,
                  "ExaoneMoeExperts": False, "PhimoeExperts": False,
                  "AfmoeExperts": False, "Qwen3NextExperts": False, "Qwen3_5MoeExperts": False,
                  "Gemma4TextExperts": False, "GraniteMoeHybridExperts": False,
                  "GraniteMoeSharedExperts": False, "Dots1Experts": False, "Lfm2MoeExperts": False,
                  "NemotronHExperts": False, "DbrxExperts": False, "JambaExperts": False,
                  "HunYuanMoEV1Experts": False}
# modules holding the expert stacks of an experts module, their parent: DBRX's experts.mlp
# (its forward takes one expert's weights; the routing is the parent's)
EXPERT_WEIGHT_HOLDERS = {"DbrxExpertGLU"}
# experts modules without a gate: act(x @ up.T) @ down.T (Nemotron-H's ReLU^2)
UNGATED_EXPERT_MODULES = {"NemotronHExperts"}
# experts modules called on every token for every expert (E * T rows, the router's weight
# applied to the input already): forward(hidden_states) alone
EVERY_EXPERT_MODULES = {"Llama4TextExperts"}


def _activation(module):
    """The experts module's own gating, as activation(gate, up), reusing transformers' code:
    gpt-oss's `_apply_gate` takes gate and up interleaved (its gate_up_proj's column order)."""
    if type(module).__name__ == "GptOssExperts":
        apply_gate = module._apply_gate
        return lambda gate, up: apply_gate(interleave(gate, up))
    act_fn = module.mlp.activation_fn if type(module).__name__ == "DbrxExperts" else module.act_fn
    if type(module).__name__ in UNGATED_EXPERT_MODULES:
        return lambda gate, up: act_fn(up)
    return lambda gate, up: act_fn(gate) * up


def _fill_float_experts(module, kind: str, stacks: dict[str, torch.Tensor],
                        biases: dict[str, torch.Tensor]) -> None:
    """Float expert stacks into transformers' own module: gate and up joined along N (gpt-oss:
    interleaved, and every stack transposed to (E, in, out); Llama 4: transposed)."""
    if kind == "Llama4TextExperts":
        gate_up = torch.cat([stacks["gate"], stacks["up"]], dim=1)
        module.gate_up_proj = nn.Parameter(gate_up.transpose(1, 2).contiguous(), requires_grad=False)
        module.down_proj = nn.Parameter(stacks["down"].transpose(1, 2).contiguous(), requires_grad=False)
        return
    if kind == "GptOssExperts":
        gate_up = torch.stack([stacks["gate"], stacks["up"]], dim=2).flatten(1, 2)  # rows g0 u0 g1 u1
        module.gate_up_proj = nn.Parameter(gate_up.transpose(1, 2).contiguous(), requires_grad=False)
        module.down_proj = nn.Parameter(stacks["down"].transpose(1, 2).contiguous(), requires_grad=False)
        module.gate_up_proj_bias = nn.Parameter(torch.stack([biases["gate"], biases["up"]], dim=2)
                                                .flatten(1, 2), requires_grad=False)
        module.down_proj_bias = nn.Parameter(biases["down"], requires_grad=False)
        return
    if kind == "DbrxExperts":  # (E * ffn rows each: gate, up, and down transposed)
        down = stacks["down"].transpose(1, 2)
        for name, stack in (("w1", stacks["gate"]), ("v1", stacks["up"]), ("w2", down)):
            setattr(module.mlp, name, nn.Parameter(stack.flatten(0, 1).contiguous(), requires_grad=False))
        return
    if kind in UNGATED_EXPERT_MODULES:
        module.up_proj = nn.Parameter(stacks["up"], requires_grad=False)
        module.down_proj = nn.Parameter(stacks["down"], requires_grad=False)
        return
    gate_up = stacks["gate_up"] if "gate_up" in stacks else torch.cat([stacks["gate"], stacks["up"]], dim=1)
    module.gate_up_proj = nn.Parameter(gate_up, requires_grad=False)
    module.down_proj = nn.Parameter(stacks["down"], requires_grad=False)


def _embed_scale(module) -> torch.Tensor | None:
    """A scaled embedding's factor (Gemma's), as the module holds it; from its float when the
    module was built on the meta device."""
    scale = getattr(module, "embed_scale", None)
    if scale is not None and scale.is_meta:
        # (on the CPU explicitly: from_pretrained builds the model under a meta device context)
        scale = torch.tensor(module.scalar_embed_scale, device="cpu")
    return scale


def _tie_output_embeddings(model, backend: str) -> None:
    """A GGUF without output.weight shares the token embedding with the output projection."""
    output, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    if isinstance(output, nn.Linear) and output.weight.is_meta:
        if isinstance(embedding, QuantEmbedding):
            model.set_output_embeddings(QuantLinear(embedding.qweight, backend=backend,
                                                    dtype=embedding.dtype))
        elif isinstance(embedding, nn.Embedding) and not embedding.weight.is_meta:
            # a float file (F32, F16, BF16) of a tied model: one parameter for both
            output.weight = embedding.weight
    # The quantized modules share their planes already; transformers' own tying works on
    # `.weight` parameters, which they do not have.
    params = dict(model.named_parameters(remove_duplicate=False))
    tied = getattr(model, "all_tied_weights_keys", None) or {}
    model.all_tied_weights_keys = {k: v for k, v in tied.items() if k in params and v in params}
