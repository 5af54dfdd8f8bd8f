"""Mixture-of-experts models through transformers with their expert stacks kept quantized:
Qwen3-MoE and Qwen2-MoE against transformers' GGUF path on the same file, and a Mixtral written
as llama.cpp writes it (architecture `llama` with experts), for which transformers has no GGUF
path, against transformers' MixtralForCausalLM holding gguf-py's dequantization of the file."""

from __future__ import annotations

import json

import gguf
import gguf.quants
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from hf_models import (
    GPT_OSS_EXPERT_TYPES,
    MOE,
    MOE_EXPERT_TYPES,
    byte_tokenizer_kvs,
    tokenizer_kvs,
    write_moe,
)
from test_hf import PROMPT, assert_same_predictions
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from gguf_repack import RepackError, convert
from gguf_repack.hf import QuantExperts, QuantLinear, load_model


@pytest.fixture(scope="module")
def tokenizer(smollm2):
    return tokenizer_kvs(smollm2)


def held_bytes(model) -> int:
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


def source_bytes(out) -> int:
    manifest = json.loads((out / "manifest.json").read_text())
    return sum(t["source"]["nbytes"] for t in manifest["tensors"])  # the GGUF's tensor bytes


def assert_experts_stay_quantized(model, out, expert_types=MOE_EXPERT_TYPES):
    """Every expert layer is a QuantExperts over the file's types (gate and up joined where
    they share one), the model holds at most 1.2x the file's tensor bytes."""
    for i, layer in enumerate(model.model.layers):
        experts = layer.mlp.experts
        assert isinstance(experts, QuantExperts)
        gate, up, down = expert_types[i]
        assert experts.stacks["down"][0].name in (down.name, "Q8_0")  # Q8_0 where K % 256
        assert ("gate_up" in experts.stacks) == (gate == up)
    assert held_bytes(model) <= 1.2 * source_bytes(out), (held_bytes(model), source_bytes(out))


@pytest.mark.slow
def _cells(arch: str):
    """The architecture-table cells a test of this module checks (tests/test_architectures.py)."""
    return [pytest.mark.architecture("transformers", arch), pytest.mark.architecture("convert", arch)]


@pytest.mark.parametrize("arch", [pytest.param(a, marks=_cells(a)) for a in ["qwen3moe", "qwen2moe"]])
def test_qwen_moe_predicts_as_transformers_gguf_path(arch, tokenizer, tmp_path):
    src = write_moe(tmp_path / f"{arch}.gguf", arch, tokenizer, np.random.default_rng(7))
    out = tmp_path / "out"
    convert(src, out)
    ours = load_model(out)
    assert_experts_stay_quantized(ours, out)
    if arch == "qwen2moe":  # the shared expert and its gate are plain layers
        assert isinstance(ours.model.layers[0].mlp.shared_expert.down_proj, QuantLinear)
    ref_model = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=src.name,
                                                     dtype=torch.float32).eval()
    ids = AutoTokenizer.from_pretrained(out)(PROMPT, return_tensors="pt").input_ids
    assert_same_predictions(ours, ref_model, ids, steps=8)

    via_auto = AutoModelForCausalLM.from_pretrained(out)  # the registered quantizer
    assert isinstance(via_auto.model.layers[1].mlp.experts, QuantExperts)
    assert held_bytes(via_auto) <= 1.2 * source_bytes(out)
    with torch.no_grad():
        assert torch.equal(via_auto(ids).logits, ours(ids).logits)


def mixtral_config():
    """What write_moe writes for "mixtral", as a Mixtral config by hand (transformers' GGUF
    mapping reads the file as a dense LlamaConfig)."""
    from transformers import MixtralConfig

    return MixtralConfig(vocab_size=49152, hidden_size=256, intermediate_size=MOE["mixtral"]["expert_ffn"],
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                         num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=512,
                         rms_norm_eps=float(np.float32(1e-6)),
                         rope_parameters={"rope_theta": 10000.0, "rope_type": "default"},
                         tie_word_embeddings=False)


