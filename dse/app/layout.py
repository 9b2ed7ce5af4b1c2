"""The page of ``dse explore`` and its Dash application.

The application serves its own scripts (``serve_locally``: Dash's renderer, React and plotly.js
come from the installed packages, no CDN), links no external stylesheet, font or script, reads no
assets folder, and runs with Dash's developer tools (and their version check) off and its MCP
endpoint off: the page makes no request outside the server it came from.
"""
from __future__ import annotations

from dash import Dash, Input, Output, dcc, html

from dse.app.callbacks import PARAM, register
from dse.app.data import FOLDED, SECTION_ORDER, Control, controls, run_folders
from dse.app.figures import GRAPH_CONFIG

#: the page's own styles (inline: no stylesheet is fetched)
STYLE = {"fontFamily": "sans-serif", "fontSize": "13px", "margin": "8px"}
_GRID = {"display": "grid", "gridTemplateColumns": "repeat(auto-fill, minmax(190px, 1fr))", "gap": "4px 10px"}
_SIDE = {"display": "flex", "gap": "12px", "alignItems": "flex-start"}


def _widget(c: Control):
    ident = {"type": PARAM, "name": c.name}
    if c.kind == "dropdown":
        return dcc.Dropdown(id=ident, options=list(c.options), value=c.value, placeholder=c.placeholder, clearable=True)
    if c.kind == "number":
        return dcc.Input(id=ident, type="number", value=c.value, placeholder=c.placeholder, debounce=True,
                         min=c.low, max=c.high, step=c.step, style={"width": "95%"})
    return dcc.Input(id=ident, type="text", value=c.value, placeholder=c.placeholder, debounce=True,
                     style={"width": "95%"})


def _controls_panel() -> html.Div:
    """Every parameter's control, grouped by section (``dse.app.data.SECTION_ORDER``)."""
    sections = []
    by_section: dict[str, list[Control]] = {}
    for c in controls():
        by_section.setdefault(c.section, []).append(c)
    for s in SECTION_ORDER:
        cs = by_section.get(s, [])
        grid = html.Div([html.Div([html.Label(c.name, title=c.help), _widget(c)], title=c.help) for c in cs],
                        style=_GRID)
        sections.append(html.Details([html.Summary(s), grid], open=s not in FOLDED))
    sections.append(dcc.Checklist(id="ideal", options=[{"label": " ideal roofline (efficiency 1, no overheads)",
                                                        "value": "ideal"}], value=[]))
    return html.Div(sections)


def _point_view() -> html.Div:
    return html.Div(id="point-view", children=[
        _controls_panel(),
        html.Div(id="point-message", style={"color": "#b00", "fontWeight": "bold", "margin": "6px 0"}),
        html.Div([dcc.Graph(id="roofline", config=GRAPH_CONFIG, style={"flex": "3"}),
                  dcc.Graph(id="memory", config=GRAPH_CONFIG, style={"flex": "1"})], style=_SIDE),
        html.H3("operators (per device; time of one instance, x count per step)"),
        html.Div(id="op-table", style={"overflowX": "auto"}),
        dcc.Graph(id="breakdown", config=GRAPH_CONFIG),
        html.H3("summary"),
        html.Div(id="summary-table"),
    ])


def _run_view(run_dir: str | None) -> html.Div:
    folders = list(dict.fromkeys([*([run_dir] if run_dir else []), *run_folders()]))

    def pick(ident, label, clearable=False):
        return html.Div([html.Label(label), dcc.Dropdown(id=ident, clearable=clearable)], style={"minWidth": "200px"})
    return html.Div(id="run-view", children=[
        html.Div([html.Label("run folder"), dcc.Dropdown(id="run-folder", options=folders, value=run_dir,
                                                         placeholder="runs/NAME")]),
        html.Div(id="run-message", style={"margin": "4px 0"}),
        html.Div([pick("x", "x"), pick("y", "y"), pick("colour", "colour", True), pick("facet", "facet", True)],
                 style=_SIDE),
        html.Details([html.Summary("filters"), html.Div(id="filters", style=_GRID)], open=True),
        html.Div(id="run-count", style={"margin": "4px 0"}),
        html.Div([dcc.Graph(id="run-graph", config=GRAPH_CONFIG, style={"flex": "3"}),
                  html.Div([html.B(id="run-hover-title", children="hover a dot for its parameters"),
                            html.Div(id="run-hover")],
                           style={"flex": "1"})], style=_SIDE),
        html.H3("selected designs (click a dot to add or remove it)"),
        html.Div([dcc.Dropdown(id="explain-pick", placeholder="a selected design", style={"minWidth": "200px"}),
                  html.Button("explain in the design-point view", id="explain"), html.Button("clear", id="clear"),
                  html.Span(id="explain-message")], style=_SIDE),
        html.Div(id="compare-table", style={"overflowX": "auto"}),
        dcc.Store(id="selected", data=[]),
    ])


def make_app(run_dir: str | None = None) -> Dash:
    """The Dash application of ``dse explore``, its run view opening ``run_dir`` (None: the
    folders under ./runs to pick from)."""
    app = Dash(__name__, title="dse explore", update_title=None, serve_locally=True, external_stylesheets=[],
               external_scripts=[], include_assets_files=False, assets_ignore=".*", enable_mcp=False,
               suppress_callback_exceptions=True)
    app.layout = html.Div(style=STYLE, children=[
        html.Div([html.B("dse explore "), dcc.RadioItems(id="view", options=[
            {"label": " design point ", "value": "point"}, {"label": " run ", "value": "run"}],
            value="run" if run_dir else "point", inline=True)], style=_SIDE),
        html.Div(id="point-box", children=_point_view()),
        html.Div(id="run-box", children=_run_view(run_dir)),
    ])
    register(app)
    app.clientside_callback(
        "function(v) { return [{display: v === 'point' ? 'block' : 'none'}, {display: v === 'run' ? 'block' : 'none'}]; }",
        [Output("point-box", "style"), Output("run-box", "style")], Input("view", "value"))
    return app

