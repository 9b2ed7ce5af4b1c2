"""The roofline cost kernel, vectorized over design points.

Arrays are shaped ``[points, operators]``; per-point quantities are ``[points]``
and per-operator quantities ``[operators]`` (or ``[points, operators]`` when the
workload varies with the point). For one operator instance on one point:

    time = max(ops / (peak[class] * eff.compute), bytes / (bandwidth * eff.memory))
           + collective time + eff.op_overhead_s

where a collective (ring all-reduce over ``tp`` devices) costs
2 (tp - 1) / tp * bytes / (link bandwidth * eff.collective) + 2 (tp - 1) * link latency.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dse.efficiency import Efficiency
from hwmodels.device import Device
from hwmodels.formats import COMPUTE_CLASSES

#: columns of SystemArrays.peak: every compute class, then 'vector', then 'none'
PEAK_COLUMNS = COMPUTE_CLASSES + ("vector", "none")
_COL = {c: i for i, c in enumerate(PEAK_COLUMNS)}


@dataclass(frozen=True)
class SystemArrays:
    """Hardware of ``P`` design points as arrays (SI units).

    peak: [P, len(PEAK_COLUMNS)] ops/s available to work asking for each class
          (already widened to what the device runs; inf for 'none', 0 if impossible).
    bandwidth, capacity: [P] device-memory bytes/s and bytes.
    link_bandwidth, link_latency: [P] scale-up link per direction (bytes/s) and latency (s).
    tp: [P] tensor-parallel degree.
    """

    peak: np.ndarray
    bandwidth: np.ndarray
    capacity: np.ndarray
    link_bandwidth: np.ndarray
    link_latency: np.ndarray
    tp: np.ndarray

    @property
    def size(self) -> int:
        return self.bandwidth.shape[0]

    @classmethod
    def from_devices(cls, devices: list[Device], tp) -> "SystemArrays":
        """Stack devices (and their tensor-parallel degrees) into arrays."""
        n = len(devices)
        peak = np.zeros((n, len(PEAK_COLUMNS)))
        for i, d in enumerate(devices):
            for c in COMPUTE_CLASSES:
                try:
                    peak[i, _COL[c]] = d.peak_for(c)
                except Exception:  # a class the device cannot run at all: leave 0
                    peak[i, _COL[c]] = 0.0
            peak[i, _COL["vector"]] = d.vector_ops_per_s
            peak[i, _COL["none"]] = np.inf
        link_bw = np.array([d.interconnect.bandwidth_bytes_per_s if d.interconnect else np.nan for d in devices])
        link_lat = np.array([d.interconnect.latency_s if d.interconnect else 0.0 for d in devices])
        return cls(peak, np.array([d.memory.bandwidth_bytes_per_s for d in devices]),
                   np.array([d.memory.capacity_bytes for d in devices]), link_bw, link_lat,
                   np.broadcast_to(np.asarray(tp, dtype=float), (n,)).copy())


@dataclass(frozen=True)
class OpArrays:
    """A step's operators as arrays, priced in bytes (shape [O] or [P, O])."""

    ops: np.ndarray
    memory_bytes: np.ndarray
    comm_bytes: np.ndarray
    peak_column: np.ndarray   # int index into PEAK_COLUMNS, [O]
    count: np.ndarray

    @classmethod
    def from_table(cls, table) -> "OpArrays":
        cols = np.array([_COL[c] for c in table.compute_classes], dtype=int)
        return cls(table.ops, table.memory_bytes, table.comm_bytes, cols, table.counts)


@dataclass(frozen=True)
class OpCost:
    """Per-instance times of each operator on each point, seconds, [P, O]."""

    compute_s: np.ndarray
    memory_s: np.ndarray
    collective_s: np.ndarray
    time_s: np.ndarray

    @property
    def bound(self) -> np.ndarray:
        """'compute', 'memory' or 'collective' per [P, O]."""
        out = np.where(self.compute_s > self.memory_s, "compute", "memory")
        return np.where((self.collective_s > 0) & (self.compute_s == 0) & (self.memory_s == 0), "collective", out)


def _rates(op: OpArrays, sys: SystemArrays, eff: Efficiency):
    peak = sys.peak[:, op.peak_column] * eff.compute                  # [P, O]
    bw = (sys.bandwidth * eff.memory)[:, None]                        # [P, 1]
    return peak, bw


