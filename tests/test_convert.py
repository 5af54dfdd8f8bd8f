"""convert -> verify -> export on GGUF files that gguf's GGUFWriter writes."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import xxhash
from ggml_blocks import every_type_tensors, write_gguf
from safetensors import safe_open
from test_layout import reference_planes

from gguf_repack import convert, export, verify
from gguf_repack.converter import writer
from gguf_repack.errors import FormatError, OutputError
from gguf_repack.format.type_table import TYPES


@pytest.fixture
def every_type_file(tmp_path, rng):
    return write_gguf(tmp_path / "every-type.gguf", every_type_tensors(rng))


def test_every_type_round_trips_byte_for_byte(every_type_file, tmp_path):
    out = tmp_path / "out"
    summary = convert(every_type_file, out)
    assert summary.n_tensors == len(gguf.GGUFReader(every_type_file).tensors)
    report = verify(out, against=every_type_file)
    assert report.ok, report.mismatches
    back = tmp_path / "back.gguf"
    export(out, back)
    assert back.read_bytes() == every_type_file.read_bytes()


def test_planes_in_safetensors_are_the_fields_of_the_source_blocks(every_type_file, tmp_path):
    out = tmp_path / "out"
    convert(every_type_file, out)
    manifest = json.loads((out / "manifest.json").read_text())
    index = json.loads((out / "model.safetensors.index.json").read_text())
    reader = gguf.GGUFReader(every_type_file)  # the reference for the source bytes
    by_name = {t["name"]: t for t in manifest["tensors"]}
    for t in reader.tensors:
        record = by_name[t.name]
        qtype = TYPES[int(t.tensor_type)]
        raw = np.asarray(t.data).view(np.uint8).reshape(-1)
        with safe_open(out / record["shard"], framework="pt") as st:
            if not qtype.is_quantized:
                (plane,) = record["planes"]
                got = st.get_tensor(plane["key"])
                assert list(got.shape) == [int(x) for x in reversed(t.shape)]
                assert got.contiguous().view(-1).view(torch.uint8).numpy().tobytes() == raw.tobytes()
                continue
            *lead, k = record["shape"]
            n = lead[-1] if lead else 1
            blocks = raw.reshape(*lead[:-1], n, k // qtype.block_size, qtype.type_size)
            ref = reference_planes(blocks, qtype)
            for plane in record["planes"]:
                assert index["weight_map"][plane["key"]] == record["shard"]
                got = st.get_tensor(plane["key"]).numpy()
                assert got.dtype == ref[plane["field"]].dtype
                assert got.shape == ref[plane["field"]].shape == tuple(plane["shape"])
                assert got.tobytes() == ref[plane["field"]].tobytes()
        assert record["layout"] == ("rp1" if qtype.is_quantized else "plain")
        assert record["ggml_dims"] == [int(x) for x in t.shape]
        assert record["source"]["offset"] == t.data_offset
        assert record["source"]["nbytes"] == t.n_bytes


def test_small_max_shard_size_writes_several_shards(every_type_file, tmp_path):
    out = tmp_path / "out"
    convert(every_type_file, out, max_shard_size=2000)
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(manifest["shards"]) > 3
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == set(manifest["shards"])
    for shard in manifest["shards"]:
        with safe_open(out / shard, framework="pt") as st:
            assert len(list(st.keys())) > 0
    export(out, tmp_path / "back.gguf")
    assert (tmp_path / "back.gguf").read_bytes() == every_type_file.read_bytes()


def test_converter_does_not_import_torch(every_type_file, tmp_path):
    code = ("import sys, gguf_repack; gguf_repack.convert(sys.argv[1], sys.argv[2]); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code, str(every_type_file), str(tmp_path / "o")],
                   check=True)
    assert (tmp_path / "o" / "manifest.json").is_file()


def test_force_replaces_a_previous_output_and_leaves_no_temporaries(every_type_file, tmp_path):
    out = tmp_path / "out"
    convert(every_type_file, out)
    with pytest.raises(OutputError, match="already exists"):
        convert(every_type_file, out)
    (out / "marker").write_text("old")
    convert(every_type_file, out, force=True)
    assert not (out / "marker").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["every-type.gguf", "out"]


def test_non_zero_padding_and_trailing_bytes_survive(tmp_path, rng):
    src = write_gguf(tmp_path / "m.gguf", every_type_tensors(rng))
    reader = gguf.GGUFReader(src)
    data = bytearray(src.read_bytes())
    spans = sorted((t.data_offset, t.data_offset + t.n_bytes) for t in reader.tensors)
    gaps = [(a_end, b_start) for (_, a_end), (b_start, _) in zip(spans, spans[1:]) if b_start > a_end]
    assert gaps, "the test file needs alignment padding between tensors"
    for start, end in gaps:
        data[start:end] = bytes(range(1, end - start + 1))
    data += b"trailing bytes that belong to no tensor"
    src.write_bytes(bytes(data))
    out = tmp_path / "out"
    convert(src, out)
    assert verify(out, against=src).ok
    export(out, tmp_path / "back.gguf")
    assert (tmp_path / "back.gguf").read_bytes() == bytes(data)


def test_a_file_without_tensors_round_trips(tmp_path):
    src = write_gguf(tmp_path / "kv-only.gguf", {})
    out = tmp_path / "out"
    assert convert(src, out).n_tensors == 0
    export(out, tmp_path / "back.gguf")
    assert (tmp_path / "back.gguf").read_bytes() == src.read_bytes()


def write_split_set(directory, rng, n_shards=3):
    tensors = every_type_tensors(rng)
    write_gguf(directory / "model.gguf", tensors, split_max_tensors=-(-len(tensors) // n_shards))
    shards = sorted(directory.glob("model-*-of-*.gguf"))
    assert len(shards) == n_shards
    return shards


def test_split_set_converts_and_exports_to_identical_shards(tmp_path, rng):
    src_dir = tmp_path / "src"
    src_dir.mkdir()
    shards = write_split_set(src_dir, rng)
    for i, shard in enumerate(shards):  # each part's own mtime goes into its record
        os.utime(shard, ns=(1_700_000_000_000_000_000 + i, 1_600_000_000_123_456_789 + i))
    out = tmp_path / "out"
    convert(shards[0], out)
    assert verify(out, against=shards[0]).ok
    manifest = json.loads((out / "manifest.json").read_text())
    assert [s["file"] for s in manifest["sources"]] == [s.name for s in shards]
    assert [s["mtime_ns"] for s in manifest["sources"]] == [1_600_000_000_123_456_789 + i
                                                            for i in range(len(shards))]
    # to a directory: the original names
    back_dir = tmp_path / "back"
    back_dir.mkdir()
    written = export(out, back_dir)
    assert [p.name for p in written] == [s.name for s in shards]
    for s in shards:
        assert (back_dir / s.name).read_bytes() == s.read_bytes()
    # to a first-shard name: the same numbering under a new prefix
    written = export(out, tmp_path / "copy-00001-of-00003.gguf")
    for s, w in zip(shards, written):
        assert w.name == s.name.replace("model", "copy")
        assert w.read_bytes() == s.read_bytes()
    with pytest.raises(OutputError, match="split into 3 shards"):
        export(out, tmp_path / "single.gguf")


# An output written by manifest version 1 (per-tensor sha256), by gguf-repack at 8aba079 from
# the GGUF file beside it: it must keep reading, verifying and exporting.
V1 = Path(__file__).parent / "data" / "manifest-v1"


def test_the_manifest_checksums_each_tensor_with_xxh3_and_records_the_sources_mtime(
        every_type_file, tmp_path):
    out = tmp_path / "out"
    convert(every_type_file, out)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["format_version"] == 3
    assert manifest["sources"][0]["mtime_ns"] == os.stat(every_type_file).st_mtime_ns
    data = every_type_file.read_bytes()
    for record in manifest["tensors"]:
        src = record["source"]
        assert "sha256" not in src
        tensor = data[src["offset"] : src["offset"] + src["nbytes"]]
        assert src["xxh3_128"] == xxhash.xxh3_128(tensor).hexdigest()
    assert manifest["sources"][0]["sha256"] == hashlib.sha256(data).hexdigest()


def test_a_source_that_changes_size_after_its_header_was_read_leaves_nothing(
        every_type_file, tmp_path, monkeypatch):
    """The manifest's size (from the header scan) and mtime (from the map) are of one file."""
    def open_then_append(src):
        gset = open_gguf(src)
        with open(src, "ab") as f:  # another process still writing it
            f.write(bytes(32))
        return gset

    open_gguf = writer.open_gguf
    monkeypatch.setattr(writer, "open_gguf", open_then_append)
    with pytest.raises(FormatError, match="changed while it was being converted"):
        convert(every_type_file, tmp_path / "out")
    assert list(tmp_path.iterdir()) == [every_type_file]


