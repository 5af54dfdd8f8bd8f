"""An output directory in memory: the loader, QTensor (a quantized weight in its planes) and
the backends that multiply it (the torch dequantizers in `dequant/`, or the Triton kernels
in the top-level package gguf_repack_kernels)."""
