"""The GEMV's programs of several rows of x (gemv.gemv_dot_rows, configs.gemv_x_rows): each
row's product is the one its own program of one row gives, bit for bit (the same dot
function on the same blocks, added in the same order), whatever rows the last program has
past M; and with split K, as on a GPU, the product within float tolerance. The same for the
expert GEMV on 2 or 4 of an expert's rows a program (moe.moe_gemv_rows_kernel) against the
GEMV a (token, slot) pair."""

import numpy as np
import pytest
import torch
from test_kernels import gemv_x, make_planes

import gguf_repack_kernels as kernels
from gguf_repack.format.type_table import TYPES_BY_NAME
from gguf_repack.runtime.dequant import dequantize_planes

# float x (32- and 256-weight blocks), int8 x, blocks in parts (IQ4_XS), a grid type of 8- and
# one of 4-byte rows (their dot_rows: signed bytes where one row of x takes the sum less twice the
# negative part); the types whose rule takes the GEMV at M = 3 (the 1- to 3-bit ones) are
# checked against the reference there by test_kernels.py's slow tier
TYPES = ["Q4_0", "Q4_K", "Q2_K", "IQ4_XS", "IQ2_XXS", "IQ3_S"]


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


# The expert GEMV on 2 or 4 of an expert's rows a program (moe.moe_gemv_rows_kernel): 4
# experts; expert 0 gets 5 rows (a program of 4 and one of 1), expert 2 three, expert 3 one,
# expert 1 none; -1 (another rank's expert) three times, written as zeros
EXPERT_IDS = [[2, 0], [0, -1], [3, 0], [0, 2], [-1, 0], [2, -1]]


def _expert_rule(monkeypatch, name, choice):
    monkeypatch.setitem(kernels.configs.MOE_RULE, name, ((None, choice),))


@pytest.mark.parametrize("name", ["Q4_0", "MXFP4", "IQ2_S"])  # float x, int8 x, dot_rows
def test_expert_rows_a_program_are_each_pair_alone(name, rng, monkeypatch, deterministic):
    """Each (token, slot) pair's product is the one the GEMV a pair gives, bit for bit, at 2
    and at 4 rows a program, with x a token (float32) and x a slot (float16); the experts are
    read through the sort's tiles (their slots, the padding read again, never stored)."""
    qtype = TYPES_BY_NAME[name]
    experts, n, k = 4, 37, qtype.block_size
    qtype, planes = make_planes(name, (experts, n, k), rng)
    ids = torch.tensor(EXPERT_IDS)
    t = len(ids)
    scale = dequantize_planes(planes, qtype).abs().max()
    taken = []
    launch = kernels.dispatch._expert_gemv_rows
    monkeypatch.setattr(kernels.dispatch, "_expert_gemv_rows", lambda *a: taken.append(a[-1]) or launch(*a))
    for x in (torch.from_numpy(rng.standard_normal((t, k)).astype(np.float32)),  # x a token
              (torch.from_numpy(rng.standard_normal((t, 2, k)).astype(np.float32)) / scale).half()):
        _expert_rule(monkeypatch, name, "gemv")
        alone = kernels.expert_matmul(x, ids, planes, name, (experts, n, k))
        assert taken == []
        for x_rows in (2, 4):
            _expert_rule(monkeypatch, name, f"gemv_x{x_rows}")
            got = kernels.expert_matmul(x, ids, planes, name, (experts, n, k))
            assert taken.pop() == x_rows
            assert torch.equal(got, alone), (name, x_rows, x.shape, x.dtype)
            assert torch.equal(got[ids < 0], torch.zeros(3, n, dtype=x.dtype))


def test_expert_rows_a_program_with_split_k(rng, monkeypatch):
    """Split K on a GPU's 132 SMs: a tile's counter is its program's slots' (split_k.py); the
    products within float tolerance of plain PyTorch, -1's rows zeros."""
    name = "Q4_0"
    qtype = TYPES_BY_NAME[name]
    experts, n, k = 4, 37, 8 * qtype.block_size
    qtype, planes = make_planes(name, (experts, n, k), rng)
    dense = dequantize_planes(planes, qtype).reshape(experts, n, k)
    gpu = kernels.configs.Device(0, 0, 132)
    monkeypatch.setattr(kernels.dispatch, "_device", lambda device: gpu)
    ids = torch.tensor(EXPERT_IDS)
    x = torch.from_numpy(rng.standard_normal((len(ids), k)).astype(np.float32))
    ref = torch.einsum("tk,tjnk->tjn", gemv_x(name, x), dense[ids.clamp(min=0)]) * (ids >= 0)[..., None]
    for x_rows in (4,):  # (2 rows a program: the same code, the test above)
        _expert_rule(monkeypatch, name, f"gemv_x{x_rows}")
        assert kernels.configs.gemv_dot_config(name, ids.numel(), n, 8, gpu, torch.float32,
                                               x_rows=x_rows)["SPLIT_K"] > 1
        got = kernels.expert_matmul(x, ids, planes, name, (experts, n, k))
        assert ((got - ref).abs().max() / ref.abs().max()).item() <= 1e-4, x_rows
        assert torch.equal(got[ids < 0], torch.zeros(3, n))


def test_expert_x_rows_by_the_rule_and_where_more_spilled(monkeypatch):
    """configs.moe_gemv_x_rows: the rule's GEMV choice at the rows an expert gets (1 for a
    pair, and where a tile is named), capped as the dense GEMV is on sm_80."""
    configs = kernels.configs
    monkeypatch.setitem(configs.MOE_RULE, "Q4_K", ((1.5, "gemv"), (2.5, "gemv_x2"), (4.0, "gemv_x4"),
                                                   (None, "tiles_bm16")))
    assert [configs.moe_gemv_x_rows("Q4_K", r) for r in (1.0, 1.4, 2.0, 3.0, 5.0)] == [1, 1, 2, 4, 1]
    assert configs.moe_gemv_x_rows("Q4_K", 3.0, 80) == 2  # GEMV_X_ROWS_MAX
    assert kernels.dispatch.expert_path("Q4_K", 24, 8, 64) == "gemv"  # 3.1 rows: the GEMV on 4
