"""Sweeps over a design space: grid, random or Sobol, evaluated in chunks.

Each chunk of points is evaluated by the vectorized kernel and, with an output
folder, written atomically to ``chunks/part-NNNNNN.parquet`` as it finishes, so an
interrupted sweep run again skips the chunks already on disk. When all chunks are
there they are merged into ``results.parquet`` (one row per point: parameters,
metrics, ``feasible`` and ``reason``) and the feasible non-dominated points go to
``pareto.csv``. Memory stays bounded by the chunk size: the Pareto front is kept
incrementally and the merge streams chunk by chunk. The folder is locked for the run (``RunLock``): a second
run on it is refused, and a run deletes only the chunk files it wrote.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from basis.errors import DseError
from basis.files import atomic_write, output_folder, write_text_atomic
from dse.explore.pareto import pareto_mask
from dse.explore.runio import Progress, RunLock, changed_keys, changed_study_error, write_atomic
from dse.explore.space import PARAMS
from dse.explore.spec import SweepSpec
from dse.system.evaluator import METRICS, evaluate

#: metrics that are whole numbers of devices or sequences (stored as integers)
COUNTS = ("devices", "batch_used", "tp_used", "pp_used")


def evaluate_columns(spec: SweepSpec, cols: dict, ids: np.ndarray, id_name: str = "point") -> pd.DataFrame:
    """Rows of the points ``cols`` (named ``ids``): parameters, metrics, feasible and reason."""
    ev = evaluate(cols, ideal=spec.ideal, constraints=spec.constraints, where=f"{spec.where}: space")
    df = pd.DataFrame({id_name: np.asarray(ids, dtype=np.int64)})
    for name, v in cols.items():
        df[name] = v
    for name in METRICS:
        v = ev.metrics[name]
        df[name] = v.astype(np.int32) if name in COUNTS else v.astype(np.float32) if name == "chips_required" else v
    df["feasible"] = ev.feasible
    df["reason"] = ev.reason_labels()
    return df, ev


def evaluate_chunk(spec: SweepSpec, k: int) -> pd.DataFrame:
    """The points of chunk ``k`` with their metrics, feasibility and reason."""
    cols = spec.chunk_columns(k)
    start = k * spec.chunk_size
    n = next((len(v) for v in cols.values() if np.ndim(v) or hasattr(v, "codes")), 1)
    n = min(n, spec.points - start)
    return evaluate_columns(spec, cols, np.arange(start, start + n))[0]


def front_of(df: pd.DataFrame, objectives: dict) -> pd.DataFrame:
    """The feasible non-dominated rows of ``df``.

    With three or more objectives, rows first compete within groups that tie on all
    objectives but one (e.g. designs differing only in batch): a row worse than another
    of its group in the remaining objective is dominated, so the exact front is unchanged
    while the N-objective sort sees far fewer rows."""
    feas = df[df["feasible"]]
    if not objectives or feas.empty:
        return feas.iloc[:0]
    names = list(objectives)
    if len(names) >= 3:
        for j, name in enumerate(names):
            others = names[:j] + names[j + 1:]
            best = feas.groupby(others, sort=False, observed=True)[name].transform(
                "max" if objectives[name] == "max" else "min")
            feas = feas[(feas[name] == best) | feas[name].isna()]
    vals = feas[names].to_numpy(dtype=float)
    front = feas[pareto_mask(vals, list(objectives.values()))]
    params = [c for c in front.columns if c in PARAMS]
    return front.drop_duplicates(subset=params) if params else front   # a design sampled twice is listed once


def run_sweep(spec: SweepSpec, out: str | Path | None = None, quiet: bool = True) -> tuple[pd.DataFrame | None, pd.DataFrame]:
    """Run a sweep; return (results or None when written to ``out``, Pareto front).

    Without ``out`` every point is returned in memory (for notebooks). With ``out``
    chunks are written as they finish, a rerun resumes, and the results land in
    ``out/results.parquet`` and ``out/pareto.csv``."""
    objectives = spec.objectives
    progress = Progress(spec.points, quiet)
    if out is None:
        parts = []
        for k in range(spec.chunks):
            df = evaluate_chunk(spec, k)
            parts.append(df)
            progress.update(len(df))
        results = pd.concat(parts, ignore_index=True)
        return results, front_of(results, objectives).reset_index(drop=True)

    out = output_folder(out)
    with RunLock(out):
        return None, _run_into(spec, out, progress)


def _run_into(spec: SweepSpec, out: Path, progress: Progress) -> pd.DataFrame:
    """The sweep written into the locked folder ``out``; its Pareto front."""
    objectives = spec.objectives
    chunk_dir = out / "chunks"
    manifest = out / "sweep.json"
    final = out / "results.parquet"
    fp = spec.fingerprint()
    if manifest.exists():
        state = _read_manifest(manifest)
        if state.get("fingerprint") != fp:
            raise changed_study_error(out, changed_settings(state.get("fingerprint"), fp))
    else:
        state = {"fingerprint": fp, "complete": False}
        write_text_atomic(manifest, json.dumps(state))
    front = None
    if not state.get("complete"):
        chunk_dir.mkdir(exist_ok=True)
        cands = []
        for k in range(spec.chunks):
            path = chunk_dir / f"part-{k:06d}.parquet"
            df = _read_chunk(path)
            if df is not None:
                progress.resume(progress.done + len(df))        # an earlier run's: not in the estimate
                progress.update(0, " (resumed)")
            else:
                df = evaluate_chunk(spec, k)
                write_atomic(df, path)
                progress.update(len(df))
            cands.append(front_of(df, objectives))
            if sum(map(len, cands)) > 4 * spec.chunk_size:     # keep memory bounded
                cands = [front_of(pd.concat(cands, ignore_index=True), objectives)]
        front = front_of(pd.concat(cands, ignore_index=True), objectives) if cands else None
        _merge(chunk_dir, spec.chunks, final)
        state["complete"] = True
        write_text_atomic(manifest, json.dumps(state))
        _remove_chunks(chunk_dir, spec.chunks)
    else:
        try:
            front = front_of(pd.read_parquet(final), objectives)
        except (OSError, ValueError) as e:
            raise DseError(f"{final}: cannot be read ({str(e).splitlines()[0]}); delete {out} to run the study "
                           f"again") from None
    front = (front if front is not None else pd.DataFrame()).reset_index(drop=True)
    cols = [c for c in front.columns if c in PARAMS or c in objectives or c == "point"]
    write_atomic(front[cols] if len(front.columns) else front, out / "pareto.csv", "csv")
    return front


def _read_chunk(path: Path) -> pd.DataFrame | None:
    """A chunk an earlier run wrote, or None when there is none (or it cannot be read: then
    it is computed again)."""
    if not path.exists():
        return None
    try:
        return pd.read_parquet(path)
    except (OSError, ValueError):
        return None


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


def _remove_chunks(chunk_dir: Path, chunks: int) -> None:
    """Delete the chunk files this sweep wrote (and the folder if nothing else is in it)."""
    for k in range(chunks):
        (chunk_dir / f"part-{k:06d}.parquet").unlink(missing_ok=True)
    try:
        chunk_dir.rmdir()
    except OSError:
        pass


def _merge(chunk_dir: Path, chunks: int, final: Path) -> None:
    """Stream the chunk files into one Parquet file, atomically."""
    import pyarrow.parquet as pq

    def write(tmp: Path) -> None:
        writer = None
        try:
            for k in range(chunks):
                table = pq.read_table(chunk_dir / f"part-{k:06d}.parquet")
                if writer is None:
                    writer = pq.ParquetWriter(tmp, table.schema)
                writer.write_table(table.cast(writer.schema))
        finally:
            if writer is not None:
                writer.close()

    atomic_write(final, write)
