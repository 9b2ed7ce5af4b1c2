"""The DSE engine: vectorized evaluation equals the single-point path, physics is monotone,
sweeps resume, bad spaces fail with one clear error."""
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from conftest import run_cli
from hypothesis import given, settings
from hypothesis import strategies as st

from basis.errors import DseError
from dse.core.efficiency import DEFAULT
from dse.core.roofline import OpArrays, _decode_general, _step_sum, decode_total_time, op_costs, step_time
from dse.explore import sweep as sweep_mod
from dse.explore.space import DesignSpace
from dse.explore.spec import SweepSpec
from dse.explore.sweep import run_sweep
from dse.system.analysis import analyze
from dse.system.evaluator import evaluate
from dse.system.hardware import system_arrays
from hwmodels.device import MemoryTier
from hwmodels.presets import load_device
from workloads import optable
from workloads.model import load_model
from workloads.scenario import Scenario

METRICS = ("ttft_s", "tpot_s", "output_tokens_per_s", "prefill_tokens_per_s")


@st.composite
def designs(draw):
    hw = draw(st.sampled_from(["h100-sxm", "a100-80gb", "mi300x", "l40s", "tpu-v5e"]))
    model = draw(st.sampled_from(["llama-2-7b", "mistral-7b", "mixtral-8x7b", "gpt-j-6b"]))
    tp = draw(st.sampled_from([1, 2, 4]))
    return dict(
        hardware=hw, model=model, tp=tp,
        batch=draw(st.integers(1, 96)), prompt_len=draw(st.integers(1, 4096)), gen_len=draw(st.integers(1, 300)),
        weights=draw(st.sampled_from(["fp16", "fp8", "int4", "int8"])),
        kv=draw(st.sampled_from(["fp16", "fp8"])), flash_attention=draw(st.booleans()),
        memory_bandwidth=draw(st.floats(2e11, 2e13)), peak_fp16=draw(st.floats(5e13, 5e15)),
        memory_capacity=draw(st.floats(2e10, 1e12)),
    )


@settings(max_examples=40, deadline=None)
@given(st.lists(designs(), min_size=1, max_size=4))
def test_vectorized_equals_single_point_analyze(points):
    cols = {k: np.array([p[k] for p in points], dtype=object if isinstance(points[0][k], str) else None)
            for k in points[0]}
    out = evaluate(cols)
    for i, p in enumerate(points):
        d = load_device(p["hardware"])
        peaks = dict(d.peak_ops_per_s, fp16=p["peak_fp16"])
        d = replace(d, peak_ops_per_s=peaks, memory_tiers=(MemoryTier(d.memory.name, p["memory_capacity"],
                                                                      p["memory_bandwidth"]),))
        sc = Scenario.make(batch=p["batch"], prompt_len=p["prompt_len"], gen_len=p["gen_len"], weights=p["weights"],
                           kv=p["kv"], flash_attention=p["flash_attention"], tp=p["tp"])
        try:
            s = analyze(load_model(p["model"]), d, sc).summary
        except DseError:
            assert not out["feasible"][i] and out["reason"][i]
            continue
        for k in METRICS:
            assert out[k][i] == pytest.approx(s[k], rel=1e-9), k
        assert bool(out["feasible"][i]) == s["fits"]
        assert out["memory_bytes"][i] == pytest.approx(s["peak_memory_bytes"], rel=1e-12)


def test_separable_path_equals_per_operator_kernel():
    rng = np.random.default_rng(1)
    m = load_model("llama-2-13b")
    sc = Scenario.make(batch=24, prompt_len=700, gen_len=200, weights="int4", flash_attention=True)
    d = load_device("h100-sxm")
    base = system_arrays([d], 1)
    n = 500
    sys = replace(base.take(np.zeros(n, dtype=int)), peak=base.peak[[0] * n] * rng.uniform(0.05, 20, (n, 1)),
                  bandwidth=base.bandwidth[0] * rng.uniform(0.05, 20, n))
    for table in (optable.prefill(m, sc, d.onchip_buffer_bytes), optable.decode_step(m, sc, 900, 233472)):
        op = OpArrays.from_table(table)
        c = op_costs(op, sys, DEFAULT)
        per_op = _step_sum(c.time_s, op.count, None, sys) + DEFAULT.step_overhead_s
        np.testing.assert_allclose(step_time(op, sys, DEFAULT), per_op, rtol=1e-12)
    d0, slope = (OpArrays.from_table(t) for t in optable.decode_linear(m, sc, 701, 233472))
    steps = np.full(n, 199.0)
    np.testing.assert_allclose(decode_total_time(d0, slope, steps, sys, DEFAULT),
                               _decode_general(d0, slope, steps, sys, DEFAULT) + DEFAULT.step_overhead_s * steps,
                               rtol=1e-12)


