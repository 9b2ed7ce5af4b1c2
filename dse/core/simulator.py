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
times). Everything is deterministic for given arrivals and lengths.

Sources of the behaviour (facts, not code): Yu et al., "Orca", OSDI 2022 (iteration-level
scheduling); Kwon et al., "Efficient Memory Management for LLM Serving with
PagedAttention", SOSP 2023 (KV blocks, recompute preemption, FCFS admission); Agrawal et
al., "Taming Throughput-Latency Tradeoff in LLM Inference with Sarathi-Serve", OSDI 2024
(chunked prefill under a token budget, stall-free batching).
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from basis.errors import DseError

#: (decode_seqs, decode_context, prefill_tokens, prefill_context, prompts_finished) -> seconds
StepTime = Callable[[int, int, int, int, int], float]


@dataclass(frozen=True)
class EngineConfig:
    """What the simulated engine does.

    kv_blocks: KV-cache blocks the device memory left after weights and activations holds;
    kv_block: tokens per block; token_budget: tokens (decode plus prompt) one iteration
    may process; max_running: sequences running at once; chunked: prompts cut to the
    budget left (else prefill-first with whole prompts)."""

    kv_blocks: int
    kv_block: int = 16
    token_budget: int = 8192
    max_running: int = 256
    chunked: bool = True

    def __post_init__(self):
        for key in ("kv_blocks", "kv_block", "token_budget", "max_running"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise DseError(f"simulator: {key} must be a positive integer, got {v!r}")


@dataclass
class _Request:
    index: int
    arrival: float
    prompt: int
    gen: int
    target: int = 0               # tokens to prefill: the prompt, or after a preemption what it held
    done_prompt: int = 0          # of those, prefilled so far
    generated: int = 0            # output tokens produced
    blocks: int = 0
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
    preemptions: total; span: (first arrival, last finish) of the measured requests."""

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

    @property
    def completed(self) -> int:
        return int(np.isfinite(self.finish).sum())

    def metrics(self) -> dict[str, float]:
        """Serving metrics over the measured requests (SI units): TTFT, TPOT and end-to-end
        latency as mean, p50, p90, p99; queueing delay (arrival to admission); output,
        total and request throughput (closed loop: the concurrency over the mean end-to-end
        latency, Little's law; open loop: completions while the measured requests arrive)."""
        m = self.measured & np.isfinite(self.finish)
        if not m.any():
            raise DseError("simulator: no request finished in the measured window")
        ttft = self.first_token[m] - self.arrival[m]
        gen = self.gen[m]
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = np.where(gen > 1, (self.finish[m] - self.first_token[m]) / np.maximum(gen - 1, 1), np.nan)
        e2e = self.finish[m] - self.arrival[m]
        out = {}
        for name, v in (("ttft", ttft), ("tpot", tpot[np.isfinite(tpot)]), ("e2e", e2e)):
            out[f"{name}_mean_s"] = float(np.mean(v)) if len(v) else float("nan")
            for q in (50, 90, 99):
                out[f"{name}_p{q}_s"] = float(np.percentile(v, q)) if len(v) else float("nan")
        out["queue_mean_s"] = float(np.mean(self.admitted[m] - self.arrival[m]))
        if self.concurrency is not None:             # closed loop: Little's law, N in the system
            x = self.concurrency / float(np.mean(e2e))
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
        return out


def simulate(step_time: StepTime, engine: EngineConfig, prompts: Sequence[int], gens: Sequence[int], *,
             concurrency: int | None = None, arrivals: Sequence[float] | None = None,
             warmup: float = 0.2) -> SimulationResult:
    """Run ``len(prompts)`` requests (prompt and output lengths per request, tokens) through
    the engine. Closed loop with ``concurrency`` requests in flight, or open loop with the
    given ``arrivals`` (seconds, non-decreasing). ``warmup``: the share of the first
    requests (by arrival order) left out of the measured ones, and as many of the last
    (the drain), so that metrics describe the steady state. Returns a SimulationResult;
    DseError when a request can never be admitted (its prompt needs more blocks than exist).
    """
    prompts = np.asarray(prompts, dtype=np.int64)
    gens = np.asarray(gens, dtype=np.int64)
    n = len(prompts)
    if n == 0 or len(gens) != n:
        raise DseError("simulator: give as many output lengths as prompts, at least one")
    if np.any(prompts < 1) or np.any(gens < 1):
        raise DseError("simulator: prompt and output lengths must be positive")
    if (concurrency is None) == (arrivals is None):
        raise DseError("simulator: give either a concurrency (closed loop) or arrival times (open loop)")
    blk = engine.kv_block
    need = -(-(prompts + gens) // blk)
    if np.any(need > engine.kv_blocks):
        i = int(np.argmax(need > engine.kv_blocks))
        raise DseError(f"simulator: request {i} needs {int(need[i])} KV blocks of {blk} tokens, "
                       f"the cache holds {engine.kv_blocks}")
    if not engine.chunked and np.any(prompts > engine.token_budget):
        raise DseError(f"simulator: a prompt of {int(prompts.max())} tokens exceeds the token budget "
                       f"({engine.token_budget}) and prompts are not chunked")

    reqs = [_Request(i, 0.0, int(prompts[i]), int(gens[i]), int(prompts[i])) for i in range(n)]
    if arrivals is not None:
        arr = np.asarray(arrivals, dtype=float)
        if len(arr) != n or np.any(np.diff(arr) < 0) or not np.all(np.isfinite(arr)):
            raise DseError("simulator: arrival times must be finite, non-decreasing, one per request")
        for r, a in zip(reqs, arr):
            r.arrival = float(a)
        pending = deque(reqs)
        waiting: deque[_Request] = deque()
    else:
        if isinstance(concurrency, bool) or int(concurrency) < 1:
            raise DseError(f"simulator: concurrency must be a positive integer, got {concurrency!r}")
        pending = deque(reqs[int(concurrency):])
        waiting = deque(reqs[:int(concurrency)])
    state = _Engine(engine, waiting)
    t = 0.0
    steps = 0
    busy = 0.0
    trace: list[tuple[float, float, int, float]] = []     # (start, duration, running, KV share) per iteration

    while True:
        while arrivals is not None and pending and pending[0].arrival <= t:
            waiting.append(pending.popleft())
        if not state.running and not waiting:
            if pending and arrivals is not None:
                t = pending[0].arrival
                continue
            break
        decode_now, chunks = state.schedule(t)
        if not decode_now and not chunks:
            if arrivals is not None and pending:
                t = max(t, pending[0].arrival)
                continue
            raise DseError("simulator: the engine cannot make progress (KV cache too small for any request)")
        dctx = sum(r.context for r in decode_now)
        pctx = sum(take * r.done_prompt + take * (take - 1) // 2 for r, take in chunks)
        ptok = sum(take for _, take in chunks)
        ends = sum(1 for r, take in chunks if r.done_prompt + take >= r.target)
        dt = float(step_time(len(decode_now), dctx, ptok, pctx, ends))
        if not (dt > 0 and np.isfinite(dt)):
            raise DseError(f"simulator: step_time must be a positive number of seconds, got {dt!r}")
        trace.append((t, dt, len(state.running), (engine.kv_blocks - state.free) / engine.kv_blocks))
        t += dt
        busy += dt
        steps += 1
        for r in state.advance(t, decode_now, chunks):
            if arrivals is None and pending:            # closed loop: the next request arrives now
                nxt = pending.popleft()
                nxt.arrival = t
                waiting.append(nxt)

    arrival = np.array([r.arrival for r in reqs])
    order = np.argsort(arrival, kind="stable")
    measured = np.zeros(n, dtype=bool)
    skip = int(np.floor(warmup * n))
    measured[order[skip:n - skip] if n - 2 * skip > 0 else order] = True
    # time-weighted engine figures over the measured requests' span (no warm-up, no drain)
    tr = np.array(trace, dtype=float).reshape(-1, 4)
    finish = np.array([r.finish for r in reqs])
    lo, hi = arrival[measured].min(), np.nanmax(finish[measured])
    inside = (tr[:, 0] >= lo) & (tr[:, 0] < hi)
    w = tr[inside, 1] if inside.any() else tr[:, 1]
    sel = tr[inside] if inside.any() else tr
    running = float((sel[:, 2] * w).sum() / w.sum()) if w.sum() > 0 else 0.0
    kv_used = float((sel[:, 3] * w).sum() / w.sum()) if w.sum() > 0 else 0.0
    return SimulationResult(arrival, np.array([r.admitted for r in reqs]), np.array([r.first_token for r in reqs]),
                            finish, prompts, gens, steps, busy, running, kv_used, state.preemptions,
                            measured, None if arrivals is not None else int(concurrency))


class _Engine:
    """The scheduler's state: running sequences, the waiting queue (shared with the caller)
    and free KV blocks."""

    def __init__(self, config: EngineConfig, waiting: deque):
        self.config, self.waiting = config, waiting
        self.running: list[_Request] = []
        self.free = config.kv_blocks
        self.preemptions = 0

    def _blocks(self, tokens: int) -> int:
        return -(-tokens // self.config.kv_block)

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
            need = self._blocks(r.context + 1) - r.blocks
            while need > self.free and self._preempt(r):
                pass
            if r in self.running and need <= self.free:
                self.free -= max(need, 0)
                r.blocks += max(need, 0)
                out.append(r)
        return out

    def _preempt(self, keep: _Request) -> bool:
        """Recompute-preempt the latest-arrived running sequence (possibly ``keep`` itself):
        its blocks are freed and it waits at the head of the queue to prefill again."""
        if not self.running:
            return False
        victim = max(self.running, key=lambda r: (r.arrival, r.index))
        self.running.remove(victim)
        self.free += victim.blocks
        victim.blocks = 0
        victim.target = victim.prompt + max(victim.generated - 1, 0)
        victim.done_prompt = 0
        self.preemptions += 1
        self.waiting.appendleft(victim)
        return victim is not keep

    def _prefill(self, t: float, budget: int) -> list[tuple[_Request, int]]:
        """Prompt chunks under ``budget`` tokens: running sequences' unfinished prompts first,
        then waiting requests in order, admitted when the blocks of their whole prompt (and
        one token to decode into) are free and fewer than max_running run."""
        cfg, chunks = self.config, []
        for r in sorted((r for r in self.running if r.prefilling), key=lambda r: (r.arrival, r.index)):
            if budget <= 0:
                break
            if r not in self.running:
                continue                          # preempted to make room for an earlier one
            take = min(r.target - r.done_prompt, budget)
            grow = self._blocks(r.done_prompt + take) - r.blocks
            while grow > self.free and self._preempt(r):
                pass
            if r not in self.running or grow > self.free:
                continue
            self.free -= grow
            r.blocks += grow
            chunks.append((r, take))
            budget -= take
        while self.waiting and budget > 0 and len(self.running) < cfg.max_running:
            r = self.waiting[0]
            take = min(r.target, budget)
            if (not cfg.chunked and take < r.target) or self._blocks(r.target + 1) > self.free:
                break
            self.waiting.popleft()
            if np.isnan(r.admitted):
                r.admitted = t
            grow = self._blocks(take)
            self.free -= grow
            r.blocks = grow
            self.running.append(r)
            chunks.append((r, take))
            budget -= take
        return chunks

    def advance(self, t: float, decode_now: list[_Request], chunks: list[tuple[_Request, int]]) -> list[_Request]:
        """Apply an iteration that ended at ``t``; return the sequences it finished (their
        blocks freed)."""
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
            self.free += r.blocks
            r.blocks = 0
        return finished
