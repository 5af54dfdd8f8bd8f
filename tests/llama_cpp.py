"""GGUF files made by llama.cpp's own converter, `convert_hf_to_gguf.py`, from tiny random
transformers models: the reference for what llama.cpp really writes (tests/arch_models.py is
an imitation of it, kept for what the converter cannot write: a quant type per projection).

The converter, its `conversion/` package and the gguf-py it carries come from the
llama-cpp-python source distribution on the package index (pinned, sha256 checked), unpacked
once into the cache (~/.cache/gguf-repack/llama.cpp-VERSION, or $GGUF_REPACK_MODELS/..). It is
pure Python: it runs here on torch and transformers, with its own gguf-py first on the path.
`--outtype f32, f16, bf16, q8_0` need no build of llama.cpp.

The models (`MODELS`): one per architecture of docs/architectures.md's table and its
distinctive variants (tied and untied embeddings, each rope scaling, Falcon-40B's decoder,
GPT-2 at another context, a shared expert), every weight random and rounded to bfloat16 once,
so that the F32, F16 and BF16 files hold the same values and one transformers model is the
reference for all three. BPE tokenizers are SmolLM2's (its pre-tokenizer is one the converter
knows); architectures whose converter reads only SentencePiece get a tiny one trained here.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import torch

LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
_VENDOR = "vendor/llama.cpp/"
_MEMBERS = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")
OUTTYPES = ("f32", "f16", "bf16", "q8_0")


def cache_root() -> Path:
    from gguf_repack.models import cache_dir

    return cache_dir().parent


@contextlib.contextmanager
def _locked(path: Path):
    """One process at a time makes `path` (pytest-xdist workers share the cache)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(str(path) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def converter_dir() -> Path:
    """The unpacked converter: convert_hf_to_gguf.py, conversion/, gguf-py/."""
    version = LLAMA_CPP_PYTHON.split("==")[1]
    target = cache_root() / f"llama.cpp-{version}"
    with _locked(target):
        if (target / "convert_hf_to_gguf.py").is_file():
            return target
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary",
                                   ":all:", "--quiet",
                                   "--disable-pip-version-check", "--dest", tmp, LLAMA_CPP_PYTHON],
                                  capture_output=True, text=True)
            sdists = list(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
            if not sdists:  # (pip may fail preparing metadata after the download itself)
                raise RuntimeError(f"pip download {LLAMA_CPP_PYTHON} failed: {proc.stderr[-2000:]}")
            digest = hashlib.sha256(sdists[0].read_bytes()).hexdigest()
            if digest != SDIST_SHA256:
                raise RuntimeError(f"{sdists[0].name}: sha256 {digest}, expected {SDIST_SHA256}")
            unpacked = Path(tmp) / "unpacked"
            with tarfile.open(sdists[0]) as tar:
                prefix = tar.getnames()[0].split("/")[0] + "/" + _VENDOR
                members = [m for m in tar.getmembers()
                           if m.name.startswith(prefix) and m.name[len(prefix):].startswith(_MEMBERS)]
                for m in members:
                    m.name = m.name[len(prefix):]
                tar.extractall(unpacked, members=members, filter="data")
            os.replace(unpacked, target)
    return target


# -- tokenizers ------------------------------------------------------------------------------


def bpe_tokenizer_dir() -> Path:
    """SmolLM2's tokenizer (from the real test file, through transformers' GGUF conversion),
    saved as tokenizer.json: a GPT-2-style BPE whose pre-tokenizer hash the converter knows."""
    target = cache_root() / "tokenizers" / "smollm2"
    with _locked(target):
        if not (target / "tokenizer.json").is_file():
            from transformers import AutoTokenizer

            from gguf_repack.models import fetch

            src = fetch("smollm2")
            tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
            with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
                tok.save_pretrained(tmp)
                # the class a GPT-2-style BPE's repository names (phi3's converter reads it)
                config = json.loads((Path(tmp) / "tokenizer_config.json").read_text())
                config["tokenizer_class"] = "GPT2Tokenizer"
                (Path(tmp) / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
                os.replace(tmp, target)
    return target


# the added tokens llama.cpp's converter looks up in a GLM tokenizer (_set_vocab_glm: bos,
# eot, unk, eom), after SmolLM2's 49152
GLM_ADDED = ["[gMASK]", "<|user|>", "<|endoftext|>", "<|observation|>"]


def glm_tokenizer_dir() -> Path:
    """SmolLM2's tokenizer (bpe_tokenizer_dir) with GLM's special tokens added: what the
    converter's GLM vocabulary needs (its pre-tokenizer hash is SmolLM2's, which it knows)."""
    target = cache_root() / "tokenizers" / "smollm2-glm"
    with _locked(target):
        if not (target / "tokenizer.json").is_file():
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(bpe_tokenizer_dir())
            tok.add_special_tokens({"additional_special_tokens": GLM_ADDED})
            with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
                tok.save_pretrained(tmp)
                os.replace(tmp, target)
    return target


# Hunyuan-A13B's vocabulary size: its converter writes BOS as id 127959, whatever the tokenizer
HUNYUAN_VOCAB = 128167


def hunyuan_tokenizer_dir() -> Path:
    """A tiktoken-style tokenizer as Hunyuan's repositories have one (remote code: the
    converter reads its mergeable ranks), over SmolLM2's BPE (bpe_tokenizer_dir, whose
    pre-tokenizer hash the converter knows): tests/hunyuan_tokenizer/tokenization_hy.py."""
    stand_in = Path(__file__).parent / "hunyuan_tokenizer" / "tokenization_hy.py"
    # (named by the stand-in's contents: a change to it makes a new one, and new checkpoints)
    target = cache_root() / "tokenizers" / \
        f"hunyuan-{HUNYUAN_VOCAB}-{hashlib.sha256(stand_in.read_bytes()).hexdigest()[:8]}"
    with _locked(target):
        if not (target / "tokenizer_config.json").is_file():
            with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
                shutil.copy(bpe_tokenizer_dir() / "tokenizer.json", tmp)
                shutil.copy(stand_in, tmp)
                (Path(tmp) / "tokenizer_config.json").write_text(json.dumps({
                    "auto_map": {"AutoTokenizer": ["tokenization_hy.HYTokenizer", None]},
                    "vocab_size": HUNYUAN_VOCAB, "model_max_length": 256}))
                os.replace(tmp, target)
    return target


SPM_VOCAB = 320


def spm_tokenizer_dir() -> Path:
    """A tiny SentencePiece model (tokenizer.model) for the converters that read only that:
    trained here on a fixed text, byte fallback on, one thread (deterministic)."""
    target = cache_root() / "tokenizers" / f"spm-{SPM_VOCAB}"
    with _locked(target):
        if not (target / "tokenizer.model").is_file():
            import sentencepiece as spm

            text = ("The three primary colors are red, yellow and blue. " * 3 +
                    "def fibonacci(n): return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n"
                    "The capital of France is Paris, and the capital of Italy is Rome.\n") * 20
            with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
                (Path(tmp) / "text.txt").write_text(text)
                spm.SentencePieceTrainer.train(
                    input=str(Path(tmp) / "text.txt"), model_prefix=str(Path(tmp) / "tokenizer"),
                    vocab_size=SPM_VOCAB, model_type="bpe", byte_fallback=True, num_threads=1,
                    character_coverage=1.0, bos_id=1, eos_id=2, unk_id=0, pad_id=-1,
                    hard_vocab_limit=False, minloglevel=2)
                (Path(tmp) / "text.txt").unlink()
                (Path(tmp) / "tokenizer.vocab").unlink()
                (Path(tmp) / "tokenizer_config.json").write_text(json.dumps(
                    {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
                     "add_bos_token": True, "tokenizer_class": "LlamaTokenizer"}))
                os.replace(tmp, target)
    return target


# GemmaTokenizer (which transformers gives a Gemma 4 directory) adds <pad> and <mask> after them
LLAMA_BPE_VOCAB = SPM_VOCAB + 2


def llama_bpe_tokenizer_dir() -> Path:
    """spm_tokenizer_dir's vocabulary as a Llama-style BPE tokenizer.json (byte fallback, no
    tokenizer.model): what Gemma 4's converter reads (gguf-py's LlamaHfVocab). Built with the
    tokenizers library from the SentencePiece model's pieces and scores (transformers' own
    conversion of a SentencePiece model needs protobuf)."""
    target = cache_root() / "tokenizers" / f"llama-bpe-{SPM_VOCAB}"
    with _locked(target):
        if not (target / "tokenizer.json").is_file():
            import sentencepiece as spm
            from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers
            from transformers.tokenization_utils_base import generate_merges

            sp = spm.SentencePieceProcessor(model_file=str(spm_tokenizer_dir() / "tokenizer.model"))
            pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
            specials = [p for i, p in enumerate(pieces) if sp.is_control(i) or sp.is_unknown(i)]
            vocab = {p: i for i, p in enumerate(pieces)}
            merges = generate_merges(vocab, {p: sp.get_score(i) for i, p in enumerate(pieces)},
                                     skip_tokens=set(specials))
            tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True,
                                       byte_fallback=True))
            tok.normalizer = normalizers.Replace(" ", "\u2581")
            tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                             decoders.Fuse()])
            tok.add_special_tokens([AddedToken(p, special=True, normalized=False) for p in specials])
            with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
                tok.save(str(Path(tmp) / "tokenizer.json"))
                (Path(tmp) / "tokenizer_config.json").write_text(json.dumps(
                    {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
                     "add_bos_token": True, "tokenizer_class": "GemmaTokenizer"}))
                os.replace(tmp, target)
    return target


