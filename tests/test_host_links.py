"""Host links and offload tiers priced by their own physics: each host link at its technology's
measured fraction of peak (configs/links.yaml host_fractions), never the device family's fitted
memory fraction; the survey's Fig. 18 (LLM Inference Unveiled, arXiv:2402.16363): a GPU streaming
its weights over PCIe overtakes the CPU computing next to its DDR as the batch grows."""
import numpy as np
import pytest
import yaml

from basis.errors import DseError
from basis.shipped import shipped
from dse import evaluate
from dse.core.efficiency import IDEAL, Efficiency
from dse.core.kernel_arrays import _COL, PEAK_COLUMNS, OpArrays, SystemArrays
from dse.core.operator_cost import op_costs
from hwmodels.links import host_fractions_from, host_link_fraction, technology_of
from hwmodels.tiers import _tier_and_fraction

STUDY = yaml.safe_load(shipped("studies", "offload-cpu-gpu.yaml").read_text())


def _study_point(hardware, batch, **more):
    """Columns of the offload-cpu-gpu study's configuration (its model, formats, lengths and
    offload policy, read from the study file) on ``hardware`` at each of ``batch``."""
    s = STUDY["space"]
    batch = list(batch)
    return {"hardware": [hardware] * len(batch), "batch": batch, "model": s["model"], "weights": s["weights"],
            "activations": s["activations"], "kv": s["kv"], "offload": s["offload"],
            "prompt_len": s["prompt_len"], "gen_len": s["gen_len"], **more}


def test_the_study_compares_a_pcie_gpu_with_a_cpu():
    """The configuration below is the shipped study's: H100 SXM (weights in host DDR over PCIe
    Gen5) and the Xeon it is hosted by, Llama-2-70B in FP16, batches 1 to 256."""
    s = STUDY["space"]
    assert {"h100-sxm", "xeon-spr"} <= set(s["hardware"]) and s["offload"] == "greedy"
    assert min(s["batch"]) == 1 and max(s["batch"]) >= 128


def test_fig18_a_gpu_streaming_weights_over_pcie_overtakes_the_cpu_as_the_batch_grows():
    """Survey Fig. 18: each decode step the GPU streams the offloaded weights over its host link once,
    whatever the batch, while the CPU reads them from its own DDR and soon runs out of compute;
    so the GPU's throughput relative to the CPU's grows with the batch: behind at batch 1, ahead at
    the largest batch, with one crossover. (Before: the GPU family's fitted memory fraction, 0.551,
    derated the PCIe link too, and the Xeon won at every batch up to 256.)"""
    batches = STUDY["space"]["batch"]
    gpu = np.asarray(evaluate(_study_point("h100-sxm", batches))["output_tokens_per_s"])
    cpu = np.asarray(evaluate(_study_point("xeon-spr", batches))["output_tokens_per_s"])
    ratio = gpu / cpu
    assert np.all(np.diff(ratio) > 0), ratio
    assert ratio[0] < 1 < ratio[-1], ratio
    assert np.count_nonzero(np.diff(np.sign(ratio - 1))) == 1, ratio


def test_an_offloaded_decode_on_pcie_runs_at_the_measured_pcie5_rate():
    """At batch 1 the H100's decode step is bound by the offloaded weights crossing PCIe Gen5:
    its TPOT is their bytes over 64 GB/s x the measured 57.07/64 (nvbandwidth host-to-device on
    H100) plus the small on-device share; the ideal bound streams at the link's 64 GB/s."""
    ev = evaluate(_study_point("h100-sxm", [1]))
    offloaded, tpot = float(ev["offloaded_bytes"][0]), float(ev["tpot_s"][0])
    host_s = offloaded / (64e9 * 57.07 / 64)
    assert offloaded > 40e9
    assert host_s <= tpot < 1.1 * host_s
    ideal = float(evaluate(_study_point("h100-sxm", [1]), ideal=True)["tpot_s"][0])
    assert offloaded / 64e9 <= ideal < 1.05 * offloaded / 64e9


def test_the_measured_fractions_are_the_cited_measurements():
    """Each technology's fraction is its cited measurement over the peak per direction the
    presets use: PCIe 3 12 of 16 GB/s, PCIe 4 24.81 of 32, PCIe 5 57.07 of 64, NVLink-C2C 375 of
    450 (GH200); a link named after its technology takes it; an unmeasured one runs at its peak."""
    assert host_link_fraction("pcie3-x16") == pytest.approx(12 / 16, abs=0.005)
    assert host_link_fraction("pcie4-x16") == pytest.approx(24.81 / 32, abs=0.005)
    assert host_link_fraction("pcie4-x16-per-gcd") == host_link_fraction("pcie4-x16")
    assert host_link_fraction("pcie5-x16") == pytest.approx(57.07 / 64, abs=0.005)
    assert host_link_fraction("nvlink-c2c") == pytest.approx(375 / 450, abs=0.005)
    assert host_link_fraction("ddr-direct") == 1.0
    assert technology_of("pcie40-x16", ["pcie4"]) is None


