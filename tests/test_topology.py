"""Topologies (``hwmodels.topology``, ``configs/topologies.yaml``) wired into the evaluator: the
presets' figures read from the shipped YAML files (their links from configs/links.yaml, never
restated), a tensor-parallel group inside its domain priced as before topologies, a group over two
domains paying the scale-out tier (closed form), the expert all-to-all across domains, the fast
kernel equal to the reference there, the flags' one-line errors, and analyze's layout line."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from dse import evaluate
from dse.core import kernel_fast, operator_cost
from dse.core.collectives import ring_one_shot_crossover_bytes
from dse.core.efficiency import IDEAL
from dse.core.kernel_arrays import OpArrays, SystemArrays
from dse.core.roofline import PEAK_COLUMNS, reference_kernel
from dse.study.cli import main
from hwmodels.presets import load_device
from hwmodels.topology import SHAPES, available_topologies, load_topology, system_topology, tiers_label

ROOT = Path(__file__).resolve().parents[1]
TOPOLOGIES = yaml.safe_load((ROOT / "configs" / "topologies.yaml").read_text())
LINKS = yaml.safe_load((ROOT / "configs" / "links.yaml").read_text())["links"]


def test_every_preset_is_cited_and_its_links_are_links_yaml_entries():
    sources = TOPOLOGIES["sources"]
    assert set(available_topologies()) == set(TOPOLOGIES["topologies"])
    for name, node in TOPOLOGIES["topologies"].items():
        t = load_topology(name)
        for tier in ("scale_up", "scale_out"):
            if tier in node:
                cited = [s.strip() for s in str(node[tier]["source"]).split(";")]
                assert all(s in sources for s in cited), (name, tier, cited)
        assert t.scale_up.shape in SHAPES
        assert t.scale_up.size == node["scale_up"]["size"]
        if "scale_out" in node:
            link = LINKS[node["scale_out"]["link"]]
            assert t.scale_out.link.bandwidth_bytes_per_s == float(link["bandwidth_bytes_per_s"]["value"])


@pytest.mark.parametrize("name, size, out", [("dgx-h100", 8, 50e9), ("dgx-h200", 8, 50e9), ("hgx-b200", 8, 50e9),
                                             ("gb200-nvl72", 72, 50e9), ("mi300x-platform", 8, None),
                                             ("tpu-v5p-pod", 8960, None), ("tpu-v6e-pod", 256, None)])
def test_cited_domain_sizes_and_nics(name, size, out):
    """DGX H100/H200/B200: 8 GPUs and one 400 Gb/s ConnectX-7 (50 GB/s) per GPU (NVIDIA DGX
    BasePOD RA); GB200 NVL72: 72-GPU NVLink domain, 4x 400G per 4-GPU tray (DGX GB200 user guide);
    MI300X: 8 GPUs; TPU v5p pod 8960 chips, v6e 256."""
    t = load_topology(name)
    assert t.scale_up.size == size
    assert (t.scale_out is None) == (out is None)
    if out is not None:
        assert t.scale_out.link.bandwidth_bytes_per_s == out


def test_a_topology_scale_up_link_is_its_hardware_presets_own():
    """The scale-up tier is priced at the device's own link: where a topology names its link, the
    hardware preset it belongs to has that link's bandwidth."""
    for name in available_topologies():
        t = load_topology(name)
        if t.scale_up.link is None:
            continue
        for hw in t.hardware:
            dev = load_device(hw)
            bw = float(LINKS[t.scale_up.link]["bandwidth_bytes_per_s"]["value"])
            assert dev.interconnect.bandwidth_bytes_per_s == bw, (name, hw)


def test_hardware_defaults_and_hypothetical_systems():
    assert system_topology("h100-sxm").name == "dgx-h100"
    assert system_topology("a100-80gb").scale_up.size == np.inf          # no preset: one link for all
    hypo = system_topology("a100-80gb", scale_up_size=4, scale_out="ethernet-100g")
    assert hypo.scale_up.size == 4 and hypo.scale_out.link.bandwidth_bytes_per_s == 12.5e9
    assert tiers_label(16, load_topology("dgx-h100")) == "NVSwitch h100 8 + IB NDR x2"
    assert tiers_label(8, load_topology("dgx-h100")) == "NVSwitch h100 8"


# ---- the evaluator

def _point(**kw):
    base = {"model": "llama-3.1-70b", "hardware": "h100-sxm", "batch": 8, "prompt_len": 512, "gen_len": 64}
    return {**base, **kw}


def _metrics(ev):
    return {k: float(ev.metrics[k][0]) for k in ("ttft_s", "tpot_s", "output_tokens_per_s")}


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_a_group_inside_its_domain_prices_as_before(tp):
    """tp <= 8 on DGX H100: the same price as a system whose one domain holds every device (the
    one-link model before topologies)."""
    own = _metrics(evaluate(_point(tp=tp)))
    one_link = _metrics(evaluate(_point(tp=tp, scale_up_size=1024)))
    assert own == one_link


