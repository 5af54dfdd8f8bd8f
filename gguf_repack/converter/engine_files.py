"""The files an engine looks for beside the weights: config.json, generation_config.json and the
tokenizer (tokenizer.json, tokenizer_config.json, chat template).

All of them come out of transformers' own GGUF conversion, so `AutoConfig/AutoTokenizer.
from_pretrained(out)` give what `from_pretrained(gguf_file=...)` gives on the source, with no
original repository. transformers reads a GGUF through two readers: its own
`read_gguf_metadata` (fast) and, for most architectures' configs, gguf-py's `GGUFReader`, which
takes about 12 s on Gemma 3's 262k-token vocabulary. We already hold every key/value from our
bounded scanner, so `transformers_reads(gguf)` swaps both readers for views of those values for
the duration of the conversion; transformers' mapping code runs unchanged.

This module imports transformers only inside the functions that need it: the converter imports
it to write these files, and never imports torch when there are none to write.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from gguf_repack.format.manifest import quantization_config

from .arch_configs import OWN_CONFIGS
from .hf_config import complete_config, unaccounted_keys
from .reader import GGUFFile, GGUFSet, GGUFValueType, StringArray

CONFIG_FILES = ("config.json", "generation_config.json")


def hf_available() -> str | None:
    """None when the `hf` extra is importable, else the reason it is not."""
    from importlib.util import find_spec

    for name in ("transformers", "tokenizers", "accelerate"):
        if find_spec(name) is None:
            return f"{name} is not installed (pip install 'gguf-repack[hf]')"
    return None


class EngineFilesSkipped(Exception):
    """The weights are fine, but transformers cannot describe this model."""


def why_not(gguf: GGUFFile) -> str | None:
    """Why no engine files can be written for this model, checked without importing anything."""
    if "tokenizer.ggml.tokens" not in gguf.kvs:
        return "the GGUF file holds no tokenizer"
    return hf_available()


def write_engine_files(gset: GGUFSet, out: Path) -> tuple[list[str], list[str]]:
    """Write the engine files for the model `gset` (a file or a split set) into `out`.
    Returns the names written and warnings (metadata no engine will apply). Raises
    EngineFilesSkipped when transformers has no mapping for the architecture or the file
    holds no tokenizer."""
    gguf = gset.first
    tensor_names = [t.name for _, t in gset.tensors]
    arch = gguf.get("general.architecture")
    own = None
    if arch in OWN_CONFIGS:  # (transformers' GGUF mapping has none: ours, arch_configs.py)
        try:
            # (the tensors' names, with their shapes in torch order: Gemma 3n's LAuReL rank is
            # one, as llama.cpp reads it)
            own = OWN_CONFIGS[arch](lambda key: gguf.get(f"{arch}.{key}"), gguf.get,
                                    {t.name: t.shape for _, t in gset.tensors})
        except ValueError as e:
            raise EngineFilesSkipped(f"this {arch!r} model has no transformers config: {e}") from None
    with _quiet_transformers(), transformers_reads(gguf, tensor_names, own):
        from transformers import AutoConfig, AutoTokenizer, GenerationConfig

        source = os.path.abspath(gguf.path)
        try:
            config = AutoConfig.from_pretrained(os.path.dirname(source), gguf_file=source)
            tokenizer = AutoTokenizer.from_pretrained(os.path.dirname(source), gguf_file=source)
            _keep_bos_flag(tokenizer, gguf, source)
        except Exception as e:  # noqa: BLE001 - metadata from the internet meets third-party code:
            # whatever transformers raises, the weights are still good; say why and go on
            what = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
            raise EngineFilesSkipped(f"transformers could not describe this {arch!r} model "
                                     f"({what})") from None
    config = _gpt_oss_config(_moe_config(config, gguf), gguf)
    try:
        notes = complete_config(config, lambda key: gguf.get(f"{arch}.{key}"), set(tensor_names),
                                lambda name: _read_f32(gset, name))
    except ValueError as e:
        raise EngineFilesSkipped(f"this {arch!r} model has no transformers config: {e}") from None
    if unknown := unaccounted_keys(gguf.kvs, arch):
        notes.append(f"{len(unknown)} metadata keys this converter does not know, not in "
                     f"config.json: {', '.join(unknown)}")
    # llama.cpp computes logits with output.weight wherever the file has one; transformers'
    # GGUF mapping says "tied" for every Falcon and Bloom file, which an engine that ties
    # (vLLM) takes at its word and drops the file's output projection
    config.tie_word_embeddings = "output.weight" not in tensor_names
    config.architectures = config.architectures or _causal_lm_class(config.model_type)
    config.save_pretrained(out)
    _complete_config(out / "config.json")
    generation = GenerationConfig.from_model_config(config)
    if len(ends := end_of_generation_ids(gguf)) > 1:
        generation.eos_token_id = ends
    generation.save_pretrained(out)
    written = tokenizer.save_pretrained(out)
    return sorted({*CONFIG_FILES, *(Path(p).name for p in written)}), notes


# the tokens llama.cpp ends generation at besides the file's eos, eot and eom ids, found by their
# text (llama-vocab.cpp: chat models' end-of-turn tokens, which converters write as plain
# tokens): an engine stops at the same ones only when generation_config.json lists them
END_OF_GENERATION_TEXTS = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>")


def end_of_generation_ids(gguf: GGUFFile) -> list[int]:
    """The token ids llama.cpp ends generation at, the file's eos first: Gemma 3's <eos> and
    <end_of_turn>, Gemma 4's <turn|>, ChatML's <|im_end|> and <|endoftext|>."""
    ids = [int(v) for key in ("eos", "eot", "eom")
           if (v := gguf.get(f"tokenizer.ggml.{key}_token_id")) is not None]
    tokens = gguf.get("tokenizer.ggml.tokens")
    if tokens is not None:
        wanted = set(END_OF_GENERATION_TEXTS)
        ids += [i for i, text in enumerate(tokens) if text in wanted]
    return list(dict.fromkeys(ids))


def _read_f32(gset: GGUFSet, name: str) -> np.ndarray:
    """A small float32 tensor of the model (rope factors), read from its file."""
    for source, info in gset.tensors:
        if info.name == name:
            if info.type.name != "F32" or info.nbytes > 1 << 20:
                raise EngineFilesSkipped(f"{name} is {info.type.name} {list(info.shape)}; "
                                         f"llama.cpp writes a small F32 vector")
            with open(gset.files[source].path, "rb") as f:
                f.seek(info.file_offset)
                return np.frombuffer(f.read(info.nbytes), dtype="<f4").copy()
    raise KeyError(name)


def _keep_bos_flag(tokenizer, gguf: GGUFFile, source: str) -> None:
    """transformers before 5.24 (5.19 is the one vLLM 0.32 pins) ignores the file's
    `tokenizer.ggml.add_bos_token`, so Gemma 3's tokenizer adds no BOS and the model generates
    nonsense. Follow the file, as llama.cpp and later transformers do, unless transformers'
    GGUF tokenizer config decides otherwise (it turns BOS off for Gemma 4 on purpose)."""
    if not gguf.get("tokenizer.ggml.add_bos_token") or getattr(tokenizer, "add_bos_token", True):
        return
    from transformers.integrations.gguf import get_gguf_tokenizer

    if get_gguf_tokenizer(source)[2].get("add_bos_token", True):
        tokenizer.add_bos_token = True


def _moe_config(config, gguf: GGUFFile):
    """transformers' config of a mixture-of-experts file, made right where its GGUF mapping is
    not: llama.cpp writes Mixtral as architecture `llama` with `llama.expert_count`, which
    transformers reads as a dense LlamaConfig (a Mixtral config then); and it maps no expert
    widths, so Qwen2-MoE's and Qwen3-MoE's come out as their config classes' defaults (the
    file's values then)."""
    arch = gguf.get("general.architecture")
    experts = gguf.get(f"{arch}.expert_count")
    if not experts:
        return config
    if config.model_type == "llama":
        from transformers import MixtralConfig

        dense = config.to_dict()
        keep = set(MixtralConfig().to_dict()) - {"model_type", "architectures", "transformers_version"}
        config = MixtralConfig(**{k: v for k, v in dense.items() if k in keep or k.endswith("_token_id")},
                               num_local_experts=experts,
                               num_experts_per_tok=gguf.get(f"{arch}.expert_used_count"))
    for key, attribute in (("expert_feed_forward_length", "moe_intermediate_size"),
                           ("expert_shared_feed_forward_length", "shared_expert_intermediate_size")):
        if gguf.get(f"{arch}.{key}") and hasattr(config, attribute):
            setattr(config, attribute, gguf.get(f"{arch}.{key}"))
    return config


