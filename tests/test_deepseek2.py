"""llama.cpp's deepseek2 through transformers: files made by llama.cpp's own convert_hf_to_gguf.py
from tiny random DeepSeek-V3 and DeepSeek-V2-Lite-shaped transformers models
(tests/llama_cpp.py, MLA_MODELS), converted here and loaded with load_model, against the model
each file was made from.

transformers' GGUF mapping has no deepseek2, so config.json is ours, the inverse of llama.cpp's
converter (gguf_repack/converter/hf_config.py: deepseek2_config); the model it builds is
transformers' own DeepseekV2/V3 class, whose router computes the routing (sigmoid scores with
the correction bias, expert groups, scaling), with only the experts' products on quantized
stacks (QuantExperts). llama.cpp splits MLA's kv_b_proj per head into attn_k_b (transposed)
and attn_v_b; they are joined back exactly (float files), or held dequantized where quantized
(their blocks run along the other axis), with a warning that says so.

- F32, F16, BF16: the model's weights are bfloat16 values, held exactly: KL <= 1e-4 per
  position over 40 tokens (past the YaRN model's original context of 16), the same 8 greedy
  tokens.
- Q8_0: against the same model with each weight the file holds as Q8_0 replaced by gguf-py's
  Q8_0 round trip along the axis the file quantizes it (kv_b_proj's key part: per column, as
  attn_k_b holds it), KL <= 1e-3; at most 1.2x the file's tensor bytes held.

DeepSeek-V3's score-correction bias is a buffer, which build_model leaves at zero: the V3
files here are made from the model with a random bias, so that a bias lost on the way fails.
"""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
import torch
from hf_models import assert_same_predictions, kl_per_position
from llama_cpp import (
    GLM_4_7_FLASH_LAYERS,
    MLA_MODELS,
    build_model,
    glm_4_7_flash_files,
    mla_files,
    mla_reference,
)
from test_llama_cpp_files import prompt_ids  # the same prompt as the other converter files

from gguf_repack import convert, export, verify
from gguf_repack.converter.hf_config import _times_ten, deepseek2_config
from gguf_repack.converter.reader import read_gguf
from gguf_repack.integrations.tensor_map import join_kv_b

KL_Q8_0 = 1e-3
FLOAT_PAIRS = [("deepseek-v3", "f32"), ("deepseek-v3", "f16"), ("deepseek-v3", "bf16"),
               ("deepseek-v2-lite", "f32")]
NAMES = sorted(MLA_MODELS)
# the cells of docs/architectures.md's table these tests check
CELLS = [pytest.mark.architecture(column, "deepseek2") for column in ("convert", "transformers", "llama_cpp")]


@pytest.fixture(scope="module")
def made(module_tmp):
    """(name, outtype) -> (llama.cpp's file, our output directory, convert's summary)."""
    cache = {}

    def get(name: str, outtype: str):
        if (name, outtype) not in cache:
            src = mla_files(name, [outtype])[outtype]
            out = module_tmp(f"{name}-{outtype}") / "out"
            cache[name, outtype] = src, out, convert(src, out)
        return cache[name, outtype]
    return get


def held_bytes(model) -> int:
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


def file_tensor_bytes(src) -> int:
    return sum(t.nbytes for t in read_gguf(src).tensors)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "outtype"), [pytest.param(*p, marks=CELLS) for p in FLOAT_PAIRS])
def test_float_file_gives_the_model_it_was_made_from(name, outtype, made, recwarn):
    from gguf_repack.hf import QuantExperts, load_model

    src, out, summary = made(name, outtype)
    assert verify(out, against=src).ok
    assert summary.engine_file_warnings == []
    ours, ref = load_model(out), mla_reference(name)
    assert not [w for w in recwarn if "gguf_repack" in str(w.message)]  # nothing dequantized
    assert_same_predictions(ours, ref, prompt_ids(out), steps=8)
    # transformers' own experts module on float stacks, its own router; kv_b_proj joined exactly
    moe = ours.model.layers[1].mlp
    assert not isinstance(moe.experts, QuantExperts)
    assert type(moe.gate) is type(ref.model.layers[1].mlp.gate)
    for layer, ref_layer in zip(ours.model.layers, ref.model.layers):
        expected = ref_layer.self_attn.kv_b_proj.weight
        if outtype == "f16":  # (bfloat16 values below float16's normal range are rounded there)
            expected = expected.half().float()
        assert torch.equal(layer.self_attn.kv_b_proj.weight, expected)
    if MLA_MODELS[name][0] == "deepseek_v3":
        bias = moe.gate.e_score_correction_bias
        assert bias.abs().sum() > 0
        assert torch.equal(bias, ref.model.layers[1].mlp.gate.e_score_correction_bias)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in ref.parameters())


