#!/usr/bin/env python3
"""What every kernel would run on a GPU, read off its compiled code: compiles each kernel
family for each type, ahead of time for sm_80 and sm_90 (no GPU needed), and tabulates what
the PTX shows (vector loads, tensor-core instructions, local-memory spills) and what the cubin
takes (registers, shared memory against the device's limit, spills); the raw-layout GEMV
(GGUF's own blocks) is compiled beside it for contrast.

    python scripts/inspect_kernels.py [--types Q4_0,Q8_0] [--arch 80,90] [--families gemv]
                                      [--act fp16,bf16,fp32] [--sass] [--jobs 2] [--json OUT.json]

Each kernel is compiled at the configuration the dispatcher would launch on that arch
(gguf_repack_kernels/configs.py with configs.KNOWN_DEVICES' record of it: its SMs, its shared memory per
block) for activations of each --act dtype. `--families` takes any of aot.FAMILIES (the
tensor-core tiles of both the dense and the expert GEMM: gemm_m16,gemm_m32,gemm,moe_m16,
moe_m32,moe_m64); without it, the default families, gemm_m16 at sm_90 only.

--sass adds, from the SASS of each cubin (Triton's own cuobjdump): the instructions of the
main loop, the weight bytes one program reads per iteration, warp-instructions per weight
byte, the bound that puts on the fraction of an H200's bandwidth reachable at batch 1
(budget 0.218, see gguf_repack_kernels/aot.py), registers, shared memory, programs per SM,
spills, and the widest global load from each plane. Configurations are those of
gguf_repack_kernels/configs.py for a 4096 x 4096 weight.

--batch-sweep (issue #31) instead tabulates, for each type and each M in 1, 2, 4, 8, 16, 32, 64,
128, 256, 1024, 2048 and each weight of N x K = 4096 x 4096, 14336 x 4096 and 4096 x 14336,
the path and tile the dispatcher takes and the estimate of scripts/estimate_paths.py (the
model of gguf_repack_kernels/aot.py: matmul_path_estimates, from the sm_90 SASS; estimates, not GPU
timings): speedup over an fp16 matmul and fraction of the ideal. `--json` rows: type, act, M,
N, K, path, tile, speedup_vs_fp16, fraction_of_ideal. `--act bf16` compiles the kernels for
bfloat16 x (vLLM's default) instead of float16; the fp16 matmul and the ideal are the same.

Run without TRITON_INTERPRET (it is removed here): interpreted kernels cannot be compiled.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # each kernel sets its own anyway
sys.path.insert(0, str(Path(__file__).parent))

from gguf_repack_kernels import FORMATS  # noqa: E402
from gguf_repack_kernels.aot import (  # noqa: E402
    DEFAULT_FAMILIES,
    DOT_FAMILIES,
    FAMILIES,
    SHAPE,
    compile_family,
    compile_kernel,
    device,
    family_shared_memory,
    gemm_summary,
    load_widths,
    loop_spills,
    matmul_path_estimates,
    ptx_summary,
    resources,
    sass_summary,
    serialized_mmas,
)
from gguf_repack_kernels.configs import shared_memory_estimate  # noqa: E402


def _measure(compiled, cfg, bytes_per_iteration, arg_names, sass: bool) -> dict:
    row = {**ptx_summary(compiled.asm["ptx"]), **resources(compiled)}
    if sass:
        row.update(sass_summary(compiled, cfg["num_warps"], bytes_per_iteration))
        row["widest_load"] = load_widths(compiled.asm["ptx"], arg_names)
    return row


def _raw_row(name: str, arch: int, act: str, sass: bool) -> dict:
    """The raw-layout GEMV of type `name`, at its own configuration (raw_gemv_config)."""
    from raw_layout_kernels import RAW_DEQUANT, raw_gemv_config, raw_gemv_kernel

    from gguf_repack.format.type_table import TYPES_BY_NAME

    sig = {"RAW": "*u8", "TABLE": "*i32", "X": "*fp16", "OUT": "*fp16", "SUMS": "*fp32",
           "COUNTS": "*i32", "M": "i32", "N": "i32", "B": "i32", "stride_xm": "i32", "stride_om": "i32"}
    qtype = TYPES_BY_NAME[name]
    n, k = SHAPE
    cfg = raw_gemv_config(qtype.block_size, n, k // qtype.block_size, device(arch).sms)
    compiled = compile_kernel(raw_gemv_kernel, sig, {
        "BLOCK": qtype.block_size, "TYPE_SIZE": qtype.type_size, "BN": cfg["BN"],
        "M_PAD": 1, "SPLIT_K": cfg["SPLIT_K"], "DQ": RAW_DEQUANT[name]}, arch,
        num_warps=cfg["num_warps"])
    return {"type": name, "family": "gemv (raw GGUF blocks)", "arch": arch, "act": act,
            "shared_memory_limit": device(arch).shared_memory,
            **_measure(compiled, cfg, cfg["BN"] * qtype.type_size, list(sig), sass)}


def _shared_row(name: str, family: str, arch: int, act: str) -> dict:
    """--shared-only: the shared memory of the kernel as launched, up to Triton's allocation
    of it (aot.shared_memory_of), against the device's limit and configs' estimate."""
    shared, cfg = family_shared_memory(family, name, arch, act)
    row = {"type": name, "family": family, "arch": arch, "act": act, "config": cfg,
           "shared_memory": shared, "shared_memory_limit": device(arch).shared_memory}
    if family in DOT_FAMILIES:
        row["shared_memory_estimate"] = shared_memory_estimate(
            name, FORMATS[name].block_size, cfg["BM"], cfg["BN"], cfg["num_stages"], arch, act,
            cfg.get("STEP_BLOCKS", 1))
    return row


def _row(name: str, family: str, arch: int, act: str, sass: bool) -> dict:
    fields = list(FORMATS[name].fields)
    compiled, cfg, nbytes = compile_family(family, name, arch, act)
    arg_names = fields + ["P%d" % i for i in range(len(fields), 5)] + ["TABLE", "X"]
    row = {"type": name, "family": family, "arch": arch, "act": act, "config": cfg,
           "shared_memory_limit": device(arch).shared_memory,
           **_measure(compiled, cfg, nbytes, arg_names, sass)}
    if family in DOT_FAMILIES:  # configs.py's estimate, which chose the tile
        row["shared_memory_estimate"] = shared_memory_estimate(
            name, FORMATS[name].block_size, cfg["BM"], cfg["BN"], cfg["num_stages"], arch, act,
            cfg.get("STEP_BLOCKS", 1))
    if sass and family in DOT_FAMILIES and arch == 90 and act == "fp16":
        row.update(gemm_summary(compiled, cfg["num_warps"], cfg["BM"], cfg["BN"],
                                FORMATS[name].block_size * cfg.get("STEP_BLOCKS", 1)))
    return row


def _add_path_estimates(rows: list[dict]) -> None:
    """The three matmul paths' estimates (aot.matmul_path_estimates), on the sm_90 GEMM row
    of each type whose dequantize and both GEMM tiles were compiled for sm_90."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    at90 = {(r["type"], r["family"]): r for r in rows if r["arch"] == 90 and r["act"] == "fp16"}
    for (name, family), r in at90.items():
        dq, m16 = at90.get((name, "dequantize")), at90.get((name, "gemm_m16"))
        if family == "gemm" and dq and m16:
            by_bm = {g["bm"]: g for g in (r, m16)}
            type_size = GGML_QUANT_SIZES[GGMLQuantizationType[name]][1]
            r["matmul_path_estimates"] = matmul_path_estimates(name, type_size, dq, by_bm)


