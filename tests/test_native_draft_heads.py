"""Native draft heads as speculative-decoding drafts (issue 45): ``mtp:N`` (DeepSeek-V3's
multi-token-prediction modules, DeepSeek-AI, "DeepSeek-V3 Technical Report", arXiv:2412.19437,
sec. 2.2) and ``eagle`` (Li et al., "EAGLE: Speculative Sampling Requires Rethinking Feature
Uncertainty", ICML 2024, sec. 4), with acceptance by depth. Closed forms: E = 1 + sum_d prod_{j<=d}
a_j tokens a round; a memory-bound batch-1 TPOT = (target weights + g x one head pass's bytes) /
bandwidth / E; the published 685 B of DeepSeek-V3's checkpoint = 671 B main model + its MTP module."""
import pytest

from basis.errors import DseError
from dse import evaluate
from dse.system.techniques import parse_draft
from workloads.footprint import parameter_count
from workloads.model import draft_head_model, load_model
from workloads.techniques import tokens_per_target_step

BASE = {"model": "llama-2-7b", "hardware": "h100-sxm", "prompt_len": 512, "gen_len": 129}


@pytest.mark.parametrize("rates, g, expected", [((0.9, 0.8, 0.5), 3, 1 + 0.9 + 0.72 + 0.36),
                                                ((0.85,), 1, 1.85), ((0.9, 0.0, 1.0), 3, 1.9),
                                                ((0.7, 0.7, 0.7, 0.7), 4, (1 - 0.7 ** 5) / 0.3)])
def test_tokens_per_step_by_depth(rates, g, expected):
    # expected tokens a round: 1 + sum_{d=1..g} prod_{j<=d} a_j; equal rates: Leviathan et al.'s Eq. 1
    assert tokens_per_target_step(rates, g) == pytest.approx(expected, rel=1e-12)


def test_mtp_acceptance_by_depth_reaches_the_evaluation():
    ev = evaluate({"model": "deepseek-v3", "hardware": "h200", "tp": 8, "weights": "fp8", "kv": "fp8",
                   "prompt_len": 1024, "gen_len": 65, "spec_draft": "mtp:3@0.9,0.8,0.5", "spec_tokens": 3})
    assert ev["tokens_per_target_step"][0] == pytest.approx(1 + 0.9 + 0.72 + 0.36, rel=1e-12)


def test_deepseek_v3_checkpoint_is_main_model_plus_its_mtp_module():
    # https://huggingface.co/deepseek-ai/DeepSeek-V3 (README): "685B ... 671B of the Main Model weights and
    # 14B of the Multi-Token Prediction (MTP) Module weights"; the checkpoint's MTP layer stores its own copy
    # of the embedding and output head, which serving shares with the main model (our head counts neither)
    m = load_model("deepseek-v3")
    head = draft_head_model(m, "mtp")
    shared = 2 * m.vocab_size * m.hidden_size
    assert parameter_count(m) + parameter_count(head) + shared == pytest.approx(685e9, rel=0.01)
    assert parameter_count(head) + shared == pytest.approx(14e9, rel=0.05)      # "14B", rounded


def test_mtp_weights_and_kv_count_in_the_footprint():
    cols = {"model": "deepseek-v3", "hardware": "h200", "tp": 8, "weights": "fp8", "kv": "fp8",
            "prompt_len": 2048, "gen_len": 65, "batch": 4}
    plain = evaluate(cols)
    mtp = evaluate({**cols, "spec_draft": "mtp:1", "spec_tokens": 1, "spec_acceptance": 0.85})
    head = draft_head_model(load_model("deepseek-v3"), "mtp")
    # its one block's weights (experts and MLP split over tp 8, MLA down-projections replicated) in fp8
    assert mtp["weights_bytes"][0] - plain["weights_bytes"][0] == pytest.approx(parameter_count(head, tp=8), rel=1e-9)
    # its own KV: one MLA layer's latent (512 + 64 elements) per token held, fp8
    assert mtp["kv_cache_bytes"][0] - plain["kv_cache_bytes"][0] == pytest.approx(4 * (2048 + 65) * 576, rel=0.01)


