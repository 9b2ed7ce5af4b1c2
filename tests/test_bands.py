"""Error bands (``dse.core.bands``): split-conformal bands cover their nominal share of rows they
did not see (checked against the closed form of the conformal rank and Monte Carlo on normal
residuals), a slice too small for its level gives way to its parent, the small-sample band of the
spatial machines is Student's t interval, and a spatial prediction never takes a GPU engine's band."""
from __future__ import annotations

import math

import numpy as np
import pytest
import yaml
from scipy.stats import t as student_t

import dse.core.bands as B
from basis.shipped import shipped
from dse import evaluate
from dse.core.efficiency import CALIBRATION_ENV
from dse.fit import calibrate as C
from tests.conftest import run_cli


def _coverage_of(n: int, trials: int, rng) -> float:
    """Monte Carlo: the share of trials whose new normal draw lies within the conformal band of
    ``n`` earlier draws (one band per trial, vectorized over trials)."""
    draws = np.sort(rng.normal(0.0, 1.0, (trials, n)), axis=1)
    k = B.conformal_rank(n)
    new = rng.normal(0.0, 1.0, trials)
    return float(np.mean((new >= draws[:, n - k]) & (new <= draws[:, k - 1])))


@pytest.mark.parametrize("n", [19, 30, 57, 200])
def test_conformal_band_covers_its_nominal_share_of_new_rows(n):
    """For continuous exchangeable rows the band between the (n + 1 - k)-th and k-th order
    statistics holds a new row with probability (2k - n - 1) / (n + 1) exactly (its rank among the
    n + 1 is uniform), which is >= 90 % for k = ceil(0.95 (n + 1)); Monte Carlo agrees."""
    k = math.ceil(0.95 * (n + 1))
    assert B.conformal_rank(n) == k
    exact = (2 * k - n - 1) / (n + 1)
    assert exact >= 0.9
    trials = 20000
    got = _coverage_of(n, trials, np.random.default_rng(n))
    assert abs(got - exact) <= 4 * math.sqrt(exact * (1 - exact) / trials)


def test_a_slice_needs_nineteen_rows_for_a_ninety_percent_band():
    """At 90 % each side may miss 5 %: the 0.95 (n + 1)-th order statistic exists only from n = 19."""
    assert B.MIN_ROWS == 19
    assert B.conformal_band(np.zeros(18)) is None
    assert B.conformal_band(np.linspace(-1, 1, 19)) == pytest.approx((math.exp(-1), math.exp(1)))


def test_the_old_percentile_band_of_a_small_slice_under_covers():
    """Why the change: the 5th-95th percentile of 5 normal rows holds a new row with probability
    well under 90 % (the conformal band of the parent holds it at >= 90 %)."""
    rng = np.random.default_rng(5)
    draws = rng.normal(0.0, 1.0, (20000, 5))
    lo, hi = np.quantile(draws, (0.05, 0.95), axis=1)
    new = rng.normal(0.0, 1.0, 20000)
    assert np.mean((new >= lo) & (new <= hi)) < 0.75


def test_a_slice_too_small_falls_back_to_its_parent():
    """An engine with 10 rows of a vendor has no band of its own: its predictions take the next
    slice of its chain (engine, then vendor, family, every row) that has 19 rows or more."""
    rng = np.random.default_rng(3)
    r = rng.normal(0.0, 0.2, 110)
    engines = ["vllm"] * 100 + ["sglang"] * 10
    vendors = ["nvidia"] * 50 + ["amd"] * 50 + ["nvidia"] * 10
    bands = B.bands_from(r, engines, vendors, ["ttft"] * 110)
    assert "engine=sglang vendor=nvidia family=ttft" not in bands and "engine=sglang family=ttft" not in bands
    lo, hi, where = B.band_for(bands, "sglang", "nvidia", "ttft")
    assert where == "vendor=nvidia family=ttft"
    assert (lo, hi) == pytest.approx(B.conformal_band(np.r_[r[:50], r[100:]]), rel=1e-3)
    assert B.band_for(bands, "vllm", "amd", "ttft")[2] == "engine=vllm vendor=amd family=ttft"
    # a prior engine's rows ((prior)) are unseen engines' residuals: never in a fitted engine's slices
    bands = B.bands_from(r, ["(prior)"] * 110, vendors, ["ttft"] * 110)
    assert bands == {}


