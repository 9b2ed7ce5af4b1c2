"""Chip count and parallel layout of a spatial (LPU-style) system.

A spatial device is one chip whose first memory tier (on-chip SRAM, or HBM for
SN40L-like parts) holds a share of the weights, KV cache and activations. The
system needs ``ceil(footprint / capacity per chip)`` chips; layers are pipelined
over chips (``pp`` stages, a divisor of the layer count) with tensor parallelism
inside a stage (``tp`` dividing the heads), and the layout used is the smallest
``tp x pp`` whose per-chip share fits.
"""
from __future__ import annotations

import math
from dataclasses import replace

from dse.system.analysis import compute_footprint
from basis.errors import DseError
from hwmodels.device import Device
from workloads.model import ModelSpec
from workloads.scenario import Scenario


def chips_required(model: ModelSpec, sc: Scenario, device: Device) -> int:
    """ceil(bytes of weights, KV cache and activations on one chip's worth of model /
    capacity of the chip's first memory tier)."""
    fp = compute_footprint(model, replace(sc, tp=1, pp=1, ep=1), device)
    return max(1, math.ceil(fp.total_bytes / device.memory.capacity_bytes))


def _valid_tp(model: ModelSpec) -> list[int]:
    out = []
    for t in range(1, model.num_heads + 1):
        if model.num_heads % t:
            continue
        if model.num_kv_heads and not (model.num_kv_heads % t == 0 or t % model.num_kv_heads == 0):
            continue
        if model.is_moe and model.moe_intermediate_size % t:
            continue
        out.append(t)
    return out


def spatial_layout(model: ModelSpec, sc: Scenario, device: Device) -> tuple[int, int, int]:
    """(chips required by capacity, tp, pp) of the smallest layout whose per-chip share
    fits; DseError if none does."""
    need = chips_required(model, sc, device)
    pps = [p for p in range(1, model.num_layers + 1) if model.num_layers % p == 0]
    layouts = sorted(((t, p) for t in _valid_tp(model) for p in pps if t * p >= need),
                     key=lambda tp_pp: (tp_pp[0] * tp_pp[1], tp_pp[0]))
    cap = device.memory.capacity_bytes
    for t, p in layouts:
        if compute_footprint(model, replace(sc, tp=t, pp=p), device).total_bytes <= cap:
            return need, t, p
    raise DseError(f"model '{model.name}' does not fit on any layout of '{device.name}' chips "
                   f"(at most {max(_valid_tp(model))} x {model.num_layers} chips of {cap / 1e6:.0f} MB)")
