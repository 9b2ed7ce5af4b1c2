"""Fit the engine layer to measured end-to-end results, the kernel layer held fixed.

Two layers price an operator (``dse.core.efficiency``, ``dse.core.engines``): the kernel layer
(what the hardware and its kernel library reach: per hardware family, cited priors until measured
kernel tables replace them; never fitted here) and the engine layer (what a serving engine adds
on top: launch or graph cost per operator, scheduler and sampling time per step, per-request
cost, achieved prefill/decode overlap, and its achieved share of the kernel layer's bandwidth
and compute). ``calibrate(measured_csv)`` predicts every predictable scored row (as
``dse.fit.validate`` does: same batch, placement and engine profile), fits the engine layer's
``FIT`` parameters with ``scipy.optimize.least_squares`` (robust ``soft_l1`` loss on the log of
predicted / measured, parameters bounded, several starts), cross-validates the fit leaving
sources, vendors and engines out, and writes ``configs/calibration.yaml`` (every fitted value
with a note; values on a bound, prior engines and every cross-validation fold recorded), which
``dse.core.engines.engine_efficiency`` then loads as the default.

An engine with fewer than ``MIN_ROWS`` predictable rows is not fitted: it is a prior engine
(neutral scales, ``dse.core.engines.NEUTRAL``) with the wide band of unseen engines, never
another engine's fit.

The fit prices one prepared plan of the rows (``dse.system.evaluator.prepare``: the same
evaluator as every other prediction) under each trial efficiency; after writing, the new
defaults are validated through the same evaluator, so the reported error is the one users get.
"""
from __future__ import annotations

import csv
import datetime as _dt
import hashlib
import io
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from basis.errors import DseError
from basis.files import write_text_atomic
from basis.shipped import shipped
from dse.core.bands import (
    COVERAGE,
    DATAFLOW,
    PRIOR_LABEL,
    bands_from,
    family_of_metric,
    held_out_coverage,
    oriented,
    slice_key,
    small_sample_band,
    unseen_bands,
)
from dse.core.bands import MIN_ROWS as BAND_MIN_ROWS
from dse.core.efficiency import Efficiency, family_of, family_parameters, load_calibration
from dse.core.engines import COMPILED, SCALE_RANGE, engine_efficiency, engine_parameters, engines
from dse.fit.validate import Case, Predictions, ape_stats, measured_files, prepare_all, read_table, reason
from dse.present import display
from dse.system.evaluator import evaluate
from hwmodels.classes import device_class
from hwmodels.presets import load_device

#: robust loss and its scale (log error ~10 % where it turns from quadratic to linear)
LOSS, F_SCALE = "soft_l1", 0.1
#: where ``calibrate`` writes when no --out is given (use it with DSE_CALIBRATION=...)
DEFAULT_OUT = Path("runs") / "calibrate" / "calibration.yaml"
#: an engine (and a launch class) is fitted only with at least this many predictable rows; one
#: with fewer is a prior engine
MIN_ROWS = 8


@dataclass(frozen=True)
class Param:
    """A fitted parameter: bounds, whether it is fitted in log space, first start."""

    name: str
    lo: float
    hi: float
    log: bool
    start: float
    what: str


FIT = (
    Param("op_overhead_s", 1e-8, 1e-4, True, 5e-6, "fixed time per operator instance (launch or graph node)"),
    Param("step_overhead_s", 1e-7, 5e-2, True, 1e-3, "scheduler and sampling time per step"),
    Param("request_overhead_s", 1e-6, 5e-2, True, 1e-3, "fixed time per request (in TTFT)"),
    Param("collective_latency_s", 1e-8, 1e-3, True, 1e-5, "software latency per collective (one launch per all-reduce or hop)"),
    Param("memory_scale", *SCALE_RANGE, False, 0.8,
          "an engine's achieved bandwidth relative to the kernel layer's (hardware family prior)"),
    Param("compute_scale", *SCALE_RANGE, False, 0.8,
          "an engine's achieved compute relative to the kernel layer's (hardware family prior)"),
    Param("prefill_decode_overlap", 0.0, 1.0, False, 0.3,
          "share of the shorter of prefill and decode an in-flight engine hides under the other"),
)
#: the kernel layer's parameters: held fixed at the hardware family's values (cited priors,
#: ``dse.core.efficiency.FAMILY_PRIORS``, until measured kernel tables replace them), never
#: fitted on end-to-end rows
KERNEL_LAYER = ("compute", "compute_half_rows", "memory", "kv_reread_exponent", "compute_fp8", "compute_narrow",
                "compute_fp4", "compute_int8", "attention_compute", "attention_memory", "vector_compute",
                "collective", "compute_half_ops", "memory_half_bytes")

#: why the other parameters keep their priors (found while building the model on
#: data/measured_calibration.csv; see the closing note of issue 6)
NOT_FITTED = {
    "compute_half_ops": "a free fit puts the half at ~1e9 ops, which acts as a fixed time per GEMM of half / (peak "
                        "x compute), makes batch-1 GEMVs (~1e7-1e8 ops) compute-bound and raises the "
                        "leave-one-hardware-out p90 (37 -> 52 %); bounded to keep GEMVs memory-bound it goes to its "
                        "lower bound; 0 (no size term: small GEMMs pay op_overhead_s and the rows term instead)",
    "compute_narrow": "FP8 is measured only on H100 and L40S and FP16 only on A100 and T4, so a format effect "
                      "cannot be told from a device effect: a free fit (0.54 against compute 0.58) lowers the "
                      "in-sample median (7.8 -> 7.0 %) but raises the leave-one-hardware-out p90 (37 -> 64 %); kept "
                      "equal to compute",
    "memory_half_bytes": "a free fit puts the half at ~8 MB per operator and raises the in-sample p90 (23 -> 26 %) "
                         "and the leave-one-hardware-out p90 (37 -> 54 %); 0",
    "attention_compute": "not identifiable: attention compute is a small share of every measured run (a free fit "
                         "stays at its start value); kept equal to compute",
    "attention_memory": "a free fit gives 0.96 (memory 0.90), a higher in-sample p90 (23 -> 24 %) and "
                        "leave-one-hardware-out p90 (37 -> 46 %); kept equal to memory",
    "attention_kv_reads": "set per measured row from its engine (K/V read once per query head before TensorRT-LLM's "
                          "XQA kernel), never fitted",
    "vector_compute": "element-wise operators are memory-bound on every measured device; kept equal to compute",
    "collective": "the measured collectives are latency-bound (at most a few MB per all-reduce over NVLink); a free "
                  "fit gives 0.30, standing in for the missing collective latency (it would slow every large "
                  "collective of a sweep), with mixed cross-validated changes; prior 0.80",
}


# --------------------------------------------------------------------------- fitting

#: an engine-side group (an all-reduce algorithm) is fitted only with at least this many rows
#: that exercise it (on more than one device)
MIN_GROUP_ROWS = 3


@dataclass(frozen=True)
class Slot:
    """One fitted value: a parameter of one group (a family, launch class, all-reduce or engine)."""

    param: Param
    section: str
    group: str

    @property
    def key(self) -> str:
        return f"{self.section}.{self.group}.{self.param.name}"


def _to_x(p: Param, v: float) -> float:
    return float(np.log10(v)) if p.log else float(v)


def _from_x(p: Param, x: float) -> float:
    return float(10 ** x) if p.log else float(x)


