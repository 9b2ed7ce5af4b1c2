"""Native draft heads (issue 45): MTP modules (``spec_draft mtp:N``, DeepSeek-V3 report sec. 2.2) and EAGLE
heads (``spec_draft eagle``, Li et al., ICML 2024), with acceptance by depth, in static batches and under
continuous batching. Closed forms: a round yields 1 + sum_d prod_{j<=d} a_j tokens; a head holds one
transformer block of the target's shape plus its 2h -> h input projection and two input norms."""
from dataclasses import replace

import numpy as np
import pytest

from basis.errors import DseError
from dse import evaluate
from workloads import optable
from workloads.footprint import parameter_count
from workloads.model import load_model
from workloads.scenario import Scenario
from workloads.techniques import tokens_by_depth, tokens_per_target_step

V3 = "deepseek-v3"
BASE = {"model": V3, "hardware": "h200", "devices": 8, "tp": 8, "batch": 8, "prompt_len": 2048, "gen_len": 128,
        "weights": "fp8", "kv": "fp8", "activations": "fp8"}


@pytest.mark.parametrize("rates, expected", [((0.9,), 1.9), ((0.9, 0.8, 0.5), 1 + 0.9 + 0.72 + 0.36),
                                             ((1.0, 1.0), 3.0), ((0.0, 0.9), 1.0)])
def test_tokens_per_round_by_depth(rates, expected):
    assert tokens_by_depth(rates) == pytest.approx(expected)
    assert tokens_per_target_step(rates, len(rates)) == pytest.approx(expected)


@pytest.mark.parametrize("a, g", [(0.7, 1), (0.7, 4), (0.85, 3)])
def test_a_constant_rate_by_depth_is_the_geometric_closed_form(a, g):
    assert tokens_by_depth((a,) * g) == pytest.approx((1 - a ** (g + 1)) / (1 - a))


def test_mtp_module_weights_and_the_published_total():
    # DeepSeek-V3 (https://huggingface.co/deepseek-ai/DeepSeek-V3, README): 685 B = 671 B main model + 14 B
    # MTP module, the checkpoint's module holding its own copies of the embedding and output head
    m = load_model(V3)
    head = optable.native_draft_model(m, "mtp")
    h, v = m.hidden_size, m.vocab_size
    moe_layer = parameter_count(replace(m, num_layers=62)) - parameter_count(m)       # the module's block is MoE
    own = parameter_count(head) - 2 * v * h - h                                         # less shared embedding, head, norm
    assert own == pytest.approx(moe_layer + 2 * h * h + 2 * h)
    assert parameter_count(m) + own + 2 * v * h == pytest.approx(685e9, rel=0.01)


def test_head_weights_and_kv_count_in_the_footprint():
    m = load_model(V3)
    h = m.hidden_size
    no = evaluate(BASE)
    mtp = evaluate({**BASE, "spec_draft": "mtp:1", "spec_tokens": 1, "spec_acceptance": 0.8})
    per_device = (parameter_count(replace(m, num_layers=62), 8) - parameter_count(m, 8)) + 2 * h * h + 2 * h
    assert mtp["weights_bytes"][0] - no["weights_bytes"][0] == pytest.approx(per_device * 1.0)     # fp8
    # its one layer's latent cache beside the target's 61 layers
    assert mtp["kv_cache_bytes"][0] == pytest.approx(no["kv_cache_bytes"][0] * 62 / 61)


def test_eagle_head_is_one_dense_decoder_layer_sharing_the_lm_head():
    m = load_model("llama-3.1-8b")
    head = optable.native_draft_model(m, "eagle")
    h = m.hidden_size
    layer = parameter_count(replace(m, num_layers=33)) - parameter_count(m)
    assert parameter_count(head) - 2 * m.vocab_size * h - h == pytest.approx(layer + 2 * h * h + 2 * h)
    t = optable.decode_step(head, Scenario.make(batch=4, prompt_len=100, gen_len=8, flash_attention=True), 101,
                            50e6)
    ops = {o.name: o for o in t.operators}
    assert ops["draft_fc"].ops == 2 * 4 * 2 * h * h and ops["lm_head"].count == 1
    assert ops["attn_norm"].count == 1
    moe = optable.native_draft_model(load_model(V3), "eagle")
    assert not moe.is_moe and moe.num_layers == 1


@pytest.mark.parametrize("serving", [{}, {"concurrency": 32, "batch": None}])
def test_depth_acceptance_sets_the_tokens_a_round_static_and_served(serving):
    point = {k: v for k, v in {**BASE, **serving}.items() if v is not None}
    ev = evaluate({**point, "spec_draft": "mtp:3@0.85,0.7,0.5", "spec_tokens": 3})
    assert ev["tokens_per_target_step"][0] == pytest.approx(1 + 0.85 + 0.85 * 0.7 + 0.85 * 0.7 * 0.5)
    plain = evaluate(point)
    scalar = evaluate({**point, "spec_draft": "eagle", "spec_tokens": 3, "spec_acceptance": 0.7})
    assert scalar["tokens_per_target_step"][0] == pytest.approx((1 - 0.7 ** 4) / 0.3)
    assert ev["tpot_s"][0] < plain["tpot_s"][0] and scalar["tpot_s"][0] < plain["tpot_s"][0]


def test_a_perfect_head_of_no_cost_bound():
    # at acceptance 1 a round yields g + 1 tokens: TPOT is above (target step of g + 1 queries) / (g + 1)
    g = 2
    ev = evaluate({**BASE, "spec_draft": "mtp:2@1,1", "spec_tokens": g}, ideal=True)
    plain = evaluate(BASE, ideal=True)
    assert ev["tokens_per_target_step"][0] == pytest.approx(3.0)
    assert plain["tpot_s"][0] / 3 < ev["tpot_s"][0] < plain["tpot_s"][0]


@pytest.mark.parametrize("extra, said", [
    ({"spec_draft": "mtp:2", "spec_tokens": 3, "spec_acceptance": 0.8}, "spec_tokens"),
    ({"spec_draft": "mtp:2@0.9,0.8", "spec_tokens": 2, "spec_acceptance": 0.8}, "spec_acceptance"),
    ({"spec_draft": "eagle@0.9", "spec_tokens": 2}, "acceptance rates"),
    ({"spec_draft": "eagle:2", "spec_tokens": 2}, "eagle"),
    ({"spec_draft": "mtp:0", "spec_tokens": 1}, "mtp:N"),
    ({"spec_draft": "mtp:1@1.5", "spec_tokens": 1}, "from 0 to 1"),
])
def test_bad_native_draft_is_one_line(extra, said):
    with pytest.raises(DseError) as e:
        evaluate({**BASE, **extra})
    assert said in str(e.value) and "\n" not in str(e.value)


def test_mtp_of_a_model_without_mtp_modules_is_refused_naming_the_field():
    ev = evaluate({**BASE, "spec_draft": "mtp:1", "spec_tokens": 1, "spec_acceptance": 0.8, "model": "llama-3.1-8b",
                   "tp": 1, "devices": 1})
    assert not ev["feasible"][0] and "num_nextn_predict_layers" in ev.reason_text(0)


def test_mtp_of_a_sparse_attention_model_keeps_its_indexer():
    head = optable.native_draft_model(load_model("deepseek-v3.2"), "mtp")
    assert head.is_sparse_attention and head.is_moe and head.num_layers == 1
    assert np.isfinite(evaluate({**BASE, "model": "deepseek-v3.2", "spec_draft": "mtp:1", "spec_tokens": 1,
                                 "spec_acceptance": 0.8})["tpot_s"][0])
