"""The efficiency model's behaviour, independently of the measured data: fractions in
(0, 1], larger GEMMs never less efficient, predictions monotone in bandwidth and
compute, the ideal bound untouched, per-class defaults and the calibration file."""
from dataclasses import replace

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from basis.errors import DseError
from dse.core import efficiency as E
from dse.core.efficiency import IDEAL, Efficiency, efficiency_for
from dse.core.metrics import serving_metrics
from dse.core.roofline import PEAK_COLUMNS, PIM_ROLES, OpArrays
from dse.system.analysis import analyze
from hwmodels.presets import load_device
from workloads.model import load_model
from workloads.scenario import Scenario

TENSOR = [i for i, c in enumerate(PEAK_COLUMNS) if c not in ("vector", "none")]

fractions = st.floats(0.05, 1.0)
efficiencies = st.builds(
    Efficiency, compute=fractions, memory=fractions, op_overhead_s=st.floats(0, 1e-4),
    step_overhead_s=st.floats(0, 1e-2), collective=fractions, compute_half_ops=st.floats(0, 1e12),
    compute_narrow=st.none() | fractions, compute_half_rows=st.floats(0, 1e3), memory_half_bytes=st.floats(0, 1e9),
    attention_compute=st.none() | fractions, attention_memory=st.none() | fractions,
    attention_kv_reads=st.floats(1, 64), kv_reread_exponent=st.floats(0, 1), vector_compute=st.none() | fractions,
    request_overhead_s=st.floats(0, 1e-2))


def _ops(ops, w, a, kv, col, role):
    n = len(ops)
    z = np.zeros(n)
    return OpArrays(np.asarray(ops, float), np.asarray(w, float), np.asarray(a, float), np.asarray(kv, float), z, z,
                    np.asarray(col, int), np.ones(n), np.zeros(n, bool), np.asarray(role, int))


def _matmul(m, k, n, elem=2.0, col=PEAK_COLUMNS.index("fp16")):
    """An (m x k) by (k x n) weight matmul as the operator table prices it."""
    return 2.0 * m * k * n, k * n * elem, (m * k + m * n) * elem, col


@settings(max_examples=200, deadline=None)
@given(eff=efficiencies, data=st.data())
def test_fractions_stay_in_unit_interval(eff, data):
    n = data.draw(st.integers(1, 12))
    sizes = st.floats(0, 1e13) | st.just(0.0)
    op = _ops([data.draw(sizes) for _ in range(n)], [data.draw(sizes) for _ in range(n)],
              [data.draw(sizes) for _ in range(n)], [data.draw(sizes) for _ in range(n)],
              [data.draw(st.integers(0, len(PEAK_COLUMNS) - 1)) for _ in range(n)],
              [data.draw(st.integers(-1, len(PIM_ROLES) - 1)) for _ in range(n)])
    for f in (eff.compute_fraction(op), eff.memory_fraction(op), IDEAL.compute_fraction(op),
              efficiency_for("gpu").memory_fraction(op)):
        f = np.broadcast_to(f, (n,))
        assert np.all(np.isfinite(f)) and np.all(f > 0) and np.all(f <= 1)


@settings(max_examples=200, deadline=None)
@given(eff=efficiencies, m=st.integers(1, 1 << 16), k=st.integers(1, 1 << 15), n=st.integers(1, 1 << 15),
       grow=st.sampled_from("mkn"), factor=st.integers(2, 64), col=st.sampled_from(TENSOR))
def test_larger_gemms_never_get_a_lower_fraction(eff, m, k, n, grow, factor, col):
    big = dict(m=m, k=k, n=n)
    big[grow] *= factor
    elem = {"fp8": 1.0, "int8": 1.0, "fp4": 0.5, "int4": 0.5, "fp6": 0.75}.get(PEAK_COLUMNS[col], 2.0)
    small_op = _ops(*map(lambda x: [x], _matmul(m, k, n, elem, col)[:3]), [0], [col], [1])
    big_op = _ops(*map(lambda x: [x], _matmul(**big, elem=elem, col=col)[:3]), [0], [col], [1])
    for frac in (eff.compute_fraction, eff.memory_fraction, efficiency_for("gpu").compute_fraction):
        assert frac(big_op)[0] >= frac(small_op)[0] * (1 - 1e-12)


