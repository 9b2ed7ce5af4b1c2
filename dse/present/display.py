"""Turning SI values into text for people: tables, CSV and JSON (I/O edge only).

Every figure is written by the one unit policy of ``basis.units``: sizes in binary units
(80 GiB), rates and other quantities with decimal prefixes (3.35 TB/s, 989 TFLOP/s), times
in s, ms, us. ``quantity_text`` writes a named metric or parameter in its unit (``kind_of``
says which quantity a name measures); ``figures_text`` writes a nested record (a preset, a
model, a study) one figure a line.
"""
from __future__ import annotations

import csv
import io
import json
import math

from basis.units import bytes_text, rate_text, time_text
from dse.system.params import UNITS
from hwmodels.formats import COMPUTE_CLASSES

#: words of a quantity kind not in ``basis.units.AXIS``
TOKENS_PER_S = "tokens_per_s"
#: words of request rates, and of fractions shown in percent
REQUESTS_PER_S = "requests_per_s"
SHARE = "share"
#: metrics that are a fraction of a whole (a parameter's is declared: ``dse.system.params``)
SHARES = ("kv_utilization",)
#: integer-only compute classes: their peaks are OP/s, not FLOP/s
_INT_PREFIX = "int"


def si(value: float, unit: str = "", digits: int = 3) -> str:
    """``value`` in ``unit`` by the unit policy: a time when ``unit`` is 's' ('12.3 ms'), else
    a decimal SI prefix ('68.7 GB/s'; '68.7G' without a unit)."""
    return time_text(value, digits) if unit == "s" else rate_text(value, unit, digits)


def binary_bytes(value: float) -> str:
    """A size in bytes with a binary prefix ('512 KiB'); ``basis.units.bytes_text``."""
    return bytes_text(value)


def ops_unit(compute_class: str) -> str:
    """The unit of a peak of ``compute_class``: 'OP/s' for integer classes, else 'FLOP/s'."""
    return "OP/s" if str(compute_class).startswith(_INT_PREFIX) else "FLOP/s"


def tokens_text(value) -> str:
    """Tokens per second: '12,345 tokens/s', '45.6 tokens/s' ('-' when missing)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    v = float(value)
    return f"{v:,.0f} tokens/s" if abs(v) >= 100 else f"{v:.3g} tokens/s"


def kind_of(name: str) -> str | None:
    """The quantity a metric or parameter named ``name`` measures: a key of
    ``basis.units.AXIS`` ('bytes', 'bytes_per_s', 'ops_per_s', 'seconds', 'watts',
    'dollars', 'joules', 'tokens_per_joule', 'area_mm2'), ``TOKENS_PER_S``, ``REQUESTS_PER_S``, ``SHARE`` (a fraction shown in
    percent), or None for counts, names and flags. A parameter's is its declared unit
    (``dse.system.params.UNITS``); a metric's follows from its name."""
    if name in UNITS:
        return UNITS[name]
    if "tokens_per_s" in name:
        return TOKENS_PER_S
    if name in ("requests_per_s", "goodput"):
        return REQUESTS_PER_S
    if name in SHARES:
        return SHARE
    if name.endswith("_bytes_per_s") or name.endswith("_bandwidth"):
        return "bytes_per_s"
    if name.endswith("_bytes") or name.endswith("_capacity"):
        return "bytes"
    if name.endswith("ops_per_s") or name.startswith("peak_") or name == "pim_peak":
        return "ops_per_s"
    if name.endswith("_s") or name.endswith("_latency"):
        return "seconds"
    if name.endswith("_w"):
        return "watts"
    if name.endswith("_usd"):
        return "dollars"
    if name.endswith("_j"):
        return "joules"
    if name == "tokens_per_joule":
        return "tokens_per_joule"
    if name.endswith("_mm2"):
        return "area_mm2"
    return None