# -- the models ------------------------------------------------------------------------------

# (head width 32: the least vLLM's CPU attention takes)
_SMALL = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256)
_LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 16, "rope_theta": 10000.0}
_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
# DeepSeek's multi-head latent attention (MLA), tiny: 4 heads of 32 + 32 (rope), a latent of 32
_MLA = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=4, max_position_embeddings=256, kv_lora_rank=32, qk_nope_head_dim=32,
            qk_rope_head_dim=32, v_head_dim=32, moe_intermediate_size=64, first_k_dense_replace=1,
            tie_word_embeddings=False)

_GEMMA4 = dict(_SMALL, head_dim=32, global_head_dim=64, num_hidden_layers=4, sliding_window=8,
               layer_types=["sliding_attention", "full_attention"] * 2, final_logit_softcapping=30.0,
               hidden_size_per_layer_input=0, pad_token_id=0)

# name -> (transformers model_type, config overrides, tokenizer kind, what the variant is)
MODELS: dict[str, tuple[str, dict, str]] = {
    "llama": ("llama", dict(_SMALL, tie_word_embeddings=True), "bpe"),
    "llama-untied": ("llama", dict(_SMALL, tie_word_embeddings=False), "bpe"),
    "llama-rope-llama3": ("llama", dict(_SMALL, tie_word_embeddings=True, rope_parameters=_LLAMA3), "bpe"),
    "llama-rope-linear": ("llama", dict(_SMALL, tie_word_embeddings=False, rope_parameters={
        "rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}), "bpe"),
    "llama-rope-yarn": ("llama", dict(_SMALL, rope_parameters={
        "rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 16,
        "rope_theta": 10000.0}), "bpe"),
    "mistral": ("mistral", dict(_SMALL, tie_word_embeddings=False), "bpe"),
    "mixtral": ("mixtral", dict(_SMALL, tie_word_embeddings=False, num_local_experts=4,
                                num_experts_per_tok=2), "bpe"),
    "gemma2": ("gemma2", dict(_SMALL, head_dim=32, sliding_window=8), "spm"),
    # llama.cpp knows Gemma 3's layers by their number: every sixth is global
    "gemma3": ("gemma3_text", dict(_SMALL, head_dim=32, sliding_window=8, num_hidden_layers=6,
                                   rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0,
                                                                       "rope_theta": 1000000.0},
                                                    "sliding_attention": {"rope_type": "default",
                                                                          "rope_theta": 10000.0}}), "bpe"),
    # (transformers 5 gives a qwen2 directory its Qwen2Tokenizer, whose pre-tokenizer on
    # SmolLM2's vocabulary the converter does not know; its SentencePiece path it takes first)
    "qwen2": ("qwen2", dict(_SMALL, tie_word_embeddings=True), "spm"),
    "qwen2-rope-yarn": ("qwen2", dict(_SMALL, tie_word_embeddings=False,
                                      rope_parameters={"rope_type": "yarn", "factor": 16.0,
                                                       "original_max_position_embeddings": 16,
                                                       "rope_theta": 1000000.0}), "spm"),
    "qwen3": ("qwen3", dict(_SMALL, head_dim=32, tie_word_embeddings=True), "bpe"),
    "phi3": ("phi3", dict(_SMALL, tie_word_embeddings=False, pad_token_id=2), "bpe"),
    "phi3-longrope": ("phi3", dict(_SMALL, tie_word_embeddings=False, pad_token_id=2,
                                   max_position_embeddings=256, original_max_position_embeddings=16,
                                   rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                                    "original_max_position_embeddings": 16,
                                                    "short_factor": [1.0 + i / 8 for i in range(16)],
                                                    "long_factor": [1.0 + i / 2 for i in range(16)]}),
                      "bpe"),
    "starcoder2": ("starcoder2", dict(_SMALL, rope_theta=100000.0,
                                      rope_parameters={"rope_type": "default",
                                                       "rope_theta": 100000.0}), "bpe"),
    "stablelm": ("stablelm", dict(_SMALL, tie_word_embeddings=False), "bpe"),
    "nemotron": ("nemotron", dict(_SMALL, tie_word_embeddings=False), "spm"),
    "falcon": ("falcon", dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                              max_position_embeddings=256, new_decoder_architecture=False,
                              multi_query=True, num_kv_heads=1, parallel_attn=True, bias=False), "bpe"),
    "falcon-40b": ("falcon", dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                                  num_kv_heads=2, max_position_embeddings=256,
                                  new_decoder_architecture=True, parallel_attn=True, bias=False), "bpe"),
    "bloom": ("bloom", dict(hidden_size=128, n_layer=2, n_head=4), "bpe"),
    "gpt2": ("gpt2", dict(n_embd=128, n_layer=2, n_head=4, n_positions=1024, n_ctx=1024), "bpe"),
    "gpt2-ctx2048": ("gpt2", dict(n_embd=128, n_layer=2, n_head=4, n_positions=2048, n_ctx=2048), "bpe"),
    "mamba": ("mamba", dict(hidden_size=64, state_size=8, num_hidden_layers=2, expand=2,
                            conv_kernel=4, time_step_rank=8, tie_word_embeddings=True), "bpe"),
    # Mamba-2: two groups (the gated norm stored as one row per group)
    "mamba2": ("mamba2", dict(hidden_size=128, num_hidden_layers=2, num_heads=8, head_dim=32, n_groups=2,
                              state_size=16, expand=2, conv_kernel=4, chunk_size=64,
                              tie_word_embeddings=False), "bpe"),
    "lfm2": ("lfm2", dict(hidden_size=128, intermediate_size=256, num_hidden_layers=3,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                          layer_types=["conv", "full_attention", "conv"], block_auto_adjust_ff_dim=False),
             "bpe"),
    # LFM2-MoE: lfm2's layers, the first one dense, then sigmoid routing with the correction bias
    # (tied embeddings, as LFM2's; the converter maps no lm_head for it)
    "lfm2moe": ("lfm2_moe", dict(hidden_size=128, intermediate_size=256, moe_intermediate_size=64,
                                 num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                                 max_position_embeddings=256, layer_types=["conv", "full_attention", "conv"],
                                 num_dense_layers=1, num_experts=4, num_experts_per_tok=2), "bpe"),
    # Apertus: xIELU (its parameters random per layer), q/k norms, Llama 3's rope scaling
    "apertus": ("apertus", dict(_SMALL, tie_word_embeddings=False, rope_parameters=_LLAMA3), "bpe"),
    # DBRX: LayerNorm, q, k and v in one tensor, clamped; experts in every layer (64 wide:
    # whole Q8_0 blocks per rank at TP 2)
    "dbrx": ("dbrx", dict(d_model=128, n_heads=4, n_layers=2, max_seq_len=256,
                          attn_config=dict(kv_n_heads=2, rope_theta=10000.0, clip_qkv=0.5),
                          ffn_config=dict(ffn_hidden_size=64, moe_num_experts=4, moe_top_k=2),
                          tie_word_embeddings=False), "bpe"),
    "qwen2moe": ("qwen2_moe", dict(_SMALL, **_MOE, shared_expert_intermediate_size=64,
                                   tie_word_embeddings=False), "bpe"),
    # (llama.cpp always normalizes the chosen experts' weights for qwen3moe, as Qwen3-MoE models do)
    "qwen3moe": ("qwen3_moe", dict(_SMALL, **_MOE, head_dim=32, norm_topk_prob=True,
                                   tie_word_embeddings=False), "bpe"),
    # GLM-4.5/4.6's MoE: sigmoid routing with the correction bias (noaux_tc), a shared expert,
    # the first layer dense, half the head rotated (partial rope), q/k/v biases, q/k norms
    "glm4moe": ("glm4_moe", dict(_SMALL, head_dim=32, n_routed_experts=4, num_experts_per_tok=2,
                                 moe_intermediate_size=64, n_shared_experts=1, first_k_dense_replace=1,
                                 n_group=1, topk_group=1, norm_topk_prob=True, routed_scaling_factor=2.5,
                                 use_qk_norm=True, attention_bias=True, num_nextn_predict_layers=0,
                                 rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                  "partial_rotary_factor": 0.5}), "glm"),
    # -- architectures transformers' GGUF mapping lacks (config.json: arch_configs.py) --
    # Command R: LayerNorm, parallel attention and MLP, scaled logits
    "command-r": ("cohere", dict(_SMALL, logit_scale=0.25), "bpe"),
    # Command R7B: three sliding-window layers (with rope) to one global (without); the
    # converter reads rotary_pct, which Cohere's own config.json has
    "cohere2": ("cohere2", dict(_SMALL, num_hidden_layers=4, sliding_window=8, logit_scale=0.25,
                                rotary_pct=1.0), "bpe"),
    # GLM-4-0414: half of each head rotated, q/k/v biases, post-norms
    "glm4": ("glm4", dict(_SMALL, head_dim=32, attention_bias=True, pad_token_id=2,
                          rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                           "partial_rotary_factor": 0.5}), "glm"),
    "olmo2": ("olmo2", dict(_SMALL, tie_word_embeddings=False), "bpe"),
    # Olmo 3: OLMo 2 with three sliding-window layers to one global (llama.cpp: olmo2 with a window)
    "olmo3": ("olmo3", dict(_SMALL, num_hidden_layers=4, sliding_window=8, tie_word_embeddings=False), "bpe"),
    "olmoe": ("olmoe", dict(_SMALL, num_experts=4, num_experts_per_tok=2, intermediate_size=64,
                            tie_word_embeddings=False), "bpe"),
    # Granite 3: embedding, residual, attention and logit multipliers
    "granite": ("granite", dict(_SMALL, embedding_multiplier=4.0, residual_multiplier=0.5,
                                attention_multiplier=0.05, logits_scaling=2.0), "bpe"),
    "granitemoe": ("granitemoe", dict(_SMALL, num_local_experts=4, num_experts_per_tok=2,
                                      intermediate_size=64, embedding_multiplier=4.0, residual_multiplier=0.5,
                                      attention_multiplier=0.05, logits_scaling=2.0), "bpe"),
    # GraniteMoeShared: granitemoe with a shared expert
    "granitemoe-shared": ("granitemoeshared", dict(_SMALL, num_local_experts=4, num_experts_per_tok=2,
                                                   intermediate_size=64, shared_intermediate_size=64,
                                                   embedding_multiplier=4.0, residual_multiplier=0.5,
                                                   attention_multiplier=0.05, logits_scaling=2.0), "bpe"),
    "ernie4_5": ("ernie4_5", dict(_SMALL, head_dim=32), "spm"),
    "ernie4_5-moe": ("ernie4_5_moe", dict(_SMALL, head_dim=32, moe_num_experts=4, moe_k=2,
                                          moe_intermediate_size=64, moe_num_shared_experts=0,
                                          moe_layer_start_index=1, moe_layer_end_index=1,
                                          moe_layer_interval=1, tie_word_embeddings=False), "spm"),
    # EXAONE 4.0: three sliding-window layers to one global, q/k norms, post-norms
    "exaone4": ("exaone4", dict(_SMALL, num_hidden_layers=4, sliding_window=8), "bpe"),
    # SmolLM3: every fourth layer without rope
    "smollm3": ("smollm3", dict(_SMALL, num_hidden_layers=4, pad_token_id=2), "bpe"),
    # Arcee AFM: ReLU^2 MLP without a gate
    "arcee": ("arcee", dict(_SMALL, head_dim=32), "bpe"),
    "seed_oss": ("seed_oss", dict(_SMALL, head_dim=32, attention_bias=True), "bpe"),
    "gemma": ("gemma", dict(_SMALL, head_dim=32), "spm"),
    # Llama 4 (Scout's shape): MoE every second layer (sigmoid top-1, the score applied to the
    # expert's input, a shared expert), every fourth layer without rope and with its attention
    # temperature, q/k L2 norms
    "llama4": ("llama4_text", dict(_SMALL, head_dim=32, num_hidden_layers=4, intermediate_size=64,
                                   intermediate_size_mlp=256, num_local_experts=4, num_experts_per_tok=1,
                                   interleave_moe_layer_step=2, attention_chunk_size=8192, use_qk_norm=True,
                                   tie_word_embeddings=False, pad_token_id=2), "bpe"),
    # Ministral 3: YaRN with its mscale, queries scaled by position past the original context
    "mistral3": ("ministral3", dict(_SMALL, head_dim=32, pad_token_id=2, rope_parameters={
        "rope_type": "yarn", "rope_theta": 1000000.0, "factor": 16.0, "original_max_position_embeddings": 16,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
        "llama_4_scaling_beta": 0.1}), "bpe"),
    # Phi-3.5-MoE, with its LongRoPE (the converter reads the original context from it) and the
    # attention factor llama.cpp's converter computes for it, sqrt(1 + ln 16 / ln 16)
    "phimoe": ("phimoe", dict(_SMALL, num_local_experts=4, num_experts_per_tok=2, intermediate_size=64,
                              attention_bias=True, lm_head_bias=True, original_max_position_embeddings=16,
                              rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                               "original_max_position_embeddings": 16,
                                               "short_factor": [1.0 + i / 8 for i in range(16)],
                                               "long_factor": [1.0 + i / 2 for i in range(16)],
                                               "short_mscale": 2 ** 0.5, "long_mscale": 2 ** 0.5}), "bpe"),
    # K-EXAONE: sigmoid routing with the correction bias, groups, a shared expert, the first
    # layer dense, sliding-window layers
    "exaone-moe": ("exaone_moe", dict(_SMALL, num_hidden_layers=4, sliding_window=8, num_experts=4,
                                      num_experts_per_tok=2, moe_intermediate_size=64, num_shared_experts=1,
                                      first_k_dense_replace=1, n_group=2, topk_group=1,
                                      routed_scaling_factor=2.5, norm_topk_prob=True,
                                      mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
                                      tie_word_embeddings=False), "bpe"),
    # Arcee Trinity: sigmoid routing with its bias, normalized and scaled (route_norm, score_func
    # and the groups as Arcee's config.json has them: the converter reads them), muP embedding
    # scale, gated attention, sliding-window layers, the first layer dense
    "afmoe": ("afmoe", dict(_SMALL, head_dim=32, num_hidden_layers=4, num_dense_layers=1, num_experts=4,
                            num_experts_per_tok=2, num_shared_experts=1, moe_intermediate_size=64,
                            route_scale=2.0, route_norm=True, score_func="sigmoid", n_group=1, topk_group=1,
                            sliding_window=8, global_attn_every_n_layers=4, mup_enabled=True,
                            pad_token_id=2), "bpe"),
    # dots.llm1: DeepSeek-V3's routing (sigmoid scores with the correction bias, normalized
    # and scaled), a shared expert, the first layer dense, q/k norms
    "dots1": ("dots1", dict(_SMALL, head_dim=32, n_routed_experts=4, num_experts_per_tok=2,
                            n_shared_experts=1, moe_intermediate_size=64, first_k_dense_replace=1,
                            norm_topk_prob=True,
                            routed_scaling_factor=2.5, n_group=1, topk_group=1), "bpe"),
    # Hunyuan dense (V1): q/k norms per head
    "hunyuan-dense": ("hunyuan_v1_dense", dict(_SMALL, head_dim=32, pad_token_id=2), "bpe"),
    # Qwen3-Next: gated delta-net layers (two key heads, four value heads), gated attention,
    # MoE with a gated shared expert
    # (vLLM's CPU delta-net kernel takes heads of 128 only; experts 64 wide: whole Q8_0 blocks
    # per rank at TP 2)
    "qwen3next": ("qwen3_next", dict(_SMALL, **{**_MOE, "moe_intermediate_size": 64}, head_dim=32,
                                     num_hidden_layers=4, linear_key_head_dim=128, linear_value_head_dim=128,
                                     linear_num_key_heads=2, linear_num_value_heads=4,
                                     shared_expert_intermediate_size=64, tie_word_embeddings=False,
                                     partial_rotary_factor=0.25), "bpe"),
    # Qwen3.5 (dense): gated delta-net layers (two key heads, four value heads: llama.cpp
    # reorders the value heads) and one of gated full attention, a quarter of each head rotated
    # by interleaved multimodal rope (its sections as a model of this head width has them)
    # (delta-net heads of 128: the only width vLLM's CPU kernel takes)
    "qwen35": ("qwen3_5_text", dict(_SMALL, head_dim=32, num_hidden_layers=4, linear_conv_kernel_dim=4,
                                    linear_key_head_dim=128, linear_value_head_dim=128,
                                    linear_num_key_heads=2, linear_num_value_heads=4,
                                    tie_word_embeddings=False,
                                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                     "partial_rotary_factor": 0.25,
                                                     "mrope_section": [2, 1, 1], "mrope_interleaved": True}),
               "bpe"),
    # Qwen3.5-MoE: the same layers with routed experts and a gated shared expert
    # (experts 64 wide: whole Q8_0 blocks per rank at TP 2)
    "qwen35moe": ("qwen3_5_moe_text", dict(_SMALL, **{**_MOE, "moe_intermediate_size": 64}, head_dim=32,
                                           num_hidden_layers=4, linear_key_head_dim=128,
                                           linear_value_head_dim=128,
                                           linear_num_key_heads=2, linear_num_value_heads=4,
                                           shared_expert_intermediate_size=64, tie_word_embeddings=False,
                                           rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                            "partial_rotary_factor": 0.25,
                                                            "mrope_section": [2, 1, 1],
                                                            "mrope_interleaved": True}), "bpe"),
    # Nemotron 3 Nano's kind (llama.cpp's nemotron_h_moe): one mixer a layer, Mamba-2, attention
    # (no rope) or MoE (ReLU^2 experts without a gate, a shared expert, sigmoid routing with
    # the correction bias, normalized and scaled weights)
    "nemotron-h-moe": ("nemotron_h", dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
                                          head_dim=32, max_position_embeddings=256,
                                          layers_block_type=["mamba", "moe", "attention", "moe"],
                                          mamba_num_heads=8, mamba_head_dim=32, n_groups=2,
                                          ssm_state_size=16, conv_kernel=4, expand=2, chunk_size=64,
                                          n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
                                          moe_intermediate_size=64, moe_shared_expert_intermediate_size=128,
                                          routed_scaling_factor=2.5, norm_topk_prob=True, n_group=1,
                                          topk_group=1, tie_word_embeddings=False), "bpe"),
    # Nemotron-H (dense: Nemotron-H 8B, Nemotron Nano 2): Mamba-2, attention (no rope) and
    # ReLU^2 MLP layers; its checkpoint's config.json as NVIDIA's repositories have it
    # (CHECKPOINT_FIELDS)
    "nemotron-h": ("nemotron_h", dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
                                      head_dim=32, max_position_embeddings=256,
                                      layers_block_type=["mamba", "mlp", "attention", "mlp"],
                                      mamba_num_heads=8, mamba_head_dim=32, n_groups=2, ssm_state_size=16,
                                      conv_kernel=4, expand=2, chunk_size=64, intermediate_size=256,
                                      tie_word_embeddings=False), "bpe"),
    # Jamba: Mamba layers (with norms of dt, B and C), attention every other layer, MoE every
    # other layer (a SentencePiece vocabulary: the converter writes the tokenizer's size)
    "jamba": ("jamba", dict(_SMALL, num_hidden_layers=4, attn_layer_period=2, attn_layer_offset=1,
                            expert_layer_period=2, expert_layer_offset=1, num_experts=4,
                            num_experts_per_tok=2,
                            mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, tie_word_embeddings=False),
              "spm"),
    # Falcon-H1: attention and Mamba-2 (two groups, its norm after the gate) side by side, with
    # multipliers that the converter multiplies into the weights (powers of two: Q8_0 of the
    # product is the product of Q8_0)
    "falcon-h1": ("falcon_h1", dict(_SMALL, head_dim=32, mamba_d_ssm=256, mamba_n_heads=8, mamba_d_head=32,
                                    mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2,
                                    mamba_chunk_size=64, mamba_rms_norm=True, mamba_norm_before_gate=False,
                                    tie_word_embeddings=False, embedding_multiplier=2.0,
                                    lm_head_multiplier=0.5, mlp_multipliers=[0.5, 2.0], key_multiplier=0.5,
                                    attention_in_multiplier=2.0, attention_out_multiplier=0.5,
                                    ssm_in_multiplier=0.5, ssm_out_multiplier=2.0,
                                    ssm_multipliers=[2.0, 0.5, 1.0, 0.5, 2.0]), "bpe"),
    # Granite 4.0-H's shape: Mamba-2 layers and attention layers without rope (as llama.cpp runs
    # every granitehybrid file with Mamba-2 layers), MoE with a shared expert, the multipliers
    "granitehybrid": ("granitemoehybrid", dict(_SMALL, intermediate_size=64, num_hidden_layers=4,
                                               layer_types=["mamba", "attention"] * 2, num_local_experts=4,
                                               num_experts_per_tok=2, shared_intermediate_size=128,
                                               mamba_n_heads=8, mamba_d_head=32, mamba_n_groups=1,
                                               mamba_d_state=16, mamba_d_conv=4, mamba_expand=2,
                                               position_embedding_type="nope", embedding_multiplier=4.0,
                                               residual_multiplier=0.5, attention_multiplier=0.05,
                                               logits_scaling=2.0), "bpe"),
    # value heads of 16: ssm_out's columns reordered across Q8_0's blocks of 32 (a real model's
    # 128-wide heads in K-quants' blocks of 256 alike), which only dequantized values follow
    "qwen35-narrow-heads": ("qwen3_5_text", dict(_SMALL, head_dim=32, num_hidden_layers=4,
                                                 linear_key_head_dim=16, linear_value_head_dim=16,
                                                 linear_num_key_heads=2, linear_num_value_heads=4,
                                                 tie_word_embeddings=True), "bpe"),
    # Gemma 4 (31B's shape): sliding-window layers and global ones of wider heads (64, to 32),
    # with fewer KV heads and their keys for values (attention_k_eq_v), a quarter of each head
    # rotated ("proportional" rope); a random scalar per layer, final logit softcapping
    "gemma4": ("gemma4_text", dict(_GEMMA4, attention_k_eq_v=True, num_global_key_value_heads=1),
               "llama-bpe"),
    # 26B-A4B's shape: an MoE block beside each MLP (its router's input and per-expert scales)
    # (experts 64 wide: whole Q8_0 blocks per rank at TP 2)
    "gemma4-moe": ("gemma4_text", dict(_GEMMA4, attention_k_eq_v=True, num_global_key_value_heads=1,
                                       enable_moe_block=True, num_experts=4, top_k_experts=2,
                                       moe_intermediate_size=64), "llama-bpe"),
    # E2B's shape: per-layer input embeddings, the last two layers reusing the keys and values
    # of the first two, with MLPs twice as wide
    "gemma4-e2b": ("gemma4_text", dict(_GEMMA4, hidden_size_per_layer_input=16,
                                       vocab_size_per_layer_input=LLAMA_BPE_VOCAB, num_kv_shared_layers=2,
                                       use_double_wide_mlp=True), "llama-bpe"),
    # Gemma 3n (E2B's kind): AltUp, LAuReL, per-layer input embeddings, the last two layers
    # reusing the keys and values of the first two, activation sparsity on the first two
    "gemma3n": ("gemma3n_text", dict(hidden_size=128, intermediate_size=[256] * 4, num_hidden_layers=4,
                                     num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                     max_position_embeddings=256, sliding_window=8,
                                     layer_types=["sliding_attention", "full_attention"] * 2,
                                     vocab_size_per_layer_input=SPM_VOCAB, hidden_size_per_layer_input=16,
                                     laurel_rank=16, num_kv_shared_layers=2,
                                     activation_sparsity_pattern=[0.95, 0.95, 0.0, 0.0],
                                     final_logit_softcapping=30.0, pad_token_id=0), "spm"),
    # Hunyuan-A13B's kind: MoE with a shared MLP, softmax routing, q/k norms per head; its
    # checkpoint's config.json says the widths per layer, as Tencent's does (CHECKPOINT_FIELDS),
    # and its tokenizer is tiktoken's (remote code)
    "hunyuan-moe": ("hunyuan_v1_moe", dict(_SMALL, intermediate_size=64, num_experts=4, moe_topk=2,
                                           head_dim=32, tie_word_embeddings=False), "hunyuan"),
    # MiniMax-M2: sigmoid routing with its correction bias, a quarter of each head rotated, q/k
    # norms over all heads
    "minimax-m2": ("minimax_m2", dict(_SMALL, head_dim=32, num_local_experts=4, num_experts_per_tok=2,
                                      intermediate_size=64, rotary_dim=8, use_qk_norm=True,
                                      scoring_func="sigmoid", use_routing_bias=True,
                                      tie_word_embeddings=False), "bpe"),
    "gpt-oss": ("gpt_oss", dict(_SMALL, head_dim=32, max_position_embeddings=256, num_local_experts=4,
                                num_experts_per_tok=2,
                                sliding_window=8, tie_word_embeddings=False,
                                layer_types=["sliding_attention", "full_attention"],
                                rope_parameters={"rope_type": "yarn", "factor": 16.0, "beta_fast": 32.0,
                                                 "beta_slow": 1.0, "truncate": False,
                                                 "original_max_position_embeddings": 16,
                                                 "rope_theta": 150000.0}), "bpe"),
}


