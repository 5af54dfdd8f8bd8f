"""Triton's interpreter: bfloat16 as a GPU computes it, and device calls at their cost.

Under TRITON_INTERPRET=1 the kernels run on CPU tensors, the code a GPU runs, which is how
this project checks them without a GPU. The interpreter keeps bfloat16 values as their
uint16 bits, and two of its steps then differ from a GPU's (Triton 3.6 to 3.9; bfloat16 is
"not supported yet" by the interpreter, triton-lang/triton#11584):

- tl.dot hands the bits to numpy's matmul as integers (values around 1e10 for inputs in
  [-2, 2]). A GPU's tensor cores multiply bfloat16 values exactly and add the products in
  float32; numpy does the same with the operands widened to float32 first.
- float32 -> bfloat16 (`.to(tl.bfloat16)`) drops the low 16 bits. A GPU rounds to nearest,
  ties to even (cvt.rn.bf16.f32), as torch's .to(torch.bfloat16) does. From float16 or an
  integer the interpreter converts the bits, not the value; to an integer, likewise; and
  bfloat16 -> float32 flushes subnormals to zero, which a GPU keeps.

- bfloat16 arithmetic (+, -, *, /, fma, negation, comparisons, min and max) runs on the
  bits as integers too. A GPU computes on the values (HFMA2.BF16 and its kin on sm_80+),
  rounding each result to bfloat16.

This module makes these steps what a GPU computes, so every kernel taking bfloat16 x
(vLLM's default activation dtype), computing in it (the fused GEMM's bfloat16 dequant
functions) or writing it can be checked on CPU. Arithmetic is done in float32 and rounded
to bfloat16 once more: a bfloat16 product is exact in float32, a sum or an fma may round
twice where a GPU rounds once (a result within float32's rounding of a bfloat16 tie), and
an `a * b + c` that a GPU fuses into one fma rounds here twice, as in float16. Applied on
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


# the interpreter's float operations that take bfloat16 operands (InterpreterBuilder's names)
BFLOAT16_ARITHMETIC = ("create_fadd", "create_fsub", "create_fmul", "create_fdiv", "create_fma",
                       "create_fneg", "create_minimumf", "create_maximumf", "create_minnumf",
                       "create_maxnumf")
BFLOAT16_COMPARISONS = tuple(f"create_fcmp{c}" for c in (
    "OLT", "OGT", "OLE", "OGE", "OEQ", "ONE", "ULT", "UGT", "ULE", "UGE", "UEQ", "UNE"))


def gpu_bfloat16() -> None:
    """Patches the interpreter once: bfloat16 dot operands widened to float32 (exact),
    float32 and float16 -> bfloat16 rounded to nearest even, and bfloat16 arithmetic done on
    the values (in float32, rounded to bfloat16)."""
    from triton.runtime.interpreter import InterpreterBuilder, TensorHandle

    if getattr(InterpreterBuilder, "gguf_repack_bfloat16", False):
        return
    create_dot, cast_impl = InterpreterBuilder.create_dot, InterpreterBuilder.cast_impl

    def widened(self, v):  # bfloat16 -> float32 exactly, subnormals kept (Triton's flushes them)
        if v.dtype.scalar != tl.bfloat16:
            return v
        bits = np.asarray(v.data).view(np.uint16).astype(np.uint32) << np.uint32(16)
        return TensorHandle(bits.view(np.float32), tl.float32)

    def dot(self, a, b, d, *args, **kwargs):
        return create_dot(self, widened(self, a), widened(self, b), d, *args, **kwargs)

    def cast(self, src, dst_type):
        to_bf16, from_bf16 = dst_type.scalar == tl.bfloat16, src.dtype.scalar == tl.bfloat16
        if to_bf16 and not from_bf16:  # a float or an integer: its value, rounded
            return TensorHandle(bfloat16_bits(src.data.astype(np.float32)), tl.bfloat16)
        if from_bf16 and not to_bf16:
            return cast_impl(self, widened(self, src), dst_type)
        return cast_impl(self, src, dst_type)

    def on_values(op, rounded):
        def run(self, *args):
            if not any(a.dtype.scalar == tl.bfloat16 for a in args):
                return op(self, *args)
            out = op(self, *(widened(self, a) for a in args))
            return TensorHandle(bfloat16_bits(out.data), tl.bfloat16) if rounded else out
        return run

    for name in BFLOAT16_ARITHMETIC + BFLOAT16_COMPARISONS:
        if hasattr(InterpreterBuilder, name):
            setattr(InterpreterBuilder, name,
                    on_values(getattr(InterpreterBuilder, name), name in BFLOAT16_ARITHMETIC))
    def bf16_constant(self, value):  # a bfloat16 scalar (Triton 3.6's interpreter has none)
        return TensorHandle(bfloat16_bits(np.array([value], np.float32)), tl.bfloat16)

    InterpreterBuilder.create_dot, InterpreterBuilder.cast_impl = dot, cast
    InterpreterBuilder.get_bf16 = bf16_constant
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
