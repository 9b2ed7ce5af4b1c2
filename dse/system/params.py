"""The columns of a design point: every hardware and workload parameter ``evaluate`` reads.

A design point is one entry of each column. Hardware columns start from the base preset
named in ``hardware`` (a preset name, a preset YAML path, or a ``Device``) and override
its figures; workload columns describe what runs on it. A column left out takes its
default (``DEFAULTS``); ``tp``, ``pp`` and ``devices`` left out mean "not given": the
parallel layout is then derived (``dse.system.layout``). Values are SI units (bytes,
bytes/s, ops/s, seconds, watts, dollars).

``batch`` also takes ``"max"`` (the largest batch that fits). ``flash_attention`` defaults to on
(fused attention, as the serving engines architects deploy run it); left to its default, a point
runs its engine's attention kernel (unfused for llama.cpp and FlexGen), and a point on hardware
without an on-chip buffer (no ``onchip_buffer_bytes``: Gaudi 2 and 3, GDDR6-AiM, whose presets cite
none) runs unfused attention instead of being infeasible (``Evaluation.point`` says which ran); given explicitly as true, such a point is infeasible (reason ``onchip_buffer``). ``offload`` takes ``none``,
``greedy`` or explicit fractions such as ``weights=0.5,kv=0.2``.
"""
from __future__ import annotations

import numpy as np

from basis.errors import MAX_FIGURE
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
    "static_power_w": float,
    # the accelerator template (``hwmodels.template.TEMPLATE_COLUMNS``): vary the microarchitecture
    # of a preset that has one (a100-80gb, h100-sxm)
    "cores": int,
    "clock_hz": float,
    "l2_bytes": float,
    "memory_stacks": int,
    "memory_type": str,
    "process_node": str,
    "power_limit_w": float,
}
#: the cost of serving (``dse.core.economics``): electricity price ($/kWh), the years a system's
#: price is spread over, and the share of the time it serves; left out, the cited defaults of
#: ``configs/economics.yaml``
COST_PARAMS = {
    "electricity_usd_per_kwh": float,
    "amortization_years": float,
    "utilization": float,
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
    "max_context": int,
    "serving": str,
    "concurrency": int,
    "request_rate": float,
    "kv_block": int,
    "prefill_chunk": int,
    "max_running": int,
    "lengths": str,
    "prefix_hit": float,
    "slo_ttft": float,
    "slo_tpot": float,
    "slo_percentile": float,
    "disaggregate": str,
    "target_rate": float,
    "engine": str,
    "sparsity": str,
    "weight_density": float,
    "activation_sparsity": float,
    "layers_used": float,
    "kv_budget": int,
    "prune": str,
    "spec_draft": str,
    "spec_tokens": int,
    "spec_acceptance": float,
    "weights_edge": str,
}
PARAMS = {**HARDWARE_PARAMS, **WORKLOAD_PARAMS, **COST_PARAMS}
#: numeric parameters that may be 0 (all others must be positive): layers on the CPU, a
#: latency, an on-chip buffer, host memory (0: none to offload to), the context (0: the model's
#: ``max_position_embeddings``)
ZERO_ALLOWED = ("cpu_layers", "link_latency", "onchip_buffer_bytes", "host_memory_capacity", "max_context",
                "concurrency", "request_rate", "prefill_chunk", "prefix_hit", "slo_ttft", "slo_tpot", "target_rate",
                "kv_budget", "spec_tokens", "spec_acceptance", "static_power_w")
#: numeric parameters with an upper bound they must stay below (a share, a percentile)
BELOW = {"prefix_hit": 1.0, "slo_percentile": 100.0}
#: numeric parameters that are fractions: at most 1
AT_MOST_ONE = ("weight_density", "activation_sparsity", "layers_used", "spec_acceptance", "utilization")
#: the largest count (batch, tokens, devices, layers) a design point may ask for
MAX_COUNT = 2**40
#: numeric parameters whose NaN entries mean "not given" at that point (the layout follows
#: from the others; a hardware figure is the base preset's own)
MAY_BE_MISSING = ("devices", "tp", "pp", "cores", "memory_stacks", *(k for k, v in HARDWARE_PARAMS.items() if v is float),
                  *COST_PARAMS)
DEFAULTS = {"batch": 1, "prompt_len": 512, "gen_len": 128, "weights": "fp16", "activations": "fp16", "kv": "fp16",
            "ep": 1, "flash_attention": True, "offload": "none", "overlap": True, "sparse": False, "cpu_layers": 0,
            "max_context": 0, "serving": "static", "concurrency": 0, "request_rate": 0.0, "kv_block": 16,
            "prefill_chunk": 8192, "max_running": 1024, "lengths": "fixed", "prefix_hit": 0.0, "slo_ttft": 0.0,
            "slo_tpot": 0.0, "slo_percentile": 90.0, "disaggregate": "none",
            "target_rate": 0.0, "engine": "default", "sparsity": "none", "weight_density": 1.0,
            "activation_sparsity": 1.0, "layers_used": 1.0, "kv_budget": 0, "prune": "none", "spec_draft": "none",
            "spec_tokens": 0, "spec_acceptance": 0.0, "weights_edge": "none"}
