"""Energy of a CPU layer split (dse/system/pricing.py ``cpu_energy_j``, ``run_energy``): each step's
per-layer work split between the device and the host CPU as ``run_time`` prices it, the device's
share at its J/op and J/bit, the CPU's at the CPU preset's. Energy is linear in the work, so the
dynamic energy of a run is affine in the layers moved, and one layer moved costs the difference of
that layer's work on the two chips."""
import numpy as np
import pytest

from dse.system.evaluator import evaluate
from hwmodels.power import power_of
from hwmodels.presets import load_device

pytestmark = pytest.mark.usefixtures("fixed_calibration")

RUN = {"hardware": "l40s", "host_cpu": "xeon-spr", "model": "llama-2-7b", "batch": 1, "prompt_len": 128,
       "gen_len": 32, "static_power_w": 0.0}


def _dynamic_j(cpu_layers):
    ev = evaluate({**RUN, "cpu_layers": cpu_layers})
    return np.asarray(ev["energy_per_token_j"], dtype=float) * 32


def test_a_split_run_is_affine_in_the_layers_moved_and_priced_on_both_chips():
    layers = np.array([0, 4, 8, 16])
    e = _dynamic_j(layers)
    assert np.all(np.isfinite(e))
    slope = (e[1] - e[0]) / 4
    assert e[2:] == pytest.approx(e[0] + slope * layers[2:], rel=1e-9)
    # one of Llama-2-7B's 32 layers moved: its weights (4 x 4096^2 + 3 x 4096 x 11008 parameters, fp16)
    # read once a step (the prefill and 31 decode steps) and 2 ops a parameter a token (128 + 31
    # tokens), at the Xeon's J/bit and bf16 J/op (AMX; fp16 work runs there) less the L40S's
    cpu, gpu = power_of(load_device("xeon-spr")), power_of(load_device("l40s"))
    params = 4 * 4096 ** 2 + 3 * 4096 * 11008
    by_hand = (cpu.bit_j - gpu.bit_j) * 8 * 2 * params * 32 + (cpu.op_j["bf16"] - gpu.op_j["fp16"]) * 2 * params * 159
    assert slope == pytest.approx(by_hand, rel=0.03)     # the rest: attention and KV traffic over 128-160 keys


def test_a_speculative_run_under_a_split_is_priced_by_the_same_rules():
    """Speculative decoding with layers on the CPU: each round's verifying target step is shared
    with the CPU as a plain decode step is, the draft (the target's first 4 layers) stays on the
    device. One layer moved costs its weights read once a target step (the prefill and 31 / E
    rounds) and 2 ops a parameter a token the target processes (128 prompt tokens and g + 1 a round)
    at the Xeon's figures less the L40S's; and it now slows the run, which it did not when the
    split was left out of a speculative run's time."""
    a, g = 0.7, 3
    spec = {"spec_draft": "self:4", "spec_tokens": g, "spec_acceptance": a}
    layers = np.array([0, 4, 8])
    ev = evaluate({**RUN, **spec, "cpu_layers": layers})
    e = np.asarray(ev["energy_per_token_j"], dtype=float) * 32
    assert np.all(np.isfinite(e)) and np.all(np.isfinite(np.asarray(ev["power_w"], dtype=float)))
    slope = (e[1] - e[0]) / 4
    assert e[2] == pytest.approx(e[0] + slope * 8, rel=1e-9)
    rounds = 31 / ((1 - a ** (g + 1)) / (1 - a))
    cpu, gpu = power_of(load_device("xeon-spr")), power_of(load_device("l40s"))
    params = 4 * 4096 ** 2 + 3 * 4096 * 11008
    by_hand = ((cpu.bit_j - gpu.bit_j) * 8 * 2 * params * (1 + rounds)
               + (cpu.op_j["bf16"] - gpu.op_j["fp16"]) * 2 * params * (128 + (g + 1) * rounds))
    assert slope == pytest.approx(by_hand, rel=0.03)
    tps = np.asarray(ev["output_tokens_per_s"], dtype=float)
    assert tps[0] > tps[1] > tps[2]
