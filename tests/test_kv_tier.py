"""The KV cache's second tier under load (issue 46): prefix hits as an outcome of cache capacity
(Che's approximation against a direct LRU simulation), the tier's reload and swap costs in closed
form, and today's figures unchanged where the tier changes nothing."""
from __future__ import annotations

import numpy as np
import pytest

from basis.errors import DseError
from dse.core.kv_tiers import (
    TierLoad,
    che_hit_rate,
    lru_outcomes,
    preemptions_per_request,
    prefix_hits,
    reload_s,
    swap_s,
    tier_slots,
    zipf_popularity,
)
from dse.system.evaluator import evaluate
from hwmodels.tiers import load_tier, tier_fraction

BASE = {"model": "llama-3.1-8b", "hardware": "h100-sxm", "prompt_len": 2048, "gen_len": 128, "weights": "fp8",
        "activations": "fp8", "kv": "fp8", "max_running": 256, "prefix_hit": 0.5}
METRICS = ("requests_per_s", "ttft_s", "tpot_s", "ttft_p90_s", "e2e_latency_s", "running_batch", "kv_utilization")


def _tier(count, zipf, capacity, token_bytes=1.0, bandwidth=1.0):
    one = np.ones(1)
    return TierLoad(token_bytes * one, bandwidth * one, capacity * one, count * one, zipf * one,
                    np.zeros(1, bool), np.zeros(1, bool))


@pytest.mark.parametrize("count, zipf, slots", [(1000, 0.8, 100), (200, 1.0, 20), (50, 0.0, 10), (500, 1.2, 3)])
def test_che_approximation_matches_a_direct_lru_simulation(count, zipf, slots):
    """Che's hit rate of an LRU cache against an LRU cache run on 60,000 independent Zipf requests
    (the first 10,000 left out as warm-up): within 0.01 (Fricker et al., ITC 2012, report Che's
    approximation accurate to about a percent for Zipf popularity); uniform popularity exactly C / N."""
    q = zipf_popularity(count, zipf)
    ids = np.random.default_rng(1).choice(count, size=60_000, p=q)
    direct = float(np.mean(lru_outcomes(ids, slots, 0)[10_000:] == 0))
    assert che_hit_rate(q[None], np.array([slots]))[0] == pytest.approx(direct, abs=0.01)
    if zipf == 0:
        assert che_hit_rate(q[None], np.array([slots]))[0] == pytest.approx(slots / count, rel=1e-9)


def test_device_and_tier_are_one_lru_stack():
    """A request hits the device when its prefix is the most recent one, the tier when among the
    next ``tier_slots``: the direct simulation's shares against Che's at 1 and 1 + slots; a cache
    holding every prefix always hits, one holding none never."""
    count, zipf, slots = 300, 0.9, 40
    q = zipf_popularity(count, zipf)
    ids = np.random.default_rng(2).choice(count, size=60_000, p=q)
    where = lru_outcomes(ids, 1, slots)[10_000:]
    prefix_bytes = 1024.0                                        # 64 blocks of 16 tokens at 1 byte a token
    dev, tier = prefix_hits(_tier(count, zipf, slots * prefix_bytes), np.array([1024.0]), np.array([16.0]))
    assert dev[0] == pytest.approx(np.mean(where == 0), abs=0.01)
    assert tier[0] == pytest.approx(np.mean(where == 1), abs=0.01)
    assert che_hit_rate(q[None], np.array([count]))[0] == 1.0 and che_hit_rate(q[None], np.array([0.0]))[0] == 0.0
    one = prefix_hits(_tier(1, 1.0, 0.0), np.array([1024.0]), np.array([16.0]))
    assert (one[0][0], one[1][0]) == (1.0, 0.0)                   # one prefix: today's prefix caching


def test_reload_and_swap_cost_bytes_over_the_tier_bandwidth():
    """A prefix's full blocks reload at the tier's bandwidth; a swap moves a sequence's KV out and
    back; the tier holds its capacity over a prefix's bytes."""
    t = _tier(10, 1.0, 5e9, token_bytes=131072.0, bandwidth=39.2e9)
    prefix, block = np.array([1000.0]), np.array([16.0])
    size = 992 * 131072.0                                        # 62 full blocks of 16 tokens
    assert reload_s(t, prefix, block)[0] == pytest.approx(size / 39.2e9)
    assert swap_s(t, np.array([3000.0]))[0] == pytest.approx(2 * 3000 * 131072.0 / 39.2e9)
    assert tier_slots(t, prefix, block)[0] == np.floor(5e9 / size)


