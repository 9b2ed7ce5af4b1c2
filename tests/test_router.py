"""Replicas behind a router and multi-turn sessions (issue 46): closed forms the steady-state model
and the simulator must meet (``dse.core.router``, ``dse.core.sessions``)."""
from __future__ import annotations

import numpy as np
import pytest

from basis.errors import DseError
from dse.core.router import (
    LEAST_OUTSTANDING,
    ROUND_ROBIN,
    SESSION_AFFINITY,
    replica_dispersion,
    retention,
    session_hits,
    simulate_routed,
    turn_hit_share,
)
from dse.core.sessions import session_lengths
from dse.core.simulator import EngineConfig, simulate
from dse.system.analysis import simulate_point
from dse.system.evaluator import evaluate
from dse.system.params import ROUTERS
from workloads.lengths import Lengths

BASE = {"model": "llama-3.1-8b", "hardware": "h100-sxm", "prompt_len": 512, "gen_len": 128, "weights": "fp8",
        "activations": "fp8", "kv": "fp8", "max_running": 64}
ROUTER_CODES = (ROUND_ROBIN, LEAST_OUTSTANDING, SESSION_AFFINITY)


def step(d, dctx, c, pctx, ends):
    """A synthetic iteration: a fixed cost, per decode and prompt token, and per key read."""
    return 0.004 + 2e-5 * d + 4e-6 * c + 1e-9 * (dctx + pctx)


def test_router_codes_follow_the_declared_names():
    assert [ROUTERS[c] for c in ROUTER_CODES] == ["round-robin", "least-outstanding", "session-affinity"]


@pytest.mark.parametrize("router", ROUTERS)
def test_one_replica_is_todays_engine_in_the_steady_state(router):
    """With one replica every router prices exactly the engine of today, open and closed loop."""
    for load in ({"request_rate": 12.0}, {"request_rate": 12.0, "burstiness": 0.5}, {"concurrency": 24},
                 {"request_rate": 12.0, "slo_ttft": 0.2, "slo_tpot": 0.02, "target_rate": 100.0}):
        plain = evaluate({**BASE, **load})
        routed = evaluate({**BASE, **load, "router": router, "router_replicas": 1})
        for key in ("requests_per_s", "ttft_s", "tpot_s", "ttft_p99_s", "running_batch", "goodput", "replicas"):
            assert np.array_equal(routed[key], plain[key], equal_nan=True), (router, load, key)


@pytest.mark.parametrize("router", ROUTER_CODES)
def test_one_replica_is_todays_engine_in_the_simulator(router):
    """The fleet of one replica runs every request exactly as ``simulate`` does (same times)."""
    rng = np.random.default_rng(1)
    prompts, gens = rng.integers(50, 900, 200), rng.integers(1, 200, 200)
    arrivals = np.cumsum(rng.exponential(0.05, 200))
    engine = EngineConfig(kv_blocks=900, kv_block=16, token_budget=1024, max_running=32)
    ref = simulate(step, engine, prompts, gens, arrivals=arrivals)
    got, hits = simulate_routed(step, engine, 1, router, [[(p, g)] for p, g in zip(prompts, gens)], starts=arrivals)
    assert hits == 0
    for a in ("first_token", "finish", "admitted"):
        assert np.array_equal(getattr(got, a), getattr(ref, a))
    closed = simulate(step, engine, prompts, gens, concurrency=12)
    got, _ = simulate_routed(step, engine, 1, router, [[(p, g)] for p, g in zip(prompts, gens)], concurrency=12)
    assert np.array_equal(got.finish, closed.finish)


def test_one_replica_simulate_point_equals_todays():
    point = {**BASE, "request_rate": 12.0}
    plain = simulate_point(point, 200)
    routed = simulate_point({**point, "router": "session-affinity", "router_replicas": 1}, 200)
    for key in ("requests_per_s", "ttft_mean_s", "tpot_mean_s"):
        assert routed[key] == plain[key]


def test_round_robin_of_poisson_arrivals_is_erlang():
    """Every N-th arrival of a Poisson process: gaps Erlang-N, squared coefficient of variation 1 / N;
    of a gamma renewal process of c^2: c^2 / N; a random 1 / N of them (thinning) stays Poisson."""
    rng = np.random.default_rng(0)
    for n in (2, 4, 8):
        gaps = np.diff(np.cumsum(rng.exponential(1.0, 400_000))[::n])
        assert np.var(gaps) / np.mean(gaps) ** 2 == pytest.approx(1.0 / n, rel=0.03)
        assert replica_dispersion(1.0, n, ROUND_ROBIN) == pytest.approx(1.0 / n)
        burst = np.diff(np.cumsum(rng.gamma(0.5, 2.0, 400_000))[::n])
        assert np.var(burst) / np.mean(burst) ** 2 == pytest.approx(float(replica_dispersion(2.0, n, ROUND_ROBIN)),
                                                                  rel=0.05)
        # session affinity without sessions routes as least-outstanding; sessions' later turns pinned
        assert replica_dispersion(2.0, n, SESSION_AFFINITY) == replica_dispersion(2.0, n, LEAST_OUTSTANDING)
        assert replica_dispersion(1.0, n, SESSION_AFFINITY, turns=1_000_000) == pytest.approx(1.0, abs=1e-5)


