"""Scenario: how a model is run (batch, lengths, formats, attention kernel, split)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from basis.errors import DseError
from hwmodels.formats import DataFormat, get_format
from workloads.techniques import NONE, Techniques

#: the fields of a Scenario that may vary per workload (integer arrays of one shape)
WORKLOAD_DIMS = ("batch", "prompt_len", "gen_len")


def _whole(x):
    """A 0-d integer as a Python int, an array as is."""
    return int(x) if np.ndim(x) == 0 else x


@dataclass(frozen=True)
class Scenario:
    """One serving scenario.

    batch: sequences processed together; prompt_len: tokens per prompt (prefill);
    gen_len: tokens generated per sequence (the first comes out of the prefill);
    weights/activations/kv: data formats of each tensor class;
    flash_attention: one fused attention operator instead of qk/softmax/sv;
    tp: tensor-parallel degree (the operator table is per device);
    pp: pipeline-parallel stages;
    ep: expert-parallel groups (MoE): each group of tp x pp devices serves
        ceil(batch / ep) sequences with its own copy of the dense weights and holds
        1/ep of the routed experts;
    cp: context-parallel ranks (``workloads.context_parallel``): each holds 1/cp of a prompt's tokens
        in the prefill (ring attention) and 1/cp of the KV cache in the decode, the weights
        replicated; devices = tp x pp x ep x cp.
    techniques: sparsity, contextual sparsity, early exit, a KV budget, query tokens per decode
        step (``workloads.techniques``).

    ``batch``, ``prompt_len`` and ``gen_len`` may be integer arrays of one shape (``WORKLOAD_DIMS``):
    one entry per workload, every other field shared. The operator tables and footprints built
    from such a scenario have one row per workload (``many``), by the same formulas.
    """

    batch: int = 1
    prompt_len: int = 512
    gen_len: int = 128
    weights: DataFormat = get_format("fp16")
    activations: DataFormat = get_format("fp16")
    kv: DataFormat = get_format("fp16")
    flash_attention: bool = False
    tp: int = 1
    pp: int = 1
    ep: int = 1
    techniques: Techniques = NONE
    cp: int = 1

    @property
    def devices(self) -> int:
        return self.tp * self.pp * self.ep * self.cp

    @property
    def many(self) -> bool:
        """True when batch, prompt_len and gen_len are arrays (one entry per workload)."""
        return isinstance(self.batch, np.ndarray)

    @cached_property
    def group_batch(self):
        """Sequences one expert-parallel group serves: ceil(batch / ep) (worked out once per
        scenario: a sweep's has one batch per point)."""
        return self.batch if isinstance(self.ep, int) and self.ep == 1 else -(-self.batch // self.ep)

    @cached_property
    def micro_batches(self):
        """Micro-batches in flight through a group's pipeline: min(group batch, pp)."""
        return _whole(np.minimum(self.group_batch, self.pp))

    @cached_property
    def micro_batch(self):
        """Sequences per micro-batch: ceil(group batch / micro_batches)."""
        return -(-self.group_batch // self.micro_batches)

    def take(self, rows) -> "Scenario":
        """The workloads ``rows`` (a slice or index array) of a scenario of many."""
        return replace(self, **{k: getattr(self, k)[rows] for k in WORKLOAD_DIMS})

    def __post_init__(self):
        arrays = [k for k in WORKLOAD_DIMS if isinstance(getattr(self, k), np.ndarray)]
        if arrays and len(arrays) != len(WORKLOAD_DIMS):
            raise DseError(f"{', '.join(WORKLOAD_DIMS)}: give all as arrays (one entry per workload) or none")
        for key in ("batch", "prompt_len", "gen_len", "tp", "pp", "ep", "cp"):
            v = getattr(self, key)
            if key in arrays:
                if v.dtype.kind not in "iu" or v.shape != self.batch.shape or not np.all(v > 0):
                    raise DseError(f"{key.replace('_', '-')} must be positive integers, one per workload")
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise DseError(f"{key.replace('_', '-')} must be a positive integer, got {v!r}")

    @classmethod
    def make(cls, *, weights="fp16", activations="fp16", kv="fp16", **kw) -> "Scenario":
        """Build a Scenario from format names (validated)."""
        return cls(weights=get_format(weights, "weights format"),
                   activations=get_format(activations, "activations format"),
                   kv=get_format(kv, "kv format"), **kw)
