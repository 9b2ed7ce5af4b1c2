"""The per-point workload inputs of a table of design points, every name resolved
(``workload_columns`` -> ``WorkloadColumns``): model, formats, layout, serving, lengths,
techniques; DseError naming the column for an unknown name or an invalid combination."""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np

from basis.errors import DseError, name_or_kind
from dse.core.engines import get_engine
from dse.system.columns import Columns, anywhere, per_code, pointwise
from dse.system.hardware import HardwareArrays
from dse.system.images import image_columns
from dse.system.params import MAX_COUNT, ROUTERS, SCHEDULERS, checked_choice
from dse.system.techniques import pruned_models, quality_columns, technique_columns
from dse.system.workload import resolve_model
from hwmodels.formats import get_format
from hwmodels.links import load_link
from hwmodels.placement import parse_policy
from hwmodels.presets import load_device
from workloads.lengths import FIXED, parse_lengths
from workloads.optable import full_tile_buffer


@dataclass(frozen=True)
class WorkloadColumns:
    """The workload inputs of every design point, each name resolved. An array field holds one
    entry per point ([P]; a read-only constant where every point has the same); a field named
    for a kind of thing holds a code per point into the list of its distinct values (``model`` into
    ``models``, ``engine`` into ``engines``, ...). Lengths in tokens, times in seconds, rates per
    second."""

    model: np.ndarray             # [P] code into ``models``
    models: list                  # ModelSpec of each code (pruned as the point asks)
    draft: np.ndarray             # [P] code into ``drafts``
    drafts: list                  # the speculative draft of each code (None: no speculative decoding)
    spec_tokens: np.ndarray       # [P] tokens drafted a round
    spec_acceptance: np.ndarray   # [P] probability a drafted token is accepted
    tech: np.ndarray              # [P] code into ``techniques``
    techniques: list              # workloads.techniques.Techniques of each code
    sparse_units: np.ndarray      # [P] bool: 2:4 sparse weights
    weights: np.ndarray           # [P] code into ``weights_names``
    weights_names: list           # the weights' DataFormat names
    activations: np.ndarray       # [P] code into ``activations_names``
    activations_names: list       # the activations' DataFormat names
    kv: np.ndarray                # [P] code into ``kv_names``
    kv_names: list                # the KV cache's DataFormat names
    quality_loss: np.ndarray      # [P] published quality loss of the techniques (NaN: none published)
    quality_source: np.ndarray    # [P] code into ``quality_sources``
    quality_sources: list         # the citation of each quality loss
    policy: np.ndarray            # [P] code into ``policies``
    policies: list                # the offload policies
    prompt: np.ndarray            # [P] prompt length, tokens (a trace's mean)
    gen: np.ndarray               # [P] generated length, tokens (a trace's mean)
    ep: np.ndarray                # [P] expert parallelism
    cp: np.ndarray                # [P] context parallelism (ring attention ranks)
    cpu_layers: np.ndarray        # [P] layers on the host CPU
    max_context: np.ndarray       # [P] context limit, tokens (0: the model's)
    devices: np.ndarray           # [P] devices given (NaN: laid out)
    tp: np.ndarray                # [P] tensor parallelism given (NaN: laid out)
    pp: np.ndarray                # [P] pipeline parallelism given (NaN: laid out)
    flash: np.ndarray             # [P] bool: FlashAttention as run
    buffer: np.ndarray            # [P] on-chip buffer its tables are built for, bytes (0: no FlashAttention)
    sparse: np.ndarray            # [P] bool: weights at the sparse peak
    overlap: np.ndarray           # [P] bool: compute and memory traffic overlap
    two_batch_overlap: np.ndarray  # [P] bool: two micro-batches, one's communication under the other's compute
    engine: np.ndarray            # [P] code into ``engines``
    engines: list                 # dse.core.engines.Engine of each code
    batch: np.ndarray             # [P] sequences in a static batch (1 where sized or served)
    batch_max: np.ndarray         # [P] bool: the batch is the largest that fits
    serving: np.ndarray           # [P] code of the serving mode as given
    concurrency: np.ndarray       # [P] closed-loop concurrency (0: none)
    request_rate: np.ndarray      # [P] open-loop arrival rate, requests/s (0: none)
    burstiness: np.ndarray        # [P] open loop: the gamma shape of the arrival gaps (1: Poisson)
    num_prompts: np.ndarray       # [P] open loop: requests the run sends in all (0: an endless run)
    kv_block: np.ndarray          # [P] tokens a KV block holds
    max_running: np.ndarray       # [P] sequences an iteration may run
    prefill_chunk: np.ndarray     # [P] tokens an iteration may hold (0: prefill first)
    lengths: np.ndarray           # [P] code into ``length_specs``
    length_specs: list            # workloads.lengths.LengthSpec of each code
    prefix_hit: np.ndarray        # [P] share of a prompt served from the prefix cache
    slo_ttft: np.ndarray          # [P] TTFT objective, s (0: none)
    slo_tpot: np.ndarray          # [P] TPOT objective, s (0: none)
    slo_percentile: np.ndarray    # [P] the percentile the objectives hold at
    target_rate: np.ndarray       # [P] requests/s a service must sustain (0: none)
    prefill_devices: np.ndarray   # [P] devices of the prefill pool (NaN: not disaggregated)
    decode_devices: np.ndarray    # [P] devices of the decode pool (NaN: not disaggregated)
    decode_tp: np.ndarray         # [P] the decode pool's tensor parallelism (NaN: the prefill pool's)
    decode_ep: np.ndarray         # [P] the decode pool's expert parallelism (NaN: the prefill pool's)
    disaggregated: np.ndarray     # [P] bool: prefill and decode on pools of their own
    continuous: np.ndarray        # [P] bool: served under continuous batching
    router_replicas: np.ndarray   # [P] engines behind the router (1: one)
    router: np.ndarray            # [P] code into ``ROUTERS``
    session_turns: np.ndarray     # [P] turns of a session (1: no sessions)
    think_time: np.ndarray        # [P] sessions: seconds from a turn's last token to the next turn
    kv_tier: np.ndarray           # [P] code into ``kv_tiers`` (the KV cache's second tier)
    kv_tiers: list                # each code's tier name ('none', 'host', 'cxl', 'ssd')
    swap: np.ndarray              # [P] bool: swap preemption (else recompute)
    preempt_priced: np.ndarray    # [P] bool: the steady state prices preemption (``preemption`` not 'unpriced')
    prefix_count: np.ndarray      # [P] distinct shared prefixes
    prefix_zipf: np.ndarray       # [P] the Zipf exponent of their popularity
    decode_hardware: np.ndarray | None = None   # [P] code into ``decode_hardwares``
    decode_hardwares: list | None = None        # the decode pool's preset of each code ("": the point's own)
    pd_link: np.ndarray | None = None           # [P] code into ``pd_links``
    pd_links: list | None = None                # the prefill-to-decode link of each code (None: the default)
    scheduler: np.ndarray | None = None         # [P] code into ``SCHEDULERS`` (``dse.core.scheduling``)
    priority_share: np.ndarray | None = None    # [P] --scheduler priority: the high class's share of the requests
    slo_ttft_high: np.ndarray | None = None     # [P] --scheduler priority: the high class's TTFT SLO, s (0: slo_ttft)
    encoder_devices: np.ndarray | None = None   # [P] devices of the vision-encoder pool (0: on the prefill engines)


