"""Derived designs: a preset with some of its figures changed, named as what it is.

A derived design is written ``BASE+TERM+TERM...``, e.g. ``h100-sxm+bw6.7T+fp8x0.5``: the preset
``BASE`` (a name of ``configs/hardware``, or a preset YAML path) with each TERM overriding one of
its figures. A TERM is a key (``KEYS``) followed by its value:

- ``x`` and a factor: the base's own figure times it (``fp8x0.5``: half the base's FP8 peak);
- a number, optionally with a prefix: the figure itself, in SI units (``bw6.7T``: 6.7e12 bytes/s);
  prefixes ``k M G T P E`` are powers of 1000, ``Ki Mi Gi Ti Pi`` powers of 1024 (``mem141G``,
  ``mem80Gi``); an ``=`` may stand between key and number (``fp8=989.4T``);
- ``=`` and a name for the keys that take a name (``memtype=hbm3e``, ``formats=fp16,fp8``).

Each key is one of the existing override parameters (``dse.system.params``): a name is split into
its base and those parameters' values, the one override path every study column takes. The
parameters that describe the chip itself have a key; those that describe what surrounds it or
what it is assumed to cost (price, static power, links to other nodes, host tiers) do not: they
keep their own columns and flags, and a preset with only them changed keeps its name.

The canonical name (``design_name``) writes the terms in the order of ``KEYS``, one per key, each
number as the shortest decimal that reads back as the same float, with the power-of-1000 prefix
that leaves 1 to 999.99.. before it (or, for bytes, a power-of-1024 prefix where that is
shorter: ``mem80Gi``), and an ``=`` after a key that ends in a digit (``fp8=989.4T``, ``l2=50Mi``); a factor stays a factor. So
``design_name(*parse_design(name))`` is ``name`` for a canonical name, and numbers read back
exactly (``parse_design(design_name(...))`` gives the same floats).

This module imports nothing of ``dse``.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Callable

from basis.errors import DseError, name_or_kind
from hwmodels.device import Device
from hwmodels.formats import COMPUTE_CLASSES


@dataclass(frozen=True)
class Key:
    """One key of the notation: the override parameter it sets, what its value is (``number``:
    a figure in SI units; ``count``: a whole number; ``name``: a name), whether a byte count
    (binary prefixes may be shorter), and the base's own figure (None: none; a number's may be
    multiplied, ``x<factor>``; a name's, the native formats, is what the preset has unchanged)."""

    key: str
    param: str
    kind: str = "number"
    bytes: bool = False
    figure: Callable[[Device], float | None] | None = None


def _peak(c: str) -> Callable[[Device], float | None]:
    return lambda d: d.peak_ops_per_s.get(c)


#: the keys, in the canonical order: memory, compute, on-chip buffer, scale-up link, PIM, native
#: formats, power, then the template's microarchitecture (``hwmodels.template.TEMPLATE_COLUMNS``)
KEYS: tuple[Key, ...] = (
    Key("bw", "memory_bandwidth", figure=lambda d: d.memory.bandwidth_bytes_per_s),
    Key("mem", "memory_capacity", bytes=True, figure=lambda d: d.memory.capacity_bytes),
    *(Key(c, f"peak_{c}", figure=_peak(c)) for c in COMPUTE_CLASSES),
    Key("compute", "compute_scale", figure=lambda d: 1.0),
    Key("vec", "vector_ops_per_s", figure=lambda d: d.vector_ops_per_s),
    Key("buf", "onchip_buffer_bytes", bytes=True, figure=lambda d: d.onchip_buffer_bytes or None),
    Key("linkbw", "link_bandwidth", figure=lambda d: d.interconnect.bandwidth_bytes_per_s if d.interconnect else None),
    Key("pim", "pim_multiple", figure=lambda d: d.pim.internal_bandwidth_multiple if d.pim else None),
    Key("pimpeak", "pim_peak"),
    Key("formats", "native_formats", kind="name",
        figure=lambda d: ",".join(c for c in COMPUTE_CLASSES if d.peak_ops_per_s.get(c, 0) > 0)),
    Key("tdp", "tdp_w", figure=lambda d: d.tdp_w),
    Key("cores", "cores", kind="count"),
    Key("clock", "clock_hz"),
    Key("l2", "l2_bytes", bytes=True),
    Key("stacks", "memory_stacks", kind="count"),
    Key("memtype", "memory_type", kind="name"),
    Key("node", "process_node", kind="name"),
    Key("plim", "power_limit_w"),
)
BY_KEY = {k.key: k for k in KEYS}
BY_PARAM = {k.param: k for k in KEYS}
#: the override parameters a derived design's name spells (the chip's own figures)
DESIGN_PARAMS = tuple(BY_PARAM)
_ORDER = {k.key: i for i, k in enumerate(KEYS)}
#: keys longest first: a term is read by the longest key it starts with
_LONGEST = sorted(BY_KEY, key=len, reverse=True)