def mixtral_reference(src, config):
    """transformers' MixtralForCausalLM holding gguf-py's dequantization of every tensor of
    `src`, llama's Q/K rows put back by transformers' own llama processor (llama.cpp permutes
    them for its rope), names by hand: nothing of gguf_repack."""
    from transformers import MixtralForCausalLM
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    processor = LlamaTensorProcessor(config=config.to_dict())
    names = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head",
             "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
             "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
             "attn_output": "self_attn.o_proj", "ffn_gate_inp": "mlp.gate",
             "ffn_down_exps": "mlp.experts.down_proj"}
    state, gate_up = {}, {}
    for t in gguf.GGUFReader(src).tensors:
        values = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
        values = values.reshape([int(d) for d in reversed(t.shape)])
        values = torch.from_numpy(np.array(processor.process(values, t.name).weights))
        parts = t.name.split(".")
        if parts[0] != "blk":
            state[names[parts[0]] + ".weight"] = values
            continue
        layer, base = f"model.layers.{parts[1]}.", parts[2]
        if base in ("ffn_gate_exps", "ffn_up_exps"):
            gate_up.setdefault(layer, {})[base] = values
        elif base == "ffn_down_exps":
            state[layer + names[base]] = values
        else:
            state[layer + names[base] + ".weight"] = values
    for layer, stacks in gate_up.items():
        state[layer + "mlp.experts.gate_up_proj"] = torch.cat(
            [stacks["ffn_gate_exps"], stacks["ffn_up_exps"]], dim=1)
    model = MixtralForCausalLM(config).eval()
    model.load_state_dict(state, strict=True)
    return model


def gpt_oss_config():
    """What write_moe writes for "gpt-oss", as a GptOssConfig by hand (transformers' GGUF path
    cannot read the file: it fails on the yarn rope keys that llama.cpp writes for gpt-oss)."""
    from transformers import GptOssConfig

    m = MOE["gpt-oss"]
    return GptOssConfig(vocab_size=49152, hidden_size=256, intermediate_size=m["expert_ffn"],
                        num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2, head_dim=64,
                        num_local_experts=m["experts"], num_experts_per_tok=m["used"],
                        sliding_window=m["sliding_window"], max_position_embeddings=512,
                        rms_norm_eps=float(np.float32(1e-6)), tie_word_embeddings=False,
                        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                         "original_max_position_embeddings": 128, "beta_fast": 32.0,
                                         "beta_slow": 1.0, "truncate": False})


def gpt_oss_reference(src, config):
    """transformers' GptOssForCausalLM holding gguf-py's dequantization of every tensor of
    `src`, in transformers' layout by hand (experts (E, in, out), gate and up interleaved along
    out, as OpenAI's checkpoint has them): nothing of gguf_repack."""
    from transformers import GptOssForCausalLM

    names = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head",
             "attn_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm",
             "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
             "attn_output": "self_attn.o_proj", "ffn_gate_inp": "mlp.router"}
    state, experts = {}, {}
    for t in gguf.GGUFReader(src).tensors:
        values = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
        values = torch.from_numpy(values.reshape([int(d) for d in reversed(t.shape)]).copy())
        parts = t.name.split(".")
        if parts[0] != "blk":
            state[names[parts[0]] + "." + parts[-1]] = values
            continue
        layer, base, suffix = f"model.layers.{parts[1]}.", parts[2], parts[3]
        if base.endswith("_exps"):
            experts.setdefault(layer, {})[base.removeprefix("ffn_").removesuffix("_exps"), suffix] = values
        elif base == "attn_sinks":
            state[layer + "self_attn.sinks"] = values
        else:
            state[layer + names[base] + "." + suffix] = values
    for layer, e in experts.items():
        gate_up = torch.stack([e["gate", "weight"], e["up", "weight"]], dim=2).flatten(1, 2)
        state[layer + "mlp.experts.gate_up_proj"] = gate_up.transpose(1, 2)
        state[layer + "mlp.experts.gate_up_proj_bias"] = torch.stack(
            [e["gate", "bias"], e["up", "bias"]], dim=2).flatten(1, 2)
        state[layer + "mlp.experts.down_proj"] = e["down", "weight"].transpose(1, 2)
        state[layer + "mlp.experts.down_proj_bias"] = e["down", "bias"]
    model = GptOssForCausalLM(config).eval()
    model.load_state_dict(state, strict=True)
    return model


def assert_config_is(out, expected, arch_class: str):
    config = AutoConfig.from_pretrained(out)
    assert config.architectures == [arch_class]
    for key, value in expected.to_dict().items():
        # (provenance, and the token ids, which come from the tokenizer)
        if key not in ("transformers_version", "_name_or_path", "architectures", "dtype",
                       "bos_token_id", "eos_token_id", "pad_token_id"):
            assert getattr(config, key) == value, key