def test_a_group_over_two_domains_pays_the_scale_out_tier():
    """tp 16 on two DGX H100 nodes: prefill (bandwidth-bound all-reduces) slower than in one
    16-GPU domain, slower still over 100 GbE, faster over XDR; never faster than in one domain."""
    two_nodes = _metrics(evaluate(_point(tp=16)))
    one_domain = _metrics(evaluate(_point(tp=16, scale_up_size=16)))
    slow = _metrics(evaluate(_point(tp=16, scale_out="ethernet-100g")))
    fast = _metrics(evaluate(_point(tp=16, scale_out="ib-xdr")))
    assert two_nodes["ttft_s"] > one_domain["ttft_s"]
    assert slow["ttft_s"] > two_nodes["ttft_s"] > fast["ttft_s"] >= one_domain["ttft_s"]
    assert two_nodes["tpot_s"] >= one_domain["tpot_s"]


def _system(tp, size, out_bw, out_lat, ep=1.0, n=1):
    one = np.ones(n)
    return SystemArrays(np.full((n, len(PEAK_COLUMNS)), 1e15), 3.35e12 * one, 80e9 * one, 450e9 * one, 1.5e-6 * one,
                        tp * one, scale_up_size=size * one, scale_out_bandwidth=out_bw * one,
                        scale_out_latency=out_lat * one, ep=ep * one)


def _ops(comm=0.0, p2p=0.0):
    z = np.zeros(1)
    return OpArrays(ops=np.ones(1), weight_bytes=z + 1.0, act_bytes=z, kv_bytes=z, comm_bytes=z + comm,
                    p2p_bytes=z + p2p, peak_column=np.zeros(1, dtype=int), count=np.ones(1))


def test_spanning_all_reduce_closed_form_ideal():
    """Under IDEAL (no derating, no software latency), a 64 MiB all-reduce over tp 16 on 8-GPU
    domains joined by NDR costs the 8-GPU ring plus the one-shot of the 8 MiB shard across the two
    nodes (the fastest inter-domain algorithm here), hand-computed."""
    m = 64 * 2**20
    sys = _system(16, 8, 50e9, 150e-9)
    t = float(operator_cost.collective_time(np.array([m]), sys, IDEAL)[0, 0])
    intra = 2 * 7 / 8 * m / 450e9 + 14 * 1.5e-6
    inter_ring = 2 * 1 / 2 * (m / 8) / 50e9 + 2 * (1.5e-6 + 150e-9)
    inter_one_shot = (m / 8) / 50e9 + (1.5e-6 + 150e-9)
    assert t == pytest.approx(intra + min(inter_ring, inter_one_shot))
    inside = float(operator_cost.collective_time(np.array([m]), _system(16, 16, 50e9, 150e-9), IDEAL)[0, 0])
    assert inside == pytest.approx(2 * 15 / 16 * m / 450e9 + 30 * 1.5e-6)
    assert t >= inside and t >= (m / 8) / 50e9


def test_expert_all_to_all_across_domains():
    """ep 16 x tp 1 on 8-GPU domains: the dispatch pays the scale-out tier; inside one domain it
    is one message over the scale-up link as before."""
    b = 4 * 2**20
    inside = float(operator_cost.p2p_time(np.array([b]), _system(1, 16, 50e9, 150e-9, ep=16), IDEAL)[0, 0])
    assert inside == pytest.approx(b / 450e9 + 1.5e-6)
    across = float(operator_cost.p2p_time(np.array([b]), _system(1, 8, 50e9, 150e-9, ep=16), IDEAL)[0, 0])
    held = b * 16 / 15
    cross = 1.5e-6 + 150e-9
    flat = 7 / 16 * held / 450e9 + 8 / 16 * held / 50e9 + 7 * 1.5e-6 + 8 * cross
    hier = 7 / 8 * held / 450e9 + 7 * 1.5e-6 + 1 / 2 * held / 50e9 + cross
    assert across == pytest.approx(min(flat, hier))
    assert across > inside


def test_fast_kernel_equals_the_reference_across_domains():
    sys = _system(16, 8, 50e9, 150e-9, n=3)
    op = _ops(comm=8e6, p2p=1e5)
    eff = IDEAL
    assert np.allclose(kernel_fast.step_time(op, sys, eff), operator_cost.step_time(op, sys, eff), rtol=1e-12)


# ---- the flags and analyze

@pytest.mark.parametrize("flag, value", [("--scale-up-size", "0"), ("--scale-up-size", "-1"), ("--scale-up-size", "nan"),
                                         ("--scale-up-size", "abc"), ("--topology", "nope"), ("--scale-out", "nope")])
def test_bad_flags_are_one_line_naming_the_flag(capsys, flag, value):
    rc = main(["analyze", "--model", "llama-3.1-70b", "--hardware", "h100-sxm", "--tp", "16", flag, value])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert flag in err


