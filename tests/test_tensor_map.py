"""The one tensor mapping (gguf_repack/integrations/tensor_map.py): every GGUF tensor goes to a
transformers parameter, is skipped for a listed reason, or is an error that names it. The
reference for the names is transformers' own models (their parameters), and for the tensors
the names llama.cpp writes (gguf-py's name map)."""

import numpy as np
import pytest
import torch
from hf_models import byte_tokenizer_kvs, write_model, write_qwen3_moe

import gguf_repack
from gguf_repack.errors import RepackError
from gguf_repack.integrations.tensor_map import (
    SKIPPED,
    TensorMapping,
    gguf_to_hf_names,
    meta_model,
    tensor_processor,
)


class Listing(dict):
    """What TensorMapping reads of a loaded output: its tensor names and architecture."""

    def __init__(self, arch: str, names: list[str]):
        super().__init__(dict.fromkeys(names))
        self.metadata = {"general.architecture": arch}


def moe_tensors(layer_tensors: list[str]) -> list[str]:
    """The tensors llama.cpp writes for a 2-layer MoE model (convert_hf_to_gguf.py)."""
    per_layer = ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm",
                 "ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", *layer_tensors]
    return ["token_embd.weight", "output_norm.weight", "output.weight",
            *(f"blk.{i}.{t}" + ("" if t.endswith(".bias") else ".weight")
              for i in range(2) for t in per_layer)]


SMALL_MOE = dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, num_experts=4,
                 num_experts_per_tok=2, vocab_size=100, tie_word_embeddings=False)


@pytest.mark.parametrize("arch", ["qwen3moe", "qwen2moe"])
def test_expert_stacks_map_to_transformers_joined_parameters(arch):
    """gate and up expert stacks both go to transformers' one gate_up_proj (its fallback
    mapping), down to down_proj, with their .weight suffix; every parameter of the model has
    its tensor. (The old mapping dropped them and load_model said "no tensor for N model
    weights".)"""
    from transformers import Qwen2MoeConfig, Qwen3MoeConfig

    if arch == "qwen3moe":
        model = meta_model(Qwen3MoeConfig(**SMALL_MOE, head_dim=16))
        listing = Listing(arch, moe_tensors(["attn_q_norm", "attn_k_norm"]))
    else:
        model = meta_model(Qwen2MoeConfig(**SMALL_MOE, shared_expert_intermediate_size=64))
        listing = Listing(arch, moe_tensors(
            ["ffn_gate_inp_shexp", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp",
             "attn_q.bias", "attn_k.bias", "attn_v.bias"]))
    mapping = TensorMapping(model, listing)
    to = dict(mapping.names)
    assert set(to) == set(listing) and mapping.skipped == {}
    assert to["blk.1.ffn_gate_exps.weight"] == to["blk.1.ffn_up_exps.weight"] \
        == "model.layers.1.mlp.experts.gate_up_proj"
    assert to["blk.1.ffn_down_exps.weight"] == "model.layers.1.mlp.experts.down_proj"
    assert set(to.values()) == {name for name, _ in model.named_parameters()}


def test_a_tensor_without_a_parameter_is_an_error_that_names_it():
    from transformers import LlamaConfig

    model = meta_model(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=100))
    names = ["token_embd.weight", "output_norm.weight", "output.weight", "blk.0.attn_norm.weight",
             "blk.0.ffn_gate_exps.weight", "blk.0.mystery.weight"]
    with pytest.raises(RepackError) as error:
        TensorMapping(model, Listing("llama", names))
    message = str(error.value)
    assert "2 GGUF tensors" in message and "'llama'" in message and "LlamaForCausalLM" in message
    assert "blk.0.ffn_gate_exps.weight" in message and "blk.0.mystery.weight" in message


@pytest.fixture
def written(tmp_path):
    def write(extra):
        src = write_model(tmp_path / "m.gguf", "qwen2", byte_tokenizer_kvs(),
                          np.random.default_rng(3), extra=extra)
        out = tmp_path / "out"
        gguf_repack.convert(src, out)
        return out
    return write


