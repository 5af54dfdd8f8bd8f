"""Files as llama.cpp really writes them: every model of tests/llama_cpp.py (an architecture of
docs/architectures.md's table or one of its variants: tied and untied embeddings, each rope
scaling, Falcon-40B, GPT-2 at another context, a shared expert), converted by llama.cpp's own
convert_hf_to_gguf.py at F32, F16, BF16 and Q8_0, then through this project: convert, verify,
and transformers (load_model) against the transformers model the file was made from.

- F32, F16, BF16: the model's weights are bfloat16 values, so each file holds them exactly;
  KL <= 1e-4 per position on a 40-token prompt (past the scaled models' original context of
  16), and the same 8 greedy tokens.
- Q8_0: against the same model with each weight the converter quantizes replaced by gguf-py's
  Q8_0 round trip of it (quantized per row of 32 weights as the converter does); the bound is
  KL_Q8_0.
- Every metadata key of every file is mapped, listed as carrying nothing an engine needs, or
  named in a warning (gguf_repack/converter/hf_config.py); none of these files has one left.
"""

from __future__ import annotations

import json
import re
import shutil
import warnings
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from hf_models import assert_same_predictions, kl_per_position, tokenizer_of
from llama_cpp import (
    MLA_MODELS,
    MODELS,
    QWEN3_VL_MODELS,
    TOKENIZER_MODEL_TYPE,
    VLLM_BFLOAT16_ONLY,
    VLLM_OWN_REFERENCE,
    build_model,
    glm_mtp_files,
    hf_model_dir,
    llama_cpp_files,
    mla_files,
    qwen3_vl_files,
    qwen35_mtp_files,
    save_checkpoint,
)
from test_vllm import run_vllm_many, vllm_python, window_as_vllm_counts  # noqa: F401 (a fixture)

from gguf_repack import convert, export, verify
from gguf_repack.converter.arch_configs import ARCHS
from gguf_repack.converter.hf_config import (
    glm4moe_config,
    llama3_from_divisors,
    llama3_rope_divisors,
    unaccounted_keys,
)
from gguf_repack.converter.reader import read_gguf
from gguf_repack.integrations.architectures import ARCHITECTURES, TESTED

PROMPT = ("The three primary colors are red, yellow and blue. The capital of France is Paris, "
          "and the capital of Italy is Rome. def fibonacci(n): return n if n < 2 else "
          "fibonacci(n - 1) + fibonacci(n - 2)")
N_PROMPT = 40
KL_Q8_0 = 1e-3
NAMES = sorted(MODELS)
# F16 and BF16 differ from F32 only in the float tensors' dtype: run for a tied model, the
# per-layer rope, the MoE kinds (float expert stacks), Falcon-40B's reordered rows, Mamba
HALF = ["llama", "gemma3", "qwen2moe", "qwen3moe", "gpt-oss", "mixtral", "falcon-40b", "mamba"]
PAIRS = [*((n, "f32") for n in NAMES), *((n, "q8_0") for n in NAMES),
         *((n, t) for n in HALF for t in ("f16", "bf16"))]


def table_row(name: str) -> str:
    """The row of docs/architectures.md's table a model stands for (llama.cpp's name)."""
    if name in MLA_MODELS:
        return "deepseek2"
    if name == "glm4moe-mtp":  # (glm_mtp_files)
        return "glm4moe"
    if name.startswith("nemotron-h"):  # (one model type, nemotron_h, for both)
        return {"nemotron-h": "nemotron_h", "nemotron-h-moe": "nemotron_h_moe"}[name]
    if name in QWEN3_VL_MODELS:  # (qwen3_vl_files)
        return {"qwen3-vl": "qwen3vl", "qwen3-vl-moe": "qwen3vlmoe"}[name]
    model_type = MODELS[name][0]
    # (an architecture whose config is another's class, Qwen3-VL's text as qwen3, is not the
    # row of that class's own models)
    own = {spec.model_type: arch for arch, spec in ARCHS.items() if spec.model_type not in ARCHITECTURES}
    return {**own, "gemma3_text": "gemma3", "qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe",
            "gpt_oss": "gpt-oss", "glm4_moe": "glm4moe", "granitemoeshared": "granitemoe",
            "olmo3": "olmo2"}.get(model_type, model_type)


# architectures transformers' GGUF path cannot read: these files are their transformers tests
# too (load_model against the model they were made from), and their format-level ones
OUTSIDE_TRANSFORMERS_GGUF = {"glm4moe", *ARCHS}


def marked(name: str, outtype: str):
    row = table_row(name)
    columns = ["llama_cpp", *(["transformers", "convert"] if row in OUTSIDE_TRANSFORMERS_GGUF else [])]
    return pytest.param(name, outtype, marks=[pytest.mark.architecture(c, row) for c in columns])


@pytest.fixture(scope="module")
def made(module_tmp):
    """(name, outtype) -> (llama.cpp's file, our output directory), converted once."""
    files = llama_cpp_files(PAIRS)  # the missing ones in one converter process
    cache = {}

    def get(name: str, outtype: str):
        if (name, outtype) not in cache:
            # (MLA's files: tests/test_deepseek2.py holds them to their models)
            src = (mla_files(name, [outtype])[outtype] if name in MLA_MODELS else
                   glm_mtp_files([outtype])[outtype] if name == "glm4moe-mtp" else
                   qwen35_mtp_files([outtype])[outtype] if name == "qwen35-mtp" else
                   qwen3_vl_files(name, [outtype])[outtype] if name in QWEN3_VL_MODELS else
                   files[(name, outtype)])
            out = module_tmp(f"{name}-{outtype}") / "out"
            cache[name, outtype] = src, out, convert(src, out)
        return cache[name, outtype]
    return get


def prompt_ids(out) -> torch.Tensor:
    ids = tokenizer_of(out)(PROMPT, return_tensors="pt").input_ids
    assert ids.shape[1] >= N_PROMPT, ids.shape
    return ids[:, :N_PROMPT]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "outtype"), [marked(n, t) for n, t in PAIRS if t != "q8_0"])
