"""Feasibility and layout of design points: the parallel layout of disaggregated pools, the chip
count of capacity-sized classes (spatial), the largest batch that fits, and every check of a
workload's points (context, CPU layer split, placement in device and host memory less what the
serving engine keeps back, formats, links, on-chip buffer, serving) turned into reason codes (``dse.system.reasons``), numeric
memory violations and the group ready to price (``check_group``)."""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from basis.errors import DseError
from dse.core.engines import EngineMemory, chunked_prefill, reserve_bytes
from dse.core.roofline import _COL, OpArrays, SystemArrays
from dse.system.columns import Columns, group, per_code
from dse.system.grouping import CpuSplit, Group, Speculation, positions
from dse.system.hardware import HardwareArrays, assemble
from dse.system.inputs import WorkloadColumns
from dse.system.layout import chip_layouts, chips_required, largest_fitting
from dse.system.served import serving_inputs, speculative_serving
from dse.system.techniques import draft_model
from dse.system.workload import WorkloadBatch, WorkloadTables, footprint_in_batch, tables
from hwmodels.formats import matmul_compute_class
from hwmodels.placement import fits_within, place
from workloads import optable
from workloads.footprint import chunk_activation_bytes, state_bytes_per_sequence, step_activation_bytes
from workloads.head_padding import padded_model
from workloads.lengths import LengthSpec
from workloads.model import context_error, context_limit
from workloads.optable import kv_heads_per_device, residual_bytes_per_token


def padded_models(w: WorkloadColumns, hw: HardwareArrays, tp) -> WorkloadColumns:
    """``w`` with each point whose engine pads attention heads (``Engine.head_padding``, AWS Neuron)
    given its model padded for the cores its ``tp`` devices shard it over (tp x ``shard_cores``,
    ``workloads.head_padding``); ``w`` itself where no point's engine pads or nothing needs it."""
    pads = per_code([e.head_padding for e in w.engines], w.engine)
    if not np.any(pads):
        return w
    shards = np.where(pads, np.nan_to_num(np.asarray(tp, dtype=float), nan=1.0) * hw.shard_cores, 1.0)
    codes = np.array(np.broadcast_to(w.model, np.shape(pads)), dtype=np.int64)
    models = list(w.models)
    pairs, inv = np.unique(np.stack([codes, shards.astype(np.int64)], 1), axis=0, return_inverse=True)
    new = pairs[:, 0].copy()                    # each (model, cores): its model, or the padded one appended
    for k, (code, s) in enumerate(pairs):
        m = padded_model(models[code], int(s))
        if m is not models[code]:
            new[k] = len(models)
            models.append(m)
    if len(models) == len(w.models):
        return w
    return replace(w, model=new[inv.ravel()], models=models)


def pool_layout(w: WorkloadColumns, fail) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(devices, tp) to lay out each point with, and its devices in all: a disaggregated
    point lays out instances of ``tp x pp x ep`` devices (tp given, or the largest that divides
    both pools) and has the pools' devices; the points whose layout cannot be fail ``layout``."""
    dis = w.disaggregated
    own = ~(np.isnan(w.decode_tp) & np.isnan(w.decode_ep))
    fail("layout", np.flatnonzero(own & ~dis), "decode_tp and decode_ep lay out a decode pool: give disaggregate P:D")
    if w.decode_hardwares is not None:
        pooled = per_code([bool(h) for h in w.decode_hardwares], w.decode_hardware) | \
            per_code([k is not None for k in w.pd_links], w.pd_link)
        fail("layout", np.flatnonzero(pooled & ~dis), "decode_hardware and pd_link describe a decode pool: give "
                                                      "disaggregate P:D")
    fail("layout", np.flatnonzero(dis & (w.cp > 1)), "context parallelism (cp > 1) is modelled for one engine, "
                                                     "not for disaggregated pools")
    if not dis.any():                  # no pools: the layout is the one given
        return w.devices, w.tp, np.full(len(dis), np.nan)
    pre, dec = np.nan_to_num(w.prefill_devices, nan=1.0), np.nan_to_num(w.decode_devices, nan=1.0)
    enc = np.zeros(len(dis)) if w.encoder_devices is None else \
        np.broadcast_to(np.asarray(w.encoder_devices, dtype=float), np.shape(dis))
    total = pre + dec + enc                                      # an encoder pool's devices too (E:P:D)
    stages = np.nan_to_num(w.pp, nan=1.0)
    d_ep = np.where(np.isnan(w.decode_ep), w.ep, w.decode_ep)
    pre_units, dec_units = pre / (stages * w.ep), dec / (stages * d_ep)      # tp ranks' worth of devices
    whole = (pre_units == np.round(pre_units)) & (dec_units == np.round(dec_units)) & (pre_units >= 1) & (dec_units >= 1)
    common = np.where(whole, np.gcd(np.where(whole, pre_units, 1).astype(np.int64),
                                    np.where(whole, dec_units, 1).astype(np.int64)),
                      np.gcd(pre.astype(np.int64), dec.astype(np.int64)))
    inst = np.where(np.isnan(w.tp), common, w.tp)               # tp: given, or the largest both pools take
    wrong = dis & ~np.isnan(w.devices) & (w.devices != total)
    fail("layout", np.flatnonzero(wrong), "with disaggregate P:D, devices (if given) must be P + D (+ encoder_devices)")
    per = inst * stages * w.ep
    d_per = np.where(np.isnan(w.decode_tp), inst, w.decode_tp) * stages * d_ep
    split = dis & ((np.mod(pre, per) != 0) | (np.mod(dec, d_per) != 0) | (np.mod(enc, per) != 0))
    fail("layout", np.flatnonzero(split), "with disaggregate P:D, an engine's devices (tp x pp x ep) must divide "
                                          "P and D (the decode pool's: decode_tp x pp x decode_ep) and encoder_devices")
    return (np.where(dis, np.nan, w.devices), np.where(dis, inst, w.tp), np.where(dis, total, np.nan))


