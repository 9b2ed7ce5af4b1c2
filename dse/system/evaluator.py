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
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from basis.errors import DseError
from basis.units import bytes_text
from dse.core.bands import FAMILIES as BAND_FAMILIES
from dse.core.bands import band_for, shipped_bands
from dse.core.efficiency import Efficiency, choose, efficiency_for
from dse.core.engines import Engine, engine_efficiency, get_engine
from dse.core.economics import COST_COLUMNS, economics_defaults
from dse.core.metrics import (cost_per_million_tokens_usd, energy_figures, pipelined_prefill_s, power_demand_w,
                              rates_per_user_and_device, serving_metrics, system_figures)
from dse.core.roofline import (_COL, KEPT, PEAK_COLUMNS, OpArrays, SystemArrays, decode_total_energy_j, decode_total_time,
                               decode_total_work, energy_j, op_costs, step_energy_j, step_time, step_work, transfer_time)
from dse.core.disaggregated import disaggregated_goodput, disaggregated_state
from dse.core.serving import PERCENTILES, Load, Pools, goodput, steady_state
from dse.core.simulator import EngineConfig
from dse.system import reasons as R
from dse.system.columns import Columns, anywhere, constant, group, group_codes, groups_of, per_code, pointwise
from dse.system.hardware import HardwareArrays, assemble
from dse.system.iteration import IterationModel, iteration_model
from dse.system.layout import chip_layouts, chips_required, largest_fitting, parallel_layout
from dse.system.params import MAX_COUNT, DEFAULTS, PARAMS, SERVING_MODES
from dse.system.techniques import TECHNIQUE_COLUMNS, draft_model, pruned_models, quality_columns, technique_columns
from dse.system.workload import (WorkloadBatch, WorkloadTables, footprint_in_batch, resolve_model,
                                 tables, workload_batch)
from workloads.techniques import tokens_per_target_step
from hwmodels.formats import COMPUTE_CLASSES, get_format, matmul_compute_class
from hwmodels.placement import fits_within, parse_policy, place
from hwmodels.presets import DEVICE_CLASSES
from workloads.lengths import FIXED, LengthSpec, parse_lengths
from workloads.model import context_error, context_limit
from workloads import optable
from workloads.optable import kv_heads_per_device

#: what every design point gets (SI units); the first ones are serving metrics
METRICS = ("ttft_s", "tpot_s", "e2e_latency_s", "output_tokens_per_s", "output_tokens_per_s_per_user",
           "output_tokens_per_s_per_device", "prefill_tokens_per_s", "weights_bytes", "kv_cache_bytes",
           "activation_bytes", "memory_bytes", "capacity_bytes", "offloaded_bytes", "devices", "power_w",
           "cost_usd", "system_tdp_w", "power_demand_w", "energy_per_token_j", "tokens_per_joule",
           "cost_per_million_tokens_usd", "die_area_mm2", "build_cost_usd", "batch_used", "tp_used", "pp_used", "chips_required", "requests_per_s", "total_tokens_per_s",
           "queue_s", "running_batch", "kv_utilization",
           *(f"{m}_p{q}_s" for m in ("ttft", "tpot", "e2e_latency") for q in PERCENTILES), "goodput",
           "goodput_per_device", "replicas", "service_devices", "service_cost_usd", "service_power_w", "service_tdp_w",
           *(f"band_{f}_{end}" for f in BAND_FAMILIES for end in ("low", "high")), "tokens_per_target_step",
           "quality_loss")
#: the latency metrics that have percentiles (``ttft_p90_s``, ...)
PERCENTILE_METRICS = ("ttft", "tpot", "e2e_latency")
#: tokens a prefill-first iteration (prefill_chunk 0) may hold, or one whole prompt if longer:
#: the default budget (``dse.system.params``)
UNCHUNKED_BUDGET = float(DEFAULTS["prefill_chunk"])
#: columns of the per-operator explanation (one row per operator of a step)
EXPLAIN_KEYS = ("name", "count", "place", "compute_format", "ops", "weight_bytes", "act_bytes", "kv_bytes",
                "memory_bytes", "comm_bytes", "arithmetic_intensity", "bound", "peak_ops_per_s", "time_s",
                "total_time_s", "share")
#: built-in checks whose violations are kept as numbers (<= 0: satisfied)
CHECKS = ("memory", "support")


# --------------------------------------------------------------------------- the result

class Reordered(Mapping):
    """Metric arrays computed in the evaluator's held order (points grouped by workload),
    each put back in the caller's order when first read (``back``: the held position of
    each caller position): a caller that reads a few metrics of many points does not pay
    for reordering the others. Reading every one (``dict(...)``, ``items()``) reorders all."""

    def __init__(self, held: dict, back: np.ndarray):
        self._held, self._back, self._done = held, back, {}

    def __getitem__(self, name: str) -> np.ndarray:
        v = self._done.get(name)
        if v is None:
            v = self._done[name] = self._held[name][self._back]
        return v

    def __iter__(self):
        return iter(self._held)

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, name) -> bool:
        return name in self._held


def _in_order(a: np.ndarray, back: np.ndarray) -> np.ndarray:
    """``a`` (one entry per point, held order) in the caller's order: ``a[back]``, or ``a`` itself
    where every point holds the same value (the same in any order: no gather of every point)."""
    return a if len(a) and a.min() == a.max() else a[back]


@dataclass
class Evaluation:
    """What ``evaluate`` returns: one entry per design point of every array.

    ``result["tpot_s"]`` (any of METRICS), ``result["feasible"]``, ``result["reason"]`` (an
    integer code, 0 when feasible; ``reason_keys[code]`` names it) and ``violations`` (one
    array per check and per constraint, <= 0 when satisfied). ``explained`` holds the
    per-operator tables of the points asked for (``explain``). A metric that holds one value
    for every point (NaN where nothing models it, an error band of one engine and device)
    is a read-only array; every other is the caller's own to write into."""

    columns: Columns
    metrics: Mapping[str, np.ndarray]        # a dict, or ``Reordered`` (each reordered when read)
    feasible: np.ndarray
    reason: np.ndarray
    violations: dict
    reason_keys: tuple
    efficiency: np.ndarray
    efficiency_names: list
    failed: dict = field(default_factory=dict)
    labels: dict = field(default_factory=dict)
    details: list = field(default_factory=list)
    explained: dict = field(default_factory=dict)
    flash_attention: np.ndarray | None = None   # FlashAttention as run (the default falls back where no buffer)

    def __len__(self) -> int:
        return len(self.feasible)

    def __getitem__(self, name: str) -> np.ndarray:
        if name == "feasible":
            return self.feasible
        if name == "reason":
            return self.reason
        return self.metrics[name]

    def __contains__(self, name: str) -> bool:
        return name in self.metrics or name in ("feasible", "reason")

    def keys(self):
        return (*self.metrics, "feasible", "reason")

    def reason_key(self, i: int) -> str:
        return self.reason_keys[int(self.reason[i])]

    def reason_labels(self):
        """The reason of every point as a pandas Categorical of keys (missing, stored as null,
        when feasible)."""
        import pandas as pd
        codes = self.reason.astype(np.int64)
        used = np.unique(codes[codes != 0])
        cats = [self.reason_keys[c] for c in used]
        return pd.Categorical.from_codes(np.where(codes == 0, -1, np.searchsorted(used, codes)),
                                         dtype=pd.CategoricalDtype(pd.Index(cats, dtype="str")))

    def detail(self, i: int) -> str | None:
        """The words of the check that failed at point ``i``, where the check gave some."""
        for idx, text in self.details:
            if np.any(idx == i):
                return text
        return None

    def point(self, i: int) -> dict:
        """Parameters (as given; ``flash_attention`` as run, ``flash_attention_given`` whether it
        was given; ``serving_name`` the scheduling as run) and resolved layout of point ``i``, and its footprint as text
        (``reasons.SIZE_FIELDS``: '80 GiB', by ``basis.units``) for the reason templates."""
        cols = self.columns
        out = {}
        for k in PARAMS:
            v = cols.raw(k)
            if v is None:
                continue
            v = v if np.ndim(v) == 0 and not hasattr(v, "codes") else np.asarray(v, dtype=object)[i]
            out[k] = v.item() if hasattr(v, "item") else v
        for k, (codes, names) in self.labels.items():
            out[k + "_name"] = names[int(codes[i])]
        trace = parse_lengths(out.get("lengths_name", FIXED))
        if trace.kind == "trace":                 # its means stand for prompt_len and gen_len
            out["prompt_len"], out["gen_len"] = trace.trace_means()
        if self.flash_attention is not None:      # as run: the default is unfused without a buffer
            out["flash_attention"] = bool(self.flash_attention[i])
        out["flash_attention_given"] = cols.has("flash_attention")
        m = self.metrics
        given = {k: cols.numbers(k)[i] for k in ("devices", "tp", "pp")}
        out.update({k + "_given": ("?" if np.isnan(v) else int(v)) for k, v in given.items()})
        out.update(devices=int(m["devices"][i]), tp=int(m["tp_used"][i]), pp=int(m["pp_used"][i]),
                   ep=int(cols.numbers("ep")[i]))
        out.update({k: bytes_text(m[v][i]) for k, v in R.SIZE_FIELDS.items()})
        out["format"] = matmul_compute_class(get_format(str(out.get("activations", "fp16"))),
                                             get_format(str(out.get("weights", "fp16"))))
        return out

    def reason_text(self, i: int) -> str:
        """Why point ``i`` is infeasible, in words ('' when feasible)."""
        return R.describe(self.reason_key(i), self.point(i), self.detail(i))

    def efficiency_name(self, i: int) -> str:
        return self.efficiency_names[int(self.efficiency[i])]

    def to_frame(self):
        """A pandas DataFrame: the parameters given, every metric, feasible and reason (keys)."""
        import pandas as pd
        df = pd.DataFrame(index=np.arange(len(self)))
        for k, v in self.columns.given.items():
            df[k] = v if np.ndim(v) or hasattr(v, "codes") else [v] * len(self) if not np.isscalar(v) else v
        for k, v in self.metrics.items():
            df[k] = v
        df["feasible"] = self.feasible
        df["reason"] = self.reason_labels()
        return df


