"""The report of a study run: ``summary.md``, plots and ``plots.json``.

:func:`write_report` reads ``results.parquet`` only as far as it needs (the columns it
plots or ranks, never the whole table: a run may hold 10^6+ rows), finds the best
feasible design per objective, re-analyzes those few designs operator by operator
(``dse.system.analysis`` on ``device_for`` / ``scenario_for`` of their rows, with the efficiency
model the sweep used) to name their bottleneck, and writes:

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
import os
import re
from pathlib import Path

import numpy as np

#: hardware figures a throughput objective is plotted against (when present, varying and not all NaN)
HARDWARE_AXES = ("memory_bandwidth", "memory_capacity", "cost_usd")      # and every peak_<format>
#: at most this many feasible points are drawn as the background of a scatter plot
BACKGROUND_SAMPLE = 20_000
SEED = 0

_ATTENTION = ("qk_matmul", "softmax", "sv_matmul", "flash_attention")
_COMM = ("moe_dispatch", "moe_combine", "pp_hop")


# --------------------------------------------------------------------------- bottlenecks

def op_group(name: str) -> str:
    """The class an operator belongs to for naming bottlenecks: '*_proj', 'attention', ..."""
    if name in _ATTENTION:
        return "attention"
    if "all_reduce" in name or name in _COMM:
        return "communication"
    if name.startswith("expert_") and name.endswith("_proj"):
        return "expert *_proj"
    if name.endswith("_proj"):
        return "*_proj"
    if name.endswith("_norm"):
        return "*_norm"
    return name


def step_bound(rows: list[dict]) -> tuple[str, float]:
    """(bound taking most of the step's time, its share of the step): 'memory', 0.93."""
    by: dict[str, float] = {}
    for r in rows:
        by[r["bound"]] = by.get(r["bound"], 0.0) + r["total_time_s"]
    total = sum(by.values())
    if not by or total <= 0:
        return "-", 0.0
    b = max(by, key=by.get)
    return b, by[b] / total


def bottleneck(rows: list[dict]) -> dict:
    """What limits one step (prefill or decode rows of ``dse.system.analysis``): the bound that
    takes most time, and in it the operator class taking most time and what it waits
    for (weight, KV-cache or activation bytes; a compute format; the link)."""
    bound, bshare = step_bound(rows)
    total = sum(r["total_time_s"] for r in rows)
    if bound == "-":
        return {"bound": "-", "bound_share": 0.0, "group": "-", "group_share": 0.0, "what": "-", "text": "-"}
    groups: dict[str, list] = {}
    for r in rows:
        if r["bound"] == bound:
            groups.setdefault(op_group(r["name"]), []).append(r)
    group = max(groups, key=lambda g: sum(r["total_time_s"] for r in groups[g]))
    rs = groups[group]
    gshare = sum(r["total_time_s"] for r in rs) / total
    if bound in ("memory", "offload"):
        kinds = {"weight reads": sum(r["weight_bytes"] * r["count"] for r in rs),
                 "KV-cache reads": sum(r["kv_bytes"] * r["count"] for r in rs),
                 "activation traffic": sum(r["act_bytes"] * r["count"] for r in rs)}
        what = max(kinds, key=kinds.get)
        if bound == "offload":
            what += " over the host link"
    elif bound == "compute":
        fmts: dict[str, float] = {}
        for r in rs:
            fmts[r["compute_format"]] = fmts.get(r["compute_format"], 0.0) + r["total_time_s"]
        what = f"{max(fmts, key=fmts.get)} compute"
    else:
        what = "link transfers"
    return {"bound": bound, "bound_share": bshare, "group": group, "group_share": gshare, "what": what,
            "text": f"{bound}-bound ({100 * bshare:.0f} % of the step), {100 * gshare:.0f} % of the step "
                    f"in {what} of {group}"}


def analyze_row(row: dict, ideal: bool = False):
    """(Analysis, Device) of one results row: the design point rebuilt from its parameters
    and analyzed with the efficiency model the sweep's evaluator used."""
    from dse.system.analysis import analyze
    from dse.core.efficiency import choose
    from dse.system.evaluator import device_for, scenario_for
    from hwmodels.presets import load_device
    from workloads.model import load_model
    device = device_for(row)
    eff = choose(load_device(str(row["hardware"])), None, ideal)
    offload = row.get("offload") or "none"
    res = analyze(load_model(str(row["model"])), device, scenario_for(row), ideal=ideal, efficiency=eff,
                  offload=str(offload), sparse=bool(row.get("sparse") or False))
    return res, device


# --------------------------------------------------------------------------- reading results

class _Results:
    """Lazy, column-wise access to a results.parquet file."""

    def __init__(self, path: Path):
        import pyarrow as pa
        import pyarrow.parquet as pq
        self.path = path
        schema = pq.read_schema(path)
        strings = [f.name for f in schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)]
        self.file = pq.ParquetFile(path, read_dictionary=strings)   # names as categoricals: small, fast
        self.schema = schema
        self.names = list(schema.names)
        self.rows = self.file.metadata.num_rows
        sizes = [self.file.metadata.row_group(i).num_rows for i in range(self.file.metadata.num_row_groups)]
        self.starts = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)

    def columns(self, cols: list[str]):
        """A DataFrame of ``cols`` (names stored as categoricals), one row per point."""
        cols = [c for c in dict.fromkeys(cols) if c in self.names]
        return self.file.read(columns=cols).to_pandas(split_blocks=True, self_destruct=True)

    def reasons(self) -> list[tuple[str, int]]:
        """(reason class, points) of the infeasible points, most frequent first: the measured
        value is dropped from constraint messages ('tpot_s 0.1055 > 0.1' -> 'tpot_s > 0.1');
        a point failing several checks counts once under each."""
        import pyarrow as pa
        import pyarrow.compute as pc
        if "reason" not in self.names:
            return []
        counts: dict[str, int] = {}
        distinct: dict[str, int] = {}
        for chunk in self.file.read(columns=["reason"]).column(0).chunks:
            if pa.types.is_dictionary(chunk.type):
                idx = chunk.indices.to_numpy(zero_copy_only=False)
                n = np.bincount(idx[idx >= 0] if chunk.null_count == 0 else idx[chunk.is_valid().to_numpy(
                    zero_copy_only=False)], minlength=len(chunk.dictionary))
                pairs = zip(chunk.dictionary.to_pylist(), n.tolist())
            else:
                pairs = ((d["values"], d["counts"]) for d in pc.value_counts(chunk).to_pylist())
            for text, c in pairs:
                if c:
                    distinct[text] = distinct.get(text, 0) + c
        for text, n in distinct.items():
            if not text:
                continue
            for part in str(text).split("; "):
                key = re.sub(r"^(\S+) \S+ ([<>]) ", r"\1 \2 ", part.strip())
                counts[key] = counts.get(key, 0) + n
        return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))

    def rows_at(self, positions) -> list[dict]:
        """Full rows (every column) at row ``positions``, reading only their row groups."""
        positions = [int(p) for p in positions]
        out: dict[int, dict] = {}
        groups = np.searchsorted(self.starts, positions, side="right") - 1
        for g in sorted(set(groups.tolist())):
            want = [p for p, gg in zip(positions, groups) if gg == g]
            table = self.file.read_row_group(int(g)).take([p - int(self.starts[g]) for p in want])
            for p, rec in zip(want, table.to_pylist()):
                out[p] = rec
        return [out[p] for p in positions]


