"""The large MoE models of 2026 (issue 44): Kimi-K2 (read as DeepSeek-V3 by its architecture), Llama 4
Scout and Maverick (text decoder of a multimodal config: MoE layers interleaved with dense ones, a
shared expert, chunked attention) and the MoE configs shipped before them. Every shipped config loads,
its parameter counts match the published figures (configs/models/SOURCES.md), Llama 4's chunked
layers cache and read at most one chunk, and DeepSeek-V3.2 is read with its sparse attention, never
as V3."""
import json

import pytest
from conftest import run_cli
from test_model_config_validation import assert_one_line, write

from basis.errors import DseError
from dse import evaluate
from dse.core.efficiency import IDEAL
from dse.core.roofline import OpArrays, step_time
from dse.system.hardware import system_arrays
from hwmodels.presets import load_device
from workloads import optable
from workloads.footprint import active_parameter_count, kv_cache_bytes_per_sequence, parameter_count
from workloads.model import MODELS_DIR, load_model
from workloads.scenario import Scenario

KIMI, SCOUT, MAVERICK = "kimi-k2-instruct", "llama-4-scout-17b-16e-instruct", "llama-4-maverick-17b-128e-instruct"

#: name: (published total, published active, relative tolerance). Sources (configs/models/SOURCES.md):
#: - Kimi-K2: Kimi Team, "Kimi K2: Open Agentic Intelligence", arXiv:2507.20534 (July 2025), the
#:   architecture compared with DeepSeek-V3: 1.04 T total, 32.6 B activated; the model card
#:   https://huggingface.co/moonshotai/Kimi-K2-Instruct rounds them to 1 T and 32 B.
#: - Llama 4: https://huggingface.co/meta-llama/Llama-4-Scout-17B-16E-Instruct and
#:   .../Llama-4-Maverick-17B-128E-Instruct model cards (table of the models: 17 B activated, 109 B and
#:   400 B total). The totals hold the vision encoder, which is not modelled (Scout's text decoder
#:   counts 107.8 B, 1.1 % under).
PUBLISHED_2026 = {
    KIMI: (1.04e12, 32.6e9, 0.02),
    SCOUT: (109e9, 17e9, 0.02),
    MAVERICK: (400e9, 17e9, 0.02),
}
#: the families they are read as, and the model_type their own config.json declares (kept unmodified)
FAMILY = {KIMI: ("deepseek_v3", "kimi_k2"), SCOUT: ("llama4_text", "llama4"), MAVERICK: ("llama4_text", "llama4")}


def cfg_of(name: str) -> dict:
    return json.loads((MODELS_DIR / f"{name}.json").read_text())


@pytest.mark.parametrize("name", sorted(PUBLISHED_2026))
def test_shipped_config_loads_as_its_family(name):
    m = load_model(name)
    family, own = FAMILY[name]
    assert m.model_type == family and m.is_moe
    assert cfg_of(name)["model_type"] == own
    assert f"`{name}.json`" in (MODELS_DIR / "SOURCES.md").read_text()


@pytest.mark.parametrize("name", sorted(PUBLISHED_2026))
def test_parameter_counts_match_published(name):
    total, active, tol = PUBLISHED_2026[name]
    m = load_model(name)
    assert parameter_count(m) == pytest.approx(total, rel=tol)
    assert active_parameter_count(m) == pytest.approx(active, rel=tol)


def test_deepseek_r1_active_parameters_match_published():
    # DeepSeek-R1 card (https://huggingface.co/deepseek-ai/DeepSeek-R1): "671B, 37B activated" (V3's architecture);
    # its total is checked in tests/test_models.py, V3's active count there too
    assert active_parameter_count(load_model("deepseek-r1")) == pytest.approx(37e9, rel=0.02)


def test_kimi_k2_is_deepseek_v3_by_architecture():
    m = load_model(KIMI)
    assert (m.num_experts, m.num_shared_experts, m.experts_per_token) == (384, 1, 8)
    assert m.attention_kind == "MLA" and m.num_moe_layers == 60 and m.num_dense_layers == 1
    assert any("kimi_k2" in n and "deepseek_v3" in n for n in m.notes)


def test_kimi_k2_without_its_architecture_is_refused(tmp_path):
    for archs in (["KimiK2ForCausalLM"], None):
        cfg = {k: v for k, v in cfg_of(KIMI).items() if k != "architectures"}
        if archs:
            cfg["architectures"] = archs
        p = write(tmp_path / "k.json", cfg)
        with pytest.raises(DseError) as e:
            load_model(str(p))
        assert_one_line(e.value, p, "architectures", "DeepseekV3ForCausalLM")


def test_llama4_closed_form_parameter_count():
    # Maverick from its card's architecture: 48 layers, hidden 5120, 40 query and 8 KV heads of 128,
    # MoE every 2nd layer (128 experts + 1 shared of width 8192, router 5120 x 128), dense layers of
    # width 16384, vocabulary 202048 untied, RMSNorm gains
    h, layers, q, kv, V = 5120, 48, 40 * 128, 8 * 128, 202048
    attn = h * q + 2 * h * kv + q * h
    moe = 128 * 3 * h * 8192 + 3 * h * 8192 + h * 128
    dense = 3 * h * 16384
    expected = layers * (attn + 2 * h) + 24 * moe + 24 * dense + 2 * V * h + h
    m = load_model(MAVERICK)
    assert parameter_count(m) == pytest.approx(expected, rel=1e-12)
    # one token: attention, the dense layers, one routed and the shared expert in each MoE layer
    assert active_parameter_count(m) == pytest.approx(expected - 24 * 127 * 3 * h * 8192, rel=1e-12)


