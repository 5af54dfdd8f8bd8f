"""The engines' GPU path, run on CPU: GGUF_REPACK_BACKEND=triton makes every QTensor operation
that asks for "auto" take what CUDA takes (the Triton kernels, here under Triton's
interpreter, which conftest selects), through transformers' QuantLinear, QuantEmbedding and
QuantExperts and through vLLM's custom ops and the plugin's fused-MoE method, compiled as
vLLM compiles. A dense llama and a Qwen3-MoE (4 experts, 2 a token), as small as the types
allow (the interpreter's GEMVs take about 10 us a weight a token): legacy types at K = 64, Q4_K
and Q6_K where K is 256; against the torch backend on the same directory. Also load_model's
default dtype (float32 on CPU, 16-bit on CUDA)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from hf_models import bpe_tokenizer_kvs, write_model, write_moe
from test_vllm import (
    run_vllm_many,
    transformers_tokens,
    vllm_python,  # noqa: F401 - the fixture
)

from gguf_repack import RepackError, convert
from gguf_repack.runtime import backends

# (head_dim 32: the smallest vLLM's CPU attention takes)
DENSE_SHAPE = dict(hidden=64, heads=2, kv_heads=1, head_dim=32, ffn=256, tied=False)
DENSE_TYPES = {"attn_q": T.Q4_0, "attn_k": T.Q5_1, "attn_v": T.Q8_0, "attn_output": T.Q4_1,
               "ffn_gate": T.Q5_0, "ffn_up": T.Q4_0, "ffn_down": T.Q4_K}
# layer 0: gate and up of one type (joined, one product), layer 1 three types
MOE_TYPES = [(T.Q4_0, T.Q4_0, T.Q4_K), (T.Q5_0, T.Q8_0, T.Q6_K)]
# Each of the kernels' paths by M (gguf_repack_kernels.dispatch): the prefill of 18 tokens takes
# the fused GEMMs (M > 8; 36 routed pairs, 9 or more an expert: the MoE tile kernel), decode
# the GEMVs (and a GEMV a routed pair); vLLM's compile warm-up (its profile run, 4096 tokens
# here, checked only for running) the weights dequantized then torch.matmul, chosen experts too.
# The GEMVs are the interpreter's slow part (seconds a step)
PROMPT_IDS = [list(range(3, 21))]
NEW_TOKENS = 3
VLLM_PROMPTS = ["the cat sat on the mat", "once upon a time"]  # 13 and 12 tokens here


@pytest.fixture(scope="module")
def tiny(module_tmp):
    """kind ("dense" or "moe") -> output directory."""
    made = {}

    def make(kind: str):
        if kind not in made:
            root = module_tmp(kind)
            rng = np.random.default_rng(11)
            if kind == "dense":
                src = write_model(root / "m.gguf", "llama", bpe_tokenizer_kvs(), rng,
                                  shape=DENSE_SHAPE, types=DENSE_TYPES)
            else:
                src = write_moe(root / "m.gguf", "qwen3moe", bpe_tokenizer_kvs(), rng, expert_ffn=256,
                                expert_types=MOE_TYPES, hidden=64, head_dim=32)
            convert(src, root / "out")
            made[kind] = root / "out"
        return made[kind]
    return make


def count_calls(monkeypatch) -> Counter:
    """Counts (backend, operation) of every QTensor backend call from now on."""
    calls = Counter()
    for backend in (backends.TorchBackend, backends.TritonBackend):
        for op in ("dequantize", "matmul", "expert_matmul", "embedding"):
            def counted(*args, _op=getattr(backend, op), _key=(backend.name, op)):
                calls[_key] += 1
                return _op(*args)
            monkeypatch.setattr(backend, op, staticmethod(counted))
    return calls


def greedy(model, ids: torch.Tensor):
    """NEW_TOKENS greedy tokens and the logits each came from (prefill's last position, then
    each decode step's)."""
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                             do_sample=False, output_logits=True, return_dict_in_generate=True)
    return out.sequences[0, ids.shape[1]:].tolist(), torch.stack(out.logits)


# float16 and bfloat16 as well: the kernels' 16-bit paths (the GEMMs' products in x's dtype,
# float32 sums), within their rounding of the torch backend's float32 products (bfloat16
# under the interpreter as on a GPU: gguf_repack_kernels/interpreter.py)
@pytest.mark.slow
@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-4), (torch.float16, 0.05),
                                               (torch.bfloat16, 0.05)],
                         ids=["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_transformers_on_the_triton_backend_gives_the_torch_backends_tokens(kind, dtype, tolerance, tiny,
                                                                           monkeypatch):
    from gguf_repack.hf import QuantExperts, load_model

    out = tiny(kind)
    ids = torch.tensor(PROMPT_IDS)
    results = {}
    for backend in ("torch", "triton"):
        monkeypatch.setenv(backends.ENV, backend)
        model = load_model(out, dtype=dtype)  # backend="auto": what the variable says
        assert (kind == "moe") == any(isinstance(m, QuantExperts) for m in model.modules())
        calls = count_calls(monkeypatch)
        results[backend] = *greedy(model, ids), dict(calls)
        monkeypatch.undo()  # the counters off again
    tokens, logits, calls = results["triton"]
    ops = {"matmul", "embedding"} | ({"expert_matmul"} if kind == "moe" else set())
    assert {op for b, op in calls if b == "triton"} == ops, calls
    # no call of the torch backend: every type here has kernels
    assert not any(b == "torch" for b, _ in calls), calls
    assert not any(b == "triton" for b, _ in results["torch"][2]), results["torch"][2]
    assert tokens == results["torch"][0]
    ref = results["torch"][1].float()
    # (16-bit: relative to the largest logit; at most 0.03 of it here in float16, the tokens the same)
    atol = tolerance if dtype == torch.float32 else tolerance * ref.abs().max().item()
    torch.testing.assert_close(logits.float(), ref, rtol=tolerance, atol=atol)


