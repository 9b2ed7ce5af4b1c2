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
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from basis.errors import DseError
from dse.system.evaluator import METRICS, evaluate
from dse.explore.pareto import pareto_mask
from dse.explore.space import PARAMS, DesignSpace

METHODS = ("grid", "random", "sobol", "optuna")


@dataclass
class SweepSpec:
    """What to sweep and how.

    objectives: {name: 'min'|'max'} over metrics or parameters.
    constraints: {metric: {'min': x} | {'max': x}} on top of fitting in memory.
    """

    space: DesignSpace
    method: str = "grid"
    samples: int | None = None
    seed: int = 0
    objectives: dict = field(default_factory=dict)
    constraints: dict = field(default_factory=dict)
    chunk_size: int = 250_000
    max_points: int = 10_000_000
    ideal: bool = False
    where: str = "study"
    sampler: str = "nsga2"
    trials: int | None = None
    population: int | None = None

    def __post_init__(self):
        where = self.where
        if self.method not in METHODS:
            raise DseError(f"{where}: method: '{self.method}' is not one of {', '.join(METHODS)}")
        if self.method in ("random", "sobol") and (not isinstance(self.samples, int) or self.samples < 1):
            raise DseError(f"{where}: samples: a {self.method} sweep needs a positive number of samples")
        if self.method == "optuna":
            from dse.explore.search import SAMPLERS
            if self.sampler not in SAMPLERS:
                raise DseError(f"{where}: sampler: '{self.sampler}' is not one of {', '.join(SAMPLERS)}")
            if not isinstance(self.trials, int) or self.trials < 1:
                raise DseError(f"{where}: trials: an optuna study needs a positive number of trials")
            if self.population is not None and (not isinstance(self.population, int) or self.population < 2):
                raise DseError(f"{where}: population: expected an integer >= 2, got {self.population!r}")
            if not self.objectives:
                raise DseError(f"{where}: objectives: an optuna study needs at least one objective")
        names = set(METRICS) | set(PARAMS) | {"feasible"}
        for k, sense in self.objectives.items():
            if k not in names:
                raise DseError(f"{where}: objectives.{k}: unknown metric or parameter; allowed: "
                               f"{', '.join(METRICS)} or a parameter")
            if sense not in ("min", "max"):
                raise DseError(f"{where}: objectives.{k}: expected min or max, got {sense!r}")
        for k, bound in self.constraints.items():
            if k not in METRICS:
                raise DseError(f"{where}: constraints.{k}: unknown metric; allowed: {', '.join(METRICS)}")
            if not isinstance(bound, dict) or not bound or set(bound) - {"min", "max"}:
                raise DseError(f"{where}: constraints.{k}: expected {{min: x}} and/or {{max: x}}, got {bound!r}")
            for s, v in list(bound.items()):
                try:
                    bound[s] = float(v) if not isinstance(v, bool) else None
                except (TypeError, ValueError):
                    bound[s] = None
                if bound[s] is None:
                    raise DseError(f"{where}: constraints.{k}.{s}: expected a number, got {v!r}")
            if "min" in bound and "max" in bound and bound["min"] > bound["max"]:
                raise DseError(f"{where}: constraints.{k}: contradictory, min {bound['min']} > max {bound['max']}")
        if self.points > self.max_points:
            raise DseError(f"{where}: the space has {self.points:,} points, more than max_points "
                           f"{self.max_points:,}; narrow it or raise max_points")

    @property
    def points(self) -> int:
        if self.method == "optuna":
            return int(self.trials)
        return self.space.grid_size if self.method == "grid" else int(self.samples)

    @property
    def chunks(self) -> int:
        return -(-self.points // self.chunk_size)

    def fingerprint(self) -> str:
        return json.dumps({"space": self.space.fingerprint(), "method": self.method, "samples": self.samples,
                           "seed": self.seed, "chunk_size": self.chunk_size, "ideal": self.ideal,
                           "constraints": self.constraints, "sampler": self.sampler,
                           "objectives": self.objectives, "population": self.population}, sort_keys=True)

    def chunk_columns(self, k: int) -> dict[str, np.ndarray]:
        """Parameter columns of chunk ``k`` (deterministic: the same chunk always has the same points)."""
        start = k * self.chunk_size
        stop = min(start + self.chunk_size, self.points)
        if self.method == "grid":
            return self.space.grid_chunk(start, stop)
        d = len(self.space.axes)
        if self.method == "random":
            unit = np.random.default_rng([self.seed, k]).random((stop - start, d))
        else:
            from scipy.stats import qmc
            sob = qmc.Sobol(d, scramble=True, seed=self.seed)
            if start:
                sob.fast_forward(start)
            unit = sob.random(stop - start)
        return self.space.sample_chunk(unit)


def apply_constraints(metrics: dict, constraints: dict) -> None:
    """Mark points violating ``constraints`` infeasible, appending the reason (in place)."""
    feas, reason = metrics["feasible"], metrics["reason"]
    for k, bound in constraints.items():
        v = metrics[k]
        for sense, limit in bound.items():
            with np.errstate(invalid="ignore"):
                bad = ~(v >= limit) if sense == "min" else ~(v <= limit)
            op = "<" if sense == "min" else ">"
            msg = np.array([f"{k} {x:.4g} {op} {limit:g}" if np.isfinite(x) else f"{k} unknown" for x in v[bad]],
                           dtype=object)
            reason[bad] = np.where(reason[bad] == "", msg, reason[bad] + "; " + msg)
            feas &= ~bad


def evaluate_chunk(spec: SweepSpec, k: int) -> pd.DataFrame:
    """The points of chunk ``k`` with their metrics, feasibility and reason."""
    cols = spec.chunk_columns(k)
    metrics = evaluate(cols, ideal=spec.ideal)
    apply_constraints(metrics, spec.constraints)
    start = k * spec.chunk_size
    df = pd.DataFrame({"point": np.arange(start, start + len(metrics["feasible"]), dtype=np.int64)})
    for name, v in cols.items():
        df[name] = v
    for name in (*METRICS, "feasible"):
        df[name] = metrics[name]
    df["reason"] = metrics["reason"].astype(str)
    return df


def _front(df: pd.DataFrame, objectives: dict) -> pd.DataFrame:
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


def _write_atomic(df: pd.DataFrame, path: Path, kind: str = "parquet") -> None:
    tmp = path.with_name(path.name + ".tmp")
    if kind == "parquet":
        df.to_parquet(tmp, index=False)
    else:
        df.to_csv(tmp, index=False)
    os.replace(tmp, path)


class _Progress:
    """A progress line on stderr: rewritten in place on a terminal, else one line per
    tenth of the work."""

    def __init__(self, total: int, quiet: bool, what: str = "sweep", unit: str = "points"):
        self.total, self.quiet, self.t0, self.done = total, quiet, time.perf_counter(), 0
        self.what, self.unit, self._shown = what, unit, -1

    def update(self, n: int, note: str = ""):
        self.done += n
        if self.quiet:
            return
        tty = sys.stderr.isatty()
        tenth = 10 * self.done // max(self.total, 1)
        if not tty and tenth == self._shown and self.done < self.total:
            return
        self._shown = tenth
        dt = time.perf_counter() - self.t0
        end = "\n" if self.done >= self.total or not tty else ""
        print(f"\r[{self.what}] {self.done:,}/{self.total:,} {self.unit} ({100 * self.done / self.total:.0f}%) "
              f"{dt:.1f} s{note}", end=end, file=sys.stderr, flush=True)


def run_sweep(spec: SweepSpec, out: str | Path | None = None, quiet: bool = True) -> tuple[pd.DataFrame | None, pd.DataFrame]:
    """Run a sweep; return (results or None when written to ``out``, Pareto front).

    Without ``out`` every point is returned in memory (for notebooks). With ``out``
    chunks are written as they finish, a rerun resumes, and the results land in
    ``out/results.parquet`` and ``out/pareto.csv``."""
    objectives = spec.objectives
    progress = _Progress(spec.points, quiet)
    if out is None:
        parts = []
        for k in range(spec.chunks):
            df = evaluate_chunk(spec, k)
            parts.append(df)
            progress.update(len(df))
        results = pd.concat(parts, ignore_index=True)
        return results, _front(results, objectives).reset_index(drop=True)

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
                _write_atomic(df, path)
                note = ""
            cands.append(_front(df, objectives))
            if sum(map(len, cands)) > 4 * spec.chunk_size:     # keep memory bounded
                cands = [_front(pd.concat(cands, ignore_index=True), objectives)]
            progress.update(len(df), note)
        front = _front(pd.concat(cands, ignore_index=True), objectives) if cands else None
        _merge(chunk_dir, spec.chunks, final)
        state["complete"] = True
        tmp = manifest.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, manifest)
        shutil.rmtree(chunk_dir, ignore_errors=True)
    else:
        front = _front(pd.read_parquet(final), objectives)
    front = (front if front is not None else pd.DataFrame()).reset_index(drop=True)
    cols = [c for c in front.columns if c in PARAMS or c in objectives or c == "point"]
    _write_atomic(front[cols] if len(front.columns) else front, out / "pareto.csv", "csv")
    return None, front


def run_study(spec: SweepSpec, out: str | Path, storage: str | None = None, workers: int = 1,
              quiet: bool = True) -> pd.DataFrame:
    """Run a sweep or an Optuna search into ``out`` (resuming), write ``pareto.csv``,
    and return the Pareto front."""
    out = Path(out)
    if spec.method != "optuna":
        if storage is not None or workers != 1:
            raise DseError("--storage and --workers apply to optuna studies (method: optuna)")
        return run_sweep(spec, out, quiet=quiet)[1]
    from dse.explore.search import run_search
    rows = run_search(spec, out, storage, workers, quiet)
    front = _front(rows, spec.objectives).reset_index(drop=True) if len(rows) else rows
    cols = [c for c in front.columns if c in PARAMS or c in spec.objectives or c == "trial"]
    _write_atomic(front[cols], out / "pareto.csv", "csv")
    return front


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