# --------------------------------------------------------------------------- the plan

@dataclass
class _Group:
    """Points of one workload on one hardware class, ready for the kernel."""

    index: np.ndarray             # positions of the points in the caller's order
    tables: WorkloadTables | None
    system: SystemArrays | None
    device_class: str
    cpu: dict | None = None       # CPU layer split: share, CPU system, hop bytes and host link
    serving: dict | None = None   # continuous batching: iteration model and per-point load arrays
    family: str = ""              # the efficiency family (``dse.core.efficiency.family_of``)
    engine: Engine | None = None  # the serving-engine profile the points run
    kv_group: float = 1.0         # query heads per K/V head on one device (per-head K/V reads)
    spec: dict | None = None      # speculative decoding (``_speculation``)

    def efficiency(self, given: Efficiency | None, ideal: bool) -> Efficiency:
        """The Efficiency of these points: IDEAL, the one given, or their family's default under
        their engine (``dse.core.engines.engine_efficiency``)."""
        if ideal or given is not None:
            return choose(self.family, given, ideal)
        return engine_efficiency(efficiency_for(self.family), self.engine, self.kv_group)


class Plan:
    """Design points prepared for pricing: ``run(efficiency)`` evaluates them."""

    def __init__(self, cols: Columns, hw: HardwareArrays, groups: list[_Group], base: dict, fails: dict,
                 memory_violation: np.ndarray, details: list, constraints: dict | None, labels: dict,
                 order: np.ndarray | None, flash: np.ndarray | None = None, economics: dict | None = None):
        # the points are held sorted by group (``order``: caller position of each sorted one)
        self.columns, self.hw, self.groups, self.labels = cols, hw, groups, labels
        self.order = order
        self.flash = flash            # FlashAttention as run per point (held order)
        self.economics = economics or {}   # the cost-of-serving columns (arrays in held order, or numbers)
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
        want = _explain_set(explain, n)
        if want is not None and self.inverse is not None:
            want = self.inverse[want]
        explained = {}
        resolved = {}          # the Efficiency of each (family, engine, ...) met: one lookup per run
        for g in self.groups:
            if g.tables is None:
                continue
            parts = [(g.index, efficiency)] if not per_row else _by_efficiency(g.index, efficiency)
            for idx, e in parts:
                key = (g.family, id(g.engine), g.kv_group, id(e), ideal)
                eff = resolved[key] if key in resolved else resolved.setdefault(key, _interned(g.efficiency(e, ideal)))
                if eff.name not in eff_names:
                    eff_names.append(eff.name)
                eff_code[idx] = eff_names.index(eff.name)
                sub = g if idx is g.index else _subgroup(g, idx)
                metrics = _price_many(sub, eff, e, ideal) if isinstance(sub.tables, WorkloadBatch) else \
                    _price(sub, eff, e, ideal)
                saturated[idx] = metrics.pop("saturated", False)
                slo_missed[idx] = metrics.pop("slo_missed", False)
                over_tdp[idx] = metrics.pop("over_tdp", False)
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
                written.append((idx, metrics.keys()))
                positions = _positions(idx)
                for j in np.flatnonzero(np.isin(positions, want)) if want is not None else ():
                    p = int(positions[j])
                    one, k = (_one_workload(sub, j), 0) if isinstance(sub.tables, WorkloadBatch) else (sub, j)
                    explained[p if self.order is None else int(self.order[p])] = _explain(one, k, eff, e, ideal,
                                                                                        self.hw, p)
        _unwritten_nan(out, written, set(base), n)
        nan = np.full(n, np.nan)
        nan.flags.writeable = False            # one read-only array for every metric no group wrote
        out = {k: out[k] if k in out else nan for k in METRICS}
        self._cost_of_serving(out)
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
        reason = np.zeros(n, dtype=np.int16)
        for code in sorted(fails, key=R.rank, reverse=True):     # the first check failed, written last
            reason[fails[code]] = code
        labels, details, flash = self.labels, self.details, self.flash
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


    def _cost_of_serving(self, out: dict) -> None:
        """``cost_per_million_tokens_usd`` of every point (held order): the system's price over its
        amortization, and its electricity (``power_w`` serving, static power idle), over the
        output tokens it serves (``dse.core.metrics.cost_per_million_tokens_usd``)."""
        idle = self.hw.system.static_w * out["devices"] if self.hw.system.static_w is not None else np.nan
        out["cost_per_million_tokens_usd"] = cost_per_million_tokens_usd(
            out["cost_usd"], out["power_w"], idle, out["output_tokens_per_s"], **self.economics)

    def _bands(self, out: dict) -> None:
        """The error band of every point's default prediction (``dse.core.bands``: factors on the
        predicted value, from the calibration's cross-validated residuals of its engine, vendor
        and metric family), held order."""
        bands = shipped_bands()
        if not bands:
            return
        engine, names = self.labels["engine"]
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


def _explain_set(explain, n: int):
    if explain is False or explain is None:
        return None
    if explain is True:
        return np.arange(n)
    return np.asarray(list(explain), dtype=np.int64)


def _positions(index) -> np.ndarray:
    """The positions a slice or an index array selects."""
    return np.arange(index.start, index.stop) if isinstance(index, slice) else np.asarray(index)


def _by_efficiency(index, effs: Sequence):
    """Split a group's points by their own Efficiency (per-row efficiencies)."""
    keys: dict[int, list] = {}
    for i in _positions(index):
        keys.setdefault(id(effs[i]), []).append(i)
    return [(np.array(v, dtype=np.int64), effs[v[0]]) for v in keys.values()]


def _subgroup(g: _Group, idx: np.ndarray) -> _Group:
    """The points ``idx`` (positions) of group ``g``."""
    pos = idx - _positions(g.index)[0]
    cpu = None if g.cpu is None else {**g.cpu, "system": g.cpu["system"].take(pos),
                                      "host_bw": g.cpu["host_bw"][pos], "host_lat": g.cpu["host_lat"][pos]}
    serving = None if g.serving is None else {k: (v[pos] if isinstance(v, np.ndarray) else v)
                                              for k, v in g.serving.items()}
    t = g.tables.take(pos) if isinstance(g.tables, WorkloadBatch) else g.tables
    return _Group(idx, t, g.system.take(pos), g.device_class, cpu, serving, g.family, g.engine, g.kv_group)


def _one_workload(g: _Group, j: int) -> _Group:
    """The j-th point of a group of many workloads (``WorkloadBatch``), as a group of its own."""
    at = np.array([j])
    return replace(g, index=_positions(g.index)[at], tables=g.tables.one(j), system=g.system.take(at))


def _constraint_items(constraints: dict):
    for metric, bound in constraints.items():
        for sense, limit in bound.items():
            yield metric, (sense, float(limit))


# --------------------------------------------------------------------------- pricing

def _cpu_efficiency(given, ideal: bool) -> Efficiency:
    return choose("cpu", given, ideal)


def _price_many(g: _Group, eff: Efficiency, given, ideal: bool) -> dict:
    """``_price`` of a group of many workloads (``WorkloadBatch``), its tables built and priced
    a block of points at a time (``WorkloadBatch.blocks``)."""
    parts = []
    for rows in g.tables.blocks():
        part = replace(g, tables=g.tables.tables(rows), system=g.system.take(rows))
        parts.append(_price(part, eff, given, ideal))
    return parts[0] if len(parts) == 1 else {k: np.concatenate([np.broadcast_to(p[k], (len(p["ttft_s"]),))
                                                               for p in parts]) for k in parts[0]}


def _price(g: _Group, eff: Efficiency, given, ideal: bool) -> dict:
    """Serving metrics of a group's points (arrays)."""
    if g.serving is not None:
        return _price_continuous(g, eff)
    t, sys, sc = g.tables, g.system, g.tables.scenario
    n_steps = np.maximum(sc.gen_len - 1, 1)
    steps = np.full(sys.size, n_steps, dtype=float)
    pieces = [(d0, slope, np.asarray(n, dtype=float)) for d0, slope, n in t.decode_steps(n_steps)]
    per_step = np.ones(sys.size)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if g.spec is not None:
            prefill, decode, per_step = _speculative(g, eff)
        elif g.cpu is None:
            prefill = pipelined_prefill_s(step_time(t.prefill, sys, eff), sc.micro_batches, sc.pp)
            decode = sum(decode_total_time(d0, slope, n, sys, eff) for d0, slope, n in pieces)
        else:
            c = g.cpu
            ceff = _cpu_efficiency(given, ideal)
            dev_pre, cpu_pre = _split_counts(t.prefill, t.layer_ops, c["share"])
            hop = [2 * transfer_time(b, c["host_bw"], c["host_lat"], eff) for b in (c["hop_prefill"], c["hop_decode"])]
            prefill = (step_time(dev_pre, sys, eff) + step_time(cpu_pre, c["system"], ceff)
                       - ceff.step_overhead_s + hop[0])
            decode = 0.0
            for d0, slope, n in pieces:
                dev_d0, cpu_d0 = _split_counts(d0, t.layer_ops, c["share"])
                decode = decode + (decode_total_time(dev_d0, slope, n, sys, eff)
                                   + decode_total_time(cpu_d0, slope, n, c["system"], ceff))
            decode = decode - ceff.step_overhead_s * steps + hop[1] * steps
        out = serving_metrics(prefill, decode, sc.batch, sc.prompt_len, sc.gen_len, sc.devices,
                              overlap=eff.prefill_decode_overlap, request_overhead_s=eff.request_overhead_s)
    # a static batch's sequences start, and end, together: every percentile is the mean
    out.update({f"{m}_p{q}_s": out[f"{m}_s"] for m in PERCENTILE_METRICS for q in PERCENTILES})
    out["tokens_per_target_step"] = per_step
    (e_pre, e_dec), (f_pre, f_dec) = _run_energy(g, sys, _measured_only(sys))
    out.update(_energy(e_pre + e_dec, out["e2e_latency_s"], np.asarray(sc.batch, dtype=float) * sc.gen_len,
                       sc.devices, sys,
                       [(f_pre, prefill), (f_dec, decode)]))
    return out


