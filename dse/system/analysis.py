"""Single-design-point analysis: per-operator rows and a summary.

Uses the same vectorized kernel as sweeps (``dse.core.roofline``) with one point.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from dse.core.efficiency import Efficiency, choose
from basis.errors import DseError
from dse.core.metrics import serving_metrics
from dse.core.roofline import OpArrays, SystemArrays, decode_total_time, op_costs, step_time
from hwmodels.device import Device
from hwmodels.formats import matmul_compute_class
from hwmodels.placement import Placement, place
from workloads import optable
from workloads.footprint import Footprint, footprint, layer_parameter_count
from workloads.model import ModelSpec
from workloads.scenario import Scenario

ROW_KEYS = ("name", "count", "place", "compute_format", "ops", "weight_bytes", "act_bytes", "kv_bytes",
            "memory_bytes", "comm_bytes", "arithmetic_intensity", "bound", "time_s", "total_time_s", "share")

#: operators that are not repeated per layer (they stay on the accelerator in a CPU split)
NON_LAYER_OPS = ("embedding", "embedding_norm", "final_norm", "lm_head", "pp_hop")


@dataclass(frozen=True)
class Analysis:
    """Result of one analysis: rows per operator and a summary dict (SI units)."""

    prefill: list[dict]
    decode: list[dict]
    summary: dict


def _tables(model: ModelSpec, sc: Scenario, device: Device):
    """Prefill and decode-step tables of one micro-batch (the whole batch without PP)."""
    buf = device.onchip_buffer_bytes
    micro = replace(sc, batch=sc.micro_batch)
    pre = optable.prefill(model, micro, buf)
    dec = optable.decode_step(model, micro, sc.prompt_len, buf)
    return pre, dec


def compute_footprint(model: ModelSpec, sc: Scenario, device: Device) -> Footprint:
    """Per-device footprint of serving ``sc`` on ``device``."""
    pre, dec = _tables(model, sc, device)
    return footprint(model, sc, pre, dec)


def placement_of(fp: Footprint, device: Device, policy="none", devices: int = 1) -> Placement:
    """Where a per-device footprint lives on ``device`` under an offload policy
    (``devices`` of them share the host memory)."""
    return place(fp.weights_bytes, fp.activation_bytes, fp.kv_cache_bytes, device, policy, devices)


def max_batch(model: ModelSpec, sc: Scenario, device: Device, limit: int = 1 << 20, offload="none") -> int:
    """Largest batch whose footprint fits (device memory, plus the host tier under an
    offload policy); 0 if none does."""
    def fits(b):
        return placement_of(compute_footprint(model, replace(sc, batch=b), device), device, offload,
                            sc.devices).fits
    if not fits(1):
        return 0
    lo, hi = 1, 2
    while hi <= limit and fits(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, limit + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def _rows(table, cost, device: Device, place: str = "device", counts=None) -> list[dict]:
    """One row per operator: its cost per instance and over the step (``counts``
    instances; default the table's) and where it runs."""
    used = [device.compute_class_for(c) for c in table.compute_classes]
    ops = table.ops
    mem = table.memory_bytes
    counts = table.counts if counts is None else counts
    total = cost.time_s[0] * counts
    step = total.sum()
    bound = cost.bound[0]
    on_pim = cost.on_pim[0] if cost.on_pim is not None else np.zeros(len(ops), dtype=bool)
    rows = []
    for i, op in enumerate(table.operators):
        ai = ops[i] / mem[i] if mem[i] > 0 else float("inf") if ops[i] > 0 else 0.0
        rows.append({
            "name": op.name, "count": float(counts[i]), "place": "pim" if on_pim[i] else place,
            "compute_format": {"none": "-", "vector": "vector"}.get(used[i], used[i]),
            "ops": float(ops[i]), "weight_bytes": float(table.weight_bytes[i]),
            "act_bytes": float(table.act_bytes[i]), "kv_bytes": float(table.kv_bytes[i]),
            "memory_bytes": float(mem[i]), "comm_bytes": float(table.comm_bytes[i]),
            "arithmetic_intensity": float(ai), "bound": str(bound[i]), "time_s": float(cost.time_s[0, i]),
            "total_time_s": float(total[i]), "share": float(total[i] / step) if step > 0 else 0.0,
        })
    return rows


def _cpu_split_counts(table, num_layers: int, cpu_layers: int):
    """(accelerator counts, CPU counts) of a table when ``cpu_layers`` of the model's
    layers run on the host CPU: per-layer operators split in proportion, the
    embedding, final norm, head and pipeline hops stay on the accelerator."""
    counts = table.counts
    layer = np.array([op.name not in NON_LAYER_OPS for op in table.operators])
    share = cpu_layers / num_layers
    cpu = np.where(layer, counts * share, 0.0)
    return counts - cpu, cpu


def analyze(model: ModelSpec, device: Device, sc: Scenario, *, batch_max: bool = False,
            ideal: bool = False, efficiency: Efficiency | None = None, offload="none",
            overlap: bool = True, sparse: bool = False, cpu_layers: int = 0,
            host_cpu: Device | None = None, chips_required: int | None = None) -> Analysis:
    """Analyze a prefill and a generation of ``sc`` on ``sc.devices`` devices of ``device``.

    Rows: the prefill's operators and one decode step attending to ``prompt_len``
    cached tokens (one micro-batch of one expert-parallel group under PP/EP), with
    where each runs (device, pim, cpu). Summary: TTFT, TPOT (mean over the
    generation, exact over the growing context), latency, throughputs, footprint,
    placement under the ``offload`` policy and whether it fits.

    Pipeline: ``m = min(batch, pp)`` micro-batches; the prefill of the last one ends
    after (m + pp - 1) stage times, i.e. (m + pp - 1) / pp passes of the whole model;
    a decode step of a micro-batch is one pass, and the m micro-batches interleave
    (per-token latency with the pipeline full).

    ``sparse``: weight matmuls use the device's 2:4 sparse peaks. ``cpu_layers``: that
    many layers run on ``host_cpu`` (llama.cpp-style split) at its peak and memory
    bandwidth, their weights and KV in host memory; the hidden state crosses the host
    link twice per step."""
    eff = choose(device, efficiency, ideal)
    if sc.flash_attention and device.onchip_buffer_bytes <= 0:
        raise DseError(f"hardware '{device.name}' has no onchip_buffer_bytes; FlashAttention traffic needs it")
    for wanted in {matmul_compute_class(sc.activations, sc.weights),
                   matmul_compute_class(sc.activations, sc.kv)}:
        device.compute_class_for(wanted)  # raises a clear error if impossible
        if host_cpu is not None:
            host_cpu.compute_class_for(wanted)
    if sparse and not device.sparse_peak_ops_per_s:
        raise DseError(f"hardware '{device.name}' publishes no 2:4 sparse peaks (sparse_peak_ops_per_s)")
    if cpu_layers:
        if host_cpu is None:
            raise DseError(f"--cpu-layers needs a host CPU: hardware '{device.name}' names no host_cpu; "
                           f"give --host-cpu (a cpu preset)")
        if not 0 < cpu_layers <= model.num_layers:
            raise DseError(f"--cpu-layers must be between 1 and the model's {model.num_layers} layers, got {cpu_layers}")
        if offload != "none" or sc.devices > 1:
            raise DseError("--cpu-layers works on one device without --offload")
    note = ""
    if batch_max:
        b = max_batch(model, sc, device, offload=offload)
        if b == 0:
            note = "even batch 1 does not fit"
            b = 1
        sc = replace(sc, batch=b)
    if sc.devices > 1 and device.interconnect is None:
        raise DseError(f"hardware '{device.name}' has no interconnect to run over {sc.devices} devices")
    pre, dec = _tables(model, sc, device)
    fp = footprint(model, sc, pre, dec)
    share = cpu_layers / model.num_layers
    if cpu_layers:
        fp_dev = replace(fp, weights_bytes=fp.weights_bytes - _layer_weight_bytes(model, sc) * share,
                         kv_cache_bytes=fp.kv_cache_bytes * (1 - share))
        where = _cpu_split_placement(fp, fp_dev, device, host_cpu)
    else:
        where = placement_of(fp, device, offload, sc.devices)
    system = SystemArrays.from_devices([device], sc.tp, offload=where.offload, overlap=overlap, sparse=sparse)
    pre_arr, dec_arr = OpArrays.from_table(pre), OpArrays.from_table(dec)
    d0, slope = optable.decode_linear(model, replace(sc, batch=sc.micro_batch), sc.prompt_len + 1,
                                      device.onchip_buffer_bytes)
    d0_arr, slope_arr = OpArrays.from_table(d0), OpArrays.from_table(slope)
    steps = max(sc.gen_len - 1, 1)
    pre_cost, dec_cost = op_costs(pre_arr, system, eff), op_costs(dec_arr, system, eff)
    m = sc.micro_batches
    if cpu_layers:
        cpu = SystemArrays.from_devices([host_cpu], 1, sparse=False)
        (pre_dev_n, pre_cpu_n), (dec_dev_n, dec_cpu_n) = (_cpu_split_counts(t, model.num_layers, cpu_layers)
                                                          for t in (pre, dec))
        hop = _host_hops(pre, dec, model, sc, device, eff)
        prefill_s = (step_time(replace(pre_arr, count=pre_dev_n), system, eff)
                     + step_time(replace(pre_arr, count=pre_cpu_n), cpu, eff) - eff.step_overhead_s + hop[0])
        dec_total = (decode_total_time(replace(d0_arr, count=dec_dev_n), slope_arr, np.array([steps]), system, eff)
                     + decode_total_time(replace(d0_arr, count=dec_cpu_n), slope_arr, np.array([steps]), cpu, eff)
                     - eff.step_overhead_s * steps + hop[1] * steps)
        ttft = prefill_s
        rows_pre = _rows(pre, pre_cost, device, counts=pre_dev_n) + _rows(pre, op_costs(pre_arr, cpu, eff), host_cpu,
                                                                         "cpu", pre_cpu_n)
        rows_dec = _rows(dec, dec_cost, device, counts=dec_dev_n) + _rows(dec, op_costs(dec_arr, cpu, eff), host_cpu,
                                                                         "cpu", dec_cpu_n)
        rows_pre = [r for r in rows_pre if r["count"] > 0]
        rows_dec = [r for r in rows_dec if r["count"] > 0]
    else:
        ttft = step_time(pre_arr, system, eff) * (m + sc.pp - 1) / sc.pp
        dec_total = decode_total_time(d0_arr, slope_arr, np.array([steps]), system, eff)
        rows_pre, rows_dec = _rows(pre, pre_cost, device), _rows(dec, dec_cost, device)
    metrics = serving_metrics(ttft, dec_total, sc.batch, sc.prompt_len, sc.gen_len, sc.devices,
                              overlap=eff.prefill_decode_overlap, request_overhead_s=eff.request_overhead_s)

    why = where.why
    if why and note:
        why = f"{note}: {why}"
    summary = {
        "model": model.name, "hardware": device.name, "devices": sc.devices, "tp": sc.tp, "pp": sc.pp,
        "ep": sc.ep, "batch": sc.batch, "prompt_len": sc.prompt_len, "gen_len": sc.gen_len,
        "weights": sc.weights.name, "activations": sc.activations.name, "kv": sc.kv.name,
        "flash_attention": sc.flash_attention, "sparse": sparse, "efficiency": eff.name,
        **{k: float(v[0]) for k, v in metrics.items()},
        "weights_bytes": fp.weights_bytes, "kv_cache_bytes": fp.kv_cache_bytes,
        "activation_bytes": fp.activation_bytes, "peak_memory_bytes": fp.total_bytes,
        "capacity_bytes": device.memory.capacity_bytes, "offload": where.policy,
        "offloaded_bytes": where.host_bytes, "fits": bool(where.fits),
    }
    if chips_required is not None:
        summary["chips_required"] = chips_required
    if cpu_layers:
        summary.update(cpu_layers=cpu_layers, host_cpu=host_cpu.name)
    if why:
        summary["why"] = why
    return Analysis(rows_pre, rows_dec, summary)


def _layer_weight_bytes(model: ModelSpec, sc: Scenario) -> float:
    """Bytes of the per-layer weights (all but embedding, head, final norm); the CPU
    split runs on one device, so this is the whole model's."""
    return layer_parameter_count(model, sc.tp) * sc.weights.bytes


def _cpu_split_placement(fp: Footprint, fp_dev: Footprint, device: Device, cpu: Device) -> Placement:
    """Placement of a CPU/accelerator layer split: the accelerator holds ``fp_dev``; the
    CPU's layers live in the host memory (the device's host_memory, else the CPU's)."""
    host = fp.total_bytes - fp_dev.total_bytes
    hmem = device.host_memory or cpu.memory
    cap = device.memory.capacity_bytes
    why = ""
    if fp_dev.total_bytes > cap:
        why = f"accelerator part {fp_dev.total_bytes / 1e9:.2f} GB exceeds {device.name}'s {cap / 1e9:.2f} GB"
    elif host > hmem.capacity_bytes:
        why = f"CPU layers need {host / 1e9:.2f} GB but the host memory has {hmem.capacity_bytes / 1e9:.2f} GB"
    return Placement("cpu-layers", (0.0, 0.0, 0.0), fp_dev.total_bytes, host, not why, why)


def _host_hops(pre, dec, model: ModelSpec, sc: Scenario, device: Device, eff: Efficiency) -> tuple[float, float]:
    """Seconds per prefill and per decode step to move the hidden state to the CPU and back."""
    if device.host_link is None:
        raise DseError(f"hardware '{device.name}' names no host_link for a CPU layer split")
    link = device.host_link
    per_token = model.hidden_size * sc.activations.bytes
    cost = [2 * (t.tokens * per_token / (link.bandwidth_bytes_per_s * eff.collective) + link.latency_s)
            for t in (pre, dec)]
    return cost[0], cost[1]
