"""The physical model of an accelerator: a microarchitecture template and what follows from it.

``AcceleratorTemplate`` (frozen) holds microarchitecture parameters: process node, clocks, cores
with their matrix units (dense MACs per cycle per compute class), vector lanes, register file and
SRAM, memory type and stacks/channels, scale-up links, host link lanes and chiplets. Pure functions
return what follows, in SI units:

- ``peak_ops_per_s`` (ops/s per compute class; a multiply-accumulate is 2 ops), ``vector_ops_per_s``,
  ``memory_bandwidth_bytes_per_s``, ``memory_capacity_bytes``;
- ``die_area`` (m^2, by component): LLMCompass's area model (Zhang et al., ISCA 2024, Sec. III-D,
  constants in ``configs/technology.yaml``): transistor counts of control, vector ALUs, matrix MACs,
  core interconnect and memory/link controllers over the node's logic density; register files by the
  EMPIRE regression; SRAM by bit area over array efficiency; PHYs at a fixed area per interface;
  ``exceeds_reticle`` and ``chiplets_needed`` against the 858 mm^2 reticle;
- ``dies_per_wafer`` (Hennessy & Patterson's closed form with edge loss), die yield by Murphy's,
  Poisson's or the negative-binomial model, ``die_cost_usd`` and ``cost`` (die + memory where a
  price is published; packaging is not, and is reported missing);
- ``peak_dynamic_power_w`` / ``peak_power_demand_w`` / ``board_power_w``: SC'25's measured energy
  coefficients at the roofline ridge (matrix units and HBM both at peak), plus static power, capped
  by the template's power limit as in SC'25's Eq. 1, ``P = min(TDP, P_const + ...)``.

Chiplets: counts (cores, SRAM, PHYs, links) are package totals; the silicon is split evenly over
``chiplets`` dies, and die-to-die interface area is not modelled (no published figure was found).
Harvesting: ``cores`` are the enabled cores, ``cores_on_die`` the physical ones; the yield model does
not credit the spares (it is conservative for harvested parts).

``a100()`` and ``h100()`` are built from NVIDIA's published microarchitecture (sources in each
template). This module imports neither ``dse`` nor ``workloads``.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Mapping

import numpy as np

from basis.errors import DseError
from hwmodels.device import Device, Link, MemoryTier
from hwmodels.energy import Technology, bit_energy_j, load_technology, op_energy, static_power_w
from hwmodels.formats import COMPUTE_CLASSES

#: vector lane kinds (per core): FP32 FMA lanes, INT32 ALUs, FP64 FMA lanes
VECTOR_KINDS = ("fp32", "int32", "fp64")


@dataclass(frozen=True)
class AcceleratorTemplate:
    """Microarchitecture parameters of an accelerator package (SI units).

    node: process node, a key of ``configs/technology.yaml`` nodes.
    clock_hz: core (vector) clock; matrix_clock_hz: the clock matrix peaks are quoted at (None: clock_hz).
    cores / cores_on_die: enabled / physical cores (SMs) in the package.
    lanes_per_core: sub-cores per core, each with its own register file and control (LLMCompass lanes).
    vector_width: SIMD width of a lane's control (LLMCompass scales control area by it).
    matrix_macs_per_cycle_per_core: compute class -> dense multiply-accumulates per cycle per core.
    vector_lanes_per_core: ``fp32`` / ``int32`` / ``fp64`` lanes per core (one FMA per lane per cycle).
    register_file_bytes_per_core, register_file_ports: register file size and ports per lane's file.
    local_sram_bytes_per_core: L1/shared memory per core; global_sram_bytes(_on_die): enabled/physical L2.
    memory_type: a key of the technology memory table; memory_stacks: enabled stacks (HBM) or channels;
    memory_phys_on_die: memory interfaces on the silicon (area); memory_pin_rate_bps: per-pin data rate
    (None: the memory table's); memory_capacity_per_stack_bytes (None: the table's stack capacity).
    link_type / link_count / link_bandwidth_bytes_per_s: scale-up links, bandwidth per link per direction.
    host_link_type / host_lanes: host interface (PCIe) lanes on the die.
    chiplets: compute dies the silicon is split over.
    energy_profile: measured energy profile (technology ``energy.devices``; None: the node's default).
    static_power_w: cited static power (None: the profile's measured constant power).
    power_limit_w: board power limit (TDP), W (None: unlimited).
    sources: short key -> citation for the numbers above.
    """

    name: str
    node: str
    clock_hz: float
    cores: int
    cores_on_die: int
    lanes_per_core: int
    vector_width: int
    matrix_macs_per_cycle_per_core: Mapping[str, float]
    vector_lanes_per_core: Mapping[str, float]
    register_file_bytes_per_core: float
    register_file_ports: int
    local_sram_bytes_per_core: float
    global_sram_bytes: float
    global_sram_bytes_on_die: float
    memory_type: str
    memory_stacks: int
    memory_phys_on_die: int
    memory_pin_rate_bps: float | None = None
    memory_capacity_per_stack_bytes: float | None = None
    link_type: str | None = None
    link_count: int = 0
    link_bandwidth_bytes_per_s: float = 0.0
    host_link_type: str | None = None
    host_lanes: int = 0
    chiplets: int = 1
    matrix_clock_hz: float | None = None
    energy_profile: str | None = None
    static_power_w: float | None = None
    power_limit_w: float | None = None
    sources: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self):
        w = f"template {self.name}"
        for k in ("clock_hz", "cores", "cores_on_die", "lanes_per_core", "vector_width",
                  "register_file_bytes_per_core", "register_file_ports", "local_sram_bytes_per_core",
                  "global_sram_bytes_on_die", "memory_stacks", "memory_phys_on_die", "chiplets"):
            if not getattr(self, k) > 0:
                raise DseError(f"{w}: {k} must be positive, got {getattr(self, k)!r}")
        for k in ("memory_pin_rate_bps", "memory_capacity_per_stack_bytes", "matrix_clock_hz",
                  "static_power_w", "power_limit_w"):
            v = getattr(self, k)
            if v is not None and not v > 0:
                raise DseError(f"{w}: {k} must be positive or left out, got {v!r}")
        if self.cores > self.cores_on_die:
            raise DseError(f"{w}: cores ({self.cores}) exceeds cores_on_die ({self.cores_on_die})")
        if self.memory_stacks > self.memory_phys_on_die:
            raise DseError(f"{w}: memory_stacks ({self.memory_stacks}) exceeds memory_phys_on_die "
                           f"({self.memory_phys_on_die})")
        if self.global_sram_bytes > self.global_sram_bytes_on_die:
            raise DseError(f"{w}: global_sram_bytes exceeds global_sram_bytes_on_die")
        bad = set(self.matrix_macs_per_cycle_per_core) - set(COMPUTE_CLASSES)
        if bad:
            raise DseError(f"{w}: matrix_macs_per_cycle_per_core: unknown class(es) {', '.join(sorted(bad))}; "
                           f"allowed: {', '.join(COMPUTE_CLASSES)}")
        bad = set(self.vector_lanes_per_core) - set(VECTOR_KINDS)
        if bad:
            raise DseError(f"{w}: vector_lanes_per_core: unknown kind(s) {', '.join(sorted(bad))}; "
                           f"allowed: {', '.join(VECTOR_KINDS)}")
        if any(not v >= 0 for v in (*self.matrix_macs_per_cycle_per_core.values(),
                                     *self.vector_lanes_per_core.values())):
            raise DseError(f"{w}: MACs per cycle and lane counts must not be negative")
        object.__setattr__(self, "matrix_macs_per_cycle_per_core",
                           MappingProxyType(dict(self.matrix_macs_per_cycle_per_core)))
        object.__setattr__(self, "vector_lanes_per_core", MappingProxyType(dict(self.vector_lanes_per_core)))
        object.__setattr__(self, "sources", MappingProxyType(dict(self.sources)))


def _tech(tech: Technology | None) -> Technology:
    return tech if tech is not None else load_technology()


def _need(value, what: str, t: Technology):
    if value is None:
        raise DseError(f"{t.path}: {what} is not published in the technology table (see its not_found list)")
    return value


# ------------------------------------------------------------------------------ performance

def peak_ops_per_s(t: AcceleratorTemplate) -> dict[str, float]:
    """Dense peak ops/s per compute class: 2 x MACs/cycle/core x enabled cores x matrix clock; the
    ``fp32`` class without a matrix figure is the vector FP32 rate (as the hardware presets give it)."""
    mclk = t.matrix_clock_hz or t.clock_hz
    peaks = {c: 2.0 * m * t.cores * mclk for c, m in t.matrix_macs_per_cycle_per_core.items() if m > 0}
    if "fp32" not in peaks and t.vector_lanes_per_core.get("fp32", 0) > 0:
        peaks["fp32"] = vector_ops_per_s(t)
    return peaks


def vector_ops_per_s(t: AcceleratorTemplate) -> float:
    """FP32 vector peak, ops/s: 2 x FP32 lanes/core x enabled cores x core clock (one FMA per lane)."""
    return 2.0 * t.vector_lanes_per_core.get("fp32", 0) * t.cores * t.clock_hz


def memory_bandwidth_bytes_per_s(t: AcceleratorTemplate, tech: Technology | None = None) -> float:
    """Off-chip memory bandwidth, bytes/s: stacks (or channels) x pin rate x width / 8."""
    tc = _tech(tech)
    m = tc.memory_tech(t.memory_type)
    rate = t.memory_pin_rate_bps if t.memory_pin_rate_bps is not None else \
        _need(m.pin_rate_bps, f"memory.{t.memory_type}.pin_rate_bps", tc)
    width = _need(m.width_bits, f"memory.{t.memory_type} width", tc)
    return t.memory_stacks * rate * width / 8.0


def memory_capacity_bytes(t: AcceleratorTemplate, tech: Technology | None = None) -> float:
    """Off-chip memory capacity, bytes: enabled stacks x capacity per stack."""
    tc = _tech(tech)
    per = t.memory_capacity_per_stack_bytes
    if per is None:
        per = _need(tc.memory_tech(t.memory_type).stack_capacity_bytes,
                    f"memory.{t.memory_type}.stack_capacity_bytes", tc)
    return t.memory_stacks * per


def link_bandwidth_bytes_per_s(t: AcceleratorTemplate) -> float:
    """Scale-up bandwidth per direction, bytes/s: link count x bandwidth per link per direction."""
    return t.link_count * t.link_bandwidth_bytes_per_s


# ------------------------------------------------------------------------------------- area

@dataclass(frozen=True)
class AreaBreakdown:
    """Silicon area of a template by component, m^2 (package total; ``per_die_m2`` per chiplet)."""

    control: float
    vector_alus: float
    matrix_units: float
    register_files: float
    local_sram: float
    core_interconnect: float
    global_sram: float
    memory_phy: float
    memory_controllers: float
    link_phy: float
    link_controllers: float
    host_phy: float
    host_controllers: float
    chiplets: int = 1

    @property
    def total_m2(self) -> float:
        """Total silicon area, m^2."""
        return (self.control + self.vector_alus + self.matrix_units + self.register_files + self.local_sram
                + self.core_interconnect + self.global_sram + self.memory_phy + self.memory_controllers
                + self.link_phy + self.link_controllers + self.host_phy + self.host_controllers)

    @property
    def per_die_m2(self) -> float:
        """Area of one chiplet, m^2 (the total split evenly)."""
        return self.total_m2 / self.chiplets


def fpu_transistors(fmt: str, tech: Technology | None = None) -> float:
    """Transistors of one FPU (or matrix MAC) of ``fmt``: LLMCompass scales the 64-bit FPU by
    (mantissa bits / 52)^2; formats narrower than FP16 are counted as FP16 (no published figure)."""
    a = _tech(tech).area
    bits = {"fp64": a["mantissa_bits_fp64"], "fp32": a["mantissa_bits_fp32"]}.get(fmt, a["mantissa_bits_fp16"])
    return a["fpu64_transistors"] * (bits / a["mantissa_bits_fp64"]) ** 2


def sram_area_m2(capacity_bytes: float, node: str, tech: Technology | None = None) -> float:
    """SRAM macro area, m^2 (LLMCompass): banks of at most 512 KiB, each bits x bit area / array
    efficiency of its size (CACTI-derived table; banks under 4 KiB count as 4 KiB)."""
    tc = _tech(tech)
    a = tc.area
    bit_area = _need(tc.node(node).sram_bit_area_m2, f"nodes.{node}.sram_bit_area_m2", tc)
    bank_max = a["sram_max_bank_bytes"]
    if capacity_bytes > bank_max:
        banks, unit = math.ceil(capacity_bytes / bank_max), bank_max
    else:
        banks, unit = 1, max(capacity_bytes, 4096.0)
    size = 2 ** math.ceil(math.log2(unit))
    return banks * unit * 8.0 * bit_area / a[f"sram_efficiency_{size}"]


def register_file_area_m2(registers: float, bits: float, ports: float, node: str,
                          tech: Technology | None = None) -> float:
    """Area of one register file, m^2: EMPIRE's 90 nm regression in registers D, bits W and ports P,
    scaled by the 90 nm over the node's logic density (LLMCompass calc_reg_file_area)."""
    tc = _tech(tech)
    a = tc.area
    D, W, P = registers, bits, ports
    a90 = (a["rf_c0_m2"] + a["rf_cD_m2"] * D + a["rf_cW_m2"] * W + a["rf_cP_m2"] * P + a["rf_cDW_m2"] * D * W
           + a["rf_cDD_m2"] * D * D + a["rf_cWW_m2"] * W * W + a["rf_cPP_m2"] * P * P + a["rf_cDP_m2"] * D * P
           + a["rf_cWP_m2"] * W * P)
    dens = _need(tc.node(node).logic_density_per_m2, f"nodes.{node}.logic_density_per_m2", tc)
    return a90 * a["rf_reference_density_per_m2"] / dens


def compute_units_m2(cores_on_die, lanes: Mapping, macs: Mapping, density: float, tc: Technology) -> tuple:
    """(vector ALUs, matrix units) area of ``cores_on_die`` cores, m^2 (LLMCompass): the vector lanes
    per core by kind (``lanes``: int32 ALUs, FP32 and FP64 FPUs) and the matrix MACs per cycle per
    core (``macs``: its FP16/BF16 MACs, else its widest class's, each an FP16 FPU) at ``density``
    transistors per m^2. The counts may be arrays (one per design: the area of each)."""
    a = tc.area
    vec = cores_on_die * ((lanes.get("int32", 0) * a["int32_alu_transistors"]
                           + lanes.get("fp32", 0) * fpu_transistors("fp32", tc)
                           + lanes.get("fp64", 0) * fpu_transistors("fp64", tc)) / density)
    half = [m for c, m in macs.items() if c in ("fp16", "bf16")]
    most = functools.reduce(np.maximum, half) if half else 0.0
    if macs:
        most = np.where(np.equal(most, 0), functools.reduce(np.maximum, macs.values()), most)
    matrix = cores_on_die * most * (fpu_transistors("fp16", tc) / density)
    return (vec, matrix) if np.ndim(vec) or np.ndim(matrix) else (float(vec), float(matrix))


def die_area(t: AcceleratorTemplate, tech: Technology | None = None) -> AreaBreakdown:
    """Silicon area by component (m^2) of ``t``'s physical resources (``*_on_die``): see the module
    docstring. HBM3/HBM3E interfaces take the HBM2e PHY and controller figures (the only published)."""
    tc = _tech(tech)
    a = tc.area
    nd = tc.node(t.node)
    dens = _need(nd.logic_density_per_m2, f"nodes.{t.node}.logic_density_per_m2", tc)
    n, lanes = t.cores_on_die, t.lanes_per_core
    tr = lambda count: count / dens  # noqa: E731  (transistors -> m^2)
    control = n * lanes * t.vector_width * tr(a["control_transistors_per_lane_per_vector_width"])
    vec, matrix = compute_units_m2(n, t.vector_lanes_per_core, t.matrix_macs_per_cycle_per_core, dens, tc)
    regs = t.register_file_bytes_per_core * 8 / (32 * lanes)
    rf = n * lanes * register_file_area_m2(regs, 32, t.register_file_ports, t.node, tc)
    local = n * sram_area_m2(t.local_sram_bytes_per_core, t.node, tc)
    xbar = n * tr(a["core_interconnect_transistors_per_core"])
    glob = sram_area_m2(t.global_sram_bytes_on_die, t.node, tc)
    mem_name = "hbm2e" if t.memory_type.startswith("hbm") else t.memory_type
    mem = tc.memory_tech(mem_name)
    mem_phy = t.memory_phys_on_die * _need(mem.phy_area_m2, f"memory.{mem_name}.phy_area_m2", tc)
    mem_ctrl = t.memory_phys_on_die * tr(_need(mem.controller_transistors, f"memory.{mem_name}.controller_transistors", tc))
    link_phy = link_ctrl = host_phy = host_ctrl = 0.0
    if t.link_type and t.link_count:
        lk = tc.link_tech(t.link_type)
        link_phy = t.link_count * _need(lk.phy_area_m2, f"links.{t.link_type}.phy_area_m2", tc)
        link_ctrl = t.link_count * tr(_need(lk.controller_transistors, f"links.{t.link_type}.controller_transistors", tc))
    if t.host_link_type and t.host_lanes:
        hk = tc.link_tech(t.host_link_type)
        host_phy = t.host_lanes * _need(hk.phy_area_m2, f"links.{t.host_link_type}.phy_area_m2", tc)
        host_ctrl = t.host_lanes * tr(_need(hk.controller_transistors,
                                            f"links.{t.host_link_type}.controller_transistors", tc))
    return AreaBreakdown(control, vec, matrix, rf, local, xbar, glob, mem_phy, mem_ctrl, link_phy, link_ctrl,
                         host_phy, host_ctrl, t.chiplets)


def die_area_m2(t: AcceleratorTemplate, tech: Technology | None = None) -> float:
    """Area of one die (chiplet) of ``t``, m^2."""
    return die_area(t, tech).per_die_m2


def exceeds_reticle(t: AcceleratorTemplate, tech: Technology | None = None, area: float | None = None) -> bool:
    """Whether one die of ``t`` is larger than the reticle field (then it needs more chiplets);
    ``area``: its die's area (m^2, ``die_area_m2``) when already worked out."""
    tc = _tech(tech)
    return (die_area_m2(t, tc) if area is None else area) > tc.reticle_area_m2


def chiplets_needed(total_area_m2, reticle_area_m2: float):
    """Fewest equal dies under the reticle for ``total_area_m2`` of silicon (array or scalar)."""
    return np.maximum(1, np.ceil(np.asarray(total_area_m2, dtype=float) / reticle_area_m2)).astype(int)


# ------------------------------------------------------------------------------------- cost

def dies_per_wafer(die_area_m2, wafer_diameter_m: float = 0.300):
    """Gross dies per wafer (closed form, Hennessy & Patterson Sec. 1.6): pi (d/2)^2 / A - pi d /
    sqrt(2 A), the second term the partial dies lost at the edge. Not rounded; array or scalar."""
    A = np.asarray(die_area_m2, dtype=float)
    d = wafer_diameter_m
    out = math.pi * (d / 2) ** 2 / A - math.pi * d / np.sqrt(2 * A)
    return out if out.ndim else float(out)


def yield_murphy(die_area_m2, defect_density_per_m2):
    """Die yield, Murphy's model (B. T. Murphy, Proc. IEEE 52(12), 1964): ((1 - e^-AD) / (AD))^2."""
    x = np.asarray(die_area_m2, dtype=float) * np.asarray(defect_density_per_m2, dtype=float)
    out = np.where(x > 0, ((1 - np.exp(-x)) / np.where(x > 0, x, 1.0)) ** 2, 1.0)
    return out if out.ndim else float(out)


def yield_poisson(die_area_m2, defect_density_per_m2):
    """Die yield, Poisson model: e^-AD."""
    out = np.exp(-np.asarray(die_area_m2, dtype=float) * np.asarray(defect_density_per_m2, dtype=float))
    return out if out.ndim else float(out)


def yield_negative_binomial(die_area_m2, defect_density_per_m2, alpha):
    """Die yield, negative-binomial model (Stapper; Hennessy & Patterson Sec. 1.6 with N = alpha):
    (1 + AD / alpha)^-alpha, ``alpha`` the defect clustering parameter."""
    x = np.asarray(die_area_m2, dtype=float) * np.asarray(defect_density_per_m2, dtype=float)
    out = (1 + x / alpha) ** (-np.asarray(alpha, dtype=float))
    return out if out.ndim else float(out)


def die_yield(t: AcceleratorTemplate, tech: Technology | None = None, model: str = "murphy",
              alpha: float | None = None, area: float | None = None) -> float:
    """Yield of one die of ``t`` at its node's defect density (``model``: murphy, poisson or
    negative_binomial with ``alpha``); ``area``: its die's area (m^2) when already worked out."""
    tc = _tech(tech)
    return _yield_at(die_area_m2(t, tc) if area is None else area, t.node, tc, model, alpha)


def _yield_at(area, node: str, tc: Technology, model: str = "murphy", alpha: float | None = None):
    """Yield of dies of ``area`` m^2 (array or scalar) at ``node``'s defect density (``die_yield``)."""
    d0 = _need(tc.node(node).defect_density_per_m2, f"nodes.{node}.defect_density_per_m2", tc)
    if model == "murphy":
        return yield_murphy(area, d0)
    if model == "poisson":
        return yield_poisson(area, d0)
    if model == "negative_binomial":
        if alpha is None or not alpha > 0:
            raise DseError(f"die_yield: model negative_binomial needs a positive alpha, got {alpha!r}")
        return yield_negative_binomial(area, d0, alpha)
    raise DseError(f"die_yield: unknown model '{model}'; allowed: murphy, poisson, negative_binomial")


def die_cost_usd(t: AcceleratorTemplate, tech: Technology | None = None, model: str = "murphy",
                 alpha: float | None = None, area: float | None = None) -> float:
    """Silicon cost of the package's dies, USD: chiplets x wafer price / (whole dies per wafer x
    yield). Excludes masks, design, test and packaging (as LLMCompass's per-die cost does).
    ``area``: its die's area (m^2, ``die_area_m2``) when already worked out."""
    return _dies_cost_usd(area, t, _tech(tech), model, alpha)


def _dies_cost_usd(area, t: AcceleratorTemplate, tc: Technology, model: str = "murphy", alpha: float | None = None):
    """``die_cost_usd`` of ``t``'s package with dies of ``area`` m^2 (array or scalar: one per design;
    None: ``t``'s own)."""
    price = _need(tc.node(t.node).wafer_price_usd, f"nodes.{t.node}.wafer_price_usd", tc)
    area = die_area_m2(t, tc) if area is None else area
    dpw = np.floor(dies_per_wafer(area, tc.wafer_diameter_m))
    if np.any(dpw < 1):
        raise DseError(f"template {t.name}: a die of {np.max(area) * 1e6:.0f} mm^2 does not fit a wafer")
    out = t.chiplets * price / (dpw * _yield_at(area, t.node, tc, model, alpha))
    return out if np.ndim(out) else float(out)


@dataclass(frozen=True)
class CostBreakdown:
    """Manufacturing cost of a template, USD; a part without a published price is None and named
    in ``missing``. ``known_usd`` sums the parts that are known."""

    die_usd: float
    memory_usd: float | None
    packaging_usd: float | None
    missing: tuple[str, ...]

    @property
    def known_usd(self) -> float:
        return self.die_usd + (self.memory_usd or 0.0) + (self.packaging_usd or 0.0)


def cost(t: AcceleratorTemplate, tech: Technology | None = None, model: str = "murphy",
         alpha: float | None = None) -> CostBreakdown:
    """Die cost, memory cost (capacity x the memory's published price per byte) and packaging cost
    (none published: always missing), USD."""
    tc = _tech(tech)
    missing = ["packaging (no published CoWoS/2.5D package cost)"]
    price = tc.memory_tech(t.memory_type).price_usd_per_byte
    mem = None
    if price is None:
        missing.append(f"memory ({t.memory_type} has no published price per byte)")
    else:
        mem = memory_capacity_bytes(t, tc) * price
    return CostBreakdown(die_cost_usd(t, tc, model, alpha), mem, None, tuple(missing))


# ------------------------------------------------------------------------------------ power

def energy_profile_name(t: AcceleratorTemplate, tech: Technology | None = None) -> str:
    """The template's energy profile, else its node's default; DseError when neither exists."""
    tc = _tech(tech)
    name = t.energy_profile or tc.node(t.node).energy_profile
    if name is None:
        raise DseError(f"template {t.name}: node {t.node} has no measured energy profile; name one "
                       f"(energy.devices: {', '.join(tc.devices)})")
    return name


def peak_dynamic_power_w(t: AcceleratorTemplate, tech: Technology | None = None,
                         compute_class: str = "fp16") -> float:
    """Dynamic power at the roofline ridge, W: the matrix units at peak in ``compute_class`` (J/op of
    the profile) plus the off-chip memory at full bandwidth (HBM: the profile's J/bit; other memory:
    the memory table's access energy). Operand traffic through L1/L2 is not included (it depends on
    tiling), so this is a lower bound of the demand at the ridge."""
    tc = _tech(tech)
    prof = energy_profile_name(t, tc)
    peak = peak_ops_per_s(t).get(compute_class, 0.0)
    p_ops = peak * op_energy(prof, compute_class, tc)[0]
    if t.memory_type.startswith("hbm"):
        e_bit = bit_energy_j(prof, "hbm", tc)
    else:
        e_bit = _need(tc.memory_tech(t.memory_type).access_energy_j_per_bit,
                      f"memory.{t.memory_type}.access_energy_j_per_bit", tc)
    return p_ops + memory_bandwidth_bytes_per_s(t, tc) * 8.0 * e_bit


def peak_power_demand_w(t: AcceleratorTemplate, tech: Technology | None = None,
                        compute_class: str = "fp16") -> float:
    """Static plus ``peak_dynamic_power_w``, W: what the model asks for at the ridge, uncapped."""
    tc = _tech(tech)
    return static_power_w(_WithProfile(t, energy_profile_name(t, tc)), tc) + peak_dynamic_power_w(t, tc, compute_class)


def board_power_w(t: AcceleratorTemplate, tech: Technology | None = None, compute_class: str = "fp16") -> float:
    """Board power at peak, W: ``min(power_limit_w, peak_power_demand_w)`` (SC'25 Eq. 1), or the
    demand when the template has no limit. When the dynamic demand alone reaches the limit the
    result is the limit, whether or not the static power is published."""
    tc = _tech(tech)
    dyn = peak_dynamic_power_w(t, tc, compute_class)
    if t.power_limit_w is not None and dyn >= t.power_limit_w:
        return t.power_limit_w
    demand = peak_power_demand_w(t, tc, compute_class)
    return demand if t.power_limit_w is None else min(t.power_limit_w, demand)


@dataclass(frozen=True)
class _WithProfile:
    """A template seen with its resolved energy profile (for ``energy.static_power_w``)."""

    t: AcceleratorTemplate
    energy_profile: str

    @property
    def name(self) -> str:
        return self.t.name

    @property
    def static_power_w(self) -> float | None:
        return self.t.static_power_w


# ------------------------------------------------------------------------------- instances

_A100_SOURCES = {
    "a100-wp": "NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020): A100 108 SMs of the 128-SM GA100; 4 "
               "third-generation Tensor Cores per SM, 1024 dense FP16/BF16 FMA per clock per SM (512 TF32, 2048 "
               "INT8); 64 FP32, 64 INT32, 32 FP64 cores per SM; 4 processing blocks per SM; 256 KB register "
               "file and 192 KB combined L1/shared memory per SM; 40 MB L2; 1410 MHz boost clock; 5 of 6 "
               "HBM2(e) stacks, 10 x 512-bit controllers; 12 third-generation NVLink links, 600 GB/s total; "
               "826 mm^2, 54.2 B transistors, TSMC 7 nm (N7)",
    "nv-forum": "R. Crovella, NVIDIA developer forum thread 244727 'How to calculate the Tensor Core FP16 "
                "performance of H100?': A100 108 SMs x 2048 FLOP/clk x 1410 MHz = 312 TFLOPS",
    "llmcompass-ga100": "LLMCompass configs/GA100.json: 128 physical cores, 48 MB physical global buffer, 6 HBM2e "
                        "channels (5 active), register file 16384 x 32 bit, 4 ports per lane, vector width 32, "
                        "12 NVLink3 links",
    "preset": "configs/hardware/a100-80gb.yaml (datasheet): 2.039e12 B/s, 80 GiB in five 16 GiB HBM2e stacks, "
              "400 W",
    "a100-pcie": "NVIDIA A100 datasheet: PCIe Gen4 x16 host interface",
}


def a100() -> AcceleratorTemplate:
    """NVIDIA A100 SXM4 80GB from its published microarchitecture (``sources``). The HBM2e per-pin
    rate is the datasheet bandwidth over the 5 x 1024-bit bus (no per-pin rate is published by
    NVIDIA for the 80GB part); the area counts the physical GA100 die (128 SMs, 48 MB L2, 6 HBM PHYs).
    Its energy profile and 54 W constant power were measured on the 40GB SXM4 part (SC'25); with twice
    the HBM, whose refresh SC'25 holds responsible for most of that power, the 80GB part's is likely higher."""
    return AcceleratorTemplate(
        name="a100-sxm4-80gb", node="N7", clock_hz=1410e6, cores=108, cores_on_die=128,
        lanes_per_core=4, vector_width=32,
        matrix_macs_per_cycle_per_core={"fp16": 1024, "bf16": 1024, "tf32": 512, "int8": 2048},
        vector_lanes_per_core={"fp32": 64, "int32": 64, "fp64": 32},
        register_file_bytes_per_core=256 * 1024, register_file_ports=4,
        local_sram_bytes_per_core=192 * 1024,
        global_sram_bytes=40 * 2 ** 20, global_sram_bytes_on_die=48 * 2 ** 20,
        memory_type="hbm2e", memory_stacks=5, memory_phys_on_die=6,
        memory_pin_rate_bps=2.039e12 * 8 / (5 * 1024), memory_capacity_per_stack_bytes=16 * 2 ** 30,
        link_type="nvlink3", link_count=12, link_bandwidth_bytes_per_s=25e9,
        host_link_type="pcie4", host_lanes=16, chiplets=1,
        energy_profile="a100-sxm4-40gb", power_limit_w=400.0, sources=_A100_SOURCES)


_H100_SOURCES = {
    "h100-wp": "NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022): full GH100 144 SMs, 60 MB L2, 6 HBM3/"
               "HBM2e stacks, 12 x 512-bit controllers; H100 SXM5 132 SMs, 50 MB L2, 5 HBM3 stacks; 4 "
               "fourth-generation Tensor Cores per SM; 128 FP32, 64 INT32, 64 FP64 cores per SM; 256 KB "
               "register file and 256 KB combined L1/shared memory per SM; 18 fourth-generation NVLink links "
               "at 25 GB/s per direction each (900 GB/s total); TSMC 4N, 80 B transistors, 814 mm^2",
    "klockwood": "glennklockwood.com/garden/processors/h100 and /peak-FLOPS: 512 FMA per Tensor Core per clock, "
                 "1.83 GHz (low precision, tensor), 1.98 GHz (high precision); 132 x 4 x 1024 FLOP x 1.83 GHz = "
                 "989.43 TFLOPS BF16",
    "preset": "configs/hardware/h100-sxm.yaml (datasheet, dense = sparse/2): 3.35e12 B/s, 80 GiB in five 16 GiB "
              "HBM3 stacks, 700 W",
    "h100-pcie": "NVIDIA H100 datasheet: PCIe Gen5 x16 (128 GB/s bidirectional)",
}


def h100() -> AcceleratorTemplate:
    """NVIDIA H100 SXM5 80GB from its published microarchitecture (``sources``): tensor peaks at the
    1.83 GHz tensor clock, FP32 vector at 1.98 GHz; HBM3 per-pin rate = datasheet bandwidth over the
    5 x 1024-bit bus; the area counts the physical GH100 die (144 SMs, 60 MB L2, 6 HBM PHYs)."""
    return AcceleratorTemplate(
        name="h100-sxm5-80gb", node="4N", clock_hz=1980e6, matrix_clock_hz=1830e6, cores=132, cores_on_die=144,
        lanes_per_core=4, vector_width=32,
        matrix_macs_per_cycle_per_core={"fp16": 2048, "bf16": 2048, "tf32": 1024, "fp8": 4096, "int8": 4096},
        vector_lanes_per_core={"fp32": 128, "int32": 64, "fp64": 64},
        register_file_bytes_per_core=256 * 1024, register_file_ports=4,
        local_sram_bytes_per_core=256 * 1024,
        global_sram_bytes=50 * 2 ** 20, global_sram_bytes_on_die=60 * 2 ** 20,
        memory_type="hbm3", memory_stacks=5, memory_phys_on_die=6,
        memory_pin_rate_bps=3.35e12 * 8 / (5 * 1024), memory_capacity_per_stack_bytes=16 * 2 ** 30,
        link_type="nvlink4", link_count=18, link_bandwidth_bytes_per_s=25e9,
        host_link_type="pcie5", host_lanes=16, chiplets=1,
        energy_profile="gh200-hopper", power_limit_w=700.0, sources=_H100_SOURCES)


#: presets whose chip has a template built from its published microarchitecture
TEMPLATES = {"a100-80gb": a100, "h100-sxm": h100}


def template_figures(preset: str) -> dict | None:
    """The template's own figures of preset ``preset`` (None without a template): die area (m^2 and
    mm^2), board power (W), whether the die exceeds the reticle, and the cost parts published."""
    make = TEMPLATES.get(preset)
    if make is None:
        return None
    t = make()
    parts = cost(t)
    return {"die_area_m2": die_area_m2(t), "die_area_mm2": die_area_m2(t) * 1e6, "board_power_w": board_power_w(t),
            "exceeds_reticle": bool(exceeds_reticle(t)), "die_cost_usd": die_cost_usd(t),
            "missing_costs": list(parts.missing)}


# ------------------------------------------------------------------- templates as study columns

#: study columns that vary a template (column -> AcceleratorTemplate field); ``template`` names the
#: base (a key of ``TEMPLATES``). Counts are rounded to whole units; a count above what the base die
#: has grows the die with it.
TEMPLATE_COLUMNS = {"cores": "cores", "clock_hz": "clock_hz", "l2_bytes": "global_sram_bytes",
                    "memory_stacks": "memory_stacks", "memory_type": "memory_type", "process_node": "node",
                    "power_limit_w": "power_limit_w"}


def base_template(name: str) -> AcceleratorTemplate:
    """The template of preset ``name``; DseError naming the presets that have one."""
    if name not in TEMPLATES:
        raise DseError(f"template: unknown template '{name}'; allowed: {', '.join(TEMPLATES)}")
    return TEMPLATES[name]()


def varied(t: AcceleratorTemplate, **changes) -> AcceleratorTemplate:
    """``t`` with the ``TEMPLATE_COLUMNS`` fields in ``changes`` replaced (None: kept): a die built
    for the cores and L2 asked for, with the base's share of spares (A100: 108 of 128 SMs, 40 of
    48 MB), and at least as many memory interfaces as stacks; the tensor clock scales with the
    core clock; a new memory type runs at that memory's own pin rate and stack capacity."""
    kw = {f: v for f, v in changes.items() if v is not None}
    if not kw:
        return t
    for f in ("cores", "memory_stacks"):
        if f in kw:
            kw[f] = int(round(kw[f]))
    if "cores" in kw:                       # a die built for them, with the base's share of spares
        kw["cores_on_die"] = max(kw["cores"], int(round(kw["cores"] * t.cores_on_die / t.cores)))
    if "global_sram_bytes" in kw:
        kw["global_sram_bytes_on_die"] = kw["global_sram_bytes"] * t.global_sram_bytes_on_die / t.global_sram_bytes
    if "memory_stacks" in kw:
        kw["memory_phys_on_die"] = max(kw["memory_stacks"], t.memory_phys_on_die)
    if "clock_hz" in kw and t.matrix_clock_hz is not None:
        kw["matrix_clock_hz"] = t.matrix_clock_hz * kw["clock_hz"] / t.clock_hz
    if kw.get("memory_type", t.memory_type) != t.memory_type:
        kw.update(memory_pin_rate_bps=None, memory_capacity_per_stack_bytes=None)
    if kw.get("node", t.node) != t.node:
        kw["energy_profile"] = None                     # the new node's own measured profile
    return replace(t, name=f"{t.name}*", **kw)


def template_device(device: Device, t: AcceleratorTemplate, tech: Technology | None = None) -> Device:
    """``device`` (the preset the template describes) with what template ``t`` determines: peaks
    (2:4 sparse peaks scaled with them), vector rate, device memory, scale-up link bandwidth, TDP
    (its power limit), energy profile and static power. A design that differs from the chip has no
    price (its cost is ``cost``); DseError when the template cannot be built (its message names why)."""
    tc = _tech(tech)
    peaks = peak_ops_per_s(t)
    sparse = {c: v * peaks[c] / device.peak_ops_per_s[c] for c, v in device.sparse_peak_ops_per_s.items()
              if c in peaks and device.peak_ops_per_s.get(c)}
    own = device.memory
    memory = MemoryTier(t.memory_type, memory_capacity_bytes(t, tc), memory_bandwidth_bytes_per_s(t, tc), own.latency_s)
    link = device.interconnect
    if link is not None and t.link_count:
        link = Link(link.name, link_bandwidth_bytes_per_s(t), link.latency_s)
    return replace(device, name=t.name, description=f"{device.description} as template {t.name}",
                   peak_ops_per_s=peaks, sparse_peak_ops_per_s=sparse, vector_ops_per_s=vector_ops_per_s(t),
                   memory_tiers=(memory, *device.memory_tiers[1:]), interconnect=link, tdp_w=t.power_limit_w,
                   price_usd=None, energy_profile=energy_profile_name(t, tc), static_power_w=t.static_power_w)


def physical_figures(t: AcceleratorTemplate, tech: Technology | None = None) -> dict[str, float]:
    """Die area per die (m^2), whether it exceeds the reticle (1/0), and the build cost (USD) of
    the parts with a published price (die and memory; packaging has none, so this is a lower
    bound, and NaN where the memory has no price either). The die's figures are worked out once
    per distinct die (``DIE_FIELDS``): designs differing in clocks, pin rate or capacity share them."""
    tc = _tech(tech)
    die = _die(t, tc)
    price = tc.memory_tech(t.memory_type).price_usd_per_byte
    memory = None if price is None else memory_capacity_bytes(t, tc) * price
    return {"die_area_m2": die[0], "exceeds_reticle": die[1],
            "build_cost_usd": die[2] + memory if memory is not None else float("nan")}


#: the fields of a template that ``die_area`` and ``die_cost_usd`` read (the physical die: node, cores
#: and lanes on the die, matrix and vector units, register files, SRAM, memory, link and host
#: interfaces, chiplets); clocks, pin rate, capacity per stack, power and energy figures are not read
DIE_FIELDS = ("node", "cores_on_die", "lanes_per_core", "vector_width", "matrix_macs_per_cycle_per_core",
              "vector_lanes_per_core", "register_file_bytes_per_core", "register_file_ports",
              "local_sram_bytes_per_core", "global_sram_bytes_on_die", "memory_type", "memory_phys_on_die",
              "link_type", "link_count", "host_link_type", "host_lanes", "chiplets")
#: (technology, die fields) -> (area per die m^2, exceeds reticle, die cost USD, the technology kept alive)
_DIES: dict = {}


def _die(t: AcceleratorTemplate, tc: Technology) -> tuple:
    """(area per die m^2, exceeds the reticle 1/0, die cost USD, the technology) of ``t``'s die,
    worked out once per distinct die (``DIE_FIELDS``)."""
    key = (id(tc), *(_hashable(getattr(t, f)) for f in DIE_FIELDS))
    die = _DIES.get(key)
    if die is None:
        if len(_DIES) >= 4096:
            _DIES.clear()
        area = die_area(t, tc).per_die_m2          # once: the reticle and the cost read it
        die = _DIES[key] = (area, float(exceeds_reticle(t, tc, area)), die_cost_usd(t, tc, area=area), tc)
    return die


def _hashable(v):
    return tuple(sorted(v.items())) if isinstance(v, Mapping) else v


#: the figures of a design point a template expresses (``with_figures``), besides its own
#: columns (``TEMPLATE_COLUMNS``)
FIGURE_PARAMS = ("memory_bandwidth", "memory_capacity", *(f"peak_{c}" for c in COMPUTE_CLASSES), "compute_scale",
                 "vector_ops_per_s", "link_bandwidth", "tdp_w")


def with_figures(t: AcceleratorTemplate, tech: Technology | None = None, **figures) -> AcceleratorTemplate:
    """``t`` built to the figures of a design point (``FIGURE_PARAMS``, SI units; None: kept):
    ``memory_bandwidth`` through the per-pin rate of the same stacks, ``memory_capacity`` through
    the capacity per stack, ``peak_<class>`` through that class's MACs per cycle per core at the
    matrix clock, ``vector_ops_per_s`` through the FP32 lanes per core, ``compute_scale`` on every
    class's MACs and the vector lanes (after the peaks given, as the design point applies it),
    ``link_bandwidth`` per link over the same links, ``tdp_w`` as the power limit. So its peaks,
    bandwidth and capacity are the point's, and its area, cost and power follow from them.
    DseError naming any other figure (the template does not model it)."""
    kw = {f: v for f, v in figures.items() if v is not None}
    other = sorted(set(kw) - set(FIGURE_PARAMS))
    if other:
        raise DseError(f"template {t.name}: {', '.join(other)}: not a figure the template models; "
                       f"allowed: {', '.join(FIGURE_PARAMS)}")
    if not kw:
        return t
    tc = _tech(tech)
    macs, lanes = _units_to(t, kw)
    change = {}
    if "memory_bandwidth" in kw:
        width = _need(tc.memory_tech(t.memory_type).width_bits, f"memory.{t.memory_type} width", tc)
        change["memory_pin_rate_bps"] = kw["memory_bandwidth"] * 8.0 / (t.memory_stacks * width)
    if "memory_capacity" in kw:
        change["memory_capacity_per_stack_bytes"] = kw["memory_capacity"] / t.memory_stacks
    if "link_bandwidth" in kw:
        if not t.link_count:
            raise DseError(f"template {t.name}: link_bandwidth: the template has no scale-up links")
        change["link_bandwidth_bytes_per_s"] = kw["link_bandwidth"] / t.link_count
    if "tdp_w" in kw:
        change["power_limit_w"] = kw["tdp_w"]
    return replace(t, name=f"{t.name}*", matrix_macs_per_cycle_per_core=macs, vector_lanes_per_core=lanes, **change)


def _units_to(t: AcceleratorTemplate, figures: Mapping) -> tuple[dict, dict]:
    """(matrix MACs per cycle per core by class, vector lanes per core by kind) of ``t`` built to
    ``figures`` (``with_figures``: ``peak_<class>`` at the matrix clock, ``vector_ops_per_s`` on
    the FP32 lanes at the core clock, ``compute_scale`` on all of them after); a figure may be an
    array of designs, NaN where it is kept."""
    mclk = t.matrix_clock_hz or t.clock_hz

    def given(key, kept, built):
        v = figures[key]
        return np.where(np.isnan(v), kept, built) if np.ndim(v) else built
    macs = dict(t.matrix_macs_per_cycle_per_core)
    lanes = dict(t.vector_lanes_per_core)
    for c in COMPUTE_CLASSES:
        if f"peak_{c}" in figures:
            macs[c] = given(f"peak_{c}", macs.get(c, 0), figures[f"peak_{c}"] / (2.0 * t.cores * mclk))
    if "vector_ops_per_s" in figures:
        lanes["fp32"] = given("vector_ops_per_s", lanes.get("fp32", 0),
                              figures["vector_ops_per_s"] / (2.0 * t.cores * t.clock_hz))
    if "compute_scale" in figures:
        scale = given("compute_scale", 1.0, figures["compute_scale"])
        macs = {c: m * scale for c, m in macs.items()}
        lanes = {k: v * scale for k, v in lanes.items()}
    return macs, lanes


#: the figures of ``FIGURE_PARAMS`` that change the die (``DIE_FIELDS``: MACs and vector lanes);
#: the others set the pin rate, the capacity per stack, the link rate or the power limit
DIE_PARAMS = (*(f"peak_{c}" for c in COMPUTE_CLASSES), "compute_scale", "vector_ops_per_s")


def figures_of_many(t: AcceleratorTemplate, tech: Technology | None = None, **figures) -> dict[str, np.ndarray]:
    """``physical_figures`` and the TDP (W) of ``t`` built to each of many designs' figures
    (``with_figures``; arrays of ``FIGURE_PARAMS``, NaN: kept), as arrays: the die's figures once per
    distinct die (``DIE_PARAMS``), the memory's cost that of each design's capacity, the TDP each
    design's power limit (NaN without one)."""
    tc = _tech(tech)
    arrays = {k: np.asarray(v, dtype=float) for k, v in figures.items()}
    n = len(next(iter(arrays.values()))) if arrays else 1
    die_keys = [k for k in DIE_PARAMS if k in arrays]
    rows = np.column_stack([np.nan_to_num(arrays[k], nan=-1.0) for k in die_keys]) if die_keys else np.zeros((n, 1))
    if rows.shape[1] == 1:                 # one column: a plain sort, not a row-wise one
        uniq, inv = np.unique(rows[:, 0], return_inverse=True)
        uniq = uniq[:, None]
    else:
        uniq, inv = np.unique(rows, axis=0, return_inverse=True)
    # every distinct die at once: its MACs and lanes (``with_figures``) price its compute units; the
    # rest of the die is the template's
    macs, lanes = _units_to(t, {k: np.where(uniq[:, j] < 0, np.nan, uniq[:, j]) for j, k in enumerate(die_keys)})
    dens = _need(tc.node(t.node).logic_density_per_m2, f"nodes.{t.node}.logic_density_per_m2", tc)
    vec, matrix = compute_units_m2(t.cores_on_die, lanes, macs, dens, tc)
    area = replace(die_area(t, tc), vector_alus=np.broadcast_to(vec, len(uniq)),
                   matrix_units=np.broadcast_to(matrix, len(uniq))).per_die_m2
    die_usd = _dies_cost_usd(area, t, tc)
    inv = np.ravel(inv)
    price = tc.memory_tech(t.memory_type).price_usd_per_byte
    capacity = arrays.get("memory_capacity", np.full(n, np.nan))
    capacity = np.where(np.isnan(capacity), memory_capacity_bytes(t, tc), capacity)
    build = die_usd[inv] + capacity * price if price is not None else np.full(n, np.nan)
    tdp = arrays.get("tdp_w", np.full(n, np.nan))
    tdp = np.where(np.isnan(tdp), np.nan if t.power_limit_w is None else t.power_limit_w, tdp)
    return {"die_area_m2": area[inv], "build_cost_usd": build, "tdp_w": tdp}
