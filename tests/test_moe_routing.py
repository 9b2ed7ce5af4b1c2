"""MoE routing physics (``workloads.routing``, issue 44): expert load imbalance from a routing
distribution, redundant experts (EPLB), a capacity factor, dispatch/combine sized by the routed tokens.
Each figure is checked against an expectation computed here on its own: the results before routing
existed (pinned from main at 23f50c5), Zipf closed forms over contiguous placement, a placement worked
by hand, and GShard's capacity rule."""
from __future__ import annotations

import math

import numpy as np
import pytest

from basis.errors import DseError
from dse.study.cli import main
from dse.system.evaluator import evaluate
from workloads import optable
from workloads.model import load_model
from workloads.routing import Routing, expert_load, load_histogram, selection_probabilities, zipf_shares
from workloads.scenario import Scenario
from workloads.techniques import Techniques

FP8 = {"weights": "fp8", "activations": "fp8", "kv": "fp8", "prompt_len": 1000, "gen_len": 200, "batch": 16}

#: (point, TPOT s, TTFT s) of uniform routing (each point evaluated alone, as here): pinned on main at 23f50c5,
#: before routing existed; re-pinned on h-tbo2 when the expert combine went to BF16 under FP8 activations
#: and MLA's absorbed decode read its latent once (workloads/optable.py), and again when the residual
#: stream's norms and adds went to 16 bits under FP8 activations
BEFORE = (
    ({"model": "mixtral-8x7b", "hardware": "h100-sxm", "ep": 2, "tp": 1}, 0.017416770117009872, 0.43186947823707966),
    ({"model": "deepseek-v3", "hardware": "h200", "ep": 8, "tp": 1}, 0.027194439644306845, 0.36434878148122046),
    ({"model": "qwen3-30b-a3b", "hardware": "h100-sxm", "ep": 4, "tp": 1}, 0.007388598537419636, 0.07859952797500473),
)


