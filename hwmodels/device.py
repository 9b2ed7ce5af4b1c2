"""What one device offers: compute peaks per format, memory tiers, links."""
from __future__ import annotations

from dataclasses import dataclass, field

from basis.errors import DseError
from hwmodels.formats import COMPUTE_CLASSES, widening_choice


def _widened(peaks: dict[str, float], wanted: str) -> str | None:
    """The class of ``peaks`` that runs work asking for ``wanted`` (``widening_choice``), or None."""
    k = widening_choice([peaks.get(c, 0.0) for c in COMPUTE_CLASSES])[COMPUTE_CLASSES.index(wanted)]
    return COMPUTE_CLASSES[k] if k >= 0 else None


@dataclass(frozen=True)
class MemoryTier:
    """A memory level: capacity in bytes, bandwidth in bytes/s, access latency in s."""

    name: str
    capacity_bytes: float
    bandwidth_bytes_per_s: float
    latency_s: float = 0.0


@dataclass(frozen=True)
class Link:
    """A point-to-point or switched link: bandwidth per direction (bytes/s), latency (s)."""

    name: str
    bandwidth_bytes_per_s: float
    latency_s: float = 0.0


#: Efficiency families: the devices whose achievable fractions (compute, memory, collective) are
#: fitted and defaulted together (``dse.core.efficiency``). A preset names its family; a Device
#: built in code may leave ``family`` empty, and then its device class stands in (see Device).
FAMILIES = ("gpu", "tpu", "gaudi", "neuron", "tenstorrent", "apple", "cpu", "pim", "groq", "cerebras",
            "sambanova")

#: Operator groups a PIM may run (see workloads.optable for the operator names).
PIM_OPERATOR_GROUPS = ("attention", "gemv", "experts")


@dataclass(frozen=True)
class PimUnit:
    """Compute inside the device memory (bank-level PIM or a logic base die).

    peak_ops_per_s: the PIM's own peak per compute class, summed over all units, ops/s.
    internal_bandwidth_multiple: bandwidth the PIM units see, as a multiple of the
        external memory bus (the device's first memory tier).
    operators: groups of operators the PIM may run (PIM_OPERATOR_GROUPS).
    concurrent: True if the host computes while the PIM runs (else the host is blocked).
    units, unit_bandwidth_bytes_per_s: the processing units (one per bank, bank pair or bank
        group) and the bytes/s each reads from its own bank(s); units x unit bandwidth is the
        internal bandwidth (0: given only as ``internal_bandwidth_multiple``).
    mode_switch_s, mode_switches: the time of one switch between the memory's normal mode and
        its all-bank PIM mode, and the switches one PIM operator pays (in and out).
    coordination_s: host-PIM coordination per PIM operator (programming its instructions,
        broadcasting its operands' descriptors, the barrier before the host reads the result).
    """

    peak_ops_per_s: dict[str, float]
    internal_bandwidth_multiple: float
    operators: tuple[str, ...]
    concurrent: bool = False
    units: float = 0.0
    unit_bandwidth_bytes_per_s: float = 0.0
    mode_switch_s: float = 0.0
    mode_switches: float = 0.0
    coordination_s: float = 0.0

    @property
    def fixed_s(self) -> float:
        """Seconds every PIM operator instance pays besides its work: its mode switches and its
        host-PIM coordination."""
        return self.mode_switches * self.mode_switch_s + self.coordination_s

    def peak_for(self, wanted: str) -> float:
        """Peak ops/s of the PIM for work asking for ``wanted`` (0 if it cannot run it)."""
        c = _widened(self.peak_ops_per_s, wanted)
        return self.peak_ops_per_s[c] if c else 0.0