def slots_for(cases: list[Case], params=FIT, only: tuple | None = None) -> list[Slot]:
    """The engine-layer values the rows of ``cases`` can fit, the kernel layer held fixed: each
    launch class with at least ``MIN_ROWS`` rows (but ``COMPILED``, which launches nothing and has
    no value), each all-reduce algorithm with ``MIN_GROUP_ROWS``
    rows over more than one device, and each engine with at least ``MIN_ROWS`` rows its scheduler
    cost per step and its achieved bandwidth and compute relative to the kernel layer
    (``memory_scale``, ``compute_scale``), its per-request cost with ``MIN_ROWS`` TTFT rows (fewer
    let it stand in for the queueing of a few loaded runs) and, for an in-flight engine, its
    prefill/decode overlap with ``MIN_ROWS`` continuous-serving rows. An engine with fewer rows is a
    prior engine (``dse.core.engines.NEUTRAL``): nothing of it is fitted, nor borrowed. ``only``
    (engine names): those engines' own values alone (``Held``: every other value held)."""
    out = []
    by = {p.name: p for p in params}

    def count(pred) -> int:
        return sum(1 for c in cases if pred(c))
    if "op_overhead_s" in by:
        for launch in sorted({c.engine.launch for c in cases} - {COMPILED}):
            if count(lambda c: c.engine.launch == launch) >= MIN_ROWS:
                out.append(Slot(by["op_overhead_s"], "launch", launch))
    if "collective_latency_s" in by:
        for algo in sorted({c.engine.allreduce for c in cases} - {"none"}):
            if count(lambda c: c.engine.allreduce == algo and c.row.tp > 1) >= MIN_GROUP_ROWS:
                out.append(Slot(by["collective_latency_s"], "allreduce", algo))
    for eng in sorted({c.engine.name for c in cases}):
        mine = [c for c in cases if c.engine.name == eng]
        if len(mine) < MIN_ROWS:
            continue
        for name in ("step_overhead_s", "memory_scale", "compute_scale"):
            if name in by:
                out.append(Slot(by[name], "engines", eng))
        if "request_overhead_s" in by and sum(c.row.metric.startswith("ttft") for c in mine) >= MIN_ROWS:
            out.append(Slot(by["request_overhead_s"], "engines", eng))
        if ("prefill_decode_overlap" in by and mine[0].engine.batching == "inflight"
                and sum(c.row.serving == "continuous" for c in mine) >= MIN_ROWS):
            out.append(Slot(by["prefill_decode_overlap"], "engines", eng))
    if only is not None:
        out = [s for s in out if s.section == "engines" and s.group in only]
    return out


@dataclass(frozen=True)
class Held:
    """Engine-layer values held fixed while others are fitted (``dse.fit.refit``): ``sections`` in
    the calibration file's layout ({section: {group: {name: number}}}, ``engine_families`` among
    them), and the engines whose own values alone are fitted (``slots_for``'s ``only``)."""

    sections: dict
    engines: tuple


def prior_engines(cases: list[Case]) -> dict[str, str]:
    """{engine: why it is a prior engine} for every engine profile without ``MIN_ROWS`` predictable
    rows in ``cases`` (its values are ``dse.core.engines.NEUTRAL``, its band the unseen engines')."""
    counts: dict[str, int] = {}
    for c in cases:
        counts[c.engine.name] = counts.get(c.engine.name, 0) + 1
    return {name: f"{counts.get(name, 0)} predictable rows (fewer than {MIN_ROWS}): neutral scales 1.0, no "
                  f"scheduler or request cost of its own, no overlap; band of unseen engines (leave-engines-out)"
            for name in engines() if counts.get(name, 0) < MIN_ROWS}


def engine_families(cases: list[Case], slots: list[Slot]) -> dict[str, list[str]]:
    """{engine: the hardware families of its rows in ``cases``, sorted} for every engine with
    fitted values among ``slots``: the families its values hold on (the calibration's
    ``engine_families``; on any other family it is a prior engine, ``dse.core.engines``)."""
    fitted = {s.group for s in slots if s.section == "engines"}
    out: dict[str, set] = {}
    for c in cases:
        if c.engine.name in fitted:
            out.setdefault(c.engine.name, set()).add(family_of(c.device))
    return {name: sorted(fams) for name, fams in sorted(out.items())}


class Parameterisation:
    """Maps a vector of fitted values (``slots``) to every row's Efficiency: its family's prior with
    the family's fitted values, under its engine with the fitted launch, all-reduce and engine
    costs (``engine_efficiency``; an engine without its own scheduler fit takes the default
    engine's, as predictions do). ``base`` (optional) is one family Efficiency for every row;
    ``covered`` (optional, ``engine_families``): the families each engine's values hold on (a
    row of another family runs its engine as a prior engine; None: every family); ``held``
    (optional, ``Held.sections``): values held fixed, the fitted ones over them."""

    def __init__(self, cases: list[Case], slots: list[Slot], base: Efficiency | None = None,
                 covered: dict | None = None, held: dict | None = None):
        self.cases, self.slots, self.base, self.covered, self.held = cases, list(slots), base, covered, held

    def values(self, x) -> dict[str, float]:
        return {s.key: _from_x(s.param, v) for s, v in zip(self.slots, x)}

    def efficiencies(self, x) -> list[Efficiency]:
        v = self.values(x)
        memo, out = {}, []
        for c in self.cases:
            fam = family_of(c.device)
            key = (fam, c.engine, c.kv_group)
            if key not in memo:
                memo[key] = self._efficiency(v, fam, c.engine, c.kv_group)
            out.append(memo[key])
        return out

    def _efficiency(self, v: dict, fam: str, engine, kv_group: float) -> Efficiency:
        if self.base is not None:
            base = replace(self.base, **{k.split(".")[-1]: val for k, val in v.items()
                                         if k.startswith("families.")})
        sections: dict = {sec: {g: dict(vals) for g, vals in groups.items()}
                          for sec, groups in (self.held or {}).items() if sec != "engine_families"}
        for key, val in v.items():                 # 'section.group.name' -> the calibration file's layout
            section, rest = key.split(".", 1)
            group, name = rest.rsplit(".", 1)
            sections.setdefault(section, {}).setdefault(group, {})[name] = val
        if self.base is None:
            params, _ = family_parameters(fam, fitted=(sections.get("families") or {}).get(fam, {}))
            base = Efficiency(name=f"fit {fam}", **params)
        covered = self.covered if self.covered is not None else (self.held or {}).get("engine_families")
        if covered is not None:
            sections["engine_families"] = covered
        return engine_efficiency(base, engine, kv_group,
                                 parameters=engine_parameters(engine, sections=sections, family=fam)[0])


@dataclass
class Fit:
    """Result of one fit: fitted values (by parameter name for a single family, else by slot key),
    errors per row (predicted / measured - 1)."""

    params: dict
    errors: np.ndarray
    cost: float
    nfev: int
    slots: list = None


