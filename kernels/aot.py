"""Ahead-of-time compilation for a GPU target, no GPU needed: the PTX shows what a GPU would
run (vector loads, tensor-core instructions, spills). Used by scripts/inspect_kernels.py and
the tests. Must run without TRITON_INTERPRET (an interpreted kernel cannot be compiled).

Kernels are compiled with the specialization a real launch gets: every pointer 16-byte
aligned and every integer argument divisible by 16 (`tt.divisibility`), which is what lets
Triton emit vector loads; without it Triton assumes nothing and emits scalar ones.
"""

from __future__ import annotations

import re
from collections import Counter

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from . import configs
from .dequantize import dequantize_kernel
from .embedding import gather_rows_kernel
from .gemm import gemm_kernel
from .gemv import gemv_kernel
from .registry import FORMATS

PLANES = ["P0", "P1", "P2", "P3", "P4", "TABLE"]
FAMILIES = ("dequantize", "gemv", "gemm", "embedding")


def _spec(family: str, block_size: int, act: str):
    """(kernel, signature, constexprs) of one family at its default configuration."""
    planes = {p: "*i8" for p in PLANES}
    if family == "dequantize":
        cfg = configs.dequantize_config(block_size)
        sig = {**planes, "OUT": f"*{act}", "N": "i32", "B": "i32"}
        return dequantize_kernel, sig, {"BLOCK": block_size, "BN": cfg["BN"]}, cfg
    if family == "embedding":
        cfg = configs.embedding_config(block_size)
        sig = {**planes, "IDS": "*i32", "OUT": f"*{act}", "N": "i32", "B": "i32", "n_ids": "i32"}
        return gather_rows_kernel, sig, {"BLOCK": block_size, "BI": cfg["BI"]}, cfg
    common = {**planes, "X": f"*{act}", "OUT": "*fp32", "M": "i32", "N": "i32", "B": "i32",
              "stride_xm": "i32", "stride_om": "i32"}
    if family == "gemv":
        cfg = configs.gemv_config(block_size, 4096, 4096 // block_size, 132)
        return gemv_kernel, common, {"BLOCK": block_size, "BN": cfg["BN"], "M_PAD": 1,
                                     "SPLIT_K": cfg["SPLIT_K"]}, cfg
    if family == "gemm":
        cfg = configs.gemm_config(block_size, 64)
        return gemm_kernel, {**common, "OUT": f"*{act}"}, {
            "BLOCK": block_size, "BM": cfg["BM"], "BN": cfg["BN"], "IEEE": act == "fp32"}, cfg
    raise ValueError(family)


def compile_ptx(family: str, type_name: str, capability: int = 90, act: str = "fp16") -> str:
    """PTX of kernel `family` for type `type_name` on sm_<capability> (activations `act`)."""
    fmt = FORMATS[type_name]
    kernel, sig, constexprs, cfg = _spec(family, fmt.block_size, act)
    return compile_kernel(kernel, sig, {**constexprs, "DQ": fmt.dequant}, capability,
                          num_warps=cfg["num_warps"],
                          fp_fusion=family not in ("dequantize", "embedding"))


def compile_kernel(kernel, sig: dict, constexprs: dict, capability: int, *, num_warps: int = 4,
                   fp_fusion: bool = True) -> str:
    """PTX of any @triton.jit kernel: `sig` types its runtime arguments (marked 16-divisible
    unless the kernel never specializes them), `constexprs` fixes the rest."""
    signature = {**sig, **{k: "constexpr" for k in constexprs}}
    names = list(signature)
    # as a launch would: every argument 16-divisible, but those the kernel never specializes
    generic = set(getattr(kernel, "do_not_specialize", ()) or ())
    attrs = {(names.index(k),): [["tt.divisibility", 16]] for k in sig if k not in generic}
    src = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    options = {"num_warps": num_warps, "enable_fp_fusion": fp_fusion}
    compiled = triton.compile(src, target=GPUTarget("cuda", capability, 32), options=options)
    return compiled.asm["ptx"]


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