def _host_capacity(w: WorkloadColumns, hw: HardwareArrays, policy, cpu_layers, index) -> np.ndarray:
    """Bytes of host memory the points ``index`` may place data in: none without a host
    tier, except that CPU layers live in the CPU's own memory when the device names no host memory."""
    hcap = np.where(hw.has_host[index], hw.host_capacity[index], 0.0)
    if np.any(cpu_layers > 0):
        cpu_mem = np.array([c.memory.capacity_bytes for c in hw.cpus] + [0.0])[hw.host_cpu[index]]
        own = np.nan_to_num(hw.host_capacity[index], nan=0.0)
        hcap = np.where(cpu_layers > 0, np.where(own > 0, own, cpu_mem), hcap)
    return hcap


def _placement(policy, wb, ab, kvb, cap, devices, cpu_share=0.0, layer_w=0.0):
    """Placement of per-device footprints: the offload policy, or under a CPU layer split
    the CPU's layers' weights and KV cache in host memory (read there by the CPU itself)."""
    if cpu_share > 0:
        with np.errstate(divide="ignore", invalid="ignore"):
            fw = np.where(np.asarray(wb) > 0, layer_w * cpu_share / np.asarray(wb, dtype=float), 0.0)
        return place({"weights": fw, "kv": cpu_share}, wb, ab, kvb, cap, 1)
    return place(policy, wb, ab, kvb, cap, devices)


def engine_memory(w: WorkloadColumns, hw: HardwareArrays, i0: int) -> EngineMemory:
    """The memory rule of the engine serving point ``i0``: its profile's, except on a dataflow class
    (``hwmodels.classes.DeviceClass.dataflow``), which runs a compiled program and no serving
    engine: nothing kept back, whole prompts (a neutral ``EngineMemory``)."""
    return EngineMemory() if hw.dataflow[i0] else w.engines[w.engine[i0]].memory


def size_chips(w: WorkloadColumns, hw: HardwareArrays, sized: np.ndarray, tp, pp, chips, fail) -> None:
    """Chip count and (tp, pp) of the spatial points ``sized`` (in place)."""
    idx_all = np.flatnonzero(sized)
    key = [getattr(w, k)[idx_all] for k in ("model", "batch", "prompt", "gen", "weights", "activations", "kv", "ep",
                                   "flash", "tech", "engine")] + [w.buffer[idx_all]]
    inv, order, starts = group(key, len(idx_all))
    for g in range(len(starts) - 1):
        idx = idx_all[order[starts[g]:starts[g + 1]]]
        i0 = idx[0]
        model = w.models[w.model[i0]]
        args = (int(w.batch[i0]), int(w.prompt[i0]), int(w.gen[i0]),
                *(getattr(w, k + "_names")[getattr(w, k)[i0]] for k in ("weights", "activations", "kv")))
        flash, buf = bool(w.flash[i0]), float(w.buffer[i0])
        tech = w.techniques[w.tech[i0]]
        cap = hw.system.capacity[idx]
        memory_use = engine_memory(w, hw, i0)

        def held(t):                      # (bytes the tables ``t`` hold per chip, what the engine lets them use)
            act = static_activation_bytes(model, t, memory_use, buf)
            fp = t.footprint
            return fp.weights_bytes + fp.kv_cache_bytes + act, cap - reserve_bytes(memory_use, cap, fp.weights_bytes,
                                                                                   act)
        try:
            need = chips_required(*held(tables(model, *args, 1, 1, 1, flash, buf, tech)))
        except DseError as e:
            fail("model_split", idx, str(e))
            continue
        chips[idx] = need
        left = np.ones(len(idx), dtype=bool)
        for t_, p_ in chip_layouts(model):
            ok = left & (t_ * p_ >= need)
            if not ok.any():
                continue
            try:
                total, usable = held(tables(model, *args, t_, p_, int(w.ep[i0]), flash, buf, tech))
            except DseError:
                continue
            ok &= fits_within(total, usable)
            tp[idx[ok]], pp[idx[ok]] = t_, p_
            left &= ~ok
            if not left.any():
                break
        fail("no_chip_layout", idx[left])


