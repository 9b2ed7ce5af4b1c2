"""The one evaluator: columns of design points -> metrics, feasibility and explanations.

``evaluate(columns)`` is ``prepare(columns).run()``. ``prepare`` does everything that does
not depend on the efficiency model, once: the hardware arrays of every point
(``dse.system.hardware``), the parallel layout and the chip count of spatial systems,
the largest batch that fits (``batch: max``), the operator tables of each distinct
workload (``dse.system.workload``), where the footprint lives (``hwmodels.placement``)
and every feasibility check. ``run`` prices the prepared points with the roofline kernel
(``dse.core.roofline``) under an efficiency model and turns step times into serving
metrics (``dse.core.metrics``). Calibration runs one plan under many efficiencies.

Points are grouped by workload; each group is priced by one vectorized kernel call. Points
whose workloads are shared by few others (up to ``MANY_BELOW``: a sweep over batch and lengths as
well as hardware, or every point its own batch and lengths) are grouped with all the points that
differ from them only in batch, prompt and generated lengths: their operator tables are built at
once, one row per distinct workload (``dse.system.workload.WorkloadBatch``), and every point is
priced with its workload's row (``dse.core.roofline.Stacked``), or, where nearly every point is its
own workload, as [points, operators] arrays; so the Python loop is over kinds of workload (model,
formats, layout, hardware class), never over points or workloads. One design point is a one-row
table through the same code as a million.

Each job has its module: the result (``dse.system.result``), the per-point inputs
(``dse.system.inputs``), grouping (``dse.system.grouping``), feasibility and layout
(``dse.system.feasibility``), pricing of static batches (``dse.system.pricing``), served points
(``dse.system.served``) and explanations (``dse.system.explain``); this module holds the ``Plan``
that ties them together, ``prepare`` and ``evaluate``.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from functools import partial

import numpy as np

from basis.errors import DseError
from dse.core.bands import DATAFLOW, UNSEEN, band_for, shipped_bands
from dse.core.bands import FAMILIES as BAND_FAMILIES
from dse.core.dataflow import decoder_layers
from dse.core.economics import COST_COLUMNS, economics_defaults
from dse.core.efficiency import Efficiency, KernelHardware
from dse.core.engines import get_engine, runs_as_prior
from dse.core.kernel_arrays import PEAK_COLUMNS
from dse.core.kernel_model import MEASURED_PRESETS, OPS_PER_SM, SMEM_DEFAULT, load_kernel_model
from dse.core.metrics import capital_usd, system_figures, tco_usd_per_s, token_costs
from dse.core.roofline import KEPT
from dse.system import reasons as R
from dse.system.columns import Columns, constant, group, per_code, pointwise
from dse.system.explain import EXPLAIN_KEYS, explain_point, explain_set
from dse.system.feasibility import (
    GroupMemory,
    check_group,
    max_batch,
    open_loop_kv_bytes,
    padded_models,
    pool_layout,
    size_chips,
    speculation,
)
from dse.system.grouping import (
    MANY_BELOW,
    MANY_WORKLOADS,
    Group,
    group_rows,
    many_workloads,
    one_workload,
    positions,
    subgroup,
    together,
    workload_order,
)
from dse.system.hardware import HardwareArrays, assemble
from dse.system.inputs import WorkloadColumns, resolved_column, workload_columns
from dse.system.layout import parallel_layout
from dse.system.moe import moe_figures
from dse.system.params import SERVING_MODES, checked_choice
from dse.system.pricing import floor_w, price_many, price_static
from dse.system.result import CHECKS, METRICS, PERCENTILE_METRICS, Evaluation, Reordered
from dse.system.served import (
    ServedPoint,
    deferring_goodput,
    goodput_at_once,
    goodput_of_jobs,
    price_served_in_slices,
    served_point,
)
from dse.system.workload import WorkloadBatch, WorkloadTables, tables, workload_batch
from hwmodels.power import clock_fraction, energy_band, load_power, op_energy_factor


def _learned_points(cols: Columns, order: np.ndarray | None) -> np.ndarray | None:
    """[n] bool, held order (``order``: caller position of each held point, None: as given): the
    points whose ``kernel_layer`` is 'learned' (None: none is); DseError naming the column and what
    it allows for any other value."""
    if not cols.has("kernel_layer"):
        return None
    codes, names = resolved_column(cols, "kernel_layer", partial(checked_choice, "kernel_layer"))
    want = np.array([v == "learned" for v in names])[np.asarray(codes)]
    want = np.broadcast_to(want, (cols.n,)) if want.ndim == 0 else want
    if not want.any():
        return None
    return want if order is None else want[order]


class Plan:
    """Design points prepared for pricing: ``run(efficiency)`` evaluates them."""

    def __init__(self, cols: Columns, hw: HardwareArrays, groups: list[Group], base: dict, fails: dict,
                 memory_violation: np.ndarray, details: list, constraints: dict | None, labels: dict,
                 order: np.ndarray | None, flash: np.ndarray | None = None, economics: dict | None = None,
                 moe=None):
        # the points are held sorted by group (``order``: caller position of each sorted one)
        self.columns, self.hw, self.groups, self.labels = cols, hw, groups, labels
        self.order = order
        self.flash = flash            # FlashAttention as run per point (held order)
        self.economics = economics or {}   # the cost-of-serving columns (arrays in held order, or numbers)
        self.moe = moe                # batch used [P] -> (moe_imbalance, moe_dropped_fraction) (None: expected loads)
        self.inverse = None
        if order is not None:
            self.inverse = np.empty_like(order)
            self.inverse[order] = np.arange(len(order))
        self.base, self.memory_violation, self.details = base, memory_violation, details
        self.fails = {}
        for code, parts in fails.items():         # index lists -> one mask per check
            mask = np.zeros(cols.n, dtype=bool)
            for p in parts:
                if isinstance(p, tuple):          # (a slice, a mask over it)
                    mask[p[0]] |= p[1]
                else:
                    mask[p] = True
            self.fails[code] = mask
        self.constraints = constraints or {}
        self.learned = _learned_points(cols, order)     # checked here: a bad name is refused before pricing

    @property
    def size(self) -> int:
        return self.columns.n

    def run(self, *, efficiency=None, ideal: bool = False, explain=False, last: bool = False) -> Evaluation:
        """Price every point (see ``evaluate``). ``last``: this is the plan's last run, so the
        figures it worked out before pricing (footprint, devices, batch, price, power and area)
        are handed to the results instead of copied into them (a copy of a 10^6-point plan's
        costs ~40 ms); the plan cannot run again."""
        n = self.size
        base = self.base
        if base is None:
            raise DseError("this plan has had its last run (run(last=True)): prepare the points again")
        if last:
            out, self.base = dict(base), None
        else:
            out = {k: v.copy() for k, v in base.items()}
        written = []           # (points, metrics) of each group priced: the points a metric lacks are NaN
        eff_code = np.zeros(n, dtype=np.int64)
        eff_names: list[str] = []
        saturated = np.zeros(n, dtype=bool)
        slo_missed = np.zeros(n, dtype=bool)
        over_tdp = np.zeros(n, dtype=bool)
        per_row = efficiency is not None and not isinstance(efficiency, Efficiency)
        if per_row and len(efficiency) != n:
            raise DseError(f"efficiency: expected one Efficiency or one per design point ({n}), got {len(efficiency)}")
        if per_row and self.order is not None:
            efficiency = [efficiency[o] for o in self.order]
        want = explain_set(explain, n)
        if want is not None and self.inverse is not None:
            want = self.inverse[want]
        explained = {}
        resolved = {}          # the Efficiency of each (family, engine, ...) met: one lookup per run
        learned = self.learned
        source = np.zeros(n, dtype=np.int64)     # kernel_source per point (held order), codes of KERNEL_SOURCES
        with deferring_goodput() as jobs:       # every group's goodput searched together, after the loop
            for g in self.groups:
                if g.tables is None:
                    continue
                parts = [(g.index, efficiency)] if not per_row else _by_efficiency(g.index, efficiency)
                if learned is not None and g.family == "gpu" and not ideal and not g.device_class.dataflow:
                    parts = [piece for idx, e in parts for piece in _by_kernel_hardware(g, idx, e, learned, self.hw)]
                for part in parts:
                    idx, e = part[:2]
                    kernel = part[2] if len(part) > 2 else None
                    key = (g.family, id(g.engine), g.kv_group, id(e), ideal,
                           decoder_layers(g.tables) if g.device_class.dataflow else 0)   # dataflow: layers' latency
                    eff = resolved[key] if key in resolved else resolved.setdefault(key, _interned(g.efficiency(e, ideal)))
                    if kernel is not None:       # (a per-point description is one group's: not kept)
                        eff = replace(eff, kernel=kernel[0]) if kernel[0].per_point else \
                            _interned(replace(eff, kernel=kernel[0]))
                        source[idx] = kernel[1]
                    else:
                        source[idx] = KERNEL_SOURCES.index("prior" if eff.name.startswith("prior") else
                                                           "ideal" if eff.name == "ideal" else "calibrated fractions")
                    if eff.name not in eff_names:
                        eff_names.append(eff.name)
                    eff_code[idx] = eff_names.index(eff.name)
                    sub = g if idx is g.index else subgroup(g, idx)
                    metrics = _priced(sub, eff, e, ideal) if ideal else _capped_now(sub, eff, e, jobs)
                    saturated[idx] = metrics.pop("saturated", False)
                    slo_missed[idx] = metrics.pop("slo_missed", False)
                    over_tdp[idx] = metrics.pop("over_tdp", False)
                    _write(out, metrics, idx, n)
                    written.append((idx, metrics.keys()))
                    at = positions(idx)
                    for j in np.flatnonzero(np.isin(at, want)) if want is not None else ():
                        p = int(at[j])
                        one, k = (one_workload(sub, j), 0) if isinstance(sub.tables, WorkloadBatch) else (sub, j)
                        one_eff = eff if eff.kernel is None else replace(eff, kernel=eff.kernel.at(j))  # its own hardware
                        with goodput_at_once():
                            explained[p if self.order is None else int(self.order[p])] = explain_point(
                                one, k, one_eff, e, ideal, self.hw, p)
        for points, good, replicas, missed in goodput_of_jobs(jobs):
            out["goodput"][points], out["replicas"][points], slo_missed[points] = good, replicas, missed
        _unwritten_nan(out, written, set(base), n)
        if self.moe is not None:      # a finite expert load's imbalance at the batch each point used
            out["moe_imbalance"] = self.moe(out["batch_used"])[0]
        _open_loop_kv(out)
        nan = np.full(n, np.nan)
        nan.flags.writeable = False            # one read-only array for every metric no group wrote
        out = {k: out[k] if k in out else nan for k in METRICS}
        self._cost_of_serving(out)
        self._energy_bands(out)
        _service_figures(out)
        if efficiency is None and not ideal:
            self._bands(out)
        fails = dict(self.fails)
        if saturated.any():
            fails[R.CODE["saturated"]] = saturated
        if slo_missed.any():
            fails[R.CODE["slo"]] = slo_missed
        if over_tdp.any() and not ideal:     # the ideal roofline is a bound on speed, not a claim on power
            fails[R.CODE["power"]] = over_tdp
        violations, keys = self._violations(out, fails)
        reason = np.zeros(n, dtype=np.int16)
        for code in sorted(fails, key=R.rank, reverse=True):     # the first check failed, written last
            reason[fails[code]] = code
        labels, details, flash = dict(self.labels), self.details, self.flash
        labels["kernel_source"] = (source, list(KERNEL_SOURCES))
        if self.inverse is not None:                  # back to the caller's order
            back = self.inverse
            out = Reordered(out, back)
            violations = {k: _in_order(v, back) for k, v in violations.items()}
            fails = {k: _in_order(v, back) for k, v in fails.items()}
            reason, eff_code = reason[back], _in_order(eff_code, back)
            labels = {k: (codes if len(names) == 1 else _in_order(codes, back), names)
                      for k, (codes, names) in labels.items()}
            details = [(self.order[idx], text) for idx, text in details]
            flash = None if flash is None else flash[back]
        return Evaluation(self.columns, out, reason == 0, reason, violations, tuple(keys), eff_code,
                          eff_names or ["ideal" if ideal else "default"], fails, labels, details, explained, flash)

    def _violations(self, out: dict, fails: dict) -> tuple[dict, list]:
        """(the violations of every point, held order: memory, support and each constraint, <= 0
        when satisfied; the reason keys, the constraints' after ``R.KEYS``); each constraint's
        failures added to ``fails`` (in place)."""
        n = self.size
        violations = {"memory": self.memory_violation,
                      "support": np.any([m for c, m in fails.items() if c not in R.MEMORY_CODES] or
                                        [np.zeros(n, bool)], axis=0).astype(float)}
        keys = list(R.KEYS)
        for k, (metric, bound) in enumerate(_constraint_items(self.constraints)):
            sense, limit = bound
            v = out[metric]
            with np.errstate(invalid="ignore"):
                scale = abs(limit) if limit else 1.0
                viol = (limit - v) / scale if sense == "min" else (v - limit) / scale
            viol = np.where(np.isnan(viol), np.inf, viol)
            violations[f"{metric}.{sense}"] = viol
            fails[R.CONSTRAINT_BASE + k] = viol > 0
            keys.append(R.constraint_key(metric, sense, limit))
        return violations, keys

    def _cost_of_serving(self, out: dict) -> None:
        """The cost of ownership of every point (held order): its capital (devices' price, host and
        network shares: ``capital_usd``), its TCO per second (capital over its amortization, and the
        facility's electricity: ``power_w`` serving, static and host power idle, x PUE: ``tco_usd_per_s``) and
        what its tokens cost (``token_costs``: $ per million output tokens, split into input and
        output by ``prefill_time_share``, tokens per $, TCO per hour; ``dse.core.metrics``)."""
        e = self.economics
        idle = floor_w(self.hw.system) * out["devices"]         # static and host power, drawn idle too
        out["capital_usd"] = capital_usd(out["cost_usd"], e["host_cost_share"], e["network_cost_share"])
        per_s = tco_usd_per_s(out["capital_usd"], out["power_w"], idle, e["electricity_usd_per_kwh"],
                              e["amortization_years"], e["utilization"], e["pue"])
        out.update(token_costs(per_s, e["utilization"], out["total_tokens_per_s"] - out["output_tokens_per_s"],
                               out["output_tokens_per_s"], out["prefill_time_share"]))

    def _energy_bands(self, out: dict) -> None:
        """``energy_band_low`` / ``energy_band_high`` of every point (held order): factors on its
        energy per token and power from the basis of its device's power figures
        (``hwmodels.power.energy_band``); NaN where its energy is not modelled."""
        bands = np.array([energy_band(b) if b else (np.nan, np.nan) for b in self.hw.energy_basis or [""]])
        known = np.isfinite(out["energy_per_token_j"])
        for j, end in enumerate(("low", "high")):
            out[f"energy_band_{end}"] = np.where(known, bands[self.hw.name, j], np.nan)

    def _bands(self, out: dict) -> None:
        """The error band of every point's default prediction (``dse.core.bands``: factors on the
        predicted value, from the calibration's cross-validated residuals of its engine, vendor
        and metric family; the unseen engines' where the engine runs as a prior engine on the
        point's hardware family: ``dse.core.engines.runs_as_prior``), held order."""
        bands = shipped_bands()
        if not bands:
            return
        engine, names = self.labels["engine"]
        families = self.hw.families
        combo = np.asarray(engine, dtype=np.int64) * len(families) + self.hw.family
        prior = np.zeros(int(combo.max()) + 1, dtype=bool)
        for k in np.unique(combo):                      # the (engine, family) pairs present
            prior[k] = runs_as_prior(get_engine(names[k // len(families)]), families[k % len(families)])
        if prior[combo].any():                          # a prior engine there: the unseen engines' slices
            engine, names = np.where(prior[combo], len(names), engine), [*names, UNSEEN]
        vendors = self.hw.vendors                       # of each base device (``hw.name`` codes)
        pair = np.asarray(engine, dtype=np.int64) * len(vendors) + self.hw.name
        used = np.flatnonzero(np.bincount(pair))        # the (engine, device) pairs present
        for fam in BAND_FAMILIES:
            ends = np.full((2, used[-1] + 1), np.nan)
            for k in used:
                e, d = divmod(int(k), len(vendors))
                ends[:, k] = band_for(bands, names[e], vendors[d], fam)[:2]
            for j, end in enumerate(("low", "high")):    # one pair: one value for every point, read-only
                out[f"band_{fam}_{end}"] = constant(ends[j, used[0]], len(pair)) if len(used) == 1 \
                    else ends[j, pair]
                if self.hw.dataflow.any():              # a dataflow machine: its layer's band, never an engine's
                    flow = np.array([band_for(bands, DATAFLOW, v, fam)[j] for v in vendors])
                    out[f"band_{fam}_{end}"] = np.where(self.hw.dataflow, flow[self.hw.name], out[f"band_{fam}_{end}"])


#: the bf16 peak column
_BF16 = PEAK_COLUMNS.index("bf16")

#: points per distinct hardware below which the learned kernel layer prices a group's points in one
#: part, at fractions per point and operator ([P, O], the reference's sums), instead of one part per
#: distinct hardware (one row of fractions per workload, the speed layer's sums; always so for continuous
#: batching, a CPU layer split or speculative decoding, whose pricing takes rows of the points). Measured on 10^4-point
#: sweeps of Llama-2-70B FP8 (this machine, 2 shared cores): a distinct hardware's part costs ~8 ms
#: (50 hardwares of 8,000 points: 0.43 s), a point priced per point ~18 us (0.14 s): even at ~450 points
KERNEL_SPLIT_POINTS = 512

#: how far a point's 16-bit peak and bandwidth may sit from those of the GPU the kernel tables measured
#: and its prediction still read as theirs ('measured tables'): presets round their datasheet figures
#: differently from the tables' (RTX PRO 6000: 503.8 against 467.8 TFLOPS, 7.7 %); a design whose
#: figures are changed further is a transfer
MEASURED_SAME = 0.10

#: which layer's values priced a point's operators (the ``kernel_source`` column): the kernel layer
#: read on a GPU its tables measured, the kernel layer transferred through the physical features, the
#: calibrated family fractions, a family's stated prior, or the ideal roofline
KERNEL_SOURCES = ("calibrated fractions", "measured tables", "learned transfer", "prior", "ideal")


def _by_kernel_hardware(g: Group, idx, e, learned: np.ndarray, hw: HardwareArrays) -> list:
    """The points ``idx`` of group ``g`` split by their kernel-layer hardware: (points, ``e``) for those
    not on the learned layer, and (points, ``e``, (KernelHardware, source code)) for each distinct
    physical description (peak columns, bandwidth, SMs and cache: ``np.unique`` over the points' rows)
    of the learned ones. SMs, cache and shared memory are the kernel tables' own for a preset they measured, else
    estimated from the 16-bit peak (``kernel_model.hardware_of``), cache unknown; its source is 'measured
    tables' where the point's peak and bandwidth are the tables' GPU's (``MEASURED_SAME``), else
    'learned transfer'."""
    pos = positions(idx)
    local = pos - positions(g.index)[0]
    on = learned[pos]
    if not on.any():
        return [(idx, e)]
    model = load_kernel_model()
    names = [MEASURED_PRESETS.get(nm) for nm in hw.names]
    table = model.get("hardware") or {}
    sms = np.array([float(table[t]["sms"]) if t in table else np.nan for t in names])[hw.name[pos]]
    l2 = np.array([float(table[t]["l2_bytes"]) if t in table else 0.0 for t in names])[hw.name[pos]]
    smem = np.array([float(table[t].get("smem_bytes", SMEM_DEFAULT)) if t in table else SMEM_DEFAULT
                     for t in names])[hw.name[pos]]
    ref = np.array([[float(table[t][f]) if t in table else np.nan for f in ("peak_16", "bandwidth")]
                    for t in names])[hw.name[pos]]
    own = np.column_stack([g.system.peak[local, _BF16], g.system.bandwidth[local]])
    with np.errstate(invalid="ignore"):       # the tables' GPU as measured: its preset, its figures unchanged
        measured = np.all(np.abs(own / ref - 1.0) <= MEASURED_SAME, axis=1)
    sms = np.where(np.isfinite(sms), sms, np.maximum(np.round(g.system.peak[local, _BF16] / OPS_PER_SM), 1.0))
    rows = np.column_stack([g.system.peak[local], g.system.bandwidth[local], sms, l2, smem, measured])
    rows = np.where(np.isfinite(rows), rows, -1.0)
    out = [(pos[~on], e)] if (~on).any() else []
    uniq, inv = np.unique(rows[on], axis=0, return_inverse=True)
    inv = np.ravel(inv)
    # many designs: one part, [P, O]; not where pricing takes rows of the points' hardware (continuous
    # batching's iterations, a CPU layer split's host, a draft model's steps): those go by distinct hardware
    whole = g.serving is None and g.cpu is None and g.spec is None
    if whole and len(uniq) > 1 and len(uniq) * KERNEL_SPLIT_POINTS > len(inv):
        at = local[on]
        kernel = KernelHardware(np.asarray(g.system.peak[at], dtype=float), np.asarray(g.system.bandwidth[at], dtype=float),
                                sms[on], l2[on], smem[on])
        src = np.where(measured[on], KERNEL_SOURCES.index("measured tables"), KERNEL_SOURCES.index("learned transfer"))
        return [*out, (pos[on], e, (kernel, src))]
    peaks = g.system.peak[local[on]]
    first = np.unique(inv, return_index=True)[1]
    for u in range(len(uniq)):                 # one per distinct hardware, not per point
        p0 = first[u]
        kernel = KernelHardware(tuple(float(x) for x in peaks[p0]), float(g.system.bandwidth[local[on][p0]]),
                                float(uniq[u, -4]), float(uniq[u, -3]), float(uniq[u, -2]))
        src = KERNEL_SOURCES.index("measured tables" if uniq[u, -1] > 0 else "learned transfer")
        out.append((pos[on][inv == u], e, (kernel, src)))
    return out


def _capped_now(g: Group, eff: Efficiency, given, jobs: list) -> dict:
    """``_capped`` of ``_priced``'s metrics of a group's points, inside ``served.deferring_goodput``
    (``jobs``): a group with a point over its power limit has its goodput searched at once (it is
    priced again at a lower clock, and that pricing's goodput stands), the others' is left to the list."""
    before = len(jobs)
    metrics = _priced(g, eff, given, False)
    if len(jobs) > before and np.any(metrics.get("over_tdp", False)):
        pos = positions(g.index)
        order = np.argsort(pos, kind="stable")
        for points, good, replicas, missed in goodput_of_jobs(jobs[before:]):
            at = order[np.searchsorted(pos, points, sorter=order)]
            metrics["goodput"][at], metrics["replicas"][at], metrics["slo_missed"][at] = good, replicas, missed
        del jobs[before:]
    with goodput_at_once():
        return _capped(g, eff, given, metrics)


def _priced(g: Group, eff: Efficiency, given, ideal: bool) -> dict:
    """The metrics of a group's points: served (``dse.system.served.price_served_in_slices``), or a static
    batch (``dse.system.pricing``: of many workloads, or of one)."""
    if g.serving is not None:
        return price_served_in_slices(g, eff)
    if isinstance(g.tables, WorkloadBatch):
        return price_many(g, eff, given, ideal)
    return price_static(g, eff, given, ideal)


#: pricing passes that bisect a capped point's clock (the first at the most it can be): the clock
#: is then known to within (1 - lowest) / 2^(passes - 1), about 4 % of the boost clock
CAP_PASSES = 5


def _capped(g: Group, eff: Efficiency, given, metrics: dict) -> dict:
    """``metrics`` of a group's points (``_priced``) with every point whose power demand exceeds its
    limit (``power_cap_w``, else its TDP) priced again at the highest clock f that meets it
    (``hwmodels.power``: compute peaks x f, energy per operation x f^2; memory untouched): f is
    bracketed between the lowest clock and ``clock_fraction``'s (all dynamic power following the
    clock: the most f can be) and bisected (``CAP_PASSES``), then priced at the bracket's low end.
    A point over its limit even at the lowest clock keeps ``over_tdp`` (reason ``power``). One
    clock for the whole run: a static batch's decode, drawing less than its prefill, is slowed as
    much (an upper bound on its slowdown)."""
    n = len(np.atleast_1d(metrics["power_demand_w"]))
    clock = np.ones(n)
    over = np.array(np.broadcast_to(metrics.pop("over_tdp", False), (n,)), dtype=bool)
    checked = metrics.pop("checked_demand_w", None)     # the demand the limit is checked against
    at = np.flatnonzero(over)
    if not len(at):
        metrics.update(over_tdp=over, clock_fraction=clock)
        return metrics
    sys, lowest = g.system, load_power().min_clock_fraction
    static, limit = sys.static_w[at], sys.tdp_w[at]
    demand = np.broadcast_to(checked, (n,))[at]
    lo = np.full(len(at), lowest)
    hi = np.maximum(clock_fraction(static, demand - static, limit), lowest)

    # the learned kernel layer's description of each point priced again (its fractions of the peak are
    # read at the boost clock's peaks: the capped peak scales the roofline, not the fractions)
    part_eff = eff if eff.kernel is None else replace(eff, kernel=eff.kernel.take(at))

    def price_at(f):
        part = group_rows(g, at)
        ps, scale = part.system, op_energy_factor(f)[:, None]
        part = replace(part, system=ps.replaced(peak=ps.peak * f[:, None], energy_op_j=ps.energy_op_j * scale,
                                                energy_op_floor_j=ps.energy_op_floor_j * scale))
        out = _priced(part, part_eff, given, False)
        out.pop("over_tdp", None)
        with np.errstate(invalid="ignore"):
            return out, np.broadcast_to(out.pop("checked_demand_w"), (len(at),)) > limit * (1 + 1e-3)
    for step in range(CAP_PASSES):
        f = hi if step == 0 else 0.5 * (lo + hi)
        _, high = price_at(f)
        hi, lo = np.where(high, f, hi), np.where(high, lo, f)
    again, still = price_at(lo)
    for key, v in again.items():
        whole = np.array(np.broadcast_to(metrics[key], (n,)))
        whole[at] = v
        metrics[key] = whole
    over[at], clock[at] = still, lo
    metrics.update(over_tdp=over, clock_fraction=clock)
    return metrics


def _write(out: dict, metrics: dict, idx, n: int) -> None:
    """Write a group's ``metrics`` at its points ``idx`` into ``out`` (one array of ``n`` per
    metric, made when first written); a group of every point hands over its own arrays."""
    whole = isinstance(idx, slice) and idx.start == 0 and idx.stop == n
    kept = set()
    for k, v in metrics.items():
        if whole and k not in out and _own_array(v, n) and id(v) not in kept:
            out[k] = v             # one group has every point: its own array, no copy
            kept.add(id(v))
            continue
        if k not in out:           # first written here: no pass to fill it with NaN first
            out[k] = np.empty(n)
        out[k][idx] = v


def _in_order(a: np.ndarray, back: np.ndarray) -> np.ndarray:
    """``a`` (one entry per point, held order) in the caller's order: ``a[back]``, or ``a`` itself
    where every point holds the same value (the same in any order: no gather of every point)."""
    return a if len(a) and a.min() == a.max() else a[back]


def _open_loop_kv(out: dict) -> None:
    """An open loop's KV cache and memory (in place): what its steady state's running batch holds
    (``open_loop_kv_bytes``), known only once priced."""
    if "running_batch" not in out:             # no group was served
        return
    late = np.flatnonzero(np.isfinite(out["kv_request_bytes"]) & np.isfinite(out["running_batch"]))
    if len(late):
        for k in ("kv_cache_bytes", "memory_bytes"):      # base arrays may be read-only views: own them
            out[k] = np.array(out[k], dtype=float)
        kv = out["kv_cache_bytes"][late]
        out["kv_cache_bytes"][late], out["memory_bytes"][late] = open_loop_kv_bytes(
            out["running_batch"][late], out["kv_request_bytes"][late], out["kv_pool_bytes"][late],
            out["memory_bytes"][late] - kv)


def _unwritten_nan(out: dict, written: list, base: set, n: int) -> None:
    """Set to NaN, in each metric of ``out`` the groups priced wrote (``written``: their points and
    metrics, in order), the points no group wrote. Groups of one kind write the same metrics: the
    points they cover are marked once for them all, and the points left once per such kinds."""
    covered = {}                   # a set of metrics -> the points of the groups that wrote it
    for idx, keys in written:
        keys = frozenset(keys)
        if keys not in covered:
            covered[keys] = np.zeros(n, dtype=bool)
        covered[keys][idx] = True
    left_of = {}                   # the sets of metrics holding a metric -> the points none covers (None: none)
    for k in set().union(*covered) - base:
        sets = tuple(keys for keys in covered if k in keys)
        if sets not in left_of:
            masks = [covered[keys] for keys in sets]
            left = ~(masks[0] if len(masks) == 1 else np.logical_or.reduce(masks))
            left_of[sets] = left if left.any() else None
        if left_of[sets] is not None:
            out[k][left_of[sets]] = np.nan


#: Efficiencies met by earlier runs, each kept as one object (``_interned``)
_EFFICIENCIES: dict = {}


def _interned(eff: Efficiency) -> Efficiency:
    """The one object kept for Efficiencies equal to ``eff``: every run then prices with the
    object the kernel's kept terms were keyed on (``dse.core.roofline.KEPT``), found by identity,
    not compared field by field. At most ``KEPT`` are kept."""
    if len(_EFFICIENCIES) >= KEPT:
        _EFFICIENCIES.clear()
    return _EFFICIENCIES.setdefault(eff, eff)


def _service_figures(out: dict) -> None:
    """Per-device goodput and what a service of ``replicas`` engines takes (devices, cost,
    average power, power provisioned as TDPs), from each engine's figures."""
    with np.errstate(invalid="ignore", divide="ignore"):
        out["goodput_per_device"] = out["goodput"] / out["devices"]
        for k, per in (("service_devices", "devices"), ("service_cost_usd", "cost_usd"),
                       ("service_power_w", "power_w"), ("service_tdp_w", "system_tdp_w")):
            out[k] = out["replicas"] * out[per]


def _own_array(v, n: int) -> bool:
    """True when ``v`` is a float array of ``n`` entries that owns its memory (not a view of an
    input or of another array): a group's result that may be kept as the metric itself."""
    return isinstance(v, np.ndarray) and v.base is None and v.shape == (n,) and v.dtype == np.float64


def _by_efficiency(index, effs: Sequence):
    """Split a group's points by their own Efficiency (per-row efficiencies)."""
    keys: dict[int, list] = {}
    for i in positions(index):
        keys.setdefault(id(effs[i]), []).append(i)
    return [(np.array(v, dtype=np.int64), effs[v[0]]) for v in keys.values()]


def _constraint_items(constraints: dict):
    for metric, bound in constraints.items():
        for sense, limit in bound.items():
            yield metric, (sense, float(limit))


class _Failures:
    """The checks failed while preparing: per reason code, the points that fail it (index arrays,
    or (a slice, a mask over it)), and the words of the checks that gave some."""

    def __init__(self):
        self.fails: dict[int, list] = {}
        self.details: list = []

    def __call__(self, code: str, index, detail: str | None = None) -> None:
        """Points ``index`` fail the check ``code``: positions, or (a slice, a mask over it; no
        ``detail``)."""
        if isinstance(index, tuple):
            self.fails.setdefault(R.CODE[code], []).append(index)
            return
        index = np.asarray(index, dtype=np.int64)
        if len(index):
            self.fails.setdefault(R.CODE[code], []).append(index)
            if detail:
                self.details.append((index, detail))

    def moved(self, inverse: np.ndarray) -> None:
        """The points moved (``inverse``: the new position of each old one): index lists follow."""
        for parts in self.fails.values():
            parts[:] = [inverse[p] for p in parts]
        self.details[:] = [(inverse[idx], text) for idx, text in self.details]


def prepare(columns: Mapping, *, constraints: dict | None = None, where: str = "columns") -> Plan:
    """Assemble, lay out, size and check every design point of ``columns`` (see the module
    docstring); DseError for an unknown name or an invalid value, naming the column."""
    cols = columns if isinstance(columns, Columns) else Columns(columns, where)
    original = cols
    n = cols.n
    # points that share a workload are put side by side first (from the columns as given), so
    # that every group is a slice; batch: max and chip sizing may split groups further below
    held = workload_order(cols)
    if held is not None:
        cols = cols.take(held)
    hw = assemble(cols)
    w = workload_columns(cols, hw)
    fail = _Failures()
    w, tp, pp, chips, batch, devices = _layout(w, hw, fail)
    key = _workload_key(w, hw, batch, tp, pp)
    inv, order, starts = group(key, n)
    workload = inv                      # each point's workload (the points of a group of many each read theirs)
    many = many_workloads(per_code(np.diff(starts), inv), w, w.cpu_layers)
    if many.any():                      # one group for the workloads differing only in batch and lengths
        many, (inv, order, starts) = together(key, many, (inv, order, starts))
    if np.all(order[1:] > order[:-1]):
        order = held                    # already in group order
    else:                               # hold the points in group order: every group a slice (views)
        inverse = np.empty_like(order)
        inverse[order] = np.arange(n)
        cols = cols.take(order)
        hw = assemble(cols)
        tp, pp, batch, chips, devices = tp[order], pp[order], batch[order], chips[order], devices[order]
        w = padded_models(workload_columns(cols, hw), hw, tp)
        many, workload = many[order], workload[order]
        fail.moved(inverse)
        order = order if held is None else held[order]
    memory_violation = np.full(n, np.inf)
    base = {"devices": devices, "batch_used": batch, "tp_used": tp, "pp_used": pp, "chips_required": chips,
            "capacity_bytes": hw.system.capacity.copy(), "quality_loss": w.quality_loss,
            **dict(zip(("moe_imbalance", "moe_dropped_fraction"), moe_figures(w.models, w.model, w.ep, w.techniques,
                                                                                 w.tech, batch))),
            **{k: np.full(n, np.nan) for k in (
                "weights_bytes", "kv_cache_bytes", "activation_bytes", "memory_bytes", "offloaded_bytes",
                "engine_reserve_bytes", "kv_pool_bytes", "kv_request_bytes", "state_bytes")}}
    base.update(system_figures(devices, hw.tdp_w, hw.price_usd))
    base.update(die_area_mm2=hw.die_area_m2 * 1e6, build_cost_usd=devices * hw.build_cost_usd)
    groups = []
    for g in range(len(starts) - 1):
        idx = slice(int(starts[g]), int(starts[g + 1]))
        checked, memory = _prepared_group(idx, w, hw, tp, pp, batch, many, workload, fail)
        groups.append(checked)
        if memory is not None:
            _hold_memory(base, memory_violation, idx, memory)
    return Plan(original, hw, groups, base, fail.fails, memory_violation,
                fail.details, constraints, _labels(w, hw), order, w.flash, _economics(cols),
                partial(moe_figures, w.models, w.model, w.ep, w.techniques, w.tech)   # served: their running batch
                if any(t.routing.finite for t in w.techniques) else None)


def _layout(w: WorkloadColumns, hw: HardwareArrays, fail) -> tuple:
    """(w, tp, pp, chips, batch, devices) of every point, [P]: the workload columns with models padded
    where the engine pads attention heads for the layout (``padded_models``), the parallel layout
    (given, or of a disaggregated point's instance), the chip count of classes sized by capacity (NaN
    elsewhere), the batch (the largest that fits where asked) and the devices in all."""
    lay_devices, lay_tp, pooled = pool_layout(w, fail)
    tp, pp, valid = parallel_layout(lay_devices, lay_tp, w.pp, w.ep * w.cp)     # cp rings of tp x pp x ep
    fail("layout", np.flatnonzero(~valid))
    w = padded_models(w, hw, tp)
    sized = hw.sized_by_capacity & np.isnan(w.devices) & np.isnan(w.tp) & np.isnan(w.pp)
    chips = np.full(len(sized), np.nan)
    if sized.any():
        tp, pp = tp.copy(), pp.copy()            # (one value for every point: written per point here)
        size_chips(w, hw, sized, tp, pp, chips, fail)
    batch = w.batch.copy()
    if w.batch_max.any():
        max_batch(w, hw, tp, pp, batch, fail)
    return w, tp, pp, chips, batch, np.where(w.disaggregated, pooled, tp * pp * w.ep * w.cp)


def _workload_key(w: WorkloadColumns, hw: HardwareArrays, batch, tp, pp) -> list:
    """The arrays whose values together decide which points share a workload (one kernel call)."""
    return [w.model, batch, w.prompt, w.gen, w.weights, w.activations, w.kv, tp, pp, w.ep, w.cp,
            w.flash, w.buffer, w.policy, w.overlap, w.sparse, w.cpu_layers,
            w.max_context, pointwise(lambda c, h: np.where(c > 0, h, -1), w.cpu_layers, hw.host_cpu),
            hw.device_class, hw.family, w.engine, w.continuous,
            pointwise(np.where, w.continuous, w.prefill_chunk, 0.0), w.lengths, w.disaggregated,
            w.tech, w.draft, w.spec_acceptance, w.decode_tp, w.decode_ep, w.decode_hardware, w.pd_link,
            w.session_turns, pointwise(lambda e: e > 0, w.encoder_devices)]


def _prepared_group(idx: slice, w: WorkloadColumns, hw: HardwareArrays, tp, pp, batch, many, workload,
                    fail) -> tuple[Group, GroupMemory | None]:
    """(the group of the points ``idx``, what they hold in memory): its operator tables (of each
    workload, ``many``), speculative decoding and every check (``check_group``); a group without
    tables (None) where FlashAttention has no buffer or the layout does not divide the model."""
    i0 = idx.start
    model = w.models[w.model[i0]]
    names = {k: str(getattr(w, k + "_names")[getattr(w, k)[i0]]) for k in ("weights", "activations", "kv")}
    def unpriced() -> Group:
        return Group(idx, None, None, hw.kind(i0), family=hw.families[hw.family[i0]], engine=w.engines[w.engine[i0]])
    if w.flash[i0] and not hw.buffer[i0] > 0:
        fail("onchip_buffer", positions(idx))
        return unpriced(), None
    tech = w.techniques[w.tech[i0]]
    layout = (names["weights"], names["activations"], names["kv"], int(tp[i0]), int(pp[i0]), int(w.ep[i0]),
              bool(w.flash[i0]), float(w.buffer[i0]), tech, int(w.cp[i0]))
    try:
        if many[i0]:
            t, spec = workload_batch(model, batch[idx], w.prompt[idx], w.gen[idx], *layout,
                                     workload=workload[idx]), None
        else:
            t = tables(model, int(batch[i0]), int(w.prompt[i0]), int(w.gen[i0]), *layout)
            spec = speculation(t, model, w, i0, float(w.buffer[i0]))
    except DseError as e:
        fail("model_split", positions(idx), str(e))
        return unpriced(), None
    return check_group(idx, t, model, w, hw, i0, fail, spec)


def _labels(w: WorkloadColumns, hw: HardwareArrays) -> dict:
    """The names of the categorical inputs: {key: (code per point, the name of each code)}."""
    return {"model": (w.model, [m.name for m in w.models]), "hardware": (hw.design, hw.designs),
            "hardware_note": (hw.design, hw.notes),
            "heads_note": (w.model, [m.padding_note for m in w.models]),
            "energy_basis": (hw.name, hw.energy_basis or [""]),
            "host_cpu": (np.maximum(hw.host_cpu, 0), [c.name for c in hw.cpus] or [""]),
            "serving": (w.continuous.astype(np.int64), list(SERVING_MODES)),
            "lengths": (w.lengths, [spec.name for spec in w.length_specs]),
            "engine": (w.engine, [e.name for e in w.engines]),
            "quality_source": (w.quality_source, w.quality_sources)}


def _hold_memory(base: dict, memory_violation: np.ndarray, idx, m: GroupMemory) -> None:
    """Write what a group's points ``idx`` hold in memory (``GroupMemory``) into the plan's
    figures (``base``) and memory violations."""
    base["weights_bytes"][idx] = m.weights_bytes
    base["kv_cache_bytes"][idx] = m.kv_cache_bytes
    base["activation_bytes"][idx] = m.activation_bytes
    base["state_bytes"][idx] = m.state_bytes
    base["memory_bytes"][idx] = m.weights_bytes + m.activation_bytes + m.kv_cache_bytes + m.state_bytes
    base["offloaded_bytes"][idx] = m.offloaded_bytes
    base["engine_reserve_bytes"][idx] = m.reserve_bytes
    base["kv_pool_bytes"][idx] = m.kv_pool_bytes
    base["kv_request_bytes"][idx] = m.kv_request_bytes
    memory_violation[idx] = m.violation


def _economics(cols: Columns) -> dict:
    """The cost-of-serving columns of every point (``COST_COLUMNS``), the cited defaults of
    ``configs/economics.yaml`` where a point leaves one out."""
    defaults = economics_defaults()
    out = {}
    for k in COST_COLUMNS:                 # a column left out is its default for every point: a number
        out[k] = np.where(np.isnan(own := cols.numbers(k)), defaults[k], own) if cols.has(k) else float(defaults[k])
    return out


def evaluate(columns: Mapping, *, ideal: bool = False, explain=False, efficiency=None,
             constraints: dict | None = None, where: str = "columns") -> Evaluation:
    """Evaluate design points given as columns (one entry per point; scalars broadcast).

    ``efficiency``: an Efficiency for every point, one per point, or None (each point's
    hardware class default; ``ideal`` the pure roofline bound). ``explain``: True for
    every point, or the indices of the points whose per-operator tables to keep.
    ``constraints``: {metric: {'min': x, 'max': y}} checked on top of the built-in checks.
    ``where`` names the columns in error messages (a study file's space). Returns an ``Evaluation``."""
    return prepare(columns, constraints=constraints, where=where).run(efficiency=efficiency, ideal=ideal,
                                                                     explain=explain, last=True)


def serving_engine(plan: Plan, i: int, *, efficiency=None, ideal: bool = False) -> ServedPoint:
    """Point ``i`` of a prepared plan as the simulator runs it (``dse.system.served.served_point``):
    every iteration priced as the steady-state model prices it. DseError when the point does not
    exist or is not under continuous batching."""
    pos = i if plan.inverse is None else int(plan.inverse[i])
    for g in plan.groups:
        where = np.flatnonzero(positions(g.index) == pos)
        if len(where):
            return served_point(g, int(where[0]), efficiency=efficiency, ideal=ideal)
    raise DseError(f"design point {i} does not exist")


#: names other modules import from here (each defined in its own module of ``dse.system``)
__all__ = ["evaluate", "prepare", "serving_engine", "ServedPoint", "Plan", "Evaluation", "Reordered", "METRICS",
           "PERCENTILE_METRICS", "EXPLAIN_KEYS", "CHECKS", "MANY_BELOW", "MANY_WORKLOADS", "WorkloadBatch",
           "WorkloadTables"]
