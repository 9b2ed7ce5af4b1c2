"""report.html in a real headless browser: a shipped study's page loads with no console
error, no fetch outside the page, every image decoded, every chart drawn by the one inlined
plotly.js, and shows its answer and its Pareto front; and every shipped study's page (each run
in its smallest form: an Optuna study with ``REDUCED_TRIALS`` trials) is interactive: each
chart holds data, hovering a design shows its parameters, and the declared answer is there.

The browser is driven by tests/browser.py (the DevTools protocol on a pipe, standard library
only); the test is skipped only when the machine has no Chromium (CI installs Debian's).
"""
import json
import re
import tempfile
import time
from pathlib import Path

import pandas as pd
import pytest
from browser import Browser, browser_or_skip, page_errors

from dse.study.cli import main
from dse.study.fleet_cli import is_fleet_study
from dse.study.plan_cli import is_plan_study
from dse.study.studyfile import STUDY_DIR, load_study

STUDIES = sorted(p.stem for p in STUDY_DIR.glob("*.yaml"))
#: trials of an Optuna study in the every-study test (the smallest run that still has a front)
REDUCED_TRIALS = 24
#: the kinds of plot drawn as charts in report.html (the roofline and breakdown stay images)
CHARTED = ("pareto", "sweep", "comparison")


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """A shipped study run into a fresh folder and its report.html loaded in Chromium:
    (run folder, browser, seconds to run the study, seconds to start the browser and load)."""
    binary = browser_or_skip()
    tmp = tmp_path_factory.mktemp("browser")
    out = tmp / "run"
    t0 = time.perf_counter()
    assert main(["run", "quant-roofline", "--out", str(out), "--quiet"]) == 0
    t1 = time.perf_counter()
    browser = Browser(binary, Path(tempfile.mkdtemp(dir=tmp, prefix="profile-")))
    try:
        browser.open((out / "report.html").as_uri())
        yield out, browser, t1 - t0, time.perf_counter() - t1
    finally:
        browser.close()


def test_report_loads_without_errors_or_fetches(page):
    out, browser, run_s, load_s = page
    print(f"study {run_s:.1f} s, browser start and load {load_s:.1f} s")
    assert page_errors(browser.events) == []
    urls = [e["params"]["request"]["url"] for e in browser.events if e["method"] == "Network.requestWillBeSent"]
    assert urls[0] == (out / "report.html").as_uri()
    assert all(u.startswith("data:image/png;base64,") for u in urls[1:]), [u[:80] for u in urls]
    # scripts: plotly.js inlined once in the head, then one inline script per chart; none has a source
    scripts = browser.js("Array.from(document.scripts, s => [s.src, s.parentElement.tagName, s.text.length])")
    assert all(src == "" for src, _, _ in scripts)
    assert [where for _, where, _ in scripts].count("HEAD") == 1 and scripts[0][2] > 1_000_000
    assert len(scripts) == 1 + browser.js("document.querySelectorAll('.chart').length")
    policy = browser.js("document.querySelector('meta[http-equiv=Content-Security-Policy]').content")
    assert policy.startswith("default-src 'none'") and "unsafe-inline'" not in policy.split("script-src")[1]


def test_every_plot_is_shown_decoded(page):
    out, browser, _, _ = page
    images = browser.js("Array.from(document.images, i => ({complete: i.complete, w: i.naturalWidth, "
                        "h: i.naturalHeight, id: i.closest('figure').id}))")
    charts = browser.js("Array.from(document.querySelectorAll('.chart'), d => [d.closest('figure').id, "
                        "d._fullData.length, d.getBoundingClientRect().width])")
    plots = {f: rec for f, rec in json.loads((out / "plots.json").read_text()).items() if "skipped" not in rec}
    assert sorted(i["id"] for i in images) == sorted("plot-" + Path(f).stem for f, r in plots.items()
                                                     if r["kind"] not in CHARTED)
    assert sorted(c[0] for c in charts) == sorted("plot-" + Path(f).stem for f, r in plots.items()
                                                  if r["kind"] in CHARTED)
    for i in images:
        assert i["complete"] and i["w"] > 0 and i["h"] > 0, i
    for _, traces, width in charts:
        assert traces > 0 and width > 200


def test_page_shows_the_fronts_best_designs_and_how_to_reproduce(page):
    out, browser, _, _ = page
    headings = browser.js("Array.from(document.querySelectorAll('h1, h2'), h => h.textContent)")
    assert headings == ["quant-roofline",
                        "The study's answer: the fastest decode per weight format (batch 16, prompt 1,024, FP8 KV)",
                        "The study's comparisons", "Infeasible points by reason", "Best feasible design per objective",
                        "Pareto front", "Plots", "How to reproduce"]
    front = pd.read_csv(out / "pareto.csv")
    rows = browser.js("Array.from(document.querySelectorAll('#pareto-front tbody tr'), "
                      "r => Array.from(r.cells, c => c.textContent))")
    assert len(rows) == len(front) > 1
    assert sorted(int(r[0]) for r in rows) == sorted(front["point"])
    # the Pareto plots sit in the Pareto section, rendered at a visible size
    shown = browser.js("Array.from(document.querySelectorAll('#pareto .chart'), "
                       "i => i.getBoundingClientRect().width)")
    assert len(shown) == 2 and min(shown) > 200
    best = browser.js("Array.from(document.querySelectorAll('#best-designs tbody tr'), r => r.cells[0].textContent)")
    assert best == ["output_tokens_per_s", "tpot_s", "memory_bytes"]
    assert browser.js("document.querySelector('#reproduce pre').textContent") == \
        f"dse run quant-roofline --out {out}"


# --------------------------------------------------------------------------- every shipped study

