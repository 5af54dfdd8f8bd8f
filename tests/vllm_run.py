"""Greedy generation with vLLM (CPU) on a model directory, run by tests/test_vllm.py with the
vLLM environment's Python: prints one line `RESULT {"model": ..., "prompt_token_ids": [...],
"token_ids": [...]}` per model (several, comma-separated, run one after another).

    python tests/vllm_run.py MODEL_DIR[,MODEL_DIR...] [--tp 1] [--pp 1] [--dtype float32]
        [--max-tokens 16] [--eager] [--held-bytes] [--backend-calls]
        [--may-fail MODEL_DIR[,MODEL_DIR...]] PROMPT...

A directory named in --may-fail that fails to load does not end the run: its line is
`RESULT {"model": ..., "error": "<the traceback>"}` (the traceback on stderr too), and the
next directory runs (put such directories last: a failure halfway through vLLM's start may
leave it unclean). Any other directory's failure ends the run with a traceback, as before.

With --held-bytes the result also has, per worker, what the loaded model holds: the bytes of
its parameters and buffers, each storage counted once, by kind ("planes": rp1 planes,
"weights": other parameters, "buffers": rotary caches and the like), and the largest buffers
by name. With --backend-calls (TP 1 only: the model runs in this process) it has the calls
each QTensor backend took, by backend and operation, with the GGUF types:
{"triton": {"matmul": {"Q4_0": 12, ...}, ...}, "torch": {...}}.

Tensor parallel ranks (--tp > 1 at --pp 1) are this script's own processes, started once by
torchrun (vLLM's "external_launcher"), each one engine rank for every model in turn: vLLM's
own multiprocessing executor starts its ranks again for each model, each importing vLLM (3
models at TP 2: 63 s this way, 201 s that way, the same tokens; measured 2026-12-03). Rank 0
prints the results. Pipeline parallel runs keep vLLM's executor (its stages hand tensors
between processes it starts).
"""