def max_batch(w: WorkloadColumns, hw: HardwareArrays, tp, pp, batch, fail) -> None:
    """The largest batch that fits, for the points asking for it (in place); 1 (and
    'does not fit') where even one sequence does not."""
    idx_all = np.flatnonzero(w.batch_max)
    key = [getattr(w, k)[idx_all] for k in ("model", "prompt", "gen", "weights", "activations", "kv", "ep", "cp",
                                   "flash", "policy", "cpu_layers", "tech", "engine")] + [tp[idx_all], pp[idx_all],
                                                               w.buffer[idx_all]]
    inv, order, starts = group(key, len(idx_all))
    for g in range(len(starts) - 1):
        idx = idx_all[order[starts[g]:starts[g + 1]]]
        i0 = idx[0]
        model = w.models[w.model[i0]]
        t_, p_, e_ = int(tp[i0]), int(pp[i0]), int(w.ep[i0])
        flash, buf = bool(w.flash[i0]), float(w.buffer[i0])
        names = [getattr(w, k + "_names")[getattr(w, k)[i0]] for k in ("weights", "activations", "kv")]
        tech = w.techniques[w.tech[i0]]
        try:
            c_ = int(w.cp[i0])
            fib = footprint_in_batch(model, int(w.prompt[i0]), int(w.gen[i0]), *names, t_, p_, e_, flash, buf,
                                     tech, c_)
            one = tables(model, 1, int(w.prompt[i0]), int(w.gen[i0]), *names, t_, p_, e_, flash, buf, tech, c_)
        except DseError:
            continue                  # the layout does not divide the model: reported by the group check
        layer_w, sc1 = one.layer_weight_bytes, one.scenario
        policy = w.policies[w.policy[i0]]
        share = w.cpu_layers[i0] / model.num_layers
        cap = hw.system.capacity[idx]
        hcap = _host_capacity(w, hw, policy, w.cpu_layers[idx], idx)
        memory_use = engine_memory(w, hw, i0)

        def fits(b):
            b = np.broadcast_to(b, cap.shape)
            wb, kvb, ab = fib.at(b)
            if memory_use.prefill_chunk:
                many = replace(sc1, batch=b.astype(np.int64), prompt_len=np.full(b.shape, sc1.prompt_len),
                               gen_len=np.full(b.shape, sc1.gen_len))
                ab = chunked_activation_bytes(model, many, memory_use, ab, buf)
            usable = cap - reserve_bytes(memory_use, cap, wb, ab)
            pl = _placement(policy, wb, ab, kvb, usable, t_ * p_ * e_, share, layer_w)
            return pl.device_fits(usable) & pl.host_fits(hcap)

        best = largest_fitting(fits)
        batch[idx] = np.maximum(best, 1.0)


@dataclass(frozen=True)
class GroupMemory:
    """What a group's points hold per device and how far they are from fitting: bytes of
    weights, KV cache (under continuous batching the requests' own, ``requests_kv_bytes``) and
    activations (numbers, or [P] arrays), bytes placed in host memory ([P]), the memory violation
    ([P], <= 0 where everything fits in device memory less the engine's reserve,
    ``Placement.memory_violation``), the bytes the serving engine keeps back (``reserve_bytes``)
    and, under continuous batching, the paged KV pool (NaN elsewhere)."""

    weights_bytes: object
    kv_cache_bytes: object
    activation_bytes: object
    offloaded_bytes: np.ndarray
    violation: np.ndarray
    reserve_bytes: object = 0.0
    kv_pool_bytes: object = np.nan
    kv_request_bytes: object = np.nan    # an open loop's: KV bytes one request holds at its full length
    state_bytes: object = 0.0            # recurrent layers' state of the sequences held (hybrid models)


