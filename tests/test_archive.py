"""`gguf-repack convert DIR/ OUT_ROOT/`: every model under a directory, as a user runs it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from ggml_blocks import tensor_bytes, write_gguf
from gguf.constants import GGMLQuantizationType as Q

from gguf_repack.converter import archive as archive_module
from gguf_repack.converter.archive import (
    BY_SHA256,
    BY_SIZE_AND_MTIME,
    CONVERTED,
    FAILED,
    SKIPPED,
    convert_archive,
)


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


def closing_table(lines: list[str]) -> dict[str, list[str]]:
    """{label: [models, bytes, seconds]} of the table that ends a run's output."""
    start = next(i for i, line in enumerate(lines) if line.split() == ["models", "bytes", "seconds"])
    return {label: numbers for label, *numbers in (line.rsplit(None, 3) for line in lines[start + 1:])}


SKIPPED_BY_STAT = "skipped: unchanged (size and mtime)"
SKIPPED_BY_SHA256 = "skipped: unchanged (sha256)"


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
    table = closing_table(lines)
    assert [table[k][0] for k in ("converted", SKIPPED_BY_STAT, SKIPPED_BY_SHA256, "failed", "total")] \
        == ["3", "0", "0", "1", "4"]
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
    assert re.search(r"\] a: skipped in [\d.]+ s: unchanged \(size and mtime\)$", proc.stdout, re.M)
    assert closing_table(proc.stdout.splitlines())[SKIPPED_BY_STAT][0] == "1"
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


class HashCount:
    """Counts the archive's whole-file hashes, by file name."""

    def __init__(self, monkeypatch):
        self.names: list[str] = []
        real = archive_module.sha256_file

        def counted(path, *args, **kwargs):
            self.names.append(Path(path).name)
            return real(path, *args, **kwargs)

        monkeypatch.setattr(archive_module, "sha256_file", counted)


def convert_quietly(root: Path, out_root: Path, **options) -> dict[str, tuple[str, str | None]]:
    """{model: (status, the rule of a skip)}, every model's error line kept out of the way."""
    summary = convert_archive(root, out_root, weights_only=True, say=lambda line: None,
                              warn=lambda line: None, **options)
    return {r.model.name: (r.status, r.rule) for r in summary.results}


@pytest.fixture
def converted_archive(archive, tmp_path) -> tuple[Path, Path]:
    """The archive without its broken file, converted once."""
    shutil.rmtree(archive / "broken")
    out_root = tmp_path / "out"
    assert set(convert_quietly(archive, out_root).values()) == {(CONVERTED, None)}
    return archive, out_root


def manifests(out_root: Path) -> dict[Path, tuple[bytes, int]]:
    return {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in out_root.rglob("manifest.json")}


def test_a_rerun_of_an_unchanged_archive_skips_every_model_by_size_and_mtime(converted_archive,
                                                                              monkeypatch):
    archive, out_root = converted_archive
    before = manifests(out_root)
    hashes = HashCount(monkeypatch)
    assert convert_quietly(archive, out_root) == {
        name: (SKIPPED, BY_SIZE_AND_MTIME) for name in ("a", "team/b", "team/c")}
    assert hashes.names == []  # not one file read
    assert manifests(out_root) == before  # a skip writes nothing
    # --checksum hashes every file of every model (the split set's three) and skips them all
    assert convert_quietly(archive, out_root, checksum=True) == {
        name: (SKIPPED, BY_SHA256) for name in ("a", "team/b", "team/c")}
    assert sorted(hashes.names) == sorted(f.name for f in archive.rglob("*.gguf")
                                          if ".cache" not in f.parts)
    assert manifests(out_root) == before


def test_a_touched_file_is_hashed_and_skipped_for_the_same_sha256(converted_archive, monkeypatch):
    """As rsync: an mtime that differs (touch, a copy that did not keep it) makes the model be
    looked at by its contents; the same sha256 is a skip, and the output stays as convert
    wrote it, so the next run hashes it again."""
    archive, out_root = converted_archive
    before = manifests(out_root)
    shard = next((archive / "team").glob("c-00002-of-*.gguf"))
    for path in (archive / "a.gguf", shard):
        os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    hashes = HashCount(monkeypatch)
    for _ in range(2):
        hashes.names.clear()
        assert convert_quietly(archive, out_root) == {
            "a": (SKIPPED, BY_SHA256), "team/b": (SKIPPED, BY_SIZE_AND_MTIME),
            "team/c": (SKIPPED, BY_SHA256)}
        assert sorted(hashes.names) == sorted(["a.gguf"] + [f.name for f in (archive / "team").glob("c-*")])
        assert manifests(out_root) == before
    lines = []
    table = closing_table(convert_archive(archive, out_root, weights_only=True,
                                          say=lines.append).table().splitlines())
    assert "a: skipped" in lines[1] and lines[1].endswith(
        ": unchanged (sha256; the mtime differs from its manifest's, so each run hashes it)")
    assert (table[SKIPPED_BY_SHA256][0], table[SKIPPED_BY_STAT][0]) == ("2", "1")


