"""The report of a study run: ``summary.md``, plots and ``plots.json``.

:func:`write_report` reads what the run stored and recomputes no physics: its rows
only as far as it needs (the columns it plots or ranks, never the whole table: a run may
hold 10^6+ rows), ``pareto.csv`` and ``best.json`` (the best feasible design per
objective with its per-operator tables, written by the run; ``dse.explore.best``), from
which it names bottlenecks. The rows are what the run kept (a sweep's ``outputs.rows``):

- ``all``: ``results.parquet``, every row; the counts are counted in it;
- ``sample``: ``sample.parquet``, a uniform sample of the rows: the cloud of feasible
  designs and the sweep curves are drawn from it and say so; the counts are the sweep's
  totals (``sweep.json``), the Pareto designs its exact front (``pareto.csv``: parameters,
  objectives and key metrics, ``FRONT_METRICS``; a plot against another metric is left out);
- ``none``: no rows: the Pareto plots draw the front alone, the sweep curves are left out
  and ``summary.md`` says which and why; counts and front as for ``sample``.

It writes:

- ``summary.md``: the study and its question, points evaluated, feasible and infeasible
  counts (by reason), the Pareto-front size, the best design per objective with its metrics
  and bottleneck, up to 10 Pareto designs spread over the front, the plots and how to
  reproduce the run (the command, the dse version, the study file's SHA-256);
- ``report.html``: the same document (``dse.present.document``) as one self-contained
  page, the plots embedded and up to ``FRONT_ROWS`` Pareto designs listed;
- ``pareto_<x>.png``: a throughput objective against a hardware figure (memory
  bandwidth, peak compute, memory capacity, cost), feasible points as a background
  sample (at most 20,000, fixed seed) and the Pareto rows highlighted; with exactly two
  objectives, also (or instead) those two. Large clouds and fronts are drawn as
  densities (``dse.present.plots.LARGE_CLOUD``, ``LARGE_FRONT``);
- ``roofline.png``: the operators of the best design of the first objective on its
  device's roofline;
- ``breakdown.png``: per-operator time of the best designs (at most 4);
- ``sweep_load.png`` when the study varies a load of continuous batching (``concurrency``
  or ``request_rate``): throughput, TPOT and TTFT along it;
- ``sweep_batch.png`` / ``sweep_seq.png`` when the study varies ``batch`` /
  ``prompt_len`` or ``gen_len``;
- ``plots.json``: per plot what was drawn (columns, units, axis labels, the ``point``
  ids highlighted), so the content of the pictures can be checked.

No plotting library is imported with this module: matplotlib is imported when the first
plot is drawn (seaborn and scipy never are).
"""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import math
import shlex
from pathlib import Path

import numpy as np

from basis.errors import DseError
from basis.files import write_text_atomic
from basis.shipped import shipped
from basis.units import axis_scale
from dse.explore.best import BEST_FILE
from dse.explore.online import FRONT_METRICS
from dse.explore.pareto import front_note, unvalued_counts
from dse.explore.runio import FrameResults, ResultsFile
from dse.present.bottleneck import bottleneck
from dse.present.display import TOKENS_PER_S, fixed_text, kind_of, ops_unit, quantity_text
from dse.present.document import (
    HTML,
    MARKDOWN,
    Bullets,
    Code,
    Document,
    Figure,
    Figures,
    Section,
    Table,
    html_page,
    markdown,
)
from dse.present.drawing import Drawer, Drawn
from dse.present.interactive import panels_chart, pareto_chart, plotly_js
from dse.present.plots import (
    THROUGHPUT,
    breakdown_plot,
    comparison_plot,
    human,
    pareto_plot,
    roofline_plot,
    sweep_plot,
    words_of,
)
from dse.present.report_spec import ReportSpec, answer_rows, chooser, comparison_rows, report_spec
from dse.system.analysis import Analysis
from dse.system.reasons import describe

#: the load parameters of continuous batching a sweep plot can run along (the serving curve)
LOAD_AXES = ("concurrency", "request_rate")

#: hardware figures a throughput objective is plotted against (when present, varying and not all NaN)
HARDWARE_AXES = ("memory_bandwidth", "memory_capacity", "cost_usd")      # and every peak_<format>
#: at most this many feasible points are drawn as the background of a scatter plot
BACKGROUND_SAMPLE = 20_000
SEED = 0
#: categorical parameters shown by colour, marker and panel in Pareto plots: at most this many values each
CATEGORY_LIMITS = {"hue": 20, "style": 10, "facet": 4}

# --------------------------------------------------------------------------- the report

def _spread(front_pos: np.ndarray, df, first: str | None, sense: str, k: int = 10) -> np.ndarray:
    """Up to ``k`` positions of the front, evenly spread along the first objective (best first)."""
    order = np.asarray(front_pos)
    if first is not None and first in df and len(order):
        v = df[first].to_numpy(float)[order]
        order = order[np.argsort(-v if sense == "max" else v, kind="stable")]
    if len(order) <= k:
        return order
    pick = np.unique(np.round(np.linspace(0, len(order) - 1, k)).astype(int))
    return order[pick]


def _varied(spec, names) -> list[str]:
    """Parameters of the space that take more than one value (and are result columns)."""
    out = []
    for a in spec.space.axes:
        if a.name in names and (len(a.values) > 1 or (a.is_range and spec.method != "grid" and a.low != a.high)):
            out.append(a.name)
    return out


_SUMMARY_METRICS = ("ttft_s", "tpot_s", "e2e_latency_s", "output_tokens_per_s", "output_tokens_per_s_per_user",
                    "output_tokens_per_s_per_device", "memory_bytes", "weights_bytes", "kv_cache_bytes",
                    "devices", "power_w", "cost_usd")


#: the note of a skipped cost plot
_NO_PRICE = "no cost plot: no preset in this study has price_usd (configs/hardware/*.yaml), so no design has a cost"


def _categorical(col) -> bool:
    """Whether a results column holds names or flags (a format, the hardware), not numbers."""
    return str(col.dtype) in ("category", "object", "bool", "string", "str")


