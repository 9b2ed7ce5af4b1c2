"""Interactive figures of ``report.html``: plotly charts of the Pareto fronts, the sweep
curves and a study's declared comparisons, the same rows as their PNGs (``dse.present.plots``).

A chart is a plain JSON-ready spec, ``{"data": [traces], "layout": {...}}``, built from
DataFrame columns (one trace per colour value and panel, never a Python loop over designs);
``dse.present.document`` writes it into the page with the plotly.js library inlined once
(:func:`plotly_js`, read from the installed plotly package: no CDN, nothing fetched), so the
page still works offline. Hovering a design shows its id and parameters (``hover``: the
columns named, each in its display unit, formatted in the browser), the legend toggles a
group, and dragging zooms.
"""
from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import numpy as np

from basis.errors import DseError
from dse.present.plots import axis_unit, label_of, wide

#: at most this many feasible designs of a Pareto plot's cloud are drawn in its chart (a
#: fixed-seed sample; the PNG draws them all, as a density when many): SVG points stay fast
CHART_CLOUD = 3000
#: the front of a Pareto chart is drawn in full up to this many designs, beyond as a fixed-seed sample
CHART_FRONT = 3000
SEED = 0
#: the tab10 colours (as the PNGs' palette), one per colour value, cycled beyond ten
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")
#: the chart options: no plotly logo, no link to plotly's cloud
CONFIG = {"displaylogo": False, "responsive": True, "showLink": False}


@functools.cache
def plotly_js() -> str:
    """The plotly.js library (minified JavaScript text) shipped with the plotly package (found,
    not imported: the Python package is not needed); DseError when plotly is not installed."""
    spec = importlib.util.find_spec("plotly")
    if spec is None or not spec.submodule_search_locations:
        raise DseError("report.html: its charts need plotly.js, from the plotly package, which is not installed "
                       "(pip install plotly)")
    path = Path(next(iter(spec.submodule_search_locations))) / "package_data" / "plotly.min.js"
    try:
        return path.read_text(encoding="utf-8")
    except OSError as e:
        raise DseError(f"{path}: cannot read plotly.js for report.html's charts: {e.strerror or e}") from None


def _values(a) -> list:
    """A column as a JSON-ready list: NaN and infinities as None (null), numpy scalars as Python ones."""
    a = np.asarray(a)
    if a.dtype.kind == "f":
        return np.where(np.isfinite(a), a, None).tolist()
    if a.dtype.kind in "biu":
        return a.tolist()
    return a.astype(str).tolist()


def _hover(df, hover: list[str]) -> tuple[list, str]:
    """(customdata rows, hovertemplate): the ``hover`` columns of ``df``, numbers divided into
    their display unit (``axis_unit``), the template naming each with its unit."""
    cols, lines = [], []
    for i, c in enumerate(h for h in hover if h in df):
        v = df[c].to_numpy()
        if v.dtype.kind in "fiu" and c not in ("point", "trial"):
            s, u, _ = axis_unit(c, v)
            cols.append(v.astype(float) / s)
            lines.append(f"{c}: %{{customdata[{i}]:.4~g}}" + (f" {u}" if u else ""))
        else:
            cols.append(v.astype(str) if v.dtype.kind not in "iu" else v)
            lines.append(f"{c}: %{{customdata[{i}]}}")
    if not cols:
        return [], ""
    table = np.empty((len(df), len(cols)), dtype=object)
    for i, v in enumerate(cols):
        table[:, i] = v
    return np.where(table != table, None, table).tolist(), "<br>".join(lines) + "<extra></extra>"


def _axis(name: str, values, title: str | None = None) -> tuple[float, dict]:
    """(scale, layout axis) of an axis showing ``values`` (SI) of ``name``: its label with the
    unit its values call for, logarithmic when they span more than 30x."""
    v = np.asarray(values, dtype=float) if np.asarray(values).dtype.kind in "fiub" else None
    if v is None:               # names: a category axis
        return 1.0, {"title": {"text": title or name}, "type": "category"}
    s, u, _ = axis_unit(name, v)
    return s, {"title": {"text": title or label_of(name, u)}, "type": "log" if wide(v / s) else "linear"}


def _scaled(df, col: str, scale: float) -> list:
    v = df[col].to_numpy()
    return _values(v.astype(float) / scale if v.dtype.kind in "fiub" and scale != 1.0 else v)


def _trace(df, x: str, y: str, sx: float, sy: float, hover: list[str], name: str, colour: str, mode: str,
           **extra) -> dict:
    custom, template = _hover(df, hover)
    return {"type": "scatter", "mode": mode, "x": _scaled(df, x, sx), "y": _scaled(df, y, sy), "name": name,
            "marker": {"color": colour, "size": 7}, "line": {"color": colour}, "customdata": custom,
            "hovertemplate": template, **extra}


def _sample(df, n: int):
    """At most ``n`` rows of ``df``, a fixed-seed uniform sample in their order."""
    if len(df) <= n:
        return df
    return df.iloc[np.sort(np.random.default_rng(SEED).choice(len(df), n, replace=False))]


