"""The best feasible design per objective of a run, explained operator by operator.

After a sweep or a search, ``explain_best`` finds the best feasible row per objective in
``results.parquet`` (reading only the columns it ranks), evaluates those few designs again
with ``explain=True`` (the same evaluator, the same efficiency model) and stores their
parameters, summaries and per-operator tables in ``best.json``, which the report reads.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from basis.files import write_text_atomic
from dse.system.analysis import summary_of
from dse.system.evaluator import evaluate
from dse.system.params import PARAMS

BEST_FILE = "best.json"


def best_positions(df, objectives: dict) -> dict[str, int | None]:
    """Row position of the best feasible design per objective; ties broken by the other
    objectives in study order (a minimal bandwidth with the most tokens/s, say)."""
    feas = df["feasible"].to_numpy(bool)
    vals = {k: df[k].to_numpy(dtype=float) for k in objectives if k in df}
    best = {}
    for k in objectives:
        if k not in vals:
            best[k] = None
            continue
        cand = feas & np.isfinite(vals[k])
        for j in [k] + [o for o in objectives if o != k and o in vals]:
            v = vals[j]
            ok = cand & np.isfinite(v)
            if not ok.any():
                if j == k:
                    break
                continue
            target = v[ok].max() if objectives[j] == "max" else v[ok].min()
            cand = ok & (v == target)
        idx = np.flatnonzero(cand)
        best[k] = int(idx[0]) if len(idx) else None
    return best


def _plain(v):
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not np.isfinite(v):
        return None
    return v


def explain_rows(rows: list[dict], ideal: bool = False) -> list[dict]:
    """Summary and per-operator tables of result rows (their parameters), one evaluation."""
    params = [k for k in PARAMS if k in rows[0] and any(r.get(k) is not None for r in rows)]
    cols = {k: np.array([r[k] for r in rows], dtype=object) for k in params}
    for k in ("flash_attention", "sparse", "overlap"):
        if k in cols:
            cols[k] = cols[k].astype(bool)
    ev = evaluate(cols, ideal=ideal, explain=True)
    out = []
    for i in range(len(rows)):
        ex = ev.explained.get(i, {"prefill": [], "decode": [], "memory_bandwidth": None})
        out.append({"summary": {k: _plain(v) for k, v in summary_of(ev, i).items()},
                    "prefill": ex["prefill"], "decode": ex["decode"], "memory_bandwidth": ex["memory_bandwidth"]})
    return out


def explain_best(out_dir, spec, results) -> dict:
    """Write ``best.json`` for the run in ``out_dir`` (``results``: its _Results reader) and
    return what it holds: {'objectives': {name: position}, 'designs': {position: ...}}."""
    key = "point" if "point" in results.names else "trial" if "trial" in results.names else None
    objectives = dict(spec.objectives or {})
    df = results.columns([c for c in [key, "feasible", *objectives] if c])
    best = best_positions(df, objectives)
    uniq = list(dict.fromkeys(p for p in best.values() if p is not None))
    designs = {}
    if uniq:
        full = results.rows_at(uniq)
        for p, row, ex in zip(uniq, full, explain_rows(full, ideal=bool(spec.ideal))):
            designs[str(p)] = {"row": {k: _plain(v) for k, v in row.items()}, "id": key,
                               "id_value": _plain(row[key]) if key else p, **ex}
    data = {"objectives": best, "designs": designs}
    write_text_atomic(Path(out_dir) / BEST_FILE, json.dumps(data, separators=(",", ":"), default=_plain))
    return data
