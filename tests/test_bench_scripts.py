"""The benchmark scripts run end to end (tiny sizes): a number in BENCHMARKS.md always comes
from a script that works."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # the scripts end to end
ROOT = Path(__file__).resolve().parents[1]


def test_bench_gpu_smoke(tmp_path):
    subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_gpu.py"), "--smoke", "--types",
                    "Q4_0,Q8_0,Q4_K", "--out", str(tmp_path)], check=True, capture_output=True,
                   timeout=600)
    result = json.loads((tmp_path / "bench_gpu.json").read_text())
    assert {r["type"] for r in result["rows"]} == {"Q4_0", "Q8_0", "Q4_K"}
    assert all(r["seconds"]["rp1"] > 0 for r in result["rows"])
    assert any(r["vs_raw"] for r in result["rows"])  # the raw-layout baseline ran
    assert "| Q4_K |" in (tmp_path / "bench_gpu.md").read_text()


def test_gpu_check_smoke(tmp_path):
    """The prepared GPU check (scripts/gpu_check.py) end to end on CPU: its three parts run and
    report, the kernels of two types pass (a K-quant and a grid type; every type's kernels are
    tests/test_kernels.py's; expert products included: a GEMV a pair and one-expert tiles), the
    small llama's greedy tokens match."""
    subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--smoke", "--types",
                    "Q4_K,IQ2_XXS", "--out", str(tmp_path)], check=True, capture_output=True,
                   timeout=900)
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert {r["type"] for r in report["kernels"]} == {"Q4_K", "IQ2_XXS"}
    assert all(r["ok"] for r in report["kernels"]), [r for r in report["kernels"] if not r["ok"]]
    assert {r["family"] for r in report["kernels"]} == {"dequantize", "embedding", "matmul",
                                                        "expert_matmul"}
    assert report["bench"]["returncode"] == 0, report["bench"]
    assert (tmp_path / "bench" / "bench_gpu.md").is_file()
    assert report["model"]["greedy_tokens_equal_cpu_torch_backend"], report["model"]
    assert len(report["model"]["speeds"]) == 6
    assert "## Small llama" in (tmp_path / "gpu_check.md").read_text()


def test_bench_hf_runs_on_smollm2(smollm2):
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_hf.py"), "--models",
                           "smollm2"], check=True, capture_output=True, text=True, timeout=600)
    assert "| SmolLM2-135M-Instruct.Q4_1.gguf | `load_model(out)` |" in proc.stdout
    assert "(same first token)" in proc.stdout


def test_bench_moe_runs_on_a_small_moe(smollm2):
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_moe.py"), "--layers", "1",
                           "--experts", "4", "--prefill", "8", "--decode", "4"],
                          check=True, capture_output=True, text=True, timeout=600)
    assert "| `load_model(out)` |" in proc.stdout
    assert "(same 4 greedy tokens)" in proc.stdout
