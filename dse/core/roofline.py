"""The roofline cost kernel, vectorized over design points.

Arrays are shaped ``[points, operators]``; per-point quantities are ``[points]``
and per-operator quantities ``[operators]`` (or ``[points, operators]`` when the
workload varies with the point). For one operator instance on one point:

    time = max(ops / (peak[class] * eff.compute_fraction), bytes / (bandwidth * eff.memory_fraction))
           + collective time + eff.op_overhead_s

where a collective (ring all-reduce over ``tp`` devices) costs
2 (tp - 1) / tp * bytes / (link bandwidth * eff.collective) + 2 (tp - 1) * link latency
+ eff.collective_latency_s, and a point-to-point transfer (pipeline hop, expert
all-to-all) bytes / (link bandwidth * eff.collective) + link latency + eff.collective_latency_s.

Optional terms, skipped when a design space does not use them (``None``):
- offload: fractions of weight, activation and KV bytes in the host tier, read over
  the host link; overlapping compute (inside the max) or not (added).
- sparse: 2:4 structured-sparse peaks for weight matmuls.
- PIM: an operator whose role the PIM may run (and whose format it computes) is
  priced both ways: on the host, and in memory (PIM peak, weight and KV bytes at the
  internal bandwidth, multiple x external, activations over the external bus; every
  other term as on the host). ``dispatch`` places it (the one placement rule): a
  blocked host adds PIM time to the step, so each operator runs where it finishes
  sooner, which is the best placement; a concurrent one overlaps it (step =
  max(host work, PIM work)), so the placement is the one with the smallest step.
  Either way the step is a minimum over a fixed set of placements of times that each
  fall as any peak or bandwidth rises, so more bandwidth, compute, PIM peak or PIM
  multiple never slows a design.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import cached_property, lru_cache

import numpy as np

from dse.core.efficiency import IDEAL, Efficiency
from hwmodels.formats import COMPUTE_CLASSES

#: columns of SystemArrays.peak: every compute class, then 'vector', then 'none'
PEAK_COLUMNS = COMPUTE_CLASSES + ("vector", "none")
_COL = {c: i for i, c in enumerate(PEAK_COLUMNS)}


#: roles of operators a PIM may run, in the column order of SystemArrays.pim_roles
PIM_ROLES = ("attention", "gemv", "experts")


def _full(n, value, dtype=float):
    return np.broadcast_to(np.asarray(value, dtype=dtype), (n,)).copy()


@dataclass(frozen=True)
class SystemArrays:
    """Hardware of ``P`` design points as arrays (SI units).

    peak: [P, len(PEAK_COLUMNS)] ops/s available to work asking for each class
          (already widened to what the device runs; inf for 'none', 0 if impossible).
    bandwidth, capacity: [P] device-memory bytes/s and bytes.
    link_bandwidth, link_latency: [P] scale-up link per direction (bytes/s) and latency (s).
    tp: [P] tensor-parallel degree.
    host_bandwidth: [P] bytes/s to the next memory tier (host DRAM over its link).
    offload: [P, 3] fraction of weight, activation and KV bytes that live in that tier
             (None: nothing offloaded).
    overlap: [P] bool, host transfers overlap compute (max) instead of adding to it.
    sparse_gain: [P, len(PEAK_COLUMNS)] factor on the peak of weight matmuls (2:4
             sparsity; None: dense).
    pim_peak: [P, len(PEAK_COLUMNS)] ops/s of the PIM units (None: no PIM).
    pim_multiple: [P] PIM internal bandwidth / external bandwidth.
    pim_roles: [P, len(PIM_ROLES)] bool, roles the PIM may run.
    pim_concurrent: [P] bool, the host computes while the PIM runs.
    energy_op_j: [P, len(PEAK_COLUMNS)] J per op of work asking for each column, at the class it
             runs in (None: energy not modelled; NaN where the device has no measured profile).
    energy_bit_j: [P] J per bit of device-memory traffic, every on-chip level it crosses included.
    energy_op_floor_j: as energy_op_j, 0 for work whose class has no measured J/op of its own
             (charged in energy_op_j at a wider class's): what that work costs at least.
    static_w: [P] static (idle) power of one device, W (NaN where unknown).
    tdp_w: [P] power limit (TDP) of one device, W (NaN where unknown).
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
    sparse_gain: np.ndarray | None = None
    pim_peak: np.ndarray | None = None
    pim_multiple: np.ndarray | None = None
    pim_roles: np.ndarray | None = None
    pim_concurrent: np.ndarray | None = None
    energy_op_j: np.ndarray | None = None
    energy_bit_j: np.ndarray | None = None
    energy_op_floor_j: np.ndarray | None = None
    static_w: np.ndarray | None = None
    tdp_w: np.ndarray | None = None

    def __post_init__(self):
        n = self.bandwidth.shape[0]
        if self.host_bandwidth is None:
            object.__setattr__(self, "host_bandwidth", np.full(n, np.inf))
        if self.overlap is None:
            object.__setattr__(self, "overlap", np.ones(n, dtype=bool))
        if self.pim_peak is not None:
            for k, v in (("pim_multiple", 1.0), ("pim_concurrent", False)):
                if getattr(self, k) is None:
                    object.__setattr__(self, k, _full(n, v, type(v)))
            if self.pim_roles is None:
                object.__setattr__(self, "pim_roles", np.ones((n, len(PIM_ROLES)), dtype=bool))

    @property
    def size(self) -> int:
        return self.bandwidth.shape[0]

    def take(self, index) -> "SystemArrays":
        """The design points selected by ``index`` (a slice, mask or index array)."""
        def pick(v):
            if v is None:
                return None
            if v.ndim == 2 and v.flags.f_contiguous and not isinstance(index, slice):
                return v.T[:, index].T        # column-major: gather along each contiguous column
            return v[index]
        return self._copy({f: pick(v) for f, v in self.__dict__.items()})

    def replaced(self, **changes) -> "SystemArrays":
        """These points with the fields ``changes`` in place of theirs (``dataclasses.replace``
        without re-running ``__post_init__``: every field is already filled in, and a value given
        is one of the field's own shape; the kernel makes such a copy per group it prices)."""
        unknown = changes.keys() - self.__dict__.keys()
        if unknown:
            raise TypeError(f"SystemArrays has no field {sorted(unknown)[0]!r}")
        return self._copy({**self.__dict__, **changes})

    @classmethod
    def _copy(cls, values: dict) -> "SystemArrays":
        """A SystemArrays of the filled-in field ``values`` (every field, as ``__post_init__`` leaves them)."""
        new = object.__new__(cls)
        new.__dict__.update(values)
        return new


@dataclass(frozen=True, eq=False)
class OpArrays:
    """A step's operators as arrays, priced in bytes (shape [O] or [P, O]). Compared and hashed
    by identity: the kernel keeps what it derives from one workload's arrays (``KEPT``).

    sparse_ok: [O] bool, weight matmuls that 2:4 sparse peaks apply to.
    role: [O] int, index into PIM_ROLES (-1: the host runs it).
    vector_ops: ops an operator runs on the vector units besides its own (a weight-only quantized
        matmul dequantizing its weights), added to its compute time at the vector peak; None: none.
    """

    ops: np.ndarray
    weight_bytes: np.ndarray
    act_bytes: np.ndarray
    kv_bytes: np.ndarray
    comm_bytes: np.ndarray    # ring all-reduce message
    p2p_bytes: np.ndarray     # point-to-point transfer (pipeline hop, expert all-to-all)
    peak_column: np.ndarray   # int index into PEAK_COLUMNS, [O]
    count: np.ndarray
    sparse_ok: np.ndarray | None = None
    role: np.ndarray | None = None
    vector_ops: np.ndarray | None = None

    @cached_property
    def one_workload(self) -> bool:
        """True when these are one workload's operators (1-D arrays): the kernel keeps what it
        derives from them (``KEPT``)."""
        return all(np.ndim(a) == 1 for a in (self.ops, self.weight_bytes, self.act_bytes, self.kv_bytes))

    @cached_property
    def links(self) -> tuple[bool, bool]:
        """(whether any operator all-reduces, whether any sends point to point): a step with
        neither has no link terms. Worked out once per OpArrays."""
        return bool(np.any(self.comm_bytes > 0)), bool(np.any(self.p2p_bytes > 0))

    @cached_property
    def link_totals(self) -> tuple[float, float, float, float]:
        """(Σ count x all-reduce bytes, Σ count of the operators that all-reduce, the same two of
        point-to-point sends) of one workload's operators (1-D arrays), worked out once."""
        return tuple(float(x) for x in _row_link_totals(self))

    @cached_property
    def memory_bytes(self) -> np.ndarray:
        """Bytes moved to and from device memory per instance (weights + activations + KV),
        summed once per OpArrays."""
        return self.weight_bytes + self.act_bytes + self.kv_bytes

    def times(self, k: float) -> "OpArrays":
        """These operators with ``k`` times the work and traffic of each (a slope over k steps)."""
        scaled = replace(self, **{f: getattr(self, f) * k for f in ("ops", "weight_bytes", "act_bytes", "kv_bytes",
                                                                      "comm_bytes", "p2p_bytes")})
        return scaled if self.vector_ops is None else replace(scaled, vector_ops=self.vector_ops * k)

    @classmethod
    def from_table(cls, table) -> "OpArrays":
        cols = np.array([_COL[c] for c in table.compute_classes], dtype=int)
        roles = table.roles
        dequant = table.column("dequant")
        return cls(table.ops, table.weight_bytes, table.act_bytes, table.kv_bytes, table.comm_bytes,
                   table.p2p_bytes, cols, table.counts,
                   np.array([op.kind == "matmul" for op in table.operators], dtype=bool),
                   np.array([PIM_ROLES.index(r) if r in PIM_ROLES else -1 for r in roles], dtype=int),
                   dequant if np.any(dequant) else None)


@dataclass(frozen=True, eq=False)
class Stacked:
    """The operators of several workloads ([U, O] arrays of ``op``, one row per workload), each
    point priced with its own workload's row (``rows``, [P]): what depends on a workload alone
    (its intensity-sorted sums, its work per compute class) is worked out once per row, not once
    per point, and each point reads its row's."""

    op: OpArrays
    rows: np.ndarray

    def expanded(self) -> OpArrays:
        """Each point's operators ([P, O] arrays: its workload's row)."""
        return OpArrays(**{f.name: (v[self.rows] if np.ndim(v := getattr(self.op, f.name)) == 2 else v)
                           for f in fields(OpArrays)})

    def subset(self, sel) -> "Stacked":
        """The operators selected by the [O] mask ``sel``, for the same points."""
        return Stacked(_subset(self.op, sel), self.rows)


def _stackable(op, sys: SystemArrays) -> bool:
    """True when ``op`` is ``Stacked`` and the points' costs split into per-workload constants
    and per-point rates (``_separable``'s conditions but one workload per point's row)."""
    return (isinstance(op, Stacked) and sys.offload is None and sys.pim_peak is None and sys.sparse_gain is None
            and op.op.vector_ops is None)


def _per_point(op):
    """``op`` as operator arrays of its points' own (``Stacked`` expanded; OpArrays as they are)."""
    return op.expanded() if isinstance(op, Stacked) else op


@dataclass(frozen=True)
class OpCost:
    """Per-instance times of each operator on each point, seconds, [P, O]."""

    compute_s: np.ndarray
    memory_s: np.ndarray      # device-memory traffic
    offload_s: np.ndarray     # traffic to the host tier over its link
    collective_s: np.ndarray
    time_s: np.ndarray
    on_pim: np.ndarray | None = None   # [P, O] bool: the operator runs in memory

    @property
    def bound(self) -> np.ndarray:
        """'compute', 'memory', 'offload' or 'collective' per [P, O]: the largest term."""
        terms = np.stack(np.broadcast_arrays(self.compute_s, self.memory_s, self.offload_s, self.collective_s))
        names = np.array(["compute", "memory", "offload", "collective"])
        return names[np.argmax(terms, axis=0)]


def pim_eligible(op: OpArrays, sys: SystemArrays) -> np.ndarray | None:
    """[P, O] bool: operators the PIM can run (a role it may run, in a format it computes);
    None without PIM. Depends on the design's kind, never on its figures."""
    if sys.pim_peak is None or op.role is None:
        return None
    role_ok = (op.role >= 0) & sys.pim_roles[:, np.maximum(op.role, 0)]
    return role_ok & (sys.pim_peak[:, op.peak_column] > 0)


#: a concurrent PIM's placement is searched exactly over every subset of up to this many
#: operators; with more eligible operators they are grouped into this many blocks (see ``dispatch``)
EXACT_PIM_OPERATORS = 8
#: design points x placements priced at once by the concurrent search
_SEARCH_CHUNK = 1 << 22


def dispatch(host_s, pim_s, eligible, concurrent) -> np.ndarray:
    """[P, O] bool: the operators the PIM runs (the one placement rule).

    ``host_s``, ``pim_s``: [P, O] seconds each operator takes (all its instances: one step,
    or a whole generation) on the host and on the PIM; ``eligible``: [P, O] operators the
    PIM can run; ``concurrent``: [P] the host computes while the PIM runs.

    Blocked host (step = host work + PIM work): each operator goes where it finishes
    sooner (ties stay on the host); that is the best placement, and the step,
    Σ min(host, PIM), falls whenever either time falls.

    Concurrent host (step = max(host work, PIM work)): "where it finishes sooner" is not
    enough; moving an operator to the side that became faster for it can lengthen
    the step when that side is the busier one, so more bandwidth could slow a design.
    The placement is the one with the smallest step among every subset of the operators
    the point's PIM can run; past ``EXACT_PIM_OPERATORS`` such operators, among every
    subset of that many blocks of them (consecutive in table order), which is not always
    the best. Either set of placements is fixed by the workload and the design's kind, not
    by its figures, so the smallest step over it cannot rise when a peak or a bandwidth
    does."""
    host_s, pim_s = np.broadcast_arrays(np.asarray(host_s, dtype=float), np.asarray(pim_s, dtype=float))
    eligible = np.broadcast_to(eligible, host_s.shape)
    with np.errstate(invalid="ignore"):
        on_pim = eligible & (pim_s < host_s)
    conc = np.flatnonzero(concurrent)
    if conc.size == 0:
        return on_pim
    on_pim[conc] = False
    ec = eligible[conc]
    if np.array_equal(ec, np.broadcast_to(ec[:1], ec.shape)):     # one kind of PIM (the usual case)
        groups = [(conc, ec[0])]
    else:                                                           # each kind of PIM on its own
        kinds, which = np.unique(np.packbits(ec, axis=1), axis=0, return_inverse=True)
        which = which.ravel()
        groups = [(conc[which == g], ec[np.argmax(which == g)]) for g in range(len(kinds))]
    for points, kind in groups:
        _search(host_s, pim_s, points, np.flatnonzero(kind), on_pim)
    return on_pim


def _search(host_s, pim_s, points, cols, on_pim) -> None:
    """Concurrent placement (``dispatch``) of the points ``points``, all of which may run the
    operators ``cols`` on the PIM, into ``on_pim`` (in place)."""
    if cols.size == 0:
        return
    nb = min(cols.size, EXACT_PIM_OPERATORS)
    starts = (np.arange(nb) * cols.size) // nb                       # blocks of consecutive operators
    block = np.repeat(np.arange(nb), np.diff(np.append(starts, cols.size)))
    subsets = ((np.arange(1 << nb)[None, :] >> np.arange(nb)[:, None]) & 1).astype(bool)   # [nb, S]; 0: none
    rest_cols = np.setdiff1d(np.arange(host_s.shape[1]), cols)
    step = max(1, _SEARCH_CHUNK >> nb)
    for lo in range(0, points.size, step):                           # chunks of points bound the memory
        idx = points[lo:lo + step]
        if idx.size == host_s.shape[0]:
            idx = slice(None)                                        # every point: views, no copies
        h = host_s[idx]
        rest = h[:, rest_cols].sum(axis=1)                           # work that stays on the host
        hb = np.add.reduceat(h[:, cols], starts, axis=1)             # [n, nb]
        pb = np.add.reduceat(pim_s[idx][:, cols], starts, axis=1)
        host_work = _subset_sums(hb, ~subsets, rest)
        pim_work = _subset_sums(pb, subsets, 0.0)
        with np.errstate(invalid="ignore"):
            total = np.fmax(host_work, pim_work)
        best = np.argmin(np.where(np.isnan(total), np.inf, total), axis=1)
        rows = np.arange(host_s.shape[0])[idx]
        on_pim[rows[:, None], cols[None, :]] = subsets[:, best].T[:, block]


def _subset_sums(blocks, member, base) -> np.ndarray:
    """[n, S]: base + Σ of ``blocks`` [n, nb] over the members [nb, S] of each subset,
    infinite where a member is (a matrix product would turn inf x 0 into NaN)."""
    finite = np.isfinite(blocks)
    m = member.astype(float)
    total = np.where(finite, blocks, 0.0) @ m + np.asarray(base, dtype=float)[..., None]
    return np.where((~finite).astype(float) @ m > 0, np.inf, total)


def pim_mask(op: OpArrays, sys: SystemArrays, eff: Efficiency | None = None) -> np.ndarray | None:
    """[P, O] bool: the operators the PIM runs in one step under ``eff`` (ideal when None);
    None without PIM (``dispatch``)."""
    return op_costs(op, sys, IDEAL if eff is None else eff).on_pim


#: workloads whose operator terms the kernel keeps (per Efficiency): what depends on one
#: workload's operators alone (efficiency fractions, the intensity-sorted sums of
#: ``_ridge_tables``, the split of a decode into operators that grow with the context and
#: those that do not, a step's work per compute class for its energy) is derived once, not
#: again for every chunk, call or trial that prices it. Operators of many workloads at once
#: ([P, O] arrays) are large and priced once: nothing of them is kept
KEPT = 4096


def forget_kept() -> None:
    """Drop every kept workload term (``KEPT``): the memory they hold; results do not change."""
    for kept in (_kept_fractions, _separable_terms, _kept_decode_split, _kept_energy_work, _recent_energy_work,
                 _stacked_terms, _recent_decode_split):
        kept.cache_clear()


def _compute_fraction(op: OpArrays, eff: Efficiency) -> np.ndarray:
    """``eff.compute_fraction(op)``, kept for one workload's operators (read-only then)."""
    return _kept_fractions(op, eff)[0] if op.one_workload else eff.compute_fraction(op)


def _memory_fraction(op: OpArrays, eff: Efficiency) -> np.ndarray:
    """``eff.memory_fraction(op)``, kept for one workload's operators (read-only then)."""
    return _kept_fractions(op, eff)[1] if op.one_workload else eff.memory_fraction(op)


@lru_cache(maxsize=KEPT)
def _kept_fractions(op: OpArrays, eff: Efficiency) -> tuple:
    """(compute, memory) fractions of one workload's operators under ``eff``, read-only, kept."""
    out = (eff.compute_fraction(op), eff.memory_fraction(op))
    for a in out:
        a.flags.writeable = False
    return out


def _memory_terms(shape: OpArrays, sys: SystemArrays, eff: Efficiency, on_pim, *steps: OpArrays) -> list:
    """(device-memory seconds, host-tier seconds) per instance, [P, O], of the bytes of each of
    ``steps`` (host: scalar 0 when nothing is offloaded), on the operators of ``shape``: their
    achieved bandwidth fractions, worked out once for all of them. On PIM, weight and KV bytes
    stream at the internal bandwidth."""
    frac = _memory_fraction(shape, eff)
    bw = sys.bandwidth[:, None] * frac
    out = []
    for op in steps:
        w, a, kv = op.weight_bytes, op.act_bytes, op.kv_bytes
        host_s = 0.0
        if sys.offload is not None:
            f = sys.offload
            on_host = w * f[:, 0:1] + a * f[:, 1:2] + kv * f[:, 2:3]
            w, a, kv = w * (1 - f[:, 0:1]), a * (1 - f[:, 1:2]), kv * (1 - f[:, 2:3])
            with np.errstate(invalid="ignore"):
                host_s = np.where(on_host > 0, on_host / (sys.host_bandwidth[:, None] * frac), 0.0)
        if on_pim is None:
            out.append(((w + a + kv) / bw, host_s))
        else:
            inner = np.where(on_pim, sys.pim_multiple[:, None], 1.0)
            out.append((((w + kv) / inner + a) / bw, host_s))
    return out


def _compute_terms(op: OpArrays, sys: SystemArrays, eff: Efficiency, on_pim, *work) -> list:
    """Compute seconds per instance, [P, O], of each (ops, vector ops or None) of ``work`` on the
    operators of ``op``: the ops at each operator's peak and achieved fraction (worked out once
    for all of them), plus the vector ops (dequantization) at the vector peak and its fraction."""
    peak = sys.peak[:, op.peak_column]                               # [P, O]
    if sys.sparse_gain is not None and op.sparse_ok is not None:
        peak = peak * np.where(op.sparse_ok, sys.sparse_gain[:, op.peak_column], 1.0)
    if on_pim is not None:
        peak = np.where(on_pim, sys.pim_peak[:, op.peak_column], peak)
    out = []
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = peak * _compute_fraction(op, eff)
        vector_rate = None if all(vector is None for _, vector in work) else \
            sys.peak[:, _COL["vector"]][:, None] * eff.resolved("vector_compute")
        for ops, vector in work:
            t = np.where(ops != 0, ops / rate, 0.0)
            if vector is not None:
                t = t + np.where(vector != 0, vector / vector_rate, 0.0)
            out.append(t)
    return out


def _latency(sys: SystemArrays, eff: Efficiency) -> np.ndarray:
    """Seconds of latency of one point-to-point message, [P]: the link's plus the software's."""
    return sys.link_latency + eff.collective_latency_s


def _ring_latency(n, sys: SystemArrays, eff: Efficiency):
    """Seconds of latency of one ring all-reduce over ``n`` devices: 2(n - 1) link latencies
    plus one software latency per collective (a launch, as one-shot all-reduce kernels pay)."""
    return 2 * (n - 1) * sys.link_latency + np.where(n > 1, eff.collective_latency_s, 0.0)


def transfer_time(nbytes, bandwidth, latency, eff: Efficiency):
    """Seconds of one point-to-point message of ``nbytes`` over a link of ``bandwidth``
    bytes/s and ``latency`` s: bytes / (bandwidth x eff.collective) + latency +
    eff.collective_latency_s (0 for an empty message). Broadcasts."""
    b = np.asarray(nbytes, dtype=float)
    with np.errstate(invalid="ignore"):
        t = b / (np.asarray(bandwidth, dtype=float) * eff.collective) + np.asarray(latency) + eff.collective_latency_s
    return np.where(b > 0, t, 0.0)


def p2p_time(p2p_bytes, sys: SystemArrays, eff: Efficiency) -> np.ndarray:
    """Point-to-point transfer time per instance over the scale-up link, [P, O] (``transfer_time``)."""
    return transfer_time(p2p_bytes, sys.link_bandwidth[:, None], sys.link_latency[:, None], eff)


def collective_time(comm_bytes, sys: SystemArrays, eff: Efficiency) -> np.ndarray:
    """Ring all-reduce time per instance, [P, O]: 2(N-1)/N * bytes / (link bw * eff) + 2(N-1) latency."""
    n = sys.tp[:, None]
    comm = np.asarray(comm_bytes, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        t = (2 * (n - 1) / n * comm / (sys.link_bandwidth[:, None] * eff.collective)
             + _ring_latency(sys.tp, sys, eff)[:, None])
    return np.where(comm > 0, t, 0.0)


def _link_time(op: OpArrays, sys: SystemArrays, eff: Efficiency):
    """Collective plus point-to-point time per instance, [P, O] (scalar 0 if the step has none)."""
    t = 0.0
    comm, p2p = op.links
    if comm:
        t = t + collective_time(op.comm_bytes, sys, eff)
    if p2p:
        t = t + p2p_time(op.p2p_bytes, sys, eff)
    return t


def _work(op: OpArrays):
    return (op.ops > 0) | (op.memory_bytes > 0) | (op.comm_bytes > 0) | (op.p2p_bytes > 0)


def _combine(compute, dev, host, sys: SystemArrays):
    """max(compute, memory) with host-tier traffic inside the max (overlap) or added."""
    if np.ndim(host) == 0:
        return np.maximum(compute, dev)
    ov = sys.overlap[:, None]
    return np.maximum(compute, dev + np.where(ov, host, 0.0)) + np.where(ov, 0.0, host)


def _priced(op: OpArrays, sys: SystemArrays, eff: Efficiency, on_pim=None):
    """(compute, device memory, host tier, collective, time) per instance, [P, O], with the
    operators of ``on_pim`` in memory (None: all on the host)."""
    compute, = _compute_terms(op, sys, eff, on_pim, (op.ops, op.vector_ops))
    (dev, host), = _memory_terms(op, sys, eff, on_pim, op)
    coll = _link_time(op, sys, eff)
    time = _combine(compute, dev, host, sys) + coll + np.where(_work(op), eff.op_overhead_s, 0.0)
    return compute, dev, host, coll, time


def op_costs(op: OpArrays, sys: SystemArrays, eff: Efficiency) -> OpCost:
    """Per-instance cost of every operator on every design point, where ``dispatch`` places it.

    Host-tier traffic overlaps compute (inside the max, summed with device traffic)
    where ``sys.overlap``, else adds to the operator's time."""
    terms = _priced(op, sys, eff)
    zeros = np.zeros_like(terms[-1])
    terms = [t + zeros for t in terms]
    eligible = pim_eligible(op, sys)
    on_pim = None
    if eligible is not None:
        sel = np.flatnonzero(eligible.any(axis=0))        # price in memory only what the PIM can run
        on_pim = np.zeros(zeros.shape, dtype=bool)
        if sel.size:
            pim = _priced(_subset(op, sel), sys, eff, eligible[:, sel])
            time = terms[-1].copy()
            time[:, sel] = pim[-1]
            on_pim = dispatch(terms[-1] * op.count, time * op.count, eligible, sys.pim_concurrent)
            for t, b in zip(terms, pim):
                t[:, sel] = np.where(on_pim[:, sel], b, t[:, sel])
    compute, dev, host, coll, time = terms
    return OpCost(compute, dev, host, coll, time, on_pim)


def _step_sum(per_op, count, on_pim, sys: SystemArrays) -> np.ndarray:
    """Σ count x per-operator time, [P]; with PIM, host and PIM work add (blocked host)
    or overlap (concurrent: the larger of the two)."""
    total = per_op * count
    if on_pim is None:
        return total.sum(axis=-1)
    pim = np.where(on_pim, total, 0.0).sum(axis=-1)
    host = np.where(on_pim, 0.0, total).sum(axis=-1)
    return np.where(sys.pim_concurrent, np.maximum(host, pim), host + pim)


def _separable(op: OpArrays, sys: SystemArrays) -> bool:
    """True when a step's cost splits into per-operator constants and per-point rates:
    one workload for all points (1-D operator arrays), no offload, PIM, sparsity or dequantization."""
    return (sys.offload is None and sys.pim_peak is None and sys.sparse_gain is None and op.vector_ops is None
            and np.ndim(op.ops) == 1 and np.ndim(op.weight_bytes) == 1)


def _ridge_tables(ops, mem, count, column) -> tuple:
    """What ``_roofline_sum`` needs of one workload's operators (1-D arrays), per peak column they
    use: the one row of ``_stacked_ridge_tables`` (column, bytes in all, the distinct intensities
    sorted, bytes summed up to each, ops summed above each). Depends on the workload alone."""
    return tuple((k, float(b_total[0]), ai[:, 0], mem_prefix, ops_suffix)
                 for k, b_total, ai, mem_prefix, ops_suffix in _stacked_ridge_tables(ops[None], mem[None], count, column))


def _roofline_sum(tables: tuple, sys: SystemArrays, rows: np.ndarray | None = None) -> np.ndarray:
    """Σ_o count_o max(ops_o / peak[P, column_o], mem_o / bandwidth[P]), seconds, [P], of the
    operators ``_ridge_tables`` describes (with ``rows``, [P]: of each point's row of
    ``_stacked_ridge_tables``).

    The same sum as the per-operator kernel, in O(P log O): within one peak column an
    operator is compute-bound exactly when its intensity ops/mem exceeds the point's
    ridge peak/bandwidth, so sorting operators by intensity turns the sum into a
    prefix sum of bytes plus a suffix sum of ops at the ridge's rank."""
    bw = sys.bandwidth
    total = np.zeros(sys.size)
    with np.errstate(divide="ignore", invalid="ignore"):
        for k, b_total, ai, mem_prefix, ops_suffix in tables:
            peak = sys.peak[:, k]
            lowest = peak.min() if peak.size else np.inf    # NaN if any peak is NaN
            if lowest == np.inf:                    # every point leaves this class unbounded
                total += (b_total if rows is None else b_total[rows]) / bw
                continue
            idx = _rank(ai, peak / bw) if rows is None else _row_rank(ai, peak / bw, rows)
            ops = ops_suffix[idx]
            comp = ops / peak                       # no ops left: 0, unless the peak is 0 or NaN
            if not lowest > 0:
                comp = np.where(ops > 0, comp, 0.0)
            total += mem_prefix[idx] / bw + comp
    return total


#: a point's rank among at most this many sorted intensities is counted (one branch-free
#: comparison with each, over every point: 4-7x faster than numpy's binary search for 6-24
#: entries, measured); among more, searched
COUNTED = 32


def _rank(ai: np.ndarray, ridge: np.ndarray) -> np.ndarray:
    """``np.searchsorted(ai, ridge, side="right")`` of the sorted intensities ``ai``: how many
    are <= each ridge (all of them for a NaN ridge, which sorts last)."""
    if len(ai) > COUNTED:
        return np.searchsorted(ai, ridge, side="right")
    above = np.zeros(np.shape(ridge), dtype=np.uint8)
    for a in ai.tolist():
        above += a > ridge
    return np.subtract(len(ai), above, dtype=np.intp)       # intp: a gather's own index type


def _stacked_ridge_tables(ops, mem, count, column) -> tuple:
    """``_ridge_tables`` of the workloads of [U, O] ``ops`` and ``mem``, one row each, per peak
    column: (column, bytes in all [U], intensities sorted [K, U] (rank k of every row, contiguous),
    bytes summed up to each rank [U * (K + 1)], ops summed from each rank on [U * (K + 1)]).
    An operator without work in a row sorts last there and adds nothing to its sums."""
    out = []
    count = np.broadcast_to(count, np.shape(ops))
    for k in np.unique(column):
        in_k = column == k
        c, o, b = count[:, in_k], ops[:, in_k], mem[:, in_k]
        keep = (c > 0) & ((o > 0) | (b > 0))
        if not keep.any():
            continue
        o, b = np.where(keep, o * c, 0.0), np.where(keep, b * c, 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            ai = np.where(keep & (b > 0), o / b, np.inf)
        order = np.argsort(ai, axis=1, kind="stable")
        ai, o, b_sorted = (np.take_along_axis(x, order, axis=1) for x in (ai, o, b))
        zero = np.zeros((len(ai), 1))
        mem_prefix = np.concatenate((zero, np.cumsum(b_sorted, axis=1)), axis=1)
        ops_suffix = np.concatenate((np.cumsum(o[:, ::-1], axis=1)[:, ::-1], zero), axis=1)
        ai, at = _distinct_ranks(ai)
        out.append((int(k), b.sum(axis=1), np.ascontiguousarray(ai.T),
                    np.take_along_axis(mem_prefix, at, axis=1).ravel(), np.take_along_axis(ops_suffix, at, axis=1).ravel()))
    return tuple(out)


def _distinct_ranks(ai: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct intensities of each row of the row-sorted [U, K] ``ai``, left-packed and
    padded with +inf, [U, D]; for each rank 0 .. D of a row, how many of its K intensities are
    <= the rank's last distinct one, [U, D + 1]): ``_ridge_tables``' counting among distinct
    intensities, every row at once. A padded rank counts all K, as an infinite or NaN ridge does."""
    ends = np.ones(ai.shape, dtype=bool)
    ends[:, :-1] = ai[:, 1:] != ai[:, :-1]              # the last of each run of equal intensities
    distinct = ends.sum(axis=1)
    width = int(distinct.max())
    pos = np.argsort(~ends, axis=1, kind="stable")[:, :width]      # the runs' ends, in order
    real = np.arange(width) < distinct[:, None]
    at = np.concatenate((np.zeros((len(ai), 1), dtype=np.intp), np.where(real, pos + 1, ai.shape[1])), axis=1)
    return np.where(real, np.take_along_axis(ai, pos, axis=1), np.inf), at


def _row_rank(ai: np.ndarray, ridge: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Each point's position in the flat per-row sums of ``_stacked_ridge_tables``: its row
    (``rows``) x (ranks + 1) plus how many of its row's distinct intensities (``ai``, [ranks, U])
    are <= its ridge (all of them for a NaN ridge), counted as ``_rank`` counts."""
    ranks = len(ai)
    above = np.zeros(np.shape(ridge), dtype=np.uint8 if ranks < 256 else np.intp)
    for a in ai:
        above += a[rows] > ridge
    return rows * (ranks + 1) + (ranks - above.astype(np.intp))


def _row_link_totals(op: OpArrays) -> tuple:
    """(Σ count x all-reduce bytes, Σ count of the operators that all-reduce, the same two of
    point-to-point sends) of each row of [U, O] operator arrays, [U] each (of [O] arrays: one each)."""
    shape = np.shape(op.ops)
    c = np.broadcast_to(op.count, shape)
    comm = np.broadcast_to(np.asarray(op.comm_bytes, float), shape) * c
    p2p = np.broadcast_to(np.asarray(op.p2p_bytes, float), shape) * c
    return (comm.sum(axis=-1), np.where(comm > 0, c, 0.0).sum(axis=-1),
            p2p.sum(axis=-1), np.where(p2p > 0, c, 0.0).sum(axis=-1))


@lru_cache(maxsize=8)
def _stacked_terms(op: OpArrays, eff: Efficiency) -> tuple:
    """(``_stacked_ridge_tables`` of the rows of ``op`` at ``eff``'s fractions, op overhead seconds
    [U], ``_row_link_totals``), kept for the last few: a sweep's blocks of points share one table
    of their distinct workloads."""
    tables = _stacked_ridge_tables(op.ops / eff.compute_fraction(op), op.memory_bytes / eff.memory_fraction(op),
                                   op.count, op.peak_column)
    return tables, (op.count * _work(op)).sum(axis=-1) * eff.op_overhead_s, _row_link_totals(op)


def _stacked_step(st: Stacked, sys: SystemArrays, eff: Efficiency) -> np.ndarray:
    """``_separable_step`` of every point with its workload's row of ``st``, seconds, [P]."""
    tables, overhead, links = _stacked_terms(st.op, eff)
    rows = st.rows
    return _roofline_sum(tables, sys, rows) + _link_sum_of(tuple(x[rows] for x in links), sys, eff) \
        + overhead[rows]


@lru_cache(maxsize=KEPT)
def _separable_terms(op: OpArrays, eff: Efficiency) -> tuple:
    """(``_ridge_tables`` of ``op`` at ``eff``'s fractions, op overhead seconds) of one workload's
    operators (1-D arrays), kept."""
    ops = op.ops / _compute_fraction(op, eff)
    mem = op.memory_bytes / _memory_fraction(op, eff)
    overhead = (op.count * _work(op)).sum() * eff.op_overhead_s
    return _ridge_tables(ops, mem, op.count, op.peak_column), overhead


def _link_sum(op: OpArrays, sys: SystemArrays, eff: Efficiency) -> np.ndarray | float:
    """Σ count x (collective + point-to-point time) of a step, seconds, [P] (0.0 if none)."""
    return _link_sum_of(op.link_totals, sys, eff)


def _link_sum_of(totals: tuple, sys: SystemArrays, eff: Efficiency) -> np.ndarray | float:
    """``_link_sum`` of a step whose ``OpArrays.link_totals`` are ``totals`` (numbers, or one
    of each per point)."""
    t = 0.0
    comm, comm_count, p2p, p2p_count = totals
    if _nonzero(comm):
        n = sys.tp
        with np.errstate(invalid="ignore", divide="ignore"):
            t = t + (2 * (n - 1) / n * comm / (sys.link_bandwidth * eff.collective)
                     + _ring_latency(n, sys, eff) * comm_count)
    if _nonzero(p2p):
        t = t + p2p / (sys.link_bandwidth * eff.collective) + _latency(sys, eff) * p2p_count
    return t


def _separable_step(op: OpArrays, sys: SystemArrays, eff: Efficiency) -> np.ndarray:
    """Σ count x per-instance time of a step without the step overhead, [P] (separable case)."""
    tables, overhead = _separable_terms(op, eff)
    return _roofline_sum(tables, sys) + _link_sum(op, sys, eff) + overhead


def _host_step(op: OpArrays, sys: SystemArrays, eff: Efficiency) -> np.ndarray:
    """Σ count x per-instance time of a step without the step overhead, seconds, [P], on a design
    without PIM (every operator on the host, so its time is all it takes): the separable
    O(P log O) sum where it applies, else operator by operator."""
    if _separable(op, sys):
        return _separable_step(op, sys, eff)
    return _step_sum(_priced(op, sys, eff)[-1], op.count, None, sys)


def step_time(op: OpArrays | Stacked, sys: SystemArrays, eff: Efficiency) -> np.ndarray:
    """Time of one step on every point, seconds, [P]: Σ count × per-instance time + step overhead."""
    if _stackable(op, sys):
        return _stacked_step(op, sys, eff) + eff.step_overhead_s
    op = _per_point(op)
    if sys.pim_peak is None:
        return _host_step(op, sys, eff) + eff.step_overhead_s
    cost = op_costs(op, sys, eff)
    return _step_sum(cost.time_s, op.count, cost.on_pim, sys) + eff.step_overhead_s


def step_energy_j(op: OpArrays, sys: SystemArrays) -> np.ndarray:
    """Dynamic energy of one step on one device, J, [P] (``hwmodels.energy``'s linear model,
    SC'25 Eq. 1 without its cap): every op at the J/op of the class it runs in (vector work at
    the vector units'), every byte of device-memory traffic at the J/bit of all the levels it
    crosses, and each byte a collective or point-to-point transfer moves read from one device's
    memory and written to another's (a ring all-reduce moves 2 (tp - 1) / tp of its message per
    device). The link's own energy per bit, host-tier (offload) and PIM-internal access energy
    have no published figure (``configs/technology.yaml`` not_found): offloaded bytes are charged
    as device-memory traffic, link SerDes energy is left out, and a design with PIM units gets
    NaN. NaN also where the device has no measured energy profile (``sys.energy_op_j`` NaN)."""
    return energy_j(_step_work(op, op), sys)


def energy_j(work, sys: SystemArrays) -> np.ndarray:
    """Dynamic energy, J, [P], of ``work`` (a step's, ``step_work``, or a decode's,
    ``decode_total_work``) on every point of ``sys`` (``step_energy_j``'s model); NaN where no
    device has an energy profile. The same work is priced on several systems without working it
    out again (the energy reported, and the measured classes' alone)."""
    if sys.energy_op_j is None:
        return np.full(sys.size, np.nan)
    return _energy_of(work, sys)


def step_work(op):
    """What a step's energy counts of ``op`` (OpArrays or ``Stacked``), for ``energy_j``."""
    return _step_work(op, op)


@dataclass(frozen=True, eq=False)
class RowWork:
    """The work of points priced with their workloads' rows (``Stacked``): Σ_k weight_k x part_k,
    each part an ``_energy_work`` tuple of the rows ([U, K] ops, [U] amounts) that each point
    reads from its own row (``rows``, [P]), its weight a number or one per point (None: the part
    as it is). Energy is linear in the work: where every point has the same J/op and J/bit, each
    part's energy is worked out once per row (``_energy_of``)."""

    parts: tuple
    rows: np.ndarray

    def per_point(self) -> tuple:
        """The ``_energy_work`` tuple of each point ([P, K] ops, [P] amounts)."""
        gathered = [((w[0], *(_row_gather(a, self.rows) for a in w[1:])), k) for w, k in self.parts]
        if len(gathered) == 1 and gathered[0][1] is None:
            return gathered[0][0]
        (first, n), (grow, pairs) = gathered
        return _decode_sum(first, grow, n, pairs)

    @property
    def crosses_links(self) -> bool:
        """Whether some part moves bytes over a link (all-reduce or point-to-point)."""
        return any(_nonzero(w[3]) or _nonzero(w[4]) for w, _ in self.parts)


def _step_work(op: OpArrays | Stacked, classes_of: OpArrays | Stacked):
    """``_energy_work`` of ``op`` in the classes of ``classes_of``, kept for one workload's operators;
    of ``Stacked`` operators, worked out per row (``RowWork``)."""
    if isinstance(op, Stacked):
        return RowWork(((_recent_energy_work(op.op, classes_of.op), None),), op.rows)
    keep = op.one_workload and classes_of.one_workload
    return (_kept_energy_work if keep else _recent_energy_work)(op, classes_of)


def _row_gather(amount, rows: np.ndarray):
    """Each point's row (``rows``) of an amount of work per row ([U] or [U, K]; a number as it is):
    [P] or [P, K], gathered column by column."""
    if not isinstance(amount, np.ndarray) or amount.ndim == 0:
        return amount
    if amount.ndim == 1:
        return amount[rows]
    return np.take(np.ascontiguousarray(amount.T), rows, axis=1).T


def _energy_of(work, sys: SystemArrays) -> np.ndarray:
    """Dynamic energy, J, [P], of the work ``work`` (``_energy_work``'s tuple, or ``RowWork``) on
    every point of ``sys`` (``step_energy_j``'s model). Where every point has the same J/op,
    J/bit and tp (one device, as a sweep of a template's figures has), one workload's work is
    priced once, and each row of ``RowWork`` once."""
    if isinstance(work, RowWork):
        same = _same_coefficients(sys, work.crosses_links)
        if same is None:
            return _energy_of(work.per_point(), sys)
        total = None
        for w, k in work.parts:
            e = _dynamic_energy(w, *same)[work.rows]
            e = e if k is None else e * k
            total = e if total is None else total + e
        return total
    links = _nonzero(work[3]) or _nonzero(work[4])
    same = _same_coefficients(sys, links) if np.ndim(work[1]) == 1 else None
    if same is not None:                   # one workload's work on points alike: one energy for all
        return np.full(sys.size, _dynamic_energy(work, *same))
    total = _dynamic_energy(work, lambda c: sys.energy_op_j[:, c], sys.energy_bit_j,
                            np.asarray(sys.tp, dtype=float) if links else None)
    if sys.pim_peak is not None:
        total = np.where((sys.pim_peak > 0).any(axis=1), np.nan, total)
    return total


def _dynamic_energy(work: tuple, op_j, bit_j, tp):
    """Dynamic energy, J, of ``work`` (``_energy_work``'s tuple), ``step_energy_j``'s model:
    ``op_j(column)``: the J/op of a peak column (one per point, or a number); ``bit_j``: J per bit
    of device-memory traffic; ``tp``: the tensor-parallel ranks (read where bytes cross a link)."""
    classes, ops, mem, comm, p2p, vector = work
    if _nonzero(comm) or _nonzero(p2p):
        bits = 8.0 * (mem + 2.0 * (2.0 * (tp - 1.0) / tp * comm + p2p))
    else:                                  # nothing crosses a link: the memory traffic alone
        bits = 8.0 * mem
    total = op_j(classes[0]) * ops[..., 0]
    for j in range(1, len(classes)):      # class by class, in order: one contiguous column each
        total += op_j(classes[j]) * ops[..., j]
    total += bits * bit_j
    if vector is not None:
        total += vector * op_j(_COL["vector"])
    return total


def _same_coefficients(sys: SystemArrays, links: bool) -> tuple | None:
    """(J/op of a column, J/bit, tp) as numbers, when every point of ``sys`` has the same (its J/op a
    row seen at every point, as ``dse.system.hardware`` builds it for one device; tp read only
    where bytes cross a link) and none has PIM units; else None."""
    op_j, bit_j = sys.energy_op_j, sys.energy_bit_j
    if sys.pim_peak is not None or sys.size == 0 or op_j.strides[0] != 0 or not _one_value(bit_j):
        return None
    if links and not _one_value(sys.tp):
        return None
    row = op_j[0]
    return (lambda c: row[c]), np.asarray(bit_j).flat[0], float(np.asarray(sys.tp).flat[0]) if links else None


def _one_value(a) -> bool:
    """Whether ``a`` (a number, or one per point) holds one value at every point."""
    a = np.asarray(a)
    return a.ndim == 0 or a.strides[0] == 0 or bool((a == a[0]).all())


def _nonzero(amount) -> bool:
    """Whether ``amount`` (a number, or an array of one per point) is non-zero anywhere."""
    return bool(amount.any() if isinstance(amount, np.ndarray) else amount != 0)


def _energy_work(op: OpArrays, classes_of: OpArrays) -> tuple:
    """What a step's energy counts of ``op`` (its work in the classes ``classes_of`` gives each
    operator): (the classes, ops in each [K] or [P, K], device-memory bytes, all-reduce message
    bytes, point-to-point bytes, vector ops or None), every count of every operator in."""
    count = op.count
    column = classes_of.peak_column
    classes = np.unique(column)
    in_class = (column[:, None] == classes[None, :]).astype(float)          # [O, K]
    work = (np.asarray(op.ops, dtype=float) * count) @ in_class             # ops per class, [K] or [P, K]
    vector = None if op.vector_ops is None else _total(op.vector_ops, count)
    return (classes, work, _total(op.memory_bytes, count), _total(op.comm_bytes, count), _total(op.p2p_bytes, count),
            vector)


#: ``_energy_work`` of one workload's operators (1-D arrays), kept (``KEPT``)
_kept_energy_work = lru_cache(maxsize=KEPT)(_energy_work)
#: ``_energy_work`` of the last steps of many workloads priced ([W, O] arrays of at most a table's
#: rows, a few MB): a run's energy is counted twice over the same steps (every class at its J/op,
#: then the measured classes alone)
_recent_energy_work = lru_cache(maxsize=4)(_energy_work)


def _total(amount, count):
    """Σ_o count_o x amount_o: a number, or [P] for amounts per point [P, O]."""
    return np.asarray(amount, dtype=float) @ count


def decode_total_energy_j(op0: OpArrays, slope: OpArrays, steps, sys: SystemArrays) -> np.ndarray:
    """Dynamic energy of ``steps`` consecutive decode steps on one device, J, [P]: step j costs
    op0 + j x slope, and energy is linear in the work, so the sum is the energy of steps x the
    work of op0 plus steps (steps - 1) / 2 x the work of the slope (in op0's classes), priced
    in one pass over the points."""
    if sys.energy_op_j is None:
        return np.full(sys.size, np.nan)
    return _energy_of(decode_total_work(op0, slope, steps), sys)


def decode_total_work(op0, slope, steps):
    """What the energy of ``steps`` consecutive decode steps counts (``decode_total_energy_j``),
    for ``energy_j``: steps x the work of op0 plus steps (steps - 1) / 2 x the slope's (per row
    of ``Stacked`` operators: ``RowWork``)."""
    n = np.asarray(steps, dtype=float)
    pairs = n * (n - 1.0) / 2.0
    if isinstance(op0, Stacked):
        return RowWork(((_recent_energy_work(op0.op, op0.op), n), (_recent_energy_work(slope.op, op0.op), pairs)),
                       op0.rows)
    return _decode_sum(_step_work(op0, op0), _step_work(slope, op0), n, pairs)


def _decode_sum(first: tuple, grow: tuple, n, pairs) -> tuple:
    """n x the work ``first`` plus pairs x the work ``grow`` (``_energy_work`` tuples of the same
    classes; n and pairs numbers or one per point)."""
    per_op = (n[:, None], pairs[:, None]) if np.ndim(n) else (n, pairs)           # ops are [K] or [P, K]
    ops = first[1] * per_op[0] + grow[1] * per_op[1]
    amounts = [_sum_work(a, n, b, pairs) for a, b in zip(first[2:], grow[2:])]
    return (first[0], ops, *amounts)


def _sum_work(a, n, b, m):
    """n x a + m x b of two amounts of work (None where neither step has any)."""
    if a is None and b is None:
        return None
    return (0.0 if a is None else n * a) + (0.0 if b is None else m * b)


def _arith_sum(x0, xs, lo, hi):
    """Σ_{j=lo}^{hi-1} (x0 + xs j), elementwise; zero when hi <= lo."""
    n = np.maximum(hi - lo, 0)
    return n * x0 + xs * (lo + hi - 1) * n / 2.0


def decode_total_time(op0: OpArrays, slope: OpArrays, steps, sys: SystemArrays, eff: Efficiency) -> np.ndarray:
    """Exact total time of ``steps`` consecutive decode steps, seconds, [P].

    Step j (j = 0 .. steps-1) costs op0 + j * slope (every count of a decode step is
    affine in the context length). Per operator the sum of max(compute, memory)
    over j is split at the single crossing of two linear functions and summed in
    closed form, so the cost does not grow with the number of steps. Operators whose
    cost does not change with the context cost steps x one step's (the separable O(P log O)
    path where it applies); without PIM, which places each operator for the whole generation.
    """
    if _stackable(op0, sys):
        fixed, grow0, grow_slope = _recent_decode_split(op0.op, slope.op)
        n = np.asarray(steps, dtype=float)
        total = (_stacked_step(Stacked(fixed, op0.rows), sys, eff) + eff.step_overhead_s) * n
        if grow0 is not None:
            total = total + _decode_general(Stacked(grow0, op0.rows).expanded(),
                                            Stacked(grow_slope, slope.rows).expanded(), steps, sys, eff)
        return total
    op0, slope = _per_point(op0), _per_point(slope)
    if sys.pim_peak is None:                 # (a PIM places each operator for the whole generation)
        split = _kept_decode_split if np.ndim(op0.ops) == 1 and np.ndim(slope.ops) == 1 else _decode_split
        fixed, grow0, grow_slope = split(op0, slope)
        n = np.asarray(steps, dtype=float)
        total = (_host_step(fixed, sys, eff) + eff.step_overhead_s) * n
        if grow0 is not None:
            total = total + _decode_general(grow0, grow_slope, steps, sys, eff)
        return total
    return _decode_general(op0, slope, steps, sys, eff) + eff.step_overhead_s * np.asarray(steps, dtype=float)


def _decode_split(op0: OpArrays, slope: OpArrays) -> tuple:
    """(the operators of a decode step whose cost does not change with the context; the first
    step and slope of those that grow, None when none does)."""
    grows = (slope.ops != 0) | (slope.memory_bytes != 0)
    if slope.vector_ops is not None:
        grows = grows | (slope.vector_ops != 0)
    grows = grows.reshape(-1, np.shape(grows)[-1]).any(axis=0)
    if not grows.any():
        return _subset(op0, ~grows), None, None
    return _subset(op0, ~grows), _subset(op0, grows), _subset(slope, grows)


#: ``_decode_split`` of one workload's decode (1-D arrays), kept (``KEPT``)
_kept_decode_split = lru_cache(maxsize=KEPT)(_decode_split)
#: ``_decode_split`` of the last few decodes of distinct workloads (``Stacked``), whose blocks of
#: points share them
_recent_decode_split = lru_cache(maxsize=8)(_decode_split)


def _subset(op: OpArrays, sel) -> OpArrays:
    """The operators of ``op`` selected by the [O] mask ``sel``."""
    return OpArrays(**{f.name: (None if (v := getattr(op, f.name)) is None else np.asarray(v)[..., sel])
                       for f in fields(OpArrays)})


def _decode_general(op0: OpArrays, slope: OpArrays, steps, sys: SystemArrays, eff: Efficiency) -> np.ndarray:
    """Σ over ``steps`` decode steps of Σ count x per-instance time (no step overhead), [P].
    With PIM, each operator keeps one place for the whole generation, chosen by ``dispatch``
    from its time over the whole generation on the host and on the PIM."""
    host = _decode_op_totals(op0, slope, steps, sys, eff)
    eligible = pim_eligible(op0, sys)
    if eligible is None:
        return (host * op0.count).sum(axis=-1)
    sel = np.flatnonzero(eligible.any(axis=0))            # price in memory only what the PIM can run
    if sel.size == 0:
        return (host * op0.count).sum(axis=-1)
    pim = host.copy()
    pim[:, sel] = _decode_op_totals(_subset(op0, sel), _subset(slope, sel), steps, sys, eff, eligible[:, sel])
    on_pim = dispatch(host * op0.count, pim * op0.count, eligible, sys.pim_concurrent)
    return _step_sum(np.where(on_pim, pim, host), op0.count, on_pim, sys)


def _decode_op_totals(op0: OpArrays, slope: OpArrays, steps, sys: SystemArrays, eff: Efficiency,
                      on_pim=None) -> np.ndarray:
    """Σ over ``steps`` decode steps of each operator's per-instance time, [P, O], with the
    operators of ``on_pim`` in memory (None: all on the host)."""
    n = np.asarray(steps, dtype=float)
    n = n[:, None] if n.ndim == 1 else n
    # the slope at the first step's peaks and achieved fractions (its operators' shapes)
    c0, cs = _compute_terms(op0, sys, eff, on_pim, (op0.ops, op0.vector_ops), (slope.ops, slope.vector_ops))
    (dev0, host0), (devs, hosts) = _memory_terms(op0, sys, eff, on_pim, op0, slope)
    if not isinstance(host0, np.ndarray) and not isinstance(hosts, np.ndarray):
        m0, ms, a0, as_ = dev0, devs, 0.0, 0.0
    else:
        ov = sys.overlap[:, None]
        m0, ms = dev0 + np.where(ov, host0, 0.0), devs + np.where(ov, hosts, 0.0)   # inside the max
        a0, as_ = np.where(ov, 0.0, host0), np.where(ov, 0.0, hosts)               # added to it
    # step j costs max(c_j, m_j) = m_j + max(d_j, 0), d_j = c_j - m_j = d0 + ds j: every step's
    # memory time, plus d_j over the steps [lo, hi) where d_j >= 0 (one interval: d is linear)
    d0, ds = c0 - m0, cs - ms
    with np.errstate(divide="ignore", invalid="ignore"):
        root = -d0 / ds
        up_lo = np.clip(np.ceil(root), 0, n)            # ds > 0: compute-bound from here on
        down_hi = np.clip(np.floor(root) + 1, 0, n)     # ds < 0: compute-bound up to here
    lo = np.where(ds > 0, up_lo, np.where((ds < 0) | (d0 >= 0), 0.0, n))     # ds = 0: all steps or none
    hi = np.where(ds < 0, down_hi, n)
    total = _arith_sum(m0, ms, 0, n) + _arith_sum(d0, ds, lo, hi)
    if np.ndim(a0) or np.ndim(as_):
        total = total + _arith_sum(a0, as_, 0, n)
    total = total + _link_time(op0, sys, eff) * n   # collective and hop traffic do not grow with the context
    return total + np.where(_work(op0), eff.op_overhead_s, 0.0) * n
