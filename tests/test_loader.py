"""load() and QTensor on the torch backend: exact against gguf-py, structural ops exact."""

import os
import subprocess
import sys

import gguf
import gguf.quants
import numpy as np
import pytest
import torch
from ggml_blocks import every_type_tensors, tensor_bytes, write_gguf
from gguf.constants import GGMLQuantizationType
from test_dequant import REFERENCE_TYPES, assert_bitwise_equal

import gguf_repack
from gguf_repack import FormatError, QTensor, RepackError, convert, load


@pytest.fixture
def every_type_out(tmp_path, rng):
    src = write_gguf(tmp_path / "m.gguf", every_type_tensors(rng))
    out = tmp_path / "out"
    convert(src, out)
    return src, out


def reference(reader_tensor) -> np.ndarray:
    """gguf-py's dequantization of a tensor's source bytes, in torch shape."""
    qtype = GGMLQuantizationType(int(reader_tensor.tensor_type))
    return gguf.quants.dequantize(np.asarray(reader_tensor.data), qtype).reshape(
        [int(d) for d in reversed(reader_tensor.shape)])


def test_every_tensor_loads_exactly(every_type_out):
    src, out = every_type_out
    model = load(out)
    reader = gguf.GGUFReader(src)
    assert list(model) == [t.name for t in reader.tensors]
    for t in reader.tensors:
        value = model[t.name]
        qtype = GGMLQuantizationType(int(t.tensor_type))
        shape = [int(d) for d in reversed(t.shape)]
        if isinstance(value, QTensor):
            assert list(value.shape) == shape and value.qtype.name == qtype.name
            assert value.nbytes == t.n_bytes
            if qtype.name not in REFERENCE_TYPES:
                with pytest.raises(NotImplementedError, match=qtype.name):
                    value.dequantize()
                continue
            expected = reference(t)
            got = value.dequantize()
            assert_bitwise_equal(got, expected)
            for dtype in (torch.float16, torch.bfloat16):
                assert torch.equal(value.dequantize(dtype), got.to(dtype))
        else:  # plain tensors come back as they were stored
            assert list(value.shape) == shape
            raw = np.asarray(t.data).view(np.uint8).tobytes()
            assert value.contiguous().view(torch.uint8).numpy().tobytes() == raw
            if qtype.name in ("F32", "F16", "BF16"):
                assert_bitwise_equal(value.float(), reference(t).astype(np.float32))


