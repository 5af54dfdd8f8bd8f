"""Bad input: one line `error: ...` naming the file, exit code 2, no traceback, and nothing
left behind (no output, no temporary directory).

Damaged files are made from a good one written by gguf's GGUFWriter; the byte offsets of the
fields to damage come from gguf's GGUFReader, not from the code under test."""

import struct

import gguf
import numpy as np
import pytest
from ggml_blocks import tensor_bytes, write_gguf
from gguf.constants import GGMLQuantizationType as Q


@pytest.fixture
def good(tmp_path):
    rng = np.random.default_rng(7)
    kvs = [("general.alignment", 32, gguf.GGUFValueType.UINT32, None),
           ("test.name", "model", gguf.GGUFValueType.STRING, None),
           ("test.list", [1, 2, 3], gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.INT32),
           ("test.words", ["x", "yy"], gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING)]
    tensors = {"a.weight": (Q.Q4_0, tensor_bytes(Q.Q4_0, (4, 64), rng)),
               "b.weight": (Q.F32, tensor_bytes(Q.F32, (4, 8), rng)),
               "c.weight": (Q.Q8_0, tensor_bytes(Q.Q8_0, (2, 32), rng))}
    return write_gguf(tmp_path / "good.gguf", tensors, kvs=kvs)


def _offset(reader, part) -> int:
    return part.__array_interface__["data"][0] - reader.data.__array_interface__["data"][0]


def _kv_parts(reader, key):
    return reader.fields[key].parts


def _tensor_parts(reader, i):
    # name_len, name, n_dims, dims, type, offset
    return reader.tensors[i].field.parts


def damage(path, how):
    """Apply one named damage to the file at `path` (in place)."""
    reader = gguf.GGUFReader(path)
    data = bytearray(path.read_bytes())

    def put(part, fmt, value, index=0):
        pos = _offset(reader, part) + index * struct.calcsize(fmt)
        struct.pack_into(fmt, data, pos, value)

    header_end = _offset(reader, _tensor_parts(reader, 2)[5]) + 8
    kv_parts = _kv_parts(reader, "test.list")
    match how:
        case "wrong magic": data[0:4] = b"GGML"
        case "version 1": struct.pack_into("<I", data, 4, 1)
        case "version 4": struct.pack_into("<I", data, 4, 4)
        case "big-endian": struct.pack_into(">I", data, 4, 3)
        case "empty": data = bytearray()
        case "truncated in magic": data = data[:3]
        case "truncated in counts": data = data[:12]
        case "truncated in key/values": data = data[: _offset(reader, kv_parts[0]) + 3]
        case "truncated in tensor infos": data = data[: header_end - 10]
        case "truncated in data":
            last = max(reader.tensors, key=lambda t: t.data_offset)
            data = data[: last.data_offset + last.n_bytes - 5]
        case "tensor count too large": struct.pack_into("<Q", data, 8, 2**60)
        case "kv count too large": struct.pack_into("<Q", data, 16, 2**60)
        case "key length too large": put(kv_parts[0], "<Q", 2**40)
        case "string length too large": put(_kv_parts(reader, "test.name")[3], "<Q", 2**40)
        case "array count too large": put(kv_parts[4], "<Q", 2**59)
        case "string array count too large": put(_kv_parts(reader, "test.words")[4], "<Q", 2**59)
        case "unknown value type": put(kv_parts[2], "<I", 99)
        case "alignment not a power of two": put(_kv_parts(reader, "general.alignment")[3], "<I", 48)
        case "alignment of zero": put(_kv_parts(reader, "general.alignment")[3], "<I", 0)
        case "unknown tensor type": put(_tensor_parts(reader, 0)[4], "<I", 99)
        case "too many dims": put(_tensor_parts(reader, 0)[2], "<I", 7)
        case "ne0 not a multiple of the block": put(_tensor_parts(reader, 0)[3], "<Q", 48)
        case "dims overflow":
            for j in range(2):
                put(_tensor_parts(reader, 1)[3], "<Q", 2**40, index=j)
        case "data outside the file": put(_tensor_parts(reader, 2)[5], "<Q", 2**40)
        case "misaligned tensor":
            relative = int(reader.tensors[1].data_offset - reader.data_offset)
            put(_tensor_parts(reader, 1)[5], "<Q", relative + 1)
        case "overlapping tensors": put(_tensor_parts(reader, 1)[5], "<Q", 0)
        case "duplicate tensor name":
            name_part = _tensor_parts(reader, 1)[1]
            pos = _offset(reader, name_part)
            data[pos : pos + len("a.weight")] = b"a.weight"
        case _: raise AssertionError(how)
    path.write_bytes(bytes(data))
    return path


