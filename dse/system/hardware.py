"""Hardware columns -> arrays: the one place presets and overrides become physics inputs.

Each point starts from its base preset (``hardware``: a name, a YAML path or a
``Device``), with a scale-up link preset (``link``) and an offload tier preset
(``host_tier``) swapped in where given, then every numeric override of the point:
peaks per format (``peak_<format>``, ``native_formats``, ``compute_scale``), memory,
links, host tier, PIM, power and price. Work asking for a compute class runs on the
narrowest wider class the point has (``hwmodels.formats.widening_choice``); 2:4 sparse
peaks apply as the preset's sparse/dense ratio of that class, on top of the point's
own dense peak.

A derived design's name (``hwmodels.derived``: ``h100-sxm+bw6.7T+fp8x0.5``) is its base preset
and override columns (``expanded``). Every point whose chip differs from its preset's (an override
of ``hwmodels.derived.DESIGN_PARAMS``, by name or by column) is named as what it is
(``HardwareArrays.designs``), and its die area, build cost and TDP are those of its preset's
template built to its figures (``hwmodels.template.figures_of_many``), or unknown (NaN, with the
reason in ``notes``) where the preset has no template or the template does not model a figure
changed; its price is unknown unless given (``price_usd``): a derived design is not a product.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from basis.errors import DseError
from dse.core.efficiency import family_of
from dse.core.roofline import PEAK_COLUMNS, PIM_ROLES, SystemArrays
from dse.system.columns import Columns, constant, factorize, group, per_code, pointwise
from dse.system.params import PARAMS
from hwmodels.classes import CLASSES, DEVICE_CLASSES, DeviceClass, device_class
from hwmodels.derived import (
    BY_KEY,
    BY_PARAM,
    DESIGN_PARAMS,
    Term,
    design_name,
    is_derived,
    overrides,
    parse_design,
    term_text,
    terms_of,
)
from hwmodels.device import Device
from hwmodels.energy import bit_energy_j, load_technology
from hwmodels.formats import COMPUTE_CLASSES, widening_choice
from hwmodels.links import available_links, host_link_fraction, load_link
from hwmodels.power import power_of
from hwmodels.presets import load_device
from hwmodels.template import (
    FIGURE_PARAMS,
    TEMPLATE_COLUMNS,
    TEMPLATES,
    base_template,
    figures_of_many,
    physical_figures,
    template_device,
    varied,
)
from hwmodels.tiers import with_host_tier
from hwmodels.topology import system_topology

_C = len(COMPUTE_CLASSES)
#: [classes] whether each hardware class sizes its chip count from capacity (by class code)
_SIZED_BY_CAPACITY = np.array([c.sized_by_capacity for c in CLASSES])
_DATAFLOW = np.array([c.dataflow for c in CLASSES])


@dataclass(frozen=True)
class HardwareArrays:
    """The hardware of every design point (SI units, arrays over points).

    system: the kernel's view at tp = 1 without offload (peaks widened per PEAK_COLUMNS).
    pattern: [P] index into ``used_by_pattern`` [U, C]: the class (index into COMPUTE_CLASSES)
        that runs work asking for each class (-1: none can), per pattern of native classes.
    ratio_native: [D, C] 2:4 sparse / dense peak of each base device's classes (1 where the
        preset publishes none); ``sparse_ratio`` widens it for some points.
    device_class: [P] index into DEVICE_CLASSES. family: [P] index into ``families``, the efficiency
        family of each point's device (``dse.core.efficiency.family_of``). name: [P] index into ``names``.
    has_host: [P] a host link and a host memory exist (offload can go somewhere).
    host_capacity, host_link_latency: [P] bytes and seconds (NaN / 0 without a host tier).
    host_cpu: [P] index into ``cpus`` (the CPU preset computing CPU layers; -1: none).
    die_area_m2, build_cost_usd: [P] the template's die area per die and build cost of its priced
        parts (``hwmodels.template.physical_figures``; NaN for presets without a template).
    design: [P] index into ``designs``, the name of each point's design (its preset's name, or a
        derived design's canonical name, ``hwmodels.derived.design_name``); ``notes``: per design, why
        its price, die area or TDP is unknown ("" when nothing is).
    """

    system: SystemArrays
    pattern: np.ndarray
    used_by_pattern: np.ndarray
    ratio_native: np.ndarray
    device_class: np.ndarray
    family: np.ndarray
    families: list
    name: np.ndarray
    names: list
    vendors: list
    buffer: np.ndarray
    has_host: np.ndarray
    host_capacity: np.ndarray
    host_link_bandwidth: np.ndarray
    host_link_latency: np.ndarray
    tdp_w: np.ndarray
    price_usd: np.ndarray
    die_area_m2: np.ndarray
    build_cost_usd: np.ndarray
    host_cpu: np.ndarray
    cpus: list
    design: np.ndarray | None = None
    designs: list | None = None
    notes: list | None = None
    energy_basis: list | None = None      # per device of ``names``: where its power figures come from (hwmodels.power.BASES)
    shard_cores: np.ndarray | None = None  # [P] cores a device's tensor-parallel share is split over (Device.shard_cores)

    def used(self, i: int) -> np.ndarray:
        """[C] the class that runs each class's work at point ``i``."""
        return self.used_by_pattern[self.pattern[i]]

    def sparse_ratio(self, index) -> np.ndarray:
        """[len(index), len(PEAK_COLUMNS)] 2:4 sparse / dense peak of the class each column's
        work runs in, at the points ``index`` (1 where none is published)."""
        used = self.used_by_pattern[self.pattern[index]]
        native = self.ratio_native[self.name[index]]
        out = np.ones((len(used), len(PEAK_COLUMNS)))
        out[:, :_C] = np.where(used >= 0, np.take_along_axis(native, np.maximum(used, 0), axis=1), 1.0)
        return out

    @property
    def sized_by_capacity(self) -> np.ndarray:
        """[P] bool: the points whose class sizes its chip count from capacity
        (``hwmodels.classes.DeviceClass.sized_by_capacity``)."""
        return _SIZED_BY_CAPACITY[self.device_class]

    @property
    def dataflow(self) -> np.ndarray:
        """[P] bool: the points whose class runs compiler-scheduled dataflow, priced by
        ``dse.core.dataflow`` (``hwmodels.classes.DeviceClass.dataflow``)."""
        return _DATAFLOW[self.device_class]

    def kind(self, i: int) -> DeviceClass:
        """The hardware class of point ``i`` (``hwmodels.classes.DeviceClass``)."""
        return CLASSES[int(self.device_class[i])]


