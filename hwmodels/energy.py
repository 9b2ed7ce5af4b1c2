"""Energy of a step, and the technology data it and the accelerator template read.

``configs/technology.yaml`` (package data, ``basis.shipped``) holds, every number with its source:
process nodes (wafer price, logic density, SRAM bit area, defect density), memory technologies (pin
rate, width, stack capacity, PHY area, price, access energy), links (PHY area, energy per bit), the
constants of LLMCompass's area model, and energy coefficients: circuit-level arithmetic and SRAM
access energies (Horowitz 45 nm, Jouppi et al. 7 nm) and measured whole-device coefficients (SC'25:
J per op of a compute class and J per bit moved at each memory level, control and datapath
included, for an A100 and a Hopper GPU). ``load_technology`` reads and validates it; a malformed
file is a ``DseError`` naming the file, the key and what is allowed.

The energy of a step (``energy_per_step_j``) is linear in the work, as in SC'25's Eq. 1 without
its power cap::

    E = sum_c ops_c * e_op[c] + sum_l 8 * bytes_l * e_bit[l] + static_w * seconds

with ``ops_c`` operations (a multiply-accumulate is 2 ops) of compute class ``c`` and ``bytes_l``
bytes moved at memory level ``l`` (``l1``, ``l2``, ``hbm``; an HBM byte that reaches the cores also
crosses L2 and L1, and the caller counts it at each level it crosses, since SC'25's HBM figure is
incremental over them). Every argument may be a numpy array of design points [P]; the result
broadcasts. A compute class without a measured figure in the profile is charged at the nearest
wider measured class (``WIDER``): an assumption, stated by ``op_energy``, that a narrower format on
the same unit costs no more per op.

Units: J, J/op, J/bit, W, s, bytes. This module imports neither ``dse`` nor ``workloads``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

import numpy as np

from basis.errors import DseError, cited_number
from basis.shipped import shipped
from basis.yamlfile import load_yaml
from hwmodels.formats import COMPUTE_CLASSES

#: the shipped technology table (package data in a wheel)
TECHNOLOGY_FILE = shipped("configs", "technology.yaml")

#: compute classes a device profile may measure: the preset classes plus FP64 on the matrix units
#: (``fp64``) and on the vector units (``fp64_vector``)
OP_CLASSES = COMPUTE_CLASSES + ("fp64", "fp64_vector")
#: memory levels a device profile may measure (J per bit moved at that level)
LEVELS = ("l1", "l2", "hbm")
#: where a class without a measured figure is charged: the next wider class, until one is measured
WIDER = MappingProxyType({
    "int4": "int8", "int8": "fp8", "fp4": "fp6", "fp6": "fp8", "fp8": "bf16", "bf16": "fp16",
    "tf32": "fp32", "fp32": "fp64_vector", "fp64": "fp64_vector",
})
#: accumulator add of a multiply-accumulate by operand format (``mac_energy_j``)
ACCUMULATE = MappingProxyType({"int8": "int32_add", "fp16": "fp32_add", "bf16": "fp32_add",
                               "fp32": "fp32_add"})

_TOP = {"description", "sources", "wafer", "nodes", "memory", "links", "area_model", "energy", "not_found"}
_WAFER = {"diameter_m", "reticle_area_m2"}
_NODE_NUMBERS = ("wafer_price_usd", "logic_density_per_m2", "sram_bit_area_m2", "hd_bitcell_area_m2",
                 "sram_macro_density_bits_per_m2", "defect_density_per_m2")
_NODE_TEXT = ("energy_profile", "same_as", "note")
_MEMORY_NUMBERS = ("pin_rate_bps", "bus_width_bits", "channel_width_bits", "stack_capacity_bytes",
                   "phy_area_m2", "controller_transistors", "price_usd_per_byte", "access_energy_j_per_bit")
_LINK_NUMBERS = ("phy_area_m2", "controller_transistors", "energy_j_per_bit")
#: the area-model constants ``hwmodels.template`` needs (all required)
AREA_KEYS = ("fpu64_transistors", "int32_alu_transistors", "mantissa_bits_fp64", "mantissa_bits_fp32",
             "mantissa_bits_fp16", "control_transistors_per_lane_per_vector_width",
             "core_interconnect_transistors_per_core", "sram_max_bank_bytes",
             *(f"sram_efficiency_{2 ** k}" for k in range(12, 21)),
             "rf_c0_m2", "rf_cD_m2", "rf_cW_m2", "rf_cP_m2", "rf_cDW_m2", "rf_cDD_m2", "rf_cWW_m2",
             "rf_cPP_m2", "rf_cDP_m2", "rf_cWP_m2", "rf_reference_density_per_m2")
_ENERGY = {"arithmetic", "access_64bit", "devices"}


@dataclass(frozen=True)
class Node:
    """A process node; a figure not published for it is None. SI units: USD per 300 mm wafer,
    transistors per m^2, m^2 per bit, defects per m^2, bits per m^2."""

    name: str
    wafer_price_usd: float | None = None
    logic_density_per_m2: float | None = None
    sram_bit_area_m2: float | None = None
    hd_bitcell_area_m2: float | None = None
    sram_macro_density_bits_per_m2: float | None = None
    defect_density_per_m2: float | None = None
    energy_profile: str | None = None
    alias_of: str | None = None


@dataclass(frozen=True)
class MemoryTech:
    """A memory technology: per stack (HBM: ``bus_width_bits``) or per channel (``channel_width_bits``).
    Pin rate in bit/s, capacity in bytes, areas in m^2, price in USD per byte, energy in J per bit."""

    name: str
    pin_rate_bps: float | None = None
    bus_width_bits: float | None = None
    channel_width_bits: float | None = None
    stack_capacity_bytes: float | None = None
    phy_area_m2: float | None = None
    controller_transistors: float | None = None
    price_usd_per_byte: float | None = None
    access_energy_j_per_bit: float | None = None

    @property
    def width_bits(self) -> float | None:
        """Data width of one stack or channel (bits)."""
        return self.bus_width_bits if self.bus_width_bits is not None else self.channel_width_bits


@dataclass(frozen=True)
class LinkTech:
    """A chip-to-chip or host link: PHY area (m^2) and controller transistors per link (NVLink) or
    per lane (PCIe), energy per bit (J)."""

    name: str
    phy_area_m2: float | None = None
    controller_transistors: float | None = None
    energy_j_per_bit: float | None = None


@dataclass(frozen=True)
class EnergyProfile:
    """Measured whole-device energy coefficients: ``op_j[c]`` J per op of compute class ``c``,
    ``bit_j[l]`` J per bit moved at memory level ``l``, ``constant_power_w`` the measured constant
    (idle) power in W (None where not published)."""

    name: str
    node: str
    op_j: Mapping[str, float] = field(default_factory=dict)
    bit_j: Mapping[str, float] = field(default_factory=dict)
    constant_power_w: float | None = None


@dataclass(frozen=True)
class Technology:
    """The parsed ``configs/technology.yaml``; see the module docstring. Mappings are read-only."""

    path: str
    wafer_diameter_m: float
    reticle_area_m2: float
    nodes: Mapping[str, Node]
    memory: Mapping[str, MemoryTech]
    links: Mapping[str, LinkTech]
    area: Mapping[str, float]
    arithmetic: Mapping[str, Mapping[str, float]]
    access_64bit: Mapping[str, Mapping[str, float]]
    devices: Mapping[str, EnergyProfile]
    sources: Mapping[str, str]
    not_found: tuple[str, ...] = ()

    def node(self, name: str) -> Node:
        """The node ``name`` (an alias resolves to the node it names); DseError listing the nodes."""
        if name not in self.nodes:
            raise DseError(f"{self.path}: unknown process node '{name}'; nodes: {', '.join(self.nodes)}")
        return self.nodes[name]

    def memory_tech(self, name: str) -> MemoryTech:
        """The memory technology ``name``; DseError listing the known ones."""
        if name not in self.memory:
            raise DseError(f"{self.path}: unknown memory type '{name}'; memory types: {', '.join(self.memory)}")
        return self.memory[name]

    def link_tech(self, name: str) -> LinkTech:
        """The link ``name``; DseError listing the known ones."""
        if name not in self.links:
            raise DseError(f"{self.path}: unknown link '{name}'; links: {', '.join(self.links)}")
        return self.links[name]

    def profile(self, name: str) -> EnergyProfile:
        """The measured energy profile ``name``; DseError listing the known ones."""
        if name not in self.devices:
            raise DseError(f"{self.path}: unknown energy profile '{name}'; profiles: {', '.join(self.devices)}")
        return self.devices[name]


# ----------------------------------------------------------------------------------- loading

def _cited(node, where: str, positive: bool = True) -> float:
    """The value of a ``{value, source[, note]}`` mapping; DseError naming ``where`` otherwise."""
    return cited_number(node, where, positive, signed=not positive)


def _mapping(node, where: str, allowed=None, required=()) -> dict:
    """``node`` checked to be a mapping with only ``allowed`` keys and all ``required`` ones."""
    if not isinstance(node, dict):
        raise DseError(f"{where}: expected a mapping, got {type(node).__name__}")
    if allowed is not None:
        extra = set(node) - set(allowed)
        if extra:
            raise DseError(f"{where}: unknown key(s) {', '.join(sorted(map(str, extra)))}; "
                           f"allowed: {', '.join(sorted(allowed))}")
    for k in required:
        if k not in node:
            raise DseError(f"{where}: missing required key '{k}'")
    return node


def _text(node, where: str) -> str:
    if not isinstance(node, str) or not node.strip():
        raise DseError(f"{where}: expected a non-empty text, got {node!r}")
    return node


def _numbers(node: dict, where: str, keys) -> dict:
    return {k: _cited(node[k], f"{where}.{k}") for k in keys if k in node}


def _nodes(node, where: str) -> dict[str, Node]:
    out, aliases = {}, {}
    for name, row in _mapping(node, where).items():
        w = f"{where}.{name}"
        row = _mapping(row, w, allowed=_NODE_NUMBERS + _NODE_TEXT)
        if "same_as" in row:
            if set(row) - {"same_as", "note"}:
                raise DseError(f"{w}: a node with 'same_as' takes only 'note' besides it")
            aliases[str(name)] = _text(row["same_as"], f"{w}.same_as")
            continue
        prof = _text(row["energy_profile"], f"{w}.energy_profile") if "energy_profile" in row else None
        out[str(name)] = Node(str(name), energy_profile=prof, **_numbers(row, w, _NODE_NUMBERS))
    for name, target in aliases.items():
        if target not in out:
            raise DseError(f"{where}.{name}.same_as: '{target}' is not a node with its own figures; "
                           f"allowed: {', '.join(out)}")
        t = out[target]
        out[name] = Node(name, t.wafer_price_usd, t.logic_density_per_m2, t.sram_bit_area_m2,
                         t.hd_bitcell_area_m2, t.sram_macro_density_bits_per_m2, t.defect_density_per_m2,
                         t.energy_profile, alias_of=target)
    return out


def _devices(node, where: str, nodes) -> dict[str, EnergyProfile]:
    out = {}
    allowed = ("node", "constant_power_w", *(f"op_{c}" for c in OP_CLASSES), *(f"bit_{lv}" for lv in LEVELS))
    for name, row in _mapping(node, where).items():
        w = f"{where}.{name}"
        row = _mapping(row, w, allowed=allowed, required=("node",))
        nd = _text(row["node"], f"{w}.node")
        if nd not in nodes:
            raise DseError(f"{w}.node: '{nd}' is not a node of this file; allowed: {', '.join(nodes)}")
        op = {k[3:]: _cited(v, f"{w}.{k}") for k, v in row.items() if k.startswith("op_")}
        bit = {k[4:]: _cited(v, f"{w}.{k}") for k, v in row.items() if k.startswith("bit_")}
        const = _cited(row["constant_power_w"], f"{w}.constant_power_w") if "constant_power_w" in row else None
        out[str(name)] = EnergyProfile(str(name), nd, MappingProxyType(op), MappingProxyType(bit), const)
    return out


def _tables(node, where: str) -> dict[str, Mapping[str, float]]:
    return {str(name): MappingProxyType({str(k): _cited(v, f"{where}.{name}.{k}") for k, v in
                                         _mapping(tab, f"{where}.{name}").items()})
            for name, tab in _mapping(node, where).items()}


def technology_from_dict(d, path: str) -> Technology:
    """The Technology a parsed ``technology.yaml`` describes; DseError naming ``path`` and the key."""
    d = _mapping(d, path, allowed=_TOP, required=("sources", "wafer", "nodes", "memory", "links",
                                                   "area_model", "energy"))
    sources = d["sources"]
    if not isinstance(sources, dict) or not sources or not all(isinstance(v, str) for v in sources.values()):
        raise DseError(f"{path}: sources: expected a mapping of short keys to citation texts")
    wafer = _mapping(d["wafer"], f"{path}: wafer", allowed=_WAFER, required=tuple(_WAFER))
    nodes = _nodes(d["nodes"], f"{path}: nodes")
    memory = {str(n): MemoryTech(str(n), **_numbers(_mapping(r, f"{path}: memory.{n}", allowed=_MEMORY_NUMBERS),
                                                    f"{path}: memory.{n}", _MEMORY_NUMBERS))
              for n, r in _mapping(d["memory"], f"{path}: memory").items()}
    links = {str(n): LinkTech(str(n), **_numbers(_mapping(r, f"{path}: links.{n}", allowed=_LINK_NUMBERS),
                                                 f"{path}: links.{n}", _LINK_NUMBERS))
             for n, r in _mapping(d["links"], f"{path}: links").items()}
    am = _mapping(d["area_model"], f"{path}: area_model", allowed=AREA_KEYS, required=AREA_KEYS)
    # the register-file regression coefficients carry signs; every other constant is positive
    area = {k: _cited(am[k], f"{path}: area_model.{k}", positive=not (k.startswith("rf_c")))
            for k in AREA_KEYS}
    en = _mapping(d["energy"], f"{path}: energy", allowed=_ENERGY, required=("devices",))
    for name, n in nodes.items():
        if n.energy_profile is not None and n.energy_profile not in (en["devices"] or {}):
            raise DseError(f"{path}: nodes.{name}.energy_profile: '{n.energy_profile}' is not one of "
                           f"energy.devices: {', '.join(en['devices'] or {})}")
    nf = d.get("not_found", [])
    if not isinstance(nf, list) or not all(isinstance(x, str) for x in nf):
        raise DseError(f"{path}: not_found: expected a list of texts")
    return Technology(
        path=path,
        wafer_diameter_m=_cited(wafer["diameter_m"], f"{path}: wafer.diameter_m"),
        reticle_area_m2=_cited(wafer["reticle_area_m2"], f"{path}: wafer.reticle_area_m2"),
        nodes=MappingProxyType(nodes), memory=MappingProxyType(memory), links=MappingProxyType(links),
        area=MappingProxyType(area),
        arithmetic=MappingProxyType(_tables(en.get("arithmetic") or {}, f"{path}: energy.arithmetic")),
        access_64bit=MappingProxyType(_tables(en.get("access_64bit") or {}, f"{path}: energy.access_64bit")),
        devices=MappingProxyType(_devices(en["devices"], f"{path}: energy.devices", nodes)),
        sources=MappingProxyType({str(k): v for k, v in sources.items()}), not_found=tuple(nf))


@lru_cache(maxsize=8)
def _load(path: str) -> Technology:
    return technology_from_dict(load_yaml(path, "technology table"), path)


def load_technology(path: str | Path | None = None) -> Technology:
    """The technology table at ``path`` (default: the shipped ``configs/technology.yaml``), cached."""
    return _load(str(path if path is not None else TECHNOLOGY_FILE))


def _profile(profile: EnergyProfile | str, tech: Technology | None) -> EnergyProfile:
    """``profile`` itself, the profile of that name, or the default profile of the node of that name."""
    if isinstance(profile, EnergyProfile):
        return profile
    t = tech or load_technology()
    if profile not in t.devices and profile in t.nodes and t.nodes[profile].energy_profile:
        return t.profile(t.nodes[profile].energy_profile)
    return t.profile(profile)


# ------------------------------------------------------------------------------------ energy

def op_energy(profile: EnergyProfile | str, compute_class: str,
              tech: Technology | None = None) -> tuple[float, str]:
    """``(J per op, measured class it comes from)`` for ``compute_class`` in ``profile``: its own
    figure where measured, else the nearest wider measured class along ``WIDER``. DseError when
    neither exists or the class is unknown."""
    p = _profile(profile, tech)
    if compute_class not in OP_CLASSES:
        raise DseError(f"energy profile {p.name}: unknown compute class '{compute_class}'; "
                       f"allowed: {', '.join(OP_CLASSES)}")
    c = compute_class
    while c not in p.op_j:
        if c not in WIDER:
            raise DseError(f"energy profile {p.name}: no measured energy for '{compute_class}' nor a wider "
                           f"class; measured: {', '.join(p.op_j) or 'none'}")
        c = WIDER[c]
    return p.op_j[c], c


def bit_energy_j(profile: EnergyProfile | str, level: str, tech: Technology | None = None) -> float:
    """J per bit moved at memory ``level`` in ``profile``; DseError naming the measured levels."""
    p = _profile(profile, tech)
    if level not in p.bit_j:
        raise DseError(f"energy profile {p.name}: no measured energy per bit at level '{level}'; "
                       f"measured: {', '.join(p.bit_j) or 'none'}")
    return p.bit_j[level]


def dynamic_energy_j(ops_by_format: Mapping[str, object], bytes_by_level: Mapping[str, object],
                     profile: EnergyProfile | str, tech: Technology | None = None):
    """Dynamic energy (J) of ``ops_by_format`` (compute class -> ops, scalar or array [P]; a MAC is
    2 ops) and ``bytes_by_level`` (level -> bytes moved, scalar or array [P]) under ``profile`` (an
    EnergyProfile, a profile name, or a process node name, meaning that node's default profile)."""
    p = _profile(profile, tech)
    total = np.zeros(())
    for cls, ops in ops_by_format.items():
        total = total + np.asarray(ops, dtype=float) * op_energy(p, cls)[0]
    for level, nbytes in bytes_by_level.items():
        total = total + 8.0 * np.asarray(nbytes, dtype=float) * bit_energy_j(p, level)
    return total if total.ndim else float(total)


def energy_per_step_j(ops_by_format: Mapping[str, object], bytes_by_level: Mapping[str, object],
                      profile: EnergyProfile | str, seconds=0.0, static_w=0.0,
                      tech: Technology | None = None):
    """Energy of one step (J): ``dynamic_energy_j`` plus ``static_w`` (W) times ``seconds`` (s).
    Every argument may be a scalar or an array [P] of design points; the result broadcasts."""
    dyn = dynamic_energy_j(ops_by_format, bytes_by_level, profile, tech)
    out = np.asarray(dyn, dtype=float) + np.asarray(static_w, dtype=float) * np.asarray(seconds, dtype=float)
    return out if out.ndim else float(out)


def profile_coefficients(profile: EnergyProfile | str, tech: Technology | None = None) -> tuple[dict, dict, float, float | None]:
    """What the roofline's energy kernel needs of a profile: (J per op of each compute class of
    ``COMPUTE_CLASSES`` plus ``vector`` (FP32 vector work), each via ``op_energy``; the same with 0
    for a class charged at a wider class's figure (no measured J/op of its own: what it costs at
    least); J per bit of a device-memory byte that reaches the cores, crossing every measured level
    (``LEVELS``: HBM, L2 and L1, SC'25's figures being incremental); the measured constant power in
    W or None)."""
    p = _profile(profile, tech)
    ops, floor = {}, {}
    for c, own in [(c, c) for c in COMPUTE_CLASSES] + [("vector", "fp32")]:
        ops[c], measured = op_energy(p, own)
        floor[c] = ops[c] if measured == own else 0.0
    return ops, floor, sum(bit_energy_j(p, lv) for lv in LEVELS), p.constant_power_w


def static_power_w(template, tech: Technology | None = None) -> float:
    """Static (constant) power of ``template`` in W: its own cited ``static_power_w`` if it has one,
    else the measured constant power of its energy profile (SC'25). DseError when neither is known.
    ``template`` is any object with ``name``, ``static_power_w`` and ``energy_profile`` attributes
    (an ``hwmodels.template.AcceleratorTemplate``)."""
    own = getattr(template, "static_power_w", None)
    if own is not None:
        return float(own)
    p = _profile(template.energy_profile, tech)
    if p.constant_power_w is None:
        raise DseError(f"template {template.name}: energy profile {p.name} has no published constant power "
                       f"and the template gives no static_power_w")
    return p.constant_power_w


def arithmetic_energy_j(table: str, op: str, tech: Technology | None = None) -> float:
    """Circuit-level energy (J) of one arithmetic ``op`` (e.g. ``fp16_mult``) in the ``table``
    (``horowitz-45nm``, ``jouppi-7nm``); DseError naming what the table has."""
    t = tech or load_technology()
    if table not in t.arithmetic:
        raise DseError(f"{t.path}: no arithmetic energy table '{table}'; tables: {', '.join(t.arithmetic)}")
    if op not in t.arithmetic[table]:
        raise DseError(f"{t.path}: energy.arithmetic.{table} has no '{op}'; "
                       f"it has: {', '.join(t.arithmetic[table])}")
    return t.arithmetic[table][op]


def mac_energy_j(table: str, fmt: str, tech: Technology | None = None) -> float:
    """Circuit-level energy (J) of one multiply-accumulate in ``fmt`` (``int8``, ``fp16``, ``bf16``,
    ``fp32``): the multiply of the table plus the add of its accumulator (``ACCUMULATE``: INT32 for
    INT8, FP32 for the floating formats). Excludes operand delivery, control and leakage."""
    if fmt not in ACCUMULATE:
        raise DseError(f"mac_energy_j: format '{fmt}' has no accumulator rule; allowed: {', '.join(ACCUMULATE)}")
    return arithmetic_energy_j(table, f"{fmt}_mult", tech) + arithmetic_energy_j(table, ACCUMULATE[fmt], tech)
