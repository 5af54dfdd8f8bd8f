#!/usr/bin/env python3
"""A reference reader of gguf-repack output directories, written from FORMAT.md alone.

    python examples/read_rp1.py OUT_DIR TENSOR_NAME [--blocks FILE] [--npy FILE]

Checks the directory and the tensor in the order of FORMAT.md's section 9, rebuilds
the tensor's GGUF bytes from its planes (--blocks: exactly the bytes the source file held) and
dequantizes them to float32 (--npy: what gguf.quants.dequantize returns, in the tensor's torch
shape) for F32, F16, BF16, the legacy types and the K-quants. Bad input: one line `error: ...`
on stderr, exit 2.

It uses numpy and the standard library; xxhash for the checksums of manifest versions 2 and 3
(XXH3-128 is not in hashlib), and jsonschema, when installed, to check the manifest against
manifest.schema.json. It imports nothing of gguf-repack or gguf, on purpose: it shows that the
specification is enough.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import sys
from pathlib import Path

import numpy as np

FORMAT, LAYOUT_VERSION = "gguf-repack", 1
F32, I8 = np.float32, np.int8
CHECKSUM_BY_MANIFEST_VERSION = {1: "sha256", 2: "xxh3_128", 3: "xxh3_128"}
SHARD_NAME = re.compile(r"model-[0-9]{5}-of-[0-9]{5}\.safetensors")
SCHEMA = Path(__file__).resolve().parents[1] / "gguf_repack" / "format" / "manifest.schema.json"

# FORMAT.md, "Types". Plain types: id, safetensors dtype, bytes per element.
PLAIN = {"F32": (0, "F32", 4), "F16": (1, "F16", 2), "BF16": (30, "BF16", 2), "F64": (28, "F64", 8),
         "I8": (24, "I8", 1), "I16": (25, "I16", 2), "I32": (26, "I32", 4), "I64": (27, "I64", 8)}
# Quantized types: id, weights per block, fields in block order (f16/f32: a float; a number:
# that many bytes of anything else).
QUANTIZED = {
    "Q4_0": (2, 32, "d:f16 qs:16"), "Q4_1": (3, 32, "d:f16 m:f16 qs:16"),
    "Q5_0": (6, 32, "d:f16 qh:4 qs:16"), "Q5_1": (7, 32, "d:f16 m:f16 qh:4 qs:16"),
    "Q8_0": (8, 32, "d:f16 qs:32"), "Q8_1": (9, 32, "d:f32 s:f32 qs:32"),
    "Q2_K": (10, 256, "scales:16 qs:64 d:f16 dmin:f16"), "Q3_K": (11, 256, "hmask:32 qs:64 scales:12 d:f16"),
    "Q4_K": (12, 256, "d:f16 dmin:f16 scales:12 qs:128"),
    "Q5_K": (13, 256, "d:f16 dmin:f16 scales:12 qh:32 qs:128"),
    "Q6_K": (14, 256, "ql:128 qh:64 scales:16 d:f16"), "Q8_K": (15, 256, "d:f32 qs:256 bsums:32"),
    "IQ2_XXS": (16, 256, "d:f16 qs:64"), "IQ2_XS": (17, 256, "d:f16 qs:64 scales:8"),
    "IQ3_XXS": (18, 256, "d:f16 qs:96"), "IQ1_S": (19, 256, "d:f16 qs:32 qh:16"),
    "IQ4_NL": (20, 32, "d:f16 qs:16"), "IQ3_S": (21, 256, "d:f16 qs:64 qh:8 signs:32 scales:4"),
    "IQ2_S": (22, 256, "d:f16 qs:64 qh:8 scales:8"),
    "IQ4_XS": (23, 256, "d:f16 scales_h:2 scales_l:4 qs:128"),
    "IQ1_M": (29, 256, "qs:32 qh:16 scales:8"), "TQ1_0": (34, 256, "qs:48 qh:4 d:f16"),
    "TQ2_0": (35, 256, "qs:64 d:f16"), "MXFP4": (39, 32, "e:1 qs:16"), "NVFP4": (40, 64, "d:4 qs:32"),
    "Q1_0": (41, 128, "d:f16 qs:16"),
}
ST_ITEMSIZE = {"F16": 2, "BF16": 2, "F32": 4, "F64": 8, "I8": 1, "I16": 2, "I32": 4, "I64": 8, "U8": 1,
               "U16": 2, "U32": 4, "U64": 8, "BOOL": 1}


class Refused(Exception):
    """Input this reader must not trust: the message is the `error:` line."""


def fields(type_name: str) -> list[tuple[str, int, str]]:
    """(field, width in bytes, plane dtype) in block order; the dtype follows from the field
    alone: floats stay floats, other bytes are I32 words when the width allows, else I16, else U8."""
    out = []
    for spec in QUANTIZED[type_name][2].split():
        name, kind = spec.split(":")
        width = {"f16": 2, "f32": 4}.get(kind) or int(kind)
        dtype = kind.upper() if kind in ("f16", "f32") else (
            "I32" if width % 4 == 0 else "I16" if width % 2 == 0 else "U8")
        out.append((name, width, dtype))
    return out


def read_manifest(out: Path, schema: Path) -> tuple[dict, str]:
    path = out / "manifest.json"
    if not out.is_dir():
        raise Refused(f"{out}: not a directory")
    if not path.is_file():
        raise Refused(f"{out}: no manifest.json: not a complete gguf-repack output")
    try:
        manifest = json.loads(path.read_bytes().decode("utf-8"))
    except ValueError as e:  # JSON and UTF-8 errors alike
        raise Refused(f"{path}: unreadable ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise Refused(f"{path}: not a {FORMAT} manifest")
    version = manifest.get("format_version")
    if type(version) is not int or version not in CHECKSUM_BY_MANIFEST_VERSION:
        raise Refused(f"{path}: manifest version {version!r} is unknown to this reader "
                      f"(it reads {', '.join(map(str, CHECKSUM_BY_MANIFEST_VERSION))})")
    try:
        import jsonschema
    except ImportError:
        return manifest, "schema not checked: no jsonschema"
    if not schema.is_file():
        return manifest, f"schema not checked: no {schema}"
    error = jsonschema.exceptions.best_match(
        jsonschema.Draft202012Validator(json.loads(schema.read_text())).iter_errors(manifest))
    if error is not None:
        where = "/".join(map(str, error.absolute_path))
        raise Refused(f"{path}: does not follow the schema at /{where}: {error.message[:200]}")
    return manifest, "schema checked"


def check_config(out: Path) -> None:
    """config.json, when there is one, names this layout version (engines read it first)."""
    if not (out / "config.json").is_file():
        return
    try:
        q = json.loads((out / "config.json").read_text())["quantization_config"]
        ok = q["quant_method"] == "gguf_repack" and q["format_version"] == LAYOUT_VERSION
    except (ValueError, KeyError, TypeError):
        q, ok = "missing or unreadable", False
    if not ok:
        raise Refused(f"{out}/config.json: quantization_config {q} is not gguf_repack's layout "
                      f"version {LAYOUT_VERSION}")


def shard_entries(path: Path) -> dict[str, tuple[str, tuple, int]]:
    """{key: (dtype, shape, absolute offset)} of a safetensors file, its header checked."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        if size < 8 or n > size - 8:
            raise Refused(f"{path}: header length {n} does not fit the {size}-byte file")
        try:
            header = json.loads(f.read(n))
        except ValueError as e:
            raise Refused(f"{path}: unreadable safetensors header ({e})") from None
    if not isinstance(header, dict):
        raise Refused(f"{path}: the safetensors header is not a JSON object")
    header.pop("__metadata__", None)
    entries, spans = {}, []
    for key, e in header.items():
        try:
            (begin, end), shape = e["data_offsets"], tuple(e["shape"])
            ok = 0 <= begin and end - begin == ST_ITEMSIZE[e["dtype"]] * math.prod(shape)
        except (KeyError, TypeError, ValueError):
            ok = False
        if not ok:
            raise Refused(f"{path}: bad safetensors entry {key!r}: {e}")
        entries[key] = (e["dtype"], shape, 8 + n + begin)
        spans.append((begin, end))
    at = 0
    for begin, end in sorted(spans):  # the data is contiguous, without holes, and ends the file
        if begin != at:
            raise Refused(f"{path}: a hole or an overlap at data byte {begin}")
        at = end
    if 8 + n + at != size:
        raise Refused(f"{path}: the data ends at byte {8 + n + at} of a {size}-byte file")
    return entries