def test_preemptions_follow_the_free_blocks_walk():
    """sd / sqrt(2 pi) / (prompt blocks + slack): no slack, a step of sd 60 blocks against 64-block
    prompts preempts 60 / 2.5066 / 64 = 0.374 a request; slack makes it rarer."""
    tight = preemptions_per_request(np.array([41.0]), np.array([41 * 96.0]), 96.0, 64.0, 3600.0)
    assert tight[0] == pytest.approx(60 / np.sqrt(2 * np.pi) / 64)
    assert preemptions_per_request(np.array([20.0]), np.array([41 * 96.0]), 96.0, 64.0, 3600.0)[0] < tight[0] / 10


def test_no_tier_changes_nothing():
    """The defaults given (no tier, preemption unpriced, one prefix), and a tier with one prefix
    and preemption unpriced (nothing to hold, nothing priced), give today's figures exactly."""
    for load in ({"concurrency": 32}, {"request_rate": 6.0}):
        plain = evaluate({**BASE, **load})
        for extra in ({"kv_tier": "none", "preemption": "unpriced", "prefix_count": 1, "prefix_zipf": 1.0},
                      {"kv_tier": "cxl"}, {"kv_tier": "ssd", "prefix_zipf": 0.3}):
            got = evaluate({**BASE, **load, **extra})
            for k in METRICS:
                assert got[k][0] == plain[k][0], (load, extra, k)


def test_a_cxl_tier_keeps_prefix_reuse_the_device_cannot():
    """200 shared prefixes: the device keeps one, so most prompts compute their prefix; a CXL box
    holds them all and reloads them at its achieved bandwidth: more requests/s, fewer than with every
    prompt one prefix (which the device holds), and an NVMe drive in between the two."""
    load = {**BASE, "concurrency": 64}
    one = evaluate(load)["requests_per_s"][0]
    many = {k: evaluate({**load, "prefix_count": 200, "kv_tier": k})["requests_per_s"][0]
            for k in ("none", "ssd", "cxl")}
    assert many["none"] < many["ssd"] < many["cxl"] < one
    t = load_tier("cxl-cmm-b-16tb")
    assert t.bandwidth_bytes_per_s * tier_fraction("cxl-cmm-b-16tb") == pytest.approx(39.24e9)


def test_swap_preemption_costs_less_than_recompute_past_the_cap():
    """Past the running cap (a small KV cache, twice the requests it holds) preemption is priced:
    recompute computes the victims' prompts again, swap over a fast tier moves their KV and serves
    more; unpriced serves the most."""
    point = {"model": "llama-3.1-8b", "hardware": "h100-sxm", "memory_capacity": 12e9, "prompt_len": 1024,
             "gen_len": 512, "weights": "fp8", "activations": "fp8", "kv": "fp8", "lengths": "lognormal:sigma=0.5",
             "concurrency": 80}
    x = {p: evaluate({**point, "preemption": p, "kv_tier": "cxl"})["requests_per_s"][0]
         for p in ("unpriced", "recompute", "swap")}
    assert x["recompute"] < x["swap"] < x["unpriced"]


@pytest.mark.parametrize("key, bad", [("kv_tier", "abc"), ("preemption", "drop"), ("prefix_count", 0),
                                      ("prefix_count", -1), ("prefix_count", float("nan")), ("prefix_count", 1e300),
                                      ("prefix_count", "abc"), ("prefix_zipf", -1), ("prefix_zipf", float("inf")),
                                      ("prefix_zipf", 1e300)])
def test_bad_values_are_refused(key, bad):
    with pytest.raises(DseError, match=key):
        evaluate({**BASE, "concurrency": 8, key: bad})


def test_swap_needs_a_tier():
    with pytest.raises(DseError, match="preemption"):
        evaluate({**BASE, "concurrency": 8, "preemption": "swap"})
