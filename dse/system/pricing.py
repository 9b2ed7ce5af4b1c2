"""Pricing of static batches: time and energy of a run (prefill, then decode steps; under
speculative decoding, rounds of a draft and a verifying target step; under a CPU layer split,
each step shared between the device and the host CPU) from one ``Schedule`` of its phases,
walked once for time (``dse.core.roofline.step_time``) and once for energy
(``dse.core.roofline.energy_j``); serving metrics of the run (``dse.core.metrics``), energy
per token, power and the power check (``power_and_energy``)."""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from dse.core.efficiency import Efficiency, choose
from dse.core.metrics import (
    energy_figures,
    pipelined_prefill_s,
    power_demand_w,
    serving_metrics,
    static_overlap,
    steps_after_first,
)
from dse.core.operator_cost import link_transfer_s
from dse.core.overlap import decode_s, step_s
from dse.core.roofline import (
    SystemArrays,
    decode_total_time,
    decode_total_work,
    energy_j,
    step_time,
    step_work,
)
from dse.core.serving import PERCENTILES
from dse.system.grouping import CpuSplit, Group, Speculation
from dse.system.result import PERCENTILE_METRICS
from workloads.techniques import tokens_per_target_step


@dataclass(frozen=True)
class Phase:
    """One kind of step of a static run, on one set of devices: a step (``slope`` None) run
    ``steps`` times, or an affine piece of the decode (step j costs ``op`` + j x ``slope``, for
    ``steps`` steps, priced in closed form)."""

    op: object                    # the step's operators (OpArrays, or ``Stacked`` rows), the piece's first
    slope: object = None          # operators added a step as the context grows (None: the same step)
    steps: object = 1.0           # steps of the phase, [P] or a number
    draft: bool = False           # on the draft's devices (its own tp), not the target's
    repeat: float = 1             # times each step runs a round (the draft's g steps a verifying step)
    ranks: float = 1              # tp ranks each step runs on: its energy counts every rank's
    pipelined: bool = False       # a prefill pass over ``micro_batches`` micro-batches and ``pp`` stages


@dataclass(frozen=True)
class Schedule:
    """The phases of a static run of a group's points, consumed alike by its time (``run_time``)
    and its energy (``run_energy``): the prefill phases, then the decode phases (each affine
    piece of the decode; under speculative decoding, rounds of the target's verifying step and the
    draft's steps, or one pass of Medusa heads, the context growing E tokens a round)."""

    prefill: tuple                # Phase of each prefill pass (the target's, then a draft model's)
    decode: tuple                 # Phase of each decode piece (the target's, a draft's, heads)
    micro_batches: int            # micro-batches of the pipelined prefill
    pp: int                       # pipeline stages
    steps: np.ndarray             # [P] decode steps after the first token (``steps_after_first``)
    tokens_per_step: np.ndarray   # [P] tokens a target step yields (1, or E under speculative decoding)
    draft_tp: float | None = None  # tensor parallelism of the draft's devices
    cpu: CpuSplit | None = None   # layers on the host CPU: each target step split between device and CPU
    #                               (a draft's and heads' steps stay on the device)
    rounds: bool = False          # speculative rounds: the decode's energy sums each phase's ranks x its
    #                               pieces; else (one kind of step on the target) its ranks x their sum

    def split(self, ph: Phase) -> bool:
        """True where phase ``ph``'s per-layer work is shared with the host CPU: the target's, under a
        CPU layer split."""
        return self.cpu is not None and not ph.draft


def schedule(g: Group) -> Schedule:
    """The Schedule of a static batch of the group's points: its prefill, then the gen_len - 1
    decode steps after the first token (``steps_after_first``), as ``speculative_schedule`` under
    speculative decoding; under a CPU layer split each target step shared with the host CPU."""
    t, sc, size = g.tables, g.tables.scenario, g.system.size
    n_steps = steps_after_first(sc.gen_len)
    if g.spec is not None:
        return speculative_schedule(t, g.spec, n_steps, size, g.cpu)
    ranks = sc.tp * sc.cp               # every context-parallel rank runs its own share of each step
    decode = tuple(Phase(d0, slope, np.asarray(n, dtype=float), ranks=ranks) for d0, slope, n in t.decode_steps(n_steps))
    return Schedule((Phase(t.prefill, ranks=ranks, pipelined=g.cpu is None),), decode, sc.micro_batches, sc.pp,
                    np.full(size, n_steps, dtype=float), np.ones(size), cpu=g.cpu)


