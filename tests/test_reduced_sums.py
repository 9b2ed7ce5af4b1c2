"""Formats that quantization does not reach (issue 42, hardware physics): partial sums reduced across
devices (a tensor-parallel all-reduce, an MoE combine) travel in 16 bits whatever the activations'
format (``hwmodels.formats.unquantized_bytes``), as does the residual stream a pipeline
stage hands to the next, and attention runs in FP8 only on an FP8 KV cache,
also where MLA's prefill up-projects K and V from the cached latent. Each figure is computed here
from the model's config: tokens x hidden size x bytes, and the ideal roofline's ops / peak."""
from __future__ import annotations

import pytest

from dse.system.evaluator import evaluate
from hwmodels.presets import load_device
from workloads import optable
from workloads.model import load_model
from workloads.scenario import Scenario


def _prefill(model: str, activations: str, kv: str = "fp8", **more) -> dict:
    m = load_model(model)
    sc = Scenario.make(batch=2, prompt_len=512, weights="fp8", activations=activations, kv=kv, **more)
    table = optable.prefill(m, sc)
    return {"table": table, "m": m, "ops": {o.name: i for i, o in enumerate(table.operators)}}


@pytest.mark.parametrize("activations,element_bytes", [("fp8", 2), ("int8", 2), ("bf16", 2), ("fp32", 4)])
def test_a_tensor_parallel_all_reduce_sends_16_bit_partial_sums_at_least(activations, element_bytes):
    p = _prefill("llama-3.1-70b", activations, tp=4)
    tokens, hidden = 2 * 512, p["m"].hidden_size
    for name in ("attn_all_reduce", "mlp_all_reduce"):
        assert p["table"].comm_bytes[p["ops"][name]] == tokens * hidden * element_bytes


@pytest.mark.parametrize("activations,element_bytes", [("fp8", 2), ("int8", 2), ("bf16", 2), ("fp32", 4)])
def test_a_pipeline_hop_hands_over_the_16_bit_residual_stream_at_least(activations, element_bytes):
    p = _prefill("llama-3.1-70b", activations, pp=2)
    assert p["table"].p2p_bytes[p["ops"]["pp_hop"]] == 2 * 512 * p["m"].hidden_size * element_bytes


def test_an_moe_combine_sends_what_it_dispatched_in_16_bits():
    p = _prefill("mixtral-8x7b", "fp8", ep=2, tp=1)
    dispatched = p["table"].p2p_bytes[p["ops"]["moe_dispatch"]]
    assert dispatched > 0
    assert p["table"].p2p_bytes[p["ops"]["moe_combine"]] == 2 * dispatched     # FP8 out, BF16 back


@pytest.mark.parametrize("activations,kv,expected", [("fp8", "bf16", "bf16"), ("fp8", "fp8", "fp8"),
                                                     ("bf16", "fp8", "bf16"), ("bf16", "bf16", "bf16")])
def test_mla_prefill_attention_runs_in_fp8_only_on_an_fp8_cache(activations, kv, expected):
    p = _prefill("deepseek-v3", activations, kv=kv, tp=8)
    for name in ("qk_matmul", "sv_matmul"):            # K and V up-projected from the latent: activations
        assert p["table"].compute_classes[p["ops"][name]] == expected


def test_mla_prefill_attention_on_a_bf16_cache_takes_the_bf16_peak():
    """Ideal roofline, a prompt long enough that MLA's fused prefill attention is compute-bound on a BF16
    cache: its time is its ops over the BF16 dense peak, FP8 weights and activations notwithstanding."""
    hw = load_device("h200")
    point = {"model": "deepseek-v3", "hardware": "h200", "devices": 8, "tp": 8, "batch": 1, "prompt_len": 16384,
             "gen_len": 2, "weights": "fp8", "activations": "fp8"}
    ev = evaluate({**point, "kv": "bf16"}, ideal=True, explain=[0])
    row = next(r for r in ev.explained[0]["prefill"] if r["name"] == "flash_attention")
    assert row["bound"] == "compute" and row["compute_format"] == "bf16"
    assert row["time_s"] == pytest.approx(row["ops"] / hw.peak_ops_per_s["bf16"], rel=1e-9)
