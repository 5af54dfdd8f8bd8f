"""The one tensor mapping: GGUF tensor names and values -> an engine's parameters, through
transformers' own GGUF code. Every integration (transformers, vLLM) reads it.

The name map is gguf-py's (as transformers and vLLM use it, via `get_gguf_hf_weights_map`),
with transformers' per-architecture fallback for the names it does not cover (the MoE expert
stacks that it joins, gate and up, into one parameter), and the per-architecture fixes are
transformers' tensor processors. A quantized tensor may only be changed by a row permutation
(llama.cpp permutes llama's Q and K rows for its rope); we find that permutation by running
the processor on the row indices, so the fix applied is exactly transformers', and exact on
the blocks.

No tensor is dropped: a GGUF tensor with no parameter is either in SKIPPED, with the reason,
or an error that names it and the architecture.
"""

from __future__ import annotations

import contextlib
import re

import numpy as np
import torch

from gguf_repack.errors import FormatError, RepackError
from gguf_repack.format.manifest import check_quantization_config
from gguf_repack.runtime.qtensor import QTensor, join_rows

# GGUF tensors that llama.cpp stores and the engines compute instead, by full-name pattern:
# never a parameter, so never loaded; each with the reason.
SKIPPED = {
    r"rope_freqs\.weight": "rope divisors (Llama 3's scaling; Gemma 4's rotated part of a head): "
                           "config.json has the rope parameters they come from "
                           "(converter/hf_config.py), and the engine computes them",
    r"rope_factors_(long|short)\.weight": "LongRoPE's factors: config.json carries them "
                                           "(converter/hf_config.py)",
}


# transformers' one parameter for an expert stack's gate and up rows (llama.cpp's two tensors),
# and gpt-oss's expert biases (gate and up joined there too)
_JOINED_GATE_UP = r"model\.layers\.(?P<bid>\d+)\.(mlp|block_sparse_moe|feed_forward)\.experts\.gate_up_proj"
_EXPERT_BIAS = r"model\.layers\.(?P<bid>\d+)\.mlp\.experts\.(?P<proj>gate_up|down)_proj_bias"
# an expert stack gguf-py names only per expert in the original checkpoint (Nemotron-H's
# mixer.experts.{xid}.up_proj): transformers 5 holds the experts of a layer as one parameter
_EXPERT_STACK = r"model\.layers\.(?P<bid>\d+)\.mixer\.experts\.(?P<proj>up|down)_proj"


# llama.cpp's expert stacks and their biases (one tensor per role, all experts of a layer), by
# full name: the engines place these with their experts module, not one parameter each
EXPERT_TENSOR = re.compile(r"blk\.(?P<block>\d+)\.ffn_(?P<role>gate|up|gate_up|down)_exps\."
                           r"(?P<kind>weight|bias)")


# MLA's kv_b_proj (deepseek2), which llama.cpp's converter splits per head into attn_k_b, the
# key rows transposed to (kv_lora_rank, qk_nope_head_dim), and attn_v_b, the value rows: both
# go to the one parameter, joined by `join_kv_b`
MLA_KV_B_PART = re.compile(r"blk\.(?P<block>\d+)\.attn_(?P<part>k|v)_b\.weight")


# parameters llama.cpp's converter splits by rows into GGUF tensors of their own, by the end of
# the parameter's name: its parts in the parameter's row order, by the part of the GGUF name that
# names them. Qwen3-Next's in_proj_qkvz (gguf-py's ssm_in): attn_qkv (every key head's queries,
# then keys, then values) and attn_gate (z), whose rows per key head, [q, k, v, z], `qkvz_order`
# gives back; Granite's shared expert's input_linear: ffn_gate_shexp's rows, then ffn_up_shexp's
ROW_PARTS = {"in_proj_qkvz.weight": ("attn_qkv", "attn_gate"),
             "shared_mlp.input_linear.weight": ("ffn_gate_shexp", "ffn_up_shexp")}
ROW_PART = re.compile(r"blk\.(?P<block>\d+)\.(?P<part>attn_qkv|attn_gate|ffn_gate_shexp|ffn_up_shexp)"
                      r"\.weight")


def row_parts_of(hf_name: str) -> tuple[str, ...]:
    """The GGUF parts of a ROW_PARTS parameter, in its row order; () for any other parameter."""
    return next((parts for end, parts in ROW_PARTS.items() if hf_name.endswith(end)), ())


