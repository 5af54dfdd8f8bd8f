"""`gguf_repack.vllm`, the public name of the vLLM plugin (gguf_repack/integrations/vllm/), kept
for entry points and scripts written against it."""

from .integrations.vllm import register  # noqa: F401

__all__ = ["register"]
