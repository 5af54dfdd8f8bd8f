"""The GGML type table: the one description of every block format that every stage reads.

Each quantized type lists its block's fields in C-struct order, as ggml's `ggml-common.h`
declares them. Offsets and the block's size follow from the field widths, and a test checks
them against `gguf.constants.GGML_QUANT_SIZES`. The rp1 layout turns each field into one
plane; the element type of a plane follows from the field alone (see `Field.plane_dtype`).

Adding a type is one entry below (plus its dequantizers, in later stages). A type that the
installed `gguf` package knows but this table does not describe yet still converts
losslessly: it gets one opaque field, "blocks", holding the whole block.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from gguf_repack.errors import FormatError

QK_K = 256

# Element kinds of a field. "bytes" is anything that is not a float scalar: packed quants,
# packed scales, signs, grid indices. Its bits are kept as they are, only grouped into words.
F16, F32, BYTES = "f16", "f32", "bytes"


@dataclass(frozen=True)
class Field:
    name: str
    offset: int  # byte offset inside the block
    size: int  # bytes
    kind: str  # F16 | F32 | BYTES

    @property
    def plane_dtype(self) -> np.dtype:
        """float16/float32 for float fields; byte fields as int32 words when the width allows
        (aligned 16-byte vector loads on a GPU), else int16, else uint8. Little-endian: the
        same bytes, never reordered."""
        if self.kind == F16:
            return np.dtype("<f2")
        if self.kind == F32:
            return np.dtype("<f4")
        if self.size % 4 == 0:
            return np.dtype("<i4")
        if self.size % 2 == 0:
            return np.dtype("<i2")
        return np.dtype("u1")

    @property
    def count(self) -> int:
        """Elements of `plane_dtype` per block: the last dimension of the plane."""
        return self.size // self.plane_dtype.itemsize


@dataclass(frozen=True)
class GGMLType:
    id: int
    name: str
    block_size: int  # weights per block
    type_size: int  # bytes per block
    fields: tuple[Field, ...]  # empty for plain (unquantized) types
    plain_dtype: str | None = None  # safetensors dtype of a plain type

    @property
    def is_quantized(self) -> bool:
        return self.plain_dtype is None

    @property
    def bits_per_weight(self) -> float:
        return self.type_size * 8 / self.block_size

    @cached_property
    def struct_dtype(self) -> np.dtype:
        """One block as a numpy record of raw-byte fields: a view of GGUF blocks that names
        each field. (Opaque void fields copy several times faster than unaligned numbers.)"""
        return np.dtype(
            {
                "names": [f.name for f in self.fields],
                "formats": [f"V{f.size}" for f in self.fields],
                "offsets": [f.offset for f in self.fields],
                "itemsize": self.type_size,
            }
        )

    def nbytes(self, n_elements: int) -> int:
        return n_elements // self.block_size * self.type_size

    def __repr__(self) -> str:
        return f"GGMLType({self.name})"


def _quant(name: str, block_size: int, *fields: tuple[str, str, int]) -> GGMLType:
    qtype = GGMLQuantizationType[name]
    laid_out, offset = [], 0
    for field_name, kind, size in fields:
        laid_out.append(Field(field_name, offset, size, kind))
        offset += size
    return GGMLType(qtype.value, name, block_size, offset, tuple(laid_out))


def _plain(name: str, itemsize: int, safetensors_dtype: str) -> GGMLType:
    return GGMLType(GGMLQuantizationType[name].value, name, 1, itemsize, (), safetensors_dtype)


# fmt: off
_DESCRIBED = [
    _plain("F32", 4, "F32"), _plain("F16", 2, "F16"), _plain("BF16", 2, "BF16"),
    _plain("F64", 8, "F64"), _plain("I8", 1, "I8"), _plain("I16", 2, "I16"),
    _plain("I32", 4, "I32"), _plain("I64", 8, "I64"),

    _quant("Q4_0", 32, ("d", F16, 2), ("qs", BYTES, 16)),
    _quant("Q4_1", 32, ("d", F16, 2), ("m", F16, 2), ("qs", BYTES, 16)),
    _quant("Q5_0", 32, ("d", F16, 2), ("qh", BYTES, 4), ("qs", BYTES, 16)),
    _quant("Q5_1", 32, ("d", F16, 2), ("m", F16, 2), ("qh", BYTES, 4), ("qs", BYTES, 16)),
    _quant("Q8_0", 32, ("d", F16, 2), ("qs", BYTES, 32)),
    # Q8_1 is ggml's intermediate type and never written by llama.cpp; today's C struct has
    # f16 d and s (36 bytes) but gguf-py, which defines the file format, still sizes it 40:
    # ggml's earlier struct with f32 d and s. Files follow gguf-py, so this table does too.
    _quant("Q8_1", 32, ("d", F32, 4), ("s", F32, 4), ("qs", BYTES, 32)),
    _quant("Q1_0", 128, ("d", F16, 2), ("qs", BYTES, 16)),

    _quant("Q2_K", QK_K, ("scales", BYTES, 16), ("qs", BYTES, 64), ("d", F16, 2), ("dmin", F16, 2)),
    _quant("Q3_K", QK_K, ("hmask", BYTES, 32), ("qs", BYTES, 64), ("scales", BYTES, 12), ("d", F16, 2)),
    _quant("Q4_K", QK_K, ("d", F16, 2), ("dmin", F16, 2), ("scales", BYTES, 12), ("qs", BYTES, 128)),
    _quant("Q5_K", QK_K, ("d", F16, 2), ("dmin", F16, 2), ("scales", BYTES, 12), ("qh", BYTES, 32),
           ("qs", BYTES, 128)),
    _quant("Q6_K", QK_K, ("ql", BYTES, 128), ("qh", BYTES, 64), ("scales", BYTES, 16), ("d", F16, 2)),
    _quant("Q8_K", QK_K, ("d", F32, 4), ("qs", BYTES, 256), ("bsums", BYTES, 32)),

    _quant("IQ2_XXS", QK_K, ("d", F16, 2), ("qs", BYTES, 64)),
    _quant("IQ2_XS", QK_K, ("d", F16, 2), ("qs", BYTES, 64), ("scales", BYTES, 8)),
    _quant("IQ2_S", QK_K, ("d", F16, 2), ("qs", BYTES, 64), ("qh", BYTES, 8), ("scales", BYTES, 8)),
    _quant("IQ3_XXS", QK_K, ("d", F16, 2), ("qs", BYTES, 96)),
    _quant("IQ3_S", QK_K, ("d", F16, 2), ("qs", BYTES, 64), ("qh", BYTES, 8), ("signs", BYTES, 32),
           ("scales", BYTES, 4)),
    _quant("IQ1_S", QK_K, ("d", F16, 2), ("qs", BYTES, 32), ("qh", BYTES, 16)),
    # IQ1_M has no float field: its f16 scale is spread over the top nibbles of `scales`.
    _quant("IQ1_M", QK_K, ("qs", BYTES, 32), ("qh", BYTES, 16), ("scales", BYTES, 8)),
    _quant("IQ4_NL", 32, ("d", F16, 2), ("qs", BYTES, 16)),
    _quant("IQ4_XS", QK_K, ("d", F16, 2), ("scales_h", BYTES, 2), ("scales_l", BYTES, 4),
           ("qs", BYTES, 128)),

    _quant("TQ1_0", QK_K, ("qs", BYTES, 48), ("qh", BYTES, 4), ("d", F16, 2)),
    _quant("TQ2_0", QK_K, ("qs", BYTES, 64), ("d", F16, 2)),
    _quant("MXFP4", 32, ("e", BYTES, 1), ("qs", BYTES, 16)),
    _quant("NVFP4", 64, ("d", BYTES, 4), ("qs", BYTES, 32)),
]
# fmt: on


def _opaque(qtype: GGMLQuantizationType) -> GGMLType:
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    return GGMLType(qtype.value, qtype.name, block_size, type_size,
                    (Field("blocks", 0, type_size, BYTES),))


TYPES: dict[int, GGMLType] = {t.id: t for t in _DESCRIBED}
# A type newer than this table, known to the installed gguf package: lossless, one plane.
for _qtype in GGMLQuantizationType:
    if _qtype.value not in TYPES and _qtype in GGML_QUANT_SIZES:
        TYPES[_qtype.value] = _opaque(_qtype)

TYPES_BY_NAME: dict[str, GGMLType] = {t.name: t for t in TYPES.values()}


def ggml_type(type_id: int, *, where: str = "") -> GGMLType:
    """The table entry for a type id; a clear FormatError (naming `where`) for an unknown one."""
    try:
        return TYPES[type_id]
    except KeyError:
        known = ", ".join(f"{t.id}={t.name}" for t in sorted(TYPES.values(), key=lambda t: t.id))
        raise FormatError(f"{where}unknown GGML type id {type_id} (known: {known})") from None
