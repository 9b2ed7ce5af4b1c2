"""A report's plots drawn two or more at a time (``dse.present.drawing``): the helper processes
draw the same bytes as this process (forked or spawned), every helper takes plots, the first is
forked only while no other thread runs here and the others are forked from it, a helper that dies
costs nothing but time, and the helpers end with their parent however that ends."""
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
from test_report import STUDY  # a small grid with every kind of plot

from dse.present import drawing
from dse.present.drawing import Drawer, PlotFailed
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
def test_plots_drawn_by_the_helpers_are_the_bytes_drawn_here(run, start, monkeypatch):
    if start not in multiprocessing.get_all_start_methods():
        pytest.skip(f"no {start} here")
    monkeypatch.setattr(drawing, "_helper_context", lambda: multiprocessing.get_context(start))
    out, (study, spec) = run
    here = _report(out, study, spec, Drawer())
    with _Recording(helper=True) as drawer:
        helpers = drawer.ready(timeout=120)
        both = _report(out, study, spec, drawer)
    assert len(helpers) == min(drawing.usable_cores(), drawing.MAX_HELPERS)
    assert os.getpid() not in helpers and len(set(helpers)) == len(helpers)
    # the first plots go to the helpers one each, so every helper draws
    assert {d.by_helper for d in drawer.asked} == set(helpers)
    assert set(both) == set(here) and len([f for f in here if f.endswith(".png")]) >= 4
    for name in here:
        assert both[name] == here[name], name
    assert json.loads(both["plots.json"]) == json.loads(here["plots.json"])


@two_cores
@pytest.mark.parametrize("killed", ["one", "every"])
def test_helpers_that_die_have_their_plots_drawn_by_the_others_or_here(run, killed):
    out, (study, spec) = run
    here = _report(out, study, spec, Drawer())
    with _Recording(helper=True) as drawer:
        helpers = drawer.ready(timeout=120)
        dead = helpers[-1:] if killed == "one" else helpers
        for pid in dead:
            os.kill(pid, signal.SIGKILL)
        again = _report(out, study, spec, drawer)
    assert again == here
    drew = {d.by_helper for d in drawer.asked}
    if killed == "one":
        assert drew == set(helpers) - set(dead)
    else:
        assert drew == {None}               # every plot drawn here


@two_cores
def test_a_plot_held_by_a_helper_that_dies_goes_to_another():
    with _Recording(helper=True) as drawer:
        first, *others = drawer.ready(timeout=120)
        drawer.draw(time.sleep, 2.0)              # the first helper takes it
        os.kill(first, signal.SIGKILL)
        drawer.finish()
    assert drawer.asked[0].by_helper in others


@two_cores
def test_a_helper_takes_the_next_plot_as_soon_as_it_is_free():
    # a long plot and four short ones: while one helper draws the long one, the others draw
    # every short one, each handed over as the one before ends
    with _Recording(helper=True) as drawer:
        helpers = drawer.ready(timeout=120)
        t = time.monotonic()
        for seconds in (3.0, 0.05, 0.05, 0.05, 0.05):
            drawer.draw(time.sleep, seconds)
        drawer.finish()
        took = time.monotonic() - t
        for d in drawer.asked:
            d.result()
    long, *short = [d.by_helper for d in drawer.asked]
    assert long in helpers and None not in short and long not in short
    assert took < 3.0 + 0.5 * 0.05 * 4 + 1.0      # the short ones overlapped the long one


@two_cores
def test_a_plot_that_cannot_be_sent_is_drawn_here():
    with _Recording(helper=True) as drawer:
        drawer.ready(timeout=120)
        drawer.draw(lambda: {"here": True})         # a lambda cannot be pickled
        drawer.draw(int, "3")
        drawer.finish()
        records = [d.result() for d in drawer.asked]
    assert records == [{"here": True}, 3]
    assert drawer.asked[0].by_helper is None and drawer.asked[1].by_helper is not None


