"""The benchmark scripts run end to end (tiny sizes): a number in BENCHMARKS.md always comes
from a script that works."""

import json
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

import gguf_repack_kernels as kernels

pytestmark = pytest.mark.slow  # the scripts end to end
ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_smoke(tmp_path, monkeypatch):
    """The prepared GPU check (scripts/gpu_check.py) end to end on CPU: its four parts run and
    report, the kernels of one type pass (every type's kernels are tests/test_kernels.py's;
    expert products included: a GEMV a pair and one-expert tiles), the small llama's and the
    small Qwen3-MoE's greedy tokens match; the CUDA-graph part's steps (without a graph on
    CPU) for Q4_K. Its bench part is scripts/bench_gpu.py's smoke run, checked here: every
    type's row timed, the raw-layout baseline beside it, bfloat16 x at the tiles' M, the
    expert products' rows, the fused tile past configs.FUSED_MAX_M."""
    subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--smoke", "--types",
                    "Q4_K", "--out", str(tmp_path)], check=True, capture_output=True,
                   timeout=900)
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert {r["type"] for r in report["kernels"]} == {"Q4_K"}
    assert all(r["ok"] for r in report["kernels"]), [r for r in report["kernels"] if not r["ok"]]
    assert {r["family"] for r in report["kernels"]} == {"dequantize", "embedding", "matmul",
                                                        "expert_matmul", "graph bf16", "split-K workspace"}
    assert report["bench"]["returncode"] == 0, report["bench"]
    bench = json.loads((tmp_path / "bench" / "bench_gpu.json").read_text())
    assert {r["type"] for r in bench["rows"]} == {"Q4_0", "Q4_K"}
    assert all(r["seconds"]["rp1"] > 0 for r in bench["rows"])
    assert any(r["vs_raw"] for r in bench["rows"])  # the raw-layout baseline ran
    # the fused tile of Q4_0 (M = 16) beside its one-block K steps; none for Q4_K's 256 weights
    assert {(r["type"], r["M"]) for r in bench["rows"] if "one-block steps" in r["seconds"]} == {("Q4_0", 16)}
    # bfloat16 x beside it at the tiles' M (both types have bfloat16 dequant functions)
    assert {(r["type"], r["M"]) for r in bench["rows"] if "rp1 bf16 x" in r["seconds"]} == {
        ("Q4_0", 16), ("Q4_K", 16)}
    # past configs.FUSED_MAX_M, the fused tile the rule names there beside dequantize+matmul
    monkeypatch.setattr(kernels.configs, "FUSED_MAX_M", 1 << 30)
    fused = {("Q4_0", 128), ("Q4_K", 128)}
    assert {(r["type"], r["M"]) for r in bench["rows"] if "fused past the cap" in r["seconds"]} == {
        (t, m) for t, m in fused if kernels.dispatch.matmul_path(t, m) == "gemm"} == fused
    # the expert products' rows (#31's MoE measure: touched experts' bytes against the copy)
    assert [(r["type"], r["tokens"], r["path"]) for r in bench["expert_rows"]] == [
        ("Q4_0", 1, "gemv"), ("Q4_K", 1, "gemv")]
    assert all(r["seconds"]["rp1"] > 0 and r["touched_bytes"] > 0 for r in bench["expert_rows"])
    assert "Expert products" in (tmp_path / "bench" / "bench_gpu.md").read_text()
    assert "| Q4_K |" in (tmp_path / "bench" / "bench_gpu.md").read_text()
    assert report["tune"]["returncode"] == 0, report["tune"]
    assert (tmp_path / "tune" / "tuned_configs.md").is_file()
    assert report["model"]["greedy_tokens_equal_cpu_torch_backend"], report["model"]
    assert len(report["model"]["speeds"]) == 6
    assert report["model"]["moe"]["greedy_tokens_equal_cpu_torch_backend"], report["model"]["moe"]
    text = (tmp_path / "gpu_check.md").read_text()
    assert "## Small llama" in text and "## Small Qwen3-MoE" in text


