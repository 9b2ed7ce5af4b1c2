"""One design point, operator by operator: a one-row ``evaluate`` with its explanation.

``analyze_point(columns)`` takes the columns of one point (scalars); ``analyze(model,
device, scenario, ...)`` builds them from objects (a ModelSpec, a Device and a Scenario).
Both return an ``Analysis``: the per-operator rows of the prefill and of one decode step
attending to ``prompt_len`` cached tokens, and a summary (the point's parameters, its
resolved layout, every metric, where the footprint lives, whether it fits and why not).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from basis.errors import DseError
from dse.core.bands import FAMILIES as BAND_FAMILIES
from dse.core.bands import band_source, is_dataflow
from dse.core.economics import COST_COLUMNS, cost_items_text
from dse.core.engines import efficiency_source, without_message_notes
from dse.core.kernel_model import band_of
from dse.core.router import simulate_routed
from dse.core.serving import PERCENTILES, overhead_in_flight
from dse.core.simulator import WARMUP, simulate, simulate_disaggregated
from dse.system import reasons as R
from dse.system.evaluator import EXPLAIN_KEYS, PERCENTILE_METRICS, Evaluation, evaluate, prepare, serving_engine
from dse.system.params import DEFAULTS
from dse.system.techniques import settings_text
from hwmodels.placement import parse_policy, policy_name
from hwmodels.presets import load_device
from hwmodels.topology import system_topology, tiers_label

ROW_KEYS = EXPLAIN_KEYS

#: the serving metrics a summary shows, in order
SUMMARY_METRICS = ("ttft_s", "tpot_s", "e2e_latency_s", "output_tokens_per_s", "output_tokens_per_s_per_user",
                   "output_tokens_per_s_per_device", "prefill_tokens_per_s")
#: what a summary adds under continuous batching (``dse.core.serving``)
SERVING_LOAD_METRICS = ("requests_per_s", "total_tokens_per_s", "queue_s", "running_batch", "kv_utilization",
                        *(f"{m}_p{q}_s" for m in PERCENTILE_METRICS for q in PERCENTILES))
#: energy, power and cost beside speed (NaN where the run's energy is not modelled: PIM, CPU splits, ...
#: or where no price is cited)
ENERGY_COST_METRICS = ("energy_per_token_j", "tokens_per_joule", "power_w", "power_demand_w", "system_tdp_w", "cost_usd",
                       "cost_per_million_tokens_usd", "capital_usd", "tco_usd_per_hour", "cost_per_mtok_input_usd",
                       "cost_per_mtok_output_usd", "tokens_per_dollar")
#: the scheduling policy's figures a summary shows where they apply (priority classes, SLO-aware admission)
SCHEDULER_METRICS = ("ttft_high_s", "ttft_low_s", "tpot_high_s", "tpot_low_s", "dropped_share", "ttft_high_p90_s",
                     "ttft_low_p90_s")
#: the serving settings a summary names under continuous batching
SERVING_SETTINGS = ("lengths", "num_prompts", "prefix_hit", "disaggregate", "slo_ttft", "slo_tpot", "slo_percentile",
                    "router_replicas", "router", "session_turns", "think_time", "scheduler", "priority_share")

#: the operator kinds the kernel layer prices in a prediction, whose bands ``analyze`` shows
KERNEL_BAND_KINDS = ("gemm", "generation_attention", "context_attention")


@dataclass(frozen=True)
class Analysis:
    """Result of one analysis: rows per operator and a summary dict (SI units)."""

    prefill: list[dict]
    decode: list[dict]
    summary: dict
    memory_bandwidth: float = float("nan")


def summary_of(ev: Evaluation, i: int) -> dict:
    """The summary of point ``i`` of an evaluation: parameters, layout, metrics, footprint,
    placement, fit and (when infeasible) why."""
    p = ev.point(i)
    m = {k: float(v[i]) for k, v in ev.metrics.items()}
    fits = not any(bool(ev.failed[c][i]) for c in R.MEMORY_CODES if c in ev.failed)
    s = {
        "model": p["model_name"], "hardware": p["hardware_name"], "devices": int(m["devices"]),
        "tp": int(m["tp_used"]), "pp": int(m["pp_used"]), "ep": int(p.get("ep", 1)), "cp": int(p.get("cp", 1)),
        "encoder_devices": int(np.nan_to_num(float(p.get("encoder_devices", 0) or 0))),
        "batch": int(m["batch_used"]),
        "prompt_len": int(p["prompt_len"]), "gen_len": int(p["gen_len"]), "weights": p["weights"],
        "activations": p["activations"], "kv": p["kv"], "flash_attention": bool(p["flash_attention"]),
        "sparse": bool(p["sparse"]), "techniques": settings_text(p), "engine": p.get("engine_name", ""),
        "efficiency": ev.efficiency_name(i), "tokens_per_target_step": m["tokens_per_target_step"],
        "quality_loss": m["quality_loss"], "quality_source": p.get("quality_source_name", ""),
        **{k: m[k] for k in SUMMARY_METRICS},
        "weights_bytes": m["weights_bytes"], "kv_cache_bytes": m["kv_cache_bytes"],
        "activation_bytes": m["activation_bytes"], "peak_memory_bytes": m["memory_bytes"],
        "capacity_bytes": m["capacity_bytes"], "engine_reserve_bytes": m["engine_reserve_bytes"],
        "offload": policy_name(parse_policy(p["offload"])),
        "offloaded_bytes": m["offloaded_bytes"], **{k: m[k] for k in ENERGY_COST_METRICS},
        "fits": fits, "feasible": bool(ev.feasible[i]),
        **{k: m[k] for k in ("moe_imbalance", "moe_dropped_fraction") if np.isfinite(m[k])},   # MoE models
    }
    s["layout"] = layout_text(s)
    if p.get("heads_note_name"):             # the heads the engine padded the model to (AWS Neuron)
        s["heads"] = p["heads_note_name"]
    if s["tp"] * s["pp"] * s["ep"] * s["cp"] == 1 and str(p.get("disaggregate") or "none") == "none":   # no message
        s["efficiency"] = without_message_notes(s["efficiency"])
    line = collectives_line(p, s, (ev.explained.get(i) or {}).get("collectives"))
    if line:
        s["collectives"] = line
    s["bands"] = {fam: [m[f"band_{fam}_low"], m[f"band_{fam}_high"]] for fam in BAND_FAMILIES
                  if np.isfinite(m[f"band_{fam}_low"])}
    s["kernel_source"] = p.get("kernel_source_name", "")
    if s["kernel_source"] in ("measured tables", "learned transfer"):   # the kernel layer's own bands
        s["kernel_bands"] = {kind: list(band) for kind in KERNEL_BAND_KINDS if (band := band_of(kind))}
    s["efficiency_source"] = efficiency_source(s["efficiency"])       # which layer's values it used
    s["band"] = band_source(s["efficiency"]) if s["bands"] else (
        "none: no published row of this spatial machine is predicted (dataflow layer)" if is_dataflow(s["efficiency"])
        else "none (the ideal bound or a given efficiency)")
    if m["state_bytes"] > 0:                 # a hybrid's recurrent state (in peak_memory_bytes)
        s["state_bytes"] = m["state_bytes"]
    if np.isfinite(m["chips_required"]):
        s["chips_required"] = int(m["chips_required"])
    if int(p.get("cpu_layers", 0) or 0):
        s.update(cpu_layers=int(p["cpu_layers"]), host_cpu=p.get("host_cpu_name", ""))
    s["serving"] = p["serving_name"]
    if s["serving"] == "continuous":
        rate = float(p.get("request_rate") or 0.0)
        s.update({"concurrency": int(p.get("concurrency") or 0) or None, "request_rate": rate or None,
                  **{k: m[k] for k in SERVING_LOAD_METRICS}})
        s["kv_pool_bytes"] = m["kv_pool_bytes"]
        s["lengths"] = p["lengths_name"]
        if p.get("lengths_clamped"):
            s["lengths_note"] = p["lengths_clamped"]
        s.update({k: p.get(k, DEFAULTS[k]) for k in SERVING_SETTINGS if k != "lengths"})
        if s["slo_ttft"] or s["slo_tpot"]:
            s["goodput"] = m["goodput"]
        s.update({k: m[k] for k in SCHEDULER_METRICS if np.isfinite(m[k])})   # the scheduler's (dse.core.scheduling)
    s["energy_basis"] = p.get("energy_basis_name", "")     # measured / tdp / class (hwmodels.power)
    if m["clock_fraction"] < 1:                            # a power cap (or the TDP) lowered its clock
        s["clock_fraction"] = m["clock_fraction"]
    if np.isfinite(m["energy_band_low"]):
        s["energy_band"] = [m["energy_band_low"], m["energy_band_high"]]
    note = unknown_energy_note(m)
    if note:
        s["energy_note"] = note
    s["cost_note"] = cost_items_text("given" if np.isfinite(float(p.get("price_usd", np.nan) or np.nan)) else
                                     "cited" if np.isfinite(m["cost_usd"]) else "missing",
                                     bool(np.isfinite(m["power_w"])), [k for k in COST_COLUMNS if k in p],
                                     float(np.nan_to_num(float(p.get("host_power_w", 0.0) or 0.0))))
    if p.get("hardware_note_name"):          # a derived design: why its price, die area or TDP is unknown
        s["hardware_note"] = p["hardware_note_name"]
    if not ev.feasible[i]:
        s["why"] = ev.reason_text(i)
        s["reason"] = ev.reason_key(i)
    return s


def layout_text(s: dict) -> str:
    """The parallel layout of a summary in words: 'TP 2 x PP 1 x EP 4 x DP 4 x CP 1'. DP is the
    attention data-parallel degree: in dse an expert-parallel group runs attention data parallel,
    each of its ep ranks with its own batch and KV cache, so DP equals EP."""
    return f"TP {s['tp']} x PP {s['pp']} x EP {s['ep']} x DP {s['ep']} x CP {s.get('cp', 1)}"


def collectives_line(p: dict, s: dict, algorithms: dict | None) -> str:
    """The collectives of the point's layout in words, with the tiers each crosses: 'tp 16:
    all-reduce hierarchical/ring (prefill), hierarchical/one-shot (decode), NVSwitch H100 8 + IB NDR
    x2' ("" for one device or without its explanation)."""
    if not algorithms:
        return ""
    size = p.get("scale_up_size")
    top = system_topology(p.get("hardware"), p.get("topology") or None,
                          None if size is None or np.isnan(float(size)) else float(size), p.get("scale_out") or None)
    parts = []
    for k, (name, width) in enumerate((("all-reduce", s["tp"]), ("all-to-all", s["tp"] * s["ep"]))):
        used = {stage: algos[k] for stage, algos in algorithms.items() if algos[k]}
        if not used:
            continue
        text = (next(iter(used.values())) if len(set(used.values())) == 1
                else ", ".join(f"{a} ({stage})" for stage, a in used.items()))
        group = f"tp {s['tp']}" if k == 0 else f"ep {s['ep']} x tp {s['tp']}"
        own = str(p["link"]) if p.get("link") else (None if top.scale_up.link else _own_link(p))
        parts.append(f"{group}: {name} {text}, {tiers_label(int(width), top, own)}")
    if s.get("cp", 1) > 1:              # the ring attention's K/V sends (``workloads.context_parallel``)
        own = str(p["link"]) if p.get("link") else (None if top.scale_up.link else _own_link(p))
        parts.append(f"cp {s['cp']} x tp {s['tp']}: ring attention (K/V point-to-point), "
                     f"{tiers_label(int(s['cp'] * s['tp']), top, own)}")
    return f"{top.name}: " + "; ".join(parts) if parts else ""