# llama.cpp's deepseek2 (tests/test_deepseek2.py), apart from MODELS. The latent and the rope
# part of a key (kv_lora_rank + qk_rope_head_dim) make 512 + 64 = 576, DeepSeek's own, the one
# head vLLM's CPU MLA decode kernel takes (cpu_mla.py): test_llama_cpp_files.py
# marks each model of MODELS with its table row by transformers' model type (deepseek_v3 is
# not one) and builds its Q8_0 reference without MLA's split kv_b_proj
MLA_MODELS: dict[str, tuple[str, dict, str]] = {
    # DeepSeek-V3's routing (sigmoid scores, correction bias, expert groups, scaled and normalized
    # weights), MLA with a q LoRA, YaRN with its mscale, the first layer dense. scoring_func is
    # what DeepSeek's own config.json says (transformers' class has no such field; the converter
    # writes the gating function from it)
    "deepseek-v3": ("deepseek_v3", dict(_MLA, max_position_embeddings=256, q_lora_rank=64, n_routed_experts=8,
                                        kv_lora_rank=512, qk_rope_head_dim=64,
                                        num_experts_per_tok=2, n_group=4, topk_group=2, n_shared_experts=1,
                                        routed_scaling_factor=2.5, norm_topk_prob=True,
                                        scoring_func="sigmoid", topk_method="noaux_tc",
                                        rope_parameters={"rope_type": "yarn", "factor": 16.0,
                                                         "original_max_position_embeddings": 16,
                                                         "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 0.707,
                                                         "mscale_all_dim": 0.707, "rope_theta": 10000.0}),
                    "bpe"),
    # DeepSeek-V2-Lite's shape: no q LoRA, softmax routing over all experts, two shared experts;
    # a latent wider than the heads' key part (attn_k_b is not square); YaRN, as V2-Lite's own
    # config (without rope scaling, vLLM's CPU build gave other tokens than transformers for
    # this model, through its plain interleaved rope: not looked into further)
    "deepseek-v2-lite": ("deepseek_v2", dict(_MLA, kv_lora_rank=512, qk_rope_head_dim=64, q_lora_rank=None,
                                             n_routed_experts=4,
                                             num_experts_per_tok=2, n_shared_experts=2,
                                             routed_scaling_factor=1.0, norm_topk_prob=False,
                                             scoring_func="softmax", topk_method="greedy",
                                             max_position_embeddings=256,
                                             rope_parameters={"rope_type": "yarn", "factor": 16.0,
                                                              "original_max_position_embeddings": 16,
                                                              "beta_fast": 32.0, "beta_slow": 1.0,
                                                              "mscale": 0.707, "mscale_all_dim": 0.707,
                                                              "rope_theta": 10000.0}),
                         "bpe"),
}


