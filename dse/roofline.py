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
from dse.errors import DseError
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
    host_bandwidth: [P] bytes/s to the next memory tier (host DRAM over its link).
    offload: [P, 3] fraction of weight, activation and KV bytes that live in that tier.
    overlap: [P] bool, host transfers overlap compute (max) instead of adding to it.
    """

    peak: np.ndarray
    bandwidth: np.ndarray
    capacity: np.ndarray
    link_bandwidth: np.ndarray
    link_latency: np.ndarray
    tp: np.ndarray
    host_bandwidth: np.ndarray | None = None
    offload: np.ndarray | None = None
    overlap: np.ndarray | None = None

    def __post_init__(self):
        n = self.bandwidth.shape[0]
        if self.host_bandwidth is None:
            object.__setattr__(self, "host_bandwidth", np.full(n, np.inf))
        if self.offload is None:
            object.__setattr__(self, "offload", np.zeros((n, 3)))
        if self.overlap is None:
            object.__setattr__(self, "overlap", np.ones(n, dtype=bool))

    @property
    def size(self) -> int:
        return self.bandwidth.shape[0]

    @classmethod
    def from_devices(cls, devices: list[Device], tp, offload=None, overlap=True) -> "SystemArrays":
        """Stack devices (their tensor-parallel degrees, and the [P, 3] fractions of weight,
        activation and KV bytes offloaded to the host tier) into arrays."""
        n = len(devices)
        peak = np.zeros((n, len(PEAK_COLUMNS)))
        for i, d in enumerate(devices):
            for c in COMPUTE_CLASSES:
                try:
                    peak[i, _COL[c]] = d.peak_for(c)
                except DseError:  # a class the device cannot run at all: leave 0
                    peak[i, _COL[c]] = 0.0
            peak[i, _COL["vector"]] = d.vector_ops_per_s
            peak[i, _COL["none"]] = np.inf
        link_bw = np.array([d.interconnect.bandwidth_bytes_per_s if d.interconnect else np.nan for d in devices])
        link_lat = np.array([d.interconnect.latency_s if d.interconnect else 0.0 for d in devices])
        host_bw = np.array([min(d.host_link.bandwidth_bytes_per_s if d.host_link else np.nan,
                                d.host_memory.bandwidth_bytes_per_s if d.host_memory else np.inf) for d in devices])
        off = np.zeros((n, 3)) if offload is None else np.broadcast_to(np.asarray(offload, float), (n, 3)).copy()
        return cls(peak, np.array([d.memory.bandwidth_bytes_per_s for d in devices]),
                   np.array([d.memory.capacity_bytes for d in devices]), link_bw, link_lat,
                   np.broadcast_to(np.asarray(tp, dtype=float), (n,)).copy(), host_bw, off,
                   np.broadcast_to(np.asarray(overlap, dtype=bool), (n,)).copy())


@dataclass(frozen=True)
class OpArrays:
    """A step's operators as arrays, priced in bytes (shape [O] or [P, O])."""

    ops: np.ndarray
    weight_bytes: np.ndarray
    act_bytes: np.ndarray
    kv_bytes: np.ndarray
    comm_bytes: np.ndarray    # ring all-reduce message
    p2p_bytes: np.ndarray     # point-to-point transfer (pipeline hop)
    peak_column: np.ndarray   # int index into PEAK_COLUMNS, [O]
    count: np.ndarray

    @property
    def memory_bytes(self) -> np.ndarray:
        return self.weight_bytes + self.act_bytes + self.kv_bytes

    @classmethod
    def from_table(cls, table) -> "OpArrays":
        cols = np.array([_COL[c] for c in table.compute_classes], dtype=int)
        return cls(table.ops, table.weight_bytes, table.act_bytes, table.kv_bytes, table.comm_bytes,
                   table.p2p_bytes, cols, table.counts)


@dataclass(frozen=True)
class OpCost:
    """Per-instance times of each operator on each point, seconds, [P, O]."""

    compute_s: np.ndarray
    memory_s: np.ndarray      # device-memory traffic
    offload_s: np.ndarray     # traffic to the host tier over its link
    collective_s: np.ndarray
    time_s: np.ndarray

    @property
    def bound(self) -> np.ndarray:
        """'compute', 'memory', 'offload' or 'collective' per [P, O]: the largest term."""
        terms = np.stack([self.compute_s, self.memory_s, self.offload_s, self.collective_s])
        names = np.array(["compute", "memory", "offload", "collective"])
        return names[np.argmax(terms, axis=0)]