def workload_columns(cols: Columns, hw: HardwareArrays) -> WorkloadColumns:
    """Per-point workload arrays (``WorkloadColumns``), every name resolved (DseError naming the
    column)."""
    w = {}
    base_codes, base_models = resolved_column(cols, "model", resolve_model)
    w["model"], w["models"] = pruned_models(cols, base_codes, base_models)
    technique_columns(cols, w)
    for k in ("weights", "activations", "kv"):
        w[k], formats = resolved_column(cols, k, lambda v, k=k: get_format(str(v), f"{k} format"))
        w[k + "_names"] = [f.name for f in formats]
    quality_columns(cols, base_codes, base_models, w)
    w["policy"], w["policies"] = resolved_column(cols, "offload", parse_policy)
    w["prompt"], w["gen"] = cols.numbers("prompt_len"), cols.numbers("gen_len")
    w["ep"], w["cpu_layers"] = cols.numbers("ep"), cols.numbers("cpu_layers")
    w["cp"] = cols.numbers("cp")
    w["max_context"] = cols.numbers("max_context")
    w["devices"], w["tp"], w["pp"] = cols.numbers("devices"), cols.numbers("tp"), cols.numbers("pp")
    w["flash"], w["sparse"], w["overlap"] = cols.flags("flash_attention"), w["sparse_units"], cols.flags("overlap")
    w["two_batch_overlap"] = cols.flags("two_batch_overlap")
    w["engine"], w["engines"] = resolved_column(cols, "engine", get_engine)
    if not cols.has("flash_attention"):     # the default: the engine's kernel, fused where the hardware can tile
        fuses = per_code([e.flash_attention for e in w["engines"]], w["engine"])
        w["flash"] = pointwise(lambda f, b, u: f & (b > 0) & u, w["flash"], hw.buffer, fuses)
    w["buffer"] = _tiling_buffer(w, hw)
    w["batch"], w["batch_max"] = cols.batch()
    w["serving"], modes = resolved_column(cols, "serving", partial(checked_choice, "serving"))
    w["concurrency"], w["request_rate"] = cols.numbers("concurrency"), cols.numbers("request_rate")
    w["burstiness"], w["num_prompts"] = cols.numbers("burstiness"), cols.numbers("num_prompts")
    w["router_replicas"], w["session_turns"] = cols.numbers("router_replicas"), cols.numbers("session_turns")
    w["think_time"] = cols.numbers("think_time")
    codes, routers = resolved_column(cols, "router", partial(checked_choice, "router"))
    w["router"] = per_code(np.array([ROUTERS.index(r) for r in routers], dtype=np.int64), codes)
    w["kv_block"], w["max_running"] = cols.numbers("kv_block"), cols.numbers("max_running")
    w["prefill_chunk"] = cols.numbers("prefill_chunk")
    w["lengths"], w["length_specs"] = resolved_column(cols, "lengths", parse_lengths)
    _trace_lengths(w, cols.has("burstiness"))
    image_columns(cols, w)
    for k in ("prefix_hit", "slo_ttft", "slo_tpot", "slo_percentile", "target_rate"):
        w[k] = cols.numbers(k)
    if anywhere(pointwise(lambda r, a, b: (r > 0) & ~(a > 0) & ~(b > 0), w["target_rate"], w["slo_ttft"], w["slo_tpot"])):
        raise DseError(f"{cols.where}: target_rate: the engines a service needs follow from its goodput under SLOs; "
                       f"give slo_ttft and/or slo_tpot too")
    codes, pools = resolved_column(cols, "disaggregate", _pools)
    w["prefill_devices"] = per_code(np.array([p[0] if p else np.nan for p in pools], dtype=float), codes)
    w["decode_devices"] = per_code(np.array([p[1] if p else np.nan for p in pools], dtype=float), codes)
    w["disaggregated"] = pointwise(lambda p: ~np.isnan(p), w["prefill_devices"])
    w["decode_tp"], w["decode_ep"] = cols.numbers("decode_tp"), cols.numbers("decode_ep")
    w["encoder_devices"] = _encoder_devices(cols, w)
    w["decode_hardware"], w["decode_hardwares"] = resolved_column(cols, "decode_hardware", _decode_hardware)
    w["pd_link"], w["pd_links"] = resolved_column(cols, "pd_link", lambda v: None if v == "default" else load_link(str(v)))
    asked = per_code([m == "continuous" for m in modes], w["serving"])
    loaded = pointwise(lambda c, r: (c > 0) | (r > 0), w["concurrency"], w["request_rate"])
    served = {"concurrency": loaded, "lengths": per_code([spec.kind != FIXED for spec in w["length_specs"]], w["lengths"]),
              **{k: pointwise(lambda x: x > 0, w[k]) for k in ("prefix_hit", "slo_ttft", "slo_tpot")},
              "disaggregate": w["disaggregated"],
              **{k: pointwise(lambda x: x > 1, w[k]) for k in ("router_replicas", "session_turns")}}
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
    _routed_checks(cols, w)
    _scheduler_columns(cols, w)
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
    for k in ("prompt", "gen", "ep", "cp"):
        if anywhere(pointwise(lambda x: x < 1, w[k])):
            raise DseError(f"{cols.where}: {dict(prompt='prompt_len', gen='gen_len').get(k, k)}: "
                           f"expected a positive integer")
    w["kv_tier"], w["kv_tiers"] = resolved_column(cols, "kv_tier", partial(checked_choice, "kv_tier"))
    codes, rules = resolved_column(cols, "preemption", partial(checked_choice, "preemption"))
    w["swap"] = per_code([r == "swap" for r in rules], codes)
    w["preempt_priced"] = per_code([r != "unpriced" for r in rules], codes)
    w["prefix_count"], w["prefix_zipf"] = cols.numbers("prefix_count"), cols.numbers("prefix_zipf")
    prefix = ROUTERS.index("prefix-affinity")
    if anywhere(pointwise(lambda r, n, c: (r == prefix) & (n > 1) & ~(c > 1), w["router"], w["router_replicas"],
                          w["prefix_count"])):
        raise DseError(f"{cols.where}: router: prefix-affinity routes by shared prefix; give prefix_count above 1 "
                       f"(and prefix_hit) at those points")
    tier = per_code([t != "none" for t in w["kv_tiers"]], w["kv_tier"])
    if anywhere(pointwise(lambda s, t: s & ~t, w["swap"], tier)):
        raise DseError(f"{cols.where}: preemption: 'swap' writes a preempted sequence's KV cache to a second tier; "
                       f"give kv_tier (host, cxl or ssd) at those points, or preemption 'recompute'")
    host = per_code([t == "host" for t in w["kv_tiers"]], w["kv_tier"])
    if anywhere(pointwise(lambda h, ok: h & ~ok, host, hw.has_host)):
        raise DseError(f"{cols.where}: kv_tier: 'host' needs a device with host memory and a host link; give cxl or "
                       f"ssd, or a preset with a host")
    return WorkloadColumns(**w)


