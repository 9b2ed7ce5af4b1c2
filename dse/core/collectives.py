"""Collectives under a latency-bandwidth (alpha-beta) model: the bytes each device's link carries
(``allreduce_share``, one rule for every layer that prices it: the reference and fast kernels,
the energy of link traffic, the kernel layer's NCCL model) and the time of each collective by
algorithm and message size, over one tier (a link of ``bw`` bytes/s per direction per device and
``lat`` seconds per hop) or two (scale-up domains of ``d`` devices joined by a scale-out tier).

Closed forms, for ``n`` devices and a message of ``M`` bytes (Thakur, Rabenseifner and Gropp,
'Optimization of Collective Communication Operations in MPICH', IJHPCA 19(1), 2005, section 4:
ring / pairwise-exchange and binomial-tree costs; NCCL's one-shot and two-level algorithms are the
same terms composed):

- ring all-reduce: a reduce-scatter then an all-gather, 2 (n - 1) steps of M / n:
  2 (n - 1) / n x M / bw + 2 (n - 1) lat (bandwidth-optimal, latency-heavy);
- one-shot all-reduce: every device sends its whole message to the n - 1 others and reduces
  locally: (n - 1) x M / bw + lat (one step: latency-light, bandwidth-heavy);
- tree all-reduce: a binomial-tree reduce then broadcast, 2 ceil(log2 n) x (lat + M / bw);
- all-gather / reduce-scatter (ring; M the gathered message): (n - 1) / n x M / bw + (n - 1) lat;
- all-to-all (pairwise exchange; M the bytes each device holds for all): (n - 1) / n x M / bw
  + (n - 1) lat: n - 1 hops;
- point-to-point: M / bw + lat.

Two tiers (``n`` devices in domains of ``d``, k = n / d domains). A step that crosses domains
pays ``lat_up + lat_out``: the device's own end-to-end link latency (its path out to the NIC) plus
the scale-out switch hop (configs/links.yaml gives switched fabrics their one-hop switch latency,
not an end-to-end figure, so a crossing is never cheaper than a step inside the domain):

- hierarchical all-reduce: reduce-scatter inside each domain, all-reduce of the M / d shard across
  the k domains over the scale-out tier (ring, tree or one-shot), all-gather inside:
  2 (d - 1) / d x M / bw_up + 2 (d - 1) lat_up + inter-domain all-reduce(M / d, k, scale-out);
  the intra-domain part is exactly the ring all-reduce of the domain's d devices;
- flat ring over all n devices crossing the scale-out: each step waits for the slowest link,
  2 (n - 1) / n x M / bw_out + 2 (n - 1) (lat_up + lat_out);
- flat all-to-all: n - 1 hops, d - 1 of them inside the domain and n - d across it;
- hierarchical all-to-all: an exchange inside the domain then one across domains, (d - 1)
  + (k - 1) hops: O(G_node + G / G_node) instead of O(G).

A torus domain (TPU v5p 3D, v6e and Trainium2 2D; ``dims`` k_1 .. k_D): each chip's scale-up
bandwidth ``bw`` per direction is spread over its 2 D torus links, b = bw / (2 D) per link and
direction. A group of n devices fills the torus dimension by dimension (extents e_i, prod e_i = n);
a dimension it fills whole is a ring both of whose directions carry half the message
(c_i = 2), a part of one is a line (c_i = 1). The per-dimension ring all-reduce ('bucket'
algorithm: a reduce-scatter along each dimension in turn, the message shrinking by e_i each
time, then the all-gathers in reverse; the torus baseline of De Sensi, Bonato, Saam and Hoefler,
'Swing: Short-cutting Rings for Higher Bandwidth Allreduce', NSDI 2024, arXiv:2401.09356, each
dimension's ring Thakur et al.'s):

- torus/bucket: 2 Σ_i (e_i - 1) / e_i x M_i / (c_i b) + 2 Σ_i (e_i - 1) lat,  M_1 = M,
  M_{i+1} = M_i / e_i;
- torus/multi: the message split into U shares (U dimensions used), share s taking the
  dimensions in the order rotated by s, so that in each phase every share is on its own
  dimension's links: 2 Σ_phases max_s (e - 1) / e x M_s / (c b) + 2 Σ_phases max_s (e - 1) lat;
  on equal whole dimensions its bandwidth term is the switch ring's, 2 (n - 1) / n x M / bw;
- ring: one bidirectional ring through the group (a Hamiltonian cycle of the sub-torus, two links
  a chip; a line's ring runs each link both ways): 2 (n - 1) / n x M / (c b) + 2 (n - 1) lat;
- all-to-all (dimension-ordered routing, each device holding M for the whole group): the busiest
  link of dimension i carries M e_i / 8 over a whole ring (mean distance e_i / 4, 2 n links a
  dimension) and M e_i / 4 over a line (its middle link), the dimensions' links in parallel:
  max_i M e_i / (a_i b), a_i = 8 or 4, plus lat per hop of the group's diameter.

Every function broadcasts over numpy arrays (one entry per design point); ``choose`` picks the
fastest of the algorithms given for each point (``np.argmin`` over the candidates, as NCCL's tuner
picks by message size) and says which. Times here are the wire's: the caller adds the software's
latency once per collective and derates ``bw`` by its achieved fraction.
"""
from __future__ import annotations

