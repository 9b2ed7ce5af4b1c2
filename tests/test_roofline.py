"""The roofline kernel and metrics against independent hand calculations."""
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from basis.errors import DseError
from dse.core.efficiency import DEFAULT, IDEAL
from dse.core.engines import engine_efficiency, get_engine
from dse.core.kernel_fast import _row_rank, _separable_terms
from dse.core.operator_cost import step_sum
from dse.core.roofline import (
    OpArrays,
    Stacked,
    decode_total_energy_j,
    decode_total_time,
    op_costs,
    step_energy_j,
    step_time,
)
from dse.system.analysis import analyze
from dse.system.hardware import system_arrays
from dse.system.workload import workload_batch
from hwmodels.presets import load_device
from workloads.footprint import parameter_count
from workloads.model import load_model
from workloads.optable import decode_linear, decode_step, prefill
from workloads.scenario import Scenario


def test_ideal_batch1_decode_is_weights_plus_kv_over_bandwidth():
    m, d = load_model("llama-2-7b"), load_device("rtx-a6000")
    res = analyze(m, d, Scenario.make(batch=1, prompt_len=2048), ideal=True)
    step = sum(r["total_time_s"] for r in res.decode)
    # every weight once except the embedding table (the step reads one row of it), plus 2048 tokens of KV
    weights = (6_738_415_616 - 32000 * 4096 + 4096) * 2
    kv = 2048 * 512 * 1024
    assert step == pytest.approx((weights + kv) / 768e9, rel=0.005)
    assert all(r["bound"] == "memory" for r in res.decode)


@pytest.mark.parametrize("hw", ["rtx-a6000", "a100-80gb", "h100-sxm"])
def test_batch1_decode_memory_bound_on_gpus(hw):
    res = analyze(load_model("llama-3.1-8b"), load_device(hw), Scenario.make(batch=1, prompt_len=1024))
    for r in res.decode:
        if r["ops"] > 0 and r["memory_bytes"] > 0:
            assert r["bound"] == "memory", r["name"]


def _exact_decode(m, sc, dev, eff, first, steps):
    system = system_arrays([dev], sc.tp)
    return sum(step_time(OpArrays.from_table(decode_step(m, sc, first + j, dev.onchip_buffer_bytes)), system, eff)[0]
               for j in range(steps))


@settings(max_examples=25, deadline=None)
@given(model=st.sampled_from(["llama-2-7b", "mixtral-8x7b", "deepseek-v3", "gpt-j-6b"]),
       hw=st.sampled_from(["rtx-a6000", "a100-80gb", "h100-sxm"]),
       batch=st.integers(1, 512), prompt=st.integers(1, 4000), steps=st.integers(1, 60),
       flash=st.booleans(), ideal=st.booleans())
def test_decode_closed_form_equals_sum_of_steps(model, hw, batch, prompt, steps, flash, ideal):
    m, dev = load_model(model), load_device(hw)
    sc = Scenario.make(batch=batch, prompt_len=prompt, flash_attention=flash)
    eff = IDEAL if ideal else DEFAULT
    d0, slope = decode_linear(m, sc, prompt + 1, dev.onchip_buffer_bytes)
    system = system_arrays([dev], 1)
    closed = decode_total_time(OpArrays.from_table(d0), OpArrays.from_table(slope), np.array([steps]), system, eff)[0]
    assert closed == pytest.approx(_exact_decode(m, sc, dev, eff, prompt + 1, steps), rel=1e-9)


def test_decode_crossing_compute_and_memory():
    # large batch, attention goes memory-bound as the context grows while it started compute-bound
    m, dev = load_model("llama-2-7b"), load_device("h100-sxm")
    sc = Scenario.make(batch=256, prompt_len=1, weights="fp8", activations="fp8", kv="fp8")
    d0, slope = decode_linear(m, sc, 2, dev.onchip_buffer_bytes)
    system = system_arrays([dev], 1)
    closed = decode_total_time(OpArrays.from_table(d0), OpArrays.from_table(slope), np.array([300]), system, IDEAL)[0]
    assert closed == pytest.approx(_exact_decode(m, sc, dev, IDEAL, 2, 300), rel=1e-9)


