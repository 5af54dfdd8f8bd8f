"""manifest.json: the authority on what an output directory holds.

Written last by `convert`: a directory without a complete manifest is not an output.
It records the source files (name, size, mtime, sha256, verbatim header, non-zero gaps, where
the file came from when it was downloaded), and for every tensor its GGUF name, type, ggml
dims, torch shape, layout, planes (safetensors key, dtype, shape, file), its byte range in the
source and a checksum of those bytes.

Versions:
1. Each tensor checksummed with sha256, which at 1.3-1.8 GB/s on the project's machines was
   half of convert's time.
2. Each tensor checksummed with xxh3-128 (8 GB/s). A tensor's checksum finds damage; the source
   file's sha256, kept in every version, is the file's identity (the Hub publishes it) and
   what `export` proves.
3. Each source record also has `mtime_ns`, the source file's modification time (st_mtime_ns,
   taken as convert maps the file, before it hashes it), so that an archive's rerun decides
   a model unchanged by its files' size and mtime, as make and rsync do, instead of hashing
   every file again.
Every version reads and verifies; readers refuse a format or version they do not know.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xxhash

from gguf_repack.errors import FormatError

FORMAT = "gguf-repack"
# The rp1 layout's version, which engines check in config.json's quantization_config.
FORMAT_VERSION = 1
# The manifest's version (its "format_version" key), and the ones this package reads.
MANIFEST_VERSION = 3
READS_MANIFEST_VERSIONS = (1, 2, 3)
# Per-tensor checksum, by the key it has in a tensor record's "source": what each version writes.
TENSOR_CHECKSUMS: dict[str, Callable[[], Any]] = {"xxh3_128": xxhash.xxh3_128,
                                                  "sha256": hashlib.sha256}
TENSOR_CHECKSUM = "xxh3_128"
# config.json's `quantization_config` (written by engine_files, read by every engine
# integration): the method engines look up, and the version of this format
QUANT_METHOD = "gguf_repack"


def quantization_config() -> dict:
    return {"quant_method": QUANT_METHOD, "format_version": FORMAT_VERSION}


def check_quantization_config(q: dict) -> None:
    """A config.json's quantization_config is ours and of the version this package reads."""
    if q.get("quant_method") != QUANT_METHOD:
        raise FormatError(f"config.json: quant_method is {q.get('quant_method')!r}, "
                          f"not {QUANT_METHOD!r}")
    if q.get("format_version") != FORMAT_VERSION:
        raise FormatError(f"gguf_repack: config.json has format_version "
                          f"{q.get('format_version')!r}; this gguf-repack reads {FORMAT_VERSION} "
                          f"(convert the model again, or upgrade gguf-repack)")
MANIFEST = "manifest.json"
INDEX = "model.safetensors.index.json"


def shard_name(i: int, count: int) -> str:
    return f"model-{i:05d}-of-{count:05d}.safetensors"


def header_name(i: int) -> str:
    return f"gguf-header-{i + 1:05d}.bin"


def gaps_name(i: int) -> str:
    return f"gguf-gaps-{i + 1:05d}.bin"


# A directory holding one of these is a gguf-repack output, or was meant to be one (the shard
# and index names are Hugging Face's, which other model directories use too)
OUTPUT_MARKER = re.compile(r"^(manifest\.json|gguf-header-\d{5}\.bin)$")


def looks_like_output(directory: Path) -> bool:
    return directory.is_dir() and any(OUTPUT_MARKER.match(p.name) for p in directory.iterdir())


@dataclass
class PlaneRecord:
    field: str
    key: str
    dtype: str  # safetensors dtype
    shape: list[int]


@dataclass
class TensorRecord:
    name: str
    type: str
    type_id: int
    ggml_dims: list[int]
    shape: list[int]
    layout: str  # "rp1" for quantized tensors, "plain" for float/int tensors
    shard: str
    planes: list[PlaneRecord]
    source: dict[str, Any]  # file (index), offset (absolute), nbytes, xxh3_128 (v1: sha256)

    @classmethod
    def from_json(cls, d: dict) -> "TensorRecord":
        return cls(**{**d, "planes": [PlaneRecord(**p) for p in d["planes"]]})

    def to_json(self) -> dict:
        d = dict(self.__dict__)
        d["planes"] = [p.__dict__ for p in self.planes]
        return d

    def checksum(self) -> tuple[str, str]:
        """(algorithm, hex digest) of the tensor's source bytes, as its manifest recorded it."""
        for algorithm in TENSOR_CHECKSUMS:
            if isinstance(self.source.get(algorithm), str):
                return algorithm, self.source[algorithm]
        raise FormatError(f"manifest.json: tensor {self.name!r} has no checksum "
                          f"({' or '.join(TENSOR_CHECKSUMS)})")


def sha256_file(path, cancel: threading.Event | None = None) -> str:
    h = hashlib.sha256()
    buf = bytearray(16 << 20)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while (n := f.readinto(buf)) and not (cancel and cancel.is_set()):
            h.update(view[:n])  # releases the GIL
    return h.hexdigest()


def write_manifest(directory: Path, manifest: dict) -> None:
    tmp = directory / (MANIFEST + ".partial")
    with open(tmp, "w") as f:
        f.write(_dumps(manifest))
    os.replace(tmp, directory / MANIFEST)


def _dumps(manifest: dict) -> str:
    """The manifest as JSON, one line per list item (tensor, source, shard): readable and
    diffable, and made by json's C encoder (`indent=` takes its pure-Python one, 80 ms for
    Gemma 3's 236 tensors)."""
    lines = []
    for key, value in manifest.items():
        if isinstance(value, list) and value:
            items = ",\n  ".join(json.dumps(v) for v in value)
            lines.append(f" {json.dumps(key)}: [\n  {items}\n ]")
        else:
            lines.append(f" {json.dumps(key)}: {json.dumps(value)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def read_manifest(directory: str | os.PathLike) -> dict:
    """The manifest of an output directory, with its format and version checked."""
    directory = Path(directory)
    path = directory / MANIFEST
    if not directory.is_dir():
        what = "no such directory" if not directory.exists() else "not a directory"
        raise FormatError(f"{directory}: {what} (expected a gguf-repack output directory)")
    if not path.is_file():
        raise FormatError(f"{directory}: no {MANIFEST}: not a complete gguf-repack output "
                          f"(an interrupted convert leaves none)")
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FormatError(f"{path}: unreadable ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise FormatError(f"{path}: not a {FORMAT} manifest")
    version = manifest.get("format_version")
    if version not in READS_MANIFEST_VERSIONS:
        raise FormatError(f"{path}: format version {version!r} is not supported by this "
                          f"gguf-repack (it reads versions "
                          f"{', '.join(map(str, READS_MANIFEST_VERSIONS))})")
    for key in ("sources", "tensors", "shards"):
        if not isinstance(manifest.get(key), list):
            raise FormatError(f"{path}: missing or malformed {key!r}")
    return manifest


def is_output_dir(directory: Path) -> bool:
    try:
        read_manifest(directory)
        return True
    except FormatError:
        return False