@pytest.mark.slow
@pytest.mark.architecture("convert", "deepseek2")
@pytest.mark.architecture("transformers", "deepseek2")
@pytest.mark.architecture("llama_cpp", "deepseek2")
def test_glm_4_7_flash_file_gives_the_model_it_was_made_from(module_tmp, recwarn):
    """GLM-4.7-Flash as llama.cpp's converter writes it: deepseek2 with its draft layer and no
    gating function, which llama.cpp runs with sigmoid scores for this model's shape (47
    layers, a vocabulary of 154880). config.json: DeepSeek-V3's routing (sigmoid, the
    correction bias, one group, normalized and scaled weights), the draft layer counted apart
    and its tensors left out. The F32 file gives transformers' Glm4MoeLite model it was made
    from (KL <= 1e-4, the same greedy tokens); the Q8_0 file the model with its Q8_0 weights'
    round trips, within KL 1e-3, at most 1.2x the file's tensor bytes held. (Before: "softmax
    routing with a score-correction bias", and no config.json.)"""
    from transformers import AutoModelForCausalLM

    from gguf_repack.hf import load_model

    files = glm_4_7_flash_files(["f32", "q8_0"])
    out = module_tmp("glm-4.7-flash-f32") / "out"
    summary = convert(files["f32"], out)
    assert summary.engine_file_warnings == []
    config = json.loads((out / "config.json").read_text())
    assert {k: config[k] for k in ("model_type", "scoring_func", "topk_method", "n_group", "topk_group",
                                   "norm_topk_prob", "first_k_dense_replace", "num_hidden_layers",
                                   "num_nextn_predict_layers", "vocab_size")} == {
        "model_type": "deepseek_v3", "scoring_func": "sigmoid", "topk_method": "noaux_tc", "n_group": 1,
        "topk_group": 1, "norm_topk_prob": True, "first_k_dense_replace": 1,
        "num_hidden_layers": GLM_4_7_FLASH_LAYERS, "num_nextn_predict_layers": 1, "vocab_size": 154880}
    ref = AutoModelForCausalLM.from_pretrained(files["hf"]).eval()
    assert type(ref).__name__ == "Glm4MoeLiteForCausalLM"
    assert ref.config.num_hidden_layers == GLM_4_7_FLASH_LAYERS
    ours = load_model(out)
    assert not [w for w in recwarn if "gguf_repack" in str(w.message)]
    assert_same_predictions(ours, ref, prompt_ids(out), steps=8)
    bias = ours.model.layers[1].mlp.gate.e_score_correction_bias
    assert bias.abs().sum() > 0 and torch.equal(bias, ref.model.layers[1].mlp.gate.e_score_correction_bias)

    q8 = module_tmp("glm-4.7-flash-q8_0") / "out"
    convert(files["q8_0"], q8)
    with pytest.warns(UserWarning, match="held dequantized"):  # kv_b_proj, as for DeepSeek
        ours = load_model(q8)
    draft = read_gguf(files["q8_0"]).tensors
    held = sum(t.nbytes for t in draft if not t.name.startswith(f"blk.{GLM_4_7_FLASH_LAYERS}."))
    assert held_bytes(ours) <= 1.2 * held, (held_bytes(ours), held)
    reference, _, _ = q8_0_reference(ref)
    ids = prompt_ids(out)
    with torch.no_grad():
        kl = kl_per_position(reference(ids).logits[0], ours(ids).logits[0])
    assert kl.max().item() <= KL_Q8_0, kl.max().item()


def _q8_0_round_trip(w: torch.Tensor) -> torch.Tensor:
    """gguf-py's Q8_0 quantization of each row of `w` (the last axis), dequantized."""
    rows = w.reshape(-1, w.shape[-1]).numpy()
    back = gguf.quants.dequantize(gguf.quants.quantize(rows, gguf.GGMLQuantizationType.Q8_0),
                                  gguf.GGMLQuantizationType.Q8_0)
    return torch.from_numpy(back).reshape(w.shape)