@pytest.mark.slow
@pytest.mark.architecture("transformers", "mixtral")
@pytest.mark.architecture("convert", "mixtral")
def test_mixtral_written_as_llama_gets_a_mixtral_config_and_predicts_as_mixtral(tokenizer, tmp_path):
    src = write_moe(tmp_path / "mixtral.gguf", "mixtral", tokenizer, np.random.default_rng(7))
    out = tmp_path / "out"
    convert(src, out)
    expected = mixtral_config()
    assert_config_is(out, expected, "MixtralForCausalLM")
    ours = load_model(out)
    assert_experts_stay_quantized(ours, out)
    ids = AutoTokenizer.from_pretrained(out)(PROMPT, return_tensors="pt").input_ids
    assert_same_predictions(ours, mixtral_reference(src, expected), ids, steps=8)


@pytest.mark.slow
@pytest.mark.parametrize("expert_types", [GPT_OSS_EXPERT_TYPES, [(T.F16,) * 3, (T.MXFP4,) * 3]],
                         ids=["quantized", "float-layer"])
@pytest.mark.architecture("transformers", "gpt-oss")
@pytest.mark.architecture("convert", "gpt-oss")
def test_gpt_oss_predicts_as_transformers_gpt_oss_on_the_dequantized_file(expert_types, tokenizer, tmp_path):
    """gpt-oss as llama.cpp writes it: MXFP4 experts (layer 1 requantized to K-quants and
    Q8_0), biases on attention, router and experts, attention sinks, yarn rope, every other
    layer a sliding window (4 tokens here, the prompt is longer). The config written at convert
    has the file's attention width, window, expert width and rope scaling. Float (F16) expert
    stacks go into transformers' own module, in its layout."""
    src = write_moe(tmp_path / "gpt-oss.gguf", "gpt-oss", tokenizer, np.random.default_rng(7),
                    expert_types=expert_types)
    out = tmp_path / "out"
    convert(src, out)
    expected = gpt_oss_config()
    assert_config_is(out, expected, "GptOssForCausalLM")
    ours = load_model(out)
    if expert_types is GPT_OSS_EXPERT_TYPES:
        assert_experts_stay_quantized(ours, out, GPT_OSS_EXPERT_TYPES)
        assert ours.model.layers[0].mlp.experts.down_bias is not None
    else:
        assert type(ours.model.layers[0].mlp.experts).__name__ == "GptOssExperts"
        assert isinstance(ours.model.layers[1].mlp.experts, QuantExperts)
    ids = AutoTokenizer.from_pretrained(out)(PROMPT, return_tensors="pt").input_ids
    assert ids.shape[1] > expected.sliding_window
    assert_same_predictions(ours, gpt_oss_reference(src, expected), ids, steps=8)


def test_expert_widths_come_from_the_file(tmp_path):
    """transformers' GGUF mapping reads no expert width: Qwen3-MoE's would be its class default
    (768). The config written at convert takes the file's, and the model loads with it."""
    src = write_moe(tmp_path / "m.gguf", "qwen3moe", byte_tokenizer_kvs(), np.random.default_rng(5),
                    expert_ffn=512)
    out = tmp_path / "out"
    convert(src, out)
    assert AutoConfig.from_pretrained(out).moe_intermediate_size == 512
    model = load_model(out)
    assert model.model.layers[0].mlp.experts.intermediate_dim == 512
    with torch.no_grad():
        assert torch.isfinite(model(torch.tensor([[1, 100, 200]])).logits).all()


def test_experts_the_integration_cannot_run_are_named_at_load(tmp_path, monkeypatch):
    """An experts module that cannot run on quantized stacks names the architecture and what
    is missing at load (never damaged output): here transformers' Qwen3-MoE experts made
    unknown to the integration."""
    from gguf_repack.integrations.hf import model as hf_model

    src = write_moe(tmp_path / "m.gguf", "qwen3moe", byte_tokenizer_kvs(), np.random.default_rng(5))
    out = tmp_path / "out"
    convert(src, out)
    monkeypatch.setattr(hf_model, "EXPERT_MODULES", {"MixtralExperts": False})
    with pytest.raises(RepackError, match=r"qwen3_moe: its experts \(model\.layers\.0\.mlp\.experts, "
                                          r"Qwen3MoeExperts\) cannot run on quantized stacks yet"):
        load_model(out)
