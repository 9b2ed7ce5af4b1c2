"""The roofline cost kernel's public entries, vectorized over design points: a step's time
(``step_time``), a decode's over its generation (``decode_total_time``), and their dynamic
energies (``step_energy_j``, ``decode_total_energy_j``; ``step_work``, ``decode_total_work`` and
``energy_j`` price one work on several systems).

Each entry has two implementations that give the same numbers (to rounding; held together by
``tests/test_kernel_contract.py``):
- the reference, ``dse.core.operator_cost``: every operator priced on its own (compute term,
  memory terms over the tiers, link terms, PIM placement, energy), summed over operators;
- the speed layer, ``dse.core.kernel_fast``: the same sums split into per-workload tables and
  per-point rates where a design space allows, with what it derives from a workload kept.

The speed layer runs unless the reference is forced: the environment variable
``DSE_KERNEL=reference`` (read at every call; ``fast`` or unset: the speed layer), or
``with reference_kernel():`` around the calls (this thread and context only).

The arrays the kernel reads and writes are ``dse.core.kernel_arrays``'s; the per-operator
terms and the one link cost (``ring_allreduce_s``, ``message_s``, ``transfer_time``) are the
reference's; they are importable from here.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from contextvars import ContextVar

import numpy as np

from basis.errors import DseError
from dse.core import kernel_fast as fast
from dse.core import operator_cost as reference
from dse.core.efficiency import Efficiency
from dse.core.kernel_arrays import _COL, PEAK_COLUMNS, PIM_ROLES, OpArrays, OpCost, Stacked, SystemArrays
from dse.core.kernel_fast import KEPT, RowWork, forget_kept
from dse.core.operator_cost import (
    OperatorWork,
    collective_time,
    message_s,
    op_costs,
    p2p_time,
    pim_mask,
    ring_allreduce_s,
    transfer_time,
)
from dse.core.operator_cost import decode_general as _decode_general
from dse.core.operator_cost import step_sum as _step_sum
from dse.core.pim_dispatch import EXACT_PIM_OPERATORS, dispatch, pim_eligible

#: what other modules import from here (the arrays, the entries, the per-operator terms and the link
#: costs, the switch; and the private names the tests read)
__all__ = ["EXACT_PIM_OPERATORS", "KEPT", "PEAK_COLUMNS", "PIM_ROLES", "_COL", "OpArrays", "OpCost",
           "OperatorWork", "RowWork", "Stacked", "SystemArrays", "_decode_general",
           "_step_sum", "collective_time", "decode_total_energy_j", "decode_total_time", "decode_total_work",
           "dispatch", "energy_j", "forget_kept", "kernel_in_use", "message_s", "op_costs", "p2p_time",
           "pim_eligible", "pim_mask", "reference_kernel", "ring_allreduce_s", "step_energy_j", "step_time",
           "step_work", "transfer_time"]

#: the environment variable that forces the reference kernel (``reference``) or not (``fast``, unset)
KERNEL_VARIABLE = "DSE_KERNEL"
_FORCED: ContextVar[bool] = ContextVar("dse_reference_kernel", default=False)


@contextmanager
def reference_kernel():
    """Within this block (this thread and context), every entry of the kernel runs the
    per-operator reference (``dse.core.operator_cost``), not the speed layer."""
    token = _FORCED.set(True)
    try:
        yield
    finally:
        _FORCED.reset(token)


def kernel_in_use() -> str:
    """'reference' or 'fast': the implementation the kernel's entries run now (``reference_kernel``,
    else ``DSE_KERNEL``, else 'fast'). DseError for another value of ``DSE_KERNEL``."""
    if _FORCED.get():
        return "reference"
    chosen = os.environ.get(KERNEL_VARIABLE, "") or "fast"
    if chosen not in ("reference", "fast"):
        raise DseError(f"{KERNEL_VARIABLE}={chosen!r}: expected 'reference' or 'fast'")
    return chosen


def _kernel():
    return reference if kernel_in_use() == "reference" else fast


def step_time(op: OpArrays | Stacked, sys: SystemArrays, eff: Efficiency) -> np.ndarray:
    """Time of one step on every point, seconds, [P]: Σ count × per-instance time + step overhead."""
    return _kernel().step_time(op, sys, eff)


def decode_total_time(op0: OpArrays | Stacked, slope: OpArrays | Stacked, steps, sys: SystemArrays,
                      eff: Efficiency) -> np.ndarray:
    """Exact total time of ``steps`` consecutive decode steps, seconds, [P]: step j (j = 0 ..
    steps-1) costs op0 + j x slope (every count of a decode step is affine in the context length),
    each operator's max(compute, memory) summed over the steps in closed form; with PIM, each
    operator keeps one place for the whole generation."""
    return _kernel().decode_total_time(op0, slope, steps, sys, eff)


def step_energy_j(op: OpArrays | Stacked, sys: SystemArrays) -> np.ndarray:
    """Dynamic energy of one step on one device, J, [P] (``hwmodels.energy``'s linear model,
    SC'25 Eq. 1 without its cap): every op at the J/op of the class it runs in (vector work at
    the vector units'), every byte of device-memory traffic at the J/bit of all the levels it
    crosses, and each byte a collective or point-to-point transfer moves read from one device's
    memory and written to another's (a ring all-reduce moves 2 (tp - 1) / tp of its message per
    device). The link's own energy per bit, host-tier (offload) and PIM-internal access energy
    have no published figure (``configs/technology.yaml`` not_found): offloaded bytes are charged
    as device-memory traffic, link SerDes energy is left out, and a design with PIM units gets
    NaN. NaN also where the device has no measured energy profile (``sys.energy_op_j`` NaN)."""
    return _kernel().step_energy_j(op, sys)


def decode_total_energy_j(op0: OpArrays | Stacked, slope: OpArrays | Stacked, steps, sys: SystemArrays) -> np.ndarray:
    """Dynamic energy of ``steps`` consecutive decode steps on one device, J, [P]: energy is linear
    in the work, so the sum is the energy of steps x the work of op0 plus steps (steps - 1) / 2 x
    the work of the slope (in op0's classes)."""
    return _kernel().decode_total_energy_j(op0, slope, steps, sys)


def step_work(op: OpArrays | Stacked):
    """What a step's energy counts of ``op``, for ``energy_j``."""
    return _kernel().step_work(op)


def decode_total_work(op0, slope, steps):
    """What the energy of ``steps`` consecutive decode steps counts, for ``energy_j``."""
    return _kernel().decode_total_work(op0, slope, steps)


def energy_j(work, sys: SystemArrays) -> np.ndarray:
    """Dynamic energy, J, [P], of ``work`` (``step_work``'s or ``decode_total_work``'s) on every
    point of ``sys`` (``step_energy_j``'s model), priced by the implementation that counted it;
    NaN where no device has an energy profile. The same work is priced on several systems
    without working it out again (the energy reported, and the measured classes' alone)."""
    return (reference if isinstance(work, OperatorWork) else fast).energy_j(work, sys)