@pytest.mark.parametrize("name", REFERENCE_TYPES)
def test_matmul_embedding_rows_and_shards(name, tmp_path, rng):
    qtype = GGMLQuantizationType[name]
    bs = gguf.constants.GGML_QUANT_SIZES[qtype][0]
    n, k = 24, 4 * bs
    src = write_gguf(tmp_path / "m.gguf", {"w": (qtype, tensor_bytes(qtype, (n, k), rng))}, kvs=[])
    convert(src, tmp_path / "out")
    w = load(tmp_path / "out")["w"]
    dense = w.dequantize()

    for m in (1, 3, 17):
        x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32))
        y = w.matmul(x)
        ref = x @ dense.T
        assert y.shape == (m, n) and y.dtype == torch.float32
        assert ((y - ref).abs().max() / ref.abs().max()).item() <= 1e-5
    x3 = torch.randn(2, 5, k, dtype=torch.bfloat16)
    assert w.matmul(x3).shape == (2, 5, n) and w.matmul(x3).dtype == torch.bfloat16

    ids = torch.tensor([[3, 0, 23], [7, 7, 1]])
    emb = w.embedding(ids)
    assert emb.shape == (2, 3, k) and torch.equal(emb, dense[ids])
    assert torch.equal(w.embedding(ids, dtype=torch.float16), dense[ids].half())

    perm = torch.randperm(n)
    assert torch.equal(w.index_rows(perm).dequantize(), dense[perm])
    blocks = torch.randperm(k // w.block_size)  # columns reordered by whole blocks
    columns = (blocks[:, None] * w.block_size + torch.arange(w.block_size)).reshape(-1)
    assert torch.equal(w.index_blocks(blocks).dequantize(), dense[:, columns])

    rows = [w.shard(0, r, 4) for r in range(4)]
    assert torch.equal(torch.cat([p.dequantize() for p in rows]), dense)
    cols = [w.shard(-1, r, 2) for r in range(2)]
    assert torch.equal(torch.cat([p.dequantize() for p in cols], dim=1), dense)
    x = torch.randn(3, k)
    summed = sum(p.matmul(xp) for p, xp in zip(cols, x.chunk(2, dim=1)))
    ref = x @ dense.T
    assert ((summed - ref).abs().max() / ref.abs().max()).item() <= 1e-5
    with pytest.raises(RepackError, match="block boundaries"):
        w.shard(1, 0, 8 if bs > 1 else 3)
    with pytest.raises(RepackError, match="evenly"):
        w.shard(0, 0, 5)


def test_expert_stacks(every_type_out):
    _, out = every_type_out
    model = load(out)
    stack = model["blk.1.ffn_up_exps.q4_k"]
    assert len(stack.shape) == 3
    whole = stack.dequantize()
    for e in range(stack.shape[0]):
        assert torch.equal(stack.expert(e).dequantize(), whole[e])
    with pytest.raises(RepackError, match="expert"):
        stack.matmul(torch.randn(1, stack.shape[-1]))


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("name", ["q4_k", "q8_0", "mxfp4"])
def test_expert_products_match_a_per_token_reference_on_gguf_py_weights(every_type_out, name, backend):
    """expert_matmul against plain PyTorch on gguf-py's dequantization of the source bytes:
    each (token, slot) times its expert, one input per token (gate/up) or per slot (down); -1
    (another rank's expert) gives zeros; experts no token chose are never dequantized."""
    src, out = every_type_out
    stack = load(out)[f"blk.1.ffn_up_exps.{name}"]
    ref = torch.from_numpy(reference(next(t for t in gguf.GGUFReader(src).tensors
                                          if t.name == f"blk.1.ffn_up_exps.{name}")).copy())
    experts, n, k = stack.shape
    ids = torch.tensor([[2, 0], [0, 2], [2, -1], [0, 0], [2, 0]])
    gen = torch.Generator().manual_seed(1)
    for x in (torch.randn(5, k, generator=gen), torch.randn(5, 2, k, generator=gen)):
        got = stack.expert_matmul(x, ids, backend=backend)
        assert got.shape == (5, 2, n)
        for t in range(5):
            for j in range(2):
                e = int(ids[t, j])
                want = torch.zeros(n) if e < 0 else (x[t] if x.dim() == 2 else x[t, j]) @ ref[e].T
                # float32 sums in another order: within 1e-5 of the largest value
                torch.testing.assert_close(got[t, j], want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))

    class Counting(QTensor):
        seen = []

        def expert(self, e):
            Counting.seen.append(e)
            return super().expert(e)

    if backend == "torch":  # (the Triton one has no tile for them: tests/test_kernels.py)
        Counting(stack.qtype, stack.shape, stack.planes).expert_matmul(torch.randn(5, k), ids)
        assert sorted(Counting.seen) == [0, 2]  # expert 1 and 3: chosen by no token, never read
    with pytest.raises(RepackError, match="expert ids must be in -1..3"):
        stack.expert_matmul(torch.randn(1, k), torch.tensor([[4]]))
    with pytest.raises(RepackError, match="do not fit"):
        stack.expert_matmul(torch.randn(2, k), torch.tensor([[0]]))
    assert stack.expert_matmul(torch.randn(0, k), torch.zeros(0, 2, dtype=torch.long)).shape == (0, 2, n)


