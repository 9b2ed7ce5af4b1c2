"""Serving metrics of a prefill plus a generation, from step times (seconds); energy, power and
the cost of ownership of a system and what its tokens cost."""
from __future__ import annotations

import functools

import numpy as np


def steps_after_first(gen_len):
    """Decode steps of a generation of ``gen_len`` tokens after the first (the prefill's): gen_len - 1,
    and at least 1 (with gen_len = 1 the step that would come next, so a TPOT exists). An array or a
    number, as ``gen_len``."""
    return np.maximum(gen_len - 1, 1)


def static_overlap(overlap, batch) -> np.ndarray:
    """The share of the shorter of prefill and decode a static batch of ``batch`` requests can hide
    under the other, of an engine whose in-flight scheduler hides ``overlap`` (unitless, in [0, 1]):
    a request's own decode cannot start before its prefill ends, so of ``batch`` requests at most
    ``batch - 1`` decode under another's prefill: ``overlap x (batch - 1) / batch`` (0 for one request)."""
    batch = np.asarray(batch, dtype=float)
    return np.asarray(overlap, dtype=float) * np.maximum(batch - 1.0, 0.0) / np.maximum(batch, 1.0)


def serving_metrics(prefill_s, decode_total_s, batch, prompt_len, gen_len, devices, *,
                    overlap=0.0, request_overhead_s=0.0) -> dict[str, np.ndarray]:
    """Return TTFT, TPOT, end-to-end latency and throughputs (arrays over points).

    The prefill produces the first output token (TTFT = prefill time); the other
    gen_len - 1 tokens come from decode steps whose total time is ``decode_total_s``;
    TPOT is their mean (with gen_len = 1, ``decode_total_s`` is one step's time and
    TPOT is that of the step that would come next). Throughput of a static batch
    counts the whole run, prefill included.

    ``request_overhead_s`` (the efficiency model's fixed cost of one request: scheduling,
    tokenization, sampling set-up) adds to TTFT and to the end-to-end latency.
    ``overlap`` in [0, 1] is the share of the shorter of prefill and decode hidden under
    the other when a scheduler mixes new prefills into running decode batches (in-flight
    batching): the run lasts prefill + decode - h x min(prefill, decode), with h the part of
    ``overlap`` a batch of ``batch`` can hide (``static_overlap``: none for one request). It
    shortens the run (throughput, end-to-end latency) but not TTFT or TPOT; 0 (static
    batches) by default.

    A static batch also reports requests_per_s and total_tokens_per_s over the run, no
    queueing and ``batch`` running (no KV utilization: its cache is sized to the batch).
    """
    batch = np.asarray(batch, dtype=float)
    gen = np.asarray(gen_len, dtype=float)
    steps = steps_after_first(gen)
    tpot = decode_total_s / steps
    dec = np.where(gen > 1, decode_total_s, 0.0)
    prefill_s = np.asarray(prefill_s, dtype=float) + request_overhead_s
    e2e = prefill_s + dec - static_overlap(overlap, batch) * np.minimum(prefill_s, dec)
    out_tps = batch * gen / e2e
    n = np.broadcast(out_tps, batch).shape
    return {
        "ttft_s": np.asarray(prefill_s, dtype=float),
        "tpot_s": tpot,
        "e2e_latency_s": e2e,
        **rates_per_user_and_device(out_tps, tpot, devices),
        "prefill_tokens_per_s": batch * np.asarray(prompt_len, dtype=float) / prefill_s,
        "requests_per_s": batch / e2e,
        "total_tokens_per_s": batch * (gen + np.asarray(prompt_len, dtype=float)) / e2e,
        "queue_s": np.zeros(n),
        "running_batch": np.full(n, batch, dtype=float),
    }


def rates_per_user_and_device(out_tps, tpot_s, devices) -> dict[str, np.ndarray]:
    """Output tokens/s of the system, of one user (one token per TPOT) and per device."""
    out_tps = np.asarray(out_tps, dtype=float)
    return {"output_tokens_per_s": out_tps, "output_tokens_per_s_per_user": 1.0 / np.asarray(tpot_s, dtype=float),
            "output_tokens_per_s_per_device": out_tps / np.asarray(devices, dtype=float)}


def pipelined_prefill_s(pass_s, micro_batches, pp):
    """Seconds until the last of ``micro_batches`` micro-batches leaves a ``pp``-stage
    pipeline whose whole-model pass takes ``pass_s``: (m + pp - 1) stage times of pass_s / pp."""
    return np.asarray(pass_s, dtype=float) * (np.asarray(micro_batches, dtype=float) + pp - 1) / pp


def system_figures(devices, tdp_w, price_usd) -> dict[str, np.ndarray]:
    """Power limit (the devices' TDPs, W) and price ($) of a system of ``devices`` devices (NaN
    where unknown)."""
    d = np.asarray(devices, dtype=float)
    return {"system_tdp_w": d * np.asarray(tdp_w, dtype=float), "cost_usd": d * np.asarray(price_usd, dtype=float)}


