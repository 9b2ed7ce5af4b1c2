"""The model families people bring (Qwen2/2.5/3 and their MoE, DeepSeek-V2, Gemma 2/3, gpt-oss,
Mixtral, Llama 3.2, DBRX, Phi-3): every shipped config reads, its parameter count matches the
published figure (configs/models/SOURCES.md), MoE is never read as dense, an unknown
model_type is refused in one line, sliding-window layers cache and attend to their window
only, and a context longer than the model's is infeasible with a clear reason."""
import json

import numpy as np
import pytest
from conftest import run_cli
from test_hybrid_models import PUBLISHED as PUBLISHED_HYBRID
from test_model_config_validation import SHIPPED, assert_one_line, bad_ints, write
from test_models_2026 import PUBLISHED_2026

from basis.errors import DseError
from dse import evaluate
from dse.core.efficiency import DEFAULT, IDEAL
from dse.core.roofline import OpArrays, step_time
from dse.system.hardware import system_arrays
from dse.system.reasons import CODE
from hwmodels.presets import load_device
from workloads import optable
from workloads.footprint import (
    active_parameter_count,
    kv_cache_bytes_per_sequence,
    kv_cache_bytes_per_token,
    parameter_count,
)
from workloads.model import MODELS_DIR, SUPPORTED_MODEL_TYPES, available_models, load_model, spec_from_config
from workloads.scenario import Scenario

# name: (published total, published active or None, relative tolerance, what "active" counts)
# Sources and the computed figures: configs/models/SOURCES.md.
PUBLISHED = {
    "llama-3.2-1b-instruct": (1.23e9, None, 0.01),       # Llama 3.2 model card: 1.23B
    "llama-3.2-3b-instruct": (3.21e9, None, 0.01),       # Llama 3.2 model card: 3.21B
    "qwen2.5-7b-instruct": (7.61e9, None, 0.01),         # Qwen2.5-7B-Instruct card: 7.61B
    "qwen3-0.6b": (0.6e9, None, 0.01),                   # Qwen3-0.6B card: 0.6B
    "qwen3-8b": (8.2e9, None, 0.01),                     # Qwen3-8B card: 8.2B
    "qwen3-30b-a3b": (30.5e9, 3.3e9, 0.02),              # Qwen3-30B-A3B card: 30.5B, 3.3B activated
    "qwen3-235b-a22b": (235e9, 22e9, 0.02),              # Qwen3-235B-A22B card: 235B, 22B activated
    "mixtral-8x22b": (141e9, 39e9, 0.02),                # Mistral AI: 141B, 39B active
    "gemma-2-9b-it": (9_241_705_984, None, 1e-9),        # Gemma 2 report Table 2 (= safetensors index / 2)
    "gemma-3-27b-it": (1_416e6 + 25_600e6, None, 0.01),  # Gemma 3 report Table 1: embedding + non-embedding
    "gpt-oss-20b": (20.91e9, 3.61e9, 0.01),              # gpt-oss model card Table 1
    "gpt-oss-120b": (116.83e9, 5.13e9, 0.01),            # gpt-oss model card Table 1
    "deepseek-v2-lite": (15.7e9, 2.4e9, 0.025),          # DeepSeek-V2 paper App. B: 15.7B, 2.4B activated
    "llama-3-8b-instruct": (8.03e9, None, 0.01),         # Hub's count for Meta-Llama-3-8B(-Instruct): 8.03B
    "qwen2.5-32b-instruct": (32.5e9, None, 0.01),        # Qwen2.5-32B-Instruct card: 32.5B (31.0B non-embedding)
    "phi-4": (14.7e9, None, 0.01),                       # Hub's count for microsoft/phi-4: 14.7B
}
#: models whose published active count leaves out the input embedding table (it is a lookup of one
#: row per token): the gpt-oss card counts "Embed + Unembed" apart and its active figure holds the
#: unembedding only (5.13 = 0.96 attention + 4/128 x 114.71 MLP + 0.58 unembedding); DeepSeek's
#: 2.4B is 2.45B computed without the embedding, 2.66B with it, so it is compared without it at
#: the 2.5 % the two published digits allow
ACTIVE_WITHOUT_EMBEDDING = {"gpt-oss-20b", "gpt-oss-120b", "deepseek-v2-lite"}
#: published non-embedding counts (Qwen cards: "Non-Embedding"; Gemma reports: non-embedding parameters)
NON_EMBEDDING = {"qwen2.5-7b-instruct": 6.53e9, "qwen3-0.6b": 0.44e9, "qwen3-8b": 6.95e9,
                 "qwen3-30b-a3b": 29.9e9, "qwen3-235b-a22b": 234e9, "gemma-2-9b-it": 8_324_201_984,
                 "gemma-3-27b-it": 25_600e6, "qwen2.5-32b-instruct": 31.0e9}
