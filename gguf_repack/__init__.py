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

__version__ = "0.1.0"

from .converter.rebuild import export, verify
from .converter.writer import convert
from .errors import FormatError, OutputError, RepackError

__all__ = ["convert", "export", "verify", "load", "QTensor", "RepackedModel", "RepackError",
           "FormatError", "OutputError", "__version__"]

_TORCH_SIDE = {"load": "runtime.loader", "RepackedModel": "runtime.loader", "QTensor": "runtime.qtensor"}


def __getattr__(name: str):
    if name in _TORCH_SIDE:
        import importlib

        return getattr(importlib.import_module(f".{_TORCH_SIDE[name]}", __name__), name)
    raise AttributeError(f"module 'gguf_repack' has no attribute {name!r}")
