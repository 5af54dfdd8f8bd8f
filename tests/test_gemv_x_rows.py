"""The GEMV's programs of several rows of x (gemv.gemv_dot_rows, configs.gemv_x_rows): each
row's product is the one its own program of one row gives, bit for bit (the same dot
function on the same blocks, added in the same order), whatever rows the last program has
past M; and with split K, as on a GPU, the product within float tolerance."""

import numpy as np
import pytest
import torch
from test_kernels import gemv_x, make_planes

import gguf_repack_kernels as kernels
from gguf_repack.format.type_table import TYPES_BY_NAME
from gguf_repack.runtime.dequant import dequantize_planes

# float x (32- and 256-weight blocks), int8 x, blocks in parts (IQ4_XS); the types whose rule
# takes the GEMV at M = 3 (the 1- to 3-bit ones) are checked against the reference there by
# test_kernels.py's slow tier
TYPES = ["Q4_0", "Q4_K", "Q2_K", "IQ4_XS"]


@pytest.fixture
def rng():
    return np.random.default_rng(7)


@pytest.fixture
def deterministic():
    """K whole (dispatch._deterministic): no atomic float sums, so equal bit for bit."""
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(False)


@pytest.mark.parametrize("name", TYPES)
def test_rows_of_x_a_program_are_each_row_alone(name, rng, monkeypatch, deterministic):
    qtype = TYPES_BY_NAME[name]
    n, k = 37, qtype.block_size  # (K whole under deterministic: one block column does)
    qtype, planes = make_planes(name, (n, k), rng)
    monkeypatch.setattr(kernels.dispatch, "matmul_path", lambda type_name, m: "gemv")
    x = torch.from_numpy(rng.standard_normal((5, k)).astype(np.float32))
    alone = torch.cat([kernels.matmul(x[i:i + 1], planes, name, (n, k)) for i in range(5)])
    for m, x_rows in ((2, 2), (3, 4), (5, 4)):  # M = 5: a program of 4, one of 1
        assert kernels.configs.gemv_x_rows(m) == x_rows
        cfg = kernels.dispatch._gemv_config(name, m, n, k // qtype.block_size, x.device, x.dtype)
        assert cfg["XR"] == x_rows, cfg
        assert torch.equal(kernels.matmul(x[:m], planes, name, (n, k)), alone[:m]), (name, m)
    xh = (x / dequantize_planes(planes, qtype).abs().max()).half()
    alone_h = torch.cat([kernels.matmul(xh[i:i + 1], planes, name, (n, k)) for i in range(5)])
    assert torch.equal(kernels.matmul(xh, planes, name, (n, k)), alone_h), name


@pytest.mark.parametrize("name", ["Q4_K"])
def test_rows_of_x_a_program_with_split_k(name, rng, monkeypatch):
    """Split K on a GPU's 132 SMs: the tile's counter is the program's rows' (split_k.py),
    every row of a program added once, rows past M never stored."""
    qtype = TYPES_BY_NAME[name]
    n, k = 37, 4 * qtype.block_size
    qtype, planes = make_planes(name, (n, k), rng)
    dense = dequantize_planes(planes, qtype)
    gpu = kernels.configs.Device(0, 0, 132)
    monkeypatch.setattr(kernels.dispatch, "_device", lambda device: gpu)
    monkeypatch.setattr(kernels.dispatch, "matmul_path", lambda type_name, m: "gemv")
    for m in (6,):  # a program of 4 rows and one of 2 live rows
        cfg = kernels.configs.gemv_dot_config(name, m, n, 4, gpu, torch.float32)
        assert cfg["SPLIT_K"] > 1 and cfg["XR"] > 1, cfg
        x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32))
        ref = gemv_x(name, x) @ dense.T
        got = kernels.matmul(x, planes, name, (n, k))
        assert ((got - ref).abs().max() / ref.abs().max()).item() <= 1e-4, (name, m)


def test_x_rows_by_m_and_where_more_spilled():
    """2 rows of x at M = 2, 4 from M = 3; fewer where ptxas spilled more (sm_80:
    configs.GEMV_X_ROWS_MAX), and a thread's weight rows (ROWS) from GEMV_XR_ROWS; the expert
    GEMV keeps one (token, slot) pair a program."""
    configs = kernels.configs
    h200, a100 = configs.KNOWN_DEVICES[90], configs.Device(80, 166912, 108)
    assert [configs.gemv_x_rows(m) for m in (1, 2, 3, 4, 8)] == [1, 2, 4, 4, 4]
    for name, on_a100 in (("Q2_K", 4), ("Q4_K", 2), ("Q6_K", 1)):
        assert configs.gemv_dot_config(name, 8, 4096, 16, a100, torch.float16)["XR"] == on_a100
        assert configs.gemv_dot_config(name, 8, 4096, 16, h200, torch.float16)["XR"] == 4
    assert configs.gemv_dot_config("Q4_0", 4, 4096, 128, h200, torch.float16)["BN"] == 256  # ROWS 2
    assert configs.gemv_dot_config("Q4_0", 1, 4096, 128, h200, torch.float16)["BN"] == 512  # ROWS 4
    assert configs.gemv_dot_config("Q4_K", 64, 4096, 16, h200, torch.float16, x_rows=1)["XR"] == 1
