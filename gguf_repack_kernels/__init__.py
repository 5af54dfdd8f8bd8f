"""gguf_repack_kernels: Triton kernels over gguf-repack's rp1 planes.

Depends on torch, triton and gguf-py (whose grids and sign tables the IQ types' lookup
tables are built from, on first use), never on gguf_repack, so an engine can take the
kernels alone. The planes of a quantized weight of torch shape (N, K) are, per block field,
contiguous tensors [K / block_size, N, count]; see gguf-repack's DESIGN (layout rp1).

    dequantize(planes, type_name, shape, dtype)   -> the weight, (E..., N, K)
    matmul(x, planes, type_name, shape)           -> x @ W.T, (..., N), fp32 accumulation
    embedding(ids, planes, type_name, shape, dtype) -> rows of W, ids.shape + (K,)
    expert_matmul(x, expert_ids, planes, type_name, shape[, routed_experts])
                                               -> each routed token times its experts of a
                                                  stack (E, N, K): (T, k, N)

Each GGML type is one Triton dequant function (formats_*.py), shared by every kernel family
(dequantize.py, gemm.py, embedding.py), and a dot function for the GEMV (gemv.py);
dispatch.py picks the path by M (GEMV, fused GEMM, or dequantize then torch.matmul) and
configs.py holds the launch configurations. On CPU tensors the kernels run under Triton's
interpreter (TRITON_INTERPRET=1 set before triton is imported; interpreter.py makes its
bfloat16 steps compute what a GPU's do).
"""

import os

from .dispatch import dequantize, embedding, expert_matmul, matmul
from .registry import FORMATS, Format

if os.environ.get("TRITON_INTERPRET") == "1":  # the kernels on CPU tensors (interpreter.py)
    from .interpreter import fast_device_calls, gpu_bfloat16

    gpu_bfloat16()
    fast_device_calls()

__all__ = ["dequantize", "matmul", "expert_matmul", "embedding", "FORMATS", "Format"]
