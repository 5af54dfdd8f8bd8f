"""inspect: what a GGUF model or an output directory holds, as plain data (the CLI renders it)."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

from gguf_repack.format.output_dir import OutputDir
from gguf_repack.format.type_table import TYPES_BY_NAME
from gguf_repack.integrations.architectures import describe_support

from .reader import StringArray, open_gguf, read_gguf_header

_SUMMARY_KEYS = ("general.architecture", "general.name", "general.file_type",
                 "general.quantization_version", "general.alignment")


def describe(path: str | os.PathLike) -> dict:
    """A summary of a GGUF file (or split set) or of a gguf-repack output directory."""
    path = Path(path)
    if path.is_dir():
        return _describe_output(path)
    return _describe_gguf(path)


def _describe_gguf(path: Path) -> dict:
    gset = open_gguf(path)
    first = gset.first
    metadata = {}
    for key, kv in first.kvs.items():
        v = kv.value
        if isinstance(v, StringArray) or hasattr(v, "__len__") and not isinstance(v, str):
            metadata[key] = f"[{kv.item_type.name} x {len(v)}]"
        else:
            metadata[key] = v
    tensors = [_row(t.name, t.type.name, t.shape, t.nbytes) for _, t in gset.tensors]
    arch = first.get("general.architecture")
    return {
        "kind": "gguf",
        "engines": describe_support(arch, first.get(f"{arch}.expert_count") or 0),
        "path": str(path),
        "files": [{"file": str(f.path), "size": f.size, "version": f.version,
                   "tensors": len(f.tensors), "kvs": len(f.kvs)} for f in gset.files],
        "summary": {k: first.get(k) for k in _SUMMARY_KEYS if k in first.kvs},
        "metadata": metadata,
        "types": dict(Counter(t["type"] for t in tensors).most_common()),
        "tensor_bytes": sum(t["bytes"] for t in tensors),
        "tensors": tensors,
    }


def _describe_output(path: Path) -> dict:
    output = OutputDir(path)
    manifest = output.manifest
    tensors = [_row(t.name, t.type, t.shape, t.source["nbytes"], t.layout) for t in output.tensors]
    source = manifest["sources"][0]  # the first source's key/values, from its stored header
    header = path / source["header"]["file"]
    kvs = read_gguf_header(header.read_bytes(), header, source["size"]).kvs
    arch = kvs["general.architecture"].value if "general.architecture" in kvs else None
    experts = kvs[f"{arch}.expert_count"].value if f"{arch}.expert_count" in kvs else 0
    return {
        "kind": "gguf-repack output",
        "engines": describe_support(arch, experts),
        "path": str(path),
        "format": f"{manifest['format']} v{manifest['format_version']}",
        "created_by": manifest.get("created_by"),
        "files": [{"file": s["file"], "size": s["size"], "sha256": s["sha256"],
                   "tensors": s["n_tensors"]} for s in manifest["sources"]],
        "origin": [s["origin"] for s in manifest["sources"] if s.get("origin")] or None,
        "shards": manifest["shards"],
        "output_bytes": sum(f.stat().st_size for f in path.iterdir() if f.is_file()),
        "types": dict(Counter(t["type"] for t in tensors).most_common()),
        "tensor_bytes": sum(t["bytes"] for t in tensors),
        "tensors": tensors,
    }


def _row(name: str, type_name: str, shape, nbytes: int, layout: str | None = None) -> dict:
    qtype = TYPES_BY_NAME.get(type_name)
    row = {"name": name, "type": type_name, "shape": list(shape),
           "bits_per_weight": round(qtype.bits_per_weight, 4) if qtype else None,
           "bytes": nbytes}
    if layout is not None:
        row["layout"] = layout
    return row
