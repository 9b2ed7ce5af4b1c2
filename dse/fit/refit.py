"""Refit named engines' own values on their rows, every other value of the calibration held.

``calibrate`` fits the whole engine layer at once: the launch classes and all-reduce algorithms
every engine shares, and each engine's own values (scheduler cost per step, bandwidth and compute
scales, per-request cost, overlap). ``calibrate --engine NAME`` (``refit``) fits only the named
engines' own values, on those engines' rows alone, with every other value held at the calibration
in use (``dse.core.efficiency.calibration_file``: the shipped file, or ``DSE_CALIBRATION``): the
shared classes and every other engine's values are unchanged, so every prediction of another
engine stays what it was. It is how one engine's profile is brought up to date (new rows, a
launch class of its own) without refitting the others on rows they already fit.

The rows are cross-validated as ``calibrate`` does: leaving sources out (each fold refitted on the
others, warm from the refit), and leaving the engine out (the engine predicted as a prior engine,
``dse.core.engines.NEUTRAL``, with the values held: no fit is needed for that, since no other
engine's rows fit its values). Those rows' residuals replace the engines' in the residual file
beside the calibration, and the bands and their coverage are recomputed from it
(``calibrate.band_sections``); the other rows' residuals are kept as they were. The new file
records the refit under ``refits`` (date, rows, files, errors before and after); the ``error`` and
``cross_validation`` sections stay the joint fit's.
"""
from __future__ import annotations

import copy
import datetime as _dt
import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from basis.errors import DseError
from dse.core.efficiency import CALIBRATION_FILE, calibration_file, family_of, load_calibration
from dse.core.engines import engines
from dse.fit.calibrate import (
    DEFAULT_OUT,
    FIT,
    MIN_ROWS,
    Held,
    Parameterisation,
    _display_path,
    _measured_files,
    _round,
    _slice_stats,
    _value_text,
    at_bound,
    at_bound_section,
    band_sections,
    bands_text,
    cross_validate_all,
    dataflow_residual_rows,
    engine_families,
    fit,
    fold_totals,
    folds_of,
    read_cases,
    read_residuals,
    residual_logs,
    residual_rows,
    residuals_path,
    write_calibration,
    write_residuals,
)
from dse.fit.validate import Case, Predictions, ape_stats
from dse.present import display

#: the sections of a calibration file that hold values (``Held.sections``)
VALUE_SECTIONS = ("launch", "allreduce", "engines")


def held_sections(data: dict, names: tuple = ()) -> dict:
    """The values of the calibration ``data`` (its file's mapping) as numbers, in its layout, without
    the engines ``names``'s own, with its ``engine_families``."""
    out: dict = {}
    for sec in VALUE_SECTIONS:
        for group, vals in (data.get(sec) or {}).items():
            if sec == "engines" and group in names:
                continue
            out.setdefault(sec, {})[group] = {k: float(v["value"] if isinstance(v, dict) else v)
                                              for k, v in (vals or {}).items()}
    out["engine_families"] = {k: list(v) for k, v in (data.get("engine_families") or {}).items()}
    return out


def source_text(path) -> str:
    """How a refit names the calibration it held its other values at: the shipped file as
    configs/calibration.yaml (the fit its ``fitted`` section records), another by its path."""
    path = Path(path)
    return "configs/calibration.yaml" if path.resolve() == Path(CALIBRATION_FILE).resolve() else str(path)


def _errors(cases: list[Case], sections: dict) -> np.ndarray:
    """predicted / measured - 1 of every row of ``cases`` under the values ``sections`` (NaN where
    none is predicted)."""
    pr = Predictions(cases).predict(Parameterisation(cases, [], held=sections).efficiencies(np.zeros(0)))
    with np.errstate(divide="ignore", invalid="ignore"):
        return pr.values / np.array([c.row.value for c in cases]) - 1.0


@dataclass
class Refit:
    """What ``refit`` did: the engines, their rows, the fit, and the rows' errors before (the
    calibration in use), in sample, leaving sources out and leaving the engine out."""

    engines: tuple
    files: list                   # the measured files read
    source: Path                  # the calibration file the other values were held at
    out: Path
    cases: list
    fit: object                   # calibrate.Fit
    before: dict                  # engine -> {parameter: value} of the calibration in use
    errors: dict                  # "before", "in_sample", "leave_sources_out", "leave_engines_out" -> [R]
    data: dict                    # what was written


