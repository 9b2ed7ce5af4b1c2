"""Serving beyond one fixed request: length distributions, prefix caching, disaggregated
prefill and decode, latency percentiles, goodput under SLOs and capacity planning, each
against a closed form or the discrete-event simulator."""
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from basis.errors import DseError
from dse import evaluate
from dse.system.analysis import simulate_point
from hwmodels.presets import load_device
from workloads.lengths import parse_lengths
from workloads.model import load_model

#: the model's behaviour under a calibration that stays put when the shipped one is refitted
pytestmark = pytest.mark.usefixtures("fixed_calibration")

ROOT = Path(__file__).resolve().parents[1]
BASE = {"model": "llama-3.1-8b", "hardware": "h100-sxm", "prompt_len": 1024, "gen_len": 256}


# ------------------------------------------------------------------ length distributions

@pytest.mark.parametrize("sigma", [0.3, 1.0, 1.5])
def test_lognormal_classes_keep_the_first_two_moments(sigma):
    """The strata's conditional means and variances add up to the lognormal's mean and
    second moment (mean^2 e^(sigma^2)) exactly."""
    cls = parse_lengths(f"lognormal:prompt_sigma={sigma},gen_sigma=0").classes(1000.0, 200.0)
    w = cls.weight
    assert w.sum() == pytest.approx(1.0)
    assert w @ cls.prompt == pytest.approx(1000.0, rel=1e-9)
    assert w @ (cls.prompt_var + cls.prompt ** 2) == pytest.approx(1000.0 ** 2 * math.exp(sigma ** 2), rel=1e-9)
    assert np.all(cls.gen == 200.0) and np.all(cls.gen_var == 0.0)


def test_a_trace_is_used_as_it_is(tmp_path):
    rng = np.random.default_rng(3)
    p, g = rng.integers(10, 4000, 500), rng.integers(1, 900, 500)
    trace = tmp_path / "trace.csv"
    trace.write_text("prompt_len,gen_len\n" + "".join(f"{a},{b}\n" for a, b in zip(p, g)))
    cls = parse_lengths(str(trace)).classes(1.0, 1.0)
    assert cls.weight @ cls.prompt == pytest.approx(p.mean()) and cls.weight @ cls.gen == pytest.approx(g.mean())
    assert cls.weight @ (cls.prompt_var + cls.prompt ** 2) == pytest.approx((p.astype(float) ** 2).mean())
    ev = evaluate({**BASE, "lengths": str(trace), "request_rate": 2.0})
    point = ev.point(0)
    assert (point["prompt_len"], point["gen_len"]) != (1024, 256)      # the columns are the trace's means
    assert ev["prefill_tokens_per_s"][0] == pytest.approx(2.0 * p.mean(), rel=1e-6)
    bad = tmp_path / "bad.csv"
    bad.write_text("prompt_len,gen_len\n12,4\n7,x\n")
    with pytest.raises(DseError, match=r"bad\.csv: line 3: gen_len must be a positive integer"):
        evaluate({**BASE, "lengths": str(bad), "concurrency": 4})


# ------------------------------------------------------------------ the model against the simulator

CASES = [
    ({**BASE, "lengths": "lognormal:sigma=0.8", "concurrency": 16}, 0.10),
    ({**BASE, "lengths": "lognormal:sigma=0.8", "concurrency": 128}, 0.10),
    ({**BASE, "lengths": "lognormal:sigma=0.5", "request_rate": 5.0}, 0.10),
    ({**BASE, "lengths": "lognormal:sigma=0.5", "request_rate": 12.0}, 0.10),
    ({**BASE, "prefix_hit": 0.5, "concurrency": 64}, 0.12),
    ({**BASE, "prefix_hit": 0.5, "request_rate": 12.0}, 0.10),
    ({**BASE, "disaggregate": "1:1", "request_rate": 10.0}, 0.10),
    ({**BASE, "disaggregate": "2:2", "request_rate": 20.0}, 0.10),
    ({**BASE, "disaggregate": "2:2", "lengths": "lognormal:sigma=0.6", "concurrency": 64}, 0.10),
]