def row_part(gguf_name: str, hf_name: str) -> str | None:
    """The part's name where the GGUF tensor is a part of a parameter ROW_PARTS names (and not
    another architecture's attn_qkv, a parameter of its own), else None."""
    m = ROW_PART.fullmatch(gguf_name)
    return m["part"] if m and m["part"] in row_parts_of(hf_name) else None


def qkvz_order(config: dict) -> torch.Tensor:
    """in_proj_qkvz's rows as indices into attn_qkv's rows followed by attn_gate's: per key
    head g its queries, keys, values (its group of value heads) and z, as transformers'
    Qwen3NextGatedDeltaNet splits them."""
    key_heads, key_width = config["linear_num_key_heads"], config["linear_key_head_dim"]
    group_width = config["linear_num_value_heads"] // key_heads * config["linear_value_head_dim"]
    keys = key_heads * key_width
    qkv_rows = 2 * keys + key_heads * group_width
    rows = []
    for g in range(key_heads):
        rows += [torch.arange(key_width) + g * key_width, torch.arange(key_width) + keys + g * key_width,
                 torch.arange(group_width) + 2 * keys + g * group_width,
                 torch.arange(group_width) + qkv_rows + g * group_width]
    return torch.cat(rows)


def joined_from_parts(hf_name: str, found: dict, mapping: "TensorMapping", dtype):
    """A ROW_PARTS parameter from its GGUF parts, `found` = {part: (GGUF name, tensor)}:
    (weight, dequantized GGUF names). Quantized parts of one type are joined exactly (a QTensor:
    rows joined, then reordered where the model's order differs: Qwen3-Next's); float parts are
    joined as floats; parts of two types (llama-quantize's Q4_K_M gives Qwen3-Next's attn_qkv
    Q5_K and attn_gate Q4_K) are held dequantized, named in the second value."""
    parts = row_parts_of(hf_name)
    if set(found) != set(parts):
        raise FormatError(f"{hf_name}: the file has {sorted(found)} of it, not all of "
                          f"{', '.join(parts)}, which make it")
    order = qkvz_order(mapping.config) if hf_name.endswith("in_proj_qkvz.weight") else None
    tensors = [found[part][1] for part in parts]
    if all(isinstance(t, QTensor) for t in tensors) and len({t.qtype for t in tensors}) == 1:
        joined = join_rows(tensors)
        return (joined if order is None else joined.index_rows(order)), []
    quantized = [found[part][0] for part in parts if isinstance(found[part][1], QTensor)]
    values = torch.cat([t.dequantize(torch.float32) if isinstance(t, QTensor) else t.float()
                        for t in tensors])
    return (values if order is None else values[order]).to(dtype), quantized


def join_kv_b(k_b: torch.Tensor, v_b: torch.Tensor) -> torch.Tensor:
    """kv_b_proj's weight (heads * (qk_nope + v), kv_lora) from llama.cpp's attn_k_b (heads,
    kv_lora, qk_nope) and attn_v_b (heads, v, kv_lora): per head its key rows, then its value
    rows, as transformers' MLA splits them."""
    if k_b.dim() != 3 or v_b.dim() != 3 or k_b.shape[0] != v_b.shape[0] or k_b.shape[1] != v_b.shape[2]:
        raise RepackError(f"attn_k_b {list(k_b.shape)} and attn_v_b {list(v_b.shape)} are not the "
                          f"two parts of one MLA kv_b_proj (heads, kv_lora, qk_nope) and (heads, v, kv_lora)")
    return torch.cat([k_b.transpose(1, 2), v_b], dim=1).reshape(-1, k_b.shape[1])


def kv_b_from_parts(hf_name: str, found: dict, mapping: TensorMapping,
                    dtype) -> tuple[torch.Tensor, list[str]]:
    """MLA's kv_b_proj weight `hf_name` from llama.cpp's two parts, `found` = {"k": (GGUF name,
    tensor), "v": ...} as the file holds them (a QTensor or float): joined exactly in float, a
    quantized part dequantized first (its blocks run along the other axis of kv_b_proj, which
    no row order undoes). Returns the weight and the GGUF names of the quantized parts."""
    if set(found) != {"k", "v"}:
        raise FormatError(f"{hf_name}: the file has {found[next(iter(found))][0]} without its "
                          f"other half (attn_k_b and attn_v_b make MLA's kv_b_proj)")
    values, quantized = {}, []
    for part, (gguf_name, tensor) in found.items():
        if isinstance(tensor, QTensor):
            quantized.append(gguf_name)
            tensor = tensor.dequantize(torch.float32)
        values[part] = mapping.plain(gguf_name, tensor, dtype)
    return join_kv_b(values["k"], values["v"]), quantized


