"""The `gguf_repack` quantization method for vLLM: one config class, one method per layer kind.

A layer's weight is held as its rp1 planes, one parameter per block field (`rp1_<field>`, shape
[K/block, N, count] on this rank), and multiplied through QTensor (the torch backend on CPU,
the Triton kernels on CUDA). The GGUF type of each layer is known before any weight is read:
the config reads the directory's manifest and maps the layer's vLLM name to its GGUF tensors.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

import torch
from torch.nn import Parameter
from vllm.model_executor.layers.linear import (
    LinearBase,
    LinearMethodBase,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
    UnquantizedLinearMethod,
)
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig, QuantizeMethodBase
from vllm.model_executor.layers.vocab_parallel_embedding import (
    UnquantizedEmbeddingMethod,
    VocabParallelEmbedding,
)
from vllm.model_executor.utils import set_weight_attrs

from gguf_repack.format.manifest import FORMAT_VERSION, QUANT_METHOD, check_quantization_config
from gguf_repack.format.type_table import TYPES_BY_NAME, GGMLType
from gguf_repack.integrations.tensor_map import MLA_KV_B_PART, row_part
from gguf_repack.runtime.qtensor import QTensor, plane_torch_dtype

from .names import PLANE, decoder_layer, mapping_for


# The products run as opaque custom ops: vLLM compiles the model with torch.compile (fullgraph),
# and the QTensor code is plain eager PyTorch over Python objects, not meant to be traced.
@torch.library.custom_op("gguf_repack::rp1_matmul", mutates_args=())
def rp1_matmul(x: torch.Tensor, planes: list[torch.Tensor], qtype: str, n: int, k: int) -> torch.Tensor:
    return _qtensor(planes, qtype, n, k).matmul(x)


@rp1_matmul.register_fake
def _(x, planes, qtype, n, k):
    return x.new_empty((*x.shape[:-1], n))


@torch.library.custom_op("gguf_repack::rp1_embedding", mutates_args=())
def rp1_embedding(ids: torch.Tensor, planes: list[torch.Tensor], qtype: str, n: int, k: int,
                  dtype: torch.dtype) -> torch.Tensor:
    return _qtensor(planes, qtype, n, k).embedding(ids, dtype=dtype)


@rp1_embedding.register_fake
def _(ids, planes, qtype, n, k, dtype):
    return torch.empty((*ids.shape, k), dtype=dtype, device=ids.device)


def _qtensor(planes: list[torch.Tensor], qtype: str, n: int, k: int) -> QTensor:
    fields = TYPES_BY_NAME[qtype].fields
    return QTensor(qtype, (n, k), {f.name: p for f, p in zip(fields, planes)})


def _call(weight: QTensor):
    """The custom ops' arguments for a QTensor."""
    return [weight.planes[f.name] for f in weight.qtype.fields], weight.qtype.name, *weight.shape


# vLLM models whose inner model renames its weights by a mapper of its own (which the outer
# model's does not include), by the outer class: (the inner model's prefix, its module, class).
# Gemma 3n's text model holds the embeddings and AltUp projections in a `self_decoder`
NESTED_MAPPERS = {"Gemma3nForCausalLM": ("model.", "vllm.model_executor.models.gemma3n", "Gemma3nTextModel")}

# linear layers whose weight a vLLM model reads when it builds them, which rp1 planes do not
# have: built without the quantization config, the weight dequantized at load (Gemma 3n's AltUp
# router, whose weight's dtype its buffer takes)
FLOAT_IN_VLLM = (r"\.altup\.modality_router\.weight$",)