def _one_weight_op(nbytes: float) -> OpArrays:
    z = np.zeros(1)
    return OpArrays(ops=z, weight_bytes=np.array([nbytes]), act_bytes=z, kv_bytes=z, comm_bytes=z, p2p_bytes=z,
                    peak_column=np.array([_COL["fp16"]]), count=np.ones(1))


def _host_system(fraction: float, latency: float) -> SystemArrays:
    """One point: a device whose weights all live behind a 64 GB/s host link."""
    one = np.ones(1)
    return SystemArrays(np.full((1, len(PEAK_COLUMNS)), 1e15), 3.35e12 * one, 80e9 * one, np.full(1, np.nan),
                        0 * one, one, host_bandwidth=64e9 * one, offload=np.array([[1.0, 0.0, 0.0]]),
                        host_fraction=fraction * one, host_latency=latency * one)


@pytest.mark.parametrize("nbytes", [1e3, 1e6, 7e9])
def test_a_host_transfer_is_bytes_over_the_achieved_link_rate_plus_its_latency(nbytes):
    """Closed form: time = bytes / (link peak x its cited fraction) + the link's latency, the same
    whatever the device family's memory fraction (0.3 or 0.9); the ideal bound takes the peak."""
    op, sys = _one_weight_op(nbytes), _host_system(0.89, 3.5e-6)
    want = nbytes / (64e9 * 0.89) + 3.5e-6
    for memory in (0.3, 0.9):
        cost = op_costs(op, sys, Efficiency(compute=0.5, memory=memory, op_overhead_s=0.0))
        assert cost.offload_s[0, 0] == pytest.approx(want, rel=1e-12)
        assert cost.time_s[0, 0] == pytest.approx(want, rel=1e-12)
    assert op_costs(op, sys, IDEAL).offload_s[0, 0] == pytest.approx(nbytes / 64e9 + 3.5e-6, rel=1e-12)


def test_an_offload_tier_carries_its_own_cited_fraction():
    """A tiers.yaml entry may cite its achieved fraction (a fraction of its own bandwidth, at most 1);
    an entry without one streams at its rated figure."""
    tier = {"name": "t", "capacity_bytes": {"value": 1e12, "source": "s"},
            "bandwidth_bytes_per_s": {"value": 7.45e9, "source": "s"}}
    t, frac = _tier_and_fraction({**tier, "achieved_fraction": {"value": 0.9, "source": "s"}}, "tiers.yaml: tiers.t", {})
    assert (t.bandwidth_bytes_per_s, frac) == (7.45e9, 0.9)
    assert _tier_and_fraction(tier, "tiers.yaml: tiers.t", {})[1] is None
    with pytest.raises(DseError, match=r"^tiers.yaml: tiers.t.achieved_fraction.value: .*at most 1, got 1.5$"):
        _tier_and_fraction({**tier, "achieved_fraction": {"value": 1.5, "source": "s"}}, "tiers.yaml: tiers.t", {})


@pytest.mark.parametrize("bad, says", [
    ({"host_fractions": [1]}, "links.yaml: host_fractions: expected a mapping"),
    ({"host_fractions": {"pcie5": {"value": 2, "source": "s"}}}, "links.yaml: host_fractions.pcie5.value: a fraction"),
    ({"host_fractions": {"pcie5": {"value": 0.9}}}, "links.yaml: host_fractions.pcie5: every number needs a 'source'"),
])
def test_a_bad_host_fraction_is_refused_in_one_line_naming_the_key(bad, says):
    with pytest.raises(DseError) as e:
        host_fractions_from(bad, "links.yaml")
    assert str(e.value).startswith(says) and "\n" not in str(e.value)


def test_presets_that_refused_real_layouts_now_run_them():
    """Issue 41: the RTX A6000 named no host memory, so a model larger than its 48 GiB could not be
    offloaded; the L40S and RTX PRO 6000 named no interconnect, so two of them could not share a
    model, though both run tensor parallel over PCIe. Now the A6000 offloads over PCIe Gen4 (TPOT at
    least the offloaded bytes over 32 GB/s x the measured 24.81/32), and two L40S or RTX PRO 6000
    run one model."""
    ev = evaluate({"hardware": "rtx-a6000", "model": "llama-2-70b", "weights": "fp16", "activations": "fp16",
                   "kv": "fp16", "offload": "greedy", "batch": 1, "prompt_len": 512, "gen_len": 64})
    offloaded, tpot = float(ev["offloaded_bytes"][0]), float(ev["tpot_s"][0])
    assert offloaded > 80e9 and offloaded / 24.81e9 <= tpot < 1.1 * offloaded / 24.81e9
    two = evaluate({"hardware": ["l40s", "rtx-pro-6000"], "devices": 2, "model": "llama-2-7b", "batch": 8,
                    "prompt_len": 512, "gen_len": 64})
    assert np.all(np.isfinite(np.asarray(two["tpot_s"], dtype=float)))
