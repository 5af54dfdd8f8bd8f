"""The Triton backend's forward paths as a CUDA graph needs them, checked on CPU under Triton's
interpreter (the code a GPU runs, launch for launch).

vLLM captures decode steps, and batches up to 512 tokens, in CUDA graphs. While capturing,
anything that makes the host wait for the device is an error, and whatever the host decided
from the data (a launch grid, a buffer's size, which path) is frozen as it was for the routing
seen at capture. So around each path (dense matmul at every M, embedding, the expert products
at 1 to 512 tokens) this records every operation that synchronizes on a GPU (the aten ops whose
result size depends on the data, .item() and its kin, boolean-mask indexing) and every kernel
launch (kernel, grid, scalar arguments, tensor shapes); it fails on any synchronization, and on
any launch that differs between two routings of the same shapes."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
import triton.runtime.interpreter as interpreter
from ggml_blocks import random_blocks
from torch.utils._python_dispatch import TorchDispatchMode

import gguf_repack_kernels as kernels
from gguf_repack.errors import RepackError
from gguf_repack.format.layout import pack
from gguf_repack.format.type_table import TYPES_BY_NAME
from gguf_repack.runtime.qtensor import QTensor

# aten ops that read device data on the host (a CUDA sync): results sized by the data, or a
# Python scalar out of a tensor
SYNCING_OPS = {"_local_scalar_dense", "item", "nonzero", "nonzero_numpy", "argwhere", "masked_select",
               "unique_consecutive", "_unique", "_unique2", "unique_dim", "bincount", "histc",
               "histogram", "equal", "is_nonzero", "allclose", "masked_scatter"}
HOST_READS = ("item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__")
# aten ops that do no work on the device: allocations, views, and the interpreter's own
NO_DEVICE_WORK = {"empty", "empty_strided", "new_empty", "view", "_unsafe_view", "slice", "select",
                  "reshape", "as_strided", "alias", "detach", "t", "transpose", "permute", "expand",
                  "unsqueeze", "squeeze", "lift_fresh", "set_"}


def _syncing(func, args, kwargs) -> str | None:
    name = func.overloadpacket.__name__
    if name in SYNCING_OPS:
        return str(func)
    if name == "repeat_interleave" and any(isinstance(a, torch.Tensor) and a.dim() for a in args) \
            and kwargs.get("output_size") is None:
        return f"{func} without output_size"
    if name in ("index", "index_put", "index_put_") and len(args) > 1:
        if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1] if i is not None):
            return f"{func} with a boolean mask"
    return None


class Recorder(TorchDispatchMode):
    """Host synchronizations and kernel launches, outside Triton's own launch machinery (the
    interpreter copies arguments to the host; a GPU launch does not)."""

    def __init__(self):
        super().__init__()
        self.syncs: list[str] = []
        self.launches: list[tuple] = []
        self.device_ops: list[str] = []  # aten ops that run on the device, outside launches
        self.in_launch = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.in_launch:
            why = _syncing(func, args, kwargs)
            if why:
                self.syncs.append(why)
            if func.overloadpacket.__name__ not in NO_DEVICE_WORK:
                self.device_ops.append(func.overloadpacket.__name__)
        return func(*args, **kwargs)


@contextlib.contextmanager
def recording():
    rec = Recorder()
    with pytest.MonkeyPatch.context() as mp:
        for name in HOST_READS:
            real = getattr(torch.Tensor, name)

            def read(self, *a, _real=real, _name=name, **k):
                if not rec.in_launch:
                    rec.syncs.append(f"Tensor.{_name}")
                return _real(self, *a, **k)
            mp.setattr(torch.Tensor, name, read)
        real_call = interpreter.GridExecutor.__call__

        def launch(self, *args, **kwargs):
            for a in (*args, *kwargs.values()):  # a 0-d tensor as a scalar: .item() at launch
                assert not (isinstance(a, torch.Tensor) and a.dim() == 0), f"{self.fn.__name__}: 0-d tensor"
            shapes = tuple(tuple(a.shape) if isinstance(a, torch.Tensor) else a for a in args)
            options = {k: getattr(v, "__name__", v) for k, v in kwargs.items()}
            rec.launches.append((self.fn.__name__, self.grid, shapes, options))
            rec.in_launch += 1
            try:
                return real_call(self, *args, **kwargs)
            finally:
                rec.in_launch -= 1
        mp.setattr(interpreter.GridExecutor, "__call__", launch)
        with rec:
            yield rec


def stack(name: str, shape, seed: int = 0) -> QTensor:
    qtype = TYPES_BY_NAME[name]
    blocks = random_blocks(qtype.id, shape, np.random.default_rng(seed))
    return QTensor(qtype, shape, {k: torch.from_numpy(v) for k, v in pack(blocks, qtype).items()})


def test_the_recorder_catches_each_kind_of_host_sync():
    """The test below can fail: each of these is recorded."""
    t = torch.tensor([3, 0, 2, 2])
    with recording() as rec:
        int(t.max())
        t.tolist()
        t[t > 0]
        torch.unique(t)
        torch.bincount(t)
        torch.repeat_interleave(torch.arange(4), t)
        bool((t > 1).any())
    assert len(rec.syncs) >= 7, rec.syncs
    with recording() as rec:
        torch.repeat_interleave(torch.arange(4), t, output_size=7)
        torch.sort(t, stable=True)
        torch.searchsorted(torch.cumsum(t, 0), torch.arange(4))
        t[torch.tensor([0, 2])]
    assert rec.syncs == []


def _x(tokens, k, seed, per_slot=None):
    g = torch.Generator().manual_seed(seed)
    shape = (tokens, per_slot, k) if per_slot else (tokens, k)
    return torch.randn(shape, generator=g)


def _routings(tokens: int, experts: int, top: int):
    """Two routings of the same shape: random distinct experts per token (with a few of
    another rank's, -1), and all tokens on the same `top` experts (the most skewed)."""
    g = torch.Generator().manual_seed(tokens)
    uniform = torch.stack([torch.randperm(experts, generator=g)[:top] for _ in range(tokens)])
    uniform[::7, -1] = -1
    skewed = torch.arange(top).repeat(tokens, 1)
    return uniform, skewed


# (type, tokens, path, rows of x a GEMV program): MXFP4 at 4 tokens (1.5 rows an expert) takes
# the GEMV on 2 of an expert's rows a program (configs.MOE_RULE)
EXPERT_CASES = [("Q4_K", 1, "gemv", 1), ("Q8_0", 4, "tiles", 1), ("MXFP4", 4, "gemv", 2),
                ("Q4_K", 64, "tiles", 1),
                pytest.param("Q8_0", 256, "tiles", 1, marks=pytest.mark.slow),
                pytest.param("Q4_K", 512, "tiles", 1, marks=pytest.mark.slow)]


@pytest.mark.parametrize("name, tokens, path, x_rows", EXPERT_CASES)
def test_expert_products_never_sync_and_launch_alike_for_every_routing(name, tokens, path, x_rows):
    """At 1, 4, 64, 256 and 512 tokens (the GEMV a pair, on 2 rows of an expert, then tiles by
    configs.MOE_RULE), x per
    token (gate, up) and per slot (down): no host sync; the same launches for two routings
    as different as can be; and each routing's products are the torch backend's (a graph
    captured with one routing is replayed with the other: buffers sized for any)."""
    experts, top, n = 8, 2, 40
    w = stack(name, (experts, n, TYPES_BY_NAME[name].block_size))
    k = w.shape[2]
    launches = []
    for ids in _routings(tokens, experts, top):
        for x in (_x(tokens, k, 1), _x(tokens, k, 2, per_slot=top)):
            w.expert_matmul(x, ids, backend="triton")  # warm: lookup tables made once per device
            with recording() as rec:
                got = w.expert_matmul(x, ids, backend="triton")
            assert rec.syncs == [], (name, tokens, rec.syncs)
            launches.append(rec.launches)
            ref = w.expert_matmul(x, ids, backend="torch")
            assert ((got - ref).abs().max() / ref.abs().max()).item() <= 2e-2, (name, tokens)
    assert launches[0] == launches[2] and launches[1] == launches[3], (name, tokens)
    assert kernels.dispatch.expert_path(name, tokens, top, experts) == path
    rows = kernels.configs.routed_rows_per_expert(tokens, top, experts)
    assert kernels.configs.moe_gemv_x_rows(name, rows) == x_rows


@pytest.mark.parametrize("m", [1, 4, 16, 64, 256])
def test_dense_matmul_and_embedding_never_sync(m):
    """Each path dispatch.matmul_path takes over these M (the GEMV at M = 1, the fused GEMM's
    tiles, dequantize-then-matmul from M = 256 on); the embedding."""
    w = stack("Q4_K", (40, 256))
    x = _x(m, 256, 3)
    ids = torch.arange(m) % 40
    w.matmul(x, backend="triton")
    with recording() as rec:
        w.matmul(x, backend="triton")
        w.embedding(ids, backend="triton")
    assert rec.syncs == [], rec.syncs
    assert len(rec.launches) >= 1


def test_each_product_is_its_kernels_alone(monkeypatch):
    """Split K finished inside the kernel (split_k.py), on a GPU's 132 SMs: the decode GEMV
    is x's preparation (which zeroes the split-K workspace) and the GEMV, the fused GEMM its
    one launch (its workspace, kept a stream, is left zeroed by the launch before: before,
    a zeroing too); the expert GEMV x's preparation (which also checks the ids), an
    assert on its verdict and the GEMV, the router's ids read as they are. Before: four
    launches, three, and 13 (the ids checked by four torch ops and an assert, made int32,
    each pair's row of x by two more, the output zeroed twice and cast). The expert tiles: the
    sort by expert (with the ids' check), an assert, the tiles (which write the rows of another
    rank's experts as zeros: before, a zeroing of the whole output too); before that, 45 (the
    sort some 40 torch ops). The expert GEMV on rows of an expert: the same sort, x's
    preparation (zeroing the split-K workspace), the GEMV."""
    monkeypatch.setattr(kernels.dispatch, "_device", lambda device: kernels.configs.Device(0, 0, 132))
    w = stack("Q4_K", (40, 256 * 4))
    experts = stack("Q8_0", (4, 64, 64))
    ids = torch.tensor([[0, -1]])  # one token's experts: the GEMV a pair (configs.moe_choice)
    x1, x16, x1e, x64 = (_x(m, k, 3).half() for m, k in ((1, 1024), (16, 1024), (1, 64), (64, 64)))
    ids64 = torch.randint(0, 4, (64, 2), generator=torch.Generator().manual_seed(0))
    products = {
        "gemv": lambda: w.matmul(x1, backend="triton"),
        "gemm": lambda: w.matmul(x16, backend="triton"),
        "expert gemv": lambda: experts.expert_matmul(x1e, ids, backend="triton"),
        "expert tiles": lambda: experts.expert_matmul(x64, ids64, backend="triton"),
        "expert gemv rows": lambda: experts.expert_matmul(x64[:8], ids64[:8], backend="triton")}
    for name, product in products.items():
        if name == "expert gemv rows":  # the GEMV on 4 of an expert's rows a program
            monkeypatch.setitem(kernels.configs.MOE_RULE, "Q8_0", ((None, "gemv_x4"),))
        product()
        with recording() as rec:
            out = product()
        kernels_run = [launch[0] for launch in rec.launches]
        assert out.dtype == torch.float16
        if name == "expert tiles":  # the sort by expert one kernel, with the ids' check
            assert (kernels_run, rec.device_ops) == (["sort_by_expert_kernel", "moe_gemm_kernel"],
                                                     ["_assert_async"])
            continue
        if name == "expert gemv rows":  # the same sort, x's preparation, the GEMV
            assert (kernels_run, rec.device_ops) == (
                ["sort_by_expert_kernel", "prepare_x_kernel", "moe_gemv_rows_kernel"], ["_assert_async"])
            continue
        splits = [launch[3]["SPLIT_K"] for launch in rec.launches if "SPLIT_K" in launch[3]]
        assert splits and splits[0] > 1, (name, rec.launches)
        if name == "gemv":
            assert (kernels_run, rec.device_ops) == (["prepare_x_kernel", "gemv_dot_kernel"], [])
        elif name == "gemm":
            assert (kernels_run, rec.device_ops) == (["gemm_kernel"], [])
        else:  # the ids checked by x's preparation: one assert on its verdict
            assert (kernels_run, rec.device_ops) == (["prepare_x_kernel", "moe_gemv_kernel"],
                                                     ["_assert_async"])


@pytest.mark.parametrize("tokens", [1, 64])  # the GEMV a pair (checked by x's preparation), tiles
@pytest.mark.parametrize("bad, dtype", [(4, torch.int32), (-2, torch.int32), (4, torch.int64),
                                        (-2, torch.int64), (2 ** 32 + 1, torch.int64)])
def test_an_expert_id_out_of_range_is_caught_on_the_device(tokens, bad, dtype):
    """Checked with a device-side assert (no sync); on CPU tensors it raises at once. The
    torch backend checks on the host (it reads the ids there anyway). An int64 id is checked
    whole (2 ** 32 + 1 is not 1)."""
    w = stack("Q8_0", (4, 8, 32))
    assert kernels.dispatch.expert_path("Q8_0", tokens, 1, 4) == ("gemv" if tokens == 1 else "tiles")
    ids = torch.zeros(tokens, 1, dtype=dtype)
    ids[-1, 0] = bad
    for backend in ("triton", "torch"):
        with pytest.raises(RepackError, match=r"expert ids must be in -1\.\.3"):
            w.expert_matmul(torch.randn(tokens, 32), ids, backend=backend)
    ids[-1, 0] = -1
    w.expert_matmul(torch.randn(tokens, 32), ids, backend="triton")


def test_every_launch_runs_on_the_tensors_device(monkeypatch):
    """Triton launches on the current CUDA device: each public entry point enters the
    tensors' device (dispatch._launch_device) before any launch. Read off the launch path:
    each launch must happen inside that guard, entered with the device of its tensors (no
    second GPU here; on CUDA the guard is torch.cuda.device)."""
    entered: list[torch.device] = []

    @contextlib.contextmanager
    def guard(device):
        entered.append(device)
        try:
            yield
        finally:
            entered.pop()
    monkeypatch.setattr(kernels.dispatch, "_launch_device", guard)
    real_call = interpreter.GridExecutor.__call__
    seen = []

    def launch(self, *args, **kwargs):
        devices = {a.device for a in args if isinstance(a, torch.Tensor)}
        assert entered and devices == {entered[-1]}, (self.fn.__name__, entered, devices)
        seen.append(self.fn.__name__)
        return real_call(self, *args, **kwargs)
    monkeypatch.setattr(interpreter.GridExecutor, "__call__", launch)
    dense, experts = stack("Q4_K", (40, 256)), stack("Q8_0", (4, 8, 32))
    for m in (1, 16, 256):
        dense.matmul(torch.randn(m, 256), backend="triton")
    dense.embedding(torch.tensor([1, 2]), backend="triton")
    dense.dequantize(backend="triton")
    for tokens in (1, 64):
        experts.expert_matmul(torch.randn(tokens, 32), torch.zeros(tokens, 2, dtype=torch.long) + 1,
                              backend="triton")
    assert {"gemv_dot_kernel", "gemm_kernel", "dequantize_kernel", "gather_rows_kernel",
            "moe_gemv_kernel", "moe_gemm_kernel"} <= set(seen), seen


def test_deterministic_mode_takes_no_float_atomics(monkeypatch):
    """Under torch.use_deterministic_algorithms(True) no launch splits K (the float
    atomics that make the default's last bits vary from run to run); results are repeatable."""
    w = stack("Q4_K", (40, 256 * 2))
    x = _x(1, 256 * 2, 4)  # the GEMV's M
    assert kernels.dispatch.matmul_path("Q4_K", 1) == "gemv"
    experts, ids = stack("Q4_0", (4, 32, 512)), torch.tensor([[0, 2], [2, 3]])
    monkeypatch.setitem(kernels.configs.MOE_RULE, "Q4_0", ((None, "tiles_bm16"),))  # the expert tiles
    # as an H200 splits K (132 SMs to fill), on CPU tensors
    monkeypatch.setattr(kernels.dispatch, "_device", lambda device: kernels.configs.Device(0, 0, 132))
    with recording() as rec:
        w.matmul(x, backend="triton")
        experts.expert_matmul(_x(2, 512, 6), ids, backend="triton")
    assert {launch[0] for launch in rec.launches if launch[3].get("SPLIT_K", 1) > 1} == \
        {"gemv_dot_kernel", "moe_gemm_kernel"}
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with recording() as rec:
            w.matmul(x, backend="triton")
            w.matmul(_x(16, 256 * 2, 5), backend="triton")
            experts.expert_matmul(_x(2, 512, 6), ids, backend="triton")
    finally:
        torch.use_deterministic_algorithms(previous)
    assert [(launch[0], launch[3]["SPLIT_K"]) for launch in rec.launches if "SPLIT_K" in launch[3]] == \
        [("gemv_dot_kernel", 1), ("gemm_kernel", 1), ("moe_gemm_kernel", 1)]
