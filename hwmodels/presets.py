"""Hardware presets: ``configs/hardware/<name>.yaml``, every number with its source.

A numeric field is written ``{value: NUMBER, source: KEY-or-text}``; ``source``
names an entry of the file's ``sources`` map or is itself a citation. A number
without a source, a missing required field, a zero or negative value or an
unknown key is an error naming the file and the key.

``energy_profile`` names the measured energy profile of ``configs/technology.yaml`` that the
chip's energy per op and per bit come from (a plain name; presets of chips never measured have
none, and their energy stays unknown); ``static_power_w`` is a cited idle power overriding the
profile's.

``vendor`` (who makes the device; "research" for paper designs) and ``family`` (the efficiency
family whose achievable fractions the device shares, one of ``hwmodels.device.FAMILIES``) are plain
strings, not cited numbers. A preset without ``family`` gets its ``class`` as the family (the
efficiency model keeps first-order defaults per class for that case); a ``family`` outside
FAMILIES is an error naming the file, the key and the allowed values.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from basis.errors import DseError, cited_number, first_unknown, kind_of, name_or_kind, shown_key, verbatim
from basis.files import is_regular_file
from basis.shipped import shipped, shipped_folder
from basis.yamlfile import load_yaml
from hwmodels.classes import DEVICE_CLASSES as DEVICE_CLASSES  # the class names, imported from here too
from hwmodels.classes import device_class
from hwmodels.device import FAMILIES, PIM_OPERATOR_GROUPS, Device, Link, MemoryTier, PimUnit
from hwmodels.energy import load_technology
from hwmodels.formats import COMPUTE_CLASSES

#: the shipped hardware presets (``configs/hardware``; package data in a wheel)
HARDWARE_DIR = shipped("configs", "hardware")

TOP_KEYS = {"name", "description", "class", "vendor", "family", "sources", "peak_ops_per_s", "vector_ops_per_s",
            "memory_tiers", "onchip_buffer_bytes", "interconnect", "host_link", "host_memory", "tdp_w",
            "price_usd", "notes", "sparse_peak_ops_per_s", "pim", "host_cpu", "energy_profile", "static_power_w",
            "shard_cores"}
PIM_KEYS = {"peak_ops_per_s", "internal_bandwidth_multiple", "operators", "concurrent", "notes", "units",
            "unit_bandwidth_bytes_per_s", "mode_switch_s", "mode_switches", "coordination_s"}


def available_hardware() -> list[str]:
    """Names of the presets shipped in configs/hardware/ (DseError when the folder is missing)."""
    return sorted(p.stem for p in shipped_folder("configs", "hardware", what="the hardware presets").glob("*.yaml"))


def _cited(node, where: str, sources: dict, positive: bool = True) -> float:
    return cited_number(node, where, positive)


def _link(node, where: str, sources: dict) -> Link | None:
    if node is None:
        return None
    if not isinstance(node, dict) or "name" not in node:
        raise DseError(f"{where}: expected a mapping with name, bandwidth_bytes_per_s[, latency_s]")
    extra = first_unknown(node, ("name", "bandwidth_bytes_per_s", "latency_s"))
    if extra:
        raise DseError(f"{where}: unknown key(s) {extra}; allowed: name, bandwidth_bytes_per_s, latency_s")
    if "bandwidth_bytes_per_s" not in node:
        raise DseError(f"{where}: missing 'bandwidth_bytes_per_s'")
    lat = _cited(node["latency_s"], f"{where}.latency_s", sources, positive=False) if "latency_s" in node else 0.0
    return Link(str(node["name"]), _cited(node["bandwidth_bytes_per_s"], f"{where}.bandwidth_bytes_per_s", sources),
                lat)


def device_from_dict(d: dict, path: str) -> Device:
    """Return the Device a parsed preset describes; raise DseError naming ``path`` and the key."""
    if not isinstance(d, dict):
        raise DseError(f"{path}: expected a hardware preset, a mapping with keys such as name, class and "
                       f"peak_ops_per_s; this file is not one")
    unknown = first_unknown(d, TOP_KEYS)
    if unknown:
        raise DseError(f"{path}: unknown key(s) {unknown} (is this a hardware preset?); "
                       f"allowed: {', '.join(sorted(TOP_KEYS))}")
    for key in ("name", "class", "peak_ops_per_s", "vector_ops_per_s", "memory_tiers", "sources"):
        if key not in d:
            raise DseError(f"{path}: missing required key '{key}'")
    sources = d["sources"]
    if not isinstance(sources, dict) or not sources:
        raise DseError(f"{path}: 'sources' must map short keys to citations")
    kind = device_class(d["class"], path)
    vendor, family = _vendor_family(d, path)
    peaks = _peaks(d["peak_ops_per_s"], f"{path}: peak_ops_per_s", sources)
    sparse = _peaks(d["sparse_peak_ops_per_s"], f"{path}: sparse_peak_ops_per_s", sources) \
        if "sparse_peak_ops_per_s" in d else {}
    host_cpu = d.get("host_cpu")
    if host_cpu is not None and not isinstance(host_cpu, str):
        raise DseError(f"{path}: host_cpu must name a CPU preset, got {kind_of(host_cpu)}")
    tiers_node = d["memory_tiers"]
    if not isinstance(tiers_node, list) or not tiers_node:
        raise DseError(f"{path}: memory_tiers must be a non-empty list")
    tiers = [_tier(t, f"{path}: memory_tiers[{i}]", sources) for i, t in enumerate(tiers_node)]
    pim = _pim(d["pim"], f"{path}: pim", sources, tiers[0].bandwidth_bytes_per_s) if "pim" in d else None
    if (pim is None) == kind.has_pim:
        raise DseError(f"{path}: a 'pim' section is required for class pim and allowed only there")
    host_memory = _tier(d["host_memory"], f"{path}: host_memory", sources) if "host_memory" in d else None
    opt = lambda k: _cited(d[k], f"{path}: {k}", sources) if k in d else None  # noqa: E731
    return Device(
        name=str(d["name"]), description=str(d.get("description", d["name"])), device_class=d["class"],
        peak_ops_per_s=peaks, vector_ops_per_s=_cited(d["vector_ops_per_s"], f"{path}: vector_ops_per_s", sources),
        memory_tiers=tuple(tiers), onchip_buffer_bytes=opt("onchip_buffer_bytes") or 0.0,
        interconnect=_link(d.get("interconnect"), f"{path}: interconnect", sources),
        host_link=_link(d.get("host_link"), f"{path}: host_link", sources), host_memory=host_memory,
        tdp_w=opt("tdp_w"), price_usd=opt("price_usd"), sources={str(k): str(v) for k, v in sources.items()},
        sparse_peak_ops_per_s=sparse, pim=pim, host_cpu=host_cpu, vendor=vendor, family=family,
        energy_profile=_energy_profile(d, path), static_power_w=opt("static_power_w"),
        shard_cores=_shard_cores(d, path, sources))


def _shard_cores(d: dict, path: str, sources: dict) -> int:
    """The preset's cited ``shard_cores`` (1 where absent); DseError unless a whole number >= 1."""
    if "shard_cores" not in d:
        return 1
    v = _cited(d["shard_cores"], f"{path}: shard_cores", sources)
    if v != int(v) or v > 1024:
        raise DseError(f"{path}: shard_cores: expected a whole number of cores from 1 to 1024, got {v!r}")
    return int(v)


