"""The kernel's inputs and per-operator outputs as arrays: a design point's hardware
(``SystemArrays``), a step's operators (``OpArrays``, or ``Stacked``: the rows of several
workloads, each point reading its own), and the per-operator cost of a step (``OpCost``).

Arrays are shaped ``[points, operators]``; per-point quantities are ``[points]`` and
per-operator quantities ``[operators]`` (or ``[points, operators]`` when the workload varies
with the point). SI units: ops, bytes, seconds, ops/s, bytes/s, joules.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import cached_property

import numpy as np

from hwmodels.formats import COMPUTE_CLASSES

#: columns of SystemArrays.peak: every compute class, then 'vector', then 'none'
PEAK_COLUMNS = COMPUTE_CLASSES + ("vector", "none")
_COL = {c: i for i, c in enumerate(PEAK_COLUMNS)}


#: the OpArrays fields holding an operator's shape for the kernel layer
SHAPE_FIELDS = ("shape_m", "shape_n", "shape_k", "heads", "kv_heads")

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
    host_fraction: [P] the achieved fraction of host_bandwidth a host transfer reaches: the host
             link's or offload tier's own, measured (``hwmodels.links.host_link_fraction``; 1: none).
    host_latency: [P] s, the host link's latency, paid once per host transfer.
    offload: [P, 3] fraction of weight, activation and KV bytes that live in that tier
             (None: nothing offloaded).
    overlap: [P] bool, host transfers overlap compute (max) instead of adding to it.
    sparse_gain: [P, len(PEAK_COLUMNS)] factor on the peak of weight matmuls (2:4
             sparsity; None: dense).
    pim_peak: [P, len(PEAK_COLUMNS)] ops/s of the PIM units (None: no PIM).
    pim_multiple: [P] PIM internal bandwidth / external bandwidth.
    pim_roles: [P, len(PIM_ROLES)] bool, roles the PIM may run.
    pim_concurrent: [P] bool, the host computes while the PIM runs.
    pim_fixed_s: [P] seconds each operator instance the PIM runs pays besides its work (its mode
             switches and host-PIM coordination; 0 where not given).
    energy_op_j: [P, len(PEAK_COLUMNS)] J per op of work asking for each column, at the class it
             runs in (None: energy not modelled; NaN where the device has no measured profile).
    energy_bit_j: [P] J per bit of device-memory traffic, every on-chip level it crosses included.
    energy_op_floor_j: as energy_op_j, 0 for work whose class has no measured J/op of its own
             (charged in energy_op_j at a wider class's): what that work costs at least.
    static_w: [P] static (idle) power of one device, W (NaN where unknown).
    host_w: [P] power of the host server beyond the accelerators, W per device, drawn whenever the
             system is on (``host_power_w``); None: 0 everywhere.
    tdp_w: [P] power limit (TDP) of one device, W (NaN where unknown).
    scale_up_size: [P] devices per scale-up domain (``hwmodels.topology``; inf: one domain holds
             every device, the one-link system); None: inf everywhere.
    scale_out_bandwidth, scale_out_latency: [P] each device's scale-out NIC, bytes/s per direction
             and s per switch hop (NaN / 0 where the topology has no scale-out tier: a group beyond
             the domain then stays on the scale-up link); None: no scale-out tier.
    ep: [P] expert-parallel ranks (each of ``tp`` devices) an all-to-all spans; None: 1.
    torus_dims: [P, 3] the torus dimensions of each point's scale-up domain (1 where fewer or none);
             None: no point's domain is a torus with cited dimensions.
    cp: [P] context-parallel ranks (each of ``tp`` devices) a ring-attention ring spans; None: 1.
    two_batch_overlap: [P] bool, a step runs as two micro-batches, one's communication under the
             other's computation (``dse.core.overlap``); None: off everywhere.
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
    pim_fixed_s: np.ndarray | None = None
    energy_op_j: np.ndarray | None = None
    energy_bit_j: np.ndarray | None = None
    energy_op_floor_j: np.ndarray | None = None
    static_w: np.ndarray | None = None
    tdp_w: np.ndarray | None = None
    host_fraction: np.ndarray | None = None
    host_latency: np.ndarray | None = None
    scale_up_size: np.ndarray | None = None
    scale_out_bandwidth: np.ndarray | None = None
    scale_out_latency: np.ndarray | None = None
    ep: np.ndarray | None = None
    torus_dims: np.ndarray | None = None
    cp: np.ndarray | None = None
    two_batch_overlap: np.ndarray | None = None
    host_w: np.ndarray | None = None

    def __post_init__(self):
        n = self.bandwidth.shape[0]
        if self.host_bandwidth is None:
            object.__setattr__(self, "host_bandwidth", np.full(n, np.inf))
        if self.host_fraction is None:
            object.__setattr__(self, "host_fraction", np.ones(n))
        if self.host_latency is None:
            object.__setattr__(self, "host_latency", np.zeros(n))
        if self.overlap is None:
            object.__setattr__(self, "overlap", np.ones(n, dtype=bool))
        if self.pim_peak is not None:
            for k, v in (("pim_multiple", 1.0), ("pim_concurrent", False), ("pim_fixed_s", 0.0)):
                if getattr(self, k) is None:
                    object.__setattr__(self, k, _full(n, v, type(v)))
            if self.pim_roles is None:
                object.__setattr__(self, "pim_roles", np.ones((n, len(PIM_ROLES)), dtype=bool))

    @property
    def size(self) -> int:
        return self.bandwidth.shape[0]

    def take(self, index) -> SystemArrays:
        """The design points selected by ``index`` (a slice, mask or index array)."""
        def pick(v):
            if v is None:
                return None
            if v.ndim == 2 and v.flags.f_contiguous and not isinstance(index, slice):
                return v.T[:, index].T        # column-major: gather along each contiguous column
            return v[index]
        return self._copy({f: pick(v) for f, v in self.__dict__.items()})

    def replaced(self, **changes) -> SystemArrays:
        """These points with the fields ``changes`` in place of theirs (``dataclasses.replace``
        without re-running ``__post_init__``: every field is already filled in, and a value given
        is one of the field's own shape; the kernel makes such a copy per group it prices)."""
        unknown = changes.keys() - self.__dict__.keys()
        if unknown:
            raise TypeError(f"SystemArrays has no field {sorted(unknown)[0]!r}")
        return self._copy({**self.__dict__, **changes})

    @classmethod
    def _copy(cls, values: dict) -> SystemArrays:
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
    # the shape the kernel layer prices (``workloads.optable.Operator``'s shape_m .. kv_heads), [O] or
    # [W, O]; None: not recorded (the operators are priced by their fractions alone)
    shape_m: np.ndarray | None = None
    shape_n: np.ndarray | None = None
    shape_k: np.ndarray | None = None
    heads: np.ndarray | None = None
    kv_heads: np.ndarray | None = None
    # a grouped GEMM's (experts') weight bytes of one group, 0: a plain GEMM; its groups are its
    # weight bytes over these, so that they follow the weights an iteration reads (the experts it touches)
    group_weight_bytes: np.ndarray | None = None
    # [O] bool: operators whose link time overlaps their compute and memory, priced max(roofline, link)
    # (a context-parallel ring step, ``workloads.context_parallel``); None: none (link time added)
    overlapped: np.ndarray | None = None

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

    def times(self, k: float) -> OpArrays:
        """These operators with ``k`` times the work and traffic of each (a slope over k steps)."""
        scaled = replace(self, **{f: getattr(self, f) * k for f in ("ops", "weight_bytes", "act_bytes", "kv_bytes",
                                                                      "comm_bytes", "p2p_bytes")})
        return scaled if self.vector_ops is None else replace(scaled, vector_ops=self.vector_ops * k)

    @classmethod
    def from_table(cls, table) -> OpArrays:
        cols = np.array([_COL[c] for c in table.compute_classes], dtype=int)
        roles = table.roles
        dequant = table.column("dequant")
        return cls(table.ops, table.weight_bytes, table.act_bytes, table.kv_bytes, table.comm_bytes,
                   table.p2p_bytes, cols, table.counts,
                   np.array([op.kind == "matmul" for op in table.operators], dtype=bool),
                   np.array([PIM_ROLES.index(r) if r in PIM_ROLES else -1 for r in roles], dtype=int),
                   dequant if np.any(dequant) else None,
                   *(table.column(f) for f in SHAPE_FIELDS), _group_weight_bytes(table),
                   overlapped=_overlapped(table))


def _group_weight_bytes(table) -> np.ndarray | None:
    """Weight bytes of one group of each grouped GEMM of ``table`` (its weight bytes over its
    ``groups``; 0 for other operators), None when it has none."""
    groups = table.column("groups")
    if not np.any(groups > 0):
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(groups > 0, table.weight_bytes / np.where(groups > 0, groups, 1.0), 0.0)


def _overlapped(table) -> np.ndarray | None:
    """[O] bool of the operators of ``table`` whose link time overlaps their work, or None."""
    mask = np.array([op.overlaps_link for op in table.operators], dtype=bool)
    return mask if mask.any() else None


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

    def subset(self, sel) -> Stacked:
        """The operators selected by the [O] mask ``sel``, for the same points."""
        return Stacked(subset(self.op, sel), self.rows)


def per_point(op):
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


def subset(op: OpArrays, sel) -> OpArrays:
    """The operators of ``op`` selected by the [O] mask ``sel``."""
    return OpArrays(**{f.name: (None if (v := getattr(op, f.name)) is None else np.asarray(v)[..., sel])
                       for f in fields(OpArrays)})


def _row_link_totals(op: OpArrays) -> tuple:
    """(Σ count x all-reduce bytes, Σ count of the operators that all-reduce, the same two of
    point-to-point sends) of each row of [U, O] operator arrays, [U] each (of [O] arrays: one each)."""
    shape = np.shape(op.ops)
    c = np.broadcast_to(op.count, shape)
    comm = np.broadcast_to(np.asarray(op.comm_bytes, float), shape) * c
    p2p = np.broadcast_to(np.asarray(op.p2p_bytes, float), shape) * c
    return (comm.sum(axis=-1), np.where(comm > 0, c, 0.0).sum(axis=-1),
            p2p.sum(axis=-1), np.where(p2p > 0, c, 0.0).sum(axis=-1))