# --------------------------------------------------------------------------- the report

def _best_positions(df, objectives: dict) -> dict[str, int | None]:
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


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


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
    res = _Results(out / "results.parquet")
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
        want += list(sweep_metrics)
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
    best = _best_positions(df, objectives)
    uniq = list(dict.fromkeys(p for p in best.values() if p is not None))
    full = dict(zip(uniq, res.rows_at(uniq))) if uniq else {}
    analyses = {}
    for p in uniq:
        try:
            analyses[p] = analyze_row(full[p], ideal=bool(spec.ideal))
        except Exception as e:  # noqa: BLE001 — a report never fails on one design's re-analysis
            analyses[p] = e
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
    if p0 is not None and not isinstance(analyses[p0], Exception):
        an, dev = analyses[p0]
        rec = roofline_plot(out / "roofline.png", an, dev,
                            title=f"{name}: best {first} ({key} {int(df['point'].iat[p0])}) on "
                                  f"{full[p0]['hardware']}")
        rec.update(point=int(df["point"].iat[p0]), id=key, objective=first)
        plots["roofline.png"] = rec
        written.append(out / "roofline.png")

    # ---- c. per-operator breakdown of the best designs
    designs, seen = [], {}
    for k, p in best.items():
        if p is None or isinstance(analyses[p], Exception):
            continue
        if p in seen:
            seen[p]["label"] += f"\n& {k}"
            continue
        if len(designs) == 4:
            continue
        d = {"label": f"best {k}\n({key} {int(df['point'].iat[p])})", "point": int(df["point"].iat[p]),
             "analysis": analyses[p][0], "objective": k}
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
        rec = sweep_plot(out / "sweep_batch.png",
                         [{"data": sub, "x": "batch", "ys": ["output_tokens_per_s", "tpot_s"], "hue": hue}],
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
                            [[r, f"{c:,}", f"{100 * c / n:.1f} %"] for r, c in reasons[:8]])]
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
            a = analyses[p]
            lines.append("")
            if isinstance(a, Exception):
                lines.append(f"Bottleneck: not analyzed ({a}).")
            else:
                an = a[0]
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
    _write_text(out / "summary.md", "\n".join(lines) + "\n")
    written.insert(0, out / "summary.md")
    _write_text(out / "plots.json", json.dumps(_clean(plots), separators=(",", ":")))
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