def check_group(idx, t: WorkloadTables, model, w: WorkloadColumns, hw: HardwareArrays, i0: int, fail,
                spec: Speculation | None = None) -> tuple[Group, GroupMemory]:
    """Placement and every feasibility check of one workload's points (each failure handed to
    ``fail``): (the group ready to price, what its points hold in memory). ``spec``: its
    speculative decoding (``speculation``)."""
    sc = t.scenario
    fp = t.footprint if spec is None else spec.footprint
    sys = hw.system.take(idx)
    size = sys.size
    policy = w.policies[w.policy[i0]]
    cpu_layers = int(w.cpu_layers[i0])
    mark = _marker(fail, idx, size)
    _check_context(mark, model, sc, int(w.max_context[i0]), size)
    share = _cpu_share(mark, model, sc, policy, hw, i0, cpu_layers, size)
    cap = sys.capacity
    # host memory: read only where something may go there (an offload policy, CPU layers)
    hcap = _host_capacity(w, hw, policy, np.full(size, float(cpu_layers if share else 0)), idx) \
        if policy != "none" or share else 0.0
    continuous = bool(w.continuous[i0])
    memory_use = engine_memory(w, hw, i0)
    buffer = float(w.buffer[i0])
    act = fp.activation_bytes
    if continuous:
        _check_serving(mark, sc, policy, cpu_layers, spec, bool(w.disaggregated[i0]), sys, size)
        length_spec: LengthSpec = w.length_specs[w.lengths[i0]]
        limit = context_limit(model, int(w.max_context[i0])) or np.inf
        lengths = length_spec.classes(sc.prompt_len, sc.gen_len, limit)
        act = _chunk_activation_bytes(model, sc, w, hw, i0, int(np.ceil(lengths.prompt.max())),
                                      memory_use.profiles_chunk)
    elif spec is None:
        act = static_activation_bytes(model, t, memory_use, buffer)
    reserve = reserve_bytes(memory_use, cap, fp.weights_bytes, act)
    cap = cap - reserve                        # what the engine lets the model use
    pl = _placement(policy, fp.weights_bytes, act, fp.kv_cache_bytes + fp.state_bytes, cap, sc.devices, share,
                    t.layer_weight_bytes)
    dev_ok = _check_memory(mark, pl, cap, hcap, hw.has_host[idx], share)
    wanted = sorted({matmul_compute_class(sc.activations, sc.weights), matmul_compute_class(sc.activations, sc.kv)})
    sys = _check_device(mark, sys, sc, wanted, w, hw, idx, i0, pl, share, policy)
    cpu = _cpu_split(mark, model, t, wanted, hw, idx, i0, share) if share else None
    serving = None
    kv, pool, per_request, state = fp.kv_cache_bytes, np.nan, np.nan, fp.state_bytes
    if continuous:
        try:
            serving, pool = serving_inputs(model, sc, w, hw, idx, i0, cap, fp, act, lengths, length_spec, limit)
        except DseError as e:          # a decode pool of its own layout that does not divide the model
            mark("model_split", np.ones(size, dtype=bool), f"the decode pool: {e}")
            serving, pool = serving_inputs(model, sc, w, hw, idx, i0, cap, fp, act, lengths, length_spec, limit,
                                           own_decode=False)
        kv, per_request = requests_kv_bytes(serving, pool)
        state = running_state_bytes(serving, state_bytes_per_sequence(model, sc))
        kv = np.minimum(kv, pool - state)                  # the states' blocks are the pool's
        if spec is not None and spec.tables is not None:
            serving = speculative_serving(serving, spec, sc, hw, i0)
        need = np.ceil((sc.prompt_len + sc.gen_len) / serving.kv_block) + serving.state_blocks
        mark("device_memory", dev_ok & (serving.kv_blocks < need),
             "the paged KV cache holds less than one request: the memory left after weights and activations "
             "makes fewer KV blocks (kv_block tokens each) than prompt_len + gen_len need")
        if serving.decode is not None:
            mark("device_memory", serving.decode.kv_blocks < need,
                 "the decode pool's paged KV cache holds less than one request at its own layout (decode_tp, "
                 "decode_ep): the memory left after its weights and activations makes too few KV blocks")
            _check_decode_hardware(mark, serving.decode, wanted, sc)
    memory = GroupMemory(fp.weights_bytes, kv, act, pl.host_bytes, pl.memory_violation(cap, hcap), reserve, pool,
                         per_request, state)
    kv_group = 1.0 if model.is_mla else (model.num_heads / sc.tp) / kv_heads_per_device(model, sc.tp)
    return Group(idx, t, sys, hw.kind(i0), cpu, serving, hw.families[hw.family[i0]],
                 w.engines[w.engine[i0]], float(kv_group), spec), memory


