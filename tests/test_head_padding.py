"""Attention heads padded to the NeuronCores tensor parallelism shards over (AWS Neuron,
``workloads.head_padding``): the padded head counts by the libraries' rule, the weights and KV cache a
padded model holds against a hand count from the published parameter count, the refusal of engines
that do not pad, and the Inferentia2 rows of the Neuron benchmark tables (data/gathered) predicted."""
from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from basis.errors import DseError
from dse.core.engines import _profiles
from dse.fit.validate import default_measured, validate
from dse.system.evaluator import evaluate
from hwmodels.presets import load_device
from workloads.head_padding import padded_heads, padded_model
from workloads.model import load_model

#: (query heads, key/value heads, cores) -> padded (query, key/value), worked by hand from the rule:
#: queries to a multiple of the cores; multi-head K/V with them; grouped K/V one a core where the
#: cores are a multiple of them and whole groups stay whole, else as they are when the cores divide them
CASES = {
    (32, 32, 24): (48, 48),     # Llama-2-7B on an inf2.48xlarge (tp_degree 24): 2 heads a core
    (40, 40, 24): (48, 48),     # Llama-2-13B
    (64, 8, 24): (72, 24),      # Llama-2/3-70B: 3 query heads and 1 K/V head a core
    (32, 8, 24): (48, 24),      # Llama-3-8B, Mistral-7B
    (32, 8, 8): (32, 8),        # divides: nothing padded
    (64, 8, 16): (64, 16),      # queries divide; 8 K/V heads replicated to one a core
    (32, 32, 1): (32, 32),
}


@pytest.mark.parametrize("heads,kv,cores", list(CASES))
def test_padded_heads_follow_the_rule(heads, kv, cores):
    q, k = padded_heads(heads, kv, cores)
    assert (q, k) == CASES[(heads, kv, cores)]
    assert q % cores == 0 and k % cores == 0      # every core holds whole heads


def test_padded_model_keeps_the_width_of_a_head():
    m = load_model("llama-2-7b")
    p = padded_model(m, 24)
    assert (p.num_heads, p.num_kv_heads, p.head_dim, p.hidden_size) == (48, 48, m.head_dim, m.hidden_size)
    assert padded_model(m, 8) is m                     # 8 cores divide 32 heads: the model itself
    assert padded_model(load_model("deepseek-v3"), 24).num_heads == 128     # MLA: no published rule, as it is


def _neuron(**kw):
    return {"model": "llama-2-7b", "hardware": "inferentia2", "devices": 12, "batch": 1, "prompt_len": 128,
            "gen_len": 128, "weights": "bf16", "activations": "bf16", "kv": "bf16", "engine": "neuron", **kw}


def test_weights_and_kv_cache_of_the_padded_model_against_a_hand_count():
    """Llama-2-7B (6,738,415,616 parameters, its model card) on 12 Inferentia2 chips = 24 NeuronCores: 16
    zero heads of 128 in each of q/k/v_proj (4,096 x 2,048) and o_proj (2,048 x 4,096) of 32 layers;
    every weight but the 65 norms of 4,096 split over the 12 chips, 2 bytes each."""
    r = evaluate(_neuron())
    params = 6_738_415_616 + 4 * 4096 * 2048 * 32
    norms = 65 * 4096
    assert r["weights_bytes"][0] == pytest.approx(2 * ((params - norms) / 12 + norms), rel=1e-9)
    # KV cache: 48 K and 48 V heads of 128 a layer, 4 of each a chip, for 256 tokens
    assert r["kv_cache_bytes"][0] == pytest.approx(256 * 32 * 2 * 4 * 128 * 2, rel=1e-9)
    assert load_device("inferentia2").shard_cores == 2


def test_engines_that_do_not_pad_refuse_the_layout():
    r = evaluate(_neuron(engine="vllm"))
    assert not r.feasible[0] and "does not divide num_attention_heads (32)" in r.reason_text(0)
    r = evaluate(_neuron())
    assert r.feasible[0] and np.isfinite(r["tpot_s"][0])


def test_trainium2_shards_over_its_four_logical_cores():
    """Trainium2: 8 NeuronCore-v3 grouped in pairs by default (LNC=2): 4 ranks a chip. Llama-3.1-405B's
    128 query heads divide 16 chips x 4 = 64 ranks; its 8 K/V heads are replicated to one a rank, 4 a
    chip (against 1 a chip where the chips themselves were the ranks)."""
    assert load_device("trainium2").shard_cores == 4
    assert padded_heads(128, 8, 64) == (128, 64)
    r = evaluate({"model": "llama-3.1-405b", "hardware": "trainium2", "devices": 16, "batch": 1, "prompt_len": 128,
                  "gen_len": 2, "weights": "bf16", "activations": "bf16", "kv": "bf16", "engine": "neuron"})
    assert r["kv_cache_bytes"][0] == pytest.approx(130 * 126 * 2 * 4 * 128 * 2, rel=1e-9)


def test_the_inf2_benchmark_rows_are_predicted(tmp_path):
    """The Neuron SDK 2.18 inf2.48xlarge rows (tp_degree 24 NeuronCores = 12 chips; data/gathered/other_vendors.csv)
    of shipped models: every one predicted where before the layout was refused, median APE 16.7 % (2026-11-29),
    inside 25 %."""
    rows = pd.read_csv(default_measured().parent / "gathered" / "other_vendors.csv")
    rows = rows[rows.hardware_slug == "inferentia2"]
    path = tmp_path / "inf2.csv"
    rows.to_csv(path, index=False)
    val = validate(path)
    ape = np.array([r["ape"] for r in val.rows])
    assert len(val.rows) == len(rows) == 30 and not val.unpredictable
    assert np.median(ape) <= 0.25


def test_an_engine_s_head_padding_is_a_cited_switch(tmp_path):
    """``head_padding`` in an engine profile: true or false, and cited where true (one line naming the key)."""
    body = """default_engine: e
engines:
  e:
    label: e
    match: 'e'
    batching: static
    graphs: true
    attention: fused
    gqa_kv_sharing: true
    allreduce: one-shot
    head_padding: {PAD}
    sources: {batching: b, graphs: g, attention: a, allreduce: r{MORE}}
"""
    for i, (pad, more, said) in enumerate([("1", ", head_padding: h", "engines.e.head_padding: expected true or false"),
                                            ("true", "", "every attribute needs a source; missing: head_padding")]):
        path = tmp_path / f"engines{i}.yaml"
        path.write_text(body.replace("{PAD}", pad).replace("{MORE}", more))
        with pytest.raises(DseError, match=re.escape(said)) as e:
            _profiles(str(path))
        assert "\n" not in str(e.value)
    path = tmp_path / "ok.yaml"
    path.write_text(body.replace("{PAD}", "true").replace("{MORE}", ", head_padding: h"))
    assert _profiles(str(path))[0]["e"].head_padding
