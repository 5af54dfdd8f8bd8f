"""Which architectures each engine runs from a repacked directory: data that `inspect`, the
loaders and docs/architectures.md read, and that the tests hold to account.

One row per architecture as llama.cpp writes `general.architecture` (Mixtral is `llama` with an
expert count there; it has its own row). Each cell is TESTED, and then a test in tests/ carries
`pytest.mark.architecture(column, arch)` and checks it, or the reason it is not
(tests/test_architectures.py holds the table and the marks to each other, and
docs/architectures.md's copy of the table to this one). Columns: `convert` (lossless re-tiling,
verify, export: the format does not depend on the architecture), `transformers`
(gguf_repack.hf.load_model against transformers' own GGUF path), `vllm` (the plugin, one rank,
on a file of llama.cpp's converter: the tokens of the model it was made from), `tp2` (the
plugin at tensor_parallel_size=2), `llama_cpp` (files made by llama.cpp's own
convert_hf_to_gguf.py at F32, F16, BF16 and Q8_0, through convert, verify
and transformers, against the transformers model they were made from:
tests/test_llama_cpp_files.py; the variants of each are in its note).
"""

from __future__ import annotations

TESTED = "tested"
COLUMNS = {"convert": "convert", "transformers": "transformers", "vllm": "vLLM", "tp2": "vLLM TP 2",
           "llama_cpp": "llama.cpp's converter"}
NO_MAMBA_KERNEL = "untestable here: vLLM's CPU build has no Mamba scan"
# vLLM's LFM2, LFM2-MoE, PhiMoE and Gemma 3n give other tokens than transformers' on their float
# checkpoints too (checked 2026-12-02, -04 and -05; Gemma 3n's with the same prompt ids, its
# first token's log-probabilities 0.5 apart, with or without its activation sparsity): their
# vLLM cells hold the plugin to vLLM's own model on the checkpoint the file was made from (its
# Q8_0 round trip for a Q8_0 file), which it equals
VLLM_OWN = "; vLLM: against vLLM's own model on the checkpoint (it differs from transformers' there)"


# vLLM's CPU router (cpu_router.py) takes sigmoid scores and the score-correction bias only in
# grouped top-k (DeepSeek-V3's, GLM-4.5's); without expert groups it asserts softmax scores and
# leaves the bias out (checked 2026-12-04): MiniMax-M2 stops, ERNIE-4.5-MoE routes otherwise
NO_CPU_BIASED_ROUTER = ("untestable here: vLLM's CPU router takes sigmoid scores and the correction bias "
                        "only with expert groups")
NO_VLLM_DOTS1 = ("not done: vLLM 0.32 has no Dots1 model (removed after 0.23), and its Transformers "
                 "backend does not load this MoE's router")
# experts without a gate (Nemotron-H's ReLU^2): vLLM's CPU build refuses them ("is_act_and_mul=False
# is supported only for CUDA, XPU and ROCm", checked 2026-12-05), and the plugin's expert method
# multiplies gated experts only
NO_VLLM_UNGATED = ("not done: the plugin's expert method takes gated experts only, and vLLM's CPU build "
                   "runs no MoE without a gate")
NOT_CONVERTED = "not run yet: no tiny model of it in tests/llama_cpp.py"
_OWN = "config.json from the metadata (transformers maps none)"
# transformers 5.19 and later map Qwen3.5's config from GGUF (its GGUF_CONFIG_ARCHS), without the
# multi-token-prediction layer's count; its tensors it does not map
_OWN_QWEN35 = "config.json from the metadata (transformers' has no draft-layer count)"


def _row(transformers=TESTED, vllm=TESTED, tp2=TESTED, convert=TESTED, llama_cpp=TESTED,
         note="") -> dict[str, str]:
    return {"convert": convert, "transformers": transformers, "vllm": vllm, "tp2": tp2,
            "llama_cpp": llama_cpp, "note": note}