MLA_BIAS_SEED = 5


def mla_reference(name: str) -> torch.nn.Module:
    """The transformers model a file was made from: build_model's, and for V3 each router's
    score-correction bias random too (bfloat16 values, as every weight)."""
    model = build_model(name)
    generator = torch.Generator().manual_seed(MLA_BIAS_SEED)
    with torch.no_grad():
        for module in model.modules():
            bias = getattr(module, "e_score_correction_bias", None)
            if bias is not None:
                bias.copy_((torch.randn(bias.shape, generator=generator) * 0.2).to(torch.bfloat16).float())
    return model


def mla_files(name: str, outtypes) -> dict[str, Path]:
    """llama.cpp's files of `mla_reference(name)`, one per outtype, made once into the cache."""
    if MLA_MODELS[name][0] != "deepseek_v3":  # (no bias: build_model's model is the reference)
        return {t: path for (_, t), path in llama_cpp_files([(name, t) for t in outtypes]).items()}
    plain = hf_model_dir(name)
    key = hashlib.sha256(json.dumps([plain.parent.name, MLA_BIAS_SEED,
                                     LLAMA_CPP_PYTHON]).encode()).hexdigest()
    root = cache_root() / "llama.cpp-made" / f"{name}-bias-{key[:12]}"
    hf = root / "hf"
    with _locked(hf):
        if not (hf / "config.json").is_file():
            tmp = Path(tempfile.mkdtemp(dir=root.parent))
            mla_reference(name).save_pretrained(tmp)
            for f in plain.iterdir():  # the tokenizer
                if f.is_file() and f.name.startswith("tokenizer"):
                    shutil.copy(f, tmp / f.name)
            os.replace(tmp, hf)
    return _converted(hf, root, name, outtypes)