def test_a_version_1_output_still_verifies_exports_and_loads(tmp_path):
    v1 = json.loads((V1 / "every-type-rp1" / "manifest.json").read_text())
    assert v1["format_version"] == 1 and all("sha256" in t["source"] for t in v1["tensors"])
    report = verify(V1 / "every-type-rp1", against=V1 / "every-type.gguf")
    assert report.ok and report.checked == len(v1["tensors"]) + 1, report.mismatches
    export(V1 / "every-type-rp1", tmp_path / "back.gguf")
    assert (tmp_path / "back.gguf").read_bytes() == (V1 / "every-type.gguf").read_bytes()
    from gguf_repack import load

    reader = gguf.GGUFReader(V1 / "every-type.gguf")
    model = load(V1 / "every-type-rp1")
    t = next(t for t in reader.tensors if t.name == "blk.0.q4_k.weight")
    assert torch.equal(model[t.name].dequantize(torch.float32),
                       torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type)))


def test_a_damaged_plane_of_a_version_1_output_is_found_by_its_sha256(tmp_path):
    out = tmp_path / "v1"
    shutil.copytree(V1 / "every-type-rp1", out)
    shard = out / "model-00001-of-00001.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0x10  # the last byte: a plane of the last tensor
    shard.write_bytes(bytes(data))
    report = verify(out)
    assert len(report.mismatches) == 1 and "checksum mismatch" in report.mismatches[0]
