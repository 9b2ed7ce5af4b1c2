"""Operator tables of a prefill and of one decode step.

Each operator carries element counts per tensor class (weights read, activations
read and written, KV cache read and written, collective traffic) for one
instance, and ``count``, the number of instances in the step (e.g. one per
layer). Bytes follow from the scenario's data formats, so weights, activations
and KV each carry their own format. A multiply-accumulate counts as 2 ops.

Conventions (documented so a reader can check them):
- Element-wise op counts: RMSNorm 4/element (square, accumulate, scale, gain),
  LayerNorm 7/element, softmax 5/element (max, subtract, exp, sum, divide),
  SiLU-gated activation 5/element, GeLU 8/element, ReLU 1/element, add 1/element.
- Non-fused attention materialises the full S x S score matrix (masking, causal or
  sliding-window, is part of softmax); FlashAttention skips fully masked blocks (causal:
  S(S+1)/2 pairs) and re-reads K and V once per block of query rows, the block height
  following FlashAttention's tiling rule Br = min(M / (4 d), d) for an on-chip buffer of M
  elements.
- Sliding-window layers (window W; ``sliding_*`` operators, one instance per such layer): a
  query attends to the last W keys. A decode step reads min(L, W) cached keys per layer;
  FlashAttention's prefill computes sum_i min(i, W) pairs and a block of query rows reads
  only the keys inside the window of its rows. So a decode step's counts are affine in the
  context L up to W and constant after it (``decode_pieces``).
- Qwen3 / Gemma 3 normalise every query and key head (``qk_norm``, an RMSNorm over head_dim).
- Prefill computes the logits of the last position of each sequence only.
- Weight-only quantization (weights narrower than the class their matmul computes in, e.g.
  W4A16): each weight element read is dequantized once a step, 2 vector ops (convert, scale).
- A decode step attends to ``kv_len`` keys, reads them from the KV cache and
  writes the new token's K and V.
- MoE layers read the weights of the expected number of distinct experts the
  step's tokens touch under uniform top-k routing: E (1 - (1 - k/E)^T). The router also
  computes a shared expert's sigmoid gate (Qwen-MoE) and adds router and expert biases
  where the model has them (gpt-oss).
- MLA (DeepSeek): prefill decompresses the latent into per-head K and V
  (kv_b_proj); decode uses the absorbed form and attends over the latent.
- Tensor parallel over ``tp`` devices splits heads, MLP width, experts' width and
  the vocabulary; norms, adds, the router and MLA's down-projections are
  replicated; each block adds two all-reduces of the hidden state (one for
  parallel attention+MLP blocks). RoPE and bias adds are fused into neighbours.
- Pipeline parallel over ``pp`` stages: the table is the whole model's pass for one
  micro-batch (the stages run it in turn) plus ``pp - 1`` hops of the hidden state.
- Expert parallel over ``ep`` groups (MoE): the table is one group's, whose ``batch``
  sequences are its share; the group holds E/ep routed experts and receives, under
  uniform routing, as many routed tokens as its own sequences produce (T k). The
  expected distinct experts it reads are (E/ep)(1 - (1 - k/E)^(T ep)). Per MoE layer a
  dispatch and a combine all-to-all each send T k h (ep - 1)/ep elements out of the
  group, split over its tp devices (costed as point-to-point traffic per device).
- Context parallel over ``cp`` ranks (``workloads.context_parallel``, ring attention): in the
  prefill each rank runs every operator on ceil(prompt_len / cp) of each prompt's tokens, its
  attention computing 1/cp of the causal pairs (load-balanced chunks) against all the prompt's
  keys, and per layer cp - 1 ring steps (``cp_ring``) each send one K/V chunk (MLA: the latent)
  to the next rank. In a decode step each rank attends its 1/cp of the cached keys and gathers
  the others' partial outputs and softmax statistics (``cp_ring`` too: cp - 1 messages a layer).
- MoE routing other than uniform (``Techniques.routing``, ``workloads.routing``: a Zipf skew, a
  measured histogram, redundant experts, a capacity factor): the expert matmuls and the dispatch and
  combine are the busiest rank's, T ep k x its share of the kept token-slots (T k x imbalance x
  (1 - dropped)), the busiest rank receiving (dispatch) and sending back (combine) its tokens; the
  weights read are the most distinct experts (replicas) any rank's tokens touch. Shared experts stay
  balanced.
- Recurrent layers of hybrid models (``ModelSpec.layer_mixers``: Gated DeltaNet, Yang et al.,
  ICLR 2025; Mamba-2, Dao & Gu, ICML 2024), H value heads of width P, G groups of N-wide keys
  (GDN) or B and C (Mamba-2), a depthwise causal conv of K taps over the x/q/k/v and B/C channels:
  ``ssm_in_proj`` and ``ssm_out_proj`` matmuls; ``ssm_conv`` (2 K ops a channel a token) whose
  last K - 1 inputs are the conv state; ``ssm_scan``, the recurrence over an H x P x N state; and
  ``ssm_gate_norm`` (the output's RMSNorm gated by SiLU(z)). A decode step reads and writes each
  sequence's conv and scan state once (``kv_in``/``kv_out``, in KV-format element equivalents of
  the state's bytes: the state is kept in the activations' format, as vLLM's mamba cache dtype
  "auto" keeps it in the model's, or float32 where the config says so: a float32 state of a bf16
  KV counts twice) and spends SCAN_OPS per state
  element a token: nothing grows with the context. Prefill runs the chunked scan (chunks of Q =
  ``ssm_chunk`` tokens; Dao & Gu Sec. 6, Yang et al. Sec. 3): per token and head 2 Q (N + P)
  within its chunk and 4 N P into and out of the chunk states (Gated DeltaNet 2 Q N more for its
  keys' Gram matrix), linear in the prompt; the final states are written once per sequence. The
  layers have no KV cache. Mixer-only and FFN-only layers (Nemotron-H) have one norm and residual
  each. Mamba-1 (Jamba; Gu & Dao, arXiv:2312.00752) has d_inner channels (H = d_inner heads of
  width 1) and a d_inner x N state: ``ssm_in_proj`` to x and z, ``ssm_conv`` over x,
  ``ssm_x_proj`` to dt's rank R and B, C, ``ssm_dt_bc_norm`` (Jamba's three RMSNorms),
  ``ssm_dt_proj`` (R -> d_inner), ``ssm_scan`` and ``ssm_gate`` (y x SiLU(z), no norm), then
  ``ssm_out_proj``. Its selective scan has no chunked form: prefill runs the same SCAN_OPS per
  state element a token as decode (a parallel scan does the same work), writing the states once.
- Operator roles (``OpTable.roles``) name what a near-memory unit may run in a decode
  step: 'attention' (the attention core), 'experts' (routed-expert matmuls), 'gemv'
  (other weight matmuls), '' for the rest and for every prefill operator.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from basis.errors import DseError
from hwmodels.formats import DataFormat, matmul_compute_class, unquantized_bytes
from workloads import context_parallel as cpar
from workloads.model import ModelSpec, qk_norm_weights
from workloads.routing import check_expert_parallel, expert_load
from workloads.scenario import Scenario
from workloads.techniques import PREDICTOR_RANK

NORM_OPS = {"rmsnorm": 4, "layernorm": 7}
#: the norms on the residual stream between a layer's blocks: with sequence-parallel activations each
#: device runs them on its 1/tp of the tokens (the norms inside a block, q/k and MLA's, see them all)
RESIDUAL_NORMS = frozenset({"attn_norm", "mlp_norm", "post_attn_norm", "post_mlp_norm"})
#: norms that write the residual stream in 16 bits at least (``unquantized_bytes``): Gemma's after-block
#: norms, whose output is added to it (they read a block's output, as the residual add does)
STREAM_OUT_NORMS = frozenset({"post_attn_norm", "post_mlp_norm"})
#: norms that read the residual stream in 16 bits at least; those not in ``STREAM_OUT_NORMS`` write a
#: matmul's input in the activations' format (the quantization fused into the norm's kernel)
STREAM_IN_NORMS = frozenset({"embedding_norm", "mtp_norms", "attn_norm", "mlp_norm", "final_norm"}) | STREAM_OUT_NORMS
#: operators whose own inputs or outputs are the residual stream (the embedding that writes it, the adds,
#: the norms that read it): a step's live set counts the stream beside every other operator, not again
#: beside these (``workloads.footprint.live_bytes``)
STREAM_OPS = frozenset({"embedding", "attn_add", "mlp_add", "residual_add"}) | (STREAM_IN_NORMS - STREAM_OUT_NORMS)
ACT_OPS = {"silu": 5, "swish": 5, "gelu": 8, "gelu_new": 8, "gelu_pytorch_tanh": 8, "relu": 1, "relu2": 2}
#: recurrent layers: ops per state element per token of the decode recurrence (Gated DeltaNet:
#: S k, the decayed rank-one delta update and S q, 2 + 3 + 2; Mamba-2: the decay, the rank-one
#: update dt x B^T and y = h C, 1 + 2 + 2), a counting convention as the element-wise ones above
#: Mamba-1: its decay exp(dt A) is per state element (A is d_inner x N), one more than Mamba-2's
SCAN_OPS = {"gdn": 7, "mamba2": 5, "mamba1": 6}
SOFTMAX_OPS = 5

#: operator kinds: how an operator is costed
KINDS = ("matmul", "attention", "vector", "embedding", "collective")


@dataclass(frozen=True)
class Operator:
    """One operator of a step; element counts are for one instance."""

    name: str
    kind: str
    count: int
    ops: float = 0.0
    weight: float = 0.0
    act_in: float = 0.0
    act_out: float = 0.0
    kv_in: float = 0.0
    kv_out: float = 0.0
    comm: float = 0.0      # elements in a ring all-reduce (partial sums: ``unquantized_bytes`` each)
    p2p: float = 0.0       # elements (activation format) sent point to point (a pipeline hop, an all-to-all)
    overlaps_link: bool = False  # its link time overlaps its compute and memory (a ring-attention step)
    dequant: float = 0.0   # vector ops dequantizing its weights (weight-only quantization)
    # the shape the kernel layer (``dse.core.kernel_model``) prices, 0 where not recorded: a matmul's
    # rows (tokens, m), output columns (n) and depth (k); a fused attention's sequences (m), keys each
    # query attends (n), head size (k) and query and K/V heads on this device
    shape_m: float = 0.0
    shape_n: float = 0.0
    shape_k: float = 0.0
    heads: float = 0.0
    kv_heads: float = 0.0
    # a grouped GEMM's groups (the experts a rank runs, each of shape_m rows); 0: one plain GEMM
    groups: float = 0.0


#: the numeric fields of an Operator (``OpTable.total`` reads them as columns of one matrix)
_NUMERIC = {f: i for i, f in enumerate(("count", "ops", "weight", "act_in", "act_out", "kv_in", "kv_out", "comm", "p2p",
                                        "dequant", "shape_m", "shape_n", "shape_k", "heads", "kv_heads", "groups"))}


@dataclass(frozen=True)
class OpTable:
    """The operators of one step on one device and the formats that price them."""

    stage: str                 # 'prefill' or 'decode'
    operators: tuple[Operator, ...]
    weights: DataFormat
    activations: DataFormat
    kv: DataFormat
    tp: int = 1
    tokens: int = 0            # tokens processed in this step (all sequences)
    kv_len: int = 0            # keys attended (decode)
    arrays: dict = field(default_factory=dict, compare=False, repr=False)
    stream_tokens: object = None   # the residual stream's tokens a device holds (None: ``tokens``)

    @property
    def residual_tokens(self):
        """Tokens of the residual stream one device holds through this step: every token of it, or
        1/tp of them with sequence-parallel activations (the builder's ``T_res``)."""
        return self.tokens if self.stream_tokens is None else self.stream_tokens

    @property
    def names(self) -> list[str]:
        return [op.name for op in self.operators]

    def column(self, attr: str) -> np.ndarray:
        """Per-operator array of an Operator attribute (one instance): [O], or [W, O] for a
        table of many workloads (``Scenario.many``)."""
        return self.total(attr)

    def total(self, *attrs: str) -> np.ndarray:
        """Per-operator array of the sum of Operator attributes (one instance): [O], or [W, O] for
        a table of many workloads."""
        numbers = self._numbers()
        if numbers is not None:          # one workload: every attribute read once into a matrix
            out = numbers[:, _NUMERIC[attrs[0]]].copy()
            for a in attrs[1:]:
                out += numbers[:, _NUMERIC[a]]
            return out
        fields = [self._many_field(a) for a in attrs]
        if all(f is not None for f in fields):      # many workloads, every amount a number or an array [W]
            if all(f.ndim == 1 for f in fields):    # a number for every operator: [O]
                out = fields[0].copy()
                for f in fields[1:]:
                    out += f
                return out
            out = np.empty(next(f.shape for f in fields if f.ndim == 2))    # [O, W], read as [W, O]
            out[...] = fields[0] if fields[0].ndim == 2 else fields[0][:, None]
            for f in fields[1:]:
                out += f if f.ndim == 2 else f[:, None]
            return out.T
        # amounts of other shapes: each operator's sum, broadcast together
        values = [sum((getattr(op, a) for a in attrs[1:]), getattr(op, attrs[0])) for op in self.operators]
        return np.stack(np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in values))).T

    def _numbers(self) -> np.ndarray | None:
        """[O, F] the numeric Operator fields (``_NUMERIC``) of a table of one workload, read once
        and kept (keyed by its operators: a table replaced with other operators reads its own);
        None for a table of many workloads (its amounts are arrays)."""
        held = self.arrays.get("numbers")
        if held is not None and held[0] is self.operators:
            return held[1]
        try:
            numbers = np.array([[getattr(op, f) for f in _NUMERIC] for op in self.operators], dtype=float)
        except (TypeError, ValueError):  # an amount that is an array of workloads
            numbers = None
        if numbers is not None and numbers.ndim != 2:
            numbers = np.zeros((0, len(_NUMERIC)))
        self.arrays["numbers"] = (self.operators, numbers)
        return numbers

    def _many_field(self, attr: str) -> np.ndarray | None:
        """The Operator field ``attr`` of a table of many workloads as an array: [O, W] where some
        operator holds it as an array of the W workloads' (a number repeated for the others), [O]
        where every operator holds a number; read once and kept (as ``_numbers`` keeps its own);
        None where an amount is an array of another shape (``total`` reads those one by one)."""
        held = self.arrays.get("many")
        if held is None or held[0] is not self.operators:
            held = self.arrays["many"] = (self.operators, {})
        kept = held[1]
        if attr in kept:
            return kept[attr]
        values = [getattr(op, attr) for op in self.operators]
        shapes = {v.shape for v in values if isinstance(v, np.ndarray) and v.ndim}
        if not shapes:
            out = np.array(values, dtype=float)
        elif len(shapes) == 1 and len(shape := shapes.pop()) == 1:
            # written operator by operator (contiguous rows): writing on the last axis of [W, O]
            # would write every operator's column with a stride, several times slower
            out = np.empty((len(values), shape[0]))
            for i, v in enumerate(values):
                out[i] = v
        else:
            out = None
        kept[attr] = out
        return out

    @property
    def counts(self) -> np.ndarray:
        return self.column("count")

    @property
    def ops(self) -> np.ndarray:
        """Ops per instance of each operator."""
        return self.column("ops")

    @property
    def weight_bytes(self) -> np.ndarray:
        return self.column("weight") * self.weights.bytes

    @property
    def act_bytes(self) -> np.ndarray:
        return self.total("act_in", "act_out") * self.activations.bytes

    @property
    def kv_bytes(self) -> np.ndarray:
        return self.total("kv_in", "kv_out") * self.kv.bytes

    @property
    def comm_bytes(self) -> np.ndarray:
        return self.column("comm") * unquantized_bytes(self.activations)

    @property
    def p2p_bytes(self) -> np.ndarray:
        return self.column("p2p") * self.activations.bytes

    @property
    def memory_bytes(self) -> np.ndarray:
        """Bytes moved to and from memory per instance (weights + activations + KV)."""
        return self.weight_bytes + self.act_bytes + self.kv_bytes

    @property
    def roles(self) -> list[str]:
        """Role of each operator for near-memory placement: 'attention', 'experts',
        'gemv' (other weight matmuls) or ''. Only decode steps have roles: near-memory
        units serve decode's GEMV-shaped work, prefill runs on the host."""
        out = []
        for op in self.operators:
            if self.stage != "decode":
                out.append("")
                continue
            if op.kind == "attention" and not op.overlaps_link:     # (a CP ring's exchange stays on the host)
                out.append("attention")
            elif op.kind == "matmul" and op.name.startswith("expert_"):
                out.append("experts")
            elif op.kind == "matmul" and op.name != "router":
                out.append("gemv")
            else:
                out.append("")
        return out

    @property
    def compute_classes(self) -> list[str]:
        """Compute class each operator asks for: a format class or 'vector'/'none'."""
        out = []
        for op in self.operators:
            if op.kind == "matmul":
                out.append(matmul_compute_class(self.activations, self.weights))
            elif op.name == "indexer_scores":     # DSA's indexer computes in its keys' format (FP8 as served)
                out.append(matmul_compute_class(self.kv, self.kv))
            elif op.kind == "attention":    # in the wider of the activations' and the KV cache's formats:
                # an FP8 attention kernel runs only on an FP8 cache, also where K and V come from
                # activations (MLA's prefill up-projects them from the cached latent)
                out.append(matmul_compute_class(self.activations, self.kv))
            elif op.kind == "vector":
                out.append("vector")
            else:
                out.append("none")
        return out


