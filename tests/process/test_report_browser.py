"""report.html in a real headless browser: a shipped study's page loads with no console
error, no fetch outside the page, every image decoded, and shows its Pareto front.

The browser is driven by tests/browser.py (the DevTools protocol on a pipe, standard library
only); the test is skipped only when the machine has no Chromium (CI installs Debian's).
"""
import json
import tempfile
import time
from pathlib import Path

import pandas as pd
import pytest
from browser import BROWSERS, Browser, find_browser, page_errors

from dse.study.cli import main


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """A shipped study run into a fresh folder and its report.html loaded in Chromium:
    (run folder, browser, seconds to run the study, seconds to start the browser and load)."""
    binary = find_browser()
    if binary is None:
        pytest.skip(f"no Chromium binary ({', '.join(BROWSERS)} not on PATH; set DSE_TEST_CHROMIUM or "
                    f"apt-get install chromium)")
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
    assert browser.js("document.scripts.length") == 0


def test_every_plot_is_shown_decoded(page):
    out, browser, _, _ = page
    images = browser.js("Array.from(document.images, i => ({complete: i.complete, w: i.naturalWidth, "
                        "h: i.naturalHeight, id: i.closest('figure').id}))")
    plots = [f for f, rec in json.loads((out / "plots.json").read_text()).items() if "skipped" not in rec]
    assert sorted(i["id"] for i in images) == sorted("plot-" + Path(f).stem for f in plots)
    for i in images:
        assert i["complete"] and i["w"] > 0 and i["h"] > 0, i


def test_page_shows_the_fronts_best_designs_and_how_to_reproduce(page):
    out, browser, _, _ = page
    headings = browser.js("Array.from(document.querySelectorAll('h1, h2'), h => h.textContent)")
    assert headings == ["quant-roofline", "Infeasible points by reason", "Best feasible design per objective",
                        "Pareto front", "Plots", "How to reproduce"]
    front = pd.read_csv(out / "pareto.csv")
    rows = browser.js("Array.from(document.querySelectorAll('#pareto-front tbody tr'), "
                      "r => Array.from(r.cells, c => c.textContent))")
    assert len(rows) == len(front) > 1
    assert sorted(int(r[0]) for r in rows) == sorted(front["point"])
    # the Pareto plots sit in the Pareto section, rendered at a visible size
    shown = browser.js("Array.from(document.querySelectorAll('#pareto img'), i => i.getBoundingClientRect().width)")
    assert len(shown) == 2 and min(shown) > 200
    best = browser.js("Array.from(document.querySelectorAll('#best-designs tbody tr'), r => r.cells[0].textContent)")
    assert best == ["output_tokens_per_s", "tpot_s", "memory_bytes"]
    assert browser.js("document.querySelector('#reproduce pre').textContent") == \
        f"dse run quant-roofline --out {out}"