def test_decode_total_with_one_step_count_for_every_point_equals_a_count_per_point():
    # a group of points with one workload passes its number of decode steps once, as a number
    m, dev = load_model("llama-2-7b"), load_device("h100-sxm")
    sc = Scenario.make(batch=64, prompt_len=512, weights="fp8", activations="fp8", kv="fp8")
    d0, slope = decode_linear(m, sc, 513, dev.onchip_buffer_bytes)
    system = system_arrays([dev, load_device("a100-80gb"), load_device("rtx-a6000")], 1)
    ops0, ops_s = OpArrays.from_table(d0), OpArrays.from_table(slope)
    one = decode_total_time(ops0, ops_s, np.asarray(200.0), system, DEFAULT)
    each = decode_total_time(ops0, ops_s, np.full(3, 200.0), system, DEFAULT)
    np.testing.assert_allclose(one, each, rtol=1e-15)
    assert one[0] == pytest.approx(_exact_decode(m, sc, dev, DEFAULT, 513, 200), rel=1e-9)


@pytest.mark.parametrize("entries", [1, 6, 9, 32, 33, 80, 300])
def test_a_points_rank_in_its_row_is_numpys_binary_search(entries):
    # the stacked roofline sum splits each point's operators at its ridge by counting its row's
    # intensities below it, which must place every ridge where np.searchsorted does in that row
    rng = np.random.default_rng(entries)
    rows_of = [np.sort(np.concatenate([rng.lognormal(3, 2, entries - 1), [np.inf]])) for _ in range(3)]
    ai = np.ascontiguousarray(np.stack(rows_of).T)                   # [ranks, rows], as the tables hold it
    ridge = np.concatenate([rng.lognormal(3, 2, 5000), *(r[:-1] for r in rows_of), [0.0, np.inf, np.nan] * 3])
    rows = rng.integers(0, 3, len(ridge))
    expected = [np.searchsorted(rows_of[r], x, side="right") for r, x in zip(rows, ridge)]
    np.testing.assert_array_equal(_row_rank(ai, ridge, rows) - rows * (entries + 1), expected)


def test_operators_of_equal_intensity_are_ranked_once_and_priced_as_one_by_one():
    # the gate and up projections of a layer have one intensity: the roofline sum ranks a point
    # among the distinct intensities only; below, between, on and above each of them it must give
    # the operator-by-operator sum (a rank mapped to the wrong prefix is off by a whole operator)
    m, d = load_model("llama-2-13b"), load_device("h100-sxm")
    op = OpArrays.from_table(prefill(m, Scenario.make(batch=16, prompt_len=512, flash_attention=True),
                                     d.onchip_buffer_bytes))
    tables, _ = _separable_terms(op, DEFAULT)
    column, distinct = tables[0][0], tables[0][2]
    in_column = (op.peak_column == column) & (op.count > 0) & ((op.ops > 0) | (op.memory_bytes > 0))
    assert len(distinct) < in_column.sum()            # the case at hand: some operators share an intensity
    finite = distinct[np.isfinite(distinct)]
    between = np.sqrt(finite[1:] * finite[:-1])
    ridges = np.concatenate([finite, between, [finite[0] / 4, finite[-1] * 4]])
    base = system_arrays([d], 1)
    bw = 2.0 ** 40                                    # peak / bw is then the ridge exactly
    peak = base.peak[[0] * len(ridges)].copy()
    peak[:, column] = ridges * bw
    sys = replace(base.take(np.zeros(len(ridges), dtype=int)), peak=peak, bandwidth=np.full(len(ridges), bw))
    per_op = step_sum(op_costs(op, sys, DEFAULT).time_s, op.count, None, sys) + DEFAULT.step_overhead_s
    np.testing.assert_allclose(step_time(op, sys, DEFAULT), per_op, rtol=1e-12)


