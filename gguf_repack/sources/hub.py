"""Hub references: a GGUF model named as llama.cpp (`-hf owner/repo:Q4_K_M`), Ollama
(`hf.co/owner/repo:Q4_K_M`) and vLLM (`owner/repo:Q4_K_M`) name one, fetched through
`huggingface_hub` (its cache under HF_HOME, its token, offline mode, retries and progress bars).

Two forms, each with an optional revision (branch, tag or commit):

    owner/repo:QUANT            the one file, or split set, whose path carries the quant tag
    owner/repo/path/to/x.gguf   that file (every shard, when it is the first of a split set)

Every file is checked against the sha256 the Hub publishes for it (its LFS record) before it
is used: a damaged download is removed from the cache and reported, never converted. The
repo, the commit and the path travel on as the source's `origin`, recorded in the manifest.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from gguf_repack.converter.reader import SPLIT_NAME
from gguf_repack.errors import RepackError
from gguf_repack.format.manifest import sha256_file

_REPO = r"[A-Za-z0-9][\w.-]*/[\w.-]+"
HUB_REFERENCE = re.compile(rf"^(?:hf\.co/|huggingface\.co/|hf://)?(?P<repo>{_REPO})"
                           rf"(?::(?P<tag>[\w.-]+)|/(?P<path>[^:]+\.gguf))$", re.IGNORECASE)


class HubError(RepackError):
    """A Hub reference that cannot be resolved or fetched."""


def is_hub_reference(text: str) -> bool:
    """A source argument names a Hub file when it matches a Hub form and is not a local path
    (a local file or directory always wins)."""
    return bool(HUB_REFERENCE.match(str(text))) and not os.path.exists(text)


@dataclass
class HubModel:
    """A model resolved on the Hub and present in the local cache, checked."""

    repo: str
    commit: str
    paths: list[str]  # in the repo; shards in order
    local: list[Path]  # the cache's files (its snapshot paths, named as in the repo)
    sha256: list[str]  # published by the Hub, and what each local file hashes to
    endpoint: str

    @property
    def first(self) -> Path:
        return self.local[0]

    def origins(self) -> list[dict]:
        """Per source file, where it came from: what the manifest records."""
        return [{"hub": self.repo, "revision": self.commit, "path": path, "sha256": digest,
                 "endpoint": self.endpoint} for path, digest in zip(self.paths, self.sha256)]

    def describe(self) -> str:
        return f"{self.repo}@{self.commit[:12]}:{self.paths[0]}" + (
            f" (+{len(self.paths) - 1} shards)" if len(self.paths) > 1 else "")


def resolve(reference: str, revision: str | None = None, *, progress: bool = True) -> HubModel:
    """Find the model a Hub reference names, download what the cache lacks (every shard),
    and check each file's sha256 against the Hub's. Raises HubError with one line."""
    m = HUB_REFERENCE.match(reference)
    if not m:
        raise HubError(f"{reference}: not a Hub reference (owner/repo:QUANT or "
                       f"owner/repo/path/file.gguf) and not a local file")
    from huggingface_hub import constants
    from huggingface_hub.utils import disable_progress_bars

    if not progress:  # else the client's own choice (on, unless HF_HUB_DISABLE_PROGRESS_BARS)
        disable_progress_bars()
    repo = m["repo"]
    with _hub_errors(reference, revision):
        commit, files = _repo_files(repo, revision)
        paths = _select(reference, repo, files, tag=m["tag"], path=m["path"])
        local = [_download(repo, path, revision, commit) for path in paths]
    model = HubModel(repo, commit, paths, local, [files[p] for p in paths], constants.ENDPOINT)
    for path, file, published in zip(paths, local, model.sha256):
        _check(repo, path, file, published)
    return model


def _repo_files(repo: str, revision: str | None) -> tuple[str, dict[str, str | None]]:
    """(commit, {path: published sha256 or None}) of the repo's GGUF files at a revision. In
    offline mode, from the local cache: each cached file's blob is named by the sha256 the
    Hub sent when it was downloaded."""
    from huggingface_hub import HfApi, constants, snapshot_download

    if constants.HF_HUB_OFFLINE:
        snapshot = Path(snapshot_download(repo, revision=revision, local_files_only=True))
        files = {p.relative_to(snapshot).as_posix(): _blob_name(p) for p in snapshot.rglob("*")
                 if p.name.lower().endswith(".gguf")}
        return snapshot.name, files
    info = HfApi().model_info(repo, revision=revision, files_metadata=True)
    files = {s.rfilename: (s.lfs.sha256 if s.lfs else None) for s in info.siblings or []
             if s.rfilename.lower().endswith(".gguf")}
    return info.sha, files


def _blob_name(path: Path) -> str | None:
    name = Path(os.path.realpath(path)).name
    return name if re.fullmatch(r"[0-9a-f]{64}", name) else None


def _select(reference: str, repo: str, files: dict, *, tag: str | None, path: str | None) -> list[str]:
    """The repo paths of the model a reference names, shards in order."""
    models = _models(files)
    if path is not None:
        chosen = [shards for shards in models.values() if shards[0] == path]
        if not chosen:
            member = next((s for s in models.values() if path in s), None)
            if member:
                raise HubError(f"{reference}: {path} is a shard of a split set; name its first "
                               f"shard, {member[0]}")
            raise HubError(f"{reference}: no such local file, nor {path!r} in the Hub repo {repo}; "
                           f"it has: {_offer(models)}")
        return chosen[0]
    pattern = re.compile(rf"(?<![A-Za-z0-9]){re.escape(tag)}(?![A-Za-z0-9_])", re.IGNORECASE)
    chosen = [s for s in models.values()
              if pattern.search(s[0]) and not Path(s[0]).name.lower().startswith("mmproj")]
    if len(chosen) != 1:
        what = "no GGUF model" if not chosen else f"{len(chosen)} GGUF models"
        among = _offer(models) if not chosen else ", ".join(s[0] for s in chosen)
        raise HubError(f"{reference}: {what} in {repo} carries the quant tag {tag!r}; "
                       f"{'it has' if not chosen else 'name one'}: {among}")
    return chosen[0]


def _models(files: dict) -> dict[str, list[str]]:
    """{first path: every path of that model}: a split set's shards grouped, in order."""
    models: dict[str, list[str]] = {}
    sets: dict[tuple[str, int], dict[int, str]] = {}
    for path in sorted(files):
        m = SPLIT_NAME.match(path)  # the reader's rule for shard names; on the repo path
        if m:
            sets.setdefault((m["prefix"], int(m["count"])), {})[int(m["no"])] = path
        else:
            models[path] = [path]
    for (_, count), shards in sets.items():
        ordered = [shards.get(no) for no in range(1, count + 1)]
        if None in ordered:  # an incomplete set is offered shard by shard: its fault surfaces at use
            models.update({p: [p] for p in shards.values()})
        else:
            models[ordered[0]] = ordered
    return dict(sorted(models.items()))