def _own_link(p: dict) -> str | None:
    """The name of the point's hardware preset's scale-up link (None where it has none or the
    hardware is not a preset)."""
    hw = p.get("hardware")
    try:
        device = load_device(hw) if isinstance(hw, str) else hw
    except DseError:
        return None
    link = getattr(device, "interconnect", None)
    return link.name if link is not None else None


def unknown_energy_note(m: dict) -> str:
    """Why a point's energy or cost figures are missing ("" when none is): no measured energy
    profile (or a run whose energy is not modelled), an unpublished static power, no price."""
    if np.isnan(m["power_demand_w"]):
        return ("energy, power and cost per token unknown: the run's energy is not modelled (PIM units)")
    if np.isnan(m["energy_per_token_j"]):
        return ("energy per token unknown: the device's static power is not published; give it "
                "(static_power_w / --static-power-w)")
    if np.isnan(m["cost_per_million_tokens_usd"]):
        return "cost per token unknown: the device has no cited price; give one (price_usd / --price-usd)"
    return ""


def analyze_point(columns: dict, *, ideal: bool = False, efficiency=None) -> tuple[Analysis, Evaluation]:
    """(Analysis, its one-row Evaluation) of the design point ``columns`` (scalars)."""
    ev = evaluate(columns, ideal=ideal, efficiency=efficiency, explain=True)
    if len(ev) != 1:
        raise DseError(f"analyze takes one design point, got {len(ev)}")
    ex = ev.explained.get(0, {"prefill": [], "decode": [], "memory_bandwidth": float("nan")})
    return Analysis(ex["prefill"], ex["decode"], summary_of(ev, 0), ex["memory_bandwidth"]), ev