MTP_LAYER = ("a multi-token-prediction layer (num_nextn_predict_layers in config.json): a draft "
             "model for speculative decoding, which the model's own forward pass does not run")


def skip_reason(gguf_name: str, config: dict | None = None) -> str | None:
    """Why a GGUF tensor with no parameter is not loaded (SKIPPED; the layers past the model's
    own that llama.cpp writes for multi-token prediction: GLM-4.5's blk.N.nextn.* and the
    layer around them), or None."""
    if why := next((why for pattern, why in SKIPPED.items() if re.fullmatch(pattern, gguf_name)), None):
        return why
    config = config or {}
    block = re.match(r"blk\.(\d+)\.", gguf_name)
    draft = config.get("num_nextn_predict_layers") or config.get("mtp_num_hidden_layers")  # (Qwen's)
    if block and draft and int(block[1]) >= config["num_hidden_layers"]:
        return MTP_LAYER
    return None


# architectures outside transformers' GGUF mapping whose tensors llama.cpp's converter changes
# as it does another's, by the architecture whose transformers fix undoes it: llama's Q/K rows
# permuted for its rope (LlamaModel's subclasses with undo_permute), Gemma's norms stored 1 + w
SAME_FIX_AS = {"granite": "llama", "granitemoe": "llama", "granitehybrid": "llama", "arcee": "llama",
               "smollm3": "llama", "mistral3": "llama", "gemma": "gemma2", "qwen3vl": "qwen3",
               "qwen3vlmoe": "qwen3moe"}


# GGUF tensors llama.cpp's converter stacks from several parameters, by name: the parameter of
# slice {i} along the first axis (Gemma 3n's AltUp projections, three linear layers as one
# (3, hidden, hidden) tensor; each slice is whole rows of blocks: exact)
STACKED_PARAMETERS = {"altup_proj.weight": "model.altup_projections.{i}.weight",
                      "altup_unembd_proj.weight": "model.altup_unembed_projections.{i}.weight"}


def stack_slice(tensor, index: int):
    """Slice `index` of a stacked GGUF tensor (STACKED_PARAMETERS), quantized or float."""
    return tensor.expert(index) if isinstance(tensor, QTensor) else tensor[index]


# parameters llama.cpp's converter writes as metadata, one value per layer, not as tensors, by
# architecture: (the key, the parameter of layer {bid}). Apertus's xIELU activation: alpha_n and
# alpha_p as the parameters hold them (before their softplus), beta and eps (buffers)
METADATA_PARAMETERS = {"apertus": [(f"xielu.{name}", f"model.layers.{{bid}}.mlp.act_fn.{name}")
                                   for name in ("alpha_n", "alpha_p", "beta", "eps")]}


# parameters llama.cpp's converter renames before it maps the name, as (the parameter's name, the
# name the converter maps): Qwen3-Next's and Qwen3.5's dt_bias, LFM2-MoE's expert_bias
CONVERTER_RENAMES = [(r"\.dt_bias$", ".dt_proj.bias"), (r"\.expert_bias$", ".expert_bias.bias")]


# parameters llama.cpp's converter names by hand, past gguf-py's map, per architecture: (the
# parameter's name, its GGUF names): Gemma 4's router input scale and per-expert output scale;
# Granite's shared expert's input_linear, written as two tensors (ROW_PARTS)
_SHARED_INPUT = (r"model\.layers\.(\d+)\.shared_mlp\.input_linear\.weight",
                 (r"blk.\1.ffn_gate_shexp.weight", r"blk.\1.ffn_up_shexp.weight"))
CONVERTER_NAMES = {"gemma4": [
    (r"model\.layers\.(\d+)\.router\.scale", (r"blk.\1.ffn_gate_inp.scale",)),
    (r"model\.layers\.(\d+)\.router\.per_expert_scale", (r"blk.\1.ffn_down_exps.scale",))],
    "granitehybrid": [_SHARED_INPUT], "granitemoe": [_SHARED_INPUT]}


