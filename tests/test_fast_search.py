"""The serving model's two searches, made faster without changing an answer (issue 48): the
percentiles of a mixture (``serving.mixture_quantiles``: Newton's method brackets each one, then
the bisection is replayed against the bracket) and the largest rate meeting the SLOs
(``serving.largest_rate``: regula falsi on a float margin brackets it, then the bisection is
replayed). Each is checked bit for bit against the plain bisection it replaces."""
from __future__ import annotations

import numpy as np
import pytest
from scipy.special import ndtr

from dse import evaluate
from dse.core import serving


def plain_bisection(mean, sd, weight, q, halvings=36):
    """The q-th percentiles [A, Q] of mixtures of normals (sd 0: a point mass) by bisection of their
    CDF over [lowest mean - 8 sd, highest mean + 8 sd], ``halvings`` times, returning the upper end."""
    w = weight / np.maximum(weight.sum(axis=1, keepdims=True), 1e-300)
    out = np.empty((len(mean), len(q)))
    for a in range(len(mean)):
        on = w[a] > 0
        for j, p in enumerate(q):
            lo, hi = np.min(np.where(on, mean[a] - 8 * sd[a], np.inf)), np.max(np.where(on, mean[a] + 8 * sd[a], -np.inf))
            for _ in range(halvings):
                mid = 0.5 * (lo + hi)
                with np.errstate(divide="ignore", invalid="ignore"):
                    cdf = (w[a] * np.where(sd[a] > 0, ndtr((mid - mean[a]) / sd[a]), mid >= mean[a])).sum()
                lo, hi = (mid, hi) if cdf < p / 100.0 else (lo, mid)
            out[a, j] = hi
    return out


@pytest.mark.parametrize("seed", range(6))
def test_mixture_percentiles_are_the_bisections_bit_for_bit(seed):
    rng = np.random.default_rng(seed)
    a, c = 40, int(rng.integers(2, 40))
    scale = 10.0 ** rng.uniform(-4, 2)
    mean = rng.uniform(0, 1, (a, c)) * scale + (50.0 if seed == 3 else 0.0)   # a far offset: precision at its ulp
    sd = rng.uniform(0, 0.3, (a, c)) * scale * (rng.random((a, c)) > (0.4 if seed % 2 else 0.0))
    if seed == 4:
        sd *= 1e-7                                      # nearly point masses: a CDF of steep steps
    weight = rng.random((a, c)) * (rng.random((a, c)) > 0.25)
    weight[:, 0] += 0.1                                 # every mixture has a component
    q = [50, 90, 99]
    got = serving.mixture_quantiles(mean, sd, weight, q)
    assert np.array_equal(got, plain_bisection(mean, sd, weight, q))


@pytest.mark.parametrize("seed", range(4))
def test_point_mass_percentiles_are_the_bisections_bit_for_bit(seed):
    """Mixtures of point masses only (a closed loop's fixed lengths): their CDF a staircase, means
    tied and weights equal (cumulative sums landing on a level exactly)."""
    rng = np.random.default_rng(seed)
    a, c = 30, int(rng.integers(1, 30))
    mean = np.round(rng.uniform(0, 1, (a, c)) * 10.0 ** rng.uniform(-3, 3), int(rng.integers(0, 3)))
    weight = np.ones((a, c)) if seed % 2 else rng.random((a, c)) * (rng.random((a, c)) > 0.3)
    weight[:, 0] += 1e-3 if seed % 2 == 0 else 0.0
    q = [50, 90, 99, 100 / 3]
    sd = np.zeros((a, c))
    assert np.array_equal(serving.mixture_quantiles(mean, sd, weight, q), plain_bisection(mean, sd, weight, q))


def _kinked_margin(root, calls):
    """A margin as ``serving._row_margin`` gives it (x / p - 1 of a latency p and its bound x, at least
    -1), >= 0 below each point's ``root`` only: the lesser of two latencies', one queueing (p
    growing as 1 / (1 - load), unbounded past 1.11 x the root), the other growing linearly."""
    def margin(rate, idx):
        calls.append(len(idx))
        load = rate / root[idx]
        with np.errstate(divide="ignore"):
            queue = 0.1 / np.maximum(1.0 - 0.9 * load, 0.0)       # p / x
        line = 1.0 / (3.0 - 2.0 * np.minimum(load, 1.4))
        return np.maximum(np.minimum(1.0 / queue, 1.0 / line) - 1.0, -1.0)
    return margin


def test_largest_rate_with_a_float_margin_is_the_bisections_answer():
    rng = np.random.default_rng(7)
    capacity = rng.uniform(5.0, 50.0, 300)
    root = capacity * rng.uniform(0.05, 0.99, 300)
    float_calls, bool_calls = [], []
    margin = _kinked_margin(root, float_calls)
    fast = serving.largest_rate(margin, capacity, 12)
    slow = serving.largest_rate(lambda r, i: _kinked_margin(root, bool_calls)(r, i) >= 0, capacity, 12)
    assert np.array_equal(fast, slow)
    assert np.all((fast <= root) & (root - fast <= capacity * 2.0 ** -12))    # the bisection's precision
    assert len(float_calls) <= 2 * len(bool_calls)      # the bracket's tries, then the replay's: each <= steps


def test_no_rate_or_every_rate_meets():
    capacity = np.array([10.0, 10.0])
    got = serving.largest_rate(lambda r, i: np.where(i == 0, 1.0, -1.0), capacity, 12)
    assert got[0] == pytest.approx(10.0 * (1 - 1e-9)) and got[1] == 0.0


def test_served_goodput_is_the_bisections_whatever_the_margins_size(monkeypatch):
    """The goodput of served points with the margin's size (x / p - 1) and with its sign alone (+-1:
    the plain bisection, every halving tried): the same rates, bit for bit."""
    rng = np.random.default_rng(3)
    n = 24
    cols = {"hardware": "h100-sxm", "model": "llama-3.1-8b", "weights": "fp8", "activations": "fp8", "kv": "fp8",
            "prompt_len": 1024, "gen_len": 256, "concurrency": "closed", "lengths": ["fixed", "lognormal:sigma=0.8"] * (n // 2),
            "memory_bandwidth": rng.uniform(2e12, 8e12, n), "slo_ttft": rng.uniform(0.05, 0.5, n),
            "slo_tpot": rng.uniform(0.01, 0.05, n)}
    cols["concurrency"] = 1
    fast = evaluate(cols)["goodput"]
    sized = serving._row_margin
    monkeypatch.setattr(serving, "_row_margin", lambda mix, q, x: np.sign(sized(mix, q, x) + 1e-300))
    slow = evaluate(cols)["goodput"]
    assert np.all(fast > 0)
    assert np.array_equal(fast, slow)
