"""The kernel's speed layer: the same step and decode times and energies as the per-operator
reference (``dse.core.operator_cost``), summed faster where a design space allows, and what it
derives from a workload kept for the next call.

- A step of one workload (1-D operator arrays) or of each point's row of a few workloads
  (``Stacked``), without offload, PIM, sparsity or dequantization, splits into per-workload
  constants and per-point rates: within one peak column an operator is compute-bound exactly when
  its intensity ops/bytes exceeds the point's ridge peak/bandwidth, so sorting a workload's
  operators by intensity once (its ridge tables) prices every point in O(log O), and its link
  terms are one sum per workload (``ring_allreduce_s``, ``message_s`` of the step's totals).
- A decode without PIM splits into the operators whose cost does not change with the context
  (steps x one step's) and those that grow (the reference's closed form).
- Energy is linear in the work: a step's work per compute class is summed once per workload
  (per row of ``Stacked``), and priced once where every point has the same J/op and J/bit.
- What depends on one workload alone is kept, keyed on the operator arrays' identity (``KEPT``).

Every case it does not speed up is the reference's own code. ``tests/test_kernel_contract.py``
holds the two paths to one another.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from dse.core import operator_cost as reference
from dse.core.collectives import allreduce_share
from dse.core.efficiency import Efficiency
from dse.core.kernel_arrays import _COL, OpArrays, Stacked, SystemArrays, _row_link_totals, per_point, subset
from dse.core.operator_cost import has_work, message_s, ring_allreduce_s

#: workloads whose operator terms the kernel keeps (per Efficiency): what depends on one
#: workload's operators alone (the intensity-sorted sums of ``_ridge_tables`` at the
#: efficiency's fractions, the split of a decode into operators that grow with the context and
#: those that do not) is derived once, not again for every chunk, call or trial that prices it.
#: Operators of many workloads at once ([P, O] arrays) are large and priced once: nothing of them is kept
KEPT = 4096


def forget_kept() -> None:
    """Drop every kept workload term (``KEPT``): the memory they hold; results do not change."""
    for kept in (_separable_terms, _kept_decode_split, _stacked_terms, _recent_decode_split):
        kept.cache_clear()


def _per_point_kernel(eff: Efficiency) -> bool:
    """True when ``eff`` prices operators at the kernel layer's fractions of each point's own
    hardware ([P, O]): no per-workload constants to split off, the reference's [P, O] sums apply."""
    return eff.kernel is not None and eff.kernel.per_point


def _no_pim_work(op: OpArrays, sys: SystemArrays) -> bool:
    """True when no operator of ``op`` can run in memory: no PIM, or none has a PIM role (a
    prefill's, whose operators stay on the host): then the step is the host's own, priced by the
    same path as on the host without the PIM."""
    return sys.pim_peak is None or op.role is None or not np.any(np.asarray(op.role) >= 0)


def _stackable(op, sys: SystemArrays) -> bool:
    """True when ``op`` is ``Stacked`` and the points' costs split into per-workload constants
    and per-point rates (``_separable``'s conditions but one workload per point's row)."""
    return (isinstance(op, Stacked) and sys.offload is None and _no_pim_work(op.op, sys) and sys.sparse_gain is None
            and op.op.vector_ops is None and op.op.overlapped is None)


