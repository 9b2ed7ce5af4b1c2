"""GLM-5 (zai-org/GLM-5, model_type glm_moe_dsa, issue 45): DeepSeek-V3.2's sparse attention at GLM-5's
sizes, read through the same DSA path (the lightning indexer, its top-k, the KV cache of every token).

Expectations: GLM-5: from Vibe Coding to Agentic Engineering (technical report, arXiv:2602.15763, the
architecture table: 744B total, 40B activated, 3 dense + 75 MoE layers, 1 MTP layer, 64 heads of QK 192 /
V 256, q LoRA 2048, kv LoRA 512, 32 indexer heads of 128, 256 experts, 8 routed + 1 shared), the
closed forms of tests/test_sparse_attention.py with GLM-5's dims read off its config."""
import json

import pytest

from basis.errors import DseError
from workloads import optable
from workloads.footprint import active_parameter_count, kv_cache_bytes_per_sequence, parameter_count
from workloads.model import MODELS_DIR, draft_head_model, load_model, spec_from_config
from workloads.scenario import Scenario

GLM5 = "glm-5"


def _cfg() -> dict:
    return json.loads((MODELS_DIR / f"{GLM5}.json").read_text())


def sc(batch=1, prompt=1024, gen=16):
    return Scenario.make(batch=batch, prompt_len=prompt, gen_len=gen, weights="fp8", activations="fp8", kv="fp8",
                         flash_attention=True)


def op(table, name):
    return next(o for o in table.operators if o.name == name)


def test_config_is_read_as_sparse_attention_with_its_own_sizes():
    m = load_model(GLM5)
    assert m.model_type == "deepseek_v32" and m.is_mla and m.is_sparse_attention
    assert (m.index_n_heads, m.index_head_dim, m.index_topk) == (32, 128, 2048)
    assert (m.num_layers, m.first_dense_layers, m.num_moe_layers, m.mtp_layers) == (78, 3, 75, 1)
    assert (m.qk_nope_head_dim + m.qk_rope_head_dim, m.v_head_dim, m.num_heads) == (256, 256, 64)
    assert draft_head_model(m, "mtp").is_sparse_attention          # its MTP layer carries an indexer too


def test_parameter_counts_match_the_technical_report():
    m = load_model(GLM5)
    assert parameter_count(m) == pytest.approx(744e9, rel=0.01)           # 743.91 B: -0.012 %
    # 40B activated: ours less the embedding table and the output head (the convention is not stated)
    head_and_table = 2 * m.vocab_size * m.hidden_size
    assert active_parameter_count(m) - head_and_table == pytest.approx(40e9, rel=0.01)
    assert "`glm-5.json`" in (MODELS_DIR / "SOURCES.md").read_text()


def test_kv_per_token_holds_the_latent_and_the_indexer_key_of_every_layer():
    c = _cfg()
    per_token = c["num_hidden_layers"] * (c["kv_lora_rank"] + c["qk_rope_head_dim"] + c["index_head_dim"])  # fp8
    assert kv_cache_bytes_per_sequence(load_model(GLM5), sc(), context=100_000) == pytest.approx(100_000 * per_token)


@pytest.mark.parametrize("L", [100, 2048, 65_536])
def test_decode_read_is_the_selected_tokens_plus_the_indexer_keys(L):
    c = _cfg()
    k, rkv, dr, di, hi = c["index_topk"], c["kv_lora_rank"], c["qk_rope_head_dim"], c["index_head_dim"], c["index_n_heads"]
    t = optable.decode_step(load_model(GLM5), sc(batch=3), L, buffer_bytes=50e6)
    assert op(t, "flash_attention").kv_in == pytest.approx(3 * min(L, k) * (rkv + dr))
    assert op(t, "indexer_scores").kv_in == pytest.approx(3 * L * di)
    assert op(t, "indexer_scores").ops == pytest.approx(3 * L * (hi * (2 * di + 3) + 1))
    assert op(t, "flash_attention").count == op(t, "indexer_scores").count == c["num_hidden_layers"]


def test_glm_moe_dsa_is_read_only_with_its_architecture():
    with pytest.raises(DseError, match=r"architectures.*GlmMoeDsaForCausalLM"):
        spec_from_config({**_cfg(), "architectures": ["Glm4MoeForCausalLM"]}, "x", "x.json")