def test_llama4_interleaved_moe_layers():
    mav, scout = load_model(MAVERICK), load_model(SCOUT)
    assert (mav.num_dense_layers, mav.num_moe_layers) == (24, 24)       # interleave_moe_layer_step 2
    assert (scout.num_dense_layers, scout.num_moe_layers) == (0, 48)    # step 1: MoE in every layer
    assert (mav.intermediate_size, mav.moe_intermediate_size, mav.shared_expert_intermediate_size) == (16384, 8192, 8192)
    assert (mav.experts_per_token, scout.num_experts) == (1, 16)
    ops = {o.name: o for o in optable.decode_step(mav, Scenario.make(batch=1), 100).operators}
    assert ops["gate_proj"].count == 24 and ops["expert_gate_proj"].count == 24 and ops["shared_gate_proj"].count == 24
    assert ops["gate_proj"].weight == 5120 * 16384 and ops["shared_gate_proj"].weight == 5120 * 8192


def test_llama4_chunked_layers_are_every_rope_layer():
    # no_rope_layers absent: every 4th layer (3, 7, ...) is NoPE and global, the other 36 chunked
    for name in (SCOUT, MAVERICK):
        m = load_model(name)
        assert m.chunked_attention and m.sliding_window == 8192
        assert set(range(48)) - set(m.sliding_layers) == set(range(3, 48, 4))
        assert any("vision" in n for n in m.notes)        # the vision tower is said to be left out


def test_chunked_attention_bounds_decode_kv_reads_and_cache():
    m, d, kv_heads = load_model(SCOUT), 128, 8
    sc = Scenario.make(batch=2, flash_attention=True)
    ops = {o.name: o for o in optable.decode_step(m, sc, 20_000, 228 * 1024).operators}
    assert ops["sliding_flash_attention"].count == 36 and ops["flash_attention"].count == 12
    assert ops["sliding_flash_attention"].kv_in == 2 * 8192 * 2 * kv_heads * d       # one chunk of K and V
    assert ops["flash_attention"].kv_in == 2 * 20_000 * 2 * kv_heads * d             # the whole context
    per_token = 2 * kv_heads * d * 2                                                # K and V, fp16
    assert kv_cache_bytes_per_sequence(m, sc, 20_000) == (12 * 20_000 + 36 * 8192) * per_token
    assert kv_cache_bytes_per_sequence(m, sc, 5_000) == 48 * 5_000 * per_token      # under the chunk: every token


def test_decode_across_the_chunk_is_the_sum_of_its_steps():
    # a decode from 8,180 to 8,219 keys: the chunked layers stop growing at 8,192, the closed form
    # (two affine pieces) equals pricing every step
    m, d = load_model(SCOUT), load_device("h200")
    prompt, gen = 8180, 40
    sc = Scenario.make(batch=4, prompt_len=prompt, gen_len=gen, flash_attention=True, tp=2)
    sys = system_arrays([d], 2)
    steps = [step_time(OpArrays.from_table(optable.decode_step(m, sc, prompt + 1 + j, d.onchip_buffer_bytes)),
                       sys, IDEAL)[0] for j in range(gen - 1)]
    ev = evaluate({"model": SCOUT, "hardware": "h200", "devices": 2, "tp": 2, "batch": 4, "prompt_len": prompt,
                   "gen_len": gen, "flash_attention": True}, ideal=True)
    assert ev["tpot_s"][0] * (gen - 1) == pytest.approx(sum(steps), rel=1e-9)
    assert len(optable.decode_pieces(m, sc, prompt + 1, d.onchip_buffer_bytes)) == 2


@pytest.mark.parametrize("change, key", [
    (lambda c: {k: v for k, v in c.items() if k != "text_config"}, "text_config"),
    (lambda c: {**c, "text_config": {**c["text_config"], "interleave_moe_layer_step": 0}},
     "text_config.interleave_moe_layer_step"),
    (lambda c: {**c, "text_config": {**c["text_config"], "no_rope_layers": [1, 2] + [1] * 46}},
     "text_config.no_rope_layers[1]"),
])
def test_bad_llama4_config_is_one_line_naming_file_and_key(tmp_path, change, key):
    p = write(tmp_path / "llama4.json", change(cfg_of(MAVERICK)))
    with pytest.raises(DseError) as e:
        load_model(str(p))
    assert_one_line(e.value, p, f": {key}: ")


def test_deepseek_v32_sparse_attention_is_read_with_its_indexer(tmp_path):
    # (issue 45: DSA is modelled, tests/test_sparse_attention.py); without its indexer fields it is refused
    cfg = {**cfg_of("deepseek-v3"), "model_type": "deepseek_v32", "architectures": ["DeepseekV32ForCausalLM"],
           "index_topk": 2048, "index_n_heads": 64, "index_head_dim": 128}
    assert load_model(str(write(tmp_path / "v32.json", cfg))).index_topk == 2048
    p = write(tmp_path / "v32-bare.json", {k: v for k, v in cfg.items() if k != "index_topk"})
    with pytest.raises(DseError) as e:
        load_model(str(p))
    assert_one_line(e.value, p, ": index_topk: ")


def test_analyze_says_the_vision_encoder_is_not_modelled():
    # Maverick's shipped config has no vision_config (Scout's has one since issue 45: tests/test_vision_encoder.py)
    r = run_cli("analyze", "--model", MAVERICK, "--hardware", "h100-sxm", "--devices", "8", "--weights", "fp8",
                "--batch", "1", "--prompt-len", "1024", "--gen-len", "16", timeout=120)
    assert r.returncode == 0, r.stderr
    assert "vision encoder" in r.stderr and "not modelled" in r.stderr
