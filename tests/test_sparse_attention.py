"""DeepSeek Sparse Attention (DeepSeek-V3.2, issue 45): the lightning indexer scores every earlier token,
each query attends to the index_topk tokens it selects, the KV cache still holds every token.

Closed forms (DeepSeek-AI, "DeepSeek-V3.2-Exp: Boosting Long-Context Efficiency with DeepSeek Sparse
Attention", 2025, sec. 2.1; the config deepseek-ai/DeepSeek-V3.2, vendored unmodified as
configs/models/deepseek-v3.2.json): per layer and sequence a decode step reads min(L, k) tokens' latents
(rkv + dr, read once for K and V, as dense MLA's decode reads every token's) plus the indexer's L keys of
index_head_dim; a prefill query at position i attends min(i, k) tokens."""
import json

import pytest

from basis.errors import DseError
from dse.core.efficiency import IDEAL
from dse.core.roofline import OpArrays, step_time
from dse.system.hardware import system_arrays
from hwmodels.presets import load_device
from workloads import optable
from workloads.footprint import kv_cache_bytes_per_sequence, parameter_count
from workloads.model import MODELS_DIR, draft_head_model, load_model, spec_from_config
from workloads.scenario import Scenario

V32 = "deepseek-v3.2"
K = 2048                                       # index_topk of the config


def sc(batch=1, prompt=1024, gen=16, **kw):
    return Scenario.make(batch=batch, prompt_len=prompt, gen_len=gen, weights="fp8", activations="fp8", kv="fp8", flash_attention=True,
                         **kw)


def op(table, name):
    return next(o for o in table.operators if o.name == name)


def test_config_is_read_with_its_indexer():
    m = load_model(V32)
    assert (m.index_n_heads, m.index_head_dim, m.index_topk) == (64, 128, 2048)
    assert m.is_mla and m.is_sparse_attention and m.mtp_layers == 1
    assert not load_model("deepseek-v3").is_sparse_attention


def test_parameter_count_matches_published():
    # main model: DeepSeek-V3's 671 B (DeepSeek-V3 report, Table 1 / README: 671 B main + 14 B MTP = 685 B)
    # plus 61 indexers of 13.96 M; DeepSeek-V3.2-Exp is published as 685 B with its MTP module
    # (https://huggingface.co/deepseek-ai/DeepSeek-V3.2-Exp; together.ai's model card: "685B total parameters")
    m = load_model(V32)
    indexer = 1536 * 64 * 128 + 7168 * 128 + 2 * 128 + 7168 * 64
    assert parameter_count(m) - parameter_count(load_model("deepseek-v3")) == pytest.approx(61 * indexer)
    assert parameter_count(m) == pytest.approx(671e9, rel=0.01)


def test_kv_per_token_holds_the_indexer_key():
    m, s = load_model(V32), sc()
    per_token = 61 * (512 + 64 + 128) * 1          # latent + rope key + indexer key, fp8, every layer
    assert kv_cache_bytes_per_sequence(m, s, context=100_000) == pytest.approx(100_000 * per_token)


@pytest.mark.parametrize("L", [100, 1000, 2048, 4096, 65_536])
def test_decode_read_is_the_selected_tokens_plus_the_indexer_keys(L):
    m, s = load_model(V32), sc(batch=3)
    t = optable.decode_step(m, s, L, buffer_bytes=50e6)
    rkv, dr, di = 512, 64, 128
    assert op(t, "flash_attention").kv_in == pytest.approx(3 * min(L, K) * (rkv + dr))   # the latent read once
    assert op(t, "indexer_scores").kv_in == pytest.approx(3 * L * di)
    assert op(t, "indexer_scores").ops == pytest.approx(3 * L * (64 * (2 * di + 3) + 1))
    assert op(t, "flash_attention").count == op(t, "indexer_scores").count == 61


