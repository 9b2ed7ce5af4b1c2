"""Pareto fronts, non-dominated ranks and hypervolume of objective arrays.

Every function takes ``values`` as a float array ``[points, objectives]`` and
``senses``, one ``'min'`` or ``'max'`` per objective. Internally everything is
turned into minimization (:func:`normalize`). A point *dominates* another when it
is no worse in every objective and strictly better in at least one, so exact
duplicates do not dominate each other. A row holding a NaN is never on a front
and never dominates anything.

Costs: :func:`pareto_mask` is O(N log N) for one, two and three objectives
(a sort, and for three a sweep with a staircase); for four or more it compares
blocks of candidates against the front found so far, O(N * front size).
:func:`hypervolume` is exact and O(N log N) for two and three objectives.
"""
from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable

import numpy as np

from basis.errors import DseError

_SIGN = {"min": 1.0, "max": -1.0}


def _values_2d(values) -> np.ndarray:
    """``values`` as a float array [N, M] with M >= 1, else DseError."""
    v = np.asarray(values, dtype=float)
    if v.ndim != 2:
        raise DseError(f"objective values must be a 2-D array [points, objectives], got shape {v.shape}")
    if v.shape[1] < 1:
        raise DseError("objective values need at least one objective (column)")
    return v


def _signs(senses, m: int) -> np.ndarray:
    """+1 for each 'min' and -1 for each 'max' sense, checking there are ``m`` of them."""
    if isinstance(senses, str) or not isinstance(senses, Iterable):
        raise DseError(f"senses must be a sequence of 'min'/'max', one per objective, got {senses!r}")
    senses = list(senses)
    if len(senses) != m:
        raise DseError(f"{len(senses)} senses given for {m} objectives")
    bad = [s for s in senses if s not in _SIGN]
    if bad:
        raise DseError(f"objective sense must be 'min' or 'max', got {bad[0]!r}")
    return np.array([_SIGN[s] for s in senses])


def normalize(values, senses) -> np.ndarray:
    """Return a new float array [N, M] in which every objective is to be minimized.

    Columns whose sense is ``'max'`` are negated; ``'min'`` columns are copied.
    Raises DseError when ``values`` is not 2-D, when the number of senses differs
    from the number of columns, or when a sense is not ``'min'``/``'max'``.
    """
    v = _values_2d(values)
    return v * _signs(senses, v.shape[1])


# ---------------------------------------------------------------- points with no value

def unvalued_counts(values, names) -> dict[str, int]:
    """{objective name: how many rows of ``values`` (float [points, objectives], columns in
    the order of ``names``) have no value (NaN) of it}, for the objectives with any such row.
    Such rows are on no front (``pareto_mask``)."""
    if not len(names):
        return {}
    v = np.asarray(values, dtype=float).reshape(-1, len(names))
    counts = np.isnan(v).sum(axis=0)
    return {name: int(n) for name, n in zip(names, counts.tolist()) if n}


def front_note(unvalued: dict, points: int, front: int | None = None) -> str | None:
    """One line saying why a Pareto front of ``points`` designs is smaller (or empty) than
    they would make it: the objectives some of them have no value (NaN) of and how many,
    from ``unvalued`` (``unvalued_counts``); ``front``: the designs on it, if known. None when
    every design has a value of every objective."""
    if not unvalued:
        return None
    each = ", ".join(f"{name} for {n:,} of {points:,}" for name, n in unvalued.items())
    empty = " (the front is empty)" if front == 0 else ""
    return (f"Pareto front: no value (NaN) of objective {each} feasible designs; a design with no value of an "
            f"objective is on no front{empty}")


# ---------------------------------------------------------------- Pareto mask

def _mask_1d(v: np.ndarray) -> np.ndarray:
    """Front of a NaN-free [N, 1] minimization array: the points equal to the minimum."""
    return v[:, 0] == v[:, 0].min()


