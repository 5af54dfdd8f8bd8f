"""Ahead-of-time compilation for a GPU target, no GPU needed: the PTX and SASS show what a GPU
would run. Used by scripts/inspect_kernels.py and the tests. Must run without
TRITON_INTERPRET (an interpreted kernel cannot be compiled).

Kernels are compiled with the specialization a real launch gets: every pointer 16-byte
aligned and every integer argument divisible by 16 (`tt.divisibility`), which is what lets
Triton emit vector loads; without it Triton assumes nothing and emits scalar ones.

The SASS comes from the `cuobjdump` that ships inside Triton's NVIDIA backend. What it is
read for (`sass_summary`): the instructions of the main loop, i.e. the warp-instructions a
program issues per block column, against the weight bytes that iteration reads. An H200
moves about 4.8e12 B/s over 132 SMs at about 1.98 GHz, 18.4 bytes per SM-cycle, and an SM
issues at most 4 warp-instructions per cycle: a kernel that issues more than
4 / 18.4 = 0.218 warp-instructions per weight byte cannot keep up with memory at batch 1,
whatever else it does. That bound ignores latency and the per-pipe rates (integer ops and
conversions issue at lower rates than FFMA), so it is an upper bound.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import os
import re
import subprocess
import tempfile
from collections import Counter
from functools import cache

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from . import configs
from .dequantize import dequantize_kernel
from .dispatch import expert_path, gemm_dequant
from .embedding import gather_rows_kernel
from .gemm import gemm_kernel
from .gemv import gemv_dot_kernel
from .moe import moe_gemm_kernel, moe_gemv_kernel, moe_gemv_rows_kernel
from .registry import FORMATS

PLANES = ["P0", "P1", "P2", "P3", "P4", "TABLE"]
# Every kernel the dispatcher launches, as it would launch it: gemv, the GEMV at M = 1
# (decode), gemv_m2 and gemv_m4 at M = 2 and 4 (2 and 4 rows of x a program: configs.gemv_x_rows),
# gemv_m8 at M = 8 (the default rule's largest GEMV), all the type's dot function;
# the fused GEMM's four tiles, gemm_m16 (BM = 16, at M = 16), gemm_m32 (BM = 32, at 32),
# gemm (BM = 64, at 128) and gemm_m128 (the swapped BM = 128, at 128: configs.swap_ab, BM = 64
# for the other types); dequantize (then torch.matmul); embedding (which M takes which
# path and tile: configs.matmul_choice);
# moe_gemv, the expert products at decode (a GEMV a routed token), moe_gemv_x2 and _x4 (the
# GEMV on 2 or 4 of an expert's rows a program), and the expert GEMM's tiles moe_m16,
# moe_m32, moe_m64 (by the rows an expert gets)
FAMILIES = ("dequantize", "gemv", "gemv_m2", "gemv_m4", "gemv_m8", "gemm", "gemm_m16", "gemm_m32",
            "gemm_m128", "moe_gemv", "moe_gemv_x2", "moe_gemv_x4", "moe_m16", "moe_m32", "moe_m64",
            "embedding")
# the tl.dot families: the ones whose shared memory grows with the tile (configs.py)
DOT_FAMILIES = ("gemm_m16", "gemm_m32", "gemm", "gemm_m128", "moe_m16", "moe_m32", "moe_m64")
# what inspect_kernels.py compiles unless told: the expert families are the dense ones with an
# expert's offset (tests/test_kernels_ptx.py compiles moe_gemv apart, for a few types);
# gemm_m32 is the BM = 64 tile's kernel at half its rows; gemv_m4 is gemv_m8's (4 rows of x a
# program), gemv_m2 is checked by the estimate's compiles (scripts/estimate_paths.py)
DEFAULT_FAMILIES = tuple(f for f in FAMILIES if not f.startswith("moe_")
                         and f not in ("gemm_m32", "gemm_m128", "gemv_m2", "gemv_m4"))

H200_BYTES_PER_SM_CYCLE = 4.8e12 / (132 * 1.98e9)
ISSUE_PER_SM_CYCLE = 4
BUDGET = ISSUE_PER_SM_CYCLE / H200_BYTES_PER_SM_CYCLE  # warp-instructions per weight byte
SHAPE = (4096, 4096)  # (N, K) the launch configurations are chosen for
SMS = 132  # an H200's, which the estimates are for


def device(capability: int) -> configs.Device:
    """The device a compile for sm_<capability> is specialized for, as a launch there would
    be: configs.KNOWN_DEVICES (its shared memory and SMs), or for another capability an H200's
    SMs and no shared-memory limit."""
    return configs.KNOWN_DEVICES.get(capability, configs.Device(capability, 0, SMS))


# the M (or rows an expert) each tile family is compiled at
GEMM_M = {"gemm_m16": 16, "gemm_m32": 32, "gemm": 128, "gemm_m128": 128, "moe_m16": 16,
          "moe_m32": 32, "moe_m64": 64}
# the dense families' tile BM (whatever the rule takes at their M; BM = 128 is BM = 64 where
# the tile is not swapped: configs.gemm_config)
# the GEMV families' M (their rows of x a program: configs.gemv_x_rows)
GEMV_M = {"gemv": 1, "gemv_m2": 2, "gemv_m4": 4, "gemv_m8": 8}
# the expert GEMV's rows of x a program (an expert's slots: configs.moe_gemv_x_rows)
MOE_GEMV_XR = {"moe_gemv_x2": 2, "moe_gemv_x4": 4}
GEMM_BM = {"gemm_m16": 16, "gemm_m32": 32, "gemm": 64, "gemm_m128": 128}


def _spec(family: str, fmt, act: str, dev: configs.Device, m: int | None = None):
    """(kernel, signature, constexprs, config, rows of weight blocks per loop iteration) of
    one family at the configuration the dispatcher would choose for SHAPE on `dev`, for x of
    dtype `act`."""
    n, k = SHAPE
    block_size = fmt.block_size
    planes = {p: "*i8" for p in PLANES}
    if family == "dequantize":
        cfg = configs.dequantize_config(block_size)
        sig = {**planes, "OUT": f"*{act}", "N": "i32", "B": "i32"}
        return dequantize_kernel, sig, {"BLOCK": block_size, "BN": cfg["BN"],
                                        "DQ": fmt.dequant}, cfg, cfg["BN"]
    if family == "embedding":
        cfg = configs.embedding_config(block_size)
        sig = {**planes, "IDS": "*i32", "OUT": f"*{act}", "N": "i32", "B": "i32", "n_ids": "i32"}
        return gather_rows_kernel, sig, {"BLOCK": block_size, "BI": cfg["BI"],
                                         "DQ": fmt.dequant}, cfg, cfg["BI"]
    # the products write x's dtype; with split K through a float32 workspace (split_k.py)
    split_k = {"OUT": f"*{act}", "SUMS": "*fp32", "COUNTS": "*i32"}
    common = {**planes, "X": f"*{act}", **split_k, "M": "i32", "N": "i32", "B": "i32",
              "stride_xm": "i32", "stride_om": "i32"}
    if family in ("moe_gemv", "moe_gemv_r1"):  # one routed token a program, as the GEMV at M = 1
        # (_r1: at one weight row a thread, the config's choice for few pairs: gemv_split)
        cfg = configs.gemv_dot_config(fmt.name, 1, n, k // block_size, dev, act, x_rows=1,
                                      tile={"ROWS": 1} if family == "moe_gemv_r1" else None)
        sig = {**planes, **dict.fromkeys(["S0", "S1", "S2", "S3", "S4"], "i32"),
               "XF": "*i8" if fmt.x_int8 else "*fp32", "XS": "*fp32", "IDS": "*i64",
               "XDIV": "i32", "E": "i32", **split_k, "N": "i32", "B": "i32", "stride_om": "i32"}
        return moe_gemv_kernel, sig, {"BLOCK": block_size, "BN": cfg["BN"],
                                      "SPLIT_K": cfg["SPLIT_K"], "PARTS": cfg["PARTS"],
                                      "DOT": fmt.dot, "XSTRIDE": fmt.x_stride}, cfg, \
            cfg["BN"] / cfg["PARTS"]
    if family in MOE_GEMV_XR:  # XR of an expert's slots a program (the expert sort's tiles)
        xr = MOE_GEMV_XR[family]
        cfg = configs.gemv_dot_config(fmt.name, xr, n, k // block_size, dev, act, x_rows=xr)
        sig = {**planes, **dict.fromkeys(["S0", "S1", "S2", "S3", "S4"], "i32"),
               "XF": "*i8" if fmt.x_int8 else "*fp32", "XS": "*fp32", "X_ROWS": "*i32",
               "OUT_ROWS": "*i32", "TILE_EXPERT": "*i32", "E": "i32", **split_k, "N": "i32",
               "B": "i32", "stride_om": "i32"}
        return moe_gemv_rows_kernel, sig, {"BLOCK": block_size, "BN": cfg["BN"],
                                           "SPLIT_K": cfg["SPLIT_K"], "PARTS": cfg["PARTS"],
                                           "DOT": fmt.gemv_dot(xr), "XSTRIDE": fmt.x_stride, "XR": xr}, cfg, \
            cfg["BN"] / cfg["PARTS"]
    if family in GEMV_M:
        # XR rows of x a program: at M = 8 each weight byte is unpacked by 2 programs
        m = GEMV_M[family]
        cfg = configs.gemv_dot_config(fmt.name, m, n, k // block_size, dev, act)
        # x comes prepared (float32, or int8 and scales), whatever the activations' dtype
        sig = {**planes, "XF": "*i8" if fmt.x_int8 else "*fp32", "XS": "*fp32", **split_k,
               "N": "i32", "B": "i32", "stride_om": "i32", "M": "i32"}
        return gemv_dot_kernel, sig, {"BLOCK": block_size, "BN": cfg["BN"],
                                      "SPLIT_K": cfg["SPLIT_K"], "PARTS": cfg["PARTS"],
                                      "DOT": fmt.gemv_dot(cfg["XR"]), "XSTRIDE": fmt.x_stride,
                                      "STAGES": cfg["STAGES"], "XR": cfg["XR"]}, cfg, \
            cfg["BN"] / cfg["PARTS"] / -(-m // cfg["XR"])
    if family in GEMM_BM:
        cfg = configs.gemm_config(fmt.name, block_size, m or GEMM_M[family], n, k // block_size, dev, act,
                                  bm=GEMM_BM[family])
        return gemm_kernel, common, {
            "BLOCK": block_size, "BM": cfg["BM"], "BN": cfg["BN"], "IEEE": act == "fp32",
            **gemm_dequant(fmt, act, cfg["BM"], cfg["num_warps"]), "SPLIT_K": cfg["SPLIT_K"],
            "SWAP": configs.swap_ab(fmt.name, cfg["BM"], act), "STEP_BLOCKS": cfg["STEP_BLOCKS"]}, \
            cfg, cfg["BN"] * cfg["STEP_BLOCKS"]
    if family in ("moe_m16", "moe_m32", "moe_m64"):
        cfg = configs.moe_config(fmt.name, block_size, GEMM_M[family], dev, act, k // block_size,
                                 bm=GEMM_M[family])
        sig = {**planes, **dict.fromkeys(["S0", "S1", "S2", "S3", "S4"], "i32"), "X": f"*{act}",
               "X_ROWS": "*i32", "OUT_ROWS": "*i32", "TILE_EXPERT": "*i32", "E": "i32", **split_k,
               "N": "i32", "B": "i32", "stride_xm": "i32", "stride_om": "i32"}
        return moe_gemm_kernel, sig, {
            "BLOCK": block_size, "BM": cfg["BM"], "BN": cfg["BN"], "IEEE": act == "fp32",
            **gemm_dequant(fmt, act, cfg["BM"], cfg["num_warps"]),
            "SWAP": configs.swap_ab(fmt.name, cfg["BM"], act), "STEP_BLOCKS": cfg["STEP_BLOCKS"],
            "SPLIT_K": cfg["SPLIT_K"]}, cfg, cfg["BN"] * cfg["STEP_BLOCKS"]
    raise ValueError(family)


def compile_family(family: str, type_name: str, capability: int = 90, act: str = "fp16",
                   m: int | None = None):
    """(CompiledKernel, config, weight bytes per loop iteration of one program) of kernel
    `family` for type `type_name` on sm_<capability> (activations `act`: fp16, bf16, fp32),
    at the configuration the dispatcher would launch there (`device(capability)`), at the
    family's M (GEMM_M) or for the dense GEMM's tiles at `m` rows (its split K)."""
    fmt = FORMATS[type_name]
    kernel, sig, constexprs, cfg, rows = _spec(family, fmt, act, device(capability), m)
    compiled = compile_kernel(kernel, sig, constexprs, capability,
                              num_warps=cfg["num_warps"], maxnreg=cfg.get("maxnreg"),
                              num_stages=cfg.get("num_stages", 3),
                              fp_fusion=family not in ("dequantize", "embedding"))
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    type_size = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]][1]
    return compiled, cfg, round(rows * type_size)


def compile_kernel(kernel, sig: dict, constexprs: dict, capability: int, *, num_warps: int = 4,
                   fp_fusion: bool = True, maxnreg: int | None = None, num_stages: int = 3):
    """Any @triton.jit kernel, compiled: `sig` types its runtime arguments (marked
    16-divisible unless the kernel never specializes them), `constexprs` fixes the rest.
    `.asm` holds "ptx" and "cubin"."""
    signature = {**sig, **{k: "constexpr" for k in constexprs}}
    names = list(signature)
    # as a launch would: every argument 16-divisible, but those the kernel never specializes
    generic = set(getattr(kernel, "do_not_specialize", ()) or ())
    attrs = {(names.index(k),): [["tt.divisibility", 16]] for k in sig if k not in generic}
    src = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    options = {"num_warps": num_warps, "num_stages": num_stages, "enable_fp_fusion": fp_fusion}
    if maxnreg is not None:
        options["maxnreg"] = maxnreg
    return triton.compile(src, target=GPUTarget("cuda", capability, 32), options=options)


_LOAD = re.compile(r"\bld\.global(?:\.[a-z0-9]+)*")


def ptx_summary(ptx: str) -> dict:
    """What the layout promises, read off the PTX: vector loads, tensor-core instructions,
    local-memory spills."""
    loads = Counter(m.group(0) for m in _LOAD.finditer(ptx))
    # Loads that feed tl.dot in a pipelined loop go global -> shared with cp.async, whose
    # last operand is the bytes per copy (16: a vector load).
    async_copies = Counter(int(n, 0) for n in re.findall(
        r"cp\.async\.c[ga]\.shared\.global\s*\[[^]]*\],\s*\[[^]]*\],\s*(0x[0-9a-f]+|\d+)", ptx))
    return {
        "vector_loads": sum(n for op, n in loads.items() if ".v2." in op or ".v4." in op)
        + sum(n for size, n in async_copies.items() if size >= 8),
        "async_copies": dict(async_copies),
        "scalar_loads": sum(n for op, n in loads.items() if ".v2." not in op and ".v4." not in op),
        "loads": dict(loads),
        "mma": len(re.findall(r"\bmma\.sync", ptx)),
        "wgmma": len(re.findall(r"\bwgmma\.", ptx)),
        "spills": len(re.findall(r"\b(?:ld|st)\.local", ptx)),
        # fused multiply-adds round once where the reference rounds twice
        "fma": len(re.findall(r"\bfma\.rn\.f32", ptx)),
    }


# --- PTX: the widest global load of each kernel argument ------------------------------

_PTX_PARAM = re.compile(r"ld\.param\.[bu]64\s+(%rd\d+),\s*\[\w+_param_(\d+)\]")
_PTX_INSTR = re.compile(r"^\s*(?:@!?%p\d+\s+)?([a-z][\w.]*)\s+(.*?);", re.M)
_PTX_REG = re.compile(r"%[a-z]+\d+")
_PTX_BITS = {"b8": 8, "u8": 8, "s8": 8, "b16": 16, "u16": 16, "s16": 16, "f16": 16,
             "b32": 32, "u32": 32, "s32": 32, "f32": 32, "b64": 64, "u64": 64, "s64": 64}


def load_widths(ptx: str, arg_names: list[str]) -> dict[str, int]:
    """Bytes of the widest global load from each pointer argument: the address registers of
    every ld.global traced back, through the address arithmetic, to the parameters."""
    taint: dict[str, set[int]] = {}
    widest: dict[int, int] = {}
    for m in _PTX_PARAM.finditer(ptx):
        taint[m.group(1)] = {int(m.group(2))}
    for m in _PTX_INSTR.finditer(ptx):
        op, operands = m.group(1), m.group(2)
        regs = _PTX_REG.findall(operands)
        if op.startswith("ld.global"):
            parts = op.split(".")
            vec = next((int(p[1:]) for p in parts if p in ("v2", "v4", "v8")), 1)
            bits = next((_PTX_BITS[p] for p in parts if p in _PTX_BITS), 32)
            address = operands[operands.index("["):]
            for r in _PTX_REG.findall(address):
                for arg in taint.get(r, ()):
                    widest[arg] = max(widest.get(arg, 0), vec * bits // 8)
        elif regs and (op.startswith(("add", "sub", "mad", "mov", "cvt", "shl", "selp"))):
            sources = set().union(*(taint.get(r, set()) for r in regs[1:]))
            if sources:
                taint[regs[0]] = sources
    return {arg_names[i]: w for i, w in sorted(widest.items()) if i < len(arg_names)}


# --- SASS -------------------------------------------------------------------------------

_SASS_INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T\d]+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")


def _tool(name: str) -> str:
    from triton.backends.nvidia import __file__ as backend

    return os.path.join(os.path.dirname(backend), "bin", name)


@cache  # sass_summary and gemm_summary both read the same cubin's
def cubin_sass(cubin: bytes) -> tuple[str, str]:
    """(SASS listing, resource usage) of a cubin, by the cuobjdump Triton ships, kept in
    Triton's cache beside its compiles (keyed by the cubin and the Triton whose cuobjdump
    read it): the listing takes cuobjdump about 0.4 s of CPU whatever the kernel's size,
    most of its start, and tests/test_kernels_ptx.py's estimates read some 800 of them."""
    from triton.runtime.cache import get_cache_manager

    key = hashlib.sha256(cubin + f"cuobjdump of triton {triton.__version__}".encode()).hexdigest()
    store = get_cache_manager(key)
    kept = store.get_file("sass.json")
    if kept:
        with open(kept) as f:
            return tuple(json.load(f))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        sass = subprocess.run([_tool("cuobjdump"), "-sass", path], check=True,
                              capture_output=True, text=True).stdout
        usage = subprocess.run([_tool("cuobjdump"), "-res-usage", path], check=True,
                               capture_output=True, text=True).stdout
    store.put(json.dumps([sass, usage]), "sass.json", binary=False)  # (written whole: a rename)
    return sass, usage