def _checked_names(names) -> tuple:
    known = engines()
    names = tuple(dict.fromkeys(str(n) for n in names))
    for n in names:
        if n not in known:
            raise DseError(f"calibrate --engine: unknown engine {n!r}; allowed: {', '.join(known)}")
    return names


def refit(names, measured=None, out=None, *, cross_validation: bool = True, starts: int = 3, progress=None,
          workers: int = 1, fold_evaluations: int | None = None) -> Refit:
    """Refit the own values of the engines ``names`` on their rows of ``measured`` (default every
    measured file dse ships), every other value held at the calibration in use, and write the
    calibration ``out`` (default ``calibrate.DEFAULT_OUT``) with its residual file beside it (see
    the module docstring). DseError for an unknown engine or one with fewer than ``MIN_ROWS``
    predictable rows."""
    names = _checked_names(names)
    source = calibration_file()
    load_calibration(str(source))                     # a calibration file, checked
    current = yaml.safe_load(Path(source).read_text(encoding="utf-8"))
    files = _measured_files(measured)
    dest = Path(out) if out else DEFAULT_OUT
    every, _, _ = read_cases(files)
    cases = [c for c in every if c.engine.name in names]
    for n in names:
        have = sum(c.engine.name == n for c in cases)
        if have < MIN_ROWS:
            raise DseError(f"calibrate --engine {n}: {have} predictable rows of {n} in "
                           f"{', '.join(_display_path(p) for p in files)}; a refit needs {MIN_ROWS} or more")
    kept = [r for r in read_residuals(residuals_path(source))      # read before the fit, not after it
            if r["layer"] == "engine" and r["engine"] not in names]
    sections = held_sections(current, names)
    sections["engine_families"].update(      # the named engines' values hold on their rows' families
        {n: sorted({family_of(c.device) for c in cases if c.engine.name == n}) for n in names})
    held = Held(sections, names)
    if progress is not None:
        progress.plan(max(starts, 1), len(folds_of(cases, "source")) if cross_validation else 0)
    f = fit(Predictions(cases), None, FIT, starts=starts, progress=progress, held=held)
    in_use = held_sections(current)
    errors = {"before": _errors(cases, in_use), "in_sample": f.errors}
    folds: dict = {}
    if cross_validation:
        e, folds = cross_validate_all(cases, FIT, keys=("source",), starts=starts, progress=progress,
                                      warm=f.params, workers=workers, warm_nfev=fold_evaluations,
                                      held=held)["source"]
        errors["leave_sources_out"] = e
    errors["leave_engines_out"] = _errors(cases, held.sections)     # each engine a prior engine
    data = _written(current, source, files, cases, f, errors, folds, names, dest, kept)
    before = {n: in_use.get("engines", {}).get(n, {}) for n in names}
    return Refit(names, files, Path(source), dest, cases, f, before, errors, data)


