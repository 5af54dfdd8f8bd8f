"""`AutoModelForCausalLM.from_pretrained(out)` for a gguf-repack directory.

config.json names `quant_method: gguf_repack`; transformers looks the method up among its
registered quantizers, and this module registers one. Before transformers reads any checkpoint,
the quantizer builds the quantized modules and float weights straight from the directory (the
same `fill_model` as `load_model`); the safetensors keys, which are GGUF plane names, then match
no parameter and are left alone. After loading, the planes and float weights are put back:
transformers replaces every parameter it did not load, and every non-persistent buffer, with an
empty tensor.
"""

from __future__ import annotations

from pathlib import Path

from transformers.quantizers import HfQuantizer
from transformers.quantizers.auto import (
    AUTO_QUANTIZATION_CONFIG_MAPPING,
    AUTO_QUANTIZER_MAPPING,
    register_quantization_config,
    register_quantizer,
)
from transformers.utils.quantization_config import QuantizationConfigMixin

from gguf_repack.format.manifest import FORMAT_VERSION, QUANT_METHOD, check_quantization_config
from gguf_repack.runtime.loader import load

from .model import fill_model
from .modules import QuantEmbedding, QuantExperts, QuantLinear


class GgufRepackConfig(QuantizationConfigMixin):
    """The `quantization_config` of a gguf-repack config.json."""

    def __init__(self, format_version: int = FORMAT_VERSION, backend: str = "auto", **kwargs):
        self.quant_method = QUANT_METHOD
        self.format_version = format_version
        self.backend = backend

    def to_dict(self) -> dict:
        # the backend is a choice for this run (from_pretrained(quantization_config=...)), so
        # it is kept only where it is not the default that config.json implies
        d = {"quant_method": QUANT_METHOD, "format_version": self.format_version}
        return d if self.backend == "auto" else {**d, "backend": self.backend}


class GgufRepackHfQuantizer(HfQuantizer):
    requires_calibration = False

    def __init__(self, quantization_config: GgufRepackConfig, **kwargs):
        super().__init__(quantization_config, **kwargs)
        self._repacked = None

    def validate_environment(self, *args, **kwargs):
        check_quantization_config(self.quantization_config.to_dict())

    def _process_model_before_weight_loading(self, model, checkpoint_files=None, **kwargs):
        if not checkpoint_files:
            raise ValueError("gguf_repack: from_pretrained found no safetensors shards")
        self._repacked = load(Path(checkpoint_files[0]).parent)
        fill_model(model, self._repacked, dtype=model.dtype, backend=self.quantization_config.backend)
        # Every parameter is in place now, and no checkpoint key names one: nothing is missing
        # or unexpected in transformers' sense.
        model._keys_to_ignore_on_load_missing = model._keys_to_ignore_on_load_unexpected = {"."}
        self._planes = {(name, key): buffer for name, module in model.named_modules()
                        if isinstance(module, (QuantLinear, QuantEmbedding, QuantExperts))
                        for key, buffer in module._buffers.items()}
        return model

    def _process_model_after_weight_loading(self, model, **kwargs):
        for (name, key), buffer in self._planes.items():
            model.get_submodule(name)._buffers[key] = buffer
        fill_model(model, self._repacked, dtype=model.dtype, plain_only=True)
        # the model keeps this quantizer: without this, its tensors cache would hold expert
        # stacks twice (joined gate/up planes are new tensors)
        self._repacked = self._planes = None
        return model.eval()

    def is_serializable(self):
        return False

    @property
    def is_trainable(self):
        return False


def register() -> None:
    """Make transformers recognize `quant_method: gguf_repack`. Safe to call again."""
    if QUANT_METHOD not in AUTO_QUANTIZATION_CONFIG_MAPPING:
        register_quantization_config(QUANT_METHOD)(GgufRepackConfig)
    if QUANT_METHOD not in AUTO_QUANTIZER_MAPPING:
        register_quantizer(QUANT_METHOD)(GgufRepackHfQuantizer)
