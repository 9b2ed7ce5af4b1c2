"""Where a report's plots are drawn: in this process, and on one helper process started
early (``Drawer(helper=True)``, when the run begins) where the machine has a second core,
so that two plots are drawn at a time. Drawing a figure is matplotlib's Python work (text
and tick layout, a fifth of a second a figure), which threads cannot share out. The helper
is a fork of this process where that is safe (Linux, no other thread running here), so it
imports only matplotlib, not pandas and dse again; else a fresh interpreter (spawned).

A plot asked (a plotting function of ``dse.present.plots`` and its arguments) goes to the
helper when it is ready (its imports done) and has no plot in hand, and this process goes on
with the report; otherwise it waits. Whenever the helper finishes a plot it is handed the
first one waiting at once (from the thread that learns of it), so it never idles while plots
wait; ``finish()`` draws the last ones waiting here, until none is left. The helper holds one
plot at a time, so no plot is ever taken back from it. Without a helper (or before it is
ready, with no plot for it yet) a plot is drawn here when asked. The files are the same
bytes either way (the same functions, settings and fonts); ``Drawn.result()`` is a plot's
record.

The helper ignores Ctrl-C (its parent stops it), ends on SIGTERM (a fork would otherwise
keep its parent's handler) and with its parent however that ends
(``dse.explore.executors.exit_with``), and writes only the plot files it is asked for, as
this process would (atomically). A helper that dies has its plots drawn here instead.
"""
from __future__ import annotations

import functools
import importlib
import multiprocessing
import os
import signal
import sys
import threading
import warnings
from collections.abc import Callable
from concurrent.futures import CancelledError, Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from dse.explore.executors import exit_with, stop_pool
from dse.present.plots import MATPLOTLIB_MODULES

__all__ = ["Drawer", "Drawn", "HELPER_MODULES", "usable_cores"]

#: what the helper imports before it says it is ready: what a plot's arguments (DataFrames) and drawing need
HELPER_MODULES = ("pandas", "dse.present.plots", *MATPLOTLIB_MODULES)


