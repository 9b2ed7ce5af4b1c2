"""Points grouped for the kernel: a ``Group`` is the points of one workload on one hardware class
(or of many workloads differing only in batch and lengths, ``dse.system.workload.WorkloadBatch``)
with what pricing needs of them (``CpuSplit``, ``ServingInputs``, ``Speculation``); the order
that puts points sharing a workload side by side (``workload_order``) and the rule that prices
workloads shared by few points together (``many_workloads``, ``together``, ``MANY_BELOW``)."""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np

from dse.core.dataflow import dataflow_efficiency, decoder_layers
from dse.core.efficiency import Efficiency, choose, efficiency_for
from dse.core.engines import Engine, engine_efficiency
from dse.core.kv_tiers import TierLoad
from dse.core.roofline import SystemArrays
from dse.core.router import Routed
from dse.system.columns import Columns, group, group_codes, groups_of, per_code
from dse.system.inputs import WorkloadColumns
from dse.system.iteration import IterationModel
from dse.system.techniques import TECHNIQUE_COLUMNS
from dse.system.workload import WorkloadBatch, WorkloadTables
from hwmodels.classes import DeviceClass
from workloads.footprint import Footprint
from workloads.lengths import Lengths, LengthSpec
from workloads.model import ModelSpec
from workloads.optable import decode_limits


@dataclass(frozen=True)
class CpuSplit:
    """A CPU layer split of a group's points: ``share`` of the layers run on the host CPU, the
    others on the device, each step's activations crossing the host link both ways."""

    share: float                  # fraction of the model's layers on the CPU
    system: SystemArrays          # the host CPU, one row per point
    used: np.ndarray              # the compute class each peak column runs in on the CPU (for explain)
    hop_prefill: float            # bytes sent each way over the host link in a prefill
    hop_decode: float             # bytes sent each way over the host link in a decode step
    host_bw: np.ndarray           # [P] host-link bandwidth, bytes/s
    host_lat: np.ndarray          # [P] host-link latency, s
    host_frac: np.ndarray         # [P] the host link's own measured fraction of its peak

    def take(self, pos: np.ndarray) -> CpuSplit:
        """The split of the points ``pos`` (positions in the group)."""
        return replace(self, system=self.system.take(pos), host_bw=self.host_bw[pos], host_lat=self.host_lat[pos],
                       host_frac=self.host_frac[pos])


@dataclass(frozen=True)
class Speculation:
    """Speculative decoding of a static batch (``dse.system.feasibility.speculation``): rounds of
    ``drafted`` tokens proposed by a draft model (``tables``, a model of its own or the target's
    first layers) or by Medusa heads (``heads``), verified in one target step each."""

    acceptance: float             # probability that a drafted token is accepted
    drafted: int                  # tokens drafted a round (g)
    tp: float                     # tensor parallelism of the draft (the heads run on the target's)
    footprint: Footprint          # bytes per device of target and draft together
    tables: WorkloadTables | None = None   # the draft model's operator tables
    model: ModelSpec | None = None         # the draft model
    heads: object = None                   # Medusa heads: OpArrays of one pass drafting g tokens


@dataclass(frozen=True)
class ServedSpeculation:
    """Speculative decoding under continuous batching (``dse.system.served.speculative_serving``):
    each iteration verifies ``drafted`` + 1 tokens a decoding sequence, yielding ``e`` tokens."""

    e: float                      # tokens a decoding sequence gains an iteration (``tokens_per_target_step``)
    draft: IterationModel         # the draft's iteration model, on its own layout
    tp: float                     # tensor parallelism of the draft
    drafted: int                  # tokens drafted a round (g)
    mean_gen: float               # the real mean output length, tokens


