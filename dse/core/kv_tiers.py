"""A second tier for the KV cache under load (host DRAM, CXL, NVMe): what it holds and what moving
KV to and from it costs, vectorized over design points; used by the steady-state serving model
(``dse.core.serving``) and, request by request, by the simulator (``dse.core.simulator``).

- **Prefix reuse as an outcome.** Prompts start with one of ``prefix_count`` shared prefixes
  (system prompts, documents) of ``prefix_tokens`` each, drawn independently with a Zipf law of
  exponent ``prefix_zipf`` (the independent reference model). The device keeps one prefix's
  full blocks (as with one shared prefix); evicted prefixes go to the tier, which holds as many
  as its capacity allows, evicting the least recently used. Device and tier together are one LRU
  stack (an evicted prefix is demoted, a tier hit promoted): a request hits on the device when
  its prefix is among the ``device`` most recently used, in the tier when it is among the next
  ``tier`` (the stack property of LRU, Mattson et al., IBM Systems Journal 9(2), 1970). The share
  of requests hitting an LRU cache of C items is Che's approximation (Che, Tung and Wang,
  "Hierarchical Web caching systems: modeling, design and experimental results", IEEE JSAC
  20(7), 2002; Fricker, Robert and Roberts, "A versatile and accurate approximation for LRU
  cache performance", ITC 24, 2012): item i is resident with probability 1 - exp(-q_i t_C),
  t_C the root of sum_i (1 - exp(-q_i t_C)) = C; the hit rate is sum_i q_i (1 - exp(-q_i t_C)).
  A device hit computes past the prefix (as today), a tier hit reloads its KV at the tier's
  bandwidth (LMCache-style) instead of recomputing it, a miss computes the whole prompt.
- **Preemption.** When the running set's KV outgrows the device, the scheduler evicts the latest
  admitted sequence (vLLM): ``recompute`` drops its KV and prefills its context again;
  ``swap`` writes its KV to the tier and reads it back when it is readmitted (2 x its KV bytes
  over the tier's bandwidth, vLLM's swap space). Expected preemptions per request: the free
  blocks as a random walk between completions (``preemptions_per_request``; this model's
  estimate, the simulator its reference).

Units: bytes, seconds, tokens, blocks. Returns arrays [P] unless said.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np

#: the most distinct prefixes a point's population may hold (Che's sum is [P, N])
MAX_PREFIXES = 100_000
#: bisection steps of Che's characteristic time (relative precision 2^-60 in log space)
_CHE_STEPS = 60


@dataclass(frozen=True)
class TierLoad:
    """The KV tier of each design point (arrays [P]).

    token_bytes: KV bytes a token of context takes on one device; bandwidth: bytes/s one device
    moves to or from the tier (its achieved figure; 0: no tier); capacity: the tier's bytes
    for one device's KV (0: no tier); prefix_count: distinct shared prefixes (1: every prompt the
    same, today's prefix caching); prefix_zipf: the Zipf exponent of their popularity (0:
    uniform); swap: bool, swap preemption (else recompute); priced: bool, the steady state prices
    preemption (else leaves it out, as before tiers); device_hit, tier_hit: the shares of requests
    finding their prefix on the device and in the tier (``prefix_hits``; a request whose prefix is
    not the device's holds its own copy of it while it runs)."""

    token_bytes: np.ndarray
    bandwidth: np.ndarray
    capacity: np.ndarray
    prefix_count: np.ndarray
    prefix_zipf: np.ndarray
    swap: np.ndarray
    priced: np.ndarray
    device_hit: np.ndarray | None = None
    tier_hit: np.ndarray | None = None

    def take(self, idx) -> "TierLoad":
        """The design points ``idx``."""
        return replace(self, **{f.name: np.asarray(getattr(self, f.name))[idx] for f in fields(self)
                                if getattr(self, f.name) is not None})


def zipf_popularity(count: int, exponent: float) -> np.ndarray:
    """Request shares of ``count`` items whose popularity falls as rank^-``exponent``, [count],
    summing to 1 (exponent 0: uniform)."""
    q = np.arange(1, int(count) + 1, dtype=float) ** -float(exponent)
    return q / q.sum()


def _popularity(count, exponent) -> np.ndarray:
    """Zipf shares of every point, [P, N] (N: the largest count; zero past a point's own)."""
    count = np.asarray(count, dtype=float)
    n = int(max(np.max(count, initial=1.0), 1.0))
    rank = np.arange(1, n + 1, dtype=float)[None, :]
    q = np.where(rank <= count[:, None], rank ** -np.asarray(exponent, dtype=float)[:, None], 0.0)
    return q / q.sum(axis=1, keepdims=True)


def che_hit_rate(q: np.ndarray, capacity) -> np.ndarray:
    """The share of requests that hit an LRU cache of ``capacity`` items ([P]) under independent
    references to items of shares ``q`` ([P, N], rows summing to 1): Che's approximation,
    sum_i q_i (1 - exp(-q_i t)) with t the root of sum_i (1 - exp(-q_i t)) = capacity (found by
    bisection in log t); 1 where the cache holds every item, 0 where it holds none."""
    q = np.atleast_2d(np.asarray(q, dtype=float))
    cap = np.broadcast_to(np.asarray(capacity, dtype=float), (len(q),))
    items = (q > 0).sum(axis=1)
    lo = np.full(len(q), -60.0)
    hi = np.full(len(q), 60.0) + np.log(np.maximum(items, 1.0) / np.maximum(q.max(axis=1, initial=0.0), 1e-300))
    for _ in range(_CHE_STEPS):
        mid = 0.5 * (lo + hi)
        held = -np.expm1(-q * np.exp(mid)[:, None]).sum(axis=1)
        low = held < cap
        lo, hi = np.where(low, mid, lo), np.where(low, hi, mid)
    hit = (q * -np.expm1(-q * np.exp(0.5 * (lo + hi))[:, None])).sum(axis=1)
    return np.where(cap >= items, 1.0, np.where(cap < 1.0, 0.0, hit))


def prefix_blocks(prefix_tokens, kv_block) -> np.ndarray:
    """KV blocks of a shared prefix that are cached (its full blocks only), [P]."""
    return np.floor(np.asarray(prefix_tokens, dtype=float) / np.asarray(kv_block, dtype=float))


def tier_slots(tier: TierLoad, prefix_tokens, kv_block) -> np.ndarray:
    """Prefixes the tier holds, [P]: its capacity over one prefix's cached KV bytes on a device
    (0 without a tier or a prefix)."""
    size = prefix_blocks(prefix_tokens, kv_block) * np.asarray(kv_block, dtype=float) * tier.token_bytes
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(size > 0, np.floor(np.nan_to_num(tier.capacity / size, posinf=0.0)), 0.0)


def prefix_hits(tier: TierLoad, prefix_tokens, kv_block) -> tuple[np.ndarray, np.ndarray]:
    """(share of requests whose prefix is on the device, share whose prefix is in the tier), [P]:
    Che's approximation of the LRU stack of one device slot and ``tier_slots`` tier slots under
    the Zipf popularity of ``prefix_count`` prefixes (one prefix: every request hits the device)."""
    q = _popularity(tier.prefix_count, tier.prefix_zipf)
    device = che_hit_rate(q, np.ones(len(q)))
    both = che_hit_rate(q, 1.0 + tier_slots(tier, prefix_tokens, kv_block))
    return device, np.maximum(both - device, 0.0)


def with_hits(tier: TierLoad, prefix_tokens, kv_block) -> TierLoad:
    """``tier`` with its ``device_hit`` and ``tier_hit`` shares (``prefix_hits``) filled in."""
    device, in_tier = prefix_hits(tier, prefix_tokens, kv_block)
    return replace(tier, device_hit=device, tier_hit=in_tier)


def reload_s(tier: TierLoad, prefix_tokens, kv_block) -> np.ndarray:
    """Seconds to read one prefix's cached KV from the tier to a device, [P] (inf without a tier)."""
    size = prefix_blocks(prefix_tokens, kv_block) * np.asarray(kv_block, dtype=float) * tier.token_bytes
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(size > 0, size / tier.bandwidth, 0.0)


def swap_s(tier: TierLoad, tokens) -> np.ndarray:
    """Seconds to swap the KV of ``tokens`` tokens out to the tier and back in, [P]: 2 x their
    bytes on a device over its tier bandwidth."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return 2.0 * np.asarray(tokens, dtype=float) * tier.token_bytes / tier.bandwidth


def preemptions_per_request(running, free_blocks, held_mean, prompt_blocks, step_var) -> np.ndarray:
    """Expected preemptions a request suffers, [P]: the free KV blocks as a zero-drift random walk
    from one completion to the next (a completion frees its prompt and output, the next admission
    takes its prompt, the running sequences grow by about an output's worth in between), kept below
    the admission threshold (a prompt's blocks, ``prompt_blocks``) plus the slack the running set
    leaves (``free_blocks`` - ``running`` x ``held_mean``); each step below zero preempts a
    sequence. Uniform on that range, a step Delta ~ N(0, ``step_var`` blocks^2) crosses zero with
    probability E[(-Delta)+] / range = sd / sqrt(2 pi) / range per completion, that is per request.
    This model's own estimate (no published closed form was found), checked against the
    simulator (tests/test_kv_tier_agreement.py)."""
    b = np.asarray(running, dtype=float)
    slack = np.maximum(np.asarray(free_blocks, dtype=float) - b * held_mean, 0.0)
    reach = np.sqrt(np.maximum(step_var, 0.0)) / np.sqrt(2.0 * np.pi)
    return np.where(b > 0, reach / np.maximum(prompt_blocks + slack, 1.0), 0.0)


def lru_outcomes(ids, device_slots: int, tier_slots: int) -> np.ndarray:
    """Where each request of prefix ``ids`` (in order) finds its prefix in an LRU stack of
    ``device_slots`` device and ``tier_slots`` tier slots, [n]: 0 the device, 1 the tier, 2
    nowhere (then it is computed and pushed on top; the stack's overflow is dropped). The direct
    simulation Che's approximation is checked against, and the simulator's prefix cache."""
    stack: list[int] = []
    out = np.empty(len(ids), dtype=np.int8)
    for n, i in enumerate(np.asarray(ids).tolist()):
        out[n] = lru_lookup(stack, i, device_slots, tier_slots)
    return out


def lru_lookup(stack: list, item: int, device_slots: int, tier_slots: int) -> int:
    """Where ``item`` is found in the LRU ``stack`` (most recent first; updated in place: ``item``
    moved or pushed on top, the overflow past ``device_slots`` + ``tier_slots`` dropped): 0 the
    device, 1 the tier, 2 nowhere."""
    try:
        depth = stack.index(item)
    except ValueError:
        depth = -1
    where = 2 if depth < 0 else (0 if depth < device_slots else 1)
    if depth >= 0:
        del stack[depth]
    stack.insert(0, item)
    del stack[int(device_slots) + int(tier_slots):]
    return where