def main_loop(sass: str) -> list[tuple[int, str]]:
    """(address, opcode) of every instruction of the main loop: the longest span closed by
    a backward branch. A kernel without one (a program per block column) is all of it."""
    instrs = [(int(m.group(1), 16), m.group(2), m.group(3)) for m in _SASS_INSTR.finditer(sass)]
    span = None
    for address, op, args in instrs:
        target = re.search(r"0x([0-9a-f]+)", args) if op.startswith("BRA") else None
        if target and int(target.group(1), 16) < address:
            start = int(target.group(1), 16)
            if span is None or address - start > span[1] - span[0]:
                span = (start, address)
    if span is None:  # straight-line: all but the trailing `BRA self` and padding
        return [(a, op) for a, op, _ in instrs if op not in ("BRA", "NOP")]
    return [(a, op) for a, op, _ in instrs if span[0] <= a <= span[1]]


def loop_mma_drains(sass: str) -> int:
    """Waits in the main loop until no wgmma of the warpgroup is in flight
    (`WARPGROUP.DEPBAR.LE gsb0, 0x0`): one before each HGMMA where ptxas serialized them
    (gemm.py, MMA_PIPELINED). A wait with a count above 0 (Triton 3.6 waits after each wgmma
    until at most 7 are pending: `wgmma.wait_group 15`, which ptxas clamps) leaves the others
    in flight."""
    loop = {address for address, _ in main_loop(sass)}
    return sum(1 for m in _SASS_INSTR.finditer(sass)
               if int(m.group(1), 16) in loop and m.group(2) == "WARPGROUP.DEPBAR.LE"
               and re.fullmatch(r"\s*gsb0\s*,\s*0x0\s*", m.group(3)))


