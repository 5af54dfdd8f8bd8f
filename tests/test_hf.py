"""The transformers integration against transformers' own GGUF path on the same source file
(`from_pretrained(gguf_file=...)`, which dequantizes every weight to float32 with gguf-py)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from hf_models import SHAPES, assert_same_predictions, tokenizer_kvs, write_model
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from gguf_repack import FormatError, convert
from gguf_repack.hf import QuantEmbedding, QuantLinear, load_model

pytestmark = pytest.mark.slow  # transformers models (real ones, and written here) against transformers

PROMPT = "The three primary colors are red, yellow and"
TEXTS = ["Hello world!", "  leading spaces and ünïcödé, 12345", "def f(x):\n\treturn x**2\n", ""]
# keys that say where a config came from rather than what the model is
PROVENANCE = {"quantization_config", "dtype", "architectures", "transformers_version",
              "_name_or_path", "_model_name_or_path", "torch_dtype"}


@pytest.fixture
def reference(transformers_reference):
    """transformers' GGUF path: src -> (model, tokenizer), once per test run (conftest)."""
    return transformers_reference


def test_engine_files_are_written_and_load_offline(converted, smollm2):
    out = converted[smollm2.name]
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
            "chat_template.jinja"} <= names
    config = json.loads((out / "config.json").read_text())
    assert config["quantization_config"] == {"quant_method": "gguf_repack", "format_version": 1}
    assert config["architectures"] == ["LlamaForCausalLM"]
    # a fresh process with the hub unreachable: the directory alone must do
    code = ("import sys; from transformers import AutoConfig, AutoTokenizer; "
            "c = AutoConfig.from_pretrained(sys.argv[1]); t = AutoTokenizer.from_pretrained(sys.argv[1]); "
            "print(c.model_type, len(t('Hi there').input_ids))")
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PATH": "/usr/bin:/bin",
           "HOME": str(out.parent)}
    proc = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[0] == "llama"


@pytest.mark.parametrize("model", ["smollm2", "gemma"])
def test_config_and_tokenizer_equal_transformers_gguf_ones(model, request, converted, reference):
    src = request.getfixturevalue(model)
    out = converted[src.name]
    ref_model, ref_tok = reference(src)
    ours = AutoConfig.from_pretrained(out).to_dict()
    theirs = AutoConfig.from_pretrained(src.parent, gguf_file=src.name).to_dict()
    assert {k: v for k, v in ours.items() if k not in PROVENANCE} == \
        {k: v for k, v in theirs.items() if k not in PROVENANCE}

    tok = AutoTokenizer.from_pretrained(out)
    assert type(tok) is type(ref_tok)
    for text in TEXTS:
        assert tok(text).input_ids == ref_tok(text).input_ids, text
    assert tok.chat_template == ref_tok.chat_template
    if ref_tok.chat_template:
        chat = [{"role": "user", "content": "What is 2+2?"}]
        assert tok.apply_chat_template(chat, tokenize=False) == \
            ref_tok.apply_chat_template(chat, tokenize=False)


def _cells(arch: str):
    """The architecture-table cells a test of this module checks (tests/test_architectures.py)."""
    return [pytest.mark.architecture("transformers", arch), pytest.mark.architecture("convert", arch)]


@pytest.mark.parametrize("model", [pytest.param("smollm2", marks=_cells("llama")),
                                   pytest.param("gemma", marks=_cells("gemma3"))])
def test_quantized_model_predicts_as_transformers_gguf_path(model, request, converted, reference):
    src = request.getfixturevalue(model)
    ref_model, ref_tok = reference(src)
    ours = load_model(converted[src.name])
    ids = ref_tok(PROMPT, return_tensors="pt").input_ids
    assert_same_predictions(ours, ref_model, ids, steps=16)

    # the weights stayed quantized: every Linear and the token embedding are ours
    assert not [n for n, m in ours.named_modules() if type(m) in (torch.nn.Linear, torch.nn.Embedding)]
    assert isinstance(ours.get_input_embeddings(), QuantEmbedding)
    assert isinstance(ours.get_output_embeddings(), QuantLinear)
    held = sum(t.numel() * t.element_size() for t in [*ours.parameters(), *ours.buffers()])
    ref_held = sum(t.numel() * t.element_size() for t in [*ref_model.parameters(), *ref_model.buffers()])
    manifest = json.loads((converted[src.name] / "manifest.json").read_text())
    source = sum(t["source"]["nbytes"] for t in manifest["tensors"])  # the GGUF's tensor bytes
    assert held <= 1.2 * source, (held, source)
    assert ref_held >= 3 * source  # transformers' path holds float32 copies