def _separable(op: OpArrays, sys: SystemArrays) -> bool:
    """True when a step's cost splits into per-operator constants and per-point rates:
    one workload for all points (1-D operator arrays), no offload, PIM work, sparsity or dequantization."""
    return (sys.offload is None and _no_pim_work(op, sys) and sys.sparse_gain is None and op.vector_ops is None
            and np.ndim(op.ops) == 1 and np.ndim(op.weight_bytes) == 1 and op.overlapped is None)


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
            ridge = peak / bw
            idx = np.searchsorted(ai, ridge, side="right") if rows is None else _row_rank(ai, ridge, rows)
            ops = ops_suffix[idx]
            comp = ops / peak                       # no ops left: 0, unless the peak is 0 or NaN
            if not lowest > 0:
                comp = np.where(ops > 0, comp, 0.0)
            total += mem_prefix[idx] / bw + comp
    return total


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
    are <= its ridge (all of them for a NaN ridge, which sorts last): ``np.searchsorted(side="right")``
    in its row, counted by one branch-free comparison with each rank over every point."""
    ranks = len(ai)
    above = np.zeros(np.shape(ridge), dtype=np.uint8 if ranks < 256 else np.intp)
    for a in ai:
        above += a[rows] > ridge
    return rows * (ranks + 1) + (ranks - above.astype(np.intp))


@lru_cache(maxsize=8)
def _stacked_terms(op: OpArrays, eff: Efficiency) -> tuple:
    """(``_stacked_ridge_tables`` of the rows of ``op`` at ``eff``'s fractions, op overhead seconds
    [U], ``_row_link_totals``), kept for the last few: a sweep's blocks of points share one table
    of their distinct workloads."""
    tables = _stacked_ridge_tables(op.ops / eff.compute_fraction(op), op.memory_bytes / eff.memory_fraction(op),
                                   op.count, op.peak_column)
    return tables, (op.count * has_work(op)).sum(axis=-1) * eff.op_overhead_s, _row_link_totals(op)


def _stacked_step(st: Stacked, sys: SystemArrays, eff: Efficiency) -> np.ndarray:
    """``_separable_step`` of every point with its workload's row of ``st``, seconds, [P]."""
    tables, overhead, links = _stacked_terms(st.op, eff)
    rows = st.rows
    link = _link_sum_per_operator(st.expanded(), sys, eff) if reference.spans_domains(sys) \
        else _link_sum_of(tuple(x[rows] for x in links), sys, eff)
    return _roofline_sum(tables, sys, rows) + link + overhead[rows]


@lru_cache(maxsize=KEPT)
def _separable_terms(op: OpArrays, eff: Efficiency) -> tuple:
    """(``_ridge_tables`` of ``op`` at ``eff``'s fractions, op overhead seconds) of one workload's
    operators (1-D arrays), kept."""
    ops = op.ops / eff.compute_fraction(op)
    mem = op.memory_bytes / eff.memory_fraction(op)
    overhead = (op.count * has_work(op)).sum() * eff.op_overhead_s
    return _ridge_tables(ops, mem, op.count, op.peak_column), overhead


def _link_sum(op: OpArrays, sys: SystemArrays, eff: Efficiency) -> np.ndarray | float:
    """Σ count x (collective + point-to-point time) of a step, seconds, [P] (0.0 if none)."""
    if reference.spans_domains(sys):
        return _link_sum_per_operator(op, sys, eff)
    return _link_sum_of(op.link_totals, sys, eff)


def _link_sum_per_operator(op: OpArrays, sys: SystemArrays, eff: Efficiency) -> np.ndarray | float:
    """``_link_sum`` operator by operator (``operator_cost.link_time``): where a collective
    crosses the scale-out tier its algorithm is chosen per message size, so the step's link time
    is no longer a function of its totals."""
    return (reference.link_time(op, sys, eff) * op.count).sum(axis=-1)


def _link_sum_of(totals: tuple, sys: SystemArrays, eff: Efficiency) -> np.ndarray | float:
    """``_link_sum`` of a step whose ``OpArrays.link_totals`` are ``totals`` (numbers, or one
    of each per point)."""
    t = 0.0
    comm, comm_count, p2p, p2p_count = totals
    if _nonzero(comm):
        t = t + ring_allreduce_s(comm, comm_count, sys.tp, sys.link_bandwidth, sys.link_latency, eff)
    if _nonzero(p2p):
        t = t + message_s(p2p, p2p_count, sys.link_bandwidth, sys.link_latency, eff)
    return t


def _separable_step(op: OpArrays, sys: SystemArrays, eff: Efficiency) -> np.ndarray:
    """Σ count x per-instance time of a step without the step overhead, [P] (separable case)."""
    tables, overhead = _separable_terms(op, eff)
    return _roofline_sum(tables, sys) + _link_sum(op, sys, eff) + overhead


def _operators_sum(op: OpArrays, sys: SystemArrays, eff: Efficiency) -> np.ndarray:
    """Σ count x per-instance time of a step without the step overhead, seconds, [P]: the separable
    O(P log O) sum where it applies, else the reference's (``operator_cost.operator_sum``)."""
    if _separable(op, sys):
        return _separable_step(op, sys, eff)
    return reference.operator_sum(op, sys, eff)