import numpy as np

#: all-reduce algorithms over one tier, in the order ``allreduce_single`` lists them
SINGLE_TIER_ALLREDUCE = ("ring", "one-shot", "tree")
#: all-reduce algorithms over two tiers: a flat ring, or hierarchical with each inter-domain algorithm
TWO_TIER_ALLREDUCE = ("ring", "hierarchical/ring", "hierarchical/one-shot", "hierarchical/tree")
#: all-to-all algorithms over two tiers
TWO_TIER_ALLTOALL = ("flat", "hierarchical")
#: all-reduce algorithms inside a torus domain, in the order ``allreduce_torus`` lists them
TORUS_ALLREDUCE = ("ring", "torus/bucket", "torus/multi")


def allreduce_share(n):
    """Bytes each of ``n`` devices sends per byte of message in a ring all-reduce (a reduce-scatter
    then an all-gather, each moving (n - 1) / n of it): 2 (n - 1) / n; 0 for one device. Broadcasts."""
    return 2 * (n - 1) / n


def _f(x):
    return np.asarray(x, dtype=float)


def _div(a, b):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(_f(a) == 0, 0.0, _f(a) / _f(b))


def ring_allreduce_wire_s(message, n, bw, lat):
    """Seconds of a ring all-reduce of ``message`` bytes over ``n`` devices: 2 (n - 1) / n x
    message / bw + 2 (n - 1) lat; 0 for one device. Broadcasts."""
    n = _f(n)
    with np.errstate(invalid="ignore", divide="ignore"):
        return allreduce_share(n) * _f(message) / _f(bw) + 2 * (n - 1) * _f(lat)


def one_shot_allreduce_s(message, n, bw, lat):
    """Seconds of a one-shot all-reduce: (n - 1) x message / bw + lat (one step); 0 for one device."""
    n = _f(n)
    return np.where(n > 1, (n - 1) * _div(message, bw) + _f(lat), 0.0)


def tree_allreduce_s(message, n, bw, lat):
    """Seconds of a binomial-tree reduce then broadcast: 2 ceil(log2 n) x (lat + message / bw)."""
    n = _f(n)
    return 2 * np.ceil(np.log2(np.maximum(n, 1.0))) * (_f(lat) + _div(message, bw))


def ring_allgather_s(message, n, bw, lat):
    """Seconds of a ring all-gather (or reduce-scatter) whose gathered message holds ``message``
    bytes: (n - 1) / n x message / bw + (n - 1) lat."""
    n = _f(n)
    return (n - 1) / n * _div(message, bw) + (n - 1) * _f(lat)


ring_reduce_scatter_s = ring_allgather_s


def point_to_point_s(message, bw, lat):
    """Seconds of one message: message / bw + lat (0 for an empty message)."""
    return np.where(_f(message) > 0, _div(message, bw) + _f(lat), 0.0)


