"""ModelSpec: the architecture of a transformer LLM, read from an unmodified
Hugging Face ``config.json``.

Supported families (by ``model_type``; any other is refused, never read as another family):

- llama, mistral, phi3 (fused qkv / gate_up, the llama shapes), qwen2, qwen3 (explicit head_dim,
  RMSNorm of every query and key head): gated MLP, MHA/GQA. Llama 3.x ``rope_scaling`` does
  not change any shape.
- gemma2, gemma3 (or gemma3_text; a multimodal gemma3 config is read from its ``text_config``,
  its SigLIP vision tower from ``vision_config``: ``workloads.vision``): GeGLU (``hidden_activation``, gelu_pytorch_tanh), four norms per
  block, tied embeddings, local sliding-window layers between global ones (gemma2 alternates
  1:1, gemma3 has one global layer in ``sliding_window_pattern``); fields a published config leaves
  out take the defaults of the transformers config class (cited at ``_DEFAULTS``).
- mixture of experts: mixtral, qwen2_moe (shared expert with a sigmoid gate, ``decoder_sparse_step``
  and ``mlp_only_layers``), qwen3_moe, gpt_oss (biases on attention, router and experts; the
  per-head attention sinks, ``num_attention_heads`` learned logits a layer, each joining a query's
  softmax denominator: counted as parameters and as one more softmax element per query and head,
  ``ModelSpec.attention_sinks``; gpt-oss model card, arXiv:2508.10925 sec. 2.1), dbrx (nested ``attn_config`` and
  ``ffn_config``, LayerNorm without bias), deepseek_v2 / deepseek_v3 (MLA + MoE with shared
  experts), llama4 (read from its ``text_config``, or llama4_text: see below), minimax_m2
  (MiniMax-M2/M2.5/M2.7: full attention in every layer, ``attn_type_list`` all 1, with q and k
  RMSNorms over all heads, ``qk_norm_type`` per_layer, ``ModelSpec.qk_norm_per_layer``; every layer
  an MoE of ``num_local_experts`` experts of ``intermediate_size``, sigmoid scores with a bias per
  expert; its MTP modules not read: ``_minimax_m2``).
- qwen3_vl (Qwen3-VL): the Qwen3 decoder of ``text_config`` (model_type qwen3_vl_text) and the
  vision tower of ``vision_config`` (``workloads.vision``); ``ModelSpec.vision`` holds the tower,
  which runs only where a point's requests carry images (``images``).
- qwen2_5_vl (Qwen2.5-VL): the Qwen2 decoder of the top-level fields and the vision tower of
  ``vision_config`` (window attention, gated MLP: ``workloads.vision``).
- aliases (``ALIASES``): a model_type named there is read as the family it names, and only when
  ``architectures`` lists that family's architecture: kimi_k2 (Kimi-K2, DeepseekV3ForCausalLM) is
  read as deepseek_v3; glm_moe_dsa (GLM-5, GlmMoeDsaForCausalLM) as deepseek_v32. Any other model_type is refused.
- llama4 (Llama 4 Scout / Maverick): the text decoder of ``text_config``, and the vision encoder of
  ``vision_config`` where the config gives one (``workloads.vision``: tiles of 336 px); without one
  the loaded model says in ``notes`` that the tower is not modelled.
  MoE layers are ``moe_layers``, else every ``interleave_moe_layer_step``-th layer (from layer
  step - 1); the others are dense with a gated MLP of ``intermediate_size_mlp``. An MoE layer has
  ``num_local_experts`` routed experts of width ``intermediate_size`` (top-k
  ``num_experts_per_tok``, a sigmoid router without bias) and one shared expert of the same width.
  Chunked attention: a RoPE layer (``no_rope_layers[i]`` = 1; when the list is absent or empty all
  but every ``no_rope_layer_interval``-th layer) attends within its chunk of
  ``attention_chunk_size`` tokens; the NoPE layers attend to the whole context. A chunked layer is
  priced by the sliding-window rule below with the chunk as the window (``chunked_attention``): its
  cache and keys are bounded by the chunk as a window's are, an upper bound on its keys (a query at
  position i attends i mod C + 1 <= C keys, about C/2 on average). Scout's ``use_qk_norm`` (an L2
  norm of q and k without weights, on RoPE layers) is left out: no parameters, ~4 vector ops per
  element. Defaults of keys a config leaves out: Llama4TextConfig (``_DEFAULTS``).
- deepseek_v32 (DeepSeek-V3.2): DeepSeek-V3's layers with DeepSeek Sparse Attention: a lightning
  indexer of ``index_n_heads`` heads of ``index_head_dim`` (one key a token, cached beside the MLA
  latent) scores every earlier token and each query attends to the ``index_topk`` best
  (``ModelSpec.index_topk``; ``workloads.optable`` prices the indexer and the attention over the
  selected tokens, the KV cache still holds every token).
- multi-token prediction: ``num_nextn_predict_layers`` (DeepSeek-V3) and ``mtp_num_hidden_layers``
  (Qwen3.5; its MTP layer a full-attention block with the model's MLP or MoE, sharing the embedding:
  ``mtp_use_dedicated_embeddings`` false) are read as ``mtp_layers``, the MTP modules a ``--draft mtp:N``
  chains (their weights are not in the main model's count).
- gptj (parallel attention+MLP, GeLU), falcon (parallel blocks, MQA/GQA), opt (ReLU MLP, learned
  positions), bloom (GeLU, ALiBi).

- hybrid and linear-attention models (``layer_mixers``, ``layer_ffns``: what each layer holds; the
  recurrent layers' dims in the ``ssm_*`` fields, one recurrent kind a model):
  qwen3_next, qwen3_5 / qwen3_5_text (dense) and qwen3_5_moe / qwen3_5_moe_text (the Qwen3.5 VLM
  configs are read from their ``text_config``, the vision tower from ``vision_config`` as Qwen3-VL's;
  the multi-token-prediction layers are ``mtp_layers``): ``layer_types`` (``linear_attention`` or
  ``full_attention``), else every ``full_attention_interval``-th layer full; the linear layers are
  Gated DeltaNet (Yang, Kautz, Hatamizadeh, "Gated Delta Networks: Improving Mamba2 with Delta
  Rule", ICLR 2025; Qwen3-Next model card): ``linear_num_key_heads`` x ``linear_key_head_dim``
  queries and keys, ``linear_num_value_heads`` x ``linear_value_head_dim`` values, a depthwise
  causal conv of ``linear_conv_kernel_dim`` over q, k, v, a state of key dim x value dim per value
  head; full-attention layers with ``attn_output_gate`` (a sigmoid gate on the output: q_proj twice
  as wide) and q/k norms. nemotron_h (Nemotron-H, Nemotron 3 Nano): one mixer or FFN per layer
  after ``hybrid_override_pattern`` (M Mamba-2, * attention, - MLP, E MoE); Mamba-2 (Dao & Gu,
  "Transformers are SSMs", ICML 2024) of ``mamba_num_heads`` x ``mamba_head_dim`` with B and C of
  ``n_groups`` x ``ssm_state_size``, a conv of ``conv_kernel`` (bias ``use_conv_bias``), the scan
  in chunks of ``chunk_size``; MLP and experts ungated (``mlp_hidden_act`` relu2). The state's
  element is 4 bytes where the config fixes float32 (``mamba_ssm_dtype``,
  ``mamba_ssm_cache_dtype``), else the activations' (the model's dtype).
  jamba (Jamba, Jamba-1.5): attention in layer i where i % ``attn_layer_period`` ==
  ``attn_layer_offset``, Mamba-1 in the others (Gu & Dao, "Mamba: Linear-Time Sequence Modeling with
  Selective State Spaces", arXiv:2312.00752; transformers' JambaMambaMixer): in_proj to x and z of
  d_inner = ``mamba_expand`` x hidden each, a depthwise conv of ``mamba_d_conv`` over x (bias
  ``mamba_conv_bias``), x_proj to the time step's rank ``mamba_dt_rank`` and B, C of
  ``mamba_d_state``, each RMS-normed, dt_proj back to d_inner (with bias), A (d_inner x d_state) and
  D, y * silu(z), out_proj; a state of d_inner x d_state per layer (read as ``ssm_heads`` = d_inner
  heads of width 1, no groups). MoE (``num_experts`` of ``intermediate_size``, top-k
  ``num_experts_per_tok``, a router without bias) in layer i where i % ``expert_layer_period`` ==
  ``expert_layer_offset``, a gated MLP in the others.

A config of a dense family that names routed experts (``num_local_experts``, ``num_experts``,
``n_routed_experts`` or ``moe_num_experts`` above 0) is refused: an MoE is never read as dense.

Sliding-window attention: a layer with window W attends to, and caches, the last min(context, W)
tokens. Which layers slide: ``layer_types`` when the config lists it; else gemma2 and gpt_oss
every other layer from the first, gemma3 all but every ``sliding_window_pattern``-th, mistral,
mixtral and phi3 every layer when ``sliding_window`` is set, qwen2/qwen3 (and MoE) the layers from
``max_window_layers`` on when ``use_sliding_window`` is true. A window at least as long as
``max_position_embeddings`` never binds and is dropped.

Reading is strict: every field the model uses is checked for type, finiteness and
range (counts are integers from 1, or 0 where 0 means "none", up to ``MAX_SIZE`` =
2**40), and every bad input is one DseError line ``{path}: {key}: {what is wrong};
{what is allowed}`` -- never a traceback, never a silently wrong number.
"""
from __future__ import annotations

import dataclasses
import json
import math
import numbers
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from basis.errors import DseError, shown_key
from basis.files import read_input
from basis.shipped import shipped, shipped_folder
from workloads.vision import (
    LLAMA4_MAX_TILES,
    QWEN2_5_VL_MAX_PIXELS,
    QWEN2_5_VL_MIN_PIXELS,
    QWEN3_VL_MAX_PIXELS,
    QWEN3_VL_MIN_PIXELS,
    VisionSpec,
)

