"""Torch dequantizers over rp1 planes against gguf.quants.dequantize, bit for bit."""

import gguf.quants
import numpy as np
import pytest
import torch
from ggml_blocks import random_blocks
from gguf.constants import GGMLQuantizationType

from gguf_repack.format.layout import pack
from gguf_repack.format.type_table import TYPES
from gguf_repack.runtime.dequant import dequantize_planes

# every quantized type that the reference can dequantize
REFERENCE_TYPES = sorted(
    (t.name for t in TYPES.values()
     if t.is_quantized and GGMLQuantizationType(t.id) in gguf.quants._type_traits))


def torch_planes(blocks: np.ndarray, qtype) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(v) for k, v in pack(blocks, qtype).items()}


def assert_bitwise_equal(got: torch.Tensor, expected: np.ndarray) -> None:
    assert got.dtype == torch.float32
    got = got.numpy()
    assert got.shape == expected.shape
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    ok = ~np.isnan(expected)
    mismatch = got[ok].view(np.uint32) != expected[ok].astype(np.float32).view(np.uint32)
    assert not mismatch.any(), f"{mismatch.sum()} of {mismatch.size} values differ in their bits"


@pytest.mark.parametrize("name", REFERENCE_TYPES)
@pytest.mark.parametrize("shape_blocks", [(7, 3), (2, 5, 2)])
def test_dequantize_matches_gguf_py_bitwise(name, shape_blocks, rng):
    qtype = next(t for t in TYPES.values() if t.name == name)
    *rows, n_blocks = shape_blocks
    shape = (*rows, n_blocks * qtype.block_size)
    blocks = random_blocks(qtype.id, shape, rng)
    expected = gguf.quants.dequantize(blocks.reshape(*rows, -1), GGMLQuantizationType(qtype.id))
    assert expected.shape == shape
    assert_bitwise_equal(dequantize_planes(torch_planes(blocks, qtype), qtype), expected)


@pytest.mark.parametrize("name", REFERENCE_TYPES)
def test_non_finite_scales_give_the_same_nan_and_inf(name, rng):
    """Raw random bits: scales may be NaN, inf or subnormal; results still agree bit for bit
    (NaN where the reference has NaN)."""
    qtype = next(t for t in TYPES.values() if t.name == name)
    shape = (64, 2 * qtype.block_size)
    blocks = rng.integers(0, 256, (64, 2, qtype.type_size), dtype=np.uint8)
    with np.errstate(all="ignore"):
        expected = gguf.quants.dequantize(blocks.reshape(64, -1), GGMLQuantizationType(qtype.id))
    assert expected.shape == shape
    assert_bitwise_equal(dequantize_planes(torch_planes(blocks, qtype), qtype), expected)


@pytest.mark.parametrize("name", REFERENCE_TYPES)
def test_one_block_per_row_and_a_slice_of_rows(name, rng):
    """Planes as the backends also pass them: one block column, and rows n0:n1 of each plane
    (a view with gaps between its block columns)."""
    qtype = next(t for t in TYPES.values() if t.name == name)
    ggml_type = GGMLQuantizationType(qtype.id)
    blocks = random_blocks(qtype.id, (6, qtype.block_size), rng)
    expected = gguf.quants.dequantize(blocks.reshape(6, -1), ggml_type)
    assert_bitwise_equal(dequantize_planes(torch_planes(blocks, qtype), qtype), expected)
    blocks = random_blocks(qtype.id, (6, 3 * qtype.block_size), rng)
    expected = gguf.quants.dequantize(blocks.reshape(6, -1), ggml_type)[1:5]
    planes = {f: p[..., 1:5, :] for f, p in torch_planes(blocks, qtype).items()}
    assert_bitwise_equal(dequantize_planes(planes, qtype), expected)
