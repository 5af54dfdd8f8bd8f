"""The baseline for the benchmarks: GEMV kernels that read GGUF's own array-of-blocks bytes,
[N, B, type_size] per weight, as engines do today. The design is the package's first GEMV
(a type's dequant tile times x; the package now runs dot functions, gguf_repack_kernels/gemv.py), with
the dequant functions' arithmetic, so a difference from it is the layout and the dot
kernel together. Q4_0, Q8_0, Q4_K, Q5_K, Q6_K
and IQ4_XS: the types bench_gpu.py runs at every shape (benchmark use, not part of the
package).

A raw dequant function gets the address of each row's block and reads every field at its
byte offset inside the block (gguf_repack/format/type_table.py), as bytes. A block address is only
as aligned as the block size makes it (2 bytes for Q4_0's 18, Q8_0's 34, Q6_K's 210; 8 for
IQ4_XS's 136; 16 for Q4_K's 144 and Q5_K's 176): nothing more is promised here, and Triton
vectorizes what that allows. A header's scalars (d, dmin, packed scales) are read with their
neighbours as one run and split in registers: read one by one, with rows 144+ bytes apart,
they got a layout in which every thread reloads every row's (64 extra loads per block
column in the PTX). The unpacking after the loads is the rp1 functions' own, imported.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gguf_repack.format.type_table import TYPES_BY_NAME
from gguf_repack_kernels import FORMATS
from gguf_repack_kernels.fields import concat, nibbles
from gguf_repack_kernels.formats_iquants import bitfields, kvalue, per_group
from gguf_repack_kernels.formats_kquants import bit_fields, per_weight
from gguf_repack_kernels.split_k import add_partial_sums


@triton.jit
def _bytes_at(block, mask, OFFSET: tl.constexpr, COUNT: tl.constexpr):
    """COUNT bytes starting OFFSET bytes into each row's block, uint8 [len(block), COUNT]."""
    ptr = block[:, None] + OFFSET + tl.arange(0, COUNT)[None, :]
    return tl.load(ptr, mask=mask[:, None], other=0)


@triton.jit
def _f16_at(block, mask, OFFSET: tl.constexpr):
    """A float16 at OFFSET in each block, as float32 [len(block), 1]: assembled from its two
    bytes, since the block address promises no alignment of its own."""
    lo, hi = tl.split(_bytes_at(block, mask, OFFSET, 2))
    d = (lo.to(tl.uint16) | (hi.to(tl.uint16) << 8)).to(tl.float16, bitcast=True)
    return d.to(tl.float32)[:, None]


@triton.jit
def _raw_q8_0(block, mask, TABLE):
    # d 0, qs 2..33
    q = _bytes_at(block, mask, 2, 32).to(tl.int8, bitcast=True)
    return _f16_at(block, mask, 0) * q.to(tl.float32)


@triton.jit
def _raw_q4_0(block, mask, TABLE):
    # d 0, qs 2..17
    q = nibbles(_bytes_at(block, mask, 2, 16)).to(tl.int8) - 8
    return _f16_at(block, mask, 0) * q.to(tl.float32)


@triton.jit
def _byte_groups(b, GROUPS: tl.constexpr):
    """uint8 [R, 4 * GROUPS] -> int32 [R, 4, GROUPS]: column g holds bytes 4g..4g+3."""
    R: tl.constexpr = b.shape[0]
    return tl.permute(tl.reshape(b.to(tl.int32), (R, GROUPS, 4)), (0, 2, 1))


@triton.jit
def _word(b):
    """Bytes int32 [R, 4] -> the little-endian 32-bit word they make, int32 [R]."""
    return tl.sum(b << (8 * tl.arange(0, 4))[None, :], axis=1)  # disjoint bits: the sum is an OR


@triton.jit
def _f16_bits(h):
    """The low 16 bits of int32 [R] as a float16, as float32 [R, 1]."""
    return (h & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)[:, None]