#: the recurrent mixers a layer may hold (a fixed-size state per sequence, no KV cache)
RECURRENT_KINDS = ("gdn", "mamba2", "mamba1")

#: the shipped model configs (``configs/models``; package data in a wheel)
MODELS_DIR = shipped("configs", "models")


@dataclass(frozen=True)
class ModelSpec:
    """Shapes of one decoder-only transformer (all counts are elements, not bytes)."""

    name: str
    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    mlp_gated: bool = True            # SwiGLU-style gate_proj * up_proj
    mlp_activation: str = "silu"
    parallel_block: bool = False      # attention and MLP read the same input (GPT-J, Falcon)
    norms_per_block: int = 2          # 4: Gemma's norms before and after attention and MLP
    norm_type: str = "rmsnorm"        # rmsnorm | layernorm
    norm_bias: bool = True            # a LayerNorm has a bias (DBRX's have none)
    qk_norm: bool = False             # RMSNorm of every query and key head (Qwen3, Gemma 3)
    qk_norm_per_layer: bool = False   # ... over all heads at once, a weight per element (MiniMax-M2's per_layer)
    padding_note: str = ""            # the heads an engine padded this model to, in words (``workloads.head_padding``)
    attention_bias: bool = False      # q/k/v projections have a bias
    o_proj_bias: bool = False
    mlp_bias: bool = False            # MLP and expert projections have biases (gpt-oss experts)
    lm_head_bias: bool = False
    tie_word_embeddings: bool = False
    position_embeddings: int = 0      # rows of a learned position table (OPT)
    embedding_norm: bool = False      # LayerNorm right after the embedding (BLOOM)
    final_norm: bool = True
    # Mixture of experts
    num_experts: int = 0              # routed experts per MoE layer
    experts_per_token: int = 0        # top-k
    moe_intermediate_size: int = 0
    num_shared_experts: int = 0
    shared_expert_intermediate_size: int = 0  # width of the shared expert(s) together
    shared_expert_gate: bool = False  # a sigmoid gate (hidden -> 1) on the shared expert (Qwen-MoE)
    router_bias: bool = False         # a bias per routed expert (gpt-oss; DeepSeek-V3's score correction)
    first_dense_layers: int = 0       # MoE models: layers with a dense MLP (DeepSeek's first_k_dense_replace;
    #                                   Qwen-MoE's mlp_only_layers and layers off decoder_sparse_step; Llama 4's
    #                                   layers between interleave_moe_layer_step's MoE layers)
    # Multi-head latent attention (DeepSeek)
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # Sliding-window attention
    sliding_window: int = 0           # tokens a sliding layer attends to and caches (0: no sliding layers)
    sliding_layers: tuple = ()        # indices (from 0) of the layers with the window
    max_position_embeddings: int = 0  # the longest context (prompt + generation); 0: not given
    chunked_attention: bool = False   # the windowed layers attend within fixed chunks of sliding_window
    #                                   tokens (Llama 4), priced as a sliding window of that size
    attention_sinks: bool = False     # a learned logit per head joins each query's softmax denominator
    #                                   (gpt-oss: num_attention_heads numbers a layer, no value)
    # DeepSeek Sparse Attention (DeepSeek-V3.2): the lightning indexer and its top-k token selection
    index_n_heads: int = 0            # indexer query heads (0: dense attention)
    index_head_dim: int = 0           # indexer head size; its one key per token is cached per layer
    index_topk: int = 0               # tokens each query attends (0: every earlier token)
    # Multi-token prediction (DeepSeek-V3 sec. 2.2): MTP modules shipped beside the model
    mtp_layers: int = 0               # num_nextn_predict_layers
    # A native draft head run as a model of its own (``draft_head_model``): 'mtp' or 'eagle', its
    # embedding and LM head the target's (shared, not counted again), an input projection of
    # 2 x hidden -> hidden fusing the token's embedding with the target's hidden feature
    draft_head: str = ""
    # Hybrid and linear-attention models (empty layer_mixers: every layer attention + its MLP or MoE)
    layer_mixers: tuple = ()          # per layer: 'attention', 'gdn' (Gated DeltaNet), 'mamba2', 'mamba1' or '' (none)
    layer_ffns: tuple = ()            # per layer: 'mlp', 'moe' or '' (none)
    attn_output_gate: bool = False    # a sigmoid gate on the attention output (q_proj twice as wide)
    ssm_heads: int = 0                # recurrent layers: value heads H (GDN's value heads, Mamba-2's heads)
    ssm_head_dim: int = 0             # P: a value head's width
    ssm_state_dim: int = 0            # N: GDN's key head dim, Mamba-2's ssm_state_size
    ssm_groups: int = 0               # G: GDN's key heads, Mamba-2's n_groups (B and C)
    ssm_conv_kernel: int = 0          # taps of the depthwise causal conv over x (q, k, v) and B, C
    ssm_conv_bias: bool = False
    ssm_chunk: int = 0                # tokens a chunk of the prefill's chunked scan
    ssm_state_bytes: float = 0.0      # bytes of a state element where the config fixes it (float32: 4); 0: activations'
    ssm_dt_rank: int = 0              # Mamba-1: rank of the time step's low-rank projection (x_proj -> dt_proj)
    notes: tuple = ()                 # what of the config is read how, or not modelled (shown by describe, analyze)
    source: str = ""
    vision: VisionSpec | None = None  # the vision tower of a vision-language model (``vision_config``)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def is_sparse_attention(self) -> bool:
        """Whether a lightning indexer selects ``index_topk`` tokens per query (DeepSeek-V3.2)."""
        return self.index_topk > 0

    @property
    def num_moe_layers(self) -> int:
        if self.layer_ffns:
            return self.layer_ffns.count("moe")
        return self.num_layers - self.first_dense_layers if self.is_moe else 0

    @property
    def num_dense_layers(self) -> int:
        """Layers with a dense MLP."""
        if self.layer_ffns:
            return self.layer_ffns.count("mlp")
        return self.num_layers - self.num_moe_layers

    @property
    def is_hybrid(self) -> bool:
        """Layers of other kinds than attention + MLP (recurrent mixers, mixer-only or FFN-only layers)."""
        return bool(self.layer_mixers)

    @property
    def num_attention_layers(self) -> int:
        """Layers with attention (and a KV cache)."""
        return self.layer_mixers.count("attention") if self.layer_mixers else self.num_layers

    @property
    def recurrent_kind(self) -> str:
        """'gdn', 'mamba2', 'mamba1' or '' (no recurrent layers)."""
        return next((k for k in self.layer_mixers if k in RECURRENT_KINDS), "")

    @property
    def num_recurrent_layers(self) -> int:
        """Layers with a recurrent mixer (a fixed-size state per sequence, no KV cache)."""
        return sum(1 for k in self.layer_mixers if k in RECURRENT_KINDS)

    @property
    def num_mixer_layers(self) -> int:
        """Layers with a token mixer (attention or recurrent)."""
        return sum(1 for k in self.layer_mixers if k) if self.layer_mixers else self.num_layers

    @property
    def num_ffn_layers(self) -> int:
        """Layers with an MLP or MoE."""
        return sum(1 for k in self.layer_ffns if k) if self.layer_ffns else self.num_layers

    @property
    def ssm_conv_channels(self) -> int:
        """Channels of a recurrent layer's conv: x (H P) and B, C (2 G N)."""
        return self.ssm_heads * self.ssm_head_dim + 2 * self.ssm_groups * self.ssm_state_dim

    @property
    def ssm_state_elems(self) -> int:
        """Elements of one recurrent layer's scan state of one sequence: H x P x N."""
        return self.ssm_heads * self.ssm_head_dim * self.ssm_state_dim

    @property
    def ssm_conv_state_elems(self) -> int:
        """Elements of one recurrent layer's conv state of one sequence: the last K - 1 inputs."""
        return self.ssm_conv_channels * max(self.ssm_conv_kernel - 1, 0)

    @property
    def num_sliding_layers(self) -> int:
        """Layers attending to the last ``sliding_window`` tokens only."""
        return len(self.sliding_layers)

    @property
    def num_global_layers(self) -> int:
        """Layers attending to the whole context."""
        return self.num_layers - self.num_sliding_layers

    @property
    def norm_weights_per_element(self) -> int:
        """Parameters of a norm per normalized element: a gain, and a LayerNorm's bias."""
        return 2 if self.norm_type == "layernorm" and self.norm_bias else 1

    @property
    def attention_kind(self) -> str:
        """'MLA', 'MHA', 'MQA' or 'GQA'."""
        if self.is_mla:
            return "MLA"
        if self.num_kv_heads == self.num_heads:
            return "MHA"
        return "MQA" if self.num_kv_heads == 1 else "GQA"

    @property
    def kv_elems_per_token_per_layer(self) -> int:
        """Elements of KV cache one token adds to one layer (K and V, or MLA's latent)."""
        if self.is_mla:
            return self.kv_lora_rank + self.qk_rope_head_dim + self.index_head_dim   # and the indexer's key
        return 2 * self.num_kv_heads * self.head_dim


#: the native draft heads ``draft_head_model`` builds
DRAFT_HEADS = ("mtp", "eagle")