def q8_0_reference(model, src=None):
    """`model` (an MLA model: mla_reference(name)'s, or a file's own) with every weight the
    converter writes as Q8_0 (each 2-D or 3-D weight but the router's, which it keeps float32)
    replaced by its Q8_0 round trip, along the axis the file quantizes it: rows, and for
    kv_b_proj, which the converter splits per head into the key part transposed (attn_k_b)
    and the value part, the key part's columns. Returns the model and the Q8_0 weights
    counted, in the file `src` (None without one) and in the model."""
    config = model.config
    in_file = None if src is None else \
        sum(int(np.prod(t.shape)) for t in read_gguf(src).tensors if t.type.name == "Q8_0")
    in_model = 0
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if p.dim() < 2 or pname.endswith("mlp.gate.weight"):
                continue
            if pname.endswith("kv_b_proj.weight"):
                nope = config.qk_nope_head_dim
                heads = p.view(config.num_attention_heads, nope + config.v_head_dim, config.kv_lora_rank)
                key = _q8_0_round_trip(heads[:, :nope].transpose(1, 2).contiguous()).transpose(1, 2)
                value = _q8_0_round_trip(heads[:, nope:].contiguous())
                p.copy_(torch.cat([key, value], dim=1).reshape(p.shape))
            else:
                p.copy_(_q8_0_round_trip(p))
            in_model += p.numel()
    return model, in_file, in_model


@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param(n, marks=CELLS) for n in NAMES])
def test_q8_0_file_gives_the_model_with_q8_0_weights(name, made):
    from transformers import AutoModelForCausalLM

    from gguf_repack.hf import QuantExperts, QuantLinear, load_model

    src, out, summary = made(name, "q8_0")
    assert verify(out, against=src).ok
    assert summary.engine_file_warnings == []
    with pytest.warns(UserWarning, match=r"4 quantized MLA kv_b_proj weights are held dequantized.*"
                                         r"blk\.0\.attn_k_b\.weight"):
        ours = load_model(out)
    assert isinstance(ours.model.layers[1].mlp.experts, QuantExperts)
    assert isinstance(ours.model.layers[1].self_attn.o_proj, QuantLinear)
    assert held_bytes(ours) <= 1.2 * file_tensor_bytes(src), (held_bytes(ours), file_tensor_bytes(src))
    ref, in_file, in_reference = q8_0_reference(mla_reference(name), src)
    assert in_reference == in_file
    ids = prompt_ids(out)
    with torch.no_grad():
        logits = ours(ids).logits
        kl = kl_per_position(ref(ids).logits[0], logits[0])
    assert kl.max().item() <= KL_Q8_0, kl.max().item()

    with pytest.warns(UserWarning, match="held dequantized"):
        via_auto = AutoModelForCausalLM.from_pretrained(out)  # the registered quantizer
    assert isinstance(via_auto.model.layers[1].mlp.experts, QuantExperts)
    assert held_bytes(via_auto) <= 1.2 * file_tensor_bytes(src)
    with torch.no_grad():
        assert torch.equal(via_auto(ids).logits, logits)


@pytest.mark.slow
@pytest.mark.architecture("convert", "deepseek2")
def test_deepseek2_files_export_byte_for_byte(made, tmp_path):
    for outtype in ("f32", "q8_0"):
        src, out, _ = made("deepseek-v3", outtype)
        export(out, tmp_path / f"{outtype}.gguf")
        assert (tmp_path / f"{outtype}.gguf").read_bytes() == src.read_bytes()


@pytest.mark.slow
def test_config_json_is_the_models_own(made):
    """What llama.cpp's converter keeps of each model's config comes back in config.json."""
    fields = ["q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
              "first_k_dense_replace", "moe_intermediate_size", "n_shared_experts", "n_routed_experts",
              "num_experts_per_tok", "routed_scaling_factor", "num_attention_heads", "num_key_value_heads",
              "hidden_size", "intermediate_size", "num_hidden_layers", "max_position_embeddings"]
    for name in NAMES:
        config = json.loads((made(name, "f32")[1] / "config.json").read_text())
        own = build_model(name).config
        assert config["model_type"] == own.model_type
        assert {f: config[f] for f in fields} == {f: getattr(own, f) for f in fields}
        assert config["rope_parameters"] == own.rope_parameters
        if own.model_type == "deepseek_v3":
            assert (config["n_group"], config["topk_group"], config["norm_topk_prob"]) == (4, 2, True)
        else:
            assert (config["topk_method"], config["norm_topk_prob"]) == ("greedy", False)


# -- fast ---------------------------------------------------------------------------------


