"""Offload tiers (configs/tiers.yaml) and the CXL host-link technology (configs/links.yaml) stream
at their own published measurements: a CXL 2.0 PCIe 5.0 x8 expander reads 17.8 GB/s all-read
against 27.2 GB/s at its best 1:1 read/write mix (Intel CacheLib wiki, 'OCP demo configuration',
2023-10-12); the Samsung 990 PRO reads 7,471 MB/s sequentially against its rated 7,450 MB/s
(thefpsreview.com 2024-05-27, CrystalDiskMark SEQ1M Q8T1). The expected rates below are typed from
those sources, not read from the files."""
import numpy as np
import pytest

from dse import evaluate
from hwmodels.links import host_link_fraction
from hwmodels.tiers import available_tiers, load_tier, tier_fraction

CXL_ALL_READ, CXL_BEST_MIX = 17.8e9, 27.2e9      # B/s, the CacheLib wiki's measured module
CMM_D_RATED, CMM_B_RATED = 35e9, 60e9            # B/s, Samsung's rated figures (tiers.yaml sources)
NVME_MEASURED, NVME_RATED = 7.471e9, 7.45e9      # B/s, the 990 PRO measured and rated


def test_the_shipped_tiers_cite_a_measured_fraction():
    tiers = {"cxl-cmm-d-128gb", "cxl-cmm-b-16tb", "nvme-990pro-2tb"}
    assert tiers <= set(available_tiers())
    assert all(tier_fraction(t) is not None for t in tiers)


def test_a_cxl_module_streams_at_the_measured_all_read_share_of_its_rated_bandwidth():
    """An offload stream is all reads: CMM-D's rated 35 GB/s (a mixed-traffic figure) becomes
    35 x 17.8 / 27.2 = 22.9 GB/s; the CMM-B box takes the same share of its 60 GB/s (39.3 GB/s)."""
    for name, rated in (("cxl-cmm-d-128gb", CMM_D_RATED), ("cxl-cmm-b-16tb", CMM_B_RATED)):
        assert load_tier(name).bandwidth_bytes_per_s == rated
        assert rated * host_link_fraction(name) == pytest.approx(rated * CXL_ALL_READ / CXL_BEST_MIX, rel=2e-3)
    assert CMM_D_RATED * host_link_fraction("cxl-cmm-d-128gb") == pytest.approx(22.9e9, rel=2e-3)


def test_a_cxl_host_link_runs_at_the_measured_share_of_its_pcie5_x8_peak():
    """A link named cxl-... (no tier of that name) takes the technology's fraction: 17.8 GB/s of the
    32 GB/s a PCIe 5.0 x8 link carries per direction; a tier's own fraction wins over it."""
    assert host_link_fraction("cxl-x8") == pytest.approx(CXL_ALL_READ / 32e9, abs=5e-4)
    assert host_link_fraction("cxl-cmm-d-128gb") != host_link_fraction("cxl-x8")


def test_the_nvme_drive_reaches_its_rated_sequential_read():
    """Measured at or above the rated figure, so the drive streams at its rated 7.45 GB/s (a
    fraction is at most 1)."""
    assert NVME_MEASURED >= NVME_RATED
    assert load_tier("nvme-990pro-2tb").bandwidth_bytes_per_s * host_link_fraction("nvme-990pro-2tb") == NVME_RATED


def _offloaded(host_tier, ideal=False):
    ev = evaluate({"hardware": ["h100-sxm"], "model": "llama-2-70b", "weights": "fp16", "activations": "fp16",
                   "kv": "fp16", "batch": [1], "prompt_len": 128, "gen_len": 32, "offload": "greedy",
                   "host_tier": host_tier}, ideal=ideal)
    return float(ev["offloaded_bytes"][0]), float(ev["tpot_s"][0])


@pytest.mark.parametrize("tier, rate", [("cxl-cmm-d-128gb", CMM_D_RATED * CXL_ALL_READ / CXL_BEST_MIX),
                                        ("nvme-990pro-2tb", NVME_RATED)])
def test_an_offloaded_decode_step_streams_at_the_tiers_measured_rate(tier, rate):
    """H100 with Llama-2-70B in FP16 offloading to the tier, batch 1: each decode step streams the
    offloaded weights over the tier's link once, so TPOT is their bytes over the measured rate (plus
    a small on-device share; 0.5 % below it is allowed for what the offloaded byte count includes
    beyond the per-step stream); the ideal bound streams at the rated figure."""
    offloaded, tpot = _offloaded(tier)
    assert offloaded > 40e9
    assert 0.995 * offloaded / rate <= tpot < 1.05 * offloaded / rate
    rated = load_tier(tier).bandwidth_bytes_per_s
    offloaded_ideal, ideal = _offloaded(tier, ideal=True)
    assert 0.995 * offloaded_ideal / rated <= ideal < 1.05 * offloaded_ideal / rated
    assert np.isclose(offloaded_ideal, offloaded)
