"""validate and calibrate: predictions equal analyze's, bad CSVs give one clear error,
the ideal bound holds on the reference data and the calibrated default meets the
error targets there."""
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
from conftest import ROOT, reference_file, run_cli

from dse.core.efficiency import Efficiency, efficiency_for
from dse.core.engines import engine_efficiency, get_engine
from dse.fit import calibrate as C
from dse.fit import validate as V
from dse.system.analysis import analyze
from hwmodels.presets import load_device
from workloads.model import load_model
from workloads.scenario import Scenario

HEADER = "id,model_slug,hardware_slug,devices,batch,prompt_len,gen_len,weights,activations,kv,metric,value,framework"
HAND_MADE = [
    "A1,llama-2-7b,a100-80gb,1,8,512,128,fp16,fp16,fp16,output_tokens_per_s,900,",
    "A2,llama-2-70b,h100-sxm,4,1,128,1,fp8,fp8,fp8,ttft_s,0.02,",
    "A3,llama-3.1-8b,h100-sxm,1,max,128,128,fp8,fp8,fp8,output_tokens_per_s,20000,",
    "A4,llama-2-70b,h100-sxm,1,4,256,32,fp16,fp16,fp16,tpot_s,0.1,",                       # does not fit: offload
    "A5,llama-2-70b,a100-80gb,4,64,2048,128,fp16,fp16,fp16,output_tokens_per_s_per_device,100,"
    "TensorRT-LLM v0.6.1 (static batch)",                                                   # legacy GQA kernel
]


def _csv(tmp_path, lines, header=HEADER, name="m.csv"):
    p = tmp_path / name
    p.write_text("\n".join([header, *lines]) + "\n")
    return p


def test_validate_numbers_equal_analyze(tmp_path):
    res = V.validate(_csv(tmp_path, HAND_MADE))
    assert [r["id"] for r in res.rows] == ["A1", "A2", "A3", "A4", "A5"] and not res.unpredictable
    rows = {r["id"]: r for r in res.rows}
    h100, a100 = load_device("h100-sxm"), load_device("a100-80gb")

    def expect(model, dev, metric, efficiency=None, **kw):
        batch_max = kw.pop("batch") == "max"
        offload = kw.pop("offload", "none")
        sc = Scenario.make(batch=1 if batch_max else kw.pop("b"), flash_attention=True, **kw)
        s = analyze(load_model(model), dev, sc, batch_max=batch_max, offload=offload,
                    efficiency=efficiency or engine_efficiency(efficiency_for(dev), get_engine("default"))).summary
        return s[metric], s["batch"]

    cases = {
        "A1": expect("llama-2-7b", a100, "output_tokens_per_s", batch=8, b=8, prompt_len=512, gen_len=128),
        "A2": expect("llama-2-70b", h100, "ttft_s", batch=1, b=1, prompt_len=128, gen_len=1, tp=4,
                     weights="fp8", activations="fp8", kv="fp8"),
        "A3": expect("llama-3.1-8b", h100, "output_tokens_per_s", batch="max", prompt_len=128, gen_len=128,
                     weights="fp8", activations="fp8", kv="fp8"),
        "A4": expect("llama-2-70b", h100, "tpot_s", batch=4, b=4, prompt_len=256, gen_len=32, offload="greedy"),
        "A5": expect("llama-2-70b", a100, "output_tokens_per_s_per_device", batch=64, b=64, prompt_len=2048,
                     gen_len=128, tp=4, efficiency=engine_efficiency(efficiency_for(a100), get_engine("trt-llm-legacy"),
                                                                     8.0)),
    }
    for k, (value, batch) in cases.items():
        assert rows[k]["predicted"] == pytest.approx(value, rel=1e-12), k
        assert rows[k]["batch"] == batch
    assert rows["A4"]["offload"] == "greedy" and rows["A3"]["batch"] > 100
    assert rows["A5"]["engine"] == "trt-llm-legacy" and rows["A1"]["engine"] == "vllm"
    assert rows["A1"]["error"] == pytest.approx(rows["A1"]["predicted"] / 900 - 1)
    stats = V.summarize(res.rows)
    assert stats["overall"]["n"] == 5 and set(stats["metric"]) == {r["metric"] for r in res.rows}


def test_fast_predictor_equals_analyze_on_reference_rows():
    rows, _ = V.read_measured(reference_file("measured_calibration.csv"))
    cases, _ = V.prepare_all(rows)
    eff = Efficiency(compute=0.6, compute_half_rows=10, memory=0.8, kv_reread_exponent=0.9, op_overhead_s=4e-6,
                     step_overhead_s=1e-4, request_overhead_s=1e-3, prefill_decode_overlap=0.3)
    from dse.system.analysis import analyze_point
    together = V.Predictions(cases).values(eff)         # every row in one table
    for c, v in zip(cases, together):                  # each row alone, through analyze
        alone = analyze_point(c.columns, efficiency=c.efficiency(eff, {}))[0].summary[c.row.metric]
        assert v == pytest.approx(alone, rel=1e-12), c.row.id


