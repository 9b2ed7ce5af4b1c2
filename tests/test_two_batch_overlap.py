"""Two-batch overlap (``dse.core.overlap``, ``--two-batch-overlap``): a step as two half batches,
one's communication under the other's computation, 2 x max(C_half, M_half) + the step overhead
(DeepSeek-V3 Technical Report, arXiv 2412.19437, Sec. 3.4), checked against closed forms written
out here from the operators' ops and bytes, and off = today's figures bit for bit."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from dse import evaluate
from dse.core.efficiency import IDEAL
from dse.core.overlap import decode_s, overlapped_decode_s, step_s
from dse.core.roofline import PEAK_COLUMNS, OpArrays, SystemArrays, decode_total_time

PEAK, BW, LINK = 1e15, 3e12, 100e9      # ops/s, memory bytes/s, link bytes/s (latency 0)
OVERHEAD = 20e-6                        # step overhead, s


def _system(n=1, tbo=True):
    one = np.ones(n)
    return SystemArrays(np.full((n, len(PEAK_COLUMNS)), PEAK), BW * one, 80e9 * one, LINK * one, 0.0 * one,
                        one, two_batch_overlap=np.full(n, tbo))


def _ops(ops, weights, act, kv, p2p):
    """Operators of a step: [matmul, attention, expert dispatch] (one instance each)."""
    return OpArrays(ops=np.array([ops, 0.0, 0.0]), weight_bytes=np.array([weights, 0.0, 0.0]),
                    act_bytes=np.array([act, 0.0, 0.0]), kv_bytes=np.array([0.0, kv, 0.0]),
                    comm_bytes=np.zeros(3), p2p_bytes=np.array([0.0, 0.0, p2p]),
                    peak_column=np.zeros(3, dtype=int), count=np.ones(3))


def _eff():
    return replace(IDEAL, step_overhead_s=OVERHEAD)


def _half_compute(ops, weights, act, kv):
    """The half batch's computation: its matmul (half the ops and activations, all the weights)
    and its attention (half the KV-cache reads), each max(compute, memory), by hand."""
    return max(ops / 2 / PEAK, (weights + act / 2) / BW) + kv / 2 / BW


@pytest.mark.parametrize("kernel", ["fast", "reference"])
@pytest.mark.parametrize("p2p", [1e6, 4e8])                  # computation-bound, then communication-bound
def test_step_closed_form(kernel, p2p, monkeypatch):
    monkeypatch.setenv("DSE_KERNEL", kernel)
    ops, w, a, kv = 4e12, 2e9, 1e9, 3e9
    op = _ops(ops, w, a, kv, p2p)
    want = 2 * max(_half_compute(ops, w, a, kv), p2p / 2 / LINK) + OVERHEAD
    assert step_s(op, _system(), _eff())[0] == pytest.approx(want, rel=1e-12)
    plain = max(ops / PEAK, (w + a) / BW) + kv / BW + p2p / LINK + OVERHEAD
    assert step_s(op, _system(tbo=False), _eff())[0] == pytest.approx(plain, rel=1e-12)


def test_memory_bound_step_gets_slower_and_overlap_hides_communication():
    """Each micro-batch reads the weights: a weight-bound step without communication takes about
    twice as long; a step whose communication equals its computation gets faster."""
    eff, sys = _eff(), _system(tbo=False)
    weight_bound = _ops(1e9, 4e9, 1e6, 0.0, 0.0)
    assert step_s(weight_bound, _system(), eff)[0] > 1.9 * (step_s(weight_bound, sys, eff)[0] - OVERHEAD)
    balanced = _ops(8e12, 1e6, 1e6, 0.0, 8e12 / PEAK * LINK)
    assert step_s(balanced, _system(), eff)[0] < 0.55 * step_s(balanced, sys, eff)[0] + OVERHEAD


@pytest.mark.parametrize("kernel", ["fast", "reference"])
def test_decode_sum_against_every_step(kernel, monkeypatch):
    """Σ_j 2 max(C_j, M) + n x overhead, C_j growing with the KV cache read, summed step by step
    here, equals the bisected closed form; the crossing falls inside the generation for the first
    point and outside it (all steps one side) for the others."""
    monkeypatch.setenv("DSE_KERNEL", kernel)
    ops, w, a, kv0, kv1 = 1e11, 1e9, 1e6, 2e8, 4e6
    n = np.array([300.0, 7.0, 300.0])
    p2p = np.array([9e7, 9e7, 1e3])
    for i in range(3):
        op0, slope = _ops(ops, w, a, kv0, p2p[i]), _ops(0.0, 0.0, 0.0, kv1, 0.0)
        m = p2p[i] / 2 / LINK
        want = sum(2 * max(_half_compute(ops, w, a, kv0 + j * kv1), m) + OVERHEAD for j in range(int(n[i])))
        got = overlapped_decode_s(op0, slope, n[i], _system(), _eff())[0]
        assert got == pytest.approx(want, rel=1e-9)
    c_first = 2 * _half_compute(ops, w, a, kv0)
    c_last = 2 * _half_compute(ops, w, a, kv0 + 299 * kv1)
    assert c_first < 9e7 / LINK < c_last            # the first point's crossing is mid-generation


def test_decode_off_is_the_kernel_bit_for_bit():
    op0, slope = _ops(1e11, 1e9, 1e6, 2e8, 4e8), _ops(0.0, 0.0, 0.0, 4e6, 0.0)
    on_off = decode_s(op0, slope, 100.0, _system(2, tbo=True).replaced(two_batch_overlap=np.array([True, False])),
                      _eff())
    assert on_off[1] == decode_total_time(op0, slope, 100.0, _system(2, tbo=False), _eff())[1]
    assert on_off[0] != on_off[1]


_POINT = {"model": "mixtral-8x7b", "hardware": "h100-sxm", "ep": 8, "prompt_len": 1024, "gen_len": 64}


def test_off_is_todays_figures_and_prefill_hides_the_all_to_all():
    """Left out or false: every metric as today. On: a large prefill's dispatch and combine hide
    under the other micro-batch's computation (TTFT falls), a batch-1 decode reads the weights twice
    (TPOT rises)."""
    cols = {**_POINT, "batch": [1, 256]}
    base = evaluate(cols).metrics
    off = evaluate({**cols, "two_batch_overlap": False}).metrics
    on = evaluate({**cols, "two_batch_overlap": True}).metrics
    for k in ("ttft_s", "tpot_s", "output_tokens_per_s", "energy_per_token_j"):
        np.testing.assert_array_equal(np.asarray(base[k]), np.asarray(off[k]))
    assert on["ttft_s"][1] < base["ttft_s"][1]
    assert on["tpot_s"][0] > 1.5 * base["tpot_s"][0]


def test_continuous_batching_prices_the_overlapped_iteration():
    """Under continuous batching each iteration is priced overlapped too: a closed loop's TPOT
    changes with the flag, and equals today's without it."""
    cols = {**_POINT, "concurrency": 64, "serving": "continuous"}
    base = evaluate(cols).metrics
    off = evaluate({**cols, "two_batch_overlap": False}).metrics
    on = evaluate({**cols, "two_batch_overlap": True}).metrics
    assert np.asarray(base["tpot_s"])[0] == np.asarray(off["tpot_s"])[0]
    assert np.asarray(on["tpot_s"])[0] != np.asarray(base["tpot_s"])[0]


def test_many_workloads_priced_together_equal_each_alone():
    """Points sharing their workloads are priced with one table per workload (``Stacked``): the
    overlap gives each the figure it gets alone."""
    batches = np.repeat(np.arange(1, 40), 20)
    many = evaluate({**_POINT, "batch": batches, "two_batch_overlap": True}).metrics
    for b in (1, 17, 39):
        alone = evaluate({**_POINT, "batch": b, "two_batch_overlap": True}).metrics
        i = int(np.flatnonzero(batches == b)[0])
        assert many["tpot_s"][i] == alone["tpot_s"][0] and many["ttft_s"][i] == alone["ttft_s"][0]