def speculative_schedule(t, spec: Speculation, n_steps, size: int, cpu: CpuSplit | None = None) -> Schedule:
    """The Schedule of a static batch under speculative decoding. Each round drafts g tokens (g
    steps of the draft) and verifies g + 1 in one target step (the target's decode tables carry
    g + 1 query tokens per sequence), yielding E = (1 - a^(g+1)) / (1 - a) tokens
    (``tokens_per_target_step``); the gen_len - 1 decoded tokens take (gen_len - 1) / E rounds, the
    context growing by E tokens a round (each affine piece of the decode priced over its rounds in
    closed form). A draft model prefills the prompts too; Medusa heads draft their g tokens in one
    pass a round, the target verifying ``spec_tokens`` + 1 candidates (a tree). Under a CPU layer split
    (``cpu``) the target's steps are shared with the host CPU (its prefill then not pipelined), the
    draft's run on the device."""
    sc = t.scenario
    e = tokens_per_target_step(spec.acceptance, spec.drafted)
    prefill = [Phase(t.prefill, ranks=sc.tp, pipelined=cpu is None)]
    parts = [(t, False, 1, sc.tp)]
    if spec.tables is not None:
        prefill.append(Phase(spec.tables.prefill, draft=True, ranks=spec.tp))
        parts.append((spec.tables, True, spec.drafted, spec.tp))
    decode = [Phase(d0, slope.times(e), np.full(size, n / e), draft, times, ranks)
              for tab, draft, times, ranks in parts for d0, slope, n in tab.decode_steps(n_steps)]
    if spec.heads is not None:
        decode.append(Phase(spec.heads, steps=n_steps / e, draft=True, ranks=spec.tp))
    return Schedule(tuple(prefill), tuple(decode), sc.micro_batches, sc.pp, np.full(size, n_steps, dtype=float),
                    np.full(size, e), spec.tp, cpu=cpu, rounds=True)


def cpu_efficiency(given, ideal: bool) -> Efficiency:
    """The Efficiency of the host CPU's share of a CPU layer split."""
    return choose("cpu", given, ideal)


def run_time(s: Schedule, sys: SystemArrays, eff: Efficiency, cpu_eff: Efficiency | None, layer_ops) -> tuple:
    """(prefill, whole decode) seconds, [P], of the run ``s`` on ``sys`` (the draft's phases on its
    own tp ranks): the first prefill pipelined over micro-batches and stages; under a CPU layer
    split (``cpu_eff``: the CPU's efficiency; ``layer_ops``: which operators are per layer) each
    target step's per-layer operators shared between device and CPU (a draft's steps on the device),
    the CPU's fixed step overhead counted once, and the activations crossing the host link both ways
    a target step (a decode step; under speculative decoding, a round). Under two-batch overlap
    (``sys.two_batch_overlap``) each device step runs as two overlapped half batches
    (``dse.core.overlap``; not under a CPU layer split)."""
    on = (sys, sys if s.draft_tp is None else sys.replaced(tp=np.full(sys.size, s.draft_tp)))
    c = s.cpu
    prefill = None
    for ph in s.prefill:
        if not s.split(ph):
            x = step_s(ph.op, on[ph.draft], eff)
        else:
            dev, cpu = split_counts(ph.op, layer_ops, c.share)
            x = step_time(dev, sys, eff) + step_time(cpu, c.system, cpu_eff)
        if ph.pipelined:
            x = pipelined_prefill_s(x, s.micro_batches, s.pp)
        prefill = x if prefill is None else prefill + x
    decode = 0.0
    for ph in s.decode:
        if ph.slope is None:
            x = step_s(ph.op, on[ph.draft], eff) * ph.steps
        elif not s.split(ph):
            x = decode_s(ph.op, ph.slope, ph.steps, on[ph.draft], eff)
        else:
            dev, cpu = split_counts(ph.op, layer_ops, c.share)
            x = (decode_total_time(dev, ph.slope, ph.steps, sys, eff)
                 + decode_total_time(cpu, ph.slope, ph.steps, c.system, cpu_eff))
        decode = decode + ph.repeat * x
    if c is not None:
        # each way: the bytes at the host link's own measured fraction (never the device's
        # collective or memory fraction), its latency and one message's software latency
        frac = c.host_frac if eff.host_links_measured else 1.0
        hop = [2 * (link_transfer_s(b, c.host_bw, frac, c.host_lat) + (eff.collective_latency_s if b > 0 else 0.0))
               for b in (c.hop_prefill, c.hop_decode)]
        target_steps = s.steps / s.tokens_per_step        # decode steps, or speculative rounds
        prefill = prefill - cpu_eff.step_overhead_s + hop[0]
        decode = decode - cpu_eff.step_overhead_s * target_steps + hop[1] * target_steps
    return prefill, decode


