"""Why a design point is infeasible: one small integer code per point.

The evaluator writes codes (cheap to compute, group and store); text is made only where
it is shown (``describe``). When a point fails several checks the first in the order of
``REASONS`` is its reason (``rank``; a code keeps its number wherever it is listed);
``Evaluation.violations`` keeps every check as a number. Codes from ``CONSTRAINT_BASE`` on
are a study's constraints, in the order given.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Reason:
    """A reason code: a stable key (stored in results) and the text shown to people, a
    template over the point's parameters and resolved layout."""

    code: int
    key: str
    label: str
    text: str = ""


REASONS = (
    Reason(0, "", ""),
    Reason(1, "layout", "devices is not tp x pp x ep",
           "devices {devices_given} must equal tp {tp_given} x pp {pp_given} x ep {ep}"),
    Reason(2, "model_split", "the parallel layout does not divide the model"),
    Reason(12, "context", "prompt and generation exceed the model's maximum context",
           "prompt_len {prompt_len} + gen_len {gen_len} exceed the maximum context of model '{model_name}' "
           "(max_position_embeddings)"),
    Reason(3, "cpu_split", "the CPU layer split cannot run"),
    Reason(4, "format", "cannot compute a format nor any wider one",
           "hardware '{hardware_name}' cannot compute {format} nor any wider format"),
    Reason(6, "interconnect", "no interconnect for several devices",
           "hardware '{hardware_name}' has no interconnect to run over {devices} devices"),
    Reason(7, "onchip_buffer", "FlashAttention needs an on-chip buffer (flash_attention: false turns it off)",
           "hardware '{hardware_name}' has no onchip_buffer_bytes, the on-chip buffer FlashAttention tiles attention "
           "in; turn FlashAttention off (`--no-flash-attention`, or `flash_attention: false` in a study) or give "
           "the buffer's size (`onchip_buffer_bytes` in the preset or the study)"),
    Reason(8, "no_host_tier", "offload needs a host link and a host memory",
           "hardware '{hardware_name}' names no host_link or host_memory, so nothing can be offloaded "
           "({offloaded_size} per device would be)"),
    Reason(9, "no_chip_layout", "does not fit on any layout of chips",
           "model '{model_name}' does not fit on any layout of '{hardware_name}' chips of {capacity_size}"),
    Reason(10, "device_memory", "does not fit in device memory",
           "does not fit in device memory: needs {memory_size} per device (weights {weights_size}, KV cache {kv_size}, "
           "activations {activations_size}) and {offloaded_size} of it on the host tier, but {hardware_name} has "
           "{capacity_size}, less {reserve_size} its serving engine keeps back"),
    Reason(11, "host_memory", "does not fit in device and host memory",
           "does not fit in host memory: the host part, {offloaded_size} per device over {devices} devices, exceeds the host memory of "
           "{hardware_name}"),
    Reason(13, "serving", "continuous batching is not modelled for this layout",
           "continuous batching is modelled for tensor, pipeline and expert (attention data-parallel) layouts "
           "without offload or a CPU layer split, and this point on '{hardware_name}' is laid out otherwise "
           "(offload or CPU layers): give offload none, cpu_layers 0 (or serving: static)"),
    Reason(14, "saturated", "the request rate exceeds what the design serves",
           "the request rate {request_rate} requests/s exceeds what the design serves; its queue grows "
           "without bound"),
    Reason(15, "slo", "no request rate meets the SLOs",
           "no request rate meets the SLOs (slo_ttft {slo_ttft} s, slo_tpot {slo_tpot} s at percentile "
           "{slo_percentile}): even a trickle of requests misses them"),
    Reason(16, "power", "needs more power than its TDP",
           "a device of '{hardware_name}' would draw more than its TDP (tdp_w) in some phase of the run "
           "(power_demand_w) even at its lowest clock (configs/power.yaml dvfs); no clock holds it within its power limit"),
)
#: template fields holding a footprint metric of the point, written as a size ('80 GiB', by
#: ``basis.units.bytes_text``): field -> metric
SIZE_FIELDS = {"memory_size": "memory_bytes", "weights_size": "weights_bytes", "kv_size": "kv_cache_bytes",
               "activations_size": "activation_bytes", "capacity_size": "capacity_bytes",
               "offloaded_size": "offloaded_bytes", "reserve_size": "engine_reserve_bytes"}
CODE = {r.key: r.code for r in REASONS if r.key}
#: codes that say "the footprint does not fit" (as opposed to "this cannot run at all")
MEMORY_CODES = (CODE["device_memory"], CODE["host_memory"], CODE["no_chip_layout"])
#: the first code of a study's constraints (constraint k has code CONSTRAINT_BASE + k)
CONSTRAINT_BASE = 32
#: the key of every built-in code, indexed by code ('' for codes not in use)
KEYS = tuple(next((r.key for r in REASONS if r.code == c), "") for c in range(CONSTRAINT_BASE))
_RANK = {r.code: i for i, r in enumerate(REASONS)}


def rank(code: int) -> int:
    """Where the check ``code`` stands when a point fails several: the first in REASONS first,
    then a study's constraints in their order."""
    return _RANK.get(code, code)


def constraint_key(metric: str, sense: str, limit: float) -> str:
    """The key of a constraint: 'tpot_s > 0.05' for {tpot_s: {max: 0.05}} (what violates it)."""
    return f"{metric} {'<' if sense == 'min' else '>'} {limit:g}"


def describe(key: str, point: dict | None = None, detail: str | None = None) -> str:
    """The text of a reason key: its short label, or with ``point`` (the point's parameters,
    layout and footprint) the full sentence; ``detail`` (the words of the check that
    failed) replaces both."""
    if not key:
        return ""
    if detail:
        return detail
    r = next((r for r in REASONS if r.key == key), None)
    if r is None:                       # a constraint key is its own text
        return key
    if point is None or not r.text:
        return r.label
    try:
        return r.text.format(**point)
    except (KeyError, IndexError, ValueError):
        return r.label