@dataclass(frozen=True)
class Device:
    """One accelerator (or CPU) as the roofline sees it.

    peak_ops_per_s: dense peak per compute class (``fp16``, ``fp8``, ...), ops/s.
    vector_ops_per_s: rate of element-wise work (softmax, norms, adds), ops/s.
    memory_tiers: device memory first.
    onchip_buffer_bytes: on-chip buffer one attention tile may use (FlashAttention).
    interconnect: the scale-up link between devices; host_link: the link to the host;
    host_memory: the host's memory behind host_link (for offload).
    sparse_peak_ops_per_s: 2:4 structured-sparse peaks, used only when asked for.
    pim: compute inside the device memory (class 'pim').
    host_cpu: name of the CPU preset of the host (computes layers kept on the CPU).
    vendor: who makes it ("nvidia", "amd", "google", "research" for paper designs, ...); "" if unknown.
    energy_profile: the measured energy profile (``configs/technology.yaml`` energy.devices) the
        device's energy per op and per bit come from; "" where none was measured for its chip.
    static_power_w: cited static (idle) power, W; None: the energy profile's measured constant power.
    shard_cores: the cores one device's share of a tensor-parallel model is split over, where an
        engine shards over cores rather than chips (AWS Neuron's tp_degree counts NeuronCores, two a
        Inferentia2 or Trainium1 chip; ``workloads.head_padding``); 1 elsewhere.
    family: the efficiency family (one of FAMILIES) whose achievable fractions the device shares.
        Presets always set it (``hwmodels.presets`` fills in the class when a YAML omits it). A
        Device built in code may leave it "": ``efficiency_family`` then is the device class
        itself. The class is not mapped to a family by guess: "gpu", "cpu" and "pim" are family
        names too, while "accelerator", "soc" and "spatial" cover several families (TPU, Gaudi,
        Neuron, Tenstorrent; Apple; Groq, Cerebras, SambaNova), so such a device gets the class's
        own first-order defaults unless ``family`` is given. Any other value is a DseError.
    """

    name: str
    description: str
    device_class: str
    peak_ops_per_s: dict[str, float]
    vector_ops_per_s: float
    memory_tiers: tuple[MemoryTier, ...]
    onchip_buffer_bytes: float = 0.0
    interconnect: Link | None = None
    host_link: Link | None = None
    host_memory: MemoryTier | None = None
    tdp_w: float | None = None
    price_usd: float | None = None
    sources: dict[str, str] = field(default_factory=dict)
    sparse_peak_ops_per_s: dict[str, float] = field(default_factory=dict)
    pim: PimUnit | None = None
    host_cpu: str | None = None
    vendor: str = ""
    family: str = ""
    energy_profile: str = ""
    static_power_w: float | None = None
    shard_cores: int = 1

    def __post_init__(self):
        if not isinstance(self.vendor, str):
            raise DseError(f"device '{self.name}': vendor must be a string, got {self.vendor!r}")
        if not isinstance(self.family, str) or (self.family and self.family not in FAMILIES
                                                and self.family != self.device_class):
            raise DseError(f"device '{self.name}': family {self.family!r} is not one of {', '.join(FAMILIES)} "
                           f"(or the device class '{self.device_class}')")

    @property
    def efficiency_family(self) -> str:
        """The efficiency family: ``family``, or the device class when none is given."""
        return self.family or self.device_class

    @property
    def memory(self) -> MemoryTier:
        """The device's own (first) memory tier."""
        return self.memory_tiers[0]

    def compute_class_for(self, wanted: str) -> str:
        """The class that actually runs work asking for ``wanted``: itself if native,
        else the narrowest wider class the device supports ('vector' for element-wise)."""
        if wanted in ("vector", "none"):
            return wanted
        c = _widened(self.peak_ops_per_s, wanted)
        if c:
            return c
        raise DseError(f"device '{self.name}' cannot compute {wanted} nor any wider format "
                       f"(it has {', '.join(self.peak_ops_per_s) or 'none'})")

    def peak_for(self, wanted: str, sparse: bool = False) -> float:
        """Peak ops/s available to work asking for compute class ``wanted``
        (the 2:4 sparse rate if ``sparse`` and the device publishes one)."""
        c = self.compute_class_for(wanted)
        if c == "vector":
            return self.vector_ops_per_s
        if c == "none":
            return float("inf")
        if sparse and c in self.sparse_peak_ops_per_s:
            return self.sparse_peak_ops_per_s[c]
        return self.peak_ops_per_s[c]


__all__ = ["Device", "MemoryTier", "Link", "PimUnit", "COMPUTE_CLASSES", "FAMILIES"]
