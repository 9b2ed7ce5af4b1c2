"""The kernel layer wired into the evaluator (``kernel_layer``: 'fitted' or 'learned'): on a GPU,
'learned' prices each matmul and fused attention at the kernel model's time of its shape on the
point's hardware (``dse.core.kernel_model``); other hardware classes keep their fractions; every
prediction says which layer's values it used (``kernel_source``)."""
import subprocess
import sys

import numpy as np
import pytest

from basis.errors import DseError
from dse import evaluate
from dse.core.efficiency import Efficiency
from dse.core.kernel_model import (
    context_attention_time,
    gemm_time,
    generation_attention_time,
    hardware_of,
    load_kernel_model,
)
from dse.system import evaluator

#: Llama-3.1-8B (its config.json): hidden 4096, 32 query and 8 K/V heads of 128, MLP 14336, vocabulary 128256
HIDDEN, HEADS, KV_HEADS, HEAD, MLP, VOCAB = 4096, 32, 8, 128, 14336, 128256
#: H100 SXM as the evaluator sees it: configs/hardware/h100-sxm.yaml's dense BF16 and FP8 peaks and HBM3
#: bandwidth; its SM count and L2 from the kernel tables' description (configs/kernel_model.yaml, hardware.h100_sxm)
H100 = hardware_of(989.5e12, 1979e12, 1979e12, 3.35e12, sms=132, l2_bytes=52428800)
#: no engine costs: a row's time is its kernel time alone
BARE = Efficiency(name="bare", op_overhead_s=0.0, step_overhead_s=0.0)


def _rows(stage: str, **columns) -> dict:
    point = {"hardware": "h100-sxm", "model": "llama-3.1-8b", "batch": 8, "prompt_len": 1024, "gen_len": 2,
             "kernel_layer": "learned", **columns}
    ev = evaluate(point, efficiency=BARE, explain=[0])
    return {r["name"]: r for r in ev.explained[0][stage]}


def test_a_decode_steps_gemms_take_the_kernel_models_time_of_their_shapes():
    prm = load_kernel_model()["parameters"]["gemm"]
    rows = _rows("decode")
    # batch 8 decoding one token each: m = 8 rows, weights n x k, 16-bit
    for name, n, k in (("q_proj", HIDDEN, HIDDEN), ("k_proj", KV_HEADS * HEAD, HIDDEN), ("gate_proj", MLP, HIDDEN),
                       ("down_proj", HIDDEN, MLP), ("lm_head", VOCAB, HIDDEN)):
        expected = float(gemm_time(8, n, k, "bf16", H100, prm))
        assert rows[name]["time_s"] == pytest.approx(expected, rel=1e-9), name
    # a GEMM-dominated step: the weight matmuls take most of it
    gemms = sum(r["total_time_s"] for name, r in rows.items() if name.endswith("_proj") or name == "lm_head")
    assert gemms > 0.7 * sum(r["total_time_s"] for r in rows.values())
    # the same GEMM on the fitted layer is another figure (the family's fractions)
    fitted = {r["name"]: r for r in evaluate({"hardware": "h100-sxm", "model": "llama-3.1-8b", "batch": 8,
                                              "prompt_len": 1024, "gen_len": 2}, efficiency=BARE,
                                             explain=[0]).explained[0]["decode"]}
    assert fitted["q_proj"]["time_s"] != pytest.approx(rows["q_proj"]["time_s"], rel=1e-3)


def test_fused_attention_takes_the_kernel_models_decode_and_prefill_time():
    prm = load_kernel_model()["parameters"]
    softmax = (4 * HEAD + 5) / (4 * HEAD)          # the operator's softmax ops over the kernel's 4 b h s d
    decode = _rows("decode")["flash_attention"]
    keys = decode["ops"] / ((4 * HEAD + 5) * 8 * HEADS)      # keys each query attends in the step explained
    assert keys == pytest.approx(round(keys)) and 1024 <= keys <= 1026
    expected = float(generation_attention_time(8, round(keys), HEADS, KV_HEADS, HEAD, 2.0, H100,
                                               prm["generation_attention"])) * softmax
    assert decode["time_s"] == pytest.approx(expected, rel=1e-9)
    prefill = _rows("prefill", batch=2, prompt_len=512)["flash_attention"]
    expected = float(context_attention_time(2, 512, HEADS, KV_HEADS, HEAD, "bf16", H100, prm["context_attention"]))
    assert prefill["time_s"] == pytest.approx(expected * softmax, rel=1e-9)


def _sources(**columns) -> list:
    ev = evaluate(columns)
    codes, names = ev.labels["kernel_source"]
    return [names[c] for c in np.broadcast_to(codes, (len(ev),))]


def test_each_prediction_says_which_layer_priced_it():
    base = {"model": "llama-3.1-8b", "batch": 4, "prompt_len": 256, "gen_len": 16}
    hw = np.array(["h100-sxm", "h100-sxm", "mi300x", "a100-80gb", "xeon-spr"], dtype=object)
    bw = np.array([np.nan, 6e12, np.nan, np.nan, np.nan])       # the second: a hypothetical H100 of twice the bandwidth
    got = _sources(**base, hardware=hw, memory_bandwidth=bw, kernel_layer="learned")
    assert got[:4] == ["measured tables", "learned transfer", "learned transfer", "learned transfer"]
    assert got[4] not in ("measured tables", "learned transfer")      # a CPU keeps its own fractions
    # without the learned layer the hardware layer is its family's cited prior (no fraction is fitted end to end)
    assert set(_sources(**base, hardware=hw[:4], memory_bandwidth=bw[:4])) == {"prior"}