def loop_spills(rows: list[dict]) -> list[str]:
    """The kernels of the rp1 layout among `rows` (scripts/inspect_kernels.py --sass rows) that
    spill registers inside their main loop: an LDL or STL there, a trip to local memory every
    iteration (the raw-layout GEMV, a baseline, is not checked). Named by type, family, arch,
    activation dtype and tile."""
    return [f"{r['type']} {r['family']} sm_{r['arch']} {r['act']} {r.get('config', '')}" for r in rows
            if not r["family"].startswith("gemv (raw") and {"LDL", "STL"} & set(r["loop_opcodes"])]


# Waits for every wgmma in flight a K step of a tile that promises its K loop a step
# (configs.mma_pipelined): the promised tiles drain 0-4 times a step, serialized ones once an HGMMA
PROMISED_MMA_DRAINS = 4


def serialized_mmas(rows: list[dict]) -> list[str]:
    """The tiles among `rows` (scripts/inspect_kernels.py --sass rows) that promise their K
    loop a step and still wait for every wgmma in flight more than PROMISED_MMA_DRAINS times a
    step: ptxas serialized their wgmmas (the promise kept it from doing so where it was
    measured, with that Triton). Named as loop_spills names them."""
    return [f"{r['type']} {r['family']} sm_{r['arch']} {r['act']} {r.get('config', '')}" for r in rows
            if "HGMMA" in r["loop_opcodes"] and r["mma_drains"] > PROMISED_MMA_DRAINS
            and configs.mma_pipelined(r["type"], r["config"]["BM"], r["act"])]


