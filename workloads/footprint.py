"""Memory footprint: parameters, KV cache and peak live activations, per device."""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import numpy as np

from workloads.model import RECURRENT_KINDS, ModelSpec, qk_norm_weights
from workloads.optable import (
    STREAM_OPS,
    OpTable,
    kv_elems_per_token_per_layer,
    kv_heads_per_device,
    predictor_parameter_count,
    prefill,
    residual_bytes_per_token,
)
from workloads.scenario import Scenario
from workloads.vision import parameter_count as vision_parameter_count


def parameter_count(m: ModelSpec, tp: int = 1, pp: int = 1, ep: int = 1) -> float:
    """Parameters (elements) one device holds under ``tp``-way tensor, ``pp``-stage
    pipeline (the largest stage: its share of the layers plus the embedding or the
    head) and ``ep``-group expert parallelism (1/ep of the routed experts, the rest
    replicated); with tp=pp=ep=1 the model's total parameter count.
    Split over TP: heads, MLP and expert width, vocabulary. Replicated: norms, router,
    MLA down-projections."""
    h, d = m.hidden_size, m.head_dim
    ln = m.norm_weights_per_element
    emb, head, final = _outer_parameters(m, tp)

    norms = m.norms_per_block * ln * h
    nh = m.num_heads / tp
    if m.is_mla:
        dn, dr, dv, rkv, rq = m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim, m.kv_lora_rank, m.q_lora_rank
        attn = (h * rq + rq + rq * nh * (dn + dr)) if rq else h * nh * (dn + dr)
        attn += h * (rkv + dr) + rkv + rkv * nh * (dn + dv) + nh * dv * h + indexer_parameter_count(m)
    else:
        nkv = kv_heads_per_device(m, tp)
        qkv = h * (nh + 2 * nkv) * d + ((nh + 2 * nkv) * d if m.attention_bias else 0)
        attn = qkv + nh * d * h + (h if m.o_proj_bias else 0) + qk_norm_weights(m, nh, nkv)
        attn += h * nh * d if m.attn_output_gate else 0     # the output gate's half of q_proj
        attn += nh if m.attention_sinks else 0              # one sink logit a head (gpt-oss)
    mats = 3 if m.mlp_gated else 2

    def mlp(width):
        return mats * h * width + ((mats - 1) * width + h if m.mlp_bias else 0)

    dense_block = norms + attn + mlp(m.intermediate_size / tp)
    total = emb + head + final + m.num_dense_layers * dense_block
    if m.is_hybrid:     # each layer's own parts: a norm and its mixer, a norm and its FFN
        total = (emb + head + final + (m.num_mixer_layers + m.num_ffn_layers) * ln * h
                 + m.num_attention_layers * attn + m.num_recurrent_layers * recurrent_parameter_count(m, tp)
                 + m.num_dense_layers * mlp(m.intermediate_size / tp))
        norms = attn = 0.0                                  # the MoE layers' below: their FFN only
    if m.is_moe:
        router = h * m.num_experts + (m.num_experts if m.router_bias else 0) + (h if m.shared_expert_gate else 0)
        experts = m.num_experts / ep * expert_parameter_count(m, tp)
        shared = mats * h * m.shared_expert_intermediate_size / tp
        total += m.num_moe_layers * (norms + attn + router + experts + shared)
    total += draft_input_parameter_count(m)
    if pp == 1:
        return total
    layers = total - emb - head - final
    return layers / pp + max(emb, head + final)


def indexer_parameter_count(m: ModelSpec) -> float:
    """Parameters (elements, replicated over TP) of one layer's lightning indexer (DeepSeek-V3.2):
    query (q_lora_rank -> heads x head size), key (hidden -> head size) and its LayerNorm, per-head
    weights (hidden -> heads); 0 for dense attention."""
    hi, di = m.index_n_heads, m.index_head_dim
    return m.q_lora_rank * hi * di + m.hidden_size * di + 2 * di + m.hidden_size * hi if m.is_sparse_attention else 0


