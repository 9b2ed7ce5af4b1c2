"""Design spaces: named parameters, each fixed, a range or a list of choices.

A parameter is written in a study file (or a dict) as
- a scalar: fixed;
- a list: choices (a categorical axis, e.g. presets: ``hardware: [h100-sxm, b200]``;
  ``native_formats`` choices are comma-separated compute formats or lists of them);
- a mapping ``{min, max, step}`` or ``{min, max, count[, scale: linear|log]}``: a range;
  with ``step`` the values are min, min + step, ... <= max; with ``count`` they are
  ``count`` values from min to max, evenly spaced (log: evenly in log space); with
  neither, a continuous range for random, Sobol and Optuna (a grid refuses it).

Grids enumerate the product of the axes in mixed radix; random and Sobol sweeps draw
each range continuously (integer parameters are rounded) and each choice uniformly.
Values are in SI units (bytes, bytes/s, ops/s, seconds).
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass

import numpy as np

from basis.errors import DseError, as_number, kind_of, name_or_kind
from dse.system.hardware import check_design
from dse.system.params import BATCH_MAX, DEFAULTS, HARDWARE_PARAMS, PARAMS, WORKLOAD_PARAMS, out_of_range
from hwmodels.classes import device_class
from hwmodels.formats import COMPUTE_CLASSES, get_format
from hwmodels.links import load_link
from hwmodels.placement import parse_policy
from hwmodels.presets import load_device
from hwmodels.tiers import load_tier
from workloads.model import load_model


@dataclass(frozen=True)
class Axis:
    """One parameter: its grid values (``values``) and, for a range, its bounds."""

    name: str
    values: tuple
    low: float | None = None
    high: float | None = None
    log: bool = False

    @property
    def is_range(self) -> bool:
        return self.low is not None


_num = as_number
#: the most values one axis may list (checked before anything is allocated)
MAX_AXIS_VALUES = 10_000_000


def _cast(name: str, v, where: str):
    kind = PARAMS[name]
    if kind is bool:
        if not isinstance(v, bool):
            raise DseError(f"{where}: expected true or false, got {v!r}")
        return v
    if kind is str:
        if isinstance(v, (list, tuple)) and name == "native_formats":
            return ",".join(map(str, v))
        if not isinstance(v, str):
            hint = ""
            if name == "disaggregate" and isinstance(v, int):     # YAML 1.1 reads 3:3 as base 60
                hint = " (YAML reads an unquoted P:D such as 3:3 as a base-60 number: quote it, '3:3')"
            raise DseError(f"{where}: expected {'P:D text' if name == 'disaggregate' else 'a name'}, got {v!r}{hint}")
        return v
    if name == "batch" and v == BATCH_MAX:
        return v
    x = _num(v, where)
    bad, allowed = out_of_range(name, np.array([x]))
    if bad[0]:
        raise DseError(f"{where}: expected {allowed}{' or max' if name == 'batch' else ''}, got {v!r}")
    return int(x) if kind is int else x


def make_axis(name: str, spec, where: str = "space") -> Axis:
    """Parse one parameter's spec (scalar, list or range mapping); DseError naming ``where.name``."""
    w = f"{where}.{name}"
    if name not in PARAMS:
        raise DseError(f"{w}: unknown parameter; allowed: {', '.join(PARAMS)}")
    if isinstance(spec, dict):
        extra = set(spec) - {"min", "max", "step", "count", "scale"}
        if extra:
            raise DseError(f"{w}: unknown key(s) {', '.join(sorted(extra))}; allowed: min, max, step, count, scale")
        if PARAMS[name] in (str, bool):
            raise DseError(f"{w}: a range needs a numeric parameter; give a list of choices")
        for k in ("min", "max"):
            if k not in spec:
                raise DseError(f"{w}: a range needs '{k}'")
        lo, hi = _cast(name, spec["min"], f"{w}.min"), _cast(name, spec["max"], f"{w}.max")
        if lo > hi:
            raise DseError(f"{w}: empty range, min {lo:g} > max {hi:g}")
        scale = spec.get("scale", "linear")
        if scale not in ("linear", "log"):
            raise DseError(f"{w}.scale: expected linear or log, got {scale!r}")
        if "step" in spec and "count" in spec:
            raise DseError(f"{w}: give one of 'step' or 'count', not both")
        if scale == "log" and lo <= 0:
            raise DseError(f"{w}: a log range needs min > 0, got {lo:g}")
        if "step" not in spec and "count" not in spec:   # continuous: sampled, not gridded
            return Axis(name, (), lo, hi, scale == "log")
        if "step" in spec:
            step = _num(spec["step"], f"{w}.step")
            if step <= 0:
                raise DseError(f"{w}.step: must be positive, got {step:g}")
            if hi > lo and step > hi - lo:
                raise DseError(f"{w}.step: {step:g} is larger than the range {lo:g}..{hi:g}")
            if scale == "log":
                raise DseError(f"{w}: 'step' goes with a linear range; use 'count' for a log range")
            n = math.floor(min((hi - lo) / step * (1 + 1e-12), MAX_AXIS_VALUES)) + 1
            if n > MAX_AXIS_VALUES:
                raise DseError(f"{w}.step: gives more than {MAX_AXIS_VALUES:,} values; allowed: a larger step")
            vals = lo + step * np.arange(n)
        else:
            n = spec["count"]
            if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_AXIS_VALUES:
                raise DseError(f"{w}.count: expected a positive integer up to {MAX_AXIS_VALUES:,}, got {n!r}")
            if n > 1 and lo == hi:
                raise DseError(f"{w}: empty range for {n} values, min = max = {lo:g}")
            vals = np.geomspace(lo, hi, n) if scale == "log" else np.linspace(lo, hi, n)
        if PARAMS[name] is int:
            vals = np.unique(np.round(vals).astype(int))
            if vals.min() <= 0:
                raise DseError(f"{w}: integer parameter must stay positive")
        values = tuple(v.item() for v in vals)
        return Axis(name, tuple(_cast(name, v, w) for v in values), lo, hi, scale == "log")
    if isinstance(spec, (list, tuple)):
        if not spec:
            raise DseError(f"{w}: empty list of choices")
        vals = tuple(_cast(name, v, f"{w}[{i}]") for i, v in enumerate(spec))
        return Axis(name, vals)
    return Axis(name, (_cast(name, spec, w),))


