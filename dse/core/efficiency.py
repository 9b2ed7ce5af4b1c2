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
================================  =====================================================================

Per operator (all functions of the operator's own ops and bytes, never of the design
point, so one call serves every point of a sweep):

    matmul compute fraction = top * ops / (ops + compute_half_ops) * rows / (rows + compute_half_rows)
    matmul memory fraction  = memory * bytes / (bytes + memory_half_bytes)
    attention               = attention_compute, attention_memory / attention_kv_reads ** kv_reread_exponent
    element-wise            = vector_compute, memory

with ``top`` = ``compute_narrow`` for matmuls in 8-bit or narrower compute classes, else
``compute``, and ``rows`` = ops x e / (2 x bytes moved), e the bytes of one element of the
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

Defaults per hardware class (``efficiency_for``): ``CLASS_PRIORS`` are documented
first-order figures; the parameters ``dse.fit.calibrate`` fits are read from
``configs/calibration.yaml`` (with the file, date and error of the fit) and replace the
priors of the classes the measurements cover. ``--ideal`` keeps the pure bound.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, fields
from functools import lru_cache
from pathlib import Path

import numpy as np

from basis.errors import DseError, as_number
from basis.shipped import shipped
from basis.yamlfile import load_yaml
from hwmodels.formats import COMPUTE_BITS, COMPUTE_CLASSES

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
_BITS = np.array([COMPUTE_BITS[c] for c in COMPUTE_CLASSES] + [32, 32])
#: bytes of one element of each peak column's format (vector and 'none': fp32)
_ELEMENT_BYTES = np.array([{"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "fp6": 0.75, "fp4": 0.5,
                            "int8": 1, "int4": 0.5}[c] for c in COMPUTE_CLASSES] + [4, 4], dtype=float)
#: floor of every fraction, relative to its maximum
_FLOOR = 1e-3

