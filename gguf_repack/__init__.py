"""gguf-repack: GGUF models re-tiled, losslessly, into a planar layout for batched GPU inference.

Public surface:
    convert(src, out)        GGUF file (or split set) -> output directory
    export(out, dest)        output directory -> the source GGUF file(s), byte for byte
    verify(out, against=)    recompute checksums; optionally compare with the source
    load(out, device=)       output directory -> RepackedModel {GGUF name: QTensor | Tensor}
    QTensor                  a quantized weight in rp1 planes: dequantize, matmul, embedding
    RepackError              the one exception family for bad input (a ValueError)

Importing this package does not import torch (the converter does not need it); `load` and
`QTensor` import it on first use.
"""

import os

__version__ = "0.1.0"

# torch's CPU allocator maps large tensors in 4 KiB pages unless told otherwise (numpy asks
# for huge pages): dequantizing 64 MiB of float32 then costs about 16k page faults, as much
# time as the arithmetic. torch reads this once, at its first allocation, so it only helps
# when gguf_repack is imported before torch; a value the user set is kept.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

from .errors import FormatError, OutputError, RepackError  # noqa: E402
from .rebuild import export, verify  # noqa: E402
from .writer import convert  # noqa: E402

__all__ = ["convert", "export", "verify", "load", "QTensor", "RepackedModel", "RepackError",
           "FormatError", "OutputError", "__version__"]

_TORCH_SIDE = {"load": "loader", "RepackedModel": "loader", "QTensor": "qtensor"}


def __getattr__(name: str):
    if name in _TORCH_SIDE:
        import importlib

        return getattr(importlib.import_module(f".{_TORCH_SIDE[name]}", __name__), name)
    raise AttributeError(f"module 'gguf_repack' has no attribute {name!r}")
