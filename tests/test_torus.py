"""Collectives inside a torus domain (``dse.core.collectives.allreduce_torus``, ``alltoall_torus_s``):
the per-dimension ring ('bucket') all-reduce with its message shrinking by each dimension's
extent, its multi-share form using every dimension's links at once, one ring, and the
dimension-ordered all-to-all, against their closed forms; the tuner takes the fastest, and a
Trainium2 tensor-parallel group on its 4x4 torus is priced by it."""
import numpy as np
import pytest

from dse import evaluate
from dse.core.collectives import TORUS_ALLREDUCE, allreduce_torus, alltoall_torus_s, choose, torus_extents

BW, LAT = 1024e9, 1.5e-6            # Trainium2's NeuronLink-v3 per chip and per hop (configs/links.yaml)
M = 64e6


def test_extents_fill_dimension_by_dimension():
    assert torus_extents(8, np.array([4.0, 4.0, 1.0])).tolist() == [4, 2, 1]
    assert torus_extents(64, np.array([4.0, 4.0, 4.0])).tolist() == [4, 4, 4]
    assert torus_extents(2, np.array([16.0, 16.0, 1.0])).tolist() == [2, 1, 1]


def test_whole_4x4_torus_closed_forms():
    # 2 dimensions: a link carries bw / 4 a direction; both dimensions whole rings (both directions)
    b = BW / 4
    ring, bucket, multi = allreduce_torus(M, 16, np.array([4.0, 4.0, 1.0]), BW, 0.0)
    assert ring == pytest.approx(2 * 15 / 16 * M / (2 * b))
    assert bucket == pytest.approx(2 * (3 / 4 * M / (2 * b) + 3 / 4 * (M / 4) / (2 * b)))
    # two half-messages, each on its own dimension per phase: the switch ring's bandwidth term
    assert multi == pytest.approx(2 * 15 / 16 * M / BW)
    # latency: 2 (n - 1) hops for the ring, 2 x (3 + 3) for the bucket and for multi (each phase's longest ring)
    lat_only = allreduce_torus(0.0, 16, np.array([4.0, 4.0, 1.0]), BW, LAT)
    assert lat_only.tolist() == pytest.approx([30 * LAT, 12 * LAT, 12 * LAT])


def test_3d_torus_multi_share_uses_every_link():
    multi = allreduce_torus(M, 64, np.array([4.0, 4.0, 4.0]), BW, 0.0)[2]
    assert multi == pytest.approx(2 * 63 / 64 * M / BW)


def test_a_group_on_one_dimension_gets_that_dimensions_links_alone():
    # 4 chips on one whole ring of a 4x4 torus: every algorithm is that ring, at 2 links of bw / 4
    t = allreduce_torus(M, 4, np.array([4.0, 4.0, 1.0]), BW, LAT)
    expected = 2 * 3 / 4 * M / (2 * BW / 4) + 2 * 3 * LAT
    assert t.tolist() == pytest.approx([expected] * 3)
    # 2 of 4 chips of a ring: a line, one link each way
    assert allreduce_torus(M, 2, np.array([4.0, 4.0, 1.0]), BW, 0.0)[0] == pytest.approx(M / (BW / 4))


def test_alltoall_busiest_link_closed_form():
    # whole 4x4: the busiest link of a dimension carries M x 4 / 8; 2 + 2 hops of diameter
    t = alltoall_torus_s(M, 16, np.array([4.0, 4.0, 1.0]), BW, LAT)
    assert t == pytest.approx(M * 4 / 8 / (BW / 4) + 4 * LAT)


def test_tuner_picks_multi_for_latency_and_bandwidth_on_a_whole_torus():
    for message in (1e3, 1e9):
        _, i = choose(allreduce_torus(message, 16, np.array([4.0, 4.0, 1.0]), BW, LAT))
        assert TORUS_ALLREDUCE[int(i)] == "torus/multi"


def test_trainium2_tensor_parallel_all_reduce_is_the_torus_closed_form():
    """tp 16 on trn2.48xlarge's 4x4 torus, ideal engine (no software latency or derating): the
    decode step's all-reduce of 8 tokens x 8192 x 2 bytes is the multi-share bucket's
    2 (15/16) M / bw + 12 hops (against 30 hops of one ring over a switch)."""
    ev = evaluate({"hardware": "trainium2", "model": "llama-3.1-70b", "batch": 8, "prompt_len": 1024, "gen_len": 4,
                   "tp": 16, "devices": 16}, ideal=True, explain=[0])
    row = {r["name"]: r for r in ev.explained[0]["decode"]}["attn_all_reduce"]
    m = 8 * 8192 * 2
    assert row["comm_bytes"] == m
    assert row["time_s"] == pytest.approx(2 * 15 / 16 * m / BW + 12 * LAT, rel=1e-9)
    # the same chips as a switch domain (the topology's dims dropped): one ring's 30 hops
    flat = evaluate({"hardware": "trainium2", "model": "llama-3.1-70b", "batch": 8, "prompt_len": 1024, "gen_len": 4,
                     "tp": 16, "devices": 16, "scale_up_size": 16}, ideal=True, explain=[0])
    row = {r["name"]: r for r in flat.explained[0]["decode"]}["attn_all_reduce"]
    assert row["time_s"] == pytest.approx(2 * 15 / 16 * m / BW + 30 * LAT, rel=1e-9)
