"""MiniMax-M2 (``minimax_m2``, MiniMax-M2.7's config.json as shipped: configs/models/SOURCES.md): 62
full-attention layers of 48 query and 8 K/V heads of 128 with q and k RMSNorms over all heads
(``qk_norm_type`` per_layer), every layer an MoE of 256 experts of width 1,536 (top 8, sigmoid scores
with a bias per expert), no shared expert. Its counts against the published ones, the norms' weights
against a hand count, and the configs it must refuse."""
from __future__ import annotations

import json

import pytest
from test_model_config_validation import assert_one_line, write

from basis.errors import DseError
from workloads import optable
from workloads.footprint import active_parameter_count, parameter_count
from workloads.model import MODELS_DIR, load_model
from workloads.scenario import Scenario

NAME = "minimax-m2.7"


def _cfg() -> dict:
    return json.loads((MODELS_DIR / f"{NAME}.json").read_text())


def test_shapes_are_the_config_s():
    m = load_model(NAME)
    assert (m.model_type, m.num_layers, m.hidden_size, m.num_heads, m.num_kv_heads, m.head_dim) == \
        ("minimax_m2", 62, 3072, 48, 8, 128)
    assert (m.num_experts, m.experts_per_token, m.moe_intermediate_size, m.num_moe_layers) == (256, 8, 1536, 62)
    assert m.router_bias and m.qk_norm and m.qk_norm_per_layer and m.num_shared_experts == 0
    assert m.mtp_layers == 0               # its MTP modules' structure is not in the config: not read


def test_parameter_counts_match_the_published_ones():
    """229 B total (the Hub's safetensors count for MiniMaxAI/MiniMax-M2.7) and about 10 B active (MiniMax's
    model cards: "10 billion active parameters"), the active count without the input embedding (a lookup)."""
    m = load_model(NAME)
    assert parameter_count(m) == pytest.approx(229e9, rel=0.005)
    assert active_parameter_count(m) - m.vocab_size * m.hidden_size == pytest.approx(10e9, rel=0.05)


def test_per_layer_qk_norms_hold_a_weight_per_element():
    """Hand count: one layer's attention on one device = q/k/v/o projections + the q norm over 48 x 128
    and the k norm over 8 x 128 elements (per head, as Qwen3's, they would be 2 x 128); on two devices
    each holds its 24 and 4 heads' share."""
    m = load_model(NAME)
    h, d = 3072, 128
    experts = 62 * (256 * 3 * h * 1536 + 256 * h + 256)       # experts, router, its bias per expert
    embed = 2 * 200064 * h
    attn = h * (48 + 2 * 8) * d + 48 * d * h + (48 + 8) * d
    norms = 62 * 2 * h + h
    assert parameter_count(m) == pytest.approx(embed + experts + 62 * attn + norms, rel=1e-12)
    sc = Scenario.make(batch=1, prompt_len=128, gen_len=2, weights="fp8", activations="fp8", kv="fp8", tp=2)
    norm = next(op for op in optable.decode_step(m, sc, 128, 0.0).operators if op.name == "qk_norm")
    assert norm.weight == (24 + 4) * d


@pytest.mark.parametrize("change,key,says", [
    ({"attn_type_list": [0] + [1] * 61}, "attn_type_list", "lightning-attention"),
    ({"attn_type_list": [1] * 61}, "attn_type_list", "62 entries"),
    ({"shared_intermediate_size": 512}, "shared_intermediate_size", "only 0"),
    ({"qk_norm_type": "per_block"}, "qk_norm_type", "per_layer or per_head"),
])
def test_configs_it_cannot_read_are_one_line_naming_the_key(tmp_path, change, key, says):
    p = write(tmp_path / "m.json", {**_cfg(), **change})
    with pytest.raises(DseError) as e:
        load_model(str(p))
    assert_one_line(e.value, p, key, says)
