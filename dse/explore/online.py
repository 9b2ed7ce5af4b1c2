"""What a sweep keeps online, chunk by chunk, in memory bounded by a chunk: the Pareto
front, per-parameter aggregates and a uniform random sample of rows.

- Pareto front: the feasible non-dominated rows (``front_of``), merged chunk by chunk,
  kept in memory as their point, parameters, objectives and key metrics (``front_columns``).
- Aggregates: for each swept parameter and each of its values (a continuous range of a
  random or Sobol sweep: each of ``BINS`` bins), the points, the feasible points and the
  best feasible value of every objective.
- Sample: every point gets a key in [0, 1) from a hash of (seed, point id) (``sample_keys``);
  the sample is the ``n`` points of smallest key (ties: the smaller id). That is a uniform
  sample without replacement, fixed by the seed, whatever the chunking or the order in
  which chunks finish (a reservoir whose members the keys decide). A chunk only sends the
  points whose key is at most the running ``n``-th key (``OnlineSummary.threshold``), a
  bound that only falls.

A chunk's part (``ChunkSummary``) is computed where the chunk is evaluated, on any
process or machine; ``OnlineSummary`` merges them. Every merge is exact and independent
of the order: sums, minima and maxima, a front, the smallest keys.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa

from dse.explore.pareto import pareto_mask, unvalued_counts
from dse.explore.space import PARAMS

#: a continuous range of a random or Sobol sweep is aggregated over this many bins (equal,
#: or equal in log space for a log range)
BINS = 32
#: the column of a sample row holding its key
SAMPLE_KEY = "sample_key"
#: metrics kept of every Pareto design besides the objectives (pareto.csv): what a report's
#: Pareto table, its cost plot and a reader want of a design when the rows are not kept
FRONT_METRICS = ("output_tokens_per_s", "tpot_s", "ttft_s", "e2e_latency_s", "memory_bytes", "power_w", "cost_usd")


def front_of(df: pd.DataFrame, objectives: dict, columns: list[str] | None = None) -> pd.DataFrame:
    """The feasible non-dominated rows of ``df`` (a design sampled twice listed once), with
    ``columns`` of them (default all; they must hold the parameters).

    Only the objective columns are compared; the rows are taken once, at the end. With four
    or more objectives (where ``pareto_mask`` compares blocks of rows with the front, not a
    sort), rows first compete within groups that tie on all objectives but one (e.g. designs
    differing only in batch): a row worse than another of its group in the remaining
    objective is dominated, so the exact front is unchanged while the N-objective comparison
    sees far fewer rows. (With three, the sort is faster than the grouping.)"""
    rows = np.flatnonzero(df["feasible"].to_numpy(bool))
    if not objectives or not len(rows):
        return df.iloc[:0]
    names = list(objectives)
    vals = df[names].iloc[rows].reset_index(drop=True)
    if len(names) >= 4:
        for j, name in enumerate(names):
            others = names[:j] + names[j + 1:]
            best = vals.groupby(others, sort=False, observed=True)[name].transform(
                "max" if objectives[name] == "max" else "min")
            keep = ((vals[name] == best) | vals[name].isna()).to_numpy()
            rows, vals = rows[keep], vals[keep].reset_index(drop=True)
    rows = rows[pareto_mask(vals.to_numpy(dtype=float), list(objectives.values()))]
    front = df.iloc[rows] if columns is None else df.iloc[rows, df.columns.get_indexer(columns)]
    params = [c for c in front.columns if c in PARAMS]
    return front.drop_duplicates(subset=params) if params else front


def sample_keys(seed: int, points: np.ndarray) -> np.ndarray:
    """The sample key in [0, 1) of each point id (splitmix64 of the seed and the id): a
    float64 array, uniform and independent across points."""
    with np.errstate(over="ignore"):
        z = np.asarray(points, dtype=np.uint64) + np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15)
        z = z + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


@dataclass(frozen=True, eq=False)
class Cells:
    """The aggregate cells of one swept parameter: one per value (``values``), or one per
    bin between consecutive ``edges`` (a continuous range). A grid's axis has a ``stride``:
    the points from one of its values to the next (the product of the later axes' sizes), so
    that a point's cell follows from its id (the grid's mixed-radix order, ``grid_chunk``)."""

    name: str
    values: tuple = ()
    edges: np.ndarray | None = None
    stride: int | None = None

    @property
    def size(self) -> int:
        return len(self.values) if self.edges is None else len(self.edges) - 1

    def index(self, column: pd.Series, points: np.ndarray) -> np.ndarray:
        """The cell of each row of the parameter's ``column``, whose point ids are ``points``
        (int64; -1 for a value not listed)."""
        if self.stride is not None:                               # a grid: from the id, no lookup
            return (points // self.stride) % self.size
        if self.edges is not None:
            x = column.to_numpy(dtype=float)
            return np.clip(np.searchsorted(self.edges, x, side="right") - 1, 0, self.size - 1)
        if isinstance(column.dtype, pd.CategoricalDtype):        # names: categories in the axis' order
            return column.cat.codes.to_numpy(np.int64)
        return pd.Index(self.values).get_indexer(column.to_numpy())

    def labels(self) -> dict[str, np.ndarray]:
        """Columns naming each cell: ``value`` (a value; empty for a bin), ``low`` and ``high``
        (a bin's edges; empty for a value)."""
        if self.edges is None:
            nan = np.full(self.size, np.nan)
            return {"value": np.array(self.values, dtype=object), "low": nan, "high": nan}
        return {"value": np.full(self.size, None, dtype=object), "low": self.edges[:-1], "high": self.edges[1:]}


def swept_cells(spec) -> list[Cells]:
    """The aggregate cells of each parameter the sweep ``spec`` varies, in the space's order."""
    out = []
    grid = spec.method == "grid"
    later = [math.prod(len(b.values) for b in spec.space.axes[j + 1:]) if grid else None
             for j in range(len(spec.space.axes))]
    for a, stride in zip(spec.space.axes, later):
        if not grid and a.is_range:                      # drawn continuously: bins
            if a.low == a.high:
                continue
            edges = (np.geomspace(a.low, a.high, BINS + 1) if a.log else np.linspace(a.low, a.high, BINS + 1))
            out.append(Cells(a.name, edges=edges))
        elif len(a.values) > 1:
            out.append(Cells(a.name, values=a.values, stride=stride))
    return out


def scored(df: pd.DataFrame, feasible: np.ndarray, objectives: dict) -> dict:
    """{objective: (sense, [n] bool: the rows whose value counts for a best, those values)}: the
    feasible rows of ``df`` with a finite value of each objective."""
    out = {}
    for name, sense in objectives.items():
        v = df[name].to_numpy(dtype=float)
        m = feasible & np.isfinite(v)
        out[name] = (sense, m, v[m])
    return out


def cell_stats(cells: Cells, df: pd.DataFrame, feasible: np.ndarray, points: np.ndarray, scores: dict) -> dict:
    """The aggregates of the rows ``df`` (point ids ``points``) over ``cells``, for the cells
    they touch: {'cell': cell numbers, 'points', 'feasible': counts, 'best': {objective: best
    feasible finite value (NaN if none)}}; ``scores``: ``scored(df, feasible, objectives)``."""
    idx = cells.index(df[cells.name], points)
    if 0 <= idx.min(initial=0) and cells.size <= 4 * len(idx) + 1024:      # few cells: count into all of them
        cell = np.flatnonzero(np.bincount(idx, minlength=cells.size))
        dense = np.full(cells.size, -1, dtype=np.int64)
        dense[cell] = np.arange(len(cell))
        inv = dense[idx]
    else:
        cell, inv = np.unique(idx, return_inverse=True)
    out = {"cell": cell, "points": np.bincount(inv, minlength=len(cell)),
           "feasible": np.bincount(inv[feasible], minlength=len(cell)), "best": {}}
    for name, (sense, m, v) in scores.items():
        best = np.full(len(cell), np.nan)
        (np.fmax if sense == "max" else np.fmin).at(best, inv[m], v)
        out["best"][name] = best
    return out


@dataclass
class ChunkSummary:
    """What one chunk adds to a sweep's online summaries (and, when the sweep keeps every
    row, the chunk's rows: Parquet bytes, or the Arrow table for the process writing them to
    encode, ``dse.explore.chunkfiles.rows_table``)."""

    first: int                  # the chunk's first point id
    points: int
    feasible: int
    reasons: dict               # reason key -> infeasible points
    cells: dict                 # parameter -> cell_stats
    front: pd.DataFrame         # the chunk's Pareto front (``front_columns``)
    sample: pd.DataFrame | None = None     # its rows that may enter the sample, with SAMPLE_KEY
    unvalued: dict = field(default_factory=dict)   # objective -> feasible points with no value (NaN) of it
    rows: bytes | pa.Table | None = field(default=None, repr=False)   # Parquet bytes, or the rows to encode


def _plain(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with ``reason`` as plain text, so rows of chunks with different reasons concatenate
    and store with the same types."""
    return df.astype({"reason": "str"}) if "reason" in df else df


def pareto_columns(columns, objectives, id_name: str = "point") -> list[str]:
    """The columns of pareto.csv among ``columns`` (in their order): the id (``point`` of a
    sweep, ``trial`` of a search), the parameters, the design's name (``design``, where some point's
    chip differs from its preset: ``dse.system.hardware``), the objectives and ``FRONT_METRICS``."""
    keep = {id_name, *PARAMS, "design", *objectives, *FRONT_METRICS}
    return [c for c in columns if c in keep]


def front_columns(columns, objectives: dict) -> list[str]:
    """The columns among ``columns`` a sweep keeps of its Pareto rows: pareto.csv's
    (``pareto_columns``) and ``feasible`` (a large front stays small in memory)."""
    return pareto_columns(columns, objectives) + (["feasible"] if "feasible" in columns else [])


def summarize_chunk(spec, df: pd.DataFrame, threshold: float | None) -> ChunkSummary:
    """The summary of the evaluated rows ``df`` of one chunk of the sweep ``spec``: counts,
    aggregates, Pareto front, and (``threshold`` not None) the rows whose sample key is at
    most ``threshold``, at most ``spec.sample`` of them."""
    feasible = df["feasible"].to_numpy(bool)
    reasons = df["reason"].value_counts()          # a Categorical: the infeasible rows, by reason
    points = df["point"].to_numpy(np.int64)
    scores = scored(df, feasible, spec.objectives)
    sample = None
    if threshold is not None:
        keys = sample_keys(spec.seed, points)
        pick = np.flatnonzero(keys <= threshold)
        pick = pick[np.lexsort((points[pick], keys[pick]))[:spec.sample]]
        sample = _plain(df.iloc[pick]).assign(**{SAMPLE_KEY: keys[pick]}).reset_index(drop=True)
    return ChunkSummary(first=int(points[0]) if len(points) else 0, points=len(df), feasible=int(feasible.sum()),
                        reasons={str(k): int(v) for k, v in reasons.items() if v},
                        cells={c.name: cell_stats(c, df, feasible, points, scores) for c in swept_cells(spec)},
                        front=front_of(df, spec.objectives, front_columns(df.columns, spec.objectives)
                                       ).reset_index(drop=True),
                        sample=sample,
                        unvalued=unvalued_counts(df[list(spec.objectives)].to_numpy(dtype=float)[feasible],
                                                 list(spec.objectives)))


def _gather(frames: list[pd.DataFrame], keep: np.ndarray) -> pd.DataFrame:
    """The rows of ``frames`` (tables of the same columns) that ``keep`` marks (one flag per
    row of them all, in order), as one table; only the tables with a row kept are joined."""
    parts = np.split(keep, np.cumsum([len(f) for f in frames])[:-1])
    kept = [f[m] for f, m in zip(frames, parts) if m.any()]
    return pd.concat(kept, ignore_index=True) if kept else frames[0].iloc[:0]


class OnlineSummary:
    """A sweep's summaries so far: counts, aggregates, Pareto front and sample, merged from
    ChunkSummary parts in any order. Fronts and samples of chunks wait in a list and are
    merged when they hold as many rows as the merged ones (or a chunk's worth): every row
    is merged a few times, not once per chunk, so a large front costs no quadratic time."""

    def __init__(self, spec, sample: int = 0):
        self.objectives = dict(spec.objectives)
        self.size = sample
        self.batch = spec.chunk_size
        self.points = self.feasible = 0
        self.reasons: dict[str, int] = {}
        self.unvalued: dict[str, int] = {}      # objective -> feasible points with no value (NaN) of it
        self.cells = swept_cells(spec)
        self.stats = {c.name: {"points": np.zeros(c.size, np.int64), "feasible": np.zeros(c.size, np.int64),
                               "best": {o: np.full(c.size, np.nan) for o in self.objectives}} for c in self.cells}
        self._front: pd.DataFrame | None = None
        self._sample: pd.DataFrame | None = None
        self._fronts: list[pd.DataFrame] = []
        self._samples: list[pd.DataFrame] = []

    def _merge_fronts(self) -> None:
        """Merge the waiting chunk fronts into the front: the non-dominated rows of them all
        (a design sampled twice stays twice until ``front``). The rows are compared on their
        objective values alone, and only those kept are gathered into one table: joining every
        waiting front first (hundreds of tables, most of whose rows are then dropped) took a
        second at a time in a 64-million-point sweep, while its worker processes waited."""
        if self._fronts:
            frames = ([self._front] if self._front is not None else []) + self._fronts
            names = list(self.objectives)
            values = np.concatenate([np.column_stack([f[n].to_numpy(dtype=float) for n in names]) for f in frames])
            if len(names) >= 4:                               # front_of's grouping pays off
                on_front = np.zeros(len(values), dtype=bool)
                by_position = {j: self.objectives[n] for j, n in enumerate(names)}    # no parameter names
                on_front[front_of(pd.DataFrame(values).assign(feasible=True), by_position).index] = True
            else:
                on_front = pareto_mask(values, list(self.objectives.values()))
            self._front = _gather(frames, on_front)
            self._fronts = []

    @property
    def front(self) -> pd.DataFrame | None:
        """The Pareto front of the points merged so far, in point order, a design sampled twice
        listed once (None before any chunk)."""
        self._merge_fronts()
        if self._front is not None:
            front = self._front.sort_values("point", kind="stable")
            params = [c for c in front.columns if c in PARAMS]
            self._front = (front.drop_duplicates(subset=params) if params else front).reset_index(drop=True)
        return self._front

    @property
    def sample(self) -> pd.DataFrame | None:
        """The sample of the points merged so far, by key (None before any sample row)."""
        if self._samples:
            frames = ([self._sample] if self._sample is not None else []) + self._samples
            order = np.lexsort((np.concatenate([f["point"].to_numpy(np.int64) for f in frames]),
                                np.concatenate([f[SAMPLE_KEY].to_numpy(float) for f in frames])))[:self.size]
            keep = np.zeros(sum(map(len, frames)), dtype=bool)
            keep[order] = True
            rows = _gather(frames, keep)       # the rows kept, gathered once (see _merge_fronts), in frame order
            self._sample = rows.iloc[np.searchsorted(np.flatnonzero(keep), order)].reset_index(drop=True)
            self._samples = []
        return self._sample

    @property
    def threshold(self) -> float | None:
        """A sample key no point of the final sample exceeds (the largest key of the sample
        merged so far once it is full; infinity before; None: no sample kept)."""
        if not self.size:
            return None
        if self._sample is None or len(self._sample) < self.size:
            return float("inf")
        return float(self._sample[SAMPLE_KEY].iat[-1])

    def add(self, part: ChunkSummary) -> None:
        """Merge one chunk's summary."""
        self.points += part.points
        self.feasible += part.feasible
        for k, n in part.reasons.items():
            self.reasons[k] = self.reasons.get(k, 0) + n
        for k, n in part.unvalued.items():
            self.unvalued[k] = self.unvalued.get(k, 0) + n
        for name, st in part.cells.items():
            acc, ok = self.stats[name], st["cell"] >= 0
            cell = st["cell"][ok]
            acc["points"][cell] += st["points"][ok]
            acc["feasible"][cell] += st["feasible"][ok]
            for o, best in st["best"].items():
                merge = np.fmax if self.objectives[o] == "max" else np.fmin
                acc["best"][o][cell] = merge(acc["best"][o][cell], best[ok])
        if len(part.front):
            self._fronts.append(part.front)
            if sum(map(len, self._fronts)) >= max(self.batch, len(self._front) if self._front is not None else 0):
                self._merge_fronts()
        elif self._front is None and not self._fronts:
            self._front = part.front                     # no row yet: its columns
        if self.size and part.sample is not None and len(part.sample):
            self._samples.append(part.sample)
            if sum(map(len, self._samples)) >= self.size:
                _ = self.sample

    def sample_rows(self) -> pd.DataFrame:
        """The sample, in point order, without its keys (empty when none is kept)."""
        sample = self.sample
        if sample is None:
            return pd.DataFrame()
        return sample.sort_values("point").drop(columns=[SAMPLE_KEY]).reset_index(drop=True)

    def aggregates(self) -> pd.DataFrame:
        """One row per cell of each swept parameter: ``parameter``, ``value`` (or a bin's ``low``
        and ``high``), ``points``, ``feasible`` and ``best_<objective>`` (the best feasible
        value; empty where no point is feasible)."""
        parts = []
        for c in self.cells:
            st = self.stats[c.name]
            cols = {"parameter": np.full(c.size, c.name, dtype=object), **c.labels(),
                    "points": st["points"], "feasible": st["feasible"]}
            cols.update({f"best_{o}": st["best"][o] for o in self.objectives})
            parts.append(pd.DataFrame(cols))
        columns = ["parameter", "value", "low", "high", "points", "feasible", *(f"best_{o}" for o in self.objectives)]
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=columns)

    def totals(self) -> dict:
        """{'points', 'feasible', 'reasons': {reason key: infeasible points}}, the most frequent reason
        first, and where some feasible points have no value (NaN) of an objective, 'unvalued':
        {objective: those points}, in the objectives' order."""
        reasons = dict(sorted(self.reasons.items(), key=lambda kv: (-kv[1], kv[0])))
        unvalued = {o: self.unvalued[o] for o in self.objectives if self.unvalued.get(o)}
        return {"points": self.points, "feasible": self.feasible, "reasons": reasons,
                **({"unvalued": unvalued} if unvalued else {})}