def llama_cpp_file(name: str, outtype: str) -> Path:
    """One file of llama.cpp's converter, of MODELS, MLA_MODELS or QWEN3_VL_MODELS, made once
    into the cache."""
    if name in MLA_MODELS:
        return mla_files(name, [outtype])[outtype]
    if name in QWEN3_VL_MODELS:
        return qwen3_vl_files(name, [outtype])[outtype]
    return llama_cpp_files([(name, outtype)])[(name, outtype)]


def _entry(name: str) -> tuple[str, dict, str]:
    return MODELS[name] if name in MODELS else MLA_MODELS[name] if name in MLA_MODELS else \
        OWN_FILES_MODELS[name]


# the vocabulary of each tokenizer kind: the models' embedding rows (SmolLM2's 49152 for "bpe")
VOCAB_SIZES = {"bpe": 49152, "glm": 49152 + len(GLM_ADDED), "spm": SPM_VOCAB, "llama-bpe": LLAMA_BPE_VOCAB,
               "hunyuan": HUNYUAN_VOCAB}


def tokenizer_dir(kind: str) -> Path:
    return {"bpe": bpe_tokenizer_dir, "glm": glm_tokenizer_dir, "spm": spm_tokenizer_dir,
            "llama-bpe": llama_bpe_tokenizer_dir, "hunyuan": hunyuan_tokenizer_dir}[kind]()