def _layout(title: str, **items) -> dict:
    return {"title": {"text": title, "font": {"size": 14}}, "hovermode": "closest", "template": None,
            "legend": {"title": {"text": items.pop("legend_title", "")}}, "margin": {"t": 60}, **items}


def pareto_chart(background, front, x: str, y: str, hue: str | None, hover: list[str], title: str) -> dict:
    """A Pareto plot as a chart: the feasible designs (``background``, at most ``CHART_CLOUD``
    of them) in grey, the Pareto designs (``front``) one trace per ``hue`` value, ``y`` against
    ``x``; hovering a design shows its ``hover`` columns."""
    front = _sample(front, CHART_FRONT)
    both = np.concatenate([background[x].to_numpy(float), front[x].to_numpy(float)])
    sx, ax_x = _axis(x, both)
    sy, ax_y = _axis(y, np.concatenate([background[y].to_numpy(float), front[y].to_numpy(float)]))
    cloud = _sample(background, CHART_CLOUD)
    data = [_trace(cloud, x, y, sx, sy, hover, "feasible designs", "#c8c8c8", "markers",
                   marker={"color": "#c8c8c8", "size": 5})] if len(cloud) else []
    groups = [(None, front)] if hue is None or hue not in front else list(front.groupby(hue, sort=True,
                                                                                         observed=True))
    for i, (value, g) in enumerate(groups):
        name = "Pareto designs" if hue is None else f"{hue} = {value}"
        data.append(_trace(g, x, y, sx, sy, hover, name, COLOURS[i % len(COLOURS)], "markers",
                           marker={"color": COLOURS[i % len(COLOURS)], "size": 9,
                                   "line": {"color": "black", "width": 1}}))
    return {"data": data, "layout": _layout(title, xaxis=ax_x, yaxis=ax_y, legend_title=hue or "")}


def panels_chart(panels: list[dict], hover: list[str], title: str, kind: str = "line") -> dict:
    """Curves in a grid of panels as a chart. ``panels``: dicts with ``data`` (rows with
    ``feasible``), ``x``, ``y``, ``colour`` (a column: one trace per value, or None), ``row``
    and ``col`` (1-based) and ``label`` (the panel's title); feasible designs joined along x
    (``kind`` line) or as points (scatter), infeasible ones as grey crosses. A colour value
    keeps its colour in every panel; its legend entry toggles it in all of them."""
    rows = max(p["row"] for p in panels)
    cols = max(p["col"] for p in panels)
    gap_x, gap_y = 0.08, 0.12
    width, height = (1 - gap_x * (cols - 1)) / cols, (1 - gap_y * (rows - 1)) / rows
    layout = _layout(title, height=max(420, 330 * rows), legend_title=next((p["colour"] for p in panels
                                                                           if p["colour"]), ""))
    data, colours, shown = [], {}, set()
    for p in panels:
        n = (p["row"] - 1) * cols + p["col"]
        suffix = "" if n == 1 else str(n)
        d, x, y, colour = p["data"], p["x"], p["y"], p["colour"]
        sx, ax_x = _axis(x, d[x].to_numpy())
        sy, ax_y = _axis(y, d[y].to_numpy())
        x0 = (p["col"] - 1) * (width + gap_x)
        y0 = 1 - p["row"] * height - (p["row"] - 1) * gap_y
        layout[f"xaxis{suffix}"] = {**ax_x, "domain": [x0, x0 + width], "anchor": f"y{suffix}"}
        layout[f"yaxis{suffix}"] = {**ax_y, "domain": [y0, y0 + height], "anchor": f"x{suffix}"}
        if p.get("label"):
            layout.setdefault("annotations", []).append(
                {"text": p["label"], "showarrow": False, "xref": "paper", "yref": "paper", "x": x0 + width / 2,
                 "y": y0 + height, "yanchor": "bottom", "font": {"size": 12}})
        ok = d["feasible"].to_numpy(bool)
        groups = [(None, d[ok])] if colour is None else list(d[ok].groupby(colour, sort=True, observed=True))
        for value, g in groups:
            name = y if colour is None else f"{colour} = {value}"
            c = colours.setdefault(name, COLOURS[len(colours) % len(COLOURS)])
            g = g.sort_values(x, kind="stable")
            data.append(_trace(g, x, y, sx, sy, hover, name, c, "lines+markers" if kind == "line" else "markers",
                               xaxis=f"x{suffix}", yaxis=f"y{suffix}", legendgroup=name,
                               showlegend=name not in shown))
            shown.add(name)
        bad = d[~ok]
        if len(bad):
            data.append(_trace(bad, x, y, sx, sy, [*hover, "reason"], "infeasible", "#9a9a9a", "markers",
                               marker={"color": "#9a9a9a", "symbol": "x", "size": 7}, xaxis=f"x{suffix}",
                               yaxis=f"y{suffix}", legendgroup="infeasible", showlegend="infeasible" not in shown))
            shown.add("infeasible")
    return {"data": data, "layout": layout}
