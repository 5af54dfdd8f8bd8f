#!/usr/bin/env python3
"""Convert benchmark: time against cp, peak memory against file size, output size.

    python scripts/bench_convert.py [--repeat 7] [--big-gib 2] [--model-gib 3] [--model-repeat 5]
                                    [--archive-repeat 3] [--only archive] [--workdir DIR]

1. Time: `gguf-repack convert --weights-only` of the Gemma 3 file vs `cp` of the same file,
   page cache warm, alternating in one run; median of --repeat runs each. Reported for the CLI
   (a fresh process, interpreter start included) and for `gguf_repack.convert()` in a warm
   process. Then the whole CLI convert, engine files (config, tokenizer) included.
   The same CLI convert vs `cp` on a synthetic file of --model-gib GiB shaped like a Q4_K_M
   Llama (Q4_K, Q6_K, Q8_0 tensors, F32 norms), where start-up is a small part: median of
   --model-repeat runs each, alternating, `sync` before each (untimed), and the convert's
   peak RSS. The file needs about 3x its size free in the work directory; it is deleted at
   the end. --model-gib 0 skips it.
2. Peak RSS of a convert process on a synthetic GGUF of --big-gib GiB and on one of a quarter
   of that size (both written here, tensor by tensor), each minus the peak RSS of a process
   that only imports gguf_repack: streaming means the two stay about equal.
3. Output size (weights, manifest, header) over source size, for both real models.
4. An archive rerun: both real models hard-linked into a folder, `gguf-repack convert DIR OUT`
   (the whole convert, engine files included) against the same command again on the unchanged
   folder (skipped by size and mtime: no source read) and again with --checksum (each source's
   sha256 compared), alternating, median of --archive-repeat runs each. --archive-repeat 0
   skips it; --only archive runs nothing else.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from benchutil import machine_line, peak_rss_mib  # noqa: E402

from gguf_repack.models import GEMMA, SMOLLM2, fetch  # noqa: E402


def timed(cmd: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def write_synthetic(path: Path, total_bytes: int) -> int:
    """A GGUF of mixed Q4_K / Q8_0 / F16 tensors (4096 x 4096 each) of about total_bytes,
    written with gguf's GGUFWriter one tensor at a time."""
    import gguf
    from gguf.constants import GGML_QUANT_SIZES
    from gguf.constants import GGMLQuantizationType as Q

    kinds = [Q.Q4_K, Q.Q8_0, Q.F16]
    n, k = 4096, 4096
    plan, size = [], 0
    while size < total_bytes:
        qtype = kinds[len(plan) % len(kinds)]
        bs, ts = GGML_QUANT_SIZES[qtype]
        nbytes = n * k // bs * ts
        plan.append((f"blk.{len(plan)}.weight", qtype, nbytes))
        size += nbytes
    w = gguf.GGUFWriter(str(path), "llama")
    for name, qtype, nbytes in plan:
        w.add_tensor_info(name, (n, nbytes // n), np.dtype(np.uint8), nbytes, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(0)
    for _, _, nbytes in plan:
        w.write_tensor_data(rng.integers(0, 256, nbytes, dtype=np.uint8))
    w.close()
    return path.stat().st_size


def _valid_blocks(qtype, n_blocks: int, rng: np.random.Generator) -> np.ndarray:
    """n_blocks random blocks of a GGUF type as uint8 [n_blocks, type_size]: random bits,
    each float16 scale field a finite number in [-1, 1)."""
    from gguf_repack.format.type_table import F16, TYPES

    t = TYPES[int(qtype)]
    blocks = np.frombuffer(rng.bytes(n_blocks * t.type_size), np.uint8).reshape(n_blocks, -1).copy()
    for f in t.fields:
        if f.kind == F16:
            scales = rng.uniform(-1, 1, (n_blocks, f.size // 2)).astype("<f2")
            blocks[:, f.offset : f.offset + f.size] = scales.view(np.uint8)
    return blocks


def write_model_like(path: Path, total_bytes: int) -> tuple[int, str]:
    """A GGUF shaped like a Q4_K_M Llama (hidden 4096, FFN 14336, 8 KV heads of 128):
    Q4_K attention and FFN, Q6_K value and down projections, F32 norms, a Q8_0 token
    embedding and a Q6_K output, 32000 tokens; as many layers as fit total_bytes. Random
    valid blocks (finite scales), written one tensor at a time with GGUFWriter. Returns the
    size and a line saying what is in it."""
    import gguf
    from gguf.constants import GGML_QUANT_SIZES
    from gguf.constants import GGMLQuantizationType as Q

    h, ffn, kv, vocab = 4096, 14336, 1024, 32000

    def layer(i: int) -> list[tuple[str, Q, tuple[int, int]]]:
        b = f"blk.{i}."
        return [(b + "attn_norm.weight", Q.F32, (1, h)), (b + "attn_q.weight", Q.Q4_K, (h, h)),
                (b + "attn_k.weight", Q.Q4_K, (kv, h)), (b + "attn_v.weight", Q.Q6_K, (kv, h)),
                (b + "attn_output.weight", Q.Q4_K, (h, h)), (b + "ffn_norm.weight", Q.F32, (1, h)),
                (b + "ffn_gate.weight", Q.Q4_K, (ffn, h)), (b + "ffn_up.weight", Q.Q4_K, (ffn, h)),
                (b + "ffn_down.weight", Q.Q6_K, (h, ffn))]

    def nbytes(qtype: Q, shape: tuple[int, int]) -> int:
        bs, ts = GGML_QUANT_SIZES[qtype]
        return shape[0] * shape[1] // bs * ts

    plan = [("token_embd.weight", Q.Q8_0, (vocab, h)), ("output_norm.weight", Q.F32, (1, h)),
            ("output.weight", Q.Q6_K, (vocab, h))]
    size = sum(nbytes(q, s) for _, q, s in plan)
    while size < total_bytes:
        more = layer(sum(name.endswith("attn_q.weight") for name, _, _ in plan))
        plan += more
        size += sum(nbytes(q, s) for _, q, s in more)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(sum(name.endswith("attn_q.weight") for name, _, _ in plan))
    for name, qtype, (n, k) in plan:
        if qtype == Q.F32:
            w.add_tensor_info(name, (k,), np.dtype(np.float32), 4 * k)
        else:
            w.add_tensor_info(name, (n, nbytes(qtype, (n, k)) // n), np.dtype(np.uint8),
                              nbytes(qtype, (n, k)), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(0)
    for _, qtype, (n, k) in plan:
        if qtype == Q.F32:
            w.write_tensor_data(rng.uniform(0.5, 1.5, k).astype(np.float32))
        else:
            w.write_tensor_data(_valid_blocks(qtype, n * k // GGML_QUANT_SIZES[qtype][0], rng).reshape(-1))
    w.close()
    counts = Counter(q.name for _, q, _ in plan)
    what = ", ".join(f"{counts[t]} {t}" for t in ("Q4_K", "Q6_K", "Q8_0", "F32"))
    return path.stat().st_size, f"{len(plan)} tensors ({what})"


def bench_model(work: Path, gib: float, repeat: int, cli: list[str]) -> dict | None:
    """`cp` vs `gguf-repack convert --weights-only` of a model-like file of `gib` GiB."""
    from benchutil import run_measured

    need = int(3.2 * gib * 2**30)
    free = shutil.disk_usage(work).free
    if free < need:
        print(f"skipping the {gib} GiB model: {free / 2**30:.1f} GiB free in {work}, "
              f"{need / 2**30:.1f} needed", file=sys.stderr)
        return None
    src, copy, out = work / "model-like.gguf", work / "model-like-copy.gguf", work / "model-like-out"
    try:
        size, what = write_model_like(src, int(gib * 2**30))
        subprocess.run(["cat", str(src)], check=True, stdout=subprocess.DEVNULL)  # warm
        cp_t, conv_t, rss = [], [], 0.0
        for _ in range(repeat):
            copy.unlink(missing_ok=True)
            subprocess.run(["sync"], check=True)
            cp_t.append(timed(["cp", str(src), str(copy)]))
            copy.unlink()
            shutil.rmtree(out, ignore_errors=True)
            subprocess.run(["sync"], check=True)
            seconds, peak, _ = run_measured([*cli[1:], "--weights-only", str(src), str(out)])
            conv_t.append(seconds)
            rss = max(rss, peak)
            shutil.rmtree(out)
    finally:
        for path in (src, copy):
            path.unlink(missing_ok=True)
        shutil.rmtree(out, ignore_errors=True)
    fmt = ", ".join
    return {"title": f"Convert vs cp, synthetic Q4_K_M-like Llama ({size / 1e9:.2f} GB: {what}), "
                     f"page cache warm, `sync` before each run, alternating:",
            "size": size, "cp": statistics.median(cp_t), "convert": statistics.median(conv_t),
            "cp_runs": fmt(f"{t:.2f}" for t in cp_t), "convert_runs": fmt(f"{t:.2f}" for t in conv_t),
            "rss": rss}


def bench_archive(work: Path, models: list[Path], repeat: int) -> dict:
    """The first convert of a folder against reruns of it unchanged (size and mtime; sha256)."""
    folder, out = work / "archive", work / "archive-out"
    folder.mkdir()
    for model in models:  # a hard link keeps the source's mtime: what an archive's rerun sees
        (folder / model.name).hardlink_to(model)
    cli = [sys.executable, "-m", "gguf_repack", "convert", "--no-progress", str(folder), str(out)]
    first, rerun, checksum = [], [], []
    for _ in range(repeat):
        shutil.rmtree(out, ignore_errors=True)
        first.append(timed(cli))
        rerun.append(timed(cli))
        checksum.append(timed([*cli, "--checksum"]))
    shutil.rmtree(out, ignore_errors=True)
    return {"models": [m.name for m in models], "first": first, "rerun": rerun,
            "checksum": checksum}


def archive_lines(archive: dict) -> list[str]:
    first, rerun, checksum = (statistics.median(archive[k]) for k in ("first", "rerun", "checksum"))
    runs = {k: ", ".join(f"{t:.2f}" for t in archive[k]) for k in ("first", "rerun", "checksum")}
    return [f"An archive rerun: `gguf-repack convert DIR OUT` on a folder of "
            f"{' and '.join(archive['models'])} (hard links), then again on the unchanged folder, "
            f"then again with --checksum, alternating, median of {len(archive['first'])}:", "",
            "| what | seconds (median) | runs | ratio to the first run |", "| --- | --- | --- | --- |",
            f"| first run (converts both) | {first:.2f} | {runs['first']} | 1.00 |",
            f"| rerun, unchanged (size and mtime) | {rerun:.2f} | {runs['rerun']} | "
            f"{rerun / first:.3f} |",
            f"| rerun, unchanged, `--checksum` (sha256) | {checksum:.2f} | {runs['checksum']} | "
            f"{checksum / first:.3f} |"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--big-gib", type=float, default=2.0)
    ap.add_argument("--model-gib", type=float, default=3.0)
    ap.add_argument("--model-repeat", type=int, default=5)
    ap.add_argument("--archive-repeat", type=int, default=3)
    ap.add_argument("--only", choices=["archive"], default=None)
    ap.add_argument("--workdir", type=Path, default=None)
    args = ap.parse_args()

    from gguf_repack import convert

    gemma = fetch(GEMMA)
    smollm2 = fetch(SMOLLM2)
    work = Path(tempfile.mkdtemp(prefix="bench-convert-", dir=args.workdir))
    cli = [sys.executable, "-m", "gguf_repack", "convert", "--force", "--no-progress"]
    if args.only == "archive":
        try:
            archive = bench_archive(work, [smollm2, gemma], max(args.archive_repeat, 1))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        print("\n".join([machine_line(), "", *archive_lines(archive)]))
        return
    try:
        # 1. time vs cp
        out, copy = work / "gemma-out", work / "gemma-copy.gguf"
        subprocess.run(["cat", str(gemma)], check=True, stdout=subprocess.DEVNULL)  # warm
        cp_t, cli_t, lib_t, full_t = [], [], [], []
        for _ in range(args.repeat):  # each run writes a fresh target; deleting is not timed
            copy.unlink(missing_ok=True)
            cp_t.append(timed(["cp", str(gemma), str(copy)]))
            shutil.rmtree(out, ignore_errors=True)
            cli_t.append(timed([*cli, "--weights-only", str(gemma), str(out)]))
            shutil.rmtree(out, ignore_errors=True)
            t = time.perf_counter()
            convert(gemma, out, weights_only=True)
            lib_t.append(time.perf_counter() - t)
            shutil.rmtree(out, ignore_errors=True)
            full_t.append(timed([*cli, str(gemma), str(out)]))
        cp_s, cli_s, lib_s, full_s = map(statistics.median, (cp_t, cli_t, lib_t, full_t))
        copy.unlink(missing_ok=True)
        shutil.rmtree(out, ignore_errors=True)

        # 1b. a multi-GB model: time vs cp, and peak RSS
        llama = bench_model(work, args.model_gib, args.model_repeat, cli) if args.model_gib else None

        # 2. peak RSS vs file size
        base = peak_rss_mib(["-c", "import gguf_repack, gguf_repack.cli"])
        rss = {}
        for label, gib in (("big", args.big_gib), ("quarter", args.big_gib / 4)):
            src = work / f"synthetic-{label}.gguf"
            size = write_synthetic(src, int(gib * 2**30))
            peak = peak_rss_mib([*cli[1:], str(src), str(work / f"synthetic-{label}-out")])
            rss[label] = (size, peak)
            shutil.rmtree(work / f"synthetic-{label}-out")
            src.unlink()

        # 3. output size
        sizes = {}
        for model in (smollm2, gemma):
            o = work / f"{model.stem}-out"
            summary = convert(model, o, force=True)
            engine = sum((o / name).stat().st_size for name in summary.engine_files)
            sizes[model.name] = (model.stat().st_size, summary.bytes_out - engine, engine)

        # 4. an archive rerun
        archive = bench_archive(work, [smollm2, gemma], args.archive_repeat) if args.archive_repeat else None
    finally:
        shutil.rmtree(work, ignore_errors=True)

    lines = [
        machine_line(),
        "",
        f"Convert vs cp, Gemma 3 270M Q4_K_M ({gemma.stat().st_size / 1e6:.1f} MB), page cache warm, "
        f"median of {args.repeat}:",
        "",
        "| what | seconds | ratio to cp |",
        "| --- | --- | --- |",
        f"| `cp` | {cp_s:.3f} | 1.00 |",
        f"| `gguf-repack convert --weights-only` (new process) | {cli_s:.3f} | {cli_s / cp_s:.2f} |",
        f"| `gguf_repack.convert(weights_only=True)` (warm process) | {lib_s:.3f} | {lib_s / cp_s:.2f} |",
        f"| `gguf-repack convert` with config and tokenizer (new process) | {full_s:.3f} | "
        f"{full_s / cp_s:.2f} |",
        "",
        f"Peak RSS of `gguf-repack convert` (baseline: a process that only imports gguf_repack, "
        f"{base:.0f} MiB):",
        "",
        "| source | size | peak RSS | above baseline |",
        "| --- | --- | --- | --- |",
    ]
    for label, (size, peak) in rss.items():
        lines.append(f"| synthetic ({label}) | {size / 2**30:.2f} GiB | {peak:.0f} MiB "
                     f"| {peak - base:.0f} MiB |")
    if llama:
        lines += ["", llama["title"], "", "| what | seconds (median) | runs | ratio to cp |",
                  "| --- | --- | --- | --- |",
                  f"| `cp` | {llama['cp']:.2f} | {llama['cp_runs']} | 1.00 |",
                  f"| `gguf-repack convert --weights-only` (new process) | {llama['convert']:.2f} "
                  f"| {llama['convert_runs']} | {llama['convert'] / llama['cp']:.2f} |",
                  "", f"Peak RSS of that convert: {llama['rss']:.0f} MiB ({llama['rss'] - base:.0f} "
                  f"MiB above baseline) for a {llama['size'] / 2**30:.2f} GiB source."]
    lines += ["", "Output size (weights, manifest, header) over source size; the engine files "
              "(tokenizer.json mostly) come on top:", "",
              "| model | source bytes | output bytes | ratio | engine files bytes |",
              "| --- | --- | --- | --- | --- |"]
    for name, (src_b, out_b, engine_b) in sizes.items():
        lines.append(f"| {name} | {src_b:,} | {out_b:,} | {out_b / src_b:.4f} | {engine_b:,} |")
    if archive:
        lines += ["", *archive_lines(archive)]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
