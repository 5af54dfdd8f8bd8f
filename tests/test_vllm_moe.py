"""vLLM's own MoE models (Qwen3-MoE, Mixtral) on gguf-repack directories whose expert stacks stay
quantized (the plugin's fused-MoE method), against transformers: its GGUF path for Qwen3-MoE,
and for a Mixtral written as llama.cpp writes it, transformers' MixtralForCausalLM on gguf-py's
dequantization of the file (tests/test_moe.py). A module apart from test_vllm.py so that CI's
two workers run them side by side."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from hf_models import tokenizer_kvs, write_moe
from test_moe import mixtral_config, mixtral_reference
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
# Qwen3-MoE's 768): down's blocks must divide it, so 32-weight blocks for down here
EXPERT_TYPES = [(T.Q4_K, T.Q4_K, T.Q8_0), (T.IQ4_XS, T.Q8_0, T.MXFP4)]
# vLLM's Mixtral builds its token embedding without the quantization config: the plugin hands
# it dequantized (and says so in the log); float32 here
HELD_IN_FLOAT = {"mixtral": {"token_embd.weight": 49152 * 256 * 4}, "qwen3moe": {}}


@pytest.fixture(scope="module")
def moe(smollm2, tmp_path_factory):
    """{arch: (output directory, the reference's greedy tokens for PROMPTS, its prompt ids)}."""
    made = {}

    def make(arch: str):
        if arch not in made:
            root = tmp_path_factory.mktemp(arch)
            src = write_moe(root / f"{arch}.gguf", arch, tokenizer_kvs(smollm2), np.random.default_rng(3),
                            expert_types=EXPERT_TYPES)
            convert(src, root / "out")
            if arch == "mixtral":  # transformers has no GGUF path for it
                model = mixtral_reference(src, mixtral_config())
                tok = AutoTokenizer.from_pretrained(root / "out")
            else:
                model = AutoModelForCausalLM.from_pretrained(root, gguf_file=src.name,
                                                             dtype=torch.float32).eval()
                tok = AutoTokenizer.from_pretrained(root, gguf_file=src.name)
            made[arch] = root / "out", *transformers_tokens(model, tok, PROMPTS, steps=8)
        return made[arch]
    return make


# Mixtral at TP 2 only in CI (its TP 1 run passed too, 2026-12-01: the held-bytes check with
# its float embedding); each vLLM start costs CI over a minute
@pytest.mark.parametrize("arch, tp", [("qwen3moe", 1), ("qwen3moe", 2), ("mixtral", 2)])
def test_moe_model_with_quantized_experts_generates_as_transformers(arch, tp, moe, vllm_python):  # noqa: F811
    out, prompt_ids, tokens = moe(arch)
    result = run_vllm(vllm_python, out, tp=tp, held_bytes=True, max_tokens=8)
    assert result["prompt_token_ids"] == prompt_ids
    assert result["token_ids"] == tokens
    in_float = HELD_IN_FLOAT[arch]
    if tp == 1:  # experts held once, in their planes (a float32 copy would be 4-8x)
        (held,) = result["held_bytes"]
        limit = 1.02 * tensor_bytes(out, leaving=in_float) + sum(in_float.values())
        assert held["planes"] + held["weights"] <= limit, held
    else:  # each rank half of every expert (its rows of gate and up, its blocks of down)
        assert_half_per_rank(out, result["held_bytes"], leaving=in_float)