@triton.jit
def _raw_scaled_minus_min(block, mask, q):
    """Q4_K/Q5_K: (d * scale) * q - dmin * min over 8 sub-blocks of 32, as rp1 computes it.
    d, dmin and the 12 scale bytes fill the block's first 16 bytes: read as one run, split
    in registers (formats_kquants.scales_mins' bit arrangement)."""
    even, odd = tl.split(tl.reshape(_byte_groups(_bytes_at(block, mask, 0, 16), 4),
                                    (block.shape[0], 4, 2, 2)))
    head, b1 = tl.split(even)  # bytes 0-3 (d, dmin) and scale bytes 4-7
    b0, b2 = tl.split(odd)  # scale bytes 0-3 and 8-11
    d_dmin = _word(head)
    d, dmin = _f16_bits(d_dmin), _f16_bits(d_dmin >> 16)
    sc = concat(b0 & 63, (b2 & 15) | ((b0 >> 2) & 48))
    mn = concat(b1 & 63, (b2 >> 4) | ((b1 >> 2) & 48))
    dl = d * sc.to(tl.float32)
    ml = dmin * mn.to(tl.float32)
    return q.to(tl.float32) * per_weight(dl, 32) - per_weight(ml, 32)


@triton.jit
def _raw_q4_k(block, mask, TABLE):
    # d 0, dmin 2, scales 4..15, qs 16..143
    q = bit_fields(_bytes_at(block, mask, 16, 128), 4, 4)
    return _raw_scaled_minus_min(block, mask, q)


@triton.jit
def _raw_q5_k(block, mask, TABLE):
    # d 0, dmin 2, scales 4..15, qh 16..47, qs 48..175
    q = bit_fields(_bytes_at(block, mask, 48, 128), 4, 4)
    q |= bit_fields(_bytes_at(block, mask, 16, 32), 1, 1) << 4
    return _raw_scaled_minus_min(block, mask, q)


@triton.jit
def _raw_q6_k(block, mask, TABLE):
    # ql 0..127, qh 128..191, scales 192..207, d 208
    sc = _bytes_at(block, mask, 192, 16).to(tl.int8, bitcast=True)
    dl = _f16_at(block, mask, 208) * sc.to(tl.float32)
    q = bit_fields(_bytes_at(block, mask, 0, 128), 2, 4)
    q |= bit_fields(_bytes_at(block, mask, 128, 64), 2, 2) << 4
    return (q.to(tl.int32) - 32).to(tl.float32) * per_weight(dl, 16)


@triton.jit
def _raw_iq4_xs(block, mask, TABLE):
    # d 0, scales_h 2..3, scales_l 4..7, qs 8..135
    R: tl.constexpr = block.shape[0]
    # d, scales_h and scales_l fill the first 8 bytes: read as one run, split in registers
    head, scales_l = tl.split(_byte_groups(_bytes_at(block, mask, 0, 8), 2))
    head = _word(head)
    # 6-bit sub-block scales offset by 32: low 4 bits in scales_l, high 2 in scales_h
    hi = bitfields(((head >> 16) & 0xFFFF)[:, None], 2, 8, 0x03)
    lo = bitfields(_word(scales_l)[:, None], 4, 8, 0x0F)
    dl = _f16_bits(head) * ((lo | (hi << 4)) - 32).to(tl.float32)
    qs = tl.reshape(_bytes_at(block, mask, 8, 128), (R * 8, 16))
    q = tl.reshape(kvalue(TABLE, nibbles(qs)), (R, 256))
    return per_group(dl, q)


