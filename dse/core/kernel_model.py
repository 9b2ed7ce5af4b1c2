"""The kernel layer: achieved time of each operator kind as a function of the hardware's physical
description, with a few coefficients fitted on measured kernel tables (``dse.fit.kernel_tables``;
the fitted coefficients ship as ``configs/kernel_model.yaml``).

Every function is vectorized: its arguments are numpy arrays (or numbers) that broadcast together
(operators x design points), and it returns seconds. No table is read at run time; a GPU nobody
measured (a template design) is priced through its features alone:

``Hardware`` (per design point)
    peak_16, peak_8, peak_4   dense tensor peaks, ops/s, of 16-bit, 8-bit and 4-bit formats
    bandwidth                 device-memory bandwidth, bytes/s
    sms                       compute units (SMs) the work is spread over
    l2_bytes                  on-chip last-level cache, bytes
    link_bandwidth            scale-up link per direction, bytes/s
    link_latency              link latency of one hop, s
    smem_bytes                shared memory one SM can give a kernel, bytes (the prefill-attention tile)

GEMM (m x k by k x n, format ``fmt``)::

    tile_s   = clip(2^ceil(log2 min(m, n)), 16, 128), 128 across max(m, n)   (the tile a kernel picks)
    tiles    = ceil(min(m, n) / tile_s) ceil(max(m, n) / 128)
    splits   = max(1, min(floor(sms / tiles), floor(k / 512)))     (split-K when tiles cannot fill the SMs)
    waves    = ceil(tiles splits / sms)
    waste    = waves sms tile_s 128 / (m n splits)                 (>= 1: padding and the last wave)
    compute  = 2 m n k / (peak[fmt] top[fmt]) waste^alpha + waves (k / splits) t_k
    device   = 1 / (1 / bandwidth + 1 / (sms bw_sm))      (Little's law: what the SMs keep in flight,
                                                           in series with the memory)
    on-chip  = hit share of the bytes when they fit the cache: 1 / (1 + (bytes / (l2_share l2_bytes))^4)
    bw'      = device (1 + hit (max(l2_sm sms / device, 1) - 1))   (the cache's bandwidth: per SM)
    memory   = bytes / (fm bw')
    quant    = quant[fmt] m k (2 + e_in) / (fm bw'(those bytes))  (activations quantized to the format)
    time     = (compute^p + memory^p)^(1/p) + t0[fmt] + quant

Grouped GEMM (the experts of a mixture: g GEMMs of m rows each, m x k by k x n, one launch)::

    tiles    = g ceil(m / tile_s) ceil(n / 128)                   (tile_s as above, of m; no split-K)
    waves    = ceil(tiles / sms);  waste = waves sms tile_s 128 / (g m n)
    compute  = 2 g m n k / (peak[fmt] top[fmt]) waste^alpha + waves k t_k
    memory   = g ((m k + k n) e_in + m n e_out) / (fm bandwidth')   (every group's weights read once)
    time     = (compute^p + memory^p)^(1/p) + t0[fmt]

with its own coefficients (``grouped_gemm``, fitted on the measured MoE tables: the expert block's
gate, up and down projections of ``moe_perf``, so that the routing and permutation kernels the block
runs besides its GEMMs are in them); a model without them prices it with the GEMM's coefficients.

Decode attention (b sequences, s cached tokens each, h query and hk K/V heads of size d)::

    bytes    = 2 b s hk d e_kv + 4 b h d e_act
    units    = b hk ceil(s / split) / sms                         (work items per SM, split-K decoding)
    memory   = bytes / (fm device)                                (device as for the GEMM)
    compute  = 4 b h s d / (peak_16 top)
    floor    = t0 (peak_16 / sms / OPS_PER_SM)^t0_exp             (the SM's size: a bigger SM's kernel
                                                                   has a longer fixed part)
               with ``floor_hinge``: t0 max(peak_16 / sms / OPS_PER_SM, 1)^t0_exp (the tables' decode floor,
               rows of <= 64 cached tokens and b h <= 256: H100 8.6 us, H200 8.5, L40S 9.2, RTX PRO 6000
               8.7 with SMs of 0.33-1.0 x Hopper's ops/s; B200 11.1, GB200 11.4, B300 10.9, GB300 11.2 at
               1.9-2.3 x: a smaller SM does not shorten it, a bigger one lengthens it)
    time     = (compute^p + memory^p)^(1/p) + floor + ceil(units) t_cta  (each wave of work items' fixed cost)

  A head group larger than GROUPED_HEADS_MAX (h / hk > 32 query heads per K/V head) leaves the
  grouped (tensor-core) decode kernel: its fallback works one query head at a time on the SMs' vector
  units, compute = 4 b h s d / (sms v_sm) (``v_sm``: the fallback's ops/s per SM, fitted), which the
  tables measure as a cliff: H100/H200/B200 reach 0.5 to 0.8 of their bandwidth up to 32 query heads a
  K/V head and 0.01 to 0.04 of it from 48 on, their time then proportional to h s d at ~45e9 ops/s per
  SM on both H100 and B200 (aiconfigurator-core 0.12.0, TensorRT-LLM 1.3.0rc20 generation-attention
  tables, rows with s >= 4096 and b >= 8; a model without ``v_sm`` has no fallback).

Prefill attention (causal over s tokens, window w: 0 for none)::

    rows     = the query rows of one tile: the largest power of two in [16, 128] whose Q tile and
               KV_STAGES buffers of K and V tiles (rows x d each, e bytes an element) fit the SM's
               shared memory: rows d e (1 + 2 KV_STAGES) <= smem_bytes   (FlashAttention's tiling)
    pairs    = s^2 / 2 (causal; s w - w^2 / 2 with a window below s)
    tiles    = b h ceil(s / 128);  waste = ceil(tiles / sms) sms / tiles   (the waves: 128-row tiles; the
               rows that fit in the wave count too transferred worse, leaving one GPU out 15.1 % / 50.8 %)
    compute  = 4 b h pairs d / (peak[fmt] top[fmt]) waste^alpha (1 + d_fill / d) (1 + s_fill / s)
               (1 + r_fill (1 / rows - 1 / 128))   (a tile smaller than 128 rows: fewer FLOPs per
                                                    byte the tensor cores read from shared memory)
    memory   = b s (2 h + 2 hk) d e / (fm device)
    time     = (compute^p + memory^p)^(1/p) + floor                (floor as for decode)

Collectives (NCCL: all_reduce, all_gather, reduce_scatter, alltoall over n GPUs, message bytes)::

    bus      = {all_reduce: 2 (n - 1) / n, all_gather / reduce_scatter / alltoall: (n - 1) / n} bytes
    time     = bus / (f[op] link_bandwidth) + lat0[op] + lat_hop[op] (n - 1)

Each of these is the kind's base; the time returned is base x exp(correction), the correction a
linear function (fitted weights, shared plus one set per format or collective) of hinge features of
the same physical quantities in log2 (arithmetic intensity over the ridge peak / bandwidth, sizes,
the ideal time, bytes over the L2, work items per SM), each clipped to the range the tables cover
so that the correction is flat beyond it (a huge GEMM keeps the base's closed form). The attention
kinds' corrections also have the SM's terms (dense 16-bit ops/s and memory bytes/s per SM), the
collectives' the link's (its bandwidth, and log2 n x its slowness: GPUs on a host-bridged bus
share it). A parameter a model lacks (a model fitted before it: ``bw_sm``, ``t0_exp``, ``l2_sm``,
``quant``, ``r_fill``) drops its term: ``device`` is the bandwidth, the floor ``t0``, the cache's
bandwidth ``l2_ratio`` x peak_16, no quantization pass, every prefill tile 128 rows.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from basis.errors import DseError
from basis.shipped import shipped
from basis.yamlfile import load_yaml
from dse.core.collectives import allreduce_share

#: the shipped fitted kernel model (package data: configs/kernel_model.yaml)
KERNEL_MODEL_FILE = shipped("configs", "kernel_model.yaml")

#: GEMM formats the model knows: (peak field, bytes per input element incl. scales)
GEMM_FORMATS = {"bf16": ("peak_16", 2.0), "fp8": ("peak_8", 1.0), "fp8_block": ("peak_8", 1.0 + 4 / 128),
                "nvfp4": ("peak_4", 0.5 + 1 / 16)}
#: bytes of one output element (16-bit activations)
OUT_BYTES = 2.0
#: the tensor-core tile width across n, and the largest and smallest tile height across m
TILE_N, TILE_M_MAX, TILE_M_MIN = 128, 128, 16
#: the least depth (k) of one split of a split-K GEMM
K_SPLIT = 512
#: the most and fewest query rows of one prefill-attention tile
ATTN_TILE, ATTN_TILE_MIN = 128, 16
#: K/V tile buffers a prefill-attention kernel keeps in shared memory besides its Q tile (double
#: buffering: one pair loading while the other is used, as FlashAttention-2/3's pipelines do)
KV_STAGES = 2
#: shared memory per SM of a design that gives none, bytes: 228 KB, the largest configurable shared
#: memory per SM of compute capabilities 9.0 (H100, H200) and 10.0 (B200, GB200, B300, GB300)
#: (SMEM_SOURCE). Chosen because every HBM datacenter GPU of the last two generations has it, the class
#: a template design is drawn from; with it a template's prefill tiles are as Hopper's / Blackwell's
#: (128 rows up to head size 128). A GDDR-class design (100 KB) should say so.
SMEM_DEFAULT = 228 * 1024
SMEM_SOURCE = ("NVIDIA CUDA C++ Programming Guide, 'Compute Capabilities' "
               "(docs.nvidia.com/cuda/cuda-programming-guide/05-appendices/compute-capabilities.html), "
               "technical specifications: maximum shared memory per SM 164 KB (8.0), 100 KB (8.6, 8.9, 12.0), "
               "228 KB (9.0, 10.0, 10.3); per-architecture tuning guides (Ampere, section 'Unified Shared "
               "Memory/L1/Texture Cache': A100 up to 164 KB, 8.6 up to 100 KB); CUTLASS "
               "include/cutlass/arch/arch.h: sm100_smem_capacity_bytes = 232448 (227 KiB a block, 228 KiB per "
               "SM less 1 KiB reserved), sm120_smem_capacity_bytes = 101376 (99 KiB, 100 KiB less 1)")
#: the most query heads per K/V head the grouped decode-attention kernel takes (beyond: the per-head
#: fallback, ``generation_attention_time``); the cliff in the measured tables lies between 32 and 48
GROUPED_HEADS_MAX = 32
#: the collectives the model prices, and the bytes each puts on the busiest link per byte of message
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "alltoall")
KINDS = ("gemm", "generation_attention", "context_attention", "collective")
#: kinds a model may lack (older fits): the kernel layer falls back as each function says
OPTIONAL_KINDS = ("grouped_gemm",)


@dataclass(frozen=True)
class Hardware:
    """The physical description the kernel layer reads (see the module docstring), arrays that
    broadcast over design points; SI units."""

    peak_16: np.ndarray
    peak_8: np.ndarray
    peak_4: np.ndarray
    bandwidth: np.ndarray
    sms: np.ndarray
    l2_bytes: np.ndarray
    link_bandwidth: np.ndarray | float = np.nan
    link_latency: np.ndarray | float = np.nan
    smem_bytes: np.ndarray | float = float(SMEM_DEFAULT)

    @classmethod
    def of(cls, **values) -> Hardware:
        """A Hardware of the given fields as float arrays."""
        return cls(**{k: np.asarray(v, dtype=float) for k, v in values.items()})


def _softmax(a, b, p):
    """(a^p + b^p)^(1/p): the larger of a and b, rounded where both are close (p large: max)."""
    hi = np.maximum(a, b)
    with np.errstate(divide="ignore", invalid="ignore"):
        lo_over = np.where(hi > 0, np.minimum(a, b) / np.where(hi > 0, hi, 1.0), 0.0)
    return hi * (1.0 + lo_over ** p) ** (1.0 / p)


def _hinges(x, lo: float, hi: float, step: float) -> np.ndarray:
    """[N, K] features of ``x`` clipped to [lo, hi] (the measured range: flat beyond it): x itself
    and max(x - c, 0) at knots c from lo + step to hi - step."""
    x = np.clip(np.ravel(x), lo, hi)
    knots = np.arange(lo + step, hi - step / 2, step)
    return np.column_stack([x] + [np.maximum(x - c, 0.0) for c in knots])


def _design(terms, groups: np.ndarray | None, n_groups: int) -> np.ndarray:
    """The correction's design matrix: a constant and the hinge features of ``terms`` ((log2 value,
    lo, hi, step) each), repeated once more per group (format, collective) for rows of that group."""
    base = np.column_stack([np.ones(np.size(terms[0][0]))] + [_hinges(*t) for t in terms])
    if groups is None:
        return base
    g = np.ravel(groups)
    return np.concatenate([base] + [base * (g == i)[:, None] for i in range(n_groups)], axis=1)


def _corrected(base_s: np.ndarray, terms, groups, n_groups: int, prm: dict) -> np.ndarray:
    """``base_s`` (seconds) times exp(design . weights) where ``prm`` has a fitted ``correction``
    (its weights), else ``base_s`` as it is. With ``prm['design']`` true (the fitter's call): the
    pair (base seconds, flattened, design matrix)."""
    if prm.get("design"):
        shape = np.shape(base_s)
        terms = [(np.broadcast_to(t[0], shape), *t[1:]) for t in terms]
        return np.ravel(base_s), _design(terms, None if groups is None else np.broadcast_to(groups, shape), n_groups)
    w = prm.get("correction")
    if w is None:
        return base_s
    # design . weights one feature column at a time (memory of a few [N] arrays, never [N, features]):
    # the weight of a column is its shared weight plus its group's
    shape = np.shape(base_s)
    w = np.asarray(w, dtype=float)
    width = 1 + sum(_hinges(np.zeros(1), *t[1:]).shape[1] for t in terms)
    per_group = w[width:].reshape(n_groups, width) if groups is not None else None
    g = np.broadcast_to(groups, shape) if groups is not None else None

    def weight(j):
        return w[j] if per_group is None else w[j] + per_group[:, j][g]
    total = weight(0) + np.zeros(shape)
    j = 1
    for x, lo, hi, step in terms:
        x = np.clip(np.broadcast_to(x, shape), lo, hi)
        total = total + x * weight(j)
        j += 1
        for c in np.arange(lo + step, hi - step / 2, step):
            total = total + np.maximum(x - c, 0.0) * weight(j)
            j += 1
    return base_s * np.exp(total)


def _log2(x):
    with np.errstate(divide="ignore"):
        return np.log2(np.maximum(np.asarray(x, dtype=float), 1e-300))


def _format_codes(fmt) -> np.ndarray:
    """Index of each format in GEMM_FORMATS (array of names or codes); DseError on an unknown name."""
    arr = np.asarray(fmt)
    if arr.dtype.kind in "iu":
        return arr
    names = list(GEMM_FORMATS)
    uniq, inv = np.unique(arr, return_inverse=True)
    bad = [u for u in uniq if u not in GEMM_FORMATS]
    if bad:
        raise DseError(f"kernel model: unknown GEMM format {bad[0]!r}; known: {', '.join(names)}")
    return np.array([names.index(u) for u in uniq])[inv].reshape(arr.shape)


def _per_format(values: dict, codes: np.ndarray) -> np.ndarray:
    """The per-format parameter ``values`` ({format: number}) at each format code."""
    table = np.array([values.get(f, np.nan) for f in GEMM_FORMATS], dtype=float)
    return table[codes]


def _peak_of(hw: Hardware, codes: np.ndarray) -> np.ndarray:
    """Dense peak ops/s of each format code on ``hw`` (broadcast)."""
    peaks = {"peak_16": hw.peak_16, "peak_8": hw.peak_8, "peak_4": hw.peak_4}
    out = np.zeros(np.broadcast_shapes(np.shape(codes), np.shape(hw.peak_16)))
    for i, (field, _) in enumerate(GEMM_FORMATS.values()):
        out = np.where(codes == i, peaks[field], out)
    return out


def gemm_time(m, n, k, fmt, hw: Hardware, prm: dict) -> np.ndarray:
    """Seconds of one GEMM (m x k by k x n, 16-bit output) in format ``fmt`` (names of
    GEMM_FORMATS or their codes) on ``hw``, with the fitted GEMM parameters ``prm``."""
    m, n, k = (np.asarray(x, dtype=float) for x in (m, n, k))
    codes = _format_codes(fmt)
    e_in = np.array([b for _, b in GEMM_FORMATS.values()])[codes]
    peak = _peak_of(hw, codes)
    small, large = np.minimum(m, n), np.maximum(m, n)
    tile_s = np.clip(2.0 ** np.ceil(np.log2(np.maximum(small, 1.0))), TILE_M_MIN, TILE_M_MAX)
    tiles = np.ceil(small / tile_s) * np.ceil(large / TILE_N)
    splits = np.maximum(1.0, np.minimum(np.floor(hw.sms / tiles), np.floor(k / K_SPLIT)))
    waves = np.ceil(tiles * splits / hw.sms)
    waste = waves * hw.sms * tile_s * TILE_N / (m * n * splits)
    ops = 2.0 * m * n * k
    top = _per_format(prm["top"], codes)
    compute = ops / (peak * top) * waste ** prm["alpha"] + waves * k / splits * prm["t_k"]
    nbytes = (m * k + k * n) * e_in + m * n * OUT_BYTES
    memory = nbytes / (prm["fm"] * _effective_bandwidth(nbytes, hw, prm))
    base = _softmax(compute, memory, prm["p"]) + _floor(_per_format(prm["t0"], codes), hw, prm)
    if "quant" in prm:                   # the activations quantized to the format first: read in 16 bits, written
        qbytes = m * k * (OUT_BYTES + e_in)
        base = base + _per_format(prm["quant"], codes) * qbytes / (prm["fm"] * _effective_bandwidth(qbytes, hw, prm))
    ideal_c, ideal_m = ops / peak, nbytes / hw.bandwidth
    # flat beyond the sizes the tables hold densely, so that a huge GEMM is the base model's closed form
    terms = [(_log2(ideal_c / ideal_m), -10, 4, 2), (_log2(m), 0, 13, 2), (_log2(n), 5, 14, 2), (_log2(k), 5, 14, 2),
             (_log2(np.maximum(ideal_c, ideal_m)), -26, -8, 2), (_log2(nbytes / hw.l2_bytes), -10, 4, 1),
             (_log2(m * n / (TILE_N * TILE_N * hw.sms)), -14, 6, 1)]
    if prm.get("hardware_terms"):
        terms += _hardware_terms(hw)
    return _corrected(base, terms, codes, len(GEMM_FORMATS), prm)


def grouped_gemm_time(m, groups, n, k, fmt, hw: Hardware, prm: dict) -> np.ndarray:
    """Seconds of one grouped GEMM: ``groups`` GEMMs (the experts touched) of ``m`` rows each (the
    tokens routed to an expert), m x k by k x n each, 16-bit output, in one launch (module
    docstring), with the fitted ``grouped_gemm`` parameters ``prm`` (or the GEMM's: no correction)."""
    m, g, n, k = (np.asarray(x, dtype=float) for x in (m, groups, n, k))
    m, g = np.maximum(m, 1e-9), np.maximum(g, 1.0)
    codes = _format_codes(fmt)
    e_in = np.array([b for _, b in GEMM_FORMATS.values()])[codes]
    peak = _peak_of(hw, codes)
    tile_s = np.clip(2.0 ** np.ceil(np.log2(np.maximum(m, 1.0))), TILE_M_MIN, TILE_M_MAX)
    tiles = g * np.ceil(m / tile_s) * np.ceil(n / TILE_N)
    waves = np.ceil(tiles / hw.sms)
    waste = waves * hw.sms * tile_s * TILE_N / (g * m * n)
    ops = 2.0 * g * m * n * k
    compute = ops / (peak * _per_format(prm["top"], codes)) * waste ** prm["alpha"] + waves * k * prm["t_k"]
    nbytes = g * ((m * k + k * n) * e_in + m * n * OUT_BYTES)
    memory = nbytes / (prm["fm"] * _effective_bandwidth(nbytes, hw, prm))
    base = _softmax(compute, memory, prm["p"]) + _per_format(prm["t0"], codes)
    ideal = np.maximum(ops / peak, nbytes / hw.bandwidth)
    # flat beyond what the MoE tables measure: 1 to 2^12 tokens an expert, 1 to 2^9 experts a rank
    terms = [(_log2(m), 0, 12, 1), (_log2(g), 0, 9, 1), (_log2(ideal), -24, -8, 2),
             (_log2(ops / peak / (nbytes / hw.bandwidth)), -10, 4, 2)]
    return _corrected(base, terms, codes, len(GEMM_FORMATS), prm)


def grouped_parameters(parameters: dict) -> dict:
    """The grouped GEMM's parameters of a model's ``parameters``: its fitted ``grouped_gemm``, or
    (a model fitted before the MoE tables were) the GEMM's coefficients without their correction."""
    return parameters.get("grouped_gemm") or {**parameters["gemm"], "correction": None}


def _effective_bandwidth(nbytes, hw: Hardware, prm: dict) -> np.ndarray:
    """Bytes/s a kernel streaming ``nbytes`` reaches before its fraction: what the SMs draw from
    device memory (``_device_bandwidth``), raised toward the on-chip cache's bandwidth (``l2_sm`` per
    SM; a model without it: ``l2_ratio`` x the 16-bit peak in bytes/s) when the bytes fit the cache
    (a smooth hit share, half at ``l2_share`` x its size)."""
    hit = 1.0 / (1.0 + (nbytes / (prm["l2_share"] * hw.l2_bytes)) ** 4)
    device = _device_bandwidth(hw, prm)
    cache = prm["l2_sm"] * hw.sms if "l2_sm" in prm else prm["l2_ratio"] * hw.peak_16
    ratio = np.maximum(cache / device, 1.0)
    return device * (1.0 + hit * (ratio - 1.0))


def _device_bandwidth(hw: Hardware, prm: dict) -> np.ndarray:
    """Bytes/s the SMs can draw from device memory: the memory's bandwidth in series with what the
    SMs keep in flight (Little's law: each SM sustains ``bw_sm`` bytes/s, its outstanding requests
    over the memory latency), 1 / (1 / bandwidth + 1 / (sms bw_sm)); the bandwidth itself without
    ``bw_sm`` (a model fitted before it). A GPU with much bandwidth per SM reaches less of its peak."""
    bw_sm = prm.get("bw_sm")
    if bw_sm is None:
        return hw.bandwidth
    return 1.0 / (1.0 / hw.bandwidth + 1.0 / (hw.sms * bw_sm))


def _floor(t0, hw: Hardware, prm: dict) -> np.ndarray:
    """A kernel's fixed floor (s): ``t0`` on an SM of OPS_PER_SM dense 16-bit ops/s, scaled by the
    SM's size to the power ``t0_exp``; ``t0`` itself without ``t0_exp``."""
    e = prm.get("t0_exp")
    if e is None:
        return t0
    size = hw.peak_16 / hw.sms / OPS_PER_SM
    if prm.get("floor_hinge"):           # an SM no bigger than Hopper's keeps Hopper's floor (module docstring)
        size = np.maximum(size, 1.0)
    return t0 * size ** e


def _hardware_terms(hw: Hardware) -> list:
    """The correction's terms of the hardware alone (log2, clipped to the measured GPUs' range):
    dense 16-bit ops/s per SM and device-memory bytes/s per SM."""
    return [(_log2(hw.peak_16 / hw.sms), 41, 44, 1), (_log2(hw.bandwidth / hw.sms), 32, 36, 1)]


def generation_attention_time(batch, kv_len, heads, kv_heads, head_dim, kv_bytes, hw: Hardware, prm: dict,
                              window=0) -> np.ndarray:
    """Seconds of one decode-attention kernel: ``batch`` sequences of one new token attending to
    ``kv_len`` cached tokens (a sliding ``window`` > 0 caps it), ``heads`` query and ``kv_heads``
    K/V heads of ``head_dim``, ``kv_bytes`` per cached element."""
    b, s, h, hk, d, e = (np.asarray(x, dtype=float) for x in (batch, kv_len, heads, kv_heads, head_dim, kv_bytes))
    w = np.asarray(window, dtype=float)
    s = np.where(w > 0, np.minimum(s, w), s)
    s = np.maximum(s, 1.0)
    nbytes = 2.0 * b * s * hk * d * e + 4.0 * b * h * d * OUT_BYTES
    units = b * hk * np.ceil(s / prm["split"]) / hw.sms
    memory = nbytes / (prm["fm"] * _device_bandwidth(hw, prm))
    compute = 4.0 * b * h * s * d / (hw.peak_16 * prm["top"])
    if "v_sm" in prm:                    # beyond the grouped kernel's head group: the per-head fallback
        compute = np.where(h / hk > GROUPED_HEADS_MAX, 4.0 * b * h * s * d / (hw.sms * prm["v_sm"]), compute)
    base = _softmax(compute, memory, prm["p"]) + _floor(prm["t0"], hw, prm) + np.ceil(units) * prm["t_cta"]
    ideal = np.maximum(nbytes / hw.bandwidth, 4.0 * b * h * s * d / hw.peak_16)
    terms = [(_log2(b), 0, 11, 1), (_log2(s), 0, 17, 1), (_log2(hk), 0, 7, 1), (_log2(h / hk), 0, 7, 1),
             (_log2(d), 6, 8, 1), (_log2(ideal), -26, -4, 2), (_log2(units), -8, 16, 2),
             (_log2(nbytes / hw.l2_bytes), -12, 8, 2)]
    if prm.get("hardware_terms"):
        terms += _hardware_terms(hw)
    return _corrected(base, terms, (e < 2).astype(int), 2, prm)


def attention_tile_rows(head_dim, elem_bytes, smem_bytes) -> np.ndarray:
    """Query rows of one prefill-attention tile (module docstring): the largest power of two in
    [ATTN_TILE_MIN, ATTN_TILE] whose Q tile and KV_STAGES K and V tiles of ``head_dim`` elements of
    ``elem_bytes`` each fit ``smem_bytes`` of shared memory."""
    per_row = np.asarray(head_dim, dtype=float) * np.asarray(elem_bytes, dtype=float) * (1.0 + 2.0 * KV_STAGES)
    fit = np.floor(np.log2(np.maximum(np.asarray(smem_bytes, dtype=float) / per_row, 1.0)))
    return np.clip(2.0 ** fit, ATTN_TILE_MIN, ATTN_TILE)


def context_attention_time(batch, seq_len, heads, kv_heads, head_dim, fmt, hw: Hardware, prm: dict,
                           window=0) -> np.ndarray:
    """Seconds of one causal prefill-attention kernel over ``seq_len`` tokens of each of ``batch``
    sequences (``window`` > 0: sliding), computing in ``fmt`` ('bf16' or 'fp8')."""
    b, s, h, hk, d = (np.asarray(x, dtype=float) for x in (batch, seq_len, heads, kv_heads, head_dim))
    w = np.asarray(window, dtype=float)
    codes = _format_codes(fmt)
    peak = _peak_of(hw, codes)
    e = np.array([b_ for _, b_ in GEMM_FORMATS.values()])[codes]
    wc = np.where((w > 0) & (w < s), w, s)
    pairs = s * wc - wc * wc / 2.0
    tiled = "r_fill" in prm                 # a model fitted before the shared-memory tile: 128 rows
    rows = attention_tile_rows(d, np.floor(e), hw.smem_bytes) if tiled else float(ATTN_TILE)
    tiles = b * h * np.ceil(s / ATTN_TILE)
    waste = np.ceil(tiles / hw.sms) * hw.sms / tiles
    top = _per_format(prm["top"], codes)
    compute = (4.0 * b * h * pairs * d / (peak * top) * waste ** prm["alpha"]
               * (1.0 + prm["d_fill"] / d) * (1.0 + prm["s_fill"] / s))
    if tiled:
        compute = compute * (1.0 + prm["r_fill"] * (1.0 / rows - 1.0 / ATTN_TILE))
    memory = b * s * (2.0 * h + 2.0 * hk) * d * e / (prm["fm"] * _device_bandwidth(hw, prm))
    base = _softmax(compute, memory, prm["p"]) + _floor(prm["t0"], hw, prm)
    ideal = np.maximum(4.0 * b * h * pairs * d / peak, b * s * (2.0 * h + 2.0 * hk) * d * e / hw.bandwidth)
    terms = [(_log2(b), 0, 8, 1), (_log2(s), 0, 14, 1), (_log2(h), 0, 7, 1), (_log2(h / hk), 0, 7, 1),
             (_log2(d), 6, 8, 1), (_log2(ideal), -26, -2, 2), (_log2(tiles / hw.sms), -8, 14, 2),
             (_log2(wc / s), -7, 0, 1)]
    if prm.get("hardware_terms"):
        terms += _hardware_terms(hw)
    return _corrected(base, terms, codes, len(GEMM_FORMATS), prm)


def collective_time(op, message_bytes, gpus, hw: Hardware, prm: dict) -> np.ndarray:
    """Seconds of one NCCL-class collective ``op`` (COLLECTIVES) of ``message_bytes`` over
    ``gpus`` devices joined by links of ``hw.link_bandwidth`` and ``hw.link_latency``."""
    op = np.asarray(op)
    nb, n = np.asarray(message_bytes, dtype=float), np.asarray(gpus, dtype=float)
    out = np.full(np.broadcast_shapes(op.shape, nb.shape, n.shape, np.shape(hw.link_bandwidth)), np.nan)
    for name in COLLECTIVES:
        c = prm[name]
        share = allreduce_share(n) if name == "all_reduce" else (n - 1) / n
        t = (share * nb / (c["f"] * hw.link_bandwidth) + c["lat0"]
             + (n - 1) * (c["lat_hop"] + c["hop_links"] * hw.link_latency))
        out = np.where(op == name, t, out)
    ideal = nb / hw.link_bandwidth
    codes = np.zeros(out.shape, dtype=int)
    for i, name in enumerate(COLLECTIVES):
        codes = np.where(op == name, i, codes)
    terms = [(_log2(nb), 8, 29, 1), (_log2(ideal), -28, -6, 2)]
    if prm.get("link_terms"):
        terms += _link_terms(hw, n)
    return _corrected(out, terms, codes, len(COLLECTIVES), prm)


#: log2 of the link bandwidths (bytes/s) the tables measured: PCIe 4.0 x16 (32 GB/s, 2^34.9) to NVLink 5
#: (900 GB/s, 2^39.7), rounded out to whole powers
LINK_LOG2 = (34.0, 40.0)


def _link_terms(hw: Hardware, n) -> list:
    """The collective correction's terms of the link (log2 bytes/s, clipped to LINK_LOG2) and of
    the group on a slow link: log2(n) x the link's slowness (1 at the slowest measured link, 0 at
    the fastest), since GPUs on a host-bridged bus share its upstream bandwidth and a larger group
    slows each of them, where a switched fabric (NVLink) gives each its own."""
    lo, hi = LINK_LOG2
    slow = np.clip((hi - _log2(hw.link_bandwidth)) / (hi - lo), 0.0, 1.0)
    return [(_log2(hw.link_bandwidth), lo, hi, 2), (_log2(n) * slow, 0, 3, 4)]


# ---- the shipped fitted model ------------------------------------------------------------------

def load_kernel_model(path: str | Path | None = None) -> dict:
    """The fitted kernel model (``configs/kernel_model.yaml`` or ``path``) as a dict; DseError
    naming the file if it is missing or lacks an operator kind."""
    p = Path(path) if path else KERNEL_MODEL_FILE
    try:
        st = p.stat()
    except OSError as e:
        raise DseError(f"{p}: cannot read the kernel model: {e.strerror or e}") from None
    return _load(str(p), st.st_mtime_ns)


@lru_cache(maxsize=4)
def _load(path: str, mtime_ns: int) -> dict:
    data = load_yaml(Path(path), "kernel model")
    if not isinstance(data, dict) or not isinstance(data.get("parameters"), dict):
        raise DseError(f"{path}: expected a mapping with 'parameters: {{{', '.join(KINDS)}}}'")
    missing = [k for k in KINDS if k not in data["parameters"]]
    if missing:
        raise DseError(f"{path}: parameters.{missing[0]}: missing; the kernel model needs {', '.join(KINDS)}")
    return data


def measured_hardware(name: str, model: dict | None = None) -> Hardware:
    """The physical description of a GPU the tables measured (``hardware.<name>`` of the model)."""
    model = model or load_kernel_model()
    table = model.get("hardware") or {}
    if name not in table:
        raise DseError(f"kernel model: no measured GPU '{name}'; known: {', '.join(table)}")
    h = table[name]
    return Hardware.of(**{f: h[f] for f in ("peak_16", "peak_8", "peak_4", "bandwidth", "sms", "l2_bytes",
                                          "link_bandwidth", "link_latency")},
                       smem_bytes=h.get("smem_bytes", SMEM_DEFAULT))


# ---- for the evaluator ----------------------------------------------------------------------------

#: dse hardware presets whose GPU the tables measured (preset name -> the tables' system name)
MEASURED_PRESETS = {"h100-sxm": "h100_sxm", "h200": "h200_sxm", "b200": "b200_sxm", "gb200": "gb200",
                    "l40s": "l40s", "rtx-pro-6000": "rtx_pro_6000_server"}
#: dense BF16 tensor ops/s of one SM, the estimate of the SM count of a design that gives none:
#: H100 SXM5's 989.4e12 ops/s over its 132 SMs (both in configs/hardware/h100-sxm.yaml's sources and
#: the H100 whitepaper), 7.5e12
OPS_PER_SM = 989.4e12 / 132


def hardware_of(peak_16, peak_8, peak_4, bandwidth, sms=None, l2_bytes=0.0, link_bandwidth=np.nan,
                link_latency=np.nan, smem_bytes=SMEM_DEFAULT) -> Hardware:
    """A Hardware for design points (arrays over points): ``sms`` None estimates the SM count as
    peak_16 / OPS_PER_SM; ``l2_bytes`` 0 (unknown) gives no cache hits (the conservative side);
    ``smem_bytes`` (shared memory per SM, bytes) defaults to SMEM_DEFAULT, Hopper's and datacenter
    Blackwell's 228 KB."""
    p16 = np.asarray(peak_16, dtype=float)
    sms = np.maximum(np.round(p16 / OPS_PER_SM), 1.0) if sms is None else sms
    return Hardware.of(peak_16=p16, peak_8=peak_8, peak_4=peak_4, bandwidth=bandwidth, sms=sms,
                       l2_bytes=np.maximum(np.asarray(l2_bytes, dtype=float), 1.0), link_bandwidth=link_bandwidth,
                       link_latency=link_latency, smem_bytes=smem_bytes)


def source_of(preset: str | None, model: dict | None = None) -> str:
    """Which layer's values a prediction on ``preset`` uses: 'measured tables' when the tables
    measured that GPU (the model was fitted on its rows), else 'learned transfer' (its features only)."""
    model = model or load_kernel_model()
    if preset in MEASURED_PRESETS:
        return f"measured tables ({MEASURED_PRESETS[preset]}, {model.get('fitted_on', '').split(' tables')[0]})"
    return "learned transfer (physical features; no table of this hardware)"


def band_of(kind: str, model: dict | None = None) -> tuple[float, float] | None:
    """(low, high) factors on a kernel time of ``kind`` holding 90 % of the held-out rows (leave one
    GPU out; collectives: one GPU count out), or None when the model has no band for it."""
    b = ((model or load_kernel_model()).get("bands") or {}).get(kind)
    return (float(b["low"]), float(b["high"])) if b else None


def achieved_fractions(ops, nbytes, peak, bandwidth, time_s):
    """(compute fraction, memory fraction) that make the roofline max(ops / (peak f_c),
    bytes / (bandwidth f_m)) equal ``time_s``: each f = its ideal time / time_s, in (0, 1]
    (clipped: a kernel layer time below an ideal bound is read as the bound)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        fc = np.clip(np.asarray(ops, float) / np.asarray(peak, float) / time_s, 1e-3, 1.0)
        fm = np.clip(np.asarray(nbytes, float) / np.asarray(bandwidth, float) / time_s, 1e-3, 1.0)
    return fc, fm