def allreduce_single(message, n, bw, lat) -> np.ndarray:
    """[len(SINGLE_TIER_ALLREDUCE), ...] seconds of each one-tier all-reduce algorithm."""
    return np.stack(np.broadcast_arrays(ring_allreduce_wire_s(message, n, bw, lat),
                                        one_shot_allreduce_s(message, n, bw, lat),
                                        tree_allreduce_s(message, n, bw, lat)))


def domains(n, d):
    """(devices per domain, domains) of a group of ``n`` devices placed on domains of ``d``: the
    group fills ceil(n / d) domains evenly (n / ceil(n / d) each); inside one domain, (n, 1)."""
    n, d = _f(n), _f(d)
    k = np.maximum(np.ceil(n / d), 1.0)
    return n / k, k


def allreduce_two_tier(message, n, d, up_bw, up_lat, out_bw, out_lat) -> np.ndarray:
    """[len(TWO_TIER_ALLREDUCE), ...] seconds of each all-reduce algorithm of a group of ``n``
    devices on domains of ``d`` (``domains``) joined by a scale-out tier: the flat ring (every
    step at the scale-out bandwidth and the slower latency) and the hierarchical ones (ring inside
    the domain, then ring / one-shot / tree across domains on the 1/d shard)."""
    per, k = domains(n, d)
    cross = _f(up_lat) + _f(out_lat)
    flat = ring_allreduce_wire_s(message, n, out_bw, cross)
    intra = ring_allreduce_wire_s(message, per, up_bw, up_lat)
    shard = _div(message, per)
    inter = allreduce_single(shard, k, out_bw, cross)
    return np.stack(np.broadcast_arrays(flat, *(intra + t for t in inter)))


def alltoall_hops(n, d, hierarchical):
    """Latency hops of an all-to-all over ``n`` devices on domains of ``d``: n - 1 flat; (d - 1) +
    (k - 1) hierarchical (k = n / d domains), O(G_node + G / G_node) instead of O(G)."""
    per, k = domains(n, d)
    return np.where(hierarchical, (per - 1) + (k - 1), _f(n) - 1)


def alltoall_two_tier(message, n, d, up_bw, up_lat, out_bw, out_lat) -> np.ndarray:
    """[len(TWO_TIER_ALLTOALL), ...] seconds of an all-to-all in which each of ``n`` devices holds
    ``message`` bytes for the whole group, on domains of ``d`` joined by a scale-out tier:

    flat: (d - 1) / n of it to domain peers and (n - d) / n across, one hop per peer;
    hierarchical: (per - 1) / per of it exchanged inside the domain, then (k - 1) / k across
    domains in (k - 1) hops (per = devices per domain, k domains)."""
    per, k = domains(n, d)
    n = _f(n)
    cross = _f(up_lat) + _f(out_lat)
    flat = ((per - 1) / n * _div(message, up_bw) + (n - per) / n * _div(message, out_bw)
            + (per - 1) * _f(up_lat) + (n - per) * cross)
    hier = (ring_allgather_s(message, per, up_bw, up_lat) + ring_allgather_s(message, k, out_bw, cross))
    return np.stack(np.broadcast_arrays(flat, hier))


def choose(times: np.ndarray, allowed=None) -> tuple[np.ndarray, np.ndarray]:
    """(the fastest time, the index of its algorithm) over axis 0 of ``times`` ([A, ...]),
    among the algorithms ``allowed`` (a bool per algorithm; None: all)."""
    t = np.asarray(times, dtype=float)
    if allowed is not None:
        t = np.where(np.asarray(allowed, dtype=bool).reshape((-1,) + (1,) * (t.ndim - 1)), t, np.inf)
    i = np.argmin(t, axis=0)
    return np.take_along_axis(t, i[None], axis=0)[0], i


def ring_one_shot_crossover_bytes(n, bw, lat):
    """Message bytes at which the ring and one-shot all-reduce of ``n`` devices take equal time:
    2 (n - 1) / n M / bw + 2 (n - 1) lat = (n - 1) M / bw + lat gives
    M = (2n - 3) n lat bw / ((n - 1)(n - 2)); below it one-shot is faster (n > 2; inf for n <= 2,
    where one-shot never loses)."""
    n = _f(n)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(n > 2, (2 * n - 3) * n * _f(lat) * _f(bw) / ((n - 1) * (n - 2)), np.inf)


