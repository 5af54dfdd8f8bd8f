"""Engines: the transformers integration (`hf/`, public as `gguf_repack.hf`) and the vLLM
plugin (`vllm/`, entry point `gguf_repack.integrations.vllm:register`)."""