def _tiling_buffer(w: dict, hw: HardwareArrays) -> np.ndarray:
    """[P] the on-chip buffer each point's operator tables are built for, bytes: the device's as
    FlashAttention's tiling of its model sees it, no more than fills every row block
    (``optable.full_tile_buffer``: devices differing only above it share tables); the device's own
    where a draft model is priced with it; 0 without FlashAttention."""
    full = per_code([float(full_tile_buffer(m)) for m in w["models"]], w["model"])     # per element byte
    elem = pointwise(np.maximum, *(per_code([get_format(n).bytes for n in w[k + "_names"]], w[k])
                                   for k in ("activations", "kv")))
    drafted = per_code([d is not None for d in w["drafts"]], w["draft"])
    return pointwise(lambda f, b, full_, e, d: np.where(f, np.where(d, b, np.minimum(b, full_ * e)), 0.0),
                     w["flash"], hw.buffer, full, elem, drafted)


def _scheduler_columns(cols: Columns, w: dict) -> None:
    """The scheduling policy's columns (``scheduler``, ``priority_share``); DseError where a policy
    other than FCFS meets what it does not model: a closed loop, disaggregated pools, and SLO-aware
    admission without a TTFT SLO."""
    codes, names = resolved_column(cols, "scheduler", partial(checked_choice, "scheduler"))
    w["scheduler"] = per_code(np.array([SCHEDULERS.index(n) for n in names], dtype=np.int64), codes)
    w["priority_share"] = cols.numbers("priority_share")
    w["slo_ttft_high"] = cols.numbers("slo_ttft_high")
    if anywhere(pointwise(lambda h, t: (h > 0) & ~(t > 0), w["slo_ttft_high"], w["slo_ttft"])):
        raise DseError(f"{cols.where}: slo_ttft_high: the high class's TTFT SLO goes beside the low class's; give "
                       f"slo_ttft too")
    other = pointwise(lambda s: s > 0, w["scheduler"])
    if anywhere(pointwise(lambda o, r: o & ~(r > 0), other, w["request_rate"])):
        raise DseError(f"{cols.where}: scheduler: priority and slo-admission are modelled in an open loop; give "
                       f"request_rate at those points (or scheduler fcfs)")
    if anywhere(pointwise(lambda o, d: o & d, other, w["disaggregated"])):
        raise DseError(f"{cols.where}: scheduler: priority and slo-admission are modelled for colocated engines, "
                       f"not disaggregated pools; leave disaggregate out or scheduler fcfs")
    if anywhere(pointwise(lambda s, t: (s == 2) & ~(t > 0), w["scheduler"], w["slo_ttft"])):
        raise DseError(f"{cols.where}: scheduler: slo-admission drops a request waiting past its TTFT SLO; give "
                       f"slo_ttft at those points")


