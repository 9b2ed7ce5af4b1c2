"""Spatial / LPU / wafer-scale hardware priced as compiler-scheduled dataflow.

A spatial machine (Groq TSP, Cerebras WSE, SambaNova RDU: the device classes whose
``hwmodels.classes.DeviceClass.dataflow`` is set) runs a model as one statically scheduled
program: the compiler lays the layers out over the chips' functional units and SRAM, and a
token streams through them. There are no kernel launches, no per-operator host work and no
serving-engine scheduler between operators, so none of the GPU engine layer's costs
(``dse.core.engines``: launch per operator, all-reduce software latency, scheduler time per
step and per request) applies. What a token costs is, summed over the pipeline of chips that
hold its layers (the operator tables are the whole model's pass, ``workloads.optable``):

    time per token = Σ_operators max(ops / (peak x compute fraction),
                                     bytes / (SRAM or HBM bandwidth x memory fraction))
                     + Σ_tp all-reduces (2 (tp - 1) / tp x bytes / link bandwidth + 2 (tp - 1) x hop latency)
                     + (pp - 1) x (hop latency + activation bytes / link bandwidth)
                     + layers x layer latency

The first three terms are the roofline kernel's own (``dse.core.roofline``; both of its
paths, so the reference and the speed layer agree by construction), run with the family's
achieved fractions (``dse.core.efficiency.FAMILY_PRIORS``) and zero software latencies; the
link latencies are the preset's chip-to-chip hop latency (``interconnect.latency_s``). The
last is the dataflow pipeline's own latency: a token crosses each decoder layer's stage of
the program (its chain of dependent units, on-chip reductions and synchronisation) in a fixed
time that more bandwidth does not shorten. No architecture paper gives it, so it is fitted
per family on the vendor's own published tokens/s per user (``LAYER_LATENCY_S``, the rows in
``data/gathered/spatial.csv``) and is zero for a family without usable rows. It is paid once
per layer per pass, never per operator: fusing or splitting operators does not change it.
"""
from __future__ import annotations

from dataclasses import replace

from dse.core.efficiency import Efficiency

#: Dataflow pipeline latency of one decoder layer, seconds, per hardware family, fitted on the
#: vendor's published batch-1 tokens/s per user (rows of data/gathered/spatial.csv). The fit: for
#: each row, (1 / tokens_per_s - this model's time per token with no layer latency) / layers (at the
#: stated formats, prompt 512 and 256 generated tokens, chips sized by capacity), then the geometric
#: mean of the family's rows; a family with no usable row has none:
#: - groq 41.16e-6: S001 Llama-2-70B 300 tok/s (80 layers, 41.09 us) and S002 Llama-2-7B 750 tok/s
#:   (32 layers, 41.22 us), techpowerup.com (2024 news item).
#: - cerebras 21.9e-6: S003 Llama-3.1-8B 1,800 tok/s (32 layers, 17.34 us) and S004 Llama-3.1-70B
#:   450 tok/s (80 layers, 27.68 us), Cerebras blog 2024-08-27, 16-bit weights. S005 (405B, 969
#:   tok/s, 2024-11) is a later software release and stays out of the fit (it gives 7.8 us).
#: - sambanova: none (no usable row; data/gathered/spatial_SOURCES.md says why).
LAYER_LATENCY_S: dict[str, float] = {
    "groq": 41.16e-6,
    "cerebras": 21.9e-6,
}


def layer_latency_s(family: str) -> float:
    """The dataflow pipeline latency of one decoder layer of ``family``, seconds (0 if none)."""
    return LAYER_LATENCY_S.get(family, 0.0)


def decoder_layers(tables) -> int:
    """The decoder layers one pass of ``tables`` (``dse.system.workload.WorkloadTables`` or
    ``WorkloadBatch``) runs: its model's, or the instances of the per-layer 'attn_norm'."""
    model = getattr(tables, "model", None)
    if model is not None:
        return int(model.num_layers)
    return int(next(op.count for op in tables.prefill_table.operators if op.name == "attn_norm"))


def dataflow_efficiency(base: Efficiency, layers: int, family: str) -> Efficiency:
    """The Efficiency of a compiler-scheduled dataflow run of ``layers`` decoder layers on a
    ``family`` machine whose achieved fractions are ``base``'s: no launch per operator, no
    all-reduce software latency, no per-request cost, and as its only fixed time per step (one
    token of every sequence through the whole pipeline) ``layers`` x ``layer_latency_s(family)``
    seconds (its name says so, as analyze's per-operator table leaves a step's fixed time out). The
    ideal bound stays the ideal bound."""
    if base.name == "ideal":
        return base
    latency = layer_latency_s(family)
    said = f" ({layers} layers x {latency * 1e6:.4g} us a pass)" if latency else ""
    return replace(base, name=f"{base.name} dataflow{said}", op_overhead_s=0.0, collective_latency_s=0.0,
                   request_overhead_s=0.0, step_overhead_s=layers * latency,
                   attention_kv_reads=1.0)