def simulate_point(columns: dict, requests: int, *, seed: int = 0, ideal: bool = False,
                   efficiency=None, progress: Callable[[int], None] | None = None,
                   tokens: Callable[[int, int], None] | None = None) -> dict[str, float]:
    """The serving metrics of the design point ``columns`` (continuous batching) from the
    discrete-event simulator (``dse.core.simulator``): ``requests`` requests, their lengths
    drawn from the point's length distribution and, for an open loop, Poisson (or gamma: burstiness) arrivals (their
    gaps scaled to the rate's mean exactly), both with ``seed`` (a trace with arrival times at its own rate:
    its rows replayed in order at their arrivals, ``LengthSpec.replay``); every iteration priced as
    ``evaluate`` prices it. ``progress`` (optional, e.g. a tqdm bar's ``update``) is called
    with the number of requests each simulated iteration finishes (``requests`` in all),
    ``tokens`` (optional) with the output tokens it produces and those of all the requests.
    Returns the simulator's metrics (SI units; the efficiency model's request overhead applied
    after the run as ``evaluate`` applies it, ``overhead_in_flight``: in TTFT and end-to-end, and
    in a closed loop's throughput by Little's law)."""
    if isinstance(requests, bool) or not isinstance(requests, (int, np.integer)) or not 10 <= requests <= MAX_SIMULATED:
        raise DseError(f"simulate: expected a number of requests from 10 to {MAX_SIMULATED:,}, got {requests!r}")
    point = serving_engine(prepare(columns), 0, efficiency=efficiency, ideal=ideal)
    rng = np.random.default_rng(seed)
    arrivals = None
    spec = point.lengths
    if point.request_rate is not None and spec.arrivals and point.request_rate == spec.trace_rate:
        arrivals, prompts, gens = spec.replay(requests, point.max_tokens)     # the trace's own arrivals and rows
    else:
        if point.request_rate is not None:   # Poisson (gamma: burstiness) gaps, scaled to a mean of exactly 1 / rate
            k = point.burstiness
            gaps = rng.exponential(1.0, requests) if k == 1.0 else rng.gamma(k, 1.0 / k, requests)
            arrivals = np.cumsum(gaps / (gaps.mean() * point.request_rate))
        prompts, gens = spec.sample(requests, point.prompt_len, point.gen_len, rng, point.max_tokens)
    routed = point.replicas > 1 or point.session_turns > 1
    if routed:                           # replicas behind a router; sessions of turns: their first turns' starts
        res, hits = routed_run(point, prompts, gens, arrivals, rng)
    elif point.pools is None:
        res = simulate(point.step, point.engine, prompts, gens, concurrency=point.concurrency, arrivals=arrivals,
                       progress=progress, tokens=tokens, stages=point.stages, ranks=point.ranks,
                       warmup=0.0 if point.num_prompts else WARMUP)
    else:
        res = simulate_disaggregated(point.step, point.decode_step or point.step, point.engine,
                                     point.decode_engine or point.engine, *point.pools,
                                     point.transfer_s, prompts, gens, concurrency=point.concurrency,
                                     arrivals=arrivals, progress=progress, tokens=tokens, stages=point.stages,
                                     ranks=point.ranks, decode_ranks=point.decode_ranks,
                                     **({} if point.encoder is None else
                                        {"encoders": point.encoder[0], "encode_s": point.encoder[1]}))
    out = res.metrics()
    n = point.replicas
    if routed:                           # one replica's throughput, as evaluate reports it
        for k in ("requests_per_s", "output_tokens_per_s", "total_tokens_per_s"):
            out[k] /= n
        out["session_hits"] = float(hits)
    # the request overhead as evaluate prices it: in flight, in place of queueing where there is some
    o = point.request_overhead_s
    scale, hidden = (float(v[0]) for v in overhead_in_flight(
        np.array([np.nan if point.concurrency is None else float(point.concurrency) / n]), np.array([out["running_mean"]]),
        np.array([out["requests_per_s"]]), np.array([out["e2e_mean_s"]]), o))
    for k in ("requests_per_s", "output_tokens_per_s", "total_tokens_per_s"):
        out[k] *= scale
    for k in [k for k in out if k.startswith(("ttft_", "e2e_"))]:
        out[k] += o - hidden
    out["queue_mean_s"] -= hidden
    return out


