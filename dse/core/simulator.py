"""A discrete-event simulator of an in-flight-batching inference engine: the reference the
steady-state serving model is checked against.

The engine runs in iterations (Orca's iteration-level scheduling). Each iteration it:

1. gives every running sequence that has finished its prompt one decode token, allocating a
   KV block of ``kv_block`` tokens when the sequence's context crosses a block boundary; when
   no block is free it preempts the most recently admitted running sequence (recompute, as
   vLLM does by default: its blocks are freed and it goes back to the front of the queue to
   prefill again, prompt plus the tokens it had generated);
2. fills what is left of the iteration's token budget (``token_budget``) with prompt tokens:
   first the unfinished prompts of running sequences, then waiting requests in arrival
   order, admitted while their blocks fit and fewer than ``max_running`` sequences run.
   With ``chunked`` a prompt is cut to the budget left (Sarathi-Serve's chunked prefill);
   without it a prompt is taken whole or waits, and an iteration that prefills does not
   decode (prefill-first scheduling, vLLM's original scheduler);
3. lasts ``step_time(decode_seqs, decode_context, prefill_tokens, prefill_context,
   prompts_finished)`` seconds: the cost model of one iteration, from the same roofline the
   analytical model uses (``decode_context``: KV tokens the decode tokens attend to,
   summed; ``prefill_context``: the same for the prompt tokens, each attending to its
   prefix; ``prompts_finished``: prompts whose last token is in this iteration).

A sequence's first output token comes out of the iteration that finishes its prompt; the
others one per decode iteration. Load is a closed loop (``concurrency`` requests always in
flight: a finished request is replaced at once) or an open loop (requests arriving at given
times); a request reaches the scheduler a fixed ``request_overhead_s`` after it arrives (in
flight all the while). Everything is deterministic for given arrivals and lengths.

Prefix caching (``EngineConfig.prefix_tokens``, vLLM's automatic prefix caching): every
prompt starts with the same prefix, whose *full* KV blocks are computed once and held for
the whole run (taken from ``kv_blocks`` at the start, never freed or preempted). A request
finds ``min(full prefix blocks x kv_block, prompt - 1)`` tokens cached (its last prompt
token is always computed, as vLLM does on a full hit); its prefill starts there (the
prompt tokens computed attend to the cached keys too), it holds its own blocks only past
the shared ones (a prompt shorter than the prefix: past the shared blocks its prompt fills
whole), and after a recompute preemption its cached part is still cached.

Disaggregated prefill and decode (``simulate_disaggregated``; DistServe, Splitwise): a pool
of prefill instances runs prompts only, the KV of each finished prompt moves over its
prefill instance's link to a pool of decode instances, which decode the rest of the output.
Every instance is this engine; all advance on one clock, the earliest event first. A request
entering a pool (on arrival, the prefill pool; when its KV transfer ends, the decode pool)
is dispatched to one of its instances, the least loaded (fewest requests queued and
running there; ties: the lowest index), and waits in that instance's own queue, first come,
first served (DistServe's controller: the instance with the shortest queue).

Sources of the behaviour (facts, not code): Yu et al., "Orca", OSDI 2022 (iteration-level
scheduling); Kwon et al., "Efficient Memory Management for LLM Serving with
PagedAttention", SOSP 2023 (KV blocks, recompute preemption, FCFS admission); Agrawal et
al., "Taming Throughput-Latency Tradeoff in LLM Inference with Sarathi-Serve", OSDI 2024
(chunked prefill under a token budget, stall-free batching); vLLM's automatic prefix
caching (full blocks shared by hash, the last prompt token recomputed on a full hit); Zhong
et al., "DistServe", OSDI 2024, and Patel et al., "Splitwise", ISCA 2024 (prefill and decode
on separate instances, the KV cache sent between them).
"""
from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from basis.errors import DseError
from dse.core.kv_tiers import lru_outcomes, zipf_popularity
from dse.core.metrics import steps_after_first
from dse.core.scheduling import HIGH, Fcfs

#: (decode_seqs, decode_context, prefill_tokens, prefill_context, prompts_finished) -> seconds
StepTime = Callable[[int, int, int, int, int], float]

#: event kinds of the event loop: an iteration ends, a request's KV has been sent, a request
#: reaches the scheduler (its fixed overhead spent)
_ITERATION, _TRANSFER, _ENTER = 0, 1, 2