_DECIMAL = {"": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50}
_DECIMAL_DOWN = sorted(_DECIMAL.items(), key=lambda pe: -pe[1])   # largest power first
_NUMBER = re.compile(r"(?P<num>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE](?P<exp>[+-]?[0-9]{1,3}))?(?P<prefix>Ki|Mi|Gi|Ti|Pi|[kMGTPE])?")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.,-]*")
SEPARATOR = "+"


@dataclass(frozen=True)
class Term:
    """One override of a derived design: its key, its value (a float, or a name for keys that
    take one) and whether the value is a factor on the base's own figure."""

    key: str
    value: float | str
    factor: bool = False


def is_derived(name) -> bool:
    """True when ``name`` is a derived design's name (a preset name with ``+`` terms)."""
    return isinstance(name, str) and SEPARATOR in name and not name.endswith((".yaml", ".yml"))


def _at(where: str) -> str:
    """The start of a message about ``where`` ('' for none)."""
    return f"{where}: " if where else ""


def _allowed() -> str:
    return (f"allowed keys: {', '.join(k.key for k in KEYS)}; a value is x<factor>, a number with an optional "
            f"prefix (k M G T P E, Ki Mi Gi Ti Pi) or, for {', '.join(k.key for k in KEYS if k.kind == 'name')}, "
            f"=<name> (README, 'Derived designs')")


def parse_design(name: str, where: str = "") -> tuple[str, tuple[Term, ...]]:
    """(the base preset, the terms in canonical order) of a derived design's name; a name
    without terms is (name, ()). DseError naming ``where``, the bad part and the allowed keys
    for an unknown key, a bad or non-positive number, a key given twice or an empty term."""
    if not is_derived(name):
        return name, ()
    base, *parts = name.split(SEPARATOR)
    if not base:
        raise DseError(f"{_at(where)}{name_or_kind(name)}: a derived design starts with its base preset "
                       f"(h100-sxm+bw6.7T); {_allowed()}")
    terms = {}
    for part in parts:
        term = _term(part, where)
        if term.key in terms:
            raise DseError(f"{_at(where)}{name_or_kind(part)}: key '{term.key}' is given twice; give each key once")
        terms[term.key] = term
    return base, tuple(sorted(terms.values(), key=lambda t: _ORDER[t.key]))


def _term(part: str, where: str) -> Term:
    """One term of a derived design's name (see the module docstring)."""
    key = next((k for k in _LONGEST if part.startswith(k)), None)
    if key is None:
        raise DseError(f"{_at(where)}{name_or_kind(part) if part else 'an empty term'}: unknown key; {_allowed()}")
    spec, rest = BY_KEY[key], part[len(key):]
    if spec.kind == "name":
        if not rest.startswith("=") or not _NAME.fullmatch(rest[1:]):
            raise DseError(f"{_at(where)}{name_or_kind(part)}: '{key}' takes a name, written {key}=NAME; {_allowed()}")
        return Term(key, rest[1:])
    factor = rest.startswith("x")
    if factor and spec.figure is None:
        raise DseError(f"{_at(where)}{name_or_kind(part)}: '{key}' takes an absolute value (the base has no figure "
                       f"of its own to multiply); {_allowed()}")
    text = rest[1:] if factor or rest.startswith("=") else rest
    m = _NUMBER.fullmatch(text)
    if m is None:
        raise DseError(f"{_at(where)}{name_or_kind(part)}: '{key}' needs a positive number"
                       f"{' (a factor)' if factor else ''} after it; {_allowed()}")
    value = _number(m)
    if not (math.isfinite(value) and value > 0):
        raise DseError(f"{_at(where)}{name_or_kind(part)}: '{key}' needs a positive finite number; {_allowed()}")
    if factor and m["prefix"]:
        raise DseError(f"{_at(where)}{name_or_kind(part)}: a factor takes no prefix; {_allowed()}")
    if spec.kind == "count" and value != round(value):
        raise DseError(f"{_at(where)}{name_or_kind(part)}: '{key}' counts whole units; {_allowed()}")
    return Term(key, value, factor)


