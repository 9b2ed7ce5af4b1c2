"""Planning a deployment: the fewest devices and the cheapest fleet that serve a request rate
within latency SLOs, per hardware (``plan``).

For each hardware the candidate engines (parallel layout up to ``max_devices`` a replica, formats,
engine settings: ``CANDIDATES``, or the values the caller fixes) are one table of columns, evaluated
at once by the one ``evaluate`` twice: first with ``target_rate`` and the SLOs, which gives each
engine's goodput (the largest Poisson rate meeting the SLOs) and the replicas a service needs
(ceil(rate / goodput): ``dse.system.served``); then each engine that meets them at the load one
replica carries (``request_rate`` = rate / replicas), which gives its latencies, power and $ per
million tokens there. Nothing here prices anything: every figure is one of ``evaluate``'s columns.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from basis.errors import DseError
from dse.core.bands import FAMILIES as BAND_FAMILIES
from dse.core.engines import default_engine
from dse.core.metrics import SECONDS_PER_HOUR
from dse.core.serving import PERCENTILES
from dse.system.analysis import unknown_energy_note
from dse.system.evaluator import evaluate
from dse.system.params import SPEC
from workloads.model import load_model

#: the most devices one replica (engine) may span: one scale-up node of 8 GPUs, the size of the
#: nodes the presets describe (h100-sxm: "whole DGX H100 node, shared by its 8 GPUs", NVIDIA DGX
#: H100 user guide; mi300x: "fully connected 8-GPU node", AMD Instinct MI300X platform)
MAX_DEVICES = 8
#: the values a plan tries for each column it enumerates, unless the caller fixes it. Formats: the
#: serving engines' common choices (FP16 throughout, an FP8 KV cache, FP8 weights, activations and
#: KV cache; a device without FP8 runs it on its next wider format, as ``evaluate`` does); engine
#: settings: vLLM's max_num_seqs default (1024) and a tighter cap, and its max_num_batched_tokens
#: default (8192) and the smaller GPUs' 2048 (``dse.system.params``)
CANDIDATES = {
    "formats": (("fp16", "fp16", "fp16"), ("fp16", "fp16", "fp8"), ("fp8", "fp8", "fp8")),
    "max_running": (128, 1024),
    "prefill_chunk": (2048, 8192),
}
#: the columns a plan enumerates (the parallel layout, the formats, the engine settings)
ENUMERATED = ("tp", "pp", "ep", "weights", "activations", "kv", "max_running", "prefill_chunk")
#: what a plan may minimise: devices in the service, or its $ per million output tokens
OBJECTIVES = ("devices", "cost")
#: the metrics each objective reads (their inputs: a price; an energy profile and a static power)
OBJECTIVE_METRICS = {"devices": "service_devices", "cost": "cost_per_million_tokens_usd"}
#: the keys of a plan's rows, in order (``PlanRow``; JSON and CSV keep them)
ROW_KEYS = ("hardware", "devices", "replicas", "devices_per_replica", "tp", "pp", "ep", "weights", "activations",
            "kv", "max_running", "prefill_chunk", "engine", "goodput_per_replica", "rate_per_replica",
            "ttft_s", "tpot_s", "output_tokens_per_s", "cost_per_million_tokens_usd", "fleet_usd_per_hour",
            "fleet_price_usd", "efficiency", "band_ttft", "band_tpot", "band_throughput")


@dataclass(frozen=True)
class PlanAsk:
    """A procurement question. ``base``: the scalar columns of every candidate (model, lengths,
    SLOs, engine, ...; no ``hardware``, no load); ``hardware``: the presets to consider;
    ``rate``: requests/s the service must carry; ``fixed``: {column: values} a caller fixes among
    ``ENUMERATED`` (the rest take ``CANDIDATES``); ``objectives``: those of ``OBJECTIVES`` asked
    (``cost`` asked: every hardware must have a price and an energy figure); ``top``: layouts kept
    per hardware."""

    base: dict
    hardware: tuple[str, ...]
    rate: float
    fixed: dict = field(default_factory=dict)
    objectives: tuple[str, ...] = ("devices",)
    max_devices: int = MAX_DEVICES
    top: int = 5
    ideal: bool = False


@dataclass(frozen=True)
class Plan:
    """What ``plan`` answers: ``layouts`` {hardware: rows (dicts of ``ROW_KEYS``, SI units), the
    engines meeting the SLOs, fewest devices first, then the lowest $ per million tokens}, at most
    ``top`` each; ``fewest`` and ``cheapest``: the row of the whole answer (None: no cost known);
    ``candidates``: engines evaluated; ``notes``: what is unknown, in words."""

    layouts: dict
    fewest: dict
    cheapest: dict | None
    candidates: int
    percentile: float
    notes: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        """The plan as data (JSON keys stable: ``answer``, ``hardware``, ``candidates``, ``notes``)."""
        return {"answer": {"fewest_devices": self.fewest, "cheapest": self.cheapest},
                "hardware": {h: {"fewest_devices": rows[0] if rows else None, "layouts": rows}
                             for h, rows in self.layouts.items()},
                "candidates": self.candidates, "slo_percentile": self.percentile, "notes": list(self.notes)}


#: the most devices a replica may span, and the most layouts a plan shows per hardware
MAX_COUNT = 1024


def _count_ok(v) -> bool:
    """True for an integer (not a switch) from 1 to ``MAX_COUNT``."""
    return isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= MAX_COUNT


def check_ask(ask: PlanAsk, where: str = "plan") -> None:
    """DseError, one line starting with ``where`` (the command, or a study file and its section),
    for a question no plan answers: no hardware, a rate or SLO that is not a positive finite
    number, no SLO at all, an unknown objective, a device cap or a count of layouts shown that is
    not an integer from 1 to ``MAX_COUNT``."""
    if not ask.hardware:
        raise DseError(f"{where}: hardware: give at least one preset to consider")
    if not (isinstance(ask.rate, (int, float)) and math.isfinite(ask.rate) and ask.rate > 0):
        raise DseError(f"{where}: the request rate the service must carry: expected requests per second > 0, "
                       f"got {ask.rate!r}")
    for k in ("slo_ttft", "slo_tpot"):
        v = ask.base.get(k, 0)
        if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
            raise DseError(f"{where}: {k}: expected seconds > 0, got {v!r}")
    if not (ask.base.get("slo_ttft") or ask.base.get("slo_tpot")):
        raise DseError(f"{where}: the SLOs: give slo_ttft and/or slo_tpot (seconds): the engines a service needs "
                       "follow from its goodput under them")
    bad = [o for o in ask.objectives if o not in OBJECTIVES]
    if bad or not ask.objectives:
        raise DseError(f"{where}: objectives: expected some of {', '.join(OBJECTIVES)}, got {', '.join(bad) or 'none'}")
    for key, value in (("max_devices", ask.max_devices), ("top", ask.top)):
        if not _count_ok(value):
            raise DseError(f"{where}: {key}: expected an integer from 1 to {MAX_COUNT}, got {value!r}")


def layouts(model: str, max_devices: int, fixed: dict) -> list[dict]:
    """The parallel layouts and engine settings a plan tries: dicts of ``ENUMERATED`` (tp and pp
    powers of two, ep > 1 only for a mixture of experts, tp x pp x ep at most ``max_devices``; the
    formats and settings of ``CANDIDATES``), each column fixed where ``fixed`` gives its values."""
    powers = [2 ** k for k in range(int(math.log2(max_devices)) + 1)]
    experts = load_model(model).num_experts or 0
    axes = {"tp": powers, "pp": [p for p in powers if p <= 2], "ep": powers if experts > 1 else [1]}
    axes.update({k: fixed[k] for k in ("tp", "pp", "ep") if k in fixed})
    formats = [f for f in CANDIDATES["formats"]
               if all(k not in fixed or f[i] in fixed[k] for i, k in enumerate(("weights", "activations", "kv")))]
    if not formats:
        formats = list(itertools.product(*(fixed.get(k, [CANDIDATES["formats"][0][i]])
                                           for i, k in enumerate(("weights", "activations", "kv")))))
    engine = {k: fixed.get(k, CANDIDATES[k]) for k in ("max_running", "prefill_chunk")}
    out = []
    for tp, pp, ep, fmt, mr, chunk in itertools.product(axes["tp"], axes["pp"], axes["ep"], formats,
                                                        engine["max_running"], engine["prefill_chunk"]):
        if tp * pp * ep <= max_devices or {"tp", "pp", "ep"} <= set(fixed):
            out.append({"tp": tp, "pp": pp, "ep": ep, "weights": fmt[0], "activations": fmt[1], "kv": fmt[2],
                        "max_running": mr, "prefill_chunk": chunk})
    return out


def candidate_columns(ask: PlanAsk) -> dict:
    """The columns of every candidate engine of ``ask`` (hardware x ``layouts``): one table for
    ``evaluate``, the service's rate as ``target_rate``."""
    rows = layouts(str(ask.base["model"]), ask.max_devices, ask.fixed)
    n = len(rows)
    cols = {k: v for k, v in ask.base.items() if k not in ENUMERATED and k not in ("request_rate", "concurrency",
                                                                                  "devices", "batch")}
    cols.update(serving="continuous", target_rate=float(ask.rate))
    cols["hardware"] = np.repeat(np.array(ask.hardware, dtype=object), n)
    for k in ENUMERATED:
        v = np.array([r[k] for r in rows], dtype=object if SPEC[k].type is str else None)
        cols[k] = np.tile(v, len(ask.hardware))
    return cols


