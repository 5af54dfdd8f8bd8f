"""The Triton kernels under Triton's interpreter (CPU tensors, small shapes): dequantize
bitwise equal to the torch backend, matmul within float tolerance, embedding exact."""

import gguf
import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from ggml_blocks import as_q8_0, random_blocks

import gguf_repack_kernels as kernels
from gguf_repack import QTensor, RepackError
from gguf_repack.format.layout import pack
from gguf_repack.format.type_table import TYPES_BY_NAME
from gguf_repack.runtime.dequant import DEQUANTIZERS, dequantize_planes
from gguf_repack_kernels.fields import nibbles_f16, tile_columns

KERNEL_TYPES = sorted(kernels.FORMATS)


def make_planes(name, shape, rng):
    qtype = TYPES_BY_NAME[name]
    blocks = random_blocks(qtype.id, shape, rng)
    return qtype, {k: torch.from_numpy(v) for k, v in pack(blocks, qtype).items()}


def gemv_x(name, x):
    """The x that the product multiplies: on the GEMV's path (dispatch.matmul_path at x's M)
    for a type whose dot function takes int8 x, x as gguf-py's Q8_0 stores it; else x."""
    if kernels.dispatch.matmul_path(name, x.shape[0]) == "gemv" and kernels.FORMATS[name].x_int8:
        return torch.from_numpy(as_q8_0(x.float().numpy()))
    return x.float()


def test_every_torch_type_has_a_kernel():
    assert sorted(DEQUANTIZERS) == KERNEL_TYPES


@pytest.mark.parametrize("name", KERNEL_TYPES)
def test_formats_match_the_type_table(name):
    fmt, qtype = kernels.FORMATS[name], TYPES_BY_NAME[name]
    assert fmt.block_size == qtype.block_size
    assert fmt.fields == tuple(f.name for f in qtype.fields)


@pytest.mark.parametrize("name", KERNEL_TYPES)
def test_dequantize_is_bitwise_the_torch_backend(name, rng):
    for shape in [(5, 1), (67, 3), (2, 3, 2)]:  # (rows..., blocks): N not a tile multiple, experts
        qtype = TYPES_BY_NAME[name]
        shape = (*shape[:-1], shape[-1] * qtype.block_size)
        qtype, planes = make_planes(name, shape, rng)
        expected = dequantize_planes(planes, qtype).reshape(shape)
        got = kernels.dequantize(planes, name, shape)
        assert got.dtype == torch.float32 and got.shape == shape
        assert torch.equal(got.view(torch.int32), expected.view(torch.int32)), name
        assert torch.equal(kernels.dequantize(planes, name, shape, torch.float16), expected.half())
        assert torch.equal(kernels.dequantize(planes, name, shape, torch.bfloat16), expected.bfloat16())


def test_every_launched_plane_is_whole_words_an_expert(rng):
    """The dequant functions read a 16-bit scale as the aligned 32-bit word that holds it
    (fields.field16_in_word): the launcher gives them planes that start on a word, each
    expert's a whole number of words. An odd B x N (here 3 blocks x 37 rows) and a plane
    viewed at a 2-byte offset are copied so, expert by expert, values unchanged; a plane
    that is so already is passed as it is. (The interpreter reads a word anywhere: on a GPU
    a misaligned one faults, hence this check of the arguments themselves.)"""
    fmt = kernels.FORMATS["Q4_K"]
    _, planes = make_planes("Q4_K", (4, 37, 3 * 256), rng)  # d and dmin: 2 bytes a block
    args = kernels.dispatch._plane_args(planes, fmt)[:len(fmt.fields)]
    for field, arg in zip(fmt.fields, args):
        plane = planes[field].reshape(4, -1)
        assert arg.data_ptr() % 4 == 0 and arg.stride(0) * arg.element_size() % 4 == 0, field
        assert torch.equal(arg.reshape(4, -1)[:, :plane.shape[1]], plane), field
        if plane.shape[1] * plane.element_size() % 4 == 0:
            assert arg.data_ptr() == planes[field].data_ptr(), field  # no copy
    assert args[0].stride(0) > planes["d"][0].numel()  # d was copied a word apart
    buffer = torch.zeros(2 + planes["d"][0].numel() * 2, dtype=torch.uint8)
    shifted = buffer[2:].view(torch.float16).reshape(planes["d"][0].shape)  # 2 bytes past a word
    shifted.copy_(planes["d"][0])
    aligned = kernels.dispatch._whole_words(shifted)
    assert aligned.data_ptr() % 4 == 0 and torch.equal(aligned[:shifted.numel()].view(-1), shifted.view(-1))


@pytest.mark.parametrize("name", KERNEL_TYPES)
@pytest.mark.parametrize("k_blocks, batches", [
    (1, (1, 16)),  # the GEMV and the GEMM's M = 16 tile, one block column
    # split K; the tiles the rule takes there (M = 2: the GEMV of the types whose rule keeps
    # it there takes 2 rows of x a program, where M = 3's 4 cost the interpreter twice as much)
    pytest.param(2, (2, 33), marks=pytest.mark.slow),
    # more block columns than split-K parts, at one row (M = 3's programs of rows of x, which
    # the 1- to 3-bit types' GEMV takes there, cost the interpreter 15-19 s a type at this K:
    # K = 2 above and tests/test_gemv_x_rows.py hold them)
    pytest.param(4, (1,), marks=pytest.mark.slow)])
def test_matmul_and_embedding(name, k_blocks, batches, rng):
    qtype = TYPES_BY_NAME[name]
    # N not a multiple of any tile; fewer rows where K is the point (the interpreter runs a
    # GEMV program per row, minutes for all types at 37)
    n, k = 37 if k_blocks == 1 else 9, k_blocks * qtype.block_size
    qtype, planes = make_planes(name, (n, k), rng)
    dense = dequantize_planes(planes, qtype)
    for m in batches:  # the path and tile dispatch.matmul_path takes at each M
        x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32))
        ref = gemv_x(name, x) @ dense.T
        got = kernels.matmul(x, planes, name, (n, k))
        assert got.shape == (m, n) and got.dtype == torch.float32
        assert ((got - ref).abs().max() / ref.abs().max()).item() <= 1e-4, (name, m)
        xh = (x / dense.abs().max()).half()  # keeps x @ W.T inside float16's range
        ref_h = gemv_x(name, xh) @ dense.T
        got_h = kernels.matmul(xh, planes, name, (n, k))
        assert got_h.dtype == torch.float16
        assert ((got_h.float() - ref_h).abs().max() / ref_h.abs().max()).item() <= 1e-2, (name, m)
        xb = (x / dense.abs().max()).bfloat16()  # vLLM's default on a GPU (interpreter.py)
        ref_b = gemv_x(name, xb) @ dense.T
        got_b = kernels.matmul(xb, planes, name, (n, k))
        assert got_b.dtype == torch.bfloat16
        assert ((got_b.float() - ref_b).abs().max() / ref_b.abs().max()).item() <= 2e-2, (name, m)
    ids = torch.tensor([[0, n - 1, 5], [5, 5, 2]])
    assert torch.equal(kernels.embedding(ids, planes, name, (n, k)), dense[ids])
    assert torch.equal(kernels.embedding(ids, planes, name, (n, k), torch.bfloat16), dense[ids].bfloat16())


@pytest.mark.parametrize("name", sorted(kernels.configs.SWAP_AB_TYPES))
def test_swapped_tiles_give_the_product(name, rng, monkeypatch):
    """The BM = 32, 64 and 128 tiles that take the weight tile as the MMA's A operand (gemm.py,
    configs.swap_ab: float16 and bfloat16 x), each forced at a few rows: the same product
    within float tolerance, x's padding rows masked, N not a multiple of the tile."""
    configs = kernels.configs
    qtype = TYPES_BY_NAME[name]
    n, k = 37, 2 * qtype.block_size
    qtype, planes = make_planes(name, (n, k), rng)
    dense = dequantize_planes(planes, qtype)
    monkeypatch.setattr(kernels.dispatch, "matmul_path", lambda type_name, m: "gemm")
    # every swapped tile, also those the installed Triton is not given (configs.SWAP_AB_FROM_TRITON:
    # they spill with Triton 3.6, which computes them right all the same)
    monkeypatch.setattr(configs, "TRITON", (99, 0))
    x = torch.from_numpy(rng.standard_normal((5, k)).astype(np.float32)) / dense.abs().max()
    for bm in (32, 64, 128):
        for dtype, tol in ((torch.float16, 1e-2), (torch.bfloat16, 2e-2)):
            if (bm == 128 and name in configs.BM128_SPILLS
                    or name in configs.SWAP_AB_BM32_ONLY and bm > 32):
                continue
            assert configs.swap_ab(name, bm, dtype)
            xd = x.to(dtype)
            ref = gemv_x(name, xd) @ dense.T
            got = kernels.matmul(xd, planes, name, (n, k), tile={"BM": bm})
            assert got.dtype == dtype
            assert ((got.float() - ref).abs().max() / ref.abs().max()).item() <= tol, (name, bm, dtype)


@pytest.mark.parametrize("name", ["Q4_0", "Q4_K", "IQ4_XS", "NVFP4"])
def test_matmul_with_split_k_as_on_a_gpu(name, rng, monkeypatch):
    """On a GPU of 132 SMs the GEMV and the GEMM split K over programs that add their partial
    sums atomically (the interpreter's own launches, one "SM", never do): the same product
    within float tolerance, and the configurations do split (in steps of several block
    columns where the blocks are small: configs.gemm_step_blocks)."""
    qtype = TYPES_BY_NAME[name]
    n, k = 37, 16 * qtype.block_size
    qtype, planes = make_planes(name, (n, k), rng)
    dense = dequantize_planes(planes, qtype)
    gpu = kernels.configs.Device(0, 0, 132)  # the interpreter's, with 132 SMs
    monkeypatch.setattr(kernels.dispatch, "_device", lambda device: gpu)
    for m in (1, 16):
        splits = (kernels.configs.gemv_dot_config(name, m, n, 16, gpu, torch.float32) if m == 1
                  else kernels.configs.gemm_config(name, qtype.block_size, m, n, 16, gpu,
                                                   torch.float32))["SPLIT_K"]
        assert splits > 1, (m, splits)
        x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32))
        ref = gemv_x(name, x) @ dense.T
        got = kernels.matmul(x, planes, name, (n, k))
        assert got.dtype == torch.float32
        assert ((got - ref).abs().max() / ref.abs().max()).item() <= 1e-4, (name, m)
        xh = (x / dense.abs().max()).half()
        got_h = kernels.matmul(xh, planes, name, (n, k))
        assert got_h.dtype == torch.float16
        ref_h = gemv_x(name, xh) @ dense.T
        assert ((got_h.float() - ref_h).abs().max() / ref_h.abs().max()).item() <= 1e-2, (name, m)


@pytest.mark.parametrize("name", ["Q4_0", "Q4_K"])
def test_the_gemv_at_the_split_and_rows_the_busiest_sm_takes(name, rng, monkeypatch):
    """Where a short K and few rows or pairs leave a GPU's SMs idle, the GEMV splits K in a
    number of parts that is no power of two (its block columns), and at one row of x takes
    one weight row a thread (configs.gemv_split): on 132 SMs, the dense GEMV at M = 1 and the
    expert GEMV a pair give the product within float tolerance; -1's rows zeros."""
    qtype = TYPES_BY_NAME[name]
    experts, n, k = 4, 256, 3 * qtype.block_size
    qtype, planes = make_planes(name, (experts, n, k), rng)
    dense = dequantize_planes(planes, qtype).reshape(experts, n, k)
    gpu = kernels.configs.Device(0, 0, 132)
    monkeypatch.setattr(kernels.dispatch, "_device", lambda device: gpu)
    ids = torch.tensor([[2, 0], [-1, 3]])
    x = torch.from_numpy(rng.standard_normal((len(ids), k)).astype(np.float32))
    for m in (1, ids.numel()):  # a dense row; the expert pairs
        cfg = kernels.configs.gemv_dot_config(name, m, n, 3, gpu, torch.float32, x_rows=1)
        assert (cfg["BN"], cfg["SPLIT_K"]) == (128, 3), (m, cfg)
    _, weight = make_planes(name, (n, k), rng)
    ref = gemv_x(name, x[:1]) @ dequantize_planes(weight, qtype).T
    got = kernels.matmul(x[:1], weight, name, (n, k))
    assert ((got - ref).abs().max() / ref.abs().max()).item() <= 1e-4, name
    monkeypatch.setitem(kernels.configs.MOE_RULE, name, ((None, "gemv"),))
    ref = torch.einsum("tk,tjnk->tjn", gemv_x(name, x), dense[ids.clamp(min=0)]) * (ids >= 0)[..., None]
    got = kernels.expert_matmul(x, ids, planes, name, (experts, n, k))
    assert ((got - ref).abs().max() / ref.abs().max()).item() <= 1e-4, name
    assert torch.equal(got[ids < 0], torch.zeros(1, n))