def test_float_file_gives_the_model_it_was_made_from(name, outtype, made):
    from gguf_repack.hf import load_model

    src, out, summary = made(name, outtype)
    assert verify(out, against=src).ok
    assert summary.engine_file_warnings == []
    ours, ref = load_model(out), build_model(name)
    assert_same_predictions(ours, ref, prompt_ids(out), steps=8)
    # every float weight held once, in the compute dtype (a tied embedding: one parameter)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in ref.parameters())


def q8_0_reference(name: str, src, model=None) -> torch.nn.Module:
    """The model (`build_model(name)`, or `model`) with every weight the file holds as Q8_0
    replaced by gguf-py's Q8_0 round trip: found by shape among the model's (out, in) weights
    (GPT-2's Conv1D: (in, out)); a vision tower's (Qwen3-VL's, not in the file) left alone."""
    model = build_model(name) if model is None else model
    quantized = {}
    # (the file's tensor types by the project's scanner: gguf-py's reader takes 10 s on the
    # 49k-token vocabulary; these are not the reference's values, only a census of them)
    routers = False  # (llama.cpp's converter quantizes DBRX's router; llama-quantize others' not)
    for t in read_gguf(src).tensors:
        if t.type.name == "Q8_0":
            shape = t.shape
            quantized[shape] = quantized.get(shape, 0) + int(np.prod(shape))
            routers |= t.name.endswith("ffn_gate_inp.weight")
    # modules holding (in, out) weights: GPT-2's Conv1D, gpt-oss's and Llama 4's experts
    conv1d = {n for n, m in model.named_modules()
              if type(m).__name__ in ("Conv1D", "GptOssExperts", "Llama4TextExperts")}
    skip = r"(norm[^.]*\.weight$|wpe|position|conv1d|\.gate\.|shared_expert_gate|visual" + \
        ("" if routers else r"|(?<!modality_)router") + ")"
    done = {}
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if p.dim() < 2 or re.search(skip, pname):
                continue
            transposed = pname.rpartition(".")[0] in conv1d
            w = p.mT if transposed else p
            if pname.endswith(".experts.mlp.w2"):  # (DBRX's down stack: each expert's (ffn, hidden))
                w = p.view(-1, model.config.ffn_config.ffn_hidden_size, p.shape[-1]).mT
            shape = tuple(w.shape)
            if shape[-1] % 32:
                continue
            # (Qwen3.5's ssm_out: quantized in the converter's column order)
            order = tiled_value_heads(model.config) if pname.endswith("linear_attn.out_proj.weight") else None
            rows = (w if order is None else w[:, order]).reshape(-1, shape[-1]).numpy()
            back = gguf.quants.dequantize(gguf.quants.quantize(rows, gguf.GGMLQuantizationType.Q8_0),
                                          gguf.GGMLQuantizationType.Q8_0)
            back = torch.from_numpy(back).reshape(shape)
            if order is not None:
                back = back[:, torch.argsort(order)]
            w.copy_(back)
            done[shape[-1]] = done.get(shape[-1], 0) + p.numel()
    # the same weights quantized, by row width (engines join or split some: gate and up)
    by_width = {}
    for shape, n in quantized.items():
        by_width[shape[-1]] = by_width.get(shape[-1], 0) + n
    return model, by_width, done


@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param(n, marks=[pytest.mark.architecture(c, table_row(n))
                                                          for c in ("convert", "transformers", "llama_cpp")])
                                  for n in sorted(QWEN3_VL_MODELS)])
def test_qwen3_vl_text_files_give_the_models_text_predictions(name, made):
    """Qwen3-VL's text files (qwen3vl, qwen3vlmoe), from transformers' whole
    Qwen3VLForConditionalGeneration (vision tower and all; the converter writes the text model):
    config.json Qwen3's (Qwen3-MoE's), whose rope is the multimodal rope's on text. The F32 file
    gives the whole model's predictions on text (KL <= 1e-4, the same greedy tokens); the Q8_0
    file the whole model with the file's Q8_0 weights round-tripped, within KL 1e-3, at most
    1.2x the file's tensor bytes held."""
    from transformers import AutoModelForImageTextToText

    from gguf_repack.hf import load_model

    def reference():
        return AutoModelForImageTextToText.from_pretrained(qwen3_vl_files(name, [])["hf"]).eval()

    src, out, summary = made(name, "f32")
    assert verify(out, against=src).ok and summary.engine_file_warnings == []
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == {"qwen3-vl": "qwen3", "qwen3-vl-moe": "qwen3_moe"}[name]
    assert_same_predictions(load_model(out), reference(), prompt_ids(out), steps=8)

    src, out, _ = made(name, "q8_0")
    ours = load_model(out)
    ref, in_file, in_reference = q8_0_reference(name, src, reference())
    assert in_reference == in_file
    ids = prompt_ids(out)
    with torch.no_grad():
        kl = kl_per_position(ref(input_ids=ids).logits[0], ours(ids).logits[0])
    assert kl.max().item() <= KL_Q8_0, kl.max().item()
    held = sum(t.numel() * t.element_size() for t in [*ours.parameters(), *ours.buffers()])
    source = sum(t["source"]["nbytes"] for t in json.loads((out / "manifest.json").read_text())["tensors"])
    assert held <= 1.2 * source, (held / source)


