"""Study reports: summary.md, report.html, plots and plots.json, checked for content."""
import base64
import hashlib
import html
import json
import re
import shutil

import numpy as np
import pandas as pd
import pytest
from conftest import run_cli

STUDY = """\
name: report-grid
description: H100 vs B200 serving Llama-2-7B, by batch, prompt length and HBM bandwidth.
space:
  hardware: [h100-sxm, b200]
  model: llama-2-7b
  batch: [1, 8, 64]
  prompt_len: [128, 1024]
  gen_len: 64
  memory_bandwidth: {min: 1.0e12, max: 8.0e12, count: 8}
objectives:
  output_tokens_per_s: max
  memory_bandwidth: min
constraints:
  tpot_s: {max: 0.02}
method: grid
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("report")
    (d / "study.yaml").write_text(STUDY)
    out = d / "out"
    r = run_cli("run", d / "study.yaml", "--out", out, "--quiet")
    assert r.returncode == 0, r.stderr
    assert f"summary: {out / 'summary.md'}" in r.stdout
    results = pd.read_parquet(out / "results.parquet")
    return {"out": out, "stdout": r.stdout, "results": results, "front": pd.read_csv(out / "pareto.csv"),
            "plots": json.loads((out / "plots.json").read_text()),
            "summary": (out / "summary.md").read_text(), "html": (out / "report.html").read_text()}


def _analysis(row):
    """The design point of a results row analyzed on its own (a one-row evaluation)."""
    from dse.system.analysis import analyze_point
    from dse.system.params import PARAMS
    return analyze_point({k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()
                          if k in PARAMS and v is not None and v == v})[0]


def _best(results, name, sense):
    feas = results[results["feasible"]]
    return feas[name].max() if sense == "max" else feas[name].min()


def test_run_writes_report_files(run):
    out = run["out"]
    for f in ("summary.md", "report.html", "plots.json", "pareto_memory_bandwidth.png", "roofline.png", "breakdown.png",
              "sweep_batch.png", "sweep_seq.png"):
        assert (out / f).is_file(), f
    for f in out.glob("*.png"):
        assert f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(out.glob("*.tmp"))
    assert {f for f, rec in run["plots"].items() if "skipped" not in rec} == {p.name for p in out.glob("*.png")}


def test_pareto_plot_highlights_exactly_the_front_with_units(run):
    rec = run["plots"]["pareto_memory_bandwidth.png"]
    front = run["front"]
    assert rec["x"] == "memory_bandwidth" and rec["y"] == "output_tokens_per_s"
    assert sorted(rec["highlighted"]) == sorted(front["point"].tolist())
    by_id = front.set_index("point")
    np.testing.assert_allclose(rec["highlighted_x"], by_id.loc[rec["highlighted"], "memory_bandwidth"] / 1e12)
    np.testing.assert_allclose(rec["highlighted_y"], by_id.loc[rec["highlighted"], "output_tokens_per_s"])
    assert "(TB/s)" in rec["x_label"] and "(tokens/s)" in rec["y_label"]
    assert rec["background_points"] == int(run["results"]["feasible"].sum())
    # the 2-objective front drawn as a line is the pareto.csv front itself here (2 objectives)
    assert sorted(rec["front_2d"]) == sorted(front["point"].tolist())


def test_summary_names_best_design_per_objective(run):
    text, results = run["summary"], run["results"]
    assert text.startswith("# report-grid")
    assert f"Points evaluated: {len(results):,}" in text
    assert f"Feasible: {int(results['feasible'].sum()):,}" in text
    assert f"Pareto front: {len(run['front']):,} designs" in text
    for name, sense in (("output_tokens_per_s", "max"), ("memory_bandwidth", "min")):
        m = re.search(rf"^\| {name} \| {sense} \| [^|]+ \| ([^|]+) \| (\d+) \| ([^|]+) \|", text, re.MULTILINE)
        assert m, name
        value, point, hardware = float(m.group(1)), int(m.group(2)), m.group(3).strip()
        best = _best(results, name, sense)
        assert value == pytest.approx(best, rel=1e-5)
        row = results.set_index("point").loc[point]
        assert row["feasible"] and row[name] == best and row["hardware"] == hardware
        assert f"### {name} ({sense}imize)" in text
    assert re.search(r"Bottleneck — decode: (memory|compute)-bound \(\d+ % of the step\), \d+ % of the step in ", text)


def test_summary_counts_infeasible_reasons(run):
    results = run["results"]
    n = int(results["reason"].str.contains("tpot_s").sum())
    assert n > 0
    assert f"| tpot_s > 0.02 | {n:,} |" in run["summary"]


def test_roofline_operators_are_the_analysis_of_the_best_design(run):
    rec = run["plots"]["roofline.png"]
    results = run["results"]
    best = _best(results, "output_tokens_per_s", "max")
    row = results[results["feasible"] & (results["output_tokens_per_s"] == best)].iloc[0].to_dict()
    assert rec["point"] == row["point"]
    a = _analysis(row)
    expect = [("prefill", r["name"]) for r in a.prefill] + [("decode", r["name"]) for r in a.decode]
    assert [(o["stage"], o["name"]) for o in rec["operators"]] == expect
    rows = {("prefill", r["name"]): r for r in a.prefill} | {("decode", r["name"]): r for r in a.decode}
    plotted = [o for o in rec["operators"] if o["plotted"]]
    assert len(plotted) >= len(expect) - 4          # only ops without arithmetic (embedding, ...) are left out
    for o in plotted:
        r = rows[(o["stage"], o["name"])]
        assert o["arithmetic_intensity"] == pytest.approx(r["arithmetic_intensity"])
        assert o["ops_per_s"] == pytest.approx(r["ops"] / r["time_s"])
    assert rec["x_label"] == "arithmetic intensity (ops/byte)" and rec["y_label"].endswith("(TFLOP/s)")
    assert rec["memory_bandwidth"] == row["memory_bandwidth"] and rec["ceilings"]["fp16"] > 0


def test_breakdown_is_per_operator_time_of_the_best_designs(run):
    rec = run["plots"]["breakdown.png"]
    results = run["results"].set_index("point")
    assert rec["y_unit"] == "%" and rec["y_label"] == "share of one decode step time (%)"
    assert len(rec["designs"]) == 2
    for d, (name, sense) in zip(rec["designs"], (("output_tokens_per_s", "max"), ("memory_bandwidth", "min"))):
        assert results.loc[d["point"], name] == _best(run["results"], name, sense)
        a = _analysis({**results.loc[d["point"]].to_dict(), "point": d["point"]})
        i = rec["designs"].index(d)
        for stage in ("prefill", "decode"):
            total = sum(r["total_time_s"] for r in getattr(a, stage))
            st = rec["stages"][stage]
            assert st["total_s"][i] == pytest.approx(total)
            assert sum(v[i] for v in st["time_s"].values()) == pytest.approx(total)
            for r in getattr(a, stage):
                if r["name"] in st["operators"]:
                    assert st["time_s"][r["name"]][i] == pytest.approx(r["total_time_s"])


def test_sweep_curves_hold_the_other_parameters_at_the_best_design(run):
    rec = run["plots"]["sweep_batch.png"]
    results = run["results"]
    panel = rec["panels"][0]
    assert panel["x"] == "batch" and panel["hue"] == "hardware" and rec["mode"] == "slice"
    assert panel["y_units"] == {"output_tokens_per_s": "tokens/s", "tpot_s": "ms"}
    assert "(sequences)" in panel["x_label"] and panel["y_labels"] == ["output throughput (tokens/s)", "TPOT (ms)"]
    fixed = rec["fixed"]
    assert set(fixed) == {"memory_bandwidth", "prompt_len"}
    by_id = results.set_index("point")
    for line in panel["lines"]:
        pts = by_id.loc[line["points"] + line["infeasible_points"]]
        assert set(pts["hardware"]) == {line["hue"]}
        assert (pts["memory_bandwidth"] == fixed["memory_bandwidth"]).all()
        assert (pts["prompt_len"] == fixed["prompt_len"]).all()
        assert sorted(pts["batch"]) == [1, 8, 64]
        np.testing.assert_allclose(line["y_values"], by_id.loc[line["points"], line["y"]])
    seq = run["plots"]["sweep_seq.png"]["panels"][0]
    assert seq["x"] == "prompt_len" and seq["ys"] == ["ttft_s", "tpot_s", "e2e_latency_s"]
    assert seq["x_label"] == "prompt length (tokens)" and seq["y_labels"][1:] == ["TPOT (ms)", "end-to-end latency (s)"]


def test_background_is_a_bounded_sample(run, tmp_path, monkeypatch):
    from dse.present import report
    from dse.study.studyfile import load_study
    out = tmp_path / "copy"
    shutil.copytree(run["out"], out)
    (tmp_path / "s.yaml").write_text(STUDY)
    data, spec = load_study(str(tmp_path / "s.yaml"))
    monkeypatch.setattr(report, "BACKGROUND_SAMPLE", 10)
    files = report.write_report(out, data, spec, None)      # the front from pareto.csv
    assert out / "summary.md" in files and out / "plots.json" in files
    rec = json.loads((out / "plots.json").read_text())["pareto_memory_bandwidth.png"]
    assert rec["background_points"] == 10
    assert sorted(rec["highlighted"]) == sorted(run["front"]["point"].tolist())
    # the same summary but for how to reproduce it: another study file (same text) and folder
    text = (out / "summary.md").read_text()
    head, how = text.split("## How to reproduce")
    assert head == run["summary"].split("## How to reproduce")[0]
    assert f"dse run {tmp_path / 's.yaml'} --out {out}\n" in how
    assert f"SHA-256 `{hashlib.sha256(STUDY.encode()).hexdigest()}`" in how


def test_units_and_bottleneck_text():
    from dse.present.bottleneck import bottleneck, op_group
    from dse.present.plots import human, label_of
    assert label_of("memory_bandwidth") == "memory bandwidth (GB/s)"
    assert label_of("peak_fp8") == "peak FP8 compute (TFLOP/s)" and label_of("peak_int8").endswith("(TOP/s)")
    assert label_of("memory_capacity").endswith("(GiB)") and label_of("cost_usd").endswith("($)")
    assert human("tpot_s", 0.0123) == "12.3 ms" and human("ttft_s", 2.5) == "2.5 s"
    assert human("memory_bandwidth", 3.35e12) == "3.35 TB/s"
    assert op_group("q_proj") == "*_proj" and op_group("qk_matmul") == op_group("sliding_sv_matmul") == "attention"
    assert op_group("attn_all_reduce") == "communication"

    def row(name, bound, t, w=0.0, kv=0.0, act=0.0, fmt="fp16"):
        return {"name": name, "bound": bound, "total_time_s": t, "count": 1.0, "weight_bytes": w,
                "kv_bytes": kv, "act_bytes": act, "compute_format": fmt}
    b = bottleneck([row("q_proj", "memory", 0.5, w=10), row("down_proj", "memory", 0.21, w=10),
                    row("flash_attention", "memory", 0.2, kv=10), row("softmax", "compute", 0.09)])
    assert b["bound"] == "memory" and b["group"] == "*_proj" and b["what"] == "weight reads"
    assert b["text"] == "memory-bound (91 % of the step), 71 % of the step in weight reads of *_proj"


def _md_rows(text: str, heading: str) -> list[list[str]]:
    """The cells of the first Markdown table after ``heading`` (its header first)."""
    lines = text.split(heading, 1)[1].splitlines()
    rows = [ln for ln in lines[lines.index(next(ln for ln in lines if ln.startswith("|"))):]]
    rows = rows[:next((i for i, ln in enumerate(rows) if not ln.startswith("|")), len(rows))]
    return [[c.strip() for c in ln.strip("|").split(" | ")] for ln in rows if not ln.startswith("| ---")]


def test_best_table_names_each_column_once(run):
    # hardware varies here (h100-sxm, b200): it has its own column and is not repeated among the parameters
    header, *rows = _md_rows(run["summary"], "## Best feasible design per objective")
    assert header.count("hardware") == 1 and len(header) == len(set(header))
    assert header == ["objective", "sense", "best", "value (SI)", "point", "hardware", "batch", "prompt_len"]
    by_id = run["results"].set_index("point")
    for r in rows:
        assert len(r) == len(header)
        row = by_id.loc[int(r[4])]
        assert r[5] == row["hardware"] and r[6] == f"{row['batch']:,}" and r[7] == f"{row['prompt_len']:,}"


def test_summary_sizes_and_rates_follow_the_unit_policy(run):
    from basis.units import bytes_text
    text, results = run["summary"], run["results"]
    best = results.loc[results[results["feasible"]]["output_tokens_per_s"].idxmax()]
    section = text.split("### output_tokens_per_s (maximize)")[1].split("###")[0]
    assert f"memory_bytes {bytes_text(best['memory_bytes'])}," in section and " GB," not in section
    header, *rows = _md_rows(text, "## Pareto front")
    assert header[:4] == ["point", "hardware", "batch", "prompt_len"]      # hardware kept, varied or not
    assert "memory_bandwidth (GB/s)" in header and "output_tokens_per_s (tokens/s)" in header
    col = header.index("memory_bandwidth (GB/s)")
    by_id = results.set_index("point")
    for r in rows:
        assert float(r[col].replace(",", "")) == pytest.approx(by_id.loc[int(r[0]), "memory_bandwidth"] / 1e9,
                                                               rel=5e-3)


def _html_table(page: str, table_id: str) -> list[list[str]]:
    """The body rows of ``<table id=table_id>`` in ``page``, cells as text."""
    body = re.search(rf'<table id="{table_id}">.*?<tbody>(.*?)</tbody>', page, re.S).group(1)
    return [[html.unescape(re.sub(r"<[^>]+>", "", c)) for c in re.findall(r"<td[^>]*>(.*?)</td>", tr)]
            for tr in re.findall(r"<tr>(.*?)</tr>", body)]


def test_report_html_is_self_contained(run):
    page = run["html"]
    assert page.startswith("<!DOCTYPE html>") and "<link" not in page
    # scripts: plotly.js inlined once in the head, one inline script per chart, none with a source
    assert not re.search(r"<script[^>]*\ssrc", page)
    head, body = page.split("</head>", 1)
    assert head.count("<script>") == 1 and "plotly.js v" in head and "<script>" not in body.split("<main>")[0]
    plots = [f for f, rec in run["plots"].items() if "skipped" not in rec]     # the plots drawn
    charted = [f for f in plots if run["plots"][f]["kind"] in ("pareto", "sweep", "comparison")]
    assert charted and body.count("<script>") == len(charted)
    for name in charted:
        assert f'<div id="chart-{name[:-4]}" class="chart"></div><script>Plotly.newPlot("chart-{name[:-4]}",' in body
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", body, re.I)
    assert "cdn.plot.ly" not in body          # (the library names its CDN for maps, which no chart draws)
    assert not re.search(r"url\(", page.split("<script>", 1)[0])       # no fonts or images from CSS
    # the policy allows the page's own scripts alone, by hash: nothing fetched, nothing injected runs
    policy = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', page).group(1)
    assert html.unescape(policy).startswith("default-src 'none'; img-src data:; style-src 'unsafe-inline'; "
                                            "script-src 'sha256-")
    assert html.unescape(policy).count("'sha256-") == 1 + len(charted)
    srcs = re.findall(r'<img src="([^"]+)"', page)
    assert len(srcs) == len(plots) - len(charted)
    for s in srcs:
        assert s.startswith("data:image/png;base64,")
    # each image is the PNG file of that name, byte for byte
    for name in (f for f in plots if f not in charted):
        fig = re.search(rf'<figure id="plot-{re.escape(name[:-4])}"><img src="data:image/png;base64,([^"]+)"', page)
        assert base64.b64decode(fig.group(1)) == (run["out"] / name).read_bytes()


def test_report_html_holds_what_the_summary_holds(run):
    page, results, front = run["html"], run["results"], run["front"]
    assert "<title>report-grid — dse report</title>" in page
    assert html.escape("H100 vs B200 serving Llama-2-7B") in page
    heads = re.findall(r"<h2>(.*?)</h2>", page)
    assert heads == ["Infeasible points by reason", "Best feasible design per objective", "Pareto front", "Plots",
                     "How to reproduce"]
    # infeasible points by reason: the counts of results.parquet
    reasons = _html_table(page, "infeasible-reasons")
    assert sum(int(r[1].replace(",", "")) for r in reasons) == int((~results["feasible"]).sum())
    # best designs: the same rows as summary.md
    assert _html_table(page, "best-designs") == _md_rows(run["summary"], "## Best feasible design per objective")[1:]
    assert len(re.findall(r"Bottleneck — decode: ", page)) == 2
    # the whole Pareto front of pareto.csv (summary.md lists up to 10 of it)
    rows = _html_table(page, "pareto-front")
    assert sorted(int(r[0]) for r in rows) == sorted(front["point"])
    # best first output_tokens_per_s first
    tput = [float(r[5].replace(",", "")) for r in rows]
    assert tput == sorted(tput, reverse=True)
    # how to reproduce
    assert re.search(r"<pre><code>dse run \S+study.yaml --out \S+/out</code></pre>", page)


def test_html_escapes_every_text(tmp_path):
    from dse.present.document import Bullets, Document, Figure, Figures, Section, Table, html_page, markdown
    png = (tmp_path / "a.png")
    png.write_bytes(base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGA"
                                     "WjR9awAAAABJRU5ErkJggg=="))      # one pixel
    evil = '<script>alert("x")</script> & "q" \'s'
    doc = Document(evil, [Section("", [evil, Bullets([evil])]),
                          Section(evil, [Table([evil], [[evil]], caption=evil), Figures([Figure("a.png", evil)])],
                                  id='x" onclick="y')])
    page = html_page(doc, tmp_path)
    assert "<script" not in page and 'onclick="' not in page
    # title, h1, contents, paragraph, item, h2, table caption, th, td, image alt, figure caption
    assert page.count(html.escape(evil)) == 11
    assert "| &lt;" not in markdown(doc) and markdown(doc).startswith("# <script>")


def test_plot_records_are_written_as_strict_json():
    from dse.present.report import _clean
    record = {"x": [1.0, float("nan"), 2], "y": [1, 2.5], "z": (float("inf"),), "w": [np.float64(1.5), np.int64(2)],
              "ids": [True, None, "a", 3], "n": np.float64("nan"), "big": [0.5] * 50_000 + [float("-inf")]}
    clean = _clean(record)
    assert clean == {"x": [1.0, None, 2], "y": [1, 2.5], "z": [None], "w": [1.5, 2], "ids": [True, None, "a", 3],
                     "n": None, "big": [0.5] * 50_000 + [None]}
    json.dumps(clean, allow_nan=False)              # no NaN or Infinity left for a strict JSON reader