def recurrent_parameter_count(m: ModelSpec, tp: int = 1) -> float:
    """Parameters (elements per device) of one recurrent layer's mixer (``workloads.optable``'s
    ``recurrent``): in_proj (Gated DeltaNet: q, k, v, z and beta, alpha a head; Mamba-2: z, x, B,
    C and dt a head), the depthwise conv (and its bias), the per-head decay and step (and Mamba-2's
    D), the gated norm (GDN: a head's width; Mamba-2: every head's) and out_proj; heads and groups
    split over ``tp``. Mamba-1 (Jamba): in_proj to x and z, the conv over x (and its bias), x_proj
    to dt's rank and B, C, their three RMSNorms, dt_proj (and its bias), A (d_inner x N), D and
    out_proj; d_inner split over ``tp`` (x_proj's outputs and the norms replicated)."""
    h, gdn = m.hidden_size, m.recurrent_kind == "gdn"
    if m.recurrent_kind == "mamba1":
        d, r, n = m.ssm_heads / tp, m.ssm_dt_rank, m.ssm_state_dim
        return (h * 2 * d + d * m.ssm_conv_kernel + (d if m.ssm_conv_bias else 0) + d * (r + 2 * n) + (r + 2 * n)
                + r * d + d + d * n + d + d * h)
    hp = m.ssm_heads * m.ssm_head_dim / tp
    conv = hp + 2 * m.ssm_groups * m.ssm_state_dim / tp
    heads = m.ssm_heads / tp
    return (h * (conv + hp + (2 if gdn else 1) * heads) + conv * m.ssm_conv_kernel + (conv if m.ssm_conv_bias else 0)
            + (2 if gdn else 3) * heads + (m.ssm_head_dim if gdn else hp) + hp * h)


def state_bytes_per_sequence(m: ModelSpec, sc: Scenario) -> float:
    """Bytes of recurrent state one sequence holds on one device, whatever its context: each
    recurrent layer's conv state (the last K - 1 inputs of its channels) and scan state (H x P x N,
    in float32 where the config fixes it), in the activations' format (the model's dtype, as vLLM's
    mamba cache dtype "auto" keeps them), heads split over
    tp; under pipeline parallelism, the stage holding the most recurrent layers. 0 for a model
    without recurrent layers."""
    if not m.num_recurrent_layers:
        return 0.0
    layers = _most_per_stage(m, sc.pp, RECURRENT_KINDS)
    scan = m.ssm_state_elems / sc.tp * (m.ssm_state_bytes or sc.activations.bytes)
    conv = m.ssm_conv_state_elems / sc.tp * sc.activations.bytes
    return layers * (scan + conv)


def _most_per_stage(m: ModelSpec, pp: int, kinds: tuple) -> int:
    """The most layers of mixer ``kinds`` any of ``pp`` pipeline stages holds (layers split evenly)."""
    per_stage = m.num_layers // pp
    of = np.array([k in kinds for k in m.layer_mixers[:per_stage * pp]], dtype=bool)
    return int(of.reshape(pp, per_stage).sum(axis=1).max())


def expert_parameter_count(m: ModelSpec, tp: int = 1) -> float:
    """Parameters (elements per device) of one routed expert: its projections (width split
    over ``tp``) and their biases where the model has them."""
    h, w, mats = m.hidden_size, m.moe_intermediate_size / tp, 3 if m.mlp_gated else 2
    return mats * h * w + ((mats - 1) * w + h if m.mlp_bias else 0)


def draft_input_parameter_count(m: ModelSpec) -> float:
    """Parameters (elements, replicated over TP) of a native draft head's input projection
    (``ModelSpec.draft_head``): 2h x h, and an MTP module's two RMSNorms (2h); 0 for a model."""
    h = m.hidden_size
    return 0.0 if not m.draft_head else 2 * h * h + (2 * h if m.draft_head == "mtp" else 0)


def _outer_parameters(m: ModelSpec, tp: int = 1) -> tuple[float, float, float]:
    """Parameters (elements per device) outside the layers: embedding, head, final norm (a native
    draft head's embedding and head are the target's: 0)."""
    h = m.hidden_size
    ln = m.norm_weights_per_element
    vocab = 0.0 if m.draft_head else m.vocab_size * h / tp
    emb = vocab + m.position_embeddings * h + (ln * h if m.embedding_norm else 0)
    head = 0.0 if m.tie_word_embeddings else vocab + (m.vocab_size / tp if m.lm_head_bias else 0)
    final = ln * h if m.final_norm else 0
    return emb, head, final


