"""Plots of study results and analyses (PNG, matplotlib's Agg canvas, seaborn style).

Everything here is display: values arrive in SI units and are scaled for the axes by
:func:`unit_of` (bytes/s as TB/s, ops/s as TFLOPS or TOPS, bytes as GB, seconds as ms
or s). matplotlib and seaborn are imported inside the functions, so importing this
module costs nothing on the ``analyze`` path. Figures are made with the object API
(``matplotlib.figure.Figure``), never pyplot, so no GUI backend or global state is
touched, and every file is written atomically (a temporary file, then a rename).

Each plotting function returns a JSON-ready record of what it drew (columns, units,
axis labels read back from the axes, and the ``point`` ids of highlighted designs);
``dse.present.report`` collects them in ``plots.json``.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from basis.files import atomic_write
from dse.explore.pareto import pareto_mask
from dse.present.display import si

#: metrics and parameters measuring throughput (plotted on the y axis of Pareto fronts)
THROUGHPUT = ("output_tokens_per_s", "output_tokens_per_s_per_user", "output_tokens_per_s_per_device",
              "prefill_tokens_per_s")

_INT_FORMATS = ("int8", "int4")

# name -> (scale dividing the SI value, unit, words)
_UNITS = {
    "memory_bandwidth": (1e12, "TB/s", "memory bandwidth"),
    "memory_capacity": (1e9, "GB", "memory capacity"),
    "host_memory_capacity": (1e9, "GB", "host memory capacity"),
    "host_memory_bandwidth": (1e9, "GB/s", "host memory bandwidth"),
    "host_link_bandwidth": (1e9, "GB/s", "host link bandwidth"),
    "link_bandwidth": (1e9, "GB/s", "scale-up link bandwidth"),
    "link_latency": (1e-6, "us", "link latency"),
    "onchip_buffer_bytes": (1e6, "MB", "on-chip buffer"),
    "vector_ops_per_s": (1e12, "TFLOPS", "vector compute"),
    "pim_peak": (1e12, "TFLOPS", "PIM compute"),
    "pim_multiple": (1.0, "x", "PIM internal bandwidth multiple"),
    "compute_scale": (1.0, "x", "compute scale"),
    "tdp_w": (1.0, "W", "TDP"),
    "price_usd": (1.0, "USD", "price"),
    "cost_usd": (1.0, "USD", "cost"),
    "power_w": (1.0, "W", "power"),
    "devices": (1.0, "devices", "devices"),
    "batch": (1.0, "sequences", "batch"),
    "prompt_len": (1.0, "tokens", "prompt length"),
    "gen_len": (1.0, "tokens", "generation length"),
    "tp": (1.0, "devices", "tensor parallelism"),
    "pp": (1.0, "stages", "pipeline stages"),
    "ep": (1.0, "groups", "expert-parallel groups"),
    "ttft_s": (1e-3, "ms", "TTFT"),
    "tpot_s": (1e-3, "ms", "TPOT"),
    "e2e_latency_s": (1.0, "s", "end-to-end latency"),
    "output_tokens_per_s": (1.0, "tokens/s", "output throughput"),
    "output_tokens_per_s_per_user": (1.0, "tokens/s", "output tokens/s per user"),
    "output_tokens_per_s_per_device": (1.0, "tokens/s", "output tokens/s per device"),
    "prefill_tokens_per_s": (1.0, "tokens/s", "prefill throughput"),
    "weights_bytes": (1e9, "GB", "weights"),
    "kv_cache_bytes": (1e9, "GB", "KV cache"),
    "activation_bytes": (1e9, "GB", "activations"),
    "memory_bytes": (1e9, "GB", "memory footprint"),
    "peak_memory_bytes": (1e9, "GB", "memory per device"),
    "offloaded_bytes": (1e9, "GB", "offloaded bytes"),
    "capacity_bytes": (1e9, "GB", "memory capacity"),
}


def unit_of(name: str) -> tuple[float, str, str]:
    """(scale, unit, words) to show a metric or parameter: value / scale in unit."""
    if name in _UNITS:
        return _UNITS[name]
    if name.startswith("peak_"):
        fmt = name[5:]
        return 1e12, "TOPS" if fmt in _INT_FORMATS else "TFLOPS", f"peak {fmt.upper()} compute"
    return 1.0, "", name.replace("_", " ")


def label_of(name: str) -> str:
    """Axis label with the unit: 'memory bandwidth (TB/s)'."""
    _, unit, words = unit_of(name)
    return f"{words} ({unit})" if unit else words


def _number(x: float) -> str:
    return f"{x:,.0f}" if 1e4 <= abs(x) < 1e12 else f"{x:.4g}"


def human(name: str, value, unit: bool = True) -> str:
    """A value of a metric or parameter in its display unit: '3.35 TB/s' ('3.35' without
    ``unit``, in the unit of :func:`label_of`); with the unit, times of a second or more
    are shown in seconds."""
    if isinstance(value, (bool, np.bool_, str)) or value is None:
        return "-" if value is None else str(value)
    try:
        v = float(value)
    except (TypeError, ValueError):
        return str(value)
    if math.isnan(v):
        return "-"
    scale, u, _ = unit_of(name)
    if unit and u == "ms" and abs(v) >= 1.0:
        scale, u = 1.0, "s"
    x = v / scale
    if name in ("batch", "prompt_len", "gen_len", "devices", "tp", "pp", "ep") and x == int(x):
        text = f"{int(x):,}"
    else:
        text = _number(x)
    return f"{text} {u}" if unit and u and u not in ("sequences", "devices", "stages", "groups") else text


# --------------------------------------------------------------------------- plumbing

def _figure(ncols: int = 1, width: float = 7.0, height: float = 5.0):
    """A Figure with ``ncols`` axes, seaborn's style, no pyplot."""
    import seaborn as sns
    from matplotlib.figure import Figure
    sns.set_theme(style="whitegrid", context="notebook")
    fig = Figure(figsize=(width * ncols, height), layout="constrained")
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    return fig, list(axes)


