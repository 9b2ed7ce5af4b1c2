"""Fit the efficiency parameters to measured results.

``calibrate(measured_csv)`` predicts every predictable scored row (as ``dse.fit.validate``
does: same batch, placement and engine profile), fits the parameters of ``FIT`` per
hardware class with ``scipy.optimize.least_squares`` (robust ``soft_l1`` loss on the log
of predicted / measured, parameters bounded, several starts), cross-validates the fit
leaving one hardware and one model out at a time, and writes ``configs/calibration.yaml``
(every fitted value with a note: fitted, from which file, when, with what error), which
``dse.core.efficiency.efficiency_for`` then loads as the default.

The fit prices one prepared plan of the rows (``dse.system.evaluator.prepare``: the same
evaluator as every other prediction) under each trial efficiency; after writing, the new
defaults are validated through the same evaluator, so the reported error is the one users get.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from basis.errors import DseError
from basis.files import write_text_atomic
from basis.shipped import shipped
from dse.core.efficiency import CLASS_PRIORS, Efficiency, load_calibration
from dse.fit.validate import Case, Predictions, ape_stats, default_measured, prepare_all, read_table
from dse.present import display

#: robust loss and its scale (log error ~10 % where it turns from quadratic to linear)
LOSS, F_SCALE = "soft_l1", 0.1
#: where ``calibrate`` writes when no --out is given (use it with DSE_CALIBRATION=...)
DEFAULT_OUT = Path("runs") / "calibrate" / "calibration.yaml"
#: a hardware class is fitted only with at least this many predictable rows
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
    Param("compute", 0.2, 1.0, False, 0.7, "fraction of peak of large GEMMs"),
    Param("compute_half_rows", 0.1, 64.0, True, 8.0,
          "GEMM rows (tokens) at half of the shape term; bounded so that batch-1 GEMVs stay memory-bound"),
    Param("memory", 0.3, 1.0, False, 0.85, "fraction of memory (and host-link) bandwidth"),
    Param("kv_reread_exponent", 0.0, 1.0, False, 0.9,
          "share (as an exponent) of per-query-head K/V re-reads that reach DRAM (legacy GQA kernels)"),
    Param("op_overhead_s", 1e-8, 1e-4, True, 5e-6, "fixed time per operator instance"),
    Param("step_overhead_s", 1e-7, 5e-2, True, 1e-3, "fixed time per step"),
    Param("request_overhead_s", 1e-6, 5e-2, True, 1e-3, "fixed time per request (in TTFT)"),
    Param("collective_latency_s", 1e-8, 1e-3, True, 1e-5, "software latency per collective (one launch per all-reduce or hop)"),
)

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
    "prefill_decode_overlap": "the in-flight-batching rows (trtllm-bench) fit within 14 % with it at 0; a free fit "
                              "gives 0.07 and a higher leave-one-hardware-out error; 0",
}


# --------------------------------------------------------------------------- fitting

def _to_x(p: Param, v: float) -> float:
    return float(np.log10(v)) if p.log else float(v)


def _from_x(p: Param, x: float) -> float:
    return float(10 ** x) if p.log else float(x)


@dataclass
class Fit:
    """Result of one fit: parameter values, errors per row (predicted / measured - 1)."""

    params: dict
    errors: np.ndarray
    cost: float
    nfev: int


def fit(predictors: Predictions, base: Efficiency, params=FIT, *, starts: int = 3, progress=None) -> Fit:
    """Least-squares fit of ``params`` (the others as in ``base``) to the rows of
    ``predictors``: robust loss on log(predicted / measured), bounded, best of ``starts``
    starting points (the documented start, then low and high corners of the box).
    ``progress`` (tqdm-like, optional) advances by one per start."""
    from scipy.optimize import least_squares

    measured = np.array([c.row.value for c in predictors.cases])
    lo = np.array([_to_x(p, p.lo) for p in params])
    hi = np.array([_to_x(p, p.hi) for p in params])

    def eff_of(x):
        return replace(base, **{p.name: _from_x(p, v) for p, v in zip(params, x)})

    def resid(x):
        e = eff_of(x)
        pred = predictors.values(e)
        with np.errstate(divide="ignore", invalid="ignore"):
            r = np.log(pred / measured)
        return np.where(np.isfinite(r), r, 10.0)

    x0 = np.clip([_to_x(p, p.start) for p in params], lo, hi)
    candidates = _starts(x0, lo, hi, starts)
    best = None
    for start in candidates:
        r = least_squares(resid, start, bounds=(lo, hi), loss=LOSS, f_scale=F_SCALE, diff_step=1e-3)
        if best is None or r.cost < best.cost:
            best = r
        _advance(progress)
    values = {p.name: _from_x(p, v) for p, v in zip(params, best.x)}
    return Fit(values, np.exp(resid(best.x)) - 1.0, float(best.cost), int(best.nfev))


def _starts(x0: np.ndarray, lo: np.ndarray, hi: np.ndarray, starts: int) -> list:
    """The starting points of a fit: the documented start, then the low and high corners."""
    return [x0, lo + 0.25 * (hi - lo), lo + 0.75 * (hi - lo)][:max(starts, 1)]


def _advance(progress, n: int = 1) -> None:
    if progress is not None:
        progress.update(n)


def _folds(cases: list[Case], key: str) -> dict[str, list[int]]:
    """Row positions of each ``key`` group (hardware or model) of ``cases`` that leaves rows to train on."""
    groups: dict[str, list[int]] = {}
    for i, c in enumerate(cases):
        groups.setdefault(getattr(c.row, key), []).append(i)
    return {g: idx for g, idx in sorted(groups.items()) if len(idx) < len(cases)}


def fits_to_run(by_class: dict, cross_validation: bool, starts: int) -> int:
    """How many least-squares runs ``calibrate`` makes: per class with enough rows, one fit and
    (cross-validating) one per hardware and per model fold, each of ``starts`` starts."""
    n = 0
    for cs in by_class.values():
        if len(cs) >= MIN_ROWS:
            n += 1 + (len(_folds(cs, "hardware")) + len(_folds(cs, "model")) if cross_validation else 0)
    return n * len(_starts(np.zeros(1), np.zeros(1), np.ones(1), starts))


def cross_validate(cases: list[Case], base: Efficiency, params=FIT, *, key: str = "hardware",
                   starts: int = 3, progress=None) -> tuple[np.ndarray, dict]:
    """Errors of every row predicted by a fit without its ``key`` group (hardware or
    model), and the parameters of each fold."""
    errors = np.full(len(cases), np.nan)
    folds = {}
    for g, idx in _folds(cases, key).items():
        train = [cases[i] for i in range(len(cases)) if i not in idx]
        f = fit(Predictions(train), base, params, starts=starts, progress=progress)
        eff = replace(base, **f.params)
        held = [cases[i] for i in idx]
        errors[idx] = Predictions(held).values(eff) / np.array([c.row.value for c in held]) - 1.0
        folds[g] = {"rows": len(idx), **{k: _round(v) for k, v in f.params.items()},
                    **{k: _round(v) for k, v in ape_stats(np.abs(errors[idx])).items()}}
    return errors, folds


def _at_bound(v: float, lo: float, hi: float) -> str:
    """' (at its lower bound)' when a fitted value sits on a bound of its box, else ''."""
    if v <= lo * (1 + 1e-3) + 1e-12 * (lo == 0):
        return f" (at its lower bound {lo:g}: the data ask for less)"
    if v >= hi * (1 - 1e-3):
        return f" (at its upper bound {hi:g})"
    return ""


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


def calibrate(measured=None, out=None, *, cross_validation: bool = True, starts: int = 3,
              params=None, progress=None) -> Calibration:
    """Fit, cross-validate and write the calibration file ``out`` (default
    ``DEFAULT_OUT``, inside the run folder; never the shipped file unless asked for).
    ``progress`` (tqdm-like, optional) gets the number of least-squares runs as its total
    (``reset``) and advances by one per run."""

    src = Path(measured) if measured else default_measured()
    dest = Path(out) if out else DEFAULT_OUT
    table = read_table(src)
    rows = table.rows
    cases, skipped = prepare_all(rows)
    cases, late = _runnable(cases)
    skipped = sorted(table.unpredictable + skipped + late, key=lambda t: t[0].line)
    params = tuple(params or FIT)
    by_class: dict[str, list[Case]] = {}
    for c in cases:
        by_class.setdefault(c.device.device_class, []).append(c)
    if progress is not None:
        progress.reset(total=fits_to_run(by_class, cross_validation, starts))
    today = _dt.date.today().isoformat()
    digest = hashlib.sha256(src.read_bytes()).hexdigest()[:16]
    results, classes_out, errors_out, cv_out = {}, {}, {}, {}
    too_few = {}
    for cls, cs in sorted(by_class.items()):
        if len(cs) < MIN_ROWS:
            too_few[cls] = f"{len(cs)} predictable rows (fewer than {MIN_ROWS}): priors kept"
            continue
        preds = Predictions(cs)
        base = Efficiency(name=f"fit {cls}", **CLASS_PRIORS[cls])
        f = fit(preds, base, params, starts=starts, progress=progress)
        rws = [c.row for c in cs]
        ins = {k: _round(v) for k, v in ape_stats(np.abs(f.errors)).items()}
        res = {"fit": f, "rows": rws}
        err = {"in_sample": ins, "per_metric": _stats_by(rws, f.errors, "metric"),
               "per_hardware": _stats_by(rws, f.errors, "hardware"), "per_model": _stats_by(rws, f.errors, "model")}
        cv = {}
        if cross_validation:
            for key, name in (("hardware", "leave_one_hardware_out"), ("model", "leave_one_model_out")):
                e, folds = cross_validate(cs, base, params, key=key, starts=starts, progress=progress)
                res[key] = e
                cv[name] = {**{k: _round(v) for k, v in ape_stats(np.abs(e[np.isfinite(e)])).items()},
                            "folds": folds}
        note_err = (f"in-sample median APE {100 * ins['median_ape']:.1f} %, p90 {100 * ins['p90_ape']:.1f} % "
                    f"over {ins['n']} rows")
        if cv:
            note_err += "; cross-validated " + ", ".join(
                f"{n.replace('_', '-')} {100 * v['median_ape']:.1f} % / {100 * v['p90_ape']:.1f} %"
                for n, v in cv.items())
        bounds = {p.name: (p.lo, p.hi) for p in params}
        classes_out[cls] = {k: {"value": _round(v, 6),
                                "note": f"fitted by 'python -m dse.study calibrate' from {src.name} on {today}"
                                        f"{_at_bound(v, *bounds[k])}; {note_err}"}
                            for k, v in f.params.items()}
        errors_out[cls] = err
        if cv:
            cv_out[cls] = cv
        results[cls] = res
    if not classes_out:
        raise DseError(f"{src}: no hardware class has {MIN_ROWS} or more predictable rows to fit")
    not_fitted = dict(NOT_FITTED)
    data = {
        "fitted": {
            "by": "python -m dse.study calibrate", "measured": _display_path(src), "sha256": digest, "date": today,
            "rows": {"scored": len(rows) + len(table.unpredictable), "predicted": len(cases),
                     "unpredictable": len(skipped)},
            "method": f"scipy.optimize.least_squares, loss {LOSS} (f_scale {F_SCALE}) on log(predicted / measured), "
                      f"bounded parameters, best of {starts} starts",
            "parameters": {p.name: {"what": p.what, "bounds": [p.lo, p.hi]} for p in params},
        },
        "classes": classes_out,
        "error": errors_out,
        "cross_validation": cv_out,
        "not_fitted": not_fitted,
        "priors_kept": too_few,
        "unpredictable": {r.id: str(why) for r, why in skipped},
    }
    write_calibration(dest, data)
    return Calibration(src, dest, results, skipped, data)


def _runnable(cases: list[Case]) -> tuple[list[Case], list]:
    """(the cases the efficiency in use predicts, the others with the reason): an open loop the
    design does not serve (saturated) has no prediction to fit."""
    if not cases:
        return cases, []
    why = Predictions(cases).predict().why
    return [c for i, c in enumerate(cases) if i not in why], [(cases[i].row, why[i]) for i in sorted(why)]


def _display_path(p: Path) -> str:
    """``p`` as ``data/NAME`` when it is a file dse ships there, else as given."""
    shipped_copy = shipped("data", p.name)
    return f"data/{p.name}" if shipped_copy.is_file() and shipped_copy.resolve() == p.resolve() else str(p)


HEADER = """\
# Efficiency parameters fitted to measured results by `python -m dse.study calibrate`.
# dse.core.efficiency.efficiency_for() reads `classes` (the defaults of `analyze`, `validate`
# and sweeps); the other sections record how, when and how well they were fitted.
# Regenerate with: python -m dse.study calibrate --out configs/calibration.yaml   (in a checkout)
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