FAMILY = {"llama-3.2-1b-instruct": "llama", "llama-3.2-3b-instruct": "llama", "qwen2.5-7b-instruct": "qwen2",
          "qwen3-0.6b": "qwen3", "qwen3-8b": "qwen3", "qwen3-30b-a3b": "qwen3_moe", "qwen3-235b-a22b": "qwen3_moe",
          "mixtral-8x22b": "mixtral", "gemma-2-9b-it": "gemma2", "gemma-3-27b-it": "gemma3_text",
          "gpt-oss-20b": "gpt_oss", "gpt-oss-120b": "gpt_oss", "deepseek-v2-lite": "deepseek_v2",
          "llama-3-8b-instruct": "llama", "qwen2.5-32b-instruct": "qwen2", "phi-4": "phi3"}


def cfg_of(name: str) -> dict:
    return json.loads((MODELS_DIR / f"{name}.json").read_text())


def non_embedding(m) -> float:
    return parameter_count(m) - m.vocab_size * m.hidden_size * (1 if m.tie_word_embeddings else 2)


# ------------------------------------------------------------------------------ shipped configs

def test_every_shipped_config_is_covered_and_cited():
    vlm = {"qwen3-vl-8b-instruct", "qwen2.5-vl-7b-instruct"}       # vision + text count: tests/test_vision_encoder.py
    assert set(available_models()) == (set(SHIPPED) | set(PUBLISHED) | set(PUBLISHED_2026) | set(PUBLISHED_HYBRID) | vlm
                                       | {"deepseek-v3.2"}  # tests/test_sparse_attention.py
                                       | {"qwen3-next-80b-a3b-instruct", "jamba-1.5-mini"}  # tests/test_hybrid_2026_configs.py
                                       | {"glm-5"}  # tests/test_sparse_glm5.py
                                       | {"minimax-m2.7"})  # tests/test_minimax_m2.py
    sources = (MODELS_DIR / "SOURCES.md").read_text()
    for name in PUBLISHED:
        assert f"`{name}.json`" in sources, name


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_shipped_config_loads_as_its_family(name):
    m = load_model(name)
    assert m.model_type == FAMILY[name]
    assert m.is_moe == (PUBLISHED[name][1] is not None)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_count_matches_published(name):
    total, active, tol = PUBLISHED[name]
    m = load_model(name)
    assert parameter_count(m) == pytest.approx(total, rel=tol)
    if active is not None:
        counted = active_parameter_count(m)
        if name in ACTIVE_WITHOUT_EMBEDDING:
            counted -= m.vocab_size * m.hidden_size
        assert counted == pytest.approx(active, rel=tol)
    if name in NON_EMBEDDING:
        assert non_embedding(m) == pytest.approx(NON_EMBEDDING[name], rel=max(tol, 0.01))


