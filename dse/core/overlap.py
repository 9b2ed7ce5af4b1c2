"""Two-batch overlap (TBO): a step run as two micro-batches of half the sequences each, one's
communication running while the other computes (DeepSeek-V3 Technical Report, arXiv 2412.19437,
Sec. 3.4 "Inference and Deployment": prefilling and decoding process two micro-batches
simultaneously, the all-to-all and TP communication of one overlapped with the computation of the
other; DeepSeek, "Day 6: One More Thing, DeepSeek-V3/R1 Inference System Overview",
github.com/deepseek-ai/open-infra-index, March 2025; SGLang's ``--enable-two-batch-overlap``).

A step's operators split into its communication (operators with all-reduce or point-to-point bytes:
TP all-reduces, the experts' dispatch and combine, pipeline hops) and the rest, its computation.
Of one half batch, C is the computation's time and M the communication's (the roofline kernel's
Σ count x per-instance time, without the step overhead). The two micro-batches alternate, so the
step lasts

    2 x max(C, M) + step overhead (once)

A half batch carries half of everything that scales with the tokens (ops, activations, KV-cache
reads, messages, the shapes' token and sequence counts) and all the weights it reads: each
micro-batch reads the weights again, so a memory-bound step gets slower (what the engines see; the
experts a half batch touches are the whole batch's, an upper bound where few tokens leave experts
untouched).

A decode of n steps, the computation growing with the context (C_j nondecreasing in the step j,
M the same every step): Σ_j max(C_j, M) = j* M + Σ_{j >= j*} C_j, j* the first step whose
computation reaches M, found by bisection over the steps (about log2 n vectorized evaluations of
the kernel's exact decode sum, never a loop over the steps).

Where ``sys.two_batch_overlap`` is None or false at a point, every entry here returns the kernel's
own figure for it, bit for bit. Energy is not changed here (the second read of the weights is
left out of it).
"""
from __future__ import annotations

from dataclasses import fields, replace
from functools import lru_cache

import numpy as np

from dse.core.efficiency import Efficiency
from dse.core.kernel_arrays import OpArrays, Stacked, subset
from dse.core.roofline import SystemArrays, decode_total_time, step_time

#: OpArrays fields that scale with a micro-batch's tokens or sequences (halved for a half batch);
#: the weights, the counts, the formats and the other shapes stay as they are
_PER_TOKEN = ("ops", "act_bytes", "kv_bytes", "comm_bytes", "p2p_bytes", "vector_ops", "shape_m")


def _half(op: OpArrays) -> OpArrays:
    """``op`` for half its tokens and sequences: ``_PER_TOKEN`` fields halved, weights kept."""
    return OpArrays(**{f.name: (v * 0.5 if f.name in _PER_TOKEN and (v := getattr(op, f.name)) is not None
                                else getattr(op, f.name)) for f in fields(OpArrays)})


def _is_comm(op: OpArrays) -> np.ndarray:
    """[O] bool: operators that communicate (all-reduce or point-to-point bytes at any row)."""
    comm = (np.asarray(op.comm_bytes) > 0) | (np.asarray(op.p2p_bytes) > 0)
    return comm.reshape(-1, np.shape(comm)[-1]).any(axis=0)


@lru_cache(maxsize=256)
def _split_arrays(op: OpArrays, like: OpArrays) -> tuple[OpArrays, OpArrays]:
    half, comm = _half(op), _is_comm(like)
    return subset(half, ~comm), subset(half, comm)


def _arrays(op):
    return op.op if isinstance(op, Stacked) else op


def halves(op: OpArrays | Stacked, like: OpArrays | Stacked | None = None) -> tuple:
    """(computation, communication) of one half batch of ``op``'s step: its non-communicating
    operators and its communicating ones, each for half the tokens (module docstring), the
    operators told apart by ``like``'s bytes (a decode's first step for its slope; None: ``op``'s
    own); kept per operator arrays (compared by identity)."""
    c, m = _split_arrays(_arrays(op), _arrays(op if like is None else like))
    if isinstance(op, Stacked):
        return Stacked(c, op.rows), Stacked(m, op.rows)
    return c, m


def _bare(eff: Efficiency) -> Efficiency:
    """``eff`` without its step overhead (the overlapped step pays it once, outside the max)."""
    return replace(eff, step_overhead_s=0.0)


def _on(sys: SystemArrays) -> np.ndarray | None:
    """[P] bool where two-batch overlap runs (None: nowhere)."""
    t = sys.two_batch_overlap
    return None if t is None or not np.any(t) else np.asarray(t, dtype=bool)


def overlapped_step_s(op: OpArrays | Stacked, sys: SystemArrays, eff: Efficiency) -> np.ndarray:
    """Seconds of one step of ``op`` run as two overlapped half batches, [P]: 2 x max(C, M) + the
    step overhead (module docstring), at every point (whether or not its flag is set)."""
    c, m = halves(op)
    bare = _bare(eff)
    return 2.0 * np.maximum(step_time(c, sys, bare), step_time(m, sys, bare)) + eff.step_overhead_s


def step_s(op: OpArrays | Stacked, sys: SystemArrays, eff: Efficiency) -> np.ndarray:
    """Seconds of one step, [P]: ``overlapped_step_s`` where ``sys.two_batch_overlap`` is set, the
    kernel's ``step_time`` elsewhere (bit for bit)."""
    plain = step_time(op, sys, eff)
    on = _on(sys)
    if on is None:
        return plain
    return np.where(on, overlapped_step_s(op, sys, eff), plain)


def overlapped_decode_s(op0, slope, steps, sys: SystemArrays, eff: Efficiency) -> np.ndarray:
    """Seconds of ``steps`` consecutive decode steps ([P] or a number; step j costs op0 + j x slope),
    each run as two overlapped half batches, [P]: 2 Σ_j max(C_j, M) + steps x the step overhead, the
    sum as j* M + Σ_{j >= j*} C_j (module docstring), at every point."""
    c0, m0 = halves(op0)
    c1, _ = halves(slope, op0)
    bare = _bare(eff)
    comm = step_time(m0, sys, bare)                       # M: the same every step
    n = np.broadcast_to(np.asarray(steps, dtype=float), (sys.size,))

    def computed(k):                                      # Σ_{j < k} C_j, exact (the kernel's closed form)
        return decode_total_time(c0, c1, k, sys, bare)

    lo, hi = np.zeros(sys.size), np.ceil(n)
    while np.any(lo < hi):                                # the first j with C_j >= M (hi: none before)
        mid = np.floor((lo + hi) / 2)
        reached = (computed(mid + 1) - computed(mid)) >= comm
        open_ = lo < hi
        hi = np.where(open_ & reached, mid, hi)
        lo = np.where(open_ & ~reached, mid + 1, lo)
    first = np.minimum(lo, n)
    total = first * comm + computed(n) - computed(first)
    return 2.0 * total + n * eff.step_overhead_s


def decode_s(op0, slope, steps, sys: SystemArrays, eff: Efficiency) -> np.ndarray:
    """Seconds of ``steps`` consecutive decode steps, [P]: ``overlapped_decode_s`` where
    ``sys.two_batch_overlap`` is set, the kernel's ``decode_total_time`` elsewhere (bit for bit)."""
    plain = decode_total_time(op0, slope, steps, sys, eff)
    on = _on(sys)
    if on is None:
        return plain
    return np.where(on, overlapped_decode_s(op0, slope, steps, sys, eff), plain)


__all__ = ["halves", "overlapped_step_s", "step_s", "overlapped_decode_s", "decode_s"]
