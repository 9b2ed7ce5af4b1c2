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
    buf = device.onchip_buffer_bytes
    pre = optable.prefill(model, sc, buf)
    dec = optable.decode_step(model, sc, sc.prompt_len, buf)
    return pre, dec


def compute_footprint(model: ModelSpec, sc: Scenario, device: Device) -> Footprint:
    """Per-device footprint of serving ``sc`` on ``device``."""
    pre, dec = _tables(model, sc, device)
    return footprint(model, sc, pre, dec)


def max_batch(model: ModelSpec, sc: Scenario, device: Device, limit: int = 1 << 20) -> int:
    """Largest batch whose footprint fits the device memory (0 if none does)."""
    cap = device.memory.capacity_bytes
    fits = lambda b: compute_footprint(model, replace(sc, batch=b), device).total_bytes <= cap  # noqa: E731
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
            ideal: bool = False, efficiency: Efficiency | None = None) -> Analysis:
    """Analyze a prefill and a generation of ``sc`` on ``sc.tp`` devices of ``device``.

    Rows: the prefill's operators and one decode step attending to ``prompt_len``
    cached tokens. Summary: TTFT, TPOT (mean over the generation, exact over the
    growing context), latency, throughputs, footprint and whether it fits."""
    eff = IDEAL if ideal else (efficiency or DEFAULT)
    if sc.flash_attention and device.onchip_buffer_bytes <= 0:
        raise DseError(f"hardware '{device.name}' has no onchip_buffer_bytes; FlashAttention traffic needs it")
    for wanted in {optable.matmul_compute_class(sc.activations, sc.weights),
                   optable.matmul_compute_class(sc.activations, sc.kv)}:
        device.compute_class_for(wanted)  # raises a clear error if impossible
    note = ""
    if batch_max:
        b = max_batch(model, sc, device)
        if b == 0:
            note = "even batch 1 does not fit"
            b = 1
        sc = replace(sc, batch=b)
    pre, dec = _tables(model, sc, device)
    system = SystemArrays.from_devices([device], sc.tp)
    if sc.tp > 1 and device.interconnect is None:
        raise DseError(f"hardware '{device.name}' has no interconnect to run tensor parallelism over {sc.tp} devices")
    pre_arr, dec_arr = OpArrays.from_table(pre), OpArrays.from_table(dec)
    pre_cost, dec_cost = op_costs(pre_arr, system, eff), op_costs(dec_arr, system, eff)
    ttft = step_time(pre_arr, system, eff)

    steps = max(sc.gen_len - 1, 1)
    d0, slope = optable.decode_linear(model, sc, sc.prompt_len + 1, device.onchip_buffer_bytes)
    dec_total = decode_total_time(OpArrays.from_table(d0), OpArrays.from_table(slope), np.array([steps]), system, eff)
    metrics = serving_metrics(ttft, dec_total, sc.batch, sc.prompt_len, sc.gen_len, sc.tp)

    fp = footprint(model, sc, pre, dec)
    cap = device.memory.capacity_bytes
    fits = fp.total_bytes <= cap
    why = ""
    if not fits:
        why = (f"needs {fp.total_bytes / 1e9:.2f} GB per device (weights {fp.weights_bytes / 1e9:.2f} GB, "
               f"KV cache {fp.kv_cache_bytes / 1e9:.2f} GB, activations {fp.activation_bytes / 1e9:.2f} GB) "
               f"but {device.name} has {cap / 1e9:.2f} GB")
        if note:
            why = f"{note}: {why}"
    summary = {
        "model": model.name, "hardware": device.name, "devices": sc.tp, "tp": sc.tp,
        "batch": sc.batch, "prompt_len": sc.prompt_len, "gen_len": sc.gen_len,
        "weights": sc.weights.name, "activations": sc.activations.name, "kv": sc.kv.name,
        "flash_attention": sc.flash_attention, "efficiency": eff.name,
        **{k: float(v[0]) for k, v in metrics.items()},
        "weights_bytes": fp.weights_bytes, "kv_cache_bytes": fp.kv_cache_bytes,
        "activation_bytes": fp.activation_bytes, "peak_memory_bytes": fp.total_bytes,
        "capacity_bytes": cap, "fits": bool(fits),
    }
    if why:
        summary["why"] = why
    return Analysis(_rows(pre, pre_cost, device), _rows(dec, dec_cost, device), summary)
