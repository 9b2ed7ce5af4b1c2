"""Evaluate arrays of design points: hardware template x workload -> metrics.

Points come as columns (one array per parameter of ``dse.explore.space.PARAMS``; a missing
workload parameter takes its default). Hardware columns start from the base preset
named in ``hardware`` and override its figures. Points that share a workload (and
base preset) are evaluated together by the vectorized kernel (``dse.core.roofline``), so
the only Python loop is over distinct workloads, never over points.

Returns one array per metric (SI units), ``feasible`` and ``reason`` (why a point is
infeasible: it does not fit, it cannot compute a format, its layout does not divide the
model, it has no interconnect).
"""
from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

import numpy as np

from dse.core.efficiency import Efficiency, choose
from basis.errors import DseError
from dse.core.metrics import serving_metrics
from dse.core.roofline import (_COL, PIM_ROLES, OpArrays, SystemArrays, decode_total_time, step_time,
                          widen_peaks)
from dse.explore.space import DEFAULTS, PARAMS
from hwmodels.formats import COMPUTE_CLASSES, matmul_compute_class
from hwmodels.placement import fits_within, greedy_fractions
from hwmodels.presets import load_device
from workloads import optable
from workloads.footprint import footprint
from workloads.model import load_model
from workloads.scenario import Scenario

METRICS = ("ttft_s", "tpot_s", "e2e_latency_s", "output_tokens_per_s", "output_tokens_per_s_per_user",
           "output_tokens_per_s_per_device", "prefill_tokens_per_s", "weights_bytes", "kv_cache_bytes",
           "activation_bytes", "memory_bytes", "offloaded_bytes", "devices", "power_w", "cost_usd")

#: workload columns that shape the operator tables
_WORKLOAD_KEY = ("model", "batch", "prompt_len", "gen_len", "weights", "activations", "kv", "tp", "pp", "ep",
                 "flash_attention", "offload", "sparse", "devices")


def _raw(cols: dict, name: str):
    """A column as given (scalar, array or pandas Categorical), or its default."""
    return cols.get(name, DEFAULTS.get(name))


def _array(cols: dict, name: str, n: int) -> np.ndarray:
    """A numeric column as a float array of length ``n`` (NaN if absent without default)."""
    v = _raw(cols, name)
    if v is None:
        return np.full(n, np.nan)
    a = np.asarray(v, dtype=float)
    return np.full(n, float(a)) if a.ndim == 0 else a


def _codes(v, n: int) -> tuple[np.ndarray, list]:
    """(code per point, distinct values) of a column of names."""
    if np.ndim(v) == 0 and not hasattr(v, "codes"):
        return np.zeros(n, dtype=np.int64), [v]
    if hasattr(v, "codes"):
        return np.asarray(v.codes, dtype=np.int64), list(v.categories)
    import pandas as pd
    inv, uniq = pd.factorize(np.asarray(v))
    return inv, list(uniq)


def _at(v, i: int):
    """Value of a column at point ``i``."""
    return v if np.ndim(v) == 0 and not hasattr(v, "codes") else v[i]