def fit(predictors: Predictions, base: Efficiency | None, params=FIT, *, starts: int = 3, progress=None,
        slots: list[Slot] | None = None, warm: dict | None = None, warm_nfev: int | None = None,
        held: Held | None = None) -> Fit:
    """Least-squares fit to the rows of ``predictors``: robust loss on log(predicted / measured), each
    row's weighted by its source's share (``source_weights``, ``weighted_robust``), bounded, best of ``starts`` starting points (the documented start, then low and high corners of
    the box). With ``base`` (one Efficiency for every row) the ``params`` are its fields and the
    result is keyed by parameter name; else ``slots`` (default ``slots_for``) are fitted per family,
    launch class, all-reduce algorithm and engine, keyed by slot; with ``held`` only the named
    engines' own values, every other value held at its given one. ``progress`` (optional): told
    of every evaluation (``update(1)``: the residuals or their Jacobian priced once) and of
    every start's end (``run_done(warm)``)."""
    from scipy.optimize import least_squares

    cases = predictors.cases
    if base is not None:
        slots = [Slot(p, "families", "all") for p in params]
        model = _Single(cases, slots, base)
    else:
        slots = slots if slots is not None else slots_for(cases, params, None if held is None else held.engines)
        model = Parameterisation(cases, slots, held=None if held is None else held.sections)
    lo = np.array([_to_x(s.param, s.param.lo) for s in slots])
    hi = np.array([_to_x(s.param, s.param.hi) for s in slots])
    if not slots:
        return Fit({}, np.exp(_Residuals(predictors, model, slots, lo, hi).log_ratios(np.zeros(0))) - 1.0, 0.0, 1, [])
    resid = _Residuals(predictors, model, slots, lo, hi)
    x0 = np.clip([_to_x(s.param, (warm or {}).get(s.key, s.param.start)) for s in slots], lo, hi)
    best = None
    for start in _starts(x0, lo, hi, 1 if warm else starts):
        r = least_squares(_counted(resid, progress), start, jac=_counted(resid.jacobian, progress), bounds=(lo, hi),
                          loss="linear", max_nfev=(warm_nfev or WARM_NFEV) if warm else None)
        if best is None or r.cost < best.cost:
            best = r
        if progress is not None:
            progress.run_done(bool(warm))
    values = model.values(best.x)
    if base is not None:
        values = {k.split(".")[-1]: val for k, val in values.items()}
    return Fit(values, np.exp(resid.log_ratios(best.x)) - 1.0, float(best.cost), int(best.nfev), slots)


#: relative step of the forward differences of the Jacobian (in the fitted, possibly log, space)
DIFF_STEP = 1e-3
#: evaluations a warm-started fit (a cross-validation fold, starting at the full fit) may take
#: (``calibrate --fold-evaluations``)
WARM_NFEV = 40