def test_qwen3_30b_a3b_is_read_as_the_moe_it_is():
    m = load_model("qwen3-30b-a3b")
    assert (m.num_experts, m.experts_per_token, m.moe_intermediate_size, m.num_moe_layers) == (128, 8, 768, 48)
    assert (m.head_dim, m.num_heads, m.num_kv_heads, m.qk_norm) == (128, 32, 4, True)
    assert parameter_count(m) == pytest.approx(30.5e9, rel=0.005)
    assert active_parameter_count(m) == pytest.approx(3.3e9, rel=0.02)
    # the same numbers under a dense model_type are refused, never read as a 3.3 B dense model
    cfg = cfg_of("qwen3-30b-a3b")
    for dense in ("qwen3", "llama", "qwen2"):
        with pytest.raises(DseError) as e:
            spec_from_config({**cfg, "model_type": dense}, "x", "hand/config.json")
        assert_one_line(e.value, "hand/config.json", ": num_experts: ", "128", "dense family")


def test_gemma2_activation_norms_and_alternating_windows():
    m = load_model("gemma-2-9b-it")
    assert m.mlp_activation == "gelu_pytorch_tanh" and m.mlp_gated
    assert m.norms_per_block == 4 and m.tie_word_embeddings and m.head_dim == 256
    assert m.sliding_window == 4096 and m.sliding_layers == tuple(range(0, 42, 2))   # layer 0 slides, 1 is global
    assert (m.num_sliding_layers, m.num_global_layers, m.max_position_embeddings) == (21, 21, 8192)
    names = [o.name for o in optable.decode_step(m, Scenario.make(), 100).operators]
    assert {"post_attn_norm", "post_mlp_norm", "qk_matmul", "sliding_qk_matmul"} <= set(names)


def test_gemma3_text_config_five_local_to_one_global():
    m = load_model("gemma-3-27b-it")
    assert (m.hidden_size, m.num_layers, m.num_heads, m.num_kv_heads, m.head_dim) == (5376, 62, 32, 16, 128)
    # Gemma3TextConfig defaults for what the published config leaves out
    assert (m.vocab_size, m.max_position_embeddings, m.mlp_activation) == (262_208, 131_072, "gelu_pytorch_tanh")
    assert m.tie_word_embeddings and m.qk_norm and m.sliding_window == 1024
    assert sorted(set(range(62)) - set(m.sliding_layers)) == [5, 11, 17, 23, 29, 35, 41, 47, 53, 59]
    with pytest.raises(DseError) as e:      # errors inside text_config name the nested key
        spec_from_config({**cfg_of("gemma-3-27b-it"), "text_config": {**cfg_of("gemma-3-27b-it")["text_config"],
                                                                       "num_hidden_layers": -1}}, "g", "g.json")
    assert_one_line(e.value, "g.json", ": text_config.num_hidden_layers: ", "got -1")


def test_gpt_oss_layer_types_biases_and_top_k():
    m = load_model("gpt-oss-20b")
    assert (m.num_experts, m.experts_per_token, m.moe_intermediate_size) == (32, 4, 2880)
    assert m.attention_bias and m.o_proj_bias and m.mlp_bias and m.router_bias
    assert m.sliding_window == 128 and m.sliding_layers == tuple(range(0, 24, 2))
    with pytest.raises(DseError) as e:
        spec_from_config({**cfg_of("gpt-oss-20b"), "experts_per_token": 2}, "x", "o.json")
    assert_one_line(e.value, "o.json", ": experts_per_token: ", "num_experts_per_tok (4)")
    # without layer_types, the GptOssConfig default: every other layer from the first slides
    cfg = {k: v for k, v in cfg_of("gpt-oss-20b").items() if k != "layer_types"}
    assert spec_from_config(cfg, "x").sliding_layers == m.sliding_layers


