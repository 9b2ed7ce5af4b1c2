"""Error bands: how far a prediction may be from a measurement, from cross-validated residuals.

``dse.fit.calibrate`` predicts every measured row with a fit that has not seen the row's source
(leave-sources-out cross-validation) and keeps, per slice of rows, the 5th and 95th percentiles of
log(measured / predicted): the ``bands`` section of the calibration file. A slice is an engine, a
hardware vendor and a metric family (throughput, TTFT, TPOT, E2E); a prediction takes the band of
the narrowest slice with at least ``MIN_ROWS`` rows, widening in the order of ``LEVELS`` (engine and
vendor, then engine, then the engines never seen, then vendor, then the family alone, then every
row). A band is a pair of factors (low, high): the measurement is expected within predicted x
low ... predicted x high for 90 % of rows like it (``COVERAGE``).

A prior engine (one without enough rows to be fitted, ``dse.core.engines``) has no slice of its
own: it takes the band of unseen engines (``UNSEEN``), the residuals of leave-engines-out
cross-validation, where every engine is predicted as a prior engine is: wide, because it is.
"""
from __future__ import annotations

import numpy as np

from dse.core.efficiency import load_calibration
from dse.core.engines import CALIBRATED, PRIOR

#: the share of held-out rows a band is meant to cover, and its quantiles
COVERAGE = 0.9
QUANTILES = (0.05, 0.95)
#: a slice gives its own band only with at least this many rows
MIN_ROWS = 5
#: the engine name of the slices of engines predicted without rows of their own (leave-engines-out)
UNSEEN = "unseen"
#: slices from the narrowest to the widest: which of (engine, vendor) they keep; ``UNSEEN``: the
#: unseen engines' slice of the metric family
LEVELS = (("engine", "vendor"), ("engine",), UNSEEN, ("vendor",), (), None)
#: metric families with a band, and the family of each evaluator metric prefix
FAMILIES = ("throughput", "ttft", "tpot", "e2e")


def family_of_metric(metric: str) -> str:
    """The band family of an evaluator metric: ttft, tpot, e2e or throughput."""
    for fam, prefix in (("ttft", "ttft"), ("tpot", "tpot"), ("e2e", "e2e_latency")):
        if metric.startswith(prefix):
            return fam
    return "tpot" if metric == "output_tokens_per_s_per_user" else "throughput"


def slice_key(level: tuple | None, engine: str, vendor: str, family: str) -> str:
    """The name of a slice: 'engine=vllm vendor=amd family=ttft' ('all' for every row)."""
    if level is None:
        return "all"
    if level == UNSEEN:
        return f"engine={UNSEEN} family={family}"
    parts = [f"{k}={v}" for k, v in (("engine", engine), ("vendor", vendor)) if k in level]
    return " ".join(parts + [f"family={family}"])


def bands_from(residuals, engines, vendors, families) -> dict:
    """{slice: {n, low, high}} of log residuals log(measured / predicted) (arrays over rows, NaN
    rows skipped): the factors exp(10th percentile) and exp(90th) of every slice at every level."""
    r = np.asarray(residuals, dtype=float)
    ok = np.isfinite(r)
    out: dict[str, dict] = {}
    groups: dict[str, list] = {}
    for i in np.flatnonzero(ok):
        for level in LEVELS:
            if level == UNSEEN:
                continue
            groups.setdefault(slice_key(level, engines[i], vendors[i], families[i]), []).append(r[i])
    for key, vals in sorted(groups.items()):
        lo, hi = np.quantile(vals, QUANTILES)
        out[key] = {"n": len(vals), "low": float(f"{np.exp(lo):.4g}"), "high": float(f"{np.exp(hi):.4g}")}
    return out


def unseen_bands(residuals, families) -> dict:
    """{slice: {n, low, high}} of the unseen engines' slices (``slice_key(UNSEEN, ...)``) per metric
    family, from leave-engines-out log residuals (NaN rows skipped)."""
    r = np.asarray(residuals, dtype=float)
    out = {}
    for fam in sorted(set(families)):
        vals = r[np.isfinite(r) & (np.asarray(families) == fam)]
        if vals.size:
            lo, hi = np.quantile(vals, QUANTILES)
            out[slice_key(UNSEEN, "", "", fam)] = {"n": int(vals.size), "low": float(f"{np.exp(lo):.4g}"),
                                                   "high": float(f"{np.exp(hi):.4g}")}
    return out


def band_for(bands: dict, engine: str, vendor: str, family: str) -> tuple[float, float, str]:
    """(low, high, slice) of the narrowest slice with ``MIN_ROWS`` rows ((nan, nan, '') when the
    calibration has no bands)."""
    for level in LEVELS:
        key = slice_key(level, engine, vendor, family)
        b = bands.get(key)
        if b and b.get("n", 0) >= MIN_ROWS:
            return float(b["low"]), float(b["high"]), key
    return float("nan"), float("nan"), ""


def band_engine(efficiency_name: str, engine: str) -> str:
    """The engine whose slices give the band of a prediction made under ``engine`` with the
    Efficiency called ``efficiency_name`` (``dse.core.engines.engine_efficiency``'s): ``UNSEEN``
    where it runs the engine as a prior engine (not fitted, or not fitted on that hardware family:
    its engine's slices describe other hardware; ``dse.core.engines.runs_as_prior``), else ``engine``."""
    return UNSEEN if efficiency_name.partition(" + ")[2].startswith(PRIOR) else engine


def shipped_bands(path: str | None = None) -> dict:
    """The ``bands`` section of the calibration in use (or ``path``); {} when it has none."""
    return load_calibration(path).get("bands") or {}


def covered(measured, predicted, low, high) -> np.ndarray:
    """True where a measurement lies within its prediction's band (arrays)."""
    m, p = np.asarray(measured, float), np.asarray(predicted, float)
    return (m >= p * np.asarray(low, float)) & (m <= p * np.asarray(high, float))


def band_source(efficiency_name: str) -> str:
    """Where the band of a prediction made with the Efficiency called ``efficiency_name``
    (``dse.core.engines.engine_efficiency``'s) comes from, in words, with a warning when one of
    its engine values ended on its fit's bound ('' for the ideal bound or a given Efficiency)."""
    engine = efficiency_name.partition(" + ")[2]
    if engine.startswith(PRIOR):
        text = (f"{100 * COVERAGE:.0f} % band of engines predicted without rows of their own "
                f"(leave-engines-out residuals): {engine.split(' (')[0]} is not fitted")
    elif engine.startswith(CALIBRATED):
        text = (f"{100 * COVERAGE:.0f} % band of the leave-sources-out residuals of its engine, vendor and "
                f"metric family")
    else:
        return ""
    if " bound " in engine:
        text += (f"; WARNING: {engine.partition(' (')[2].rstrip(')')} (the rows asked for a value beyond it): "
                 f"the error may exceed the band")
    return text
