"""Hardware classes: each a declared kind with the properties the evaluator asks of it, found by
name (a preset's ``class``). Adding a class is one entry of ``CLASSES``; the code asks a property
(``sized_by_capacity``, ``has_pim``, ``hosts_layers``, ``dataflow``), never compares a class's name."""
from __future__ import annotations

from dataclasses import dataclass

from basis.errors import DseError, name_or_kind


@dataclass(frozen=True)
class DeviceClass:
    """A kind of device. ``sized_by_capacity``: with no devices, tp or pp given, the chip count
    follows from the footprint over each chip's memory (spatial/LPU systems: weights and KV
    spread over many chips' SRAM). ``has_pim``: its presets carry a ``pim`` section (near-memory
    compute units), required there and allowed nowhere else. ``hosts_layers``: it may be a host
    CPU (``host_cpu``) running layers of a CPU layer split. ``dataflow``: it runs a model as one
    compiler-scheduled program (no kernel launches, no serving-engine costs): priced by
    ``dse.core.dataflow`` in place of an engine profile."""

    name: str
    sized_by_capacity: bool = False
    has_pim: bool = False
    hosts_layers: bool = False
    dataflow: bool = False


#: every hardware class, in the order of their codes (``DEVICE_CLASSES``)
CLASSES = (
    DeviceClass("gpu"),
    DeviceClass("accelerator"),
    DeviceClass("cpu", hosts_layers=True),
    DeviceClass("soc"),
    DeviceClass("spatial", sized_by_capacity=True, dataflow=True),
    DeviceClass("pim", has_pim=True),
)
#: the names of the classes; a class's code is its position
DEVICE_CLASSES = tuple(c.name for c in CLASSES)
_BY_NAME = {c.name: c for c in CLASSES}


def device_class(name: str, where: str = "class") -> DeviceClass:
    """The DeviceClass named ``name``; DseError naming ``where`` and the classes allowed."""
    found = _BY_NAME.get(name) if isinstance(name, str) else None
    if found is None:
        raise DseError(f"{where}: class: {name_or_kind(name)} is not one of {', '.join(DEVICE_CLASSES)}")
    return found
