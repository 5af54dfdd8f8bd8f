"""Hub references (gguf_repack/sources/hub.py) through the command line, with the real
huggingface_hub client talking to tests/fake_hub.py on 127.0.0.1 (HF_ENDPOINT), each test with a
cache of its own (HF_HOME)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from fake_hub import FakeHub
from ggml_blocks import tensor_bytes, write_gguf
from gguf.constants import GGMLQuantizationType as Q

REPO = "someone/Tiny-GGUF"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tiny_model(path: Path, qtype: Q, seed: int, split: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    tensors = {f"blk.{i}.ffn_up.weight": (qtype, tensor_bytes(qtype, (8, 256), rng)) for i in range(3)}
    return write_gguf(path, tensors, kvs=[], split_max_tensors=split)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """A repo as llama.cpp users publish one: one file per quant, the biggest as a split set."""
    d = tmp_path_factory.mktemp("repo")
    out = {"Tiny-Q4_K_M.gguf": tiny_model(d / "Tiny-Q4_K_M.gguf", Q.Q4_K, 0),
           "Tiny-Q4_K_S.gguf": tiny_model(d / "Tiny-Q4_K_S.gguf", Q.Q4_K, 1),
           "mmproj-Tiny-Q8_0.gguf": tiny_model(d / "mmproj-Tiny-Q8_0.gguf", Q.Q8_0, 3)}
    tiny_model(d / "Tiny-Q8_0.gguf", Q.Q8_0, 2, split=1)  # GGUFWriter names the shards
    for shard in sorted(d.glob("Tiny-Q8_0-*-of-*.gguf")):
        out[f"Q8_0/{shard.name}"] = shard
    assert len([k for k in out if k.startswith("Q8_0/")]) == 3
    return out


def run(hub_env: dict, *args, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gguf_repack", *map(str, args)], env=hub_env,
                          capture_output=True, text=True, timeout=timeout)


def env_for(tmp_path: Path, hub: FakeHub | None, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_HOME=str(tmp_path / "hf"), PYTHONWARNINGS="ignore", **extra)
    if hub is not None:
        env["HF_ENDPOINT"] = hub.endpoint
    return env


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


def test_quant_tag_picks_the_one_file_and_the_manifest_records_its_origin(files, tmp_path):
    with FakeHub({REPO: files}) as hub:
        env = env_for(tmp_path, hub)
        proc = run(env, "convert", "--weights-only", f"{REPO}:q4_k_m", tmp_path / "out")
        assert proc.returncode == 0, proc.stderr
        commit, endpoint = hub.commits[REPO], hub.endpoint
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    [source] = manifest["sources"]
    assert source["file"] == "Tiny-Q4_K_M.gguf"
    assert source["sha256"] == sha256(files["Tiny-Q4_K_M.gguf"])
    assert source["origin"] == {"hub": REPO, "revision": commit, "path": "Tiny-Q4_K_M.gguf",
                                "sha256": source["sha256"], "endpoint": endpoint}
    # the mtime of the cache's blob (when it was downloaded), not of the snapshot's link to it
    blob = tmp_path / "hf" / "hub" / f"models--{REPO.replace('/', '--')}" / "blobs" / source["sha256"]
    assert source["mtime_ns"] == blob.stat().st_mtime_ns
    # verify names where the directory came from, with no Hub at hand
    proc = run(env_for(tmp_path, None), "verify", tmp_path / "out")
    assert proc.returncode == 0 and f"from {REPO}@{commit[:12]}:Tiny-Q4_K_M.gguf" in proc.stdout


def test_a_split_set_is_fetched_whole_and_exports_to_the_published_shards(files, tmp_path):
    with FakeHub({REPO: files}) as hub:
        env = env_for(tmp_path, hub)
        proc = run(env, "convert", "--weights-only", f"hf.co/{REPO}:Q8_0", tmp_path / "out")
        assert proc.returncode == 0, proc.stderr
        fetched = {path for method, path, _ in hub.requests if method == "GET" and "/resolve/" in path}
    assert {p.rsplit("/", 1)[1] for p in fetched} == {k.split("/")[1] for k in files if k.startswith("Q8_0/")}
    (tmp_path / "back").mkdir()
    assert run(env, "export", tmp_path / "out", tmp_path / "back").returncode == 0
    for key, shard in files.items():
        if key.startswith("Q8_0/"):
            assert (tmp_path / "back" / shard.name).read_bytes() == shard.read_bytes()
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    origins = [s["origin"]["path"] for s in manifest["sources"]]
    assert origins == sorted(k for k in files if k.startswith("Q8_0/"))


def test_path_form_and_revision(files, tmp_path):
    tag = "ab" * 20
    with FakeHub({REPO: files}, revision_commits={"v1.0": tag}) as hub:
        env = env_for(tmp_path, hub)
        proc = run(env, "convert", "--weights-only", "--revision", "v1.0", f"{REPO}/Tiny-Q4_K_S.gguf",
                   tmp_path / "out")
        assert proc.returncode == 0, proc.stderr
        proc = run(env, "inspect", "--json", f"{REPO}/Tiny-Q4_K_S.gguf", "--revision", "v1.0")
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["origin"][0]["revision"] == tag
        line = one_error_line(run(env, "inspect", f"{REPO}:Q4_K_S", "--revision", "v9"))
        assert "no such revision" in line
    [source] = json.loads((tmp_path / "out" / "manifest.json").read_text())["sources"]
    assert source["origin"]["revision"] == tag and source["origin"]["path"] == "Tiny-Q4_K_S.gguf"


def test_a_wrong_or_ambiguous_tag_lists_what_the_repo_offers(files, tmp_path):
    with FakeHub({REPO: files}) as hub:
        env = env_for(tmp_path, hub)
        line = one_error_line(run(env, "convert", f"{REPO}:IQ2_XS", tmp_path / "out"))
        assert "no GGUF model" in line and "Tiny-Q4_K_M.gguf" in line and "(+2 shards)" in line
        line = one_error_line(run(env, "convert", f"{REPO}:Q4_K", tmp_path / "out"))  # Q4_K_M, Q4_K_S
        assert "no GGUF model" in line  # a tag matches whole: Q4_K is not Q4_K_M
        line = one_error_line(run(env, "inspect", f"{REPO}/Tiny-Q5_K.gguf"))  # a typo'd local path?
        assert "no such local file" in line and "Tiny-Q4_K_S.gguf" in line
        line = one_error_line(run(env, "inspect", f"{REPO}/Q8_0/Tiny-Q8_0-00002-of-00003.gguf"))
        assert "name its first shard, Q8_0/Tiny-Q8_0-00001-of-00003.gguf" in line
        both = {REPO: {**files, "Tiny-Q4_K_M-v2.gguf": files["Tiny-Q4_K_M.gguf"]}}
    with FakeHub(both) as hub:
        line = one_error_line(run(env_for(tmp_path, hub), "convert", f"{REPO}:Q4_K_M", tmp_path / "out"))
        assert "2 GGUF models" in line and "Tiny-Q4_K_M-v2.gguf" in line
        line = one_error_line(run(env_for(tmp_path, hub), "convert", "someone/no:Q4_K_M", tmp_path / "o"))
        assert "no such repo" in line
    assert not (tmp_path / "out").exists() and not (tmp_path / "o").exists()


def test_a_download_whose_sha256_is_not_the_published_one_is_refused_and_dropped(files, tmp_path):
    with FakeHub({REPO: files}, lie_sha256={(REPO, "Tiny-Q4_K_M.gguf")}) as hub:
        env = env_for(tmp_path, hub)
        line = one_error_line(run(env, "convert", f"{REPO}:Q4_K_M", tmp_path / "out"))
    assert f"the download has sha256 {sha256(files['Tiny-Q4_K_M.gguf'])}" in line
    assert "removed from the cache" in line
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))
    blobs = list((tmp_path / "hf" / "hub").glob("models--*/blobs/*"))
    assert blobs == [], blobs  # the next run downloads it again


def test_offline_mode_converts_from_a_warm_cache_and_says_what_is_missing(files, tmp_path):
    with FakeHub({REPO: files}) as hub:
        proc = run(env_for(tmp_path, hub), "inspect", f"{REPO}:Q4_K_M")  # warms the cache
        assert proc.returncode == 0, proc.stderr
        commit = hub.commits[REPO]
    offline = env_for(tmp_path, None, HF_HUB_OFFLINE="1", HF_ENDPOINT="http://127.0.0.1:9")
    proc = run(offline, "convert", "--weights-only", f"{REPO}:Q4_K_M", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    [source] = json.loads((tmp_path / "out" / "manifest.json").read_text())["sources"]
    assert source["origin"]["revision"] == commit and source["sha256"] == sha256(files["Tiny-Q4_K_M.gguf"])
    line = one_error_line(run(offline, "convert", f"{REPO}:Q4_K_S", tmp_path / "out2"))
    assert "no GGUF model" in line and "Tiny-Q4_K_M.gguf" in line  # the cache holds only that one
    line = one_error_line(run(offline, "convert", "other/repo:Q4_K_M", tmp_path / "out3"))
    assert "not in the local cache" in line
    # not offline, but no Hub answers (this port refuses): one line, not the HTTP client's traceback
    unreachable = env_for(tmp_path / "cold", None, HF_ENDPOINT="http://127.0.0.1:9")
    line = one_error_line(run(unreachable, "convert", f"{REPO}:Q4_K_M", tmp_path / "out4"))
    assert "the Hub could not be read" in line, line


def test_the_real_model_by_tag_with_a_dropped_download_resumed(smollm2, tmp_path):
    """The real SmolLM2 file (98 MB), its first download cut at 30 MB: the client resumes from
    what it wrote (a multiple of its 10 MiB blocks) with a Range request, and the file converts,
    checked against the published sha256, and verifies against the same reference."""
    name = "SmolLM2-135M-Instruct-Q4_1.gguf"
    repo = "bartowski/SmolLM2-135M-Instruct-GGUF"
    with FakeHub({repo: {name: smollm2, "README.md": b"# SmolLM2\n"}},
                 cut_after={(repo, name): 30_000_000}) as hub:
        env = env_for(tmp_path, hub)
        proc = run(env, "convert", "--weights-only", f"{repo}:Q4_1", tmp_path / "out")
        assert proc.returncode == 0, proc.stderr
        ranges = [r for method, path, r in hub.requests if method == "GET" and path.endswith(name)]
        proc = run(env, "verify", tmp_path / "out", "--against", f"{repo}:Q4_1")
        assert proc.returncode == 0 and f"identical to {repo}@" in proc.stdout, proc.stderr
    assert ranges[0] is None and ranges[1] == "bytes=20971520-", ranges
    [source] = json.loads((tmp_path / "out" / "manifest.json").read_text())["sources"]
    assert source["sha256"] == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
