"""Efficiency model on top of the ideal roofline.

The ideal roofline (``IDEAL``) is an upper bound: every operator at full peak and
full bandwidth, no overheads. The default model derates it with achievable
fractions of peak that depend on the operator's shape and with fixed overheads.
Its parameters (fields of :class:`Efficiency`) are:

================================  =====================================================================
``compute``                       fraction of peak a large weight matmul (GEMM) reaches
``compute_half_ops``              GEMM size (ops per instance) at which the size term is 1/2
``compute_half_rows``             GEMM shape: rows at which the shape term is 1/2 (skinny GEMMs with
                                  few rows, i.e. few tokens, keep the tensor units partly idle)
``memory``                        fraction of bandwidth a large transfer reaches
``memory_half_bytes``             bytes moved per instance at which a matmul reaches half of ``memory``
``attention_compute``             fraction of peak of the attention core (role ``attention``)
``attention_memory``              fraction of bandwidth of the attention core
``attention_kv_reads``            K/V bytes the attention kernel reads per byte of cache it attends
                                  to: 1 when one read serves every query head of a GQA group
                                  (FlashAttention-2, XQA, FlashInfer); up to heads / KV heads when a
                                  kernel reads K/V once per query head (set per scenario, not fitted)
``kv_reread_exponent``            share of those repeated reads that reach DRAM, as an exponent:
                                  the kernel moves attention_kv_reads ** kv_reread_exponent times the
                                  cache (1: none is served by the on-chip cache; no effect when
                                  attention_kv_reads is 1, as in every default scenario)
``vector_compute``                fraction of the vector (element-wise) peak
``compute_narrow``                ``compute`` for formats of 8 bits or fewer (FP8, INT8, FP6, FP4, INT4)
``compute_fp8``                   ``compute`` of FP8 and FP6 GEMMs (FP6 runs at the FP8 rate; None: ``compute_narrow``)
``compute_fp4``                   ``compute`` of FP4 GEMMs, NVFP4 and MXFP4 (None: ``compute_narrow``)
``compute_int8``                  ``compute`` of INT8 / INT4 GEMMs (None: ``compute_narrow``)
``op_overhead_s``                 fixed time per operator instance (kernel launch)
``step_overhead_s``               fixed time per step (scheduling, sampling, host work)
``request_overhead_s``            fixed time per request, added to TTFT (session set-up, first
                                  scheduling, sampling set-up)
``collective``                    fraction of link bandwidth a collective reaches
``collective_latency_s``          software latency of one collective or point-to-point message (a
                                  launch: one per all-reduce, as one-shot all-reduce kernels pay),
                                  added to the link latencies (2 (N - 1) per ring all-reduce)
``prefill_decode_overlap``        share of the shorter of prefill and decode hidden under the other
                                  when a scheduler mixes them in one batch (in-flight batching);
                                  0 for static batches
``host_links_measured``           True: host transfers (offload) at each host link's or tier's own
                                  measured fraction of its peak (``SystemArrays.host_fraction``,
                                  from configs/links.yaml and tiers.yaml), never ``memory``;
                                  False (``IDEAL``): at the link's peak. Not a fitted parameter.
================================  =====================================================================

Per operator (all functions of the operator's own ops and bytes, never of the design
point, so one call serves every point of a sweep):

    matmul compute fraction = top * ops / (ops + compute_half_ops) * rows / (rows + compute_half_rows)
    matmul memory fraction  = memory * bytes / (bytes + memory_half_bytes)
    attention               = attention_compute, attention_memory / attention_kv_reads ** kv_reread_exponent
    element-wise            = vector_compute, memory

with ``top`` the format's own fraction (``compute_fp8``, ``compute_fp4``, ``compute_int8``, each
falling back to ``compute_narrow`` and then ``compute``) for matmuls in 8-bit or narrower compute
classes, else ``compute``. Weight-only formats (INT4 weights, 16-bit activations) compute in the
activations' class; their dequantization is part of that GEMM's achieved fraction (not modelled
apart). and ``rows`` = ops x e / (2 x bytes moved), e the bytes of one element of the
operator's compute format: for an (M x K) by (K x N) product, rows = M K N / (M K + K N + M N),
which is M for a skinny GEMM (M << K, N) and grows with each dimension.

Each term grows with the size of the GEMM (more rows, columns or depth raise both
its ops and its rows), so a larger GEMM never gets a lower fraction. Fractions
are floored at 1e-3 of their maximum so that an empty operator never divides by zero.
The attention and element-wise fractions are constants because their bytes grow with
the context during decode, whose closed-form sum applies the first step's fractions
to the whole generation. Attention with and without FlashAttention differs by the
operators themselves (one fused operator, or qk / softmax / sv with the score matrix
written to and read back from memory and three launches), both at the attention
fractions; a decode kernel that reads K/V once per query head instead of once per GQA
group is ``attention_kv_reads`` > 1.

Prefill/decode overlap and the per-request overhead act on the serving metrics
(``dse.core.metrics.serving_metrics``); the collective latency acts in the kernel's
collective and point-to-point terms.

Defaults per hardware family (``efficiency_for``; a preset's ``family``: gpu, tpu, gaudi, neuron,
tenstorrent, apple, cpu, pim, groq, cerebras, sambanova) are the kernel layer: ``FAMILY_PRIORS``,
cited figures of what the hardware and its kernel library reach, apart from any serving engine.
``dse.fit.calibrate`` no longer fits them on end-to-end rows (it fits the engine layer with them
held fixed); a calibration file written before that may still hold fitted ``families`` values,
which then replace the priors of the families it covers. A family is never given another
family's values: the Efficiency's name says whose values a prediction uses ("prior gpu",
"calibrated gpu" for such an older file). The software side (launch, all-reduce and scheduler
costs, the engine's share of the kernel layer's bandwidth and compute, overlap, attention kernel,
batching) is the engine layer's (``dse.core.engines.engine_efficiency``). ``--ideal`` keeps the
pure bound.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, fields
from functools import lru_cache
from pathlib import Path

import numpy as np

from basis.errors import MAX_FIGURE, DseError, as_number, shown_key, verbatim
from basis.shipped import shipped
from basis.yamlfile import load_yaml
from dse.core.kernel_model import (
    GEMM_FORMATS,
    OUT_BYTES,
    SMEM_DEFAULT,
    Hardware,
    achieved_fractions,
    context_attention_time,
    gemm_time,
    generation_attention_time,
    grouped_gemm_time,
    grouped_parameters,
    hardware_of,
    load_kernel_model,
)
from hwmodels.formats import COMPUTE_CLASSES
from workloads.optable import SOFTMAX_OPS

#: the shipped calibration (``configs/calibration.yaml``; package data in a wheel)
CALIBRATION_FILE = shipped("configs", "calibration.yaml")
#: environment variable naming another calibration file for every command (``calibrate --out``'s)
CALIBRATION_ENV = "DSE_CALIBRATION"


def calibration_file() -> Path:
    """The calibration the defaults use: ``$DSE_CALIBRATION`` when set, else the shipped one."""
    return Path(os.environ[CALIBRATION_ENV]) if os.environ.get(CALIBRATION_ENV) else CALIBRATION_FILE


#: peak columns below this index are tensor (matmul) classes; then 'vector', 'none'
_TENSOR_COLUMNS = len(COMPUTE_CLASSES)
_VECTOR_COLUMN = len(COMPUTE_CLASSES)
#: bits per peak column (vector and 'none' count as wide)
#: bytes of one element of each peak column's format (vector and 'none': fp32)
_ELEMENT_BYTES = np.array([{"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "fp6": 0.75, "fp4": 0.5,
                            "int8": 1, "int4": 0.5}[c] for c in COMPUTE_CLASSES] + [4, 4], dtype=float)
#: the fraction field of each narrow compute class (wider classes use ``compute``)
_NARROW_FIELD_OF = {"fp8": "compute_fp8", "fp6": "compute_fp8", "fp4": "compute_fp4", "int8": "compute_int8",
                    "int4": "compute_int8"}
_NARROW_FIELDS = ("compute_fp8", "compute_fp4", "compute_int8")
#: floor of every fraction, relative to its maximum
_FLOOR = 1e-3

#: parameters that are fractions of a peak, in (0, 1]
FRACTIONS = ("compute", "compute_narrow", "compute_fp8", "compute_fp4", "compute_int8", "memory", "collective", "attention_compute", "attention_memory",
             "vector_compute")
#: parameters that are non-negative sizes or times
NON_NEGATIVE = ("op_overhead_s", "step_overhead_s", "request_overhead_s", "compute_half_ops", "compute_half_rows",
                "memory_half_bytes", "collective_latency_s")


@dataclass(frozen=True)
class Efficiency:
    """Achievable fractions of peak (0, 1] by operator shape and fixed overheads in seconds
    (see the module docstring for every parameter)."""

    compute: float = 0.70
    memory: float = 0.90
    op_overhead_s: float = 5e-6
    step_overhead_s: float = 0.0
    collective: float = 0.80
    name: str = "default"
    compute_half_ops: float = 0.0
    compute_narrow: float | None = None        # None: same as ``compute``
    compute_fp8: float | None = None           # None: same as ``compute_narrow``
    compute_fp4: float | None = None           # None: same as ``compute_narrow``
    compute_int8: float | None = None          # None: same as ``compute_narrow``
    compute_half_rows: float = 0.0
    memory_half_bytes: float = 0.0
    attention_compute: float | None = None     # None: same as ``compute``
    attention_memory: float | None = None      # None: same as ``memory``
    attention_kv_reads: float = 1.0
    kv_reread_exponent: float = 1.0
    vector_compute: float | None = None        # None: same as ``compute``
    collective_latency_s: float = 0.0
    prefill_decode_overlap: float = 0.0
    request_overhead_s: float = 0.0
    host_links_measured: bool = True
    kernel: KernelHardware | None = None       # the kernel layer prices matmuls and attention (``kernel_fractions``)

    def __post_init__(self):
        for k in FRACTIONS:
            v = getattr(self, k)
            if v is None:      # follows compute or memory (see ``resolved``)
                continue
            if not 0 < v <= 1:
                raise ValueError(f"efficiency '{k}' must be in (0, 1], got {v}")
        for k in NON_NEGATIVE:
            if not getattr(self, k) >= 0:
                raise ValueError(f"efficiency '{k}' must not be negative, got {getattr(self, k)}")
        if not self.attention_kv_reads >= 1:
            raise ValueError(f"efficiency 'attention_kv_reads' must be at least 1, got {self.attention_kv_reads}")
        if not 0 <= self.kv_reread_exponent <= 1:
            raise ValueError(f"efficiency 'kv_reread_exponent' must be in [0, 1], got {self.kv_reread_exponent}")
        if not 0 <= self.prefill_decode_overlap <= 1:
            raise ValueError(f"efficiency 'prefill_decode_overlap' must be in [0, 1], "
                             f"got {self.prefill_decode_overlap}")

    def resolved(self, name: str) -> float:
        """A parameter's value, with the ones left None following ``compute`` (compute_narrow,
        attention_compute, vector_compute) or ``memory`` (attention_memory)."""
        v = getattr(self, name)
        if v is None:
            if name in _NARROW_FIELDS:
                return self.resolved("compute_narrow")
            return self.memory if name == "attention_memory" else self.compute
        return v

    def narrow_tops(self) -> np.ndarray:
        """[peak columns] the top compute fraction of each compute column: its format's own
        field for 8-bit and narrower classes, else ``compute``."""
        return np.array([self.resolved(_NARROW_FIELD_OF.get(c, "compute")) for c in COMPUTE_CLASSES]
                        + [self.compute, self.compute])

    # ---- per-operator fractions (the kernel's contract: [O] arrays in (0, 1])
    def compute_fraction(self, op):
        """Achievable fraction of peak compute per operator of ``op`` (an OpArrays), in (0, 1]."""
        ops = np.asarray(op.ops, dtype=float)
        matmul, attention, vector = _kinds(op)

        def gemm(cols):                      # saturating in the matmul's ops and rows
            o, mem = ops[..., cols], np.asarray(op.memory_bytes, dtype=float)[..., cols]
            column = np.asarray(op.peak_column)[cols]
            top = self.narrow_tops()[column]
            with np.errstate(divide="ignore", invalid="ignore"):
                rows = np.where(mem > 0, o * _ELEMENT_BYTES[column] / (2 * mem), np.inf)
            fraction = top * _saturating(o, self.compute_half_ops) * _saturating(rows, self.compute_half_rows)
            return np.maximum(fraction, top * _FLOOR)
        out = _matmuls_apart(ops, matmul, gemm, np.where(attention, self.resolved("attention_compute"),
                                                         np.where(vector, self.resolved("vector_compute"),
                                                                  self.compute)))
        return out if self.kernel is None else _kernel_in(out, kernel_fractions(op, self)[0])

    def host_fraction(self, sys):
        """[P] the achieved fraction of the host link's peak on each point: the link's or tier's own
        measured fraction (``sys.host_fraction``), or 1 when host links run at their peak (IDEAL)."""
        return sys.host_fraction if self.host_links_measured else np.ones(sys.size)

    def memory_fraction(self, op):
        """Achievable fraction of memory bandwidth per operator of ``op``, in (0, 1]."""
        mem = np.asarray(op.memory_bytes, dtype=float)
        matmul, attention, _ = _kinds(op)

        def stream(cols):                    # saturating in the matmul's bytes
            return np.maximum(self.memory * _saturating(mem[..., cols], self.memory_half_bytes),
                              self.memory * _FLOOR)
        out = _matmuls_apart(mem, matmul, stream, np.where(
            attention, self.resolved("attention_memory") / self.attention_kv_reads ** self.kv_reread_exponent,
            self.memory))
        return out if self.kernel is None else _kernel_in(out, kernel_fractions(op, self)[1])


@dataclass(frozen=True, eq=False)
class KernelHardware:
    """The physical description the kernel layer (``dse.core.kernel_model``) reads: the peak of each
    peak column (ops/s, ``SystemArrays.peak``'s row), device-memory bandwidth (bytes/s), SMs and
    last-level cache (bytes): of one hardware (a tuple and numbers, compared and hashed by value: an
    Efficiency carrying it is a key of kept terms), or of each of P points in order (``peaks`` [P, C],
    the others [P] arrays: ``per_point``; compared and hashed by identity, one object a group)."""

    peaks: tuple | np.ndarray
    bandwidth: float | np.ndarray
    sms: float | np.ndarray
    l2_bytes: float | np.ndarray
    smem_bytes: float | np.ndarray = float(SMEM_DEFAULT)     # shared memory per SM (the prefill tile)

    @property
    def per_point(self) -> bool:
        """True when this describes each of several points (fractions [P, O])."""
        return np.ndim(self.bandwidth) > 0

    def _key(self):
        return id(self) if self.per_point else (self.peaks, self.bandwidth, self.sms, self.l2_bytes, self.smem_bytes)

    def __eq__(self, other):
        return isinstance(other, KernelHardware) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def at(self, j: int) -> KernelHardware:
        """The hardware of point ``j`` (of a per-point description; this one otherwise)."""
        if not self.per_point:
            return self
        return KernelHardware(tuple(float(x) for x in self.peaks[j]), float(self.bandwidth[j]), float(self.sms[j]),
                              float(self.l2_bytes[j]), float(np.broadcast_to(self.smem_bytes, np.shape(self.sms))[j]))

    def take(self, idx) -> KernelHardware:
        """The hardware of points ``idx`` (of a per-point description; this one otherwise)."""
        if not self.per_point:
            return self
        return KernelHardware(np.asarray(self.peaks)[idx], np.asarray(self.bandwidth)[idx],
                              np.asarray(self.sms)[idx], np.asarray(self.l2_bytes)[idx],
                              np.broadcast_to(self.smem_bytes, np.shape(self.sms))[idx])

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(peaks [C] or [P, 1, C], bandwidth a number or [P, 1]): shaped to broadcast over operators."""
        peaks, bw = np.asarray(self.peaks, dtype=float), np.asarray(self.bandwidth, dtype=float)
        return (peaks[:, None, :], bw[:, None]) if self.per_point else (peaks, bw)

    def model_hardware(self) -> Hardware:
        """The kernel model's Hardware of this one: 16-, 8- and 4-bit peaks of the bf16, fp8 and
        fp4 columns (per point: [P, 1] arrays)."""
        p, bw = self.arrays()
        sms, l2 = (np.asarray(x, dtype=float) for x in (self.sms, self.l2_bytes))
        smem = np.broadcast_to(np.asarray(self.smem_bytes, dtype=float), sms.shape)
        if self.per_point:
            sms, l2, smem = sms[:, None], l2[:, None], smem[:, None]
        return hardware_of(p[..., _COLUMN_OF["bf16"]], p[..., _COLUMN_OF["fp8"]], p[..., _COLUMN_OF["fp4"]], bw,
                           sms=sms, l2_bytes=l2, smem_bytes=smem)


#: index of each compute class among the peak columns
_COLUMN_OF = {c: i for i, c in enumerate(COMPUTE_CLASSES)}
#: the kernel model's GEMM format of each peak column: narrow classes of 8 bits and 6 at FP8, 4-bit
#: ones at NVFP4, wider ones (and vector, none) at BF16
_KERNEL_FORMAT = np.array([list(GEMM_FORMATS).index({"fp8": "fp8", "fp6": "fp8", "int8": "fp8", "fp4": "nvfp4",
                                                     "int4": "nvfp4"}.get(c, "bf16")) for c in COMPUTE_CLASSES]
                          + [0, 0])


#: bytes of one input element of each kernel-model GEMM format (``GEMM_FORMATS``), by format code
_FORMAT_BYTES = np.array([b for _, b in GEMM_FORMATS.values()])


def _kernel_in(fractions: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    """``fractions`` with the kernel layer's where it has one (not NaN)."""
    return np.where(np.isnan(kernel), fractions, kernel)


@lru_cache(maxsize=2)      # compute_fraction and memory_fraction ask in turn; [P, O] arrays are large
def kernel_fractions(op, eff: Efficiency) -> tuple[np.ndarray, np.ndarray]:
    """(compute fraction, memory fraction), shaped as ``op.ops``, that make each matmul's and fused
    attention's roofline time on ``eff.kernel`` equal the kernel layer's time of its shape
    (``dse.core.kernel_model``): a GEMM of its recorded n and k and the rows its ops imply (ops / 2 n k);
    a fused attention over shape_n keys of shape_m sequences, decode when its ops are a whole number
    of queries a sequence, causal prefill of shape_n tokens when (shape_n + 1) / 2 (its time scaled
    by the operator's ops over its shape's: the softmax's). NaN where the operator has no recorded
    shape or its amounts do not match one (an iteration mixing prompt chunks and decode tokens): its
    own fractions stay. Kept for the last two (operator arrays, Efficiency)."""
    hw_all = eff.kernel.model_hardware()
    peaks, bandwidth = eff.kernel.arrays()
    ops = np.asarray(op.ops, dtype=float)
    shape = np.broadcast_shapes(ops.shape, np.shape(bandwidth))     # [O], or [P, O] (per point)
    nan = np.full(shape, np.nan)
    if op.shape_m is None:
        return nan, nan
    ops = np.broadcast_to(ops, shape)
    m, n, k, h, hk = (np.broadcast_to(np.asarray(getattr(op, f), dtype=float), shape)
                      for f in ("shape_m", "shape_n", "shape_k", "heads", "kv_heads"))
    col = np.broadcast_to(np.asarray(op.peak_column), shape)
    mem = np.broadcast_to(np.asarray(op.memory_bytes, dtype=float), shape)
    kv = np.broadcast_to(np.asarray(op.kv_bytes, dtype=float), shape)
    matmul = np.broadcast_to(_kinds(op)[0], shape) & (h == 0)
    attention = h > 0                           # a fused attention records its heads (its PIM role may be none)

    def hw(mask):                               # the hardware of the entries ``mask`` selects
        return Hardware.of(**{f: np.broadcast_to(getattr(hw_all, f), shape)[mask]
                              for f in ("peak_16", "peak_8", "peak_4", "bandwidth", "sms", "l2_bytes", "smem_bytes")})
    prm = load_kernel_model()["parameters"]
    time = nan.copy()
    ideal = nan.copy()
    moved = mem.copy()        # the bytes the kernel's time is for: the model's of a GEMM's format, else the operator's
    g = matmul & (n > 0) & (k > 0) & (ops > 0)
    if g.any():
        # the rows from the operator's own ops (2 m n k): its tokens however the arrays were built (an
        # iteration of continuous batching, a scaled or pruned step)
        rows = ops[g] / (2 * n[g] * k[g])
        fmt = _KERNEL_FORMAT[col[g]]
        # a grouped GEMM (experts): its weight bytes over one group's are its groups (the experts this
        # step or iteration touches), of rows / groups rows each, every group's weights read
        time[g] = gemm_time(rows, n[g], k[g], fmt, hw(g), prm["gemm"])
        groups = np.ones_like(rows)
        if op.group_weight_bytes is not None:
            per_group = np.broadcast_to(np.asarray(op.group_weight_bytes, dtype=float), shape)[g]
            is_grouped = per_group > 0
            if is_grouped.any():
                weights = np.broadcast_to(np.asarray(op.weight_bytes, dtype=float), shape)[g]
                with np.errstate(divide="ignore", invalid="ignore"):
                    groups = np.where(is_grouped, np.maximum(weights / np.where(is_grouped, per_group, 1.0), 1.0), 1.0)
                time[g] = np.where(is_grouped, grouped_gemm_time(rows / groups, groups, n[g], k[g], fmt, hw(g),
                                                                 grouped_parameters(prm)), time[g])
        ideal[g] = ops[g]
        moved[g] = (rows * k[g] + groups * k[g] * n[g]) * _FORMAT_BYTES[fmt] + rows * n[g] * OUT_BYTES
    a = attention & (m > 0) & (n > 0) & (k > 0) & (h > 0) & (hk > 0) & (ops > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        queries = ops / ((4 * k + SOFTMAX_OPS) * m * h * n)       # decode: query tokens a sequence
    prefill = np.abs(queries - (n + 1) / 2) <= 1e-6 * n           # causal prefill: (n + 1) / 2 a query
    decode = (np.abs(queries - np.round(queries)) <= 1e-6 * queries) & (queries >= 1) & (queries <= n)
    a &= prefill | decode          # else the shape does not describe these amounts (a mixed iteration): fractions stay
    if a.any():
        queries, prefill, hw_a = queries[a], prefill[a], hw(a)
        e_kv = np.clip(np.where(kv[a] > 0, kv[a] / (2 * m[a] * n[a] * hk[a] * k[a]), 2.0), 0.5, 4.0)
        decode_t = generation_attention_time(m[a] * np.maximum(np.round(queries), 1), n[a], h[a], hk[a], k[a], e_kv,
                                             hw_a, prm["generation_attention"])
        prefill_t = context_attention_time(m[a], n[a], h[a], hk[a], k[a], np.where(_KERNEL_FORMAT[col[a]] == 0, 0, 1),
                                           hw_a, prm["context_attention"])
        time[a] = np.where(prefill, prefill_t, decode_t)
        ideal[a] = np.where(prefill, 2 * m[a] * h[a] * n[a] * (n[a] + 1) * k[a],
                            4 * m[a] * np.maximum(np.round(queries), 1) * h[a] * n[a] * k[a])
    priced = g | a
    if not priced.any():
        return nan, nan
    with np.errstate(divide="ignore", invalid="ignore"):
        time = time * (ops / ideal)                    # the operator's own work over its shape's
    # the peak of each operator's column: on its point's row of peaks where they are per point
    peak = np.take_along_axis(peaks[:, 0, :], col, axis=1) if peaks.ndim > 1 else peaks[col]
    fc, fm = achieved_fractions(ops[priced], moved[priced], peak[priced], np.broadcast_to(bandwidth, shape)[priced],
                                time[priced])
    # the time's loss on the resource that binds (the larger ideal term), the other at its peak: the
    # kernel's own shape takes its time either way, and an operator moving fewer bytes than the kernel's
    # format (weight-only INT4 under a 16-bit GEMM) is faster by its bytes where memory binds
    compute_bound = fc >= fm
    fc, fm = np.where(compute_bound, fc, 1.0), np.where(compute_bound, 1.0, fm)
    out_c, out_m = nan.copy(), nan.copy()
    out_c[priced], out_m[priced] = fc, fm
    return out_c, out_m


def _matmuls_apart(like: np.ndarray, matmul: np.ndarray, of_matmuls, others: np.ndarray) -> np.ndarray:
    """A fraction per operator, shaped and laid out as ``like`` ([O] or [P, O]): ``of_matmuls(cols)``
    (computed on the matmuls' columns ``cols`` alone) for the matmuls, ``others`` ([O]) for the rest."""
    out = np.empty_like(like)
    out[...] = others
    cols = np.flatnonzero(matmul)
    if cols.size:
        out[..., cols] = of_matmuls(cols)
    return out


def _saturating(x, half):
    """x / (x + half), 1 where half is 0, where both are 0 or where x is infinite (elementwise;
    the number 1.0, which broadcasts, when half is the number 0)."""
    if np.ndim(half) == 0 and half == 0:      # no saturation: 1 everywhere
        return 1.0
    x = np.asarray(x, dtype=float)
    half = np.asarray(half, dtype=float)
    den = x + half
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where((den > 0) & np.isfinite(x), x / np.where(den > 0, den, 1.0), 1.0)


def _kinds(op):
    """(matmul, attention, vector) masks per operator of an OpArrays."""
    col = np.asarray(op.peak_column)
    role = np.asarray(op.role) if getattr(op, "role", None) is not None else np.full(col.shape, -1)
    attention = role == 0
    matmul = (col < _TENSOR_COLUMNS) & ~attention
    vector = col == _VECTOR_COLUMN
    return matmul, attention, vector


PARAM_NAMES = tuple(f.name for f in fields(Efficiency) if f.name not in ("name", "host_links_measured", "kernel"))

IDEAL = Efficiency(1.0, 1.0, 0.0, 0.0, 1.0, name="ideal", host_links_measured=False)

#: The kernel layer's values per hardware family: what the hardware and its kernel library reach,
#: apart from any serving engine (the software's costs and shares are the engine layer's,
#: ``dse.core.engines``, fitted by ``dse.study calibrate`` with these held fixed; since issue 42 no
#: hardware fraction is fitted end to end). Sources:
#: - gpu compute 0.80: the maximum achievable matmul FLOPS (MAMF, BF16, best shape) is 80.3 % of
#:   dense peak on H100 SXM (794.5 of 989 TFLOPS), 85.9 % on A100 SXM, 77.6 % on B200 and 60.1 % on
#:   MI300X (S. Bekman, Machine Learning Engineering, compute/accelerator/README.md, 'Maximum
#:   Achievable Matmul FLOPS comparison table', read 2026-11); 0.80 is H100's, the device of most
#:   measured rows; the spread over devices is in the bands.
#: - gpu compute_half_rows 32: a Hopper tensor-core instruction multiplies a 64-row tile (PTX ISA,
#:   wgmma.mma_async shapes .m64nNk*), so a GEMM of M < 64 rows fills about M / 64 of it; the
#:   saturating shape term M / (M + 32) equals M / 64 at M = 32 (one half).
#: - gpu memory 0.90: first-order (a streaming kernel's share of peak HBM bandwidth; no cited
#:   microbenchmark table is at hand for it: the kernel layer's measured tables replace it).
#: - collective 0.80: fraction of link bandwidth a ring all-reduce reaches (NCCL bus bandwidth is
#:   typically 70-90 % of the link's).
#: - gaudi compute 0.969 (BF16) and 0.955 (FP8): measured MAMF 418.7 of 432 TFLOPS BF16 and 826.5 of
#:   865 TFLOPS FP8 on Gaudi 2 (ml-engineering MAMF table, as cited in configs/hardware/gaudi2.yaml);
#:   memory 0.90 first-order (no cited Gaudi bandwidth measurement).
#: - apple memory 0.90: MLX's batch-1 decode of a 70B model reads its weights at 0.83 of peak on an M2
#:   Ultra (Llama-3-70B BF16, 4.7 tokens/s of 800 GB/s) and 0.92-0.95 on an M3 Max (Llama-3.3-70B
#:   4-bit, 8.5-9.4 tokens/s of 400 GB/s): data/gathered/other_vendors.csv rows V086, V094 and V096,
#:   weight bytes as dse prices them x tokens/s; 0.90 is their mean (and the GPU prior's first-order
#:   figure). Achieved bandwidth depends on the kernel library: llama.cpp's Metal kernels of 2023
#:   reached 0.55-0.59 (rows M198 and M201), the llama.cpp profile's ``kernel_scales`` on Apple
#:   (configs/engines.yaml, ``dse.core.engines``), not this family's. compute 0.60 first-order.
#: - cpu memory 0.70: STREAM-like bandwidth on server DDR5 is ~70-80 % of the channel peak; compute
#:   0.50 for AMX/AVX-512 GEMMs (first-order, not fitted).
#: - groq, cerebras, sambanova: SRAM-resident, statically scheduled dataflow: 0.90 / 0.90
#:   (first-order, not fitted). Their presets' class (spatial) is priced by ``dse.core.dataflow``:
#:   these fractions with no engine costs and a per-layer pipeline latency of its own.
#: - tpu, neuron, tenstorrent: no cited measurement of achieved fractions: 0.70 / 0.90, the same
#:   first-order figures as the GPU prior, stated here and named "prior <family>" in every prediction
#:   (never a fit of another family).
#: - pim: only a device whose PIM units are its own host (gddr6-aim: an FPGA card that only issues
#:   AiM commands) is in this family; a PIM attached to a host GPU takes the host's family, so the
#:   host's operators are priced exactly as without the PIM, and the PIM's own operators by its
#:   physics (``dse.core.operator_cost``: units x unit bandwidth, mode switches, coordination, at
#:   the host's achieved stream fraction). No retrieved non-reserved source measures the fraction
#:   an AiM card achieves: 0.70 / 0.90 is a stated prior (the GPU prior's first-order figures, not
#:   a fit), uncertain by far more than any fitted family; read its predictions as +-50 %.
#: - the device classes (accelerator, soc, spatial) are the fallback of a device built without a
#:   family, with the figures of the family they describe.
FAMILY_PRIORS: dict[str, dict] = {
    "gpu": dict(compute=0.80, compute_half_rows=32.0, memory=0.90, collective=0.80),
    "tpu": dict(compute=0.70, memory=0.90, collective=0.80),
    "gaudi": dict(compute=0.969, compute_fp8=0.955, memory=0.90, collective=0.80),
    "neuron": dict(compute=0.70, memory=0.90, collective=0.80),
    "tenstorrent": dict(compute=0.70, memory=0.90, collective=0.80),
    "pim": dict(compute=0.70, memory=0.90, collective=0.80),
    "apple": dict(compute=0.60, memory=0.90, collective=0.80),
    "cpu": dict(compute=0.50, memory=0.70, collective=0.80),
    "groq": dict(compute=0.90, memory=0.90, collective=0.80),
    "cerebras": dict(compute=0.90, memory=0.90, collective=0.80),
    "sambanova": dict(compute=0.90, memory=0.90, collective=0.80),
    "accelerator": dict(compute=0.70, memory=0.90, collective=0.80),
    "soc": dict(compute=0.60, memory=0.90, collective=0.80),
    "spatial": dict(compute=0.90, memory=0.90, collective=0.80),
}
#: Achieved fraction of narrow formats relative to the family's 16-bit ``compute`` where a format's
#: own fraction is not fitted (measured MAMF ratios, ml-engineering, compute/accelerator and its
#: H200 -> B200 upgrade guide): gpu FP8 73.4 % (H200 SXM: 1453.4 of 1979 TFLOPS) against BF16
#: 80.3 % (H100/H200 SXM: 794.5 of 989), 0.914; gpu FP4 (NVFP4) 6624 of 9000 TFLOPS on B200, 73.6 %,
#: against its BF16 77.6 % (1745 of 2250), 0.949.
FORMAT_RATIOS: dict[str, dict] = {
    "gpu": {"compute_fp8": 0.914, "compute_fp4": 0.949},
}
#: the old name of the family table (calibration files written before families used ``classes``)
CLASS_PRIORS = FAMILY_PRIORS


def load_calibration(path: str | None = None) -> dict:
    """The calibration file ``path`` (default ``calibration_file()``) as a dict; DseError if it is
    missing or malformed (a missing calibration is never a silent fall back to the priors).

    Layout: ``families: {<family>: {<parameter>: {value: NUMBER, note: ...}}}`` (``classes`` in
    files written before families), the engine side ``launch``, ``allreduce`` and ``engines`` (see
    ``dse.core.engines``), plus free-form sections (``fitted``, ``error``, ``cross_validation``,
    ``bands``, ``not_fitted``).
    Read again whenever the file changes."""
    p = Path(path) if path else calibration_file()
    try:
        st = p.stat()
    except OSError as e:
        hint = (f" (set by ${CALIBRATION_ENV})" if not path and os.environ.get(CALIBRATION_ENV) else
                "; reinstall the package (pip install --force-reinstall dse-llm) or use a complete checkout"
                if not path else "")
        raise DseError(f"{p}: cannot read the calibration file: {e.strerror or e}{hint}") from None
    try:
        return _load_calibration(str(p), st.st_mtime_ns, st.st_size)
    except DseError as e:
        raise verbatim(e) from None


load_calibration.cache_clear = lambda: _load_calibration.cache_clear()   # noqa: E731


#: sections of a calibration file that hold fitted parameters, and the groups and names each
#: allows (``launch``: the launch classes of ``dse.core.engines``; ``allreduce``: its all-reduce
#: algorithms that cost a launch; ``engines``: the engine profiles of configs/engines.yaml)
ENGINE_SIDE = {"launch": ("op_overhead_s",), "allreduce": ("collective_latency_s",),
               "engines": ("step_overhead_s", "request_overhead_s", "memory_scale", "compute_scale",
                           "prefill_decode_overlap")}
LAUNCH_CLASSES = ("eager", "graphs")
ALLREDUCE_ALGORITHMS = ("one-shot", "ring")
#: the sections ``calibrate`` writes that record how the fit was made (free-form mappings)
RECORD_SECTIONS = ("fitted", "error", "cross_validation", "band_coverage", "not_fitted", "priors_kept",
                   "unpredictable", "at_bound", "prior_engines", "kernel_layer", "engine_families", "refits")
#: every top-level section a calibration file may have (``classes``: ``families`` before families)
SECTIONS = ("families", "classes", *ENGINE_SIDE, "bands", *RECORD_SECTIONS)

#: The least fraction of peak a calibration file may give (0.1 %): the kernel floors every fraction
#: at ``_FLOOR`` = 1e-3 of its maximum, so a smaller one is not what the model would compute; and
#: ``calibrate`` bounds fitted fractions to 0.2-1 (``dse.fit.calibrate.FIT``): no measured engine
#: reaches less than a few % of a peak. The most time a fixed overhead may take (1 s per operator,
#: step, request or collective: the fit's bounds end at 0.05 s). An engine's scales relative to the
#: default engine: 0.01-100 (fitted within 0.3-2).
MIN_FRACTION = _FLOOR
MAX_OVERHEAD_S = 1.0
#: [low, high] of each parameter a calibration file may give
FILE_RANGES: dict[str, tuple[float, float]] = {
    **{k: (MIN_FRACTION, 1.0) for k in FRACTIONS},
    **{k: (0.0, MAX_OVERHEAD_S) for k in ("op_overhead_s", "step_overhead_s", "request_overhead_s",
                                          "collective_latency_s")},
    "compute_half_ops": (0.0, MAX_FIGURE), "memory_half_bytes": (0.0, MAX_FIGURE), "compute_half_rows": (0.0, 1e6),
    "attention_kv_reads": (1.0, 1024.0), "kv_reread_exponent": (0.0, 1.0), "prefill_decode_overlap": (0.0, 1.0),
    "memory_scale": (0.01, 100.0), "compute_scale": (0.01, 100.0),
}
#: the keys of one band (``dse.core.bands``), and the largest factor a band may give
BAND_KEYS = ("n", "low", "high")
MAX_BAND_FACTOR = 1e3
ENGINES_FILE = shipped("configs", "engines.yaml")
#: what a group of each section is, for messages
_GROUP_WORDS = {"families": "hardware family", "launch": "launch class", "allreduce": "all-reduce algorithm",
                "engines": "engine"}


@lru_cache(maxsize=8)
def _load_calibration(path: str, mtime_ns: int, size: int) -> dict:
    """The checked calibration file ``path`` (cached by its modification time and size)."""
    p = Path(path)
    data = load_yaml(p, "calibration file")
    if not isinstance(data, dict) or not data:
        raise DseError(f"{p}: the calibration file is {'empty' if data in (None, {}) else 'not a mapping'}; "
                       f"expected a mapping with 'families: {{<family>: {{<parameter>: {{value: NUMBER}}}}}}'")
    unknown = [k for k in data if k not in SECTIONS]
    if unknown:
        raise DseError(f"{p}: {shown_key(unknown[0])}: unknown section; allowed: {', '.join(SECTIONS)}")
    name = "families" if "families" in data or "classes" not in data else "classes"
    if name == "classes":                                  # written before hardware families
        data = {**data, "families": data["classes"]}
    elif "families" not in data and any(data.get(k) for k in ENGINE_SIDE):   # the engine layer alone
        data = {**data, "families": {}}
    if not isinstance(data.get("families"), dict) or not (data["families"] or data.get("priors_kept")
                                                          or any(data.get(k) for k in ENGINE_SIDE)):
        raise DseError(f"{p}: {name}: expected the fitted parameters of at least one hardware family "
                       f"({{<family>: {{<parameter>: {{value: NUMBER}}}}}}); known families: {', '.join(FAMILY_PRIORS)}")
    groups_of = {"families": tuple(FAMILY_PRIORS), "launch": LAUNCH_CLASSES, "allreduce": ALLREDUCE_ALGORITHMS,
                 "engines": _engine_names()}
    for section, allowed in {"families": PARAM_NAMES, **ENGINE_SIDE}.items():
        groups = data.get(section)
        shown = name if section == "families" else section
        if groups is None:
            continue
        if not isinstance(groups, dict):
            raise DseError(f"{p}: {shown}: expected a mapping of groups to parameters")
        for group, params in groups.items():
            if group not in groups_of[section]:
                raise DseError(f"{p}: {shown}.{shown_key(group)}: unknown {_GROUP_WORDS[section]}; "
                               f"known: {', '.join(groups_of[section])}")
            if not isinstance(params, dict) or not params:
                raise DseError(f"{p}: {shown}.{group}: expected a mapping of parameters to {{value: NUMBER}}")
            for k, v in params.items():
                where = f"{p}: {shown}.{group}.{shown_key(k)}"
                if k not in allowed:
                    raise DseError(f"{where}: unknown parameter; allowed: {', '.join(allowed)}")
                _parameter(v, k, where)
    for section in ("bands", *RECORD_SECTIONS):
        if section in data and not isinstance(data[section], dict):
            raise DseError(f"{p}: {section}: expected a mapping")
    for key, band in (data.get("bands") or {}).items():
        _band(band, f"{p}: bands.{shown_key(key)}")
    return data


def _parameter(node, name: str, where: str) -> float:
    """The value of a calibration parameter ``{value: NUMBER[, note: TEXT]}`` (or a bare number):
    finite and within ``FILE_RANGES[name]``; DseError naming ``where`` (never the value's text)."""
    if isinstance(node, dict):
        extra = [k for k in node if k not in ("value", "note")]
        if extra or "value" not in node:
            raise DseError(f"{where}: expected {{value: NUMBER, note: TEXT}}"
                           + (f"; unknown key {shown_key(extra[0])}" if extra else "; 'value' is missing"))
        node = node["value"]
    v = as_number(node, where)
    lo, hi = FILE_RANGES.get(name, (-MAX_FIGURE, MAX_FIGURE))
    if not lo <= v <= hi:
        raise DseError(f"{where}: must be from {lo:g} to {hi:g}, got {v:g}")
    return v


def _band(node, where: str) -> None:
    """DseError naming ``where`` unless ``node`` is a band {n: rows, low: factor, high: factor}:
    n a whole number at least 1, both factors within 1 / ``MAX_BAND_FACTOR`` ... ``MAX_BAND_FACTOR``
    and low <= high."""
    if not isinstance(node, dict) or set(node) != set(BAND_KEYS):
        extra = [k for k in node if k not in BAND_KEYS] if isinstance(node, dict) else []
        raise DseError(f"{where}: expected {{n: ROWS, low: FACTOR, high: FACTOR}}"
                       + (f"; unknown key {shown_key(extra[0])}" if extra else ""))
    n = as_number(node["n"], f"{where}.n")
    if not (n >= 1 and n == int(n)):
        raise DseError(f"{where}.n: expected a whole number of rows, at least 1, got {n:g}")
    low, high = as_number(node["low"], f"{where}.low"), as_number(node["high"], f"{where}.high")
    for k, v in (("low", low), ("high", high)):
        if not 1 / MAX_BAND_FACTOR <= v <= MAX_BAND_FACTOR:
            raise DseError(f"{where}.{k}: a factor from {1 / MAX_BAND_FACTOR:g} to {MAX_BAND_FACTOR:g}, got {v:g}")
    if low > high:
        raise DseError(f"{where}: low ({low:g}) exceeds high ({high:g})")


@lru_cache(maxsize=1)
def _engine_names() -> tuple[str, ...]:
    """The names of the engine profiles (configs/engines.yaml; checked by ``dse.core.engines``)."""
    data = load_yaml(ENGINES_FILE, "engine profiles")
    return tuple(str(k) for k in ((data or {}).get("engines") or {})) if isinstance(data, dict) else ()


def _value(node) -> float:
    return float(node["value"] if isinstance(node, dict) else node)


def family_of(device) -> str:
    """The efficiency family of a device (its preset's ``family``, else its class) or of a name."""
    return device if isinstance(device, str) else device.efficiency_family


def family_parameters(family: str, path: str | None = None, fitted: dict | None = None) -> tuple[dict, bool]:
    """(the hardware-side parameters of ``family``: its prior, the narrow formats' measured ratios,
    then the fitted values ``fitted`` (default: the calibration's, from ``path`` or the one in use);
    True when there are fitted values)."""
    if family not in FAMILY_PRIORS:
        raise DseError(f"no efficiency defaults for hardware family '{family}'; known: {', '.join(FAMILY_PRIORS)}")
    out = dict(FAMILY_PRIORS[family])
    if fitted is None:
        fitted = (load_calibration(str(path) if path else None).get("families") or {}).get(family) or {}
    out.update({k: _value(v) for k, v in fitted.items()})
    for k, ratio in FORMAT_RATIOS.get(family, {}).items():
        if k not in fitted and k not in FAMILY_PRIORS[family]:
            out[k] = min(out["compute"] * ratio, 1.0)
    return out, bool(fitted)


def class_parameters(family: str, path: str | None = None) -> dict:
    """Parameters of a hardware family (or class): its prior, overridden by the calibration file."""
    return family_parameters(family, path)[0]


def efficiency_for(device, path: str | None = None) -> Efficiency:
    """The hardware-side (kernel layer) Efficiency of a device (or a family name): its family's
    cited prior, replaced by fitted values only where ``configs/calibration.yaml`` (or ``path``), a
    file written before the kernel layer was held fixed, fits that family; never another family's.
    Its name says which ('prior gpu', 'calibrated gpu'). The engine layer comes on top
    (``dse.core.engines.engine_efficiency``)."""
    fam = family_of(device)
    params, fitted = family_parameters(fam, path)
    try:
        return Efficiency(name=f"{'calibrated' if fitted else 'prior'} {fam}", **params)
    except ValueError as e:
        raise DseError(f"{path or calibration_file()}: family {fam}: {e}") from None


def __getattr__(name: str):
    """``DEFAULT``: the gpu family's default, read when first asked for (so that a broken
    calibration file does not stop ``import dse.core.efficiency``, and ``calibrate`` can rewrite it)."""
    if name == "DEFAULT":
        return efficiency_for("gpu")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def choose(device, efficiency: "Efficiency | None" = None, ideal: bool = False) -> "Efficiency":
    """The Efficiency a prediction on ``device`` uses: IDEAL with ``ideal``, else the one
    given, else the device class's calibrated default (``efficiency_for``)."""
    if ideal:
        return IDEAL
    return efficiency if efficiency is not None else efficiency_for(device)
