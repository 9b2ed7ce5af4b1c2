"""ModelSpec: the architecture of a transformer LLM, read from an unmodified
Hugging Face ``config.json``.

Supported families (by ``model_type``): llama, mistral, qwen2 (gated SwiGLU MLP,
MHA/GQA), mixtral (MoE), gptj (parallel attention+MLP, GeLU), falcon (parallel
blocks, MQA/GQA), opt (ReLU MLP, learned positions), bloom (GeLU, ALiBi),
deepseek_v3 (MLA + MoE with shared experts). Other model types are read with the
common Hugging Face field names and the llama layout.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from basis.errors import DseError

MODELS_DIR = Path(__file__).resolve().parent.parent / "configs" / "models"


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
    norms_per_block: int = 2
    norm_type: str = "rmsnorm"        # rmsnorm | layernorm (layernorm has a bias)
    attention_bias: bool = False      # q/k/v projections have a bias
    o_proj_bias: bool = False
    mlp_bias: bool = False
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
    first_dense_layers: int = 0       # leading layers with a dense MLP (DeepSeek first_k_dense_replace)
    # Multi-head latent attention (DeepSeek)
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    max_position_embeddings: int = 0
    source: str = ""

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.first_dense_layers if self.is_moe else 0

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

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
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.num_kv_heads * self.head_dim


def _need(cfg: dict, path: str, *keys: str, default=None):
    for k in keys:
        if k in cfg and cfg[k] is not None:
            return cfg[k]
    if default is not None:
        return default
    raise DseError(f"{path}: config.json is missing '{keys[0]}'"
                   + (f" (also tried {', '.join(keys[1:])})" if len(keys) > 1 else ""))


def _positive_int(value, path: str, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value or value <= 0:
        raise DseError(f"{path}: '{key}' must be a positive integer, got {value!r}")
    return int(value)


def spec_from_config(cfg: dict, name: str, path: str = "config.json") -> ModelSpec:
    """Return the ModelSpec of a parsed Hugging Face config dict; raise DseError on a
    missing or invalid field (naming ``path`` and the key)."""
    if not isinstance(cfg, dict):
        raise DseError(f"{path}: expected a JSON object")
    mt = str(cfg.get("model_type", "llama")).lower()
    g = lambda *keys, default=None: _need(cfg, path, *keys, default=default)  # noqa: E731

    hidden = g("hidden_size", "n_embd", "n_embed", "d_model")
    layers = g("num_hidden_layers", "n_layer", "num_layers")
    heads = g("num_attention_heads", "n_head", "num_heads")
    vocab = g("vocab_size")
    for key, v in (("hidden_size", hidden), ("num_hidden_layers", layers),
                   ("num_attention_heads", heads), ("vocab_size", vocab)):
        _positive_int(v, path, key)
    kw: dict = dict(name=name, model_type=mt, hidden_size=int(hidden), num_layers=int(layers),
                    num_heads=int(heads), vocab_size=int(vocab), source=path,
                    max_position_embeddings=int(cfg.get("max_position_embeddings")
                                                or cfg.get("n_positions") or 0),
                    tie_word_embeddings=bool(cfg.get("tie_word_embeddings", mt in ("opt", "bloom", "falcon"))))
    kv_heads = cfg.get("num_key_value_heads")
    head_dim = cfg.get("head_dim") or int(hidden) // int(heads)

    if mt == "gptj":
        kw.update(intermediate_size=int(cfg.get("n_inner") or 4 * hidden), mlp_gated=False,
                  mlp_activation=str(cfg.get("activation_function", "gelu_new")),
                  parallel_block=True, norms_per_block=1, norm_type="layernorm",
                  mlp_bias=True, lm_head_bias=True)
    elif mt == "falcon":
        new_arch = bool(cfg.get("new_decoder_architecture", False))
        if new_arch:
            kv_heads = cfg.get("num_kv_heads", heads)
        elif cfg.get("multi_query", False):
            kv_heads = 1
        else:
            kv_heads = heads
        bias = bool(cfg.get("bias", False))
        kw.update(intermediate_size=int(cfg.get("ffn_hidden_size") or 4 * hidden), mlp_gated=False,
                  mlp_activation="gelu", parallel_block=bool(cfg.get("parallel_attn", True)),
                  norms_per_block=(int(cfg.get("num_ln_in_parallel_attn") or 2) if new_arch else 1),
                  norm_type="layernorm", attention_bias=bias, o_proj_bias=bias, mlp_bias=bias)
    elif mt == "opt":
        kw.update(intermediate_size=int(g("ffn_dim")), mlp_gated=False,
                  mlp_activation=str(cfg.get("activation_function", "relu")), norm_type="layernorm",
                  attention_bias=bool(cfg.get("enable_bias", True)), o_proj_bias=bool(cfg.get("enable_bias", True)),
                  mlp_bias=bool(cfg.get("enable_bias", True)),
                  position_embeddings=int(g("max_position_embeddings")) + 2,  # OPT offsets positions by 2
                  final_norm=bool(cfg.get("do_layer_norm_before", True)))
        if int(cfg.get("word_embed_proj_dim", hidden)) != int(hidden):
            raise DseError(f"{path}: OPT word_embed_proj_dim != hidden_size is not supported")
    elif mt == "bloom":
        kw.update(intermediate_size=4 * int(hidden), mlp_gated=False, mlp_activation="gelu",
                  norm_type="layernorm", attention_bias=True, o_proj_bias=True, mlp_bias=True,
                  embedding_norm=True)
    else:  # llama, mistral, qwen2, mixtral, deepseek_v3 and llama-like models
        inter = g("intermediate_size", "ffn_dim", "n_inner")
        _positive_int(inter, path, "intermediate_size")
        kw.update(intermediate_size=int(inter), mlp_gated=True,
                  mlp_activation=str(cfg.get("hidden_act", "silu")),
                  attention_bias=bool(cfg.get("attention_bias", mt == "qwen2")),
                  o_proj_bias=bool(cfg.get("attention_bias", False)) and mt != "qwen2",
                  mlp_bias=bool(cfg.get("mlp_bias", False)))
        if mt == "mixtral" or "num_local_experts" in cfg:
            kw.update(num_experts=int(g("num_local_experts")),
                      experts_per_token=int(g("num_experts_per_tok")),
                      moe_intermediate_size=int(inter))
        if mt.startswith("deepseek") or "n_routed_experts" in cfg:
            kw.update(num_experts=int(g("n_routed_experts")),
                      experts_per_token=int(g("num_experts_per_tok")),
                      moe_intermediate_size=int(g("moe_intermediate_size")),
                      num_shared_experts=int(cfg.get("n_shared_experts") or 0),
                      first_dense_layers=int(cfg.get("first_k_dense_replace") or 0))
            if int(cfg.get("moe_layer_freq", 1) or 1) != 1:
                raise DseError(f"{path}: moe_layer_freq other than 1 is not supported")
        if cfg.get("kv_lora_rank"):
            kw.update(q_lora_rank=int(cfg.get("q_lora_rank") or 0), kv_lora_rank=int(cfg["kv_lora_rank"]),
                      qk_nope_head_dim=int(g("qk_nope_head_dim")), qk_rope_head_dim=int(g("qk_rope_head_dim")),
                      v_head_dim=int(g("v_head_dim")))
            head_dim = kw["qk_nope_head_dim"] + kw["qk_rope_head_dim"]
    kv_heads = int(kv_heads if kv_heads is not None else heads)
    _positive_int(kv_heads, path, "num_key_value_heads")
    if int(heads) % kv_heads:
        raise DseError(f"{path}: num_attention_heads ({heads}) is not a multiple of "
                       f"num_key_value_heads ({kv_heads})")
    kw.update(num_kv_heads=kv_heads, head_dim=int(head_dim))
    return ModelSpec(**kw)


def available_models() -> list[str]:
    """Names of the model configs shipped in configs/models/."""
    return sorted(p.stem for p in MODELS_DIR.glob("*.json"))


def load_model(name_or_path: str) -> ModelSpec:
    """Return the ModelSpec of a shipped model name or of a path to a config.json;
    raise DseError for an unknown name, an unreadable file or a missing field."""
    p = Path(name_or_path)
    if p.suffix == ".json" or p.is_file() or "/" in str(name_or_path):
        if p.is_dir():
            p = p / "config.json"
        if not p.is_file():
            raise DseError(f"model config file not found: {p}")
        name = p.parent.name if p.name == "config.json" else p.stem
    else:
        p = MODELS_DIR / f"{name_or_path}.json"
        if not p.is_file():
            raise DseError(f"unknown model '{name_or_path}'; valid models: {', '.join(available_models())}"
                           " (or a path to a config.json)")
        name = str(name_or_path)
    try:
        cfg = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DseError(f"{p}: cannot read config.json: {e}") from None
    return spec_from_config(cfg, name, str(p))
