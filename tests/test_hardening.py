"""Hostile and damaged inputs, interrupted runs, corrupted outputs, odd tensor names and full
disks: the converter keeps working, loses nothing and never writes outside its place."""

from __future__ import annotations

import json
import os
import random
import resource
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from ggml_blocks import every_type_tensors, tensor_bytes, write_gguf
from gguf.constants import GGMLQuantizationType as Q

from gguf_repack import FormatError, convert, export, load, verify

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "gguf_repack"]


@pytest.mark.slow
def test_fuzzer_holds_the_property_for_500_cases(tmp_path):
    report = tmp_path / "fuzz.json"
    # --time-limit: the fuzzer's hang detector, set far above any case's time (1-5 s) so that
    # the machine's load cannot decide this test (it did once, a case at 10.0 s under CI)
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "fuzz_gguf.py"), "--cases", "500",
                           "--seed", "11", "--engine-files-every", "0", "--time-limit", "120",
                           "--json", str(report)],
                          capture_output=True, text=True, timeout=1500)
    summary = json.loads(report.read_text())["summary"]
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    assert summary["cases"] == 500 and summary["violations"] == 0
    kinds = summary["by_kind"]
    assert {"count", "length", "type", "dim", "offset", "truncate", "flip"} <= set(kinds)
    outcomes = {o for per_kind in kinds.values() for o in per_kind}
    assert outcomes == {"converted", "exit 2"}  # both halves of the property were exercised


def _converted_files(out: Path) -> bool:
    return (out / "manifest.json").is_file()


def test_kill_9_at_random_moments_leaves_no_output_or_a_complete_one(smollm2, tmp_path):
    rng = random.Random(5)
    # how long each way takes here, to spread the kills over the whole run
    t = time.perf_counter()
    subprocess.run([*CLI, "convert", "--weights-only", smollm2, tmp_path / "timing"], check=True)
    weights_s = time.perf_counter() - t
    outcomes = []
    for trial in range(20):
        out = tmp_path / f"out{trial}"
        weights_only = trial % 2 == 0
        args = [*CLI, "convert", *(["--weights-only"] if weights_only else []), smollm2, out]
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.05, weights_s * 1.2 if weights_only else 6.0))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if out.exists():
            assert _converted_files(out), sorted(p.name for p in out.iterdir())
            assert verify(out, against=smollm2).ok
            outcomes.append("complete")
        else:
            outcomes.append("absent")
        for leftover in tmp_path.glob(f".out{trial}.tmp-*"):
            # a killed run cannot clean up; what it leaves is not an output, and says so
            with pytest.raises(FormatError, match="not a complete gguf-repack output"):
                load(leftover)
        # and the same output path converts fine afterwards
        if not out.exists():
            convert(smollm2, out, weights_only=True)
            assert verify(out).ok
    assert "absent" in outcomes  # the kills did land mid-run


@pytest.fixture(scope="module")
def small_output(tmp_path_factory):
    work = tmp_path_factory.mktemp("corrupt")
    src = write_gguf(work / "m.gguf", every_type_tensors(np.random.default_rng(3)))
    out = work / "good"
    convert(src, out, max_shard_size=20_000)
    return out


def _byte_owner(shard: Path, pos: int, manifest: dict) -> str | None:
    """The tensor whose bytes sit at `pos` of a safetensors file, from the file's own header
    (None for the header itself)."""
    raw = shard.read_bytes()
    (n,) = struct.unpack_from("<Q", raw, 0)
    if pos < 8 + n:
        return None
    header = json.loads(raw[8:8 + n])
    owner_of_key = {p["key"]: t["name"] for t in manifest["tensors"] for p in t["planes"]}
    for key, entry in header.items():
        start, end = (8 + n + o for o in entry.get("data_offsets", (0, 0)))
        if key != "__metadata__" and start <= pos < end:
            return owner_of_key[key]
    raise AssertionError(f"byte {pos} of {shard} belongs to no tensor")


