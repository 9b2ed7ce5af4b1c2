"""Error bands: how far a prediction may be from a measurement, from cross-validated residuals.

``dse.fit.calibrate`` predicts every measured row with a fit that has not seen the row's source
(leave-sources-out cross-validation) and keeps its log residual log(measured / predicted) (the
residual file beside the calibration, ``calibrate --bands-only`` recomputes the bands from it).
A slice is an engine, a hardware vendor and a metric family (throughput, TTFT, TPOT, E2E). A
band is a pair of factors (low, high): the measurement is expected within predicted x low ...
predicted x high for ``COVERAGE`` (90 %) of rows like it, the row not among those that made the
band. It is a split-conformal interval (``conformal_band``): of a slice's n residuals sorted,
the k-th from the top and from the bottom, k = ceil((n + 1) (1 - a / 2)), a = 1 - ``COVERAGE``:
a new row exchangeable with the slice's lies outside on either side with probability at most
a / 2, whatever the residuals' distribution. That needs n >= ``MIN_ROWS`` (19 at 90 %: with
fewer the k-th order statistic does not exist); a smaller slice gives no band and a prediction
takes the next slice of its chain (``chain``): engine and vendor, engine, then the vendor, the
metric family alone, every row (the empirical 5th / 95th percentiles of a 5-row slice, used
before, covered 82 % of held-out rows instead of 90 %).

A prior engine (one without enough rows to be fitted, ``dse.core.engines``) has no slice of its
own: it takes the band of unseen engines (``UNSEEN``), the residuals of leave-engines-out
cross-validation, where every engine is predicted as a prior engine is: wide, because it is
(its hardware vendor's and metric family's, else its metric family's, else every family's unseen
residuals: a prior engine on NVIDIA GPUs takes the band of engines left out on NVIDIA GPUs, not
one widened by another vendor's engine predicted without its own values).

A spatial machine (Groq, Cerebras, SambaNova: ``dse.core.dataflow``) never takes a GPU engine's
band: its band is the dataflow layer's (``DATAFLOW``), from the residuals its per-layer latency
leaves on the vendors' published speeds it is fitted on; with a handful of rows this is a normal
prediction interval with Student's t quantile (``small_sample_band``), wide, and says so.
"""
from __future__ import annotations

import math

import numpy as np

from dse.core.efficiency import load_calibration
from dse.core.engines import CALIBRATED, PRIOR

#: the share of held-out rows a band is meant to cover; each side misses at most half the rest
COVERAGE = 0.9
#: the fewest rows a conformal band at ``COVERAGE`` needs: ceil((n + 1)(1 - a/2)) <= n
MIN_ROWS = math.ceil((1 - (1 - COVERAGE) / 2) / ((1 - COVERAGE) / 2) - 1e-9)
#: a band stored with fewer rows is not used (calibration files written before conformal bands
#: kept every slice, down to one row)
LEGACY_MIN_ROWS = 5
#: the engine name of the slices of engines predicted without rows of their own (leave-engines-out)
UNSEEN = "unseen"
#: the band name of a spatial machine's predictions (its dataflow layer's residuals)
DATAFLOW = "dataflow"
#: the engine label calibrate gives the rows of a prior engine (their leave-sources-out residuals
#: are an unseen engine's: they take ``UNSEEN``'s chain)
PRIOR_LABEL = "(prior)"
#: slices of a fitted engine from the narrowest to the widest: which of (engine, vendor) they keep
LEVELS = (("engine", "vendor"), ("engine",), ("vendor",), ())
#: metric families with a band, and the family of each evaluator metric prefix
FAMILIES = ("throughput", "ttft", "tpot", "e2e")
#: metrics whose quantity is the reciprocal of their band family's (a band on TPOT is one on
#: 1 / tokens per second per user): their log residual changes sign in the family's slices
RECIPROCAL = ("output_tokens_per_s_per_user",)


def family_of_metric(metric: str) -> str:
    """The band family of an evaluator metric: ttft, tpot, e2e or throughput."""
    for fam, prefix in (("ttft", "ttft"), ("tpot", "tpot"), ("e2e", "e2e_latency")):
        if metric.startswith(prefix):
            return fam
    return "tpot" if metric == "output_tokens_per_s_per_user" else "throughput"


