"""The progress bar of a long command: tqdm on stderr, with the work done, its total and the
time left.

One rule for when it shows (``progress_shown``): on a terminal, or anywhere when asked for
(``--progress``), never when ``--quiet``. tqdm is imported when a bar is made (an Optuna
dependency), so commands that show none do not pay for it.
"""
from __future__ import annotations

import sys

#: what a bar shows: done / total, elapsed and the time left (tqdm's estimate from the rate so far)
BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} {unit}s [{elapsed} elapsed, {remaining} left{postfix}]"
#: the same while the total is not known (tqdm would say 00:00 left)
UNKNOWN_TOTAL_FORMAT = "{desc}: {n_fmt}/? {unit}s [{elapsed} elapsed, ? left{postfix}]"


def set_total(bar, total: int | float | None) -> None:
    """Set ``bar``'s total (None: not known, the time left shown as ``?``) and redraw it."""
    bar.total = total
    bar.bar_format = BAR_FORMAT if total is not None else UNKNOWN_TOTAL_FORMAT
    bar.refresh()


def progress_shown(quiet: bool, progress: bool | None) -> bool:
    """Whether a bar is drawn: never when ``quiet``; with ``progress`` always; else only when
    stderr is a terminal."""
    return not quiet and (bool(progress) or sys.stderr.isatty())


def progress_bar(what: str, total: int | float | None, *, unit: str = "step", shown: bool, initial: int = 0):
    """A tqdm bar on stderr named ``what`` of ``total`` ``unit``s (None: not known yet, set it
    later with ``set_total``), drawn when ``shown``; ``initial``: units done before this
    run (counted in done, not in the rate the time left is estimated from)."""
    from tqdm import tqdm

    return tqdm(desc=what, total=total, initial=initial, file=sys.stderr, disable=not shown, unit=unit,
                dynamic_ncols=True, bar_format=BAR_FORMAT if total is not None else UNKNOWN_TOTAL_FORMAT)