def tiled_value_heads(config) -> torch.Tensor:
    """The value-head order llama.cpp's converter writes Qwen3.5's tensors in (its
    _LinearAttentionVReorderBase._reorder_v_heads: (key heads, group, width) permuted to (group,
    key heads, width)), as indices into the model's order."""
    key_heads, width = config.linear_num_key_heads, config.linear_value_head_dim
    group = config.linear_num_value_heads // key_heads
    index = torch.arange(key_heads * group * width).reshape(key_heads, group, width)
    return index.permute(1, 0, 2).reshape(-1)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_q8_0_file_gives_the_model_with_q8_0_weights(name, made):
    from gguf_repack.hf import QuantLinear, load_model

    src, out, summary = made(name, "q8_0")
    assert verify(out, against=src).ok
    assert summary.engine_file_warnings == []
    ours = load_model(out)
    assert any(isinstance(m, QuantLinear) for m in ours.modules())
    ref, in_file, in_reference = q8_0_reference(name, src)
    assert in_reference == in_file
    ids = prompt_ids(out)
    with torch.no_grad():
        kl = kl_per_position(ref(ids).logits[0], ours(ids).logits[0])
    assert kl.max().item() <= KL_Q8_0, kl.max().item()
    # what the model holds (parameters, buffers) against the file's tensor bytes
    held = sum(t.numel() * t.element_size() for t in [*ours.parameters(), *ours.buffers()])
    source = sum(t["source"]["nbytes"] for t in json.loads((out / "manifest.json").read_text())["tensors"])
    assert held <= 1.2 * source, (held / source)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama", "phi3-longrope", "glm4moe"])
def test_llama_cpp_file_exports_byte_for_byte(name, made, tmp_path):
    for outtype in ("f32", "q8_0"):
        src, out, _ = made(name, outtype)
        export(out, tmp_path / f"{outtype}.gguf")
        assert (tmp_path / f"{outtype}.gguf").read_bytes() == src.read_bytes()


@pytest.mark.slow
def test_glm_file_with_its_draft_layer_gives_the_model_without_it(made):
    """GLM-4.5's checkpoints hold a layer past the model's own for multi-token prediction, and
    llama.cpp's converter keeps it (blk.N.*, blk.N.nextn.*, block_count N + 1): left out with
    its reason, every other tensor loaded, the predictions those of the model's own layers."""
    from transformers import AutoModelForCausalLM

    from gguf_repack.hf import load_model
    from gguf_repack.integrations.tensor_map import MTP_LAYER, TensorMapping
    from gguf_repack.runtime.loader import load

    src, out, summary = made("glm4moe-mtp", "f32")
    assert summary.engine_file_warnings == []
    assert verify(out, against=src).ok
    config = json.loads((out / "config.json").read_text())
    assert (config["num_hidden_layers"], config["num_nextn_predict_layers"]) == (2, 1)
    skipped = TensorMapping.for_output(load(out)).skipped
    in_file = [t.name for t in read_gguf(src).tensors]
    assert sorted(skipped) == sorted(n for n in in_file if n.startswith("blk.2."))
    assert {"blk.2.nextn.eh_proj.weight", "blk.2.ffn_down_exps.weight"} <= set(skipped)
    assert set(skipped.values()) == {MTP_LAYER}
    ref = AutoModelForCausalLM.from_pretrained(glm_mtp_files([])["hf"], dtype=torch.float32).eval()
    assert_same_predictions(load_model(out), ref, prompt_ids(out), steps=8)


