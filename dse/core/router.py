"""Engine replicas behind a router: N engines of one design share a fleet's load, the router
picking one for each request (round-robin, least-outstanding, session-affinity).

The simulator runs the fleet (``simulate_routed``): N engines on one clock (``dse.core.simulator``'s
event loop), each request dispatched by the router as it arrives and staying there; sessions' turns
arrive a think time after the turn before ends (``dse.core.sessions``), and find their history
cached where the router sends them to the engine that kept it.

The steady-state model prices one replica (``dse.core.serving``, unchanged) at the load the policy
leaves it:

- **rate**: each replica carries 1 / N of the fleet's requests (an open loop's rate, a closed
  loop's concurrency);
- **arrivals** (``replica_dispersion``): the squared coefficient of variation c^2 of the gaps
  between requests reaching one replica. Round-robin hands every N-th request to a replica: its
  gaps are sums of N of the fleet's (a renewal process's), c^2 / N (Erlang-N for Poisson). Least-
  outstanding sends each request to the replica with the fewest in it, which spreads arrivals at
  least as evenly; taken as round-robin's (its pooling gain past that, a shorter queue when replicas'
  loads drift apart, is a queueing effect the in-flight engine below its capacity does not have).
  Session affinity sends a session's first turn as least-outstanding does and its later turns where
  the first went: a random 1 / N of the sessions' later turns (``replica_dispersion``);
- **cache hits** (``session_hits``): a turn finds the history its replica holds of its session.
  With affinity that is the whole history (the previous turn ran there); under round-robin or
  least-outstanding the previous turn ran on the same replica 1 / N of the time, else the last turn
  it ran there (turn i of the j - 1 before: probability (1 / N)(1 - 1 / N)^(j - 1 - i)), else none.
  Either holds only while the replica kept it (``retention``): its least-recently-used entries are
  evicted as the blocks running sequences do not use fill with newer ones, so a history survives
  the think time (exponential) when the entries kept meanwhile fit in the blocks left.

Sources (facts, not code): the interarrival times of every N-th event of a renewal process are sums
of N gaps (Cox, 'Renewal Theory', 1962); independent thinning of a renewal process (Cox and Isham,
'Point Processes', 1980); vLLM's automatic prefix caching (an LRU queue of freed blocks);
llm-d / the vLLM production stack's routers (round-robin, least-loaded, session and prefix affinity).
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from basis.errors import DseError
from dse.core.kv_tiers import che_hit_rate, lru_lookup, tier_slots, zipf_popularity
from dse.core.serving import Load
from dse.core.sessions import SessionEngine, Turn
from dse.core.simulator import (
    _ENTER,
    EngineConfig,
    SimulationResult,
    StepTime,
    _check_done,
    _check_fits,
    _EventLoop,
    _Instance,
    _overhead,
    _result,
    scheduled,
)

#: the routers, in the order of ``dse.system.params.ROUTERS`` (codes)
ROUND_ROBIN, LEAST_OUTSTANDING, SESSION_AFFINITY, PREFIX_AFFINITY = 0, 1, 2, 3
#: Gauss-Laguerre nodes of the think time's exponential (``retention``)
_THINK_NODES = 24


def replica_dispersion(dispersion, replicas, router, turns: int = 1, share=None) -> np.ndarray:
    """The squared coefficient of variation of the gaps between requests reaching one of
    ``replicas`` replicas, [P] (``dispersion``: c^2 of the gaps between sessions' starts, the
    fleet's requests without sessions). Streams superposed take their rates' mean of c^2 (Whitt's
    QNA): with sessions of T turns the fleet's turns are the starts (1 / T of them, c^2) and the
    later turns, sent a think time after turns end (1 (Poisson), their times independent). Round-
    robin and least-outstanding hand a replica every N-th of them: c^2 / N. Session affinity routes
    first turns as least-outstanding does (c^2 / N) and pins the later ones (a random 1 / N of the
    sessions: 1 after thinning); without sessions it is least-outstanding. Prefix affinity sends a
    replica the requests of its prefixes, a share s of them (``share`` [P]; None: 1 / N) chosen by their
    prefix, not by time: a thinned renewal process, 1 - s + s c^2 (Cox and Isham)."""
    d = np.asarray(dispersion, dtype=float)
    n = np.asarray(replicas, dtype=float)
    first = 1.0 / max(int(turns), 1)
    fleet = first * d + (1.0 - first)
    code = np.asarray(router)
    s = 1.0 / n if share is None else np.asarray(share, dtype=float)
    return np.where(code == SESSION_AFFINITY, first * d / n + (1.0 - first),
                    np.where(code == PREFIX_AFFINITY, 1.0 - s + s * fleet, fleet / n))


def prefix_routed_hits(tier, prefix_tokens, kv_block, replicas, router) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(share of its requests whose prefix is on the device, share in its tier, its share of the fleet's
    requests), [P], of the replica the steady state prices under ``router`` (codes [P]) over
    ``replicas`` [P]. Prefix affinity sends every request of prefix p (popularity rank p = 0, 1, ...;
    Zipf ``tier.prefix_zipf`` over ``tier.prefix_count``) to replica p mod N, whose LRU stack of one
    device slot and ``tier_slots`` tier slots sees only its own prefixes; the busiest replica (0: it
    holds the most popular prefix, and each of its prefixes outranks the other replicas' i-th) is the
    one priced: Che's approximation on its prefixes' popularity, its share their sum. Other routers
    spread every prefix over every replica, 1 / N each: the whole population's hits
    (``kv_tiers.prefix_hits``, ``tier``'s own ``device_hit`` and ``tier_hit``)."""
    device, in_tier = np.array(tier.device_hit, dtype=float), np.array(tier.tier_hit, dtype=float)
    share = 1.0 / np.asarray(replicas, dtype=float)
    slots = 1.0 + tier_slots(tier, prefix_tokens, kv_block)
    for j in np.flatnonzero((np.asarray(router) == PREFIX_AFFINITY) & (np.asarray(replicas) > 1)):
        n, q = int(replicas[j]), zipf_popularity(int(tier.prefix_count[j]), float(tier.prefix_zipf[j]))
        part = q[0::n]
        share[j] = part.sum()
        hits = che_hit_rate(np.broadcast_to(part / share[j], (2, len(part))), np.array([1.0, slots[j]]))
        device[j], in_tier[j] = hits[0], max(hits[1] - hits[0], 0.0)
    return device, in_tier, share


def turn_hit_share(turn, replicas, router) -> tuple[np.ndarray, np.ndarray]:
    """(probability [P, K] that turn j = ``turn`` + 1 finds an entry of its session on its replica,
    the mean turns of history that entry holds [P, K]): affinity, the previous turn's, always (j > 1);
    round-robin and least-outstanding, turn i's with probability (1 / N)(1 - 1 / N)^(j - 1 - i),
    i = 1 .. j - 1 (the last of the session's turns that ran on that replica)."""
    j1 = np.asarray(turn, dtype=float)[None, :]                  # turns before this one
    n = np.asarray(replicas, dtype=float)[:, None]
    q = 1.0 / n
    miss = (1.0 - q) ** j1                                         # none of the j - 1 ran here
    p = np.where(j1 > 0, 1.0 - miss, 0.0)
    # E[i | some ran here] = sum_i i q (1 - q)^(j-1-i) / p: with m = j - 1 and r = 1 - q,
    # sum_{i=1..m} i q r^(m-i) = m - r (1 - r^m) / q
    r = 1.0 - q
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = np.where(p > 0, (j1 - r * (1.0 - r ** j1) / q) / p, 0.0)
    aff = np.asarray(router)[:, None] == SESSION_AFFINITY
    one = n == 1
    p = np.where(aff | one, (j1 > 0).astype(float), p)
    mean = np.where(aff | one, j1, mean)
    return p, mean


def session_hits(history_turns, per_turn: float, kv_block, replicas, router, retained) -> tuple[np.ndarray, np.ndarray]:
    """(tokens of each class's prompt found cached, their second moment; [P, K], over the class's
    requests): the history its replica holds, the last of the session's turns that ran there (turn i
    of the ``history_turns`` before it, with ``turn_hit_share``'s probabilities; ``per_turn``: tokens a
    turn adds to the history, the mean input plus output) in whole blocks of ``kv_block`` [P], the
    last token of that turn's output excepted (never fed back), kept with probability ``retained`` [P]."""
    j1 = np.asarray(history_turns, dtype=float)[None, :]
    n = np.asarray(replicas, dtype=float)[:, None]
    q = 1.0 / n
    pinned = (np.asarray(router)[:, None] == SESSION_AFFINITY) | (n == 1)
    blk = np.asarray(kv_block, dtype=float)[:, None]
    mean, second = np.zeros(np.broadcast_shapes(j1.shape, n.shape)), np.zeros(np.broadcast_shapes(j1.shape, n.shape))
    for i in range(1, int(j1.max(initial=0.0)) + 1):      # the last turn on the replica was turn i
        tokens = np.floor(max(i * per_turn - 1.0, 0.0) / blk) * blk
        prob = np.where(pinned, (j1 == i).astype(float), np.where(j1 >= i, q * (1.0 - q) ** (j1 - i), 0.0))
        mean += prob * tokens
        second += prob * tokens ** 2
    kept = np.asarray(retained, dtype=float)[:, None]
    return kept * mean, kept * second


def retention(rate, turns: int, think_s, per_turn: float, kv_block, spare_blocks) -> np.ndarray:
    """The probability [P] that a session's entry is still kept when its next turn comes: the
    entries kept after it during the think time (one per turn with a next, ``rate`` (T - 1) / T of
    them a second on the replica, each of the history's blocks, a history of i turns of ``per_turn``
    tokens, i uniform over 1 .. T - 1) take the LRU queue's ``spare_blocks`` (the blocks running
    sequences leave) before it is evicted; an entry taken by its own next turn leaves the queue, so
    those newer entries still kept at s after it are the ones whose think time has not ended: with
    think times exponential of mean m = ``think_s``, Poisson of mean rate m (1 - exp(-s / m)), their
    blocks normal: P(kept <= spare | s), over s exponential of mean m (Gauss-Laguerre)."""
    from scipy.special import ndtr  # scipy on first use: importing dse stays light
    t = float(turns)
    if t <= 1:
        return np.ones(np.shape(rate))
    x, w = np.polynomial.laguerre.laggauss(_THINK_NODES)          # s = think_s x, x ~ Exp(1)
    per_s = (np.asarray(rate, dtype=float) * (t - 1.0) / t * np.asarray(think_s, dtype=float))[..., None] \
        * -np.expm1(-x)                                           # newer entries still waiting at s
    unit = (per_turn / np.asarray(kv_block, dtype=float))[..., None]   # blocks a turn adds to a history
    entry, second = unit * t / 2.0, unit ** 2 * t * (2.0 * t - 1.0) / 6.0   # E[i], E[i^2], i uniform on 1..T-1
    with np.errstate(divide="ignore", invalid="ignore"):
        z = (np.asarray(spare_blocks, dtype=float)[..., None] - per_s * entry) / np.sqrt(per_s * second)
    kept = np.where(per_s > 0, ndtr(z), 1.0) @ w
    return np.clip(kept, 0.0, 1.0)


@dataclass(frozen=True)
class Routed:
    """What a router and sessions do to one replica's load, per point [P]: ``replicas``, ``router``
    (code), session ``turns`` (one per group), ``think_s`` (seconds), the classes' history turns
    ``history_turns`` [K], ``per_turn`` (tokens a turn adds to a session's history) and the fleet's
    arrival ``dispersion`` [P] (the gaps' squared coefficient of variation, before the router)."""

    replicas: np.ndarray
    router: np.ndarray
    turns: int
    think_s: np.ndarray
    history_turns: np.ndarray
    per_turn: float
    dispersion: np.ndarray
    share: np.ndarray | None = None     # [P] the priced replica's share of the fleet's requests (None: 1 / replicas)

    def take(self, idx) -> "Routed":
        return replace(self, replicas=self.replicas[idx], router=self.router[idx], think_s=self.think_s[idx],
                       dispersion=self.dispersion[idx], share=None if self.share is None else self.share[idx])

    def fleet_share(self) -> np.ndarray:
        """The priced replica's share of the fleet's requests, [P]."""
        return 1.0 / self.replicas if self.share is None else self.share


def with_sessions(load: Load, routed: Routed, state: Callable[[Load], dict]) -> Load:
    """``load`` (one replica's) with its sessions' cache hits (``Load.session_cached``): first as if
    every history were kept, then kept with the ``retention`` that leaves: the blocks the steady
    state (``state(load)``, ``dse.core.serving.steady_state``'s metrics) leaves unused by running
    sequences hold the entries."""
    if routed.turns <= 1:
        return load
    full, second = session_hits(routed.history_turns, routed.per_turn, load.kv_block, routed.replicas,
                                routed.router, np.ones(len(load.kv_block)))
    first = replace(load, session_cached=full, session_spread=np.maximum(second - full ** 2, 0.0))
    out = state(first)
    spare = load.kv_blocks * (1.0 - np.nan_to_num(out["kv_utilization"], nan=1.0))
    rate = np.where(np.isfinite(load.request_rate), load.request_rate, np.nan_to_num(out["requests_per_s"]))
    kept = retention(rate, routed.turns, routed.think_s, routed.per_turn, load.kv_block, spare)
    if np.all(kept >= 1.0):
        return first
    k = kept[:, None]
    return replace(load, session_cached=full * k, session_spread=np.maximum(second * k - (full * k) ** 2, 0.0))


# --------------------------------------------------------------------------- the simulator's fleet

class _Router:
    """The simulator's router over an entry pool of replicas: ``__call__(instances, request)`` ->
    the index of the replica it goes to."""

    def __init__(self, kind: int, engine: EngineConfig | None = None, replicas: int = 1):
        self.kind = kind
        self.next = 0
        self.home: dict[int, int] = {}
        self.engine = engine          # with several prefixes: each replica's LRU stack of them
        self.stacks: list[list[int]] = [[] for _ in range(replicas)]

    def __call__(self, instances: list[_Instance], r) -> int:
        i = self._pick(instances, r)
        prefix = getattr(r, "prefix", -1)
        if prefix >= 0 and np.isnan(r.admitted):    # its prefix looked up where it goes (``_prefix_population``)
            e = self.engine
            where = lru_lookup(self.stacks[i], prefix, 1, e.tier_slots)
            r.private = bool(where)
            r.reload = float(e.reload_s) if where == 1 else 0.0
            if where == 2:
                r.done_prompt = 0
        return i

    def _pick(self, instances: list[_Instance], r) -> int:
        if self.kind == PREFIX_AFFINITY and getattr(r, "prefix", -1) >= 0:
            return int(r.prefix) % len(instances)
        if self.kind == ROUND_ROBIN:
            i = self.next % len(instances)
            self.next += 1
            return i
        session = getattr(r, "session", -1)
        if self.kind == SESSION_AFFINITY and session in self.home:
            return self.home[session]
        i = min(range(len(instances)), key=lambda i: (instances[i].engine.load, i))
        if self.kind == SESSION_AFFINITY and session >= 0:
            self.home[session] = i
        return i


def simulate_routed(step_time: StepTime, engine: EngineConfig, replicas: int, router: int,
                    sessions: Sequence[Sequence[tuple[int, int]]], *, concurrency: int | None = None,
                    starts: Sequence[float] | None = None, think_s: float = 0.0, warmup: float = 0.2,
                    request_overhead_s: float = 0.0) -> tuple[SimulationResult, int]:
    """Run ``sessions`` (each a list of (new input, output) tokens per turn; one turn each: plain
    requests) on ``replicas`` engines of ``engine`` behind ``router`` (a code: ``ROUND_ROBIN``,
    ``LEAST_OUTSTANDING``, ``SESSION_AFFINITY``). Turn j's prompt is the session's history (every
    earlier turn's input and output) plus its new input; it is sent ``think_s`` seconds (one number,
    or one per turn in order) after turn j - 1's last token. Open loop: the sessions start at ``starts`` (seconds, non-decreasing); closed
    loop (plain requests only): ``concurrency`` requests in flight over the fleet. Returns (the
    SimulationResult over every turn, as ``dse.core.simulator.simulate``'s, its throughput the
    fleet's and its running batch one replica's mean; the turns that found their history cached).
    DseError for a bad replica count or router, or a turn that can never fit an engine."""
    if isinstance(replicas, bool) or not isinstance(replicas, (int, np.integer)) or replicas < 1:
        raise DseError(f"simulator: replicas must be a positive integer, got {replicas!r}")
    if router not in (ROUND_ROBIN, LEAST_OUTSTANDING, SESSION_AFFINITY, PREFIX_AFFINITY):
        raise DseError(f"simulator: router must be a router code (0, 1, 2, 3), got {router!r}")
    if (concurrency is None) == (starts is None):
        raise DseError("simulator: give either a concurrency (closed loop) or session start times (open loop)")
    multi = any(len(s) > 1 for s in sessions)
    if multi and concurrency is not None:
        raise DseError("simulator: sessions of several turns run in an open loop (give start times)")
    think = np.broadcast_to(np.asarray(think_s, dtype=float), (sum(len(s) for s in sessions),))
    if not np.all(np.isfinite(think) & (think >= 0)):
        raise DseError("simulator: think times must be finite numbers of seconds >= 0")
    turns: list[Turn] = []
    firsts: list[Turn] = []
    for sid, session in enumerate(sessions):
        history, prev = 0, None
        for j, (p, g) in enumerate(session):
            prompt = history + int(p)
            t = Turn(len(turns), float("nan"), prompt, int(g), prompt, engine.cached_tokens(prompt),
                     session=sid if len(session) > 1 else -1, turn=j + 1, think_s=float(think[len(turns)]))
            if prev is None:
                firsts.append(t)
            else:
                prev.next_turn = t
            turns.append(t)
            history, prev = prompt + int(g), t
    scheduled(turns, engine, concurrency)
    if engine.prefix_count > 1 and engine.shared_blocks > 0:    # several prefixes: each request's (Zipf, seed 0)
        ids = np.random.default_rng(0).choice(engine.prefix_count, size=len(turns),
                                              p=zipf_popularity(engine.prefix_count, engine.prefix_zipf))
        for t, p in zip(turns, ids):
            t.prefix = int(p)
    prompts = np.array([t.prompt for t in turns], dtype=np.int64)
    gens = np.array([t.gen for t in turns], dtype=np.int64)
    if np.any(prompts < 1) or np.any(gens < 1):
        raise DseError("simulator: prompt and output lengths must be positive")
    _check_fits(engine, prompts, prompts + gens, prefill=True)
    delay = _overhead(request_overhead_s)
    if starts is not None:
        arr = np.asarray(starts, dtype=float)
        if len(arr) != len(firsts) or np.any(np.diff(arr) < 0) or not np.all(np.isfinite(arr)):
            raise DseError("simulator: session start times must be finite, non-decreasing, one per session")
        for t, a in zip(firsts, arr):
            t.arrival = float(a)
        start, future, spare = [], deque(firsts), deque()
    else:
        for t in turns:
            t.arrival = 0.0
        c = int(concurrency)
        if c < 1:
            raise DseError(f"simulator: concurrency must be a positive integer, got {concurrency!r}")
        start, future, spare = turns[:c], deque(), deque(turns[c:])
    loop: _EventLoop

    def follow(r: Turn, t: float) -> None:
        nxt = r.next_turn
        nxt.arrival = t + nxt.think_s
        loop._push(nxt.arrival + loop.delay, _ENTER, -1, nxt)

    insts = [_Instance(SessionEngine(engine, follow), step_time) for _ in range(int(replicas))]
    loop = _EventLoop(insts, [], future, spare, delay=delay, router=_Router(int(router), engine, int(replicas)))
    loop.run(0.0, start)
    _check_done(turns, "the replicas cannot make progress (KV cache too small for a turn)")
    res = _result(turns, loop, loop.instances, warmup, concurrency)
    return res, sum(i.engine.hits for i in insts)
