"""Turning SI values into text for people: tables, CSV and JSON (I/O edge only)."""
from __future__ import annotations

import csv
import io
import json
import math

_PREFIX = [(1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")]


def si(value: float, unit: str = "", digits: int = 3) -> str:
    """Format ``value`` with an SI prefix: 6.87e10 -> '68.7G'."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    a = abs(value)
    for scale, p in _PREFIX:
        if a >= scale:
            return f"{value / scale:.{digits}g}{p}{unit}"
    if a and a < 1e-3 and unit == "s":
        return f"{value * 1e6:.{digits}g}us"
    if a and a < 1 and unit == "s":
        return f"{value * 1e3:.{digits}g}ms"
    return f"{value:.{digits}g}{unit}"


def binary_bytes(value: float) -> str:
    """Format bytes with binary prefixes: 524288 -> '512 KiB'."""
    for scale, p in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if abs(value) >= scale:
            return f"{value / scale:.4g} {p}"
    return f"{value:.4g} B"


def text_table(rows: list[dict], columns: list[tuple[str, str, callable]]) -> str:
    """Aligned text table; ``columns`` are (key, header, formatter)."""
    cells = [[h for _, h, _ in columns]] + [[fmt(r[k]) for k, _, fmt in columns] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(columns))]
    lines = []
    for j, row in enumerate(cells):
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
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
