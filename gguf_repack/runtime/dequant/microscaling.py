"""FP4 microscaling types: MXFP4 (E8M0 scale per 32) and NVFP4 (UE4M3 scale per 16)."""

from __future__ import annotations

from functools import cache

import torch
from gguf.quants import MXFP4, NVFP4

from . import Planes, nibble_levels, register

# Scales and weights both decode through small float32 tables, built once per device: 256
# entries per scale format (each is one byte), and gguf-py's 16 E2M1 `kvalues` (looked up
# two codes at a time by nibble_levels). Those are the values doubled, which is why both
# scale decoders include a factor 0.5.

assert MXFP4.kvalues == NVFP4.kvalues
E2M1_LEVELS = tuple(float(v) for v in MXFP4.kvalues)


def _lookup(table: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """table[codes] for uint8 codes. index_select is torch's fastest gather on CPU, several
    times faster than advanced indexing."""
    return table.index_select(0, codes.reshape(-1).int()).view(codes.shape)


@cache
def _e8m0_half(device: torch.device) -> torch.Tensor:
    """E8M0 byte e -> 2**(e - 128), its float32 bits built as gguf-py's `e8m0_to_fp32_half`
    builds them: e = 0 and 1 give the subnormals 2**-128 and 2**-127, and e = 255 (E8M0's NaN)
    the finite 2**127, never NaN."""
    e = torch.arange(256, dtype=torch.int32)
    bits = torch.where(e < 2, 0x00200000 << e, (e - 1) << 23)
    return bits.view(torch.float32).to(device)


@register("MXFP4", into=True)
def mxfp4(p: Planes, out: torch.Tensor) -> torch.Tensor:
    # each weight the float32 product scale * kvalue, as in gguf-py
    scale = _lookup(_e8m0_half(p["e"].device), p["e"])  # [M, 1]
    return torch.mul(scale, nibble_levels(E2M1_LEVELS, p["qs"], 4), out=out)


@cache
def _ue4m3_half(device: torch.device) -> torch.Tensor:
    """UE4M3 byte -> half its value, float32, as gguf-py's `ue4m3_to_fp32` decodes it.

    Every value is exact in float32 (a 4-bit mantissa times a power of two), and so is each
    step of gguf-py's float32 computation, so exact arithmetic gives its bits. The sign bit is
    ignored, and 0x7F (E4M3's NaN) decodes to 0."""
    x = torch.arange(256, dtype=torch.int32)
    exp, man = (x >> 3) & 0xF, (x & 0x7).double()
    value = torch.where(exp == 0, man * 2.0**-9, (1 + man / 8) * 2.0 ** (exp - 7).double())
    value = torch.where((x == 0) | (x == 0x7F), 0.0, value * 0.5)
    return value.float().to(device)


@register("NVFP4", into=True)
def nvfp4(p: Planes, out: torch.Tensor) -> torch.Tensor:
    m = p["qs"].shape[0]
    scale = _lookup(_ue4m3_half(p["d"].device), p["d"].view(torch.uint8))  # [M, 4]: one per 16
    values = nibble_levels(E2M1_LEVELS, p["qs"], 2).view(m, 4, 16)  # 4 runs of 8 bytes
    torch.mul(scale.unsqueeze(-1), values, out=out.view(m, 4, 16))
    return out
