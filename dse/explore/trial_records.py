"""What a complete trial of an Optuna search carries besides its objective values.

- As user attrs, every metric of the evaluated design that is a finite number
  (``dse.system.evaluator.METRICS``, SI units: ``ttft_s`` s, ``tpot_s`` s, ``memory_bytes``
  bytes per device, ``output_tokens_per_s`` tokens/s, ``devices``, ...), the same values
  as its row in ``results.parquet``; ``feasible`` (bool); and for an infeasible design
  ``reason`` (the key stored in ``results.parquet``, e.g. ``device_memory`` or
  ``tpot_s > 0.1``) and ``why`` (the sentence, as ``dse analyze`` says it).
- Constraints (fits in memory, runs at all, the study's SLOs and budgets) are the trial
  system attr ``constraints``: a list of violations, <= 0 satisfied, the format Optuna's
  ``constraints_func`` writes and optuna-dashboard reads; the study user attr
  ``constraint_names`` names its entries. Every sampler reads them through
  ``FrozenTrial.constraints``, so infeasible designs are never in ``study.best_trials``
  (optuna-dashboard's "Best Trials" card computes its own front, constraints ignored: the
  README says how the fronts differ).
- Objective values (``objective_value``): an infeasible design keeps its own (finite)
  values; NaN or infinite ones become a very bad finite value.

``record`` writes a batch's attrs through the storage's public API; with the run folder's
journal held for a population (``dse.explore.optuna_journal``) they reach the file in the
population's one write.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from dse.explore.optuna_rdb import record_attrs
from dse.explore.sweep import COUNTS
from dse.system.evaluator import METRICS

#: trial system attr holding the constraint violations (list, <= 0 satisfied): Optuna's key
CONSTRAINTS_ATTR = "constraints"


def trial_attrs(df: pd.DataFrame, ev, i: int) -> dict:
    """The user attrs of the trial in row ``i`` of ``df`` (evaluated as ``ev``): every metric
    (``METRICS``, SI units) that is a finite number, as stored in ``results.parquet``
    (counts as int); ``feasible``; and, when infeasible, ``reason`` (the key in
    ``results.parquet``) and ``why`` (the sentence)."""
    return batch_trial_attrs(df.iloc[i:i + 1].reset_index(drop=True), ev, offset=i)[0]


def batch_trial_attrs(df: pd.DataFrame, ev, offset: int = 0) -> list[dict]:
    """``trial_attrs`` of every row of ``df`` (row ``j`` is point ``offset + j`` of ``ev``),
    column by column."""
    n = len(df)
    attrs = [{} for _ in range(n)]
    for name in METRICS:
        v = df[name].to_numpy()
        finite = np.isfinite(v.astype(float, copy=False)) if v.dtype != object else \
            np.array([x is not None and np.isfinite(x) for x in v], dtype=bool)
        cast = int if name in COUNTS else float
        for j, x in zip(np.flatnonzero(finite).tolist(), v[finite].tolist()):
            attrs[j][name] = cast(x)
    feasible = df["feasible"].to_numpy(dtype=bool).tolist()
    reasons = df["reason"].tolist()
    for j in range(n):
        attrs[j]["feasible"] = feasible[j]
        if not feasible[j]:
            attrs[j]["reason"] = str(reasons[j])
            attrs[j]["why"] = ev.reason_text(offset + j)
    return attrs


def constraint_values(ev, i: int) -> list[float]:
    """Constraint violations of point ``i`` in the order of ``ev.violations`` (<= 0
    satisfied); NaN and infinities become +-1e300 (JSON and Optuna take finite floats)."""
    return [float(np.clip(np.nan_to_num(v[i], nan=1e300), -1e300, 1e300)) for v in ev.violations.values()]


def batch_constraint_values(ev) -> list[list[float]]:
    """``constraint_values`` of every point of ``ev``, computed per constraint."""
    cols = [np.clip(np.nan_to_num(np.asarray(v, dtype=float), nan=1e300), -1e300, 1e300).tolist()
            for v in ev.violations.values()]
    n = len(cols[0]) if cols else len(ev.feasible)
    return [[c[i] for c in cols] for i in range(n)]


def objective_value(v, sense: str) -> float:
    """An objective value Optuna accepts: NaN and infinities become a very bad finite value
    (-1e300 for a maximized objective, 1e300 for a minimized one)."""
    v = float(v)
    if np.isfinite(v):
        return v
    return -1e300 if sense == "max" else 1e300


def record(storage, study_id: int, items) -> None:
    """Write the user attrs and the constraint list (system attr ``CONSTRAINTS_ATTR``) of
    running trials, ``items`` = [(trial, user attrs, constraints)]: in one transaction on a
    database (``optuna_rdb.record_attrs``), else (and where that cannot) through
    ``storage``'s public API, one record per attribute as ``Trial.set_user_attr`` writes
    them (a journal held for a population writes them all at once). A trial finished
    meanwhile (failed as stale by another process) is skipped."""
    from optuna.exceptions import UpdateFinishedTrialError
    if record_attrs(storage, study_id, [(t.number, user, {CONSTRAINTS_ATTR: cons}) for t, user, cons in items]):
        return
    for trial, user, constraints in items:
        try:
            tid = storage.get_trial_id_from_study_id_trial_number(study_id, trial.number)
            for k, v in user.items():
                storage.set_trial_user_attr(tid, k, v)
            storage.set_trial_system_attr(tid, CONSTRAINTS_ATTR, constraints)
        except UpdateFinishedTrialError:
            pass