# --------------------------------------------------------------------------- helpers

#: operators outside the layers (not repeated per layer)
NON_LAYER_OPS = ("embedding", "embedding_norm", "final_norm", "lm_head", "pp_hop")
#: weight matmuls that stay dense under weight sparsity (SparseGPT and Wanda prune the layers' projections)
OUTER_MATMULS = ("lm_head", "router")
#: decode operators that compute only the active neurons or heads under contextual sparsity
CONTEXTUAL_OPS = ("q_proj", "o_proj", "flash_attention", "qk_matmul", "softmax", "sv_matmul", "gate_proj",
                  "up_proj", "act_fn", "down_proj")
#: the Operator fields that count work or traffic (scaled by early exit; a decode slope's differences)
AMOUNT_FIELDS = ("ops", "weight", "act_in", "act_out", "kv_in", "kv_out", "comm", "p2p", "dequant")
#: vector ops per weight element a weight-only quantized matmul spends dequantizing it: a conversion
#: and a multiply by its group's scale (a counting convention, as the element-wise op counts above)
DEQUANT_OPS = 2


def predictor_parameter_count(m: ModelSpec, tp: int = 1) -> float:
    """Parameters (elements per device) of one layer's contextual-sparsity predictors: hidden ->
    rank -> MLP neurons and hidden -> rank -> heads (``workloads.techniques.PREDICTOR_RANK``)."""
    h, r = m.hidden_size, PREDICTOR_RANK
    width = (m.intermediate_size if not m.is_moe else 0) / tp
    return h * r + r * width + h * r + r * m.num_heads / tp