@pytest.mark.slow
def test_qwen35_file_with_its_draft_layer_gives_the_model_without_it(made):
    """Qwen3.5's checkpoints hold a multi-token-prediction layer (mtp.*), which llama.cpp's
    converter keeps by default (blk.N.*, blk.N.nextn.*, block_count N + 1, nextn_predict_layers
    1, recurrent_layers one longer): config.json says the model's own layers and
    mtp_num_hidden_layers, the draft layer's tensors are left out with their reason, and the
    predictions are those of the model's own layers."""
    from transformers import AutoModelForCausalLM

    from gguf_repack.hf import load_model
    from gguf_repack.integrations.tensor_map import MTP_LAYER, TensorMapping
    from gguf_repack.runtime.loader import load

    for outtype in ("f32", "q8_0"):
        src, out, summary = made("qwen35-mtp", outtype)
        assert summary.engine_file_warnings == []
        config = json.loads((out / "config.json").read_text())
        assert (config["num_hidden_layers"], config["mtp_num_hidden_layers"]) == (4, 1)
        assert config["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
        skipped = TensorMapping.for_output(load(out)).skipped
        in_file = [t.name for t in read_gguf(src).tensors]
        assert sorted(skipped) == sorted(n for n in in_file if n.startswith("blk.4."))
        assert {"blk.4.nextn.eh_proj.weight", "blk.4.attn_q.weight"} <= set(skipped)
        assert set(skipped.values()) == {MTP_LAYER}
    ref = AutoModelForCausalLM.from_pretrained(qwen35_mtp_files([])["hf"], dtype=torch.float32).eval()
    out = made("qwen35-mtp", "f32")[1]
    assert_same_predictions(load_model(out), ref, prompt_ids(out), steps=8)


@pytest.mark.slow
def test_every_key_llama_cpp_writes_is_accounted_for(made):
    """Each key of each file is mapped, listed with its reason, or would be warned about."""
    left = {}
    for name in NAMES:
        src, _, _ = made(name, "f32")
        kvs = read_gguf(src).kvs
        if unknown := unaccounted_keys(list(kvs), kvs["general.architecture"].value):
            left[name] = unknown
    assert left == {}


@pytest.mark.slow
def test_rope_scaling_is_in_config_json(made):
    """What each scaled model's config.json says: the inverse of the converter."""
    def rope(name):
        return json.loads((made(name, "f32")[1] / "config.json").read_text())["rope_parameters"]
    assert rope("llama-rope-linear") == {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}
    assert rope("llama-rope-yarn") == {"rope_type": "yarn", "factor": 16.0, "rope_theta": 10000.0,
                                       "original_max_position_embeddings": 16}
    llama3 = rope("llama-rope-llama3")
    assert llama3["rope_type"] == "llama3" and llama3["factor"] == 8.0
    longrope = rope("phi3-longrope")
    assert longrope["rope_type"] == "longrope"
    assert longrope["long_factor"] == MODELS["phi3-longrope"][1]["rope_parameters"]["long_factor"]
    gemma3 = rope("gemma3")
    assert gemma3["full_attention"] == {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}
    assert gemma3["sliding_attention"]["rope_theta"] == 10000.0
    assert "factor" not in gemma3["sliding_attention"]
    assert rope("starcoder2")["rope_theta"] == 100000.0


def test_llama3_parameters_come_back_from_the_divisors():
    """Llama 3.1's own parameters, and others, give back divisors equal to llama.cpp's
    (the fitted low/high may differ: only original/low and original/high matter)."""
    for theta, dim, factor, low, high, original in [(500000.0, 128, 8.0, 1.0, 4.0, 8192),
                                                    (500000.0, 64, 32.0, 1.0, 4.0, 8192),
                                                    (10000.0, 16, 8.0, 1.0, 4.0, 16),
                                                    (10000.0, 16, 4.0, 2.0, 8.0, 256)]:
        divisors = llama3_rope_divisors(factor, low, high, original, theta, dim)
        rope = llama3_from_divisors(divisors, theta, dim)
        assert rope is not None and rope["factor"] == factor
        again = llama3_rope_divisors(rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"],
                                     rope["original_max_position_embeddings"], theta, dim)
        np.testing.assert_allclose(again, divisors, rtol=2e-6)
    assert llama3_from_divisors(np.linspace(1, 3, 8, dtype=np.float32)[::-1], 10000.0, 16) is None


def test_glm4moe_config_leaves_the_draft_layers_out_and_refuses_other_routing():
    keys = {"block_count": 47, "nextn_predict_layers": 1, "attention.head_count": 96,
            "embedding_length": 5120, "attention.key_length": 128, "rope.dimension_count": 64,
            "expert_gating_func": 2, "expert_weights_norm": True}
    tokens = ["a"] * 151552
    config = glm4moe_config(keys.get, {"tokenizer.ggml.tokens": tokens}.get,
                            {"blk.0.attn_q.bias", "blk.0.attn_q_norm.weight", "blk.3.exp_probs_b.bias"})
    assert (config["model_type"], config["num_hidden_layers"], config["num_nextn_predict_layers"]) == \
        ("glm4_moe", 46, 1)
    assert config["vocab_size"] == 151552 and config["rope_parameters"]["partial_rotary_factor"] == 0.5
    assert config["attention_bias"] and config["use_qk_norm"] and config["norm_topk_prob"]
    assert config["topk_method"] == "noaux_tc"
    assert glm4moe_config(keys.get, {}.get, set())["topk_method"] == "greedy"  # (no bias: none expected)
    with pytest.raises(ValueError, match="sigmoid"):
        glm4moe_config({**keys, "expert_gating_func": 1}.get, {}.get, set())


def test_an_unknown_key_is_named():
    keys = ["general.architecture", "llama.context_length", "llama.rope.scaling.new_thing",
            "tokenizer.ggml.tokens", "general.name", "general.source.url"]
    assert unaccounted_keys(keys, "llama") == ["llama.rope.scaling.new_thing"]


# through vLLM (one process for all): what config.json must carry for an engine that builds
# its model from it alone: the float tied embedding, each rope scaling, Falcon-40B, GPT-2 at
# 2048, StarCoder2's rope base, Qwen2-MoE's shared-expert gate, a float expert stack; and the
# table's vLLM column (one rank) for every architecture that vLLM runs here, each by a file of
# llama.cpp's converter (Q8_0 blocks where the variants above are float; K-quant blocks of the
# same architectures go through vLLM at two ranks, tests/test_architectures.py)
VLLM_PAIRS = [("llama", "f16"), ("llama-rope-llama3", "f32"), ("llama-rope-yarn", "q8_0"),
              ("llama-rope-linear", "f32"), ("phi3-longrope", "f32"), ("qwen2-rope-yarn", "q8_0"),
              ("gemma3", "bf16"), ("starcoder2", "q8_0"), ("falcon-40b", "f32"),
              ("gpt2-ctx2048", "q8_0"), ("qwen2moe", "f32"), ("qwen3moe", "f16"),
              ("bloom", "q8_0"), ("falcon", "q8_0"), ("gemma2", "q8_0"), ("mistral", "q8_0"),
              ("nemotron", "q8_0"), ("qwen3", "q8_0"), ("stablelm", "q8_0"), ("mixtral", "q8_0"),
              # DeepSeek's MLA (kv_b_proj joined from llama.cpp's two parts), V3's routing
              # (sigmoid, correction bias, groups) on quantized experts; V2-Lite's shape (no q
              # LoRA, softmax routing) too. (Its 7th and 8th tokens "differed" here until
              # 2026-12-05: its context was 64 positions, which vLLM stops at after 57 of the
              # prompt and 7 tokens, and transformers' generate goes past)
              ("deepseek-v3", "q8_0"), ("deepseek-v2-lite", "q8_0"),
              # expert biases, attention sinks, a sliding window of 8 over the prompt
              ("gpt-oss", "q8_0"),
              # GLM-4.5's routing (sigmoid, correction bias) and shared expert, partial rope; and
              # a file with its draft layer for multi-token prediction, left out
              ("glm4moe", "q8_0"), ("glm4moe-mtp", "f32"),
              # the architectures whose config.json is arch_configs.py's table (Cohere2 with
              # its window as vLLM counts it: test_vllm.window_as_vllm_counts)
              *((name, "q8_0") for name in NAMES
                if table_row(name) in ARCHS and ARCHITECTURES[table_row(name)]["vllm"] == TESTED
                and table_row(name) not in VLLM_BFLOAT16_ONLY | VLLM_OWN_REFERENCE),
              # Llama 4 float too (vLLM's own experts method; its load_weights reorders the q/k
              # rows, which the plugin gives the quantized planes: weights._load_row_order)
              ("llama4", "f32"),
              # Qwen3-VL's text models, run as Qwen3 and Qwen3-MoE
              ("qwen3-vl", "q8_0"), ("qwen3-vl-moe", "q8_0")]
# and a shorter one (22 tokens, past the original context of the rope-scaled models: under
# it, transformers and vLLM pick LongRoPE's factors differently): over the long prompt some
# tiny random models repeat one token
VLLM_PROMPTS = [PROMPT, "Once upon a time there was a little girl who lived in a village near the forest, "
                        "and every day she"]
VLLM_ARCHS = sorted({table_row(name) for name, _ in VLLM_PAIRS
                     if ARCHITECTURES[table_row(name)]["vllm"] == TESTED} - {"llama", "gemma3"})


@pytest.fixture(scope="module")
def own_reference_pairs(made, module_tmp):
    """(vLLM's own reference, our output directory) of each VLLM_OWN_REFERENCE model: the
    checkpoint and the float file's; that checkpoint with every weight the Q8_0 file quantizes
    replaced by gguf-py's Q8_0 round trip, and the Q8_0 file's."""
    pairs = []
    for name in sorted(VLLM_OWN_REFERENCE):
        f32_out = made(name, "f32")[1]
        checkpoint = module_tmp(f"{name}-checkpoint")
        shutil.copytree(hf_model_dir(name), checkpoint, dirs_exist_ok=True)
        pairs.append((with_tokenizer_of(f32_out, checkpoint), f32_out))
        src, q8_0_out, _ = made(name, "q8_0")
        pairs.append(q8_0_own_reference(name, src, q8_0_out, module_tmp(f"{name}-q8_0-round-trip")))
    return pairs


def q8_0_own_reference(name: str, src: Path, out: Path, target: Path) -> tuple[Path, Path]:
    """(vLLM's own reference, our output directory) of a VLLM_OWN_REFERENCE model's Q8_0 file
    `src` (converted into `out`): the checkpoint it was made from with every weight the file
    quantizes replaced by gguf-py's Q8_0 round trip, saved into `target`."""
    save_checkpoint(name, q8_0_reference(name, src)[0], target)
    return with_tokenizer_of(out, target), out


def with_tokenizer_of(out: Path, checkpoint: Path) -> Path:
    """`checkpoint` with the tokenizer of our output directory `out` in place of its own, so
    that both get the same prompt ids (Gemma 3n's SentencePiece checkpoint tokenizes otherwise
    in vLLM than the tokenizer transformers makes from the GGUF file; the models, not the
    tokenizers, are compared here)."""
    for f in checkpoint.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens_map", "chat_template")):
            f.unlink()
    for f in out.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens_map", "chat_template")):
            shutil.copy(f, checkpoint / f.name)
    return checkpoint


@pytest.fixture(scope="module")
def vllm_float32_results(made, own_reference_pairs, vllm_python):  # noqa: F811
    """Every float32 run of this module at one rank, in one vLLM start: VLLM_PAIRS' outputs and
    the own-reference pairs."""
    dirs = [window_as_vllm_counts(made(*pair)[1]) for pair in VLLM_PAIRS]
    dirs += [d for pair in own_reference_pairs for d in pair]
    return run_vllm_many(vllm_python, dirs, prompts=VLLM_PROMPTS, max_tokens=8)


@pytest.mark.slow
@pytest.mark.architecture("vllm", *VLLM_ARCHS)  # llama and gemma3: the real files, test_vllm.py
def test_llama_cpp_files_through_vllm_give_the_models_tokens(made, vllm_float32_results):
    from gguf_repack.hf import load_model

    outs = {pair: made(*pair)[1] for pair in VLLM_PAIRS}
    results = vllm_float32_results
    wrong = {}
    for (name, outtype), out in outs.items():
        # the reference: transformers' model of the same weights (Q8_0: ours, which the Q8_0
        # test holds to the model with Q8_0 weights)
        # (the MTP file: ours, which test_glm_file_with_its_draft_layer_... holds to its model)
        ref = build_model(name) if outtype != "q8_0" and name in MODELS else load_model(out)
        got = results[str(window_as_vllm_counts(out))]
        tokenizer = tokenizer_of(out)
        for i, prompt in enumerate(VLLM_PROMPTS):
            ids = tokenizer(prompt, return_tensors="pt").input_ids
            assert got["prompt_token_ids"][i] == ids[0].tolist()
            with torch.no_grad():
                tokens = ref.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8,
                                      do_sample=False)[0, ids.shape[1]:].tolist()
            if got["token_ids"][i] != tokens:
                wrong[name, outtype, i] = (got["token_ids"][i], tokens)
    assert not wrong, wrong


