#!/usr/bin/env python3
"""Structured fuzzer for `gguf-repack convert`, on a real GGUF header.

    python scripts/fuzz_gguf.py [--cases 5000] [--seed 1] [--time-budget 1500] [--json PATH]

The base file is a real llama.cpp header (every key/value of SmolLM2-135M-Instruct, its
49k-token vocabulary and merges included) over ten of its real tensors, written by gguf's
GGUFWriter with `general.alignment` set. The places to damage come from gguf's GGUFReader,
never from the code under test:

  count      tensor count, key/value count, array lengths
  length     key lengths, string lengths, tensor name lengths, string-array item lengths
  type       value types, array item types, tensor types
  dim        dimension counts and dimensions
  offset     tensor data offsets
  alignment  the general.alignment value
  version    the GGUF version
  metadata   model key/values (sizes, token ids): these reach transformers' GGUF conversion
  truncate   the file cut at every region boundary (and one byte either side)
  flip       1-8 random bytes XORed, in the header or anywhere

Each case runs the real command line (`gguf-repack convert`) in a forked process with a time
limit (--time-limit, 10 s: a hang detector; an undamaged case takes about 1-5 s). The
property, checked for every case:
  - exit 0: the output verifies against the mutated file (`verify(out, against=case)`), or
  - exit 2: stderr is exactly one line `error: ...`, no output directory exists,
  - never a traceback or another exit code, never over the time limit,
  - peak RSS above the parent's (the fork's starting point) at most what the undamaged file
    takes the same way, plus 4x the file, plus 64 MiB,
  - no temporary directory left beside the output.
Metadata cases, and every --engine-files-every'th other case, also write the engine files
(transformers' tokenizer build dominates their time); the rest run with --weights-only.
Exit status 1 when any case breaks the property; each violation is printed with its case.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import signal
import struct
import sys
import tempfile
import time
import traceback
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

TIME_LIMIT_S = 10.0
N_TENSORS = 10
U32_VALUES = (0, 1, 2, 3, 7, 31, 255, 65535, 2**31 - 1, 2**31, 2**32 - 1)
U64_VALUES = U32_VALUES + (2**32, 2**40, 2**59, 2**60, 2**63, 2**64 - 1)


def build_base(source: Path, path: Path) -> Path:
    """The base file: `source`'s key/values and its first N_TENSORS tensors."""
    reader = gguf.GGUFReader(source)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_uint32("general.alignment", 32)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.alignment"):
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), vtype, sub_type=sub)
    for t in reader.tensors[1:N_TENSORS + 1]:  # past token_embd (30 MB): keep the file small
        data = np.array(t.data)
        if t.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            writer.add_tensor(t.name, data)
        else:
            writer.add_tensor(t.name, data, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@dataclass
class Site:
    kind: str
    where: str
    offset: int
    fmt: str  # struct format of the field


def sites(reader: gguf.GGUFReader) -> tuple[list[Site], list[tuple[str, int]]]:
    """Every field to mutate, and every region boundary to cut at, from the base file's
    GGUFReader (read once: 5 s for SmolLM2's 49k tokens)."""
    origin = reader.data.__array_interface__["data"][0]

    def off(part) -> int:
        return part.__array_interface__["data"][0] - origin

    out = [Site("version", "GGUF version", 4, "<I"), Site("count", "tensor count", 8, "<Q"),
           Site("count", "key/value count", 16, "<Q")]
    cuts = [("header counts", 24)]
    structural = {"general.alignment"}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        p = field.parts
        cuts.append((f"kv {key}", field.offset))
        out.append(Site("length", f"key length of {key}", off(p[0]), "<Q"))
        out.append(Site("type", f"value type of {key}", off(p[2]), "<I"))
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.STRING:
            out.append(Site("length", f"string length of {key}", off(p[3]), "<Q"))
        elif vtype == gguf.GGUFValueType.ARRAY:
            out.append(Site("type", f"array item type of {key}", off(p[3]), "<I"))
            out.append(Site("count", f"array length of {key}", off(p[4]), "<Q"))
            if field.types[1] == gguf.GGUFValueType.STRING and len(field.data):
                n_items = len(field.data)
                for i in sorted({0, min(1, n_items - 1), n_items // 2, n_items - 1}):
                    length_part = p[field.data[i] - 1]
                    out.append(Site("length", f"item {i} length of {key}", off(length_part), "<Q"))
        elif key in structural:
            out.append(Site("alignment", key, off(p[3]), "<I"))
        elif vtype in (gguf.GGUFValueType.UINT32, gguf.GGUFValueType.INT32):
            out.append(Site("metadata", f"value of {key}", off(p[3]), "<I"))
    for t in reader.tensors:
        p = t.field.parts
        cuts.append((f"tensor info {t.name}", t.field.offset))
        out.append(Site("length", f"name length of {t.name}", off(p[0]), "<Q"))
        out.append(Site("dim", f"dimension count of {t.name}", off(p[2]), "<I"))
        for j in range(len(p[3])):
            out.append(Site("dim", f"dim {j} of {t.name}", off(p[3]) + 8 * j, "<Q"))
        out.append(Site("type", f"type of {t.name}", off(p[4]), "<I"))
        out.append(Site("offset", f"data offset of {t.name}", off(p[5]), "<Q"))
        cuts += [(f"data of {t.name}", t.data_offset), (f"end of {t.name}", t.data_offset + t.n_bytes)]
    data_start = min(t.data_offset for t in reader.tensors)
    cuts.append(("data section", data_start))
    return out, cuts


@dataclass
class Case:
    kind: str
    what: str
    data: bytes
    engine_files: bool = False


def cases(base: Path, n: int, seed: int, engine_every: int):
    """`n` cases: the deterministic mutations (every site x every interesting value, every cut)
    in a seeded shuffle, with random byte flips as every fifth case and once those run out.
    Each case's bytes are made when it is run."""
    raw = base.read_bytes()
    reader = gguf.GGUFReader(base)
    header_end = reader.tensors[-1].field.offset + 100
    site_list, cuts = sites(reader)
    # let the reader go before the first case: its parse of the vocabulary (some 140 MiB)
    # would count in every forked case's peak RSS
    del reader
    rng = random.Random(seed)
    fixed: list[tuple] = []  # (kind, what, offset, fmt, value) or (kind, what, cut)
    for s in site_list:
        (orig,) = struct.unpack_from(s.fmt, raw, s.offset)
        values = set(U64_VALUES if s.fmt == "<Q" else U32_VALUES)
        values |= {orig + 1, max(orig - 1, 0), orig * 2}
        if s.kind == "type":
            values |= set(range(0, 42))
        if s.kind == "offset":
            values |= {orig + 32, max(orig - 32, 0), len(raw)}
        limit = 2**64 if s.fmt == "<Q" else 2**32
        fixed += [(s.kind, f"{s.where} = {v}", s.offset, s.fmt, v)
                  for v in sorted(values) if v != orig and v < limit]
    for where, pos in cuts:
        fixed += [("truncate", f"cut at {cut} ({where})", cut)
                  for cut in (pos - 1, pos, pos + 1) if 0 <= cut < len(raw)]
    rng.shuffle(fixed)
    structured = iter(fixed)
    for count in range(n):
        engine = engine_every > 0 and count % engine_every == 0
        mutation = next(structured, None) if count % 5 != 4 else None  # every 5th: a flip
        if mutation is not None:
            kind, what, *how = mutation
            if len(how) == 1:
                data = raw[:how[0]]
            else:
                data = bytearray(raw)
                struct.pack_into(how[1], data, how[0], how[2])
            yield Case(kind, what, bytes(data), engine or kind == "metadata")
            continue
        data = bytearray(raw)
        span = header_end if rng.random() < 0.5 else len(raw)
        flipped = []
        for _ in range(rng.randint(1, 8)):
            pos = rng.randrange(span)
            data[pos] ^= rng.randint(1, 255)
            flipped.append(pos)
        yield Case("flip", f"bytes {sorted(flipped)}", bytes(data), engine)


def run_case(case: Case, work: Path, baseline_kib: int, allowance_mib: dict[bool, float]
             ) -> tuple[dict, list[str]]:
    """Run one case in a forked `gguf-repack convert`; return (record, violations)."""
    src, out = work / "case.gguf", work / "out"
    src.write_bytes(case.data)
    stdout, stderr = work / "stdout", work / "stderr"
    args = ["convert", "--no-progress", str(src), str(out)]
    if not case.engine_files:
        args.insert(1, "--weights-only")
    t = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the child: the real CLI, its output to files
        code = 70
        try:
            fd_out = os.open(stdout, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            fd_err = os.open(stderr, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(fd_out, 1)
            os.dup2(fd_err, 2)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            from gguf_repack.cli import main

            main(args=args, prog_name="gguf-repack")
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except BaseException:  # noqa: BLE001 - a traceback is what the property forbids
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    timed_out = False
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() - t > TIME_LIMIT_S:
            os.kill(pid, signal.SIGKILL)
            _, status, usage = os.wait4(pid, 0)
            timed_out = True
            break
        time.sleep(0.002)
    seconds = time.monotonic() - t
    code = os.waitstatus_to_exitcode(status)
    above_mib = max(0, usage.ru_maxrss - baseline_kib) / 1024
    err = stderr.read_text(errors="replace")
    violations = []
    if timed_out:
        violations.append(f"over {TIME_LIMIT_S} s")
    if "Traceback" in err:
        violations.append("traceback: " + err.strip().splitlines()[-1][:200])
    if code == 2:
        lines = err.strip().splitlines()
        if len(lines) != 1 or not lines[0].startswith("error: "):
            violations.append(f"exit 2 without one error line: {err[:200]!r}")
        if out.exists():
            violations.append("exit 2 left an output directory")
    elif code == 0:
        from gguf_repack import verify

        try:
            report = verify(out, against=src)
            if not report.ok:
                violations.append("converted but verify failed: " + "; ".join(report.mismatches[:3]))
        except Exception as e:  # noqa: BLE001
            violations.append(f"converted but verify raised {type(e).__name__}: {e}")
    elif not timed_out:
        violations.append(f"exit code {code}")
    limit_mib = allowance_mib[case.engine_files] + 4 * len(case.data) / 2**20 + 64
    if above_mib > limit_mib:
        violations.append(f"peak RSS {above_mib:.0f} MiB above baseline (limit {limit_mib:.0f})")
    leftovers = [p.name for p in work.iterdir() if p.name.startswith(".out.")]
    if leftovers:
        violations.append(f"left behind {leftovers}")
    for p in leftovers:
        shutil.rmtree(work / p, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    record = {"kind": case.kind, "what": case.what, "exit": code, "seconds": round(seconds, 3),
              "rss_above_mib": round(above_mib, 1), "engine_files": case.engine_files}
    return record, violations


def main() -> int:
    global TIME_LIMIT_S  # run_case's hang detector, set from --time-limit
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--time-budget", type=float, default=1500, help="seconds; stop early past it")
    ap.add_argument("--engine-files-every", type=int, default=100,
                    help="also write engine files for every Nth non-metadata case (0: never)")
    ap.add_argument("--time-limit", type=float, default=TIME_LIMIT_S,
                    help="seconds a case may take before it counts as hung")
    ap.add_argument("--json", type=Path, default=None, help="write the full report here")
    args = ap.parse_args()
    TIME_LIMIT_S = args.time_limit

    # imported once here, so each forked case starts with them loaded
    import gguf_repack.cli  # noqa: F401
    import gguf_repack.converter.engine_files  # noqa: F401
    from gguf_repack.models import SMOLLM2, fetch
    if gguf_repack.converter.engine_files.hf_available() is None:
        import transformers  # noqa: F401

    work = Path(tempfile.mkdtemp(prefix="fuzz-gguf-"))
    t0 = time.monotonic()
    records, failures, base_bytes = [], [], None
    try:
        base = build_base(fetch(SMOLLM2), work / "base.gguf")
        base_bytes = base.stat().st_size
        baseline_kib = int(next(line for line in open("/proc/self/status")
                                if line.startswith("VmRSS:")).split()[1])
        resource.setrlimit(resource.RLIMIT_AS, (16 << 30, resource.RLIM_INFINITY))
        # What the undamaged file takes, each way: building the tokenizer of a 49k vocabulary
        # takes ~300 MiB whatever the file size, so that is the allowance the bound adds to.
        allowance = {}
        for engine in (False, True):
            record, violations = run_case(Case("none", "undamaged", base.read_bytes(), engine), work,
                                          baseline_kib, {False: 1e9, True: 1e9})
            if violations or record["exit"] != 0:
                raise SystemExit(f"error: the undamaged base file fails: {record} {violations}")
            allowance[engine] = record["rss_above_mib"]
        for case in cases(base, args.cases, args.seed, args.engine_files_every):
            if time.monotonic() - t0 > args.time_budget:
                break
            record, violations = run_case(case, work, baseline_kib, allowance)
            records.append(record)
            if violations:
                failures.append({**record, "violations": violations})
                print(f"VIOLATION {record['kind']}: {record['what']}: {violations}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    by_kind = defaultdict(Counter)
    for r in records:
        by_kind[r["kind"]]["converted" if r["exit"] == 0 else f"exit {r['exit']}"] += 1
    slowest = max(records, key=lambda r: r["seconds"])
    biggest = max(records, key=lambda r: r["rss_above_mib"])
    summary = {
        "cases": len(records), "seed": args.seed, "seconds": round(time.monotonic() - t0, 1),
        "violations": len(failures), "base_bytes": base_bytes,
        "engine_file_cases": sum(r["engine_files"] for r in records),
        "undamaged_rss_above_mib": {"weights_only": allowance[False], "engine_files": allowance[True]},
        "by_kind": {k: dict(v) for k, v in sorted(by_kind.items())},
        "slowest": slowest, "most_memory": biggest,
    }
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "failures": failures,
                                         "records": records}, indent=1))
    print(json.dumps(summary, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