import argparse
import json
import os
import sys
import traceback


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("prompts", nargs="+")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--pp", type=int, default=1, help="pipeline_parallel_size")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--eager", action="store_true", help="skip torch.compile (faster start-up)")
    ap.add_argument("--held-bytes", action="store_true", help="report what the model holds")
    ap.add_argument("--backend-calls", action="store_true", help="report the backends' calls")
    ap.add_argument("--may-fail", default="", help="directories whose load failure is reported")
    ap.add_argument("--torchvision-stand-in", action="store_true",
                    help="import a stand-in for torchvision where it is not installed")
    args = ap.parse_args()
    if args.torchvision_stand_in:
        stand_in_torchvision()
    ranks = args.tp * args.pp
    launched = ranks > 1 and args.pp == 1  # the ranks are this script's processes (torchrun)
    if launched and "RANK" not in os.environ:
        import subprocess

        # a free port for torchrun's store, taken at once (each model's own port is chosen when
        # its turn comes: free_port); it also names this launch (two runs at once do not meet)
        port = free_port()
        env = {**os.environ, "GGUF_REPACK_LAUNCH": str(port)}
        sys.exit(subprocess.call([sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
                                  "--master-addr", "127.0.0.1", "--master-port", str(port),
                                  "--nproc-per-node", str(ranks), *sys.argv], env=env))
    rank = int(os.environ.get("RANK", "0"))
    # a KV cache of 64 MiB (per rank), not vLLM's CPU default: ample for these models at
    # max_model_len 256 (SmolLM2 in float32, the largest per token, fits 5 whole sequences), and
    # about 1 s less per model than 1 GiB, which vLLM zeroes at each start (VLLM_CPU_KVCACHE_SPACE,
    # whole GiB, overrides it where set)
    kv_cache_bytes = None if os.environ.get("VLLM_CPU_KVCACHE_SPACE") else 64 << 20
    if args.held_bytes:  # apply_model sends a function to the workers
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    if ranks > 1:  # one core per rank, round robin over this machine's cores
        cores = os.cpu_count() or 1
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(str(r % cores) for r in range(ranks)))
    # the engine in this process, and at one rank the model too: each process vLLM starts
    # imports it again, about 30 s of CPU here (the ranks of TP/PP > 1 stay processes)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import gc

    from vllm import LLM, SamplingParams
    from vllm.distributed import cleanup_dist_env_and_memory

    if launched:
        name_shared_memory(f"gguf_repack_{os.environ['GGUF_REPACK_LAUNCH']}")
        launcher_store = torchrun_store()

    calls = count_backend_calls() if args.backend_calls else None
    # vLLM calls gc.collect() about 9 times a model (its memory profiling and clean-up), each a
    # walk over every object of its imports: about 1 s each here. Those objects live as long as
    # this process; frozen, the collector passes them over (and again after each model). Even
    # so, four of the nine walk the model's engine (0.4 s each): vLLM's calls are made no-ops,
    # and this loop collects once per model, after the model is let go (7 models: 23.2 s to
    # 15.1 s, the same tokens and peak RSS; measured 2026-12-04). vLLM collects to release GPU
    # memory to its profiler; these runs give the KV cache's size, and run on CPU.
    # vLLM also freezes each engine after its start and unfreezes everything at its shutdown
    # (EngineCore, cleanup_dist_env_and_memory), which undid these freezes too: each model's
    # collection walked every object of the imports again, 0.45 s a model (73 models: 33 s
    # of 85; measured 2026-12-06). Its freezes and unfreezes are no-ops here as well: the
    # engine is never frozen, so this loop's collection frees it, and the imports stay frozen
    collect, freeze = gc.collect, gc.freeze
    gc.collect, gc.freeze, gc.unfreeze = lambda generation=2: 0, lambda: None, lambda: None
    freeze()
    skip_serving_set_up()
    # several models, one after another in this process (one import of vLLM for all of them)
    may_fail = set(filter(None, args.may_fail.split(",")))
    for i, model in enumerate(args.model.split(",")):
        if launched:
            # each model's process groups meet in a store rank 0 makes afresh on a port of
            # their own (in torchrun's store the second model's ranks would read the first
            # one's addresses: its groups have the same names); rank 0 picks the port now and
            # hands it over through torchrun's store: a port picked at the launch, minutes
            # before its model's turn, was once taken by then (CI, 2026-12-04: "recvBytes
            # Connection reset by peer" at TP 2)
            key = f"gguf_repack/model_port/{i}"
            if rank == 0:
                launcher_store.set(key, str(free_port()))
            os.environ["MASTER_PORT"] = launcher_store.get(key).decode()
            os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "False"
        try:
            llm = LLM(model=model, tensor_parallel_size=args.tp, pipeline_parallel_size=args.pp,
                      dtype=args.dtype, max_model_len=max_model_len(model), seed=0, enforce_eager=args.eager,
                      distributed_executor_backend=("uni" if ranks == 1 else
                                                    "external_launcher" if launched else None),
                      kv_cache_memory_bytes=kv_cache_bytes)
        except Exception:
            if model not in may_fail:
                raise
            error = traceback.format_exc()
            print(error, file=sys.stderr, flush=True)
            print("RESULT " + json.dumps({"model": model, "error": error}), flush=True)
            collect()
            cleanup_dist_env_and_memory()
            continue
        if calls is not None:
            calls.clear()  # the generation's calls, not those of vLLM's start (warm-up, compile)
        outputs = llm.generate(args.prompts, SamplingParams(max_tokens=args.max_tokens, temperature=0))
        result = {"model": model, "prompt_token_ids": [list(o.prompt_token_ids) for o in outputs],
                  "token_ids": [list(o.outputs[0].token_ids) for o in outputs]}
        if calls is not None:
            result["backend_calls"] = {b: {op: dict(types) for op, types in ops.items()}
                                       for b, ops in calls.items()}
        if args.held_bytes:
            from gguf_repack.integrations.vllm.memory import held_bytes

            result["held_bytes"] = llm.apply_model(held_bytes)  # each worker's, or this rank's
            if launched:  # every rank's, in rank order
                import torch.distributed as dist

                every = [None] * dist.get_world_size()
                dist.all_gather_object(every, result["held_bytes"])
                result["held_bytes"] = [held for rank_held in every for held in rank_held]
        if rank == 0:
            print("RESULT " + json.dumps(result), flush=True)
        if not launched:  # (under external_launcher it leaves the ranks unable to meet again)
            llm.llm_engine.engine_core.shutdown()
        del llm
        collect()
        cleanup_dist_env_and_memory()
        freeze()  # (what the model's start imported)


