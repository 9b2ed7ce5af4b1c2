"""validate on measured serving runs: a continuous row is predicted through the evaluator with
its load, the gathered schema is read directly (engine, metric names, lengths, formats),
rows the model cannot express are listed with their reason without rejecting the file,
and the shipped gathered file runs end to end."""
import csv
import math

import numpy as np
import pytest
from conftest import run_cli

from basis.shipped import shipped_file
from dse import evaluate
from dse.fit import validate as V

GATHERED = ("id,model,model_slug,hardware,hardware_slug,devices,tp,pp,engine,engine_version,serving,concurrency,"
            "request_rate,num_prompts,dataset,prompt_len,gen_len,weights,activations,kv,metric,value")
#: the conditions of most rows: Llama-3.1-8B on one H100, 1024 in / 256 out, BF16
BASE = "Llama-3.1-8B,llama-3.1-8b,H100,h100-sxm,1,1,1"


def _gathered(tmp_path, lines, name="g.csv"):
    p = tmp_path / name
    p.write_text("\n".join([GATHERED, *lines]) + "\n")
    return p


def _point(**load):
    """The design point of BASE under ``load``, written by hand (the independent path); a row that
    names its engine is that engine's point (its memory rule included), one that names none the
    generic one."""
    return {"model": "llama-3.1-8b", "hardware": "h100-sxm", "tp": 1, "prompt_len": 1024, "gen_len": 256,
            "weights": "bf16", "activations": "bf16", "kv": "bf16", **load}


def _expect(metric, **load) -> float:
    ev = evaluate(_point(**load))
    assert ev.feasible[0], ev.reason_text(0)
    return float(ev[metric][0])


ROWS = [
    f"C1,{BASE},sglang,0.4,continuous,16,,,random,1024,256,bf16,bf16,,output_tokens_per_s,1500",
    f"C2,{BASE},sglang,0.4,continuous,16,,,random,1024,256,bf16,bf16,,itl_mean_s,0.01",
    f"C3,{BASE},vllm,0.8,continuous,,4,400,random,1024,256,bf16,,,ttft_mean_s,0.05",
    f"C4,{BASE},vllm,0.8,continuous,,4,400,random,1024,256,bf16,bf16,,e2e_mean_s,3",
    f"C5,{BASE},vllm,0.8,continuous,,inf,2000,random,1024,256,bf16,bf16,,requests_per_s,20",
    f"C6,{BASE},vllm,0.8,continuous,,1000,64,random,1024,256,bf16,bf16,,output_tokens_per_s,3000",
    f"S1,{BASE},sglang,0.4,static,1,,,random,1024,256,bf16,bf16,,output_tokens_per_s,120",
    f"C7,{BASE},vllm,0.8,continuous,,inf,2000,random,1024,256,bf16,bf16,,ttft_mean_s,30",
    f"C8,{BASE},vllm,0.8,continuous,,1000,64,random,1024,256,bf16,bf16,,ttft_mean_s,2",
    # not predictable: prefill only, unknown model, no preset, unknown format, text for a value
    f"U1,{BASE},sglang,0.4,continuous,8,,,random,2048,,bf16,bf16,,total_tokens_per_s,50000",
    "U2,Llama-9,llama-9,H100,h100-sxm,1,1,1,vllm,0.8,continuous,4,,,random,1024,256,bf16,bf16,,ttft_mean_s,0.1",
    "U3,Llama-3.1-8B,llama-3.1-8b,AMD MI350,,1,1,1,vllm,0.8,continuous,4,,,random,1024,256,bf16,bf16,,ttft_mean_s,1",
    f"U4,{BASE},vllm,0.8,continuous,4,,,random,1024,256,gptq-int4,fp16,,ttft_mean_s,0.1",
    f"U7,{BASE},vllm,0.8,continuous,,4,400,sharegpt,,,bf16,bf16,,output_tokens_per_s,700",
    f"U8,{BASE},vllm,0.8,continuous,,4,400,random,1024,256,bf16,bf16,,ttft_mean_s,fast",
]


@pytest.fixture(scope="module")
def serving(tmp_path_factory):
    path = _gathered(tmp_path_factory.mktemp("serving"), ROWS)
    return V.validate(path)


