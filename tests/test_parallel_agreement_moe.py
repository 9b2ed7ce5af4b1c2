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
from dse.system.moe import finite_imbalance
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


def _hypergeometric_busiest(tokens: int, experts: int, top_k: int, ranks: int) -> float:
    """Mean over draws of the busiest rank's routed token-slots over the mean rank's, each token's k
    distinct picks of E uniform experts (E/ranks a rank) counted per rank as one multivariate
    hypergeometric draw, the tokens independent: a sampler other than the Gumbel top-k above."""
    rng, draws = np.random.default_rng(7), max(2000, 20000 // tokens)
    per_token = rng.multivariate_hypergeometric([experts // ranks] * ranks, top_k, size=(draws, tokens))
    return float(per_token.sum(axis=1).max(axis=1).mean() / (tokens * top_k / ranks))


@pytest.mark.parametrize("model,ep,batch,experts,top_k", [
    ("mixtral-8x7b", 2, 1, 8, 2),        # exact 1 + 3/7 = 1.43: both picks on one rank with p 3/7
    ("mixtral-8x7b", 2, 16, 8, 2),
    ("deepseek-v3", 8, 8, 256, 8),
    ("deepseek-v3", 8, 64, 256, 8),
    ("deepseek-v3", 32, 64, 256, 8),
])
def test_finite_moe_imbalance_column_is_the_busiest_rank_at_the_batch(model, ep, batch, experts, top_k):
    point = {"model": model, "hardware": "h200", "ep": ep, "tp": 1, "batch": batch, "prompt_len": 256,
             "gen_len": 16, "weights": "fp8", "activations": "fp8", "kv": "fp8"}
    finite = evaluate({**point, "expert_load": "finite"})["moe_imbalance"][0]
    assert finite == pytest.approx(_hypergeometric_busiest(batch, experts, top_k, ep), rel=0.06)
    assert evaluate(point)["moe_imbalance"][0] == 1.0      # expected: the uniform popularity's, at any batch


def test_mixtral_batch_1_hypergeometric_sampler_finds_the_exact_expectation():
    assert _hypergeometric_busiest(1, 8, 2, 2) == pytest.approx(1 + 3 / 7, rel=0.01)


@pytest.mark.parametrize("tokens,experts,top_k,ranks", [(1, 8, 2, 8), (4, 8, 2, 4), (1, 256, 8, 32)])
def test_finite_imbalance_near_exact_below_a_few_slots_a_rank(tokens, experts, top_k, ranks):
    # under ~8 routed token-slots a rank the busiest rank's count comes from the exact per-rank law
    # (``_uniform_small_busiest``), a lower bound (the normal counts ran -13 % at Mixtral EP 8
    # batch 1, -7 % at EP 4 batch 4, -22 % at DeepSeek-V3 EP 32 batch 1)
    got = finite_imbalance(expert_load(Routing(finite=True), experts, top_k, ranks), np.array([tokens]), ranks)[0]
    sampled = _hypergeometric_busiest(tokens, experts, top_k, ranks)
    assert 0.92 * sampled <= got <= 1.01 * sampled     # -7 % at EP 4 batch 4 (2 slots a rank), <= 4 % else


def test_finite_imbalance_falls_with_the_batch_and_expected_stays_put():
    point = {"model": "deepseek-v3", "hardware": "h200", "ep": 8, "tp": 1, "prompt_len": 256, "gen_len": 16,
             "weights": "fp8", "activations": "fp8", "kv": "fp8", "moe_skew": 0.5}
    batches = [8, 64, 4096]
    finite = evaluate({**point, "batch": batches, "expert_load": ["finite"] * 3})["moe_imbalance"]
    expected = evaluate({**point, "batch": batches})["moe_imbalance"]
    popularity = expert_load(Routing(skew=0.5), 256, 8, 8).imbalance
    assert np.all(expected == popularity)                   # bit for bit the popularity's factor
    assert finite[0] > finite[1] > finite[2] >= popularity
    assert finite[2] == pytest.approx(popularity, rel=0.02)


def test_served_finite_imbalance_is_at_the_running_batch():
    point = {"model": "mixtral-8x7b", "hardware": "h200", "ep": 2, "tp": 1, "prompt_len": 512, "gen_len": 128,
             "serving": "continuous", "concurrency": 12, "expert_load": "finite"}
    ev = evaluate(point)
    running = int(ev["batch_used"][0])
    assert 1 < running <= 12
    assert ev["moe_imbalance"][0] == pytest.approx(_hypergeometric_busiest(running, 8, 2, 2), rel=0.06)
    assert evaluate({**point, "expert_load": "expected"})["moe_imbalance"][0] == 1.0


@pytest.mark.parametrize("tokens,experts,top_k,ranks", [
    (1, 8, 2, 8),          # Mixtral EP8, batch 1: every rank 0 or 1 a token, max exactly 1 (normal: -13 %)
    (1, 256, 8, 32),       # DeepSeek-V3 EP32, batch 1 (normal quadrature: -22 %)
    (2, 256, 8, 32),
    (4, 8, 2, 2),
])
def test_small_counts_from_the_exact_rank_law_against_20000_draws(tokens, experts, top_k, ranks):
    # the exact per-rank count law with independent ranks is a lower bound (negative association): 0..-4 %
    got = float(finite_busiest(tokens, np.full(ranks, 1.0 / ranks), top_k, experts))
    mc = _monte_carlo(tokens, experts, top_k, ranks, draws=20_000)
    assert 0.96 * mc <= got <= 1.005 * mc
