"""Served points: design points under in-flight (continuous) batching. Their inputs
(``serving_inputs``: the iteration model and the paged KV cache), their steady state priced
iteration by iteration (``price_served``, ``dse.core.serving``), replicas for a target rate, and
one point as the discrete-event simulator runs it (``ServedPoint``, ``served_point``)."""
from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, fields, replace
from functools import partial

import numpy as np

from basis.errors import DseError
from dse.core import kv_tiers
from dse.core.disaggregated import disaggregated_goodput, disaggregated_state
from dse.core.efficiency import Efficiency
from dse.core.engines import reserve_bytes
from dse.core.kernel_arrays import SHAPE_FIELDS
from dse.core.kv_tiers import TierLoad
from dse.core.metrics import rates_per_user_and_device
from dse.core.overlap import step_s
from dse.core.roofline import OpArrays, SystemArrays, step_energy_j, transfer_time
from dse.core.router import PREFIX_AFFINITY, Routed, prefix_routed_hits, replica_dispersion, with_sessions
from dse.core.scheduling import PRIORITY, SLO_ADMISSION, impatient_share, policy, priority_ttft
from dse.core.serving import (
    CLASS_PERCENTILES,
    PERCENTILES,
    Load,
    Pools,
    admission_tail,
    goodput,
    pipeline_fill,
    steady_state,
    with_request_overhead,
)
from dse.core.sessions import session_lengths
from dse.core.simulator import EngineConfig
from dse.system.columns import Columns
from dse.system.grouping import DecodePool, Group, ServedSpeculation, ServingInputs, Speculation, positions
from dse.system.hardware import HardwareArrays, assemble
from dse.system.inputs import WorkloadColumns
from dse.system.iteration import IterationModel, busiest_rank_counts, iteration_model
from dse.system.params import DEFAULTS
from dse.system.pricing import measured_only, power_and_energy
from dse.system.result import PERCENTILE_METRICS
from dse.system.workload import tables
from hwmodels.tiers import load_tier, tier_fraction
from workloads import encoder as vision_encoder
from workloads.footprint import state_bytes_per_sequence
from workloads.lengths import Lengths, LengthSpec
from workloads.optable import residual_bytes_per_token
from workloads.techniques import tokens_per_target_step
from workloads.vision import request_image_tokens

#: tokens a prefill-first iteration (prefill_chunk 0) may hold, or one whole prompt if longer:
#: the default budget (``dse.system.params``)
UNCHUNKED_BUDGET = float(DEFAULTS["prefill_chunk"])

#: served points priced at once (``price_served_in_slices``). The steady state of a point held
#: about 1.1 MB while it was worked out (Markov chains of up to a few hundred states, a [states x
#: counts] table each), so slices were 64 points; a closed loop's chain is now vectors and the fixed
#: point reads no tables it does not need, so slices of 256 pay the pricer's fixed cost a quarter as
#: often: 10^4 open-loop lognormal points 27 s in slices of 64 -> 12 s in slices of 256 at a peak of
#: 145 -> 157 MiB; 1,000 goodput points 10.2 -> 8.7 s, 71 -> 91 MiB (``benchmarks/bench_serving.py
#: N --memory [--case C] --slice S``, 2 loaded cores). Patchable: tests force small slices
#: (``tests/test_served_slices.py``: one call's results).
SERVED_SLICE = 256
#: served points priced at once where every one is a closed loop at one request length without SLOs
#: (``_slice_size``): their steady state is the wave model's vectors (``dse.core.serving._waves``),
#: a few kB a point with its iteration's operator arrays, so the pricer's fixed cost is paid once for
#: this many: 16,384 such points 0.48 s in slices of 256 -> 0.27 s in slices of 4,096 (0.26 s in one
#: call; ``benchmarks/bench_serving.py 16384 --only "closed, fixed lengths" --slice N``, one core)
WAVE_SLICE = 4096

#: bytes/s of the link an engine without a known one is priced on before its timed figures are dropped
#: (``price_served``; the point is infeasible for ``interconnect``)
STAND_IN_LINK = 1e12


def price_served_in_slices(g: Group, eff: Efficiency) -> dict:
    """``price_served`` of a group's points, ``SERVED_SLICE`` points at a time so that the memory
    held is bounded whatever the group's size; the metrics ([P] arrays) of one call, to rounding
    (every served point is priced on its own figures). Points whose every figure the pricing reads
    is the same (``repeated_points``: a sweep of a price, a cost or another column no served figure
    depends on) are priced once, and each reads its own copy."""
    repeated = repeated_points(g, eff)
    if repeated is not None:
        return _priced_once(g, eff, *repeated)
    n, size = len(positions(g.index)), _slice_size(g)
    if n <= size:
        return price_served(g, eff)
    out = {}
    for lo in range(0, n, size):
        pos = np.arange(lo, min(lo + size, n))
        for k, v in price_served(_served_slice(g, pos), eff).items():
            if k not in out:
                out[k] = np.empty(n, dtype=np.asarray(v).dtype)
            out[k][pos] = v
    return out


def _slice_size(g: Group) -> int:
    """The points of a served group priced at once: ``WAVE_SLICE`` (at least ``SERVED_SLICE``) where
    every point is a closed loop of one engine at one request length without SLOs (no Markov chain
    of iterations, no goodput search in the slice), else ``SERVED_SLICE``."""
    s = g.serving
    waves = s.plain and len(np.atleast_1d(s.lengths.weight)) == 1 and bool(np.all(np.isfinite(s.concurrency))) and \
        not np.any((s.slo_ttft > 0) | (s.slo_tpot > 0))
    return max(WAVE_SLICE, SERVED_SLICE) if waves else SERVED_SLICE


def repeated_points(g: Group, eff: Efficiency) -> tuple[np.ndarray, np.ndarray] | None:
    """(one position of each distinct point in the group, ascending; each point's distinct one [P])
    where some of a served group's points are equal in every per-point figure its pricing reads (the
    hardware's ``SystemArrays`` and the serving inputs' arrays, byte for byte); None where they are
    all distinct, or where the group carries per-point figures elsewhere (a CPU layer split,
    disaggregated pools, a decode pool of its own, a router, a KV tier, an encoder pool, a kernel
    layer per point), which are then priced point by point."""
    s, n = g.serving, len(positions(g.index))
    if n < 2 or g.cpu is not None or not s.plain or eff.kernel is not None and eff.kernel.per_point:
        return None
    figures = [v for v in g.system.__dict__.values() if isinstance(v, np.ndarray)]
    figures += [v for f in fields(s) if isinstance(v := getattr(s, f.name), np.ndarray)]
    if any(v.dtype.hasobject or v.shape[:1] != (n,) for v in figures):
        return None
    rows = np.ascontiguousarray(np.hstack([np.asarray(v, dtype=float).reshape(n, -1) for v in figures]))
    keys = rows.view(np.dtype((np.void, rows.shape[1] * rows.itemsize))).ravel()
    _, first, back = np.unique(keys, return_index=True, return_inverse=True)
    if len(first) == n:
        return None
    order = np.argsort(first)                          # the distinct points in the group's order
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return first[order], rank[np.ravel(back)]


def _priced_once(g: Group, eff: Efficiency, first: np.ndarray, back: np.ndarray) -> dict:
    """``price_served_in_slices`` of the distinct points ``first`` of a group (``repeated_points``),
    each point's metrics its distinct one's (``back``); a goodput search left for later
    (``deferring_goodput``) carries the repeated points' positions (``GoodputJob.copies``)."""
    jobs = _DEFERRED.get()
    before = 0 if jobs is None else len(jobs)
    out = price_served_in_slices(_served_slice(g, first), eff)
    m = len(first)
    out = {k: v[back] if isinstance(v, np.ndarray) and v.ndim and len(v) == m else v for k, v in out.items()}
    if jobs is not None and len(jobs) > before:
        pos = positions(g.index)
        copy = np.flatnonzero(first[back] != np.arange(len(back)))     # the points priced as another
        priced_as = pos[first[back[copy]]]                              # ... the position of that one
        for k in range(before, len(jobs)):
            job = jobs[k]
            sorter = np.argsort(job.points)
            rows = sorter[np.minimum(np.searchsorted(job.points, priced_as, sorter=sorter), len(sorter) - 1)]
            hit = job.points[rows] == priced_as
            jobs[k] = replace(job, copies=(pos[copy[hit]], rows[hit]))
    return out


def _served_slice(g: Group, pos: np.ndarray) -> Group:
    """The points ``pos`` (positions in the group) of a served group, every per-point figure taken."""
    return replace(g, index=positions(g.index)[pos], system=g.system.take(pos), serving=g.serving.take(pos),
                   cpu=None if g.cpu is None else g.cpu.take(pos))


