#!/usr/bin/env python3
"""Tunes the kernels' tiles on a GPU: for each type and tile kind, every candidate of
gguf_repack_kernels/configs.py (GEMV_CANDIDATES, GEMM_CANDIDATES) timed side by side with the default
tile (CUDA events, median of --runs), each checked against the default tile's result; the
fastest, where it beats the default by 2% or more, goes into tuned_configs.json, which
gguf_repack_kernels/configs.py reads once it is committed as gguf_repack_kernels/tuned_configs.json.

    python scripts/tune_kernels.py --out tune-out [--types Q4_0,Q4_K] [--budget 240]
    python scripts/tune_kernels.py --smoke --out DIR    # CPU, Triton's interpreter, tiny
                                                        # shapes: checks the script

Tile kinds, each timed at one M on a 4096 x 4096 weight with x of --act (fp16 unless told;
bf16, fp32): gemv at M = 1 (the
decode GEMV; its tile serves every M the GEMV takes), gemm_bm16 at M = 16,
gemm_bm32 at M = 32, gemm_bm64 at M = 64 (the fused GEMM's tiles, each launched at that BM
whichever the dispatcher's rule takes at that M: configs.gemm_config's "BM" pin). Every
candidate is a compile on first use: --budget (seconds) stops taking new types when spent,
and the report names those left out. Writes
tuned_configs.json (tiles, every timing, the device, Triton's version) and tuned_configs.md.
Tiles go under the key of the device's capability and x's dtype ("sm90/fp16"; configs.tuned
reads only its own GPU's and dtype's); those of other keys already in --out's
tuned_configs.json are kept, so runs on several GPUs and dtypes add up in one file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KINDS = {"gemv": 1, "gemm_bm16": 16, "gemm_bm32": 32, "gemm_bm64": 64}  # kind -> M timed
SHAPE = (4096, 4096)
FASTER_BY = 0.02  # a tuned tile must beat the default by this much to be kept


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("tune-out"))
    ap.add_argument("--types", default=None, help="comma-separated subset (default: every type)")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--budget", type=float, default=240.0, help="seconds; then no new type is started")
    ap.add_argument("--act", default="fp16", choices=["fp16", "bf16", "fp32"])
    ap.add_argument("--smoke", action="store_true")
    return ap.parse_args()


ARGS = parse() if __name__ == "__main__" else None
if ARGS is not None and ARGS.smoke:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(ROOT / "tests"))
from bench_gpu import Timer, rotation  # noqa: E402
from ggml_blocks import random_blocks  # noqa: E402

import gguf_repack_kernels as kernels  # noqa: E402
from gguf_repack.format.layout import pack  # noqa: E402
from gguf_repack.format.type_table import TYPES_BY_NAME  # noqa: E402


def candidates(kind: str, name: str, smoke: bool) -> list[dict]:
    """The tiles to try for one kind and type: the GEMV's only with PARTS its dot function
    supports; two of each kind in smoke mode."""
    if kind == "gemv":
        fmt = kernels.FORMATS[name]
        tiles = [t for t in kernels.configs.GEMV_CANDIDATES if t["PARTS"] in fmt.dot_parts
                 and (t.get("STAGES", 1) == 1 or fmt.block_size == kernels.configs.GEMV_STAGES_BLOCK)]
    else:  # a K step of another count of blocks: for the small blocks only (configs)
        small = kernels.FORMATS[name].block_size < kernels.configs.GEMM_STEP_WEIGHTS
        tiles = [t for t in kernels.configs.GEMM_CANDIDATES[KINDS[kind]] if small or "STEP_BLOCKS" not in t]
    return tiles[:2] if smoke else tiles


def tune_type(name: str, n: int, k: int, device: torch.device, timer: Timer, smoke: bool,
              rng: np.random.Generator, dtype: torch.dtype = torch.float16) -> list[dict]:
    """Every candidate of every kind for one type: a row each, with its time, its error
    against the default tile's result, or why it could not run."""
    qtype = TYPES_BY_NAME[name]
    blocks = random_blocks(qtype.id, (n, k), rng)
    # copies three times the L2 in turn, as bench_gpu.py times: the weight comes from memory
    cycle = rotation(lambda: {f: torch.from_numpy(v).to(device) for f, v in pack(blocks, qtype).items()},
                     blocks.nbytes, device)
    planes = next(cycle)
    rows = []
    for kind, m in KINDS.items():
        x = (torch.randn(m, k, device=device) / k ** 0.5).to(dtype)
        pin = None if kind == "gemv" else {"BM": m}  # the kind's BM, whatever the rule takes at m
        default = kernels.matmul(x, planes, name, (n, k), tile=pin).float()
        scale = default.abs().max().item() or 1.0
        base = {"type": name, "kind": kind, "M": m}
        rows.append({**base, "tile": None,
                     "seconds": timer(lambda: kernels.matmul(x, next(cycle), name, (n, k), tile=pin))})
        for tile in candidates(kind, name, smoke):
            row = {**base, "tile": tile}
            tile = {**(pin or {}), **tile}
            try:
                got = kernels.matmul(x, planes, name, (n, k), tile=tile).float()
            except Exception as e:  # a tile that does not compile (shared memory, registers)
                rows.append({**row, "problem": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"})
                continue
            error = (got - default).abs().max().item() / scale
            if not error <= 1e-2:
                rows.append({**row, "problem": f"differs from the default tile by {error:.3g}"})
                continue
            seconds = timer(lambda tile=tile: kernels.matmul(x, next(cycle), name, (n, k), tile=tile))
            rows.append({**row, "error": error, "seconds": seconds})
    return rows


def choose(rows: list[dict]) -> dict:
    """{kind: {type: tile}}: per type and kind the fastest candidate that ran, where it beats
    the default tile's time by FASTER_BY."""
    tiles: dict[str, dict] = {}
    for name in dict.fromkeys(r["type"] for r in rows):
        for kind in KINDS:
            mine = [r for r in rows if r["type"] == name and r["kind"] == kind and "seconds" in r]
            default = next(r for r in mine if r["tile"] is None)["seconds"]
            best = min((r for r in mine if r["tile"] is not None), key=lambda r: r["seconds"], default=None)
            if best is not None and best["seconds"] <= (1 - FASTER_BY) * default:
                tiles.setdefault(kind, {})[name] = best["tile"]
    return tiles


def markdown(report: dict) -> str:
    lines = [f"# Tiles tuned on {report['device']}", "",
             f"Triton {report['triton']}, {report['shape'][0]} x {report['shape'][1]}, {report['act']} x "
             f"(tiles under \"{report['key']}\"); "
             f"{report['seconds']:.0f} s. Copy tuned_configs.json to gguf_repack_kernels/ to use them.", "",
             "| type | kind | M | default (us) | best (us) | best tile | candidates that failed |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for name in dict.fromkeys(r["type"] for r in report["timings"]):
        for kind, m in KINDS.items():
            mine = [r for r in report["timings"] if r["type"] == name and r["kind"] == kind]
            ran = [r for r in mine if "seconds" in r and r["tile"] is not None]
            default = next(r["seconds"] for r in mine if r["tile"] is None)
            best = min(ran, key=lambda r: r["seconds"], default=None)
            failed = sum("problem" in r for r in mine)
            lines.append(f"| {name} | {kind} | {m} | {default * 1e6:.1f} | "
                         + (f"{best['seconds'] * 1e6:.1f} | {best['tile']}" if best else "- | -")
                         + f" | {failed} |")
    if report["left_out"]:
        lines += ["", f"Left out (budget spent): {', '.join(report['left_out'])}"]
    return "\n".join(lines) + "\n"


def main(args: argparse.Namespace) -> None:
    import triton

    start = time.perf_counter()
    rng = np.random.default_rng(0)
    if args.smoke:
        device, runs, device_name = torch.device("cpu"), 1, "CPU (Triton interpreter, smoke test)"
        types = args.types.split(",") if args.types else ["Q4_0", "Q4_K"]
    else:
        if not torch.cuda.is_available():
            raise SystemExit("error: no CUDA device (use --smoke to check the script on CPU)")
        device, runs, device_name = torch.device("cuda"), args.runs, torch.cuda.get_device_name()
        types = args.types.split(",") if args.types else sorted(kernels.FORMATS)
    unknown = [t for t in types if t not in kernels.FORMATS]
    if unknown:
        raise SystemExit(f"error: no kernel for {', '.join(unknown)}")
    timer = Timer(device, runs)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[args.act]
    rows, left_out = [], []
    for name in types:
        if time.perf_counter() - start > args.budget:
            left_out.append(name)
            continue
        block = TYPES_BY_NAME[name].block_size
        n, k = (64, 2 * block) if args.smoke else SHAPE
        rows += tune_type(name, n, k, device, timer, args.smoke, rng, dtype)
    key = kernels.configs.tuned_key(kernels.configs.device_of(device), dtype)
    out = args.out / "tuned_configs.json"
    tiles = json.loads(out.read_text()).get("tiles", {}) if out.exists() else {}
    report = {"device": device_name, "triton": triton.__version__, "torch": torch.__version__,
              "act": args.act, "key": key,
              "shape": [64, "2 blocks"] if args.smoke else list(SHAPE),
              "tiles": {**tiles, key: choose(rows)},
              "timings": rows, "left_out": left_out, "seconds": time.perf_counter() - start}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tuned_configs.json").write_text(json.dumps(report, indent=1))
    text = markdown(report)
    (args.out / "tuned_configs.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main(ARGS)