def _offer(models: dict[str, list[str]]) -> str:
    if not models:
        return "no .gguf files"
    return ", ".join(f + (f" (+{len(s) - 1} shards)" if len(s) > 1 else "") for f, s in models.items())


def _download(repo: str, path: str, revision: str | None, commit: str) -> Path:
    """The file, by the revision's name (so the cache records the name, for offline use), which
    must still be the commit the listing came from."""
    from huggingface_hub import hf_hub_download

    local = Path(hf_hub_download(repo, path, revision=revision))
    snapshot = local.parents[len(Path(path).parts) - 1]
    if snapshot.name != commit:
        raise HubError(f"{repo}: the revision moved from {commit[:12]} to {snapshot.name[:12]} "
                       f"while downloading; run again")
    return local


def _check(repo: str, path: str, file: Path, published: str | None) -> None:
    if published is None:
        raise HubError(f"{repo}/{path}: the Hub publishes no sha256 for it (not an LFS file), "
                       f"so the download cannot be checked")
    digest = sha256_file(file)
    if digest != published:
        blob = Path(os.path.realpath(file))
        for p in {file, blob}:
            p.unlink(missing_ok=True)
        raise HubError(f"{repo}/{path}: the download has sha256 {digest}, the Hub publishes "
                       f"{published}: removed from the cache ({blob}); run again to download "
                       f"it again")


class _hub_errors:
    """huggingface_hub's exceptions as one line each, naming the reference."""

    def __init__(self, reference: str, revision: str | None):
        self.reference, self.revision = reference, revision

    def __enter__(self):
        return self

    def __exit__(self, kind, error, tb):
        if error is None or isinstance(error, (RepackError, KeyboardInterrupt)):
            return False
        from huggingface_hub import errors

        ref = self.reference + (f" (revision {self.revision})" if self.revision else "")
        if isinstance(error, errors.RevisionNotFoundError):
            message = f"{ref}: no such revision on the Hub"
        elif isinstance(error, errors.GatedRepoError):
            message = f"{ref}: a gated repo; accept its terms on the Hub and log in (hf auth login)"
        elif isinstance(error, errors.RepositoryNotFoundError):
            message = f"{ref}: no such repo on the Hub (or it is private: log in with hf auth login)"
        elif isinstance(error, (errors.OfflineModeIsEnabled, errors.LocalEntryNotFoundError)):
            message = (f"{ref}: not in the local cache, and the Hub cannot be asked "
                       f"(HF_HUB_OFFLINE is set or the Hub is unreachable)")
        elif isinstance(error, errors.EntryNotFoundError):
            message = f"{ref}: a file it lists is missing on the Hub ({_first_line(error)})"
        elif isinstance(error, Exception):
            # HTTP errors, and the HTTP client's own (connection refused, no DNS, timeouts),
            # whichever library huggingface_hub runs on (requests, httpx, httpx2)
            message = (f"{ref}: the Hub could not be read ({type(error).__name__}: "
                       f"{_first_line(error)})")
        else:
            return False
        if ":" not in self.reference:  # owner/repo/file.gguf may have been meant as a local path
            message = f"{ref}: no such local file; as a Hub reference:{message[len(ref) + 1:]}"
        raise HubError(message) from None


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]