def test_session_lengths_carry_the_history():
    """Turn j's prompt: (j - 1) turns of input and output plus its own input; the mean prompt is
    p + (T - 1)(p + g) / 2 and the mean output g."""
    base = Lengths(np.array([100.0, 300.0]), np.array([20.0, 60.0]), np.array([0.5, 0.5]))
    got, history, turn = session_lengths(base, 4)
    per = 200.0 + 40.0
    assert got.mean_prompt == pytest.approx(200.0 + 3 * per / 2)
    assert got.mean_gen == pytest.approx(40.0)
    assert np.allclose(history, turn * per) and sorted(set(turn)) == [0, 1, 2, 3]
    assert got.weight.sum() == pytest.approx(1.0)


def test_hit_share_closed_forms():
    """Affinity: every turn past the first finds its whole history. Random placement (round-robin,
    least-outstanding): turn 2 finds turn 1 on its replica 1 / N of the time; turn j some earlier
    turn with 1 - (1 - 1 / N)^(j - 1); one replica: always the previous turn."""
    turn = np.arange(5.0)
    n = np.array([4.0, 4.0, 1.0])
    p, mean = turn_hit_share(turn, n, np.array([SESSION_AFFINITY, ROUND_ROBIN, ROUND_ROBIN]))
    assert np.array_equal(p[0], [0, 1, 1, 1, 1]) and np.array_equal(mean[0], turn)
    assert np.allclose(p[1], 1 - 0.75 ** turn) and p[1, 1] == pytest.approx(0.25)
    assert mean[1, 1] == pytest.approx(1.0)            # turn 2 can only find turn 1
    # turn 3 finds turn 2 (prob 1/4) or else turn 1 (3/4 x 1/4): mean (2 x 1/4 + 3/16) / (7/16) = 11/7
    assert mean[1, 2] == pytest.approx(11 / 7)
    assert np.array_equal(p[2], p[0]) and np.array_equal(mean[2], mean[0])


