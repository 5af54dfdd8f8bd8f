"""A tiny emulator of the PTX that kernels inline (`tl.inline_asm_elementwise`), for the
instructions they use, after the PTX ISA's definitions: Triton's interpreter cannot run inline
PTX, and no GPU is at hand, so this is how the inline code itself is tested. Registers are
numpy uint32 arrays: one run tests many inputs at once."""

from __future__ import annotations

import re

import numpy as np

U32 = np.uint32


def _byte(x, i):
    return (x >> U32(8 * i)) & U32(0xFF)


def prmt(a, b, c):
    """prmt.b32 (default mode): byte k of the result is byte (c's nibble k & 7) of {b, a},
    or that byte's sign bit replicated when the nibble's bit 3 is set."""
    out = np.zeros_like(a)
    for k in range(4):
        sel = (c >> U32(4 * k)) & U32(0xF)
        idx = sel & U32(7)
        picked = np.zeros_like(a)
        for i in range(8):
            src = _byte(a, i) if i < 4 else _byte(b, i - 4)
            picked = np.where(idx == i, src, picked)
        picked = np.where(sel & U32(8), np.where(picked & U32(0x80), U32(0xFF), U32(0)), picked)
        out |= picked << U32(8 * k)
    return out


def lop3(a, b, c, lut):
    out = np.zeros_like(a)
    for i in range(8):
        if lut >> i & 1:
            out |= (a if i & 4 else ~a) & (b if i & 2 else ~b) & (c if i & 1 else ~c)
    return out


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float64 values (exact results, in bfloat16's normal range) rounded to bfloat16, to
    nearest, ties to even, in one rounding: the uint32 of their 16 bits."""
    bits = np.asarray(x, np.float64).view(np.uint64)
    keep = np.uint64(45)  # float64's 52 mantissa bits, bfloat16's 7
    lsb = (bits >> keep) & np.uint64(1)
    rounded = (bits + (np.uint64(1) << (keep - np.uint64(1))) - np.uint64(1) + lsb) >> keep << keep
    return (rounded.view(np.float64).astype(np.float32).view(U32) >> U32(16)).astype(U32)


def fma_bf16x2(a, b, c):
    """fma.rn.bf16x2: each half a * b + c, computed exactly, rounded once."""
    def halves(w):
        return [((w >> U32(16 * k)) & U32(0xFFFF)) << U32(16) for k in (0, 1)]
    out = np.zeros_like(a)
    for k, (x, y, z) in enumerate(zip(halves(a), halves(b), halves(c))):
        f = [v.view(np.float32).astype(np.float64) for v in (x, y, z)]
        out |= bf16_bits(f[0] * f[1] + f[2]) << U32(16 * k)
    return out


def fma_f16x2(a, b, c):
    """fma.rn.f16x2: each half a * b + c, computed exactly (float64 holds the product and sum
    of float16 values exactly), rounded once to float16 (numpy's rounding: to nearest, ties to
    even)."""
    out = np.zeros_like(a)
    for k in (0, 1):
        f = [((w >> U32(16 * k)) & U32(0xFFFF)).astype(np.uint16).view(np.float16).astype(np.float64)
             for w in (a, b, c)]
        out |= (f[0] * f[1] + f[2]).astype(np.float16).view(np.uint16).astype(U32) << U32(16 * k)
    return out


def _value(token, regs, n):
    token = token.strip()
    if token.startswith("0f"):
        return np.full(n, int(token[2:], 16), U32)
    if re.fullmatch(r"-?(0x[0-9a-fA-F]+|\d+)", token):
        return np.full(n, int(token, 0) & 0xFFFFFFFF, U32)
    return regs[token]


def run(ptx: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run the instructions of `ptx` (an inline-asm body, `$i` operands) with the given
    operand values (uint32 arrays); returns every register, operands included."""
    regs = {k: np.asarray(v, U32) for k, v in inputs.items()}
    n = len(next(iter(regs.values())))
    body = ptx.strip().removeprefix("{").removesuffix("}")
    for instr in filter(None, (s.strip() for s in body.split(";"))):
        if instr.startswith(".reg"):
            continue
        op, operands = instr.split(None, 1)
        if op == "mov.b32" and operands.startswith("{"):  # a word into its two halves
            pair, src = operands.split("}")
            lo, hi = (d.strip() for d in pair.strip("{ ").split(","))
            word = _value(src.strip(" ,"), regs, n)
            regs[lo], regs[hi] = word & U32(0xFFFF), word >> U32(16)
            continue
        dst, *srcs = [s.strip() for s in operands.split(",")]
        v = [_value(s, regs, n) for s in srcs]
        if op == "mov.b32":
            r = v[0]
        elif op == "and.b32":
            r = v[0] & v[1]
        elif op == "or.b32":
            r = v[0] | v[1]
        elif op == "xor.b32":
            r = v[0] ^ v[1]
        elif op == "fma.rn.bf16x2":
            r = fma_bf16x2(*v)
        elif op == "fma.rn.f16x2":
            r = fma_f16x2(*v)
        elif op == "shr.u32":
            r = v[0] >> v[1]
        elif op == "shr.s32":
            r = (v[0].view(np.int32) >> v[1].view(np.int32)).view(U32)
        elif op == "shl.b32":
            r = v[0] << v[1]
        elif op == "prmt.b32":
            r = prmt(*v)
        elif op == "lop3.b32":
            r = lop3(v[0], v[1], v[2], int(srcs[3], 0))
        elif op == "sub.f16x2":
            r = (v[0].view(np.float16) - v[1].view(np.float16)).view(U32)
        elif op == "sub.f32":
            r = (v[0].view(np.float32) - v[1].view(np.float32)).view(U32)
        else:
            raise NotImplementedError(op)
        regs[dst] = r.astype(U32)
    return regs
