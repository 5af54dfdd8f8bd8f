"""Small random-weight models of architectures we have no real file for (qwen2, qwen3, mistral),
written by gguf's GGUFWriter and quantized by gguf-py's own quantizers (llama.cpp's reference
in Python). The tokenizer key/values are copied from SmolLM2's llama.cpp-made file."""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
from collections import OrderedDict
from pathlib import Path
from types import SimpleNamespace

import gguf
import numpy as np
import torch
from ggml_blocks import random_blocks
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType as V

from gguf_repack.format.type_table import F16, TYPES

# hidden, heads, kv heads, head dim, ffn width: K a multiple of 256 for every projection
SHAPES = {
    "qwen2": dict(hidden=256, heads=4, kv_heads=2, head_dim=64, ffn=512, tied=False),
    # transformers' GGUF config has no head_dim for qwen3, so the class default (128) applies
    "qwen3": dict(hidden=256, heads=2, kv_heads=1, head_dim=128, ffn=512, tied=True),
    "mistral": dict(hidden=256, heads=4, kv_heads=2, head_dim=64, ffn=512, tied=False),
    # for tensor parallelism: 8 heads, 4 KV heads; K-quants beside legacy types
    "llama": dict(hidden=512, heads=8, kv_heads=4, head_dim=64, ffn=1024, tied=False),
    # q, k and v in one tensor (attn_qkv), gate and up in one (ffn_up), as llama.cpp writes phi3
    "phi3": dict(hidden=256, heads=4, kv_heads=2, head_dim=64, ffn=512, tied=False),
}
# a different llama.cpp quant type per projection, all of them ones gguf-py can quantize
PROJECTION_TYPES = {"attn_q": T.Q4_0, "attn_k": T.Q5_1, "attn_v": T.Q8_0, "attn_output": T.Q4_1,
                    "ffn_gate": T.Q5_0, "ffn_up": T.Q4_0, "ffn_down": T.Q8_0, "attn_qkv": T.Q5_0}
# gguf-py cannot quantize to K-quants: these are random valid blocks with small scales
K_QUANT_TYPES = {"attn_q": T.Q4_K, "attn_output": T.Q5_K, "ffn_down": T.Q6_K}
N_LAYERS = 2
KL_MAX = 1e-4  # per position, against transformers' GGUF path


def kl_per_position(ref_logits: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    p = torch.log_softmax(ref_logits.double(), -1)
    q = torch.log_softmax(logits.double(), -1)
    return (p.exp() * (p - q)).sum(-1)


def assert_same_predictions(model, ref_model, ids, steps: int):
    """KL <= KL_MAX at every position of `ids`, and the same `steps` greedy tokens."""
    with torch.no_grad():
        kl = kl_per_position(ref_model(ids).logits[0], model(ids).logits[0])
        assert kl.max().item() <= KL_MAX, kl
        # (the mask given: generate would take a prompt token equal to a model's pad id for
        # padding, and the two configs may name different pad ids)
        mask = torch.ones_like(ids)
        ref_tokens = ref_model.generate(ids, attention_mask=mask, max_new_tokens=steps, do_sample=False)
        tokens = model.generate(ids, attention_mask=mask, max_new_tokens=steps, do_sample=False)
    assert tokens.tolist() == ref_tokens.tolist()


def tokenizer_kvs(source: Path) -> list[tuple]:
    """Every tokenizer.* key/value of a GGUF file, as GGUFWriter.add_key_value arguments (read
    by gguf-py once a file: a module's tests ask for SmolLM2's again and again)."""
    def read():
        kvs = []
        for key, field in gguf.GGUFReader(source).fields.items():
            if not key.startswith("tokenizer."):
                continue
            vtype = field.types[0]
            sub = field.types[1] if vtype == V.ARRAY else None
            kvs.append((key, field.contents(), vtype, sub))
        return kvs
    return list(_kept(_TOKENIZER_KVS, _file_key(source), read))


def byte_tokenizer_kvs() -> list[tuple]:
    """A tokenizer with no source file: llama's SentencePiece kind, with <unk>, <s>, </s>, the
    256 byte tokens and a few words, as GGUFWriter.add_key_value arguments."""
    words = ["▁" + w for w in "the a of and to in is it that was for on are with as".split()]
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{i:02X}>" for i in range(256)), *words,
              *"▁abcdefghijklmnopqrstuvwxyz"]
    types = [2, 3, 3, *[6] * 256, *[1] * (len(tokens) - 259)]  # unknown, control, byte, normal
    scores = [0.0] * 259 + [-float(i) for i in range(len(tokens) - 259)]
    return [("tokenizer.ggml.model", "llama", V.STRING, None),
            ("tokenizer.ggml.tokens", tokens, V.ARRAY, V.STRING),
            ("tokenizer.ggml.scores", scores, V.ARRAY, V.FLOAT32),
            ("tokenizer.ggml.token_type", types, V.ARRAY, V.INT32),
            ("tokenizer.ggml.bos_token_id", 1, V.UINT32, None),
            ("tokenizer.ggml.eos_token_id", 2, V.UINT32, None),
            ("tokenizer.ggml.unknown_token_id", 0, V.UINT32, None)]