def test_continuous_rows_equal_the_evaluator(serving):
    rows = {r["id"]: r for r in serving.rows}
    assert {"C1", "C2", "C3", "C4", "C5", "C6", "S1"} <= set(rows)
    assert rows["C1"]["predicted"] == pytest.approx(_expect("output_tokens_per_s", concurrency=16, engine="sglang"),
                                                    rel=1e-12)
    # mean inter-token latency is the evaluator's mean TPOT
    assert rows["C2"]["predicted"] == pytest.approx(_expect("tpot_s", concurrency=16, engine="sglang"), rel=1e-12)
    assert rows["C2"]["metric"] == "tpot_s" and rows["C2"]["measured_as"] == "itl_mean_s"
    # an open loop (activations and KV left empty: the BF16 checkpoint's own format)
    assert rows["C3"]["predicted"] == pytest.approx(_expect("ttft_s", request_rate=4.0, engine="vllm"), rel=1e-12)
    assert rows["C4"]["predicted"] == pytest.approx(_expect("e2e_latency_s", request_rate=4.0, engine="vllm"), rel=1e-12)
    # all 2,000 requests sent at once: a finite run at 10^12 requests/s, queued and drained; its
    # engine the closed loop at its running cap
    at_once = {"request_rate": V.ALL_AT_ONCE, "num_prompts": 2000, "engine": "vllm"}
    assert rows["C5"]["predicted"] == pytest.approx(_expect("requests_per_s", **at_once), rel=1e-12)
    cap = evaluate(_point(concurrency=10**5, engine="vllm"))
    assert rows["C5"]["predicted"] == pytest.approx(cap["requests_per_s"][0], rel=1e-12)
    assert rows["C5"]["load"] == "all 2000 at once (past the capacity: queued and drained)"
    assert rows["C7"]["predicted"] == pytest.approx(_expect("ttft_s", **at_once), rel=1e-12)
    assert rows["C7"]["predicted"] > 10 * _expect("ttft_s", concurrency=int(cap["running_batch"][0]), engine="vllm")
    # 1,000 req/s saturates the design; its 64 prompts run as a closed loop at 64, queued for the prefill
    assert not evaluate(_point(request_rate=1000.0, engine="vllm")).feasible[0]
    assert rows["C6"]["predicted"] == pytest.approx(_expect("output_tokens_per_s", concurrency=64, engine="vllm"), rel=1e-12)
    assert "queued and drained" in rows["C6"]["load"] and rows["C6"]["batch"] == 64
    assert rows["C8"]["predicted"] == pytest.approx(
        _expect("ttft_s", request_rate=1000.0, num_prompts=64, engine="vllm"), rel=1e-12)
    assert {rows[k]["serving"] for k in ("C1", "C3", "C5")} == {"continuous"} and rows["S1"]["serving"] == "static"
    assert rows["C1"]["family"] == "throughput" and rows["C3"]["family"] == "TTFT" and rows["C2"]["family"] == "TPOT"


def test_static_row_is_predicted_as_before(serving, tmp_path):
    """The gathered schema's static row at concurrency 1 is a static batch of 1, as the calibration
    schema predicts it (and as the evaluator does)."""
    calib = tmp_path / "c.csv"
    calib.write_text("id,model_slug,hardware_slug,devices,batch,prompt_len,gen_len,weights,activations,kv,metric,"
                     "value,framework\nS1,llama-3.1-8b,h100-sxm,1,1,1024,256,bf16,bf16,bf16,output_tokens_per_s,120,"
                     "SGLang\n")
    old = V.validate(calib).rows[0]
    new = next(r for r in serving.rows if r["id"] == "S1")
    assert new["predicted"] == old["predicted"]
    assert old["predicted"] == pytest.approx(_expect("output_tokens_per_s", batch=1, engine="sglang"), rel=1e-12)
    assert new["batch"] == 1 and old["serving"] == "static"


def test_unpredictable_rows_are_listed_with_their_reason(serving):
    why = {r.id: str(reason) for r, reason in serving.unpredictable}
    means = "lengths" in V.WORKLOAD_PARAMS       # ShareGPT's published means stand in for unstated lengths
    assert set(why) == {"U1", "U2", "U3", "U4", "U8"} | (set() if means else {"U7"})
    assert "lengths not stated (gen_len)" in why["U1"]
    assert "model_slug: no model of that name" in why["U2"] and "llama-9" not in why["U2"]
    assert "no hardware preset for the hardware named" in why["U3"] and "MI350" not in why["U3"]
    assert "weights: unknown format" in why["U4"] and "gptq" not in why["U4"]
    assert "value: expected a positive number, got text that is not a number" in why["U8"]
    if means:
        u7 = next(r for r in serving.rows if r["id"] == "U7")
        assert (u7["prompt_len"], u7["gen_len"]) == (161, 338) and "Kwon" in u7["lengths_from"]
    else:
        assert why["U7"] == "lengths not stated"
    text = V.report_text(serving)
    assert f"Unpredictable rows ({len(why)})" in text and "U1 (line 11) llama-3.1-8b on 1x h100-sxm, continuous concurrency 8" \
        in text
    assert "by reason" in text and "family TTFT" in text and "family throughput" in text
    assert "concurrency 16" in text and "all 2000 at once" in text and "4 req/s x 400" in text