def test_sliding_rules_of_the_other_families():
    assert load_model("mistral-7b").sliding_layers == tuple(range(32))        # v0.1: window 4096 on every layer
    assert load_model("mistral-7b").sliding_window == 4096
    assert load_model("mixtral-8x22b").sliding_window == 0                    # sliding_window null
    assert load_model("qwen2.5-7b-instruct").sliding_window == 0               # use_sliding_window false
    phi3 = {**cfg_of("llama-3.2-1b-instruct"), "model_type": "phi3", "sliding_window": 2047}
    assert spec_from_config(phi3, "p").sliding_layers == tuple(range(16))
    qwen = {**cfg_of("qwen3-8b"), "use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 30}
    assert spec_from_config(qwen, "q").sliding_layers == tuple(range(30, 36))
    # a window at least as long as the model's context never binds
    assert spec_from_config({**phi3, "sliding_window": 131072}, "p").sliding_window == 0


@pytest.mark.parametrize("change, key, words", [
    ({"layer_types": ["full_attention"] * 3}, "layer_types", "one entry per layer"),
    ({"layer_types": ["linear_attention"] + ["full_attention"] * 23}, "layer_types[0]", "does not model"),
    ({"sliding_window": 0}, "sliding_window", "got 0"),
    ({"sliding_window": "128"}, "sliding_window", "expected an integer"),
])
def test_bad_window_fields_are_one_line(change, key, words, tmp_path):
    p = write(tmp_path / "w" / "config.json", {**cfg_of("gpt-oss-20b"), **change})
    with pytest.raises(DseError) as e:
        load_model(str(p))
    assert_one_line(e.value, p, f": {key}: ", words)


def test_unknown_model_type_is_refused_in_one_line(tmp_path):
    for mt in ("foo_moe", "mamba", "Llama5"):
        p = write(tmp_path / mt / "config.json", {**cfg_of("qwen3-8b"), "model_type": mt})
        with pytest.raises(DseError) as e:
            load_model(str(p))
        msg = assert_one_line(e.value, p, ": model_type: ", mt, "does not know")
        assert all(t in msg for t in SUPPORTED_MODEL_TYPES)
    p = write(tmp_path / "none" / "config.json", {k: v for k, v in cfg_of("qwen3-8b").items() if k != "model_type"})
    with pytest.raises(DseError) as e:
        load_model(str(p))
    assert_one_line(e.value, p, ": model_type: ", "missing 'model_type'")
    r = run_cli("analyze", "--model", tmp_path / "foo_moe" / "config.json", "--hardware", "h100-sxm")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    line, = r.stderr.strip().splitlines()
    assert "model_type" in line and "foo_moe" in line


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_decode_step_reads_every_parameter_once(name):
    # with every expert touched (4096 tokens), a decode step reads each parameter the model counts once,
    # except the embedding table, of which it reads one row per token: the op table and the parameter
    # count agree on biases, norms, routers, shared experts and sliding layers alike
    m = load_model(name)
    t = optable.decode_step(m, Scenario.make(batch=4096), 10)
    read = sum(o.weight * o.count for o in t.operators)
    table = m.vocab_size * m.hidden_size
    expected = parameter_count(m) - table + 4096 * m.hidden_size + (table if m.tie_word_embeddings else 0)
    assert read == pytest.approx(expected, rel=1e-9)


def test_qwen2_moe_shared_expert_and_dense_layers():
    # field mapping only (no public Qwen2-MoE config could be shipped): the Qwen3-30B-A3B shapes under
    # qwen2_moe (whose configs give no attention_bias: q, k, v have one), with a shared expert and two dense layers
    cfg = {k: v for k, v in cfg_of("qwen3-30b-a3b").items() if k != "attention_bias"}
    cfg.update(model_type="qwen2_moe", shared_expert_intermediate_size=4096, mlp_only_layers=[0, 47])
    m = spec_from_config(cfg, "q")
    base = load_model("qwen3-30b-a3b")
    assert (m.num_moe_layers, m.num_dense_layers, m.shared_expert_gate) == (46, 2, True)
    assert m.attention_bias and not m.o_proj_bias and not m.qk_norm
    h, d = m.hidden_size, m.head_dim
    q_kv_bias = (m.num_heads + 2 * m.num_kv_heads) * d
    per_moe_layer = 3 * h * 4096 + h                                        # shared expert and its gate
    dense_mlp = 3 * h * m.intermediate_size
    moe_mlp = 128 * 3 * h * m.moe_intermediate_size + h * 128
    expected = (parameter_count(base) + 48 * (q_kv_bias - 2 * d) + 46 * per_moe_layer
                + 2 * (dense_mlp - moe_mlp))
    assert parameter_count(m) == pytest.approx(expected, rel=1e-12)
    router = next(o for o in optable.decode_step(m, Scenario.make(), 10).operators if o.name == "router")
    assert router.weight == h * 129                                         # 128 experts and the shared gate
    with pytest.raises(DseError) as e:
        spec_from_config({**cfg, "mlp_only_layers": [48]}, "q", "q.json")
    assert_one_line(e.value, "q.json", ": mlp_only_layers[0]: ", "from 0 to 47")


def test_dbrx_nested_fields():
    # field mapping only (no public DBRX config could be shipped): a small config of the DBRX layout
    cfg = {"model_type": "dbrx", "d_model": 512, "n_heads": 8, "n_layers": 4, "max_seq_len": 1024, "vocab_size": 1000,
           "attn_config": {"kv_n_heads": 2, "clip_qkv": 8}, "ffn_config": {"ffn_hidden_size": 768,
                                                                          "moe_num_experts": 16, "moe_top_k": 4}}
    m = spec_from_config(cfg, "d")
    assert (m.num_kv_heads, m.num_experts, m.experts_per_token, m.moe_intermediate_size) == (2, 16, 4, 768)
    assert (m.norm_type, m.norm_bias, m.max_position_embeddings, m.num_moe_layers) == ("layernorm", False, 1024, 4)
    h = 512
    layer = 2 * h + h * (8 + 2 * 2) * 64 + h * h + h * 16 + 16 * 3 * h * 768
    assert parameter_count(m) == 2 * 1000 * h + h + 4 * layer
    for where, key in (("ffn_config", "moe_top_k"), ("attn_config", "kv_n_heads")):
        bad = {**cfg, where: {**cfg[where], key: 0}}
        with pytest.raises(DseError) as e:
            spec_from_config(bad, "d", "d.json")
        assert_one_line(e.value, "d.json", f": {where}.{key}: ", "got 0")


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_new_configs_refuse_bad_values_in_one_line(name, tmp_path):
    cfg = cfg_of(name)
    inner = cfg.get("text_config") if name.startswith("gemma-3") else None
    read = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
            "num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size", "n_routed_experts",
            "head_dim") + (("sliding_window",) if load_model(name).sliding_window else ())
    keys = [k for k in read if (inner or cfg).get(k) is not None]
    for i, key in enumerate(keys):
        for j, v in enumerate(bad_ints(key, (inner or cfg)[key], "llama")[:8]):
            body = {**cfg, "text_config": {**inner, key: v}} if inner else {**cfg, key: v}
            p = write(tmp_path / f"{i}-{j}" / "config.json", body)
            with pytest.raises(DseError) as e:
                load_model(str(p))
            assert_one_line(e.value, p, key)


