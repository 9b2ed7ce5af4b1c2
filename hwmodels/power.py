"""Power of every preset while it serves, and how a power cap lowers its clocks.

``configs/power.yaml`` (package data, every number cited) holds the serving floor (a fraction of
the TDP, fitted on ML.ENERGY's A100/H100 runs), the share of a chip's power headroom its matrix
units and its memory spend at peak (from SC'25's two measured devices) and the DVFS relation.

A device draws ``floor + dynamic``: ``floor`` W whenever it serves (idle with a context, clocks
up, waiting on the engine, operand traffic the linear model leaves out), ``dynamic`` the linear
energy model of ``hwmodels.energy`` (J/op by format, J/bit moved). ``device_power`` gives each
preset its coefficients and says where they come from (``BASES``):

- ``measured``: the SC'25 profile of its chip (configs/technology.yaml energy.devices);
- ``tdp``: derived from its own TDP, peaks and bandwidth (``ops_fraction_of_headroom`` x (TDP -
  floor) / peak of a class; ``bits_fraction_of_headroom`` x (TDP - floor) / (8 x bandwidth));
- ``class``: no TDP is cited: the medians of the presets of its device class that have one.

A cap (``clock_fraction``): lowering the clock to a fraction f of its boost clock scales the
compute peaks by f and the energy of an operation by f^(exponent - 1) (dynamic power ~ f V^2, V ~
f: exponent 3), memory traffic unchanged. Units: W, J/op, J/bit, ops/s, bytes/s. This module
imports neither ``dse`` nor ``workloads``.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

import numpy as np

from basis.errors import DseError, cited_number
from basis.shipped import shipped
from basis.yamlfile import load_yaml
from hwmodels.energy import profile_coefficients
from hwmodels.formats import COMPUTE_CLASSES
from hwmodels.presets import available_hardware, load_device

#: the shipped power table (package data in a wheel)
POWER_FILE = shipped("configs", "power.yaml")
#: where a preset's power coefficients come from, most trusted first
BASES = ("measured", "tdp", "class")
_TOP = {"description", "sources", "serving_floor_fraction_of_tdp", "ops_fraction_of_headroom",
        "bits_fraction_of_headroom", "energy_error", "band_widening", "dvfs"}
_DVFS = {"power_exponent", "min_clock_fraction"}


@dataclass(frozen=True)
class PowerTable:
    """The parsed ``configs/power.yaml`` (see the module docstring); fractions are plain numbers."""

    path: str
    floor_fraction: float
    ops_fraction: float
    bits_fraction: float
    energy_error: float
    band_widening: float
    power_exponent: float
    min_clock_fraction: float
    sources: Mapping[str, str]


@dataclass(frozen=True)
class DevicePower:
    """A device's power coefficients: ``op_j`` J per op of each compute class (NaN for a class it
    has no peak in), ``vector_j`` J per vector op, ``floor_op_j`` as ``op_j`` with 0 for a class
    charged at another class's figure (the demand it cannot avoid), ``bit_j`` J per bit of
    device-memory traffic before off-HBM corrections, ``floor_w`` W while serving, ``basis`` one of
    ``BASES``."""

    op_j: Mapping[str, float]
    vector_j: float
    floor_op_j: Mapping[str, float]
    bit_j: float
    floor_w: float
    basis: str


def _fraction(node, where: str, upper: float | None = 1.0) -> float:
    v = cited_number(node, where)
    if upper is not None and v > upper:
        raise DseError(f"{where}: expected a fraction in (0, {upper}], got {v}")
    return v


def power_table_from_dict(d, path: str) -> PowerTable:
    """The PowerTable a parsed ``power.yaml`` describes; DseError naming ``path`` and the key."""
    if not isinstance(d, dict):
        raise DseError(f"{path}: expected a mapping at the top, got {type(d).__name__}")
    extra = set(d) - _TOP
    if extra:
        raise DseError(f"{path}: unknown key(s) {', '.join(sorted(map(str, extra)))}; allowed: {', '.join(sorted(_TOP))}")
    missing = [k for k in sorted(_TOP - {"description"}) if k not in d]
    if missing:
        raise DseError(f"{path}: missing required key '{missing[0]}'")
    dv = d["dvfs"]
    if not isinstance(dv, dict) or set(dv) != _DVFS:
        raise DseError(f"{path}: dvfs: expected exactly the keys {', '.join(sorted(_DVFS))}")
    sources = d["sources"]
    if not isinstance(sources, dict) or not all(isinstance(v, str) for v in sources.values()):
        raise DseError(f"{path}: sources: expected a mapping of short keys to citation texts")
    return PowerTable(
        path=path,
        floor_fraction=_fraction(d["serving_floor_fraction_of_tdp"], f"{path}: serving_floor_fraction_of_tdp"),
        ops_fraction=_fraction(d["ops_fraction_of_headroom"], f"{path}: ops_fraction_of_headroom", 2.0),
        bits_fraction=_fraction(d["bits_fraction_of_headroom"], f"{path}: bits_fraction_of_headroom", 2.0),
        energy_error=_fraction(d["energy_error"], f"{path}: energy_error"),
        band_widening=_fraction(d["band_widening"], f"{path}: band_widening", None),
        power_exponent=_fraction(dv["power_exponent"], f"{path}: dvfs.power_exponent", 4.0),
        min_clock_fraction=_fraction(dv["min_clock_fraction"], f"{path}: dvfs.min_clock_fraction"),
        sources=MappingProxyType({str(k): v for k, v in sources.items()}))


@lru_cache(maxsize=4)
def _load(path: str) -> PowerTable:
    return power_table_from_dict(load_yaml(path, "power table"), path)


def load_power(path: str | Path | None = None) -> PowerTable:
    """The power table at ``path`` (default: the shipped ``configs/power.yaml``), cached."""
    return _load(str(path if path is not None else POWER_FILE))


# ------------------------------------------------------------------------------ coefficients

def serving_floor_w(tdp_w, table: PowerTable | None = None):
    """Power a device draws while it serves beyond the work counted, W: the fitted fraction of its
    TDP (``serving_floor_fraction_of_tdp``); NaN where the TDP is unknown. Scalar or array."""
    t = table or load_power()
    out = t.floor_fraction * np.asarray(tdp_w, dtype=float)
    return out if out.ndim else float(out)


def tdp_coefficients(tdp_w: float, peaks: Mapping[str, float], vector_ops_per_s: float, bandwidth: float,
                     table: PowerTable | None = None) -> DevicePower:
    """DevicePower of a chip never measured, from its own TDP (W), dense peaks (ops/s by compute
    class), vector rate (ops/s) and device-memory bandwidth (bytes/s): at its peak in any class the
    matrix units draw ``ops_fraction`` of its headroom (TDP - floor), at full bandwidth its memory
    path ``bits_fraction`` of it (basis ``tdp``)."""
    t = table or load_power()
    floor = serving_floor_w(tdp_w, t)
    head = tdp_w - floor
    op = {c: (t.ops_fraction * head / peaks[c] if peaks.get(c, 0) > 0 else np.nan) for c in COMPUTE_CLASSES}
    vec = t.ops_fraction * head / vector_ops_per_s if vector_ops_per_s > 0 else np.nan
    bit = t.bits_fraction * head / (8.0 * bandwidth) if bandwidth > 0 else np.nan
    return DevicePower(MappingProxyType(op), vec, MappingProxyType(op), bit, floor, "tdp")


def device_power(device, table: PowerTable | None = None) -> DevicePower | None:
    """DevicePower of ``device`` (an ``hwmodels.device.Device``): its SC'25 profile where it has
    one (floor from its TDP, or its cited ``static_power_w``), else from its TDP; None where it
    has no TDP (the caller takes its class's, ``class_power``)."""
    t = table or load_power()
    tdp = device.tdp_w
    floor = device.static_power_w if device.static_power_w is not None else (
        serving_floor_w(tdp, t) if tdp is not None else np.nan)
    if device.energy_profile:
        ops, floor_ops, bit, _ = profile_coefficients(device.energy_profile)
        return DevicePower(MappingProxyType({c: ops[c] for c in COMPUTE_CLASSES}), ops["vector"],
                           MappingProxyType({c: floor_ops[c] for c in COMPUTE_CLASSES}), bit, floor, "measured")
    if tdp is None:
        return None
    own = tdp_coefficients(tdp, device.peak_ops_per_s, device.vector_ops_per_s,
                           device.memory.bandwidth_bytes_per_s, t)
    if device.static_power_w is None:
        return own
    return DevicePower(own.op_j, own.vector_j, own.floor_op_j, own.bit_j, floor, "tdp")


def class_power(members: list[DevicePower], everyone: list[DevicePower]) -> DevicePower:
    """DevicePower of a device without a TDP: the median floor, J/op (each compute class, over the
    members that have a peak in it) and J/bit of ``members`` (the presets of its device class that
    have a TDP), or of ``everyone`` for a figure none of its class has (basis ``class``)."""
    def med(get):        # the class's median; every preset's where none of the class has the figure
        for pool in (members, everyone):
            v = np.array([x for x in map(get, pool) if np.isfinite(x)], dtype=float)
            if len(v):
                return float(np.median(v))
        return np.nan
    op = MappingProxyType({c: med(lambda p, c=c: p.op_j[c]) for c in COMPUTE_CLASSES})
    return DevicePower(op, med(lambda p: p.vector_j), op, med(lambda p: p.bit_j), med(lambda p: p.floor_w), "class")


@lru_cache(maxsize=16)
def _class_power(device_class: str) -> DevicePower:
    """``class_power`` of ``device_class`` over the shipped presets."""
    devices = [load_device(n) for n in available_hardware()]
    known = [(d.device_class, p) for d in devices if (p := device_power(d)) is not None]
    return class_power([p for c, p in known if c == device_class], [p for _, p in known])


def power_of(device) -> DevicePower:
    """DevicePower of ``device``: ``device_power``, or its device class's (``class_power`` over
    the shipped presets) where it has no TDP."""
    own = device_power(device)
    if own is None:
        return _class_power(device.device_class)
    if np.isnan(own.floor_w):            # a measured profile, no TDP: its class's floor
        return DevicePower(own.op_j, own.vector_j, own.floor_op_j, own.bit_j,
                           _class_power(device.device_class).floor_w, "class")
    return own


def energy_band(basis: str, table: PowerTable | None = None) -> tuple[float, float]:
    """(low, high) factors on a predicted energy per token or power for a point whose power
    figures have ``basis`` (one of ``BASES``): 1 -/+ the measured p90 error (``energy_error``),
    widened by ``band_widening`` per step away from measured (low at least 0.1)."""
    t = table or load_power()
    if basis not in BASES:
        raise DseError(f"energy_band: basis '{basis}' is not one of {', '.join(BASES)}")
    e = t.energy_error * t.band_widening ** BASES.index(basis)
    return max(1.0 - e, 0.1), 1.0 + e


# ------------------------------------------------------------------------------------- fitting

def fit_floor_fraction(measured_j, dynamic_j, tdp_w, devices, tokens_per_s) -> float:
    """The serving-floor fraction of TDP that best fits measured energy per token (J, arrays [R])
    as ``fraction x TDP x devices / tokens_per_s + dynamic_j`` (the measured run's wall time, the
    modelled dynamic energy per token): least squares on the relative error, in closed form."""
    y, dyn = np.asarray(measured_j, dtype=float), np.asarray(dynamic_j, dtype=float)
    x = np.asarray(tdp_w, dtype=float) * np.asarray(devices, dtype=float) / np.asarray(tokens_per_s, dtype=float)
    w = 1.0 / y ** 2
    return float(np.sum(w * x * (y - dyn)) / np.sum(w * x * x))


# ---------------------------------------------------------------------------------------- DVFS

def clock_fraction(static_w, dynamic_w, cap_w, table: PowerTable | None = None):
    """Clock fraction f in [min_clock_fraction, 1] that brings a device drawing ``static_w`` +
    ``dynamic_w`` (W, arrays [P]) down to ``cap_w`` if all of its dynamic power followed the clock
    as f^exponent (``dvfs.power_exponent``): ((cap - static) / dynamic)^(1/exponent), 1 where it
    is under its cap or either is unknown; the least slowdown that can meet the cap (memory power,
    which does not follow the core clock, may leave it over: the caller prices again)."""
    t = table or load_power()
    s, d, cap = (np.asarray(x, dtype=float) for x in (static_w, dynamic_w, cap_w))
    with np.errstate(divide="ignore", invalid="ignore"):
        f = np.power(np.clip((cap - s) / d, 0.0, 1.0), 1.0 / t.power_exponent)
    f = np.where(np.isfinite(f) & (d > 0) & (s + d > cap), f, 1.0)
    return np.clip(f, t.min_clock_fraction, 1.0)


def op_energy_factor(f, table: PowerTable | None = None):
    """Factor on the energy of an operation at clock fraction ``f``: f^(exponent - 1) (V^2, V ~ f)."""
    t = table or load_power()
    return np.power(np.asarray(f, dtype=float), t.power_exponent - 1.0)