def test_medians_use_percentiles_only_where_the_evaluator_has_them(tmp_path, monkeypatch):
    lines = [f"M1,{BASE},vllm,0.8,continuous,16,,,random,1024,256,bf16,bf16,bf16,ttft_median_s,0.2",
             f"M2,{BASE},vllm,0.8,continuous,16,,,random,1024,256,bf16,bf16,bf16,ttft_mean_s,0.2"]
    path = _gathered(tmp_path, lines)
    if "ttft_p50_s" in V.EVALUATOR_METRICS:
        res = V.validate(path)
        m1 = next(r for r in res.rows if r["id"] == "M1")
        assert m1["metric"] == "ttft_p50_s"
        assert m1["predicted"] == pytest.approx(_expect("ttft_p50_s", concurrency=16, engine="vllm"), rel=1e-12)
    monkeypatch.setattr(V, "EVALUATOR_METRICS", tuple(m for m in V.EVALUATOR_METRICS if "_p50_" not in m))
    res = V.validate(path)
    assert [r["id"] for r in res.rows] == ["M2"]        # never the mean in the median's place
    (row, why), = res.unpredictable
    assert row.id == "M1" and "percentile not modelled" in why and "ttft_p50_s" in why


def test_serving_columns_in_the_calibration_schema(tmp_path):
    """The calibration schema reads serving, concurrency and request_rate too: a continuous row
    with no load is a closed loop at its batch."""
    p = tmp_path / "c.csv"
    p.write_text("id,model_slug,hardware_slug,devices,batch,prompt_len,gen_len,weights,activations,kv,metric,value,"
                 "serving,concurrency,request_rate\n"
                 "K1,llama-3.1-8b,h100-sxm,1,8,1024,256,bf16,bf16,bf16,tpot_s,0.01,continuous,,\n"
                 "K2,llama-3.1-8b,h100-sxm,1,,1024,256,bf16,bf16,bf16,ttft_s,0.1,,,2\n"
                 "K3,llama-3.1-8b,h100-sxm,1,8,1024,,bf16,bf16,bf16,tpot_s,0.01,,,\n")
    res = V.validate(p)
    rows = {r["id"]: r for r in res.rows}
    assert rows["K1"]["predicted"] == pytest.approx(_expect("tpot_s", concurrency=8), rel=1e-12)
    assert rows["K2"]["predicted"] == pytest.approx(_expect("ttft_s", request_rate=2.0), rel=1e-12)
    assert [(r.id, str(w)) for r, w in res.unpredictable] == [("K3", "lengths not stated (gen_len)")]
    p.write_text(p.read_text().replace("continuous,,", "continuous,x,"))
    table = V.read_table(p)                             # the bad row is named, the others go on
    assert table.bad == [f"{p}: line 2: concurrency: expected a positive integer, got text that is not a number"] and [r.id for r in table.rows] == ["K2"]


@pytest.mark.slow
def test_shipped_gathered_file_end_to_end(tmp_path):
    path = shipped_file("data", "gathered", "serving_gpu.csv")
    res = V.validate(path)
    n = sum(1 for _ in csv.DictReader(path.open()))
    scored = sum(1 for r in csv.DictReader(path.open()) if r.get("scored", "yes") != "no")
    assert len(res.rows) >= 50 and len(res.rows) + len(res.unpredictable) == scored and n >= scored
    assert all(math.isfinite(r["predicted"]) and r["predicted"] > 0 for r in res.rows)
    assert all(str(why) for _, why in res.unpredictable)
    why = {r.id: str(w) for r, w in res.unpredictable}
    assert "no hardware preset for the hardware named" in why["G079"]
    assert sum(V.tally(res.unpredictable).values()) >= len(res.unpredictable)
    stats = V.summarize(res.rows)
    assert {"throughput", "TPOT"} <= set(stats["family"]) and np.isfinite(stats["family"]["TPOT"]["p90_ape"])
    r = run_cli("validate", "--measured", path, "--out", tmp_path / "v", "--quiet")
    assert r.returncode == 0, r.stderr
    assert "Unpredictable rows" in r.stdout and "family throughput" in r.stdout
    written = list(csv.DictReader((tmp_path / "v" / "validation.csv").open()))
    assert len(written) == scored and {"serving", "load", "family", "unpredictable"} <= set(written[0])