# The batch size only masks rows: one compiled variant serves every value of it.
@triton.jit(do_not_specialize=["M"])
def raw_gemv_kernel(RAW, TABLE, X, OUT, SUMS, COUNTS, M, N, B, stride_xm, stride_om, BLOCK: tl.constexpr,
                    TYPE_SIZE: tl.constexpr, BN: tl.constexpr, M_PAD: tl.constexpr,
                    SPLIT_K: tl.constexpr, DQ: tl.constexpr):
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    mask = rows < N
    ms = tl.arange(0, M_PAD)
    cols = tl.arange(0, BLOCK)
    acc = tl.zeros((M_PAD, BN), dtype=tl.float32)
    row_start = RAW.to(tl.pointer_type(tl.uint8)) + rows.to(tl.int64) * B * TYPE_SIZE
    j = tl.program_id(1)
    while j < B:  # (a while loop: Triton 3.6's interpreter cannot range() from a program id)
        w = DQ(row_start + j * TYPE_SIZE, mask, TABLE)  # [BN, BLOCK]
        x = tl.load(X + ms[:, None] * stride_xm + j * BLOCK + cols[None, :],
                    mask=(ms < M)[:, None], other=0.0).to(tl.float32)
        acc += tl.sum(x[:, None, :] * w[None, :, :], axis=2)
        j += SPLIT_K
    out = OUT + ms[:, None] * stride_om + rows[None, :]
    out_mask = (ms < M)[:, None] & mask[None, :]
    if SPLIT_K == 1:
        tl.store(out, acc.to(OUT.dtype.element_ty), mask=out_mask)
    else:  # as the planes' GEMV finishes split K (gguf_repack_kernels/split_k.py)
        offsets = ms[:, None] * stride_om + rows[None, :]  # the workspace has OUT's strides
        add_partial_sums(acc, SUMS, OUT, offsets, out_mask, COUNTS, 1, SPLIT_K)


RAW_DEQUANT = {"Q8_0": _raw_q8_0, "Q4_0": _raw_q4_0, "Q4_K": _raw_q4_k, "Q5_K": _raw_q5_k,
               "Q6_K": _raw_q6_k, "IQ4_XS": _raw_iq4_xs}


def raw_gemv_config(block_size: int, n: int, n_blocks: int, sms: int) -> dict:
    """Split K over block columns until the grid has about 4 programs per multiprocessor:
    a small matrix at batch 1 still fills the GPU."""
    bn = 64 if block_size <= 32 else 32
    tiles = -(-n // bn)
    split_k = 1
    while tiles * split_k < 4 * sms and split_k * 2 <= n_blocks:
        split_k *= 2
    return {"BN": bn, "SPLIT_K": split_k, "num_warps": 4}


def _multiprocessors(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 1


def raw_matmul(x: torch.Tensor, raw: torch.Tensor, type_name: str, shape,
               bn: int | None = None, split_k: int | None = None) -> torch.Tensor:
    """x @ W.T with W given as its GGUF bytes (uint8 [N, B * type_size]); M <= 8. BN and
    SPLIT_K default to raw_gemv_config's for the same weight on the same device."""
    qtype = TYPES_BY_NAME[type_name]
    n, k = shape
    b = k // qtype.block_size
    x2 = x.reshape(-1, k).contiguous()
    m = x2.shape[0]
    cfg = raw_gemv_config(qtype.block_size, n, b, _multiprocessors(x.device))
    bn = cfg["BN"] if bn is None else bn
    split_k = cfg["SPLIT_K"] if split_k is None else split_k
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    # split K's float32 sums and a counter a tile, zeroed (gguf_repack_kernels/split_k.py)
    grid = (triton.cdiv(n, bn), split_k)
    workspace = torch.zeros(m * n + grid[0], dtype=torch.float32, device=x.device)
    sums, counts = workspace[:m * n], workspace[m * n:].view(torch.int32)
    fmt = FORMATS[type_name]
    table = fmt.table(x.device) if fmt.table is not None else raw  # any valid pointer
    raw_gemv_kernel[grid](raw, table, x2, out, sums, counts, m, n, b, x2.stride(0), out.stride(0),
                          BLOCK=qtype.block_size, TYPE_SIZE=qtype.type_size, BN=bn,
                          M_PAD=triton.next_power_of_2(m), SPLIT_K=split_k,
                          DQ=RAW_DEQUANT[type_name], num_warps=cfg["num_warps"])
    return out
