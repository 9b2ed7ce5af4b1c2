"""Interconnect presets (``configs/links.yaml``), every bandwidth with its source."""
from __future__ import annotations

from functools import lru_cache

import yaml

from dse.errors import DseError
from hwmodels.device import Link
from hwmodels.presets import HARDWARE_DIR, _link

LINKS_FILE = HARDWARE_DIR.parent / "links.yaml"


@lru_cache(maxsize=None)
def _all() -> dict[str, Link]:
    data = yaml.safe_load(LINKS_FILE.read_text())
    sources = data.get("sources", {})
    return {name: _link({"name": name, **node}, f"{LINKS_FILE}: links.{name}", sources)
            for name, node in (data.get("links") or {}).items()}


def available_links() -> list[str]:
    return sorted(_all())


def load_link(name: str) -> Link:
    """The Link preset called ``name``; DseError listing the valid names."""
    links = _all()
    if name not in links:
        raise DseError(f"unknown link '{name}'; valid links: {', '.join(sorted(links))}")
    return links[name]