def _base_name(name: str) -> str:
    """An operator's name without the ``sliding_`` prefix of sliding-window layers."""
    return name[len("sliding_"):] if name.startswith("sliding_") else name


def expected_experts_touched(num_experts: int, top_k: int, tokens: float) -> float:
    """Expected number of distinct experts that ``tokens`` tokens touch when each picks
    ``top_k`` of ``num_experts`` uniformly: E (1 - (1 - k/E)^T)."""
    if num_experts <= 0:
        return 0.0
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)


def _amount(v):
    """An operator's amount as a float, or a float array (one entry per workload)."""
    if isinstance(v, (int, float)):           # a Python number (numpy's float64 is a float): no array look
        return float(v)
    if isinstance(v, np.ndarray):
        return float(v) if v.ndim == 0 else (v if v.dtype == np.float64 else v.astype(float))
    return float(v) if np.ndim(v) == 0 else np.asarray(v, dtype=float)


def _counted(v):
    """A count (sequences, tokens, keys) as the builder computes with it: a number as is, the array
    of many workloads' as floats, so that the amounts derived from it are float arrays as built (from
    integer arrays, each ``_amount`` would convert a copy). Products of integers are exact in float64
    up to 2**53, far above any count of a shipped model's step."""
    return v if np.ndim(v) == 0 else np.asarray(v, dtype=float)


def _split(value: int, tp: int, what: str, model: ModelSpec) -> int:
    if value % tp:
        raise DseError(f"tensor parallelism {tp} does not divide {what} ({value}) of model "
                       f"'{model.name}'; choose devices that divide it")
    return value // tp


def residual_bytes_per_token(m: ModelSpec, activations: DataFormat) -> float:
    """Bytes of one token's residual stream (``hidden_size`` elements in 16 bits at least,
    ``unquantized_bytes``: engines keep it, and every hidden state sent between devices, pools or
    the host, unquantized under FP8 activations)."""
    return m.hidden_size * unquantized_bytes(activations)


def kv_heads_per_device(m: ModelSpec, tp: int) -> int:
    """KV heads each device holds: split when there are enough, else replicated."""
    if m.num_kv_heads >= tp:
        return _split(m.num_kv_heads, tp, "num_key_value_heads", m)
    if tp % m.num_kv_heads:
        raise DseError(f"tensor parallelism {tp} is not a multiple of num_key_value_heads "
                       f"({m.num_kv_heads}) of model '{m.name}'")
    return 1


def kv_elems_per_token_per_layer(m: ModelSpec, tp: int = 1) -> int:
    """KV-cache elements one token adds to one layer on one device."""
    if m.is_mla:
        return m.kv_lora_rank + m.qk_rope_head_dim + m.index_head_dim   # latent (and DSA's indexer key): replicated
    return 2 * kv_heads_per_device(m, tp) * m.head_dim


def _causal_pairs(seq, window: int = 0):
    """(query, key) pairs of causal attention over ``seq`` tokens (a number or an array), each
    query attending to at most ``window`` keys (0: no window): sum over i = 1..seq of min(i, window)."""
    full = seq * (seq + 1) / 2
    if not window:
        return full
    return np.where(window >= seq, full, window * (window + 1) / 2 + (seq - window) * window)


def _flash_keys_read(seq, row_blocks, window: int = 0):
    """Keys FlashAttention's prefill reads over all its blocks of query rows: block r of
    height b = seq / row_blocks reads the keys up to its last row, r b of them, or with a
    window only those inside the window of its rows, at most b + window - 1."""
    whole = seq * (row_blocks + 1) / 2
    if not window:
        return whole
    b = seq / row_blocks
    full = np.minimum(row_blocks, np.floor(1 + (window - 1) / b))   # blocks whose rows all see every earlier key
    return np.where(window >= seq, whole, b * full * (full + 1) / 2 + (row_blocks - full) * (b + window - 1))


def flash_head_sizes(m: ModelSpec) -> tuple[int, ...]:
    """The query/key head sizes (elements) FlashAttention tiles in a prefill of ``m``: ``head_dim``;
    MLA's decompressed heads (``qk_nope + qk_rope``), or its latent (``kv_lora_rank + qk_rope``)
    under sparse attention; none without attention layers. (``_Builder.attention`` and
    ``mla_attention`` pass these to ``_flash_row_blocks``.)"""
    if not m.num_attention_layers:
        return ()
    if m.is_mla:
        rope = m.qk_rope_head_dim
        return (m.kv_lora_rank + rope,) if m.is_sparse_attention else (m.qk_nope_head_dim + rope,)
    return (m.head_dim,)


