import json

from ggml_blocks import every_type_tensors, write_gguf


def test_inspect_gguf_and_output_dir(tmp_path, rng, cli):
    src = write_gguf(tmp_path / "m.gguf", every_type_tensors(rng))
    text = cli("inspect", src, check_exit=0).stdout
    assert "general.architecture = llama" in text
    assert "blk.0.q4_k.weight" in text and "Q4_K" in text
    info = json.loads(cli("inspect", src, "--json", check_exit=0).stdout)
    q4k = next(t for t in info["tensors"] if t["name"] == "blk.0.q4_k.weight")
    assert q4k == {"name": "blk.0.q4_k.weight", "type": "Q4_K", "shape": [3, 512],
                   "bits_per_weight": 4.5, "bytes": 3 * 2 * 144}
    assert info["metadata"]["test.str"] == "héllo wörld"

    out = tmp_path / "out"
    cli("convert", src, out, check_exit=0)
    out_info = json.loads(cli("inspect", out, "--json", check_exit=0).stdout)
    assert out_info["kind"] == "gguf-repack output"
    assert [t["name"] for t in out_info["tensors"]] == [t["name"] for t in info["tensors"]]
    assert out_info["tensor_bytes"] == info["tensor_bytes"]
    assert "gguf-repack v3" in cli("inspect", out, check_exit=0).stdout


def test_convert_prints_a_summary_and_what_it_skipped(tmp_path, rng, cli):
    src = write_gguf(tmp_path / "m.gguf", every_type_tensors(rng))
    proc = cli("convert", src, tmp_path / "out", "--max-shard-size", "10KB", check_exit=0)
    line, skipped = proc.stdout.strip().splitlines()
    assert skipped == "skipped config.json and tokenizer: the GGUF file holds no tokenizer"
    assert line.startswith(f"converted {len(every_type_tensors(rng))} tensors")
    assert "MB ->" in line and " s -> " in line
    shards = json.loads((tmp_path / "out" / "manifest.json").read_text())["shards"]
    assert len(shards) > 1


def test_bad_shard_size_is_a_usage_error(tmp_path, rng, cli):
    src = write_gguf(tmp_path / "m.gguf", every_type_tensors(rng))
    proc = cli("convert", src, tmp_path / "out", "--max-shard-size", "lots")
    assert proc.returncode == 2 and "not a size" in proc.stderr
    assert not (tmp_path / "out").exists()
    for args in (["convert", src], ["no-such-command"], ["verify"]):
        proc = cli(*args)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr


def test_version_and_help(cli):
    assert "gguf-repack" in cli("--version", check_exit=0).stdout
    text = cli("--help", check_exit=0).stdout
    for command in ("convert", "inspect", "verify", "export"):
        assert command in text


def test_demo_runs_the_whole_path_and_reuses_its_output(tmp_path, smollm2, cli):
    out = tmp_path / "demo-out"
    proc = cli("demo", "--out", out, "--max-new-tokens", "4", check_exit=0)
    lines = proc.stdout.splitlines()
    assert [line.split()[0] for line in lines[:5]] == ["fetched", "converted", "verified", "loaded",
                                                        "generated"]
    assert "generated 4 tokens greedily" in proc.stdout and "LlamaForCausalLM" in proc.stdout
    assert lines[-2] == "> Write one sentence about the ocean." and lines[-1].strip()
    assert (out / "config.json").is_file()
    again = cli("demo", "--out", out, "--max-new-tokens", "4", check_exit=0)
    assert "already holds this model" in again.stdout
    assert again.stdout.splitlines()[-1] == lines[-1]  # greedy: the same completion


def test_demo_refuses_a_directory_it_did_not_make(tmp_path, smollm2, cli):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    proc = cli("demo", "--out", tmp_path / "mine")
    assert proc.returncode == 2 and proc.stderr.startswith("error: ")
    assert "not a gguf-repack output" in proc.stderr
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"