SMALL_BLOCK_TYPES = [name for name in KERNEL_TYPES if kernels.FORMATS[name].block_size < 128]


@pytest.mark.parametrize("name", SMALL_BLOCK_TYPES)
def test_k_steps_of_several_blocks_give_the_product(name, rng, monkeypatch):
    """The fused GEMM and the expert tiles take a K step of several block columns where the
    blocks are small (configs.gemm_step_blocks: 128 weights, four 32-weight blocks or two of
    64): two steps of them here (and split K over them, as on a GPU of 132 SMs), float32 and
    float16 x, against plain PyTorch on the torch backend's weights."""
    qtype = TYPES_BY_NAME[name]
    step = 128 // qtype.block_size
    n, k = 19, 2 * 128
    qtype, planes = make_planes(name, (n, k), rng)
    dense = dequantize_planes(planes, qtype)
    m = 16
    gpu = kernels.configs.Device(0, 0, 132)
    for split_k in (1, 2):
        if split_k == 1:  # K whole
            monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
        else:
            monkeypatch.undo()
            monkeypatch.setattr(kernels.dispatch, "_device", lambda _: gpu)
            cfg = kernels.configs.gemm_config(name, qtype.block_size, m, n, k // qtype.block_size, gpu,
                                              torch.float32)
            assert (cfg["STEP_BLOCKS"], cfg["SPLIT_K"]) == (step, 2), cfg
        x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32))
        ref = x @ dense.T
        got = kernels.matmul(x, planes, name, (n, k))
        assert ((got - ref).abs().max() / ref.abs().max()).item() <= 1e-4, (name, split_k)
        xh = (x / dense.abs().max()).half()
        got_h = kernels.matmul(xh, planes, name, (n, k))
        ref_h = xh.float() @ dense.T
        assert ((got_h.float() - ref_h).abs().max() / ref_h.abs().max()).item() <= 1e-2, (name, split_k)
    monkeypatch.setitem(kernels.configs.MOE_RULE, name, ((None, "tiles_bm16"),))  # the tiles
    stacked = {f: torch.stack([p, p.flip(1)]) for f, p in planes.items()}  # expert 1: rows reversed
    by_expert = torch.stack([dense, dense.flip(0)])
    ids = torch.tensor([[1, -1], [0, 1], [-1, 0]])
    assert kernels.configs.moe_config(name, qtype.block_size, 2.0, gpu, torch.float32,
                                      k // qtype.block_size)["STEP_BLOCKS"] == step
    x = torch.from_numpy(rng.standard_normal((3, k)).astype(np.float32))
    got = kernels.expert_matmul(x, ids, stacked, name, (2, n, k))
    ref = torch.einsum("tk,tjnk->tjn", x, by_expert[ids.clamp(min=0)]) * (ids >= 0)[..., None]
    assert ((got - ref).abs().max() / ref.abs().max()).item() <= 1e-4, name


def test_the_fused_gemms_workspace_is_left_zeroed_for_the_next_product(rng, monkeypatch):
    """The fused GEMM's split-K workspace is kept (one a stream, dispatch.py) and never
    zeroed by a launch of its own: each product's last programs leave it zeroed (split_k.py's
    CLEAN). Products of two weights and three batch sizes in turn, as on a GPU of 132 SMs,
    each equal to its reference every time, and the workspace all zero after each."""
    gpu = kernels.configs.Device(0, 0, 132)
    monkeypatch.setattr(kernels.dispatch, "_device", lambda _: gpu)
    monkeypatch.setattr(kernels.dispatch, "_CLEAN_WORKSPACES", {})
    weights = []
    for name, shape in (("Q4_0", (37, 512)), ("Q4_K", (21, 1024))):
        qtype, planes = make_planes(name, shape, rng)
        weights.append((name, shape, planes, dequantize_planes(planes, qtype)))
    for _ in range(2):
        for name, (n, k), planes, dense in weights:
            block = kernels.FORMATS[name].block_size
            for m in (9, 16, 30):
                assert kernels.dispatch.matmul_path(name, m) == "gemm"
                cfg = kernels.configs.gemm_config(name, block, m, n, k // block, gpu, torch.float16)
                assert cfg["SPLIT_K"] > 1, cfg
                x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32))
                x = (x / dense.abs().max()).half()
                got = kernels.matmul(x, planes, name, (n, k))
                ref = x.float() @ dense.T
                assert ((got.float() - ref).abs().max() / ref.abs().max()).item() <= 1e-2, (name, m)
                (workspace,) = kernels.dispatch._CLEAN_WORKSPACES.values()
                assert not workspace.any(), (name, m)