# ------------------------------------------------------------------------------ sliding windows

def test_sliding_window_kv_cache_is_hand_calculation():
    # Gemma 2 9B at 8000 tokens: 21 global layers hold 8000 tokens, 21 sliding layers the last 4096;
    # a token is 2 (K, V) x 8 KV heads x 256 head_dim x 2 bytes (fp16) per layer
    m, sc = load_model("gemma-2-9b-it"), Scenario.make(batch=3, prompt_len=7900, gen_len=100)
    per_token = 2 * 8 * 256 * 2
    assert kv_cache_bytes_per_token(m, sc) == 42 * per_token
    assert kv_cache_bytes_per_sequence(m, sc) == (21 * 8000 + 21 * 4096) * per_token
    ev = evaluate({"model": "gemma-2-9b-it", "hardware": "h200", "batch": 3, "prompt_len": 7900, "gen_len": 100})
    assert ev["kv_cache_bytes"][0] == 3 * (21 * 8000 + 21 * 4096) * per_token
    # below the window every layer holds every token
    assert kv_cache_bytes_per_sequence(m, sc, 4000) == 42 * 4000 * per_token
    # Mistral-7B-v0.1: every layer slides (4096); gpt-oss-20b: 12 global layers, 12 of window 128
    assert kv_cache_bytes_per_sequence(load_model("mistral-7b"), sc, 10_000) == 32 * 4096 * 2 * 8 * 128 * 2
    assert (kv_cache_bytes_per_sequence(load_model("gpt-oss-20b"), sc, 10_000)
            == (12 * 10_000 + 12 * 128) * 2 * 8 * 64 * 2)