def build_model(name: str, dtype=torch.float32):
    """The transformers model `name` (random weights, seed fixed, every float rounded to
    bfloat16 once), in `dtype`, eval mode: a copy of its own, which the caller may change
    (q8_0_reference rounds its weights). Built once per process: a module's tests ask for
    the same model up to five times, and a copy costs a tenth of a build."""
    if (name, dtype) not in _BUILT:
        _BUILT[name, dtype] = _build_model(name, dtype)
    return copy.deepcopy(_BUILT[name, dtype])


_BUILT: dict = {}


def _build_model(name: str, dtype):
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, overrides, kind = _entry(name)
    config = AutoConfig.for_model(model_type, vocab_size=VOCAB_SIZES[kind], bos_token_id=1, eos_token_id=2,
                                  **overrides)
    torch.manual_seed(int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little"))
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(_random_like(p))
        for bname, buffer in model.named_buffers():
            if name in RANDOM_ROUTING_BIAS and bname.endswith(("e_score_correction_bias", "expert_bias")):
                buffer.copy_((torch.randn_like(buffer) * 0.2).to(torch.bfloat16).float())
            elif bname.endswith("layer_scalar"):  # (Gemma 4's, a buffer of the checkpoint: 1 at init)
                buffer.copy_(_random_like(buffer))
    return model.to(dtype).eval()


# config.json fields as the original repositories have them (None: a field they do not have),
# where transformers 5 writes them otherwise and llama.cpp's converter reads the repository's:
# PhiMoE's class name, Granite 4.0-H's layer kinds ("mamba" and "attention", which transformers
# 5 renames), dense Nemotron-H's layer pattern as a string and no MoE fields. The converter
# reads a checkpoint's config through transformers' AutoConfig where transformers knows the
# model type, and transformers 5's NemotronH config has MoE defaults, from which the converter
# makes every NemotronH a MoE: its model type here is one transformers does not know, as
# NVIDIA's remote-code repositories were before transformers had the class, and the converter
# reads config.json as it is (it picks its model class by `architectures`)
CHECKPOINT_FIELDS = {"phimoe": {"architectures": ["PhiMoEForCausalLM"]},
                     "hunyuan-moe": {"moe_intermediate_size": [64, 64], "moe_topk": [2, 2],
                                     "num_shared_expert": [1, 1]},
                     "nemotron-h": {"model_type": "nemotron_h_remote_code",
                                    "hybrid_override_pattern": "M-*-", "num_hidden_layers": 4,
                                    "layers_block_type": None,
                                    **dict.fromkeys(["num_experts_per_tok", "n_routed_experts",
                                                     "moe_intermediate_size", "n_shared_experts",
                                                     "moe_shared_expert_intermediate_size"])},
                     "granitehybrid": {"layer_types": ["mamba", "attention"] * 2},
                     # (LFM2's repositories say its convolution's width; vLLM's model reads it)
                     "lfm2": {"conv_dim": 128, "block_dim": 128}}
# transformers 5 gives some model types' directories a tokenizer class of its choosing, whatever
# tokenizer_config.json says (MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS): Qwen3.5-MoE's gets
# Qwen3_5Tokenizer, whose pre-tokenizer on SmolLM2's vocabulary llama.cpp's converter does not
# know. Its input directory names a model type without that (the converter picks its model class
# by `architectures`; model_type reaches only transformers' AutoTokenizer there)
TOKENIZER_MODEL_TYPE = {"qwen35moe": "qwen3_5_text"}
# models whose routers' score-correction bias (a buffer, zero at init) is random too
RANDOM_ROUTING_BIAS = {"minimax-m2", "exaone-moe", "dots1", "lfm2moe", "nemotron-h-moe"}


def _random_like(p: torch.Tensor) -> torch.Tensor:
    """Random values of p's shape, bfloat16-exact: the default init leaves norms at 1 and biases
    at 0, and random values test their mapping."""
    return (torch.randn_like(p) * (0.5 if p.dim() == 1 else 0.1) + (1.0 if p.dim() == 1 else 0.0)) \
        .to(torch.bfloat16).float()


def glm_mtp_files(outtypes) -> dict[str, Path]:
    """llama.cpp's files of a GLM-4.5-shaped model with its multi-token-prediction layer, as
    GLM-4.5's own checkpoint has one (num_nextn_predict_layers 1: a layer past the model's
    layers, with eh_proj, enorm, hnorm and shared_head.norm), which the converter keeps as
    blk.2 and blk.2.nextn.*: MODELS["glm4moe"] built with three layers, the third one named
    the draft layer. Made once into the cache; the model of its first two layers is
    `AutoModelForCausalLM.from_pretrained(files["hf"])` (transformers leaves the draft out)."""
    def draft(tensors: dict, h: int) -> dict:
        return {**tensors, **{f"model.layers.2.{name}": _random_like(torch.empty(shape))
                              for name, shape in (("eh_proj.weight", (h, 2 * h)), ("enorm.weight", (h,)),
                                                  ("hnorm.weight", (h,)), ("shared_head.norm.weight", (h,)))}}

    return _with_draft_layer("glm4moe", "glm4moe-mtp", outtypes, vocab=49152 + len(GLM_ADDED), seed=3,
                             build=dict(num_hidden_layers=3), draft=draft,
                             saved=dict(num_hidden_layers=2, num_nextn_predict_layers=1))


def qwen35_mtp_files(outtypes) -> dict[str, Path]:
    """llama.cpp's files of MODELS["qwen35"] with the multi-token-prediction layer Qwen3.5's
    own checkpoints have (mtp_num_hidden_layers 1: mtp.fc, mtp.pre_fc_norm_embedding,
    mtp.pre_fc_norm_hidden, mtp.layers.0.* (a full-attention layer) and mtp.norm), which the
    converter keeps by default as blk.4 and blk.4.nextn.*: the model built with a fifth layer
    of full attention, renamed the draft's. Made once into the cache; the model of its first
    four layers is `AutoModelForCausalLM.from_pretrained(files["hf"])` (transformers leaves
    mtp.* out)."""
    layer_types = ["linear_attention"] * 3 + ["full_attention"] * 2

    def draft(tensors: dict, h: int) -> dict:
        return {**{name.replace("model.layers.4.", "mtp.layers.0."): t for name, t in tensors.items()},
                **{f"mtp.{name}": _random_like(torch.empty(shape))
                   for name, shape in (("fc.weight", (h, 2 * h)), ("pre_fc_norm_embedding.weight", (h,)),
                                       ("pre_fc_norm_hidden.weight", (h,)), ("norm.weight", (h,)))}}

    return _with_draft_layer("qwen35", "qwen35-mtp", outtypes, vocab=49152, seed=5,
                             build=dict(num_hidden_layers=5, layer_types=layer_types), draft=draft,
                             saved=dict(num_hidden_layers=4, layer_types=layer_types[:4],
                                        mtp_num_hidden_layers=1))


# Models made only with files of their own (a function each below), outside MODELS' loops.
# GLM-4.7-Flash (transformers' Glm4MoeLite), which llama.cpp's converter writes as deepseek2
# with its draft layer and no gating function: llama.cpp knows the model by its shape (47
# layers, a vocabulary of 154880) and takes sigmoid scores for it
# (hf_config.deepseek2_default_gating). So the tiny model has that shape, narrow (hidden 64),
# with GLM's tokenizer padded to the vocabulary by the converter, MLA with a q LoRA and values
# wider than the keys' no-rope part, GLM-4.5's routing (one group, correction bias,
# normalized and scaled weights), a shared expert, the first layer dense.
GLM_4_7_FLASH_LAYERS = 47
OWN_FILES_MODELS: dict[str, tuple[str, dict, str]] = {
    "glm-4.7-flash": ("glm4_moe_lite", dict(
        hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=2,
        max_position_embeddings=256, q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=32,
        qk_rope_head_dim=16, v_head_dim=64, n_routed_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, n_shared_experts=1, routed_scaling_factor=1.8, norm_topk_prob=True,
        n_group=1, topk_group=1, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}), "glm"),
}