def test_load_model_names_an_unmapped_tensor_instead_of_calling_the_output_damaged(written):
    from gguf_repack.hf import load_model

    out = written({"blk.0.ffn_extra.weight": np.ones(8, np.float32)})
    with pytest.raises(RepackError, match=r"1 GGUF tensors of this 'qwen2' .*blk\.0\.ffn_extra\.weight"):
        load_model(out)


def test_rope_frequencies_are_skipped_for_their_listed_reason(written):
    """llama.cpp stores rope_freqs for llama 3 style rope scaling; transformers computes them
    from config.json. The mapping lists the skip with its reason and the model loads."""
    from gguf_repack.hf import load_model

    out = written({"rope_freqs.weight": np.ones(32, np.float32)})
    repacked = gguf_repack.load(out)
    mapping = TensorMapping.for_output(repacked)
    assert mapping.skipped == {"rope_freqs.weight": SKIPPED[r"rope_freqs\.weight"]}
    assert "rope_freqs.weight" not in dict(mapping.names)
    model = load_model(out)
    with torch.no_grad():
        assert torch.isfinite(model(torch.tensor([[1, 100, 200]])).logits).all()


def test_a_converted_moe_model_maps_every_tensor(tmp_path):
    """A Qwen3-MoE file as llama.cpp writes one: its output is complete and every tensor is
    mapped (none is "missing"); tests/test_moe.py runs it."""
    src = write_qwen3_moe(tmp_path / "moe.gguf", byte_tokenizer_kvs(), np.random.default_rng(5))
    out = tmp_path / "out"
    gguf_repack.convert(src, out)
    assert gguf_repack.verify(out, against=src).ok
    mapping = TensorMapping.for_output(gguf_repack.load(out))
    assert len(mapping.names) == len(gguf_repack.load(out)) and mapping.skipped == {}


class DeviceTensor(torch.Tensor):
    """A tensor that, like one on a GPU, has no numpy view: `.cpu()` first (the check on an H200
    found load_model(out, "cuda") failing here: "can't convert cuda:0 device type tensor to
    numpy")."""

    def numpy(self, *args, **kwargs):
        raise TypeError("can't convert cuda:0 device type tensor to numpy")

    def cpu(self, *args, **kwargs):
        return self.as_subclass(torch.Tensor)


def test_a_float_tensor_on_a_device_is_processed_through_the_host():
    """transformers' gemma processor takes 1 from a norm's weight, and takes numpy arrays: a norm
    loaded onto a GPU goes through the host and comes back processed."""
    from gguf_repack.integrations.tensor_map import process_plain, tensor_processor

    norm = torch.tensor([1.0, 1.5, 3.0])
    got = process_plain(tensor_processor("gemma3", {}), "blk.0.attn_norm.weight",
                        norm.as_subclass(DeviceTensor))
    assert torch.equal(got.as_subclass(torch.Tensor), torch.tensor([0.0, 0.5, 2.0]))


def test_qwen35_value_head_order_undoes_the_converters_and_splits_k_quant_blocks():
    """Qwen3.5-9B's delta-net: 16 key heads, 32 value heads of 128. llama.cpp's converter writes
    the value heads by their place in their key head's group (its _reorder_v_heads: (key heads,
    group, width) -> (group, key heads, width)); the mapping's order takes them back, rows and
    ssm_out's columns alike. In blocks of 32 that is an order of whole blocks; in K-quants'
    blocks of 256 it is not (two heads a block, of different groups)."""
    from gguf_repack.integrations.tensor_map import (
        column_blocks,
        converter_column_order,
        converter_row_order,
    )

    config = {"model_type": "qwen3_5_text", "linear_num_key_heads": 16, "linear_num_value_heads": 32,
              "linear_key_head_dim": 128, "linear_value_head_dim": 128}
    model_order = torch.arange(32 * 128)
    file_order = model_order.reshape(16, 2, 128).permute(1, 0, 2).reshape(-1)  # the converter's
    columns = converter_column_order(config, "blk.0.ssm_out.weight")
    assert torch.equal(file_order[columns], model_order)
    assert torch.equal(file_order[converter_row_order(config, "blk.0.attn_gate.weight")], model_order)
    qkv = converter_row_order(config, "blk.0.attn_qkv.weight")
    assert torch.equal(qkv[:4096], torch.arange(4096)) and torch.equal(qkv[4096:] - 4096, columns)
    heads = converter_row_order(config, "blk.0.ssm_a")
    assert torch.equal(torch.arange(32).reshape(16, 2).T.reshape(-1)[heads], torch.arange(32))
    assert converter_row_order(config, "blk.3.attn_q.weight") is None
    assert column_blocks(columns, 32) is not None and column_blocks(columns, 256) is None
    equal_heads = {**config, "linear_num_value_heads": 16}
    assert converter_column_order(equal_heads, "blk.0.ssm_out.weight") is None