def assert_clean_failure(proc, tmp_path, before, mentions):
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert mentions in lines[0], lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == before


CASES = {
    "wrong magic": "not a GGUF file",
    "version 1": "unsupported GGUF version 1",
    "version 4": "unsupported GGUF version 4",
    "big-endian": "big-endian",
    "empty": "empty file",
    "truncated in magic": "not a GGUF file",
    "truncated in counts": "truncated",
    "truncated in key/values": "truncated",
    "truncated in tensor infos": "truncated",
    "truncated in data": "outside the file",
    "tensor count too large": "tensor count",
    "kv count too large": "key/value count",
    "key length too large": "claims 1099511627776 bytes",
    "string length too large": "claims 1099511627776 bytes",
    "array count too large": "'test.list' claims 576460752303423488 items",
    "string array count too large": "'test.words' claims 576460752303423488 items",
    "unknown value type": "unknown value type 99",
    "alignment not a power of two": "general.alignment must be a power of two",
    "alignment of zero": "general.alignment must be a power of two",
    "unknown tensor type": "tensor 'a.weight': unknown GGML type id 99",
    "too many dims": "7 dimensions",
    "ne0 not a multiple of the block": "not a multiple of Q4_0's block size 32",
    "dims overflow": "too many",
    "data outside the file": "outside the file",
    "misaligned tensor": "not aligned",
    "overlapping tensors": "overlap",
    "duplicate tensor name": "duplicate tensor name",
}


@pytest.mark.parametrize("how", CASES)
def test_damaged_input_fails_cleanly(how, good, tmp_path, cli):
    bad = damage(good, how)
    before = sorted(p.name for p in tmp_path.iterdir())
    proc = cli("convert", bad, tmp_path / "out")
    assert_clean_failure(proc, tmp_path, before, CASES[how])
    assert str(bad) in proc.stderr
    # inspect and verify --against read the same way
    assert_clean_failure(cli("inspect", bad), tmp_path, before, CASES[how])


def test_missing_and_non_file_inputs(tmp_path, cli):
    before = sorted(p.name for p in tmp_path.iterdir())
    assert_clean_failure(cli("convert", tmp_path / "nope.gguf", tmp_path / "o"), tmp_path, before,
                         "no such file")
    assert_clean_failure(cli("convert", tmp_path, tmp_path / "o"), tmp_path, before,
                         "no .gguf files under it")  # a directory is an archive of models


def test_existing_output_is_never_overwritten(good, tmp_path, cli):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "precious.txt").write_text("keep me")
    before = sorted(p.name for p in tmp_path.iterdir())
    assert_clean_failure(cli("convert", good, taken), tmp_path, before, "already exists")
    # --force replaces only a gguf-repack output
    assert_clean_failure(cli("convert", good, taken, "--force"), tmp_path, before,
                         "not a gguf-repack output")
    assert (taken / "precious.txt").read_text() == "keep me"
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    before = sorted(p.name for p in tmp_path.iterdir())
    assert_clean_failure(cli("convert", good, a_file), tmp_path, before, "already exists")
    assert a_file.read_text() == "x"


def test_unwritable_output_locations(good, tmp_path, cli):
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    before = sorted(p.name for p in tmp_path.iterdir())
    assert_clean_failure(cli("convert", good, a_file / "out"), tmp_path, before, "a-file")
    assert_clean_failure(cli("convert", good, tmp_path / "no" / "such" / "out"), tmp_path, before,
                         "does not exist")
    # /proc refuses new entries even for root
    proc = cli("convert", good, "/proc/gguf-repack-out")
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr


def test_export_refuses_to_overwrite(good, tmp_path, cli):
    out = tmp_path / "out"
    cli("convert", good, out, check_exit=0)
    target = tmp_path / "back.gguf"
    target.write_text("precious")
    before = sorted(p.name for p in tmp_path.iterdir())
    assert_clean_failure(cli("export", out, target), tmp_path, before, "already exists")
    assert target.read_text() == "precious"
    cli("export", out, target, "--force", check_exit=0)
    assert target.read_bytes() == good.read_bytes()


