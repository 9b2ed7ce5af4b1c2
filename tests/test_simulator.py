"""The discrete-event simulator's prefix caching and disaggregated prefill and decode, checked
against closed forms: with an iteration cost linear in its tokens every time is a sum a
test can write down."""
from dataclasses import replace

import numpy as np
import pytest

import dse.core.simulator as simulator
from basis.errors import DseError
from dse.core.simulator import EngineConfig, simulate, simulate_disaggregated

#: a linear iteration cost (seconds): fixed, per decode token, per prompt token
A, B, C = 2e-3, 1e-4, 1e-5


def _linear(a=A, b=B, c=C, log=None):
    """step_time = a + b x decode tokens + c x prompt tokens (s); every call's arguments
    appended to ``log`` when given."""
    def step(d, dctx, p, pctx, ends):
        if log is not None:
            log.append((d, dctx, p, pctx, ends))
        return a + b * d + c * p
    return step


def _load(n=300, seed=1, top=300):
    """Random prompt and output lengths (tokens) and Poisson arrivals (s)."""
    rng = np.random.default_rng(seed)
    return rng.integers(10, top, n), rng.integers(1, 80, n), np.cumsum(rng.exponential(0.01, n))


def _same(a, b):
    """Two SimulationResults agree in every per-request time and engine figure."""
    for key in ("arrival", "admitted", "first_token", "finish"):
        np.testing.assert_array_equal(getattr(a, key), getattr(b, key), err_msg=key)
    assert (a.steps, a.busy_s, a.running, a.kv_used, a.preemptions) == (b.steps, b.busy_s, b.running, b.kv_used,
                                                                        b.preemptions)


# ------------------------------------------------------------------ prefix caching