def routed_run(point, prompts: np.ndarray, gens: np.ndarray, arrivals, rng):
    """(SimulationResult, turns that found their history cached) of a served point's replicas behind
    its router (``dse.core.router.simulate_routed``): the drawn requests, in order, cut into sessions of
    ``session_turns`` turns (each turn's new input and output), the sessions starting with the first of
    the drawn arrival gaps scaled to a mean of ``session_turns`` / rate (so that turns arrive at the
    rate, the sessions' starts as bursty as the arrivals), or a closed loop; think times exponential of
    mean ``think_s`` drawn with ``rng`` (a fixed one would lock later turns' arrivals to the phase of
    the iteration that ended the turn before, an artefact no user or tool has)."""
    if point.stages > 1 or point.ranks > 1:
        raise DseError("simulate: replicas behind a router and sessions are simulated for engines of one batch "
                       "(pp 1 and ep 1); the steady-state model prices the others")
    t = point.session_turns
    pairs = list(zip(prompts.tolist(), gens.tolist()))
    sessions = [pairs[i:i + t] for i in range(0, len(pairs), t)]
    starts = None
    if arrivals is not None:            # the first gaps, their mean t / rate exactly
        gaps = np.diff(arrivals, prepend=0.0)[:len(sessions)]
        starts = np.cumsum(gaps / gaps.mean() * t / point.request_rate)
    think = rng.exponential(point.think_s, len(prompts)) if point.think_s > 0 else 0.0
    return simulate_routed(point.step, point.engine, point.replicas, point.router, sessions,
                           concurrency=point.concurrency, starts=starts, think_s=think)


