"""Every architecture that transformers reads from GGUF, through both engines, against the
table in gguf_repack/integrations/architectures.py (and docs/architectures.md's copy of it).

Each dense architecture is a tiny file written as llama.cpp's converter writes it
(tests/arch_models.py; qwen2, qwen3 and mistral by tests/hf_models.py), converted, and run:
transformers (load_model and from_pretrained) against transformers' own GGUF path on the same
file, and vLLM at two ranks (every architecture in one process, one after another) against
the same greedy tokens. vLLM at one rank runs the files of llama.cpp's own converter
(tests/test_llama_cpp_files.py). A cell of the table is "tested" only where a test here
or elsewhere carries `pytest.mark.architecture(column, arch)`, and every such mark has its cell
(test_the_table_claims_exactly_the_marked_tests).
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from arch_models import DENSE, write_arch
from gguf import GGMLQuantizationType as T
from hf_models import (
    assert_same_predictions,
    bpe_tokenizer_kvs,
    byte_tokenizer_kvs,
    kl_per_position,
    tokenizer_of,
    write_model,
)
from llama_cpp import MODELS, VLLM_BFLOAT16_ONLY, VLLM_OWN_REFERENCE, llama_cpp_file
from test_llama_cpp_files import q8_0_own_reference, table_row
from test_vllm import (  # noqa: F401 (a fixture)
    assert_half_per_rank,
    run_vllm_many,
    transformers_tokens,
    vllm_python,
    window_as_vllm_counts,
)

from gguf_repack import RepackError, convert, export, verify
from gguf_repack.converter.arch_configs import ARCHS
from gguf_repack.integrations.architectures import ARCHITECTURES, COLUMNS, TESTED, markdown_table

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "The three primary colors are red, yellow and"
VLLM_PROMPTS = ["The capital of France is", "def fibonacci(n):"]
# written by hf_models (the older synthetic set); the rest by arch_models
HF_MODELS = ("llama", "qwen2", "qwen3", "mistral", "phi3")
# through vLLM at two ranks, in one vLLM start (each costs CI about a minute, each model's
# ranks started again): every dense architecture of the table whose cell says tested
# (LFM2's and the others of VLLM_OWN_REFERENCE: against vLLM's own model, below)
VLLM_TP2_ARCHS = sorted(a for a in [*DENSE, *HF_MODELS]
                        if ARCHITECTURES[a]["tp2"] == TESTED and a not in VLLM_OWN_REFERENCE)
# and of these, what each rank holds: half of every quantized weight. phi3 holds q, k and v in
# one tensor (attn_qkv) and gate and up in one (ffn_up): each rank must take its rows of each
# part, not one contiguous slice of the fused rows (the tokens were wrong at TP 2 when it did),
# and hold them once; llama's q, k and v are three types, three plane sets, each once
HALF_PER_RANK_ARCHS = ("llama", "phi3")
# and, on files of llama.cpp's own converter, the architectures transformers' GGUF path cannot
# read: DeepSeek (MLA's heads and the experts' widths split; V2-Lite's kv_a_proj_with_mqa
# replicated), GLM-4.5; and Gemma 3's tiny file (the real Gemma 3 270M runs at one rank in
# tests/test_vllm.py). Against our transformers model of the same file, which
# tests/test_deepseek2.py and tests/test_llama_cpp_files.py hold to the model it was made from
LLAMA_CPP_TP2 = {"deepseek2": [("deepseek-v3", "q8_0"), ("deepseek-v2-lite", "q8_0")],
                 # Gemma 3: sliding-window layers, linear rope x8 on the global ones
                 "gemma3": [("gemma3", "q8_0")],
                 "glm4moe": [("glm4moe", "q8_0")],
                 # Qwen3-VL's text models (tests/llama_cpp.py, qwen3_vl_files)
                 "qwen3vl": [("qwen3-vl", "q8_0")], "qwen3vlmoe": [("qwen3-vl-moe", "q8_0")],
                 # config.json by arch_configs.py's table (Cohere2: its window as vLLM counts it),
                 # every variant of each (Gemma 4's three shapes)
                 **{row: [(name, "q8_0") for name in MODELS if table_row(name) == row]
                    for row in ARCHS if ARCHITECTURES[row]["tp2"] == TESTED
                    and row not in VLLM_BFLOAT16_ONLY | VLLM_OWN_REFERENCE
                    and any(table_row(name) == row for name in MODELS)}}


def _cells(column: str, archs) -> pytest.MarkDecorator:
    return pytest.mark.architecture(column, *archs)


@pytest.fixture(scope="module")
def made(module_tmp):
    """arch -> (source file, output directory, reference source): written and converted once.
    The reference source is the file transformers' GGUF path reads: the same file, except for
    mistral, which that path cannot load (it asks gguf-py for a "mistral" name map): the same
    weights under another name, read as llama, the same function at this length."""
    cache = {}

    def get(arch: str):
        if arch not in cache:
            root = module_tmp(arch)
            tok = byte_tokenizer_kvs() if DENSE.get(arch, {}).get("sentencepiece") else bpe_tokenizer_kvs()
            if arch in HF_MODELS:
                src = write_model(root / f"{arch}.gguf", arch, tok, np.random.default_rng(7))
                ref = src if arch != "mistral" else write_model(
                    root / "as-llama.gguf", arch, tok, np.random.default_rng(7), general_name="Mistral 7B")
            else:
                src = ref = write_arch(root / f"{arch}.gguf", arch, tok, np.random.default_rng(7))
            convert(src, root / "out")
            cache[arch] = src, root / "out", ref
        return cache[arch]
    return get


def transformers_gguf_model(ref: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(ref.parent, gguf_file=ref.name, dtype=torch.float32).eval()


def file_tensor_bytes(out: Path) -> int:
    return sum(t["source"]["nbytes"] for t in json.loads((out / "manifest.json").read_text())["tensors"])


@pytest.mark.slow
@pytest.mark.parametrize("arch", [pytest.param(a, marks=[_cells("transformers", [a]), _cells("convert", [a])])
                                  for a in sorted(DENSE)])
def test_dense_architecture_through_transformers(arch, made):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gguf_repack.hf import QuantLinear, load_model

    src, out, ref = made(arch)
    assert verify(out, against=src).ok
    ours = load_model(out)
    assert ours.config.model_type == {"gemma3": "gemma3_text"}.get(arch, arch)
    ref_model = transformers_gguf_model(ref)
    ids = AutoTokenizer.from_pretrained(out)(PROMPT, return_tensors="pt").input_ids
    assert_same_predictions(ours, ref_model, ids, steps=8)
    via_auto = AutoModelForCausalLM.from_pretrained(out)  # the registered quantizer
    with torch.no_grad():
        assert torch.equal(via_auto(ids).logits, ours(ids).logits)

    # quantized weights stay quantized, both ways: at most 1.2x the file's tensor bytes held
    # (a float32 copy of the Q8_0 embedding alone would be 3.8x it)
    for model in (ours, via_auto):
        held = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
        assert held <= 1.2 * file_tensor_bytes(out), (held, file_tensor_bytes(out))
        assert any(isinstance(m, QuantLinear) for m in model.modules())


@pytest.mark.slow
def test_a_quantized_tensor_of_a_module_that_cannot_take_one_is_held_dequantized_and_said(tmp_path):
    """A Mamba file whose convolution is quantized (llama.cpp keeps it float32; a file made
    otherwise may not): that tensor alone is dequantized, with one warning naming it; the rest
    stays quantized, and the model computes as transformers' GGUF path does."""
    from transformers import AutoTokenizer

    from gguf_repack.hf import load_model

    src = write_arch(tmp_path / "m.gguf", "mamba", bpe_tokenizer_kvs(), np.random.default_rng(7),
                     quantize_also=("ssm_conv1d",), conv_kernel=32)
    assert {t.tensor_type for t in gguf.GGUFReader(src).tensors if "ssm_conv1d.weight" in t.name} == {T.Q8_0}
    convert(src, tmp_path / "out")
    with pytest.warns(UserWarning, match=r"2 quantized tensors are held dequantized.*"
                                         r"blk\.0\.ssm_conv1d\.weight \(Conv1d\)") as caught:
        ours = load_model(tmp_path / "out")
    assert len([w for w in caught if "gguf_repack" in str(w.message)]) == 1
    ids = AutoTokenizer.from_pretrained(tmp_path / "out")(PROMPT, return_tensors="pt").input_ids
    assert_same_predictions(ours, transformers_gguf_model(src), ids, steps=8)
    held = sum(t.numel() * t.element_size() for t in [*ours.parameters(), *ours.buffers()])
    assert held <= 1.2 * file_tensor_bytes(tmp_path / "out")


