"""A study's ``report:`` section (dse.present.report_spec): checked when the study file is
read (one line naming the file, the key and what is allowed; exit 2), declared by every
shipped study, and drawn from the run's own rows: a declared comparison's figure holds
exactly the rows an independent pandas filter of results.parquet picks, and the answer
table the best row per group."""
import json
import re

import pandas as pd
import pytest
import yaml
from conftest import run_cli

from basis.errors import DseError
from dse.study.cli import main
from dse.study.fleet_cli import is_fleet_study
from dse.study.plan_cli import is_plan_study
from dse.study.studyfile import STUDY_DIR, load_study

STUDIES = sorted(p.stem for p in STUDY_DIR.glob("*.yaml"))

#: a small study (2 x 2 x 3 x 3 = 36 points, ~3 s with its report) whose report the tests vary
SMALL = {
    "name": "small-flash",
    "description": "FlashAttention on and off on two GPUs over batch and prompt length, a test's study.",
    "space": {"hardware": ["a100-80gb", "h100-sxm"], "model": "llama-3.1-8b", "flash_attention": [True, False],
              "batch": [1, 4, 16], "prompt_len": [1024, 8192, 32768], "gen_len": 128},
    "objectives": {"ttft_s": "min", "activation_bytes": "min"},
    "method": "grid",
}


def _study(tmp_path, report, name="small.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump({**SMALL, "report": report}, sort_keys=False))
    return path


@pytest.mark.parametrize("report, key, allowed", [
    ({"plots": []}, "report: unknown key(s) plots", "allowed: compare, answer, metrics"),
    ({"compare": [{"x": "batch", "y": "ttft_s", "color": "hardware"}]}, "report.compare[0]: unknown key(s) color",
     "allowed: x, y, colour, facet, fixed, best, kind, title"),
    ({"compare": [{"x": "batch", "y": "ttft"}]}, "report.compare[0].y: 'ttft' is not a column",
     "allowed: a parameter of the study's space (hardware, model, flash_attention, batch, prompt_len, gen_len)"),
    ({"compare": [{"x": "tp", "y": "ttft_s"}]}, "report.compare[0].x: 'tp' is not a column", "allowed: a parameter"),
    ({"compare": [{"y": "ttft_s"}]}, "report.compare[0]: missing 'x'", "keys: x, y"),
    ({"compare": [{"x": "batch", "y": "ttft_s", "kind": "bars"}]}, "report.compare[0].kind: 'bars'",
     "allowed: line, scatter"),
    ({"compare": [{"x": "batch", "y": "ttft_s", "fixed": {"prompt": 1024}}]},
     "report.compare[0].fixed.prompt: 'prompt' is not a column", "allowed"),
    ({"answer": {"best_per": "hardware"}}, "report.answer: missing 'rank'", "keys: best_per, rank"),
    ({"answer": {"best_per": "hardware", "rank": {"ttft_s": "lowest"}}}, "report.answer.rank.ttft_s: expected min or max",
     ""),
    ({"answer": {"best_per": "gpu", "rank": {"ttft_s": "min"}}}, "report.answer.best_per: 'gpu' is not a column",
     "allowed"),
    ({"answer": {"best_per": "hardware", "rank": {"ttft_s": "min"}, "sort": "x"}}, "report.answer: unknown key(s) sort",
     "allowed: best_per, rank, fixed, columns, title"),
])
def test_a_bad_report_section_is_refused_naming_the_file_and_key(tmp_path, report, key, allowed):
    path = _study(tmp_path, report)
    with pytest.raises(DseError) as e:
        load_study(str(path))
    msg = str(e.value)
    assert msg.startswith(f"{path}: {key}") and allowed in msg and "\n" not in msg, msg


def test_the_cli_refuses_a_bad_report_section_in_one_line_exit_2_before_any_work(tmp_path):
    path = _study(tmp_path, {"compare": [{"x": "batch", "y": "ttft_s", "colour": "colour"}]})
    r = run_cli("run", path, "--out", tmp_path / "run", "--quiet")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "report.compare[0].colour: 'colour' is not a column" in lines[0], r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "run" / "results.parquet").exists()


@pytest.mark.parametrize("name", STUDIES)
def test_every_shipped_study_declares_its_figures_and_its_answer(name):
    data, spec = load_study(name)           # checked on loading
    if is_plan_study(data):                 # its answer is the plan (plan.json, plan.csv), not a sweep's report
        assert data["plan"] and not data.get("report")
        return
    if is_fleet_study(data):                # its answer is the fleet (fleet.json, fleet.csv), not a sweep's report
        assert data["fleet"] and not data.get("report")
        return
    report = data.get("report") or {}
    assert report.get("compare"), f"{name}: no comparison declared"
    assert report.get("answer", {}).get("best_per") and report["answer"].get("rank"), f"{name}: no answer declared"