@dataclass(frozen=True)
class DecodePool:
    """A disaggregated decode pool laid out otherwise than the prefill pool (``decode_tp``,
    ``decode_ep``), on hardware of its own (``decode_hardware``) or over a link of its own
    (``pd_link``): its engines' iteration, paged KV blocks ([P], one rank's) and layout; on its own
    hardware its ``system`` ([P], tp 1, as ``HardwareArrays.system``; None: the prefill pool's), the
    link the KV cache crosses (``link_bandwidth`` bytes/s and ``link_latency`` s, [P]; None: the
    prefill pool's scale-up link; NaN: none known) and the whole point's ``cost_usd`` and
    ``system_tdp_w`` (both pools, [P])."""

    iteration: IterationModel
    kv_blocks: np.ndarray
    tp: int
    ep: int
    system: SystemArrays | None = None
    link_bandwidth: np.ndarray | None = None
    link_latency: np.ndarray | None = None
    cost_usd: np.ndarray | None = None
    system_tdp_w: np.ndarray | None = None
    family: str = ""              # on hardware of its own: its efficiency family (``dse.core.efficiency``)

    def efficiency(self, eff: Efficiency, engine: Engine | None, kv_group: float, family: str) -> Efficiency:
        """The Efficiency the pool's iterations are priced with, given the prefill pool's ``eff`` (of
        ``family``, under ``engine``): the same on the same hardware or for the ideal roofline; on
        hardware of another family its family's under the same engine (``engine_efficiency``); on
        other hardware of the same family ``eff`` without the prefill hardware's kernel-layer
        description (the learned kernel layer describes one hardware: the pool's is priced by the
        family fractions)."""
        if self.system is None or eff.name == "ideal":
            return eff
        if self.family and self.family != family:
            return engine_efficiency(efficiency_for(self.family), engine, kv_group, family=self.family)
        return eff if eff.kernel is None else replace(eff, kernel=None)

    def take(self, pos: np.ndarray) -> "DecodePool":
        def part(a):
            return None if a is None else a[pos]
        return replace(self, kv_blocks=self.kv_blocks[pos], system=None if self.system is None else self.system.take(pos),
                       link_bandwidth=part(self.link_bandwidth), link_latency=part(self.link_latency),
                       cost_usd=part(self.cost_usd), system_tdp_w=part(self.system_tdp_w))


@dataclass(frozen=True)
class ServingInputs:
    """What continuous batching needs of a group's points (``dse.system.served.serving_inputs``);
    [P] arrays, one entry per point, unless said otherwise."""

    iteration: IterationModel     # one iteration's operators, affine in its token counts
    kv_blocks: np.ndarray         # paged KV blocks that fit in the memory left, blocks
    kv_block: np.ndarray          # tokens a KV block holds
    prefix_tokens: np.ndarray     # prompt tokens served from the prefix cache
    slo_ttft: np.ndarray          # TTFT objective, s (0: none)
    slo_tpot: np.ndarray          # TPOT objective, s (0: none)
    slo_percentile: np.ndarray    # the percentile the objectives hold at
    target_rate: np.ndarray       # requests/s a service must sustain (0: none)
    budget: np.ndarray            # tokens an iteration may hold (the chunk budget)
    chunked: np.ndarray           # bool: prompts are chunked into iterations
    max_running: np.ndarray       # sequences an iteration may run
    concurrency: np.ndarray       # closed-loop concurrency (NaN: an open loop)
    request_rate: np.ndarray      # open-loop arrival rate, requests/s (NaN: a closed loop)
    dispersion: np.ndarray        # open loop: the arrival gaps' squared coefficient of variation (1: Poisson)
    prompts: np.ndarray           # open loop: requests the run sends in all (0: an endless run)
    devices: np.ndarray           # devices of one engine (both pools when disaggregated)
    lengths: Lengths              # the request length classes (under speculation: in rounds of E tokens)
    length_spec: LengthSpec       # the length distribution requests are drawn from
    max_tokens: float             # the model's context, tokens (inf: none)
    pools: tuple | None = None    # disaggregated: (prefill instances [P], decode instances [P], KV bytes a token)
    speculation: ServedSpeculation | None = None
    stages: int = 1               # pipeline stages: as many micro-batch streams interleave through them
    ranks: int = 1                # attention data-parallel ranks of an expert-parallel group, in lock-step
    decode: DecodePool | None = None   # disaggregated: a decode pool of its own layout (None: the prefill's)
    state_blocks: np.ndarray | float = 0.0   # KV blocks a running sequence's recurrent state takes (hybrids)
    routed: Routed | None = None   # replicas behind a router and sessions (None: one engine, no sessions)
    tier: TierLoad | None = None  # the KV cache's second tier, prefix population and preemption (None: today's)
    scheduler: np.ndarray | None = None       # [P] the scheduling policy's code (``dse.core.scheduling``; None: FCFS)
    priority_share: np.ndarray | None = None  # [P] --scheduler priority: the high class's share of the requests
    slo_ttft_high: np.ndarray | None = None   # [P] --scheduler priority: the high class's TTFT SLO, s (0: slo_ttft)
    encoder: tuple | None = None  # E:P:D: (encoder instances [P], the encoder's OpArrays for one request,
    #                               bytes of one request's image embeddings) (None: no encoder pool)

    @property
    def plain(self) -> bool:
        """One engine whose per-point figures are all in this object's arrays: no disaggregated
        pools, no decode pool of its own, no router, no KV tier and no encoder pool."""
        return all(x is None for x in (self.pools, self.decode, self.routed, self.tier, self.encoder))

    @property
    def streams(self) -> int:
        """Batches the engine runs side by side, each with its own scheduler, running batch and
        share of the load: ``stages`` x ``ranks``."""
        return self.stages * self.ranks

    def take(self, pos: np.ndarray) -> ServingInputs:
        """The inputs of the points ``pos`` (positions in the group): every array field taken,
        the disaggregated pools' too."""
        pools = self.pools
        if pools is not None:
            prefill, decode, kv_token_bytes = pools
            pools = (prefill[pos], decode[pos], np.broadcast_to(kv_token_bytes, prefill.shape)[pos])
        encoder = None if self.encoder is None else (self.encoder[0][pos], *self.encoder[1:])
        return replace(self, pools=pools, encoder=encoder, decode=None if self.decode is None else self.decode.take(pos),
                       routed=None if self.routed is None else self.routed.take(pos),
                       tier=None if self.tier is None else self.tier.take(pos),
                       **{f.name: getattr(self, f.name)[pos] for f in fields(self)
                          if isinstance(getattr(self, f.name), np.ndarray)})


