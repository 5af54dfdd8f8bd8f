"""Test data made without the code under test: random valid GGML blocks and GGUF files
written by gguf's own GGUFWriter."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from gguf_repack.format.type_table import F16, F32, TYPES


def random_blocks(qtype_id: int, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Raw GGUF bytes [E..., N, B, type_size] for a tensor of torch shape (E..., N, K): random
    bits, with every float16/float32 scale field made a finite number."""
    block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(qtype_id)]
    *lead, k = shape
    blocks = rng.integers(0, 256, (*lead, k // block_size, type_size), dtype=np.uint8)
    for f in TYPES[qtype_id].fields:
        n = blocks[..., f.offset : f.offset + f.size]
        if f.kind == F16:
            n[...] = rng.uniform(-2, 2, n.shape[:-1] + (f.size // 2,)).astype("<f2").view(np.uint8)
        elif f.kind == F32:
            n[...] = rng.uniform(-2, 2, n.shape[:-1] + (f.size // 4,)).astype("<f4").view(np.uint8)
    if qtype_id == GGMLQuantizationType.BF16:  # finite bfloat16: clear one exponent bit
        blocks[..., 1] &= 0xBF
    if qtype_id == GGMLQuantizationType.IQ1_M:
        # its f16 scale is the top nibbles of the four 16-bit words of `scales` (bytes 48-55)
        d = rng.uniform(-2, 2, blocks.shape[:-1]).astype("<f2").view(np.uint16)
        for i in range(4):
            top = ((d >> (4 * i)) & 0xF).astype(np.uint8) << 4
            blocks[..., 48 + 2 * i + 1] = (blocks[..., 48 + 2 * i + 1] & 0x0F) | top
    if qtype_id == GGMLQuantizationType.MXFP4:  # E8M0 block exponent: scales 2^-8 .. 2^8
        blocks[..., 0] = rng.integers(119, 136, blocks.shape[:-1], dtype=np.uint8)
    return blocks


def as_q8_0(x: np.ndarray) -> np.ndarray:
    """x [..., K] quantized per 32 by gguf-py's Q8_0 and dequantized, float32: what the GEMV
    of an int8-x type (the kernels' registry, `x_int8`) multiplies at M <= 8."""
    q8 = GGMLQuantizationType.Q8_0
    return gguf.quants.dequantize(gguf.quants.quantize(np.asarray(x, np.float32), q8), q8)


def tensor_bytes(qtype_id: int, shape: tuple[int, ...], rng) -> np.ndarray:
    """Random valid data of a tensor as GGUFWriter takes it: uint8 [..., bytes per row]."""
    blocks = random_blocks(qtype_id, shape, rng)
    return blocks.reshape(*blocks.shape[:-2], -1)


def all_types() -> list[GGMLQuantizationType]:
    return [GGMLQuantizationType(t) for t in sorted(TYPES)]


KV_SAMPLES = [
    ("test.u8", 200, gguf.GGUFValueType.UINT8, None),
    ("test.i8", -100, gguf.GGUFValueType.INT8, None),
    ("test.u16", 60000, gguf.GGUFValueType.UINT16, None),
    ("test.i16", -30000, gguf.GGUFValueType.INT16, None),
    ("test.u32", 4_000_000_000, gguf.GGUFValueType.UINT32, None),
    ("test.i32", -2_000_000_000, gguf.GGUFValueType.INT32, None),
    ("test.f32", 1.5, gguf.GGUFValueType.FLOAT32, None),
    ("test.bool", True, gguf.GGUFValueType.BOOL, None),
    ("test.str", "héllo wörld", gguf.GGUFValueType.STRING, None),
    ("test.u64", 2**63 + 5, gguf.GGUFValueType.UINT64, None),
    ("test.i64", -(2**62), gguf.GGUFValueType.INT64, None),
    ("test.f64", 2.25, gguf.GGUFValueType.FLOAT64, None),
    ("test.arr_i32", [1, -2, 3], gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.INT32),
    ("test.arr_f32", [0.5, 1.5], gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.FLOAT32),
    ("test.arr_bool", [True, False, True], gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.BOOL),
    ("test.arr_str", ["a", "", "ünïcode", "x" * 300], gguf.GGUFValueType.ARRAY,
     gguf.GGUFValueType.STRING),
]


def write_gguf(path: Path, tensors: dict[str, tuple[GGMLQuantizationType, np.ndarray]],
               kvs=KV_SAMPLES, arch: str = "llama", split_max_tensors: int = 0) -> Path:
    """A GGUF file written by gguf's GGUFWriter: `tensors` maps name -> (type, raw bytes).
    With split_max_tensors, GGUFWriter writes a split set PATH-0000i-of-0000N.gguf instead."""
    w = gguf.GGUFWriter(str(path), arch, split_max_tensors=split_max_tensors)
    for key, value, vtype, sub_type in kvs:
        w.add_key_value(key, value, vtype, sub_type=sub_type)
    for name, (qtype, raw) in tensors.items():
        w.add_tensor(name, raw, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def every_type_tensors(rng, *, rows: int = 3, blocks: int = 2) -> dict:
    """One 2-D tensor of every type, a 3-D expert stack and a 1-D tensor of a few."""
    tensors = {}
    for qtype in all_types():
        bs = GGML_QUANT_SIZES[qtype][0]
        tensors[f"blk.0.{qtype.name.lower()}.weight"] = (
            qtype, tensor_bytes(qtype, (rows, blocks * bs), rng))
    for qtype in (GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q8_0,
                  GGMLQuantizationType.MXFP4, GGMLQuantizationType.F16):
        bs = GGML_QUANT_SIZES[qtype][0]
        tensors[f"blk.1.ffn_up_exps.{qtype.name.lower()}"] = (
            qtype, tensor_bytes(qtype, (4, rows, 3 * bs), rng))
        tensors[f"blk.1.norm.{qtype.name.lower()}"] = (qtype, tensor_bytes(qtype, (bs,), rng))
    return tensors
