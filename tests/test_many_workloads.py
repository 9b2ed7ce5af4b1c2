"""Every design point its own workload: batch and lengths priced as columns (``WorkloadBatch``).

Points whose workloads differ only in batch, prompt and generated lengths are priced together, their
operator tables built at once with one row per workload. They must give what pricing each workload on
its own gives (the per-workload path, forced with ``MANY_BELOW = 0``), and the tables must follow the
closed forms of the operators they hold.
"""
import numpy as np
import pytest

import dse.system.evaluator as E
import dse.system.grouping as grouping
import dse.system.workload as W
from basis.errors import DseError
from dse import evaluate
from dse.system.workload import resolve_model, tables, workload_batch
from workloads.scenario import Scenario

RNG = np.random.default_rng(11)
N = 160


def _lengths(n, batch=64, prompt=2048, gen=512):
    return dict(batch=RNG.integers(1, batch + 1, n), prompt_len=RNG.integers(16, prompt, n),
                gen_len=RNG.integers(1, gen, n))


CASES = {
    "dense, FlashAttention, tp": dict(hardware="h100-sxm", model="llama-2-70b", weights="fp8", activations="fp8",
                                      kv="fp8", flash_attention=True, devices=RNG.choice([2, 4, 8], N),
                                      memory_bandwidth=RNG.uniform(1e12, 1.6e13, N), **_lengths(N, 256, 4096, 1024)),
    "MoE with expert parallelism": dict(hardware=RNG.choice(["h100-sxm", "mi300x"], N), model="mixtral-8x7b",
                                        devices=RNG.choice([2, 4], N), ep=RNG.choice([1, 2], N), **_lengths(N)),
    "MLA, near-memory units": dict(hardware=RNG.choice(["h200", "hbm-pim", "attacc"], N), model="deepseek-v2-lite",
                                   **_lengths(N)),
    "pipeline, weight-only int4": dict(hardware="a100-80gb", model="llama-2-13b", pp=RNG.choice([1, 2, 4], N),
                                       weights=RNG.choice(["fp16", "int4"], N), **_lengths(N)),
    "offload to the host": dict(hardware="gh200", model="llama-2-70b", offload="greedy", **_lengths(N, 32)),
    "contextual sparsity and early exit": dict(hardware="h100-sxm", model="llama-2-13b", activation_sparsity=0.5,
                                               layers_used=0.75, **_lengths(N)),
    # workloads shared by about 20 points each: one operator table per distinct workload (Stacked)
    "shared workloads, tp 2": dict(hardware="h100-sxm", model="llama-2-13b", devices=2, batch=RNG.choice([1, 4, 16, 64], N),
                                   prompt_len=RNG.choice([512, 2048], N), gen_len=RNG.choice([64, 256], N),
                                   memory_bandwidth=RNG.uniform(1e12, 1.6e13, N), peak_fp16=RNG.uniform(1e14, 4e15, N)),
    "shared workloads, near-memory units": dict(hardware=RNG.choice(["h200", "hbm-pim"], N), model="llama-2-7b",
                                                batch=RNG.choice([1, 8, 32], N), prompt_len=RNG.choice([256, 1024], N),
                                                gen_len=128),
    # a decode that fills one limit: two affine pieces split at a step of each workload's own (some
    # start past the limit, some fill it during the generation, some never reach it)
    "sliding window filling": dict(hardware=RNG.choice(["h100-sxm", "l40s"], N), model="mistral-7b",
                                   batch=RNG.integers(1, 33, N), prompt_len=RNG.integers(16, 6000, N),
                                   gen_len=RNG.integers(1, 3000, N)),
    "sliding windows of two sizes' layers": dict(hardware="h200", model="gpt-oss-20b", **_lengths(N, 32, 600, 400)),
    "sparse attention's top-k filling": dict(hardware="b200", model="deepseek-v3.2", devices=8, weights="fp8",
                                             activations="fp8", kv="fp8", **_lengths(N, 8, 4000, 3000)),
    "KV budget filling": dict(hardware="h100-sxm", model="llama-3.1-8b", kv_budget=1024, **_lengths(N, 32, 3000, 1500)),
    "shared workloads, sliding window": dict(hardware="h100-sxm", model="gemma-2-9b-it", batch=RNG.choice([1, 8], N),
                                             prompt_len=RNG.choice([1000, 4000, 5000], N), gen_len=RNG.choice([64, 600], N),
                                             memory_bandwidth=RNG.uniform(1e12, 8e12, N)),
}


