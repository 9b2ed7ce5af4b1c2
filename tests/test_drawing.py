"""A report's plots drawn two at a time (``dse.present.drawing``): the helper process draws
the same bytes as this process (forked from it or spawned), is forked only while no other
thread runs here, a helper that dies costs nothing but time, and the helper ends with its
parent however that ends."""
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import run_cli
from test_report import STUDY   # a small grid with every kind of plot

from dse.present import drawing
from dse.present.drawing import Drawer
from dse.present.report import write_report
from dse.study.studyfile import load_study

two_cores = pytest.mark.skipif(drawing.usable_cores() < 2, reason="the helper is started only with two cores or more")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("drawing")
    (d / "study.yaml").write_text(STUDY)
    out = d / "out"
    r = run_cli("run", d / "study.yaml", "--out", out, "--quiet")
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr, r.stderr       # the helper, stopped at the end, ends quietly
    return out, load_study(str(d / "study.yaml"))


def _report(out, study, spec, drawer) -> dict:
    """Write the report of ``out`` with ``drawer``; {file: bytes} of what it wrote."""
    return {p.name: p.read_bytes() for p in write_report(out, study, spec, drawer=drawer)}


class _Recording(Drawer):
    """A Drawer that keeps the plots it was asked for."""

    def __init__(self, helper: bool):
        super().__init__(helper)
        self.asked = []

    def draw(self, plot, *args, **kwargs):
        drawn = super().draw(plot, *args, **kwargs)
        self.asked.append(drawn)
        return drawn


@two_cores
@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_plots_drawn_by_the_helper_are_the_bytes_drawn_here(run, start, monkeypatch):
    if start not in multiprocessing.get_all_start_methods():
        pytest.skip(f"no {start} here")
    monkeypatch.setattr(drawing, "_helper_context", lambda: multiprocessing.get_context(start))
    out, (study, spec) = run
    here = _report(out, study, spec, Drawer())
    with _Recording(helper=True) as drawer:
        assert drawer.ready(timeout=120) not in (None, os.getpid())
        both = _report(out, study, spec, drawer)
    assert sum(d.by_helper for d in drawer.asked) >= 1            # the helper drew some of them
    assert sum(not d.by_helper for d in drawer.asked) >= 1        # and this process the others
    assert set(both) == set(here) and len([f for f in here if f.endswith(".png")]) >= 4
    for name in here:
        assert both[name] == here[name], name
    assert json.loads(both["plots.json"]) == json.loads(here["plots.json"])


@two_cores
def test_a_helper_that_dies_has_its_plots_drawn_here(run):
    out, (study, spec) = run
    here = _report(out, study, spec, Drawer())
    with _Recording(helper=True) as drawer:
        pid = drawer.ready(timeout=120)
        os.kill(pid, signal.SIGKILL)
        again = _report(out, study, spec, drawer)
    assert again == here
    assert not any(d.by_helper for d in drawer.asked)


@two_cores
def test_the_helper_takes_the_next_plot_as_soon_as_it_is_free():
    # four short plots and a long one: while this process draws the long one (the last, taken
    # from the back), the helper draws every short one, each handed over as the one before ends
    with _Recording(helper=True) as drawer:
        assert drawer.ready(timeout=120) not in (None, os.getpid())
        for seconds in (0.05, 0.05, 0.05, 0.05, 3.0):
            drawer.draw(time.sleep, seconds)
        drawer.finish()
        for d in drawer.asked:
            d.result()
    assert [d.by_helper for d in drawer.asked] == [True, True, True, True, False]


@two_cores
@pytest.mark.skipif(sys.platform != "linux", reason="the helper is forked on Linux only")
def test_the_helper_is_forked_only_while_no_other_thread_runs(tmp_path):
    # a fresh process (one thread): its helper is a copy of it, with its command line; with a
    # second thread running, a fresh interpreter is spawned instead (a fork would copy the
    # locks that thread may hold)
    script = textwrap.dedent("""
        import threading
        from dse.present.drawing import Drawer
        def command(pid):
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                return f.read().replace(b"\\0", b" ").decode()
        if __name__ == "__main__":
            with Drawer(helper=True) as alone:
                print(command(alone.ready(timeout=120)), flush=True)
            stop = threading.Event()
            threading.Thread(target=stop.wait).start()
            with Drawer(helper=True) as beside:
                print(command(beside.ready(timeout=120)), flush=True)
            stop.set()
        """)
    (tmp_path / "parent.py").write_text(script)
    r = subprocess.run([sys.executable, str(tmp_path / "parent.py")], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    alone, beside = r.stdout.splitlines()
    assert alone.split()[-1].endswith("parent.py") and "spawn_main" not in alone
    assert "spawn_main" in beside


def test_no_helper_on_one_core(monkeypatch):
    monkeypatch.setattr(drawing, "usable_cores", lambda: 1)
    with Drawer(helper=True) as drawer:
        assert not drawer.helper and drawer.ready() is None


@two_cores
def test_the_helper_ends_with_its_parent(tmp_path):
    script = textwrap.dedent("""
        import os, signal, sys
        from dse.present.drawing import Drawer
        if __name__ == "__main__":
            drawer = Drawer(helper=True)
            print(drawer.ready(timeout=120), flush=True)
            os.kill(os.getpid(), signal.SIGKILL)      # no clean-up of any kind
        """)
    (tmp_path / "parent.py").write_text(script)
    r = subprocess.run([sys.executable, str(tmp_path / "parent.py")], capture_output=True, text=True, timeout=180)
    assert r.returncode == -signal.SIGKILL, r.stderr
    helper = int(r.stdout.split()[0])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if not _running(helper):
            return
        time.sleep(0.1)
    pytest.fail(f"the helper (pid {helper}) outlived its killed parent by 30 s")


def _running(pid: int) -> bool:
    """Whether process ``pid`` runs (an ended one its new parent has not reaped yet does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True
