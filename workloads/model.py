"""ModelSpec: the architecture of a transformer LLM, read from an unmodified
Hugging Face ``config.json``.

Supported families (by ``model_type``): llama, mistral, qwen2 (gated SwiGLU MLP,
MHA/GQA), mixtral (MoE), gptj (parallel attention+MLP, GeLU), falcon (parallel
blocks, MQA/GQA), opt (ReLU MLP, learned positions), bloom (GeLU, ALiBi),
deepseek_v3 (MLA + MoE with shared experts). Other model types are read with the
common Hugging Face field names and the llama layout.

Reading is strict: every field the model uses is checked for type, finiteness and
range (counts are integers from 1, or 0 where 0 means "none", up to ``MAX_SIZE`` =
2**40), and every bad input is one DseError line ``{path}: {key}: {what is wrong};
{what is allowed}`` -- never a traceback, never a silently wrong number.
"""
from __future__ import annotations

import json
import math
import numbers
import os
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


# ---------------------------------------------------------------------------------------------
# Validation. Every value read from a config passes one of three checks (_int, _flag, _text);
# each failure is one DseError line "{path}: {key}: {what is wrong}; {what is allowed}".

MAX_SIZE = 2 ** 40
"""Upper bound on any count or size read from a config (no real model comes near it)."""
_MAX_TEXT = "2**40"
_REQUIRED = object()


def _one_line(text: str) -> DseError:
    """DseError of ``text`` with control characters (a newline in a file or key name) escaped."""
    return DseError("".join(c if c >= " " else repr(c)[1:-1] for c in text))


def _fail(path, key: str, problem: str) -> DseError:
    return _one_line(f"{path}: {key}: {problem}")


