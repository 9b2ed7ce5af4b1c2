"""One evaluator: a design point gives the same answer alone, inside a table of other
points, and through ``analyze``; the divergences the two old evaluators had are settled."""
import numpy as np
import pytest

from basis.errors import DseError
from dse import evaluate
from dse.system.analysis import analyze_point
from dse.system.evaluator import METRICS, prepare
from dse.system.params import DEFAULTS, MAY_BE_MISSING, SPEC
from hwmodels.classes import device_class
from hwmodels.presets import available_hardware, load_device

PRESETS = available_hardware()
MODELS = ["llama-2-7b", "mixtral-8x7b", "llama-3.1-8b", "gpt-j-6b", "llama-2-70b"]


def _random_point(rng) -> dict:
    """A random design point over every shipped preset and every feature."""
    hw = str(rng.choice(PRESETS))
    p = {"hardware": hw, "model": str(rng.choice(MODELS)), "batch": int(rng.choice([1, 4, 16, 64])),
         "prompt_len": int(rng.integers(16, 2048)), "gen_len": int(rng.integers(1, 256)),
         "weights": str(rng.choice(["fp16", "fp8", "int4", "int8"])), "kv": str(rng.choice(["fp16", "fp8"])),
         "flash_attention": bool(rng.random() < 0.4), "sparse": bool(rng.random() < 0.3),
         "offload": str(rng.choice(["none", "none", "greedy", "weights=0.5,kv=0.2"]))}
    if device_class(load_device(hw).device_class).sized_by_capacity:
        if rng.random() < 0.5:           # else: the chip layout is sized from capacity
            p["tp"], p["pp"] = int(rng.choice([1, 2, 4])), int(rng.choice([1, 2]))
    elif rng.random() < 0.5:
        p["tp"] = int(rng.choice([1, 2, 4]))
        p["pp"] = int(rng.choice([1, 2]))
        if p["model"] == "mixtral-8x7b" and rng.random() < 0.5:
            p["ep"] = int(rng.choice([2, 4]))
    if rng.random() < 0.15:
        p.update(cpu_layers=int(rng.integers(1, 8)), host_cpu="xeon-spr", offload="none", tp=1, pp=1)
        p.pop("ep", None)
    if rng.random() < 0.2:
        p["batch"] = "max"
    if rng.random() < 0.3:
        p["memory_bandwidth"] = float(rng.uniform(2e11, 8e12))
    if rng.random() < 0.2:
        p["compute_scale"] = float(rng.uniform(0.5, 3))
    return p


def _table(points: list[dict]) -> dict:
    keys = sorted({k for p in points for k in p})
    defaults = {"tp": np.nan, "pp": np.nan, "ep": 1, "cpu_layers": 0, "memory_bandwidth": np.nan,
                "compute_scale": 1.0, "host_cpu": "xeon-spr"}
    cols = {}
    for k in keys:
        vals = [p.get(k, defaults.get(k)) for p in points]
        cols[k] = np.array(vals, dtype=object if any(isinstance(v, str) for v in vals) else None)
    if "memory_bandwidth" in cols:      # NaN: the preset's own (a table needs a value per point)
        mb = cols.pop("memory_bandwidth").astype(float)
        if np.isfinite(mb).all():
            cols["memory_bandwidth"] = mb
    return cols


def _same(a, b, i, j):
    for k in METRICS:
        x, y = a[k][i], b[k][j]
        assert (np.isnan(x) and np.isnan(y)) or x == pytest.approx(y, rel=1e-12, abs=0), k
    assert a.feasible[i] == b.feasible[j] and a.reason_key(i) == b.reason_key(j)


@pytest.mark.parametrize("seed", range(6))
def test_row_alone_equals_row_in_a_table_and_analyze(seed):
    rng = np.random.default_rng(seed)
    points = []
    while len(points) < 51:
        p = _random_point(rng)
        if "memory_bandwidth" in p and len(points) % 2:     # keep one override column consistent per table
            p.pop("memory_bandwidth")
        points.append(p)
    for p in points:
        p.pop("memory_bandwidth", None)
    table = evaluate(_table(points))
    for i in rng.choice(len(points), 8, replace=False):
        alone = evaluate(_table([points[i]]))
        _same(table, alone, i, 0)
        a, ev = analyze_point(points[i])
        _same(ev, alone, 0, 0)
        s = a.summary
        for k in ("ttft_s", "tpot_s", "output_tokens_per_s"):
            assert (np.isnan(s[k]) and np.isnan(alone[k][0])) or s[k] == pytest.approx(alone[k][0], rel=1e-12)
        assert s["feasible"] == bool(alone.feasible[0])


