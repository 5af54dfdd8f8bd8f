"""gguf-repack for transformers: a model whose linear layers and token embedding stay quantized.

    from gguf_repack.hf import load_model
    model = load_model("out/")                                  # a PreTrainedModel
    AutoModelForCausalLM.from_pretrained("out/")                # the same, once this is imported

Importing this package registers the `gguf_repack` quantization method with transformers.
Needs the `hf` extra (transformers, tokenizers, accelerate).
"""

from .model import default_dtype, load_model
from .modules import QuantEmbedding, QuantExperts, QuantLinear
from .quantizer import GgufRepackConfig, GgufRepackHfQuantizer, register

register()

__all__ = ["load_model", "default_dtype", "QuantLinear", "QuantEmbedding", "QuantExperts", "GgufRepackConfig",
           "GgufRepackHfQuantizer"]
