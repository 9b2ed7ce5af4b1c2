"""Serving metrics of a prefill plus a generation, from step times (seconds)."""
from __future__ import annotations

import numpy as np


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
    batching): the run lasts prefill + decode - overlap x min(prefill, decode). It
    shortens the run (throughput, end-to-end latency) but not TTFT or TPOT; 0 (static
    batches) by default.

    A static batch also reports requests_per_s and total_tokens_per_s over the run, no
    queueing and ``batch`` running (no KV utilization: its cache is sized to the batch).
    """
    batch = np.asarray(batch, dtype=float)
    gen = np.asarray(gen_len, dtype=float)
    steps = np.maximum(gen - 1, 1)
    tpot = decode_total_s / steps
    dec = np.where(gen > 1, decode_total_s, 0.0)
    prefill_s = np.asarray(prefill_s, dtype=float) + request_overhead_s
    e2e = prefill_s + dec - overlap * np.minimum(prefill_s, dec)
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
        "running_batch": np.broadcast_to(batch, n).astype(float),
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
    """Power (W) and list price ($) of a system of ``devices`` devices (NaN where unknown)."""
    d = np.asarray(devices, dtype=float)
    return {"power_w": d * np.asarray(tdp_w, dtype=float), "cost_usd": d * np.asarray(price_usd, dtype=float)}
