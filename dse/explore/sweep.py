"""Sweeps over a design space: grid, random or Sobol, evaluated in chunks.

Without an output folder every row comes back in memory (``run_sweep(spec)``: notebooks,
small spaces). With one, the sweep streams: each chunk is evaluated (in this process, on
``workers`` processes of this machine or on a Dask cluster, ``dse.explore.executors``) into
a ``ChunkSummary`` (``dse.explore.online``): its counts, per-parameter aggregates, Pareto
front, sample candidates and, when the sweep keeps every row, its rows as Parquet bytes.
This process merges the summaries in whatever order the chunks finish and writes each
chunk's files atomically (``dse.explore.chunkfiles``), so a killed run loses no finished
chunk and the same command resumes it exactly, evaluating only the chunks not finished.
Memory stays bounded by a few chunks, whatever the number of points.

What the folder holds at the end (``spec.rows_kept``, the study's ``outputs.rows``):

- ``results.parquet`` (rows ``all``): one row per point (parameters, metrics, ``feasible``,
  ``reason``), a Parquet dataset of one file per chunk, each row encoded once;
- ``sample.parquet`` (rows ``sample``): a uniform random sample of ``outputs.sample`` rows,
  fixed by the seed, in point order;
- ``pareto.csv``: the feasible non-dominated points;
- ``aggregates.csv``: per value of each swept parameter (per bin of a continuous range),
  the points, feasible points and best feasible value of each objective;
- ``sweep.json``: the manifest (the study's fingerprint, the model that wrote it: a run
  another model wrote is not resumed, ``dse.explore.modelstamp``; whether the sweep is
  complete, what it keeps, and its totals: points, feasible points, infeasible points by reason).

The folder is locked for the run (``RunLock``): a second run on it is refused, and a run
deletes only the chunk files it wrote.
"""
from __future__ import annotations

import contextlib
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

from basis.errors import DseError
from basis.files import output_folder, write_text_atomic
from dse.explore import chunkfiles
from dse.explore.executors import run_tasks
from dse.explore.modelstamp import model_stamp
from dse.explore.online import ChunkSummary, OnlineSummary, front_of, pareto_columns, summarize_chunk
from dse.explore.pareto import front_note, unvalued_counts
from dse.explore.runio import (
    Progress,
    ResultsFile,
    RunLock,
    changed_keys,
    changed_study_error,
    check_model,
    write_atomic,
)
from dse.explore.spec import SweepSpec
from dse.system.evaluator import METRICS, evaluate, prepare
from dse.system.hardware import design_codes

#: metrics that are whole numbers of devices or sequences (stored as integers)
COUNTS = ("devices", "batch_used", "tp_used", "pp_used")
#: the layout of a sweep folder this module writes (sweep.json ``layout``): 2, chunk states and a dataset
LAYOUT = 2

__all__ = ["COUNTS", "changed_settings", "check_values", "chunk_task", "evaluate_chunk", "evaluate_columns", "front_of", "run_sweep"]


def _evaluate(spec: SweepSpec, cols: dict):
    """The ``Evaluation`` of the points ``cols`` of ``spec``'s space; a bad value's DseError names the study."""
    return evaluate(cols, ideal=spec.ideal, constraints=spec.constraints, where=f"{spec.where}: space")


def check_values(spec: SweepSpec) -> None:
    """DseError, one line naming the study and the key, when a value of ``spec``'s space is refused by
    the evaluator (an unknown engine, choice or pool hardware: what parsing the space cannot check):
    its probe points (``DesignSpace.probe_chunk``, every listed name once) prepared at once: every name is
    resolved and every check made there, nothing priced (a served study's goodput searches are its run's)."""
    prepare(spec.space.probe_chunk(), constraints=spec.constraints, where=f"{spec.where}: space")


def evaluate_columns(spec: SweepSpec, cols: dict, ids: np.ndarray, id_name: str = "point") -> pd.DataFrame:
    """(rows, evaluation) of the points ``cols`` (named ``ids``): parameters, metrics, feasible and reason."""
    ev = _evaluate(spec, cols)
    data = {id_name: np.asarray(ids, dtype=np.int64), **cols}   # one frame over these arrays, none copied
    for name in METRICS:
        v = ev.metrics[name]
        data[name] = v.astype(np.int32) if name in COUNTS else v.astype(np.float32) if name == "chips_required" else v
    data["feasible"] = ev.feasible
    data["reason"] = ev.reason_labels()
    if "hardware" in data and (designs := design_codes(ev.labels)) is not None:   # beside its preset, what it is
        at = list(data).index("hardware") + 1
        data = dict([*list(data.items())[:at], ("design", np.asarray(designs[1], dtype=object)[designs[0]]),
                     *list(data.items())[at:]])
    return pd.DataFrame(data, copy=False), ev