def draft_head_model(m: ModelSpec, kind: str) -> ModelSpec:
    """The ModelSpec of one pass of a native draft head of target ``m`` (run once per drafted token):

    - 'mtp' (DeepSeek-AI, "DeepSeek-V3 Technical Report", arXiv:2412.19437, sec. 2.2, Fig. 3): an
      MTP module, RMSNorm of the previous depth's hidden state and of the next token's embedding,
      their concatenation projected 2h -> h (M_k), one Transformer block of the main model's shape
      (an MoE block where the model has experts, with its sparse-attention indexer where it has one),
      the embedding and output head shared with the main model;
    - 'eagle' (Li et al., "EAGLE: Speculative Sampling Requires Rethinking Feature Uncertainty",
      ICML 2024, sec. 4): the target's feature and the next token's embedding concatenated, an FC
      layer 2h -> h and one decoder layer: the target's attention and a dense gated MLP of its
      ``intermediate_size`` (an MoE target's dense width; a hybrid's: an attention layer), its embedding and LM head the target's.

    DseError for 'mtp' on a model that ships no MTP module (``num_nextn_predict_layers`` 0)."""
    if kind == "mtp" and not m.mtp_layers:
        raise DseError(f"spec_draft: mtp:N needs the model's multi-token-prediction modules; '{m.name}' ships none "
                       "(num_nextn_predict_layers or mtp_num_hidden_layers 0 or absent); use eagle or a draft model")
    experts = {} if kind == "mtp" else dict(num_experts=0, experts_per_token=0, num_shared_experts=0,
                                            shared_expert_intermediate_size=0, shared_expert_gate=False,
                                            router_bias=False)
    return dataclasses.replace(m, name=f"{m.name} {kind}", num_layers=1, first_dense_layers=0, **experts,
                               sliding_layers=(), sliding_window=0, chunked_attention=False, mtp_layers=0,
                               draft_head=kind, vision=None, notes=(), layer_mixers=(), layer_ffns=())


def qk_norm_weights(m: ModelSpec, heads, kv_heads) -> float:
    """Weights of one layer's query and key norms on a device holding ``heads`` query and
    ``kv_heads`` key heads: one RMSNorm of head_dim each (Qwen3, Gemma 3), or one over all heads
    with a weight per element (MiniMax-M2's ``per_layer``); 0 without them."""
    if not m.qk_norm:
        return 0.0
    return (heads + kv_heads) * m.head_dim if m.qk_norm_per_layer else 2.0 * m.head_dim


def context_limit(m: ModelSpec, max_context: int = 0) -> int:
    """Tokens a sequence may hold: ``max_context`` when given (> 0), else the model's
    ``max_position_embeddings`` (0: the config gives none, nothing is checked)."""
    return max_context or m.max_position_embeddings or 0


def context_error(m: ModelSpec, prompt_len: int, gen_len: int, max_context: int = 0) -> str:
    """'' when a prompt of ``prompt_len`` tokens and ``gen_len`` generated ones fit in the
    context, else why not. The context is ``max_context`` tokens when given (> 0: a longer
    one served with RoPE scaling, as engines allow with ``--max-model-len``), else the
    model's ``max_position_embeddings`` (not checked when the config gives none)."""
    used = prompt_len + gen_len
    limit = context_limit(m, max_context)
    if not limit or used <= limit:
        return ""
    if max_context:
        return f"prompt_len {prompt_len} + gen_len {gen_len} = {used} tokens exceed max_context {limit}"
    return (f"prompt_len {prompt_len} + gen_len {gen_len} = {used} tokens exceed the {limit}-token context of "
            f"model '{m.name}' (max_position_embeddings in {m.source or 'its config'}; max_context sets a "
            f"longer one)")


# ---------------------------------------------------------------------------------------------
# Validation. Every value read from a config passes one of three checks (_int, _flag, _text);
# each failure is one DseError line "{path}: {key}: {what is wrong}; {what is allowed}".

MAX_SIZE = 2 ** 40
"""Upper bound on any count or size read from a config (no real model comes near it)."""
_MAX_TEXT = "2**40"
#: the most layers a config may give: tables of one entry per layer are built (sliding-window flags,
#: per-layer operators), so 10^12 layers asked for 931 GiB before anything was checked; 10^5 is about
#: 800 times the deepest config shipped (126 layers, llama-3.1-405b)
MAX_LAYERS = 100_000
_REQUIRED = object()


def _one_line(text: str) -> DseError:
    """DseError of ``text`` with control characters (a newline in a file or key name) escaped."""
    return DseError("".join(c if c >= " " else repr(c)[1:-1] for c in text))


def _fail(path, key: str, problem: str) -> DseError:
    return _one_line(f"{path}: {key}: {problem}")


class _Section(dict):
    """A nested object of a config (``text_config``, ``attn_config``): its keys are named
    ``{prefix}{key}`` in messages."""

    def __init__(self, fields: dict, prefix: str):
        super().__init__(fields)
        self.prefix = prefix


def _named(cfg: dict, key: str) -> str:
    """``key`` as a message names it: with the prefix of the section it sits in."""
    return getattr(cfg, "prefix", "") + key


def _show(v) -> str:
    """``v`` as one short phrase: a number, null, a boolean or a list of numbers as it would read
    in JSON (shortened); a string, an object or another list by its kind and size only."""
    if isinstance(v, _NotFinite):
        return v.text
    if isinstance(v, float) and not math.isfinite(v):
        return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
    if isinstance(v, int) and not isinstance(v, bool):
        try:
            s = str(v)
        except ValueError:      # more digits than Python prints
            return f"an integer of about {round(v.bit_length() * 0.30103)} digits"
        return s if len(s) <= 40 else f"an integer of {len(s.lstrip('-'))} digits"
    if isinstance(v, str):          # a file's text is never quoted back (it may be anything)
        return "an empty string" if not v else f"a string of {len(v)} characters"
    if isinstance(v, dict):
        return f"an object of {len(v)} key{'s' * (len(v) != 1)}"
    if isinstance(v, list) and not all(x is None or isinstance(x, (int, float)) for x in v):
        return f"a list of {len(v)} item{'s' * (len(v) != 1)}"
    try:
        s = json.dumps(v, allow_nan=True)
    except (TypeError, ValueError, RecursionError):
        s = f"a Python {type(v).__name__}"
    kind = ({bool: "a boolean", list: "a list"}.get(type(v), "")
            if v is not None and not isinstance(v, float) else "")
    s = s if len(s) <= 40 else s[:37] + "..."
    return f"{s} ({kind})" if kind else s


def _lookup(cfg: dict, keys: tuple[str, ...]):
    """(key, value) of the first of ``keys`` with a non-null value, else (None, None)."""
    for k in keys:
        if cfg.get(k) is not None:
            return k, cfg[k]
    return None, None


def _int(cfg: dict, path: str, *keys: str, default=_REQUIRED, lo: int = 1, hi: int = MAX_SIZE,
         hi_name: str | None = None) -> int:
    """The integer under the first of ``keys`` present and not null, checked to lie in
    [lo, hi] (``hi_name``: the key ``hi`` came from); ``default`` when none is given,
    DseError when none is given and there is no default. Integral floats (4096.0) are
    accepted; booleans, strings, fractions, NaN/Infinity and out-of-range values are not."""
    allowed = f"expected an integer from {lo} to " + (f"{hi} ({hi_name})" if hi_name else
                                                       _MAX_TEXT if hi == MAX_SIZE else str(hi))
    key, v = _lookup(cfg, keys)
    also = f" (also tried {', '.join(keys[1:])})" if len(keys) > 1 else ""
    if key is None:
        if default is not _REQUIRED:
            return default
        null = next((k for k in keys if k in cfg), None)
        what = "got null" if null else f"config.json is missing '{_named(cfg, keys[0])}'"
        raise _fail(path, _named(cfg, null or keys[0]), f"{what}{also}; {allowed}")
    name = _named(cfg, key)
    if isinstance(v, bool) or not isinstance(v, (numbers.Integral, numbers.Real)):
        raise _fail(path, name, f"got {_show(v)}; {allowed}")
    if not isinstance(v, numbers.Integral):
        v = float(v)
        if not math.isfinite(v):
            raise _fail(path, name, f"got {_show(v)}, not a finite number; {allowed}")
        if not v.is_integer():
            raise _fail(path, name, f"got {_show(v)}, not a whole number; {allowed}")
    v = int(v)
    if v < lo:
        raise _fail(path, name, f"got {_show(v)}, below {lo}; {allowed}")
    if v > hi:
        why = (f"above {hi_name} ({hi})" if hi_name else
               f"above {_MAX_TEXT} (no real model is that large)" if hi == MAX_SIZE else f"above {hi}")
        raise _fail(path, name, f"got {_show(v)}, {why}; {allowed}")
    return v


def _flag(cfg: dict, path: str, key: str, default: bool) -> bool:
    """The boolean under ``key`` (true/false, or 0/1); ``default`` when absent or null."""
    v = cfg.get(key)
    if v is None:
        return default
    if isinstance(v, bool):
        return v
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    raise _fail(path, _named(cfg, key), f"got {_show(v)}; expected true or false")


def _text(cfg: dict, path: str, key: str, default: str) -> str:
    """The string under ``key``; ``default`` when absent or null."""
    v = cfg.get(key)
    if v is None:
        return default
    if not isinstance(v, str):
        raise _fail(path, _named(cfg, key), f"got {_show(v)}; expected a string")
    return v


