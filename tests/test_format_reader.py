"""FORMAT.md's reference reader (examples/read_rp1.py, which imports nothing of gguf-repack or
gguf) held to the package: for every GGML type its rebuilt bytes are the source file's; its
float32 is gguf-py's and the torch backend's, bit for bit; FORMAT.md's type table and the
reader's are the code's; manifests validate against gguf_repack/format/manifest.schema.json."""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import gguf
import gguf.quants
import jsonschema
import numpy as np
import pytest
import torch
from ggml_blocks import all_types, every_type_tensors, write_gguf
from gguf.constants import GGMLQuantizationType as Q

import gguf_repack.format
from gguf_repack import convert, load
from gguf_repack.format.manifest import MANIFEST_VERSION, READS_MANIFEST_VERSIONS
from gguf_repack.format.safetensors_io import st_dtype
from gguf_repack.format.type_table import TYPES
from gguf_repack.sources.hub import HubModel

ROOT = Path(__file__).resolve().parents[1]
READER = ROOT / "examples" / "read_rp1.py"
SCHEMA = json.loads((Path(gguf_repack.format.__file__).parent / "manifest.schema.json").read_text())
V1 = Path(__file__).parent / "data" / "manifest-v1"
LEGACY_AND_K = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
FLOATS = ["F32", "F16", "BF16"]


