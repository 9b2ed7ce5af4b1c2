"""A headless Chromium driven over the Chrome DevTools Protocol on a pipe, for the browser tests
(report.html, ``dse explore``).

Chromium is driven over ``--remote-debugging-pipe`` (JSON messages ending in a NUL byte, fd 3
into the browser, fd 4 out of it), the transport Puppeteer and Playwright use, written here with
the standard library alone: no Python package and no driver binary to install, nothing to keep
in step with the browser's version. ``find_browser`` is None only when the machine has no
Chromium (CI installs Debian's); a test then skips and says why.
"""
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path

import pytest

#: where Debian's and other distributions' packages put Chromium (or Chrome)
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
#: headless, and no connection of its own (this machine refuses them; a report needs none)
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--disable-default-apps", "--mute-audio", "--remote-debugging-pipe")
TIMEOUT_S = 60


def find_browser() -> str | None:
    """The Chromium (or Chrome) binary to drive: $DSE_TEST_CHROMIUM, else the first of ``BROWSERS`` on PATH; None if none."""
    found = os.environ.get("DSE_TEST_CHROMIUM") or next(filter(None, map(shutil.which, BROWSERS)), None)
    return found if found and os.access(found, os.X_OK) else None


def browser_or_skip() -> str:
    """``find_browser``'s binary; the calling test skips, saying why, on a machine without one."""
    binary = find_browser()
    if binary is None:
        pytest.skip(f"no Chromium binary ({', '.join(BROWSERS)} not on PATH; set DSE_TEST_CHROMIUM or "
                    f"apt-get install chromium)")
    return binary


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


def page_errors(events: list[dict]) -> list[str]:
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
