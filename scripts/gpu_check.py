#!/usr/bin/env python3
"""The prepared GPU check: one command, meant to finish in under 8 minutes on one H200 with
only what that machine has (torch, Triton, accelerate) and what travels with the working tree
as wheels: gguf, and transformers 5.19 (the machine's 5.17 writes no config.json for the
model part's llama). Here: `pip download --no-deps --only-binary=:all: --python-version 3.12
-d .whl gguf==0.19.0 transformers==5.19.0`; there: `pip install --no-index --no-deps --target
/tmp/site .whl/*.whl` and PYTHONPATH=/tmp/site:. (BENCHMARKS.md "GPU" has the runs so far).

    python scripts/gpu_check.py --out gpu-check            # a CUDA machine
    python scripts/gpu_check.py --smoke --out DIR          # CPU, Triton's interpreter, tiny
                                                           # shapes: checks this script

Writes gpu_check.json and gpu_check.md into --out after each of its four parts, in the order
below, so that a run stopped early keeps what it found. --deadline (seconds from the start)
bounds the whole run: the kernels part takes at most 45% of it (a type not done by then is
reported as such), the bench and the tune are stopped at their shares:

1. kernels: every type's planes (random valid blocks) on the device; dequantize and embedding
   bit for bit equal to the torch backend on the same device, matmul within tolerance of x @
   (the torch backend's dense weight).T at M in 0, 1, 3, 8, 16, 24, 33, 100, 256, 2048, and the expert
   products of a 16-expert stack (decode: 1 and 8 tokens of 8 experts each; 256 and 2048
   tokens of 2) against plain PyTorch; float32, float16 and bfloat16 x; for Q4_K, Q8_0, MXFP4
   and IQ4_XS, the dense and expert products in bfloat16 captured in CUDA graphs at 1, 8, 64
   and 512 tokens and replayed with other routings (check_graphs); the fused GEMM's kept split-K
   workspaces all zero after (each launch leaves its own zeroed); every failure named.
2. model: a 2-layer llama written here with GGUFWriter (projections in a mix of legacy and
   K-quant types, as a Q4_K_M file has; tests/hf_models.py), converted, loaded with
   gguf_repack.hf.load_model on the device: its 32 greedy tokens against the torch backend's
   on CPU, decode tokens/s at batch 1 and 32 and prefill tokens/s at 2048 tokens, beside the
   same file through transformers' own GGUF path asked for fp16, moved to the device (it
   dequantized to fp16 before transformers 5.19; 5.19 keeps the weights packed and casts).
   Then a 2-layer Qwen3-MoE, its experts quantized: greedy tokens on the device in float32
   against the CPU's, and in load_model's default dtype there (bfloat16).
3. bench: scripts/bench_gpu.py --short for Q4_0, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_XS: first their
   expert products (a 128-expert stack, 1 to 256 tokens of 8 experts: the touched experts'
   bytes against the copy bandwidth, each product's launches by the profiler, and beside it
   the path configs.MOE_RULE does not take there, where the experts get over a row each), then
   every M of the batch sweep (inspect_kernels.py --batch-sweep estimates the same; its own
   bench_gpu.json / .md in --out/bench).
4. tune: scripts/tune_kernels.py for the same six types, compiles for 60% of what is left
   of the deadline at most (then it starts no new type): each tile kind's candidates
   (gguf_repack_kernels/configs.py) timed against the default tile; the fastest into
   --out/tune/tuned_configs.json, to commit as gguf_repack_kernels/tuned_configs.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# every path and tile the rule takes (configs.matmul_choice): the GEMV, BM = 16, 32 (M = 24),
# 64 (33), dequantize+matmul (100 and up: past configs.FUSED_MAX_M); M not a multiple of any tile
MS = [0, 1, 3, 8, 16, 24, 33, 100, 256, 2048]
SMOKE_MS = [0, 1, 3, 16]


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("gpu-check"))
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--types", default=None, help="comma-separated subset (kernels part)")
    ap.add_argument("--skip", default="", help="parts to leave out: kernels,bench,tune,model")
    ap.add_argument("--deadline", type=float, default=480.0,
                    help="seconds for the whole run (on a GPU; --smoke has none)")
    return ap.parse_args()


ARGS = parse() if __name__ == "__main__" else None
if ARGS is not None and ARGS.smoke:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
sys.path.insert(0, str(ROOT / "tests"))  # random valid blocks and the model writer

import numpy as np  # noqa: E402
import torch  # noqa: E402

import gguf_repack_kernels as kernels  # noqa: E402
from gguf_repack.format.layout import pack  # noqa: E402
from gguf_repack.format.type_table import TYPES_BY_NAME  # noqa: E402
from gguf_repack.runtime.dequant import dequantize_planes  # noqa: E402


def relative_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    scale = ref.abs().max().item()
    return (got.float() - ref).abs().max().item() / scale if scale else got.abs().max().item()


def check_type(name: str, device: str, ms: list[int], smoke: bool) -> list[dict]:
    """One row per (family, M) of type `name`: ok, and what failed."""
    from ggml_blocks import as_q8_0, random_blocks

    device = torch.device(device)
    rng = np.random.default_rng(0)
    qtype = TYPES_BY_NAME[name]
    n, k = (32, 2 * qtype.block_size) if smoke else (512, 1024)
    rows = []

    def row(family, m, fn):
        try:
            problem = fn()
        except Exception as e:  # a failure is reported, not raised: the check goes on
            problem = f"{type(e).__name__}: {e}".splitlines()[0][:300]
        rows.append({"type": name, "family": family, "M": m, "ok": problem is None,
                     "problem": problem})

    blocks = random_blocks(qtype.id, (n, k), rng)
    planes = {f: torch.from_numpy(v).to(device) for f, v in pack(blocks, qtype).items()}
    dense = dequantize_planes(planes, qtype).reshape(n, k)  # the torch backend, same device

    def dequantize():
        got = kernels.dequantize(planes, name, (n, k))
        if not torch.equal(got.view(torch.int32), dense.view(torch.int32)):
            return f"{(got != dense).sum().item()} of {dense.numel()} values differ"

    def embedding():
        ids = torch.tensor([[0, n - 1, 5], [5, 5, 2]], device=device)
        if not torch.equal(kernels.embedding(ids, planes, name, (n, k)), dense[ids]):
            return "rows differ"

    row("dequantize", None, dequantize)
    row("embedding", None, embedding)
    for m in ms:
        def matmul(m=m):
            x = torch.randn(m, k, device=device, dtype=torch.float32)
            problems = []
            for dtype, tol in ((torch.float32, 1e-4), (torch.float16, 1e-2), (torch.bfloat16, 1e-2)):
                xd = x if dtype == torch.float32 else (x / dense.abs().max()).to(dtype)
                xr = xd.float()
                if kernels.FORMATS[name].x_int8 and kernels.dispatch.matmul_path(name, m) == "gemv":
                    # this type's GEMV multiplies x as gguf-py's Q8_0 stores it
                    xr = torch.from_numpy(as_q8_0(xr.cpu().numpy())).to(device)
                ref = xr @ dense.T
                got = kernels.matmul(xd, planes, name, (n, k))
                if got.shape != (m, n) or got.dtype != dtype:
                    problems.append(f"{dtype}: shape {tuple(got.shape)} dtype {got.dtype}")
                elif m and relative_error(got, ref) > tol:
                    problems.append(f"{dtype}: relative error {relative_error(got, ref):.2e} > {tol}")
            return "; ".join(problems) or None
        row("matmul", m, matmul)

    # expert products (gguf_repack_kernels/moe.py): a stack of E experts, tokens routed to k of them, at
    # decode (the GEMV a pair), with longer runs an expert (the tiles) and prefill's long runs
    # (each chosen expert dequantized, then torch.matmul: 256 rows an expert)
    experts = 4 if smoke else 16
    stack_blocks = random_blocks(qtype.id, (experts, n, k), rng)
    stack = {f: torch.from_numpy(v).to(device) for f, v in pack(stack_blocks, qtype).items()}
    stack_dense = dequantize_planes(stack, qtype).reshape(experts, n, k)
    for tokens, top in ((1, 2), (24, 2)) if smoke else ((1, 8), (8, 8), (256, 2), (2048, 2)):
        def expert_matmul(tokens=tokens, top=top):
            gen = torch.Generator().manual_seed(tokens)
            ids = torch.stack([torch.randperm(experts, generator=gen)[:top]
                               for _ in range(tokens)]).to(device)
            x = torch.randn(tokens, k, device=device) / stack_dense.abs().max()
            xr = x
            gemv = kernels.dispatch.expert_path(name, tokens, top, experts) == "gemv"
            if kernels.FORMATS[name].x_int8 and gemv:
                xr = torch.from_numpy(as_q8_0(x.cpu().numpy())).to(device)
            # every token times every expert, then each slot's: no (T, k, N, K) gather
            every = torch.einsum("tk,enk->ten", xr, stack_dense)
            ref = every.gather(1, ids[..., None].expand(-1, -1, n))
            got = kernels.expert_matmul(x, ids, stack, name, (experts, n, k))
            if got.shape != (tokens, top, n):
                return f"shape {tuple(got.shape)}"
            if relative_error(got, ref) > 1e-4:
                return f"relative error {relative_error(got, ref):.2e} > 1e-4"
        row("expert_matmul", tokens * top, expert_matmul)
    if name in GRAPH_TYPES:
        check_graphs(row, name, device, planes, (n, k), stack, (experts, n, k), smoke)

    def workspaces():  # the fused GEMM's kept split-K workspaces, left zeroed by every launch
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dirty = [key for key, w in kernels.dispatch._CLEAN_WORKSPACES.items() if w.any()]
        if dirty:
            return f"split-K workspaces not left zeroed: {dirty}"
    row("split-K workspace", None, workspaces)
    print(f"kernels {name}: {sum(not r['ok'] for r in rows)} failures", file=sys.stderr, flush=True)
    return rows


# the types whose products are also captured in CUDA graphs (each adds ~10 bf16 compiles)
GRAPH_TYPES = ("Q4_K", "Q8_0", "MXFP4", "IQ4_XS")
GRAPH_TOKENS = (1, 8, 64, 512)


def captured(fn, inputs: list[torch.Tensor], device: torch.device):
    """fn(*inputs) captured in a CUDA graph as vLLM captures a step (warm-up runs on a side
    stream first, then torch.cuda.graph): a function that replays it and returns the graph's
    output tensor. On CPU (--smoke) no graph: the function runs fn again, the same steps."""
    if device.type != "cuda":
        return lambda: fn(*inputs)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn(*inputs)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(*inputs)

    def replay():
        graph.replay()
        return out
    return replay


def check_graphs(row, name, device, planes, shape, stack, stack_shape, smoke) -> None:
    """The dense product and the expert products (x per token as for gate and up, per slot as
    for down) in bfloat16 at 1, 8, 64 and 512 tokens, each captured in a CUDA graph with one
    routing and replayed with the inputs changed in place: other random routings, all tokens
    on the same experts (the most skewed), some ids -1 (another rank's); every replay against
    the same call run eagerly. A capture that synchronizes raises; a launch sized from the
    captured routing gives wrong rows on replay."""
    n, k = shape
    experts = stack_shape[0]
    top = 2 if smoke else 4
    for tokens in (1,) if smoke else GRAPH_TOKENS:  # the interpreter: minutes at 8
        def graphs(tokens=tokens):
            gen = torch.Generator().manual_seed(100 + tokens)

            def routing(kind):
                if kind == "skewed":
                    return torch.arange(top).repeat(tokens, 1).to(device)
                ids = torch.stack([torch.randperm(experts, generator=gen)[:top] for _ in range(tokens)])
                if kind == "some -1":
                    ids[::3, -1] = -1
                return ids.to(device)

            def x_of(*lead):
                return (torch.randn(*lead, k, generator=gen) / 8).to(device, torch.bfloat16)

            cases = [("dense", lambda x: kernels.matmul(x, planes, name, shape), [x_of(tokens)], None)]
            for label, lead in (("experts x per token", (tokens,)), ("experts x per slot", (tokens, top))):
                cases.append((label, lambda x, ids: kernels.expert_matmul(x, ids, stack, name, stack_shape),
                              [x_of(*lead), routing("random")], lead))
            problems = []
            for label, fn, inputs, lead in cases:
                replay = captured(fn, inputs, device)
                for kind in ("random", "skewed", "some -1") if lead else ("random",):
                    new = [x_of(*(lead or (tokens,)))] + ([routing(kind)] if lead else [])
                    for static, value in zip(inputs, new):
                        static.copy_(value)
                    got = replay().clone()
                    want = fn(*new)
                    if relative_error(got, want.float()) > 2e-2:
                        problems.append(f"{label}, {kind} routing: replay differs from eager by "
                                        f"{relative_error(got, want.float()):.2e}")
            return "; ".join(problems) or None
        row("graph bf16", tokens, graphs)


def check_kernels(device: torch.device, types: list[str], smoke: bool, until: float) -> list[dict]:
    """check_type for every type; on a GPU in a process a type, all but two cores at once:
    each type compiles tens of kernel variants, and compiling, not running, is what takes the
    time. A type not done by `until` (perf_counter), or whose process died, is one failed row."""
    ms = SMOKE_MS if smoke else MS
    if smoke:
        return [r for name in types for r in check_type(name, "cpu", ms, True)]
    import multiprocessing

    workers = max(1, min(len(types), (os.cpu_count() or 3) - 2))
    pool = multiprocessing.get_context("spawn").Pool(workers)
    try:
        pending = {name: pool.apply_async(check_type, (name, str(device), ms, False))
                   for name in types}
        rows = []
        for name, result in pending.items():
            try:
                rows += result.get(timeout=max(0.0, until - time.perf_counter()))
            except multiprocessing.TimeoutError:
                rows.append({"type": name, "family": "all", "M": None, "ok": False,
                             "problem": "not done by the deadline (or its process died)"})
            except Exception as e:  # the worker died (a crash inside CUDA, say)
                rows.append({"type": name, "family": "all", "M": None, "ok": False,
                             "problem": f"{type(e).__name__}: {e}"[:300]})
        return rows
    finally:
        pool.terminate()  # a type still compiling stops here


def run_script(name: str, args: list[str], timeout: float) -> dict:
    """scripts/NAME ARGS in a process of its own, stopped after `timeout` seconds: its command
    line, exit code ("timeout" if stopped) and seconds. Its output goes to this script's own,
    so the log of a run holds it."""
    cmd = [sys.executable, str(ROOT / "scripts" / name), *args]
    start = time.perf_counter()
    try:
        returncode = subprocess.run(cmd, timeout=max(1.0, timeout)).returncode
    except subprocess.TimeoutExpired:
        returncode = "timeout"
    return {"command": " ".join(cmd[1:]), "returncode": returncode,
            "seconds": round(time.perf_counter() - start, 1)}


def run_bench(out: Path, smoke: bool, timeout: float) -> dict:
    # the six types bench_gpu.py runs at every shape: the others' compiles would not fit
    return run_script("bench_gpu.py", ["--out", str(out)] + (
        ["--smoke", "--types", "Q4_0,Q4_K"] if smoke else
        ["--short", "--runs", "20", "--types", "Q4_0,Q8_0,Q4_K,Q5_K,Q6_K,IQ4_XS"]), timeout)


def run_tune(out: Path, smoke: bool, timeout: float) -> dict:
    """scripts/tune_kernels.py for the six types the bench runs, within 90 s of compiles
    (it starts no type after that): tuned_configs.json, to commit as
    gguf_repack_kernels/tuned_configs.json."""
    result = run_script("tune_kernels.py", ["--out", str(out)] + (
        ["--smoke", "--types", "Q4_0"] if smoke else
        ["--budget", str(max(10, int(timeout * 0.6))), "--types", "Q4_0,Q8_0,Q4_K,Q5_K,Q6_K,IQ4_XS"]),
        timeout)
    if result["returncode"] == 0:
        result["tiles"] = json.loads((out / "tuned_configs.json").read_text())["tiles"]
    return result


def timed(fn, device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def check_model(device: torch.device, work: Path, smoke: bool) -> dict:
    from hf_models import byte_tokenizer_kvs, write_model
    from transformers import AutoModelForCausalLM

    from gguf_repack import convert
    from gguf_repack.hf import load_model

    steps, batch, prefill = (1, 2, 8) if smoke else (32, 32, 2048)
    src = write_model(work / "small-llama.gguf", "llama", byte_tokenizer_kvs(),
                      np.random.default_rng(5), context_length=4096)
    out = work / "small-llama"
    convert(src, out)
    # float32 on the GPU too (load_model's default there is bfloat16): token for token with the CPU
    ours = load_model(out, device, dtype=torch.float32, backend="triton")  # (--smoke: the interpreter)
    cpu = load_model(out, "cpu", backend="torch")
    ids = torch.tensor([[1, 260, 262, 265, 270, 280, 290, 299]])  # <s> and some words
    if smoke:
        ids = ids[:, :2]  # the interpreter runs every program of every kernel in Python
    with torch.no_grad():
        got = ours.generate(ids.to(device), max_new_tokens=steps, do_sample=False)[0].tolist()
        want = cpu.generate(ids, max_new_tokens=steps, do_sample=False)[0].tolist()
    same = got == want
    first_diff = None if same else next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
    dense = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name,
                                                 dtype=torch.float16).to(device).eval()
    speeds = {}
    # gguf-repack's model computes in float32 (its kernels do; fp16 activations would only add
    # casts), transformers' own in what it makes of fp16
    # (with --smoke the timing runs the torch backend: the interpreter is too slow to time)
    for label, model in (("gguf-repack", cpu if smoke else ours), ("transformers' GGUF path, fp16", dense)):
        with torch.no_grad():
            for b in (1, batch):
                prompt = ids.repeat(b, 1).to(device)
                run = dict(attention_mask=torch.ones_like(prompt), do_sample=False, pad_token_id=2)
                model.generate(prompt, max_new_tokens=2, **run)  # compiles, warms up
                seconds = timed(lambda: model.generate(prompt, max_new_tokens=steps,
                                                       min_new_tokens=steps, **run), device)
                speeds[f"{label} decode tokens/s at batch {b}"] = round(b * steps / seconds, 1)
            long = torch.randint(3, 259, (1, prefill), device=device)
            model(long)
            seconds = timed(lambda: model(long), device)
            speeds[f"{label} prefill tokens/s at {prefill} tokens"] = round(prefill / seconds, 1)
    return {"greedy_tokens_equal_cpu_torch_backend": same, "first_difference_at": first_diff,
            "tokens": got, "cpu_tokens": want, "speeds": speeds, "moe": moe_part(device, work, smoke)}


def moe_part(device: torch.device, work: Path, smoke: bool) -> dict:
    """check_moe_model, its failure reported beside the llama's results rather than in place
    of them."""
    try:
        return check_moe_model(device, work, smoke)
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}


def check_moe_model(device: torch.device, work: Path, smoke: bool) -> dict:
    """A 2-layer Qwen3-MoE (tests/hf_models.py: write_moe, its experts in Q4_K and Q6_K stacks)
    through load_model on the device: its greedy tokens in float32 against the torch backend's
    on CPU, and load_model's own default dtype there (bfloat16 on CUDA) run for as many tokens,
    its agreement reported (16-bit activations may part ways with float32's after a while)."""
    from hf_models import bpe_tokenizer_kvs, write_moe

    from gguf_repack import convert
    from gguf_repack.hf import load_model

    steps = 2 if smoke else 32
    src = write_moe(work / "small-moe.gguf", "qwen3moe", bpe_tokenizer_kvs(), np.random.default_rng(6))
    out = work / "small-moe"
    convert(src, out)
    ids = torch.tensor([[3, 10, 25, 40, 7, 19]])[:, : 2 if smoke else None]
    run = dict(max_new_tokens=steps, do_sample=False)
    with torch.no_grad():
        want = load_model(out, "cpu", backend="torch").generate(ids, **run)[0].tolist()
        # (--smoke: the torch backend, the script's steps alone; the MoE model on the Triton
        # backend under the interpreter is tests/test_gpu_path.py's, a minute of CI here)
        got = load_model(out, device, dtype=torch.float32, backend="torch" if smoke else "triton").generate(
            ids.to(device), **run)[0].tolist()
        half, default_dtype = got, torch.float32  # --smoke: the CPU's default is float32
        if device.type == "cuda":
            default = load_model(out, device, backend="triton")  # bfloat16 on CUDA
            half, default_dtype = default.generate(ids.to(device), **run)[0].tolist(), default.dtype
    return {"greedy_tokens_equal_cpu_torch_backend": got == want, "tokens": got, "cpu_tokens": want,
            "default_dtype": str(default_dtype),
            "default_dtype_tokens_equal_before_first_difference": next(
                (i for i, (a, b) in enumerate(zip(half, want)) if a != b), len(want))}


def markdown(report: dict) -> str:
    lines = [f"# GPU check: {report['device']}", "", f"torch {report['torch']}, Triton "
             f"{report['triton']}, {report['seconds']:.0f} s in all", ""]
    if "kernels" in report:
        bad = [r for r in report["kernels"] if not r["ok"]]
        lines += [f"## Kernels: {len(report['kernels']) - len(bad)} of {len(report['kernels'])} "
                  "checks pass", ""]
        lines += [f"- FAIL {r['type']} {r['family']}" + (f" M={r['M']}" if r["M"] is not None else "")
                  + f": {r['problem']}" for r in bad]
    if "bench" in report:
        b = report["bench"]
        lines += ["", "## Bench", "", f"`{b['command']}`: exit {b['returncode']}, {b['seconds']} s"
                  " (tables in bench/bench_gpu.md)"]
    if "tune" in report:
        t = report["tune"]
        lines += ["", "## Tiles", "", f"`{t['command']}`: exit {t['returncode']}, {t['seconds']} s"
                  " (tune/tuned_configs.md; commit tune/tuned_configs.json as"
                  " gguf_repack_kernels/tuned_configs.json)"]
    if "model" in report:
        m = report["model"]
        if "error" in m:
            lines += ["", "## Small llama", "", f"FAIL: {m['error']}"]
        else:
            lines += ["", "## Small llama", "",
                      f"- greedy tokens equal the torch backend's on CPU: "
                      f"{m['greedy_tokens_equal_cpu_torch_backend']}"
                      + ("" if m["first_difference_at"] is None else
                         f" (first difference at {m['first_difference_at']})")]
            lines += [f"- {k}: {v}" for k, v in m["speeds"].items()]
            moe = m["moe"]
            lines += ["", "## Small Qwen3-MoE", ""]
            if "error" in moe:
                lines += [f"FAIL: {moe['error']}"]
            else:
                lines += [f"- greedy tokens (float32) equal the torch backend's on CPU: "
                          f"{moe['greedy_tokens_equal_cpu_torch_backend']}",
                          f"- load_model's default dtype ({moe['default_dtype']}): the first "
                          f"{moe['default_dtype_tokens_equal_before_first_difference']} of "
                          f"{len(moe['cpu_tokens'])} tokens (prompt included) equal float32's on CPU"]
    return "\n".join(lines) + "\n"


def main(args: argparse.Namespace) -> None:
    start = time.perf_counter()
    if args.smoke:
        device = torch.device("cpu")
    elif torch.cuda.is_available():
        device = torch.device("cuda")
    else:
        raise SystemExit("error: no CUDA device (use --smoke to check the script on CPU)")
    import triton

    args.out.mkdir(parents=True, exist_ok=True)
    report = {"device": "CPU (Triton interpreter, smoke test)" if args.smoke
              else torch.cuda.get_device_name(device),
              "torch": torch.__version__, "triton": triton.__version__}
    skip = set(filter(None, args.skip.split(",")))
    deadline = float("inf") if args.smoke else args.deadline

    def save(report):  # after every part: a run stopped early keeps what it found
        report["seconds"] = time.perf_counter() - start
        (args.out / "gpu_check.json").write_text(json.dumps(report, indent=1))
        (args.out / "gpu_check.md").write_text(markdown(report))

    def left(share):  # seconds until `share` of the deadline
        return start + share * deadline - time.perf_counter()

    if "kernels" not in skip:
        types = args.types.split(",") if args.types else sorted(kernels.FORMATS)
        report["kernels"] = check_kernels(device, types, args.smoke, start + 0.45 * deadline)
        save(report)
    if "model" not in skip:
        try:
            with tempfile.TemporaryDirectory() as work:
                report["model"] = check_model(device, Path(work), args.smoke)
        except Exception as e:
            report["model"] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        save(report)
    if "bench" not in skip:
        report["bench"] = run_bench(args.out / "bench", args.smoke, left(0.85))
        save(report)
    if "tune" not in skip:
        report["tune"] = run_tune(args.out / "tune", args.smoke, left(1.0))
    save(report)
    print(markdown(report))


if __name__ == "__main__":
    main(ARGS)
