"""Context parallelism (CP) of a long prompt: ring attention over ``cp`` ranks, one formula each.

Sources: Liu, Zaharia and Abbeel, "Ring Attention with Blockwise Transformers for Near-Infinite
Context" (arXiv 2310.01889, 2023), Sec. 3: each of N hosts holds one block of the sequence's
queries; the key-value blocks rotate around the ring, N - 1 sends, each overlapped with the
blockwise attention of the block in hand (the transfer is hidden while the block's attention
compute takes longer than its K/V transfer). NVIDIA Megatron-Core's context parallelism
(docs.nvidia.com/megatron-core, "context parallel package", 2024): every rank holds 1/cp of the
sequence for every operator, the attention exchanges K/V around a ring, and the sequence is cut
into 2 x cp chunks with rank r holding chunks r and 2 cp - 1 - r so each rank computes the same
share of the causal mask (load balance).

In dse's operator tables (``workloads.optable``):
- prefill: each rank runs every non-attention operator on prompt_len / cp tokens; its attention
  computes 1/cp of the causal (query, key) pairs (the load-balanced chunking) against all the
  prompt's keys; the ring is one point-to-point operator ``cp_ring`` per layer and step, cp - 1
  steps, each sending one rank's K/V chunk (prompt_len / cp tokens in the KV format; MLA: the
  latent) to the next rank.
- decode: the KV cache is sharded over the cp ranks: each rank attends its 1/cp of the keys, and
  the partial outputs with their softmax statistics (a max and a sum per head) are gathered once
  a layer (``cp_ring``'s cp - 1 messages, ``decode_combine_elements``).

Overlap (Liu et al. Sec. 3): under FlashAttention each of the cp - 1 ring steps is one operator
(``cp_ring``, kind attention) carrying one chunk pair's attention and the send of one K/V chunk,
flagged ``overlaps_link``: the roofline kernel (``dse.core.operator_cost``, the one pricer) prices
it max(its roofline time, its link time) instead of their sum, so a layer's attention is
pair + (cp - 1) x max(pair, send) (``ring_step_s``), the fused attention operator keeping the
rank's own chunk pair. Unfused attention and sliding-window layers keep their sends beside the
attention (``ring_overlap_error_s`` says by how much that is high at most). A ring of cp x tp
devices larger than the scale-up domain sends over the scale-out NIC (``operator_cost.cp_spans``).
"""
from __future__ import annotations

import numpy as np


def ring_steps(cp) -> np.ndarray | int:
    """K/V sends of one layer's ring around ``cp`` ranks: cp - 1 (0 without CP)."""
    return np.maximum(np.asarray(cp) - 1, 0) if np.ndim(cp) else max(int(cp) - 1, 0)


def chunk_tokens(prompt_len, cp):
    """Query tokens one rank holds: prompt_len / cp (the load-balanced 2 x cp chunks, two a rank)."""
    return prompt_len / cp


def ring_send_elements(batch, prompt_len, cp, kv_elements_per_token: float, kv_bytes: float,
                       act_bytes: float):
    """One ring step's K/V chunk of one layer, in activation-format elements (the unit of an
    operator's ``p2p``): batch x prompt_len / cp tokens x the KV elements a token adds to one layer
    on one device, in the KV format's bytes."""
    return batch * chunk_tokens(prompt_len, cp) * kv_elements_per_token * kv_bytes / act_bytes


def decode_combine_elements(tokens, heads: float, v_dim: float, cp):
    """Elements one rank gathers per layer in a CP decode step: the other cp - 1 ranks' partial
    attention outputs (heads x v_dim per token) and their softmax statistics (a max and a sum per
    head); 0 without CP."""
    return tokens * heads * (v_dim + 2) * ring_steps(cp)


def ring_step_s(attention_step_s, transfer_s):
    """Seconds of one overlapped ring step (Liu et al. Sec. 3): max(the attention of one chunk
    pair, the transfer of one K/V chunk). Broadcasts."""
    return np.maximum(attention_step_s, transfer_s)


def ring_overlap_error_s(attention_step_s, transfer_s):
    """Seconds per ring step that pricing the transfer beside the attention (the kernel's sum)
    adds to the overlapped step (``ring_step_s``): min(attention, transfer). Broadcasts."""
    return np.minimum(attention_step_s, transfer_s)