def price_served(g: Group, eff: Efficiency) -> dict:
    """Serving metrics of a group's points under in-flight batching (``dse.core.serving``):
    every iteration priced by the roofline (``step_time`` of the IterationModel's arrays). A point
    on several devices without a link between them (infeasible for ``interconnect``) has NaN
    figures: the roofline cannot price its iterations, and the queueing model is not asked to."""
    unlinked = (g.serving.devices > 1) & ~(np.isfinite(g.system.link_bandwidth) & (g.system.link_bandwidth > 0))
    d_unlinked = _decode_unlinked(g.serving)
    unlinked = unlinked | d_unlinked
    if unlinked.any():             # priced on a stand-in link, then its figures dropped
        stand = replace(g, system=g.system.replaced(link_bandwidth=np.where(unlinked, STAND_IN_LINK,
                                                                            g.system.link_bandwidth)))
        if d_unlinked.any():
            stand = replace(stand, serving=replace(stand.serving, decode=_decode_linked(stand.serving.decode)))
        with goodput_at_once():    # its timed figures are dropped below: the goodput with them, not after
            out = price_served(stand, eff)
        for k, v in out.items():      # admission's figures stay (batch, KV use, tokens a step), as a closed
            #                           loop at fixed lengths gave them before; every timed figure is NaN
            if isinstance(v, np.ndarray) and v.dtype.kind == "f" and v.shape[:1] == unlinked.shape \
                    and "batch" not in k and k not in ("kv_utilization", "tokens_per_target_step"):
                v[unlinked] = np.nan
        return out
    s = g.serving
    spec = s.speculation
    pricer = group_pricer(iteration_pricer if spec is None else _speculative_pricer(spec), s.ranks, s.stages)
    iteration_time = pricer(s.iteration, g.system, eff)
    d_eff = None if s.decode is None else s.decode.efficiency(eff, g.engine, g.kv_group, g.family)
    load = _engine_load(s, g.system, eff, d_eff)
    if s.routed is not None:                   # a session's history found cached where the router sends it
        load = with_sessions(load, s.routed, lambda ld: steady_state(ld, iteration_time))
    pooled = load.pools is not None
    late = eff.request_overhead_s              # the engine's per-request overhead delays the first token
    state = disaggregated_state if pooled else partial(steady_state, high_share=_high_share(s))
    out = with_request_overhead(state(load, iteration_time), load.concurrency, late)
    out, per_class = _scheduled(s, out, load, iteration_time, late)
    share = prefill_time_share(out, load, iteration_time,
                               s.pools[0] * g.tables.scenario.devices / s.devices if pooled else None)
    e = 1.0 if spec is None else spec.e
    if spec is not None:                       # a round of E tokens stood for one token: back to tokens
        out["tpot_s"] = out["tpot_s"] / e
        out.update({f"tpot_p{q}_s": out[f"tpot_p{q}_s"] / e for q in PERCENTILES})
        out["output_tokens_per_s"] = out["requests_per_s"] * spec.mean_gen
        out["total_tokens_per_s"] = out["requests_per_s"] * (spec.mean_gen + load.lengths.mean_prompt)
    slo = (s.slo_ttft > 0) | (s.slo_tpot > 0)
    good = np.full(len(slo), np.nan)
    priced = np.isfinite(out["requests_per_s"])   # NaN: an iteration the roofline cannot price (no link)
    if (slo & priced).any():
        at = np.flatnonzero(slo & priced)
        g_load = _engine_load(s.take(at), g.system.take(at), eff, d_eff)
        if load.session_cached is not None:    # the hits at the point's own load
            g_load = replace(g_load, session_cached=load.session_cached[at], session_spread=load.session_spread[at])
        g_sys = g.system.take(at)
        job = GoodputJob(g_load, pricer(s.iteration, g_sys, eff),
                         np.where(s.slo_ttft[at] > 0, np.maximum(s.slo_ttft[at] - late, 1e-300), 0.0),
                         s.slo_tpot[at] * e, s.slo_percentile[at], positions(g.index)[at], s.target_rate[at],
                         (s.iteration, g_sys, eff) if spec is None and s.ranks * s.stages == 1 else None)
        classes = _classes_slo(s, at, late)
        jobs = _DEFERRED.get()
        if jobs is not None and not pooled and classes is None and _mergeable(g_load):
            jobs.append(job)           # priced with every other group's (``goodput_of_jobs``); NaN until then
        else:
            good[at] = (disaggregated_goodput if pooled else partial(goodput, classes=classes))(
                job.load, job.pricer, job.slo_ttft, job.slo_tpot, job.percentile)
    energy = _serving_energy(g, s, out, load)
    out_tps = out["output_tokens_per_s"]
    return {**energy, "ttft_s": out["ttft_s"] + late, "tpot_s": out["tpot_s"], "e2e_latency_s": out["e2e_latency_s"] + late,
            **{f"{m}_p{q}_s": out[f"{m}_p{q}_s"] + (late if m != "tpot" else 0.0)
               for m in PERCENTILE_METRICS for q in PERCENTILES},
            **rates_per_user_and_device(out_tps, out["tpot_s"], s.devices),
            "prefill_tokens_per_s": out["requests_per_s"] * load.lengths.mean_prompt,
            "requests_per_s": out["requests_per_s"], "total_tokens_per_s": out["total_tokens_per_s"],
            "queue_s": out["queue_s"], "running_batch": out["running_batch"],
            "kv_utilization": out["kv_utilization"], "batch_used": np.round(out["running_batch"]),
            **_pools_figures(s),
            "goodput": good, "replicas": _replicas(s.target_rate, good), "saturated": out["saturated"],
            "tokens_per_target_step": np.full(len(slo), e), "prefill_time_share": share,
            "slo_missed": (s.target_rate > 0) & (good <= 0), **per_class}


#: the goodput searches ``price_served`` leaves to ``goodput_of_jobs`` (None: it prices them at once)
_DEFERRED: ContextVar[list | None] = ContextVar("deferred_goodput", default=None)


@dataclass(frozen=True)
class GoodputJob:
    """One group's goodput search, left for later (``deferring_goodput``): its points' Load [A], iteration
    pricer (rows: positions in that Load), SLOs (seconds; 0: none), percentile, the positions of the
    points in the caller's plan (``points``, the group's index) and their target rates (requests/s)."""

    load: Load
    pricer: Callable
    slo_ttft: np.ndarray
    slo_tpot: np.ndarray
    percentile: np.ndarray
    points: np.ndarray
    target_rate: np.ndarray
    plain: tuple | None = None     # (IterationModel, SystemArrays [A], Efficiency) of ``iteration_pricer``'s
    copies: tuple | None = None    # (positions of points equal to one of ``points``, the row of each): same goodput


@contextmanager
def deferring_goodput():
    """Within it, ``price_served`` leaves each group's goodput search (of a single engine, without a
    KV tier or sessions) to the list it yields, its goodput NaN (and ``replicas``, ``slo_missed`` as of
    NaN) until ``goodput_of_jobs`` prices them all together: the chain's fixed cost paid once for
    every group's points, not once per group (a study of one point a group paid it per point)."""
    jobs: list = []
    token = _DEFERRED.set(jobs)
    try:
        yield jobs
    finally:
        _DEFERRED.reset(token)


@contextmanager
def goodput_at_once():
    """Within it, ``price_served`` prices its goodput at once (inside ``deferring_goodput``)."""
    token = _DEFERRED.set(None)
    try:
        yield
    finally:
        _DEFERRED.reset(token)


def _mergeable(load: Load) -> bool:
    """Whether a Load's points can be stacked with another group's (``_stacked_loads``): one engine of
    one pipeline stage, no KV tier, no sessions."""
    return load.pools is None and load.tier is None and load.session_cached is None and load.stages == 1


def _lengths_key(load: Load) -> tuple:
    """What two Loads' request lengths are equal by (their class arrays' bytes), and whether they have
    a dispersion: Loads of one key stack."""
    ln = load.lengths
    return (tuple(np.asarray(a, float).tobytes() for a in (ln.prompt, ln.gen, ln.weight, ln.prompt_var, ln.gen_var)),
            load.dispersion is None)


def _stacked_loads(loads: list) -> Load:
    """The Loads (of one ``_lengths_key``) as one, their points one after another."""
    first = loads[0]
    n = [len(ld.kv_block) for ld in loads]
    skip = ("lengths", "pools", "tier", "session_cached", "session_spread", "stages")   # stages: 1 (``_mergeable``)
    stacked = {f.name: np.concatenate([np.broadcast_to(getattr(ld, f.name), (k,)) for ld, k in zip(loads, n)])
               for f in fields(Load) if f.name not in skip and getattr(first, f.name) is not None}
    return replace(first, **stacked)


#: the OpArrays fields an iteration's counts set (``IterationModel.arrays``); the rest describe the operators
_COUNTED = ("ops", "weight_bytes", "act_bytes", "kv_bytes", "comm_bytes", "p2p_bytes", "vector_ops")
#: the OpArrays fields of the kernels' shapes (and a grouped GEMM's group), read by the kernel layer alone
_SHAPES = (*SHAPE_FIELDS, "group_weight_bytes")


def _stack_key(plain: tuple | None):
    """What the groups whose iterations one roofline call prices share (``_stacked_pricer``): one
    Efficiency (without a kernel layer of its own), operators described alike (every OpArrays field but
    the counted ones, and but the kernels' shapes, which only the kernel layer and two-batch overlap
    read: ``dse.core.efficiency.kernel_fractions``, ``dse.core.overlap``) and the same system fields
    given; None: priced alone."""
    if plain is None:
        return None
    model, system, eff = plain
    if eff.kernel is not None:
        return None
    t = model.template
    unread = _SHAPES if system.two_batch_overlap is None or not np.any(system.two_batch_overlap) else ()
    ops = tuple(None if (v := getattr(t, f.name)) is None else (np.shape(v), np.asarray(v).tobytes())
                for f in fields(t) if f.name not in _COUNTED and f.name not in unread) + (t.vector_ops is None,)
    return id(eff), ops, tuple(getattr(system, f.name) is None for f in fields(system))


