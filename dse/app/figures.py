"""The figures and tables of ``dse explore`` (Plotly), from what ``analyze_point`` returns and
what a run kept: pure functions of their inputs, drawing what they are given and computing no
physics (attained ops/s is an operator's ops over its time, as ``dse.present.plots.roofline_plot``
draws it)."""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from dash import html

from dse.present.display import json_text, quantity_text
from dse.present.plots import op_colour, words_of
from dse.present.report import BACKGROUND_SAMPLE, SEED
from dse.system.analysis import ROW_KEYS, Analysis

#: the stages of an analysis and their marker in the roofline
STAGES = {"prefill": "circle", "decode": "square"}
#: the summary's byte figures drawn as the memory of a design point, in order
MEMORY_PARTS = ("weights_bytes", "kv_cache_bytes", "activation_bytes", "engine_reserve_bytes")
#: the summary's figures of memory drawn as lines beside the parts
MEMORY_LINES = ("peak_memory_bytes", "capacity_bytes")
#: the Plotly settings every figure of the app uses: no logo link, no mode bar button that leaves the page
GRAPH_CONFIG = {"displaylogo": False, "modeBarButtonsToRemove": ["sendDataToCloud"], "showSendToCloud": False}


def operator_rows(a: Analysis) -> list[dict]:
    """The per-operator rows of an analysis, one list: 'stage' (prefill or decode), then every
    key of ``ROW_KEYS`` in SI units, an infinite or missing number as None: the rows
    ``dse analyze --format json`` prints under 'prefill' and 'decode'."""
    rows = [{"stage": st, **{k: r[k] for k in ROW_KEYS}} for st, rs in (("prefill", a.prefill), ("decode", a.decode))
            for r in rs]
    return json.loads(json_text(rows))


def summary_rows(summary: dict) -> list[dict]:
    """The summary of an analysis as (figure, value in its unit) rows; nested figures left out."""
    return [{"figure": k, "value": quantity_text(k, v)} for k, v in summary.items()
            if not isinstance(v, (dict, list, tuple))]


def cell_text(v) -> str:
    """A table cell: a number to 4 significant digits ('' for None), anything else as text."""
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


#: the style of the app's tables
TABLE_STYLE = {"borderCollapse": "collapse", "fontSize": "12px"}
_CELL = {"border": "1px solid #ccc", "padding": "1px 4px"}


def html_table(rows: list[dict], columns: list[tuple[str, str]]) -> html.Table:
    """``rows`` as an HTML table: a header of ``columns``' titles, then one row per row, each
    cell of a column's key (``cell_text``)."""
    head = html.Thead(html.Tr([html.Th(title, style=_CELL) for _, title in columns]))
    body = html.Tbody([html.Tr([html.Td(cell_text(r.get(k)), style=_CELL) for k, _ in columns]) for r in rows])
    return html.Table([head, body], style=TABLE_STYLE)


def _attained(r: dict) -> float | None:
    """An operator's attained ops/s: its ops over the time of one instance (None when it does no ops)."""
    t, ops, ai = r["time_s"], r["ops"], r["arithmetic_intensity"]
    ok = ops and t and ai is not None and 0 < ai < math.inf
    return ops / t if ok else None


def roofline_figure(a: Analysis) -> go.Figure:
    """The operators of the prefill and of one decode step by arithmetic intensity (ops/byte) and
    attained ops/s, under the device's roofs: the memory slope (intensity x memory bandwidth)
    and the ceiling of each compute format used (the largest peak its operators ran at, PIM aside)."""
    fig = go.Figure()
    rows = [r for r in operator_rows(a) if _attained(r)]
    bw = a.memory_bandwidth
    ceilings: dict[str, float] = {}
    for r in rows:
        f, peak = r["compute_format"], r["peak_ops_per_s"]
        if f != "-" and r["place"] != "pim" and peak:
            ceilings[f] = max(ceilings.get(f, 0.0), float(peak))
    ais = np.array([r["arithmetic_intensity"] for r in rows], float)
    if len(ais) and bw and math.isfinite(bw):
        lo = min(ais.min() / 3, 0.1)
        hi = max([ais.max() * 3] + [10 * c / bw for c in ceilings.values()])
        xs = np.geomspace(lo, hi, 200)
        fig.add_trace(go.Scatter(x=xs, y=xs * bw, mode="lines", name=f"memory {quantity_text('memory_bandwidth', bw)}",
                                 line={"dash": "dash", "color": "#555"}, hoverinfo="skip"))
        for f, c in sorted(ceilings.items(), key=lambda kv: -kv[1]):
            fig.add_trace(go.Scatter(x=xs, y=np.minimum(xs * bw, c), mode="lines", hoverinfo="skip",
                                     name=f"{f} roof {quantity_text('peak_ops_per_s', c, f)}"))
    for stage, symbol in STAGES.items():
        sr = [r for r in rows if r["stage"] == stage]
        fig.add_trace(go.Scatter(
            x=[r["arithmetic_intensity"] for r in sr], y=[_attained(r) for r in sr], mode="markers",
            name=f"{stage} operators", marker={"symbol": symbol, "size": 10, "color": [op_colour(r["name"]) for r in sr],
                                               "line": {"width": 1, "color": "black"}},
            text=[r["name"] for r in sr], customdata=[[r["bound"], r["compute_format"], r["time_s"]] for r in sr],
            hovertemplate=(f"<b>%{{text}}</b> ({stage})<br>%{{x:.3g}} ops/byte, %{{y:.3g}} ops/s<br>"
                           "%{customdata[0]}-bound, %{customdata[1]}, %{customdata[2]:.3g} s<extra></extra>")))
    fig.update_layout(title="roofline: every operator", xaxis={"type": "log", "title": "arithmetic intensity (ops/byte)"},
                      yaxis={"type": "log", "title": "attained performance (ops/s)"}, height=460,
                      margin={"l": 60, "r": 10, "t": 40, "b": 50})
    return fig