def _space(**kw):
    base = dict(hardware="h100-sxm", model="llama-2-7b", batch=[1, 16, 128], prompt_len=1024, gen_len=128,
                flash_attention=True)
    return DesignSpace({**base, **kw})


def test_monotone_in_bandwidth_compute_capacity_and_bits():
    n = 400
    rng = np.random.default_rng(7)
    bw = rng.uniform(5e11, 1e13, n)
    pk = rng.uniform(1e14, 4e15, n)
    cap = rng.uniform(1e10, 2e11, n)
    # the roofline's monotonicity with power unlimited: under a power limit more bandwidth can leave
    # less power for compute, so a capped design may run a lower clock (dse.system.evaluator._capped)
    cols = dict(hardware="h100-sxm", model="llama-2-13b", batch=64, prompt_len=2048, gen_len=64,
                memory_bandwidth=bw, peak_fp16=pk, memory_capacity=cap, tdp_w=1e6)
    a = evaluate(cols)
    more_bw = evaluate({**cols, "memory_bandwidth": bw * 1.3})
    more_pk = evaluate({**cols, "peak_fp16": pk * 1.3})
    more_cap = evaluate({**cols, "memory_capacity": cap * 1.3})
    for b in (more_bw, more_pk):
        for k in ("ttft_s", "tpot_s", "e2e_latency_s"):
            assert np.all(b[k] <= a[k] * (1 + 1e-12))
        assert np.all(b["output_tokens_per_s"] >= a["output_tokens_per_s"] * (1 - 1e-12))
    assert np.all(more_cap["feasible"] | ~a["feasible"])
    assert a["feasible"].any() and (~a["feasible"]).any()
    # lower-bit weights never read more bytes
    bits = {f: evaluate({**cols, "weights": f})["weights_bytes"][0]
            for f in ("fp32", "fp16", "fp8", "fp6", "mxfp6", "int4", "fp4", "nvfp4")}
    order = sorted(bits, key=lambda f: __import__("hwmodels.formats", fromlist=["x"]).get_format(f).bits)
    assert all(bits[x] <= bits[y] for x, y in zip(order, order[1:]))


def test_grid_random_sobol_and_pareto(tmp_path):
    sp = _space(memory_bandwidth={"min": 1e12, "max": 8e12, "count": 5}, peak_fp16={"min": 2e14, "max": 2e15,
                                                                                   "count": 4, "scale": "log"})
    spec = SweepSpec(sp, objectives={"output_tokens_per_s": "max", "memory_bandwidth": "min"})
    assert spec.points == 3 * 5 * 4
    res, front = run_sweep(spec)
    assert len(res) == 60 and res["feasible"].dtype == bool
    assert sorted(res["memory_bandwidth"].unique()) == pytest.approx(np.linspace(1e12, 8e12, 5))
    feas = res[res.feasible]
    for _, r in front.iterrows():
        dominated = ((feas.output_tokens_per_s >= r.output_tokens_per_s) & (feas.memory_bandwidth <= r.memory_bandwidth)
                     & ((feas.output_tokens_per_s > r.output_tokens_per_s) | (feas.memory_bandwidth < r.memory_bandwidth)))
        assert not dominated.any()
    for method in ("random", "sobol"):
        s = SweepSpec(sp, method=method, samples=64, seed=3, objectives={"tpot_s": "min"})
        r1, _ = run_sweep(s)
        r2, _ = run_sweep(s)
        pd.testing.assert_frame_equal(r1, r2)        # deterministic under one seed
        assert r1.memory_bandwidth.between(1e12, 8e12).all() and len(r1) == 64


