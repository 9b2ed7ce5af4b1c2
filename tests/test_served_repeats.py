"""Served points that differ only in columns no served figure depends on (a price, a cost) are
priced once (``served.repeated_points``), and each reads the same answers it gets priced alone."""
from __future__ import annotations

import numpy as np
import pytest

import dse.system.served as served
from dse import evaluate

BASE = {"model": "llama-3.1-8b", "hardware": "h100-sxm", "weights": "fp8", "activations": "fp8", "kv": "fp8",
        "prompt_len": 1024, "gen_len": 256, "lengths": "lognormal"}
METRICS = ("ttft_s", "tpot_s", "ttft_p90_s", "tpot_p99_s", "e2e_latency_s", "output_tokens_per_s", "running_batch",
           "kv_utilization", "goodput", "replicas", "service_devices", "energy_per_token_j", "power_w",
           "cost_per_million_tokens_usd", "clock_fraction", "feasible")


def _repeated(n_distinct=5, copies=7, seed=0, **more):
    """Columns of ``n_distinct`` loads each repeated ``copies`` times at prices of their own, shuffled."""
    rng = np.random.default_rng(seed)
    n = n_distinct * copies
    order = rng.permutation(n)
    cols = {**BASE, **more, "price_usd": rng.uniform(1e4, 4e4, n)}
    for k, v in list(cols.items()):
        if isinstance(v, np.ndarray) and len(v) == n_distinct:
            cols[k] = np.repeat(v, copies)[order]
    return cols


def _alone(cols, i):
    return evaluate({k: (v[i:i + 1] if isinstance(v, np.ndarray) else v) for k, v in cols.items()})


def _same(together, cols, points):
    for i in points:
        alone = _alone(cols, i)
        for k in METRICS:
            assert np.asarray(together[k])[i] == pytest.approx(np.asarray(alone[k])[0], rel=1e-12, nan_ok=True), (i, k)


@pytest.mark.parametrize("load", ["open", "closed"])
def test_repeated_points_read_their_own_answers(load):
    """Open loops under SLOs with a target rate (goodput searched for every group at the end, replicas)
    and closed loops: every point equals the point priced alone."""
    rates = {"request_rate": np.array([1.0, 4.0, 9.0, 14.0, 30.0])} if load == "open" else \
        {"concurrency": np.array([1, 8, 64, 256, 900])}
    cols = _repeated(**rates, slo_ttft=0.4, slo_tpot=0.03, target_rate=20.0)
    together = evaluate(cols)
    _same(together, cols, range(0, 35, 4))


def test_a_capped_clock_is_searched_once_for_equal_points():
    """A power cap that binds: the clock bisected for the distinct points, each copy at its own."""
    cols = _repeated(request_rate=np.array([2.0, 6.0, 12.0, 20.0, 28.0]), power_cap_w=320.0, slo_ttft=1.0)
    together = evaluate(cols)
    assert np.any(np.asarray(together["clock_fraction"]) < 1)
    _same(together, cols, range(1, 35, 5))


def test_each_distinct_point_is_priced_once(monkeypatch):
    """Five distinct loads among 35 points: the served pricing sees five points."""
    seen = []
    real = served.price_served

    def counting(g, eff):
        seen.append(len(served.positions(g.index)))
        return real(g, eff)
    monkeypatch.setattr(served, "price_served", counting)
    cols = _repeated(request_rate=np.array([1.0, 4.0, 9.0, 14.0, 30.0]))
    evaluate(cols)
    assert sum(seen) == 5
    seen.clear()
    evaluate({**cols, "memory_bandwidth": np.linspace(2e12, 4e12, 35)})     # every point its own hardware
    assert sum(seen) == 35


def test_a_router_group_is_priced_point_by_point():
    """Replicas behind a router carry per-point figures of their own: priced as before, each point equal
    to the same point alone."""
    cols = _repeated(request_rate=np.array([4.0, 8.0, 16.0, 24.0, 40.0]), router_replicas=2, copies=3)
    together = evaluate(cols)
    _same(together, cols, range(0, 15, 3))
