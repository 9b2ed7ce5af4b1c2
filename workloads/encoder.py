"""The vision encoder as operators, run before the LLM's prefill (``prefill``: the prefill table
with the encoder's operators first).

Per device, for ``batch`` requests of ``images`` still images each, P patches an image
(``workloads.vision.image_patches``), N = batch x images x P patch tokens, ViT width h, MLP width i,
``depth`` blocks, d = h / heads:

- ``vision_patch_embed``: a matmul of N x (channels x temporal_patch x patch^2) by that x h (Qwen3-VL's
  Conv3d: a still image is its frame repeated ``temporal_patch_size`` times);
- ``vision_pos_embed``: the learned position table added (Qwen3-VL: 4 rows interpolated, 8 ops an element);
- per block: a norm (LayerNorm, or Qwen2.5-VL's RMSNorm), fused qkv, attention over each image's own
  patches (full, not causal: P^2 pairs an image and head; Qwen2.5-VL's windowed blocks the pairs
  within each window, ``workloads.vision.window_pairs``; fused as FlashAttention where the LLM's
  attention is, else qk / softmax / sv with the scores), proj, two residual adds, a norm, fc1,
  GELU, fc2 (Qwen2.5-VL: gate and up, SiLU, down); under tensor parallelism heads and MLP width split over ``tp`` with two all-reduces
  a block, as the decoder's;
- Llama 4: every tile its own sequence of 577 tokens (576 patches and a class token), a LayerNorm
  before and after the blocks, then the pixel-shuffle MLP (hidden merge^2 -> projector_input_dim ->
  projector_output_dim, GELU after each) and the projector to the text width, on 144 tokens a tile;
- the projector: Qwen3-VL's merger(s) (``mergers``: LayerNorm, m x m, GELU, m x out on N / merge^2
  merged tokens, m = h merge^2); Gemma 3's post-LayerNorm, 4 x 4 average pooling, RMSNorm and one
  h x out matmul on the pooled tokens. Replicated on every tp rank.

Fused attention reads q, K and V once: one image's K and V (P x 2h elements, 18 MiB at 4,096 patches
in fp16) stay in the device's last-level cache while its blocks of query rows pass, unlike a long
prompt's KV cache, whose re-reads per block of rows ``workloads.optable`` prices in device memory.
So the live set of the encoder's attention is its q, K, V and output, not the traffic of re-reads.

Counting conventions are ``workloads.optable``'s (LayerNorm 7 ops an element, GELU 8, softmax 5, a
multiply-accumulate 2). The encoder's weights are priced in the weights format.
"""
from __future__ import annotations

from dataclasses import replace

from workloads import optable
from workloads.model import ModelSpec
from workloads.optable import ACT_OPS, NORM_OPS, SOFTMAX_OPS, Operator, OpTable
from workloads.scenario import Scenario
from workloads.vision import (
    VisionSpec,
    image_patches,
    image_tokens,
    norm_weights,
    request_image_tokens,
    resized,
    tile_patches,
    tiles,
    window_pairs,
)

#: the prefix of every encoder operator's name
PREFIX = "vision_"


def with_images(model: ModelSpec, images: int, height: int, width: int) -> ModelSpec:
    """``model`` whose requests each carry ``images`` still images of ``height`` x ``width`` pixels
    (``model`` itself when ``images`` is 0 or the model has no vision tower)."""
    if not images or model.vision is None:
        return model
    v = replace(model.vision, images=int(images), image_height=int(height), image_width=int(width))
    h, w = resized(v, height, width)
    note = (f"{images} image{'s' * (images != 1)} of {height}x{width} px a request, resized to {h}x{w}: "
            f"{image_patches(v, height, width):,} patches each through the vision encoder, "
            f"{request_image_tokens(v):,} tokens added to the prompt")
    return replace(model, vision=v, notes=(*model.notes, note))