@pytest.mark.slow
@pytest.mark.parametrize("cols,ttft_tolerance", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_the_steady_state_agrees_with_the_simulator(cols, ttft_tolerance):
    """Throughput within 5 %, mean TTFT within the tolerance (10 %; a prefix-cached closed loop's
    waves 12 %), mean TPOT within 10 %, and the p90 of TTFT, TPOT and end-to-end latency
    within 25 % of the simulator's (1,500 requests; an open loop's mean TTFT under lengths of
    sigma 0.8 moves by +-10 % from one seed to another, so open loops here draw sigma 0.5)."""
    ev = evaluate(cols)
    sim = simulate_point(cols, 1500)
    err = {a: ev[a][0] / sim[b] - 1 for a, b in (
        ("requests_per_s", "requests_per_s"), ("ttft_s", "ttft_mean_s"), ("tpot_s", "tpot_mean_s"),
        ("ttft_p90_s", "ttft_p90_s"), ("tpot_p90_s", "tpot_p90_s"), ("e2e_latency_p90_s", "e2e_p90_s"))}
    limits = {"requests_per_s": 0.05, "ttft_s": ttft_tolerance, "tpot_s": 0.10, "ttft_p90_s": 0.25,
              "tpot_p90_s": 0.25, "e2e_latency_p90_s": 0.25}
    assert all(abs(err[k]) <= limits[k] for k in err), {k: f"{v:+.1%}" for k, v in err.items()}


# ------------------------------------------------------------------ prefix caching

def test_a_cached_prefix_is_held_once_and_not_recomputed():
    """The running cap under a prefix follows from block arithmetic: the shared prefix's whole
    blocks held once, each sequence its own prompt tokens and half its output."""
    hit = 0.5
    ev = evaluate({**BASE, "prefix_hit": [0.0, hit], "concurrency": 10**6, "max_running": 10**6,
                   "prefill_chunk": 10**6})
    m = load_model("llama-3.1-8b")
    per_token = 2 * m.num_layers * m.num_kv_heads * m.head_dim * 2               # bytes, fp16 K and V
    blocks = np.floor(ev["kv_pool_bytes"] / (per_token * 16))               # the paged pool, in blocks
    cached = math.floor(round(hit * 1024) / 16) * 16
    cap0 = math.floor(blocks[0] / ((1024 + 128) / 16 + 0.5))
    cap1 = math.floor((blocks[1] - cached / 16) / ((1024 - cached + 128) / 16 + 0.5))
    assert ev["running_batch"][0] == cap0 and ev["running_batch"][1] == cap1
    assert ev["ttft_s"][1] < ev["ttft_s"][0] and ev["requests_per_s"][1] > ev["requests_per_s"][0]


# ------------------------------------------------------------------ disaggregated prefill and decode

def test_one_request_on_two_pools_is_a_prefill_a_transfer_and_a_decode():
    """Alone (concurrency 1, ideal roofline), a disaggregated request's first token is the
    static batch-1 prefill; every later token the static batch-1 decode step, plus the KV
    transfer (prompt tokens x K and V bytes over the NVLink) spread over them."""
    static = evaluate({**BASE, "batch": 1}, ideal=True)
    pooled = evaluate({**BASE, "disaggregate": "1:1", "concurrency": 1}, ideal=True)
    m = load_model("llama-3.1-8b")
    link = load_device("h100-sxm").interconnect
    sent = 1024 * 2 * m.num_layers * m.num_kv_heads * m.head_dim * 2 / link.bandwidth_bytes_per_s + link.latency_s
    assert pooled["ttft_s"][0] == pytest.approx(static["ttft_s"][0], rel=1e-6)
    assert pooled["tpot_s"][0] == pytest.approx(static["tpot_s"][0] + sent / 255, rel=2e-3)
    assert pooled["devices"][0] == 2 and pooled["tp_used"][0] == 1


def test_a_prefill_bound_pool_serves_what_its_iterations_hold():
    """One prefill engine for three decode engines under a deep closed loop (ideal roofline):
    the throughput is the prefill engine's, eight 1,024-token prompts per 8,192-token
    iteration, i.e. the static batch-8 prefill (equal work and keys)."""
    static = evaluate({**BASE, "batch": 8}, ideal=True)
    pooled = evaluate({**BASE, "disaggregate": "1:3", "concurrency": 512}, ideal=True)
    assert pooled["requests_per_s"][0] == pytest.approx(8 / static["ttft_s"][0], rel=1e-4)


def test_pools_are_checked():
    ev = evaluate({**BASE, "disaggregate": ["2:2", "3:2"], "tp": 2, "concurrency": 8})
    assert ev["feasible"][0] and ev.reason_key(1) == "layout"
    assert "must divide P and D" in ev.reason_text(1)
    with pytest.raises(DseError, match="disaggregate: expected 'none' or 'P:D'"):
        evaluate({**BASE, "disaggregate": "3", "concurrency": 8})
    with pytest.raises(DseError, match="serving: 'static' runs one batch; disaggregate is a parameter"):
        evaluate({**BASE, "disaggregate": "1:1", "serving": "static"})


# ------------------------------------------------------------------ percentiles, goodput, capacity

def test_a_static_batch_has_one_latency():
    ev = evaluate({**BASE, "batch": 8})
    for m in ("ttft", "tpot", "e2e_latency"):
        assert ev[f"{m}_p50_s"][0] == ev[f"{m}_p99_s"][0] == ev[f"{m}_s"][0]
    assert np.isnan(ev["goodput"][0])


def test_percentiles_are_ordered_and_spread_with_the_lengths():
    ev = evaluate({**BASE, "lengths": ["fixed", "lognormal:sigma=1"], "request_rate": 8.0})
    for m in ("ttft", "tpot", "e2e_latency"):
        assert np.all(ev[f"{m}_p50_s"] <= ev[f"{m}_p90_s"]) and np.all(ev[f"{m}_p90_s"] <= ev[f"{m}_p99_s"])
    spread = ev["e2e_latency_p99_s"] / ev["e2e_latency_p50_s"]
    assert spread[1] > 3 * spread[0]


@pytest.mark.parametrize("slo", [{"slo_ttft": 0.08}, {"slo_tpot": 0.02}, {"slo_ttft": 0.1, "slo_tpot": 0.015}])
def test_goodput_is_the_largest_rate_meeting_the_slos(slo):
    cols = {**BASE, "lengths": "lognormal:sigma=0.5", "concurrency": 1, **slo}
    good = evaluate(cols)["goodput"][0]
    assert good > 0
    at = evaluate({**BASE, "lengths": "lognormal:sigma=0.5", "request_rate": [good, 1.01 * good]})

    def meets(i):
        return all(at[f"{k.removeprefix('slo_')}_p90_s"][i] <= v * (1 + 1e-9) for k, v in slo.items())
    assert meets(0) and not meets(1)


def test_no_rate_meets_an_slo_below_the_lone_request():
    ev = evaluate({**BASE, "concurrency": 1, "slo_ttft": 1e-4, "target_rate": 5.0})
    assert ev["goodput"][0] == 0 and ev.reason_key(0) == "slo"


def test_a_service_takes_as_many_engines_as_its_rate_over_the_goodput():
    """Capacity planning: at the replicas the evaluator names, each engine's share of the
    target rate meets the SLOs; with one engine fewer it does not."""
    slo = {"slo_ttft": 0.5, "slo_tpot": 0.05}
    cols = {"model": "llama-3.1-70b", "hardware": ["h100-sxm", "mi300x"], "devices": 2, "weights": "fp8",
            "activations": "fp8", "kv": "fp8", "prompt_len": 2048, "gen_len": 256, "target_rate": 30.0, **slo}
    ev = evaluate(cols)
    for i in range(2):
        r = int(ev["replicas"][i])
        assert r > 1 and ev["service_devices"][i] == 2 * r
        assert ev["service_tdp_w"][i] == pytest.approx(r * ev["system_tdp_w"][i])
        assert ev["service_power_w"][i] == pytest.approx(r * ev["power_w"][i])   # every engine draws its power
        share = evaluate({**cols, "hardware": cols["hardware"][i], "target_rate": 0.0, "slo_ttft": 0.0,
                          "slo_tpot": 0.0, "request_rate": [30.0 / r, 30.0 / (r - 1)]})
        ok = (share["ttft_p90_s"] <= slo["slo_ttft"]) & (share["tpot_p90_s"] <= slo["slo_tpot"]) & share["feasible"]
        assert ok[0] and not ok[1]
    with pytest.raises(DseError, match="target_rate: .* give slo_ttft and/or slo_tpot"):
        evaluate({**BASE, "target_rate": 3.0})


# ------------------------------------------------------------------ the command line

def _dse(*args):
    return subprocess.run([sys.executable, "-m", "dse.study", *args], capture_output=True, text=True, cwd=ROOT)


def test_analyze_reports_percentiles_and_goodput():
    r = _dse("analyze", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--request-rate", "4",
             "--lengths", "lognormal:sigma=0.5", "--prefix-hit", "0.25", "--slo-ttft", "0.2", "--slo-tpot", "0.03",
             "--format", "json")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)["summary"]
    assert s["ttft_p50_s"] <= s["ttft_p90_s"] <= s["ttft_p99_s"] and s["goodput"] > 4
    assert s["lengths"].startswith("lognormal") and s["prefix_hit"] == 0.25


