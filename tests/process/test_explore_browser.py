"""``dse explore`` in a real headless browser (tests/browser.py: Chromium over the DevTools pipe).

The app is served from a thread on a free port of 127.0.0.1 with a shipped study's run; both
views load with no console error and no request outside the server; setting the design-point
controls (through Dash's renderer, as a user's change reaches it) shows the operator table
``dse analyze --format json`` prints; a filter changes the number of dots the Plotly graph holds
to what an independent pandas filter keeps; hovering a dot shows the design's parameters; a
selected design opens in the design-point view with its stored metrics.
"""
import json
import math
import tempfile
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
from browser import Browser, browser_or_skip, page_errors
from werkzeug.serving import make_server

from dse.app.layout import make_app
from dse.present.display import quantity_text
from dse.study.cli import main
from dse.system.analysis import ROW_KEYS

pytestmark = pytest.mark.slow

#: the columns of the operator table as the page shows them
COLUMNS = ("stage", *ROW_KEYS)
WORDS = ("stage", "name", "place", "compute_format", "bound")


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    """(browser, base URL, run folder): a quant-roofline run served by ``dse explore``'s app
    from a thread on a free port, and a headless Chromium on its page."""
    binary = browser_or_skip()
    tmp = tmp_path_factory.mktemp("explore-browser")
    out = tmp / "quant-roofline"
    assert main(["run", "quant-roofline", "--out", str(out), "--quiet"]) == 0
    server = make_server("127.0.0.1", 0, make_app(str(out)).server, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_port}/"
    browser = Browser(binary, Path(tempfile.mkdtemp(dir=tmp, prefix="profile-")))
    try:
        browser.open(base)
        yield browser, base, out
    finally:
        browser.close()
        server.shutdown()
        thread.join(10)


def wait_for(browser, expression: str, timeout: float = 60.0):
    """The value of ``expression`` once it is truthy (polled), or an AssertionError after ``timeout`` s."""
    end = time.monotonic() + timeout
    while True:
        value = browser.js(expression)
        if value:
            return value
        assert time.monotonic() < end, f"not true after {timeout} s: {expression}"
        time.sleep(0.2)


def set_value(browser, ident, value, prop: str = "value") -> None:
    """Set a component's property as a user's change does: through Dash's renderer, which then
    runs the callbacks that read it."""
    browser.js(f"window.dash_clientside.set_props({json.dumps(ident)}, {{{prop}: {json.dumps(value)}}})")


#: the operator table's body cells, one list a row
TABLE_CELLS = ("Array.from(document.querySelectorAll('#op-table tbody tr'), r => Array.from(r.querySelectorAll('td'), "
               "c => c.textContent)).filter(r => r.length)")
#: the number of dots the run's Plotly graph holds (plotly.py sends numpy arrays typed: their values in ``_inputArray``)
DOTS = ("(() => { const g = document.querySelector('#run-graph .js-plotly-plot'); "
        "return g && g.data ? g.data.reduce((n, t) => n + (t.x ? (t.x._inputArray || t.x).length : 0), 0) : -1; })()")


#: a mouse move over the first dot of the run's graph, as a user's pointer makes (Plotly.Fx.hover called with
#: points draws the label but, called by hand, emits no plotly_hover event, which Dash's graph listens to)
HOVER_FIRST_DOT = ("(() => { const g = document.querySelector('#run-graph .js-plotly-plot'); const p = g.calcdata[0][0]; "
                   "const xa = g._fullLayout.xaxis, ya = g._fullLayout.yaxis, b = g.getBoundingClientRect(); "
                   "g.querySelector('.nsewdrag').dispatchEvent(new MouseEvent('mousemove', {bubbles: true, "
                   "clientX: b.left + xa._offset + xa.d2p(p.x), clientY: b.top + ya._offset + ya.d2p(p.y)})); })()")