def _categories(df, varied: list[str]) -> dict:
    """The categorical parameters a study varies, as Pareto-plot encodings: the one with
    the most values (at most ``CATEGORY_LIMITS['hue']``) as colour, the next as marker,
    the next as one panel per value (quant-roofline: colour weights, marker KV format,
    panels activations)."""
    cats = sorted((v for v in varied if v in df and _categorical(df[v]) and df[v].nunique() >= 2),
                  key=lambda v: -df[v].nunique())
    out = {}
    for role in ("hue", "style", "facet"):
        pick = next((v for v in cats if v not in out.values() and df[v].nunique() <= CATEGORY_LIMITS[role]), None)
        if pick is None:
            break
        out[role] = pick
    return out


#: the file a report reads its rows from, by what the run kept of them (``outputs.rows``; none: no file)
ROW_FILES = {"all": "results.parquet", "sample": "sample.parquet"}
#: a sweep's manifest, holding its totals (points, feasible, infeasible by reason)
SWEEP_FILE = "sweep.json"
#: the note of a sweep plot left out of the report of a run that kept no rows
_NO_ROWS = "a sweep curve is drawn from rows, and this run kept none (outputs.rows: none)"


def _read_best(out: Path) -> dict:
    """What best.json of the run in ``out`` holds (``dse.explore.best.explain_best``); DseError when absent."""
    best_file = out / BEST_FILE
    if not best_file.exists():
        raise DseError(f"{out}: no {BEST_FILE} (the explained best designs); run the study again to write it")
    return json.loads(best_file.read_text())


def _read_front(out: Path):
    """The Pareto rows of pareto.csv in ``out`` (an empty frame when there is none or it holds no column)."""
    import pandas as pd
    try:
        return pd.read_csv(out / "pareto.csv")
    except (FileNotFoundError, pd.errors.EmptyDataError):
        return pd.DataFrame()


def _row_source(out: Path, spec, front) -> tuple[str, ResultsFile | FrameResults]:
    """(what the run kept of its rows: 'all', 'sample' or 'none'; a reader of them):
    results.parquet, sample.parquet, or for none no rows with the columns of the Pareto
    rows ``front`` (so that a column the front holds reads as an empty column)."""
    kept = "all" if spec.method == "optuna" else spec.rows_kept
    if kept == "none":
        return kept, FrameResults(front.iloc[:0].assign(feasible=np.zeros(0, dtype=bool)))
    path = out / ROW_FILES[kept]
    if not path.exists():
        raise DseError(f"{path}: missing (the rows of a run with outputs.rows {kept}); add --overwrite to run the "
                       f"study again")
    return kept, ResultsFile(path)


def _totals(out: Path, kept: str, res, n_feas: int) -> dict:
    """The run's counts, {'points', 'feasible', 'reasons': [(reason key, points)], most
    frequent first}: counted in its rows ``res`` (``n_feas`` of them feasible) when it kept
    every row, else the sweep's totals in sweep.json (a sample's counts are not the run's),
    with 'unvalued' there: {objective: feasible points with no value (NaN) of it}."""
    if kept == "all":
        return {"points": res.rows, "feasible": n_feas, "reasons": res.reasons() if res.rows - n_feas else []}
    path = out / SWEEP_FILE
    try:
        state = json.loads(path.read_text())
        reasons = sorted(((str(r), int(c)) for r, c in state["reasons"].items() if c), key=lambda rc: (-rc[1], rc[0]))
        unvalued = {str(k): int(v) for k, v in dict(state.get("unvalued") or {}).items() if v}
        return {"points": int(state["points"]), "feasible": int(state["feasible"]), "reasons": reasons,
                "unvalued": unvalued}
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError):
        raise DseError(f"{path}: holds no totals of a complete sweep; run the study again to finish it") from None


def _front_rows(df, front, key: str, every_row: bool):
    """The Pareto designs as rows: when ``df`` holds every row of the run, its rows of the
    ``front``'s ids (with every column the report reads); else the ``front`` itself, marked
    feasible (a streamed sweep's pareto.csv: point, parameters, objectives and the key metrics
    ``dse.explore.online.FRONT_METRICS``, no other metric)."""
    import pandas as pd
    if not every_row:
        return front.assign(feasible=True).reset_index(drop=True) if len(front.columns) else df.iloc[:0]
    ids = np.asarray(front[key], dtype=np.int64) if len(front) and key in front else np.array([], dtype=np.int64)
    pts = df["point"].to_numpy(np.int64)
    if len(pts) and pts[0] == 0 and pts[-1] == len(pts) - 1 and (np.diff(pts) == 1).all():
        pos = ids[(ids >= 0) & (ids < len(pts))]
    else:
        pos = pd.Index(pts).get_indexer(ids)
        pos = pos[pos >= 0]
    return df.iloc[pos]


def _stored_designs(stored: dict, objectives: dict) -> tuple[dict, dict, dict]:
    """From what best.json holds: (per objective the id (``point`` or ``trial``) of its best
    feasible design, None if none; per id the design's stored row, with the summary metrics
    it lacks (a streamed sweep's row holds parameters, objectives and key metrics) from the design's
    stored summary; per id its Analysis)."""
    ids = {p: int(d.get("id_value", p)) for p, d in stored["designs"].items()}
    at = stored["objectives"]
    best = {k: ids[str(at[k])] if at.get(k) is not None else None for k in objectives}
    full = {ids[p]: {**{m: d["summary"][m] for m in _SUMMARY_METRICS if m in d["summary"]}, **d["row"]}
            for p, d in stored["designs"].items()}
    analyses = {ids[p]: Analysis(d["prefill"], d["decode"], d["summary"], d["memory_bandwidth"] or float("nan"))
                for p, d in stored["designs"].items()}
    return best, full, analyses


def _varies(c: str, df, feas: np.ndarray, front_df) -> bool:
    """Whether column ``c`` takes more than one finite value over the feasible rows of ``df``
    (mask ``feas``) and the Pareto rows ``front_df``."""
    v = np.concatenate([df[c].to_numpy(dtype=float)[feas] if c in df else [],
                        front_df[c].to_numpy(dtype=float) if c in front_df else []])
    v = v[np.isfinite(v)]
    return len(v) > 0 and v.min() != v.max()


def _rows_note(kept: str, rows: int, points: int) -> str:
    """The rows a report draws from, in words: '' (every row), 'a uniform sample of N of M
    points' or 'no rows'."""
    if kept == "sample":
        return f"a uniform sample of {rows:,} of {points:,} points"
    return "no rows" if kept == "none" else ""