@pytest.mark.parametrize("L", [16, 700, 2048])
def test_within_top_k_decode_equals_dense_mla_plus_the_indexer(L):
    sparse, dense = load_model(V32), load_model("deepseek-v3")
    for flash in (True, False):
        s2 = Scenario.make(batch=2, prompt_len=1024, gen_len=16, flash_attention=flash)
        a = optable.decode_step(sparse, s2, L, 50e6)
        b = optable.decode_step(dense, s2, L, 50e6)
        dense_ops = {o.name: o for o in b.operators}
        for o in a.operators:
            if not o.name.startswith("indexer_"):
                for f in ("ops", "kv_in", "kv_out", "act_in", "act_out", "weight"):
                    assert getattr(o, f) == pytest.approx(getattr(dense_ops[o.name], f)), (o.name, f)
        assert set(dense_ops) == {o.name for o in a.operators if not o.name.startswith("indexer_")}


def test_decode_attention_stops_growing_past_top_k_while_the_indexer_grows_linearly():
    m, s = load_model(V32), sc(batch=8)
    hw = system_arrays([load_device("h200")], 8)

    def times(L):
        t = optable.decode_step(m, s, L, 50e6)
        one = {}
        for name in ("flash_attention", "indexer_scores"):
            only = optable.OpTable(t.stage, (op(t, name),), t.weights, t.activations, t.kv, t.tp, t.tokens, L)
            one[name] = float(step_time(OpArrays.from_table(only), hw, IDEAL)[0])
        return one
    a, b, c = times(2 * K), times(4 * K), times(8 * K)
    assert a["flash_attention"] == pytest.approx(b["flash_attention"]) == pytest.approx(c["flash_attention"])
    assert (c["indexer_scores"] - b["indexer_scores"]) == pytest.approx(2 * (b["indexer_scores"] - a["indexer_scores"]),
                                                                         rel=1e-6)
    assert times(K // 2)["flash_attention"] < a["flash_attention"]


def test_decode_pieces_break_at_top_k():
    m = load_model(V32)
    pieces = optable.decode_pieces(m, sc(prompt=1000), 1001, 50e6)
    assert [j for j, _, _ in pieces] == [0, K - 1001 + 1]
    slope_after = {o.name: o for o in pieces[1][2].operators}
    assert slope_after["flash_attention"].kv_in == 0 and slope_after["indexer_scores"].kv_in == 128


@pytest.mark.parametrize("S", [512, 2048, 5000])
def test_prefill_pairs_are_the_sum_of_min_position_top_k(S):
    m = load_model(V32)
    t = optable.prefill(m, sc(batch=2, prompt=S), 50e6)
    pairs = sum(min(i, K) for i in range(1, S + 1))
    nh, d_qk, d_v = 128, 576, 512
    assert op(t, "flash_attention").ops == pytest.approx(2 * nh * pairs * (2 * (d_qk + d_v) + 5))
    assert op(t, "indexer_scores").ops == pytest.approx(2 * S * (S + 1) / 2 * (64 * (2 * 128 + 3) + 1))


def test_bad_indexer_field_is_one_line(tmp_path):
    cfg = json.loads((MODELS_DIR / f"{V32}.json").read_text())
    with pytest.raises(DseError, match=r"index_topk.*integer from 1"):
        spec_from_config({**cfg, "index_topk": 0}, "x", "x.json")
    with pytest.raises(DseError, match=r"q_lora_rank"):
        spec_from_config({**cfg, "q_lora_rank": None}, "x", "x.json")


def test_checkpoint_with_its_mtp_module_matches_the_published_685b():
    # https://huggingface.co/deepseek-ai/DeepSeek-V3.2 and -V3.2-Exp model cards: 685B parameters, the main
    # model and its MTP module (num_nextn_predict_layers 1: one block with its indexer, eh_proj, norms, and the
    # checkpoint's own copy of the embedding and output head, which serving shares: not in the head's count)
    m = load_model(V32)
    shared = 2 * m.vocab_size * m.hidden_size
    assert parameter_count(m) + parameter_count(draft_head_model(m, "mtp")) + shared == pytest.approx(685e9, rel=0.01)


def test_prefill_within_top_k_equals_dense_absorbed_attention():
    # a prompt within top-k: every query attends every earlier token, as MLA's absorbed attention over
    # the causal pairs S(S+1)/2 of 128 heads, (576 + 512) x 2 + 5 ops a pair
    m = load_model(V32)
    S = 1500
    t = optable.prefill(m, sc(batch=1, prompt=S), 50e6)
    assert op(t, "flash_attention").ops == pytest.approx(128 * S * (S + 1) / 2 * (2 * (576 + 512) + 5))
