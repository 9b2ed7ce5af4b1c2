"""Engine profiles, hardware families and error bands (issue: predictions across vendors and engines)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import yaml
from conftest import run_cli

from basis.errors import DseError
from dse.core import bands as B
from dse.core.efficiency import Efficiency, efficiency_for
from dse.core.engines import default_engine, engine_efficiency, engine_matching, engines, get_engine
from dse.fit import validate as V
from dse.system.evaluator import evaluate


def test_profiles_load_with_a_source_for_every_attribute():
    profiles = engines()
    assert {"vllm", "sglang", "tgi", "trt-llm", "trt-llm-legacy", "llama.cpp", "lmdeploy", "mlc-llm", "gaudi",
            "jetstream"} <= set(profiles)
    for e in profiles.values():
        named = dict(e.sources)
        assert all(named.get(k) for k in ("batching", "graphs", "attention", "allreduce")), e.name
    assert default_engine() == "vllm" and get_engine("default").name == "vllm"
    with pytest.raises(DseError, match="unknown engine 'nope'; known: default"):
        get_engine("nope")


@pytest.mark.parametrize("framework, engine", [
    ("TensorRT-LLM v0.5.0 (static batch)", "trt-llm-legacy"),
    ("TensorRT-LLM v0.6.1 (static batch, gptSessionBenchmark)", "trt-llm-legacy"),
    ("TensorRT-LLM trtllm-bench (PyTorch backend)", "trt-llm"),
    ("sglang 0.4.1", "sglang"), ("vllm 0.6.0", "vllm"), ("tt-metal vllm", "tt-metal"),
    ("llama.cpp Metal (llama-bench)", "llama.cpp"), ("FlexGen", "flexgen"), ("optimum-habana 1.6", "gaudi"),
    ("transformers-neuronx 2.18", "neuron"), ("mlx-lm 0.19", "mlx-lm"),
])
def test_a_measured_rows_framework_selects_its_profile(framework, engine):
    assert engine_matching(framework).name == engine


def _calibration(tmp_path, **sections) -> str:
    p = tmp_path / "cal.yaml"
    p.write_text(yaml.safe_dump({"families": {"gpu": {"compute": {"value": 0.6}, "memory": {"value": 0.8}}},
                                 **sections}))
    return str(p)


def test_launch_cost_is_paid_once_per_operator_instance(tmp_path, monkeypatch):
    """Two engines that differ only in their launch class: the decode step differs by the launch
    costs' difference times the operator instances of one decode step (independently counted from
    the step's own operator table)."""
    eager, graphs = 2e-5, 1e-6
    monkeypatch.setenv("DSE_CALIBRATION", _calibration(
        tmp_path, launch={"eager": {"op_overhead_s": {"value": eager}}, "graphs": {"op_overhead_s": {"value": graphs}}}))
    cols = {"model": ["llama-3.1-8b"] * 2, "hardware": ["h100-sxm"] * 2, "engine": ["hf-transformers", "vllm"],
            "batch": [1, 1], "prompt_len": [512] * 2, "gen_len": [2] * 2, "flash_attention": [True] * 2}
    ev = evaluate(cols, explain=[0])
    decode = ev.explained[0]["decode"]
    instances = sum(r["count"] for r in decode)
    assert ev["tpot_s"][0] - ev["tpot_s"][1] == pytest.approx((eager - graphs) * instances, rel=1e-6)
    assert "hf-transformers" in ev.efficiency_name(0) and "vllm" in ev.efficiency_name(1)


def test_per_head_kv_reads_multiply_the_attention_traffic():
    """A legacy kernel reading K/V once per query head moves group ** exponent times the cache."""
    base = Efficiency(compute=0.5, memory=0.8, kv_reread_exponent=0.5)
    legacy, modern = get_engine("trt-llm-legacy"), get_engine("trt-llm")
    assert engine_efficiency(base, legacy, 8.0, parameters={}).attention_kv_reads == 8.0
    assert engine_efficiency(base, modern, 8.0, parameters={}).attention_kv_reads == 1.0
    frac = engine_efficiency(base, legacy, 8.0, parameters={}).resolved("attention_memory") / 8.0 ** 0.5
    assert frac == pytest.approx(0.8 / math.sqrt(8.0))


def test_a_family_never_borrows_another_familys_fit(tmp_path):
    path = _calibration(tmp_path)
    assert efficiency_for("gpu", path=path).name == "calibrated gpu"
    tpu = efficiency_for("tpu", path=path)
    assert tpu.name == "prior tpu" and tpu.compute == 0.70 and tpu.memory == 0.90
    assert efficiency_for("gaudi", path=path).compute == pytest.approx(418.7 / 432, abs=1e-3)  # measured MAMF
    with pytest.raises(DseError, match="families.fpga: unknown hardware family"):
        p = tmp_path / "bad.yaml"
        p.write_text(yaml.safe_dump({"families": {"fpga": {"compute": {"value": 0.5}}}}))
        efficiency_for("gpu", path=str(p))