def test_groups_writing_different_metrics_and_groups_never_priced_share_one_table():
    """Static batches, continuous serving (metrics of its own) and points that fail before any
    pricing (a tp that does not divide the model, FlashAttention without an on-chip buffer),
    interleaved in one table: every metric of every point is what the point gives alone (NaN
    where its kind of group does not write it)."""
    points = [dict(hardware=hw, serving=mode, concurrency=load, tp=tp, onchip_buffer_bytes=buf, flash_attention=fa)
              for hw, mode, load, tp, buf, fa in [
                  ("h100-sxm", "static", 0, 1, 1e7, False), ("h100-sxm", "continuous", 16, 1, 1e7, False),
                  ("h100-sxm", "static", 0, 3, 1e7, False), ("a100-80gb", "continuous", 8, 1, 1e7, False),
                  ("h100-sxm", "static", 0, 2, 1e7, False), ("h100-sxm", "static", 0, 1, 0.0, True),
                  ("a100-80gb", "continuous", 4, 3, 1e7, False), ("a100-80gb", "static", 0, 1, 1e7, False)]]
    for p in points:
        p.update(model="llama-2-7b", batch=8)
    table = evaluate(_table(points))
    assert {table.reason_key(i) for i in range(len(points))} >= {"", "model_split", "onchip_buffer"}
    # a static batch and a served point, both priced, write different sets of metrics
    assert any(np.isnan(table[k][0]) != np.isnan(table[k][1]) for k in METRICS)
    for i in range(len(points)):
        _same(table, evaluate(_table([points[i]])), i, 0)


def _one(**kw):
    return evaluate({"model": "llama-2-7b", **kw})


# --------------------------------------------------------------------------- the settled divergences

@pytest.mark.parametrize("hw", ["tpu-v4", "m2-max"])
def test_sparse_without_sparse_peaks_reads_compressed_weights_and_computes_dense(hw):
    # 2:4 sparse weights on a device without sparse matrix units: stored compressed (half the
    # values plus a 2-bit index each: 9 of 16 bits in FP16), so decode reads less, while the
    # prefill's matmuls run at the dense peak (its compute time unchanged)
    dense, sparse = _one(hardware=hw), _one(hardware=hw, sparse=True)
    assert sparse.feasible[0]
    layers_fp16 = dense["weights_bytes"][0] - 2 * 32000 * 4096 * 2          # llama-2-7b: untied embedding and head
    assert sparse["weights_bytes"][0] == pytest.approx(dense["weights_bytes"][0] - layers_fp16 * (1 - 9 / 16),
                                                       rel=1e-3)
    assert sparse["tpot_s"][0] < dense["tpot_s"][0]
    a_dense = analyze_point({"model": "llama-2-7b", "hardware": hw}, ideal=True)[0]
    a_sparse = analyze_point({"model": "llama-2-7b", "hardware": hw, "sparsity": "2:4"}, ideal=True)[0]
    q = [next(r for r in a.prefill if r["name"] == "q_proj") for a in (a_dense, a_sparse)]
    assert q[1]["peak_ops_per_s"] == q[0]["peak_ops_per_s"] and q[1]["weight_bytes"] == pytest.approx(
        q[0]["weight_bytes"] * 9 / 16)


def test_spatial_without_layout_is_sized_from_capacity_everywhere():
    # groq-lpu with no tp/pp/devices: the chip count follows from capacity (64 chips for
    # Llama-2-7B in FP16), in a sweep as in analyze; one SRAM chip never holds the model
    ev = _one(hardware="groq-lpu")
    a, _ = analyze_point({"model": "llama-2-7b", "hardware": "groq-lpu"})
    assert ev.feasible[0] and ev["devices"][0] == a.summary["devices"] >= ev["chips_required"][0] > 1
    assert ev["tpot_s"][0] == a.summary["tpot_s"]
    sram = load_device("groq-lpu").memory.capacity_bytes
    assert ev["memory_bytes"][0] <= sram
    assert ev["chips_required"][0] == np.ceil(evaluate({"model": "llama-2-7b", "hardware": "groq-lpu", "tp": 1,
                                                        "pp": 1})["memory_bytes"][0] / sram)