# Qwen3-VL's text models, which llama.cpp writes apart from the vision tower (qwen3vl and
# qwen3vlmoe; the tower goes to an mmproj file): multimodal rope in interleaved sections, which
# for text (the three positions equal) is Qwen3's rope. Built as transformers' whole
# Qwen3VLForConditionalGeneration, a one-block vision tower with one deepstack layer; the
# reference runs it on text alone. (The expert width: whole Q8_0 blocks at two ranks, and no
# square stack, whose orientation transformers' loader cannot tell from its shape)
_QWEN3_VL_TEXT = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=32, max_position_embeddings=256,
                      rope_parameters={"rope_type": "default", "rope_theta": 5000000.0,
                                       "mrope_section": [8, 4, 4], "mrope_interleaved": True})
_QWEN3_VL_VISION = dict(depth=1, hidden_size=64, intermediate_size=128, num_heads=2, out_hidden_size=128,
                        deepstack_visual_indexes=[0])
QWEN3_VL_MODELS = {
    "qwen3-vl": ("qwen3_vl", _QWEN3_VL_TEXT),
    "qwen3-vl-moe": ("qwen3_vl_moe", dict(_QWEN3_VL_TEXT, num_experts=4, num_experts_per_tok=2,
                                          moe_intermediate_size=192, decoder_sparse_step=1,
                                          norm_topk_prob=True)),
}


