"""The weights of a gguf-repack directory as vLLM's models load them: (name, tensor) pairs
under transformers' parameter names, through the same TensorMapping as the transformers
integration (gguf-py's name map and transformers' fixes: llama's Q/K rows, Gemma's norms).

A quantized tensor comes as its planes, `<module>.rp1_<field>`, which vLLM's own load_weights
routes to the layer (merging q/k/v and gate/up by the module name) and our weight loaders
place (the rank's slice, at the shard's offset). A plain tensor comes as itself.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from functools import lru_cache
from pathlib import Path

import torch
from vllm.logger import init_logger
from vllm.model_executor.model_loader import register_model_loader
from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

from gguf_repack.format.manifest import QUANT_METHOD
from gguf_repack.integrations.tensor_map import TensorMapping
from gguf_repack.runtime.loader import RepackedModel, load
from gguf_repack.runtime.qtensor import QTensor

from .quant import PLANE

logger = init_logger("vllm.gguf_repack")  # under vllm's logger, which vLLM configures


@lru_cache(maxsize=4)
def _mapping(path: str) -> TensorMapping:
    return TensorMapping.for_output(load(path))


def mapping_for(repacked: RepackedModel) -> TensorMapping:
    return _mapping(os.path.realpath(repacked.path))


def iter_weights(directory: str | os.PathLike, wanted: Callable[[str], bool] = lambda name: True,
                 counts: dict[str, int] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """The directory's weights under transformers' names; with `wanted`, only the tensors
    whose name it accepts are read (a pipeline stage's layers). `counts` gets "read" and
    "tensors"."""
    repacked = load(Path(directory))
    mapping = mapping_for(repacked)
    counts = {} if counts is None else counts
    counts.update(read=0, tensors=len(mapping.names))
    for gguf_name, hf_name in mapping.names:
        if not wanted(hf_name):
            continue
        counts["read"] += 1
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
        if model_config.quantization != QUANT_METHOD:
            yield from super().get_all_weights(model_config, model)
            return
        from vllm.distributed import get_pp_group
        from vllm.model_executor.models.utils import is_pp_missing_parameter

        # (vLLM's own iterator starts this clock; its "Loading weights took" line reads it)
        self.counter_before_loading_weights = time.perf_counter()
        # under pipeline parallelism a stage's model has placeholders for the other stages'
        # layers: their tensors are not read at all
        counts: dict[str, int] = {}
        yield from iter_weights(model_config.model, lambda name: not is_pp_missing_parameter(name, model),
                                counts)
        logger.info("gguf_repack: pipeline stage %d read %d of the %d tensors of %s",
                    get_pp_group().rank_in_group, counts["read"], counts["tensors"], model_config.model)


def register_loader() -> None:
    register_model_loader("auto")(RepackAwareModelLoader)
