"""The report of a streamed sweep (``outputs.rows: sample`` or ``none``): the same files as a
run that keeps every row, its counts the sweep's totals (equal to what results.parquet of the
same study counts), its cloud of feasible designs a uniform sample that the report names, or
no cloud and no sweep curves (left out, and said so) when no row was kept."""
from __future__ import annotations

import contextlib
import io
import json
import re
import shutil

import numpy as np
import pandas as pd
import pytest
import yaml

from dse.present import report
from dse.study.cli import main
from dse.study.studyfile import load_study
from dse.system.reasons import describe

pytestmark = pytest.mark.slow   # each case runs a 3,840-point streamed study end to end
SAMPLE = 500
#: 2 x 4 x 2 x 40 x 6 = 3,840 points in 8 chunks; some infeasible (TPOT, memory), a front of ~200
STUDY = {"name": "streamed", "description": "A streamed sweep: the report from a sample, or from the front alone.",
         "space": {"hardware": ["h100-sxm", "b200"], "model": "llama-2-7b", "batch": [1, 8, 64, 256],
                   "prompt_len": [128, 1024], "gen_len": 64,
                   "memory_bandwidth": {"min": 1.0e12, "max": 8.0e12, "count": 40},
                   "memory_capacity": {"min": 2.0e10, "max": 2.0e11, "count": 6}},
         "objectives": {"output_tokens_per_s": "max", "memory_bandwidth": "min"},
         "constraints": {"tpot_s": {"max": 0.02}}, "chunk_size": 500, "outputs": {"sample": SAMPLE}}
POINTS = 3_840
#: the plots of this study that are drawn from rows (a sweep curve per swept workload parameter)
SWEEPS = ("sweep_batch.png", "sweep_seq.png")


def _run(study, out, rows: str) -> str:
    """``dse run STUDY --out OUT --rows ROWS``, in this process; its standard output."""
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        rc = main(["run", str(study), "--out", str(out), "--rows", rows, "--quiet"])
    assert rc == 0
    return text.getvalue()


def _read(out, stdout: str) -> dict:
    return {"out": out, "stdout": stdout, "summary": (out / "summary.md").read_text(),
            "html": (out / "report.html").read_text(), "plots": json.loads((out / "plots.json").read_text()),
            "front": pd.read_csv(out / "pareto.csv"), "sweep": json.loads((out / "sweep.json").read_text())}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same study run three times: every row kept (the reference), a sample, none."""
    d = tmp_path_factory.mktemp("streamed")
    study = d / "streamed.yaml"
    study.write_text(yaml.safe_dump(STUDY))
    got = {rows: _read(d / rows, _run(study, d / rows, rows)) for rows in ("all", "sample", "none")}
    got["all"]["results"] = pd.read_parquet(d / "all" / "results.parquet")
    got["sample"]["rows"] = pd.read_parquet(d / "sample" / "sample.parquet")
    got["study"] = study
    return got


def _fact(text: str, name: str) -> int:
    """The number of a fact line of summary.md ('- Points evaluated: 3,840 (grid)')."""
    return int(re.search(rf"^- {name}: ([\d,]+)", text, re.MULTILINE).group(1).replace(",", ""))


def _reasons(text: str) -> dict[str, int]:
    """The table of infeasible points by reason of summary.md, {reason: points}."""
    section = text.split("## Infeasible points by reason", 1)[1].split("\n## ", 1)[0]
    return {m.group(1): int(m.group(2).replace(",", ""))
            for m in re.finditer(r"^\| (.+?) \| ([\d,]+) \| [\d.]+ % \|$", section, re.MULTILINE)}


def _best_rows(text: str) -> list[str]:
    section = text.split("## Best feasible design per objective", 1)[1].split("\n#", 1)[0]
    return [ln for ln in section.splitlines() if ln.startswith("|")]


# ------------------------------------------------------------------ files

@pytest.mark.parametrize("rows", ["sample", "none"])
def test_a_streamed_run_writes_the_report(runs, rows):
    run = runs[rows]
    out, plots = run["out"], run["plots"]
    assert not (out / "results.parquet").exists()
    for f in ("summary.md", "report.html", "plots.json", "pareto_memory_bandwidth.png", "pareto_memory_capacity.png",
              "roofline.png", "breakdown.png"):
        assert (out / f).is_file(), f
    assert {f for f, rec in plots.items() if "skipped" not in rec} == {p.name for p in out.glob("*.png")}
    assert run["summary"].startswith("# streamed") and "A streamed sweep" in run["summary"]
    # the command prints the streamed files, as before, and now where the report is
    for line in (f"pareto:  {out / 'pareto.csv'}", f"aggregates: {out / 'aggregates.csv'}",
                 f"best:    {out / 'best.json'}", f"summary: {out / 'summary.md'}", f"report:  {out / 'report.html'}"):
        assert line in run["stdout"], line
    assert ("sample:  " in run["stdout"]) == (rows == "sample") and "no report" not in run["stdout"]
    assert f"--rows {rows}" in run["summary"].split("## How to reproduce")[1]


# ------------------------------------------------------------------ counts: the sweep's totals, not the sample's

@pytest.mark.parametrize("rows", ["sample", "none"])
def test_counts_are_the_sweep_totals(runs, rows):
    text, totals, results = runs[rows]["summary"], runs[rows]["sweep"], runs["all"]["results"]
    feasible = int(results["feasible"].sum())
    assert len(results) == POINTS and 0 < feasible < POINTS
    assert totals["points"] == POINTS and totals["feasible"] == feasible
    assert _fact(text, "Points evaluated") == POINTS
    assert _fact(text, "Feasible") == feasible
    assert _fact(text, "Infeasible") == POINTS - feasible
    assert _fact(text, "Pareto front") == len(runs["all"]["front"])
    counted = results.loc[~results["feasible"], "reason"].astype(str).value_counts()
    assert _reasons(text) == {describe(k): int(v) for k, v in counted.items()}
    assert sum(_reasons(text).values()) == POINTS - feasible
    # what every row gives: the same counts, reasons and best designs (point ids, not positions in the front)
    ref = runs["all"]["summary"]
    assert _reasons(text) == _reasons(ref) and _best_rows(text) == _best_rows(ref)
    assert ref.split("- Infeasible:")[0] == text.split("- Infeasible:")[0]


def test_the_sample_counts_differ_from_the_totals(runs):
    """The test above can tell totals from the sample's counts."""
    sample = runs["sample"]["rows"]
    assert len(sample) == SAMPLE and int(sample["feasible"].sum()) != runs["sample"]["sweep"]["feasible"]