def _cloud_note(kept: str, cloud: str) -> str:
    """The line a Pareto plot adds under its title on what its cloud of feasible designs is
    drawn from ('' when from every row); ``cloud``: the rows read, in words (``_rows_note``)."""
    if kept == "sample":
        return f"feasible designs drawn from {cloud}"
    if kept == "none":
        return "no cloud of feasible designs: the run kept no rows (outputs.rows: none), only its Pareto front"
    return ""


def _updated(rec: dict, **items) -> dict:
    """``rec`` with ``items`` set in it. Returns ``rec``."""
    rec.update(items)
    return rec


def _with_rows(rec: dict, kept: str, cloud: str) -> dict:
    """A plot's record with the rows it was drawn from: ``rows`` (what the run kept) and,
    unless every row, ``rows_note`` (``_rows_note``). Returns ``rec``."""
    rec["rows"] = kept
    if cloud:
        rec["rows_note"] = cloud
    return rec


def _empty_front(x: str, y: str, objectives: dict, feasible) -> str:
    """The note of a Pareto plot of ``y`` against ``x`` left out because no Pareto design has both:
    the objectives no feasible design has a value of (which empty the front), if any."""
    unknown = [o for o in objectives if o in feasible and not np.isfinite(feasible[o].to_numpy(float)).any()]
    if unknown:
        return (f"no plot: the Pareto front is empty, since no feasible design has a value of "
                f"{', '.join(unknown)} (a design with no value of an objective is on no front)")
    return f"no plot: no Pareto design has a value of both {x} and {y}"


def _not_on_front(c: str) -> str:
    """The note of a Pareto plot of ``c`` left out because the Pareto rows lack ``c``."""
    return (f"no plot of {c}: the Pareto designs of a sweep that kept a sample or none of its rows are read from "
            f"pareto.csv, which holds their parameters, objectives and key metrics ({', '.join(FRONT_METRICS)}), "
            f"not {c}")


def _sweep_files(varied: list[str]) -> list[str]:
    """The sweep plots the varied parameters call for: sweep_batch.png (``batch``),
    sweep_load.png (a load of continuous batching), sweep_seq.png (a sequence length)."""
    return ((["sweep_batch.png"] if "batch" in varied else [])
            + (["sweep_load.png"] if any(v in varied for v in LOAD_AXES) else [])
            + (["sweep_seq.png"] if any(v in varied for v in ("prompt_len", "gen_len")) else []))


def _rows_section(kept: str, cloud: str, plots: dict) -> Section:
    """What a streamed sweep kept of its rows (``kept``: 'sample' or 'none'; ``cloud``: in
    words), so what its report draws from them and what it leaves out (``plots``' skipped)."""
    front = (f"the Pareto designs are the exact front (pareto.csv), which keeps their parameters, objectives and "
             f"key metrics ({', '.join(FRONT_METRICS)}): the Pareto table shows no other metric")
    if kept == "sample":
        text = (f"This sweep kept {cloud} (sample.parquet, fixed by the seed), not every row. The counts above and "
                f"the infeasible points by reason are the sweep's totals (sweep.json). The cloud of feasible designs "
                f"in the Pareto plots and the sweep curves are drawn from the sample; {front}.")
    else:
        text = (f"This sweep kept none of its rows. The counts above and the infeasible points by reason are the "
                f"sweep's totals (sweep.json); {front}. The Pareto plots draw the front alone, with no cloud of other "
                f"feasible designs. Per value of each swept parameter, aggregates.csv holds the points, feasible "
                f"points and best value of each objective.")
    left = [f"{f}: {rec['skipped']}" for f, rec in plots.items() if "skipped" in rec and rec.get("kind") != "pareto"]
    return Section("Rows kept", [text] + (["Left out, as they are drawn from rows:", Bullets(left)] if left else []),
                   id="rows")


