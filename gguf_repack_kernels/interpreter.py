"""Triton's interpreter and bfloat16.

Under TRITON_INTERPRET=1 the kernels run on CPU tensors, the code a GPU runs, which is how
this project checks them without a GPU. The interpreter keeps bfloat16 values as their
uint16 bits, and two of its steps then differ from a GPU's (Triton 3.6 to 3.9; bfloat16 is
"not supported yet" by the interpreter, triton-lang/triton#11584):

- tl.dot hands the bits to numpy's matmul as integers (values around 1e10 for inputs in
  [-2, 2]). A GPU's tensor cores multiply bfloat16 values exactly and add the products in
  float32; numpy does the same with the operands widened to float32 first.
- float32 -> bfloat16 (`.to(tl.bfloat16)`) drops the low 16 bits. A GPU rounds to nearest,
  ties to even (cvt.rn.bf16.f32), as torch's .to(torch.bfloat16) does.

This module makes the two steps what a GPU computes, so every kernel taking bfloat16 x
(vLLM's default activation dtype) or writing bfloat16 can be checked on CPU. Applied on
import of the kernels when the interpreter is on (gguf_repack_kernels/__init__.py); on a GPU nothing here
runs."""

from __future__ import annotations

import numpy as np
import triton.language as tl


def bfloat16_bits(values: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16, to nearest, ties to even: the uint16 bits."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16
    quiet_nan = (bits >> 16) | np.uint32(0x40)  # a NaN stays a NaN (its sign kept)
    return np.where(np.isnan(values), quiet_nan, rounded).astype(np.uint16)


def gpu_bfloat16() -> None:
    """Patches the interpreter once: bfloat16 dot operands widened to float32 (exact), and
    float32 -> bfloat16 rounded to nearest even."""
    from triton.runtime.interpreter import InterpreterBuilder, TensorHandle

    if getattr(InterpreterBuilder, "gguf_repack_bfloat16", False):
        return
    create_dot, cast_impl = InterpreterBuilder.create_dot, InterpreterBuilder.cast_impl

    def dot(self, a, b, d, *args, **kwargs):
        a, b = (cast_impl(self, v, tl.float32) if v.dtype.scalar == tl.bfloat16 else v for v in (a, b))
        return create_dot(self, a, b, d, *args, **kwargs)

    def cast(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            return TensorHandle(bfloat16_bits(src.data), tl.bfloat16)
        return cast_impl(self, src, dst_type)

    InterpreterBuilder.create_dot, InterpreterBuilder.cast_impl = dot, cast
    InterpreterBuilder.gguf_repack_bfloat16 = True
