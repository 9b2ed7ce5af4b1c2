"""How the mixing regime's chain is solved, which moves only the path to its answer, not the answer.

Where the mixing regime's fixed point starts (``serving._mixed``): a closed loop from the mean-value
iteration of its running batch (``_Chain.mean_value``), an open loop without a nearby solution from a few
mean-value rounds at its rate (``_Chain.mean_value_open``), not from an idle engine. The start moves
only the path to the fixed point: the steady state is the one an idle start reaches, within the fixed
point's own tolerance (``serving._SETTLED``, 1e-6 relative on its unknowns). Checked with an iteration
cost linear in its tokens, whose mean-value iteration is a closed form.

How many states a point's chain holds (``serving._Chain.state``): first the next half power of two
above its need (the arrivals expected in its longest iteration and six deviations more,
``serving._states``); where more than ``serving._SPILL`` of its iterations spill past the last state
(whose arrivals the chain keeps there), the next power of two it always held (``serving._held``). The
answer is the converged chain's where nothing spills, and the old chain's where something does."""
from __future__ import annotations

import numpy as np
import pytest

from dse.core import serving
from dse.core.serving import Load, steady_state
from workloads.lengths import Lengths, parse_lengths

#: a linear iteration cost (seconds): fixed, per decode token, per prompt token
A, B, C = 2e-3, 1e-4, 1e-5


def _cost(d, dctx, p, pctx, ends, rows=None):
    """A + B x decode tokens + C x prompt tokens (s)."""
    return A + B * np.asarray(d, float) + C * np.asarray(p, float)


def _load(lengths: Lengths, *, concurrency=(np.nan,), rate=(np.nan,), budget=8192.0) -> Load:
    """Points of these lengths, a cache far larger than the load, chunked prefill."""
    n = max(len(concurrency), len(rate))

    def col(v):
        return np.broadcast_to(np.asarray(v, dtype=float), (n,)).copy()
    return Load(lengths, kv_blocks=col(1e6), kv_block=col(16), token_budget=col(budget), max_running=col(1024),
                concurrency=col(concurrency), request_rate=col(rate), chunked=np.ones(n, dtype=bool),
                prefix_tokens=col(0))


def _chain(load: Load) -> serving._Chain:
    return serving._Chain(load, serving._classes(load), _cost, np.arange(len(load.kv_block)))


LOGNORMAL = parse_lengths("lognormal:sigma=0.8").classes(1024, 256)


def test_a_closed_loops_start_is_its_mean_value_iteration():
    """n running sequences, each E[n] chunks and E[s] decode steps: an iteration holds n E[s] / (E[n] +
    E[s]) decoders and n E[n] / (E[n] + E[s]) chunks of the mean chunk's tokens."""
    running = np.array([1.0, 8.0, 64.0, 256.0])
    chain = _chain(_load(LOGNORMAL, concurrency=running))
    en, es, tok = chain.en, chain.es, chain.tok
    expected = A + B * running * es / (en + es) + C * tok * running * en / (en + es)
    np.testing.assert_allclose(chain.mean_value(running), expected, rtol=1e-12)
    # a budget with no room beside the decoders: one chunk's worth of a token (the budget's floor)
    tight = _chain(_load(LOGNORMAL, concurrency=running, budget=16.0))
    dec = running * tight.es / (tight.en + tight.es)
    chunks = np.minimum(running - dec, np.maximum(16.0 - dec, 1.0) / tight.tok)
    np.testing.assert_allclose(tight.mean_value(running), A + B * dec + C * chunks * tight.tok, rtol=1e-12)


@pytest.mark.parametrize("rounds", [1, 2, 60])
def test_an_open_loops_start_is_the_mean_value_iteration_after_so_many_rounds(rounds):
    """t <- A + x (B E[s] + C E[n] tok) t from an idle engine (A + B: one decoder): after r rounds t* +
    alpha^r (t0 - t*), t* = A / (1 - alpha), alpha = x (B E[s] + C E[n] tok); the running batch x (E[n] +
    E[s]) t."""
    rate = np.array([0.5, 5.0, 20.0])
    chain = _chain(_load(LOGNORMAL, rate=rate))
    at = np.arange(len(rate))
    t, b = chain.mean_value_open(at, rate, np.full(len(rate), 1e9), rounds=rounds)
    alpha = rate * (B * chain.es + C * chain.en * chain.tok)
    star = A / (1.0 - alpha)
    expected = star + alpha ** rounds * (A + B - star)
    np.testing.assert_allclose(t, expected, rtol=1e-12)
    np.testing.assert_allclose(b, rate * (chain.en + chain.es) * expected, rtol=1e-12)
    # the running batch held to its cap
    _, capped = chain.mean_value_open(at, rate, np.full(len(rate), 3.0), rounds=rounds)
    assert np.all(capped <= 3.0)