def weighted_robust(r: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Residuals whose half sum of squares is sum_i w_i F^2 (sqrt(1 + (r_i / F)^2) - 1), scipy's
    soft_l1 ``LOSS`` of log-ratios ``r`` at ``F_SCALE`` F with each row weighted by ``w``:
    sign(r) sqrt(2 w F^2 (sqrt(1 + (r / F)^2) - 1)) (so a weight scales a row's loss, not where its
    loss turns robust; r itself for small r and w = 1). Broadcasts."""
    f2 = F_SCALE * F_SCALE
    return np.sign(r) * np.sqrt(2.0 * w * f2 * (np.sqrt(1.0 + r * r / f2) - 1.0))


def source_weights(cases: list[Case]) -> np.ndarray:
    """Each row's weight in the fit: every source (``group_of(case, 'source')``) weighs the same in
    all, N / (G n_g) a row for a source of n_g of the N rows from G sources (mean 1). A source's rows
    share its harness, build and settings, so they are one observation of the engine more than
    n_g independent ones: two documentation tables of 100 rows each would otherwise set every
    value the engines share (launch and all-reduce costs) alone."""
    groups = [group_of(c, "source") for c in cases]
    counts = Counter(groups)
    n, k = len(cases), len(counts)
    return np.array([n / (k * counts[g]) for g in groups], dtype=float)


class _Residuals:
    """log(predicted / measured) of the rows of ``predictors`` at fitted values ``x`` (10 where a
    row is not predicted), and its Jacobian by forward differences that re-price only the rows
    whose efficiency a value changes: the rows are split into blocks that share the values they
    depend on (found by moving each value and comparing every row's Efficiency), each block one
    prepared plan of the same evaluator."""

    def __init__(self, predictors: Predictions, model: Parameterisation, slots: list, lo, hi):
        self.lo, self.hi, self.slots = lo, hi, slots
        cases = predictors.cases
        self.measured = np.array([c.row.value for c in cases])
        self.weights = source_weights(cases)
        mid = 0.5 * (lo + hi)
        here = model.efficiencies(mid)
        uses = np.zeros((len(cases), len(slots)), dtype=bool)
        for k in range(len(slots)):
            moved = mid.copy()
            moved[k] = lo[k] + 0.9 * (hi[k] - lo[k])
            uses[:, k] = [a != b for a, b in zip(here, model.efficiencies(moved))]
        signature = {}
        for i in range(len(cases)):
            signature.setdefault(uses[i].tobytes(), []).append(i)
        self.blocks = []
        for idx in signature.values():
            part = [cases[i] for i in idx]
            block = Predictions(part) if len(idx) < len(cases) else predictors
            self.blocks.append((np.array(idx), np.flatnonzero(uses[idx[0]]),
                                type(model)(part, slots, model.base, model.covered, model.held), block))
        self._last = (None, None)

    def _block(self, b, x) -> np.ndarray:
        idx, _, model, pred = b
        with np.errstate(divide="ignore", invalid="ignore"):
            r = np.log(pred.values(model.efficiencies(x)) / self.measured[idx])
        return np.where(np.isfinite(r), r, 10.0)

    def log_ratios(self, x) -> np.ndarray:
        """log(predicted / measured) of every row at ``x`` (10 where a row is not predicted)."""
        x = np.asarray(x, dtype=float)
        if self._last[0] is not None and np.array_equal(self._last[0], x):
            return self._last[1].copy()
        r = np.empty(len(self.measured))
        for b in self.blocks:
            r[b[0]] = self._block(b, x)
        self._last = (x.copy(), r)
        return r.copy()

    def __call__(self, x) -> np.ndarray:
        """The residuals the fit minimises (``weighted_robust``: half their sum of squares is the
        ``LOSS`` of ``log_ratios`` weighted by ``source_weights``)."""
        return weighted_robust(self.log_ratios(x), self.weights)

    def jacobian(self, x) -> np.ndarray:
        """d residual / d value, forward differences of relative step ``DIFF_STEP`` (backward at an
        upper bound); a block is re-priced only for the values it depends on."""
        x = np.asarray(x, dtype=float)
        r0 = self(x)
        jac = np.zeros((len(r0), len(x)))
        for k in range(len(x)):
            h = DIFF_STEP * max(1.0, abs(x[k]))
            if x[k] + h > self.hi[k]:
                h = -h
            moved = x.copy()
            moved[k] += h
            for b in self.blocks:
                if k in b[1]:
                    jac[b[0], k] = (weighted_robust(self._block(b, moved), self.weights[b[0]]) - r0[b[0]]) / h
        return jac


class _Single(Parameterisation):
    """One Efficiency for every row, its fields fitted (``fit`` with a ``base``)."""

    def _efficiency(self, v, fam, engine, kv_group):
        base = replace(self.base, **{k.split(".")[-1]: val for k, val in v.items()})
        return engine_efficiency(base, engine, kv_group, parameters={})


def _starts(x0: np.ndarray, lo: np.ndarray, hi: np.ndarray, starts: int) -> list:
    """The starting points of a fit: the documented start, then the low and high corners."""
    return [x0, lo + 0.25 * (hi - lo), lo + 0.75 * (hi - lo)][:max(starts, 1)]


def _counted(f, progress):
    """``f``, advancing ``progress`` by one evaluation per call (``f`` itself without one)."""
    if progress is None:
        return f

    def counted(*args):
        out = f(*args)
        progress.update(1)
        return out
    return counted


#: the groupings cross-validation leaves out, one group at a time (sources: in SOURCE_FOLDS folds)
CV_KEYS = ("source", "vendor", "engine")
SOURCE_FOLDS = 8


def group_of(case: Case, key: str) -> str:
    """A row's group for cross-validation: its source, its hardware vendor or its engine."""
    if key == "engine":
        return case.engine.name
    if key == "vendor":
        return case.row.vendor or getattr(case.device, "vendor", "") or case.device.name
    return case.row.source or case.row.id


def folds_of(cases: list[Case], key: str) -> dict[str, list[int]]:
    """Row positions of each left-out group: every vendor or engine on its own; sources in
    ``SOURCE_FOLDS`` folds of whole sources (largest first, each to the smallest fold)."""
    groups: dict[str, list[int]] = {}
    for i, c in enumerate(cases):
        groups.setdefault(group_of(c, key), []).append(i)
    if key == "source" and len(groups) > SOURCE_FOLDS:
        folds: list[list] = [[] for _ in range(SOURCE_FOLDS)]
        names: list[list] = [[] for _ in range(SOURCE_FOLDS)]
        for g, idx in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            k = min(range(SOURCE_FOLDS), key=lambda j: (len(folds[j]), j))
            folds[k] += idx
            names[k].append(g)
        groups = {f"sources {k + 1} ({len(names[k])})": sorted(f) for k, f in enumerate(folds) if f}
    return {g: idx for g, idx in sorted(groups.items()) if len(idx) < len(cases)}


def fits_to_run(cases: list[Case], cross_validation: bool, starts: int, keys=CV_KEYS) -> int:
    """How many least-squares runs ``calibrate`` makes: one fit and (cross-validating) one per
    left-out group of each of ``keys`` (the full fit with ``starts`` starts, each fold one warm start)."""
    folds = sum(len(folds_of(cases, k)) for k in keys) if cross_validation else 0
    return len(_starts(np.zeros(1), np.zeros(1), np.ones(1), starts)) + folds


def cross_validate(cases: list[Case], params=FIT, *, key: str = "source", starts: int = 3,
                   progress=None, warm: dict | None = None, workers: int = 1,
                   warm_nfev: int | None = None) -> tuple[np.ndarray, dict]:
    """(errors of every row predicted by a fit without its ``key`` group (``folds_of``; NaN where
    a row has none), each fold's record). ``warm``: the full fit's values, each fold's one start (a
    fold that drops a group's rows drops that group's values: its engine is then a prior engine,
    as an engine never measured). Every fold is counted: its record has its rows, the rows it
    predicted and, where some failed, how many and why (``failed``, ``why``: a fit that raised, or
    the reasons the evaluator gave for the rows it did not predict); see ``fold_totals``.
    ``workers`` > 1 fits the folds in that many processes (the same results)."""
    return cross_validate_all(cases, params, keys=(key,), starts=starts, progress=progress, warm=warm,
                              workers=workers, warm_nfev=warm_nfev)[key]


def cross_validate_all(cases: list[Case], params=FIT, *, keys=CV_KEYS, starts: int = 3, progress=None,
                       warm: dict | None = None, workers: int = 1,
                       warm_nfev: int | None = None, held: Held | None = None) -> dict[str, tuple[np.ndarray, dict]]:
    """``cross_validate`` for each of ``keys``: {key: (errors, fold records)}, every fold of every
    key fitted in one pool of ``workers`` processes when it is more than 1 (forked: each worker
    reads the rows it was forked with); ``held``: as ``fit``'s, in every fold."""
    jobs = [(key, g, idx) for key in keys for g, idx in folds_of(cases, key).items()]
    out = {key: (np.full(len(cases), np.nan), {}) for key in keys}

    def take(key, g, idx, errs, record, evaluations):
        out[key][0][idx] = errs
        out[key][1][g] = record
        if progress is not None:          # a fold's evaluations, counted where it ran, told at its end
            progress.update(evaluations)
            progress.run_done(True)
    if workers > 1 and len(jobs) > 1:
        import multiprocessing

        _FOLDS["state"] = (cases, params, starts, warm, warm_nfev, held)
        try:
            with multiprocessing.get_context("fork").Pool(min(workers, len(jobs))) as pool:
                for (key, g, idx), done in zip(jobs, pool.imap(_fold_job, jobs)):
                    take(key, g, idx, *done)
        finally:
            _FOLDS.clear()
    else:
        for key, g, idx in jobs:
            take(key, g, idx, *_fold(cases, idx, params, starts, warm, warm_nfev, held))
    for key in keys:                      # folds in their sorted order, as folds_of gives them
        out[key] = (out[key][0], {g: out[key][1][g] for g in folds_of(cases, key)})
    return out


#: what a forked fold worker reads (``cross_validate_all``)
_FOLDS: dict = {}


def _fold_job(job) -> tuple[np.ndarray, dict, int]:
    """``_fold`` of one (key, group, rows) job in a forked worker."""
    cases, params, starts, warm, warm_nfev, held = _FOLDS["state"]
    return _fold(cases, job[2], params, starts, warm, warm_nfev, held)


class _Tally:
    """Counts a fit's evaluations (``fit``'s progress protocol: ``update``, ``run_done``)."""

    def __init__(self):
        self.evaluations = 0

    def update(self, n: int = 1) -> None:
        self.evaluations += n

    def run_done(self, warm: bool) -> None:
        pass


def _fold(cases: list[Case], idx: list[int], params, starts: int, warm: dict | None,
          warm_nfev: int | None = None, kept: Held | None = None) -> tuple[np.ndarray, dict, int]:
    """(errors of the rows ``idx`` predicted by a fit of the other rows, the fold's record: rows,
    predicted, APE statistics and, where rows failed, ``failed`` and ``why``; the evaluations the
    fold's fit took). ``kept``: values held fixed (``fit``'s ``held``)."""
    held_set = set(idx)
    train = [cases[i] for i in range(len(cases)) if i not in held_set]
    held = [cases[i] for i in idx]
    record: dict = {"rows": len(idx)}
    errors = np.full(len(idx), np.nan)
    tally = _Tally()
    try:
        f = fit(Predictions(train), None, params, starts=starts, warm=warm, warm_nfev=warm_nfev, progress=tally,
                held=kept)
        covered = engine_families(train, f.slots)
        if kept is not None:
            covered = {**(kept.sections.get("engine_families") or {}), **covered}
        model = Parameterisation(held, f.slots, covered=covered, held=None if kept is None else kept.sections)
        x = [_to_x(s.param, f.params[s.key]) for s in f.slots]
        pr = Predictions(held).predict(model.efficiencies(np.array(x)))
    except (DseError, ValueError, np.linalg.LinAlgError) as e:
        return errors, {**record, "predicted": 0, "failed": len(idx), "why": {f"the fit failed: {e}": len(idx)}}, \
            tally.evaluations
    with np.errstate(divide="ignore", invalid="ignore"):
        errors = pr.values / np.array([c.row.value for c in held]) - 1.0
    ok = np.isfinite(errors)
    record.update(predicted=int(ok.sum()), **{k: _round(v) for k, v in ape_stats(np.abs(errors[ok])).items()})
    if not ok.all():
        why: dict[str, int] = {}
        for j in np.flatnonzero(~ok):
            text = str(pr.why.get(int(j), "no finite prediction"))
            text = text if len(text) <= 160 else text[:157] + "..."
            why[text] = why.get(text, 0) + 1
        record.update(failed=int((~ok).sum()), why=why)
    return errors, record, tally.evaluations


def fold_totals(folds: dict) -> dict:
    """{folds, failed_folds, rows, predicted_rows, failed_rows, why} of one cross-validation's fold
    records: a fold fails when it predicted none of its rows; every failed row is counted with why."""
    why: dict[str, int] = {}
    for rec in folds.values():
        for text, n in (rec.get("why") or {}).items():
            why[text] = why.get(text, 0) + n
    return {"folds": len(folds), "failed_folds": sum(rec.get("predicted", 0) == 0 for rec in folds.values()),
            "rows": sum(rec["rows"] for rec in folds.values()),
            "predicted_rows": sum(rec.get("predicted", 0) for rec in folds.values()),
            "failed_rows": sum(rec.get("failed", 0) for rec in folds.values()), "why": why}


def _at_bound(v: float, lo: float, hi: float) -> str:
    """'lower' or 'upper' when a fitted value sits on that bound of its box (within 0.1 % of
    the box in the fitted space), else ''."""
    if v <= lo * (1 + 1e-3) + 1e-12 * (lo == 0):
        return "lower"
    if v >= hi * (1 - 1e-3):
        return "upper"
    return ""


def at_bound(f: "Fit") -> dict[str, dict]:
    """{slot key: {value, bound ('lower' or 'upper'), limit}} of the fitted values of ``f`` that
    ended on a bound of their box (``calibrate`` prints and records each)."""
    out = {}
    for slot in f.slots:
        v = f.params[slot.key]
        side = _at_bound(v, slot.param.lo, slot.param.hi)
        if side:
            out[slot.key] = {"value": _round(v, 6), "bound": side,
                             "limit": slot.param.lo if side == "lower" else slot.param.hi}
    return out


def at_bound_section(bounded: dict) -> dict:
    """The calibration's ``at_bound`` entries of the values ``at_bound`` found on a bound, each with
    its note."""
    return {k: {**v, "note": f"{k.split('.', 1)[1]} ended on its {v['bound']} bound {v['limit']:g}: "
                             f"the rows ask for a value beyond the range the fit allows; predictions "
                             f"using it are likely off by more than their band"}
            for k, v in bounded.items()}


def residual_logs(lso, leo, in_sample) -> dict:
    """{residual column: log(measured / predicted) per row} of the errors (predicted / measured - 1)
    leaving sources out, leaving engines out and in sample (None: not computed, column left out)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return {col: -np.log1p(e) for col, e in (("log_lso", lso), ("log_leo", leo), ("log_in_sample", in_sample))
                if e is not None}


def _round(v, digits: int = 4):
    if isinstance(v, (int, np.integer)):
        return int(v)
    return float(f"{float(v):.{digits}g}")


# --------------------------------------------------------------------------- the command

@dataclass
class Calibration:
    """What ``calibrate`` did: per class the fit, its errors and cross-validation."""

    measured: Path
    out: Path
    classes: dict          # class -> {"fit": Fit, "rows": [...], "loho": ..., "lomo": ...}
    unpredictable: list
    data: dict             # what was written


def _stats_by(rows: list, errors: np.ndarray, key: str) -> dict:
    groups: dict[str, list] = {}
    for r, e in zip(rows, errors):
        groups.setdefault(getattr(r, key), []).append(abs(e))
    return {k: {kk: _round(vv) for kk, vv in ape_stats(v).items()} for k, v in sorted(groups.items())}


def _measured_files(measured) -> list[Path]:
    """The measured-results files to fit: ``measured`` (a path or a list of them), default every
    file dse ships (``measured_files``)."""
    if not measured:
        return measured_files()
    return [Path(m) for m in (measured if isinstance(measured, (list, tuple)) else [measured])]


def read_cases(files: list[Path]) -> tuple[list[Case], list, int]:
    """(the predictable rows of the measured ``files`` ready to fit, the others with the reason,
    the number of scored rows): the rows ``calibrate`` fits."""
    cases, skipped, scored = [], [], 0
    for src in files:
        table = read_table(src)
        cs, sk = prepare_all(table.rows)
        cs, late = _runnable(cs)
        cases += cs
        skipped += sorted(table.unpredictable + sk + late, key=lambda t: t[0].line)
        scored += len(table.rows) + len(table.unpredictable)
    return cases, skipped, scored


def calibrate(measured=None, out=None, *, cross_validation: bool = True, starts: int = 3,
              params=None, progress=None, workers: int = 1, leave_out=CV_KEYS,
              fold_evaluations: int | None = None) -> Calibration:
    """Fit, cross-validate and write the calibration file ``out`` (default ``DEFAULT_OUT``, inside
    the run folder; never the shipped file unless asked for) from ``measured`` (a CSV or a list;
    default: every measured file dse ships). One fit of the engine layer with the kernel layer
    held fixed: per launch class, all-reduce algorithm and engine with enough rows its costs,
    scales and overlap (``slots_for``); an engine with fewer rows is a prior engine
    (``prior_engines``). A value that ends on its bound is recorded (``at_bound``), and the hardware
    families each fitted engine's rows covered (``engine_families``: its values hold there only).
    Cross-validation leaves out sources (in folds), vendors and engines, every fold counted
    (``fold_totals``); the leave-sources-out residuals give the error bands and the
    leave-engines-out residuals the band of unseen engines (``dse.core.bands``). ``progress``
    (optional, ``calibration_cli.FitProgress``) is told the least-squares runs to come
    (``plan(cold, warm)``: cold starts of the full fit, warm-started cross-validation folds), then
    of every evaluation and every run's end (a fold's once it finished, in whichever process);
    ``workers`` > 1 fits the cross-validation folds in that many processes (the same results);
    ``leave_out``: the groupings cross-validated (default every one of ``CV_KEYS``; the band of
    unseen engines needs 'engine'); ``fold_evaluations``: the evaluations each fold's warm fit may
    take (default ``WARM_NFEV``)."""
    files = _measured_files(measured)
    dest = Path(out) if out else DEFAULT_OUT
    cases, skipped, scored = read_cases(files)
    params = tuple(params or FIT)
    if len(cases) < MIN_ROWS:
        raise DseError(f"{', '.join(map(str, files))}: {len(cases)} predictable rows; a fit needs {MIN_ROWS} or more")
    slots = slots_for(cases, params)
    if progress is not None:
        cold = fits_to_run(cases, False, starts)
        progress.plan(cold, fits_to_run(cases, cross_validation, starts, tuple(leave_out)) - cold)
    today = _dt.date.today().isoformat()
    digest = hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()[:16]
    f = fit(Predictions(cases), None, params, starts=starts, progress=progress, slots=slots)
    rws = [c.row for c in cases]
    ins = {k: _round(v) for k, v in ape_stats(np.abs(f.errors)).items()}
    labelled = [replace(r, framework=c.engine.name) for r, c in zip(rws, cases)]
    err = {"in_sample": ins, "per_metric": _stats_by(rws, f.errors, "metric"),
           "per_engine": _stats_by(labelled, f.errors, "framework"),
           "per_hardware": _stats_by(rws, f.errors, "hardware"), "per_model": _stats_by(rws, f.errors, "model")}
    cv, res = {}, {"fit": f, "rows": rws, "cases": cases}
    done = cross_validate_all(cases, params, keys=tuple(leave_out) if cross_validation else (), starts=starts,
                              progress=progress, warm=f.params, workers=workers, warm_nfev=fold_evaluations)
    for key, (e, folds) in done.items():
        res[key] = e
        cv[f"leave_{key}s_out"] = {**_slice_stats(cases, e), "totals": fold_totals(folds), "folds": folds}
    note_err = (f"in-sample median APE {100 * ins['median_ape']:.1f} %, p90 {100 * ins['p90_ape']:.1f} % "
                f"over {ins['n']} rows")
    if cv:
        note_err += "; cross-validated " + ", ".join(
            f"{n.replace('_', '-')} {100 * v['all']['median_ape']:.1f} % / {100 * v['all']['p90_ape']:.1f} %"
            for n, v in cv.items())
    bounded = at_bound(f)
    sections: dict[str, dict] = {"families": {}, "launch": {}, "allreduce": {}, "engines": {}}
    for slot in f.slots:
        v = f.params[slot.key]
        side = bounded.get(slot.key)
        sections[slot.section].setdefault(slot.group, {})[slot.param.name] = {
            "value": _round(v, 6),
            "note": f"fitted by 'python -m dse.study calibrate' on {today}"
                    + (f" (AT ITS {side['bound'].upper()} BOUND {side['limit']:g})" if side else "")
                    + f"; {note_err}"}
    priors = prior_engines(cases)
    logs = residual_logs(res.get("source"), res.get("engine"), f.errors)
    table = residual_rows(cases, priors, logs) + dataflow_residual_rows()
    write_residuals(residuals_path(dest), table)
    bands, coverage = band_sections(table)
    coverage["residuals"] = residuals_path(dest).name
    data = {
        "fitted": {
            "by": "python -m dse.study calibrate", "measured": [_display_path(p) for p in files], "sha256": digest,
            "date": today,
            "rows": {"scored": scored, "predicted": len(cases), "unpredictable": len(skipped)},
            "method": f"scipy.optimize.least_squares, loss {LOSS} (f_scale {F_SCALE}) on log(predicted / measured), "
                      f"each row's loss weighted so that every source weighs the same (source_weights), a finite "
                      f"run's queued TTFT and E2E left out (QUEUE_FAMILIES), "
                      f"bounded parameters, best of {starts} starts; the engine layer alone (launch classes, "
                      f"all-reduce algorithms, engines with {MIN_ROWS} rows or more: dse.fit.calibrate.slots_for) "
                      f"with the kernel layer held fixed (kernel_layer)",
            "parameters": {p.name: {"what": p.what, "bounds": [p.lo, p.hi]} for p in params},
        },
        **sections,
        "engine_families": engine_families(cases, f.slots),
        "error": err,
        "cross_validation": cv,
        "bands": bands,
        "band_coverage": coverage,
        "at_bound": at_bound_section(bounded),
        "prior_engines": priors,
        "kernel_layer": {
            "held_fixed": list(KERNEL_LAYER),
            "note": "hardware (kernel) fractions are not fitted on end-to-end rows: each family keeps its cited "
                    "prior (dse.core.efficiency.FAMILY_PRIORS) until measured kernel tables replace it",
            "families": {fam: {k: _round(v) for k, v in family_parameters(fam, fitted={})[0].items()}
                         for fam in sorted({family_of(c.device) for c in cases})}},
        "not_fitted": dict(NOT_FITTED),
        "unpredictable": {r.id: str(why) for r, why in skipped},
    }
    write_calibration(dest, data)
    return Calibration(files[0] if len(files) == 1 else files, dest, res, skipped, data)


#: the columns of the residual file ``calibrate`` writes beside its calibration (``residuals_path``):
#: a row's id and source, its engine and the engine whose band it takes (``band_engine``: the engine,
#: ``(prior)`` for a prior engine's row, ``dataflow`` on a spatial machine), its vendor, hardware
#: family and metric family, which layer's fit left the residual (``engine`` or ``dataflow``), the
#: measured value, and its log residuals log(measured / predicted) in the metric family's sense
#: (``dse.core.bands.oriented``) leaving its sources out, its engine out, and in sample (empty where
#: none)
RESIDUAL_COLUMNS = ("id", "source", "engine", "band_engine", "vendor", "hardware_family", "family", "layer",
                    "measured", "log_lso", "log_leo", "log_in_sample")
#: the vendor rows ``dse.core.dataflow.LAYER_LATENCY_S`` is fitted on (data/gathered/spatial.csv)
#: and the format each is priced at: Groq's rows state none (INT8 assumed, as in the fit: the
#: 70B model's weights fit the LPUs' SRAM so), Cerebras's state 16-bit weights; at the fit's
#: batch 1, prompt 512 and 256 generated tokens, chips sized by capacity
DATAFLOW_FIT_ROWS = {"S001": "int8", "S002": "int8", "S003": "fp16", "S004": "fp16"}
DATAFLOW_LENGTHS = (512, 256)


def residuals_path(calibration: Path) -> Path:
    """The residual file beside the calibration file ``calibration``: NAME_residuals.csv."""
    calibration = Path(calibration)
    return calibration.with_name(f"{calibration.stem}_residuals.csv")


def band_label(case: Case, priors: dict) -> str:
    """The engine whose bands a row's prediction takes: ``DATAFLOW`` on a spatial machine (no
    engine runs there), ``PRIOR_LABEL`` for a prior engine, else its engine."""
    if device_class(case.device.device_class).dataflow:
        return DATAFLOW
    return PRIOR_LABEL if case.engine.name in priors else case.engine.name


def residual_rows(cases: list[Case], priors: dict, logs: dict) -> list[dict]:
    """One ``RESIDUAL_COLUMNS`` row per case: ``logs`` {column: log(measured / predicted) per
    case} (a column absent or NaN: empty), oriented to the metric family's sense."""
    metrics = [c.row.metric for c in cases]
    sensed = {k: oriented(v, metrics) for k, v in logs.items()}
    return [{"id": c.row.id, "source": c.row.source or "", "engine": c.engine.name, "band_engine": band_label(c, priors),
             "vendor": group_of(c, "vendor"), "hardware_family": family_of(c.device),
             "family": family_of_metric(c.row.metric), "layer": "engine", "measured": c.row.value,
             **{k: (sensed[k][i] if k in sensed else np.nan) for k in ("log_lso", "log_leo", "log_in_sample")}}
            for i, c in enumerate(cases)]