#: the most requests ``simulate_point`` runs (a reference run of minutes, not hours)
MAX_SIMULATED = 1_000_000


def scenario_columns(sc) -> dict:
    """The workload columns of a Scenario (its layout given)."""
    return {"batch": sc.batch, "prompt_len": sc.prompt_len, "gen_len": sc.gen_len, "weights": sc.weights.name,
            "activations": sc.activations.name, "kv": sc.kv.name, "flash_attention": sc.flash_attention,
            "tp": sc.tp, "pp": sc.pp, "ep": sc.ep}


def analyze(model, device, sc, *, batch_max: bool = False, ideal: bool = False, efficiency=None, offload="none",
            overlap: bool = True, sparse: bool = False, cpu_layers: int = 0, host_cpu=None) -> Analysis:
    """Analyze a prefill and a generation of scenario ``sc`` on ``sc.devices`` devices of
    ``device`` (a Device or a preset name) for ``model`` (a ModelSpec or a name).

    Infeasible for a reason other than memory (a format the device cannot compute, no
    interconnect, a layout that does not divide the model, ...): DseError with the
    reason. A footprint that does not fit is reported in the summary (``fits`` False and
    ``why``), as ``analyze`` on the command line does."""
    cols = {"model": model, "hardware": device, **scenario_columns(sc), "offload": policy_name(parse_policy(offload)),
            "overlap": overlap, "sparse": sparse, "cpu_layers": cpu_layers}
    if batch_max:
        cols["batch"] = "max"
    if host_cpu is not None:
        cols["host_cpu"] = host_cpu
    a, ev = analyze_point(cols, ideal=ideal, efficiency=efficiency)
    raise_unless_memory(ev, 0)
    return a


def raise_unless_memory(ev: Evaluation, i: int) -> None:
    """DseError with the reason when point ``i`` is infeasible for a reason other than memory."""
    if not ev.feasible[i] and int(ev.reason[i]) not in R.MEMORY_CODES:
        raise DseError(ev.reason_text(i))
