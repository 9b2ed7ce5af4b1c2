"""A steady-state model of an in-flight-batching engine under load, vectorized over design
points: the running batch under a paged KV cache, chunked prefill mixed into decode
iterations, prefix caching, queueing past saturation (closed loop at a concurrency, or open
loop at a request rate), request lengths fixed or drawn from a distribution, latency
percentiles and goodput under SLOs.

The engine is the one ``dse.core.simulator`` runs request by request (its reference): each
iteration decodes one token for every running sequence past its prompt and fills the rest
of a token budget with prompt chunks; requests are admitted first come, first served while
their KV blocks fit. Every iteration is priced by the caller's ``iteration_time`` (the
roofline of ``dse.system.iteration``).

Two regimes:

- **Waves** (a closed loop with every request of the same lengths): requests that finish
  together come back together and are prefilled together, as many to an iteration as the
  budget holds beside the decoders (whole prompts, packed greedily, where the cycle has room
  for every wave); the cycle of prompt and decode iterations gives the throughput by Little's
  law (``_waves``).
- **Mixing** (an open loop at a Poisson rate, or a closed loop whose requests differ in
  length and so drift apart): an iteration prefills the prompts that arrived during the one
  before, a Poisson number of mean X T, beside the sequences decoding; a prompt of c
  computed tokens takes n = ceil(c / budget) iterations; a request's TTFT is the rest of the
  iteration it arrives in (length-biased) plus its prompt's iterations; TPOT the mean
  iteration, but for an open loop's first decode iterations after one's own prompt: longer,
  as they carry the prompt chunks that arrived meanwhile, followed through the chain step by
  step until those are done. Solved for the mean iteration T together with the running batch
  (open loop: b = X x residence time) or the throughput (closed loop: X = b / residence time)
  (``_mixed``).
- **Full** (chunked prefill, a closed loop with more requests than a full engine holds): a
  queue keeps every iteration's budget B full, its d decoders first and p prompt tokens in
  the rest; each request brings c computed prompt tokens and s decode steps, so p = B c / (c
  + s) and d = B s / (c + s), and the engine serves (p / c) / T(d, p) requests/s whatever the
  concurrency (``_full``). This bounds both regimes above: short outputs (few decode steps
  a request) make the prompts' compute, not the KV cache, the bottleneck; the requests past
  the d + p / c + 1 the engine holds wait for admission.
- **Busy** (chunked, a closed loop whose lengths spread, where mixing would outrun the full
  engine): the prompt backlog of the requests not decoding fills the budget only by chance;
  a share phi of the iterations full, the rest mixing (``_busy``), so that the latencies pass
  from mixing to full without a jump.

Closed loops keep Little's law: a request stays (running batch) / throughput from admission
to its last token; what the latencies leave of that it waits for its first token.

The running batch is the concurrency (closed loop), or what the rate keeps busy (open loop),
capped by ``max_running`` and by the KV cache: its blocks over the blocks a running sequence
holds on average (its prompt, half its output and half a block of fragmentation, weighted by
how long each length class runs). Past that cap requests queue (never spilled to host
memory); an open loop past the cap's throughput is saturated (TTFT infinite).

Prefix caching: every prompt starts with a shared prefix of ``prefix_tokens``, of which the
full KV blocks are cached once for all requests (the last prompt token is always computed):
a request computes and holds only what follows them.

Latency percentiles: each metric is a mixture over length classes (and over the wave a
request falls in), each component normal with the variance of the iterations it spans
(the residual of the arrival iteration, the prompt iterations, the decode iterations taken
as independent); quantiles of that mixture. ``goodput`` is the largest Poisson request rate
whose TTFT and TPOT quantiles meet the SLOs (DistServe's definition at a percentile).

Sources (facts): Yu et al., Orca (OSDI 2022); Kwon et al., PagedAttention (SOSP 2023);
Agrawal et al., Sarathi-Serve (OSDI 2024); Zhong et al., DistServe (OSDI 2024, goodput
under TTFT/TPOT SLOs at a percentile); Little's law.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from functools import lru_cache

import numpy as np

from dse.core import kv_tiers
from dse.core.kv_tiers import TierLoad
from dse.core.metrics import pipelined_prefill_s
from dse.core.scheduling import class_ttft_mixes
from workloads.lengths import Lengths

#: (decode tokens, decode keys, prompt tokens, prompt keys, prompt sequences, rows) -> seconds:
#: arrays of one shape, ``rows`` the design point (of the caller's group) each entry belongs to
IterationTime = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray], np.ndarray]

#: nodes and weights of a normal (Gauss-Hermite, probabilists', five points): the decoding
#: sequences' spread about their mean in an open loop
_NODES, _NODE_WEIGHTS = np.polynomial.hermite_e.hermegauss(5)
_NODE_WEIGHTS = _NODE_WEIGHTS / _NODE_WEIGHTS.sum()
#: the most prompts an iteration's state counts (more fold into it)
_MOST_STATES = 256
#: the share of a chain's iterations that may spill past its last state before it is solved again with
#: the states it held before (``_Chain.state``), and the entries a call's [A, K, K] tensors hold at most
_SPILL = 1e-6
_STATE_ELEMENTS = 2**22
#: an open loop's decode iterations after one's own prompt followed through the chain one by one at
#: most (``_Chain._after_own``; past them a geometric tail)
_EXACT_STEPS = 64
#: fixed-point steps of the mixing model at most, and the relative change it settles at
_FIXED_POINT = 80
_SETTLED = 1e-6
#: mean-value rounds an open loop's fixed point starts from where no nearby solution is known
_MEAN_VALUE_ROUNDS = 2
#: the percentiles reported
PERCENTILES = (50, 90, 99)
#: bisection steps of goodput over (0, capacity]: precision capacity / 2^12
_GOODPUT_STEPS = 12
#: each priority class's TTFT percentiles (``steady_state`` with ``high_share``; seconds)
CLASS_PERCENTILES = tuple(f"ttft_{c}_p{q}_s" for c in ("high", "low") for q in PERCENTILES)


@dataclass(frozen=True)
class Pools:
    """Disaggregated prefill and decode (DistServe, Splitwise), arrays [P]: prefill and decode
    instances (engines of the group's devices each), KV bytes per token each device of a
    prefill instance sends to its decode instance, and ``transfer(bytes [A, K], rows [A])``:
    seconds of one such message on each point's link. A decode pool laid out otherwise than the
    prefill pool has its own ``decode_load`` (its engines' KV blocks, running cap and budget: the
    request lengths and load are the prefill's) and ``decode_time`` (its iterations' pricer); None:
    the prefill pool's. An encoder pool (E:P:D) of ``encoders`` instances [P] (0: none) runs each
    request's vision encoder in ``encode_s`` seconds and sends its ``embed_bytes`` of image
    embeddings to a prefill instance over ``transfer`` (``dse.core.disaggregated``)."""

    prefill: np.ndarray
    decode: np.ndarray
    kv_token_bytes: np.ndarray
    transfer: Callable[[np.ndarray, np.ndarray], np.ndarray]
    decode_load: "Load | None" = None
    decode_time: "IterationTime | None" = None
    encoders: np.ndarray | None = None
    encode_s: np.ndarray | None = None
    embed_bytes: np.ndarray | None = None

    def take(self, idx) -> "Pools":
        """The design points ``idx`` (``transfer`` and ``decode_time`` still take rows of the whole group)."""
        enc = {} if self.encoders is None else {"encoders": self.encoders[idx], "encode_s": self.encode_s[idx],
                                                "embed_bytes": self.embed_bytes[idx]}
        return replace(self, prefill=self.prefill[idx], decode=self.decode[idx], kv_token_bytes=self.kv_token_bytes[idx],
                       decode_load=None if self.decode_load is None else self.decode_load.take(idx), **enc)


@dataclass(frozen=True)
class Load:
    """The engine and its load per design point (arrays [P]), and the request lengths
    (classes shared by every point).

    kv_blocks: blocks the KV cache holds; kv_block: tokens per block; token_budget: tokens
    one iteration processes; max_running: sequences running at once; concurrency: requests
    in flight (closed loop; NaN for an open loop); request_rate: requests per second (open
    loop; NaN for closed); chunked: prompts cut into chunks beside the decoders (else
    prefill-first: an iteration of whole prompts, no decoding, whenever prompts wait);
    prefix_tokens: the shared prompt prefix (tokens; 0: no prefix caching); pools:
    disaggregated prefill and decode (None: both on one engine); dispersion: an open loop's
    arrivals as a gamma renewal process whose gaps have this squared coefficient of variation
    (1 / burstiness; None or 1: Poisson)."""

    lengths: Lengths
    kv_blocks: np.ndarray
    kv_block: np.ndarray
    token_budget: np.ndarray
    max_running: np.ndarray
    concurrency: np.ndarray
    request_rate: np.ndarray
    chunked: np.ndarray
    prefix_tokens: np.ndarray
    pools: Pools | None = None
    dispersion: np.ndarray | None = None     # open loop: the arrival gaps' squared coefficient of variation
    state_blocks: np.ndarray | float = 0.0   # blocks a running sequence's recurrent state takes (hybrids)
    session_cached: np.ndarray | None = None  # [P, K] tokens of each class's prompt a session's cache holds (sessions)
    session_spread: np.ndarray | None = None  # [P, K] their variance over the class's requests (hit or not), tokens^2
    tier: TierLoad | None = None             # the KV cache's second tier and preemption (``_tiered``; None: today's)
    stages: int = 1                          # pipeline stages its streams share (``_pipeline_phase``)
    prompts: np.ndarray | None = None        # an open loop's requests in all (a finite run; 0 or None: endless)

    def take(self, idx) -> "Load":
        """The design points ``idx``."""
        return replace(self, **{f.name: getattr(self, f.name)[idx] for f in fields(self)
                                if f.name not in ("lengths", "pools", "dispersion", "state_blocks", "session_cached",
                                                  "session_spread", "tier", "stages", "prompts")},
                       prompts=None if self.prompts is None else self.prompts[idx],
                       tier=None if self.tier is None else self.tier.take(idx),
                       pools=None if self.pools is None else self.pools.take(idx),
                       session_cached=None if self.session_cached is None else self.session_cached[idx],
                       session_spread=None if self.session_spread is None else self.session_spread[idx],
                       dispersion=None if self.dispersion is None else self.dispersion[idx],
                       state_blocks=self.state_blocks[idx] if np.ndim(self.state_blocks) else self.state_blocks)


@dataclass(frozen=True)
class _Classes:
    """Per-point length classes, arrays [P, K]: prompt and gen tokens, cached prompt tokens,
    computed prompt tokens (work), prompt key pairs computed, decode iterations (steps),
    keys a decode iteration attends to on average (keys); the variance of prompt and output
    lengths within a class (prompt_var, gen_var); weight [K]; shared_blocks [P]."""

    prompt: np.ndarray
    gen: np.ndarray
    cached: np.ndarray
    work: np.ndarray
    pairs: np.ndarray
    steps: np.ndarray
    keys: np.ndarray
    prompt_var: np.ndarray
    gen_var: np.ndarray
    weight: np.ndarray
    shared_blocks: np.ndarray
    own_cached: np.ndarray | float = 0.0     # [P, K] cached tokens a request holds itself (a session's history)

    def take(self, idx) -> "_Classes":
        return replace(self, **{f.name: getattr(self, f.name)[idx] for f in fields(self)
                                if f.name != "weight" and np.ndim(getattr(self, f.name))})

    def mean(self, x: np.ndarray) -> np.ndarray:
        """The request-weighted mean over classes of ``x`` [P, K], [P]."""
        return _dot(x, self.weight)

    def decode_keys(self) -> np.ndarray:
        """The keys a decode iteration's sequence attends to, the mean over every request's decode
        steps, [P] (where no request decodes: the classes' mean keys)."""
        s = self.mean(self.steps)
        return np.where(s > 0, self.mean(self.steps * self.keys) / np.maximum(s, 1e-300), self.mean(self.keys))

    def pairs_per_token(self) -> np.ndarray:
        """The keys a computed prompt token attends to, the mean over every request's prompt, [P]."""
        return self.mean(self.pairs) / np.maximum(self.mean(self.work), 1e-300)


def _dot(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``x`` [P, K] weighted by ``w`` [K] and summed over K, [P]: row by row, so that a point's
    figure does not depend on the points beside it (a matrix product rounds by its blocking)."""
    return (x * w).sum(axis=-1)


def _classes(load: Load) -> _Classes:
    """The length classes of every point, prefix caching applied."""
    n = len(load.kv_block)
    prompt = np.broadcast_to(load.lengths.prompt, (n, len(load.lengths.prompt)))
    gen = np.broadcast_to(load.lengths.gen, prompt.shape)
    blk = load.kv_block[:, None]
    full = np.floor(load.prefix_tokens[:, None] / blk) * blk            # cached: whole blocks only
    cached = np.clip(np.minimum(full, prompt - 1.0), 0.0, None)
    own = 0.0
    if load.session_cached is not None:       # a session's history found cached: its own blocks, past the prefix's
        own = np.clip(np.minimum(load.session_cached, prompt - 1.0) - cached, 0.0, None)
        cached = cached + own
    work = prompt - cached
    pairs = (prompt * (prompt - 1.0) - cached * np.maximum(cached - 1.0, 0.0)) / 2.0
    if load.session_spread is not None:       # E[c (c - 1)] of a cached part that varies: its variance more
        pairs = np.maximum(pairs - load.session_spread / 2.0, work * (work - 1.0) / 2.0)
    steps = np.maximum(gen - 1.0, 0.0)
    keys = prompt + np.maximum(gen - 2.0, 0.0) / 2.0   # the prompt and half the output fed back
    shared = np.where(full[:, 0] > 0, full[:, 0] / load.kv_block, 0.0)
    spread = [np.broadcast_to(v, prompt.shape) for v in (load.lengths.prompt_var, load.lengths.gen_var)]
    return _Classes(prompt, gen, cached, work, pairs, steps, keys, *spread, load.lengths.weight, shared, own)


def _blocks_per_sequence(load: Load, cls: _Classes, run=None) -> np.ndarray:
    """KV blocks a running sequence holds on average, [P]: its own prompt part and half its
    output, plus half a block of fragmentation and its recurrent state's blocks (a hybrid
    model's, ``Load.state_blocks``); classes weighted by ``run`` [P, K] (default: how long they
    run, 1 + their decode iterations)."""
    held = cls.work + cls.own_cached + cls.gen / 2.0
    if load.tier is not None:       # a prefix not the device's is the request's own while it runs
        held = held + (1.0 - load.tier.device_hit)[:, None] * cls.cached
    run = cls.weight * (1.0 + cls.steps) if run is None else run
    return (held * run).sum(axis=1) / run.sum(axis=1) / load.kv_block + 0.5 + load.state_blocks


def running_cap(load: Load, cls: _Classes | None = None, held=None) -> np.ndarray:
    """Sequences the engine can run at once, [P]: max_running, or fewer where the KV cache
    (less the shared prefix's blocks) holds fewer at ``held`` blocks a sequence (default
    ``_blocks_per_sequence``)."""
    cls = _classes(load) if cls is None else cls
    held = _blocks_per_sequence(load, cls) if held is None else held
    free = np.maximum(load.kv_blocks - cls.shared_blocks, 0.0)
    return np.minimum(load.max_running, np.floor(free / held))


def _tiered(load: Load, cls: _Classes, iteration_time: IterationTime, running, hits) -> tuple:
    """(the length classes, the iteration pricer) of points with a KV tier (``dse.core.kv_tiers``;
    unchanged where ``load.tier`` is None), ``running`` [P] sequences in the engine, ``hits`` [P]
    (device, tier) the shares of requests finding their prefix there (``kv_tiers.prefix_hits``). A
    request whose prefix is in neither computes it (the classes' cached tokens and key pairs are
    the mixture of hits and misses); one in the tier reloads it, and a swapped sequence moves its KV
    out and back: seconds each request adds to the iteration that finishes its prompt (the pricer's
    prompts finished). Preemptions per request (``kv_tiers.preemptions_per_request``; where
    ``tier.priced``): the free blocks' walk between completions, a step's variance that of two
    prompts' computed tokens, an output and the growth between completions (an output's worth,
    exponential: its mean squared); a victim (the latest admitted) holds about its computed
    prompt: recompute computes it again (work and key pairs scaled by 1 + preemptions), swap
    moves it out and back."""
    tier = load.tier
    if tier is None:
        return cls, iteration_time
    device, in_tier = hits
    miss = np.clip(1.0 - device - in_tier, 0.0, 1.0)[:, None]
    cached = cls.cached * (1.0 - miss)
    pairs = cls.pairs * (1.0 - miss) + miss * cls.prompt * (cls.prompt - 1.0) / 2.0
    blk = load.kv_block
    w = cls.weight
    work_var = np.maximum((cls.work ** 2) @ w - (cls.work @ w) ** 2, 0.0) + cls.prompt_var @ w
    gen = cls.gen @ w
    gen_var = np.maximum((cls.gen ** 2) @ w - gen ** 2, 0.0) + cls.gen_var @ w
    free = np.maximum(load.kv_blocks - cls.shared_blocks, 0.0)
    victim = cls.mean(cls.work)
    held = _blocks_per_sequence(load, cls)
    free = np.where(running >= running_cap(load, cls, held), running * held, free)   # a queue takes the slack
    pre = kv_tiers.preemptions_per_request(running, free, held, victim / blk,
                                           (2.0 * work_var + gen_var + gen ** 2) / blk ** 2)
    pre = np.where(tier.priced, pre, 0.0)
    again = np.where(tier.swap, 0.0, pre)[:, None]
    work = (cls.prompt - cached) * (1.0 + again)
    # hits and misses make prompts of one class differ in computed tokens: their spread
    spread = miss * (1.0 - miss) * cls.cached ** 2
    cls = replace(cls, cached=cached, work=work, pairs=pairs * (1.0 + again), prompt_var=cls.prompt_var + spread)
    with np.errstate(invalid="ignore"):           # no tier: nothing reloaded or swapped (0 x inf)
        reload = np.where(in_tier > 0, in_tier * kv_tiers.reload_s(tier, load.prefix_tokens, load.kv_block), 0.0)
        stall = reload + np.where(tier.swap & (pre > 0), pre * kv_tiers.swap_s(tier, victim), 0.0)
    if not np.any(stall > 0):
        return cls, iteration_time

    def timed(d, dctx, c, pctx, s, rows):
        return iteration_time(d, dctx, c, pctx, s, rows) + np.asarray(s, dtype=float) * stall[rows]
    return cls, timed


def _tier_hits(load: Load) -> tuple | None:
    """(device, tier) shares of requests finding their prefix cached (``kv_tiers.prefix_hits``), or
    None without a tier."""
    return None if load.tier is None else (load.tier.device_hit, load.tier.tier_hit)


def _priced(iteration_time: IterationTime, rows: np.ndarray, d, dctx, c, pctx, s) -> np.ndarray:
    """``iteration_time`` over arrays of shape [A] or [A, J] (entry (a, .) of design point
    ``rows[a]``), in that shape (seconds)."""
    args = [np.asarray(x, dtype=float) for x in (d, dctx, c, pctx, s)]
    r = rows[:, None] if any(x.ndim == 2 for x in args) else rows
    shape = np.broadcast_shapes(*(x.shape for x in args), r.shape)
    flat = [np.broadcast_to(x, shape).ravel() for x in args]
    return iteration_time(*flat, np.broadcast_to(r, shape).ravel()).reshape(shape)


# --------------------------------------------------------------------------- pipeline

def pipeline_fill(seqs, c, stages: int):
    """The factor by which the prompts of an iteration of ``stages`` interleaved streams lengthen it
    when they are in several streams (``seqs`` prompts, at most one stream each; ``c`` prompt
    tokens): m streams' prompt passes of ``t`` seconds each take every stage ``t / stages`` in turn,
    so the j-th ends ``j t / stages`` after the first (the last at ``pipelined_prefill_s``'s (m +
    stages - 1) stage times); their mean, halfway between the first and the last, is 1 + (m - 1) /
    (2 stages) times ``t``; 1 without prompt tokens or stages. It is what the first prompt iteration
    of a phase costs (``_pipeline_phase``)."""
    if stages == 1:
        return 1.0
    m = np.clip(np.asarray(seqs, dtype=float), 1.0, stages)
    return np.where(np.asarray(c) > 0, (1.0 + pipelined_prefill_s(1.0, m, stages)) / 2.0, 1.0)


def _pipeline_phase(load: Load, t, seqs, c, t_d) -> tuple[np.ndarray, np.ndarray]:
    """(inside, stagger) [A] seconds of a prompt iteration ``t`` (as priced: the first of a phase,
    ``pipeline_fill`` of its ``seqs`` prompts and ``c`` tokens) of an engine of ``load.stages``
    streams that run their prompt iterations one after another as a phase (a closed loop's waves,
    the streams in step, as ``dse.core.simulator._EventLoop`` keeps them): inside the phase the
    stages stay busy, so an iteration lasts its pass, ``t / fill``; at the phase's edges the streams
    stagger: stream j's first prompt iteration waits for the j before it on the first stage, j (p -
    q) (p, q: a stage's share of the prompt and of the decode iteration ``t_d``), and its first
    decode iteration after the phase for the stages - 1 - j behind it, so each edge costs a stream
    (fill - 1) x (inside - t_d) on the mean (its TTFT the first, its TPOT the second)."""
    t = np.asarray(t, dtype=float)
    if load.stages == 1:
        return t, np.zeros_like(t)
    f = pipeline_fill(seqs, c, load.stages)
    inside = t / f
    with np.errstate(invalid="ignore"):
        return inside, np.where(f > 1.0, (f - 1.0) * np.maximum(inside - t_d, 0.0), 0.0)


# --------------------------------------------------------------------------- waves

def _waves(b, load: Load, cls: _Classes, iteration_time: IterationTime, rows) -> dict[str, np.ndarray]:
    """Closed loop with ``b`` sequences running, all of one length class: they move in
    waves. Requests that finish together come back together and are prefilled together, as
    many to an iteration as its token budget has room for beside the decoders (chunked), so
    ``W`` waves of b / W share a cycle of prompt iterations and G - 1 decode iterations per
    request (Little's law: X = b / cycle). Prefill-first keeps them one cohort (see below).
    Returns x (requests/s), T (mean iteration), tpot, and the TTFT, TPOT and end-to-end
    mixtures (mean, sd, weight) [P, 2]."""
    c, budget = cls.work[:, 0], load.token_budget
    pair = cls.pairs[:, 0] / c                                # keys a computed prompt token attends to
    steps = cls.steps[:, 0]
    ctx = cls.keys[:, 0]
    zero = np.zeros_like(b)
    # the first arrivals split into waves by the budget, and keep that split
    waves = np.clip(np.ceil(b * c / budget), 1, np.maximum(b, 1))
    size = b / waves                                         # requests per wave
    d_h = size * np.minimum(steps, waves - 1.0)              # the other waves decode, those not yet done
    room = np.maximum(budget - d_h, 1.0)                     # prompt tokens beside them
    # a wave's prompts fill one iteration; what does not fit goes on in h2 more full ones (a
    # fraction: the next wave's prompts take the rest of the last, as the engine fills its budget)
    c1 = np.minimum(size * c, room)
    rest = size * c - c1
    h2 = rest / room
    c2 = np.where(h2 > 0, room, 0.0)
    first = np.minimum(size, np.floor(room / c))            # prompts done in the first iteration
    late = (size - first) / size                             # share of the wave that waits for the rest
    t1 = _priced(iteration_time, rows, d_h, d_h * ctx, c1, c1 * pair, first)
    ending = (size - first) / np.maximum(h2, 1)              # prompts ending in one of the late iterations
    t2 = _priced(iteration_time, rows, d_h, d_h * ctx, c2, c2 * pair, ending)
    t_d = _priced(iteration_time, rows, b, b * ctx, zero, zero, zero)
    # pipelined streams: the waves' prompt iterations are one phase a cycle (``_pipeline_phase``):
    # the first wave waits the streams' stagger, the first decode iteration after the last the drain
    t1, stagger = _pipeline_phase(load, t1, first, c1, t_d)
    t2, _ = _pipeline_phase(load, t2, ending, c2, t_d)
    drain = np.zeros_like(stagger)
    if load.stages > 1:                                       # the phase's last iteration: what is left
        total = size * c * waves
        c_last = total - np.maximum(np.ceil(total / room) - 1.0, 0.0) * room
        t_last = _priced(iteration_time, rows, d_h, d_h * ctx, c_last, c_last * pair, c_last / c)
        _, drain = _pipeline_phase(load, t_last, c_last / c, c_last, t_d)
    # a late prompt's first token comes as the iteration holding its last chunk ends: that one
    # counts whole. Its budget's rest is the next wave's if that wave is waiting as it starts (a
    # full iteration, the wave's share ``frac`` of it in the cycle), else it holds the tail and the
    # decoders alone (one iteration of the cycle, priced so): each of the cycle's iterations without
    # prompts (its spare ones, were every tail shared) breaks the run of waves once, at most, so a
    # share min(W, spare) / W of the waves' tails are alone
    whole = np.ceil(h2 - 1e-9)
    frac = h2 - np.maximum(whole - 1.0, 0.0)                 # the tail's share of a full iteration
    n_p = 1.0 + late * whole                                 # iterations to the first token, mean
    spare = np.maximum(steps + n_p - waves * (1.0 + h2), 0.0)
    alone = np.where(whole > 0, np.minimum(waves, spare) / waves, 0.0)
    c_tail = frac * room
    t_tail = _priced(iteration_time, rows, d_h, d_h * ctx, c_tail, c_tail * pair, ending)
    t_tail, _ = _pipeline_phase(load, t_tail, ending, c_tail, t_d)
    hybrid = waves * (1.0 + h2 + alone * (1.0 - frac))
    cycle = np.maximum(steps + n_p, hybrid)                  # iterations per cycle
    t_cycle = waves * (t1 + (h2 - alone * frac) * t2 + alone * t_tail) + (cycle - hybrid) * t_d + stagger + drain
    to_first = np.where(whole > 0, (whole - 1.0) * t2 + (1.0 - alone) * t2 + alone * t_tail, 0.0)
    ttft = t1 + late * to_first + stagger / waves
    tpot = np.where(steps > 0, (t_cycle - ttft) / np.maximum(steps, 1), t_d)
    first_wave = stagger / waves
    ttft_mix = (np.stack([t1 + first_wave, t1 + to_first + first_wave], 1), np.zeros((len(b), 2)),
                np.stack([1 - late, late], 1))
    tpot_sd = np.zeros_like(b)
    # prefill-first: while prompts wait nothing decodes, so the requests stay one cohort, as a
    # static batch: its prompts in W iterations of as many as the budget holds, then G - 1
    # decode iterations of all of them (the i-th iteration's prompts wait for i of them)
    per_wave = np.clip(np.floor(budget / c), 1, np.maximum(b, 1))
    waves_pf = np.ceil(b / per_wave)
    size_pf = b / waves_pf
    t_p = _priced(iteration_time, rows, zero, zero, size_pf * c, size_pf * c * pair, size_pf)
    t_p, edge = _pipeline_phase(load, t_p, size_pf, size_pf * c, t_d)   # every wave staggered, one drain
    ch = load.chunked
    t_cycle = np.where(ch, t_cycle, waves_pf * t_p + steps * t_d + 2.0 * edge)
    cycle = np.where(ch, cycle, waves_pf + steps)
    # the i-th wave's first token comes W - i prompt iterations before the cohort decodes
    spread = t_p * np.sqrt((waves_pf ** 2 - 1.0) / 12.0)      # sd of a uniform choice of i
    tpot = np.where(ch, tpot, t_d + (t_p * (waves_pf - 1) / 2.0 + edge) / np.maximum(steps, 1))
    tpot_sd = np.where(ch, tpot_sd, spread / np.maximum(steps, 1))
    pf_ttft = t_p * (waves_pf + 1) / 2.0 + edge
    mean = np.where(ch[:, None], ttft_mix[0], np.stack([pf_ttft, pf_ttft], 1))
    sd = np.where(ch[:, None], 0.0, np.stack([spread, spread], 1))
    weight = np.where(ch[:, None], ttft_mix[2], np.array([[1.0, 0.0]]))
    ttft = np.where(ch, ttft, pf_ttft)
    e2e = ttft + steps * tpot                                # a cohort ends together
    two = np.ones((len(b), 2))
    tpot_mean = tpot[:, None] * two
    # chunked, with room for every wave's prompts in a cycle of one prompt iteration and G - 1
    # decode iterations a request: requests come back as their wave ends, and an iteration takes
    # the prompts waiting, whole, as many as fit beside the b - k others decoding (k c + b - k <=
    # B), so waves are packed greedily, k = floor((B - b) / (c - 1)) and what is left (a prompt
    # cut at the budget finishes an iteration later and falls into a later wave, until the
    # waves hold whole prompts: the simulator settles at 7, 7, 2 for 16 prompts of 1,024 tokens
    # in a budget of 8,192, where waves of equal size b / W would each spill a prompt)
    fit = np.minimum(np.where(c > 1, np.floor((budget - b) / np.maximum(c - 1.0, 1.0)), np.where(budget >= b, b, 0)), b)
    groups = np.ceil(b / np.maximum(fit, 1.0))
    packed = np.flatnonzero(ch & (fit >= 1) & (groups >= 2) & (groups <= steps + 1))
    if len(packed):
        bp, kp, gp, sp, r = b[packed], fit[packed], groups[packed], steps[packed], rows[packed]
        rest = bp - (gp - 1.0) * kp                           # the last wave
        sizes = np.stack([kp, rest], 1)
        t_k = _priced(iteration_time, r, bp[:, None] - sizes, (bp[:, None] - sizes) * ctx[packed, None],
                      sizes * c[packed, None], sizes * (c * pair)[packed, None], sizes)
        # pipelined streams: the groups' prompt iterations one phase (``_pipeline_phase``), the
        # first group waits the stagger, the decode iteration after the last (``rest``) the drain
        t_k, edges = _pipeline_phase(load, t_k, sizes, sizes * c[packed, None], t_d[packed, None])
        t_c = (gp - 1.0) * t_k[:, 0] + t_k[:, 1] + (sp + 1.0 - gp) * t_d[packed] + edges.sum(axis=1)
        t_k = t_k + np.stack([edges[:, 0] / (gp - 1.0), np.zeros_like(gp)], 1)   # the first group's TTFT
        share = np.stack([(gp - 1.0) * kp, rest], 1) / bp[:, None]
        t_cycle, cycle = t_cycle.copy(), cycle.copy()
        t_cycle[packed], cycle[packed] = t_c, sp + 1.0
        ttft, tpot, e2e = ttft.copy(), tpot.copy(), e2e.copy()
        ttft[packed] = (share * t_k).sum(axis=1)
        tpot[packed] = (t_c - ttft[packed]) / sp
        e2e[packed] = t_c                                     # a request's life is the cycle
        mean, weight, tpot_mean = mean.copy(), weight.copy(), tpot_mean.copy()
        mean[packed], weight[packed] = t_k, share
        tpot_mean[packed] = (t_c[:, None] - t_k) / sp[:, None]
    return {"x": b / t_cycle, "T": t_cycle / cycle, "ttft": ttft, "tpot": tpot,
            "ttft_mix": (mean, sd, weight),
            "tpot_mix": (tpot_mean, tpot_sd[:, None] * two, weight),
            "e2e_mix": (e2e[:, None] * two, np.zeros_like(two), weight)}


# --------------------------------------------------------------------------- mixing

def _poisson(mean, kmax: int) -> np.ndarray:
    """P(k) for k = 0..kmax of a Poisson count of each ``mean`` ([P]), [P, kmax + 1]; the
    tail beyond kmax folded into kmax."""
    k = np.arange(kmax + 1)
    with np.errstate(divide="ignore"):
        logp = k * np.log(np.maximum(mean, 1e-300))[:, None] - mean[:, None] - np.cumsum(np.log(np.maximum(k, 1)))
    pmf = np.exp(logp)
    pmf[:, -1] += np.maximum(1.0 - pmf.sum(axis=1), 0.0)
    return pmf


def _negative_binomial(mean, dispersion, kmax: int) -> np.ndarray:
    """P(k) for k = 0..kmax of a negative binomial count of each ``mean`` and variance ``dispersion``
    x mean (``dispersion`` > 1, ``mean`` > 0; [P]), [P, kmax + 1], the tail not folded: size
    r = mean / (dispersion - 1), success probability 1 / dispersion, P(0) = dispersion^-r and
    P(k) / P(k - 1) = (k - 1 + r) / k x (1 - 1 / dispersion), summed in logs (a cumulative sum:
    no gamma function per entry)."""
    r = mean / (dispersion - 1.0)
    k = np.arange(1, kmax + 1)
    log_p = np.empty((len(mean), kmax + 1))
    log_p[:, 0] = -r * np.log(dispersion)
    np.cumsum(np.log(k[None, :] - 1.0 + r[:, None]) - np.log(k)[None, :]
              + np.log((dispersion - 1.0) / dispersion)[:, None], axis=1, out=log_p[:, 1:])
    log_p[:, 1:] += log_p[:, :1]
    return np.exp(log_p)


def arrival_counts(mean, kmax: int, dispersion=None, since_one: bool = False) -> np.ndarray:
    """P(k) for k = 0..kmax of the arrivals of an open loop during intervals of ``mean`` expected
    arrivals ([P]), [P, kmax + 1], the tail folded into kmax. Poisson where ``dispersion`` is None
    or 1; else the count of a gamma renewal process (gaps of squared coefficient of variation
    ``dispersion`` [P], as vLLM's benchmark draws them at burstiness 1 / dispersion) taken with its
    long-run index of dispersion (Cox, 'Renewal Theory', 1962: Var N(t) ~ c^2 t / mu): a negative
    binomial of that variance where the arrivals are burstier than Poisson (dispersion > 1), a
    binomial where they are more regular. ``since_one``: the arrivals in the interval that starts
    at an arrival (what an arriving request finds come with it: an ordinary renewal process, the
    n-th arrival after s_n ~ Gamma(n / dispersion) gaps, P(N >= n) = P(s_n <= t) in closed form),
    where bursts bring more company than a random instant sees."""
    if dispersion is None:
        return _poisson(mean, kmax)
    mean = np.asarray(mean, dtype=float)
    d = np.broadcast_to(np.asarray(dispersion, dtype=float), mean.shape)
    if np.all(d == 1.0):
        return _poisson(mean, kmax)
    from scipy.special import gammainc
    from scipy.stats import binom  # scipy on first use: importing dse stays light
    k = np.arange(kmax + 1)[None, :]
    if since_one:            # P(N >= n) = P(Gamma(n shape, unit mean gaps) <= t), shape = 1 / dispersion
        shape = 1.0 / d[:, None]
        n = np.arange(1, kmax + 2)[None, :]
        at_least = gammainc(n * shape, np.maximum(mean, 0.0)[:, None] * shape)
        pmf = np.empty((len(mean), kmax + 1))
        pmf[:, 0] = 1.0 - at_least[:, 0]
        pmf[:, 1:] = at_least[:, :-1] - at_least[:, 1:]
        pmf[:, -1] += at_least[:, -1]
        return np.clip(pmf, 0.0, 1.0)
    m = np.maximum(mean, 0.0)[:, None]
    dd = d[:, None]
    burst = (d > 1.0) & (m[:, 0] > 0)
    pmf = np.empty((len(mean), kmax + 1))
    if (~burst).any():
        pmf[~burst] = _poisson(mean[~burst], kmax)
    if burst.any():
        pmf[burst] = _negative_binomial(m[burst, 0], d[burst], kmax)
    with np.errstate(divide="ignore", invalid="ignore"):
        calm = (dd < 1.0) & (m > 0)
        if calm.any():
            n = np.ceil(m / np.maximum(1.0 - dd, 1e-300))
            pmf = np.where(calm, binom.pmf(k, n, np.clip(m / np.maximum(n, 1e-300), 0.0, 1.0)), pmf)
    pmf = np.nan_to_num(pmf)
    pmf[:, -1] += np.maximum(1.0 - pmf.sum(axis=1), 0.0)
    return pmf


def _at_count(first: np.ndarray, count: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``first`` [A, K] (an iteration's seconds by the prompts in it) at fractional ``count``
    ([A, ...]) and at one prompt more, linear between whole counts."""
    low = np.floor(count).astype(np.int64)
    part = count - low
    top = first.shape[1] - 1
    flat = first.ravel()
    base = (np.arange(len(first)) * first.shape[1]).reshape((-1,) + (1,) * (count.ndim - 1))
    f0, f1, f2 = (flat[base + np.minimum(low + d, top)] for d in (0, 1, 2))
    return (1.0 - part) * f0 + part * f1, (1.0 - part) * f1 + part * f2


def _windows(first: np.ndarray, length: int, more: int = 0):
    """``take(start)``: ``first`` [A, K] (past its end, its last entry) read from ``start`` ([A, J]
    integers, 0..K) on, [A, J, length + more]: row (a, j) is first[a, start[a, j]:][:length + more]
    (rows copied whole, no gather per entry); its slices [..., i:i + length] are the windows from
    start + i, i <= ``more``, one gather for all of them."""
    a, kk = first.shape
    size = length + more
    padded = np.concatenate([first, np.repeat(first[:, -1:], size, axis=1)], axis=1)
    view = np.lib.stride_tricks.sliding_window_view(padded, size, axis=1)     # [A, K + 1 + more, size]
    return lambda start: view[np.arange(a)[:, None], start]


def _shifted_pairs(rows: np.ndarray):
    """``shift(by)``: (the rows [A, J, K] of ``rows`` moved ``by`` ([A, J] integers, 0..K) entries to
    the right, zeros coming in (what falls off the end dropped), the same moved ``by`` + 1), both
    [A, J, K] slices of one gather. ``rows`` [A, K]: the same row for every j."""
    a, kk = rows.shape[0], rows.shape[-1]
    padded = np.concatenate([np.zeros(rows.shape[:-1] + (kk + 2,)), rows], axis=-1)
    view = np.lib.stride_tricks.sliding_window_view(padded, kk + 1, axis=-1)     # [A, (J,) K + 2, K + 1]
    if rows.ndim == 2:
        def take(by):
            w = view[np.arange(a)[:, None], kk + 1 - by]
            return w[..., 1:], w[..., :-1]
    else:
        def take(by):
            w = view[np.arange(a)[:, None], np.arange(rows.shape[1])[None, :], kk + 1 - by]
            return w[..., 1:], w[..., :-1]
    return take


def _overflow(mean, var, room) -> np.ndarray:
    """The share of ``mean`` tokens (variance ``var``) beyond ``room``: E[(S - room)+] / E[S]
    of a normal S (its upper tail: the prompts that wait an iteration more)."""
    from scipy.special import ndtr  # scipy on first use: importing dse stays light
    sd = np.sqrt(var)
    gap = mean - room
    with np.errstate(divide="ignore", invalid="ignore"):
        z = gap / sd
        tail = np.where(sd > 0, gap * ndtr(z) + sd * np.exp(-0.5 * z * z) / np.sqrt(2 * np.pi), np.maximum(gap, 0.0))
        return np.where(mean > 0, np.maximum(tail, 0.0) / mean, 0.0)


def _states(need) -> np.ndarray:
    """The states a point's chain is first given for ``need`` ([A']: its expected arrivals in the longest
    iteration and six deviations more), [A']: the next half power of two, whole, from 8 on (8, 12, 16,
    23, 32, 46, 64, ...): points of one size share a call, and the chain's tensors ([A', K, K]) and its
    stationary solve (K^3) are at most sqrt(2) times the need, where whole powers of two left up to
    twice it. A chain that spills past its last state is given ``_held``'s (``_Chain.state``)."""
    need = np.maximum(need, 8)
    k = np.ceil(2.0 * np.log2(need))
    below = np.ceil(2.0 ** ((k - 1.0) / 2.0))              # whole, it may hold the need already
    return np.where(below >= need, below, np.ceil(2.0 ** (k / 2.0)))


def _held(need) -> np.ndarray:
    """The states a point's chain held for ``need`` before ``_states``, [A']: the next power of two,
    from 8 on; what a chain that spills past ``_states``' is solved with."""
    return 2.0 ** np.ceil(np.log2(np.maximum(need, 8)))


@lru_cache(maxsize=256)
def _sampled(kmax: int) -> tuple[np.ndarray, np.ndarray]:
    """(k [1, S]: the prompt counts an iteration is priced at: every one up to 8, then about
    25 % apart up to ``kmax``; spread [S, kmax + 1]: linear interpolation onto 0..kmax)."""
    steps = 2 + int(np.log(max(kmax, 8) / 8) / np.log(1.25))
    ks = np.unique(np.concatenate([np.arange(min(kmax, 8) + 1),
                                   np.round(np.geomspace(8, kmax, steps)) if kmax > 8 else [], [kmax]])).astype(float)
    full = np.arange(kmax + 1, dtype=float)
    j = np.clip(np.searchsorted(ks, full, side="right") - 1, 0, len(ks) - 2)
    f = (full - ks[j]) / (ks[j + 1] - ks[j])
    spread = np.zeros((len(ks), kmax + 1))
    spread[j, np.arange(kmax + 1)] = 1.0 - f
    spread[j + 1, np.arange(kmax + 1)] += f
    return ks[None, :], spread


def _stationary(trans: np.ndarray) -> np.ndarray:
    """The stationary distribution [A, J] of Markov chains with transition matrices ``trans``
    [A, J, J] (row: from, column: to)."""
    j = trans.shape[1]
    m = np.swapaxes(trans, 1, 2) - np.eye(j)
    m[:, -1, :] = 1.0
    rhs = np.zeros((len(trans), j, 1))
    rhs[:, -1, 0] = 1.0
    pi = np.clip(np.linalg.solve(m, rhs)[..., 0], 0.0, None)
    return pi / pi.sum(axis=1, keepdims=True)


@dataclass
class _Mixing:
    """The mixing regime's steady state, per point (arrays [A]): throughput x (requests/s),
    running batch b, mean iteration t1 (seconds) and its second moment t2, the time between
    one sequence's tokens tpot (t1, or prefill-first: t1 over the share of decoding
    iterations); per state j of the
    iteration an arrival lands in ([A, J]): its probability ``landing`` (length-biased), its
    length ``tau`` (mean) and ``tau_var`` (variance, from the prompts' sizes), and the mean and second moment of one's own prompt iteration (own, own2)
    for a chunk of the mean size ``tok`` [A], the full iterations one waits for before it
    (wait, wait2: mean and second moment, seconds); ``slope`` (seconds per prompt token more),
    ``chunk_var`` (variance of an arrival's chunk, tokens^2), iterations per prompt n [A, K];
    ``excess`` [A, K + 1]: a request's first 0 .. K decode iterations' lengths over t1, summed
    (an open loop's follow its own prompt iteration and carry the prompts that arrived during
    it; zeros for a closed loop or prefill-first, None where no chain was solved), ``after`` [A]
    the next one's excess and ``relax`` [A] the share of it each next one keeps
    (``_Chain._after_own``, ``_decode_excess``)."""

    x: np.ndarray
    b: np.ndarray
    t1: np.ndarray
    t2: np.ndarray
    tpot: np.ndarray
    landing: np.ndarray
    tau: np.ndarray
    tau_var: np.ndarray
    own: np.ndarray
    own2: np.ndarray
    wait: np.ndarray
    wait2: np.ndarray
    tok: np.ndarray
    slope: np.ndarray
    chunk_var: np.ndarray
    n: np.ndarray
    closed: bool = False
    excess: np.ndarray | None = None
    after: np.ndarray | None = None
    relax: np.ndarray | None = None


class _Chain:
    """The iterations of the mixing regime for a group's points: one with k prompt chunks lasts
    tau_k, during which Poisson(X tau_k) requests arrive for the next (a Markov chain in k). A
    prompt cut into n chunks (chunked prefill, a prompt past the token budget) brings n chunks
    at once: chunks arrive at X E[n], with an index of dispersion E[n^2] / E[n] (an open loop),
    and a chunk's means weigh each length class by its chunks."""

    def __init__(self, load: Load, cls: _Classes, iteration_time: IterationTime, rows):
        w = cls.weight
        self.it, self.rows = iteration_time, rows
        self.dispersion = load.dispersion
        self.budget, self.chunked = load.token_budget, load.chunked
        budget = np.maximum(self.budget - 1.0, 1.0)[:, None]
        self.n = np.where(self.chunked[:, None], np.maximum(np.ceil(cls.work / budget), 1.0), 1.0)
        self.en, self.es = _dot(self.n, w), _dot(cls.steps, w)
        self.batched = _dot(self.n ** 2, w) / self.en      # chunks' index of dispersion: n each prompt brings
        self.most_n = np.where(w > 0, self.n, 0.0).max(axis=1)   # the most chunks one prompt brings
        # the decode iterations after one's own prompt followed one by one (``_after_own``): as many
        # as the longest answer decodes, 64 at most; a point reads its own steps' sums, the same
        # whatever the other points' (past 64 its tail starts at 64 whatever they are)
        steps = np.where(w > 0, cls.steps, 0.0).max(initial=0.0)
        self.exact_steps = int(min(_EXACT_STEPS, np.ceil(steps))) if np.isfinite(steps) else _EXACT_STEPS
        # the chain counts chunks, a class's n of them each: a chunk's means weigh a class by w n
        per_chunk = w * self.n / self.en[:, None]
        chunk = cls.work / self.n
        self.tok = _dot(chunk, per_chunk)                         # prompt tokens a chunk brings to its iteration
        self.chunk_var = np.maximum(_dot(chunk ** 2, per_chunk) - self.tok ** 2, 0.0)
        self.pair = _dot(cls.pairs / self.n, per_chunk) / np.maximum(self.tok, 1e-300)
        self.ends = 1.0 / self.en                                 # prompts a chunk ends
        self.whole, self.whole_pairs = _dot(cls.work, w), _dot(cls.pairs, w)
        self.ctx = cls.decode_keys()
        self.least = np.zeros(len(rows))       # states a point's chain was found to need (``state``)

    @property
    def iterations_per_request(self) -> np.ndarray:
        """Iterations a request runs in (its prompt chunks and decode steps, means), [A]: with b
        sequences running, x requests/s and a mean iteration t, x = b / (that t) (Little's law)."""
        return self.en + self.es

    def mean_value(self, running) -> np.ndarray:
        """Seconds of the mean iteration of a closed loop at ``running`` sequences [A] by mean values
        (no chain, ``_mean_iteration``): where ``_mixed``'s fixed point starts, nearer its answer than
        an idle engine."""
        return self._mean_iteration(np.arange(len(self.rows)), running)

    def mean_value_open(self, at, rate, cap, rounds: int = _MEAN_VALUE_ROUNDS) -> tuple[np.ndarray, np.ndarray]:
        """(mean iteration, running batch) [A'] of points ``at`` in an open loop at ``rate``
        requests/s [A'] by mean values (no chain): from an idle engine, ``rounds`` times round
        t <- T(b) of the running batch b = rate (E[n] + E[s]) t (at most ``cap`` [A']; below it, rate
        E[s] t decoders and rate E[n] t chunks): where ``_mixed``'s fixed point starts when no nearby
        solution is known."""
        zero = np.zeros(len(at))
        t = _priced(self.it, self.rows[at], np.ones(len(at)), self.ctx[at], zero, zero, zero)    # one decoder
        en, es = self.en[at], self.es[at]
        for _ in range(rounds):
            t = self._mean_iteration(at, np.minimum(rate * (en + es) * t, cap))
        return t, np.minimum(rate * (en + es) * t, cap)

    def _mean_iteration(self, at, running) -> np.ndarray:
        """Seconds of the mean iteration of points ``at`` at ``running`` sequences [A']: a request runs
        E[n] prompt chunks and E[s] decode steps, so ``running`` E[s] / (E[n] + E[s]) decoders and
        ``running`` E[n] / (E[n] + E[s]) mean chunks (as many as the budget has room for beside the
        decoders)."""
        en, es = self.en[at], self.es[at]
        with np.errstate(invalid="ignore", divide="ignore"):
            share = np.where(es > 0, es / (en + es), 0.0)
        dec, chunks = running * share, running * (1.0 - share)
        room = np.maximum(self.budget[at] - dec, 1.0)
        k = np.minimum(chunks, room / np.maximum(self.tok[at], 1e-300))
        c = k * self.tok[at]
        return _priced(self.it, self.rows[at], dec, dec * self.ctx[at], c, c * self.pair[at], k * self.ends[at])

    def state(self, at, x, b, t, longest, closed: bool = False, complete: bool = True) -> dict:
        """The chain of points ``at`` at throughput ``x``, running batch ``b`` and mean
        iteration ``t`` ([A']; ``longest``: the longest iteration expected): stationary
        moments [A'] and, per state ([A', J], zero past a point's last state), landing
        probabilities and own-iteration moments. A closed loop's requests arrive as others
        finish, at the end of an iteration, as many as finished in it (Poisson of mean X t,
        whatever its length): no chain, no residual. Points are taken in groups of similar
        numbers of states (``_states``: the next half power of two of the need), so that a few busy
        points do not widen every point's chain, and a point's chain that spills past its last state
        (more than ``_SPILL`` of its iterations have more arrivals than it counts, kept in the last) is
        solved again with the states it always held (``_held``: the next power of two), which it keeps
        for the chain's later calls: where nothing spills the answer is the same within the fixed
        point's tolerance, and where the queue outgrows the need (long prompts whose chunks queue past
        one iteration's arrivals) the same truncated chain as before. That truncation biases such
        queues (``tests/test_chain_solver.py``: 128k-token prompts on 8,192-token chunks, TTFT 8.5 %
        short of the converged chain at half the capacity, 30 % at 80 %): a known limit, kept.
        ``complete`` False: only what the fixed point of ``_mixed`` reads (t1, tpot, own, longest:
        no waiting, variances or first decode iteration)."""
        most = x * self.en[at] * longest          # chunks arriving in the longest iteration
        wide = 1.0 if self.dispersion is None or closed else np.maximum(self.dispersion[at], 1.0)
        if not closed:      # an open loop's prompt brings its n chunks at once: room for the largest
            wide = wide * self.batched[at]
        need = np.minimum(np.ceil(most + 6 * np.sqrt(most * wide) + 6 + (0.0 if closed else self.most_n[at])),
                          _MOST_STATES)
        size = np.maximum(_states(need), self.least[at])
        largest = _held(need)                     # where one that spills is solved again
        done = []                     # (positions in ``at``, their state, which of its rows they are)
        todo = np.arange(len(at))
        while len(todo):
            grow = []
            for kmax in np.unique(size[todo]).astype(int):
                idx = todo[size[todo] == kmax]
                per = max(_STATE_ELEMENTS // (kmax + 1) ** 2, 1)          # points a call: bounded memory
                for part in (idx[lo:lo + per] for lo in range(0, len(idx), per)):
                    got = self._state(at[part], x[part], b[part], t[part], kmax, closed, complete)
                    spilt = (got.pop("spill") > _SPILL) & (kmax < largest[part])
                    grow.append(part[spilt])
                    done.append((part[~spilt], got, ~spilt))
            todo = np.concatenate(grow)
            if len(todo):             # a chain that spills past its last state: the states it held, from now on
                size[todo] = largest[todo]
                self.least[at[todo]] = size[todo]
        if len(done) == 1 and len(done[0][0]) == len(at):
            return done[0][1]
        out = {}
        for idx, got, kept in done:
            for key, v in got.items():
                if key not in out:          # by state (the first decode iterations' excesses: by step)
                    width = self.exact_steps + 1 if key == "excess" else int(size.max()) + 1
                    out[key] = np.zeros((len(at),) + ((width,) if v.ndim == 2 else ()))
                if v.ndim == 2:
                    out[key][idx, :v.shape[1]] = v[kept]
                else:
                    out[key][idx] = v[kept]
        return out

    @staticmethod
    def _crowded(dec) -> np.ndarray:
        """The decoders an open loop's iteration holds at five normal nodes about ``dec`` (their
        count Poisson), then ``dec`` itself, [A', 6]: where ``_crowding`` prices the iteration."""
        spread = np.sqrt(np.maximum(dec, 0.0))[:, None] * _NODES[None, :]
        return np.concatenate([np.maximum(dec[:, None] + spread, 0.0), dec[:, None]], axis=1)

    @staticmethod
    def _crowding(dec, d, times) -> np.ndarray:
        """E[d T(d)] / (E[d] T(E[d])) of a decoding iteration whose d sequences vary as in an
        open loop (Poisson about ``dec``, at the five normal nodes of ``_crowded``, ``d`` [A', 6],
        the iteration ``times`` there): how much longer the iterations a sequence decodes in are
        than the mean one (more for a mixture of experts, whose next token touches new
        experts), [A']."""
        weight = _NODE_WEIGHTS[None, :] * d[:, :-1]
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = (weight * times[:, :-1]).sum(axis=1) / (weight.sum(axis=1) * times[:, -1])
        return np.where(np.isfinite(ratio) & (dec > 0), ratio, 1.0)

    def _state(self, at, x, b, t, kmax: int, closed: bool, complete: bool = True) -> dict:
        """``state`` of points ``at`` with ``kmax`` + 1 states (``complete`` False: only t1, tpot,
        own and longest)."""
        r = self.rows[at]
        k = np.arange(kmax + 3)[None, :]
        ks, spread = _sampled(kmax + 2)                      # priced at a few k, linear between
        disp = None if self.dispersion is None or closed else self.dispersion[at]
        if not closed and np.any(self.en[at] > 1):   # a prompt's n chunks come at once: E[n^2] / E[n] the variance
            disp = (1.0 if disp is None else disp) * self.batched[at]

        def arrivals(mean, per_row: int = 1, since_one: bool = False):
            """Arrival counts of means ``mean`` (``per_row`` of them a point, raveled); ``since_one``:
            those that follow an arrival (an ordinary renewal process) rather than a random instant."""
            return arrival_counts(mean, kmax, None if disp is None else np.repeat(disp, per_row), since_one)
        dec = np.where(self.es[at] > 0, np.maximum(b - x * t * self.en[at], 0.0), 0.0)   # none: a prefill pool
        # the chain counts chunks: a prompt cut into n comes as n of them (n = 1 unchunked, or fitting)
        x = x * self.en[at]
        room = np.maximum(self.budget[at] - dec, 1.0)
        chunk = np.minimum(ks * self.tok[at][:, None], room[:, None])    # (the prompts it ends: as many as fit)
        parts = [np.broadcast_to(v, chunk.shape) for v in (dec[:, None], (dec * self.ctx[at])[:, None], chunk,
                                                            chunk * self.pair[at][:, None],
                                                            chunk / np.maximum(self.tok[at], 1e-300)[:, None] * self.ends[at][:, None])]
        if not closed:         # and (one call) the decoding iterations ``_crowding`` weighs
            crowd = self._crowded(dec)
            none = np.zeros_like(crowd)
            parts = [np.concatenate([v, c], axis=1) for v, c in zip(parts, (crowd, crowd * self.ctx[at][:, None],
                                                                          none, none, none))]
        times = first = _priced(self.it, r, *parts)
        if not closed:
            times, crowd_times = times[:, :chunk.shape[1]], times[:, chunk.shape[1]:]
            times = first = np.ascontiguousarray(times)
        pf = ~self.chunked[at]
        if pf.any():           # prefill-first: k whole prompts in an iteration of their own; none: a decoding one
            alone = np.zeros_like(times)
            t_dec = np.zeros(len(at))
            zero = np.zeros(1)
            whole = np.minimum(ks, np.maximum(np.floor(self.budget[at][pf] / self.whole[at][pf]), 1.0)[:, None])
            alone[pf] = _priced(self.it, r[pf], zero, zero, whole * self.whole[at][pf][:, None],
                                whole * self.whole_pairs[at][pf][:, None], whole)   # as many as the budget holds
            bb = np.maximum(b[pf], 1e-9)
            t_dec[pf] = _priced(self.it, r[pf], bb, bb * self.ctx[at][pf], zero, zero, zero)
            times = np.where(pf[:, None], np.where(ks > 0, alone, t_dec[:, None]), times)
            first = np.where(pf[:, None], alone, first)
        times, first = (np.einsum("as,sk->ak", v, spread) for v in (times, first))   # row by row
        # prompts past the budget wait for the next iteration: the share of a k-prompt iteration's
        # tokens that does not fit (prompt sizes spread; normal partial expectation), one more iteration
        first = first + _overflow(k * self.tok[at][:, None], k * self.chunk_var[at][:, None], room[:, None]) * t[:, None]
        tau = times[:, :-2]
        a, j = len(at), np.arange(kmax + 1)
        # prompts an iteration takes: what its budget holds (the rest wait for the next); chunked,
        # a part of one as well (a fraction), prefill-first only whole ones
        fit = np.where(pf, np.floor(self.budget[at] / np.maximum(self.whole[at], 1e-300)),
                       room / np.maximum(self.tok[at], 1e-300))
        fit = np.maximum(fit, 1.0)
        most = np.minimum(fit, kmax + 1)                      # prompts one's own iteration holds at most
        at_most = _at_count(first, most[:, None])[0][:, 0]     # ... its seconds (a full iteration)
        if closed:
            spill = np.zeros(a)     # Poisson arrivals, the states six deviations past their mean
            # arrivals at an iteration's end, as many as finished in it, whatever its length: every
            # state alike, so one's own iteration and what it waits for are vectors over the counts
            pi = _poisson(x * t, kmax)
            t1 = (pi * tau).sum(axis=1)
            landing = pi
            tpot = np.where(pf, t1 / np.maximum(pi[:, 0], 1e-12), t1)
            at_count, one_more = _at_count(first, np.minimum(j[None, :] + 1.0, most[:, None]))
            row = np.ones((1, kmax + 1))
            own = (pi * at_count).sum(axis=1)[:, None] * row
            if not complete:
                return {"t1": t1, "tpot": tpot, "own": (landing * own).sum(axis=1), "longest": tau.max(axis=1),
                        "spill": spill}
            own2 = (pi * at_count ** 2).sum(axis=1)[:, None] * row
            more = (pi * one_more).sum(axis=1)[:, None] * row
            ahead = arrivals((x[:, None] * tau / 2.0).ravel(), kmax + 1, since_one=True).reshape(a, kmax + 1, kmax + 1)
            waits = np.floor(j[None, :] / fit[:, None])
            wait = (ahead @ waits[:, :, None])[..., 0] * at_most[:, None]
            wait2 = (ahead @ (waits ** 2)[:, :, None])[..., 0] * at_most[:, None] ** 2
        else:               # state: prompts waiting; the unserved ones stay (a fraction: by chance), arrivals join
            carry = np.maximum(j[None, :] - fit[:, None], 0.0)
            arrive = arrivals((x[:, None] * tau).ravel(), kmax + 1).reshape(a, kmax + 1, kmax + 1)
            low = np.floor(carry).astype(np.int64)
            part = carry - low
            now, later = _shifted_pairs(arrive)(low)
            trans = (1.0 - part)[:, :, None] * now + part[:, :, None] * later
            fold = np.maximum(1.0 - trans.sum(axis=2), 0.0)    # arrivals past the last state, kept in it
            trans[:, :, -1] += fold
            pi = _stationary(trans)
            spill = (pi * fold).sum(axis=1)
            t1 = (pi * tau).sum(axis=1)
            landing = pi * tau / t1[:, None]
            # a token per iteration, or prefill-first: per decoding iteration (state 0) only; a
            # sequence sees iterations in proportion to the sequences decoding in them
            tpot = np.where(pf, t1 / np.maximum(pi[:, 0], 1e-12), t1) * self._crowding(dec, crowd, crowd_times)
            # one's own iteration: one's prompt beside those still waiting and the others that
            # arrived with it, as many as the budget holds (``_at_count`` at carry + j + 1, capped)
            windows = _windows(first, kmax + 1, 2)(low + 1)     # from low + 1, + 2 and + 3
            w1, w2, w3 = (windows[..., i:i + kmax + 1] for i in range(3))
            capped = (carry[:, :, None] + (j + 1.0)[None, None, :]) > most[:, None, None]
            keep = (1.0 - part)[:, :, None]
            at_count = np.where(capped, at_most[:, None, None], keep * w1 + part[:, :, None] * w2)
            company = arrive if disp is None else \
                arrivals((x[:, None] * tau).ravel(), kmax + 1, since_one=True).reshape(a, kmax + 1, kmax + 1)
            own = (company * at_count).sum(axis=2)
            if not complete:
                return {"t1": t1, "tpot": tpot, "own": (landing * own).sum(axis=1), "longest": tau.max(axis=1),
                        "spill": spill}
            beyond = _at_count(first, most[:, None])[1][:, 0]
            one_more = np.where(capped, beyond[:, None, None], keep * w2 + part[:, :, None] * w3)
            own2 = (company * at_count ** 2).sum(axis=2)
            more = (company * one_more).sum(axis=2)          # ... and one more
            # full iterations one waits for first: those ahead of it (still waiting, and half of
            # the arrivals with it), a budget's worth at a time
            ahead = arrivals((x[:, None] * tau / 2.0).ravel(), kmax + 1, since_one=True).reshape(a, kmax + 1, kmax + 1)
            waits = np.floor((carry[:, :, None] + j[None, None, :]) / fit[:, None, None])
            wait = (ahead * waits).sum(axis=2) * at_most[:, None]
            wait2 = (ahead * waits ** 2).sum(axis=2) * at_most[:, None] ** 2

        mean_own = (landing * own).sum(axis=1)
        slope = ((landing * more).sum(axis=1) - mean_own) / np.maximum(np.where(pf, self.whole[at], self.tok[at]),
                                                                       1e-300)
        # prompts differ in size: an iteration of k of them varies by k chunk variances at the slope
        tau_var = k[:, :-2] * self.chunk_var[at][:, None] * slope[:, None] ** 2
        t2 = (pi * (tau ** 2 + tau_var)).sum(axis=1)
        excess, after, relax = np.zeros((a, self.exact_steps + 1)), np.zeros(a), np.zeros(a)
        if not closed:
            excess, after, relax = self._after_own(x, landing, tau, wait, mean_own, t1, tpot, pi, trans, (low, part),
                                                   arrivals, at)
            excess, after, relax = np.where(pf[:, None], 0.0, excess), np.where(pf, 0.0, after), np.where(pf, 0.0, relax)
        return {"t1": t1, "t2": t2, "tpot": tpot, "excess": excess, "after": after, "relax": relax, "own": mean_own,
                "landing": landing, "tau": tau, "tau_var": tau_var,
                "own_k": own, "own2_k": own2, "wait": wait, "wait2": wait2, "slope": slope,
                "longest": tau.max(axis=1), "spill": spill}

    def _after_own(self, x, landing, tau, wait, mean_own, t1, tpot, pi, trans, carried, arrivals, at) -> tuple:
        """An open loop's decode iterations after one's own last prompt iteration, by how much they
        exceed the stationary mean ``t1`` (``chain_excess`` from the state the first starts in,
        ``exact_steps`` of them one by one, then a geometric tail; each scaled as ``tpot`` scales
        the mean iteration: tpot / t1, the decoders' crowding). One's last prompt iteration holds
        one's own chunk and the chunks that arrived behind it (FCFS: during the rest of the
        iteration one landed in, the full iterations one waited for and one's earlier chunks;
        ``x`` in chunks/s) as far as its budget goes; the first decode iteration starts with the
        rest (``carried``: the chain's carry-over, (whole, share) by state) and the chunks that
        arrived during one's own iteration (``mean_own`` long): a long prompt that arrived
        meanwhile keeps the next iterations long for as many as it has chunks, and its excess
        ends with them (a geometric decay from the first one's excess, as before, spread it over
        every later iteration: TPOT +24.8 % against the simulator for 128k-token prompts on CP 4
        at half the capacity, +14.5 % now)."""
        a, jj = pi.shape
        behind = (landing * (tau / 2.0 + wait)).sum(axis=1) + np.maximum(self.en[at] - 1.0, 0.0) * mean_own
        came = arrivals(x * behind)
        q = np.concatenate([np.zeros((a, 1)), came[:, :-1]], axis=1)       # one's own chunk and those behind
        q[:, -1] += came[:, -1]
        low, part = carried
        during = arrivals(x * mean_own)
        now, later = _shifted_pairs(during)(low)         # (low + 1 <= jj: past it every entry falls off)
        onward = (1.0 - part)[:, :, None] * now + part[:, :, None] * later
        onward[:, :, -1] += np.maximum(1.0 - onward.sum(axis=2), 0.0)
        start = np.einsum("aj,ajk->ak", q, onward)                            # the first decode iteration's state
        scale = np.where(t1 > 0, tpot / np.maximum(t1, 1e-300), 1.0)     # as the mean one's (``tpot``)
        summed, after, relax = chain_excess(start, trans, tau, pi, self.exact_steps)
        return summed * scale[:, None], after * scale, relax


def chain_excess(start: np.ndarray, trans: np.ndarray, tau: np.ndarray, pi: np.ndarray, steps: int) -> tuple:
    """How much longer than the stationary mean the iterations of Markov chains are from the state
    distributions ``start`` [A, J] on (transitions ``trans`` [A, J, J], iterations ``tau`` [A, J]
    seconds by state, stationary distribution ``pi`` [A, J]): (the excesses of the first 0 ..
    ``steps`` summed [A, steps + 1], seconds, the i-th start P^i tau - pi tau; the next one's
    excess e [A], seconds; r [A], the share of it each later one keeps, e r^i summing to the rest
    of the total (start - pi) Z tau, Z = (I - P + 1 pi)^-1 the fundamental matrix: Kemeny and
    Snell, 'Finite Markov Chains', 1960, sec. 4.3; r = 0 where that tail is not geometric: the
    next one alone)."""
    a, jj = pi.shape
    t1 = (pi * tau).sum(axis=1)
    fundamental = np.eye(jj) - trans + pi[:, None, :]
    excess_of = np.linalg.solve(fundamental, (tau - t1[:, None])[:, :, None])[..., 0]
    total = ((start - pi) * excess_of).sum(axis=1)
    summed = np.zeros((a, steps + 1))
    state = start
    for i in range(steps):
        summed[:, i + 1] = summed[:, i] + (state * tau).sum(axis=1) - t1
        state = np.matmul(state[:, None, :], trans)[:, 0]
    after = (state * tau).sum(axis=1) - t1
    rest = total - summed[:, -1]
    with np.errstate(invalid="ignore", divide="ignore"):
        relax = np.where((after * rest > 0) & (np.abs(rest) > np.abs(after)), 1.0 - after / rest, 0.0)
    return summed, after, np.clip(np.nan_to_num(relax), 0.0, 0.999)


def _mixed(load: Load, cls: _Classes, iteration_time: IterationTime, rows, cap, *, rate=None,
           running=None, start=None) -> _Mixing:
    """The mixing regime at a Poisson ``rate`` (requests/s; the running batch follows) or at a
    fixed ``running`` batch (closed loop; the throughput follows), arrays [A]. Each
    iteration prefills the prompts that arrived during the one before beside the sequences
    decoding: the iterations are a Markov chain in the number of prompts they carry (a long
    iteration gathers more arrivals for the next, ``_Chain``); solved for its stationary
    distribution with the running batch or the throughput, each point until it settles.
    ``start``: (mean iteration, running batch) [A] to start from (an open loop's solution at a
    nearby rate; NaN: by mean values, ``_Chain.mean_value_open``; a closed loop starts from
    ``_Chain.mean_value``)."""
    a = len(rows)
    chain = _Chain(load, cls, iteration_time, rows)
    given_rate = rate is not None
    if given_rate:        # from a nearby rate's solution where one is given, else by mean values
        x = np.array(rate, dtype=float)
        near = np.zeros(a, dtype=bool) if start is None else \
            np.isfinite(start[0]) & np.isfinite(start[1]) & (start[0] > 0) & (start[1] > 0)
        t, b = np.zeros(a), np.zeros(a)
        if near.any():
            t[near], b[near] = start[0][near], np.minimum(start[1], cap)[near]
        far = np.flatnonzero(~near)
        if len(far):
            t[far], b[far] = chain.mean_value_open(far, x[far], np.broadcast_to(cap, (a,))[far])
    else:                 # the running batch's iteration by mean values
        b = np.array(running, dtype=float)
        t = chain.mean_value(b)
        x = b / (chain.iterations_per_request * t)
    longest = t.copy()
    # the unknowns u = (mean iteration, running batch or throughput), solved by Anderson
    # acceleration of depth 1 (a secant step on the residual g(u) - u), damped where it strays
    u = np.stack([t, b if given_rate else x], axis=1)
    last_g, last_f = np.zeros_like(u), np.zeros_like(u)
    started = np.zeros(a, dtype=bool)
    live = np.arange(a)
    for _ in range(_FIXED_POINT):
        if not len(live):
            break
        tl, vl = u[live, 0], u[live, 1]
        bl, xl = (vl, x[live]) if given_rate else (b[live], vl)
        st = chain.state(live, xl, bl, tl, longest[live], not given_rate, complete=False)
        stay = chain.en[live] * st["own"] + chain.es[live] * st["tpot"]   # admission to the end, seconds
        g = np.stack([st["t1"], np.minimum(xl * stay, cap[live]) if given_rate else bl / stay], axis=1)
        f = (g - u[live]) / (np.maximum(np.abs(g), np.abs(u[live])) + 1e-12)   # relative residual
        settled = np.all(np.abs(f) <= _SETTLED, axis=1)
        df = f - last_f[live]
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            theta = (f * df).sum(axis=1) / (df * df).sum(axis=1)
        theta = np.where(started[live] & np.isfinite(theta), theta, 0.0)    # first: the residual's own step
        step = g - theta[:, None] * (g - np.where(started[live][:, None], last_g[live], u[live]))
        bad = ~np.all(np.isfinite(step) & (step > 0), axis=1)
        step[bad] = 0.5 * (u[live][bad] + g[bad])
        if given_rate:
            step[:, 1] = np.minimum(step[:, 1], cap[live])
        last_g[live], last_f[live], started[live] = g, f, True
        u[live] = np.where(settled[:, None], g, step)
        longest[live] = np.maximum(st["longest"], tl)
        live = live[~settled]
    t = u[:, 0]
    if given_rate:
        b = u[:, 1]
    else:
        x = u[:, 1]
    st = chain.state(np.arange(a), x, b, t, longest, not given_rate)   # the settled state, all points
    return _Mixing(x, b, st["t1"], st["t2"], st["tpot"], st["landing"], st["tau"], st["tau_var"], st["own_k"],
                   st["own2_k"], st["wait"], st["wait2"], chain.tok,
                   st["slope"], chain.chunk_var, chain.n, not given_rate, st["excess"], st["after"], st["relax"])


def _decode_excess(m: _Mixing, steps: np.ndarray) -> np.ndarray:
    """Seconds by which ``steps`` [A, K'] decode iterations after one's own prompt exceed as many
    stationary ones (``_Mixing.excess``: the first K followed one by one, then a geometric tail),
    [A, K']; linear between whole numbers of steps (a share of a step is that share of its
    iteration). Zeros where the regime has none (a closed loop)."""
    if m.excess is None:
        return np.zeros(np.shape(steps))
    k = m.excess.shape[1] - 1
    whole = np.floor(steps)
    inside = np.clip(np.nan_to_num(whole), 0, k).astype(np.int64)      # (NaN steps: a NaN excess below)
    summed = np.take_along_axis(m.excess, inside, axis=1)
    nxt = np.take_along_axis(m.excess, np.minimum(inside + 1, k), axis=1) - summed   # the next one's excess
    r, e = m.relax[:, None], m.after[:, None]
    past = np.maximum(whole - k, 0.0)
    tail = e * (1.0 - r ** past) / (1.0 - r)
    share = steps - whole
    return np.where(whole < k, summed + share * nxt, summed + tail + share * e * r ** past)


def _mixing_mixtures(m: _Mixing, cls: _Classes, queue) -> dict:
    """TTFT, TPOT and end-to-end mixtures (mean, sd, weight) and their means [A] of the
    mixing regime. A request waits the rest of the iteration it lands in (state j, length
    tau_j, uniformly), then ``queue``, then its n_k prompt iterations, each as long as one's
    own iteration from state j, longer or shorter by its chunk's tokens beyond the mean chunk
    at the slope; it decodes s_k iterations, the mean one's length each, the first of them
    longer by ``_decode_excess`` (TPOT: their mean per request). TTFT is a mixture over the
    states (the classes' spread in its variance); TPOT and end-to-end over the classes
    (``ttft_class``: each class's TTFT mean and sd, [A, K])."""
    w = cls.weight
    queue = np.broadcast_to(np.asarray(queue, dtype=float), m.t1.shape)
    extra = (cls.work / m.n - m.tok[:, None]) * m.slope[:, None]              # [A, K] per own iteration
    var_own = np.maximum(m.own2 - m.own ** 2, 0.0)                             # [A, J]
    # TTFT of class k from state j: tau_j U + queue + n_k (own_j + extra_k)
    en = _dot(m.n, w)
    midway = 0.0 if m.closed else 1.0                   # a closed loop's arrivals wait for no iteration to end
    # the rest of an iteration of state j, landed in uniformly (its length varying: E[T^2] / 2E[T])
    with np.errstate(invalid="ignore", divide="ignore"):
        rest = np.where(m.tau > 0, (m.tau ** 2 + m.tau_var) / (2.0 * m.tau), 0.0)
        rest_var = np.where(m.tau > 0, (m.tau ** 2 + 3.0 * m.tau_var) / 3.0 - rest ** 2, 0.0)
    mean_j = midway * rest + queue[:, None] + m.wait + en[:, None] * m.own + _dot(m.n * extra, w)[:, None]
    # the classes' spread: Var_k(n_k own_j + n_k extra_k)
    ne = m.n * extra
    var_n, var_ne = _dot(m.n ** 2, w) - en ** 2, _dot(ne ** 2, w) - _dot(ne, w) ** 2
    cov = _dot(m.n * ne, w) - en * _dot(ne, w)
    within = _dot(cls.prompt_var * m.slope[:, None] ** 2, w)              # lengths spread inside a class
    class_var = np.maximum(m.own ** 2 * var_n[:, None] + var_ne[:, None] + 2.0 * m.own * cov[:, None], 0.0) \
        + within[:, None]
    var_j = (midway * np.maximum(rest_var, 0.0) + en[:, None] * var_own + class_var
             + np.maximum(m.wait2 - m.wait ** 2, 0.0))
    ttft = (m.landing * mean_j).sum(axis=1)
    # per class (for the end-to-end latency): averaged over the states
    res = midway * (m.landing * rest).sum(axis=1)
    var_res = midway * np.maximum((m.landing * (rest_var + rest ** 2)).sum(axis=1) - res ** 2, 0.0)
    own = (m.landing * m.own).sum(axis=1)
    var_own_all = np.maximum((m.landing * m.own2).sum(axis=1) - own ** 2, 0.0)
    ahead = (m.landing * m.wait).sum(axis=1)
    var_ahead = np.maximum((m.landing * m.wait2).sum(axis=1) - ahead ** 2, 0.0)
    ttft_k = (res + queue + ahead)[:, None] + m.n * np.maximum(own[:, None] + extra, 0.0)
    var_ttft_k = (var_res + var_ahead)[:, None] + m.n * var_own_all[:, None] + cls.prompt_var * m.slope[:, None] ** 2
    var_t = np.maximum(m.t2 - m.t1 ** 2, 0.0)
    wk = np.broadcast_to(w, ttft_k.shape)
    decoding = np.where(cls.steps > 0, wk, 0.0)
    tpot_sd = np.sqrt(var_t[:, None] / np.maximum(cls.steps, 1.0))
    decode_k = cls.steps * m.tpot[:, None] + np.where(cls.steps > 0, _decode_excess(m, cls.steps), 0.0)
    tpot_k = np.where(cls.steps > 0, decode_k / np.maximum(cls.steps, 1e-300), m.tpot[:, None])
    tpot = (tpot_k * decoding).sum(axis=1) / np.maximum(decoding.sum(axis=1), 1e-300)
    tpot = np.where(decoding.sum(axis=1) > 0, tpot, m.tpot)
    e2e = ttft_k + decode_k
    return {"ttft": ttft, "tpot": tpot, "e2e": _dot(e2e, w), "wait": queue + ahead, "admission": res + queue + ahead,
            "ttft_mix": (mean_j, np.sqrt(var_j), m.landing),
            "tpot_mix": (tpot_k, tpot_sd, decoding),
            "e2e_mix": (e2e, np.sqrt(var_ttft_k + cls.steps * var_t[:, None] + cls.gen_var * m.tpot[:, None] ** 2), wk),
            "ttft_class": (ttft_k, np.sqrt(var_ttft_k)),
            "ttft_wait": (m.wait, m.wait2),   # per state: the wait behind others (mean, second moment) in ttft_mix
            "admission_mix": (midway * rest + queue[:, None] + m.wait,
                              np.sqrt(midway * np.maximum(rest_var, 0.0) + np.maximum(m.wait2 - m.wait ** 2, 0.0)),
                              m.landing)}


# --------------------------------------------------------------------------- percentiles

def mixture_quantiles(mean: np.ndarray, sd: np.ndarray, weight: np.ndarray, q) -> np.ndarray:
    """Quantiles ``q`` (percent, [Q]) of mixtures of normals (sd 0: a point mass), one per row
    of ``mean``, ``sd``, ``weight`` ([A, C]; weights need not sum to 1), [A, Q]; found by
    bisection on the mixture's CDF (relative precision 2^-36 of its span). Rows of point
    masses only (no sd above 0) skip the normal CDF: their answers are the same, at a fifth of
    the cost."""
    mean, sd = np.asarray(mean, float), np.asarray(sd, float)
    w = np.asarray(weight, float) / np.maximum(np.asarray(weight, float).sum(axis=1, keepdims=True), 1e-300)
    mean, sd, w = np.broadcast_arrays(mean, sd, w)
    masses = ~np.any(sd > 0, axis=1)
    if masses.all() or not masses.any():
        return _bisected(mean, sd, w, q, smooth=not masses.all())
    out = np.empty((len(mean), len(np.atleast_1d(q))))
    out[masses] = _bisected(mean[masses], sd[masses], w[masses], q, smooth=False)
    out[~masses] = _bisected(mean[~masses], sd[~masses], w[~masses], q, smooth=True)
    return out


#: halvings of ``_bisected``: the quantile to 2^-36 of the mixture's span
_HALVINGS = 36
#: Newton steps ``_bracketed`` takes at most, and the bracket's width it stops at (of the span)
_NEWTON_STEPS = 12
_NEWTON_WIDTH = 2.0 ** -40


def _mixture_cdf(x, mean, sd, w, density: bool = False):
    """The CDF at ``x`` [E] of mixtures of normals (sd 0: a point mass; ``sd`` None: every one),
    row e of ``mean``, ``sd``, ``w`` [E, C] (weights normalized), [E], summed component by
    component (every search of a percentile reads it so, so that their brackets agree bit for
    bit); with ``density``, (CDF, its density) [E]."""
    from scipy.special import ndtr  # scipy on first use: importing dse stays light
    at = x[:, None]
    if sd is None:
        return (w * (at >= mean)).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        z = (at - mean) / sd
        normal = sd > 0
        cdf = (w * np.where(normal, ndtr(z), at >= mean)).sum(axis=1)
        if not density:
            return cdf
        return cdf, (w * np.where(normal, np.exp(-0.5 * z * z) / (np.sqrt(2.0 * np.pi) * sd), 0.0)).sum(axis=1)


def _bisected(mean, sd, w, q, smooth: bool) -> np.ndarray:
    """``mixture_quantiles`` of mixtures with normalized weights ``w`` [A, C], [A, Q]; ``smooth``
    False: every component a point mass (its CDF a step). Bisection of the CDF over [the lowest
    component's mean - 8 sd, the highest's + 8 sd], ``_HALVINGS`` times. Smooth mixtures first
    bracket each quantile tightly by Newton's method (``_bracketed``), then replay the bisection
    against that bracket: a midpoint below it is below the quantile, one above it above (the CDF
    does not decrease), and only a midpoint inside it has its CDF computed. The answer is the
    bisection's, bit for bit, at about a third of its CDF evaluations. Mixtures of point masses
    only (a CDF of steps) are bracketed by the step that crosses each level (``_stepped``): no
    midpoint falls inside."""
    target = np.asarray(q, float)[None, :] / 100.0                 # [1, Q]
    nq = target.shape[1]
    lo = np.min(np.where(w > 0, mean - 8 * sd, np.inf), axis=1)[:, None] * np.ones((1, nq))
    hi = np.max(np.where(w > 0, mean + 8 * sd, -np.inf), axis=1)[:, None] * np.ones((1, nq))

    rows, cols = (v.ravel() for v in np.indices(lo.shape))
    lo, hi = lo.ravel(), hi.ravel()
    left, right = _bracketed(mean, sd, w, target, lo, hi) if smooth else _stepped(mean, w, target)
    with np.errstate(invalid="ignore", divide="ignore"):
        for _ in range(_HALVINGS):
            mid = 0.5 * (lo + hi)
            under = mid <= left                      # the CDF there is below the quantile's level
            look = ~under & ~(mid >= right)          # inside the bracket (or not finite): computed
            if look.any():
                at = rows[look]
                under[look] = _mixture_cdf(mid[look], mean[at], sd[at], w[at]) < target[0, cols[look]]
            lo, hi = np.where(under, mid, lo), np.where(under, hi, mid)
    return hi.reshape(-1, nq)


def _stepped(mean, w, target) -> tuple[np.ndarray, np.ndarray]:
    """``_bracketed`` for mixtures of point masses (means ``mean``, weights ``w`` [A, C]; levels
    ``target`` [1, Q]), [E] each: the CDF is a step at each mean, so the quantile is the first
    mean (in order) whose cumulative weight reaches the level; the CDF is below it up to that mean
    (no step between it and the mean before): checked at both means with the CDF as the
    bisection sums it (component by component), the bracket then that mean and the float just
    below it; -inf and inf where a check fails or a mean is not finite (the bisection's own steps
    decide there)."""
    a, c = mean.shape
    nq = target.shape[1]
    order = np.argsort(mean, axis=1, kind="stable")
    ms, ws = np.take_along_axis(mean, order, axis=1), np.take_along_axis(w, order, axis=1)
    cum = np.cumsum(ws, axis=1)
    at = np.minimum((cum[:, :, None] < target[:, None, :]).sum(axis=1), c - 1)       # [A, Q]
    right = np.take_along_axis(ms, at, axis=1)
    below = np.where(ms[:, :, None] < right[:, None, :], ms[:, :, None], -np.inf).max(axis=1)   # [A, Q]
    def cdf(x):
        return np.stack([_mixture_cdf(x[:, j], mean, None, w) for j in range(nq)], axis=1)
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(right) & np.all(np.isfinite(mean) | (w == 0), axis=1)[:, None] \
            & (cdf(right) >= target) & ~(cdf(below) >= target)
    # below the quantile's mean the CDF is the one at the mean before it (no step between)
    left = np.where(ok, np.nextafter(right, -np.inf), -np.inf)
    return left.reshape(a * nq), np.where(ok, right, np.inf).reshape(a * nq)


def _bracketed(mean, sd, w, target, lo, hi) -> tuple[np.ndarray, np.ndarray]:
    """(left, right) [E]: for each quantile (mixture ``E // Q`` of ``mean``, ``sd``, ``w``,
    level ``target[0, E % Q]``; every component a normal or a point mass) an interval whose
    left end's CDF is below the level and whose right end's is not, found within (``lo``,
    ``hi``) by Newton's method on the CDF (its density the slope), each step kept inside the
    bracket so far (else its middle) and carried half the stopping width past the Newton point
    so that the bracket closes from both sides; -inf and inf where none is found (a bound not
    finite, a level outside the CDF at the ends)."""
    from scipy.special import ndtri  # scipy on first use: importing dse stays light
    nq = target.shape[1]
    rows, cols = np.divmod(np.arange(len(lo)), nq)
    level = target[0, cols]
    left, right = np.full(len(lo), -np.inf), np.full(len(lo), np.inf)
    ok = np.isfinite(lo) & np.isfinite(hi) & (hi > lo)
    live = np.flatnonzero(ok)
    a, b = lo[live], hi[live]
    # the start: the quantile of the normal of the mixture's mean and variance
    with np.errstate(invalid="ignore"):
        mu = (w * np.where(w > 0, mean, 0.0)).sum(axis=1)
        var = (w * np.where(w > 0, sd * sd + mean * mean, 0.0)).sum(axis=1) - mu * mu
        guess = mu[rows[live]] + np.sqrt(np.maximum(var, 0.0))[rows[live]] * ndtri(level[live])
    x = np.where(np.isfinite(guess) & (guess > a) & (guess < b), guess, 0.5 * (a + b))
    width = (b - a) * _NEWTON_WIDTH
    for _ in range(_NEWTON_STEPS):
        if not len(live):
            break
        at = rows[live]
        cdf, pdf = _mixture_cdf(x, mean[at], sd[at], w[at], density=True)
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            under = cdf < level[live]
            a, b = np.where(under, x, a), np.where(under, b, x)
            newton = x - (cdf - level[live]) / pdf
            newton = newton + np.sign(newton - x) * 0.5 * width
        x = np.where(np.isfinite(newton) & (newton > a) & (newton < b), newton, 0.5 * (a + b))
        left[live], right[live] = a, b
        keep = (b - a) > width
        live, a, b, x, width = live[keep], a[keep], b[keep], x[keep], width[keep]
    return left, right


# --------------------------------------------------------------------------- steady state

def _full(load: Load, cls: _Classes, iteration_time: IterationTime, rows) -> dict[str, np.ndarray]:
    """The engine kept full by a queue (chunked prefill): every iteration fills its token
    budget B, its d decoders first and p prompt tokens in the rest. In a steady state each
    request brings c computed prompt tokens and s decode steps (means over the classes), so
    p / c prompts finish an iteration and d = (p / c) s decode: p = B c / (c + s), d = B s /
    (c + s). Returns x (requests/s: (p / c) / T, the most a chunked engine serves whatever
    its concurrency, [A]), T (seconds of such an iteration), b (sequences in the engine: the
    d decoding, the p / c prefilling and the one a chunk boundary splits) and steps (s)."""
    w = cls.weight
    c = np.maximum(_dot(cls.work, w), 1e-300)
    s = _dot(cls.steps, w)
    budget = load.token_budget
    p = budget * c / (c + s)
    d = budget - p
    ctx = cls.decode_keys()
    pair = cls.pairs_per_token()
    ends = p / c
    t = _priced(iteration_time, rows, d, d * ctx, p, p * pair, ends)
    # pipelined streams: every iteration holds prompts, one endless phase (``_pipeline_phase``): the
    # stages stay busy and an iteration lasts its pass, the fill never paid (no phase edges)
    t, _ = _pipeline_phase(load, t, ends, p, t)
    return {"x": ends / t, "T": t, "b": d + ends + 1.0, "steps": s}


def _busy(running, load: Load, cls: _Classes, iteration_time: IterationTime, rows) -> dict[str, np.ndarray]:
    """A closed loop of ``running`` requests [A] (chunked prefill) with prompts waiting most
    of the time, their lengths spread: an iteration takes its d decoders and what it can of
    the prompt tokens S the other N - d requests still hold, p = min(S, B - d). S is taken
    normal (mean (N - d) c, variance (N - d) Var(c): the prompts' spread), and the decoders
    follow the prompts finished, d = s p / c (s: decode steps a request), solved for the mean
    p by bisection (p - E[min(S, B - d)] grows with p). The engine is then full (p = B - d)
    with the probability P(S >= B - d), else it holds the rest of the backlog: both iterations
    priced, the mean T = their mix. Returns x ((p / c) / T, requests/s), T (seconds: what a
    decoder waits a token), b (``running``) and steps (s), as ``_full``, and full (the share
    of the time in full iterations: P(S >= B - d) at the mean p, weighted by their length,
    [A]); with no spread and
    N past the full engine's d + p / c it is ``_full``'s engine."""
    from scipy.special import ndtr  # scipy on first use: importing dse stays light
    w = cls.weight
    c = np.maximum(_dot(cls.work, w), 1e-300)
    s = _dot(cls.steps, w)
    var = np.maximum(_dot(cls.work ** 2, w) - c ** 2, 0.0) + _dot(cls.prompt_var, w)
    budget = load.token_budget
    n = np.asarray(running, dtype=float)

    def backlog(p):
        d = s * p / c
        m = np.maximum(n - d, 0.0)
        return d, budget - d, m * c, m * var

    lo, hi = np.zeros_like(n), budget * c / (c + s)
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        _, room, mean, v = backlog(mid)
        short = mid < mean * (1.0 - _overflow(mean, v, room))
        lo, hi = np.where(short, mid, lo), np.where(short, hi, mid)
    p = 0.5 * (lo + hi)
    d, room, mean, v = backlog(p)
    with np.errstate(invalid="ignore", divide="ignore"):
        full = np.where(v > 0, ndtr((mean - room) / np.sqrt(v)), (mean >= room).astype(float))
    full = np.clip(np.where(p >= room * (1 - 1e-9), 1.0, full), 0.0, 1.0)
    part = np.clip(np.where(full < 1, (p - full * room) / np.maximum(1.0 - full, 1e-300), 0.0), 0.0, room)
    ctx = cls.decode_keys()
    pair = cls.pairs_per_token()
    toks = np.stack([room, part], 1)
    t = _priced(iteration_time, rows, d[:, None], (d * ctx)[:, None], toks, toks * pair[:, None], toks / c[:, None])
    mean = full * t[:, 0] + (1.0 - full) * t[:, 1]
    return {"x": (p / c) / mean, "T": mean, "b": n, "steps": s, "full": full * t[:, 0] / mean}


def _full_mixtures(f: dict, cls: _Classes) -> dict:
    """Means and mixtures (mean, sd, weight) [A, K] of the full engine (``_full``) with its
    ``b`` sequences in it (before any queue): by Little's law a request stays b / x in the
    engine, its s decode steps an iteration each, the rest to its first token."""
    t, x = f["T"], f["x"]
    ttft = np.maximum(f["b"] / x - f["steps"] * t, t)
    e2e = ttft[:, None] + cls.steps * t[:, None]
    wk = np.broadcast_to(cls.weight, e2e.shape)
    zero = np.zeros_like(e2e)
    return {"x": x, "b": f["b"], "ttft": ttft, "tpot": t,
            "ttft_mix": (ttft[:, None] + zero, zero, wk),
            "tpot_mix": (t[:, None] + zero, zero, np.where(cls.steps > 0, wk, 0.0)),
            "e2e_mix": (e2e, np.sqrt(cls.gen_var) * t[:, None], wk)}


def _little(out: dict, running, cls: _Classes) -> dict:
    """``out`` (a closed loop at ``running`` sequences) with Little's law kept: a request
    stays running / x from admission to its last token. Where the latencies leave part of
    that, it waits for its first token (its TTFT and end-to-end mixtures delayed by it);
    where they are longer, the throughput is running / their end-to-end latency."""
    e2e = out["ttft"] + cls.mean(cls.steps) * out["tpot"]
    x = np.minimum(out["x"], running / np.maximum(e2e, 1e-300))
    gap = np.maximum(running / x - e2e, 0.0)
    return {**out, "x": x, "ttft": out["ttft"] + gap, "ttft_mix": _with_queue(out["ttft_mix"], gap),
            "e2e_mix": _with_queue(out["e2e_mix"], gap)}


def _closed_loop(running, load: Load, cls: _Classes, iteration_time: IterationTime, rows, cap) -> dict:
    """A closed loop at ``running`` sequences [A]: waves for one length class, else mixing;
    chunked, never more than the full engine serves (``_full``), and where ``running`` is
    more than a full engine holds, the full engine (the rest wait). Lengths spread (mixing),
    where the mixing regime would serve more than the full engine, the engine is busy
    (``_busy``): full a share phi of its time, mixing the rest (held to the busy engine's
    throughput, which rises with the concurrency); its latencies are that mix (the latency
    mixtures' components weighted phi and 1 - phi) and Little's law gives the throughput.
    Returns x (requests/s), b (sequences running), ttft and tpot means (before any queue) and
    their mixtures."""
    spread = len(cls.weight) > 1
    if spread:
        m = _mixed(load, cls, iteration_time, rows, cap, running=running)
        out = {"x": m.x, **_mixing_mixtures(m, cls, 0.0)}
    else:
        out = _waves(running, load, cls, iteration_time, rows)
    f = _full(load, cls, iteration_time, rows)
    ch = load.chunked
    ceiling, holds = f["x"], f["b"]
    if spread:
        f = _busy(running, load, cls, iteration_time, rows)
        ceiling = np.minimum(ceiling, f["x"])
    turn = ch & ((running >= holds) | spread & (out["x"] >= ceiling))
    out["x"] = np.where(ch, np.minimum(out["x"], ceiling), out["x"])
    out = _little(out, running, cls)
    out["b"] = np.asarray(running, dtype=float)
    full = np.flatnonzero(turn)
    if not len(full):
        return out
    part = _full_mixtures({k: v[full] for k, v in f.items()}, cls.take(full))
    phi = f["full"][full] if spread else np.ones(len(full))
    steps = cls.mean(cls.steps)[full]
    ttft = phi * part["ttft"] + (1.0 - phi) * out["ttft"][full]
    tpot = phi * part["tpot"] + (1.0 - phi) * out["tpot"][full]
    x = part["b"] / (ttft + steps * tpot) if spread else part["x"]
    for k, v in (("x", x), ("b", part["b"]), ("ttft", ttft), ("tpot", tpot)):
        out[k] = out[k].copy()
        out[k][full] = v
    for k in ("ttft_mix", "tpot_mix", "e2e_mix"):
        mine = tuple(v[full] for v in out[k])
        both = tuple(np.concatenate([a, b], axis=1) for a, b in zip(mine, part[k]))
        both = (both[0], both[1], np.concatenate([mine[2] * (1.0 - phi)[:, None], part[k][2] * phi[:, None]], axis=1))
        out[k] = _assign(out[k], full, both)
    return out


def _open_loop(rate, load: Load, cls: _Classes, iteration_time: IterationTime, rows, cap, start=None) -> dict:
    """An open loop at a Poisson ``rate`` [A] below capacity: the mixing regime. Returns b
    (running batch), ttft and tpot means and their mixtures, and ``solved`` (mean iteration,
    running batch: a ``start`` for ``_mixed`` at a nearby rate)."""
    m = _mixed(load, cls, iteration_time, rows, cap, rate=rate, start=start)
    return {"b": m.b, "solved": (m.t1, m.b), **_mixing_mixtures(m, cls, 0.0)}


def _with_queue(mix, queue):
    """A latency mixture delayed by ``queue`` [A] seconds."""
    return (mix[0] + queue[:, None], mix[1], mix[2])


def _assign(mix, idx, part):
    """``mix`` (mean, sd, weight) [P, C] with rows ``idx`` replaced by ``part`` ([A, K]); the
    component axis widened to the larger of the two (zero-weight padding)."""
    width = max(mix[0].shape[1], part[0].shape[1])
    out = []
    for whole, piece in zip(mix, part):
        full = np.zeros((whole.shape[0], width))
        full[:, :whole.shape[1]] = whole
        full[idx] = 0.0
        full[idx, :piece.shape[1]] = piece
        out.append(full)
    return tuple(out)


#: the requests of a finite run whose waits are priced (``burst_waits``), evenly spread over its arrivals
_BURST_SAMPLES = 64


def burst_waits(prompts, running, x, rate, prefill) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The waits of a finite run of ``prompts`` requests [P] arriving at ``rate`` requests/s [P] (at
    or past what the engine serves; 10^12: all at once) at an engine that runs ``running`` [P] of
    them at once, completes ``x`` requests/s [P] so and prefills a prompt in ``prefill`` seconds [P]
    when nothing but prompts runs. The first ``running`` are admitted as they come, but their prompts
    queue for the prefill one after another: the j-th (from 0) waits j (prefill - 1 / rate) more than
    in the steady state (none where they come slower than that). Each of the ``running`` places then
    serves the queue in arrival order, a request every E = running / x seconds (Little's law): the
    i-th request, its place's k-th (k = floor(i / running), j = i mod running), starts k (E - running
    / rate) after its own arrival, and later by its place's first's prefill wait. Returns (wait,
    weight, last, rest) [P, S] (seconds, shares of the requests, whether in the last turn, when no
    prompt comes to take a place it frees, and the seconds of prefill the requests after it bring)
    of ``_BURST_SAMPLES`` requests spread evenly over the arrivals (every one of a smaller run, zero
    weight past its end)."""
    n = np.maximum(np.floor(np.asarray(prompts, dtype=float)), 1.0)[:, None]
    per = np.maximum(np.floor(np.asarray(running, dtype=float)), 1.0)[:, None]
    m = np.arange(_BURST_SAMPLES, dtype=float)[None, :]
    many = n > _BURST_SAMPLES
    i = np.where(many, np.floor((m + 0.5) * n / _BURST_SAMPLES), m)
    weight = np.where(many, 1.0 / _BURST_SAMPLES, np.where(m < n, 1.0 / n, 0.0))
    with np.errstate(divide="ignore"):
        gap = 1.0 / np.asarray(rate, dtype=float)[:, None]
    turn = np.maximum(per / np.asarray(x, dtype=float)[:, None] - per * gap, 0.0)
    rush = np.maximum(np.asarray(prefill, dtype=float)[:, None] - gap, 0.0)
    k = np.floor(i / per)
    last = k >= np.ceil(n / per) - 1.0
    return k * turn + (i - k * per) * rush, weight, last, (n - 1.0 - i) * np.asarray(prefill, dtype=float)[:, None]


def _delayed(mix, wait, weight) -> tuple:
    """A latency mixture (mean, sd, weight) [A, C] whose requests wait as ``burst_waits`` says
    (wait, weight) [A, S]: [A, C x S]."""
    m, sd, w = (np.asarray(a, dtype=float) for a in mix)
    a = len(m)
    return ((m[:, :, None] + wait[:, None, :]).reshape(a, -1),
            np.broadcast_to(sd[:, :, None], (a, sd.shape[1], wait.shape[1])).reshape(a, -1),
            (w[:, :, None] * weight[:, None, :]).reshape(a, -1))


def steady_state(load: Load, iteration_time: IterationTime, high_share=None) -> dict[str, np.ndarray]:
    """Serving metrics of every design point (arrays [P], SI units): ttft_s, tpot_s,
    e2e_latency_s (means) and their percentiles (``ttft_p90_s``, ... for ``PERCENTILES``),
    queue_s (mean wait before admission), requests_per_s, output_tokens_per_s,
    total_tokens_per_s, running_batch (mean sequences running), kv_utilization (share of
    KV blocks held), saturated (bool: the open loop's rate is past what the engine serves;
    its queue and TTFT grow without bound; a finite run, ``load.prompts`` requests, is not: its
    requests queue and drain, ``burst_waits``, the engine at min(prompts, its running cap) meanwhile,
    as a closed loop there). With ``high_share`` ([P], NaN: FCFS) each priority
    class's TTFT percentiles too (``ttft_high_p90_s``, ``ttft_low_p90_s``, ...: ``_class_percentiles``)."""
    n = len(load.kv_block)
    rows = np.arange(n)
    cls = _classes(load)
    cap = np.maximum(running_cap(load), 1.0)      # a cache holding no request is refused by the caller
    closed = np.isfinite(load.concurrency)
    rate = np.nan_to_num(load.request_rate, nan=0.0)
    conc = np.nan_to_num(load.concurrency, nan=1.0)
    b = np.where(closed, np.minimum(conc, cap), cap)      # closed loop; open: its ceiling
    hits = _tier_hits(load)
    c = _closed_loop(b, load, *_tiered(load, cls, iteration_time, b, hits), rows, cap)
    capacity = c["x"]
    b = np.where(closed, c["b"], b)
    saturated = ~closed & (rate >= capacity)
    queue = np.where(closed, np.maximum(conc - b, 0.0) / capacity, 0.0)
    x, ttft, tpot = capacity.copy(), c["ttft"] + queue, c["tpot"].copy()
    e2e_open = np.full(n, np.nan)
    wait = queue.copy()                           # waits behind others: a closed loop's queue, an open loop's prompts ahead
    admission = queue.copy()                      # arrival to admission (an open loop: the rest of an iteration too)
    mix = {"ttft_mix": _with_queue(c["ttft_mix"], queue), "tpot_mix": c["tpot_mix"],
           "e2e_mix": _with_queue(c["e2e_mix"], queue)}
    waits = None                                  # the open loops' waits behind others in ttft_mix's components
    opened = np.flatnonzero(~closed & ~saturated)
    if len(opened):
        o_cls, o_time = _tiered(load, cls, iteration_time, cap * np.minimum(rate / capacity, 1.0), hits)
        o = _open_loop(rate[opened], load.take(opened), o_cls.take(opened), o_time, opened, cap[opened])
        x[opened], ttft[opened], tpot[opened], b[opened] = rate[opened], o["ttft"], o["tpot"], o["b"]
        e2e_open[opened] = o["e2e"]
        wait[opened], admission[opened] = o["wait"], o["admission"]
        for k in mix:
            mix[k] = _assign(mix[k], opened, o[k])
        waits = (opened, o["ttft_wait"], o["wait"], np.minimum(rate[opened] / capacity[opened], 1.0))
    prompts = np.zeros(n) if load.prompts is None else np.nan_to_num(load.prompts)
    finite = np.flatnonzero(saturated & (prompts > 0))
    if len(finite):          # a finite run past the capacity: its requests queue and drain (``burst_waits``)
        run = np.minimum(prompts[finite], cap[finite])
        running = b.copy()
        running[finite] = run
        f_cls, f_time = _tiered(load, cls, iteration_time, running, hits)
        f = _closed_loop(run, load.take(finite), f_cls.take(finite), f_time, finite, cap[finite])
        c_mean = cls.mean(cls.work)[finite]          # a prompt's computed tokens; the prefill of a budget of them
        budget = np.minimum(load.token_budget[finite], np.maximum(c_mean * run, 1.0))
        zero = np.zeros(len(finite))
        t_budget = _priced(f_time, finite, zero, zero, budget, budget * cls.pairs_per_token()[finite], budget / c_mean)
        wait_w, weight_w, last, rest = burst_waits(prompts[finite], run, f["x"], rate[finite],
                                                   t_budget * c_mean / budget)
        # the last turn decodes with no prompt coming to take a place it frees: iterations of its
        # sequences alone, longer by the prefill of the prompts still to come (as much of it as
        # its decode iterations hold, a budget of prompt tokens each)
        steps = cls.mean(cls.steps)[finite]
        ctx = cls.decode_keys()[finite]
        alone = _priced(f_time, finite, run, run * ctx, zero, zero, zero)
        held = np.minimum(rest, steps[:, None] * np.maximum(t_budget - alone, 0.0)[:, None])
        faster = np.where(last, alone[:, None] + held / np.maximum(steps, 1.0)[:, None] - f["tpot"][:, None], 0.0)
        delay = (weight_w * wait_w).sum(axis=1)
        x[finite], b[finite], ttft[finite] = f["x"], run, f["ttft"] + delay
        tpot[finite] = f["tpot"] + (weight_w * faster).sum(axis=1)
        queue[finite] = wait[finite] = admission[finite] = delay
        shift = {"ttft_mix": wait_w, "tpot_mix": faster, "e2e_mix": wait_w + steps[:, None] * faster}
        for k in mix:
            mix[k] = _assign(mix[k], finite, _delayed(f[k], shift[k], weight_w))
        saturated = saturated.copy()
        saturated[finite] = False
    ttft[saturated] = np.inf
    queue[saturated] = np.inf
    g_mean, p_mean = cls.mean(cls.gen), cls.mean(cls.prompt)
    blocks = b * _blocks_per_sequence(load, cls) + cls.shared_blocks
    out = {
        "ttft_s": ttft,
        "tpot_s": tpot,
        "e2e_latency_s": np.where(np.isnan(e2e_open), ttft + cls.mean(cls.steps) * tpot, e2e_open),
        "queue_s": queue,
        "requests_per_s": x,
        "output_tokens_per_s": x * g_mean,
        "total_tokens_per_s": x * (g_mean + p_mean),
        "running_batch": b,
        "kv_utilization": np.minimum(blocks / np.maximum(load.kv_blocks, 1.0), 1.0),
        "saturated": saturated,
        "wait_s": np.where(saturated, np.inf, wait),   # seconds waited behind the requests ahead (``dse.core.scheduling``)
        "admission_s": np.where(saturated, np.inf, admission),   # seconds from arrival to admission
        "capacity_requests_per_s": capacity,            # the largest rate the engine serves
    }
    out.update(_percentiles(mix, saturated))
    if high_share is not None:
        out.update(_class_percentiles(mix["ttft_mix"], waits, np.asarray(high_share, dtype=float), saturated))
    return out


def _class_percentiles(ttft_mix, waits, high_share, saturated) -> dict[str, np.ndarray]:
    """``ttft_high_p50_s`` ... ``ttft_low_p99_s`` [P], seconds: each non-preemptive priority class's
    TTFT percentiles (``dse.core.scheduling.class_ttft_mixes``: the FCFS wait in each component of
    ``ttft_mix`` scaled to the class's Cobham mean, at the load ``goodput`` holds each class's SLO to)
    at the unsaturated open loops ``waits`` = (their rows, their components' waits (mean, second
    moment), their mean wait, their rate over capacity), where ``high_share`` is finite; infinite
    where saturated; NaN elsewhere (FCFS points, closed loops)."""
    out = {k: np.where(saturated & np.isfinite(high_share), np.inf, np.nan) for k in CLASS_PERCENTILES}
    if waits is None:
        return out
    rows, parts, wait, rho = waits
    keep = np.isfinite(high_share[rows])
    if not keep.any():
        return out
    at = rows[keep]
    classes = class_ttft_mixes(tuple(m[at] for m in ttft_mix), tuple(w[keep] for w in parts), wait[keep], rho[keep],
                               high_share[at])
    for c, m in zip(("high", "low"), classes):
        qs = mixture_quantiles(*m, PERCENTILES)
        for j, q in enumerate(PERCENTILES):
            out[f"ttft_{c}_p{q}_s"][at] = qs[:, j]
    return out


def _capacity(load: Load, iteration_time: IterationTime) -> tuple:
    """(the length classes, the running cap [P], the prefix hits (``_tier_hits``), the capacity [P],
    requests/s: a closed loop at the running cap) of points served under a Poisson rate: what an
    open loop's rate is a share of."""
    cls = _classes(load)
    cap = np.maximum(running_cap(load), 1.0)
    hits = _tier_hits(load)
    capacity = _closed_loop(cap, load, *_tiered(load, cls, iteration_time, cap, hits), np.arange(len(cap)), cap)["x"]
    return cls, cap, hits, capacity


def admission_tail(load: Load, iteration_time: IterationTime, seconds) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(P(a request waits more than ``seconds`` [P] from arrival to admission), the mean wait behind
    the prompts ahead (seconds), the mean wait from arrival to admission (seconds)), [P] each, in each
    point's FCFS open loop (the mixing regime: the rest of the iteration it lands in, then the prompts
    ahead; per state a normal of their mean and variance, weighted by the landing probability); 1,
    inf, inf where the rate is past the capacity; 0, 0, 0 in a closed loop."""
    from scipy.special import ndtr  # scipy on first use: importing dse stays light
    cls, cap, hits, capacity = _capacity(load, iteration_time)
    rate = np.nan_to_num(load.request_rate, nan=0.0)
    over = rate >= capacity
    tail, wait, admission = np.where(over, 1.0, 0.0), np.where(over, np.inf, 0.0), np.where(over, np.inf, 0.0)
    opened = np.flatnonzero(~np.isfinite(load.concurrency) & (rate > 0) & ~over)
    if len(opened):
        o_cls, o_time = _tiered(load, cls, iteration_time, cap * np.minimum(rate / capacity, 1.0), hits)
        o = _open_loop(rate[opened], load.take(opened), o_cls.take(opened), o_time, opened, cap[opened])
        mean, sd, w = o["admission_mix"]
        x = np.asarray(seconds, dtype=float)[opened][:, None]
        with np.errstate(invalid="ignore", divide="ignore"):
            above = np.where(sd > 0, 1.0 - ndtr((x - mean) / sd), (mean > x).astype(float))
        tail[opened] = (w * above).sum(axis=1) / np.maximum(w.sum(axis=1), 1e-300)
        wait[opened], admission[opened] = o["wait"], o["admission"]
    return tail, wait, admission


def overhead_in_flight(concurrency, running, x, e2e, overhead) -> tuple[np.ndarray, np.ndarray]:
    """(throughput scale, seconds of queueing replaced) of a fixed ``overhead`` (seconds) every
    request spends before the scheduler sees it, arrays [P], for an engine serving ``x``
    requests/s with ``running`` sequences and a mean end-to-end ``e2e`` (seconds, the overhead
    excluded) at ``concurrency`` (NaN: an open loop, unchanged: its arrivals only come later).
    A closed loop keeps Little's law with it: N requests in flight, each the overhead plus its
    time in the engine. Where the engine holds all N (no queue) a request's overhead is time the
    engine does not have it: X = N / (end-to-end + overhead), exact for one request and for a
    cohort the engine serves together and then waits for. Where requests queue for admission,
    the overhead is spent in place of as much queueing (the engine stays full: a saturated
    engine's throughput is unchanged): the queue's wait (N - running) / X, up to the overhead,
    is replaced. Arrivals are taken at iteration boundaries as without the overhead (the
    simulator's ``request_overhead_s`` lands them inside iterations, a phase this leaves out)."""
    conc = np.asarray(concurrency, dtype=float)
    o = np.broadcast_to(np.asarray(overhead, dtype=float), conc.shape)
    closed = np.isfinite(conc) & (o > 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        queued = np.nan_to_num(np.maximum(conc - running, 0.0) / x, nan=0.0, posinf=0.0)
        hidden = np.where(closed, np.minimum(o, queued), 0.0)
        scale = np.where(closed, e2e / (e2e + o - hidden), 1.0)
    return scale, hidden


def with_request_overhead(out: dict, concurrency, overhead) -> dict:
    """``out`` (``steady_state``'s metrics, or any engine's of that form, [P]) with a fixed
    ``overhead`` (seconds [P] or scalar) spent by every request (``overhead_in_flight``), which
    the caller adds to TTFT and end-to-end: the throughputs scaled, TTFT, end-to-end and queue
    (means and percentiles) less the queueing the overhead replaced."""
    if not np.any(np.isfinite(np.asarray(concurrency, dtype=float)) & (np.asarray(overhead) > 0)):
        return out
    scale, hidden = overhead_in_flight(concurrency, out["running_batch"], out["requests_per_s"],
                                       out["e2e_latency_s"], overhead)
    out = dict(out)
    for k in ("requests_per_s", "output_tokens_per_s", "total_tokens_per_s"):
        out[k] = out[k] * scale
    for k in [k for k in out if k.startswith(("ttft_", "e2e_latency_")) or k == "queue_s"]:
        out[k] = out[k] - hidden
    return out


def _percentiles(mix: dict, saturated) -> dict[str, np.ndarray]:
    """``ttft_p50_s`` ... ``e2e_latency_p99_s`` of the mixtures (infinite TTFT and end-to-end
    where saturated)."""
    out = {}
    for name, key in (("ttft", "ttft_mix"), ("tpot", "tpot_mix"), ("e2e_latency", "e2e_mix")):
        qs = mixture_quantiles(*mix[key], PERCENTILES)
        for j, p in enumerate(PERCENTILES):
            out[f"{name}_p{p}_s"] = np.where(saturated, np.inf, qs[:, j]) if name != "tpot" else qs[:, j]
    return out


def goodput(load: Load, iteration_time: IterationTime, slo_ttft, slo_tpot, percentile, classes=None) -> np.ndarray:
    """The largest Poisson request rate (requests/s, [P]) at which the ``percentile``-th
    TTFT is at most ``slo_ttft`` and the TPOT's at most ``slo_tpot`` (seconds; 0 or NaN: no
    such SLO), below the capacity (requests/s with the running batch at its cap); 0 where
    even a trickle misses them. Bisection over the rate (precision capacity / 2^12), each rate's
    open loop solved from the secant through the two rates tried before it (the answer is the
    bisection's, whatever the start: only the fixed point's path to it is shorter).
    ``classes`` (None: one class): (high share [P], the high class's TTFT SLO [P], seconds, 0: its
    ``slo_ttft`` too) of non-preemptive priority classes (``dse.core.scheduling.class_ttft_mixes``,
    NaN share: FCFS at that point): each class's TTFT percentile held to its own SLO."""
    n = len(load.kv_block)
    cls, cap, hits, capacity = _capacity(load, iteration_time)
    ttft_slo = np.where(np.nan_to_num(slo_ttft) > 0, slo_ttft, np.inf)
    tpot_slo = np.where(np.nan_to_num(slo_tpot) > 0, slo_tpot, np.inf)
    q = np.asarray(percentile, float)
    # each point's open loop at the two rates tried last (rate, mean iteration, running batch), the
    # next solved from their secant; the first tried is the capacity, where the running batch is the
    # cap and an iteration gives each of them a step: the mean iteration cap / (x (E[n] + E[s]))
    chain = _Chain(load, cls, iteration_time, np.arange(n))
    with np.errstate(divide="ignore", invalid="ignore"):
        tried = [np.full((3, n), np.nan), np.stack([capacity, cap / (capacity * chain.iterations_per_request), cap])]
    trickle = capacity * 2.0 ** -_GOODPUT_STEPS           # the least rate ``largest_rate`` tries

    def start(rate, idx):
        """(mean iteration, running batch) [A'] to start the open loop at ``rate`` from: NaN (by
        mean values, ``_Chain.mean_value_open``) for a trickle and for the first rate between the
        trickle and the capacity (the secant through those two starts far from where the load
        settles: 15 % more fixed-point steps over goodput's search), else on the secant through the
        two rates tried last (the last alone where only one is known or the secant's value is not
        positive)."""
        (r1, t1, b1), (r2, t2, b2) = (v[:, idx] for v in tried)
        with np.errstate(divide="ignore", invalid="ignore"):
            f = (rate - r2) / (r2 - r1)
            t, b = t2 + f * (t2 - t1), np.minimum(b2 + f * (b2 - b1), cap[idx])
        line = np.isfinite(t) & np.isfinite(b) & (t > 0) & (b > 0)
        t, b = np.where(line, t, t2), np.where(line, b, b2)
        idle = (rate <= trickle[idx]) | ((r2 <= trickle[idx]) & (r1 >= capacity[idx] * (1.0 - 1e-6)))
        return np.where(idle, np.nan, t), np.where(idle, np.nan, b)

    def margin(rate, idx):
        """How far the SLOs are met at ``rate`` [A'] (``_row_margin``'s least over them): >= 0 where they are."""
        running = cap.copy()
        running[idx] = cap[idx] * np.minimum(rate / capacity[idx], 1.0)
        o_cls, o_time = _tiered(load, cls, iteration_time, running, hits)
        o = _open_loop(rate, load.take(idx), o_cls.take(idx), o_time, idx, cap[idx], start=start(rate, idx))
        tried[0][:, idx] = tried[1][:, idx]
        tried[1][:, idx] = np.stack([rate, *o["solved"]])
        ttft = _row_margin(o["ttft_mix"], q[idx], ttft_slo[idx])
        if classes is not None and np.isfinite(classes[0][idx]).any():
            high, low = class_ttft_mixes(o["ttft_mix"], o["ttft_wait"], o["wait"], np.minimum(rate / capacity[idx], 1.0),
                                         np.nan_to_num(classes[0][idx], nan=0.5))
            high_slo = np.where(np.nan_to_num(classes[1][idx]) > 0, classes[1][idx], ttft_slo[idx])
            both = np.minimum(_row_margin(high, q[idx], high_slo), _row_margin(low, q[idx], ttft_slo[idx]))
            ttft = np.where(np.isfinite(classes[0][idx]), both, ttft)
        return np.minimum(ttft, _row_margin(o["tpot_mix"], q[idx], tpot_slo[idx]))

    return largest_rate(margin, capacity, _GOODPUT_STEPS)


def largest_rate(margin, capacity, steps: int) -> np.ndarray:
    """The largest rate in (0, ``capacity``) at which ``margin(rate [A'], points [A'])`` holds
    ([A'] bool, or float: how far the SLOs are met, >= 0 where they are; it holds below a point's
    answer, not above), [P] requests/s; 0 where even ``capacity`` / 2^steps misses. Bisection to
    ``capacity`` / 2^steps. A float margin first brackets each answer (``_bracket_rate``); the
    bisection is then replayed against that bracket: a midpoint at or below its lower end holds,
    one at or above its upper end does not, and only a midpoint inside it is tried. The answer is
    the bisection's (the same halvings, the same outcomes), in fewer tries of the rate."""
    def tried(rate, idx):
        got = np.asarray(margin(rate, idx))
        return got if got.dtype == bool else got.astype(float)

    def holds(got):
        return got if got.dtype == bool else got >= 0

    n = len(capacity)
    rows = np.arange(n)
    lo = np.zeros(n)
    hi = capacity * (1.0 - 1e-9)
    at_top = tried(hi, rows)
    top = holds(at_top)
    lo[top] = hi[top]
    trickle = capacity * 2.0 ** -steps
    live = rows[~top]
    met, missed = np.full(n, -np.inf), np.full(n, np.inf)      # the bracket: a rate that holds, one that does not
    if len(live):
        at_trickle = tried(trickle[live], live)
        ok = holds(at_trickle)
        lo[live[ok]] = trickle[live[ok]]
        hi[live[~ok]] = 0.0
        if at_top.dtype != bool and ok.any():
            good = live[ok]
            met[good], missed[good] = _bracket_rate(tried, trickle[good], hi[good], at_trickle[ok], at_top[good],
                                                     good, capacity[good] * 2.0 ** -(steps + 3), steps)
        live = live[ok]
    for _ in range(steps):
        if not len(live):
            break
        mid = 0.5 * (lo[live] + hi[live])
        ok = mid <= met[live]
        look = ~ok & (mid < missed[live])
        if look.any():
            ok[look] = holds(tried(mid[look], live[look]))
        lo[live] = np.where(ok, mid, lo[live])
        hi[live] = np.where(ok, hi[live], mid)
    return lo


def _bracket_rate(tried, a, b, fa, fb, idx, width, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """(a rate that holds, one that fails) [A'] about each answer of ``largest_rate`` between
    ``a`` (holds: margin ``fa`` >= 0) and ``b`` (fails: ``fb`` < 0), narrowed to ``width`` (or
    for ``steps`` tries at most) by regula falsi on the margin with the Illinois rule (an end kept
    twice running weighs half: Dowell and Jarratt, 'A modified regula falsi method for computing
    the root of an equation', BIT 11, 1971), each try kept half ``width`` inside the bracket's
    ends so that a try next to an end closes it."""
    a, b, fa, fb = (np.array(v, dtype=float) for v in (a, b, fa, fb))
    holds, fails = a.copy(), b.copy()
    kept = np.zeros(len(a))                 # the end kept last: +1 the upper (fails), -1 the lower
    live = np.arange(len(a))
    for _ in range(steps):
        live = live[b[live] - a[live] > width[live]]
        if not len(live):
            break
        la, lb, lfa, lfb, w = a[live], b[live], fa[live], fb[live], width[live]
        with np.errstate(invalid="ignore", divide="ignore"):
            x = (la * lfb - lb * lfa) / (lfb - lfa)
        x = np.where(np.isfinite(x), x, 0.5 * (la + lb))
        x = np.clip(x, la + 0.5 * w, lb - 0.5 * w)
        f = tried(x, idx[live])
        ok = f >= 0
        again = kept[live] == np.where(ok, 1.0, -1.0)
        a[live], fa[live] = np.where(ok, x, la), np.where(ok, f, lfa)
        b[live], fb[live] = np.where(ok, lb, x), np.where(ok, np.where(again, 0.5, 1.0) * lfb, f)
        fa[live] = np.where(~ok & again, 0.5 * lfa, fa[live])
        kept[live] = np.where(ok, 1.0, -1.0)
        holds[live], fails[live] = a[live], b[live]
    return holds, fails


def _row_margin(mix, q, x) -> np.ndarray:
    """How far the ``q[a]``-th percentile p of row a of mixture ``mix`` is within ``x[a]``
    (seconds), [A]: x / p - 1, its sign that of the mixture's CDF at x less q / 100 (>= 0 where
    the CDF reaches q / 100: one look instead of the bisection; they differ only where x is within
    its precision of the percentile). Linear in the load where a latency grows as 1 / (1 - load),
    as a queue's does (what ``largest_rate`` interpolates). Rows with no bound (x infinite), a
    component not finite or a percentile within 1e-9 of 0 or 100 (where the bisection stops at
    the edge of its span) take ``_row_quantile``'s answer, +-1."""
    mean, sd, weight = np.broadcast_arrays(*(np.asarray(a, float) for a in mix))
    x, q = np.asarray(x, float), np.asarray(q, float)
    target = q / 100.0
    w = weight / np.maximum(weight.sum(axis=1, keepdims=True), 1e-300)
    plain = np.isfinite(x) & (target > 1e-9) & (target < 1.0 - 1e-9) & (w > 0).any(axis=1) \
        & np.all((w == 0) | (np.isfinite(mean) & np.isfinite(sd)), axis=1)
    cdf = _mixture_cdf(x, mean, sd, w)
    out = np.where(cdf >= target, 1.0, -1.0)
    if plain.any():
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = x[plain] / _row_quantile(tuple(a[plain] for a in (mean, sd, weight)), q[plain]) - 1.0
        ratio = np.clip(np.nan_to_num(ratio, nan=0.0), -1.0, 1e6)
        out[plain] = np.where(cdf[plain] >= target[plain], np.maximum(ratio, 0.0), np.minimum(ratio, -1e-12))
    if not plain.all():
        odd = ~plain
        out[odd] = np.where(_row_quantile(tuple(a[odd] for a in (mean, sd, weight)), q[odd]) <= x[odd], 1.0, -1.0)
    return out


def _row_quantile(mix, q) -> np.ndarray:
    """The ``q[a]``-th percentile of row a of mixture ``mix``, [A]."""
    out = np.empty(len(q))
    for p in np.unique(q):
        at = q == p
        out[at] = mixture_quantiles(mix[0][at], mix[1][at], mix[2][at], [p])[:, 0]
    return out