def test_an_open_loop_held_at_its_cap_starts_as_a_closed_loop_of_the_cap():
    """Past the capacity the running batch is the cap b and the engine serves b / ((E[n] + E[s]) t)
    requests/s, not the offered rate: b E[s] / (E[n] + E[s]) decoders and b E[n] / (E[n] + E[s]) chunks,
    the closed loop's mean iteration at b (A + B b E[s] / (E[n] + E[s]) + C tok b E[n] / (E[n] + E[s]))."""
    rate = np.array([1e3, 1e4, 1e5])                  # every round's batch past the cap of 3
    chain = _chain(_load(LOGNORMAL, rate=rate))
    at = np.arange(len(rate))
    t, b = chain.mean_value_open(at, rate, np.full(len(rate), 3.0), rounds=2)
    en, es, tok = chain.en, chain.es, chain.tok
    np.testing.assert_allclose(t, A + B * 3.0 * es / (en + es) + C * tok * 3.0 * en / (en + es), rtol=1e-12)
    np.testing.assert_array_equal(b, 3.0)


def _idle(chain: serving._Chain, at) -> np.ndarray:
    """Seconds of an iteration of one decoder, points ``at``."""
    zero = np.zeros(len(at))
    return chain.it(np.ones(len(at)), chain.ctx[at], zero, zero, zero, chain.rows[at])


def _from_idle(monkeypatch):
    """The fixed point started from an engine of one decoder, as before the mean-value start."""
    monkeypatch.setattr(serving._Chain, "mean_value", lambda self, running: _idle(self, np.arange(len(self.rows))))
    monkeypatch.setattr(serving._Chain, "mean_value_open",
                        lambda self, at, rate, cap, rounds=0: (_idle(self, at), np.minimum(np.ones(len(at)), cap)))


@pytest.mark.parametrize("loop", ["closed", "open"])
@pytest.mark.parametrize("lengths", ["lognormal:sigma=0.8", "lognormal:sigma=1.5"])
def test_the_steady_state_does_not_depend_on_where_the_fixed_point_starts(monkeypatch, loop, lengths):
    """Every metric from the mean-value start equals the idle start's within the fixed point's tolerance,
    closed loops at 1 to 512 sequences, open loops from a trickle to near capacity (a nanosecond apart
    where a wait is next to nothing: 1.7e-7 s at 95 % of the capacity)."""
    spread = parse_lengths(lengths).classes(1024, 256)
    if loop == "closed":
        load = _load(spread, concurrency=[1.0, 4.0, 32.0, 128.0, 512.0])
    else:
        capacity = steady_state(_load(spread, concurrency=[1e6]), _cost)["requests_per_s"][0]
        load = _load(spread, rate=capacity * np.array([0.01, 0.2, 0.5, 0.8, 0.95]))
    mean_value = steady_state(load, _cost)
    with monkeypatch.context() as m:
        _from_idle(m)
        idle = steady_state(load, _cost)
    for key, v in mean_value.items():
        v, w = np.asarray(v, dtype=float), np.asarray(idle[key], dtype=float)
        np.testing.assert_allclose(v, w, rtol=2e-5, atol=1e-9, err_msg=key)


def test_a_chain_holds_the_next_half_power_of_two_of_states_from_eight():
    need = np.arange(1, serving._MOST_STATES + 1, dtype=float)
    size = serving._states(need)
    assert np.all(size >= np.maximum(need, 8)) and np.all(size == np.round(size))
    assert np.all(size <= np.maximum(np.sqrt(2.0) * need + 1.0, 8))
    assert sorted(set(size)) == [8, 12, 16, 23, 32, 46, 64, 91, 128, 182, 256]


