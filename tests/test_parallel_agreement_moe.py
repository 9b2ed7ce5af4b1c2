"""Finite-batch expert imbalance (issue 44, ``--expert-load finite``, ``workloads.routing.finite_busiest``):
the busiest expert-parallel rank's expected routed token-slots, checked against a Monte-Carlo of tokens
each picking top-k distinct experts (Gumbel top-k sampling of the popularity, counted by contiguous
placement), and the opt-in default (``expected``) left bit for bit."""
from __future__ import annotations

import numpy as np
import pytest

from basis.errors import DseError
from dse.study.cli import main
from dse.system.evaluator import evaluate
from workloads.routing import UNIFORM, Routing, expert_load, finite_busiest, zipf_shares


def _monte_carlo(tokens: int, experts: int, top_k: int, ranks: int, shares=None, draws: int = 800,
                 rank_shares: bool = False):
    """Mean over draws of the largest rank's count of the routed token-slots: each token picks top_k
    distinct experts without replacement, weighted by ``shares`` (Gumbel top-k), E/ranks a rank; with
    ``rank_shares``, (that mean, each rank's mean share of the slots)."""
    rng = np.random.default_rng(1234)
    p = np.full(experts, 1.0 / experts) if shares is None else np.asarray(shares)
    keys = rng.gumbel(size=(draws, tokens, experts)) + np.log(p)
    picks = np.argpartition(-keys, top_k - 1, axis=-1)[..., :top_k]
    rank = (picks // (experts // ranks)).reshape(draws, -1)
    counts = np.stack([(rank == r).sum(axis=1) for r in range(ranks)], axis=1)
    most = float(counts.max(axis=1).mean())
    return (most, counts.mean(axis=0) / (tokens * top_k)) if rank_shares else most


@pytest.mark.parametrize("tokens,experts,top_k,ranks", [
    (1, 8, 2, 2),          # Mixtral EP2, batch 1: exact 1 + 3/7 = 1.43 (both picks on one rank with p 12/28)
    (4, 8, 2, 2),
    (64, 8, 2, 8),
    (8, 256, 8, 8),        # DeepSeek-V3 EP8, 1 sequence a rank
    (32, 256, 8, 8),
    (64, 256, 8, 32),
])
def test_finite_busiest_matches_monte_carlo_under_uniform_routing(tokens, experts, top_k, ranks):
    got = float(finite_busiest(tokens, np.full(ranks, 1.0 / ranks), top_k, experts))
    assert got == pytest.approx(_monte_carlo(tokens, experts, top_k, ranks), rel=0.06)
    assert got > tokens * top_k / ranks          # a finite batch's busiest rank exceeds the mean


def test_mixtral_one_token_against_the_exact_expectation():
    exact = 1 + 12 / 28           # two distinct picks of 8, 4 a rank: both on one rank with p 2 C(4,2)/C(8,2)
    assert float(finite_busiest(1, np.array([0.5, 0.5]), 2, 8)) == pytest.approx(exact, rel=0.05)


def test_finite_with_zipf_skew_matches_monte_carlo():
    # Gumbel top-k is not the water-filled popularity of expert_load, so the formula is fed the sampled
    # ranks' mean shares: what is checked is the finite spread on top of a skewed popularity
    E, k, G, T = 64, 4, 8, 16
    most, q = _monte_carlo(T, E, k, G, shares=zipf_shares(E, 0.5), draws=4000, rank_shares=True)
    got = float(finite_busiest(T, q, k, E))
    assert got == pytest.approx(most, rel=0.06)
    assert got > T * k * q.max()                  # the chance spread on top of the popularity's
    load = expert_load(Routing(skew=0.5, finite=True), E, k, G)
    assert load.busiest_tokens(T, finite=True) > load.busiest_tokens(T)


def test_finite_tends_to_the_expected_load_at_large_batches():
    load = expert_load(Routing(finite=True), 256, 8, 32)
    t = np.array([1e3, 1e7])
    ratio = load.busiest_tokens(t, finite=True) / load.busiest_tokens(t)
    assert ratio[0] > 1.05 and ratio[1] == pytest.approx(1.0, abs=2e-3)


def test_never_beyond_what_a_rank_can_receive():
    # 2 tokens, k 8 of 16 experts on 8 ranks (2 a rank): a rank receives at most 2 slots a token
    assert np.all(finite_busiest(np.array([1, 2, 3]), np.full(8, 1 / 8), 8, 16) <= 2 * np.array([1, 2, 3]))


def test_default_is_expected_and_unchanged():
    assert UNIFORM.uniform and not Routing(finite=True).uniform
    point = {"model": "mixtral-8x7b", "hardware": "h100-sxm", "ep": 2, "tp": 1, "batch": 1, "prompt_len": 1000,
             "gen_len": 200}
    a, b, c = (evaluate({**point, **extra}) for extra in ({}, {"expert_load": "expected"}, {"expert_load": "finite"}))
    assert a["tpot_s"][0] == b["tpot_s"][0] and a["ttft_s"][0] == b["ttft_s"][0]
    assert c["ttft_s"][0] > a["ttft_s"][0]


@pytest.mark.parametrize("value", ["abc", "0", "-1", "nan"])
def test_bad_expert_load_is_one_line_exit_2(capsys, value):
    rc = main(["analyze", "--model", "mixtral-8x7b", "--hardware", "h200", "--expert-load", value])
    err = capsys.readouterr().err
    assert rc == 2 and "expert" in err and err.count("\n") == 1 and "Traceback" not in err


def test_bad_expert_load_in_a_study_column_names_the_key():
    with pytest.raises(DseError, match="expert_load: expected one of expected, finite, got 'abc'"):
        evaluate({"model": "mixtral-8x7b", "hardware": "h100-sxm", "ep": 2, "expert_load": "abc"})