def test_pipeline_stage_with_most_global_layers_holds_the_kv():
    # Gemma 2 over 2 stages: layers 0-20 have 10 global ones (odd), layers 21-41 have 11
    m, sc = load_model("gemma-2-9b-it"), Scenario.make(prompt_len=7900, gen_len=100, pp=2)
    assert kv_cache_bytes_per_sequence(m, sc) == (11 * 8000 + 10 * 4096) * 2 * 8 * 256 * 2


def test_sliding_decode_attends_to_the_window_only():
    m = load_model("gemma-2-9b-it")
    for flash in (False, True):
        sc = Scenario.make(batch=2, flash_attention=flash)
        short = {o.name: o for o in optable.decode_step(m, sc, 1000, 228 * 1024).operators}
        long = {o.name: o for o in optable.decode_step(m, sc, 6000, 228 * 1024).operators}
        core = "flash_attention" if flash else "qk_matmul"
        assert short[core].kv_in == short["sliding_" + core].kv_in        # under the window: the same work
        assert long[core].kv_in == 2 * 6000 * 8 * 256 * (2 if flash else 1)
        assert long["sliding_" + core].kv_in == 2 * 4096 * 8 * 256 * (2 if flash else 1)
        assert (long[core].count, long["sliding_" + core].count) == (21, 21)


def test_flash_prefill_skips_keys_outside_the_window():
    m = load_model("gemma-2-9b-it")
    S, W, nh, d = 8000, 4096, 16, 256
    ops = {o.name: o for o in optable.prefill(m, Scenario.make(prompt_len=S, flash_attention=True),
                                              228 * 1024).operators}
    full, window = S * (S + 1) / 2, W * (W + 1) / 2 + (S - W) * W
    assert ops["flash_attention"].ops == pytest.approx(nh * full * (2 * 2 * d + 5))
    assert ops["sliding_flash_attention"].ops == pytest.approx(nh * window * (2 * 2 * d + 5))
    assert ops["sliding_flash_attention"].kv_in < ops["flash_attention"].kv_in


@pytest.mark.parametrize("name, prompt, gen, flash", [("gemma-2-9b-it", 4000, 300, True),
                                                      ("gemma-2-9b-it", 4000, 300, False),
                                                      ("gpt-oss-20b", 60, 200, True),
                                                      ("mistral-7b", 4090, 20, False),
                                                      ("mistral-7b", 5000, 20, False)])
