"""report.html in a real headless browser: a shipped study's page loads with no console
error, no fetch outside the page, every image decoded, and shows its Pareto front.

Chromium is driven over the Chrome DevTools Protocol on a pipe (``--remote-debugging-pipe``:
JSON messages ending in a NUL byte, fd 3 into the browser, fd 4 out of it), the transport
Puppeteer and Playwright use, written here with the standard library alone: no Python
package and no driver binary to install, nothing to keep in step with the browser's
version. The test is skipped only when the machine has no Chromium (CI installs Debian's).
"""
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pandas as pd
import pytest

from dse.study.cli import main

#: where Debian's and other distributions' packages put Chromium (or Chrome)
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
#: headless, and no connection of its own (this machine refuses them; a report needs none)
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--disable-default-apps", "--mute-audio", "--remote-debugging-pipe")
TIMEOUT_S = 60


def _browser() -> str | None:
    found = os.environ.get("DSE_TEST_CHROMIUM") or next(filter(None, map(shutil.which, BROWSERS)), None)
    return found if found and os.access(found, os.X_OK) else None


class Browser:
    """A headless Chromium and one page of it, driven over the DevTools pipe; every event
    the page sends is kept in ``events``."""

    def __init__(self, binary: str, profile: Path):
        into_r, self._into = os.pipe()       # we write, the browser reads (its fd 3)
        self._from, from_w = os.pipe()       # the browser writes (its fd 4), we read

        def pipes_as_3_and_4():              # in the child, before exec
            os.dup2(into_r, 3)
            os.dup2(from_w, 4)
            os.set_inheritable(3, True)      # dup2 onto the same number keeps close-on-exec
            os.set_inheritable(4, True)
        self.log = open(profile.parent / "chromium.log", "wb")
        self.proc = subprocess.Popen([binary, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
                                     stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log,
                                     preexec_fn=pipes_as_3_and_4, close_fds=False)
        os.close(into_r)
        os.close(from_w)
        self._buf = b""
        self._id = 0
        self.events: list[dict] = []
        self.session = None
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable")

    def call(self, method: str, **params) -> dict:
        """Send one command (to the page once attached); its result, or an AssertionError."""
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params}
        if self.session:
            msg["sessionId"] = self.session
        os.write(self._into, json.dumps(msg).encode() + b"\0")
        reply = self.wait(lambda m: m.get("id") == self._id)
        assert "error" not in reply, f"{method}: {reply['error']}"
        return reply["result"]

    def wait(self, done, timeout: float = TIMEOUT_S) -> dict:
        """The first message for which ``done(message)`` holds, keeping the events met."""
        end = time.monotonic() + timeout
        while True:
            while b"\0" in self._buf:
                raw, self._buf = self._buf.split(b"\0", 1)
                m = json.loads(raw)
                if "method" in m:
                    self.events.append(m)
                if done(m):
                    return m
            ready, _, _ = select.select([self._from], [], [], max(0.0, end - time.monotonic()))
            if not ready:
                raise TimeoutError(f"no answer from the browser in {timeout} s")
            chunk = os.read(self._from, 1 << 20)
            if not chunk:
                raise EOFError(f"the browser exited (status {self.proc.poll()}); see {self.log.name}")
            self._buf += chunk

    def open(self, url: str) -> None:
        """Load ``url`` and wait for its load event."""
        self.call("Page.navigate", url=url)
        self.wait(lambda m: m.get("method") == "Page.loadEventFired")

    def js(self, expression: str):
        """The value of a JavaScript expression in the page (JSON-able)."""
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        assert "exceptionDetails" not in r, r["exceptionDetails"]
        return r["result"].get("value")

    def close(self) -> None:
        try:
            self.session = None
            self.call("Browser.close")
            self.proc.wait(10)
        except (OSError, EOFError, TimeoutError, AssertionError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        finally:
            os.close(self._into)
            os.close(self._from)
            self.log.close()


def _errors(events: list[dict]) -> list[str]:
    """Console errors, uncaught exceptions and browser log errors (a refused fetch, a
    resource that failed to load) among the page's events."""
    out = []
    for e in events:
        p = e.get("params", {})
        if e["method"] == "Runtime.exceptionThrown":
            out.append(p["exceptionDetails"].get("exception", {}).get("description") or p["exceptionDetails"]["text"])
        elif e["method"] == "Runtime.consoleAPICalled" and p["type"] in ("error", "assert"):
            out.append(" ".join(str(a.get("value", a.get("description"))) for a in p["args"]))
        elif e["method"] == "Log.entryAdded" and p["entry"]["level"] == "error":
            out.append(f"{p['entry']['source']}: {p['entry']['text']} {p['entry'].get('url', '')}")
    return out


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """A shipped study run into a fresh folder and its report.html loaded in Chromium:
    (run folder, browser, seconds to run the study, seconds to start the browser and load)."""
    binary = _browser()
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
    assert _errors(browser.events) == []
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