def _split_work(s: Schedule, layer_ops, part: int) -> tuple[list, list]:
    """What the energy counts (``step_work``) of each prefill and decode phase of ``s``: the whole
    step, or where the phase is split with the host CPU (``Schedule.split``) its device's (``part``
    0) or its CPU's (1) share (``split_counts``, as ``run_time`` prices them); a phase not split is
    the device's whole (``cpu_energy_j`` leaves it out)."""
    def share(ph, op):
        return op if op is None or not s.split(ph) else split_counts(op, layer_ops, s.cpu.share)[part]
    prefill = [step_work(share(ph, ph.op)) for ph in s.prefill]
    decode = [step_work(share(ph, ph.op)) if ph.slope is None
              else decode_total_work(share(ph, ph.op), share(ph, ph.slope), ph.steps) for ph in s.decode]
    return prefill, decode


def cpu_energy_j(s: Schedule, layer_ops) -> np.ndarray:
    """Dynamic energy (J, [P]) of the host CPU's share of a run under a CPU layer split: its layers'
    work at the CPU preset's J/op and J/bit (``hwmodels.power``: its own TDP's or its class's
    coefficients), once a step; 0 without a split. The host's floor is ``host_power_w``'s (``floor_w``)."""
    if s.cpu is None:
        return np.zeros(1)
    prefill, decode = _split_work(s, layer_ops, 1)
    return sum(energy_j(w, s.cpu.system) for ph, w in zip(s.prefill + s.decode, prefill + decode) if s.split(ph))


def run_energy(s: Schedule, *systems: SystemArrays, layer_ops=None) -> list[tuple[np.ndarray, np.ndarray]]:
    """Dynamic energy (J, [P]) of the run ``s``'s prefill and of its whole decode on all its
    devices, on each of ``systems`` (the group's points, with the J/op of each; the work of each
    phase counted once for all): the tables are one tp rank's share of the whole model for one
    micro-batch, so each step counts its ranks x (micro-batches for a pipelined prefill) times;
    under a CPU layer split (``layer_ops``: which operators are per layer) the device's share only
    (the CPU's: ``cpu_energy_j``)."""
    prefill, decode = _split_work(s, layer_ops, 0)
    out = []
    for sys in systems:
        on = (sys, sys if s.draft_tp is None else sys.replaced(tp=np.full(sys.size, s.draft_tp)))
        e_pre = None
        for ph, w in zip(s.prefill, prefill):
            x = (ph.ranks * s.micro_batches if ph.pipelined else ph.ranks) * energy_j(w, on[ph.draft])
            e_pre = x if e_pre is None else e_pre + x
        if not s.rounds:                 # one kind of step on the target: its ranks x the sum of its pieces
            e_dec = s.decode[0].ranks * sum(energy_j(w, sys) for w in decode)
        else:
            e_dec = 0.0
            for ph, w in zip(s.decode, decode):
                e_dec = e_dec + (ph.repeat * ph.ranks * energy_j(w, on[ph.draft]) if ph.slope is not None
                                 else ph.ranks * energy_j(w, on[ph.draft]) * ph.steps)
        out.append((e_pre, e_dec))
    return out


def price_many(g: Group, eff: Efficiency, given, ideal: bool) -> dict:
    """``price_static`` of a group of many workloads (``WorkloadBatch``), its tables built and priced
    a block of points at a time (``WorkloadBatch.blocks``)."""
    parts = []
    for rows in g.tables.blocks():
        part = replace(g, tables=g.tables.tables(rows), system=g.system.take(rows))
        parts.append(price_static(part, eff, given, ideal))
    return parts[0] if len(parts) == 1 else {k: np.concatenate([np.broadcast_to(p[k], (len(p["ttft_s"]),))
                                                               for p in parts]) for k in parts[0]}


