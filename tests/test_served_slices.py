"""Served points are priced in bounded slices (``dse.system.served.SERVED_SLICE``): the memory a
served group holds does not grow with its points, and the results are those of one call.

Every served point is priced on its own figures, so cutting a group into slices changes no
decision (feasibility, the reason, saturation are equal exactly) and no figure beyond rounding:
one call's own figures already depend on which points share it in their last bits (a point of
an open loop priced alone and inside a group of 18 differ by up to ~1e-14 relative: vectorized
reductions and matrix products over the group's rows round differently with their number and
with the widest Markov chain among them), so figures are held to 1e-12 relative, not to the bit,
and percentiles to 1e-8: they are found by bisection to 2^-36 of a mixture's span (up to ~8
standard deviations each side), where a last-bit change can move the answer one step (3.8e-10
relative was the most seen, slices of 3 to 7 points)."""
import re

import numpy as np
import pytest

from dse.core.efficiency import IDEAL, efficiency_for
from dse.system import served
from dse.system.evaluator import evaluate

N = 18
RNG = np.random.default_rng(41)
BASE = {"model": "llama-3.1-8b", "hardware": "h100-sxm", "weights": "fp8", "activations": "fp8", "kv": "fp8",
        "prompt_len": 1024, "gen_len": 256,
        "memory_bandwidth": RNG.uniform(2e12, 8e12, N), "peak_fp8": RNG.uniform(1e15, 4e15, N)}
OPEN = RNG.uniform(0.5, 60.0, N)            # past a design's capacity some points are saturated
CLOSED = RNG.integers(1, 513, N)
CASES = {
    "open, lognormal lengths": {"request_rate": OPEN, "lengths": "lognormal:sigma=0.8"},
    "closed, fixed lengths": {"concurrency": CLOSED},
    "closed, SLOs (goodput) and a target rate": {"concurrency": CLOSED, "slo_ttft": 0.2, "slo_tpot": 0.03,
                                                 "target_rate": 50.0},
    "disaggregated 1:1, open": {"request_rate": OPEN, "disaggregate": "1:1"},
    "speculative, closed": {"concurrency": CLOSED, "spec_draft": "llama-3.2-1b-instruct", "spec_tokens": 4,
                            "spec_acceptance": 0.7},
}
PRICE_SERVED = served.price_served          # the pricing of one slice, before any test counts its calls


def _priced(monkeypatch, cols: dict, slice_size: int):
    """(evaluate of ``cols`` with served points priced ``slice_size`` at a time, the number of
    points each ``price_served`` call priced)."""
    calls = []

    def counted(g, eff):
        calls.append(len(g.serving.kv_blocks))
        return PRICE_SERVED(g, eff)
    monkeypatch.setattr(served, "SERVED_SLICE", slice_size)
    monkeypatch.setattr(served, "WAVE_SLICE", slice_size)
    monkeypatch.setattr(served, "price_served", counted)
    return evaluate(cols), calls


@pytest.mark.parametrize("case", CASES)
def test_slices_give_the_results_of_one_call(monkeypatch, case):
    cols = {**BASE, **CASES[case]}
    once, whole_calls = _priced(monkeypatch, cols, 10**9)
    sliced, slice_calls = _priced(monkeypatch, cols, 5)
    assert whole_calls == [N]                                  # one group priced at once ...
    assert slice_calls == [5, 5, 5, 3]                         # ... and in slices of 5
    assert once["feasible"].any()
    assert np.array_equal(once["feasible"], sliced["feasible"])
    assert np.array_equal(once["reason"], sliced["reason"])
    assert once.failed.keys() == sliced.failed.keys()
    for k in once.failed:
        assert np.array_equal(once.failed[k], sliced.failed[k]), k
    for k in once.keys():
        a, b = np.asarray(once[k]), np.asarray(sliced[k])
        if a.dtype.kind == "f":
            rtol = 1e-8 if re.search(r"_p[0-9]+_s$", k) else 1e-12
            np.testing.assert_allclose(b, a, rtol=rtol, atol=0.0, equal_nan=True, err_msg=k)
        else:
            assert np.array_equal(a, b), k


def test_a_group_within_one_slice_is_priced_in_one_call(monkeypatch):
    ev, calls = _priced(monkeypatch, {**BASE, "concurrency": CLOSED[:4], "memory_bandwidth": 3e12,
                                      "peak_fp8": 2e15}, 4)
    assert calls == [4]
    assert np.all(ev["output_tokens_per_s"] > 0)


def test_an_efficiency_per_point_on_disaggregated_pools(monkeypatch):
    """Points of one disaggregated group under two efficiencies are priced in two parts
    (``ServingInputs.take``, as a slice is): each point as under its own efficiency for all
    (this raised a shape mismatch when the pools were not taken with the other inputs)."""
    monkeypatch.setattr(served, "SERVED_SLICE", 2)
    cols = {**BASE, "memory_bandwidth": 3.35e12, "peak_fp8": 1.98e15, "disaggregate": "1:1",
            "request_rate": [1.0, 2.0, 3.0, 4.0, 5.0]}
    gpu = efficiency_for("gpu")
    mixed = evaluate(cols, efficiency=[IDEAL, gpu, IDEAL, gpu, IDEAL])
    alone = {"ideal": evaluate(cols, efficiency=IDEAL), "gpu": evaluate(cols, efficiency=gpu)}
    assert not np.allclose(alone["ideal"]["ttft_s"], alone["gpu"]["ttft_s"], rtol=0.01)   # they differ
    for name, rows in (("ideal", [0, 2, 4]), ("gpu", [1, 3])):
        assert alone[name]["feasible"][rows].all()
        for k in ("ttft_s", "tpot_s", "output_tokens_per_s"):
            np.testing.assert_allclose(mixed[k][rows], alone[name][k][rows], rtol=1e-12, err_msg=k)


@pytest.mark.parametrize("case,calls", [("closed, fixed lengths", [9, 9]), ("open, lognormal lengths", [5, 5, 5, 3]),
                                        ("closed, SLOs (goodput) and a target rate", [5, 5, 5, 3])])
def test_closed_loops_at_one_length_take_larger_slices(monkeypatch, case, calls):
    """A closed loop at one request length without SLOs (the wave model's vectors, no chain, no goodput
    search) is priced ``WAVE_SLICE`` points at a time; open loops, spread lengths and SLOs
    ``SERVED_SLICE``."""
    seen = []

    def counted(g, eff):
        seen.append(len(g.serving.kv_blocks))
        return PRICE_SERVED(g, eff)
    monkeypatch.setattr(served, "SERVED_SLICE", 5)
    monkeypatch.setattr(served, "WAVE_SLICE", 9)
    monkeypatch.setattr(served, "price_served", counted)
    evaluate({**BASE, **CASES[case]})
    assert seen == calls
