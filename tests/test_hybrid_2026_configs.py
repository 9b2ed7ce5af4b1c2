"""Qwen3-Next-80B-A3B and Jamba-1.5-Mini (issue 45): their shipped configs read as hybrids, their
parameter counts against the published figures, their KV and recurrent state against the closed
forms of their config dims.

Expectations are independent of the code: the published counts (configs/models/SOURCES.md), a
safetensors tally of the released checkpoint, and closed forms written from the config's fields."""
from __future__ import annotations

import json

import pytest

from basis.errors import DseError
from dse.system.evaluator import evaluate
from workloads import optable
from workloads.footprint import (
    active_parameter_count,
    kv_cache_bytes_per_token,
    parameter_count,
    recurrent_parameter_count,
    state_bytes_per_sequence,
)
from workloads.model import MODELS_DIR, draft_head_model, load_model, spec_from_config
from workloads.scenario import Scenario

QWEN3_NEXT = "qwen3-next-80b-a3b-instruct"


def _cfg(name: str) -> dict:
    return json.loads((MODELS_DIR / f"{name}.json").read_text())


def _sc(**kw) -> Scenario:
    return Scenario.make(batch=1, prompt_len=1000, gen_len=1, weights="bf16", activations="bf16", kv="bf16", **kw)


#: The MTP module's tensors in Qwen/Qwen3-Next-80B-A3B-Instruct's safetensors (shapes as the
#: checkpoint's weight table lists them; SOURCES.md): fc 2048 x 4096, one decoder layer (attention
#: q 8192 x 2048 with its output gate, k and v 512 x 2048, o 2048 x 4096, q/k norms of 256; 512
#: experts and a shared expert of 3 x 512 x 2048, router 512 x 2048, shared gate 2048; two layer
#: norms) and three norms (final, pre-fc embedding, pre-fc hidden) of 2048.
QWEN3_NEXT_MTP = (2048 * 4096 + 8192 * 2048 + 2 * 512 * 2048 + 2048 * 4096 + 2 * 256
                  + 512 * 3 * 512 * 2048 + 3 * 512 * 2048 + 512 * 2048 + 2048 + 2 * 2048 + 3 * 2048)
#: the checkpoint's safetensors hold 81,324,862,720 parameters, its MTP module included
QWEN3_NEXT_CHECKPOINT = 81_324_862_720


def test_qwen3_next_parameter_count_is_the_checkpoint_without_its_mtp_module():
    m = load_model(QWEN3_NEXT)
    assert parameter_count(m) == QWEN3_NEXT_CHECKPOINT - QWEN3_NEXT_MTP          # 79,674,391,296 exactly
    assert parameter_count(m) == pytest.approx(80e9, rel=0.01)                 # model card: 80B in total
    # model card: 79B non-embedding (rounded): the count less the embedding and the untied head
    assert parameter_count(m) - 2 * 151936 * 2048 == pytest.approx(79e9, rel=0.01)
    # 3B activated (rounded): 10 routed experts + the shared one of 48 layers, the mixers, embedding, head
    assert 3e9 < active_parameter_count(m) < 4e9
    assert "`qwen3-next-80b-a3b-instruct.json`" in (MODELS_DIR / "SOURCES.md").read_text()


