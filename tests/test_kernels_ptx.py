"""Every kernel family x every type compiles for real GPUs (sm_80, sm_90) ahead of time, and
the PTX shows what the layout promises. Runs scripts/inspect_kernels.py in a process of its
own: kernels compiled for a GPU cannot come from the interpreter this test session uses."""

import json
import os
import subprocess
import sys
from pathlib import Path

import gguf_repack_kernels as kernels
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ptx_rows(tmp_path_factory):
    out = tmp_path_factory.mktemp("ptx") / "kernels.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    subprocess.run([sys.executable, str(ROOT / "scripts" / "inspect_kernels.py"), "--json",
                    str(out)], check=True, env=env, capture_output=True, timeout=1800)
    return json.loads(out.read_text())


def test_every_family_and_type_compiled_for_both_archs(ptx_rows):
    built = {(r["type"], r["family"], r["arch"]) for r in ptx_rows}
    for name in kernels.FORMATS:
        for family in ("dequantize", "gemv", "gemm", "embedding"):
            for arch in (80, 90):
                assert (name, family, arch) in built


def test_no_local_memory_spills(ptx_rows):
    spilled = [(r["type"], r["family"], r["arch"]) for r in ptx_rows if r["spills"]]
    assert spilled == []


def test_gemm_uses_tensor_cores(ptx_rows):
    for r in ptx_rows:
        if r["family"] == "gemm":
            assert (r["mma"] if r["arch"] == 80 else r["wgmma"]) > 0, r


# GGUF blocks whose byte size is no multiple of 8 (Q4_0: 18, Q8_0: 34, Q6_K: 210) leave the
# raw layout no aligned run to load as a vector; Q4_K (144) or IQ4_XS (136) blocks happen to.
UNALIGNED_RAW = {"Q4_0", "Q8_0", "Q6_K"}


def test_rp1_plane_loads_are_vectorized_and_unaligned_raw_blocks_are_not(ptx_rows):
    for r in ptx_rows:
        if r["family"] in ("gemv", "dequantize"):
            assert r["vector_loads"] > 0, r
        if "raw" in r["family"] and r["type"] in UNALIGNED_RAW:
            assert r["vector_loads"] == 0, r
    assert {r["type"] for r in ptx_rows if "raw" in r["family"]} >= UNALIGNED_RAW


def test_exact_families_have_no_fused_multiply_add(ptx_rows):
    """Dequantize and embedding must round like the reference: no FMA in their PTX."""
    for r in ptx_rows:
        if r["family"] in ("dequantize", "embedding"):
            assert r["fma"] == 0, r
