"""Tiny GGUF files of the dense architectures transformers reads from GGUF, written the way
llama.cpp's converter writes each: the Hugging Face model's parameters renamed through gguf-py's
tensor-name map (what convert_hf_to_gguf.py does), llama.cpp's shape changes (Conv1D weights
transposed back to (out, in); convolution kernels squeezed to 2-D), the metadata keys it writes
for the architecture, and the types `llama-quantize` gives: every 2-D weight quantized (a
different type per kind of projection), norms, biases, convolutions, position embeddings and
Mamba's A and D kept in float32.

The parameters' names and shapes come from transformers' model for a small config; the values
are random (llama.cpp's value changes, such as Gemma's norm + 1, only shift random numbers,
except Mamba's A, which llama.cpp stores as -exp(A_log) and must stay negative)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType as V

# per architecture: gguf-py's name, transformers' config (small: K a multiple of 256 where a
# K-quant goes), and the metadata llama.cpp writes beyond transformers' mapped keys
DENSE = {
    # Gemma's tokenizer is SentencePiece (llama.cpp writes it as model "llama"); the others'
    # byte-level BPE ("gpt2"), the tests' small ones (tests/hf_models.py)
    "gemma2": dict(config=dict(hidden_size=256, intermediate_size=512, num_attention_heads=4,
                               num_key_value_heads=2, head_dim=64, sliding_window=4,
                               query_pre_attn_scalar=64), sentencepiece=True),
    "starcoder2": dict(config=dict(hidden_size=256, intermediate_size=1024, num_attention_heads=4,
                                   num_key_value_heads=2)),
    "stablelm": dict(config=dict(hidden_size=256, intermediate_size=512, num_attention_heads=4,
                                 num_key_value_heads=4, partial_rotary_factor=0.25,
                                 use_qkv_bias=True)),
    "nemotron": dict(config=dict(hidden_size=256, intermediate_size=512, num_attention_heads=4,
                                 num_key_value_heads=2, partial_rotary_factor=0.5, head_dim=64)),
    "falcon": dict(config=dict(hidden_size=256, num_attention_heads=4, num_kv_heads=1,
                               new_decoder_architecture=False, multi_query=True, parallel_attn=True,
                               bias=False, alibi=False)),
    "bloom": dict(config=dict(hidden_size=256, n_head=4)),
    "gpt2": dict(config=dict(n_embd=256, n_head=4),
                 kvs={"context_length": 1024, "feed_forward_length": 1024}),
    "mamba": dict(config=dict(hidden_size=256, state_size=16, expand=2, conv_kernel=4,
                              time_step_rank=16)),
    "lfm2": dict(config=dict(hidden_size=256, intermediate_size=512, num_attention_heads=4,
                             num_key_value_heads=2, layer_types=["conv", "full_attention"],
                             block_auto_adjust_ff_dim=False, full_attn_idxs=[1]),
                 # llama.cpp writes a KV head count per layer: 0 for a convolution layer
                 kvs={"attention.head_count_kv": [0, 2], "attention.layer_norm_rms_epsilon": 1e-5,
                      "rope.freq_base": 1000000.0}),
}
N_LAYERS = 2
# a type per kind of weight, as a mixed llama.cpp quant gives them
TYPE_BY_KIND = {"attn": T.Q8_0, "ffn_down": T.Q4_0, "ffn": T.Q4_1, "ssm": T.Q8_0, "token_embd": T.Q8_0,
                "output": T.Q8_0}
CONV1D = ("attn_qkv", "attn_output", "ffn_up", "ffn_down")  # GPT-2's Conv1D layers
FLOAT_NAMES = ("_norm", "position_embd", "ssm_conv1d", "shortconv.conv", "ssm_a", "ssm_d")


def hf_config(arch: str, vocab: int, **overrides):
    from transformers import AutoConfig

    model_type = {"gemma3": "gemma3_text"}.get(arch, arch)
    layers_key = {"gpt2": "n_layer", "bloom": "n_layer"}.get(arch, "num_hidden_layers")
    return AutoConfig.for_model(model_type, vocab_size=vocab, **{layers_key: N_LAYERS},
                                **{**DENSE[arch]["config"], **overrides})


def gguf_tensors(arch: str, config) -> dict[str, tuple[int, ...]]:
    """{GGUF name: GGUF shape (torch order)} of the model for `config`, as llama.cpp names them."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    gguf_arch = next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch)
    names = gguf.get_tensor_name_map(gguf_arch, N_LAYERS)
    out = {}
    for hf_name, p in model.state_dict().items():
        if "lm_head" in hf_name or "rotary" in hf_name:
            continue  # tied to the embedding, or computed
        base, _, suffix = hf_name.rpartition(".")
        if suffix not in ("weight", "bias"):  # Mamba's A_log and D: named without a suffix
            base, suffix = hf_name, ""
        # (as transformers looks names up: the outer name first, then without its prefixes)
        parts = base.split(".")
        gguf_name = next(filter(None, (names.get_name(".".join(parts[i:])) for i in range(len(parts)))), None)
        if gguf_name is None:
            raise KeyError(f"{arch}: gguf-py has no name for {hf_name}")
        if suffix:
            gguf_name += "." + suffix
        shape = tuple(p.shape)
        if arch == "gpt2" and suffix == "weight" and any(s in gguf_name for s in CONV1D):
            shape = shape[::-1]  # transformers' Conv1D holds (in, out); llama.cpp writes (out, in)
        if len(shape) == 3 and shape[1] == 1:
            shape = (shape[0], shape[2])  # a depthwise convolution's kernel: (channels, width)
        out[gguf_name] = shape
    return out