class GgufRepackVllmConfig(QuantizationConfig):
    """`quantization_config: {"quant_method": "gguf_repack", "format_version": 1}`."""

    def __init__(self, format_version: int = FORMAT_VERSION):
        super().__init__()
        check_quantization_config({"quant_method": QUANT_METHOD, "format_version": format_version})
        self.format_version = format_version
        self.directory: Path | None = None
        self._types: dict[str, str] | None = None
        self._mapper = None

    def __repr__(self) -> str:
        return f"GgufRepackVllmConfig(format_version={self.format_version})"

    @classmethod
    def get_name(cls) -> str:
        return QUANT_METHOD

    def get_supported_act_dtypes(self) -> list[torch.dtype]:
        return [torch.float32, torch.float16, torch.bfloat16]

    @classmethod
    def get_min_capability(cls) -> int:
        return 0  # CPU, and any GPU Triton runs on

    @staticmethod
    def get_config_filenames() -> list[str]:
        return []

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "GgufRepackVllmConfig":
        return cls(config.get("format_version"))

    def maybe_update_config(self, model_name: str, hf_config=None, revision=None) -> None:
        self.directory = Path(model_name)

    def apply_vllm_mapper(self, hf_to_vllm_mapper) -> None:
        """The model's renames of transformers' module names (gpt-oss: `.self_attn.` is
        `.attn.`), so that a layer's prefix finds the tensors behind it."""
        self._mapper = hf_to_vllm_mapper

    # -- which GGUF tensors a vLLM layer holds --------------------------------------------
    def source_types(self, prefix: str) -> tuple[str, ...]:
        """The GGUF types of the tensors behind the vLLM layer `prefix` (several for a merged
        layer such as qkv_proj), () when the directory has none."""
        types = self._load_types()
        names = self._source_names(prefix)
        found = tuple(types[n] for n in names if n in types)
        if found and len(found) != len(names):
            missing = [n for n in names if n not in types]
            raise ValueError(f"gguf_repack: {prefix} merges {len(names)} tensors, but the directory "
                             f"has none for {missing} (model {self.directory})")
        return found

    def source_rows(self, prefix: str) -> tuple[int, ...]:
        """The rows of each tensor source_types names (where one tensor fills several shards of
        a merged layer: Qwen3.5's in_proj_qkv, its q, k and v of in_proj_qkvz)."""
        self._load_types()
        return tuple(self._rows[n] for n in self._source_names(prefix) if n in self._rows)

    def _source_names(self, prefix: str) -> list[str]:
        module, _, last = prefix.rpartition(".")
        parts = getattr(self, "packed_modules_mapping", {}).get(last, [last])
        return [f"{module}.{p}.weight" if module else f"{p}.weight" for p in parts]

    def _load_types(self) -> dict[str, str]:
        """{transformers parameter name: GGUF type}, and the GGUF names of the embeddings."""
        if self._types is None:
            from gguf_repack.runtime.loader import load

            repacked = load(self.directory)
            mapping = mapping_for(repacked)
            # MLA's kv_b_proj is held in float, joined from llama.cpp's two parts (weights.py);
            # a parameter llama.cpp splits by rows (ROW_PARTS: Qwen3-Next's in_proj_qkvz, Granite's
            # shared input_linear) has its parts' type where they have one (else float)
            self._types, self._rows = {}, {}
            for gguf, hf in mapping.names:
                kind = "F32" if MLA_KV_B_PART.fullmatch(gguf) else repacked.record(gguf).type
                if row_part(gguf, hf) and self._types.get(hf, kind) != kind:
                    kind = "F32"
                self._types[hf] = kind
                shape = repacked.record(gguf).shape
                self._rows[hf] = self._rows.get(hf, 0) + (int(shape[-2]) if len(shape) >= 2 else 0)
            for hf in self._types:
                if any(re.search(pattern, hf) for pattern in FLOAT_IN_VLLM):
                    self._types[hf] = "F32"
            if mapping.config.get("attention_k_eq_v"):
                # Gemma 4's global layers take their keys for values: the file has k_proj alone,
                # which vLLM's model loads into both the K and the V part of qkv_proj
                for hf, kind in list(self._types.items()):
                    if hf.endswith(".self_attn.k_proj.weight"):
                        self._types.setdefault(hf.replace(".k_proj.", ".v_proj."), kind)
                        self._rows.setdefault(hf.replace(".k_proj.", ".v_proj."), self._rows[hf])
            if self._mapper is not None:
                self._types.update(self._mapper.apply_dict(self._types))
                self._rows.update(self._mapper.apply_dict(self._rows))
            for architecture in mapping.config.get("architectures") or []:
                if architecture in NESTED_MAPPERS:
                    prefix, module, name = NESTED_MAPPERS[architecture]
                    inner = getattr(importlib.import_module(module), name).hf_to_vllm_mapper
                    for found in (self._types, self._rows):
                        renamed = {n: inner.map_name(n[len(prefix):]) for n in found if n.startswith(prefix)}
                        found.update({prefix + new: found[n] for n, new in renamed.items() if new})
            self._gguf_types = {gguf: repacked.record(gguf).type for gguf, _ in mapping.names}
        return self._types

    def expert_types(self, prefix: str) -> tuple[GGMLType, GGMLType, GGMLType]:
        """The GGUF types of the gate, up and down expert stacks behind the vLLM experts layer
        `prefix` (model.layers.N.<anything>.experts: one expert layer per decoder layer): all
        quantized or all float."""
        self._load_types()
        block = decoder_layer(prefix)
        names = [f"blk.{'?' if block is None else block}.ffn_{w}_exps.weight" for w in ("gate", "up", "down")]
        joined = names[0].replace("gate", "gate_up")
        if joined in self._gguf_types:  # (Gemma 4's: gate and up in one tensor, one type)
            names[:2] = [joined, joined]
        missing = [n for n in names if n not in self._gguf_types]
        if missing:
            raise ValueError(f"gguf_repack: {prefix}: the directory has no expert stack "
                             f"{', '.join(missing)} (model {self.directory})")
        types = tuple(TYPES_BY_NAME[self._gguf_types[n]] for n in names)
        if len({t.is_quantized for t in types}) > 1:
            raise ValueError(f"gguf_repack: {prefix}: expert stacks partly float, partly quantized "
                             f"({', '.join(f'{n} {t.name}' for n, t in zip(names, types))}) are not "
                             f"supported yet: a layer's gate, up and down must be all float or all "
                             f"quantized (model {self.directory})")
        return types

    def _embedding_types(self, layer) -> tuple[str, ...]:
        """Some models build their embeddings without a prefix: find them by GGUF name (the
        output projection is the token embedding when the file has no output.weight)."""
        from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

        if not isinstance(layer, VocabParallelEmbedding):
            return ()
        self._load_types()
        names = ["output.weight", "token_embd.weight"] if isinstance(layer, ParallelLMHead) \
            else ["token_embd.weight"]
        return next(((self._gguf_types[n],) for n in names if n in self._gguf_types), ())

    def get_quant_method(self, layer: torch.nn.Module, prefix: str) -> QuantizeMethodBase | None:
        from vllm.model_executor.layers.fused_moe import RoutedExperts

        if isinstance(layer, RoutedExperts):
            from .moe import RepackFloatMoEMethod, RepackMoEMethod

            types = self.expert_types(prefix)
            if not types[0].is_quantized:  # an F32/F16/BF16 file's: vLLM's own method holds them
                return RepackFloatMoEMethod(layer.moe_config, prefix)
            return RepackMoEMethod(layer.moe_config, types, prefix)
        if not isinstance(layer, (LinearBase, VocabParallelEmbedding)):
            return None
        types = [TYPES_BY_NAME[t] for t in self.source_types(prefix) or self._embedding_types(layer)]
        if not any(t.is_quantized for t in types):
            return UnquantizedEmbeddingMethod() if isinstance(layer, VocabParallelEmbedding) \
                else UnquantizedLinearMethod()
        if not all(t.is_quantized for t in types):
            raise ValueError(f"gguf_repack: {prefix} merges float and quantized tensors "
                             f"({', '.join(t.name for t in types)}), which is not supported yet "
                             f"(model {self.directory})")
        if isinstance(layer, VocabParallelEmbedding):
            return RepackEmbeddingMethod(types, prefix)
        return RepackLinearMethod(types, prefix, part_rows=self.source_rows(prefix))