def slice_key(level: tuple | None, engine: str, vendor: str, family: str) -> str:
    """The name of a slice: 'engine=vllm vendor=amd family=ttft' ('all' for every row; level
    ``UNSEEN``: 'engine=unseen vendor=nvidia family=ttft' with a vendor, 'engine=unseen family=ttft'
    without, ``DATAFLOW``: 'layer=dataflow vendor=groq family=tpot')."""
    if level is None:
        return "all"
    if level == UNSEEN:
        return f"engine={UNSEEN}" + (f" vendor={vendor}" if vendor else "") + f" family={family}"
    if level == DATAFLOW:
        return f"layer={DATAFLOW} vendor={vendor} family={family}"
    parts = [f"{k}={v}" for k, v in (("engine", engine), ("vendor", vendor)) if k in level]
    return " ".join(parts + [f"family={family}"])


def chain(engine: str, vendor: str, family: str) -> list[str]:
    """The slices a prediction's band may come from, narrowest first: for a fitted engine its
    engine and vendor, its engine, its vendor, its metric family, every row (leave-sources-out
    residuals of fitted engines); for ``UNSEEN`` (or a prior engine's rows, ``PRIOR_LABEL``) the
    unseen engines' slice of its hardware vendor and family (a prior engine on NVIDIA GPUs never
    takes the band AWS Neuron's rows make, predicted as a prior engine there), of its family, then
    of every family; for ``DATAFLOW`` the dataflow
    layer's slice of its vendor and family, and nothing wider (never a GPU engine's, nor another
    spatial vendor's whose layer latency was fitted when its own was not)."""
    if engine in (UNSEEN, PRIOR_LABEL):
        return [slice_key(UNSEEN, "", vendor, family), slice_key(UNSEEN, "", "", family), f"engine={UNSEEN}"]
    if engine == DATAFLOW:
        return [slice_key(DATAFLOW, "", vendor, family)]
    return [slice_key(level, engine, vendor, family) for level in LEVELS] + ["all"]


def oriented(log_residuals, metrics) -> np.ndarray:
    """log(measured / predicted) of each row in its band family's sense: negated for a metric that
    is the reciprocal of its family's quantity (``RECIPROCAL``: tokens/s per user in TPOT's)."""
    flip = np.isin(np.asarray(metrics, dtype=object), RECIPROCAL)
    return np.where(flip, -1.0, 1.0) * np.asarray(log_residuals, dtype=float)


def band_on(metric: str, low: float, high: float) -> tuple[float, float]:
    """The band (low, high) of the family of ``metric`` as factors on ``metric``'s own value:
    (1 / high, 1 / low) for a reciprocal metric (``RECIPROCAL``), else as given."""
    return (1.0 / high, 1.0 / low) if metric in RECIPROCAL else (low, high)


def conformal_rank(n: int, coverage: float = COVERAGE) -> int:
    """The rank k (1-based, from either end) of the order statistic bounding a split-conformal
    band of ``n`` residuals: ceil((n + 1)(1 - a / 2)), a = 1 - ``coverage``; > n when n is too few."""
    return math.ceil((n + 1) * (1 - (1 - coverage) / 2) - 1e-9)


def conformal_band(log_residuals, coverage: float = COVERAGE) -> tuple[float, float] | None:
    """(low, high) factors of the split-conformal band of ``log_residuals`` (NaN skipped): exp of
    the k-th smallest and k-th largest, k = ``conformal_rank``; a new exchangeable row falls below
    low, or above high, with probability at most (1 - coverage) / 2 each. None with too few rows."""
    r = np.sort(np.asarray(log_residuals, dtype=float))
    r = r[np.isfinite(r)]
    k = conformal_rank(r.size, coverage)
    if r.size == 0 or k > r.size:
        return None
    return float(np.exp(r[r.size - k])), float(np.exp(r[k - 1]))


def small_sample_band(log_residuals, fitted: int = 1, coverage: float = COVERAGE) -> tuple[float, float] | None:
    """(low, high) of a normal prediction interval from a few in-sample log residuals of a fit of
    ``fitted`` values per group: exp(± t(coverage, n - fitted) x s x sqrt(1 + fitted / n)), s the
    residuals' root mean square over n - fitted degrees of freedom (Student's t: exact for normal
    residuals, and very wide with 1 or 2 degrees of freedom, as it must be). None without a degree
    of freedom."""
    from scipy.stats import t

    r = np.asarray(log_residuals, dtype=float)
    r = r[np.isfinite(r)]
    dof = r.size - fitted
    if dof < 1:
        return None
    s = math.sqrt(float(np.sum(r ** 2)) / dof)
    half = float(t.ppf(1 - (1 - coverage) / 2, dof)) * s * math.sqrt(1 + fitted / r.size)
    return math.exp(-half), math.exp(half)


