import pytest
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from gguf_repack.errors import FormatError
from gguf_repack.format.type_table import F32, TYPES, TYPES_BY_NAME, ggml_type

# ARCHITECTURE.md's list ("One type table"): every one must be described field by field,
# not as an opaque block.
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


# Plane element types of fields read off ggml-common.h's structs, as the rule in
# ARCHITECTURE.md ("Lossless") gives them: float fields as floats, byte runs of a multiple of
# 4 bytes as int32 words (a GPU's vector loads), of 2 as int16, the rest as bytes.
KNOWN_PLANES = {
    ("Q4_K", "d"): ("<f2", 1), ("Q4_K", "scales"): ("<i4", 3), ("Q4_K", "qs"): ("<i4", 32),
    ("Q8_0", "qs"): ("<i4", 8), ("Q5_0", "qh"): ("<i4", 1), ("Q6_K", "scales"): ("<i4", 4),
    ("Q3_K", "hmask"): ("<i4", 8), ("IQ4_XS", "scales_h"): ("<i2", 1),
    ("IQ4_XS", "scales_l"): ("<i4", 1), ("Q8_K", "d"): ("<f4", 1), ("Q8_K", "bsums"): ("<i4", 8),
    ("TQ1_0", "qs"): ("<i4", 12), ("TQ1_0", "qh"): ("<i4", 1), ("IQ3_S", "signs"): ("<i4", 8),
    ("IQ3_S", "scales"): ("<i4", 1), ("MXFP4", "e"): ("|u1", 1), ("Q2_K", "scales"): ("<i4", 4),
}


def test_plane_dtypes_of_known_fields():
    for (type_name, field), (dtype, count) in KNOWN_PLANES.items():
        f = next(f for f in TYPES_BY_NAME[type_name].fields if f.name == field)
        assert (f.plane_dtype.str, f.count) == (dtype, count), (type_name, field)
    for t in TYPES.values():
        for f in t.fields:  # a plane holds the field's bytes, no more, no fewer
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
