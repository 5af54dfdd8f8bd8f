"""IQ types: importance-weighted quants over lattice grids and non-linear value tables.

Every grid, sign and value table is decoded from gguf-py's own class attributes (once per
device), so the tables cannot drift from the reference. Each function repeats gguf-py's
float32 arithmetic in its order (a table may hold one of its steps, done once); only the
integer work of unpacking indices is arranged freely.
"""

from __future__ import annotations

from functools import cache

import gguf.quants as ref
import numpy as np
import torch

from . import Planes, nibble_levels, register

# -- tables ----------------------------------------------------------------------------


@cache
def _grid(name: str, device: torch.device) -> torch.Tensor:
    """gguf-py's decoded lattice of type `name` as float32 [entries, width]."""
    cls = getattr(ref, name)
    cls.init_grid()
    return torch.from_numpy(cls.grid.reshape(cls.grid_shape).astype(np.float32)).to(device)


@cache
def _byte_signs(device: torch.device) -> torch.Tensor:
    """Byte -> its 8 bits (LSB first) as float32 factors: +1 for a clear bit, -1 for a set one."""
    bits = (np.arange(256)[:, None] >> np.arange(8)) & 1
    return torch.from_numpy(np.where(bits == 0, 1, -1).astype(np.float32)).to(device)


@cache
def _ksigns(device: torch.device) -> torch.Tensor:
    """7-bit sign index -> 8 sign factors (gguf-py's ksigns adds an even-parity 8th bit)."""
    ksigns = np.frombuffer(ref.IQ2_XXS.ksigns, dtype=np.uint8)
    return _byte_signs(device)[torch.from_numpy(ksigns.astype(np.int64)).to(device)]


@cache
def _iq1_shifted_grid(device: torch.device) -> torch.Tensor:
    """gguf-py's `grid + delta` for IQ1, both signs of delta: row i is grid[i] + 1/8, row
    2048 + i is grid[i] - 1/8 (the same float32 sums gguf-py forms, taken once)."""
    grid, delta = _grid("IQ1_S", device), float(ref.IQ1_S.delta)
    return torch.cat([grid + delta, grid + -delta])


# -- shared unpacking ------------------------------------------------------------------


def _d(p: Planes) -> torch.Tensor:
    return p["d"].float()


def _bytes(p: Planes, name: str) -> torch.Tensor:
    return p[name].view(torch.uint8)


def _u16(words: torch.Tensor) -> torch.Tensor:
    """A field's bytes as unsigned 16-bit values in int32 (torch's int16 would sign-extend)."""
    return words.view(torch.int16).int() & 0xFFFF


@cache
def _const(values: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, device=device)


def _bitfields(x: torch.Tensor, shifts: tuple[int, ...], mask: int) -> torch.Tensor:
    """[M, n] integers -> [M, n * len(shifts)]: (x >> s) & mask for each shift, per element."""
    return ((x.unsqueeze(-1) >> _const(shifts, x.dtype, x.device)) & mask).flatten(1)


def _nibbles(b: torch.Tensor) -> torch.Tensor:
    """[M, n] bytes -> [M, 2n]: each byte's low nibble, then its high one (packed scales)."""
    return _bitfields(b, (0, 4), 0x0F)