def qwen3_vl_files(name: str, outtypes) -> dict[str, Path]:
    """llama.cpp's text files of QWEN3_VL_MODELS[name] (random weights, bfloat16-exact), made
    once into the cache: {"hf": the checkpoint, outtype: the file}; the reference is
    `AutoModelForImageTextToText.from_pretrained(files["hf"])` on text."""
    model_type, text = QWEN3_VL_MODELS[name]
    key = hashlib.sha256(json.dumps([LLAMA_CPP_PYTHON, model_type, text, _QWEN3_VL_VISION, "original-layout",
                                     _version("transformers")], sort_keys=True).encode()).hexdigest()[:12]
    root = cache_root() / "llama.cpp-made" / f"{name}-{key}"
    hf = root / "hf"
    with _locked(hf):
        if not (hf / "config.json").is_file():
            from transformers import AutoConfig, AutoModelForImageTextToText

            config = AutoConfig.for_model(model_type, text_config=dict(text, vocab_size=49152, bos_token_id=1,
                                                                       eos_token_id=2),
                                          vision_config=_QWEN3_VL_VISION, tie_word_embeddings=False)
            torch.manual_seed(int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little"))
            model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
            with torch.no_grad():
                for p in model.parameters():
                    p.copy_(_random_like(p))
            tmp = Path(tempfile.mkdtemp(dir=root.parent))
            model.save_pretrained(tmp)
            if model_type == "qwen3_vl_moe":
                # the expert stacks as Qwen3-VL-MoE's own checkpoints hold them, (E, in, out),
                # which llama.cpp's converter reads (transformers 5 saves its own (E, out, in),
                # and transposes the original's on load: its conversion mapping)
                from safetensors.torch import load_file, save_file

                tensors = {k: v.transpose(1, 2).contiguous() if k.endswith(("experts.gate_up_proj",
                                                                                 "experts.down_proj")) else v
                           for k, v in load_file(tmp / "model.safetensors").items()}
                save_file(tensors, tmp / "model.safetensors", metadata={"format": "pt"})
            for f in bpe_tokenizer_dir().iterdir():
                if f.is_file() and f.suffix != ".lock":
                    shutil.copy(f, tmp / f.name)
            os.replace(tmp, hf)
    return {"hf": hf, **_converted(hf, root, name, outtypes)}


def glm_4_7_flash_files(outtypes) -> dict[str, Path]:
    """llama.cpp's files of OWN_FILES_MODELS["glm-4.7-flash"]: 47 layers and the draft layer
    GLM-4.7-Flash's checkpoint has (num_nextn_predict_layers 1; as GLM-4.5's, glm_mtp_files),
    a vocabulary of 154880 and random score-correction biases. {"hf": the checkpoint, outtype:
    the file}; the model of its 47 layers is `AutoModelForCausalLM.from_pretrained(files["hf"])`
    (transformers leaves the draft layer out)."""
    n = GLM_4_7_FLASH_LAYERS

    def draft(tensors: dict, h: int) -> dict:
        return {**tensors, **{f"model.layers.{n}.{name}": _random_like(torch.empty(shape))
                              for name, shape in (("eh_proj.weight", (h, 2 * h)), ("enorm.weight", (h,)),
                                                  ("hnorm.weight", (h,)), ("shared_head.norm.weight", (h,)))}}

    layers = ["dense"] + ["sparse"] * n
    return _with_draft_layer("glm-4.7-flash", "glm-4.7-flash", outtypes, vocab=154880, seed=7,
                             build=dict(num_hidden_layers=n + 1, mlp_layer_types=layers), draft=draft,
                             # GLM-4.7-Flash's own config.json says first_k_dense_replace and
                             # topk_method (transformers' class has mlp_layer_types instead)
                             saved=dict(num_hidden_layers=n, mlp_layer_types=layers[:n],
                                        num_nextn_predict_layers=1, first_k_dense_replace=1,
                                        topk_method="noaux_tc"), random_bias=True)


def _with_draft_layer(name: str, stem: str, outtypes, vocab: int, seed: int, build: dict, draft,
                      saved: dict, random_bias: bool = False) -> dict[str, Path]:
    """The files of model `name` (_entry) built with `build` over its config, its checkpoint's
    tensors made a draft model's by `draft(tensors, hidden size)` and its config.json's fields
    set to `saved`: {"hf": the checkpoint, outtype: llama.cpp's file}, made once into the
    cache. `random_bias`: the routers' score-correction biases random too (buffers, which the
    weights' randomization leaves at zero)."""
    model_type, overrides, kind = _entry(name)
    key = hashlib.sha256(json.dumps([LLAMA_CPP_PYTHON, overrides, _version("transformers"),
                                     *([saved, "bias"] if random_bias else [])],
                                    sort_keys=True).encode()).hexdigest()[:12]
    root = cache_root() / "llama.cpp-made" / f"{stem}-{key}"
    hf = root / "hf"
    with _locked(hf):
        if not (hf / "config.json").is_file():
            from safetensors.torch import load_file, save_file
            from transformers import AutoConfig, AutoModelForCausalLM

            config = AutoConfig.for_model(model_type, vocab_size=vocab, bos_token_id=1, eos_token_id=2,
                                          **dict(overrides, **build))
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
            with torch.no_grad():
                for p in model.parameters():
                    p.copy_(_random_like(p))
                for b in (b for n, b in model.named_buffers() if random_bias and "correction_bias" in n):
                    b.copy_((torch.randn(b.shape) * 0.2).to(torch.bfloat16).float())
            tmp = Path(tempfile.mkdtemp(dir=root.parent))
            model.save_pretrained(tmp)
            tensors = draft(load_file(tmp / "model.safetensors"), config.hidden_size)
            save_file(tensors, tmp / "model.safetensors", metadata={"format": "pt"})
            config_json = json.loads((tmp / "config.json").read_text())
            (tmp / "config.json").write_text(json.dumps({**config_json, **saved}, indent=2))
            for f in tokenizer_dir(kind).iterdir():
                if f.is_file() and f.suffix != ".lock":
                    shutil.copy(f, tmp / f.name)
            os.replace(tmp, hf)
    return {"hf": hf, **_converted(hf, root, stem, outtypes)}


def _converted(hf: Path, root: Path, stem: str, outtypes) -> dict[str, Path]:
    """{outtype: root/<stem>-<outtype>.gguf}, llama.cpp's converter run once on the HF model
    directory `hf` for the ones not made yet."""
    files = {t: root / f"{stem}-{t}.gguf" for t in outtypes}
    with _locked(root / "convert"):
        if missing := [(hf, t, path) for t, path in files.items() if not path.is_file()]:
            run_converter(missing)
    return files


def hf_model_dir(name: str) -> Path:
    """`build_model(name)` saved with its tokenizer: the converter's input."""
    model_type, overrides, kind = _entry(name)
    key = hashlib.sha256(json.dumps([LLAMA_CPP_PYTHON, model_type, overrides, kind, _version("transformers"),
                                     _version("torch"), *(["bias"] if name in RANDOM_ROUTING_BIAS else []),
                                     *([hunyuan_tokenizer_dir().name] if kind == "hunyuan" else []),
                                     *([CHECKPOINT_FIELDS[name]] if name in CHECKPOINT_FIELDS else [])],
                                    sort_keys=True).encode()).hexdigest()[:12]
    target = cache_root() / "llama.cpp-made" / f"{name}-{key}" / "hf"
    with _locked(target):
        if not (target / "config.json").is_file():
            tmp = Path(tempfile.mkdtemp(dir=target.parent))
            save_checkpoint(name, build_model(name), tmp)
            if name in TOKENIZER_MODEL_TYPE:
                config = json.loads((tmp / "config.json").read_text())
                config["model_type"] = TOKENIZER_MODEL_TYPE[name]
                (tmp / "config.json").write_text(json.dumps(config))
            os.replace(tmp, target)
    return target


def save_checkpoint(name: str, model, target: Path) -> None:
    """`model` (of MODELS[name]) saved as its original repository would hold it: config.json
    with CHECKPOINT_FIELDS, and the tokenizer's files."""
    model.save_pretrained(target)
    if name in CHECKPOINT_FIELDS:
        config = json.loads((target / "config.json").read_text())
        config = {k: v for k, v in {**config, **CHECKPOINT_FIELDS[name]}.items() if v is not None}
        (target / "config.json").write_text(json.dumps(config))
    for f in tokenizer_dir(_entry(name)[2]).iterdir():
        if f.is_file() and f.suffix != ".lock":
            shutil.copy(f, target / f.name)


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


# architectures vLLM's CPU build runs in bfloat16 only (its gated delta-net): their vLLM cells
# are a test of their own (test_llama_cpp_files.test_gated_delta_net_models_through_vllm_...), not in the runs
# of every architecture at float32
VLLM_BFLOAT16_ONLY = {"qwen3next", "qwen35", "qwen35moe"}

# architectures whose vLLM model computes otherwise than transformers' (on the float checkpoint
# too, without the plugin): their vLLM cells hold llama.cpp's files to vLLM's own model on the
# checkpoint they were made from (test_llama_cpp_files.test_models_vllm_computes_otherwise_..., and
# at TP 2 test_architectures.test_every_architecture_through_vllm_at_tensor_parallel_2)
VLLM_OWN_REFERENCE = {"lfm2", "lfm2moe", "phimoe", "gemma3n"}

# the converter's options a model needs: Qwen3-Next's and Qwen3.5's assert the multi-token-
# prediction layer, which a transformers model has no weights for (the repositories' checkpoints
# have them)
CONVERTER_OPTIONS = {name: ["--no-mtp"]
                     for name in ("qwen3next", "qwen35", "qwen35moe", "qwen35-narrow-heads")}

_DRIVER = """
import json, runpy, sys
script = sys.argv[1]
for model, outtype, outfile, options in json.loads(sys.argv[2]):
    sys.argv = [script, model, "--outtype", outtype, "--outfile", outfile + ".part", *options]
    runpy.run_path(script, run_name="__main__")
"""


def run_converter(jobs) -> None:
    """Run the converter in one fresh process for several (hf dir, outtype, out file[,
    options]) jobs (its imports take seconds; each conversion of these models well under one)."""
    script = converter_dir() / "convert_hf_to_gguf.py"
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    jobs = [(str(hf), outtype, str(out), list(options)) for hf, outtype, out, *more in jobs
            for options in [more[0] if more else []]]
    proc = subprocess.run([sys.executable, "-c", _DRIVER, str(script), json.dumps(jobs)],
                          capture_output=True, text=True, env=env, cwd=script.parent)
    if proc.returncode != 0:
        raise RuntimeError(f"convert_hf_to_gguf.py failed:\n{proc.stderr[-4000:]}")
    for _, _, out, _ in jobs:
        os.replace(str(out) + ".part", out)


def llama_cpp_files(pairs) -> dict[tuple[str, str], Path]:
    """The file of each (name, outtype), the missing ones made in one converter process."""
    def target(name, outtype):
        return hf_model_dir(name).parent / f"{name}-{outtype}.gguf"

    if any(not target(*pair).is_file() for pair in pairs):
        with _locked(cache_root() / "llama.cpp-made" / "convert"):
            run_converter([(hf_model_dir(name), outtype, target(name, outtype),
                            CONVERTER_OPTIONS.get(name, []))
                           for name, outtype in pairs if not target(name, outtype).is_file()])
    return {pair: target(*pair) for pair in pairs}
