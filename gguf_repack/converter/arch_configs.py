"""config.json for the architectures transformers' GGUF mapping lacks: one table per architecture,
GGUF key -> config field, the inverse of the `set_gguf_parameters` of each model class in
llama.cpp's `convert_hf_to_gguf.py` (its `conversion/` package).

Most of these models are a llama with a twist, and llama.cpp's converter writes the same keys
for all of them (TextModel.set_gguf_parameters: widths, heads, rope base, norm epsilon, expert
counts); `hf_config.COMMON_FIELDS` reads those, each architecture's table adds its own keys
or renames a field.
What the converter writes no key for, llama.cpp reads off the tensors the file has (biases, q/k
norms) or fixes per architecture; `own_config` does the same, so the model transformers builds
from config.json is the one llama.cpp runs. DeepSeek and GLM-4.5, whose configs take more than a
table, are functions of hf_config.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .hf_config import (
    COMMON_FIELDS,
    GATING_SIGMOID,
    TOKEN_IDS,
    any_block_has,
    deepseek2_config,
    glm4moe_config,
)


@dataclass(frozen=True)
class ArchConfig:
    """How one llama.cpp architecture's metadata becomes transformers' config."""

    model_type: str
    # key after "<arch>." -> config field, over COMMON_FIELDS (None: not one of this class's)
    fields: dict[str, str | None] = field(default_factory=dict)
    # fields llama.cpp fixes for the architecture (it writes no key for them)
    fixed: dict = field(default_factory=dict)
    # llama.cpp's sliding-window layers when the file has no pattern key: every n-th global
    swa_period: int | None = None
    # the rotated part of a head may be less than the head (rope.dimension_count)
    partial_rope: bool = False
    # more fields from (get, tensor_names), for what a table cannot say
    details: Callable[[Callable, set], dict] | None = None
    # the model type of a variant llama.cpp writes under this architecture's name, from (get,
    # tensor_names), or None for model_type's (Olmo 3 is olmo2 with a sliding window)
    variant: Callable[[Callable, set], str | None] | None = None


def _ernie_moe(get, tensor_names) -> dict:
    layers = int(get("block_count"))
    return {"moe_layer_end_index": layers - 1,
            # whether the router has ERNIE's correction bias (moe_statics: llama.cpp's
            # exp_probs_b), as ERNIE's config.json says it; vLLM's model creates it by this
            "moe_use_aux_free": any_block_has(tensor_names, "exp_probs_b.bias")}


def _minimax_m2(get, tensor_names) -> dict:
    if get("expert_gating_func") not in (None, GATING_SIGMOID):
        raise ValueError(f"expert gating function {get('expert_gating_func')}: MiniMax-M2 routes by "
                         f"sigmoid scores")
    # as MiniMax's own config.json says them (vLLM's model reads these three): sigmoid scores,
    # the correction bias where the file has it, q/k norms over all heads at once
    return {"scoring_func": "sigmoid", "use_routing_bias": any_block_has(tensor_names, "exp_probs_b.bias"),
            "use_qk_norm": any_block_has(tensor_names, "attn_q_norm.weight"), "qk_norm_type": "per_layer"}


def _llama4(get, tensor_names) -> dict:
    if get("attention.sliding_window") == 0:
        # (llama.cpp: a zero window is MobileLLM-R1's llama4: no chunks, rope on every layer)
        return {"attention_chunk_size": None, "no_rope_layers": [1] * int(get("block_count"))}
    # what llama.cpp fixes for Llama 4: attention in chunks of 8192 on the rope layers, every
    # fourth layer without rope and with the attention temperature (floor 8192, scale 0.1),
    # q/k L2 norms except in the 128-expert model (Maverick), as its config.json says
    return {"attention_chunk_size": 8192, "no_rope_layer_interval": 4, "attn_temperature_tuning": True,
            "floor_scale": 8192, "attn_scale": 0.1, "use_qk_norm": int(get("expert_count") or 0) != 128}


def _granitemoe_shared(get, tensor_names) -> str | None:
    # GraniteMoeShared: GraniteMoe with a shared expert (ffn_*_shexp, gate and up joined back:
    # tensor_map.ROW_PARTS), a class of its own in transformers and vLLM
    return "granitemoeshared" if any_block_has(tensor_names, "ffn_up_shexp.weight") else None


def _olmo3(get, tensor_names) -> str | None:
    # Olmo 3: llama.cpp writes it as olmo2 with a sliding window (three layers to one global)
    return "olmo3" if get("attention.sliding_window") else None


def _phimoe(get, tensor_names) -> dict:
    # (PhiMoE's LayerNorms take their epsilon from rms_norm_eps, which the converter writes)
    return {"attention_bias": any_block_has(tensor_names, "attn_q.bias"),
            "lm_head_bias": "output.bias" in tensor_names}


def _exaone_moe(get, tensor_names) -> dict:
    layers, nextn = int(get("block_count")), int(get("nextn_predict_layers") or 0)
    dense = int(get("leading_dense_block_count") or 0)
    gating = get("expert_gating_func")
    if gating not in (None, GATING_SIGMOID):
        raise ValueError(f"expert gating function {gating}: transformers' ExaoneMoe computes sigmoid scores")
    # the block count llama.cpp writes includes the multi-token-prediction layers (as GLM's)
    return {"num_hidden_layers": layers - nextn, "num_nextn_predict_layers": nextn,
            "mlp_layer_types": ["dense" if i < dense else "sparse" for i in range(layers - nextn)],
            "norm_topk_prob": bool(get("expert_weights_norm"))}


def _afmoe(get, tensor_names) -> dict:
    if get("expert_gating_func") not in (None, GATING_SIGMOID):
        raise ValueError(f"expert gating function {get('expert_gating_func')}: AFMoE routes by "
                         f"sigmoid scores")
    if not get("expert_weights_norm"):
        raise ValueError("the chosen experts' weights not normalized: transformers' AFMoE always "
                         "normalizes them")
    # as Arcee's own config.json says them (vLLM's model reads these); llama.cpp always scales
    # the embeddings by sqrt(hidden) (muP), which transformers does with mup_enabled
    return {"score_func": "sigmoid", "route_norm": True, "mup_enabled": True,
            "n_group": int(get("expert_group_count") or 1),
            "topk_group": int(get("expert_group_used_count") or 1)}


def _delta_net(get, tensor_names) -> dict:
    """Qwen3-Next's and Qwen3.5's gated delta-net: the value heads' width and which layers are
    delta-net ones (the others full attention)."""
    # the block count llama.cpp writes includes the multi-token-prediction layers (the
    # checkpoint's mtp.*, which the converter keeps unless told --no-mtp), as GLM's
    blocks, nextn = int(get("block_count")), int(get("nextn_predict_layers") or 0)
    layers = blocks - nextn
    value_heads = int(get("ssm.time_step_rank"))
    recurrent = get("attention.recurrent_layers")
    if recurrent is None:  # (llama.cpp's default: every n-th layer full attention)
        interval = int(get("full_attention_interval") or 4)
        recurrent = [(i + 1) % interval != 0 for i in range(layers)]
    if len(recurrent) not in (layers, blocks):
        raise ValueError(f"recurrent_layers of {len(recurrent)} layers for {layers}")
    config = {"num_hidden_layers": layers,
              "linear_value_head_dim": int(get("ssm.inner_size")) // value_heads,
              "layer_types": ["linear_attention" if bool(r) else "full_attention"
                              for r in recurrent[:layers]]}
    if nextn:
        config["mtp_num_hidden_layers"] = nextn  # (Qwen's name for it, which vLLM's draft reads)
    return config


def _qwen35(get, tensor_names) -> dict:
    # Qwen3.5 rotates by interleaved multimodal rope, one section per position axis (text
    # gives the three the same positions); the converter writes four sections, the last 0
    sections = get("rope.dimension_sections")
    sections = [11, 11, 10, 0] if sections is None else [int(n) for n in sections]
    return {**_delta_net(get, tensor_names),
            "rope_parameters": {"mrope_section": sections[:3], "mrope_interleaved": True}}


def _gemma4(get, tensor_names) -> dict:
    """Gemma 4: global layers of wider heads (and, with attention_k_eq_v, fewer KV heads and
    keys for values), the last layers reusing earlier layers' keys and values, per-layer input
    embeddings (E2B, E4B), an MoE block beside the MLP (26B-A4B)."""
    layers = int(get("block_count"))
    pattern = get("attention.sliding_window_pattern")
    swa = [] if pattern is None else [bool(s) for s in pattern]
    if len(swa) != layers:
        raise ValueError(f"a sliding-window pattern of {len(swa)} layers for {layers}")
    config = {"head_dim": int(get("attention.key_length_swa") or get("attention.key_length")),
              "global_head_dim": int(get("attention.key_length"))}
    # keys for values on the global layers: the converter writes attn_k there and no attn_v
    config["attention_k_eq_v"] = k_eq_v = any(
        f"blk.{i}.attn_k.weight" in tensor_names and f"blk.{i}.attn_v.weight" not in tensor_names
        for i in range(layers) if not swa[i])
    kv = get("attention.head_count_kv")
    if kv is not None and np.ndim(kv):  # (one count per layer)
        local = {int(n) for n, s in zip(kv, swa) if s}
        wide = {int(n) for n, s in zip(kv, swa) if not s}
        if len(local) > 1 or len(wide) > 1:
            raise ValueError(f"KV heads per layer {list(kv)}: Gemma 4 has one count per layer kind")
        config["num_key_value_heads"] = next(iter(local or wide))
        if wide and wide != local:
            if not k_eq_v:  # (transformers' config takes the global layers' count only with it)
                raise ValueError(f"KV heads per layer {list(kv)} without keys for values")
            config["num_global_key_value_heads"] = next(iter(wide))
    shared = int(get("attention.shared_kv_layers") or 0)
    ff = get("feed_forward_length")
    if ff is not None and np.ndim(ff):  # (the layers that reuse keys and values: twice as wide)
        ff = [int(n) for n in ff]
        double = [ff[0] * 2 if i >= layers - shared else ff[0] for i in range(layers)]
        if ff not in ([ff[0]] * layers, double):
            raise ValueError(f"MLP widths per layer {ff}: Gemma 4's are one width, or twice it on "
                             f"the layers that reuse keys and values")
        config.update(intermediate_size=ff[0], use_double_wide_mlp=ff == double and shared > 0)
    config["enable_moe_block"] = int(get("expert_count") or 0) > 0
    return config


def _gemma3n(get, tensors) -> dict:
    """Gemma 3n (E2B, E4B; text): AltUp, LAuReL blocks, per-layer input embeddings, the last
    layers reusing earlier layers' keys and values, Gaussian top-k activation sparsity on the
    first layers. llama.cpp's converter writes the sparsity as the normal distribution's
    quantile of each layer's fraction (activation_sparsity_scale; -inf for none), which
    transformers computes from the fraction: the fraction is its CDF."""
    from math import erfc, isinf, sqrt

    layers = int(get("block_count"))
    scale = get("activation_sparsity_scale")
    scale = [float("-inf")] * layers if scale is None else [float(s) for s in scale]
    if len(scale) != layers:
        raise ValueError(f"activation_sparsity_scale: {len(scale)} values for {layers} layers")
    # (the CDF by erfc, exact in the tail; -inf is 0: no sparsity)
    pattern = [0.0 if isinf(s) and s < 0 else 0.5 * erfc(-s / sqrt(2)) for s in scale]
    laurel = tensors.get("blk.0.laurel_l.weight") if isinstance(tensors, dict) else None
    if laurel is None:
        raise ValueError("no blk.0.laurel_l.weight, whose rows are Gemma 3n's LAuReL rank")
    ff = get("feed_forward_length")  # (one MLP width per layer, or one for all)
    ff = [int(n) for n in ff] if np.ndim(ff) else [int(ff)] * layers
    return {"activation_sparsity_pattern": pattern, "laurel_rank": int(laurel[0]), "intermediate_size": ff,
            "altup_correct_scale": any_block_has(tensors, "altup_correct_scale.weight")}


def _mamba2_shape(get, tensor_names) -> dict:
    """A Mamba-2 mixer's widths as llama.cpp writes none of them: the expansion and head width
    from the inner width, the biases from the tensors."""
    inner, heads = int(get("ssm.inner_size")), int(get("ssm.time_step_rank"))
    hidden = int(get("embedding_length"))
    if inner % hidden or inner % heads:
        raise ValueError(f"a Mamba-2 inner width of {inner} for a hidden size of {hidden} and {heads} heads")
    return {"expand": inner // hidden, "head_dim": inner // heads,
            "conv_bias": any_block_has(tensor_names, "ssm_conv1d.bias"),
            "proj_bias": any_block_has(tensor_names, "ssm_in.bias")}


def _per_layer(get, key: str) -> list[int]:
    """A count llama.cpp writes once or one per block (KV heads, feed-forward widths), per
    block (block_count, draft layers included); 0s where the file has none."""
    blocks, v = int(get("block_count")), get(key)
    v = [int(v or 0)] * blocks if v is None or not np.ndim(v) else [int(n) for n in v]
    if len(v) != blocks:
        raise ValueError(f"{key}: {len(v)} values for {blocks} blocks")
    return v


def _attention_layers(get, layers: int) -> list[int]:
    """The KV heads of each of the model's `layers` (draft layers past them left out) of a
    hybrid model: 0 where the layer is no attention layer, as llama.cpp tells them apart
    (Granite 4.0-H's Mamba-2, LFM2's convolutions, Nemotron-H's Mamba-2 and MLPs)."""
    kv = _per_layer(get, "attention.head_count_kv")[:layers]
    if not any(kv):
        raise ValueError(f"KV heads per layer {kv}: no attention layer among {layers}")
    return kv


def _granite_hybrid(get, tensor_names) -> dict:
    """Granite 4.0-H (and Bamba): Mamba-2 layers and attention layers, which llama.cpp tells
    apart by their KV heads (0: Mamba-2); rope only where the file says so (Granite 4.0-H has
    none: its attention layers are position-free)."""
    kv = _attention_layers(get, int(get("block_count")))
    mamba = _mamba2_shape(get, tensor_names)
    return {"layer_types": ["attention" if n else "mamba" for n in kv], "num_key_value_heads": max(kv),
            "mamba_expand": mamba["expand"], "mamba_d_head": mamba["head_dim"],
            "mamba_conv_bias": mamba["conv_bias"], "mamba_proj_bias": mamba["proj_bias"],
            "position_embedding_type": "rope" if get("rope.scaling.finetuned") else "nope"}


def _period(kinds: list[bool], what: str) -> tuple[int, int]:
    """(period, offset) of the layers that are `what` (kinds[i]), as configs that say "every
    period-th layer from offset" have them (Jamba's): the shortest that gives these layers."""
    for period in range(1, len(kinds) + 1):
        for offset in range(period):
            if all(kind == (i % period == offset) for i, kind in enumerate(kinds)):
                return period, offset
    raise ValueError(f"{what} layers {[i for i, k in enumerate(kinds) if k]} are not every n-th layer")


def _jamba(get, tensor_names) -> dict:
    """Jamba: Mamba (1) layers and attention layers, which llama.cpp tells apart by their KV
    heads (0: Mamba), MoE every n-th layer (llama.cpp: where the layer has a router); the
    Mamba mixer's widths as llama.cpp writes them."""
    layers = int(get("block_count"))
    kv = _attention_layers(get, layers)
    attn_period, attn_offset = _period([bool(n) for n in kv], "attention")
    moe_period, moe_offset = _period([f"blk.{i}.ffn_gate_inp.weight" in tensor_names for i in range(layers)],
                                     "MoE")
    inner, hidden = int(get("ssm.inner_size")), int(get("embedding_length"))
    if inner % hidden:
        raise ValueError(f"a Mamba inner width of {inner} for a hidden size of {hidden}")
    return {"num_key_value_heads": max(kv), "attn_layer_period": attn_period,
            "attn_layer_offset": attn_offset, "expert_layer_period": moe_period,
            "expert_layer_offset": moe_offset, "mamba_expand": inner // hidden,
            "mamba_conv_bias": any_block_has(tensor_names, "ssm_conv1d.bias"),
            "mamba_proj_bias": any_block_has(tensor_names, "ssm_in.bias")}


def _falcon_h1(get, tensor_names) -> dict:
    """Falcon-H1: attention and a Mamba-2 mixer side by side in every layer. llama.cpp's
    converter multiplies Falcon-H1's multipliers into the weights (embedding, lm_head, q/k/v
    and output, the MLP's gate and down, the mixer's input rows and output), so config.json
    says 1 for each; its Mamba-2 norm (where the file has one) comes after the gate
    (models/mamba-base.cpp: y * silu(z), then the grouped RMS norm)."""
    inner, heads = int(get("ssm.inner_size")), int(get("ssm.time_step_rank"))
    if inner % heads:
        raise ValueError(f"a Mamba-2 inner width of {inner} for {heads} heads")
    return {"mamba_d_ssm": inner, "mamba_d_head": inner // heads,
            "mamba_conv_bias": any_block_has(tensor_names, "ssm_conv1d.bias"),
            "mamba_proj_bias": any_block_has(tensor_names, "ssm_in.bias"),
            "mamba_rms_norm": any_block_has(tensor_names, "ssm_norm.weight"), "mamba_norm_before_gate": False,
            "projectors_bias": any_block_has(tensor_names, "attn_output.bias"),
            "embedding_multiplier": 1.0, "lm_head_multiplier": 1.0, "mlp_multipliers": [1.0, 1.0],
            "key_multiplier": 1.0, "attention_in_multiplier": 1.0, "attention_out_multiplier": 1.0,
            "ssm_in_multiplier": 1.0, "ssm_out_multiplier": 1.0, "ssm_multipliers": [1.0] * 5}


def _hunyuan_moe(get, tensor_names) -> dict:
    """Hunyuan-A13B: transformers' HunYuanMoEV1 gives its experts and its one shared MLP the
    same width (intermediate_size), as Tencent's models have them; a file of other widths, or
    of more shared experts, is a model the class cannot describe."""
    widths = {int(get(k)) for k in ("feed_forward_length", "expert_feed_forward_length",
                                    "expert_shared_feed_forward_length") if get(k) is not None}
    if len(widths) > 1:
        raise ValueError(f"MLP, expert and shared-expert widths {sorted(widths)}: transformers' "
                         f"HunYuanMoEV1 has one width for all")
    if int(get("expert_shared_count") or 1) != 1:
        raise ValueError(f"{get('expert_shared_count')} shared experts: HunYuanMoEV1 has one")
    return {}


def _dbrx(get, tensor_names) -> dict:
    """DBRX: its attention's and experts' fields are configs of their own (attn_config,
    ffn_config); softmax routing, the chosen weights normalized (llama.cpp's models/dbrx.cpp:
    norm_w, as DBRX's moe_normalize_expert_weights 1), q, k and v clamped."""
    clamp = get("attention.clamp_kqv")
    return {"attn_config": {"kv_n_heads": int(get("attention.head_count_kv") or get("attention.head_count")),
                            "clip_qkv": float(clamp) if clamp else None,
                            # (transformers' attention reads its rope base here)
                            "rope_theta": float(get("rope.freq_base") or 10000.0)},
            "ffn_config": {"hidden_size": int(get("embedding_length")),
                           "ffn_hidden_size": int(get("feed_forward_length")),
                           "moe_num_experts": int(get("expert_count")),
                           "moe_top_k": int(get("expert_used_count")), "moe_normalize_expert_weights": 1.0}}


def _lfm2_moe(get, tensor_names) -> dict:
    """LFM2-MoE (LFM2-8B-A1B, LFM2-24B-A2B): short-convolution layers and attention layers,
    which llama.cpp tells apart by their KV heads (0: a convolution); sigmoid routing, the
    correction bias where the file has it, the chosen weights always normalized (llama.cpp's
    models/lfm2.cpp), scaled where the file says so."""
    if get("expert_gating_func") != GATING_SIGMOID:
        raise ValueError(f"expert gating function {get('expert_gating_func')}: LFM2-MoE routes by "
                         f"sigmoid scores")
    kv = _attention_layers(get, int(get("block_count")))
    return {"layer_types": ["full_attention" if n else "conv" for n in kv], "num_key_value_heads": max(kv),
            "use_expert_bias": any_block_has(tensor_names, "exp_probs_b.bias"), "norm_topk_prob": True}


def _nemotron_h(get, tensor_names) -> dict:
    """Nemotron-H (Nemotron 3 Nano, Nemotron-H, Nemotron Nano 2): one mixer a layer, told apart
    as llama.cpp tells them: attention where the layer has KV heads, an MLP (MoE in
    nemotron_h_moe) where it has a feed-forward width, else Mamba-2; attention without rope."""
    layers = int(get("block_count")) - int(get("nextn_predict_layers") or 0)
    kv, ff = _attention_layers(get, layers), _per_layer(get, "feed_forward_length")[:layers]
    mlp = "moe" if get("expert_count") else "mlp"
    kinds = ["attention" if k else mlp if f else "mamba" for k, f in zip(kv, ff)]
    details = {"layers_block_type": kinds, "num_key_value_heads": max(kv), "num_hidden_layers": layers,
               # (the draft layer, past the model's: its tensors are left out, tensor_map.MTP_LAYER)
               "num_nextn_predict_layers": int(get("nextn_predict_layers") or 0),
               "use_conv_bias": any_block_has(tensor_names, "ssm_conv1d.bias"),
               "mamba_proj_bias": any_block_has(tensor_names, "ssm_in.bias"),
               "mlp_bias": any_block_has(tensor_names, "ffn_up.bias")}
    if "mamba" in kinds:
        # (the mixer's width is its heads' alone, not an expansion of the hidden size:
        # Nemotron 3 Nano's 64 heads of 64 for a hidden size of 2688)
        inner, heads = int(get("ssm.inner_size")), int(get("ssm.time_step_rank"))
        if inner % heads:
            raise ValueError(f"a Mamba-2 inner width of {inner} for {heads} heads")
        details["mamba_head_dim"] = inner // heads
    if mlp == "mlp":
        details["intermediate_size"] = max(ff)
    return details


def _mamba2(get, tensor_names) -> dict:
    """Mamba-2 (Mamba-Codestral)."""
    mamba = _mamba2_shape(get, tensor_names)
    return {"head_dim": mamba["head_dim"], "expand": mamba["expand"],
            "use_conv_bias": mamba["conv_bias"], "use_bias": mamba["proj_bias"]}


_QWEN35 = {"ssm.conv_kernel": "linear_conv_kernel_dim", "ssm.state_size": "linear_key_head_dim",
           "ssm.group_count": "linear_num_key_heads", "ssm.time_step_rank": "linear_num_value_heads"}

_GRANITE = {"attention.scale": "attention_multiplier", "embedding_scale": "embedding_multiplier",
            "residual_scale": "residual_multiplier", "logit_scale": "logits_scaling"}
_COHERE = {"attention.layer_norm_epsilon": "layer_norm_eps", "attention.layer_norm_rms_epsilon": None,
           "logit_scale": "logit_scale"}

ARCHS: dict[str, ArchConfig] = {
    # Command R (v01, 08-2024), Aya: LayerNorm without bias, parallel attention and MLP, logits scaled
    "command-r": ArchConfig("cohere", _COHERE),
    # Command R7B, Command A: three sliding-window layers to one global (without rope)
    "cohere2": ArchConfig("cohere2", {**_COHERE, "attention.sliding_window": "sliding_window"}, swa_period=4),
    # GLM-4-0414: half of each head rotated, post-norms, gate and up in one tensor
    "glm4": ArchConfig("glm4", partial_rope=True),
    # OLMo 2, and Olmo 3 (its sliding-window layers: the same with a window)
    "olmo2": ArchConfig("olmo2", {"attention.sliding_window": "sliding_window"}, swa_period=4,
                        variant=_olmo3),
    # OLMoE: llama.cpp leaves the chosen experts' weights as the softmax gave them
    "olmoe": ArchConfig("olmoe", fixed={"norm_topk_prob": False}),
    "granite": ArchConfig("granite", _GRANITE),
    # (and GraniteMoeShared: with a shared expert)
    "granitemoe": ArchConfig("granitemoe", {**_GRANITE, "expert_count": "num_local_experts",
                                            "expert_shared_feed_forward_length": "shared_intermediate_size"},
                             variant=_granitemoe_shared),
    # Granite 4.0-H: Mamba-2 layers and (position-free) attention layers, MoE with a shared
    # expert (whose gate and up llama.cpp splits in two: tensor_map.ROW_PARTS), Granite's
    # multipliers
    "granitehybrid": ArchConfig("granitemoehybrid", {
        **_GRANITE, "expert_count": "num_local_experts",
        "expert_shared_feed_forward_length": "shared_intermediate_size", "ssm.conv_kernel": "mamba_d_conv",
        "ssm.state_size": "mamba_d_state", "ssm.group_count": "mamba_n_groups",
        "ssm.time_step_rank": "mamba_n_heads"}, details=_granite_hybrid),
    # Mamba-2 (Mamba-Codestral): state-space layers only (llama.cpp writes 0 heads, 0 MLP width)
    "mamba2": ArchConfig("mamba2", {"ssm.conv_kernel": "conv_kernel", "ssm.state_size": "state_size",
                                    "ssm.group_count": "n_groups", "ssm.time_step_rank": "num_heads",
                                    "attention.layer_norm_rms_epsilon": "layer_norm_epsilon",
                                    "attention.head_count": None, "attention.head_count_kv": None,
                                    "feed_forward_length": None}, details=_mamba2),
    # LFM2-MoE: LFM2's convolution and attention layers, its first layers dense, then MoE
    "lfm2moe": ArchConfig("lfm2_moe", {"attention.layer_norm_rms_epsilon": "norm_eps",
                                       "shortconv.l_cache": "conv_L_cache",
                                       "leading_dense_block_count": "num_dense_layers",
                                       "expert_weights_scale": "routed_scaling_factor"},
                          details=_lfm2_moe),
    # Nemotron-H (Nemotron-H 8B/47B/56B, Nemotron Nano 2): Mamba-2, attention and ReLU^2 MLP
    # layers, one mixer a layer
    "nemotron_h": ArchConfig("nemotron_h", {
        "attention.layer_norm_epsilon": "layer_norm_epsilon", "attention.layer_norm_rms_epsilon": None,
        "feed_forward_length": None, "attention.head_count_kv": None, "block_count": None,
        "ssm.conv_kernel": "conv_kernel", "ssm.state_size": "ssm_state_size", "ssm.group_count": "n_groups",
        "ssm.time_step_rank": "mamba_num_heads"}, details=_nemotron_h),
    # Nemotron 3 Nano (and later Nemotron-H MoE models): Mamba-2, attention and MoE layers,
    # ReLU^2 experts without a gate, a shared expert, sigmoid routing with the correction bias
    # (llama.cpp fixes sigmoid), normalized and scaled weights
    "nemotron_h_moe": ArchConfig("nemotron_h", {
        "attention.layer_norm_epsilon": "layer_norm_epsilon", "attention.layer_norm_rms_epsilon": None,
        "feed_forward_length": None, "attention.head_count_kv": None, "block_count": None,
        "expert_count": "n_routed_experts", "expert_shared_count": "n_shared_experts",
        "expert_shared_feed_forward_length": "moe_shared_expert_intermediate_size",
        "expert_weights_norm": "norm_topk_prob", "expert_weights_scale": "routed_scaling_factor",
        "expert_group_count": "n_group", "expert_group_used_count": "topk_group",
        "moe_latent_size": "moe_latent_size", "ssm.conv_kernel": "conv_kernel",
        "ssm.state_size": "ssm_state_size", "ssm.group_count": "n_groups",
        "ssm.time_step_rank": "mamba_num_heads"}, details=_nemotron_h),
    # Qwen3-VL's text models (the vision tower is in the mmproj file, which convert does not
    # take): Qwen3's and Qwen3-MoE's layers with multimodal rope, which for text (its three
    # positions equal) is their rope, whatever its sections; llama.cpp normalizes the chosen
    # experts' weights, as for qwen3moe
    "qwen3vl": ArchConfig("qwen3"),
    "qwen3vlmoe": ArchConfig("qwen3_moe", fixed={"norm_topk_prob": True, "decoder_sparse_step": 1,
                                                 "mlp_only_layers": []}),
    "ernie4_5": ArchConfig("ernie4_5"),
    "ernie4_5-moe": ArchConfig("ernie4_5_moe", {"expert_count": "moe_num_experts",
                                                "expert_used_count": "moe_k",
                                                "leading_dense_block_count": "moe_layer_start_index",
                                                "interleave_moe_layer_step": "moe_layer_interval",
                                                "expert_shared_count": "moe_num_shared_experts"},
                               details=_ernie_moe),
    # EXAONE 4.0: three sliding-window layers to one global, q/k norms, post-norms only
    "exaone4": ArchConfig("exaone4", {"attention.sliding_window": "sliding_window"}, swa_period=4),
    # SmolLM3: every fourth layer without rope (llama.cpp fixes the period; so does the class)
    "smollm3": ArchConfig("smollm3"),
    # Arcee AFM: ReLU^2, no gate
    "arcee": ArchConfig("arcee"),
    "seed_oss": ArchConfig("seed_oss"),
    # dots.llm1: DeepSeek-V3's routing (llama.cpp fixes sigmoid scores; the correction bias,
    # groups, normalized and scaled weights), shared experts, leading dense layers, q/k norms
    "dots1": ArchConfig("dots1", {"expert_count": "n_routed_experts",
                                  "expert_shared_count": "n_shared_experts",
                                  "leading_dense_block_count": "first_k_dense_replace",
                                  "expert_weights_scale": "routed_scaling_factor",
                                  "expert_weights_norm": "norm_topk_prob", "expert_group_count": "n_group",
                                  "expert_group_used_count": "topk_group"}),
    # Jamba: Mamba layers with norms of dt, B and C, attention layers every n-th (no rope), MoE
    # every n-th layer
    "jamba": ArchConfig("jamba", {"ssm.conv_kernel": "mamba_d_conv", "ssm.state_size": "mamba_d_state",
                                  "ssm.time_step_rank": "mamba_dt_rank", "attention.head_count_kv": None},
                        details=_jamba),
    # Falcon-H1: attention and Mamba-2 in parallel in each layer, its multipliers in the weights
    "falcon-h1": ArchConfig("falcon_h1", {"ssm.conv_kernel": "mamba_d_conv",
                                          "ssm.state_size": "mamba_d_state",
                                          "ssm.group_count": "mamba_n_groups",
                                          "ssm.time_step_rank": "mamba_n_heads", "vocab_size": "vocab_size"},
                            details=_falcon_h1),
    # DBRX: LayerNorm without bias, q, k and v in one tensor (clamped), MoE in every layer
    "dbrx": ArchConfig("dbrx", {"embedding_length": "d_model", "block_count": "n_layers",
                                "attention.head_count": "n_heads", "context_length": "max_seq_len",
                                "attention.head_count_kv": None, "feed_forward_length": None,
                                "expert_count": None, "expert_used_count": None}, details=_dbrx),
    # Apertus: xIELU activation (its parameters per layer in the metadata:
    # tensor_map.METADATA_PARAMETERS), q/k norms, Llama 3's rope scaling
    "apertus": ArchConfig("apertus", fixed={"hidden_act": "xielu"}),
    # Hunyuan-A13B: MoE with one shared MLP (softmax, normalized), q/k norms per head
    "hunyuan-moe": ArchConfig("hunyuan_v1_moe", {"expert_used_count": "moe_topk",
                                                 "expert_feed_forward_length": None},
                              details=_hunyuan_moe),
    # Hunyuan dense (V1): q/k norms per head
    "hunyuan-dense": ArchConfig("hunyuan_v1_dense"),
    # Gemma (1): llama.cpp stores the norms as 1 + w, as for Gemma 2 and 3
    "gemma": ArchConfig("gemma"),
    # Llama 4 Scout, Maverick: MoE every n-th layer, sigmoid top-1 with a shared expert
    "llama4": ArchConfig("llama4_text", {"feed_forward_length": "intermediate_size_mlp",
                                         "expert_feed_forward_length": "intermediate_size",
                                         "expert_count": "num_local_experts",
                                         "interleave_moe_layer_step": "interleave_moe_layer_step"},
                         details=_llama4),
    # Ministral 3 (llama.cpp's mistral3: the text model of Mistral Small 3.x and Ministral 3):
    # YaRN with its mscale, and Llama 4's attention scaling by position (both in
    # rope_parameters, hf_config.complete_config)
    "mistral3": ArchConfig("ministral3"),
    # Phi-3.5-MoE
    "phimoe": ArchConfig("phimoe", {"expert_count": "num_local_experts"}, details=_phimoe),
    # K-EXAONE: DeepSeek-V3's routing (sigmoid, correction bias, groups, scaled weights), a
    # shared expert, three sliding-window layers to one global
    "exaone-moe": ArchConfig("exaone_moe", {"attention.sliding_window": "sliding_window",
                                            "expert_shared_count": "num_shared_experts",
                                            "expert_weights_scale": "routed_scaling_factor",
                                            "leading_dense_block_count": "first_k_dense_replace",
                                            "expert_group_count": "n_group",
                                            "expert_group_used_count": "topk_group"},
                             swa_period=4, details=_exaone_moe),
    # Arcee Trinity (AFMoE): sigmoid routing with the correction bias, normalized and scaled,
    # shared experts, leading dense layers, gated attention, three sliding-window layers to one
    "afmoe": ArchConfig("afmoe", {"leading_dense_block_count": "num_dense_layers",
                                  "expert_shared_count": "num_shared_experts",
                                  "expert_weights_scale": "route_scale",
                                  "attention.sliding_window": "sliding_window"},
                        swa_period=4, details=_afmoe),
    # Qwen3-Next: three gated delta-net (linear attention) layers to one of gated full
    # attention, MoE with a gated shared expert; llama.cpp splits the delta-net's in_proj_qkvz
    # in two (tensor_map.qkvz_order joins it back) and stores the norms as 1 + w
    "qwen3next": ArchConfig("qwen3_next", {**_QWEN35, "expert_shared_feed_forward_length":
                                                      "shared_expert_intermediate_size"},
                            partial_rope=True, details=_delta_net),
    # Qwen3.5 (dense): three gated delta-net (linear attention) layers to one of gated full
    # attention, a quarter of each head rotated; llama.cpp stores the norms as 1 + w and the
    # value heads in its own order (tensor_map.converter_row_order undoes it)
    "qwen35": ArchConfig("qwen3_5_text", _QWEN35, partial_rope=True, details=_qwen35),
    # Qwen3.5-MoE: the same, with routed experts (softmax, normalized) and a gated shared expert
    "qwen35moe": ArchConfig("qwen3_5_moe_text", {**_QWEN35, "expert_shared_feed_forward_length":
                                                      "shared_expert_intermediate_size"},
                            partial_rope=True, details=_qwen35),
    # Gemma 4 (31B, 26B-A4B, E2B, E4B): in transformers' GGUF mapping, which leaves the head
    # widths, the rope and the per-layer widths at its defaults; the norms stored as they are
    # (not 1 + w); global layers rotate part of each head ("proportional": hf_config reads the
    # part from the rope_freqs the converter writes)
    "gemma4": ArchConfig("gemma4_text", {"attention.sliding_window": "sliding_window",
                                         "final_logit_softcapping": "final_logit_softcapping",
                                         "expert_used_count": "top_k_experts",
                                         "attention.shared_kv_layers": "num_kv_shared_layers",
                                         "embedding_length_per_layer_input": "hidden_size_per_layer_input"},
                         fixed={"hidden_activation": "gelu_pytorch_tanh"}, details=_gemma4),
    # Gemma 3n (E2B, E4B; text): AltUp over four copies of the hidden state, LAuReL blocks,
    # per-layer input embeddings, keys and values reused by the last layers, activation sparsity;
    # norms stored as they are (not 1 + w); two rope bases (hf_config: per layer kind)
    "gemma3n": ArchConfig("gemma3n_text", {"attention.sliding_window": "sliding_window",
                                           "final_logit_softcapping": "final_logit_softcapping",
                                           "attention.shared_kv_layers": "num_kv_shared_layers",
                                           "embedding_length_per_layer_input": "hidden_size_per_layer_input",
                                           "altup.active_idx": "altup_active_idx",
                                           "altup.num_inputs": "altup_num_inputs"},
                          fixed={"hidden_activation": "gelu_pytorch_tanh"}, details=_gemma3n),
    # MiniMax-M2: in transformers' GGUF mapping, which writes the gating function's number as
    # scoring_func and no routing bias; part of each head rotated (rotary_dim)
    "minimax-m2": ArchConfig("minimax_m2", {"expert_count": "num_local_experts",
                                            "expert_feed_forward_length": None,
                                            "rope.dimension_count": "rotary_dim"},
                             partial_rope=True, details=_minimax_m2),
}


def own_config(arch: str, get: Callable[[str], object], get_key: Callable[[str], object],
               tensor_names: set[str]) -> dict:
    """transformers' config (as a dict, model_type first) of a file of `arch` (OWN_CONFIGS).
    `get(key)` reads a key after "<arch>.", `get_key` a full one. Raises ValueError, with the
    reason, for a file the config class cannot describe."""
    from transformers import CONFIG_MAPPING

    spec = ARCHS[arch]
    for key in ("block_count", "attention.head_count", "embedding_length"):
        if get(key) is None:
            raise ValueError(f"no {arch}.{key}")
    model_type = (spec.variant and spec.variant(get, tensor_names)) or spec.model_type
    table = {**COMMON_FIELDS, **spec.fields}
    fields = {name: get(key) for key, name in table.items() if name and get(key) is not None}
    fields.update(spec.fixed)
    defaults = CONFIG_MAPPING[model_type]()  # (the class's fields, and its rope base)
    known = set(defaults.to_dict())
    if (tokens := get_key("tokenizer.ggml.tokens")) is not None:
        fields["vocab_size"] = len(tokens)  # (the embedding's rows; not every converter writes it)
    heads, hidden = int(get("attention.head_count")), int(get("embedding_length"))
    head_dim = int(get("attention.key_length") or (hidden // heads if heads else 0))  # (0: Mamba-2)
    if "head_dim" in known:  # (class defaults differ: Gemma's 256, Arcee's 80)
        fields["head_dim"] = head_dim
    # what llama.cpp reads off the tensors the file has
    for name, tensor in (("attention_bias", "attn_q.bias"), ("use_bias", "attn_q.bias"),
                         ("attention_out_bias", "attn_output.bias"), ("mlp_bias", "ffn_up.bias"),
                         ("use_qk_norm", "attn_q_norm.weight")):
        if name in known:
            fields[name] = any_block_has(tensor_names, tensor)
    if "rope_parameters" in known:  # (not a state-space model's: Mamba-2 has no rope)
        own_rope = defaults.rope_parameters
        own_rope = own_rope.get("full_attention", own_rope)  # (rope per layer kind: Gemma 4's)
        rope = {"rope_type": "default", "rope_theta": float(get("rope.freq_base") or own_rope["rope_theta"])}
        rope_dim = int(get("rope.dimension_count") or head_dim)
        if rope_dim != head_dim:
            if not spec.partial_rope:
                raise ValueError(f"rope over {rope_dim} of each head's {head_dim}: transformers' "
                                 f"{model_type} rotates the whole head")
            rope["partial_rotary_factor"] = rope_dim / head_dim
        fields["rope_parameters"] = rope  # (complete_config sets the scaling, as for every architecture)
    if "layer_types" in known:
        layers = int(get("block_count"))
        pattern = get("attention.sliding_window_pattern")
        if "sliding_window" not in fields:  # (no window: every layer global; EXAONE-4.0-1.2B)
            pattern = [False] * layers
            if "sliding_window" in known:
                fields["sliding_window"] = None
        elif pattern is None:
            period = spec.swa_period or layers + 1
            pattern = [(i + 1) % period != 0 for i in range(layers)]
        pattern = [bool(swa) for swa in pattern]
        if len(pattern) != layers:
            raise ValueError(f"a sliding-window pattern of {len(pattern)} layers for {layers}")
        fields["layer_types"] = ["sliding_attention" if swa else "full_attention" for swa in pattern]
    if spec.details:
        details = spec.details(get, tensor_names)
        if "rope_parameters" in details:
            fields["rope_parameters"].update(details.pop("rope_parameters"))
        fields.update(details)
    if "vocab_size_per_layer_input" in known and fields.get("hidden_size_per_layer_input"):
        # (Gemma 4's per-layer input embeddings: one row per token, as the token embedding;
        # the loaders check the table's shape)
        fields["vocab_size_per_layer_input"] = fields["vocab_size"]
    for name, key in TOKEN_IDS.items():
        fields[name] = get_key(key)
    return {"model_type": model_type, **fields}


def _table(arch: str):
    return lambda get, get_key, tensor_names: own_config(arch, get, get_key, tensor_names)


# llama.cpp's architecture -> its config function: the architectures whose config.json is ours
OWN_CONFIGS: dict[str, Callable] = {"deepseek2": deepseek2_config, "glm4moe": glm4moe_config,
                                    **{arch: _table(arch) for arch in ARCHS}}