def tensor_processor(gguf_arch: str, config: dict):
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    if gguf_arch in QWEN_DELTA_NET:
        return _qwen_delta_net_processor(TensorProcessor)(config=config)
    base = TENSOR_PROCESSORS.get(SAME_FIX_AS.get(gguf_arch, gguf_arch), TensorProcessor)
    if gguf_arch in SSM_A_STORED:
        return _ssm_a_processor(base)(config=config)
    return base(config=config)


# llama.cpp's architectures with Mamba-2 layers, and Jamba's Mamba layers, whose converter stores
# A_log as ssm_a = -exp(A_log) (transformers' GGUF path undoes it for mamba alone)
SSM_A_STORED = ("granitehybrid", "mamba2", "nemotron_h", "nemotron_h_moe", "falcon-h1", "jamba")


def _ssm_a_processor(base):
    """`base` (the architecture's own processor: llama's Q/K rows for Granite) with
    ssm_a = -exp(A_log) undone."""
    from transformers.modeling_gguf_pytorch_utils import GGUFTensor

    class SsmAProcessor(base):
        def process(self, weights, name, **kwargs):
            if re.fullmatch(r"blk\.\d+\.ssm_a", name):
                return GGUFTensor(np.log(-weights), name, {})
            return super().process(weights, name, **kwargs)

    return SsmAProcessor


# llama.cpp's architectures of Qwen's gated delta-net models, whose converter changes values and
# row orders transformers' GGUF path has no fix for
QWEN_DELTA_NET = ("qwen35", "qwen35moe", "qwen3next")


def _qwen_delta_net_processor(base):
    """What llama.cpp's converter does to Qwen3-Next's and Qwen3.5's float tensors, undone (a
    processor as transformers' are): the norms stored as 1 + w (but the delta-net's gated norm,
    ssm_norm), A_log stored as ssm_a = -exp(A_log). Row and column orders: converter_row_order,
    qkvz_order."""
    from transformers.modeling_gguf_pytorch_utils import GGUFTensor

    class QwenDeltaNetProcessor(base):
        def process(self, weights, name, **kwargs):
            if name.endswith("norm.weight") and not name.endswith("ssm_norm.weight"):
                weights = weights - 1
            elif re.fullmatch(r"blk\.\d+\.ssm_a", name):
                weights = np.log(-weights)
            return GGUFTensor(weights, name, {})

    return QwenDeltaNetProcessor