def _show(v) -> str:
    """``v`` as it would read in JSON, shortened to one short phrase."""
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
    try:
        s = json.dumps(v, allow_nan=True)
    except (TypeError, ValueError, RecursionError):
        s = f"a Python {type(v).__name__}"
    kind = ({str: "a string", bool: "a boolean", list: "a list", dict: "an object"}.get(type(v), "")
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
        what = "got null" if null else f"config.json is missing '{keys[0]}'"
        raise _fail(path, null or keys[0], f"{what}{also}; {allowed}")
    if isinstance(v, bool) or not isinstance(v, (numbers.Integral, numbers.Real)):
        raise _fail(path, key, f"got {_show(v)}; {allowed}")
    if not isinstance(v, numbers.Integral):
        v = float(v)
        if not math.isfinite(v):
            raise _fail(path, key, f"got {_show(v)}, not a finite number; {allowed}")
        if not v.is_integer():
            raise _fail(path, key, f"got {_show(v)}, not a whole number; {allowed}")
    v = int(v)
    if v < lo:
        raise _fail(path, key, f"got {_show(v)}, below {lo}; {allowed}")
    if v > hi:
        why = (f"above {hi_name} ({hi})" if hi_name else
               f"above {_MAX_TEXT} (no real model is that large)" if hi == MAX_SIZE else f"above {hi}")
        raise _fail(path, key, f"got {_show(v)}, {why}; {allowed}")
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
    raise _fail(path, key, f"got {_show(v)}; expected true or false")


def _text(cfg: dict, path: str, key: str, default: str) -> str:
    """The string under ``key``; ``default`` when absent or null."""
    v = cfg.get(key)
    if v is None:
        return default
    if not isinstance(v, str):
        raise _fail(path, key, f"got {_show(v)}; expected a string")
    return v


def spec_from_config(cfg: dict, name: str, path: str = "config.json") -> ModelSpec:
    """Return the ModelSpec of a parsed Hugging Face config dict; raise DseError (one line
    naming ``path`` and the key) on a missing, mistyped or out-of-range field."""
    if not isinstance(cfg, dict):
        raise _fail(path, "(top level)", f"got {_show(cfg)}; expected a JSON object {{...}} of config fields")
    mt = _text(cfg, path, "model_type", "llama").lower()

    hidden = _int(cfg, path, "hidden_size", "n_embd", "n_embed", "d_model")
    layers = _int(cfg, path, "num_hidden_layers", "n_layer", "num_layers")
    heads = _int(cfg, path, "num_attention_heads", "n_head", "num_heads")
    vocab = _int(cfg, path, "vocab_size")
    kw: dict = dict(name=name, model_type=mt, hidden_size=hidden, num_layers=layers, num_heads=heads,
                    vocab_size=vocab, source=path,
                    max_position_embeddings=_int(cfg, path, "max_position_embeddings", "n_positions", default=0),
                    tie_word_embeddings=_flag(cfg, path, "tie_word_embeddings", mt in ("opt", "bloom", "falcon")))
    head_dim = _int(cfg, path, "head_dim", default=None)
    kv_key, kv_default = "num_key_value_heads", heads

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
            raise _fail(path, "word_embed_proj_dim", f"got {proj}, not hidden_size ({hidden}); only "
                        "word_embed_proj_dim equal to hidden_size is supported")
        kv_key = None
    elif mt == "bloom":
        kw.update(intermediate_size=4 * hidden, mlp_gated=False, mlp_activation="gelu",
                  norm_type="layernorm", attention_bias=True, o_proj_bias=True, mlp_bias=True,
                  embedding_norm=True)
        kv_key = None
    else:  # llama, mistral, qwen2, mixtral, deepseek_v3 and llama-like models
        inter = _int(cfg, path, "intermediate_size", "ffn_dim", "n_inner")
        kw.update(intermediate_size=inter, mlp_gated=True,
                  mlp_activation=_text(cfg, path, "hidden_act", "silu"),
                  attention_bias=_flag(cfg, path, "attention_bias", mt == "qwen2"),
                  o_proj_bias=_flag(cfg, path, "attention_bias", False) and mt != "qwen2",
                  mlp_bias=_flag(cfg, path, "mlp_bias", False))
        if mt == "mixtral" or "num_local_experts" in cfg:
            experts = _int(cfg, path, "num_local_experts")
            kw.update(num_experts=experts, moe_intermediate_size=inter,
                      experts_per_token=_int(cfg, path, "num_experts_per_tok", hi=experts, hi_name="num_local_experts"))
        if mt.startswith("deepseek") or "n_routed_experts" in cfg:
            experts = _int(cfg, path, "n_routed_experts")
            kw.update(num_experts=experts,
                      experts_per_token=_int(cfg, path, "num_experts_per_tok", hi=experts, hi_name="n_routed_experts"),
                      moe_intermediate_size=_int(cfg, path, "moe_intermediate_size"),
                      num_shared_experts=_int(cfg, path, "n_shared_experts", default=0, lo=0),
                      first_dense_layers=_int(cfg, path, "first_k_dense_replace", default=0, lo=0, hi=layers,
                                              hi_name="num_hidden_layers"))
            freq = _int(cfg, path, "moe_layer_freq", default=1)
            if freq != 1:
                raise _fail(path, "moe_layer_freq", f"got {freq}; only 1 (every layer after first_k_dense_replace "
                            "is a MoE layer) is supported")
        if cfg.get("kv_lora_rank") is not None:  # multi-head latent attention
            kw.update(kv_lora_rank=_int(cfg, path, "kv_lora_rank"),
                      q_lora_rank=_int(cfg, path, "q_lora_rank", default=0, lo=0),  # 0 or null: no q compression
                      qk_nope_head_dim=_int(cfg, path, "qk_nope_head_dim"),
                      qk_rope_head_dim=_int(cfg, path, "qk_rope_head_dim"),
                      v_head_dim=_int(cfg, path, "v_head_dim"))
            head_dim = kw["qk_nope_head_dim"] + kw["qk_rope_head_dim"]
    if head_dim is None:
        if hidden % heads:
            raise _fail(path, "num_attention_heads", f"hidden_size ({hidden}) is not a multiple of "
                        f"num_attention_heads ({heads}); give head_dim in the config or a number of heads "
                        "that divides hidden_size")
        head_dim = hidden // heads
    kv_heads = (_int(cfg, path, kv_key, default=heads, hi=heads, hi_name="num_attention_heads")
                if kv_key else kv_default)
    if heads % kv_heads:
        raise _fail(path, kv_key, f"got {kv_heads}, not a divisor of num_attention_heads ({heads}); "
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


def _read_config(p: Path):
    """The parsed JSON of ``p``; DseError (one line naming ``p``) when it cannot be read,
    is not UTF-8 text, is not JSON, repeats a key or holds NaN/Infinity."""
    where = f"{p}: cannot read config.json"
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise _one_line(f"{where}: {e.strerror or e}") from None
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
    bad = _first_not_finite(cfg)
    if bad:
        key, v = bad
        what = ("not a JSON number" if v.text in ("NaN", "Infinity", "-Infinity") else
                "too large for a 64-bit float")
        raise _fail(p, key, f"got {_show(v)}, {what}; expected a finite number")
    return cfg


def available_models() -> list[str]:
    """Names of the model configs shipped in configs/models/."""
    return sorted(p.stem for p in MODELS_DIR.glob("*.json"))


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
            if not p.is_file():
                raise _one_line(f"model config file not found: {p}")
            name = p.parent.name if p.name == "config.json" else p.stem
        else:
            p = MODELS_DIR / f"{name_or_path}.json"
            if not p.is_file():
                raise _one_line(f"unknown model '{name_or_path}'; valid models: {', '.join(available_models())}"
                                " (or a path to a config.json)")
            name = name_or_path
    except (OSError, ValueError) as e:
        shown = name_or_path if len(name_or_path) <= 80 else name_or_path[:77] + "..."
        raise _one_line(f"{shown}: cannot open model config: {getattr(e, 'strerror', None) or e}") from None
    return spec_from_config(_read_config(p), name, str(p))
