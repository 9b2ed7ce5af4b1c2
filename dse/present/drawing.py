"""Where a report's plots are drawn: on helper processes started early (``Drawer(helper=True)``,
when the run begins) where the machine has a second core, so that the plots are drawn two
(or more) at a time while this process builds the report; else in this process. Drawing a
figure is matplotlib's Python work (text and tick layout, a fifth of a second a figure), which
threads cannot share out.

On Linux (while no other thread runs here) the first helper is a fork of this process, so it
imports only matplotlib, not pandas and dse again; once it has, it forks the other helpers from
itself, so matplotlib is imported once for all of them, and never in this process: a run that
imports matplotlib on a thread while it evaluates shares the interpreter's lock with that
import (gpu-sweep-1m: 0.3 s of a 1.4 s sweep). Elsewhere each helper is a fresh interpreter
(spawned).

A plot asked (a plotting function of ``dse.present.plots`` and its arguments) is handed to a
helper that is ready (its imports done) and has no plot in hand; otherwise it waits, and is
handed over as soon as a helper is free (whenever this process asks a plot, reads one or
finishes). A helper holds one plot at a time, so no plot is ever taken back from it. Without a
helper (one core, or every helper dead) a plot is drawn here. The files are the same bytes
either way (the same functions, settings and fonts); ``Drawn.result()`` is a plot's record.

A helper ignores Ctrl-C (its parent stops it), ends on SIGTERM (a fork would otherwise keep its
parent's handler) and with the run however that ends (``dse.explore.executors.exit_with``), and
writes only the plot files it is asked for, as this process would (atomically). A helper that
dies has its plots drawn by the others, or here when none is left.
"""
from __future__ import annotations

import importlib
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.reduction import ForkingPickler

from dse.explore.executors import exit_with
from dse.present.plots import MATPLOTLIB_MODULES

__all__ = ["Drawer", "Drawn", "HELPER_MODULES", "MAX_HELPERS", "usable_cores"]

#: what a helper imports before it says it is ready: what a plot's arguments (DataFrames) and drawing need
HELPER_MODULES = ("pandas", "dse.present.plots", *MATPLOTLIB_MODULES)
#: the most helper processes a report is drawn on: a report has 4 to 10 plots, so four draw
#: them in two or three rounds; the machine's cores bound it below that
MAX_HELPERS = 4
#: how much lower the helpers' scheduling priority is than the run's (``os.nice``, Unix): their
#: imports, during the study, yield the cores to its evaluation and its writer thread (gpu-sweep-1m
#: on 2 cores: 2.27 -> 2.22 s median of 6 interleaved runs), and while the report is drawn, the
#: run's own process, which hands them their plots, comes first
HELPER_NICENESS = 10
#: Python 3.12+ warns of a fork while any other OS thread runs (a helper's forks run beside its
#: thread that waits for the run's end, which holds no lock)
_FORK_WARNING = "This process .* is multi-threaded"
#: what pickling raises for what it cannot send: a lock or a file (TypeError), a local
#: function or class (AttributeError, PicklingError)
_UNPICKLABLE = (pickle.PicklingError, TypeError, AttributeError)