def _shard_index(shard_id) -> int:
    return {"q": 0, "k": 1, "v": 2}.get(shard_id, 0 if shard_id is None else shard_id)


def _types_per_shard(layer, qtypes, part_rows) -> list[GGMLType]:
    """Each shard's GGUF type where a tensor fills several consecutive shards of a merged
    layer (Qwen3.5's in_proj_qkv: q, k and v of in_proj_qkvz; in_proj_z: z): the shards a
    tensor covers are those its rows add up to, in order."""
    out, shards = [], iter(_fused_shards(layer))
    for qtype, rows in zip(qtypes, part_rows):
        covered = 0
        while covered < rows:
            part = next(shards, None)
            if part is None:
                break
            covered += part[2]
            out.append(qtype)
        if covered != rows:
            raise ValueError(f"gguf_repack: tensors of {list(part_rows)} rows do not make the "
                             f"shards of {type(layer).__name__} ({[p[2] for p in _fused_shards(layer)]})")
    return out


def _fused_shards(layer) -> list[tuple[str | int, int, int]]:
    """(shard id, first row, rows) of each shard in a fused tensor of the whole layer (all
    ranks' rows), as vLLM's own weight loaders split one."""
    if isinstance(layer, QKVParallelLinear):
        q = layer.total_num_heads * layer.head_size
        k = layer.total_num_kv_heads * layer.head_size
        return [("q", 0, q), ("k", q, k), ("v", q + k, layer.total_num_kv_heads * layer.v_head_size)]
    starts = [sum(layer.output_sizes[:i]) for i in range(len(layer.output_sizes))]
    return list(zip(range(len(starts)), starts, layer.output_sizes))