def bpe_tokenizer_kvs() -> list[tuple]:
    """A small byte-level BPE tokenizer (GPT-2's kind, llama.cpp's model "gpt2"): the 256 byte
    symbols, a few merges and their words, as GGUFWriter.add_key_value arguments. Reading
    SmolLM2's 49k-token one costs transformers' GGUF path about 15 s a model."""
    # GPT-2's printable stand-ins for the 256 bytes
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    symbols = [chr(b if b in printable else next(extra)) for b in range(256)]
    merges = ["Ġ t", "h e", "Ġt he", "Ġ a", "i n", "Ġ c", "o n", "e r", "Ġ o", "a t", "Ġ f", "r e"]
    tokens = ["<|endoftext|>", *symbols, *(m.replace(" ", "") for m in merges)]
    return [("tokenizer.ggml.model", "gpt2", V.STRING, None),
            ("tokenizer.ggml.pre", "default", V.STRING, None),
            ("tokenizer.ggml.tokens", tokens, V.ARRAY, V.STRING),
            ("tokenizer.ggml.token_type", [3] + [1] * (len(tokens) - 1), V.ARRAY, V.INT32),
            ("tokenizer.ggml.merges", merges, V.ARRAY, V.STRING),
            ("tokenizer.ggml.bos_token_id", 0, V.UINT32, None),
            ("tokenizer.ggml.eos_token_id", 0, V.UINT32, None),
            # (a config class's default padding id, Phi-3's 32000, would be past this vocabulary)
            ("tokenizer.ggml.padding_token_id", 0, V.UINT32, None)]


