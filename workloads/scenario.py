"""Scenario: how a model is run (batch, lengths, formats, attention kernel, split)."""
from __future__ import annotations

from dataclasses import dataclass

from dse.errors import DseError
from hwmodels.formats import DataFormat, get_format


@dataclass(frozen=True)
class Scenario:
    """One serving scenario.

    batch: sequences processed together; prompt_len: tokens per prompt (prefill);
    gen_len: tokens generated per sequence (the first comes out of the prefill);
    weights/activations/kv: data formats of each tensor class;
    flash_attention: one fused attention operator instead of qk/softmax/sv;
    tp: tensor-parallel degree (the operator table is per device).
    """

    batch: int = 1
    prompt_len: int = 512
    gen_len: int = 128
    weights: DataFormat = get_format("fp16")
    activations: DataFormat = get_format("fp16")
    kv: DataFormat = get_format("fp16")
    flash_attention: bool = False
    tp: int = 1

    def __post_init__(self):
        for key in ("batch", "prompt_len", "gen_len", "tp"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise DseError(f"{key.replace('_', '-')} must be a positive integer, got {v!r}")

    @classmethod
    def make(cls, *, weights="fp16", activations="fp16", kv="fp16", **kw) -> "Scenario":
        """Build a Scenario from format names (validated)."""
        return cls(weights=get_format(weights, "weights format"),
                   activations=get_format(activations, "activations format"),
                   kv=get_format(kv, "kv format"), **kw)