def test_points_priced_with_their_workloads_row_equal_their_own_operators():
    # a point of a sweep over batch and lengths reads its workload's row of the distinct workloads'
    # tables (Stacked: ridge sums and work per class worked out once per row); it must be priced as
    # its own operators are, term by term ([points, operators]), prefill, decode and energy alike
    m, d = load_model("llama-2-13b"), load_device("h100-sxm")
    batch = workload_batch(m, np.array([1, 16, 64, 16, 16]), np.array([512, 512, 2048, 512, 4000]),
                           np.array([64, 64, 256, 64, 9]), "fp16", "fp16", "fp16", 2, 1, 1, True, d.onchip_buffer_bytes)
    assert len(batch.distinct.batch) == 4                   # the second and fourth points share a workload
    assert batch.workload[1] == batch.workload[3]
    t = batch._distinct
    rng = np.random.default_rng(5)
    n = 600
    rows = rng.integers(0, 4, n)
    base = system_arrays([d], 1)
    sys = replace(base.take(np.zeros(n, dtype=int)), peak=base.peak[[0] * n] * rng.uniform(0.02, 50, (n, 1)),
                  bandwidth=base.bandwidth[0] * rng.uniform(0.02, 50, n), tp=np.full(n, 2.0))
    pre, (_, d0, slope) = Stacked(t[0], rows), t[1][0]
    d0, slope = Stacked(d0, rows), Stacked(slope, rows)
    steps = rng.integers(1, 500, n).astype(float)
    np.testing.assert_allclose(step_time(pre, sys, DEFAULT), step_time(pre.expanded(), sys, DEFAULT), rtol=1e-12)
    np.testing.assert_allclose(decode_total_time(d0, slope, steps, sys, DEFAULT),
                               decode_total_time(d0.expanded(), slope.expanded(), steps, sys, DEFAULT), rtol=1e-12)
    np.testing.assert_allclose(decode_total_energy_j(d0, slope, steps, sys),
                               decode_total_energy_j(d0.expanded(), slope.expanded(), steps, sys), rtol=1e-12)
    assert (step_time(pre, sys, DEFAULT) > 0).all()


def test_energy_of_points_alike_worked_out_once_equals_each_points_own():
    # where every point has the same J/op and J/bit (one device: a row seen at every point, as a
    # sweep of a template's figures has), the energy of one workload is worked out once and a
    # stacked workload's once per row; it must equal the energy of each point's own work priced
    # with its own coefficients, for prefill and the whole decode, with and without a link crossed
    m, d = load_model("llama-2-13b"), load_device("h100-sxm")
    rng = np.random.default_rng(8)
    n = 500
    rows = rng.integers(0, 4, n)
    steps = rng.integers(1, 500, n).astype(float)
    for tp in (1, 2):
        batch = workload_batch(m, np.array([1, 16, 64, 16, 16]), np.array([512, 512, 2048, 512, 4000]),
                               np.array([64, 64, 256, 64, 9]), "fp16", "fp16", "fp16", tp, 1, 1, True,
                               d.onchip_buffer_bytes)
        t = batch._distinct
        pre, (_, d0, slope) = Stacked(t[0], rows), t[1][0]
        d0, slope = Stacked(d0, rows), Stacked(slope, rows)
        base = system_arrays([d], 1)
        own = replace(base.take(np.zeros(n, dtype=int)), tp=np.full(n, float(tp)))    # coefficients per point
        alike = replace(own, energy_op_j=np.broadcast_to(base.energy_op_j[0], own.energy_op_j.shape),
                        energy_bit_j=np.broadcast_to(base.energy_bit_j[0], (n,)))
        assert own.energy_op_j.strides[0] != 0 and alike.energy_op_j.strides[0] == 0
        for work_of in (lambda p: step_energy_j(p, alike), lambda p: step_energy_j(p, own)):
            np.testing.assert_allclose(work_of(pre), step_energy_j(pre.expanded(), own), rtol=1e-13)
        np.testing.assert_allclose(decode_total_energy_j(d0, slope, steps, alike),
                                   decode_total_energy_j(d0.expanded(), slope.expanded(), steps, own), rtol=1e-13)
        # J/op alike but J/bit, or tp where a link is crossed, not: each point its own
        unlike = [{"energy_bit_j": base.energy_bit_j[0] * rng.uniform(0.5, 2.0, n)}]
        if tp > 1:
            unlike.append({"tp": np.where(rng.random(n) < 0.5, 2.0, 4.0)})
        for change in unlike:
            mixed, own_mixed = replace(alike, **change), replace(own, **change)
            np.testing.assert_allclose(decode_total_energy_j(d0, slope, steps, mixed), decode_total_energy_j(
                d0.expanded(), slope.expanded(), steps, own_mixed), rtol=1e-13)
        one = OpArrays.from_table(prefill(m, Scenario.make(batch=16, prompt_len=512, tp=tp)))
        e_one = step_energy_j(one, alike)
        np.testing.assert_allclose(e_one, step_energy_j(one, own), rtol=1e-15)
        assert e_one.shape == (n,) and np.isfinite(e_one).all() and (e_one > 0).all()


