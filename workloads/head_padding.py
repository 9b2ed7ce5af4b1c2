"""Attention heads padded to the cores that tensor parallelism shards them over (AWS Neuron).

Most engines refuse a tensor-parallel degree that does not divide a model's attention heads
(vLLM, TensorRT-LLM, SGLang: ``workloads.optable`` says so). AWS Neuron's libraries
(transformers-neuronx, NxD Inference, optimum-neuron) pad instead, and shard over NeuronCores (their
``tp_degree`` counts cores, two per Inferentia2 or Trainium1 chip). Their rule
(transformers-neuronx / optimum-neuron ``get_qkv_padding``, GQA sharding ``REPLICATED_HEADS``):

- the query heads are rounded up to a multiple of the cores, q' = ceil(q / S) S; the padded heads
  are zero weights in q_proj and o_proj, stored, read and multiplied like the model's own;
- key/value heads: a multi-head model's are padded as its queries (its fused QKV is one width);
  grouped ones that the cores divide are sharded as they are; otherwise they are replicated: to one
  a core (S in all) where the cores are a multiple of them and the padding keeps whole groups
  (q divisible by S, or q' - q a multiple of kv), to kv where each core's queries are one group
  (q' / S = q / kv), else fully (one a query head, kv' = q'); never fewer than S.

A padded model is the model with q' query and kv' key/value heads of the same head size (the
hidden size unchanged): its operator tables, KV cache and weights follow from it as from any model.
"""
from __future__ import annotations

from dataclasses import replace

from workloads.model import ModelSpec


def padded_heads(heads: int, kv_heads: int, shards: int) -> tuple[int, int]:
    """(query heads, key/value heads) after padding ``heads`` and ``kv_heads`` for ``shards``
    cores (the rule above); as they are where the cores divide both."""
    if shards <= 1:
        return heads, kv_heads
    q = -(-heads // shards) * shards
    if kv_heads == heads:                       # multi-head: K and V padded with Q
        return q, q
    if kv_heads % shards == 0:                  # sharded over heads as they are
        return q, kv_heads
    ratio = heads // kv_heads                   # full replication: one K/V head a query head
    whole_groups = heads % shards == 0 or (q > heads and (q - heads) % kv_heads == 0)
    if kv_heads < shards and shards % kv_heads == 0 and whole_groups:
        ratio = shards // kv_heads              # one a core
    elif q // shards == heads // kv_heads:
        ratio = 1                               # each core's queries are one group
    kv = max(kv_heads * ratio, shards)
    return q, q if kv == heads else kv


def padded_model(m: ModelSpec, shards: int) -> ModelSpec:
    """``m`` with its attention heads padded for ``shards`` cores (``padded_heads``; ``padding_note`` says
    so in words); ``m`` itself
    where nothing is padded or its attention is not plain multi-/grouped-query attention (MLA,
    linear attention: no padding rule is published for them)."""
    if m.is_mla or m.num_heads <= 0 or m.num_kv_heads <= 0:
        return m
    q, kv = padded_heads(m.num_heads, m.num_kv_heads, shards)
    if (q, kv) == (m.num_heads, m.num_kv_heads):
        return m
    return replace(m, num_heads=q, num_kv_heads=kv, padding_note=f"attention heads padded for {shards} cores: "
                   f"{m.num_heads} -> {q} query, {m.num_kv_heads} -> {kv} key/value")
