"""gguf-repack: GGUF models re-tiled, losslessly, into a planar layout for batched GPU inference.

Public surface:
    convert(src, out)        GGUF file (or split set) -> output directory
    export(out, dest)        output directory -> the source GGUF file(s), byte for byte
    verify(out, against=)    recompute checksums; optionally compare with the source
    RepackError              the one exception family for bad input (a ValueError)

Importing this package does not import torch: the converter does not need it.
"""

__version__ = "0.1.0"

from .errors import FormatError, OutputError, RepackError  # noqa: E402
from .rebuild import export, verify  # noqa: E402
from .writer import convert  # noqa: E402

__all__ = ["convert", "export", "verify", "RepackError", "FormatError", "OutputError",
           "__version__"]
