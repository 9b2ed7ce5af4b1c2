"""A steady-state model of an in-flight-batching engine under load, vectorized over design
points: the running batch under a paged KV cache, chunked prefill mixed into decode
iterations, queueing past saturation (closed loop at a concurrency, or open loop at a
request rate).

The engine is the one ``dse.core.simulator`` runs request by request (its reference): each
iteration decodes one token for every running sequence past its prompt and fills the rest
of a token budget with prompt chunks; requests are admitted first come, first served while
their KV blocks fit.

In steady state with ``b`` sequences running, of which ``b_p`` are prefilling:

- a prompt of P tokens takes ``n_p = ceil(P / (budget - decoders))`` iterations (Sarathi-
  Serve's chunks), and ``λ`` requests finish per iteration, so ``b_p = λ n_p`` and the
  share of iterations that carry a prompt chunk is ``f = min(b_p, 1)``;
- a sequence decodes for G - 1 iterations, so ``λ = (b - b_p) / (G - 1)`` (Little's law);
- an iteration carrying a chunk of ``P / n_p`` tokens lasts ``T_h``, one without ``T_d``
  (both priced by the roofline, ``iteration_time``); the mean is ``T = f T_h + (1 - f) T_d``;
- TPOT = T, TTFT = n_p T_h plus the wait for admission (closed loop: (N - b) / X by
  Little's law; open loop: half an iteration to the next boundary), and the request
  throughput X = λ / T.

The running batch is the concurrency (closed loop), or the b whose throughput is the
request rate (open loop, found by bisection), capped by ``max_running`` and by the KV cache:
``kv_blocks`` over the blocks a running sequence holds on average (its prompt and half its
output, plus half a block of fragmentation). Past that cap requests queue (they are never
spilled to host memory) and an open loop past the cap's throughput is saturated (TTFT
infinite).

Sources (facts): Yu et al., Orca (OSDI 2022); Kwon et al., PagedAttention (SOSP 2023);
Agrawal et al., Sarathi-Serve (OSDI 2024); Little's law.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

#: (decode tokens, decode keys, prompt tokens, prompt keys, prompt sequences), arrays [P] -> seconds [P]
IterationTime = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray], np.ndarray]

#: bisection steps for the open loop's running batch (relative precision 2^-40)
_BISECT = 40


@dataclass(frozen=True)
class Load:
    """The engine and its load per design point (arrays [P]).

    prompt_len, gen_len: tokens per request; kv_blocks: blocks the KV cache holds;
    kv_block: tokens per block; token_budget: tokens one iteration processes;
    max_running: sequences running at once; concurrency: requests in flight (closed loop;
    NaN for an open loop); request_rate: requests per second (open loop; NaN for closed);
    chunked: prompts cut into chunks beside the decoders (else prefill-first: an iteration
    of whole prompts, no decoding, whenever prompts wait)."""

    prompt_len: np.ndarray
    gen_len: np.ndarray
    kv_blocks: np.ndarray
    kv_block: np.ndarray
    token_budget: np.ndarray
    max_running: np.ndarray
    concurrency: np.ndarray
    request_rate: np.ndarray
    chunked: np.ndarray


def running_cap(load: Load) -> np.ndarray:
    """Sequences the engine can run at once: max_running, or fewer where the KV cache
    holds fewer (each holds its prompt, half its output and half a block on average)."""
    p, g, blk = load.prompt_len, load.gen_len, load.kv_block
    per_seq = (p + g / 2.0) / blk + 0.5
    return np.minimum(load.max_running, np.floor(load.kv_blocks / per_seq))


def _keys(p, g):
    """Keys a decoding sequence holds on average over its generation: the prompt and half
    the output fed back."""
    return p + np.maximum(g - 2, 0) / 2.0


def _closed(b, load: Load, iteration_time: IterationTime) -> dict[str, np.ndarray]:
    """Closed loop with ``b`` sequences running, all of the same lengths: they move in
    waves. Requests that finish together come back together and are prefilled together,
    as many to an iteration as its token budget has room for beside the decoders (chunked),
    so ``W`` waves of b / W share a cycle of ``n_p`` prompt iterations and G - 1 decode
    iterations per request (Little's law: X = b / cycle). Prefill-first keeps them one
    cohort (see below)."""
    p, g, budget = load.prompt_len, load.gen_len, load.token_budget
    steps = np.maximum(g - 1, 0)
    # the first arrivals split into waves by the budget, and keep that split
    waves = np.clip(np.ceil(b * p / budget), 1, np.maximum(b, 1))
    size = b / waves                                         # requests per wave
    room = np.maximum(budget - (b - size), 1.0)              # prompt tokens beside the other waves' decoders
    ctx = _keys(p, g)
    d_h = b - size
    # a wave's prompts fill one iteration; what does not fit goes on in h2 more, evenly
    c1 = np.minimum(size * p, room)
    rest = size * p - c1
    h2 = np.ceil(rest / room)
    c2 = np.where(h2 > 0, rest / np.maximum(h2, 1), 0.0)
    first = np.minimum(size, np.floor(room / p))            # prompts done in the first iteration
    late = (size - first) / size                             # share of the wave that waits for the rest
    t1 = iteration_time(d_h, d_h * ctx, c1, c1 * (p - 1) / 2.0, first)
    t2 = iteration_time(d_h, d_h * ctx, c2, c2 * (p - 1) / 2.0, (size - first) / np.maximum(h2, 1))
    zero = np.zeros_like(b)
    t_d = iteration_time(b, b * ctx, zero, zero, zero)
    ttft = t1 + late * h2 * t2
    n_p = 1.0 + late * h2                                    # iterations to the first token, mean
    hybrid = waves * (1.0 + h2)
    cycle = np.maximum(steps + n_p, hybrid)                  # iterations per cycle
    t_cycle = waves * (t1 + h2 * t2) + (cycle - hybrid) * t_d
    tpot = np.where(steps > 0, (t_cycle - ttft) / np.maximum(steps, 1), t_d)
    # prefill-first: while prompts wait nothing decodes, so the requests stay one cohort, as a
    # static batch: its prompts in W iterations of as many as the budget holds, then G - 1
    # decode iterations of all of them (the i-th iteration's prompts wait for i of them)
    per_wave = np.clip(np.floor(budget / p), 1, np.maximum(b, 1))
    waves_pf = np.ceil(b / per_wave)
    size_pf = b / waves_pf
    t_p = iteration_time(zero, zero, size_pf * p, size_pf * p * (p - 1) / 2.0, size_pf)
    ch = load.chunked
    t_cycle = np.where(ch, t_cycle, waves_pf * t_p + steps * t_d)
    cycle = np.where(ch, cycle, waves_pf + steps)
    # the i-th wave's first token comes W - i prompt iterations before the cohort decodes
    tpot = np.where(ch, tpot, t_d + t_p * (waves_pf - 1) / (2.0 * np.maximum(steps, 1)))
    ttft = np.where(ch, ttft, t_p * (waves_pf + 1) / 2.0)
    return {"x": b / t_cycle, "ttft": ttft, "tpot": tpot, "T": t_cycle / cycle}


def _poisson(mean, kmax: int) -> np.ndarray:
    """P(k) for k = 0..kmax of a Poisson count of each ``mean`` ([P]), [P, kmax + 1]; the
    tail beyond kmax folded into kmax."""
    k = np.arange(kmax + 1)
    with np.errstate(divide="ignore"):
        logp = k * np.log(np.maximum(mean, 1e-300))[:, None] - mean[:, None] - np.cumsum(np.log(np.maximum(k, 1)))
    pmf = np.exp(logp)
    pmf[:, -1] += np.maximum(1.0 - pmf.sum(axis=1), 0.0)
    return pmf


def _open(rate, load: Load, iteration_time: IterationTime, cap) -> dict[str, np.ndarray]:
    """Open loop at ``rate`` requests/s (Poisson arrivals). An iteration prefills the
    prompts that arrived during the one before (a Poisson number, mean rate x T) beside the
    sequences decoding; a request waits the rest of the iteration it arrives in, takes its
    prompt's iterations, then G - 1 decode iterations. Solved for the mean iteration T and
    the running batch b = rate x (time from admission to the end) together."""
    p, g, budget = load.prompt_len, load.gen_len, load.token_budget
    steps = np.maximum(g - 1, 0)
    ctx = _keys(p, g)
    n_p = np.where(load.chunked, np.maximum(np.ceil(p / np.maximum(budget - 1, 1)), 1.0), 1.0)
    zero = np.zeros_like(rate)
    t = iteration_time(np.ones_like(rate), ctx, zero, zero, zero)
    b = np.ones_like(rate)
    for _ in range(40):
        arrivals = rate * t                                  # prompts started per iteration, mean
        kmax = int(np.ceil(np.max(arrivals + 6 * np.sqrt(arrivals) + 6)))
        pmf = _poisson(arrivals, kmax)
        dec = np.maximum(b - arrivals * n_p, 0.0)
        times, prompts_only = [], []
        t_dec = iteration_time(np.maximum(b, 1e-9), np.maximum(b, 1e-9) * ctx, zero, zero, zero)
        for k in range(kmax + 2):                            # k prompts in one iteration
            c = np.minimum(k * p / n_p, np.maximum(budget - dec, 1.0))
            times.append(iteration_time(dec, dec * ctx, c, c * (p - 1) / 2.0, k / n_p))
            # prefill-first: k whole prompts in an iteration of their own, then a decode iteration
            if not load.chunked.all():
                prompts_only.append(iteration_time(zero, zero, k * p + zero, k * p * (p - 1) / 2.0 + zero,
                                                   k + zero))
        hybrid = np.stack(times, axis=1)                     # [P, kmax + 2]
        alone = np.stack(prompts_only, axis=1) if prompts_only else hybrid
        ch = load.chunked[:, None]
        times = np.where(ch, hybrid, np.where(np.arange(kmax + 2) > 0, alone, 0.0) + t_dec[:, None])
        first = np.where(ch, hybrid, alone)                  # until one's own prompt's iteration ends
        mean_t = (pmf * times[:, :-1]).sum(axis=1)
        mean_t2 = (pmf * times[:, :-1] ** 2).sum(axis=1)
        own = (pmf * first[:, 1:]).sum(axis=1)              # an iteration with one's own prompt in it
        new_b = np.minimum(rate * (n_p * own + steps * mean_t), cap)
        done = np.allclose(mean_t, t, rtol=1e-7) and np.allclose(new_b, b, rtol=1e-7)
        t, b = 0.5 * (t + mean_t), 0.5 * (b + new_b)
        if done:
            break
    residual = mean_t2 / (2.0 * mean_t)                      # the rest of the iteration one arrives in
    return {"x": rate, "ttft": residual + n_p * own, "tpot": mean_t, "T": mean_t, "b": b}


def steady_state(load: Load, iteration_time: IterationTime) -> dict[str, np.ndarray]:
    """Serving metrics of every design point (arrays [P], SI units): ttft_s, tpot_s,
    e2e_latency_s (means), queue_s (mean wait before admission), requests_per_s,
    output_tokens_per_s, total_tokens_per_s, running_batch (mean sequences running),
    kv_utilization (share of KV blocks held), saturated (bool: the open loop's rate is
    past what the engine serves; its queue and TTFT grow without bound)."""
    p, g = load.prompt_len.astype(float), load.gen_len.astype(float)
    cap = np.maximum(running_cap(load), 1.0)         # a cache holding no request is refused by the caller
    closed = np.isfinite(load.concurrency)
    rate = np.nan_to_num(load.request_rate, nan=0.0)
    conc = np.nan_to_num(load.concurrency, nan=1.0)
    b_closed = np.minimum(conc, cap)
    c = _closed(np.where(closed, b_closed, cap), load, iteration_time)   # closed loop; open: its ceiling
    x_max = c["x"]
    saturated = ~closed & (rate >= x_max)
    if (~closed & ~saturated).any():               # the open loop's fixed point, where there is one
        o = _open(np.where(closed | saturated, 1e-9, rate), load, iteration_time, cap)
    else:
        o = {k: np.zeros_like(cap) for k in ("ttft", "tpot", "b")}
    queue = np.where(closed, np.maximum(conc - b_closed, 0.0) / c["x"], 0.0)
    x = np.where(closed, c["x"], np.where(saturated, x_max, rate))
    ttft = np.where(closed, c["ttft"] + queue, np.where(saturated, np.inf, o["ttft"]))
    tpot = np.where(closed, c["tpot"], np.where(saturated, c["tpot"], o["tpot"]))
    b = np.where(closed, b_closed, np.where(saturated, cap, o["b"]))
    queue = np.where(saturated, np.inf, queue)
    blocks = b * ((p + g / 2.0) / load.kv_block + 0.5)
    return {
        "ttft_s": ttft,
        "tpot_s": tpot,
        "e2e_latency_s": ttft + np.maximum(g - 1, 0) * tpot,
        "queue_s": queue,
        "requests_per_s": x,
        "output_tokens_per_s": x * g,
        "total_tokens_per_s": x * (g + p),
        "running_batch": b,
        "kv_utilization": np.minimum(blocks / np.maximum(load.kv_blocks, 1.0), 1.0),
        "saturated": saturated,
    }