def _answer_table(summary: str) -> pd.DataFrame:
    """The answer table of summary.md as text cells, by header."""
    part = summary.split("## The study's answer", 1)[1].split("\n## ", 1)[0]
    lines = [ln for ln in part.splitlines() if ln.startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    return pd.DataFrame([[c.strip() for c in ln.strip("|").split("|")] for ln in lines[2:]], columns=head)


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    """The small study run with a declared comparison that fixes batch 1 and one that leaves
    batch free, and an answer per hardware and flash_attention; (run folder, results)."""
    tmp = tmp_path_factory.mktemp("declared")
    path = _study(tmp, {
        "compare": [{"x": "prompt_len", "y": ["ttft_s", "activation_bytes"], "colour": "flash_attention",
                     "facet": "hardware", "fixed": {"batch": 1}},
                    {"x": "prompt_len", "y": "ttft_s", "colour": "flash_attention", "fixed": {"hardware": "h100-sxm"},
                     "best": {"output_tokens_per_s": "max"}}],
        "answer": {"best_per": ["hardware", "flash_attention"], "rank": {"prompt_len": "max", "ttft_s": "min"},
                   "columns": ["batch", "activation_bytes"]}})
    out = tmp / "run"
    assert main(["run", str(path), "--out", str(out), "--quiet"]) == 0
    return out, pd.read_parquet(out / "results.parquet")


def test_a_declared_comparison_draws_exactly_the_rows_its_fixed_values_pick(small_run):
    out, res = small_run
    rec = json.loads((out / "plots.json").read_text())["compare_1.png"]
    drawn = {(t["panel"], t["y"], t["colour"]): t for t in rec["traces"]}
    want = res[(res["batch"] == 1) & res["feasible"]]
    assert len(drawn) == 2 * 2 * 2          # hardware x y x flash_attention
    for (hw, fa), g in want.groupby(["hardware", "flash_attention"], observed=True):
        g = g.sort_values("prompt_len")
        for y in ("ttft_s", "activation_bytes"):
            t = drawn[(f"hardware = {hw}", y, bool(fa))]
            assert t["points"] == g["point"].tolist()
            assert t["x_values"] == g["prompt_len"].tolist()
            assert t["y_values"] == pytest.approx(g[y].tolist(), rel=1e-12)
    # every infeasible row of the slice is listed in its panel (drawn as a cross)
    panels = {(p["label"], p["y"]): set(p["points"]) for p in rec["panels"]}
    for hw, g in res[res["batch"] == 1].groupby("hardware", observed=True):
        assert panels[(f"hardware = {hw}", "ttft_s")] == set(g["point"])


def test_a_parameter_left_free_shows_the_best_design_by_the_declared_ranking(small_run):
    out, res = small_run
    rec = json.loads((out / "plots.json").read_text())["compare_2.png"]
    assert rec["left"] == ["batch"] and rec["best_by"] == ["output_tokens_per_s", "max"]
    ok = res[(res["hardware"] == "h100-sxm") & res["feasible"]]
    best = ok.loc[ok.groupby(["flash_attention", "prompt_len"], observed=True)["output_tokens_per_s"].idxmax()]
    for t in rec["traces"]:
        g = best[best["flash_attention"] == t["colour"]].sort_values("prompt_len")
        assert t["points"] == g["point"].tolist() and t["x_values"] == g["prompt_len"].tolist()


def test_the_answer_table_is_the_best_feasible_row_per_group_in_summary_and_page(small_run):
    out, res = small_run
    table = _answer_table((out / "summary.md").read_text())
    ok = res[res["feasible"]]
    longest = ok.groupby(["hardware", "flash_attention"], observed=True)["prompt_len"].max()
    assert len(table) == len(longest) == 4
    for _, row in table.iterrows():
        assert int(row["prompt_len"].replace(",", "")) == longest[(row["hardware"], row["flash_attention"] == "True")]
        pick = ok[(ok["hardware"] == row["hardware"]) & (ok["flash_attention"] == (row["flash_attention"] == "True"))
                  & (ok["prompt_len"] == longest[(row["hardware"], row["flash_attention"] == "True")])]
        assert int(row["point"]) == int(pick.loc[pick["ttft_s"].idxmin(), "point"])   # ties: the least TTFT
    page = (out / "report.html").read_text()
    assert re.search(r"<h2>The study&#x27;s answer: the best design per hardware, flash_attention by prompt_len "
                     r"\(max\), then ttft_s \(min\)</h2>", page)
    assert page.count('<table id="answer-table">') == 1