def test_held_out_coverage_is_near_nominal_on_normal_residuals():
    """Leaving each row out of the band computation, 400 normal rows in 4 slices of 100 are
    covered about 90 % of the time (not 100 %: the rows do not make their own band)."""
    rng = np.random.default_rng(7)
    r = rng.normal(0.0, 0.3, 400)
    engines = np.repeat(["vllm", "sglang"], 200)
    vendors = np.tile(np.repeat(["nvidia", "amd"], 100), 2)
    cov = B.held_out_coverage(r, r, engines, vendors, ["throughput"] * 400)
    assert 0.86 <= cov["covered"] <= 0.95 and cov["rows"] == cov["rows_with_band"] == 400
    assert cov["median_width"] == pytest.approx(math.exp(2 * 1.645 * 0.3), rel=0.15)   # 2 z(0.95) sigma
    assert 0.86 <= cov["unseen_engines"]["covered"] <= 0.95


def test_small_sample_band_is_students_prediction_interval():
    """With n normal rows and their mean fitted, a new row lies within mean +- t(0.95, n - 1) s
    sqrt(1 + 1 / n) 90 % of the time (exact, however few the rows); with 2 rows the band is
    t(0.95, 1) = 6.31 sample deviations wide on each side."""
    rng = np.random.default_rng(11)
    for n in (2, 4):
        x = rng.normal(0.0, 1.0, (20000, n))
        new = rng.normal(0.0, 1.0, 20000)
        inside = []
        for row, y in zip(x[:4000], new[:4000]):
            lo, hi = B.small_sample_band(row - row.mean(), fitted=1)
            inside.append(math.log(lo) <= y - row.mean() <= math.log(hi))
        assert abs(np.mean(inside) - 0.9) <= 4 * math.sqrt(0.09 / 4000)
    lo, hi = B.small_sample_band([-0.1, 0.1], fitted=1)
    s = math.sqrt(0.02 / 1)
    assert math.log(hi) == pytest.approx(student_t.ppf(0.95, 1) * s * math.sqrt(1.5))
    assert B.small_sample_band([0.1], fitted=1) is None


def test_tokens_per_second_per_user_residuals_change_sign_in_tpot_bands():
    """A per-user speed 20 % under its prediction is a TPOT 25 % over it: its residual joins the
    TPOT slices negated, and a TPOT band (low, high) is (1 / high, 1 / low) on the speed."""
    r = B.oriented([math.log(0.8), math.log(0.8)], ["output_tokens_per_s_per_user", "tpot_s"])
    assert r == pytest.approx([math.log(1.25), math.log(0.8)])
    assert B.band_on("output_tokens_per_s_per_user", 0.5, 2.5) == pytest.approx((0.4, 2.0))
    assert B.band_on("tpot_s", 0.5, 2.5) == (0.5, 2.5)


@pytest.fixture
def calibration(tmp_path, monkeypatch):
    """A copy of the shipped calibration whose bands give a GPU engine a narrow band and the
    dataflow layer of Cerebras its own, in use."""
    data = yaml.safe_load(shipped("configs", "calibration.yaml").read_text())
    gpu = {"n": 100, "low": 0.9, "high": 1.1}
    data["bands"] = {**{f"{lvl}family={f}": gpu for f in B.FAMILIES
                        for lvl in ("", "engine=vllm ", "engine=vllm vendor=nvidia ", "vendor=cerebras ")},
                     "all": gpu, "engine=unseen": gpu, "layer=dataflow vendor=cerebras family=tpot":
                     {"n": 4, "low": 0.4, "high": 2.5}}
    path = tmp_path / "cal.yaml"
    path.write_text(yaml.safe_dump(data))
    monkeypatch.setenv(CALIBRATION_ENV, str(path))
    return path