#: the metrics that need a price (``price_usd``), and those that need an energy figure (a measured
#: energy profile and a static power); $ per million tokens needs both
PRICED = ("cost_usd", "service_cost_usd", "cost_per_million_tokens_usd")
ENERGISED = ("power_w", "power_demand_w", "energy_per_token_j", "tokens_per_joule", "service_power_w",
             "cost_per_million_tokens_usd")


def objective_gaps(given: dict, hardware, metric: str, devices: int = 1, ideal: bool = False) -> dict:
    """{hardware: why ``metric`` is unknown on it} for the ``hardware`` (names) where ``metric``,
    one of ``PRICED`` or ``ENERGISED``, has no value: one static batch-1 point each on ``devices``
    devices with the scalar columns of ``given`` that say what the hardware costs and draws (its
    hardware and cost groups; the model), evaluated at once (a price and an energy figure do not
    depend on the layout, and an infeasible point keeps them). Empty for any other metric."""
    if metric not in PRICED and metric not in ENERGISED:
        return {}
    cols = {k: v for k, v in given.items() if k in SPEC and (SPEC[k].group in ("hardware", "cost") or k == "model")}
    names = list(dict.fromkeys(hardware))
    ev = evaluate({**cols, "hardware": np.array(names, dtype=object), "devices": devices}, ideal=ideal)
    out = {}
    for i, h in enumerate(names):
        m = {k: ev[k][i:i + 1] for k in ("power_demand_w", "energy_per_token_j", "cost_per_million_tokens_usd")}
        if metric in ("cost_usd", "service_cost_usd") and np.isnan(ev["cost_usd"][i]):
            out[h] = "the device has no cited price; give one (price_usd / --price-usd)"
        elif metric in ENERGISED and np.isnan(ev[metric][i] if metric in ev else m["power_demand_w"][0]):
            out[h] = unknown_energy_note(m) or "its energy is not modelled"
    return out


