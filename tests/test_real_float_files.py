"""Float files of a real model: SmolLM2-135M-Instruct at F16 and at BF16, written from the Q4_1
test model (made by llama.cpp) as llama.cpp's convert_hf_to_gguf.py writes a float file: every
key/value copied in order (general.file_type MOSTLY_F16 or MOSTLY_BF16), every tensor in the
same order, the 2-D weights (the tied embedding among them) dequantized by gguf-py and stored as
F16 / BF16 by gguf-py's own quantize, the 1-D ones (norms) F32, no output.weight (tied, as the
source). Each goes through convert, verify and export (byte for byte), transformers
(`load_model`) against transformers' GGUF path on the same float file (KL <= 1e-4 per position,
the same greedy tokens, the tied embedding held once), and vLLM (both files in one start)
against the same reference's greedy tokens.
"""

from __future__ import annotations

import filecmp

import gguf
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType as V
from hf_models import assert_same_predictions
from test_vllm import run_vllm_many, transformers_tokens, vllm_python  # noqa: F401 (a fixture)

from gguf_repack import convert, export, verify

pytestmark = pytest.mark.slow  # the real model, end to end

PROMPT = ("The three primary colors are red, yellow and blue. The capital of France is Paris, "
          "and the capital of Italy is Rome. def fibonacci(n): return n if n < 2 else "
          "fibonacci(n - 1) + fibonacci(n - 2)")
VLLM_PROMPTS = ["The capital of France is", "def fibonacci(n):"]
STEPS = 8
FLOAT_TYPES = {"f16": (T.F16, gguf.LlamaFileType.MOSTLY_F16),
               "bf16": (T.BF16, gguf.LlamaFileType.MOSTLY_BF16)}


def write_float_file(src, path, qtype: T, file_type: gguf.LlamaFileType):
    """`src` written again at `qtype` as llama.cpp's converter writes a float file."""
    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(str(path), arch)  # (it writes general.architecture first, as the source)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue  # the header's fields, and the key the writer wrote
        if key == "general.file_type":
            w.add_key_value(key, int(file_type), V.UINT32)
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == V.ARRAY else None
        w.add_key_value(key, field.contents(), vtype, sub_type=sub)
    for t in reader.tensors:
        assert t.name != "output.weight"  # tied, as the file written here is
        if len(t.shape) == 1:
            assert t.tensor_type == T.F32, t.name
            w.add_tensor(t.name, t.data.copy())
            continue
        weights = gguf.quants.dequantize(t.data, t.tensor_type)
        w.add_tensor(t.name, gguf.quants.quantize(weights, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def float_files(smollm2, module_tmp):
    """{"f16"/"bf16": (float file, output directory, convert's summary)}, each written and
    converted once."""
    made = {}
    for name, (qtype, file_type) in FLOAT_TYPES.items():
        root = module_tmp(f"smollm2-{name}")
        src = write_float_file(smollm2, root / f"SmolLM2-135M-Instruct.{name.upper()}.gguf", qtype, file_type)
        out = root / "out"
        made[name] = src, out, convert(src, out)
    return made


@pytest.fixture(scope="module")
def reference(float_files):
    """transformers' GGUF path on each float file (float32, about 40 s a file here): name ->
    model."""
    from transformers import AutoModelForCausalLM

    cache = {}

    def get(name: str):
        if name not in cache:
            src = float_files[name][0]
            cache[name] = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name,
                                                               dtype=torch.float32).eval()
        return cache[name]
    return get


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FLOAT_TYPES))
def test_float_file_is_written_as_llama_cpp_writes_one(name, float_files, smollm2):
    src = float_files[name][0]
    reader, source = gguf.GGUFReader(src), gguf.GGUFReader(smollm2)
    qtype, file_type = FLOAT_TYPES[name]
    # every key/value of the source, in its order, with its types; the file type changed
    assert list(reader.fields) == list(source.fields)
    for key, field in reader.fields.items():
        if key != "general.file_type":
            ours, theirs = (field.types, field.contents()), (source.fields[key].types,
                                                             source.fields[key].contents())
            assert ours == theirs, key
    assert reader.fields["general.file_type"].contents() == int(file_type)
    # the tensors in the source's order, the 2-D ones (the tied embedding too) at `qtype`
    assert [t.name for t in reader.tensors] == [t.name for t in source.tensors]
    kinds = {(len(t.shape), t.tensor_type) for t in reader.tensors}
    assert kinds == {(1, T.F32), (2, qtype)}, kinds
    assert "output.weight" not in {t.name for t in reader.tensors}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FLOAT_TYPES))
def test_real_float_file_converts_verifies_and_exports_byte_for_byte(name, float_files, tmp_path):
    src, out, summary = float_files[name]
    assert summary.engine_file_warnings == []
    assert verify(out, against=src).ok
    export(out, tmp_path / src.name)
    assert filecmp.cmp(tmp_path / src.name, src, shallow=False)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FLOAT_TYPES))
def test_real_float_file_in_transformers_gives_transformers_gguf_path(name, float_files, reference):
    from transformers import AutoTokenizer

    from gguf_repack.hf import load_model

    src, out, _ = float_files[name]
    ref = reference(name)
    ours = load_model(out)
    ids = AutoTokenizer.from_pretrained(out)(PROMPT, return_tensors="pt").input_ids
    assert ids.shape[1] >= 40, ids.shape
    # KL <= 1e-4 at each of the 57 positions (measured: exactly 0 at F16 and at BF16, the
    # same float32 weights computed by the same transformers model), the same 8 tokens
    assert_same_predictions(ours, ref, ids, steps=STEPS)
    # the tied embedding held once: as many parameters as the reference holds, each once
    unique = {p.data_ptr(): p.numel() for p in ref.parameters()}
    assert sum(p.numel() for p in ours.parameters()) == sum(unique.values())
    assert ours.get_output_embeddings().weight is ours.get_input_embeddings().weight


@pytest.mark.slow
def test_real_float_files_through_vllm_give_transformers_tokens(float_files, reference,
                                                                vllm_python):  # noqa: F811
    from transformers import AutoTokenizer

    outs = {name: float_files[name][1] for name in FLOAT_TYPES}
    results = run_vllm_many(vllm_python, list(outs.values()), prompts=VLLM_PROMPTS, max_tokens=STEPS)
    wrong = {}
    for name, out in outs.items():
        src = float_files[name][0]
        tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)  # the file's own
        prompt_ids, tokens = transformers_tokens(reference(name), tok, prompts=VLLM_PROMPTS, steps=STEPS)
        got = results[str(out)]
        assert got["prompt_token_ids"] == prompt_ids  # the directory's tokenizer, as the file's
        if got["token_ids"] != tokens:
            wrong[name] = (got["token_ids"], tokens)
    assert not wrong, wrong