def analyze_rows(capsys, *flags) -> list[list]:
    capsys.readouterr()
    assert main(["analyze", *flags, "--format", "json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    return [[st, *(r[k] for k in ROW_KEYS)] for st in ("prefill", "decode") for r in printed[st]]


def same_numbers(shown: list[list[str]], printed: list[list]) -> bool:
    """Whether the page's cells (numbers to 4 significant digits) are the rows printed."""
    if len(shown) != len(printed):
        return False
    for cells, row in zip(shown, printed):
        for k, text, v in zip(COLUMNS, cells, row):
            if k in WORDS or isinstance(v, str):
                if text != str(v):
                    return False
            elif v is None:
                if text.strip():
                    return False
            elif not math.isclose(float(text), v, rel_tol=6e-4, abs_tol=0):
                return False
    return True


def requests_outside(browser, base: str) -> list[str]:
    urls = [e["params"]["request"]["url"] for e in browser.events if e["method"] == "Network.requestWillBeSent"]
    return [u for u in urls if not u.startswith((base, "data:", "blob:"))]


def test_both_views_load_without_errors_or_outside_requests(app):
    browser, base, out = app
    wait_for(browser, f"{DOTS} > 0")                               # the run view, drawn
    set_value(browser, "view", "point")
    wait_for(browser, "document.getElementById('point-box').style.display === 'block'")
    wait_for(browser, "document.getElementById('point-message').textContent.length > 0")   # no model yet: said
    assert page_errors(browser.events) == []
    assert requests_outside(browser, base) == []
    assert browser.js("Array.from(document.querySelectorAll('link[rel=stylesheet], script[src]'), "
                      "e => e.href || e.src).filter(u => !u.startsWith(location.origin))") == []


def test_changing_a_control_shows_the_operators_analyze_prints(app, capsys):
    browser, base, _ = app
    set_value(browser, "view", "point")
    flags = ["--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--weights", "fp8", "--activations", "fp8"]
    for name, value in (("model", "llama-3.1-8b"), ("hardware", "h100-sxm"), ("weights", "fp8"),
                        ("activations", "fp8")):
        set_value(browser, {"type": "param", "name": name}, value)
    printed = analyze_rows(capsys, *flags)
    end = time.monotonic() + 60
    while not same_numbers(browser.js(TABLE_CELLS), printed):
        assert time.monotonic() < end, (browser.js(TABLE_CELLS)[:3], printed[:3])
        time.sleep(0.3)
    set_value(browser, {"type": "param", "name": "batch"}, "64")            # one control changed
    printed = analyze_rows(capsys, *flags, "--batch", "64")
    end = time.monotonic() + 60
    while not same_numbers(browser.js(TABLE_CELLS), printed):
        assert time.monotonic() < end, (browser.js(TABLE_CELLS)[:3], printed[:3])
        time.sleep(0.3)
    assert browser.js("document.getElementById('point-message').textContent") == ""
    assert browser.js("document.querySelector('#roofline .js-plotly-plot').data.length") >= 3   # roofs and dots
    assert page_errors(browser.events) == [] and requests_outside(browser, base) == []


def test_a_filter_changes_the_dots_and_hovering_shows_a_design(app):
    browser, base, out = app
    set_value(browser, "view", "run")
    df = pd.read_parquet(out / "results.parquet")
    x, y = browser.js("[document.querySelector('#run-graph .js-plotly-plot').layout.xaxis.title.text, "
                      "document.querySelector('#run-graph .js-plotly-plot').layout.yaxis.title.text]")
    drawable = df[df[[x, y]].notna().all(axis=1)]
    wait_for(browser, f"{DOTS} === {len(drawable)}")
    set_value(browser, {"type": "cat", "col": "weights"}, ["fp8", "int4"])
    kept = drawable[drawable["weights"].astype(str).isin(["fp8", "int4"])]
    assert 0 < len(kept) < len(drawable)
    wait_for(browser, f"{DOTS} === {len(kept)}")
    # hover the first dot: Plotly's hover label and the page's table name the design and its parameters
    browser.js(HOVER_FIRST_DOT)
    title = wait_for(browser, "(t => t.startsWith('hovered: point ') && t)"
                              "(document.getElementById('run-hover-title').textContent)")
    point = int(title.removeprefix("hovered: point "))
    row = df.set_index("point").loc[point]
    shown = dict(browser.js("Array.from(document.querySelectorAll('#run-hover tbody tr'), r => Array.from("
                            "r.querySelectorAll('td'), c => c.textContent)).filter(r => r.length)"))
    for c in ("weights", "activations", "kv", "batch", "prompt_len"):
        assert shown[c] == quantity_text(c, row[c].item() if hasattr(row[c], "item") else row[c])
    assert row["weights"] in ("fp8", "int4")
    label = browser.js("document.querySelector('#run-graph .hoverlayer').textContent")
    assert f"weights={row['weights']}" in label and f"kv={row['kv']}" in label
    # select it, open it in the design-point view: the summary shows its stored TPOT
    set_value(browser, "selected", [point], prop="data")
    wait_for(browser, f"Array.from(document.querySelectorAll('#compare-table th')).some(c => c.textContent === 'point {point}')")
    time.sleep(0.5)
    browser.js("document.getElementById('explain').click()")
    wait_for(browser, "document.getElementById('point-box').style.display === 'block'")
    tpot = quantity_text("tpot_s", float(row["tpot_s"]))
    wait_for(browser, "Array.from(document.querySelectorAll('#summary-table tbody tr'), r => Array.from("
                      f"r.querySelectorAll('td'), c => c.textContent).join('=')).includes('tpot_s={tpot}')")
    assert page_errors(browser.events) == [] and requests_outside(browser, base) == []