# ------------------------------------------------------------------ the sample, named

def test_the_report_says_the_cloud_is_a_uniform_sample(runs):
    run = runs["sample"]
    note = f"a uniform sample of {SAMPLE:,} of {POINTS:,} points"
    text = run["summary"]
    assert f"- Rows kept: {note} (outputs.rows: sample)" in text
    assert "## Rows kept" in text and "the sweep's totals (sweep.json)" in text
    assert note in run["html"]
    for f in ("pareto_memory_bandwidth.png", "pareto_memory_capacity.png"):
        rec = run["plots"][f]
        assert rec["rows"] == "sample" and note in rec["note"] and note in rec["title"].replace("\n", " ")
        assert re.search(rf"\[{re.escape(f)}\]\({re.escape(f)}\): [^\n]*{note}", text)
    for f in SWEEPS:
        rec = run["plots"][f]
        assert rec["rows"] == "sample" and rec["rows_note"] == note and rec["title"].endswith(f"(from {note})")
        assert text.split(f"]({f}): ", 1)[1].splitlines()[0].endswith(f"(drawn from {note})")


def test_the_cloud_is_the_feasible_rows_of_the_sample(runs):
    run, sample = runs["sample"], runs["sample"]["rows"]
    n = min(int(sample["feasible"].sum()), report.BACKGROUND_SAMPLE)
    assert 0 < n < runs["sample"]["sweep"]["feasible"]
    for f in ("pareto_memory_bandwidth.png", "pareto_memory_capacity.png"):
        rec = run["plots"][f]
        assert rec["background_points"] == n
        assert sum(g["background_points"] for g in rec["groups"]) == n
    # the sweep curves: points of the sample only
    ids = set(sample["point"])
    for f in SWEEPS:
        drawn = [p for panel in run["plots"][f]["panels"] for line in panel["lines"]
                 for p in line["points"] + line["infeasible_points"]]
        assert drawn and set(drawn) <= ids, f