def test_verify_and_export_of_something_that_is_not_an_output(good, tmp_path, cli):
    before = sorted(p.name for p in tmp_path.iterdir())
    assert_clean_failure(cli("verify", tmp_path), tmp_path, before, "manifest.json")
    assert_clean_failure(cli("export", good, tmp_path / "x.gguf"), tmp_path, before,
                         "not a directory")


def test_split_set_with_a_missing_or_inconsistent_shard(tmp_path, cli):
    from test_convert import write_split_set

    src = tmp_path / "src"
    src.mkdir()
    shards = write_split_set(src, np.random.default_rng(3))
    before = sorted(p.name for p in tmp_path.iterdir())
    # not the first shard
    assert_clean_failure(cli("convert", shards[1], tmp_path / "o"), tmp_path, before, "split.no")
    # a shard from another set: split.count disagrees
    reader = gguf.GGUFReader(shards[2])
    data = bytearray(shards[2].read_bytes())
    struct.pack_into("<H", data, _offset(reader, reader.fields["split.count"].parts[3]), 4)
    shards[2].write_bytes(bytes(data))
    assert_clean_failure(cli("convert", shards[0], tmp_path / "o"), tmp_path, before, "split.count")
    shards[2].unlink()
    assert_clean_failure(cli("convert", shards[0], tmp_path / "o"), tmp_path, before,
                         "missing shard 3 of 3")


def test_export_never_writes_outside_its_destination(good, tmp_path, cli):
    import json

    out = tmp_path / "out"
    cli("convert", good, out, check_exit=0)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["sources"][0]["file"] = "../escaped.gguf"
    (out / "manifest.json").write_text(json.dumps(manifest))
    dest = tmp_path / "dest"
    dest.mkdir()
    proc = cli("export", out, dest)
    assert proc.returncode == 2 and "not a plain file name" in proc.stderr
    assert not (tmp_path / "escaped.gguf").exists() and list(dest.iterdir()) == []


@pytest.mark.parametrize("how, mentions", [("trailing bytes", "data ends at byte"),
                                           ("a hole", "a hole or an overlap")])
def test_a_shard_with_bytes_no_entry_owns_is_refused(how, mentions, good, tmp_path, cli):
    """safetensors data is contiguous and ends the file: bytes that no entry owns (appended,
    or a gap before the first entry) mean a damaged shard: verify names it (exit 1, damage
    found) and loading it is an error."""
    import json

    out = tmp_path / "out"
    cli("convert", good, out, "--weights-only", check_exit=0)
    shard = next(out.glob("*.safetensors"))
    raw = shard.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    if how == "trailing bytes":
        raw += bytes(8)
    else:  # every entry moved 8 bytes on, and 8 bytes of nothing put before them
        header = json.loads(raw[8 : 8 + n])
        for key, spec in header.items():
            if key != "__metadata__":
                spec["data_offsets"] = [o + 8 for o in spec["data_offsets"]]
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        raw = struct.pack("<Q", len(text)) + text + bytes(8) + raw[8 + n :]
    shard.write_bytes(raw)
    proc = cli("verify", out, check_exit=1)
    assert mentions in proc.stdout and shard.name in proc.stdout, proc.stdout
    from gguf_repack import load
    from gguf_repack.errors import FormatError

    with pytest.raises(FormatError, match=shard.name):  # (safetensors' own words follow)
        load(out)["a.weight"]


@pytest.mark.parametrize("tensor, layout", [("a.weight", "rp2"), ("b.weight", "rp1")])
def test_a_layout_this_version_does_not_read_is_refused_everywhere(tensor, layout, good, tmp_path, cli):
    """A tensor stored in another layout (a later version's, or a plain tensor marked rp1):
    verify and export refuse it with one line naming the tensor, before reading any plane;
    loading it is an error too (FORMAT.md, what a reader must check)."""
    import json

    from gguf_repack import load
    from gguf_repack.errors import FormatError

    out = tmp_path / "out"
    cli("convert", good, out, "--weights-only", check_exit=0)
    manifest = json.loads((out / "manifest.json").read_text())
    next(t for t in manifest["tensors"] if t["name"] == tensor)["layout"] = layout
    (out / "manifest.json").write_text(json.dumps(manifest))
    for proc in (cli("verify", out), cli("export", out, tmp_path / "back.gguf")):
        assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
        said = proc.stdout + proc.stderr
        assert f"layout {layout!r}" in said and tensor in said, said
        assert "Traceback" not in said
    assert not (tmp_path / "back.gguf").exists()
    with pytest.raises(FormatError, match="layout"):
        load(out)[tensor]