def _gpt_oss_config(config, gguf: GGUFFile):
    """gpt-oss's config from the file where transformers' GGUF mapping has none: its attention
    width (key_length: 64 heads of 64 in a 2880 model), its sliding window, its expert width and
    its yarn rope scaling. transformers cannot read the scaling (it takes a field's first part,
    which in gguf-py's reader is the key's length), so `transformers_reads` hides those keys from
    it and they are set here; llama.cpp stores no yarn `truncate`, which is False for gpt-oss."""
    if config.model_type != "gpt_oss":
        return config
    arch = gguf.get("general.architecture")
    for key, attribute in (("attention.key_length", "head_dim"),
                           ("attention.sliding_window", "sliding_window"),
                           ("expert_feed_forward_length", "intermediate_size")):
        if gguf.get(f"{arch}.{key}"):
            setattr(config, attribute, gguf.get(f"{arch}.{key}"))
    theta = float(gguf.get(f"{arch}.rope.freq_base", 150000.0))
    rope = {"rope_type": "default", "rope_theta": theta}
    if gguf.get(f"{arch}.rope.scaling.type") == "yarn":
        original = gguf.get(f"{arch}.rope.scaling.original_context_length")
        rope = {"rope_type": "yarn", "rope_theta": theta,
                "factor": float(gguf.get(f"{arch}.rope.scaling.factor")),
                "original_max_position_embeddings": int(original),
                "beta_fast": float(gguf.get(f"{arch}.rope.scaling.yarn_beta_fast", 32.0)),
                "beta_slow": float(gguf.get(f"{arch}.rope.scaling.yarn_beta_slow", 1.0)),
                "truncate": False}
    elif gguf.get(f"{arch}.rope.scaling.type") not in (None, "none"):
        raise EngineFilesSkipped(f"gpt-oss with rope scaling {gguf.get(f'{arch}.rope.scaling.type')!r} "
                                 f"has no transformers config here")
    config.rope_parameters = rope
    return config


