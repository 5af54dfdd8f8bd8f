#!/usr/bin/env python3
"""Time to first token and peak RSS: `gguf_repack.hf.load_model(out)` (weights stay quantized)
vs transformers' GGUF path (`from_pretrained(gguf_file=...)`, which dequantizes every weight to
float32), on both real models, on CPU.

    python scripts/bench_hf.py [--models smollm2 gemma] [--repeat 1]

Each side runs in a fresh Python process, timed from before `import torch` to the first
generated token (greedy, one token, same prompt): imports, config and tokenizer, weights,
prefill. Peak RSS is the process's VmHWM. The converted directory is made first, outside the
timing (converting is measured by bench_convert.py). Run again with --repeat for the best of N.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from benchutil import last_json_line, machine_line, run_measured  # noqa: E402

from gguf_repack.models import fetch  # noqa: E402

PROMPT = "The three primary colors are"

# argv: path; prints {"seconds": start to first token, "token": id}
OURS = """
import time; t0 = time.perf_counter()
import json, sys, torch
from transformers import AutoTokenizer
from gguf_repack.hf import load_model
model = load_model(sys.argv[1]); tok = AutoTokenizer.from_pretrained(sys.argv[1])
ids = tok(sys.argv[2], return_tensors="pt").input_ids
with torch.no_grad():
    token = model.generate(ids, max_new_tokens=1, do_sample=False)[0, -1].item()
print(json.dumps({"seconds": time.perf_counter() - t0, "token": token}))
"""

THEIRS = """
import time; t0 = time.perf_counter()
import json, sys, torch
from pathlib import Path
from transformers import AutoModelForCausalLM, AutoTokenizer
src = Path(sys.argv[1])
model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
ids = tok(sys.argv[2], return_tensors="pt").input_ids
with torch.no_grad():
    token = model.generate(ids, max_new_tokens=1, do_sample=False)[0, -1].item()
print(json.dumps({"seconds": time.perf_counter() - t0, "token": token}))
"""


def bench(model: str, repeat: int) -> list[str]:
    from gguf_repack import convert

    src = fetch(model)
    work = Path(tempfile.mkdtemp(prefix="bench-hf-"))
    try:
        out = work / "out"
        convert(src, out)
        runs = {"ours": [], "theirs": []}
        for _ in range(repeat):
            runs["ours"].append(run_measured(["-c", OURS, str(out), PROMPT]))
            runs["theirs"].append(run_measured(["-c", THEIRS, str(src), PROMPT]))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    best = {k: min(v, key=lambda r: last_json_line(r[2])["seconds"]) for k, v in runs.items()}
    ours, theirs = (last_json_line(best[k][2]) for k in ("ours", "theirs"))
    same = "same" if ours["token"] == theirs["token"] else "DIFFERENT"
    return [
        f"| {src.name} | `load_model(out)` | {ours['seconds']:.2f} | {best['ours'][1]:.0f} |",
        f"| | transformers `from_pretrained(gguf_file=...)` | {theirs['seconds']:.2f} | "
        f"{best['theirs'][1]:.0f} |",
        f"| | ratio | **{theirs['seconds'] / ours['seconds']:.1f}x faster** | "
        f"**{best['ours'][1] / best['theirs'][1]:.2f}x the RSS** ({same} first token) |",
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["smollm2", "gemma"])
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    lines = [machine_line(), "", f"Prompt {PROMPT!r}, best of {args.repeat}, a fresh process each:",
             "", "| model | path | seconds to first token | peak RSS MiB |", "| --- | --- | --- | --- |"]
    for model in args.models:
        lines += bench(model, args.repeat)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