def test_bad_csv_lists_every_bad_row(tmp_path):
    lines = [
        HAND_MADE[0],
        "B2,llama-9,a100-80gb,1,8,512,128,fp16,fp16,fp16,output_tokens_per_s,900,",
        "B3,llama-2-7b,tpu-v99,1,8,512,128,fp16,fp16,fp16,output_tokens_per_s,900,",
        "B4,llama-2-7b,a100-80gb,one,8,512,128,fp16,fp16,fp16,output_tokens_per_s,fast,",
        "B5,llama-2-7b,a100-80gb,1,8,512,128,fp12,fp16,fp16,tokens,900,",
    ]
    table = V.read_table(_csv(tmp_path, lines))        # the good row goes on; each bad one is named
    assert [r.id for r in table.rows] == ["A1"] and len(table.bad) == 4
    msg = "; ".join(table.bad)
    assert "m.csv" in msg and "\n" not in msg
    for needle in ("line 3: model_slug: no model of that name", "line 4: hardware_slug: no hardware of that name",
                   "line 5: devices: expected a positive integer, got text that is not a number",
                   "value: expected a positive number, got text that is not a number",
                   "line 6: weights: unknown format", "metric: unknown; allowed: ttft_s"):
        assert needle in msg, needle
    for cell in ("llama-9", "tpu-v99", "'one'", "fast", "fp12", "'tokens'"):   # no cell quoted back
        assert cell not in msg, cell
    assert "line 2" not in msg


def test_bad_csv_on_the_command_line(tmp_path):
    missing = _csv(tmp_path, ["x,llama-2-7b,a100-80gb,1"], header="id,model_slug,hardware_slug,devices",
                   name="short.csv")
    r = run_cli("validate", "--measured", missing, "--out", tmp_path / "out")
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert "short.csv: missing column(s) batch, prompt_len, gen_len, weights" in r.stderr
    bad = _csv(tmp_path, [HAND_MADE[0].replace(",900,", ",n/a,"), HAND_MADE[1].replace(",4,1,", ",4,-1,")])
    r = run_cli("calibrate", "--measured", bad, "--out", tmp_path / "cal.yaml")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "m.csv: 2 bad row(s) and none to validate: line 2: value: expected a positive number, got text that is " \
           "not a number; line 3: batch: expected a positive integer, got a negative number" in r.stderr
    r = run_cli("validate", "--measured", tmp_path / "nope.csv")
    assert r.returncode == 2 and "nope.csv: cannot read the measured-results CSV" in r.stderr


def test_unpredictable_rows_are_listed_with_the_reason(tmp_path):
    lines = [HAND_MADE[0], "U2,opt-175b,t4,1,256,512,32,fp16,fp16,fp16,output_tokens_per_s,0.69,FlexGen",
             "U3,llama-2-7b,rtx-4090,2,8,512,128,fp16,fp16,fp16,output_tokens_per_s,900,"]
    res = V.validate(_csv(tmp_path, lines))
    assert [r["id"] for r in res.rows] == ["A1"]
    why = {r.id: reason for r, reason in res.unpredictable}
    assert "does not fit even with greedy overflow to the host" in why["U2"] and "host memory" in why["U2"]
    assert "no interconnect" in why["U3"]
    text = V.report_text(res)
    assert "Unpredictable rows (2)" in text and "U2 (line 3)" in text


def test_engine_profiles():
    row = V.MeasuredRow(2, "x", "llama-2-70b", "h100-sxm", 4, 4, 1, 8, 128, 128, "fp8", "fp8", "fp8", "ttft_s", 1.0)
    assert V.engine_of(row).name == "vllm" and V.engine_of(row).gqa_kv_sharing     # the default engine
    old = replace(row, framework="TensorRT-LLM v0.5 (static batch)")
    assert not V.engine_of(old).gqa_kv_sharing and V.engine_of(old).flash_attention
    assert V.engine_of(replace(row, framework="TensorRT-LLM trtllm-bench (PyTorch backend)")).batching == "inflight"
    assert not V.engine_of(replace(row, framework="FlexGen")).flash_attention
    assert V.engine_of(replace(old, overrides={"gqa_kv_sharing": True})).gqa_kv_sharing


@pytest.fixture(scope="module")
def reference():
    path = reference_file("measured_calibration.csv")
    rows, _ = V.read_measured(path)
    cases, skipped = V.prepare_all(rows)
    return path, cases, skipped


def test_ideal_bound_holds_on_reference_data(reference):
    path, cases, skipped = reference
    res = V.validate(path, ideal=True, cases=cases, skipped=skipped)
    assert len(res.rows) >= 40
    assert V.bound_violations(res.rows) == []