def _rows(table: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """table[idx] for integer idx [M, n] -> [M, n * width]: the gathered rows laid end to end."""
    flat = idx.reshape(-1)
    if flat.dtype not in (torch.int32, torch.int64):
        flat = flat.int()  # index_select takes no narrower index
    return table.index_select(0, flat).view(idx.shape[0], -1)


def _per_group(scale: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """scale [M, g] times x [M, n], each scale applying to its run of n / g weights."""
    m, g = scale.shape
    return (scale.view(m, g, 1) * x.view(m, g, -1)).view(m, -1)


def _ksign_rows(aux: torch.Tensor) -> torch.Tensor:
    """IQ2_XXS / IQ3_XXS aux words [M, 8], four 7-bit ksigns indices each -> [M, 256] signs."""
    return _rows(_ksigns(aux.device), _bitfields(aux, (0, 7, 14, 21), 0x7F))


def _signed(db: torch.Tensor, grid: torch.Tensor, signs: torch.Tensor) -> torch.Tensor:
    """gguf-py's `db * grid * signs`, left to right; db [M, g] per run of weights."""
    m, g = db.shape
    return (db.view(m, g, 1) * grid.view(m, g, -1) * signs.view(m, g, -1)).view(m, -1)


# -- 4-bit non-linear ------------------------------------------------------------------


IQ4_LEVELS = tuple(float(v) for v in ref.IQ4_NL.kvalues)


@register("IQ4_NL", into=True)
def iq4_nl(p: Planes, out: torch.Tensor) -> torch.Tensor:
    return torch.mul(_d(p), nibble_levels(IQ4_LEVELS, p["qs"], 4), out=out)


@register("IQ4_XS", into=True)
def iq4_xs(p: Planes, out: torch.Tensor) -> torch.Tensor:
    # 6-bit sub-block scales, offset by 32: low 4 bits in scales_l, high 2 in scales_h
    lo = _nibbles(_bytes(p, "scales_l")).int()
    hi = _bitfields(_u16(p["scales_h"]), tuple(range(0, 16, 2)), 0x03)
    dl = _d(p) * ((lo | (hi << 4)) - 32).float()
    values = nibble_levels(IQ4_LEVELS, p["qs"], 4)  # 8 runs of 16 bytes, 32 weights each
    m = values.shape[0]
    torch.mul(dl.view(m, 8, 1), values.view(m, 8, 32), out=out.view(m, 8, 32))
    return out


# -- 2-bit lattices, 8 weights per grid row --------------------------------------------


@register("IQ2_XXS")
def iq2_xxs(p: Planes) -> torch.Tensor:
    # 8 groups of 32 weights in two words each: 4 grid index bytes, then an aux word holding
    # four 7-bit ksigns indices and the 4-bit group scale on top.
    words = p["qs"].view(-1, 8, 2)
    idx = words[..., 0].contiguous().view(torch.uint8)
    aux = words[..., 1]
    db = _d(p) * (0.5 + ((aux >> 28) & 0x0F).float()) * 0.25
    return _signed(db, _rows(_grid("IQ2_XXS", idx.device), idx), _ksign_rows(aux))


@register("IQ2_XS")
def iq2_xs(p: Planes) -> torch.Tensor:
    q = _u16(p["qs"])  # per 8 weights: a 9-bit grid index, then a 7-bit ksigns index
    db = _d(p) * (0.5 + _nibbles(_bytes(p, "scales")).float()) * 0.25
    grid = _rows(_grid("IQ2_XS", q.device), q & 0x1FF)
    return _signed(db, grid, _rows(_ksigns(q.device), q >> 9))


@register("IQ2_S")
def iq2_s(p: Planes) -> torch.Tensor:
    # The qs field is 32 grid index low bytes, then 32 sign bytes (a bit per weight).
    qs = _bytes(p, "qs")
    idx = qs[:, :32].int() | (_bitfields(_bytes(p, "qh"), (0, 2, 4, 6), 0x03).int() << 8)
    db = _d(p) * (0.5 + _nibbles(_bytes(p, "scales")).float()) * 0.25
    signs = _rows(_byte_signs(qs.device), qs[:, 32:])
    return _signed(db, _rows(_grid("IQ2_S", qs.device), idx), signs)


# -- 3-bit lattices, 4 weights per grid row --------------------------------------------


@register("IQ3_XXS")
def iq3_xxs(p: Planes) -> torch.Tensor:
    # The qs field is 64 grid index bytes, then 8 aux words as in IQ2_XXS.
    idx = p["qs"][:, :16].contiguous().view(torch.uint8)
    aux = p["qs"][:, 16:]
    db = _d(p) * (0.5 + ((aux >> 28) & 0x0F).float()) * 0.5
    return _signed(db, _rows(_grid("IQ3_XXS", idx.device), idx), _ksign_rows(aux))


@register("IQ3_S")
def iq3_s(p: Planes) -> torch.Tensor:
    qs = _bytes(p, "qs")
    idx = qs.int() | (_bitfields(_bytes(p, "qh"), tuple(range(8)), 0x01).int() << 8)
    # gguf-py forms 1 + 2 * scale in integers (exact), then one float multiply
    db = _d(p) * (1 + 2 * _nibbles(_bytes(p, "scales")).int()).float()
    signs = _rows(_byte_signs(qs.device), _bytes(p, "signs"))
    return _signed(db, _rows(_grid("IQ3_S", qs.device), idx), signs)


# -- 1-bit lattices: dl * (grid + delta) ------------------------------------------------
# An index into _iq1_shifted_grid is the 11-bit grid index with bit 11 set for delta < 0.


@register("IQ1_S")
def iq1_s(p: Planes) -> torch.Tensor:
    # a 16-bit word per 32 weights: four 3-bit index highs, a 3-bit scale, the delta's sign
    qh = _u16(p["qh"])
    dl = _d(p) * (2 * ((qh >> 12) & 0x07) + 1).float()
    highs = _bitfields(qh, (0, 3, 6, 9), 0x07).view(-1, 8, 4) | ((qh >> 15) << 3).unsqueeze(-1)
    idx = _bytes(p, "qs").int() | (highs.view(-1, 32) << 8)
    return _per_group(dl, _rows(_iq1_shifted_grid(idx.device), idx))


@register("IQ1_M")
def iq1_m(p: Planes) -> torch.Tensor:
    s = _u16(p["scales"])  # [M, 4]: four 3-bit scales each, and a nibble of the f16 d on top
    d_bits = (s >> 12) << _const((0, 4, 8, 12), s.dtype, s.device)  # disjoint: sum is OR
    d = d_bits.sum(-1, dtype=torch.int32).to(torch.int16).view(torch.float16).float()
    dl = d.unsqueeze(-1) * (2 * _bitfields(s, (0, 3, 6, 9), 0x07) + 1).float()
    # a qh nibble per 8 weights: 3 index high bits, then the delta's sign, so nibble << 8 is
    # exactly the index's part above the qs byte
    idx = _bytes(p, "qs").int() | (_nibbles(_bytes(p, "qh")).int() << 8)
    return _per_group(dl, _rows(_iq1_shifted_grid(idx.device), idx))
