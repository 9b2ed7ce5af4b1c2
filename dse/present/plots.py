"""Plots of study results and analyses (PNG, matplotlib's Agg canvas, seaborn's look).

Everything here is display, by the one unit policy of ``basis.units``: values arrive in SI
units and an axis shows sizes in binary units (GiB, MiB, KiB), rates with decimal
prefixes (GB/s, TB/s, TFLOP/s, tokens/s) and times in s, ms or us — the prefix of an axis
is chosen from the values it shows (:func:`axis_unit`); without values, the fixed scale
of ``basis.units.AXIS`` (:func:`unit_of`). Values written as text use
``dse.present.display.quantity_text`` (:func:`human`), the same text as every table.

matplotlib is imported inside the functions, when a plot is drawn, so importing this
module costs nothing on the ``analyze`` path; seaborn is not used (its import pulls scipy
and takes seconds): its "whitegrid" look is written out as matplotlib settings
(``STYLE``), applied while a figure is built and saved and restored after. Figures are
made with the object API (``matplotlib.figure.Figure``), never pyplot, so no GUI backend
or global state is touched, and every file is written atomically (a temporary file,
then a rename).

Drawing time stays flat in the number of designs and layout costs nothing at draw time:

- a Pareto front of more than ``LARGE_FRONT`` designs, and a background of more than
  ``LARGE_CLOUD`` feasible designs, are drawn as densities (a 2-D histogram as one
  rasterized mesh, cells shaded by how many designs fall in them), not one marker each;
- the figures of a study report have fixed margins computed in inches from what they
  hold (titles, tick labels, legends, colour bars: :func:`_arrange`), instead of
  matplotlib's constrained layout, which measures every artist again on each draw (the
  validation and compare plots, drawn once per command, keep it).

Each plotting function returns a JSON-ready record of what it drew (columns, units,
axis labels and tick labels read back from the axes, colours and markers per group,
and the ``point`` ids of the designs drawn); ``dse.present.report`` collects them in
``plots.json``.
"""
from __future__ import annotations

import functools
import importlib
import math
import textwrap
import threading
import zlib
from pathlib import Path

import numpy as np

from basis.files import atomic_write
from basis.units import AXIS, bytes_text, rate_text, time_text
from dse.explore.pareto import pareto_mask
from dse.present.bottleneck import op_group
from dse.present.display import TOKENS_PER_S, kind_of, ops_unit, quantity_text, si

#: metrics and parameters measuring throughput (plotted on the y axis of Pareto fronts)
THROUGHPUT = ("output_tokens_per_s", "output_tokens_per_s_per_user", "output_tokens_per_s_per_device",
              "prefill_tokens_per_s")

#: a Pareto front with more designs than this is drawn as a density, not as points
LARGE_FRONT = 2000

#: words of a metric or parameter on an axis, and the unit of those that are counts
#: (quantities with a kind in ``basis.units.AXIS`` take their unit from there)
_WORDS = {
    "memory_bandwidth": "memory bandwidth",
    "memory_capacity": "memory capacity",
    "host_memory_capacity": "host memory capacity",
    "host_memory_bandwidth": "host memory bandwidth",
    "host_link_bandwidth": "host link bandwidth",
    "link_bandwidth": "scale-up link bandwidth",
    "link_latency": "link latency",
    "onchip_buffer_bytes": "on-chip buffer",
    "vector_ops_per_s": "vector compute",
    "pim_peak": "PIM compute",
    "pim_multiple": "PIM internal bandwidth multiple",
    "compute_scale": "compute scale",
    "tdp_w": "TDP",
    "price_usd": "price",
    "cost_usd": "cost",
    "power_w": "average power",
    "system_tdp_w": "TDP of the system",
    "power_demand_w": "power demand per device",
    "static_power_w": "static power",
    "energy_per_token_j": "energy per token",
    "tokens_per_joule": "tokens per joule",
    "cost_per_million_tokens_usd": "$ per million tokens",
    "build_cost_usd": "build cost",
    "die_area_mm2": "die area",
    "cores": "cores",
    "clock_hz": "clock",
    "l2_bytes": "L2",
    "memory_stacks": "memory stacks",
    "power_limit_w": "power limit",
    "ttft_s": "TTFT",
    "tpot_s": "TPOT",
    "e2e_latency_s": "end-to-end latency",
    "output_tokens_per_s": "output throughput",
    "output_tokens_per_s_per_user": "output tokens/s per user",
    "output_tokens_per_s_per_device": "output tokens/s per device",
    "prefill_tokens_per_s": "prefill throughput",
    "weights_bytes": "weights",
    "kv_cache_bytes": "KV cache",
    "activation_bytes": "activations",
    "memory_bytes": "memory footprint",
    "peak_memory_bytes": "memory per device",
    "offloaded_bytes": "offloaded bytes",
    "capacity_bytes": "memory capacity",
    "devices": "devices",
    "batch": "batch",
    "prompt_len": "prompt length",
    "gen_len": "generation length",
    "tp": "tensor parallelism",
    "pp": "pipeline stages",
    "ep": "expert-parallel groups",
}
_COUNTS = {"devices": "devices", "batch": "sequences", "prompt_len": "tokens", "gen_len": "tokens",
           "tp": "devices", "pp": "stages", "ep": "groups", "pim_multiple": "x", "compute_scale": "x"}

#: prefixes an axis may use, per quantity kind (the first is the largest)
_AXIS_SCALES = {"bytes": (2.0**40, 2.0**30, 2.0**20, 2.0**10, 1.0), "bytes_per_s": (1e12, 1e9, 1e6),
                "ops_per_s": (1e12,), "seconds": (1.0, 1e-3, 1e-6)}   # compute: always TFLOP/s (AXIS)


def words_of(name: str) -> str:
    """The words naming a metric or parameter on an axis: 'memory bandwidth', 'peak FP8 compute'."""
    if name in _WORDS:
        return _WORDS[name]
    if name.startswith("peak_"):
        return f"peak {name[5:].upper()} compute"
    return name.replace("_", " ")


def _unit_text(kind: str, scale: float, name: str) -> str:
    """The unit of one prefix of a quantity kind, written by ``basis.units``: 'GiB', 'TB/s'."""
    if kind == "bytes":
        return bytes_text(scale).split(" ", 1)[1]
    if kind == "seconds":
        return time_text(scale).split(" ", 1)[1]
    if kind == "bytes_per_s":
        return rate_text(scale, "B/s").split(" ", 1)[1]
    return rate_text(scale, ops_unit(name.removeprefix("peak_"))).split(" ", 1)[1]


def unit_of(name: str) -> tuple[float, str, str]:
    """(scale, unit, words) of a metric or parameter at the fixed scale of
    ``basis.units.AXIS`` (what a table column uses): value / scale in unit.
    'memory_capacity' -> (2**30, 'GiB', 'memory capacity')."""
    kind = kind_of(name)
    if kind == TOKENS_PER_S:
        return 1.0, "tokens/s", words_of(name)
    if kind in ("bytes", "bytes_per_s", "ops_per_s", "seconds"):
        scale = AXIS[kind][0]
        return scale, _unit_text(kind, scale, name), words_of(name)
    if kind in AXIS:
        return AXIS[kind][0], AXIS[kind][1], words_of(name)
    return 1.0, _COUNTS.get(name, ""), words_of(name)


def axis_unit(name: str, values) -> tuple[float, str, str]:
    """(scale, unit, words) for an axis showing ``values`` (SI) of ``name``: sizes, rates
    and times take the largest prefix of their kind that the largest value reaches
    (16 TB/s, 80 GiB, 2.5 ms), so the tick labels stay short; other quantities as
    :func:`unit_of`."""
    kind = kind_of(name)
    v = np.abs(np.asarray(values, dtype=float))
    v = v[np.isfinite(v) & (v > 0)]
    if kind not in _AXIS_SCALES or not len(v):
        return unit_of(name)
    top = float(v.max())
    scale = next((s for s in _AXIS_SCALES[kind] if top / s >= 1.0), _AXIS_SCALES[kind][-1])
    return scale, _unit_text(kind, scale, name), words_of(name)


def label_of(name: str, unit: str | None = None) -> str:
    """Axis label with the unit: 'memory bandwidth (GB/s)' (``unit`` overrides
    :func:`unit_of`'s, for an axis whose prefix follows its values)."""
    _, u, words = unit_of(name)
    u = u if unit is None else unit
    return f"{words} ({u})" if u and u != words else words


def human(name: str, value, unit: bool = True) -> str:
    """A value of a metric or parameter as text: with ``unit``, by the unit policy
    (``display.quantity_text``: '3.35 TB/s', '80 GiB', '12.3 ms'); without, the number in
    the unit of :func:`label_of` ('3,350' for 3.35e12 bytes/s in GB/s)."""
    if isinstance(value, (bool, np.bool_, str)) or value is None:
        return "-" if value is None else str(value)
    try:
        v = float(value)
    except (TypeError, ValueError):
        return str(value)
    if math.isnan(v):
        return "-"
    if unit:
        return quantity_text(name, int(v) if v.is_integer() and kind_of(name) is None else v)
    x = v / unit_of(name)[0]
    if x == int(x) and abs(x) < 1e15:
        return f"{int(x):,}"
    return f"{x:,.0f}" if 1e4 <= abs(x) < 1e12 else f"{x:.4g}"