def usable_cores() -> int:
    """The CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:              # not Linux
        return os.cpu_count() or 1


class PlotFailed(RuntimeError):
    """A plot raised an error (here or in a helper process): the message names the plot (its
    file and drawing function); the plot's own error, with where in the plot it was raised, is
    the cause."""


class Drawn:
    """A plot asked of a ``Drawer``: drawn already, waiting for a helper, or with one."""

    def __init__(self, drawer: Drawer, draw: Callable, args: tuple, kwargs: dict):
        self.drawer = drawer
        self.draw, self.args, self.kwargs = draw, args, kwargs
        self.drawn = False           # whether its record (or its error) is in
        self.by_helper: int | None = None    # the process id of the helper that drew it
        self._value: dict | None = None
        self._error: BaseException | None = None
        self._finish: list[Callable] = []

    def then(self, finish: Callable[[dict], dict]) -> Drawn:
        """This plot, its record to be passed through ``finish`` (record -> record) when read."""
        self._finish.append(finish)
        return self

    def draw_here(self) -> None:
        """Draw the plot in this process (an error it raises is kept for ``result``)."""
        try:
            self._value = self.draw(*self.args, **self.kwargs)
        except Exception as e:  # noqa: BLE001 - raised again by result(), naming the plot
            self._error = e
        self.drawn = True

    def name(self) -> str:
        """The plot in words: its file (the drawing's first argument, a path) and drawing function."""
        first = self.args[0] if self.args else None
        where = getattr(first, "name", None) or (first if isinstance(first, str) else None)
        what = getattr(self.draw, "__name__", "a plot")
        return f"{where} ({what})" if where else what

    def settle(self, ok: bool, value, helper: int) -> None:
        """The helper ``helper`` drew it: its record (``ok``) or the error it raised."""
        if ok:
            self._value = value
        else:
            self._error = value
        self.drawn, self.by_helper = True, helper

    def result(self) -> dict:
        """The plot's record, waiting for the helper that draws it (drawn here if none is left);
        the error the plot raised, raised again here."""
        if not self.drawn:
            self.drawer.wait_for(self)
        if self._error is not None:
            e = self._error
            by = "" if self.by_helper is None else f" in helper process {self.by_helper}"
            raise PlotFailed(f"plot {self.name()} failed{by}: {type(e).__name__}: {e}") from e
        rec = self._value
        for finish in self._finish:
            rec = finish(rec)
        self._finish = []
        self._value = rec
        return rec


@dataclass(eq=False)
class _Helper:
    """This process's end of a helper's connection, and what it knows of the helper."""
    conn: Connection
    pid: int | None = None            # known once the helper is ready
    holds: Drawn | None = None        # the plot it draws


class Drawer:
    """Draws a report's plots on helper processes when the machine has two cores or more
    (started now with ``helper``, so that their imports overlap with the run before the
    report, or by ``start()``), else here. ``close()`` (or leaving a ``with`` block) stops
    them."""

    def __init__(self, helper: bool = False):
        self._helpers: list[_Helper] = []
        self._processes: list = []             # the helpers this process started (their children aside)
        self._waiting: list[Drawn] = []
        if helper:
            self.start()

    def start(self) -> None:
        """Start the helpers now, one per core up to ``MAX_HELPERS``, where the machine has two
        cores or more (and none was started yet)."""
        n = min(usable_cores(), MAX_HELPERS)
        if self._processes or n < 2:
            return
        context = _helper_context()
        pipes = [multiprocessing.Pipe() for _ in range(n)]          # (this end, the helper's)
        theirs = [b for _, b in pipes]
        parent = os.getpid()
        if context.get_start_method() == "fork":     # the first, which forks the others once it has imported
            processes = [context.Process(target=_first_helper, args=(parent, theirs, [a for a, _ in pipes]),
                                         daemon=True, name="dse-drawing")]
        else:
            processes = [context.Process(target=_helper, args=(parent, b), daemon=True, name="dse-drawing")
                         for b in theirs]
        for p in processes:
            p.start()
        for b in theirs:
            b.close()
        self._processes = processes
        self._helpers = [_Helper(a) for a, _ in pipes]

    @property
    def helper(self) -> bool:
        """Whether helper processes were started (and one at least lives)."""
        return bool(self._helpers)

    def ready(self, timeout: float | None = None) -> list[int]:
        """Wait (at most ``timeout`` seconds) until every helper can take plots; their process
        ids ([] without helpers, or if none started); TimeoutError if not ready in time."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while any(h.pid is None for h in self._helpers):
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(f"the report's helper processes were not ready in {timeout} s")
            self._listen(left)
        return [h.pid for h in self._helpers]

    def draw(self, plot: Callable, *args, **kwargs) -> Drawn:
        """``plot(*args, **kwargs)`` (a function of ``dse.present.plots``, which writes its
        file and returns its record): handed to a helper if one is free, left waiting for one
        if all are busy or not ready yet, drawn here now if there is none."""
        drawn = Drawn(self, plot, args, kwargs)
        if not self._helpers:
            drawn.draw_here()
            return drawn
        self._waiting.append(drawn)
        self._listen(0)
        return drawn

    def wait_for(self, drawn: Drawn) -> None:
        """Return once ``drawn`` is drawn: by a helper, or here when none is left."""
        while not drawn.drawn:
            if not self._helpers:
                self._waiting.remove(drawn)
                drawn.draw_here()
                return
            self._listen(None)

    def finish(self) -> None:
        """Wait until every plot asked is drawn (those left when no helper is, drawn here)."""
        while self._waiting or any(h.holds is not None for h in self._helpers):
            if not self._helpers:
                waiting, self._waiting = self._waiting, []
                for drawn in waiting:
                    drawn.draw_here()
                return
            self._listen(None)

    def close(self) -> None:
        """Stop the helpers: asked to end, and stopped at once if they draw a plot still (it
        is drawn here if read)."""
        for h in self._helpers:
            try:
                h.conn.send(None)
            except OSError:
                pass
        for h in list(self._helpers):
            if h.holds is not None:
                self._lost(h)
        for p in self._processes:
            p.join(1.0)
            if p.is_alive():
                p.terminate()
                p.join(5.0)
        for h in self._helpers:
            h.conn.close()
        self._helpers, self._processes = [], []

    def __enter__(self) -> Drawer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _listen(self, timeout: float | None) -> None:
        """Take in what the helpers said (waiting up to ``timeout`` seconds, None: no limit,
        for a first word when none came yet), then hand the plots waiting to the free ones."""
        by_conn = {h.conn: h for h in self._helpers}
        for conn in wait(list(by_conn), timeout) if by_conn else []:
            h = by_conn[conn]
            try:
                word, value = conn.recv()
            except (EOFError, OSError):       # it died
                self._lost(h)
                continue
            if word == "ready":
                h.pid = value
            else:
                drawn, h.holds = h.holds, None
                drawn.settle(word == "drawn", value, h.pid)
        self._hand_out()

    def _hand_out(self) -> None:
        """Give each ready helper without a plot the first plot waiting (so that, after, no
        plot waits while a ready helper is free)."""
        for h in list(self._helpers):
            while self._waiting and h.pid is not None and h.holds is None:
                drawn = self._waiting.pop(0)
                try:
                    task = ForkingPickler.dumps((drawn.draw, drawn.args, drawn.kwargs))
                except _UNPICKLABLE:          # arguments that cannot be sent: drawn here
                    drawn.draw_here()
                    continue
                try:
                    h.conn.send_bytes(task)
                except OSError:               # it died
                    self._waiting.insert(0, drawn)
                    self._lost(h)
                    break
                h.holds = drawn

    def _lost(self, h: _Helper) -> None:
        """Helper ``h`` died (or is stopped): its plot goes back to the front of the queue."""
        self._helpers.remove(h)
        if h.holds is not None:
            self._waiting.insert(0, h.holds)
            h.holds = None
        if h.pid is not None:
            try:
                os.kill(h.pid, signal.SIGTERM)
            except OSError:
                pass
        h.conn.close()


def _helper_context():
    """How the helpers start: the first forked from this process where that is safe (Linux,
    and no other Python thread runs here, so none holds a lock the copy would inherit; the
    native threads of the libraries, OpenBLAS's and Arrow's, handle a fork themselves), so that
    it inherits the modules imported here (pandas and dse: ~0.45 s of a fresh interpreter's
    imports, gpu-sweep-1m's run) and imports only matplotlib, the others forked from it; else
    each spawned, a fresh interpreter. Never the sweep workers' forkserver: that server keeps
    the modules it was started with."""
    if sys.platform == "linux" and threading.active_count() == 1:
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


def _begin(parent: int) -> None:
    """A helper's start: leave Ctrl-C to the parent, end on SIGTERM (as the parent stops it; a
    forked helper inherits the parent's handler) and with the parent; a lower priority
    (``HELPER_NICENESS``), which the helpers forked from it inherit."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if hasattr(os, "nice"):
        os.nice(HELPER_NICENESS)
    exit_with(parent)


def _import() -> None:
    """Import what a helper draws with (``HELPER_MODULES``), before it says it is ready."""
    for name in HELPER_MODULES:
        importlib.import_module(name)


def _helper(parent: int, conn: Connection) -> None:
    """A spawned helper: import what it draws with, then draw what ``conn`` asks."""
    _begin(parent)
    _import()
    _serve(conn)


def _first_helper(parent: int, conns: list[Connection], parent_ends: list[Connection]) -> None:
    """The forked first helper: import what it draws with, fork a helper from itself for each
    of ``conns`` after the first (they inherit the imports), then draw what ``conns[0]`` asks.
    ``parent_ends``: the parent's ends of the connections (the copies this fork inherited,
    closed here, so that each end closes with the process that holds it)."""
    for conn in parent_ends:
        conn.close()
    _begin(parent)
    _import()
    for i, conn in enumerate(conns[1:], 1):
        sys.stdout.flush()
        sys.stderr.flush()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", _FORK_WARNING, DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            try:
                for other in conns:
                    if other is not conn:
                        other.close()
                exit_with(parent)               # a fork has no thread but the one that forked
                _serve(conn)
            finally:
                os._exit(0)
        conn.close()
    _serve(conns[0])


def _serve(conn: Connection) -> None:
    """Say ready, then draw each plot ``conn`` asks and answer its record (or the error it
    raised), until asked to end (None) or the parent's end of ``conn`` closes."""
    conn.send(("ready", os.getpid()))
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        plot, args, kwargs = task
        try:
            answer = ("drawn", plot(*args, **kwargs))
        except Exception as e:  # noqa: BLE001 - the helper's process boundary: any failure of a plot goes back
            e.add_note("raised in the helper process, at:\n" + traceback.format_exc().rstrip())  # where in the plot
            answer = ("failed", e)   # to the run, which raises it there as PlotFailed, naming the plot
        try:
            conn.send(answer)
        except _UNPICKLABLE as e:            # an error that cannot be pickled: said in words
            conn.send(("failed", RuntimeError(f"{type(answer[1]).__name__}: {answer[1]} ({e})")))