def test_arch_config_tables_read_the_layers_llama_cpp_runs():
    """own_config's per-architecture details, on keys as llama.cpp's converter writes them."""
    from gguf_repack.converter.arch_configs import own_config

    keys = {"block_count": 4, "attention.head_count": 4, "embedding_length": 128,
            "attention.head_count_kv": 2, "attention.sliding_window": 8}
    tokens = {"tokenizer.ggml.tokens": ["a"] * 300}.get
    # Cohere2 writes no pattern: llama.cpp's, every fourth layer global
    cohere2 = own_config("cohere2", keys.get, tokens, set())
    assert cohere2["layer_types"] == ["sliding_attention"] * 3 + ["full_attention"]
    assert (cohere2["vocab_size"], cohere2["head_dim"]) == (300, 32)
    # EXAONE 4.0 with its pattern key, and without a window (EXAONE-4.0-1.2B): every layer global
    pattern = {**keys, "attention.sliding_window_pattern": [True, False, True, False]}
    assert own_config("exaone4", pattern.get, tokens, set())["layer_types"] == \
        ["sliding_attention", "full_attention"] * 2
    no_window = {k: v for k, v in keys.items() if k != "attention.sliding_window"}
    exaone = own_config("exaone4", no_window.get, tokens, set())
    assert exaone["layer_types"] == ["full_attention"] * 4 and exaone["sliding_window"] is None
    # biases and q/k norms as the tensors say; partial rope only where the class has it
    seed = own_config("seed_oss", keys.get, tokens, {"blk.0.attn_q.bias"})
    assert seed["attention_bias"] and not seed["attention_out_bias"]
    partial = {**keys, "rope.dimension_count": 16}
    assert own_config("glm4", partial.get, tokens, set())["rope_parameters"]["partial_rotary_factor"] == 0.5
    with pytest.raises(ValueError, match="rotates the whole head"):
        own_config("olmo2", partial.get, tokens, set())
    # MiniMax-M2: sigmoid only, and vLLM's fields as its own config.json has them
    minimax = own_config("minimax-m2", {**keys, "expert_gating_func": 2}.get, tokens,
                         {"blk.1.exp_probs_b.bias"})
    assert (minimax["scoring_func"], minimax["use_routing_bias"]) == ("sigmoid", True)
    with pytest.raises(ValueError, match="sigmoid"):
        own_config("minimax-m2", {**keys, "expert_gating_func": 1}.get, tokens, set())
    # LFM2-MoE: convolution layers where there are no KV heads; sigmoid only
    lfm2 = {**keys, "attention.head_count_kv": [0, 2, 0, 2], "expert_gating_func": 2,
            "leading_dense_block_count": 1}
    lfm2_moe = own_config("lfm2moe", lfm2.get, tokens, {"blk.1.exp_probs_b.bias"})
    assert (lfm2_moe["layer_types"], lfm2_moe["num_dense_layers"], lfm2_moe["use_expert_bias"]) == \
        (["conv", "full_attention"] * 2, 1, True)
    with pytest.raises(ValueError, match="sigmoid"):
        own_config("lfm2moe", {**lfm2, "expert_gating_func": 1}.get, tokens, set())
    # Nemotron-H MoE, Nemotron 3 Nano's widths: each layer's one mixer by its KV heads and
    # feed-forward width, as llama.cpp reads them; a Mamba-2 width that is its heads' (64 x 64),
    # not a multiple of the hidden size (2688); the draft layer counted apart
    nano = {"block_count": 5, "attention.head_count": 32, "embedding_length": 2688,
            "attention.head_count_kv": [0, 0, 2, 0, 2], "feed_forward_length": [0, 1856, 0, 1856, 1856],
            "expert_count": 128, "ssm.inner_size": 4096, "ssm.time_step_rank": 64,
            "attention.key_length": 128, "nextn_predict_layers": 1}
    nemotron = own_config("nemotron_h_moe", nano.get, tokens, {"blk.0.ssm_conv1d.bias"})
    assert {k: nemotron[k] for k in ("layers_block_type", "mamba_head_dim", "num_hidden_layers",
                                     "num_nextn_predict_layers", "num_key_value_heads", "use_conv_bias")} == {
        "layers_block_type": ["mamba", "moe", "attention", "moe"], "mamba_head_dim": 64,
        "num_hidden_layers": 4, "num_nextn_predict_layers": 1, "num_key_value_heads": 2,
        "use_conv_bias": True}
    # the dense Nemotron-H (Nano 2): MLP layers where the feed-forward width is not 0
    dense = {k: v for k, v in nano.items() if k not in ("expert_count", "nextn_predict_layers")}
    got = own_config("nemotron_h", dense.get, tokens, set())
    assert (got["layers_block_type"], got["intermediate_size"], got["num_hidden_layers"]) == \
        (["mamba", "mlp", "attention", "mlp", "attention"], 1856, 5)
    with pytest.raises(ValueError, match="4 values for 5 blocks"):  # (a count per block, or one)
        own_config("nemotron_h_moe", {**nano, "feed_forward_length": [0, 1856, 0, 1856]}.get, tokens, set())
    # Hunyuan-A13B: one width for its MLP, experts and shared MLP, as transformers' class has it
    hunyuan = {**keys, "feed_forward_length": 3072, "expert_feed_forward_length": 3072,
               "expert_shared_feed_forward_length": 3072, "expert_count": 64, "expert_used_count": 8}
    assert own_config("hunyuan-moe", hunyuan.get, tokens, set())["moe_topk"] == 8
    with pytest.raises(ValueError, match=r"widths \[1536, 3072\]: transformers' HunYuanMoEV1 has one"):
        own_config("hunyuan-moe", {**hunyuan, "expert_feed_forward_length": 1536}.get, tokens, set())
    # Jamba-v0.1's pattern: attention every 8th layer from the 4th, MoE every other layer, read
    # back as its period and offset; layers that follow no period get no config, with the reason
    jamba = {"block_count": 16, "attention.head_count": 32, "embedding_length": 4096,
             "attention.head_count_kv": [8 if i % 8 == 4 else 0 for i in range(16)], "ssm.inner_size": 8192}
    routers = {f"blk.{i}.ffn_gate_inp.weight" for i in range(1, 16, 2)}
    got = own_config("jamba", jamba.get, tokens, routers)
    assert {k: got[k] for k in ("attn_layer_period", "attn_layer_offset", "expert_layer_period",
                                "expert_layer_offset", "mamba_expand", "num_key_value_heads")} == {
        "attn_layer_period": 8, "attn_layer_offset": 4, "expert_layer_period": 2, "expert_layer_offset": 1,
        "mamba_expand": 2, "num_key_value_heads": 8}
    with pytest.raises(ValueError, match=r"MoE layers \[1, 2\] are not every n-th layer"):
        own_config("jamba", jamba.get, tokens, {"blk.1.ffn_gate_inp.weight", "blk.2.ffn_gate_inp.weight"})