def test_a_lone_request_computes_only_past_the_cached_prefix():
    """prefix 70 in blocks of 16: 64 tokens cached, the other 36 of a 100-token prompt
    computed in one iteration, each attending to every key before it."""
    log = []
    res = simulate(_linear(log=log), EngineConfig(kv_blocks=100, prefix_tokens=70), [100], [5], concurrency=1)
    assert log[0] == (0, 0, 36, 36 * 64 + 36 * 35 // 2, 1)
    assert res.first_token[0] == pytest.approx(A + 36 * C, rel=1e-12)
    assert res.finish[0] == pytest.approx(A + 36 * C + 4 * (A + B), rel=1e-12)
    assert [c[1] for c in log[1:]] == [100, 101, 102, 103]            # decode keys: the prompt on


def test_without_a_prefix_a_lone_request_computes_its_whole_prompt():
    log = []
    res = simulate(_linear(log=log), EngineConfig(kv_blocks=100), [100], [5], concurrency=1)
    assert log[0] == (0, 0, 100, 100 * 99 // 2, 1)
    assert res.first_token[0] == pytest.approx(A + 100 * C, rel=1e-12)
    assert res.finish[0] == pytest.approx(A + 100 * C + 4 * (A + B), rel=1e-12)


def test_a_full_hit_still_computes_the_last_prompt_token():
    log = []
    res = simulate(_linear(log=log), EngineConfig(kv_blocks=10, prefix_tokens=64), [64], [3], concurrency=1)
    assert log[0] == (0, 0, 1, 63, 1)
    assert res.first_token[0] == pytest.approx(A + C, rel=1e-12)


@pytest.mark.parametrize("chunked", [True, False])
def test_a_prefix_shorter_than_a_block_caches_nothing(chunked):
    prompts, gens, arrivals = _load()
    eng = EngineConfig(kv_blocks=200, token_budget=300, max_running=32, chunked=chunked)
    plain = simulate(_linear(), eng, prompts, gens, arrivals=arrivals)
    short = simulate(_linear(), replace(eng, prefix_tokens=15), prompts, gens,
                     arrivals=arrivals)
    _same(plain, short)
    assert plain.preemptions > 0                      # a loaded engine, not a trivial one


def test_the_prefix_holds_its_full_blocks_only():
    """prefix 40 in blocks of 16: 2 shared blocks (not 3), a 100-token prompt and its first
    decode token hold 7 - 2 = 5 blocks of their own: two such requests run together in
    2 + 5 + 5 = 12 blocks, not in 11."""
    step = _linear()
    both = simulate(step, EngineConfig(kv_blocks=12, prefix_tokens=40), [100, 100], [1, 1], concurrency=2)
    assert np.all(both.admitted == 0.0)
    assert np.all(both.first_token == pytest.approx(A + 2 * 68 * C, rel=1e-12))
    one = simulate(step, EngineConfig(kv_blocks=11, prefix_tokens=40), [100, 100], [1, 1], concurrency=2)
    first = A + 68 * C
    assert one.admitted[1] == pytest.approx(first, rel=1e-12)
    assert one.finish == pytest.approx([first, 2 * first], rel=1e-12)


def test_a_preempted_request_recomputes_past_its_cached_prefix():
    """Two 40-token prompts (32 cached) on 6 blocks (2 shared): both decode until the
    second is preempted for the first; it recomputes its 64 tokens of context less the 32
    cached, when the first has finished, and then decodes its last 5 tokens."""
    log = []
    res = simulate(_linear(log=log), EngineConfig(kv_blocks=6, prefix_tokens=32), [40, 40], [30, 30], concurrency=2)
    assert res.preemptions == 1
    assert [c for c in log if c[2]] == [(0, 0, 16, 2 * (8 * 32 + 28), 2), (0, 0, 32, 32 * 32 + 32 * 31 // 2, 1)]
    assert res.finish[1] == pytest.approx(res.finish[0] + (A + 32 * C) + 5 * (A + B), rel=1e-12)


def test_a_loaded_engine_with_a_prefix_makes_every_token_once():
    """Prompts of 10 to 300 tokens (some shorter than the 100-token prefix), preempting:
    every request finishes, decodes gen - 1 tokens, computes at least its prompt past the
    cached part, and the cache cuts the mean TTFT."""
    prompts, gens, arrivals = _load()
    ttft = []
    for prefix in (0, 100):
        log = []
        eng = EngineConfig(kv_blocks=120, token_budget=300, max_running=32, prefix_tokens=prefix)
        res = simulate(_linear(log=log), eng, prompts, gens, arrivals=arrivals)
        cached = np.array([eng.cached_tokens(p) for p in prompts])
        assert res.completed == 300 and res.preemptions > 0
        assert sum(c[0] for c in log) == int((gens - 1).sum())
        assert sum(c[2] for c in log) >= int((prompts - cached).sum())
        ttft.append(res.metrics()["ttft_mean_s"])
    assert ttft[1] < ttft[0] / 3


def test_the_prefix_counts_against_the_cache_and_the_budget():
    with pytest.raises(DseError, match="shared prefix's 10 KV blocks leave no room"):
        simulate(_linear(), EngineConfig(kv_blocks=10, prefix_tokens=160), [200], [5], concurrency=1)
    with pytest.raises(DseError, match="needs 4 KV blocks of 16 tokens beside the shared prefix's 10"):
        simulate(_linear(), EngineConfig(kv_blocks=13, prefix_tokens=160), [200], [20], concurrency=1)
    # prefill-first: the computed part of a prompt must fit one iteration's budget
    eng = EngineConfig(kv_blocks=100, token_budget=256, chunked=False)
    with pytest.raises(DseError, match="exceeds the token budget"):
        simulate(_linear(), eng, [300], [5], concurrency=1)
    res = simulate(_linear(), replace(eng, prefix_tokens=64), [300], [5], concurrency=1)
    assert res.first_token[0] == pytest.approx(A + 236 * C, rel=1e-12)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "16"])
def test_prefix_tokens_is_a_non_negative_integer(bad):
    with pytest.raises(DseError, match="prefix_tokens must be a non-negative integer"):
        EngineConfig(kv_blocks=10, prefix_tokens=bad)


# ------------------------------------------------------------------ disaggregated prefill and decode

#: prefill and decode instances' linear costs (s): fixed, per decode token, per prompt token
PRE = (3e-3, 0.0, 2e-5)
DEC = (5e-3, 1e-3, 1e-5)


def _disagg(prompts, gens, *, pre=None, dec=None, p=1, d=1, transfer=0.0, logs=(None, None), **load):
    """simulate_disaggregated with the linear costs PRE and DEC and a fixed transfer time (s)."""
    pre = pre or EngineConfig(kv_blocks=10_000)
    dec = dec or EngineConfig(kv_blocks=10_000)
    return simulate_disaggregated(_linear(*PRE, log=logs[0]), _linear(*DEC, log=logs[1]), pre, dec, p, d,
                                  lambda n: transfer, prompts, gens, **load)


def test_a_lone_request_is_its_prefill_its_transfer_and_its_decode_steps():
    lp, ld = [], []
    res = _disagg([100], [10], transfer=0.004, logs=(lp, ld), concurrency=1)
    ttft = PRE[0] + 100 * PRE[2]
    assert lp == [(0, 0, 100, 100 * 99 // 2, 1)]
    assert ld == [(1, 100 + k, 0, 0, 0) for k in range(9)]
    assert res.first_token[0] == pytest.approx(ttft, rel=1e-12)
    assert res.finish[0] == pytest.approx(ttft + 0.004 + 9 * (DEC[0] + DEC[1]), rel=1e-12)
    assert res.steps == 10 and res.running == 1.0


def test_the_prefill_pool_caches_the_prefix():
    res = _disagg([100], [2], pre=EngineConfig(kv_blocks=100, prefix_tokens=64), concurrency=1)
    assert res.first_token[0] == pytest.approx(PRE[0] + 36 * PRE[2], rel=1e-12)


def test_a_single_output_token_never_reaches_the_decode_pool():
    lp, ld = [], []
    res = _disagg([50, 70], [1, 1], transfer=1.0, logs=(lp, ld), concurrency=2)
    assert not ld and np.array_equal(res.finish, res.first_token)
    assert res.finish == pytest.approx([PRE[0] + 120 * PRE[2]] * 2, rel=1e-12)


def test_under_light_load_a_request_is_its_prefill_and_its_decode():
    """Arrivals a second apart, no transfer time: no request waits for another."""
    rng = np.random.default_rng(2)
    prompts, gens = rng.integers(10, 500, 40), rng.integers(2, 60, 40)
    res = _disagg(prompts, gens, arrivals=np.arange(40.0))
    np.testing.assert_allclose(res.first_token - res.arrival, PRE[0] + prompts * PRE[2], rtol=1e-9)
    np.testing.assert_allclose(res.finish - res.arrival, PRE[0] + prompts * PRE[2] + (gens - 1) * (DEC[0] + DEC[1]),
                               rtol=1e-9)


def test_transfers_from_one_prefill_instance_are_serialized():
    """Two prompts finish in one iteration of one prefill instance: the second's KV leaves
    after the first's (2 x the transfer time); from two instances both leave at once. Two
    decode instances of one sequence each decode them apart; one decode instance with room
    for both decodes them together."""
    tau, d1 = 0.01, DEC[0] + DEC[1]
    dec = EngineConfig(kv_blocks=100, max_running=1)
    res = _disagg([100, 100], [2, 2], dec=dec, d=2, transfer=tau, concurrency=2)
    t1 = PRE[0] + 200 * PRE[2]
    assert res.first_token == pytest.approx([t1, t1], rel=1e-12)
    assert res.finish == pytest.approx([t1 + tau + d1, t1 + 2 * tau + d1], rel=1e-12)
    res = _disagg([100, 100], [2, 2], pre=EngineConfig(kv_blocks=100, token_budget=100), dec=dec, p=2, d=2,
                  transfer=tau, concurrency=2)
    t1 = PRE[0] + 100 * PRE[2]
    assert res.first_token == pytest.approx([t1, t1], rel=1e-12)
    assert res.finish == pytest.approx([t1 + tau + d1] * 2, rel=1e-12)
    # one decode instance with room for both admits them together: one iteration of two
    res = _disagg([100, 100], [2, 2], pre=EngineConfig(kv_blocks=100, token_budget=100), p=2, d=1,
                  transfer=tau, concurrency=2)
    assert res.finish == pytest.approx([t1 + tau + DEC[0] + 2 * DEC[1]] * 2, rel=1e-12)


def _decode_pool(monkeypatch):
    """A list that holds, once a simulate_disaggregated run has ended, its decode instances
    (each with its trace of iterations: start s, duration s, running, KV share)."""
    pool, run = [], simulator._EventLoop.run

    def recording(loop, *args, **kwargs):
        run(loop, *args, **kwargs)
        pool.extend(loop.instances[i] for i in loop.decode)
    monkeypatch.setattr(simulator._EventLoop, "run", recording)
    return pool


def test_each_request_goes_to_the_least_loaded_instance(monkeypatch):
    """A lone request goes to the first instance of each pool. Two requests arriving
    together go to two prefill instances (a prompt iteration each), their KV lands at once
    and they go to two decode instances, each decoding a batch of one (one instance taking
    both would decode them in one iteration of two)."""
    tau = 0.01
    pool = _decode_pool(monkeypatch)
    _disagg([100], [2], p=2, d=2, transfer=tau, concurrency=1)
    assert [len(inst.trace) for inst in pool] == [1, 0]
    pool.clear()
    lp, ld = [], []
    res = _disagg([100, 100], [2, 2], p=2, d=2, transfer=tau, logs=(lp, ld), concurrency=2)
    t1 = PRE[0] + 100 * PRE[2]
    assert lp == [(0, 0, 100, 100 * 99 // 2, 1)] * 2
    assert ld == [(1, 100, 0, 0, 0)] * 2
    assert [[row[2] for row in inst.trace] for inst in pool] == [[1], [1]]
    assert res.finish == pytest.approx([t1 + tau + DEC[0] + DEC[1]] * 2, rel=1e-12)


def test_a_steady_closed_loop_keeps_the_decode_instances_balanced(monkeypatch):
    """Identical requests, 16 in flight, two prefill and two decode instances: at the start
    of every iteration in the measured window the two decode instances run within one
    request of each other (about 7.7 each). With one queue shared by the instances (the
    one that starts first taking all it can) they drifted up to 14 apart."""
    pool = _decode_pool(monkeypatch)
    res = _disagg([100] * 400, [33] * 400, p=2, d=2, transfer=1e-4, concurrency=16)
    lo, hi = res.arrival[res.measured].min(), res.finish[res.measured].max()
    traces = [np.array(inst.trace) for inst in pool]
    starts = np.unique(np.concatenate([tr[:, 0] for tr in traces]))
    starts = starts[(starts >= lo) & (starts < hi)]
    running = np.array([tr[np.searchsorted(tr[:, 0], starts, side="right") - 1, 2] for tr in traces])
    assert len(starts) > 500
    assert np.all(np.abs(running[0] - running[1]) <= 1)
    assert running.mean() == pytest.approx(res.running, rel=0.05) and res.running > 7


def test_decode_instances_multiply_a_decode_bound_throughput():
    """Decode-bound (prefill 20x faster than decode): each decode instance runs its m
    sequences, finishing m requests every gen - 1 iterations of DEC[0] + DEC[1] m."""
    m, gen = 8, 33
    for d in (1, 2, 4):
        res = _disagg([100] * 1200, [gen] * 1200, dec=EngineConfig(kv_blocks=10_000, max_running=m), d=d,
                      transfer=1e-4, concurrency=4 * d * m)
        x = d * m / ((gen - 1) * (DEC[0] + DEC[1] * m))
        assert res.metrics()["requests_per_s"] == pytest.approx(x, rel=1e-3)
        assert res.running == pytest.approx(m)


def test_prefill_instances_multiply_a_prefill_bound_throughput():
    """Prefill-bound (one 1000-token prompt per iteration, a decode pool far faster):
    every prefill instance finishes a request per PRE[0] + 1000 PRE[2] seconds."""
    pre = EngineConfig(kv_blocks=1000, token_budget=1000)
    dec = EngineConfig(kv_blocks=100_000, max_running=1000)
    for p in (1, 2, 4):
        res = simulate_disaggregated(_linear(*PRE), _linear(1e-4, 1e-6, 1e-6), pre, dec, p, 1, lambda n: 1e-4,
                                     [1000] * 800, [4] * 800, concurrency=8 * p)
        assert res.metrics()["requests_per_s"] == pytest.approx(p / (PRE[0] + 1000 * PRE[2]), rel=1e-3)


@pytest.mark.parametrize("chunked", [True, False])
def test_every_request_finishes_once_and_every_token_is_made_once(chunked):
    """A loaded run, preempting in the decode pool: each request finishes once, in order of
    its events; the decode pool decodes gen - 1 tokens of each, the prefill pool computes
    each prompt past its cached prefix, and preempted contexts are recomputed in the decode
    pool; a closed loop keeps its concurrency in the system."""
    prompts, gens, arrivals = _load(n=400, seed=3)
    pre = EngineConfig(kv_blocks=40, token_budget=512, max_running=16, chunked=chunked, prefix_tokens=20)
    dec = EngineConfig(kv_blocks=60, token_budget=512, max_running=16, chunked=chunked)
    cached = np.array([pre.cached_tokens(p) for p in prompts])
    for load in ({"arrivals": arrivals / 2.5}, {"concurrency": 40}):
        lp, ld = [], []
        res = _disagg(prompts, gens, pre=pre, dec=dec, p=2, d=3, transfer=3e-3, logs=(lp, ld), **load)
        assert res.completed == 400 and res.preemptions > 0
        assert np.all(res.arrival <= res.admitted) and np.all(res.admitted < res.first_token)
        assert np.all(res.first_token + 3e-3 * (gens > 1) <= res.finish + 1e-12)
        assert sum(c[0] for c in ld) == int((gens - 1).sum())
        assert sum(c[2] for c in lp) == int((prompts - cached).sum())
        assert sum(c[2] for c in ld) > 0                                 # recomputed after preemptions
    times = np.sort(np.concatenate([res.arrival, res.finish]))
    times = times[times < res.arrival.max()]                            # before the drain
    inside = [(np.sum(res.arrival <= t) - np.sum(res.finish <= t)) for t in times[::23]]
    assert max(inside) == 40 and min(inside) >= 39


def test_disaggregated_runs_are_deterministic():
    prompts, gens, arrivals = _load(seed=4)
    dec = EngineConfig(kv_blocks=50, max_running=16)
    a, b = (_disagg(prompts, gens, dec=dec, p=2, d=2, transfer=1e-3, arrivals=arrivals) for _ in range(2))
    _same(a, b)
    assert a.metrics() == b.metrics()


@pytest.mark.parametrize("kwargs,match", [
    ({"p": 0}, "prefill_instances must be a positive integer"),
    ({"d": -1}, "decode_instances must be a positive integer"),
    ({"d": True}, "decode_instances must be a positive integer"),
    ({"p": 2.0}, "prefill_instances must be a positive integer"),
    ({"transfer": -1.0}, r"transfer_s\(100\) must be a finite number"),
    ({"transfer": float("nan")}, r"transfer_s\(100\) must be a finite number"),
    ({"transfer": float("inf")}, r"transfer_s\(100\) must be a finite number"),
    ({"transfer": "1"}, r"transfer_s\(100\) must be a finite number"),
    ({"pre": EngineConfig(kv_blocks=6)}, "request 0 needs 7 KV blocks of 16 tokens, the prefill cache holds 6"),
    ({"dec": EngineConfig(kv_blocks=7)}, "request 0 needs 8 KV blocks of 16 tokens, the decode cache holds 7"),
    ({"pre": EngineConfig(kv_blocks=100, token_budget=64, chunked=False)}, "exceeds the prefill token budget"),
    ({"dec": EngineConfig(kv_blocks=100, prefix_tokens=1600)}, "leave no room for a request in the decode cache"),
])
def test_bad_disaggregated_inputs_are_refused_in_one_line(kwargs, match):
    with pytest.raises(DseError, match=match) as err:
        _disagg([100], [20], concurrency=1, **kwargs)
    assert str(err.value).startswith("simulator: ") and "\n" not in str(err.value)
