"""The AWS Trainium2 preset and its systems (trn2.48xlarge: 16 chips in a 4x4 2D torus; Trn2
UltraServer: 64 chips), against the figures of the AWS Neuron documentation they cite."""
import pytest
from conftest import run_cli

from dse import evaluate
from hwmodels.links import load_link
from hwmodels.presets import load_device
from hwmodels.topology import load_topology, system_topology

GIB = 2**30


def test_chip_figures_are_the_neuron_docs():
    """'Trainium2 Architecture' (AWS Neuron docs): 667 BF16 and 1,299 FP8 dense TFLOPS, 181 FP32,
    96 GiB of HBM at 2.9 TB/s; 'Amazon EC2 Trn2 Architecture': 1,024 GB/s intra-instance
    NeuronLink-v3 per chip."""
    d = load_device("trainium2")
    assert d.peak_ops_per_s["bf16"] == 667e12 and d.peak_ops_per_s["fp8"] == 1299e12
    assert d.peak_ops_per_s["fp32"] == 181e12
    hbm = d.memory_tiers[0]
    assert hbm.capacity_bytes == 96 * GIB and hbm.bandwidth_bytes_per_s == 2.9e12
    # the instance table's 46.4 TB/s over 16 chips is the chip's 2.9 TB/s
    assert 16 * hbm.bandwidth_bytes_per_s == pytest.approx(46.4e12)
    assert d.interconnect.bandwidth_bytes_per_s == load_link("neuronlink-v3").bandwidth_bytes_per_s == 1024e9


def test_instance_and_ultraserver_topologies():
    """trn2.48xlarge: 16 chips, 4x4 2D torus, EFAv3 3,200 Gbps per instance (200 Gb/s = 25 GB/s a
    chip); UltraServer: four instances, 64 chips, same-coordinate chips in a ring across them."""
    inst, ultra = load_topology("trn2-48xlarge"), load_topology("trn2-ultraserver")
    assert (inst.scale_up.size, inst.scale_up.shape, inst.scale_up.dims) == (16, "torus", (4, 4))
    assert (ultra.scale_up.size, ultra.scale_up.dims) == (64, (4, 4, 4))
    assert 16 * inst.scale_out.link.bandwidth_bytes_per_s * 8 == pytest.approx(3200e9)
    assert system_topology("trainium2").name == "trn2-48xlarge"
    assert load_link("neuronlink-v3-inter").bandwidth_bytes_per_s == 256e9


def test_listed_and_evaluated():
    assert "trainium2" in run_cli("list", "hardware").stdout.split()
    listed = run_cli("list", "topologies").stdout.split()
    assert {"trn2-48xlarge", "trn2-ultraserver"} <= set(listed)
    # a 70B model in BF16 (141 GB) fits 2 chips' 192 GiB; its batch-1 decode reads every weight once a
    # token, so it cannot beat the HBM bound: 2 x 2.9 TB/s over 141 GB
    ev = evaluate({"hardware": "trainium2", "model": "llama-3.1-70b", "batch": 1, "prompt_len": 128,
                   "gen_len": 16, "tp": 2, "devices": 2})
    assert bool(ev["feasible"][0])
    assert ev["tpot_s"][0] >= 141e9 / 2 / (2 * 2.9e12)