def test_a_plot_that_fails_on_a_helper_raises_here():
    with Drawer(helper=True) as drawer:
        drawn = drawer.draw(int, "not a number")
        drawer.finish()
        # the error names the plot and the helper; the plot's own error is its cause
        with pytest.raises(PlotFailed, match=r"plot not a number \(int\) failed in helper process \d+: ValueError") as e:
            drawn.result()
        assert isinstance(e.value.__cause__, ValueError) and "not a number" in str(e.value.__cause__)


@two_cores
@pytest.mark.skipif(sys.platform != "linux", reason="the helper is forked on Linux only")
def test_the_helpers_are_forked_only_while_no_other_thread_runs(tmp_path):
    # a fresh process (one thread): its helpers are copies of it, with its command line, the
    # first forked from it and the others from the first (which has imported matplotlib); with
    # a second thread running, fresh interpreters are spawned instead (a fork would copy the
    # locks that thread may hold)
    script = textwrap.dedent("""
        import os, threading
        from dse.present.drawing import Drawer
        def command(pid):
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                return f.read().replace(b"\\0", b" ").decode()
        def parent(pid):
            with open(f"/proc/{pid}/stat") as f:
                return int(f.read().rsplit(")", 1)[1].split()[1])
        if __name__ == "__main__":
            with Drawer(helper=True) as alone:
                first, *others = alone.ready(timeout=120)
                print(*(command(pid) for pid in [first, *others]), sep="|", flush=True)
                print(parent(first) == os.getpid() and all(parent(p) == first for p in others), flush=True)
            stop = threading.Event()
            threading.Thread(target=stop.wait).start()
            with Drawer(helper=True) as beside:
                print(*(command(pid) for pid in beside.ready(timeout=120)), sep="|", flush=True)
            stop.set()
        """)
    (tmp_path / "parent.py").write_text(script)
    r = subprocess.run([sys.executable, str(tmp_path / "parent.py")], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    alone, family, beside = r.stdout.splitlines()
    assert family == "True"
    alone, beside = alone.split("|"), beside.split("|")
    assert all(c.split()[-1].endswith("parent.py") and "spawn_main" not in c for c in alone)
    assert len(beside) == len(alone) and all("spawn_main" in c for c in beside)


def test_no_helper_on_one_core(monkeypatch):
    monkeypatch.setattr(drawing, "usable_cores", lambda: 1)
    with Drawer(helper=True) as drawer:
        assert not drawer.helper and drawer.ready() == []
        assert drawer.draw(int, "7").by_helper is None       # drawn here at once


@two_cores
def test_the_helper_ends_with_its_parent(tmp_path):
    script = textwrap.dedent("""
        import os, signal, sys
        from dse.present.drawing import Drawer
        if __name__ == "__main__":
            drawer = Drawer(helper=True)
            print(*drawer.ready(timeout=120), flush=True)
            os.kill(os.getpid(), signal.SIGKILL)      # no clean-up of any kind
        """)
    (tmp_path / "parent.py").write_text(script)
    r = subprocess.run([sys.executable, str(tmp_path / "parent.py")], capture_output=True, text=True, timeout=180)
    assert r.returncode == -signal.SIGKILL, r.stderr
    helpers = [int(pid) for pid in r.stdout.split()]
    assert len(helpers) >= 2
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if not any(_running(pid) for pid in helpers):
            return
        time.sleep(0.1)
    pytest.fail(f"helpers {[pid for pid in helpers if _running(pid)]} outlived their killed parent by 30 s")


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


@two_cores
@pytest.mark.skipif(not hasattr(os, "getpriority"), reason="no process priorities here")
def test_the_helpers_yield_the_cores_to_the_run():
    # the helpers import while the study runs: they wait for the cores the run leaves free
    with Drawer(helper=True) as drawer:
        helpers = drawer.ready(timeout=120)
        ours = os.getpriority(os.PRIO_PROCESS, 0)
        assert all(os.getpriority(os.PRIO_PROCESS, pid) == min(ours + drawing.HELPER_NICENESS, 19)
                   for pid in helpers)
        assert drawing.HELPER_NICENESS > 0