def write_arch(path: Path, arch: str, tokenizer: list[tuple], rng: np.random.Generator,
               quantize_also: tuple[str, ...] = (), **overrides) -> Path:
    """`arch` (a key of DENSE) at `path`; `overrides` change its config, and the tensors named
    by a part of `quantize_also` are quantized where llama.cpp keeps them float32."""
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    vocab = len(next(v for k, v, *_ in tokenizer if k == "tokenizer.ggml.tokens"))
    config = hf_config(arch, vocab, **overrides)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(arch)
    for key, attr in GGUF_CONFIG_MAPPING[arch].items():
        if key in DENSE[arch].get("kvs", {}):
            continue
        value = getattr(config, attr, None) if attr else None
        if isinstance(value, bool) or value is None:
            continue
        vtype = V.UINT32 if isinstance(value, int) else V.FLOAT32
        w.add_key_value(f"{arch}.{key}", value, vtype)
    for key, value in DENSE[arch].get("kvs", {}).items():
        if isinstance(value, list):
            w.add_key_value(f"{arch}.{key}", value, V.ARRAY, sub_type=V.UINT32)
        else:
            w.add_key_value(f"{arch}.{key}", value, V.UINT32 if isinstance(value, int) else V.FLOAT32)
    for key, value, vtype, sub in tokenizer:
        w.add_key_value(key, value, vtype, sub_type=sub)
    for name, shape in gguf_tensors(arch, config).items():
        float_names = [s for s in FLOAT_NAMES if not any(q in s for q in quantize_also)]
        if len(shape) == 2 and name.endswith(".weight") and not any(s in name for s in float_names):
            kind = next((k for k in TYPE_BY_KIND if k in name), "attn")
            qtype = TYPE_BY_KIND[kind]
            weights = rng.normal(0, shape[-1] ** -0.5, shape).astype(np.float32)
            w.add_tensor(name, gguf.quants.quantize(weights, qtype), raw_dtype=qtype)
        elif "ssm_a" in name:
            w.add_tensor(name, -np.exp(rng.normal(0, 0.5, shape)).astype(np.float32))
        else:
            around = 1.0 if name.endswith("norm.weight") else 0.0
            w.add_tensor(name, (around + rng.normal(0, 0.1, shape)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