@dataclass(frozen=True, eq=False)
class Group:
    """Points of one workload on one hardware class, ready for the kernel (None tables and
    system: points that cannot be priced, their failure already recorded)."""

    index: np.ndarray             # positions of the points in the caller's order
    tables: WorkloadTables | None
    system: SystemArrays | None
    device_class: DeviceClass     # the hardware class (``hwmodels.classes``)
    cpu: CpuSplit | None = None   # CPU layer split
    serving: ServingInputs | None = None   # continuous batching
    family: str = ""              # the efficiency family (``dse.core.efficiency.family_of``)
    engine: Engine | None = None  # the serving-engine profile the points run
    kv_group: float = 1.0         # query heads per K/V head on one device (per-head K/V reads)
    spec: Speculation | None = None        # speculative decoding of a static batch

    def efficiency(self, given: Efficiency | None, ideal: bool) -> Efficiency:
        """The Efficiency of these points: IDEAL, the one given, or their family's default under
        their engine (``dse.core.engines.engine_efficiency``); on a dataflow class (spatial) the
        family's fractions with no engine costs and its layers' pipeline latency
        (``dse.core.dataflow.dataflow_efficiency``)."""
        if ideal or given is not None:
            return choose(self.family, given, ideal)
        if self.device_class.dataflow:
            return dataflow_efficiency(efficiency_for(self.family), decoder_layers(self.tables), self.family)
        return engine_efficiency(efficiency_for(self.family), self.engine, self.kv_group, family=self.family)


def positions(index) -> np.ndarray:
    """The positions a slice or an index array selects."""
    return np.arange(index.start, index.stop) if isinstance(index, slice) else np.asarray(index)


def subgroup(g: Group, idx: np.ndarray) -> Group:
    """The points ``idx`` (positions) of group ``g`` (a group of consecutive positions)."""
    return group_rows(g, idx - positions(g.index)[0])


def group_rows(g: Group, rows: np.ndarray) -> Group:
    """The points at ``rows`` of group ``g``'s own arrays (0 .. its size - 1), whatever positions it
    holds (consecutive or not)."""
    cpu = None if g.cpu is None else g.cpu.take(rows)
    serving = None if g.serving is None else g.serving.take(rows)
    t = g.tables.take(rows) if isinstance(g.tables, WorkloadBatch) else g.tables
    return Group(positions(g.index)[rows], t, g.system.take(rows), g.device_class, cpu, serving, g.family, g.engine,
                 g.kv_group)


def one_workload(g: Group, j: int) -> Group:
    """The j-th point of a group of many workloads (``WorkloadBatch``), as a group of its own."""
    at = np.array([j])
    return replace(g, index=positions(g.index)[at], tables=g.tables.one(j), system=g.system.take(at))


#: a workload shared by fewer design points than this is priced with the others that differ from it
#: only in batch and lengths (``many_workloads``), not one call per workload. A workload's own group
#: costs ~0.5-0.75 ms of Python however few its points, then ~0.2 us a point; priced with the others,
#: a point costs ~0.3 us where the workloads are each shared by 8 points or more (one operator table
#: per distinct workload, ``roofline.Stacked``), ~1.6 us where nearly every point is its own (tables of
#: [points, operators]). Measured crossover, Llama-2-70B on an H100 template: between 3,906 and 7,812
#: points a workload for 2.5 x 10^5 and 10^6 points (77 against 83 ms, 300-308 against 315-325 ms at
#: 3,906), about 4,096 for 65,536 (``benchmarks/bench_workloads.py --shared``: 23 against 21 ms); at
#: 1,953 points a workload the groups take 1.4-1.5x as long
MANY_BELOW = 4096