def skip_serving_set_up() -> None:
    """Leaves out two things each LLM() start does for serving, neither of which touches a
    token: a pool of deep copies of the tokenizer for the API server's threads (each copy
    parses the tokenizer again: these runs generate in one thread), and the chat-template
    warm-up (a chat rendered once, which looks for a processor first; these runs take plain
    prompts). The two were a fifth of a TP 2 run of tiny models (py-spy, 2026-12-05)."""
    import vllm.renderers.base
    import vllm.renderers.hf

    vllm.renderers.hf.maybe_make_thread_pool = lambda tokenizer, copies=1: tokenizer
    vllm.renderers.base.BaseRenderer.warmup = lambda self, chat_params: self.warmup_mm()


def stand_in_torchvision() -> None:
    """A stand-in for torchvision, where it is not installed, in this process and in every
    Python process it starts (vLLM inspects a model's class in a subprocess):
    tests/torchvision_stand_in/sitecustomize.py, which Python imports at start-up from the path."""
    from importlib.util import find_spec

    if find_spec("torchvision") is not None:
        return
    stand_in = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torchvision_stand_in")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [stand_in, os.environ.get("PYTHONPATH")]))
    import runpy

    runpy.run_path(os.path.join(stand_in, "sitecustomize.py"))  # (in this process: installed now)


def free_port() -> int:
    """A TCP port nothing listens on now (bound to 0, then closed)."""
    import socket

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        return free.getsockname()[1]


def torchrun_store():
    """A client of the store torchrun's agent keeps for the whole launch (MASTER_ADDR and
    MASTER_PORT as torchrun sets them, before a model's own port replaces MASTER_PORT)."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    return TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                    timeout=timedelta(minutes=10))


def max_model_len(model: str) -> int:
    """256 tokens (ample for the tests' prompts), or the model's own context if shorter (the
    tiny gpt-oss has 64)."""
    with open(os.path.join(model, "config.json")) as f:
        context = json.load(f).get("max_position_embeddings") or 256
    return min(256, int(context))


def name_shared_memory(prefix: str) -> None:
    """vLLM's CPU ranks exchange tensors through shared-memory segments named after the
    executor's rendezvous file; under external_launcher (rendezvous env://) every run gets the
    same names, so a second run, or a run beside another (pytest-xdist), fails to create them
    (errno 17). The names here carry this launch's id (the ranks share it) instead, and the
    segments are removed when the process ends (vLLM leaves them in /dev/shm)."""
    import atexit
    import glob

    from vllm.distributed.device_communicators import cpu_communicator

    def group_name(communicator) -> str:
        ranks = "-".join(str(rank) for rank in communicator.ranks)
        return f"{prefix}-{communicator.unique_name}-[{ranks}]-cpushm"

    cpu_communicator._CPUSHMDistributed.make_group_name = staticmethod(group_name)

    def remove() -> None:
        for path in glob.glob(f"/dev/shm/{glob.escape(prefix)}-*"):
            try:
                os.unlink(path)
            except OSError:
                pass  # the other rank's exit took it first
    atexit.register(remove)


def count_backend_calls() -> dict:
    """Count every call of the QTensor backends' operations in this process from now on:
    {backend: {operation: {GGUF type: calls}}}."""
    from collections import defaultdict

    from gguf_repack.runtime import backends

    calls = defaultdict(lambda: defaultdict(lambda: defaultdict(int)))
    for backend in (backends.TorchBackend, backends.TritonBackend):
        for op in ("dequantize", "matmul", "expert_matmul", "embedding"):
            def counted(qt, *args, _op=getattr(backend, op), _name=backend.name, _o=op):
                calls[_name][_o][qt.qtype.name] += 1
                return _op(qt, *args)
            setattr(backend, op, staticmethod(counted))
    return calls


if __name__ == "__main__":  # vLLM starts worker processes that import this module again
    main()