def _one_at_a_time(cols, monkeypatch, **kw):
    with monkeypatch.context() as m:
        m.setattr(grouping, "MANY_BELOW", 0)
        return evaluate(cols, **kw)


@pytest.mark.parametrize("case", list(CASES))
def test_workloads_priced_together_equal_each_priced_alone(case, monkeypatch):
    cols = CASES[case]
    together, alone = evaluate(cols), _one_at_a_time(cols, monkeypatch)
    assert together.feasible.any()
    assert np.array_equal(together.reason, alone.reason)
    for k in together.metrics:
        np.testing.assert_allclose(together.metrics[k], alone.metrics[k], rtol=1e-12, atol=0, err_msg=k)


@pytest.mark.parametrize("case", list(CASES))
def test_workloads_priced_in_blocks_equal_priced_at_once(case, monkeypatch):
    """Tables of many workloads are built and priced ``TABLE_ROWS`` at a time: blocks of 7 rows (the
    last one shorter) give what one block of them all gives, to the rounding of a sum over operators
    (numpy orders it by the layout of a block's arrays; a block of one row is laid out both ways)."""
    cols = CASES[case]
    whole = evaluate(cols)
    monkeypatch.setattr(W, "TABLE_ROWS", 7)
    monkeypatch.setattr(W, "STACKED_ROWS", 7)
    assert [(b.start, b.stop) for b in W.row_blocks(16)] == [(0, 7), (7, 14), (14, 16)]
    blocks = evaluate(cols)
    assert np.array_equal(whole.reason, blocks.reason)
    for k in whole.metrics:
        np.testing.assert_allclose(whole.metrics[k], blocks.metrics[k], rtol=1e-14, atol=0, err_msg=k)


