"""config.json as the inverse of llama.cpp's `convert_hf_to_gguf.py`, where transformers' GGUF
mapping (GGUF_CONFIG_MAPPING) falls short.

transformers maps most keys, but drops ones that change what the model computes: rope scaling
of every kind (llama.cpp writes Llama 3's as the `rope_freqs.weight` tensor of per-frequency
divisors, Phi-3.5's LongRoPE as `rope_factors_long/short.weight`, linear and YaRN as
`rope.scaling.*` keys, Gemma 3's linear on its global layers only), the rope base of some
architectures (StarCoder2), Falcon-40B's decoder (`attn_norm_2`, grouped KV heads), GPT-2's
context, Qwen3's head width. This module sets those, and accounts for every key: each key
llama.cpp writes is mapped (by transformers or here), listed in IGNORED with the reason an
engine does not need it, or named in a warning at convert (`unaccounted_keys`).
"""

from __future__ import annotations

import math
import re
from typing import Callable

import numpy as np

# Keys (after "<arch>.") that transformers' GGUF mapping or `complete_config` uses for some
# architecture; whether a given architecture's config uses each is transformers' business.
MAPPED = {
    "context_length", "block_count", "feed_forward_length", "embedding_length",
    "attention.head_count", "attention.head_count_kv", "attention.key_length",
    "attention.layer_norm_rms_epsilon", "attention.layer_norm_epsilon", "attention.sliding_window",
    "rope.dimension_count", "rope.freq_base", "rope.freq_base_swa", "rope.scaling.type",
    "rope.scaling.factor", "rope.scaling.original_context_length", "rope.scaling.attn_factor",
    "rope.scaling.yarn_beta_fast", "rope.scaling.yarn_beta_slow", "rope.scaling.yarn_log_multiplier",
    "vocab_size", "expert_count", "expert_used_count", "expert_feed_forward_length",
    "expert_shared_feed_forward_length", "attn_logit_softcapping", "final_logit_softcapping",
    "ssm.conv_kernel", "ssm.state_size", "ssm.time_step_rank", "ssm.inner_size", "shortconv.l_cache",
    "use_parallel_residual",
    # deepseek2's, read by `deepseek2_config`
    "leading_dense_block_count", "attention.q_lora_rank", "attention.kv_lora_rank",
    "attention.key_length_mla", "attention.value_length_mla", "expert_shared_count",
    "expert_weights_scale", "expert_weights_norm", "expert_gating_func", "expert_group_count",
    "expert_group_used_count",
    # glm4moe's, read by `glm4moe_config`
    "nextn_predict_layers",
    # read by arch_configs.own_config: Command R's and Granite's scales, ERNIE's MoE layers,
    # the sliding-window layers
    "logit_scale", "attention.scale", "embedding_scale", "residual_scale", "interleave_moe_layer_step",
    "attention.sliding_window_pattern", "attention.temperature_scale",
    # Qwen3.5's linear-attention layers and multimodal rope sections
    "ssm.group_count", "attention.recurrent_layers", "full_attention_interval", "rope.dimension_sections",
    # Gemma 4's two head widths, its layers that reuse keys and values, its per-layer inputs
    "attention.key_length_swa", "rope.dimension_count_swa", "attention.shared_kv_layers",
    "embedding_length_per_layer_input",
    # Granite 4.0-H's: whether its attention layers rotate (rope.scaling.finetuned, as llama.cpp reads it)
    "rope.scaling.finetuned",
    # Gemma 3n's AltUp and activation sparsity
    "altup.active_idx", "altup.num_inputs", "activation_sparsity_scale",
    # DBRX's clamp of q, k and v
    "attention.clamp_kqv",
}
# Keys that carry nothing an engine needs from config.json, each with the reason.
IGNORED = {
    "general.architecture": "selects the mapping itself",
    "general.name": "a label",
    "general.basename": "a label",
    "general.size_label": "a label",
    "general.finetune": "a label",
    "general.type": "'model' for every file an engine loads",
    "general.file_type": "the weights' types are per tensor in the manifest",
    "general.quantization_version": "the blocks' format, checked per type by the reader",
    "general.alignment": "the file's layout, kept in the header bytes for export",
    "attention.value_length": "equal to key_length (head_dim) in every architecture here but deepseek2, "
                              "where it is MLA's latent width (kv_lora_rank), checked against it",
    "attention.value_length_swa": "equal to key_length_swa (Gemma 4's head_dim; its global layers' "
                                  "value_length is key_length)",
    "tensor_data_layout": "Falcon's QKV row order, which the tensor mapping undoes",
    "ssm.dt_b_c_rms": "Falcon-Mamba's extra norms; Mamba's config has no such option (false here)",
    "n_deepstack_layers": "Qwen3-VL's layers that add visual features (its vision tower is in the mmproj "
                          "file); text alone passes them through",
}
# Keys read elsewhere: the tokenizer's (transformers' GGUF tokenizer conversion), the split
# set's (the reader), parameters written as keys (Apertus's xIELU: the engines' tensor mapping,
# tensor_map.METADATA_PARAMETERS); and the file's provenance and sampling defaults, which are
# not the model's computation.
READ_ELSEWHERE = ("tokenizer.", "split.", "xielu.", "general.source.", "general.base_model.",
                  "general.license", "general.tags", "general.languages", "general.datasets",
                  "general.description", "general.author", "general.organization", "general.version",
                  "general.url", "general.doi", "general.uuid", "general.repo_url", "general.quantized_by",
                  "general.sampling.")


