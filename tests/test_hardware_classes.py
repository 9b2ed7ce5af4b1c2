"""Hardware classes beyond one GPU: near-memory PIM, expert parallelism, CPU layer split,
2:4 sparsity, spatial chips. Each against an independent hand calculation."""
from dataclasses import replace

import numpy as np
import pytest
from conftest import run_cli

from basis.errors import DseError
from dse.core.efficiency import IDEAL
from dse.core.roofline import OpArrays, op_costs, pim_mask
from dse.system.analysis import analyze
from dse.system.hardware import system_arrays
from hwmodels.device import PimUnit
from hwmodels.presets import load_device
from workloads import optable
from workloads.footprint import layer_parameter_count, parameter_count
from workloads.model import load_model
from workloads.scenario import Scenario


def _pim_gpu(multiple=4.0, pim_peak=50e12, operators=("attention", "gemv"), concurrent=False):
    """An H100 whose HBM computes: the PIM's figures are parameters of the test."""
    d = load_device("h100-sxm")
    return replace(d, name="h100-pim", device_class="pim",
                   pim=PimUnit({"fp16": pim_peak}, multiple, tuple(operators), concurrent))


def _row(rows, name):
    return next(r for r in rows if r["name"] == name)


# ---------------------------------------------------------------- PIM

def test_pim_runs_low_intensity_operators_only():
    m, d = load_model("llama-2-7b"), _pim_gpu()
    sc = Scenario.make(batch=8, prompt_len=1024)
    dec = OpArrays.from_table(optable.decode_step(m, sc, 1024))
    pre = OpArrays.from_table(optable.prefill(m, sc))
    sys = system_arrays([d], 1)
    ridge = d.peak_ops_per_s["fp16"] / d.memory.bandwidth_bytes_per_s
    for op in (dec, pre):
        mask = pim_mask(op, sys)[0]
        ai = op.ops / op.memory_bytes
        expected = (op.role >= 0) & (ai < ridge)
        assert np.array_equal(mask, expected)
    # decode attention and decode GEMVs at batch 8 are far below the ridge; prefill GEMMs are above
    names = optable.decode_step(m, sc, 1024).names
    assert pim_mask(dec, sys)[0][names.index("qk_matmul")] and pim_mask(dec, sys)[0][names.index("q_proj")]
    pre_names = optable.prefill(m, sc).names
    assert not pim_mask(pre, sys)[0][pre_names.index("q_proj")]
    assert not pim_mask(dec, sys)[0][names.index("softmax")]  # not a PIM role
    # the prefill stays on the host, even its low-intensity attention
    assert not pim_mask(pre, sys)[0].any()
    a = analyze(m, load_device("attacc"), Scenario.make(batch=1, prompt_len=3968, flash_attention=True), ideal=True)
    h = analyze(m, load_device("h100-sxm"), Scenario.make(batch=1, prompt_len=3968, flash_attention=True), ideal=True)
    assert a.summary["ttft_s"] == pytest.approx(h.summary["ttft_s"])


def test_pim_attention_time_is_hand_calculation_and_speedup_bounded():
    m = load_model("llama-2-7b")
    sc = Scenario.make(batch=16, prompt_len=2048)
    table = optable.decode_step(m, sc, 2048)
    i = table.names.index("qk_matmul")
    kv, act = table.kv_bytes[i], table.act_bytes[i]
    host = load_device("h100-sxm")
    for mult in (1.0, 2.0, 4.0, 16.0):
        d = _pim_gpu(multiple=mult, pim_peak=1e18)
        t_pim = op_costs(OpArrays.from_table(table), system_arrays([d], 1), IDEAL).time_s[0, i]
        bw = d.memory.bandwidth_bytes_per_s
        assert t_pim == pytest.approx(kv / (mult * bw) + act / bw, rel=1e-12)
        t_host = op_costs(OpArrays.from_table(table), system_arrays([host], 1), IDEAL).time_s[0, i]
        assert t_host / t_pim <= mult * (1 + 1e-12)
    # the PIM's own peak caps it too: a PIM slower than the host leaves the operator on the
    # host (host time); one whose peak alone takes half the host time runs it at ops / peak
    t_host = op_costs(OpArrays.from_table(table), system_arrays([host], 1), IDEAL).time_s[0, i]
    slow = _pim_gpu(multiple=16.0, pim_peak=1e12)
    t = op_costs(OpArrays.from_table(table), system_arrays([slow], 1), IDEAL).time_s[0, i]
    assert t == pytest.approx(t_host, rel=1e-12)
    peak = table.ops[i] / (0.5 * t_host)
    capped = _pim_gpu(multiple=16.0, pim_peak=peak)
    t = op_costs(OpArrays.from_table(table), system_arrays([capped], 1), IDEAL).time_s[0, i]
    assert t == pytest.approx(table.ops[i] / peak, rel=1e-12)


