"""The CI recipe (examples/ci/github-actions.yml, the GitLab snippet of docs/ci.md, the pre-commit
hook) run as a pipeline would run it: the workflow's own `run:` lines, the hook through
pre-commit itself."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml
from junitparser import JUnitXml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / "examples" / "ci" / "github-actions.yml"
BIN = str(Path(sys.executable).parent)  # where `gguf-repack` and `pre-commit` are installed


def recipe_steps() -> dict[str, str]:
    steps = yaml.safe_load(WORKFLOW.read_text())["jobs"]["repack"]["steps"]
    return {s["id"]: s["run"] for s in steps if s.get("id") in ("convert", "verify")}


def test_the_workflow_commands_on_the_real_model(smollm2, tmp_path):
    """MODEL is the local file here (CI has no Hub); the commands are the workflow's."""
    env = {**os.environ, **yaml.safe_load(WORKFLOW.read_text())["env"], "MODEL": str(smollm2),
           "PATH": f"{BIN}:{os.environ['PATH']}", "PYTHONWARNINGS": "ignore"}
    steps = recipe_steps()
    assert list(steps) == ["convert", "verify"]
    for name, script in steps.items():
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, (name, proc.stdout, proc.stderr)
    for name in ("convert", "verify"):
        xml = JUnitXml.fromfile(str(tmp_path / "reports" / f"{name}.xml"))
        assert xml.tests >= 272 and xml.failures == 0 and xml.errors == 0, (name, xml.tests)
    assert (tmp_path / "repacked" / "smollm2" / "config.json").is_file()


def test_the_docs_gitlab_snippet_is_the_workflow_recipe():
    page = (ROOT / "docs" / "ci.md").read_text()
    snippet = re.search(r"```yaml\n(# \.gitlab-ci\.yml.*?)```", page, re.S)
    assert snippet, "docs/ci.md has no GitLab snippet"
    job = yaml.safe_load(snippet[1])["repack"]
    commands = [line for step in recipe_steps().values() for line in step.strip().splitlines()]
    assert job["script"][-len(commands):] == commands
    assert "reports/*.xml" in str(job["artifacts"]["reports"]["junit"])


def test_the_pre_commit_hook_verifies_the_outputs_a_commit_changes(tmp_path):
    """pre-commit try-repo with this checkout's hook definition, in a repository that keeps an
    output: passes as converted, fails naming the tensor once a plane is damaged."""
    import numpy as np
    from ggml_blocks import every_type_tensors, write_gguf

    from gguf_repack import convert

    repo = tmp_path / "models"
    repo.mkdir()
    src = write_gguf(tmp_path / "m.gguf", every_type_tensors(np.random.default_rng(0)), kvs=[])
    convert(src, repo / "m-rp1", weights_only=True)
    (repo / "README.md").write_text("models\n")
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "PRE_COMMIT_HOME": str(tmp_path / "pc"),
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "PYTHONWARNINGS": "ignore"}

    def git(*args):
        subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True)

    def hook() -> subprocess.CompletedProcess:
        git("add", "-A")
        return subprocess.run(["pre-commit", "try-repo", str(ROOT), "gguf-repack-verify"], cwd=repo,
                              env=env, capture_output=True, text=True, timeout=600)

    git("init", "-q")
    proc = hook()
    assert proc.returncode == 0 and re.search(r"gguf-repack verify\.+Passed", proc.stdout), proc.stdout
    shard = repo / "m-rp1" / "model-00001-of-00001.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0x01
    shard.write_bytes(bytes(data))
    proc = hook()
    assert proc.returncode == 1 and re.search(r"gguf-repack verify\.+Failed", proc.stdout), proc.stdout
    assert re.search(r"mismatch: blk\.\S+: checksum mismatch", proc.stdout), proc.stdout
    shutil.rmtree(tmp_path / "pc", ignore_errors=True)