def unaccounted_keys(keys, arch: str) -> list[str]:
    """The keys of a file in none of the lists above (a key llama.cpp added since)."""
    out = []
    for key in keys:
        short = key[len(arch) + 1:] if key.startswith(arch + ".") else None
        if not (key in IGNORED or short in MAPPED or short in IGNORED or key.startswith(READ_ELSEWHERE)):
            out.append(key)
    return out


def complete_config(config, get: Callable[[str], object], tensor_names: set[str],
                    read_f32: Callable[[str], np.ndarray]) -> list[str]:
    """Set on transformers' `config` what it did not map from the file. `get(key)` reads a
    key after "<arch>." (None if absent); `read_f32(name)` a float32 tensor. Returns warnings."""
    notes: list[str] = []
    head_dim = get("attention.key_length")
    if config.model_type in MLA_MODEL_TYPES or config.model_type == "gemma4_text":
        # (deepseek2's key_length is MLA's as llama.cpp runs it: latent + rope; Gemma 4's the
        # global layers', which its config has per layer, as arch_configs wrote it)
        head_dim = None
    if head_dim and hasattr(config, "head_dim") and config.head_dim != head_dim:
        config.head_dim = int(head_dim)  # (Qwen3: transformers keeps the class default, 128)
    context = get("context_length")
    if context and config.model_type == "gpt2":
        config.n_positions = config.n_ctx = int(context)  # GPT-2's position table is this long
    if config.model_type == "falcon":
        if context:
            config.max_position_embeddings = int(context)
        if any(n.endswith(".attn_norm_2.weight") for n in tensor_names):
            # Falcon-40B/180B: two norms per layer, grouped KV heads (llama.cpp knows the
            # decoder by its second norm)
            config.new_decoder_architecture = True
            config.num_kv_heads = int(get("attention.head_count_kv") or config.num_attention_heads)
    rope = _rope_parameters(config, get, tensor_names, read_f32, notes)
    if rope is not None:
        config.rope_parameters = rope
    return notes


def _rope_parameters(config, get, tensor_names, read_f32, notes) -> dict | None:
    """The config's rope_parameters with the file's base and scaling, or None to leave them."""
    current = getattr(config, "rope_parameters", None)
    if not isinstance(current, dict) or config.model_type == "gpt_oss":
        return None  # (no rope; gpt-oss: engine_files._gpt_oss_config)
    per_layer_type = "full_attention" in current
    if config.model_type == "gemma4_text":
        return _gemma4_rope(config, get, tensor_names, read_f32)
    full = dict(current["full_attention"] if per_layer_type else current)
    theta = get("rope.freq_base")
    if theta:
        full["rope_theta"] = float(theta)
    # (kept: what the config function read from the file besides; Qwen3.5's rope sections)
    full = {k: v for k, v in full.items()
            if k in ("rope_theta", "partial_rotary_factor", "mrope_section", "mrope_interleaved")}
    full.update(_scaling(config, get, tensor_names, read_f32, notes, full["rope_theta"]))
    if not per_layer_type:
        return full
    sliding = dict(current.get("sliding_attention", {}))
    if get("rope.freq_base_swa"):
        sliding["rope_theta"] = float(get("rope.freq_base_swa"))
    # llama.cpp scales only the global layers' rope (Gemma 3's linear x8)
    return {"full_attention": full, "sliding_attention": sliding}