def test_tpot_and_throughput_definitions():
    m, d = load_model("llama-2-7b"), load_device("a100-80gb")
    sc = Scenario.make(batch=8, prompt_len=256, gen_len=33)
    s = analyze(m, d, sc).summary
    eff = engine_efficiency(DEFAULT, get_engine("default"))         # the default point's: vLLM's costs
    exact = _exact_decode(m, sc, d, eff, 257, 32)
    assert s["tpot_s"] == pytest.approx(exact / 32, rel=1e-9)
    # an in-flight engine hides part of the shorter phase under the other: of 8 requests, 7 can
    # decode while another prefills (dse.core.metrics.static_overlap)
    hidden = eff.prefill_decode_overlap * 7 / 8 * min(s["ttft_s"], exact)
    assert s["e2e_latency_s"] == pytest.approx(s["ttft_s"] + exact - hidden, rel=1e-9)
    assert s["output_tokens_per_s"] == pytest.approx(8 * 33 / s["e2e_latency_s"])
    assert s["output_tokens_per_s_per_user"] == pytest.approx(1 / s["tpot_s"])


def test_ring_all_reduce_cost():
    m, d = load_model("llama-2-70b"), load_device("h100-sxm")
    res = analyze(m, d, Scenario.make(batch=4, prompt_len=128, tp=4), ideal=True)
    row = next(r for r in res.prefill if r["name"] == "attn_all_reduce")
    msg = 4 * 128 * 8192 * 2  # tokens x hidden x fp16
    # ring all-reduce over 4 devices: 2 (N-1)/N of the message per device, and 2 (N-1) link latencies
    assert row["time_s"] == pytest.approx(2 * 3 / 4 * msg / 450e9 + 2 * 3 * d.interconnect.latency_s)
    assert row["bound"] == "collective"


def test_w4a16_reads_4bit_weights_and_computes_fp16():
    m, d = load_model("llama-2-7b"), load_device("a100-80gb")
    res = analyze(m, d, Scenario.make(batch=1, prompt_len=64, weights="int4", activations="fp16"), ideal=True)
    q = next(r for r in res.decode if r["name"] == "q_proj")
    assert q["compute_format"] == "fp16"
    assert q["weight_bytes"] == pytest.approx(4096 * 4096 * (4 + 16 / 128) / 8)


