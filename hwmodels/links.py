"""Interconnect presets (``configs/links.yaml``), every bandwidth with its source, and the
achieved fraction of its peak a host link reaches (``host_link_fraction``)."""
from __future__ import annotations

from functools import lru_cache

from basis.errors import DseError, cited_number, kind_of, shown_key
from basis.shipped import shipped
from basis.yamlfile import load_yaml
from hwmodels.device import Link
from hwmodels.presets import _link, load_named_table, lookup
from hwmodels.tiers import tier_fraction

LINKS_FILE = shipped("configs", "links.yaml")


@lru_cache(maxsize=None)
def _all() -> dict[str, Link]:
    return load_named_table(LINKS_FILE, "links", _link)


def available_links() -> list[str]:
    return sorted(_all())


def load_link(name: str) -> Link:
    """The Link preset called ``name``; DseError listing the valid names."""
    return lookup(_all(), name, "link")


def host_fractions_from(data, path) -> dict[str, float]:
    """The ``host_fractions`` section of a parsed links file: technology -> its cited achieved
    fraction of peak, each in (0, 1]; DseError naming ``path`` and the key otherwise."""
    node = (data or {}).get("host_fractions") if isinstance(data, dict) else None
    if node is None:
        return {}
    if not isinstance(node, dict):
        raise DseError(f"{path}: host_fractions: expected a mapping of link technologies to "
                       f"{{value: FRACTION, source: ...}}, got {kind_of(node)}")
    out = {}
    for tech, v in node.items():
        where = f"{path}: host_fractions.{shown_key(tech)}"
        f = cited_number(v, where)
        if f > 1:
            raise DseError(f"{where}.value: a fraction of the link's peak, at most 1, got {f:g}")
        out[str(tech)] = f
    return out


@lru_cache(maxsize=None)
def _host_fractions() -> dict[str, float]:
    return host_fractions_from(load_yaml(LINKS_FILE, "table of links"), LINKS_FILE)


def technology_of(name: str, technologies) -> str | None:
    """The longest of ``technologies`` that the link name ``name`` is or begins, followed by '-'
    ('pcie4-x16-per-gcd' -> 'pcie4'), or None."""
    hits = [t for t in technologies if name == t or name.startswith(t + "-")]
    return max(hits, key=len) if hits else None


def host_link_fraction(name: str) -> float:
    """The achieved fraction of its peak that the host link called ``name`` reaches streaming
    bytes to the device: an offload tier's own (``configs/tiers.yaml`` achieved_fraction) when it
    names one, else its technology's measured fraction (``configs/links.yaml`` host_fractions),
    else 1 (no measurement: the link's peak)."""
    own = tier_fraction(name)
    if own is not None:
        return own
    table = _host_fractions()
    tech = technology_of(name, table)
    return table[tech] if tech is not None else 1.0
