"""`gguf-repack convert DIR/ OUT_ROOT/`: every model under a directory, as a user runs it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from ggml_blocks import tensor_bytes, write_gguf
from gguf.constants import GGMLQuantizationType as Q


def run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gguf_repack", *map(str, args)], capture_output=True,
                          text=True, timeout=600, env=dict(os.environ, PYTHONWARNINGS="ignore"))


def small_model(path: Path, seed: int, split: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    tensors = {f"blk.{i}.ffn_up.weight": (Q.Q6_K, tensor_bytes(Q.Q6_K, (4, 256), rng)) for i in range(3)}
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_gguf(path, tensors, kvs=[], split_max_tensors=split)


@pytest.fixture
def archive(tmp_path) -> Path:
    """An archive as people keep one: files at the top and in folders, a split set, a file
    that is not GGUF, a truncated download and a hidden folder."""
    root = tmp_path / "models"
    small_model(root / "a.gguf", 0)
    small_model(root / "team" / "b.gguf", 1)
    small_model(root / "team" / "c.gguf", 2, split=1)  # c-0000{1,2,3}-of-00003.gguf
    damaged = root / "broken" / "d.gguf"
    small_model(damaged, 3)
    damaged.write_bytes(damaged.read_bytes()[:-100])
    (root / "notes.txt").write_text("not a model")
    small_model(root / ".cache" / "e.gguf", 4)
    return root


def outputs(out_root: Path) -> list[str]:
    return sorted(p.parent.relative_to(out_root).as_posix() for p in out_root.rglob("manifest.json"))


def test_an_archive_converts_model_by_model_and_a_rerun_resumes(archive, tmp_path):
    out_root = tmp_path / "out"
    proc = run("convert", "--weights-only", archive, out_root)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)  # one model failed
    assert outputs(out_root) == ["a", "team/b", "team/c"]
    errors = proc.stderr.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith("error: ") and "d.gguf" in errors[0], proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("4 model(s)")  # the split set is one model; .cache is not searched
    assert [line.split("] ")[1].split(":")[0] for line in lines[1:5]] == ["a", "broken/d", "team/b", "team/c"]
    assert lines[4].startswith("[4/4, 100% of bytes]")
    table = {line.split()[0]: line.split()[1:] for line in lines[5:]}
    assert (table["converted"][0], table["skipped"][0], table["failed"][0], table["total"][0]) == \
        ("3", "0", "1", "4")
    assert int(table["total"][1].replace(",", "")) == sum(
        f.stat().st_size for f in archive.rglob("*.gguf") if ".cache" not in f.parts)
    # the split set went in whole: it exports to the three shards
    assert len(json.loads((out_root / "team" / "c" / "manifest.json").read_text())["sources"]) == 3

    # interrupted after a: only a's output is left; the rerun converts the rest, skips a
    for name in ("team/b", "team/c"):
        shutil.rmtree(out_root / name)
    stamp = (out_root / "a" / "manifest.json").stat().st_mtime_ns
    proc = run("convert", "--weights-only", archive, out_root)
    assert proc.returncode == 1
    assert "a: skipped" in proc.stdout and "team/b: converted" in proc.stdout
    assert (out_root / "a" / "manifest.json").stat().st_mtime_ns == stamp
    assert outputs(out_root) == ["a", "team/b", "team/c"]

    # a source replaced by another model: never overwritten silently
    small_model(archive / "a.gguf", 9)
    (archive / "broken" / "d.gguf").unlink()
    proc = run("convert", "--weights-only", archive, out_root)
    assert proc.returncode == 1 and "converted from a different source" in proc.stderr, proc.stderr
    assert "team/b: skipped" in proc.stdout
    proc = run("convert", "--weights-only", "--force", archive, out_root)
    assert proc.returncode == 0, proc.stderr
    assert "a: converted" in proc.stdout
    assert run("verify", out_root / "a", "--against", archive / "a.gguf").returncode == 0


def test_an_archive_with_nothing_to_convert_is_an_error(tmp_path):
    (tmp_path / "empty").mkdir()
    proc = run("convert", tmp_path / "empty", tmp_path / "out")
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and "no .gguf files" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_the_real_models_as_an_archive(real_models, tmp_path):
    """The two real llama.cpp files (Gemma's parts joined) in one folder, beside a damaged copy
    of SmolLM2 (its header cut short): both real models convert with their engine files, the
    damaged one is reported, and a second run skips the two."""
    root = tmp_path / "archive"
    root.mkdir()
    for name, path in real_models.items():
        (root / name).symlink_to(path)
    smollm2 = real_models["SmolLM2-135M-Instruct.Q4_1.gguf"]
    with open(smollm2, "rb") as f:
        (root / "damaged.gguf").write_bytes(f.read(1_000_000))
    out_root = tmp_path / "out"
    proc = run("convert", root, out_root)
    assert proc.returncode == 1 and "damaged.gguf" in proc.stderr, (proc.stdout, proc.stderr)
    assert outputs(out_root) == sorted(n.removesuffix(".gguf") for n in real_models)
    assert (out_root / "gemma-3-270m-q4_k_m" / "tokenizer.json").is_file()
    proc = run("convert", root, out_root)
    assert proc.stdout.count(": skipped") == 2 and proc.returncode == 1
