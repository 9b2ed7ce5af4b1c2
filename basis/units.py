"""The one unit policy for everything a person reads (tables, summaries, errors, plots, reports).

Values inside are SI (bytes, bytes/s, ops/s, seconds, watts, joules, dollars; die areas in mm^2 as published). Shown to people:

- **sizes in bytes** (memory capacity, footprint, weights, KV cache): binary prefixes, KiB,
  MiB, GiB, TiB, as memory is built and as vendors label it (an H100's "80 GB" is 80 GiB);
- **rates** (bandwidth, ops/s, tokens/s) and every other quantity: decimal SI prefixes
  (3.35 TB/s, 989 TFLOP/s);
- **times**: s, ms, us (microseconds, ASCII), ns.

``bytes_text``, ``rate_text`` and ``time_text`` write a value; ``AXIS`` gives the fixed scale
a plot axis or a table column of a quantity uses (``axis_scale``), so one column of numbers
is never mixed across prefixes.
"""
from __future__ import annotations

import math

_DECIMAL = ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))
_BINARY = ((2**50, "PiB"), (2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"))
_TIME = ((1.0, "s"), (1e-3, "ms"), (1e-6, "us"), (1e-9, "ns"))

GIB = 2**30
"""Bytes in a GiB: the scale of memory sizes on plot axes."""


def _missing(value) -> str | None:
    if value is None:
        return "-"
    v = float(value)
    if math.isnan(v):
        return "-"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return None


def _prefixed(v: float, scales, digits: int, sep: str, unit: str, smallest: tuple[float, str]) -> str:
    """``v`` over the largest scale of ``scales`` it reaches once rounded to ``digits``
    significant figures (0.99996 s is '1 s', not '1e+03 ms')."""
    for scale, p in scales:
        if abs(float(f"{v / scale:.{digits}g}")) >= 1:
            return f"{v / scale:.{digits}g}{sep}{p}{unit}"
    scale, p = smallest
    return f"{v / scale:.{digits}g}{sep}{p}{unit}"


def bytes_text(value, digits: int = 3) -> str:
    """A size in bytes with a binary prefix: 85899345920 -> '80 GiB', 524288 -> '512 KiB'."""
    return _missing(value) or _prefixed(float(value), _BINARY, digits, " ", "", (1.0, "B"))


def rate_text(value, unit: str = "", digits: int = 3) -> str:
    """A rate or count with a decimal SI prefix: (3.35e12, 'B/s') -> '3.35 TB/s',
    (9.89e14, 'FLOP/s') -> '989 TFLOP/s', (1234.0, '') -> '1.23k'."""
    return _missing(value) or _prefixed(float(value), _DECIMAL, digits, " " if unit else "", unit, (1.0, ""))


def time_text(value, digits: int = 3) -> str:
    """A duration in seconds: 0.0123 -> '12.3 ms', 4.6e-6 -> '4.6 us', 75.0 -> '75 s'."""
    m = _missing(value)
    if m:
        return m
    return "0 s" if float(value) == 0 else _prefixed(float(value), _TIME, digits, " ", "", (1e-9, "ns"))


#: how a quantity is scaled on a plot axis or in a table column: (divide by, unit shown)
AXIS = {
    "bytes": (GIB, "GiB"),
    "bytes_per_s": (1e9, "GB/s"),
    "ops_per_s": (1e12, "TFLOP/s"),
    "seconds": (1e-3, "ms"),
    "watts": (1.0, "W"),
    "dollars": (1.0, "$"),
    "joules": (1.0, "J"),
    "tokens_per_joule": (1.0, "tokens/J"),
    "area_mm2": (1.0, "mm^2"),
    "requests_per_s": (1.0, "requests/s"),
    "share": (0.01, "%"),
}


def axis_scale(kind: str) -> tuple[float, str]:
    """(divide by, unit) of a quantity of ``kind`` (a key of ``AXIS``) on an axis or in a column."""
    return AXIS[kind]