def k_quant_bytes(qtype, rows: int, cols: int, rng) -> np.ndarray:
    """Random valid blocks whose weights stay small (f16 scales of about 1e-3)."""
    blocks = random_blocks(qtype, (rows, cols), rng)
    for f in TYPES[qtype].fields:
        if f.kind == F16:
            n = blocks[..., f.offset:f.offset + f.size]
            n[...] = rng.uniform(-1e-3, 1e-3, n.shape[:-1] + (f.size // 2,)).astype("<f2").view(np.uint8)
    return blocks.reshape(rows, -1)


def write_model(path: Path, name: str, tokenizer: list[tuple], rng: np.random.Generator,
                general_name: str | None = None, context_length: int = 512,
                extra: dict[str, np.ndarray] | None = None, shape: dict | None = None,
                types: dict | None = None) -> Path:
    """A 2-layer `name` model (a key of SHAPES) at `path`, and the float tensors
    `extra`. llama.cpp writes Mistral as the llama architecture; transformers reads it as
    mistral only when `general.name` is exactly "mistral" (the default here), and as llama
    otherwise. `shape` replaces SHAPES[name], `types` the projections' types (PROJECTION_TYPES
    and K_QUANT_TYPES; K-quants written as random valid blocks)."""
    s = shape or SHAPES[name]
    arch = "llama" if name in ("mistral", "llama") else name
    h, hd = s["hidden"], s["head_dim"]
    vocab = len(next(v for k, v, *_ in tokenizer if k == "tokenizer.ggml.tokens"))
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(general_name or name)
    w.add_context_length(context_length)
    w.add_block_count(N_LAYERS)
    w.add_embedding_length(h)
    w.add_feed_forward_length(s["ffn"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv_heads"])
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(vocab)
    for key, value, vtype, sub in tokenizer:
        w.add_key_value(key, value, vtype, sub_type=sub)

    def quantized(tensor_name, qtype, rows, cols):
        weights = rng.normal(0, cols ** -0.5, (rows, cols)).astype(np.float32)
        w.add_tensor(tensor_name, gguf.quants.quantize(weights, qtype), raw_dtype=qtype)

    def plain(tensor_name, n, around=1.0):
        w.add_tensor(tensor_name, (around + rng.normal(0, 0.1, n)).astype(np.float32))

    quantized("token_embd.weight", T.Q8_0, vocab, h)
    rows = {"attn_q": s["heads"] * hd, "attn_k": s["kv_heads"] * hd, "attn_v": s["kv_heads"] * hd,
            "attn_output": h, "ffn_gate": s["ffn"], "ffn_up": s["ffn"], "ffn_down": h}
    cols = {"attn_output": s["heads"] * hd, "ffn_down": s["ffn"]}
    if name == "phi3":
        rows = {"attn_qkv": (s["heads"] + 2 * s["kv_heads"]) * hd, "attn_output": h,
                "ffn_up": 2 * s["ffn"], "ffn_down": h}
    for i in range(N_LAYERS):
        plain(f"blk.{i}.attn_norm.weight", h)
        plain(f"blk.{i}.ffn_norm.weight", h)
        for proj, qtype in (types or PROJECTION_TYPES).items():
            if proj not in rows:
                continue
            if (name == "llama" and not types and proj in K_QUANT_TYPES) or \
                    (types and gguf.GGML_QUANT_SIZES[qtype][0] == 256):  # a K-quant: random blocks
                kq = qtype if types else K_QUANT_TYPES[proj]
                w.add_tensor(f"blk.{i}.{proj}.weight", k_quant_bytes(kq, rows[proj], cols.get(proj, h), rng),
                             raw_dtype=kq)
                continue
            quantized(f"blk.{i}.{proj}.weight", qtype, rows[proj], cols.get(proj, h))
        if name == "qwen2":
            for proj in ("attn_q", "attn_k", "attn_v"):
                plain(f"blk.{i}.{proj}.bias", rows[proj], around=0.0)
        if name == "qwen3":
            plain(f"blk.{i}.attn_q_norm.weight", hd)
            plain(f"blk.{i}.attn_k_norm.weight", hd)
    plain("output_norm.weight", h)
    if not s["tied"]:
        quantized("output.weight", T.Q8_0, vocab, h)
    for tensor_name, value in (extra or {}).items():
        w.add_tensor(tensor_name, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# Mixture-of-experts models as llama.cpp's converter writes them: expert stacks
# ffn_{gate,up,down}_exps [E, N, K] and a float router ffn_gate_inp [E, hidden]. "mixtral" is
# written as llama.cpp writes Mixtral: architecture `llama` with llama.expert_count. Expert widths
# are the defaults of transformers' config classes, which its GGUF path keeps (it maps no
# expert_feed_forward_length): Qwen3-MoE 768, Qwen2-MoE 1408 and a 5632 shared expert.
MOE = {
    "qwen3moe": dict(experts=4, used=2, expert_ffn=768),
    "qwen2moe": dict(experts=4, used=2, expert_ffn=1408, shared_ffn=5632),
    "mixtral": dict(experts=8, used=2, expert_ffn=512),
    # as llama.cpp's converter writes gpt-oss: biases on attention, router and experts, one
    # attention sink per head, yarn rope scaling, every other layer sliding-window attention
    "gpt-oss": dict(experts=4, used=2, expert_ffn=256, sliding_window=4),
}
# expert types per layer (gate, up, down): layer 0 as Q4_K_M (gate and up of one type, so
# joined), layer 1 three different types; K-quants and IQ4_XS need K a multiple of 256, so
# Qwen2-MoE's down (K = 1408) takes 32-weight blocks
MOE_EXPERT_TYPES = [(T.Q4_K, T.Q4_K, T.Q6_K), (T.IQ4_XS, T.Q8_0, T.MXFP4)]
# llama.cpp writes gpt-oss's experts in MXFP4 as OpenAI ships them; layer 1 as a requantized file
GPT_OSS_EXPERT_TYPES = [(T.MXFP4, T.MXFP4, T.MXFP4), (T.Q4_K, T.Q8_0, T.Q6_K)]
QUANTIZABLE = {T.Q8_0, T.MXFP4, T.Q4_0, T.Q5_0}  # by gguf-py; the others are random valid blocks


def write_moe(path: Path, name: str, tokenizer: list[tuple], rng: np.random.Generator,
              expert_ffn: int | None = None, expert_types=MOE_EXPERT_TYPES, layers: int = N_LAYERS,
              experts: int | None = None, hidden: int = 256, head_dim: int = 64) -> Path:
    """A 2-layer MoE model (a key of MOE) at `path`; `expert_ffn` overrides the expert width,
    `expert_types` the types (as MOE_EXPERT_TYPES, by layer, the last repeated), `layers` and
    `experts` the counts (scripts/bench_moe.py writes a larger one), `hidden` and `head_dim`
    the widths (4 heads, 2 KV heads; gpt-oss 8 heads)."""
    m = {**MOE[name], **({"expert_ffn": expert_ffn} if expert_ffn else {}),
         **({"experts": experts} if experts else {})}
    arch = "llama" if name == "mixtral" else name
    if name == "gpt-oss" and expert_types is MOE_EXPERT_TYPES:
        expert_types = GPT_OSS_EXPERT_TYPES
    h, heads, kv_heads = hidden, 4, 2
    if name == "gpt-oss":  # its attention is wider than its hidden size (64 heads of 64 in 2880)
        heads = 8
    vocab = len(next(v for k, v, *_ in tokenizer if k == "tokenizer.ggml.tokens"))
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(name)
    w.add_context_length(512)
    w.add_block_count(layers)
    w.add_embedding_length(h)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(vocab)
    w.add_expert_count(m["experts"])
    w.add_expert_used_count(m["used"])
    if name == "mixtral":  # llama.cpp writes Mixtral's expert width as the FFN length
        w.add_feed_forward_length(m["expert_ffn"])
        w.add_rope_dimension_count(head_dim)
    else:
        w.add_feed_forward_length(2 * m["expert_ffn"])
        w.add_expert_feed_forward_length(m["expert_ffn"])
    if name == "qwen3moe":
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if name == "qwen2moe":
        w.add_expert_shared_feed_forward_length(m["shared_ffn"])
    if name == "gpt-oss":
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
        w.add_sliding_window(m["sliding_window"])
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(4.0)
        w.add_rope_scaling_orig_ctx_len(128)
    for key, value, vtype, sub in tokenizer:
        w.add_key_value(key, value, vtype, sub_type=sub)

    def quantized(tensor_name, shape, qtype=T.Q8_0):
        if qtype in (T.F16, T.F32):  # a float stack, as an unquantized file holds it
            weights = rng.normal(0, shape[-1] ** -0.5, shape)
            w.add_tensor(tensor_name, weights.astype(np.float16 if qtype == T.F16 else np.float32))
            return
        if qtype in QUANTIZABLE:
            weights = rng.normal(0, shape[-1] ** -0.5, shape).astype(np.float32)
            data = gguf.quants.quantize(weights, qtype)
        else:
            rows = int(np.prod(shape[:-1]))
            data = k_quant_bytes(qtype, rows, shape[-1], rng).reshape(*shape[:-1], -1)
        w.add_tensor(tensor_name, data, raw_dtype=qtype)

    def plain(tensor_name, shape, around=1.0):
        w.add_tensor(tensor_name, (around + rng.normal(0, 0.1, shape)).astype(np.float32))

    e, ffn = m["experts"], m["expert_ffn"]
    quantized("token_embd.weight", (vocab, h))
    for i in range(layers):
        plain(f"blk.{i}.attn_norm.weight", h)
        plain(f"blk.{i}.{'post_attention_norm' if name == 'gpt-oss' else 'ffn_norm'}.weight", h)
        if name == "qwen3moe":
            plain(f"blk.{i}.attn_q_norm.weight", head_dim)
            plain(f"blk.{i}.attn_k_norm.weight", head_dim)
        quantized(f"blk.{i}.attn_q.weight", (heads * head_dim, h))
        quantized(f"blk.{i}.attn_k.weight", (kv_heads * head_dim, h))
        quantized(f"blk.{i}.attn_v.weight", (kv_heads * head_dim, h))
        quantized(f"blk.{i}.attn_output.weight", (h, heads * head_dim))
        if name in ("qwen2moe", "gpt-oss"):
            for proj, n in (("attn_q", heads), ("attn_k", kv_heads), ("attn_v", kv_heads)):
                plain(f"blk.{i}.{proj}.bias", n * head_dim, around=0.0)
        plain(f"blk.{i}.ffn_gate_inp.weight", (e, h), around=0.0)
        if name == "gpt-oss":
            plain(f"blk.{i}.attn_output.bias", h, around=0.0)
            plain(f"blk.{i}.attn_sinks.weight", heads, around=0.0)
            plain(f"blk.{i}.ffn_gate_inp.bias", e, around=0.0)
            for proj, n in (("gate", ffn), ("up", ffn), ("down", h)):
                plain(f"blk.{i}.ffn_{proj}_exps.bias", (e, n), around=0.0)
        gate, up, down = expert_types[min(i, len(expert_types) - 1)]
        if ffn % 256:
            down = T.Q8_0 if down != T.MXFP4 else down
        quantized(f"blk.{i}.ffn_gate_exps.weight", (e, ffn, h), gate)
        quantized(f"blk.{i}.ffn_up_exps.weight", (e, ffn, h), up)
        quantized(f"blk.{i}.ffn_down_exps.weight", (e, h, ffn), down)
        if name == "qwen2moe":
            shared = m["shared_ffn"]
            plain(f"blk.{i}.ffn_gate_inp_shexp.weight", h, around=0.0)
            quantized(f"blk.{i}.ffn_gate_shexp.weight", (shared, h), T.Q4_K)
            quantized(f"blk.{i}.ffn_up_shexp.weight", (shared, h), T.Q4_K)
            quantized(f"blk.{i}.ffn_down_shexp.weight", (h, shared), T.Q6_K)
    plain("output_norm.weight", h)
    quantized("output.weight", (vocab, h))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_qwen3_moe(path: Path, tokenizer: list[tuple], rng: np.random.Generator) -> Path:
    return write_moe(path, "qwen3moe", tokenizer, rng)


# what gguf_read_once keeps, by file (_file_key), the most recently used last
_GGUF_READERS: OrderedDict = OrderedDict()  # GGUFReader objects
_GGUF_METADATA: OrderedDict = OrderedDict()  # transformers' metadata pass (load_gguf_checkpoint)
_TOKENIZER_KVS: OrderedDict = OrderedDict()  # tokenizer_kvs
_TOKENIZERS: OrderedDict = OrderedDict()  # tokenizer_of
_KEPT = 16  # files kept of each (each reader maps its file, deleted or not, while kept)


def _file_key(path) -> tuple:
    """A file by its content: its path and a digest of its bytes (a file written again at the
    same path is read again, however soon; a second for 1 GB)."""
    with open(path, "rb") as f:
        return os.path.realpath(path), hashlib.file_digest(f, "blake2b").hexdigest()


def _kept(cache: OrderedDict, key, make):
    if key not in cache:
        cache[key] = make()
        while len(cache) > _KEPT:
            cache.popitem(last=False)
    cache.move_to_end(key)
    return cache[key]


def tokenizer_of(out: Path):
    """transformers' AutoTokenizer of an output directory, loaded once for the same files: its
    tokenizer files by their bytes, and config.json's model type (AutoTokenizer's choice of
    class where tokenizer_config.json names none). The tests load the same tokenizer for many
    directories, 0.2 s each. The caller only encodes with it."""
    from transformers import AutoTokenizer

    out = Path(out)
    files = sorted(f for f in out.iterdir()
                   if f.name.startswith(("tokenizer", "special_tokens_map", "added_tokens", "chat_template")))
    model_type = json.loads((out / "config.json").read_text()).get("model_type")
    key = (model_type, *((f.name, hashlib.blake2b(f.read_bytes()).hexdigest()) for f in files))
    return _kept(_TOKENIZERS, key, lambda: AutoTokenizer.from_pretrained(out))


@contextlib.contextmanager
def gguf_read_once():
    """Within this block, gguf-py's GGUFReader reads each file once, and transformers' GGUF
    metadata pass (load_gguf_checkpoint without the tensors) runs once a file. transformers'
    GGUF path reads a file anew for the config, the weights and the tokenizer, each time
    parsing the vocabulary one element at a time (14 s each for Gemma 3's 262k tokens here),
    and many of the tests' files carry SmolLM2's 49k tokens: these reads were a fifth of the
    test workers' time (py-spy over the whole suite, 2026-12-05). The values are gguf-py's and
    transformers' own, computed once: the readers are read-only views of their files, the
    metadata is handed out as a deep copy, and a metadata pass is kept only when gguf-py's
    reader did the reading (not while the converter serves transformers its own values:
    gguf_repack.converter.engine_files.transformers_reads). tests/conftest.py keeps this open
    for the whole session."""
    try:
        import transformers.modeling_gguf_pytorch_utils as hf_gguf
    except ImportError:  # (the Triton 3.6.0 environment of .ci/run has no transformers)
        hf_gguf = SimpleNamespace(load_gguf_checkpoint=None)
    real_reader, real_checkpoint = gguf.GGUFReader, hf_gguf.load_gguf_checkpoint

    def reader(path, mode="r"):
        if mode != "r":  # (a writable view is the caller's own)
            return real_reader(path, mode)
        return _kept(_GGUF_READERS, _file_key(path), lambda: real_reader(path, mode))

    def load_gguf_checkpoint(path, return_tensors=False, *args, **kwargs):
        if return_tensors or args or kwargs or gguf.GGUFReader is not reader:
            return real_checkpoint(path, return_tensors, *args, **kwargs)
        return copy.deepcopy(_kept(_GGUF_METADATA, _file_key(path), lambda: real_checkpoint(path, False)))

    gguf.GGUFReader, hf_gguf.load_gguf_checkpoint = reader, load_gguf_checkpoint
    try:
        yield
    finally:
        gguf.GGUFReader, hf_gguf.load_gguf_checkpoint = real_reader, real_checkpoint