def test_parameters_written_as_metadata_come_from_their_keys_or_an_error_names_the_key():
    """Apertus's xIELU parameters, one value per layer in a key (llama.cpp's converter writes
    them there): each layer's parameter from its key, in the parameter's shape; a file without
    the key, or with a value per layer too few, is refused naming the key."""
    from transformers import AutoConfig

    from gguf_repack.errors import FormatError

    config = AutoConfig.for_model("apertus", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                  num_attention_heads=2, num_key_value_heads=2, vocab_size=64)
    model = meta_model(config)
    names = ["token_embd.weight", "output_norm.weight", "output.weight",
             *(f"blk.{i}.{t}.weight" for i in range(2) for t in (
                 "attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm",
                 "ffn_norm", "ffn_up", "ffn_down"))]
    listing = Listing("apertus", names)
    keys = {"xielu.alpha_n": [0.25, 0.5], "xielu.alpha_p": [0.75, 1.0], "xielu.beta": [0.5, 0.5],
            "xielu.eps": [-1e-6, -1e-6]}
    listing.metadata.update(keys)
    got = TensorMapping(model, listing).from_metadata
    assert got["model.layers.1.mlp.act_fn.alpha_p"].tolist() == [1.0]  # (a parameter of shape (1,))
    assert got["model.layers.0.mlp.act_fn.beta"].shape == ()  # (a buffer, a scalar)
    assert len(got) == 8
    for broken in ({**keys, "xielu.alpha_p": [0.75]}, {k: v for k, v in keys.items() if k != "xielu.eps"}):
        listing.metadata = {"general.architecture": "apertus", **broken}
        with pytest.raises(FormatError, match=r"xielu\.(alpha_p|eps): apertus models have one value"):
            TensorMapping(model, listing)


def test_a_stacked_tensor_goes_to_one_parameter_a_slice_and_a_slice_too_many_is_named():
    """Gemma 3n's AltUp projections, which llama.cpp's converter stacks into one (3, hidden,
    hidden) tensor: each linear layer gets its slice; a stack of more slices than the model
    has layers is refused, naming the layer it lacks (nothing dropped)."""
    from transformers import AutoConfig

    config = AutoConfig.for_model("gemma3n_text", hidden_size=64, intermediate_size=[128],
                                  num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                                  head_dim=32, vocab_size=64,
                                  vocab_size_per_layer_input=64, hidden_size_per_layer_input=8, laurel_rank=8,
                                  num_kv_shared_layers=0, layer_types=["full_attention"],
                                  activation_sparsity_pattern=[0.0])
    model = meta_model(config)
    names = {name: torch.zeros(1) for name in gguf_to_hf_names(model, "gemma3n", tensor_processor(
        "gemma3n", config.to_dict()))}
    for slices, ok in ((3, True), (4, False)):
        listing = Listing("gemma3n", [])
        listing.update(names)
        listing.update({"altup_proj.weight": torch.zeros(slices, 64, 64),
                        "altup_unembd_proj.weight": torch.zeros(3, 64, 64)})
        if not ok:
            with pytest.raises(RepackError, match=r"altup_proj\.weight: 4 stacked weights, and .* has no "
                                                  r"model\.altup_projections\.3\.weight"):
                TensorMapping(model, listing)
            continue
        mapping = TensorMapping(model, listing)
        assert mapping.stacked["model.altup_projections.2.weight"] == ("altup_proj.weight", 2)
        assert [hf for name, hf in mapping.names if name == "altup_unembd_proj.weight"] == \
            [f"model.altup_unembed_projections.{i}.weight" for i in range(3)]
