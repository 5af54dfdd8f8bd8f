#!/usr/bin/env python3
"""The decode GEMV's K loop under Triton's software pipeliner, from the SASS of an ahead-of-time
compile (no GPU): for each type and stage count, the loop's instructions, its loads (LDG) or
asynchronous copies (LDGSTS) and the shared-memory reads they bring (LDS), registers, shared
memory, spills, and the compile's seconds. Stage 1 is the GEMV as dispatch launches it by
default (its while loop); 2 and 3 the tuner's candidates (gemv.gemv_dot_row's STAGES: a
counted loop the pipeliner takes, stages - 1 iterations' loads in flight), at M = 1, 4096 x 4096.

    python scripts/gemv_stages.py --types Q4_0,Q4_K --arch 90      # BENCHMARKS.md, issue #31
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path

from gguf_repack_kernels import FORMATS, aot


def row(name: str, arch: int, stages: int) -> dict:
    kernel, sig, constexprs, cfg, _ = aot._spec("gemv", FORMATS[name], "fp16", aot.device(arch))
    constexprs = {**constexprs, "STAGES": stages}  # (gemv.gemv_dot_row's loop by STAGES)
    start = time.perf_counter()
    compiled = aot.compile_kernel(kernel, sig, constexprs, arch, num_warps=cfg["num_warps"],
                                  num_stages=max(stages, 1))
    seconds = time.perf_counter() - start
    sass, _ = aot.cubin_sass(compiled.asm["cubin"])
    ops = Counter(op.split(".")[0] for _, op in aot.main_loop(sass))
    return {"type": name, "stages": stages, "loop": sum(ops.values()), "LDG": ops["LDG"],
            "LDGSTS": ops["LDGSTS"], "LDS": ops["LDS"], **aot.resources(compiled),
            "compile_s": round(seconds, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--types", default="Q4_0,Q4_K")
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--stages", default="1,2,3")
    ap.add_argument("--json", type=Path, help="also the rows as JSON, here")
    args = ap.parse_args()
    rows = []
    print("| type | stages | loop instructions | LDG | LDGSTS | LDS | registers | shared memory | spills "
          "| compile (s) |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in args.types.split(","):
        for stages in map(int, args.stages.split(",")):
            r = row(name, args.arch, stages)
            rows.append(r)
            print(f"| {r['type']} | {r['stages']} | {r['loop']} | {r['LDG']} | {r['LDGSTS']} | {r['LDS']} "
                  f"| {r['registers']} | {r['shared_memory']} | {r['spills']} | {r['compile_s']} |",
                  flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