# --------------------------------------------------------------------------- colours

#: one fixed colour per operator, in families by what the operator does (blues: attention
#: projections, purples: attention itself, greens: the MLP, oranges: experts, reds:
#: communication, greys: norms, golds: residual adds, browns: embedding and LM head), the
#: same in every panel and every plot
OP_COLOURS = {
    "q_proj": "#08519c", "k_proj": "#3182bd", "v_proj": "#6baed6", "o_proj": "#9ecae1",
    "q_a_proj": "#2171b5", "q_b_proj": "#4292c6", "kv_a_proj": "#084594", "kv_b_proj": "#c6dbef",
    "qk_matmul": "#54278f", "softmax": "#9e9ac8", "sv_matmul": "#756bb1", "flash_attention": "#6a51a3",
    "gate_proj": "#006d2c", "up_proj": "#31a354", "down_proj": "#74c476", "act_fn": "#a1d99b",
    "shared_gate_proj": "#00441b", "shared_up_proj": "#238b45", "shared_down_proj": "#41ab5d",
    "shared_act_fn": "#c7e9c0",
    "expert_gate_proj": "#a63603", "expert_up_proj": "#e6550d", "expert_down_proj": "#fd8d3c",
    "expert_act_fn": "#fdae6b", "router": "#fdd0a2",
    "attn_all_reduce": "#a50f15", "mlp_all_reduce": "#de2d26", "moe_dispatch": "#fb6a4a",
    "moe_combine": "#fc9272", "pp_hop": "#67000d",
    "attn_norm": "#525252", "mlp_norm": "#737373", "final_norm": "#969696", "q_a_norm": "#bdbdbd",
    "kv_a_norm": "#d9d9d9",
    "attn_add": "#b8860b", "mlp_add": "#e6c35c",
    "embedding": "#8c510a", "lm_head": "#bf812d",
    "other": "#e0e0e0",
}
#: colours of operators not in ``OP_COLOURS``, one per operator group
_GROUP_COLOURS = {"attention": "#807dba", "communication": "#ef3b2c", "expert *_proj": "#f16913",
                  "*_proj": "#2b8cbe", "*_norm": "#aaaaaa"}
_SPARE = ("#17becf", "#bcbd22", "#e377c2", "#7f7f7f", "#8c564b", "#9467bd", "#d62728", "#2ca02c")


def op_colour(name: str) -> str:
    """The fixed colour of an operator (hex): from ``OP_COLOURS`` (a sliding-window layer's
    ``sliding_*`` operator as its full-attention one), else its group's, else one chosen
    by the name's checksum, so an operator never changes colour between plots."""
    base = name.removeprefix("sliding_")
    if base in OP_COLOURS:
        return OP_COLOURS[base]
    group = op_group(name)
    if group in _GROUP_COLOURS:
        return _GROUP_COLOURS[group]
    return _SPARE[zlib.crc32(base.encode()) % len(_SPARE)]


_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")


def _palette(n: int) -> list[str]:
    """``n`` distinct colours (hex): tab10, or tab20 beyond ten."""
    from matplotlib import colormaps
    from matplotlib.colors import to_hex
    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [to_hex(cmap(i % cmap.N)) for i in range(max(n, 1))]


def _hex(c) -> str:
    from matplotlib.colors import to_hex
    return to_hex(c, keep_alpha=False)


def _plain(v):
    """A numpy scalar as a Python one (JSON-ready)."""
    return v.item() if hasattr(v, "item") else v


# --------------------------------------------------------------------------- plumbing

#: the look of every plot: seaborn's "whitegrid" style in its "notebook" context, written out
#: as matplotlib settings (importing seaborn pulls in scipy and costs seconds)
STYLE = {
    "axes.axisbelow": True, "axes.edgecolor": ".8", "axes.grid": True, "axes.labelcolor": ".15",
    "axes.labelsize": 12.0, "axes.linewidth": 1.25, "axes.titlesize": 12.0,
    "axes.prop_cycle": "cycler('color', ['#4c72b0', '#dd8452', '#55a868', '#c44e52', '#8172b3', '#937860', "
                       "'#da8bc3', '#8c8c8c', '#ccb974', '#64b5cd'])",
    "font.size": 12.0, "grid.color": ".8", "grid.linewidth": 1.0, "legend.fontsize": 11.0,
    "legend.title_fontsize": 12.0, "lines.solid_capstyle": "round", "patch.edgecolor": "w",
    "patch.force_edgecolor": True, "text.color": ".15",
    "xtick.bottom": False, "xtick.color": ".15", "xtick.labelsize": 11.0, "xtick.major.size": 6.0,
    "xtick.major.width": 1.25, "xtick.minor.size": 4.0, "xtick.minor.width": 1.0,
    "ytick.left": False, "ytick.color": ".15", "ytick.labelsize": 11.0, "ytick.major.size": 6.0,
    "ytick.major.width": 1.25, "ytick.minor.size": 4.0, "ytick.minor.width": 1.0,
    "figure.constrained_layout.use": False, "figure.autolayout": False,
}
#: inches between the parts of a figure laid out with fixed margins, and at its edges
PAD = 0.1
#: resolution of the PNG files
DPI = 110
#: zlib level of the PNG files: 3 writes them a third faster than the default 6, within 3 % of its size
PNG_COMPRESSION = 3


#: the matplotlib modules the plots draw with (imported when the first plot is drawn, or by ``preload``)
MATPLOTLIB_MODULES = ("matplotlib.figure", "matplotlib.backends.backend_agg", "matplotlib.lines",
                      "matplotlib.ticker", "matplotlib.colors", "matplotlib.patches", "matplotlib.font_manager")


def preload() -> threading.Thread:
    """Import the matplotlib modules plots are drawn with on a background thread (started;
    returned): half a second of imports a run that will draw its report can overlap with
    the work before it (a sweep's numpy work leaves the interpreter free most of the time).
    Drawing without waiting for it is safe: Python's import lock makes a plot that needs a
    module still being imported wait for it."""
    def load():
        for name in MATPLOTLIB_MODULES:
            importlib.import_module(name)
    thread = threading.Thread(target=load, name="dse-preload-matplotlib", daemon=True)
    thread.start()
    return thread


def _styled(draw):
    """``draw`` (a plotting function) run under ``STYLE`` (``matplotlib.rc_context``): the
    settings hold while its figure is built and saved, and are restored after, so nothing
    global changes."""
    @functools.wraps(draw)
    def styled(*args, **kwargs):
        import matplotlib
        with matplotlib.rc_context(STYLE):
            return draw(*args, **kwargs)
    return styled


