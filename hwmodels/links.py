"""Interconnect presets (``configs/links.yaml``), every bandwidth with its source."""
from __future__ import annotations

from functools import lru_cache

from basis.shipped import shipped
from hwmodels.device import Link
from hwmodels.presets import _link, load_named_table, lookup

LINKS_FILE = shipped("configs", "links.yaml")


@lru_cache(maxsize=None)
def _all() -> dict[str, Link]:
    return load_named_table(LINKS_FILE, "links", _link)


def available_links() -> list[str]:
    return sorted(_all())


def load_link(name: str) -> Link:
    """The Link preset called ``name``; DseError listing the valid names."""
    return lookup(_all(), name, "link")
