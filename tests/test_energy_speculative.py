"""Energy of a speculative engine under load (dse/system/served.py ``_serving_energy``): a round is
the target's iteration verifying g + 1 tokens of each decoding sequence and the draft's g decode
steps, once a TPOT x E, and each prompt the energy it adds to a round (the target's and the draft's
prefill); worked out by hand from static batches of each model on the same hardware."""
import pytest

from dse.system.evaluator import evaluate
from hwmodels.energy import LEVELS, load_technology

pytestmark = pytest.mark.usefixtures("fixed_calibration")

HW = {"hardware": "h100-sxm", "prompt_len": 512, "static_power_w": 0.0}
GEN, DRAFTED = 128, 4
SPEC = {"spec_draft": "llama-3.2-1b-instruct", "spec_tokens": DRAFTED}
KV_TOKEN_BYTES = 32 * 2 * 8 * 128 * 2           # Llama-3.1-8B: layers x (K, V) x KV heads x head dim x fp16


def _static_j(model: str, batch: int, gen: int) -> float:
    """Dynamic J of a static batch (no floor): energy per token x its output tokens."""
    ev = evaluate({**HW, "model": model, "batch": batch, "gen_len": gen})
    return float(ev["energy_per_token_j"][0]) * batch * gen


def _decode_step_j(model: str):
    """J of a decode step of n sequences at the mean context (prompt + gen / 2), affine in n (from
    the decode steps of static batches of one and two), and a prompt's J over the weights' read."""
    one, two = ((_static_j(model, n, GEN) - _static_j(model, n, 1)) / (GEN - 1) for n in (1, 2))
    weights = 2 * one - two                        # the step of no sequence: the weights read
    return (lambda n: weights + n * (two - one)), _static_j(model, 1, 1) - weights


def test_a_speculative_round_is_the_targets_verification_and_the_drafts_steps_by_hand():
    # acceptance 0: a round yields one token (E = 1), so its rounds are the engine's TPOTs
    ev = evaluate({**HW, **SPEC, "model": "llama-3.1-8b", "gen_len": GEN, "serving": "continuous",
                   "concurrency": 1, "spec_acceptance": 0.0})
    assert float(ev["tokens_per_target_step"][0]) == 1.0 and float(ev["running_batch"][0]) == 1.0
    target, target_prompt = _decode_step_j("llama-3.1-8b")
    draft, draft_prompt = _decode_step_j("llama-3.2-1b-instruct")
    rps, tpot = float(ev["requests_per_s"][0]), float(ev["tpot_s"][0])
    # verifying g + 1 tokens of one sequence is a decode step of g + 1 sequences that reads the
    # sequence's KV cache (prompt + gen / 2 tokens) once, not g + 1 times
    bit_j = sum(load_technology().profile("gh200-hopper").bit_j[lv] for lv in LEVELS)
    kv_read_j = 8 * KV_TOKEN_BYTES * (512 + GEN / 2) * bit_j
    verify = target(DRAFTED + 1) - DRAFTED * kv_read_j
    watts = (verify + DRAFTED * draft(1)) / tpot + rps * (target_prompt + draft_prompt)
    assert float(ev["power_w"][0]) == pytest.approx(watts, rel=2e-3)


def test_accepted_drafts_save_energy_a_token_and_rejected_ones_cost_it():
    common = {**HW, "model": "llama-3.1-8b", "gen_len": GEN, "serving": "continuous", "concurrency": 1}
    plain = float(evaluate(common)["energy_per_token_j"][0])
    good = float(evaluate({**common, **SPEC, "spec_acceptance": 0.7})["energy_per_token_j"][0])
    bad = float(evaluate({**common, **SPEC, "spec_acceptance": 0.0})["energy_per_token_j"][0])
    assert good < plain < bad


def test_a_speculative_disaggregated_engine_is_its_rounds_on_pools_by_hand():
    """1:1 pools at 2 requests/s, acceptance 0 (a round one token): the decode engines' rounds
    (verifying g + 1 tokens of each of b sequences, the draft's g steps) as many a second as the
    requests' decode steps ask over b, each prompt the round its prefill engine runs for it (the
    target's and the draft's prefill; the draft's g - 1 steps of no sequence cost nothing), and the
    KV cache read at one end and written at the other."""
    ev = evaluate({**HW, **SPEC, "model": "llama-3.1-8b", "gen_len": GEN, "serving": "continuous",
                   "request_rate": 2.0, "disaggregate": "1:1", "spec_acceptance": 0.0})
    rps, b = float(ev["requests_per_s"][0]), float(ev["running_batch"][0])
    target, target_prompt = _decode_step_j("llama-3.1-8b")
    draft, draft_prompt = _decode_step_j("llama-3.2-1b-instruct")
    bit_j = sum(load_technology().profile("gh200-hopper").bit_j[lv] for lv in LEVELS)
    kv_read_j = 8 * KV_TOKEN_BYTES * (512 + GEN / 2) * bit_j
    round_j = target(b * (DRAFTED + 1)) - b * DRAFTED * kv_read_j + DRAFTED * draft(b)
    prompt_j = target(0) + target_prompt + draft(0) + draft_prompt
    kv_j = 2 * 8 * KV_TOKEN_BYTES * 512 * bit_j
    watts = rps * (GEN - 1) / b * round_j + rps * (prompt_j + kv_j)
    assert float(ev["power_w"][0]) == pytest.approx(watts, rel=2e-3)
