"""The weights of a gguf-repack directory as vLLM's models load them: (name, tensor) pairs
under transformers' parameter names, through the same TensorMapping as the transformers
integration (gguf-py's name map and transformers' fixes: llama's Q/K rows, Gemma's norms).

A quantized tensor comes as its planes, `<module>.rp1_<field>`, which vLLM's own load_weights
routes to the layer (merging q/k/v and gate/up by the module name) and our weight loaders
place (the rank's slice, at the shard's offset). A plain tensor comes as itself.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path

import torch
from vllm.model_executor.model_loader import register_model_loader
from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

from gguf_repack.format.manifest import QUANT_METHOD
from gguf_repack.integrations.tensor_map import TensorMapping
from gguf_repack.runtime.loader import RepackedModel, load
from gguf_repack.runtime.qtensor import QTensor

from .quant import PLANE


@lru_cache(maxsize=4)
def _mapping(path: str) -> TensorMapping:
    return TensorMapping.for_output(load(path))


def mapping_for(repacked: RepackedModel) -> TensorMapping:
    return _mapping(os.path.realpath(repacked.path))


def iter_weights(directory: str | os.PathLike) -> Iterator[tuple[str, torch.Tensor]]:
    repacked = load(Path(directory))
    mapping = mapping_for(repacked)
    for gguf_name, hf_name in mapping.names:
        tensor = repacked[gguf_name]
        if isinstance(tensor, QTensor):
            module = hf_name.rpartition(".")[0]
            for field, plane in mapping.quantized(gguf_name, tensor).planes.items():
                yield f"{module}.{PLANE}{field}", plane
        else:
            yield hf_name, mapping.plain(gguf_name, tensor, torch.float32)


class RepackAwareModelLoader(DefaultModelLoader):
    """vLLM's default loader, which reads a gguf-repack directory through iter_weights. It is
    registered as the "auto" load format, so `LLM(model=out)` needs no flag; every other model
    loads exactly as before."""

    def get_all_weights(self, model_config, model):
        if model_config.quantization == QUANT_METHOD:
            yield from iter_weights(model_config.model)
            return
        yield from super().get_all_weights(model_config, model)


def register_loader() -> None:
    register_model_loader("auto")(RepackAwareModelLoader)