#: model_type -> whether the family has routed experts; the families this reader knows
FAMILIES = {
    "llama": False, "mistral": False, "phi3": False, "qwen2": False, "qwen3": False,
    "gemma2": False, "gemma3": False, "gemma3_text": False,
    "gptj": False, "falcon": False, "opt": False, "bloom": False,
    "mixtral": True, "qwen2_moe": True, "qwen3_moe": True, "gpt_oss": True, "dbrx": True,
    "deepseek_v2": True, "deepseek_v3": True, "deepseek_v32": True, "llama4": True, "llama4_text": True,
    "kimi_k2": True, "qwen3_vl": False, "qwen2_5_vl": False,
    "qwen3_next": True, "qwen3_5": False, "qwen3_5_text": False, "qwen3_5_moe": True, "qwen3_5_moe_text": True,
    "nemotron_h": True, "jamba": True, "glm_moe_dsa": True, "minimax_m2": True,
}
#: hybrid families with Gated DeltaNet layers (``layer_types`` linear_attention) and their text decoders
_GDN_FAMILIES = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")
#: VLM wrappers read from their ``text_config`` -> the text decoder's model_type
_TEXT_OF = {"qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text"}
#: Nemotron-H's hybrid_override_pattern: a layer's character -> (its mixer, its FFN)
_NEMOTRON_PATTERN = {"M": ("mamba2", ""), "*": ("attention", ""), "-": ("", "mlp"), "E": ("", "moe")}
#: tokens a chunk of Gated DeltaNet's chunked prefill scan: the chunk size of flash-linear-attention's
#: chunk_gated_delta_rule kernels (BT = 64), which Qwen3-Next's reference implementation calls
_GDN_CHUNK = 64
#: model_type -> (the family it is read as, the architecture ``architectures`` must list for it):
#: configs whose model_type names a model but whose architecture is a family's (Kimi-K2's config
#: declares DeepseekV3ForCausalLM, the DeepSeek-V3 decoder)
ALIASES = {"kimi_k2": ("deepseek_v3", "DeepseekV3ForCausalLM"),
           # GLM-5: DeepSeek-V3.2's layers (MLA, the lightning indexer and its top-k, MoE with a shared
           # expert and sigmoid routing, an MTP layer) at its own sizes (GLM-5 technical report, arXiv:2602.15763)
           "glm_moe_dsa": ("deepseek_v32", "GlmMoeDsaForCausalLM")}
#: model_type -> why this reader refuses it (a known model whose attention it does not model yet)
NOT_MODELLED: dict = {}
SUPPORTED_MODEL_TYPES = tuple(sorted(FAMILIES))
#: keys that give a number of routed experts in some family's config
_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
#: values the transformers config class takes for keys a published config leaves out (only for
#: the keys read below): Gemma2Config and Gemma3TextConfig (huggingface/transformers,
#: src/transformers/models/gemma2/configuration_gemma2.py at 008e574391258935f3ecc3035c882e73bbcac419,
#: src/transformers/models/gemma3/configuration_gemma3.py at 008f5c8c29be84d4721dc6d1e0fcd72300580be4)
_DEFAULTS = {
    "gemma2": {"vocab_size": 256_000, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
               "max_position_embeddings": 8192, "tie_word_embeddings": True, "sliding_window": 4096},
    "gemma3_text": {"vocab_size": 262_208, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
                    "max_position_embeddings": 131_072, "tie_word_embeddings": True, "sliding_window": 4096,
                    "sliding_window_pattern": 6},
    # Llama4TextConfig, src/transformers/models/llama4/configuration_llama4.py at
    # 008e574391258935f3ecc3035c882e73bbcac419 (attention_chunk_size: null there means no chunking)
    "llama4_text": {"intermediate_size": 8192, "intermediate_size_mlp": 16384, "num_experts_per_tok": 1,
                    "num_local_experts": 16, "interleave_moe_layer_step": 1, "no_rope_layer_interval": 4,
                    "attention_chunk_size": 8192, "tie_word_embeddings": False},
}
#: Qwen2/Qwen3 (and MoE) config classes: layers from max_window_layers on slide when use_sliding_window
_QWEN_MAX_WINDOW_LAYERS = 28
_LAYER_TYPES = ("full_attention", "sliding_attention")


def _model_type(cfg: dict, path) -> str:
    """The model_type of ``cfg``, one of SUPPORTED_MODEL_TYPES; DseError naming the key otherwise."""
    v = cfg.get("model_type")
    allowed = f"expected one of {', '.join(SUPPORTED_MODEL_TYPES)}"
    if v is None:
        what = "got null" if "model_type" in cfg else "config.json is missing 'model_type'"
        raise _fail(path, _named(cfg, "model_type"), f"{what}; {allowed}")
    if not isinstance(v, str):
        raise _fail(path, _named(cfg, "model_type"), f"got {_show(v)}; expected a string")
    if v.lower() in NOT_MODELLED:
        raise _fail(path, _named(cfg, "model_type"), f"got '{v.lower()}': {NOT_MODELLED[v.lower()]}; {allowed}")
    if v.lower() not in FAMILIES:
        raise _fail(path, _named(cfg, "model_type"), f"got {_show(v)}, a model family this reader does not "
                    f"know (it is not read as another family); {allowed}")
    return v.lower()


def _section(cfg: dict, path, key: str, defaults: dict | None = None) -> _Section:
    """The nested object under ``key`` (with ``defaults`` for the keys it leaves out)."""
    v = cfg.get(key)
    if not isinstance(v, dict):
        what = (f"config.json is missing '{_named(cfg, key)}'" if key not in cfg else
                "got null" if v is None else f"got {_show(v)}")
        raise _fail(path, _named(cfg, key), f"{what}; expected an object {{...}} of the model's fields")
    return _Section({**(defaults or {}), **v}, _named(cfg, key) + ".")


def _minimax_m2(cfg: dict, path, layers: int, inter: int) -> dict:
    """MiniMax-M2's fields (MiniMaxM2ForCausalLM, MiniMax-M2 / M2.5 / M2.7): every layer full attention
    (``attn_type_list`` all 1; 0 would be a lightning-attention layer, MiniMax-Text-01's, not read) with
    q and k RMSNorms over all heads (``qk_norm_type`` per_layer) or per head, and an MoE of
    ``num_local_experts`` experts of ``intermediate_size`` (top ``num_experts_per_tok``, sigmoid scores
    with a bias per expert: ``use_routing_bias``), no shared expert (``shared_intermediate_size`` 0).
    Its MTP modules (``use_mtp``, ``num_mtp_modules``) are not read: the config gives their number, not
    their structure."""
    kinds = cfg.get("attn_type_list")
    if kinds is not None:
        if not isinstance(kinds, list) or len(kinds) != layers or any(k not in (0, 1) or isinstance(k, bool) for k in kinds):
            raise _fail(path, _named(cfg, "attn_type_list"), f"expected a list of {layers} entries, each 1 (full "
                        "attention) or 0 (lightning attention)")
        if 0 in kinds:
            raise _fail(path, _named(cfg, "attn_type_list"), f"{kinds.count(0)} lightning-attention layers (0); "
                        "only full-attention layers (1) are read for minimax_m2")
    shared = _int(cfg, path, "shared_intermediate_size", default=0, lo=0)
    if shared:
        raise _fail(path, _named(cfg, "shared_intermediate_size"), f"got {shared}; only 0 (no shared expert) is "
                    "read for minimax_m2")
    experts = _int(cfg, path, "num_local_experts")
    norm = _flag(cfg, path, "use_qk_norm", False)
    kind = _text(cfg, path, "qk_norm_type", "per_layer")
    if norm and kind not in ("per_layer", "per_head"):
        raise _fail(path, _named(cfg, "qk_norm_type"), f"got {_show(kind)}; expected per_layer or per_head")
    return dict(num_experts=experts, moe_intermediate_size=inter,
                experts_per_token=_int(cfg, path, "num_experts_per_tok", hi=experts, hi_name="num_local_experts"),
                router_bias=_flag(cfg, path, "use_routing_bias", False), qk_norm=norm,
                qk_norm_per_layer=norm and kind == "per_layer")


def _index_list(cfg: dict, path, key: str, layers: int) -> set:
    """The set of layer indices listed under ``key`` (absent or null: none)."""
    v = cfg.get(key)
    if v is None:
        return set()
    if not isinstance(v, list):
        raise _fail(path, _named(cfg, key), f"got {_show(v)}; expected a list of layer indices")
    for i, x in enumerate(v):
        if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < layers:
            raise _fail(path, f"{_named(cfg, key)}[{i}]", f"got {_show(x)}; expected a layer index from 0 to "
                        f"{layers - 1} (num_hidden_layers - 1)")
    return set(v)


def _sliding(cfg: dict, path, mt: str, layers: int, max_pos: int) -> tuple[int, tuple]:
    """(window, indices of the sliding layers) of the config (see the module docstring)."""
    types = cfg.get("layer_types")
    chunked = mt == "llama4_text"          # Llama 4's chunks are priced as windows (the module docstring)
    kinds = _LAYER_TYPES + (("chunked_attention",) if chunked else ()) + (
        ("linear_attention",) if mt in _GDN_FAMILIES else ())
    window_key = "attention_chunk_size" if chunked else "sliding_window"
    if chunked and cfg.get(window_key) is None:     # null: no chunked layers (Llama4TextConfig)
        return 0, ()
    if types is not None:
        if not isinstance(types, list) or len(types) != layers:
            got = f"{len(types)} entries" if isinstance(types, list) else _show(types)
            raise _fail(path, _named(cfg, "layer_types"), f"got {got}; expected a list of one entry per layer "
                        f"({layers}, num_hidden_layers), each one of {', '.join(kinds)}")
        for i, t in enumerate(types):
            if t not in kinds:
                raise _fail(path, f"{_named(cfg, 'layer_types')}[{i}]", f"got {_show(t)}, a kind of layer this "
                            f"reader does not model; expected one of {', '.join(kinds)}")
        sliding = [i for i, t in enumerate(types) if t in ("sliding_attention", "chunked_attention")]
    elif chunked:
        sliding = [i for i, rope in enumerate(_rope_layers(cfg, path, layers)) if rope]
    elif mt in ("gemma2", "gpt_oss"):
        sliding = list(range(0, layers, 2))
    elif mt == "gemma3_text":
        pattern = _int(cfg, path, "sliding_window_pattern")
        sliding = [i for i in range(layers) if (i + 1) % pattern]
    elif mt in ("mistral", "mixtral", "phi3"):
        sliding = list(range(layers)) if cfg.get("sliding_window") is not None else []
    elif mt in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe") and _flag(cfg, path, "use_sliding_window", False):
        first = _int(cfg, path, "max_window_layers", default=_QWEN_MAX_WINDOW_LAYERS, lo=0)
        sliding = list(range(first, layers))
    else:
        sliding = []
    if not sliding:
        return 0, ()
    window = _int(cfg, path, window_key)
    if max_pos and window >= max_pos:      # the window never binds
        return 0, ()
    return window, tuple(sliding)


