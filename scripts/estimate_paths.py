#!/usr/bin/env python3
"""Which path x @ W.T should take at each batch size M, estimated from the SASS (issue #31):
compiles, ahead of time for sm_90 with fp16 activations (no GPU needed), every kernel family a
candidate path launches (the GEMV at M = 1, the fused GEMM's BM = 16, 32, 64 and 128 tiles, the
dequantize kernel), and tabulates for a 4096 x 4096 weight on an H200 the estimated time of
each candidate at M = 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, the path
the dispatcher takes (dispatch.matmul_path, configs.matmul_choice) and its speedup over an
fp16 matmul and fraction of the ideal (the fp16 matmul's bound with the quantized weight's
bytes). The model is gguf_repack_kernels/aot.py: matmul_path_estimates. Estimates, not GPU timings.

    python scripts/estimate_paths.py [--types Q4_0,Q4_K] [--jobs 1] [--json OUT.json]
                                     [--write-configs]

--write-configs writes the fastest choice at each M (estimated at the M above and on to
4096) as gguf_repack_kernels/configs.py's MATMUL_RULE for the types estimated (the others keep theirs),
the GEMV kept at M = 1. Run without TRITON_INTERPRET (it is removed here).

--experts estimates the expert products instead (aot.expert_path_estimates: the expert GEMV,
a program a (token, slot) pair (at one weight row a thread too, where few pairs take it) or 2
or 4 of an expert's rows, against the expert tiles of
BM = 16, 32 and 64) on the expert
stacks of aot.EXPERT_SHAPES (Qwen3-30B-A3B's, DeepSeek-V3's) at 1 to 512 tokens, by the rows
the experts chosen get on average; with --write-configs, one rule a type from them
(expert_rule) as configs.py's MOE_RULE. `--json` then holds the estimates, the rules and the
compiles' measures.

    python scripts/estimate_paths.py --experts [--types ...] [--jobs 2] [--json OUT.json] [--write-configs]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import re
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)

from gguf_repack_kernels import FORMATS, configs  # noqa: E402
from gguf_repack_kernels.aot import (  # noqa: E402
    CHOICES,
    EXPERT_SHAPES,
    EXPERT_TOKENS,
    MOE_GEMV_XR,
    PATH_MS,
    SHAPE,
    compile_family,
    expert_path_estimates,
    gemm_summary,
    matmul_path_estimates,
    sass_summary,
)

# the types of issue #31's table
TYPES = ("Q4_0", "Q4_K", "Q5_K", "Q6_K", "Q8_0", "Q2_K", "IQ4_XS", "MXFP4")
# the families the candidates launch, and the BM of the GEMM ones
FAMILIES = {"gemv": None, "gemv_m2": None, "gemv_m4": None, "dequantize": None, "gemm_m16": 16,
            "gemm_m32": 32, "gemm": 64, "gemm_m128": 128}
# the expert products' families (--experts), and the BM of the tiles
EXPERT_FAMILIES = {"moe_gemv": None, "moe_gemv_r1": None, "moe_gemv_x2": None, "moe_gemv_x4": None,
                   "moe_m16": 16, "moe_m32": 32, "moe_m64": 64}
# where the rule is estimated beyond the table's M: on to the prefill sizes
RULE_MS = PATH_MS + (384, 512, 768, 1024, 2048, 4096)
CONFIGS = Path(configs.__file__)
BEGIN, END = "# BEGIN estimate_paths --write-configs\n", "# END estimate_paths --write-configs\n"
EXPERTS_BEGIN = "# BEGIN estimate_paths --experts --write-configs\n"
EXPERTS_END = "# END estimate_paths --experts --write-configs\n"


def _compile(task: tuple[str, str, int | None, str]) -> tuple[str, str, dict]:
    name, family, m, act = task
    compiled, cfg, nbytes = compile_family(family, name, 90, act, m)
    row = {"config": cfg, **sass_summary(compiled, cfg["num_warps"], nbytes)}
    row.pop("loop_opcodes")
    if FAMILIES.get(family) or EXPERT_FAMILIES.get(family):
        row.update(gemm_summary(compiled, cfg["num_warps"], cfg["BM"], cfg["BN"],
                                FORMATS[name].block_size * cfg.get("STEP_BLOCKS", 1)))
    print(f"compiled {name} {family} sm_90 {act} {cfg}", file=sys.stderr)
    return name, family, row



def _compile_all(tasks: list, jobs: int) -> list:
    """_compile of each task, `jobs` processes at once."""
    if jobs <= 1:
        return [_compile(t) for t in tasks]
    with ProcessPoolExecutor(jobs) as pool:
        return list(pool.map(_compile, tasks))

def _tasks(name: str, ms, act: str = "fp16") -> list[tuple[str, str, int | None, str]]:
    """The compiles the estimate of `name` needs with activations `act`: the GEMV and
    dequantize kernels, and each GEMM tile at one M of each split K it takes over `ms` for
    the 4096 x 4096 weight (split K is a constexpr of its loop; other shapes take the nearest
    compile of the tile)."""
    n, k = SHAPE
    block = FORMATS[name].block_size
    tasks = [(name, family, None, act) for family, bm in FAMILIES.items() if not bm]
    for family, bm in FAMILIES.items():
        # BM = 128 is a swapped tile only (configs.swap_ab): elsewhere it is BM = 64's
        if bm and (bm < 128 or configs.swap_ab(name, bm, act)):
            splits = {}
            for m in ms:
                cfg = configs.gemm_config(name, block, m, n, k // block, configs.KNOWN_DEVICES[90],
                                          act, bm=bm)
                splits.setdefault(cfg["SPLIT_K"], m)
            tasks += [(name, family, m, act) for m in splits.values()]
    return tasks


def estimate(types, jobs: int, ms=PATH_MS, shapes=(SHAPE,), act: str = "fp16") -> dict:
    """{type: matmul_path_estimates' rows at each M of `ms`} for one shape (N, K), or
    {(N, K): that} for several; the kernels compiled for activations `act` (the fp16 matmul
    and the ideal are the same for bf16 x: an H200 multiplies both at one rate)."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    tasks = [t for name in types for t in _tasks(name, ms, act)]
    compiled = _compile_all(tasks, jobs)
    rows, gemm = {}, {}
    for name, family, row in compiled:
        if FAMILIES[family]:
            gemm.setdefault(name, {})[FAMILIES[family], row["config"]["SPLIT_K"]] = row
        else:
            rows[name, family] = row
    out = {}
    for shape in shapes:
        for name in types:
            type_size = GGML_QUANT_SIZES[GGMLQuantizationType[name]][1]
            out.setdefault(shape, {})[name] = matmul_path_estimates(
                name, type_size, rows[name, "dequantize"], gemm[name],
                {rows[name, f]["config"]["XR"]: rows[name, f] for f in ("gemv", "gemv_m2", "gemv_m4")}, ms,
                shape, act)
    return out[shapes[0]] if len(shapes) == 1 else out


def rule(estimates: list[dict]) -> tuple:
    """(largest M, choice) pairs of the fastest choice at each estimated M, runs merged, the
    last open-ended (None); the GEMV kept at M = 1 (decode, the engines' CUDA graphs). Up to
    configs.FUSED_MAX_M by issue #31's own model (a tile's issue and MMA time overlapped:
    aot.matmul_path_estimates' "best"), beyond it by the conservative one (added:
    "best_serial"), which was made so that an MMA-bound tile is not taken for a free one at
    prefill sizes. Up to the cap the conservative model's added MMA time weighed against the
    GEMV alone: with 2 and 4 rows of x a GEMV program it took the GEMV at M = 2 for Q4_0,
    Q4_1, Q4_K and Q5_K, 0.59-0.76 of the ideal by the issue's model where the BM = 16 tile is
    at 0.88-1.0 (BENCHMARKS.md "x rows a GEMV program"); past the cap an H200 timed the tiles
    slower than dequantize+matmul anyway."""
    cap = configs.FUSED_MAX_M
    best = [(e["M"], "gemv" if e["M"] == 1 else e["best"] if e["M"] <= cap else e["best_serial"])
            for e in estimates]
    pairs: list[list] = []
    for m, choice in best:
        if pairs and pairs[-1][1] == choice:
            pairs[-1][0] = m
        else:
            pairs.append([m, choice])
    pairs[-1][0] = None
    return tuple(tuple(p) for p in pairs)


def write_configs(rules: dict[str, tuple], name: str = "MATMUL_RULE", begin: str = BEGIN,
                  end: str = END) -> None:
    """configs.py's rule `name` (between the lines `begin` and `end`): these types' rules, the
    other types keeping theirs."""
    text = CONFIGS.read_text()
    start, stop = text.index(begin) + len(begin), text.index(end)
    merged = {**getattr(configs, name), **rules}
    lines = [f"{name}: dict[str, tuple] = {{\n"]
    for type_name, rule in sorted(merged.items()):
        line = f"    {type_name!r}: {rule!r},\n"
        if len(line) > 110:  # the project's line length: a (largest M or rows, choice) pair a line
            line = f"    {type_name!r}: (\n" + "".join(f"        {p!r},\n" for p in rule) + "    ),\n"
        lines.append(line)
    lines.append("}\n")
    CONFIGS.write_text(text[:start] + "".join(lines) + text[stop:])


def _short(choice: str) -> str:
    return {"dequantize+matmul": "dq+mm", "gemv": "gemv"}.get(choice, re.sub("gemm_bm", "bm", choice))


def markdown(estimates: dict[str, list[dict]]) -> str:
    ms = [e["M"] for e in next(iter(estimates.values()))]
    out = ["Speedup over fp16 / fraction of ideal of the path dispatched today "
           "(estimates from the sm_90 SASS, not GPU timings):", "",
           "| type | " + " | ".join(f"M={m}" for m in ms) + " |",
           "| --- |" + " --- |" * len(ms)]
    for name, rows in estimates.items():
        out.append(f"| {name} | " + " | ".join(
            f"{e['speedup']:.2f}/{e['fraction_of_ideal']:.2f}" for e in rows) + " |")
    out += ["", "Path dispatched today (and the estimate's fastest where it differs):", "",
            "| type | " + " | ".join(f"M={m}" for m in ms) + " |", "| --- |" + " --- |" * len(ms)]
    for name, rows in estimates.items():
        out.append(f"| {name} | " + " | ".join(
            _short(e["tile"]) + ("" if e["best"] == e["tile"] else f" ({_short(e['best'])})")
            for e in rows) + " |")
    out += ["", "Speedup over fp16 / fraction of ideal of the estimate's fastest choice:", "",
            "| type | " + " | ".join(f"M={m}" for m in ms) + " |", "| --- |" + " --- |" * len(ms)]
    for name, rows in estimates.items():
        cells = []
        for e in rows:
            t = e["times_us"][e["best"]]
            cells.append(f"{e['fp16_us'] / t:.2f}/{e['ideal_us'] / t:.2f}")
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    for name, rows in estimates.items():
        out += ["", f"{name}: estimated us by choice (fp16, ideal, dispatched):", "",
                "| M | fp16 | ideal | " + " | ".join(CHOICES) + " | dispatched |",
                "| --- |" + " --- |" * (len(CHOICES) + 3)]
        for e in rows:
            out.append(f"| {e['M']} | {e['fp16_us']:.2f} | {e['ideal_us']:.2f} | " + " | ".join(
                f"{e['times_us'][c]:.2f}" if c in e["times_us"] else "-" for c in CHOICES)
                + f" | {e['tile']} |")
    return "\n".join(out)


def estimate_experts(types, jobs: int, act: str = "fp16") -> tuple[dict, dict]:
    """({type: {stack name: aot.expert_path_estimates' rows at EXPERT_TOKENS}} for every stack
    of aot.EXPERT_SHAPES, {type: {family: its compile's measures}}), from the expert families'
    compiles (the expert GEMV a pair, at its rows a thread and at one, and on 2 and 4 of an
    expert's rows, the three tiles)."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    tasks = [(name, family, None, act) for name in types for family in EXPERT_FAMILIES]
    compiled = _compile_all(tasks, jobs)
    rows = {(name, family): row for name, family, row in compiled}
    out = {}
    for name in types:
        type_size = GGML_QUANT_SIZES[GGMLQuantizationType[name]][1]
        tiles = {bm: rows[name, family] for family, bm in EXPERT_FAMILIES.items() if bm}
        x_rows = {xr: rows[name, family] for family, xr in MOE_GEMV_XR.items()}
        out[name] = {stack: expert_path_estimates(name, type_size, rows[name, "moe_gemv"], tiles, shape,
                                                  EXPERT_TOKENS, act, x_rows, rows[name, "moe_gemv_r1"])
                     for stack, shape in EXPERT_SHAPES.items()}
    return out, {name: {family: rows[name, family] for family in EXPERT_FAMILIES} for name in types}


TIE_WEIGHT = 0.05  # expert_rule: the conservative model's share of the loss


def expert_rule(by_stack: dict[str, list[dict]]) -> tuple:
    """One rule for the expert products of a type, configs.MOE_RULE's (largest rows an expert,
    choice) pairs: the GEMV a pair up to some rows an expert (one at least), then the GEMV on 2
    and on 4 of an expert's rows, then the tiles of BM = 16, 32 and 64, in that order (any but
    the first left out), the last open-ended; of all such rules the one closest to the
    estimate's fastest choice at every estimated batch size and stack: the least sum of
    log(time of the rule's choice / the fastest's). By the dense rule's models (rule): up to
    configs.FUSED_MAX_M rows an expert #31's own (a tile's issue and MMA time overlapped),
    beyond it the conservative one (added). With the GEMV on rows of an expert the
    conservative model took it over the BM = 16 tile at 2.3-4 rows (IQ4_XS: 82 us against
    the tile's 88, where the issue's model has the tile at 62), as it had taken the dense
    GEMV at M = 2. Each stack's choices are close near one row an expert (which stack prefers
    the GEMV there differs), so the fastest choice point by point would alternate; the rule
    is monotone."""
    cap = configs.FUSED_MAX_M
    points = [(e["rows_per_expert"], e["times_us"] if e["rows_per_expert"] <= cap else e["times_serial_us"],
               e["times_serial_us"]) for rows in by_stack.values() for e in rows]
    order = sorted((c for c in points[0][1] if c != "gemv"),
                   key=lambda c: (c.startswith("tiles_bm"), int(re.sub(r"\D", "", c))))
    # bounds at the estimated rows, rounded up (the dispatcher compares the rows unrounded)
    cuts = sorted({math.ceil(r * 1000) / 1000 for r, _, _ in points if r >= 1.0} | {1.0}) + [math.inf]
    # where the overlapped model ties (every choice at the memory bound: Q6_K's and Q8_0's
    # tiles of any BM), the conservative one's order decides, at a twentieth of the weight
    loss = [{c: math.log(t[c] / min(t.values())) + TIE_WEIGHT * math.log(serial[c] / min(serial.values()))
             for c in t} for _, t, serial in points]

    def cost(bounds):  # bounds: the largest rows of the GEMV and of each tile in order
        total = 0.0
        for (r, _, _), lost in zip(points, loss):
            # (the GEMV's bound is 1 or more: one token's experts are its, as configs.moe_choice has it)
            i = next(i for i, top in enumerate(bounds) if r <= top)
            total += lost[(["gemv"] + order)[i]]
        return total

    best = None
    # the GEMV's bound and each tile's but the last, in increasing order (the last: the rest)
    for bounds in itertools.combinations_with_replacement(cuts[:-1], len(order)):
        c = cost(bounds + (math.inf,))
        if best is None or c < best[0] - 1e-12:
            best = (c, bounds + (math.inf,))
    rule, low = [], None
    for top, choice in zip(best[1], ["gemv"] + order):
        if low is not None and top <= low:
            continue  # an empty run
        rule.append((None if top == math.inf else top, choice))
        low = top
    return tuple(rule)


def _short_expert(choice: str) -> str:
    return choice.replace("tiles_bm", "bm")


def expert_markdown(estimates: dict[str, dict[str, list[dict]]]) -> str:
    """Per stack, a row a type: at each batch size, the rows an expert, the path dispatched
    and its speedup over fp16 / fraction of the ideal; then the estimate's fastest choice by
    the conservative model where it differs."""
    out = []
    for stack, (n_experts, top, n, k) in EXPERT_SHAPES.items():
        first = next(iter(estimates.values()))[stack]
        out += ["", f"{stack}: {n_experts} experts, {top} a token, N x K = {n} x {k}. Per batch size "
                "(tokens): the path dispatched, speedup over fp16 / fraction of the ideal "
                "(estimates from the sm_90 SASS, not GPU timings)", "",
                "| type | " + " | ".join(f"{e['tokens']} ({e['rows_per_expert']:.1f} rows)"
                                         for e in first) + " |",
                "| --- |" + " --- |" * len(first)]
        for name, by_stack in estimates.items():
            out.append(f"| {name} | " + " | ".join(
                f"{_short_expert(e['tile'])} {e['speedup']:.2f}/{e['fraction_of_ideal']:.2f}"
                + ("" if e["best_serial"] == e["tile"] else f" ({_short_expert(e['best_serial'])})")
                for e in by_stack[stack]) + " |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--types", default=",".join(TYPES))
    ap.add_argument("--jobs", type=int, default=1, help="compiles in parallel")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--write-configs", action="store_true",
                    help="write the fastest choice by M as gguf_repack_kernels/configs.py's MATMUL_RULE "
                         "(with --experts: MOE_RULE)")
    ap.add_argument("--experts", action="store_true",
                    help="the expert products instead, by batch size on aot.EXPERT_SHAPES' stacks")
    args = ap.parse_args()
    types = args.types.split(",")
    unknown = set(types) - set(FORMATS)
    if unknown:
        ap.error(f"no type {', '.join(sorted(unknown))}")
    if args.experts:
        experts, kernels = estimate_experts(types, args.jobs)
        print(expert_markdown(experts))
        expert_rules = {name: expert_rule(by_stack) for name, by_stack in experts.items()}
        print("\nMOE_RULE:", expert_rules)
        if args.json:
            args.json.write_text(json.dumps({"estimates": experts, "rules": expert_rules,
                                             "kernels": kernels}, indent=1))
        if args.write_configs:
            write_configs(expert_rules, "MOE_RULE", EXPERTS_BEGIN, EXPERTS_END)
            print(f"\nwrote MOE_RULE for {', '.join(types)} into {CONFIGS}", file=sys.stderr)
        return
    estimates = estimate(types, args.jobs, RULE_MS)
    table = {name: [e for e in rows if e["M"] in PATH_MS] for name, rows in estimates.items()}
    print(markdown(table))
    rules = {name: rule(rows) for name, rows in estimates.items()}
    if args.json:
        args.json.write_text(json.dumps({"estimates": table, "rules": rules}, indent=1))
    if args.write_configs:
        write_configs(rules)
        print(f"\nwrote MATMUL_RULE for {', '.join(types)} into {CONFIGS}", file=sys.stderr)


if __name__ == "__main__":
    main()