class _PlanesMethod(QuantizeMethodBase):
    """Holds a layer's weight as rp1 planes, each shard's rows (q, k, v of a merged QKV; gate,
    up) copied straight into place: consecutive shards of one GGUF type share one plane set
    (`rp1_<group>_<field>`, [K/block, their rows, count] on this rank), so a merged layer of
    one type is one QTensor, held once, and one product. vLLM loads `rp1_<field>` by name with
    a shard id; those empty parameters only carry the weight loader that puts the planes in
    place."""

    def __init__(self, qtypes: list[GGMLType], prefix: str = "", part_rows=()):
        # part_rows: each GGUF tensor's rows, where one fills several shards of a merged layer
        self.qtypes, self.prefix, self.part_rows = qtypes, prefix, tuple(part_rows)

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes, input_size,
                       output_size, params_dtype, **extra_weight_attrs):
        extra_weight_attrs.pop("weight_loader", None)
        layer.compute_dtype = params_dtype
        rows = list(output_partition_sizes)
        # a merged layer whose tensor the file holds fused (phi3's attn_qkv, its gate+up
        # ffn_up): one GGUF type for every shard, the fused rows split by the loader
        qtypes = self.qtypes * len(rows) if len(self.qtypes) == 1 else self.qtypes
        if len(qtypes) != len(rows) and len(self.part_rows) == len(qtypes):
            qtypes = _types_per_shard(layer, qtypes, self.part_rows)
        if len(qtypes) != len(rows):
            raise ValueError(f"gguf_repack: a layer of {len(rows)} shards has {len(qtypes)} GGUF "
                             f"tensors behind it")
        # runs of consecutive shards of one type: [(type, rows)], and each shard's (run, offset)
        layer.rp1_shards, layer.rp1_place = [], []
        # (shard, field) filled so far: a shard the model's load_weights never routed here
        # fails at process_weights_after_loading instead of leaving zeros
        layer.rp1_expected = {(i, f.name) for i, qtype in enumerate(qtypes) for f in qtype.fields}
        layer.rp1_filled = set()
        for qtype, n in zip(qtypes, rows):
            if input_size_per_partition % qtype.block_size:
                raise ValueError(f"gguf_repack: {input_size_per_partition} input features per rank "
                                 f"is not a whole number of {qtype.name} blocks "
                                 f"({qtype.block_size}); use another tensor_parallel_size")
            if layer.rp1_shards and layer.rp1_shards[-1][0].name == qtype.name:
                run_type, run_rows = layer.rp1_shards[-1]
                layer.rp1_place.append((len(layer.rp1_shards) - 1, run_rows, n))
                layer.rp1_shards[-1] = (run_type, run_rows + n)
            else:
                layer.rp1_place.append((len(layer.rp1_shards), 0, n))
                layer.rp1_shards.append((qtype, n))
        for i, (qtype, n) in enumerate(layer.rp1_shards):
            for field in qtype.fields:
                plane = torch.zeros(input_size_per_partition // qtype.block_size, n, field.count,
                                    dtype=plane_torch_dtype(field))
                layer.register_parameter(f"{PLANE}{i}_{field.name}", Parameter(plane, requires_grad=False))
        layer.rp1_k = input_size_per_partition
        for name in {f.name for qtype in self.qtypes for f in qtype.fields}:
            carrier = Parameter(torch.empty(0), requires_grad=False)
            set_weight_attrs(carrier, {**extra_weight_attrs, "weight_loader": self._loader(layer, name)})
            layer.register_parameter(PLANE + name, carrier)

    def _loader(self, layer, field: str):
        def load(carrier: Parameter, rows_first: torch.Tensor, shard_id=None) -> None:
            # rows_first: [N, K/block, count], the whole GGUF tensor behind this shard, as
            # iter_weights yields it. Models that load through AutoWeightsLoader pass the
            # shard id on the tensor instead.
            if shard_id is None:
                shard_id = getattr(rows_first, "shard_id", None)
            load_plane(carrier, rows_first.transpose(0, 1), shard_id)

        def load_plane(carrier: Parameter, plane: torch.Tensor, shard_id) -> None:
            # plane: [K/block, N, count]
            if shard_id is None and len(layer.rp1_place) > 1:  # a fused tensor: split by rows
                for part, start, rows in _fused_shards(layer):
                    load_plane(carrier, plane.narrow(1, start, rows), part)
                return
            if isinstance(shard_id, tuple):  # one tensor for several shards: split by rows
                shards = {part: (start, rows) for part, start, rows in _fused_shards(layer)}
                first = shards[shard_id[0]][0]
                for part in shard_id:
                    start, rows = shards[part]
                    load_plane(carrier, plane.narrow(1, start - first, rows), part)
                return
            run, offset, rows = layer.rp1_place[_shard_index(shard_id)]
            target = getattr(layer, f"{PLANE}{run}_{field}").data.narrow(1, offset, rows)
            if plane.shape[0] != target.shape[0]:  # row parallel: this rank's blocks
                plane = plane.narrow(0, layer.tp_rank * target.shape[0], target.shape[0])
            self._copy_rows(layer, target, plane, shard_id)
            layer.rp1_filled.add((_shard_index(shard_id), field))
        return load

    def _copy_rows(self, layer, target, plane, shard_id) -> None:
        raise NotImplementedError

    def process_weights_after_loading(self, layer) -> None:
        missing = sorted(layer.rp1_expected - layer.rp1_filled)
        if missing:
            raise ValueError(f"gguf_repack: {self.prefix or type(layer).__name__}: the model's "
                             f"load_weights placed no planes for shard(s) "
                             f"{sorted({shard for shard, _ in missing})} (fields "
                             f"{sorted({f for _, f in missing})}): nothing would be computed with them")
        layer.rp1_weights = [
            QTensor(qtype, (n, layer.rp1_k), {f.name: getattr(layer, f"{PLANE}{i}_{f.name}")
                                              for f in qtype.fields})
            for i, (qtype, n) in enumerate(layer.rp1_shards)]

    def apply(self, layer, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        parts = [rp1_matmul(x, *_call(w)) for w in layer.rp1_weights]
        y = parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)
        return y if bias is None else y + bias