@pytest.mark.parametrize("name", ["Q5_0", "Q4_K"])
def test_expert_tiles_split_k_where_a_few_tokens_leave_sms_idle(name, rng, monkeypatch):
    """At a few tokens the expert sort makes too few tiles for a GPU's SMs, and the tiles
    split K as the fused GEMM does (configs.moe_config, for the tiles an average routing
    makes: Qwen3-30B-A3B's gate_up stack at 2 tokens on an H200, some 16 tiles of 12 BN-column
    programs, splits K in 2): as on 132 SMs, 8 experts of which 2 tokens choose 2 each (one
    expert by both, another rank's -1 once), float16 and bfloat16 x, the products of plain
    PyTorch twice in a row, the kept workspace zero after each (split_k.py's CLEAN)."""
    h200 = kernels.configs.KNOWN_DEVICES[90]
    qwen3 = kernels.configs.moe_config(name, kernels.FORMATS[name].block_size, 1.03, h200, torch.float16,
                                       2048 // kernels.FORMATS[name].block_size, n=1536, routing=(2, 8, 128))
    # 12 column programs of BN = 128 a tile; Triton 3.6 and 3.7 give Q4_K's BM = 16 tile BN = 64
    # (configs.GEMM_M16_WIDE_FROM_TRITON): 24 of them, 372 programs, a last wave no fuller split
    assert (qwen3["BM"], qwen3["SPLIT_K"]) == (16, 2 if qwen3["BN"] == 128 else 1), qwen3
    many = kernels.configs.moe_config(name, kernels.FORMATS[name].block_size, 16.0, h200, torch.float16,
                                      2048 // kernels.FORMATS[name].block_size, n=1536, routing=(256, 8, 128))
    assert many["SPLIT_K"] == 1, many  # tiles enough: K whole
    gpu = kernels.configs.Device(0, 0, 132)
    monkeypatch.setattr(kernels.dispatch, "_device", lambda _: gpu)
    monkeypatch.setattr(kernels.dispatch, "_CLEAN_WORKSPACES", {})
    monkeypatch.setitem(kernels.configs.MOE_RULE, name, ((None, "tiles_bm16"),))
    qtype = TYPES_BY_NAME[name]
    experts, n, k = 8, 40, 4 * max(qtype.block_size, 128)
    qtype, planes = make_planes(name, (experts, n, k), rng)
    dense = dequantize_planes(planes, qtype).reshape(experts, n, k)
    block = qtype.block_size
    cfg = kernels.configs.moe_config(name, block, 2.0, gpu, torch.float16, k // block, n=n,
                                     routing=(2, 2, experts))
    assert cfg["SPLIT_K"] == 4, cfg
    ids = torch.tensor([[5, 1], [-1, 5]])
    for dtype, tol in ((torch.float16, 1e-2), (torch.bfloat16, 2e-2)):
        x = (torch.from_numpy(rng.standard_normal((2, k)).astype(np.float32)) / dense.abs().max()).to(dtype)
        ref = torch.einsum("tk,tjnk->tjn", x.float(), dense[ids.clamp(min=0)]) * (ids >= 0)[..., None]
        for _ in range(2):
            got = kernels.expert_matmul(x, ids, planes, name, (experts, n, k))
            assert got.dtype == dtype and torch.equal(got[1, 0].float(), torch.zeros(n)), (name, dtype)
            assert ((got.float() - ref).abs().max() / ref.abs().max()).item() <= tol, (name, dtype)
            (workspace,) = kernels.dispatch._CLEAN_WORKSPACES.values()
            assert not workspace.any(), (name, dtype)


def _uninitialized_empty(real_empty):
    """torch.empty as a GPU may hand memory over: NaN in every float, a non-zero pattern in
    every integer; what a kernel leaves unwritten shows."""
    def empty(*size, dtype=None, **kwargs):
        t = real_empty(*size, dtype=dtype, **kwargs)
        return t.fill_(float("nan") if t.is_floating_point() else 77)
    return empty


@pytest.mark.parametrize("name", ["Q4_0", "Q4_K", "Q2_K"])  # 32- and 256-weight blocks, int8 x
def test_split_k_writes_every_output_element_itself(name, rng, monkeypatch):
    """Split K finished in the kernel (split_k.py), as on a GPU of 132 SMs, with every
    torch.empty of the launchers NaN (or 77 for the counters): x's preparation zeroes the
    workspace, the last program of each tile writes it out in x's dtype, the expert GEMV
    writes zeros for another rank's expert (-1) itself. The dense GEMV at M = 1 and 3, the
    fused GEMM at M = 16 (BM = 16, and the swapped BM = 32 and 64), the expert GEMV and the
    expert tiles, split too (their sort's slots, -1 for padding, and each tile's expert: all
    from the sort kernel). Four K steps of the GEMM
    (configs.gemm_step_blocks: four 32-weight blocks a step)."""
    qtype = TYPES_BY_NAME[name]
    n, k = 37, 4 * max(qtype.block_size, 128)
    qtype, planes = make_planes(name, (n, k), rng)
    dense = dequantize_planes(planes, qtype)
    gpu = kernels.configs.Device(0, 0, 132)
    monkeypatch.setattr(kernels.dispatch, "_device", lambda device: gpu)
    monkeypatch.setattr(torch, "empty", _uninitialized_empty(torch.empty))
    for m, tile in ((1, None), (3, None), (16, None), (16, {"BM": 32}), (16, {"BM": 64})):
        x = (torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32)) / dense.abs().max()).half()
        got = kernels.matmul(x, planes, name, (n, k), tile=tile)
        ref = gemv_x(name, x) if m < 16 else x.float()
        ref = ref @ dense.T
        assert got.dtype == torch.float16 and not got.isnan().any(), (name, m, tile)
        assert ((got.float() - ref).abs().max() / ref.abs().max()).item() <= 1e-2, (name, m, tile)
        if tile is not None:  # the swapped tiles (the weight as the MMA's A), split too
            assert kernels.configs.swap_ab(name, tile["BM"], torch.float16)
            assert kernels.configs.gemm_config(name, qtype.block_size, m, n, k // qtype.block_size, gpu,
                                               torch.float16, tile)["SPLIT_K"] > 1
    stacked = {f: torch.stack([p, p.flip(1)]) for f, p in planes.items()}  # expert 1: rows reversed
    by_expert = torch.stack([dense, dense.flip(0)])
    ids = torch.tensor([[1, -1], [0, 1], [-1, 0]])
    x = (torch.from_numpy(rng.standard_normal((3, k)).astype(np.float32)) / dense.abs().max()).half()
    for path in ("gemv", "tiles"):  # the tiles' slots and experts, from the sort kernel
        choice = "gemv" if path == "gemv" else "tiles_bm16"
        monkeypatch.setitem(kernels.configs.MOE_RULE, name, ((None, choice),))
        assert kernels.dispatch.expert_path(name, 3, 2, 2) == path
        if path == "tiles":  # split too: two tiles for 132 SMs
            assert kernels.configs.moe_config(name, qtype.block_size, 3.0, gpu, torch.float16,
                                              k // qtype.block_size, n=n, routing=(3, 2, 2))["SPLIT_K"] > 1
        got = kernels.expert_matmul(x, ids, stacked, name, (2, n, k))
        rows = gemv_x(name, x) if path == "gemv" else x.float()
        ref = torch.einsum("tk,tjnk->tjn", rows, by_expert[ids.clamp(min=0)]) * (ids >= 0)[..., None]
        assert not got.isnan().any(), path
        assert torch.equal(got[ids < 0], torch.zeros(2, n, dtype=torch.float16)), path
        assert ((got.float() - ref).abs().max() / ref.abs().max()).item() <= 1e-2, (name, path)


def test_under_expert_parallelism_the_path_follows_the_models_expert_count(rng, monkeypatch):
    """A rank's stack of 2 of the model's 256 experts (the others' ids -1), 4 tokens of 2
    slots: an expert the model routes to gets 8 / 7.9 = 1.01 rows on average, which Q4_0's
    rule gives the GEMV; counted by the stack alone (every slot local) it would be 4 rows,
    tiles. Both products are right; `routed_experts` fewer than the stack holds is refused."""
    name, n, k = "Q4_0", 37, 256
    assert kernels.configs.moe_choice(name, kernels.configs.routed_rows_per_expert(4, 2, 256)) == "gemv"
    assert kernels.configs.moe_choice(name, kernels.configs.routed_rows_per_expert(4, 2, 2)) != "gemv"
    qtype, planes = make_planes(name, (2, n, k), rng)
    by_expert = dequantize_planes(planes, qtype).reshape(2, n, k)
    ids = torch.tensor([[1, -1], [-1, -1], [0, -1], [-1, 0]])
    x = (torch.from_numpy(rng.standard_normal((4, k)).astype(np.float32)) / by_expert.abs().max()).half()
    taken = []
    launch = kernels.dispatch._expert_kernels
    monkeypatch.setattr(kernels.dispatch, "_expert_kernels", lambda *a: taken.append(a[6]) or launch(*a))
    for routed, path in ((256, "gemv"), (None, "tiles")):
        got = kernels.expert_matmul(x, ids, planes, name, (2, n, k), routed_experts=routed)
        assert taken.pop() == path
        rows = torch.from_numpy(as_q8_0(x.float().numpy())) if path == "gemv" else x.float()  # int8 x
        ref = torch.einsum("tk,tjnk->tjn", rows, by_expert[ids.clamp(min=0)]) * (ids >= 0)[..., None]
        assert torch.equal(got[ids < 0], torch.zeros(int((ids < 0).sum()), n, dtype=torch.float16))
        assert ((got.float() - ref).abs().max() / ref.abs().max()).item() <= 1e-2, path
    with pytest.raises(ValueError, match="routed_experts 1 is fewer than the stack's 2"):
        kernels.expert_matmul(x, ids, planes, name, (2, n, k), routed_experts=1)
    stack = QTensor(name, (2, n, k), planes)
    with pytest.raises(RepackError, match="routed_experts 1 is fewer"):
        stack.expert_matmul(x, ids, backend="triton", routed_experts=1)


@pytest.mark.parametrize("name", KERNEL_TYPES)
def test_matmul_from_the_threshold_on_dequantizes_then_multiplies(name, rng, monkeypatch):
    """At M >= configs.dequantize_matmul_min_m(block size) the weight is dequantized into x's dtype and
    multiplied by torch: the very product of the torch backend's weight, bit for bit."""
    qtype = TYPES_BY_NAME[name]
    n, k = 37, 2 * qtype.block_size
    qtype, planes = make_planes(name, (n, k), rng)
    dense = dequantize_planes(planes, qtype)
    # the default rule's thresholds, and the estimate's rule of the type, moved to M = 12
    monkeypatch.setattr(kernels.configs, "dequantize_matmul_min_m", lambda block_size: 12)
    monkeypatch.setitem(kernels.configs.MATMUL_RULE, name,
                        ((8, "gemv"), (11, "gemm_bm16"), (None, "dequantize+matmul")))
    paths = [kernels.dispatch.matmul_path(name, m) for m in (1, 8, 9, 11, 12, 300)]
    assert paths == ["gemv", "gemv", "gemm", "gemm", "dequantize+matmul", "dequantize+matmul"]
    x = torch.from_numpy(rng.standard_normal((2, 6, k)).astype(np.float32))
    assert torch.equal(kernels.matmul(x, planes, name, (n, k)), x @ dense.T)
    xh = (x / dense.abs().max()).half()
    assert torch.equal(kernels.matmul(xh, planes, name, (n, k)), xh @ dense.half().T)


@pytest.mark.parametrize("name", KERNEL_TYPES)
def test_matmul_of_an_empty_batch(name, rng):
    qtype = TYPES_BY_NAME[name]
    n, k = 5, 2 * qtype.block_size
    _, planes = make_planes(name, (n, k), rng)
    for x in (torch.empty(0, k), torch.empty(2, 0, k, dtype=torch.float16)):
        got = kernels.matmul(x, planes, name, (n, k))
        assert got.shape == (*x.shape[:-1], n) and got.dtype == x.dtype


@pytest.mark.parametrize("name", ["Q4_0", "Q4_K"])
def test_products_over_no_columns_are_zeros(name, rng):
    """K = 0: a sum of nothing, dense and by expert, with no kernel launched (the tiles' K loops
    are promised at least one step: gemm.py's MMA_PIPELINED)."""
    n = 5
    _, planes = make_planes(name, (n, 0), rng)
    for x in (torch.empty(3, 0), torch.empty(2, 4, 0, dtype=torch.float16)):
        got = kernels.matmul(x, planes, name, (n, 0))
        assert got.shape == (*x.shape[:-1], n) and got.dtype == x.dtype and not got.any()
    _, experts = make_planes(name, (2, n, 0), rng)
    ids = torch.tensor([[0, 1], [1, -1], [0, 0]])
    got = kernels.expert_matmul(torch.empty(3, 0, dtype=torch.float16), ids, experts, name, (2, n, 0))
    assert got.shape == (3, 2, n) and got.dtype == torch.float16 and not got.any()


@pytest.mark.parametrize("name", [n for n in KERNEL_TYPES if len(kernels.FORMATS[n].dot_parts) > 1])
def test_decode_gemv_gives_the_same_product_in_every_partition(name, rng, monkeypatch):
    """A block in 1, 2, 4 ... calls of the type's dot function (configs.GEMV_PARTS), and more
    rows per thread: the same x @ W.T within float tolerance."""
    from gguf_repack_kernels import configs

    qtype = TYPES_BY_NAME[name]
    n, k = 11, 3 * qtype.block_size  # rows: not a multiple of the 8 a program takes
    qtype, planes = make_planes(name, (n, k), rng)
    x = torch.from_numpy(rng.standard_normal((1, k)).astype(np.float32))
    ref = gemv_x(name, x) @ dequantize_planes(planes, qtype).T
    for parts in kernels.FORMATS[name].dot_parts:
        for rows in (1, 8):
            monkeypatch.setitem(configs.GEMV_PARTS, name, parts)
            monkeypatch.setitem(configs.GEMV_ROWS, name, rows)
            got = kernels.matmul(x, planes, name, (n, k))
            assert ((got - ref).abs().max() / ref.abs().max()).item() <= 1e-5, (parts, rows)


@pytest.mark.parametrize("name", ["Q4_0", "Q4_K", "Q2_K"])  # a legacy, a K-quant, an int8-x type
def test_the_k_whole_gemv_tiles_give_the_product_in_xs_dtype(name, rng):
    """The tuner's GEMV candidates with SPLIT_K 1 (configs.GEMV_CANDIDATES: two launches, no
    atomics) launch K whole and give x @ W.T in x's dtype, written by the GEMV itself."""
    from gguf_repack_kernels import configs

    qtype = TYPES_BY_NAME[name]
    n, k = 11, 3 * qtype.block_size
    qtype, planes = make_planes(name, (n, k), rng)
    dense = dequantize_planes(planes, qtype)
    x = (torch.from_numpy(rng.standard_normal((1, k)).astype(np.float32)) / dense.abs().max()).half()
    ref = gemv_x(name, x) @ dense.T
    tiles = [t for t in configs.GEMV_CANDIDATES
             if t.get("SPLIT_K") == 1 and t["PARTS"] in kernels.FORMATS[name].dot_parts]
    assert tiles
    for tile in tiles:
        cfg = configs.gemv_dot_config(name, 1, 4096, 4096 // qtype.block_size,
                                      configs.KNOWN_DEVICES[90], torch.float16, tile)
        assert cfg["SPLIT_K"] == 1, cfg
        got = kernels.matmul(x, planes, name, (n, k), tile=tile)
        assert got.dtype == torch.float16
        assert ((got.float() - ref).abs().max() / ref.abs().max()).item() <= 1e-2, tile


@pytest.mark.parametrize("name", ["Q4_K", "Q8_0"])
def test_the_gemv_tiles_with_more_programs_an_sm_split_k_further(name, rng):
    """The tuner's GEMV candidates with PROGRAMS_PER_SM (configs.GEMV_CANDIDATES) split K
    until that many programs an SM: at 4096 x 4096, M = 1, 2x or 4x the default's split,
    never past one (block column, part) pair a program; and they give the product."""
    from gguf_repack_kernels import configs

    qtype = TYPES_BY_NAME[name]
    h200, blocks = configs.KNOWN_DEVICES[90], 4096 // qtype.block_size
    tiles = [t for t in configs.GEMV_CANDIDATES if "PROGRAMS_PER_SM" in t
             and t["PARTS"] in kernels.FORMATS[name].dot_parts]
    assert {t["PROGRAMS_PER_SM"] for t in tiles} == {4, 8}
    n, k = 11, 3 * qtype.block_size
    qtype, planes = make_planes(name, (n, k), rng)
    dense = dequantize_planes(planes, qtype)
    x = (torch.from_numpy(rng.standard_normal((1, k)).astype(np.float32)) / dense.abs().max()).half()
    ref = gemv_x(name, x) @ dense.T
    for tile in tiles:
        default = configs.gemv_dot_config(name, 1, 4096, blocks, h200, torch.float16,
                                          {**tile, "PROGRAMS_PER_SM": 2})
        cfg = configs.gemv_dot_config(name, 1, 4096, blocks, h200, torch.float16, tile)
        programs = 4096 // cfg["BN"] * cfg["SPLIT_K"]
        assert cfg["SPLIT_K"] == blocks * tile["PARTS"] or programs >= tile["PROGRAMS_PER_SM"] * h200.sms
        assert cfg["SPLIT_K"] in (default["SPLIT_K"] * tile["PROGRAMS_PER_SM"] // 2,
                                  blocks * tile["PARTS"]), (tile, cfg, default)
        got = kernels.matmul(x, planes, name, (n, k), tile=tile)
        assert got.dtype == torch.float16
        assert ((got.float() - ref).abs().max() / ref.abs().max()).item() <= 1e-2, tile


@pytest.mark.parametrize("name", ["Q4_0", "Q4_K"])
def test_the_gemm_tiles_with_more_programs_an_sm_split_k_further(name, rng):
    """The tuner's fused-GEMM candidates with PROGRAMS_PER_SM (configs.GEMM_CANDIDATES) split
    K until that many programs an SM at 4096 x 4096 on an H200 (where the block columns
    allow), 4 pipeline stages where they say; and they give the product."""
    from gguf_repack_kernels import configs

    qtype = TYPES_BY_NAME[name]
    h200, blocks = configs.KNOWN_DEVICES[90], 4096 // qtype.block_size
    n, k = 11, 4 * qtype.block_size
    qtype, planes = make_planes(name, (n, k), rng)
    dense = dequantize_planes(planes, qtype)
    x = (torch.from_numpy(rng.standard_normal((16, k)).astype(np.float32)) / dense.abs().max()).half()
    ref = x.float() @ dense.T
    for bm in (16, 32, 64):
        tiles = [t for t in configs.GEMM_CANDIDATES[bm] if "PROGRAMS_PER_SM" in t]
        assert {(t["PROGRAMS_PER_SM"], t["num_stages"]) for t in tiles} == {(2, 4), (4, 2), (8, 4)}
        default = configs.gemm_config(name, qtype.block_size, bm, 4096, blocks, h200, torch.float16, bm=bm)
        for tile in tiles:
            cfg = configs.gemm_config(name, qtype.block_size, bm, 4096, blocks, h200, torch.float16,
                                      tile, bm=bm)
            assert "PROGRAMS_PER_SM" not in cfg and cfg["num_stages"] == tile["num_stages"]
            assert cfg["BN"] == default["BN"]
            more = tile["PROGRAMS_PER_SM"] // 2  # the split, doubled as far as the block columns go
            steps = blocks // default["STEP_BLOCKS"]
            assert cfg["SPLIT_K"] == min(default["SPLIT_K"] * more, steps), (bm, tile, cfg, default)
            got = kernels.matmul(x, planes, name, (n, k), tile={**tile, "BM": bm})
            assert ((got.float() - ref).abs().max() / ref.abs().max()).item() <= 1e-2, (bm, tile)


def test_the_gemm_tiles_of_other_k_steps_give_the_product(rng):
    """The tuner's fused-GEMM candidates with another K step (configs.GEMM_CANDIDATES'
    STEP_BLOCKS: one block, the tiles before the 128-weight step, and eight) launch that
    step where it divides the block columns, a smaller power of two where not; the product
    either way."""
    from gguf_repack_kernels import configs

    name = "Q4_0"
    h200 = configs.KNOWN_DEVICES[90]
    for bm in (16, 32, 64):
        assert {t["STEP_BLOCKS"] for t in configs.GEMM_CANDIDATES[bm] if "STEP_BLOCKS" in t} == {1, 8}
        assert configs.gemm_config(name, 32, bm, 4096, 128, h200, "fp16", bm=bm)["STEP_BLOCKS"] == 4
    n, k = 11, 12 * 32  # 12 blocks: a step of 8 does not divide them, 4 does
    qtype, planes = make_planes(name, (n, k), rng)
    dense = dequantize_planes(planes, qtype)
    x = (torch.from_numpy(rng.standard_normal((16, k)).astype(np.float32)) / dense.abs().max()).half()
    ref = x.float() @ dense.T
    for tile, step in (({"STEP_BLOCKS": 1}, 1), ({"STEP_BLOCKS": 8}, 4)):
        for bm in (16, 32):
            assert configs.gemm_config(name, 32, 16, n, 12, h200, "fp16", tile, bm=bm)["STEP_BLOCKS"] == step
            got = kernels.matmul(x, planes, name, (n, k), tile={**tile, "BM": bm})
            assert ((got.float() - ref).abs().max() / ref.abs().max()).item() <= 1e-2, (bm, tile)


@pytest.mark.parametrize("name", ["Q4_0", "Q8_0", "IQ4_NL"])
def test_the_pipelined_gemv_tiles_give_the_product(name, rng):
    """The tuner's GEMV candidates with STAGES (gemv.gemv_dot_row's K loop as a counted range
    for Triton's pipeliner; configs.GEMV_CANDIDATES, offered for 32-weight blocks) take the
    same (block column, part) pairs: the product, with K split as on a GPU and whole."""
    from gguf_repack_kernels import configs

    qtype = TYPES_BY_NAME[name]
    n, k = 11, 5 * qtype.block_size
    qtype, planes = make_planes(name, (n, k), rng)
    dense = dequantize_planes(planes, qtype)
    x = torch.from_numpy(rng.standard_normal((1, k)).astype(np.float32))
    assert kernels.dispatch.matmul_path(name, 1) == "gemv"
    ref = gemv_x(name, x) @ dense.T
    tiles = [t for t in configs.GEMV_CANDIDATES if t.get("STAGES", 1) > 1]
    assert {t["STAGES"] for t in tiles} == {2, 3}
    for tile in tiles:
        for split in (1, 2, 4):
            got = kernels.matmul(x, planes, name, (n, k), tile={**tile, "SPLIT_K": split})
            assert ((got - ref).abs().max() / ref.abs().max()).item() <= 1e-4, (tile, split)


@pytest.mark.parametrize("block", [32, 256])
def test_decode_int8_x_is_gguf_pys_q8_0(block, rng):
    """The int8 GEMV's x: per 32 values, the int8 values and the scale (as float16) that
    gguf-py's Q8_0 makes, bit for bit, in each block's XSTRIDE bytes; and the sums of 16."""
    from gguf_repack_kernels.gemv import prepare_x_q8_kernel

    m, k = 3, 2048 + 2 * block  # more than one program of 1024 values, a partial last one
    x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32))
    x[0, :32] = 0  # an all-zero 32: scale 0
    x[1, 40] = 127 * 0.5 / 3  # halves: rounded away from zero
    x[1, 32:40] = 0.5 / 3
    stride = block + block // 8
    xq = torch.empty(m, k // block, stride, dtype=torch.int8)
    xs = torch.empty(m, k // 16)
    prepare_x_q8_kernel[(m, -(-k // 1024))](x, xq, xs, k, x.stride(0), xs, 0, xs, 0, 0, xs, BLOCK=block,
                                             XSTRIDE=stride, BK=1024)
    q8 = gguf.GGMLQuantizationType.Q8_0
    ref = gguf.quants.quantize(x.numpy(), q8).reshape(m, k // 32, 34)
    ref_d = ref[..., :2].copy().view(np.float16).astype(np.float32).reshape(m, k // block, -1)
    ref_q = ref[..., 2:].view(np.int8).reshape(m, k // block, block)
    assert np.array_equal(xq[..., :block].numpy(), ref_q)
    assert np.array_equal(xq[..., block:].contiguous().view(torch.float32).numpy(), ref_d)
    assert torch.equal(xs, torch.from_numpy(as_q8_0(x.numpy())).reshape(m, k // 16, 16).sum(-1))


def test_decode_lookup_tables_are_gguf_pys():
    """The GEMV looks FP4 values and NVFP4's UE4M3 scales up in tables of its own, and the
    fused GEMM NVFP4's scales in float16; they equal gguf-py's decoding. (MXFP4's float16 scale
    pairs: test_gemm_float16_dequant_is_the_weights_rounded_to_float16, over every byte.)"""
    import gguf.quants

    from gguf_repack_kernels.formats_other import e2m1_table, nvfp4_table, ue4m3_halves

    cpu = torch.device("cpu")
    assert e2m1_table(cpu)[:16].tolist() == list(gguf.quants.MXFP4.kvalues)
    assert nvfp4_table(cpu)[:16].tolist() == list(gguf.quants.NVFP4.kvalues)
    every_byte = np.arange(256, dtype=np.uint8)
    assert np.array_equal(ue4m3_halves(), gguf.quants.NVFP4.ue4m3_to_fp32(every_byte).astype(np.float32))
    assert np.array_equal(nvfp4_table(cpu)[16:272].numpy().view(np.float32), ue4m3_halves())
    # the fused GEMM's copy of them in float16 (the low half of a word each), equal to them
    as_f16 = nvfp4_table(cpu)[272:].numpy().astype(np.uint16).view(np.float16)
    assert len(as_f16) == 256 and np.array_equal(as_f16.astype(np.float32), ue4m3_halves())


def test_decode_tq1_0_digit_table_is_gguf_pys():
    """TQ1_0's GEMV looks a byte's 5 digits up (bfloat16 rows of tq1_table); gguf-py decodes
    blocks whose first 32 qs bytes are every byte value (d = 1) to the same digits."""
    import gguf
    import gguf.quants

    from gguf_repack_kernels.formats_other import tq1_table

    blocks = np.zeros((8, 54), np.uint8)  # qs 48, qh 4, d 2
    blocks[:, :32] = np.arange(256, dtype=np.uint8).reshape(8, 32)
    blocks[:, 52:54] = np.frombuffer(np.float16(1.0).tobytes(), np.uint8)
    weights = gguf.quants.dequantize(blocks.reshape(-1), gguf.GGMLQuantizationType.TQ1_0)
    digits = weights.reshape(8, 256)[:, :160].reshape(8, 5, 32).transpose(0, 2, 1).reshape(256, 5)
    halves = tq1_table(torch.device("cpu")).numpy().astype(np.int32).view(np.uint16).reshape(256, 8)
    as_float = (halves.astype(np.uint32) << 16).view(np.float32)
    assert np.array_equal(as_float[:, :5], digits) and not as_float[:, 5:].any()


@pytest.mark.parametrize("name", ["IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S"])
def test_decode_grid_tables_are_gguf_pys(name):
    """The grid types' GEMV (int8 x) reads the grid as bytes and, but the IQ1 types', each
    sign byte (or 7-bit ksigns index) as 8 byte masks; the IQ1 types' GEMV, their rows as
    8 (grid + delta) for each delta, +1/8 then -1/8; decoded here by hand, they are gguf-py's
    grid, signs and delta."""
    import gguf.quants

    from gguf_repack_kernels import formats_iquants as iq

    cls = getattr(gguf.quants, name)
    cls.init_grid()
    grid = cls.grid.reshape(cls.grid_shape)
    words = kernels.FORMATS[name].table(torch.device("cpu")).numpy().astype(np.int32)
    assert kernels.FORMATS[name].x_int8  # the byte grid (after the 128 ksigns words), then masks
    at = 0 if name in ("IQ1_S", "IQ1_M", "IQ2_S", "IQ3_S") else 128
    assert np.array_equal(words[at:].view(np.int8)[:grid.size].reshape(grid.shape), grid)
    if name.startswith("IQ1"):  # (IQ1's grid holds -1, 0, 1 and no signs; a delta +-1/8)
        delta = gguf.quants.IQ1_S.delta
        with_delta = words[iq.IQ1_DELTA_GRID.value:].view(np.int8).reshape(2, *grid.shape)
        assert np.array_equal(with_delta, 8 * np.stack([grid + delta, grid - delta]))
    else:
        sign_bytes = (np.arange(256, dtype=np.uint8) if name in ("IQ2_S", "IQ3_S")
                      else np.frombuffer(gguf.quants.IQ2_XXS.ksigns, dtype=np.uint8))
        masks = words[getattr(iq, f"{name}_SIGN_MASKS").value:].view(np.uint8)[:8 * len(sign_bytes)]
        expected_bits = (sign_bytes[:, None] >> np.arange(8)[None, :]) & 1
        assert np.array_equal(masks.reshape(-1, 8), expected_bits.astype(np.uint8) * 255)


@pytest.mark.parametrize("model_name", ["SmolLM2-135M-Instruct.Q4_1.gguf",
                                        "gemma-3-270m-q4_k_m.gguf"])
def test_real_model_tensors_through_the_triton_backend(model_name, converted):
    """Real data of each quantized type of the real models (up to 96 rows of its smallest
    tensor): the QTensor triton backend (interpreter) equals the torch backend."""
    from gguf_repack import load

    model = load(converted[model_name])
    smallest = {}
    for t in model.manifest["tensors"]:
        if t["layout"] == "rp1" and (t["type"] not in smallest
                                     or t["source"]["nbytes"] < smallest[t["type"]]["source"]["nbytes"]):
            smallest[t["type"]] = t
    assert smallest
    for t in smallest.values():
        w = model[t["name"]]
        assert isinstance(w, QTensor)
        w = w.index_rows(torch.arange(min(96, w.shape[0])))  # the interpreter is slow
        got = w.dequantize(backend="triton")
        assert torch.equal(got.view(torch.int32), w.dequantize(backend="torch").view(torch.int32))
        x = torch.randn(2, w.shape[1])
        ref = w.matmul(x, backend="torch")
        assert ((w.matmul(x, backend="triton") - ref).abs().max() / ref.abs().max()) <= 1e-4


def test_word_nibbles_ptx_pairs_neighbouring_bytes():
    """fields.nibbles_f16's inline PTX (what a GPU runs; the interpreter has a plain-integer
    twin), run by tests/ptx_emulator.py on random words: the PRMT swaps a word's middle bytes
    (so that a 16-bit half holds bytes 0, 1 and the other 2, 3) and the MOV splits a word
    into its float16 halves, the low one first, as the twin does."""
    from ptx_emulator import run

    from gguf_repack_kernels.fields import F16_HALVES_PTX, SWAP_MIDDLE_BYTES_PTX

    words = np.random.default_rng(0).integers(0, 2 ** 32, 4096, dtype=np.uint64).astype(np.uint32)
    b = [(words >> np.uint32(8 * i)) & np.uint32(0xFF) for i in range(4)]
    swapped = run(SWAP_MIDDLE_BYTES_PTX.value, {"$1": words})["$0"]
    assert np.array_equal(swapped, b[0] | b[2] << 8 | b[1] << 16 | b[3] << 24)
    halves = run(F16_HALVES_PTX.value, {"$2": words})
    assert np.array_equal(halves["$0"], words & np.uint32(0xFFFF))
    assert np.array_equal(halves["$1"], words >> np.uint32(16))


def test_the_kwidth_fence_ptx_is_the_identity():
    """gemm.kwidth_fence's inline PTX (the interpreter returns the tile itself), run by
    tests/ptx_emulator.py on random words: each word, two 16-bit weights, unchanged."""
    from ptx_emulator import run

    from gguf_repack_kernels.gemm import KWIDTH_FENCE_PTX

    words = np.random.default_rng(0).integers(0, 2 ** 32, 4096, dtype=np.uint64).astype(np.uint32)
    assert np.array_equal(run(KWIDTH_FENCE_PTX.value, {"$1": words})["$0"], words)


def test_word_bytes_ptx_puts_each_byte_under_float16s_exponent():
    """fields.bytes_f16's inline PTX, run by tests/ptx_emulator.py on random words: two PRMTs
    with 0x64646464 make the halves 0x64XX of bytes 0, 1 and of bytes 2, 3, the lower byte in
    the lower half, so that each half is float16 1024 + its byte, in the bytes' order."""
    from ptx_emulator import run

    from gguf_repack_kernels.fields import BYTES_F16_PTX

    words = np.random.default_rng(0).integers(0, 2 ** 32, 4096, dtype=np.uint64).astype(np.uint32)
    regs = run(BYTES_F16_PTX.value, {"$2": words, "$3": np.full_like(words, 0x64646464)})
    halves = np.stack([regs["$0"] & 0xFFFF, regs["$0"] >> 16, regs["$1"] & 0xFFFF, regs["$1"] >> 16], 1)
    got = halves.astype(np.uint16).view(np.float16).astype(np.float64)
    assert np.array_equal(got, 1024.0 + words.view(np.uint8).reshape(-1, 4))


def test_trit_pair_ptx_reads_each_lanes_leading_base_3_digit():
    """formats_other.trit_pairs' inline PTX (TQ1_0's float16 and bfloat16 tiles), run by
    tests/ptx_emulator.py for every pair of lane bytes y: 1024 + y in each float16 half, one
    HFMA (exact product and sum, one rounding) gives 1026 + floor(3y / 256), ggml's digit
    ((y * 3) >> 8) plus 1026."""
    from ptx_emulator import run

    from gguf_repack_kernels.formats_other import TRIT_PAIR_PTX

    lo, hi = (y.ravel().astype(np.uint32) for y in np.meshgrid(np.arange(256), np.arange(256)))
    words = (0x6400 + lo) | (0x6400 + hi) << np.uint32(16)
    consts = {"$2": np.full_like(words, 0x22002200), "$3": np.full_like(words, 0x63EB63EB)}
    got = run(TRIT_PAIR_PTX.value, {"$1": words, **consts})["$0"]
    for k, y in enumerate((lo, hi)):
        half = ((got >> np.uint32(16 * k)) & np.uint32(0xFFFF)).astype(np.uint16).view(np.float16)
        assert np.array_equal(half.astype(np.float64), 1026.0 + ((y * 3) >> 8))


@pytest.mark.parametrize("name", ["MXFP4", "IQ4_NL"])
def test_nibble_lookup_ptx_gives_each_codes_int8_value_in_order(name):
    """fields.lookup16_nibbles_int8's inline PTX (the int8-x GEMV of MXFP4, IQ4_NL and IQ4_XS),
    run by tests/ptx_emulator.py on random words and every code: each byte's low nibble's
    table value in that byte of the first result, its high nibble's in the second, as signed
    bytes; the tables as gguf-py has them (doubled E2M1 values, IQ4's kvalues). PRMT's sign
    replication (a selector's bit 3) is what the masks keep out."""
    from ptx_emulator import run

    from gguf_repack_kernels.fields import LOOKUP16_NIBBLES_INT8_PTX, int8_words

    values = {"MXFP4": [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12],
              "IQ4_NL": gguf.quants.IQ4_NL.kvalues}[name]
    values = [int(v) for v in values]
    words = np.random.default_rng(0).integers(0, 2 ** 32, 4096, dtype=np.uint64).astype(np.uint32)
    words = np.concatenate([words, np.arange(16, dtype=np.uint32) * np.uint32(0x11111111)])
    table = {f"${3 + i}": np.full_like(words, w & 0xFFFFFFFF) for i, w in enumerate(int8_words(values))}
    regs = run(LOOKUP16_NIBBLES_INT8_PTX.value, {"$2": words, **table})
    lut = np.array(values, np.int64)
    for out, shift in (("$0", 0), ("$1", 4)):
        got = regs[out].view(np.int8).reshape(-1, 4).astype(np.int64)
        codes = (words.view(np.uint8).reshape(-1, 4) >> shift) & 15
        assert np.array_equal(got, lut[codes]), name


def test_byte_lanes_ptx_puts_a_words_byte_pairs_in_16_bit_lanes():
    """formats_other.byte_lanes' inline PTX, run by tests/ptx_emulator.py on random words, as
    its interpreter twin: bytes 0, 1 of each word in the low and high 16-bit lanes of the
    first result, bytes 2, 3 of the second, zeros above each."""
    from ptx_emulator import run

    from gguf_repack_kernels.formats_other import BYTE_LANES_PTX

    words = np.random.default_rng(0).integers(0, 2 ** 32, 4096, dtype=np.uint64).astype(np.uint32)
    b = [(words >> np.uint32(8 * i)) & np.uint32(0xFF) for i in range(4)]
    regs = run(BYTE_LANES_PTX.value, {"$2": words})
    assert np.array_equal(regs["$0"], b[0] | b[1] << np.uint32(16))
    assert np.array_equal(regs["$1"], b[2] | b[3] << np.uint32(16))


@triton.jit
def _nibbles_f16_kernel(W, OUT, R: tl.constexpr, N: tl.constexpr, RUN: tl.constexpr, DT: tl.constexpr,
                        LESS: tl.constexpr):
    w = tl.load(W + tl.arange(0, R)[:, None] * N + tl.arange(0, N)[None, :])
    q = nibbles_f16(w, RUN, 0, DT, LESS)
    tl.store(OUT + tl.arange(0, R)[:, None] * (8 * N) + tl.arange(0, 8 * N)[None, :], q)


@pytest.mark.parametrize("n, run", [(4, 4), (32, 8)])
@pytest.mark.parametrize("dtype, less", [(torch.float16, 0), (torch.float16, 8), (torch.bfloat16, 8)])
def test_nibbles_f16_is_each_nibble_less_less_in_ggml_order(n, run, dtype, less, rng):
    """fields.nibbles_f16 (Q4_0's 16 bytes less 8, Q4_1's, Q4_K's 4 runs of 32), in the
    interpreter: each nibble less LESS, exactly (in float16 the high ones unpacked in place
    under another exponent), per run of bytes every low nibble, then every high one (gguf-py's
    order), against numpy on the bytes."""
    r = 16
    raw = rng.integers(0, 256, (r, 4 * n), dtype=np.uint8)
    runs = raw.reshape(r, n // run, 4 * run)
    expected = np.concatenate([runs & 15, runs >> 4], axis=2).reshape(r, 8 * n) - float(less)
    got = torch.empty(r, 8 * n, dtype=dtype)
    _nibbles_f16_kernel[(1,)](torch.from_numpy(raw.view(np.int32).copy()), got, R=r, N=n, RUN=run,
                              DT=tl.float16 if dtype == torch.float16 else tl.bfloat16, LESS=less)
    assert np.array_equal(got.float().numpy().astype(np.float64), expected)


def test_lookup16_bytes_ptx_gives_the_table_for_every_code_in_every_byte():
    """fields.lookup16_bytes's inline PTX (IQ4_NL's float16 dequant function; the table in
    registers), run by tests/ptx_emulator.py for all 16**4 words of 4 codes, each byte's high
    nibble anything (15 - code): byte k of the result is gguf-py's kvalue of code k, + 128, as
    an unsigned byte. And the two PTX lines that put it under float16's exponent and make the
    per-thread zero (fields.byte_pairs_f16, row_zero)."""
    from ptx_emulator import run

    from gguf_repack_kernels.fields import (
        BYTE_PAIR_F16_PTX,
        LOOKUP16_BYTES_PTX,
        ROW_ZERO_PTX,
        lookup16_words,
    )

    values = [int(v) for v in gguf.quants.IQ4_NL.kvalues]
    codes = np.arange(16 ** 4, dtype=np.uint32)
    c = [(codes >> (4 * k)) & 15 for k in range(4)]
    word = sum((ck | (15 - ck) << 4) << (8 * k) for k, ck in enumerate(c))
    table = {f"${i + 2}": np.full_like(codes, w & 0xFFFFFFFF) for i, w in enumerate(lookup16_words(values))}
    got = run(LOOKUP16_BYTES_PTX.value, {"$1": word, **table})["$0"]
    for k in range(4):
        assert np.array_equal((got >> (8 * k)) & 0xFF, (np.array(values)[c[k]] + 128) & 0xFF), k
    # bytes 2h, 2h + 1 under float16's exponent of 1024: selector 0x4140 + 0x202 h
    rng = np.random.default_rng(0)
    words = rng.integers(0, 2 ** 32, 4096, dtype=np.uint64).astype(np.uint32)
    for h in (0, 1):
        pair = run(BYTE_PAIR_F16_PTX.value, {"$1": words, "$2": np.full_like(words, 0x64646464),
                                             "$3": np.full_like(words, 0x4140 + 0x202 * h)})["$0"]
        halves = pair.view(np.float16).reshape(-1, 2).astype(np.float64)
        assert np.array_equal(halves[:, 0], 1024 + ((words >> (16 * h)) & 0xFF))
        assert np.array_equal(halves[:, 1], 1024 + ((words >> (16 * h + 8)) & 0xFF))
    rows = rng.integers(0, 2 ** 31, 4096, dtype=np.uint64).astype(np.uint32)
    assert not run(ROW_ZERO_PTX.value, {"$1": rows})["$0"].any()


def test_bfloat16_byte_pair_ptx_makes_each_value_times_its_scale():
    """The bfloat16 dequant functions' inline PTX (what a GPU runs; the interpreter computes
    the values instead), run by tests/ptx_emulator.py: bytes under bfloat16's exponent, made
    exact, times a scale, rounded once, against torch's float32 product (exact) rounded to
    bfloat16. fields.BYTE_PAIR_SCALED_BF16_PTX: bytes under 128 (the grid types'), 128 off;
    BYTE_PAIR_SHIFTED_BF16_PTX: IQ1's -1, 0, 1 made 0, 1, 2, then times the scale plus the
    delta times the scale."""
    from ptx_emulator import run

    from gguf_repack_kernels.fields import (
        BYTE_PAIR_SCALED_BF16_PTX,
        BYTE_PAIR_SHIFTED_BF16_PTX,
    )

    rng = np.random.default_rng(0)

    def bf16_word(values):  # bfloat16 values -> their uint32 bits, both halves
        bits = torch.tensor(values, dtype=torch.float32).bfloat16().view(torch.int16).numpy()
        return bits.astype(np.uint32) & 0xFFFF

    def expected(values, scales):  # exact in float32, rounded once
        got = torch.tensor(values, dtype=torch.float32) * torch.tensor(scales, dtype=torch.float32)
        return got.bfloat16().view(torch.int16).numpy().astype(np.uint32) & 0xFFFF

    words = rng.integers(0, 2 ** 32, 1 << 16, dtype=np.uint64).astype(np.uint32)
    scales = torch.from_numpy(rng.standard_normal(1 << 16)).bfloat16().float().numpy()
    s = bf16_word(scales)
    w = words & 0x7F7F7F7F
    for h in (0, 1):
        out = run(BYTE_PAIR_SCALED_BF16_PTX.value, {
            "$1": w, "$2": np.full_like(w, 0x43434343), "$3": np.full_like(w, 0x4140 + 0x202 * h),
            "$4": np.full_like(w, bf16_word([-128.0])[0] * 0x10001), "$5": s * 0x10001})["$0"]
        for k in (0, 1):
            b = ((w >> (16 * h + 8 * k)) & 0xFF).astype(np.int64)
            assert np.array_equal((out >> (16 * k)) & 0xFFFF, expected(b, scales)), (h, k)
    g = rng.integers(-1, 2, (1 << 16, 4))
    w = sum(((g[:, k] + 1) & 0xFF).astype(np.uint32) << (8 * k) for k in range(4))  # 0, 1, 2
    delta = np.where(rng.integers(0, 2, 1 << 16) == 1, -0.125, 0.125)
    for h in (0, 1):
        out = run(BYTE_PAIR_SHIFTED_BF16_PTX.value, {
            "$1": w, "$2": np.full_like(w, 0x43434343), "$3": np.full_like(w, 0x4140 + 0x202 * h),
            "$4": np.full_like(w, bf16_word([-129.0])[0] * 0x10001), "$5": s * 0x10001,
            "$6": bf16_word(delta * scales) * 0x10001})["$0"]
        for k in (0, 1):
            want = expected(g[:, 2 * h + k] + delta, scales)
            assert np.array_equal((out >> (16 * k)) & 0xFFFF, want), (h, k)


@pytest.mark.parametrize("table", ["IQ4_NL kvalues", "E2M1 doubled"])
def test_lookup16_ptx_gives_the_table_for_every_code_in_every_byte(table):
    """fields.lookup16's inline PTX, float32, and lookup16_half's, float16 and bfloat16 (what a
    GPU runs; the interpreter reads the table from memory instead), run by
    tests/ptx_emulator.py for all 16**4 words of 4 codes: each output is the table's value as
    float32 (or float16, bfloat16), bit for bit (+0.0 for
    E2M1's code 8, as gguf-py's table)."""
    from ptx_emulator import run

    from gguf_repack_kernels.fields import lookup16_bf16_words, lookup16_ptx, lookup16_words

    values = (list(gguf.quants.IQ4_NL.kvalues) if table.startswith("IQ4")
              else list(gguf.quants.MXFP4.kvalues))
    codes = np.arange(16 ** 4, dtype=np.uint32)
    c = [(codes >> (4 * k)) & 15 for k in range(4)]
    # the byte's other nibble is not read: the low nibbles are looked up with the high ones
    # in place (any value, here 15 - code), and with high=True the high ones likewise
    for high in (False, True):
        nib = [(ck << 4 | (15 - ck)) if high else (ck | (15 - ck) << 4) for ck in c]
        word = nib[0] | nib[1] << 8 | nib[2] << 16 | nib[3] << 24
        regs = run(lookup16_ptx(values, high=high), {"$4": word})
        expected = np.array(values, np.float32)
        for k in range(4):
            got = regs[f"${k}"]
            assert np.array_equal(got, expected[c[k]].view(np.uint32)), (table, high, k)
        # the float16 variant: codes 0, 1 in $0 and 2, 3 in $1, the first of each in the low
        # half; its table words are operands, 4 registers each (lookup16_half's pack), the
        # first of each read
        words = {f"${3 + 4 * i}": np.full(word.shape, w & 0xFFFFFFFF, np.uint32)
                 for i, w in enumerate(lookup16_words(values))}
        regs = run(lookup16_ptx(values, f16=True, high=high), {"$2": word, **words})
        halves = np.array(values, np.float16).view(np.uint16).astype(np.uint32)
        for k in range(2):
            assert np.array_equal(regs[f"${k}"], halves[c[2 * k]] | halves[c[2 * k + 1]] << 16), \
                (table, high, k)
        # the bfloat16 variant alike (its tables the values' bfloat16 bits, low and high bytes)
        words = {f"${3 + 4 * i}": np.full(word.shape, w & 0xFFFFFFFF, np.uint32)
                 for i, w in enumerate(lookup16_bf16_words(values))}
        regs = run(lookup16_ptx(values, bf16=True, high=high), {"$2": word, **words})
        halves = torch.tensor(values).bfloat16().view(torch.int16).numpy().astype(np.uint32) & 0xFFFF
        for k in range(2):
            assert np.array_equal(regs[f"${k}"], halves[c[2 * k]] | halves[c[2 * k + 1]] << 16), \
                (table, high, k, "bf16")


def test_lookup16_bf16_ptx_gives_each_value_times_its_scale():
    """fields.lookup16_bf16's inline PTX (the kvalues' bfloat16 bits looked up from two tables
    in registers, what IQ4_NL's and IQ4_XS's bfloat16 tiles run), then
    fields.BF16_PAIR_SCALED_PTX (a pair of them, times a bfloat16 scale), run by
    tests/ptx_emulator.py for all 16**4 words of 4 codes (each byte's high nibble some other
    value: not read): kvalue times the scale, exact in float32 and rounded once to bfloat16."""
    from ptx_emulator import run

    from gguf_repack_kernels.fields import BF16_PAIR_SCALED_PTX, LOOKUP16_BF16_PTX, lookup16_bf16_words

    values = list(gguf.quants.IQ4_NL.kvalues)
    tables = [np.full(16 ** 4, w & 0xFFFFFFFF, np.uint32) for w in lookup16_bf16_words(values)]
    codes = np.arange(16 ** 4, dtype=np.uint32)
    c = [(codes >> (4 * k)) & 15 for k in range(4)]
    word = sum((ck | (15 - ck) << 4) << (8 * k) for k, ck in enumerate(c)).astype(np.uint32)
    looked_up = run(LOOKUP16_BF16_PTX.value, {"$2": word, **{f"${3 + i}": t for i, t in enumerate(tables)}})
    rng = np.random.default_rng(0)
    scales = torch.from_numpy(rng.standard_normal(16 ** 4)).bfloat16()
    s = scales.view(torch.int16).numpy().astype(np.uint32) & 0xFFFF
    for h in (0, 1):
        out = run(BF16_PAIR_SCALED_PTX.value, {"$1": looked_up["$0"], "$2": looked_up["$1"],
                                               "$3": np.full_like(word, 0x5140 + 0x2222 * h),
                                               "$4": s * 0x10001})["$0"]
        for k in (0, 1):
            want = (torch.tensor(values, dtype=torch.float32)[torch.from_numpy(c[2 * h + k].astype(np.int64))]
                    * scales.float()).bfloat16().view(torch.int16).numpy().astype(np.uint32) & 0xFFFF
            assert np.array_equal((out >> (16 * k)) & 0xFFFF, want), (h, k)


@triton.jit
def _dequant_f16_kernel(P0, P1, P2, P3, P4, TABLE, OUT, N, BLOCK: tl.constexpr, BN: tl.constexpr,
                        DQ: tl.constexpr, DT: tl.constexpr):
    rows = tl.arange(0, BN)
    w = DQ(P0, P1, P2, P3, P4, TABLE, tl.program_id(0), rows, rows < N, N, DT)
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(OUT + rows[:, None] * (tl.num_programs(0) * BLOCK) + cols[None, :], w,
             mask=(rows < N)[:, None])


@triton.jit
def _tile_columns_kernel(OUT, BLOCK: tl.constexpr, RUN: tl.constexpr):
    tl.store(OUT + tl.arange(0, BLOCK), tile_columns(BLOCK, RUN))


def tile_order(block: int, run: int) -> list[int]:
    """fields.tile_columns, run in the interpreter: the column of x (within a block) that
    each column of a float16 dequant function's tile multiplies."""
    got = torch.empty(block, dtype=torch.int32)
    _tile_columns_kernel[(1,)](got, BLOCK=block, RUN=run)
    return got.tolist()


def test_the_gemm_reads_x_in_the_nibble_group_order():
    """The GEMM's x columns for the nibble-group order (lookup16_nibbles): each 4 bytes' low
    nibbles, then their high ones, within runs of bytes (IQ4_NL, IQ4_XS: 16; also 8),
    a permutation of the block; in order without."""
    assert tile_order(32, 0) == list(range(32))
    assert tile_order(32, 16) == [0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23,
                                  8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31]
    assert tile_order(64, 8) == [s * 16 + c for s in range(4)
                                 for c in (0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15)]
    assert tile_order(256, 16) == [32 * r + c for r in range(8) for c in tile_order(32, 16)]


@pytest.mark.parametrize("block, runs", [(32, 4), (256, 4)])
def test_the_gemm_reads_x_in_the_fragment_order(block, runs):
    """The fragment order (f16_nibble_run = -1: Q5_0, Q5_1 with 32-weight blocks, Q4_K with
    256): an MMA fragment's thread c (lane % 4) holds k = 2c, 2c + 1, 2c + 8, 2c + 9 of each
    16 (PTX ISA, mma.m16n8k16's A and B fragments, wgmma's A in registers alike). Read
    through tile_columns, every such k is a weight whose nibble lies in the c-th quarter of
    the block's bytes (a qs word of Q5_0, a 32-byte run of Q4_K: byte b holds weights b and
    b + 16 there, 64c + b and 64c + b + 32 here), so that each thread unpacks its own bytes
    only; each register's pair of halves is two adjacent weights (x read 4 bytes at a time);
    a permutation of the block."""
    order = tile_order(block, -1)
    assert sorted(order) == list(range(block))
    quarter = block // 8  # bytes of nibbles a thread owns: 4 of Q5_0's 16, 32 of Q4_K's 128
    half = block // 2 if block == 32 else 32  # a byte's high nibble is this many weights on
    for k, weight in enumerate(order):
        c = (k // 2) % 4
        byte = weight % half + (weight // (2 * half)) * half if block == 256 else weight % half
        assert byte // quarter == c, (k, weight, byte)
    assert all(order[k + 1] == order[k] + 1 for k in range(0, block, 2))


def test_the_gemm_reads_x_in_q2_ks_fragment_order():
    """Q2_K's fragment order (f16_nibble_run = -2): thread c (lane % 4) of an MMA fragment
    holds k = 2c, 2c + 1, 2c + 8, 2c + 9 of each 16; read through tile_columns, each is a
    weight whose 2-bit field lies in qs bytes 16c..16c+15 (weight 128n + 32k + l is in byte
    32n + l), its pairs adjacent weights, a permutation of the block."""
    order = tile_order(256, -2)
    assert sorted(order) == list(range(256))
    for k, weight in enumerate(order):
        assert (32 * (weight // 128) + weight % 32) // 16 == (k // 2) % 4, (k, weight)
    assert all(order[k + 1] == order[k] + 1 for k in range(0, 256, 2))


def test_the_gemm_reads_x_in_tq1_0s_fragment_order():
    """TQ1_0's fragment order (f16_nibble_run = -4, formats_other.tq1_0_half): thread c (lane %
    4) of an MMA fragment holds k = 2c, 2c + 1, 2c + 8, 2c + 9 of each 16; read through
    tile_columns, each is a weight whose base-3 digit lies in a byte thread c owns, as
    ggml's TQ1_0 places them (gguf-py's order: qs bytes 0..31 hold weights 32d + b, digit d,
    bytes 32..47 weights 160 + 16d + b, qh's 4 bytes weights 240 + 4d + b): qs bytes 8c..8c+7
    and 32+4c..35+4c, and digit c of qh's bytes; its pairs adjacent weights, a permutation."""
    order = tile_order(256, -4)
    assert sorted(order) == list(range(256))
    for k, weight in enumerate(order):
        c = (k // 2) % 4
        if weight < 160:
            assert (weight % 32) // 8 == c, (k, weight)
        elif weight < 240:
            assert ((weight - 160) % 16) // 4 == c, (k, weight)
        else:
            assert (weight - 240) // 4 == c, (k, weight)
    assert all(order[k + 1] == order[k] + 1 for k in range(0, 256, 2))


def test_the_gemm_reads_x_in_the_8_weight_rows_fragment_order():
    """The 8-weight rows' fragment order (f16_nibble_run = -3, signed_grid8_f16): thread c
    (lane % 4) of an MMA fragment holds k = 2c, 2c + 1, 2c + 8, 2c + 9 of each 16; read
    through tile_columns, those of each 32 are grid row c of the 32 weights (weights
    8c..8c+7, in order), its pairs adjacent weights, a permutation of the block."""
    order = tile_order(256, -3)
    assert sorted(order) == list(range(256))
    for k, weight in enumerate(order):
        assert weight // 32 == k // 32 and (weight % 32) // 8 == (k // 2) % 4, (k, weight)
    for start in range(0, 256, 32):
        for c in range(4):
            slots = [start + 16 * h + 8 * s + 2 * c + b for h in (0, 1) for s in (0, 1) for b in (0, 1)]
            assert [order[k] for k in slots] == list(range(start + 8 * c, start + 8 * c + 8))


def half_types(act: str) -> set[str]:
    """The types whose half-precision dequant function takes x of `act` (registry.py)."""
    return {n for n in KERNEL_TYPES if kernels.FORMATS[n].half_dequant(act)}


@pytest.mark.parametrize("name, variant, dtype", [
    *[(n, "half", torch.float16) for n in sorted(half_types("fp16"))],
    *[(n, "wide", dtype) for n in KERNEL_TYPES for dtype in (torch.float16, torch.bfloat16)
      if kernels.FORMATS[n].wide_f16 and kernels.FORMATS[n].wide_f16[0] is not kernels.FORMATS[n].dequant],
    *[(n, "narrow", dtype) for n in KERNEL_TYPES for dtype in (torch.float16, torch.bfloat16)
      if kernels.FORMATS[n].narrow_f16],
    *[(n, "half", torch.bfloat16) for n in sorted(half_types("bf16"))]])
def test_gemm_float16_dequant_is_the_weights_rounded_to_float16(name, variant, dtype, rng):
    """The fused GEMM's float16 dequant functions (for float16 x): the float32 weights rounded
    to float16, bit for bit where the weight is a float16 scale times a small integer (Q4_0,
    Q5_0, Q8_0, IQ4_NL, NVFP4, TQ1_0, TQ2_0), or a power of two (MXFP4's E8M0 scales, over the whole byte: far
    outside float16's range, where the weights are 0 or infinite). Where a min is added (Q4_1,
    Q5_1) a GPU fuses d * q + m into one HFMA (one rounding) and the interpreter rounds d * q
    first: within those two roundings, of d * q and of the sum. IQ4_XS, Q6_K and Q3_K round d times
    the sub-block's scale, then the product: within two roundings; Q4_K, Q5_K and Q2_K round
    d * scale and dmin * min, then d * scale * q - dmin * min. A function that keeps its
    nibbles in place returns them in nibble-group order (registry.py): compared in that
    order (fields.tile_columns, held to it by the test above). The same of a type's wide_f16,
    the function its tiles of BM >= 64 take (IQ4_XS), and of its narrow_f16, the BM = 16
    tile's (Q3_K), in both dtypes.

    The bfloat16 functions (for bfloat16 x) likewise, in bfloat16: bit for bit where the
    scale is a power of two or exact in bfloat16 (MXFP4, NVFP4), or times -1, 0 or 1 (TQ1_0,
    TQ2_0: d's rounding is the weight's); where a float16 d is itself rounded to bfloat16 first
    (Q4_0, Q5_0, IQ4_NL; the d * scale of Q6_K, Q3_K, IQ4_XS and the grid types, IQ1_S's and
    IQ1_M's with their deltas), within two roundings; with a min, within a rounding of each
    term and of the result."""
    from gguf_repack_kernels.dispatch import _plane_args

    fmt = kernels.FORMATS[name]
    assert {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL", "IQ4_XS", "NVFP4", "MXFP4", "Q4_K", "Q5_K",
            "Q6_K", "Q2_K", "Q3_K", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M",
            "TQ1_0", "TQ2_0"} == half_types("fp16")
    assert half_types("bf16") == half_types("fp16") - {"Q8_0"}
    qtype = TYPES_BY_NAME[name]
    n, k = 37, 3 * qtype.block_size
    qtype, planes = make_planes(name, (n, k), rng)
    if name == "MXFP4":  # every scale byte, 0..255, the extremes included
        n = 256
        qtype, planes = make_planes(name, (n, k), rng)
        planes["e"][..., 0] = torch.arange(256, dtype=torch.uint8)
    function, run = (fmt.wide_f16 if variant == "wide" else
                     (fmt.narrow_f16 if variant == "narrow" else fmt.dequant_half, fmt.f16_nibble_run))
    order = torch.tensor(tile_order(qtype.block_size, run))
    exact = dequantize_planes(planes, qtype).reshape(n, -1, qtype.block_size)[:, :, order].reshape(n, k)
    expected = exact.to(dtype)
    got = torch.empty(n, k, dtype=dtype)
    with np.errstate(over="ignore"):  # MXFP4's largest scales: infinite weights, as expected
        _dequant_f16_kernel[(k // qtype.block_size,)](*_plane_args(planes, fmt), got, n,
                                                       BLOCK=qtype.block_size, BN=256 if n > 64 else 64,
                                                       DQ=function, DT=getattr(tl, str(dtype)[6:]))
    # float16's least subnormal, and bfloat16's (or a rounding of one at least)
    eps, tiny = (torch.finfo(dtype).eps, 2 ** -24 if dtype == torch.float16 else 2 ** -126)
    if dtype == torch.bfloat16 and name in ("Q4_0", "Q5_0", "Q6_K", "Q3_K", "IQ2_XXS", "IQ2_XS", "IQ2_S",
                                            "IQ3_XXS", "IQ3_S", "IQ4_NL", "IQ4_XS", "IQ1_S", "IQ1_M"):
        # d (or d * scale) rounded to bfloat16, then the product: within two roundings
        assert ((got.float() - exact).abs() <= (eps + eps ** 2) * exact.abs() + tiny).all()
    elif name in ("Q4_0", "Q5_0", "Q8_0", "IQ4_NL", "NVFP4", "MXFP4", "TQ1_0", "TQ2_0"):
        assert torch.equal(got.view(torch.int16), expected.view(torch.int16))
    elif name in ("IQ4_XS", "Q6_K", "Q3_K", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S",
                  "IQ1_M"):
        # d times the sub-block's scale rounded to float16, then its product with q
        assert ((got.float() - exact).abs() <= 2 * eps * exact.abs() + 2 ** -24).all()
    elif name in ("Q4_K", "Q5_K", "Q2_K"):
        # (d * scale) and (dmin * min) rounded to float16 once a sub-block, then one HFMA:
        # within a rounding of each term and one of the result (d * scale * q, from the
        # planes with dmin zeroed; the min's term is what it leaves of the weight)
        no_min = {**planes, "dmin": torch.zeros_like(planes["dmin"])}
        scaled = dequantize_planes(no_min, qtype).reshape(n, -1, qtype.block_size)[:, :, order].reshape(n, k)
        bound = eps * (scaled.abs() + (scaled - exact).abs() + exact.abs()) + tiny
        assert ((got.float() - exact).abs() <= bound).all()
    else:  # Q4_1, Q5_1 (in bfloat16 m is rounded too)
        m = planes["m"].float()[..., 0].T.repeat_interleave(qtype.block_size, dim=1)  # [N, K]
        bound = eps * ((exact - m).abs() + exact.abs() + (dtype == torch.bfloat16) * m.abs()) + tiny
        assert ((got.float() - exact).abs() <= bound).all()


@triton.jit
def _block_scale_kernel(P0, P1, P2, P3, P4, TABLE, OUT, N, BN: tl.constexpr, SCALE: tl.constexpr,
                        DT: tl.constexpr):
    rows = tl.arange(0, BN)
    scale = SCALE(P0, P1, P2, P3, P4, TABLE, tl.program_id(0), rows, rows < N, N, DT)
    tl.store(OUT + rows * tl.num_programs(0) + tl.program_id(0), scale, mask=rows < N)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_block_scale_after_the_mma_gives_the_weights_exactly(dtype, rng):
    """registry.py's scaled_after (TQ1_0 and TQ2_0, the fused GEMM's BM = 16 tile: gemm.py's
    BLOCK_SCALE): the unscaled half-precision function's values times the block's scale, in
    float32 as the tile applies it to the MMA's sum, are the float32 weights bit for bit, in
    the function's order; the unscaled values are digit - 1 (TQ1_0's in bfloat16 times
    2**66)."""
    from gguf_repack_kernels.dispatch import _plane_args

    names = [n for n in KERNEL_TYPES if kernels.FORMATS[n].scaled_after]
    assert names == ["TQ1_0", "TQ2_0"]
    for name in names:
        fmt = kernels.FORMATS[name]
        unscaled, scale_of = fmt.scaled_after
        n, k = 37, 3 * fmt.block_size
        qtype, planes = make_planes(name, (n, k), rng)
        order = torch.tensor(tile_order(qtype.block_size, fmt.f16_nibble_run))
        exact = dequantize_planes(planes, qtype).reshape(n, -1, qtype.block_size)[:, :, order]
        dt = getattr(tl, str(dtype)[6:])
        digits = torch.empty(n, k, dtype=dtype)
        _dequant_f16_kernel[(k // qtype.block_size,)](*_plane_args(planes, fmt), digits, n,
                                                       BLOCK=qtype.block_size, BN=64, DQ=unscaled, DT=dt)
        scale = torch.empty(n, k // qtype.block_size, dtype=torch.float32)
        _block_scale_kernel[(k // qtype.block_size,)](*_plane_args(planes, fmt), scale, n, BN=64,
                                                       SCALE=scale_of, DT=dt)
        digits = digits.float().reshape(n, -1, qtype.block_size)
        unit = 2.0 ** 66 if dtype == torch.bfloat16 and name == "TQ1_0" else 1.0
        # (TQ2_0's code 3, which llama.cpp never writes, is 2 as in the torch backend)
        allowed = {-1.0, 0.0, 1.0} | ({2.0} if name == "TQ2_0" else set())
        assert {-1.0, 0.0, 1.0} <= set((digits / unit).unique().tolist()) <= allowed, name
        assert torch.equal(digits * scale[..., None], exact), (name, dtype)


# The GEMV path runs a program per (token, slot) pair (minutes for every type in the
# interpreter): it is the dense GEMV's body (every type's dot function is tested there) with an
# expert's offset, taken here for a type of each block size and dot-function kind (float x,
# int8 x, a table); the tiles path, every type's dequant function, for all.
EXPERT_GEMV_TYPES = {"Q4_0", "Q8_0", "MXFP4", "Q4_K", "Q2_K"}


@pytest.mark.parametrize("name, path", [(name, path) for name in KERNEL_TYPES
                                        for path in ("gemv", "tiles", "dequantize")
                                        if path == "tiles" or name in EXPERT_GEMV_TYPES])
def test_expert_matmul_is_each_tokens_product_with_its_experts(name, path, rng, monkeypatch):
    """The expert products (a GEMV per pair at a few rows an expert, BM-row tiles of one
    expert each above, one launch for all experts either way; for long runs each chosen
    expert dequantized, then torch.matmul) against plain PyTorch on the torch backend's
    weights: x per token (gate, up) and per slot (down), an expert no token chose, -1
    (another rank's expert) giving zeros; float32, float16 and bfloat16 x."""
    # the path by a rule that names it (configs.MOE_RULE): 1.7 rows an expert here
    monkeypatch.setitem(kernels.configs.MOE_RULE, name, ((None, "gemv" if path == "gemv" else "tiles_bm16"),))
    if path == "dequantize":  # the long-run threshold, down to these few rows and tokens
        monkeypatch.setattr(kernels.configs, "dequantize_matmul_min_m", lambda block_size: 1)
        monkeypatch.setattr(kernels.configs, "MOE_GRAPH_MAX_TOKENS", 0)
        dequantized = []
        real = kernels.dispatch.dequantize
        monkeypatch.setattr(kernels.dispatch, "dequantize",
                            lambda planes, *a: dequantized.append(a) or real(planes, *a))
    qtype = TYPES_BY_NAME[name]
    experts, n, k = 4, 37, qtype.block_size
    qtype, planes = make_planes(name, (experts, n, k), rng)
    dense = dequantize_planes(planes, qtype).reshape(experts, n, k)
    ids = torch.tensor([[2, 0], [3, -1], [0, 2]])  # expert 1: no token; -1: another rank's
    t = len(ids)
    for x in (torch.from_numpy(rng.standard_normal((t, k)).astype(np.float32)),
              torch.from_numpy(rng.standard_normal((t, 2, k)).astype(np.float32))):
        if path == "gemv" and kernels.FORMATS[name].x_int8:  # the GEMV's x (gemv_x)
            x = torch.from_numpy(as_q8_0(x.numpy().reshape(-1, k))).reshape(x.shape)
        rows = x if x.dim() == 3 else x[:, None, :].expand(t, 2, k)
        ref = torch.einsum("tjk,tjnk->tjn", rows, dense[ids.clamp(min=0)]) * (ids >= 0)[..., None]
        got = kernels.expert_matmul(x, ids, planes, name, (experts, n, k))
        assert got.shape == (t, 2, n) and got.dtype == torch.float32
        assert ((got - ref).abs().max() / ref.abs().max()).item() <= 1e-4, name
        assert torch.equal(got[1, 1], torch.zeros(n))
    xh = (x[:, 0] / dense.abs().max()).half()  # float16, one x per token
    got_h = kernels.expert_matmul(xh, ids, planes, name, (experts, n, k))
    rows_h = gemv_x(name, xh) if path == "gemv" else xh.float()
    ref_h = torch.einsum("tk,tjnk->tjn", rows_h, dense[ids.clamp(min=0)]) * (ids >= 0)[..., None]
    assert got_h.dtype == torch.float16
    assert ((got_h.float() - ref_h).abs().max() / ref_h.abs().max()).item() <= 1e-2, name
    xb = (x[:, 0] / dense.abs().max()).bfloat16()  # bfloat16 (interpreter.py), one x per token
    got_b = kernels.expert_matmul(xb, ids, planes, name, (experts, n, k))
    rows_b = gemv_x(name, xb) if path == "gemv" else xb.float()
    ref_b = torch.einsum("tk,tjnk->tjn", rows_b, dense[ids.clamp(min=0)]) * (ids >= 0)[..., None]
    assert got_b.dtype == torch.bfloat16
    assert ((got_b.float() - ref_b).abs().max() / ref_b.abs().max()).item() <= 2e-2, name
    if path == "dequantize":  # experts 0, 2, 3 once per call (4 calls), never expert 1
        assert len(dequantized) == 12
        assert {a[2] for a in dequantized} == {torch.float32, torch.float16, torch.bfloat16}
    empty = kernels.expert_matmul(torch.zeros(0, k), torch.zeros(0, 2, dtype=torch.long), planes, name,
                                  (experts, n, k))
    assert empty.shape == (0, 2, n)


@pytest.mark.parametrize("name", ["Q4_0", "Q4_K", "Q8_0", "IQ4_XS"])
@pytest.mark.parametrize("rows", [32, 64])
def test_swapped_expert_tiles_give_the_products(name, rows, rng, monkeypatch):
    """The expert GEMM's BM = 32 and 64 tiles, which take the weight tile as the MMA's A
    operand for float16 and bfloat16 x (configs.swap_ab), taken by a rule that names them
    (configs.MOE_RULE): the products of plain PyTorch within float tolerance, an
    expert no token chose and another rank's (-1) as in the test above."""
    monkeypatch.setitem(kernels.configs.MOE_RULE, name, ((None, f"tiles_bm{rows}"),))
    qtype = TYPES_BY_NAME[name]
    experts, n, k = 4, 37, qtype.block_size
    qtype, planes = make_planes(name, (experts, n, k), rng)
    dense = dequantize_planes(planes, qtype).reshape(experts, n, k)
    ids = torch.tensor([[2, 0], [3, -1], [0, 2]])
    x = torch.from_numpy(rng.standard_normal((len(ids), k)).astype(np.float32)) / dense.abs().max()
    for dtype, tol in ((torch.float16, 1e-2), (torch.bfloat16, 2e-2)):
        cfg = kernels.configs.moe_config(name, qtype.block_size, rows, kernels.configs.Device(0, 0, 1), dtype)
        assert cfg["BM"] == rows and kernels.configs.swap_ab(name, rows, dtype), cfg
        xd = x.to(dtype)
        ref = torch.einsum("tk,tjnk->tjn", xd.float(), dense[ids.clamp(min=0)]) * (ids >= 0)[..., None]
        got = kernels.expert_matmul(xd, ids, planes, name, (experts, n, k))
        assert got.dtype == dtype and torch.equal(got[1, 1].float(), torch.zeros(n))
        assert ((got.float() - ref).abs().max() / ref.abs().max()).item() <= tol, (name, rows, dtype)


def test_expert_tiles_hold_one_expert_each_and_skip_unchosen_experts():
    """The sort on the device: each expert's pairs padded to whole tiles, every tile one
    expert's, the slots pointing at x's rows and the output's; an expert no pair chose has no
    tile; the pairs of another rank's experts (-1) the tiles of expert E = 4, "none" (written
    as zeros). Sized from the shapes: 6 pairs in tiles of 4 rows take at most
    6 // 4 + min(4 + 1, 6) = 6 tiles; those past the last say -1 (the kernel returns at once)."""
    from gguf_repack_kernels.dispatch import _sorted_by_expert

    ids = torch.tensor([[2, 0], [0, 2], [2, -1]])
    x_rows, out_rows, tile_expert = _sorted_by_expert(ids, 4, 4, x_per_slot=False)
    assert tile_expert.tolist() == [0, 2, 4, -1, -1, -1]  # experts 1 and 3: no tile
    unused = [-1] * 12
    # pairs (t, j) as t * 2 + j
    assert out_rows.tolist() == [1, 2, -1, -1, 0, 3, 4, -1, 5, -1, -1, -1] + unused
    assert x_rows.tolist() == [0, 1, -1, -1, 0, 1, 2, -1, 2, -1, -1, -1] + unused  # their tokens
    assert _sorted_by_expert(ids, 4, 4, x_per_slot=True)[0].tolist() == \
        [1, 2, -1, -1, 0, 3, 4, -1, 5, -1, -1, -1] + unused
    # every pair another rank's: one tile of "none"
    x_rows, out_rows, tile_expert = _sorted_by_expert(torch.full((2, 2), -1), 4, 4, x_per_slot=False)
    assert tile_expert.tolist() == [4, -1, -1, -1, -1] and out_rows[:4].tolist() == [0, 1, 2, 3]
    assert set(x_rows[4:].tolist()) == set(out_rows[4:].tolist()) == {-1}


def test_the_interpreter_computes_bfloat16_as_a_gpu():
    """gguf_repack_kernels/interpreter.py: under the interpreter a bfloat16 dot multiplies values (not
    their uint16 bits), float32, float16 and integers -> bfloat16 round to nearest even, and
    bfloat16 arithmetic is on the values, each result rounded, subnormals kept, as a GPU and
    torch do."""
    from gguf_repack_kernels.interpreter import bfloat16_bits

    @triton.jit
    def dot_kernel(X, W, OUT, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
        m, n, k = tl.arange(0, BM), tl.arange(0, BN), tl.arange(0, BK)
        x = tl.load(X + m[:, None] * BK + k[None, :])
        w = tl.load(W + n[:, None] * BK + k[None, :])  # float32, rounded to x's bfloat16
        acc = tl.dot(x, tl.trans(w).to(x.dtype), tl.zeros((BM, BN), dtype=tl.float32))
        tl.store(OUT + m[:, None] * BN + n[None, :], acc.to(OUT.dtype.element_ty))

    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(16, 32, generator=g).bfloat16(), torch.randn(16, 32, generator=g)
    out = torch.empty(16, 16, dtype=torch.bfloat16)
    dot_kernel[(1,)](x, w, out, 16, 16, 32)
    assert torch.equal(out, (x.float() @ w.bfloat16().float().T).bfloat16())
    values = torch.randn(1 << 16, generator=g) * torch.logspace(-40, 38, 1 << 16)
    values[:3] = torch.tensor([float("inf"), -float("inf"), 0.0])
    torch_bits = values.bfloat16().view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(bfloat16_bits(values.numpy()), torch_bits)

    @triton.jit
    def arithmetic_kernel(A, B, H, OUT):
        i = tl.arange(0, 64)
        a, b = tl.load(A + i), tl.load(B + i)
        tl.store(OUT + i, a * b)
        tl.store(OUT + 64 + i, a - b)
        tl.store(OUT + 128 + i, -a / b)
        tl.store(OUT + 192 + i, (i - 32).to(tl.bfloat16))
        tl.store(OUT + 256 + i, tl.load(H + i).to(tl.bfloat16))
        tl.store(OUT + 320 + i, tl.where(a < b, a, b))

    a, b = torch.randn(64, generator=g).bfloat16(), torch.randn(64, generator=g).bfloat16()
    a[:4] = torch.tensor([2.0 ** -130, -(2.0 ** -127), 2.0 ** -133, 1.0])  # subnormals
    b[:4] = torch.tensor([2.0 ** 10, 2.0 ** 127, 1.0, 2.0 ** -100])
    h = torch.randn(64, generator=g).half()
    out = torch.empty(6 * 64, dtype=torch.bfloat16)
    arithmetic_kernel[(1,)](a, b, h, out)
    assert torch.equal(out.view(6, 64), torch.stack([
        a * b, a - b, -a / b, (torch.arange(64) - 32).bfloat16(), h.bfloat16(), torch.minimum(a, b)]))


def test_the_interpreter_patches_the_language_once_a_launch(monkeypatch, rng):
    """gguf_repack_kernels/interpreter.py: the dot and dequant functions a kernel calls (dozens
    a program) run on the launch's patches of triton.language; the interpreter's own device
    call would patch it again at every call (Triton 3.6 to 3.9). Once for the GEMV launch
    here, beside the one for x's preparation; and the product is unchanged. (Triton's own
    jit functions, tl.sum's, see triton.language.core, which the interpreter patches at their
    first call and leaves patched: the first product is not the one counted.)"""
    from triton.runtime import interpreter

    calls = []
    patch = interpreter._patch_lang
    monkeypatch.setattr(interpreter, "_patch_lang", lambda fn: calls.append(fn.__name__) or patch(fn))
    _, planes = make_planes("Q4_K", (8, 256), rng)
    x = torch.from_numpy(rng.standard_normal((1, 256)).astype(np.float32))
    kernels.matmul(x, planes, "Q4_K", (8, 256))
    calls.clear()
    got = kernels.matmul(x, planes, "Q4_K", (8, 256))
    assert calls == ["prepare_x_kernel", "gemv_dot_kernel"]
    dense = dequantize_planes(planes, TYPES_BY_NAME["Q4_K"])
    assert torch.allclose(got, x @ dense.T, rtol=1e-5, atol=1e-5)
