"""GGUF_REPACK_BACKEND: what "auto" means for every QTensor operation (gguf_repack.runtime.backends),
and the clear errors where the triton backend cannot run."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from gguf_repack import RepackError
from gguf_repack.runtime import backends


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