def layer_parameter_count(m: ModelSpec, tp: int = 1) -> float:
    """Parameters (elements per device) of all the layers together, under ``tp``."""
    return parameter_count(m, tp) - sum(_outer_parameters(m, tp))


def active_parameter_count(m: ModelSpec) -> float:
    """Parameters one token uses (MoE: top-k routed plus shared experts)."""
    if not m.is_moe:
        return parameter_count(m)
    unused = (m.num_experts - m.experts_per_token) * expert_parameter_count(m)
    return parameter_count(m) - m.num_moe_layers * unused


def kv_cache_bytes_per_token(m: ModelSpec, sc: Scenario) -> float:
    """KV-cache bytes one token occupies on one device, over the layers it holds (every
    attention layer's, before any sliding window is full; a hybrid's recurrent layers hold none)."""
    layers = _most_per_stage(m, sc.pp, ("attention",)) if m.is_hybrid else m.num_layers // sc.pp
    return layers * kv_elems_per_token_per_layer(m, sc.tp) * sc.kv.bytes


def kv_cache_bytes_per_sequence(m: ModelSpec, sc: Scenario, context: int | None = None) -> float:
    """KV-cache bytes one sequence of ``context`` tokens (default: prompt_len + gen_len) holds on
    one device: a full-attention layer caches every token, a sliding-window layer the last
    min(context, sliding_window), as engines allocate it (vLLM's sliding-window KV manager,
    transformers' hybrid cache); under a KV token budget k no layer more than k tokens; a hybrid's
    recurrent layers none (``state_bytes_per_sequence``). Under pipeline parallelism, the stage
    holding the most full-attention layers; under context parallelism (``cp``) a rank's 1/cp of
    the tokens (the cache sharded over the ring)."""
    tokens = sc.prompt_len + sc.gen_len if context is None else context
    per_stage = m.num_layers // sc.pp
    sliding = np.zeros(m.num_layers, dtype=bool)
    sliding[list(m.sliding_layers)] = True
    caching = (np.array([k == "attention" for k in m.layer_mixers], dtype=bool) if m.is_hybrid
               else np.ones(m.num_layers, dtype=bool))
    stages = slice(0, per_stage * sc.pp)
    full = (caching & ~sliding)[stages].reshape(sc.pp, per_stage).sum(axis=1)
    windowed = (caching & sliding)[stages].reshape(sc.pp, per_stage).sum(axis=1)
    budget = sc.techniques.kv_budget or tokens          # a KV token budget caps every layer's cache
    held = np.minimum(tokens, budget), np.minimum(np.minimum(tokens, m.sliding_window or tokens), budget)
    cached = functools.reduce(np.maximum, (int(f) * held[0] + int(w) * held[1] for f, w in zip(full, windowed)))
    return cached * kv_elems_per_token_per_layer(m, sc.tp) * sc.kv.bytes / sc.cp


@dataclass(frozen=True)
class Footprint:
    """Bytes one device holds."""

    weights_bytes: float
    kv_cache_bytes: float        # and activation_bytes: one per workload for a Scenario of many
    activation_bytes: float
    state_bytes: float = 0.0     # recurrent layers' state of the batch's sequences (constant in context)

    @property
    def total_bytes(self) -> float:
        return self.weights_bytes + self.kv_cache_bytes + self.activation_bytes + self.state_bytes


def beside_stream(table: OpTable) -> np.ndarray:
    """[O] bools: whether the residual stream is live beside each operator of ``table`` as well as its
    own inputs and outputs (every operator but those that read or write it, ``optable.STREAM_OPS``)."""
    return np.array([op.name not in STREAM_OPS for op in table.operators], dtype=bool)


def live_bytes(table: OpTable, residual=0.0):
    """The live activation bytes of each operator of a step, in order (an iterator: bytes, one
    instance): its inputs and outputs, plus ``residual`` (bytes of the residual stream kept alive
    beside it: a number, or one per workload) where it is not one of the stream's operands
    (``beside_stream``); one per workload for a table of many (``Scenario.many``)."""
    m_act = table.activations.bytes
    return ((op.act_in + op.act_out) * m_act + (residual if beside else 0.0)
            for op, beside in zip(table.operators, beside_stream(table)))