def _energy_profile(d: dict, path: str) -> str:
    """The preset's measured energy profile name ("" when it has none); DseError naming the known ones."""
    name = d.get("energy_profile", "")
    known = load_technology().devices
    if name and (not isinstance(name, str) or name not in known):
        raise DseError(f"{path}: energy_profile: {name_or_kind(name)} is not a measured profile; allowed: {', '.join(known)}")
    return name


def _vendor_family(d: dict, path: str) -> tuple[str, str]:
    """(vendor, family) of a parsed preset: family defaults to the class; an unknown one is an error."""
    vendor = d.get("vendor", "")
    if not isinstance(vendor, str) or ("vendor" in d and not vendor.strip()):
        raise DseError(f"{path}: vendor: expected a non-empty name such as nvidia, amd or research, got {kind_of(vendor)}")
    if "family" not in d:
        return vendor, d["class"]
    family = d["family"]
    if family not in FAMILIES:
        raise DseError(f"{path}: family: {name_or_kind(family)} is not a known efficiency family; allowed: {', '.join(FAMILIES)}")
    return vendor, family


def _peaks(node, where: str, sources: dict) -> dict[str, float]:
    """Cited peaks per compute format from a preset mapping."""
    if not isinstance(node, dict) or not node:
        raise DseError(f"{where}: must map compute formats to cited values")
    peaks = {}
    for fmt, v in node.items():
        if fmt not in COMPUTE_CLASSES:
            raise DseError(f"{where}.{fmt}: unknown compute format; allowed: {', '.join(COMPUTE_CLASSES)}")
        peaks[fmt] = _cited(v, f"{where}.{fmt}", sources)
    return peaks