def test_gemma4_table_reads_its_layers_as_llama_cpp_writes_them():
    """Gemma 4's per-layer keys (KV heads and MLP widths as arrays) on what its converter writes
    for E2B and 31B; a file they do not describe gets no config, with the reason."""
    from gguf_repack.converter.arch_configs import own_config

    keys = {"block_count": 4, "attention.head_count": 4, "embedding_length": 128, "attention.key_length": 64,
            "attention.key_length_swa": 32, "attention.sliding_window": 8, "feed_forward_length": 256,
            "attention.head_count_kv": [2, 1, 2, 1], "attention.sliding_window_pattern": [True, False] * 2}
    tokens = {"tokenizer.ggml.tokens": ["a"] * 300}.get
    k_only = {f"blk.{i}.attn_k.weight" for i in range(4)} | {"blk.0.attn_v.weight", "blk.2.attn_v.weight"}
    dense = own_config("gemma4", keys.get, tokens, k_only)
    assert (dense["head_dim"], dense["global_head_dim"], dense["num_key_value_heads"],
            dense["num_global_key_value_heads"], dense["attention_k_eq_v"]) == (32, 64, 2, 1, True)
    e2b = {**keys, "attention.head_count_kv": 2, "attention.shared_kv_layers": 2,
           "embedding_length_per_layer_input": 16, "feed_forward_length": [256, 256, 512, 512]}
    both = {f"blk.{i}.attn_{kv}.weight" for i in range(2) for kv in "kv"}
    config = own_config("gemma4", e2b.get, tokens, both)
    assert (config["intermediate_size"], config["use_double_wide_mlp"], config["attention_k_eq_v"],
            config["vocab_size_per_layer_input"]) == (256, True, False, 300)
    with pytest.raises(ValueError, match="MLP widths per layer"):
        own_config("gemma4", {**e2b, "feed_forward_length": [256, 512, 256, 512]}.get, tokens, both)
    with pytest.raises(ValueError, match="without keys for values"):
        own_config("gemma4", keys.get, tokens, both | {"blk.3.attn_k.weight", "blk.3.attn_v.weight"})