def _measured_only(sys: SystemArrays) -> SystemArrays:
    """``sys`` with the work of compute classes that have no measured J/op of their own charged
    nothing (``SystemArrays.energy_op_floor_j``): the power a design needs at least."""
    return sys if sys.energy_op_floor_j is None else sys.replaced(energy_op_j=sys.energy_op_floor_j)


def _run_energy(g: _Group, *systems: SystemArrays) -> list[tuple[np.ndarray, np.ndarray]]:
    """Dynamic energy (J, [P]) of a static batch's prefill and of its whole decode on all its
    devices, on each of ``systems`` (the group's points, with the J/op of each, the work counted
    once for all): the tables are one tp rank's share of the whole model for one micro-batch, so
    each step counts tp x (micro-batches for the prefill) times. Under speculative decoding the
    rounds as ``_speculative`` prices them (the draft on its own tp ranks); layers on the CPU: NaN
    (no CPU has a measured energy profile)."""
    t, sc, spec = g.tables, g.tables.scenario, g.spec
    n_steps = np.maximum(sc.gen_len - 1, 1)
    if g.cpu is not None:
        nan = np.full(g.system.size, np.nan)
        return [(nan, nan) for _ in systems]
    if spec is not None:
        return [_speculative_energy(g, sys, n_steps) for sys in systems]
    prefill = step_work(t.prefill)
    decode = [decode_total_work(d0, slope, n) for d0, slope, n in t.decode_steps(n_steps)]
    return [(sc.tp * sc.micro_batches * energy_j(prefill, sys), sc.tp * sum(energy_j(w, sys) for w in decode))
            for sys in systems]


def _speculative_energy(g: _Group, sys: SystemArrays, n_steps) -> tuple[np.ndarray, np.ndarray]:
    """``_run_energy`` of a group under speculative decoding, on ``sys``."""
    t, sc, spec = g.tables, g.tables.scenario, g.spec
    e_pre = sc.tp * sc.micro_batches * step_energy_j(t.prefill, sys)
    dsys = sys.replaced(tp=np.full(sys.size, spec["tp"]))
    e = tokens_per_target_step(spec["acceptance"], spec["drafted"])
    parts = [(t, sys, 1, sc.tp)]
    if spec["tables"] is not None:
        e_pre = e_pre + spec["tp"] * step_energy_j(spec["tables"].prefill, dsys)
        parts.append((spec["tables"], dsys, spec["drafted"], spec["tp"]))
    e_dec = 0.0
    for tab, on, times, ranks in parts:
        for d0, slope, n in tab.decode_steps(n_steps):
            e_dec = e_dec + times * ranks * decode_total_energy_j(d0, slope.times(e), np.full(sys.size, n / e), on)
    if spec["heads"] is not None:
        e_dec = e_dec + spec["tp"] * step_energy_j(spec["heads"], dsys) * (n_steps / e)
    return e_pre, e_dec


def _energy(dynamic_j, seconds, tokens, devices, sys: SystemArrays, phases) -> dict:
    """Energy per token, average power, tokens per joule and the power demand of a run (or one
    second of a steady state) of a group's points, with ``over_tdp`` where a device would need
    more than its TDP in some phase (``phases``: the dynamic energy and seconds of each, the energy
    counted with ``_measured_only``, so the demand is one the design cannot avoid; work in a class
    without a measured J/op of its own, such as FP8 on Hopper, is charged at a wider class's J/op
    in the energy reported, an upper bound, but nothing in this check): such a design is infeasible (reason ``power``), not throttled,
    since no published voltage-frequency curve says how much slower it would run. The check
    applies to predictions (calibrated or given efficiencies), not to the ideal roofline, which
    bounds speed and may ask for more power than the chip has."""
    static = sys.static_w if sys.static_w is not None else np.full(sys.size, np.nan)
    out = energy_figures(dynamic_j, seconds, tokens, devices, static)
    del out["energy_j"]
    demand = power_demand_w(phases, devices, static)
    out["power_demand_w"] = np.where(np.isnan(dynamic_j), np.nan, demand)
    tdp = sys.tdp_w if sys.tdp_w is not None else np.full(sys.size, np.nan)
    return {**out, "over_tdp": out["power_demand_w"] > tdp}