@pytest.mark.slow
def test_vllm_compiled_on_the_triton_backend_gives_the_torch_backends_tokens(tiny, vllm_python):  # noqa: F811
    """Both models in one vLLM start, compiled (vLLM's CPU build: its VLLM_COMPILE mode made
    DYNAMO_TRACE_ONCE with inductor, no CUDA graphs on CPU), the products inside the plugin's
    custom ops on the Triton kernels; the tokens of transformers on the torch backend."""
    from transformers import AutoTokenizer

    from gguf_repack.hf import load_model

    outs = {kind: tiny(kind) for kind in ("dense", "moe")}
    results = run_vllm_many(vllm_python, list(outs.values()), prompts=VLLM_PROMPTS,
                            max_tokens=NEW_TOKENS, eager=False, extra=["--backend-calls"],
                            env={backends.ENV: "triton", "TRITON_INTERPRET": "1"})
    for kind, out in outs.items():
        result = results[str(out)]
        model = load_model(out, backend="torch")
        prompt_ids, tokens = transformers_tokens(model, AutoTokenizer.from_pretrained(out),
                                                 VLLM_PROMPTS, steps=NEW_TOKENS)
        assert result["prompt_token_ids"] == prompt_ids, kind
        assert result["token_ids"] == tokens, kind
        calls = result["backend_calls"]
        assert set(calls) == {"triton"}, (kind, calls)
        ops = {"matmul", "embedding"} | ({"expert_matmul"} if kind == "moe" else set())
        assert set(calls["triton"]) == ops, (kind, calls)


def test_the_variable_decides_what_auto_means(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.delenv(backends.ENV, raising=False)
    assert backends.get("auto", cpu, "Q4_K") is backends.TorchBackend
    monkeypatch.setenv(backends.ENV, "torch")
    assert backends.get("auto", cuda, "Q4_K") is backends.TorchBackend
    monkeypatch.setenv(backends.ENV, "triton")  # the interpreter is on (conftest)
    assert backends.get("auto", cpu, "Q4_K") is backends.TritonBackend
    assert backends.get("auto", cpu, "Q8_1") is backends.TorchBackend  # no kernel: as on CUDA
    assert backends.get("torch", cpu, "Q4_K") is backends.TorchBackend  # explicit: unchanged
    monkeypatch.setenv(backends.ENV, "cuda")
    with pytest.raises(RepackError, match="GGUF_REPACK_BACKEND='cuda': choose one of auto, torch, triton"):
        backends.get("auto", cpu, "Q4_K")


def _run(code: str, **env) -> str:
    environ = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", backends.ENV)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**environ, **env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


ERROR_CODE = """
import os, torch
from gguf_repack import RepackError, QTensor
{before}
w = QTensor("Q8_0", (32, 32), {{"d": torch.ones(1, 32, 1, dtype=torch.float16),
                                "qs": torch.ones(1, 32, 8, dtype=torch.int32)}})
try:
    w.matmul(torch.ones(1, 32))
    print("RAN")
except RepackError as e:
    print("ERROR", e)
"""


def test_triton_on_cpu_without_the_interpreter_is_a_clear_error():
    out = _run(ERROR_CODE.format(before=""), GGUF_REPACK_BACKEND="triton")
    assert out.startswith("ERROR GGUF_REPACK_BACKEND=triton: the triton backend is not usable here") \
        and "TRITON_INTERPRET=1" in out, out
    # the interpreter chosen after the kernels were made: they are GPU kernels
    out = _run(ERROR_CODE.format(before="import gguf_repack_kernels; os.environ['TRITON_INTERPRET'] = '1'"),
               GGUF_REPACK_BACKEND="triton")
    assert "the Triton kernels were imported before TRITON_INTERPRET=1 was set" in out, out
    assert _run(ERROR_CODE.format(before=""), GGUF_REPACK_BACKEND="triton", TRITON_INTERPRET="1") == "RAN\n"


def test_the_default_dtype_is_float32_on_cpu_and_16_bit_on_cuda():
    from transformers import PretrainedConfig

    from gguf_repack.hf import default_dtype

    as_written = PretrainedConfig(dtype="float32")  # what convert writes
    assert default_dtype("cpu", as_written) is torch.float32
    assert default_dtype(torch.device("cpu"), PretrainedConfig(dtype="bfloat16")) is torch.float32
    assert default_dtype("cuda", as_written) is torch.bfloat16
    assert default_dtype("cuda:1", None) is torch.bfloat16
    assert default_dtype("cuda", PretrainedConfig(dtype="float16")) is torch.float16  # the model's own
    assert default_dtype("cuda", PretrainedConfig(dtype=torch.bfloat16)) is torch.bfloat16


def test_a_cpu_load_stays_float32_and_an_explicit_dtype_is_kept(tiny):
    from gguf_repack.hf import QuantLinear, load_model

    out = tiny("dense")
    ids = torch.tensor(PROMPT_IDS)
    for dtype, model in ((torch.float32, load_model(out)),
                         (torch.bfloat16, load_model(out, dtype=torch.bfloat16))):
        assert model.dtype == dtype
        assert {m.dtype for m in model.modules() if isinstance(m, QuantLinear)} == {dtype}
        with torch.no_grad():
            assert model(ids).logits.dtype == dtype