def _pim(node, where: str, sources: dict, external_bw: float) -> PimUnit:
    """The PIM section of a preset; its internal bandwidth either as ``internal_bandwidth_multiple``
    of the external bus ``external_bw`` (bytes/s) or as ``units`` x ``unit_bandwidth_bytes_per_s``
    (the multiple then follows from them)."""
    if not isinstance(node, dict):
        raise DseError(f"{where}: expected a mapping with {', '.join(sorted(PIM_KEYS))}")
    extra = first_unknown(node, PIM_KEYS)
    if extra:
        raise DseError(f"{where}: unknown key(s) {extra}; allowed: {', '.join(sorted(PIM_KEYS))}")
    for k in ("peak_ops_per_s", "operators"):
        if k not in node:
            raise DseError(f"{where}: missing '{k}'")
    by_units = [k for k in ("units", "unit_bandwidth_bytes_per_s") if k in node]
    if len(by_units) == 1 or bool(by_units) == ("internal_bandwidth_multiple" in node):
        raise DseError(f"{where}: give either 'internal_bandwidth_multiple' or both 'units' and "
                       f"'unit_bandwidth_bytes_per_s'")
    ops = node["operators"]
    if not isinstance(ops, list) or not ops or any(o not in PIM_OPERATOR_GROUPS for o in ops):
        raise DseError(f"{where}.operators: expected a list of {', '.join(PIM_OPERATOR_GROUPS)}, got {kind_of(ops) if not isinstance(ops, list) else 'another list'}")
    conc = node.get("concurrent", False)
    if not isinstance(conc, bool):
        raise DseError(f"{where}.concurrent: expected true or false, got {kind_of(conc)}")
    figure = {k: _cited(node[k], f"{where}.{k}", sources, positive=k in ("units", "unit_bandwidth_bytes_per_s"))
              for k in ("units", "unit_bandwidth_bytes_per_s", "mode_switch_s", "mode_switches", "coordination_s")
              if k in node}
    if by_units:
        mult = figure["units"] * figure["unit_bandwidth_bytes_per_s"] / external_bw
        what = f"{where}.units x unit_bandwidth_bytes_per_s / the first memory tier's bandwidth"
    else:
        mult = _cited(node["internal_bandwidth_multiple"], f"{where}.internal_bandwidth_multiple", sources)
        what = f"{where}.internal_bandwidth_multiple"
    if not mult >= 1:
        raise DseError(f"{what}: must be at least 1, got {mult:g}")
    return PimUnit(_peaks(node["peak_ops_per_s"], f"{where}.peak_ops_per_s", sources), mult, tuple(ops), conc,
                   **figure)


def _tier(t, w: str, sources: dict) -> MemoryTier:
    """A memory tier from its preset mapping."""
    if not isinstance(t, dict) or "name" not in t:
        raise DseError(f"{w}: expected a mapping with name, capacity_bytes, bandwidth_bytes_per_s")
    extra = first_unknown(t, ("name", "capacity_bytes", "bandwidth_bytes_per_s", "latency_s"))
    if extra:
        raise DseError(f"{w}: unknown key(s) {extra}; allowed: name, capacity_bytes, bandwidth_bytes_per_s, latency_s")
    for k in ("capacity_bytes", "bandwidth_bytes_per_s"):
        if k not in t:
            raise DseError(f"{w}: missing '{k}'")
    return MemoryTier(str(t["name"]), _cited(t["capacity_bytes"], f"{w}.capacity_bytes", sources),
                      _cited(t["bandwidth_bytes_per_s"], f"{w}.bandwidth_bytes_per_s", sources),
                      _cited(t["latency_s"], f"{w}.latency_s", sources, False) if "latency_s" in t else 0.0)


def load_device_file(path: str | Path) -> Device:
    """Read and validate one preset file."""
    p = Path(path)
    try:
        return device_from_dict(load_yaml(p, "hardware preset"), str(p))
    except DseError as e:
        raise verbatim(e) from None


def load_named_table(path: Path, section: str, parse) -> dict:
    """Entries of ``section`` in a YAML file of cited presets (``configs/links.yaml``,
    ``configs/tiers.yaml``), each parsed by ``parse(mapping with its name, where, sources)``."""
    data = load_yaml(path, f"table of {section}")
    if not isinstance(data, dict):
        raise DseError(f"{path}: expected a mapping with '{section}' and 'sources'")
    sources = data.get("sources", {})
    entries = data.get(section) or {}
    if not isinstance(entries, dict):
        raise DseError(f"{path}: {section}: expected a mapping of names to entries, got {kind_of(entries)}")
    for name, node in entries.items():
        if not isinstance(node, dict):
            raise DseError(f"{path}: {section}.{shown_key(name)}: expected a mapping, got {kind_of(node)}")
    return {name: parse({"name": name, **node}, f"{path}: {section}.{name}", sources)
            for name, node in entries.items()}


def lookup(table: dict, name: str, what: str):
    """``table[name]``; DseError listing the valid names of ``what``."""
    if name not in table:
        raise DseError(f"unknown {what} '{name}'; valid {what}s: {', '.join(sorted(table))}")
    return table[name]


@lru_cache(maxsize=None)
def load_device(name_or_path: str) -> Device:
    """Return the Device of a preset name or a path to a preset YAML file."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or "/" in str(name_or_path):
        return load_device_file(p)
    f = HARDWARE_DIR / f"{name_or_path}.yaml"
    if not is_regular_file(f):
        raise DseError(f"unknown hardware '{shown_key(name_or_path)}'; valid hardware: {', '.join(available_hardware())}")
    return load_device_file(f)