def _entry(n: int, band: tuple[float, float]) -> dict:
    return {"n": int(n), "low": float(f"{band[0]:.4g}"), "high": float(f"{band[1]:.4g}")}


def bands_from(residuals, engines, vendors, families) -> dict:
    """{slice: {n, low, high}} of log residuals log(measured / predicted) of fitted engines' rows
    (arrays over rows, NaN rows and ``PRIOR_LABEL`` rows skipped): the conformal band of every
    slice of every level (``LEVELS``, then 'all') with at least ``MIN_ROWS`` rows; smaller slices
    are left out (a prediction takes the next slice of its ``chain``)."""
    r = np.asarray(residuals, dtype=float)
    groups: dict[str, list] = {}
    for i in np.flatnonzero(np.isfinite(r)):
        if engines[i] in (PRIOR_LABEL, UNSEEN, DATAFLOW):
            continue
        for key in chain(engines[i], vendors[i], families[i]):
            groups.setdefault(key, []).append(r[i])
    out = {}
    for key, vals in sorted(groups.items()):
        band = conformal_band(vals)
        if band is not None:
            out[key] = _entry(len(vals), band)
    return out


def unseen_bands(residuals, families, vendors=None) -> dict:
    """{slice: {n, low, high}} of the unseen engines' slices per hardware vendor and metric family
    (with ``vendors``), per metric family and over every family (``chain(UNSEEN, ...)``), conformal
    bands of leave-engines-out log residuals (NaN rows skipped; a slice with fewer than
    ``MIN_ROWS`` rows left out)."""
    r = np.asarray(residuals, dtype=float)
    fams = np.asarray(families, dtype=object)
    ok = np.isfinite(r)
    out = {}
    if vendors is not None:
        vend = np.asarray(vendors, dtype=object)
        for vendor, fam in sorted(set(zip(vendors, families))):
            rows = ok & (fams == fam) & (vend == vendor)
            band = conformal_band(r[rows])
            if band is not None:
                out[slice_key(UNSEEN, "", vendor, fam)] = _entry(int(rows.sum()), band)
    for fam in sorted(set(families)):
        band = conformal_band(r[ok & (fams == fam)])
        if band is not None:
            out[slice_key(UNSEEN, "", "", fam)] = _entry(int((ok & (fams == fam)).sum()), band)
    band = conformal_band(r[ok])
    if band is not None:
        out[f"engine={UNSEEN}"] = _entry(int(ok.sum()), band)
    return out


def band_for(bands: dict, engine: str, vendor: str, family: str) -> tuple[float, float, str]:
    """(low, high, slice) of the first slice of ``chain(engine, vendor, family)`` that ``bands``
    has ((nan, nan, '') when none: no bands, or a dataflow family without rows)."""
    for key in chain(engine, vendor, family):
        b = bands.get(key)
        if b and b.get("n", 0) >= LEGACY_MIN_ROWS or (b and engine == DATAFLOW):
            return float(b["low"]), float(b["high"]), key
    return float("nan"), float("nan"), ""


