"""The engine layer apart from the kernel layer (issue 42): what ``calibrate`` fits, what an
engine without enough rows gets, values on their bound, every cross-validation fold counted, and
which layer's values a prediction says it used."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

from basis.errors import DseError
from basis.shipped import shipped_file
from dse import evaluate
from dse.core import bands as B
from dse.core.efficiency import FAMILY_PRIORS, Efficiency, efficiency_for, load_calibration
from dse.core.engines import PRIOR, efficiency_source, engine_efficiency, engine_parameters, get_engine
from dse.fit import calibrate as C


def _case(engine: str, *, metric="output_tokens_per_s", serving="static", tp=1, source="s1", value=100.0):
    """A stand-in for a measured row made ready to predict: what ``slots_for`` and the folds read."""
    row = SimpleNamespace(metric=metric, serving=serving, tp=tp, source=source, id=source, value=value,
                          vendor="nvidia", activations="fp16")
    return SimpleNamespace(engine=get_engine(engine), row=row, device=SimpleNamespace(efficiency_family="gpu"),
                           kv_group=1.0)


def _calibration(tmp_path, **sections) -> str:
    p = tmp_path / "cal.yaml"
    p.write_text(yaml.safe_dump({"families": {}, **sections}))
    return str(p)


def test_no_hardware_fraction_is_fitted_and_few_rows_fit_nothing_of_an_engine():
    """The slots are engine-layer values only; an engine with MIN_ROWS - 1 rows gets none (it is a
    prior engine), one with MIN_ROWS rows gets its step cost and both scales."""
    n = C.MIN_ROWS
    cases = [_case("vllm", serving="continuous") for _ in range(n)] + [_case("tgi") for _ in range(n - 1)]
    slots = C.slots_for(cases)
    assert {s.section for s in slots} <= {"launch", "allreduce", "engines"}
    assert not {s.param.name for s in slots} & set(C.KERNEL_LAYER)
    mine = {s.param.name for s in slots if s.group == "vllm"}
    assert {"step_overhead_s", "memory_scale", "compute_scale", "prefill_decode_overlap"} <= mine
    assert not [s for s in slots if s.group == "tgi"]
    priors = C.prior_engines(cases)
    assert "tgi" in priors and f"{n - 1} predictable rows" in priors["tgi"] and "vllm" not in priors


def test_a_prior_engine_gets_neutral_values_never_another_engines_fit(tmp_path):
    path = _calibration(tmp_path, engines={"vllm": {"memory_scale": {"value": 0.6}, "compute_scale": {"value": 0.5},
                                                     "step_overhead_s": {"value": 3e-3}}})
    base = efficiency_for("gpu", path)
    vllm = engine_efficiency(base, get_engine("vllm"), path=path)
    tgi = engine_efficiency(base, get_engine("tgi"), path=path)
    assert vllm.memory == pytest.approx(0.6 * base.memory) and vllm.step_overhead_s == 3e-3
    assert (tgi.memory, tgi.compute, tgi.step_overhead_s, tgi.request_overhead_s) == \
           (base.memory, base.compute, 0.0, 0.0)
    assert "prior engine tgi" in tgi.name and "calibrated engine vllm" in vllm.name
    assert efficiency_source(tgi.name) == "kernel layer: prior gpu; engine layer: prior engine tgi"
    assert "engines predicted without rows of their own" in B.band_source(tgi.name)


def test_the_kernel_layer_is_the_cited_prior():
    """gpu: the MAMF of H100 SXM BF16 (794.5 of 989 TFLOPS), FP8 from the measured FP8/BF16 ratio."""
    gpu = Efficiency(name="x", **C.family_parameters("gpu", fitted={})[0])
    assert gpu.compute == pytest.approx(794.5 / 989, abs=0.005)
    assert gpu.resolved("compute_fp8") == pytest.approx(0.80 * 0.914, rel=1e-9)


def test_a_value_on_its_bound_is_recorded_and_its_predictions_band_says_so(tmp_path):
    hi = next(p for p in C.FIT if p.name == "compute_scale")
    slot = C.Slot(hi, "engines", "trt-llm-legacy")
    f = C.Fit({slot.key: hi.hi}, np.zeros(1), 0.0, 1, [slot])
    bounded = C.at_bound(f)
    assert bounded == {"engines.trt-llm-legacy.compute_scale": {"value": hi.hi, "bound": "upper", "limit": hi.hi}}
    path = _calibration(tmp_path, engines={"trt-llm-legacy": {"compute_scale": {"value": hi.hi}}},
                        at_bound=bounded)
    params, notes = engine_parameters(get_engine("trt-llm-legacy"), path)
    assert params["compute_scale"] == hi.hi and notes and "upper bound" in notes[0]
    eff = engine_efficiency(efficiency_for("gpu", path), get_engine("trt-llm-legacy"), path=path)
    assert "WARNING" in B.band_source(eff.name) and "compute_scale" in B.band_source(eff.name)
    inside = C.Fit({slot.key: 1.0}, np.zeros(1), 0.0, 1, [slot])
    assert C.at_bound(inside) == {}


def test_every_fold_is_counted_and_a_failed_one_says_why(monkeypatch):
    """Three sources: one fold's fit raises, one predicts a row NaN (with the evaluator's reason), one
    predicts everything; the totals count three folds, one failed, and both failed rows' reasons."""
    cases = [_case("vllm", source=s) for s in ("a", "a", "b", "b", "c")]

    def fake_fit(pred, base, params, **kw):
        if any(c.row.source == "a" for c in cases if c not in pred.cases):   # the fold without 'a' (held 'a')
            raise ValueError("x0 is infeasible")
        return C.Fit({}, np.zeros(0), 0.0, 1, [])

    class FakePredictions:
        def __init__(self, held):
            self.cases = held

        def predict(self, effs):
            values = np.array([np.nan if c.row.source == "b" and i == 0 else c.row.value
                               for i, c in enumerate(self.cases)])
            return SimpleNamespace(values=values, why={0: "saturated: the load exceeds what it serves"}
                                   if self.cases[0].row.source == "b" else {})

    class FakeModel:
        def __init__(self, rows, slots, covered=None, held=None):
            self.rows = rows

        def efficiencies(self, x):
            return [None] * len(self.rows)
    monkeypatch.setattr(C, "fit", fake_fit)
    monkeypatch.setattr(C, "Predictions", FakePredictions)
    monkeypatch.setattr(C, "Parameterisation", FakeModel)
    errors, folds = C.cross_validate(cases, key="source")
    t = C.fold_totals(folds)
    assert (t["folds"], t["failed_folds"], t["rows"], t["predicted_rows"], t["failed_rows"]) == (3, 1, 5, 2, 3)
    assert any("the fit failed: x0 is infeasible" in w for w in t["why"])
    assert t["why"]["saturated: the load exceeds what it serves"] == 1
    assert np.isnan(errors).sum() == 3 and np.nanmax(np.abs(errors)) == 0.0