def hardware_arrays(cols: dict, n: int):
    """(SystemArrays at tp=1 without offload, base device per point, per-point extras) of
    the hardware columns: the base presets with every override applied."""
    inv, uniq = _codes(_raw(cols, "hardware"), n)
    devices = [load_device(str(u)) for u in uniq]
    raw = np.array([[d.peak_ops_per_s.get(c, 0.0) for c in COMPUTE_CLASSES] for d in devices])[inv]
    for j, c in enumerate(COMPUTE_CLASSES):
        if f"peak_{c}" in cols:
            raw[:, j] = _array(cols, f"peak_{c}", n)
    if "native_formats" in cols:
        nat_inv, nat = _codes(cols["native_formats"], n)
        allowed = np.array([[c in {f.strip() for f in str(v).split(",")} for c in COMPUTE_CLASSES] for v in nat])
        raw = np.where(allowed[nat_inv], raw, 0.0)
    scale = _array(cols, "compute_scale", n) if "compute_scale" in cols else 1.0
    vector = np.array([d.vector_ops_per_s for d in devices])[inv]
    if "vector_ops_per_s" in cols:
        vector = _array(cols, "vector_ops_per_s", n)
    peak = widen_peaks(raw * np.reshape(scale, (-1, 1)) if np.ndim(scale) else raw, vector * scale)

    def field(key, per_device, default=np.nan):
        if key in cols:
            return _array(cols, key, n)
        return np.array([per_device(d) if per_device(d) is not None else default for d in devices], float)[inv]

    bw = field("memory_bandwidth", lambda d: d.memory.bandwidth_bytes_per_s)
    cap = field("memory_capacity", lambda d: d.memory.capacity_bytes)
    link_bw = field("link_bandwidth", lambda d: d.interconnect.bandwidth_bytes_per_s if d.interconnect else None)
    link_lat = field("link_latency", lambda d: d.interconnect.latency_s if d.interconnect else None, 0.0)
    hl = field("host_link_bandwidth", lambda d: d.host_link.bandwidth_bytes_per_s if d.host_link else None)
    hm = field("host_memory_bandwidth", lambda d: d.host_memory.bandwidth_bytes_per_s if d.host_memory else None,
               np.inf)
    extras = {
        "host_capacity": field("host_memory_capacity", lambda d: d.host_memory.capacity_bytes if d.host_memory
                               else None),
        "buffer": field("onchip_buffer_bytes", lambda d: d.onchip_buffer_bytes),
        "tdp_w": field("tdp_w", lambda d: d.tdp_w),
        "price_usd": field("price_usd", lambda d: d.price_usd),
    }
    pim_kw = {}
    if any(d.pim for d in devices) or "pim_multiple" in cols or "pim_peak" in cols:
        pim = np.zeros((len(devices), len(peak[0])))
        for i, d in enumerate(devices):
            if d.pim:
                for c in COMPUTE_CLASSES:
                    pim[i, _COL[c]] = d.pim.peak_for(c)
        pim = pim[inv]
        if "pim_peak" in cols:
            p = _array(cols, "pim_peak", n)[:, None]
            pim = np.where(pim > 0, p, 0.0) if any(d.pim for d in devices) else np.where(peak > 0, p, 0.0)
        roles = np.array([[bool(d.pim) and r in d.pim.operators for r in PIM_ROLES] for d in devices])[inv]
        if not any(d.pim for d in devices):
            roles[:] = True
        pim_kw = dict(pim_peak=pim, pim_multiple=field("pim_multiple", lambda d: d.pim.internal_bandwidth_multiple
                                                       if d.pim else None, 1.0),
                      pim_roles=roles,
                      pim_concurrent=np.array([bool(d.pim and d.pim.concurrent) for d in devices])[inv])
    sys = SystemArrays(peak, bw, cap, link_bw, link_lat, np.ones(n), np.minimum(hl, hm), None, None, None, **pim_kw)
    return sys, devices, inv, extras


@lru_cache(maxsize=4096)
def _tables(model_name, batch, prompt_len, gen_len, weights, activations, kv, tp, pp, ep, flash, buffer):
    """Operator arrays of one workload: (prefill, decode first step, decode slope, footprint, scenario)."""
    m = load_model(model_name)
    sc = Scenario.make(batch=int(batch), prompt_len=int(prompt_len), gen_len=int(gen_len), weights=weights,
                       activations=activations, kv=kv, tp=int(tp), pp=int(pp), ep=int(ep), flash_attention=bool(flash))
    micro = replace(sc, batch=sc.micro_batch)
    pre = optable.prefill(m, micro, buffer)
    dec = optable.decode_step(m, micro, sc.prompt_len, buffer)
    d0, slope = optable.decode_linear(m, micro, sc.prompt_len + 1, buffer)
    fp = footprint(m, sc, pre, dec)
    return OpArrays.from_table(pre), OpArrays.from_table(d0), OpArrays.from_table(slope), fp, sc


