"""The tiles chosen for a device and an activation dtype (gguf_repack_kernels/configs.py), without
compiling anything: every tile the dispatcher would launch fits its device's shared memory by
configs' estimate (tests/test_kernels_ptx.py holds the estimate to real compiles), the
present tiles are kept wherever they fit, and tuned tiles apply to their own device and dtype
only."""

import json
import os
from types import SimpleNamespace

import pytest
import torch

import gguf_repack_kernels as kernels
from gguf_repack_kernels import configs

KERNEL_TYPES = sorted(kernels.FORMATS)
ACTS = ["fp16", "bf16", "fp32"]
N, K = 4096, 4096
# a GPU of 99 KB a block, as an RTX 3090 / 4090 / 5090 or an L40S
SMALL = configs.Device(86, 101_376, 82)


def default_tile(name, bm, act="fp16"):
    """The tile before any device was looked at (what sm_90 fp16 must still get)."""
    block = kernels.FORMATS[name].block_size
    bn = configs.GEMM_M16_BN.get(name, 64 if block >= 256 else 128) if bm == 16 else 32
    half = {"fp16": configs.GEMM_M16_BN_F16, "bf16": configs.GEMM_M16_BN_BF16}.get(act, {})
    # the wider tile of a float16 or bfloat16 dequant function, where this Triton does not spill
    if bm == 16 and name in half and configs.on_this_triton(configs.GEMM_M16_WIDE_FROM_TRITON, name):
        bn = half[name]
    if (bm >= 32 and act != "fp32" and name in configs.SWAP_AB_TYPES  # the weight tile as A
            and configs.on_this_triton(configs.SWAP_AB_FROM_TRITON, name)
            and not (name in configs.SWAP_AB_BM32_ONLY and bm > 32)):
        bn = 64 if block >= 256 else 128
        if bm == 64 and name in configs.BM64_TWO_WARPGROUPS:  # its float16 function, 8 warps
            return {"BM": bm, "BN": 128, "num_warps": 8, "num_stages": configs.BM64_TWO_WARPGROUPS[name],
                    "STEP_BLOCKS": max(1, 128 // block)}
    step = max(1, 128 // block)  # a K step of 128 weights
    if bm == 128:  # swapped only; two warpgroups for 256-weight blocks (not Q6_K's: it spills)
        bn = 128 if block >= 256 and name not in configs.BM128_NARROW else 64
        return {"BM": bm, "BN": bn, "num_warps": 8 if bn == 128 else 4, "num_stages": 2, "STEP_BLOCKS": step}
    return {"BM": bm, "BN": bn, "num_warps": 4, "num_stages": 2, "STEP_BLOCKS": step}


def launched(name, device, act):
    """Every tensor-core tile the dispatcher can launch for this type: the dense GEMM's
    BM = 16, 32, 64 and 128 tiles (at M = BM; configs.matmul_choice picks among them by M) and
    the expert GEMM at 16, 32 and 64 rows an expert."""
    block = kernels.FORMATS[name].block_size
    for m in (16, 32, 64, 128):
        cfg = configs.gemm_config(name, block, m, N, K // block, device, act, bm=m)
        yield "gemm", m, {k: v for k, v in cfg.items() if k != "SPLIT_K"}
        if m < 128:
            cfg = configs.moe_config(name, block, m, device, act, bm=m)
            assert cfg["SPLIT_K"] == 1, cfg  # (no routing given: K whole)
            yield "moe", m, {k: v for k, v in cfg.items() if k != "SPLIT_K"}


@pytest.mark.parametrize("arch", sorted(configs.KNOWN_DEVICES))
@pytest.mark.parametrize("act", ACTS)
def test_every_launched_tile_fits_its_device_by_the_estimate(arch, act):
    device = configs.KNOWN_DEVICES[arch]
    for name in KERNEL_TYPES:
        block = kernels.FORMATS[name].block_size
        for kind, m, cfg in launched(name, device, act):
            need = configs.shared_memory_estimate(name, block, cfg["BM"], cfg["BN"], cfg["num_stages"],
                                                  arch, act, cfg["STEP_BLOCKS"])
            assert need <= device.shared_memory, (name, kind, m, cfg, need)
            default = default_tile(name, cfg["BM"], act)
            fits = configs.shared_memory_estimate(name, block, cfg["BM"], default["BN"], default["num_stages"], arch,
                                                  act, default["STEP_BLOCKS"]) <= device.shared_memory
            assert (cfg == default) == fits, (name, kind, m, cfg)


def test_fp16_at_sm90_keeps_every_present_tile():
    for name in KERNEL_TYPES:
        for act in ("fp16", "bf16"):
            for _, m, cfg in launched(name, configs.KNOWN_DEVICES[90], act):
                # BM = 128 is a swapped tile only (configs.swap_ab): BM = 64 elsewhere
                assert cfg["BM"] == (m if m < 128 or configs.swap_ab(name, m, act) else 64)
                assert cfg == default_tile(name, cfg["BM"], act), (name, act, m, cfg)


def test_a_99_kb_gpu_gets_another_tile_for_float32_q4_k_than_an_h200_for_float16():
    """Float32 x's BM = 64 tile of Q4_K asks 103,168 bytes of shared memory (a compile's
    count, its scales read in words; the estimate is the same): more than the 101,376 of
    sm_86/89/120."""
    h200 = configs.gemm_config("Q4_K", 256, 64, N, 16, configs.KNOWN_DEVICES[90], torch.float16)
    small = configs.gemm_config("Q4_K", 256, 64, N, 16, SMALL, torch.float32)
    assert {k: v for k, v in h200.items() if k != "SPLIT_K"} == default_tile("Q4_K", 64)
    assert small != h200 and small["BM"] == 64
    assert configs.shared_memory_estimate("Q4_K", 256, 64, 32, 2, 86, "fp32") == 103_168
    assert configs.shared_memory_estimate("Q4_K", 256, 64, small["BN"], small["num_stages"], 86,
                                          "fp32") <= SMALL.shared_memory
    assert configs.moe_config("Q4_K", 256, 64, SMALL, torch.float32, bm=64) == {**small, "SPLIT_K": 1}
    # the interpreter has no limit: the present tile
    assert configs.gemm_config("Q4_K", 256, 64, N, 16, configs.INTERPRETER, torch.float32)["BN"] == 32


def test_tiles_that_spill_with_an_older_triton_are_not_launched_with_it(monkeypatch):
    """Triton 3.6 (the GPU machine's) and 3.7 spill registers in the K loop of tiles that 3.8
    and 3.9 compile without (sm_90 SASS, BENCHMARKS.md "Triton 3.6"; .ci/run compiles every
    tile with Triton 3.6.0 and fails on a spill in a K loop): with those versions Q4_K's BM = 16
    tile is 64 wide, not 128, IQ4_XS's tiles take its float32 dequant function, and IQ3_S's
    BM = 32 tile is not swapped; with 3.9, the tiles above."""
    from gguf_repack_kernels.dispatch import gemm_dequant

    def tiles():
        q4_k = {act: configs.gemm_config("Q4_K", 256, 16, N, K // 256, configs.KNOWN_DEVICES[90], act)["BN"]
                for act in ("fp16", "bf16")}
        iq4_xs = {(bm, act): str(gemm_dequant(kernels.FORMATS["IQ4_XS"], act, bm)["DQ_DT"])
                  for bm in (16, 32) for act in ("fp16", "bf16")}
        iq3_s = [configs.swap_ab("IQ3_S", 32, act) for act in ("fp16", "bf16")]
        return q4_k, set(iq4_xs.values()), iq3_s

    for version, expected in [((3, 9), ({"fp16": 128, "bf16": 128}, {"fp16", "bf16"}, [True, True])),
                              ((3, 8), ({"fp16": 128, "bf16": 128}, {"fp16", "bf16"}, [True, True])),
                              ((3, 7), ({"fp16": 64, "bf16": 64}, {"fp16", "bf16"}, [True, True])),
                              ((3, 6), ({"fp16": 64, "bf16": 64}, {"fp32"}, [False, False]))]:
        monkeypatch.setattr(configs, "TRITON", version)
        assert tiles() == expected, version


def test_the_tiles_promise_their_k_loop_a_step_where_that_keeps_wgmmas_in_flight(monkeypatch):
    """configs.NO_STEP_PROMISE by Triton version (sm_90 SASS, BENCHMARKS.md "Which wgmmas wait
    for each other, by Triton version"): Triton 3.6 serializes the wgmmas of IQ4_XS's swapped
    tiles, Q4_K's BM = 64 one and Q6_K's BM = 128 one without the promise, and spills in none
    of their K loops with it, so it promises them; 3.9 spills in the BM = 64 and 128 ones with
    it, and keeps IQ4_XS's BM = 32 one in flight without it. Q4_K's BM = 128 tile spills in its
    loop with the promise under both; the plain tiles (fp32 x, BM = 16) are never promised."""
    changed = [("IQ4_XS", 32), ("IQ4_XS", 64), ("Q4_K", 64), ("Q6_K", 128), ("Q4_K", 128), ("Q5_K", 64)]
    for version, expected in [((3, 6), [True, True, True, True, False, True]),
                              ((3, 8), [False, True, False, False, False, True]),
                              ((3, 9), [False, False, False, False, False, True])]:
        monkeypatch.setattr(configs, "TRITON", version)
        for act in ("fp16", "bf16"):
            assert [configs.mma_pipelined(t, bm, act) for t, bm in changed] == expected, (version, act)
        assert not configs.mma_pipelined("Q5_K", 64, "fp32") and not configs.mma_pipelined("Q5_K", 16, "fp16")


def test_the_installed_tritons_version_is_read():
    import triton

    assert configs.TRITON == tuple(int(p) for p in triton.__version__.split(".")[:2])


def test_the_kwidth_fence_is_for_its_tiles_in_16_bit_x_only():
    """The fenced tiles, as measured (configs.KWIDTH_FENCE): four types' BM = 16 tiles (Q2_K's
    BM = 64 one no longer, over two warpgroups with its float16 function)."""
    from gguf_repack_kernels.dispatch import gemm_dequant

    fenced = {(name, bm, act) for name, fmt in kernels.FORMATS.items() for bm in (16, 32, 64, 128)
              for act in ACTS if gemm_dequant(fmt, act, bm)["FENCE"]}
    tiles = {(name, 16) for name in ("Q2_K", "Q5_K", "Q6_K", "Q8_0")}
    assert fenced == {(name, bm, act) for name, bm in tiles for act in ("fp16", "bf16")}


def test_dtypes_by_name():
    assert [configs.act_name(d) for d in (torch.float16, torch.bfloat16, torch.float32, "bf16")] == \
        ["fp16", "bf16", "fp32", "bf16"]
    with pytest.raises(ValueError):
        configs.act_name(torch.int8)


def test_device_records(monkeypatch):
    """A CPU tensor gets the interpreter's record; a GPU's is read from torch once, the opt-in
    shared memory where torch has it, else the known value of its capability."""
    assert configs.device_of(torch.device("cpu")) == configs.INTERPRETER
    calls = []

    def props(index, optin=True):
        calls.append(index)
        p = SimpleNamespace(major=8, minor=9, multi_processor_count=142, shared_memory_per_block=49152)
        if optin:
            p.shared_memory_per_block_optin = 101_376
        return p

    configs._cuda_device.cache_clear()
    monkeypatch.setattr(torch.cuda, "get_device_properties", props)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert configs.device_of(torch.device("cuda")) == configs.Device(89, 101_376, 142)
    assert configs.device_of(torch.device("cuda:0")).name == "sm89"
    assert calls == [0]
    configs._cuda_device.cache_clear()
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props(index, optin=False))
    assert configs.device_of(torch.device("cuda:1")).shared_memory == 101_376  # sm_89's known
    configs._cuda_device.cache_clear()


def test_tuned_tiles_apply_to_their_device_and_dtype_only(tmp_path, monkeypatch):
    tuned = tmp_path / "tuned_configs.json"
    big = {"BN": 128, "num_warps": 4, "num_stages": 3}  # 229,888 B at fp32: fits no 99 KB GPU
    small = {"BN": 64, "num_warps": 8, "num_stages": 2}
    tuned.write_text(json.dumps({"tiles": {
        "sm86/fp32": {"gemm_bm64": {"Q4_K": big, "Q4_0": small}},
        "sm90/fp16": {"gemm_bm64": {"Q4_K": small}}}}))
    monkeypatch.setattr(configs, "TUNED_CONFIGS", tuned)
    h100, sm86 = configs.KNOWN_DEVICES[90], configs.KNOWN_DEVICES[86]
    assert configs.tuned(sm86, torch.float32)["gemm_bm64"]["Q4_0"] == small
    assert configs.tuned(sm86, torch.float16) == {}
    assert configs.gemm_config("Q4_0", 32, 64, N, 128, sm86, torch.float32)["num_warps"] == 8
    assert configs.gemm_config("Q4_0", 32, 64, N, 128, sm86, torch.float16)["num_warps"] == 4
    assert configs.gemm_config("Q4_K", 256, 64, N, 16, h100, "fp16")["num_warps"] == 8
    assert configs.gemm_config("Q4_K", 256, 64, N, 16, h100, "bf16")["num_warps"] == 4
    # a tuned tile that does not fit this GPU is not used: the default, fitted
    cfg = configs.gemm_config("Q4_K", 256, 64, N, 16, sm86, torch.float32)
    assert cfg == configs.gemm_config("Q4_K", 256, 64, N, 16, SMALL, torch.float32)
    # a tile given as such is launched as given (the tuner's candidates)
    assert configs.gemm_config("Q4_K", 256, 64, N, 16, sm86, torch.float32, tile=big)["BN"] == 128


def test_the_estimates_rule_picks_a_path_and_tile_at_every_m():
    """configs.MATMUL_RULE (scripts/estimate_paths.py --write-configs, from the SASS estimate):
    per type, increasing M bounds, the last open; the GEMV at M = 1 (decode); and what the
    dispatcher launches at each M is the rule's choice: its path and, for the fused GEMM, a
    tile of the rule's BM, up to configs.FUSED_MAX_M (an H200's timings), dequantize+matmul
    beyond."""
    choices = {"gemv", "gemm_bm16", "gemm_bm32", "gemm_bm64", "gemm_bm128", "dequantize+matmul"}
    assert {"Q4_0", "Q4_K", "Q5_K", "Q6_K", "Q8_0", "Q2_K", "IQ4_XS", "MXFP4"} <= set(configs.MATMUL_RULE)
    h200 = configs.KNOWN_DEVICES[90]
    for name, rule in configs.MATMUL_RULE.items():
        tops = [top for top, _ in rule]
        assert tops[-1] is None and tops[:-1] == sorted(set(tops[:-1])), (name, rule)
        assert {choice for _, choice in rule} <= choices and rule[0][1] == "gemv", (name, rule)
        block = kernels.FORMATS[name].block_size
        for m in range(1, 300):
            choice = next(c for top, c in rule if top is None or m <= top)
            if choice.startswith("gemm") and m > configs.FUSED_MAX_M:  # measured: no tile past 64
                choice = "dequantize+matmul"
            path = kernels.dispatch.matmul_path(name, m)
            assert path == ("gemm" if choice.startswith("gemm") else choice), (name, m)
            if path == "gemm":
                cfg = configs.gemm_config(name, block, m, N, K // block, h200, "fp16")
                assert f"gemm_bm{cfg['BM']}" == choice, (name, m, cfg)



def test_the_experts_a_batch_chooses_and_the_rows_each_gets():
    """configs.experts_chosen / routed_rows_per_expert, from the shapes alone: each token picks
    `top` distinct experts, so one token's experts get a row each; with uniform routing
    E (1 - (1 - top / E)^T) experts are chosen (4 experts, 2 a token, 2 tokens: 3 of them, 4/3
    rows each); every expert once each token takes them all."""
    assert configs.experts_chosen(1, 8, 128) == 8 and configs.routed_rows_per_expert(1, 8, 128) == 1.0
    assert configs.experts_chosen(2, 2, 4) == pytest.approx(3.0)
    assert configs.routed_rows_per_expert(2, 2, 4) == pytest.approx(4 / 3)
    assert configs.routed_rows_per_expert(5, 4, 4) == 5.0
    # 4 experts of this rank (expert parallel), 8 slots a token: still a row each for one token
    assert configs.routed_rows_per_expert(1, 8, 4) == 1.0 and configs.routed_rows_per_expert(3, 8, 4) == 3.0
    assert configs.routed_rows_per_expert(0, 8, 128) == 0.0
    # Qwen3-30B-A3B (128 experts, 8 a token): 64 tokens give its experts about 4 rows each
    assert 4.0 < configs.routed_rows_per_expert(64, 8, 128) < 4.2
    rng = torch.Generator().manual_seed(0)
    picks = torch.stack([torch.randperm(128, generator=rng)[:8] for _ in range(64 * 200)]).view(200, -1)
    seen = sum(len(set(run.tolist())) for run in picks) / 200
    assert seen == pytest.approx(configs.experts_chosen(64, 8, 128), rel=0.01)


def test_the_expert_products_follow_one_rule_from_the_estimate():
    """configs.MOE_RULE (scripts/estimate_paths.py --experts --write-configs, from the SASS
    estimate of the expert products): per type, increasing bounds of rows an expert, the last
    open; the GEMV a pair first, then the GEMV on 2 and 4 of an expert's rows, then tiles of
    increasing BM; one token's experts (a row each) take the GEMV whatever the rule; and what
    the dispatcher launches at each batch is the rule's choice: its path and, for the GEMV
    its rows of x a program, for the tiles a tile of the rule's BM."""
    h200 = configs.KNOWN_DEVICES[90]
    assert set(configs.MOE_RULE) == set(kernels.FORMATS)
    for name, rule in configs.MOE_RULE.items():
        tops = [top for top, _ in rule]
        assert tops[-1] is None and tops[:-1] == sorted(set(tops[:-1])) and tops[0] >= 1.0, (name, rule)
        choices = [choice for _, choice in rule]
        x_rows = [int(c[len("gemv_x"):]) for c in choices[1:] if c.startswith("gemv_x")]
        bms = [int(c[len("tiles_bm"):]) for c in choices[1 + len(x_rows):]]
        assert choices[0] == "gemv" and x_rows == sorted(set(x_rows)) and set(x_rows) <= {2, 4}, (name, rule)
        assert bms == sorted(set(bms)) and set(bms) <= {16, 32, 64}, (name, rule)
        block = kernels.FORMATS[name].block_size
        for experts, top in ((128, 8), (256, 8), (32, 4), (8, 2)):
            for tokens in range(1, 300, 7):
                rows = configs.routed_rows_per_expert(tokens, top, experts)
                choice = next(c for t, c in rule if t is None or rows <= t) if tokens > 1 else "gemv"
                path = kernels.dispatch.expert_path(name, tokens, top, experts)
                assert path == ("gemv" if choice.startswith("gemv") else "tiles"), (name, tokens, rows, rule)
                xr = int(choice[len("gemv_x"):]) if choice.startswith("gemv_x") else 1
                assert configs.moe_gemv_x_rows(name, rows) == xr, (name, tokens, rows, rule)
                if path == "tiles":
                    cfg = configs.moe_config(name, block, rows, h200, "fp16")
                    assert f"tiles_bm{cfg['BM']}" == choice, (name, tokens, rows, cfg)
    # a rule that says tiles from the first row still leaves one token's experts to the GEMV
    assert configs.moe_choice("Q4_K", 1.0) == "gemv"
    # a type the estimate has not covered: the default rule
    assert configs.moe_choice("no such type", 3.0) == "tiles_bm16"


def test_the_expert_rule_is_fitted_monotone_to_the_fastest_choices(monkeypatch):
    """scripts/estimate_paths.py's expert_rule on made-up estimates: the fastest choice goes
    GEMV (up to 1.5 rows), tiles of 16 (to 8), 32 (to 24), 64; a lone point where the GEMV
    is the faster past the tiles' start (at 3 rows, by 1%) does not bring the GEMV back. Up
    to configs.FUSED_MAX_M rows an expert by the overlapped model's times ("times_us"), its
    ties by the conservative one's, past it by the conservative one's; the GEMV on 2 and 4
    of an expert's rows between the GEMV a pair and the tiles."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "estimate_paths", Path(__file__).resolve().parents[1] / "scripts" / "estimate_paths.py")
    estimate_paths = importlib.util.module_from_spec(spec)
    # the script removes TRITON_INTERPRET (it compiles for a GPU): the tests after this one
    # run the kernels in the interpreter
    monkeypatch.setenv("TRITON_INTERPRET", os.environ.get("TRITON_INTERPRET", "1"))
    spec.loader.exec_module(estimate_paths)
    monkeypatch.undo()

    def times(r):
        t = {"gemv": 0.8 * r, "tiles_bm16": 1.2 + r / 16, "tiles_bm32": 1.1 + r / 32 + (0.4 if r <= 8 else 0),
             "tiles_bm64": 1.0 + r / 64 + (0.9 if r <= 24 else 0)}
        if r == 3.0:
            t["gemv"] = 0.99 * min(t.values())
        return t

    points = [1.0, 1.2, 1.5, 2.0, 3.0, 4.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0]
    cap = configs.FUSED_MAX_M
    assert points[-1] < cap
    # past the cap only the conservative model's times are read (the overlapped model's
    # there would take the GEMV)
    gemv = {"gemv": 0.1, "tiles_bm16": 5.0, "tiles_bm32": 5.0, "tiles_bm64": 5.0}
    rows = [{"rows_per_expert": r, "times_us": times(r), "times_serial_us": times(r)} for r in points]
    rows.append({"rows_per_expert": 2 * cap, "times_us": gemv, "times_serial_us": times(2 * cap)})
    assert estimate_paths.expert_rule({"a stack": rows}) == (
        (1.5, "gemv"), (8.0, "tiles_bm16"), (24.0, "tiles_bm32"), (None, "tiles_bm64"))
    # where the GEMV is never the faster, one row an expert is still its
    tiles = {"gemv": 9.0, "tiles_bm16": 1.0}
    fast_tiles = [{"rows_per_expert": r, "times_us": tiles, "times_serial_us": tiles} for r in points]
    assert estimate_paths.expert_rule({"a stack": fast_tiles}) == ((1.0, "gemv"), (None, "tiles_bm16"))
    # the GEMV on rows of an expert, in order of its rows, before the tiles
    fastest = {1.0: "gemv", 1.2: "gemv", 1.5: "gemv_x2", 2.0: "gemv_x2", 3.0: "gemv_x4", 4.0: "gemv_x4"}
    choices = ("gemv", "gemv_x2", "gemv_x4", "tiles_bm16")
    xs = [{"rows_per_expert": r, "times_us": t, "times_serial_us": t} for r in points
          for t in [{c: 1.0 if c == fastest.get(r, "tiles_bm16") else 2.0 for c in choices}]]
    assert estimate_paths.expert_rule({"a stack": xs}) == (
        (1.2, "gemv"), (2.0, "gemv_x2"), (4.0, "gemv_x4"), (None, "tiles_bm16"))
    # up to the cap the overlapped model decides, but where it ties (every choice at the
    # memory bound) the conservative one does: here the GEMV to 2 rows, then BM = 16 at
    # every point (BM = 64 past the last, where nothing was estimated)
    tied = {"gemv": 1.0, "tiles_bm16": 1.0, "tiles_bm64": 1.0}
    ties = [{"rows_per_expert": r, "times_us": {**tied, "gemv": 1.0 if r <= 2 else 3.0},
             "times_serial_us": {"gemv": 1.0 if r <= 2 else 3.0, "tiles_bm16": 1.5, "tiles_bm64": 2.0}}
            for r in points]
    assert estimate_paths.expert_rule({"a stack": ties}) == (
        (2.0, "gemv"), (48.0, "tiles_bm16"), (None, "tiles_bm64"))

def test_k_is_split_for_the_busiest_sm_not_for_a_count_of_programs():
    """configs.gemm_split_k: K is split until 2 programs an SM (one's MMA runs while the other
    dequantizes), then further, to at most 8 an SM, only where the last wave then fills the
    SMs better (the busiest SM's programs are the time). Values worked by hand for 132 SMs."""
    h200 = configs.KNOWN_DEVICES[90]
    assert configs.wave_fill(264, 132) == 1.0
    assert configs.wave_fill(224, 132) == pytest.approx(224 / 264)  # 92 SMs run 2, 40 run 1
    assert configs.wave_fill(896, 132) == pytest.approx(896 / 924)
    # tiles -> split, 32 K steps: 4096 x 4096 at BM = 16 (32 tiles) as before; 14336 x 4096
    # (112 tiles of BN = 128, 224 of BN = 64) past 2 an SM, to 896 programs; 256 or 600 tiles
    # fill 132 SMs (or too many for a workspace) whole
    for tiles, split in ((32, 8), (64, 4), (112, 8), (224, 4), (448, 2), (256, 1), (600, 1)):
        assert configs.gemm_split_k(tiles, 32, 2, 132) == split, tiles
        programs = tiles * split
        assert programs <= 8 * 132 and (split == 1 or tiles <= 4 * 132)
        # never a worse last wave than the count-of-programs rule's
        plain = 1
        while tiles * plain * 2 <= 2 * 132:
            plain *= 2
        assert configs.wave_fill(programs, 132) >= configs.wave_fill(tiles * plain, 132)
    assert configs.gemm_split_k(112, 2, 2, 132) == 2  # a power of two that divides the steps
    assert configs.gemm_split_k(112, 6, 2, 132) == 2
    # as gemm_config takes it: the FFN's 14336 x 4096 of Q4_K at M = 16 and 64
    blocks = 4096 // 256
    assert configs.gemm_config("Q4_K", 256, 16, 14336, blocks, h200, torch.float16)["SPLIT_K"] == 8
    cfg = configs.gemm_config("Q4_K", 256, 64, 14336, blocks, h200, torch.float16)
    assert (cfg["BM"], cfg["BN"], cfg["SPLIT_K"]) == (64, 64, 4)


def test_the_decode_gemv_splits_k_for_the_busiest_sm_too():
    """configs.gemv_dot_config at M = 1 on an H200 (configs.gemv_split): enough programs (2 an
    SM, or K split whole), then the least work on the busiest SM. 4096 rows of Q4_0 (8 tiles
    of 512 rows): 64, 512 programs; the FFN's 14336 (28 tiles): 16 would run 448 programs, 4
    on the busiest SM where the average is 3.4; 32 runs 896 (0.97). Q4_K's 256-row tiles (2
    rows a thread): 56 tiles, 8 -> 16; 14336 columns (56 blocks), 16 tiles: 32 left 4
    programs of 2 steps on the busiest SM, 56 leaves 7 of one (896 programs)."""
    h200 = configs.KNOWN_DEVICES[90]
    for name, block, n, k, split in (("Q4_0", 32, 4096, 4096, 64), ("Q4_0", 32, 14336, 4096, 32),
                                     ("Q4_0", 32, 4096, 14336, 64), ("Q4_K", 256, 4096, 4096, 16),
                                     ("Q4_K", 256, 14336, 4096, 16), ("Q4_K", 256, 4096, 14336, 56)):
        cfg = configs.gemv_dot_config(name, 1, n, k // block, h200, torch.float16)
        assert cfg["SPLIT_K"] == split, (name, n, k, cfg)
        assert cfg["BN"] == 32 * 4 * configs.GEMV_ROWS.get(name, 4), cfg
        assert configs.wave_fill(-(-n // cfg["BN"]) * split, h200.sms) >= 0.96, (name, n, k, cfg)
    # a tile that says its split keeps it (the tuner's K-whole candidates)
    assert configs.gemv_dot_config("Q4_0", 1, 14336, 128, h200, torch.float16, {"SPLIT_K": 1})["SPLIT_K"] == 1


def test_the_expert_gemv_on_a_short_k_splits_it_whole_and_takes_a_row_a_thread():
    """Qwen3-30B-A3B's expert down stack (2048 x 768) at one token, 8 (token, slot) pairs on
    an H200 (configs.gemv_split): Q4_0's 24 block columns in 12 (3 programs of 2 steps on the
    busiest SM, 0.97 of its work the average's; 16 left 4 of 2, 0.73); Q4_K's 3 columns of
    256-row tiles leave the busiest SM 2 programs' work at any split, so one row a thread
    (384 programs of 128 rows, 3 on the busiest SM), at 2 pairs a token its default 2 rows
    again (split 3: 384 programs); a tile that names its rows keeps them."""
    h200 = configs.KNOWN_DEVICES[90]
    assert configs.gemv_splits(24) == [1, 2, 3, 4, 6, 8, 12, 16, 24]
    assert configs.gemv_splits(3) == [1, 2, 3]
    assert configs.gemv_splits(16) == [1, 2, 4, 8, 16]
    for name, block, pairs, bn, split in (("Q4_0", 32, 8, 512, 12), ("Q4_K", 256, 8, 128, 3),
                                          ("Q4_K", 256, 16, 256, 3), ("Q4_K", 256, 64, 256, 1)):
        cfg = configs.gemv_dot_config(name, pairs, 2048, 768 // block, h200, torch.float16, x_rows=1)
        assert (cfg["BN"], cfg["SPLIT_K"]) == (bn, split), (name, pairs, cfg)
    tile = {"ROWS": 2, "PARTS": 1, "num_warps": 4}
    assert configs.gemv_dot_config("Q4_K", 8, 2048, 3, h200, torch.float16, tile, x_rows=1)["BN"] == 256
    # rows of x a program keep their rows a thread (GEMV_XR_ROWS: their own compiles)
    assert configs.gemv_dot_config("Q4_0", 8, 2048, 24, h200, torch.float16, x_rows=2)["BN"] == 256