ARCHITECTURES: dict[str, dict[str, str]] = {
    "llama": _row(note="SmolLM2 (real file); synthetic with K-quants for TP 2; converter: tied, untied, "
                        "rope llama3, linear, yarn"),
    "mistral": _row(note="llama.cpp writes it as `llama` named Mistral"),
    "mixtral": _row(note="`llama` with an expert count; MoE"),
    "gemma2": _row(),
    "gemma3": _row(note="Gemma 3 270M (real file); converter: linear rope x8 on the global layers "
                        "(TP 2: the converter's tiny file)"),
    "qwen2": _row(note="converter: tied; untied with yarn rope"),
    "qwen3": _row(),
    "phi3": _row(note="q, k, v in one tensor; gate and up in one; converter: LongRoPE too"),
    "starcoder2": _row(note="converter: rope base 100000"),
    "stablelm": _row(),
    "nemotron": _row(),
    "falcon": _row(note="q, k, v in one tensor; converter: 7B and 40B decoders"),
    "bloom": _row(note="q, k, v in one tensor, rows reordered per head (exact)"),
    "gpt2": _row(note="Conv1D layers run as linear ones on the (out, in) weight; converter: "
                      "contexts 1024 and 2048"),
    "mamba": _row(vllm=NO_MAMBA_KERNEL, tp2=NO_MAMBA_KERNEL,
                  note="state-space model; its convolution, A and D stay float32, as in the file"),
    "mamba2": _row(note=_OWN + "; Mamba-2 (Mamba-Codestral): state-space layers, A, D, the "
                               "convolution and the gated norm in float32, as in the file"),
    "lfm2": _row(note="short convolutions stay float32, as in the file" + VLLM_OWN),
    "qwen2moe": _row(note="MoE with a shared expert"),
    "qwen3moe": _row(note="MoE"),
    "gpt-oss": _row(note="MoE; expert biases, attention sinks"),
    # vLLM builds its DeepSeek model from config.json (MLA, the routing: scoring_func and
    # topk_method written as DeepSeek's own config.json has them); the plugin joins kv_b_proj
    # from llama.cpp's attn_k_b/attn_v_b and holds it in float
    "deepseek2": _row(note="MLA (kv_b_proj rejoined from attn_k_b and attn_v_b; quantized: held "
                           "dequantized); MoE: V3's sigmoid routing with correction bias and groups, "
                           "V2-Lite's softmax; GLM-4.7-Flash (written as deepseek2, no gating function: "
                           "sigmoid by its shape, as llama.cpp reads it; its draft layer left out; "
                           "transformers only); config.json from the metadata (transformers maps none)"),
    "glm4moe": _row(note="GLM-4.5/4.6: MoE, sigmoid routing with correction bias, a shared expert, "
                         "partial rope, q/k norms; config.json from the metadata (transformers maps none)"),
    # config.json from the metadata by one table each (converter/arch_configs.py)
    "command-r": _row(note=_OWN + "; Command R: LayerNorm, parallel attention and MLP, "
                                                      "scaled logits"),
    "cohere2": _row(note=_OWN + "; Command R7B, Command A: sliding-window layers, global ones without "
                              "rope; vLLM's Cohere2 attends over one token more than the window "
                              "(transformers and llama.cpp: the window), so its vLLM tests give it the "
                              "window less one"),
    "glm4": _row(note=_OWN + "; GLM-4-0414: partial rope, q/k/v biases, post-norms"),
    "olmo2": _row(note=_OWN + "; q/k norms over the whole projection; Olmo 3, which llama.cpp writes "
                              "as olmo2 with a sliding window: three sliding-window layers to one global"),
    "olmoe": _row(note=_OWN + "; MoE"),
    "granite": _row(note=_OWN + "; Granite 3: embedding, residual, attention and "
                                                    "logit multipliers"),
    "granitemoe": _row(note=_OWN + "; MoE; the multipliers of granite; GraniteMoeShared's shared expert "
                                  "(its gate and up joined back)"),
    "granitehybrid": _row(note=_OWN + "; Granite 4.0-H (and Bamba): Mamba-2 layers (A, D, the convolution "
                                      "and the gated norm in float32, as in the file) and attention layers "
                                      "without rope, MoE with a shared expert (its gate and up joined back), "
                                      "the multipliers of granite"),
    "lfm2moe": _row(note=_OWN + "; LFM2-MoE (LFM2-8B-A1B): lfm2's short convolutions (float32, as in "
                                "the file) and attention layers, the first layers dense, MoE with sigmoid "
                                "routing and its correction bias" + VLLM_OWN),
    "nemotron_h": _row(note=_OWN + "; Nemotron-H, Nemotron Nano 2: Mamba-2 layers (A, D, the convolution "
                                   "and the gated norm in float32, as in the file), attention layers without "
                                   "rope, ReLU^2 MLP layers"),
    "nemotron_h_moe": _row(vllm=NO_VLLM_UNGATED, tp2=NO_VLLM_UNGATED,
                           note=_OWN + "; Nemotron 3 Nano: Mamba-2 layers (A, D, the convolution and "
                                       "the gated norm in float32, as in the file), attention layers "
                                       "without rope, MoE layers (ReLU^2 experts without a gate, a shared "
                                       "expert, sigmoid routing with the correction bias)"),
    "qwen3vl": _row(note=_OWN + "; Qwen3-VL's text model (its vision tower is in the mmproj file, which "
                                "convert does not take): run as Qwen3, which it is for text (multimodal "
                                "rope with its three positions equal)"),
    "qwen3vlmoe": _row(note=_OWN + "; Qwen3-VL-MoE's text model, run as Qwen3-MoE (as qwen3vl)"),
    "ernie4_5": _row(note=_OWN),
    "ernie4_5-moe": _row(vllm=NO_CPU_BIASED_ROUTER, tp2=NO_CPU_BIASED_ROUTER,
                         note=_OWN + "; MoE with the correction bias, its first layer dense"),
    "exaone4": _row(note=_OWN + "; EXAONE 4.0: sliding-window layers, q/k norms, "
                                                    "post-norms"),
    "smollm3": _row(note=_OWN + "; every fourth layer without rope"),
    "arcee": _row(note=_OWN + "; Arcee AFM: ReLU^2 MLP"),
    "seed_oss": _row(note=_OWN + "; Seed-OSS: q/k/v biases"),
    "gemma": _row(note=_OWN + "; Gemma (1)"),
    # vLLM removed its Dots1 model after 0.23 (its registry's _PREVIOUSLY_SUPPORTED_MODELS); its
    # Transformers backend then looks for the router's weight as mlp.experts.gate.weight, which
    # no checkpoint name gives it (checked 2026-12-05, vLLM 0.32 CPU build)
    "dots1": _row(vllm=NO_VLLM_DOTS1, tp2=NO_VLLM_DOTS1,
                  note=_OWN + "; dots.llm1: MoE with DeepSeek-V3's routing (sigmoid, correction bias), "
                              "a shared expert, the first layer dense, q/k norms"),
    "jamba": _row(vllm=NO_MAMBA_KERNEL, tp2=NO_MAMBA_KERNEL,
                  note=_OWN + "; Jamba: Mamba layers (A, D, the convolution and the norms of dt, B and C "
                              "in float32, as in the file) and attention layers without rope, MoE every "
                              "other layer"),
    "falcon-h1": _row(note=_OWN + "; Falcon-H1: attention and Mamba-2 side by side in every layer (A, D, "
                                  "the convolution and the gated norm in float32, as in the file); the "
                                  "multipliers, which llama.cpp's converter multiplies into the weights, 1"),
    "gemma3n": _row(note=_OWN + "; Gemma 3n (E2B, E4B; text): AltUp (its stacked projections split "
                                "back into three), LAuReL blocks, per-layer input embeddings, keys and "
                                "values reused by the last layers, activation sparsity" + VLLM_OWN),
    "apertus": _row(note=_OWN + "; Apertus: xIELU activation, its parameters per layer from the metadata "
                                "(llama.cpp's converter writes them there), q/k norms"),
    "dbrx": _row(note=_OWN + "; DBRX: LayerNorm, q, k and v in one tensor, clamped; MoE in every layer "
                             "(softmax, normalized)"),
    "hunyuan-moe": _row(note=_OWN + "; Hunyuan-A13B: MoE with a shared MLP, q/k norms per head; converter: "
                                    "its tiktoken tokenizer (a stand-in over SmolLM2's)"),
    "hunyuan-dense": _row(note=_OWN + "; Hunyuan dense (V1): q/k norms per head"),
    "mistral3": _row(note=_OWN + "; Ministral 3, Mistral Small 3.x (text): YaRN, queries scaled by "
                                 "position (Llama 4's beta)"),
    "phimoe": _row(note=_OWN + "; Phi-3.5-MoE: LongRoPE with llama.cpp's attention factor (its GGUF "
                               "files: 1.190; its config.json: 1.243)" + VLLM_OWN),
    "exaone-moe": _row(note=_OWN + "; K-EXAONE: MoE with DeepSeek-V3's routing, sliding-window layers"),
    "afmoe": _row(note=_OWN + "; Arcee Trinity: MoE, sigmoid routing with its correction bias, gated "
                              "attention, sliding-window layers, muP embedding scale"),
    "llama4": _row(note=_OWN + "; Llama 4 (text): MoE every n-th layer, sigmoid top-1 on the expert's "
                               "input, a shared expert; attention in chunks, every fourth layer without "
                               "rope, q/k L2 norms"),
    "qwen3next": _row(note=_OWN + "; Qwen3-Next: gated delta-net layers (in_proj_qkvz joined back from "
                                  "attn_qkv and attn_gate: exact for one type, held dequantized for two), "
                                  "gated attention, MoE with a gated shared expert; vLLM (CPU: bfloat16 "
                                  "only): the float file gives vLLM's own model's tokens, the Q8_0 file "
                                  "runs"),
    "qwen35": _row(note=_OWN_QWEN35 + "; Qwen3.5 (dense): gated delta-net layers (llama.cpp's value-head "
                                      "order undone: rows exact, ssm_out's columns by whole blocks, in "
                                      "K-quants held dequantized), gated attention, multimodal rope "
                                      "sections; the draft layer left out; vLLM (CPU: bfloat16 only): "
                                      "the float file gives vLLM's own model's tokens, the Q8_0 file "
                                      "and one of two quantized types run"),
    "qwen35moe": _row(note=_OWN_QWEN35 + "; Qwen3.5-MoE: qwen35's layers, MoE with a gated shared expert; "
                                         "vLLM as qwen35"),
    # transformers' GGUF mapping knows it, but keeps its class's defaults for the sliding
    # window layers' head width, the layer pattern and the rope, and reads no layer scalars
    # (gguf-py names them without llama.cpp's .weight): config.json is ours
    "gemma4": _row(note=_OWN.replace("none", "it with its class's defaults") + "; Gemma 4 (text): "
                        "sliding-window and global layers of two head widths, keys for values on the "
                        "global ones, proportional rope (from rope_freqs), a scalar per layer; E2B/E4B's "
                        "per-layer input embeddings and layers reusing others' keys and values; "
                        "26B-A4B's MoE block beside the MLP (gate and up in one tensor)"),
    # transformers' GGUF mapping knows it, but writes the gating function's number as
    # scoring_func and no routing bias: config.json is ours, and the transformers cell is
    # tested against the model the file was made from
    "minimax-m2": _row(vllm=NO_CPU_BIASED_ROUTER, tp2=NO_CPU_BIASED_ROUTER,
                       note=_OWN.replace("none", "it with the routing wrong") + "; MoE: sigmoid routing "
                            "with its correction bias, partial rope, q/k norms over all heads"),
    "deci": _row(transformers="transformers has no class for it (remote code)",
                 vllm="not done yet", tp2="not done yet", llama_cpp=NOT_CONVERTED),
    "t5": _row(transformers="encoder-decoder, not a causal LM",
               vllm="vLLM has no T5", tp2="vLLM has no T5", llama_cpp=NOT_CONVERTED, note="also umt5"),
}


def support(arch: str, expert_count: int = 0) -> dict[str, str] | None:
    """The row for a file's `general.architecture` (and expert count: `llama` with experts is
    Mixtral), or None for an architecture no engine mapping exists for."""
    if arch == "llama" and expert_count:
        arch = "mixtral"
    return ARCHITECTURES.get(arch)


def describe_support(arch: str, expert_count: int = 0) -> str:
    """One line for `inspect`: what each engine does with this architecture."""
    row = support(arch, expert_count)
    if row is None:
        return (f"architecture {arch!r}: no engine mapping exists for it yet (transformers, "
                f"vLLM); convert, verify and export work (format-level)")
    cells = "; ".join(f"{title} {row[col]}" for col, title in COLUMNS.items())
    return f"architecture {arch!r}: {cells}"


def markdown_table() -> str:
    """The table of docs/architectures.md."""
    lines = ["| architecture | " + " | ".join(COLUMNS.values()) + " | |",
             "| --- | " + " | ".join("---" for _ in COLUMNS) + " | --- |"]
    for arch, row in ARCHITECTURES.items():
        lines.append(f"| {arch} | " + " | ".join(row[c] for c in COLUMNS) + f" | {row['note']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