def test_other_hardware_classes_keep_todays_path():
    columns = {"hardware": np.array(["tpu-v5e", "xeon-spr", "gaudi2"], dtype=object), "model": "llama-2-7b",
               "batch": 4, "prompt_len": 256, "gen_len": 32}
    fitted, learned = evaluate(columns), evaluate({**columns, "kernel_layer": "learned"})
    for k in ("ttft_s", "tpot_s", "output_tokens_per_s"):
        np.testing.assert_array_equal(fitted[k], learned[k], err_msg=k)


def test_the_kernel_layer_refuses_another_value_in_one_line(tmp_path):
    """evaluate names where the columns came from (as for serving, engine ...); a study file's
    refusal names the file."""
    with pytest.raises(DseError) as e:
        evaluate({"hardware": "h100-sxm", "model": "llama-3.1-8b", "kernel_layer": "measured"})
    assert str(e.value) == "columns: kernel_layer: expected one of fitted, learned, got 'measured'"
    study = tmp_path / "s.yaml"
    study.write_text("name: s\nspace:\n  hardware: h100-sxm\n  model: llama-3.2-1b-instruct\n  batch: 1\n"
                     "  kernel_layer: [fitted, nope]\nobjectives:\n  tpot_s: min\nmethod: grid\n")
    said = subprocess.run([sys.executable, "-m", "dse.study", "run", str(study), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True)
    assert said.returncode == 2 and said.stderr.strip().endswith(
        f"{study}: space: kernel_layer: expected one of fitted, learned, got 'nope'")
    run = subprocess.run([sys.executable, "-m", "dse.study", "analyze", "--model", "llama-3.1-8b", "--hardware",
                          "h100-sxm", "--kernel-layer", "measured"], capture_output=True, text=True)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "--kernel-layer" in run.stderr and "'fitted', 'learned'" in run.stderr


def test_a_sweep_of_many_designs_prices_as_one_design_at_a_time(monkeypatch):
    # many distinct hardwares are priced at fractions per point and operator; few, one part each:
    # the same figures either way
    rng = np.random.default_rng(5)
    n = 40
    columns = {"hardware": "h100-sxm", "model": "llama-2-7b", "kernel_layer": "learned", "batch": rng.choice([1, 8, 64], n),
               "prompt_len": rng.choice([128, 1024], n), "gen_len": 32,
               "memory_bandwidth": rng.choice([2e12, 3.35e12, 8e12], n), "peak_fp16": rng.choice([5e14, 2e15], n)}
    monkeypatch.setattr(evaluator, "KERNEL_SPLIT_POINTS", 10**9)
    per_point = evaluate(columns)
    monkeypatch.setattr(evaluator, "KERNEL_SPLIT_POINTS", 0)
    one_by_one = evaluate(columns)
    for k in ("ttft_s", "tpot_s", "output_tokens_per_s"):
        np.testing.assert_allclose(per_point[k], one_by_one[k], rtol=1e-9, err_msg=k)
    assert per_point.labels["kernel_source"][0].tolist() == one_by_one.labels["kernel_source"][0].tolist()


def test_continuous_batching_over_many_designs_is_priced_design_by_design():
    # an in-flight-batching engine prices iterations on rows of its points: never fractions of
    # another row's hardware
    rng = np.random.default_rng(2)
    n = 30
    columns = {"hardware": "h100-sxm", "model": "llama-3.1-8b", "weights": "fp8", "kv": "fp8", "prompt_len": 1024,
               "gen_len": 128, "serving": "continuous", "concurrency": rng.choice([1, 64], n),
               "memory_bandwidth": rng.uniform(2e12, 8e12, n), "kernel_layer": "learned"}
    ev = evaluate(columns)
    assert np.all(np.isfinite(ev["tpot_s"]))
    one = evaluate({k: (v[:1] if isinstance(v, np.ndarray) else v) for k, v in columns.items()})
    assert one["tpot_s"][0] == pytest.approx(ev["tpot_s"][0], rel=1e-9)


def test_a_weight_only_quantized_gemv_streams_its_own_bytes():
    # INT4 weights under 16-bit activations run a 16-bit GEMM (no W4A16 format in the tables): where
    # memory binds, the kernel's time of the 16-bit shape scaled by the bytes the operator moves
    prm = load_kernel_model()["parameters"]["gemm"]
    bf16 = float(gemm_time(1, HIDDEN, HIDDEN, "bf16", H100, prm))
    for weights in ("fp16", "int4"):
        row = _rows("decode", model="llama-2-7b", batch=1, weights=weights)["q_proj"]
        moved = (HIDDEN * HIDDEN + 2 * HIDDEN) * 2.0          # the 16-bit GEMM's weights, input and output
        assert row["bound"] == "memory"
        assert row["time_s"] == pytest.approx(bf16 * row["memory_bytes"] / moved, rel=1e-9)
        if weights == "int4":                                   # about a quarter of the 16-bit time
            assert 0.2 < row["time_s"] / bf16 < 0.3