#: a buffer this much above the size at which every row block is full counts as full (the tiling
#: rule divides bytes by an element size that need not be a power of two)
_FULL_MARGIN = 1e-9


def full_tile_buffer(m: ModelSpec, elem_bytes=1.0):
    """The on-chip buffer, bytes, at which every row block FlashAttention tiles ``m``'s prefill into
    is its head size: 4 d^2 elements of ``elem_bytes`` (the widest element the attention reads, the
    KV cache's or the activations'; a number or an array), d the widest head (``flash_head_sizes``),
    Br = min(M / (4 d), d) for M elements. Every buffer at least this large gives the same operator
    tables, so designs that differ only there can share them."""
    d = max(flash_head_sizes(m), default=1)
    return 4.0 * d * d * np.asarray(elem_bytes, dtype=float) * (1.0 + _FULL_MARGIN)


def _flash_row_blocks(seq, head_dim: int, buffer_bytes: float, elem_bytes: float):
    """Number of query-row blocks FlashAttention tiles a sequence (of ``seq`` tokens, a number or
    an array) into."""
    if buffer_bytes <= 0:
        raise DseError("FlashAttention needs the device's on-chip buffer size (onchip_buffer_bytes)")
    m_elems = buffer_bytes / elem_bytes
    br = max(1, min(int(m_elems // (4 * head_dim)), head_dim))
    return np.ceil(seq / br)


# --------------------------------------------------------------------------- builders

class _Builder:
    def __init__(self, m: ModelSpec, sc: Scenario, stage: str, kv_len: int, buffer_bytes: float):
        self.m, self.sc, self.stage = m, sc, stage
        self.tp = sc.tp
        self.B = _counted(sc.batch)
        self.tech = sc.techniques
        self.cp = sc.cp
        self.S = _counted(-(-sc.prompt_len // sc.cp)) if stage == "prefill" else self.tech.query_tokens
        self.T = self.B * self.S                           # tokens in this step
        # the residual stream's tokens a device holds between the attention and MLP blocks: all of them,
        # or 1/tp with sequence-parallel activations (the all-reduce a reduce-scatter and an all-gather)
        self.T_res = self.T / sc.tp if sc.techniques.sequence_parallel and sc.tp > 1 else self.T
        self.L = _counted(kv_len)                          # keys a query attends (prefill: its prompt)
        self.buffer_bytes = buffer_bytes
        self.ops: list[Operator] = []
        self.nh = _split(m.num_heads, self.tp, "num_attention_heads", m)
        if m.num_layers % sc.pp:
            raise DseError(f"pipeline parallelism {sc.pp} does not divide num_hidden_layers ({m.num_layers}) "
                           f"of model '{m.name}'")
        self.ep = sc.ep
        if self.ep > 1 and not m.is_moe:
            raise DseError(f"expert parallelism {self.ep} needs a mixture-of-experts model; '{m.name}' is dense")
        if m.is_moe:
            check_expert_parallel(m.num_experts, self.tech.routing.redundant, self.ep, m.name)
        if m.is_moe and m.moe_intermediate_size % self.tp:
            raise DseError(f"tensor parallelism {self.tp} does not divide moe_intermediate_size "
                           f"({m.moe_intermediate_size}) of model '{m.name}'")

    def add(self, name, kind, count, **kw):
        if count > 0:
            self.ops.append(Operator(name, kind, int(count), **{k: _amount(v) for k, v in kw.items()}))

    def _unquantized(self, elements):
        """``elements`` sent in 16 bits at least (``unquantized_bytes``: partial sums, the residual
        stream), as a count of activation-format elements (what ``p2p`` counts)."""
        act = self.sc.activations
        return elements * unquantized_bytes(act) / act.bytes

    def norm(self, name, width, count, tokens=None):
        t = (self.T_res if name in RESIDUAL_NORMS else self.T) if tokens is None else tokens
        per = NORM_OPS.get(self.m.norm_type, 7)
        params = width * self.m.norm_weights_per_element
        read = self._unquantized(t * width) if name in STREAM_IN_NORMS else t * width
        written = self._unquantized(t * width) if name in STREAM_OUT_NORMS else t * width
        self.add(name, "vector", count, ops=per * t * width, weight=params, act_in=read, act_out=written)

    def linear(self, name, d_in, d_out, count, bias=False, kv_out=False, tokens=None, weight_rows=None):
        t = self.T if tokens is None else tokens
        w = d_in * d_out + (d_out if bias else 0)
        kw = dict(ops=2 * t * d_in * d_out, weight=w if weight_rows is None else weight_rows, act_in=t * d_in,
                  shape_m=t, shape_n=d_out, shape_k=d_in)
        kw["kv_out" if kv_out else "act_out"] = t * d_out
        self.add(name, "matmul", count, **kw)

    def add_residual(self, name, operands, count):
        h, t = self.m.hidden_size, self.T_res
        self.add(name, "vector", count, ops=(operands - 1) * t * h, act_in=self._unquantized(operands * t * h),
                 act_out=self._unquantized(t * h))

    def allreduce(self, name, count):
        if self.tp > 1:
            self.add(name, "collective", count, comm=self.T * self.m.hidden_size)

    # ---- attention
    def attention_core(self, count, nh, nkv, d_qk, d_v, kv_from_cache=True, kv_qk=None, kv_sv=None, window=0):
        """qk_matmul + softmax + sv_matmul, or one fused flash_attention; with a sliding
        ``window`` the ``sliding_`` operators of the layers that have it."""
        B, S = self.B, self.S
        L = self.L                                          # keys a query attends to
        if self.stage == "decode":
            L = np.minimum(np.minimum(L, window or L), self.tech.kv_budget or L)
            if self.cp > 1:                                 # this rank's shard of the cached keys
                L = L / self.cp
        prefix = "sliding_" if window else ""
        kv_qk = nkv * d_qk if kv_qk is None else kv_qk      # K elements per token
        kv_sv = nkv * d_v if kv_sv is None else kv_sv       # V elements per token
        kvk = "kv_in" if kv_from_cache else "act_in"
        sink_w = nh if self.m.attention_sinks else 0          # the sink logits: one a head, read as weights
        sinks = B * S * sink_w                                # ... each joining a query-head's softmax
        if self.sc.flash_attention:
            if self.stage == "prefill":
                # context parallel: 1/cp of the whole prompt's causal pairs and key reads a rank
                whole = S if self.cp == 1 else _counted(self.sc.prompt_len)
                pairs = B * nh * _causal_pairs(whole, window) / self.cp
                elem = (self.sc.kv if kv_from_cache else self.sc.activations).bytes
                nrb = _flash_row_blocks(whole, d_qk, self.buffer_bytes, elem)
                kv_reads = B * (kv_qk + kv_sv) * _flash_keys_read(L, nrb, window) / self.cp
            else:                                           # S query tokens per sequence, K/V read once
                pairs = B * nh * S * L
                kv_reads = B * L * (kv_qk + kv_sv)
            q = B * S * nh * d_qk
            kw = {"ops": 2 * pairs * (d_qk + d_v) + SOFTMAX_OPS * (pairs + sinks), "act_out": B * S * nh * d_v,
                  "shape_m": B, "shape_n": L if self.stage == "decode" else S, "shape_k": d_qk, "heads": nh,
                  "kv_heads": nkv, "weight": sink_w}
            if kv_from_cache:
                kw.update(act_in=q, kv_in=kv_reads)
            else:
                kw.update(act_in=q + kv_reads)
            self.add(f"{prefix}flash_attention", "attention", count, **kw)
            return
        scores = B * nh * S * L
        q = B * S * nh * d_qk
        out = B * S * nh * d_v

        def reads(first, keys):  # activations read, plus K or V from the cache or from activations
            return {"act_in": first, kvk: keys} if kv_from_cache else {"act_in": first + keys}
        self.add(f"{prefix}qk_matmul", "attention", count, ops=2 * scores * d_qk, act_out=scores,
                 **reads(q, B * L * kv_qk))
        self.add(f"{prefix}softmax", "vector", count, ops=SOFTMAX_OPS * (scores + sinks), act_in=scores, act_out=scores,
                 weight=sink_w)
        self.add(f"{prefix}sv_matmul", "attention", count, ops=2 * scores * d_v, act_out=out,
                 **reads(scores, B * L * kv_sv))

    def context_parallel(self, count, heads, v_dim):
        """``cp_ring``, cp - 1 sends a layer around the ring: in a CP prefill each one rank's K/V
        chunk, in a CP decode step each one rank's partial outputs and softmax statistics (the
        gather); nothing without CP. (One name, kind and count in both: the iteration model reads a
        prefill's operators onto the decode step's.) Under FlashAttention the prefill's ring steps
        carry the attention too: the fused attention operator keeps the rank's own chunk pair (1/cp
        of its work) and each of the cp - 1 ring steps the work of one chunk pair beside the send of
        the next K/V chunk, priced max(attention, send) (``Operator.overlaps_link``; Liu et al. Sec. 3).
        Sliding-window layers' sends (``sliding_cp_ring``) are priced beside their attention."""
        if self.cp == 1:
            return
        sc, steps = self.sc, cpar.ring_steps(self.cp)
        if self.stage == "prefill":
            send = cpar.ring_send_elements(self.B, _counted(sc.prompt_len), self.cp,
                                           kv_elems_per_token_per_layer(self.m, self.tp), sc.kv.bytes,
                                           sc.activations.bytes)
        else:
            send = cpar.decode_combine_elements(self.T, heads, v_dim, self.cp) / steps
        sliding = self.m.num_sliding_layers if not self.m.is_mla else 0
        self.add("sliding_cp_ring", "collective", sliding * steps, p2p=send)
        if not sc.flash_attention:
            self.add("cp_ring", "collective", (count - sliding) * steps, p2p=send)
            return
        step = {}
        if self.stage == "prefill":      # one chunk pair of the fused attention a ring step
            at = max(i for i, op in enumerate(self.ops) if op.name == "flash_attention")
            attn = self.ops[at]
            moved = ("ops", "act_in", "act_out", "kv_in")
            step = {f: _amount(getattr(attn, f) / self.cp) for f in moved}
            step.update({f: getattr(attn, f) for f in ("shape_m", "shape_n", "shape_k", "heads", "kv_heads")})
            self.ops[at] = replace(attn, **{f: _amount(getattr(attn, f) / self.cp) for f in moved})
        if count - sliding > 0:
            self.ops.append(Operator("cp_ring", "attention", int((count - sliding) * steps), p2p=_amount(send),
                                     overlaps_link=True, **step))

    def attention(self, count):
        m, h = self.m, self.m.hidden_size
        if m.is_mla:
            return self.mla_attention(count)
        d, nh = m.head_dim, self.nh
        nkv = kv_heads_per_device(m, self.tp)
        self.linear("q_proj", h, nh * d * (2 if m.attn_output_gate else 1), count, bias=m.attention_bias)
        self.linear("k_proj", h, nkv * d, count, bias=m.attention_bias, kv_out=True)
        self.linear("v_proj", h, nkv * d, count, bias=m.attention_bias, kv_out=True)
        if m.qk_norm:
            heads = self.T * (nh + nkv) * d
            self.add("qk_norm", "vector", count, ops=NORM_OPS["rmsnorm"] * heads, weight=qk_norm_weights(m, nh, nkv),
                     act_in=heads, act_out=heads)
        self.attention_core(count - m.num_sliding_layers, nh, nkv, d, d)       # count: every layer
        self.attention_core(m.num_sliding_layers, nh, nkv, d, d, window=m.sliding_window)
        if m.attn_output_gate:      # sigmoid(gate) x output: 4 + 1 ops an element
            self.add("attn_gate", "vector", count, ops=5 * self.T * nh * d, act_in=2 * self.T * nh * d,
                     act_out=self.T * nh * d)
        self.context_parallel(count, nh, d)
        self.linear("o_proj", nh * d, h, count, bias=m.o_proj_bias)

    def mla_attention(self, count):
        m, h, nh = self.m, self.m.hidden_size, self.nh
        dn, dr, dv, rkv = m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim, m.kv_lora_rank
        if m.q_lora_rank:
            self.linear("q_a_proj", h, m.q_lora_rank, count)
            self.norm("q_a_norm", m.q_lora_rank, count)
            self.linear("q_b_proj", m.q_lora_rank, nh * (dn + dr), count)
        else:
            self.linear("q_proj", h, nh * (dn + dr), count)
        self.linear("kv_a_proj", h, rkv + dr, count, kv_out=True)
        self.norm("kv_a_norm", rkv, count)
        T = self.T
        w_b = rkv * nh * (dn + dv)
        if m.is_sparse_attention:
            # DSA runs MLA in its absorbed (MQA) form in prefill and decode alike, over the selected tokens
            if self.cp > 1:
                raise DseError(f"context parallelism {self.cp}: model '{m.name}' has sparse attention (a lightning "
                               "indexer and top-k selection), not modelled over a ring; use cp 1")
            self.indexer(count)
            self.add("kv_b_proj", "matmul", count, ops=2 * T * w_b, weight=w_b,
                     act_in=T * nh * (dn + rkv), act_out=T * nh * (rkv + dv))
            self.sparse_attention_core(count, nh, rkv + dr, rkv)
        elif self.stage == "prefill":
            # decompress the latent of every prompt token into per-head K (nope part) and V
            self.add("kv_b_proj", "matmul", count, ops=2 * T * w_b, weight=w_b, kv_in=T * rkv,
                     act_out=T * nh * (dn + dv))
            self.attention_core(count, nh, nh, dn + dr, dv, kv_from_cache=False)
        else:
            # absorbed: q_nope -> latent space before attention, latent -> v after it
            self.add("kv_b_proj", "matmul", count, ops=2 * T * w_b, weight=w_b,
                     act_in=T * nh * (dn + rkv), act_out=T * nh * (rkv + dv))
            self.attention_core(count, nh, 1, rkv + dr, rkv, kv_qk=rkv + dr, kv_sv=0)
        self.context_parallel(count, nh, dv if self.stage == "prefill" else rkv)
        self.linear("o_proj", nh * dv, h, count)

    # ---- DeepSeek Sparse Attention (DeepSeek-V3.2)
    def _indexer_pairs(self):
        """(query, key) pairs a sequence's indexer scores: prefill's causal S(S+1)/2, decode's S x L."""
        return _causal_pairs(self.S) if self.stage == "prefill" else self.S * self.L

    def _selected_pairs(self):
        """(query, key) pairs a sequence attends under top-k selection: a query at position i attends
        min(i, index_topk) tokens (prefill: the sum over its prompt; decode: S x min(L, k))."""
        k = self.m.index_topk
        if self.stage == "prefill":
            return _causal_pairs(self.S, k)
        return self.S * np.minimum(np.minimum(self.L, k), self.tech.kv_budget or self.L)

    def indexer(self, count):
        """The lightning indexer (DeepSeek-V3.2-Exp report, sec. 2.1): per token a query of H_I heads of
        d_I from MLA's query latent, one key of d_I from the hidden state (LayerNorm'd, cached per layer
        beside the latent), a weight per head; the scores of every (query, earlier token) pair,
        sum_j w_j ReLU(q_j . k), and the top-k selection over them (fused: only the selected indices are
        written). Replicated over TP, as MLA's down-projections are. Ops per pair: H_I (2 d_I + 3)
        (dot, ReLU, weight and sum), plus 1 to select."""
        m, h, T, B = self.m, self.m.hidden_size, self.T, self.B
        hi, di = m.index_n_heads, m.index_head_dim
        self.linear("indexer_q_proj", m.q_lora_rank, hi * di, count)
        self.linear("indexer_k_proj", h, di, count, kv_out=True)
        self.add("indexer_k_norm", "vector", count, ops=NORM_OPS["layernorm"] * T * di, weight=2 * di,
                 act_in=T * di, act_out=T * di)
        self.linear("indexer_weights_proj", h, hi, count)
        pairs = B * self._indexer_pairs()
        keys = B * (self.S if self.stage == "prefill" else self.L) * di     # each sequence's keys read once
        kw = {"kv_in": keys} if self.stage == "decode" else {}
        act_keys = 0 if self.stage == "decode" else keys
        self.add("indexer_scores", "attention", count, ops=pairs * (hi * (2 * di + 3) + 1),
                 act_in=T * hi * (di + 1) + act_keys, act_out=B * self._selected_pairs(),
                 **kw)

    def sparse_attention_core(self, count, nh, d_qk, d_v):
        """MLA's absorbed attention over the tokens the indexer selected: ``_selected_pairs`` per sequence
        and head, each selected token's latent (``d_qk``: the latent and its rope part; V is the same
        latent) read once, as dense MLA's decode reads every token's. Decode reads at most min(L, S k)
        distinct tokens for S queries; prefill's block of b query rows (FlashAttention's tiling) gathers at
        most min(prefix, b k) latents, b sum_r min(r, k) over its blocks, FlashAttention's dense read when
        the prompt is within top-k. So at a context within top-k every count of a decode step equals dense
        MLA's."""
        B, S, m = self.B, self.S, self.m
        k = m.index_topk
        pairs = B * nh * self._selected_pairs()
        if self.stage == "decode":
            keys = np.minimum(np.minimum(self.L, k), self.tech.kv_budget or self.L)
            kv_reads = B * np.minimum(self.L, S * keys) * d_qk
        else:
            elem = self.sc.kv.bytes
            nrb = _flash_row_blocks(S, d_qk, self.buffer_bytes, elem) if self.sc.flash_attention else S
            kv_reads = B * d_qk * (S / nrb) * _causal_pairs(nrb, k)
            keys = S
        q, out = B * S * nh * d_qk, B * S * nh * d_v
        if self.sc.flash_attention:
            self.add("flash_attention", "attention", count, ops=2 * pairs * (d_qk + d_v) + SOFTMAX_OPS * pairs,
                     act_in=q, kv_in=kv_reads, act_out=out, shape_m=B, shape_n=keys, shape_k=d_qk, heads=nh,
                     kv_heads=1)
            return
        self.add("qk_matmul", "attention", count, ops=2 * pairs * d_qk, act_in=q, kv_in=kv_reads, act_out=pairs)
        self.add("softmax", "vector", count, ops=SOFTMAX_OPS * pairs, act_in=pairs, act_out=pairs)
        self.add("sv_matmul", "attention", count, ops=2 * pairs * d_v, act_in=pairs, act_out=out)

    # ---- recurrent layers (Gated DeltaNet, Mamba-2, Mamba-1)
    def recurrent(self, count):
        """The operators of ``count`` recurrent layers (see the module docstring)."""
        m, h, T, B = self.m, self.m.hidden_size, self.T, self.B
        if m.recurrent_kind == "mamba1":
            self.mamba1(count)
            return
        H = _split(m.ssm_heads, self.tp, "the recurrent layers' heads", m)
        G = _split(m.ssm_groups, self.tp, "the recurrent layers' groups", m)
        P, N, K = m.ssm_head_dim, m.ssm_state_dim, m.ssm_conv_kernel
        gdn = m.recurrent_kind == "gdn"
        conv = H * P + 2 * G * N                          # channels through the conv: x (v), B, C (q, k)
        model_bytes, kv_bytes = self.sc.activations.bytes, self.sc.kv.bytes      # state in KV-format equivalents
        scan_state = B * H * P * N * (m.ssm_state_bytes or model_bytes) / kv_bytes     # every sequence's
        conv_state = B * conv * (K - 1) * model_bytes / kv_bytes
        # GDN: q, k, v, z and the gates beta, alpha a head; Mamba-2: z, x, B, C and dt a head
        self.linear("ssm_in_proj", h, conv + H * P + (2 if gdn else 1) * H, count)
        bias = conv if m.ssm_conv_bias else 0
        state_io = {"kv_in": conv_state, "kv_out": conv_state} if self.stage == "decode" else {"kv_out": conv_state}
        self.add("ssm_conv", "vector", count, ops=2 * K * T * conv + T * conv * ACT_OPS["silu"], weight=conv * K + bias,
                 act_in=T * conv, act_out=T * conv, **state_io)
        if self.stage == "decode":
            ops = T * H * P * N * SCAN_OPS[m.recurrent_kind]
            state_io = {"kv_in": scan_state, "kv_out": scan_state}
        else:
            Q = m.ssm_chunk
            ops = T * H * (2 * Q * (N + P) + 4 * N * P + (2 * Q * N if gdn else 0))
            state_io = {"kv_out": scan_state}
        self.add("ssm_scan", "vector", count, ops=ops, weight=(2 if gdn else 3) * H,   # A_log, dt_bias (, D)
                 act_in=T * (conv + (2 if gdn else 1) * H), act_out=T * H * P, **state_io)
        norm_w = P if gdn else H * P                      # GDN: one norm of a head's width; Mamba-2: of all heads
        self.add("ssm_gate_norm", "vector", count, ops=(NORM_OPS["rmsnorm"] + ACT_OPS["silu"] + 1) * T * H * P,
                 weight=norm_w, act_in=2 * T * H * P, act_out=T * H * P)
        self.linear("ssm_out_proj", H * P, h, count)

    def mamba1(self, count):
        """The operators of ``count`` Mamba-1 layers (see the module docstring)."""
        m, h, T, B = self.m, self.m.hidden_size, self.T, self.B
        D = _split(m.ssm_heads, self.tp, "the Mamba layers' inner channels", m)
        N, K, R = m.ssm_state_dim, m.ssm_conv_kernel, m.ssm_dt_rank
        model_bytes, kv_bytes = self.sc.activations.bytes, self.sc.kv.bytes      # state in KV-format equivalents
        scan_state = B * D * N * (m.ssm_state_bytes or model_bytes) / kv_bytes
        conv_state = B * D * (K - 1) * model_bytes / kv_bytes
        decode = self.stage == "decode"
        self.linear("ssm_in_proj", h, 2 * D, count)
        bias = D if m.ssm_conv_bias else 0
        state_io = {"kv_in": conv_state, "kv_out": conv_state} if decode else {"kv_out": conv_state}
        self.add("ssm_conv", "vector", count, ops=2 * K * T * D + T * D * ACT_OPS["silu"], weight=D * K + bias,
                 act_in=T * D, act_out=T * D, **state_io)
        self.linear("ssm_x_proj", D, R + 2 * N, count)
        self.add("ssm_dt_bc_norm", "vector", count, ops=NORM_OPS["rmsnorm"] * T * (R + 2 * N), weight=R + 2 * N,
                 act_in=T * (R + 2 * N), act_out=T * (R + 2 * N))
        self.linear("ssm_dt_proj", R, D, count, bias=True)
        state_io = {"kv_in": scan_state, "kv_out": scan_state} if decode else {"kv_out": scan_state}
        self.add("ssm_scan", "vector", count, ops=T * D * N * SCAN_OPS["mamba1"] + 2 * T * D,   # and D x
                 weight=D * N + D, act_in=T * (2 * D + 2 * N), act_out=T * D, **state_io)      # A_log, D
        self.add("ssm_gate", "vector", count, ops=(ACT_OPS["silu"] + 1) * T * D, act_in=2 * T * D, act_out=T * D)
        self.linear("ssm_out_proj", D, h, count)

    def hybrid_layers(self):
        """The layers of a hybrid model: a norm, its mixer (attention or recurrent), the all-reduce and
        the residual add for each layer with a mixer; a norm, its MLP or MoE, the all-reduce and the
        add for each layer with an FFN."""
        m, h = self.m, self.m.hidden_size
        mixers, ffns = m.num_mixer_layers, m.num_ffn_layers
        self.norm("attn_norm", h, mixers)
        if m.num_attention_layers:
            self.attention(m.num_attention_layers)
        self.recurrent(m.num_recurrent_layers)
        self.allreduce("attn_all_reduce", mixers)
        self.add_residual("attn_add", 2, mixers)
        self.norm("mlp_norm", h, ffns)
        self.mlp("", m.intermediate_size / self.tp, m.num_dense_layers, m.mlp_bias)
        if m.num_moe_layers:
            self.moe(m.num_moe_layers)
        self.allreduce("mlp_all_reduce", ffns)
        self.add_residual("mlp_add", 2, ffns)

    # ---- MLP
    def mlp(self, prefix, width, count, bias):
        h = self.m.hidden_size
        if self.m.mlp_gated:
            self.linear(f"{prefix}gate_proj", h, width, count, bias=bias)
        self.linear(f"{prefix}up_proj", h, width, count, bias=bias)
        per = ACT_OPS.get(self.m.mlp_activation, 8)
        n_in = 2 if self.m.mlp_gated else 1
        self.add(f"{prefix}act_fn", "vector", count, ops=per * self.T * width,
                 act_in=n_in * self.T * width, act_out=self.T * width)
        self.linear(f"{prefix}down_proj", width, h, count, bias=bias)

    def moe(self, count):
        m, h, T = self.m, self.m.hidden_size, self.T
        E, k = m.num_experts, m.experts_per_token
        w = m.moe_intermediate_size / self.tp
        gates = E + (1 if m.shared_expert_gate else 0)      # routed experts' logits and the shared expert's gate
        self.add("router", "matmul", count, ops=2 * T * h * gates, weight=h * gates + (E if m.router_bias else 0),
                 act_in=T * h, act_out=T * gates)
        routing = self.tech.routing
        if routing.uniform:
            touched = expected_experts_touched(E, k, T * self.ep) / self.ep
            routed = T * k
        else:                                               # the busiest rank's tokens and experts
            load = expert_load(routing, E, k, self.ep, m.name)
            touched = load.experts_touched(T * self.ep)
            routed = load.busiest_tokens(T * self.ep, routing.finite)
        a2a = routed * h * (self.ep - 1) / self.ep / self.tp
        if self.ep > 1:
            self.add("moe_dispatch", "collective", count, p2p=a2a)
        n_mats = 3 if m.mlp_gated else 2
        bw, bh = (w, h) if m.mlp_bias else (0, 0)             # bias elements of an expert's up and down projections
        # a grouped GEMM: each expert touched on this rank runs the tokens routed to it
        up = dict(shape_m=routed / np.maximum(touched, 1e-12), shape_n=w, shape_k=h, groups=touched)
        if m.mlp_gated:
            self.add("expert_gate_proj", "matmul", count, ops=2 * routed * h * w, weight=touched * (h * w + bw),
                     act_in=routed * h, act_out=routed * w, **up)
        self.add("expert_up_proj", "matmul", count, ops=2 * routed * h * w, weight=touched * (h * w + bw),
                 act_in=routed * h, act_out=routed * w, **up)
        per = ACT_OPS.get(m.mlp_activation, 8)
        self.add("expert_act_fn", "vector", count, ops=per * routed * w,
                 act_in=(n_mats - 1) * routed * w, act_out=routed * w)
        self.add("expert_down_proj", "matmul", count, ops=2 * routed * w * h, weight=touched * (w * h + bh),
                 act_in=routed * w, act_out=T * h, **{**up, "shape_n": h, "shape_k": w})
        if self.ep > 1:
            # the combine sends partial sums (the experts' weighted outputs)
            self.add("moe_combine", "collective", count, p2p=self._unquantized(a2a))
        if m.shared_expert_intermediate_size:
            self.mlp("shared_", m.shared_expert_intermediate_size / self.tp, count, False)

    # ---- whole model
    def build(self) -> list[Operator]:
        m, h, T = self.m, self.m.hidden_size, self.T
        L = m.num_layers  # layers (self.L is the context length)
        emb = T * h * (2 if m.position_embeddings else 1)
        self.add("embedding", "embedding", 1, weight=emb, act_out=self._unquantized(T * h))
        if m.embedding_norm:
            self.norm("embedding_norm", h, 1)
        if m.draft_head:                   # MTP / EAGLE: fuse the token's embedding with the target's feature
            if m.draft_head == "mtp":
                self.norm("mtp_norms", h, 2)
            self.linear("draft_input_proj", 2 * h, h, 1)
        if m.is_hybrid:
            self.hybrid_layers()
        elif m.parallel_block:
            self.norm("attn_norm", h, L)
            if m.norms_per_block > 1:
                self.norm("mlp_norm", h, L)
            self.attention(L)
            self.mlp("", m.intermediate_size / self.tp, L, m.mlp_bias)
            self.allreduce("all_reduce", L)
            self.add_residual("residual_add", 3, L)
        else:
            post = m.norms_per_block == 4                  # Gemma: norms after attention and after the MLP too
            self.norm("attn_norm", h, L)
            self.attention(L)
            self.allreduce("attn_all_reduce", L)
            if post:
                self.norm("post_attn_norm", h, L)
            self.add_residual("attn_add", 2, L)
            self.norm("mlp_norm", h, L)
            if m.is_moe:
                self.mlp("", m.intermediate_size / self.tp, m.num_dense_layers, m.mlp_bias)
                self.moe(m.num_moe_layers)
            else:
                self.mlp("", m.intermediate_size / self.tp, L, m.mlp_bias)
            self.allreduce("mlp_all_reduce", L)
            if post:
                self.norm("post_mlp_norm", h, L)
            self.add_residual("mlp_add", 2, L)
        if self.sc.pp > 1:    # the residual stream
            self.add("pp_hop", "collective", self.sc.pp - 1, p2p=self._unquantized(T * h))
        B = self.B if self.stage == "prefill" else self.T   # logits: a prompt's last token, every decoded one
        if m.final_norm:
            self.norm("final_norm", h, 1, tokens=B)
        v = m.vocab_size / self.tp
        self.add("lm_head", "matmul", 1, ops=2 * B * h * v, weight=h * v + (v if m.lm_head_bias else 0),
                 act_in=B * h, act_out=B * v, shape_m=B, shape_n=v, shape_k=h)
        return self._techniques(self.ops)

    # ---- techniques (``workloads.techniques``)
    def _techniques(self, ops: list[Operator]) -> list[Operator]:
        """The operators with the scenario's techniques applied: sparse layer weights stored
        compressed, first and last layers at their own bits; in decode, contextual sparsity (with
        its predictors) and early exit."""
        t = self.tech
        if t.layer_weights_changed:
            f = t.layer_weight_factor(self.sc.weights.bits, self.m.num_layers)
            ops = [replace(op, weight=op.weight * f) if op.kind == "matmul" and op.name not in OUTER_MATMULS
                   else op for op in ops]
        if self.stage == "decode":
            if t.activation_density < 1.0:
                ops = self._contextual(ops)
            if t.layers_used < 1.0:
                ops = self._early_exit(ops)
        return self._dequantized(ops)

    def _dequantized(self, ops: list[Operator]) -> list[Operator]:
        """Weight-only quantization (weights narrower than the class the matmul computes in: W4A16,
        W8A16, W4A8): every weight element a matmul reads is dequantized once a step on the vector
        units, ``DEQUANT_OPS`` each (fused into the matmul: under its memory time when memory-bound)."""
        sc = self.sc
        if matmul_compute_class(sc.activations, sc.weights) == sc.weights.compute:
            return ops
        return [replace(op, dequant=DEQUANT_OPS * op.weight) if op.kind == "matmul" and np.any(op.weight > 0) else op
                for op in ops]

    def _contextual(self, ops: list[Operator]) -> list[Operator]:
        f, touched = self.tech.activation_density, self.tech.weights_touched(self.T)
        out = []
        for op in ops:
            if _base_name(op.name) in CONTEXTUAL_OPS:
                op = replace(op, ops=op.ops * f, weight=op.weight * touched, act_in=op.act_in * f,
                             act_out=op.act_out * f, kv_in=op.kv_in * f)
            out.append(op)
        m, h, r = self.m, self.m.hidden_size, PREDICTOR_RANK
        w = predictor_parameter_count(m, self.tp)
        outputs = 2 * r + (m.intermediate_size if not m.is_moe else 0) / self.tp + self.nh
        at = next(i for i, op in enumerate(out) if op.name == "attn_norm")
        out.insert(at, Operator("sparsity_predictor", "matmul", m.num_layers, ops=2 * self.T * w, weight=w,
                                act_in=2 * self.T * h, act_out=self.T * outputs))
        return out

    def _early_exit(self, ops: list[Operator]) -> list[Operator]:
        f, h = self.tech.layers_used, self.m.hidden_size
        out = []
        for op in ops:
            if op.name not in NON_LAYER_OPS and not np.any(op.kv_out):   # K and V still written in every layer
                op = replace(op, **{k: getattr(op, k) * f for k in AMOUNT_FIELDS})
            out.append(op)
        tail = next(i for i, op in enumerate(out) if op.name in ("pp_hop", "final_norm", "lm_head"))
        out.insert(tail, Operator("exit_classifier", "matmul", self.m.num_layers, ops=2 * self.T * h * f, weight=h * f,
                            act_in=self.T * h * f, act_out=self.T * f))
        return out


def prefill(model: ModelSpec, scenario: Scenario, buffer_bytes: float = 0.0, keys=None) -> OpTable:
    """Operator table of the prefill of ``scenario.batch`` prompts of ``prompt_len`` tokens,
    per device. ``buffer_bytes`` is the on-chip buffer FlashAttention tiles into. ``keys``: the
    keys each query attends (default ``prompt_len``); a chunk of a longer prompt attends its
    prefix too, which sizes its live activations (an unfused score matrix of chunk x keys)."""
    builder = _Builder(model, scenario, "prefill", scenario.prompt_len if keys is None else keys, buffer_bytes)
    ops = builder.build()
    return OpTable("prefill", tuple(ops), scenario.weights, scenario.activations, scenario.kv,
                   scenario.tp, scenario.batch * -(-scenario.prompt_len // scenario.cp), scenario.prompt_len,
                   stream_tokens=builder.T_res)


def decode_step(model: ModelSpec, scenario: Scenario, kv_len: int, buffer_bytes: float = 0.0) -> OpTable:
    """Operator table of one decode step of ``scenario.batch`` sequences, each attending
    to ``kv_len`` keys, per device."""
    if np.any(np.asarray(kv_len) <= 0):
        raise DseError(f"decode context length must be positive, got {kv_len}")
    builder = _Builder(model, scenario, "decode", kv_len, buffer_bytes)
    ops = builder.build()
    return OpTable("decode", tuple(ops), scenario.weights, scenario.activations, scenario.kv,
                   scenario.tp, scenario.batch, kv_len, stream_tokens=builder.T_res)


def medusa_heads(model: ModelSpec, scenario: Scenario, heads: int) -> OpTable:
    """Operator table of Medusa's draft heads for one decode round of ``scenario.batch`` sequences:
    each of ``heads`` heads is a residual block (hidden x hidden, SiLU, add) and its own LM head
    (hidden x vocabulary) on the last hidden state (Cai et al., "Medusa: Simple LLM Inference
    Acceleration Framework with Multiple Decoding Heads", ICML 2024, Sec. 2.1.1: p_t^(k) =
    softmax(W2^(k) (SiLU(W1^(k) h_t) + h_t))), per device (the vocabulary split over ``tp``)."""
    h, v, b = model.hidden_size, model.vocab_size / scenario.tp, scenario.batch
    ops = (Operator("medusa_block", "matmul", heads, ops=2 * b * h * h, weight=h * h + h, act_in=b * h, act_out=b * h),
           Operator("medusa_act", "vector", heads, ops=ACT_OPS["silu"] * b * h + b * h, act_in=2 * b * h,
                    act_out=b * h),
           Operator("medusa_lm_head", "matmul", heads, ops=2 * b * h * v, weight=h * v, act_in=b * h, act_out=b * v))
    return OpTable("decode", ops, scenario.weights, scenario.activations, scenario.kv, scenario.tp, b, 0)


def decode_linear(model: ModelSpec, scenario: Scenario, kv_len: int, buffer_bytes: float = 0.0):
    """Return (table, slope): the decode-step table at ``kv_len`` and a table whose
    element and op counts are the increase per extra key attended. Every count of a
    decode step is affine in the context length, so step(L) = table + (L - kv_len) * slope,
    until a sliding window fills (``decode_pieces`` splits the decode there)."""
    a = decode_step(model, scenario, kv_len, buffer_bytes)
    b = decode_step(model, scenario, kv_len + 1, buffer_bytes)
    slope_ops = tuple(replace(oa, **{f: getattr(ob, f) - getattr(oa, f) for f in AMOUNT_FIELDS})
                      for oa, ob in zip(a.operators, b.operators))
    return a, replace(a, operators=slope_ops)


def decode_limits(model: ModelSpec, kv_budget: int = 0) -> tuple[int, ...]:
    """The numbers of keys past which a decode step of ``model`` stops growing with the context
    (``decode_pieces`` splits the decode there): its sliding-window layers' window, a KV token
    budget (``kv_budget``, 0: none) and a sparse attention's top-k, those it has."""
    return tuple(w for w in (model.sliding_window if model.num_sliding_layers else 0, kv_budget, model.index_topk)
                 if w)


def decode_pieces(model: ModelSpec, scenario: Scenario, kv_len: int, buffer_bytes: float = 0.0):
    """The decode steps from ``kv_len`` keys on as affine pieces ((first step, table, slope), ...):
    step j (attending to kv_len + j keys) of the piece starting at step j_k is
    table + (j - j_k) x slope. Every count is affine in the context except the attention of a
    sliding-window layer, which stops growing once its window is full, and every layer's under a
    KV token budget once the budget is full: a new piece starts at the first step attending to
    more keys than each such limit above ``kv_len``. Of many workloads (``kv_len`` an array, one
    per workload) one limit at the most: its piece's first step is one per workload, infinite
    where the workload starts past the limit (the piece never runs; ``decode_piece_steps``)."""
    limits = sorted({w for w in decode_limits(model, scenario.techniques.kv_budget) if np.any(w > kv_len)})
    if len(limits) > 1 and np.ndim(kv_len):
        raise DseError("a decode whose sliding window and KV budget both fill is priced one workload at a time")
    pieces = [(0, *decode_linear(model, scenario, kv_len, buffer_bytes))]
    for w in limits:
        first = w - kv_len + 1 if not np.ndim(kv_len) else np.where(w > kv_len, w - kv_len + 1.0, np.inf)
        pieces.append((first, *decode_linear(model, scenario, w + 1, buffer_bytes)))
    return tuple(pieces)


def decode_piece_steps(firsts, steps) -> list:
    """The decode steps each affine piece (``decode_pieces``, whose first steps are ``firsts``) runs
    of ``steps`` steps: from its first step to the next piece's, or to the end. Numbers: the
    pieces that run (a list of (index, steps)); arrays (one entry per workload): every piece, with
    0 steps where it does not run."""
    ends = list(firsts[1:]) + [steps]
    if not any(np.ndim(x) for x in (*firsts, steps)):
        return [(k, min(end, steps) - j) for k, (j, end) in enumerate(zip(firsts, ends)) if min(end, steps) > j]
    return [(k, np.maximum(np.minimum(end, steps) - j, 0.0)) for k, (j, end) in enumerate(zip(firsts, ends))]