def usable_cores() -> int:
    """The CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:              # not Linux
        return os.cpu_count() or 1


class Drawn:
    """A plot asked of a ``Drawer``: drawn here already, waiting, or with the helper (a future)."""

    def __init__(self, draw: Callable, args: tuple, kwargs: dict):
        self.call = functools.partial(draw, *args, **kwargs)     # the plot, to draw here or hand over
        self.future: Future | None = None                         # with the helper: its answer
        self._value, self._drawn = None, False
        self._finish: list[Callable] = []
        self.by_helper = False      # whether the helper drew it (known once read)

    def then(self, finish: Callable[[dict], dict]) -> Drawn:
        """This plot, its record to be passed through ``finish`` (record -> record) when read."""
        self._finish.append(finish)
        return self

    def draw_here(self) -> None:
        """Draw the plot in this process."""
        self._value, self._drawn = self.call(), True

    def result(self) -> dict:
        """The plot's record (waiting for the helper if it draws it); drawn here if the helper
        died, or if no one drew it yet."""
        if self.future is not None:
            try:
                self._value, self._drawn = self.future.result(), True
                self.by_helper = True
            except (BrokenProcessPool, CancelledError):      # the helper died, or was stopped
                pass
            self.future = None
        if not self._drawn:
            self.draw_here()
        rec = self._value
        for finish in self._finish:
            rec = finish(rec)
        self._finish = []
        self._value = rec
        return rec


class Drawer:
    """Draws a report's plots here, and on a helper process when the machine has two cores
    or more: started now with ``helper`` (its imports overlap with the run before the
    report), or by ``start()``. ``close()`` (or leaving a ``with`` block) stops it."""

    def __init__(self, helper: bool = False):
        self._pool: ProcessPoolExecutor | None = None
        self._ready: Future | None = None
        self._busy: Future | None = None
        self._waiting: list[Drawn] = []
        # guards _busy and _waiting, which the thread that learns of the helper's plots changes
        # too (reentrant: a plot done already has its callback run at once, by this thread)
        self._lock = threading.RLock()
        if helper:
            self.start()

    def start(self) -> None:
        """Start the helper now, where the machine has two cores or more (and none runs yet)."""
        if self._pool is None and usable_cores() > 1:
            context = _helper_context()
            self._pool = ProcessPoolExecutor(1, mp_context=context, initializer=_start_helper,
                                             initargs=(os.getpid(),))
            with warnings.catch_warnings():     # Python 3.12+ warns of a fork while any OS thread runs
                if context.get_start_method() == "fork":
                    warnings.filterwarnings("ignore", "This process .* is multi-threaded", DeprecationWarning)
                self._ready = self._pool.submit(_is_ready)         # starts the helper

    @property
    def helper(self) -> bool:
        """Whether a helper process was started."""
        return self._pool is not None

    def ready(self, timeout: float | None = None) -> int | None:
        """Wait (at most ``timeout`` seconds) until the helper can take plots; its process id
        (None without a helper, or if it failed to start); TimeoutError if not ready in time."""
        if self._pool is None:
            return None
        try:
            return self._ready.result(timeout)
        except (BrokenProcessPool, CancelledError):
            return None

    def _helper_ready(self) -> bool:
        return (self._pool is not None and self._ready.done() and not self._ready.cancelled()
                and self._ready.exception() is None)

    def _helper_free(self) -> bool:
        return self._helper_ready() and (self._busy is None or self._busy.done())

    def _submit(self, drawn: Drawn) -> bool:
        """Give ``drawn`` to the helper (under the lock); False if it has died or was stopped."""
        pool = self._pool
        if pool is None:
            return False
        try:
            future = pool.submit(_draw, drawn.call.func, drawn.call.args, drawn.call.keywords)
        except (BrokenProcessPool, RuntimeError):     # the helper died, or was stopped
            return False
        drawn.future = self._busy = future
        future.add_done_callback(self._next)
        return True

    def _hand_over(self, drawn: Drawn) -> bool:
        """Give ``drawn`` to the helper; False if it has died (it is stopped then)."""
        if self._submit(drawn):
            return True
        self.close()
        return False

    def _next(self, done: Future) -> None:
        """The helper's plot ``done`` is finished: hand it the first plot waiting. Runs on the
        thread that learns of it. Nothing when the plot failed or was cancelled (the helper
        died or was stopped: such futures are settled while the pool holds its own lock, which
        handing over would take again); ``finish`` then draws what waits here."""
        if done.cancelled() or done.exception() is not None:
            return
        with self._lock:
            if done is not self._busy or not self._waiting:
                return                            # already handed another, or nothing waits
            drawn = self._waiting.pop(0)
            if not self._submit(drawn):
                self._waiting.insert(0, drawn)

    def draw(self, plot: Callable, *args, **kwargs) -> Drawn:
        """``plot(*args, **kwargs)`` (a function of ``dse.present.plots``, which writes its
        file and returns its record): handed to the helper if it is free, left waiting for it
        if it is busy, else drawn here now."""
        drawn = Drawn(plot, args, kwargs)
        with self._lock:
            if self._helper_free() and self._hand_over(drawn):
                return drawn
            if self._helper_ready():
                self._waiting.append(drawn)
                return drawn
        drawn.draw_here()
        return drawn

    def finish(self) -> None:
        """Draw every plot left waiting: the last here, while the helper takes the first
        whenever it is free."""
        while True:
            with self._lock:
                if not self._waiting:
                    return
                if self._helper_free():
                    if self._hand_over(self._waiting[0]):
                        self._waiting.pop(0)
                    continue
                drawn = self._waiting.pop()
            drawn.draw_here()

    def close(self) -> None:
        """Stop the helper (a plot it still draws is drawn here when read)."""
        if self._pool is not None:
            stop_pool(self._pool)
            self._pool = None

    def __enter__(self) -> Drawer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _helper_context():
    """How the helper process starts: forked from this one where that is safe (Linux, and no
    other Python thread runs here, so none holds a lock the copy would inherit; the native
    threads of the libraries, OpenBLAS's and Arrow's, handle a fork themselves), so that it
    inherits the modules imported here (pandas and dse: ~0.45 s of a fresh interpreter's
    imports, gpu-sweep-1m's run) and imports only matplotlib; else spawned, a fresh
    interpreter. Never the sweep workers' forkserver: that server keeps the modules it was
    started with."""
    if sys.platform == "linux" and threading.active_count() == 1:
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


def _start_helper(parent: int) -> None:
    """Initializer of the helper: leave Ctrl-C to the parent, end on SIGTERM (as the parent
    stops it; a forked helper inherits the parent's handler) and with the parent, import
    what it draws with."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    exit_with(parent)
    for name in HELPER_MODULES:
        importlib.import_module(name)


def _is_ready() -> int:
    """The helper's process id, once its initializer has run."""
    return os.getpid()


def _draw(plot: Callable, args: tuple, kwargs: dict) -> dict:
    return plot(*args, **kwargs)