# the class names the original repositories' config.json say where transformers 5 renamed the
# class: vLLM picks its model by this name (PhimoeForCausalLM is none of vLLM's, which would
# take its generic Transformers backend)
_CHECKPOINT_CLASS = {"phimoe": "PhiMoEForCausalLM"}


def _causal_lm_class(model_type: str) -> list[str] | None:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    name = _CHECKPOINT_CLASS.get(model_type) or MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
    return [name] if name else None


# keys an original repository's config.json has, and engines read, that transformers' config
# class does not write: LFM2's widths, which vLLM reads (the hidden size, as llama.cpp has them)
_ORIGINAL_CONFIG_KEYS = {"lfm2": {"conv_dim": "hidden_size", "block_dim": "hidden_size"}}


def _complete_config(path: Path) -> None:
    config = json.loads(path.read_text())
    config["quantization_config"] = quantization_config()
    # llama.cpp computes in float32 and the norms are stored so; without this, transformers'
    # dtype="auto" would take the first float plane it meets (a float16 block scale)
    config["dtype"] = "float32"
    for key, same_as in _ORIGINAL_CONFIG_KEYS.get(config.get("model_type"), {}).items():
        config.setdefault(key, config[same_as])
    for key in _SUB_CONFIGS.get(config.get("model_type"), ()):
        # as the model's own repository writes them: its fields only (transformers 5.25 adds
        # every PretrainedConfig field, which the transformers vLLM pins, 5.19, refuses)
        base = _pretrained_config_fields()
        config[key] = {k: v for k, v in config[key].items() if k not in base}
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


# configs within the config, by model type: DBRX's attention and experts
_SUB_CONFIGS = {"dbrx": ("attn_config", "ffn_config")}


def _pretrained_config_fields() -> set[str]:
    from transformers import PretrainedConfig

    return set(PretrainedConfig().to_dict())


class _quiet_transformers:
    """transformers logs and warns about every GGUF key it does not map; a convert is not the
    place for that."""

    def __enter__(self):
        self._warnings = warnings.catch_warnings()
        self._warnings.__enter__()
        warnings.simplefilter("ignore")
        from transformers.utils import logging as hf_logging

        # through transformers: on its first use it sets its root logger's level, which would
        # undo ours
        self._logger = hf_logging.get_logger("transformers")
        self._level = self._logger.level
        self._logger.setLevel(logging.ERROR)
        return self

    def __exit__(self, *exc):
        self._logger.setLevel(self._level)
        self._warnings.__exit__(*exc)


# -- our values, in the shapes transformers' readers give --------------------------------


def plain_metadata(gguf: GGUFFile, string_arrays=()) -> dict[str, Any]:
    """The shapes transformers' `read_gguf_metadata` gives: scalars and strings as Python values,
    numeric arrays as lists, string arrays as their length unless named in `string_arrays`."""
    out = {}
    for key, kv in gguf.kvs.items():
        value = kv.value
        if isinstance(value, StringArray):
            value = value.items if key in string_arrays else len(value)
        elif isinstance(value, np.ndarray):
            value = value.tolist()
        out[key] = value
    return out