def dataflow_residual_rows() -> list[dict]:
    """The in-sample residuals the dataflow layer's per-layer latency (``LAYER_LATENCY_S``) leaves on
    the vendor rows it is fitted on (``DATAFLOW_FIT_ROWS``), each predicted by the one evaluator at
    the fit's conditions: ``RESIDUAL_COLUMNS`` rows, layer 'dataflow', metric family TPOT (the rows
    are tokens/s per user)."""
    with shipped("data", "gathered", "spatial.csv").open(encoding="utf-8") as fh:
        rows = {r["id"]: r for r in csv.DictReader(fh) if r.get("id") in DATAFLOW_FIT_ROWS}
    out = []
    for rid, fmt in DATAFLOW_FIT_ROWS.items():
        r = rows.get(rid)
        if r is None:
            continue
        cols = dict(model=r["model_slug"], hardware=r["hardware_slug"], weights=fmt, activations=fmt, kv=fmt,
                    batch=1, prompt_len=DATAFLOW_LENGTHS[0], gen_len=DATAFLOW_LENGTHS[1])
        metric = r["metric"]
        predicted = float(np.asarray(evaluate(cols)[metric])[0])
        measured = float(r["value"])
        device = load_device(r["hardware_slug"])
        log = float(oriented([np.log(measured / predicted)], [metric])[0])
        out.append({"id": rid, "source": r["source_url"], "engine": r["engine"], "band_engine": DATAFLOW,
                    "vendor": getattr(device, "vendor", "") or r["vendor"], "hardware_family": device.efficiency_family, "family": family_of_metric(metric),
                    "layer": DATAFLOW, "measured": measured, "log_lso": np.nan, "log_leo": np.nan,
                    "log_in_sample": log})
    return out