def step_time(op: OpArrays | Stacked, sys: SystemArrays, eff: Efficiency) -> np.ndarray:
    """Time of one step on every point, seconds, [P]: Σ count × per-instance time + step overhead
    (``operator_cost.step_time``, summed per workload where the step is separable)."""
    if _per_point_kernel(eff):
        return reference.step_time(op, sys, eff)
    if _stackable(op, sys):
        return _stacked_step(op, sys, eff) + eff.step_overhead_s
    return _operators_sum(per_point(op), sys, eff) + eff.step_overhead_s


def step_energy_j(op: OpArrays, sys: SystemArrays) -> np.ndarray:
    """Dynamic energy of one step on one device, J, [P]: what ``roofline.step_energy_j`` says,
    summed per energy class of the step's work."""
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
    """``_energy_work`` of ``op`` in the classes of ``classes_of``; of ``Stacked`` operators, worked
    out per row (``RowWork``)."""
    if isinstance(op, Stacked):
        return RowWork(((_energy_work(op.op, classes_of.op), None),), op.rows)
    return _energy_work(op, classes_of)


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
        bits = 8.0 * (mem + 2.0 * (allreduce_share(tp) * comm + p2p))
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
        return RowWork(((_energy_work(op0.op, op0.op), n), (_energy_work(slope.op, op0.op), pairs)),
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


def decode_total_time(op0: OpArrays, slope: OpArrays, steps, sys: SystemArrays, eff: Efficiency) -> np.ndarray:
    """Exact total time of ``steps`` consecutive decode steps, seconds, [P].

    Step j (j = 0 .. steps-1) costs op0 + j * slope (every count of a decode step is
    affine in the context length). Per operator the sum of max(compute, memory)
    over j is split at the single crossing of two linear functions and summed in
    closed form, so the cost does not grow with the number of steps. Operators whose
    cost does not change with the context cost steps x one step's (the separable O(P log O)
    path where it applies); without PIM, which places each operator for the whole generation.
    """
    if _per_point_kernel(eff):
        return reference.decode_total_time(op0, slope, steps, sys, eff)
    if _stackable(op0, sys):
        fixed, grow0, grow_slope = _recent_decode_split(op0.op, slope.op)
        n = np.asarray(steps, dtype=float)
        total = (_stacked_step(Stacked(fixed, op0.rows), sys, eff) + eff.step_overhead_s) * n
        if grow0 is not None:
            total = total + reference.decode_general(Stacked(grow0, op0.rows).expanded(),
                                                     Stacked(grow_slope, slope.rows).expanded(), steps, sys, eff)
        return total
    op0, slope = per_point(op0), per_point(slope)
    if _no_pim_work(op0, sys):               # (a PIM places each operator for the whole generation)
        split = _kept_decode_split if np.ndim(op0.ops) == 1 and np.ndim(slope.ops) == 1 else _decode_split
        fixed, grow0, grow_slope = split(op0, slope)
        n = np.asarray(steps, dtype=float)
        total = (_operators_sum(fixed, sys, eff) + eff.step_overhead_s) * n
        if grow0 is not None:
            total = total + reference.decode_general(grow0, grow_slope, steps, sys, eff)
        return total
    return reference.decode_total_time(op0, slope, steps, sys, eff)


def _decode_split(op0: OpArrays, slope: OpArrays) -> tuple:
    """(the operators of a decode step whose cost does not change with the context; the first
    step and slope of those that grow, None when none does)."""
    grows = (slope.ops != 0) | (slope.memory_bytes != 0)
    if slope.vector_ops is not None:
        grows = grows | (slope.vector_ops != 0)
    grows = grows.reshape(-1, np.shape(grows)[-1]).any(axis=0)
    if not grows.any():
        return subset(op0, ~grows), None, None
    return subset(op0, ~grows), subset(op0, grows), subset(slope, grows)


#: ``_decode_split`` of one workload's decode (1-D arrays), kept (``KEPT``)
_kept_decode_split = lru_cache(maxsize=KEPT)(_decode_split)
#: ``_decode_split`` of the last few decodes of distinct workloads (``Stacked``), whose blocks of
#: points share them
_recent_decode_split = lru_cache(maxsize=8)(_decode_split)
