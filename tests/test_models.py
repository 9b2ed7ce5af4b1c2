"""The workload model checked against published figures and independent arithmetic."""
import json

import numpy as np
import pytest

from basis.errors import DseError
from workloads.footprint import active_parameter_count, kv_cache_bytes_per_token, parameter_count
from workloads.model import available_models, load_model, spec_from_config
from workloads.optable import decode_step, expected_experts_touched, prefill
from workloads.scenario import Scenario

# Published parameter counts. Exact counts: the Hugging Face model pages (safetensors
# metadata / model card); nominal sizes: the model papers and cards.
PUBLISHED = {
    "llama-2-7b": 6_738_415_616,        # HF safetensors metadata (6.74B)
    "llama-2-13b": 13_015_864_320,      # HF (13.0B)
    "llama-2-70b": 68_976_648_192,      # HF (69.0B)
    "llama-3-70b": 70_553_706_496,      # HF (70.6B)
    "llama-3.1-8b": 8_030_261_248,      # HF (8.03B)
    "llama-3.1-70b": 70_553_706_496,    # HF (70.6B)
    "llama-3.3-70b": 70_553_706_496,    # HF (70.6B)
    "llama-3.1-405b": 405_853_388_800,  # HF (406B)
    "mistral-7b": 7_241_732_096,        # HF (7.24B)
    "mixtral-8x7b": 46_702_792_704,     # HF (46.7B); Mistral AI: 46.7B total, 12.9B active
    "qwen2.5-72b": 72.7e9,              # Qwen2.5-72B model card: "Number of Parameters: 72.7B"
    "gpt-j-6b": 6_053_381_344,          # EleutherAI model card: n_parameters
    "falcon-180b": 180e9,               # TII Falcon-180B model card: 180B
    "opt-6.7b": 6.7e9,                  # Zhang et al. 2022, OPT paper Table 1
    "opt-30b": 30e9,                    # OPT paper Table 1
    "opt-175b": 175e9,                  # OPT paper Table 1
    "bloom-176b": 176_247_271_424,      # BigScience BLOOM model card
    "deepseek-v3": 671e9,               # DeepSeek-V3 technical report: 671B total, 37B activated
    "deepseek-r1": 671e9,               # DeepSeek-R1 card: same architecture as V3
    "deepseek-v3.2": 671e9,             # V3.2-Exp: V3 + indexers, 671B main model (685B with MTP; SOURCES.md)
}
ACTIVE = {"mixtral-8x7b": 12.9e9, "deepseek-v3": 37e9}


def test_every_required_model_ships():
    assert set(PUBLISHED) <= set(available_models())


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_count_matches_published(name):
    assert parameter_count(load_model(name)) == pytest.approx(PUBLISHED[name], rel=0.01)


@pytest.mark.parametrize("name", sorted(ACTIVE))
def test_active_parameters(name):
    assert active_parameter_count(load_model(name)) == pytest.approx(ACTIVE[name], rel=0.02)


def test_architecture_coverage():
    kinds = {n: load_model(n) for n in PUBLISHED}
    assert kinds["llama-2-7b"].attention_kind == "MHA" and kinds["llama-2-7b"].mlp_gated
    assert kinds["llama-2-70b"].attention_kind == "GQA"
    assert kinds["deepseek-v3"].attention_kind == "MLA" and kinds["deepseek-v3"].num_shared_experts == 1
    assert kinds["mixtral-8x7b"].num_experts == 8 and kinds["mixtral-8x7b"].experts_per_token == 2
    assert kinds["gpt-j-6b"].parallel_block and not kinds["gpt-j-6b"].mlp_gated
    assert kinds["falcon-180b"].parallel_block and kinds["falcon-180b"].num_kv_heads == 8
    assert kinds["opt-6.7b"].mlp_activation == "relu"


def test_mqa_from_config():
    cfg = {"model_type": "falcon", "hidden_size": 4544, "num_hidden_layers": 32, "num_attention_heads": 71,
           "multi_query": True, "parallel_attn": True, "vocab_size": 65024}
    m = spec_from_config(cfg, "falcon-7b-like")
    assert m.attention_kind == "MQA"
    assert m.kv_elems_per_token_per_layer == 2 * 64


def test_kv_bytes_per_token():
    fp16 = Scenario.make()
    assert kv_cache_bytes_per_token(load_model("llama-2-7b"), fp16) == 512 * 1024
    assert kv_cache_bytes_per_token(load_model("llama-2-70b"), fp16) == 320 * 1024
    # DeepSeek-V3 MLA: (kv_lora_rank 512 + rope 64) x 61 layers x 2 bytes
    assert kv_cache_bytes_per_token(load_model("deepseek-v3"), fp16) == 576 * 61 * 2
    # GQA shrinks the KV: Mistral (8 KV heads) holds a quarter of Llama-2-7B's (32)
    assert kv_cache_bytes_per_token(load_model("mistral-7b"), fp16) == 128 * 1024
    # fp8 KV halves it
    assert kv_cache_bytes_per_token(load_model("llama-2-7b"), Scenario.make(kv="fp8")) == 256 * 1024