@pytest.mark.slow
@_cells("tp2", [*VLLM_TP2_ARCHS, *LLAMA_CPP_TP2, *VLLM_OWN_REFERENCE])
def test_every_architecture_through_vllm_at_tensor_parallel_2(made, module_tmp, vllm_python):  # noqa: F811
    from gguf_repack.hf import load_model

    outs = {arch: made(arch)[1] for arch in VLLM_TP2_ARCHS}
    own = {}  # (the files' converted directories, by model name)
    for name, outtype in (pair for pairs in LLAMA_CPP_TP2.values() for pair in pairs):
        own[name] = module_tmp(name) / "out"
        convert(llama_cpp_file(name, outtype), own[name])
    # the architectures vLLM computes otherwise than transformers (VLLM_OWN_REFERENCE): each Q8_0
    # file of llama.cpp's converter against vLLM's own model on the checkpoint it was made from,
    # Q8_0 round-tripped (test_llama_cpp_files.test_models_vllm_computes_otherwise_... at TP 1)
    own_pairs = []
    for name in sorted(VLLM_OWN_REFERENCE):
        out = module_tmp(f"{name}-own") / "out"
        convert(llama_cpp_file(name, "q8_0"), out)
        own_pairs.append(q8_0_own_reference(name, llama_cpp_file(name, "q8_0"), out,
                                            module_tmp(f"{name}-q8_0-round-trip")))
    results = run_vllm_many(vllm_python, [*outs.values(), *map(window_as_vllm_counts, own.values()),
                                          *(d for pair in own_pairs for d in pair)],
                            prompts=VLLM_PROMPTS, tp=2, max_tokens=8, held_bytes=True)
    for arch in HALF_PER_RANK_ARCHS:
        vocab = json.loads((outs[arch] / "config.json").read_text())["vocab_size"]
        assert_half_per_rank(outs[arch], results[str(outs[arch])]["held_bytes"], vocab=vocab)
    wrong = {}
    for arch, out in outs.items():
        ref_model = transformers_gguf_model(made(arch)[2])
        prompt_ids, tokens = transformers_tokens(ref_model, tokenizer_of(out),
                                                 VLLM_PROMPTS, steps=8)
        got = results[str(out)]
        if got["prompt_token_ids"] != prompt_ids or got["token_ids"] != tokens:
            wrong[arch] = (got["token_ids"], tokens)
    for name, out in own.items():
        with warnings.catch_warnings():  # (DeepSeek's kv_b_proj held dequantized: said, and known)
            warnings.simplefilter("ignore")
            ref_model = load_model(out)
        prompt_ids, tokens = transformers_tokens(ref_model, tokenizer_of(out),
                                                 VLLM_PROMPTS, steps=8)
        got = results[str(window_as_vllm_counts(out))]
        if got["prompt_token_ids"] != prompt_ids or got["token_ids"] != tokens:
            wrong[name] = (got["token_ids"], tokens)
    for checkpoint, out in own_pairs:
        got, own_model = (results[str(d)] for d in (out, checkpoint))
        if [got[k] for k in ("prompt_token_ids", "token_ids")] != \
                [own_model[k] for k in ("prompt_token_ids", "token_ids")]:
            wrong[str(out)] = (got["token_ids"], own_model["token_ids"])
    assert not wrong, wrong


