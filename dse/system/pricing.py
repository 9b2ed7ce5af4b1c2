"""Pricing of static batches: time and energy of a run (prefill, then decode steps; under
speculative decoding, rounds of a draft and a verifying target step; under a CPU layer split,
each step shared between the device and the host CPU) from one ``Schedule`` of its phases,
walked once for time (``dse.core.roofline.step_time``) and once for energy
(``dse.core.roofline.energy_j``); serving metrics of the run (``dse.core.metrics``), energy
per token, power and the power check (``power_and_energy``)."""

from dataclasses import replace

import numpy as np

from dse.core.efficiency import Efficiency, choose
from dse.core.metrics import (energy_figures, pipelined_prefill_s, power_demand_w,
                              serving_metrics)
from dse.core.roofline import (SystemArrays, decode_total_energy_j, decode_total_time,
                               decode_total_work, energy_j, step_energy_j, step_time, step_work, transfer_time)
from dse.core.serving import PERCENTILES
from dse.system.grouping import Group
from dse.system.result import PERCENTILE_METRICS
from workloads.techniques import tokens_per_target_step


def cpu_efficiency(given, ideal: bool) -> Efficiency:
    return choose("cpu", given, ideal)


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
    """Serving metrics of a group's points (arrays)."""
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
            ceff = cpu_efficiency(given, ideal)
            dev_pre, cpu_pre = split_counts(t.prefill, t.layer_ops, c["share"])
            hop = [2 * transfer_time(b, c["host_bw"], c["host_lat"], eff) for b in (c["hop_prefill"], c["hop_decode"])]
            prefill = (step_time(dev_pre, sys, eff) + step_time(cpu_pre, c["system"], ceff)
                       - ceff.step_overhead_s + hop[0])
            decode = 0.0
            for d0, slope, n in pieces:
                dev_d0, cpu_d0 = split_counts(d0, t.layer_ops, c["share"])
                decode = decode + (decode_total_time(dev_d0, slope, n, sys, eff)
                                   + decode_total_time(cpu_d0, slope, n, c["system"], ceff))
            decode = decode - ceff.step_overhead_s * steps + hop[1] * steps
        out = serving_metrics(prefill, decode, sc.batch, sc.prompt_len, sc.gen_len, sc.devices,
                              overlap=eff.prefill_decode_overlap, request_overhead_s=eff.request_overhead_s)
    # a static batch's sequences start, and end, together: every percentile is the mean
    out.update({f"{m}_p{q}_s": out[f"{m}_s"] for m in PERCENTILE_METRICS for q in PERCENTILES})
    out["tokens_per_target_step"] = per_step
    (e_pre, e_dec), (f_pre, f_dec) = _run_energy(g, sys, measured_only(sys))
    out.update(power_and_energy(e_pre + e_dec, out["e2e_latency_s"], np.asarray(sc.batch, dtype=float) * sc.gen_len,
                       sc.devices, sys,
                       [(f_pre, prefill), (f_dec, decode)]))
    return out


def measured_only(sys: SystemArrays) -> SystemArrays:
    """``sys`` with the work of compute classes that have no measured J/op of their own charged
    nothing (``SystemArrays.energy_op_floor_j``): the power a design needs at least."""
    return sys if sys.energy_op_floor_j is None else sys.replaced(energy_op_j=sys.energy_op_floor_j)


def _run_energy(g: Group, *systems: SystemArrays) -> list[tuple[np.ndarray, np.ndarray]]:
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


def _speculative_energy(g: Group, sys: SystemArrays, n_steps) -> tuple[np.ndarray, np.ndarray]:
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


def power_and_energy(dynamic_j, seconds, tokens, devices, sys: SystemArrays, phases) -> dict:
    """Energy per token, average power, tokens per joule and the power demand of a run (or one
    second of a steady state) of a group's points, with ``over_tdp`` where a device would need
    more than its TDP in some phase (``phases``: the dynamic energy and seconds of each, the energy
    counted with ``measured_only``, so the demand is one the design cannot avoid; work in a class
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


def _speculative(g: Group, eff: Efficiency) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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


def split_counts(op, layer_ops: np.ndarray, share: float):
    """(accelerator part, CPU part) of a step when ``share`` of the layers run on the CPU:
    per-layer operators split in proportion, the others stay on the accelerator."""
    cpu = np.where(layer_ops, op.count * share, 0.0)
    return replace(op, count=op.count - cpu), replace(op, count=cpu)