def peak_activation_bytes(table: OpTable, residual=0.0):
    """Largest live activation set of a step (bytes, one instance): the largest of ``live_bytes``;
    one per workload for a table of many (``Scenario.many``)."""
    if not table.operators:
        return 0.0
    # the running maximum over operators: no [W, O] table of many workloads' live sets is stacked
    peak = functools.reduce(np.maximum, live_bytes(table, residual))
    return float(peak) if np.ndim(peak) == 0 else peak


def stream_bytes(m: ModelSpec, table: OpTable):
    """Bytes of the residual stream one device holds through a step of ``m``: the tokens it holds of
    it (``OpTable.residual_tokens``: 1/tp of them with sequence-parallel activations) x
    ``residual_bytes_per_token``."""
    return table.residual_tokens * residual_bytes_per_token(m, table.activations)


def step_activation_bytes(m: ModelSpec, table: OpTable):
    """Largest live activation set of one step of ``m`` (bytes per device, one instance; one per
    workload for a table of many): ``peak_activation_bytes`` with the step's ``stream_bytes`` beside
    every operator that is not one of its operands."""
    return peak_activation_bytes(table, stream_bytes(m, table))


def chunk_activation_bytes(m: ModelSpec, sc: Scenario, chunk: int, buffer: float = 0.0, keys=None):
    """Peak live activation bytes per device of one prefill iteration of ``chunk`` prompt tokens
    (an engine that prefills in chunks: a long prompt, or a batch of prompts, a chunk at a time),
    its queries attending ``keys`` keys each (default ``chunk``: the prefix of a chunk of a longer
    prompt; an array gives one figure per workload): the largest live set of its operators, the
    chunk's residual stream beside those that do not read or write it themselves
    (``step_activation_bytes``). An unfused score
    matrix is chunk x keys per head; fused attention streams the prefix's K/V through the on-chip
    buffer, so its live set is the chunk's own whatever ``keys``."""
    one = replace(sc, batch=1, prompt_len=int(chunk), gen_len=1)
    return step_activation_bytes(m, prefill(m, one, buffer, keys=None if sc.flash_attention else keys))


def footprint(m: ModelSpec, sc: Scenario, prefill_table: OpTable, decode_table: OpTable) -> Footprint:
    """Footprint of serving ``sc`` on one device: weights, KV cache for its group's batch
    x (prompt + generated) tokens, the recurrent layers' state of its sequences, and the peak live activations of the prefill or decode step
    (the tables are of one micro-batch)."""
    act = np.maximum(step_activation_bytes(m, prefill_table), step_activation_bytes(m, decode_table))
    act = float(act) if np.ndim(act) == 0 else act
    kv = sc.group_batch * kv_cache_bytes_per_sequence(m, sc)
    return Footprint(weight_bytes(m, sc), kv, act, sc.group_batch * state_bytes_per_sequence(m, sc))


def weight_bytes(m: ModelSpec, sc: Scenario) -> float:
    """Bytes of the weights one device holds: its parameters in the weights format, the layers'
    stored compressed under weight sparsity (``Techniques.weight_storage_factor``; norms and
    biases with them, a negligible share) and with their first and last layer at their own bits,
    plus Deja Vu's predictors under contextual sparsity and the replicas of redundant experts, and a
    vision-language model's vision tower where its requests carry images (its blocks split over tp,
    the rest replicated; a text-only deployment does not load it, as vLLM skips the tower when every
    modality's limit per prompt is 0)."""
    t = sc.techniques
    total = parameter_count(m, sc.tp, sc.pp, sc.ep)
    layers = (parameter_count(m, sc.tp, 1, sc.ep) - sum(_outer_parameters(m, sc.tp))) / sc.pp
    stored = total - layers + layers * t.layer_weight_factor(sc.weights.bits, m.num_layers)
    if t.activation_density < 1.0:
        stored += m.num_layers / sc.pp * predictor_parameter_count(m, sc.tp)
    if m.is_moe and t.routing.redundant:               # EPLB's replicas: (E + r)/ep experts a rank
        stored += m.num_moe_layers / sc.pp * t.routing.redundant / sc.ep * expert_parameter_count(m, sc.tp)
    if m.vision is not None and m.vision.active:      # the tower, loaded where requests carry images
        v = m.vision
        rest = vision_parameter_count(replace(v, depth=0))       # patch embedding, positions, projector
        stored += rest + (vision_parameter_count(v) - rest) / sc.tp
    return stored * sc.weights.bytes