def test_skinny_gemms_reach_less_than_square_ones():
    d = efficiency_for("gpu")
    col = PEAK_COLUMNS.index("fp16")
    gemv = _ops(*map(lambda x: [x], _matmul(1, 8192, 8192)[:3]), [0], [col], [1])
    square = _ops(*map(lambda x: [x], _matmul(8192, 8192, 8192)[:3]), [0], [col], [1])
    if d.compute_half_rows > 0:
        assert d.compute_fraction(gemv)[0] < d.compute_fraction(square)[0]
    assert d.compute_fraction(square)[0] == pytest.approx(d.compute, rel=0.02)   # 2,731 effective rows


def test_ideal_is_the_pure_bound():
    op = _ops([1e12, 0, 5e9], [1e9, 0, 2e6], [1e6, 1e6, 0], [0, 0, 1e9], [3, len(PEAK_COLUMNS) - 2, 3], [1, -1, 0])
    assert np.all(IDEAL.compute_fraction(op) == 1) and np.all(IDEAL.memory_fraction(op) == 1)
    assert IDEAL.op_overhead_s == IDEAL.step_overhead_s == IDEAL.collective_latency_s == 0
    assert IDEAL.request_overhead_s == 0 and IDEAL.prefill_decode_overlap == 0 and IDEAL.collective == 1


def _scaled(device, bw=1.0, compute=1.0):
    """``device`` with ``bw`` x its bandwidth and ``compute`` x its peaks, its power limit lifted: the
    same joules per op and per bit at a faster rate need more power, and a design over its TDP is
    infeasible (reason ``power``), which is not what the monotonicity of speed is about."""
    tiers = (replace(device.memory, bandwidth_bytes_per_s=device.memory.bandwidth_bytes_per_s * bw),
             *device.memory_tiers[1:])
    return replace(device, memory_tiers=tiers, vector_ops_per_s=device.vector_ops_per_s * compute,
                   peak_ops_per_s={k: v * compute for k, v in device.peak_ops_per_s.items()}, tdp_w=None)


THROUGHPUTS = ("output_tokens_per_s", "output_tokens_per_s_per_user", "prefill_tokens_per_s")
LATENCIES = ("ttft_s", "tpot_s", "e2e_latency_s")


@settings(max_examples=25, deadline=None)
@given(model=st.sampled_from(["llama-2-7b", "llama-2-70b", "mixtral-8x7b"]),
       hw=st.sampled_from(["h100-sxm", "a100-80gb", "rtx-4090"]), batch=st.integers(1, 256),
       prompt=st.integers(1, 3584), gen=st.integers(1, 512), tp=st.sampled_from([1, 2, 4]),
       flash=st.booleans(), knob=st.sampled_from(["bw", "compute"]), factor=st.floats(1.01, 8.0))
def test_predictions_monotone_in_bandwidth_and_compute(model, hw, batch, prompt, gen, tp, flash, knob, factor):
    m, d = load_model(model), load_device(hw)
    tp = 1 if hw == "rtx-4090" else tp          # no NVLink
    sc = Scenario.make(batch=batch, prompt_len=prompt, gen_len=gen, weights="fp8" if hw != "a100-80gb" else "fp16",
                       activations="fp16", kv="fp16", flash_attention=flash, tp=tp)
    base = analyze(m, _scaled(d), sc).summary          # the same lifted power limit as the faster one
    faster = analyze(m, _scaled(d, **{knob: factor}), sc).summary
    for k in THROUGHPUTS:
        assert faster[k] >= base[k] * (1 - 1e-12), k
    for k in LATENCIES:
        assert faster[k] <= base[k] * (1 + 1e-12), k