def write_report(out_dir, study: dict, spec, front=None, drawer: Drawer | None = None) -> list[Path]:
    """Write summary.md, report.html, the plots and plots.json into the run folder
    ``out_dir``; return the files written. ``front``: the Pareto rows (their ``point`` ids
    are highlighted), by default read from pareto.csv. ``drawer``: where the plots are drawn
    (``dse.present.drawing``; by default in this process).

    The rows come from what the run kept (``spec.rows_kept``, ``_row_source``):
    results.parquet (every row), sample.parquet (a uniform sample: the cloud of feasible
    designs and the sweep curves are drawn from it, the counts are the sweep's totals in
    sweep.json) or none (the Pareto plots draw the front alone, the plots that need rows
    are left out and the summary says so)."""
    import pandas as pd

    out = Path(out_dir)
    drawer = drawer or Drawer()
    draw = drawer.draw
    stored = _read_best(out)
    front = _read_front(out) if front is None else front
    kept, res = _row_source(out, spec, front)
    objectives = dict(spec.objectives or {})
    name = str(study.get("name") or out.name)
    names = list(dict.fromkeys([*res.names, *map(str, front.columns)]))     # columns of the rows or the front
    varied = _varied(spec, names)
    declared = report_spec(study.get("report"), str(spec.where), spec.space.names)   # the study's own plots, answer

    # ---- the columns worth reading
    hw_axes = [c for c in names if c in HARDWARE_AXES or c.startswith("peak_")]
    sweep_metrics = ("output_tokens_per_s", "tpot_s", "ttft_s", "e2e_latency_s")
    # rows are named by 'point' (sweeps) or 'trial' (Optuna searches); df['point'] holds that id
    key = "point" if "point" in names else "trial" if "trial" in names else None
    # ---- best designs and their analyses, by id; their plots are asked first: they need no row,
    # so the helper draws them while the rows are read
    best, full, analyses = _stored_designs(stored, objectives)
    first = next(iter(objectives), None)
    p0 = best.get(first) if first else None
    best_plots = _best_plots(out, draw, name, key or "point", first, best, full, analyses)
    want = ([key] if key else []) + ["feasible", *objectives, *varied, *hw_axes, *TABLE_METRICS]
    want += [c for c in (*declared.columns, "hardware", *(("reason",) if declared.compare else ()))
             if c in names and c not in ("point", "trial")]
    if any(v in varied for v in ("batch", "prompt_len", "gen_len", *LOAD_AXES)):
        want += list(sweep_metrics) + ["batch_used"]
    df = res.columns(want)
    if key is None:
        df["point"] = np.arange(len(df), dtype=np.int64)
    elif key != "point":
        df["point"] = df[key].to_numpy(np.int64)
    key = key or "point"
    feas = df["feasible"].to_numpy(bool)
    totals = _totals(out, kept, res, int(feas.sum()))
    n_feas = totals["feasible"]
    front_df = _front_rows(df, front, key, every_row=kept == "all")
    if "unvalued" not in totals:        # every row read: count the feasible ones with no value of an objective
        named = [o for o in objectives if o in df]
        totals["unvalued"] = unvalued_counts(df.loc[feas, named].to_numpy(dtype=float), named)
    cloud = _rows_note(kept, res.rows, totals["points"])
    rows = functools.partial(_with_rows, kept=kept, cloud=cloud)      # a plot's record: the rows drawn from

    written: list[Path] = []
    plots: dict[str, dict] = {}
    charts: dict[str, dict] = {}         # the interactive version of a plot, by its file
    hover = [c for c in dict.fromkeys([key, "hardware", *varied]) if c in df or c in front_df]

    # ---- background sample of feasible points
    feas_pos = np.flatnonzero(feas)
    if len(feas_pos) > BACKGROUND_SAMPLE:
        feas_pos = np.sort(np.random.default_rng(SEED).choice(feas_pos, BACKGROUND_SAMPLE, replace=False))
    background = df.iloc[feas_pos]

    def usable(c):
        return _varies(c, df, feas, front_df)

    # ---- a. Pareto fronts
    pairs = []
    thr = [o for o in objectives if o in THROUGHPUT]
    for y in thr:
        xs = [c for c in hw_axes if usable(c)]
        for x in xs:
            pairs.append((x, y))
    if len(objectives) == 2:
        a, b = list(objectives)
        pair = (b, a) if a in THROUGHPUT or b not in THROUGHPUT else (a, b)
        if pair not in pairs and all(c in names for c in pair):
            pairs.append(pair)
    if not pairs and len(objectives) > 2:      # no hardware figure varies: the first objective against the others
        y0 = thr[0] if thr else first
        pairs += [(o, y0) for o in objectives if o != y0 and usable(o) and y0 in names]
    encode = _categories(df if len(df) else front_df, varied)
    if n_feas and thr and "cost_usd" in df and not usable("cost_usd"):
        costs = np.concatenate([df["cost_usd"].to_numpy(float), front_df["cost_usd"].to_numpy(float)
                                if "cost_usd" in front_df else []])
        plots["pareto_cost_usd.png"] = {"kind": "pareto", "x": "cost_usd", "y": thr[0],
                                        "skipped": _NO_PRICE if not np.isfinite(costs).any()
                                        else "no cost plot: every design with a cost has the same cost"}
    for x, y in pairs if n_feas else []:
        fname = f"pareto_{x}.png" if (not thr or y == thr[0]) else f"pareto_{y}_vs_{x}.png"   # x: the figure bought
        if fname in plots:
            fname = f"pareto_{y}_vs_{x}.png"
        if x not in front_df or y not in front_df:      # a streamed sweep's pareto.csv lacks it (FRONT_METRICS)
            plots[fname] = {"kind": "pareto", "x": x, "y": y, "skipped": _not_on_front(x if x not in front_df else y)}
            continue
        if not np.isfinite(front_df[[x, y]].to_numpy(float)).all(axis=1).any():
            plots[fname] = {"kind": "pareto", "x": x, "y": y, "skipped": _empty_front(x, y, objectives, background)}
            continue
        bg, note = background, ""
        if x == "cost_usd":            # presets without price_usd have no cost: draw the designs that have one
            priced = np.isfinite(background["cost_usd"].to_numpy(float))
            if not priced.all():
                bg = background[priced]
                hw = sorted(map(str, pd.unique(bg["hardware"]))) if "hardware" in bg else []
                note = (f"only designs with a cost drawn ({len(bg):,} of {len(background):,} feasible shown): "
                        f"presets with price_usd: {', '.join(hw) or 'none'}")
        plots[fname] = draw(pareto_plot, out / fname, bg, front_df, x, y, objectives,
                            title=f"{name}: {words_of(y)} vs {words_of(x)}",
                            note="; ".join(t for t in (_cloud_note(kept, cloud), note) if t), **encode
                            ).then(rows)
        charts[fname] = pareto_chart(bg, front_df[np.isfinite(front_df[[x, y]].to_numpy(float)).all(axis=1)], x, y,
                                     encode.get("hue"), hover, f"{name}: {words_of(y)} vs {words_of(x)}")
        written.append(out / fname)

    if objectives and n_feas and not plots:          # no Pareto plot asked nor left out: say why none
        y0 = thr[0] if thr else first
        unknown = [o for o in objectives if o in background and not np.isfinite(background[o].to_numpy(float)).any()]
        plots[f"pareto_{y0}.png"] = {"kind": "pareto", "x": None, "y": y0, "skipped": _empty_front(
            y0, y0, objectives, background) if unknown else "no plot: no hardware figure or second objective varies "
            "over the feasible designs"}

    # ---- b. roofline and c. per-operator breakdown of the best designs (drawn already)
    plots.update(best_plots)
    written += [out / f for f in best_plots]

    # ---- d. sweep curves around the best design of the first objective (drawn from rows: none kept, none drawn)
    base = full.get(p0) if p0 is not None else None
    sweeps = _sweep_files(varied) if base is not None else []
    if kept == "none":
        plots.update({f: {"kind": "sweep", "skipped": _NO_ROWS} for f in sweeps})
        sweeps = []

    def sweep_slice(x: str):
        """(rows with every other varied parameter fixed, hue, fixed values, mode): a
        categorical parameter with at most 8 values stays free as the hue (one line per
        value). The others are fixed at the values under which the most values of ``x``
        have a feasible design — of those, the values closest to the base design (most
        parameters equal) — so the swept axis is covered, not cut to the one column the
        base design's batch fits. Sampled spaces rarely share values: with fewer than 2
        values of ``x`` left, the rows are the best feasible design (first objective) per
        value of ``x``."""
        others = [v for v in varied if v != x]
        hue = next((v for v in others if _categorical(df[v]) and 2 <= df[v].nunique() <= 8), None)
        cols = [v for v in others if v != hue]
        fixed = {v: base[v] for v in cols}
        if cols and feas.any():
            cover = df.loc[feas, [*cols, x]].groupby(cols, observed=True, sort=False)[x].nunique()
            cand = cover[cover == cover.max()].index.to_frame(index=False)
            same = sum((cand[v] == base[v]).to_numpy(int) for v in cols)
            far = sum(np.abs(np.log(np.maximum(cand[v].to_numpy(float) / float(base[v]), 1e-300))) for v in cols
                      if pd.api.types.is_numeric_dtype(cand[v]) and float(base[v]) > 0)
            pick = cand.iloc[int(np.lexsort((far + np.zeros(len(cand)), -same))[0])]   # most equal, then nearest
            fixed = {v: pick[v].item() if hasattr(pick[v], "item") else pick[v] for v in cols}
        mask = np.ones(len(df), dtype=bool)
        for v in cols:
            mask &= (df[v] == fixed[v]).to_numpy(bool)
        sub = df[mask]
        if sub[x].nunique() >= 2:
            return sub, hue, fixed, "slice"
        f = df[feas]
        key = first if first in f and f[first].notna().any() else "output_tokens_per_s"
        xv = f[x].to_numpy(float)
        if len(np.unique(xv)) > 24:         # continuous draws: the best design in each of 24 log-spaced bins
            edges = np.geomspace(xv.min(), xv.max() * (1 + 1e-9), 25)
            by = np.digitize(xv, edges)
        else:
            by = xv
        grp = f.groupby(by)[key]
        idx = grp.idxmax() if objectives.get(key, "max") == "max" else grp.idxmin()
        return df.loc[idx.dropna().astype(int)], None, {}, "envelope"

    def title_of(what, fixed, mode):
        sample = f" (from {cloud})" if cloud else ""
        if mode == "envelope":
            return f"{name}: {what}, the best design ({first}) per value of the x axis{sample}"
        return (f"{name}: {what}" + (", " + ", ".join(f"{k} {human(k, v)}" for k, v in fixed.items()) if fixed else "")
                + sample)

    def plain(d):
        return {k: (v.item() if hasattr(v, "item") else v) for k, v in d.items()}

    if "sweep_batch.png" in sweeps:
        sub, hue, fixed, mode = sweep_slice("batch")
        # batch: max is drawn at the batch it resolved to
        bx = "batch" if pd.api.types.is_numeric_dtype(df["batch"]) else "batch_used"
        title = title_of("batch sweep", fixed, mode)
        panels = [{"data": sub, "x": bx, "ys": ["output_tokens_per_s", "tpot_s"], "hue": hue}]
        plots["sweep_batch.png"] = draw(sweep_plot, out / "sweep_batch.png", panels, title).then(
            functools.partial(_updated, mode=mode, fixed=plain(fixed), base_point=p0, title=title)).then(rows)
        charts["sweep_batch.png"] = panels_chart(_sweep_panels(panels), hover, title)
        written.append(out / "sweep_batch.png")
    load = next((v for v in LOAD_AXES if v in varied), None)
    if "sweep_load.png" in sweeps:
        sub, hue, fixed, mode = sweep_slice(load)
        title = title_of(f"serving curve ({load.replace('_', ' ')})", fixed, mode)
        panels = [{"data": sub, "x": load, "ys": ["output_tokens_per_s", "tpot_s", "ttft_s"], "hue": hue,
                   "log_y": True}]
        plots["sweep_load.png"] = draw(sweep_plot, out / "sweep_load.png", panels, title).then(
            functools.partial(_updated, mode=mode, fixed=plain(fixed), base_point=p0, title=title)).then(rows)
        charts["sweep_load.png"] = panels_chart(_sweep_panels(panels), hover, title)
        written.append(out / "sweep_load.png")
    seq = [v for v in ("prompt_len", "gen_len") if v in varied]
    if "sweep_seq.png" in sweeps:
        panels, fixed_all, modes = [], {}, []
        for x in seq:
            sub, hue, fixed, mode = sweep_slice(x)
            panels.append({"data": sub, "x": x, "hue": hue, "log_y": True,
                           "ys": ["ttft_s", "tpot_s", "e2e_latency_s"] if len(seq) == 1 else ["ttft_s", "tpot_s"]})
            fixed_all.update({k: v for k, v in fixed.items() if k not in seq})
            modes.append(mode)
        title = title_of("time vs sequence length", fixed_all, modes[0])
        plots["sweep_seq.png"] = draw(sweep_plot, out / "sweep_seq.png", panels, title).then(functools.partial(
            _updated, mode=modes, fixed=plain(fixed_all), base_point=p0, title=title)).then(rows)
        charts["sweep_seq.png"] = panels_chart(_sweep_panels(panels), hover, title)
        written.append(out / "sweep_seq.png")

    # ---- e. the comparisons the study declares (report.compare), each a PNG and a chart
    for i, c in enumerate(declared.compare, 1):
        fname = f"compare_{i}.png"
        missing = [col for col in c.columns if col not in df]
        if missing or not len(df):
            plots[fname] = {"kind": "comparison", "skipped": f"no figure: the rows read lack {', '.join(missing)}"
                            if missing else f"no figure: {_NO_ROWS}"}
            continue
        by = chooser(c, objectives)
        sub, left = comparison_rows(df, c, varied, by)
        if not len(sub) or not np.isfinite(sub[list(c.ys)].to_numpy(float)).any():
            plots[fname] = {"kind": "comparison", "skipped": "no figure: no design with the fixed values "
                            + ", ".join(f"{k} {'/'.join(map(str, v))}" for k, v in c.fixed) + " has a value of "
                            + ", ".join(c.ys)}
            continue
        title = _comparison_title(name, c, left, by)
        panels = _comparison_panels(sub, c)
        plots[fname] = draw(comparison_plot, out / fname, panels, title, c.kind).then(functools.partial(
            _updated, fixed={k: list(v) for k, v in c.fixed}, left=list(left), best_by=list(by) if left and by else None,
            colour=c.colour, facet=c.facet, declared=i)).then(rows)
        charts[fname] = panels_chart(panels, hover, title, c.kind)
        written.append(out / fname)

    # ---- summary.md and report.html: one document, two renderings
    drawer.finish()
    plots = {f: rec.result() if isinstance(rec, Drawn) else rec for f, rec in plots.items()}
    for rec in plots.values():
        rec["id"] = key          # the column naming the highlighted and analyzed designs
    doc = _document(out, name, study, spec, df, key=key, objectives=objectives, best=best, full=full,
                    analyses=analyses, front_df=front_df, totals=totals, plots=plots, varied=varied,
                    kept=kept, cloud=cloud, declared=declared, charts=charts)
    write_text_atomic(out / "summary.md", markdown(doc))
    write_text_atomic(out / REPORT_HTML, html_page(doc, out))
    written[:0] = [out / "summary.md", out / REPORT_HTML]
    write_text_atomic(out / "plots.json", json.dumps(_clean(plots), separators=(",", ":")))
    written.append(out / "plots.json")
    return written