def gguf_to_hf_names(model, gguf_arch: str, processor) -> dict[str, str]:
    """{GGUF tensor name: parameter name in `model`} (a transformers model, any device).

    What transformers' `get_gguf_hf_weights_map` computes, with gguf-py's name map built once:
    that function rebuilds it for every submodule (397 times for SmolLM2, 6.7 s)."""
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map

    arch = next((a for a, name in MODEL_ARCH_NAMES.items() if name == gguf_arch), None)
    if arch is None:
        raise RepackError(f"gguf {_gguf_version()} has no tensor names for architecture {gguf_arch!r}")
    name_map = get_tensor_name_map(arch, model.config.num_hidden_layers)
    renames = checkpoint_renames(model.config.model_type)
    names: dict[str, str] = {}
    by_hand = CONVERTER_NAMES.get(gguf_arch, [])
    for hf_name in model.state_dict(keep_vars=True):
        if by_name := [(pattern, targets) for pattern, targets in by_hand if re.fullmatch(pattern, hf_name)]:
            pattern, targets = by_name[0]
            for target in targets:
                names.setdefault(re.sub(pattern, target, hf_name), hf_name)
            continue
        # transformers also tries each submodule with its own prefix dropped (a GGUF converted
        # from the base model); the outer name wins. gguf-py's map knows the names of the
        # original checkpoints, which transformers 5 renames for some models (GraniteMoe's
        # router.layer is router): those are tried after the name itself
        renamed = {re.sub(target, source, hf_name)
                   for target, source in renames + CONVERTER_RENAMES} - {hf_name}
        spellings = [hf_name, *sorted(renamed)]
        candidates = [".".join(parts[start:]) for name in spellings for parts in [name.split(".")]
                      for start in range(len(parts) - 1)]
        # a layer's parameter is a tensor of that layer: a suffix that drops the layer (Nemotron-H's
        # model.layers.0.mixer.norm as `norm`, the output norm) is not its name
        layer = re.search(r"\.(\d+)\.", hf_name)
        for inner in candidates:
            base, dot, suffix = processor.preprocess_name(inner).rpartition(".")
            if suffix not in ("weight", "bias"):
                full = processor.preprocess_name(inner)
                if full.endswith("_bias") and name_map.get_name(full[:-5]) is not None:
                    # a bias named x_bias (DeepSeek-V3's e_score_correction_bias, a buffer),
                    # which llama.cpp's converter renames x.bias before it maps the name
                    base, dot, suffix = full[:-5], ".", "bias"
                else:
                    # a parameter without a suffix: GGUF names it without one (Mamba's ssm_a)
                    # or, for a 3-D expert stack, .weight
                    base, dot, suffix = full, "", ""
            gguf_name = name_map.get_name(base)
            if gguf_name is None and suffix and (whole := name_map.get_name(f"{base}.{suffix}")):
                # gguf-py's map holds a few names with their suffix (Falcon-H1's
                # pre_ff_layernorm.weight): the GGUF tensor has none of its own (blk.N.ffn_norm)
                gguf_name, dot, suffix = whole, "", ""
            if gguf_name is not None and layer and not gguf_name.startswith(f"blk.{layer[1]}."):
                continue
            if gguf_name is not None and gguf_name.endswith(".ffn_gate_up_exps"):
                # (gguf-py names transformers' joined stack, which llama.cpp's converter writes
                # as its gate and up halves: Qwen3.5-MoE)
                for half in ("gate", "up"):
                    names.setdefault(gguf_name.replace("gate_up", half) + ".weight", hf_name)
            if gguf_name is not None:
                names.setdefault(gguf_name + dot + suffix, hf_name)
                if not suffix:
                    names.setdefault(gguf_name + ".weight", hf_name)
                    if hf_name.endswith("bias"):  # (AFMoE's expert_bias: the converter's x.bias)
                        names.setdefault(gguf_name + ".bias", hf_name)
                break
        else:
            # transformers' own fallback, for what gguf-py's map cannot say (gate and up
            # expert stacks joined into one parameter)
            fallback: dict[str, str] = {}
            inner = processor.preprocess_name(hf_name)
            suffix = "." + inner.rpartition(".")[2] if inner.endswith((".weight", ".bias")) else ""
            processor.perform_fallback_tensor_mapping(fallback, suffix, "", inner)
            if not fallback and (m := re.fullmatch(_JOINED_GATE_UP, inner)):
                # the same join where transformers' processor for the architecture has no
                # fallback (Mixtral, written as llama)
                fallback = {f"blk.{m['bid']}.ffn_{w}_exps": hf_name for w in ("gate", "up")}
            if not fallback and (m := re.fullmatch(_EXPERT_STACK, inner)):
                fallback = {f"blk.{m['bid']}.ffn_{m['proj']}_exps": hf_name}
            if not fallback and (m := re.fullmatch(_EXPERT_BIAS, inner)):
                fallback = {f"blk.{m['bid']}.ffn_{w}_exps.bias": hf_name
                            for w in (("gate", "up") if m["proj"] == "gate_up" else ("down",))}
            for gguf_name in fallback:
                names.setdefault(gguf_name if gguf_name.endswith((".weight", ".bias"))
                                 else gguf_name + ".weight", hf_name)
    return names


def checkpoint_renames(model_type: str) -> list[tuple[str, str]]:
    """transformers' renamings of a model type's checkpoint names, each as (the pattern of
    its name now, the checkpoint's): Mixtral's `.mlp.` was `.block_sparse_moe.`, GraniteMoe's
    `router.weight` was `router.layer.weight`."""
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping
    from transformers.core_model_loading import WeightRenaming

    # (not those whose new name refers to groups of the old: Qwen3.5's prefix change from its
    # multimodal checkpoint, model.language_model.(.+) -> model.\1, is no pattern to undo)
    return [(target, source.replace("\\", ""))
            for w in get_checkpoint_conversion_mapping(model_type) or [] if isinstance(w, WeightRenaming)
            for source, target in zip(w._original_source_patterns, w._original_target_patterns)
            if not re.search(r"\\\d", target)]


def _gguf_version() -> str:
    from importlib.metadata import version

    return version("gguf")