def _written(current: dict, source, files, cases, f, errors: dict, folds: dict, names: tuple, dest: Path,
             kept: list) -> dict:
    """The calibration mapping ``refit`` writes (and writes it, its residual file beside it, the
    other engines' residual rows ``kept`` as they were)."""
    today = _dt.date.today().isoformat()
    logs = residual_logs(errors.get("leave_sources_out"), errors["leave_engines_out"], errors["in_sample"])
    table = kept + residual_rows(cases, {}, logs) + dataflow_residual_rows()
    bands, coverage = band_sections(table)
    coverage["residuals"] = residuals_path(dest).name

    def stats(e):
        ok = np.isfinite(e)
        return {k: _round(v) for k, v in ape_stats(np.abs(e[ok])).items()}
    ins, lso = stats(errors["in_sample"]), stats(errors.get("leave_sources_out", np.full(1, np.nan)))
    said = (f"every other value held at {source_text(source)}; in-sample median APE "
            f"{100 * ins['median_ape']:.1f} %, p90 {100 * ins['p90_ape']:.1f} % over {ins['n']} rows"
            + (f"; leave-sources-out {100 * lso['median_ape']:.1f} % / {100 * lso['p90_ape']:.1f} %"
               if "leave_sources_out" in errors and lso.get("n") else ""))
    bounded = at_bound(f)
    data = copy.deepcopy(current)
    for n in names:
        data.setdefault("engines", {})[n] = {}
    for slot in f.slots:
        side = bounded.get(slot.key)
        data["engines"][slot.group][slot.param.name] = {
            "value": _round(f.params[slot.key], 6),
            "note": f"refitted by 'python -m dse.study calibrate --engine {' '.join(names)}' on {today} on the rows "
                    f"of {', '.join(names)} alone"
                    + (f" (AT ITS {side['bound'].upper()} BOUND {side['limit']:g})" if side else "") + f", {said}"}
    data["engine_families"] = {**(data.get("engine_families") or {}), **engine_families(cases, f.slots)}
    data["at_bound"] = {**{k: v for k, v in (data.get("at_bound") or {}).items()
                           if not (k.startswith("engines.") and k.split(".")[1] in names)},
                        **at_bound_section(bounded)}
    data["bands"], data["band_coverage"] = bands, coverage
    record = {
        "date": today, "by": f"python -m dse.study calibrate --engine {' '.join(names)}",
        "held": f"every value but these engines' own as in {source_text(source)}; the error and "
                f"cross_validation sections stay that file's joint fit",
        "measured": [_display_path(p) for p in files],
        "sha256": hashlib.sha256(b"".join(p.read_bytes() for p in files)).hexdigest()[:16],
        "rows": len(cases),
        "values_in_use": _slice_stats(cases, errors["before"]),     # under today's engine profiles
        "in_sample": _slice_stats(cases, errors["in_sample"]),
        "leave_engines_out": _slice_stats(cases, errors["leave_engines_out"]),
    }
    if "leave_sources_out" in errors:
        record["leave_sources_out"] = {**_slice_stats(cases, errors["leave_sources_out"]),
                                       "totals": fold_totals(folds), "folds": folds}
    data.setdefault("refits", {})
    for n in names:
        data["refits"][n] = copy.deepcopy(record)
    write_residuals(residuals_path(dest), table)
    write_calibration(dest, data)
    return data


def refit_text(r: Refit) -> str:
    """What ``refit`` changed: each engine's values before and after, the rows' APE before, in
    sample and cross-validated, per engine and metric family, and the bands' coverage."""
    out = [f"Refitted {', '.join(r.engines)} on {len(r.cases)} rows, every other value held at {r.source} -> {r.out}",
           "(before: the values of the calibration in use, under today's engine profiles)"]
    for slot in r.fit.slots:
        old = r.before.get(slot.group, {}).get(slot.param.name)
        was = "-" if old is None else _value_text(slot.param.name, old)
        out.append(f"  engine {slot.group:16s} {slot.param.name:22s} {was:>12s} -> "
                   f"{_value_text(slot.param.name, r.fit.params[slot.key])}")
    names = [k for k in ("before", "in_sample", "leave_sources_out", "leave_engines_out") if k in r.errors]
    stats = {k: _slice_stats(r.cases, r.errors[k]) for k in names}
    rows = []
    for group, label in (("all", None), ("per_engine", "engine"), ("per_metric_family", "metric")):
        keys = [None] if group == "all" else list(stats["in_sample"][group])
        for key in keys:
            row = {"group": "all rows" if key is None else f"{label} {key}"}
            for k in names:
                s = stats[k][group] if key is None else stats[k][group].get(key)
                row[k] = "" if not s or not s.get("n") else f"{100 * s['median_ape']:.1f} / {100 * s['p90_ape']:.1f} %"
            rows.append(row)
    out += ["", "APE, median / p90"]
    out.append(display.text_table(rows, [("group", "rows", str)] + [(k, k.replace("_", "-"), str) for k in names],
                                  left=("group",)))
    out += bands_text(r.data)
    for key, b in (r.data.get("at_bound") or {}).items():
        section, group, name = key.split(".")
        if section == "engines" and group in r.engines:
            out.append(f"AT BOUND: engine {group}: {name} = {_value_text(name, b['value'])} is on its "
                       f"{b['bound']} bound {_value_text(name, b['limit'])}")
    return "\n".join(out)
