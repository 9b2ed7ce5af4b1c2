"""The columns of a design point: every hardware and workload parameter ``evaluate`` reads.

A design point is one entry of each column. Hardware columns start from the base preset
named in ``hardware`` (a preset name, a preset YAML path, or a ``Device``) and override
its figures; workload columns describe what runs on it. A column left out takes its
default (``DEFAULTS``); ``tp``, ``pp`` and ``devices`` left out mean "not given": the
parallel layout is then derived (``dse.system.layout``). Values are SI units (bytes,
bytes/s, ops/s, seconds, watts, dollars).

``batch`` also takes ``"max"`` (the largest batch that fits). ``offload`` takes ``none``,
``greedy`` or explicit fractions such as ``weights=0.5,kv=0.2``.
"""
from __future__ import annotations

from hwmodels.formats import COMPUTE_CLASSES

#: hardware-template parameters (override the base preset named by ``hardware``)
HARDWARE_PARAMS = {
    "hardware": str,
    **{f"peak_{c}": float for c in COMPUTE_CLASSES},
    "compute_scale": float,
    "vector_ops_per_s": float,
    "memory_bandwidth": float,
    "memory_capacity": float,
    "onchip_buffer_bytes": float,
    "link": str,
    "link_bandwidth": float,
    "link_latency": float,
    "host_tier": str,
    "host_link_bandwidth": float,
    "host_memory_capacity": float,
    "host_memory_bandwidth": float,
    "host_cpu": str,
    "pim_multiple": float,
    "pim_peak": float,
    "native_formats": str,
    "tdp_w": float,
    "price_usd": float,
}
#: workload parameters (``devices`` alone sets tp = devices / (pp x ep))
WORKLOAD_PARAMS = {
    "model": str,
    "batch": int,
    "prompt_len": int,
    "gen_len": int,
    "weights": str,
    "activations": str,
    "kv": str,
    "devices": int,
    "tp": int,
    "pp": int,
    "ep": int,
    "flash_attention": bool,
    "offload": str,
    "overlap": bool,
    "sparse": bool,
    "cpu_layers": int,
}
PARAMS = {**HARDWARE_PARAMS, **WORKLOAD_PARAMS}
#: integer parameters that may be 0 (all others must be positive)
ZERO_ALLOWED = ("cpu_layers",)
#: numeric parameters whose NaN entries mean "not given" at that point (the layout follows
#: from the others; a hardware figure is the base preset's own)
MAY_BE_MISSING = ("devices", "tp", "pp", *(k for k, v in HARDWARE_PARAMS.items() if v is float))
DEFAULTS = {"batch": 1, "prompt_len": 512, "gen_len": 128, "weights": "fp16", "activations": "fp16", "kv": "fp16",
            "ep": 1, "flash_attention": False, "offload": "none", "overlap": True, "sparse": False, "cpu_layers": 0}
#: the value of ``batch`` that asks for the largest batch that fits
BATCH_MAX = "max"

__all__ = ["PARAMS", "HARDWARE_PARAMS", "WORKLOAD_PARAMS", "DEFAULTS", "ZERO_ALLOWED", "BATCH_MAX", "MAY_BE_MISSING"]