def test_format_widening_on_devices_without_it():
    a100 = load_device("a100-80gb")
    assert a100.compute_class_for("fp8") == "fp16"       # no FP8 tensor cores on Ampere
    assert a100.compute_class_for("fp4") == "fp16"
    assert load_device("h100-sxm").compute_class_for("fp8") == "fp8"
    assert a100.compute_class_for("int4") == "int8"


def test_model_that_does_not_fit_is_reported():
    s = analyze(load_model("llama-2-70b"), load_device("a100-80gb"), Scenario.make(batch=1, prompt_len=128)).summary
    assert s["fits"] is False and "a100-80gb" in s["why"]
    assert s["weights_bytes"] == pytest.approx(parameter_count(load_model("llama-2-70b")) * 2)


def test_batch_max_is_largest_that_fits():
    m, d = load_model("llama-2-7b"), load_device("a100-80gb")
    sc = Scenario.make(prompt_len=1024, gen_len=1024)
    b = analyze(m, d, sc, batch_max=True, ideal=True).summary["batch"]
    cap = d.memory.capacity_bytes
    # the footprints come from the operator tables at each batch, not the closed form in the batch
    assert analyze(m, d, replace(sc, batch=b), ideal=True).summary["peak_memory_bytes"] <= cap
    assert analyze(m, d, replace(sc, batch=b + 1), ideal=True).summary["peak_memory_bytes"] > cap
    # independent estimate: free memory / KV per sequence bounds it from above
    kv_per_seq = 2048 * 512 * 1024
    assert b <= (cap - 6_738_415_616 * 2) / kv_per_seq
    assert analyze(m, d, sc, batch_max=True).summary["batch"] == b


def test_more_bandwidth_or_compute_never_slower():
    m, d = load_model("llama-2-13b"), load_device("a100-80gb")
    # the power limit lifted: at twice the peak and the same J/op, the A100 would draw more than its
    # 400 W TDP in prefill, which is refused (reason power), not throttled
    d = replace(d, tdp_w=None)
    sc = Scenario.make(batch=16, prompt_len=512)
    base = analyze(m, d, sc).summary
    faster_mem = replace(d, memory_tiers=(replace(d.memory, bandwidth_bytes_per_s=2 * d.memory.bandwidth_bytes_per_s),))
    faster_alu = replace(d, peak_ops_per_s={k: 2 * v for k, v in d.peak_ops_per_s.items()})
    for dd in (faster_mem, faster_alu):
        s = analyze(m, dd, sc).summary
        assert s["ttft_s"] <= base["ttft_s"] and s["tpot_s"] <= base["tpot_s"]


def test_tp_without_interconnect_or_flash_without_buffer_is_an_error():
    d = replace(load_device("a100-80gb"), interconnect=None, onchip_buffer_bytes=0.0)
    with pytest.raises(DseError, match="interconnect"):
        analyze(load_model("llama-2-7b"), d, Scenario.make(tp=2))
    with pytest.raises(DseError, match="onchip_buffer_bytes"):
        analyze(load_model("llama-2-7b"), d, Scenario.make(flash_attention=True))


def test_a_systems_replaced_copy_is_dataclasses_replace_and_leaves_it_unchanged():
    sys = system_arrays([load_device("h100-sxm"), load_device("mi300x")] * 3)
    tp = np.array([1.0, 2, 4, 8, 1, 2])
    fast, slow = sys.replaced(tp=tp, offload=None), replace(sys, tp=tp, offload=None)
    for name, value in slow.__dict__.items():
        got = getattr(fast, name)
        assert (got is None) == (value is None) and (value is None or np.array_equal(got, value, equal_nan=value.dtype.kind == "f")), name
    assert np.array_equal(sys.tp, np.ones(6)) and fast.size == 6
    picked = sys.take(np.array([5, 0]))
    assert np.array_equal(picked.peak, sys.peak[[5, 0]]) and np.array_equal(picked.host_bandwidth, sys.host_bandwidth[[5, 0]])
    with pytest.raises(TypeError, match="no field 'bandwith'"):
        sys.replaced(bandwith=tp)
