"""Offload memory tiers beyond host DRAM (``configs/tiers.yaml``): CXL expanders, NVMe."""
from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from basis.errors import DseError, cited_number
from basis.shipped import shipped
from hwmodels.device import Device, Link, MemoryTier
from hwmodels.presets import _tier, load_named_table, lookup

TIERS_FILE = shipped("configs", "tiers.yaml")


def _tier_and_fraction(node: dict, where: str, sources: dict) -> tuple[MemoryTier, float | None]:
    """(the MemoryTier of a tiers.yaml entry, its cited ``achieved_fraction`` in (0, 1] or None)."""
    node = dict(node)
    frac = node.pop("achieved_fraction", None)
    if frac is not None:
        frac = cited_number(frac, f"{where}.achieved_fraction")
        if frac > 1:
            raise DseError(f"{where}.achieved_fraction.value: a fraction of the tier's bandwidth, at most 1, got {frac:g}")
    return _tier(node, where, sources), frac


@lru_cache(maxsize=None)
def _table() -> dict[str, tuple[MemoryTier, float | None]]:
    return load_named_table(TIERS_FILE, "tiers", _tier_and_fraction)


def available_tiers() -> list[str]:
    return sorted(_table())


def load_tier(name: str) -> MemoryTier:
    """The MemoryTier preset called ``name``; DseError listing the valid names."""
    return lookup(_table(), name, "tier")[0]


def tier_fraction(name: str) -> float | None:
    """The cited achieved fraction of the offload tier called ``name`` (None: the file gives
    none, or no tier has that name)."""
    entry = _table().get(name)
    return None if entry is None else entry[1]


def with_host_tier(device: Device, name: str) -> Device:
    """``device`` offloading to tier ``name`` instead of its host DRAM: the tier becomes its
    host memory, reached over a link named after the tier, as fast as the tier's own interface
    (its achieved fraction: ``hwmodels.links.host_link_fraction``)."""
    t = load_tier(name)
    return replace(device, host_memory=t, host_link=Link(name, t.bandwidth_bytes_per_s, t.latency_s))