# Dense fp16/bf16 tensor-core rate of an H100/H200 SM: 989 TFLOP/s over 132 SMs at 1.83 GHz.
TENSOR_FLOP_PER_SM_CYCLE = 4096


def gemm_summary(compiled, num_warps: int, bm: int, bn: int, block: int) -> dict:
    """The GEMM's main loop against the tensor cores, estimated like the GEMV's budget (sm_90,
    fp16 activations): per loop iteration a program multiplies BM x BN x BLOCK, which the
    tensor cores take FLOPs / 4096 SM-cycles for; its other instructions (dequantization,
    addressing, layout conversions) take their count x warps / 4 issue cycles. If the MMA is
    waited for inside the iteration (`wgmma.wait_group 0`), the two add up; if not, the longer
    one is the time. The result is the estimated fraction of an fp16 matmul's speed that the
    instruction issue allows (memory traffic and latency are not in it)."""
    sass, _ = cubin_sass(compiled.asm["cubin"])
    loop = main_loop(sass)
    tensor = sum(op.startswith(("HGMMA", "HMMA")) for _, op in loop)
    other = len(loop) - tensor
    waits = [int(n) for n in re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", compiled.asm["ptx"])]
    overlap = bool(waits) and min(waits) > 0
    tensor_cycles = 2 * bm * bn * block / TENSOR_FLOP_PER_SM_CYCLE
    issue_cycles = other * num_warps / 4
    time = max(tensor_cycles, issue_cycles) if overlap else tensor_cycles + issue_cycles
    mma_flops, mma_rate = loop_mma_flops(sass, num_warps)
    return {"mma_flops_per_iteration": mma_flops, "mma_peak_fraction": mma_rate,
            "tile": f"{bm}x{bn}x{block}", "bm": bm, "bn": bn, "warps": num_warps,
            "tensor_cycles_per_iteration": tensor_cycles, "issue_cycles_per_iteration": issue_cycles,
            "stages": compiled.metadata.num_stages, "tensor_instructions": tensor,
            "other_instructions_per_tensor_instruction": round(other / tensor, 1) if tensor else None,
            "mma_overlaps_dequant": overlap,
            "estimated_fraction_of_fp16_mma": round(tensor_cycles / time, 3)}


def resources(compiled) -> dict:
    """Registers a thread, shared memory a block (bytes: what Triton checks against the
    device's limit at launch) and spills (local-memory bytes plus STL/LDL instructions) of a
    compiled kernel, from its cubin."""
    sass, usage = cubin_sass(compiled.asm["cubin"])
    local = int(re.search(r"LOCAL:(\d+)", usage).group(1))
    # -res-usage counts static shared memory only; Triton's pipelining buffers are dynamic
    return {"registers": int(re.search(r"REG:(\d+)", usage).group(1)),
            "shared_memory": max(int(re.search(r"SHARED:(\d+)", usage).group(1)),
                                 compiled.metadata.shared),
            "spills": local + len(re.findall(r"\b(?:STL|LDL)\b", sass))}


def sass_summary(compiled, num_warps: int, bytes_per_iteration: int) -> dict:
    """The static measures of one compiled kernel (see the module docstring)."""
    sass, _ = cubin_sass(compiled.asm["cubin"])
    loop = main_loop(sass)
    res = resources(compiled)
    registers, shared = res["registers"], res["shared_memory"]
    threads = 32 * num_warps
    per_byte = len(loop) * num_warps / bytes_per_iteration
    # registers are allocated per warp in units of 256 (8 per thread)
    by_registers = 65536 // (threads * -(-registers // 8) * 8)
    by_shared = (228 * 1024) // shared if shared else 32
    return {
        "loop_instructions": len(loop),
        "loop_opcodes": dict(Counter(op.split(".")[0] for _, op in loop).most_common()),
        # global loads the loop waits on itself (LDG; the pipeliner's copies ahead are LDGSTS),
        # with their widths: one under 32 bits a thread is one the pipeliner would not take
        "loop_global_loads": dict(Counter(op for _, op in loop if op.startswith("LDG.")).most_common()),
        # waits of the warpgroup on its wgmmas in the loop, of any depth (Triton 3.6 waits after
        # each wgmma until at most 7 are pending: 16 a step, not serialized)
        "mma_waits": sum(1 for _, op in loop if op.startswith("WARPGROUP.DEPBAR")),
        # of those, the ones that wait for every wgmma in flight: one before each HGMMA where
        # ptxas serialized them (gemm.py, MMA_PIPELINED), 0-3 a step where they are in flight
        # together (loop_mma_drains)
        "mma_drains": loop_mma_drains(sass),
        "weight_bytes_per_iteration": bytes_per_iteration,
        "warp_instructions_per_byte": round(per_byte, 4),
        "bandwidth_bound": round(min(1.0, BUDGET / per_byte), 3),
        "registers": registers,
        "shared_memory": shared,
        "spills": res["spills"],
        "programs_per_sm": min(by_registers, by_shared, 2048 // threads, 32),
    }


# The per-M model of issue #31 (BENCHMARKS.md "Paths by M"), in seconds on an H200: 4.8 TB/s,
# 132 SMs at 1.98 GHz, 4 warp-instructions an SM-cycle, 989 TFLOP/s dense fp16 (HGMMA; HMMA
# at half of it).
H200_BANDWIDTH = 4.8e12
H200_CLOCK = 1.98e9
H200_FP16_PEAK = 989e12
# HMMA shapes by the suffix of their SASS opcode (M, N, K of one warp's instruction)
_HMMA_SHAPES = {"16816": (16, 8, 16), "1688": (16, 8, 8)}
_MMA_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T\d]+\s+)?(HGMMA\.(\d+)x(\d+)x(\d+)|HMMA\.(\d+))")