#: the page of a run, next to summary.md: self-contained (plots embedded), for a browser
REPORT_HTML = "report.html"
#: the distribution whose version a report names (``pip install dse-llm``)
DISTRIBUTION = "dse-llm"
#: metrics every table of Pareto designs shows (read with the other columns of the report)
TABLE_METRICS = ("output_tokens_per_s", "tpot_s", "ttft_s")
#: at most this many Pareto designs are listed in report.html (summary.md lists 10)
FRONT_ROWS = 1_000
#: at most this many infeasibility reasons are listed, most frequent first
REASON_ROWS = 8


def _best_plots(out: Path, draw, name: str, key: str, first: str | None, best: dict, full: dict,
                analyses: dict) -> dict:
    """The plots of the best designs, asked of ``draw`` (``Drawer.draw``), by file name: the
    roofline of the best design of the ``first`` objective, and the per-operator breakdown of
    the best design of each objective (at most 4). ``key``: the column naming designs."""
    plots = {}
    p0 = best.get(first) if first else None
    if p0 is not None:
        plots["roofline.png"] = draw(roofline_plot, out / "roofline.png", analyses[p0],
                                     title=f"{name}: best {first} ({key} {p0}) on {full[p0]['hardware']}"
                                     ).then(functools.partial(_updated, point=p0, id=key, objective=first))
    designs, seen = [], {}
    for k, p in best.items():
        if p is None:
            continue
        if p in seen:
            seen[p]["label"] += f"\n& {k}"
            continue
        if len(designs) == 4:
            continue
        d = {"label": f"best {k}\n({key} {p})", "point": p,
             "analysis": analyses[p], "objective": k}
        seen[p] = d
        designs.append(d)
    if designs:
        def labelled(rec, designs=tuple(designs)):
            for r, d in zip(rec["designs"], designs):
                r["label"] = d["label"]
                r["objective"] = d["objective"]
            return rec
        plots["breakdown.png"] = draw(breakdown_plot, out / "breakdown.png", designs).then(labelled)
    return plots


