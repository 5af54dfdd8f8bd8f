"""`gguf_repack.hf`, the public name of the transformers integration
(gguf_repack/integrations/hf/): importing it registers the `gguf_repack` quantization method
with transformers."""

from .integrations.hf import (  # noqa: F401
    GgufRepackConfig,
    GgufRepackHfQuantizer,
    QuantEmbedding,
    QuantExperts,
    QuantLinear,
    __all__,
    default_dtype,
    load_model,
)