def test_an_engine_without_a_slice_takes_the_unseen_engines_band():
    rng = np.random.default_rng(2)
    seen = rng.normal(0.0, 0.1, 200)
    unseen = rng.normal(0.0, 0.5, 200)
    bands = B.bands_from(seen, ["vllm"] * 200, ["nvidia"] * 200, ["throughput"] * 200)
    bands.update(B.unseen_bands(unseen, ["throughput"] * 200))
    tgi = B.band_engine(f"prior gpu + {PRIOR} tgi", "tgi")     # a prior engine's predictions: unseen engines
    lo, hi, where = B.band_for(bands, tgi, "nvidia", "throughput")
    assert where == "engine=unseen family=throughput"
    k = int(np.ceil(201 * 0.95))                 # the conformal rank: the k-th residual from each end
    assert (lo, hi) == pytest.approx((np.exp(np.sort(unseen)[200 - k]), np.exp(np.sort(unseen)[k - 1])), rel=1e-3)
    assert B.band_for(bands, "vllm", "nvidia", "throughput")[2] == "engine=vllm vendor=nvidia family=throughput"
    assert 0.85 <= B.covered(np.exp(unseen), 1.0, lo, hi).mean() <= 0.95


def test_an_engines_fitted_values_hold_only_on_the_families_its_rows_covered(tmp_path):
    """vLLM fitted on GPU rows only: on a GPU it is the calibrated engine; on a CPU a prior engine
    (neutral scales: the CPU's fractions are its family prior, no scheduler cost), its name says
    so and its band is the unseen engines'. A file written before ``engine_families`` applies the
    values to every family, as then."""
    own = {"vllm": {"memory_scale": {"value": 0.6}, "compute_scale": {"value": 0.5},
                    "step_overhead_s": {"value": 3e-3}}}
    path = _calibration(tmp_path, engines=own, engine_families={"vllm": ["gpu"]})
    vllm = get_engine("vllm")
    gpu = engine_efficiency(efficiency_for("gpu", path), vllm, path=path, family="gpu")
    cpu = engine_efficiency(efficiency_for("cpu", path), vllm, path=path, family="cpu")
    assert gpu.memory == pytest.approx(0.6 * FAMILY_PRIORS["gpu"]["memory"]) and gpu.step_overhead_s == 3e-3
    assert (cpu.memory, cpu.compute, cpu.step_overhead_s) == \
           (FAMILY_PRIORS["cpu"]["memory"], FAMILY_PRIORS["cpu"]["compute"], 0.0)
    assert "calibrated engine vllm" in gpu.name
    assert "prior engine vllm" in cpu.name and "fitted on gpu only" in cpu.name
    assert "engines predicted without rows of their own" in B.band_source(cpu.name)
    old = str(tmp_path / "old.yaml")
    Path(old).write_text(yaml.safe_dump({"families": {}, "engines": own}))
    before = engine_efficiency(efficiency_for("cpu", old), vllm, path=old, family="cpu")
    assert before.memory == pytest.approx(0.6 * FAMILY_PRIORS["cpu"]["memory"])


