import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from gguf_repack.errors import FormatError
from gguf_repack.type_table import F16, F32, TYPES, TYPES_BY_NAME, ggml_type

# DESIGN.md's list: every one must be described field by field, not as an opaque block.
DESIGN_TYPES = """F32 F16 BF16 F64 I8 I16 I32 I64 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q8_1 Q2_K Q3_K Q4_K
Q5_K Q6_K Q8_K IQ1_S IQ1_M IQ2_XXS IQ2_XS IQ2_S IQ3_XXS IQ3_S IQ4_NL IQ4_XS TQ1_0 TQ2_0 MXFP4
NVFP4 Q1_0""".split()


def test_every_gguf_type_is_in_the_table_with_ggml_sizes():
    for qtype, (block_size, type_size) in GGML_QUANT_SIZES.items():
        entry = TYPES[qtype.value]
        assert (entry.name, entry.block_size, entry.type_size) == (qtype.name, block_size, type_size)


@pytest.mark.parametrize("name", DESIGN_TYPES)
def test_design_types_are_described_field_by_field(name):
    t = TYPES_BY_NAME[name]
    assert t.id == GGMLQuantizationType[name].value
    if t.is_quantized:
        assert [f.name for f in t.fields] != ["blocks"], f"{name} has no field description"
        # fields tile the block exactly, in order, without gaps
        pos = 0
        for f in t.fields:
            assert f.offset == pos and f.size > 0
            pos += f.size
        assert pos == t.type_size
        assert t.struct_dtype.itemsize == t.type_size


def test_plane_dtypes_follow_the_field_rule():
    for t in TYPES.values():
        for f in t.fields:
            if f.kind == F16:
                assert f.plane_dtype == np.float16
            elif f.kind == F32:
                assert f.plane_dtype == np.float32
            elif f.size % 4 == 0:
                assert f.plane_dtype == np.int32
            elif f.size % 2 == 0:
                assert f.plane_dtype == np.int16
            else:
                assert f.plane_dtype == np.uint8
            assert f.count * f.plane_dtype.itemsize == f.size


def test_known_field_structs_from_ggml_common_h():
    # spot checks against ggml-common.h's structs
    q6k = TYPES_BY_NAME["Q6_K"]
    assert [(f.name, f.offset, f.size) for f in q6k.fields] == [
        ("ql", 0, 128), ("qh", 128, 64), ("scales", 192, 16), ("d", 208, 2)]
    q2k = TYPES_BY_NAME["Q2_K"]
    assert [(f.name, f.offset) for f in q2k.fields] == [
        ("scales", 0), ("qs", 16), ("d", 80), ("dmin", 82)]
    assert TYPES_BY_NAME["Q8_K"].fields[0].kind == F32


def test_unknown_type_id_is_a_clear_error():
    with pytest.raises(FormatError, match="unknown GGML type id 99"):
        ggml_type(99, where="x.gguf: tensor 'w': ")
