"""Single-design-point analysis: per-operator rows and a summary.

Uses the same vectorized kernel as sweeps (``dse.roofline``) with one point.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from dse.efficiency import DEFAULT, IDEAL, Efficiency
from dse.errors import DseError
from dse.metrics import serving_metrics
from dse.roofline import OpArrays, SystemArrays, decode_total_time, op_costs, step_time
from hwmodels.device import Device
from hwmodels.formats import matmul_compute_class
from hwmodels.placement import Placement, place
from workloads import optable
from workloads.footprint import Footprint, footprint
from workloads.model import ModelSpec
from workloads.scenario import Scenario

ROW_KEYS = ("name", "count", "compute_format", "ops", "weight_bytes", "act_bytes", "kv_bytes", "memory_bytes",
            "comm_bytes", "arithmetic_intensity", "bound", "time_s", "total_time_s", "share")


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


def _rows(table, cost, device: Device) -> list[dict]:
    used = [device.compute_class_for(c) for c in table.compute_classes]
    ops = table.ops
    mem = table.memory_bytes
    total = cost.time_s[0] * table.counts
    step = total.sum()
    bound = cost.bound[0]
    rows = []
    for i, op in enumerate(table.operators):
        ai = ops[i] / mem[i] if mem[i] > 0 else float("inf") if ops[i] > 0 else 0.0
        rows.append({
            "name": op.name, "count": op.count,
            "compute_format": {"none": "-", "vector": "vector"}.get(used[i], used[i]),
            "ops": float(ops[i]), "weight_bytes": float(table.weight_bytes[i]),
            "act_bytes": float(table.act_bytes[i]), "kv_bytes": float(table.kv_bytes[i]),
            "memory_bytes": float(mem[i]), "comm_bytes": float(table.comm_bytes[i]),
            "arithmetic_intensity": float(ai), "bound": str(bound[i]), "time_s": float(cost.time_s[0, i]),
            "total_time_s": float(total[i]), "share": float(total[i] / step) if step > 0 else 0.0,
        })
    return rows


def analyze(model: ModelSpec, device: Device, sc: Scenario, *, batch_max: bool = False,
            ideal: bool = False, efficiency: Efficiency | None = None, offload="none",
            overlap: bool = True) -> Analysis:
    """Analyze a prefill and a generation of ``sc`` on ``sc.tp x sc.pp`` devices of ``device``.

    Rows: the prefill's operators and one decode step attending to ``prompt_len``
    cached tokens (one micro-batch under PP). Summary: TTFT, TPOT (mean over the
    generation, exact over the growing context), latency, throughputs, footprint,
    placement under the ``offload`` policy and whether it fits.

    Pipeline: ``m = min(batch, pp)`` micro-batches; the prefill of the last one ends
    after (m + pp - 1) stage times, i.e. (m + pp - 1) / pp passes of the whole model;
    a decode step of a micro-batch is one pass, and the m micro-batches interleave."""
    eff = IDEAL if ideal else (efficiency or DEFAULT)
    if sc.flash_attention and device.onchip_buffer_bytes <= 0:
        raise DseError(f"hardware '{device.name}' has no onchip_buffer_bytes; FlashAttention traffic needs it")
    for wanted in {matmul_compute_class(sc.activations, sc.weights),
                   matmul_compute_class(sc.activations, sc.kv)}:
        device.compute_class_for(wanted)  # raises a clear error if impossible
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
    where = placement_of(fp, device, offload, sc.devices)
    system = SystemArrays.from_devices([device], sc.tp, offload=where.offload, overlap=overlap)
    pre_arr, dec_arr = OpArrays.from_table(pre), OpArrays.from_table(dec)
    pre_cost, dec_cost = op_costs(pre_arr, system, eff), op_costs(dec_arr, system, eff)
    m = sc.micro_batches
    ttft = step_time(pre_arr, system, eff) * (m + sc.pp - 1) / sc.pp

    steps = max(sc.gen_len - 1, 1)
    d0, slope = optable.decode_linear(model, replace(sc, batch=sc.micro_batch), sc.prompt_len + 1,
                                      device.onchip_buffer_bytes)
    dec_total = decode_total_time(OpArrays.from_table(d0), OpArrays.from_table(slope), np.array([steps]), system, eff)
    metrics = serving_metrics(ttft, dec_total, sc.batch, sc.prompt_len, sc.gen_len, sc.devices)

    why = where.why
    if why and note:
        why = f"{note}: {why}"
    summary = {
        "model": model.name, "hardware": device.name, "devices": sc.devices, "tp": sc.tp, "pp": sc.pp,
        "batch": sc.batch, "prompt_len": sc.prompt_len, "gen_len": sc.gen_len,
        "weights": sc.weights.name, "activations": sc.activations.name, "kv": sc.kv.name,
        "flash_attention": sc.flash_attention, "efficiency": eff.name,
        **{k: float(v[0]) for k, v in metrics.items()},
        "weights_bytes": fp.weights_bytes, "kv_cache_bytes": fp.kv_cache_bytes,
        "activation_bytes": fp.activation_bytes, "peak_memory_bytes": fp.total_bytes,
        "capacity_bytes": device.memory.capacity_bytes, "offload": where.policy,
        "offloaded_bytes": where.host_bytes, "fits": bool(where.fits),
    }
    if why:
        summary["why"] = why
    return Analysis(_rows(pre, pre_cost, device), _rows(dec, dec_cost, device), summary)
