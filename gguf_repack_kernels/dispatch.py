"""The launchers: planes in, tensors out. The one place that chooses a matmul path by M.

Dequantize and embedding must equal the torch backend bit for bit, so they are compiled with
FP fusion off (on a GPU, Triton would otherwise turn `d * q + m` into one FMA, rounded once
instead of twice). The GEMV and GEMM keep it: their sums are within tolerance anyway."""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from . import configs
from .dequantize import dequantize_kernel
from .embedding import gather_rows_kernel
from .gemm import gemm_kernel
from .gemv import gemv_dot_kernel, prepare_x_kernel, prepare_x_q8_kernel
from .moe import moe_gemm_kernel, moe_gemv_kernel, moe_gemv_rows_kernel, sort_by_expert_kernel
from .registry import FORMATS, MAX_PLANES, Format

# Each module registers its types on import.
from . import formats_iquants, formats_kquants, formats_legacy, formats_other  # noqa: E402,F401  isort: skip


def _format(type_name: str) -> Format:
    try:
        return FORMATS[type_name]
    except KeyError:
        raise NotImplementedError(f"no Triton kernel for {type_name} yet") from None


def _cdiv(a: int, b: int) -> int:
    """ceil(a / b) for the grids: triton.cdiv is a ConstexprFunction, 1.4 us a call from Python
    (three a product: an eager caller pays the host's time once a launch)."""
    return -(-a // b)


def _launch_device(device: torch.device):
    """Triton launches on the current CUDA device and its current stream, not on the
    tensors': every launch runs under this, so that a model on cuda:1, or spread over GPUs
    by transformers' device_map, launches where its tensors are."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _deterministic(cfg: dict) -> dict:
    """Split K adds float partial sums atomically, in whatever order the programs finish, so
    results differ from run to run (and GPU to GPU) in the last bits. Under
    torch.use_deterministic_algorithms(True) every launch takes K whole: no float atomics."""
    if torch.are_deterministic_algorithms_enabled():
        cfg = {**cfg, "SPLIT_K": 1}
    return cfg


def _plane_args(planes: dict[str, torch.Tensor], fmt: Format) -> list[torch.Tensor]:
    """P0..P4 and TABLE: the planes in the format's order (contiguous [B, N, count]), padded
    with any valid pointer; the lookup table, or again any valid pointer."""
    args = [_whole_words(planes[f].contiguous()) for f in fmt.fields]
    device = args[0].device
    args += [args[0]] * (MAX_PLANES - len(args))
    args.append(fmt.table(device) if fmt.table is not None else args[0])
    return args


def _whole_words(plane: torch.Tensor) -> torch.Tensor:
    """A contiguous plane [..., B, N, count] that starts on a 32-bit word and whose every
    [B, N, count] (each expert's) is a whole number of words: as it is, or copied so, each
    expert a word apart (a 16-bit scale field at an odd B x N, which an odd K / block size
    and an odd N make, or a plane viewed at a 2-byte offset). The dequant functions read a
    16-bit scale as the aligned word that holds it (fields.field16_in_word), which would start
    mid-word in every other expert and run past the plane's end. The copy is of scales
    alone, once a call, and only for such shapes."""
    per_lead = plane.shape[-3:].numel()
    if per_lead * plane.element_size() % 4 == 0 and plane.data_ptr() % 4 == 0:
        return plane
    flat = plane.reshape(-1, per_lead)
    words = -(-per_lead * plane.element_size() // 4)
    padded = flat.new_zeros(flat.shape[0], words * 4 // plane.element_size())
    padded[:, :per_lead] = flat
    return padded if plane.dim() > 3 else padded[0]


def _split(shape, fmt):
    """(lead count, N, K, B) of a weight of torch shape (E..., N, K): N is given, also for a
    single row (the caller's rule for 1-D tensors; gguf_repack's is format.layout.as_rows)."""
    if len(shape) < 2:
        raise ValueError(f"a weight of torch shape (E..., N, K), not {tuple(shape)}")
    *lead, n, k = shape
    n_lead = 1
    for d in lead:
        n_lead *= d
    return n_lead, n, k, k // fmt.block_size


def _per_expert(planes: dict[str, torch.Tensor], n_lead: int, experts=None):
    """2-D plane sets [B, N, count] of each leading index (experts of a stack), or of those
    in `experts`."""
    flat = {f: p.reshape(n_lead, *p.shape[-3:]) for f, p in planes.items()}
    for e in range(n_lead) if experts is None else experts:
        yield {f: p[e] for f, p in flat.items()}


def dequantize(planes: dict[str, torch.Tensor], type_name: str, shape,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    fmt = _format(type_name)
    n_lead, n, k, b = _split(shape, fmt)
    device = next(iter(planes.values())).device
    out = torch.empty(n_lead, n, k, dtype=dtype, device=device)
    cfg = configs.dequantize_config(fmt.block_size)
    with _launch_device(device):
        for e, expert in enumerate(_per_expert(planes, n_lead)):
            grid = (_cdiv(n, cfg["BN"]), b)
            dequantize_kernel[grid](*_plane_args(expert, fmt), out[e], n, b, BLOCK=fmt.block_size,
                                    BN=cfg["BN"], DQ=fmt.dequant, num_warps=cfg["num_warps"],
                                    enable_fp_fusion=False)
    return out.reshape(shape)


def embedding(ids: torch.Tensor, planes: dict[str, torch.Tensor], type_name: str, shape,
              dtype: torch.dtype = torch.float32) -> torch.Tensor:
    fmt = _format(type_name)
    _, n, k, b = _split(shape, fmt)
    flat = ids.reshape(-1).to(torch.int32).contiguous()
    out = torch.empty(flat.numel(), k, dtype=dtype, device=flat.device)
    cfg = configs.embedding_config(fmt.block_size)
    if flat.numel():
        grid = (_cdiv(flat.numel(), cfg["BI"]), b)
        with _launch_device(flat.device):
            gather_rows_kernel[grid](*_plane_args(planes, fmt), flat, out, n, b, flat.numel(),
                                     BLOCK=fmt.block_size, BI=cfg["BI"], DQ=fmt.dequant,
                                     num_warps=cfg["num_warps"], enable_fp_fusion=False)
    return out.reshape(*ids.shape, k)


def _device(device: torch.device) -> configs.Device:
    """What the tiles are chosen for (capability, shared memory, SMs); the interpreter's
    record for CPU tensors: one "SM", no parallel hardware to fill."""
    return configs.device_of(device)


def _split_k_workspace(m: int, n: int, counters: int, split_k: int,
                       out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(SUMS, COUNTS, the buffer to zero) for a GEMV that splits K (split_k.py): float32 sums
    [m, n] with the strides of `out` (contiguous: the kernels take one offset for both) and
    int32 counters, one buffer, for x's preparation to zero (the buffer returned). Without
    split K nothing: `out` stands in for the pointers the kernel then never reads."""
    assert out.shape == (m, n) and out.is_contiguous(), (out.shape, out.stride())
    if split_k == 1:
        return out, out, None
    buffer = torch.empty(m * n + counters, device=out.device, dtype=torch.float32)
    return buffer[:m * n], buffer[m * n:].view(torch.int32), buffer


# The split-K workspaces of the fused GEMM and the expert tiles, one a (device, stream):
# float32, zeroed when made, and left zeroed by every launch that uses one (split_k.py's
# CLEAN), so that a product is the GEMM's one launch, no zeroing before it. One a stream:
# products on two streams at once (vLLM's shared experts run on a stream of their own) must
# not share sums. Never freed:
# a CUDA graph captured with a smaller one still reads it at every replay. Their size is
# bounded by the split rule (configs.gemm_split_k: K is split only while a product has few
# tiles, at most 2 x PROGRAMS_PER_SM x SMS of BM x BN: 528 at an H200's defaults, M x N
# float32 of at most some 8 MB; the expert tiles' the same rule on the tiles an average
# routing makes, their pairs x N).
_CLEAN_WORKSPACES: dict[tuple, torch.Tensor] = {}
_ALL_WORKSPACES: list[torch.Tensor] = []


def _clean_split_k_workspace(m: int, n: int, counters: int, split_k: int, out: torch.Tensor):
    """(SUMS, COUNTS) for the fused GEMM (as _split_k_workspace's), from the kept workspace of
    the current stream, already zero: made (zeroed) on the first call and when a product
    needs more, else no device work at all."""
    assert out.shape == (m, n) and out.is_contiguous(), (out.shape, out.stride())
    if split_k == 1:
        return out, out
    device = out.device
    key = (device.index, torch._C._cuda_getCurrentRawStream(device.index)) if device.type == "cuda" \
        else (device.type,)
    buffer = _CLEAN_WORKSPACES.get(key)
    if buffer is None or buffer.numel() < m * n + counters:
        buffer = torch.zeros(max(m * n + counters, 1 << 18), device=device, dtype=torch.float32)
        _CLEAN_WORKSPACES[key] = buffer
        _ALL_WORKSPACES.append(buffer)
    return buffer[:m * n], buffer[m * n:m * n + counters].view(torch.int32)


def gemm_dequant(fmt: Format, dtype, bm: int, warps: int = 4) -> dict:
    """The fused GEMM's dequant function, DQ, the dtype it returns, DQ_DT, and the order of
    its columns, XRUN, for its BM-row tile and x of `dtype`: the type's half-precision
    function where it takes x's dtype (registry.py; from BM = 64 on its wide_f16 where it has
    that, but in a BM = 64 tile of `warps` 8 over two warpgroups, configs.two_warpgroups: a
    tuner's 4-warp tile keeps wide_f16; below, where the installed Triton may take it:
    configs.half_dequant_allowed; at BM = 16 its scaled_after where it has one, BLOCK_SCALE
    its block's scale, or its narrow_f16 where configs.narrow_half_allowed), else the
    float32 one; FENCE, whether the tile fences its weight tile (configs.kwidth_fence); and
    MMA_PIPELINED, whether it promises a non-empty K loop (configs.mma_pipelined)."""
    act = configs.act_name(dtype)
    flags = {"FENCE": configs.kwidth_fence(fmt.name, bm, act),
             "MMA_PIPELINED": configs.mma_pipelined(fmt.name, bm, act), "BLOCK_SCALE": None}
    float32 = {"DQ": fmt.dequant, "DQ_DT": tl.float32, "XRUN": 0, **flags}
    half = fmt.half_dequant(act)
    if half is None:
        return float32
    two_warpgroups = warps == 8 and configs.two_warpgroups(fmt.name, bm, act)
    if bm >= 64 and fmt.wide_f16 is not None and not two_warpgroups:
        function, run = fmt.wide_f16
        if function is fmt.dequant:
            return float32
        return {"DQ": function, "DQ_DT": tl.float16 if act == "fp16" else tl.bfloat16, "XRUN": run, **flags}
    if not configs.half_dequant_allowed(fmt.name):
        return float32
    dt = tl.float16 if act == "fp16" else tl.bfloat16
    if bm == 16 and fmt.scaled_after is not None:  # the block's scale after the MMA (registry.py)
        unscaled, scale = fmt.scaled_after
        return {"DQ": unscaled, "DQ_DT": dt, "XRUN": fmt.f16_nibble_run, **flags, "BLOCK_SCALE": scale}
    if bm == 16 and fmt.narrow_f16 is not None and configs.narrow_half_allowed(fmt.name):
        half = fmt.narrow_f16  # the BM = 16 tile's own (registry.py)
    return {"DQ": half, "DQ_DT": dt, "XRUN": fmt.f16_nibble_run, **flags}


def matmul_path(type_name: str, m: int) -> str:
    """Which of the three paths multiplies M rows of x (configs.matmul_choice, from the SASS
    estimate; configs.py says why): "gemv", "gemm" (fused; its BM: configs.gemm_bm) or
    "dequantize+matmul"."""
    choice = configs.matmul_choice(type_name, _format(type_name).block_size, m)
    return "gemm" if choice.startswith("gemm_bm") else choice


def matmul(x: torch.Tensor, planes: dict[str, torch.Tensor], type_name: str, shape,
           tile: dict | None = None) -> torch.Tensor:
    """x @ W.T for a 2-D weight of torch shape (N, K): (..., K) -> (..., N) in x's dtype.
    `tile` replaces the launch's default tile (configs.py; what scripts/tune_kernels.py
    tries)."""
    fmt = _format(type_name)
    n, k = shape
    b = k // fmt.block_size
    if b == 0:  # K = 0: a sum of nothing; the tiles' K loops are promised a step (gemm.py)
        return x.new_zeros(*x.shape[:-1], n)
    x2 = x.reshape(-1, k).contiguous()
    m = x2.shape[0]
    if m == 0:  # engines do send empty batches; no kernel is launched for them
        return x.new_empty(*x.shape[:-1], n)
    with _launch_device(x.device):
        return _matmul(x, x2, planes, fmt, n, b, matmul_path(type_name, m), tile)


def _matmul(x, x2, planes, fmt, n, b, path, tile):
    type_name, m, k = fmt.name, x2.shape[0], x2.shape[1]
    if path == "dequantize+matmul":
        # the weight in x's dtype (float32 for float32 x), made afresh each call: torch's
        # caching allocator hands the same memory back, where a buffer kept here would hold
        # the largest weight's dense copy (an output head: a GB) for good
        w = dequantize(planes, type_name, (n, k), x.dtype)
        return (x2 @ w.T).reshape(*x.shape[:-1], n)
    args = _plane_args(planes, fmt)
    if path == "gemv":
        cfg = _deterministic(_gemv_config(type_name, m, n, b, x.device, x.dtype, tile))
        assert cfg["PARTS"] in fmt.dot_parts, (type_name, cfg)
        out = torch.empty(m, n, device=x.device, dtype=x.dtype)
        grid = (_cdiv(n, cfg["BN"]), cfg["SPLIT_K"], _cdiv(m, cfg["XR"]))
        sums, counts, zero = _split_k_workspace(m, n, grid[2] * grid[0], cfg["SPLIT_K"], out)
        xf, xs = _prepared_x(x2, fmt, zero)
        gemv_dot_kernel[grid](*args, xf, xs, out, sums, counts, n, b, out.stride(0), m,
                              BLOCK=fmt.block_size, BN=cfg["BN"], SPLIT_K=cfg["SPLIT_K"],
                              PARTS=cfg["PARTS"], DOT=fmt.gemv_dot(cfg["XR"]), XSTRIDE=fmt.x_stride,
                              STAGES=cfg["STAGES"], XR=cfg["XR"], num_warps=cfg["num_warps"])
    else:
        cfg = _deterministic(configs.gemm_config(type_name, fmt.block_size, m, n, b, _device(x.device),
                                                 x.dtype, tile))
        out = torch.empty(m, n, device=x.device, dtype=x.dtype)
        grid = (_cdiv(m, cfg["BM"]), _cdiv(n, cfg["BN"]), cfg["SPLIT_K"])
        sums, counts = _clean_split_k_workspace(m, n, grid[0] * grid[1], cfg["SPLIT_K"], out)
        gemm_kernel[grid](*args, x2, out, sums, counts, m, n, b, x2.stride(0), out.stride(0),
                          BLOCK=fmt.block_size, BM=cfg["BM"], BN=cfg["BN"],
                          IEEE=x.dtype == torch.float32, SPLIT_K=cfg["SPLIT_K"],
                          **gemm_dequant(fmt, x.dtype, cfg["BM"], cfg["num_warps"]),
                          SWAP=configs.swap_ab(type_name, cfg["BM"], x.dtype),
                          STEP_BLOCKS=cfg["STEP_BLOCKS"], num_warps=cfg["num_warps"],
                          num_stages=cfg["num_stages"])
    return out.reshape(*x.shape[:-1], n)


def _sorted_by_expert(ids: torch.Tensor, n_experts: int, bm: int, x_per_slot: bool):
    """The routed (token, slot) pairs sorted by expert, each expert's run padded to bm rows
    (moe.sort_by_expert_kernel, one launch): each padded slot's row of x and of the output
    (-1 for padding), each bm-row tile's expert (-1 past the last tile). Pairs with expert
    -1 (another rank's) take the slots of tiles of expert E, "none", which the tiles write
    as zeros; an id outside -1..E-1 raises (a device-side assert on a GPU).

    On the device, with no host synchronization: every size comes from the shapes alone,
    as a CUDA graph needs (it replays the sizes and grids it captured, whatever the routing).
    The bound: an expert with c pairs takes ceil(c / bm) <= c // bm + 1 tiles, so P pairs
    never take more than P // bm + min(E + 1, P) tiles ("none" counted). The launch has that
    many; the tiles past the last find -1 and return at once."""
    t, top = ids.shape
    pairs, device = t * top, ids.device
    max_tiles = pairs // bm + min(n_experts + 1, pairs)  # (another rank's pairs: expert E's)
    x_rows = torch.empty(max_tiles * bm, dtype=torch.int32, device=device)
    out_rows = torch.empty(max_tiles * bm, dtype=torch.int32, device=device)
    tile_expert = torch.empty(max_tiles, dtype=torch.int32, device=device)
    experts_pad = triton.next_power_of_2(n_experts + 2)  # the experts, "none", the loads past P
    cursor_ok = torch.empty(experts_pad + 1, dtype=torch.int32, device=device)
    sort_by_expert_kernel[(1,)](ids.reshape(-1).contiguous(), pairs, n_experts, 1 if x_per_slot else top,
                                cursor_ok, cursor_ok[experts_pad:], x_rows, out_rows, tile_expert,
                                max_tiles, BM=bm, E_PAD=experts_pad, BK=1024)
    _assert_ids(cursor_ok[experts_pad:], n_experts)
    return x_rows, out_rows, tile_expert


def _prepared_x(x2: torch.Tensor, fmt: Format, zero: torch.Tensor | None,
                expert_ids: tuple[torch.Tensor, int] | None = None):
    """The GEMV's x (gemv.py): float32, or for an `x_int8` type int8 and its scales, with the
    sums of 16; and by the same launch `zero` (the GEMV's split-K workspace, or None) zeroed
    and `expert_ids` (the expert GEMV's flat ids and the stack's expert count) checked: a bad
    id raises (on a GPU, a device-side assert) before the GEMV reads a weight for it."""
    m, k = x2.shape
    b = k // fmt.block_size
    xs = torch.empty(m, k // 16, device=x2.device, dtype=torch.float32)
    z, zn = (xs, 0) if zero is None else (zero, zero.numel())
    ids, n_ids, n_experts, ok = xs, 0, 0, xs
    if expert_ids is not None:
        (ids, n_experts), ok = expert_ids, torch.empty(1, device=x2.device, dtype=torch.int32)
        n_ids = ids.numel()
    check = {"CHECK_IDS": expert_ids is not None}
    if fmt.x_int8:
        xf = torch.empty(m, b * fmt.x_stride, device=x2.device, dtype=torch.int8)
        prepare_x_q8_kernel[(m, _cdiv(k, 1024))](
            x2, xf, xs, k, x2.stride(0), z, zn, ids, n_ids, n_experts, ok, BLOCK=fmt.block_size,
            XSTRIDE=fmt.x_stride, BK=1024, **check)
    else:
        xf = torch.empty(m, k, device=x2.device, dtype=torch.float32)
        prepare_x_kernel[(m, _cdiv(k, 1024))](x2, xf, xs, k, x2.stride(0), z, zn, ids, n_ids,
                                              n_experts, ok, BK=1024, **check)
    if expert_ids is not None:
        _assert_ids(ok, n_experts)
    return xf, xs


def _assert_ids(ok: torch.Tensor, n_experts: int) -> None:
    """Asserted on the device: reading the ids on the host would synchronize, which a CUDA
    graph's capture forbids. On CPU tensors it raises here (RuntimeError)."""
    torch._assert_async(ok, f"expert_matmul: expert ids must be in -1..{n_experts - 1}")


def _gemv_config(type_name: str, m: int, n: int, b: int, device: torch.device, dtype: torch.dtype,
                 tile: dict | None = None, x_rows: int | None = None) -> dict:
    cfg = configs.gemv_dot_config(type_name, m, n, b, _device(device), dtype, tile, x_rows)
    if device.type != "cuda":
        # the interpreter runs a program's rows as one array: tiles sized for a GPU's
        # threads (up to 2048 rows) would mostly compute masked rows
        cfg["BN"] = min(cfg["BN"], max(32, triton.next_power_of_2(n)))
    return cfg


def expert_path(type_name: str, tokens: int, top: int, routed_experts: int) -> str:
    """Which path multiplies `tokens` tokens routed to `top` experts each of the model's
    `routed_experts`, from these shapes alone (the same for every routing, as a CUDA graph
    needs): "gemv" (a GEMV a pair, or a program on 2 or 4 of an expert's rows:
    configs.moe_gemv_x_rows), "tiles" (BM-row tiles of one expert each) or, past the
    batch sizes engines capture in CUDA graphs, "dequantize+matmul". By the rows an expert
    gets on average (configs.routed_rows_per_expert), as the dense matmul chooses by M (the
    estimate's rule: configs.moe_choice). Under expert parallelism `routed_experts` is the
    model's count, not this rank's stack: a local expert gets the rows any expert gets."""
    rows = configs.routed_rows_per_expert(tokens, top, routed_experts)
    if configs.moe_choice(type_name, rows).startswith("gemv"):
        return "gemv"
    if tokens > configs.MOE_GRAPH_MAX_TOKENS and \
            rows >= configs.dequantize_matmul_min_m(_format(type_name).block_size):
        return "dequantize+matmul"
    return "tiles"


def expert_matmul(x: torch.Tensor, expert_ids: torch.Tensor, planes: dict[str, torch.Tensor],
                  type_name: str, shape, routed_experts: int | None = None) -> torch.Tensor:
    """Each routed token times its experts, for an expert stack W of torch shape (E, N, K):
    x (T, K) (one input per token) or (T, k, K) (one per token and slot), expert_ids (T, k),
    -1 for none. Result (T, k, N) in x's dtype: out[t, j] = x[t (, j)] @ W[expert_ids[t, j]].T,
    zeros where the id is -1. The path by expert_path: a GEMV a (token, slot) pair, or one
    launch of tiles for all experts (moe.py), or for prefill's long runs each chosen expert's
    weight dequantized once, then torch.matmul. Up to configs.MOE_GRAPH_MAX_TOKENS tokens no
    step synchronizes with the host (tests/test_host_sync.py). An id outside -1..E-1 raises
    RuntimeError (on a GPU a device-side assert) and reads no weight; the ids are read as
    given, int32 or int64. `routed_experts`: the experts the model's router chooses among,
    where this stack holds fewer (expert parallelism: this rank's experts, the others' ids
    -1); the path and tile follow the rows an expert gets, which come from the model's count
    (this rank's would count each token's slots as all local). None: the stack's E."""
    fmt = _format(type_name)
    n_experts, n, k = shape
    routed = n_experts if routed_experts is None else routed_experts
    if routed < n_experts:
        raise ValueError(f"expert_matmul: routed_experts {routed} is fewer than the stack's {n_experts}")
    t, top = expert_ids.shape
    if t * top == 0 or k == 0:  # nothing routed, or K = 0 (see matmul)
        return x.new_zeros(t, top, n)
    x2 = x.reshape(-1, k).contiguous()
    ids = expert_ids.to(x.device)
    path = expert_path(type_name, t, top, routed)
    with _launch_device(x.device):
        if path == "dequantize+matmul":  # the ids checked by torch ops (it reads them anyway)
            _assert_ids(((ids >= -1) & (ids < n_experts)).all(), n_experts)
            out = torch.zeros(t * top, n, device=x.device, dtype=x.dtype)
            return _experts_dequantized(x2, ids, planes, type_name, shape, x.dim() == 3, out)
        return _expert_kernels(x, x2, ids, planes, fmt, shape, path, routed)


def _expert_kernels(x, x2, ids, planes, fmt, shape, path, routed):
    n_experts, n, k = shape
    b = k // fmt.block_size
    t, top = ids.shape
    pairs = t * top
    args = _plane_args(planes, fmt)
    strides = [p.stride(0) for p in args[:MAX_PLANES]]
    rows_per_expert = configs.routed_rows_per_expert(t, top, routed)
    if path == "gemv":
        program_rows = configs.moe_gemv_x_rows(fmt.name, rows_per_expert, _device(x.device).capability)
        if program_rows > 1:  # a few rows an expert: the GEMV on that many of them a program
            return _expert_gemv_rows(x, x2, ids, args, strides, fmt, shape, program_rows)
        # about a row an expert: a GEMV a pair
        cfg = _deterministic(_gemv_config(fmt.name, pairs, n, b, x.device, x.dtype, x_rows=1))
        out = torch.empty(pairs, n, device=x.device, dtype=x.dtype)  # -1's rows: written as zeros
        grid = (_cdiv(n, cfg["BN"]), cfg["SPLIT_K"], pairs)
        sums, counts, zero = _split_k_workspace(pairs, n, pairs * grid[0], cfg["SPLIT_K"], out)
        flat_ids = ids.reshape(-1).contiguous()
        xf, xs = _prepared_x(x2, fmt, zero, (flat_ids, n_experts))
        moe_gemv_kernel[grid](*args, *strides, xf, xs, flat_ids, top if x.dim() == 2 else 1, n_experts,
                              out, sums, counts, n, b, out.stride(0), BLOCK=fmt.block_size,
                              BN=cfg["BN"], SPLIT_K=cfg["SPLIT_K"], PARTS=cfg["PARTS"], DOT=fmt.dot,
                              XSTRIDE=fmt.x_stride, num_warps=cfg["num_warps"])
        return out.reshape(t, top, n)
    # (the split of K for the tiles an average routing makes: shapes alone, as a graph needs)
    cfg = _deterministic(configs.moe_config(fmt.name, fmt.block_size, rows_per_expert, _device(x.device),
                                            x.dtype, b, n=n, routing=(t, min(top, routed), routed)))
    x_rows, out_rows, tile_expert = _sorted_by_expert(ids, n_experts, cfg["BM"], x.dim() == 3)
    out = torch.empty(pairs, n, device=x.device, dtype=x.dtype)  # -1's rows: written as zeros
    grid = (tile_expert.numel(), _cdiv(n, cfg["BN"]), cfg["SPLIT_K"])
    sums, counts = _clean_split_k_workspace(pairs, n, grid[0] * grid[1], cfg["SPLIT_K"], out)
    moe_gemm_kernel[grid](*args, *strides, x2, x_rows, out_rows, tile_expert, n_experts, out, sums,
                          counts, n, b, x2.stride(0), out.stride(0), BLOCK=fmt.block_size,
                          BM=cfg["BM"], BN=cfg["BN"], IEEE=x.dtype == torch.float32,
                          **gemm_dequant(fmt, x.dtype, cfg["BM"], cfg["num_warps"]),
                          SWAP=configs.swap_ab(fmt.name, cfg["BM"], x.dtype),
                          STEP_BLOCKS=cfg["STEP_BLOCKS"], SPLIT_K=cfg["SPLIT_K"],
                          num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return out.reshape(t, top, n)


def _expert_gemv_rows(x, x2, ids, args, strides, fmt, shape, x_rows):
    """The expert GEMV at a few rows an expert (moe.moe_gemv_rows_kernel): the pairs sorted
    by expert into tiles of `x_rows` slots (the tiles' sort), a GEMV program a tile, each
    reading its expert's weights once for its rows. The grid holds the sort's most tiles
    (shapes alone, as a CUDA graph needs); the ids are checked by the sort."""
    n_experts, n, k = shape
    b = k // fmt.block_size
    t, top = ids.shape
    pairs = t * top
    cfg = _deterministic(_gemv_config(fmt.name, pairs, n, b, x.device, x.dtype, x_rows=x_rows))
    slot_x, slot_out, tile_expert = _sorted_by_expert(ids, n_experts, x_rows, x.dim() == 3)
    out = torch.empty(pairs, n, device=x.device, dtype=x.dtype)  # -1's rows: written as zeros
    grid = (_cdiv(n, cfg["BN"]), cfg["SPLIT_K"], tile_expert.numel())
    sums, counts, zero = _split_k_workspace(pairs, n, grid[0] * grid[2], cfg["SPLIT_K"], out)
    xf, xs = _prepared_x(x2, fmt, zero)
    moe_gemv_rows_kernel[grid](*args, *strides, xf, xs, slot_x, slot_out, tile_expert, n_experts,
                               out, sums, counts, n, b, out.stride(0), BLOCK=fmt.block_size,
                               BN=cfg["BN"], SPLIT_K=cfg["SPLIT_K"], PARTS=cfg["PARTS"],
                               DOT=fmt.gemv_dot(x_rows), XSTRIDE=fmt.x_stride, XR=x_rows,
                               num_warps=cfg["num_warps"])
    return out.reshape(t, top, n)


def _experts_dequantized(x2: torch.Tensor, ids: torch.Tensor, planes: dict[str, torch.Tensor],
                         type_name: str, shape, x_per_slot: bool, out: torch.Tensor) -> torch.Tensor:
    """expert_matmul for long runs an expert: the pairs grouped by expert with one sort, then
    for each chosen expert its weight dequantized into x's dtype (the dequantize kernel) and
    its rows multiplied by torch.matmul, as the dense path does from the same M on; the
    weights of experts no token chose are never read. `out` is zeros [T * k, N]. The one
    path that reads the routing on the host (which experts, how many rows each): it is taken
    only past the batch sizes engines capture in CUDA graphs (expert_path)."""
    n_experts, n, k = shape
    t, top = ids.shape
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    chosen, counts = torch.unique_consecutive(flat[order], return_counts=True)
    x_of_pair = order if x_per_slot else order // top
    starts = torch.cumsum(counts, 0) - counts
    chosen, counts, starts = chosen.tolist(), counts.tolist(), starts.tolist()
    live = [i for i, e in enumerate(chosen) if e >= 0]
    for i, expert in zip(live, _per_expert(planes, n_experts, [chosen[i] for i in live])):
        pairs = slice(starts[i], starts[i] + counts[i])
        w = dequantize(expert, type_name, (n, k), x2.dtype)
        out[order[pairs]] = x2[x_of_pair[pairs]] @ w.T
    return out.reshape(t, top, n)