def test_bands_are_conformal_quantiles_of_the_residuals_and_widen_when_a_slice_is_small():
    rng = np.random.default_rng(1)
    r = rng.normal(0.0, 0.2, 400)
    engines_ = np.array(["vllm"] * 397 + ["tgi"] * 3)
    vendors = np.array(["amd"] * 200 + ["nvidia"] * 200)
    bands = B.bands_from(r, engines_, vendors, ["throughput"] * 400)
    lo, hi, where = B.band_for(bands, "vllm", "amd", "throughput")
    assert where == "engine=vllm vendor=amd family=throughput"
    k = int(np.ceil(201 * 0.95))                 # the conformal rank: the k-th residual from each end
    assert (lo, hi) == pytest.approx((np.exp(np.sort(r[:200])[200 - k]), np.exp(np.sort(r[:200])[k - 1])), rel=1e-3)
    # three tgi rows are too few: the band is the vendor's
    assert B.band_for(bands, "tgi", "nvidia", "throughput")[2] == "vendor=nvidia family=throughput"
    assert B.band_for({}, "vllm", "amd", "ttft")[2] == ""
    low, high, _ = B.band_for(bands, "vllm", "amd", "throughput")
    measured = np.exp(r[:200])                  # residual = log(measured / predicted) with predicted 1
    assert 0.85 <= B.covered(measured, 1.0, low, high).mean() <= 0.95


def test_engine_option_errors_are_one_line(tmp_path):
    r = run_cli("analyze", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--engine", "nope")
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert "unknown engine 'nope'" in r.stderr
    r = run_cli("list", "engines")
    assert r.returncode == 0 and "llama.cpp" in r.stdout and "one-shot" in r.stdout


def test_ideal_bound_holds_on_every_shipped_measured_row():
    """Under --ideal every measured throughput is at or below the prediction and every latency at
    or above it, on every row of the shipped dataset the model predicts."""
    checked = 0
    for path in V.measured_files():
        res = V.validate(path, ideal=True)
        broken = V.bound_violations(res.rows)
        assert not broken, [(r["id"], r["metric"], r["measured"], r["predicted"]) for r in broken]
        checked += len(res.rows)
    assert checked >= 100


def test_a_bad_row_is_reported_and_the_rest_go_on(tmp_path):
    p = tmp_path / "m.csv"
    p.write_text("id,model_slug,hardware_slug,devices,batch,prompt_len,gen_len,weights,activations,kv,metric,value\n"
                 "A1,llama-2-7b,a100-80gb,1,8,512,128,fp16,fp16,fp16,output_tokens_per_s,900\n"
                 "A2,llama-2-7b,a100-80gb,1,8,512,128,fp16,fp16,fp16,output_tokens_per_s,fast\n"
                 "A3,llama-2-7b,a100-80gb,1,8,512,,fp16,fp16,fp16,ttft_s,0.05\n")
    res = V.validate(p)
    assert [r["id"] for r in res.rows] == ["A1", "A3"]          # prefill-only metric without gen_len
    assert any("line 3: value: expected a positive number, got text that is not a number" in b for b in res.bad)
    out = tmp_path / "v"
    r = run_cli("validate", "--measured", p, "--out", out)
    assert r.returncode == 0 and "bad row skipped" in r.stderr and "line 3" in r.stderr
    header = (out / "validation.csv").read_text().splitlines()[0].split(",")
    assert {"id", "measured", "predicted", "ape", "unpredictable"} <= set(header)


def test_the_fit_prices_rows_as_the_written_calibration_will(tmp_path):
    """The efficiencies the fit evaluates at some values equal those the calibration file holding
    those values gives every later prediction (family prior, format ratios, engine costs)."""
    from dse.fit import calibrate as C
    rows, _ = V.read_measured(V.default_measured())
    cases, _ = V.prepare_all(rows)
    slots = C.slots_for(cases)
    model = C.Parameterisation(cases, slots)
    x = np.array([C._to_x(s.param, 0.5 * (s.param.lo + s.param.hi)) for s in slots])
    sections: dict = {}
    for key, v in model.values(x).items():
        section, rest = key.split(".", 1)
        group, name = rest.rsplit(".", 1)
        sections.setdefault(section, {}).setdefault(group, {})[name] = {"value": v}
    path = tmp_path / "cal.yaml"
    path.write_text(yaml.safe_dump(sections))
    written = [engine_efficiency(efficiency_for(c.device, str(path)), c.engine, c.kv_group, path=str(path))
               for c in cases]
    for fitted, later in zip(model.efficiencies(x), written):
        assert {k: v for k, v in vars(fitted).items() if k != "name"} == \
               {k: v for k, v in vars(later).items() if k != "name"}