def torus_extents(n, dims) -> np.ndarray:
    """[..., D] extents of a group of ``n`` devices ([...]) on a torus of ``dims`` ([..., D], 1 where a
    point has fewer dimensions), filled dimension by dimension: e_i = min(k_i, what is left)."""
    dims = _f(dims)
    left = np.maximum(_f(n), 1.0)
    out = []
    for i in range(dims.shape[-1]):
        e = np.minimum(dims[..., i], left)
        out.append(e)
        left = np.maximum(left / e, 1.0)
    return np.stack(out, axis=-1)


def _torus_terms(n, dims, bw):
    """(extents [..., D], ring factor c [..., D]: 2 for a whole ring of more than 2, else 1, and the
    bandwidth b of one link and direction, bw / (2 D) with D the torus's dimensions of size > 1)."""
    dims = _f(dims)
    e = torus_extents(n, dims)
    c = np.where((e == dims) & (dims > 2), 2.0, 1.0)
    d = np.maximum(np.sum(dims > 1, axis=-1), 1)
    return e, c, _f(bw) / (2.0 * d)


def allreduce_torus(message, n, dims, bw, lat) -> np.ndarray:
    """[len(TORUS_ALLREDUCE), ...] seconds of each all-reduce of ``message`` bytes over ``n``
    devices of a torus of ``dims`` ([..., D]) whose chips have ``bw`` bytes/s per direction in all
    and ``lat`` s a hop (module docstring): one ring, the per-dimension bucket, and the bucket run
    as U concurrent shares in rotated dimension orders. 0 for one device."""
    m, n, lat = _f(message), _f(n), _f(lat)
    e, c, b = _torus_terms(n, dims, bw)
    one_line = np.sum(e > 1, axis=-1) <= 1
    c_ring = np.where(one_line, np.max(c, axis=-1), 2.0)
    ring = np.where(n > 1, allreduce_share(n) * _div(m, c_ring * b) + 2 * (n - 1) * lat, 0.0)
    # bucket: dimensions in order, the message shrinking by each extent
    bucket, mi = 0.0, m
    for i in range(e.shape[-1]):
        bucket = bucket + 2 * ((e[..., i] - 1) / e[..., i] * _div(mi, c[..., i] * b) + (e[..., i] - 1) * lat)
        mi = mi / e[..., i]
    # multi: the used dimensions first (largest extent first), U shares in rotated orders
    order = np.argsort(-e, axis=-1, kind="stable")
    es, cs = np.take_along_axis(e, order, axis=-1), np.take_along_axis(c, order, axis=-1)
    used = np.sum(e > 1, axis=-1)
    multi = bucket
    for u in range(2, e.shape[-1] + 1):
        total = 0.0
        share = [m / u] * u
        for phase in range(u):
            step = 0.0
            for s_ in range(u):
                j = (s_ + phase) % u
                t = (es[..., j] - 1) / es[..., j] * _div(share[s_], cs[..., j] * b) + (es[..., j] - 1) * lat
                step = np.maximum(step, t)
                share[s_] = share[s_] / es[..., j]
            total = total + 2 * step
        multi = np.where(used == u, total, multi)
    return np.stack(np.broadcast_arrays(ring, bucket, multi))


def alltoall_torus_s(message, n, dims, bw, lat):
    """Seconds of an all-to-all in which each of ``n`` devices of a torus of ``dims`` holds
    ``message`` bytes for the whole group (module docstring): max_i M e_i / (a_i b) + lat x the
    group's diameter; 0 for one device."""
    m, n = _f(message), _f(n)
    e, c, b = _torus_terms(n, dims, bw)
    a = np.where(c == 2.0, 8.0, 4.0)
    wire = np.max(e / a, axis=-1) * _div(m, b)
    hops = np.sum(np.where(c == 2.0, np.floor(e / 2), e - 1), axis=-1)
    return np.where(n > 1, wire + hops * _f(lat), 0.0)