def _memory_terms(op: OpArrays, sys: SystemArrays, eff: Efficiency):
    """(device-memory seconds, host-tier seconds) per instance, [P, O]."""
    f = sys.offload                                                   # [P, 3]
    bw = (sys.bandwidth * eff.memory)[:, None]
    host = (sys.host_bandwidth * eff.memory)[:, None]
    on_host = (op.weight_bytes * f[:, 0:1] + op.act_bytes * f[:, 1:2] + op.kv_bytes * f[:, 2:3])
    dev = (op.weight_bytes + op.act_bytes + op.kv_bytes) - on_host
    with np.errstate(invalid="ignore"):
        host_s = np.where(on_host > 0, on_host / host, 0.0)
    return dev / bw, host_s


def _compute_term(ops, op: OpArrays, sys: SystemArrays, eff: Efficiency):
    peak = sys.peak[:, op.peak_column] * eff.compute                  # [P, O]
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(ops != 0, ops / peak, 0.0)


def p2p_time(p2p_bytes, sys: SystemArrays, eff: Efficiency) -> np.ndarray:
    """Point-to-point transfer time per instance, [P, O]: bytes / (link bw * eff) + latency."""
    b = np.broadcast_to(np.asarray(p2p_bytes, dtype=float), (sys.size,) + np.shape(p2p_bytes)[-1:])
    with np.errstate(invalid="ignore"):
        t = b / (sys.link_bandwidth[:, None] * eff.collective) + sys.link_latency[:, None]
    return np.where(b > 0, t, 0.0)

def collective_time(comm_bytes, sys: SystemArrays, eff: Efficiency) -> np.ndarray:
    """Ring all-reduce time per instance, [P, O]: 2(N-1)/N * bytes / (link bw * eff) + 2(N-1) latency."""
    n = sys.tp[:, None]
    comm = np.broadcast_to(np.asarray(comm_bytes, dtype=float), (sys.size,) + np.shape(comm_bytes)[-1:])
    with np.errstate(invalid="ignore", divide="ignore"):
        t = 2 * (n - 1) / n * comm / (sys.link_bandwidth[:, None] * eff.collective) + 2 * (n - 1) * sys.link_latency[:, None]
    return np.where(comm > 0, t, 0.0)


def _work(op: OpArrays):
    return (op.ops > 0) | (op.memory_bytes > 0) | (op.comm_bytes > 0) | (op.p2p_bytes > 0)


def op_costs(op: OpArrays, sys: SystemArrays, eff: Efficiency) -> OpCost:
    """Per-instance cost of every operator on every design point.

    Host-tier traffic overlaps compute (inside the max, summed with device traffic)
    where ``sys.overlap``, else adds to the operator's time."""
    compute = _compute_term(op.ops, op, sys, eff)
    dev, host = _memory_terms(op, sys, eff)
    ov = sys.overlap[:, None]
    coll = collective_time(op.comm_bytes, sys, eff) + p2p_time(op.p2p_bytes, sys, eff)
    time = (np.maximum(compute, dev + np.where(ov, host, 0.0)) + np.where(ov, 0.0, host) + coll
            + np.where(_work(op), eff.op_overhead_s, 0.0))
    return OpCost(compute, dev, host, coll, time)


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
    n = np.asarray(steps, dtype=float)
    n = n[:, None] if n.ndim == 1 else n
    c0, cs = _compute_term(op0.ops, op0, sys, eff), _compute_term(slope.ops, op0, sys, eff)
    dev0, host0 = _memory_terms(op0, sys, eff)
    devs, hosts = _memory_terms(slope, sys, eff)
    ov = sys.overlap[:, None]
    m0, ms = dev0 + np.where(ov, host0, 0.0), devs + np.where(ov, hosts, 0.0)   # inside the max
    a0, as_ = np.where(ov, 0.0, host0), np.where(ov, 0.0, hosts)               # added to it
    d0, ds = c0 - m0, cs - ms
    with np.errstate(divide="ignore", invalid="ignore"):
        root = -d0 / ds
        up_lo = np.clip(np.ceil(root), 0, n)            # ds > 0: compute-bound from here on
        down_hi = np.clip(np.floor(root) + 1, 0, n)     # ds < 0: compute-bound up to here
    zero = np.zeros_like(d0)
    lo = np.where(ds > 0, up_lo, np.where(ds < 0, zero, np.where(d0 >= 0, zero, n)))
    hi = np.where(ds > 0, n + zero, np.where(ds < 0, down_hi, np.where(d0 >= 0, n + zero, n)))
    total = (_arith_sum(c0, cs, lo, hi) + _arith_sum(m0, ms, 0, lo) + _arith_sum(m0, ms, hi, n + zero)
             + _arith_sum(a0, as_, 0, n + zero))
    coll0 = collective_time(op0.comm_bytes, sys, eff) + p2p_time(op0.p2p_bytes, sys, eff)
    total = total + coll0 * n   # collective and hop traffic do not grow with the context
    total = total + np.where(_work(op0), eff.op_overhead_s, 0.0) * n
    return (total * op0.count).sum(axis=-1) + eff.step_overhead_s * np.asarray(steps, dtype=float)
