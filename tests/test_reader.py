"""The scanner against gguf's GGUFReader, the reference, on every kind of test file."""

import numpy as np
import pytest
from ggml_blocks import every_type_tensors, write_gguf
from gguf import GGUFReader
from gguf.constants import GGUFValueType

from gguf_repack.converter.reader import StringArray, read_gguf


def assert_same_as_gguf_reader(path):
    ours = read_gguf(path)
    ref = GGUFReader(path)
    ref_kvs = {k: f for k, f in ref.fields.items() if not k.startswith("GGUF.")}
    assert list(ours.kvs) == list(ref_kvs)
    for key, field in ref_kvs.items():
        kv = ours.kvs[key]
        assert kv.type == field.types[0], key
        expected = field.contents()
        if kv.type == GGUFValueType.ARRAY:
            assert kv.item_type == field.types[-1], key
            got = kv.value.items if isinstance(kv.value, StringArray) else list(kv.value)
            assert len(got) == len(expected), key
            if field.types[-1] == GGUFValueType.STRING:
                assert got == expected, key
            else:
                np.testing.assert_array_equal(np.asarray(got), np.asarray(expected), err_msg=key)
        elif kv.type == GGUFValueType.FLOAT32:
            assert np.float32(kv.value) == np.float32(expected), key
        else:
            assert kv.value == expected, key
    assert len(ours.tensors) == len(ref.tensors)
    for t, r in zip(ours.tensors, ref.tensors):
        assert t.name == r.name
        assert t.type.id == int(r.tensor_type)
        assert list(t.dims) == [int(x) for x in r.shape]
        assert t.file_offset == r.data_offset
        assert t.nbytes == r.n_bytes
        assert t.n_elements == r.n_elements
    assert ours.alignment == ref.alignment
    assert ours.data_offset == ref.data_offset


def test_scanner_agrees_with_gguf_reader_on_every_type_file(tmp_path, rng):
    path = write_gguf(tmp_path / "all.gguf", every_type_tensors(rng))
    assert_same_as_gguf_reader(path)


def test_scanner_agrees_with_gguf_reader_on_split_shards(tmp_path, rng):
    from test_convert import write_split_set

    for shard in write_split_set(tmp_path, rng):
        assert_same_as_gguf_reader(shard)


@pytest.mark.parametrize("model", ["smollm2", "gemma"])
def test_scanner_agrees_with_gguf_reader_on_real_models(model, request):
    assert_same_as_gguf_reader(request.getfixturevalue(model))


def test_string_arrays_are_decoded_only_when_asked(smollm2):
    f = read_gguf(smollm2)
    tokens = f.kvs["tokenizer.ggml.tokens"].value
    assert isinstance(tokens, StringArray) and tokens._items is None
    assert len(tokens) == 49152
    assert tokens[0] == "<|endoftext|>" and tokens._items is not None