def _group(keys: list, n: int):
    """(group of each point, first point of each group, point order sorted by group, group starts)."""
    import pandas as pd
    codes = np.zeros(n, dtype=np.int64)
    for k in keys:
        if np.ndim(k) == 0 and not hasattr(k, "codes"):
            continue                          # a fixed parameter: one value for all points
        inv, uniq = (np.asarray(k.codes), k.categories) if hasattr(k, "codes") else pd.factorize(k)
        if len(uniq) > 1:
            codes = codes * len(uniq) + inv
    inv, uniq = pd.factorize(codes)
    # a stable sort of small integers is a radix sort in numpy: O(n)
    order = np.argsort(inv.astype(np.uint16) if len(uniq) < 2**16 else inv, kind="stable")
    counts = np.bincount(inv, minlength=len(uniq))
    starts = np.concatenate(([0], np.cumsum(counts)))
    first = order[starts[:-1]]
    return first, order, starts


def evaluate(cols: dict, *, efficiency: Efficiency | None = None, ideal: bool = False) -> dict[str, np.ndarray]:
    """Metrics, ``feasible`` and ``reason`` of every design point in ``cols`` (arrays of equal length)."""
    unknown = set(cols) - set(PARAMS)
    if unknown:
        raise DseError(f"unknown parameter(s) {', '.join(sorted(unknown))}; allowed: {', '.join(PARAMS)}")
    n = len(next(iter(v for v in cols.values() if np.ndim(v) > 0 or hasattr(v, "codes")), [0]))
    for name in _codes(_raw(cols, "model"), n)[1]:
        load_model(str(name))         # unknown model: one clear error before any work
    # sort the points by workload once, so that every group is a contiguous slice (views, no copies)
    hw_inv, hw_names = _codes(_raw(cols, "hardware"), n)
    buffer = (_array(cols, "onchip_buffer_bytes", n) if "onchip_buffer_bytes" in cols else
              np.array([load_device(str(h)).onchip_buffer_bytes for h in hw_names])[hw_inv])
    _, order, starts = _group([_raw(cols, k) for k in _WORKLOAD_KEY] + [hw_inv, buffer], n)
    cols = {k: (v if np.ndim(v) == 0 and not hasattr(v, "codes") else v[order]) for k, v in cols.items()}
    sys, devices, hw_inv, extras = hardware_arrays(cols, n)
    out = {k: np.full(n, np.nan) for k in METRICS}
    feasible = np.ones(n, dtype=bool)
    reason = np.full(n, "", dtype=object)
    work = {k: _raw(cols, k) for k in _WORKLOAD_KEY}
    buffer = extras["buffer"]
    for g in range(len(starts) - 1):
        i0 = starts[g]
        idx = slice(starts[g], starts[g + 1])
        device = devices[hw_inv[i0]]
        w = {k: _at(work[k], i0) for k in _WORKLOAD_KEY}
        try:
            tp = _tp_of(w)
            pre, d0, slope, fp, sc = _tables(str(w["model"]), int(w["batch"]), int(w["prompt_len"]),
                                             int(w["gen_len"]), str(w["weights"]), str(w["activations"]),
                                             str(w["kv"]), tp, int(w["pp"]), int(w["ep"]),
                                             bool(w["flash_attention"]), float(buffer[i0]))
        except DseError as e:
            feasible[idx], reason[idx] = False, str(e)
            continue
        _evaluate_group(idx, sys, device, sc, pre, d0, slope, fp, w, extras, out, feasible, reason,
                        choose(device, efficiency, ideal))
    out["feasible"], out["reason"] = feasible, reason
    unsorted = {}
    for k, v in out.items():          # back to the caller's order
        unsorted[k] = np.empty_like(v)
        unsorted[k][order] = v
    return unsorted