def _check_decode_hardware(mark, d, wanted: list, sc) -> None:
    """Mark the points whose decode pool on hardware of its own (``decode_hardware``) cannot compute the
    formats ``wanted`` (``format``) or has no scale-up link for an engine of several devices, and
    those whose KV cache has no known link to cross between the pools (``interconnect``)."""
    if d.link_bandwidth is not None:
        mark("interconnect", ~(d.link_bandwidth > 0), "the link between the prefill and decode pools: a pool's "
             "hardware cites no scale-out NIC (configs/topologies.yaml); give pd_link (--pd-link, see 'list links')")
    if d.system is None:
        return
    for c in wanted:
        mark("format", ~(d.system.peak[:, _COL[c]] > 0), None)
    if d.tp * d.ep * sc.pp > 1:
        mark("interconnect", ~(np.isfinite(d.system.link_bandwidth) & (d.system.link_bandwidth > 0)),
             "the decode pool's hardware has no scale-up link for an engine of several devices (decode_tp x pp x "
             "decode_ep > 1)")


def _marker(fail, idx, size: int):
    """``mark(code, bad, detail=None)``: the points ``bad`` ([P] bool over the group ``idx``, or
    one bool for all) fail the check ``code`` (handed to ``fail``)."""
    def mark(code, bad, detail=None):
        if bad.any() if isinstance(bad, np.ndarray) else bad:
            bad = np.broadcast_to(bad, (size,))
            fail(code, (idx, bad) if isinstance(idx, slice) and detail is None else positions(idx)[bad], detail)
    return mark


def _check_context(mark, model, sc, max_context: int, size: int) -> None:
    """Mark the points whose prompt and output exceed the model's context (``context``)."""
    if sc.many:
        _mark_context(mark, model, sc, max_context)
        return
    too_long = context_error(model, sc.prompt_len, sc.gen_len, max_context)
    if too_long:
        mark("context", np.ones(size, dtype=bool), too_long)


def _cpu_share(mark, model, sc, policy, hw: HardwareArrays, i0: int, cpu_layers: int, size: int) -> float:
    """The fraction of the layers that run on the host CPU: ``cpu_layers`` over the model's, or 0
    where the split cannot be (marked ``cpu_split`` with the reason)."""
    if not cpu_layers:
        return 0.0
    why = None
    if cpu_layers > model.num_layers:
        why = f"cpu_layers must be between 1 and the model's {model.num_layers} layers, got {cpu_layers}"
    elif policy != "none" or sc.devices > 1:
        why = "cpu_layers works on one device without offload"
    elif hw.host_cpu[i0] < 0:
        why = (f"cpu_layers needs a host CPU: hardware '{hw.names[hw.name[i0]]}' names no host_cpu; "
               f"give host_cpu (a cpu preset)")
    if why:
        mark("cpu_split", np.ones(size, dtype=bool), why)
        return 0.0
    return cpu_layers / model.num_layers


def _check_serving(mark, sc, policy, cpu_layers: int, spec: Speculation | None, disaggregated: bool,
                   sys: SystemArrays, size: int) -> None:
    """Mark what continuous batching does not model (``serving``) and disaggregated pools without
    a link to send the KV cache over (``interconnect``)."""
    if policy != "none" or cpu_layers:
        mark("serving", np.ones(size, dtype=bool))
    if spec is not None and (spec.heads is not None or disaggregated):
        mark("serving", np.ones(size, dtype=bool), "speculative decoding under continuous batching is modelled "
                                                   "with a draft model, self:N, mtp:N or eagle on one pool (not Medusa heads, "
                                                   "not disaggregated)")
    if disaggregated:                    # the KV cache moves between the pools over the link
        mark("interconnect", ~(np.isfinite(sys.link_bandwidth) & (sys.link_bandwidth > 0)))


def _check_memory(mark, pl, cap, hcap, has_host: np.ndarray, share: float) -> np.ndarray:
    """Mark the points whose placement ``pl`` does not fit (``no_host_tier``, ``device_memory``,
    ``host_memory``); [P] bool: the footprint fits in device memory."""
    dev_ok, host_ok = pl.device_fits(cap), pl.host_fits(hcap)
    no_host = (pl.host_bytes > 0) & ~has_host & (share == 0)
    mark("no_host_tier", no_host)
    mark("device_memory", ~dev_ok)
    mark("host_memory", dev_ok & ~host_ok & ~no_host)
    return dev_ok


