"""What each control of ``dse explore`` changes: pure functions of the controls' values (testable
without a browser), then ``register``, their Dash wiring.

The design-point view is ``analyze_point`` of the controls' columns: the one ``evaluate`` with
``explain=True`` that ``dse analyze`` prints. A point that cannot be evaluated, does not fit or is
infeasible shows the reason's text, never a traceback. The run view reads the run's columns as
it needs them (``dse.app.data.Run``) and filters them in memory.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from dash import ALL, Input, Output, State, ctx, dcc, html, no_update

from basis.errors import DseError
from dse.app.data import ON_FRONT, Run, control_values, filter_mask, open_run, point_columns, shown_columns
from dse.app.figures import (
    breakdown_figure,
    empty_figure,
    html_table,
    memory_figure,
    operator_rows,
    roofline_figure,
    scatter_figure,
    summary_rows,
)
from dse.present.display import quantity_text
from dse.present.plots import THROUGHPUT
from dse.system.analysis import ROW_KEYS, analyze_point
from dse.system.params import REQUIRED
from dse.system.reasons import MEMORY_CODES

#: the columns of the operator table: (key, title)
OPERATOR_COLUMNS = [("stage", "stage"), *((k, k) for k in ROW_KEYS)]
#: the columns of the summary and of a hovered design
SUMMARY_COLUMNS = [("figure", "figure"), ("value", "value")]
DESIGN_COLUMNS = [("column", "column"), ("value", "value")]
#: at most this many designs are kept selected for the side-by-side comparison
MAX_SELECTED = 8

# --------------------------------------------------------------------------- design point


def design_point(values: dict, ideal: bool = False) -> dict:
    """The design-point view of the controls' ``values`` (by parameter name): 'message' (the
    reason a point is not evaluated, does not fit or is infeasible; '' when it is feasible),
    'rows' (``operator_rows``: the numbers ``dse analyze --format json`` prints), 'summary'
    (figure, value rows), and the 'roofline', 'breakdown' and 'memory' figures."""
    try:
        cols = point_columns(values)
        missing = [p for p in REQUIRED if p not in cols]
        if missing:
            raise DseError(f"choose the {' and the '.join(missing)}: every design point names one")
        analysis, ev = analyze_point(cols, ideal=ideal)
    except DseError as e:
        blank = empty_figure("no design point: " + str(e))
        return {"message": str(e), "rows": [], "summary": [], "roofline": blank, "breakdown": blank, "memory": blank}
    s = analysis.summary
    message = ""
    if not ev.feasible[0]:
        what = "does not fit" if int(ev.reason[0]) in MEMORY_CODES else "infeasible"
        message = f"{what}: {ev.reason_text(0)}"
    rows = operator_rows(analysis)
    blank = empty_figure(message or "no operators")
    return {"message": message, "rows": rows, "summary": summary_rows(s),
            "roofline": roofline_figure(analysis) if rows else blank,
            "breakdown": breakdown_figure(analysis) if rows else blank, "memory": memory_figure(s)}


# --------------------------------------------------------------------------- runs

_opened: dict[str, Run] = {}


def get_run(folder: str) -> Run:
    """The run in ``folder``, opened once per process (its columns read as they are asked)."""
    key = str(Path(folder).resolve())
    if key not in _opened:
        _opened[key] = open_run(folder)
    return _opened[key]


def axis_defaults(run: Run) -> dict:
    """The starting x, y, colour and facet of a run: the first objective (a throughput first) on y against the second
    (or the first parameter that varies); colour: the Pareto designs."""
    numeric = run.numeric()
    objectives = sorted((o for o in run.objectives if o in numeric), key=lambda o: o not in THROUGHPUT)
    y = objectives[0] if objectives else next((c for c in ("output_tokens_per_s", *numeric) if c in numeric), None)
    varied = [c for c in run.params if c in numeric and run.columns([c])[c].nunique() > 1]
    x = next((c for c in [*objectives[1:], *varied, *numeric] if c != y), y)
    return {"x": x, "y": y, "colour": ON_FRONT, "facet": None}


def run_points(run: Run, x: str, y: str, colour: str | None, facet: str | None, categories: dict,
               ranges: dict) -> tuple[object, str]:
    """(the scatter of the rows that pass the filters, a line saying how many are drawn)."""
    if not x or not y:
        return empty_figure("choose x and y"), "choose x and y"
    df = run.columns([x, y, *(c for c in (colour, facet) if c), *categories, *ranges, *shown_columns(run)])
    keep = filter_mask(df, categories, ranges)
    fig, drawn, drawable = scatter_figure(df[keep], x, y, colour, facet, run.key, shown_columns(run))
    passed = int(keep.sum())
    text = (f"{drawn:,} designs drawn" + (f" (a uniform sample of {drawable:,})" if drawn < drawable else "")
            + f"; {passed:,} of the {run.rows:,} rows in {run.source} pass the filters"
            + (f", {passed - drawable:,} of them without a value of {x} or {y}" if passed > drawable else ""))
    return fig, text


def design_text(run: Run, ident: int) -> list[dict]:
    """The parameters and key metrics of design ``ident`` as (column, value) rows."""
    row = run.design(ident)
    return [{"column": c, "value": quantity_text(c, _plain(row.get(c)))} for c in [run.key, *shown_columns(run)]
            if c in row]


def compare_table(run: Run, ids: list[int]) -> tuple[list[dict], list[dict]]:
    """(rows, columns) of a table with the designs ``ids`` side by side: one row per parameter or
    metric (``shown_columns``), one column per design."""
    designs = [run.design(i) for i in ids]
    cols = [{"name": "column", "id": "column"}] + [{"name": f"{run.key} {i}", "id": str(i)} for i in ids]
    rows = [{"column": c, **{str(i): quantity_text(c, _plain(d.get(c))) for i, d in zip(ids, designs)}}
            for c in shown_columns(run) if any(c in d for d in designs)]
    return rows, cols


def explain_values(run: Run, ident: int) -> dict:
    """The design-point controls' values that reproduce design ``ident`` of the run (its stored
    parameters; the others back to their start)."""
    return control_values(run.design(ident))


def _plain(v):
    """A stored value as a plain Python one (numpy scalars as numbers, NaN as None)."""
    if isinstance(v, np.generic):
        v = v.item()
    return None if isinstance(v, float) and math.isnan(v) else v


def toggled(selected: list, ident) -> list:
    """``selected`` with design ``ident`` removed when it is in it, else added (the last
    ``MAX_SELECTED`` kept)."""
    selected = list(selected or [])
    if ident in selected:
        return [i for i in selected if i != ident]
    return (selected + [ident])[-MAX_SELECTED:]


# --------------------------------------------------------------------------- Dash wiring

PARAM = "param"


def _by_name(items) -> dict:
    """{parameter name: value} of a pattern-matched Input/State list (``ctx.inputs_list`` items)."""
    return {d["id"]["name"]: d.get("value") for d in items}


def _by_col(items) -> dict:
    return {d["id"]["col"]: d.get("value") for d in items}


def _failed(e: Exception) -> str:
    """One line for an error met while serving a control (never a traceback)."""
    return str(e) if isinstance(e, DseError) else f"error: {type(e).__name__}: {e}"


def register(app) -> None:
    """Wire the page's controls (``dse.app.layout``) to the functions above."""
    @app.callback(Output("point-message", "children"), Output("op-table", "children"),
                  Output("summary-table", "children"),
                  Output("roofline", "figure"), Output("breakdown", "figure"), Output("memory", "figure"),
                  Input({"type": PARAM, "name": ALL}, "value"), Input("ideal", "value"))
    def _point(_values, ideal):
        values = _by_name(ctx.inputs_list[0])
        try:
            v = design_point(values, ideal=bool(ideal))
        except Exception as e:    # a bug shown as one line in the page, not a failed request
            blank = empty_figure(_failed(e))
            return _failed(e), [], [], blank, blank, blank
        return (v["message"], html_table(v["rows"], OPERATOR_COLUMNS), html_table(v["summary"], SUMMARY_COLUMNS),
                v["roofline"], v["breakdown"], v["memory"])

    @app.callback(Output("x", "options"), Output("y", "options"), Output("colour", "options"),
                  Output("facet", "options"), Output("x", "value"), Output("y", "value"), Output("colour", "value"),
                  Output("facet", "value"), Output("filters", "children"), Output("run-message", "children"),
                  Input("run-folder", "value"))
    def _open(folder):
        if not folder:
            return [], [], [], [], None, None, None, None, [], "no run folder: give one (dse explore runs/NAME)"
        try:
            run = get_run(folder)
            numeric, cats = run.numeric(), run.categorical()
            d = axis_defaults(run)
            filters = filter_controls(run, cats)
        except Exception as e:
            return [], [], [], [], None, None, None, None, [], _failed(e)
        return (numeric, numeric, cats, cats, d["x"], d["y"], d["colour"], d["facet"], filters,
                f"{run.path}: {run.rows:,} rows from {run.source}; objectives: "
                f"{', '.join(f'{k} ({v})' for k, v in run.objectives.items()) or 'none recorded'}")

    @app.callback(Output("run-graph", "figure"), Output("run-count", "children"),
                  Input("run-folder", "value"), Input("x", "value"), Input("y", "value"), Input("colour", "value"),
                  Input("facet", "value"), Input({"type": "cat", "col": ALL}, "value"),
                  Input({"type": "lo", "col": ALL}, "value"), Input({"type": "hi", "col": ALL}, "value"))
    def _points(folder, x, y, colour, facet, _c, _lo, _hi):
        if not folder:
            return empty_figure("no run"), ""
        cats = _by_col(ctx.inputs_list[5])
        lo, hi = _by_col(ctx.inputs_list[6]), _by_col(ctx.inputs_list[7])
        ranges = {c: (lo.get(c), hi.get(c)) for c in lo}
        try:
            return run_points(get_run(folder), x, y, colour, facet, cats, ranges)
        except Exception as e:
            return empty_figure(_failed(e)), _failed(e)

    @app.callback(Output("run-hover", "children"), Output("run-hover-title", "children"),
                  Input("run-graph", "hoverData"), State("run-folder", "value"))
    def _hover(hover, folder):
        ident = _ident(hover)
        if ident is None or not folder:
            return no_update, no_update
        try:
            run = get_run(folder)
            return html_table(design_text(run, ident), DESIGN_COLUMNS), f"hovered: {run.key} {ident}"
        except Exception as e:
            return [], _failed(e)

    @app.callback(Output("selected", "data"), Input("run-graph", "clickData"), Input("clear", "n_clicks"),
                  State("selected", "data"), prevent_initial_call=True)
    def _select(click, _clear, selected):
        if ctx.triggered_id == "clear":
            return []
        ident = _ident(click)
        return no_update if ident is None else toggled(selected, ident)

    @app.callback(Output("compare-table", "children"), Output("explain-pick", "options"),
                  Output("explain-pick", "value"), Input("selected", "data"), State("run-folder", "value"))
    def _compare(selected, folder):
        if not selected or not folder:
            return [], [], None
        try:
            rows, cols = compare_table(get_run(folder), selected)
        except Exception as e:
            return _failed(e), [], None
        return (html_table(rows, [(c["id"], c["name"]) for c in cols]),
                [{"label": f"design {i}", "value": i} for i in selected], selected[-1])

    @app.callback(Output({"type": PARAM, "name": ALL}, "value"), Output("ideal", "value"), Output("view", "value"),
                  Output("explain-message", "children"),
                  Input("explain", "n_clicks"), State("explain-pick", "value"), State("run-folder", "value"),
                  prevent_initial_call=True)
    def _explain(_n, ident, folder):
        ids = ctx.outputs_list[0]
        if ident is None or not folder:
            return [no_update] * len(ids), no_update, no_update, "select a design first (click a dot)"
        try:
            run = get_run(folder)
            values = explain_values(run, int(ident))
        except Exception as e:
            return [no_update] * len(ids), no_update, no_update, _failed(e)
        return ([values.get(d["id"]["name"]) for d in ids], ["ideal"] if run.ideal else [], "point",
                f"opened {run.key} {ident} of {run.path}")



def _ident(event) -> int | None:
    """The design id a hover or click event names (its dot's customdata), or None."""
    try:
        return int(event["points"][0]["customdata"][0])
    except (TypeError, KeyError, IndexError, ValueError):
        return None


def filter_controls(run: Run, cats: list[str]) -> list:
    """The filter controls of a run: a multiple choice per categorical column that takes more than
    one value, a [min, max] pair per parameter and objective that is a number."""
    df = run.columns(cats)
    out = []
    for c in cats:
        values = sorted(map(str, df[c].dropna().unique()))
        if len(values) > 1:
            out.append(html.Div([html.Label(c), dcc.Dropdown(id={"type": "cat", "col": c}, options=values, value=[],
                                                             multi=True, placeholder="all")], className="filter"))
    numeric = run.numeric()
    for c in dict.fromkeys([*run.params, *run.objectives]):
        if c in numeric:
            out.append(html.Div([html.Label(f"{c} from"),
                                 dcc.Input(id={"type": "lo", "col": c}, type="number", debounce=True, placeholder="min"),
                                 html.Label(" to "),
                                 dcc.Input(id={"type": "hi", "col": c}, type="number", debounce=True, placeholder="max")],
                                className="filter"))
    return out
