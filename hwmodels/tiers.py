"""Offload memory tiers beyond host DRAM (``configs/tiers.yaml``): CXL expanders, NVMe."""
from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from basis.shipped import shipped
from hwmodels.device import Device, Link, MemoryTier
from hwmodels.presets import _tier, load_named_table, lookup

TIERS_FILE = shipped("configs", "tiers.yaml")


@lru_cache(maxsize=None)
def _all() -> dict[str, MemoryTier]:
    return load_named_table(TIERS_FILE, "tiers", _tier)


def available_tiers() -> list[str]:
    return sorted(_all())


def load_tier(name: str) -> MemoryTier:
    """The MemoryTier preset called ``name``; DseError listing the valid names."""
    return lookup(_all(), name, "tier")


def with_host_tier(device: Device, name: str) -> Device:
    """``device`` offloading to tier ``name`` instead of its host DRAM: the tier becomes its
    host memory, reached over a link as fast as the tier's own interface."""
    t = load_tier(name)
    return replace(device, host_memory=t, host_link=Link(name, t.bandwidth_bytes_per_s, t.latency_s))