def breakdown_figure(a: Analysis) -> go.Figure:
    """The time of each operator in the prefill and in one decode step (time of one instance x
    instances), as bars coloured by what bounds it."""
    rows = operator_rows(a)
    fig = go.Figure()
    for bound in dict.fromkeys(r["bound"] for r in rows):
        br = [r for r in rows if r["bound"] == bound]
        fig.add_trace(go.Bar(x=[r["total_time_s"] for r in br], y=[f"{r['stage']}: {r['name']}" for r in br],
                             orientation="h", name=f"{bound}-bound",
                             hovertemplate="%{y}: %{x:.3g} s<extra>" + bound + "</extra>"))
    fig.update_layout(title="time per step by operator (s)", barmode="stack", height=max(300, 18 * len(rows) + 80),
                      yaxis={"autorange": "reversed"}, xaxis={"title": "seconds"},
                      margin={"l": 200, "r": 10, "t": 40, "b": 40})
    return fig


def memory_figure(summary: dict) -> go.Figure:
    """The design's memory: weights, KV cache, activations and engine reserve stacked, with its
    peak footprint and the capacity as lines (bytes, as the summary gives them)."""
    fig = go.Figure()
    for k in MEMORY_PARTS:
        v = summary.get(k)
        if v is not None and math.isfinite(v):
            fig.add_trace(go.Bar(x=["memory"], y=[v], name=f"{words_of(k)} {quantity_text(k, v)}"))
    for k, dash in zip(MEMORY_LINES, ("dot", "dash")):
        v = summary.get(k)
        if v is not None and math.isfinite(v):
            fig.add_hline(y=v, line_dash=dash, annotation_text=f"{words_of(k)} {quantity_text(k, v)}")
    fig.update_layout(title="memory (bytes)", barmode="stack", height=360, margin={"l": 60, "r": 10, "t": 40, "b": 30})
    return fig


def empty_figure(text: str) -> go.Figure:
    """A figure with no data, saying ``text``."""
    fig = go.Figure()
    fig.update_layout(annotations=[{"text": text, "showarrow": False, "xref": "paper", "yref": "paper", "x": 0.5,
                                    "y": 0.5}], xaxis={"visible": False}, yaxis={"visible": False}, height=300)
    return fig


def scatter_figure(df: pd.DataFrame, x: str, y: str, colour: str | None, facet: str | None, key: str,
                   hover: list[str]) -> tuple[go.Figure, int, int]:
    """The rows of ``df`` with a finite ``x`` and ``y`` as dots (one trace per colour value, one
    panel per facet value), each dot carrying its design id (``key``) as customdata and the
    columns ``hover`` in its hover text. Above ``BACKGROUND_SAMPLE`` rows, a uniform sample of
    them (seed ``SEED``, as the report draws its clouds). Returns (figure, dots drawn, rows with both values)."""
    import plotly.express as px
    ok = np.isfinite(df[x].to_numpy(float)) & np.isfinite(df[y].to_numpy(float)) if len(df) else np.zeros(0, bool)
    d = df[ok]
    drawable = len(d)
    if drawable > BACKGROUND_SAMPLE:
        d = d.iloc[np.sort(np.random.default_rng(SEED).choice(drawable, BACKGROUND_SAMPLE, replace=False))]
    if not len(d):
        return empty_figure("no design passes the filters with a value of both axes"), 0, 0
    d = d.copy()
    for c in {colour, facet} - {None}:
        d[c] = d[c].astype(str)
    hover = [c for c in dict.fromkeys(hover) if c in d and c not in (x, y, key)]
    fig = px.scatter(d, x=x, y=y, color=colour, facet_col=facet, facet_col_wrap=3 if facet else 0,
                     custom_data=[key], hover_data={c: True for c in hover} | {key: True},
                     render_mode="webgl" if len(d) > 5_000 else "svg")
    fig.update_layout(height=520, margin={"l": 60, "r": 10, "t": 40, "b": 50}, clickmode="event+select")
    return fig, len(d), drawable
