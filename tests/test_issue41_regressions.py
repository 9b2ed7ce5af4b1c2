"""Issue 41 regressions: tracebacks and wrong numbers in evaluation and plotting, each with the
right answer and why."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dse import evaluate
from dse.core.engines import UNFUSED_FALLBACK, attention_on, get_engine
from dse.core.roofline import OpArrays
from dse.present.drawing import Drawer, PlotFailed
from dse.present.plots import pareto_plot
from dse.system.iteration import iteration_model
from hwmodels.presets import load_device
from workloads import optable
from workloads.model import load_model
from workloads.scenario import Scenario
from workloads.techniques import Techniques

ROOT = Path(__file__).resolve().parents[1]
BASE = {"model": "llama-3.1-8b", "prompt_len": 1024, "gen_len": 256}


def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dse.study", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


# ------------------------------------------------------------------ 1. SLOs without an interconnect

def test_slos_on_devices_without_a_link_are_infeasible_not_a_crash():
    """An RTX 4090 has no interconnect: two of them cannot run one engine, so the point is
    infeasible for ``interconnect`` and its goodput unknown (NaN); the one-device point beside
    it in the same sweep is still priced (a goodput > 0 at a 0.5 s TTFT SLO)."""
    ev = evaluate({**BASE, "hardware": ["rtx-4090"] * 2, "devices": [1, 2], "concurrency": 4, "slo_ttft": 0.5})
    assert list(ev["feasible"]) == [True, False]
    assert ev.reason_key(1) == "interconnect"
    assert ev["goodput"][0] > 0 and np.isnan(ev["goodput"][1])


def test_slos_without_a_link_refused_in_one_line_by_analyze():
    done = _cli("analyze", "--model", "llama-3.1-8b", "--hardware", "rtx-4090", "--devices", "2",
                "--concurrency", "4", "--slo-ttft", "0.5")
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == ["dse.study: error: hardware 'rtx-4090' has no interconnect "
                                                "to run over 2 --devices"]


# ------------------------------------------------------------------ 2. decode-only techniques under served load

@pytest.mark.parametrize("technique", [{"layers_used": 0.5}, {"activation_density": 0.5}])
def test_an_iteration_prices_decode_tokens_with_the_technique_and_prompt_tokens_dense(technique):
    """Contextual sparsity and early exit change the decode step only (prefill runs dense,
    ``workloads.techniques``): an iteration of 8 decode tokens is the static decode step of a
    batch of 8 with the technique, and an iteration of one prompt is the dense prefill of it (the
    decode step's predictors and exit classifiers do nothing for a prompt token)."""
    model, p = load_model("llama-3.1-8b"), 512
    tech = Techniques(**technique)
    it = iteration_model(model, p, "fp16", "fp16", "fp16", 1, False, 0.0, tech)
    sc = Scenario.make(batch=8, prompt_len=p, gen_len=1, weights="fp16", activations="fp16", kv="fp16", tp=1,
                       flash_attention=False, techniques=tech)
    decode = optable.decode_step(model, sc, p + 1)
    got = it.arrays(8.0, 8.0 * (p + 1), 0.0, 0.0, 0.0)
    want = OpArrays.from_table(decode)
    assert np.allclose(got.ops[0], want.ops, rtol=1e-9, atol=1e-3)
    assert np.allclose(got.weight_bytes[0], want.weight_bytes, rtol=1e-9)
    dense = Scenario.make(batch=1, prompt_len=p, gen_len=1, weights="fp16", activations="fp16", kv="fp16", tp=1,
                          flash_attention=False)
    prefill = optable.prefill(model, dense)
    got = it.arrays(0.0, 0.0, float(p), p * (p - 1) / 2.0, 1.0)
    at = [decode.names.index(name) for name in prefill.names]
    extra = [i for i in range(len(decode.names)) if i not in at]
    assert extra, "the decode step adds its technique's operator"
    pre = OpArrays.from_table(prefill)
    assert np.allclose(got.ops[0][at], pre.ops, rtol=1e-6, atol=1.0)
    assert np.all(got.ops[0][extra] == 0.0)
    assert np.allclose(got.weight_bytes[0][at], pre.weight_bytes, rtol=1e-9)


@pytest.mark.parametrize("flag", [{"layers_used": 0.5}, {"activation_sparsity": 0.5}])
def test_decode_techniques_run_under_served_load_as_in_a_static_batch(flag):
    """A closed loop of 8 requests of one length runs a batch of 8 (the waves regime): its TPOT is
    the static batch of 8's with the same technique, within 0.1 % (the two differ, without a
    technique too, only in how the keys of the batch are averaged); and an open loop is priced."""
    base = {**BASE, "hardware": "h100-sxm"}
    ev = evaluate({**base, **{k: [v] * 3 for k, v in flag.items()}, "batch": [8, 1, 1],
                   "concurrency": [0, 8, 0], "request_rate": [0.0, 0.0, 1.0]})
    assert ev["feasible"].all()
    assert ev["tpot_s"][1] == pytest.approx(ev["tpot_s"][0], rel=1e-3)
    plain = evaluate({**base, "request_rate": 1.0})
    assert ev["ttft_s"][2] == pytest.approx(plain["ttft_s"][0], rel=0.05)    # the prompt runs dense
    assert np.isfinite(ev["tpot_s"][2])


def test_layers_used_under_a_request_rate_from_the_cli():
    done = _cli("analyze", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--layers-used", "0.5",
                "--request-rate", "1", "--format", "json")
    assert done.returncode == 0, done.stderr


# ------------------------------------------------------------------ 3. goodput per device

def test_goodput_per_device_is_goodput_over_an_engines_devices_under_slos():
    """With SLOs set, goodput_per_device is the engine's goodput over the devices one engine
    (one replica) takes: tp 2 colocated, a 1:1 disaggregated pair (two devices), one device;
    never NaN where the goodput is known."""
    base = {**BASE, "hardware": "h100-sxm", "slo_ttft": 0.5, "slo_tpot": 0.05, "concurrency": 8}
    ev = evaluate({**base, "tp": [1, 2, 1], "devices": [1, 2, 2], "disaggregate": ["none", "none", "1:1"],
                   "target_rate": 30.0})
    assert ev["feasible"].all()
    assert np.all(ev["goodput"] > 0)
    assert list(ev["devices"]) == [1, 2, 2]
    assert np.allclose(ev["goodput_per_device"], ev["goodput"] / np.array([1, 2, 2]))
    assert np.array_equal(ev["service_devices"], ev["replicas"] * ev["devices"])


# ------------------------------------------------------------------ 4. average power and power demand

def test_average_power_per_device_never_exceeds_the_most_demanding_phase():
    """An average lies below the largest of what it averages: the run's power per device
    (``power_w`` / devices) is at most ``power_demand_w`` (the most demanding phase of one device),
    over random static, closed-loop and open-loop points on the energy-profiled A100 80GB and H100
    SXM with a static power given. Before, a gen_len 1 run was charged a decode step it never runs
    (up to 21 % above), and the demand counted the work of unmeasured classes at 0 J while the
    average charged it (served points up to 0.7 % above)."""
    rng = np.random.default_rng(41)
    n = 240
    mode = rng.integers(0, 3, n)
    cols = {"model": "llama-3.1-8b", "hardware": rng.choice(["a100-80gb", "h100-sxm"], n),
            "prompt_len": rng.choice([16, 128, 1024, 4096], n), "gen_len": rng.choice([1, 2, 16, 256], n),
            "static_power_w": rng.choice([50.0, 100.0, 200.0], n), "tp": rng.choice([1, 2], n),
            "weights": rng.choice(["fp16", "fp8"], n),
            "batch": np.where(mode == 0, rng.choice([1, 8, 64], n), 1),
            "concurrency": np.where(mode == 1, rng.choice([1, 8, 64], n), 0),
            "request_rate": np.where(mode == 2, rng.choice([0.5, 2.0, 20.0], n), 0.0)}
    cols["devices"] = cols["tp"]
    ev = evaluate(cols)
    power, demand, devices = ev["power_w"], ev["power_demand_w"], ev["devices"]
    known = np.isfinite(power)
    assert known.sum() > n * 0.9
    assert np.all(power[known] / devices[known] <= demand[known] * (1 + 1e-12))


def test_a_one_token_run_is_not_charged_a_decode_step():
    """gen_len 1: the prefill makes the only token, so the run's dynamic energy is the prefill's;
    with gen_len 2 it is that plus one decode step, so strictly more (before, both carried the
    step: the same dynamic energy)."""
    ev = evaluate({**BASE, "hardware": "h100-sxm", "static_power_w": 100.0, "batch": 8, "gen_len": [1, 2]})
    dynamic = ev["energy_per_token_j"] * 8 * np.array([1, 2]) - 100.0 * ev["e2e_latency_s"]
    assert dynamic[1] - dynamic[0] > 0.01 * dynamic[1]


# ------------------------------------------------------------------ 5. an empty Pareto front

EMPTY_FRONT_STUDY = """\
name: empty-front
description: every design's cost per token is unknown (no preset here has a price), so the front is empty
space:
  hardware: [rtx-a6000, l40s]
  weights: [fp16, fp8]
  kv: [fp16, fp8]
  activations: [fp16, fp8]
  model: llama-3.1-8b
  batch: [1, 4]
  prompt_len: 512
  gen_len: 64
objectives:
  cost_per_million_tokens_usd: min
  tpot_s: min
method: grid
"""


def test_an_objective_no_design_can_have_is_refused_before_the_run(tmp_path):
    """No design can have a cost per token (no preset has an energy profile and a price): the study
    is refused up front, in one line naming the file, the objective and what each hardware lacks
    (issue 43; before issue 43 it ran to an empty front, and before issue 41 it ended in a
    ZeroDivisionError in pareto_plot). Nothing is written."""
    study = tmp_path / "empty.yaml"
    study.write_text(EMPTY_FRONT_STUDY)
    done = _cli("run", str(study), "--out", str(tmp_path / "out"))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    line = done.stderr.strip()
    assert "\n" not in line and "empty.yaml: objectives.cost_per_million_tokens_usd: no design can have a value" in line
    assert not (tmp_path / "out" / "results.parquet").exists()


def test_pareto_plot_of_designs_without_values_draws_an_empty_panel(tmp_path):
    """pareto_plot itself, given designs none of which has both values, draws one empty panel
    (no division by zero panels) and records no design drawn."""
    rows = pd.DataFrame({"point": [0, 1], "tpot_s": [0.01, 0.02], "cost_per_million_tokens_usd": [np.nan, np.nan],
                         "hardware": ["a", "b"], "weights": ["fp16", "fp8"], "kv": ["fp16", "fp8"]})
    rec = pareto_plot(tmp_path / "p.png", rows, rows.iloc[:0], "tpot_s", "cost_per_million_tokens_usd",
                      {"tpot_s": "min", "cost_per_million_tokens_usd": "min"}, hue="hardware", style="weights",
                      facet="kv")
    assert rec["highlighted"] == [] and rec["highlighted_x"] == []
    assert (tmp_path / "p.png").stat().st_size > 0


def test_a_plot_that_fails_in_a_helper_is_named(tmp_path):
    """The error of a plot drawn by a helper process names the plot (its file and drawing
    function), and the plot's own error, with where in the plot it was raised, is its cause."""
    rows = pd.DataFrame({"point": [0], "tpot_s": [0.01]})
    with Drawer(helper=True) as drawer:
        drawer.ready(120)
        drawn = drawer.draw(pareto_plot, tmp_path / "broken.png", rows, rows, "tpot_s", "no_such_metric",
                            {"tpot_s": "min"})
        with pytest.raises(PlotFailed, match=r"^plot broken\.png \(pareto_plot\) failed") as err:
            drawn.result()
    assert isinstance(err.value.__cause__, KeyError)
    if drawn.by_helper is not None:           # drawn by a helper (a machine of two cores or more)
        assert "plots.py" in "".join(getattr(err.value.__cause__, "__notes__", []))


# ------------------------------------------------------------------ 6. request lengths past the context

def test_lengths_shortened_to_the_context_are_said_with_the_mean_modelled(tmp_path):
    """A trace of 90 requests of 200 + 100 tokens and 10 of 30,000 + 100 has a mean prompt of
    3,180; past a 4,096-token context the long prompts are shortened to 3,996, so the model
    serves a mean prompt of 0.9 x 200 + 0.1 x 3,996 = 579.6 tokens, which its own prefill
    throughput over its request rate shows; the point says so rather than showing 3,180 alone."""
    trace = tmp_path / "long.csv"
    trace.write_text("prompt_len,gen_len\n" + "200,100\n" * 90 + "30000,100\n" * 10)
    ev = evaluate({**BASE, "hardware": "h100-sxm", "lengths": str(trace), "concurrency": 8, "max_context": 4096})
    assert ev["prefill_tokens_per_s"][0] / ev["requests_per_s"][0] == pytest.approx(579.6, rel=1e-6)
    note = ev.point(0)["lengths_clamped"]
    assert "4,096-token context" in note and "mean prompt 580 tokens modelled, 3,180 in the trace" in note
    done = _cli("analyze", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--concurrency", "8",
                "--lengths", str(trace), "--max-context", "4096")
    assert done.returncode == 0 and "mean prompt 580 tokens modelled, 3,180 in the trace" in done.stdout
    roomy = evaluate({**BASE, "hardware": "h100-sxm", "lengths": str(trace), "concurrency": 8})
    assert "lengths_clamped" not in roomy.point(0)       # the model's 131,072-token context holds them all


# ------------------------------------------------------------------ 7. Gaudi's fused attention falls back

def test_an_engine_without_an_on_chip_buffer_falls_back_to_unfused_attention():
    """The gaudi profile asks for fused attention (FusedSDPA), which tiles in an on-chip buffer the
    Gaudi presets do not cite: as the README says, such hardware runs unfused attention; hardware
    that cites a buffer keeps the fused kernel."""
    gaudi = get_engine("gaudi")
    assert gaudi.flash_attention
    ran, note = attention_on(gaudi, load_device("gaudi2").onchip_buffer_bytes)
    assert not ran.flash_attention and note == UNFUSED_FALLBACK
    assert attention_on(gaudi, load_device("h100-sxm").onchip_buffer_bytes) == (gaudi, "")


def test_validate_prices_gaudi_rows_with_the_fallback_reported(tmp_path):
    """A shipped Gaudi 2 row (BLOOM-176B on 8 devices, optimum-habana) was refused for
    ``onchip_buffer``; it is priced, with unfused attention, and the engine column says why."""
    lines = (ROOT / "data" / "gathered" / "more_engines.csv").read_text().splitlines(keepends=True)
    gaudi = [ln for ln in lines[1:] if ln.startswith("E001,")]
    assert gaudi, "the shipped Gaudi 2 row E001"
    measured = tmp_path / "gaudi.csv"
    measured.write_text(lines[0] + "".join(gaudi))
    done = _cli("validate", "--measured", str(measured), "--out", str(tmp_path / "val"), "--quiet")
    assert done.returncode == 0, done.stderr[-2000:]
    rows = pd.read_csv(tmp_path / "val" / "validation.csv")
    row = rows[rows["id"] == "E001"].iloc[0]
    assert np.isfinite(row["predicted"]) and row["predicted"] > 0
    assert row["engine"] == f"gaudi ({UNFUSED_FALLBACK})"