def _mask_2d(v: np.ndarray) -> np.ndarray:
    """Front of a NaN-free [N, 2] minimization array (lexsort + running minimum)."""
    n = len(v)
    order = np.lexsort((v[:, 1], v[:, 0]))
    a, b = v[order, 0], v[order, 1]
    # minimum of b over the points strictly before each one in (a, b) order
    prev_min = np.empty(n)
    prev_min[0] = np.inf
    np.minimum.accumulate(b[:-1], out=prev_min[1:])
    new_min = b < prev_min
    new_min[0] = True  # the lexicographically smallest point is never dominated
    # first point (in order) reaching the running minimum seen before each point:
    # it has the smallest a among the earlier points with that b
    first = np.maximum.accumulate(np.where(new_min, np.arange(n), 0))
    first_prev = np.concatenate(([0], first[:-1]))
    # a point tying the earlier minimum of b is kept only when it duplicates that point
    keep = new_min | ((b == prev_min) & (a == a[first_prev]))
    mask = np.empty(n, dtype=bool)
    mask[order] = keep
    return mask


def _mask_3d(v: np.ndarray) -> np.ndarray:
    """Front of a NaN-free [N, 3] minimization array (Kung's sweep, O(N log N)).

    Points are visited in lexicographic order of (second, third, first) column, so only
    earlier points can dominate a point; among distinct rows, an earlier point dominates iff
    its third and first are <= in both. A staircase of those of the front so far answers that
    with one bisection. Rows that repeat the second and third of an earlier row with a larger
    first are dominated by it and dropped before the sweep: a sweep's objectives after the
    first are often its own parameters (bandwidth, peak), shared by many of its points.
    """
    w = v[:, [1, 2, 0]]
    order = np.lexsort((w[:, 2], w[:, 1], w[:, 0]))
    p = w[order]
    new_row = np.ones(len(p), dtype=bool)
    new_row[1:] = np.any(p[1:] != p[:-1], axis=1)
    rep = p[new_row]                  # one row per group of duplicates
    shared = np.zeros(len(rep), dtype=bool)
    shared[1:] = (rep[1:, 0] == rep[:-1, 0]) & (rep[1:, 1] == rep[:-1, 1])   # a larger first than the row before
    swept = np.flatnonzero(~shared)
    keep = np.zeros(len(rep), dtype=bool)
    ys: list[float] = []              # staircase: y increasing ...
    zs: list[float] = []              # ... z strictly decreasing
    for k, y, z in zip(swept.tolist(), rep[swept, 1].tolist(), rep[swept, 2].tolist()):
        i = bisect_right(ys, y) - 1   # last step with y_j <= y: smallest z among them
        if i >= 0 and zs[i] <= z:
            continue                  # dominated
        keep[k] = True
        lo = i if (i >= 0 and ys[i] == y) else i + 1
        hi = lo
        while hi < len(zs) and zs[hi] >= z:
            hi += 1                   # steps covered by the new point
        ys[lo:hi] = [y]
        zs[lo:hi] = [z]
    mask = np.empty(len(v), dtype=bool)
    mask[order] = keep[np.cumsum(new_row) - 1]
    return mask


