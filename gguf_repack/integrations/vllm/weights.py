"""The weights of a gguf-repack directory as vLLM's models load them: (name, tensor) pairs
under transformers' parameter names, through the same TensorMapping as the transformers
integration (gguf-py's name map and transformers' fixes: llama's Q/K rows, Gemma's norms).

A quantized tensor comes as its planes, `<module>.rp1_<field>`, which vLLM's own load_weights
routes to the layer (merging q/k/v and gate/up by the module name) and our weight loaders
place (the rank's slice, at the shard's offset). A plain tensor comes as itself. An expert
stack ([E, N, K], quantized or float) is not a (name, tensor) pair: the loader places it in its
experts layer directly (moe.py).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from vllm.logger import init_logger
from vllm.model_executor.model_loader import register_model_loader
from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

from gguf_repack.format.manifest import QUANT_METHOD
from gguf_repack.integrations.tensor_map import (
    EXPERT_TENSOR,
    MLA_KV_B_PART,
    checkpoint_renames,
    joined_from_parts,
    kv_b_from_parts,
    row_part,
    row_parts_of,
    stack_slice,
)
from gguf_repack.runtime.loader import load
from gguf_repack.runtime.qtensor import QTensor

from .names import PLANE, decoder_layer, mapping_for

logger = init_logger("vllm.gguf_repack")  # under vllm's logger, which vLLM configures


def iter_weights(directory: str | os.PathLike, wanted: Callable[[str], bool] = lambda name: True,
                 counts: dict[str, int] | None = None,
                 expert_stack: Callable[[str, QTensor], None] | None = None,
                 in_float: Callable[[str], bool] = lambda module: False,
                 row_order: Callable[[str, int], torch.Tensor | None] = lambda name, rows: None,
                 ) -> Iterator[tuple[str, torch.Tensor]]:
    """The directory's weights under transformers' names; with `wanted`, only the tensors
    whose name it accepts are read (a pipeline stage's layers). `counts` gets "read" and
    "tensors". Expert stacks (a QTensor, or float32 for a float stack) and expert biases
    (float32) go to `expert_stack(gguf name, stack)`; a quantized weight of a module that
    `in_float` names (one the model builds without the quantization config) comes dequantized,
    as `<module>.weight`. `row_order(name, rows)`: the row order the model's load_weights gives
    a float weight of that name, which a quantized one gets here (its planes are not named
    `.weight`), or None."""
    repacked = load(Path(directory))
    mapping = mapping_for(repacked)
    counts = {} if counts is None else counts
    counts.update(read=0, tensors=len(mapping.names))
    kv_b_parts: dict[str, dict] = {}  # MLA kv_b_proj -> {k, v}: one float weight once both came
    row_parts: dict[str, dict] = {}  # a ROW_PARTS parameter -> {part: ...}: joined once all came
    for gguf_name, hf_name in mapping.names:
        if not wanted(hf_name):
            continue
        counts["read"] += 1
        tensor = repacked[gguf_name]
        if hf_name in mapping.stacked:  # (one slice of a stacked tensor: Gemma 3n's AltUp)
            tensor = stack_slice(tensor, mapping.stacked[hf_name][1])
        if part := MLA_KV_B_PART.fullmatch(gguf_name):
            found = kv_b_parts.setdefault(hf_name, {})
            found[part["part"]] = (gguf_name, tensor)
            if len(found) == 2:
                weight, quantized = kv_b_from_parts(hf_name, kv_b_parts.pop(hf_name), mapping, torch.float32)
                counts.setdefault("float", []).extend(quantized)
                yield hf_name, weight
            continue
        if part := row_part(gguf_name, hf_name):
            found = row_parts.setdefault(hf_name, {})
            found[part] = (gguf_name, tensor)
            if len(found) == len(row_parts_of(hf_name)):
                weight, dequantized = joined_from_parts(hf_name, row_parts.pop(hf_name), mapping,
                                                      torch.float32)
                if isinstance(weight, QTensor):
                    yield from _planes(hf_name, weight, row_order)
                else:
                    counts.setdefault("float", []).extend(dequantized)
                    yield hf_name, weight
            continue
        # an expert stack of the file (placed by the plugin's loader, not the model's load_weights)
        expert = EXPERT_TENSOR.fullmatch(gguf_name)
        if expert:
            if expert_stack is None:
                raise ValueError(f"gguf_repack: {gguf_name} is an expert stack; iter_weights needs "
                                 f"expert_stack to place it")
            expert_stack(gguf_name, mapping.quantized(gguf_name, tensor) if isinstance(tensor, QTensor)
                         else mapping.plain(gguf_name, tensor, torch.float32))
        elif isinstance(tensor, QTensor) and in_float(hf_name.rpartition(".")[0]):
            counts.setdefault("float", []).append(gguf_name)
            yield hf_name, mapping.quantized(gguf_name, tensor).dequantize(torch.float32)
        elif isinstance(tensor, QTensor):
            yield from _planes(hf_name, mapping.quantized(gguf_name, tensor), row_order)
        else:
            yield hf_name, mapping.plain(gguf_name, tensor, torch.float32)
    for hf_name, value in mapping.from_metadata.items():  # (Apertus's xIELU parameters)
        if wanted(hf_name):
            yield hf_name, value
    for hf_name, found in kv_b_parts.items():  # a part without its other half: the error
        kv_b_from_parts(hf_name, found, mapping, torch.float32)
    for hf_name, found in row_parts.items():
        joined_from_parts(hf_name, found, mapping, torch.float32)


def _planes(hf_name: str, weight: QTensor, row_order) -> Iterator[tuple[str, torch.Tensor]]:
    """A quantized weight's planes under the plugin's names, in the row order the model's
    load_weights gives the float weight of that name."""
    module = hf_name.rpartition(".")[0]
    # rows first ([N, K/block, count], a view): a model's load_weights that reorders or splits
    # a fused tensor's rows on dim 0 (Bloom's QKV) does the same to the planes
    if (rows := row_order(hf_name, weight.shape[-2])) is not None:
        weight = weight.index_rows(rows)
    for field, plane in weight.planes.items():
        yield f"{module}.{PLANE}{field}", plane.transpose(0, 1)


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
        counts: dict = {}
        rename = _checkpoint_names(model, model_config.hf_config.model_type)
        weights = iter_weights(model_config.model, lambda name: not is_pp_missing_parameter(name, model),
                               counts, expert_stack=_expert_placer(model),
                               in_float=_held_in_float(model, rename),
                               row_order=_load_row_order(model, rename))
        yield from ((rename(name), tensor) for name, tensor in weights)
        logger.info("gguf_repack: pipeline stage %d read %d of the %d tensors of %s",
                    get_pp_group().rank_in_group, counts["read"], counts["tensors"], model_config.model)
        if counts.get("float"):
            logger.warning("gguf_repack: %s builds %d layers without the quantization config; their "
                           "weights are held dequantized: %s", type(model).__name__,
                           len(counts["float"]), ", ".join(counts["float"]))


    def load_weights(self, model, model_config) -> None:
        # vLLM checks that every parameter came from the checkpoint only for unquantized
        # models; a model whose load_weights skips names it does not know (gpt-oss's does)
        # would run on zeros. Check ours too (track_weights_loading below).
        if model_config.quantization == QUANT_METHOD and self.enable_weights_track is None:
            self.enable_weights_track = True
        super().load_weights(model, model_config)

    def track_weights_loading(self, model, loaded_weights, quantized: bool = False) -> None:
        """vLLM's check, with the parameters the plugin fills itself counted as loaded: the
        expert stacks (placed by this loader) and the planes behind the carriers that
        load_weights fills; their methods check those at process_weights_after_loading."""
        from .moe import RepackFloatMoEMethod, RepackMoEMethod
        from .quant import _PlanesMethod

        if loaded_weights is None:  # a model that does not say what it loaded: nothing to check
            return
        placed = set()
        for name, module in model.named_modules():
            method = getattr(module, "quant_method", None)
            if isinstance(method, (RepackMoEMethod, RepackFloatMoEMethod, _PlanesMethod)):
                # (a float experts layer's parameters are all placed by the loader)
                placed |= {f"{name}.{param}" for param, _ in module.named_parameters(recurse=False)
                           if param.startswith(PLANE) or isinstance(method, RepackFloatMoEMethod)}
        super().track_weights_loading(model, loaded_weights | placed, quantized)


def _checkpoint_names(model, model_type: str) -> Callable[[str], str]:
    """transformers 5 renamed some checkpoint names (Mixtral's `.block_sparse_moe.` is `.mlp.`)
    and reads older checkpoints through its conversion mapping; vLLM's models keep the older
    names. A name is renamed back by transformers' own renamings for the model type (each
    alone, and all in turn: PhiMoE's `mlp.router` was `block_sparse_moe.gate`): to a parameter
    the model has (EXAONE-MoE's gate.e_score_correction_bias, whose module it also has, is its
    mlp's); kept where its module is the model's; else to a module the model has, else to the
    checkpoint's name."""
    renames = checkpoint_renames(model_type)
    modules = {name for name, _ in model.named_modules()}
    params = {name for name, _ in model.named_parameters()}

    def rename(name: str) -> str:
        chained = name
        for target, source in renames:
            chained = re.sub(target, source, chained)
        spellings = [*(re.sub(target, source, name) for target, source in renames), chained]
        if name not in params and (found := next((s for s in spellings if s in params), None)):
            return found
        if name.rpartition(".")[0] in modules:
            return name
        for renamed in spellings:
            if renamed.rpartition(".")[0] in modules:
                return renamed
        # neither is a module: the checkpoint's name, which the model's load_weights reads
        # from a real checkpoint (ERNIE-MoE's mlp.moe_statics, renamed to its gate.moe_statics)
        return next((renamed for renamed in spellings if renamed != name), name)
    return rename


def _load_row_order(model, rename: Callable[[str], str]) -> Callable[[str, int], torch.Tensor | None]:
    """The row permutation a model's load_weights applies to a float `.weight` of that name
    (vLLM's Llama 4 reorders the q/k rows from the checkpoint's interleaved rope to its own),
    found by running it on the row numbers, as tensor_map.row_permutation does transformers'
    fixes; None where it leaves the rows alone. A quantized weight's planes, which the model
    does not recognize as a weight, get it here: a row order is exact on the blocks."""
    permute = getattr(model, "permute_qk_weight_for_rotary", None)
    if permute is None:
        return lambda name, rows: None

    def row_order(name: str, rows: int) -> torch.Tensor | None:
        probe = torch.arange(rows, dtype=torch.float64)[:, None]
        _, result = permute(rename(name), probe)
        order = result[:, 0].round().long()
        if torch.equal(order, torch.arange(rows)):
            return None
        if not torch.equal(order.sort().values, torch.arange(rows)):
            raise ValueError(f"gguf_repack: {name}: {type(model).__name__} changes this weight's values "
                             f"at load, which a quantized weight cannot follow")
        return order
    return row_order


def _held_in_float(model, rename: Callable[[str], str]) -> Callable[[str], bool]:
    """Whether the model's module of that name holds a float weight and no rp1 planes (a layer
    the model builds without the quantization config, as vLLM's Mixtral does its token
    embedding and gpt-oss its output projection). The name is found as the model's
    load_weights finds it: renamed back to the checkpoint's, then by the model's own
    hf_to_vllm_mapper (gpt-oss: `embed_tokens` is `embedding`). Names the model merges (q_proj
    into qkv_proj) are not modules: False."""
    mapper = getattr(model, "hf_to_vllm_mapper", None)

    def in_float(name: str) -> bool:
        param = rename(name + ".weight")
        param = (mapper._map_name(param) or param) if mapper is not None else param
        try:
            module = model.get_submodule(param.rpartition(".")[0])
        except AttributeError:
            return False
        params = dict(module.named_parameters(recurse=False))
        return "weight" in params and not any(n.startswith(PLANE) for n in params)
    return in_float


def _expert_placer(model) -> Callable[[str, QTensor], None]:
    """Places blk.N.ffn_{gate,up,down}_exps into the experts layer of decoder layer N."""
    from .moe import RepackFloatMoEMethod, RepackMoEMethod

    layers = {}
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if isinstance(method, (RepackMoEMethod, RepackFloatMoEMethod)):
            layers[decoder_layer(method.prefix)] = module

    def place(gguf_name: str, stack: QTensor | torch.Tensor) -> None:
        block, role, kind = EXPERT_TENSOR.fullmatch(gguf_name).groups()
        if int(block) not in layers:
            raise ValueError(f"gguf_repack: {gguf_name}: the model has no experts layer in "
                             f"decoder layer {block}")
        layer = layers[int(block)]
        if kind == "bias":
            layer.quant_method.place_bias(layer, role, stack)
        elif role == "gate_up":  # (Gemma 4's one tensor: gate's rows, then up's)
            for half, part in zip(("gate", "up"), _halves(stack)):
                layer.quant_method.place_stack(layer, half, part)
        else:
            layer.quant_method.place_stack(layer, role, stack)
    return place


def _halves(stack: QTensor | torch.Tensor):
    """A joined gate_up expert stack [E, 2 x N, K] as its gate and up stacks (rows hold whole
    blocks: exact on a quantized one)."""
    if isinstance(stack, QTensor):
        return stack.shard(1, 0, 2), stack.shard(1, 1, 2)
    return stack.chunk(2, dim=1)


def register_loader() -> None:
    register_model_loader("auto")(RepackAwareModelLoader)