def test_kv_b_comes_back_from_llama_cpps_split():
    """join_kv_b undoes the converter's split (conversion/deepseek.py: kv_b_proj viewed per head
    as (qk_nope + v, kv_lora) rows, split, the key part transposed), for widths that all differ."""
    heads, nope, v, kv_lora = 3, 16, 8, 24
    kv_b = torch.randn(heads * (nope + v), kv_lora)
    per_head = kv_b.view(heads, nope + v, kv_lora)
    k_b, v_b = per_head[:, :nope].transpose(1, 2), per_head[:, nope:]  # (3, 24, 16), (3, 8, 24)
    assert torch.equal(join_kv_b(k_b, v_b), kv_b)
    with pytest.raises(Exception, match="not the two parts"):
        join_kv_b(v_b, k_b)


def _keys(**extra):
    keys = {"block_count": 2, "attention.head_count": 4, "attention.kv_lora_rank": 32,
            "rope.dimension_count": 32, "attention.key_length": 64, "attention.value_length": 32,
            "attention.key_length_mla": 64, "attention.value_length_mla": 32, "expert_count": 8,
            "expert_used_count": 2, "embedding_length": 128, "rope.freq_base": 10000.0}
    return {**keys, **extra}


def _config(keys, tensors=()):
    return deepseek2_config(keys.get, {}.get, set(tensors))


def test_the_routing_picks_transformers_class():
    v3 = _config(_keys(expert_gating_func=2, expert_weights_norm=True, expert_group_count=4,
                       expert_group_used_count=2, expert_weights_scale=2.5), ["blk.1.exp_probs_b.bias"])
    assert (v3["model_type"], v3["n_group"], v3["topk_group"], v3["norm_topk_prob"],
            v3["routed_scaling_factor"]) == ("deepseek_v3", 4, 2, True, 2.5)
    assert (v3["qk_nope_head_dim"], v3["v_head_dim"], v3["num_key_value_heads"],
            v3["q_lora_rank"]) == (32, 32, 4, None)
    v2 = _config(_keys(expert_gating_func=1))
    assert (v2["model_type"], v2["topk_method"], v2["norm_topk_prob"]) == ("deepseek_v2", "greedy", False)
    assert _config(_keys())["model_type"] == "deepseek_v2"  # (no key: llama.cpp takes softmax)
    grouped = _config(_keys(expert_group_count=8, expert_group_used_count=3))
    assert grouped["topk_method"] == "group_limited_greedy"


def test_a_file_without_a_gating_function_is_routed_as_llama_cpp_routes_it():
    """No expert_gating_func: softmax (DeepSeek-V2 and V2.5 files), but sigmoid for
    GLM-4.7-Flash's shape (llama.cpp's models/deepseek2.cpp: 47 or 48 layers, the draft
    layers not counted, and a vocabulary of 154880, from vocab_size or the token list)."""
    bias = ["blk.1.exp_probs_b.bias"]
    glm = dict(expert_weights_norm=True, expert_group_count=1, expert_group_used_count=1)
    for layers, nextn in ((47, 0), (48, 1), (48, 0)):
        keys = _keys(block_count=layers, nextn_predict_layers=nextn, vocab_size=154880, **glm)
        config = _config(keys, bias)
        assert (config["model_type"], config["scoring_func"], config["num_hidden_layers"]) == \
            ("deepseek_v3", "sigmoid", layers - nextn)
    tokens = {"tokenizer.ggml.tokens": ["t"] * 154880}
    config = deepseek2_config(_keys(block_count=47, **glm).get, tokens.get, set(bias))
    assert config["scoring_func"] == "sigmoid"
    for layers, vocab in ((49, 154880), (47, 154881), (27, 102400)):
        with pytest.raises(ValueError, match="softmax routing with a score-correction bias"):
            _config(_keys(block_count=layers, vocab_size=vocab, **glm), bias)
        assert _config(_keys(block_count=layers, vocab_size=vocab))["model_type"] == "deepseek_v2"


@pytest.mark.parametrize(("extra", "tensors", "why"), [
    ({"expert_gating_func": 1}, ["blk.1.exp_probs_b.bias"], "softmax routing with a score-correction bias"),
    ({}, ["blk.1.exp_probs_b.bias"], "softmax routing with a score-correction bias"),
    ({"expert_weights_norm": True}, [], "does not normalize"),
    ({"expert_gating_func": 3}, [], "gating function 3"),
    ({"attention.key_length": 128}, [], "not MLA's latent widths"),
])
def test_routing_no_transformers_class_computes_is_refused(extra, tensors, why):
    with pytest.raises(ValueError, match=why):
        _config(_keys(**extra), tensors)


def test_mscale_comes_back_from_the_log_multiplier():
    """The converter writes 0.1 * mscale_all_dim as a float32."""
    for mscale in (0.707, 1.0, 0.1):
        assert _times_ten(float(np.float32(0.1 * mscale))) == mscale
