"""The steady-state serving model's regimes against what the scheduler does, with an iteration
cost linear in its tokens, so that every time is a sum a test can write down, and against the
discrete-event simulator running the same cost (``dse.core.simulator``)."""
import numpy as np
import pytest

from dse.core.serving import Load, steady_state, with_request_overhead
from dse.core.simulator import EngineConfig, simulate
from workloads.lengths import Lengths

#: a linear iteration cost (seconds): fixed, per decode token, per prompt token
A, B, C = 2e-3, 1e-4, 1e-5


def _cost(d, dctx, p, pctx, ends, rows=None):
    """A + B x decode tokens + C x prompt tokens (s), arrays or scalars."""
    return A + B * np.asarray(d, float) + C * np.asarray(p, float)


def _load(prompt, gen, *, concurrency=np.nan, rate=np.nan, budget=8192, overhead=0.0):
    """One design point: fixed lengths, a cache far larger than the load, chunked prefill."""
    one = lambda v: np.array([float(v)])  # noqa: E731
    return Load(Lengths.fixed(prompt, gen), kv_blocks=one(1e6), kv_block=one(16), token_budget=one(budget),
                max_running=one(1024), concurrency=one(concurrency), request_rate=one(rate),
                chunked=np.array([True]), prefix_tokens=one(0))


def _sim(prompt, gen, n, requests=1200):
    return simulate(_cost, EngineConfig(kv_blocks=10**6, max_running=1024), [prompt] * requests, [gen] * requests,
                    concurrency=n).metrics()


def test_waves_that_exactly_fill_the_budget_are_packed_whole():
    """16 prompts of 1,024 tokens, budget 8,192, 4 output tokens: a wave of 8 prompts would
    need 8,192 tokens beside the other wave's decoders, so the scheduler takes 7 whole and cuts
    the 8th, which finishes an iteration later and drifts into a later wave; the cycle settles
    at waves of 7, 7 and 2 (each prefilled beside the 9, 9 and 14 requests decoding) and one
    iteration of the 16 decoding. The model's equal waves of 8 said TTFT 0.1098 s where the
    simulator waits 0.0880 s (+25 %) on an H100."""
    t7, t2, t_dec = A + 9 * B + 7168 * C, A + 14 * B + 2048 * C, A + 16 * B
    cycle = 2 * t7 + t2 + t_dec
    ttft = (14 * t7 + 2 * t2) / 16
    out = steady_state(_load(1024, 4, concurrency=16), _cost)
    assert out["requests_per_s"][0] == pytest.approx(16 / cycle, rel=1e-9)
    assert out["ttft_s"][0] == pytest.approx(ttft, rel=1e-9)
    assert out["tpot_s"][0] == pytest.approx((cycle - ttft) / 3, rel=1e-9)
    assert out["e2e_latency_s"][0] == pytest.approx(cycle, rel=1e-9)
    sim = _sim(1024, 4, 16)
    assert sim["requests_per_s"] == pytest.approx(16 / cycle, rel=1e-3)
    assert sim["ttft_mean_s"] == pytest.approx(ttft, rel=1e-3)


@pytest.mark.parametrize("n,gen", [(12, 4), (20, 4), (24, 4), (40, 8), (16, 16)])
def test_waves_are_packed_greedily_as_the_simulator_settles(n, gen):
    """Waves of as many whole 1,024-token prompts as fit beside the others decoding (7), the
    rest in the last one: 12 -> 7 + 5 (not 6 + 6), 20 -> 7 + 7 + 6, 24 -> 7 + 7 + 7 + 3."""
    out = steady_state(_load(1024, gen, concurrency=n), _cost)
    sim = _sim(1024, gen, n, requests=max(1200, 40 * n))
    assert out["requests_per_s"][0] == pytest.approx(sim["requests_per_s"], rel=2e-3)
    assert out["ttft_s"][0] == pytest.approx(sim["ttft_mean_s"], rel=1e-2)
    assert out["tpot_s"][0] == pytest.approx(sim["tpot_mean_s"], rel=1e-2)


# ------------------------------------------------------------------ the fixed overhead of a request

def test_a_lone_request_in_a_closed_loop_spends_its_overhead_in_flight():
    """One request in flight, an overhead of o before the scheduler sees it: its life is o,
    its prompt iteration and its 3 decode iterations, and the next one starts only then, so
    requests/s x (end-to-end + o) = 1 (Little's law). The model added o to the latencies and
    kept the throughput of the engine alone (X (e2e + o) = 1.70 for sglang's 18.6 ms on an
    H100 at 4 output tokens); the simulator added it after the run, the same way."""
    o = 0.02
    engine = A + 1024 * C + 3 * (A + B)
    out = with_request_overhead(steady_state(_load(1024, 4, concurrency=1), _cost), np.array([1.0]), o)
    assert out["requests_per_s"][0] == pytest.approx(1 / (engine + o), rel=1e-9)
    assert out["e2e_latency_s"][0] + o == pytest.approx(engine + o, rel=1e-9)
    sim = simulate(_cost, EngineConfig(kv_blocks=10**6), [1024] * 50, [4] * 50, concurrency=1,
                   request_overhead_s=o).metrics()
    assert sim["requests_per_s"] == pytest.approx(1 / (engine + o), rel=1e-9)
    assert sim["ttft_mean_s"] == pytest.approx(o + A + 1024 * C, rel=1e-9)
    assert sim["e2e_mean_s"] == pytest.approx(engine + o, rel=1e-9)


def test_a_queue_hides_the_overhead_of_a_saturated_engine():
    """A cache that holds 4 requests and 12 in flight: the engine always has a queue, so a
    request's overhead is spent in place of waiting and the throughput is the engine's whatever
    the overhead (less than the wait); end-to-end with the overhead is still N / X."""
    blocks = 4 * (-(-(512 + 64) // 16))
    load = _load(512, 64, concurrency=12)
    load = Load(load.lengths, np.array([float(blocks)]), *[getattr(load, k) for k in (
        "kv_block", "token_budget", "max_running", "concurrency", "request_rate", "chunked", "prefix_tokens")])
    bare = steady_state(load, _cost)
    out = with_request_overhead(bare, np.array([12.0]), 0.01)
    assert out["requests_per_s"][0] == pytest.approx(bare["requests_per_s"][0], rel=1e-12)
    assert (out["e2e_latency_s"][0] + 0.01) * out["requests_per_s"][0] == pytest.approx(12, rel=1e-9)
    eng = EngineConfig(kv_blocks=blocks, max_running=1024)
    runs = [simulate(_cost, eng, [512] * 600, [64] * 600, concurrency=12, request_overhead_s=o).metrics()
            for o in (0.0, 0.01)]
    assert runs[1]["requests_per_s"] == pytest.approx(runs[0]["requests_per_s"], rel=1e-2)
    assert runs[1]["requests_per_s"] * runs[1]["e2e_mean_s"] == pytest.approx(12, rel=1e-9)


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), "0.1", True])
def test_the_simulated_overhead_is_a_finite_number_of_seconds(bad):
    from basis.errors import DseError
    with pytest.raises(DseError, match="request_overhead_s must be a finite number of seconds"):
        simulate(_cost, EngineConfig(kv_blocks=100), [10], [2], concurrency=1, request_overhead_s=bad)