def test_default_is_derated_from_the_ideal():
    m, d = load_model("llama-2-7b"), load_device("h100-sxm")
    sc = Scenario.make(batch=16, prompt_len=512, gen_len=64, weights="fp8", activations="fp8", kv="fp8",
                       flash_attention=True)
    ideal, default = analyze(m, d, sc, ideal=True).summary, analyze(m, d, sc).summary
    assert default["efficiency"].startswith("prior gpu + calibrated engine vllm") and ideal["efficiency"] == "ideal"
    # a fitted value on its bound is named after the layer (the shipped fit has some: calibrate's AT BOUND)
    assert default["efficiency_source"].startswith("kernel layer: prior gpu; engine layer: calibrated engine vllm")
    assert default["output_tokens_per_s"] < ideal["output_tokens_per_s"]
    assert default["ttft_s"] > ideal["ttft_s"] and default["tpot_s"] > ideal["tpot_s"]


def test_family_defaults_never_borrow_another_familys_fit():
    assert efficiency_for(load_device("h100-sxm")) == efficiency_for("gpu")
    assert efficiency_for("gpu").name == "prior gpu"          # the kernel layer is never fitted end to end
    acc = efficiency_for("accelerator")               # its own prior, not the gpu fit
    assert acc.name == "prior accelerator" and (acc.compute, acc.memory) == (0.70, 0.90)
    assert efficiency_for("cpu").name == "prior cpu" and efficiency_for("cpu").memory == 0.70
    soc, apple = efficiency_for("soc"), efficiency_for("apple")     # the class of Apple's SoCs: the family's figures
    assert soc.name == "prior soc" and (soc.compute, soc.memory) == (apple.compute, apple.memory)
    assert E.DEFAULT == efficiency_for("gpu")
    with pytest.raises(DseError, match="hardware family 'fpga'"):
        efficiency_for("fpga")


def test_calibration_file_is_read_and_checked(tmp_path):
    p = tmp_path / "cal.yaml"
    p.write_text("classes:\n  gpu:\n    compute: {value: 0.42, note: fitted}\n    memory: 0.77\n")
    e = efficiency_for("gpu", path=str(p))
    assert e.compute == 0.42 and e.memory == 0.77 and e.resolved("attention_compute") == 0.42
    assert efficiency_for("cpu", path=str(p)).name == "prior cpu"
    p.write_text("classes:\n  gpu:\n    speed: {value: 2}\n")
    with pytest.raises(DseError, match=r"cal\.yaml: (classes|families)\.gpu\.speed: unknown parameter"):
        efficiency_for("gpu", path=str(p))
    p.write_text("classes:\n  gpu:\n    compute: {value: 1.5}\n")
    with pytest.raises(DseError, match=r"cal\.yaml: classes\.gpu\.compute: must be from 0\.001 to 1, got 1\.5"):
        efficiency_for("gpu", path=str(p))
    p.write_text("classes: [1, 2")
    with pytest.raises(DseError, match="not valid YAML"):
        efficiency_for("gpu", path=str(p))


