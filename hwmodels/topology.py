"""System topologies (``configs/topologies.yaml``): scale-up domains of devices joined by a
scale-out tier, each tier with its size, shape and link, every figure cited.

A ``Topology`` says how many devices share a scale-up domain (NVSwitch node, NVL72 rack, Infinity
Fabric mesh, TPU ICI torus) and which link each device's NIC gives it to the rest of the system
(a ``configs/links.yaml`` entry: bandwidth per direction and switch-hop latency, never restated).
The scale-up tier is priced at the device's own link (its preset's interconnect or ``--link``), so
a collective inside one domain costs what it did before topologies; a group larger than the domain
pays the scale-out tier for its inter-domain part (``dse.core.collectives``).

``system_topology`` resolves a point's three columns (``topology``, ``scale_up_size``,
``scale_out``) to the values the kernel reads; ``tiers_label`` says in words which tiers a group
of devices crosses ('NVSwitch 8 + IB NDR x2').
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from basis.errors import DseError, first_unknown, kind_of, shown_key
from basis.shipped import shipped
from basis.yamlfile import load_yaml
from hwmodels.device import Link
from hwmodels.links import available_links, load_link

TOPOLOGIES_FILE = shipped("configs", "topologies.yaml")
#: the shapes a scale-up domain may have
SHAPES = ("switch", "ring", "torus", "full-mesh")
#: a domain without a size: every device of the system shares one (today's one-link system)
UNBOUNDED = math.inf
_UP_KEYS = ("size", "shape", "dims", "link", "source", "note")
_OUT_KEYS = ("link", "shape", "source", "note")
_KEYS = ("description", "hardware", "scale_up", "scale_out")
#: how a link's name reads in a layout line
_WORDS = {"nvswitch": "NVSwitch", "nvlink": "NVLink", "ib": "IB", "tpu": "TPU", "ici": "ICI", "ethernet": "Ethernet",
          "ndr": "NDR", "hdr": "HDR", "xdr": "XDR", "pcie": "PCIe", "roce": "RoCE"}


@dataclass(frozen=True)
class ScaleUp:
    """A scale-up domain: ``size`` devices, joined in ``shape`` (``SHAPES``; ``dims`` for a torus
    where cited), over the links.yaml entry ``link`` where one matches (None: the device's own)."""

    size: float
    shape: str = "switch"
    dims: tuple = ()
    link: str | None = None


@dataclass(frozen=True)
class ScaleOut:
    """The scale-out tier: each device's NIC, a ``Link`` (bandwidth per direction, switch-hop
    latency), in a network of ``shape``."""

    link: Link
    shape: str = "rail-optimized fat tree"


@dataclass(frozen=True)
class Topology:
    """A system: scale-up domains joined by a scale-out tier (None: not cited; a group beyond the
    domain then keeps the one-link model). ``hardware``: the presets it is the default of."""

    name: str
    description: str
    scale_up: ScaleUp
    scale_out: ScaleOut | None = None
    hardware: tuple = ()


#: today's system: one domain holding every device, no scale-out tier
SINGLE_LINK = Topology("single-link", "every device on one scale-up link (no scale-out tier)", ScaleUp(UNBOUNDED))


def _size(v, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise DseError(f"{where}: a device count, an integer of at least 1, got {shown_key(v) if isinstance(v, str) else v!r}")
    return v


def _parse(name: str, node, path) -> Topology:
    where = f"{path}: topologies.{shown_key(name)}"
    if not isinstance(node, dict):
        raise DseError(f"{where}: expected a mapping, got {kind_of(node)}")
    bad = first_unknown(node, _KEYS)
    if bad:
        raise DseError(f"{where}: unknown key {bad}; allowed: {', '.join(_KEYS)}")
    up = node.get("scale_up")
    if not isinstance(up, dict):
        raise DseError(f"{where}.scale_up: expected a mapping with size, shape and source")
    bad = first_unknown(up, _UP_KEYS)
    if bad:
        raise DseError(f"{where}.scale_up: unknown key {bad}; allowed: {', '.join(_UP_KEYS)}")
    for k in ("size", "source"):
        if k not in up:
            raise DseError(f"{where}.scale_up: missing '{k}'")
    shape = up.get("shape", "switch")
    if shape not in SHAPES:
        raise DseError(f"{where}.scale_up.shape: {shown_key(shape)} is not a shape; allowed: {', '.join(SHAPES)}")
    link = up.get("link")
    if link is not None and link not in available_links():
        raise DseError(f"{where}.scale_up.link: unknown link '{shown_key(link)}'; see 'list links'")
    dims = tuple(_size(d, f"{where}.scale_up.dims") for d in up.get("dims", ()))
    scale_up = ScaleUp(float(_size(up["size"], f"{where}.scale_up.size")), shape, dims, link)
    out = node.get("scale_out")
    scale_out = None
    if out is not None:
        if not isinstance(out, dict) or "link" not in out or "source" not in out:
            raise DseError(f"{where}.scale_out: expected a mapping with link (a configs/links.yaml name) and source")
        bad = first_unknown(out, _OUT_KEYS)
        if bad:
            raise DseError(f"{where}.scale_out: unknown key {bad}; allowed: {', '.join(_OUT_KEYS)}")
        scale_out = ScaleOut(load_link(str(out["link"])), str(out.get("shape", "rail-optimized fat tree")))
    hardware = node.get("hardware") or []
    if not isinstance(hardware, list):
        raise DseError(f"{where}.hardware: expected a list of hardware preset names")
    return Topology(str(name), str(node.get("description", name)), scale_up, scale_out, tuple(map(str, hardware)))


def topologies_from(data, path) -> dict[str, Topology]:
    """The topologies of a parsed topologies file, by name; DseError naming ``path`` and the key."""
    node = data.get("topologies") if isinstance(data, dict) else None
    if not isinstance(node, dict):
        raise DseError(f"{path}: expected a mapping with 'topologies' (name -> topology) and 'sources'")
    return {str(k): _parse(str(k), v, path) for k, v in node.items()}


@lru_cache(maxsize=None)
def _all() -> dict[str, Topology]:
    return topologies_from(load_yaml(TOPOLOGIES_FILE, "table of topologies"), TOPOLOGIES_FILE)


def available_topologies() -> list[str]:
    """Names of the shipped topology presets."""
    return sorted(_all())


def load_topology(name: str) -> Topology:
    """The topology preset ``name``; DseError listing the valid names."""
    table = _all()
    if name not in table:
        raise DseError(f"unknown topology '{shown_key(name)}'; valid topologies: {', '.join(sorted(table))}")
    return table[name]


def topology_of_hardware(preset: str) -> Topology:
    """The topology a hardware preset name runs in by default: the preset's own (a topology
    listing it under ``hardware``), else ``SINGLE_LINK``."""
    for t in _all().values():
        if preset in t.hardware:
            return t
    return SINGLE_LINK


def system_topology(hardware, topology: str | None = None, scale_up_size: float | None = None,
                    scale_out: str | None = None) -> Topology:
    """The topology of a point: ``topology`` (a preset name) or the hardware preset's own, with
    ``scale_up_size`` devices per domain and the scale-out link ``scale_out`` (a links.yaml name)
    where given; DseError naming the unknown name."""
    base = load_topology(topology) if topology else (
        topology_of_hardware(hardware) if isinstance(hardware, str) else SINGLE_LINK)
    if scale_up_size is None and scale_out is None:
        return base
    up = base.scale_up if scale_up_size is None else ScaleUp(float(scale_up_size), base.scale_up.shape,
                                                              (), base.scale_up.link)
    out = base.scale_out if scale_out is None else ScaleOut(load_link(scale_out))
    return Topology(f"{base.name} (modified)" if topology or base is not SINGLE_LINK else "hypothetical",
                    base.description, up, out, base.hardware)


def _link_words(name: str | None) -> str:
    if not name:
        return "link"
    return " ".join(_WORDS.get(w, w) for w in name.split("-"))


def tiers_label(devices: int, topology: Topology, up_link: str | None = None) -> str:
    """The tiers a group of ``devices`` crosses, in words: 'NVSwitch H100 8' inside one domain,
    'NVSwitch H100 8 + IB NDR x2' across two (``up_link``: the point's own scale-up link name where
    it replaces the topology's, else the topology's link, else the domain's shape)."""
    name = up_link or topology.scale_up.link
    up = _link_words(name) if name else topology.scale_up.shape
    if devices <= topology.scale_up.size:
        return f"{up} {devices}"
    k = math.ceil(devices / topology.scale_up.size)
    per = devices / k
    if topology.scale_out is None:
        return f"{up} {per:g} x{k} (no scale-out tier cited: priced on the scale-up link)"
    return f"{up} {per:g} + {_link_words(topology.scale_out.link.name)} x{k}"


def topology_rows() -> list[dict]:
    """One row per shipped topology for 'list topologies': name, devices per domain, shape, the
    scale-out NIC (its links.yaml name, '-' where none is cited) and the hardware it is the default of."""
    return [{"name": n, "scale_up_size": t.scale_up.size, "shape": t.scale_up.shape,
             "scale_out": t.scale_out.link.name if t.scale_out else "-", "hardware": ", ".join(t.hardware)}
            for n, t in sorted(_all().items())]