def _rope_layers(cfg: dict, path, layers: int) -> list[bool]:
    """Llama 4: whether each layer uses RoPE (and so attends within its chunk): ``no_rope_layers``
    (one 0 or 1 per layer); when absent, null or empty, all but every ``no_rope_layer_interval``-th."""
    flags = cfg.get("no_rope_layers")
    if flags is None or flags == []:
        interval = _int(cfg, path, "no_rope_layer_interval")
        return [(i + 1) % interval != 0 for i in range(layers)]
    key = _named(cfg, "no_rope_layers")
    if not isinstance(flags, list) or len(flags) < layers:
        got = f"{len(flags)} entries" if isinstance(flags, list) else _show(flags)
        raise _fail(path, key, f"got {got}; expected a list of at least one entry per layer ({layers}, "
                    "num_hidden_layers), each 1 (RoPE, chunked attention) or 0 (NoPE, global attention)")
    for i, x in enumerate(flags[:layers]):
        if isinstance(x, bool) or x not in (0, 1):
            raise _fail(path, f"{key}[{i}]", f"got {_show(x)}; expected 1 (RoPE, chunked attention) or 0 "
                        "(NoPE, global attention)")
    return [x == 1 for x in flags[:layers]]


def _vision(cfg: dict, path, family: str) -> VisionSpec:
    """The VisionSpec of the ``vision_config`` of a multimodal config (``workloads.vision``), the
    images of a request not yet given; for Gemma 3 (``siglip``) the text width of ``text_config``
    and the pooled tokens of ``mm_tokens_per_image``."""
    v = _section(cfg, path, "vision_config")
    if family == "siglip":
        h = _int(v, path, "hidden_size")
        heads = _int(v, path, "num_attention_heads")
        size = _int(v, path, "image_size")
        patch = _int(v, path, "patch_size", hi=size, hi_name="vision_config.image_size")
        text = _section(cfg, path, "text_config", _DEFAULTS["gemma3_text"])
        spec = VisionSpec("siglip", _int(v, path, "num_hidden_layers", hi=MAX_LAYERS), h, heads,
                          _int(v, path, "intermediate_size"), patch, _int(text, path, "hidden_size"),
                          in_channels=_int(v, path, "num_channels", default=3), image_size=size,
                          tokens_per_image=_int(cfg, path, "mm_tokens_per_image", hi=(size // patch) ** 2,
                                                hi_name="the image's patches"))
    elif family == "llama4":
        h = _int(v, path, "hidden_size")
        heads = _int(v, path, "num_attention_heads")
        size = _int(v, path, "image_size")
        patch = _int(v, path, "patch_size", hi=size, hi_name="vision_config.image_size")
        ratio = v.get("pixel_shuffle_ratio")
        if ratio not in (0.5, 0.25) or (size // patch) % round(1 / ratio):
            raise _fail(path, _named(v, "pixel_shuffle_ratio"), f"got {_show(ratio)}; expected 0.5 or 0.25, "
                        "dividing a tile's patches a side")
        text = _section(cfg, path, "text_config")
        spec = VisionSpec("llama4", _int(v, path, "num_hidden_layers", hi=MAX_LAYERS), h, heads,
                          _int(v, path, "intermediate_size"), patch, _int(text, path, "hidden_size"),
                          in_channels=_int(v, path, "num_channels", default=3), spatial_merge_size=round(1 / ratio),
                          patch_bias=False, tile_size=size, max_tiles=LLAMA4_MAX_TILES, global_tile=True,
                          adapter_size=_int(v, path, "projector_input_dim"),
                          adapter_out=_int(v, path, "projector_output_dim"))
        if _int(v, path, "vision_output_dim") != spec.adapter_out:
            raise _fail(path, _named(v, "vision_output_dim"), f"got {v['vision_output_dim']}, not "
                        f"projector_output_dim ({spec.adapter_out}); the projector reads the adapter's output")
    elif family == "qwen2_5_vl":
        h = _int(v, path, "hidden_size")
        heads = _int(v, path, "num_heads")
        depth = _int(v, path, "depth", hi=MAX_LAYERS)
        patch = _int(v, path, "patch_size", "spatial_patch_size")
        merge = _int(v, path, "spatial_merge_size", default=2)
        window = _int(v, path, "window_size")
        if window % (patch * merge):
            raise _fail(path, _named(v, "window_size"), f"got {window}, not a multiple of patch_size x "
                        f"spatial_merge_size ({patch * merge}); expected windows of whole merged tokens")
        spec = VisionSpec("qwen2_5_vl", depth, h, heads, _int(v, path, "intermediate_size"), patch,
                          _int(v, path, "out_hidden_size"), in_channels=_int(v, path, "in_channels", "in_chans",
                                                                              default=3),
                          temporal_patch_size=_int(v, path, "temporal_patch_size", default=2),
                          spatial_merge_size=merge, mlp_gated=True, norm="rmsnorm", patch_bias=False,
                          window=window // patch, full_blocks=len(_index_list(v, path, "fullatt_block_indexes", depth)),
                          min_pixels=QWEN2_5_VL_MIN_PIXELS, max_pixels=QWEN2_5_VL_MAX_PIXELS)
    else:
        h = _int(v, path, "hidden_size")
        heads = _int(v, path, "num_heads")
        deep = v.get("deepstack_visual_indexes") or []
        if not isinstance(deep, list):
            raise _fail(path, _named(v, "deepstack_visual_indexes"), f"got {_show(deep)}; expected a list of "
                        "block indices")
        spec = VisionSpec("qwen3_vl", _int(v, path, "depth", hi=MAX_LAYERS), h, heads,
                          _int(v, path, "intermediate_size"), _int(v, path, "patch_size"),
                          _int(v, path, "out_hidden_size"), in_channels=_int(v, path, "in_channels", default=3),
                          temporal_patch_size=_int(v, path, "temporal_patch_size", default=2),
                          spatial_merge_size=_int(v, path, "spatial_merge_size", default=2),
                          position_embeddings=_int(v, path, "num_position_embeddings", default=0, lo=0),
                          mergers=1 + len(deep), min_pixels=QWEN3_VL_MIN_PIXELS, max_pixels=QWEN3_VL_MAX_PIXELS)
    if h % heads:
        raise _fail(path, _named(v, "hidden_size"), f"got {h}, not a multiple of the tower's {heads} heads; "
                    "expected a width the heads divide")
    return spec


def _sparse_attention(cfg: dict, path, kw: dict) -> None:
    """Read DeepSeek Sparse Attention's indexer (``index_n_heads``, ``index_head_dim``, ``index_topk``)
    into ``kw``; its queries project MLA's query latent, so the model must have one (q_lora_rank)."""
    if not kw.get("kv_lora_rank"):
        raise _fail(path, _named(cfg, "kv_lora_rank"), "config.json is missing 'kv_lora_rank'; DeepSeek Sparse "
                    "Attention runs on multi-head latent attention (an integer from 1)")
    if not kw.get("q_lora_rank"):
        raise _fail(path, _named(cfg, "q_lora_rank"), f"got {_show(cfg.get('q_lora_rank'))}; the lightning "
                    "indexer projects the query latent, expected an integer from 1")
    kw.update(index_n_heads=_int(cfg, path, "index_n_heads"), index_head_dim=_int(cfg, path, "index_head_dim"),
              index_topk=_int(cfg, path, "index_topk"))
    kw["notes"] = (*kw["notes"], f"DeepSeek Sparse Attention: a lightning indexer of {kw['index_n_heads']} x "
                   f"{kw['index_head_dim']} selects {kw['index_topk']} tokens a query; the KV cache holds every token "
                   "and its indexer key")


def _state_bytes(cfg: dict, path, *keys: str) -> float:
    """Bytes of a recurrent state element the config fixes: 4 where the first of ``keys`` given is
    float32, 0 (the KV format's) where none is given or it names the model's dtype."""
    key, v = _lookup(cfg, keys)
    if key is None or v in ("auto", "bfloat16", "float16"):
        return 0.0
    if v != "float32":
        raise _fail(path, _named(cfg, key), f"got {_show(v)}; expected float32, bfloat16, float16 or auto")
    return 4.0


def _ssm_dims(cfg: dict, path, heads_key: str, groups_key: str, **kw) -> dict:
    """The recurrent layer's fields, value heads a multiple of the groups (B, C or key heads)."""
    if kw["ssm_heads"] % kw["ssm_groups"]:
        raise _fail(path, _named(cfg, heads_key), f"got {kw['ssm_heads']}, not a multiple of {groups_key} "
                    f"({kw['ssm_groups']}); each group serves a whole number of heads")
    return kw


#: Qwen3-Next's MTP modules: its config has no MTP key, but the checkpoint ships one module (the
#: safetensors weight table of Qwen/Qwen3-Next-80B-A3B-Instruct, printed with the config in the model
#: report configs/models/SOURCES.md cites: 81,324,862,720 parameters, of which the config's decoder
#: counts 79,674,391,296; the 1.65 B between is one block of the model's shape with its 2h -> h
#: projection and norms: tests/test_hybrid_2026_configs.py), which vLLM runs as ``qwen3_next_mtp``
QWEN3_NEXT_MTP_LAYERS = 1


def _gated_deltanet(cfg: dict, path, layers: int, kw: dict) -> dict:
    """Qwen3-Next / Qwen3.5: which layers are Gated DeltaNet (``layer_types``, else all but every
    ``full_attention_interval``-th), each layer's MLP or MoE, the attention's output gate and the
    Gated DeltaNet dims."""
    types = cfg.get("layer_types")
    if types is None:
        every = _int(cfg, path, "full_attention_interval", hi=layers, hi_name="num_hidden_layers")
        types = ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(layers)]
    mixers = tuple("gdn" if t == "linear_attention" else "attention" for t in types)   # checked by _sliding
    ffns = ("mlp",) * layers
    if kw.get("num_experts"):
        step = _int(cfg, path, "decoder_sparse_step", default=1, hi=layers, hi_name="num_hidden_layers")
        dense = _index_list(cfg, path, "mlp_only_layers", layers)
        ffns = tuple("moe" if i not in dense and (i + 1) % step == 0 else "mlp" for i in range(layers))
    if _flag(cfg, path, "mtp_use_dedicated_embeddings", False):
        raise _fail(path, _named(cfg, "mtp_use_dedicated_embeddings"), "got true; only false (the MTP layers "
                    "share the model's embedding) is modelled")
    return dict(layer_mixers=mixers, layer_ffns=ffns, notes=kw["notes"],
                mtp_layers=_int(cfg, path, "mtp_num_hidden_layers", lo=0, hi=MAX_LAYERS,
                                default=QWEN3_NEXT_MTP_LAYERS if kw.get("model_type") == "qwen3_next" else 0),
                attn_output_gate=_flag(cfg, path, "attn_output_gate", True), ssm_chunk=_GDN_CHUNK,
                ssm_conv_kernel=_int(cfg, path, "linear_conv_kernel_dim"),
                ssm_state_bytes=_state_bytes(cfg, path, "mamba_ssm_dtype"),
                **_ssm_dims(cfg, path, "linear_num_value_heads", "linear_num_key_heads",
                            ssm_heads=_int(cfg, path, "linear_num_value_heads"),
                            ssm_head_dim=_int(cfg, path, "linear_value_head_dim"),
                            ssm_state_dim=_int(cfg, path, "linear_key_head_dim"),
                            ssm_groups=_int(cfg, path, "linear_num_key_heads")))


def _nemotron_h(cfg: dict, path, layers: int, hidden: int, heads: int) -> dict:
    """Nemotron-H: each layer's mixer or FFN from ``hybrid_override_pattern``, the Mamba-2 dims, the
    ungated MLP and (E layers) the experts."""
    pattern = cfg.get("hybrid_override_pattern")
    allowed = f"expected a string of {layers} characters (num_hidden_layers), each M, *, - or E"
    if not isinstance(pattern, str) or len(pattern) != layers:
        got = f"a string of {len(pattern)} characters" if isinstance(pattern, str) else _show(pattern)
        raise _fail(path, "hybrid_override_pattern", f"got {got}; {allowed}")
    bad = next((i for i, c in enumerate(pattern) if c not in _NEMOTRON_PATTERN), None)
    if bad is not None:
        raise _fail(path, f"hybrid_override_pattern[{bad}]", f"got a character this reader does not model; {allowed}")
    mixers, ffns = zip(*(_NEMOTRON_PATTERN[c] for c in pattern))
    kw: dict = dict(layer_mixers=mixers, layer_ffns=ffns, mlp_gated=False,
                    mlp_activation=_text(cfg, path, "mlp_hidden_act", "relu2"),
                    intermediate_size=_int(cfg, path, "intermediate_size"),
                    attention_bias=_flag(cfg, path, "attention_bias", False),
                    mlp_bias=_flag(cfg, path, "mlp_bias", False), norms_per_block=1,
                    ssm_conv_kernel=_int(cfg, path, "conv_kernel"), ssm_conv_bias=_flag(cfg, path, "use_conv_bias", True),
                    ssm_chunk=_int(cfg, path, "chunk_size"),
                    ssm_state_bytes=_state_bytes(cfg, path, "mamba_ssm_cache_dtype"),
                    **_ssm_dims(cfg, path, "mamba_num_heads", "n_groups",
                                ssm_heads=_int(cfg, path, "mamba_num_heads"),
                                ssm_head_dim=_int(cfg, path, "mamba_head_dim"),
                                ssm_state_dim=_int(cfg, path, "ssm_state_size"),
                                ssm_groups=_int(cfg, path, "n_groups")))
    if _flag(cfg, path, "mamba_proj_bias", False):
        raise _fail(path, "mamba_proj_bias", "got true; only false (no bias on the Mamba-2 projections) is modelled")
    if "moe" in ffns:
        experts = _int(cfg, path, "n_routed_experts")
        shared = _int(cfg, path, "n_shared_experts", default=0, lo=0)
        kw.update(num_experts=experts, moe_intermediate_size=_int(cfg, path, "moe_intermediate_size"),
                  experts_per_token=_int(cfg, path, "num_experts_per_tok", hi=experts, hi_name="n_routed_experts"),
                  num_shared_experts=shared, router_bias=True,     # e_score_correction_bias, one per expert
                  shared_expert_intermediate_size=(_int(cfg, path, "moe_shared_expert_intermediate_size")
                                                   if shared else 0))
    return kw


def _jamba(cfg: dict, path, layers: int, hidden: int) -> dict:
    """Jamba: which layers are attention (``attn_layer_period``, ``attn_layer_offset``) and which
    MoE (``expert_layer_period``, ``expert_layer_offset``), the Mamba-1 dims, the experts."""
    def layer_set(period_key: str, offset_key: str) -> set:
        period = _int(cfg, path, period_key, hi=layers, hi_name="num_hidden_layers")
        offset = _int(cfg, path, offset_key, lo=0, hi=period - 1, hi_name=f"{period_key} - 1")
        return {i for i in range(layers) if i % period == offset}
    attention, moe = layer_set("attn_layer_period", "attn_layer_offset"), layer_set("expert_layer_period",
                                                                                    "expert_layer_offset")
    if _flag(cfg, path, "mamba_proj_bias", False):
        raise _fail(path, "mamba_proj_bias", "got true; only false (no bias on the Mamba projections) is modelled")
    inter, experts = _int(cfg, path, "intermediate_size"), _int(cfg, path, "num_experts")
    return dict(layer_mixers=tuple("attention" if i in attention else "mamba1" for i in range(layers)),
                layer_ffns=tuple("moe" if i in moe else "mlp" for i in range(layers)),
                intermediate_size=inter, moe_intermediate_size=inter, num_experts=experts,
                experts_per_token=_int(cfg, path, "num_experts_per_tok", hi=experts, hi_name="num_experts"),
                ssm_heads=_int(cfg, path, "mamba_expand") * hidden, ssm_head_dim=1,
                ssm_state_dim=_int(cfg, path, "mamba_d_state"), ssm_groups=0,
                ssm_dt_rank=_int(cfg, path, "mamba_dt_rank"), ssm_conv_kernel=_int(cfg, path, "mamba_d_conv"),
                ssm_conv_bias=_flag(cfg, path, "mamba_conv_bias", True))


def spec_from_config(cfg: dict, name: str, path: str = "config.json") -> ModelSpec:
    """Return the ModelSpec of a parsed Hugging Face config dict; raise DseError (one line
    naming ``path`` and the key) on a missing, mistyped or out-of-range field, or a model_type
    this reader does not know."""
    if not isinstance(cfg, dict):
        raise _fail(path, "(top level)", f"got {_show(cfg)}; expected a JSON object {{...}} of config fields")
    mt = _model_type(cfg, path)
    notes: list[str] = []
    vision = None
    if mt == "gemma3" and cfg.get("text_config") is not None:     # multimodal: the text decoder's fields
        vision = _vision(cfg, path, "siglip")
        cfg = _section(cfg, path, "text_config")
        mt = "gemma3" if cfg.get("model_type") is None else _model_type(cfg, path)
        if mt not in ("gemma3", "gemma3_text"):
            raise _fail(path, _named(cfg, "model_type"), f"got {_show(mt)}; expected gemma3_text")
    elif mt == "llama4":        # multimodal: the text decoder's fields, and the vision tower where given
        vision = _vision(cfg, path, "llama4") if cfg.get("vision_config") is not None else None
        top = cfg
        cfg = _section(cfg, path, "text_config")
        if cfg.get("model_type") is not None and _model_type(cfg, path) != "llama4_text":
            raise _fail(path, _named(cfg, "model_type"), f"got {_show(cfg['model_type'])}; expected llama4_text")
        mt = "llama4_text"
        if vision is None:
            notes.append("text decoder only: the config has no vision_config, so its vision encoder and projector "
                         "are not modelled")
        elif top.get("vision_config", {}).get("multi_modal_projector_bias"):
            raise _fail(path, "vision_config.multi_modal_projector_bias", "got true; only a projector without "
                        "bias (Llama 4's) is modelled")
        else:
            notes.append("the vision encoder (vision_config: tiles of 336 px, 144 tokens each) runs where requests "
                         "carry images (images, image_size); the processor's tile separator tokens are left out")
    elif mt == "qwen3_vl":      # Qwen3-VL: a Qwen3 decoder (text_config) after its vision tower
        vision = _vision(cfg, path, "qwen3_vl")
        top = cfg
        cfg = _section(cfg, path, "text_config")
        if cfg.get("model_type") not in (None, "qwen3_vl_text"):
            raise _fail(path, _named(cfg, "model_type"), f"got {_show(cfg['model_type'])}; expected qwen3_vl_text")
        cfg = _Section({"tie_word_embeddings": top.get("tie_word_embeddings"), **cfg}, cfg.prefix)
        mt = "qwen3"
        notes.append("Qwen3-VL: the text decoder (text_config) read as qwen3 (its interleaved multimodal RoPE "
                     "changes no shape); DeepStack's adds of visual features into the first decoder layers "
                     "are left out (one add per image token and layer)")
    elif mt == "qwen2_5_vl":    # Qwen2.5-VL: a Qwen2 decoder (the top-level fields) after its vision tower
        vision = _vision(cfg, path, "qwen2_5_vl")
        mt = "qwen2"
        notes.append("Qwen2.5-VL: the text decoder read as qwen2 (its multimodal RoPE changes no shape)")
    elif mt in _TEXT_OF:        # Qwen3.5 VLM: the text decoder's fields after Qwen3-VL's tower without DeepStack
        vision = _vision(cfg, path, "qwen3_vl") if cfg.get("vision_config") is not None else None
        cfg = _section(cfg, path, "text_config")
        if cfg.get("model_type") is not None and _model_type(cfg, path) != _TEXT_OF[mt]:
            raise _fail(path, _named(cfg, "model_type"), f"got {_show(cfg['model_type'])}; expected {_TEXT_OF[mt]}")
        mt = _TEXT_OF[mt]
        notes.append("text decoder only: the config has no vision_config, so its vision encoder is not modelled"
                     if vision is None else "Qwen3.5's vision tower: Qwen3-VL's without DeepStack mergers "
                     "(transformers' Qwen3_5VisionModel drops them), its processor's pixel bounds Qwen3-VL's")
    elif mt in ALIASES:
        family, arch = ALIASES[mt]
        archs = cfg.get("architectures")
        if not isinstance(archs, list) or arch not in archs:
            got = "config.json is missing 'architectures'" if "architectures" not in cfg else f"got {_show(archs)}"
            raise _fail(path, "architectures", f"{got}; model_type '{mt}' is read as {family} only when "
                        f"architectures lists {arch}")
        notes.append(f"model_type '{mt}' read as {family} (architectures: {arch})")
        mt = family
    mt = "gemma3_text" if mt == "gemma3" else mt
    if mt in _DEFAULTS:
        cfg = _Section({**_DEFAULTS[mt], **cfg}, getattr(cfg, "prefix", ""))
    if not FAMILIES[mt]:
        key = next((k for k in _EXPERT_KEYS if cfg.get(k) not in (None, 0)), None)
        if key:
            raise _fail(path, _named(cfg, key), f"got {_show(cfg[key])} experts, but model_type '{mt}' is a dense "
                        "family (an MoE is never read as dense); give the model_type of its MoE family")

    def fail(key: str, problem: str) -> DseError:
        return _fail(path, _named(cfg, key), problem)

    hidden = _int(cfg, path, "hidden_size", "n_embd", "n_embed", "d_model")
    layers = _int(cfg, path, "num_hidden_layers", "n_layer", "num_layers", "n_layers", hi=MAX_LAYERS)
    heads = _int(cfg, path, "num_attention_heads", "n_head", "num_heads", "n_heads")
    vocab = _int(cfg, path, "vocab_size")
    max_pos = _int(cfg, path, "max_position_embeddings", "n_positions", "max_seq_len", default=0)
    if vision is not None and vision.out_hidden_size != hidden:
        raise _fail(path, "vision_config.out_hidden_size", f"got {vision.out_hidden_size}, not the text "
                    f"decoder's hidden_size ({hidden}); the projector writes the decoder's width")
    kw: dict = dict(name=name, model_type=mt, hidden_size=hidden, num_layers=layers, num_heads=heads,
                    vocab_size=vocab, source=path, max_position_embeddings=max_pos, notes=tuple(notes), vision=vision,
                    tie_word_embeddings=_flag(cfg, path, "tie_word_embeddings", mt in ("opt", "bloom", "falcon")))
    head_dim = _int(cfg, path, "head_dim", default=None)
    kv_cfg, kv_key, kv_default = cfg, "num_key_value_heads", heads

    if mt == "gptj":
        kw.update(intermediate_size=_int(cfg, path, "n_inner", default=4 * hidden), mlp_gated=False,
                  mlp_activation=_text(cfg, path, "activation_function", "gelu_new"),
                  parallel_block=True, norms_per_block=1, norm_type="layernorm",
                  mlp_bias=True, lm_head_bias=True)
        kv_key = None
    elif mt == "falcon":
        new_arch = _flag(cfg, path, "new_decoder_architecture", False)
        if new_arch:
            kv_key = "num_kv_heads"
        else:
            kv_key, kv_default = None, (1 if _flag(cfg, path, "multi_query", False) else heads)
        bias = _flag(cfg, path, "bias", False)
        kw.update(intermediate_size=_int(cfg, path, "ffn_hidden_size", default=4 * hidden), mlp_gated=False,
                  mlp_activation="gelu", parallel_block=_flag(cfg, path, "parallel_attn", True),
                  norms_per_block=(_int(cfg, path, "num_ln_in_parallel_attn", default=2, hi=2) if new_arch else 1),
                  norm_type="layernorm", attention_bias=bias, o_proj_bias=bias, mlp_bias=bias)
    elif mt == "opt":
        bias = _flag(cfg, path, "enable_bias", True)
        kw.update(intermediate_size=_int(cfg, path, "ffn_dim"), mlp_gated=False,
                  mlp_activation=_text(cfg, path, "activation_function", "relu"), norm_type="layernorm",
                  attention_bias=bias, o_proj_bias=bias, mlp_bias=bias,
                  position_embeddings=_int(cfg, path, "max_position_embeddings") + 2,  # OPT offsets positions by 2
                  final_norm=_flag(cfg, path, "do_layer_norm_before", True))
        proj = _int(cfg, path, "word_embed_proj_dim", default=hidden)
        if proj != hidden:
            raise fail("word_embed_proj_dim", f"got {proj}, not hidden_size ({hidden}); only "
                       "word_embed_proj_dim equal to hidden_size is supported")
        kv_key = None
    elif mt == "bloom":
        kw.update(intermediate_size=4 * hidden, mlp_gated=False, mlp_activation="gelu",
                  norm_type="layernorm", attention_bias=True, o_proj_bias=True, mlp_bias=True,
                  embedding_norm=True)
        kv_key = None
    elif mt == "nemotron_h":
        kw.update(_nemotron_h(cfg, path, layers, hidden, heads))
        head_dim = _int(cfg, path, "attention_head_dim", "head_dim", default=None)
    elif mt == "jamba":
        kw.update(_jamba(cfg, path, layers, hidden))
    elif mt == "dbrx":      # nested attn_config / ffn_config; every layer a GLU MoE; LayerNorm without bias
        kv_cfg, kv_key = _section(cfg, path, "attn_config"), "kv_n_heads"
        ffn = _section(cfg, path, "ffn_config")
        act = ffn.get("ffn_act_fn")
        experts = _int(ffn, path, "moe_num_experts")
        inter = _int(ffn, path, "ffn_hidden_size")
        kw.update(intermediate_size=inter, moe_intermediate_size=inter, num_experts=experts,
                  experts_per_token=_int(ffn, path, "moe_top_k", hi=experts, hi_name="ffn_config.moe_num_experts"),
                  mlp_activation=(_text(_section(ffn, path, "ffn_act_fn"), path, "name", "silu")
                                  if act is not None else "silu"),
                  norm_type="layernorm", norm_bias=False)
    else:  # gated-MLP decoders: llama, mistral, phi3, qwen2/3, gemma2/3, mixtral, qwen MoE, gpt_oss, deepseek
        gemma = mt in ("gemma2", "gemma3_text")
        qwen2 = mt in ("qwen2", "qwen2_moe")          # q/k/v always have a bias, o_proj never
        inter = _int(cfg, path, "intermediate_size", "ffn_dim", "n_inner",   # Qwen3.5 MoE: no dense width
                     default=_int(cfg, path, "moe_intermediate_size") if mt == "qwen3_5_moe_text" else _REQUIRED)
        bias = _flag(cfg, path, "attention_bias", qwen2 or mt == "gpt_oss")
        kw.update(intermediate_size=inter, mlp_gated=True,
                  mlp_activation=(_text(cfg, path, "hidden_activation", "gelu_pytorch_tanh") if gemma
                                  else _text(cfg, path, "hidden_act", "silu")),
                  attention_bias=bias, o_proj_bias=bias and not qwen2,
                  mlp_bias=_flag(cfg, path, "mlp_bias", False) or mt == "gpt_oss",
                  norms_per_block=4 if gemma else 2, qk_norm=mt in ("qwen3", "qwen3_moe", "gemma3_text", *_GDN_FAMILIES))
        if mt in ("mixtral", "gpt_oss"):
            experts = _int(cfg, path, "num_local_experts")
            top_k = _int(cfg, path, "num_experts_per_tok", "experts_per_token", hi=experts,
                         hi_name="num_local_experts")
            if mt == "gpt_oss" and cfg.get("experts_per_token") not in (None, top_k):
                raise fail("experts_per_token", f"got {_show(cfg['experts_per_token'])}, not num_experts_per_tok "
                           f"({top_k}); give one top-k")
            kw.update(num_experts=experts, moe_intermediate_size=inter, experts_per_token=top_k,
                      router_bias=mt == "gpt_oss", attention_sinks=mt == "gpt_oss")
        elif mt in ("qwen2_moe", "qwen3_moe", "qwen3_next", "qwen3_5_moe_text"):
            experts = _int(cfg, path, "num_experts")
            step = _int(cfg, path, "decoder_sparse_step", default=1, hi=layers, hi_name="num_hidden_layers")
            dense = _index_list(cfg, path, "mlp_only_layers", layers)
            moe_layers = sum(1 for i in range(layers) if i not in dense and (i + 1) % step == 0)
            shared = _int(cfg, path, "shared_expert_intermediate_size", lo=0) if mt not in ("qwen3_moe",) else 0
            kw.update(num_experts=experts, moe_intermediate_size=_int(cfg, path, "moe_intermediate_size"),
                      experts_per_token=_int(cfg, path, "num_experts_per_tok", hi=experts, hi_name="num_experts"),
                      num_shared_experts=1 if shared else 0, shared_expert_intermediate_size=shared,
                      shared_expert_gate=bool(shared), first_dense_layers=layers - moe_layers)
        elif mt == "minimax_m2":
            kw.update(_minimax_m2(cfg, path, layers, inter))
        elif mt == "llama4_text":   # MoE layers with a shared expert, between dense layers of their own width
            experts = _int(cfg, path, "num_local_experts")
            step = _int(cfg, path, "interleave_moe_layer_step", hi=layers, hi_name="num_hidden_layers")
            moe_layers = (_index_list(cfg, path, "moe_layers", layers) if cfg.get("moe_layers") is not None
                          else set(range(step - 1, layers, step)))
            kw.update(intermediate_size=_int(cfg, path, "intermediate_size_mlp"), num_experts=experts,
                      experts_per_token=_int(cfg, path, "num_experts_per_tok", hi=experts,
                                             hi_name="num_local_experts"),
                      moe_intermediate_size=inter, num_shared_experts=1, shared_expert_intermediate_size=inter,
                      first_dense_layers=layers - len(moe_layers))
        elif mt in ("deepseek_v2", "deepseek_v3", "deepseek_v32"):
            experts = _int(cfg, path, "n_routed_experts")
            moe_inter = _int(cfg, path, "moe_intermediate_size")
            shared = _int(cfg, path, "n_shared_experts", default=0, lo=0)
            kw.update(num_experts=experts,
                      experts_per_token=_int(cfg, path, "num_experts_per_tok", hi=experts, hi_name="n_routed_experts"),
                      moe_intermediate_size=moe_inter, num_shared_experts=shared,
                      shared_expert_intermediate_size=shared * moe_inter, router_bias=mt != "deepseek_v2",
                      first_dense_layers=_int(cfg, path, "first_k_dense_replace", default=0, lo=0, hi=layers,
                                              hi_name="num_hidden_layers"))
            freq = _int(cfg, path, "moe_layer_freq", default=1)
            if freq != 1:
                raise fail("moe_layer_freq", f"got {freq}; only 1 (every layer after first_k_dense_replace "
                           "is a MoE layer) is supported")
            if cfg.get("kv_lora_rank") is not None:  # multi-head latent attention
                kw.update(kv_lora_rank=_int(cfg, path, "kv_lora_rank"),
                          q_lora_rank=_int(cfg, path, "q_lora_rank", default=0, lo=0),  # 0 or null: no q compression
                          qk_nope_head_dim=_int(cfg, path, "qk_nope_head_dim"),
                          qk_rope_head_dim=_int(cfg, path, "qk_rope_head_dim"),
                          v_head_dim=_int(cfg, path, "v_head_dim"))
                head_dim = kw["qk_nope_head_dim"] + kw["qk_rope_head_dim"]
            kw.update(mtp_layers=_int(cfg, path, "num_nextn_predict_layers", default=0, lo=0, hi=MAX_LAYERS))
            if mt == "deepseek_v32":
                _sparse_attention(cfg, path, kw)
    if mt in _GDN_FAMILIES:
        kw.update(_gated_deltanet(cfg, path, layers, kw))
    window, sliding = _sliding(cfg, path, mt, layers, max_pos)
    kw.update(sliding_window=window, sliding_layers=sliding)
    if mt == "llama4_text" and sliding:
        kw.update(chunked_attention=True, notes=(*kw["notes"], (
            f"chunked attention ({len(sliding)} of {layers} layers, chunks of {window} tokens) priced as a sliding "
            "window of the chunk (an upper bound on the keys read)")))
    if head_dim is None:
        if hidden % heads:
            raise fail("num_attention_heads", f"hidden_size ({hidden}) is not a multiple of "
                       f"num_attention_heads ({heads}); give head_dim in the config or a number of heads "
                       "that divides hidden_size")
        head_dim = hidden // heads
    kv_heads = (_int(kv_cfg, path, kv_key, default=heads, hi=heads, hi_name="num_attention_heads")
                if kv_key else kv_default)
    if heads % kv_heads:
        raise _fail(path, _named(kv_cfg, kv_key), f"got {kv_heads}, not a divisor of num_attention_heads ({heads}); "
                    f"num_attention_heads ({heads}) must be a multiple of {kv_key}")
    kw.update(num_kv_heads=kv_heads, head_dim=head_dim)
    return ModelSpec(**kw)


class _NotFinite:
    """What the JSON reader puts where the text has NaN, Infinity or a number too large
    for a float; load_model reports the first one with its key."""

    def __init__(self, text: str):
        self.text = text


class _DuplicateKey(Exception):
    pass


def _parse_float(text: str):
    v = float(text)
    return v if math.isfinite(v) else _NotFinite(text)


def _unique_keys(pairs: list) -> dict:
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set = set()
        raise _DuplicateKey(next(k for k, _ in pairs if k in seen or seen.add(k)))
    return d


def _first_not_finite(node) -> tuple[str, _NotFinite] | None:
    """(key path, marker) of the first NaN/Infinity in document order, else None."""
    stack = [("(top level)", node)]
    while stack:
        where, n = stack.pop()
        if isinstance(n, _NotFinite):
            return where, n
        prefix = "" if where == "(top level)" else where
        if isinstance(n, dict):
            stack.extend((f"{prefix}.{k}" if prefix else str(k), v) for k, v in reversed(list(n.items())))
        elif isinstance(n, list):
            stack.extend((f"{prefix}[{i}]", v) for i, v in reversed(list(enumerate(n))))
    return None


#: top-level keys a published config gives Infinity in and the reader never reads: Mamba-2's clamp of
#: the time step (Nemotron-H-56B's config.json gives time_step_limit [0.0, Infinity])
_UNREAD_NOT_FINITE = ("time_step_limit",)


def _read_config(p: Path):
    """The parsed JSON of ``p``; DseError (one line naming ``p``) when it cannot be read
    (``basis.files.read_input``: a regular file of bounded size), is not UTF-8 text, is not JSON, repeats a key or holds NaN/Infinity."""
    where = f"{p}: cannot read config.json"
    raw = read_input(p, "model config (config.json)")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise _one_line(f"{where}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}); "
                        "expected a JSON text file") from None
    try:
        cfg = json.loads(text, parse_constant=_NotFinite, parse_float=_parse_float, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as e:
        raise _one_line(f"{where}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    except _DuplicateKey as e:
        raise _fail(p, str(e.args[0])[:80], "appears more than once in one object; give each key once") from None
    except RecursionError:
        raise _one_line(f"{where}: nested too deeply; expected a flat JSON object of config fields") from None
    except ValueError as e:  # an integer with more digits than Python converts
        raise _one_line(f"{where}: {str(e).split(';')[0]}") from None
    bad = _first_not_finite({k: v for k, v in cfg.items() if k not in _UNREAD_NOT_FINITE}
                            if isinstance(cfg, dict) else cfg)
    if bad:
        key, v = bad
        what = ("not a JSON number" if v.text in ("NaN", "Infinity", "-Infinity") else
                "too large for a 64-bit float")
        raise _fail(p, key, f"got {_show(v)}, {what}; expected a finite number")
    return cfg


def available_models() -> list[str]:
    """Names of the model configs shipped in configs/models/ (DseError when the folder is missing)."""
    return sorted(p.stem for p in shipped_folder("configs", "models", what="the model configs").glob("*.json"))


def load_model(name_or_path: str) -> ModelSpec:
    """Return the ModelSpec of a shipped model name or of a path to a config.json;
    raise DseError for an unknown name, an unreadable file or a missing or bad field."""
    if isinstance(name_or_path, os.PathLike):
        name_or_path = os.fspath(name_or_path)
    if not isinstance(name_or_path, str):
        raise DseError(f"model: got {_show(name_or_path)}; expected a model name ({', '.join(available_models())})"
                       " or a path to a config.json")
    p = Path(name_or_path)
    try:
        if "/" in name_or_path or os.sep in name_or_path or p.suffix == ".json" or p.is_file():
            if p.is_dir():
                p = p / "config.json"
            if not p.exists():   # what is there but not a regular file is refused when read
                raise _one_line(f"model config file not found: {p}")
            name = p.parent.name if p.name == "config.json" else p.stem
        else:
            p = MODELS_DIR / f"{name_or_path}.json"
            if not p.is_file():
                raise _one_line(f"unknown model '{shown_key(name_or_path)}'; valid models: {', '.join(available_models())}"
                                " (or a path to a config.json)")
            name = name_or_path
    except (OSError, ValueError) as e:
        shown = name_or_path if len(name_or_path) <= 80 else name_or_path[:77] + "..."
        raise _one_line(f"{shown}: cannot open model config: {getattr(e, 'strerror', None) or e}") from None
    try:
        st = p.stat()
    except OSError as e:
        raise _one_line(f"{p}: cannot open model config: {e.strerror or e}") from None
    return _spec_of(str(p), name, st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=256)
def _spec_of(path: str, name: str, mtime_ns: int, size: int) -> ModelSpec:
    """The ModelSpec of the config.json at ``path`` as it is on disk (its modification time and size
    in the key: a config edited since is read again), read once: every design point and call that
    names a model reads the same (immutable) spec."""
    return spec_from_config(_read_config(Path(path)), name, path)