@pytest.mark.parametrize("hw", ["a100-40gb", "l40s", "epyc-genoa", "hbm-pim", "cerebras-wse3"])
def test_greedy_offload_without_host_memory(hw):
    # greedy offload only overflows what does not fit: a design that fits in device memory is
    # feasible with nothing offloaded; one that does not is infeasible ('no_host_tier'), in
    # sweeps and analyze alike
    small = _one(hardware=hw, offload="greedy", model="gpt-j-6b", batch=1, prompt_len=128, gen_len=8,
                 weights="int4", tp=1, pp=1)
    big = _one(hardware=hw, offload="greedy", model="llama-2-70b", batch=64, prompt_len=3840, tp=1, pp=1)
    dev = load_device(hw)
    if dev.host_link is None or dev.host_memory is None:
        if small["memory_bytes"][0] <= dev.memory.capacity_bytes:
            assert small.feasible[0] and small["offloaded_bytes"][0] == 0
        if big["memory_bytes"][0] > dev.memory.capacity_bytes:
            assert not big.feasible[0] and big.reason_key(0) == "no_host_tier"
        else:
            assert big.feasible[0] and big["offloaded_bytes"][0] == 0
    a, ev = analyze_point({"model": "llama-2-70b", "hardware": hw, "offload": "greedy", "batch": 64,
                           "prompt_len": 3840, "tp": 1, "pp": 1})
    assert ev.reason_key(0) == big.reason_key(0)


def test_sparse_with_scaled_compute_is_the_same_everywhere():
    # sparse peaks are the preset's sparse/dense ratio on top of the design's own dense peak,
    # so compute_scale and peak overrides scale the sparse rate too
    cols = dict(hardware="h100-sxm", model="llama-2-70b", batch=64, prompt_len=2048, weights="fp8",
                activations="fp8", kv="fp8", compute_scale=2.0, sparse=True, tp=4)
    sweep = evaluate(cols)
    a, _ = analyze_point(cols)
    assert a.summary["ttft_s"] == sweep["ttft_s"][0]
    dense = evaluate({**cols, "sparse": False})
    ideal_sparse = evaluate(cols, ideal=True)
    ideal_dense = evaluate({**cols, "sparse": False}, ideal=True)
    # the prefill is compute-bound on its weight matmuls: 2:4 at twice the peak shortens it
    assert sweep["ttft_s"][0] < dense["ttft_s"][0]
    assert ideal_sparse["ttft_s"][0] < ideal_dense["ttft_s"][0] < 2 * ideal_sparse["ttft_s"][0]
    # the explanation shows the doubled, scaled peak on the weight matmuls
    ex = a.prefill
    d = load_device("h100-sxm")
    qkv = next(r for r in ex if r["name"].endswith("_proj"))
    assert qkv["peak_ops_per_s"] == pytest.approx(2.0 * d.sparse_peak_ops_per_s["fp8"], rel=1e-12)


def test_fit_tolerance_is_one_rule():
    # a footprint that fills device memory exactly fits in a sweep and in analyze
    probe = _one(hardware="h100-sxm", tp=1)
    exact = probe["memory_bytes"][0]
    ev = _one(hardware="h100-sxm", tp=1, memory_capacity=exact)
    a, _ = analyze_point({"model": "llama-2-7b", "hardware": "h100-sxm", "tp": 1, "memory_capacity": exact})
    assert ev.feasible[0] and a.summary["fits"]
    assert not _one(hardware="h100-sxm", tp=1, memory_capacity=exact * (1 - 1e-9)).feasible[0]


def test_cpu_split_host_hop_pays_the_collective_latency():
    # the hidden state crossing to the CPU and back is a transfer like any other: it pays the
    # software latency per message (collective_latency_s), as every other transfer does
    from dataclasses import replace

    from dse.core.efficiency import IDEAL
    base = dict(model="llama-2-7b", hardware="l40s", cpu_layers=4, host_cpu="xeon-spr", batch=1, prompt_len=128,
                gen_len=2)
    a = evaluate(base, efficiency=IDEAL)
    b = evaluate(base, efficiency=replace(IDEAL, collective_latency_s=1e-3))
    # two crossings per step: prefill (1 step) and one decode step
    assert b["ttft_s"][0] - a["ttft_s"][0] == pytest.approx(2e-3, rel=1e-9)
    assert b["tpot_s"][0] - a["tpot_s"][0] == pytest.approx(2e-3, rel=1e-9)


def test_batch_max_is_a_study_column(tmp_path):
    # batch: max sweeps like any other value; a point's resolved batch is the one analyze finds
    from dse.explore.space import DesignSpace
    from dse.explore.spec import SweepSpec
    from dse.explore.study import run_study
    from dse.present.report import write_report
    space = DesignSpace({"hardware": ["h100-sxm", "a100-80gb"], "model": "llama-2-7b", "batch": [1, "max"],
                         "prompt_len": 1024, "gen_len": 256})
    spec = SweepSpec(space, objectives={"output_tokens_per_s": "max"})
    run_study(spec, tmp_path)
    write_report(tmp_path, {"name": "bm"}, spec)
    import pandas as pd
    res = pd.read_parquet(tmp_path / "results.parquet")
    for hw in ("h100-sxm", "a100-80gb"):
        row = res[(res.hardware == hw) & (res.batch == "max")].iloc[0]
        a, _ = analyze_point({"model": "llama-2-7b", "hardware": hw, "batch": "max", "prompt_len": 1024,
                              "gen_len": 256})
        assert row.batch_used == a.summary["batch"] > 1
        # the largest that fits: one more sequence does not
        more = evaluate({"model": "llama-2-7b", "hardware": hw, "batch": int(row.batch_used) + 1,
                         "prompt_len": 1024, "gen_len": 256})
        assert not more.feasible[0] and more.reason_key(0) == "device_memory"
    assert (tmp_path / "sweep_batch.png").exists()