def import_reader():
    spec = importlib.util.spec_from_file_location("read_rp1", READER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


reader = import_reader()


def read(capsys, out: Path, name: str, *args) -> tuple[int, str, str]:
    """The reader's main() in this process: (exit status, stdout, stderr)."""
    capsys.readouterr()
    status = reader.main([str(out), name, *map(str, args)])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def validate(manifest: dict) -> None:
    jsonschema.Draft202012Validator(SCHEMA).validate(manifest)


def source_bytes(src: Path, record: dict) -> bytes:
    with open(src, "rb") as f:
        f.seek(record["source"]["offset"])
        return f.read(record["source"]["nbytes"])


def assert_same_bits(got: np.ndarray, expected: np.ndarray) -> None:
    """float32 equal bit for bit, NaN where the reference has NaN (raw random scales)."""
    assert got.dtype == np.float32 and got.shape == expected.shape, (got.shape, expected.shape)
    expected = expected.astype(np.float32)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    ok = ~np.isnan(expected)
    assert (got[ok].view(np.uint32) == expected[ok].view(np.uint32)).all()


@pytest.fixture(scope="module")
def every_type(tmp_path_factory) -> tuple[Path, Path]:
    """A GGUF file written by gguf's GGUFWriter with every type (2-D, and 3-D and 1-D for a
    few), plus raw random blocks (NaN, inf and subnormal scales) of the types the reader
    dequantizes, converted: (source, output directory)."""
    rng = np.random.default_rng(33)
    tensors = every_type_tensors(rng)
    for name in LEGACY_AND_K:
        type_size = gguf.GGML_QUANT_SIZES[Q[name]][1]
        tensors[f"raw.{name.lower()}"] = (Q[name], rng.integers(0, 256, (8, 2 * type_size), dtype=np.uint8))
    directory = tmp_path_factory.mktemp("every-type")
    src = write_gguf(directory / "every-type.gguf", tensors)
    convert(src, directory / "out", weights_only=True)
    return src, directory / "out"


@pytest.mark.parametrize("blocked, schema", [
    (("gguf_repack", "gguf", "torch"), "schema checked"),
    (("gguf_repack", "gguf", "torch", "jsonschema"), "schema not checked: no jsonschema")])
def test_the_reader_imports_neither_gguf_repack_nor_gguf_nor_torch(blocked, schema, every_type, tmp_path):
    """Run as a user runs it, with those packages made unimportable (and jsonschema, optional)."""
    _, out = every_type
    blocker = ("import runpy, sys\n"
               "class Block:\n"
               "    def find_spec(self, name, path=None, target=None):\n"
               f"        if name.split('.')[0] in {blocked!r}:\n"
               "            raise ImportError('the reader must not import ' + name)\n"
               "sys.meta_path.insert(0, Block())\n"
               "sys.argv = sys.argv[1:]\n"
               "runpy.run_path(sys.argv[0], run_name='__main__')\n")
    proc = subprocess.run([sys.executable, "-c", blocker, str(READER), str(out), "blk.0.q4_k.weight",
                           "--blocks", tmp_path / "b.bin", "--npy", tmp_path / "w.npy"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("blk.0.q4_k.weight: Q4_K [3, 512] from model-00001-of-00001")
    assert "xxh3_128 checked" in proc.stdout and f"{schema})" in proc.stdout
    assert (tmp_path / "b.bin").is_file() and np.load(tmp_path / "w.npy").shape == (3, 512)


def test_the_reader_dequantizes_the_floats_the_legacy_types_and_the_k_quants():
    assert sorted(reader.FLOAT32) == sorted(FLOATS + LEGACY_AND_K)


@pytest.mark.parametrize("qtype", all_types(), ids=lambda q: q.name)
def test_every_type_rebuilds_the_source_bytes_and_dequantizes_as_gguf_py(qtype, every_type, tmp_path,
                                                                         capsys):
    src, out = every_type
    records = [t for t in json.loads((out / "manifest.json").read_text())["tensors"]
               if t["type"] == qtype.name]
    assert records, qtype.name
    by_name = {t.name: t for t in gguf.GGUFReader(src).tensors}
    model = load(out)
    blocks, npy = tmp_path / "blocks.bin", tmp_path / "w.npy"
    for record in records:
        blocks.unlink(missing_ok=True)
        status, stdout, stderr = read(capsys, out, record["name"], "--blocks", blocks, "--npy", npy)
        assert blocks.read_bytes() == source_bytes(src, record), record["name"]
        if qtype.name not in FLOATS + LEGACY_AND_K:
            assert status == 2 and stdout == ""
            assert stderr.startswith("error: --npy: this reader dequantizes F32 F16 BF16 Q4_0")
            assert stderr.count("\n") == 1 and f"not {qtype.name} " in stderr
            continue
        assert status == 0, stderr
        with np.errstate(all="ignore"):  # the raw random blocks' NaN and inf scales
            expected = gguf.quants.dequantize(by_name[record["name"]].data, qtype)
        got = np.load(npy)
        assert list(got.shape) == record["shape"]
        assert_same_bits(got, expected)
        weights = model[record["name"]]  # a plain tensor as it is (float16, bfloat16: exact in float32)
        if record["layout"] == "rp1":
            weights = weights.dequantize(torch.float32, backend="torch")
        assert_same_bits(got, weights.float().numpy())


def test_a_split_source_in_several_shards_reads_from_each_file(tmp_path, capsys, rng):
    src_dir = tmp_path / "src"
    src_dir.mkdir()
    tensors = every_type_tensors(rng)
    write_gguf(src_dir / "model.gguf", tensors, split_max_tensors=-(-len(tensors) // 3))
    parts = sorted(src_dir.glob("model-*-of-*.gguf"))
    out = tmp_path / "out"
    convert(parts[0], out, weights_only=True, max_shard_size=4000)
    manifest = json.loads((out / "manifest.json").read_text())
    validate(manifest)
    assert len(manifest["sources"]) == 3 and len(manifest["shards"]) > 3
    assert {t["source"]["file"] for t in manifest["tensors"]} == {0, 1, 2}
    for record in manifest["tensors"]:
        # the schema is checked above; here it would check the same manifest once per tensor
        status, _, stderr = read(capsys, out, record["name"], "--blocks", tmp_path / "b.bin",
                                 "--schema", tmp_path / "no-schema.json")
        assert status == 0, stderr
        assert (tmp_path / "b.bin").read_bytes() == \
            source_bytes(parts[record["source"]["file"]], record), record["name"]


def test_a_version_1_output_reads_with_its_sha256_checksums(tmp_path, capsys):
    out, src = V1 / "every-type-rp1", V1 / "every-type.gguf"
    manifest = json.loads((out / "manifest.json").read_text())
    validate(manifest)
    for name in ("blk.0.q4_k.weight", "blk.1.ffn_up_exps.q8_0", "blk.0.bf16.weight"):
        record = next(t for t in manifest["tensors"] if t["name"] == name)
        status, stdout, stderr = read(capsys, out, name, "--blocks", tmp_path / "b.bin")
        assert status == 0 and "sha256 checked (manifest version 1" in stdout, stderr
        assert (tmp_path / "b.bin").read_bytes() == source_bytes(src, record)


# -- the tables: FORMAT.md's and the reader's, against the code's ----------------------------


def type_table_rows() -> list[str]:
    """FORMAT.md's section 4.4, rendered from gguf_repack/format/type_table.py."""
    rows = ["| type | id | weights/block | bytes/block | planes, in block order |",
            "| --- | --- | --- | --- | --- |"]
    for t in sorted(TYPES.values(), key=lambda t: t.id):
        if not t.is_quantized:
            rows.append(f"| {t.name} | {t.id} | 1 | {t.type_size} | plain: one plane `data`, "
                        f"{t.plain_dtype} |")
            continue
        planes = "; ".join(f"`{f.name}` [{f.offset}, {f.offset + f.size}) {st_dtype(f.plane_dtype)} "
                           f"× {f.count}" for f in t.fields)
        rows.append(f"| {t.name} | {t.id} | {t.block_size} | {t.type_size} | {planes} |")
    return rows


def test_format_md_type_table_is_the_type_table():
    text = (ROOT / "FORMAT.md").read_text()
    generated = text.split("<!-- generated: type table -->\n")[1].split("<!-- end generated -->")[0]
    assert generated.splitlines() == type_table_rows()


def test_the_readers_type_table_is_the_type_table():
    plain = {t.name: (t.id, t.plain_dtype, t.type_size) for t in TYPES.values() if not t.is_quantized}
    assert reader.PLAIN == plain
    quantized = {t.name: t for t in TYPES.values() if t.is_quantized}
    assert reader.QUANTIZED.keys() == quantized.keys()
    for name, t in quantized.items():
        assert reader.QUANTIZED[name][:2] == (t.id, t.block_size), name
        assert reader.fields(name) == [(f.name, f.size, st_dtype(f.plane_dtype)) for f in t.fields], name


# -- the schema ------------------------------------------------------------------------------


def test_the_schema_and_the_reader_know_every_manifest_version_the_package_reads():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    assert MANIFEST_VERSION in READS_MANIFEST_VERSIONS
    assert set(SCHEMA["properties"]["format_version"]["enum"]) == set(READS_MANIFEST_VERSIONS)
    assert set(reader.CHECKSUM_BY_MANIFEST_VERSION) == set(READS_MANIFEST_VERSIONS)


def as_version_2(manifest: dict) -> dict:
    """Today's manifest as version 2 wrote it: no mtime_ns."""
    assert manifest["format_version"] == 3
    older = copy.deepcopy(manifest)
    older["format_version"] = 2
    for source in older["sources"]:
        del source["mtime_ns"]
    return older


def test_manifests_of_every_version_validate_and_each_version_keeps_its_own_keys(every_type):
    manifest = json.loads((every_type[1] / "manifest.json").read_text())
    validate(manifest)
    assert all(isinstance(s["mtime_ns"], int) for s in manifest["sources"])
    validate(as_version_2(manifest))
    validate(json.loads((V1 / "every-type-rp1" / "manifest.json").read_text()))

    def refused(m: dict, what: str) -> None:
        with pytest.raises(jsonschema.ValidationError):
            validate(m)
            pytest.fail(f"the schema accepts {what}")

    without_mtime = as_version_2(manifest)
    without_mtime["format_version"] = 3
    refused(without_mtime, "version 3 requires mtime_ns")
    with_mtime = copy.deepcopy(manifest)
    with_mtime["format_version"] = 2
    refused(with_mtime, "version 2 has no mtime_ns")
    as_v1 = as_version_2(manifest)
    as_v1["format_version"] = 1
    refused(as_v1, "version 1 checksums with sha256")
    for key in ("format", "tensors"):
        damaged = copy.deepcopy(manifest)
        damaged.pop(key)
        refused(damaged, f"no {key}")
    extra = copy.deepcopy(manifest)
    extra["tensors"][0]["planes"][0]["note"] = "a key no version defines"
    refused(extra, "an unknown key")
    outside = copy.deepcopy(manifest)
    outside["tensors"][0]["shard"] = "../model-00001-of-00001.safetensors"
    refused(outside, "a shard outside the directory")


def test_a_hub_origin_validates():
    origin = HubModel("owner/repo", "0" * 40, ["q4/m.gguf"], [Path("m.gguf")], ["a" * 64],
                      "https://huggingface.co").origins()[0]
    manifest = json.loads((V1 / "every-type-rp1" / "manifest.json").read_text())
    manifest["sources"][0]["origin"] = origin
    validate(manifest)


# -- bad input: one `error:` line, exit 2 --------------------------------------------------


def flip_a_plane_byte(out: Path) -> None:
    manifest = json.loads((out / "manifest.json").read_text())
    record = next(t for t in manifest["tensors"] if t["name"] == "blk.0.q4_k.weight")
    shard = out / record["shard"]
    data = bytearray(shard.read_bytes())
    header_len = int.from_bytes(data[:8], "little")
    entry = json.loads(data[8 : 8 + header_len])[record["planes"][-1]["key"]]
    data[8 + header_len + entry["data_offsets"][0] + 5] ^= 0x10
    shard.write_bytes(bytes(data))


def edit_manifest(change):
    def edit(out: Path) -> None:
        manifest = json.loads((out / "manifest.json").read_text())
        change(manifest, next(t for t in manifest["tensors"] if t["name"] == "blk.0.q4_k.weight"))
        (out / "manifest.json").write_text(json.dumps(manifest))
    return edit


def truncate_shard(out: Path) -> None:
    with open(out / "model-00001-of-00001.safetensors", "r+b") as f:
        f.truncate(os.fstat(f.fileno()).st_size - 1)


BAD = {
    "a damaged plane": (flip_a_plane_byte, "the planes are damaged"),
    "an unknown manifest version": (edit_manifest(lambda m, t: m.update(format_version=99)),
                                    "manifest version 99 is unknown to this reader"),
    "not our manifest": (edit_manifest(lambda m, t: m.update(format="safetensors")),
                         "not a gguf-repack manifest"),
    "no manifest": (lambda out: (out / "manifest.json").unlink(), "not a complete gguf-repack output"),
    "a type id that is not its type's": (edit_manifest(lambda m, t: t.update(type_id=13)),
                                         "Q4_K is type id 12"),
    "a layout it does not know": (edit_manifest(lambda m, t: t.update(layout="rp2")),
                                  "does not follow the schema"),
    "a plane of another shape": (edit_manifest(lambda m, t: t["planes"][0].update(shape=[1, 3, 1])),
                                 "are not Q4_K's"),
    "a truncated shard": (truncate_shard, "the data ends at byte"),
    "a config.json of another layout version": (
        lambda out: (out / "config.json").write_text(json.dumps(
            {"quantization_config": {"quant_method": "gguf_repack", "format_version": 2}})),
        "is not gguf_repack's layout version 1"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_input_is_one_error_line_and_exit_2(case, every_type, tmp_path, capsys):
    damage, message = BAD[case]
    out = tmp_path / "out"
    shutil.copytree(every_type[1], out)
    damage(out)
    status, stdout, stderr = read(capsys, out, "blk.0.q4_k.weight", "--blocks", tmp_path / "b.bin")
    assert (status, stdout) == (2, "") and stderr.startswith("error: ") and stderr.count("\n") == 1
    assert message in stderr, stderr
    assert not (tmp_path / "b.bin").exists()


def test_without_the_schema_the_reader_still_refuses_a_shard_outside_the_directory(every_type, tmp_path,
                                                                                   capsys):
    out = tmp_path / "out"
    shutil.copytree(every_type[1], out)
    edit_manifest(lambda m, t: t.update(shard="../model-00001-of-00001.safetensors"))(out)
    status, _, stderr = read(capsys, out, "blk.0.q4_k.weight", "--schema", tmp_path / "none.json")
    assert status == 2 and "is not a listed file" in stderr, stderr


def test_a_damaged_output_from_the_command_line(every_type, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(every_type[1], out)
    flip_a_plane_byte(out)
    proc = subprocess.run([sys.executable, READER, out, "blk.0.q4_k.weight", "--npy", tmp_path / "w.npy"],
                          capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr.startswith("error: tensor 'blk.0.q4_k.weight': xxh3_128 ")
    assert proc.stderr.count("\n") == 1 and not (tmp_path / "w.npy").exists()


# -- a real model (slow: the smollm2 fixture) -----------------------------------------------


def test_a_real_model(smollm2, tmp_path):
    out = tmp_path / "out"
    convert(smollm2, out, weights_only=True)
    manifest = json.loads((out / "manifest.json").read_text())
    validate(manifest)
    by_name = {t.name: t for t in gguf.GGUFReader(smollm2).tensors}
    for name in ("blk.0.ffn_down.weight", "blk.0.attn_norm.weight"):  # Q4_1, F32
        record = next(t for t in manifest["tensors"] if t["name"] == name)
        proc = subprocess.run([sys.executable, READER, out, name, "--blocks", tmp_path / "b.bin",
                               "--npy", tmp_path / "w.npy"], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        assert (tmp_path / "b.bin").read_bytes() == source_bytes(smollm2, record)
        t = by_name[name]
        assert_same_bits(np.load(tmp_path / "w.npy"), gguf.quants.dequantize(t.data, t.tensor_type))