def price_static(g: Group, eff: Efficiency, given, ideal: bool) -> dict:
    """Serving metrics of a static batch of a group's points (arrays): time and energy of its
    ``schedule``, the metrics of the run (``dse.core.metrics.serving_metrics``) and its energy
    and power (``power_and_energy``)."""
    sys, sc = g.system, g.tables.scenario
    s = schedule(g)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        prefill, decode = run_time(s, sys, eff, None if g.cpu is None else cpu_efficiency(given, ideal),
                                   g.tables.layer_ops)
        out = serving_metrics(prefill, decode, sc.batch, sc.prompt_len, sc.gen_len, sc.devices,
                              overlap=eff.prefill_decode_overlap, request_overhead_s=eff.request_overhead_s)
    # a static batch's sequences start, and end, together: every percentile is the mean
    out.update({f"{m}_p{q}_s": out[f"{m}_s"] for m in PERCENTILE_METRICS for q in PERCENTILES})
    out["tokens_per_target_step"] = s.tokens_per_step
    (e_pre, e_dec), (f_pre, f_dec) = run_energy(s, sys, measured_only(sys), layer_ops=g.tables.layer_ops)
    ran = np.asarray(sc.gen_len) > 1          # gen_len 1: the decode step priced for TPOT is never run
    e_dec, f_dec = (np.where(ran, x, 0.0) for x in (e_dec, f_dec))
    decode_s = np.where(ran, decode, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):  # both phases at once while they overlap
        both = static_overlap(eff.prefill_decode_overlap, sc.batch) * np.minimum(prefill, decode_s)
        share = [np.where(t > 0, both / t, 0.0) for t in (prefill, decode_s)]
        out["prefill_time_share"] = prefill / (prefill + decode_s)   # of the machine time (cost split)
    out.update(power_and_energy(e_pre + e_dec + cpu_energy_j(s, g.tables.layer_ops), out["e2e_latency_s"], np.asarray(sc.batch, dtype=float) * sc.gen_len,
                                sc.devices, sys, [(f_pre, prefill), (f_dec, decode_s),
                                                  (f_pre * share[0] + f_dec * share[1], both)]))
    return out


def measured_only(sys: SystemArrays) -> SystemArrays:
    """``sys`` with the work of compute classes that have no measured J/op of their own charged
    nothing (``SystemArrays.energy_op_floor_j``): the power a design needs at least."""
    return sys if sys.energy_op_floor_j is None else sys.replaced(energy_op_j=sys.energy_op_floor_j)


def floor_w(sys: SystemArrays) -> np.ndarray:
    """Power drawn per device whatever the work, W, [P]: the device's static power (NaN where
    unknown) plus the host server's share beyond the accelerators (``host_w``, ``host_power_w``;
    0 where not given)."""
    static = sys.static_w if sys.static_w is not None else np.full(sys.size, np.nan)
    return static if sys.host_w is None else static + sys.host_w


def power_and_energy(dynamic_j, seconds, tokens, devices, sys: SystemArrays, phases) -> dict:
    """Energy per token, average power of the system (W), tokens per joule and the power demand
    of one device (W) of a run (or one second of a steady state) of a group's points: the energy
    the dynamic energy plus ``floor_w`` (static and host power) x devices x seconds, with
    ``over_tdp`` where a device would need more than its limit in some phase (``checked_demand_w``; ``phases``: the
    dynamic energy and seconds of each, the energy counted with ``measured_only``, so the demand
    is one the design cannot avoid; work in a class without a measured J/op of its own, such as
    FP8 on Hopper, is charged at a wider class's J/op in the energy reported, an upper bound, but
    nothing in this check): such a design runs at a lower clock (``dse.system.evaluator``'s
    ``_capped``), or is infeasible (reason ``power``) where no clock meets it. The check applies to
    predictions (calibrated or given efficiencies), not to the ideal roofline, which bounds speed
    and may ask for more power than the chip has. The demand reported is at least the average
    power per device (an average lies below the largest of its phases; where the unmeasured work
    the average is charged for lifts it above the phases counted without it, the average is the
    most demanding phase known; the host's power, drawn outside the device, is in neither)."""
    static = sys.static_w if sys.static_w is not None else np.full(sys.size, np.nan)
    out = energy_figures(dynamic_j, seconds, tokens, devices, floor_w(sys))
    del out["energy_j"]
    demand = np.where(np.isnan(dynamic_j), np.nan, power_demand_w(phases, devices, static))
    with np.errstate(invalid="ignore"):
        own = out["power_w"] / devices - (0.0 if sys.host_w is None else sys.host_w)   # the device's average
        out["power_demand_w"] = np.where(np.isnan(demand), np.nan, np.fmax(demand, own))
    tdp = sys.tdp_w if sys.tdp_w is not None else np.full(sys.size, np.nan)
    return {**out, "over_tdp": demand > tdp, "checked_demand_w": demand}


def split_counts(op, layer_ops: np.ndarray, share: float):
    """(accelerator part, CPU part) of a step when ``share`` of the layers run on the CPU:
    per-layer operators split in proportion, the others stay on the accelerator."""
    cpu = np.where(layer_ops, op.count * share, 0.0)
    return replace(op, count=op.count - cpu), replace(op, count=cpu)