#: the techniques (``dse.system.techniques``, ``workloads.techniques``): ``sparsity`` N:M (``2:4``) stored
#: compressed, computed at the device's 2:4 sparse peak where it has one (``sparse: true`` is 2:4);
#: ``weight_density`` unstructured; ``activation_sparsity`` the fraction of MLP neurons and heads
#: active per token (Deja Vu); ``layers_used`` early exit; ``kv_budget`` tokens of K/V kept per
#: sequence (0: all); ``prune`` a structured-pruned model; ``spec_draft``/``spec_tokens``/
#: ``spec_acceptance`` speculative decoding; ``weights_edge`` the format of the first and last layers' weights.
#: ``engine`` names the serving-engine profile the point runs (``configs/engines.yaml``: vllm, sglang,
#: trt-llm, trt-llm-legacy, tgi, lmdeploy, mlc-llm, llama.cpp, gaudi, jetstream, neuron, ...); its
#: launch, all-reduce and scheduler costs, attention kernel and batching enter the efficiency
#: (``dse.core.engines``). ``default`` is the file's ``default_engine`` (vLLM: CUDA graphs, custom
#: one-shot all-reduce, fused attention, continuous batching).
#: how requests are scheduled: ``static`` (one batch of ``batch`` sequences starts, prefills and
#: decodes together: static-batch benchmarks) or ``continuous`` (in-flight batching under a load:
#: ``concurrency`` requests always in flight, or ``request_rate`` requests/s arriving as a Poisson
#: process; a paged KV cache of ``kv_block``-token blocks, at most ``max_running`` sequences
#: running, prompts cut into chunks that fill a per-iteration budget of ``prefill_chunk`` tokens
#: (0: whole prompts, prefill-first). Request lengths are ``lengths`` (``fixed``, ``lognormal[:sigma=S]``
#: or a CSV trace: ``workloads.lengths``); ``prefix_hit`` is the share of the mean prompt that is a
#: prefix shared by every request and cached (its whole KV blocks held once, not recomputed);
#: ``slo_ttft`` and ``slo_tpot`` (seconds, 0: none) are SLOs at the ``slo_percentile``-th percentile,
#: for ``goodput``; ``disaggregate`` (``P:D``) puts prompts on P devices and decoding on D others, the
#: KV cache moved over the link between them (instances of ``tp`` devices each; ``tp`` left out: the
#: largest that divides both). ``target_rate`` (requests/s, 0: none) is what a whole service must
#: carry: it takes ceil(target_rate / goodput) engines like this one (``replicas``; needs an SLO).
#: Giving a load, a length distribution, a prefix, an SLO or pools means continuous. Defaults are vLLM's for its
#: OpenAI server on a GPU of 70 GiB or more: block_size 16, max_num_batched_tokens 8192,
#: max_num_seqs 1024, chunked prefill on (vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults;
#: smaller GPUs get 2048 and 256 there).
SERVING_MODES = ("static", "continuous")
#: the value of ``batch`` that asks for the largest batch that fits
BATCH_MAX = "max"

def out_of_range(name: str, values: np.ndarray) -> tuple[np.ndarray, str]:
    """(True where an entry of numeric parameter ``name`` is not allowed, a phrase saying
    what is): finite, an integer for counts, positive (or >= 0 for ``ZERO_ALLOWED``), at
    most ``MAX_COUNT`` / ``MAX_FIGURE``. NaN entries are flagged; callers that accept
    "not given" mask them out."""
    a = np.asarray(values, dtype=float)
    zero = name in ZERO_ALLOWED
    with np.errstate(invalid="ignore"):
        if PARAMS[name] is int:
            bad = ~np.isfinite(a) | (a != np.round(a)) | (a < (0 if zero else 1)) | (a > MAX_COUNT)
            return bad, f"{'a non-negative' if zero else 'a positive'} integer up to {MAX_COUNT:,}"
        bad = ~np.isfinite(a) | ((a < 0) if zero else (a <= 0)) | (a > MAX_FIGURE)
        if name in BELOW:
            bad |= a >= BELOW[name]
            return bad, f"a number {'>= 0' if zero else '> 0'} and below {BELOW[name]:g}"
        if name in AT_MOST_ONE:
            bad |= a > 1.0
            return bad, f"a fraction {'>= 0' if zero else '> 0'} and at most 1"
    return bad, f"a finite number {'>= 0' if zero else '> 0'} up to {MAX_FIGURE:g}"


__all__ = ["out_of_range", "MAX_COUNT", "MAX_FIGURE", "PARAMS", "HARDWARE_PARAMS", "WORKLOAD_PARAMS", "COST_PARAMS", "DEFAULTS",
           "ZERO_ALLOWED", "BELOW", "AT_MOST_ONE", "BATCH_MAX", "MAY_BE_MISSING", "SERVING_MODES"]