def test_results_follow_the_callers_order_whatever_order_the_points_come_in():
    """Points of interleaved workloads are priced grouped by workload and handed back in the
    caller's order (``Reordered``): each point's metrics equal those of its workload's points
    priced on their own (to rounding: eight workloads of ~75 points are priced together at
    [points, operators], one workload alone is not), and the reversed table gives the reversed
    results, bit for bit."""
    rng = np.random.default_rng(3)
    n = 600
    cols = {"hardware": "h100-sxm", "model": "llama-2-7b", "batch": rng.choice([1, 8, 64, 256], n),
            "prompt_len": rng.choice([128, 2048], n), "gen_len": 64,
            "memory_bandwidth": rng.uniform(1e12, 8e12, n), "memory_capacity": rng.uniform(1e10, 8e10, n)}
    ev = evaluate(cols)
    rev = evaluate({k: v[::-1] if np.ndim(v) else v for k, v in cols.items()})
    names = [m for m in METRICS if m in ev]
    assert len(names) > 50
    keys = np.stack([cols["batch"], cols["prompt_len"]], axis=1)
    groups = np.unique(keys, axis=0)
    assert len(groups) == 8
    for b, p in groups:
        at = np.flatnonzero((keys[:, 0] == b) & (keys[:, 1] == p))
        alone = evaluate({**cols, "batch": int(b), "prompt_len": int(p),
                          "memory_bandwidth": cols["memory_bandwidth"][at],
                          "memory_capacity": cols["memory_capacity"][at]})
        np.testing.assert_array_equal(ev["feasible"][at], alone["feasible"])
        np.testing.assert_array_equal(ev["reason"][at], alone["reason"])
        for m in names:
            np.testing.assert_allclose(ev[m][at], alone[m], rtol=1e-14, atol=0, err_msg=m)
    for m in names:
        np.testing.assert_array_equal(rev[m], ev[m][::-1], err_msg=m)
    assert dict(ev.metrics).keys() == set(ev.metrics)


@pytest.mark.parametrize("how", ["plan run again", "evaluate"])
@pytest.mark.parametrize("batch", [8, np.array([1, 8, 64] * 40)], ids=["one workload", "three workloads"])
def test_a_callers_writes_into_results_change_no_other_metric_and_no_later_run(batch, how):
    """The metric arrays a run hands back are the caller's own: writing into one changes no other
    metric of that run, and running the same prepared plan again (or evaluating the same points,
    whose plan hands its own figures over to its one run) gives the first run's figures."""
    cols = {"hardware": "h100-sxm", "model": "llama-2-7b", "batch": batch, "memory_bandwidth": np.linspace(1e12, 8e12, 120)}
    plan = prepare(cols)
    first = plan.run() if how == "plan run again" else evaluate(cols)
    before = {k: np.array(v, copy=True) for k, v in first.metrics.items()}
    writable = [k for k, v in first.metrics.items() if v.flags.writeable]
    assert len(writable) > 40
    for k in writable:
        first.metrics[k][...] = -1.0
        others = [m for m in writable if m != k and not np.array_equal(first.metrics[m], before[m], equal_nan=True)]
        assert not [m for m in others if writable.index(m) > writable.index(k)], (k, others)
    again = plan.run() if how == "plan run again" else evaluate(cols)
    for k, v in before.items():
        np.testing.assert_array_equal(again.metrics[k], v, err_msg=k)


def test_a_plan_after_its_last_run_refuses_another():
    plan = prepare({"hardware": "h100-sxm", "model": "llama-2-7b", "batch": [1, 8]})
    plan.run(last=True)
    with pytest.raises(DseError, match="last run"):
        plan.run()


def test_every_numeric_default_is_in_its_own_range():
    """``Columns.numbers`` checks only the columns given: every default it skips must be allowed."""
    for name, p in SPEC.items():
        if not p.numeric or DEFAULTS.get(name) is None or isinstance(DEFAULTS[name], str):
            continue
        a = np.atleast_1d(np.asarray(DEFAULTS[name], dtype=float))
        bad, _ = p.out_of_range(a)
        if name in MAY_BE_MISSING:
            bad &= ~np.isnan(a)
        assert not bad.any(), (name, DEFAULTS[name])
