"""NVIDIA L4, GeForce RTX 5090 and RTX 3090 presets: a batch-1 FP8 decode of Llama-3.1-8B reads every weight once
a token, so its TPOT is at least the weight bytes over the cited bandwidth (300, 1,792 and 936 GB/s)."""
import pytest

from dse import evaluate

CITED_BANDWIDTH = {"l4": 300e9, "rtx-5090": 1792e9, "rtx-3090": 936e9}


@pytest.mark.parametrize("hw", sorted(CITED_BANDWIDTH))
def test_decode_is_bounded_by_the_cited_bandwidth(hw):
    ev = evaluate({"model": "llama-3.1-8b", "hardware": hw, "weights": "fp8", "activations": "fp8", "kv": "fp8",
                   "batch": 1, "prompt_len": 512, "gen_len": 128})
    assert ev["feasible"][0]
    assert ev["tpot_s"][0] >= ev["weights_bytes"][0] / CITED_BANDWIDTH[hw]

