"""The benchmark's raw-layout GEMV (scripts/raw_layout_kernels.py, GGUF's own blocks) under
Triton's interpreter: x @ W.T within float tolerance of the torch backend's dense weight, for
every type bench_gpu.py compares it on."""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from ggml_blocks import random_blocks

from gguf_repack.format.layout import pack
from gguf_repack.format.type_table import TYPES_BY_NAME
from gguf_repack.runtime.dequant import dequantize_planes

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from raw_layout_kernels import RAW_DEQUANT, raw_matmul  # noqa: E402

RAW_TYPES = ["Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"]


def test_every_benchmarked_type_has_a_raw_kernel():
    assert sorted(RAW_DEQUANT) == sorted(RAW_TYPES)


@pytest.mark.parametrize("name", RAW_TYPES)
def test_raw_matmul_matches_the_dense_weight(name, rng):
    qtype = TYPES_BY_NAME[name]
    n, k = 37, 2 * qtype.block_size  # N not a tile multiple, two block columns
    blocks = random_blocks(qtype.id, (n, k), rng)
    planes = {f: torch.from_numpy(v) for f, v in pack(blocks, qtype).items()}
    dense = dequantize_planes(planes, qtype)
    raw = torch.from_numpy(blocks.reshape(n, -1))
    for m in (1, 3, 8):
        x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32))
        ref = x @ dense.T
        for split_k in (1, 2):  # one store per output, and atomically added partial sums
            got = raw_matmul(x, raw, name, (n, k), split_k=split_k)
            assert got.shape == (m, n) and got.dtype == torch.float32
            assert ((got - ref).abs().max() / ref.abs().max()).item() <= 1e-4, (name, m, split_k)
        xh = (x / dense.abs().max()).half()  # keeps x @ W.T inside float16's range
        ref_h = xh.float() @ dense.T
        got_h = raw_matmul(xh, raw, name, (n, k))
        assert got_h.dtype == torch.float16
        assert ((got_h.float() - ref_h).abs().max() / ref_h.abs().max()).item() <= 1e-2, (name, m)