def test_a_spatial_prediction_never_takes_a_gpu_engines_band(calibration):
    """Cerebras, Groq and SambaNova beside an H100 in one call: the H100 takes the engine's band;
    Cerebras the dataflow layer's (TPOT only: its rows are per-user speeds), never the GPU's, even
    where a GPU slice names its vendor; Groq and SambaNova, without dataflow rows here, none."""
    out = evaluate(dict(model="llama-3.1-8b", hardware=np.array(["cerebras-wse3", "h100-sxm", "groq-lpu", "sn40l"]),
                        weights="fp16", activations="fp16", kv="fp16", batch=1, prompt_len=512, gen_len=128))
    low, high = np.asarray(out["band_tpot_low"]), np.asarray(out["band_tpot_high"])
    assert (low[0], high[0]) == (0.4, 2.5)
    assert (low[1], high[1]) == (0.9, 1.1)
    assert np.isnan(low[2:]).all() and np.isnan(np.asarray(out["band_throughput_low"])[[0, 2, 3]]).all()


def test_dataflow_rows_and_bands_only_recompute(calibration, tmp_path):
    """The dataflow layer's residuals are the vendor rows it is fitted on, predicted again (Groq's
    two within 1 %, Cerebras's 8B and 70B either side of their geometric mean, about +-23 %, as
    dse.core.dataflow records); --bands-only rebuilds bands and coverage from stored residuals
    without a fit: a 2-vendor dataflow band in TPOT that is wide (each side over 2 x the largest
    residual), and conformal engine bands whose held-out coverage is reported."""
    flow = C.dataflow_residual_rows()
    by = {r["id"]: r["log_in_sample"] for r in flow}
    assert set(by) == set(C.DATAFLOW_FIT_ROWS) and all(r["family"] == "tpot" for r in flow)
    assert abs(by["S001"]) < 0.01 and abs(by["S002"]) < 0.01
    assert 0.15 < abs(by["S003"]) < 0.35 and by["S003"] * by["S004"] < 0
    rng = np.random.default_rng(0)
    rows = [{"id": f"R{i}", "source": f"s{i % 7}", "engine": "vllm", "band_engine": "vllm", "vendor": "nvidia",
             "hardware_family": "gpu", "family": "throughput", "layer": "engine", "measured": 1.0,
             "log_lso": float(x), "log_leo": float(2 * x), "log_in_sample": float(x / 2)}
            for i, x in enumerate(rng.normal(0.0, 0.2, 60))]
    C.write_residuals(C.residuals_path(calibration), rows)
    data = C.recompute_bands(calibration)
    b = data["bands"]
    assert b["engine=vllm vendor=nvidia family=throughput"]["n"] == 60
    flow_band = b["layer=dataflow vendor=cerebras family=tpot"]
    assert b["layer=dataflow vendor=groq family=tpot"] == flow_band and flow_band["n"] == 4
    widest = max(abs(v) for v in by.values())
    assert math.log(flow_band["high"]) > 2 * widest and math.log(flow_band["low"]) < -2 * widest
    cov = data["band_coverage"]
    assert cov["rows"] == 60 and 0.8 <= cov["covered"] <= 1.0 and cov["unseen_engines"]["rows"] == 60
    assert cov["residuals"] == C.residuals_path(calibration).name
    assert yaml.safe_load(calibration.read_text())["bands"] == b       # written back
    assert len(C.read_residuals(C.residuals_path(calibration))) == 64  # the dataflow rows priced again


def test_bands_only_without_residuals_is_one_line(tmp_path):
    cal = tmp_path / "cal.yaml"
    cal.write_text(shipped("configs", "calibration.yaml").read_text())
    r = run_cli("calibrate", "--bands-only", "--out", str(cal))
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert "cal_residuals.csv" in r.stderr and "cannot read the residual file" in r.stderr