def test_interrupted_sweep_resumes_without_redoing_chunks(tmp_path, monkeypatch):
    sp = _space(memory_bandwidth={"min": 1e12, "max": 8e12, "count": 10})
    spec = SweepSpec(sp, objectives={"output_tokens_per_s": "max", "memory_bandwidth": "min"}, chunk_size=7)
    calls, interrupted = [], []
    real = sweep_mod.evaluate_chunk

    def flaky(spec_, k):
        calls.append(k)
        if k == 2 and not interrupted:
            interrupted.append(k)
            raise RuntimeError("interrupted")
        return real(spec_, k)
    monkeypatch.setattr(sweep_mod, "evaluate_chunk", flaky)
    with pytest.raises(RuntimeError, match="interrupted"):
        run_sweep(spec, tmp_path / "run")
    assert calls == [0, 1, 2]
    calls.clear()
    _, front = run_sweep(spec, tmp_path / "run")
    assert calls == [2, 3, 4]              # chunks 0 and 1 came from disk
    res = pd.read_parquet(tmp_path / "run" / "results.parquet")
    assert list(res.point) == list(range(30))
    full, _ = run_sweep(spec)
    full["reason"] = full["reason"].astype(str)        # a category in memory, a string column on disk
    res["reason"] = res["reason"].astype(str)
    pd.testing.assert_frame_equal(res.reset_index(drop=True), full, check_dtype=False)
    assert len(pd.read_csv(tmp_path / "run" / "pareto.csv")) == len(front)
    # a different space in the same folder is refused
    with pytest.raises(DseError, match="another version of this study"):
        run_sweep(SweepSpec(_space(batch=[2]), objectives={"tpot_s": "min"}), tmp_path / "run")


@pytest.mark.parametrize("spec, match", [
    ({"batch": {"min": 8, "max": 2, "step": 1}}, "empty range"),
    ({"memory_bandwidth": {"min": 1e12, "max": 2e12, "step": 5e12}}, "larger than the range"),
    ({"warp_factor": 9}, "unknown parameter"),
    ({"batch": []}, "empty list"),
    ({"memory_bandwidth": {"min": 1e12, "max": 2e12, "step": 1e11, "count": 3}}, "not both"),
    ({"memory_bandwidth": -5.0}, "expected a finite number > 0"),
])
def test_bad_spaces(spec, match):
    with pytest.raises(DseError, match=match):
        _space(**spec)


def test_bad_sweeps():
    with pytest.raises(DseError, match="a grid needs 'step' or 'count'"):
        SweepSpec(_space(memory_bandwidth={"min": 1e12, "max": 2e12}))
    with pytest.raises(DseError, match="unknown metric"):
        SweepSpec(_space(), objectives={"speed": "max"})
    with pytest.raises(DseError, match="contradictory"):
        SweepSpec(_space(), constraints={"tpot_s": {"min": 1, "max": 0.5}})
    with pytest.raises(DseError, match="more than max_points"):
        SweepSpec(_space(memory_bandwidth={"min": 1e12, "max": 2e12, "count": 1000}), max_points=1000)


def test_run_cli_writes_results_and_pareto(tmp_path):
    study = tmp_path / "tiny.yaml"
    study.write_text("""
name: tiny
description: a tiny grid
space:
  hardware: [h100-sxm, a100-80gb]
  model: llama-2-7b
  batch: [1, 8]
  memory_bandwidth: {min: 1.0e12, max: 4.0e12, count: 3}
objectives: {output_tokens_per_s: max, memory_bandwidth: min}
constraints: {ttft_s: {max: 10}}
""")
    r = run_cli("run", study, "--out", tmp_path / "out", "--quiet")
    assert r.returncode == 0, r.stderr
    res = pd.read_parquet(tmp_path / "out" / "results.parquet")
    assert len(res) == 12 and res.feasible.dtype == bool
    front = pd.read_csv(tmp_path / "out" / "pareto.csv")
    assert {"hardware", "batch", "memory_bandwidth", "output_tokens_per_s"} <= set(front.columns)
    assert set(front.point) <= set(res[res.feasible].point)
    bad = tmp_path / "bad.yaml"
    bad.write_text("space: {hardware: h100-sxm, model: llama-2-7b}\nmethod: annealing\n")
    r = run_cli("run", bad, "--out", tmp_path / "o2")
    assert r.returncode == 2 and "method" in r.stderr and "Traceback" not in r.stderr
    bad.write_text("space: {hardware: h100-sxm, model: llama-2-7b}\nobjective: {tpot_s: min}\n")
    r = run_cli("run", bad, "--out", tmp_path / "o3")
    assert r.returncode == 2 and "unknown key(s) objective" in r.stderr


