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


def _decode_step_j(hardware: str, b: float, tp: int = 1) -> float:
    """Dynamic J of a decode iteration of ``b`` sequences at the mean context on ``hardware`` at
    ``tp``: affine in b, from the decode steps of static batches of one and two."""
    def run(batch, gen):
        ev = evaluate({**COMMON, "hardware": hardware, "tp": tp, "devices": tp, "batch": batch, "gen_len": gen})
        return float(ev["energy_per_token_j"][0]) * batch * gen
    step = {n: (run(n, GEN) - run(n, 1)) / (GEN - 1) for n in (1, 2)}
    return step[1] + (b - 1) * (step[2] - step[1])


@pytest.mark.parametrize("extra, decode_hw, tp", [({"decode_hardware": "a100-80gb", "pd_link": "ib-ndr"}, "a100-80gb", 1),
                                                  ({"disaggregate": "1:2", "decode_tp": 2}, "h100-sxm", 2)])
def test_a_decode_pool_of_its_own_is_priced_on_its_hardware_and_layout_by_hand(extra, decode_hw, tp):
    """H100 prefill engines with A100 decode engines (Splitwise's pairing) over InfiniBand NDR, and
    H100 decode engines at TP2: the prompt on the prefill engine, the decode iterations at the decode
    pool's running batch on its own hardware and layout, the KV cache read at the H100's J/bit and
    written at the receiver's, and each pool's devices at their own shipped floor (0.24 x TDP: H100
    168 W, A100 96 W; a ``static_power_w`` given is the point's hardware's, the prefill pool's)."""
    point = {k: v for k, v in COMMON.items() if k != "static_power_w"}
    ev = evaluate({**point, "gen_len": GEN, "serving": "continuous", "request_rate": 2.0, "disaggregate": "1:1", **extra})
    rps, b = float(ev["requests_per_s"][0]), float(ev["running_batch"][0])
    prompt_j = _static_j(1, 1)
    iterations = rps * (GEN - 1) / b
    tech = load_technology()
    bit = {hw: sum(tech.profile(p).bit_j[lv] for lv in LEVELS)
           for hw, p in (("h100-sxm", "gh200-hopper"), ("a100-80gb", "a100-sxm4-40gb"))}
    kv_j = 8 * KV_TOKEN_BYTES * 512 * (bit["h100-sxm"] + bit[decode_hw])
    floors = 0.24 * 700 * (1 + tp) if decode_hw == "h100-sxm" else 0.24 * 700 + 0.24 * 400
    watts = rps * prompt_j + iterations * _decode_step_j(decode_hw, b, tp) + rps * kv_j + floors
    assert float(ev["power_w"][0]) == pytest.approx(watts, rel=1e-3)
    assert float(ev["energy_per_token_j"][0]) == pytest.approx(watts / (rps * GEN), rel=1e-3)