@dataclass(frozen=True)
class EngineConfig:
    """What the simulated engine does.

    kv_blocks: KV-cache blocks the device memory left after weights and activations holds;
    kv_block: tokens per block; token_budget: tokens (decode plus prompt) one iteration
    may process; max_running: sequences running at once; chunked: prompts cut to the
    budget left (else prefill-first with whole prompts); prefix_tokens: the prompt prefix
    every request shares (tokens; its full blocks cached for the whole run; 0: none);
    state_blocks: the blocks a running sequence's recurrent state takes beside its KV (a hybrid
    model's, as vLLM's hybrid KV-cache manager gives each request's Mamba state pages of the
    pool: constant in its context; 0: none)."""

    kv_blocks: int
    kv_block: int = 16
    token_budget: int = 8192
    max_running: int = 256
    chunked: bool = True
    prefix_tokens: int = 0
    state_blocks: int = 0     # blocks a sequence's recurrent state takes while it holds any (hybrid models)
    # the KV tier (``dse.core.kv_tiers``): swap preemption and seconds to move a token's KV one way;
    # a population of ``prefix_count`` prefixes (Zipf ``prefix_zipf``), one kept on the device and
    # ``tier_slots`` in the tier (an LRU stack), a tier hit costing ``reload_s`` in its first iteration
    swap: bool = False
    swap_s_per_token: float = 0.0
    prefix_count: int = 1
    prefix_zipf: float = 1.0
    tier_slots: int = 0
    reload_s: float = 0.0
    # the scheduling policy (``dse.core.scheduling``): the waiting queue's order and what it drops
    scheduler: Fcfs = Fcfs()

    def __post_init__(self):
        for key in ("kv_blocks", "kv_block", "token_budget", "max_running"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise DseError(f"simulator: {key} must be a positive integer, got {v!r}")
        for key in ("swap_s_per_token", "prefix_zipf", "reload_s"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not 0 <= v < np.inf:
                raise DseError(f"simulator: {key} must be a finite number >= 0, got {v!r}")
        for key in ("prefix_tokens", "state_blocks", "tier_slots"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise DseError(f"simulator: {key} must be a non-negative integer, got {v!r}")

    @property
    def shared_blocks(self) -> int:
        """KV blocks the shared prefix holds for the whole run: its full blocks only."""
        return int(self.prefix_tokens) // int(self.kv_block)

    def cached_tokens(self, prompt: int) -> int:
        """Tokens of a ``prompt``-token prompt found in the prefix cache (not computed): the
        shared prefix's full blocks, at most all but the prompt's last token."""
        return min(self.shared_blocks * int(self.kv_block), int(prompt) - 1)

    def shared_of(self, prompt: int) -> int:
        """Shared blocks a ``prompt``-token request reads: the prefix's full blocks its prompt
        fills whole (all of them unless the prompt is shorter than the prefix)."""
        return min(self.shared_blocks, int(prompt) // int(self.kv_block))

    def own_blocks(self, prompt: int, tokens: int) -> int:
        """KV blocks a request of a ``prompt``-token prompt holding ``tokens`` tokens of
        context needs beside the shared prefix's, and its recurrent state's ``state_blocks`` (a
        hybrid model's: constant in its context) once it holds any."""
        own = max(-(-int(tokens) // int(self.kv_block)) - self.shared_of(prompt), 0)
        return own + (int(self.state_blocks) if tokens > 0 else 0)


@dataclass
class _Request:
    index: int
    arrival: float
    prompt: int
    gen: int
    target: int = 0               # tokens to prefill: the prompt, or after a preemption what it held
    done_prompt: int = 0          # of those, prefilled (or found cached) so far
    generated: int = 0            # output tokens produced
    blocks: int = 0               # KV blocks held beside the shared prefix's
    reload: float = 0.0           # seconds to reload its prefix from the KV tier (paid on admission)
    swapped: bool = False         # its KV is in the tier (swap preemption), read back on readmission
    private: bool = False         # its prefix is not the device's: it holds its own copy while it runs
    priority: int = HIGH          # its class under the scheduler (lower first; FCFS: all one)
    dropped: bool = False         # refused by the scheduler before admission (SLO-aware admission)
    admitted: float = float("nan")
    first_token: float = float("nan")
    finish: float = float("nan")

    @property
    def prefilling(self) -> bool:
        return self.done_prompt < self.target

    @property
    def context(self) -> int:
        """KV tokens held: the prefilled tokens while prefilling; then the prompt and every
        output token fed back so far (all but the newest)."""
        return self.done_prompt if self.prefilling else self.prompt + max(self.generated - 1, 0)


@dataclass
class SimulationResult:
    """Per-request times (seconds; NaN for requests not finished) and engine figures.

    arrival, admitted, first_token, finish: per request; steps: iterations run;
    busy_s: time spent in iterations; running: mean sequences running per iteration
    (time-weighted); kv_used: mean share of KV blocks in use (time-weighted);
    preemptions: total; span: (first arrival, last finish) of the measured requests.
    Disaggregated: steps, busy_s and preemptions summed over every instance; admitted the
    admission to a prefill instance; running and kv_used per decode instance."""

    arrival: np.ndarray
    admitted: np.ndarray
    first_token: np.ndarray
    finish: np.ndarray
    prompt: np.ndarray
    gen: np.ndarray
    steps: int
    busy_s: float
    running: float
    kv_used: float
    preemptions: int
    measured: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    concurrency: int | None = None
    priority: np.ndarray | None = None     # per request: its class (``dse.core.scheduling``; None: one class)
    dropped: np.ndarray | None = None      # per request: refused before admission (None: none)
    whole: bool = False                    # a finite run measured whole (no warm-up left out)

    @property
    def completed(self) -> int:
        return int(np.isfinite(self.finish).sum())

    def metrics(self) -> dict[str, float]:
        """Serving metrics over the measured requests (SI units): TTFT, TPOT and end-to-end
        latency as mean, p50, p90, p99; queueing delay (arrival to admission); output,
        total and request throughput (closed loop: the concurrency over the mean end-to-end
        latency, Little's law; open loop: completions while the measured requests arrive; a finite
        run measured whole: its requests over its duration, first arrival to last token, as benchmark
        clients report it)."""
        m = self.measured & np.isfinite(self.finish)
        if not m.any():
            raise DseError("simulator: no request finished in the measured window")
        ttft = self.first_token[m] - self.arrival[m]
        gen = self.gen[m]
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = np.where(gen > 1, (self.finish[m] - self.first_token[m]) / steps_after_first(gen), np.nan)
        e2e = self.finish[m] - self.arrival[m]
        out = {}
        for name, v in (("ttft", ttft), ("tpot", tpot[np.isfinite(tpot)]), ("e2e", e2e)):
            out[f"{name}_mean_s"] = float(np.mean(v)) if len(v) else float("nan")
            for q in (50, 90, 99):
                out[f"{name}_p{q}_s"] = float(np.percentile(v, q)) if len(v) else float("nan")
        out["queue_mean_s"] = float(np.mean(self.admitted[m] - self.arrival[m]))
        if self.concurrency is not None:             # closed loop: Little's law, N in the system
            x = self.concurrency / float(np.mean(e2e))
        elif self.whole:                             # a finite run measured whole: over its duration
            x = int(m.sum()) / float(np.max(self.finish[m]) - np.min(self.arrival))
        else:                                        # open loop: completions while the measured ones arrive
            lo, hi = float(self.arrival[m].min()), float(self.arrival[m].max())
            done = np.isfinite(self.finish) & (self.finish >= lo) & (self.finish <= hi)
            x = int(done.sum()) / (hi - lo) if hi > lo else float("nan")
        out["requests_per_s"] = x
        out["output_tokens_per_s"] = x * float(np.mean(gen))
        out["total_tokens_per_s"] = x * float(np.mean(gen + self.prompt[m]))
        out["running_mean"] = self.running
        out["kv_utilization"] = self.kv_used
        out["preemptions"] = float(self.preemptions)
        if self.dropped is not None:                 # the share of the measured arrivals refused
            out["dropped_share"] = float(np.mean(self.dropped[self.measured]))
        if self.priority is not None:                # per class: high (0) and low (1) priority
            for k, name in enumerate(("high", "low")):
                c = self.priority[m] == k
                out[f"ttft_{name}_mean_s"] = float(np.mean(ttft[c])) if c.any() else float("nan")
                for q in (50, 90, 99):               # each class's TTFT percentiles (per-class SLOs)
                    out[f"ttft_{name}_p{q}_s"] = float(np.percentile(ttft[c], q)) if c.any() else float("nan")
                t = tpot[c]
                out[f"tpot_{name}_mean_s"] = float(np.mean(t[np.isfinite(t)])) if np.isfinite(t).any() else float("nan")
        return out


#: the share of the first requests (by arrival) a run leaves out of its metrics: the engine filling up
WARMUP = 0.2


def simulate(step_time: StepTime, engine: EngineConfig, prompts: Sequence[int], gens: Sequence[int], *,
             concurrency: int | None = None, arrivals: Sequence[float] | None = None,
             warmup: float = WARMUP, progress: Callable[[int], None] | None = None,
             request_overhead_s: float = 0.0, tokens: Callable[[int, int], None] | None = None,
             stages: int = 1, ranks: int = 1) -> SimulationResult:
    """Run ``len(prompts)`` requests (prompt and output lengths per request, tokens) through
    the engine. Closed loop with ``concurrency`` requests in flight, or open loop with the
    given ``arrivals`` (seconds, non-decreasing). ``request_overhead_s``: seconds a request
    spends after it arrives before the scheduler sees it (the engine's fixed work per request:
    set-up, tokenizing, first scheduling), part of its TTFT and, in a closed loop, of the time
    it is in flight (so that Little's law holds with it). ``warmup``: the share of the first
    requests (by arrival order) left out of the measured ones, and as many of the last
    (the drain), so that metrics describe the steady state. Prefix caching as
    ``engine.prefix_tokens`` says. ``progress`` (optional) is called with the number of
    requests each iteration finishes, ``tokens`` (optional) with the output tokens each
    iteration produces and those of all the requests (``sum(gens)``: the calls' first
    arguments add up to it); both only observe. ``stages`` (pipeline parallelism): that many
    micro-batch streams, each an engine of its own, share the pipeline's stages (``_EventLoop``);
    ``ranks`` (expert parallelism): each stream is that many attention data-parallel ranks run in
    lock-step (``_LockStep``), ``engine`` being one rank's (its KV blocks its own). Returns a
    SimulationResult; DseError when a request can never be admitted (its prompt needs more blocks
    than exist beside the shared prefix's).
    """
    prompts, gens = _lengths(prompts, gens, concurrency, arrivals)
    _check_fits(engine, prompts, prompts + gens, prefill=True)
    stages, ranks = _positive("stages", stages), _positive("ranks", ranks)
    reqs, start, future, spare = _load(prompts, gens, engine, concurrency, arrivals)
    _prefix_population(reqs, engine)
    streams = [_Instance(_LockStep(engine, ranks) if ranks > 1 else _Engine(engine), step_time)
               for _ in range(stages)]
    loop = _EventLoop(streams, [], future, spare, progress=progress,
                      delay=_overhead(request_overhead_s), tokens=_token_hook(tokens, gens), stages=stages)
    loop.run(0.0, start)
    _check_done(reqs, "the engine cannot make progress (KV cache too small for any request)")
    res = _result(reqs, loop, loop.instances, warmup, concurrency)
    res.running *= stages                   # the trace's mean is a stream's: the engine runs them all
    return res


def simulate_disaggregated(prefill_step: StepTime, decode_step: StepTime, prefill_engine: EngineConfig,
                           decode_engine: EngineConfig, prefill_instances: int, decode_instances: int,
                           transfer_s: Callable[[int], float], prompts: Sequence[int], gens: Sequence[int], *,
                           concurrency: int | None = None, arrivals: Sequence[float] | None = None,
                           warmup: float = WARMUP, progress: Callable[[int], None] | None = None,
                           request_overhead_s: float = 0.0,
                           tokens: Callable[[int, int], None] | None = None, stages: int = 1,
                           ranks: int = 1, decode_ranks: int | None = None, encoders: int = 0,
                           encode_s: float = 0.0) -> SimulationResult:
    """Run ``len(prompts)`` requests (prompt and output lengths, tokens) through disaggregated
    prefill and decode (DistServe, Splitwise): ``prefill_instances`` engines of
    ``prefill_engine`` whose iterations ``prefill_step`` prices and ``decode_instances``
    engines of ``decode_engine`` priced by ``decode_step`` (seconds per iteration, as
    ``simulate``'s ``step_time``).

    - A request arriving is dispatched to the least-loaded prefill instance (fewest requests
      in its queue and running there, a prompt whose KV is being sent no longer counted;
      ties: the lowest index) and waits in that instance's own queue, first come, first
      served. Prefill instances run prompt iterations only (chunked or prefill-first per
      their config; a prompt needs the blocks of its own tokens, no decode slot). The
      iteration that finishes a prompt gives the request's first output token (its TTFT);
      a request of one output token is then done.
    - The prompt's KV then moves to the decode pool: ``transfer_s(prompt tokens)`` seconds
      (called once per distinct prompt length; finite, >= 0) on the sending prefill
      instance's link, one transfer at a time per link (transfers from one instance are
      serialized, in the order their prompts finished); the prefill instance holds the
      request's blocks until its transfer ends.
    - When its transfer ends the request is dispatched to the least-loaded decode instance
      (fewest requests queued, its preempted ones included, and running there; ties: the
      lowest index) and waits in that instance's queue of arrived requests, first come,
      first served; the instance admits it at the start of an iteration, after its running
      sequences have taken their blocks, when blocks for its context and the token it
      decodes are free, fewer than ``max_running`` run and the token budget lasts; it
      decodes in that iteration, and the instance decodes its other ``gen - 1`` tokens
      there. A request never moves to another instance. A sequence a decode instance
      preempts waits in that instance's queue of preempted ones (served before the arrived
      ones) and recomputes its context there as prompt tokens (prefill-first: whole, so a
      context past the budget stalls the instance, DseError).
    - The earliest event (an iteration's end, a transfer's end, an arrival) is always
      handled first, a request dispatched as its event is handled (the loads as they stand
      then); ties in the order they were scheduled, then arrivals, then idle instances start
      an iteration in order (prefill instances, then decode instances): deterministic.

    Closed loop (``concurrency``: a finished request is replaced at once by a new one
    dispatched to the prefill pool; the first ``concurrency`` dispatched one by one at 0)
    or open loop (``arrivals``, seconds); ``warmup``, ``progress``, ``tokens`` and
    ``request_overhead_s`` (before the prefill pool) as in ``simulate``.
    Returns a SimulationResult: per-request times (TTFT = first token - arrival; TPOT =
    (finish - first token) / (gen - 1), transfer and decode queueing included); steps,
    busy_s and preemptions summed over every instance; running and kv_used of the decode
    instances (mean per instance, time-weighted over their iterations). ``stages`` and
    ``ranks``: each instance is ``stages`` micro-batch streams through its own pipeline, each
    stream ``ranks`` lock-step ranks (as in ``simulate``; the engines' configs are one rank's;
    ``decode_ranks``: the decode pool's, when its layout is its own). An encoder pool (E:P:D) of
    ``encoders`` instances (0: none) takes each request first: the instance free soonest (ties:
    the lowest index) encodes it and sends its image embeddings in ``encode_s`` seconds, one request
    at a time, first come, first served; the request then enters the prefill pool.
    DseError for non-positive instance counts, a transfer time not finite and >= 0, or a request
    that can never fit an instance (a prefill instance: its prompt's blocks and, prefill-first,
    its computed prompt tokens in the budget; a decode instance: the blocks of its prompt
    and output)."""
    prompts, gens = _lengths(prompts, gens, concurrency, arrivals)
    for name, v in (("prefill_instances", prefill_instances), ("decode_instances", decode_instances)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise DseError(f"simulator: {name} must be a positive integer, got {v!r}")
    _check_fits(prefill_engine, prompts, prompts, prefill=True, pool="prefill ")
    _check_fits(decode_engine, prompts, prompts + gens, prefill=False, pool="decode ")
    sent = _transfer_times(transfer_s, prompts)
    reqs, start, future, spare = _load(prompts, gens, prefill_engine, concurrency, arrivals)
    stages, ranks = _positive("stages", stages), _positive("ranks", ranks)
    d_ranks = ranks if decode_ranks is None else _positive("decode_ranks", decode_ranks)

    def engine(kind, config, n):
        return _LockStep(config, n, kind) if n > 1 else kind(config)
    pre = [_Instance(engine(_PrefillEngine, prefill_engine, ranks), prefill_step)
           for _ in range(int(prefill_instances) * stages)]
    dec = [_Instance(engine(_DecodeEngine, decode_engine, d_ranks), decode_step)
           for _ in range(int(decode_instances) * stages)]
    loop = _EventLoop(pre, dec, future, spare, transfer=sent, progress=progress,
                      delay=_overhead(request_overhead_s), tokens=_token_hook(tokens, gens), stages=stages)
    if encoders:
        if not (isinstance(encoders, (int, np.integer)) and encoders > 0 and np.isfinite(encode_s) and encode_s >= 0):
            raise DseError(f"simulator: encoders must be a positive integer and encode_s finite seconds >= 0, "
                           f"got {encoders!r} and {encode_s!r}")
        loop.encoder_free, loop.encode_s = [0.0] * int(encoders), float(encode_s)
    loop.run(0.0, start)
    _check_done(reqs, "the prefill and decode instances cannot make progress")
    res = _result(reqs, loop, dec, warmup, concurrency)
    res.running *= stages                   # a decode engine runs all its streams
    return res


def _token_hook(tokens: Callable[[int, int], None] | None, gens: np.ndarray) -> Callable[[int], None] | None:
    """``tokens`` called with an iteration's output tokens and those of every request (``gens``)."""
    if tokens is None:
        return None
    total = int(np.sum(gens))
    return lambda n: tokens(n, total)


def _positive(key: str, v) -> int:
    """``v`` as a positive integer; DseError naming ``key`` otherwise."""
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
        raise DseError(f"simulator: {key} must be a positive integer, got {v!r}")
    return int(v)


def _overhead(v) -> float:
    """``request_overhead_s`` as seconds; DseError unless a finite number >= 0."""
    a = np.asarray(v)
    if isinstance(v, bool) or a.ndim != 0 or a.dtype.kind not in "iuf" or not (np.isfinite(a) and a >= 0):
        raise DseError(f"simulator: request_overhead_s must be a finite number of seconds >= 0, got {v!r}")
    return float(a)


def _lengths(prompts, gens, concurrency, arrivals) -> tuple[np.ndarray, np.ndarray]:
    """Prompt and output lengths (tokens) as integer arrays; DseError unless they pair up,
    are positive, and exactly one of a concurrency and arrival times is given."""
    prompts = np.asarray(prompts, dtype=np.int64)
    gens = np.asarray(gens, dtype=np.int64)
    n = len(prompts)
    if n == 0 or len(gens) != n:
        raise DseError("simulator: give as many output lengths as prompts, at least one")
    if np.any(prompts < 1) or np.any(gens < 1):
        raise DseError("simulator: prompt and output lengths must be positive")
    if (concurrency is None) == (arrivals is None):
        raise DseError("simulator: give either a concurrency (closed loop) or arrival times (open loop)")
    return prompts, gens


def _check_fits(engine: EngineConfig, prompts: np.ndarray, held: np.ndarray, *, prefill: bool,
                pool: str = "") -> None:
    """DseError unless every request fits an instance of ``engine``: the shared prefix
    leaves a block, ``held`` tokens of a request (per request) need no more blocks than the
    rest of the cache, and (``prefill`` and prefill-first) its computed prompt tokens fit
    one iteration's budget. ``pool`` names the instance in messages."""
    blk, room = engine.kv_block, engine.kv_blocks - engine.shared_blocks
    if room < 1:
        raise DseError(f"simulator: the shared prefix's {engine.shared_blocks} KV blocks leave no room for a "
                       f"request in the {pool}cache of {engine.kv_blocks}")
    need = np.maximum(-(-held // blk) - np.minimum(engine.shared_blocks, prompts // blk), 0) \
        + engine.state_blocks                                                                  # own_blocks
    if np.any(need > room):
        i = int(np.argmax(need > room))
        beside = f" beside the shared prefix's {engine.shared_blocks}" if engine.shared_blocks else ""
        raise DseError(f"simulator: request {i} needs {int(need[i])} KV blocks of {blk} tokens{beside}, "
                       f"the {pool}cache holds {room}")
    computed = prompts - np.minimum(engine.shared_blocks * blk, prompts - 1)                  # cached_tokens
    if prefill and not engine.chunked and np.any(computed > engine.token_budget):
        what = " to compute" if engine.shared_blocks else ""
        raise DseError(f"simulator: a prompt of {int(computed.max())} tokens{what} exceeds the {pool}token budget "
                       f"({engine.token_budget}) and prompts are not chunked")


def _transfer_times(transfer_s: Callable[[int], float], prompts: np.ndarray) -> dict[int, float]:
    """Seconds to send a prompt's KV from a prefill to a decode instance, per distinct prompt
    length (tokens); DseError unless each is a finite number >= 0."""
    out = {}
    for p in sorted({int(p) for p in prompts}):
        v = transfer_s(p)
        a = np.asarray(v)
        if a.ndim != 0 or a.dtype.kind not in "iuf" or not (np.isfinite(a) and a >= 0):
            raise DseError(f"simulator: transfer_s({p}) must be a finite number of seconds >= 0, got {v!r}")
        out[p] = float(a)
    return out


def _load(prompts: np.ndarray, gens: np.ndarray, engine: EngineConfig, concurrency, arrivals):
    """The requests (their prefill starting past what ``engine`` has cached), those in the
    system at the start (the first ``concurrency`` of a closed loop), the open loop's
    requests yet to arrive, in order, and the closed loop's requests that replace finished
    ones."""
    n = len(prompts)
    reqs = [_Request(i, 0.0, int(prompts[i]), int(gens[i]), int(prompts[i]), engine.cached_tokens(int(prompts[i])))
            for i in range(n)]
    scheduled(reqs, engine, concurrency)
    if arrivals is not None:
        arr = np.asarray(arrivals, dtype=float)
        if len(arr) != n or np.any(np.diff(arr) < 0) or not np.all(np.isfinite(arr)):
            raise DseError("simulator: arrival times must be finite, non-decreasing, one per request")
        for r, a in zip(reqs, arr):
            r.arrival = float(a)
        return reqs, [], deque(reqs), deque()
    if isinstance(concurrency, bool) or int(concurrency) < 1:
        raise DseError(f"simulator: concurrency must be a positive integer, got {concurrency!r}")
    return reqs, reqs[:int(concurrency)], deque(), deque(reqs[int(concurrency):])


def scheduled(reqs: Sequence[_Request], engine: EngineConfig, concurrency) -> None:
    """Each request's class under ``engine.scheduler`` (in index order); DseError for a scheduler
    that drops requests in a closed loop (a dropped request is not replaced: give a request rate)."""
    if engine.scheduler.drops and concurrency is not None:
        raise DseError("simulator: SLO-aware admission drops requests: run it in an open loop (a request rate)")
    if engine.scheduler.reorders:
        for r in reqs:
            r.priority = engine.scheduler.priority(r.index)


def _prefix_population(reqs: list[_Request], engine: EngineConfig) -> None:
    """With ``engine.prefix_count`` prefixes, each request's prefix drawn (Zipf ``prefix_zipf``,
    independently, a fixed seed) and looked up in arrival order in the LRU stack of one device slot
    and ``tier_slots`` tier slots (``kv_tiers.lru_outcomes``): a device hit keeps its cached tokens,
    a tier hit too and pays ``reload_s`` when admitted, a miss computes its whole prompt; both hold
    their prefix's blocks as their own while they run."""
    if engine.prefix_count <= 1 or engine.shared_blocks == 0:
        return
    ids = np.random.default_rng(0).choice(engine.prefix_count, size=len(reqs),
                                          p=zipf_popularity(engine.prefix_count, engine.prefix_zipf))
    order = sorted(reqs, key=lambda r: (r.arrival, r.index))
    for r, where in zip(order, lru_outcomes(ids, 1, engine.tier_slots)):
        r.private = bool(where)
        if where == 1:
            r.reload = float(engine.reload_s)
        elif where == 2:
            r.done_prompt = 0


def _check_done(reqs: list[_Request], why: str) -> None:
    """DseError(``why``) when a request did not finish (the instances stalled), one the scheduler
    dropped excepted."""
    if any(np.isnan(r.finish) and not r.dropped for r in reqs):
        raise DseError(f"simulator: {why}")


def _result(reqs: list[_Request], loop: _EventLoop, figures: list[_Instance], warmup: float,
            concurrency) -> SimulationResult:
    """The SimulationResult of a finished run; running and kv_used from the iterations of
    the ``figures`` instances that start while the measured requests are in the system."""
    n = len(reqs)
    arrival = np.array([r.arrival for r in reqs])
    order = np.argsort(arrival, kind="stable")
    measured = np.zeros(n, dtype=bool)
    skip = int(np.floor(warmup * n))
    measured[order[skip:n - skip] if n - 2 * skip > 0 else order] = True
    # time-weighted engine figures over the measured requests' span (no warm-up, no drain)
    tr = np.array([row for inst in figures for row in inst.trace], dtype=float).reshape(-1, 4)
    finish = np.array([r.finish for r in reqs])
    lo, hi = arrival[measured].min(), np.nanmax(finish[measured])
    inside = (tr[:, 0] >= lo) & (tr[:, 0] < hi)
    w = tr[inside, 1] if inside.any() else tr[:, 1]
    sel = tr[inside] if inside.any() else tr
    running = float((sel[:, 2] * w).sum() / w.sum()) if w.sum() > 0 else 0.0
    kv_used = float((sel[:, 3] * w).sum() / w.sum()) if w.sum() > 0 else 0.0
    return SimulationResult(arrival, np.array([r.admitted for r in reqs]), np.array([r.first_token for r in reqs]),
                            finish, np.array([r.prompt for r in reqs], dtype=np.int64),
                            np.array([r.gen for r in reqs], dtype=np.int64), loop.steps, loop.busy_s, running,
                            kv_used, sum(inst.engine.preemptions for inst in loop.instances), measured,
                            None if concurrency is None else int(concurrency),
                            np.array([r.priority for r in reqs]) if any(r.priority != HIGH for r in reqs) else None,
                            np.array([r.dropped for r in reqs]) if any(r.dropped for r in reqs) else None,
                            whole=warmup == 0.0)


def _counts(decode_now: list[_Request], chunks: list[tuple[_Request, int]]) -> tuple[int, int, int, int, int]:
    """(decode tokens, their keys, prompt tokens, their keys, prompts finished) of an iteration
    decoding ``decode_now`` and prefilling ``chunks`` ((sequence, prompt tokens) pairs, each
    chunk's tokens attending to the keys before them)."""
    dctx = sum(r.context for r in decode_now)
    pctx = sum(take * r.done_prompt + take * (take - 1) // 2 for r, take in chunks)
    ptok = sum(take for _, take in chunks)
    ends = sum(1 for r, take in chunks if r.done_prompt + take >= r.target)
    return len(decode_now), dctx, ptok, pctx, ends


def _checked(dt) -> float:
    """``dt`` as seconds; DseError unless a positive finite number."""
    dt = float(dt)
    if not (dt > 0 and np.isfinite(dt)):
        raise DseError(f"simulator: step_time must be a positive number of seconds, got {dt!r}")
    return dt


def _price(step_time: StepTime, decode_now: list[_Request], chunks: list[tuple[_Request, int]]) -> float:
    """Seconds of an iteration decoding ``decode_now`` and prefilling ``chunks`` (``_counts``);
    DseError unless ``step_time`` gives a positive finite number."""
    return _checked(step_time(*_counts(decode_now, chunks)))


@dataclass
class _Instance:
    """An engine instance in the event loop: its scheduler, its iteration pricing, the
    iteration in flight ((decode_now, chunks), None when idle), its trace ((start s,
    duration s, running, KV share) per iteration) and when its KV link is next free (s)."""

    engine: _Engine
    step_time: StepTime
    plan: tuple | None = None
    trace: list = field(default_factory=list)
    link_free: float = 0.0


class _EventLoop:
    """Engine instances (and KV transfers between them) advanced in time order: the earliest
    event first (ties in the order they were scheduled), then every idle instance, in order,
    starts an iteration if it has work. New requests are dispatched to the ``entry`` pool:
    the open loop's ``arrivals`` at their times, the closed loop's ``replacements`` as
    requests finish. A prefill instance's finished prompts go over its link (``transfer``:
    seconds per prompt length) and are dispatched to the ``decode`` pool (empty for one
    colocated engine). A request entering a pool goes to its least-loaded instance (fewest
    requests queued plus running; ties: the lowest index) and stays there. A new request
    reaches the entry pool ``delay`` seconds after it arrives. ``progress``, if given, is
    called with the number of requests an iteration finishes, ``tokens`` with the output
    tokens it produces. With ``stages`` > 1 each run of ``stages`` consecutive instances is the
    micro-batch streams of one pipeline: an iteration of ``dt`` seconds passes its stages in turn,
    ``dt / stages`` on each, each stage taking one iteration at a time in the order they start
    (so the streams interleave, and an iteration's stage waits while another stream's holds it)."""

    def __init__(self, entry: list[_Instance], decode: list[_Instance], arrivals: deque, replacements: deque, *,
                 transfer: dict[int, float] | None = None, progress: Callable[[int], None] | None = None,
                 delay: float = 0.0, tokens: Callable[[int], None] | None = None, stages: int = 1,
                 router: Callable[[list, _Request], int] | None = None):
        self.stages = stages
        self.router = router            # picks the entry instance of a request (None: the least loaded)
        self.stage_free: dict[int, list[float]] = {}   # per pipeline: when each stage is next free (s)
        self.progress = progress
        self.tokens = tokens
        self.delay = delay
        self.instances = entry + decode
        self.entry = range(len(entry))
        self.decode = range(len(entry), len(self.instances))
        self.arrivals, self.replacements = arrivals, replacements
        self.transfer = transfer or {}
        self.events: list[tuple[float, int, int, int, _Request | None]] = []
        self.scheduled = 0
        self.steps = 0
        self.busy_s = 0.0
        self.encoder_free: list[float] = []   # an encoder pool (E:P:D): when each instance is next free (s)
        self.encode_s = 0.0

    def _encode(self, t: float, r: _Request) -> bool:
        """``r``, ready at ``t`` (s), to the encoder instance free soonest, entering the entry pool when
        encoded and sent (an event); False without an encoder pool."""
        if not self.encoder_free:
            return False
        i = min(range(len(self.encoder_free)), key=lambda k: (self.encoder_free[k], k))
        self.encoder_free[i] = max(t, self.encoder_free[i]) + self.encode_s
        self._push(self.encoder_free[i], _ENTER, -1, r)
        return True

    def _dispatch(self, pool: range, r: _Request) -> None:
        """``r`` joins the queue of the least-loaded instance of ``pool`` (ties: the first), or of
        the one the ``router`` picks (an entry pool of replicas behind a router, ``dse.core.router``)."""
        if self.router is not None and pool is self.entry:
            self.instances[self.router(self.instances, r)].engine.enqueue(r)
            return
        i = min(pool, key=lambda i: (self.instances[i].engine.load, i))
        self.instances[i].engine.enqueue(r)

    def _enter(self, t: float, r: _Request) -> None:
        """``r`` arrives at ``t`` (s): dispatched now, or ``delay`` later (an event)."""
        if self._encode(t + self.delay, r):
            return
        if self.delay > 0:
            self._push(t + self.delay, _ENTER, -1, r)
        else:
            self._dispatch(self.entry, r)

    def run(self, t: float, start: Sequence[_Request] = ()) -> None:
        """Run from time ``t`` (s), the requests ``start`` arriving first, in order, until
        no event is left."""
        for r in start:
            self._enter(t, r)
        self._start_idle(t)
        while True:
            t = self._next_time()
            if t is None:
                return
            while self.events and self.events[0][0] <= t:
                when, _, kind, i, r = heapq.heappop(self.events)
                if kind == _ITERATION:
                    self._end_iteration(i, when)
                elif kind == _TRANSFER:
                    self._end_transfer(i, r)
                else:
                    self._dispatch(self.entry, r)
            while self.arrivals and self.arrivals[0].arrival + self.delay <= t:
                r = self.arrivals.popleft()
                if not self._encode(r.arrival + self.delay, r):
                    self._dispatch(self.entry, r)
            self._start_idle(t)

    def _next_time(self) -> float | None:
        """The time of the next event or arrival (s); None when there is none."""
        times = [self.events[0][0]] if self.events else []
        if self.arrivals:
            times.append(self.arrivals[0].arrival + self.delay)
        return min(times) if times else None

    def _push(self, t: float, kind: int, i: int, r: _Request | None) -> None:
        heapq.heappush(self.events, (t, self.scheduled, kind, i, r))
        self.scheduled += 1

    def _start_idle(self, t: float) -> None:
        for i, inst in enumerate(self.instances):
            if inst.plan is None:
                self._start(i, t)

    def _start(self, i: int, t: float) -> None:
        """Instance ``i`` schedules an iteration at ``t`` (s) if it has work."""
        inst = self.instances[i]
        plan = inst.engine.schedule(t)
        if not inst.engine.has_work(plan):
            return
        dt = inst.engine.price(inst.step_time, plan)
        inst.trace.append((t, dt, len(inst.engine.running), inst.engine.kv_share))
        inst.plan = plan
        self.steps += 1
        self.busy_s += dt
        self._push(self._through_stages(i, t, dt), _ITERATION, i, None)

    def _through_stages(self, i: int, t: float, dt: float) -> float:
        """When an iteration of ``dt`` seconds instance ``i`` started at ``t`` (s) leaves its
        pipeline: ``t + dt`` on one stage; else each stage in turn for ``dt / stages``, once free."""
        if self.stages == 1:
            return t + dt
        free = self.stage_free.setdefault(i // self.stages, [0.0] * self.stages)
        per = dt / self.stages
        for s in range(self.stages):
            t = max(t, free[s]) + per
            free[s] = t
        return t

    def _end_iteration(self, i: int, t: float) -> None:
        """Instance ``i``'s iteration ends at ``t`` (s): finished requests are replaced (closed
        loop: the replacement dispatched now), finished prompts of a prefill instance queue
        on its link."""
        inst = self.instances[i]
        plan, inst.plan = inst.plan, None
        if self.tokens is not None:
            seqs = inst.engine.sequences(plan)
            before = sum(r.generated for r in seqs)
        finished, sent = inst.engine.apply(t, plan)
        if finished and self.progress is not None:
            self.progress(len(finished))
        if self.tokens is not None:
            self.tokens(sum(r.generated for r in seqs) - before)
        for _ in finished:
            if self.replacements:                     # closed loop: the next request arrives now
                nxt = self.replacements.popleft()
                nxt.arrival = t
                self._enter(t, nxt)
        for r in sent:
            inst.link_free = max(t, inst.link_free) + self.transfer[r.prompt]
            self._push(inst.link_free, _TRANSFER, i, r)

    def _end_transfer(self, i: int, r: _Request) -> None:
        """``r``'s KV has left prefill instance ``i``: its blocks there are freed and it is
        dispatched to a decode instance."""
        self.instances[i].engine.release(r)
        self._dispatch(self.decode, r)


class _Engine:
    """The scheduler's state: running sequences, the waiting queue of the requests
    dispatched to this instance (first come, first served; preempted sequences wait at its
    head) and free KV blocks (beside the shared prefix's)."""

    #: tokens past its prompt a waiting sequence needs blocks for to be admitted (the first decode token's)
    spare = 1

    def __init__(self, config: EngineConfig):
        self.config = config
        self.waiting: deque[_Request] = deque()
        self.running: list[_Request] = []
        self.free = config.kv_blocks - config.shared_blocks
        self.preemptions = 0
        self.stall = 0.0          # seconds of KV-tier traffic (reloads, swaps) the next iteration waits for

    @property
    def load(self) -> int:
        """Requests on this instance, the dispatch's measure: queued plus running."""
        return len(self.waiting) + len(self.running)

    @property
    def kv_share(self) -> float:
        """Share of the KV blocks in use."""
        return (self.config.kv_blocks - self.free) / self.config.kv_blocks

    def enqueue(self, r: _Request) -> None:
        """``r`` is dispatched here: it waits at the tail of the queue, or (a scheduler of priority
        classes) behind every waiting request of its class or a higher one and those already
        started (preempted, swapped out), ahead of the lower classes' waiting requests."""
        if not self.config.scheduler.reorders:
            self.waiting.append(r)
            return
        at = len(self.waiting)
        while at > 0 and self.waiting[at - 1].priority > r.priority and np.isnan(self.waiting[at - 1].admitted):
            at -= 1
        self.waiting.insert(at, r)

    # an iteration's plan is (decode_now, chunks) (``schedule``); a group of ranks has its own
    # (``_LockStep``): the event loop asks the engine about its plans through these four
    @staticmethod
    def has_work(plan) -> bool:
        return bool(plan[0] or plan[1])

    def price(self, step_time: StepTime, plan) -> float:
        """Seconds of the iteration ``plan``, with the KV-tier traffic its scheduling started."""
        dt, self.stall = _price(step_time, *plan) + self.stall, 0.0
        return dt

    @staticmethod
    def sequences(plan) -> list[_Request]:
        return plan[0] + [r for r, _ in plan[1]]

    def apply(self, t: float, plan) -> tuple[list[_Request], list[_Request]]:
        return self.advance(t, *plan)

    def _own(self, r: _Request, tokens: int) -> int:
        """KV blocks ``r`` needs beside the shared prefix's to hold ``tokens`` tokens (all of them
        when its prefix is not the device's)."""
        if r.private:
            return -(-int(tokens) // int(self.config.kv_block)) + (int(self.config.state_blocks) if tokens > 0 else 0)
        return self.config.own_blocks(r.prompt, tokens)

    def schedule(self, t: float) -> tuple[list[_Request], list[tuple[_Request, int]]]:
        """The sequences that decode this iteration and the (sequence, prompt tokens) chunks
        it prefills. Chunked: decode first, then prompts in the budget left. Prefill-first:
        whole prompts if any can be admitted, else decode."""
        budget = self.config.token_budget
        if self.config.chunked:
            decode_now = self._decode()
            return decode_now, self._prefill(t, budget - len(decode_now))
        chunks = self._prefill(t, budget)
        return ([] if chunks else self._decode()), chunks

    def _decode(self) -> list[_Request]:
        """One decode token for every sequence past its prompt, in arrival order, growing
        its KV by a block where it needs one; preempting the latest arrival when none is free."""
        out = []
        for r in sorted((r for r in self.running if not r.prefilling and r.generated < r.gen),
                        key=lambda r: (r.arrival, r.index)):
            if r not in self.running:
                continue                          # preempted to make room for an earlier one
            need = self._own(r, r.context + 1) - r.blocks
            while need > self.free and self._preempt(r):
                pass
            if r in self.running and need <= self.free:
                self.free -= max(need, 0)
                r.blocks += max(need, 0)
                out.append(r)
        return out

    def _preempt(self, keep: _Request) -> bool:
        """Preempt the latest-arrived running sequence (possibly ``keep`` itself): its blocks are
        freed and it waits at the head of the queue, to prefill again (past its cached prefix)
        or, with ``swap``, its KV written to the tier (the iteration waits for it) to be read back."""
        if not self.running:
            return False
        victim = max(self.running, key=lambda r: (r.arrival, r.index))
        self.running.remove(victim)
        self.free += victim.blocks
        if self.config.swap:
            self.stall += victim.blocks * self.config.kv_block * self.config.swap_s_per_token
            victim.blocks, victim.swapped = 0, True
            self.preemptions += 1
            self.waiting.appendleft(victim)
            return victim is not keep
        victim.blocks = 0
        victim.target = victim.prompt + max(victim.generated - 1, 0)
        victim.done_prompt = self.config.cached_tokens(victim.prompt)
        self.preemptions += 1
        self.waiting.appendleft(victim)
        return victim is not keep

    def _prefill(self, t: float, budget: int) -> list[tuple[_Request, int]]:
        """Prompt chunks under ``budget`` tokens: running sequences' unfinished prompts first,
        then waiting requests in order, admitted when the blocks of their whole prompt (and
        ``spare`` tokens to decode into) are free and fewer than max_running run."""
        cfg, chunks = self.config, []
        for r in sorted((r for r in self.running if r.prefilling), key=lambda r: (r.arrival, r.index)):
            if budget <= 0:
                break
            if r not in self.running:
                continue                          # preempted to make room for an earlier one
            take = min(r.target - r.done_prompt, budget)
            grow = self._own(r, r.done_prompt + take) - r.blocks
            while grow > self.free and self._preempt(r):
                pass
            if r not in self.running or grow > self.free:
                continue
            self.free -= grow
            r.blocks += grow
            chunks.append((r, take))
            budget -= take
        while budget > 0 and len(self.running) < cfg.max_running and self.waiting:
            r = self.waiting[0]
            if r.swapped:                         # read its KV back; it goes on where it stopped
                if self._own(r, r.context + self.spare) > self.free:
                    break
                self.waiting.popleft()
                r.blocks, r.swapped = self._own(r, r.context), False
                self.free -= r.blocks
                self.stall += r.blocks * cfg.kv_block * cfg.swap_s_per_token
                self.running.append(r)
                continue
            if np.isnan(r.admitted) and cfg.scheduler.dropped(t - r.arrival):
                self.waiting.popleft()            # SLO-aware admission: it can no longer meet its TTFT SLO
                r.dropped = True
                self.release(r)                   # (a session's turn: the history it took)
                continue
            left = r.target - r.done_prompt
            take = min(left, budget)
            if (not cfg.chunked and take < left) or self._own(r, r.target + self.spare) - r.blocks > self.free:
                break                             # (r.blocks: those it holds already, a session's cached history)
            self.waiting.popleft()
            if np.isnan(r.admitted):
                r.admitted = t
                self.stall, r.reload = self.stall + r.reload, 0.0
            grow = self._own(r, r.done_prompt + take) - r.blocks
            self.free -= grow
            r.blocks += grow
            self.running.append(r)
            chunks.append((r, take))
            budget -= take
        return chunks

    def advance(self, t: float, decode_now: list[_Request],
                chunks: list[tuple[_Request, int]]) -> tuple[list[_Request], list[_Request]]:
        """Apply an iteration that ended at ``t`` (s); return the sequences it finished (their
        blocks freed) and those to send to a decode instance (none here)."""
        finished = []
        for r in decode_now:
            r.generated += 1
            if r.generated >= r.gen:
                finished.append(r)
        for r, take in chunks:
            r.done_prompt += take
            if not r.prefilling and r.generated == 0:
                r.generated = 1                   # the prompt's last token gives the first output
                r.first_token = t
                if r.generated >= r.gen:
                    finished.append(r)
        for r in finished:
            r.finish = t
            self.running.remove(r)
            self.release(r)
        return finished, []

    def release(self, r: _Request) -> None:
        """Free ``r``'s blocks."""
        self.free += r.blocks
        r.blocks = 0


class _LockStep:
    """An expert-parallel group's attention data-parallel ranks (SGLang's DP attention, DeepSeek's
    decode instances): each rank an _Engine of its own (scheduler, queue, KV blocks), every
    iteration run by all of them together, since each layer's expert all-to-all joins them: it
    lasts as long as its slowest rank's (each rank's priced by ``step_time`` on its own counts; a
    rank with nothing to do waits). A request dispatched to the group goes to its least-loaded
    rank (fewest queued plus running; ties: the lowest index) and stays there."""

    def __init__(self, config: EngineConfig, ranks: int, kind: type = None):
        self.config = config
        self.ranks = [(kind or _Engine)(config) for _ in range(ranks)]
        self._holder: dict[int, _Engine] = {}      # a request whose KV is being sent: its rank

    @property
    def load(self) -> int:
        return sum(e.load for e in self.ranks)

    @property
    def running(self) -> list[_Request]:
        return [r for e in self.ranks for r in e.running]

    @property
    def kv_share(self) -> float:
        return float(np.mean([e.kv_share for e in self.ranks]))

    @property
    def preemptions(self) -> int:
        return sum(e.preemptions for e in self.ranks)

    def enqueue(self, r: _Request) -> None:
        min(self.ranks, key=lambda e: e.load).enqueue(r)

    def schedule(self, t: float) -> list:
        return [e.schedule(t) for e in self.ranks]

    @staticmethod
    def has_work(plan) -> bool:
        return any(_Engine.has_work(p) for p in plan)

    def price(self, step_time: StepTime, plan) -> float:
        """The slowest rank's seconds: ``step_time.ranks`` of every rank's counts ([R, 5] ->
        seconds) where the pricer has it (a rank's experts fed by every rank's tokens), else the
        most of ``step_time`` over the ranks with work; plus the longest KV-tier traffic a rank's
        scheduling started (``_Engine.stall``)."""
        stall = max(e.stall for e in self.ranks)
        for e in self.ranks:
            e.stall = 0.0
        ranks = getattr(step_time, "ranks", None)
        if ranks is not None:
            return _checked(ranks(np.array([_counts(*p) for p in plan], dtype=float))) + stall
        return max(_price(step_time, *p) for p in plan if _Engine.has_work(p)) + stall

    @staticmethod
    def sequences(plan) -> list[_Request]:
        return [r for p in plan for r in _Engine.sequences(p)]

    def apply(self, t: float, plan) -> tuple[list[_Request], list[_Request]]:
        finished, sent = [], []
        for e, p in zip(self.ranks, plan):
            done, out = e.apply(t, p)
            finished += done
            sent += out
            self._holder.update((r.index, e) for r in out)
        return finished, sent

    def release(self, r: _Request) -> None:
        """Free ``r``'s blocks on the rank that holds them."""
        self._holder.pop(r.index).release(r)


class _PrefillEngine(_Engine):
    """A prefill instance: prompt iterations only, of the requests dispatched to it. A
    finished prompt leaves the running set (and the instance's load), its blocks held until
    ``release`` (its KV sent)."""

    spare = 0

    def schedule(self, t: float) -> tuple[list[_Request], list[tuple[_Request, int]]]:
        """No decoding; the prompt chunks (chunked) or whole prompts (prefill-first) the budget holds."""
        return [], self._prefill(t, self.config.token_budget)

    def advance(self, t: float, decode_now: list[_Request],
                chunks: list[tuple[_Request, int]]) -> tuple[list[_Request], list[_Request]]:
        """Apply a prompt iteration that ended at ``t`` (s): the finished prompts give their
        first token; return the requests done (one output token; blocks freed) and those
        whose KV is to be sent, in order (blocks still held)."""
        finished, sent = [], []
        for r, take in chunks:
            r.done_prompt += take
            if r.prefilling:
                continue
            r.generated, r.first_token = 1, t
            self.running.remove(r)
            if r.gen > 1:
                sent.append(r)
            else:
                r.finish = t
                self.release(r)
                finished.append(r)
        return finished, sent


class _DecodeEngine(_Engine):
    """A decode instance: admits the requests dispatched to it when their KV has arrived
    (from its ``ready`` queue, first come, first served), decodes them, and recomputes the
    context of those it preempts (they wait in its ``waiting`` queue, served first)."""

    def __init__(self, config: EngineConfig):
        super().__init__(config)
        self.ready: deque[_Request] = deque()

    @property
    def load(self) -> int:
        """Requests on this instance: preempted and arrived ones queued, plus running."""
        return len(self.waiting) + len(self.ready) + len(self.running)

    def enqueue(self, r: _Request) -> None:
        """``r``'s KV has arrived here: it waits at the tail of the arrived queue."""
        self.ready.append(r)

    def schedule(self, t: float) -> tuple[list[_Request], list[tuple[_Request, int]]]:
        """Chunked: the running sequences decode, arrived requests are admitted and decode,
        then preempted ones recompute in the budget left. Prefill-first: a recompute
        iteration if a preempted sequence can be admitted, else decode and admit."""
        budget = self.config.token_budget
        if not self.config.chunked:
            chunks = self._prefill(t, budget)
            if chunks:
                return [], chunks
        decode_now = self._decode()
        decode_now += self._admit(budget - len(decode_now))
        chunks = self._prefill(t, budget - len(decode_now)) if self.config.chunked else []
        return decode_now, chunks

    def _admit(self, budget: int) -> list[_Request]:
        """Arrived requests, in order, while no preempted sequence waits here, ``budget``
        tokens last, fewer than max_running run and the blocks of their context and the
        token they decode are free; they take those blocks and decode this iteration."""
        out = []
        while self.ready and not self.waiting and len(out) < budget and len(self.running) < self.config.max_running:
            r = self.ready[0]
            need = self._own(r, r.context + 1)
            if need > self.free:
                break
            self.ready.popleft()
            self.free -= need
            r.blocks = need
            self.running.append(r)
            out.append(r)
        return out