def cost_gaps(ask: PlanAsk) -> dict:
    """{hardware: why its $ per million tokens is unknown} for the hardware of ``ask``
    (``objective_gaps`` on ``max_devices`` devices)."""
    return objective_gaps(ask.base, ask.hardware, "cost_per_million_tokens_usd", ask.max_devices, ask.ideal)


def empty_objectives(space, objectives: dict, where: str, ideal: bool = False) -> None:
    """DseError, one line, when an objective of a study can have no value at any of its designs:
    every hardware of its ``space`` (a ``DesignSpace``) lacks the price or the energy figure the
    objective needs (the front and its plots would be empty). The space's first value of each other
    column stands for all (a price and an energy figure do not depend on them)."""
    axes = {a.name: a for a in space.axes}
    if "hardware" not in axes or "model" not in axes:
        return
    first = {k: a.values[0] if a.values else a.low for k, a in axes.items() if k != "hardware"}
    hardware = [str(h) for h in axes["hardware"].values]
    for metric in objectives:
        gaps = objective_gaps(first, hardware, metric, ideal=ideal)
        if gaps and len(gaps) == len(set(hardware)):
            by_reason: dict[str, list[str]] = {}
            for h, why in gaps.items():
                by_reason.setdefault(why, []).append(h)
            said = "; ".join(f"{', '.join(hs)}: {why}" for why, hs in by_reason.items())
            raise DseError(f"{where}: objectives.{metric}: no design can have a value: "
                           f"{'every hardware lacks it' if len(gaps) > 1 else next(iter(gaps)) + ' lacks it'} "
                           f"({said}); give what it needs in space, or rank by another objective")


def percentile_column(metric: str, percentile: float) -> str:
    """The column of ``metric`` ('ttft', 'tpot') at ``percentile`` (its mean where the serving
    model keeps no such percentile)."""
    q = int(percentile) if float(percentile).is_integer() else None
    return f"{metric}_p{q}_s" if q in PERCENTILES else f"{metric}_s"