#: a group of points priced together (``together``) holding fewer workloads than this is priced one
#: workload at a time: pricing together costs ~6 ms a group however small (one block of tables,
#: priced at [points, operators]), a workload's own group ~0.6-0.75 ms, or ~3 ms when its tables are
#: built first. One workload of one point: 2.5 ms alone against 5.5 ms together (tables kept),
#: 5.7 against 9.3 ms (tables built); four new workloads of one point: 13.6 ms alone, 5.8 together
MANY_WORKLOADS = 2


def together(key: list, many: np.ndarray, workloads: tuple) -> tuple[np.ndarray, tuple]:
    """(the points priced together, the groups of all points (``group``)) when the points ``many``
    are grouped by the workload ``key`` without its batch, prompt and generated lengths
    (``key[1:4]``): a group of fewer than ``MANY_WORKLOADS`` workloads goes back to one group per
    workload. ``workloads``: the points grouped by the whole ``key`` (``group``'s answer): the
    groups are worked out on one point of each workload, and each point reads its workload's."""
    inv, order, starts = workloads
    if len(starts) - 1 < MANY_WORKLOADS:                   # too few workloads for any to be priced together
        return np.zeros(len(inv), dtype=bool), workloads
    first = order[starts[:-1]]                             # one point of each workload
    own = [k[first] if np.ndim(k) else k for k in key]     # each workload's key
    many = many[first]

    def grouped(together):
        return group([own[0], *(np.where(together, -1.0, k) for k in own[1:4]), *own[4:]], len(first))[0]
    joint = grouped(many)
    few = many & (np.bincount(joint, weights=many) < MANY_WORKLOADS)[joint]
    if few.any():
        many = many & ~few
        joint = grouped(many)
    return many[inv], groups_of(np.asarray(joint)[inv])


def many_workloads(shared: np.ndarray, w: WorkloadColumns, cpu_layers: np.ndarray) -> np.ndarray:
    """[n] bool: the points priced as one group with every point that differs from them only in
    batch, prompt and generated lengths (``dse.system.workload.WorkloadBatch``): static batches
    without speculative decoding or a CPU layer split, whose decode fills at most one limit (a
    sliding window, a sparse attention's top-k or a KV budget: each workload's decode then two
    affine pieces split at a step of its own, ``optable.decode_pieces``), and whose own workload has
    fewer than ``MANY_BELOW`` points (``shared``: [n], how many points share each point's workload; a
    workload shared by many points is cheaper priced once for them all)."""
    limits = per_code([len(set(decode_limits(m))) for m in w.models], w.model)
    budget = per_code([t.kv_budget > 0 for t in w.techniques], w.tech)
    draft = per_code([d is not None for d in w.drafts], w.draft)
    ok = ~w.continuous & ~draft & (cpu_layers == 0) & (limits + budget <= 1)
    return ok & (shared < MANY_BELOW)


#: the columns that decide which points share a workload (and so one kernel call)
_WORKLOAD_INPUTS = ("model", "batch", "prompt_len", "gen_len", "weights", "activations", "kv", "devices", "tp", "pp",
                    "ep", "cp", "flash_attention", "offload", "overlap", "sparse", "cpu_layers", "max_context", "hardware", "link",
                    "host_tier", "host_cpu", "onchip_buffer_bytes", "native_formats", "serving", "concurrency",
                    "request_rate", "prefill_chunk", "lengths", "engine", *TECHNIQUE_COLUMNS, "prune",
                    "spec_acceptance", "decode_tp", "decode_ep", "images", "image_size", "two_batch_overlap",
                    "decode_hardware", "pd_link", "encoder_devices")


#: the workload inputs across which points are priced together (``many_workloads``)
_BATCH_AND_LENGTHS = ("batch", "prompt_len", "gen_len")


def workload_order(cols: Columns) -> np.ndarray | None:
    """Positions that put points with the same workload inputs side by side (None: already so).
    Where no workload is shared by ``MANY_BELOW`` points, so that each is priced with the others
    differing from it only in batch and lengths, points are put side by side by the other inputs
    alone: points in any order of batch and lengths are then not moved (nor their results moved
    back when read)."""
    keys = {}
    for k in _WORKLOAD_INPUTS:
        if cols.has(k) and not cols.is_fixed(k):
            v = cols.given[k]
            keys[k] = (np.asarray(v.codes) if hasattr(v, "codes") else cols.labels(k)[0]
                       if np.asarray(v).dtype.kind in "OUSb" else np.asarray(v))
    if not keys:
        return None
    inv = group_codes(list(keys.values()), cols.n)          # sorted by only when needed
    if inv is not None and any(k in keys for k in _BATCH_AND_LENGTHS) and np.bincount(inv).max() < MANY_BELOW:
        inv = group_codes([v for k, v in keys.items() if k not in _BATCH_AND_LENGTHS], cols.n)
    if inv is None:
        return None
    order = groups_of(inv)[1]
    return None if np.all(order[1:] > order[:-1]) else order