def test_affinity_hit_rate_is_the_carried_over_share_when_the_cache_holds_it():
    """Sessions of T turns of p new tokens and g output under session affinity and a cache that holds
    every history: turn j finds (j - 1)(p + g) - 1 tokens cached (whole blocks; the last output token
    is never fed back), the carried-over context; the simulator's prefills compute exactly the rest."""
    p, g, t, blk = 200, 40, 4, 16
    engine = EngineConfig(kv_blocks=100_000, kv_block=blk, token_budget=4096, max_running=256)
    cached = [((j * (p + g) - 1) // blk) * blk if j else 0 for j in range(t)]
    prompts = [j * (p + g) + p for j in range(t)]
    # the model's expected hits
    model, second = session_hits(np.arange(t, dtype=float), float(p + g), np.array([blk]), np.array([8.0]),
                                 np.array([SESSION_AFFINITY]), np.array([1.0]))
    assert np.array_equal(model[0], cached) and np.array_equal(second[0], np.square(cached))   # always that many
    # the simulator: 8 replicas, 60 sessions; every prompt token computed is counted
    computed = []

    def counting(d, dctx, c, pctx, ends):
        computed.append(c)
        return step(d, dctx, c, pctx, ends)
    starts = np.arange(60) * 0.3
    res, hits = simulate_routed(counting, engine, 8, SESSION_AFFINITY, [[(p, g)] * t] * 60, starts=starts,
                                think_s=0.5)
    assert hits == 60 * (t - 1)
    assert sum(computed) == 60 * sum(a - b for a, b in zip(prompts, cached))
    share = sum(cached) / sum(prompts)                 # the carried-over share of the prompt tokens
    assert 1 - sum(computed) / (60 * sum(prompts)) == pytest.approx(share)


def test_round_robin_finds_the_history_one_time_in_n():
    """Two-turn sessions over N = 4 replicas: under round-robin the second turn lands where the first
    ran about 1 / N of the time (the model's share); affinity always."""
    engine = EngineConfig(kv_blocks=100_000, kv_block=16, token_budget=4096, max_running=256)
    rng = np.random.default_rng(3)
    starts = np.cumsum(rng.exponential(0.05, 800))
    sessions = [[(200, 40)] * 2] * 800
    _, rr = simulate_routed(step, engine, 4, ROUND_ROBIN, sessions, starts=starts, think_s=0.2)
    _, lo = simulate_routed(step, engine, 4, LEAST_OUTSTANDING, sessions, starts=starts, think_s=0.2)
    assert rr / 800 == pytest.approx(0.25, abs=0.06)
    # least-outstanding leans to the replica a turn just left (one request fewer there): measured 0.34
    # here at light load, where the model takes 1 / N (its TTFT then errs high, within the agreement)
    assert 0.25 <= lo / 800 <= 0.45


def test_the_cache_keeps_what_the_model_says_it_keeps():
    """Three-turn sessions on one engine, think times exponential of mean 2 s: as the blocks running
    sequences leave shrink, the LRU queue keeps fewer histories until the next turn; the simulator's
    hit share against ``retention`` at the spare blocks it measured (measured: 0.37 / 0.84 / 1.00
    against 0.34 / 0.82 / 1.00 at 1,500 / 3,000 / 6,000 blocks)."""
    rng = np.random.default_rng(0)
    sessions = 600
    for kv in (1500, 3000, 6000):
        engine = EngineConfig(kv_blocks=kv, kv_block=16, token_budget=4096, max_running=256)
        res, hits = simulate_routed(step, engine, 1, SESSION_AFFINITY, [[(200, 40)] * 3] * sessions,
                                    starts=np.arange(sessions) * 0.03, think_s=rng.exponential(2.0, 3 * sessions))
        spare = kv * (1 - res.metrics()["kv_utilization"])
        kept = retention(np.array([100.0]), 3, np.array([2.0]), 240.0, np.array([16.0]), np.array([spare]))[0]
        assert hits / (2 * sessions) == pytest.approx(kept, abs=0.06), kv
    # far too small a cache keeps none; a large one all
    assert retention(np.array([100.0]), 3, np.array([2.0]), 240.0, np.array([16.0]), np.array([10.0]))[0] < 0.05
    assert retention(np.array([100.0]), 3, np.array([2.0]), 240.0, np.array([16.0]), np.array([1e5]))[0] > 0.999


def test_affinity_beats_round_robin_on_sessions_in_the_model():
    """Eight replicas, four-turn sessions: affinity finds the history, round-robin mostly not, so its
    prompts cost more and its TTFT is longer; throughput is the offered rate either way."""
    point = {**BASE, "request_rate": 64.0, "router_replicas": 8, "session_turns": 4, "think_time": 1.0}
    aff = evaluate({**point, "router": "session-affinity"})
    rr = evaluate({**point, "router": "round-robin"})
    assert aff["ttft_s"][0] < 0.8 * rr["ttft_s"][0]
    assert aff["requests_per_s"][0] == rr["requests_per_s"][0] == pytest.approx(8.0)


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), 1e300, "abc"])
def test_bad_replica_and_session_values_are_refused(bad):
    for key in ("router_replicas", "session_turns", "think_time"):
        if key == "think_time" and bad == 0:
            continue
        with pytest.raises(DseError, match=key):
            evaluate({**BASE, "request_rate": 5.0, key: bad})
    with pytest.raises(DseError, match="router"):
        evaluate({**BASE, "request_rate": 5.0, "router": "fastest"})


def test_sessions_need_an_open_loop_and_a_colocated_engine():
    with pytest.raises(DseError, match="session_turns.*open loop"):
        evaluate({**BASE, "concurrency": 8, "session_turns": 3})
    with pytest.raises(DseError, match="router_replicas.*disaggregated"):
        evaluate({**BASE, "request_rate": 5.0, "router_replicas": 2, "disaggregate": "1:1"})
    with pytest.raises(DseError, match="pp 1 and ep 1"):
        simulate_point({**BASE, "request_rate": 5.0, "router_replicas": 2, "pp": 2, "devices": 2}, 100)


def test_cli_flags_reach_the_point(cli):
    r = cli("analyze", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--request-rate", "40", "--replicas",
            "4", "--router", "least-outstanding", "--format", "json")
    assert r.returncode == 0, r.stderr
    r = cli("analyze", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--request-rate", "40", "--replicas", "0")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--replicas" in r.stderr


def test_round_robin_hits_are_a_mixture_of_earlier_turns():
    """Turn 3 of a session over 4 replicas by round-robin: turn 2's history (479 tokens -> 464 cached
    in blocks of 16) with probability 1/4, turn 1's (239 -> 224) with 3/16, none with 9/16."""
    mean, second = session_hits(np.array([2.0]), 240.0, np.array([16.0]), np.array([4.0]), np.array([ROUND_ROBIN]),
                                np.array([1.0]))
    assert mean[0, 0] == pytest.approx(464 / 4 + 224 * 3 / 16)
    assert second[0, 0] == pytest.approx(464 ** 2 / 4 + 224 ** 2 * 3 / 16)
