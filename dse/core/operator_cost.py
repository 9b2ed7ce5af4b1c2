"""The kernel's reference: each operator priced on its own, the plain per-operator path every
speed path (``dse.core.kernel_fast``) must equal. For one operator instance on one point:

    time = max(ops / (peak[class] * eff.compute_fraction), bytes / (bandwidth * eff.memory_fraction))
           + link time + eff.op_overhead_s

where an all-reduce (ring over ``tp`` devices, ``ring_allreduce_s``) costs
2 (tp - 1) / tp * bytes / (link bandwidth * eff.collective) + 2 (tp - 1) * link latency
+ eff.collective_latency_s, and a point-to-point transfer (pipeline hop, expert all-to-all,
``message_s``) bytes / (link bandwidth * eff.collective) + link latency + eff.collective_latency_s.
Where a tensor-parallel group (``tp``) or an expert all-to-all's group (``ep`` x ``tp``) is larger
than its scale-up domain (``SystemArrays.scale_up_size``) and a scale-out tier joins the domains,
the collective takes the fastest two-tier algorithm of ``dse.core.collectives`` for its message
(hierarchical or flat), never less than the same group inside one domain
(``allreduce_across_domains_s``, ``alltoall_across_domains_s``). Inside a torus domain with cited
dimensions (``SystemArrays.torus_dims``) a collective takes the torus closed forms instead: the
fastest of one ring, the per-dimension bucket and its multi-share form for an all-reduce, the
dimension-ordered all-to-all for the experts' (``allreduce_on_torus_s``, ``alltoall_on_torus_s``).
A step is Σ count x time + eff.step_overhead_s; a decode of n steps, each operator's time summed
exactly over the steps (closed form: step j of an operator costs op0 + j x slope, and its
max(compute, memory) is split at the single crossing of two linear functions).

Optional terms, skipped when a design space does not use them (``None``):
- offload: fractions of weight, activation and KV bytes in the host tier, read over
  the host link (``host_transfer_s``: bytes / (host bandwidth x the link's or tier's own measured
  fraction) + the link's latency, once per operator instance; never the device's memory
  fraction); overlapping compute (inside the max) or not (added).
- sparse: 2:4 structured-sparse peaks for weight matmuls.
- dequantization: vector ops of a weight-only quantized matmul at the vector peak.
- PIM: an operator whose role the PIM may run (a decode step's attention, GEMV or expert
  matmul; never a prefill's) and whose format it computes is priced both ways: on the host,
  and in memory by the PIM's own physics,

      max(ops / (PIM peak x f), (weight + KV bytes) / (internal bandwidth x f)
          + activation bytes / (external bandwidth x f)) + mode switches + coordination

  with the internal bandwidth the PIM units' (units x unit bandwidth, = multiple x external),
  ``f`` the host's achieved fraction of its own memory stream for that operator (the PIM's
  units run on the commands the host's memory controller issues, under the host's engine,
  so they lose what the host's stream loses; 1 under ``IDEAL``), and the PIM's fixed
  seconds per operator (``sys.pim_fixed_s``: its switches between normal and all-bank PIM
  mode and its host-PIM coordination; hardware figures, kept under ``IDEAL`` as link
  latencies are). The host's own operators are priced exactly as without the PIM. ``dse.core.pim_dispatch.dispatch`` places it (the one placement
  rule): a blocked host adds PIM time to the step, so each operator runs where it finishes
  sooner, which is the best placement; a concurrent one overlaps it (step =
  max(host work, PIM work)), so the placement is the one with the smallest step.
  Either way the step is a minimum over a fixed set of placements of times that each
  fall as any peak or bandwidth rises, so more bandwidth, compute, PIM peak or PIM
  multiple never slows a design.

Energy (``step_energy_j``'s model): every op at the J/op of the class it runs in (vector work
at the vector units'), every byte of device-memory traffic at the J/bit of all the levels it
crosses, and each byte a link moves read from one device's memory and written to another's.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dse.core.collectives import (
    TORUS_ALLREDUCE,
    TWO_TIER_ALLREDUCE,
    TWO_TIER_ALLTOALL,
    allreduce_share,
    allreduce_torus,
    allreduce_two_tier,
    alltoall_torus_s,
    alltoall_two_tier,
    choose,
    ring_allreduce_wire_s,
)
from dse.core.efficiency import IDEAL, Efficiency
from dse.core.kernel_arrays import _COL, OpArrays, OpCost, Stacked, SystemArrays, per_point, subset
from dse.core.pim_dispatch import dispatch, pim_eligible


def _memory_terms(shape: OpArrays, sys: SystemArrays, eff: Efficiency, on_pim, *steps: OpArrays) -> list:
    """(device-memory seconds, host-tier seconds) per instance, [P, O], of the bytes of each of
    ``steps`` (host: scalar 0 when nothing is offloaded), on the operators of ``shape``: their
    achieved bandwidth fractions, worked out once for all of them. On PIM, weight and KV bytes
    stream at the internal bandwidth."""
    frac = eff.memory_fraction(shape)
    bw = sys.bandwidth[:, None] * frac
    out = []
    for i, op in enumerate(steps):
        w, a, kv = op.weight_bytes, op.act_bytes, op.kv_bytes
        host_s = 0.0
        if sys.offload is not None:
            f = sys.offload
            on_host = w * f[:, 0:1] + a * f[:, 1:2] + kv * f[:, 2:3]
            w, a, kv = w * (1 - f[:, 0:1]), a * (1 - f[:, 1:2]), kv * (1 - f[:, 2:3])
            # the first step pays the link's latency per transfer; a decode's slope (bytes added
            # per step) only its bandwidth term
            host_s = host_transfer_s(on_host, sys, eff, latency=i == 0)
        if on_pim is None:
            out.append(((w + a + kv) / bw, host_s))
        else:
            inner = np.where(on_pim, sys.pim_multiple[:, None], 1.0)
            out.append((((w + kv) / inner + a) / bw, host_s))
    return out


def host_transfer_s(nbytes, sys: SystemArrays, eff: Efficiency, latency: bool = True) -> np.ndarray:
    """Seconds of host transfers of ``nbytes`` ([P, O] or [P]) over each point's host link (or
    offload tier): nbytes / (host bandwidth x its achieved fraction, ``eff.host_fraction``) plus,
    with ``latency``, the link's latency once per transfer; 0 where nothing moves."""
    b = np.asarray(nbytes, dtype=float)
    col = (slice(None), None) if b.ndim == 2 else slice(None)
    return link_transfer_s(b, sys.host_bandwidth[col], eff.host_fraction(sys)[col],
                           sys.host_latency[col] if latency else 0.0)