def _value_text(name: str, value) -> str:
    """One value of ``name`` in its own unit (``quantity_text``); numpy scalars as Python
    ones, NaN as '-'."""
    v = value.item() if hasattr(value, "item") else value
    if isinstance(v, float) and math.isnan(v):
        return "-"
    return quantity_text(name, v)


def _column_unit(name: str) -> tuple[float, str] | None:
    """(divide by, unit) of a table column of ``name``: one scale for the whole column
    (``basis.units.AXIS``; tokens/s as they are); None for names, flags and counts."""
    kind = kind_of(name)
    if kind == TOKENS_PER_S:
        return 1.0, "tokens/s"
    if kind is None:
        return None
    scale, unit = axis_scale(kind)
    if kind == "ops_per_s":
        unit = unit.removesuffix("FLOP/s") + ops_unit(name.removeprefix("peak_"))
    return scale, unit


def _rows(df, positions, cols: list[str]) -> list[dict]:
    """The rows of ``df`` at ``positions`` as dicts of ``cols`` with Python values (names as
    text, NaN where a value is missing): the columns a table shows, read with the rest."""
    return df.iloc[np.asarray(positions, dtype=np.int64)][cols].to_dict("records")


def _columns_table(cols: list[str], rows: list[dict], key: str, table_id: str = "", only: str | None = None,
                   caption: str = "") -> Table:
    """Rows of results (dicts) as a table of ``cols``; a quantity's unit in its header,
    the same scale down its column."""
    units = {c: _column_unit(c) for c in cols}
    header = [c if units[c] is None else f"{c} ({units[c][1]})" for c in cols]

    def cell(c, v):
        if c == key or units[c] is None or v is None or isinstance(v, (str, bool)):
            return _value_text(c, v) if c != key else str(v)
        return fixed_text(v, units[c][0])
    return Table(header, [[cell(c, r.get(c)) for c in cols] for r in rows], id=table_id, caption=caption, only=only)