def test_a_shared_workload_keeps_its_own_group(monkeypatch):
    """Points that share a workload with MANY_BELOW or more others are priced per workload."""
    n = 4 * E.MANY_BELOW
    cols = dict(hardware="h100-sxm", model="llama-2-7b", batch=np.repeat([1, 8, 64, 256], n // 4),
                memory_bandwidth=np.linspace(1e12, 8e12, n))
    plan = E.prepare(cols)
    assert len(plan.groups) == 4 and not any(isinstance(g.tables, E.WorkloadBatch) for g in plan.groups)
    plan = E.prepare({**cols, "batch": np.arange(1, n + 1)})
    assert len(plan.groups) == 1 and isinstance(plan.groups[0].tables, E.WorkloadBatch)


def test_a_lone_workload_keeps_its_own_group():
    """Pricing together pays only across workloads (``MANY_WORKLOADS``): points of one workload, or
    of one workload in each format, get a group per workload; two workloads share one group."""
    cols = dict(hardware="h100-sxm", model="llama-2-7b", batch=8, memory_bandwidth=np.linspace(1e12, 8e12, 10))
    kinds = [type(g.tables) for g in E.prepare(cols).groups]
    assert kinds == [E.WorkloadTables]
    kinds = [type(g.tables) for g in E.prepare({**cols, "weights": ["fp16"] * 5 + ["fp8"] * 5}).groups]
    assert kinds == [E.WorkloadTables] * 2
    plan = E.prepare({**cols, "batch": np.repeat([1, 8], 5)})
    assert [type(g.tables) for g in plan.groups] == [E.WorkloadBatch] and plan.groups[0].tables.size == 10
    mixed = E.prepare({**cols, "batch": [1, 8, 8, 8, 8, 8, 8, 8, 8, 8], "weights": ["fp16"] * 2 + ["fp8"] * 8})
    assert sorted(type(g.tables).__name__ for g in mixed.groups) == ["WorkloadBatch", "WorkloadTables"]


def test_explained_point_of_many_matches_alone(monkeypatch):
    cols = CASES["dense, FlashAttention, tp"]
    pick = [3, 77]
    together = evaluate(cols, explain=pick)
    alone = _one_at_a_time(cols, monkeypatch, explain=pick)
    for p in pick:
        for stage in ("prefill", "decode"):
            a, b = together.explained[p][stage], alone.explained[p][stage]
            assert [r["name"] for r in a] == [r["name"] for r in b]
            np.testing.assert_allclose([r["time_s"] for r in a], [r["time_s"] for r in b], rtol=1e-12)


def test_tables_of_many_follow_the_closed_forms():
    """Rows of a WorkloadBatch's tables: the LM head of a decode step computes 2 B h V ops and a
    prefill's q projection 2 B S h (heads x head_dim) over its B S tokens and reads its h (heads x head_dim)
    weights whatever the workload; and each row equals the table of that workload built alone."""
    m = resolve_model("llama-2-7b")
    b, p, g = np.array([1, 7, 64]), np.array([100, 2048, 17]), np.array([5, 300, 2])
    wb = workload_batch(m, b, p, g, "fp16", "fp16", "fp16", 1, 1, 1, False, 0.0)
    t = wb.tables(slice(None))
    names = t.prefill_table.names
    q = names.index("q_proj")
    np.testing.assert_allclose(t.prefill.ops[:, q], 2 * b * p * m.hidden_size * m.num_heads * m.head_dim)
    head = t.decode_first.ops[:, t.prefill_table.names.index("lm_head")]
    np.testing.assert_allclose(head, 2 * b * m.hidden_size * m.vocab_size)
    assert np.all(t.prefill.weight_bytes[:, q] == m.hidden_size * m.num_heads * m.head_dim * 2)   # fp16
    for i in range(3):
        alone = tables(m, int(b[i]), int(p[i]), int(g[i]), "fp16", "fp16", "fp16", 1, 1, 1, False, 0.0)
        for f in ("ops", "weight_bytes", "act_bytes", "kv_bytes"):
            np.testing.assert_allclose(getattr(t.prefill, f)[i], getattr(alone.prefill, f), rtol=1e-13)
            np.testing.assert_allclose(getattr(t.decode_slope, f)[i], getattr(alone.decode_slope, f), rtol=1e-13)
        assert wb.footprint.kv_cache_bytes[i] == pytest.approx(alone.footprint.kv_cache_bytes, rel=1e-13)
        assert wb.footprint.activation_bytes[i] == pytest.approx(alone.footprint.activation_bytes, rel=1e-13)


def test_a_decode_filling_one_limit_is_priced_with_the_others_and_two_limits_alone():
    """A sliding window, a sparse attention's top-k or a KV budget: many workloads priced together
    (their decode pieces split at each one's own step); a model with a sliding window under a KV
    budget as well fills two limits, priced one workload at a time."""
    many = dict(batch=np.arange(1, 9), prompt_len=np.arange(1, 9) * 700, gen_len=900)
    for extra in ({"model": "mistral-7b"}, {"model": "deepseek-v3.2", "devices": 8},
                  {"model": "llama-2-7b", "kv_budget": 1024}):
        plan = E.prepare({"hardware": "b200", **extra, **many})
        assert [type(g.tables) for g in plan.groups] == [E.WorkloadBatch], extra
    plan = E.prepare({"hardware": "b200", "model": "mistral-7b", "kv_budget": 1024, **many})
    assert {type(g.tables) for g in plan.groups} == {E.WorkloadTables}


def test_too_long_workloads_among_many_say_their_own_lengths():
    ev = evaluate({"hardware": "h100-sxm", "model": "llama-2-7b", "prompt_len": [3968, 4096, 100, 4000],
                   "gen_len": [128, 128, 16, 200], "batch": [1, 2, 3, 4]})
    assert list(ev.feasible) == [True, False, True, False]
    assert "4096 + gen_len 128 = 4224 tokens" in ev.reason_text(1)
    assert "4000 + gen_len 200 = 4200 tokens" in ev.reason_text(3)


def test_scenario_of_many_is_checked():
    with pytest.raises(DseError, match="give all as arrays"):
        Scenario(batch=np.array([1, 2]), prompt_len=5, gen_len=np.array([1, 2]))
    with pytest.raises(DseError, match="prompt-len must be positive integers"):
        Scenario(batch=np.array([1, 2]), prompt_len=np.array([5, 0]), gen_len=np.array([1, 2]))
    sc = Scenario(batch=np.array([1, 5, 9]), prompt_len=np.array([3, 3, 3]), gen_len=np.array([2, 2, 2]), ep=2, pp=2)
    assert sc.many and list(sc.group_batch) == [1, 3, 5] and list(sc.micro_batches) == [1, 2, 2]
    assert list(sc.micro_batch) == [1, 2, 3] and list(sc.take(slice(1, 2)).batch) == [5]