def _dominated_by(cand: np.ndarray, front: np.ndarray, max_cells: int = 1 << 22) -> np.ndarray:
    """Bool [len(cand)]: whether each candidate is dominated by some row of ``front``.

    Compares in chunks of ``front`` rows so that no temporary exceeds ``max_cells``.
    """
    out = np.zeros(len(cand), dtype=bool)
    if len(cand) == 0 or len(front) == 0:
        return out
    step = max(1, max_cells // len(cand))
    for s in range(0, len(front), step):
        f = front[s:s + step]
        le = np.ones((len(cand), len(f)), dtype=bool)
        eq = np.ones((len(cand), len(f)), dtype=bool)
        for j in range(cand.shape[1]):
            c, g = cand[:, j, None], f[None, :, j]
            le &= g <= c
            eq &= g == c
        out |= np.any(le & ~eq, axis=1)
    return out


def _mask_blockwise(v: np.ndarray, block: int = 512) -> np.ndarray:
    """Front of a NaN-free [N, M] minimization array by block-wise elimination.

    Columns are replaced by their dense ranks (same order and ties, no infinities)
    and points sorted by rank sum, then lexicographically, so every dominator of a
    point comes before it. Each block of candidates keeps the points no other
    block member dominates; those join the front and remove what they dominate
    from the points still to come. Cost O(N * front size * M).
    """
    n, m = v.shape
    r = np.empty((n, m), dtype=np.int64)
    for j in range(m):
        r[:, j] = np.unique(v[:, j], return_inverse=True)[1].ravel()
    order = np.lexsort(tuple(r[:, j] for j in reversed(range(m))) + (r.sum(axis=1),))
    rest, rest_idx = r[order], order
    front_idx = []
    while len(rest):
        cand, cand_idx = rest[:block], rest_idx[:block]
        rest, rest_idx = rest[block:], rest_idx[block:]
        ok = ~_dominated_by(cand, cand)
        cand, cand_idx = cand[ok], cand_idx[ok]
        front_idx.append(cand_idx)
        alive = ~_dominated_by(rest, cand)
        rest, rest_idx = rest[alive], rest_idx[alive]
    mask = np.zeros(n, dtype=bool)
    mask[np.concatenate(front_idx)] = True
    return mask


def _mask_min(v: np.ndarray) -> np.ndarray:
    """Front of a NaN-free, already-minimization [N, M] array (dispatch by M)."""
    if len(v) == 0:
        return np.zeros(0, dtype=bool)
    m = v.shape[1]
    if m == 1:
        return _mask_1d(v)
    if m == 2:
        return _mask_2d(v)
    if m == 3:
        return _mask_3d(v)
    return _mask_blockwise(v)


def pareto_mask(values, senses) -> np.ndarray:
    """Return a bool array [N], True for the points no other point dominates.

    Exact duplicates on the front are all kept. Rows containing NaN are False
    and dominate nothing. Raises DseError on bad shapes or senses (see
    :func:`normalize`).
    """
    v = normalize(values, senses)
    valid = ~np.isnan(v).any(axis=1)
    mask = np.zeros(len(v), dtype=bool)
    mask[valid] = _mask_min(v[valid])
    return mask


# ------------------------------------------------------------------- ranks

def _ranks_2d(v: np.ndarray) -> np.ndarray:
    """Non-dominated ranks of a NaN-free [N, 2] minimization array, O(N log N).

    In lexicographic order a point's rank is the number of fronts holding an
    earlier point with second objective <= its own; ``mins[k]`` (the smallest
    second objective on front k so far) is non-decreasing in k, so one
    bisection finds it. Duplicates share a rank.
    """
    order = np.lexsort((v[:, 1], v[:, 0]))
    p = v[order]
    new_row = np.ones(len(p), dtype=bool)
    new_row[1:] = np.any(p[1:] != p[:-1], axis=1)
    rep_b = p[new_row, 1].tolist()
    rep_rank = np.empty(len(rep_b), dtype=np.int64)
    mins: list[float] = []
    for k, b in enumerate(rep_b):
        r = bisect_right(mins, b)
        rep_rank[k] = r
        if r == len(mins):
            mins.append(b)
        else:
            mins[r] = b
    ranks = np.empty(len(v), dtype=np.int64)
    ranks[order] = rep_rank[np.cumsum(new_row) - 1]
    return ranks


def pareto_ranks(values, senses) -> np.ndarray:
    """Return an int array [N] of non-dominated ranks.

    Rank 0 is the Pareto front, rank 1 the front of the points left once rank 0
    is removed, and so on; rows containing NaN get -1. Two objectives use an
    O(N log N) sort; more objectives peel fronts with :func:`pareto_mask`
    (cost: number of fronts times one mask). Raises DseError on bad shapes or
    senses.
    """
    v = normalize(values, senses)
    valid = ~np.isnan(v).any(axis=1)
    ranks = np.full(len(v), -1, dtype=np.int64)
    idx = np.flatnonzero(valid)
    if len(idx) == 0:
        return ranks
    if v.shape[1] == 2:
        ranks[idx] = _ranks_2d(v[idx])
        return ranks
    r = 0
    while len(idx):
        front = _mask_min(v[idx])
        ranks[idx[front]] = r
        idx = idx[~front]
        r += 1
    return ranks


# -------------------------------------------------------------- hypervolume

def _hv2(p: np.ndarray, ref: np.ndarray) -> float:
    """Area dominated by minimization points ``p`` [N, 2] (all < ref) up to ``ref``."""
    order = np.lexsort((p[:, 1], p[:, 0]))
    x, y = p[order, 0], p[order, 1]
    prev_min = np.concatenate(([np.inf], np.minimum.accumulate(y)[:-1]))
    keep = y < prev_min                 # staircase: x increasing, y strictly decreasing
    x, y = x[keep], y[keep]
    widths = np.diff(np.append(x, ref[0]))
    return float(np.sum(widths * (ref[1] - y)))


def _hv3(p: np.ndarray, ref: np.ndarray) -> float:
    """Volume dominated by minimization points ``p`` [N, 3] (all < ref) up to ``ref``.

    Sweep over z: insert points in increasing z into a 2-D staircase of (x, y),
    keeping its dominated area up to date from the steps each insertion covers,
    and add area times the z distance to the next point (or to the reference).
    """
    order = np.argsort(p[:, 2], kind="stable")
    px, py, pz = (p[order, j].tolist() for j in range(3))
    rx, ry, rz = (float(c) for c in ref)
    xs: list[float] = []                # staircase: x strictly increasing ...
    ys: list[float] = []                # ... y strictly decreasing
    area = 0.0
    volume = 0.0
    n = len(px)
    for k in range(n):
        x, y = px[k], py[k]
        i = bisect_right(xs, x) - 1     # last step with x_j <= x
        if not (i >= 0 and ys[i] <= y):  # not covered: add its new area
            lo = i if (i >= 0 and xs[i] == x) else i + 1
            hi = lo
            while hi < len(ys) and ys[hi] >= y:
                hi += 1                 # steps the new point covers
            x_end = xs[hi] if hi < len(xs) else rx
            y_left = ys[lo - 1] if lo > 0 else ry
            x_next = xs[lo] if lo < hi else x_end
            gain = (x_next - x) * (y_left - y)
            for j in range(lo, hi):
                xj_next = xs[j + 1] if j + 1 < hi else x_end
                gain += (xj_next - xs[j]) * (ys[j] - y)
            area += gain
            xs[lo:hi] = [x]
            ys[lo:hi] = [y]
        z_next = pz[k + 1] if k + 1 < n else rz
        if z_next != pz[k]:
            volume += area * (z_next - pz[k])
    return volume


def hypervolume(values, senses, reference) -> float:
    """Return the hypervolume dominated by the points, bounded by ``reference``.

    ``reference`` is one value per objective, in the same units and senses as
    ``values``; both are normalized to minimization first. Points that are not
    strictly better than the reference in every objective, and rows containing
    NaN, contribute nothing (an empty set gives 0.0). Exact (up to float
    rounding) for 2 objectives (sorted sweep) and 3 objectives (sweep over the
    third with an incrementally updated 2-D area); a point with an infinite
    coordinate better than the reference gives ``inf``. Raises DseError for
    another number of objectives, a reference of the wrong length or not finite,
    and bad senses.
    """
    v = _values_2d(values)
    m = v.shape[1]
    if m not in (2, 3):
        raise DseError(f"hypervolume supports 2 or 3 objectives, got {m}")
    signs = _signs(senses, m)
    ref = np.asarray(reference, dtype=float)
    if ref.shape != (m,):
        raise DseError(f"reference point needs {m} values (one per objective), got shape {ref.shape}")
    if not np.all(np.isfinite(ref)):
        raise DseError(f"reference point must be finite, got {ref.tolist()}")
    v = v * signs
    ref = ref * signs
    with np.errstate(invalid="ignore"):
        p = v[np.all(v < ref, axis=1)]  # NaN compares False: NaN rows drop out
    if len(p) == 0:
        return 0.0
    if np.isinf(p).any():
        return float("inf")
    return _hv2(p, ref) if m == 2 else _hv3(p, ref)