def test_calibrate_records_the_families_each_fitted_engines_rows_covered():
    """Eight vLLM rows, six on GPUs and two on a CPU, and three TGI rows (a prior engine): vLLM's
    values hold on both families, TGI is not listed (it has no values to hold)."""
    cases = [_case("vllm") for _ in range(6)] + [_case("vllm") for _ in range(2)] + [_case("tgi") for _ in range(3)]
    for c in cases[6:8]:
        c.device = SimpleNamespace(efficiency_family="cpu")
    assert C.engine_families(cases, C.slots_for(cases)) == {"vllm": ["cpu", "gpu"]}


def test_the_shipped_calibration_says_where_each_fitted_engine_holds():
    """Every engine with fitted values in configs/calibration.yaml lists its families; under the
    default engine (vLLM, fitted on GPU rows only) a Xeon keeps its family prior and an H100 gets
    vLLM's fitted scale."""
    cal = load_calibration()
    assert set(cal["engine_families"]) == set(cal["engines"])
    assert all(set(f) <= set(FAMILY_PRIORS) for f in cal["engine_families"].values())
    assert "cpu" not in cal["engine_families"]["vllm"]
    default = get_engine("default")
    cpu = engine_efficiency(efficiency_for("cpu"), default, family="cpu")
    gpu = engine_efficiency(efficiency_for("gpu"), default, family="gpu")
    assert cpu.memory == FAMILY_PRIORS["cpu"]["memory"] and cpu.compute == FAMILY_PRIORS["cpu"]["compute"]
    assert gpu.memory == pytest.approx(FAMILY_PRIORS["gpu"]["memory"] * cal["engines"]["vllm"]["memory_scale"]["value"])


def test_a_prior_engine_on_a_family_its_rows_never_covered_takes_the_unseen_engines_band():
    """The default engine (vLLM, fitted on GPU rows only): an H100's band is vLLM's slice, a Xeon's
    the unseen engines' slice of the calibration (the widest evidence: leave-engines-out)."""
    bands = B.shipped_bands()
    ev = evaluate({"hardware": ["xeon-spr", "h100-sxm"], "model": "llama-3.1-8b", "batch": 4,
                   "prompt_len": 256, "gen_len": 16})
    low, high = np.asarray(ev["band_throughput_low"]), np.asarray(ev["band_throughput_high"])
    unseen = bands[B.slice_key(B.UNSEEN, "", "", "throughput")]
    assert (low[0], high[0]) == (unseen["low"], unseen["high"])
    assert (low[1], high[1]) == B.band_for(bands, "vllm", "nvidia", "throughput")[:2]
    assert (low[0], high[0]) != (low[1], high[1])


@pytest.mark.parametrize("bad", [["gpuu"], "gpu", {"gpu": 1}])
def test_an_engine_families_entry_that_is_not_a_list_of_known_families_is_refused_in_one_line(tmp_path, bad):
    path = _calibration(tmp_path, engines={"vllm": {"memory_scale": {"value": 0.6}}}, engine_families={"vllm": bad})
    with pytest.raises(DseError) as e:
        engine_efficiency(efficiency_for("cpu", path), get_engine("vllm"), path=path, family="cpu")
    assert "engine_families.vllm" in str(e.value) and "known: gpu" in str(e.value) and "\n" not in str(e.value)