def _stacked_system(systems: list) -> SystemArrays:
    """The SystemArrays (of one ``_stack_key``) as one, their points one after another."""
    first = systems[0]
    return replace(first, **{f.name: np.concatenate([getattr(s, f.name) for s in systems])
                             for f in fields(first) if getattr(first, f.name) is not None})


def _stacked_pricer(jobs: list, starts: np.ndarray):
    """One iteration pricer over stacked groups (``jobs``): row r is group g's row r - starts[g]
    (``starts`` ascending, from 0), each entry priced on its own group's figures. The groups of one
    ``_stack_key`` are priced by one roofline call (each group's counts from its own IterationModel,
    the rows of its system), the others by their own pricers: a study of one point a group makes one
    call a step of the chain, not one a group."""
    keys = [_stack_key(j.plain) for j in jobs]
    stacks: dict = {}
    for g, key in enumerate(keys):
        if key is not None:
            stacks.setdefault(key, []).append(g)
    member = np.full(len(jobs), -1)
    offset = np.zeros(len(jobs), dtype=np.int64)
    systems = []
    for k, gs in enumerate(stacks.values()):
        member[gs] = k
        sizes = [jobs[g].plain[1].size for g in gs]
        offset[gs] = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        systems.append(_stacked_system([jobs[g].plain[1] for g in gs]))

    def iteration_time(d, dctx, c, pctx, seqs, rows):
        args = np.broadcast_arrays(*(np.asarray(x, dtype=float) for x in (d, dctx, c, pctx, seqs)),
                                   np.asarray(rows))
        shape = args[0].shape
        flat = [a.ravel() for a in args]
        r = flat[-1].astype(np.int64)
        owner = np.searchsorted(starts, r, side="right") - 1
        groups = np.unique(owner)
        if len(groups) == 1:              # one group's entries: its own pricer, as alone
            g = groups[0]
            return jobs[g].pricer(*flat[:-1], r - starts[g]).reshape(shape)
        out = np.empty(len(r))
        stacked: dict = {}
        for g in groups:
            at = np.flatnonzero(owner == g)
            local = r[at] - starts[g]
            if member[g] < 0:
                out[at] = jobs[g].pricer(*(a[at] for a in flat[:-1]), local)
            else:
                stacked.setdefault(member[g], []).append((g, at, local))
        for k, parts in stacked.items():
            ops = [jobs[g].plain[0].arrays(*(a[at] for a in flat[:-1])) for g, at, _ in parts]
            op = replace(ops[0], **{f: np.concatenate([getattr(o, f) for o in ops])
                                    for f in _COUNTED if getattr(ops[0], f) is not None})
            sys_rows = np.concatenate([offset[g] + local for g, _, local in parts])
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                t = step_s(op, systems[k].take(sys_rows), jobs[parts[0][0]].plain[2])
            out[np.concatenate([at for _, at, _ in parts])] = t
        return out.reshape(shape)
    return iteration_time


def goodput_of_jobs(jobs: list) -> list:
    """Each job's goodput (``dse.core.serving.goodput``, requests/s) as (points, goodput [A], replicas
    [A], slo_missed [A]), the jobs' points stacked ``SERVED_SLICE`` at a time where their lengths agree
    (every point is priced on its own figures: its goodput is the one its group alone gives)."""
    buckets: dict = {}
    for job in jobs:
        buckets.setdefault(_lengths_key(job.load), []).append(job)
    out = []
    for bucket in buckets.values():
        n = np.array([len(j.points) for j in bucket])
        starts = np.concatenate([[0], np.cumsum(n)[:-1]])
        load = _stacked_loads([j.load for j in bucket])
        pricer = _stacked_pricer(bucket, starts)
        slo_ttft, slo_tpot, q, rate = (np.concatenate([getattr(j, k) for j in bucket])
                                       for k in ("slo_ttft", "slo_tpot", "percentile", "target_rate"))
        total = int(n.sum())
        good = np.empty(total)
        for lo in range(0, total, SERVED_SLICE):
            at = np.arange(lo, min(lo + SERVED_SLICE, total))
            # the slice's rows count from 0: the stacked pricer's from ``lo``
            good[at] = goodput(load.take(at), lambda *a, _lo=lo: pricer(*a[:-1], np.asarray(a[-1]) + _lo),
                               slo_ttft[at], slo_tpot[at], q[at])
        for j, s0, k in zip(bucket, starts, n):
            points, g, target = j.points, good[s0:s0 + k], j.target_rate
            if j.copies is not None:               # points priced as one of these: the same goodput
                points, g, target = (np.concatenate([x, x[j.copies[1]]]) for x in (points, g, target))
                points[len(j.points):] = j.copies[0]
            out.append((points, g, _replicas(target, g), (target > 0) & (g <= 0)))
    return out


def _scheduled(s: ServingInputs, out: dict, load: Load, iteration_time, late) -> tuple[dict, dict]:
    """(``out`` with SLO-aware admission's points at the rate it admits, the scheduler's columns:
    ttft_high_s, ttft_low_s, tpot_high_s, tpot_low_s and the classes' TTFT percentiles under an open loop
    (``CLASS_PERCENTILES``) (priority classes; request overhead ``late``
    included) and dropped_share (SLO-aware admission); NaN where they do not apply), [P] each
    (``dse.core.scheduling``)."""
    n = len(load.kv_block)
    cols = {k: np.full(n, np.nan) for k in ("ttft_high_s", "ttft_low_s", "tpot_high_s", "tpot_low_s", "dropped_share",
                                            *CLASS_PERCENTILES)}
    if s.scheduler is None or not np.any(s.scheduler > 0):
        return out, cols
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = np.asarray(out["requests_per_s"] / out["capacity_requests_per_s"], dtype=float)
    rho = np.where(out["saturated"], 1.0, rho)
    drops = np.flatnonzero(s.scheduler == SLO_ADMISSION)
    if len(drops):
        p = _dropped(load.take(drops), lambda *a: iteration_time(*a[:-1], drops[a[-1]]), rho[drops],
                     np.maximum(s.slo_ttft[drops] - late, 1e-300))
        cols["dropped_share"][drops] = p
        admitted = load.take(drops)
        admitted = replace(admitted, request_rate=admitted.request_rate * (1.0 - p))
        again = steady_state(admitted, lambda *a: iteration_time(*a[:-1], drops[a[-1]]))
        out = dict(out)
        for k, v in again.items():
            if k in out and np.shape(out[k])[:1] == (n,):
                out[k] = np.array(out[k], copy=True)
                out[k][drops] = v
    hi = np.flatnonzero(s.scheduler == PRIORITY)
    if len(hi):
        high, low = priority_ttft(out["ttft_s"][hi], out["wait_s"][hi], rho[hi], s.priority_share[hi])
        cols["ttft_high_s"][hi], cols["ttft_low_s"][hi] = high + late, low + late
        cols["tpot_high_s"][hi] = cols["tpot_low_s"][hi] = out["tpot_s"][hi]   # a running request is never preempted
        for k in CLASS_PERCENTILES:
            if k in out:                        # (an open loop's; disaggregated pools give none)
                cols[k][hi] = out[k][hi] + late
    return out, cols


def _high_share(s: ServingInputs):
    """[P] the high class's share where the scheduler is priority classes, NaN elsewhere; None
    when no point has priority classes (``steady_state``'s ``high_share``)."""
    if s.scheduler is None or not np.any(s.scheduler == PRIORITY):
        return None
    return np.where(s.scheduler == PRIORITY, s.priority_share, np.nan)


def _dropped(load: Load, iteration_time, rho, patience_s) -> np.ndarray:
    """SLO-aware admission's dropped share [A] of the points of ``load`` at load ``rho`` [A] (their rate
    over capacity) with ``patience_s`` [A] seconds: the fixed point p = ``impatient_share`` of the FCFS
    engine at the admitted rate lambda (1 - p) (``admission_tail``: its tail past the patience and the
    share of its wait that is prompts ahead), found by ``_DROP_ROUNDS`` rounds (the first at the
    offered rate, then damped by half); at least the overload's 1 - 1 / rho."""
    floor = np.where(rho >= 1.0, 1.0 - 1.0 / np.maximum(rho, 1e-300), 0.0)
    p = floor.copy()
    for k in range(_DROP_ROUNDS):
        admitted = replace(load, request_rate=load.request_rate * (1.0 - p))
        tail, wait, admission = admission_tail(admitted, iteration_time, patience_s)
        with np.errstate(invalid="ignore", divide="ignore"):
            queued = np.where(admission > 0, wait / admission, 0.0)
        f = impatient_share(tail, rho * (1.0 - p), queued)
        p = np.maximum(f if k == 0 else 0.5 * (p + f), floor)    # the first round from the offered rate
    return p


#: rounds of ``_dropped``'s fixed point (each an open loop of the points; 6 rounds land within 0.2 % of
#: 20 rounds' share on Llama-3.1-8B, H100, 2,048/64 at 0.6-0.9 of capacity, measured 2026-11-28)
_DROP_ROUNDS = 6