def _check_device(mark, sys: SystemArrays, sc, wanted: list, w: WorkloadColumns, hw: HardwareArrays, idx, i0: int,
                  pl, share: float, policy) -> SystemArrays:
    """Mark the points whose device cannot compute the formats ``wanted`` (``format``), has no link
    for several devices (``interconnect``) or no buffer for FlashAttention (``onchip_buffer``);
    the points' SystemArrays as priced (sparse gain, tp, offloaded fractions, overlap)."""
    for c in wanted:
        mark("format", ~(sys.peak[:, _COL[c]] > 0), None)
    if w.sparse[i0]:                      # 2:4 weights at the sparse peak where there is one, else dense
        sys = sys.replaced(sparse_gain=hw.sparse_ratio(idx))
    if sc.devices > 1:
        mark("interconnect", ~(np.isfinite(sys.link_bandwidth) & (sys.link_bandwidth > 0)))
    if sc.flash_attention:
        mark("onchip_buffer", ~(hw.buffer[idx] > 0))
    size = sys.size
    offload = None
    if share == 0 and policy != "none" and (pl.fractions > 0).any():
        offload = np.ascontiguousarray(np.broadcast_to(pl.fractions, (size, 3)))
    return sys.replaced(tp=np.full(size, float(sc.tp)), offload=offload, overlap=w.overlap[idx].copy(),
                        ep=np.full(size, float(sc.ep)), cp=np.full(size, float(sc.cp)),
                        two_batch_overlap=w.two_batch_overlap[idx].copy())


def _cpu_split(mark, model, t: WorkloadTables, wanted: list, hw: HardwareArrays, idx, i0: int, share: float) -> CpuSplit:
    """The CPU layer split of the points (``share`` of the layers on the host CPU); marks a CPU
    that cannot compute the formats (``format``) and a device without a host link (``cpu_split``)."""
    sc = t.scenario
    size = len(positions(idx))
    cpu_hw = assemble(Columns({"hardware": hw.cpus[hw.host_cpu[i0]], "model": ""}))
    cpu_sys, cpu_used = cpu_hw.system.take(np.zeros(size, dtype=np.int64)), cpu_hw.used(0)
    for c in wanted:
        mark("format", ~(cpu_sys.peak[:, _COL[c]] > 0))
    per_token = residual_bytes_per_token(model, sc.activations)
    cpu = CpuSplit(share, cpu_sys, cpu_used, t.prefill_table.tokens * per_token, t.decode_table.tokens * per_token,
                   hw.host_link_bandwidth[idx], hw.host_link_latency[idx], hw.system.host_fraction[idx])
    no_link = ~(np.isfinite(cpu.host_bw) & (cpu.host_bw > 0))
    mark("cpu_split", no_link, f"hardware '{hw.names[hw.name[i0]]}' names no host_link for a CPU layer split")
    return cpu


#: distinct prompt and generated lengths of a group of many workloads that exceed the context
#: beyond which the reason's text is the template's, not the check's own words
CONTEXT_DETAILS = 64