@pytest.mark.parametrize("args,says", [
    (["--disaggregate", "3"], "disaggregate: expected 'none' or 'P:D'"),
    (["--lengths", "nowhere.csv", "--concurrency", "4"], "nowhere.csv"),
    (["--lengths", "gamma"], "lengths: expected 'fixed'"),
    (["--prefix-hit", "1.5"], "expected a share"),
])
def test_bad_serving_options_are_one_line(args, says):
    r = _dse("analyze", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", *args)
    assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_separate_pools_pay_under_a_tight_tpot_and_not_under_a_loose_one():
    """DistServe's finding, from the roofline: prompts chunked into decoding iterations stall
    them, so under a tight TPOT SLO some P:D split of the same engines serves more per device
    than one colocated engine; under a loose one the colocated engine, busy all the time, does."""
    cols = {"model": "llama-3.1-70b", "hardware": "h100-sxm", "weights": "fp8", "activations": "fp8", "kv": "fp8",
            "tp": 2, "prompt_len": 2048, "gen_len": 256, "slo_ttft": 2.0, "slo_percentile": 99,
            "disaggregate": ["none", "2:2", "4:2", "6:2", "2:4"]}
    tight = evaluate({**cols, "slo_tpot": 0.04})["goodput_per_device"]
    loose = evaluate({**cols, "slo_tpot": 0.2})["goodput_per_device"]
    assert tight[1:].max() > 1.5 * tight[0]
    assert loose[0] >= loose[1:].max()


@pytest.mark.slow
def test_a_study_over_goodput_reports_and_an_unquoted_ratio_is_explained(tmp_path):
    """A study whose objective is a request rate writes its report (requests/s columns), and
    YAML's base-60 reading of an unquoted 3:3 is named in one line."""
    study = tmp_path / "s.yaml"
    study.write_text("name: s\nspace:\n  hardware: h100-sxm\n  model: llama-3.1-8b\n  concurrency: 8\n"
                     "  slo_tpot: 0.05\n  target_rate: 5\nobjectives:\n  goodput: max\n  kv_utilization: min\n"
                     "method: grid\n")
    r = _dse("run", str(study), "--out", str(tmp_path / "out"), "--quiet")
    assert r.returncode == 0, r.stderr
    assert "goodput (requests/s)" in (tmp_path / "out" / "report.html").read_text()
    study.write_text("name: s\nspace:\n  hardware: h100-sxm\n  model: llama-3.1-8b\n  concurrency: 8\n"
                     "  disaggregate: [none, 3:3]\nobjectives:\n  goodput_per_device: max\nmethod: grid\n")
    r = _dse("run", str(study), "--out", str(tmp_path / "out2"), "--quiet")
    assert r.returncode == 2 and "quote it, '3:3'" in r.stderr and "Traceback" not in r.stderr