def test_tune_kernels_smoke_writes_tiles_that_configs_reads(tmp_path, monkeypatch):
    """scripts/tune_kernels.py on CPU (the interpreter: its times mean nothing, the code is what
    is checked): every tile kind of the type timed with its default and each candidate, each
    candidate's result checked against the default's; the chosen tiles, committed as
    gguf_repack_kernels/tuned_configs.json, are what configs.py launches, and the product is still right."""
    subprocess.run([sys.executable, str(ROOT / "scripts" / "tune_kernels.py"), "--smoke", "--types",
                    "Q4_0", "--out", str(tmp_path)], check=True, capture_output=True, timeout=600)
    report = json.loads((tmp_path / "tuned_configs.json").read_text())
    rows = report["timings"]
    assert {r["kind"] for r in rows} == {"gemv", "gemm_bm16", "gemm_bm32", "gemm_bm64"}
    assert all("seconds" in r and (r["tile"] is None or r["error"] <= 1e-2) for r in rows), rows
    assert sum(r["tile"] is None for r in rows) == 4  # the default of each kind, beside the rest

    from ggml_blocks import random_blocks

    import gguf_repack_kernels as kernels
    from gguf_repack.format.layout import pack
    from gguf_repack.format.type_table import TYPES_BY_NAME

    # under the key of the device and dtype it ran on: the interpreter, float16 x
    assert list(report["tiles"]) == ["interpreter/fp16"] and report["key"] == "interpreter/fp16"
    tiles = {"gemm_bm16": {"Q4_0": {"BN": 32, "num_warps": 4, "num_stages": 3}},
             "gemv": {"Q4_0": {"ROWS": 1, "PARTS": 1, "num_warps": 4}}}
    tuned = tmp_path / "tuned_configs.json"
    tuned.write_text(json.dumps({**report, "tiles": {"interpreter/fp32": tiles}}))
    gpu = kernels.configs.Device(0, 0, 132)  # the interpreter's key, 132 SMs
    assert kernels.configs.gemm_config("Q4_0", 32, 16, 4096, 128, gpu, torch.float32)["BN"] == 128
    monkeypatch.setattr(kernels.configs, "TUNED_CONFIGS", tuned)
    cfg = kernels.configs.gemm_config("Q4_0", 32, 16, 4096, 128, gpu, torch.float32)
    assert (cfg["BN"], cfg["num_stages"]) == (32, 3)
    assert kernels.configs.gemm_config("Q4_0", 32, 16, 4096, 128, gpu, torch.float16)["BN"] == 128
    assert kernels.configs.gemv_dot_config("Q4_0", 1, 4096, 128, gpu, torch.float32)["BN"] == 128  # 1 row
    assert kernels.configs.gemm_config("Q4_K", 256, 16, 4096, 16, gpu, torch.float32)["BN"] == 64  # default
    qtype = TYPES_BY_NAME["Q4_0"]
    blocks = random_blocks(qtype.id, (40, 64), np.random.default_rng(0))
    planes = {f: torch.from_numpy(v) for f, v in pack(blocks, qtype).items()}
    dense = torch.from_numpy(gguf.quants.dequantize(blocks.reshape(40, -1), gguf.GGMLQuantizationType.Q4_0))
    x = torch.randn(16, 64)
    assert torch.allclose(kernels.matmul(x, planes, "Q4_0", (40, 64)), x @ dense.T, rtol=1e-4, atol=1e-4)


def test_bench_hf_runs_on_smollm2(smollm2):
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_hf.py"), "--models",
                           "smollm2"], check=True, capture_output=True, text=True, timeout=600)
    assert "| SmolLM2-135M-Instruct.Q4_1.gguf | `load_model(out)` |" in proc.stdout
    assert "(same first token)" in proc.stdout



def test_bench_gpu_times_the_expert_path_the_rule_does_not_take():
    """bench_gpu.py's "other path" of the expert products, on Qwen3-30B-A3B's stack (128
    experts, 8 a token): none for one token (a row an expert: the GEMV whatever the rule);
    at 64 tokens (4 rows an expert, the tiles) the GEMV on 4 of an expert's rows a program;
    where the rule keeps the GEMV past a row (4 tokens, 1.1 rows, Q4_K; 16 tokens, 1.6 rows,
    IQ4_XS, on 2 rows a program) its first tile; the rule put back after."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_gpu", ROOT / "scripts" / "bench_gpu.py")
    bench_gpu = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_gpu)
    rule = kernels.configs.MOE_RULE["Q4_K"]
    assert bench_gpu.other_expert_choice("Q4_K", 1, 8, 128) is None
    assert kernels.dispatch.expert_path("Q4_K", 64, 8, 128) == "tiles"
    assert bench_gpu.other_expert_choice("Q4_K", 64, 8, 128) == "gemv_x4"
    assert kernels.dispatch.expert_path("Q4_K", 4, 8, 128) == "gemv"
    assert bench_gpu.other_expert_choice("Q4_K", 4, 8, 128) == next(c for _, c in rule if c != "gemv")
    assert kernels.configs.moe_gemv_x_rows("IQ4_XS", kernels.configs.routed_rows_per_expert(16, 8, 128)) == 2
    assert kernels.dispatch.expert_path("IQ4_XS", 16, 8, 128) == "gemv"
    assert bench_gpu.other_expert_choice("IQ4_XS", 16, 8, 128) == "tiles_bm16"
    with bench_gpu.expert_choice("Q4_K", "gemv"):
        assert kernels.dispatch.expert_path("Q4_K", 64, 8, 128) == "gemv"
    assert kernels.configs.MOE_RULE["Q4_K"] == rule

def test_bench_moe_runs_on_a_small_moe(smollm2):
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_moe.py"), "--layers", "1",
                           "--experts", "4", "--prefill", "8", "--decode", "4"],
                          check=True, capture_output=True, text=True, timeout=600)
    assert "| `load_model(out)` |" in proc.stdout
    assert "(same 4 greedy tokens)" in proc.stdout


def test_bench_host_times_each_product_with_its_launches_stubbed():
    """scripts/bench_host.py: the dispatcher's own host time, a row for each product it
    times (dense at M = 1 and 16, experts at 1 and 256 tokens), every path named."""
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_host.py"), "--types", "Q8_0",
                          "--calls", "3"], check=True, capture_output=True, text=True, timeout=300).stdout
    rows = [line for line in out.splitlines() if line.startswith("| Q8_0 |")]
    assert [r.split(" | ")[1] for r in rows] == [
        "matmul, M = 1 (gemv)", "matmul, M = 16 (gemm)", "expert_matmul, 1 tokens x 2 of 8 experts (gemv)",
        "expert_matmul, 256 tokens x 2 of 8 experts (tiles)"]
    assert all(float(r.split(" | ")[2].rstrip(" |")) > 0 for r in rows)
