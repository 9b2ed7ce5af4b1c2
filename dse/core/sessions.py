"""Multi-turn sessions (agentic and chat traffic): a session of T turns, each turn's prompt the
session's history (every earlier turn's prompt and output) plus new input, the next turn sent a
think time after the last token of the one before.

Two views of the same traffic:

- the steady-state model's (``session_lengths``): turn j of a session (j = 1..T) is a length class
  of prompt p + (j - 1)(P + G) (P, G: the mean new input and output of a turn; p: the class's new
  input), its output the class's, each turn 1 / T of the requests; the history a turn carries over
  (``history``) is what a cache may hold of it;
- the simulator's (``SessionEngine``, ``Turn``): an engine that keeps a finished turn's KV (its
  full blocks, as vLLM's automatic prefix caching keeps freed blocks hashed until they are needed)
  as the session's entry, evicted least recently used when blocks are needed; a turn dispatched to
  an engine holding its session's entry finds that many tokens of its prompt cached (all but its
  last token at most) and holds the entry's blocks from then on.

Prefix reuse is then an outcome: of where the router sends the next turn and of whether the cache
kept the history until it came (``dse.core.router``).

Sources (facts, not code): vLLM's automatic prefix caching (design/prefix_caching: full blocks
hashed by their tokens and prefix, freed blocks kept in an LRU eviction queue, the last prompt token
recomputed on a full hit); SGLang's RadixAttention (Zheng et al., NeurIPS 2024: multi-turn chat
reuses the KV of the conversation history).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from dse.core.simulator import EngineConfig, _Engine, _Request
from workloads.lengths import Lengths


def session_lengths(lengths: Lengths, turns: int) -> tuple[Lengths, np.ndarray, np.ndarray]:
    """(the length classes of sessions of ``turns`` turns whose turns' new input and output are
    ``lengths``, the history each class carries over in tokens [K'], its turn less one [K']): for
    each turn j and class k, a class of prompt p_k + (j - 1)(P + G) and output g_k, weight w_k / T,
    its prompt's variance that of p_k plus (j - 1) turns' of input and output (P, G: the means)."""
    t = int(turns)
    if t <= 1:
        k = len(lengths.weight)
        return lengths, np.zeros(k), np.zeros(k)
    per_turn = lengths.mean_prompt + lengths.mean_gen
    w = lengths.weight
    var = float(w @ (lengths.prompt_var + lengths.prompt ** 2) - lengths.mean_prompt ** 2
                + w @ (lengths.gen_var + lengths.gen ** 2) - lengths.mean_gen ** 2)
    j = np.repeat(np.arange(t, dtype=float), len(w))            # turn less one, per class
    history = j * per_turn
    return (Lengths(np.tile(lengths.prompt, t) + history, np.tile(lengths.gen, t), np.tile(w, t) / t,
                    np.tile(lengths.prompt_var, t) + j * max(var, 0.0), np.tile(lengths.gen_var, t)),
            history, j)


@dataclass
class Turn(_Request):
    """A request that is a session's turn: ``session`` (its id), ``turn`` (1..), and the session's
    next turn (None for its last), sent ``think_s`` after this one's last token."""

    session: int = -1
    turn: int = 1
    next_turn: "Turn | None" = None
    think_s: float = 0.0
    prefix: int = -1              # its shared prefix's rank among several (``prefix_count``; -1: none drawn)


class SessionEngine(_Engine):
    """An engine (``dse.core.simulator._Engine``) that keeps each finished turn's KV for its
    session's next turn: its full blocks as the session's entry (the partial last block freed),
    counted as free (``free``: blocks unused plus those entries hold) and evicted, least recently
    kept first, when an allocation needs their blocks. A turn enqueued here while its session's entry
    is here takes the entry: its prefill starts past the tokens cached (at most all but the prompt's
    last), and it holds their blocks. ``done(turn, t)`` is called when a turn with a next one ends."""

    def __init__(self, config: EngineConfig, done=None):
        self.entries: OrderedDict[int, tuple[int, int]] = OrderedDict()   # session -> (tokens, blocks)
        self.kept = 0                                                      # blocks the entries hold
        self.hits = 0                                                      # turns that found an entry
        self.done = done
        super().__init__(config)

    @property
    def free(self) -> int:
        """Blocks an allocation may take: unused, and those of the kept entries (evictable)."""
        return self._unused + self.kept

    @free.setter
    def free(self, value: int) -> None:
        """Blocks left after an allocation or a release: entries evicted, oldest first, while the
        unused blocks fall short."""
        unused = int(value) - self.kept
        while unused < 0 and self.entries:
            _, (_, blocks) = self.entries.popitem(last=False)
            self.kept -= blocks
            unused += blocks
        self._unused = unused

    def enqueue(self, r: _Request) -> None:
        entry = self.entries.pop(getattr(r, "session", -1), None)
        if entry is not None:
            tokens, blocks = entry
            self.kept -= blocks
            r.blocks = blocks
            r.done_prompt = max(r.done_prompt, min(tokens, r.prompt - 1))
            self.hits += 1
        super().enqueue(r)

    def release(self, r: _Request) -> None:
        """Free ``r``'s blocks; a turn that finished with a next turn keeps its full blocks as its
        session's entry (the newest), and its next turn is announced (``done``)."""
        nxt = getattr(r, "next_turn", None)
        if nxt is None or not np.isfinite(r.finish):
            super().release(r)
            return
        blk = int(self.config.kv_block)
        context = r.prompt + max(r.generated - 1, 0)
        keep = min(max(context // blk - self.config.shared_of(r.prompt), 0), r.blocks)
        old = self.entries.pop(r.session, None)
        if old is not None:
            self.kept -= old[1]
            self._unused += old[1]
        self._unused += r.blocks - keep
        self.entries[r.session] = ((context // blk) * blk, keep)
        self.kept += keep
        r.blocks = 0
        if self.done is not None:
            self.done(r, r.finish)