def test_shipped_studies_validate():
    from dse.study.studyfile import available_studies, load_study
    assert "gpu-sweep-1m" in available_studies()
    for name in available_studies():
        _, spec = load_study(name)
        assert spec.points >= 1
    _, spec = load_study("gpu-sweep-1m")
    assert spec.points >= 1_000_000


@pytest.mark.parametrize("hw, model, extra, kw", [
    ("h100-sxm", "llama-2-70b", dict(offload="greedy", batch=4), dict(offload="greedy")),
    ("attacc", "llama-2-7b", dict(batch=32, prompt_len=3840), {}),
    ("hbm-pim", "llama-2-7b", dict(batch=1), {}),
    ("groq-lpu", "llama-2-7b", dict(tp=8, pp=8, weights="int8", activations="int8", kv="int8"), {}),
    ("h100-sxm", "mixtral-8x7b", dict(devices=8, ep=4, batch=64), {}),
    ("h100-sxm", "llama-2-70b", dict(sparse=True, batch=64, prompt_len=2048), dict(sparse=True)),
])
def test_vectorized_equals_analyze_on_every_class(hw, model, extra, kw):
    cols = {"hardware": hw, "model": model, "prompt_len": 1024, "gen_len": 64, "flash_attention": False, **extra}
    out = evaluate(cols)
    sc_kw = {k: v for k, v in extra.items() if k in ("batch", "prompt_len", "tp", "pp", "ep", "weights",
                                                     "activations", "kv")}
    if "devices" in extra:
        sc_kw["tp"] = extra["devices"] // (extra.get("pp", 1) * extra.get("ep", 1))
    sc = Scenario.make(**{"prompt_len": 1024, "gen_len": 64, **sc_kw})
    s = analyze(load_model(model), load_device(hw), sc, **kw).summary
    for k in METRICS + ("e2e_latency_s", "offloaded_bytes"):
        assert out[k][0] == pytest.approx(s[k], rel=1e-9), k
    assert bool(out["feasible"][0]) == s["fits"]


def test_budgets_and_slos_mark_points_infeasible_with_reasons():
    sp = _space(hardware=["h100-sxm", "b200"], batch=[1, 64])
    spec = SweepSpec(sp, objectives={"output_tokens_per_s": "max"},
                     constraints={"tpot_s": {"max": 0.012}, "power_w": {"max": 300}})
    res, front = run_sweep(spec)
    b200 = res[res.hardware == "b200"]
    fast = b200[b200.tpot_s <= 0.012]              # the others may miss the TPOT bound first
    assert (~b200.feasible).all() and len(fast) and fast.reason.str.contains("power_w > 300").all()
    slow = res[(res.tpot_s > 0.012)]
    assert (~slow.feasible).all() and slow.reason.str.contains("tpot_s").all()
    assert set(front.point) <= set(res[res.feasible].point)


def test_analyze_reproduces_evaluated_point():
    from dse.system.analysis import analyze_point
    params = dict(hardware="h100-sxm", model="llama-2-13b", batch=16, prompt_len=1000, gen_len=50, weights="fp8",
                  memory_bandwidth=5e12, memory_capacity=1e11, peak_fp8=3e15, native_formats="fp16,fp8",
                  flash_attention=True)
    out = evaluate(params)
    s = analyze_point(params)[0].summary
    s["memory_bytes"] = s["peak_memory_bytes"]
    for k in METRICS:
        assert out[k][0] == pytest.approx(s[k], rel=1e-9)


@pytest.mark.parametrize("spec, match", [
    ({"hardware": ["h100-sxm", "h900"]}, r"space.hardware\[1\]: unknown hardware 'h900'"),
    ({"model": "gpt-5"}, r"space.model: unknown model"),
    ({"weights": ["fp8", "fp3"]}, r"space.weights\[1\]: unknown weights format 'fp3'|space.weights\[1\]: unknown format 'fp3'"),
    ({"offload": "sometimes"}, r"space.offload: offload 'sometimes'"),
    ({"native_formats": ["fp16,fp9"]}, r"unknown compute format"),
])
def test_unknown_names_fail_before_any_work(spec, match):
    with pytest.raises(DseError, match=match):
        _space(**spec)
