"""GGUF tensor names and values -> a transformers model's, through transformers' own GGUF code.

One mapping for every integration: the name map is gguf-py's (as transformers and vLLM use it,
via `get_gguf_hf_weights_map`), and the per-architecture fixes are transformers' tensor
processors. A quantized tensor may only be changed by a row permutation (llama.cpp permutes
llama's Q and K rows for its rope); we find that permutation by running the processor on the
row indices, so the fix applied is exactly transformers', and exact on the blocks.
"""

from __future__ import annotations

import numpy as np
import torch

from ..errors import RepackError


def tensor_processor(gguf_arch: str, config: dict):
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    return TENSOR_PROCESSORS.get(gguf_arch, TensorProcessor)(config=config)


def gguf_to_hf_names(model, gguf_arch: str, processor) -> dict[str, str]:
    """{GGUF tensor name: parameter name in `model`} (a transformers model, any device).

    What transformers' `get_gguf_hf_weights_map` computes, with gguf-py's name map built once:
    that function rebuilds it for every submodule (397 times for SmolLM2, 6.7 s)."""
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map

    arch = next((a for a, name in MODEL_ARCH_NAMES.items() if name == gguf_arch), None)
    if arch is None:
        raise RepackError(f"gguf {_gguf_version()} has no tensor names for architecture {gguf_arch!r}")
    name_map = get_tensor_name_map(arch, model.config.num_hidden_layers)
    names: dict[str, str] = {}
    for hf_name in model.state_dict(keep_vars=True):
        # transformers also tries each submodule with its own prefix dropped (a GGUF converted
        # from the base model); the outer name wins
        parts = hf_name.split(".")
        for start in range(len(parts) - 1):
            base, dot, suffix = ".".join(parts[start:]).rpartition(".")
            if suffix not in ("weight", "bias"):
                base, dot, suffix = ".".join(parts[start:]), "", ""
            gguf_name = name_map.get_name(processor.preprocess_name(base))
            if gguf_name is not None:
                names.setdefault(gguf_name + dot + suffix, hf_name)
                break
    return names


def _gguf_version() -> str:
    from importlib.metadata import version

    return version("gguf")


def row_permutation(processor, name: str, n_rows: int) -> torch.Tensor | None:
    """The row order transformers' processor gives tensor `name` of `n_rows` rows, or None when
    it leaves the rows alone. Raises when the fix is more than a row permutation: that would
    need the weights dequantized."""
    probe = np.arange(n_rows, dtype=np.float64)[:, None]
    result = processor.process(weights=probe, name=name).weights
    rows = np.asarray(result).reshape(-1)
    if np.array_equal(rows, probe[:, 0]):
        return None
    if result.shape != probe.shape or not np.array_equal(np.sort(rows), probe[:, 0]):
        raise RepackError(f"{name}: transformers changes this tensor's values on load, which a "
                          f"quantized weight cannot follow exactly")
    return torch.from_numpy(rows.astype(np.int64))


def process_plain(processor, name: str, tensor: torch.Tensor) -> torch.Tensor:
    """A float tensor (norm, bias, F16/F32 weight) with transformers' fix applied (gemma's norms
    are stored as w + 1)."""
    result = processor.process(weights=tensor.numpy(), name=name).weights
    return torch.from_numpy(np.ascontiguousarray(result))


class TensorMapping:
    """The GGUF tensors of `repacked` that a transformers model has a parameter for, and
    transformers' per-architecture fixes, for any integration that loads them."""

    def __init__(self, model, repacked):
        arch = repacked.metadata["general.architecture"]
        self.processor = tensor_processor(arch, model.config.to_dict())
        hf_names = gguf_to_hf_names(model, arch, self.processor)
        # tensors transformers has no parameter for (rope_freqs, ...) are skipped, as it does
        self.names = [(name, hf_names[name]) for name in repacked if name in hf_names]

    @classmethod
    def for_output(cls, repacked) -> "TensorMapping":
        """From the output directory's config.json, with the model built on the meta device."""
        from transformers import AutoConfig

        from .model import empty_model

        return cls(empty_model(AutoConfig.from_pretrained(repacked.path), torch.float32), repacked)

    def plain(self, gguf_name: str, tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return process_plain(self.processor, gguf_name, tensor.float()).to(dtype)

    def quantized(self, gguf_name: str, weight):
        """The QTensor as transformers would have it: rows permuted where it permutes them."""
        rows = row_permutation(self.processor, gguf_name, weight.shape[-2])
        return weight if rows is None else weight.index_rows(rows)
