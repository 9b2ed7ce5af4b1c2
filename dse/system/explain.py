"""Explanations: the per-operator table of the prefill and of one decode step of a design point
(``EXPLAIN_KEYS``, one row per operator: ops, bytes per tensor class, arithmetic intensity,
bound, peak, time and its share of the step)."""
from __future__ import annotations

import numpy as np

from dse.core.efficiency import Efficiency
from dse.core.operator_cost import collective_algorithms
from dse.core.roofline import PEAK_COLUMNS, SystemArrays, op_costs
from dse.system.grouping import Group
from dse.system.hardware import HardwareArrays
from dse.system.pricing import cpu_efficiency, split_counts
from hwmodels.formats import COMPUTE_CLASSES

#: columns of the per-operator explanation (one row per operator of a step)
EXPLAIN_KEYS = ("name", "count", "place", "compute_format", "ops", "weight_bytes", "act_bytes", "kv_bytes",
                "memory_bytes", "comm_bytes", "arithmetic_intensity", "bound", "peak_ops_per_s", "time_s",
                "total_time_s", "share")


def explain_set(explain, n: int):
    if explain is False or explain is None:
        return None
    if explain is True:
        return np.arange(n)
    return np.asarray(list(explain), dtype=np.int64)


def explain_point(g: Group, j: int, eff: Efficiency, given, ideal: bool, hw: HardwareArrays, point: int) -> dict:
    """Per-operator rows of the prefill and of one decode step of the group's j-th point."""
    t = g.tables
    one = g.system.take(np.array([j]))
    used = hw.used(point)
    stages = {}
    for stage, op, table in (("prefill", t.prefill, t.prefill_table), ("decode", t.decode, t.decode_table)):
        if g.cpu is None:
            stages[stage] = _rows(op, table, one, eff, used, "device", op.count)
        else:
            ceff = cpu_efficiency(given, ideal)
            cpu_sys = g.cpu.system.take(np.array([j]))
            dev, cpu = split_counts(op, t.layer_ops, g.cpu.share)
            cpu_used = g.cpu.used
            rows = (_rows(op, table, one, eff, used, "device", dev.count)
                    + _rows(op, table, cpu_sys, ceff, cpu_used, "cpu", cpu.count))
            stages[stage] = [r for r in rows if r["count"] > 0]
    return {**stages, "memory_bandwidth": float(one.bandwidth[0]),
            "collectives": {stage: _algorithms(op, one, eff) for stage, op in (("prefill", t.prefill),
                                                                                ("decode", t.decode))}}


def _algorithms(op, sys: SystemArrays, eff: Efficiency) -> tuple[str, str]:
    """(all-reduce algorithm, all-to-all algorithm) a step's collectives run on the one point of
    ``sys``, for the message of its first operator of each kind ('' where it has none)."""
    def first(x):
        x = np.ravel(np.asarray(x, dtype=float))
        nz = x[x > 0]
        return np.array([nz[0] if nz.size else 0.0])
    ar, a2a = collective_algorithms(first(op.comm_bytes), first(op.p2p_bytes), sys, eff)
    return ar[0], a2a[0]


def _rows(op, table, sys: SystemArrays, eff: Efficiency, used: np.ndarray, place_name: str, counts) -> list[dict]:
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        return _rows_of(op, table, sys, eff, used, place_name, counts)


def _rows_of(op, table, sys, eff, used, place_name, counts) -> list[dict]:
    cost = op_costs(op, sys, eff)
    total = cost.time_s[0] * counts
    step = total.sum()
    bound = cost.bound[0]
    on_pim = cost.on_pim[0] if cost.on_pim is not None else np.zeros(len(op.ops), dtype=bool)
    peak = sys.peak[0, op.peak_column]
    if sys.sparse_gain is not None:
        peak = peak * np.where(op.sparse_ok, sys.sparse_gain[0, op.peak_column], 1.0)
    if sys.pim_peak is not None:
        peak = np.where(on_pim, sys.pim_peak[0, op.peak_column], peak)
    mem = op.memory_bytes
    rows = []
    for i, o in enumerate(table.operators):
        col = int(op.peak_column[i])
        fmt = PEAK_COLUMNS[col] if col >= len(COMPUTE_CLASSES) else (
            COMPUTE_CLASSES[used[col]] if used[col] >= 0 else "-")
        ai = op.ops[i] / mem[i] if mem[i] > 0 else (float("inf") if op.ops[i] > 0 else 0.0)
        rows.append({
            "name": o.name, "count": float(counts[i]), "place": "pim" if on_pim[i] else place_name,
            "compute_format": {"none": "-"}.get(fmt, fmt), "ops": float(op.ops[i]),
            "weight_bytes": float(op.weight_bytes[i]), "act_bytes": float(op.act_bytes[i]),
            "kv_bytes": float(op.kv_bytes[i]), "memory_bytes": float(mem[i]), "comm_bytes": float(op.comm_bytes[i]),
            "arithmetic_intensity": float(ai), "bound": str(bound[i]), "peak_ops_per_s": float(peak[i]),
            "time_s": float(cost.time_s[0, i]), "total_time_s": float(total[i]),
            "share": float(total[i] / step) if step > 0 else 0.0,
        })
    return rows