def _figure(ncols: int = 1, width: float = 7.0, height: float = 5.0, nrows: int = 1, share: bool = False,
            layout: str | None = None):
    """(a Figure on the Agg canvas, its ``nrows`` x ``ncols`` axes as a flat list); no pyplot.
    ``layout``: None for fixed margins (:func:`_arrange` places the axes; nothing is laid out
    again while drawing), or "constrained" for matplotlib's layout engine."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(width * ncols, height * nrows), layout=layout)
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False, sharex=share, sharey=share)
    return fig, list(axes.ravel())


def _save(fig, path: Path) -> None:
    """Write ``fig`` to ``path`` (a PNG unless its suffix names another format), atomically."""
    path = Path(path)
    fmt = path.suffix.lstrip(".") or "png"
    extra = {"pil_kwargs": {"compress_level": PNG_COMPRESSION}} if fmt == "png" else {}
    atomic_write(path, lambda tmp: fig.savefig(tmp, format=fmt, dpi=DPI, **extra))


def _text_width(fig, text: str, size) -> float:
    """Width in inches of the widest line of ``text`` at font ``size`` (points, or a name
    such as 'small'), as the Agg canvas sets it."""
    from matplotlib.font_manager import FontProperties
    font = FontProperties(size=size)
    renderer = fig.canvas.get_renderer()
    lines = str(text).split("\n") if text else []
    return max((renderer.get_text_width_height_descent(t, font, ismath=False)[0] for t in lines),
               default=0.0) / fig.dpi


def _text_height(text: str, size) -> float:
    """Height in inches of ``text`` (its lines stacked) at font ``size`` (points, or a name
    such as 'small'): 1.2 line heights a line."""
    from matplotlib.font_manager import FontProperties
    lines = str(text).count("\n") + 1 if text else 0
    return lines * FontProperties(size=size).get_size_in_points() * 1.2 / 72


def _box_size(fig, artist) -> tuple[float, float]:
    """(width, height) in inches of a legend (or any artist) as drawn."""
    box = artist.get_window_extent(fig.canvas.get_renderer())
    return box.width / fig.dpi, box.height / fig.dpi


def _y_room(fig, ax) -> float:
    """Inches left of ``ax`` that its y tick labels and y label take, with their pads."""
    from matplotlib import rcParams
    size = rcParams["ytick.labelsize"]
    ticks = max((_text_width(fig, t, size) for t in _tick_labels(ax.yaxis)), default=0.0)
    return ticks + _text_height(ax.get_ylabel(), ax.yaxis.label.get_fontsize()) + 16 / 72


def _x_room(fig, ax) -> float:
    """Inches below ``ax`` that its x tick labels (of one line or more) and x label take,
    with their pads."""
    from matplotlib import rcParams
    ticks = max((_text_height(t, rcParams["xtick.labelsize"]) for t in _tick_labels(ax.xaxis)), default=0.0)
    return ticks + _text_height(ax.get_xlabel(), ax.xaxis.label.get_fontsize()) + 16 / 72


def _x_overhang(fig, ax) -> float:
    """Inches the x tick labels of ``ax`` may reach past its sides: half the widest label."""
    from matplotlib import rcParams
    size = rcParams["xtick.labelsize"]
    return max((_text_width(fig, t, size) for t in _tick_labels(ax.xaxis)), default=0.0) / 2


def _arrange(fig, ncols: int, nrows: int, left: float, right: float, top: float, bottom: float,
             wgap: float = 0.0, hgap: float = 0.0, least: float = 1.6) -> None:
    """Place the grid of axes of ``fig`` with fixed margins and gaps between axes, in inches;
    the figure grows where the axes would be narrower or lower than ``least`` inches, or
    than their longest axis label (which would stick out of the figure)."""
    shown = [ax for ax in fig.axes if ax.get_visible()]
    least_w = max([least] + [_text_width(fig, ax.get_xlabel(), ax.xaxis.label.get_fontsize()) for ax in shown])
    least_h = max([least] + [_text_width(fig, ax.get_ylabel(), ax.yaxis.label.get_fontsize()) for ax in shown])
    w, h = fig.get_size_inches()
    w = max(w, left + right + (ncols - 1) * wgap + ncols * least_w)
    h = max(h, top + bottom + (nrows - 1) * hgap + nrows * least_h)
    fig.set_size_inches(w, h)
    aw = (w - left - right - (ncols - 1) * wgap) / ncols
    ah = (h - top - bottom - (nrows - 1) * hgap) / nrows
    fig.subplots_adjust(left=left / w, right=1 - right / w, bottom=bottom / h, top=1 - top / h,
                        wspace=wgap / aw, hspace=hgap / ah)


def _settle_ticks(axes) -> None:
    """Fix the ticks of placed axes (limits and size final) to those their locators put
    inside the view: matplotlib makes a costly tick object for every location a locator
    returns, shown or not."""
    from matplotlib.ticker import FixedLocator
    for ax in axes:
        for axis in (ax.xaxis, ax.yaxis):
            if isinstance(axis.get_major_locator(), FixedLocator):
                continue
            lo, hi = sorted(axis.get_view_interval())
            tol = 1e-9 * (hi - lo)
            axis.set_major_locator(FixedLocator([t for t in axis.get_majorticklocs() if lo - tol <= t <= hi + tol]))


def _row_layout(fig, axes, legend=None, suptitle=None, titled: bool = False, centre: bool = False) -> None:
    """Fixed margins of a row of axes, each with its own y label, in inches from what the
    figure holds: ``suptitle`` (or None) on top, axes titles under it when ``titled``, and
    ``legend`` (a figure legend, or None) on the right, its top level with the axes' top
    (its middle with theirs when ``centre``)."""
    top = PAD + (_text_height(suptitle.get_text(), suptitle.get_fontsize()) + PAD if suptitle else 0.0)
    top += _text_height("x", "medium") + 6 / 72 if titled else 0.0
    legend_w = _box_size(fig, legend)[0] if legend else 0.0
    wgap = max((_y_room(fig, ax) for ax in axes[1:]), default=0.0) + 0.25
    right = PAD + max(0.2, _x_overhang(fig, axes[-1])) + legend_w
    _arrange(fig, len(axes), 1, left=PAD + _y_room(fig, axes[0]), right=right,
             top=max(top, 0.2), bottom=PAD + max(_x_room(fig, ax) for ax in axes), wgap=wgap)
    _settle_ticks(axes)
    w, h = fig.get_size_inches()
    if suptitle:
        suptitle.set_y(1 - PAD / h)
    if legend:
        box = axes[-1].get_position()
        legend.set_bbox_to_anchor((1 - (PAD + legend_w) / w, (box.y0 + box.y1) / 2 if centre else box.y1),
                                  transform=fig.transFigure)


def _tick_text(t: float, _pos=None) -> str:
    """A tick label: '500', '2,000', '20k', '1M', '0.05'."""
    if t == 0:
        return "0"
    if abs(t) >= 1e5:
        return rate_text(t, digits=3)
    if abs(t) >= 1:
        return f"{t:,.0f}" if float(t).is_integer() else f"{t:,.3g}"
    return f"{t:.3g}"


def wide(values, ratio: float = 30.0) -> bool:
    """Whether positive ``values`` span more than ``ratio`` (then an axis is logarithmic)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v) & (v > 0)]
    return bool(len(v) and v.max() / v.min() > ratio)


_wide = wide


