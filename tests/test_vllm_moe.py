"""vLLM's own MoE models (Qwen3-MoE, Qwen2-MoE, Mixtral, gpt-oss) on gguf-repack directories
whose expert stacks stay quantized (the plugin's fused-MoE method), or are float (an F16/F32
file's: vLLM's unquantized fused-MoE method, placed by the plugin), against transformers: its
GGUF path for Qwen3-MoE and Qwen2-MoE, and for Mixtral and gpt-oss written as llama.cpp writes
them, transformers' MixtralForCausalLM and GptOssForCausalLM on gguf-py's dequantization of the
file (tests/test_moe.py)."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from hf_models import byte_tokenizer_kvs, tokenizer_kvs, write_moe
from test_moe import gpt_oss_config, gpt_oss_reference, mixtral_config, mixtral_reference
from test_vllm import (
    PROMPTS,
    assert_half_per_rank,
    run_vllm_many,
    tensor_bytes,
    transformers_tokens,
    vllm_python,  # noqa: F401 - the fixture
)
from transformers import AutoModelForCausalLM, AutoTokenizer

from gguf_repack import convert

pytestmark = pytest.mark.slow  # every test starts vLLM (or imports it)
# at tensor_parallel_size 2 each rank holds half of every expert's intermediate width (384 of
# Qwen3-MoE's 768, 128 of gpt-oss's 256 here): down's blocks must divide it, so 32-weight
# blocks for down here
EXPERT_TYPES = {"qwen3moe": [(T.Q4_K, T.Q4_K, T.Q8_0), (T.IQ4_XS, T.Q8_0, T.MXFP4)],
                "qwen2moe": [(T.Q4_K, T.Q4_K, T.Q8_0), (T.IQ4_XS, T.Q8_0, T.MXFP4)],
                "mixtral": [(T.Q4_K, T.Q4_K, T.Q8_0), (T.IQ4_XS, T.Q8_0, T.MXFP4)],
                "gpt-oss": [(T.MXFP4, T.MXFP4, T.MXFP4), (T.Q4_K, T.Q8_0, T.Q8_0)]}
# float expert stacks, as an unquantized file holds them (Qwen3-30B-A3B-BF16 and the like): every
# layer's F16 (Qwen3-MoE), F16 then F32 (Mixtral), and gpt-oss's first layer F16 beside MXFP4
# (a file mixing the two, layer by layer)
FLOAT_EXPERT_TYPES = {"qwen3moe": [(T.F16,) * 3], "mixtral": [(T.F16,) * 3, (T.F32,) * 3],
                      "gpt-oss": [(T.F16,) * 3, (T.MXFP4,) * 3]}
# vLLM's Mixtral builds its token embedding, and gpt-oss its embedding and output projection, without the
# quantization config: the plugin hands those dequantized (and says so in the log)
HELD_IN_FLOAT = {"mixtral": ["token_embd.weight"], "qwen3moe": [], "qwen2moe": [],
                 "gpt-oss": ["token_embd.weight", "output.weight"]}


@pytest.fixture(scope="module")
def moe(smollm2, module_tmp):
    """(arch, float experts) -> (output directory, the reference's prompt ids and greedy tokens
    for PROMPTS)."""
    made = {}

    def make(arch: str, float_experts: bool = False):
        if (arch, float_experts) not in made:
            root = module_tmp(arch)
            types = (FLOAT_EXPERT_TYPES if float_experts else EXPERT_TYPES)[arch]
            src = write_moe(root / f"{arch}.gguf", arch, tokenizer_kvs(smollm2), np.random.default_rng(3),
                            expert_types=types)
            convert(src, root / "out")
            if arch in ("mixtral", "gpt-oss"):  # transformers has no GGUF path for them
                model = (mixtral_reference(src, mixtral_config()) if arch == "mixtral"
                         else gpt_oss_reference(src, gpt_oss_config()))
                tok = AutoTokenizer.from_pretrained(root / "out")
            else:
                model = AutoModelForCausalLM.from_pretrained(root, gguf_file=src.name,
                                                             dtype=torch.float32).eval()
                tok = AutoTokenizer.from_pretrained(root, gguf_file=src.name)
            made[arch, float_experts] = root / "out", *transformers_tokens(model, tok, PROMPTS, steps=8)
        return made[arch, float_experts]
    return make


def float32_bytes(out, names) -> int:
    records = {t["name"]: t for t in json.loads((out / "manifest.json").read_text())["tensors"]}
    return sum(4 * int(np.prod(records[name]["shape"])) for name in names)


# Qwen2-MoE: its shared expert (plain layers and a sigmoid gate) beside the routed ones. The
# models of one size run in one vLLM start (moe_runs), each one's float-experts directory (where
# FLOAT_EXPERT_TYPES has the model) after its quantized one (no start of their own; each model's
# ranks are started again, a few seconds each since vllm_run.py freezes vLLM's objects for the
# collector). Mixtral and gpt-oss at one rank: tests/test_llama_cpp_files.py's files
MOE_RUNS = [("qwen3moe", 1), ("qwen2moe", 1), ("qwen3moe", 2), ("qwen2moe", 2), ("mixtral", 2),
            ("gpt-oss", 2)]


@pytest.fixture(scope="module")
def moe_runs(moe, vllm_python):  # noqa: F811
    """tp -> {(arch, float experts): (output directory, the reference's prompt ids and tokens,
    vLLM's result)} for every model of MOE_RUNS at that tensor-parallel size, all in one vLLM
    start (once per size per module)."""
    runs = {}

    def get(tp: int) -> dict:
        if tp not in runs:
            made = {}
            for arch, size in MOE_RUNS:
                if size == tp:
                    made[arch, False] = moe(arch)
                    if arch in FLOAT_EXPERT_TYPES:
                        made[arch, True] = moe(arch, float_experts=True)
            results = run_vllm_held(vllm_python, [out for out, _, _ in made.values()], tp)
            runs[tp] = {key: (*m, results[str(m[0])]) for key, m in made.items()}
        return runs[tp]
    return get


@pytest.mark.parametrize("arch, tp", [
    pytest.param(arch, tp, marks=pytest.mark.architecture("vllm" if tp == 1 else "tp2", arch))
    for arch, tp in MOE_RUNS])
def test_moe_model_generates_as_transformers_with_quantized_and_with_float_experts(arch, tp, moe_runs):
    runs = moe_runs(tp)
    made = {False: runs[arch, False]}
    if arch in FLOAT_EXPERT_TYPES:
        made[True] = runs[arch, True]
    for float_experts, (out, prompt_ids, tokens, result) in made.items():
        kind = "float experts" if float_experts else "quantized experts"
        assert result["prompt_token_ids"] == prompt_ids, kind
        assert result["token_ids"] == tokens, kind
        ranks = result["held_bytes"]
        assert len(ranks) == tp
        # the layers vLLM builds without the quantization config, and float expert stacks:
        # held in float32 (vLLM's dtype here)
        in_float = HELD_IN_FLOAT[arch] + float_stacks(out)
        if float_experts:  # the experts once, float stacks in float32, each rank its half
            experts = expert_bytes(out)
            for held in ranks:
                assert 0.99 * experts / tp <= held["experts"] <= 1.01 * experts / tp, (kind, held)
        if tp == 1:  # every weight held once; quantized experts in their planes (a float32 copy
            # would be 4-8x)
            limit = 1.02 * tensor_bytes(out, leaving=in_float) + float32_bytes(out, in_float)
            assert ranks[0]["planes"] + ranks[0]["weights"] <= limit, (kind, ranks[0])
        else:  # each rank half of every expert (its rows of gate and up, its blocks of down)
            assert_half_per_rank(out, ranks, leaving=in_float)


def run_vllm_held(python: str, models: list, tp: int) -> dict[str, dict]:
    """Greedy tokens (8) for PROMPTS and held bytes of several directories, one after another
    in one vLLM process (one start of vLLM for them all): {directory: result}."""
    return run_vllm_many(python, models, prompts=PROMPTS, tp=tp, max_tokens=8, held_bytes=True)


def expert_records(out) -> list[dict]:
    return [t for t in json.loads((out / "manifest.json").read_text())["tensors"]
            if t["name"].endswith("_exps.weight")]


def float_stacks(out) -> list[str]:
    return [t["name"] for t in expert_records(out) if t["layout"] != "rp1"]


def expert_bytes(out) -> int:
    """What the experts layers hold: float stacks in float32, quantized ones in their planes
    (the file's bytes), expert biases (gpt-oss's) in float32."""
    records = expert_records(out)
    biases = [t["name"].replace(".weight", ".bias") for t in records]
    return (float32_bytes(out, float_stacks(out)) + sum(t["source"]["nbytes"] for t in records
                                                          if t["layout"] == "rp1")
            + float32_bytes(out, [b for b in biases if b in manifest_names(out)]))


def manifest_names(out) -> set[str]:
    return {t["name"] for t in json.loads((out / "manifest.json").read_text())["tensors"]}


def test_a_layer_of_float_and_quantized_stacks_fails_naming_it(tmp_path, vllm_python):  # noqa: F811
    """One layer's gate and up F16, its down Q8_0 (Qwen2-MoE's down is Q8_0 where its width
    is not a whole number of 256-weight blocks): the plugin refuses the layer, naming it and
    its tensors, before any weight is read (vLLM is imported, not started)."""
    src = write_moe(tmp_path / "m.gguf", "qwen2moe", byte_tokenizer_kvs(), np.random.default_rng(5),
                    expert_types=[(T.F16,) * 3])
    out = tmp_path / "out"
    convert(src, out)
    code = f"""
from gguf_repack.integrations.vllm.quant import GgufRepackVllmConfig
config = GgufRepackVllmConfig(1)
config.maybe_update_config({str(out)!r})
try:
    config.expert_types("model.layers.0.mlp.experts")
except ValueError as e:
    print("ERROR", e)
"""
    proc = subprocess.run([vllm_python, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ("ERROR gguf_repack: model.layers.0.mlp.experts: expert stacks partly float, partly "
            "quantized (blk.0.ffn_gate_exps.weight F16, blk.0.ffn_up_exps.weight F16, "
            "blk.0.ffn_down_exps.weight Q8_0) are not supported yet") in proc.stdout, proc.stdout