def evaluate_chunk(spec: SweepSpec, k: int) -> pd.DataFrame:
    """The points of chunk ``k`` with their metrics, feasibility and reason."""
    cols = spec.chunk_columns(k)
    start = k * spec.chunk_size
    n = next((len(v) for v in cols.values() if np.ndim(v) or hasattr(v, "codes")), 1)
    n = min(n, spec.points - start)
    return evaluate_columns(spec, cols, np.arange(start, start + n))[0]


def chunk_task(spec: SweepSpec, k: int, plan: tuple[float | None, bool]) -> ChunkSummary:
    """Evaluate chunk ``k`` and return its summary, with its rows when the sweep keeps every
    row: as Parquet bytes, or as the Arrow table for the caller to encode. ``plan``: (the
    sweep's sample threshold, None for no sample; whether to encode the rows here). Runs
    wherever the chunk runs: this process, a worker process, a Dask worker."""
    threshold, encode = plan
    df = evaluate_chunk(spec, k)
    part = summarize_chunk(spec, df, threshold)
    if spec.rows_kept == "all":
        part.rows = chunkfiles.encode_rows(df) if encode else chunkfiles.rows_table(df)
    return part


def run_sweep(spec: SweepSpec, out: str | Path | None = None, quiet: bool = True, workers: int = 1,
              scheduler: str | None = None) -> tuple[pd.DataFrame | None, pd.DataFrame]:
    """Run a sweep; return (results or None when written to ``out``, Pareto front).

    Without ``out`` every point is returned in memory (for notebooks), evaluated in this
    process. With ``out`` the sweep streams into that folder (see the module's text) and
    resumes there; its chunks run on ``workers`` processes of this machine, or on the Dask
    cluster whose scheduler is at ``scheduler``, with the same results."""
    objectives = spec.objectives
    progress = Progress(spec.points, quiet)
    if out is None:
        if workers != 1 or scheduler is not None:
            raise DseError("workers and scheduler run a sweep into an output folder: give out as well")
        parts = []
        for k in range(spec.chunks):
            df = evaluate_chunk(spec, k)
            parts.append(df)
            progress.update(len(df))
        results = pd.concat(parts, ignore_index=True)
        front = front_of(results, objectives).reset_index(drop=True)
        return results, _noted(front, unvalued(results, objectives), int(results["feasible"].sum()))

    out = output_folder(out)
    with RunLock(out):
        return None, _run_into(spec, out, progress, workers, scheduler)


def _run_into(spec: SweepSpec, out: Path, progress: Progress, workers: int, scheduler: str | None) -> pd.DataFrame:
    """The sweep written into the locked folder ``out``; its Pareto front."""
    chunk_dir, manifest, results = out / "chunks", out / "sweep.json", out / "results.parquet"
    fp = spec.fingerprint()
    if manifest.exists():
        state = _read_manifest(manifest)
        check_model(out, state.get("model"))         # a run another model wrote is not resumed
        if state.get("fingerprint") != fp:
            raise changed_study_error(out, changed_settings(state.get("fingerprint"), fp))
    else:
        state = {"fingerprint": fp, "model": model_stamp(), "complete": False}
        write_text_atomic(manifest, json.dumps(state))
    if state.get("complete"):
        chunkfiles.clean(chunk_dir, spec.chunks)        # left by a run killed as it finished
        return _noted(_stored_front(spec, out), state.get("unvalued", {}), int(state.get("feasible", 0)))
    chunkfiles.recover(out, chunk_dir, results)
    summary = _sweep_chunks(spec, chunk_dir, progress, workers, scheduler)
    if spec.rows_kept == "all":
        chunkfiles.publish(out, chunk_dir, spec.chunks, results)
    if spec.rows_kept == "sample":
        write_atomic(summary.sample_rows(), out / "sample.parquet")
    write_atomic(summary.aggregates(), out / "aggregates.csv", "csv")
    front = (summary.front if summary.front is not None else pd.DataFrame()).reset_index(drop=True)
    write_atomic(front[pareto_columns(front.columns, spec.objectives)] if len(front.columns) else front,
                 out / "pareto.csv", "csv")
    state.update(complete=True, layout=LAYOUT, rows=spec.rows_kept, **summary.totals())
    write_text_atomic(manifest, json.dumps(state))
    chunkfiles.clean(chunk_dir, spec.chunks)
    return _noted(front, state.get("unvalued", {}), summary.feasible)