def _mark_context(mark, model, sc, max_context: int) -> None:
    """Mark the workloads of a scenario of many (``Scenario.many``) longer than the context, each
    with the check's words (``context_error``) while there are few distinct lengths among them."""
    limit = context_limit(model, max_context)
    if not limit:
        return
    long = sc.prompt_len + sc.gen_len > limit
    prompt, gen = sc.prompt_len[long].astype(np.int64), sc.gen_len[long].astype(np.int64)
    span = int(gen.max(initial=0)) + 1
    pairs = np.unique(prompt * span + gen)              # (prompt, generated) pairs, one integer each
    if len(pairs) > CONTEXT_DETAILS:
        mark("context", long)
        return
    for p, g in zip(pairs // span, pairs % span):
        mark("context", long & (sc.prompt_len == p) & (sc.gen_len == g), context_error(model, int(p), int(g), max_context))


def speculation(t: WorkloadTables, model, w: WorkloadColumns, i0: int, buffer: float) -> Speculation | None:
    """The speculative decoding of a group (None without): the draft's tables (a model of its own
    at tp 1, or the target's first layers at the target's layout), the drafted tokens and
    acceptance rate, the draft's tensor parallelism, and the footprint of target and draft together
    on the device holding both (a shared draft adds nothing)."""
    draft = w.drafts[w.draft[i0]]
    if draft is None:
        return None
    sc = t.scenario
    acceptance = float(w.spec_acceptance[i0])
    fp = t.footprint
    if draft.heads:                          # Medusa: the heads draft in one pass on the target's devices
        heads = optable.medusa_heads(model, replace(sc, batch=sc.micro_batch), draft.heads)
        fp = replace(fp, weights_bytes=fp.weights_bytes + float(np.sum(heads.weight_bytes * heads.counts)))
        return Speculation(acceptance, draft.heads, float(sc.tp), fp, heads=OpArrays.from_table(heads))
    if draft.kind:                           # MTP / EAGLE: a head of the target's shape on its devices
        return _native_head(draft, t, model, w, i0, buffer)
    own = not draft.shares_target
    layout = (1, 1, 1) if own else (sc.tp, sc.pp, sc.ep)
    dm = draft_model(draft, model)
    dt = tables(dm, sc.batch, sc.prompt_len, sc.gen_len, sc.weights.name, sc.activations.name,
                sc.kv.name, *layout, sc.flash_attention, buffer)
    if own:
        fp = replace(fp, weights_bytes=fp.weights_bytes + dt.footprint.weights_bytes,
                     kv_cache_bytes=fp.kv_cache_bytes + dt.footprint.kv_cache_bytes,
                     activation_bytes=max(fp.activation_bytes, dt.footprint.activation_bytes))
    return Speculation(acceptance, int(w.spec_tokens[i0]), float(layout[0]), fp, tables=dt, model=dm)


def _native_head(draft, t: WorkloadTables, model, w: WorkloadColumns, i0: int, buffer: float) -> Speculation:
    """The Speculation of a native draft head (``workloads.model.draft_head_model``): one pass of the
    head per drafted token (mtp:N: N, eagle: spec_tokens), priced as a one-layer draft model at the
    target's tensor (and, for an MoE head, expert) parallelism, prefilling the prompt too; its
    weights (mtp: each distinct module, at most the model's ``num_nextn_predict_layers``) and its
    KV cache beside the target's. Acceptance: the draft's by depth where given, else spec_acceptance."""
    sc = t.scenario
    dm = draft_model(draft, model)
    drafted = draft.depth or int(w.spec_tokens[i0])
    if draft.by_depth and len(draft.by_depth) < drafted:
        raise DseError(f"spec_draft: {draft.name} gives {len(draft.by_depth)} acceptance rates by depth for "
                       f"{drafted} drafted tokens (spec_tokens); give one a drafted token")
    layout = (sc.tp, 1, sc.ep if dm.is_moe else 1)
    dt = tables(dm, sc.batch, sc.prompt_len, sc.gen_len, sc.weights.name, sc.activations.name,
                sc.kv.name, *layout, sc.flash_attention, buffer)
    modules = min(draft.depth, model.mtp_layers) if draft.kind == "mtp" else 1
    fp = t.footprint
    fp = replace(fp, weights_bytes=fp.weights_bytes + modules * dt.footprint.weights_bytes,
                 kv_cache_bytes=fp.kv_cache_bytes + modules * dt.footprint.kv_cache_bytes,
                 activation_bytes=max(fp.activation_bytes, dt.footprint.activation_bytes))
    acceptance = draft.by_depth or float(w.spec_acceptance[i0])
    return Speculation(acceptance, drafted, float(sc.tp), fp, tables=dt, model=dm)


def _chunk_activation_bytes(model, sc, w: WorkloadColumns, hw: HardwareArrays, i0: int, longest: int,
                            profiled: bool = False) -> float:
    """Peak activation bytes per device of continuous batching: a prefill of one iteration's
    prompt tokens (the chunk budget, or the ``longest`` prompt without chunking; the whole budget
    where the engine reserves it at start-up, ``profiled``), its queries attending up to the
    ``longest`` prompt (``chunk_activation_bytes``), or one decode step."""
    budget = int(w.prefill_chunk[i0])
    tokens = longest if budget == 0 else budget if profiled else min(longest, budget)
    buffer = float(w.buffer[i0])
    one = tables(model, 1, tokens, sc.gen_len, sc.weights.name, sc.activations.name, sc.kv.name, sc.tp, sc.pp,
                 sc.ep, sc.flash_attention, buffer, sc.techniques, sc.cp)
    return float(max(chunk_activation_bytes(model, one.scenario, tokens, buffer, keys=max(longest, tokens)),
                     step_activation_bytes(model, one.decode_table)))


def static_activation_bytes(model, t, memory: EngineMemory, buffer: float):
    """Peak activation bytes per device of the static batch(es) of ``t`` (WorkloadTables, or a
    WorkloadBatch: [P], worked out once per distinct workload) under the engine's ``memory``
    (``chunked_activation_bytes``); the footprint's where the engine prefills whole prompts."""
    whole = t.footprint.activation_bytes
    if not isinstance(t, WorkloadBatch):
        return chunked_activation_bytes(model, t.scenario, memory, whole, buffer)
    parts = _chunked(model, t.distinct, memory, buffer)
    if parts is None:
        return whole
    chunked, act, floor = parts
    at = t.workload
    return np.where(chunked[at], act[at] if np.ndim(act) else act, np.maximum(whole, floor))


def chunked_activation_bytes(model, sc, memory: EngineMemory, whole, buffer: float):
    """Peak activation bytes per device of static batches ``sc`` (one, or a scenario of many:
    [P]) under an engine that prefills in chunks (``memory.prefill_chunk``): where a micro-batch's
    prompt tokens exceed the chunk, one chunk's live set, its queries attending the whole prompt
    (``chunk_activation_bytes``), or a decode step of the micro-batch, the larger; elsewhere (and
    under an engine that does not chunk) the whole prefill's, ``whole`` (as the footprint has it),
    but at least a whole chunk's where the engine reserves one at start-up (``profiles_chunk``)."""
    parts = _chunked(model, sc, memory, buffer)
    if parts is None:
        return whole
    chunked, act, floor = parts
    act = np.where(chunked, act, np.maximum(whole, floor))
    return float(act) if np.ndim(act) == 0 else act


def _chunked(model, sc, memory: EngineMemory, buffer: float):
    """(where ``sc``'s prefill is chunked, the chunked live set there, the live set the engine
    reserves anyway: a whole chunk's where it profiles one, else 0), or None where the engine
    neither chunks ``sc`` nor reserves a chunk (``chunked_activation_bytes``)."""
    chunked = chunked_prefill(memory, sc.micro_batch * sc.prompt_len)
    profiled = memory.profiles_chunk and memory.prefill_chunk > 0
    if not np.any(chunked) and not profiled:
        return None
    floor = chunk_activation_bytes(model, sc, memory.prefill_chunk, buffer) if profiled else 0.0
    if not np.any(chunked):
        return chunked, floor, floor
    decode = step_activation_bytes(model, optable.decode_step(model, replace(sc, batch=sc.micro_batch), sc.prompt_len,
                                                              buffer))
    return chunked, np.maximum(chunk_activation_bytes(model, sc, memory.prefill_chunk, buffer, keys=sc.prompt_len),
                               decode), floor


def requests_kv_bytes(serving, pool):
    """(KV-cache bytes per device the requests of continuous batching hold, [P]; an open loop's
    bytes per request, [P], NaN for a closed loop): a closed loop's requests running at once (its
    concurrency, at most max_running) times the pages each holds at its full length,
    ceil((prompt + gen) / kv_block) averaged over the length classes, at most the whole paged pool
    ``pool`` (bytes, ``kv_blocks`` pages); an open loop's at its ceiling (max_running), until the
    steady state's running batch replaces it (``open_loop_kv_bytes``). Under pipeline or expert
    parallelism each of the engine's streams (``ServingInputs.streams``) holds its share of the
    concurrency in its own ``kv_blocks``, and a stage's device holds the pages of all its stages'
    streams."""
    lengths, block = serving.lengths, serving.kv_block
    pages = np.ceil((lengths.prompt + lengths.gen)[None, :] / np.asarray(block, dtype=float)[..., None]) @ lengths.weight
    running = np.fmin(serving.concurrency / serving.streams, serving.max_running)   # NaN (open loop): max_running
    held = np.minimum(running * pages, serving.kv_blocks) * serving.stages
    with np.errstate(invalid="ignore", divide="ignore"):
        page_bytes = np.where(serving.kv_blocks > 0, pool / (serving.kv_blocks * serving.stages), 0.0)
    # an open loop's request lives on one attention rank: per device, 1 / ranks of its pages
    return held * page_bytes, np.where(np.isnan(serving.concurrency), pages * page_bytes / serving.ranks, np.nan)


def running_state_bytes(serving, state: float):
    """Bytes per device the recurrent state of a hybrid model's running sequences takes, [P] (0
    without recurrent layers): ``state`` bytes a sequence per device, for a closed loop's requests
    running at once (its concurrency per stream, at most max_running), an open loop's ceiling
    (max_running), each at most what the pool holds at its full length and its state's blocks; a
    stage's device holds its stages' streams'. The state is in these blocks of the pool
    (``kv_pool_bytes``), not beside it."""
    if not state:
        return np.zeros(np.shape(serving.kv_blocks))
    lengths, block = serving.lengths, serving.kv_block
    pages = np.ceil((lengths.prompt + lengths.gen)[None, :] / np.asarray(block, dtype=float)[..., None]) @ lengths.weight
    running = np.fmin(serving.concurrency / serving.streams, serving.max_running)
    fit = np.floor(serving.kv_blocks / (pages + serving.state_blocks))
    return np.minimum(running, fit) * serving.stages * state


def open_loop_kv_bytes(running, per_request, pool, weights_activations):
    """(KV-cache bytes per device an open loop's requests hold, the memory they and the weights and
    activations take) where ``per_request`` is known (NaN elsewhere: left as they are): the
    steady state's mean running batch ``running`` times the bytes one request holds at its full
    length, at most the paged ``pool``."""
    kv = np.minimum(running * per_request, pool)
    return kv, weights_activations + kv