def _classes_slo(s: ServingInputs, at: np.ndarray, late: float):
    """``goodput``'s ``classes`` at the points ``at``: (the high class's share [A], NaN where the
    scheduler is not priority classes; the high class's TTFT SLO [A] less the request overhead
    ``late``, 0 where unset: the low class's ``slo_ttft`` holds for both); None: no priority point."""
    share = _high_share(s)
    if share is None or not np.isfinite(share[at]).any():
        return None
    high = np.nan_to_num(s.slo_ttft_high[at], nan=0.0) if s.slo_ttft_high is not None else np.zeros(len(at))
    return share[at], np.where(high > 0, np.maximum(high - late, 1e-300), 0.0)


def _decode_unlinked(s: ServingInputs) -> np.ndarray:
    """[P] bool: points whose decode pool on hardware of its own has no known link, between the pools
    (``DecodePool.link_bandwidth`` NaN) or inside an engine of several devices (infeasible:
    ``interconnect``)."""
    d, n = s.decode, len(s.devices)
    if d is None:
        return np.zeros(n, dtype=bool)
    out = np.zeros(n, dtype=bool) if d.link_bandwidth is None else ~(d.link_bandwidth > 0)
    if d.system is not None and d.tp * d.ep * s.stages > 1:
        out = out | ~(np.isfinite(d.system.link_bandwidth) & (d.system.link_bandwidth > 0))
    return out


def _decode_linked(d: DecodePool) -> DecodePool:
    """``d`` with the stand-in link (``STAND_IN_LINK``) wherever it has none known (``_decode_unlinked``)."""
    def linked(a):
        return None if a is None else np.where(np.isfinite(a) & (a > 0), a, STAND_IN_LINK)
    system = None if d.system is None else d.system.replaced(link_bandwidth=linked(d.system.link_bandwidth))
    return replace(d, link_bandwidth=linked(d.link_bandwidth), system=system)


def _pools_figures(s: ServingInputs) -> dict:
    """The price and TDP of points whose decode pool runs on hardware of its own: both pools'
    (``DecodePool.cost_usd``, ``system_tdp_w``); none otherwise (the plan's figures stand)."""
    d = s.decode
    if d is None or d.cost_usd is None:
        return {}
    return {"cost_usd": d.cost_usd, "system_tdp_w": d.system_tdp_w}