def encoder_operators(v: VisionSpec, sc: Scenario, buffer_bytes: float) -> list[Operator]:
    """The encoder's operators for the ``sc.batch`` requests of ``sc`` on one of its ``sc.tp`` devices
    (see the module docstring); none when the requests carry no images."""
    if v is None or not v.active:
        return []
    tp = sc.tp
    llama4 = v.family == "llama4"
    if llama4:                                       # each tile its own sequence: its patches and a class token
        p = tile_patches(v) + 1
        seqs = sc.batch * v.images * tiles(v, v.image_height, v.image_width)
    else:                                            # each image its own attention sequence
        p = image_patches(v, v.image_height, v.image_width)
        seqs = sc.batch * v.images
    n = seqs * p                                     # tokens through the ViT
    h, i, d = v.hidden_size, v.intermediate_size / tp, v.head_dim
    nh = v.num_heads / tp
    ln, nw = NORM_OPS[v.norm], norm_weights(v)
    ops: list[Operator] = []

    def add(name, kind, count, **kw):
        ops.append(Operator(PREFIX + name, kind, count, **kw))

    def linear(name, d_in, d_out, count, tokens, bias=True):
        add(name, "matmul", count, ops=2 * tokens * d_in * d_out, weight=d_in * d_out + (d_out if bias else 0),
            act_in=tokens * d_in, act_out=tokens * d_out, shape_m=tokens, shape_n=d_out, shape_k=d_in)

    def norm(name, width, count, tokens, per=ln, weights=nw):
        add(name, "vector", count, ops=per * tokens * width, weight=weights * width, act_in=tokens * width,
            act_out=tokens * width)

    k_in = v.in_channels * v.temporal_patch_size * v.patch_size ** 2
    linear("patch_embed", k_in, h, 1, n, bias=v.patch_bias)
    if v.family in ("siglip", "llama4"):
        add("pos_embed", "vector", 1, ops=n * h, weight=p * h, act_in=n * h, act_out=n * h)
        if llama4:
            norm("pre_norm", h, 1, n)
    elif v.position_embeddings:
        add("pos_embed", "vector", 1, ops=8 * n * h, weight=min(p, v.position_embeddings) * 4 * h, act_in=n * h,
            act_out=n * h)
    L = v.depth
    norm("attn_norm", h, L, n)
    linear("qkv_proj", h, 3 * nh * d, L, n)
    windowed = L - v.full_blocks if v.window else 0
    full_pairs = seqs * nh * p * p
    win_pairs = seqs * nh * window_pairs(v, v.image_height, v.image_width) if windowed else 0
    keys = min(p, v.window ** 2) if windowed else p

    def attention(prefix, count, pairs, keys):
        if sc.flash_attention:              # q, K and V read once (see the module docstring); no shape recorded:
            # the kernel layer's attention is causal prefill or decode, so full attention keeps the fitted fractions
            add(prefix + "flash_attention", "attention", count, ops=2 * pairs * 2 * d + SOFTMAX_OPS * pairs,
                act_in=3 * n * nh * d, act_out=n * nh * d)
        else:
            add(prefix + "qk_matmul", "attention", count, ops=2 * pairs * d, act_in=2 * n * nh * d, act_out=pairs)
            add(prefix + "softmax", "vector", count, ops=SOFTMAX_OPS * pairs, act_in=pairs, act_out=pairs)
            add(prefix + "sv_matmul", "attention", count, ops=2 * pairs * d, act_in=pairs + n * nh * d,
                act_out=n * nh * d)
    attention("", L - windowed, full_pairs, p)
    if windowed:
        attention("window_", windowed, win_pairs, keys)
    linear("o_proj", nh * d, h, L, n)
    if tp > 1:
        add("attn_all_reduce", "collective", L, comm=n * h)
    add("attn_add", "vector", L, ops=n * h, act_in=2 * n * h, act_out=n * h)
    norm("mlp_norm", h, L, n)
    if v.mlp_gated:                      # Qwen2.5-VL: SiLU(gate) x up, then down
        linear("gate_up_proj", h, 2 * i, L, n)
        add("act", "vector", L, ops=ACT_OPS["silu"] * n * i, act_in=2 * n * i, act_out=n * i)
    else:
        linear("fc1", h, i, L, n)
        add("act", "vector", L, ops=ACT_OPS["gelu"] * n * i, act_in=n * i, act_out=n * i)
    linear("fc2", i, h, L, n)
    if tp > 1:
        add("mlp_all_reduce", "collective", L, comm=n * h)
    add("mlp_add", "vector", L, ops=n * h, act_in=2 * n * h, act_out=n * h)
    tokens = sc.batch * v.images * image_tokens(v, v.image_height, v.image_width)
    out = v.out_hidden_size
    if llama4:                            # pixel shuffle: 2 x 2 patches (class token dropped) into one token
        m = h * v.spatial_merge_size ** 2
        norm("post_norm", h, 1, n)
        linear("adapter_fc1", m, v.adapter_size, 1, tokens, bias=False)
        add("adapter_act1", "vector", 1, ops=ACT_OPS["gelu"] * tokens * v.adapter_size,
            act_in=tokens * v.adapter_size, act_out=tokens * v.adapter_size)
        linear("adapter_fc2", v.adapter_size, v.adapter_out, 1, tokens, bias=False)
        add("adapter_act2", "vector", 1, ops=ACT_OPS["gelu"] * tokens * v.adapter_out,
            act_in=tokens * v.adapter_out, act_out=tokens * v.adapter_out)
        linear("projector", v.adapter_out, out, 1, tokens, bias=False)
    elif v.family == "siglip":
        norm("post_norm", h, 1, n)
        add("pool", "vector", 1, ops=n * h, act_in=n * h, act_out=tokens * h)
        norm("projector_norm", h, 1, tokens, per=NORM_OPS["rmsnorm"], weights=1)
        linear("projector", h, out, 1, tokens, bias=False)
    else:
        m = h * v.spatial_merge_size ** 2
        norm("merger_norm", h, v.mergers, n)
        linear("merger_fc1", m, m, v.mergers, tokens)
        add("merger_act", "vector", v.mergers, ops=ACT_OPS["gelu"] * tokens * m, act_in=tokens * m,
            act_out=tokens * m)
        linear("merger_fc2", m, out, v.mergers, tokens)
    return ops


def prefill(model: ModelSpec, scenario: Scenario, buffer_bytes: float = 0.0, keys=None) -> OpTable:
    """``optable.prefill`` of ``model`` with the vision encoder's operators first where its requests
    carry images (the same table otherwise)."""
    table = optable.prefill(model, scenario, buffer_bytes, keys)
    enc = encoder_operators(model.vision, scenario, buffer_bytes)
    return replace(table, operators=(*enc, *table.operators), arrays={}) if enc else table


def zeroed(table: OpTable, like: OpTable) -> OpTable:
    """``table`` (a decode step) with the encoder operators of ``like`` (a prefill) appended, every
    amount 0: the rows an iteration's prompt work puts the encoder on (``dse.system.iteration``)."""
    enc = [replace(op, **{f: 0.0 for f in optable.AMOUNT_FIELDS}) for op in like.operators
           if op.name.startswith(PREFIX)]
    return replace(table, operators=(*table.operators, *enc), arrays={}) if enc else table


__all__ = ["PREFIX", "with_images", "encoder_operators", "prefill", "zeroed"]