def loop_mma_flops(sass: str, num_warps: int) -> tuple[int, float]:
    """(FLOPs of the main loop's MMA instructions for one program's iteration, the fraction of
    the dense fp16 peak they run at): an HGMMA (warpgroup-wide, 4 warps) does 2 M N K at the
    peak, an HMMA (one warp's) 2 M N K at half of it."""
    addresses = {a for a, _ in main_loop(sass)}
    flops, rate = 0, 1.0
    for m in _MMA_LINE.finditer(sass):
        if int(m.group(1), 16) not in addresses:
            continue
        if m.group(3):
            flops += 2 * int(m.group(3)) * int(m.group(4)) * int(m.group(5)) * max(1, num_warps // 4)
        else:
            mm, nn, kk = _HMMA_SHAPES[m.group(6)]
            flops += 2 * mm * nn * kk * num_warps
            rate = 0.5
    return flops, rate


# What x @ W.T can take at M rows (configs.matmul_choice names them): the GEMV, the fused
# GEMM's three tiles, or the weight dequantized, then torch.matmul
CHOICES = ("gemv", "gemm_bm16", "gemm_bm32", "gemm_bm64", "gemm_bm128", "dequantize+matmul")
# the M the per-M table is estimated at (scripts/estimate_paths.py)
PATH_MS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)