def prefill_time_share(out: dict, load: Load, iteration_time, pool_share=None) -> np.ndarray:
    """The share of an engine's busy machine time its prefill takes, [P] (what the cost of its input
    tokens is charged: ``dse.core.metrics.token_costs``): each request's prompt priced once as the
    time it adds to an iteration of the engine's ``running_batch`` decoders (``serving_shares``, the
    rule ``_serving_energy`` prices energy by; ``iteration_time``: the engine's iteration pricer),
    over that plus the decoding iterations' time. Not the mean iteration's prompt share, which reads
    a mixture's experts for the prompt every TPOT (its expert reads grow concavely with tokens).
    Disaggregated (``pool_share``: the prefill pool's share of the devices, [P]): that share, the
    prefill pool's machine time."""
    if pool_share is not None:
        return np.asarray(pool_share, dtype=float) * np.ones(len(out["tpot_s"]))
    rows = np.arange(len(out["tpot_s"]))
    dec, pre = serving_shares(lambda *counts: iteration_time(*counts, rows), out, load, 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return pre / (pre + dec)


def serving_shares(cost, out: dict, load: Load, streams) -> tuple[np.ndarray, np.ndarray]:
    """The amount a second (time: s/s, energy: J/s) of a steady state ``out``, split ([P] each):
    decode, ``streams`` streams' iterations of their share of ``running_batch`` decoding sequences
    (over the mean prompt plus half the mean output) once a TPOT (none where a request decodes no
    token after its first); prompt, each request's prompt (its tokens over half the prompt) once, as
    the amount it adds to such an iteration of its stream's decoders. ``cost(d, dctx, c, pctx,
    seqs)``: one stream's iteration's amount of those counts, [P]."""
    gen, tpot, k = load.lengths.mean_gen, out["tpot_s"], streams
    decoding, prompt = _iteration_counts(out, load, k)
    with np.errstate(invalid="ignore", divide="ignore"):
        dec = cost(*decoding)
        prompted = cost(*decoding[:2], *prompt)
        steps = np.where((gen > 1) & (tpot > 0), 1.0 / np.where(tpot > 0, tpot, 1.0), 0.0)
        return k * dec * steps, out["requests_per_s"] * (prompted - dec)


def _iteration_counts(out: dict, load: Load, streams) -> tuple[tuple, tuple]:
    """The counts (``IterationArrays``' order) ``serving_shares`` and ``pooled_shares`` price, [P] each:
    (decode: one stream's share of ``running_batch`` decoding sequences over the mean prompt plus half
    the mean output; no prompt), (one request's prompt: its tokens over half the prompt, one sequence)."""
    prompt, gen = load.lengths.mean_prompt, load.lengths.mean_gen
    b = out["running_batch"]
    zero = np.zeros(len(out["tpot_s"]))
    with np.errstate(invalid="ignore"):
        decoding = (b / streams, b * (prompt + gen / 2.0) / streams, zero, zero, zero)
    return decoding, (zero + prompt, zero + prompt * prompt / 2.0, zero + 1.0)


def pooled_shares(cost, out: dict, load: Load, streams) -> tuple[np.ndarray, np.ndarray]:
    """As ``serving_shares``, of a disaggregated steady state ``out`` (pools of engines alike): decode,
    the decode engines' iterations of ``running_batch`` sequences (a decode engine's, the same counts
    as ``serving_shares``'), as many a second as the decode steps the requests ask (E[gen - 1] each:
    b = rate x E[gen - 1] x T(b) per engine, so iterations a second = requests_per_s x E[gen - 1] / b);
    prompt, each request's prompt once, an iteration of its own on a prefill engine."""
    b, rps, k = out["running_batch"], out["requests_per_s"], streams
    decoding, prompt = _iteration_counts(out, load, k)
    zero = decoding[2]
    steps = np.maximum(np.asarray(load.lengths.gen, dtype=float) - 1.0, 0.0) @ np.asarray(load.lengths.weight, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        dec = cost(*decoding)
        iterations = np.where(b > 0, rps * steps / np.where(b > 0, b, 1.0), 0.0)
        return k * dec * iterations, rps * cost(zero, zero, *prompt)


def kv_transfer_j(load: Load, devices, system: SystemArrays, receiver: SystemArrays | None = None) -> np.ndarray:
    """J of one request's KV cache sent from its prefill engine to its decode engine, [P]: each of the
    engine's ``devices`` sends ``kv_token_bytes`` a prompt token, read from its memory at its J/bit
    and written to the receiver's at the receiver's (``receiver``: a decode pool's own hardware;
    None: the same) (``step_energy_j``'s rule for transfers; the link's own energy per bit is not
    published, left out); the mean prompt, none of it cached."""
    def bit_j(sys):
        return np.asarray(sys.energy_bit_j, dtype=float) if sys.energy_bit_j is not None else np.nan
    both = bit_j(system) + bit_j(receiver if receiver is not None else system)
    return 8.0 * load.pools.kv_token_bytes * load.lengths.mean_prompt * devices * both


def _serving_energy(g: Group, s: ServingInputs, out: dict, load: Load) -> dict:
    """Energy figures of one second of a steady state (``power_and_energy``): the dynamic energy of an
    iteration of ``running_batch`` decoding sequences (over the mean prompt plus half the mean output)
    times the iterations a second (one a TPOT), plus each request's prompt (the energy its prompt
    tokens over half the prompt add to such an iteration) times the requests a second, on each of
    the tp ranks, shared evenly by the engine's streams and ranks (``group_load``: each a tp group's
    iteration of its share). For a dense model, whose amounts are affine in the counts, this is the
    energy of the mean iteration; a mixture's experts are read once a prompt, not every TPOT.
    Disaggregated: ``pooled_shares`` plus the KV transfers (``kv_transfer_j``), the floor over both
    pools' devices; a decode pool of its own layout or hardware (``DecodePool``) priced by its own
    iteration on its own system (``decode_system``: its tp, ep, J/op and J/bit), its engines'
    streams, and its devices at its own floor. Speculative: each iteration a round of the target's
    verification and the draft's g steps (on the draft's tp devices), once a TPOT x E; on pools, the
    rounds the requests ask (their steps are rounds) and each prompt the round the prefill engine
    runs for it (the target's and the draft's prefill); a decode pool of its own layout is priced
    without a draft, as its time is."""
    n = len(out["tpot_s"])
    ranks = g.tables.scenario.tp * g.tables.scenario.cp        # a stream's tp and context-parallel ranks

    spec = s.speculation
    # speculative: an iteration is a round (the target verifying, the draft's g steps), one a TPOT x E
    rounds = out if spec is None else {**out, "tpot_s": out["tpot_s"] * spec.e}

    def watts(system, d_system):
        """J/s: every stream's decoding iteration once a TPOT, and each request's prompt once, as the
        energy it adds to an iteration of its stream's decoders (``serving_shares``); disaggregated,
        the two pools' and the KV transfers' (``pooled_shares``), a decode pool of its own hardware on
        ``d_system``."""
        draft = None if spec is None else system.replaced(tp=np.full(system.size, spec.tp))

        def cost(d, dctx, c, pctx, seqs):
            """J of one stream's iteration on all its ranks; speculative, the round ``_speculative_pricer``
            times: the target's iteration, the draft's first step (with the prompts) and g - 1 more."""
            j = ranks * step_energy_j(s.iteration.arrays(d, dctx, c, pctx, seqs), system)
            if spec is None:
                return j
            zero = np.zeros_like(np.asarray(c, dtype=float))
            return j + spec.tp * (step_energy_j(spec.draft.arrays(d, dctx, c, pctx, seqs), draft) + (spec.drafted - 1)
                                  * step_energy_j(spec.draft.arrays(d, dctx, zero, zero, zero), draft))
        if load.pools is not None:
            dec, pre = pooled_shares(cost, out, load, s.streams)
            receiver = None
            if pool is not None:      # a decode pool of its own: its iteration, system, ranks and streams
                receiver = decode_system(pool, system if d_system is None else d_system)

                def d_cost(dc, dctx, c, pctx, seqs):
                    """J of one decode engine's iteration on all its tp and context-parallel ranks."""
                    return pool.tp * g.tables.scenario.cp * step_energy_j(pool.iteration.arrays(dc, dctx, c, pctx, seqs), receiver)
                dec, _ = pooled_shares(d_cost, out, load, s.stages * pool.ep)
            transfers = kv_transfer_j(load, g.tables.scenario.devices, system, receiver)
            return dec + pre + transfers * out["requests_per_s"]
        dec, pre = serving_shares(cost, rounds, load, s.streams)
        return dec + pre
    pool = s.decode
    own = None if pool is None else pool.system
    dynamic = watts(g.system, own)
    floor = watts(measured_only(g.system), None if own is None else measured_only(own))
    one = np.ones(n)
    return power_and_energy(dynamic, one, out["output_tokens_per_s"], s.devices, _pooled_system(s, g.system),
                            [(floor, one)])


def _pooled_system(s: ServingInputs, system: SystemArrays) -> SystemArrays:
    """``system`` with the static power and TDP of a device the mean over a disaggregated point's
    devices ([P], W): the decode pool's on its own hardware (``DecodePool.system``), the others'
    (prefill and encoder pools) the prefill hardware's; ``system`` itself otherwise."""
    d = s.decode
    if d is None or d.system is None or s.pools is None:
        return system
    dec = s.pools[1] * d.tp * s.stages * d.ep          # decode engines x their devices
    rest = s.devices - dec

    def mean(own, other):
        if own is None or other is None:
            return None
        return (rest * np.asarray(own, dtype=float) + dec * np.asarray(other, dtype=float)) / s.devices
    return system.replaced(static_w=mean(system.static_w, d.system.static_w), tdp_w=mean(system.tdp_w, d.system.tdp_w))


def group_load(load: Load, ranks: int, stages: int) -> Load:
    """The Load of an engine of several batches seen as one (priced by ``group_pricer``): ``stages``
    pipeline stages interleave as many micro-batch streams (vLLM's virtual engines, TensorRT-LLM's
    in-flight micro-batches), and an expert-parallel group runs ``ranks`` attention data-parallel
    ranks (SGLang's and DeepSeek's DP attention), each stream or rank its own scheduler, batch, KV
    blocks and token budget: the engine holds ``ranks x stages`` times a stream's KV blocks, running
    sequences and budget."""
    k = ranks * stages
    if k == 1:
        return load
    return replace(load, kv_blocks=load.kv_blocks * k, max_running=load.max_running * k,
                   token_budget=load.token_budget * k, stages=stages)


def group_pricer(pricer, ranks: int, stages: int):
    """An iteration pricer (as ``iteration_pricer``) of an engine of ``stages`` interleaved streams of
    ``ranks`` lock-step ranks each, seen as one engine (``group_load``); one rank's iteration is the
    IterationModel at ``pp`` and ``ep`` (a pass through every stage; the rank's tokens through
    attention, its experts fed by every rank's). An iteration of the whole engine gives every
    sequence one token. Its decode tokens spread evenly (requests go to the least-loaded stream and
    rank). Ranks run in lock-step (each layer's expert all-to-all joins them): a stream's iteration
    lasts as long as its busiest rank's, and its prompts, each on one rank, spread over as many ranks
    as there are prompts (``s``: the prompts it finishes; at least one rank, at most all), so one
    prompt arriving beside decoders costs the whole group an iteration of that prompt's chunk (what
    makes DP attention's TPOT rise under an open loop, as the simulator's lock-step ranks show,
    ``dse.core.simulator._LockStep``); the experts' operators carry the mean rank's tokens, every
    rank's experts being fed by all of them (``IterationModel.lockstep_arrays``). Streams share the stages: while the stages are the bottleneck
    a stream waits for the others' iterations, so the engine's iteration lasts the mean of its
    streams' (one 1 / stages of the prompt work each)."""
    if ranks * stages == 1:
        return pricer

    def make(model: IterationModel, sys: SystemArrays, eff: Efficiency):
        if pricer is iteration_pricer:        # the busiest rank, its experts fed by the mean rank's tokens
            def iteration_time(d, dctx, c, pctx, seqs, rows):
                with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                    t = step_s(model.lockstep_arrays(d, dctx, c, pctx, seqs, ranks, stages), sys.take(rows), eff)
                return t * pipeline_fill(seqs, c, stages)
            return iteration_time
        rank = pricer(model, sys, eff)        # speculative: every rank's amounts the busiest's

        def iteration_time(d, dctx, c, pctx, seqs, rows):
            return rank(*busiest_rank_counts(d, dctx, c, pctx, seqs, ranks * stages), rows) \
                * pipeline_fill(seqs, c, stages)
        return iteration_time
    return make


def _replicas(target_rate, good) -> np.ndarray:
    """Engines a service of ``target_rate`` requests/s needs at ``good`` requests/s each
    (NaN without a target; infinite where no rate meets the SLOs)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(target_rate > 0, np.where(good > 0, np.ceil(target_rate / good), np.inf), np.nan)


def _speculative_pricer(spec: ServedSpeculation):
    """An iteration pricer (as ``iteration_pricer``) of an engine decoding speculatively: the
    target's iteration verifying g + 1 tokens of each decoding sequence (its IterationModel
    carries them), then the draft's g decode steps over the same sequences, the first with the
    iteration's prompt chunks (the draft prefills them too), on the draft's devices."""
    def make(model: IterationModel, sys: SystemArrays, eff: Efficiency):
        target = iteration_pricer(model, sys, eff)
        draft = iteration_pricer(spec.draft, sys.replaced(tp=np.full(sys.size, spec.tp)), eff)

        def iteration_time(d, dctx, c, pctx, seqs, rows):
            zero = np.zeros_like(np.asarray(c, dtype=float))
            return (target(d, dctx, c, pctx, seqs, rows) + draft(d, dctx, c, pctx, seqs, rows)
                    + (spec.drafted - 1) * draft(d, dctx, zero, zero, zero, rows))
        return iteration_time
    return make


def iteration_pricer(model: IterationModel, sys: SystemArrays, eff: Efficiency):
    """The iteration time of a group's points (``dse.core.serving.IterationTime``): the roofline's
    step time of the IterationModel's arrays, each entry on its design point's system."""
    def iteration_time(d, dctx, c, pctx, seqs, rows):
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return step_s(model.arrays(d, dctx, c, pctx, seqs), sys.take(rows), eff)
    return iteration_time


def kv_link(sys: SystemArrays, eff: Efficiency):
    """Seconds to send messages of ``nbytes`` [A, K] from each point ``rows`` [A] to another
    device over its scale-up link (``transfer_time``): a prefill instance's KV cache to a decode one."""
    def transfer(nbytes, rows):
        return transfer_time(nbytes, sys.link_bandwidth[rows][:, None], sys.link_latency[rows][:, None], eff)
    return transfer


def _engine_load(s: ServingInputs, sys: SystemArrays, eff: Efficiency, d_eff: Efficiency | None = None) -> Load:
    """The serving Load of a group's continuous-batching inputs (``sys``: its points' systems), its
    engine seen as one (``group_load``); disaggregated: its pools, the KV cache sent over each point's
    scale-up link as one message per request, and a decode pool of its own layout its own engines
    and iterations (its tp and ep, each layout's collectives priced on its own group sizes; on hardware
    of its own priced with ``d_eff``, ``DecodePool.efficiency``)."""
    pools = None
    if s.pools is not None:
        prefill, decode, kv_token_bytes = s.pools
        d_load = d_time = None
        if s.decode is not None:
            d = s.decode
            d_load = group_load(replace(_load(s, None), kv_blocks=d.kv_blocks), d.ep, s.stages)
            d_time = group_pricer(iteration_pricer, d.ep, s.stages)(d.iteration, decode_system(d, sys), d_eff or eff)
        link = kv_link(sys, eff) if s.decode is None or s.decode.link_bandwidth is None else \
            kv_link(sys.replaced(link_bandwidth=s.decode.link_bandwidth, link_latency=s.decode.link_latency), eff)
        enc = {}
        if s.encoder is not None:        # E:P:D: the encoder pool's instances, seconds a request, embedding bytes
            n_enc, arrays, nbytes = s.encoder
            enc = {"encoders": n_enc, "encode_s": step_s(arrays, sys, eff),
                   "embed_bytes": np.full(n_enc.shape, float(nbytes))}
        pools = Pools(prefill, decode, np.broadcast_to(kv_token_bytes, prefill.shape).astype(float), link,
                      d_load, d_time, **enc)
    return group_load(_load(s, pools), s.ranks, s.stages)


def decode_system(d: DecodePool, sys: SystemArrays) -> SystemArrays:
    """The system a decode pool's iterations are priced on: its own hardware's (``d.system``) or the
    prefill pool's (``sys``), at its tp and ep, with the prefill points' overlap, context parallelism
    and two-batch overlap."""
    if d.system is None:
        return sys.replaced(tp=np.full(sys.size, float(d.tp)), ep=np.full(sys.size, float(d.ep)))
    return d.system.replaced(tp=np.full(sys.size, float(d.tp)), ep=np.full(sys.size, float(d.ep)),
                             overlap=sys.overlap, cp=sys.cp, two_batch_overlap=sys.two_batch_overlap)


def _load(s: ServingInputs, pools: Pools | None) -> Load:
    """The serving Load of one stream of a group's continuous-batching inputs, with ``pools``
    (Poisson arrivals, ``dispersion`` None, unless some point's are gamma of another shape)."""
    return Load(s.lengths, s.kv_blocks, s.kv_block, s.budget, s.max_running, s.concurrency,
                s.request_rate, s.chunked, s.prefix_tokens, pools,
                None if np.all(s.dispersion == 1.0) else np.asarray(s.dispersion, dtype=float), s.state_blocks,
                tier=s.tier, prompts=np.asarray(s.prompts, dtype=float))


@dataclass(frozen=True)
class ServedPoint:
    """A continuous-batching design point as the simulator runs it: ``step`` (seconds of one
    iteration: decode tokens, their keys, prompt tokens, their keys, prompts finished),
    ``engine`` (EngineConfig), ``lengths`` (the LengthSpec to draw requests from) with mean
    ``prompt_len`` and ``gen_len`` and at most ``max_tokens`` in all, ``concurrency`` or
    ``request_rate`` (the other None) and ``request_overhead_s`` (seconds); disaggregated:
    ``pools`` (prefill instances, decode instances) and ``transfer_s`` (seconds to send the
    KV cache of a prompt of that many tokens, its cached prefix excepted), else None;
    ``stages`` and ``ranks``: the engine's streams (``stream_load``), ``engine`` one rank's."""

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
    stages: int = 1               # pipeline stages (as many micro-batch streams)
    ranks: int = 1                # attention data-parallel ranks of each stream, in lock-step
    burstiness: float = 1.0       # an open loop's gamma shape of the arrival gaps (1: Poisson)
    decode_step: object = None    # a decode pool of its own layout: its step, engine and ranks (None: the same)
    decode_engine: EngineConfig | None = None
    decode_ranks: int | None = None
    replicas: int = 1             # engines behind the router (concurrency and request_rate: the fleet's)
    router: int = 0               # the router's code (``dse.core.router``)
    session_turns: int = 1        # turns of a session (1: plain requests)
    think_s: float = 0.0          # sessions: seconds from a turn's last token to the next turn
    encoder: tuple | None = None  # E:P:D: (encoder instances, seconds each takes a request: encode + send)
    num_prompts: int = 0          # an open loop's requests in all (a finite run: every one measured; 0: endless)


def serving_inputs(model, sc, w: WorkloadColumns, hw: HardwareArrays, idx, i0: int, cap, fp, act, lengths: Lengths,
                   length_spec: LengthSpec, max_tokens: float, own_decode: bool = True) -> tuple[ServingInputs, np.ndarray]:
    """(the continuous-batching inputs of a group's points, KV bytes per device they hold):
    the iteration model and the paged KV cache, every byte of device memory left after the
    weights and one iteration's activations, in blocks of ``kv_block`` tokens (a hybrid model's
    running sequences each hold ``state_blocks`` of them for their state); requests of the length
    classes ``lengths`` drawn from ``length_spec``, at most ``max_tokens`` each; a disaggregated
    decode pool of its own layout (``decode_pool``) unless not ``own_decode``."""
    budget = w.prefill_chunk[idx]
    block = w.kv_block[idx]
    per_token, blocks = kv_blocks(fp, sc, cap, act, block)
    if np.any(per_token <= 0):
        raise DseError(f"model '{model.name}' has no attention layers (no KV cache): continuous batching of a "
                       "purely recurrent model is not modelled; give a hybrid or an attention model")
    buffer = float(w.buffer[i0])
    enc_devices = np.zeros(np.shape(idx)) if w.encoder_devices is None else \
        np.broadcast_to(np.asarray(w.encoder_devices, dtype=float), np.shape(w.disaggregated))[idx]
    encoder = None
    if w.disaggregated[i0] and enc_devices.size and enc_devices.flat[0] > 0:     # E:P:D (one kind a group)
        encoder = (enc_devices / sc.devices, *encoder_request(model, sc, buffer))
        model = replace(model, vision=replace(model.vision, images=0))            # the prefill pool's iterations
    it = iteration_model(model, sc.prompt_len, sc.weights.name, sc.activations.name, sc.kv.name, sc.tp,
                         sc.flash_attention, buffer, sc.techniques, pp=sc.pp, ep=sc.ep, cp=sc.cp)
    conc = w.concurrency[idx]
    rate = w.request_rate[idx]
    replicas = np.broadcast_to(np.nan_to_num(w.router_replicas[idx], nan=1.0), np.shape(rate)).astype(float)
    router = np.broadcast_to(w.router[idx], np.shape(rate))
    turns = int(np.nan_to_num(w.session_turns[i0], nan=1.0))
    per_turn = lengths.mean_prompt + lengths.mean_gen
    lengths, history, _ = session_lengths(lengths, turns)          # a session's turns: its history grows
    routed = None
    fleet = 1.0 / np.broadcast_to(np.nan_to_num(w.burstiness[idx], nan=1.0), np.shape(rate)).astype(float)
    if turns > 1 or np.any(replicas > 1):
        routed = Routed(replicas, np.asarray(router), turns,
                        np.broadcast_to(np.nan_to_num(w.think_time[idx], nan=0.0), np.shape(rate)).astype(float),
                        history / per_turn, per_turn, fleet)
        conc, rate = conc / replicas, rate / replicas                # one replica's share of the fleet's load
    prefix = np.round(w.prefix_hit[idx] * sc.prompt_len)
    tier = kv_tier(w, hw, idx, per_token, sc.devices, prefix, block)
    if tier is not None and np.any((np.asarray(router) == PREFIX_AFFINITY) & (replicas > 1)):
        device, in_tier, share = prefix_routed_hits(tier, prefix, block, replicas, router)
        tier = replace(tier, device_hit=device, tier_hit=in_tier)       # the busiest replica's prefixes
        conc, rate = conc * replicas * share, rate * replicas * share    # and its share of the load
        routed = replace(routed, share=share)
    dispersion = replica_dispersion(fleet, replicas, router, turns, None if routed is None else routed.share)
    decode = decode_pool(model, sc, w, hw, idx, i0, cap, act, block) if w.disaggregated[i0] and own_decode else None
    d_devices = sc.devices if decode is None else decode.tp * sc.pp * decode.ep
    pools = (w.prefill_devices[idx] / sc.devices, w.decode_devices[idx] / d_devices, per_token) \
        if w.disaggregated[i0] else None                      # engines of tp x pp x ep devices in each pool
    serving = ServingInputs(
        iteration=it, kv_blocks=blocks, kv_block=block, prefix_tokens=prefix,
        slo_ttft=w.slo_ttft[idx], slo_tpot=w.slo_tpot[idx], slo_percentile=w.slo_percentile[idx],
        target_rate=w.target_rate[idx],
        budget=np.where(budget > 0, budget, np.maximum(float(sc.prompt_len), UNCHUNKED_BUDGET)),
        chunked=budget > 0, max_running=w.max_running[idx],
        concurrency=np.where(rate > 0, np.nan, conc), request_rate=np.where(rate > 0, rate, np.nan),
        dispersion=dispersion, prompts=np.nan_to_num(w.num_prompts[idx]) / replicas,
        devices=np.where(w.disaggregated[idx], w.prefill_devices[idx] + w.decode_devices[idx] + enc_devices,
                         float(sc.devices)), encoder=encoder,
        lengths=lengths, length_spec=length_spec, max_tokens=max_tokens, pools=pools, stages=sc.pp, ranks=sc.ep,
        decode=decode, state_blocks=state_blocks(state_bytes_per_sequence(model, sc), per_token * block),
        routed=routed, tier=tier,
        scheduler=None if w.scheduler is None else np.broadcast_to(w.scheduler[idx], np.shape(rate)).copy(),
        priority_share=None if w.priority_share is None else
        np.broadcast_to(np.nan_to_num(w.priority_share[idx], nan=0.1), np.shape(rate)).astype(float),
        slo_ttft_high=None if w.slo_ttft_high is None else
        np.broadcast_to(np.nan_to_num(w.slo_ttft_high[idx], nan=0.0), np.shape(rate)).astype(float))
    return serving, blocks * block * per_token * sc.pp


def encoder_request(model, sc, buffer: float) -> tuple:
    """(the vision encoder's OpArrays for one request on one engine of ``sc``'s layout, bytes of that
    request's image embeddings: its image tokens x ``residual_bytes_per_token``), as an
    encoder pool runs it and sends it to the prefill pool (E:P:D)."""
    one = replace(sc, batch=1)
    table = vision_encoder.prefill(model, one, buffer)
    ops = tuple(o for o in table.operators if o.name.startswith(vision_encoder.PREFIX))
    arrays = OpArrays.from_table(replace(table, operators=ops, arrays={}))
    return arrays, request_image_tokens(model.vision) * residual_bytes_per_token(model, sc.activations)


#: the tier presets ``kv_tier`` names (configs/tiers.yaml): a CXL memory box, an NVMe drive
KV_TIER_PRESETS = {"cxl": "cxl-cmm-b-16tb", "ssd": "nvme-990pro-2tb"}


def kv_tier(w: WorkloadColumns, hw: HardwareArrays, idx, per_token, devices: int, prefix, block) -> TierLoad | None:
    """The KV tier of a group's points (``dse.core.kv_tiers.TierLoad``; None where every point keeps
    today's engine: no tier, preemption unpriced, one shared prefix). 'host': the host DRAM over
    each device's own host link (at the link's measured fraction of its bandwidth), its capacity (a
    preset's host memory is its node's) shared by the engine's ``devices``; 'cxl' and 'ssd': one
    unit of the preset (``KV_TIER_PRESETS``) per engine, its capacity and achieved bandwidth (rated x
    its cited achieved fraction) shared by the engine's ``devices``;
    the prefix hit shares of ``prefix`` tokens in blocks of ``block`` (``kv_tiers.with_hits``; swap
    without a tier and a host tier without a host are refused by ``workload_columns``)."""
    names = np.asarray(w.kv_tiers, dtype=object)[np.asarray(w.kv_tier)[idx]]
    swap = np.asarray(w.swap)[idx].astype(bool)
    priced = np.asarray(w.preempt_priced)[idx].astype(bool)
    count, zipf = np.asarray(w.prefix_count, dtype=float)[idx], np.asarray(w.prefix_zipf, dtype=float)[idx]
    if np.all(names == "none") and not priced.any() and np.all(count == 1):
        return None
    host = names == "host"
    sys = hw.system
    bandwidth = np.where(host, sys.host_bandwidth[idx] * sys.host_fraction[idx], 0.0)
    capacity = np.where(host, np.nan_to_num(np.asarray(hw.host_capacity, dtype=float)[idx]) / devices, 0.0)
    for name, preset in KV_TIER_PRESETS.items():
        t = load_tier(preset)
        at = names == name
        bandwidth = np.where(at, t.bandwidth_bytes_per_s * (tier_fraction(preset) or 1.0) / devices, bandwidth)
        capacity = np.where(at, t.capacity_bytes / devices, capacity)
    shape = np.shape(bandwidth)
    return kv_tiers.with_hits(TierLoad(np.broadcast_to(np.asarray(per_token, dtype=float), shape).copy(), bandwidth,
                                       capacity, count, zipf, swap, priced), prefix, block)


def kv_blocks(fp, sc, cap, act, block) -> tuple:
    """(KV bytes a token of context takes on each device, paged KV blocks of ``block`` tokens a
    stream holds, [P]) of a layout whose footprint is ``fp`` (one sequence) on devices of ``cap``
    usable bytes beside ``act`` bytes of activations: every byte left after the weights; a device
    of a pipeline stage holds the KV of its layers for every one of the pp streams."""
    per_token = fp.kv_cache_bytes / (sc.prompt_len + sc.gen_len)
    left = np.maximum(cap - fp.weights_bytes - act, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):     # no KV at all (a purely recurrent model): refused by the caller
        return per_token, np.floor(left / (per_token * block) / sc.pp)


def decode_pool(model, sc, w: WorkloadColumns, hw: HardwareArrays, idx, i0: int, cap, act, block) -> DecodePool | None:
    """The decode pool of disaggregated points laid out otherwise (``decode_tp``, ``decode_ep``), on
    hardware of its own (``decode_hardware``) or over a link of its own (``pd_link``); None where it
    is the prefill pool's layout, hardware and link: its iteration model and KV blocks at that layout
    on its hardware's memory (``decode_hardware``'s own system, as every point's is assembled:
    ``dse.system.hardware.assemble``), the link the KV cache crosses and the point's price and TDP over
    both pools; DseError when the layout does not divide the model."""
    d_tp = sc.tp if np.isnan(w.decode_tp[i0]) else int(w.decode_tp[i0])
    d_ep = sc.ep if np.isnan(w.decode_ep[i0]) else int(w.decode_ep[i0])
    d_hw, link = own_decode_hardware(w, hw, idx)
    d_sys = None if d_hw is None else d_hw.system
    if (d_tp, d_ep) == (sc.tp, sc.ep) and d_sys is None and link is None:
        return None
    buffer = float(w.buffer[i0])
    fp = tables(model, 1, sc.prompt_len, sc.gen_len, sc.weights.name, sc.activations.name, sc.kv.name, d_tp, sc.pp,
                d_ep, sc.flash_attention, buffer, sc.techniques).footprint
    figures = {}
    if d_sys is not None:               # its own memory, less what its engine keeps back
        raw = d_sys.capacity
        cap = raw - reserve_bytes(w.engines[w.engine[i0]].memory, raw, fp.weights_bytes, act)
        pre, dec = w.prefill_devices[idx], w.decode_devices[idx]
        figures = {"cost_usd": pre * _at(hw.price_usd, idx, w) + dec * np.asarray(d_hw.price_usd, dtype=float),
                   "system_tdp_w": pre * _at(hw.tdp_w, idx, w) + dec * np.asarray(d_hw.tdp_w, dtype=float)}
    _, blocks = kv_blocks(fp, sc, cap, act, block)
    it = iteration_model(model, sc.prompt_len, sc.weights.name, sc.activations.name, sc.kv.name, d_tp,
                         sc.flash_attention, buffer, sc.techniques, pp=sc.pp, ep=d_ep)
    bw, lat = (None, None) if link is None else link
    if d_hw is not None:
        if d_hw.dataflow.any():
            raise DseError("decode_hardware: a dataflow (spatial) class as a decode pool is not modelled; give a GPU, "
                           "TPU or other engine-run preset")
        figures["family"] = str(d_hw.families[int(np.asarray(d_hw.family).flat[0])])
    return DecodePool(it, np.asarray(blocks, dtype=float), d_tp, d_ep, d_sys, bw, lat, **figures)


def _at(a, idx, w: WorkloadColumns) -> np.ndarray:
    """Per-point figure ``a`` (one per point of the plan, or one for all) at points ``idx``."""
    return np.broadcast_to(np.asarray(a, dtype=float), np.shape(w.disaggregated))[idx]


def _decode_names(w: WorkloadColumns, hw: HardwareArrays, idx) -> tuple[np.ndarray, np.ndarray]:
    """(each point's own preset name, its decode pool's preset name) at points ``idx``, [P] object arrays."""
    n = np.shape(w.disaggregated)
    own = np.asarray(hw.names, dtype=object)[np.broadcast_to(hw.name, n)[idx]]
    if w.decode_hardwares is None:
        return own, own
    codes = np.broadcast_to(w.decode_hardware, n)[idx]
    given = np.asarray(w.decode_hardwares, dtype=object)[codes]
    return own, np.where(given == "", own, given)


def own_decode_hardware(w: WorkloadColumns, hw: HardwareArrays, idx) -> tuple:
    """(the decode pool's hardware at points ``idx`` (``HardwareArrays``, its system at tp 1; None where
    every point decodes on its own hardware), the link the KV cache crosses: (bytes/s, s) [P], or None for the prefill pool's
    scale-up link). The link: ``pd_link`` where given; else, where the pools' hardware differ, the
    slower of the two hardware's scale-out NICs (their topologies', ``hwmodels.topology``) and the
    longer latency, NaN where either cites none (refused: ``interconnect``)."""
    own, dec = _decode_names(w, hw, idx)
    other = own != dec
    d_hw = d_sys = None
    if other.any():
        d_hw = assemble(Columns({"hardware": dec, "model": ""}))
        d_sys = d_hw.system
    n = len(own)
    links = None if w.pd_links is None else np.broadcast_to(w.pd_link, np.shape(w.disaggregated))[idx]
    given = links is not None and any(w.pd_links[c] is not None for c in np.unique(links))
    if d_hw is None and not given:
        return None, None
    sys = hw.system.take(idx)
    bw = np.where(np.isfinite(sys.link_bandwidth), sys.link_bandwidth, np.nan)
    lat = np.asarray(sys.link_latency, dtype=float).copy()
    if d_sys is not None:
        def nic(s):
            if s.scale_out_bandwidth is None:
                return np.full(n, np.nan), np.zeros(n)
            return np.where(s.scale_out_bandwidth > 0, s.scale_out_bandwidth, np.nan), s.scale_out_latency
        (b1, l1), (b2, l2) = nic(sys), nic(d_sys)
        bw = np.where(other, np.fmin(b1, b2) + 0.0 * b1 * b2, bw)      # NaN where either side cites none
        lat = np.where(other, np.maximum(l1, l2), lat)
    if given:
        for c in np.unique(links):
            if w.pd_links[c] is not None:
                at = links == c
                bw[at], lat[at] = w.pd_links[c].bandwidth_bytes_per_s, w.pd_links[c].latency_s
    return d_hw, (bw, lat)


def state_blocks(state, block_bytes):
    """KV blocks (of ``block_bytes`` each, [P]) one sequence's recurrent state of ``state`` bytes per
    device takes (0 for a model without recurrent layers): as vLLM's hybrid KV-cache manager
    (V1; docs.vllm.ai, design/hybrid_kv_cache_manager: Mamba + full-attention models in one pool of
    equal pages; vLLM pads the attention page to the state's, which this rounding leaves out) gives
    each running request's Mamba / linear-attention state pages of the pool. The
    state is constant in the context: blocks a running sequence holds, not blocks a token adds."""
    return np.ceil(state / np.asarray(block_bytes, dtype=float)) if state else np.zeros(np.shape(block_bytes))


def speculative_serving(serving: ServingInputs, spec: Speculation, sc, hw: HardwareArrays, i0: int) -> ServingInputs:
    """Continuous batching under speculative decoding: a decoding sequence gains E tokens an
    iteration (``tokens_per_target_step``), so the steady state runs on requests of
    1 + (gen - 1) / E steps, whose rounds of E tokens ``price_served`` turns back into tokens;
    the paged KV cache is shrunk by the same ratio of tokens held (a request still holds prompt +
    gen tokens of K/V, the draft's with the target's), so as many requests fit. The keys a decoding
    step attends are those of the shorter request (an approximation: low by up to (E - 1) / E of
    the generated part of the context). The draft's iteration model runs on its own layout."""
    e = tokens_per_target_step(spec.acceptance, spec.drafted)
    real = serving.lengths
    steps = replace(real, gen=1.0 + (real.gen - 1.0) / e, gen_var=real.gen_var / e**2)
    held = (real.mean_prompt + real.mean_gen) / (steps.mean_prompt + steps.mean_gen)
    tp = int(spec.tp)
    buffer = float(hw.buffer[i0]) if sc.flash_attention else 0.0       # (a draft's: the device's own)
    draft = iteration_model(spec.model, sc.prompt_len, sc.weights.name, sc.activations.name, sc.kv.name, tp,
                            sc.flash_attention, buffer)
    return replace(serving, kv_blocks=np.floor(serving.kv_blocks * held), lengths=steps,
                   speculation=ServedSpeculation(e, draft, float(tp), spec.drafted, real.mean_gen))


def served_point(g: Group, j: int, *, efficiency=None, ideal: bool = False) -> ServedPoint:
    """The j-th point of group ``g`` as the simulator runs it (``ServedPoint``), every iteration
    priced as the steady-state model prices it. DseError when the point is not under continuous
    batching."""
    if g.tables is None or g.serving is None:
        raise DseError("simulating needs a runnable point under continuous batching (give a concurrency or a "
                       "request rate)")
    if g.serving.speculation is not None:
        raise DseError("simulate: the simulator runs one token per decoding sequence an iteration; speculative "
                       "decoding is priced by the steady-state model only")
    eff = g.efficiency(efficiency, ideal)
    s, sc = g.serving, g.tables.scenario
    sys_j = g.system.take(np.array([j]))
    step = _rank_step(s.iteration, sys_j, eff, s.ranks)
    engine = EngineConfig(kv_blocks=max(int(s.kv_blocks[j]), 1), kv_block=int(s.kv_block[j]),
                          token_budget=int(s.budget[j]), max_running=int(s.max_running[j]),
                          chunked=bool(s.chunked[j]),
                          prefix_tokens=int(s.prefix_tokens[j]),
                          state_blocks=int(np.broadcast_to(s.state_blocks, s.kv_blocks.shape)[j]),
                          scheduler=_scheduler(s, j, eff.request_overhead_s), **_tier_engine(s, j))
    decode_step = decode_engine = None
    if s.decode is not None:
        d = s.decode
        decode_step = _rank_step(d.iteration, decode_system(d.take(np.array([j])), sys_j),
                                 d.efficiency(eff, g.engine, g.kv_group, g.family), d.ep)
        decode_engine = replace(engine, kv_blocks=max(int(d.kv_blocks[j]), 1))
    conc, rate = s.concurrency[j], s.request_rate[j]
    r = s.routed
    n = 1 if r is None else int(r.replicas[j])
    if r is not None and r.share is not None:        # the fleet's load (the inputs hold one replica's)
        conc, rate = conc / float(r.share[j]), rate / float(r.share[j])
    else:
        conc, rate = conc * n, rate * n
    pools = transfer_s = encoder = None
    if s.pools is not None:
        prefill, decode, kv_token_bytes = s.pools
        pools = (int(prefill[j]), int(decode[j]))
        per_token = float(np.broadcast_to(kv_token_bytes, prefill.shape)[j])
        link = kv_link(g.system.take(np.array([j])) if s.decode is None or s.decode.link_bandwidth is None else
                       g.system.take(np.array([j])).replaced(link_bandwidth=s.decode.link_bandwidth[[j]],
                                                            link_latency=s.decode.link_latency[[j]]), eff)

        def transfer_s(prompt: int) -> float:
            sent = prompt - engine.cached_tokens(prompt)
            return float(link(np.array([[per_token * sent]]), np.zeros(1, dtype=np.int64))[0, 0])
        if s.encoder is not None:                   # the encoder pool: as ``_engine_load`` prices it
            n_enc, arrays, nbytes = s.encoder
            send = float(link(np.array([[float(nbytes)]]), np.zeros(1, dtype=np.int64))[0, 0])
            encoder = (int(round(float(n_enc[j]))), float(step_s(arrays, g.system.take(np.array([j])), eff)[0]) + send)
    return ServedPoint(step, engine, s.length_spec, sc.prompt_len, sc.gen_len, s.max_tokens,
                       None if np.isnan(conc) else int(round(conc)), None if np.isnan(rate) else float(rate),
                       eff.request_overhead_s, pools, transfer_s, int(s.stages), int(s.ranks),
                       1.0 / float((s.dispersion if r is None else r.dispersion)[j]), decode_step, decode_engine,
                       None if s.decode is None else int(s.decode.ep), replicas=n,
                       router=0 if r is None else int(r.router[j]), session_turns=1 if r is None else r.turns,
                       think_s=0.0 if r is None else float(r.think_s[j]), encoder=encoder,
                       num_prompts=int(round(float(s.prompts[j]) * n)) if rate > 0 else 0)


def _scheduler(s: ServingInputs, j: int, late: float):
    """The simulator's scheduling policy at point ``j`` (``dse.core.scheduling``): SLO-aware admission's
    patience the TTFT SLO less the request overhead (spent before the scheduler sees a request)."""
    if s.scheduler is None:
        return policy(0)
    return policy(int(s.scheduler[j]), float(s.priority_share[j]), max(float(s.slo_ttft[j]) - late, 1e-9))


def _tier_engine(s: ServingInputs, j: int) -> dict:
    """The simulator's KV-tier settings (``EngineConfig``) of point ``j`` of a group (none without a tier)."""
    t = s.tier
    if t is None:
        return {}
    one = t.take(np.array([j]))
    prefix, block = s.prefix_tokens[j:j + 1], s.kv_block[j:j + 1]
    bw = float(one.bandwidth[0])
    return {"swap": bool(one.swap[0]), "swap_s_per_token": float(one.token_bytes[0]) / bw if bw > 0 else 0.0,
            "prefix_count": int(one.prefix_count[0]), "prefix_zipf": float(one.prefix_zipf[0]),
            "tier_slots": int(kv_tiers.tier_slots(one, prefix, block)[0]),
            "reload_s": float(np.nan_to_num(kv_tiers.reload_s(one, prefix, block)[0], posinf=0.0)) if bw > 0 else 0.0}


def _rank_step(it: IterationModel, sys_j: SystemArrays, eff: Efficiency, ranks: int):
    """The simulator's ``step_time`` of one rank of a point (``sys_j``: its system, one row): the
    roofline's time of the IterationModel's arrays at its counts; with ``ranks`` lock-step ranks,
    also ``step.ranks`` (``dse.core.simulator._LockStep.price``): a lock-step iteration of every
    rank's counts [R, 5], the slowest rank, its own tokens through attention and its experts fed by
    the mean rank's."""
    price = iteration_pricer(it, sys_j, eff)
    one = np.zeros(1, dtype=np.int64)

    def step(d, dctx, c, pctx, ends) -> float:
        return float(price(*(np.array([float(x)]) for x in (d, dctx, c, pctx, ends)), one)[0])

    if ranks > 1 and it.shared is not None:
        def lockstep(counts: np.ndarray) -> float:
            own = it.arrays(*counts.T)
            mean = it.arrays(*(np.full(len(counts), v) for v in counts.mean(axis=0)))
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                return float(step_s(it.fed_by_all(own, mean), sys_j.take(np.zeros(len(counts), dtype=int)),
                                       eff).max())
        step.ranks = lockstep
    return step