def held_out_coverage(lso, leo, labels, vendors, families, extra: dict | None = None) -> dict:
    """How often a row's measurement lies within a band computed without that row (leave one row
    out of the band computation: the bands are order statistics of the stored residuals, so this
    is cheap), and the bands' widths. ``lso``, ``leo``: log residuals (family sense) of each row
    leaving its sources and its engine out (NaN: none); ``labels``: each row's band engine (a
    fitted engine, ``PRIOR_LABEL`` or ``DATAFLOW``); ``extra``: bands not made from these rows
    (the dataflow layer's). Returns {covered, rows, rows_with_band, median_width} of the
    leave-sources-out residuals in their own chain's band and, where ``leo`` has values, the
    same of the leave-engines-out residuals in the unseen engines' band (``unseen_engines``);
    width: the median over rows of high / low; a row without a residual or a band is not covered."""
    lso, leo = np.asarray(lso, dtype=float), np.asarray(leo, dtype=float)
    labels, vendors, families = (np.asarray(a, dtype=object) for a in (labels, vendors, families))
    n = lso.size
    engine_rows = labels != DATAFLOW
    own = np.zeros(n, dtype=bool)
    unseen = np.zeros(n, dtype=bool)
    widths, unseen_widths = np.full(n, np.nan), np.full(n, np.nan)
    for i in range(n):
        keep = np.arange(n) != i
        bands = bands_from(lso[keep], labels[keep], vendors[keep], families[keep])
        bands.update(unseen_bands(np.where(engine_rows, leo, np.nan)[keep], families[keep], vendors[keep]))
        bands.update(extra or {})
        lo, hi, _ = band_for(bands, labels[i], vendors[i], families[i])
        own[i] = bool(covered(np.exp(lso[i]), 1.0, lo, hi)) if np.isfinite(lso[i]) else False
        widths[i] = hi / lo
        if engine_rows[i] and np.isfinite(leo[i]):
            lo, hi, _ = band_for(bands, UNSEEN, vendors[i], families[i])
            unseen[i] = bool(covered(np.exp(leo[i]), 1.0, lo, hi))
            unseen_widths[i] = hi / lo

    def summary(inside, width, rows) -> dict:
        ok = np.isfinite(width) & rows
        return {"covered": round(float(inside[rows].mean()), 4) if rows.any() else None, "rows": int(rows.sum()),
                "rows_with_band": int(ok.sum()),
                "median_width": round(float(np.median(width[ok])), 4) if ok.any() else None}
    out = summary(own, widths, np.ones(n, dtype=bool))
    leo_rows = engine_rows & np.isfinite(leo)
    if leo_rows.any():
        out["unseen_engines"] = summary(unseen, unseen_widths, leo_rows)
    return out


def band_engine(efficiency_name: str, engine: str) -> str:
    """The engine whose slices give the band of a prediction made under ``engine`` with the
    Efficiency called ``efficiency_name`` (``dse.core.engines.engine_efficiency``'s): ``UNSEEN``
    where it runs the engine as a prior engine (not fitted, or not fitted on that hardware family:
    its engine's slices describe other hardware; ``dse.core.engines.runs_as_prior``), ``DATAFLOW`` for
    a spatial machine's dataflow run (no engine runs there), else ``engine``."""
    if is_dataflow(efficiency_name):
        return DATAFLOW
    return UNSEEN if efficiency_name.partition(" + ")[2].startswith(PRIOR) else engine


def shipped_bands(path: str | None = None) -> dict:
    """The ``bands`` section of the calibration in use (or ``path``); {} when it has none."""
    return load_calibration(path).get("bands") or {}


def covered(measured, predicted, low, high) -> np.ndarray:
    """True where a measurement lies within its prediction's band (arrays)."""
    m, p = np.asarray(measured, float), np.asarray(predicted, float)
    return (m >= p * np.asarray(low, float)) & (m <= p * np.asarray(high, float))


def is_dataflow(efficiency_name: str) -> bool:
    """Whether an Efficiency called ``efficiency_name`` prices a compiler-scheduled dataflow run
    (``dse.core.dataflow.dataflow_efficiency`` names it '<family efficiency> dataflow ...')."""
    return " dataflow" in efficiency_name.partition(" + ")[0]


def band_source(efficiency_name: str) -> str:
    """Where the band of a prediction made with the Efficiency called ``efficiency_name``
    (``dse.core.engines.engine_efficiency``'s) comes from, in words, with a warning when one of
    its engine values ended on its fit's bound, or the dataflow layer's band on a spatial machine
    ('' for the ideal bound or a given Efficiency)."""
    hardware, _, engine = efficiency_name.partition(" + ")
    if is_dataflow(efficiency_name):
        return (f"{100 * COVERAGE:.0f} % band of the dataflow layer (layer={DATAFLOW}): the residuals its fitted "
                f"per-layer latency leaves on the vendors' published tokens/s per user (Groq, Cerebras: 2 rows each), "
                f"never a GPU engine's; so few rows make it wide, and a family without such rows (SambaNova) or a "
                f"metric without them (TTFT, throughput, E2E) has none")
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
