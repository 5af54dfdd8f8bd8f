#!/usr/bin/env python3
"""vLLM (CPU build) on a gguf-repack directory vs on a dequantized bf16 checkpoint of the same
model: seconds to construct `LLM(...)` (weights loaded, engine ready), peak RSS of the whole
process tree (vLLM runs the model in worker processes), and greedy decode throughput.

    .venv-vllm/bin/python scripts/bench_vllm.py [--models smollm2 gemma]

Run it with the vLLM environment's Python (.ci/run makes one at .venv-vllm). The bf16
checkpoint is what transformers' GGUF path gives (every weight dequantized), saved with
save_pretrained. Each measurement is a fresh process; the tree's RSS is sampled every 50 ms.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).parent))
from benchutil import machine_line  # noqa: E402

from gguf_repack.models import fetch  # noqa: E402

RUN = """
import json, os, sys, time
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
if __name__ == "__main__":
    from vllm import LLM, SamplingParams
    t = time.perf_counter()
    llm = LLM(model=sys.argv[1], max_model_len=256, enforce_eager=True, seed=0)
    load = time.perf_counter() - t
    prompts = ["The capital of France is"] * 4
    t = time.perf_counter()
    out = llm.generate(prompts, SamplingParams(max_tokens=32, temperature=0, ignore_eos=True))
    seconds = time.perf_counter() - t
    tokens = sum(len(o.outputs[0].token_ids) for o in out)
    print("RESULT " + json.dumps({"load": load, "tokens_per_s": tokens / seconds}), flush=True)
"""


def measured(model: Path, work: Path) -> dict:
    script = work / "run.py"
    script.write_text(RUN)
    proc = subprocess.Popen([sys.executable, str(script), str(model)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    peak, done = 0, threading.Event()

    def sample():
        nonlocal peak
        root = psutil.Process(proc.pid)
        while not done.is_set():
            try:
                tree = [root, *root.children(recursive=True)]
                peak = max(peak, sum(p.memory_info().rss for p in tree if p.is_running()))
            except psutil.Error:
                pass
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stdout, _ = proc.communicate()
    done.set()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"error: vLLM failed on {model}")
    (line,) = [x for x in stdout.splitlines() if x.startswith("RESULT ")]
    return {**json.loads(line.removeprefix("RESULT ")), "peak_mib": peak / 2**20}


def bf16_checkpoint(src: Path, out: Path) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.bfloat16)
    model.hf_quantizer.remove_quantization_config(model)  # a plain bf16 model from here on
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name).save_pretrained(out)
    return out


def bench(name: str, work: Path) -> list[str]:
    from gguf_repack import convert

    src = fetch(name)
    repacked = work / f"{name}-rp1"
    convert(src, repacked)
    plain = bf16_checkpoint(src, work / f"{name}-bf16")
    size = {d: sum(p.stat().st_size for p in d.iterdir() if p.suffix == ".safetensors")
            for d in (repacked, plain)}
    ours, theirs = measured(repacked, work), measured(plain, work)
    return [
        f"| {src.name} | gguf-repack directory | {size[repacked] / 1e6:.0f} | {ours['load']:.1f} | "
        f"{ours['peak_mib']:.0f} | {ours['tokens_per_s']:.1f} |",
        f"| | bf16 checkpoint | {size[plain] / 1e6:.0f} | {theirs['load']:.1f} | "
        f"{theirs['peak_mib']:.0f} | {theirs['tokens_per_s']:.1f} |",
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["smollm2", "gemma"])
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-vllm-"))
    try:
        rows = [row for name in args.models for row in bench(name, work)]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("\n".join([machine_line(), "", "vLLM CPU, dtype auto (bf16), 4 x 32 greedy tokens:", "",
                     "| model | weights | MB on disk | LLM() seconds | peak RSS MiB (process tree) "
                     "| tokens/s |", "| --- | --- | --- | --- | --- | --- |", *rows]))


if __name__ == "__main__":
    main()