def _zipf_contiguous(E: int, ep: int, s: float) -> float:
    """Max rank load over mean for Zipf popularity i^-s over expert ids, E/ep contiguous experts a rank
    (the hottest rank holds ids 1 .. E/ep): ep x H(E/ep, s) / H(E, s)."""
    def h(n):
        return math.fsum(i ** -s for i in range(1, n + 1))
    return ep * h(E // ep) / h(E)


@pytest.mark.parametrize("point,tpot,ttft", BEFORE)
def test_skew_zero_is_todays_uniform_expectation_bit_for_bit(point, tpot, ttft):
    for routing in ({}, {"moe_skew": 0.0, "redundant_experts": 0, "capacity_factor": 0.0},
                    {"moe_skew": 0.0, "capacity_factor": 1.0}):       # capacity 1 drops nothing when uniform
        ev = evaluate({**point, **FP8, **routing})
        assert ev["tpot_s"][0] == tpot and ev["ttft_s"][0] == ttft
        assert ev["moe_imbalance"][0] == 1.0 and ev["moe_dropped_fraction"][0] == 0.0


@pytest.mark.parametrize("model,ep,skews", [("mixtral-8x7b", 2, (0.25, 0.5, 1.0)), ("qwen3-30b-a3b", 4, (0.2, 0.5))])
def test_imbalance_is_the_zipf_closed_form_over_contiguous_experts(model, ep, skews):
    m = load_model(model)
    for s in skews:
        assert m.experts_per_token * zipf_shares(m.num_experts, s)[0] < 1     # no expert saturates here
        ev = evaluate({"model": model, "hardware": "h100-sxm", "ep": ep, "tp": 1, **FP8, "moe_skew": s})
        assert ev["moe_imbalance"][0] == pytest.approx(_zipf_contiguous(m.num_experts, ep, s), rel=1e-12)
        assert ev["moe_dropped_fraction"][0] == 0.0


def _expert_rows(skew: float, **more) -> dict:
    """Per-operator prefill rows of Mixtral EP 2 on the ideal roofline, a prefill long enough that every
    expert is touched and its matmuls are compute-bound."""
    ev = evaluate({"model": "mixtral-8x7b", "hardware": "h100-sxm", "ep": 2, "tp": 1, "batch": 8, "prompt_len": 4096,
                   "gen_len": 2, "weights": "fp8", "activations": "fp8", "kv": "fp8", "moe_skew": skew, **more},
                  ideal=True, explain=[0])
    return {r["name"]: r for r in ev.explained[0]["prefill"]}, ev


def test_expert_step_time_grows_with_skew_as_max_over_mean_load():
    base, _ = _expert_rows(0.0)
    for s in (0.3, 0.7, 1.0):
        rows, ev = _expert_rows(s)
        expected = _zipf_contiguous(8, 2, s)
        for name in ("expert_gate_proj", "expert_up_proj", "expert_down_proj"):
            assert rows[name]["bound"] == "compute"
            assert rows[name]["time_s"] / base[name]["time_s"] == pytest.approx(expected, rel=1e-9), name
        # the shared layers do not wait for the busiest rank
        assert rows["q_proj"]["time_s"] == base["q_proj"]["time_s"]
        # the busiest rank receives (dispatch) and sends back (combine) its tokens: bytes x imbalance
        for name in ("moe_dispatch", "moe_combine"):
            assert rows[name]["time_s"] > base[name]["time_s"]
        assert ev["ttft_s"][0] > evaluate({"model": "mixtral-8x7b", "hardware": "h100-sxm", "ep": 2, "tp": 1,
                                            "batch": 8, "prompt_len": 4096, "gen_len": 2, "weights": "fp8",
                                            "activations": "fp8", "kv": "fp8"}, ideal=True)["ttft_s"][0]


def test_dispatch_is_sized_by_the_tokens_actually_routed():
    m = load_model("mixtral-8x7b")
    T, ep, tp = 64, 2, 1
    h, k = m.hidden_size, m.experts_per_token
    for routing in (Routing(), Routing(skew=0.8), Routing(skew=0.8, capacity=1.1)):
        sc = Scenario.make(batch=1, prompt_len=T, ep=ep, tp=tp, techniques=Techniques(routing=routing))
        ops = {o.name: o for o in optable.prefill(m, sc).operators}
        shares = zipf_shares(8, routing.skew)                 # k p_i < 1 at 0.8 for 8 experts and top-2
        kept = np.minimum(shares, routing.capacity / 8) if routing.capacity else shares
        busiest = max(kept[:4].sum(), kept[4:].sum())         # contiguous: experts 0-3 on rank 0
        expected = T * ep * k * busiest * h * (ep - 1) / ep / tp
        assert ops["moe_dispatch"].p2p == pytest.approx(expected, rel=1e-12)
        assert ops["moe_combine"].p2p == ops["moe_dispatch"].p2p
        assert ops["expert_up_proj"].ops == pytest.approx(2 * T * ep * k * busiest * h * m.moe_intermediate_size,
                                                          rel=1e-12)


def test_redundant_experts_bring_the_imbalance_back_toward_one():
    for s in (0.5, 1.0):
        seen = [evaluate({"model": "deepseek-v3", "hardware": "h200", "ep": 8, "tp": 1, **FP8, "moe_skew": s,
                          "redundant_experts": r})["moe_imbalance"][0] for r in (0, 8, 16, 32)]
        if s == 0.5:                                           # (at s = 1 the hottest experts saturate)
            assert seen[0] == pytest.approx(_zipf_contiguous(256, 8, s), rel=1e-12)
        # balanced within 1e-4 once replicas exist (the greedy packing is not monotone below that)
        assert seen[0] > 2 and all(a >= b - 1e-4 for a, b in zip(seen, seen[1:])) and seen[-1] < 1.001


def test_eplb_placement_worked_by_hand():
    # shares .6 .2 .1 .1 over 2 ranks, top-1: contiguous {0,1} | {2,3}: 0.8 / 0.5 mean = 1.6
    hist = Routing(histogram=((6.0, 2.0, 1.0, 1.0),), source="hand")
    assert expert_load(hist, 4, 1, 2).imbalance == pytest.approx(1.6)
    # 2 replicas: expert 0 gets both (0.6/2 = 0.3 > 0.2, then 0.3 > 0.2: 0.6/3 = 0.2 each); six slots of
    # 0.2 0.2 0.2 0.2 0.1 0.1 packed heaviest first onto the lighter rank, three a rank: 0.5 | 0.5
    two = Routing(redundant=2, histogram=((6.0, 2.0, 1.0, 1.0),), source="hand")
    assert expert_load(two, 4, 1, 2).imbalance == pytest.approx(1.0)
    with pytest.raises(DseError, match=r"expert parallelism 2 does not divide num_experts \(4\) \+ redundant_experts \(1\)"):
        expert_load(Routing(redundant=1), 4, 1, 2)


def test_capacity_factor_drops_the_closed_form_share():
    # GShard: an expert takes at most c x (mean tokens per expert); expected share dropped
    # sum_i max(0, p_i - c / E) (no expert saturating: k p_i < 1)
    for s, c in ((0.8, 1.0), (1.0, 1.25), (0.5, 0.9)):
        p = np.array([i ** -s for i in range(1, 9)])
        p /= p.sum()
        expected = sum(max(0.0, x - c / 8) for x in p)
        ev = evaluate({"model": "mixtral-8x7b", "hardware": "h100-sxm", "ep": 2, "tp": 1, **FP8, "moe_skew": s,
                       "capacity_factor": c})
        assert ev["moe_dropped_fraction"][0] == pytest.approx(expected, rel=1e-12)
        kept = np.minimum(p, c / 8)
        assert ev["moe_imbalance"][0] == pytest.approx(2 * max(kept[:4].sum(), kept[4:].sum()) / kept.sum(), rel=1e-12)
    # uniform routing under a capacity below 1 drops 1 - c of the tokens
    ev = evaluate({"model": "mixtral-8x7b", "hardware": "h100-sxm", "ep": 2, "tp": 1, **FP8, "capacity_factor": 0.75})
    assert ev["moe_dropped_fraction"][0] == pytest.approx(0.25) and ev["moe_imbalance"][0] == pytest.approx(1.0)


def test_selection_probabilities_saturate_at_one():
    # Zipf 2 over 8 experts, top-2: k p_1 = 1.3 > 1, so expert 0 is picked by every token and the rest
    # share the other pick in proportion: pi = (1, c p_2, ...) with c = 1 / sum_{i>=2} p_i
    p = zipf_shares(8, 2.0)
    pi = selection_probabilities(p[None, :], 2)[0]
    assert pi[0] == 1.0 and pi.sum() == pytest.approx(2.0)
    assert pi[1:] == pytest.approx(p[1:] / p[1:].sum())


def test_histogram_file_sets_the_popularity(tmp_path):
    counts = [[40, 30, 10, 30, 25, 25, 20, 20], [10, 10, 10, 10, 40, 40, 40, 40]]
    path = tmp_path / "experts.csv"
    path.write_text("layer,expert,count\n" + "".join(f"{layer},{e},{c}\n" for layer, row in enumerate(counts)
                                                     for e, c in enumerate(row)))
    assert load_histogram(str(path)) == tuple(tuple(float(c) for c in row) for row in counts)
    ev = evaluate({"model": "mixtral-8x7b", "hardware": "h100-sxm", "ep": 2, "tp": 1, **FP8,
                   "expert_histogram": str(path)})
    # per layer: the busiest of experts 0-3 and 4-7 over the mean rank; the step waits layer by layer,
    # so the expert time follows the mean over layers of the busiest rank's share
    busiest = np.mean([max(sum(r[:4]), sum(r[4:])) / sum(r) for r in counts])
    assert ev["moe_imbalance"][0] == pytest.approx(2 * busiest, rel=1e-12)
    one = tmp_path / "one.csv"
    one.write_text("expert,count\n" + "".join(f"{e},{c}\n" for e, c in enumerate(counts[0])))
    ev = evaluate({"model": "mixtral-8x7b", "hardware": "h100-sxm", "ep": 2, "tp": 1, **FP8, "expert_histogram": str(one)})
    assert ev["moe_imbalance"][0] == pytest.approx(2 * 110 / 200, rel=1e-12)


@pytest.mark.parametrize("text,words", [
    (None, "cannot read it"),
    ("foo,bar\n1,2\n", "no 'expert' column"),
    ("expert,count\n0,1\n1,x\n", "line 3: 'count' must be a finite number >= 0"),
    ("expert,count\n0,1\n0,2\n", "expert 0 of layer 0 given twice"),
    ("expert,count\n0,1\n2,2\n", "experts must be numbered 0 .. 1"),
    ("expert,count\n0,0\n1,0\n", "the counts sum to 0"),
])
def test_histogram_errors_name_the_file_in_one_line(tmp_path, text, words):
    path = tmp_path / "h.csv"
    if text is not None:
        path.write_text(text)
    with pytest.raises(DseError) as e:
        load_histogram(str(path))
    assert str(path) in str(e.value) and words in str(e.value) and "\n" not in str(e.value)


def test_histogram_of_another_model_is_refused_naming_both(tmp_path):
    path = tmp_path / "four.csv"
    path.write_text("expert,count\n0,1\n1,2\n2,3\n3,4\n")
    ev = evaluate({"model": "mixtral-8x7b", "hardware": "h100-sxm", "ep": 2, "tp": 1, **FP8,
                   "expert_histogram": str(path)})
    assert not ev["feasible"][0] and "4 experts a layer" in ev.detail(0) and "mixtral-8x7b" in ev.detail(0)


@pytest.mark.parametrize("flag", ["--moe-skew", "--redundant-experts", "--capacity-factor"])
@pytest.mark.parametrize("value", ["-1", "nan", "inf", "abc"])
def test_flags_refuse_bad_values_in_one_line(capsys, flag, value):
    rc = main(["analyze", "--model", "mixtral-8x7b", "--hardware", "h200", flag, value])
    err = capsys.readouterr().err
    assert rc == 2 and flag in err and "expected" in err and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("flag", ["--moe-skew", "--redundant-experts", "--capacity-factor"])
def test_flags_take_zero(capsys, flag):
    assert main(["analyze", "--model", "mixtral-8x7b", "--hardware", "h200", flag, "0"]) == 0
    assert "moe_imbalance" in capsys.readouterr().out


def test_skew_and_histogram_together_are_refused(capsys, tmp_path):
    path = tmp_path / "h.csv"
    path.write_text("expert,count\n" + "".join(f"{e},1\n" for e in range(8)))
    rc = main(["analyze", "--model", "mixtral-8x7b", "--hardware", "h200", "--moe-skew", "1",
               "--expert-histogram", str(path)])
    err = capsys.readouterr().err
    assert rc == 2 and "--moe-skew and --expert-histogram" in err


def test_redundant_experts_are_held_in_memory():
    m = load_model("deepseek-v3")
    a, b = (evaluate({"model": "deepseek-v3", "hardware": "h200", "ep": 8, "tp": 1, **FP8, "redundant_experts": r})
            for r in (0, 32))
    h, w = m.hidden_size, m.moe_intermediate_size
    extra = m.num_moe_layers * 32 / 8 * 3 * h * w            # 4 more experts a rank, 3 matrices, 1 byte each
    assert b["weights_bytes"][0] - a["weights_bytes"][0] == pytest.approx(extra, rel=1e-12)


def test_a_sweep_over_routing_equals_each_point_alone():
    skew, redundant = [0.0, 0.5, 1.0, 0.5, 0.0], [0, 0, 32, 32, 32]
    point = {"model": "deepseek-v3", "hardware": "h200", "ep": 8, "tp": 1, **FP8}
    ev = evaluate({**point, "moe_skew": skew, "redundant_experts": redundant, "batch": [16, 64, 16, 64, 256]})
    for i, (s, r, b) in enumerate(zip(skew, redundant, [16, 64, 16, 64, 256])):
        one = evaluate({**point, "moe_skew": s, "redundant_experts": r, "batch": b})
        for k in ("tpot_s", "ttft_s", "moe_imbalance", "weights_bytes"):
            assert ev[k][i] == pytest.approx(one[k][0], rel=1e-12), (i, k)
