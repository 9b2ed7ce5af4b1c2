"""Running a study into its folder: a sweep or an Optuna search, then the Pareto front
and the explanation of the best designs (what the report shows; it recomputes nothing)."""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from basis.errors import DseError
from basis.files import output_folder
from dse.explore.best import explain_best
from dse.explore.online import pareto_columns
from dse.explore.pareto import front_note
from dse.explore.plan import empty_objectives
from dse.explore.runio import FrameResults, ResultsFile, RunLock, write_atomic
from dse.explore.search import run_search
from dse.explore.spec import SweepSpec
from dse.explore.sweep import check_values, front_of, run_sweep, unvalued


def check_study_inputs(spec: SweepSpec) -> None:
    """DseError, one line naming the study and the key, for a study that cannot run, before its folder
    is made: an objective no design can have a value of (no price, no energy figure:
    ``empty_objectives``), or a value only the evaluator checks (an engine, a choice, a pool's hardware:
    ``check_values``)."""
    empty_objectives(spec.space, spec.objectives, spec.where, spec.ideal)
    check_values(spec)


def run_study(spec: SweepSpec, out: str | Path, storage: str | None = None, workers: int = 1,
              quiet: bool = True, scheduler: str | None = None, progress: bool | None = None,
              checked: bool = False) -> pd.DataFrame:
    """Run a sweep or an Optuna search into ``out`` (resuming), write ``pareto.csv`` and
    ``best.json`` (the best design per objective, explained), and return the Pareto front.
    ``workers``: processes of this machine (an Optuna search's trials, a sweep's chunks);
    ``scheduler``: a Dask scheduler's address that runs a sweep's chunks instead. ``progress``:
    an Optuna search's bar even when stderr is not a terminal.
    The front's ``attrs["front_note"]`` says why it is smaller or empty than its designs
    would make it (some have no value, NaN, of an objective: ``pareto.front_note``), else
    None; it is said on stderr (``quiet`` silences progress only).
    The folder is locked for the run: a second run on it is refused (DseError), and so is a study
    whose objective no design can have a value of, or with a value the evaluator refuses
    (``check_study_inputs``; ``checked``: the caller has made those checks before making the folder)."""
    if spec.method != "optuna" and storage is not None:
        raise DseError("--storage applies to optuna studies (method: optuna)")
    if spec.method == "optuna" and scheduler is not None:
        raise DseError("--scheduler applies to sweeps (method: grid, random or sobol); an optuna study shares its "
                       "trials through --storage")
    if scheduler is not None and workers != 1:
        raise DseError("give --workers (processes of this machine) or --scheduler (a Dask cluster), not both")
    if not checked:
        check_study_inputs(spec)         # refused before the folder exists
    out = output_folder(out)
    with RunLock(out):
        if spec.method != "optuna":
            front = run_sweep(spec, out, quiet=quiet, workers=workers, scheduler=scheduler)[1]
        else:
            rows = run_search(spec, out, storage, workers, quiet, progress=progress)
            front = front_of(rows, spec.objectives).reset_index(drop=True) if len(rows) else rows
            write_atomic(front[pareto_columns(front.columns, spec.objectives, "trial")], out / "pareto.csv", "csv")
            front.attrs["front_note"] = front_note(unvalued(rows, spec.objectives), int(rows["feasible"].sum())
                                                   if len(rows) else 0, len(front))
        if spec.method == "optuna" or spec.rows_kept == "all":
            explain_best(out, spec, ResultsFile(out / "results.parquet"))
        else:            # no rows kept but the front's: the best feasible design per objective is on it
            explain_best(out, spec, FrameResults(front if "feasible" in front else pd.DataFrame({"feasible": []})))
    if front.attrs.get("front_note"):       # said even when quiet (no progress): it is about the results
        print(f"dse.study: {front.attrs['front_note']}", file=sys.stderr)
    return front