def test_analyze_prints_the_tiers_each_collective_crosses(capsys):
    rc = main(["analyze", "--model", "llama-3.1-70b", "--hardware", "h100-sxm", "--tp", "16", "--batch", "8"])
    out = capsys.readouterr().out
    assert rc == 0
    line = next(x for x in out.splitlines() if x.startswith("Collectives:"))
    assert "tp 16: all-reduce hierarchical" in line and "NVSwitch h100 8 + IB NDR x2" in line


def test_the_tuner_switches_the_inter_domain_algorithm_at_the_closed_form_size():
    """tp 32 on 8-GPU domains (4 domains): the 1/8 shard's all-reduce across the domains is a
    one-shot below the ring/one-shot crossover of 4 devices at the crossing latency (scale-up +
    scale-out), S = (2k - 3) k c B / ((k - 1)(k - 2)) = 10/3 c B, and a ring above it."""
    c, bw = 1.5e-6 + 150e-9, 50e9
    shard = 10 / 3 * c * bw
    assert ring_one_shot_crossover_bytes(4, bw, c) == pytest.approx(shard)
    sys = _system(32, 8, bw, 150e-9, n=2)
    message = np.array([0.9, 1.1]) * shard * 8
    ar, _ = operator_cost.collective_algorithms(message, np.zeros(2), sys, IDEAL)
    assert ar == ["hierarchical/one-shot", "hierarchical/ring"]


def test_fast_decode_equals_the_reference_across_domains():
    sys = _system(16, 8, 50e9, 150e-9, n=3)
    op0, slope = _ops(comm=8e6, p2p=1e5), _ops()
    steps = np.array([1.0, 10.0, 100.0])
    fast = kernel_fast.decode_total_time(op0, slope, steps, sys, IDEAL)
    ref = operator_cost.decode_total_time(op0, slope, steps, sys, IDEAL)
    assert np.allclose(fast, ref, rtol=1e-12)


@pytest.mark.parametrize("ep", [16, 32, 64])
def test_a_larger_domain_of_the_same_links_never_slows_the_expert_all_to_all(ep):
    """The engine may exchange in sub-groups of a domain (their crossings over the NICs), so the
    all-to-all of ep ranks on domains of 8, 16, 32, 72 GPUs never grows with the domain; a small
    decode message (latency-bound), where per-peer hops decide, and a large one."""
    for b in (64 * 2**10, 16 * 2**20):
        times = [float(operator_cost.p2p_time(np.array([b]), _system(1, d, 50e9, 150e-9, ep=ep), IDEAL)[0, 0])
                 for d in (8, 16, 32, 72)]
        assert all(later <= earlier * (1 + 1e-12) for earlier, later in zip(times, times[1:])), times


def test_a_sweep_mixing_spanning_and_local_groups_equals_the_reference_kernel():
    """Several workloads (batch, prompt) and layouts in one evaluate, some tp groups inside the
    DGX H100 node and some over two: the fast kernel's numbers equal the per-operator reference's."""
    cols = {"model": "llama-3.1-70b", "hardware": "h100-sxm", "tp": [8, 16, 16, 4, 16], "batch": [8, 8, 32, 16, 1],
            "prompt_len": [512, 512, 1024, 256, 2048], "gen_len": 32,
            "scale_out": ["ib-ndr", "ib-ndr", "ethernet-100g", "ib-ndr", "ib-xdr"]}
    fast = evaluate(cols)
    with reference_kernel():
        ref = evaluate(cols)
    for k in ("ttft_s", "tpot_s", "output_tokens_per_s"):
        assert np.allclose(fast.metrics[k], ref.metrics[k], rtol=1e-9), k


def test_compare_prints_each_designs_layout_and_the_tiers_it_crosses(capsys):
    """compare, as analyze: TP x PP x EP of each design on more than one device and its
    collectives' tiers (two 8-GPU DGX nodes for tp 16 on H100; an 8-GPU MI300X platform without a
    cited scale-out tier); none for a single device."""
    rc = main(["compare", "--model", "llama-3.1-70b", "--hardware", "h100-sxm", "mi300x", "--tp", "16", "--batch", "8"])
    out = capsys.readouterr().out
    assert rc == 0
    layout = out.split("Layout:\n", 1)[1].splitlines()
    assert layout[0].startswith("  h100-sxm: TP 16 x PP 1 x EP 1 x DP 1 x CP 1; dgx-h100: tp 16: all-reduce hierarchical")
    assert "NVSwitch h100 8 + IB NDR x2" in layout[0]
    assert layout[1].startswith("  mi300x: TP 16 x PP 1 x EP 1 x DP 1 x CP 1; mi300x-platform: tp 16: all-reduce ring")
    assert main(["compare", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "mi300x"]) == 0
    assert "Layout:" not in capsys.readouterr().out