def test_every_source_weighs_the_same_in_the_fit():
    """Sources of 6, 3 and 1 rows: each source's weights sum to N / G = 10 / 3, its rows alike, mean 1."""
    cases = [_case("vllm", source=s) for s in "aaaaaabbbc"]
    w = C.source_weights(cases)
    for s in "abc":
        mine = w[[c.row.source == s for c in cases]]
        assert np.sum(mine) == pytest.approx(10 / 3, rel=1e-12) and np.ptp(mine) == 0.0
    assert np.mean(w) == pytest.approx(1.0, rel=1e-12)


def test_the_weighted_robust_residuals_minimise_each_rows_soft_l1_loss_times_its_weight():
    """A constant fitted to log-ratios through ``weighted_robust`` (plain least squares) lands where a
    scalar minimiser of sum_i w_i rho((r_i / F)^2) F^2 / 2 does, rho scipy's documented soft_l1,
    2 ((1 + z)^0.5 - 1); and without weights and near zero the residuals are the log-ratios."""
    from scipy.optimize import least_squares, minimize_scalar
    r = np.array([0.02, -0.05, 0.08, 0.6, -0.9, 0.01])
    w = np.array([3.0, 3.0, 0.5, 0.5, 0.5, 1.0])
    f = C.F_SCALE

    def cost(c):
        return np.sum(w * 0.5 * f * f * 2 * (np.sqrt(1 + ((r - c) / f) ** 2) - 1))
    fitted = least_squares(lambda x: C.weighted_robust(r - x[0], w), [0.0], loss="linear", xtol=1e-14,
                           ftol=1e-14, gtol=1e-14).x[0]
    assert fitted == pytest.approx(minimize_scalar(cost, bounds=(-1, 1), method="bounded",
                                                   options={"xatol": 1e-12}).x, abs=1e-7)
    assert 0.5 * np.sum(C.weighted_robust(r, w) ** 2) == pytest.approx(cost(0.0), rel=1e-12)
    small = np.array([1e-5, -2e-5])
    assert C.weighted_robust(small, np.ones(2)) == pytest.approx(small, rel=1e-8)


def test_a_finite_run_past_the_capacity_fits_its_throughput_not_its_queued_latencies():
    """DeepSeek-R1 on 8 H200 (serving_gpu.csv): 50 requests of 10,000 tokens sent at 10 a second queue;
    the calibration fits their throughput and TPOT and leaves their TTFT and E2E to validation."""
    cases, skipped, _ = C.read_cases([shipped_file("data", "gathered", "serving_gpu.csv")])
    left = {r.id: why for r, why in skipped if why == C.QUEUED_NOT_FITTED}
    fitted = {c.row.id for c in cases}
    assert {"G106", "G118"} <= set(left)                      # SGLang 10k-token prompts: mean TTFT
    assert {"G105", "G107", "G117", "G119"} <= fitted         # their throughput and ITL
    assert "G100" in fitted                                   # 1k-token prompts, served at once: TTFT fitted
    assert all(C.family_of_metric(r.metric) in C.QUEUE_FAMILIES for r, why in skipped if why == C.QUEUED_NOT_FITTED)


def test_a_prior_engine_takes_the_unseen_band_of_its_own_hardware_vendor():
    """Leave-engines-out residuals of two vendors, one much wider: a prior engine on the narrow
    vendor's hardware takes that vendor's band (its own rows' conformal order statistics), on a
    vendor with too few rows the family's band of every vendor."""
    rng = np.random.default_rng(3)
    nvidia, aws = rng.normal(0.0, 0.1, 100), rng.normal(1.0, 0.6, 100)
    few = rng.normal(0.0, 0.1, B.MIN_ROWS - 1)
    res = np.concatenate([nvidia, aws, few])
    vendors = ["nvidia"] * 100 + ["aws"] * 100 + ["amd"] * (B.MIN_ROWS - 1)
    bands = B.unseen_bands(res, ["tpot"] * len(res), vendors)
    lo, hi, where = B.band_for(bands, B.UNSEEN, "nvidia", "tpot")
    assert where == "engine=unseen vendor=nvidia family=tpot"
    k = int(np.ceil(101 * 0.95))
    assert (lo, hi) == pytest.approx((np.exp(np.sort(nvidia)[100 - k]), np.exp(np.sort(nvidia)[k - 1])), rel=1e-3)
    assert B.band_for(bands, B.UNSEEN, "amd", "tpot")[2] == "engine=unseen family=tpot"
    assert B.band_for(bands, B.PRIOR_LABEL, "aws", "tpot")[2] == "engine=unseen vendor=aws family=tpot"