def tensor_bytes(out: Path, manifest: dict, t: dict) -> np.ndarray:
    """The tensor's GGUF bytes, rebuilt from its planes once its record and shard are checked."""
    name, type_name, shape = t["name"], t["type"], t["shape"]
    if type_name in PLAIN:
        type_id, dtype, type_size = PLAIN[type_name]
        block_size, layout = 1, "plain"
    elif type_name in QUANTIZED:
        type_id, block_size, _ = QUANTIZED[type_name]
        layout, type_size = "rp1", sum(w for _, w, _ in fields(type_name))
    else:
        raise Refused(f"tensor {name!r}: type {type_name!r} is unknown to this reader")
    if t["type_id"] != type_id or t["layout"] != layout:
        raise Refused(f"tensor {name!r}: {type_name} is type id {type_id}, layout {layout!r}; "
                      f"the manifest says {t['type_id']}, {t['layout']!r}")
    if (not 1 <= len(shape) <= 4 or not all(type(d) is int and d > 0 for d in shape)
            or shape != t["ggml_dims"][::-1] or shape[-1] % block_size):
        raise Refused(f"tensor {name!r}: shape {shape} is not ggml_dims {t['ggml_dims']} "
                      f"reversed, in whole {block_size}-weight blocks")
    nbytes = math.prod(shape) // block_size * type_size
    if t["source"]["nbytes"] != nbytes or not 0 <= t["source"]["file"] < len(manifest["sources"]):
        raise Refused(f"tensor {name!r}: source {t['source']} is not {nbytes} bytes of a source")
    if layout == "plain":
        expected = [("data", dtype, shape, type_size)]
    else:
        *lead, n, k = [1, *shape] if len(shape) == 1 else shape  # a 1-D tensor is one row
        b = k // block_size
        expected = [(f, dtype, [*lead, b, n, w // ST_ITEMSIZE[dtype]], w)
                    for f, w, dtype in fields(type_name)]
    planes = [(p["field"], p["dtype"], p["shape"]) for p in t["planes"]]
    if planes != [e[:3] for e in expected]:  # the type's fields in block order, dtypes, shapes
        raise Refused(f"tensor {name!r}: planes {planes} are not {type_name}'s "
                      f"{[e[:3] for e in expected]}")
    shard = t["shard"]  # a name of FORMAT.md's, so never a path out of the directory
    if not SHARD_NAME.fullmatch(shard) or shard not in manifest["shards"] or not (out / shard).is_file():
        raise Refused(f"tensor {name!r}: shard {shard!r} is not a listed file of {out}")
    entries = shard_entries(out / shard)
    data, at = np.empty(nbytes, np.uint8), 0
    for (_, dtype, plane_shape, width), key in zip(expected, [p["key"] for p in t["planes"]]):
        if entries.get(key, (None, None))[:2] != (dtype, tuple(plane_shape)):
            raise Refused(f"{out / shard}: entry {key!r} is {entries.get(key)}, not {dtype} "
                          f"{plane_shape}")
        size = ST_ITEMSIZE[dtype] * math.prod(plane_shape)
        raw = np.fromfile(out / shard, np.uint8, size, offset=entries[key][2])
        if layout == "plain":
            data[:] = raw
        else:  # plane [E..., B, N, count]: at [E..., b, n] the field of row n's block b
            blocks = data.reshape(-1, n, b, type_size)  # GGUF's order: [E..., N, B, type_size]
            blocks[..., at : at + width] = raw.reshape(-1, b, n, width).swapaxes(-2, -3)
            at += width
    return data


def check_checksum(manifest: dict, t: dict, data: np.ndarray) -> str:
    algorithm = CHECKSUM_BY_MANIFEST_VERSION[manifest["format_version"]]
    if algorithm == "sha256":
        found = hashlib.sha256(data).hexdigest()
    else:
        try:
            import xxhash
        except ImportError:
            raise Refused("manifest versions 2 and 3 checksum tensors with XXH3-128: "
                          "pip install xxhash") from None
        found = xxhash.xxh3_128(data).hexdigest()
    if found != t["source"].get(algorithm):
        raise Refused(f"tensor {t['name']!r}: {algorithm} {found}, the manifest says "
                      f"{t['source'].get(algorithm)}: the planes are damaged")
    return algorithm


def dequantize(type_name: str, data: np.ndarray, shape: list[int]) -> np.ndarray | None:
    """float32 weights, by FORMAT.md's decoding rules (gguf-py's operations, bit for bit)."""
    if type_name == "BF16":
        return (data.view("<u2").astype(np.uint32) << 16).view(F32).reshape(shape)
    if type_name in ("F32", "F16"):
        return data.view("<f4" if type_name == "F32" else "<f2").astype(F32).reshape(shape)
    if type_name not in DECODE:
        return None
    specs = fields(type_name)
    blocks = data.reshape(-1, sum(w for _, w, _ in specs))
    f, at = {}, 0
    for name, width, dtype in specs:  # each field of every block: [M, width] bytes; f16: float32 [M, 1]
        f[name] = blocks[:, at : at + width]
        if dtype == "F16":
            f[name] = np.ascontiguousarray(f[name]).view("<f2").astype(F32)
        at += width
    with np.errstate(all="ignore"):  # a NaN or inf scale gives NaN and inf weights, as in gguf-py
        return DECODE[type_name](f).reshape(shape)


def nibbles(x, groups):  # [M, n] bytes as `groups` runs -> per run, every low nibble, then every high
    shifts = np.array([0, 4], np.uint8).reshape(2, 1)
    return ((x.reshape(len(x), groups, 1, -1) >> shifts) & 15).reshape(len(x), -1)


def crumbs(x, groups):  # the same for 2-bit fields: per run, shifts 0, 2, 4 and 6
    shifts = np.array([0, 2, 4, 6], np.uint8).reshape(4, 1)
    return ((x.reshape(len(x), groups, 1, -1) >> shifts) & 3).reshape(len(x), -1)


def bitplanes(x):  # [M, 32] bytes -> [M, 256]: bit s of byte j at 32 s + j
    bits = np.unpackbits(x, axis=1, bitorder="little").reshape(len(x), 32, 8)
    return bits.swapaxes(1, 2).reshape(len(x), -1)


def q5(f):  # Q5_0/Q5_1: nibble i, and bit i of qh (a little-endian uint32) as its fifth bit
    return nibbles(f["qs"], 1) | (np.unpackbits(f["qh"], axis=1, bitorder="little") << 4)


def k_scales_mins(s):  # Q4_K/Q5_K: 12 bytes -> 8 six-bit scales and 8 six-bit mins, [M, 8, 1]
    lo, mn, hi = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    scales = np.concatenate([lo & 63, (hi & 15) | ((lo >> 2) & 48)], axis=1)
    mins = np.concatenate([mn & 63, (hi >> 4) | ((mn >> 2) & 48)], axis=1)
    return scales.astype(F32)[:, :, None], mins.astype(F32)[:, :, None]


def sub_blocks(q, n):  # [M, 256] quants -> float32 [M, n, 256 / n]
    return q.reshape(len(q), n, -1).astype(F32)


def q2_k(f):
    sc = f["scales"][:, :, None]
    return ((f["d"][:, :, None] * (sc & 15).astype(F32)) * sub_blocks(crumbs(f["qs"], 2), 16)
            - f["dmin"][:, :, None] * (sc >> 4).astype(F32))


def q3_k(f):
    s = f["scales"]
    scales = ((nibbles(s[:, :8], 1) | (crumbs(s[:, 8:], 1) << 4)).astype(I8) - 32).astype(F32)
    q = crumbs(f["qs"], 2).astype(I8) - ((bitplanes(f["hmask"]) ^ 1) << 2).astype(I8)
    return (f["d"][:, :, None] * scales[:, :, None]) * sub_blocks(q, 16)


def q4_k(f, q=None):
    scales, mins = k_scales_mins(f["scales"])
    q = nibbles(f["qs"], 4) if q is None else q
    return (f["d"][:, :, None] * scales) * sub_blocks(q, 8) - f["dmin"][:, :, None] * mins


def q6_k(f):
    q = (nibbles(f["ql"], 2) | (crumbs(f["qh"], 2) << 4)).astype(I8) - 32
    return (f["d"][:, :, None] * f["scales"].view(I8).astype(F32)[:, :, None]) * sub_blocks(q, 16)


DECODE = {
    "Q4_0": lambda f: f["d"] * (nibbles(f["qs"], 1).astype(I8) - 8).astype(F32),
    "Q4_1": lambda f: f["d"] * nibbles(f["qs"], 1).astype(F32) + f["m"],
    "Q5_0": lambda f: f["d"] * (q5(f).astype(I8) - 16).astype(F32),
    "Q5_1": lambda f: f["d"] * q5(f).astype(F32) + f["m"],
    "Q8_0": lambda f: f["d"] * f["qs"].view(I8).astype(F32),
    "Q2_K": q2_k, "Q3_K": q3_k, "Q4_K": q4_k,
    "Q5_K": lambda f: q4_k(f, nibbles(f["qs"], 4) | (bitplanes(f["qh"]) << 4)),
    "Q6_K": q6_k,
}
FLOAT32 = ["F32", "F16", "BF16", *DECODE]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="a gguf-repack output directory")
    parser.add_argument("tensor", help="the GGUF name of one of its tensors")
    parser.add_argument("--blocks", type=Path, help="write the tensor's GGUF bytes here")
    parser.add_argument("--npy", type=Path, help="write its float32 weights here (.npy)")
    parser.add_argument("--schema", type=Path, default=SCHEMA,
                        help="manifest.schema.json (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        manifest, schema_note = read_manifest(args.out, args.schema)
        check_config(args.out)
        try:
            records = [t for t in manifest["tensors"] if t["name"] == args.tensor]
            if len(records) != 1:
                raise Refused(f"{args.out}: {len(records)} tensors named {args.tensor!r} in the manifest")
            data = tensor_bytes(args.out, manifest, records[0])
        except (KeyError, TypeError, ValueError, AttributeError) as e:  # without jsonschema
            raise Refused(f"{args.out}/manifest.json: malformed ({type(e).__name__}: {e})") from None
        t = records[0]
        algorithm = check_checksum(manifest, t, data)
        if args.blocks:
            data.tofile(args.blocks)
        if args.npy:
            weights = dequantize(t["type"], data, t["shape"])
            if weights is None:
                raise Refused(f"--npy: this reader dequantizes {' '.join(FLOAT32)}, not {t['type']}"
                              + (f" (its GGUF bytes are in {args.blocks})" if args.blocks else ""))
            np.save(args.npy, weights)
    except (Refused, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{t['name']}: {t['type']} {t['shape']} from {t['shard']}, {algorithm} checked "
          f"(manifest version {manifest['format_version']}, {schema_note})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