def test_decode_over_the_window_is_the_sum_of_its_steps(name, prompt, gen, flash):
    # the closed form (two affine pieces once the window fills) equals pricing every step
    m, d = load_model(name), load_device("h100-sxm")
    sys, buf = system_arrays([d], 1), d.onchip_buffer_bytes if flash else 0.0
    sc = Scenario.make(batch=8, prompt_len=prompt, gen_len=gen, flash_attention=flash)
    for eff in (IDEAL, DEFAULT):
        steps = [step_time(OpArrays.from_table(optable.decode_step(m, sc, prompt + 1 + j, buf)), sys, eff)[0]
                 for j in range(gen - 1)]
        ev = evaluate({"model": name, "hardware": "h100-sxm", "batch": 8, "prompt_len": prompt, "gen_len": gen,
                       "flash_attention": flash}, ideal=eff is IDEAL, efficiency=None if eff is IDEAL else eff)
        assert ev["tpot_s"][0] * (gen - 1) == pytest.approx(sum(steps), rel=1e-9)
    pieces = optable.decode_pieces(m, sc, prompt + 1, buf)
    assert len(pieces) == (2 if prompt + 1 < m.sliding_window else 1)
    # a single piece where the window is already full has no growth in the sliding layers
    last = {o.name: o for o in pieces[-1][2].operators}
    assert all(o.kv_in == 0 and o.ops == 0 for n, o in last.items() if n.startswith("sliding_"))


# ------------------------------------------------------------------------------ context length

def test_context_longer_than_the_model_is_infeasible_with_a_reason():
    ev = evaluate({"model": ["llama-2-7b", "llama-2-7b", "gemma-2-9b-it"], "hardware": "h100-sxm",
                   "prompt_len": [3968, 4096, 8192], "gen_len": 128})
    assert list(ev.feasible) == [True, False, False]
    assert ev.reason_key(1) == ev.reason_key(2) == "context"
    text = ev.reason_text(1)
    assert "4096 + gen_len 128 = 4224 tokens" in text and "4096-token context" in text and "llama-2-7b" in text
    assert "\n" not in text
    # a point too long and too big for the device reports the context first
    big = evaluate({"model": "llama-2-70b", "hardware": "l40s", "prompt_len": 8000, "gen_len": 8})
    assert big.reason_key(0) == "context" and big.failed[CODE["device_memory"]][0]
    r = run_cli("analyze", "--model", "llama-2-7b", "--hardware", "h100-sxm", "--prompt-len", "4096")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    line, = r.stderr.strip().splitlines()
    assert line.startswith("dse.study: error:") and "--prompt-len 4096" in line and "max_position_embeddings" in line


def test_max_context_sets_a_longer_or_shorter_context():
    # max_context (an engine's --max-model-len with RoPE scaling) replaces the config's limit
    # both ways; the work priced is the same as at any context that admits the point
    ev = evaluate({"model": "llama-2-7b", "hardware": "h100-sxm", "prompt_len": 4096, "gen_len": 128,
                   "max_context": [0, 8192, 4224, 4223]})
    assert list(ev.feasible) == [False, True, True, False]
    assert "exceed max_context 4223" in ev.reason_text(3)
    assert ev["tpot_s"][1] == ev["tpot_s"][2]
    short = evaluate({"model": "llama-2-7b", "hardware": "h100-sxm", "prompt_len": 1024, "max_context": [0, 1100]})
    assert list(short.feasible) == [True, False]
    r = run_cli("analyze", "--model", "llama-2-7b", "--hardware", "h100-sxm", "--prompt-len", "4096",
                "--max-context", "8192")
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_every_new_model_evaluates(name):
    m = load_model(name)
    devices = next(d for d in (4, 2, 1) if m.num_heads % d == 0 and m.num_kv_heads % d == 0)   # phi-4: 10 K/V heads
    ev = evaluate({"model": name, "hardware": "h200", "devices": devices, "batch": 4, "prompt_len": 2048,
                   "gen_len": 64, "weights": "fp8", "kv": "fp8", "flash_attention": True})
    assert ev.reason_key(0) in ("", "device_memory"), ev.reason_text(0)
    assert np.isfinite(ev["tpot_s"][0]) and ev["tpot_s"][0] > 0
    assert m.max_position_embeddings >= 2048 + 64