def test_qwen3_next_layers_kv_and_state_follow_its_config():
    c = _cfg(QWEN3_NEXT)
    m = load_model(QWEN3_NEXT)
    layers, every = c["num_hidden_layers"], c["full_attention_interval"]
    assert (m.num_attention_layers, m.num_recurrent_layers, m.num_moe_layers) == (layers // every,
                                                                                  layers - layers // every, layers)
    # KV: the 12 gated-attention layers only, 2 kv heads x 256 x (K, V) x 2 bytes
    assert kv_cache_bytes_per_token(m, _sc()) == layers // every * 2 * c["num_key_value_heads"] * c["head_dim"] * 2
    # state: per Gated DeltaNet layer, 32 value heads x 128 x 128 (bf16: no mamba_ssm_dtype in this config)
    # and the conv's last 3 inputs of q, k (16 x 128 each) and v (32 x 128)
    hv, dk, dv = c["linear_num_value_heads"], c["linear_key_head_dim"], c["linear_value_head_dim"]
    conv = 2 * c["linear_num_key_heads"] * dk + hv * dv
    want = (layers - layers // every) * (hv * dk * dv + conv * (c["linear_conv_kernel_dim"] - 1)) * 2
    assert state_bytes_per_sequence(m, _sc()) == want
    assert want / 2**20 == pytest.approx(36 * (1 + 0.046875), rel=1e-12)       # 36 x (1 MiB + 48 KiB)


JAMBA = "jamba-1.5-mini"


def test_jamba_parameter_counts_match_published():
    """Jamba-1.5-Mini: 52B total, 12B active (AI21 model card; Jamba-1.5 paper, arXiv:2408.12570)."""
    m = load_model(JAMBA)
    assert parameter_count(m) == pytest.approx(52e9, rel=0.01)
    assert active_parameter_count(m) == pytest.approx(12e9, rel=0.01)
    assert "`jamba-1.5-mini.json`" in (MODELS_DIR / "SOURCES.md").read_text()


def test_jamba_mamba_layer_parameters_are_the_mixer_tensors():
    """One Mamba layer, tensor by tensor as transformers' JambaMambaMixer holds them: in_proj
    h x 2 d_inner, conv d_inner x K and its bias, x_proj d_inner x (R + 2 N), dt_proj R x d_inner and
    its bias, A_log d_inner x N, D, out_proj d_inner x h, and the dt, B, C RMSNorms (R + 2 N)."""
    c = _cfg(JAMBA)
    h, n, r, k = c["hidden_size"], c["mamba_d_state"], c["mamba_dt_rank"], c["mamba_d_conv"]
    d = c["mamba_expand"] * h
    mixer = h * 2 * d + d * k + d + d * (r + 2 * n) + r * d + d + d * n + d + d * h + (r + 2 * n)
    m = load_model(JAMBA)
    assert recurrent_parameter_count(m) == mixer
    assert recurrent_parameter_count(m, tp=2) == pytest.approx(mixer / 2 + (r + 2 * n) / 2, rel=1e-12)


def test_jamba_layers_kv_and_state_follow_its_config():
    c = _cfg(JAMBA)
    m = load_model(JAMBA)
    layers = c["num_hidden_layers"]
    attn = [i for i in range(layers) if i % c["attn_layer_period"] == c["attn_layer_offset"]]
    assert attn == [4, 12, 20, 28]
    assert [i for i, k in enumerate(m.layer_mixers) if k == "attention"] == attn
    assert (m.num_recurrent_layers, m.num_moe_layers, m.num_dense_layers) == (28, 16, 16)
    # Jamba paper (arXiv:2403.19887, Table 1): 4GB of KV cache at 256K tokens in 16-bit
    kv = kv_cache_bytes_per_token(m, _sc())
    assert kv == len(attn) * 2 * c["num_key_value_heads"] * c["hidden_size"] // c["num_attention_heads"] * 2
    assert kv * 256 * 1024 == 4 * 2**30
    # state: per Mamba layer d_inner x d_state and the conv's last K - 1 inputs of x, bf16
    d = c["mamba_expand"] * c["hidden_size"]
    assert state_bytes_per_sequence(m, _sc()) == 28 * d * (c["mamba_d_state"] + c["mamba_d_conv"] - 1) * 2


def test_jamba_decode_reads_every_weight_once_and_does_not_grow_in_its_mamba_layers():
    """A batch-1 decode step reads every parameter but the embedding table (one row) and the
    experts not chosen (two of 16 a MoE layer); the Mamba layers' operators are the same at any context."""
    m = load_model(JAMBA)
    sc = Scenario.make(batch=1, weights="bf16", activations="bf16", kv="bf16")
    short, long = (optable.decode_step(m, sc, n) for n in (1_000, 100_000))
    read = sum(o.weight * o.count for o in short.operators)
    h, e = m.hidden_size, m.num_experts
    idle_experts = m.num_moe_layers * (e - m.experts_per_token) * 3 * h * m.moe_intermediate_size
    assert read == pytest.approx(parameter_count(m) - m.vocab_size * h + h - idle_experts, rel=1e-9)
    ssm = [o.name for o in short.operators if o.name.startswith("ssm_")]
    assert ssm == ["ssm_in_proj", "ssm_conv", "ssm_x_proj", "ssm_dt_bc_norm", "ssm_dt_proj", "ssm_scan",
                   "ssm_gate", "ssm_out_proj"]
    by_name = {o.name: o for o in long.operators}
    for o in short.operators:
        if o.name in ssm:
            assert (o.ops, o.kv_in, o.kv_out) == (by_name[o.name].ops, by_name[o.name].kv_in, by_name[o.name].kv_out)


def test_qwen35_mtp_layer_is_a_native_draft_head_of_its_config():
    """Qwen3.5's ``mtp_num_hidden_layers`` MTP layer, as Qwen3-Next's checkpoint holds one (its weight
    table, SOURCES.md): fc 2h -> h, the two pre-fc RMSNorms, one gated-attention block (q_proj with
    its output gate, k, v, o, q/k norms) with the model's MoE (router, routed experts, shared expert and
    its gate), the block's two norms and a final norm; the embedding and LM head shared."""
    t = _cfg("qwen3.5-35b-a3b")["text_config"]
    h, nh, nkv, d = t["hidden_size"], t["num_attention_heads"], t["num_key_value_heads"], t["head_dim"]
    e, w, ws = t["num_experts"], t["moe_intermediate_size"], t["shared_expert_intermediate_size"]
    attention = h * 2 * nh * d + 2 * h * nkv * d + nh * d * h + 2 * d
    moe = h * e + e * 3 * h * w + 3 * h * ws + h
    want = 2 * h * h + 2 * h + attention + moe + 2 * h + h
    m = load_model("qwen3.5-35b-a3b")
    assert m.mtp_layers == t["mtp_num_hidden_layers"] == 1
    assert parameter_count(draft_head_model(m, "mtp")) == want                      # 844,640,768
    with pytest.raises(DseError, match="mtp_use_dedicated_embeddings"):
        spec_from_config({**_cfg("qwen3.5-27b"), "text_config": {**_cfg("qwen3.5-27b")["text_config"],
                                                                 "mtp_use_dedicated_embeddings": True}}, "x", "x.json")


def test_qwen35_mtp_draft_reaches_the_evaluation():
    cols = {"model": "qwen3.5-35b-a3b", "hardware": "h200", "weights": "fp8", "kv": "fp8", "prompt_len": 4096,
            "gen_len": 257, "batch": 1}
    plain = evaluate(cols)
    mtp = evaluate({**cols, "spec_draft": "mtp:1@0.8", "spec_tokens": 1})
    assert mtp["tokens_per_target_step"][0] == pytest.approx(1.8, rel=1e-12)
    assert mtp["tpot_s"][0] < plain["tpot_s"][0]
    assert mtp["weights_bytes"][0] - plain["weights_bytes"][0] == pytest.approx(
        parameter_count(draft_head_model(load_model("qwen3.5-35b-a3b"), "mtp")), rel=1e-9)       # fp8: a byte each


def test_qwen3_next_ships_one_mtp_module_of_its_checkpoint():
    """Qwen3-Next's config has no MTP key; its checkpoint holds one MTP module (above). ``mtp:1`` is its
    draft: the module's parameters are the checkpoint's tensors the decoder does not count, exactly,
    and on one H200 in FP8 an accepted draft token at 0.8 shortens TPOT."""
    m = load_model(QWEN3_NEXT)
    assert m.mtp_layers == 1 and "mtp_num_hidden_layers" not in _cfg(QWEN3_NEXT)
    assert parameter_count(draft_head_model(m, "mtp")) == QWEN3_NEXT_MTP
    cols = {"model": QWEN3_NEXT, "hardware": "h200", "weights": "fp8", "kv": "fp8", "prompt_len": 4096,
            "gen_len": 257, "batch": 1}
    plain = evaluate(cols)
    mtp = evaluate({**cols, "spec_draft": "mtp:1@0.8", "spec_tokens": 1})
    assert mtp["tokens_per_target_step"][0] == pytest.approx(1.8, rel=1e-12)
    assert mtp["tpot_s"][0] < plain["tpot_s"][0]
