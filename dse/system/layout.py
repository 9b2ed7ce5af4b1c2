"""Parallel layout of a design point: devices = tp x pp x ep, and the chip count of a
spatial (LPU-style) system sized from capacity.

- ``tp``, ``pp`` and ``devices`` left out (NaN) mean "not given". With ``devices`` alone
  all of them are tensor parallel (tp = devices / ep); with ``devices`` and one of
  ``tp``/``pp`` the other follows; all three given must agree; with none, tp = pp = 1.
- A spatial device with none of them given is one chip whose first memory tier holds
  its share of the model: the system needs ``ceil(footprint / capacity per chip)``
  chips; layers are pipelined over chips (``pp`` dividing the layer count) with tensor
  parallelism inside a stage (``tp`` dividing the heads), and the layout used is the
  smallest ``tp x pp`` whose per-chip share fits.
"""
from __future__ import annotations

import numpy as np

from dse.system.columns import pointwise
from workloads.model import ModelSpec


def parallel_layout(devices, tp, pp, ep) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tp, pp, valid) per point from the given ``devices``, ``tp``, ``pp`` (NaN: not given)
    and ``ep``; invalid points (devices that the others do not divide or match) get tp = pp = 1.
    Where each of them is one value for every point (``constant``), so are tp, pp and valid."""
    return pointwise(_layout, devices, tp, pp, ep)


def _layout(devices, tp, pp, ep) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``parallel_layout`` of arrays (or numbers) over points."""
    devices, tp, pp, ep = (np.asarray(x, dtype=float) for x in (devices, tp, pp, ep))
    has_d, has_t, has_p = ~np.isnan(devices), ~np.isnan(tp), ~np.isnan(pp)
    if not (has_d.any() or has_t.any() or has_p.any()):       # nothing given: one device each
        ones = np.ones(np.broadcast_shapes(devices.shape, tp.shape, pp.shape, ep.shape))
        return ones, ones.copy(), np.ones(ones.shape, dtype=bool)
    t = np.where(has_t, tp, 1.0)
    p = np.where(has_p, pp, 1.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        t = np.where(has_d & ~has_t, devices / (p * ep), t)                 # devices (and pp): tp follows
        p = np.where(has_d & has_t & ~has_p, devices / (t * ep), p)         # devices and tp: pp follows
    valid = ~has_d | ((t * p * ep == devices) & (t == np.round(t)) & (p == np.round(p)) & (t >= 1) & (p >= 1))
    return np.where(valid, t, 1.0), np.where(valid, p, 1.0), valid


def tensor_parallel_degrees(model: ModelSpec) -> list[int]:
    """Tensor-parallel degrees that divide the model's heads (and KV heads, and expert width)."""
    out = []
    for t in range(1, model.num_heads + 1):
        if model.num_heads % t:
            continue
        if model.num_kv_heads and not (model.num_kv_heads % t == 0 or t % model.num_kv_heads == 0):
            continue
        if model.is_moe and model.moe_intermediate_size % t:
            continue
        out.append(t)
    return out


def chip_layouts(model: ModelSpec) -> list[tuple[int, int]]:
    """Every (tp, pp) of a spatial system, smallest chip count first (ties: less tp)."""
    pps = [p for p in range(1, model.num_layers + 1) if model.num_layers % p == 0]
    return sorted(((t, p) for t in tensor_parallel_degrees(model) for p in pps), key=lambda tp: (tp[0] * tp[1], tp[0]))


def chips_required(footprint_one_chip, capacity) -> np.ndarray:
    """ceil(bytes of the whole model's footprint / capacity of one chip), at least 1."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.maximum(1.0, np.ceil(np.asarray(footprint_one_chip, float) / np.asarray(capacity, float)))


def largest_fitting(fits, limit: int = 1 << 20) -> np.ndarray:
    """The largest b in [1, limit] with ``fits(b)`` per point (0 where even 1 does not fit),
    by bisection on arrays; ``fits`` maps an array of candidates to a bool array and must
    be monotone (what fits at b fits below b)."""
    ok1 = np.asarray(fits(np.ones(1)), dtype=bool)
    lo = np.where(ok1, 1.0, 0.0)
    hi = np.where(ok1, float(limit + 1), 1.0)
    while np.any(hi - lo > 1):
        active = hi - lo > 1
        mid = np.where(active, np.floor((lo + hi) / 2), np.maximum(lo, 1.0))
        ok = np.asarray(fits(mid), dtype=bool)
        lo = np.where(active & ok, mid, lo)
        hi = np.where(active & ~ok, mid, hi)
    return lo