def resolve_device(value) -> Device:
    """A base preset: a Device as is, else a preset name or YAML path."""
    if isinstance(value, Device):
        return value
    if not isinstance(value, str):
        raise DseError(f"hardware: expected a preset name, a preset YAML path or a Device, got {value!r}")
    return load_device(value)


def check_design(value) -> Device:
    """The base preset of a hardware name (a preset, a YAML path, or a derived design's name,
    ``hwmodels.derived``), its terms checked against it; DseError naming the bad part."""
    base, terms = parse_design(value) if is_derived(value) else (value, ())
    d = resolve_device(base)
    overrides(terms, d)
    return d


#: why a derived design has no price (``HardwareArrays.notes``)
PRICE_UNKNOWN = ("price unknown: a derived design is not a product with a market price; give one (price_usd / "
                 "--price-usd); its die area and TDP are its template's")


def expanded(cols: Columns) -> tuple[Columns, tuple | None]:
    """(``cols`` with each derived design's name in ``hardware`` split into its base preset and
    the override columns its terms set (``hwmodels.derived.overrides``): the one override path; the
    names as given, (code per point, names), or None when none is derived). Where a point gives a
    column its name also sets, both must agree; DseError naming the column otherwise, or naming
    the bad part of a name."""
    codes, names = cols.labels("hardware")
    if not any(is_derived(x) for x in names):
        return cols, None
    where = f"{cols.where}: hardware"
    bases, values = [], []
    for x in names:
        base, terms = parse_design(x, where) if is_derived(x) else (x, ())
        bases.append(base)
        values.append(overrides(terms, resolve_device(base), where) if terms else {})
    given = dict(cols.given)
    one = len(names) == 1
    given["hardware"] = bases[0] if one else np.array(bases, dtype=object)[codes]
    for p in DESIGN_PARAMS:
        if not any(p in v for v in values):
            continue
        if PARAMS[p] is str:
            term = np.array([v.get(p, "") for v in values], dtype=object)[codes]
            own = np.asarray(cols.labels(p)[1], dtype=object)[cols.labels(p)[0]] if cols.has(p) \
                else np.full(cols.n, "", dtype=object)
            clash = (term != "") & (own != "") & (term != own)
            merged = np.where(term != "", term, own)
            if p == "native_formats" and not cols.has(p):      # the other points: their preset's own formats
                native = np.array([BY_PARAM[p].figure(resolve_device(b)) for b in bases], dtype=object)[codes]
                merged = np.where(merged == "", native, merged)
        else:
            term = np.array([v.get(p, np.nan) for v in values], dtype=float)[codes]
            own = cols.numbers(p) if cols.has(p) else np.full(cols.n, np.nan)
            with np.errstate(invalid="ignore"):
                clash = ~np.isnan(term) & ~np.isnan(own) & (term != own)
            merged = np.where(np.isnan(term), own, term)
        if np.any(clash):
            i = int(np.flatnonzero(clash)[0])
            raise DseError(f"{where}: {names[int(codes[i])]} sets {p} (key '{_key(p)}') and the column {p} gives "
                           f"another value at point {i}; give it once")
        given[p] = merged[0] if one and np.ndim(cols.raw(p)) == 0 else merged
    return Columns(given, cols.where), (codes, names)


def design_codes(labels: dict) -> tuple[np.ndarray, list] | None:
    """(code per point, distinct names) of the designs of an evaluation's points (its ``labels``'
    ``hardware``), for the ``design`` column of a results table, beside ``hardware`` (the preset
    as given); None where no design is derived (no such column)."""
    codes, names = labels["hardware"]
    if not any(is_derived(x) for x in names):
        return None
    return np.asarray(codes), list(names)          # (the names of designs are distinct: ``_designs``)