def row_permutation(processor, name: str, n_rows: int, n_cols: int) -> torch.Tensor | None:
    """The row order transformers' processor gives tensor `name` of `n_rows` rows, or None when
    it leaves the rows alone. Raises when the fix is more than a row permutation: that would
    need the weights dequantized."""
    probe = np.arange(n_rows, dtype=np.float64)[:, None]
    try:
        result = processor.process(weights=probe, name=name).weights
    except ValueError:
        # a fix that reshapes by the row width (Bloom's fused QKV): the probe at full width,
        # every column its row's index (float32 holds row indices exactly up to 2**24)
        full = np.broadcast_to(probe.astype(np.float32), (n_rows, n_cols))
        result = processor.process(weights=full, name=name).weights
        if result.shape != full.shape or not (result == result[:, :1]).all():
            raise RepackError(f"{name}: transformers changes this tensor's values on load, which "
                              f"a quantized weight cannot follow exactly") from None
        result = result[:, :1].astype(np.float64)
    rows = np.asarray(result).reshape(-1)
    if np.array_equal(rows, probe[:, 0]):
        return None
    if result.shape != probe.shape or not np.array_equal(np.sort(rows), probe[:, 0]):
        raise RepackError(f"{name}: transformers changes this tensor's values on load, which a "
                          f"quantized weight cannot follow exactly")
    return torch.from_numpy(rows.astype(np.int64))