def _tp_of(w: dict) -> int:
    """The tensor-parallel degree of a workload: ``tp``, or ``devices / (pp x ep)`` when
    ``devices`` is given (DseError if it does not divide)."""
    dev = w.get("devices")
    if dev is None or (isinstance(dev, float) and np.isnan(dev)):
        return int(w["tp"])
    pp_ep = int(w["pp"]) * int(w["ep"])
    if int(dev) % pp_ep:
        raise DseError(f"devices {int(dev)} is not a multiple of pp x ep = {pp_ep}")
    return int(dev) // pp_ep


def _evaluate_group(idx, sys_all, device, sc, pre, d0, slope, fp, w, extras, out, feasible, reason, eff):
    """Evaluate the points ``idx`` (a slice of the sorted points) that share one workload,
    writing into the (sorted) output arrays."""
    sys = sys_all.take(idx)
    offload = str(w["offload"])
    cap = sys.capacity
    size = sys.size
    why = np.full(size, "", dtype=object)
    if offload == "none":
        off = None
        host_bytes = np.zeros(size)
        fits = fits_within(fp.total_bytes, cap)
        why[~fits] = "does not fit in device memory"
    elif offload == "greedy":
        off = greedy_fractions(fp.weights_bytes, fp.activation_bytes, fp.kv_cache_bytes, cap)
        host_bytes = fp.weights_bytes * off[:, 0] + fp.kv_cache_bytes * off[:, 2]
        hcap = extras["host_capacity"][idx]
        dev_part = fp.total_bytes - host_bytes
        fits = fits_within(dev_part, cap) & fits_within(host_bytes * sc.devices, np.nan_to_num(hcap, nan=0.0))
        why[~fits] = "does not fit in device and host memory"
        hb = sys.host_bandwidth
        no_host = ~np.isfinite(hb)
        why[no_host & (host_bytes > 0)] = "no host link to offload to"
        fits &= ~(no_host & (host_bytes > 0))
    else:
        raise DseError(f"offload '{offload}': allowed in a design space: none, greedy")
    sys = replace(sys, tp=np.full(size, float(sc.tp)), offload=off,
                  overlap=np.ones(size, dtype=bool))
    if bool(w["sparse"]):             # the preset's sparse/dense ratios, as analyze uses them
        gain = SystemArrays.from_devices([device], 1, sparse=True).sparse_gain
        if gain is not None:
            sys = replace(sys, sparse_gain=np.broadcast_to(gain, sys.peak.shape))
    can = np.ones(size, dtype=bool)
    for wanted in {matmul_compute_class(sc.activations, sc.weights), matmul_compute_class(sc.activations, sc.kv)}:
        ok = sys.peak[:, _COL[wanted]] > 0
        why[~ok] = f"cannot compute {wanted} nor a wider format"
        can &= ok
    if sc.devices > 1:
        ok = np.isfinite(sys.link_bandwidth) & (sys.link_bandwidth > 0)
        why[~ok] = f"no interconnect for {sc.devices} devices"
        can &= ok
    if sc.flash_attention:
        ok = extras["buffer"][idx] > 0
        why[~ok] = "FlashAttention needs an on-chip buffer"
        can &= ok
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        ttft = step_time(pre, sys, eff) * (sc.micro_batches + sc.pp - 1) / sc.pp
        steps = np.full(size, max(sc.gen_len - 1, 1), dtype=float)
        dec = decode_total_time(d0, slope, steps, sys, eff)
        metrics = serving_metrics(ttft, dec, sc.batch, sc.prompt_len, sc.gen_len, sc.devices,
                                  overlap=eff.prefill_decode_overlap, request_overhead_s=eff.request_overhead_s)
    for k, v in metrics.items():
        out[k][idx] = v
    out["weights_bytes"][idx] = fp.weights_bytes
    out["kv_cache_bytes"][idx] = fp.kv_cache_bytes
    out["activation_bytes"][idx] = fp.activation_bytes
    out["memory_bytes"][idx] = fp.total_bytes
    out["offloaded_bytes"][idx] = host_bytes
    out["devices"][idx] = sc.devices
    out["power_w"][idx] = sc.devices * extras["tdp_w"][idx]
    out["cost_usd"][idx] = sc.devices * extras["price_usd"][idx]
    ok = fits & can
    feasible[idx] = ok
    reason[idx] = np.where(ok, "", why)


