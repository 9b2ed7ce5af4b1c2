"""Energy of a disaggregated engine under load (dse/system/served.py ``pooled_shares``,
``kv_transfer_j``): its two pools' dynamic energy and the KV transfers, worked out by hand from
static batches of the same hardware (the closed-form path of dse/system/pricing.py) and its
steady state's running batch and request rate, plus the floor over both pools' devices."""
import pytest

from dse.system.evaluator import evaluate
from hwmodels.energy import LEVELS, load_technology

pytestmark = pytest.mark.usefixtures("fixed_calibration")

COMMON = {"hardware": "h100-sxm", "model": "llama-3.1-8b", "prompt_len": 512, "static_power_w": 0.0}
GEN = 128
KV_TOKEN_BYTES = 32 * 2 * 8 * 128 * 2           # Llama-3.1-8B: layers x (K, V) x KV heads x head dim x fp16


def _static_j(batch: int, gen: int) -> float:
    """Dynamic J of a static batch (no floor): energy per token x its output tokens."""
    ev = evaluate({**COMMON, "batch": batch, "gen_len": gen})
    return float(ev["energy_per_token_j"][0]) * batch * gen


def test_a_disaggregated_point_is_its_pools_and_transfers_by_hand():
    ev = evaluate({**COMMON, "gen_len": GEN, "serving": "continuous", "request_rate": 2.0, "disaggregate": "1:1"})
    rps, b = float(ev["requests_per_s"][0]), float(ev["running_batch"][0])
    # a prompt alone on a prefill engine: a static batch of one that stops at its first token
    prompt_j = _static_j(1, 1)
    # a decode iteration of b sequences at the mean context (prompt + gen / 2): affine in b, from the
    # decode steps of static batches of one and two ((gen - 1) steps over that mean context)
    step = {n: (_static_j(n, GEN) - _static_j(n, 1)) / (GEN - 1) for n in (1, 2)}
    decode_j = step[1] + (b - 1) * (step[2] - step[1])
    iterations = rps * (GEN - 1) / b                # b = (rate per engine) x (gen - 1) x T(b)
    bit_j = sum(load_technology().profile("gh200-hopper").bit_j[lv] for lv in LEVELS)
    kv_j = 2 * 8 * KV_TOKEN_BYTES * 512 * bit_j     # read at one end, written at the other
    watts = rps * prompt_j + iterations * decode_j + rps * kv_j
    assert float(ev["power_w"][0]) == pytest.approx(watts, rel=1e-4)
    assert float(ev["energy_per_token_j"][0]) == pytest.approx(watts / (rps * GEN), rel=1e-4)
    # the floor: every device of both pools, all the time
    floored = evaluate({**COMMON, "static_power_w": 50.0, "gen_len": GEN, "serving": "continuous",
                        "request_rate": 2.0, "disaggregate": "1:1"})
    assert float(floored["power_w"][0]) - float(ev["power_w"][0]) == pytest.approx(2 * 50.0, rel=1e-6)


def test_disaggregating_at_low_load_costs_energy_every_decode_engine_reads_the_weights():
    one = evaluate({**COMMON, "gen_len": GEN, "serving": "continuous", "request_rate": 2.0})
    pooled = evaluate({**COMMON, "gen_len": GEN, "serving": "continuous", "request_rate": 2.0, "disaggregate": "1:3"})
    assert float(pooled["energy_per_token_j"][0]) > 1.5 * float(one["energy_per_token_j"][0])