def test_from_pretrained_with_registered_quantizer_equals_load_model(converted, smollm2):
    out = converted[smollm2.name]
    via_auto = AutoModelForCausalLM.from_pretrained(out)
    direct = load_model(out)
    assert isinstance(via_auto.model.layers[0].mlp.down_proj, QuantLinear)
    ids = torch.tensor([[1, 504, 3458, 282, 4649, 314]])
    with torch.no_grad():
        assert torch.equal(via_auto(ids).logits, direct(ids).logits)


@pytest.fixture(scope="module")
def synthetic_tokenizer(smollm2):
    return tokenizer_kvs(smollm2)


@pytest.mark.parametrize("arch", [pytest.param(a, marks=_cells(a)) for a in sorted(SHAPES)])
def test_synthetic_architectures_predict_as_transformers_gguf_path(arch, synthetic_tokenizer,
                                                                   tmp_path):
    src = write_model(tmp_path / f"{arch}.gguf", arch, synthetic_tokenizer, np.random.default_rng(7))
    out = tmp_path / "out"
    convert(src, out)
    ours = load_model(out)
    assert ours.config.model_type == arch
    reference_src = src
    if arch == "mistral":
        # transformers' own GGUF path fails on a file it maps to mistral (it asks gguf-py for
        # a "mistral" tensor-name map, which does not exist). The same weights under another
        # name load as llama, which computes the same function at this context length.
        reference_src = write_model(tmp_path / "as-llama.gguf", arch, synthetic_tokenizer,
                                    np.random.default_rng(7), general_name="Mistral 7B")
    ref_model = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=reference_src.name,
                                                     dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(out)
    ids = tok(PROMPT, return_tensors="pt").input_ids
    assert_same_predictions(ours, ref_model, ids, steps=8)


def test_weights_only_writes_no_engine_files_and_load_model_says_why(smollm2, tmp_path):
    out = tmp_path / "out"
    summary = convert(smollm2, out, weights_only=True)
    assert not (out / "config.json").exists() and not (out / "tokenizer.json").exists()
    assert summary.engine_files == [] and "engine files" not in summary.line()
    with pytest.raises(FormatError, match="no config.json"):
        load_model(out)


def test_without_the_hf_extra_convert_works_and_says_what_it_skipped(smollm2, tmp_path):
    code = ("import sys; sys.modules['transformers'] = None; import gguf_repack; "
            "print(gguf_repack.convert(sys.argv[1], sys.argv[2]).line())")
    proc = subprocess.run([sys.executable, "-c", code, str(smollm2), str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "skipped config.json and tokenizer: transformers is not installed" in proc.stdout
    assert (tmp_path / "o" / "manifest.json").is_file()
    assert not (tmp_path / "o" / "config.json").exists()


def test_unknown_format_version_is_refused_with_a_clear_error(converted, smollm2, tmp_path):
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(converted[smollm2.name], out)
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"]["format_version"] = 99
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(FormatError, match="format_version 99"):
        load_model(out)
    with pytest.raises(FormatError, match="format_version 99"):
        AutoModelForCausalLM.from_pretrained(out)


def test_quantization_config_keeps_a_chosen_backend():
    """A backend passed in the quantization config survives to_dict (transformers serializes
    and re-reads it); the default stays out of config.json's form."""
    from gguf_repack.integrations.hf.quantizer import GgufRepackConfig

    assert "backend" not in GgufRepackConfig().to_dict()
    assert GgufRepackConfig(backend="torch").to_dict()["backend"] == "torch"
    assert GgufRepackConfig(**GgufRepackConfig(backend="triton").to_dict()).backend == "triton"
