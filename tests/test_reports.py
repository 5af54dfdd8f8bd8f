"""--report FILE.json / FILE.xml of convert, verify and export, read back by libraries made for
them: jsonschema against gguf_repack/reports/report.schema.json, junitparser for JUnit XML."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from ggml_blocks import tensor_bytes, write_gguf
from gguf.constants import GGMLQuantizationType as Q
from junitparser import Error, Failure, JUnitXml

import gguf_repack

SCHEMA = json.loads((Path(gguf_repack.__file__).parent / "reports" / "report.schema.json").read_text())
TENSORS = ["blk.0.ffn_up.weight", "blk.0.ffn_down.weight", "blk.1.ffn_up.weight", "output_norm.weight"]


def run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gguf_repack", *map(str, args)], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, PYTHONWARNINGS="ignore"))


def model(path: Path, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    kinds = [Q.Q4_K, Q.Q8_0, Q.IQ4_XS, Q.F32]
    tensors = {name: (q, tensor_bytes(q, (4, 256) if q != Q.F32 else (256,), rng))
               for name, q in zip(TENSORS, kinds)}
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_gguf(path, tensors, kvs=[])


def json_report(path: Path) -> dict:
    report = json.loads(path.read_text())
    jsonschema.validate(report, SCHEMA)
    return report


def junit_cases(path: Path) -> list:
    xml = JUnitXml.fromfile(str(path))
    return [case for suite in xml for case in suite]


def outcome(case) -> str:
    kinds = {type(r) for r in case.result}
    return "error" if Error in kinds else "failure" if Failure in kinds else "passed"


@pytest.fixture
def repacked(tmp_path) -> tuple[Path, Path]:
    src = model(tmp_path / "m.gguf")
    out = tmp_path / "out"
    proc = run("convert", "--weights-only", src, out, "--report", tmp_path / "convert.json",
               "--report", tmp_path / "convert.xml")
    assert proc.returncode == 0, proc.stderr
    return src, out


def test_convert_and_a_passing_verify_report_every_tensor(repacked, tmp_path):
    src, out = repacked
    report = json_report(tmp_path / "convert.json")
    assert report["command"] == "convert" and report["status"] == "passed"
    [output] = report["outputs"]
    assert [c["name"] for c in output["cases"]] == TENSORS
    manifest = json.loads((out / "manifest.json").read_text())
    assert output["files"][0]["sha256"] == manifest["sources"][0]["sha256"]
    assert [c.name for c in junit_cases(tmp_path / "convert.xml")] == TENSORS

    proc = run("verify", out, "--against", src, "--report", tmp_path / "v.json",
               "--report", tmp_path / "v.xml")
    assert proc.returncode == 0, proc.stderr
    report = json_report(tmp_path / "v.json")
    assert report["status"] == "passed" and report["totals"]["cases"] == len(TENSORS) + 1  # + the header
    checksum = {c["name"]: c for c in report["outputs"][0]["cases"]}["blk.0.ffn_up.weight"]["checksum"]
    assert checksum["algorithm"] == "xxh3_128" and checksum["expected"] == checksum["found"]
    junit = junit_cases(tmp_path / "v.xml")
    assert len(junit) == len(TENSORS) + 1 and {outcome(c) for c in junit} == {"passed"}
    assert JUnitXml.fromfile(str(tmp_path / "v.xml")).tests == len(TENSORS) + 1


def test_a_corrupted_plane_is_one_failed_case_naming_its_tensor(repacked, tmp_path):
    src, out = repacked
    manifest = json.loads((out / "manifest.json").read_text())
    record = next(t for t in manifest["tensors"] if t["name"] == "blk.0.ffn_down.weight")
    shard = out / record["shard"]
    header_len = int.from_bytes(shard.read_bytes()[:8], "little")
    entry = json.loads(shard.read_bytes()[8 : 8 + header_len])[record["planes"][-1]["key"]]
    data = bytearray(shard.read_bytes())
    data[8 + header_len + entry["data_offsets"][0] + 3] ^= 0x40  # one bit of its qs plane
    shard.write_bytes(bytes(data))

    proc = run("verify", out, "--report", tmp_path / "v.json", "--report", tmp_path / "v.xml")
    assert proc.returncode == 1, proc.stderr
    failed = [c for c in junit_cases(tmp_path / "v.xml") if outcome(c) != "passed"]
    assert [(c.name, outcome(c)) for c in failed] == [("blk.0.ffn_down.weight", "failure")]
    assert "checksum mismatch" in failed[0].result[0].message
    report = json_report(tmp_path / "v.json")
    assert report["status"] == "failed" and report["totals"]["failed"] == 1
    [bad] = [c for c in report["outputs"][0]["cases"] if c["status"] != "passed"]
    assert bad["name"] == "blk.0.ffn_down.weight" and bad["checksum"]["expected"] != bad["checksum"]["found"]


def test_an_unreadable_directory_is_one_error_case_and_exit_2(tmp_path):
    (tmp_path / "nothing").mkdir()
    proc = run("verify", tmp_path / "nothing", "--report", tmp_path / "v.json",
               "--report", tmp_path / "v.xml")
    assert proc.returncode == 2 and proc.stderr.startswith("error: "), proc.stderr
    [case] = junit_cases(tmp_path / "v.xml")
    assert outcome(case) == "error" and "manifest.json" in case.result[0].message
    report = json_report(tmp_path / "v.json")
    assert report["status"] == "error" and report["totals"] == {
        "outputs": 1, "cases": 1, "passed": 0, "failed": 0, "error": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nothing", "v.json", "v.xml"]  # no temporaries


def test_a_report_that_cannot_be_written_fails_before_any_work(tmp_path):
    src = model(tmp_path / "m.gguf")
    proc = run("convert", src, tmp_path / "out", "--report", tmp_path / "no" / "r.json")
    assert proc.returncode == 2 and "does not exist" in proc.stderr
    proc = run("convert", src, tmp_path / "out", "--report", tmp_path / "r.txt")
    assert proc.returncode == 2 and ".json or .xml" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_export_report(repacked, tmp_path):
    src, out = repacked
    proc = run("export", out, tmp_path / "back.gguf", "--report", tmp_path / "e.json")
    assert proc.returncode == 0, proc.stderr
    report = json_report(tmp_path / "e.json")
    [case] = report["outputs"][0]["cases"]
    assert case["kind"] == "file" and case["checksum"]["found"] == report["outputs"][0]["files"][0]["sha256"]
    assert (tmp_path / "back.gguf").read_bytes() == src.read_bytes()


def test_verify_a_whole_tree_against_its_sources(tmp_path):
    """As a pipeline runs it after `convert DIR OUT_ROOT`: one report for all outputs; a damaged
    output, an output whose source is gone and a source with no output each fail, by name."""
    sources = tmp_path / "models"
    for i, name in enumerate(["a", "team/b", "team/c", "gone"]):
        model(sources / f"{name}.gguf", seed=i)
    assert run("convert", "--weights-only", sources, tmp_path / "out").returncode == 0
    shutil.rmtree(tmp_path / "out" / "team" / "c")  # its source has no output now
    (sources / "gone.gguf").unlink()  # this output has no source now
    header = tmp_path / "out" / "a" / "gguf-header-00001.bin"
    header.write_bytes(header.read_bytes()[:-1] + b"\x01")

    proc = run("verify", "--recursive", tmp_path / "out", "--against", sources,
               "--report", tmp_path / "v.json", "--report", tmp_path / "v.xml")
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    summary = proc.stdout.strip().splitlines()[-1]
    assert summary.startswith("verify: 4 output(s): 1 ok, 3 failed, 0 unreadable"), summary
    report = json_report(tmp_path / "v.json")
    status = {Path(o["path"]).relative_to(tmp_path / "out").as_posix(): o["status"]
              for o in report["outputs"]}
    assert status == {"a": "failed", "gone": "failed", "team/b": "passed", "team/c": "failed"}
    failures = {(Path(s.name).name, c.name) for s in JUnitXml.fromfile(str(tmp_path / "v.xml")) for c in s
                if outcome(c) != "passed"}
    assert failures == {("a", "a.gguf"),  # its header: the source file's name
                        ("gone", str(tmp_path / "out" / "gone")),
                        ("c", str(tmp_path / "out" / "team" / "c"))}


def test_verify_takes_the_changed_files_of_outputs_as_pre_commit_passes_them(repacked, tmp_path):
    src, out = repacked
    second = tmp_path / "second"
    shutil.copytree(out, second)
    hf_model = tmp_path / "hf-model"  # a Hugging Face model kept beside: the same shard names
    hf_model.mkdir()
    (hf_model / "model-00001-of-00001.safetensors").write_bytes(b"not ours")
    files = [out / "manifest.json", out / "model-00001-of-00001.safetensors", second / "manifest.json",
             hf_model / "model-00001-of-00001.safetensors"]
    proc = run("verify", *files)
    assert proc.returncode == 0 and "verify: 2 output(s): 2 ok" in proc.stdout, (proc.stdout, proc.stderr)
    assert f"{hf_model / 'model-00001-of-00001.safetensors'}: not in a gguf-repack output" in proc.stdout
    (second / "gguf-header-00001.bin").write_bytes(b"GGUF")
    proc = run("verify", *files)
    assert proc.returncode == 1 and f"mismatch: {second}: header of m.gguf" in proc.stdout