def test_calibration_from_the_environment_and_missing_file(tmp_path, monkeypatch):
    # DSE_CALIBRATION replaces the shipped calibration for every default; a file that is not there
    # is an error naming it, never a silent fall back to the priors
    p = tmp_path / "cal.yaml"
    engine_layer = {k: v for k, v in E.load_calibration().items() if k in E.ENGINE_SIDE}   # only memory differs
    p.write_text(yaml.safe_dump({"classes": {"gpu": {"memory": {"value": 0.45, "note": "test"}}}, **engine_layer}))
    monkeypatch.setenv(E.CALIBRATION_ENV, str(p))
    assert E.calibration_file() == p and efficiency_for("gpu").memory == 0.45
    slow = analyze(load_model("llama-2-7b"), "h100-sxm", Scenario.make(batch=1, gen_len=64)).summary["tpot_s"]
    monkeypatch.setenv(E.CALIBRATION_ENV, str(tmp_path / "gone.yaml"))
    with pytest.raises(DseError, match=r"gone\.yaml: cannot read the calibration file.*DSE_CALIBRATION"):
        efficiency_for("gpu")
    monkeypatch.delenv(E.CALIBRATION_ENV)
    shipped = efficiency_for("gpu")
    fast = analyze(load_model("llama-2-7b"), "h100-sxm", Scenario.make(batch=1, gen_len=64)).summary["tpot_s"]
    assert slow > fast * (1 + 0.5 * (shipped.memory / 0.45 - 1))    # batch-1 decode streams weights
    with pytest.raises(DseError, match="cannot read the calibration file"):
        efficiency_for("gpu", path=str(tmp_path / "gone.yaml"))


def test_shipped_calibration_notes_every_fitted_value():
    # the engine layer fitted over every measured file dse ships with the kernel layer held fixed
    # (no hardware family fitted end to end): each value noted, cross-validated by source and
    # engine, every fold counted, with error bands and their coverage
    data = E.load_calibration()
    assert not data["families"] and "gpu" in data["kernel_layer"]["families"]
    assert data["engines"]["vllm"], "configs/calibration.yaml has no fitted engine values"
    assert "data/measured_calibration.csv" in data["fitted"]["measured"] and len(data["fitted"]["measured"]) >= 4
    for section in ("launch", "allreduce", "engines"):
        for group, values in data[section].items():
            for k, v in values.items():
                assert "fitted" in v["note"] and "APE" in v["note"], (section, group, k)
    cv = data["cross_validation"]
    assert {"leave_sources_out", "leave_engines_out"} <= set(cv)
    assert cv["leave_sources_out"]["all"]["n"] > 200
    t = cv["leave_sources_out"]["totals"]
    assert t["predicted_rows"] + t["failed_rows"] == t["rows"] == data["fitted"]["rows"]["predicted"]
    assert data["bands"] and 0.5 < data["band_coverage"]["covered"] <= 1.0
    assert "at_bound" in data and "trt-llm" in data["prior_engines"]


@pytest.mark.parametrize("bad", [dict(compute=0.0), dict(memory=1.5), dict(op_overhead_s=-1e-6),
                                 dict(attention_kv_reads=0.5), dict(prefill_decode_overlap=2.0),
                                 dict(kv_reread_exponent=-0.1)])
def test_invalid_parameters_are_rejected(bad):
    with pytest.raises(ValueError):
        Efficiency(**bad)


def test_request_overhead_and_overlap_in_metrics():
    base = serving_metrics(np.array([2.0]), np.array([6.0]), 4, 100, 4, 1)
    req = serving_metrics(np.array([2.0]), np.array([6.0]), 4, 100, 4, 1, request_overhead_s=0.5)
    assert req["ttft_s"][0] == 2.5 and req["e2e_latency_s"][0] == 8.5 and req["tpot_s"][0] == base["tpot_s"][0]
    # full overlap: of 4 requests, 3 decode under another's prefill, so 3/4 of the 2 s prefill is hidden
    full = serving_metrics(np.array([2.0]), np.array([6.0]), 4, 100, 4, 1, overlap=1.0)
    assert full["e2e_latency_s"][0] == 6.5 and full["ttft_s"][0] == 2.0
    assert full["output_tokens_per_s"][0] == pytest.approx(16 / 6.5)
    alone = serving_metrics(np.array([2.0]), np.array([6.0]), 1, 100, 4, 1, overlap=1.0)
    assert alone["e2e_latency_s"][0] == 8.0          # one request: nothing to hide its prefill under
    assert base["e2e_latency_s"][0] == 8.0