def converter_row_order(config: dict, gguf_name: str) -> torch.Tensor | None:
    """Row orders llama.cpp's converter changes that transformers' GGUF path does not undo:
    Falcon-40B's fused QKV, which the converter regroups from (per KV group: its queries, one
    key, one value) to (all queries, all keys, all values); Qwen3.5's value heads
    (_value_head_order). The rows of the model's order, as indices into the file's."""
    if config.get("model_type") in QWEN_DELTA_NET_TYPES:
        return _value_head_order(config, gguf_name, "rows")
    if not (config.get("model_type") == "falcon" and config.get("new_decoder_architecture")
            and re.fullmatch(r"blk\.\d+\.attn_qkv\.(weight|bias)", gguf_name)):
        return None
    n_head, n_kv = config["num_attention_heads"], config["num_kv_heads"]
    head_dim = config["hidden_size"] // n_head
    heads = []  # the file's head index of each head in the model's order
    for group in range(n_kv):
        heads += [group * (n_head // n_kv) + j for j in range(n_head // n_kv)]
        heads += [n_head + group, n_head + n_kv + group]
    return (torch.tensor(heads)[:, None] * head_dim + torch.arange(head_dim)).reshape(-1)


# transformers' model types of Qwen3.5 (QWEN_DELTA_NET), whose value heads the converter reorders
QWEN_DELTA_NET_TYPES = ("qwen3_5_text", "qwen3_5_moe_text")


def converter_column_order(config: dict, gguf_name: str) -> torch.Tensor | None:
    """The column order of the model's weight as indices into the file's, where llama.cpp's
    converter reorders columns: Qwen3.5's delta-net output projection (_value_head_order)."""
    if config.get("model_type") in QWEN_DELTA_NET_TYPES:
        return _value_head_order(config, gguf_name, "columns")
    return None


def _value_head_order(config: dict, gguf_name: str, axis: str) -> torch.Tensor | None:
    """Where Qwen3.5's delta-net has more value heads than key heads, each key head serves a
    group of value heads, and the model orders the value heads by group (k0: v0 v1, k1: v2 v3);
    llama.cpp's converter reorders them by their place in the group (v0 v2 v1 v3: ggml repeats
    the key heads whole) in every tensor with a value-head axis: the rows of the value part of
    attn_qkv and of ssm_conv1d, of attn_gate (z), ssm_alpha, ssm_beta, ssm_a and ssm_dt, and the
    columns of ssm_out. The model's order as indices into the file's, or None."""
    key_heads, value_heads = config["linear_num_key_heads"], config["linear_num_value_heads"]
    m = re.fullmatch(r"blk\.\d+\.(\w+?)(\.weight|\.bias)?", gguf_name)
    if value_heads == key_heads or not m:
        return None
    group = value_heads // key_heads

    def by_group(width: int) -> torch.Tensor:
        # the model's (key head k, place j, element d) is the file's (j, k, d)
        k, j, d = torch.meshgrid(torch.arange(key_heads), torch.arange(group), torch.arange(width),
                                 indexing="ij")
        return ((j * key_heads + k) * width + d).reshape(-1)

    kind, value_width = m[1], config["linear_value_head_dim"]
    if axis == "columns":
        return by_group(value_width) if kind == "ssm_out" else None
    if kind in ("attn_qkv", "ssm_conv1d"):  # queries and keys first, as they are
        qk = 2 * key_heads * config["linear_key_head_dim"]
        return torch.cat([torch.arange(qk), qk + by_group(value_width)])
    if kind == "attn_gate":
        return by_group(value_width)
    if kind in ("ssm_alpha", "ssm_beta", "ssm_a", "ssm_dt"):
        return by_group(1)
    return None


def _squeezed(shape) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


def process_plain(processor, name: str, tensor: torch.Tensor) -> torch.Tensor:
    """A float tensor (norm, bias, F16/F32 weight) with transformers' fix applied (gemma's norms
    are stored as w + 1), on the tensor's own device. transformers' processors take numpy
    arrays, so a tensor on a GPU goes through the host (these are small: norms and biases)."""
    result = processor.process(weights=tensor.cpu().numpy(), name=name).weights
    return torch.from_numpy(np.ascontiguousarray(result)).to(tensor.device)


def _metadata_parameters(arch: str, metadata: dict, params: dict) -> dict[str, torch.Tensor]:
    """The parameters of METADATA_PARAMETERS[arch], from the file's keys: float32, in the
    parameters' shapes. Raises, naming the key, where the file does not have one per layer."""
    found = {}
    for key, pattern in METADATA_PARAMETERS.get(arch, []):
        values = metadata.get(key)
        layers = [pattern.format(bid=bid) for bid in range(len(values or []))]
        if values is None or not layers or any(name not in params for name in layers) or \
                pattern.format(bid=len(layers)) in params:
            raise FormatError(f"{key}: {arch} models have one value per layer there, for "
                              f"{pattern.format(bid='N')}; the file has {values!r}")
        for name, value in zip(layers, values):
            found[name] = torch.tensor(float(value), dtype=torch.float32).reshape(params[name].shape)
    return found


class TensorMapping:
    """The GGUF tensors of `repacked` and the parameter of a transformers model each goes to
    (`names`, in the directory's order), and transformers' per-architecture fixes, for any
    integration that loads them. Raises, naming them, for tensors with no parameter and no
    reason to be skipped."""

    def __init__(self, model, repacked):
        arch = repacked.metadata["general.architecture"]
        self.config = model.config.to_dict()
        self.processor = tensor_processor(arch, self.config)
        hf_names = gguf_to_hf_names(model, arch, self.processor)
        for name in repacked:
            joined = (f"blk.{m['block']}.attn_kv_b.weight" if (m := MLA_KV_B_PART.fullmatch(name)) else
                      f"blk.{m['block']}.ssm_in.weight" if (m := ROW_PART.fullmatch(name))
                      and m["part"].startswith("attn_") else None)
            if joined in hf_names and joined not in repacked and name not in hf_names:
                hf_names[name] = hf_names[joined]  # (the file has the parts, not the joined one)
        params = model.state_dict(keep_vars=True)
        # {parameter: (GGUF name, slice)} of the STACKED_PARAMETERS the file has
        self.stacked: dict[str, tuple[str, int]] = {}
        stacks: dict[str, list[str]] = {}  # GGUF name -> its parameters, slice by slice
        for name, pattern in STACKED_PARAMETERS.items():
            if name in repacked and name not in hf_names:
                stacks[name] = [pattern.format(i=i) for i in range(repacked[name].shape[0])]
                if missing := [hf for hf in stacks[name] if hf not in params]:
                    raise RepackError(f"{name}: {len(stacks[name])} stacked weights, and "
                                      f"transformers' {type(model).__name__} has no {missing[0]}")
                self.stacked.update({hf: (name, i) for i, hf in enumerate(stacks[name])})
                hf_names[name] = stacks[name][0]
        self.names = [(name, hf) for name in repacked if name in hf_names
                      for hf in stacks.get(name, [hf_names[name]])]
        self._shapes = {name: tuple(params[hf].shape) for name, hf in self.names if hf in params}
        # {parameter: float32 value} of METADATA_PARAMETERS
        self.from_metadata = _metadata_parameters(arch, repacked.metadata, params)
        self.skipped, unmapped = {}, []
        for name in (n for n in repacked if n not in hf_names):
            if reason := skip_reason(name, self.config):
                self.skipped[name] = reason
            else:
                unmapped.append(name)
        if unmapped:
            raise RepackError(
                f"{len(unmapped)} GGUF tensors of this {arch!r} model have no parameter in "
                f"transformers' {type(model).__name__}: {', '.join(unmapped[:4])}"
                f"{', ...' if len(unmapped) > 4 else ''} (the tensor mapping does not know them; "
                f"nothing was dropped)")

    @classmethod
    def for_output(cls, repacked) -> "TensorMapping":
        """From the output directory's config.json, with the model built on the meta device."""
        from transformers import AutoConfig

        return cls(meta_model(AutoConfig.from_pretrained(repacked.path)), repacked)

    def plain(self, gguf_name: str, tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if (rows := converter_row_order(self.config, gguf_name)) is not None:
            tensor = tensor[rows]
        if (columns := converter_column_order(self.config, gguf_name)) is not None:
            tensor = tensor[..., columns]
        tensor = process_plain(self.processor, gguf_name, tensor.float()).to(dtype)
        shape = self._shapes.get(gguf_name)
        if shape and tuple(tensor.shape) != shape and (_squeezed(tensor.shape) == _squeezed(shape) or
                                                        (len(shape) == 1 and tensor.numel() == shape[0])):
            # the same values with a unit dimension more or less (llama.cpp writes Qwen2-MoE's
            # shared-expert gate [1, hidden] as [1, 1, hidden] in torch order), or a vector
            # the converter stored as rows (Mamba-2's gated norm, one row per group)
            tensor = tensor.reshape(shape)
        return tensor

    def columns_on_blocks(self, gguf_name: str, weight) -> bool:
        """Whether the quantized `weight` takes the model's column order exactly (no reorder, or
        one of whole blocks). Qwen3.5's ssm_out in a K-quant does not: value heads of 128
        columns in blocks of 256, which only its dequantized values can follow."""
        columns = converter_column_order(self.config, gguf_name)
        return columns is None or column_blocks(columns, weight.block_size) is not None

    def quantized(self, gguf_name: str, weight, conv1d: bool = False):
        """The QTensor as transformers would have it: rows permuted where it permutes them.
        `conv1d`: the parameter is a transformers Conv1D's, (in, out), which transformers fills
        with the tensor transposed; the QTensor stays (out, in), as a linear layer holds it."""
        if conv1d:
            probe = np.zeros((weight.shape[-2], 1))
            if self.processor.process(weights=probe, name=gguf_name).weights.shape != probe.T.shape:
                raise RepackError(f"{gguf_name}: a Conv1D weight that transformers does not transpose")
            return weight
        if (own := converter_row_order(self.config, gguf_name)) is not None:
            weight = weight.index_rows(own)
        if (columns := converter_column_order(self.config, gguf_name)) is not None:
            blocks = column_blocks(columns, weight.block_size)
            if blocks is None:
                raise RepackError(f"{gguf_name}: its column order moves parts of {weight.qtype.name} "
                                  f"blocks (columns_on_blocks says so first)")
            weight = weight.index_blocks(blocks)
        rows = row_permutation(self.processor, gguf_name, weight.shape[-2], weight.shape[-1])
        return weight if rows is None else weight.index_rows(rows)


def column_blocks(columns: torch.Tensor, block_size: int) -> torch.Tensor | None:
    """A column order as an order of whole blocks (each block's columns kept together, in
    order), or None where it splits blocks."""
    if len(columns) % block_size:
        return None
    runs = columns.reshape(-1, block_size)
    starts = runs[:, 0]
    if (starts % block_size).any() or not torch.equal(runs, starts[:, None] + torch.arange(block_size)):
        return None
    return starts // block_size


@contextlib.contextmanager
def without_quantization_config(config):
    """`config` without its quantization_config (checked first) while a model is built from
    it: from_config would look for a quantizer, and the weights are placed by the caller."""
    quantization = getattr(config, "quantization_config", None)
    if quantization is None:
        yield config
        return
    check_quantization_config(quantization if isinstance(quantization, dict) else quantization.to_dict())
    del config.quantization_config
    try:
        yield config
    finally:
        config.quantization_config = quantization


def meta_model(config):
    """The model for `config` with every tensor on the meta device: its parameter names, no
    memory (and no accelerate, which vLLM does not install)."""
    from transformers import AutoModelForCausalLM

    with without_quantization_config(config), torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32)