class RepackLinearMethod(_PlanesMethod, LinearMethodBase):
    """Linear layers: column and row parallel, merged QKV and gate/up."""

    def _copy_rows(self, layer, target, plane, shard_id) -> None:
        rows = target.shape[1]
        # every rank holds a replicated layer whole (DeepSeek-V2-Lite's kv_a_proj_with_mqa)
        if isinstance(layer, (RowParallelLinear, ReplicatedLinear)) or getattr(layer, "tp_size", 1) == 1:
            start = 0
        elif isinstance(layer, QKVParallelLinear) and shard_id in ("k", "v"):
            start = layer.tp_rank // layer.num_kv_head_replicas * rows
        else:
            start = layer.tp_rank * rows
        target.copy_(plane.narrow(1, start, rows))


class RepackEmbeddingMethod(_PlanesMethod):
    """The token embedding and the output projection (vocabulary parallel)."""

    def create_weights(self, layer, *args, **kwargs):
        super().create_weights(layer, *args, **kwargs)
        # vLLM's Gemma 3n reads its embeddings' weight.dtype as it builds the model (its scales'
        # buffers): the planes are no weight, an empty one says the dtype (vLLM reads the
        # weight itself only for an unquantized embedding's methods)
        params_dtype = kwargs["params_dtype"] if "params_dtype" in kwargs else args[4]
        layer.weight = torch.empty(0, dtype=params_dtype)

    def _copy_rows(self, layer, target, plane, shard_id) -> None:
        indices = layer.shard_indices
        start = indices.org_vocab_start_index
        rows = indices.org_vocab_end_index - start
        target[:, :rows].copy_(plane.narrow(1, start, rows))
        target[:, rows:].zero_()  # vocabulary padding: rows of zero weights

    def embedding(self, layer, ids: torch.Tensor) -> torch.Tensor:
        (weight,) = layer.rp1_weights
        return rp1_embedding(ids, *_call(weight), layer.compute_dtype)

    def tie_weights(self, layer, embed_tokens):
        """The output projection shares the embedding's planes; or, where the model built its
        embedding without the quantization config (Falcon's: held dequantized, logged), that
        float weight, as vLLM ties unquantized layers."""
        if not hasattr(embed_tokens, "rp1_shards"):
            for name in [n for n, _ in layer.named_parameters(recurse=False) if n.startswith(PLANE)]:
                delattr(layer, name)
            layer.quant_method = UnquantizedEmbeddingMethod()
            return layer.quant_method.tie_weights(layer, embed_tokens)
        layer.rp1_shards, layer.rp1_k = embed_tokens.rp1_shards, embed_tokens.rp1_k
        layer.rp1_place = embed_tokens.rp1_place
        layer.rp1_expected, layer.rp1_filled = embed_tokens.rp1_expected, embed_tokens.rp1_filled
        for name, param in embed_tokens.named_parameters(recurse=False):
            if name.startswith(PLANE):
                layer.register_parameter(name, param)
        return layer