def test_expert_parallel_shards_and_joined_rows_are_exact(every_type_out):
    from gguf_repack.runtime.qtensor import join_rows

    _, out = every_type_out
    stack = load(out)["blk.1.ffn_up_exps.q4_k"]
    whole = stack.dequantize()
    for rank in range(2):
        piece = stack.shard(0, rank, 2)
        assert piece.shape == (2, *stack.shape[1:])
        assert torch.equal(piece.dequantize(), whole[2 * rank:2 * rank + 2])
    for rank in range(3):  # N of every expert (tensor parallel)
        assert torch.equal(stack.shard(1, rank, 3).dequantize(), whole[:, rank:rank + 1])
    with pytest.raises(RepackError, match="4 experts cannot be split evenly 3 ways"):
        stack.shard(0, 0, 3)
    joined = join_rows([stack, stack.index_rows([2, 0])])
    assert joined.shape == (4, 5, stack.shape[-1])
    assert torch.equal(joined.dequantize(), torch.cat([whole, whole[:, [2, 0]]], dim=1))
    with pytest.raises(RepackError, match="join_rows"):
        join_rows([stack, load(out)["blk.1.ffn_up_exps.q8_0"]])


def test_touching_one_tensor_reads_only_that_tensor(every_type_out):
    _, out = every_type_out
    model = load(out)
    assert model.loaded == []
    model["blk.0.q4_k.weight"]
    assert model.loaded == ["blk.0.q4_k.weight"]


def test_metadata_and_config(every_type_out):
    _, out = every_type_out
    model = load(out)
    assert model.metadata["general.architecture"] == "llama"
    assert model.metadata["test.arr_str"] == ["a", "", "ünïcode", "x" * 300]
    assert model.config is None  # config.json comes with the engine files
    assert model.manifest["format"] == "gguf-repack"


def test_verify_on_load_catches_damage(every_type_out):
    _, out = every_type_out
    load(out, verify=True)
    shard = next(out.glob("model-*.safetensors"))
    data = bytearray(shard.read_bytes())
    data[-3] ^= 0xFF  # the last bytes of the data section belong to some tensor
    shard.write_bytes(bytes(data))
    with pytest.raises(FormatError, match="verify failed"):
        load(out, verify=True)


def test_backend_choice(every_type_out):
    _, out = every_type_out
    w = load(out)["blk.0.q8_0.weight"]
    assert torch.equal(w.dequantize(backend="torch"), w.dequantize(backend="auto"))
    # the test session runs Triton's interpreter (conftest), so the kernels run on CPU here
    assert torch.equal(w.dequantize(backend="triton"), w.dequantize(backend="torch"))
    # a 1-D quantized tensor is one row (format.layout.as_rows), for both backends
    row = QTensor(w.qtype, (w.shape[1],), {f: p[:, :1] for f, p in w.planes.items()})
    assert row.dequantize(backend="triton").shape == (w.shape[1],)
    assert torch.equal(row.dequantize(backend="triton"), w.dequantize(backend="torch")[0])
    assert torch.equal(row.dequantize(backend="torch"), w.dequantize(backend="torch")[0])
    with pytest.raises(ValueError, match="unknown backend"):
        w.dequantize(backend="cuda")


def test_load_refuses_what_is_not_an_output(tmp_path):
    with pytest.raises(FormatError, match="manifest.json"):
        gguf_repack.load(tmp_path)  # the package's public name for the loader


@pytest.mark.parametrize("model_name", ["SmolLM2-135M-Instruct.Q4_1.gguf",
                                        "gemma-3-270m-q4_k_m.gguf"])
def test_real_model_tensors_dequantize_exactly(model_name, real_models, converted):
    reader = gguf.GGUFReader(real_models[model_name])
    model = load(converted[model_name])
    quantized = 0
    for t in reader.tensors:
        value = model[t.name]
        if isinstance(value, QTensor):
            assert_bitwise_equal(value.dequantize(), reference(t))
            quantized += 1
    assert quantized > 0


def test_triton_backend_needs_cuda_or_the_interpreter(every_type_out, tmp_path):
    _, out = every_type_out
    code = ("import sys, gguf_repack; w = gguf_repack.load(sys.argv[1])['blk.0.q8_0.weight']\n"
            "try:\n    w.dequantize(backend='triton')\nexcept gguf_repack.RepackError as e:\n"
            "    print(e)\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True,
                          text=True, env=env, check=True)
    assert "CUDA tensors" in proc.stdout and "TRITON_INTERPRET=1" in proc.stdout
