"""A stand-in for Hunyuan's tiktoken tokenizer (tokenization_hy.py in Tencent's repositories),
over SmolLM2's byte-level BPE (tokenizer.json beside it): what llama.cpp's converter reads of
one (HunYuanMoEModel.set_vocab: mergeable_ranks, special_tokens, vocab_size, encode). Copied
into a test checkpoint by tests/llama_cpp.py (hunyuan_tokenizer_dir); transformers loads it as
the checkpoint's remote code (tokenizer_config.json's auto_map)."""

import json
import os

from tokenizers import Tokenizer


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the character of each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


class HYTokenizer:
    @classmethod
    def register_for_auto_class(cls, auto_class="AutoTokenizer"):
        pass  # (transformers' remote-code loading asks; nothing to register here)

    @classmethod
    def from_pretrained(cls, path, *args, **kwargs):
        return cls(path)

    def __init__(self, path):
        self._tokenizer = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
        with open(os.path.join(path, "tokenizer.json"), encoding="utf-8") as f:
            data = json.load(f)
        with open(os.path.join(path, "tokenizer_config.json"), encoding="utf-8") as f:
            self.vocab_size = json.load(f)["vocab_size"]
        self.special_tokens = {t["content"]: t["id"] for t in data["added_tokens"]}
        decoder = _byte_decoder()
        vocab = data["model"]["vocab"]
        self.mergeable_ranks = {bytes(decoder[c] for c in token): rank for token, rank in vocab.items()
                                if token not in self.special_tokens}

    def encode(self, text, **kwargs):
        return self._tokenizer.encode(text).ids
