"""A stand-in for the Hugging Face Hub, on loopback, for tests that run the real `huggingface_hub` client.

Why: code that downloads from the Hub is only tested honestly by the client it will really run with
(its cache layout, its checks, its retries, its exceptions). The tests point that client at this server,
through `endpoint=` (in-process: `huggingface_hub` reads HF_ENDPOINT / HF_HUB_OFFLINE / HF_HOME once, at
import) or HF_ENDPOINT (subprocesses), and nothing leaves the machine. The server answers the routes the
installed client (huggingface_hub 2.4) uses, the way the Hub answers them:

    GET        /api/models/{owner}/{name}[/revision/{rev}][?blobs=true]
               model_info (files_metadata=True sends blobs=true: sizes, blobId, lfs)
    GET        /api/models/{owner}/{name}/tree/{rev}[/{path}][?recursive=true]
               list_repo_tree, list_repo_files (and so verify_repo_checksums)
    HEAD, GET  /{owner}/{name}/resolve/{rev}/{path}
               hf_hub_download (HEAD for the metadata, then GET; with Range when it resumes)

A resolve answer carries X-Repo-Commit, ETag, Content-Length and Accept-Ranges: bytes; an LFS file's
also X-Linked-Etag and X-Linked-Size, and its ETag is the file's sha256 (the client names the cached blob
after it). No X-Xet-* header is ever sent, so the client downloads over plain HTTP. A Range request
(bytes=N-, bytes=N-M, bytes=-N) is answered 206 with Content-Range; one past the end, 416. Errors are the
Hub's: 404 with X-Error-Code RepoNotFound, RevisionNotFound or EntryNotFound (and X-Error-Message, and a
JSON body {"error": ...}), which the client turns into RepositoryNotFoundError, RevisionNotFoundError and
RemoteEntryNotFoundError.

Which files are LFS files: those whose name ends .gguf, and any file over 1 MB. Their model_info entry has
lfs {sha256, size, pointerSize} and blobId is the git sha1 of their LFS pointer; any other file is a plain
git file, its blobId and ETag the git blob sha1 of its bytes. File bodies stream from disk (bytes sources
are served from memory). Hashes are computed when first asked for, once.

Faults a test can ask for:
  lie_sha256  the published hash of these (repo_id, path) is that of other bytes: lfs.sha256, ETag and
              X-Linked-Etag of an LFS file (and its pointer's blobId); blobId and ETag of a plain file.
  cut_after   (repo_id, path) -> N: the first GET of that file without a Range header sends the full
              Content-Length but only N bytes of body, then closes the connection; later GETs are whole.
              huggingface_hub 2.4 retries inside the same hf_hub_download call (after 1 s), from what it
              had written: a multiple of 10 MiB (it writes the body 10 MiB at a time), so a cut under
              10 MiB is fetched again whole and a cut at 55 MB resumes with Range: bytes=52428800-.
              Across calls nothing resumes: its partial file is per-process and deleted on failure.

Revisions: "main" (and the commit's own sha) names a fixed 40-hex commit per repo; revision_commits adds
names (in every repo) that resolve to the given shas, and those shas resolve too. Every revision serves
the same files.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import re
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

LFS_THRESHOLD = 1_000_000  # bytes; a bigger file is an LFS file whatever its name
_CHUNK = 1 << 20
_RANGE = re.compile(r"bytes=(\d*)-(\d*)")
_DATE = "2026-01-01T00:00:00.000Z"


class _File:
    """One file of a repo: its source, and its hashes once computed."""

    def __init__(self, source: pathlib.Path | bytes, lie: bool):
        self.source = source
        self.size = len(source) if isinstance(source, bytes) else pathlib.Path(source).stat().st_size
        self.lie = lie
        self._meta: dict | None = None

    def chunks(self, start: int, length: int):
        if isinstance(self.source, bytes):
            view = memoryview(self.source)
            for at in range(start, start + length, _CHUNK):
                yield view[at:min(at + _CHUNK, start + length)]
            return
        with open(self.source, "rb") as f:
            f.seek(start)
            while length > 0:
                block = f.read(min(_CHUNK, length))
                if not block:
                    raise OSError(f"{self.source} is shorter than when the hub started")
                length -= len(block)
                yield block

    def hashes(self) -> tuple[str, str]:
        """(sha256, git blob sha1) of the true bytes."""
        sha256 = hashlib.sha256()
        sha1 = hashlib.sha1(b"blob %d\0" % self.size)
        for block in self.chunks(0, self.size):
            sha256.update(block)
            sha1.update(block)
        return sha256.hexdigest(), sha1.hexdigest()

    def meta(self, path: str) -> dict:
        """What the hub publishes: size, lfs, sha256 (LFS only), blob_id, etag."""
        if self._meta is None:
            sha256, sha1 = self.hashes()
            lfs = path.endswith(".gguf") or self.size > LFS_THRESHOLD
            if self.lie:
                sha256 = hashlib.sha256(b"fake-hub lie " + sha256.encode()).hexdigest()
                sha1 = hashlib.sha1(b"fake-hub lie " + sha1.encode()).hexdigest()
            meta = {"size": self.size, "lfs": lfs}
            if lfs:
                pointer = (f"version https://git-lfs.github.com/spec/v1\n"
                           f"oid sha256:{sha256}\nsize {self.size}\n").encode()
                meta.update(sha256=sha256, pointer_size=len(pointer), etag=sha256,
                            blob_id=hashlib.sha1(b"blob %d\0" % len(pointer) + pointer).hexdigest())
            else:
                meta.update(sha256=None, pointer_size=None, etag=sha1, blob_id=sha1)
            self._meta = meta
        return self._meta


class _HubError(Exception):
    def __init__(self, code: str | None, message: str, commit: str | None = None):
        super().__init__(message)
        self.code, self.message, self.commit = code, message, commit


class FakeHub:
    """The Hub stand-in. `with FakeHub({...}) as hub:` serves on `hub.endpoint` until the block ends."""

    def __init__(self, repos: dict[str, dict[str, pathlib.Path | bytes]], *,
                 revision_commits: dict[str, str] | None = None,
                 lie_sha256: set[tuple[str, str]] = frozenset(),
                 cut_after: dict[tuple[str, str], int] | None = None):
        self.revision_commits = dict(revision_commits or {})
        self.cut_after = dict(cut_after or {})
        self.repos = {repo_id: {path: _File(source, (repo_id, path) in lie_sha256)
                                for path, source in files.items()}
                      for repo_id, files in repos.items()}
        self.commits = {repo_id: hashlib.sha1(f"fake-hub commit {repo_id}".encode()).hexdigest()
                        for repo_id in repos}
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path as sent, Range header)
        self._cut_done: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        if self._server is None:
            raise RuntimeError("FakeHub is not started")
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FakeHub:
        if self._server is not None:
            raise RuntimeError("FakeHub already started")
        hub = self

        class Handler(_Handler):
            pass

        Handler.hub = hub
        self._server = _Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="fake-hub", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
        self._server = self._thread = None

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- what the routes look up ---------------------------------------------------------------------

    def _commit(self, repo_id: str, revision: str) -> str:
        if repo_id not in self.repos:
            raise _HubError("RepoNotFound", "Repository not found")
        if revision in self.revision_commits:
            return self.revision_commits[revision]
        if revision == "main" or revision == self.commits[repo_id]:
            return self.commits[repo_id]
        if revision in self.revision_commits.values():
            return revision
        raise _HubError("RevisionNotFound", f"Invalid rev id: {revision}")

    def _meta(self, repo_id: str, path: str) -> dict:
        file = self.repos[repo_id][path]
        with self._lock:
            return file.meta(path)

    def _info(self, repo_id: str, revision: str, blobs: bool) -> dict:
        commit = self._commit(repo_id, revision)
        siblings = []
        for path in sorted(self.repos[repo_id]):
            sibling: dict = {"rfilename": path}
            if blobs:
                meta = self._meta(repo_id, path)
                sibling.update(size=meta["size"], blobId=meta["blob_id"])
                if meta["lfs"]:
                    sibling["lfs"] = {"sha256": meta["sha256"], "size": meta["size"],
                                      "pointerSize": meta["pointer_size"]}
            siblings.append(sibling)
        return {"_id": commit[:24], "id": repo_id, "modelId": repo_id, "author": repo_id.split("/")[0],
                "sha": commit, "lastModified": _DATE, "createdAt": _DATE, "private": False, "disabled": False,
                "gated": False, "downloads": 0, "likes": 0, "tags": [], "siblings": siblings}

    def _tree(self, repo_id: str, revision: str, folder: str, recursive: bool) -> list[dict]:
        commit = self._commit(repo_id, revision)
        folder = folder.strip("/")
        prefix = folder + "/" if folder else ""
        paths = sorted(p for p in self.repos[repo_id] if p.startswith(prefix))
        if folder and not paths:
            raise _HubError("EntryNotFound", f"{folder} does not exist on \"{revision}\"", commit)
        entries, folders = [], set()
        for path in paths:
            parts = path[len(prefix):].split("/")
            for depth in range(1, len(parts) if recursive else min(len(parts), 2)):
                folders.add(prefix + "/".join(parts[:depth]))
            if recursive or len(parts) == 1:
                meta = self._meta(repo_id, path)
                entry = {"type": "file", "oid": meta["blob_id"], "size": meta["size"], "path": path}
                if meta["lfs"]:
                    entry["lfs"] = {"oid": meta["sha256"], "size": meta["size"],
                                    "pointerSize": meta["pointer_size"]}
                entries.append(entry)
        for name in sorted(folders):
            oid = hashlib.sha1(f"fake-hub tree {commit} {name}".encode()).hexdigest()
            entries.append({"type": "directory", "oid": oid, "size": 0, "path": name})
        return sorted(entries, key=lambda e: e["path"])

    def _take_cut(self, repo_id: str, path: str) -> int | None:
        """N if this GET is the one to cut after N bytes (the first whole GET of a cut_after file)."""
        key = (repo_id, path)
        with self._lock:
            if key not in self.cut_after or key in self._cut_done:
                return None
            self._cut_done.add(key)
            return self.cut_after[key]


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client that hung up is no error of ours
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "FakeHub/1"
    hub: FakeHub

    def log_message(self, format, *args):  # quiet
        pass

    def do_GET(self):
        self._answer(body=True)

    def do_HEAD(self):
        self._answer(body=False)

    def _answer(self, body: bool):
        hub = self.hub
        hub.requests.append((self.command, self.path, self.headers.get("Range")))
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        parts = url.path.lstrip("/").split("/")
        try:
            if parts[:2] == ["api", "models"] and len(parts) >= 4:
                repo_id, rest = "/".join(parts[2:4]), parts[4:]
                if not rest:
                    return self._json(hub._info(repo_id, "main", _true(query.get("blobs"))), body)
                if rest[0] == "revision" and len(rest) == 2:
                    return self._json(hub._info(repo_id, unquote(rest[1]), _true(query.get("blobs"))), body)
                if rest[0] == "tree" and len(rest) >= 2:
                    return self._json(hub._tree(repo_id, unquote(rest[1]), unquote("/".join(rest[2:])),
                                                _true(query.get("recursive"))), body)
            elif len(parts) >= 5 and parts[2] == "resolve":
                repo_id, revision, path = "/".join(parts[:2]), unquote(parts[3]), unquote("/".join(parts[4:]))
                return self._resolve(repo_id, revision, path, body)
            raise _HubError(None, f"Cannot {self.command} {url.path}")
        except _HubError as e:
            self._error(e, body)

    def _resolve(self, repo_id: str, revision: str, path: str, body: bool):
        hub = self.hub
        commit = hub._commit(repo_id, revision)
        if path not in hub.repos[repo_id]:
            raise _HubError("EntryNotFound", f"{path} does not exist on \"{revision}\"", commit)
        file = hub.repos[repo_id][path]
        meta = hub._meta(repo_id, path)
        headers = {"X-Repo-Commit": commit, "ETag": f'"{meta["etag"]}"', "Accept-Ranges": "bytes",
                   "Content-Type": "application/octet-stream"}
        if meta["lfs"]:
            headers.update({"X-Linked-Etag": f'"{meta["etag"]}"', "X-Linked-Size": str(meta["size"])})
        size, start, length, status = file.size, 0, file.size, 200
        wanted = self.headers.get("Range")
        match = _RANGE.fullmatch(wanted.strip()) if wanted else None
        if match and match.group(1) + match.group(2):  # a single range; anything else is ignored: 200 whole
            first, last = match.groups()
            if first:
                start, end = int(first), min(int(last), size - 1) if last else size - 1
            else:
                start, end = max(size - int(last), 0), size - 1
            if start >= size or start > end:
                headers["Content-Range"] = f"bytes */{size}"
                return self._send(416, headers, b"", body)
            status, length = 206, end - start + 1
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        cut = hub._take_cut(repo_id, path) if body and wanted is None else None
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(length))
        if cut is not None:
            self.send_header("Connection", "close")
        self.end_headers()
        if not body:
            return
        try:
            sent = 0
            for block in file.chunks(start, length if cut is None else min(cut, length)):
                self.wfile.write(block)
                sent += len(block)
            self.wfile.flush()
        except ConnectionError:
            self.close_connection = True
            return
        if cut is not None:  # drop the connection short of Content-Length: the client sees a cut download
            self.close_connection = True

    def _json(self, data, body: bool):
        self._send(200, {"Content-Type": "application/json; charset=utf-8"}, json.dumps(data).encode(), body)

    def _error(self, e: _HubError, body: bool):
        headers = {"Content-Type": "application/json; charset=utf-8", "X-Error-Message": e.message}
        if e.code:
            headers["X-Error-Code"] = e.code
        if e.commit:
            headers["X-Repo-Commit"] = e.commit
        self._send(404, headers, json.dumps({"error": e.message}).encode(), body)

    def _send(self, status: int, headers: dict, payload: bytes, body: bool):
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if body:
            try:
                self.wfile.write(payload)
            except ConnectionError:
                self.close_connection = True


def _true(value: str | None) -> bool:
    return value is not None and value.lower() in ("1", "true")