def collective_time(comm_bytes, sys: SystemArrays, eff: Efficiency) -> np.ndarray:
    """Ring all-reduce time per instance, [P, O]: 2(N-1)/N * bytes / (link bw * eff) + 2(N-1) latency."""
    n = sys.tp[:, None]
    comm = np.broadcast_to(np.asarray(comm_bytes, dtype=float), (sys.size,) + np.shape(comm_bytes)[-1:])
    with np.errstate(invalid="ignore", divide="ignore"):
        t = 2 * (n - 1) / n * comm / (sys.link_bandwidth[:, None] * eff.collective) + 2 * (n - 1) * sys.link_latency[:, None]
    return np.where(comm > 0, t, 0.0)


def op_costs(op: OpArrays, sys: SystemArrays, eff: Efficiency) -> OpCost:
    """Per-instance cost of every operator on every design point."""
    peak, bw = _rates(op, sys, eff)
    with np.errstate(divide="ignore", invalid="ignore"):
        compute = np.where(op.ops > 0, op.ops / peak, 0.0)
    memory = op.memory_bytes / bw
    coll = collective_time(op.comm_bytes, sys, eff)
    work = (op.ops > 0) | (op.memory_bytes > 0) | (op.comm_bytes > 0)
    time = np.maximum(compute, memory) + coll + np.where(work, eff.op_overhead_s, 0.0)
    return OpCost(compute, memory, coll, time)


def step_time(op: OpArrays, sys: SystemArrays, eff: Efficiency) -> np.ndarray:
    """Time of one step on every point, seconds, [P]: Σ count × per-instance time + step overhead."""
    return (op_costs(op, sys, eff).time_s * op.count).sum(axis=-1) + eff.step_overhead_s


def _arith_sum(x0, xs, lo, hi):
    """Σ_{j=lo}^{hi-1} (x0 + xs j), elementwise; zero when hi <= lo."""
    n = np.maximum(hi - lo, 0)
    return n * x0 + xs * (lo + hi - 1) * n / 2.0


def decode_total_time(op0: OpArrays, slope: OpArrays, steps, sys: SystemArrays, eff: Efficiency) -> np.ndarray:
    """Exact total time of ``steps`` consecutive decode steps, seconds, [P].

    Step j (j = 0 .. steps-1) costs op0 + j * slope (every count of a decode step is
    affine in the context length). Per operator the sum of max(compute, memory)
    over j is split at the single crossing of two linear functions and summed in
    closed form, so the cost does not grow with the number of steps.
    """
    peak, bw = _rates(op0, sys, eff)
    n = np.asarray(steps, dtype=float)
    n = n[:, None] if n.ndim == 1 else n
    with np.errstate(divide="ignore", invalid="ignore"):
        c0 = np.where(op0.ops > 0, op0.ops / peak, 0.0)
        cs = np.where(slope.ops != 0, slope.ops / peak, 0.0)
    m0 = op0.memory_bytes / bw
    ms = slope.memory_bytes / bw
    d0, ds = c0 - m0, cs - ms
    with np.errstate(divide="ignore", invalid="ignore"):
        root = -d0 / ds
        up_lo = np.clip(np.ceil(root), 0, n)            # ds > 0: compute-bound from here on
        down_hi = np.clip(np.floor(root) + 1, 0, n)     # ds < 0: compute-bound up to here
    zero = np.zeros_like(d0)
    lo = np.where(ds > 0, up_lo, np.where(ds < 0, zero, np.where(d0 >= 0, zero, n)))
    hi = np.where(ds > 0, n + zero, np.where(ds < 0, down_hi, np.where(d0 >= 0, n + zero, n)))
    total = (_arith_sum(c0, cs, lo, hi) + _arith_sum(m0, ms, 0, lo) + _arith_sum(m0, ms, hi, n + zero))
    coll0 = collective_time(op0.comm_bytes, sys, eff)
    coll1 = collective_time(op0.comm_bytes + slope.comm_bytes, sys, eff)
    total = total + _arith_sum(coll0, coll1 - coll0, 0, n + zero)
    work = (op0.ops > 0) | (op0.memory_bytes > 0) | (op0.comm_bytes > 0)
    total = total + np.where(work, eff.op_overhead_s, 0.0) * n
    return (total * op0.count).sum(axis=-1) + eff.step_overhead_s * np.asarray(steps, dtype=float)