def test_a_large_sample_is_drawn_as_a_bounded_background(runs, tmp_path, monkeypatch):
    out = tmp_path / "copy"
    shutil.copytree(runs["sample"]["out"], out)
    data, spec = load_study(str(runs["study"]), rows="sample")
    monkeypatch.setattr(report, "BACKGROUND_SAMPLE", 50)
    report.write_report(out, data, spec)                     # the front from pareto.csv
    rec = json.loads((out / "plots.json").read_text())["pareto_memory_bandwidth.png"]
    assert rec["background_points"] == 50
    assert sorted(rec["highlighted"]) == sorted(runs["sample"]["front"]["point"])
    assert (out / "summary.md").read_text() == runs["sample"]["summary"].replace(str(runs["sample"]["out"]), str(out))


# ------------------------------------------------------------------ the front: exact, from pareto.csv

@pytest.mark.parametrize("rows", ["sample", "none"])
def test_the_front_is_the_exact_front(runs, rows):
    run, ref = runs[rows], runs["all"]
    assert list(run["front"]["point"]) == list(ref["front"]["point"])
    rec = run["plots"]["pareto_memory_bandwidth.png"]
    assert sorted(rec["highlighted"]) == sorted(ref["plots"]["pareto_memory_bandwidth.png"]["highlighted"])
    assert rec["front_2d"] == ref["plots"]["pareto_memory_bandwidth.png"]["front_2d"]
    by_id = ref["results"].set_index("point")
    np.testing.assert_allclose(rec["highlighted_x"], by_id.loc[rec["highlighted"], "memory_bandwidth"] / 1e12)
    np.testing.assert_allclose(rec["highlighted_y"], by_id.loc[rec["highlighted"], "output_tokens_per_s"], rtol=1e-6)
    rows_html = re.search(r'<table id="pareto-front">.*?<tbody>(.*?)</tbody>', run["html"], re.DOTALL).group(1)
    assert sorted(int(p) for p in re.findall(r"<tr><td[^>]*>(\d+)</td>", rows_html)) == sorted(run["front"]["point"])
    assert run["plots"]["roofline.png"]["point"] == ref["plots"]["roofline.png"]["point"]


@pytest.mark.parametrize("rows", ["sample", "none"])
def test_the_front_keeps_the_key_metrics_of_its_designs(runs, rows):
    # pareto.csv of a streamed sweep holds each Pareto design's key metrics, equal to its row in
    # results.parquet of the run that kept every row, and the report's Pareto table shows them
    front, ref = runs[rows]["front"], runs["all"]["results"].set_index("point")
    for m in ("output_tokens_per_s", "tpot_s", "ttft_s", "e2e_latency_s", "memory_bytes", "cost_usd"):
        np.testing.assert_allclose(front[m], ref.loc[front["point"], m], rtol=1e-12, err_msg=m)
    head = re.search(r'<table id="pareto-front">.*?<thead>(.*?)</thead>', runs[rows]["html"], re.DOTALL).group(1)
    assert all(m in head for m in ("output_tokens_per_s", "tpot_s", "ttft_s")), head
    assert "pareto_cost_usd.png" not in runs[rows]["plots"] or "the Pareto designs of a sweep" not in \
        runs[rows]["plots"]["pareto_cost_usd.png"].get("skipped", "")


# ------------------------------------------------------------------ no rows: no cloud, no curves, said so

def test_rows_none_draws_the_front_alone_and_names_what_it_left_out(runs):
    run = runs["none"]
    text, plots = run["summary"], run["plots"]
    assert "- Rows kept: no rows (outputs.rows: none)" in text and "kept none of its rows" in text
    for f in ("pareto_memory_bandwidth.png", "pareto_memory_capacity.png"):
        rec = plots[f]
        assert rec["background_points"] == 0 and rec["rows"] == "none"
        assert all(g["background_points"] == 0 for g in rec["groups"])
        assert "no cloud of feasible designs" in rec["note"] and "no cloud of feasible designs" in rec["title"]
        assert len(rec["highlighted"]) == len(run["front"])
    left = text.split("Left out, as they are drawn from rows:", 1)[1].split("\n## ", 1)[0]
    for f in SWEEPS:
        assert "skipped" in plots[f] and not (run["out"] / f).exists()
        assert f"- {f}: {plots[f]['skipped']}" in left and "outputs.rows: none" in plots[f]["skipped"]
    # drawn with every row kept: the left-out plots are the rows' plots of this study, no other
    assert set(SWEEPS) == {f for f in runs["all"]["plots"] if f.startswith("sweep_")}
