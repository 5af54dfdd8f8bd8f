"""vLLM's own MoE models (Qwen3-MoE, Qwen2-MoE, Mixtral, gpt-oss) on gguf-repack directories
whose expert stacks stay quantized (the plugin's fused-MoE method), against transformers: its
GGUF path for Qwen3-MoE and Qwen2-MoE, and for Mixtral and gpt-oss written as llama.cpp writes
them, transformers' MixtralForCausalLM and GptOssForCausalLM on gguf-py's dequantization of the
file (tests/test_moe.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from hf_models import tokenizer_kvs, write_moe
from test_moe import gpt_oss_config, gpt_oss_reference, mixtral_config, mixtral_reference
from test_vllm import (
    PROMPTS,
    assert_half_per_rank,
    run_vllm,
    tensor_bytes,
    transformers_tokens,
    vllm_python,  # noqa: F401 - the fixture
)
from transformers import AutoModelForCausalLM, AutoTokenizer

from gguf_repack import convert

pytestmark = pytest.mark.slow  # every test starts vLLM
# at tensor_parallel_size 2 each rank holds half of every expert's intermediate width (384 of
# Qwen3-MoE's 768, 128 of gpt-oss's 256 here): down's blocks must divide it, so 32-weight
# blocks for down here
EXPERT_TYPES = {"qwen3moe": [(T.Q4_K, T.Q4_K, T.Q8_0), (T.IQ4_XS, T.Q8_0, T.MXFP4)],
                "qwen2moe": [(T.Q4_K, T.Q4_K, T.Q8_0), (T.IQ4_XS, T.Q8_0, T.MXFP4)],
                "mixtral": [(T.Q4_K, T.Q4_K, T.Q8_0), (T.IQ4_XS, T.Q8_0, T.MXFP4)],
                "gpt-oss": [(T.MXFP4, T.MXFP4, T.MXFP4), (T.Q4_K, T.Q8_0, T.Q8_0)]}
# vLLM's Mixtral builds its token embedding, and gpt-oss its embedding and output projection, without the
# quantization config: the plugin hands those dequantized (and says so in the log)
HELD_IN_FLOAT = {"mixtral": ["token_embd.weight"], "qwen3moe": [], "qwen2moe": [],
                 "gpt-oss": ["token_embd.weight", "output.weight"]}


@pytest.fixture(scope="module")
def moe(smollm2, tmp_path_factory):
    """{arch: (output directory, the reference's greedy tokens for PROMPTS, its prompt ids)}."""
    made = {}

    def make(arch: str):
        if arch not in made:
            root = tmp_path_factory.mktemp(arch)
            src = write_moe(root / f"{arch}.gguf", arch, tokenizer_kvs(smollm2), np.random.default_rng(3),
                            expert_types=EXPERT_TYPES[arch])
            convert(src, root / "out")
            if arch in ("mixtral", "gpt-oss"):  # transformers has no GGUF path for them
                model = (mixtral_reference(src, mixtral_config()) if arch == "mixtral"
                         else gpt_oss_reference(src, gpt_oss_config()))
                tok = AutoTokenizer.from_pretrained(root / "out")
            else:
                model = AutoModelForCausalLM.from_pretrained(root, gguf_file=src.name,
                                                             dtype=torch.float32).eval()
                tok = AutoTokenizer.from_pretrained(root, gguf_file=src.name)
            made[arch] = root / "out", *transformers_tokens(model, tok, PROMPTS, steps=8)
        return made[arch]
    return make


def float32_bytes(out, names) -> int:
    records = {t["name"]: t for t in json.loads((out / "manifest.json").read_text())["tensors"]}
    return sum(4 * int(np.prod(records[name]["shape"])) for name in names)


# one tensor-parallel size per model in CI, each vLLM start costing it about a minute: Qwen3-MoE
# at TP 2, Mixtral and gpt-oss at TP 1 passed too when written (2026-12-01). Qwen2-MoE: its
# shared expert (plain layers and a sigmoid gate) beside the routed ones
@pytest.mark.parametrize("arch, tp", [
    pytest.param(arch, tp, marks=pytest.mark.architecture("vllm" if tp == 1 else "tp2", arch))
    for arch, tp in [("qwen3moe", 1), ("qwen2moe", 1), ("mixtral", 2), ("gpt-oss", 2)]])
def test_moe_model_with_quantized_experts_generates_as_transformers(arch, tp, moe, vllm_python):  # noqa: F811
    out, prompt_ids, tokens = moe(arch)
    result = run_vllm(vllm_python, out, tp=tp, held_bytes=True, max_tokens=8)
    assert result["prompt_token_ids"] == prompt_ids
    assert result["token_ids"] == tokens
    in_float = HELD_IN_FLOAT[arch]
    if tp == 1:  # experts held once, in their planes (a float32 copy would be 4-8x)
        (held,) = result["held_bytes"]
        limit = 1.02 * tensor_bytes(out, leaving=in_float) + float32_bytes(out, in_float)
        assert held["planes"] + held["weights"] <= limit, held
    else:  # each rank half of every expert (its rows of gate and up, its blocks of down)
        assert_half_per_rank(out, result["held_bytes"], leaving=in_float)
