"""gguf-repack for vLLM: serve a gguf-repack directory with its weights quantized.

    vllm serve out/            # or LLM(model="out/")

The package's `vllm.general_plugins` entry point calls `register()` in every vLLM process:
config.json's `quant_method: gguf_repack` then selects GgufRepackVllmConfig, whose methods hold
rp1 planes, and the "auto" loader reads the directory's tensors by GGUF name. Needs vLLM.
"""

from __future__ import annotations


def register() -> None:
    """Register the quantization method and the loader with vLLM. Safe to call again."""
    from vllm.model_executor.layers.quantization import register_quantization_config

    from gguf_repack.format.manifest import QUANT_METHOD

    from .quant import GgufRepackVllmConfig
    from .weights import RepackAwareModelLoader, register_loader

    register_quantization_config(QUANT_METHOD)(GgufRepackVllmConfig)
    from vllm.model_executor.model_loader import _LOAD_FORMAT_TO_MODEL_LOADER

    if _LOAD_FORMAT_TO_MODEL_LOADER.get("auto") is not RepackAwareModelLoader:
        register_loader()