def unvalued(rows: pd.DataFrame, objectives: dict) -> dict[str, int]:
    """{objective: feasible ``rows`` with no value (NaN) of it}, for the objectives with any."""
    names = list(objectives)
    if not names or not len(rows):
        return {}
    return unvalued_counts(rows[names].to_numpy(dtype=float)[rows["feasible"].to_numpy(bool)], names)


def _noted(front: pd.DataFrame, counts: dict, feasible: int) -> pd.DataFrame:
    """``front`` with ``attrs["front_note"]``: why it is smaller or empty than the ``feasible``
    points would make it, from ``counts`` (``unvalued``; ``pareto.front_note``), or None."""
    front.attrs["front_note"] = front_note(counts, feasible, len(front))
    return front


def _sweep_chunks(spec: SweepSpec, chunk_dir: Path, progress: Progress, workers: int,
                  scheduler: str | None) -> OnlineSummary:
    """Every chunk of the sweep merged into its online summary: the finished ones from their
    state files, the others evaluated (each one's files written as it finishes)."""
    keep_all = spec.rows_kept == "all"
    summary = OnlineSummary(spec, spec.sample if spec.rows_kept == "sample" else 0)
    done = set()
    for k in chunkfiles.finished(chunk_dir, spec.chunks, with_parts=keep_all):
        part = chunkfiles.read_state(chunk_dir, k, spec.chunks)
        if part is None:
            continue                          # unreadable: evaluated again
        summary.add(part)
        done.add(k)
        progress.resume(progress.done + part.points)        # an earlier run's: not in the estimate
    if done:
        progress.update(0, " (resumed)")
    todo = [k for k in range(spec.chunks) if k not in done]
    if todo:
        chunk_dir.mkdir(exist_ok=True)
    # rows evaluated in another process are encoded there; this one's on the writer thread
    results = run_tasks(chunk_task, spec, todo, lambda here: (summary.threshold, not here), workers=workers,
                        scheduler=scheduler)
    with ThreadPoolExecutor(1) as writer, contextlib.closing(results):
        writing = None
        for part in results:
            if writing is not None:
                writing.result()          # one chunk's files in writing at a time (memory), errors raised here
            writing = writer.submit(_write_chunk, chunk_dir, spec.chunks, spec.chunk_size, part)
            summary.add(part)
            progress.update(part.points)
        if writing is not None:
            writing.result()
    return summary


def _write_chunk(chunk_dir: Path, chunks: int, chunk_size: int, part: ChunkSummary) -> None:
    """Write a finished chunk's files: its rows (encoded here if they came as an Arrow table),
    then its state. Runs on a writer thread, so that in a single process the next chunk is
    evaluated while this one is encoded (Parquet encoding releases the GIL; the table is built
    before, by the evaluating thread, which otherwise waits for this one)."""
    k = part.first // chunk_size
    if part.rows is not None:
        data = part.rows if isinstance(part.rows, bytes) else chunkfiles.encode_table(part.rows)
        chunkfiles.write_part(chunk_dir, k, chunks, data)
        part.rows = None
    chunkfiles.write_state(chunk_dir, k, chunks, part)


def _stored_front(spec: SweepSpec, out: Path) -> pd.DataFrame:
    """The Pareto front of a complete sweep in ``out``, as pareto.csv holds it (parameters,
    objectives, point) with ``feasible``; recomputed from results.parquet when pareto.csv is
    gone. DseError when neither can be read."""
    path = out / "pareto.csv"
    try:
        if path.exists():
            try:
                front = pd.read_csv(path)
            except pd.errors.EmptyDataError:            # a sweep without objectives or feasible points
                return pd.DataFrame()
            return front.assign(feasible=True) if len(front.columns) else front
        res = ResultsFile(out / "results.parquet")
        front = front_of(res.columns(pareto_columns(res.names, spec.objectives) + ["feasible"]), spec.objectives)
    except (OSError, ValueError) as e:
        raise DseError(f"{path}: cannot be read ({str(e).splitlines()[0]}); add --overwrite to run the study "
                       f"again") from None
    front = front.reset_index(drop=True)
    write_atomic(front[pareto_columns(front.columns, spec.objectives)], path, "csv")
    return front


def _read_manifest(path: Path) -> dict:
    """The state a sweep keeps in ``sweep.json``; DseError if it is not ours."""
    try:
        state = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        state = None
    if not isinstance(state, dict):
        raise DseError(f"{path}: not a dse sweep manifest; use another --out, or delete that file to start over")
    return state


def changed_settings(old: str | None, new: str) -> list[str]:
    """The study settings (space, seed, method, ...) in which two fingerprints differ."""
    try:
        return changed_keys(json.loads(old), json.loads(new))
    except (TypeError, ValueError, AttributeError):
        return []