#: (prompt, output) tokens of long prompts on 8,192-token chunks (16 and 4 chunks each)
LONG = [(131072, 64), (32768, 64)]


def _long_open_loops(prompt: int, gen: int) -> Load:
    """Open loops of these fixed lengths at 20, 50 and 80 % of the capacity."""
    lengths = Lengths.fixed(prompt, gen)
    capacity = steady_state(_load(lengths, concurrency=[1e6]), _cost)["requests_per_s"][0]
    return _load(lengths, rate=capacity * np.array([0.2, 0.5, 0.8]))


def _with_states(load: Load, monkeypatch, states) -> dict:
    """The steady state with chains given ``states(need)`` states."""
    with monkeypatch.context() as m:
        m.setattr(serving, "_states", states)
        return steady_state(load, _cost)


def _converged(load: Load, monkeypatch) -> dict:
    """The steady state on chains eight times the need's power of two (2,048 states at most)."""
    return _with_states(load, monkeypatch, lambda need: np.minimum(8 * serving._held(need), 2048))


@pytest.mark.parametrize("prompt,gen", LONG)
def test_a_chain_that_spills_is_solved_with_the_states_it_held(monkeypatch, prompt, gen):
    """Prompts cut into 16 or 4 chunks that come at once queue past one iteration's arrivals: their
    chains spill past the half power of two and are solved again with the whole power of two, as they
    always were; the steady state is that chain's within the fixed point's tolerance."""
    load = _long_open_loops(prompt, gen)
    mine, held = steady_state(load, _cost), _with_states(load, monkeypatch, serving._held)
    for key, v in mine.items():
        np.testing.assert_allclose(np.asarray(v, dtype=float), np.asarray(held[key], dtype=float), rtol=2e-5,
                                   atol=1e-12, err_msg=key)


@pytest.mark.xfail(strict=True, reason="a known limit: the chain's states, six deviations past one iteration's "
                   "arrivals, fold a real tail of these queues into the last state: TTFT 1.4 / 8.5 / 30 % short "
                   "of the converged chain at 20 / 50 / 80 % load for 128k-token prompts, 0.2 / 2.0 / 13 % for "
                   "32k (a chain grown past its spill converges, at K^3 a solve near saturation)")
@pytest.mark.parametrize("prompt,gen", LONG)
def test_long_prompt_queues_are_the_converged_chains(monkeypatch, prompt, gen):
    load = _long_open_loops(prompt, gen)
    np.testing.assert_allclose(steady_state(load, _cost)["ttft_s"], _converged(load, monkeypatch)["ttft_s"],
                               rtol=0.01)


@pytest.mark.parametrize("loop", ["closed", "open"])
def test_lognormal_lengths_and_bursts_are_the_converged_chains(monkeypatch, loop):
    """Lognormal lengths, unchunked, are the converged chain's within 1e-4 (2.3e-5 measured at 95 % load,
    where the chain keeps the most states; the mean wait behind others, read off the tail, 1.9e-4 there,
    held to 3e-3 as above): open loops with lognormal lengths and bursty arrivals from a trickle to
    near capacity, closed loops from 1 to 512 sequences."""
    spread = parse_lengths("lognormal:sigma=1.2").classes(2048, 256)
    if loop == "closed":
        load = _load(spread, concurrency=[1.0, 4.0, 32.0, 128.0, 512.0])
    else:
        capacity = steady_state(_load(spread, concurrency=[1e6]), _cost)["requests_per_s"][0]
        load = _load(spread, rate=capacity * np.array([0.01, 0.2, 0.5, 0.8, 0.95]))
        load = Load(**{**load.__dict__, "dispersion": np.full(5, 2.0)})
    mine, converged = steady_state(load, _cost), _converged(load, monkeypatch)
    for key, v in mine.items():       # seconds: within 0.1 us (small waits move by nanoseconds)
        np.testing.assert_allclose(np.asarray(v, dtype=float), np.asarray(converged[key], dtype=float),
                                   rtol=3e-3 if key == "wait_s" else 1e-4,     # the tail's mean wait: 1.9e-4
                                   atol=1e-7 if key.endswith("_s") else 1e-12, err_msg=key)