#: parameters that are fractions of a peak, in (0, 1]
FRACTIONS = ("compute", "compute_narrow", "memory", "collective", "attention_compute", "attention_memory",
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
            return self.memory if name == "attention_memory" else self.compute
        return v

    # ---- per-operator fractions (the kernel's contract: [O] arrays in (0, 1])
    def compute_fraction(self, op):
        """Achievable fraction of peak compute per operator of ``op`` (an OpArrays), in (0, 1]."""
        ops = np.asarray(op.ops, dtype=float)
        mem = np.asarray(op.memory_bytes, dtype=float)
        matmul, attention, vector = _kinds(op)
        top = np.where(_BITS[np.asarray(op.peak_column)] <= 8, self.resolved("compute_narrow"), self.compute)
        with np.errstate(divide="ignore", invalid="ignore"):
            rows = np.where(mem > 0, ops * _ELEMENT_BYTES[np.asarray(op.peak_column)] / (2 * mem), np.inf)
        gemm = top * _saturating(ops, self.compute_half_ops) * _saturating(rows, self.compute_half_rows)
        gemm = np.maximum(gemm, top * _FLOOR)
        return np.where(matmul, gemm, np.where(attention, self.resolved("attention_compute"),
                                                np.where(vector, self.resolved("vector_compute"), self.compute)))

    def memory_fraction(self, op):
        """Achievable fraction of memory bandwidth per operator of ``op``, in (0, 1]."""
        mem = np.asarray(op.memory_bytes, dtype=float)
        matmul, attention, _ = _kinds(op)
        stream = np.maximum(self.memory * _saturating(mem, self.memory_half_bytes), self.memory * _FLOOR)
        return np.where(matmul, stream, np.where(attention, self.resolved("attention_memory")
                                                  / self.attention_kv_reads ** self.kv_reread_exponent,
                                                  self.memory))


def _saturating(x, half):
    """x / (x + half), 1 where half is 0, where both are 0 or where x is infinite (elementwise)."""
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


PARAM_NAMES = tuple(f.name for f in fields(Efficiency) if f.name != "name")

IDEAL = Efficiency(1.0, 1.0, 0.0, 0.0, 1.0, name="ideal")

#: First-order defaults per hardware class, before calibration. ``dse.study calibrate``
#: replaces the fitted parameters of the classes its measurements cover (and of the
#: classes that inherit them, ``INHERITS``). Sources of the priors:
#: - gpu memory 0.90: memory-streaming microbenchmarks reach ~90 % of peak HBM bandwidth
#:   (first-order; ``calibrate`` refits it on the decode rows of data/measured_calibration.csv).
#: - gpu compute 0.70: large tensor-core GEMMs sustain 60-80 % of dense peak.
#: - op_overhead_s 5e-6: one kernel launch per operator instance (a few microseconds).
#: - collective 0.80: fraction of link bandwidth a ring all-reduce reaches (NCCL bus
#:   bandwidth is typically 70-90 % of the link's).
#: - soc memory 0.55: llama.cpp decode on Apple M2 Ultra moves ~444 GB/s of 800 GB/s and
#:   on M2 Max ~236 GB/s of 400 GB/s (data/measured_calibration.csv context rows
#:   M198 and M201: weight bytes x tokens/s).
#: - cpu memory 0.70: STREAM-like bandwidth on server DDR5 is ~70-80 % of the channel
#:   peak; compute 0.50 for AMX/AVX-512 GEMMs (first-order, not fitted).
#: - spatial: SRAM-resident, statically scheduled dataflow (deterministic, no launches):
#:   0.90 / 0.90, 1 us per operator (first-order, not fitted).
CLASS_PRIORS: dict[str, dict] = {
    "gpu": dict(compute=0.70, memory=0.90, op_overhead_s=5e-6, collective=0.80),
    "accelerator": dict(compute=0.70, memory=0.90, op_overhead_s=5e-6, collective=0.80),
    "pim": dict(compute=0.70, memory=0.90, op_overhead_s=5e-6, collective=0.80),
    "cpu": dict(compute=0.50, memory=0.70, op_overhead_s=2e-6, collective=0.80),
    "soc": dict(compute=0.60, memory=0.55, op_overhead_s=1e-5, collective=0.80),
    "spatial": dict(compute=0.90, memory=0.90, op_overhead_s=1e-6, collective=0.80),
}
#: classes without measurements of their own that take the calibrated values of another:
#: accelerators (TPU, Gaudi) and PIM hosts are HBM devices served by kernel-launching
#: software stacks like GPUs.
INHERITS = {"accelerator": "gpu", "pim": "gpu"}


def load_calibration(path: str | None = None) -> dict:
    """The calibration file ``path`` (default ``calibration_file()``) as a dict; DseError if it is
    missing or malformed (a missing calibration is never a silent fall back to the priors).

    Layout: ``classes: {<class>: {<parameter>: {value: NUMBER, note: ...}}}`` plus
    free-form sections (``fitted``, ``error``, ``cross_validation``, ``not_fitted``).
    Read again whenever the file changes."""
    p = Path(path) if path else calibration_file()
    try:
        st = p.stat()
    except OSError as e:
        hint = (f" (set by ${CALIBRATION_ENV})" if not path and os.environ.get(CALIBRATION_ENV) else
                "; reinstall the package (pip install --force-reinstall dse-llm) or use a complete checkout"
                if not path else "")
        raise DseError(f"{p}: cannot read the calibration file: {e.strerror or e}{hint}") from None
    return _load_calibration(str(p), st.st_mtime_ns, st.st_size)


load_calibration.cache_clear = lambda: _load_calibration.cache_clear()   # noqa: E731


@lru_cache(maxsize=8)
def _load_calibration(path: str, mtime_ns: int, size: int) -> dict:
    p = Path(path)
    data = load_yaml(p, "calibration file") or {}
    if not isinstance(data, dict) or not isinstance(data.get("classes", {}), dict):
        raise DseError(f"{p}: expected a mapping with 'classes: {{<class>: {{<parameter>: {{value: ...}}}}}}'")
    for cls, params in data.get("classes", {}).items():
        if cls not in CLASS_PRIORS:
            raise DseError(f"{p}: classes.{cls}: unknown hardware class; known: {', '.join(CLASS_PRIORS)}")
        if not isinstance(params, dict):
            raise DseError(f"{p}: classes.{cls}: expected a mapping of parameters")
        for k, v in params.items():
            if k not in PARAM_NAMES:
                raise DseError(f"{p}: classes.{cls}.{k}: unknown parameter; allowed: {', '.join(PARAM_NAMES)}")
            val = v.get("value") if isinstance(v, dict) else v
            if isinstance(val, str):
                raise DseError(f"{p}: classes.{cls}.{k}: expected {{value: NUMBER, note: ...}}, got {v!r}")
            as_number(val, f"{p}: classes.{cls}.{k}")
    return data


def _source_class(device_class: str, path: str | None = None) -> str | None:
    """The class whose calibrated values ``device_class`` uses (itself, the class it
    inherits from, or None when only priors apply)."""
    fitted = load_calibration(str(path) if path else None).get("classes", {})
    if fitted.get(device_class):
        return device_class
    parent = INHERITS.get(device_class)
    return parent if parent and fitted.get(parent) else None


def class_parameters(device_class: str, path: str | None = None) -> dict:
    """Parameters of a hardware class: its prior, overridden by the calibration file."""
    if device_class not in CLASS_PRIORS:
        raise DseError(f"no efficiency defaults for hardware class '{device_class}'; "
                       f"known: {', '.join(CLASS_PRIORS)}")
    out = dict(CLASS_PRIORS[device_class])
    src = _source_class(device_class, path)
    if src:
        for k, v in load_calibration(str(path) if path else None)["classes"][src].items():
            out[k] = float(v["value"] if isinstance(v, dict) else v)
    return out


def efficiency_for(device, path: str | None = None) -> Efficiency:
    """The default Efficiency of a device (or a hardware class name): its class's prior,
    replaced by the calibrated values of ``configs/calibration.yaml`` (or ``path``)
    where the file has them for the class or the class it inherits from."""
    cls = device if isinstance(device, str) else device.device_class
    src = _source_class(cls, path) if cls in CLASS_PRIORS else None
    name = f"prior {cls}" if not src else (f"calibrated {cls}" if src == cls else f"calibrated {src} (for {cls})")
    try:
        return Efficiency(name=name, **class_parameters(cls, path))
    except ValueError as e:
        raise DseError(f"{path or calibration_file()}: class {cls}: {e}") from None


def __getattr__(name: str):
    """``DEFAULT``: the calibrated gpu default, read when first asked for (so that a broken
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