def test_pim_decode_attention_speedup_never_exceeds_multiple():
    m = load_model("llama-2-7b")
    host = load_device("h100-sxm")
    for batch, ctx, mult in ((1, 512, 2.0), (8, 4000, 4.0), (64, 4000, 8.0)):
        sc = Scenario.make(batch=batch, prompt_len=ctx, gen_len=64)
        pim = _pim_gpu(multiple=mult, pim_peak=1e18, operators=("attention",))
        a_host = analyze(m, host, sc, ideal=True).decode
        a_pim = analyze(m, pim, sc, ideal=True).decode
        attn = ("qk_matmul", "sv_matmul")
        t_host = sum(_row(a_host, n)["total_time_s"] for n in attn)
        t_pim = sum(_row(a_pim, n)["total_time_s"] for n in attn)
        assert all(_row(a_pim, n)["place"] == "pim" for n in attn)
        assert 1 < t_host / t_pim <= mult * (1 + 1e-9)


def test_pim_blocked_adds_concurrent_overlaps():
    m = load_model("llama-2-7b")
    sc = Scenario.make(batch=32, prompt_len=4064, gen_len=32)
    blocked = analyze(m, _pim_gpu(operators=("attention",)), sc, ideal=True)
    conc = analyze(m, _pim_gpu(operators=("attention",), concurrent=True), sc, ideal=True)
    pim_t = sum(r["total_time_s"] for r in blocked.decode if r["place"] == "pim")
    host_t = sum(r["total_time_s"] for r in blocked.decode if r["place"] != "pim")
    table = optable.decode_step(m, sc, sc.prompt_len)
    one_step = OpArrays.from_table(table)
    from dse.core.roofline import step_time
    sys_b = system_arrays([_pim_gpu(operators=("attention",))], 1)
    sys_c = system_arrays([_pim_gpu(operators=("attention",), concurrent=True)], 1)
    assert step_time(one_step, sys_b, IDEAL)[0] == pytest.approx(pim_t + host_t, rel=1e-12)
    assert step_time(one_step, sys_c, IDEAL)[0] == pytest.approx(max(pim_t, host_t), rel=1e-12)
    assert conc.summary["tpot_s"] < blocked.summary["tpot_s"]


# ---------------------------------------------------------------- expert parallel

def test_expert_parallel_weights_and_all_to_all():
    m, d = load_model("mixtral-8x7b"), load_device("h100-sxm")
    sc = Scenario.make(batch=64, prompt_len=256, gen_len=8, tp=2, ep=4)
    assert sc.devices == 8 and sc.group_batch == 16
    a = analyze(m, d, sc, ideal=True)
    # per device: experts / ep, split over tp; attention replicated over the ep groups
    E, h, w = m.num_experts, m.hidden_size, m.moe_intermediate_size
    dense = parameter_count(m, 2) - m.num_moe_layers * E * 3 * h * w / 2
    assert parameter_count(m, 2, 1, 4) == pytest.approx(dense + m.num_moe_layers * E / 4 * 3 * h * w / 2)
    # dispatch: the group's 16 tokens x k=2 hidden vectors, 3/4 of them leave the group, split over tp=2
    link = d.interconnect.bandwidth_bytes_per_s
    elems = 16 * m.experts_per_token * h * 3 / 4 / 2
    assert _row(a.decode, "moe_dispatch")["time_s"] == pytest.approx(elems * 2 / link + d.interconnect.latency_s)
    # experts read per group: (E/ep)(1 - (1 - k/E)^(T ep)) with T ep = 64 tokens
    touched = E / 4 * (1 - (1 - 2 / E) ** 64)
    assert _row(a.decode, "expert_up_proj")["weight_bytes"] == pytest.approx(touched * h * w / 2 * 2)