def _run(task: tuple) -> dict:
    kind, *args = task
    row = (_raw_row(*args) if kind == "raw" else _shared_row(*args[:-1]) if kind == "shared"
           else _row(*args))
    print(f"compiled {row['type']} {row['family']} sm_{row['arch']} {row['act']}", file=sys.stderr)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--types", default=",".join(sorted(FORMATS)))
    ap.add_argument("--arch", default="80,90")
    ap.add_argument("--families", default=None,
                    help=f"of {','.join(FAMILIES)} (default: {','.join(DEFAULT_FAMILIES)})")
    ap.add_argument("--act", default="fp16", help="activation dtypes: of fp16,bf16,fp32")
    ap.add_argument("--sass", action="store_true", help="add the SASS measures")
    ap.add_argument("--no-raw", action="store_true", help="leave out the raw-layout GEMV")
    ap.add_argument("--shared-only", action="store_true",
                    help="only the shared memory against the limit (no PTX, SASS; 50x faster)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                    help="compiles in parallel (each is one core's work)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--batch-sweep", action="store_true",
                    help="the path and its estimate at each M and weight shape (see above)")
    ap.add_argument("--fail-on-loop-spills", action="store_true",
                    help="with --sass: exit 1 if a kernel of this layout spills registers in its main "
                         "loop (LDL / STL there; .ci/run's check of the Triton the GPU machine has)")
    ap.add_argument("--fail-on-serialized-mma", action="store_true",
                    help="with --sass: exit 1 if a tile that promises its K loop a step "
                         "(configs.mma_pipelined) still has its wgmmas serialized (aot.serialized_mmas)")
    args = ap.parse_args()
    for flag in ("fail_on_loop_spills", "fail_on_serialized_mma"):
        if getattr(args, flag) and not args.sass:
            ap.error(f"--{flag.replace('_', '-')} reads the SASS: add --sass")
    if args.batch_sweep:
        return batch_sweep(args.types.split(","), args.jobs, args.json, args.act)
    archs = [int(a) for a in args.arch.split(",")]
    acts = args.act.split(",")
    families = (args.families or ",".join(DEFAULT_FAMILIES)).split(",")
    unknown = set(families) - set(FAMILIES)
    if unknown:
        ap.error(f"no family {', '.join(sorted(unknown))}")
    # by default gemm_m16 is there for the H200 estimates only: sm_90
    kind = "shared" if args.shared_only else "rp1"
    tasks = [(kind, name, family, arch, act, args.sass) for name in args.types.split(",")
             for family in families for arch in archs for act in acts
             if args.families or not (family == "gemm_m16" and arch != 90)]
    if not args.no_raw and not args.shared_only:  # fp16 x, its only kernel
        from raw_layout_kernels import RAW_DEQUANT

        tasks += [("raw", name, arch, "fp16", args.sass) for name in RAW_DEQUANT for arch in archs]
    if args.jobs > 1:
        with ProcessPoolExecutor(args.jobs) as pool:
            rows = list(pool.map(_run, tasks))
    else:
        rows = [_run(task) for task in tasks]
    if args.sass:
        _add_path_estimates(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    if args.shared_only:
        print("| type | family | arch | act | tile | shared | estimate | limit |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for r in rows:
            cfg = r["config"]
            tile = f"{cfg['BM']}x{cfg['BN']}, {cfg['num_stages']} st." if "BM" in cfg else ""
            print(f"| {r['type']} | {r['family']} | sm_{r['arch']} | {r['act']} | {tile} | "
                  f"{r['shared_memory']} | {r.get('shared_memory_estimate', '-')} | "
                  f"{r['shared_memory_limit'] or '-'} |")
    elif args.sass:
        print("| type | family | arch | loop instr. | bytes/iter. | instr./byte | bound | "
              "registers | progs/SM | shared | spills | widest loads (bytes) |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for r in rows:
            loads = ", ".join(f"{k} {v}" for k, v in r["widest_load"].items())
            print(f"| {r['type']} | {r['family']} | sm_{r['arch']} | {r['loop_instructions']} | "
                  f"{r['weight_bytes_per_iteration']} | {r['warp_instructions_per_byte']:.3f} | "
                  f"{r['bandwidth_bound']:.2f} | {r['registers']} | {r['programs_per_sm']} | "
                  f"{r['shared_memory']} | {r['spills']} | {loads} |")
        gemm = [r for r in rows if "estimated_fraction_of_fp16_mma" in r]
        if gemm:
            print("\n| type | family | GEMM tile | warps / stages | progs/SM | tensor instr. | "
                  "other per tensor instr. | MMA overlaps dequant | est. fraction of fp16 MMA |")
            print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
            for r in gemm:
                print(f"| {r['type']} | {r['family']} | {r['tile']} | {r['warps']} / {r['stages']} | "
                      f"{r['programs_per_sm']} | {r['tensor_instructions']} | "
                      f"{r['other_instructions_per_tensor_instruction']} | "
                      f"{r['mma_overlaps_dequant']} | {r['estimated_fraction_of_fp16_mma']} |")
        paths = [e for r in rows for e in r.get("matmul_path_estimates", [])]
        if paths:
            print("\n| type | M | fp16 matmul (us, est.) | fused GEMM / fp16 | dequantize+matmul "
                  "/ fp16 | dispatched | break-even M |")
            print("| --- | --- | --- | --- | --- | --- | --- |")
            for e in paths:
                print(f"| {e['type']} | {e['M']} | {e['fp16_matmul_us']} | "
                      f"{e['fused_gemm_fraction']} | {e['dequantize_matmul_fraction']} | "
                      f"{e['dispatched']} | {e['break_even_m']} |")
    else:
        print("| type | family | arch | act | tile | vector loads | scalar loads | mma / wgmma | "
              "registers | shared / limit | spills |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for r in rows:
            cfg = r.get("config", {})
            tile = (f"{cfg['BM']}x{cfg['BN']}, {cfg['num_stages']} st." if "BM" in cfg else "")
            print(f"| {r['type']} | {r['family']} | sm_{r['arch']} | {r['act']} | {tile} | "
                  f"{r['vector_loads']} | {r['scalar_loads']} | {r['mma']} / {r['wgmma']} | "
                  f"{r['registers']} | {r['shared_memory']} / {r['shared_memory_limit'] or '-'} | "
                  f"{r['spills']} |")
    if args.fail_on_loop_spills:
        spilling = loop_spills(rows)
        if spilling:
            sys.exit("error: registers spilled in the main loop of: " + "; ".join(spilling))
    if args.fail_on_serialized_mma:
        serialized = serialized_mmas(rows)
        if serialized:
            sys.exit("error: wgmmas serialized in the promised K loop of: " + "; ".join(serialized))


SWEEP_MS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 2048)
SWEEP_SHAPES = ((4096, 4096), (14336, 4096), (4096, 14336))


def batch_sweep(types: list[str], jobs: int, json_path: Path | None, act: str = "fp16") -> None:
    """The path and tile at each M and shape, with the estimate's speedup over fp16 and
    fraction of the ideal (estimate_paths.estimate) for x of dtype `act`, as markdown and
    `json_path` rows."""
    from estimate_paths import estimate

    if act not in ("fp16", "bf16"):
        raise SystemExit(f"error: --batch-sweep takes --act fp16 or bf16, not {act}")
    by_shape = estimate(types, jobs, SWEEP_MS, SWEEP_SHAPES, act)
    rows = []
    for (n, k), estimates in by_shape.items():
        print(f"\nN x K = {n} x {k}: path (tile), speedup over fp16 / fraction of ideal "
              "(estimates from the sm_90 SASS, not GPU timings)\n")
        print("| type | " + " | ".join(f"M={m}" for m in SWEEP_MS) + " |")
        print("| --- |" + " --- |" * len(SWEEP_MS))
        for name, ests in estimates.items():
            cells = []
            for e in ests:
                path = "gemm" if e["tile"].startswith("gemm") else e["tile"]
                rows.append({"type": name, "act": act, "M": e["M"], "N": n, "K": k, "path": path,
                             "tile": e["tile"], "speedup_vs_fp16": round(e["speedup"], 3),
                             "fraction_of_ideal": round(e["fraction_of_ideal"], 3)})
                tile = e["tile"].replace("gemm_", "").replace("dequantize+matmul", "dq+mm")
                cells.append(f"{tile} {e['speedup']:.2f}/{e['fraction_of_ideal']:.2f}")
            print(f"| {name} | " + " | ".join(cells) + " |")
    if json_path:
        json_path.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
