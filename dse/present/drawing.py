"""Where a report's plots are drawn: in this process, and on one helper process started
early (``Drawer(helper=True)``, when the run begins) where the machine has a second core,
so that two plots are drawn at a time. Drawing a figure is matplotlib's Python work (text
and tick layout, a fifth of a second a figure), which threads cannot share out.

Once the helper is ready (its imports done), each plot asked (a plotting function of
``dse.present.plots`` and its arguments) is queued for it, and this process goes on with
the report; ``finish()`` then draws here, from the last one back, the plots the helper has
not started, while the helper takes them from the first on. Before the helper is ready, or
without one, a plot is drawn here when asked. The files are the same bytes either way (the
same functions, settings and fonts); ``Drawn.result()`` is a plot's record.

The helper ignores Ctrl-C (its parent stops it), ends with its parent however that ends
(``dse.explore.executors.exit_with``), and writes only the plot files it is asked for, as
this process would (atomically). A helper that dies has its plots drawn here instead.
"""
from __future__ import annotations

import functools
import importlib
import multiprocessing
import os
import signal
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
    """A plot asked of a ``Drawer``: drawn here already, or by the helper (a future)."""

    def __init__(self, draw: Callable, args: tuple, kwargs: dict, *, value=None, future: Future | None = None):
        self._call = functools.partial(draw, *args, **kwargs)
        self._value, self._future = value, future
        self._finish: list[Callable] = []
        self.by_helper = False      # whether the helper drew it (known once read)

    def then(self, finish: Callable[[dict], dict]) -> Drawn:
        """This plot, its record to be passed through ``finish`` (record -> record) when read."""
        self._finish.append(finish)
        return self

    def steal(self) -> None:
        """Draw the plot here if the helper has not started it."""
        if self._future is not None and self._future.cancel():
            self._future = None
            self._value = self._call()

    def result(self) -> dict:
        """The plot's record (waiting for the helper if it draws it); drawn here if the helper died."""
        if self._future is not None:
            try:
                self._value = self._future.result()
                self.by_helper = True
            except (BrokenProcessPool, CancelledError):      # the helper died, or was stopped
                self._value = self._call()
            self._future = None
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
        self._queued: list[Drawn] = []
        if helper:
            self.start()

    def start(self) -> None:
        """Start the helper now, where the machine has two cores or more (and none runs yet)."""
        if self._pool is None and usable_cores() > 1:
            # spawn, not the sweep workers' forkserver: that server keeps the modules it was started with
            self._pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_start_helper, initargs=(os.getpid(),))
            self._ready = self._pool.submit(_is_ready)

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

    def draw(self, plot: Callable, *args, **kwargs) -> Drawn:
        """``plot(*args, **kwargs)`` (a function of ``dse.present.plots``, which writes its
        file and returns its record): queued for the helper if it is ready, else drawn here now."""
        if self._helper_ready():
            try:
                future = self._pool.submit(_draw, plot, args, kwargs)
            except (BrokenProcessPool, RuntimeError):     # the helper died, or was stopped
                self.close()
            else:
                drawn = Drawn(plot, args, kwargs, future=future)
                self._queued.append(drawn)
                return drawn
        return Drawn(plot, args, kwargs, value=plot(*args, **kwargs))

    def finish(self) -> None:
        """Draw here, from the last back, the queued plots the helper has not started."""
        for drawn in reversed(self._queued):
            drawn.steal()
        self._queued = []

    def close(self) -> None:
        """Stop the helper (a plot it still draws is drawn here when read)."""
        if self._pool is not None:
            stop_pool(self._pool)
            self._pool = None

    def __enter__(self) -> Drawer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _start_helper(parent: int) -> None:
    """Initializer of the helper: leave Ctrl-C to the parent, end with it, import what it draws with."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    exit_with(parent)
    for name in HELPER_MODULES:
        importlib.import_module(name)


def _is_ready() -> int:
    """The helper's process id, once its initializer has run."""
    return os.getpid()


def _draw(plot: Callable, args: tuple, kwargs: dict) -> dict:
    return plot(*args, **kwargs)