def device_for(params: dict):
    """The Device of one design point: its base preset (``hardware``) with every hardware
    override of ``params`` applied (what ``evaluate`` prices for that point)."""
    from hwmodels.device import Link, MemoryTier, PimUnit
    d = load_device(str(params["hardware"]))
    scale = float(params.get("compute_scale", 1.0) or 1.0)
    peaks = dict(d.peak_ops_per_s)
    for c in COMPUTE_CLASSES:
        v = params.get(f"peak_{c}")
        if v is not None and not (isinstance(v, float) and np.isnan(v)):
            peaks[c] = float(v)
    if params.get("native_formats") is not None:
        allowed = {f.strip() for f in str(params["native_formats"]).split(",")}
        peaks = {c: v for c, v in peaks.items() if c in allowed}
    peaks = {c: v * scale for c, v in peaks.items() if v > 0}
    vector = float(params.get("vector_ops_per_s") or d.vector_ops_per_s) * scale

    def num(key, default):
        v = params.get(key)
        return default if v is None or (isinstance(v, float) and np.isnan(v)) else float(v)
    mem = MemoryTier(d.memory.name, num("memory_capacity", d.memory.capacity_bytes),
                     num("memory_bandwidth", d.memory.bandwidth_bytes_per_s), d.memory.latency_s)
    link = d.interconnect
    if "link_bandwidth" in params or "link_latency" in params:
        link = Link(link.name if link else "link", num("link_bandwidth", link.bandwidth_bytes_per_s if link else np.nan),
                    num("link_latency", link.latency_s if link else 0.0))
    host_link, host_mem = d.host_link, d.host_memory
    if "host_link_bandwidth" in params:
        host_link = Link(host_link.name if host_link else "host-link", num("host_link_bandwidth", 0.0),
                         host_link.latency_s if host_link else 0.0)
    if "host_memory_capacity" in params or "host_memory_bandwidth" in params:
        host_mem = MemoryTier(host_mem.name if host_mem else "host-memory",
                              num("host_memory_capacity", host_mem.capacity_bytes if host_mem else np.nan),
                              num("host_memory_bandwidth", host_mem.bandwidth_bytes_per_s if host_mem else np.inf))
    pim = d.pim
    if "pim_multiple" in params or "pim_peak" in params:
        base = pim or PimUnit({c: v for c, v in peaks.items()}, 1.0, ("attention", "gemv", "experts"))
        pk = {c: num("pim_peak", v) for c, v in base.peak_ops_per_s.items()}
        pim = PimUnit(pk, num("pim_multiple", base.internal_bandwidth_multiple), base.operators, base.concurrent)
    return replace(d, peak_ops_per_s=peaks, vector_ops_per_s=vector,
                   memory_tiers=(mem,) + tuple(d.memory_tiers[1:]),
                   onchip_buffer_bytes=num("onchip_buffer_bytes", d.onchip_buffer_bytes),
                   interconnect=link, host_link=host_link, host_memory=host_mem, pim=pim,
                   tdp_w=num("tdp_w", d.tdp_w) if d.tdp_w or "tdp_w" in params else None,
                   price_usd=num("price_usd", d.price_usd) if d.price_usd or "price_usd" in params else None)


def scenario_for(params: dict) -> Scenario:
    """The Scenario of one design point's workload parameters."""
    w = {k: params.get(k, DEFAULTS.get(k)) for k in _WORKLOAD_KEY}
    return Scenario.make(batch=int(w["batch"]), prompt_len=int(w["prompt_len"]), gen_len=int(w["gen_len"]),
                         weights=str(w["weights"]), activations=str(w["activations"]), kv=str(w["kv"]),
                         tp=_tp_of(w), pp=int(w["pp"]), ep=int(w["ep"]), flash_attention=bool(w["flash_attention"]))
