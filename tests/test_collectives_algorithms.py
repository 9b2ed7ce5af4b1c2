"""Collectives by algorithm and message size (``dse.core.collectives``) against their closed forms
(Thakur, Rabenseifner and Gropp, IJHPCA 2005, section 4): the hierarchical all-to-all's hop count
O(G_node + G / G_node) against the flat O(G); the ring and one-shot all-reduce crossing over at
the closed-form message size, with the tuner (``choose``) switching there; a two-level all-reduce
that is the domain's ring plus the inter-domain term. Expected values are written out by hand."""
from __future__ import annotations

import math

import numpy as np
import pytest

from dse.core import collectives as C

NVLINK = (450e9, 1.5e-6)      # bytes/s per direction, s (configs/links.yaml nvswitch-h100)
IB_NDR = (50e9, 150e-9)       # configs/links.yaml ib-ndr


@pytest.mark.parametrize("group, node", [(64, 8), (144, 8), (72, 72), (256, 16), (16, 8)])
def test_hierarchical_all_to_all_hop_count_is_g_node_plus_g_over_g_node(group, node):
    flat = C.alltoall_hops(group, node, False)
    hier = C.alltoall_hops(group, node, True)
    assert flat == group - 1
    assert hier == (node - 1) + (group // node - 1)
    if group > node:
        assert hier < flat


def test_hop_count_scaling_is_sqrt_at_best():
    """O(G) vs O(G_node + G / G_node): at G_node = sqrt(G) the hierarchical count is 2 (sqrt(G) - 1)."""
    for g in (16, 64, 256, 1024):
        root = int(math.isqrt(g))
        assert C.alltoall_hops(g, root, True) == 2 * (root - 1)
        assert C.alltoall_hops(g, root, False) == g - 1


def test_latency_bound_all_to_all_costs_its_hops():
    """A message of ~0 bytes: flat pays (d - 1) intra hops and (n - d) crossings; hierarchical
    (d - 1) intra hops and (k - 1) crossings (a crossing = scale-up + scale-out latency)."""
    n, d = 64, 8
    up_lat, out_lat = 1.5e-6, 150e-9
    t = C.alltoall_two_tier(1e-9, n, d, 450e9, up_lat, 50e9, out_lat)
    cross = up_lat + out_lat
    assert t[0] == pytest.approx(7 * up_lat + 56 * cross, rel=1e-6)
    assert t[1] == pytest.approx(7 * up_lat + 7 * cross, rel=1e-6)


def test_bandwidth_bound_all_to_all_closed_form():
    """A large message with zero latencies: flat sends (d-1)/n inside and (n-d)/n across; the
    hierarchical sends (d-1)/d inside then (k-1)/k across."""
    n, d, m = 16, 8, 1e9
    t = C.alltoall_two_tier(m, n, d, 400e9, 0.0, 50e9, 0.0)
    assert t[0] == pytest.approx(7 / 16 * m / 400e9 + 8 / 16 * m / 50e9)
    assert t[1] == pytest.approx(7 / 8 * m / 400e9 + 1 / 2 * m / 50e9)


@pytest.mark.parametrize("n", [4, 8, 16, 72])
def test_ring_and_one_shot_cross_over_at_the_closed_form_size(n):
    bw, lat = NVLINK
    # ring: 2 (n-1)/n M/bw + 2 (n-1) lat; one-shot: (n-1) M/bw + lat; equal where
    # (n-1)(n-2)/n M/bw = (2n-3) lat
    cross = (2 * n - 3) * lat * bw * n / ((n - 1) * (n - 2))
    assert C.ring_one_shot_crossover_bytes(n, bw, lat) == pytest.approx(cross)
    ring = 2 * (n - 1) / n * cross / bw + 2 * (n - 1) * lat
    one = (n - 1) * cross / bw + lat
    assert ring == pytest.approx(one)
    sizes = np.array([cross * 0.5, cross * 0.99, cross * 1.01, cross * 2.0])
    t = C.allreduce_single(sizes, n, bw, lat)
    best, algo = C.choose(t, allowed=[True, True, False])          # ring or one-shot only
    names = [C.SINGLE_TIER_ALLREDUCE[i] for i in algo]
    assert names == ["one-shot", "one-shot", "ring", "ring"]
    assert np.all(best == np.minimum(t[0], t[1]))


def test_choose_is_vectorized_over_points_and_sizes():
    """Per point (n, latency) and message size at once: the tuner picks one-shot below each
    point's crossover and the ring above it."""
    n = np.array([4.0, 8.0, 16.0])[:, None]
    lat = np.array([1e-6, 1.5e-6, 3e-6])[:, None]
    bw = 450e9
    cross = C.ring_one_shot_crossover_bytes(n, bw, lat)
    sizes = cross * np.array([0.5, 2.0])[None, :]
    _, algo = C.choose(C.allreduce_single(sizes, n, bw, lat), allowed=[True, True, False])
    assert algo.shape == (3, 2)
    assert (algo[:, 0] == 1).all() and (algo[:, 1] == 0).all()


def test_tree_is_latency_light_bandwidth_heavy():
    bw, lat = NVLINK
    n = 64
    assert C.tree_allreduce_s(0.0, n, bw, lat) == pytest.approx(2 * 6 * lat)       # 2 log2(64) hops
    assert C.ring_allreduce_wire_s(0.0, n, bw, lat) == pytest.approx(2 * 63 * lat)
    big = 1e9
    assert C.tree_allreduce_s(big, n, bw, 0.0) == pytest.approx(12 * big / bw)
    assert C.ring_allreduce_wire_s(big, n, bw, 0.0) == pytest.approx(2 * 63 / 64 * big / bw)


def test_all_gather_and_reduce_scatter_closed_form():
    bw, lat = NVLINK
    assert C.ring_allgather_s(8e6, 8, bw, lat) == pytest.approx(7 / 8 * 8e6 / bw + 7 * lat)
    assert C.ring_reduce_scatter_s(8e6, 8, bw, lat) == pytest.approx(7 / 8 * 8e6 / bw + 7 * lat)
    # a ring all-reduce is a reduce-scatter then an all-gather
    assert C.ring_allreduce_wire_s(8e6, 8, bw, lat) == pytest.approx(2 * C.ring_allgather_s(8e6, 8, bw, lat))


def test_point_to_point():
    assert C.point_to_point_s(1e6, 50e9, 1e-6) == pytest.approx(1e6 / 50e9 + 1e-6)
    assert C.point_to_point_s(0.0, 50e9, 1e-6) == 0.0


def test_hierarchical_all_reduce_is_the_domain_ring_plus_the_inter_domain_term():
    """tp 16 on two 8-GPU NVSwitch nodes joined by NDR: reduce-scatter + all-gather inside each
    node (= the 8-GPU ring), and an all-reduce of the 1/8 shard across the 2 nodes."""
    m = 64 * 2**20
    (ub, ul), (ob, ol) = NVLINK, IB_NDR
    t = C.allreduce_two_tier(m, 16, 8, ub, ul, ob, ol)
    intra = 2 * 7 / 8 * m / ub + 14 * ul
    cross = ul + ol
    shard = m / 8
    expect = {
        "ring": 2 * 15 / 16 * m / ob + 30 * cross,
        "hierarchical/ring": intra + 2 * 1 / 2 * shard / ob + 2 * cross,
        "hierarchical/one-shot": intra + shard / ob + cross,
        "hierarchical/tree": intra + 2 * (cross + shard / ob),
    }
    for name, value in expect.items():
        assert t[C.TWO_TIER_ALLREDUCE.index(name)] == pytest.approx(value), name
    # bounded below by the scale-out bandwidth term: the shard must cross the NIC once each way
    assert t.min() >= shard / ob


def test_a_group_inside_one_domain_does_not_cross():
    """n <= d: one domain, k = 1; the hierarchical all-reduce is exactly the ring on the scale-up tier."""
    per, k = C.domains(8, 8)
    assert (per, k) == (8, 1)
    m = 1e6
    t = C.allreduce_two_tier(m, 8, 8, *NVLINK, *IB_NDR)
    assert t[1] == pytest.approx(C.ring_allreduce_wire_s(m, 8, *NVLINK))


def test_uneven_groups_fill_domains_evenly():
    assert C.domains(12, 8) == (6, 2)
    assert C.domains(144, 72) == (72, 2)