#: hover the first point of the first trace with designs of every chart; per chart (its id, the hover label's text)
HOVER_ALL = """Promise.all(Array.from(document.querySelectorAll('.chart'), gd => new Promise(done => {
  const i = gd.data.findIndex(t => t.customdata && t.customdata.length);
  if (i < 0) return done([gd.id, null]);
  const t = gd.data[i];
  Plotly.Fx.hover(gd, [{curveNumber: i, pointNumber: 0}], (t.xaxis || 'x') + (t.yaxis || 'y'));
  setTimeout(() => done([gd.id, Array.from(gd.querySelectorAll('.hovertext'), h => h.textContent).join(' ')]), 150);
})))"""


@pytest.fixture(scope="module")
def chromium(tmp_path_factory):
    """One headless Chromium for the every-study test."""
    binary = browser_or_skip()
    tmp = tmp_path_factory.mktemp("chromium")
    browser = Browser(binary, Path(tempfile.mkdtemp(dir=tmp, prefix="profile-")))
    yield browser
    browser.close()


@pytest.mark.slow
@pytest.mark.parametrize("name", STUDIES)
def test_every_shipped_studys_report_is_interactive_offline_and_answers(name, chromium, tmp_path):
    data, spec = load_study(name)
    out = tmp_path / "run"
    t0 = time.perf_counter()
    args = ["run", name, "--out", str(out), "--quiet"] + (["--trials", str(REDUCED_TRIALS)]
                                                          if spec.method == "optuna" else [])
    assert main(args) == 0
    t1 = time.perf_counter()
    chromium.events.clear()
    chromium.open((out / "report.html").as_uri())
    print(f"{name}: study and report {t1 - t0:.1f} s, page {time.perf_counter() - t1:.1f} s")
    assert page_errors(chromium.events) == []
    urls = [e["params"]["request"]["url"] for e in chromium.events if e["method"] == "Network.requestWillBeSent"]
    assert urls[0] == (out / "report.html").as_uri()
    assert all(u.startswith("data:image/png;base64,") for u in urls[1:]), [u[:80] for u in urls]
    if is_plan_study(data):                 # a plan's answer: the fewest devices of each hardware, no figure
        assert chromium.js("document.querySelector('#answer h2').textContent").startswith("The study's answer")
        cells = chromium.js("Array.from(document.querySelectorAll('#answer-table tbody tr'), r => r.cells[0].textContent)")
        assert cells == list(data["space"]["hardware"])
        return
    if is_fleet_study(data):                # a fleet's answer: the mix, then each single type beside it
        assert chromium.js("document.querySelector('#answer h2').textContent").startswith("The study's answer")
        cells = chromium.js("Array.from(document.querySelectorAll('#answer-table tbody tr'), r => r.cells[0].textContent)")
        pairs = [f"{p['hardware']}>{p['decode_hardware']}" for p in data.get("fleet", {}).get("pd_pairs") or []
                 if p["decode_hardware"] not in ("same", p["hardware"])]     # a pair of two presets: its own kind
        assert cells == ["mixed", *data["space"]["hardware"], *pairs]
        return

    # every pareto, sweep and declared figure is a chart with data
    plots = {f: r for f, r in json.loads((out / "plots.json").read_text()).items() if "skipped" not in r}
    charted = sorted("chart-" + Path(f).stem for f, r in plots.items() if r["kind"] in CHARTED)
    traces = dict(chromium.js("Array.from(document.querySelectorAll('.chart'), d => [d.id, "
                              "d._fullData.filter(t => t.x && t.x.length).length])"))
    assert sorted(traces) == charted and charted
    assert all(n > 0 for n in traces.values()), traces
    assert any(r["kind"] == "comparison" for r in plots.values()), "the study's declared figures are drawn"
    # a declared figure's chart holds the designs its PNG drew (plots.json), no more, no fewer
    drawn = dict(chromium.js("Array.from(document.querySelectorAll('.chart'), d => [d.id, d._fullData.filter("
                             "t => t.name !== 'infeasible').reduce((n, t) => n + t.x.length, 0)])"))
    for f, r in plots.items():
        if r["kind"] == "comparison":
            assert drawn["chart-" + Path(f).stem] == sum(len(t["points"]) for t in r["traces"]), f

    # hovering a design names it and shows its parameters, as results.parquet holds them
    res = pd.read_parquet(out / "results.parquet")
    key = "trial" if spec.method == "optuna" else "point"
    for chart, text in chromium.js(HOVER_ALL):
        assert text, f"{chart}: no hover label"
        found = re.search(rf"{key}: (\d+)", text)
        assert found, (chart, text)
        row = res[res[key] == int(found.group(1))].iloc[0]
        for p in ("hardware", *(a.name for a in spec.space.axes if len(a.values) > 1 or a.is_range)):
            if p in res and not pd.api.types.is_numeric_dtype(res[p]) and not pd.api.types.is_bool_dtype(res[p]):
                assert f"{p}: {row[p]}" in text, (chart, p, text)
            elif p in res:
                assert f"{p}: " in text, (chart, p, text)

    # the declared answer, under its heading, with rows
    heading = chromium.js("document.querySelector('#answer h2').textContent")
    assert heading.startswith("The study's answer")
    assert chromium.js("document.querySelectorAll('#answer-table tbody tr').length") > 0
    answer = data["report"]["answer"]
    best_per = [answer["best_per"]] if isinstance(answer["best_per"], str) else answer["best_per"]
    header = chromium.js("Array.from(document.querySelectorAll('#answer-table th'), h => h.textContent)")
    assert [h.split(" (")[0] for h in header[:len(best_per)]] == best_per       # names, units aside
