"""Triton's interpreter: bfloat16 as a GPU computes it, and device calls at their cost.

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
runs.

And one cost: the interpreter patches `triton.language` at every call of a @triton.jit
function from a kernel (Triton 3.6 to 3.9: `InterpretedFunction.__call__` runs
`_patch_lang`, `inspect.getmembers` over four modules), although the kernel's launch
already patched it for the whole run. The dot and dequant functions are such calls, dozens
a program: measured, 40% of the time of `test_matmul_and_embedding` for IQ1_M.
`fast_device_calls` skips the repeat while the launch's patches are in place; what runs is
unchanged."""

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


def _language_patched(fn) -> bool:
    """Whether the patches `fn` needs are in place: the interpreter replaces the builtins of
    each triton.language module `fn` sees (triton.language with its math module and tensor
    class; triton.language.core, which Triton's own jit functions such as tl.zeros see) for
    a launch, and restores them after."""
    langs = [v for v in fn.__globals__.values() if v is tl or v is tl.core]
    probes = [tl.tensor.__add__]
    if tl in langs:
        probes += [tl.load, tl.math.exp]
    if tl.core in langs:
        probes += [tl.core.load]
    return not any(tl.core.is_builtin(f) for f in probes)


def fast_device_calls() -> None:
    """Patches the interpreter once: a @triton.jit function called from a running kernel
    runs without patching triton.language again. Elsewhere (no launch in progress, or a
    Triton whose interpreter is built otherwise) the interpreter's own call runs."""
    from triton.runtime import interpreter

    cls = interpreter.InterpretedFunction
    if getattr(cls, "gguf_repack_fast_calls", False) or not hasattr(interpreter, "_patch_lang"):
        return
    original = cls.__call__

    def call(self, *args, **kwargs):
        if not _language_patched(self.fn):
            return original(self, *args, **kwargs)
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # as the interpreter's own call reports it
            raise interpreter.InterpreterError(repr(e)) from e

    cls.__call__ = call
    cls.gguf_repack_fast_calls = True
