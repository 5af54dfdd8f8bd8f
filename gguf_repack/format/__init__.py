"""The rp1 format, which every other stage reads: the GGML type table (one record per quant
type: block size, fields, plane dtypes), the planar layout (`pack`/`unpack`, the one place
that re-tiles blocks), the manifest (records, checksums, quantization config) and the
safetensors files the planes are stored in."""