def test_expert_parallel_bad_layouts():
    with pytest.raises(DseError, match="does not divide num_experts"):
        analyze(load_model("mixtral-8x7b"), load_device("h100-sxm"), Scenario.make(ep=3, batch=6))
    with pytest.raises(DseError, match="mixture-of-experts"):
        analyze(load_model("llama-2-7b"), load_device("h100-sxm"), Scenario.make(ep=2, batch=2))
    r = run_cli("analyze", "--model", "mixtral-8x7b", "--hardware", "h100-sxm", "--devices", "6", "--ep", "4")
    assert r.returncode == 2 and "--ep 4" in r.stderr and "Traceback" not in r.stderr


# ---------------------------------------------------------------- CPU layer split

def test_cpu_layer_split_decode_is_sum_of_both_sides():
    m, gpu, cpu = load_model("llama-2-7b"), load_device("l40s"), load_device("xeon-spr")
    sc = Scenario.make(batch=1, prompt_len=128, gen_len=2)
    n = 8
    a = analyze(m, gpu, sc, ideal=True, cpu_layers=n, host_cpu=cpu)
    s = a.summary
    layer_w = layer_parameter_count(m) * 2
    w_cpu = layer_w * n / m.num_layers
    head = m.vocab_size * m.hidden_size * 2         # lm_head (the embedding reads one row)
    w_gpu = layer_w - w_cpu + head
    # one decode step at batch 1 is memory-bound on both sides: its time is at least the
    # weights each side streams over its own memory (KV and activations add a little)
    lower = w_gpu / gpu.memory.bandwidth_bytes_per_s + w_cpu / cpu.memory.bandwidth_bytes_per_s
    assert lower <= s["tpot_s"] <= lower * 1.03
    assert s["weights_bytes"] == pytest.approx(parameter_count(m) * 2)
    assert s["offloaded_bytes"] == pytest.approx(w_cpu + s["kv_cache_bytes"] * n / m.num_layers, rel=1e-9)
    assert {r["place"] for r in a.decode} == {"device", "cpu"}
    # more layers on the CPU: slower
    assert analyze(m, gpu, sc, ideal=True, cpu_layers=16, host_cpu=cpu).summary["tpot_s"] > s["tpot_s"]


def test_cpu_split_cli_and_errors():
    r = run_cli("analyze", "--model", "llama-2-7b", "--hardware", "l40s", "--cpu-layers", "4",
                "--host-cpu", "xeon-spr", "--format", "json")
    assert r.returncode == 0, r.stderr
    r = run_cli("analyze", "--model", "llama-2-7b", "--hardware", "l40s", "--cpu-layers", "99",
                "--host-cpu", "xeon-spr")
    assert r.returncode == 2 and "--cpu-layers" in r.stderr
    r = run_cli("analyze", "--model", "llama-2-7b", "--hardware", "l40s", "--cpu-layers", "4",
                "--host-cpu", "h100-sxm")
    assert r.returncode == 2 and "not a cpu preset" in r.stderr


# ---------------------------------------------------------------- 2:4 sparsity

def test_sparse_rates_only_when_asked():
    m, d = load_model("llama-2-70b"), load_device("h100-sxm")
    if not d.sparse_peak_ops_per_s:
        pytest.skip("h100-sxm publishes no sparse peaks")
    sc = Scenario.make(batch=64, prompt_len=2048, gen_len=2)
    dense = analyze(m, d, sc, ideal=True)
    sparse = analyze(m, d, sc, ideal=True, sparse=True)
    q_d, q_s = _row(dense.prefill, "q_proj"), _row(sparse.prefill, "q_proj")
    gain = d.sparse_peak_ops_per_s["fp16"] / d.peak_ops_per_s["fp16"]
    assert q_d["bound"] == "compute"
    assert q_d["time_s"] / q_s["time_s"] == pytest.approx(gain)
    # attention matmuls have no sparse weights: unchanged
    assert _row(sparse.prefill, "qk_matmul")["time_s"] == pytest.approx(_row(dense.prefill, "qk_matmul")["time_s"])