def _issue_seconds(programs: int, iterations: int, loop_instructions: int, num_warps: int) -> float:
    """Programs on the busiest SM x loop iterations x the loop's warp-instructions, issued
    4 an SM-cycle."""
    busiest = -(-programs // SMS)
    return busiest * iterations * loop_instructions * num_warps / ISSUE_PER_SM_CYCLE / H200_CLOCK


def matmul_path_estimates(type_name: str, type_size: int, dequantize_row: dict,
                          gemm_rows: dict[int, dict], gemv_rows: dict[int, dict] | None = None,
                          ms=(16, 128, 2048), shape=SHAPE, act: str = "fp16") -> list[dict]:
    """Estimated time of x @ W.T for `shape` (N, K) on an H200 at each M of `ms` by every path
    there is a compile for (the launch configurations for x of dtype `act`, as compiled),
    against an fp16 matmul (the same product with an fp16 weight) and the ideal (the same
    with the quantized weight's bytes), in seconds; the model of issue #31:
    - a kernel's issue: programs on the busiest SM x loop iterations x the loop's warp-
      instructions / 4 an SM-cycle (`_issue_seconds`);
    - fused GEMM (`gemm_rows` by BM, or by (BM, SPLIT_K) where compiled at each split K, which
      is a constexpr of the loop, else any of that BM's, whose loops differ by an instruction
      or so: sass_summary + gemm_summary + "config" of its compile): at
      each tile BM, its config at that M (configs.gemm_config with that BM on the sm_90
      record: BN, split K), ceil(M/BM) x ceil(N/BN) x SPLIT_K programs of K/BLOCK/STEP_BLOCKS/SPLIT_K
      iterations; time = max(issue, tensor (the same programs x iterations x the loop's MMA
      FLOPs / the per-SM peak: HGMMA at the dense fp16 peak, HMMA at half), the quantized
      weight's bytes once / bandwidth);
    - GEMV (`gemv_rows`: its compiles by rows of x a program, XR = 1, 2, 4: gemv, gemv_m2,
      gemv_m4; its config at M for `shape`): ceil(M / XR) programs a weight tile, each
      unpacking the whole weight once for its XR rows: their issue, at least the bytes once;
    - dequantize+matmul: the dequantize kernel (the larger of its issue and its bytes:
      quantized read, fp16 written) + the fp16 matmul;
    - fp16 = max(2 N K bytes / bandwidth, 2 M N K / peak); ideal = the same with the
      quantized weight's bytes.
    Estimates, not timings: latency, L2, launch overheads, x's and the output's bytes, split
    K's atomics, the GEMVs' x preparation and cuBLAS's own efficiency are not in them.
    "times_serial" / "best_serial" / "speedup_serial": the same with a fused tile's issue and
    tensor time added, not overlapped (its MMA waited for within the iteration, as the SASS
    of the swapped tiles does, and one program an SM at BM = 128): the conservative model the
    rule is chosen by past configs.FUSED_MAX_M (scripts/estimate_paths.py's rule), so that an
    MMA-bound fused tile is not taken for a free one at prefill sizes.
    Each row: "times" (seconds by choice, configs.CHOICES' names), "best", "dispatched" (the
    path matmul_path takes today) and its "tile", "speedup" over fp16 and "fraction_of_ideal"
    of the dispatched choice; also the older measures (fused GEMM at the dispatched or BM-by-M
    tile and dequantize+matmul as fractions of fp16, the break-even M of BM = 64 against
    dequantize+matmul)."""
    n, k = shape
    block = FORMATS[type_name].block_size
    n_blocks = k // block
    weight_bytes = n * k // block * type_size
    per_sm_peak = H200_FP16_PEAK / SMS
    memory = weight_bytes / H200_BANDWIDTH

    def fp16(m):
        return max(2 * n * k / H200_BANDWIDTH, 2 * m * n * k / H200_FP16_PEAK)

    def ideal(m):
        return max(memory, 2 * m * n * k / H200_FP16_PEAK)

    dq_cfg = dequantize_row["config"]
    dequantize = max(_issue_seconds(-(-n // dq_cfg["BN"]) * n_blocks, 1,
                                    dequantize_row["loop_instructions"], dq_cfg["num_warps"]),
                     (weight_bytes + 2 * n * k) / H200_BANDWIDTH)

    def fused_gemm(m, bm, serial=False):
        cfg = configs.gemm_config(type_name, block, m, n, n_blocks, configs.KNOWN_DEVICES[90],
                                  act, bm=bm)
        g = gemm_rows.get((bm, cfg["SPLIT_K"])) or gemm_rows.get(bm) or next(
            row for key, row in gemm_rows.items() if isinstance(key, tuple) and key[0] == bm)
        assert (g["bm"], g["bn"]) == (cfg["BM"], cfg["BN"]), (g["tile"], cfg)
        assert g.get("config", cfg).get("STEP_BLOCKS", 1) == cfg["STEP_BLOCKS"], (g["config"], cfg)
        split_k = cfg["SPLIT_K"]
        programs = -(-m // bm) * -(-n // cfg["BN"]) * split_k
        iterations = -(-n_blocks // (split_k * cfg["STEP_BLOCKS"]))  # a loop step: STEP_BLOCKS
        issue = _issue_seconds(programs, iterations, g["loop_instructions"], cfg["num_warps"])
        busiest = -(-programs // SMS)
        tensor = busiest * iterations * g["mma_flops_per_iteration"] / (
            per_sm_peak * g["mma_peak_fraction"])
        return max(issue + tensor if serial else max(issue, tensor), memory)

    bms = sorted({key if isinstance(key, int) else key[0] for key in gemm_rows})
    def gemv(m):
        c = configs.gemv_dot_config(type_name, m, n, n_blocks, configs.KNOWN_DEVICES[90], act)
        g = gemv_rows[c["XR"]]
        assert g["config"]["BN"] == c["BN"] and g["config"]["XR"] == c["XR"], (g["config"], c)
        return max(_issue_seconds(-(-n // c["BN"]) * c["SPLIT_K"] * -(-m // c["XR"]),
                                  -(-n_blocks * c["PARTS"] // c["SPLIT_K"]),
                                  g["loop_instructions"], c["num_warps"]), memory)

    def times(m, serial=False):
        t = {f"gemm_bm{bm}": fused_gemm(m, bm, serial) for bm in bms}
        if gemv_rows:
            t = {"gemv": gemv(m), **t}
        t["dequantize+matmul"] = dequantize + fp16(m)
        return t

    break_even = (next((m for m in range(64, 8193, 64)
                        if dequantize + fp16(m) < fused_gemm(m, 64)), None)
                  if 64 in bms else None)
    rows = []
    for m in ms:
        t, t_serial = times(m), times(m, serial=True)
        choice = configs.matmul_choice(type_name, block, m)
        bm = int(choice[len("gemm_bm"):]) if choice.startswith("gemm_bm") else \
            configs.gemm_bm(type_name, block, m)
        fused = t.get(f"gemm_bm{bm}")
        ref = fp16(m)
        row = {"type": type_name, "M": m, "N": n, "K": k, "fp16_us": ref * 1e6,
               "ideal_us": ideal(m) * 1e6,
               "times_us": {c: v * 1e6 for c, v in t.items()},
               "best": min(t, key=t.get),
               "times_serial_us": {c: v * 1e6 for c, v in t_serial.items()},
               "best_serial": min(t_serial, key=t_serial.get),
               "dispatched": "gemm" if choice.startswith("gemm") else choice,
               "tile": choice,
               # the older measures (inspect_kernels.py --sass)
               "fp16_matmul_us": round(ref * 1e6, 1),
               "fused_gemm_fraction": round(ref / fused, 2) if fused else None,
               "dequantize_matmul_fraction": round(ref / t["dequantize+matmul"], 2),
               "break_even_m": break_even}
        if choice in t:
            row["speedup"] = ref / t[choice]
            row["fraction_of_ideal"] = ideal(m) / t[choice]
            row["speedup_serial"] = ref / t_serial[choice]
        rows.append(row)
    return rows


# Expert stacks the expert products are estimated on ((E, top, N, K), by name): Qwen3-30B-A3B's
# (128 experts, 8 a token; gate and up as one 1536 x 2048 product, down 2048 x 768) and
# DeepSeek-V3's (256, 8; 4096 x 7168 and 7168 x 2048)
EXPERT_SHAPES = {"qwen3-30b-a3b gate_up": (128, 8, 1536, 2048),
                 "qwen3-30b-a3b down": (128, 8, 2048, 768),
                 "deepseek-v3 gate_up": (256, 8, 4096, 7168),
                 "deepseek-v3 down": (256, 8, 7168, 2048)}
# the batch sizes (tokens) they are estimated at: decode, up to vLLM's graph capture size
EXPERT_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def expert_path_estimates(type_name: str, type_size: int, gemv_row: dict, tile_rows: dict[int, dict],
                          stack: tuple[int, int, int, int], tokens=EXPERT_TOKENS,
                          act: str = "fp16", gemv_x_rows: dict[int, dict] | None = None,
                          gemv_one_row: dict | None = None) -> list[dict]:
    """Estimated time of the expert products of `tokens` tokens on an expert stack (E, top, N,
    K) on an H200, by each path (dispatch.expert_path's), against the same products with fp16
    weights and the ideal (the quantized weights of the experts chosen, read once), in the
    dense model's terms (matmul_path_estimates), routing uniform (configs.routed_rows_per_expert):
    - the GEMV a (token, slot) pair (`gemv_row`: the moe_gemv compile, or `gemv_one_row`, the
      moe_gemv_r1 one, where the dispatcher's config for that many pairs at N x K takes one
      weight row a thread): its programs x the GEMV's issue at one row, and each pair's read
      of its expert's weight: the pairs of one expert lie apart in the launch (token order),
      and L2 (50 MB) holds a few experts of a stack (Qwen3-30B-A3B's 128 gate_up experts are
      226 MB in Q4_K), so no read is counted as a hit;
    - the GEMV on XR of an expert's slots a program (`gemv_x_rows` by XR: the moe_gemv_x2 /
      _x4 compiles; the dispatcher's config for that many pairs): the sort's tiles of XR slots
      (configs.expert_tiles) x the GEMV's programs a tile, at the compile's issue, and each tile's
      read of its expert's weight;
    - the tiles at BM (`tile_rows` by BM: the moe_m16 / m32 / m64 compiles, sass_summary +
      gemm_summary; moe_config's tile at that BM, compiled with K whole: split 2 measured
      0-14 instructions more a K step at BM = 16, Q5_K's 78, 14%, where the rule takes the
      GEMV): configs.expert_tiles x ceil(N / BN) x SPLIT_K programs of
      K / (BLOCK STEP_BLOCKS SPLIT_K) iterations; time = max(issue, tensor, the chosen
      experts' weights once), or (serial) issue + tensor, the rule's model (as the dense one).
    Each row: tokens, "rows_per_expert", "times_us" and "times_serial_us" by choice ("gemv",
    "tiles_bm16", ...: configs.moe_choice's names), "best_serial", "dispatched"
    (dispatch.expert_path's path) and its "tile" (the choice, with moe_config's BM), its
    "speedup" over fp16 and "fraction_of_ideal"."""
    n_experts, top, n, k = stack
    block = FORMATS[type_name].block_size
    n_blocks = k // block
    expert_bytes = n * k // block * type_size
    per_sm_peak = H200_FP16_PEAK / SMS
    dev = configs.KNOWN_DEVICES[90]
    rows = []
    for t in tokens:
        pairs = t * top
        # the dispatcher's GEMV at this many pairs (dispatch._expert_kernels): split K for them
        c = configs.gemv_dot_config(type_name, pairs, n, n_blocks, dev, act, x_rows=1)
        gemv_programs = -(-n // c["BN"]) * c["SPLIT_K"]
        gemv_iterations = -(-n_blocks * c["PARTS"] // c["SPLIT_K"])
        chosen = configs.experts_chosen(t, top, n_experts)
        r = pairs / chosen
        memory = chosen * expert_bytes / H200_BANDWIDTH
        flops = 2 * pairs * n * k
        fp16 = max(chosen * 2 * n * k / H200_BANDWIDTH, flops / H200_FP16_PEAK)
        ideal = max(memory, flops / H200_FP16_PEAK)
        g = gemv_row if c["BN"] == gemv_row["config"]["BN"] else gemv_one_row
        assert g and g["config"]["BN"] == c["BN"], ("no compile of the expert GEMV at", c)
        gemv = max(_issue_seconds(pairs * gemv_programs, gemv_iterations, g["loop_instructions"],
                                  c["num_warps"]), pairs * expert_bytes / H200_BANDWIDTH)
        times, serial = {"gemv": gemv}, {"gemv": gemv}
        for xr, g in sorted((gemv_x_rows or {}).items()):
            c = configs.gemv_dot_config(type_name, pairs, n, n_blocks, dev, act, x_rows=xr)
            slot_tiles = configs.expert_tiles(t, top, n_experts, xr)
            iterations = -(-n_blocks * c["PARTS"] // c["SPLIT_K"])
            programs = math.ceil(slot_tiles) * -(-n // c["BN"]) * c["SPLIT_K"]
            times[f"gemv_x{xr}"] = serial[f"gemv_x{xr}"] = max(
                _issue_seconds(programs, iterations, g["loop_instructions"], c["num_warps"]),
                slot_tiles * expert_bytes / H200_BANDWIDTH)
        for bm, g in sorted(tile_rows.items()):
            cfg = configs.moe_config(type_name, block, bm, dev, act, n_blocks, bm=bm, n=n,
                                     routing=(t, top, n_experts))
            programs = math.ceil(configs.expert_tiles(t, top, n_experts, bm)) * -(-n // cfg["BN"]) * \
                cfg["SPLIT_K"]
            iterations = -(-n_blocks // (cfg["STEP_BLOCKS"] * cfg["SPLIT_K"]))
            issue = _issue_seconds(programs, iterations, g["loop_instructions"], cfg["num_warps"])
            tensor = -(-programs // SMS) * iterations * g["mma_flops_per_iteration"] / (
                per_sm_peak * g["mma_peak_fraction"])
            times[f"tiles_bm{bm}"] = max(issue, tensor, memory)
            serial[f"tiles_bm{bm}"] = max(issue + tensor, memory)
        path = expert_path(type_name, t, top, n_experts)
        xr = configs.moe_gemv_x_rows(type_name, r, 90)
        choice = ("gemv" if xr == 1 else f"gemv_x{xr}") if path == "gemv" else \
            f"tiles_bm{configs.moe_config(type_name, block, r, dev, act, n_blocks)['BM']}"
        row = {"type": type_name, "E": n_experts, "top": top, "N": n, "K": k, "tokens": t,
               "rows_per_expert": r, "fp16_us": fp16 * 1e6, "ideal_us": ideal * 1e6,
               "times_us": {ch: v * 1e6 for ch, v in times.items()},
               "times_serial_us": {ch: v * 1e6 for ch, v in serial.items()},
               "best_serial": min(serial, key=serial.get), "dispatched": path, "tile": choice}
        if choice in times:
            row["speedup"] = fp16 / times[choice]
            row["fraction_of_ideal"] = ideal / times[choice]
        rows.append(row)
    return rows


def shared_memory_of(kernel, sig: dict, constexprs: dict, capability: int, *, num_warps: int = 4,
                     num_stages: int = 3, fp_fusion: bool = True) -> int:
    """The shared memory (bytes) a compile of `kernel` (arguments as compile_kernel's) would
    record in metadata.shared, without the rest of the compile: Triton's own TTIR and TTGIR
    stages, then the shared-memory allocation that starts its LLVM stage, whose result that
    stage reads (`ttg.shared`). A quarter of a full compile's time for the float32 GEMM
    tiles (LLVM's O3 and ptxas are the rest); tests/test_kernels_ptx.py holds it equal to
    full compiles. Kept in Triton's cache (the compile's key), as cubin_sass's listings are:
    that test reads some 520 of them."""
    from triton._C.libtriton import ir, nvidia, passes
    from triton.backends.nvidia.compiler import get_ptx_version_from_options
    from triton.compiler.compiler import make_backend

    signature = {**sig, **{k: "constexpr" for k in constexprs}}
    names = list(signature)
    generic = set(getattr(kernel, "do_not_specialize", ()) or ())
    attrs = {(names.index(k),): [["tt.divisibility", 16]] for k in sig if k not in generic}
    src = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    target = GPUTarget("cuda", capability, 32)
    backend = make_backend(target)
    options = backend.parse_options({"num_warps": num_warps, "num_stages": num_stages,
                                     "enable_fp_fusion": fp_fusion})
    # kept in Triton's cache, as its compiles are, by their key and this function's source
    from triton.compiler.compiler import get_cache_invalidating_env_vars, get_cache_key
    from triton.runtime.cache import get_cache_manager

    key = get_cache_key(src, backend, options, env_vars=get_cache_invalidating_env_vars())
    key += inspect.getsource(shared_memory_of)
    store = get_cache_manager(hashlib.sha256(key.encode()).hexdigest())
    kept = store.get_file("shared_memory.json")
    if kept:
        with open(kept) as f:
            return json.load(f)
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    stages = {}
    backend.add_stages(stages, options, src.language)
    metadata = {}
    module = src.make_ir(target, options, backend.get_codegen_implementation(options),
                         backend.get_module_map(), context)
    for stage in ("ttir", "ttgir"):
        module = stages[stage](module, metadata)
    # the first passes of NVIDIA's make_llir, up to its shared-memory allocation
    pm = ir.pass_manager(module.context)
    passes.ttgpuir.add_combine_tensor_select_and_if(pm)
    passes.ttgpuir.add_allocate_warp_groups(pm, False)
    passes.convert.add_scf_to_cf(pm)
    passes.gluon.add_inliner(pm)
    nvidia.passes.ttgpuir.add_allocate_shared_memory_nv(
        pm, capability, get_ptx_version_from_options(options, backend.target.arch))
    pm.run(module, "allocate_shared_memory")
    shared = module.get_int_attr("ttg.shared") or 0
    store.put(json.dumps(shared), "shared_memory.json", binary=False)
    return shared


def family_shared_memory(family: str, type_name: str, capability: int = 90, act: str = "fp16"):
    """(shared memory in bytes, config) of kernel `family` as compile_family would compile it,
    by shared_memory_of."""
    fmt = FORMATS[type_name]
    kernel, sig, constexprs, cfg, _ = _spec(family, fmt, act, device(capability))
    return shared_memory_of(kernel, sig, constexprs, capability, num_warps=cfg["num_warps"],
                            num_stages=cfg.get("num_stages", 3),
                            fp_fusion=family not in ("dequantize", "embedding")), cfg