def _save(fig, path: Path) -> None:
    path = Path(path)
    atomic_write(path, lambda tmp: fig.savefig(tmp, format=path.suffix.lstrip(".") or "png", dpi=110))


def _log_if_wide(ax, axis: str, values) -> bool:
    """Log scale (ticks as plain numbers) when the values span more than 30x."""
    from matplotlib.ticker import FuncFormatter, NullFormatter
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v) & (v > 0)]
    if len(v) and v.max() / v.min() > 30:
        (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
        which = ax.xaxis if axis == "x" else ax.yaxis
        which.set_major_formatter(FuncFormatter(lambda t, _: f"{t:g}"))
        which.set_minor_formatter(NullFormatter())
        return True
    return False


def _ids(df) -> list[int]:
    return [int(p) for p in df["point"]] if "point" in df else [int(i) for i in df.index]


# --------------------------------------------------------------------------- Pareto

def pareto_plot(path: Path, background, front, x: str, y: str, senses: dict, title: str = "") -> dict:
    """Feasible points (``background``, a sample) as a light cloud and the Pareto rows
    (``front``) highlighted; the 2-objective front of (x, y) among them as a step line."""
    fig, (ax,) = _figure()
    sx, _, _ = unit_of(x)
    sy, _, _ = unit_of(y)
    bg = background[[x, y]].to_numpy(dtype=float) if len(background) else np.empty((0, 2))
    fr = front[[x, y]].to_numpy(dtype=float) if len(front) else np.empty((0, 2))
    cloud = ax.scatter(bg[:, 0] / sx, bg[:, 1] / sy, s=6, color="0.75", alpha=0.5, linewidths=0, rasterized=True,
                       label=f"feasible designs ({len(bg):,} shown)")
    many = len(fr) > 2000
    shown = np.isfinite(fr).all(axis=1)
    what = f"{len(fr):,} designs" if shown.all() else f"{int(shown.sum()):,} of {len(fr):,} designs have both values"
    hi = ax.scatter(fr[:, 0] / sx, fr[:, 1] / sy, s=5 if many else 16, color="C3", edgecolors="k",
                    linewidths=0 if many else 0.4, zorder=3, rasterized=many, label=f"Pareto front ({what})")
    for c in (cloud, hi):          # thousands of points: keep them out of the layout's bounding boxes
        c.set_in_layout(False)
    front2d = []
    if len(fr) and x in senses and y in senses:
        ok = np.isfinite(fr).all(axis=1)
        m = np.zeros(len(fr), dtype=bool)
        if ok.any():
            m[ok] = pareto_mask(fr[ok], [senses[x], senses[y]])
        sub = front[m].sort_values(x)
        front2d = _ids(sub)
        ax.step(sub[x].to_numpy(float) / sx, sub[y].to_numpy(float) / sy,
                where="post" if senses[x] == "min" else "pre", color="k", lw=1.0,
                zorder=4, label=f"front of these two objectives ({len(sub)})")
    ax.set_xlabel(label_of(x) + (f" — {senses[x]}imize" if x in senses else ""))
    ax.set_ylabel(label_of(y) + (f" — {senses[y]}imize" if y in senses else ""))
    allx = np.concatenate([bg[:, 0], fr[:, 0]]) / sx
    ally = np.concatenate([bg[:, 1], fr[:, 1]]) / sy
    _log_if_wide(ax, "x", allx)
    _log_if_wide(ax, "y", ally)
    ax.set_title(title or f"{unit_of(y)[2]} vs {unit_of(x)[2]}")
    # 'best' scans every point for a free corner: fine for hundreds, seconds for 10^5; the
    # corner beyond the front (the ideal one) is empty by definition
    if len(bg) + len(fr) <= 5000:
        loc = "best"
    else:
        loc = (("upper " if senses.get(y, "max") == "max" else "lower ")
               + ("right" if senses.get(x) == "max" else "left"))
    ax.legend(loc=loc, fontsize="small")
    _save(fig, path)
    return {"kind": "pareto", "x": x, "y": y, "x_unit": unit_of(x)[1], "y_unit": unit_of(y)[1],
            "x_scale": sx, "y_scale": sy, "x_label": ax.get_xlabel(), "y_label": ax.get_ylabel(),
            "x_log": ax.get_xscale() == "log", "y_log": ax.get_yscale() == "log",
            "background_points": len(bg), "highlighted": _ids(front),
            "highlighted_not_drawn": [i for i, ok in zip(_ids(front), shown) if not ok],   # a value is unknown
            "highlighted_x": np.asarray(hi.get_offsets(), dtype=float)[:, 0].tolist(),
            "highlighted_y": np.asarray(hi.get_offsets(), dtype=float)[:, 1].tolist(),
            "front_2d": front2d}


# --------------------------------------------------------------------------- roofline

def roofline_plot(path: Path, analysis, title: str = "") -> dict:
    """Operators of the prefill and of a decode step by arithmetic intensity and attained
    performance (ops / time of one instance), under the design's roofline: the memory
    slope (ops/s = intensity x ``analysis.memory_bandwidth``) and the compute ceiling of
    each format used (the peak its operators ran at)."""
    fig, (ax,) = _figure(width=8.5, height=6.0)
    bw = analysis.memory_bandwidth
    rows = []
    for stage, rs in (("prefill", analysis.prefill), ("decode", analysis.decode)):
        for r in rs:
            ai, t = r["arithmetic_intensity"], r["time_s"]
            perf = r["ops"] / t if t > 0 else 0.0
            ok = r["ops"] > 0 and 0 < ai < math.inf and perf > 0
            rows.append({"stage": stage, "name": r["name"], "place": r["place"], "compute_format": r["compute_format"],
                         "bound": r["bound"], "arithmetic_intensity": ai if math.isfinite(ai) else None,
                         "ops_per_s": perf, "plotted": bool(ok)})
    formats = sorted({r["compute_format"] for r in rows if r["plotted"] and r["compute_format"] not in ("-",)})
    integer = any(f in _INT_FORMATS for f in formats)
    unit = "TOPS" if integer else "TFLOPS"
    ceilings = {}
    for stage_rows in (analysis.prefill, analysis.decode):
        for r in stage_rows:
            f, peak = r["compute_format"], r.get("peak_ops_per_s")
            if f in formats and r["place"] != "pim" and peak and math.isfinite(peak):
                ceilings[f] = max(ceilings.get(f, 0.0), float(peak))
    pts = [r for r in rows if r["plotted"]]
    ais = np.array([r["arithmetic_intensity"] for r in pts], float)
    lo = min(ais.min() / 3 if len(ais) else 0.1, 0.1)
    ridge = [c / bw for c in ceilings.values()]
    hi = max([ais.max() * 3 if len(ais) else 1e3] + [x * 10 for x in ridge])
    xs = np.geomspace(lo, hi, 400)
    ax.plot(xs, xs * bw / 1e12, color="0.3", lw=1, ls="--", label=f"memory slope {bw / 1e12:.3g} TB/s")
    for i, (f, c) in enumerate(sorted(ceilings.items(), key=lambda kv: -kv[1])):
        ax.plot(xs, np.minimum(xs * bw, c) / 1e12, color=f"C{i + 2}", lw=1.8,
                label=f"{f} ceiling {c / 1e12:.4g} {unit}")
    marks = {"prefill": ("o", "C0"), "decode": ("s", "C1")}
    for stage, (mk, col) in marks.items():
        sp = [r for r in pts if r["stage"] == stage]
        if sp:
            ax.scatter([r["arithmetic_intensity"] for r in sp], [r["ops_per_s"] / 1e12 for r in sp], marker=mk,
                       color=col, edgecolors="k", linewidths=0.4, s=36, zorder=4, label=f"{stage} operators")
            for r in sp:
                ax.annotate(r["name"], (r["arithmetic_intensity"], r["ops_per_s"] / 1e12), fontsize=6,
                            xytext=(3, 2), textcoords="offset points", color=col)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (ops/byte)")
    ax.set_ylabel(f"attained performance ({unit})")
    ax.set_title(title or "roofline")
    ax.legend(loc="lower right", fontsize="x-small")
    _save(fig, path)
    return {"kind": "roofline", "x": "arithmetic_intensity", "y": "ops_per_s", "x_unit": "ops/byte",
            "y_unit": unit, "y_scale": 1e12, "x_label": ax.get_xlabel(), "y_label": ax.get_ylabel(),
            "x_log": True, "y_log": True, "memory_bandwidth": bw, "ceilings": ceilings, "operators": rows}


# --------------------------------------------------------------------------- breakdown

def breakdown_plot(path: Path, designs: list[dict], min_share: float = 0.03) -> dict:
    """Stacked bars of per-operator time (prefill; one decode step) of a few designs, as
    shares of each step (designs differ by orders of magnitude) with the step's time
    written above its bar.

    ``designs``: [{'label', 'point', 'analysis'}]. Operators below ``min_share`` of
    their step in every design are summed into 'other'."""
    import seaborn as sns

    fig, axes = _figure(ncols=2, width=5.5 + 0.6 * len(designs), height=5.5)
    record = {"kind": "breakdown", "x": "design", "y": "share of step time", "y_unit": "%",
              "designs": [{"label": d["label"], "point": d["point"]} for d in designs], "stages": {}}
    for ax, stage, words in zip(axes, ("prefill", "decode"), ("prefill", "one decode step")):
        per = [{r["name"]: 0.0 for r in getattr(d["analysis"], stage)} for d in designs]
        for p, d in zip(per, designs):
            for r in getattr(d["analysis"], stage):
                p[r["name"]] += r["total_time_s"]
        totals = np.array([sum(p.values()) for p in per])
        names = list(dict.fromkeys(n for p in per for n in p))
        keep = [n for n in names if any(p.get(n, 0.0) >= min_share * max(t, 1e-300) for p, t in zip(per, totals))]
        other = [n for n in names if n not in keep]
        series = keep + (["other"] if other else [])
        pal = sns.color_palette("tab20", len(series))
        bottom = np.zeros(len(designs))
        xs = np.arange(len(designs))
        values = {}
        for i, n in enumerate(series):
            v = np.array([sum(p.get(o, 0.0) for o in other) if n == "other" else p.get(n, 0.0) for p in per])
            values[n] = [float(a) for a in v]
            share = np.divide(v, totals, out=np.zeros_like(v), where=totals > 0) * 100
            ax.bar(xs, share, bottom=bottom, color=pal[i], label=n, width=0.6, edgecolor="white", linewidth=0.4)
            bottom += share
        for x0, t in zip(xs, totals):
            ax.annotate(si(float(t), "s"), (x0, 100), xytext=(0, 3), textcoords="offset points", ha="center",
                        fontsize="small")
        ax.set_ylim(0, 108)
        ax.set_xticks(xs, [d["label"] for d in designs], fontsize="small")
        ax.set_ylabel(f"share of {words} time (%)")
        ax.set_xlabel("design (time of the step above its bar)")
        ax.set_title(f"{words}: time per operator")
        ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
        record["stages"][stage] = {"operators": series, "other": other, "time_s": values,
                                   "total_s": [float(t) for t in totals], "y_label": ax.get_ylabel()}
    record["y_label"] = axes[1].get_ylabel()
    _save(fig, path)
    return record


# --------------------------------------------------------------------------- sweep curves

def sweep_plot(path: Path, panels: list[dict], title: str) -> dict:
    """Curves against a swept parameter. Each panel is a dict with ``data`` (rows with
    point, feasible, x and ys), ``x``, ``ys``, ``hue`` (a column giving one line per
    value, or None), and optionally ``shared_y`` (a y label: all ys on one axes, in SI
    units) and ``log_y``. Without ``shared_y`` each y gets its own axes. Feasible points
    are joined by lines; infeasible ones are grey crosses."""
    import seaborn as sns
    n_ax = sum(1 if p.get("shared_y") else len(p["ys"]) for p in panels)
    fig, axes = _figure(ncols=n_ax, width=5.6 if n_ax > 1 else 7.0, height=4.6)
    it = iter(axes)
    record = {"kind": "sweep", "panels": []}
    for p in panels:
        data, x, ys, hue, shared = p["data"], p["x"], p["ys"], p.get("hue"), p.get("shared_y")
        groups = [(None, data)] if hue is None else list(data.groupby(hue, sort=True, observed=True))
        pal = sns.color_palette("deep", max(len(groups) * len(ys), 1))
        rec = {"x": x, "ys": ys, "hue": hue, "x_unit": unit_of(x)[1],
               "y_units": {y: ("s" if shared else unit_of(y)[1]) for y in ys}, "lines": [], "y_labels": []}
        ax = next(it) if shared else None
        for y in ys:
            if not shared:
                ax = next(it)
            sy = 1.0 if shared else unit_of(y)[0]
            for gi, (key, g) in enumerate(groups):
                g = g.sort_values(x)
                ok, bad = g[g["feasible"]], g[~g["feasible"]]
                color = pal[ys.index(y) if shared else gi]     # shared axes: colour = metric, dashes = hue
                style = ("-", "--", ":", "-.")[gi % 4] if shared else "-"
                words = unit_of(y)[2]
                name = (f"{words}, {hue} = {key}" if shared else f"{hue} = {key}") if hue else words
                ax.plot(ok[x].to_numpy(float), ok[y].to_numpy(float) / sy, marker="o", ms=4, color=color, ls=style,
                        label=name)
                if len(bad):
                    ax.scatter(bad[x].to_numpy(float), bad[y].to_numpy(float) / sy, marker="x", color="0.6", s=18,
                               zorder=3, label="infeasible" if gi == 0 and (not shared or y == ys[0]) else None)
                rec["lines"].append({"y": y, "hue": None if key is None else (key.item() if hasattr(key, "item")
                                                                                 else key),
                                     "points": _ids(ok), "infeasible_points": _ids(bad),
                                     "x_values": [float(v) for v in ok[x]], "y_values": [float(v) for v in ok[y]]})
            if not shared or y == ys[-1]:
                ax.set_xlabel(label_of(x))
                ax.set_ylabel(shared or label_of(y))
                xv = data[x].to_numpy(float)
                if len(np.unique(xv)) > 2 and xv.min() > 0 and xv.max() / xv.min() >= 8:
                    from matplotlib.ticker import FuncFormatter
                    ax.set_xscale("log", base=2)
                    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
                yv = data[list(ys) if shared else [y]].to_numpy(float) / sy
                if p.get("log_y") or _log_if_wide(ax, "y", yv):
                    ax.set_yscale("log")
                ax.legend(fontsize="x-small")
                rec["x_label"] = ax.get_xlabel()
                rec["y_labels"].append(ax.get_ylabel())
        record["panels"].append(rec)
    import textwrap
    fig.suptitle("\n".join(textwrap.wrap(title, 55 * n_ax if n_ax > 1 else 65)), fontsize="medium")
    _save(fig, path)
    return record


# --------------------------------------------------------------------------- compare

def compare_plot(path: Path, rows: list[dict]) -> dict:
    """Bars per hardware of TTFT, TPOT, throughput (system, per user, per device) and
    the memory footprint against capacity; hatched bars do not fit."""
    metrics = ["ttft_s", "tpot_s", "output_tokens_per_s", "output_tokens_per_s_per_user",
               "output_tokens_per_s_per_device", "peak_memory_bytes"]
    import seaborn as sns
    from matplotlib.figure import Figure
    sns.set_theme(style="whitegrid", context="notebook")
    fig = Figure(figsize=(4.2 * 3, 3.6 * 2), layout="constrained")
    axes = fig.subplots(2, 3).ravel()
    names = [r["hardware"] for r in rows]
    pal = sns.color_palette("deep", len(rows))
    xs = np.arange(len(rows))
    labels = {}
    for ax, m in zip(axes, metrics):
        s, _, _ = unit_of(m)
        v = np.array([r[m] for r in rows], float) / s
        bars = ax.bar(xs, v, color=pal)
        for b, r in zip(bars, rows):
            if not r["fits"]:
                b.set_hatch("//")
                b.set_edgecolor("k")
        if m == "peak_memory_bytes":
            cap = np.array([r["capacity_bytes"] for r in rows]) / s
            ax.scatter(xs, cap, marker="_", s=600, color="k", zorder=3, label="capacity per device")
            ax.legend(fontsize="x-small", loc="best")
        ax.set_xticks(xs, names, rotation=25, ha="right", fontsize="small")
        ax.set_ylabel(label_of(m))
        labels[m] = ax.get_ylabel()
    first = rows[0]
    fig.suptitle(f"{first['model']}: batch {first['batch']}, prompt {first['prompt_len']}, "
                 f"generate {first['gen_len']}, {first['weights']}/{first['activations']}/{first['kv']}"
                 " (hatched: does not fit)", fontsize="medium")
    _save(fig, path)
    return {"kind": "compare", "hardware": names, "metrics": metrics, "y_labels": labels}