def _gemma4_rope(config, get, tensor_names, read_f32) -> dict:
    """Gemma 4's rope: on the global layers "proportional" (the first part of each half-head
    rotated, at the frequencies of the whole head), which llama.cpp runs as rope over the whole
    head with its frequencies divided by 1e30 past the rotated part (the rope_freqs the
    converter writes: its ones are the rotated part); on the sliding-window layers the default."""
    full = {"rope_type": "proportional", "rope_theta": float(get("rope.freq_base") or 1e6)}
    if "rope_freqs.weight" in tensor_names:
        divisors = read_f32("rope_freqs.weight")
        rotated = int(np.count_nonzero(divisors == 1.0))
        if not np.all(divisors[:rotated] == 1.0) or not np.all(divisors[rotated:] >= 1e29):
            raise ValueError("rope_freqs.weight is not of Gemma 4's form (ones, then 1e30)")
        full["partial_rotary_factor"] = rotated / len(divisors)
    sliding = {"rope_type": "default", "rope_theta": float(get("rope.freq_base_swa") or 1e4)}
    rotated_swa, head_dim = get("rope.dimension_count_swa"), get("attention.key_length_swa")
    if rotated_swa and head_dim and int(rotated_swa) != int(head_dim):
        sliding["partial_rotary_factor"] = int(rotated_swa) / int(head_dim)
    return {"full_attention": full, "sliding_attention": sliding}