#: the study keys whose values name a preset or a config to load (or give its file's path)
_LOADED = ("hardware", "model", "link", "host_tier", "host_cpu")


def _named(e: DseError, value) -> str:
    """The message of a loader's error about a study's ``value``, quoting it back only where it is a
    short plain name or a file's path (which names that file): other text read from the study is
    described, never echoed (the first clause of what is allowed kept)."""
    text = str(e)
    if not isinstance(value, str) or name_or_kind(value) != kind_of(value) or "/" in value \
            or value.endswith((".yaml", ".yml", ".json")):
        return text
    allowed = text.split("; ", 1)[1] if "; " in text else "a name or a path to a file"
    return f"expected a name or a file's path, got {kind_of(value)} that is neither; {allowed}"


class DesignSpace:
    """A product of axes (hardware template and workload parameters)."""

    def __init__(self, spec: dict, where: str = "space"):
        if not isinstance(spec, dict) or not spec:
            raise DseError(f"{where}: expected a mapping of parameter names to values, lists or ranges")
        self.where = where
        self.axes = [make_axis(k, v, where) for k, v in spec.items()]
        if "hardware" not in spec:
            raise DseError(f"{where}: 'hardware' is required (a preset name or a list of presets as the base design)")
        if "model" not in spec:
            raise DseError(f"{where}: 'model' is required")
        self.spec = spec
        self._check_names()

    def _check_names(self) -> None:
        """Every named choice (preset, model, format, offload policy) must exist: checked
        before any work starts, the error naming the key and what is allowed."""
        classes = COMPUTE_CLASSES

        def cpu(name):
            if not device_class(load_device(name).device_class).hosts_layers:
                raise DseError(f"'{name}' is a {load_device(name).device_class} preset, not a cpu preset")
        check = {"hardware": check_design, "model": load_model, "weights": get_format, "activations": get_format,
                 "kv": get_format, "link": load_link, "host_tier": load_tier, "host_cpu": cpu, "offload": parse_policy}
        for a in self.axes:
            for i, v in enumerate(a.values):
                w = f"{self.where}.{a.name}" + (f"[{i}]" if len(a.values) > 1 else "")
                try:
                    if a.name in check:
                        check[a.name](v)
                    elif a.name == "native_formats":
                        bad = [f for f in str(v).split(",") if f.strip() not in classes]
                        if bad:
                            raise DseError(f"unknown compute format(s) {', '.join(bad)}; allowed: {', '.join(classes)}")
                except DseError as e:
                    raise DseError(f"{w}: {_named(e, v) if a.name in _LOADED else e}") from None

    @property
    def names(self) -> list[str]:
        return [a.name for a in self.axes]

    @property
    def grid_size(self) -> int:
        """Points of the full grid (DseError if a range has neither step nor count)."""
        for a in self.axes:
            if not a.values:
                raise DseError(f"{self.where}.{a.name}: a grid needs 'step' or 'count' on every range "
                               f"(or use method random, sobol or optuna)")
        return math.prod(len(a.values) for a in self.axes)

    def fingerprint(self) -> str:
        """A short hash of the space's definition (to recognise a run folder's study)."""
        return hashlib.sha256(json.dumps(self.spec, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def grid_chunk(self, start: int, stop: int) -> dict:
        """Columns of grid points ``start`` .. ``stop - 1`` (mixed-radix order, last axis
        fastest); a fixed parameter is a scalar, a choice of names a pandas Categorical."""
        flat = np.arange(start, stop, dtype=np.int64)
        cols = {}
        stride = 1
        for a in reversed(self.axes):
            n = len(a.values)
            cols[a.name] = a.values[0] if n == 1 else _take(a.values, (flat // stride) % n)
            stride *= n
        return {a.name: cols[a.name] for a in self.axes}

    def probe_chunk(self) -> dict:
        """Columns of the few points (as many as the longest list of names or switches) in which each
        listed value of every name or switch axis appears at least once, every other axis at its first
        value (a range at its low end): points of the space itself, evaluated before a study's run
        folder is written so a value only the evaluator checks (an engine, a declared choice, a pool's
        hardware, a length distribution) is refused before anything is on disk."""
        named = {a.name for a in self.axes if PARAMS[a.name] in (str, bool) and len(a.values) > 1}
        n = max((len(a.values) for a in self.axes if a.name in named), default=1)
        rows = np.arange(n)
        return {a.name: _take(a.values, rows % len(a.values)) if a.name in named
                else (a.values[0] if a.values else a.low) for a in self.axes}

    def sample_chunk(self, unit: np.ndarray) -> dict[str, np.ndarray]:
        """Columns of points from a [N, axes] array of numbers in [0, 1): ranges are
        drawn continuously (log ranges in log space; integers rounded), choices uniformly."""
        cols = {}
        for j, a in enumerate(self.axes):
            u = unit[:, j]
            if a.is_range:
                if a.log:
                    x = np.exp(np.log(a.low) + u * (np.log(a.high) - np.log(a.low)))
                else:
                    x = a.low + u * (a.high - a.low)
                if PARAMS[a.name] is int:
                    x = np.maximum(np.round(x), 1).astype(np.int64)
                cols[a.name] = x
            elif len(a.values) == 1:
                cols[a.name] = a.values[0]
            else:
                idx = np.minimum((u * len(a.values)).astype(np.int64), len(a.values) - 1)
                cols[a.name] = _take(a.values, idx)
        return cols


def _take(values: tuple, idx: np.ndarray):
    """values[idx]: a pandas Categorical for names (cheap to group and to store), else an array."""
    if any(isinstance(v, str) for v in values):
        import pandas as pd
        return pd.Categorical.from_codes(idx, categories=[str(v) for v in values])
    return np.array(values)[idx]


__all__ = ["DesignSpace", "Axis", "make_axis", "PARAMS", "HARDWARE_PARAMS", "WORKLOAD_PARAMS", "DEFAULTS"]
