"""gpt-oss's own attention, checked against closed forms from its shipped config.json: the
alternating sliding (128) / full layers of ``layer_types`` set the KV cache and the decode step's
key reads layer by layer, and the attention sinks (one learned logit per head and layer joining
each query's softmax denominator: gpt-oss model card, arXiv:2508.10925, sec. 2.1) add
num_attention_heads parameters a layer and one softmax element per query and head."""
import json
from dataclasses import replace

import pytest

from dse import evaluate
from workloads import optable
from workloads.footprint import kv_cache_bytes_per_sequence, parameter_count
from workloads.model import MODELS_DIR, load_model
from workloads.optable import SOFTMAX_OPS
from workloads.scenario import Scenario

NAMES = ("gpt-oss-20b", "gpt-oss-120b")


def config(name: str) -> dict:
    return json.loads((MODELS_DIR / f"{name}.json").read_text())


def pattern(name: str) -> tuple[int, int, int, int]:
    """(full layers, sliding layers, window, K+V elements a token a layer) from the config itself."""
    c = config(name)
    types = c["layer_types"]
    return (types.count("full_attention"), types.count("sliding_attention"), c["sliding_window"],
            2 * c["num_key_value_heads"] * c["head_dim"])


@pytest.mark.parametrize("name", NAMES)
def test_kv_cache_follows_the_layer_pattern(name):
    full, sliding, w, per = pattern(name)
    assert full + sliding == config(name)["num_hidden_layers"]
    m, sc = load_model(name), Scenario.make(batch=2, prompt_len=100_000, gen_len=100)
    for ctx in (100, 128, 129, 10_000, 100_100):
        assert kv_cache_bytes_per_sequence(m, sc, ctx) == (full * ctx + sliding * min(ctx, w)) * per * 2   # fp16 KV
    ev = evaluate({"model": name, "hardware": "h200", "batch": 2, "prompt_len": 100_000, "gen_len": 100})
    assert ev["kv_cache_bytes"][0] == 2 * (full * 100_100 + sliding * w) * per * 2


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("flash", [False, True])
def test_decode_reads_every_key_on_full_layers_and_the_window_on_sliding_ones(name, flash):
    full, sliding, w, per = pattern(name)
    m, B, ctx = load_model(name), 3, 50_000
    ops = {o.name: o for o in optable.decode_step(m, Scenario.make(batch=B, flash_attention=flash), ctx,
                                                   228 * 1024).operators}
    core = "flash_attention" if flash else "qk_matmul"
    assert (ops[core].count, ops["sliding_" + core].count) == (full, sliding)
    if flash:                                                 # K and V read once a step
        assert ops[core].kv_in == B * ctx * per
        assert ops["sliding_" + core].kv_in == B * w * per
    else:                                                     # K by qk, V by sv
        assert ops["qk_matmul"].kv_in + ops["sv_matmul"].kv_in == B * ctx * per
        assert ops["sliding_qk_matmul"].kv_in + ops["sliding_sv_matmul"].kv_in == B * w * per


@pytest.mark.parametrize("name", NAMES)
def test_sinks_are_one_parameter_a_head_and_layer(name):
    c, m = config(name), load_model(name)
    assert m.attention_sinks
    heads_layers = c["num_attention_heads"] * c["num_hidden_layers"]       # 1,536 (20b), 2,304 (120b)
    assert parameter_count(m) - parameter_count(replace(m, attention_sinks=False)) == heads_layers
    assert parameter_count(m, tp=4) - parameter_count(replace(m, attention_sinks=False), tp=4) == heads_layers / 4
    assert not load_model("llama-3.1-8b").attention_sinks


@pytest.mark.parametrize("flash", [False, True])
@pytest.mark.parametrize("stage", ["decode", "prefill"])
def test_sinks_add_one_softmax_element_per_query_and_head(flash, stage):
    m, B, S, ctx = load_model("gpt-oss-20b"), 4, 300, 1_000
    nh, layers = config("gpt-oss-20b")["num_attention_heads"], config("gpt-oss-20b")["num_hidden_layers"]
    sc = Scenario.make(batch=B, prompt_len=S, flash_attention=flash)

    def table(spec):
        if stage == "decode":
            return optable.decode_step(spec, sc, ctx, 228 * 1024).operators
        return optable.prefill(spec, sc, 228 * 1024).operators

    def attention(spec):
        names = ("flash_attention",) if flash else ("softmax",)
        names += tuple("sliding_" + n for n in names)
        return sum(o.ops * o.count for o in table(spec) if o.name in names), \
            sum(o.weight * o.count for o in table(spec) if o.name in names)

    (ops, w), (ops0, w0) = attention(m), attention(replace(m, attention_sinks=False))
    queries = B * (1 if stage == "decode" else S)
    assert ops - ops0 == SOFTMAX_OPS * queries * nh * layers
    assert w - w0 == nh * layers