def requantized(src, dst, types: dict[str, str]) -> None:
    """A copy of the float GGUF file `src` at `dst`, written by gguf-py, with the tensors whose
    names end in a key of `types` quantized to that type by gguf-py (the file types
    llama-quantize would not give them, or a mix it would)."""
    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(dst, reader.fields["general.architecture"].contents())
    for key, field in reader.fields.items():
        if not key.startswith("GGUF.") and key != "general.architecture":
            writer.add_key_value(key, field.contents(), field.types[0],
                                 sub_type=field.types[-1] if len(field.types) > 1 else None)
    for t in reader.tensors:
        data = np.asarray(t.data)
        qtype = next((gguf.GGMLQuantizationType[q] for suffix, q in types.items() if t.name.endswith(suffix)),
                     None)
        if qtype is not None:
            assert t.tensor_type == gguf.GGMLQuantizationType.F32
            rows = data.reshape(tuple(int(d) for d in reversed(t.shape)))
            writer.add_tensor(t.name, gguf.quants.quantize(rows, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(t.name, data, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.slow
def test_a_quantized_router_of_its_own_class_is_held_in_float(made, tmp_path):
    """Llama 4's router is a Linear subclass that returns its scores too: a file with it
    quantized (llama-quantize keeps routers F32; other tools may not) gets it dequantized, with
    the warning, and the model's predictions; the rest of its layers stay quantized."""
    from gguf_repack.hf import QuantLinear, load_model

    src, _, _ = made("llama4", "q8_0")
    requantized(src, tmp_path / "router-q8_0.gguf", {"ffn_gate_inp.weight": "Q8_0"})
    convert(tmp_path / "router-q8_0.gguf", tmp_path / "out")
    with pytest.warns(UserWarning, match="ffn_gate_inp"):
        ours = load_model(tmp_path / "out")
    assert type(ours.model.layers[1].feed_forward.router).__name__ == "Llama4Router"
    assert isinstance(ours.model.layers[1].feed_forward.shared_expert.up_proj, QuantLinear)
    ref = load_model(made("llama4", "q8_0")[1])  # with gguf-py's Q8_0 round trip of the routers
    for layer in ref.model.layers:
        router = getattr(layer.feed_forward, "router", None)
        if router is not None:
            w = router.weight.detach().numpy()
            back = gguf.quants.dequantize(gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0),
                                          gguf.GGMLQuantizationType.Q8_0)
            router.weight.data = torch.from_numpy(back)
    ids = prompt_ids(made("llama4", "q8_0")[1])
    with torch.no_grad():
        kl = kl_per_position(ref(ids).logits[0], ours(ids).logits[0])
    assert kl.max().item() <= KL_Q8_0, kl.max().item()


@pytest.mark.slow
def test_qwen35_value_heads_reordered_by_whole_blocks_stay_quantized(made):
    """llama.cpp's converter reorders Qwen3.5's value heads, ssm_out's columns among them
    (tensor_map._value_head_order). Heads of 128 columns in Q8_0's blocks of 32: the blocks are
    reordered, ssm_out stays quantized (its products: test_q8_0_file_gives_the_model_with_q8_0_weights).
    Heads of 16: the order splits blocks (as a real model's heads of 128 in K-quants' blocks of
    256), so ssm_out is held dequantized, with the warning naming it; the rest stays quantized."""
    from gguf_repack.hf import QuantLinear, load_model

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no warning at all)
        blocks = load_model(made("qwen35", "q8_0")[1])
    assert all(isinstance(layer.linear_attn.out_proj, QuantLinear) for layer in blocks.model.layers[:3])
    with pytest.warns(UserWarning, match=r"held dequantized.*blk\.0\.ssm_out"):
        split = load_model(made("qwen35-narrow-heads", "q8_0")[1])
    assert type(split.model.layers[0].linear_attn.out_proj) is torch.nn.Linear
    assert isinstance(split.model.layers[0].linear_attn.in_proj_qkv, QuantLinear)


@pytest.mark.slow
def test_qwen3next_qkvz_parts_of_two_types_are_held_dequantized(made, tmp_path):
    """llama.cpp's converter splits Qwen3-Next's in_proj_qkvz into attn_qkv and attn_gate, which
    llama-quantize may give two types (Q4_K_M: Q5_K and Q4_K). One type: joined exactly (the Q8_0
    file's test). Two (here attn_qkv Q8_0, attn_gate F32): in_proj_qkvz held dequantized, with
    the warning naming the quantized part, and the predictions of the model whose query, key
    and value rows (per key head, as transformers' Qwen3NextGatedDeltaNet splits them) are
    gguf-py's Q8_0 round trip."""
    from gguf_repack.hf import QuantLinear, load_model

    src, _, _ = made("qwen3next", "f32")
    # (ffn_up_shexp: a weight that stays quantized beside it)
    requantized(src, tmp_path / "qkv-q8_0.gguf", {"attn_qkv.weight": "Q8_0", "ffn_up_shexp.weight": "Q8_0"})
    convert(tmp_path / "qkv-q8_0.gguf", tmp_path / "out")
    with pytest.warns(UserWarning, match=r"held dequantized.*blk\.0\.attn_qkv"):
        ours = load_model(tmp_path / "out")
    assert type(ours.model.layers[0].linear_attn.in_proj_qkvz) is torch.nn.Linear
    assert isinstance(ours.model.layers[0].mlp.shared_expert.up_proj, QuantLinear)
    ref = build_model("qwen3next")
    config = ref.config
    key_width = config.linear_key_head_dim
    group_width = config.linear_num_value_heads // config.linear_num_key_heads * config.linear_value_head_dim
    per_head = 2 * key_width + 2 * group_width
    def q8_0(w: torch.Tensor) -> torch.Tensor:
        q8 = gguf.GGMLQuantizationType.Q8_0
        return torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(w.numpy(), q8), q8))

    with torch.no_grad():
        for layer in ref.model.layers:
            layer.mlp.shared_expert.up_proj.weight.copy_(q8_0(layer.mlp.shared_expert.up_proj.weight))
            if hasattr(layer, "linear_attn"):  # q, k and v of each key head; not z
                qkvz = layer.linear_attn.in_proj_qkvz.weight
                rows = (torch.arange(qkvz.shape[0]) % per_head) < 2 * key_width + group_width
                qkvz[rows] = q8_0(qkvz[rows])
    ids = prompt_ids(tmp_path / "out")
    with torch.no_grad():
        kl = kl_per_position(ref(ids).logits[0], ours(ids).logits[0])
    assert kl.max().item() <= KL_Q8_0, kl.max().item()