def test_calibrated_default_meets_targets_on_reference_data(reference):
    path, cases, skipped = reference
    res = V.validate(path, cases=cases, skipped=skipped)
    s = V.summarize(res.rows)["overall"]
    assert s["n"] >= 40 and len(skipped) <= 2
    assert s["median_ape"] <= 0.10, s
    # 0.26 (was 0.25): TensorRT-LLM's batch-'max' rows (M091-M095) now size the KV cache from 90 % of
    # the memory weights and activations leave (free_gpu_memory_fraction), as TensorRT-LLM does: their
    # largest batch falls 7-10 % and their throughput 0.1-1.3 %, against a calibration fitted without
    # it (p90 0.2520 after, median 0.054 unchanged)
    assert s["p90_ape"] <= 0.26, s


@pytest.mark.slow
def test_validate_cli_writes_report_and_plot(tmp_path):
    out = tmp_path / "v"
    lines = [HAND_MADE[0].replace(",900,", ",100,"), HAND_MADE[1].replace(",0.02,", ",0.05,")]
    r = run_cli("validate", "--measured", _csv(tmp_path, lines), "--out", out)
    assert r.returncode == 0, r.stderr
    assert "median" in r.stdout and "A2" in r.stdout
    assert (out / "validation.csv").read_text().startswith("id,line,model")
    assert (out / "predicted_vs_measured.png").stat().st_size > 10_000 and (out / "summary.md").is_file()
    r = run_cli("validate", "--measured", _csv(tmp_path, lines), "--out", out, "--ideal")
    assert r.returncode == 0 and "Ideal bound holds" in r.stdout
    lines[0] = lines[0].replace(",100,", ",1e6,")       # faster than the roofline allows
    r = run_cli("validate", "--measured", _csv(tmp_path, lines), "--out", out, "--ideal")
    assert r.returncode == 0 and "Ideal bound broken by 1 row(s)" in r.stdout and "A1 (line 2)" in r.stdout


def test_fit_recovers_known_parameters_and_writes_notes(tmp_path, reference):
    _, cases, _ = reference
    truth = Efficiency(compute=0.55, memory=0.8, op_overhead_s=6e-6)
    # rows whose "measurements" are the predictions of known parameters
    values = V.Predictions(cases[:12]).values(truth)
    synthetic = [replace(c, row=replace(c.row, value=float(v))) for c, v in zip(cases[:12], values)]
    params = [C.Param("compute", 0.2, 1.0, False, 0.7, "GEMM fraction (a single Efficiency's field: the kernel "
                      "layer is not in FIT)"), C.Param("memory", 0.3, 1.0, False, 0.85, "bandwidth fraction"),
              next(q for q in C.FIT if q.name == "op_overhead_s")]
    f = C.fit(V.Predictions(synthetic), Efficiency(), params, starts=1)
    assert f.params["compute"] == pytest.approx(0.55, rel=1e-3) and f.params["memory"] == pytest.approx(0.8, rel=1e-3)
    assert np.max(np.abs(f.errors)) < 1e-4
    out = tmp_path / "cal.yaml"
    C.write_calibration(out, {"classes": {"gpu": {k: {"value": v, "note": "fitted from test"}
                                                   for k, v in f.params.items()}}})
    assert efficiency_for("gpu", path=str(out)).compute == pytest.approx(0.55, rel=1e-3)


def test_validation_modules_import_light():
    code = ("import sys; import dse.fit.validate, dse.fit.calibrate, dse.study.calibration_cli; "
            "heavy = {'pandas','optuna','seaborn','matplotlib','scipy'} & set(m.split('.')[0] for m in sys.modules); "
            "sys.stderr.write(repr(sorted(heavy)))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0 and r.stderr.strip() == "[]", r.stderr


def test_kernel_layer_prices_every_gpu_row_and_no_other(reference):
    """``validate --kernel-layer learned`` prices each GPU row's matmuls and attention by the kernel
    tables' model, so its prediction moves; a row on another family (the CPU of a FlexGen offload
    run's host tier, a non-GPU device) keeps the family's own physics, and the ideal bound ignores
    the layer entirely."""
    path, cases, skipped = reference
    fitted = {r["id"]: r["predicted"] for r in V.validate(path, cases=cases, skipped=skipped).rows}
    learned = {r["id"]: r["predicted"] for r in
               V.validate(path, cases=cases, skipped=skipped, kernel_layer="learned").rows}
    family = {c.row.id: c.device.efficiency_family for c in cases}
    gpu = [i for i in fitted if i in learned and family[i] == "gpu"]
    assert len(gpu) >= 30
    assert sum(abs(learned[i] / fitted[i] - 1) > 1e-6 for i in gpu) >= 0.9 * len(gpu)
    assert all(learned[i] == fitted[i] for i in fitted if i in learned and family[i] != "gpu")
    ideal = {r["id"]: r["predicted"] for r in V.validate(path, ideal=True, cases=cases, skipped=skipped,
                                                       kernel_layer="learned").rows}
    assert ideal == {r["id"]: r["predicted"] for r in V.validate(path, ideal=True, cases=cases,
                                                                   skipped=skipped).rows}