def test_model_path_and_missing_field(tmp_path):
    cfg = json.loads(load_model("llama-2-7b") and open("configs/models/llama-2-7b.json").read())
    p = tmp_path / "mymodel" / "config.json"
    p.parent.mkdir()
    p.write_text(json.dumps(cfg))
    assert load_model(str(p)).hidden_size == 4096
    del cfg["num_attention_heads"]
    p.write_text(json.dumps(cfg))
    with pytest.raises(DseError, match="num_attention_heads"):
        load_model(str(p))


def test_expected_experts_touched_matches_simulation():
    rng = np.random.default_rng(0)
    for E, k, T in ((8, 2, 1), (8, 2, 3), (256, 8, 16), (256, 8, 200)):
        trials = max(400, 2_000_000 // (T * E))
        picks = np.argsort(rng.random((trials, T, E)), axis=-1)[..., :k]
        touched = np.array([len(np.unique(p)) for p in picks])
        assert expected_experts_touched(E, k, T) == pytest.approx(touched.mean(), rel=0.02)


def test_moe_reads_only_touched_experts():
    m = load_model("mixtral-8x7b")
    one = {o.name: o for o in decode_step(m, Scenario.make(batch=1), 100).operators}
    many = {o.name: o for o in decode_step(m, Scenario.make(batch=64), 100).operators}
    per_expert = m.hidden_size * m.moe_intermediate_size
    assert one["expert_up_proj"].weight == pytest.approx(2 * per_expert)      # batch 1: top-2
    assert many["expert_up_proj"].weight == pytest.approx(8 * per_expert, rel=1e-6)  # all 8 touched


def test_dense_step_reads_every_weight_once():
    # decode of a dense model reads every parameter except the embedding table (one row per token)
    for name in ("llama-2-7b", "opt-6.7b", "bloom-176b", "gpt-j-6b", "falcon-180b"):
        m = load_model(name)
        t = decode_step(m, Scenario.make(batch=1), 10)
        read = sum(o.weight * o.count for o in t.operators)
        emb_rows = m.hidden_size * (2 if m.position_embeddings else 1)
        table = m.vocab_size * m.hidden_size + m.position_embeddings * m.hidden_size
        expected = parameter_count(m) - table + emb_rows + (m.vocab_size * m.hidden_size if m.tie_word_embeddings else 0)
        assert read == pytest.approx(expected, rel=1e-9), name


def test_flash_attention_has_no_score_tensor_and_depends_on_buffer():
    m = load_model("llama-2-7b")
    sc = Scenario.make(prompt_len=4096, flash_attention=True)
    plain = {o.name: o for o in prefill(m, Scenario.make(prompt_len=4096)).operators}
    big = {o.name: o for o in prefill(m, sc, buffer_bytes=228 * 1024).operators}
    small = {o.name: o for o in prefill(m, sc, buffer_bytes=16 * 1024).operators}
    assert "qk_matmul" not in big and "softmax" not in big and "flash_attention" in big
    fa = big["flash_attention"]
    scores = 32 * 4096 * 4096
    assert fa.act_in + fa.act_out < scores / 10          # no n^2 tensor
    assert small["flash_attention"].kv_in > fa.kv_in      # smaller buffer, more K/V re-reads
    # causal: half the pairs of the unfused (full-matrix) kernel, within the diagonal
    full = plain["qk_matmul"].ops + plain["sv_matmul"].ops + plain["softmax"].ops
    assert fa.ops == pytest.approx(full / 2, rel=0.001)


def test_tensor_parallel_splits_ops_and_weights():
    m = load_model("llama-2-70b")
    one = {o.name: o for o in prefill(m, Scenario.make(prompt_len=128)).operators}
    four = {o.name: o for o in prefill(m, Scenario.make(prompt_len=128, tp=4)).operators}
    for name in ("q_proj", "k_proj", "o_proj", "gate_proj", "down_proj", "qk_matmul", "lm_head"):
        assert four[name].ops == pytest.approx(one[name].ops / 4), name
        assert four[name].weight == pytest.approx(one[name].weight / 4, rel=1e-3), name
    assert four["attn_all_reduce"].comm == 128 * 8192 and "attn_all_reduce" not in one
    assert parameter_count(m, 4) == pytest.approx(parameter_count(m) / 4, rel=0.01)
    with pytest.raises(DseError, match="does not divide"):
        prefill(m, Scenario.make(tp=3))
