"""Formats that quantization does not reach (issue 42, hardware physics): partial sums reduced across
devices (a tensor-parallel all-reduce, an MoE combine) travel in 16 bits whatever the activations'
format (``hwmodels.formats.unquantized_bytes``), as does the residual stream: a pipeline
stage hands it to the next, the norms read it and the residual adds read and write it in 16 bits
(the norm writes its matmul's input in the activations' format), and it is what a footprint keeps
alive beside a step's operators; attention runs in FP8 only on an FP8 KV cache,
also where MLA's prefill up-projects K and V from the cached latent. Each figure is computed here
from the model's config: tokens x hidden size x bytes, and the ideal roofline's ops / peak."""
from __future__ import annotations

import pytest

from dse.system.evaluator import evaluate
from hwmodels.presets import load_device
from workloads import optable
from workloads.footprint import chunk_activation_bytes, peak_activation_bytes
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


@pytest.mark.parametrize("activations,stream_bytes,act_bytes", [("fp8", 2, 1), ("int8", 2, 1), ("bf16", 2, 2),
                                                              ("fp32", 4, 4)])
def test_norms_and_residual_adds_keep_the_residual_stream_in_16_bits_at_least(activations, stream_bytes, act_bytes):
    """Per token and layer: a pre-norm reads the stream (h elements) and writes its matmul's input; a
    residual add reads the stream and the block's output and writes the stream (3h); the embedding
    writes the stream; the final norm reads it."""
    p = _prefill("llama-3.1-70b", activations, tp=4)
    tokens, h = 2 * 512, p["m"].hidden_size
    act = p["table"].act_bytes
    for name in ("attn_norm", "mlp_norm"):
        assert act[p["ops"][name]] == tokens * h * (stream_bytes + act_bytes)
    for name in ("attn_add", "mlp_add"):
        assert act[p["ops"][name]] == tokens * 3 * h * stream_bytes
    assert act[p["ops"]["embedding"]] == tokens * h * stream_bytes
    assert act[p["ops"]["final_norm"]] == 2 * h * (stream_bytes + act_bytes)      # a prompt's last token
    assert p["table"].operators[p["ops"]["attn_norm"]].count == 80          # config.json: num_hidden_layers


def test_gemmas_after_block_norms_write_the_residual_stream_in_16_bits():
    """Gemma's norms after attention and after the MLP read the block's output and write what is added
    to the stream: 16 bits both ways under FP8 activations; its norms before each block read 16 and
    write 8."""
    p = _prefill("gemma-2-9b-it", "fp8")
    tokens, h = 2 * 512, p["m"].hidden_size
    act = p["table"].act_bytes
    for name in ("post_attn_norm", "post_mlp_norm"):
        assert act[p["ops"][name]] == tokens * h * (2 + 2)
    assert act[p["ops"]["attn_norm"]] == tokens * h * (2 + 1)


@pytest.mark.parametrize("activations,act_bytes,stream_bytes", [("fp8", 1, 2), ("bf16", 2, 2), ("fp32", 4, 4)])
def test_a_chunks_live_activations_keep_its_16_bit_residual_stream(activations, act_bytes, stream_bytes):
    """Llama-3.1-8B (hidden 4,096, intermediate 14,336), fused attention, a chunk of 1,024 tokens: the
    largest live set is the gated activation's (its two inputs and its output, 3 x intermediate, in
    the activations' format) with the chunk's residual stream beside it, h in 16 bits at least."""
    m = load_model("llama-3.1-8b")
    sc = Scenario.make(batch=1, prompt_len=2048, weights="fp8", activations=activations, kv="fp8",
                       flash_attention=True)
    t, h, inter = 1024, 4096, 14336
    assert chunk_activation_bytes(m, sc, t, buffer=50e6) == t * 3 * inter * act_bytes + t * h * stream_bytes


def test_a_residual_adds_live_set_holds_the_stream_once():
    """Llama-3.1-70B FP8 on TP 4, fused attention, 8 x 4,096 tokens: the residual add is the largest live
    set, the stream, the block's output and the new stream, 3 x tokens x hidden x 2 bytes (1.5 GiB); the
    stream is not counted a fourth time beside it (the gated activation with the stream beside it:
    tokens x 3 x 28,672 / 4 x 1 + tokens x 8,192 x 2 bytes, 1.16 GiB)."""
    m = load_model("llama-3.1-70b")
    sc = Scenario.make(batch=8, prompt_len=4096, weights="fp8", activations="fp8", kv="fp8", tp=4,
                       flash_attention=True)
    table = optable.prefill(m, sc, 50e6)                     # a 50 MB on-chip buffer for the attention's tiles
    tokens, h = 8 * 4096, 8192
    assert peak_activation_bytes(table, tokens * h * 2) == 3 * tokens * h * 2


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_a_prefill_keeps_its_devices_share_of_the_stream_beside_its_scores(sequence_parallel):
    """Llama-3.1-70B on TP 8, one 4,096-token prompt in BF16, attention unfused: the largest live set
    is the softmax's (reading and writing 64/8 heads x 4,096^2 scores), with the residual stream
    beside it: all 4,096 x 8,192 of it, or 1/8 with sequence-parallel activations (each rank holds
    its share of the stream between the blocks; the all-gather feeds the matmuls, not the stream)."""
    m = load_model("llama-3.1-70b")
    tp, p, h = 8, 4096, m.hidden_size
    ev = evaluate({"model": "llama-3.1-70b", "hardware": "h100-sxm", "tp": tp, "batch": 1, "prompt_len": p,
                   "gen_len": 16, "flash_attention": False, "sequence_parallel": sequence_parallel})
    scores = m.num_heads / tp * p * p
    stream = p * h / (tp if sequence_parallel else 1)
    assert ev["activation_bytes"][0] == 2 * (2 * scores) + 2 * stream


def test_a_verifying_decode_step_keeps_its_stream_beside_its_logits():
    """Llama-3.1-8B, 64 one-token prompts, speculative decoding with 4 draft tokens: a decode step
    verifies 64 x 5 tokens, so its largest live set (the LM head's hidden states and logits,
    tokens x (hidden + vocabulary)) exceeds the prefill's; the step's 64 x 5 x hidden stream is live
    beside it, in 16 bits."""
    m = load_model("llama-3.1-8b")
    tokens, h, v = 64 * 5, m.hidden_size, m.vocab_size
    ev = evaluate({"model": "llama-3.1-8b", "hardware": "h100-sxm", "batch": 64, "prompt_len": 1, "gen_len": 16,
                   "spec_draft": "self:8", "spec_tokens": 4})
    assert ev["activation_bytes"][0] == 2 * tokens * (h + v) + 2 * tokens * h


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