def fixed_text(value, scale: float, unit: str = "") -> str:
    """``value`` over a fixed ``scale`` (one column never mixes prefixes): (8.59e10, 2**30,
    'GiB') -> '80 GiB', (3.35e12, 1e12, 'TB/s') -> '3.35 TB/s', (1.979e15, 1e12, 'TFLOP/s')
    -> '1,979 TFLOP/s'; three significant figures below 100, whole numbers from 100 on;
    '-' when missing."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    x = float(value) / scale
    text = f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"
    return f"{text} {unit}" if unit else text


def _plain_number(v) -> str:
    """A count or a plain number: '1,024', '0.125'."""
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int) or (isinstance(v, float) and v.is_integer() and abs(v) < 1e15):
        return f"{int(v):,}"
    return f"{v:.4g}"


def quantity_text(name: str, value, compute_class: str = "") -> str:
    """``value`` of the metric or parameter ``name`` (SI) in its unit: 'capacity_bytes' 8.59e10
    -> '80 GiB', 'memory_bandwidth' 3.35e12 -> '3.35 TB/s', 'peak_fp8' -> '1.98 PFLOP/s',
    'tdp_w' 700 -> '700 W'; strings, flags and counts as they are. ``compute_class`` names the
    class of a peak that ``name`` does not ('fp8', 'int8'). A number written as text ('1.0e12',
    as YAML 1.1 reads it) is that number when ``name`` measures a quantity."""
    if isinstance(value, str) and kind_of(name) is not None:
        try:
            value = float(value)
        except ValueError:
            return value
    if value is None or isinstance(value, (str, bool)) or not isinstance(value, (int, float)):
        return "-" if value is None else str(value)
    if math.isnan(value):
        return "-"
    if name == "tokens_per_dollar":            # (a plain number on an axis: no kind of its own)
        return f"{value:,.0f} tokens/$" if abs(value) >= 100 else f"{value:.3g} tokens/$"
    if name.endswith("_usd_per_hour"):
        return f"${value:,.2f}/h"
    kind = kind_of(name)
    if kind == "bytes":
        return bytes_text(value)
    if kind == "bytes_per_s":
        return rate_text(value, "B/s")
    if kind == "ops_per_s":
        cls = compute_class if compute_class in COMPUTE_CLASSES else name.removeprefix("peak_")
        return rate_text(value, ops_unit(cls))
    if kind == "seconds":
        return time_text(value)
    if kind == "watts":
        return rate_text(value, "W")
    if kind == "dollars":
        return f"${value:,.0f}" if abs(value) >= 100 else f"${value:.3g}"
    if kind == "joules":
        return f"{value:.3g} J"
    if kind == "tokens_per_joule":
        return f"{value:.3g} tokens/J"
    if kind == "area_mm2":
        return f"{value:,.0f} mm^2"
    if kind == TOKENS_PER_S:
        return tokens_text(value)
    if kind == REQUESTS_PER_S:
        return f"{value:.3g} requests/s"
    if kind == SHARE:
        return f"{100 * value:.1f} %"
    return _plain_number(value)


#: keys under a quantity's name that are counts, not the quantity ({min, max, count} ranges)
_COUNT_KEYS = ("count", "samples", "points")


def figures_text(record: dict, width: int = 28) -> str:
    """A nested record (a preset, a model, a study), one figure a line with its unit;
    a mapping or a list of mappings is indented under its name. A plain key under a
    quantity's name is that quantity: compute classes under a ``*ops_per_s`` name are a
    peak per class, ``min``/``max``/``step`` under ``memory_bandwidth`` are bandwidths."""
    return "\n".join(_figure_lines(record, "", width))


def _figure_lines(record: dict, pad: str, width: int, parent: str = "") -> list[str]:
    lines = []
    for k, v in record.items():
        key = f"{pad}{k}"
        if isinstance(v, dict) and v:
            lines.append(key)
            lines += _figure_lines(v, pad + "  ", width, str(k))
        elif isinstance(v, (list, tuple)) and v and all(isinstance(x, dict) for x in v):
            for j, x in enumerate(v):
                lines.append(f"{key}[{j}]")
                lines += _figure_lines(x, pad + "  ", width, str(k))
        elif isinstance(v, (list, tuple)):
            lines.append(f"{key:{width}s} {', '.join(quantity_text(str(k), x) for x in v) or '-'}")
        elif isinstance(v, dict):
            lines.append(f"{key:{width}s} -")
        elif kind_of(str(k)) is None and str(k) not in _COUNT_KEYS and kind_of(parent) is not None:
            lines.append(f"{key:{width}s} {quantity_text(parent, v, str(k))}")
        else:
            lines.append(f"{key:{width}s} {quantity_text(str(k), v)}")
    return lines


def text_table(rows: list[dict], columns: list[tuple[str, str, callable]], left: tuple = ()) -> str:
    """Aligned text table; ``columns`` are (key, header, formatter). The first column and those
    whose key is in ``left`` (words) are left-aligned, the others (figures) right-aligned."""
    cells = [[h for _, h, _ in columns]] + [[fmt(r[k]) for k, _, fmt in columns] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(columns))]
    at_left = [i == 0 or k in left for i, (k, _, _) in enumerate(columns)]
    lines = []
    for j, row in enumerate(cells):
        lines.append("  ".join(c.ljust(w) if at_left[i] else c.rjust(w)
                               for i, (c, w) in enumerate(zip(row, widths))).rstrip())
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def csv_text(rows: list[dict], keys: list[str] | None = None) -> str:
    """CSV of dict rows (all keys of the first row unless ``keys`` given)."""
    if not rows:
        return ""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=keys or list(rows[0]), extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def json_text(obj) -> str:
    """JSON with infinities written as null."""
    def clean(o):
        if isinstance(o, float) and (math.isinf(o) or math.isnan(o)):
            return None
        if isinstance(o, dict):
            return {k: clean(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return [clean(v) for v in o]
        return o
    return json.dumps(clean(obj), indent=2)
