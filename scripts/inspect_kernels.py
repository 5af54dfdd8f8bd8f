#!/usr/bin/env python3
"""What every kernel would run on a GPU, read off its PTX: compiles each kernel family for
each type, ahead of time for sm_80 and sm_90 (no GPU needed), and tabulates vector loads,
tensor-core instructions and local-memory spills; the raw-layout GEMV (GGUF's own blocks)
is compiled beside it for contrast.

    python scripts/inspect_kernels.py [--types Q4_0,Q8_0] [--arch 80,90] [--json OUT.json]

Run without TRITON_INTERPRET (it is removed here): interpreted kernels cannot be compiled.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, str(Path(__file__).parent))

from gguf_repack_kernels import FORMATS  # noqa: E402
from gguf_repack_kernels.aot import FAMILIES, compile_kernel, compile_ptx, ptx_summary  # noqa: E402


def raw_rows(archs) -> list[dict]:
    """The raw-layout GEMV of each type it has, at the rp1 GEMV's configuration (aot._spec)."""
    from gguf_repack_kernels import configs
    from raw_layout_kernels import RAW_DEQUANT, raw_gemv_kernel

    from gguf_repack.type_table import TYPES_BY_NAME

    sig = {"RAW": "*u8", "TABLE": "*i32", "X": "*fp16", "OUT": "*fp32", "M": "i32", "N": "i32",
           "B": "i32", "stride_xm": "i32", "stride_om": "i32"}
    rows = []
    for name, dq in RAW_DEQUANT.items():
        qtype = TYPES_BY_NAME[name]
        cfg = configs.gemv_config(qtype.block_size, 4096, 4096 // qtype.block_size, 132)
        for arch in archs:
            ptx = compile_kernel(raw_gemv_kernel, sig, {
                "BLOCK": qtype.block_size, "TYPE_SIZE": qtype.type_size, "BN": cfg["BN"],
                "M_PAD": 1, "SPLIT_K": cfg["SPLIT_K"], "DQ": dq}, arch, num_warps=cfg["num_warps"])
            rows.append({"type": name, "family": "gemv (raw GGUF blocks)", "arch": arch,
                         **ptx_summary(ptx)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--types", default=",".join(sorted(FORMATS)))
    ap.add_argument("--arch", default="80,90")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    archs = [int(a) for a in args.arch.split(",")]
    rows = []
    for name in args.types.split(","):
        for family in FAMILIES:
            for arch in archs:
                rows.append({"type": name, "family": family, "arch": arch,
                             **ptx_summary(compile_ptx(family, name, arch))})
                print(f"compiled {name} {family} sm_{arch}", file=sys.stderr)
    rows += raw_rows(archs)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    print("| type | family | arch | vector loads | scalar loads | mma / wgmma | spills |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['type']} | {r['family']} | sm_{r['arch']} | {r['vector_loads']} | "
              f"{r['scalar_loads']} | {r['mma']} / {r['wgmma']} | {r['spills']} |")


if __name__ == "__main__":
    main()