def test_another_size_or_sha256_is_a_different_source_and_force_replaces_it(converted_archive,
                                                                            monkeypatch):
    archive, out_root = converted_archive
    hashes = HashCount(monkeypatch)
    a, b = archive / "a.gguf", archive / "team" / "b.gguf"
    with open(a, "ab") as f:  # another size: different, without reading it
        f.write(bytes(32))
    stat = b.stat()  # same size, other bytes, new mtime: hashed, and different
    data = bytearray(b.read_bytes())
    data[-1] ^= 1
    b.write_bytes(bytes(data))
    os.utime(b, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    lines = []
    summary = convert_archive(archive, out_root, weights_only=True, say=lambda line: None,
                              warn=lines.append)
    assert [(r.model.name, r.status) for r in summary.results] == [
        ("a", FAILED), ("team/b", FAILED), ("team/c", SKIPPED)]
    assert "file names or sizes differ from its manifest's" in lines[0]
    assert "(sha256 differs); --force replaces it" in lines[1]
    assert hashes.names == ["b.gguf"]
    assert convert_quietly(archive, out_root, force=True) == {
        "a": (CONVERTED, None), "team/b": (CONVERTED, None), "team/c": (SKIPPED, BY_SIZE_AND_MTIME)}


def test_checksum_finds_a_change_that_kept_size_and_mtime(converted_archive):
    """What size and mtime cannot see (a file rewritten in place, its mtime put back), as
    with rsync: --checksum is the way to find it."""
    archive, out_root = converted_archive
    a = archive / "a.gguf"
    stat = a.stat()
    data = bytearray(a.read_bytes())
    data[-1] ^= 1
    a.write_bytes(bytes(data))
    os.utime(a, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert convert_quietly(archive, out_root)["a"] == (SKIPPED, BY_SIZE_AND_MTIME)
    assert convert_quietly(archive, out_root, checksum=True)["a"] == (FAILED, None)


def test_an_output_of_an_older_manifest_without_mtime_is_skipped_by_sha256(converted_archive, tmp_path,
                                                                           monkeypatch):
    archive, out_root = converted_archive
    path = out_root / "a" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["format_version"] = 2  # as version 2 wrote it: no mtime
    for source in manifest["sources"]:
        del source["mtime_ns"]
    path.write_text(json.dumps(manifest))
    hashes = HashCount(monkeypatch)
    lines = []
    summary = convert_archive(archive, out_root, weights_only=True, say=lines.append)
    assert hashes.names == ["a.gguf"]
    assert "] a: skipped in " in lines[1] and lines[1].endswith(
        ": unchanged (sha256; its manifest, version 2, records no mtime)"), lines[1]
    assert closing_table(summary.table().splitlines())[SKIPPED_BY_SHA256][0] == "1"
    # an output version 1 wrote (tests/data), beside its source
    v1 = Path(__file__).parent / "data" / "manifest-v1"
    (tmp_path / "old").mkdir()
    shutil.copy(v1 / "every-type.gguf", tmp_path / "old")
    shutil.copytree(v1 / "every-type-rp1", tmp_path / "old-out" / "every-type")
    assert convert_quietly(tmp_path / "old", tmp_path / "old-out") == {
        "every-type": (SKIPPED, BY_SHA256)}


def test_checksum_is_for_a_directory_source(archive, tmp_path):
    proc = run("convert", "--checksum", archive / "a.gguf", tmp_path / "out")
    assert proc.returncode == 2 and proc.stderr.startswith("error: --checksum applies to a directory")
    assert len(proc.stderr.splitlines()) == 1 and not (tmp_path / "out").exists()


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
    assert closing_table(proc.stdout.splitlines())[SKIPPED_BY_STAT][0] == "2"