def dataflow_bands(rows: list[dict]) -> dict:
    """{slice: {n, low, high}} of the dataflow layer (``slice_key(DATAFLOW, vendor, ...)``) per metric
    family with rows: the small-sample normal prediction interval (``small_sample_band``) of the
    in-sample residuals of the dataflow rows of every spatial vendor pooled (one fitted value, a
    layer latency, per vendor), given to each vendor with rows of its own (a vendor without rows
    has no fitted latency, and no band)."""
    out = {}
    mine = [r for r in rows if r["layer"] == DATAFLOW and np.isfinite(r["log_in_sample"])]
    for fam in sorted({r["family"] for r in mine}):
        part = [r for r in mine if r["family"] == fam]
        vendors = sorted({r["vendor"] for r in part})
        band = small_sample_band([r["log_in_sample"] for r in part], fitted=len(vendors))
        if band is not None:
            for vendor in vendors:
                out[slice_key(DATAFLOW, "", vendor, fam)] = {"n": len(part), "low": float(f"{band[0]:.4g}"),
                                                             "high": float(f"{band[1]:.4g}")}
    return out


def band_sections(rows: list[dict]) -> tuple[dict, dict]:
    """(the calibration's ``bands``, its ``band_coverage``) from residual rows (``RESIDUAL_COLUMNS``):
    the conformal bands of the engine layer's leave-sources-out residuals per slice and of its
    leave-engines-out residuals for unseen engines, the dataflow layer's bands, and their coverage
    of rows each band did not see (``dse.core.bands.held_out_coverage``; in sample where the rows
    have no leave-sources-out residuals)."""
    eng = [r for r in rows if r["layer"] == "engine"]
    cv = any(np.isfinite(r["log_lso"]) for r in eng)
    lso = np.array([r["log_lso" if cv else "log_in_sample"] for r in eng], dtype=float)
    leo = np.array([r["log_leo"] for r in eng], dtype=float)
    labels, vendors, fams = ([r[k] for r in eng] for k in ("band_engine", "vendor", "family"))
    flow = dataflow_bands(rows)
    bands = bands_from(lso, labels, vendors, fams)
    bands.update(unseen_bands(np.where(np.array(labels) == DATAFLOW, np.nan, leo), fams, vendors))
    bands.update(flow)
    cover = held_out_coverage(lso, leo, labels, vendors, fams, extra=flow)
    unseen = cover.pop("unseen_engines", None)
    coverage = {
        "method": (f"split-conformal bands ({100 * COVERAGE:.0f} %: the ceil((n + 1) x 0.95)-th residual from each "
                   f"end of a slice of n >= {BAND_MIN_ROWS} rows, else the next slice); covered: the share of rows "
                   f"whose measurement lies within the band of their slice computed without that row, around their "
                   + ("leave-sources-out prediction" if cv else "in-sample prediction (no cross-validation run)")
                   + " (rows without a prediction or a band count as not covered); median_width: the median over "
                     "rows of high / low"),
        "target": COVERAGE, **cover}
    if unseen is not None:
        coverage["unseen_engines"] = {
            "method": "the unseen engines' band, computed without the row, around each row's leave-engines-out "
                      "prediction", **unseen}
    dataflow_rows = [r for r in rows if r["layer"] == DATAFLOW]
    if dataflow_rows:
        coverage["dataflow"] = {
            "method": "spatial machines' band (layer=dataflow): a normal prediction interval with Student's t "
                      "quantile of the in-sample residuals the per-layer latency (dse.core.dataflow) leaves on the "
                      "vendor rows it is fitted on, one latency per hardware family; with so few rows it is wide, "
                      "and not checked on rows it did not see",
            "rows": len(dataflow_rows), "families": sorted({r["hardware_family"] for r in dataflow_rows})}
    return bands, coverage