def _reader_field(kv) -> SimpleNamespace:
    """One `GGUFReader` field as transformers indexes it: `parts[i] for i in data`, parsed by type.
    gguf-py keeps a numeric array as one part (so transformers sees its first element), a string
    array as one part per string."""
    value = kv.value
    if kv.type != GGUFValueType.ARRAY:
        part = value.encode("utf-8") if isinstance(value, str) else [value]
        return SimpleNamespace(types=[int(kv.type)], parts=[part], data=[0])
    types = [int(GGUFValueType.ARRAY), int(kv.item_type)]
    if isinstance(value, StringArray):
        parts = [s.encode("utf-8") for s in value.items]
        return SimpleNamespace(types=types, parts=parts, data=range(len(parts)))
    if isinstance(value, np.ndarray):
        return SimpleNamespace(types=types, parts=[value], data=[0] if len(value) else [])
    return SimpleNamespace(types=types, parts=[value], data=[0])


class ReaderView:
    """Enough of gguf-py's `GGUFReader` for transformers' `load_gguf_checkpoint` metadata pass."""

    def __init__(self, gguf: GGUFFile):
        self.fields = {key: _reader_field(kv) for key, kv in gguf.kvs.items()
                       if not key.startswith("gpt-oss.rope.scaling.")}  # see _gpt_oss_config
        self.tensors = [SimpleNamespace(name=t.name) for t in gguf.tensors]


@contextlib.contextmanager
def transformers_reads(gguf: GGUFFile, tensor_names: list[str], config: dict | None = None):
    """Within this block, transformers reading `gguf.path` as a GGUF file reads our values.
    The metadata pass of `load_gguf_checkpoint` is remembered: AutoTokenizer repeats the
    AutoConfig one, and each walks the whole vocabulary in Python. `config`: the config dict
    that pass gives, for an architecture transformers' GGUF mapping does not know (its
    tokenizer conversion does not depend on the architecture, but asks for the config first)."""
    import gguf as gguf_py
    import transformers.integrations.gguf as hf_gguf
    import transformers.integrations.gguf.reader as hf_reader
    import transformers.modeling_gguf_pytorch_utils as hf_legacy

    target = os.path.realpath(gguf.path)
    real_read, real_reader = hf_reader.read_gguf_metadata, gguf_py.GGUFReader
    real_checkpoint = hf_legacy.load_gguf_checkpoint
    remembered = {}

    def read_gguf_metadata(path, string_arrays=()):
        if os.path.realpath(path) != target:
            return real_read(path, string_arrays)
        return plain_metadata(gguf, string_arrays), tuple(tensor_names)

    def reader(path, *args, **kwargs):
        if os.path.realpath(path) != target:
            return real_reader(path, *args, **kwargs)
        return ReaderView(gguf)

    def load_gguf_checkpoint(path, return_tensors=False, *args, **kwargs):
        if return_tensors or os.path.realpath(path) != target:
            return real_checkpoint(path, return_tensors, *args, **kwargs)
        if config is not None:
            return {"config": copy.deepcopy(config)}
        if "parsed" not in remembered:
            remembered["parsed"] = real_checkpoint(path, False)
        return copy.deepcopy(remembered["parsed"])

    # transformers' newer GGUF config mapping (GGUF_CONFIG_ARCHS: Qwen3.5's, LFM2's) answers
    # AutoConfig itself, not through load_gguf_checkpoint; where the architecture's config is
    # ours it answers with ours too (Qwen3.5's: ours keeps the multi-token-prediction layer's
    # count, which the engines need to leave its tensors out, and is what the tests hold)
    real_config = hf_gguf.get_gguf_config

    def get_gguf_config(metadata, *args, **kwargs):
        if config is not None:
            return copy.deepcopy(config)
        return real_config(metadata, *args, **kwargs)

    hf_gguf.read_gguf_metadata  # noqa: B018 - resolve the lazy attribute so it can be swapped
    hf_reader.read_gguf_metadata = hf_gguf.read_gguf_metadata = read_gguf_metadata
    hf_gguf.get_gguf_config = get_gguf_config
    gguf_py.GGUFReader = reader
    hf_legacy.load_gguf_checkpoint = load_gguf_checkpoint
    try:
        yield
    finally:
        hf_reader.read_gguf_metadata = hf_gguf.read_gguf_metadata = real_read
        hf_gguf.get_gguf_config = real_config
        gguf_py.GGUFReader = real_reader
        hf_legacy.load_gguf_checkpoint = real_checkpoint