def energy_figures(dynamic_j, seconds, tokens, devices, static_w) -> dict[str, np.ndarray]:
    """Energy of a run (or of one second of a steady state) and what follows from it, arrays:
    ``energy_j`` = dynamic energy (J) + ``static_w`` (W per device) x ``devices`` x ``seconds``,
    ``energy_per_token_j`` over ``tokens`` output tokens, ``power_w`` the average power of the
    system (W) and ``tokens_per_joule``. NaN wherever an input is unknown."""
    with np.errstate(divide="ignore", invalid="ignore"):
        energy = np.asarray(dynamic_j, dtype=float) + np.asarray(static_w, dtype=float) * devices * seconds
        return {"energy_j": energy, "energy_per_token_j": energy / tokens, "power_w": energy / seconds,
                "tokens_per_joule": tokens / energy}


def power_demand_w(phases, devices, static_w) -> np.ndarray:
    """Power one device draws in the most demanding phase of the run, W, [P]: the largest of
    dynamic J / (devices x seconds) over ``phases`` ((dynamic J, seconds) pairs), plus the static
    power (taken as 0 where unknown, so the figure is then a lower bound)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        dyn = functools.reduce(np.maximum, [np.where(np.asarray(s, dtype=float) > 0,
                                                     np.asarray(e, dtype=float) / (devices * s), 0.0)
                                            for e, s in phases])
    static = np.asarray(static_w, dtype=float)
    return dyn + np.where(np.isnan(static), 0.0, static)


SECONDS_PER_YEAR = 365.25 * 86400.0
SECONDS_PER_HOUR = 3600.0
JOULES_PER_KWH = 3.6e6


def capital_usd(price_usd, host_cost_share, network_cost_share) -> np.ndarray:
    """Capital of a system whose accelerators cost ``price_usd`` ($, all of them), [P]: with its
    host (CPUs, memory, board, chassis: ``host_cost_share`` $ per $ of accelerator) and its share of
    the network (``network_cost_share`` of the whole hardware cost): price x (1 + host) / (1 - network),
    in $. NaN where the price is unknown."""
    return (np.asarray(price_usd, dtype=float) * (1.0 + np.asarray(host_cost_share, dtype=float))
            / (1.0 - np.asarray(network_cost_share, dtype=float)))


def tco_usd_per_s(capital, power_w, idle_w, electricity_usd_per_kwh, amortization_years, utilization,
                  pue) -> np.ndarray:
    """Total cost of ownership of a system per second of its life, $/s, [P]: its ``capital`` ($)
    spread over ``amortization_years``, plus electricity at ``electricity_usd_per_kwh`` for the
    facility's energy (the IT energy x ``pue``): ``power_w`` while it serves (a share ``utilization``
    of the time) and ``idle_w`` (its static power; 0 where unknown) the rest. NaN where the capital
    or the power is unknown."""
    u = np.asarray(utilization, dtype=float)
    idle = np.nan_to_num(np.asarray(idle_w, dtype=float), nan=0.0)
    watts = (u * np.asarray(power_w, dtype=float) + (1.0 - u) * idle) * np.asarray(pue, dtype=float)
    return (np.asarray(capital, dtype=float) / (np.asarray(amortization_years, dtype=float) * SECONDS_PER_YEAR)
            + watts / JOULES_PER_KWH * np.asarray(electricity_usd_per_kwh, dtype=float))


def token_costs(tco_per_s, utilization, input_tokens_per_s, output_tokens_per_s, prefill_share) -> dict[str, np.ndarray]:
    """What the tokens a system serves cost, [P], from its ``tco_per_s`` ($/s of its life), the share
    ``utilization`` of that life it serves at ``input_tokens_per_s`` (prompt tokens processed) and
    ``output_tokens_per_s``, and ``prefill_share``, the share of its machine time the prefill takes:
    ``cost_per_million_tokens_usd`` ($ per million output tokens, the whole cost), the same cost split
    as providers price tokens (``cost_per_mtok_input_usd``: the prefill's share of the machine time
    over the prompt tokens; ``cost_per_mtok_output_usd``: the decode's share over the output tokens,
    so input $ + output $ = the whole), ``tokens_per_dollar`` (output tokens per $ of the whole cost)
    and ``tco_usd_per_hour`` ($ per hour of the system's life). NaN where an input is unknown."""
    per_s = np.asarray(tco_per_s, dtype=float)
    busy = np.asarray(utilization, dtype=float)
    share = np.asarray(prefill_share, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        whole = 1e6 * per_s / (np.asarray(output_tokens_per_s, dtype=float) * busy)
        return {"cost_per_million_tokens_usd": whole,
                "cost_per_mtok_input_usd": 1e6 * per_s * share / (np.asarray(input_tokens_per_s, dtype=float) * busy),
                "cost_per_mtok_output_usd": whole * (1.0 - share),
                "tokens_per_dollar": 1e6 / whole, "tco_usd_per_hour": per_s * SECONDS_PER_HOUR}