def _scaling(config, get, tensor_names, read_f32, notes, theta: float) -> dict:
    kind = get("rope.scaling.type")
    original = get("rope.scaling.original_context_length")
    if "rope_factors_long.weight" in tensor_names:
        # LongRoPE (Phi-3.5, Phi-4-mini): the two factor lists and the attention factor
        rope = {"rope_type": "longrope",
                "long_factor": read_f32("rope_factors_long.weight").tolist(),
                "short_factor": read_f32("rope_factors_short.weight").tolist()}
        if original:
            rope["original_max_position_embeddings"] = int(original)
            if hasattr(config, "original_max_position_embeddings"):
                config.original_max_position_embeddings = int(original)
        if get("rope.scaling.attn_factor"):
            rope["attention_factor"] = float(get("rope.scaling.attn_factor"))
        if config.model_type == "phimoe":
            # PhiMoE scales cos/sin by short_mscale or long_mscale; llama.cpp by the one factor its
            # converter computes, sqrt(1 + ln(context / original) / ln(original)) (Phi-3.5-MoE's
            # own config.json says 1.243 for both; its GGUF files run with 1.190)
            rope["short_mscale"] = rope["long_mscale"] = float(get("rope.scaling.attn_factor") or 1.0)
        return rope
    if "rope_freqs.weight" in tensor_names:
        dim = int(get("rope.dimension_count") or getattr(config, "head_dim", None)
                  or config.hidden_size // config.num_attention_heads)
        if not original:  # (not in the file; only its ratio to the fitted factors matters:
            # Llama 3's 8192 where it fits under the context, as transformers asks)
            context = int(get("context_length") or 0)
            original = 8192 if context > 8192 or not context else max(1, context // 8)
        rope = llama3_from_divisors(read_f32("rope_freqs.weight"), theta, dim, original)
        if rope is None:
            notes.append("rope_freqs.weight is not of Llama 3's form: engines will not apply it "
                         "(config.json says the default rope)")
            return {"rope_type": "default"}
        return rope
    if kind in (None, "none"):
        return {"rope_type": "default"}
    factor = float(get("rope.scaling.factor") or 1.0)
    if kind == "linear":
        return {"rope_type": "linear", "factor": factor}
    if kind == "yarn":
        rope = {"rope_type": "yarn", "factor": factor}
        if original:
            rope["original_max_position_embeddings"] = int(original)
        for key, name in (("rope.scaling.yarn_beta_fast", "beta_fast"),
                          ("rope.scaling.yarn_beta_slow", "beta_slow"),
                          ("rope.scaling.attn_factor", "attention_factor")):
            if get(key) is not None:
                rope[name] = float(get(key))
        if config.model_type == "ministral3":
            # Ministral 3: the converter writes mscale_all_dim as it is (mscale is equal to it in
            # Mistral's configs), and Llama 4's attention scaling by position, beta
            rope["mscale"] = rope["mscale_all_dim"] = float(get("rope.scaling.yarn_log_multiplier") or 1.0)
            rope["llama_4_scaling_beta"] = beta = float(get("attention.temperature_scale") or 0.0)
            # as Mistral's own params.json has it: vLLM's Mistral model reads this, not the
            # rope parameters (and without it leaves the queries unscaled past the original)
            config.llama_4_scaling = {"original_max_position_embeddings": int(original or 0), "beta": beta}
        if config.model_type in MLA_MODEL_TYPES and get("rope.scaling.yarn_log_multiplier"):
            # DeepSeek's mscale_all_dim, which the converter writes times 0.1; llama.cpp scales
            # q.k by its mscale squared and leaves the rotary part unscaled, which is
            # transformers' yarn with mscale equal to mscale_all_dim (as DeepSeek's configs say)
            rope["mscale"] = rope["mscale_all_dim"] = _times_ten(get("rope.scaling.yarn_log_multiplier"))
        return rope
    notes.append(f"rope scaling {kind!r} has no transformers form here: config.json says the "
                 f"default rope")
    return {"rope_type": "default"}


def _times_ten(stored) -> float:
    """x from the float32 the converter stored for 0.1 * x: the shortest decimal that gives the
    same float32 again (DeepSeek-V2-Lite's 0.707, not 0.70700001...)."""
    target = np.float32(stored)
    for digits in range(1, 10):
        x = round(float(target) / 0.1, digits)
        if np.float32(0.1 * x) == target:
            return x
    return float(target) / 0.1


# -- the architectures transformers' GGUF mapping lacks ------------------------------------------

# key after "<arch>." -> config field: what every llama.cpp model class writes
# (TextModel.set_gguf_parameters), by the names transformers' llama-like configs give them; each
# architecture's table adds to it or renames (here, and converter/arch_configs.py)
COMMON_FIELDS = {
    "context_length": "max_position_embeddings", "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size", "block_count": "num_hidden_layers",
    "attention.head_count": "num_attention_heads", "attention.head_count_kv": "num_key_value_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps", "expert_count": "num_experts",
    "expert_used_count": "num_experts_per_tok", "expert_feed_forward_length": "moe_intermediate_size",
}


# -- deepseek2 ------------------------------------------------------------------------------------

# transformers' model types of llama.cpp's deepseek2 (multi-head latent attention)
MLA_MODEL_TYPES = ("deepseek_v2", "deepseek_v3")
# key (after "deepseek2.") -> config field, the inverse of DeepseekV2Model.set_gguf_parameters in
# llama.cpp's convert_hf_to_gguf.py (conversion/deepseek.py); the other keys it writes are
# read by deepseek2_config below, or by complete_config (rope)
DEEPSEEK2_FIELDS = {
    **COMMON_FIELDS,  # (head_count_kv is MLA's 1: deepseek2_config sets the model's heads)
    "vocab_size": "vocab_size", "leading_dense_block_count": "first_k_dense_replace",
    "attention.q_lora_rank": "q_lora_rank", "attention.kv_lora_rank": "kv_lora_rank",
    "rope.dimension_count": "qk_rope_head_dim", "expert_count": "n_routed_experts",
    "expert_shared_count": "n_shared_experts", "expert_weights_scale": "routed_scaling_factor",
    "expert_group_count": "n_group", "expert_group_used_count": "topk_group",
    "rope.freq_base": "rope_theta",
}
# gguf's ExpertGatingFuncType
GATING_SOFTMAX, GATING_SIGMOID = 1, 2
TOKEN_IDS = {"bos_token_id": "tokenizer.ggml.bos_token_id", "eos_token_id": "tokenizer.ggml.eos_token_id",
              "pad_token_id": "tokenizer.ggml.padding_token_id"}


def deepseek2_config(get: Callable[[str], object], get_key: Callable[[str], object],
                     tensor_names: set[str]) -> dict:
    """transformers' config (as a dict, model_type first) of a deepseek2 file: DeepseekV3's for
    sigmoid routing (its score-correction bias, exp_probs_b, comes with it), DeepseekV2's for
    softmax. `get(key)` reads a key after "deepseek2.", `get_key` a full one. Raises ValueError,
    with the reason, for a file neither transformers class computes as llama.cpp does."""
    fields = {field: get(key) for key, field in DEEPSEEK2_FIELDS.items() if get(key) is not None}
    for key in ("attention.head_count", "attention.kv_lora_rank", "rope.dimension_count", "block_count"):
        if get(key) is None:
            raise ValueError(f"no deepseek2.{key}, which MLA needs")
    heads, rope_dim, kv_lora = int(get("attention.head_count")), int(get("rope.dimension_count")), \
        int(get("attention.kv_lora_rank"))
    # the block count includes the multi-token-prediction layers (GLM-4.7-Flash's converter
    # writes its draft layer), which the model's main path does not run
    nextn = int(get("nextn_predict_layers") or 0)
    fields["num_hidden_layers"] = int(get("block_count")) - nextn
    if nextn:
        fields["num_nextn_predict_layers"] = nextn
    if get("attention.key_length_mla") is not None:
        # MLA run as llama.cpp runs it, multi-query over the latent: key_length and value_length
        # are the latent's (with the rope part), the model's heads are the _mla keys
        widths = (get("attention.key_length"), get("attention.value_length"))
        if widths not in ((None, None), (kv_lora + rope_dim, kv_lora)):
            raise ValueError(f"attention.key_length/value_length {get('attention.key_length')}/"
                             f"{get('attention.value_length')} are not MLA's latent widths "
                             f"{kv_lora + rope_dim}/{kv_lora}")
        key_length, value_length = get("attention.key_length_mla"), get("attention.value_length_mla")
    else:  # (files from before llama.cpp ran MLA on the latent: the heads' own widths)
        key_length, value_length = get("attention.key_length"), get("attention.value_length")
    if key_length is None or value_length is None or int(key_length) <= rope_dim:
        raise ValueError(f"attention key/value widths {key_length}/{value_length} do not fit a rope "
                         f"width of {rope_dim}")
    fields.update(qk_nope_head_dim=int(key_length) - rope_dim, v_head_dim=int(value_length),
                  # llama.cpp writes head_count_kv 1 (multi-query over the latent); transformers
                  # expands the latent to every head
                  num_key_value_heads=heads)
    fields.setdefault("q_lora_rank", None)  # (DeepSeek-V2-Lite: q_proj, no LoRA)
    # absent: llama.cpp neither scales nor normalizes the chosen experts' weights
    fields.setdefault("routed_scaling_factor", 1.0)
    normalized = bool(get("expert_weights_norm"))
    gating = get("expert_gating_func")
    if gating is None:
        gating = deepseek2_default_gating(get, get_key)
    bias = any_block_has(tensor_names, "exp_probs_b.bias")
    groups = int(fields.get("n_group") or 1)
    if gating == GATING_SIGMOID:
        # DeepSeek-V3: sigmoid scores, the bias added for the choice only, groups ranked by their
        # two best scores, the chosen weights normalized or not, then scaled
        model_type = "deepseek_v3"
        fields.update(norm_topk_prob=normalized, n_group=groups,
                      topk_group=int(fields.get("topk_group") or groups),
                      rope_interleave=True,  # (llama.cpp rotates adjacent pairs)
                      # as DeepSeek-V3's own config.json says them: vLLM's DeepSeek model reads
                      # these two (transformers' class has no fields for them), and takes
                      # softmax scores and no bias without them
                      scoring_func="sigmoid", topk_method="noaux_tc" if bias else "greedy")
    elif gating == GATING_SOFTMAX:
        if bias:
            raise ValueError("softmax routing with a score-correction bias (exp_probs_b): neither "
                             "of transformers' DeepSeek classes computes it")
        if normalized:
            raise ValueError("softmax routing with the chosen experts' weights normalized "
                             "(expert_weights_norm): transformers' DeepseekV2 does not normalize them")
        model_type = "deepseek_v2"
        # the groups as DeepSeek-V2's own config.json says them, 1 and 1 for none (vLLM's model
        # ranks groups always, and reads None as no count)
        fields.update(topk_method="group_limited_greedy" if groups > 1 else "greedy", norm_topk_prob=False,
                      scoring_func="softmax", n_group=groups,
                      topk_group=int(fields.get("topk_group") or groups))
    else:
        raise ValueError(f"expert gating function {gating}: transformers' DeepSeek classes compute "
                         f"softmax (V2) or sigmoid (V3) scores")
    if "n_routed_experts" not in fields:  # (no experts: every layer dense)
        fields["first_k_dense_replace"] = fields["num_hidden_layers"]
    # (complete_config sets the scaling, as for every architecture)
    fields["rope_parameters"] = {"rope_type": "default",
                                 "rope_theta": float(fields.pop("rope_theta", 10000.0))}
    for field, key in TOKEN_IDS.items():
        fields[field] = get_key(key)
    return {"model_type": model_type, **fields}


# The one model llama.cpp recognizes by its shape when a deepseek2 file names no gating
# function: GLM-4.7-Flash (47 layers, and 48 with its draft layer counted; a vocabulary of
# 154880), whose converter writes none (its config.json has no scoring_func); llama.cpp's
# models/deepseek2.cpp takes sigmoid scores for it
GLM_4_7_FLASH_LAYERS, GLM_4_7_FLASH_VOCAB = (47, 48), 154880


def deepseek2_default_gating(get: Callable[[str], object], get_key: Callable[[str], object]) -> int:
    """The gating function llama.cpp runs for a deepseek2 file that names none: softmax
    (DeepSeek-V2 and V2.5 files), but sigmoid for GLM-4.7-Flash's shape, by the rule of
    llama.cpp's load_arch_hparams: its layers (block_count less the draft layers) and its
    vocabulary (vocab_size, else the token list's length)."""
    layers = int(get("block_count")) - int(get("nextn_predict_layers") or 0)
    vocab = get("vocab_size")
    if vocab is None:
        vocab = len(get_key("tokenizer.ggml.tokens") or ())
    if layers in GLM_4_7_FLASH_LAYERS and int(vocab) == GLM_4_7_FLASH_VOCAB:
        return GATING_SIGMOID
    return GATING_SOFTMAX


def any_block_has(tensor_names: set[str], tensor: str) -> bool:
    """Whether some layer of the file has `tensor` (blk.N.<tensor>)."""
    return any(re.fullmatch(r"blk\.\d+\." + re.escape(tensor), n) for n in tensor_names)


# -- glm4moe (GLM-4.5, 4.6, 4.7) ------------------------------------------------------------------

# key (after "glm4moe.") -> config field, the inverse of Glm4MoeModel.set_gguf_parameters in
# llama.cpp's converter (conversion/glm.py); read by glm4moe_config below
GLM4MOE_FIELDS = {
    **COMMON_FIELDS,  # (block_count counts the draft layers: glm4moe_config sets the model's)
    "attention.key_length": "head_dim", "expert_count": "n_routed_experts",
    "expert_shared_count": "n_shared_experts", "leading_dense_block_count": "first_k_dense_replace",
    "expert_group_count": "n_group", "expert_group_used_count": "topk_group",
    "expert_weights_scale": "routed_scaling_factor",
}


def glm4moe_config(get: Callable[[str], object], get_key: Callable[[str], object],
                   tensor_names: set[str]) -> dict:
    """transformers' Glm4Moe config (as a dict, model_type first) of a glm4moe file. `get(key)`
    reads a key after "glm4moe.", `get_key` a full one. The block count llama.cpp writes
    includes the multi-token-prediction layers (nextn_predict_layers), which the model's main
    path does not run. Raises ValueError, with the reason, for routing Glm4Moe does not compute."""
    fields = {field: get(key) for key, field in GLM4MOE_FIELDS.items() if get(key) is not None}
    for key in ("block_count", "attention.head_count", "embedding_length"):
        if get(key) is None:
            raise ValueError(f"no glm4moe.{key}")
    gating = get("expert_gating_func")
    if gating not in (None, GATING_SIGMOID):
        raise ValueError(f"expert gating function {gating}: transformers' Glm4Moe computes sigmoid scores")
    nextn = int(get("nextn_predict_layers") or 0)
    fields["num_hidden_layers"] = int(get("block_count")) - nextn
    # (llama.cpp writes no vocab_size here: the token list is as long as the embedding)
    tokens = get_key("tokenizer.ggml.tokens")
    if tokens is not None:
        fields["vocab_size"] = len(tokens)
    fields["num_nextn_predict_layers"] = nextn
    head_dim = int(fields.get("head_dim") or int(get("embedding_length")) // int(get("attention.head_count")))
    rope_dim = int(get("rope.dimension_count") or head_dim)
    fields["norm_topk_prob"] = bool(get("expert_weights_norm"))
    # (what llama.cpp reads from the tensors the file has)
    fields["attention_bias"] = any_block_has(tensor_names, "attn_q.bias")
    fields["use_qk_norm"] = any_block_has(tensor_names, "attn_q_norm.weight")
    # GLM's own config.json says these, and vLLM's Glm4Moe reads them (noaux_tc: the routing
    # takes the score-correction bias, which vLLM then expects from the file)
    fields.update(scoring_func="sigmoid",
                  topk_method="noaux_tc" if any_block_has(tensor_names, "exp_probs_b.bias") else "greedy")
    # (complete_config sets the scaling, as for every architecture)
    fields["rope_parameters"] = {"rope_type": "default",
                                 "rope_theta": float(get("rope.freq_base") or 10000.0),
                                 "partial_rotary_factor": rope_dim / head_dim}
    for field, key in TOKEN_IDS.items():
        fields[field] = get_key(key)
    return {"model_type": "glm4_moe", **fields}


def llama3_rope_divisors(factor, low, high, original, theta, dim) -> np.ndarray:
    """llama.cpp's converter's rope_freqs for Llama 3's scaling (float32, as it writes them)."""
    freqs = 1.0 / (np.float32(theta) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)))
    out = []
    for freq in freqs.astype(np.float64):
        wavelen = 2 * math.pi / freq
        if wavelen < original / high:
            out.append(1.0)
        elif wavelen > original / low:
            out.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


def llama3_from_divisors(divisors: np.ndarray, theta: float, dim: int, original=None) -> dict | None:
    """Llama 3's rope_parameters that give exactly `divisors` (llama.cpp keeps the divisors,
    not the parameters). Only the ratios original/low and original/high matter, so `original`
    is the file's (or Llama 3's 8192) and low and high are fitted; None if no fit reproduces
    the divisors."""
    d = np.asarray(divisors, dtype=np.float64)
    if d.shape != (dim // 2,) or not np.all(np.isfinite(d)) or d.min() < 1 - 1e-6 or d.max() <= 1:
        return None
    factor = float(np.float32(d.max()))
    original = float(original or 8192)
    freqs = 1.0 / (np.float32(theta) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)))
    wavelen = 2 * math.pi / freqs.astype(np.float64)
    ones, flat = np.isclose(d, 1.0, rtol=1e-6), np.isclose(d, factor, rtol=1e-6)
    ramp = ~ones & ~flat
    smooth = (1 / d - 1 / factor) / (1 - 1 / factor)  # = original/(high-low)/wavelen - low/(high-low)
    # the wavelengths between which the thresholds original/high and original/low must fall
    lo = wavelen[ones].max() if ones.any() else wavelen.min() / 2
    hi = wavelen[flat].min() if flat.any() else wavelen.max() * 2

    def between(a, b, t):  # geometric interpolation
        return math.exp(math.log(a) * (1 - t) + math.log(b) * t)

    candidates = []
    if ramp.sum() >= 2:  # the line through the ramp
        a, b = np.polyfit(1 / wavelen[ramp], smooth[ramp], 1)
        candidates.append((-b * original / a, (1 - b) * original / a))
    elif ramp.sum() == 1:  # one point of the line: low from the gap above it, high from the point
        w0, s0 = wavelen[ramp][0], smooth[ramp][0]
        for t in (0.5, 0.25, 0.75):
            low = original / between(w0, hi, t)
            candidates.append((low, low + (original / w0 - low) / s0))
    else:  # no ramp: both thresholds in the gap between the plateaus
        candidates += [(original / between(lo, hi, t), original / between(lo, hi, t / 2))
                       for t in (0.5, 0.25, 0.75)]
    for low, high in candidates:
        if not (0 < low < high):
            continue
        again = llama3_rope_divisors(factor, low, high, original, theta, dim)
        if np.allclose(again, d, rtol=2e-6, atol=0):
            return {"rope_type": "llama3", "factor": factor, "low_freq_factor": float(low),
                    "high_freq_factor": float(high), "original_max_position_embeddings": int(original)}
    return None
