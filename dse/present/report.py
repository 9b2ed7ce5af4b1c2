"""The report of a study run: ``summary.md``, plots and ``plots.json``.

:func:`write_report` reads what the run stored and recomputes no physics:
``results.parquet`` only as far as it needs (the columns it plots or ranks, never the
whole table: a run may hold 10^6+ rows) and ``best.json`` (the best feasible design per
objective with its per-operator tables, written by the run; ``dse.explore.best``), from
which it names bottlenecks, and writes:

- ``summary.md``: the study, points evaluated, feasible and infeasible counts (by
  reason), the Pareto-front size, the best design per objective with its metrics and
  bottleneck, and up to 10 Pareto designs spread over the front;
- ``pareto_<x>.png``: a throughput objective against a hardware figure (memory
  bandwidth, peak compute, memory capacity, cost), feasible points as a background
  sample (at most 20,000, fixed seed) and the Pareto rows highlighted; with exactly two
  objectives, also (or instead) those two;
- ``roofline.png``: the operators of the best design of the first objective on its
  device's roofline;
- ``breakdown.png``: per-operator time of the best designs (at most 4);
- ``sweep_batch.png`` / ``sweep_seq.png`` when the study varies ``batch`` /
  ``prompt_len`` or ``gen_len``;
- ``plots.json``: per plot what was drawn (columns, units, axis labels, the ``point``
  ids highlighted), so the content of the pictures can be checked.

Only numpy is imported at module level; pandas, pyarrow, matplotlib and seaborn are
imported when a report is written.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from basis.errors import DseError
from basis.files import write_text_atomic
from dse.explore.best import BEST_FILE
from dse.explore.runio import ResultsFile
from dse.present.bottleneck import bottleneck
from dse.system.analysis import Analysis
from dse.system.reasons import describe

#: hardware figures a throughput objective is plotted against (when present, varying and not all NaN)
HARDWARE_AXES = ("memory_bandwidth", "memory_capacity", "cost_usd")      # and every peak_<format>
#: at most this many feasible points are drawn as the background of a scatter plot
BACKGROUND_SAMPLE = 20_000
SEED = 0

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


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    esc = [[str(c).replace("|", "\\|") for c in r] for r in [header] + rows]
    lines = ["| " + " | ".join(esc[0]) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in esc[1:]]
    return "\n".join(lines)


_SUMMARY_METRICS = ("ttft_s", "tpot_s", "e2e_latency_s", "output_tokens_per_s", "output_tokens_per_s_per_user",
                    "output_tokens_per_s_per_device", "memory_bytes", "weights_bytes", "kv_cache_bytes",
                    "devices", "power_w", "cost_usd")


def write_report(out_dir, study: dict, spec, front=None) -> list[Path]:
    """Write summary.md, the plots and plots.json into ``out_dir`` (which holds the run's
    results.parquet); return the files written. ``front``: the Pareto rows (their
    ``point`` ids are highlighted), by default read from pareto.csv."""
    import pandas as pd

    from dse.present.plots import THROUGHPUT, breakdown_plot, human, label_of, pareto_plot, roofline_plot, sweep_plot

    out = Path(out_dir)
    res = ResultsFile(out / "results.parquet")
    best_file = out / BEST_FILE
    if not best_file.exists():
        raise DseError(f"{out}: no {BEST_FILE} (the explained best designs); run the study again to write it")
    stored = json.loads(best_file.read_text())
    if front is None and (out / "pareto.csv").exists():
        front = pd.read_csv(out / "pareto.csv")
    objectives = dict(spec.objectives or {})
    name = str(study.get("name") or out.name)
    varied = _varied(spec, res.names)

    # ---- the columns worth reading
    hw_axes = [c for c in res.names if c in HARDWARE_AXES or c.startswith("peak_")]
    sweep_metrics = ("output_tokens_per_s", "tpot_s", "ttft_s", "e2e_latency_s")
    # rows are named by 'point' (sweeps) or 'trial' (Optuna searches); df['point'] holds that id
    key = "point" if "point" in res.names else "trial" if "trial" in res.names else None
    want = ([key] if key else []) + ["feasible", *objectives, *varied, *hw_axes]
    if any(v in varied for v in ("batch", "prompt_len", "gen_len")):
        want += list(sweep_metrics) + ["batch_used"]
    df = res.columns(want)
    if key is None:
        df["point"] = np.arange(len(df), dtype=np.int64)
    elif key != "point":
        df["point"] = df[key].to_numpy(np.int64)
    key = key or "point"
    feas = df["feasible"].to_numpy(bool)
    n_feas = int(feas.sum())

    # ---- Pareto rows as positions in the results
    ids = (np.asarray(front[key], dtype=np.int64) if front is not None and len(front) and key in front
           else np.array([], dtype=np.int64))
    pts = df["point"].to_numpy(np.int64)
    if len(pts) and pts[0] == 0 and pts[-1] == len(pts) - 1 and (np.diff(pts) == 1).all():
        front_pos = ids[(ids >= 0) & (ids < len(pts))]
    else:
        front_pos = pd.Index(pts).get_indexer(ids)
        front_pos = front_pos[front_pos >= 0]
    front_df = df.iloc[front_pos]

    # ---- best designs and their analyses
    best = {k: stored["objectives"].get(k) for k in objectives}
    full = {int(p): d["row"] for p, d in stored["designs"].items()}
    analyses = {int(p): Analysis(d["prefill"], d["decode"], d["summary"], d["memory_bandwidth"] or float("nan"))
                for p, d in stored["designs"].items()}
    first = next(iter(objectives), None)

    written: list[Path] = []
    plots: dict[str, dict] = {}

    # ---- background sample of feasible points
    feas_pos = np.flatnonzero(feas)
    if len(feas_pos) > BACKGROUND_SAMPLE:
        feas_pos = np.sort(np.random.default_rng(SEED).choice(feas_pos, BACKGROUND_SAMPLE, replace=False))
    background = df.iloc[feas_pos]

    def usable(c):
        if c not in df:
            return False
        v = df[c].to_numpy(dtype=float)[feas] if n_feas else df[c].to_numpy(dtype=float)
        v = v[np.isfinite(v)]
        return len(v) > 0 and v.min() != v.max()

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
        if pair not in pairs and all(c in df for c in pair):
            pairs.append(pair)
    if not pairs and len(objectives) > 2:      # no hardware figure varies: the first objective against the others
        y0 = thr[0] if thr else first
        pairs += [(o, y0) for o in objectives if o != y0 and usable(o) and y0 in df]
    for x, y in pairs if n_feas else []:
        fname = f"pareto_{x}.png" if (not thr or y == thr[0]) else f"pareto_{y}_vs_{x}.png"   # x: the figure bought
        if fname in plots:
            fname = f"pareto_{y}_vs_{x}.png"
        plots[fname] = pareto_plot(out / fname, background, front_df, x, y, objectives,
                                   title=f"{name}: {label_of(y).split(' (')[0]} vs {label_of(x).split(' (')[0]}")
        written.append(out / fname)

    # ---- b. roofline of the best design of the first objective
    p0 = best.get(first) if first else None
    if p0 is not None:
        rec = roofline_plot(out / "roofline.png", analyses[p0],
                            title=f"{name}: best {first} ({key} {int(df['point'].iat[p0])}) on "
                                  f"{full[p0]['hardware']}")
        rec.update(point=int(df["point"].iat[p0]), id=key, objective=first)
        plots["roofline.png"] = rec
        written.append(out / "roofline.png")

    # ---- c. per-operator breakdown of the best designs
    designs, seen = [], {}
    for k, p in best.items():
        if p is None:
            continue
        if p in seen:
            seen[p]["label"] += f"\n& {k}"
            continue
        if len(designs) == 4:
            continue
        d = {"label": f"best {k}\n({key} {int(df['point'].iat[p])})", "point": int(df["point"].iat[p]),
             "analysis": analyses[p], "objective": k}
        seen[p] = d
        designs.append(d)
    if designs:
        rec = breakdown_plot(out / "breakdown.png", designs)
        for r, d in zip(rec["designs"], designs):
            r["label"] = d["label"]
            r["objective"] = d["objective"]
        plots["breakdown.png"] = rec
        written.append(out / "breakdown.png")

    # ---- d. sweep curves around the best design of the first objective
    base = full.get(p0) if p0 is not None else None

    def sweep_slice(x: str):
        """(rows with every other varied parameter at the base design's value, hue, fixed
        values): a categorical parameter with at most 8 values stays free as the hue.
        Sampled spaces rarely share values: with fewer than 2 values of ``x`` left, the
        rows are the best feasible design (first objective) per value of ``x``."""
        others = [v for v in varied if v != x]
        hue = next((v for v in others if str(df[v].dtype) in ("category", "object", "bool")
                    and df[v].nunique() <= 8), None)
        mask = np.ones(len(df), dtype=bool)
        for v in others:
            if v != hue:
                mask &= (df[v] == base[v]).to_numpy(bool)
        sub = df[mask]
        fixed = {v: base[v] for v in others if v != hue}
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
        if mode == "envelope":
            return f"{name}: {what}, the best design ({first}) per value of the x axis"
        return f"{name}: {what}" + (", " + ", ".join(f"{k} {human(k, v)}" for k, v in fixed.items()) if fixed else "")

    def plain(d):
        return {k: (v.item() if hasattr(v, "item") else v) for k, v in d.items()}

    if base is not None and "batch" in varied:
        sub, hue, fixed, mode = sweep_slice("batch")
        # batch: max is drawn at the batch it resolved to
        bx = "batch" if pd.api.types.is_numeric_dtype(df["batch"]) else "batch_used"
        rec = sweep_plot(out / "sweep_batch.png",
                         [{"data": sub, "x": bx, "ys": ["output_tokens_per_s", "tpot_s"], "hue": hue}],
                         title_of("batch sweep", fixed, mode))
        rec.update(mode=mode, fixed=plain(fixed), base_point=int(df["point"].iat[p0]))
        plots["sweep_batch.png"] = rec
        written.append(out / "sweep_batch.png")
    seq = [v for v in ("prompt_len", "gen_len") if v in varied]
    if base is not None and seq:
        panels, fixed_all, modes = [], {}, []
        for x in seq:
            sub, hue, fixed, mode = sweep_slice(x)
            panels.append({"data": sub, "x": x, "ys": ["ttft_s", "tpot_s", "e2e_latency_s"], "hue": hue,
                           "shared_y": "time (s)", "log_y": True})
            fixed_all.update({k: v for k, v in fixed.items() if k not in seq})
            modes.append(mode)
        rec = sweep_plot(out / "sweep_seq.png", panels,
                         title_of("time vs sequence length", fixed_all, modes[0]))
        rec.update(mode=modes, fixed=plain(fixed_all), base_point=int(df["point"].iat[p0]))
        plots["sweep_seq.png"] = rec
        written.append(out / "sweep_seq.png")

    # ---- summary.md
    lines = [f"# {name}", ""]
    desc = str(study.get("description") or "").strip()
    if desc:
        lines += [desc, ""]
    n = res.rows
    lines += [f"- Points evaluated: {n:,} ({spec.method}{', ideal roofline' if spec.ideal else ''})",
              f"- Feasible: {n_feas:,} ({100 * n_feas / n:.1f} %)" if n else "- Feasible: 0",
              f"- Infeasible: {n - n_feas:,}",
              f"- Pareto front: {len(front_pos):,} designs"
              + (f" over {', '.join(f'{k} ({v})' for k, v in objectives.items())}" if objectives else "")]
    if spec.constraints:
        lines.append("- Constraints: " + ", ".join(f"{k} {'≥' if s == 'min' else '≤'} {human(k, v)}"
                                                   for k, b in spec.constraints.items() for s, v in b.items()))
    reasons = res.reasons() if n - n_feas else []
    if reasons:
        lines += ["", "## Infeasible points by reason", "",
                  _md_table(["reason", "points", "share of all"],
                            [[describe(r), f"{c:,}", f"{100 * c / n:.1f} %"] for r, c in reasons[:8]])]
        if len(reasons) > 8:
            lines.append(f"\n… and {len(reasons) - 8} more reasons.")
    if objectives:
        varied = [a.name for a in spec.space.axes if len(a.values) != 1 and a.name not in objectives]
        lines += ["", "## Best feasible design per objective", "",
                  _md_table(["objective", "sense", "best", "value (SI)", key, "hardware", *varied],
                            [[k, v, human(k, full[best[k]][k]) if best[k] is not None else "-",
                              f"{float(full[best[k]][k]):.6g}" if best[k] is not None else "-",
                              str(int(df['point'].iat[best[k]])) if best[k] is not None else "-",
                              str(full[best[k]]["hardware"]) if best[k] is not None else "-",
                              *[human(c, full[best[k]][c]) if best[k] is not None and c in full[best[k]] else "-"
                                for c in varied]]
                             for k, v in objectives.items()])]
        for k, v in objectives.items():
            p = best[k]
            lines += ["", f"### {k} ({v}imize)", ""]
            if p is None:
                lines.append("No feasible design." if k in df else f"`{k}` is not a column of the results.")
                continue
            row = full[p]
            lines.append(f"Best: **{human(k, row[k])}** at {key} {int(df['point'].iat[p])}.")
            lines.append("")
            lines.append("Parameters: " + ", ".join(f"{c} {human(c, row[c])}" for c in spec.space.names if c in row))
            lines.append("")
            lines.append("Metrics: " + ", ".join(f"{m} {human(m, row[m])}" for m in _SUMMARY_METRICS
                                                  if m in row and row[m] is not None))
            an = analyses[p]
            lines.append("")
            lines.append(f"Bottleneck — decode: {bottleneck(an.decode)['text']}; "
                         f"prefill: {bottleneck(an.prefill)['text']}.")
    if len(front_pos):
        shown = _spread(np.asarray(front_pos), df, first, objectives.get(first, "max"))
        rows = res.rows_at(shown)
        cols = [key] + [c for c in varied if c not in objectives] + list(objectives)
        cols += [m for m in ("output_tokens_per_s", "tpot_s", "ttft_s") if m not in cols]
        cols = [c for c in cols if c in res.names]
        lines += ["", f"## Pareto designs ({len(rows)} of {len(front_pos):,}, spread along {first})", "",
                  _md_table([c if c == key else label_of(c) for c in cols],
                            [[str(r[c]) if c == key else human(c, r[c], unit=False) for c in cols]
                             for r in rows])]
    for rec in plots.values():
        rec["id"] = key          # the column naming the highlighted and analyzed designs
    if plots:
        lines += ["", "## Plots", ""] + [f"- [{f}]({f}): {_describe(rec)}" for f, rec in plots.items()]
    write_text_atomic(out / "summary.md", "\n".join(lines) + "\n")
    written.insert(0, out / "summary.md")
    write_text_atomic(out / "plots.json", json.dumps(_clean(plots), separators=(",", ":")))
    written.append(out / "plots.json")
    return written


def _describe(rec: dict) -> str:
    k = rec.get("kind")
    if k == "pareto":
        return f"{rec['y_label']} against {rec['x_label']}, {len(rec['highlighted']):,} Pareto designs highlighted"
    if k == "roofline":
        return f"operators of {rec['id']} {rec['point']} by arithmetic intensity and attained performance"
    if k == "breakdown":
        return "per-operator time of the best designs (prefill, one decode step)"
    if k == "sweep":
        return "; ".join(f"{', '.join(p['ys'])} against {p['x']}" + (f" by {p['hue']}" if p["hue"] else "")
                         for p in rec["panels"])
    return k or ""


def _clean(o):
    """JSON-ready: numpy scalars as Python ones, NaN and infinities as null."""
    if isinstance(o, dict):
        return {str(k): _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        kinds = {type(v) for v in o}
        if kinds <= {int, str, bool, type(None)}:
            return list(o)
        if kinds <= {float, int}:
            return [v if math.isfinite(v) else None for v in o]
        return [_clean(v) for v in o]
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating, float)):
        f = float(o)
        return f if np.isfinite(f) else None
    if isinstance(o, np.bool_):
        return bool(o)
    return o