# ---------------------------------------------------------------- spatial (LPU-style)

def test_groq_chip_count_is_bytes_over_sram():
    import math

    from dse.system.analysis import analyze_point
    from workloads.footprint import kv_cache_bytes_per_token
    m, d = load_model("llama-2-70b"), load_device("groq-lpu")
    assert d.device_class == "spatial"
    sc = Scenario.make(batch=1, prompt_len=512, gen_len=128, weights="int8", activations="int8", kv="int8",
                       flash_attention=True)       # as analyze_point runs it: the chip's SRAM is its buffer
    # hand calculation: INT8 weights are 1 byte per parameter; KV is 2 x 8 heads x 128 x 80 layers
    # bytes per token over 640 tokens; activations bounded by one prefill's live set
    weights = parameter_count(m) * 1.0
    kv = 640 * 2 * 8 * 128 * 80
    assert kv_cache_bytes_per_token(m, sc) * 640 == kv
    # no tp / pp / devices given: the chip count and layout follow from capacity
    a, _ = analyze_point({"model": "llama-2-70b", "hardware": "groq-lpu", "batch": 1, "prompt_len": 512,
                          "gen_len": 128, "weights": "int8", "activations": "int8", "kv": "int8"})
    need, tp, pp = a.summary["chips_required"], a.summary["tp"], a.summary["pp"]
    sram = d.memory.capacity_bytes
    assert math.ceil((weights + kv) / sram) <= need <= math.ceil((weights + kv + 64 * 2**20) / sram)
    assert need == math.ceil(analyze(m, d, sc).summary["peak_memory_bytes"] / sram)
    assert tp * pp >= need and m.num_layers % pp == 0 and m.num_heads % tp == 0
    assert a.summary["fits"] and a.summary["peak_memory_bytes"] <= sram
    same = analyze(m, d, replace(sc, tp=tp, pp=pp)).summary | {"chips_required": need}
    assert {k: v for k, v in a.summary.items() if v == v} == {k: v for k, v in same.items() if v == v}
    # no smaller layout with enough chips fits (the smallest tp x pp is used)
    for t in (1, 2, 4, 8):
        for p in (1, 2, 4, 5, 8, 10, 16, 20, 40, 80):
            if need <= t * p < tp * pp:
                assert not analyze(m, d, replace(sc, tp=t, pp=p)).summary["fits"], (t, p)


def test_spatial_pipeline_full_throughput():
    # with the pipeline full (batch >= stages) a token leaves every stage time: throughput
    # is batch / (one pass), per-user latency one pass of all stages
    m, d = load_model("llama-2-7b"), load_device("groq-lpu")
    sc1 = Scenario.make(batch=1, prompt_len=128, gen_len=32, weights="int8", activations="int8", kv="int8",
                        tp=8, pp=8)
    sc8 = replace(sc1, batch=8)
    s1, s8 = analyze(m, d, sc1, ideal=True).summary, analyze(m, d, sc8, ideal=True).summary
    # eight one-sequence micro-batches each cost one pass as long as the stages stay memory-bound:
    # per-user rate unchanged, decode throughput 8x
    assert s8["tpot_s"] == pytest.approx(s1["tpot_s"], rel=0.05)
    assert (8 / s8["tpot_s"]) / (1 / s1["tpot_s"]) == pytest.approx(8, rel=0.05)


def test_spatial_cli_reports_chips():
    r = run_cli("analyze", "--model", "llama-2-7b", "--hardware", "groq-lpu", "--weights", "int8",
                "--activations", "int8", "--kv", "int8", "--format", "json")
    assert r.returncode == 0, r.stderr
    import json
    s = json.loads(r.stdout)["summary"]
    assert s["devices"] >= s["chips_required"] > 1