@pytest.mark.parametrize("g, a", [(4, 0.7), (2, 0.8)])
def test_eagle_batch1_tpot_is_target_plus_g_head_passes_over_expected_tokens(g, a):
    # memory-bound batch 1: a round reads the target's weights once (verifying g + 1 tokens) and, g times,
    # the EAGLE head's: its FC (2h x h), one decoder layer and the shared LM head (h x V), all in fp16;
    # its KV reads (under 3 % at 512 tokens) the only other traffic
    ev = evaluate({**BASE, "spec_draft": "eagle", "spec_tokens": g, "spec_acceptance": a}, ideal=True)
    m = load_model("llama-2-7b")
    h, v, inter = 4096, 32000, 11008
    layer = 4 * h * h + 3 * h * inter + 2 * h
    head_pass = (2 * h * h + layer + h + h * v) * 2
    closed = (parameter_count(m) * 2 + g * head_pass) / 3.35e12 / tokens_per_target_step(a, g)
    assert ev["tpot_s"][0] == pytest.approx(closed, rel=0.04)
    assert ev["weights_bytes"][0] == pytest.approx((parameter_count(m) + 2 * h * h + layer + h) * 2)


def test_eagle_and_mtp_run_under_continuous_batching():
    # every running sequence gains E tokens an iteration (the same rule as a draft model's)
    served = {"model": "llama-3.1-8b", "hardware": "h100-sxm", "prompt_len": 1024, "gen_len": 256, "concurrency": 4}
    plain = evaluate(served)
    spec = evaluate({**served, "spec_draft": "eagle@0.8,0.6,0.4", "spec_tokens": 3})
    assert spec.feasible[0] and spec["tokens_per_target_step"][0] == pytest.approx(1 + 0.8 + 0.48 + 0.192)
    assert spec["tpot_s"][0] < plain["tpot_s"][0]
    v3 = {"model": "deepseek-v3", "hardware": "h200", "tp": 8, "weights": "fp8", "kv": "fp8", "prompt_len": 1024,
          "gen_len": 128, "concurrency": 2}
    mtp = evaluate({**v3, "spec_draft": "mtp:1@0.85", "spec_tokens": 1})
    assert mtp.feasible[0] and mtp["tokens_per_target_step"][0] == pytest.approx(1.85)
    assert mtp["tpot_s"][0] < evaluate(v3)["tpot_s"][0]


@pytest.mark.parametrize("text, said", [("mtp:0", "from 1"), ("mtp:x", "from 1"), ("mtp:2@0.9", "give 2"),
                                        ("eagle@1.5", "from 0 to 1"), ("eagle@", "from 0 to 1"),
                                        ("mtp:1@a", "from 0 to 1")])
def test_bad_native_draft_is_one_line(text, said):
    with pytest.raises(DseError) as e:
        parse_draft(text)
    assert str(e.value).startswith("spec_draft: ") and said in str(e.value) and "\n" not in str(e.value)


def _refusal(cols) -> str:
    """The one line a point is refused with: raised for the columns, or the point's reason."""
    try:
        ev = evaluate(cols)
    except DseError as e:
        return str(e)
    assert not ev.feasible[0]
    return ev.reason_text(0)


def test_mtp_needs_the_models_modules_and_spec_tokens_its_depth():
    assert parse_draft("MTP:2@0.9,0.8").by_depth == (0.9, 0.8) and parse_draft("eagle").kind == "eagle"
    assert "ships none" in _refusal({**BASE, "spec_draft": "mtp:1", "spec_tokens": 1})
    assert "at least as many" in _refusal({"model": "deepseek-v3", "hardware": "h200", "tp": 8, "prompt_len": 64,
                                           "gen_len": 8, "spec_draft": "mtp:2", "spec_tokens": 1})
    assert "one a drafted token" in _refusal({**BASE, "spec_draft": "eagle@0.8", "spec_tokens": 2})


def test_eagle_head_is_one_dense_layer_of_the_targets_shape():
    for name in ("deepseek-v3", "mixtral-8x7b", "llama-3.1-8b", "qwen3.5-27b"):
        m = load_model(name)
        e = draft_head_model(m, "eagle")
        assert e.num_layers == 1 and not e.is_moe and e.hidden_size == m.hidden_size and e.draft_head == "eagle"
        assert not e.is_hybrid and e.num_attention_layers == 1       # a hybrid's head: one attention layer
    assert draft_head_model(load_model("deepseek-v3"), "mtp").is_moe