def plan(ask: PlanAsk) -> Plan:
    """The ``Plan`` answering ``ask``; DseError (one line) for a question it cannot answer: a bad
    input (``check_ask``), cost asked where a hardware has no price or energy figure, or no
    engine meeting the SLOs (saying how close the best came)."""
    check_ask(ask)
    if "cost" in ask.objectives:
        gaps = cost_gaps(ask)
        if gaps:
            h, why = next(iter(gaps.items()))
            raise DseError(f"plan: cost asked, and {h} has no $ per million tokens: {why}")
    pct = float(ask.base.get("slo_percentile") or SPEC["slo_percentile"].default)
    cols = candidate_columns(ask)
    first = evaluate(cols, ideal=ask.ideal)
    good = first["goodput"]
    meets = first.feasible & np.isfinite(first["replicas"]) & (good > 0)
    if not meets.any():
        raise DseError(closest_miss(first, ask, pct))
    at = np.flatnonzero(meets)
    load = {k: (v[at] if isinstance(v, np.ndarray) else v) for k, v in cols.items() if k != "target_rate"}
    replicas = first["replicas"][at]
    load["request_rate"] = ask.rate / replicas
    second = evaluate(load, ideal=ask.ideal)
    ttft, tpot = percentile_column("ttft", pct), percentile_column("tpot", pct)
    ok = second.feasible & (~(ask.base.get("slo_ttft", 0) > 0) | (second[ttft] <= ask.base.get("slo_ttft", 0)))
    ok &= ~(ask.base.get("slo_tpot", 0) > 0) | (second[tpot] <= ask.base.get("slo_tpot", 0))
    rows = [_row(cols, first, second, int(at[j]), j, replicas[j], ask.rate, ttft, tpot) for j in np.flatnonzero(ok)]
    if not rows:
        raise DseError(closest_miss(first, ask, pct))
    per_hw = {h: _distinct(sorted((r for r in rows if r["hardware"] == h), key=_fewest_key)) for h in ask.hardware}
    fewest = min(rows, key=_fewest_key)
    priced = [r for r in rows if math.isfinite(r["cost_per_million_tokens_usd"])]
    cheapest = min(priced, key=lambda r: (r["cost_per_million_tokens_usd"], r["devices"])) if priced else None
    notes = tuple(f"{h}: no layout meets the SLOs at {ask.rate:g} requests/s" for h, rs in per_hw.items() if not rs)
    if "cost" not in ask.objectives:
        notes += tuple(f"{h}: {why}" for h, why in cost_gaps(ask).items())
    return Plan({h: rs[:ask.top] for h, rs in per_hw.items()}, fewest, cheapest, len(first), pct, notes)


def _distinct(rows: list[dict]) -> list[dict]:
    """``rows`` (ranked) keeping the first of each layout and formats: other engine settings that
    serve it no better follow it in the ranking and would fill the table with repeats."""
    seen, out = set(), []
    for r in rows:
        key = tuple(r[k] for k in ("tp", "pp", "ep", "weights", "activations", "kv"))
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def _fewest_key(r: dict):
    cost = r["cost_per_million_tokens_usd"]
    return (r["devices"], cost if math.isfinite(cost) else math.inf, r["tpot_s"])


def _row(cols: dict, first, second, i: int, j: int, replicas: float, rate: float, ttft: str, tpot: str) -> dict:
    """The plan's row of candidate ``i`` (``first``'s position; ``j`` in ``second``)."""
    def col(k):
        v = cols[k]
        return v[i] if isinstance(v, np.ndarray) else v
    cpm = float(second["cost_per_million_tokens_usd"][j])
    tokens = float(second["output_tokens_per_s"][j]) * replicas
    band = {f: (float(second[f"band_{f}_low"][j]), float(second[f"band_{f}_high"][j]))
            for f in ("ttft", "tpot", "throughput") if f in BAND_FAMILIES}
    row = {"hardware": str(col("hardware")), "devices": int(first["service_devices"][i]), "replicas": int(replicas),
           "devices_per_replica": int(first["devices"][i]), "tp": int(first["tp_used"][i]),
           "pp": int(first["pp_used"][i]), "ep": int(col("ep")), "weights": str(col("weights")),
           "activations": str(col("activations")), "kv": str(col("kv")), "max_running": int(col("max_running")),
           "prefill_chunk": int(col("prefill_chunk")), "engine": engine_name(str(cols.get("engine", SPEC["engine"].default))),
           "goodput_per_replica": float(first["goodput"][i]), "rate_per_replica": rate / replicas,
           "ttft_s": float(second[ttft][j]), "tpot_s": float(second[tpot][j]), "output_tokens_per_s": tokens,
           "cost_per_million_tokens_usd": cpm, "fleet_usd_per_hour": cpm * tokens * SECONDS_PER_HOUR / 1e6,
           "fleet_price_usd": float(first["service_cost_usd"][i]), "efficiency": second.efficiency_name(j),
           **{f"band_{f}": list(b) for f, b in band.items()}}
    return {k: row[k] for k in ROW_KEYS}