def test_one_flipped_byte_in_the_weights_is_found_and_named(small_output, tmp_path):
    manifest = json.loads((small_output / "manifest.json").read_text())
    shards = [small_output / s for s in manifest["shards"]]
    sizes = [s.stat().st_size for s in shards]
    rng = random.Random(17)
    cli_trials = 0
    for trial in range(100):
        bad = tmp_path / "bad"
        shutil.rmtree(bad, ignore_errors=True)
        shutil.copytree(small_output, bad)
        shard = rng.choices(shards, weights=sizes)[0]
        data = bytearray((bad / shard.name).read_bytes())
        pos = rng.randrange(len(data))
        data[pos] ^= rng.randint(1, 255)
        (bad / shard.name).write_bytes(data)
        owner = _byte_owner(shard, pos, manifest)

        report = verify(bad)
        assert not report.ok
        if owner is not None:
            assert any(m.startswith(f"{owner}: ") for m in report.mismatches), (owner, report.mismatches)
        else:  # the shard's own header: the tensors in it are unreadable, and the file is named
            assert any(shard.name in m for m in report.mismatches), report.mismatches
        with pytest.raises(FormatError, match="verify failed"):
            load(bad, verify=True)
        if owner is not None and cli_trials < 3:
            cli_trials += 1
            proc = subprocess.run([*CLI, "verify", bad], capture_output=True, text=True)
            assert proc.returncode == 1 and f"mismatch: {owner}: " in proc.stdout


ODD_NAMES = ["../../escape/x.weight", "/abs/path.weight", "a/b/../c", "nul\0inside", "n" * 200,
             "manifest.json", "model-00001-of-00001.safetensors", "ünï çødé"]


def test_tensor_names_never_become_paths(tmp_path):
    rng = np.random.default_rng(9)
    tensors = {name: (Q.Q4_0 if i % 2 else Q.F32,
                      tensor_bytes(Q.Q4_0 if i % 2 else Q.F32, (2, 32), rng))
               for i, name in enumerate(ODD_NAMES)}
    work = tmp_path / "work"
    work.mkdir()
    src = write_gguf(work / "m.gguf", tensors)
    before = {p for p in tmp_path.rglob("*")}
    out = work / "out"
    convert(src, out)
    created = {p for p in tmp_path.rglob("*")} - before
    assert all(p.parent == out or p == out for p in created), created
    assert {p.name for p in out.iterdir()} == {"manifest.json", "model.safetensors.index.json",
                                               "model-00001-of-00001.safetensors", "gguf-header-00001.bin"}
    model = load(out)
    for name in ODD_NAMES:
        assert model[name].shape[-1] == 32
    assert verify(out, against=src).ok
    export(out, work / "back.gguf")
    assert (work / "back.gguf").read_bytes() == src.read_bytes()


def test_a_name_that_would_share_a_key_with_a_plane_is_refused(tmp_path, cli):
    rng = np.random.default_rng(2)
    src = write_gguf(tmp_path / "m.gguf", {"w": (Q.Q4_0, tensor_bytes(Q.Q4_0, (2, 32), rng)),
                                           "w.d": (Q.F32, tensor_bytes(Q.F32, (2, 4), rng))})
    proc = cli("convert", src, tmp_path / "out")
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and "'w.d'" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"]


@pytest.mark.parametrize("weights_only", [True, False])
def test_a_full_disk_fails_cleanly(smollm2, tmp_path, weights_only):
    """RLIMIT_FSIZE makes writes past 5 MB fail as a full filesystem would (EFBIG)."""
    def small_disk():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (5_000_000, 5_000_000))

    out = tmp_path / "out"
    args = [*CLI, "convert", *(["--weights-only"] if weights_only else []), smollm2, out]
    proc = subprocess.run(args, preexec_fn=small_disk, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == f"error: {out}: cannot write the output (File too large); nothing was left behind\n"
    assert list(tmp_path.iterdir()) == []


def test_a_read_only_output_location_fails_cleanly(smollm2, tmp_path, cli):
    if os.geteuid() == 0:  # root writes anywhere; a read-only filesystem stops it
        out = Path("/proc/gguf-repack-out")
    else:
        (tmp_path / "ro").mkdir(mode=0o555)
        out = tmp_path / "ro" / "out"
    proc = cli("convert", smollm2, out)
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and str(out) in proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and not out.exists()