def _routed_checks(cols: Columns, w: dict) -> None:
    """DseError where replicas behind a router or sessions meet what they do not model: sessions of
    several turns in a closed loop, either on disaggregated pools."""
    if anywhere(pointwise(lambda t, r: (t > 1) & ~(r > 0), w["session_turns"], w["request_rate"])):
        raise DseError(f"{cols.where}: session_turns: sessions of several turns arrive in an open loop; give "
                       f"request_rate (turns per second)")
    for key in ("router_replicas", "session_turns"):
        if anywhere(pointwise(lambda x, d: (x > 1) & d, w[key], w["disaggregated"])):
            raise DseError(f"{cols.where}: {key}: replicas behind a router and sessions are modelled for "
                           f"colocated engines, not disaggregated pools; leave disaggregate out or {key} at 1")


def _pools(value) -> tuple[int, int] | None:
    """(prefill devices, decode devices) of a ``disaggregate`` value ``P:D``, or None for
    ``none``; DseError naming what is allowed."""
    text = str(value).strip()
    if text == "none":
        return None
    head, sep, tail = text.partition(":")
    try:
        pair = (int(head), int(tail)) if sep and text.isascii() else None   # int() reads '١' too
    except ValueError:
        pair = None
    if pair is None or min(pair) < 1 or max(pair) > MAX_COUNT:
        raise DseError(f"disaggregate: expected 'none' or 'P:D' (prefill devices : decode devices, positive "
                       f"integers, e.g. '2:6'), got {name_or_kind(value)}")
    return pair