def engine_name(name: str) -> str:
    """The engine profile ``name`` runs: 'default' is ``default_engine()``."""
    return default_engine() if name == "default" else name


#: the keys of a study's ``plan:`` section
STUDY_KEYS = ("objectives", "max_devices", "top")


def space_columns(space: dict, where: str, kind: str, skip: tuple = ()) -> tuple[dict, dict, tuple]:
    """(the scalar columns, {column of ``ENUMERATED``: the values tried}, the hardware to consider) of
    the ``space`` of a ``kind`` study (a plan or a fleet) that enumerates layouts itself: a list of an
    ``ENUMERATED`` column restricts what it tries, a single value fixes it; ``hardware`` is one name
    or a list; ``skip``: keys the caller reads itself. DseError naming the file and the key for a
    list or mapping of any other column."""
    base, fixed = {}, {}
    for k, v in space.items():
        if k == "hardware" or k in skip:
            continue
        if isinstance(v, list) and k in ENUMERATED:
            fixed[k] = list(v)
        elif isinstance(v, (list, dict)):
            raise DseError(f"{where}: space.{k}: a {kind} study gives one value here (it enumerates "
                           f"{', '.join(ENUMERATED)} itself, and lists of those restrict it)")
        elif k in ENUMERATED:
            fixed[k] = [v]
        else:
            base[k] = v
    hw = space.get("hardware")
    return base, fixed, tuple(hw) if isinstance(hw, list) else (hw,) if isinstance(hw, str) else ()


def ask_from_study(data: dict, where: str) -> PlanAsk:
    """The PlanAsk of a study file's mapping ``data`` that has a ``plan:`` section: its ``space``
    gives the scalar columns, ``hardware`` (one or a list: the hardware to consider), the rate as
    ``target_rate``, and lists for columns of ``ENUMERATED`` (the values a plan tries); ``plan:``
    gives ``objectives`` (of ``OBJECTIVES``), ``max_devices`` and ``top``. DseError naming the
    file and the key otherwise."""
    section = data.get("plan") or {}
    if not isinstance(section, dict):
        raise DseError(f"{where}: plan: expected a mapping with keys {', '.join(STUDY_KEYS)}")
    unknown = sorted(set(section) - set(STUDY_KEYS))
    if unknown:
        raise DseError(f"{where}: plan: unknown key(s) {', '.join(map(str, unknown))}; allowed: {', '.join(STUDY_KEYS)}")
    space = data.get("space") or {}
    base, fixed, hardware = space_columns(space, where, "plan", ("target_rate",))
    rate = space.get("target_rate")
    if rate is None:
        raise DseError(f"{where}: space.target_rate: a plan study gives the requests/s its service must carry")
    objectives = section.get("objectives", ["devices"])
    objectives = tuple(objectives) if isinstance(objectives, list) else (objectives,)
    ask = PlanAsk(base, hardware, rate, fixed, objectives, section.get("max_devices", MAX_DEVICES),
                  section.get("top", 5), bool(data.get("ideal", False)))
    check_ask(ask, f"{where}: plan")
    return ask


def closest_miss(ev, ask: PlanAsk, pct: float) -> str:
    """Why no candidate meets the SLOs, in one line: the best TTFT and TPOT any candidate that
    fits reached (at its lightest load), beside the SLOs, or why none fits."""
    fits = ev.feasible | np.isin([ev.reason_key(i) for i in range(len(ev))], ("slo", "saturated"))
    if not fits.any():
        return f"plan: no layout of {', '.join(ask.hardware)} runs the model: {ev.reason_text(0)}"
    parts = []
    for metric, slo in (("ttft", ask.base.get("slo_ttft", 0)), ("tpot", ask.base.get("slo_tpot", 0))):
        if slo:
            v = ev[percentile_column(metric, pct)][fits]
            best = float(np.nanmin(v)) if np.isfinite(v).any() else math.nan
            parts.append(f"best {metric.upper()} p{pct:g} reached {best:.3g} s against the SLO {slo:g} s")
    return (f"plan: no layout of {', '.join(ask.hardware)} (up to {ask.max_devices} devices a replica) meets the "
            f"SLOs at any rate: {'; '.join(parts)}")


__all__ = ["PlanAsk", "Plan", "plan", "ask_from_study", "STUDY_KEYS", "layouts", "candidate_columns", "cost_gaps", "objective_gaps", "empty_objectives", "check_ask", "CANDIDATES",
           "ENUMERATED", "OBJECTIVES", "ROW_KEYS", "MAX_DEVICES"]