def _number(m: re.Match) -> float:
    """The float a matched number spells (its prefix applied exactly, in decimal arithmetic)."""
    d = Decimal(m["num"]) * Decimal(10) ** int(m["exp"] or 0)
    p = m["prefix"] or ""
    d = d * (Decimal(2) ** _BINARY[p] if p in _BINARY else Decimal(10) ** _DECIMAL[p])
    return float(d)


def _number_text(value: float, binary: bool) -> str:
    """``value`` as text ``_number`` reads back as the same float: the shortest decimal of the float
    (``repr``) with the power-of-1000 prefix that leaves 1 to 999.99.. before it (none below 1000),
    or, for bytes, a power-of-1024 prefix where that is shorter (``80Gi``)."""
    exact = Decimal(repr(float(value)))
    # the largest power 10^e at or below the value: compared as floats (10^e to 10^18 is a float
    # exactly, and the shortest decimal of a float is on the same side of it), scaled exactly
    p, e = next(((p, e) for p, e in _DECIMAL_DOWN if value >= 10.0 ** e), ("", 0))
    text = (_plain(exact.scaleb(-e)) or repr(float(value))) + p
    if binary:
        for q, e in _BINARY.items():
            scaled = exact / Decimal(2) ** e
            short = _plain(scaled)
            if short is not None and scaled >= 1 and float(Decimal(short) * Decimal(2) ** e) == value \
                    and len(short + q) < len(text):
                text = short + q
    return text


def _plain(d: Decimal) -> str | None:
    """``d`` in positional notation without trailing zeros (None when longer than 24 characters)."""
    text = format(d.normalize(), "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text if len(text) <= 24 else None


def term_text(t: Term) -> str:
    """One term as the canonical name writes it."""
    spec = BY_KEY[t.key]
    if spec.kind == "name":
        return f"{t.key}={t.value}"
    if t.factor or spec.param == "compute_scale":
        return f"{t.key}x{_plain(Decimal(repr(float(t.value)))) or repr(float(t.value))}"
    return f"{t.key}{'=' if t.key[-1].isdigit() else ''}{_number_text(float(t.value), spec.bytes)}"


def design_name(base: str, terms) -> str:
    """The canonical name of ``base`` with ``terms`` (in ``KEYS`` order; ``base`` alone without)."""
    return SEPARATOR.join([base, *(term_text(t) for t in sorted(terms, key=lambda t: _ORDER[t.key]))])


def terms_of(values: dict) -> tuple[Term, ...]:
    """The terms of the override parameters ``values`` (parameter -> value; None or NaN: not given)."""
    out = []
    for param, v in values.items():
        if v is None or (isinstance(v, float) and math.isnan(v)) or (isinstance(v, str) and not v):
            continue
        out.append(Term(BY_PARAM[param].key, v if isinstance(v, str) else float(v)))
    return tuple(sorted(out, key=lambda t: _ORDER[t.key]))


def overrides(terms, device: Device, where: str = "") -> dict:
    """The override parameters ``terms`` set on ``device`` (parameter -> value, SI units): a factor
    times the device's own figure. DseError naming ``where`` when the device has no such figure."""
    out = {}
    for t in terms:
        spec = BY_KEY[t.key]
        if not t.factor:
            out[spec.param] = t.value
            continue
        own = spec.figure(device)
        if not own:
            raise DseError(f"{_at(where)}{term_text(t)}: '{device.name}' has no {spec.param} of its own to multiply; "
                           f"give the figure itself ({t.key}<number>)")
        out[spec.param] = float(own) * float(t.value)
    return out


__all__ = ["KEYS", "Key", "Term", "DESIGN_PARAMS", "BY_KEY", "BY_PARAM", "is_derived", "parse_design", "design_name",
           "term_text", "terms_of", "overrides"]