def link_transfer_s(nbytes, peak, fraction, latency) -> np.ndarray:
    """Seconds of a transfer of ``nbytes`` over a link of ``peak`` bytes/s reaching ``fraction`` of
    it, with ``latency`` s: nbytes / (peak x fraction) + latency; 0 for an empty transfer. Broadcasts."""
    b = np.asarray(nbytes, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        t = b / (np.asarray(peak, dtype=float) * fraction) + latency
    return np.where(b > 0, t, 0.0)


def _compute_terms(op: OpArrays, sys: SystemArrays, eff: Efficiency, on_pim, *work) -> list:
    """Compute seconds per instance, [P, O], of each (ops, vector ops or None) of ``work`` on the
    operators of ``op``: the ops at each operator's peak and achieved fraction (worked out once
    for all of them), plus the vector ops (dequantization) at the vector peak and its fraction."""
    peak = sys.peak[:, op.peak_column]                               # [P, O]
    if sys.sparse_gain is not None and op.sparse_ok is not None:
        peak = peak * np.where(op.sparse_ok, sys.sparse_gain[:, op.peak_column], 1.0)
    out = []
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = peak * eff.compute_fraction(op)
        if on_pim is not None:            # PIM units compute at the pace of the host's stream
            rate = np.where(on_pim, sys.pim_peak[:, op.peak_column] * eff.memory_fraction(op), rate)
        vector_rate = None if all(vector is None for _, vector in work) else \
            sys.peak[:, _COL["vector"]][:, None] * eff.resolved("vector_compute")
        for ops, vector in work:
            t = np.where(ops != 0, ops / rate, 0.0)
            if vector is not None:
                t = t + np.where(vector != 0, vector / vector_rate, 0.0)
            out.append(t)
    return out




def ring_latency(n, latency, eff: Efficiency):
    """Seconds of latency of one ring all-reduce over ``n`` devices on links of ``latency`` s:
    2(n - 1) link latencies plus one software latency per collective (a launch, as one-shot
    all-reduce kernels pay). Broadcasts."""
    return 2 * (n - 1) * latency + np.where(n > 1, eff.collective_latency_s, 0.0)


def ring_allreduce_s(message_bytes, instances, n, bandwidth, latency, eff: Efficiency):
    """Seconds of ``instances`` ring all-reduces over ``n`` devices whose messages hold
    ``message_bytes`` in all, on links of ``bandwidth`` bytes/s and ``latency`` s: each device
    sends 2 (n - 1) / n of the bytes, 2 (n - 1) / n x bytes / (bandwidth x eff.collective), and
    each all-reduce pays ``ring_latency``. The one all-reduce cost: one instance (``instances``
    1) or a step's sum (Σ count x bytes, Σ count). Broadcasts."""
    return (ring_allreduce_wire_s(message_bytes, n, np.asarray(bandwidth, dtype=float) * eff.collective, 0.0)
            + ring_latency(n, latency, eff) * instances)


def message_s(nbytes, instances, bandwidth, latency, eff: Efficiency):
    """Seconds of ``instances`` point-to-point messages holding ``nbytes`` in all, on a link of
    ``bandwidth`` bytes/s and ``latency`` s: bytes / (bandwidth x eff.collective) plus, per
    message, the link's latency and the software's (eff.collective_latency_s). The one
    point-to-point cost: one message or a step's sum. Broadcasts."""
    with np.errstate(invalid="ignore"):
        return (np.asarray(nbytes, dtype=float) / (np.asarray(bandwidth, dtype=float) * eff.collective)
                + (np.asarray(latency) + eff.collective_latency_s) * instances)


def transfer_time(nbytes, bandwidth, latency, eff: Efficiency):
    """Seconds of one point-to-point message of ``nbytes`` over a link of ``bandwidth``
    bytes/s and ``latency`` s (``message_s``; 0 for an empty message). Broadcasts."""
    b = np.asarray(nbytes, dtype=float)
    return np.where(b > 0, message_s(b, 1.0, bandwidth, latency, eff), 0.0)


def p2p_time(p2p_bytes, sys: SystemArrays, eff: Efficiency) -> np.ndarray:
    """Point-to-point transfer time per instance, [P, O]: over the scale-up link
    (``transfer_time``); where the expert-parallel group spans scale-up domains
    (``ep_spans``), the fastest two-tier all-to-all (``alltoall_across_domains_s``)."""
    t = transfer_time(p2p_bytes, sys.link_bandwidth[:, None], sys.link_latency[:, None], eff)
    b = np.broadcast_to(np.asarray(p2p_bytes, dtype=float), t.shape)
    torus = ep_on_torus(sys)
    if torus is not None:
        t = np.where(torus[:, None] & (b > 0), alltoall_on_torus_s(b, sys, eff), t)
    ring = cp_spans(sys)
    if ring is not None:        # a context-parallel ring's slowest hop is a scale-out one
        t = np.where(ring[:, None], np.maximum(t, transfer_time(p2p_bytes, sys.scale_out_bandwidth[:, None],
                                                                sys.scale_out_latency[:, None], eff)), t)
    span = ep_spans(sys)
    if span is None:
        return t
    return np.where(span[:, None] & (b > 0), alltoall_across_domains_s(b, sys, eff)[0], t)


def collective_time(comm_bytes, sys: SystemArrays, eff: Efficiency) -> np.ndarray:
    """All-reduce time per instance, [P, O] (0 without a message): the ring over the scale-up link
    (``ring_allreduce_s`` of one) inside one domain; where the tensor-parallel group spans scale-up
    domains (``tp_spans``), the fastest two-tier algorithm (``allreduce_across_domains_s``)."""
    comm = np.asarray(comm_bytes, dtype=float)
    t = ring_allreduce_s(comm, 1.0, sys.tp[:, None], sys.link_bandwidth[:, None], sys.link_latency[:, None], eff)
    torus = tp_on_torus(sys)
    if torus is not None:
        t = np.where(torus[:, None], allreduce_on_torus_s(np.broadcast_to(comm, t.shape), sys, eff)[0], t)
    span = tp_spans(sys)
    if span is not None:
        t = np.where(span[:, None], allreduce_across_domains_s(np.broadcast_to(comm, t.shape), sys, eff)[0], t)
    return np.where(comm > 0, t, 0.0)


def _has_scale_out(sys: SystemArrays) -> np.ndarray:
    return np.isfinite(sys.scale_out_bandwidth) & (sys.scale_out_bandwidth > 0)


def tp_spans(sys: SystemArrays) -> np.ndarray | None:
    """[P] bool: the tensor-parallel group is larger than a scale-up domain and a scale-out tier
    joins the domains; None where no point has a topology (``SystemArrays.scale_up_size``)."""
    if sys.scale_up_size is None or sys.scale_out_bandwidth is None:
        return None
    span = (sys.tp > sys.scale_up_size) & _has_scale_out(sys)
    return span if span.any() else None


def ep_spans(sys: SystemArrays) -> np.ndarray | None:
    """[P] bool: the expert-parallel group (ep ranks of tp devices) is larger than a scale-up
    domain and a scale-out tier joins the domains; None where none is."""
    if sys.scale_up_size is None or sys.scale_out_bandwidth is None or sys.ep is None:
        return None
    span = (sys.ep > 1) & (sys.ep * sys.tp > sys.scale_up_size) & _has_scale_out(sys)
    return span if span.any() else None


def _on_torus(sys: SystemArrays, devices) -> np.ndarray | None:
    """[P] bool: a group of ``devices`` ([P]) of more than one lies inside its point's scale-up
    domain and that domain is a torus with cited dimensions (``SystemArrays.torus_dims``)."""
    if sys.torus_dims is None:
        return None
    size = np.inf if sys.scale_up_size is None else sys.scale_up_size
    on = (np.prod(sys.torus_dims, axis=1) > 1) & (devices > 1) & (devices <= size)
    return on if on.any() else None


def tp_on_torus(sys: SystemArrays) -> np.ndarray | None:
    """[P] bool: the tensor-parallel group lies inside a torus domain (``_on_torus``); None where none does."""
    return _on_torus(sys, sys.tp)


def ep_on_torus(sys: SystemArrays) -> np.ndarray | None:
    """[P] bool: the expert-parallel group (ep ranks of tp devices) lies inside a torus domain."""
    return None if sys.ep is None else _on_torus(sys, np.where(sys.ep > 1, sys.ep * sys.tp, 1.0))


def allreduce_on_torus_s(message_bytes, sys: SystemArrays, eff: Efficiency) -> tuple:
    """(seconds, index into ``collectives.TORUS_ALLREDUCE``) of one all-reduce of ``message_bytes``
    ([P, O] or [P]) over each point's ``tp`` devices inside its torus domain: the fastest of one
    ring, the per-dimension bucket and its rotated multi-share form (``collectives.allreduce_torus``)
    on the device's link at its achieved collective fraction, plus the software latency once."""
    m = np.asarray(message_bytes, dtype=float)
    col = (slice(None), None) if m.ndim == 2 else slice(None)
    dims = sys.torus_dims[:, None, :] if m.ndim == 2 else sys.torus_dims
    t, algo = choose(allreduce_torus(m, sys.tp[col], dims, sys.link_bandwidth[col] * eff.collective,
                                     sys.link_latency[col]))
    return t + eff.collective_latency_s, algo


def alltoall_on_torus_s(p2p_bytes, sys: SystemArrays, eff: Efficiency) -> np.ndarray:
    """Seconds of one expert all-to-all inside a torus domain, each device sending ``p2p_bytes``
    ((ep - 1) / ep of what it holds) to the ep - 1 other ranks ([P, O] or [P]): the torus closed
    form (``collectives.alltoall_torus_s``) over the ep x tp devices the group fills, on the device's
    link at its achieved collective fraction, plus the software latency once."""
    b = np.asarray(p2p_bytes, dtype=float)
    col = (slice(None), None) if b.ndim == 2 else slice(None)
    dims = sys.torus_dims[:, None, :] if b.ndim == 2 else sys.torus_dims
    ep = sys.ep[col]
    with np.errstate(divide="ignore", invalid="ignore"):
        held = np.where(ep > 1, b * ep / (ep - 1), 0.0)
    return (alltoall_torus_s(held, ep * sys.tp[col], dims, sys.link_bandwidth[col] * eff.collective,
                             sys.link_latency[col]) + eff.collective_latency_s)


def cp_spans(sys: SystemArrays) -> np.ndarray | None:
    """[P] bool: the context-parallel ring (cp ranks of tp devices) is larger than a scale-up
    domain and a scale-out tier joins the domains (the ``ep_spans`` rule), so some hop of the
    ring, and with it every ring step, waits on the scale-out NIC; None where none is."""
    if sys.scale_up_size is None or sys.scale_out_bandwidth is None or sys.cp is None:
        return None
    span = (sys.cp > 1) & (sys.cp * sys.tp > sys.scale_up_size) & _has_scale_out(sys)
    return span if span.any() else None


def spans_domains(sys: SystemArrays) -> bool:
    """True when some point's tensor-, expert- or context-parallel group crosses the scale-out tier
    or (tensor, expert) lies on a torus (its collectives priced operator by operator)."""
    return (tp_spans(sys) is not None or ep_spans(sys) is not None or tp_on_torus(sys) is not None
            or ep_on_torus(sys) is not None or cp_spans(sys) is not None)


def _two_tiers(sys: SystemArrays, eff: Efficiency, col):
    """(scale-up bandwidth, latency, scale-out bandwidth, latency) of each point, bandwidths at
    the achieved collective fraction, indexed by ``col``."""
    return (sys.link_bandwidth[col] * eff.collective, sys.link_latency[col],
            sys.scale_out_bandwidth[col] * eff.collective, sys.scale_out_latency[col])


def allreduce_across_domains_s(message_bytes, sys: SystemArrays, eff: Efficiency) -> tuple:
    """(seconds, index into ``collectives.TWO_TIER_ALLREDUCE``) of one all-reduce of
    ``message_bytes`` ([P, O] or [P]) over each point's ``tp`` devices on domains of
    ``scale_up_size``: the fastest of the flat ring and the hierarchical algorithms, plus the
    software latency once (eff.collective_latency_s, the engine's fitted figure); never less than
    the same group's ring inside one domain (``ring_allreduce_s``): inside a domain the calibrated
    model is the ring alone, so a group gains nothing by leaving its domain (the hierarchical
    algorithms' fewer latency hops are not credited where the ring's were fitted)."""
    m = np.asarray(message_bytes, dtype=float)
    col = (slice(None), None) if m.ndim == 2 else slice(None)
    up_bw, up_lat, out_bw, out_lat = _two_tiers(sys, eff, col)
    t, algo = choose(allreduce_two_tier(m, sys.tp[col], sys.scale_up_size[col], up_bw, up_lat, out_bw, out_lat))
    one_domain = ring_allreduce_s(m, 1.0, sys.tp[col], sys.link_bandwidth[col], sys.link_latency[col], eff)
    return np.maximum(t + eff.collective_latency_s, one_domain), algo


#: an all-to-all across domains also tries sub-groups of 1/2, 1/4, ... of a domain's ranks (down to
#: one rank: 2^7 = 128 covers the largest cited domain, 72)
SUBGROUP_HALVINGS = 7


def alltoall_across_domains_s(p2p_bytes, sys: SystemArrays, eff: Efficiency) -> tuple:
    """(seconds, index into ``collectives.TWO_TIER_ALLTOALL``) of one expert all-to-all in which
    each device sends ``p2p_bytes`` ((ep - 1) / ep of what it holds) to the other ranks of its
    ``ep`` ranks ([P, O] or [P]), placed floor(scale_up_size / tp) ranks to a domain: the fastest of flat and
    hierarchical, on whole domains or on sub-groups of 1/2, 1/4, ... of a domain's ranks whose
    crossings go over the NICs (``SUBGROUP_HALVINGS``; so a larger domain of the same links is
    never slower), plus the software latency once; never less than the same message inside one
    domain (``message_s``)."""
    b = np.asarray(p2p_bytes, dtype=float)
    col = (slice(None), None) if b.ndim == 2 else slice(None)
    ep = sys.ep[col]
    with np.errstate(divide="ignore", invalid="ignore"):
        held = np.where(ep > 1, b * ep / (ep - 1), 0.0)
    per_domain = np.maximum(np.floor(sys.scale_up_size[col] / sys.tp[col]), 1.0)
    tiers = _two_tiers(sys, eff, col)
    t, algo = choose(alltoall_two_tier(held, ep, per_domain, *tiers))
    # the engine may also exchange in sub-groups of a domain (halving down to one rank), their
    # crossings over the NICs: a larger domain is never slower than a smaller one of the same links
    for halvings in range(1, SUBGROUP_HALVINGS + 1):
        sub = np.maximum(np.floor(per_domain / 2 ** halvings), 1.0)
        t_sub, a_sub = choose(alltoall_two_tier(held, ep, sub, *tiers))
        algo = np.where(t_sub < t, a_sub, algo)
        t = np.minimum(t, t_sub)
    one_domain = message_s(b, 1.0, sys.link_bandwidth[col], sys.link_latency[col], eff)
    return np.maximum(t + eff.collective_latency_s, one_domain), algo


def collective_algorithms(comm_bytes, p2p_bytes, sys: SystemArrays, eff: Efficiency) -> tuple[list, list]:
    """(all-reduce algorithm, all-to-all algorithm) each point runs for a message of
    ``comm_bytes`` / ``p2p_bytes`` ([P]): 'ring' inside one domain, the chosen two-tier algorithm
    across domains ('' where the point has no such collective)."""
    comm, p2p = np.asarray(comm_bytes, dtype=float), np.asarray(p2p_bytes, dtype=float)
    ar = ["ring" if (t > 1 and c > 0) else "" for t, c in zip(sys.tp, comm)]
    a2a = ["point-to-point" if (e > 1 and b > 0) else ""
           for e, b in zip(np.ones(sys.size) if sys.ep is None else sys.ep, p2p)]
    torus = tp_on_torus(sys)
    if torus is not None:
        algo = allreduce_on_torus_s(comm, sys, eff)[1]
        ar = [TORUS_ALLREDUCE[a] if s and c > 0 else r for a, s, c, r in zip(algo, torus, comm, ar)]
    torus = ep_on_torus(sys)
    if torus is not None:
        a2a = ["torus" if s and b > 0 else r for s, b, r in zip(torus, p2p, a2a)]
    span = tp_spans(sys)
    if span is not None:
        algo = allreduce_across_domains_s(comm, sys, eff)[1]
        ar = [TWO_TIER_ALLREDUCE[a] if s and c > 0 else r for a, s, c, r in zip(algo, span, comm, ar)]
    span = ep_spans(sys)
    if span is not None:
        algo = alltoall_across_domains_s(p2p, sys, eff)[1]
        a2a = [TWO_TIER_ALLTOALL[a] if s and b > 0 else r for a, s, b, r in zip(algo, span, p2p, a2a)]
    return ar, a2a


def link_time(op: OpArrays, sys: SystemArrays, eff: Efficiency):
    """Collective plus point-to-point time per instance, [P, O] (scalar 0 if the step has none)."""
    t = 0.0
    comm, p2p = op.links
    if comm:
        t = t + collective_time(op.comm_bytes, sys, eff)
    if p2p:
        t = t + p2p_time(op.p2p_bytes, sys, eff)
    return t


def has_work(op: OpArrays):
    """[O] or [P, O] bool: operators that compute or move bytes (they pay eff.op_overhead_s)."""
    return (op.ops > 0) | (op.memory_bytes > 0) | (op.comm_bytes > 0) | (op.p2p_bytes > 0)

def _combine(compute, dev, host, sys: SystemArrays):
    """max(compute, memory) with host-tier traffic inside the max (overlap) or added."""
    if np.ndim(host) == 0:
        return np.maximum(compute, dev)
    ov = sys.overlap[:, None]
    return np.maximum(compute, dev + np.where(ov, host, 0.0)) + np.where(ov, 0.0, host)


def _priced(op: OpArrays, sys: SystemArrays, eff: Efficiency, on_pim=None):
    """(compute, device memory, host tier, collective, time) per instance, [P, O], with the
    operators of ``on_pim`` in memory (None: all on the host)."""
    compute, = _compute_terms(op, sys, eff, on_pim, (op.ops, op.vector_ops))
    (dev, host), = _memory_terms(op, sys, eff, on_pim, op)
    coll = link_time(op, sys, eff)
    work = _combine(compute, dev, host, sys)
    # a ring-attention step (``OpArrays.overlapped``): its send overlaps its work, max(work, send)
    both = work + coll if op.overlapped is None else np.where(op.overlapped, np.maximum(work, coll), work + coll)
    time = both + np.where(has_work(op), eff.op_overhead_s, 0.0)
    if on_pim is not None:
        time = time + pim_fixed(on_pim, sys)
    return compute, dev, host, coll, time


def pim_fixed(on_pim, sys: SystemArrays) -> np.ndarray:
    """[P, O] seconds each instance of an operator run in memory pays besides its work (its mode
    switches and host-PIM coordination, ``sys.pim_fixed_s``); 0 on the host."""
    return np.where(on_pim, sys.pim_fixed_s[:, None], 0.0)


def op_costs(op: OpArrays, sys: SystemArrays, eff: Efficiency) -> OpCost:
    """Per-instance cost of every operator on every design point, where ``dispatch`` places it.

    Host-tier traffic overlaps compute (inside the max, summed with device traffic)
    where ``sys.overlap``, else adds to the operator's time."""
    terms = _priced(op, sys, eff)
    eligible = pim_eligible(op, sys)
    if eligible is None:                  # every operator on the host: the terms as they are, [P, O] views
        shape = np.broadcast_shapes(*(np.shape(t) for t in terms))
        return OpCost(*(np.broadcast_to(np.asarray(t, dtype=float), shape) for t in terms), None)
    zeros = np.zeros_like(terms[-1])
    terms = [t + zeros for t in terms]
    sel = np.flatnonzero(eligible.any(axis=0))        # price in memory only what the PIM can run
    on_pim = np.zeros(zeros.shape, dtype=bool)
    if sel.size:
        pim = _priced(subset(op, sel), sys, eff, eligible[:, sel])
        time = terms[-1].copy()
        time[:, sel] = pim[-1]
        on_pim = dispatch(terms[-1] * op.count, time * op.count, eligible, sys.pim_concurrent)
        for t, b in zip(terms, pim):
            t[:, sel] = np.where(on_pim[:, sel], b, t[:, sel])
    compute, dev, host, coll, time = terms
    return OpCost(compute, dev, host, coll, time, on_pim)


def pim_mask(op: OpArrays, sys: SystemArrays, eff: Efficiency | None = None) -> np.ndarray | None:
    """[P, O] bool: the operators the PIM runs in one step under ``eff`` (ideal when None);
    None without PIM (``dispatch``)."""
    return op_costs(op, sys, IDEAL if eff is None else eff).on_pim


def step_sum(per_op, count, on_pim, sys: SystemArrays) -> np.ndarray:
    """Σ count x per-operator time, [P]; with PIM, host and PIM work add (blocked host)
    or overlap (concurrent: the larger of the two)."""
    total = per_op * count
    if on_pim is None or not on_pim.any():    # the host's own step: summed as without a PIM
        return total.sum(axis=-1)
    pim = np.where(on_pim, total, 0.0).sum(axis=-1)
    host = np.where(on_pim, 0.0, total).sum(axis=-1)
    return np.where(sys.pim_concurrent, np.maximum(host, pim), host + pim)


def arith_sum(x0, xs, lo, hi):
    """Σ_{j=lo}^{hi-1} (x0 + xs j), elementwise; zero when hi <= lo."""
    n = np.maximum(hi - lo, 0)
    return n * x0 + xs * (lo + hi - 1) * n / 2.0


def decode_general(op0: OpArrays, slope: OpArrays, steps, sys: SystemArrays, eff: Efficiency) -> np.ndarray:
    """Σ over ``steps`` decode steps of Σ count x per-instance time (no step overhead), [P].
    With PIM, each operator keeps one place for the whole generation, chosen by ``dispatch``
    from its time over the whole generation on the host and on the PIM."""
    host = decode_op_totals(op0, slope, steps, sys, eff)
    eligible = pim_eligible(op0, sys)
    if eligible is None:
        return (host * op0.count).sum(axis=-1)
    sel = np.flatnonzero(eligible.any(axis=0))            # price in memory only what the PIM can run
    if sel.size == 0:
        return (host * op0.count).sum(axis=-1)
    pim = host.copy()
    pim[:, sel] = decode_op_totals(subset(op0, sel), subset(slope, sel), steps, sys, eff, eligible[:, sel])
    on_pim = dispatch(host * op0.count, pim * op0.count, eligible, sys.pim_concurrent)
    return step_sum(np.where(on_pim, pim, host), op0.count, on_pim, sys)


def decode_op_totals(op0: OpArrays, slope: OpArrays, steps, sys: SystemArrays, eff: Efficiency,
                      on_pim=None) -> np.ndarray:
    """Σ over ``steps`` decode steps of each operator's per-instance time, [P, O], with the
    operators of ``on_pim`` in memory (None: all on the host)."""
    n = np.asarray(steps, dtype=float)
    n = n[:, None] if n.ndim == 1 else n
    # the slope at the first step's peaks and achieved fractions (its operators' shapes)
    c0, cs = _compute_terms(op0, sys, eff, on_pim, (op0.ops, op0.vector_ops), (slope.ops, slope.vector_ops))
    (dev0, host0), (devs, hosts) = _memory_terms(op0, sys, eff, on_pim, op0, slope)
    if not isinstance(host0, np.ndarray) and not isinstance(hosts, np.ndarray):
        m0, ms, a0, as_ = dev0, devs, 0.0, 0.0
    else:
        ov = sys.overlap[:, None]
        m0, ms = dev0 + np.where(ov, host0, 0.0), devs + np.where(ov, hosts, 0.0)   # inside the max
        a0, as_ = np.where(ov, 0.0, host0), np.where(ov, 0.0, hosts)               # added to it
    # step j costs max(c_j, m_j) = m_j + max(d_j, 0), d_j = c_j - m_j = d0 + ds j: every step's
    # memory time, plus d_j over the steps [lo, hi) where d_j >= 0 (one interval: d is linear)
    d0, ds = c0 - m0, cs - ms
    with np.errstate(divide="ignore", invalid="ignore"):
        root = -d0 / ds
        up_lo = np.clip(np.ceil(root), 0, n)            # ds > 0: compute-bound from here on
        down_hi = np.clip(np.floor(root) + 1, 0, n)     # ds < 0: compute-bound up to here
    lo = np.where(ds > 0, up_lo, np.where((ds < 0) | (d0 >= 0), 0.0, n))     # ds = 0: all steps or none
    hi = np.where(ds < 0, down_hi, n)
    total = arith_sum(m0, ms, 0, n) + arith_sum(d0, ds, lo, hi)
    if np.ndim(a0) or np.ndim(as_):
        total = total + arith_sum(a0, as_, 0, n)
    total = total + link_time(op0, sys, eff) * n   # collective and hop traffic do not grow with the context
    if on_pim is not None:
        total = total + pim_fixed(on_pim, sys) * n
    return total + np.where(has_work(op0), eff.op_overhead_s, 0.0) * n


# ---- the reference entries: a step, a decode, and their energy, operator by operator

def operator_sum(op: OpArrays, sys: SystemArrays, eff: Efficiency) -> np.ndarray:
    """Σ count x per-instance time of a step's operators (``op_costs``, where ``dispatch`` places
    each), without the step overhead, seconds, [P]."""
    cost = op_costs(op, sys, eff)
    return step_sum(cost.time_s, op.count, cost.on_pim, sys)


def step_time(op: OpArrays | Stacked, sys: SystemArrays, eff: Efficiency) -> np.ndarray:
    """Time of one step on every point, seconds, [P]: ``operator_sum`` + step overhead."""
    return operator_sum(per_point(op), sys, eff) + eff.step_overhead_s


def decode_total_time(op0: OpArrays | Stacked, slope: OpArrays | Stacked, steps, sys: SystemArrays,
                      eff: Efficiency) -> np.ndarray:
    """Exact total time of ``steps`` consecutive decode steps (step j costs op0 + j x slope),
    seconds, [P]: each operator's time summed over the steps in closed form (``decode_general``),
    plus a step overhead per step."""
    return (decode_general(per_point(op0), per_point(slope), steps, sys, eff)
            + eff.step_overhead_s * np.asarray(steps, dtype=float))


@dataclass(frozen=True, eq=False)
class OperatorWork:
    """What an energy counts, kept operator by operator: Σ weight x the work of ``op`` with each
    operator in the class ``classes_of`` gives it, over ``parts`` (op, classes_of, weight: a
    number, one per point, or None for 1)."""

    parts: tuple


def step_work(op: OpArrays | Stacked) -> OperatorWork:
    """What a step's energy counts of ``op`` (``energy_j``)."""
    return OperatorWork(((per_point(op), per_point(op), None),))


def decode_total_work(op0, slope, steps) -> OperatorWork:
    """What the energy of ``steps`` consecutive decode steps counts (step j: op0 + j x slope, in
    op0's classes): steps x op0's work plus steps (steps - 1) / 2 x the slope's."""
    n = np.asarray(steps, dtype=float)
    first = per_point(op0)
    return OperatorWork(((first, first, n), (per_point(slope), first, n * (n - 1.0) / 2.0)))


def operator_energy_j(op: OpArrays, classes_of: OpArrays, sys: SystemArrays) -> np.ndarray:
    """Dynamic energy of one instance of each operator of ``op`` run in the class
    ``classes_of`` gives it, J, [P, O]: its ops at that class's J/op, its vector ops at the
    vector units', its device-memory bytes and the bytes it moves over links (each read from
    one device's memory and written to another's; a ring all-reduce moves 2 (tp - 1) / tp of its
    message per device) at the J/bit."""
    op_j = sys.energy_op_j
    e = op_j[:, classes_of.peak_column] * op.ops
    if op.vector_ops is not None:
        e = e + op_j[:, _COL["vector"]][:, None] * op.vector_ops
    tp = np.asarray(sys.tp, dtype=float)[:, None]
    link_bytes = 2.0 * (allreduce_share(tp) * op.comm_bytes + op.p2p_bytes)
    return e + 8.0 * (op.memory_bytes + link_bytes) * np.asarray(sys.energy_bit_j, dtype=float)[:, None]


def energy_j(work: OperatorWork, sys: SystemArrays) -> np.ndarray:
    """Dynamic energy, J, [P], of ``work`` on every point of ``sys``, operator by operator
    (``step_energy_j``'s model); NaN where no device has an energy profile and on a design with
    PIM units."""
    if sys.energy_op_j is None:
        return np.full(sys.size, np.nan)
    total = np.zeros(sys.size)
    for op, classes_of, weight in work.parts:
        e = (operator_energy_j(op, classes_of, sys) * op.count).sum(axis=-1)
        total = total + (e if weight is None else e * weight)
    if sys.pim_peak is not None:
        total = np.where((sys.pim_peak > 0).any(axis=1), np.nan, total)
    return total


def step_energy_j(op: OpArrays | Stacked, sys: SystemArrays) -> np.ndarray:
    """Dynamic energy of one step on one device, J, [P] (``energy_j`` of ``step_work``)."""
    return energy_j(step_work(op), sys)


def decode_total_energy_j(op0, slope, steps, sys: SystemArrays) -> np.ndarray:
    """Dynamic energy of ``steps`` consecutive decode steps on one device, J, [P]
    (``energy_j`` of ``decode_total_work``)."""
    return energy_j(decode_total_work(op0, slope, steps), sys)