def _decode_hardware(value) -> str:
    """The decode pool's hardware preset named by ``value`` ("" for 'same': the point's own); DseError
    naming the valid presets."""
    if value == "same":
        return ""
    load_device(str(value))
    return str(value)


def _trace_lengths(w: dict, burstiness_given: bool) -> None:
    """Points whose lengths are a trace take its mean prompt and output lengths; a trace with arrival
    times gives the points without a load its rate (an open loop) and, where the burstiness column is
    not given, its gaps' burstiness (``LengthSpec.trace_rate``, ``trace_burstiness``)."""
    for code, spec in enumerate(w["length_specs"]):
        if spec.kind == "trace":
            at = w["lengths"] == code
            w["prompt"], w["gen"] = w["prompt"].copy(), w["gen"].copy()
            w["prompt"][at], w["gen"][at] = spec.trace_means()
            if spec.arrivals:
                rate, conc = (np.array(np.broadcast_to(w[k], at.shape), dtype=float)
                              for k in ("request_rate", "concurrency"))
                free = at & ~(rate > 0) & ~(conc > 0)
                rate[free] = spec.trace_rate
                w["request_rate"] = rate
                if not burstiness_given:
                    k = np.array(np.broadcast_to(w["burstiness"], at.shape), dtype=float)
                    k[at] = spec.trace_burstiness
                    w["burstiness"] = k


def resolved_column(cols: Columns, key: str, resolve) -> tuple[np.ndarray, list]:
    """(code per point, each distinct value of column ``key`` resolved); DseError naming the column."""
    codes, values = cols.labels(key)
    try:
        return codes, [resolve(v) for v in values]
    except DseError as e:
        said = str(e)
        head = f"{cols.where}: " if said.startswith(key) else f"{cols.where}: {key}: "
        raise DseError(head + said, verbatim_from=len(head) + (len(key) if said.startswith(key) else 0)) from None


def _encoder_devices(cols: Columns, w: dict) -> np.ndarray:
    """``encoder_devices`` [P] (0: none); DseError naming the column where a point gives an encoder
    pool without a disaggregated layout or without images."""
    enc = cols.numbers("encoder_devices")
    bad = pointwise(lambda e, d, i: (e > 0) & (~d | ~(i > 0)), enc, w["disaggregated"], cols.numbers("images"))
    if anywhere(bad):
        raise DseError(f"{cols.where}: encoder_devices: an encoder pool is a third pool of a disaggregated layout "
                       f"whose requests carry images; give disaggregate P:D and images > 0 with it, or leave it 0")
    return enc