def write_residuals(path: Path, rows: list[dict]) -> None:
    """Write residual rows (``RESIDUAL_COLUMNS``) to ``path`` as CSV, so that bands can be
    recomputed without a refit (``calibrate --bands-only``)."""
    def cell(v):
        if isinstance(v, (float, np.floating)):
            return f"{float(v):.6g}" if np.isfinite(v) else ""
        return str(v)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(RESIDUAL_COLUMNS)
    for r in rows:
        w.writerow([cell(r[k]) for k in RESIDUAL_COLUMNS])
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DseError(f"cannot write residual file {path}: {e.strerror}") from None
    write_text_atomic(path, buf.getvalue())


def read_residuals(path: Path) -> list[dict]:
    """The residual rows of ``path`` (``write_residuals``'s CSV): numbers as floats (NaN where
    empty); DseError naming the file and what is wrong."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise DseError(f"{path}: cannot read the residual file: {e.strerror or e} (written by 'calibrate' beside "
                       f"its calibration file)") from None
    reader = csv.DictReader(io.StringIO(text))
    missing = [k for k in RESIDUAL_COLUMNS if k not in (reader.fieldnames or [])]
    if missing:
        raise DseError(f"{path}: column {missing[0]!r} is missing; expected {', '.join(RESIDUAL_COLUMNS)}")
    out = []
    for line, r in enumerate(reader, start=2):
        row = {k: r[k] for k in RESIDUAL_COLUMNS}
        for k in ("measured", "log_lso", "log_leo", "log_in_sample"):
            try:
                row[k] = float(r[k]) if r[k] else np.nan
            except ValueError:
                raise DseError(f"{path}: line {line}: {k}: expected a number or nothing") from None
        if row["layer"] not in ("engine", DATAFLOW):
            raise DseError(f"{path}: line {line}: layer: expected engine or {DATAFLOW}")
        out.append(row)
    return out


def recompute_bands(calibration: Path) -> dict:
    """Recompute the ``bands`` and ``band_coverage`` of the calibration file ``calibration`` from
    the residual file beside it (``residuals_path``) without a refit, the dataflow layer's rows
    priced again (the current ``LAYER_LATENCY_S``), and write both files back; returns the new
    calibration data."""
    import yaml

    calibration = Path(calibration)
    load_calibration(str(calibration))                  # a calibration file, checked
    data = yaml.safe_load(calibration.read_text(encoding="utf-8"))
    rows = [r for r in read_residuals(residuals_path(calibration)) if r["layer"] == "engine"]
    rows += dataflow_residual_rows()
    bands, coverage = band_sections(rows)
    coverage["residuals"] = residuals_path(calibration).name
    data["bands"], data["band_coverage"] = bands, coverage
    write_residuals(residuals_path(calibration), rows)
    write_calibration(calibration, data)
    return data


def _slice_stats(cases: list[Case], errors: np.ndarray) -> dict:
    """APE statistics of cross-validated errors: all rows, and per engine, vendor and metric family."""
    ok = np.isfinite(errors)
    out = {"all": {k: _round(v) for k, v in ape_stats(np.abs(errors[ok])).items()}}
    for key, of in (("engine", lambda c: c.engine.name), ("vendor", lambda c: group_of(c, "vendor")),
                    ("metric_family", lambda c: family_of_metric(c.row.metric))):
        groups: dict[str, list] = {}
        for c, e in zip(cases, errors):
            if np.isfinite(e):
                groups.setdefault(of(c), []).append(abs(e))
        out[f"per_{key}"] = {g: {k: _round(v) for k, v in ape_stats(v).items()} for g, v in sorted(groups.items())}
    return out


#: metric families of a finite run past the capacity that the fit leaves out (``_runnable``): its TTFT and
#: end-to-end latency are mostly the queue's wait, set by how far the run's rate exceeds the capacity
#: (a few per cent of capacity error is a wait many times the service) and by the engine's admission
#: cap, so they would fit the queue, not the engine; they are still validated. Its throughput and
#: TPOT are fitted.
QUEUE_FAMILIES = ("ttft", "e2e")
QUEUED_NOT_FITTED = ("a finite run past the capacity: its TTFT and end-to-end latency are the queue's wait, "
                     "validated, not fitted")


def _runnable(cases: list[Case]) -> tuple[list[Case], list]:
    """(the cases the kernel layer under neutral engines predicts, the others with the reason): an
    open loop the design does not serve (saturated) has no prediction to fit. The choice does not
    depend on the calibration in use, so that calibrating again fits the same rows; a finite run the
    design does not serve at once (queued, under neutral engines) leaves its latencies out
    (``QUEUE_FAMILIES``)."""
    if not cases:
        return cases, []
    pr = Predictions(cases).predict(Parameterisation(cases, []).efficiencies(np.zeros(0)))
    why = dict(pr.why)
    for i in np.flatnonzero(pr.burst):
        if family_of_metric(cases[i].row.metric) in QUEUE_FAMILIES:
            why[int(i)] = reason([QUEUED_NOT_FITTED], ["queued"])
    return [c for i, c in enumerate(cases) if i not in why], [(cases[i].row, why[i]) for i in sorted(why)]


def _display_path(p: Path) -> str:
    """``p`` as ``data/...`` when it is a file dse ships there (``data/gathered/NAME`` too), else as given."""
    root = shipped("data").resolve()
    try:
        return str(Path("data") / p.resolve().relative_to(root))
    except ValueError:
        return str(p)


HEADER = """\
# The engine layer fitted to measured end-to-end results by `python -m dse.study calibrate`, with the
# kernel layer (hardware fractions: dse.core.efficiency.FAMILY_PRIORS, cited) held fixed.
# dse.core.engines reads `launch`, `allreduce` and `engines` (an engine not listed there is a prior
# engine: `prior_engines`; an engine's values hold only on the hardware families its rows covered,
# `engine_families`, and it is a prior engine elsewhere); `bands` gives the error bands
# (dse.core.bands); `at_bound` lists every value that ended on its fit's bound; the other sections
# record how, when and how well they were
# fitted (every cross-validation fold counted: cross_validation.*.totals).
# Regenerate with: python -m dse.study calibrate --out configs/calibration.yaml   (in a checkout);
# python -m dse.study calibrate --engine NAME --out THIS_FILE refits one engine's own values, every
# other held (dse.fit.refit; recorded under `refits`).
# The per-row residuals the bands are made from are in NAME_residuals.csv beside this file (NAME: its
# name without .yaml); python -m dse.study calibrate --bands-only --out THIS_FILE recomputes `bands`
# and `band_coverage` from them without a refit.
"""


def write_calibration(path: Path, data: dict) -> None:
    import yaml

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DseError(f"cannot write calibration file {path}: {e.strerror}") from None
    write_text_atomic(path, HEADER + yaml.safe_dump(data, sort_keys=False, width=110, allow_unicode=True))
    load_calibration.cache_clear()


def _value_text(name: str, v: float) -> str:
    """A fitted parameter in its unit ('12.5 us' for a time), a fraction as a plain number."""
    return display.quantity_text(name, v) if display.kind_of(name) else f"{v:.4g}"


#: what a calibration section's group is, in the AT BOUND lines
_GROUP_WORD = {"engines": "engine", "launch": "launch class", "allreduce": "all-reduce", "families": "family"}


def bands_text(data: dict) -> list[str]:
    """The lines saying how well a calibration's bands cover rows they did not see, and how wide
    they are (its ``band_coverage``; none without one)."""
    cov = data.get("band_coverage") or {}
    if cov.get("covered") is None:
        return []

    def width(c):
        return f", median width x{c['median_width']:.2f} (high / low)" if c.get("median_width") else ""
    out = [f"\nerror bands: {100 * cov['covered']:.0f} % of {cov['rows']} rows within their band "
           f"(target {100 * cov['target']:.0f} %){width(cov)}; {cov['method']}"]
    unseen = cov.get("unseen_engines")
    if unseen:
        out.append(f"  unseen engines' band: {100 * unseen['covered']:.0f} % of {unseen['rows']} rows{width(unseen)} "
                   f"({unseen['method']})")
    flow = cov.get("dataflow")
    if flow:
        shown = ", ".join(f"{k} x{b['low']:.2f} .. x{b['high']:.2f} ({b['n']} rows)"
                          for k, b in (data.get("bands") or {}).items() if k.startswith(f"layer={DATAFLOW}"))
        out.append(f"  spatial machines: {shown or 'no band'} ({flow['method']})")
    return out


def report_text(cal: Calibration) -> str:
    """What ``calibrate`` fitted (each value beside its prior or start), its in-sample error and
    the cross-validated error per engine, vendor and metric family, and the bands' coverage."""
    out = [f"Calibrated on {', '.join(map(str, cal.data['fitted']['measured']))} -> {cal.out}"]
    f = cal.classes["fit"]
    out.append(f"{len(cal.classes['rows'])} rows, {f.nfev} evaluations")
    for slot in f.slots:
        v = f.params[slot.key]
        out.append(f"  {slot.section + ' ' + slot.group:28s} {slot.param.name:22s} {_value_text(slot.param.name, v)}")

    def line(name, s):
        return f"  {name:36s} {100 * s['median_ape']:5.1f} %  {100 * s['p90_ape']:5.1f} %  {s['n']:4d}"
    out.append("\nAPE                                    median     p90      n")
    out.append(line("in-sample", cal.data["error"]["in_sample"]))
    for name, cv in cal.data.get("cross_validation", {}).items():
        out.append(line(name.replace("_", "-"), cv["all"]))
        for group in ("per_engine", "per_vendor", "per_metric_family"):
            for k, s in cv[group].items():
                out.append(line(f"  {group[4:]} {k}", s))
    for name, cv in cal.data.get("cross_validation", {}).items():
        t = cv.get("totals") or {}
        out.append(f"\n{name.replace('_', '-')}: {t.get('folds', 0)} folds, {t.get('failed_folds', 0)} failed; "
                   f"{t.get('predicted_rows', 0)} of {t.get('rows', 0)} held-out rows predicted, "
                   f"{t.get('failed_rows', 0)} failed")
        out += [f"  {n} row(s): {why}" for why, n in (t.get("why") or {}).items()]
    out += bands_text(cal.data)
    priors = cal.data.get("prior_engines") or {}
    if priors:
        out.append(f"\nprior engines (fewer than {MIN_ROWS} rows: neutral scale 1.0, not fitted, never another "
                   f"engine's fit): {', '.join(priors)}")
    for key, b in (cal.data.get("at_bound") or {}).items():
        section, group, name = key.split(".")
        out.append(f"AT BOUND: {_GROUP_WORD[section]} {group}: {name} = {_value_text(name, b['value'])} is on its "
                   f"{b['bound']} bound {_value_text(name, b['limit'])}")
    if cal.unpredictable:
        out.append(f"\nunpredictable rows (not fitted): {len(cal.unpredictable)}")
        out += [f"  {r.id} (line {r.line}): {why}" for r, why in cal.unpredictable[:40]]
        if len(cal.unpredictable) > 40:
            out.append(f"  ... and {len(cal.unpredictable) - 40} more (listed in the calibration file)")
    return "\n".join(out)