def _version() -> str:
    """The installed version of dse ('unknown' when it runs from an uninstalled checkout)."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _reproduce(spec, out: Path, name: str) -> Section:
    """How to run this study again: the command (a shipped study by its name, another by
    its file), the dse version and the SHA-256 of the study file."""
    study_file = Path(spec.where)
    facts = [f"dse ({DISTRIBUTION}) {_version()}"]
    if study_file.is_file():
        mine = shipped("studies", f"{study_file.stem}.yaml")
        arg = study_file.stem if mine.is_file() and mine.resolve() == study_file.resolve() else str(study_file)
        facts.append(f"study file `{study_file}`, SHA-256 `{hashlib.sha256(study_file.read_bytes()).hexdigest()}`")
    else:
        arg = name
    cmd = ["dse", "run", arg, "--out", str(out)]
    if spec.method != "grid":
        cmd += ["--seed", str(spec.seed)]
    if spec.method == "optuna":
        cmd += ["--trials", str(spec.trials)]
    elif spec.rows is not None:         # the study's outputs.rows, or --rows: the same rows kept
        cmd += ["--rows", spec.rows]
    return Section("How to reproduce", ["The same study, with the same settings, into the same folder:",
                                        Code(shlex.join(cmd)), Bullets(facts)], id="reproduce")


def _document(out: Path, name: str, study: dict, spec, df, *, key: str, objectives: dict, best: dict, full: dict,
              analyses: dict, front_df, totals: dict, plots: dict, varied: list[str], kept: str,
              cloud: str, declared: ReportSpec = ReportSpec(), charts: dict | None = None) -> Document:
    """The report of a run as a document (``summary.md`` and ``report.html`` render it):
    the study and its question, counts, the rows kept (a streamed sweep's), infeasible
    points by reason, the best design per objective with its bottleneck, the Pareto front,
    the plots and how to reproduce it. ``df``: the rows read (every row, a sample or none);
    ``best``/``full``/``analyses``: per objective the id of its best design, and per id its
    stored row and analysis (``best.json``); ``front_df``: the Pareto designs; ``totals``:
    the run's counts (``_totals``); ``varied``: the parameters varied; ``kept``/``cloud``:
    what the run kept of its rows and the rows read, in words (``_rows_note``)."""
    n, n_feas = totals["points"], totals["feasible"]
    first = next(iter(objectives), None)
    intro = []
    desc = str(study.get("description") or "").strip()
    if desc:
        intro.append(desc)
    facts = [f"Points evaluated: {n:,} ({spec.method}{', ideal roofline' if spec.ideal else ''})",
             f"Feasible: {n_feas:,} ({100 * n_feas / n:.1f} %)" if n else "Feasible: 0",
             f"Infeasible: {n - n_feas:,}",
             f"Pareto front: {len(front_df):,} designs"
             + (f" over {', '.join(f'{k} ({v})' for k, v in objectives.items())}" if objectives else "")]
    note = front_note(totals.get("unvalued") or {}, n_feas, len(front_df)) if objectives else None
    if note:
        facts.append(note)
    if kept != "all":
        facts.append(f"Rows kept: {cloud} (outputs.rows: {kept}); the counts are the sweep's totals (sweep.json)")
    if spec.constraints:
        facts.append("Constraints: " + ", ".join(f"{k} {'≥' if s == 'min' else '≤'} {_value_text(k, v)}"
                                                 for k, b in spec.constraints.items() for s, v in b.items()))
    sections = [Section("", intro + [Bullets(facts)])]
    charts = charts or {}
    if declared.answer is not None:
        sections.append(_answer_section(declared.answer, df, key, kept, cloud))
    declared_figs = [f for f, rec in plots.items() if rec.get("kind") == "comparison"]
    if declared_figs:
        sections.append(Section("The study's comparisons", [
            Figures([Figure(f, _describe(plots[f]), charts.get(f)) for f in declared_figs
                     if "skipped" not in plots[f]])]
            + [f"{f}: {plots[f]['skipped']}." for f in declared_figs if "skipped" in plots[f]], id="comparisons"))
    if kept != "all":
        sections.append(_rows_section(kept, cloud, plots))

    reasons = totals["reasons"]
    if reasons:
        blocks = [Table(["reason", "points", "share of all"],
                        [[describe(r), f"{c:,}", f"{100 * c / n:.1f} %"] for r, c in reasons[:REASON_ROWS]],
                        id="infeasible-reasons")]
        if len(reasons) > REASON_ROWS:
            blocks.append(f"… and {len(reasons) - REASON_ROWS} more reasons.")
        sections.append(Section("Infeasible points by reason", blocks, id="infeasible"))

    if objectives:
        # hardware has its own column, whether it varies or not
        params = [c for c in varied if c not in objectives and c not in ("hardware", key)]

        def ident(p):
            return str(p)
        rows = []
        for k, v in objectives.items():
            p = best[k]
            if p is None:
                rows.append([k, v] + ["-"] * (4 + len(params)))
                continue
            row = full[p]
            rows.append([k, v, _value_text(k, row[k]), f"{float(row[k]):.6g}", ident(p), str(row["hardware"]),
                         *[_value_text(c, row[c]) if c in row else "-" for c in params]])
        sections.append(Section("Best feasible design per objective",
                                [Table(["objective", "sense", "best", "value (SI)", key, "hardware", *params], rows,
                                       id="best-designs")], id="best"))
        for k, v in objectives.items():
            p = best[k]
            s = Section(f"{k} ({v}imize)", level=3, id=f"best-{k}")
            sections.append(s)
            if p is None:
                s.blocks.append("No feasible design." if k in df or not n_feas
                                else f"`{k}` is not a column of the results.")
                continue
            row, an = full[p], analyses[p]
            s.blocks += [f"Best: **{_value_text(k, row[k])}** at {key} {ident(p)}.",
                         "Parameters: " + ", ".join(f"{c} {_value_text(c, row[c])}" for c in spec.space.names
                                                    if c in row),
                         "Metrics: " + ", ".join(f"{m} {_value_text(m, row[m])}" for m in
                                                 (declared.metrics or _SUMMARY_METRICS)
                                                 if m in row and row[m] is not None),
                         f"Bottleneck — decode: {bottleneck(an.decode)['text']}; "
                         f"prefill: {bottleneck(an.prefill)['text']}."]

        fronts = [Figure(f, _describe(rec), charts.get(f)) for f, rec in plots.items()
                  if rec.get("kind") == "pareto" and "skipped" not in rec]
        blocks = [f"{len(front_df):,} feasible designs that no other design beats on every objective "
                  f"({', '.join(f'{k} {v}' for k, v in objectives.items())})."]
        ok = df["feasible"].to_numpy(bool) if "feasible" in df else np.ones(len(df), dtype=bool)
        empty = [k for k in objectives if k in df and df[k].isna().to_numpy()[ok].any()]
        blocks += [f"{int(df[k].isna().to_numpy()[ok].sum()):,} feasible designs"
                   + ("" if kept == "all" else " of the sample") + f" have no `{k}`"
                   + (" (no published quality figure for their model and setting in configs/quality.yaml)"
                      if k == "quality_loss" else "") + " and stay off the front." for k in empty]
        blocks += [f"{f}: {rec['skipped']}." for f, rec in plots.items()
                   if "skipped" in rec and rec.get("kind") == "pareto"]
        if fronts:
            blocks.append(Figures(fronts))
        if len(front_df):
            cols = [key, "hardware"] + params + [o for o in objectives if o not in params]
            cols += [m for m in TABLE_METRICS if m not in cols]
            cols = [c for c in cols if c in front_df]
            sense = objectives.get(first, "max")
            every = np.arange(len(front_df))
            shown = _spread(every, front_df, first, sense)
            listed = _spread(every, front_df, first, sense, k=FRONT_ROWS)
            for rows_shown, where, table_id in ((shown, MARKDOWN, ""), (listed, HTML, "pareto-front")):
                caption = (f"All {len(front_df):,} designs" if len(rows_shown) == len(front_df) else
                           f"{len(rows_shown):,} of {len(front_df):,} designs, spread along {first}")
                blocks.append(_columns_table(cols, _rows(front_df, rows_shown, cols), key, table_id=table_id,
                                             only=where, caption=caption + f", best {first} first:"))
        sections.append(Section("Pareto front", blocks, id="pareto"))

    others = [Figure(f, _describe(rec), charts.get(f)) for f, rec in plots.items()
              if rec.get("kind") not in ("pareto", "comparison") and "skipped" not in rec]
    if others:
        sections.append(Section("Plots", [Figures(others)], id="plots"))
    sections.append(_reproduce(spec, out, name))
    shown = any(f.chart for s in sections for b in s.blocks if isinstance(b, Figures) for f in b.items)
    return Document(name, sections, library=plotly_js() if shown else "")


def _sweep_panels(panels: list[dict]) -> list[dict]:
    """The panels of a sweep plot (each: data, x, ys, hue) as the chart's grid: one panel per y, in a row."""
    out = []
    for p in panels:
        for y in p["ys"]:
            out.append({"data": p["data"], "x": p["x"], "y": y, "colour": p["hue"], "row": 1, "col": len(out) + 1,
                        "label": ""})
    return out


def _comparison_panels(sub, c) -> list[dict]:
    """The grid of a declared comparison: a row per y, a column per facet value (sorted)."""
    facets = [None] if c.facet is None else sorted(sub[c.facet].unique().tolist(), key=str)
    out = []
    for r, y in enumerate(c.ys, 1):
        for k, f in enumerate(facets, 1):
            data = sub if f is None else sub[(sub[c.facet] == f).to_numpy(bool)]
            out.append({"data": data, "x": c.x, "y": y, "colour": c.colour, "row": r, "col": k,
                        "label": "" if f is None else f"{c.facet} = {f}"})
    return out


def _comparison_title(name: str, c, left: tuple, by: tuple[str, str] | None) -> str:
    """The words of a declared comparison: its own title, or what it draws; what it fixes;
    how it chose among the parameters it leaves (``by``: the column and sense of the best)."""
    what = c.title or (f"{', '.join(words_of(y) for y in c.ys)} against {words_of(c.x)}"
                       + (f" by {c.colour}" if c.colour else "") + (f", per {c.facet}" if c.facet else ""))
    parts = [f"{name}: {what}"]
    if c.fixed:
        parts.append(", ".join(f"{k} {'/'.join(map(str, v))}" for k, v in c.fixed))
    if left and by:
        parts.append(f"each point the feasible design with the {'least' if by[1] == 'min' else 'most'} {by[0]} "
                     f"over {', '.join(left)}")
    return "; ".join(parts)


def _answer_section(a, df, key: str, kept: str, cloud: str) -> Section:
    """The table the study declares as its answer (``report.answer``): per value of its
    ``best_per`` the best feasible design by its ranking, and the values with none."""
    title = a.title or (f"the best design per {', '.join(a.best_per)} by "
                        + ", then ".join(f"{c} ({s})" for c, s in a.rank))
    missing_cols = [c for c in a.reads if c not in df]
    if missing_cols or not len(df):
        return Section(f"The study's answer: {title}", [
            "No answer table: " + (f"the rows read lack {', '.join(missing_cols)}" if missing_cols else _NO_ROWS)
            + "."], id="answer")
    best, missing = answer_rows(df, a)
    cols = list(dict.fromkeys([*a.best_per, *(c for c, _ in a.rank), *a.columns, key]))
    table = _columns_table(cols, _rows(best, np.arange(len(best)), cols), key, table_id="answer-table",
                           caption=f"Per {', '.join(a.best_per)}, best first"
                           + (f" (among the rows with {', '.join(f'{k} {chr(47).join(map(str, v))}' for k, v in a.fixed)})"
                              if a.fixed else "") + ":")
    blocks = [table]
    if missing:
        blocks.append("No feasible design with a value of " + a.rank[0][0] + " for "
                      + "; ".join(", ".join(f"{c} {v}" for c, v in zip(a.best_per, g)) for g in missing) + ".")
    if kept != "all":
        blocks.append(f"Drawn from {cloud} (outputs.rows: {kept}), not every row: a group's best may be missing.")
    return Section(f"The study's answer: {title}", blocks, id="answer")


def _describe(rec: dict) -> str:
    k = rec.get("kind")
    rows = _cloud_note(rec.get("rows", "all"), rec.get("rows_note", ""))
    if k == "pareto":
        return (f"{rec['y_label']} against {rec['x_label']}, {len(rec['highlighted']):,} Pareto designs highlighted"
                + (f"; {rows}" if rows else ""))
    if k == "roofline":
        return f"operators of {rec['id']} {rec['point']} by arithmetic intensity and attained performance"
    if k == "breakdown":
        return "per-operator time of the best designs (prefill, one decode step)"
    if k == "comparison":
        text = rec.get("title", "")
        return text + (f" (drawn from {rec['rows_note']})" if "rows_note" in rec else "")
    if k == "sweep":
        return "; ".join(f"{', '.join(p['ys'])} against {p['x']}" + (f" by {p['hue']}" if p["hue"] else "")
                         for p in rec["panels"]) + (f" (drawn from {rec['rows_note']})" if "rows_note" in rec else "")
    return k or ""


def _clean(o):
    """JSON-ready: numpy scalars as Python ones, NaN and infinities as null."""
    if isinstance(o, dict):
        return {str(k): _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        kinds = set(map(type, o))
        if kinds <= {int, str, bool, type(None)}:
            return list(o)
        if kinds <= {float, int}:        # a sum is finite only when every term is: one pass in C
            return list(o) if math.isfinite(sum(o)) else [v if math.isfinite(v) else None for v in o]
        return [_clean(v) for v in o]
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating, float)):
        f = float(o)
        return f if np.isfinite(f) else None
    if isinstance(o, np.bool_):
        return bool(o)
    return o
