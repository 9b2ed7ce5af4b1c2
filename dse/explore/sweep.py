"""Sweeps over a design space: grid, random or Sobol, evaluated in chunks.

Each chunk of points is evaluated by the vectorized kernel and, with an output
folder, written atomically to ``chunks/part-NNNNNN.parquet`` as it finishes, so an
interrupted sweep run again skips the chunks already on disk. When all chunks are
there they are merged into ``results.parquet`` (one row per point: parameters,
metrics, ``feasible`` and ``reason``) and the feasible non-dominated points go to
``pareto.csv``. Memory stays bounded by the chunk size: the Pareto front is kept
incrementally and the merge streams chunk by chunk.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd

from basis.errors import DseError
from dse.explore.pareto import pareto_mask
from dse.explore.runio import Progress, write_atomic
from dse.explore.space import PARAMS
from dse.explore.spec import SweepSpec
from dse.system.evaluator import METRICS, evaluate


#: metrics that are whole numbers of devices or sequences (stored as integers)
COUNTS = ("devices", "batch_used", "tp_used", "pp_used")


def evaluate_columns(spec: SweepSpec, cols: dict, ids: np.ndarray, id_name: str = "point") -> pd.DataFrame:
    """Rows of the points ``cols`` (named ``ids``): parameters, metrics, feasible and reason."""
    ev = evaluate(cols, ideal=spec.ideal, constraints=spec.constraints)
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

    out = Path(out)
    chunk_dir = out / "chunks"
    manifest = out / "sweep.json"
    final = out / "results.parquet"
    out.mkdir(parents=True, exist_ok=True)
    fp = spec.fingerprint()
    if manifest.exists():
        old = json.loads(manifest.read_text())
        if old.get("fingerprint") != fp:
            raise DseError(f"{out}: holds the results of a different study or space; use another --out folder")
    else:
        tmp = manifest.with_suffix(".tmp")
        tmp.write_text(json.dumps({"fingerprint": fp, "complete": False}))
        os.replace(tmp, manifest)
    state = json.loads(manifest.read_text())
    front = None
    if not state.get("complete"):
        chunk_dir.mkdir(exist_ok=True)
        cands = []
        for k in range(spec.chunks):
            path = chunk_dir / f"part-{k:06d}.parquet"
            if path.exists():
                df = pd.read_parquet(path)
                note = " (resumed)"
            else:
                df = evaluate_chunk(spec, k)
                write_atomic(df, path)
                note = ""
            cands.append(front_of(df, objectives))
            if sum(map(len, cands)) > 4 * spec.chunk_size:     # keep memory bounded
                cands = [front_of(pd.concat(cands, ignore_index=True), objectives)]
            progress.update(len(df), note)
        front = front_of(pd.concat(cands, ignore_index=True), objectives) if cands else None
        _merge(chunk_dir, spec.chunks, final)
        state["complete"] = True
        tmp = manifest.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, manifest)
        shutil.rmtree(chunk_dir, ignore_errors=True)
    else:
        front = front_of(pd.read_parquet(final), objectives)
    front = (front if front is not None else pd.DataFrame()).reset_index(drop=True)
    cols = [c for c in front.columns if c in PARAMS or c in objectives or c == "point"]
    write_atomic(front[cols] if len(front.columns) else front, out / "pareto.csv", "csv")
    return None, front


def _merge(chunk_dir: Path, chunks: int, final: Path) -> None:
    """Stream the chunk files into one Parquet file, atomically."""
    import pyarrow.parquet as pq
    tmp = final.with_name(final.name + ".tmp")
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
    os.replace(tmp, final)