def report_text(cal: Calibration) -> str:
    out = [f"Calibrated on {cal.measured} -> {cal.out}"]
    for k in ("collective_latency_s", "request_overhead_s"):
        if k in cal.data["not_fitted"]:
            out.append(f"  note: {k} not fitted: {cal.data['not_fitted'][k]}")
    for cls, res in cal.classes.items():
        f = res["fit"]
        prior = Efficiency(**CLASS_PRIORS[cls])
        out.append(f"\nclass {cls}: {len(res['rows'])} rows, {f.nfev} evaluations")
        for k, v in f.params.items():
            out.append(f"  {k:24s} {_value_text(k, v)}   (prior {_value_text(k, prior.resolved(k))})")
        err = cal.data["error"][cls]
        out.append("  APE                      median     p90      n")

        def line(name, s):
            return f"  {name:24s} {100 * s['median_ape']:5.1f} %  {100 * s['p90_ape']:5.1f} %  {s['n']:4d}"
        out.append(line("in-sample", err["in_sample"]))
        for k, s in cal.data.get("cross_validation", {}).get(cls, {}).items():
            out.append(line(k.replace("_", "-"), s))
        for group in ("per_metric", "per_hardware"):
            for k, s in err[group].items():
                out.append(line(f"  {k}", s))
    if cal.unpredictable:
        out.append("\nunpredictable rows (not fitted):")
        out += [f"  {r.id} (line {r.line}): {why}" for r, why in cal.unpredictable]
    return "\n".join(out)