# Format level: convert, verify and export work for any architecture, those without an engine
# mapping too (a small llama-shaped file under each name: the format does not look at it)
WITHOUT_ENGINE_TEST = sorted(a for a, row in ARCHITECTURES.items() if row["transformers"] != TESTED)
OUTSIDE_TRANSFORMERS = ["internlm2", "jais"]


def write_named(path: Path, arch: str) -> Path:
    rng = np.random.default_rng(5)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_embedding_length(64)
    for key, value, vtype, sub in byte_tokenizer_kvs():
        w.add_key_value(key, value, vtype, sub_type=sub)
    vocab = len(byte_tokenizer_kvs()[1][1])
    for name, rows, qtype in (("token_embd.weight", vocab, T.Q8_0), ("blk.0.attn_q.weight", 64, T.Q4_0)):
        weights = rng.normal(size=(rows, 64)).astype(np.float32)
        w.add_tensor(name, gguf.quants.quantize(weights, qtype), raw_dtype=qtype)
    w.add_tensor("blk.0.attn_norm.weight", rng.normal(size=64).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("arch", [pytest.param(a, marks=_cells("convert", [a])) for a in WITHOUT_ENGINE_TEST]
                         + OUTSIDE_TRANSFORMERS)
def test_convert_verify_export_are_format_level(arch, tmp_path):
    src = write_named(tmp_path / "m.gguf", arch)
    convert(src, tmp_path / "out")
    assert verify(tmp_path / "out", against=src).ok
    export(tmp_path / "out", tmp_path / "back.gguf")
    assert (tmp_path / "back.gguf").read_bytes() == src.read_bytes()


@pytest.mark.parametrize("arch", OUTSIDE_TRANSFORMERS)
def test_load_says_no_engine_mapping_exists_for_the_architecture(arch, tmp_path):
    from gguf_repack.hf import load_model

    convert(write_named(tmp_path / "m.gguf", arch), tmp_path / "out")
    with pytest.raises(RepackError, match=f"architecture '{arch}': no engine mapping exists for it yet"):
        load_model(tmp_path / "out")


def test_inspect_names_what_each_engine_does_with_the_architecture(tmp_path, cli):
    src = write_named(tmp_path / "m.gguf", "internlm2")
    proc = cli("inspect", src, check_exit=0)
    assert "architecture 'internlm2': no engine mapping exists for it yet" in proc.stdout
    convert(write_named(tmp_path / "s.gguf", "starcoder2"), tmp_path / "out")
    proc = cli("inspect", tmp_path / "out", check_exit=0)
    assert "architecture 'starcoder2': convert tested; transformers tested; vLLM tested; " \
           "vLLM TP 2 tested" in proc.stdout


def test_the_table_covers_transformers_gguf_mapping():
    """Every architecture transformers maps from GGUF has a row (by llama.cpp's name)."""
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    llama_cpp_name = {"gpt_oss": "gpt-oss", "minimax_m2": "minimax-m2", "qwen2_moe": "qwen2moe",
                      "qwen3_moe": "qwen3moe", "umt5": "t5"}
    mapped = {llama_cpp_name.get(a, a) for a in GGUF_CONFIG_MAPPING} - {"general", "tokenizer"}
    assert mapped <= set(ARCHITECTURES), mapped - set(ARCHITECTURES)


def test_the_table_claims_exactly_the_marked_tests(request):
    """A "tested" cell has a test marked with it, and a marked test has its cell "tested".
    With the whole suite collected (CI, `pytest`), both ways; with part of it, the marks seen."""
    claimed = {(column, arch) for arch, row in ARCHITECTURES.items() for column in COLUMNS
               if row[column] == TESTED}
    marked = request.config.architecture_cells
    assert marked - claimed == set(), "marked tests whose cell does not say tested"
    every_module = {p.name for p in (ROOT / "tests").glob("test_*.py")}
    if request.config.collected_modules >= every_module:
        assert claimed - marked == set(), "cells that say tested with no test marked"


def test_the_docs_have_the_table():
    page = (ROOT / "docs" / "architectures.md").read_text()
    assert markdown_table() in page, ("docs/architectures.md's table differs from "
                                      "`python -m gguf_repack.integrations.architectures`")


def test_every_table_cell_is_tested_or_gives_a_reason():
    for arch, row in ARCHITECTURES.items():
        for column in COLUMNS:
            assert row[column] == TESTED or len(row[column]) > 10, (arch, column)
    assert re.fullmatch(r"[a-z0-9_-]+", "".join(ARCHITECTURES))  # llama.cpp's spelling


def test_kl_helper_sees_a_difference():
    """The comparison the engine tests rest on is not blind."""
    a = torch.randn(3, 50)
    assert kl_per_position(a, a).max() == 0
    assert kl_per_position(a, a + torch.randn(3, 50)).max() > 1e-2