@pytest.mark.slow
@pytest.mark.architecture("vllm", *sorted(VLLM_OWN_REFERENCE))
def test_models_vllm_computes_otherwise_give_vllms_own_tokens(own_reference_pairs, vllm_float32_results):
    """vLLM's LFM2, PhiMoE and Gemma 3n give other tokens than transformers' on the float
    checkpoints themselves, without the plugin. So their reference is vLLM's own model: on the
    checkpoint each file was made from (the float file), and on that checkpoint with every
    weight the Q8_0 file quantizes replaced by gguf-py's Q8_0 round trip (the Q8_0 file): the
    same tokens, at float32 (at TP 2, the Q8_0 files: in tests/test_architectures.py's run)."""
    for checkpoint, out in own_reference_pairs:
        own = vllm_float32_results[str(checkpoint)]
        assert vllm_float32_results[str(out)]["prompt_token_ids"] == own["prompt_token_ids"]
        assert vllm_float32_results[str(out)]["token_ids"] == own["token_ids"], out


@pytest.mark.slow
@pytest.mark.architecture("vllm", *sorted(VLLM_BFLOAT16_ONLY))
@pytest.mark.architecture("tp2", *sorted(VLLM_BFLOAT16_ONLY))
def test_gated_delta_net_models_through_vllm_give_vllms_own_tokens(made, vllm_python, module_tmp):  # noqa: F811
    """vLLM's CPU gated delta-net runs in bfloat16 only (and heads of 128), where its Qwen3-Next
    differs from transformers' (a longer prompt's first token; the same on the float checkpoint,
    without the plugin: vLLM's, not the plugin's). So the reference of Qwen3-Next, Qwen3.5 and
    Qwen3.5-MoE is vLLM's own model on the checkpoint each file was made from: the float file's
    tokens equal it exactly at TP 1 and 2 (Qwen3-Next's in_proj_qkvz joined back from attn_qkv
    and attn_gate; Qwen3.5's value heads put back in order, its in_proj_qkv filling three
    shards of vLLM's in_proj_qkvz; A_log from ssm_a, the norms). The Q8_0 files (quantized
    parts joined or placed by rows, sharded by rows at TP 2) load and generate at both, and so
    does a Qwen3.5 file whose in_proj_qkv and in_proj_z have two quantized types (as
    llama-quantize's Q4_K_M gives them: Q5_K and Q4_K); their tokens are not compared: at
    bfloat16 the round trip flips these random models' tokens either way (vLLM's own on the
    round-tripped checkpoint disagrees with itself on the float one as much). vLLM's Qwen3.5
    imports torchvision, for which the test runner has a stand-in (tests/torchvision_stand_in)."""
    checkpoints, runs_only = [], []
    for name in sorted(VLLM_BFLOAT16_ONLY):
        checkpoint = hf_model_dir(name)
        if name in TOKENIZER_MODEL_TYPE:  # (its own model type back, for vLLM's model class)
            config = json.loads((checkpoint / "config.json").read_text())
            checkpoint = module_tmp(f"{name}-checkpoint")
            shutil.copytree(hf_model_dir(name), checkpoint, dirs_exist_ok=True)
            (checkpoint / "config.json").write_text(json.dumps({**config, "model_type": MODELS[name][0]}))
        checkpoints.append((checkpoint, made(name, "f32")[1]))
        runs_only.append(made(name, "q8_0")[1])
    mixed = module_tmp("qwen35-two-types")
    requantized(made("qwen35", "f32")[0], mixed / "two-types.gguf", {"attn_qkv.weight": "Q8_0",
                                                                     "attn_gate.weight": "Q5_0"})
    convert(mixed / "two-types.gguf", mixed / "out")
    runs_only.append(mixed / "out")
    for tp in (1, 2):
        results = run_vllm_many(vllm_python, [*(d for pair in checkpoints for d in pair), *runs_only],
                                prompts=VLLM_PROMPTS, max_tokens=8, tp=tp,
                                extra=["--dtype", "bfloat16", "--torchvision-stand-in"])
        for checkpoint, float_out in checkpoints:
            own = results[str(checkpoint)]
            assert results[str(float_out)]["prompt_token_ids"] == own["prompt_token_ids"]
            assert results[str(float_out)]["token_ids"] == own["token_ids"], (float_out, tp)
        for out in runs_only:
            assert [len(t) for t in results[str(out)]["token_ids"]] == [8, 8], (out, tp)
