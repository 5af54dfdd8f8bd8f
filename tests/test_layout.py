"""rp1 pack/unpack against a plain reference: slice each field's bytes, swap N and B."""

import numpy as np
import pytest
from ggml_blocks import random_blocks

from gguf_repack.format.layout import blocks_shape, pack, plane_shapes, unpack
from gguf_repack.format.type_table import TYPES

QUANTIZED = sorted(t.name for t in TYPES.values() if t.is_quantized)
SHAPES = [(5, 3), (2, 7, 2), (2, 1, 3, 1), (1,)]  # (rows..., blocks per row): 2-D, 3-D, 4-D, 1-D


def reference_planes(blocks: np.ndarray, qtype) -> dict[str, np.ndarray]:
    out = {}
    for f in qtype.fields:
        field_bytes = blocks[..., f.offset : f.offset + f.size]  # [E..., N, B, size]
        planar = np.swapaxes(field_bytes, -2, -3).copy()  # [E..., B, N, size]
        out[f.name] = planar.view(f.plane_dtype)  # same bytes, little-endian words
    return out


@pytest.mark.parametrize("name", QUANTIZED)
@pytest.mark.parametrize("dims", SHAPES)
def test_pack_matches_reference_and_unpack_inverts_it(name, dims, rng):
    qtype = next(t for t in TYPES.values() if t.name == name)
    *rows, n_blocks = dims
    shape = (*rows, n_blocks * qtype.block_size)
    blocks = random_blocks(qtype.id, shape, rng).reshape(blocks_shape(shape, qtype))
    planes = pack(blocks, qtype)
    ref = reference_planes(blocks, qtype)
    assert planes.keys() == ref.keys()
    for f in qtype.fields:
        assert planes[f.name].dtype == f.plane_dtype
        assert planes[f.name].shape == plane_shapes(shape, qtype)[f.name]
        assert planes[f.name].flags.c_contiguous
        assert planes[f.name].tobytes() == ref[f.name].tobytes()
    back = unpack(planes, qtype)
    assert back.dtype == np.uint8 and back.shape == blocks.shape
    assert back.tobytes() == blocks.tobytes()
    # the same planes written into a caller's (larger, dirty) buffer
    buf = np.full(blocks.nbytes + 7, 0xA5, np.uint8)
    into = pack(blocks, qtype, buf)
    for f in qtype.fields:
        assert into[f.name].dtype == f.plane_dtype and into[f.name].shape == planes[f.name].shape
        assert into[f.name].tobytes() == planes[f.name].tobytes()


def test_planes_hold_one_block_column_contiguously(rng):
    qtype = next(t for t in TYPES.values() if t.name == "Q8_0")
    blocks = random_blocks(qtype.id, (6, 4 * 32), rng)  # N=6 rows, B=4 columns
    planes = pack(blocks, qtype)
    # block column 2: every row's scale in one run, in row order
    col = planes["d"][2, :, 0]
    assert col.tobytes() == b"".join(blocks[n, 2, 0:2].tobytes() for n in range(6))