def _speculative(g: _Group, eff: Efficiency) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(prefill, decode time, tokens per target step) of a static batch under speculative
    decoding, seconds, [P]. Each round drafts g tokens (g steps of the draft) and verifies g + 1 in
    one target step (the target's decode tables carry g + 1 query tokens per sequence), yielding
    E = (1 - a^(g+1)) / (1 - a) tokens (``tokens_per_target_step``); the gen_len - 1 decoded tokens
    take (gen_len - 1) / E rounds, the context growing by E tokens a round (each affine piece of the
    decode priced over its rounds in closed form). A draft model prefills the prompts too; Medusa
    heads draft their g tokens in one pass a round, the target verifying ``spec_tokens`` + 1
    candidates (a tree)."""
    t, sys, sc, spec = g.tables, g.system, g.tables.scenario, g.spec
    dsys = sys.replaced(tp=np.full(sys.size, spec["tp"]))
    e = tokens_per_target_step(spec["acceptance"], spec["drafted"])
    n_steps = max(sc.gen_len - 1, 1)
    prefill = pipelined_prefill_s(step_time(t.prefill, sys, eff), sc.micro_batches, sc.pp)
    parts = [(t, sys, 1)]
    if spec["tables"] is not None:
        prefill = prefill + step_time(spec["tables"].prefill, dsys, eff)
        parts.append((spec["tables"], dsys, spec["drafted"]))
    decode = 0.0
    for tab, on, times in parts:
        for d0, slope, n in tab.decode_steps(n_steps):
            decode = decode + times * decode_total_time(d0, slope.times(e), np.full(sys.size, n / e), on, eff)
    if spec["heads"] is not None:
        decode = decode + step_time(spec["heads"], dsys, eff) * (n_steps / e)
    return prefill, decode, np.full(sys.size, e)


def _price_continuous(g: _Group, eff: Efficiency) -> dict:
    """Serving metrics of a group's points under in-flight batching (``dse.core.serving``):
    every iteration priced by the roofline (``step_time`` of the IterationModel's arrays)."""
    s = g.serving
    spec = s.get("speculation")
    pricer = _iteration_pricer if spec is None else _speculative_pricer(spec)
    iteration_time = pricer(s["iteration"], g.system, eff)
    load = _load(s, g.system, eff)
    pooled = load.pools is not None
    out = (disaggregated_state if pooled else steady_state)(load, iteration_time)
    e = 1.0 if spec is None else spec["e"]
    if spec is not None:                       # a round of E tokens stood for one token: back to tokens
        out["tpot_s"] = out["tpot_s"] / e
        out.update({f"tpot_p{q}_s": out[f"tpot_p{q}_s"] / e for q in PERCENTILES})
        out["output_tokens_per_s"] = out["requests_per_s"] * spec["mean_gen"]
        out["total_tokens_per_s"] = out["requests_per_s"] * (spec["mean_gen"] + load.lengths.mean_prompt)
    late = eff.request_overhead_s              # the engine's per-request overhead delays the first token
    slo = (s["slo_ttft"] > 0) | (s["slo_tpot"] > 0)
    good = np.full(len(slo), np.nan)
    if slo.any():
        at = np.flatnonzero(slo)
        good[at] = (disaggregated_goodput if pooled else goodput)(
                           load.take(at), pricer(s["iteration"], g.system.take(at), eff),
                           np.where(s["slo_ttft"][at] > 0, np.maximum(s["slo_ttft"][at] - late, 1e-300), 0.0),
                           s["slo_tpot"][at] * e, s["slo_percentile"][at])
    out_tps = out["output_tokens_per_s"]
    energy = _serving_energy(g, s, out, load, spec is not None or pooled)
    return {**energy, "ttft_s": out["ttft_s"] + late, "tpot_s": out["tpot_s"], "e2e_latency_s": out["e2e_latency_s"] + late,
            **{f"{m}_p{q}_s": out[f"{m}_p{q}_s"] + (late if m != "tpot" else 0.0)
               for m in PERCENTILE_METRICS for q in PERCENTILES},
            **rates_per_user_and_device(out_tps, out["tpot_s"], s["devices"]),
            "prefill_tokens_per_s": out["requests_per_s"] * load.lengths.mean_prompt,
            "requests_per_s": out["requests_per_s"], "total_tokens_per_s": out["total_tokens_per_s"],
            "queue_s": out["queue_s"], "running_batch": out["running_batch"],
            "kv_utilization": out["kv_utilization"], "batch_used": np.round(out["running_batch"]),
            "goodput": good, "replicas": _replicas(s["target_rate"], good), "saturated": out["saturated"],
            "tokens_per_target_step": np.full(len(slo), e),
            "slo_missed": (s["target_rate"] > 0) & (good <= 0)}


def _serving_energy(g: _Group, s: dict, out: dict, load: Load, unmodelled: bool) -> dict:
    """Energy figures of one second of a steady state (``_energy``): the dynamic energy of the
    mean iteration (``running_batch`` decoding sequences over the mean prompt plus half the mean
    output, and the prompt tokens of the requests that arrive during it, over half their prompt)
    times the iterations a second (one a TPOT), on each of the tp ranks; every amount of an
    iteration is affine in these counts, so the mean iteration carries the mean energy. Speculative
    and disaggregated engines are left out (NaN): their iterations are not one model's."""
    n = len(out["tpot_s"])
    if unmodelled:
        nan = np.full(n, np.nan)
        return {"energy_per_token_j": nan, "power_w": nan, "tokens_per_joule": nan, "power_demand_w": nan,
                "over_tdp": np.zeros(n, dtype=bool)}
    prompt, gen = load.lengths.mean_prompt, load.lengths.mean_gen
    b, tpot = out["running_batch"], out["tpot_s"]
    arrivals = out["requests_per_s"] * tpot                      # prompts finished an iteration
    chunk = arrivals * prompt
    with np.errstate(invalid="ignore"):
        ops = s["iteration"].arrays(b, b * (prompt + gen / 2.0), chunk, chunk * prompt / 2.0, arrivals)
        dynamic = g.tables.scenario.tp * step_energy_j(ops, g.system) / tpot
        floor = g.tables.scenario.tp * step_energy_j(ops, _measured_only(g.system)) / tpot
    one = np.ones(n)
    return _energy(dynamic, one, out["output_tokens_per_s"], s["devices"], g.system, [(floor, one)])


def _replicas(target_rate, good) -> np.ndarray:
    """Engines a service of ``target_rate`` requests/s needs at ``good`` requests/s each
    (NaN without a target; infinite where no rate meets the SLOs)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(target_rate > 0, np.where(good > 0, np.ceil(target_rate / good), np.inf), np.nan)


def _speculative_pricer(spec: dict):
    """An iteration pricer (as ``_iteration_pricer``) of an engine decoding speculatively: the
    target's iteration verifying g + 1 tokens of each decoding sequence (its IterationModel
    carries them), then the draft's g decode steps over the same sequences, the first with the
    iteration's prompt chunks (the draft prefills them too), on the draft's devices."""
    def make(model: IterationModel, sys: SystemArrays, eff: Efficiency):
        target = _iteration_pricer(model, sys, eff)
        draft = _iteration_pricer(spec["draft"], sys.replaced(tp=np.full(sys.size, spec["tp"])), eff)

        def iteration_time(d, dctx, c, pctx, seqs, rows):
            zero = np.zeros_like(np.asarray(c, dtype=float))
            return (target(d, dctx, c, pctx, seqs, rows) + draft(d, dctx, c, pctx, seqs, rows)
                    + (spec["drafted"] - 1) * draft(d, dctx, zero, zero, zero, rows))
        return iteration_time
    return make


def _iteration_pricer(model: IterationModel, sys: SystemArrays, eff: Efficiency):
    """The iteration time of a group's points (``dse.core.serving.IterationTime``): the roofline's
    step time of the IterationModel's arrays, each entry on its design point's system."""
    def iteration_time(d, dctx, c, pctx, seqs, rows):
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return step_time(model.arrays(d, dctx, c, pctx, seqs), sys.take(rows), eff)
    return iteration_time


def _kv_link(sys: SystemArrays, eff: Efficiency):
    """Seconds to send messages of ``nbytes`` [A, K] from each point ``rows`` [A] to another
    device over its scale-up link (``transfer_time``): a prefill instance's KV cache to a decode one."""
    def transfer(nbytes, rows):
        return transfer_time(nbytes, sys.link_bandwidth[rows][:, None], sys.link_latency[rows][:, None], eff)
    return transfer


def _load(s: dict, sys: SystemArrays, eff: Efficiency) -> Load:
    """The serving Load of a group's continuous-batching inputs (disaggregated: its pools, the
    KV cache sent over each point's scale-up link as one message per request)."""
    pools = None
    if "pools" in s:
        prefill, decode, kv_token_bytes = s["pools"]
        pools = Pools(prefill, decode, np.broadcast_to(kv_token_bytes, prefill.shape).astype(float), _kv_link(sys, eff))
    return Load(s["lengths"], s["kv_blocks"], s["kv_block"], s["budget"], s["max_running"], s["concurrency"],
                s["request_rate"], s["chunked"], s["prefix_tokens"], pools)


@dataclass(frozen=True)
class ServedPoint:
    """A continuous-batching design point as the simulator runs it: ``step`` (seconds of one
    iteration: decode tokens, their keys, prompt tokens, their keys, prompts finished),
    ``engine`` (EngineConfig), ``lengths`` (the LengthSpec to draw requests from) with mean
    ``prompt_len`` and ``gen_len`` and at most ``max_tokens`` in all, ``concurrency`` or
    ``request_rate`` (the other None) and ``request_overhead_s`` (seconds); disaggregated:
    ``pools`` (prefill instances, decode instances) and ``transfer_s`` (seconds to send the
    KV cache of a prompt of that many tokens, its cached prefix excepted), else None."""

    step: object
    engine: EngineConfig
    lengths: LengthSpec
    prompt_len: int
    gen_len: int
    max_tokens: float
    concurrency: int | None
    request_rate: float | None
    request_overhead_s: float
    pools: tuple[int, int] | None = None
    transfer_s: object = None


def serving_engine(plan: Plan, i: int, *, efficiency=None, ideal: bool = False) -> ServedPoint:
    """Point ``i`` of a prepared plan as the simulator runs it (``ServedPoint``), every
    iteration priced as the steady-state model prices it. DseError when the point is not
    under continuous batching."""
    pos = i if plan.inverse is None else int(plan.inverse[i])
    for g in plan.groups:
        where = np.flatnonzero(_positions(g.index) == pos)
        if len(where):
            break
    else:
        raise DseError(f"design point {i} does not exist")
    if g.tables is None or g.serving is None:
        raise DseError("simulating needs a runnable point under continuous batching (give a concurrency or a "
                       "request rate)")
    if "speculation" in g.serving:
        raise DseError("simulate: the simulator runs one token per decoding sequence an iteration; speculative "
                       "decoding is priced by the steady-state model only")
    j = int(where[0])
    eff = g.efficiency(efficiency, ideal)
    s, sc = g.serving, g.tables.scenario
    price = _iteration_pricer(s["iteration"], g.system.take(np.array([j])), eff)
    one = np.zeros(1, dtype=np.int64)

    def step(d, dctx, c, pctx, ends) -> float:
        return float(price(*(np.array([float(x)]) for x in (d, dctx, c, pctx, ends)), one)[0])

    engine = EngineConfig(kv_blocks=max(int(s["kv_blocks"][j]), 1), kv_block=int(s["kv_block"][j]),
                          token_budget=int(s["budget"][j]), max_running=int(s["max_running"][j]),
                          chunked=bool(s["chunked"][j]),
                          prefix_tokens=int(s["prefix_tokens"][j]))
    conc, rate = s["concurrency"][j], s["request_rate"][j]
    pools = transfer_s = None
    if "pools" in s:
        prefill, decode, kv_token_bytes = s["pools"]
        pools = (int(prefill[j]), int(decode[j]))
        per_token = float(np.broadcast_to(kv_token_bytes, prefill.shape)[j])
        link = _kv_link(g.system.take(np.array([j])), eff)

        def transfer_s(prompt: int) -> float:
            sent = prompt - engine.cached_tokens(prompt)
            return float(link(np.array([[per_token * sent]]), one)[0, 0])
    return ServedPoint(step, engine, s["spec"], sc.prompt_len, sc.gen_len, s["max_tokens"],
                       None if np.isnan(conc) else int(conc), None if np.isnan(rate) else float(rate),
                       eff.request_overhead_s, pools, transfer_s)


def _split_counts(op, layer_ops: np.ndarray, share: float):
    """(accelerator part, CPU part) of a step when ``share`` of the layers run on the CPU:
    per-layer operators split in proportion, the others stay on the accelerator."""
    cpu = np.where(layer_ops, op.count * share, 0.0)
    return replace(op, count=op.count - cpu), replace(op, count=cpu)


def _explain(g: _Group, j: int, eff: Efficiency, given, ideal: bool, hw: HardwareArrays, point: int) -> dict:
    """Per-operator rows of the prefill and of one decode step of the group's j-th point."""
    t = g.tables
    one = g.system.take(np.array([j]))
    used = hw.used(point)
    stages = {}
    for stage, op, table in (("prefill", t.prefill, t.prefill_table), ("decode", t.decode, t.decode_table)):
        if g.cpu is None:
            stages[stage] = _rows(op, table, one, eff, used, "device", op.count)
        else:
            ceff = _cpu_efficiency(given, ideal)
            cpu_sys = g.cpu["system"].take(np.array([j]))
            dev, cpu = _split_counts(op, t.layer_ops, g.cpu["share"])
            cpu_used = g.cpu["used"]
            rows = (_rows(op, table, one, eff, used, "device", dev.count)
                    + _rows(op, table, cpu_sys, ceff, cpu_used, "cpu", cpu.count))
            stages[stage] = [r for r in rows if r["count"] > 0]
    return {**stages, "memory_bandwidth": float(one.bandwidth[0])}


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


# --------------------------------------------------------------------------- preparing

def prepare(columns: Mapping, *, constraints: dict | None = None, where: str = "columns") -> Plan:
    """Assemble, lay out, size and check every design point of ``columns`` (see the module
    docstring); DseError for an unknown name or an invalid value, naming the column."""
    cols = columns if isinstance(columns, Columns) else Columns(columns, where)
    original = cols
    n = cols.n
    # points that share a workload are put side by side first (from the columns as given), so
    # that every group is a slice; batch: max and chip sizing may split groups further below
    held = _workload_order(cols)
    if held is not None:
        cols = cols.take(held)
    hw = assemble(cols)
    w = _workload_columns(cols, hw)
    fails: dict[int, np.ndarray] = {}
    details: list = []

    def fail(code: str, index, detail: str | None = None):
        """Points ``index`` fail the check ``code``: positions, or (a slice, a mask over it; no
        ``detail``)."""
        if isinstance(index, tuple):
            fails.setdefault(R.CODE[code], []).append(index)
            return
        index = np.asarray(index, dtype=np.int64)
        if len(index):
            fails.setdefault(R.CODE[code], []).append(index)
            if detail:
                details.append((index, detail))

    lay_devices, lay_tp, pooled = _pool_layout(w, fail)
    tp, pp, valid = parallel_layout(lay_devices, lay_tp, w["pp"], w["ep"])
    fail("layout", np.flatnonzero(~valid))
    sized = hw.spatial & np.isnan(w["devices"]) & np.isnan(w["tp"]) & np.isnan(w["pp"])
    chips = np.full(n, np.nan)
    if sized.any():
        tp, pp = tp.copy(), pp.copy()            # (one value for every point: written per point here)
        _size_chips(w, hw, sized, tp, pp, chips, fail)
    batch = w["batch"].copy()
    if w["batch_max"].any():
        _max_batch(w, hw, tp, pp, batch, fail)
    cpu_layers = w["cpu_layers"]
    devices = np.where(w["disaggregated"], pooled, tp * pp * w["ep"])

    key = [w["model"], batch, w["prompt"], w["gen"], w["weights"], w["activations"], w["kv"], tp, pp, w["ep"],
           w["flash"], pointwise(np.where, w["flash"], hw.buffer, 0.0), w["policy"], w["overlap"], w["sparse"], cpu_layers, w["max_context"], hw.host_cpu, hw.device_class,
           hw.family, w["engine"], w["continuous"], pointwise(np.where, w["continuous"], w["prefill_chunk"], 0.0), w["lengths"], w["disaggregated"],
           w["tech"], w["draft"], w["spec_acceptance"]]
    inv, order, starts = group(key, n)
    workload = inv                      # each point's workload (the points of a group of many each read theirs)
    many = _many_workloads(per_code(np.diff(starts), inv), w, cpu_layers)
    if many.any():                      # one group for the workloads differing only in batch and lengths
        many, (inv, order, starts) = _together(key, many, (inv, order, starts))
    if np.all(order[1:] > order[:-1]):
        order = held                    # already in group order
    else:                               # hold the points in group order: every group a slice (views)
        inverse = np.empty_like(order)
        inverse[order] = np.arange(n)
        cols = cols.take(order)
        hw = assemble(cols)
        w = _workload_columns(cols, hw)
        tp, pp, batch, chips, devices = tp[order], pp[order], batch[order], chips[order], devices[order]
        cpu_layers, many, workload = w["cpu_layers"], many[order], workload[order]
        for c, parts in fails.items():
            parts[:] = [inverse[p] for p in parts]
        details[:] = [(inverse[idx], text) for idx, text in details]
        order = order if held is None else held[order]
    memory_violation = np.full(n, np.inf)
    base = {"devices": devices, "batch_used": batch, "tp_used": tp, "pp_used": pp, "chips_required": chips,
            "capacity_bytes": hw.system.capacity.copy(), "quality_loss": w["quality_loss"],
            **{k: np.full(n, np.nan) for k in (
                "weights_bytes", "kv_cache_bytes", "activation_bytes", "memory_bytes", "offloaded_bytes")}}
    base.update(system_figures(devices, hw.tdp_w, hw.price_usd))
    base.update(die_area_mm2=hw.die_area_m2 * 1e6, build_cost_usd=devices * hw.build_cost_usd)
    groups = []
    for g in range(len(starts) - 1):
        idx = slice(int(starts[g]), int(starts[g + 1]))
        i0 = idx.start
        model = w["models"][w["model"][i0]]
        names = {k: str(w[k + "_names"][w[k][i0]]) for k in ("weights", "activations", "kv")}
        if w["flash"][i0] and not hw.buffer[i0] > 0:
            fail("onchip_buffer", _positions(idx))
            groups.append(_Group(idx, None, None, DEVICE_CLASSES[hw.device_class[i0]], family=hw.families[hw.family[i0]],
                                 engine=w["engines"][w["engine"][i0]]))
            continue
        tech = w["techniques"][w["tech"][i0]]
        layout = (names["weights"], names["activations"], names["kv"], int(tp[i0]), int(pp[i0]), int(w["ep"][i0]),
                  bool(w["flash"][i0]), float(hw.buffer[i0]) if w["flash"][i0] else 0.0, tech)
        try:
            if many[i0]:
                t, spec = workload_batch(model, batch[idx], w["prompt"][idx], w["gen"][idx], *layout,
                                         workload=workload[idx]), None
            else:
                t = tables(model, int(batch[i0]), int(w["prompt"][i0]), int(w["gen"][i0]), *layout)
                spec = _speculation(t, model, w, i0, float(hw.buffer[i0]) if w["flash"][i0] else 0.0)
        except DseError as e:
            fail("model_split", _positions(idx), str(e))
            groups.append(_Group(idx, None, None, DEVICE_CLASSES[hw.device_class[i0]], family=hw.families[hw.family[i0]],
                                 engine=w["engines"][w["engine"][i0]]))
            continue
        groups.append(_check_group(idx, t, model, w, hw, i0, fail, n, base, memory_violation, spec))
    labels = {"model": (w["model"], [m.name for m in w["models"]]), "hardware": (hw.name, hw.names),
              "host_cpu": (np.maximum(hw.host_cpu, 0), [c.name for c in hw.cpus] or [""]),
              "serving": (w["continuous"].astype(np.int64), list(SERVING_MODES)),
              "lengths": (w["lengths"], [spec.name for spec in w["length_specs"]]),
              "engine": (w["engine"], [e.name for e in w["engines"]]),
              "quality_source": (w["quality_source"], w["quality_sources"])}
    return Plan(original, hw, groups, base, fails, memory_violation,
                details, constraints, labels, order, w["flash"], _economics(cols))


def _economics(cols: Columns) -> dict:
    """The cost-of-serving columns of every point (``COST_COLUMNS``), the cited defaults of
    ``configs/economics.yaml`` where a point leaves one out."""
    defaults = economics_defaults()
    out = {}
    for k in COST_COLUMNS:                 # a column left out is its default for every point: a number
        out[k] = np.where(np.isnan(own := cols.numbers(k)), defaults[k], own) if cols.has(k) else float(defaults[k])
    return out


#: a workload shared by fewer design points than this is priced with the others that differ from it
#: only in batch and lengths (``_many_workloads``), not one call per workload. A workload's own group
#: costs ~0.5-0.75 ms of Python however few its points, then ~0.2 us a point; priced with the others,
#: a point costs ~0.3 us where the workloads are each shared by 8 points or more (one operator table
#: per distinct workload, ``roofline.Stacked``), ~1.6 us where nearly every point is its own (tables of
#: [points, operators]). Measured crossover, Llama-2-70B on an H100 template: between 3,906 and 7,812
#: points a workload for 2.5 x 10^5 and 10^6 points (77 against 83 ms, 300-308 against 315-325 ms at
#: 3,906), about 4,096 for 65,536 (``benchmarks/bench_workloads.py --shared``: 23 against 21 ms); at
#: 1,953 points a workload the groups take 1.4-1.5x as long
MANY_BELOW = 4096


#: a group of points priced together (``_together``) holding fewer workloads than this is priced one
#: workload at a time: pricing together costs ~6 ms a group however small (one block of tables,
#: priced at [points, operators]), a workload's own group ~0.6-0.75 ms, or ~3 ms when its tables are
#: built first. One workload of one point: 2.5 ms alone against 5.5 ms together (tables kept),
#: 5.7 against 9.3 ms (tables built); four new workloads of one point: 13.6 ms alone, 5.8 together
MANY_WORKLOADS = 2


def _together(key: list, many: np.ndarray, workloads: tuple) -> tuple[np.ndarray, tuple]:
    """(the points priced together, the groups of all points (``group``)) when the points ``many``
    are grouped by the workload ``key`` without its batch, prompt and generated lengths
    (``key[1:4]``): a group of fewer than ``MANY_WORKLOADS`` workloads goes back to one group per
    workload. ``workloads``: the points grouped by the whole ``key`` (``group``'s answer): the
    groups are worked out on one point of each workload, and each point reads its workload's."""
    inv, order, starts = workloads
    first = order[starts[:-1]]                             # one point of each workload
    own = [k[first] if np.ndim(k) else k for k in key]     # each workload's key
    many = many[first]

    def grouped(together):
        return group([own[0], *(np.where(together, -1.0, k) for k in own[1:4]), *own[4:]], len(first))[0]
    joint = grouped(many)
    few = many & (np.bincount(joint, weights=many) < MANY_WORKLOADS)[joint]
    if few.any():
        many = many & ~few
        joint = grouped(many)
    return many[inv], groups_of(np.asarray(joint)[inv])


def _many_workloads(shared: np.ndarray, w: dict, cpu_layers: np.ndarray) -> np.ndarray:
    """[n] bool: the points priced as one group with every point that differs from them only in
    batch, prompt and generated lengths (``dse.system.workload.WorkloadBatch``): static batches
    without speculative decoding or a CPU layer split, whose decode has one affine piece (no
    sliding window, no KV budget), and whose own workload has fewer than ``MANY_BELOW`` points (``shared``: [n], how many points
    share each point's workload; a workload shared by many points is cheaper priced once for them all)."""
    sliding = per_code([m.num_sliding_layers > 0 for m in w["models"]], w["model"])
    budget = per_code([t.kv_budget > 0 for t in w["techniques"]], w["tech"])
    draft = per_code([d is not None for d in w["drafts"]], w["draft"])
    ok = ~w["continuous"] & ~draft & (cpu_layers == 0) & ~sliding & ~budget
    return ok & (shared < MANY_BELOW)


#: the columns that decide which points share a workload (and so one kernel call)
_WORKLOAD_INPUTS = ("model", "batch", "prompt_len", "gen_len", "weights", "activations", "kv", "devices", "tp", "pp",
                    "ep", "flash_attention", "offload", "overlap", "sparse", "cpu_layers", "max_context", "hardware", "link",
                    "host_tier", "host_cpu", "onchip_buffer_bytes", "native_formats", "serving", "concurrency",
                    "request_rate", "prefill_chunk", "lengths", "engine", *TECHNIQUE_COLUMNS, "prune",
                    "spec_acceptance")


#: the workload inputs across which points are priced together (``_many_workloads``)
_BATCH_AND_LENGTHS = ("batch", "prompt_len", "gen_len")


def _workload_order(cols: Columns) -> np.ndarray | None:
    """Positions that put points with the same workload inputs side by side (None: already so).
    Where no workload is shared by ``MANY_BELOW`` points, so that each is priced with the others
    differing from it only in batch and lengths, points are put side by side by the other inputs
    alone: points in any order of batch and lengths are then not moved (nor their results moved
    back when read)."""
    keys = {}
    for k in _WORKLOAD_INPUTS:
        if cols.has(k) and not cols.is_fixed(k):
            v = cols.given[k]
            keys[k] = (np.asarray(v.codes) if hasattr(v, "codes") else cols.labels(k)[0]
                       if np.asarray(v).dtype.kind in "OUSb" else np.asarray(v))
    if not keys:
        return None
    inv = group_codes(list(keys.values()), cols.n)          # sorted by only when needed
    if inv is not None and any(k in keys for k in _BATCH_AND_LENGTHS) and np.bincount(inv).max() < MANY_BELOW:
        inv = group_codes([v for k, v in keys.items() if k not in _BATCH_AND_LENGTHS], cols.n)
    if inv is None:
        return None
    order = groups_of(inv)[1]
    return None if np.all(order[1:] > order[:-1]) else order


def _workload_columns(cols: Columns, hw: HardwareArrays) -> dict:
    """Per-point workload arrays, every name resolved (DseError naming the column)."""
    w = {}
    base_codes, base_models = _resolved(cols, "model", resolve_model)
    w["model"], w["models"] = pruned_models(cols, base_codes, base_models)
    technique_columns(cols, w)
    for k in ("weights", "activations", "kv"):
        w[k], formats = _resolved(cols, k, lambda v, k=k: get_format(str(v), f"{k} format"))
        w[k + "_names"] = [f.name for f in formats]
    quality_columns(cols, base_codes, base_models, w)
    w["policy"], w["policies"] = _resolved(cols, "offload", parse_policy)
    w["prompt"], w["gen"] = cols.numbers("prompt_len"), cols.numbers("gen_len")
    w["ep"], w["cpu_layers"] = cols.numbers("ep"), cols.numbers("cpu_layers")
    w["max_context"] = cols.numbers("max_context")
    w["devices"], w["tp"], w["pp"] = cols.numbers("devices"), cols.numbers("tp"), cols.numbers("pp")
    w["flash"], w["sparse"], w["overlap"] = cols.flags("flash_attention"), w["sparse_units"], cols.flags("overlap")
    w["engine"], w["engines"] = _resolved(cols, "engine", get_engine)
    if not cols.has("flash_attention"):     # the default: the engine's kernel, fused where the hardware can tile
        fuses = per_code([e.flash_attention for e in w["engines"]], w["engine"])
        w["flash"] = pointwise(lambda f, b, u: f & (b > 0) & u, w["flash"], hw.buffer, fuses)
    w["batch"], w["batch_max"] = cols.batch()
    w["serving"], modes = _resolved(cols, "serving", _serving_mode)
    w["concurrency"], w["request_rate"] = cols.numbers("concurrency"), cols.numbers("request_rate")
    w["kv_block"], w["max_running"] = cols.numbers("kv_block"), cols.numbers("max_running")
    w["prefill_chunk"] = cols.numbers("prefill_chunk")
    w["lengths"], w["length_specs"] = _resolved(cols, "lengths", parse_lengths)
    _trace_lengths(w)
    for k in ("prefix_hit", "slo_ttft", "slo_tpot", "slo_percentile", "target_rate"):
        w[k] = cols.numbers(k)
    if anywhere(pointwise(lambda r, a, b: (r > 0) & ~(a > 0) & ~(b > 0), w["target_rate"], w["slo_ttft"], w["slo_tpot"])):
        raise DseError(f"{cols.where}: target_rate: the engines a service needs follow from its goodput under SLOs; "
                       f"give slo_ttft and/or slo_tpot too")
    codes, pools = _resolved(cols, "disaggregate", _pools)
    w["prefill_devices"] = per_code(np.array([p[0] if p else np.nan for p in pools], dtype=float), codes)
    w["decode_devices"] = per_code(np.array([p[1] if p else np.nan for p in pools], dtype=float), codes)
    w["disaggregated"] = pointwise(lambda p: ~np.isnan(p), w["prefill_devices"])
    asked = per_code([m == "continuous" for m in modes], w["serving"])
    loaded = pointwise(lambda c, r: (c > 0) | (r > 0), w["concurrency"], w["request_rate"])
    served = {"concurrency": loaded, "lengths": per_code([spec.kind != FIXED for spec in w["length_specs"]], w["lengths"]),
              **{k: pointwise(lambda x: x > 0, w[k]) for k in ("prefix_hit", "slo_ttft", "slo_tpot")},
              "disaggregate": w["disaggregated"]}
    static = per_code([m == "static" and cols.has("serving") for m in modes], w["serving"])
    for key, on in served.items():
        if anywhere(pointwise(lambda s, o: s & o, static, on)):
            what = "concurrency and request_rate are loads" if key == "concurrency" else f"{key} is a parameter"
            raise DseError(f"{cols.where}: serving: 'static' runs one batch; {what} of serving 'continuous' "
                           f"(leave serving out, or give it as continuous)")
    if anywhere(pointwise(lambda c, r: (c > 0) & (r > 0), w["concurrency"], w["request_rate"])):
        raise DseError(f"{cols.where}: concurrency and request_rate: give one load per design point "
                       f"(a closed loop at a concurrency, or an open loop at a request rate)")
    w["continuous"] = pointwise(lambda a, *on: a | np.any(on, axis=0), asked, *served.values())
    short = pointwise(lambda c, p, m: c & (p > 0) & (p < m), w["continuous"], w["prefill_chunk"], w["max_running"])
    if anywhere(short):
        k = int(np.flatnonzero(short)[0])
        raise DseError(f"{cols.where}: prefill_chunk: an iteration's token budget ({int(w['prefill_chunk'][k]):,}) must "
                       f"be at least max_running ({int(w['max_running'][k]):,}), as vLLM requires of "
                       f"max_num_batched_tokens; give a larger prefill_chunk or a smaller max_running")
    # continuous batching prices one request's tables; without a load it runs closed at the batch
    if anywhere(w["continuous"]):              # (static batches alone: nothing changes but batch 'max')
        w["concurrency"] = pointwise(lambda c, ld, m, b, cc: np.where(c & ~ld, np.where(m, 1.0, b), cc),
                                     w["continuous"], loaded, w["batch_max"], w["batch"], w["concurrency"])
        w["batch"] = pointwise(lambda m, c, b: np.where(m | c, 1.0, b), w["batch_max"], w["continuous"], w["batch"])
        w["batch_max"] = pointwise(lambda m, c: m & ~c, w["batch_max"], w["continuous"])
    elif anywhere(w["batch_max"]):
        w["batch"] = pointwise(lambda m, b: np.where(m, 1.0, b), w["batch_max"], w["batch"])
    for k in ("prompt", "gen", "ep"):
        if anywhere(pointwise(lambda x: x < 1, w[k])):
            raise DseError(f"{cols.where}: {dict(prompt='prompt_len', gen='gen_len').get(k, k)}: "
                           f"expected a positive integer")
    return w


def _pools(value) -> tuple[int, int] | None:
    """(prefill devices, decode devices) of a ``disaggregate`` value ``P:D``, or None for
    ``none``; DseError naming what is allowed."""
    text = str(value).strip()
    if text == "none":
        return None
    head, sep, tail = text.partition(":")
    try:
        pair = (int(head), int(tail)) if sep else None
    except ValueError:
        pair = None
    if pair is None or min(pair) < 1 or max(pair) > MAX_COUNT:
        raise DseError(f"disaggregate: expected 'none' or 'P:D' (prefill devices : decode devices, positive "
                       f"integers, e.g. '2:6'), got {value!r}")
    return pair


def _pool_layout(w: dict, fail) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(devices, tp) to lay out each point with, and its devices in all: a disaggregated
    point lays out one instance of ``tp`` devices (given, or the largest dividing both pools)
    and has the pools' devices; the points whose layout cannot be fail ``layout``."""
    dis = w["disaggregated"]
    if not dis.any():                  # no pools: the layout is the one given
        return w["devices"], w["tp"], np.full(len(dis), np.nan)
    pre, dec = np.nan_to_num(w["prefill_devices"], nan=1.0), np.nan_to_num(w["decode_devices"], nan=1.0)
    total = pre + dec
    inst = np.where(np.isnan(w["tp"]), np.gcd(pre.astype(np.int64), dec.astype(np.int64)), w["tp"])
    wrong = dis & ~np.isnan(w["devices"]) & (w["devices"] != total)
    fail("layout", np.flatnonzero(wrong), "with disaggregate P:D, devices (if given) must be P + D")
    split = dis & ((np.mod(pre, inst) != 0) | (np.mod(dec, inst) != 0))
    fail("layout", np.flatnonzero(split), "with disaggregate P:D, tp (devices per engine) must divide P and D")
    return (np.where(dis, np.nan, w["devices"]), np.where(dis, inst, w["tp"]), np.where(dis, total, np.nan))


def _trace_lengths(w: dict) -> None:
    """Points whose lengths are a trace take its mean prompt and output lengths."""
    for code, spec in enumerate(w["length_specs"]):
        if spec.kind == "trace":
            at = w["lengths"] == code
            w["prompt"], w["gen"] = w["prompt"].copy(), w["gen"].copy()
            w["prompt"][at], w["gen"][at] = spec.trace_means()


def _serving_mode(value) -> str:
    """A serving mode name (``SERVING_MODES``); DseError naming what is allowed."""
    if value not in SERVING_MODES:
        raise DseError(f"serving: expected one of {', '.join(SERVING_MODES)}, got {value!r}")
    return value


def _resolved(cols: Columns, key: str, resolve) -> tuple[np.ndarray, list]:
    """(code per point, each distinct value of column ``key`` resolved); DseError naming the column."""
    codes, values = cols.labels(key)
    try:
        return codes, [resolve(v) for v in values]
    except DseError as e:
        said = str(e)
        head = f"{cols.where}: " if said.startswith(key) else f"{cols.where}: {key}: "
        raise DseError(head + said, verbatim_from=len(head) + (len(key) if said.startswith(key) else 0)) from None


def _host_capacity(w: dict, hw: HardwareArrays, policy, cpu_layers, index) -> np.ndarray:
    """Bytes of host memory the points ``index`` may place data in: none without a host
    tier, except that CPU layers live in the CPU's own memory when the device names no host memory."""
    hcap = np.where(hw.has_host[index], hw.host_capacity[index], 0.0)
    if np.any(cpu_layers > 0):
        cpu_mem = np.array([c.memory.capacity_bytes for c in hw.cpus] + [0.0])[hw.host_cpu[index]]
        own = np.nan_to_num(hw.host_capacity[index], nan=0.0)
        hcap = np.where(cpu_layers > 0, np.where(own > 0, own, cpu_mem), hcap)
    return hcap


def _placement(policy, wb, ab, kvb, cap, devices, cpu_share=0.0, layer_w=0.0):
    """Placement of per-device footprints: the offload policy, or under a CPU layer split
    the CPU's layers' weights and KV cache in host memory (read there by the CPU itself)."""
    if cpu_share > 0:
        with np.errstate(divide="ignore", invalid="ignore"):
            fw = np.where(np.asarray(wb) > 0, layer_w * cpu_share / np.asarray(wb, dtype=float), 0.0)
        return place({"weights": fw, "kv": cpu_share}, wb, ab, kvb, cap, 1)
    return place(policy, wb, ab, kvb, cap, devices)


def _size_chips(w: dict, hw: HardwareArrays, sized: np.ndarray, tp, pp, chips, fail) -> None:
    """Chip count and (tp, pp) of the spatial points ``sized`` (in place)."""
    idx_all = np.flatnonzero(sized)
    key = [w[k][idx_all] for k in ("model", "batch", "prompt", "gen", "weights", "activations", "kv", "ep",
                                   "flash", "tech")] + [np.where(w["flash"], hw.buffer, 0.0)[idx_all]]
    inv, order, starts = group(key, len(idx_all))
    for g in range(len(starts) - 1):
        idx = idx_all[order[starts[g]:starts[g + 1]]]
        i0 = idx[0]
        model = w["models"][w["model"][i0]]
        args = (int(w["batch"][i0]), int(w["prompt"][i0]), int(w["gen"][i0]),
                *(w[k + "_names"][w[k][i0]] for k in ("weights", "activations", "kv")))
        flash, buf = bool(w["flash"][i0]), float(hw.buffer[i0]) if w["flash"][i0] else 0.0
        tech = w["techniques"][w["tech"][i0]]
        cap = hw.system.capacity[idx]
        try:
            need = chips_required(tables(model, *args, 1, 1, 1, flash, buf, tech).footprint.total_bytes, cap)
        except DseError as e:
            fail("model_split", idx, str(e))
            continue
        chips[idx] = need
        left = np.ones(len(idx), dtype=bool)
        for t_, p_ in chip_layouts(model):
            ok = left & (t_ * p_ >= need)
            if not ok.any():
                continue
            try:
                total = tables(model, *args, t_, p_, int(w["ep"][i0]), flash, buf, tech).footprint.total_bytes
            except DseError:
                continue
            ok &= fits_within(total, cap)
            tp[idx[ok]], pp[idx[ok]] = t_, p_
            left &= ~ok
            if not left.any():
                break
        fail("no_chip_layout", idx[left])


def _max_batch(w: dict, hw: HardwareArrays, tp, pp, batch, fail) -> None:
    """The largest batch that fits, for the points asking for it (in place); 1 (and
    'does not fit') where even one sequence does not."""
    idx_all = np.flatnonzero(w["batch_max"])
    key = [w[k][idx_all] for k in ("model", "prompt", "gen", "weights", "activations", "kv", "ep", "flash",
                                   "policy", "cpu_layers", "tech")] + [tp[idx_all], pp[idx_all],
                                                               np.where(w["flash"], hw.buffer, 0.0)[idx_all]]
    inv, order, starts = group(key, len(idx_all))
    for g in range(len(starts) - 1):
        idx = idx_all[order[starts[g]:starts[g + 1]]]
        i0 = idx[0]
        model = w["models"][w["model"][i0]]
        t_, p_, e_ = int(tp[i0]), int(pp[i0]), int(w["ep"][i0])
        flash, buf = bool(w["flash"][i0]), float(hw.buffer[i0]) if w["flash"][i0] else 0.0
        names = [w[k + "_names"][w[k][i0]] for k in ("weights", "activations", "kv")]
        tech = w["techniques"][w["tech"][i0]]
        try:
            fib = footprint_in_batch(model, int(w["prompt"][i0]), int(w["gen"][i0]), *names, t_, p_, e_, flash, buf,
                                     tech)
            layer_w = tables(model, 1, int(w["prompt"][i0]), int(w["gen"][i0]), *names, t_, p_, e_, flash,
                             buf, tech).layer_weight_bytes
        except DseError:
            continue                  # the layout does not divide the model: reported by the group check
        policy = w["policies"][w["policy"][i0]]
        share = w["cpu_layers"][i0] / model.num_layers
        cap = hw.system.capacity[idx]
        hcap = _host_capacity(w, hw, policy, w["cpu_layers"][idx], idx)

        def fits(b):
            wb, kvb, ab = fib.at(np.broadcast_to(b, cap.shape))
            pl = _placement(policy, wb, ab, kvb, cap, t_ * p_ * e_, share, layer_w)
            return pl.device_fits(cap) & pl.host_fits(hcap)

        best = largest_fitting(fits)
        batch[idx] = np.maximum(best, 1.0)


def _check_group(idx, t: WorkloadTables, model, w: dict, hw: HardwareArrays, i0: int, fail, n: int, base: dict,
                 memory_violation: np.ndarray, spec: dict | None = None) -> _Group:
    """Placement and every feasibility check of one workload's points; the group ready to price
    (``spec``: its speculative decoding, ``_speculation``)."""
    sc = t.scenario
    fp = t.footprint if spec is None else spec["footprint"]
    sys = hw.system.take(idx)
    size = sys.size
    policy = w["policies"][w["policy"][i0]]
    cpu_layers = int(w["cpu_layers"][i0])

    def mark(code, bad, detail=None):
        if bad.any() if isinstance(bad, np.ndarray) else bad:
            bad = np.broadcast_to(bad, (size,))
            fail(code, (idx, bad) if isinstance(idx, slice) and detail is None else _positions(idx)[bad], detail)

    if sc.many:
        _mark_context(mark, model, sc, int(w["max_context"][i0]))
    else:
        too_long = context_error(model, sc.prompt_len, sc.gen_len, int(w["max_context"][i0]))
        if too_long:
            mark("context", np.ones(size, dtype=bool), too_long)
    share = cpu_layers / model.num_layers
    cpu = None
    if cpu_layers:
        why = None
        if cpu_layers > model.num_layers:
            why = f"cpu_layers must be between 1 and the model's {model.num_layers} layers, got {cpu_layers}"
        elif policy != "none" or sc.devices > 1:
            why = "cpu_layers works on one device without offload"
        elif hw.host_cpu[i0] < 0:
            why = (f"cpu_layers needs a host CPU: hardware '{hw.names[hw.name[i0]]}' names no host_cpu; "
                   f"give host_cpu (a cpu preset)")
        if why:
            mark("cpu_split", np.ones(size, dtype=bool), why)
            share = 0.0
    cap = sys.capacity
    # host memory: read only where something may go there (an offload policy, CPU layers)
    hcap = _host_capacity(w, hw, policy, np.full(size, float(cpu_layers if share else 0)), idx) \
        if policy != "none" or share else 0.0
    continuous = bool(w["continuous"][i0])
    act = fp.activation_bytes
    if continuous:
        if sc.pp > 1 or sc.ep > 1 or policy != "none" or cpu_layers:
            mark("serving", np.ones(size, dtype=bool))
        if spec is not None and (spec["heads"] is not None or w["disaggregated"][i0]):
            mark("serving", np.ones(size, dtype=bool), "speculative decoding under continuous batching is modelled "
                                                       "with a draft model or self:N on one pool (not Medusa heads, "
                                                       "not disaggregated)")
        if w["disaggregated"][i0]:          # the KV cache moves between the pools over the link
            mark("interconnect", ~(np.isfinite(sys.link_bandwidth) & (sys.link_bandwidth > 0)))
        length_spec: LengthSpec = w["length_specs"][w["lengths"][i0]]
        limit = context_limit(model, int(w["max_context"][i0])) or np.inf
        lengths = length_spec.classes(sc.prompt_len, sc.gen_len, limit)
        act = _chunk_activation_bytes(model, sc, w, hw, i0, int(np.ceil(lengths.prompt.max())))
    pl = _placement(policy, fp.weights_bytes, act, fp.kv_cache_bytes, cap, sc.devices, share,
                    t.layer_weight_bytes)
    dev_ok, host_ok = pl.device_fits(cap), pl.host_fits(hcap)
    no_host = (pl.host_bytes > 0) & ~hw.has_host[idx] & (share == 0)
    mark("no_host_tier", no_host)
    mark("device_memory", ~dev_ok)
    mark("host_memory", dev_ok & ~host_ok & ~no_host)
    memory_violation[idx] = pl.memory_violation(cap, hcap)

    wanted = {matmul_compute_class(sc.activations, sc.weights), matmul_compute_class(sc.activations, sc.kv)}
    for c in sorted(wanted):
        mark("format", ~(sys.peak[:, _COL[c]] > 0), None)
    if w["sparse"][i0]:                      # 2:4 weights at the sparse peak where there is one, else dense
        sys = sys.replaced(sparse_gain=hw.sparse_ratio(idx))
    if sc.devices > 1:
        mark("interconnect", ~(np.isfinite(sys.link_bandwidth) & (sys.link_bandwidth > 0)))
    if sc.flash_attention:
        mark("onchip_buffer", ~(hw.buffer[idx] > 0))

    offload = None
    if share == 0 and policy != "none" and (pl.fractions > 0).any():
        offload = np.ascontiguousarray(np.broadcast_to(pl.fractions, (size, 3)))
    sys = sys.replaced(tp=np.full(size, float(sc.tp)), offload=offload,
                  overlap=w["overlap"][idx].copy())
    if share:
        cpu_hw = assemble(Columns({"hardware": hw.cpus[hw.host_cpu[i0]], "model": ""}))
        cpu_sys, cpu_used = cpu_hw.system.take(np.zeros(size, dtype=np.int64)), cpu_hw.used(0)
        for c in sorted(wanted):
            mark("format", ~(cpu_sys.peak[:, _COL[c]] > 0))
        per_token = model.hidden_size * sc.activations.bytes
        cpu = {"share": share, "system": cpu_sys, "used": cpu_used, "hop_prefill": t.prefill_table.tokens * per_token,
               "hop_decode": t.decode_table.tokens * per_token, "host_bw": hw.host_link_bandwidth[idx], "host_lat": hw.host_link_latency[idx]}
        no_link = ~(np.isfinite(cpu["host_bw"]) & (cpu["host_bw"] > 0))
        mark("cpu_split", no_link, f"hardware '{hw.names[hw.name[i0]]}' names no host_link for a CPU layer split")
    serving = None
    kv = fp.kv_cache_bytes
    if continuous:
        serving, kv = _serving_inputs(model, sc, w, hw, idx, i0, cap, fp, act)
        serving.update(lengths=lengths, spec=length_spec, max_tokens=limit)
        if spec is not None and spec["tables"] is not None:
            _speculative_serving(serving, spec, model, sc, w, hw, i0)
        need = np.ceil((sc.prompt_len + sc.gen_len) / serving["kv_block"])
        mark("device_memory", dev_ok & (serving["kv_blocks"] < need),
             "the paged KV cache holds less than one request: the memory left after weights and activations "
             "makes fewer KV blocks (kv_block tokens each) than prompt_len + gen_len need")
    base["weights_bytes"][idx] = fp.weights_bytes
    base["kv_cache_bytes"][idx] = kv
    base["activation_bytes"][idx] = act
    base["memory_bytes"][idx] = fp.weights_bytes + act + kv
    base["offloaded_bytes"][idx] = pl.host_bytes
    kv_group = 1.0 if model.is_mla else (model.num_heads / sc.tp) / kv_heads_per_device(model, sc.tp)
    return _Group(idx, t, sys, DEVICE_CLASSES[hw.device_class[i0]], cpu, serving, hw.families[hw.family[i0]],
                  w["engines"][w["engine"][i0]], float(kv_group), spec)


#: distinct prompt and generated lengths of a group of many workloads that exceed the context
#: beyond which the reason's text is the template's, not the check's own words
CONTEXT_DETAILS = 64


def _mark_context(mark, model, sc, max_context: int) -> None:
    """Mark the workloads of a scenario of many (``Scenario.many``) longer than the context, each
    with the check's words (``context_error``) while there are few distinct lengths among them."""
    limit = context_limit(model, max_context)
    if not limit:
        return
    long = sc.prompt_len + sc.gen_len > limit
    prompt, gen = sc.prompt_len[long].astype(np.int64), sc.gen_len[long].astype(np.int64)
    span = int(gen.max(initial=0)) + 1
    pairs = np.unique(prompt * span + gen)              # (prompt, generated) pairs, one integer each
    if len(pairs) > CONTEXT_DETAILS:
        mark("context", long)
        return
    for p, g in zip(pairs // span, pairs % span):
        mark("context", long & (sc.prompt_len == p) & (sc.gen_len == g), context_error(model, int(p), int(g), max_context))


def _speculation(t: WorkloadTables, model, w: dict, i0: int, buffer: float) -> dict | None:
    """The speculative decoding of a group (None without): the draft's tables (a model of its own
    at tp 1, or the target's first layers at the target's layout), the drafted tokens and
    acceptance rate, the draft's tensor parallelism, and the footprint of target and draft together
    on the device holding both (a shared draft adds nothing)."""
    draft = w["drafts"][w["draft"][i0]]
    if draft is None:
        return None
    sc = t.scenario
    verified = int(w["spec_tokens"][i0])
    out = {"acceptance": float(w["spec_acceptance"][i0]), "drafted": verified, "tables": None, "heads": None}
    fp = t.footprint
    if draft.heads:                          # Medusa: the heads draft in one pass on the target's devices
        heads = optable.medusa_heads(model, replace(sc, batch=sc.micro_batch), draft.heads)
        out.update(drafted=draft.heads, heads=OpArrays.from_table(heads), tp=float(sc.tp))
        fp = replace(fp, weights_bytes=fp.weights_bytes + float(np.sum(heads.weight_bytes * heads.counts)))
        return {**out, "footprint": fp}
    own = not draft.shares_target
    layout = (1, 1, 1) if own else (sc.tp, sc.pp, sc.ep)
    dm = draft_model(draft, model)
    dt = tables(dm, sc.batch, sc.prompt_len, sc.gen_len, sc.weights.name, sc.activations.name,
                sc.kv.name, *layout, sc.flash_attention, buffer)
    if own:
        fp = replace(fp, weights_bytes=fp.weights_bytes + dt.footprint.weights_bytes,
                     kv_cache_bytes=fp.kv_cache_bytes + dt.footprint.kv_cache_bytes,
                     activation_bytes=max(fp.activation_bytes, dt.footprint.activation_bytes))
    return {**out, "tables": dt, "model": dm, "tp": float(layout[0]), "footprint": fp}


def _speculative_serving(serving: dict, spec: dict, model, sc, w: dict, hw: HardwareArrays, i0: int) -> None:
    """Continuous batching under speculative decoding (in place): a decoding sequence gains E
    tokens an iteration (``tokens_per_target_step``), so the steady state runs on requests of
    1 + (gen - 1) / E steps, whose rounds of E tokens ``_price_continuous`` turns back into tokens;
    the paged KV cache is shrunk by the same ratio of tokens held (a request still holds prompt +
    gen tokens of K/V, the draft's with the target's), so as many requests fit. The keys a decoding
    step attends are those of the shorter request (an approximation: low by up to (E - 1) / E of
    the generated part of the context). The draft's iteration model runs on its own layout."""
    e = tokens_per_target_step(spec["acceptance"], spec["drafted"])
    real = serving["lengths"]
    steps = replace(real, gen=1.0 + (real.gen - 1.0) / e, gen_var=real.gen_var / e**2)
    held = (real.mean_prompt + real.mean_gen) / (steps.mean_prompt + steps.mean_gen)
    serving["kv_blocks"] = np.floor(serving["kv_blocks"] * held)
    tp = int(spec["tp"])
    buffer = float(hw.buffer[i0]) if sc.flash_attention else 0.0
    draft = iteration_model(spec["model"], sc.prompt_len, sc.weights.name, sc.activations.name, sc.kv.name, tp,
                            sc.flash_attention, buffer)
    serving.update(lengths=steps, speculation={"e": e, "draft": draft, "tp": float(tp), "drafted": spec["drafted"],
                                               "mean_gen": real.mean_gen})


def _chunk_activation_bytes(model, sc, w: dict, hw: HardwareArrays, i0: int, longest: int) -> float:
    """Peak activation bytes per device of continuous batching: a prefill of one iteration's
    prompt tokens (the chunk budget, or the ``longest`` prompt without chunking)."""
    budget = int(w["prefill_chunk"][i0])
    tokens = longest if budget == 0 else min(longest, budget)
    return tables(model, 1, tokens, sc.gen_len, sc.weights.name, sc.activations.name, sc.kv.name, sc.tp, sc.pp,
                  sc.ep, sc.flash_attention, float(hw.buffer[i0]) if sc.flash_attention else 0.0, sc.techniques
                  ).footprint.activation_bytes


def _serving_inputs(model, sc, w: dict, hw: HardwareArrays, idx, i0: int, cap, fp, act) -> tuple[dict, np.ndarray]:
    """(the continuous-batching inputs of a group's points, KV bytes per device they hold):
    the iteration model and the paged KV cache, every byte of device memory left after the
    weights and one iteration's activations, in blocks of ``kv_block`` tokens."""
    budget = w["prefill_chunk"][idx]
    block = w["kv_block"][idx]
    per_token = fp.kv_cache_bytes / (sc.prompt_len + sc.gen_len)
    left = np.maximum(cap - fp.weights_bytes - act, 0.0)
    blocks = np.floor(left / (per_token * block))
    it = iteration_model(model, sc.prompt_len, sc.weights.name, sc.activations.name, sc.kv.name, sc.tp,
                         sc.flash_attention, float(hw.buffer[i0]) if sc.flash_attention else 0.0, sc.techniques)
    conc = w["concurrency"][idx]
    rate = w["request_rate"][idx]
    prefix = np.round(w["prefix_hit"][idx] * sc.prompt_len)
    serving = {"iteration": it, "kv_blocks": blocks, "kv_block": block, "prefix_tokens": prefix,
               "slo_ttft": w["slo_ttft"][idx], "slo_tpot": w["slo_tpot"][idx], "slo_percentile": w["slo_percentile"][idx],
               "target_rate": w["target_rate"][idx],
               "budget": np.where(budget > 0, budget, np.maximum(float(sc.prompt_len), UNCHUNKED_BUDGET)),
               "chunked": budget > 0, "max_running": w["max_running"][idx],
               "concurrency": np.where(rate > 0, np.nan, conc), "request_rate": np.where(rate > 0, rate, np.nan),
               "devices": np.where(w["disaggregated"][idx], w["prefill_devices"][idx] + w["decode_devices"][idx],
                                   float(sc.devices))}
    if w["disaggregated"][i0]:
        serving["pools"] = (w["prefill_devices"][idx] / sc.tp, w["decode_devices"][idx] / sc.tp, per_token)
    return serving, blocks * block * per_token


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


__all__ = ["evaluate", "prepare", "serving_engine", "ServedPoint", "Plan", "Evaluation", "METRICS", "EXPLAIN_KEYS", "CHECKS"]
