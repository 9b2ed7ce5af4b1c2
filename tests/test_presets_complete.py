"""Every shipped hardware preset is complete: an on-chip buffer, a scale-up link latency, a vendor
and an efficiency family, each cited in its YAML, or listed below with the reason it is not."""
import pytest
import yaml

from basis.errors import DseError
from hwmodels.device import FAMILIES, Device, MemoryTier
from hwmodels.presets import HARDWARE_DIR, available_hardware, load_device, load_device_file

PRESETS = available_hardware()

#: presets without onchip_buffer_bytes; each YAML says what was searched
NO_BUFFER = {
    "gaudi2": "no vendor figure for the TPC local memory; a secondary blog gives 80 KB and 256 KB",
    "gaudi3": "as gaudi2; the 96 MB SRAM is a shared L2/L3-like cache, not a per-TPC scratchpad",
    "gddr6-aim": "no tile scratchpad, and an FPGA (not a GPU) hosts the AiM chips",
}
#: presets whose scale-up interconnect has no latency_s; each YAML says why
NO_LINK_LATENCY = {
    "a100-40gb": "only LLMCompass's per-transfer NVLink 3 figure (8.92 us) exists; not a per-hop latency",
    "a100-80gb": "as a100-40gb",
    "rtx-a6000": "no NVLink 3 bridge latency",
    "l40s": "no PCIe 4 peer-to-peer latency (its scale-up link is its PCIe Gen4 x16 link)",
    "b200": "no NVLink 5 latency",
    "gb200": "no NVLink 5 / NVL72 latency",
    "gaudi2": "no latency for Gaudi's integrated RoCE scale-up links",
    "gaudi3": "as gaudi2",
    "mi250x": "no Infinity Fabric (xGMI) GPU-to-GPU latency",
    "mi300x": "as mi250x",
    "mi325x": "as mi250x",
    "mi355x": "as mi250x (no Infinity Fabric 4 latency either)",
    "groq-lpu": "only an end-to-end figure across 10,440 chips, no per-hop C2C latency",
    "cerebras-wse3": "no CS-3 system I/O or SwarmX latency",
    "tenstorrent-n300": "no Wormhole Ethernet link latency",
    "tenstorrent-p150": "no Blackhole Ethernet link latency",
}


def _yaml(name: str) -> dict:
    return yaml.safe_load((HARDWARE_DIR / f"{name}.yaml").read_text())


def test_exception_lists_name_shipped_presets():
    assert set(NO_BUFFER) <= set(PRESETS) and set(NO_LINK_LATENCY) <= set(PRESETS)


@pytest.mark.parametrize("name", PRESETS)
def test_onchip_buffer_is_given_or_excepted(name):
    d, raw = load_device(name), _yaml(name)
    if name in NO_BUFFER:
        assert "onchip_buffer_bytes" not in raw and d.onchip_buffer_bytes == 0
        assert "onchip_buffer_bytes left out" in (HARDWARE_DIR / f"{name}.yaml").read_text()
    else:
        assert d.onchip_buffer_bytes > 0
        assert raw["onchip_buffer_bytes"]["source"]


@pytest.mark.parametrize("name", PRESETS)
def test_interconnect_latency_is_given_or_excepted(name):
    d, raw = load_device(name), _yaml(name)
    if d.interconnect is None:
        assert name not in NO_LINK_LATENCY
        return
    if name in NO_LINK_LATENCY:
        assert "latency_s" not in raw["interconnect"] and d.interconnect.latency_s == 0
        assert "latency_s left out" in (HARDWARE_DIR / f"{name}.yaml").read_text()
    else:
        assert d.interconnect.latency_s > 0
        assert raw["interconnect"]["latency_s"]["source"]


@pytest.mark.parametrize("name", PRESETS)
def test_vendor_and_family(name):
    d, raw = load_device(name), _yaml(name)
    assert raw.get("vendor") and raw.get("family") in FAMILIES, name
    assert d.vendor == raw["vendor"] and d.family == raw["family"] == d.efficiency_family


def _write(tmp_path, **change):
    raw = _yaml("h100-sxm")
    raw.update(change)
    p = tmp_path / "custom.yaml"
    p.write_text(yaml.safe_dump(raw))
    return p


def test_unknown_family_is_rejected_naming_the_key(tmp_path):
    p = _write(tmp_path, family="quantum")
    with pytest.raises(DseError) as e:
        load_device_file(p)
    msg = str(e.value)
    assert str(p) in msg and "family" in msg and "quantum" in msg
    assert all(f in msg for f in FAMILIES)


def test_family_defaults_to_the_class_when_left_out(tmp_path):
    raw = _yaml("tpu-v5e")
    del raw["family"]
    p = tmp_path / "nofamily.yaml"
    p.write_text(yaml.safe_dump(raw))
    d = load_device_file(p)
    assert d.family == d.device_class == "accelerator" and d.efficiency_family == "accelerator"


def test_device_built_in_code_needs_no_family():
    mem = (MemoryTier("hbm", 1e9, 1e12),)
    d = Device("x", "x", "accelerator", {"bf16": 1e12}, 1e12, mem)
    assert d.family == "" and d.vendor == "" and d.efficiency_family == "accelerator"
    assert Device("g", "g", "gpu", {"bf16": 1e12}, 1e12, mem, family="tpu").efficiency_family == "tpu"
    with pytest.raises(DseError, match="family"):
        Device("y", "y", "gpu", {"bf16": 1e12}, 1e12, mem, family="quantum")
