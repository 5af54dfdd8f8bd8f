"""tests/fake_hub.py against the real huggingface_hub client: what it publishes and serves is what the
client takes from the Hub (metadata, bytes, cache layout, resumes, errors, offline use of the cache).

The client reads HF_ENDPOINT, HF_HOME and HF_HUB_OFFLINE once, at import: the in-process tests pass
`endpoint=` and `cache_dir=` themselves, the tests of the environment run the client in a subprocess."""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from fake_hub import FakeHub
from huggingface_hub import HfApi, hf_hub_download
from huggingface_hub.errors import (
    EntryNotFoundError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

REPO = "someone/tiny-GGUF"
GGUF = random.Random(0).randbytes(300_000)
README = b"# tiny\n\nA fake model card.\n"
TAG_SHA = "0123456789abcdef0123456789abcdef01234567"


def git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def download(hub: FakeHub, cache: Path, filename: str, repo_id: str = REPO, **kwargs) -> Path:
    path = hf_hub_download(repo_id, filename, endpoint=hub.endpoint, cache_dir=cache, token=False, **kwargs)
    return Path(path)


def gets(hub: FakeHub, filename: str) -> list[str | None]:
    """The Range header of each GET of a file."""
    url = f"/{REPO}/resolve/main/{filename}"
    return [rng for method, path, rng in hub.requests if (method, path) == ("GET", url)]


@pytest.fixture
def big(tmp_path) -> Path:
    """A 1.5 MB file on disk (not .gguf): an LFS file by its size, served from disk."""
    path = tmp_path / "weights.bin"
    path.write_bytes(random.Random(1).randbytes(1_500_000))
    return path


def test_model_info_and_tree_publish_the_hashes_and_sizes(big):
    repo = {"x.gguf": GGUF, "README.md": README, "sub/weights.bin": big}
    with FakeHub({REPO: repo}, revision_commits={"v1": TAG_SHA}) as hub:
        api = HfApi(endpoint=hub.endpoint, token=False)
        info = api.model_info(REPO, revision="main", files_metadata=True)
        assert info.id == REPO and len(info.sha) == 40
        files = {s.rfilename: s for s in info.siblings}
        assert set(files) == set(repo)
        assert files["x.gguf"].size == len(GGUF) and files["x.gguf"].lfs.size == len(GGUF)
        assert files["x.gguf"].lfs.sha256 == sha256(GGUF)
        assert files["sub/weights.bin"].lfs.sha256 == sha256(big.read_bytes())
        assert files["README.md"].lfs is None
        assert files["README.md"].size == len(README) and files["README.md"].blob_id == git_sha1(README)
        # without files_metadata, names only
        assert [s.size for s in api.model_info(REPO).siblings] == [None] * 3
        # a named revision resolves to its commit, and so does that commit
        assert api.model_info(REPO, revision="v1").sha == TAG_SHA
        assert api.model_info(REPO, revision=TAG_SHA).sha == TAG_SHA
        assert api.model_info(REPO, revision=info.sha).sha == info.sha

        assert sorted(api.list_repo_files(REPO)) == sorted(repo)
        tree = {e.path: e for e in api.list_repo_tree(REPO, recursive=True)}
        assert set(tree) == set(repo) | {"sub"}
        assert tree["x.gguf"].lfs.sha256 == sha256(GGUF) and tree["README.md"].lfs is None
        assert not hasattr(tree["sub"], "size")  # a RepoFolder
        assert {e.path for e in api.list_repo_tree(REPO)} == {"x.gguf", "README.md", "sub"}
        assert {e.path for e in api.list_repo_tree(REPO, "sub")} == {"sub/weights.bin"}


def test_download_gives_the_same_bytes_named_as_the_hub_names_them(tmp_path, big):
    cache = tmp_path / "hub"
    with FakeHub({REPO: {"x.gguf": GGUF, "README.md": README, "weights.bin": big}}) as hub:
        for name, data in [("x.gguf", GGUF), ("README.md", README), ("weights.bin", big.read_bytes())]:
            path = download(hub, cache, name, revision="main")
            assert path.read_bytes() == data
            # the blob is named by the ETag: sha256 for an LFS file, the git sha1 for a plain one
            assert path.resolve().name == (git_sha1(data) if name == "README.md" else sha256(data))
            assert path.parent.name == hub.commits[REPO]
        assert [(m, p) for m, p, _ in hub.requests][:2] == [("HEAD", f"/{REPO}/resolve/main/x.gguf"),
                                                          ("GET", f"/{REPO}/resolve/main/x.gguf")]
        assert all(rng is None for _, _, rng in hub.requests)
        # a second call finds the cache: one HEAD, no GET
        count = len(hub.requests)
        assert download(hub, cache, "x.gguf").read_bytes() == GGUF
        assert [m for m, _, _ in hub.requests[count:]] == ["HEAD"]


def test_range_requests(tmp_path):
    with FakeHub({REPO: {"x.gguf": GGUF}}) as hub:
        url = f"{hub.endpoint}/{REPO}/resolve/main/x.gguf"

        def get(rng):
            request = urllib.request.Request(url, headers={"Range": rng})
            with urllib.request.urlopen(request) as r:
                return r.status, r.headers, r.read()

        status, headers, body = get("bytes=1000-")
        assert (status, body) == (206, GGUF[1000:])
        assert headers["Content-Range"] == f"bytes 1000-{len(GGUF) - 1}/{len(GGUF)}"
        assert headers["ETag"] == headers["X-Linked-Etag"] == f'"{sha256(GGUF)}"'
        assert headers["X-Linked-Size"] == str(len(GGUF)) and headers["Accept-Ranges"] == "bytes"
        assert get("bytes=10-19")[2] == GGUF[10:20]
        assert get("bytes=-5")[2] == GGUF[-5:]
        with pytest.raises(urllib.error.HTTPError) as e:
            get(f"bytes={len(GGUF)}-")
        assert e.value.code == 416 and e.value.headers["Content-Range"] == f"bytes */{len(GGUF)}"


def test_a_lying_sha256_is_published_and_the_client_does_not_check_it(tmp_path):
    cache = tmp_path / "hub"
    with FakeHub({REPO: {"x.gguf": GGUF, "README.md": README}}, lie_sha256={(REPO, "x.gguf")}) as hub:
        api = HfApi(endpoint=hub.endpoint, token=False)
        published = {s.rfilename: s for s in api.model_info(REPO, files_metadata=True).siblings}
        lie = published["x.gguf"].lfs.sha256
        assert len(lie) == 64 and lie != sha256(GGUF)
        assert published["README.md"].blob_id == git_sha1(README)  # only the named file lies
        # hf_hub_download does not hash what it receives: it stores the true bytes under the lying name
        path = download(hub, cache, "x.gguf")
        assert path.read_bytes() == GGUF and path.resolve().name == lie
        # the client's own verify_repo_checksums (not run by hf_hub_download) does see it
        report = api.verify_repo_checksums(REPO, cache_dir=cache)
        mismatches = [(m["path"], m["expected"], m["actual"]) for m in report.mismatches]
        assert mismatches == [("x.gguf", lie, sha256(GGUF))]


def test_a_cut_download_is_retried_within_the_call_whole_below_10_mib(tmp_path):
    # the client hands the body to its file 10 MiB at a time (constants.DOWNLOAD_CHUNK_SIZE): a cut before
    # 10 MiB leaves it nothing written, so its retry (inside the same call, after 1 s) is a whole GET
    cache = tmp_path / "hub"
    with FakeHub({REPO: {"x.gguf": GGUF}}, cut_after={(REPO, "x.gguf"): 100_000}) as hub:
        assert download(hub, cache, "x.gguf").read_bytes() == GGUF
        assert gets(hub, "x.gguf") == [None, None]
    assert not list(cache.rglob("*.incomplete"))


def test_a_cut_download_resumes_with_a_range_within_the_call(tmp_path):
    mib = 1 << 20
    data = random.Random(2).randbytes(12 * mib)
    cache = tmp_path / "hub"
    with FakeHub({REPO: {"x.gguf": data}}, cut_after={(REPO, "x.gguf"): 11 * mib}) as hub:
        assert download(hub, cache, "x.gguf").read_bytes() == data
        # resumed from the 10 MiB it had written, not the 11 MiB it had received
        assert gets(hub, "x.gguf") == [None, f"bytes={10 * mib}-"]
        # and once whole, a new download (forced) is not cut again
        assert download(hub, cache, "x.gguf", force_download=True).read_bytes() == data
        assert gets(hub, "x.gguf")[2:] == [None]
    assert not list(cache.rglob("*.incomplete"))


def test_errors_are_the_hubs(tmp_path):
    cache = tmp_path / "hub"
    with FakeHub({REPO: {"x.gguf": GGUF}}) as hub:
        api = HfApi(endpoint=hub.endpoint, token=False)
        with pytest.raises(RepositoryNotFoundError):
            download(hub, cache, "x.gguf", repo_id="someone/nothing")
        with pytest.raises(RepositoryNotFoundError):
            api.model_info("someone/nothing", files_metadata=True)
        with pytest.raises(RevisionNotFoundError):
            download(hub, cache, "x.gguf", revision="v9")
        with pytest.raises(RevisionNotFoundError):
            api.model_info(REPO, revision="v9")
        with pytest.raises(RemoteEntryNotFoundError) as e:
            download(hub, cache, "y.gguf")
        assert isinstance(e.value, EntryNotFoundError)
        with pytest.raises(RemoteEntryNotFoundError):
            list(api.list_repo_tree(REPO, "nowhere"))
        # the client remembers, per commit, that the file does not exist (it needs X-Repo-Commit for that)
        assert (cache / "models--someone--tiny-GGUF" / ".no_exist" / hub.commits[REPO] / "y.gguf").exists()


OFFLINE_SCRIPT = """
import json, sys
from huggingface_hub import constants, hf_hub_download
from huggingface_hub.errors import LocalEntryNotFoundError, OfflineModeIsEnabled
out = {"offline": constants.HF_HUB_OFFLINE, "path": hf_hub_download(sys.argv[1], "x.gguf", revision="main")}
try:
    hf_hub_download(sys.argv[1], "README.md")
except LocalEntryNotFoundError as e:
    out["uncached"] = type(e.__cause__).__name__
print(json.dumps(out))
"""


def run_client(code: str, env: dict, *args: str) -> dict:
    result = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_a_cache_filled_through_hf_endpoint_serves_offline(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING", "TRANSFORMERS_"))}
    env["HF_HOME"] = str(tmp_path / "hf_home")
    with FakeHub({REPO: {"x.gguf": GGUF, "README.md": README}}) as hub:
        env["HF_ENDPOINT"] = hub.endpoint
        warm = run_client("import json, sys; from huggingface_hub import hf_hub_download;"
                          "print(json.dumps({'path': hf_hub_download(sys.argv[1], 'x.gguf')}))", env, REPO)
        assert ("GET", f"/{REPO}/resolve/main/x.gguf", None) in hub.requests
    assert Path(warm["path"]).is_relative_to(tmp_path / "hf_home" / "hub")
    # the server is gone; offline, the client answers from the cache alone
    offline = run_client(OFFLINE_SCRIPT, {**env, "HF_HUB_OFFLINE": "1"}, REPO)
    assert offline["offline"] is True
    assert offline["path"] == warm["path"] and Path(offline["path"]).read_bytes() == GGUF
    # a file it never fetched: not found, because offline mode stopped the request (not a refused connection)
    assert offline["uncached"] == "OfflineModeIsEnabled"
