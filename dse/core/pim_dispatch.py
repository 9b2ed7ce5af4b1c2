"""Where a PIM runs an operator (the one placement rule, ``dispatch``): which operators it may
run (``pim_eligible``), and, for each design point, the operators it runs given each operator's
time on the host and in memory.
"""
from __future__ import annotations

import numpy as np

from dse.core.kernel_arrays import OpArrays, SystemArrays


def pim_eligible(op: OpArrays, sys: SystemArrays) -> np.ndarray | None:
    """[P, O] bool: operators the PIM can run (a role it may run, in a format it computes);
    None without PIM. Depends on the design's kind, never on its figures. Only a decode step's
    operators have roles (``workloads.optable.OpTable.roles``): a prefill's are never eligible,
    so they stay the host's own, priced as without the PIM."""
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
