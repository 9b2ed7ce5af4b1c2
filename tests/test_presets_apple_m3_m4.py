"""Apple M3 Max, M4 Max and M3 Ultra presets (issue 42: rows run on them are predictable): a batch-1
decode reads every weight once a token, so its TPOT is at least the weight bytes over the cited
unified-memory bandwidth (400, 546, 819 GB/s), and the Ultra, two M3 Max dies, computes twice as fast."""
import pytest

from dse import evaluate
from hwmodels.presets import load_device

CITED_BANDWIDTH = {"m3-max": 400e9, "m4-max": 546e9, "m3-ultra": 819e9}


@pytest.mark.parametrize("hw", sorted(CITED_BANDWIDTH))
def test_decode_is_bounded_by_the_cited_bandwidth(hw):
    ev = evaluate({"model": "llama-3-8b-instruct", "hardware": hw, "weights": "q4_k_m", "batch": 1,
                   "prompt_len": 512, "gen_len": 128, "engine": "llama.cpp"})
    assert ev["tpot_s"][0] >= ev["weights_bytes"][0] / CITED_BANDWIDTH[hw]
    assert ev["feasible"][0]


def test_m3_ultra_is_two_m3_max_dies():
    ultra, one = load_device("m3-ultra"), load_device("m3-max")
    assert ultra.peak_ops_per_s["fp32"] == pytest.approx(2 * one.peak_ops_per_s["fp32"])
    assert ultra.memory_tiers[0].capacity_bytes == 4 * one.memory_tiers[0].capacity_bytes


def test_a_70b_model_fits_only_the_large_memories():
    """Llama-3.3-70B in Q4_K_M (~40 GiB) fits 128 GB and 512 GB, in FP16 (~131 GiB) only the Ultra's."""
    for hw in CITED_BANDWIDTH:
        ev = evaluate({"model": "llama-3.3-70b", "hardware": hw, "weights": "q4_k_m", "batch": 1,
                       "prompt_len": 512, "gen_len": 64, "engine": "llama.cpp"})
        assert ev["feasible"][0], hw
    fp16 = evaluate({"model": "llama-3.3-70b", "hardware": ["m3-max", "m3-ultra"], "weights": "fp16", "batch": 1,
                     "prompt_len": 512, "gen_len": 64, "engine": "llama.cpp"})
    assert list(fp16["feasible"]) == [False, True]
