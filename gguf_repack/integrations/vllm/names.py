"""The names the plugin's modules share: its parameters' prefix, the decoder layer of a vLLM
module, and the GGUF -> transformers tensor names of a directory.

The plugin's modules import one way only, down this order: weights (the loader) -> quant (the
config, linear and embedding methods) -> moe (the experts methods) -> names, which imports none
of them (tests/test_vllm_imports.py holds it). Nothing here imports vLLM.
"""

from __future__ import annotations

import os
import re
from functools import lru_cache

from gguf_repack.integrations.tensor_map import TensorMapping
from gguf_repack.runtime.loader import RepackedModel, load

# A layer's rp1 planes are its parameters of this prefix (rp1_<field>, rp1_<group>_<field>)
PLANE = "rp1_"


def decoder_layer(prefix: str) -> int | None:
    """The decoder layer of a vLLM module prefix (model.layers.N.<...>; DBRX's
    transformer.blocks.N.<...>): GGUF's blk.N."""
    found = re.search(r"(?:layers|blocks)\.(\d+)\.", prefix)
    return int(found[1]) if found else None


@lru_cache(maxsize=4)
def _mapping(path: str) -> TensorMapping:
    return TensorMapping.for_output(load(path))


def mapping_for(repacked: RepackedModel) -> TensorMapping:
    """The directory's TensorMapping, made once per process for the config (which reads the
    layers' types) and the loader (which reads the weights)."""
    return _mapping(os.path.realpath(repacked.path))