def _key(param: str) -> str:
    """The notation's key of override parameter ``param``."""
    return next(k for k, v in BY_KEY.items() if v.param == param)


class DesignNames(Sequence):
    """The canonical names of an evaluation's designs (``hwmodels.derived.design_name``), spelled
    out when first read: each distinct value's text is Python's work (microseconds), which an
    evaluation of many distinct designs whose names nobody reads does not pay. Pickled as the
    list of names."""

    def __init__(self, count: int, spell):
        self._count, self._spell, self._names = count, spell, None

    def _all(self) -> list[str]:
        if self._names is None:
            self._names, self._spell = self._spell(), None
        return self._names

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, i):
        return self._all()[i]

    def __reduce__(self):
        return list, (self._all(),)


@dataclass(frozen=True)
class _Designs:
    """The design of every point: code [P] into ``names``, and per design whether it is derived,
    its die area per die (m^2), build cost (USD), TDP (W) and why any is unknown."""

    code: np.ndarray
    names: list
    derived: np.ndarray
    die_area_m2: np.ndarray
    build_cost_usd: np.ndarray
    tdp_w: np.ndarray
    notes: list


def _designs(cols: Columns, spelled, inv: np.ndarray, devices: list[Device]) -> _Designs | None:
    """The designs of the points of ``cols`` (expanded; ``spelled``: the hardware names as given)
    and their figures (``_figures``); None where no point has a design parameter. A design is a
    base preset and its values of ``hwmodels.derived.DESIGN_PARAMS``; a value equal to the preset's
    own figure leaves the chip unchanged and is not in its name. Worked out per distinct design,
    column by column (no Python step per design but for names given with terms)."""
    present = [p for p in DESIGN_PARAMS if cols.has(p)]
    if not present and spelled is None:
        return None
    hw_codes, hw_names = cols.labels("hardware")
    hw_codes = np.asarray(hw_codes)
    own = [resolve_device(b) if isinstance(b, str) else b for b in hw_names]
    parts = {}                       # each point's value of each parameter (code, distinct; ""/NaN: its preset's)
    for p in present:
        if PARAMS[p] is str:
            codes, distinct = cols.labels(p)
            codes, distinct = np.asarray(codes), ["" if v is None else str(v) for v in distinct]
            if BY_PARAM[p].figure is not None:     # the preset's own native formats, in any order: not given
                pair = codes * len(own) + hw_codes
                same = [k for k in np.unique(pair) if set(distinct[k // len(own)].split(","))
                        == set(BY_PARAM[p].figure(own[k % len(own)]).split(","))]
                codes = np.where(np.isin(pair, same), len(distinct), codes)
                distinct.append("")
            parts[p] = (codes, np.array(distinct, dtype=object))
            continue
        v = cols.numbers(p)
        if BY_PARAM[p].figure is not None:
            figure = np.array([np.nan if (x := BY_PARAM[p].figure(d)) is None else x for d in own], dtype=float)
            v = np.where(v == figure[hw_codes], np.nan, v)
        parts[p] = _factorize_numbers(v)
    # a design: a base, its name as given and its values (one equal to its preset's leaves it as it is)
    keys = [hw_codes, *([spelled[0]] if spelled is not None else []), *(c for c, _ in parts.values())]
    code, order, starts = group(keys, cols.n)
    first = order[starts[:-1]]                     # one point of each design
    base = hw_codes[first]
    values = {p: distinct[codes[first]] for p, (codes, distinct) in parts.items()}
    labels = np.array([b if isinstance(b, str) else d.name for b, d in zip(hw_names, own)], dtype=object)

    def terms() -> np.ndarray:
        """Each design's terms, in the canonical order ("" for none)."""
        tail = np.full(len(first), "", dtype=object)
        for p, (codes, distinct) in parts.items():
            tail = tail + _texts(p, distinct)[codes[first]]
        if spelled is not None:                    # a derived name as given: its own terms (factors kept)
            _spelled_terms(tail, np.asarray(spelled[0])[first], spelled[1], values)
        return tail

    if spelled is None:                            # a parameter given: a term in its name (spelled when read)
        derived = np.zeros(len(first), dtype=bool)
        for v in values.values():
            derived |= _given(v)
        names = DesignNames(len(first), lambda: (labels[base] + terms()).tolist())
    else:
        tail = terms()
        derived, names = tail != "", (labels[base] + tail).tolist()
    area, build, tdp, notes = _figures(cols, first, base, hw_names, own, values, derived)
    if spelled is not None:                        # two spellings of one design (a term, a column): one name
        index: dict = {}
        again = np.array([index.setdefault(x, len(index)) for x in names], dtype=np.int64)
        keep = np.unique(again, return_index=True)[1]
        code, names, derived, area, build, tdp = again[code], list(index), derived[keep], area[keep], build[keep], tdp[keep]
        notes = [notes[k] for k in keep]
    return _Designs(code, names, derived, area, build, tdp, notes)


def _texts(param: str, distinct) -> np.ndarray:
    """'+TERM' of parameter ``param`` for each of its ``distinct`` values
    (``hwmodels.derived.term_text``; "" for one not given: NaN or empty)."""
    key = BY_PARAM[param].key
    values = distinct.tolist() if isinstance(distinct, np.ndarray) else list(distinct)   # Python floats: cheaper
    return np.array(["" if not _given(v) else f"+{term_text(Term(key, v))}" for v in values], dtype=object)


def _spelled_terms(tail: np.ndarray, spelled: np.ndarray, names: list, values: dict) -> None:
    """Rewrite in place the terms (``tail``) of the designs whose hardware was given as a derived
    name (``spelled``: its code per design into ``names``): that name's terms, a factor kept as
    written, and the columns' terms for the other parameters; a term equal to the preset's own
    figure (its value "" / NaN in ``values``) left out."""
    for s in np.unique(spelled):
        if not is_derived(names[s]):
            continue
        named = parse_design(names[s])[1]
        params = {BY_KEY[t.key].param for t in named}
        for d in np.flatnonzero(spelled == s):
            mine = [t for t in named if _given(values[BY_KEY[t.key].param][d])]
            rest = terms_of({p: v[d] for p, v in values.items() if p not in params})
            tail[d] = design_name("", (*mine, *rest))


def _given(v):
    """True for a design's value of a parameter that is given (not "" or NaN); for an array of
    values, elementwise."""
    if isinstance(v, np.ndarray):
        return v != "" if v.dtype == object else v == v
    return bool(v) if isinstance(v, str) else v == v      # NaN: not given


def _figures(cols: Columns, first, base, hw_names, own, values: dict, derived) -> tuple:
    """(die area per die m^2, build cost USD, TDP W, why unknown) of each design: NaN and "" for a
    preset (its own figures stand); a derived design's from its preset's template built to its
    values (``hwmodels.template.varied``, then ``figures_of_many``), else NaN with the reason: the
    preset has no template, or the template does not model a parameter changed (a TDP given,
    ``tdp_w``, is the TDP still). Its price is unknown unless given (``PRICE_UNKNOWN``)."""
    d = len(first)
    area, build = np.full(d, np.nan), np.full(d, np.nan)
    tdp = values["tdp_w"].copy() if "tdp_w" in values else np.full(d, np.nan)
    notes = np.full(d, "", dtype=object)
    priced = ~np.isnan(cols.numbers("price_usd")[first]) if cols.has("price_usd") else np.zeros(d, dtype=bool)
    unmodelled = [p for p in values if p not in TEMPLATE_COLUMNS and p not in FIGURE_PARAMS]
    template_cols = [p for p in values if p in TEMPLATE_COLUMNS]
    keys = [base, *(np.unique(values[p].astype(str), return_inverse=True)[1].ravel() for p in template_cols)]
    _, order, starts = group(keys, d)
    for g in range(len(starts) - 1):
        at = order[starts[g]:starts[g + 1]]
        at = at[derived[at]]
        if not len(at):
            continue
        name, device = hw_names[int(base[at[0]])], own[int(base[at[0]])]
        if not (isinstance(name, str) and name in TEMPLATES):
            why = f"'{device.name}' has no template (hwmodels/template.py: {', '.join(TEMPLATES)})"
            notes[at] = [f"price, die area{'' if np.isfinite(t) else ' and TDP'} unknown: {why}" for t in tdp[at]]
            continue
        odd = np.zeros(len(at), dtype=bool)
        for p in unmodelled:
            odd |= _given(values[p][at])
        for j in np.flatnonzero(odd):
            which = [p for p in unmodelled if _given(values[p][at[j]])]
            notes[at[j]] = (f"price, die area{'' if np.isfinite(tdp[at[j]]) else ' and TDP'} unknown: the template "
                            f"of '{name}' does not model {', '.join(which)}")
        at = at[~odd]
        if not len(at):
            continue
        i = int(at[0])
        t = varied(base_template(name), **{TEMPLATE_COLUMNS[p]: (values[p][i] or None) if PARAMS[p] is str
                                          else (None if np.isnan(values[p][i]) else float(values[p][i]))
                                          for p in template_cols})
        f = figures_of_many(t, **{p: values[p][at] for p in values if p in FIGURE_PARAMS})
        area[at], build[at], tdp[at] = f["die_area_m2"], f["build_cost_usd"], f["tdp_w"]
        notes[at] = PRICE_UNKNOWN
        notes[at[priced[at]]] = ""
    return area, build, tdp, list(notes)


def _bases(cols: Columns) -> tuple[np.ndarray, list[Device], list[dict]]:
    """(base device of each point, the distinct base devices, their physical figures) with link
    and host-tier presets applied and, where a point gives template columns
    (``hwmodels.template.TEMPLATE_COLUMNS``), its preset's template varied by them. The physical
    figures (die area, build cost; ``hwmodels.template.physical_figures``) are those of the
    template, NaN for presets without one."""
    keys = []
    parts = {}
    for k in ("hardware", "link", "host_tier", *TEMPLATE_COLUMNS):
        if cols.raw(k) is not None:
            parts[k] = cols.labels(k) if PARAMS[k] is str else _factorize_numbers(cols.numbers(k))
            keys.append(parts[k][0])
    inv, order, starts = group(keys, cols.n)
    devices, physical = [], []
    for g in range(len(starts) - 1):
        i = order[starts[g]]
        name = parts["hardware"][1][parts["hardware"][0][i]]
        d = resolve_device(name)
        changes = {field: _value(parts[k], i) for k, field in TEMPLATE_COLUMNS.items() if k in parts}
        changes = {f: v for f, v in changes.items() if v is not None}
        figures = {"die_area_m2": np.nan, "build_cost_usd": np.nan}
        if isinstance(name, str) and name in TEMPLATES:
            try:
                t = varied(base_template(name), **changes)
                figures = physical_figures(t)
                if changes:
                    d = template_device(d, t)
            except DseError as e:
                given = ", ".join(f"{k} {_value(parts[k], i):g}" if PARAMS[k] is not str else f"{k} {_value(parts[k], i)}"
                                  for k in TEMPLATE_COLUMNS if k in parts and _value(parts[k], i) is not None)
                raise DseError(f"{cols.where}: the template of '{name}' with {given or 'no change'} cannot be "
                               f"built: {e}") from None
        elif changes:
            raise DseError(f"{cols.where}: {', '.join(k for k in TEMPLATE_COLUMNS if k in parts)}: the template "
                           f"columns vary a preset's microarchitecture, and '{d.name}' has none; presets with a "
                           f"template: {', '.join(TEMPLATES)}")
        if "link" in parts:
            d = replace(d, interconnect=load_link(str(parts["link"][1][parts["link"][0][i]])))
        if "host_tier" in parts:
            d = with_host_tier(d, str(parts["host_tier"][1][parts["host_tier"][0][i]]))
        devices.append(d)
        physical.append(figures)
    return inv, devices, physical


def point_topologies(cols: Columns) -> tuple[np.ndarray, list]:
    """(code per point, distinct ``hwmodels.topology.Topology``) of the points of ``cols``: the
    ``topology`` column's preset or the hardware preset's own, with ``scale_up_size`` and
    ``scale_out`` where given; DseError naming the column and what it allows."""
    keys, parts = [], {}
    for k in ("hardware", "topology", "scale_up_size", "scale_out"):
        if cols.raw(k) is not None:
            parts[k] = cols.labels(k) if PARAMS[k] is str else _factorize_numbers(cols.numbers(k))
            keys.append(parts[k][0])
    inv, order, starts = group(keys, cols.n)
    out = []
    for g in range(len(starts) - 1):
        i = order[starts[g]]
        hw = parts["hardware"][1][parts["hardware"][0][i]] if "hardware" in parts else None
        topo, size, link = (_value(parts[k], i) if k in parts else None for k in ("topology", "scale_up_size", "scale_out"))
        if link is not None and str(link) not in available_links():
            raise DseError(f"{cols.where}: scale_out: '{str(link)[:40]}' is not one of configs/links.yaml's links; "
                           f"allowed: {', '.join(available_links())}")
        try:
            out.append(system_topology(hw, None if topo is None else str(topo), size,
                                       None if link is None else str(link)))
        except DseError as e:
            raise DseError(f"{cols.where}: {e}") from None
    return inv, out


def topology_arrays(cols: Columns) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """[P] devices per scale-up domain (inf: one domain), scale-out bandwidth per direction
    (NaN: no scale-out tier) and its switch-hop latency, of every point of ``cols``; and [P, 3] the
    torus dimensions of each point's domain (1 where it has fewer; None where no point's domain
    is a torus with cited dimensions)."""
    inv, tops = point_topologies(cols)
    size = np.array([t.scale_up.size for t in tops], dtype=float)
    bw = np.array([t.scale_out.link.bandwidth_bytes_per_s if t.scale_out else np.nan for t in tops])
    lat = np.array([t.scale_out.link.latency_s if t.scale_out else 0.0 for t in tops])
    dims = [tuple(t.scale_up.dims) + (1,) * (3 - len(t.scale_up.dims))
            if t.scale_up.shape == "torus" and 0 < len(t.scale_up.dims) <= 3 else (1, 1, 1) for t in tops]
    torus = np.asarray(dims, dtype=float)[inv] if any(np.prod(d) > 1 for d in dims) else None
    return per_code(size, inv), per_code(bw, inv), per_code(lat, inv), torus


def _factorize_numbers(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(code per point, distinct values) of a numeric column, NaN ("not given") one value."""
    given = ~np.isnan(x)
    values, codes = np.unique(np.where(given, x, -1.0), return_inverse=True)
    return codes.astype(np.int64), np.where(values == -1.0, np.nan, values)


def _value(part, i):
    """Point ``i``'s entry of a factorized column (None where it is not given)."""
    codes, values = part
    v = values[codes[i]]
    if isinstance(v, str):
        return v or None
    return None if np.isnan(v) else float(v)


def _per_device(devices, inv, get, default=np.nan) -> np.ndarray:
    vals = np.array([default if v is None else v for v in map(get, devices)], dtype=float)
    return per_code(vals, inv)


def assemble(cols: Columns) -> HardwareArrays:
    """The HardwareArrays of every point of ``cols`` (see the module docstring)."""
    cols, spelled = expanded(cols)
    n = cols.n
    inv, devices, physical = _bases(cols)
    designs = _designs(cols, spelled, inv, devices)
    if designs is not None and not designs.derived.any():
        designs = None

    def field(key, get, default=np.nan):
        own = _per_device(devices, inv, get, default)
        if not cols.has(key):
            return own
        given = cols.numbers(key)
        return np.where(np.isnan(given), own, given)

    # peaks per class as rows [P]: every step below is a whole-row operation; a class's row is
    # a number while it is one device's peak for every point (no column changes it)
    own = np.array([[d.peak_ops_per_s.get(c, 0.0) for d in devices] for c in COMPUTE_CLASSES])
    rows = [float(own[j, 0]) if len(devices) == 1 else own[j, inv] for j in range(_C)]
    for j, c in enumerate(COMPUTE_CLASSES):
        if cols.has(f"peak_{c}"):
            given = cols.numbers(f"peak_{c}")
            rows[j] = np.where(np.isnan(given), rows[j], given)
    if cols.has("native_formats"):
        nat_inv, nat = cols.labels("native_formats")
        allowed = np.array([[c in {f.strip() for f in str(v).split(",")} for v in nat] for c in COMPUTE_CLASSES])
        rows = [np.where(allowed[j, nat_inv], rows[j], 0.0) for j in range(_C)]
    scale = np.nan_to_num(cols.numbers("compute_scale"), nan=1.0) if cols.has("compute_scale") else None
    if scale is not None:
        rows = [r * scale for r in rows]
    # the class that runs each class's work depends only on which classes are native: one
    # widening per distinct pattern, then whole rows copied per pattern
    bits = 0                    # the native classes of every point: a number while they are the same
    for j in range(_C):
        native = rows[j] > 0
        if np.ndim(native) and native.size and (native.all() or not native.any()):
            native = bool(native[0])            # a class given per point, native everywhere or nowhere
        bits = bits | (native.astype(np.int64) << j if np.ndim(native) else int(native) << j)
    if np.ndim(bits):
        seen = np.flatnonzero(np.bincount(bits, minlength=1 << _C))
        lookup = np.zeros(1 << _C, dtype=np.int64)
        lookup[seen] = np.arange(len(seen))
        patterns, pattern = seen, lookup[bits]
    else:
        patterns, pattern = np.array([bits]), constant(np.int64(0), n)
    used_by_pattern = widening_choice((patterns[:, None] >> np.arange(_C)) & 1)
    peak_t = np.empty((len(PEAK_COLUMNS), n))
    peak_t[[j for j in range(_C) if (used_by_pattern[:, j] < 0).any()]] = 0.0     # a class no pattern runs
    for u, used in enumerate(used_by_pattern):
        cols_u = slice(None) if len(patterns) == 1 else pattern == u
        for j, k in enumerate(used):
            if k >= 0:
                peak_t[j, cols_u] = rows[k][cols_u] if np.ndim(rows[k]) else rows[k]
    vector = field("vector_ops_per_s", lambda d: d.vector_ops_per_s)
    peak_t[_C] = vector * scale if scale is not None else vector
    peak_t[_C + 1] = np.inf
    peak = peak_t.T                     # [P, columns], column-major: SystemArrays.take gathers per column
    ratio_native = np.array([[d.sparse_peak_ops_per_s.get(c, 0.0) / d.peak_ops_per_s[c]
                              if d.sparse_peak_ops_per_s.get(c) and d.peak_ops_per_s.get(c) else 1.0
                              for c in COMPUTE_CLASSES] for d in devices])

    bw = field("memory_bandwidth", lambda d: d.memory.bandwidth_bytes_per_s)
    cap = field("memory_capacity", lambda d: d.memory.capacity_bytes)
    link_bw = field("link_bandwidth", lambda d: d.interconnect.bandwidth_bytes_per_s if d.interconnect else None)
    link_lat = field("link_latency", lambda d: d.interconnect.latency_s if d.interconnect else None, 0.0)
    host_link = field("host_link_bandwidth", lambda d: d.host_link.bandwidth_bytes_per_s if d.host_link else None)
    host_lat = _per_device(devices, inv, lambda d: d.host_link.latency_s if d.host_link else None, 0.0)
    host_frac = _per_device(devices, inv, lambda d: host_link_fraction(d.host_link.name) if d.host_link else None, 1.0)
    host_mem_bw = field("host_memory_bandwidth", lambda d: d.host_memory.bandwidth_bytes_per_s
                        if d.host_memory else None, np.inf)
    host_cap = field("host_memory_capacity", lambda d: d.host_memory.capacity_bytes if d.host_memory else None)
    has_host = pointwise(lambda link, capacity: np.isfinite(link) & (link > 0) & np.isfinite(capacity) & (capacity > 0),
                         host_link, host_cap)

    pim_kw = {}
    if any(d.pim for d in devices) or cols.has("pim_multiple") or cols.has("pim_peak"):
        any_pim = any(d.pim for d in devices)
        pim_raw = np.array([[d.pim.peak_ops_per_s.get(c, 0.0) if d.pim else 0.0 for c in COMPUTE_CLASSES]
                            for d in devices])[inv]
        if cols.has("pim_peak"):
            p = cols.numbers("pim_peak")[:, None]
            raw = np.stack(np.broadcast_arrays(*rows, np.empty(n))[:_C], axis=1)      # [P, C]
            pim_raw = np.where(np.isnan(p), pim_raw, np.where(pim_raw > 0, p, 0.0) if any_pim
                               else np.where(raw > 0, p, 0.0))
        pim_used = widening_choice(pim_raw)
        pim = np.zeros((n, len(PEAK_COLUMNS)))
        pim[:, :_C] = np.where(pim_used >= 0, np.take_along_axis(pim_raw, np.maximum(pim_used, 0), axis=1), 0.0)
        roles = np.array([[(bool(d.pim) and r in d.pim.operators) or not any_pim for r in PIM_ROLES]
                          for d in devices])[inv]
        pim_kw = dict(pim_peak=pim,
                      pim_multiple=field("pim_multiple", lambda d: d.pim.internal_bandwidth_multiple
                                         if d.pim else None, 1.0),
                      pim_roles=roles,
                      pim_concurrent=np.array([bool(d.pim and d.pim.concurrent) for d in devices])[inv],
                      pim_fixed_s=np.array([d.pim.fixed_s if d.pim else 0.0 for d in devices])[inv])

    energy, energy_basis = _energy_coefficients(cols, devices, inv, pattern, used_by_pattern)
    tdp = field("tdp_w", lambda d: d.tdp_w)
    price = field("price_usd", lambda d: d.price_usd)
    die_area = _per_device(physical, inv, lambda f: f["die_area_m2"])
    build_cost = _per_device(physical, inv, lambda f: f["build_cost_usd"])
    if designs is not None:             # a derived design: its template's figures, never its preset's
        own = designs.derived[designs.code]
        tdp = np.where(own, designs.tdp_w[designs.code], tdp)
        given = cols.numbers("price_usd") if cols.has("price_usd") else np.full(n, np.nan)
        price = np.where(own & np.isnan(given), np.nan, price)
        die_area = np.where(own, designs.die_area_m2[designs.code], die_area)
        build_cost = np.where(own, designs.build_cost_usd[designs.code], build_cost)
    if cols.has("power_cap_w"):         # an operator's cap: the limit the device throttles to (dse.system.evaluator)
        limit = cols.numbers("power_cap_w")
        tdp = np.where(np.isnan(limit), tdp, np.fmin(limit, tdp))
    up_size, out_bw, out_lat, torus_dims = topology_arrays(cols)
    system = SystemArrays(peak, bw, cap, link_bw, link_lat, np.ones(n), np.minimum(host_link, host_mem_bw),
                          None, None, None, **pim_kw, **energy, tdp_w=tdp,
                          host_fraction=np.asarray(host_frac, dtype=float), host_latency=np.asarray(host_lat, dtype=float),
                          scale_up_size=up_size, scale_out_bandwidth=out_bw, scale_out_latency=out_lat,
                          torus_dims=torus_dims)
    dev_class = per_code(np.array([DEVICE_CLASSES.index(d.device_class) for d in devices], dtype=np.int64), inv)
    family_names = list(dict.fromkeys(family_of(d) for d in devices))
    family = per_code(np.array([family_names.index(family_of(d)) for d in devices], dtype=np.int64), inv)
    cpu_idx, cpus = _host_cpus(cols, devices, inv)
    return HardwareArrays(
        system=system, pattern=pattern, used_by_pattern=used_by_pattern, ratio_native=ratio_native,
        device_class=dev_class, family=family, families=family_names,
        name=inv, names=[d.name for d in devices], vendors=[getattr(d, "vendor", "") or "" for d in devices],
        buffer=field("onchip_buffer_bytes", lambda d: d.onchip_buffer_bytes, 0.0),
        has_host=has_host, host_capacity=host_cap, host_link_bandwidth=host_link, host_link_latency=host_lat,
        die_area_m2=die_area, build_cost_usd=build_cost, tdp_w=tdp, price_usd=price,
        host_cpu=cpu_idx, cpus=cpus, energy_basis=energy_basis,
        design=inv if designs is None else designs.code,
        designs=[d.name for d in devices] if designs is None else designs.names,
        notes=[""] * len(devices) if designs is None else designs.notes,
        shard_cores=_per_device(devices, inv, lambda d: d.shard_cores, 1.0))


def _energy_coefficients(cols: Columns, devices: list[Device], inv, pattern, used_by_pattern) -> tuple[dict, list]:
    """(SystemArrays' energy fields of every point: J per op of the class each column's work runs in
    (and the same counting only classes measured themselves: ``energy_op_floor_j``), J per bit of
    device-memory traffic and static W (the serving floor); the basis of each base device's
    figures), from ``hwmodels.power.power_of``: its measured profile, its TDP, or its class's. The
    static power is the ``static_power_w`` column where given; the host's, ``host_power_w`` (None: not given)."""
    n_cols = len(PEAK_COLUMNS)
    op_dev = np.full((len(devices), _C + 1), np.nan)          # [D, classes + vector]
    floor_dev = np.full((len(devices), _C + 1), np.nan)
    bit_dev = np.full(len(devices), np.nan)
    static_dev = np.full(len(devices), np.nan)
    basis = []
    for k, d in enumerate(devices):       # every device: measured, from its TDP, or its class's (hwmodels.power)
        pw = power_of(d)
        op_dev[k] = [pw.op_j[c] for c in COMPUTE_CLASSES] + [pw.vector_j]
        floor_dev[k] = [pw.floor_op_j[c] for c in COMPUTE_CLASSES] + [pw.vector_j]
        bit_dev[k] = pw.bit_j + (_off_hbm_access_j(d.memory.name, d.energy_profile) if pw.basis == "measured" else 0.0)
        static_dev[k] = pw.floor_w
        basis.append(pw.basis)
    n_patterns = len(used_by_pattern)

    def per_column(table):
        # one row per (base device, native pattern): the class running each class's work is the
        # pattern's (``used_by_pattern``); then one row gathered per point
        rows = np.zeros((len(devices), n_patterns, n_cols))
        for u, used in enumerate(used_by_pattern):
            rows[:, u, :_C] = np.where(used >= 0, table[:, np.maximum(used, 0)], np.nan)
            rows[:, u, _C] = table[:, _C]
        rows = rows.reshape(-1, n_cols).T
        # [P, columns], column-major as ``peak``: a column's J/op is one contiguous row to read;
        # one row for every point (one device, one pattern): that row seen at every point, read-only
        if rows.shape[1] == 1:
            return np.broadcast_to(rows[:, 0], (len(inv), n_cols))
        return rows[:, inv * n_patterns + pattern].T
    static = per_code(static_dev, inv)
    if cols.has("static_power_w"):
        given = cols.numbers("static_power_w")
        static = np.where(np.isnan(given), static, given)
    host = np.nan_to_num(cols.numbers("host_power_w"), nan=0.0) if cols.has("host_power_w") else None
    return {"energy_op_j": per_column(op_dev), "energy_op_floor_j": per_column(floor_dev), "energy_bit_j": per_code(bit_dev, inv),
            "static_w": static, "host_w": host}, basis


def _off_hbm_access_j(memory: str, profile: str) -> float:
    """What a device-memory bit costs beyond the profile's HBM figure, J: 0 for HBM (every
    generation at the measured one), else the memory's own access energy less the HBM's (GDDR5 in
    ``configs/technology.yaml``; NaN for a memory without a published access energy)."""
    tech = load_technology()
    if memory.startswith("hbm") or memory not in tech.memory:
        return 0.0
    own = tech.memory_tech(memory).access_energy_j_per_bit
    return np.nan if own is None else own - bit_energy_j(profile, "hbm")


def _host_cpus(cols: Columns, devices: list[Device], inv: np.ndarray) -> tuple[np.ndarray, list[Device]]:
    """(index of the CPU preset computing CPU layers per point, -1 for none; the CPU presets):
    the ``host_cpu`` column, else the base preset's own ``host_cpu``."""
    if cols.raw("host_cpu") is not None:
        codes, names = cols.labels("host_cpu")
        cpus = [resolve_device(x) for x in names]
        for c in cpus:
            if not device_class(c.device_class).hosts_layers:
                raise DseError(f"host_cpu '{c.name}' is a {c.device_class}, not a cpu preset")
        return codes, cpus
    names = sorted({d.host_cpu for d in devices if d.host_cpu})
    cpus = [resolve_device(x) for x in names]
    per_device = np.array([names.index(d.host_cpu) if d.host_cpu else -1 for d in devices], dtype=np.int64)
    return per_code(per_device, inv), cpus


def cpu_system(hw: HardwareArrays, index) -> SystemArrays:
    """The kernel's view of the host CPUs of the points ``index`` (their own peaks and memory)."""
    cpus = [c for c in hw.cpus]
    cols = Columns({"hardware": np.array(cpus, dtype=object)[hw.host_cpu[index]], "model": ""})
    return assemble(cols).system


def system_arrays(devices, tp=1) -> SystemArrays:
    """The kernel's view of a list of devices (presets or Device objects) at tensor-parallel
    degree ``tp``, no offload and dense peaks: for tests and notebooks that drive the kernel."""
    sys = assemble(Columns({"hardware": np.array(list(devices), dtype=object), "model": ""})).system
    return sys.replaced(tp=np.broadcast_to(np.asarray(tp, dtype=float), (sys.size,)).copy())


__all__ = ["HardwareArrays", "assemble", "resolve_device", "check_design", "expanded", "design_codes", "PRICE_UNKNOWN", "cpu_system", "system_arrays", "factorize"]
