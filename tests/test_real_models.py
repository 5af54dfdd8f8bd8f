"""The two llama.cpp-made models: convert, verify --against, export byte for byte."""

import json
import random

import pytest

ENGINE_FILES = {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"}


@pytest.mark.parametrize("model", ["smollm2", "gemma"])
def test_real_model_round_trip(model, request, tmp_path, cli):
    src = request.getfixturevalue(model)
    out = tmp_path / "out"
    proc = cli("convert", src, out, check_exit=0)
    assert proc.stdout.startswith("converted ") and str(out) in proc.stdout
    proc = cli("verify", out, "--against", src, check_exit=0)
    assert "verify: ok" in proc.stdout
    back = tmp_path / "back.gguf"
    cli("export", out, back, check_exit=0)
    assert back.stat().st_size == src.stat().st_size
    with open(src, "rb") as a, open(back, "rb") as b:
        while chunk := a.read(1 << 24):
            assert chunk == b.read(1 << 24)

    manifest = json.loads((out / "manifest.json").read_text())
    # the weights alone (the tokenizer and config files for engines come on top)
    weights = sum(p.stat().st_size for p in out.iterdir() if p.suffix in (".safetensors", ".bin", ".json")
                  and p.name not in ENGINE_FILES)
    assert weights / src.stat().st_size <= 1.01
    types = {t["type"] for t in manifest["tensors"]}
    expected = {"smollm2": {"Q4_1", "Q8_0", "F32"},
                "gemma": {"Q4_K", "Q6_K", "Q5_0", "Q8_0", "F32"}}[model]
    assert types == expected
    # generation ends where llama.cpp ends it: the file's eos and the end-of-turn tokens it
    # finds by their text (Gemma 3's own generation_config.json says [1, 106] too)
    ends = json.loads((out / "generation_config.json").read_text())["eos_token_id"]
    tokens = json.loads((out / "tokenizer.json").read_text())["added_tokens"]
    by_id = {t["id"]: t["content"] for t in tokens}
    assert [by_id[i] for i in ends] == {"smollm2": ["<|im_end|>", "<|endoftext|>"],
                                        "gemma": ["<eos>", "<end_of_turn>"]}[model]


def test_verify_names_a_damaged_tensor(smollm2, tmp_path, cli):
    out = tmp_path / "out"
    cli("convert", smollm2, out, check_exit=0)
    manifest = json.loads((out / "manifest.json").read_text())
    victim = next(t for t in manifest["tensors"] if t["name"] == "blk.3.ffn_up.weight")
    shard = out / victim["shard"]
    header_len = int.from_bytes(shard.read_bytes()[:8], "little")
    header = json.loads(shard.read_bytes()[8 : 8 + header_len])
    begin, end = header[victim["name"] + ".qs"]["data_offsets"]
    pos = 8 + header_len + random.Random(0).randrange(begin, end)
    with open(shard, "r+b") as f:
        f.seek(pos)
        byte = f.read(1)
        f.seek(pos)
        f.write(bytes([byte[0] ^ 0x40]))
    proc = cli("verify", out, check_exit=1)
    assert "blk.3.ffn_up.weight" in proc.stdout
    assert proc.stdout.count("mismatch:") == 1
    assert "Traceback" not in proc.stderr
    # export refuses to write a file that would differ from the source
    proc = cli("export", out, tmp_path / "back.gguf")
    assert proc.returncode == 2 and proc.stderr.startswith("error: ")
    assert not (tmp_path / "back.gguf").exists()
