"""Efficiency model on top of the ideal roofline.

The ideal roofline (``IDEAL``) is an upper bound: every operator at full peak and
full bandwidth with no overheads. ``DEFAULT`` derates it with achievable fractions
and fixed overheads. These defaults are provisional first-order figures until the
calibration issue fits them to measured results:

- memory 0.90: memory-streaming microbenchmarks reach ~90 % of peak HBM bandwidth
  (../shared/DESIGN.md, "Facts measured").
- compute 0.70: large GEMMs on tensor cores typically sustain 60-80 % of dense
  peak; 0.70 is the midpoint, not a fitted value.
- op_overhead_s 5e-6: one kernel launch per operator instance (a few microseconds
  on current GPUs); not yet fitted.
- step_overhead_s 0: per-step scheduling and sampling, left for calibration.
- collective 0.80: fraction of link bandwidth a ring all-reduce achieves; not yet fitted.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Efficiency:
    """Achievable fractions of peak (0, 1] and fixed overheads in seconds."""

    compute: float = 0.70
    memory: float = 0.90
    op_overhead_s: float = 5e-6
    step_overhead_s: float = 0.0
    collective: float = 0.80
    name: str = "default"

    def compute_fraction(self, op):
        """Achievable fraction of peak compute per operator of ``op`` (an OpArrays):
        an array broadcastable to its operators, in (0, 1]."""
        return self.compute

    def memory_fraction(self, op):
        """Achievable fraction of memory bandwidth per operator of ``op``, in (0, 1]."""
        return self.memory

    def __post_init__(self):
        for k in ("compute", "memory", "collective"):
            v = getattr(self, k)
            if not 0 < v <= 1:
                raise ValueError(f"efficiency '{k}' must be in (0, 1], got {v}")
        for k in ("op_overhead_s", "step_overhead_s"):
            if getattr(self, k) < 0:
                raise ValueError(f"efficiency '{k}' must not be negative")


IDEAL = Efficiency(1.0, 1.0, 0.0, 0.0, 1.0, name="ideal")
DEFAULT = Efficiency()
