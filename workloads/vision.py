"""The vision tower of a vision-language model: its shapes (``VisionSpec``, read from the
config's own ``vision_config`` by ``workloads.model``), how an image becomes patches and LLM
tokens by the model's own processor rules, and its parameter count.

Families (``VisionSpec.family``):

- ``qwen3_vl`` (Qwen3-VL; Qwen3.5 has the same tower without DeepStack): a ViT of ``depth`` blocks
  (LayerNorm with bias before attention and MLP; fused qkv and proj with biases; a two-matrix
  GELU MLP with biases), a Conv3d patch embedding over ``temporal_patch_size`` frames of
  ``patch_size`` x ``patch_size`` pixels (a still image is its frame repeated, so one temporal
  patch), a learned table of ``num_position_embeddings`` rows bilinearly interpolated to the grid
  (4 rows read and weighted per patch), full attention within each image, and a patch merger
  (LayerNorm, Linear(m, m), GELU, Linear(m, out_hidden_size), m = hidden x merge^2) that turns
  ``spatial_merge_size``^2 neighbouring patches into one LLM token; DeepStack adds one more merger
  (its LayerNorm over m) per entry of ``deepstack_visual_indexes`` (transformers,
  ``models/qwen3_vl/modeling_qwen3_vl.py``: Qwen3VLVisionPatchEmbed, Qwen3VLVisionBlock,
  Qwen3VLVisionPatchMerger(use_postshuffle_norm)). Image -> patches: the Qwen2-VL image
  processor's ``smart_resize`` (height and width rounded to multiples of patch_size x merge_size,
  then scaled into [min_pixels, max_pixels]); Qwen3-VL's ``preprocessor_config.json`` gives
  ``size`` {shortest_edge: 65536, longest_edge: 16777216} pixels (Qwen/Qwen3-VL-8B-Instruct on the
  Hub). Tokens = (H / ps) (W / ps) / merge^2.
- ``qwen2_5_vl`` (Qwen2.5-VL): the same patch embedding (without bias) and merger (RMSNorm before it,
  no DeepStack, no position table: 2-D RoPE), RMSNorms, a gated SiLU MLP with biases
  (gate, up, down), and window attention: all blocks but ``fullatt_block_indexes`` attend within
  windows of ``window_size`` pixels (112: 8 x 8 patches) (transformers,
  ``models/qwen2_5_vl/modeling_qwen2_5_vl.py``: Qwen2_5_VLVisionBlock, Qwen2_5_VLMLP,
  Qwen2_5_VLPatchMerger, get_window_index). Its processor: min_pixels 3,136, max_pixels 12,845,056
  (``preprocessor_config.json`` of Qwen/Qwen2.5-VL-7B-Instruct), patch 14, merge 2: tokens =
  (H / 14)(W / 14) / 4 after resizing to multiples of 28 px.
- ``llama4`` (Llama 4 Scout / Maverick): an image is cut into tiles of ``image_size`` (336) px: the
  canvas of h x w tiles (h w <= 16) that holds it with the least upscaling (or, when every canvas
  must shrink it, the least downscaling), the smallest such; with more than one tile a global tile
  (the whole image at 336 px) is added. Each tile is a sequence of (336 / 14)^2 = 576 patches plus a
  class token through a ViT of ``num_hidden_layers`` blocks (LayerNorms with bias, q/k/v/o with
  biases, a GELU MLP with biases; LayerNorms before and after the blocks, a learned position table
  of 577 rows), then a pixel shuffle of ratio ``pixel_shuffle_ratio`` (0.5: 2 x 2 patches into one
  token, 144 a tile), a two-matrix GELU MLP without biases (hidden x 4 -> ``projector_input_dim`` ->
  ``projector_output_dim``) and a projector to the text width without bias (transformers,
  ``models/llama4/modeling_llama4.py``: Llama4VisionModel, Llama4VisionPixelShuffleMLP,
  Llama4MultiModalProjector). Tokens = tiles x 144; the tile separators and image start / end
  tokens the processor adds (a few a tile) are left out.
- ``siglip`` (Gemma 3): a SigLIP ViT (``siglip_vision_model``: LayerNorms with bias, q/k/v/o with
  biases, a two-matrix GELU MLP, a final ``post_layernorm``), every image resized to
  ``image_size`` x ``image_size`` (896), so (896 / 14)^2 = 4096 patches, average-pooled to
  ``mm_tokens_per_image`` (256) tokens, each RMS-normed and projected to the text width by one
  matrix without bias (transformers, ``models/gemma3/modeling_gemma3.py``:
  Gemma3MultiModalProjector; Gemma 3 Technical Report, arXiv 2503.19786, Sec. 2.1: 896 x 896
  images, 256 soft tokens). Pan & Scan (crops of large images) is off by default and not modelled.

Qwen3.5 (``qwen3_5``, ``qwen3_5_moe``) is read as ``qwen3_vl`` with no DeepStack entry: transformers'
``models/qwen3_5/modular_qwen3_5.py`` builds Qwen3_5VisionModel from Qwen3VLVisionModel and deletes
its ``deepstack_merger_list``, and its processor is ``processing_qwen3_vl``'s (Qwen3-VL's bounds).

Not read: Gemma 4 (``gemma4_vision``), and Llama 4 Maverick's tower (its shipped config, an older
aiconfigurator-core copy, carries no ``vision_config``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from basis.errors import DseError

#: the families of vision tower this module prices
FAMILIES = ("qwen3_vl", "qwen2_5_vl", "siglip", "llama4")
#: Qwen3-VL's processor: pixels of a resized image, at least and at most (preprocessor_config.json of
#: Qwen/Qwen3-VL-8B-Instruct: "size": {"longest_edge": 16777216, "shortest_edge": 65536})
QWEN3_VL_MIN_PIXELS = 65_536
QWEN3_VL_MAX_PIXELS = 16_777_216
#: Qwen2.5-VL's processor (preprocessor_config.json of Qwen/Qwen2.5-VL-7B-Instruct: "min_pixels": 3136,
#: "max_pixels": 12845056)
QWEN2_5_VL_MIN_PIXELS = 3_136
QWEN2_5_VL_MAX_PIXELS = 12_845_056
#: the Qwen processors refuse an image whose longer side is more than 200 times its shorter
#: (transformers, models/qwen2_vl/image_processing_qwen2_vl.py, smart_resize)
MAX_ASPECT = 200
#: Llama 4's image processor: at most 16 tiles a canvas, the canvas the smallest that holds the image
#: at the least upscaling (resize_to_max_canvas false), and a global tile when there are several
#: (transformers, models/llama4/image_processing_llama4_fast.py: find_supported_resolutions,
#: get_best_fit; Llama4ImageProcessorFast defaults max_patches=16, resize_to_max_canvas=False)
LLAMA4_MAX_TILES = 16
#: the largest side of an image a point may give, pixels (far above any camera's)
MAX_IMAGE_SIDE = 1 << 16


@dataclass(frozen=True)
class VisionSpec:
    """Shapes of a vision tower and the images each request carries (``images`` 0: none)."""

    family: str
    depth: int
    hidden_size: int
    num_heads: int
    intermediate_size: int
    patch_size: int
    out_hidden_size: int                 # the LLM's hidden size (what the projector writes)
    in_channels: int = 3
    temporal_patch_size: int = 1
    spatial_merge_size: int = 1
    position_embeddings: int = 0         # rows of the learned position table
    mergers: int = 1                     # patch mergers (Qwen3-VL: 1 + DeepStack's)
    image_size: int = 0                  # siglip: every image resized to this square
    tokens_per_image: int = 0            # siglip: the pooled tokens of one image
    min_pixels: int = 0
    max_pixels: int = 0
    mlp_gated: bool = False              # Qwen2.5-VL: gate, up and down projections (SiLU)
    norm: str = "layernorm"              # layernorm (with bias) | rmsnorm (a gain only)
    patch_bias: bool = True              # the patch embedding has a bias
    window: int = 0                      # Qwen2.5-VL: patches a side of an attention window (0: none)
    full_blocks: int = 0                 # of which blocks attend to the whole image (the rest: windows)
    tile_size: int = 0                   # llama4: pixels a side of a tile (image_size)
    max_tiles: int = 0                   # llama4: tiles of the largest canvas (max_patches)
    global_tile: bool = False            # llama4: a whole-image tile beside the canvas's tiles
    adapter_size: int = 0                # llama4: the pixel-shuffle MLP's width (projector_input_dim)
    adapter_out: int = 0                 # llama4: its output (projector_output_dim)
    images: int = 0                      # images per request
    image_height: int = 0                # pixels
    image_width: int = 0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def active(self) -> bool:
        """Whether requests carry images (the tower runs)."""
        return self.images > 0


def canvas(v: VisionSpec, height: int, width: int) -> tuple[int, int]:
    """Llama 4: (rows, columns) of tiles of the canvas an image of ``height`` x ``width`` pixels is
    resized onto (see the module docstring)."""
    options = [(r, c) for r in range(1, v.max_tiles + 1) for c in range(1, v.max_tiles // r + 1)]
    scales = [min(r * v.tile_size / height, c * v.tile_size / width) for r, c in options]
    up = [x for x in scales if x >= 1]
    best = min(up) if up else max(scales)
    return min((o for o, x in zip(options, scales) if x == best), key=lambda o: o[0] * o[1])


def tiles(v: VisionSpec, height: int, width: int) -> int:
    """Llama 4: tiles one image becomes, the global tile included (1 for the other families)."""
    if v.family != "llama4":
        return 1
    r, c = canvas(v, height, width)
    return r * c + (1 if v.global_tile and r * c > 1 else 0)


def resized(v: VisionSpec, height: int, width: int) -> tuple[int, int]:
    """(height, width) in pixels of an image of ``height`` x ``width`` after the processor's resize
    (see the module docstring; Llama 4: its canvas of tiles)."""
    if v.family == "siglip":
        return v.image_size, v.image_size
    if v.family == "llama4":
        r, c = canvas(v, height, width)
        return r * v.tile_size, c * v.tile_size
    factor = v.patch_size * v.spatial_merge_size
    h = max(factor, round(height / factor) * factor)
    w = max(factor, round(width / factor) * factor)
    if h * w > v.max_pixels:
        beta = math.sqrt(height * width / v.max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < v.min_pixels:
        beta = math.sqrt(v.min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


def tile_patches(v: VisionSpec) -> int:
    """Llama 4: patches of one tile."""
    return (v.tile_size // v.patch_size) ** 2


def image_patches(v: VisionSpec, height: int, width: int) -> int:
    """Patches the ViT attends over for one still image of ``height`` x ``width`` pixels (Llama 4:
    over all its tiles, each its own sequence)."""
    if v.family == "llama4":
        return tiles(v, height, width) * tile_patches(v)
    h, w = resized(v, height, width)
    return (h // v.patch_size) * (w // v.patch_size)


def image_tokens(v: VisionSpec, height: int, width: int) -> int:
    """LLM tokens one still image of ``height`` x ``width`` pixels becomes."""
    if v.family == "siglip":
        return v.tokens_per_image
    return image_patches(v, height, width) // v.spatial_merge_size ** 2


def request_image_tokens(v: VisionSpec | None) -> int:
    """LLM tokens the images of one request add to its prompt (0 without images)."""
    if v is None or not v.active:
        return 0
    return v.images * image_tokens(v, v.image_height, v.image_width)


def norm_weights(v: VisionSpec) -> int:
    """Parameters of one of the tower's norms per normalized element: a gain, and a LayerNorm's bias."""
    return 2 if v.norm == "layernorm" else 1


def window_pairs(v: VisionSpec, height: int, width: int) -> int:
    """Query-key pairs of one head of a windowed block (Qwen2.5-VL) over one image: windows of
    ``window`` x ``window`` patches tiling the grid from its corner (the last ones cut short), each
    patch attending to its window's: merge^4 (sum of a_i^2)(sum of b_j^2) over the windows' sides
    in merged tokens."""
    h, w = resized(v, height, width)
    m = v.spatial_merge_size
    side = v.window // m

    def squares(n: int) -> int:            # n merged tokens along an axis
        return (n // side) * side ** 2 + (n % side) ** 2
    return m ** 4 * squares(h // v.patch_size // m) * squares(w // v.patch_size // m)


def parameter_count(v: VisionSpec) -> float:
    """Parameters (elements) of the vision tower and its projector."""
    h, i, nw = v.hidden_size, v.intermediate_size, norm_weights(v)
    mlp = (3 * h * i + 2 * i + h) if v.mlp_gated else (h * i + i) + (i * h + h)
    block = 2 * nw * h + (3 * h * h + 3 * h) + (h * h + h) + mlp
    patch = v.in_channels * v.temporal_patch_size * v.patch_size ** 2 * h + (h if v.patch_bias else 0)
    if v.family == "llama4":
        p, m = tile_patches(v), h * v.spatial_merge_size ** 2
        adapter = m * v.adapter_size + v.adapter_size * v.adapter_out       # no biases
        return (patch + h + (p + 1) * h + 2 * 2 * h + v.depth * block + adapter
                + v.adapter_out * v.out_hidden_size)
    if v.family == "siglip":
        positions = (v.image_size // v.patch_size) ** 2 * h
        projector = h + h * v.out_hidden_size           # RMSNorm gain, one matrix without bias
        return patch + positions + v.depth * block + 2 * h + projector
    m = h * v.spatial_merge_size ** 2
    merger = (m * m + m) + (m * v.out_hidden_size + v.out_hidden_size)
    mergers = (merger + nw * h) + (v.mergers - 1) * (merger + nw * m)
    return patch + v.position_embeddings * h + v.depth * block + mergers


def parse_image_size(value) -> tuple[int, int]:
    """(height, width) in pixels of an ``image_size`` value: a side ('1024', 1024: a square) or
    'HEIGHTxWIDTH' ('768x1024'); DseError naming what is allowed."""
    text = str(value).strip().lower()
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        text = str(int(value))
    elif isinstance(value, float) and float(value).is_integer():
        text = str(int(value))
    parts = text.split("x")
    ok = 1 <= len(parts) <= 2 and all(p.isascii() and p.isdigit() for p in parts)
    sides = tuple(int(p) for p in parts) if ok else ()
    if not ok or not all(1 <= s <= MAX_IMAGE_SIDE for s in sides):
        shown = text if len(text) <= 40 else text[:37] + "..."
        raise DseError(f"image_size: expected a side in pixels ('1024') or 'HEIGHTxWIDTH' ('768x1024'), each "
                       f"from 1 to {MAX_IMAGE_SIDE}, got {shown!r}")
    h, w = (sides * 2)[:2]
    if max(h, w) > MAX_ASPECT * min(h, w):
        raise DseError(f"image_size: {h}x{w}: the longer side is more than {MAX_ASPECT} times the shorter, "
                       f"which the model's image processor refuses")
    return h, w


__all__ = ["VisionSpec", "FAMILIES", "resized", "image_patches", "image_tokens", "request_image_tokens",
           "parameter_count", "parse_image_size", "norm_weights", "window_pairs", "canvas", "tiles", "tile_patches",
           "LLAMA4_MAX_TILES", "QWEN3_VL_MIN_PIXELS", "QWEN3_VL_MAX_PIXELS"]