def test_every_named_preset_is_listed():
    names = ("rtx-a6000 t4 a100-40gb a100-80gb h100-sxm h100-pcie h200 gh200 b200 gb200 rtx-pro-6000 l40s rtx-4090 "
             "mi250x mi300x mi325x mi355x tpu-v4 tpu-v5e tpu-v5p tpu-v6e gaudi2 gaudi3 groq-lpu cerebras-wse3 sn40l "
             "m2-ultra m2-max xeon-spr epyc-genoa hbm-pim gddr6-aim attacc").split()
    r = run_cli("list", "hardware")
    assert set(names) <= set(r.stdout.split())
    for n in ("hbm-pim", "gddr6-aim", "attacc"):
        assert load_device(n).pim is not None and load_device(n).device_class == "pim"
    import json
    j = json.loads(run_cli("show", "hardware", "attacc", "--format", "json").stdout)
    assert j["pim"]["internal_bandwidth_multiple"] > 1 and j["memory_tiers"][0]["bandwidth_bytes_per_s"] > 0


def test_attacc_preset_speeds_decode_attention_within_multiple():
    # multi-head attention (Llama-2-7B): one KV head per query head, intensity ~1 op/byte, where
    # AttAcc's bank-level PIM pays off (grouped-query models put 8x more ops on each KV byte)
    m = load_model("llama-2-7b")
    sc = Scenario.make(batch=32, prompt_len=4064, gen_len=16, weights="fp8", activations="fp8", kv="fp8")
    gpu, pim = load_device("h100-sxm"), load_device("attacc")
    a_gpu, a_pim = analyze(m, gpu, sc, ideal=True), analyze(m, pim, sc, ideal=True)
    t = lambda a: sum(r["total_time_s"] for r in a.decode if r["name"] in ("qk_matmul", "sv_matmul"))  # noqa: E731
    assert 1 < t(a_gpu) / t(a_pim) <= pim.pim.internal_bandwidth_multiple
    assert a_pim.summary["tpot_s"] < a_gpu.summary["tpot_s"]


def test_offload_to_cxl_and_nvme_tiers():
    from hwmodels.tiers import available_tiers, load_tier, with_host_tier
    assert {"cxl-cmm-d-128gb", "cxl-cmm-b-16tb", "nvme-990pro-2tb"} <= set(available_tiers())
    m, d = load_model("llama-2-70b"), load_device("h100-sxm")
    sc = Scenario.make(batch=1, prompt_len=256, gen_len=8)
    t = {}
    for name in ("cxl-cmm-b-16tb", "nvme-990pro-2tb"):
        s = analyze(m, with_host_tier(d, name), sc, offload="greedy", ideal=True).summary
        assert s["fits"]
        # every step streams the offloaded share of the weights (KV stays on the device under greedy
        # here); the embedding table is only read one row per token, hence the 0.1 % slack
        assert s["kv_cache_bytes"] < d.memory.capacity_bytes
        assert s["tpot_s"] >= s["offloaded_bytes"] / load_tier(name).bandwidth_bytes_per_s * (1 - 1e-3)
        t[name] = s["tpot_s"]
    assert t["nvme-990pro-2tb"] / t["cxl-cmm-b-16tb"] == pytest.approx(60 / 7.45, rel=0.05)
    with pytest.raises(DseError, match="valid tiers"):
        load_tier("floppy")


def test_a_hardware_class_is_a_declared_kind():
    """Each class is declared once with its properties (``hwmodels.classes``) and found by name;
    the evaluator asks a property, never the class's name: chip sizing follows sized_by_capacity."""
    from dse.system.evaluator import evaluate, prepare
    from hwmodels.classes import CLASSES, DEVICE_CLASSES, device_class
    from hwmodels.presets import DEVICE_CLASSES as PRESET_CLASSES
    assert PRESET_CLASSES == DEVICE_CLASSES == tuple(c.name for c in CLASSES)
    assert [c.name for c in CLASSES if c.sized_by_capacity] == ["spatial"]
    assert [c.name for c in CLASSES if c.has_pim] == ["pim"]
    assert [c.name for c in CLASSES if c.hosts_layers] == ["cpu"]
    with pytest.raises(DseError, match="not one of"):
        device_class("quantum")
    cols = {"hardware": ["groq-lpu", "h100-sxm"], "model": "llama-2-7b", "batch": 1}
    hw = prepare(cols).hw                        # (points held in the evaluator's order)
    assert sorted((hw.kind(i).name, bool(hw.sized_by_capacity[i])) for i in range(2)) == [("gpu", False),
                                                                                         ("spatial", True)]
    assert np.isfinite(evaluate(cols)["chips_required"]).tolist() == [True, False]