def _log_axis(ax, axis: str, values) -> None:
    """A logarithmic axis with enough labels to read values off: ticks at 1, 2 and 5 of each
    decade when the values span at most 2.5 decades (1 to 9 under one decade), else at each
    decade; labels as plain numbers. No minor ticks: the style draws no tick marks and no
    minor grid, so they would show nothing and cost a tick object each."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, NullLocator
    which = ax.xaxis if axis == "x" else ax.yaxis
    (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v) & (v > 0)]
    decades = math.log10(v.max() / v.min()) if len(v) else 3.0
    subs = (1.0,) if decades > 2.5 else (1.0, 2.0, 5.0) if decades > 1.0 else tuple(float(s) for s in range(1, 10))
    which.set_major_locator(LogLocator(base=10, subs=subs, numticks=15))
    which.set_minor_locator(NullLocator())
    which.set_major_formatter(FuncFormatter(_tick_text))
    which.set_minor_formatter(NullFormatter())


def _log_if_wide(ax, axis: str, values) -> bool:
    """:func:`_log_axis` when the values span more than 30x; whether it did."""
    if _wide(values):
        _log_axis(ax, axis, values)
        return True
    return False


def _tick_labels(axis) -> list[str]:
    """The labelled ticks (major and minor) an axis shows inside its limits, as drawn."""
    lo, hi = sorted(axis.get_view_interval())
    out = []
    for locs, fmt in ((axis.get_majorticklocs(), axis.get_major_formatter()),
                      (axis.get_minorticklocs(), axis.get_minor_formatter())):
        locs = [t for t in locs if lo <= t <= hi]
        fmt.set_locs(locs)
        out += [s for s in (fmt(t, i) for i, t in enumerate(locs)) if s]
    return out


def _ids(df) -> list[int]:
    """The ``point`` ids of the rows of ``df`` (its index where it has no such column)."""
    return np.asarray(df.get("point", df.index), dtype=np.int64).tolist()


# --------------------------------------------------------------------------- density

#: a cloud of feasible designs (the background of a Pareto plot) with more points than this
#: is drawn as a density (cells shaded by how many designs they hold), not one marker each
LARGE_CLOUD = 5000
#: cells of a density across the x and the y axis
DENSITY_CELLS = (100, 64)


def _edges(values, log: bool, n: int) -> np.ndarray:
    """Cell edges along an axis showing ``values`` (finite ones; positive ones on a log
    axis). At most ``n`` distinct values (a grid study's levels): one cell per value,
    edges halfway between neighbours (geometrically on a log axis) but no wider than two
    regular cells, so a lone level is not smeared over the range (empty cells between).
    More: ``n`` cells of equal width (equal ratio on a log axis) over their range."""
    v = np.asarray(values, dtype=float)
    v = np.unique(v[np.isfinite(v) & (v > 0)] if log else v[np.isfinite(v)])
    t = np.log(v) if log else v
    if len(t) < 2:                         # one value (or none): one cell around it
        c = t[0] if len(t) else 0.0
        half = 0.2 if log else max(0.5 * abs(c), 0.5)
        edges = np.array([c - half, c + half])
    elif len(t) <= n:
        cap = 2 * (t[-1] - t[0]) / n
        gap = np.diff(t) / 2
        inner = [[(a + b) / 2] if g <= cap else [a + cap, b - cap] for a, b, g in zip(t[:-1], t[1:], gap)]
        edges = np.array([t[0] - min(cap, gap[0])] + [e for pair in inner for e in pair] + [t[-1] + min(cap, gap[-1])])
    else:
        edges = np.linspace(t[0], t[-1], n + 1)
    edges = np.exp(edges) if log else edges
    if len(v):                             # the extreme values inside, whatever exp(log(v)) rounds to
        edges[0], edges[-1] = min(edges[0], v[0]), max(edges[-1], v[-1])
    return edges


def _density(x, y, xe: np.ndarray, ye: np.ndarray) -> np.ndarray:
    """Counts of the points (x, y) per cell of the edges ``xe`` x ``ye`` (shape: x cells, y
    cells); points outside them (or not finite) are not counted."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    ok = np.isfinite(x) & np.isfinite(y)
    return np.histogram2d(x[ok], y[ok], bins=(xe, ye))[0]


def _count_norm(counts: np.ndarray):
    """The colour scale of cell counts: logarithmic when they span more than 10x, else linear from 1."""
    from matplotlib.colors import LogNorm, Normalize
    top = max(float(counts.max()) if counts.size else 1.0, 2.0)
    return LogNorm(1.0, top) if top > 10 else Normalize(1.0, top)


def _fade(colour):
    """A colour map of one colour, from faint (one design in a cell) to strong (many)."""
    from matplotlib.colors import ListedColormap, to_rgba
    rgba = np.tile(to_rgba(colour), (256, 1))
    rgba[:, 3] = np.linspace(0.3, 0.9, 256)
    return ListedColormap(rgba)


def _reds():
    """matplotlib's 'Reds' without its near-white end, so a cell of one design still shows."""
    from matplotlib import colormaps
    from matplotlib.colors import ListedColormap
    return ListedColormap(colormaps["Reds"](np.linspace(0.3, 1.0, 256)))


def _shade(ax, counts: np.ndarray, xe, ye, cmap, zorder: float):
    """The cells of ``counts`` that hold designs, coloured by count on ``cmap``: one
    rasterized mesh whose drawing time does not depend on how many designs it counts; the
    mesh (a colour bar can be made of it)."""
    mesh = ax.pcolormesh(xe, ye, np.ma.masked_equal(counts.T, 0), cmap=cmap, norm=_count_norm(counts),
                         shading="flat", edgecolors="none", linewidth=0, rasterized=True, zorder=zorder)
    mesh.sticky_edges.x[:] = []            # the axes keep their margins: markers on the edge stay whole
    mesh.sticky_edges.y[:] = []
    return mesh


# --------------------------------------------------------------------------- Pareto

@_styled
def pareto_plot(path: Path, background, front, x: str, y: str, senses: dict, title: str = "",
                hue: str | None = None, style: str | None = None, facet: str | None = None,
                note: str = "") -> dict:
    """Feasible designs (``background``, a sample) and the Pareto designs (``front``, larger,
    edged in black) of a study, ``y`` against ``x``; the 2-objective front of (x, y) among
    the Pareto designs as a step line. Returns the record of what was drawn.

    ``hue``, ``style`` and ``facet`` name categorical parameters the study varies (a
    format, the hardware): colour, marker and one panel per value, so a reader sees which
    choice each design made. A front of more than ``LARGE_FRONT`` designs is drawn as a
    density (cells counting Pareto designs) with the (x, y) front's own designs on top,
    coloured by the next objective; the title says so. A background of more than
    ``LARGE_CLOUD`` designs is drawn as a density too (cells in its colour, stronger where
    more designs fall), so the time to draw does not grow with the number of designs.
    ``note`` is a line added under the title (what was left out). The record's
    ``highlighted_x`` / ``highlighted_y`` are the coordinates, in axis units, of the Pareto
    designs drawn as markers: all of them, or in density mode the (x, y) front's on top
    (``density_cells`` and ``density_designs`` tell what the density counts)."""
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter
    large = len(front) > LARGE_FRONT
    if large:
        hue = style = facet = None
    dense = len(background) > LARGE_CLOUD
    cats = {k: v for k, v in (("hue", hue), ("style", style), ("facet", facet)) if v}
    both = [d for d in (background, front) if len(d)]

    def levels(col):
        if not col:
            return [None]
        import pandas as pd
        drawn = [d[np.isfinite(d[[x, y]].to_numpy(float)).all(axis=1)] for d in both]   # values shown
        vals = pd.unique(pd.concat([d[col] for d in drawn])) if drawn else []
        return [_plain(v) for v in vals]

    hues, styles, facets = levels(hue), levels(style), levels(facet)
    colours = dict(zip(hues, _palette(len(hues)))) if hue else {None: "#c44e52"}
    markers = {s: _MARKERS[i % len(_MARKERS)] for i, s in enumerate(styles)}
    if not facets:                      # no design has both values: one empty panel
        facets = [None]
    ncols = 2 if len(facets) == 4 else min(len(facets), 3)
    nrows = math.ceil(len(facets) / ncols)
    fig, axes = _figure(ncols=ncols, nrows=nrows, width=5.2 if ncols > 1 else 7.0,
                        height=4.8 if ncols > 1 else 5.0, share=True)
    for ax in axes[len(facets):]:
        ax.set_visible(False)
    allx = np.concatenate([d[x].to_numpy(float) for d in both]) if both else np.array([])
    ally = np.concatenate([d[y].to_numpy(float) for d in both]) if both else np.array([])
    sx, ux, _ = axis_unit(x, allx)
    sy, uy, _ = axis_unit(y, ally)
    logx, logy = _wide(allx / sx), _wide(ally / sy)
    xe, ye = _edges(allx / sx, logx, DENSITY_CELLS[0]), _edges(ally / sy, logy, DENSITY_CELLS[1])
    fr = front[[x, y]].to_numpy(dtype=float) if len(front) else np.empty((0, 2))
    shown = np.isfinite(fr).all(axis=1)
    record = {"kind": "pareto", "x": x, "y": y, "x_unit": ux, "y_unit": uy, "x_scale": sx, "y_scale": sy,
              "hue": hue, "style": style, "facet": facet, "mode": "density" if large else "points",
              "background_mode": "density" if dense else "points", "density_grid": [len(xe) - 1, len(ye) - 1],
              "background_points": len(background), "highlighted": _ids(front),
              "highlighted_not_drawn": [i for i, ok in zip(_ids(front), shown) if not ok],   # a value is unknown
              "groups": [], "panels": []}

    def sel(d, f, h=None, s=None, every=False):
        """Rows of ``d`` in panel ``f`` (and, unless ``every``, of hue ``h`` and style ``s``)."""
        m = np.ones(len(d), dtype=bool)
        for col, v in ((facet, f),) + (() if every else ((hue, h), (style, s))):
            if col:
                m &= (d[col] == v).to_numpy(bool)
        return d[m]

    hx, hy = [], []
    n_front_2d = 0
    counts_bar = colour_bar = None
    for ax, f in zip(axes, facets):
        for h in hues:
            for s in styles:
                b, p = sel(background, f, h, s), sel(front, f, h, s)
                if not len(b) and not len(p):
                    continue
                col, mk = colours[h] if hue else "0.6", markers[s]
                bx, by = b[x].to_numpy(float) / sx, b[y].to_numpy(float) / sy
                if dense:
                    _shade(ax, _density(bx, by, xe, ye), xe, ye, _fade(col), zorder=1)
                else:
                    ax.scatter(bx, by, s=14, color=col, marker=mk, alpha=0.55, linewidths=0, rasterized=True)
                grp = {"facet": f, "hue": h, "style": s, "colour": _hex(col), "marker": mk,
                       "background_points": len(b), "points": []}
                if len(p) and not large:
                    ok = np.isfinite(p[[x, y]].to_numpy(float)).all(axis=1)
                    cp = ax.scatter(p[x].to_numpy(float) / sx, p[y].to_numpy(float) / sy, s=42,
                                    color=colours[h], marker=mk, edgecolors="k", linewidths=0.7, zorder=3)
                    off = np.asarray(cp.get_offsets(), dtype=float)
                    hx += off[ok, 0].tolist()
                    hy += off[ok, 1].tolist()
                    grp["points"] = _ids(p)
                    grp["colour"] = _hex(cp.get_facecolor()[0])
                record["groups"].append(grp)
        fp = sel(front, f, every=True)
        if large and len(fp):
            ok = np.isfinite(fp[[x, y]].to_numpy(float)).all(axis=1)
            px, py = fp[x].to_numpy(float)[ok] / sx, fp[y].to_numpy(float)[ok] / sy
            counts = _density(px, py, xe, ye)
            counts_bar = _shade(ax, counts, xe, ye, _reds(), zorder=2)
            record["density_cells"] = int(np.count_nonzero(counts))
            record["density_designs"] = int(counts.sum())
        if len(fp) and x in senses and y in senses:
            v = fp[[x, y]].to_numpy(float)
            ok = np.isfinite(v).all(axis=1)
            m = np.zeros(len(fp), dtype=bool)
            if ok.any():
                m[ok] = pareto_mask(v[ok], [senses[x], senses[y]])
            sub = fp[m].sort_values(x)
            n_front_2d = len(sub)
            if large:                         # the designs drawn as markers: this front's, on the density
                hx += (sub[x].to_numpy(float) / sx).tolist()
                hy += (sub[y].to_numpy(float) / sy).tolist()
            ax.step(sub[x].to_numpy(float) / sx, sub[y].to_numpy(float) / sy,
                    where="post" if senses[x] == "min" else "pre", color="k", lw=1.0, zorder=4)
            third = next((o for o in senses if o not in (x, y) and o in sub), None)
            if large and third is not None and len(sub):
                v3 = sub[third].to_numpy(float)
                s3, u3, w3 = axis_unit(third, v3)
                record.update(colour_by=third, colour_unit=u3, colour_values=(v3 / s3).tolist())
                if np.nanmax(v3) > np.nanmin(v3) * (1 + 1e-9):
                    colour_bar = ax.scatter(sub[x].to_numpy(float) / sx, sub[y].to_numpy(float) / sy, c=v3 / s3,
                                            cmap="viridis", s=22, edgecolors="k", linewidths=0.4, zorder=5)
                    colour_bar.set_label(label_of(third, u3))
                else:                  # one value: a colour scale would say nothing; the title gives it
                    ax.scatter(sub[x].to_numpy(float) / sx, sub[y].to_numpy(float) / sy, color="#4c72b0", s=22,
                               edgecolors="k", linewidths=0.4, zorder=5)
                    record["colour_constant"] = human(third, float(v3[0]))
            record["panels"].append({"facet": f, "front_2d": _ids(sub)})
        if facet:
            ax.set_title(f"{facet} = {f}", fontsize="medium")
    record["front_2d"] = [i for pnl in record["panels"] for i in pnl["front_2d"]]
    ax0 = axes[0]
    xl = label_of(x, ux) + (f" — {senses[x]}imize" if x in senses else "")
    yl = label_of(y, uy) + (f" — {senses[y]}imize" if y in senses else "")
    for i, ax in enumerate(axes[:len(facets)]):
        if i // ncols == nrows - 1 or i + ncols >= len(facets):
            ax.set_xlabel(xl)
        if i % ncols == 0:
            ax.set_ylabel(yl)
    for log, axis, vals, which in ((logx, "x", allx / sx, ax0.xaxis), (logy, "y", ally / sy, ax0.yaxis)):
        if log:
            _log_axis(ax0, axis, vals)
        else:
            which.set_major_formatter(FuncFormatter(_tick_text))
    # legends beside the panels, never over the data
    what = f"{len(fr):,} designs" if shown.all() else f"{int(shown.sum()):,} of {len(fr):,} designs have both values"
    key = [Line2D([], [], ls="", marker="s" if dense else "o", color="0.6", alpha=0.5, ms=5 if dense else 4,
                  label=f"feasible designs ({len(background):,} shown)" + (": density" if dense else ""))
           ] if len(background) else []           # none given (no rows kept): the note says so
    if large:
        key.append(Line2D([], [], ls="", marker="s", color="#de2d26", ms=8,
                          label=f"Pareto front ({what}): density"))
    else:
        key.append(Line2D([], [], ls="", marker="o", color="w", markeredgecolor="k", ms=7,
                          label=f"Pareto front ({what}): large, edged"))
    if x in senses and y in senses and len(front):
        key.append(Line2D([], [], color="k", lw=1.0, label=f"front of these two objectives ({n_front_2d})"
                          if not facet else "front of these two objectives, per panel"))
    if hue:
        key += [Line2D([], [], ls="", label=f"colour: {hue}")]
        key += [Line2D([], [], ls="", marker="o", color=colours[h], ms=7, label=f"  {h}") for h in hues]
    if style:
        key += [Line2D([], [], ls="", label=f"marker: {style}")]
        key += [Line2D([], [], ls="", marker=markers[s], color="0.35", ms=7, label=f"  {s}") for s in styles]
    legend = fig.legend(handles=key, loc="lower center", fontsize="small", ncols=min(4, max(1, len(key) // 4)))
    record["legend"] = [h.get_label() for h in key]
    head = title or f"{words_of(y)} vs {words_of(x)}"
    sub_title = []
    if large:
        c3 = ("" if "colour_by" not in record else
              f", all at {words_of(record['colour_by'])} {record['colour_constant']}" if "colour_constant" in record
              else f", coloured by {words_of(record['colour_by'])}")
        sub_title.append(f"{len(fr):,} Pareto designs drawn as density; the {n_front_2d:,} designs on the front "
                         f"of these two objectives on top{c3}")
    elif cats:
        sub_title.append(", ".join(f"{what}: {cats[k]}" for k, what in
                                   (("hue", "colour"), ("style", "marker"), ("facet", "panels")) if k in cats))
    if note:
        sub_title.append(note)
    chars = int(fig.get_figwidth() * 10)          # characters of a line of the title, at its font size
    suptitle = fig.suptitle("\n".join("\n".join(textwrap.wrap(t, chars)) for t in [head] + sub_title if t),
                            fontsize="medium", va="top")
    _pareto_layout(fig, axes, ncols, nrows, facets, suptitle, legend, counts_bar, colour_bar)
    _save(fig, path)
    record.update(x_label=xl, y_label=yl, x_log=ax0.get_xscale() == "log", y_log=ax0.get_yscale() == "log",
                  x_ticks=_tick_labels(ax0.xaxis), y_ticks=_tick_labels(ax0.yaxis),
                  highlighted_x=hx, highlighted_y=hy, title=fig.get_suptitle(), note=note)
    return record


#: inches of a colour bar across
_BAR = 0.14


def _pareto_layout(fig, axes, ncols: int, nrows: int, facets: list, suptitle, legend, counts_bar, colour_bar) -> None:
    """Fixed margins of a Pareto plot, in inches from what it holds: the title on top, the
    panels, a colour bar of cell counts on the right (``counts_bar``: the density mesh, or
    None), a colour bar of the next objective (``colour_bar``) and the legend below."""
    from matplotlib import rcParams
    from matplotlib.ticker import FuncFormatter
    tick = rcParams["ytick.labelsize"]
    title_h = _text_height("x", "medium") + 6 / 72 if facets != [None] else 0.0
    top = PAD + _text_height(suptitle.get_text(), "medium") + PAD + title_h
    right = PAD + max(0.15, _x_overhang(fig, axes[0]))
    if counts_bar is not None:
        widest = _tick_text(10 ** math.ceil(math.log10(max(float(counts_bar.get_array().max()), 1.0))))
        right += 0.1 + _BAR + _text_width(fig, widest, tick) + _text_height("x", "large") + 16 / 72
    below = _x_room(fig, axes[(nrows - 1) * ncols])
    bar_h = 0.0
    if colour_bar is not None:
        bar_h = 0.12 + _BAR + _text_height("1", tick) + _text_height("x", "large") + 16 / 72
    legend_w, legend_h = _box_size(fig, legend)
    fig.set_size_inches(max(fig.get_figwidth(), legend_w + 2 * PAD), fig.get_figheight())
    bottom = PAD + legend_h + PAD + bar_h + below
    _arrange(fig, ncols, nrows, left=PAD + _y_room(fig, axes[0]), right=right, top=top, bottom=bottom,
             wgap=0.25, hgap=title_h + PAD)
    _settle_ticks(axes[:len(facets)])
    w, h = fig.get_size_inches()
    suptitle.set_y(1 - PAD / h)
    legend.set_bbox_to_anchor((0.5, PAD / h), transform=fig.transFigure)
    pos = axes[0].get_position()
    if counts_bar is not None:
        cax = fig.add_axes((pos.x1 + 0.1 / w, pos.y0, _BAR / w, pos.height))
        bar = fig.colorbar(counts_bar, cax=cax, label="Pareto designs per cell")
        bar.minorticks_off()
        bar.ax.yaxis.set_major_formatter(FuncFormatter(_tick_text))
    if colour_bar is not None:
        width = 0.7 * pos.width
        cax = fig.add_axes((pos.x0 + (pos.width - width) / 2, pos.y0 - (below + 0.12 + _BAR) / h, width, _BAR / h))
        bar = fig.colorbar(colour_bar, cax=cax, orientation="horizontal", label=colour_bar.get_label())
        bar.minorticks_off()
        bar.ax.xaxis.set_major_formatter(FuncFormatter(_tick_text))


# --------------------------------------------------------------------------- roofline

def _clusters(xy: np.ndarray, tol: tuple[float, float]) -> list[list[int]]:
    """Indices of points grouped greedily by closeness in log space (``tol``: decades in x
    and in y): points closer than that share one label."""
    groups: list[list[int]] = []
    anchors: list[np.ndarray] = []
    for i in np.lexsort((xy[:, 1], xy[:, 0])):
        for g, a in zip(groups, anchors):
            if abs(xy[i, 0] - a[0]) <= tol[0] and abs(xy[i, 1] - a[1]) <= tol[1]:
                g.append(int(i))
                break
        else:
            groups.append([int(i)])
            anchors.append(xy[i])
    return groups


#: where a label may sit beside its point, in points (x, y of its lower corner), tried in order
_LABEL_SPOTS = ((6, 2), (6, -12), (-6, 2), (-6, -12), (6, 12), (6, -22), (-6, 12), (-6, -22), (6, 22), (6, -32),
                (-6, 22), (-6, -32))


def _label_offsets(fig, ax, anchors, texts, markers, fontsize: float) -> list[tuple[int, int]]:
    """Offsets (points) of labels beside their ``anchors`` (data coordinates) such that no
    label covers another or a marker (``markers``, data coordinates), the first of
    ``_LABEL_SPOTS`` that is free (the first spot when none is). The axes must be placed
    (fixed margins) and their limits set."""
    px = fig.dpi / 72.0
    half = 4.0 * px
    taken = [(x - half, y - half, x + half, y + half) for x, y in ax.transData.transform(np.asarray(markers))]
    out = []
    for (x, y), t in zip(ax.transData.transform(np.asarray(anchors)), texts):
        lines = t.split("\n")
        w = max(map(len, lines)) * fontsize * 0.62 * px
        h = len(lines) * fontsize * 1.3 * px
        choice = None
        for dx, dy in _LABEL_SPOTS:
            x0 = x + dx * px - (w if dx < 0 else 0.0)
            box = (x0, y + dy * px, x0 + w, y + dy * px + h)
            if not any(box[0] < b[2] and b[0] < box[2] and box[1] < b[3] and b[1] < box[3] for b in taken):
                choice = (dx, dy, box)
                break
        if choice is None:
            dx, dy = _LABEL_SPOTS[0]
            choice = (dx, dy, (x + dx * px, y + dy * px, x + dx * px + w, y + dy * px + h))
        taken.append(choice[2])
        out.append(choice[:2])
    return out


@_styled
def roofline_plot(path: Path, analysis, title: str = "") -> dict:
    """Operators of the prefill and of a decode step by arithmetic intensity (ops/byte) and
    attained performance (ops / time of one instance, in TFLOP/s or TOP/s), under the
    design's roofline: the memory slope (ops/s = intensity x ``analysis.memory_bandwidth``)
    and the compute ceiling of each format used (the peak its operators ran at).

    Each operator has a number (the same in both stages) and its fixed colour
    (:func:`op_colour`); marker: circle for the prefill, square for decode. Points closer
    than a few pixels share one label listing their numbers, and the key beside the plot
    names each number, so no label is written over another."""
    from matplotlib.lines import Line2D
    fig, (ax,) = _figure(width=9.5, height=6.0)
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
    integer = bool(formats) and all(ops_unit(f) == "OP/s" for f in formats if f != "vector")
    scale = AXIS["ops_per_s"][0]
    unit = _unit_text("ops_per_s", scale, "int8" if integer else "fp16")
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
    ax.plot(xs, xs * bw / scale, color="0.3", lw=1, ls="--", label=f"memory slope {rate_text(bw, 'B/s')}")
    ceil_colours = ("#2ca02c", "#d62728", "#9467bd", "#8c564b", "#17becf")
    for i, (f, c) in enumerate(sorted(ceilings.items(), key=lambda kv: -kv[1])):
        ax.plot(xs, np.minimum(xs * bw, c) / scale, color=ceil_colours[i % len(ceil_colours)], lw=1.8,
                label=f"{f} ceiling {rate_text(c, ops_unit(f))}")
    numbers = {n: i + 1 for i, n in enumerate(dict.fromkeys(r["name"] for r in pts))}
    marks = {"prefill": "o", "decode": "s"}
    for stage, mk in marks.items():
        sp = [r for r in pts if r["stage"] == stage]
        if sp:
            ax.scatter([r["arithmetic_intensity"] for r in sp], [r["ops_per_s"] / scale for r in sp], marker=mk,
                       c=[op_colour(r["name"]) for r in sp], edgecolors="k", linewidths=0.5, s=44, zorder=4)
    _log_axis(ax, "x", xs)
    _log_axis(ax, "y", np.concatenate([xs * bw / scale, [r["ops_per_s"] / scale for r in pts]]))
    ax.set_xlabel("arithmetic intensity (ops/byte)")
    ax.set_ylabel(f"attained performance ({unit})")
    ax.set_title(title or "roofline", fontsize="medium")
    ax.legend(handles=ax.get_legend_handles_labels()[0]
              + [Line2D([], [], ls="", marker=m, color="0.6", markeredgecolor="k", label=f"{s} operators")
                 for s, m in marks.items()], loc="lower right", fontsize="x-small")
    key = [Line2D([], [], ls="", marker="o", color=op_colour(n), markeredgecolor="k", ms=7,
                  label=f"{i}  {n}") for n, i in numbers.items()]
    legend = fig.legend(handles=key, loc="upper left", fontsize="x-small", title="operators",
                        ncols=1 if len(key) <= 24 else 2) if key else None
    _row_layout(fig, [ax], legend, titled=True)
    # one label per cluster of nearby points (the numbers of its operators), set where it
    # covers no other label and no marker
    labels = []
    if pts:
        perf = np.array([r["ops_per_s"] / scale for r in pts], float)
        xy = np.column_stack([np.log10(ais), np.log10(perf)])
        lx, ly = np.log10(ax.get_xlim()), np.log10(ax.get_ylim())
        groups = _clusters(xy, (0.03 * (lx[1] - lx[0]), 0.03 * (ly[1] - ly[0])))
        texts = [",".join(str(n) for n in sorted({numbers[pts[i]["name"]] for i in g})) for g in groups]
        texts = [textwrap.fill(t, 18) for t in texts]
        anchors = [(pts[g[0]]["arithmetic_intensity"], pts[g[0]]["ops_per_s"] / scale) for g in groups]
        offsets = _label_offsets(fig, ax, anchors, texts, np.column_stack([ais, perf]), fontsize=7.5)
        for g, t, a, (dx, dy) in zip(groups, texts, anchors, offsets):
            ax.annotate(t, a, xytext=(dx, dy), textcoords="offset points", fontsize=7.5, zorder=6,
                        ha="left" if dx >= 0 else "right", va="bottom",
                        bbox={"boxstyle": "round,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.8})
            labels.append({"numbers": sorted({numbers[pts[i]["name"]] for i in g}), "offset": [dx, dy],
                           "operators": [f"{pts[i]['stage']}:{pts[i]['name']}" for i in g]})
    _save(fig, path)
    return {"kind": "roofline", "x": "arithmetic_intensity", "y": "ops_per_s", "x_unit": "ops/byte",
            "y_unit": unit, "y_scale": scale, "x_label": ax.get_xlabel(), "y_label": ax.get_ylabel(),
            "x_log": True, "y_log": True, "memory_bandwidth": bw, "ceilings": ceilings, "operators": rows,
            "numbers": numbers, "colours": {n: op_colour(n) for n in numbers}, "labels": labels,
            "x_ticks": _tick_labels(ax.xaxis), "y_ticks": _tick_labels(ax.yaxis)}


# --------------------------------------------------------------------------- breakdown

@_styled
def breakdown_plot(path: Path, designs: list[dict], min_share: float = 0.03) -> dict:
    """Stacked bars of per-operator time (prefill; one decode step) of a few designs, as
    shares of each step (designs differ by orders of magnitude) with the step's time
    written above its bar. Every operator has its fixed colour (:func:`op_colour`), the
    same in both panels and in the roofline; one legend lists the operators of both.

    ``designs``: [{'label', 'point', 'analysis'}]. Operators below ``min_share`` of
    their step in every design are summed into 'other'."""
    from matplotlib.patches import Patch
    fig, axes = _figure(ncols=2, width=4.6 + 0.9 * len(designs), height=5.5)
    record = {"kind": "breakdown", "x": "design", "y": "share of step time", "y_unit": "%",
              "designs": [{"label": d["label"], "point": d["point"]} for d in designs], "stages": {}}
    drawn: dict[str, str] = {}
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
        bottom = np.zeros(len(designs))
        xs = np.arange(len(designs))
        values, colours = {}, {}
        for n in series:
            v = np.array([sum(p.get(o, 0.0) for o in other) if n == "other" else p.get(n, 0.0) for p in per])
            values[n] = [float(a) for a in v]
            share = np.divide(v, totals, out=np.zeros_like(v), where=totals > 0) * 100
            bars = ax.bar(xs, share, bottom=bottom, color=op_colour(n), label=n, width=0.6, edgecolor="white",
                          linewidth=0.4)
            colours[n] = _hex(bars.patches[0].get_facecolor()) if bars.patches else op_colour(n)
            drawn.setdefault(n, colours[n])
            bottom += share
        for x0, t in zip(xs, totals):
            ax.annotate(si(float(t), "s"), (x0, 100), xytext=(0, 3), textcoords="offset points", ha="center",
                        fontsize="small")
        ax.set_ylim(0, 108)
        ax.set_xticks(xs, [d["label"] for d in designs], fontsize="small")
        ax.set_ylabel(f"share of {words} time (%)")
        ax.set_xlabel("design (time of the step above its bar)")
        ax.set_title(f"{words}: time per operator", fontsize="medium")
        record["stages"][stage] = {"operators": series, "other": other, "time_s": values, "colours": colours,
                                   "total_s": [float(t) for t in totals], "y_label": ax.get_ylabel()}
    order = sorted(drawn, key=lambda n: (n == "other", list(OP_COLOURS).index(n) if n in OP_COLOURS else 999, n))
    legend = fig.legend(handles=[Patch(color=drawn[n], label=n) for n in order], loc="upper left",
                        fontsize="x-small", title="operator")
    _row_layout(fig, axes, legend, titled=True)
    record["y_label"] = axes[1].get_ylabel()
    record["colours"] = drawn
    _save(fig, path)
    return record


# --------------------------------------------------------------------------- sweep curves

def _swept_axis(ax, xv, most: int) -> None:
    """The x axis of a swept parameter's values ``xv``: logarithmic in base 2 when more than
    two positive values span 8x or more, ticked at the values (at most ``most`` labels, else
    every other power of 2 within the range)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator
    xv = np.asarray(xv, dtype=float)
    xv = xv[np.isfinite(xv)]
    if not (len(np.unique(xv)) > 2 and xv.min() > 0 and xv.max() / xv.min() >= 8):
        return
    ax.set_xscale("log", base=2)
    ticks = np.unique(xv)
    if len(ticks) > most:
        ticks = 2.0 ** np.arange(math.floor(math.log2(xv.min())), math.ceil(math.log2(xv.max())) + 1)
        while len(ticks) > most:
            ticks = ticks[::2]
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(_tick_text))


@_styled
def sweep_plot(path: Path, panels: list[dict], title: str) -> dict:
    """Curves against a swept parameter. Each panel is a dict with ``data`` (rows with
    point, feasible, x and ys), ``x``, ``ys`` (one axes each, its unit chosen from its
    values: times in s, ms or us), ``hue`` (a column giving one line per value, or None)
    and optionally ``log_y``. Lines of a hue value keep one colour, marker and dash in
    every axes, and one legend beside the figure names them; infeasible points are grey
    crosses."""
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter
    n_ax = sum(len(p["ys"]) for p in panels)
    fig, axes = _figure(ncols=n_ax, width=4.6 if n_ax > 2 else 5.4 if n_ax > 1 else 7.0, height=4.4)
    it = iter(axes)
    record = {"kind": "sweep", "panels": []}
    handles: dict[str, object] = {}
    for p in panels:
        data, x, ys, hue = p["data"], p["x"], p["ys"], p.get("hue")
        groups = [(None, data)] if hue is None else list(data.groupby(hue, sort=False, observed=True))
        pal = _palette(len(groups))
        rec = {"x": x, "ys": ys, "hue": hue, "x_unit": unit_of(x)[1], "y_units": {}, "y_scales": {},
               "lines": [], "y_labels": [], "y_ticks": {}}
        for y in ys:
            ax = next(it)
            sy, uy, words = axis_unit(y, data[y].to_numpy(float))
            rec["y_units"][y], rec["y_scales"][y] = uy, sy
            for gi, (key, g) in enumerate(groups):
                key = _plain(key[0] if isinstance(key, tuple) and len(key) == 1 else key)
                g = g.sort_values(x)
                ok, bad = g[g["feasible"]], g[~g["feasible"]]
                colour, mk = (pal[gi], _MARKERS[gi % len(_MARKERS)]) if hue else ("#4c72b0", "o")
                dash = ("-", "--", "-.", ":")[gi % 4] if hue else "-"
                name = f"{hue} = {key}" if hue else words
                ax.plot(ok[x].to_numpy(float), ok[y].to_numpy(float) / sy, marker=mk, ms=5, color=colour, ls=dash,
                        lw=1.6, alpha=0.9)
                handles.setdefault(name, Line2D([], [], marker=mk, ms=5, color=colour, ls=dash, label=name))
                if len(bad):
                    ax.scatter(bad[x].to_numpy(float), bad[y].to_numpy(float) / sy, marker="x", color="0.6", s=20,
                               zorder=3)
                    handles.setdefault("infeasible", Line2D([], [], ls="", marker="x", color="0.6",
                                                            label="infeasible (not fitting, or an SLO missed)"))
                rec["lines"].append({"y": y, "hue": key, "colour": colour, "marker": mk, "dash": dash,
                                     "points": _ids(ok), "infeasible_points": _ids(bad),
                                     "x_values": [float(v) for v in ok[x]], "y_values": [float(v) for v in ok[y]]})
            ax.set_xlabel(label_of(x))
            ax.set_ylabel(label_of(y, uy))
            _swept_axis(ax, data[x].to_numpy(float), 9 if n_ax == 1 else 5)   # labels that fit side by side
            yv = data[y].to_numpy(float) / sy
            if p.get("log_y") and _wide(yv, 10.0) or _wide(yv):
                _log_axis(ax, "y", yv)
            else:
                ax.yaxis.set_major_formatter(FuncFormatter(_tick_text))
            rec["x_label"] = ax.get_xlabel()
            rec["y_labels"].append(ax.get_ylabel())
            rec["y_ticks"][y] = ax
            rec["x_ticks_axes"] = ax
        record["panels"].append(rec)
    if "infeasible" in handles:
        handles["infeasible"] = handles.pop("infeasible")          # last
    legend = fig.legend(handles=list(handles.values()), loc="center left", fontsize="small") if handles else None
    suptitle = fig.suptitle("\n".join(textwrap.wrap(title, 60 * n_ax if n_ax > 1 else 70)), fontsize="medium",
                            va="top")
    _row_layout(fig, axes, legend, suptitle, centre=True)
    _save(fig, path)
    for rec in record["panels"]:        # tick labels as drawn
        rec["y_ticks"] = {y: _tick_labels(ax.yaxis) for y, ax in rec["y_ticks"].items()}
        rec["x_ticks"] = _tick_labels(rec.pop("x_ticks_axes").xaxis)
    record["legend"] = [h.get_label() for h in handles.values()]
    return record


# --------------------------------------------------------------------------- validation

#: the most rows named under the validation plot's ratio panel (beyond, every k-th row is named)
RATIO_LABELS = 120


@_styled
def validation_plot(path: Path, rows: list[dict], title: str = "") -> dict:
    """Predicted against measured, one panel per metric in that metric's own unit (TTFT in
    ms or s, throughputs in tokens/s), colour per hardware, with the y = x line and a
    ±25 % band; a last panel ranks every row by predicted / measured.

    ``rows``: dicts with 'metric', 'measured', 'predicted' (SI), 'hardware' and 'id'."""
    from matplotlib.lines import Line2D
    metrics = list(dict.fromkeys(r["metric"] for r in rows))
    hardware = list(dict.fromkeys(r["hardware"] for r in rows))
    colours = dict(zip(hardware, _palette(len(hardware))))
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    ncols = max(len(metrics), 1)
    fig = Figure(figsize=(max(4.8 * ncols, 10.0), 9.0), layout="constrained")    # drawn once per validation
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(2, ncols, height_ratios=(1.0, 0.8))
    axes = [fig.add_subplot(grid[0, i]) for i in range(len(metrics))] + [fig.add_subplot(grid[1, :])]
    record = {"kind": "validation", "panels": [], "colours": colours}
    for ax, m in zip(axes, metrics):
        rs = [r for r in rows if r["metric"] == m]
        meas = np.array([r["measured"] for r in rs], float)
        pred = np.array([r["predicted"] for r in rs], float)
        s, u, words = axis_unit(m, np.concatenate([meas, pred]))
        for h in hardware:
            sel = [i for i, r in enumerate(rs) if r["hardware"] == h]
            if sel:
                ax.scatter(meas[sel] / s, pred[sel] / s, color=colours[h], s=40, edgecolors="k", linewidths=0.4,
                           zorder=3)
        both = np.concatenate([meas, pred]) / s
        lo, hi = both[both > 0].min() / 1.5, both.max() * 1.5
        xs = np.geomspace(lo, hi, 50)
        ax.plot(xs, xs, "k-", lw=1)
        ax.fill_between(xs, xs * 0.75, xs * 1.25, color="grey", alpha=0.15)
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        _log_axis(ax, "x", [lo, hi])
        _log_axis(ax, "y", [lo, hi])
        ax.set_xlabel(f"measured {label_of(m, u)}")
        ax.set_ylabel(f"predicted ({u})" if u else "predicted")
        ax.set_title(words, fontsize="medium")
        record["panels"].append({"metric": m, "unit": u, "scale": s, "x_label": ax.get_xlabel(),
                                 "y_label": ax.get_ylabel(), "ids": [r["id"] for r in rs],
                                 "measured": (meas / s).tolist(), "predicted": (pred / s).tolist(),
                                 "x_ticks": _tick_labels(ax.xaxis)})
    ax = axes[-1]
    ratio = np.array([r["predicted"] / r["measured"] for r in rows], float)
    order = np.argsort(ratio)
    ax.bar(range(len(order)), ratio[order], bottom=0, color=["#c44e52" if abs(ratio[i] - 1) > 0.25 else "#4c72b0"
                                                             for i in order])
    # at most RATIO_LABELS rows named under the bars (every k-th beyond): matplotlib lays out every
    # tick label on each of its layout passes, so naming all 8,000 rows took 12 minutes; the
    # ids of all rows, in this order, are in the record and in validation.csv
    step = -(-len(order) // RATIO_LABELS) if len(order) else 1
    named = range(0, len(order), step)
    ax.set_xticks(list(named), [f"{rows[order[j]]['id']} {words_of(rows[order[j]]['metric'])}" for j in named],
                  rotation=90, fontsize=6.5 if len(order) > 40 else 7.5)
    ax.set_xlim(-0.7, len(order) - 0.3)
    ax.axhline(1, color="k", lw=1)
    for v in (0.75, 1.25):
        ax.axhline(v, color="grey", ls="--", lw=0.8)
    if len(ratio) and (ratio.min() < 0.5 or ratio.max() > 2):
        _log_axis(ax, "y", np.concatenate([ratio, [0.7, 1.3]]))
    else:
        ax.set_ylim(0.0, max(1.4, float(ratio.max()) * 1.05) if len(ratio) else 1.4)
    ax.set_ylabel("predicted / measured")
    ax.set_title("every row, by predicted / measured (red: off by more than 25 %; dashed: ±25 %)",
                 fontsize="medium")
    fig.legend(handles=[Line2D([], [], ls="", marker="o", color=colours[h], markeredgecolor="k", label=h)
                        for h in hardware] + [Line2D([], [], color="k", label="predicted = measured")],
               loc="outside lower center", fontsize="small", ncols=min(6, len(hardware) + 1))
    fig.suptitle(title, fontsize="medium")
    _save(fig, path)
    record["ratio_ids"] = [rows[i]["id"] for i in order]
    record["ratio_labels"] = [t.get_text() for t in ax.get_xticklabels()]
    return record


# --------------------------------------------------------------------------- compare

@_styled
def compare_plot(path: Path, rows: list[dict]) -> dict:
    """Bars per hardware of TTFT, TPOT, throughput (system, per user, per device) and
    the memory footprint against capacity; hatched bars do not fit."""
    metrics = ["ttft_s", "tpot_s", "output_tokens_per_s", "output_tokens_per_s_per_user",
               "output_tokens_per_s_per_device", "peak_memory_bytes"]
    fig, axes = _figure(ncols=3, nrows=2, width=4.2, height=3.6, layout="constrained")   # rotated names
    names = [r["hardware"] for r in rows]
    pal = _palette(len(rows))
    xs = np.arange(len(rows))
    labels, units = {}, {}
    for ax, m in zip(axes, metrics):
        raw = np.array([r[m] for r in rows], float)
        s, u, _ = axis_unit(m, raw if m != "peak_memory_bytes" else
                            np.concatenate([raw, [r["capacity_bytes"] for r in rows]]))
        bars = ax.bar(xs, raw / s, color=pal)
        for b, r in zip(bars, rows):
            if not r["fits"]:
                b.set_hatch("//")
                b.set_edgecolor("k")
        if m == "peak_memory_bytes":
            cap = np.array([r["capacity_bytes"] for r in rows]) / s
            ax.scatter(xs, cap, marker="_", s=600, color="k", zorder=3, label="capacity per device")
            ax.legend(fontsize="x-small", loc="best")
        ax.set_xticks(xs, names, rotation=25, ha="right", fontsize="small")
        ax.set_ylabel(label_of(m, u))
        labels[m], units[m] = ax.get_ylabel(), u
    first = rows[0]
    fig.suptitle(f"{first['model']}: batch {first['batch']}, prompt {first['prompt_len']}, "
                 f"generate {first['gen_len']}, {first['weights']}/{first['activations']}/{first['kv']}"
                 " (hatched: does not fit)", fontsize="medium")
    _save(fig, path)
    return {"kind": "compare", "hardware": names, "metrics": metrics, "y_labels": labels, "y_units": units}


# --------------------------------------------------------------------------- declared comparisons

@_styled
def comparison_plot(path: Path, panels: list[dict], title: str, kind: str = "line") -> dict:
    """A study's declared comparison (``report.compare``): a grid of panels, each a dict with
    ``data`` (rows with point and feasible), ``x``, ``y``, ``colour`` (a column: one line per
    value, or None), ``row`` and ``col`` (1-based) and ``label`` (its title: the facet value).
    Feasible designs are joined along x (``kind`` line) or drawn as points (scatter), a colour
    value keeping its colour in every panel; infeasible designs are grey crosses. Laid out by
    matplotlib's constrained layout, one legend beside the grid. Returns the record: per
    trace its panel, y, colour value and the ``point`` ids and values drawn (SI)."""
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter
    nrows, ncols = max(p["row"] for p in panels), max(p["col"] for p in panels)
    fig, axes = _figure(ncols=ncols, nrows=nrows, width=4.8 if ncols > 1 else 7.0, height=3.8 if nrows > 1 else 4.6,
                        layout="constrained")
    colour_col = next((p["colour"] for p in panels if p["colour"]), None)
    values = sorted({_plain(v) for p in panels if p["colour"] for v in p["data"][p["colour"]].unique()},
                    key=lambda v: (isinstance(v, str), v if isinstance(v, (int, float)) else 0, str(v)))
    pal = dict(zip(values, _palette(len(values)))) if colour_col else {}
    marks = {v: _MARKERS[i % len(_MARKERS)] for i, v in enumerate(values)}
    record = {"kind": "comparison", "title": title, "traces": [], "panels": []}
    handles: dict[str, object] = {}
    for ax in axes:
        ax.set_visible(False)
    for p in panels:
        ax = axes[(p["row"] - 1) * ncols + p["col"] - 1]
        ax.set_visible(True)
        d, x, y, colour = p["data"], p["x"], p["y"], p["colour"]
        ok = d["feasible"].to_numpy(bool)
        categorical = d[x].dtype.kind not in "fiub"
        sy, uy, _ = axis_unit(y, d[y].to_numpy(float))
        sx, ux, _ = axis_unit(x, d[x].to_numpy(float)) if not categorical else (1.0, "", "")
        groups = [(None, d[ok])] if colour is None else list(d[ok].groupby(colour, sort=True, observed=True))
        for value, g in groups:
            value = _plain(value)
            g = g.sort_values(x, kind="stable")
            c, mk = (pal[value], marks[value]) if colour else ("#4c72b0", "o")
            xs = g[x].astype(str).to_numpy() if categorical else g[x].to_numpy(float) / sx
            ax.plot(xs, g[y].to_numpy(float) / sy, marker=mk, ms=5, color=c, lw=1.6 if kind == "line" else 0,
                    alpha=0.9)
            name = f"{colour} = {value}" if colour else words_of(y)
            handles.setdefault(name, Line2D([], [], marker=mk, ms=5, color=c, label=name))
            record["traces"].append({"panel": p.get("label", ""), "x": x, "y": y, "colour": value,
                                     "points": _ids(g), "x_values": g[x].tolist(),
                                     "y_values": [float(v) for v in g[y].to_numpy(float)]})
        bad = d[~ok]
        if len(bad):
            xs = bad[x].astype(str).to_numpy() if categorical else bad[x].to_numpy(float) / sx
            ax.scatter(xs, bad[y].to_numpy(float) / sy, marker="x", color="0.6", s=20, zorder=3)
            handles.setdefault("infeasible", Line2D([], [], ls="", marker="x", color="0.6",
                                                    label="infeasible (not fitting, or an SLO missed)"))
        ax.set_xlabel(label_of(x, ux) if not categorical else words_of(x))
        ax.set_ylabel(label_of(y, uy))
        if not categorical:
            _swept_axis(ax, d[x].to_numpy(float) / sx, 5 if ncols > 1 else 9)
        if _wide(d[y].to_numpy(float) / sy, 10.0):
            _log_axis(ax, "y", d[y].to_numpy(float) / sy)
        else:
            ax.yaxis.set_major_formatter(FuncFormatter(_tick_text))
        if p.get("label"):
            ax.set_title(p["label"], fontsize="medium")
        record["panels"].append({"label": p.get("label", ""), "x": x, "y": y, "x_label": ax.get_xlabel(),
                                 "y_label": ax.get_ylabel(), "points": _ids(d)})
    if "infeasible" in handles:
        handles["infeasible"] = handles.pop("infeasible")
    if handles:
        fig.legend(handles=list(handles.values()), loc="outside right center", fontsize="small",
                   title=colour_col)
    width = fig.get_size_inches()[0]             # about 8 characters of the title an inch
    fig.suptitle("\n".join(textwrap.wrap(title, int(8 * width))), fontsize="medium")
    _save(fig, path)
    record["legend"] = list(handles)
    return record
