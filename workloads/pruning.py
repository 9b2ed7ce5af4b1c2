"""Structured pruning as a transform of a model: a smaller ModelSpec with fewer layers (depth
pruning) or narrower layers (width pruning: hidden size, attention heads, KV heads, head size, MLP
width, routed experts and their width), as Sheared-LLaMA (Xia et al., arXiv 2310.06694) and
Minitron (Sreenivas et al., arXiv 2408.11796) derive small models from large ones.

A pruning is written ``layers=24,hidden=2048,heads=16,intermediate=5504`` (any subset of
``PRUNE_KEYS``) or ``none``. What each key sets, in the ModelSpec's units (counts of layers,
heads, experts; widths in elements):

- ``layers``: ``num_layers``. The first ``layers`` layers are kept with their own properties: the
  sliding-window layers among them stay sliding (indices beyond the new depth are dropped; no
  sliding layer left: no window), and the leading dense-MLP layers of an MoE model are capped at
  the new depth. Which layers a method drops (Minitron drops layers 16-31 of Llama-3.1-8B's 32,
  keeping the last) changes no count for a model whose layers are alike.
- ``hidden``: ``hidden_size`` (the residual stream, embedding and head width).
- ``heads``: ``num_heads``. The KV heads follow where the model has one per query head (MHA stays
  MHA, as Sheared-LLaMA prunes them together); otherwise (GQA, MQA) they stay, and the new number
  of heads must be a multiple of them (else give ``kv_heads`` too).
- ``kv_heads``: ``num_kv_heads``, a divisor of the (new) number of heads.
- ``head_dim``: ``head_dim``. It is not derived from the new hidden size: pruning heads or the
  hidden size keeps the head size, as Minitron's 4B-Width model keeps 128 with hidden 3072 and 32
  heads (its Hugging Face config gives ``head_dim`` for that reason).
- ``intermediate``: ``intermediate_size``, the dense MLP's width. In Mixtral, gpt-oss and DBRX one
  config key sets both it and the experts' width: there ``intermediate`` and ``moe_intermediate``
  are one dimension and either sets both. An MoE model whose layers are all MoE layers has no dense
  MLP to prune: ``moe_intermediate`` prunes its experts.
- ``experts``: ``num_experts``, the routed experts per MoE layer (no fewer than the top-k each
  token uses).
- ``moe_intermediate``: ``moe_intermediate_size``, each routed expert's width. DeepSeek's shared
  experts are experts of that width (its config derives their width from it) and follow; Qwen-MoE's
  shared expert has its own width and stays.

Pruning never grows a model: every value is at most the model's own. Nor does it leave a degenerate
one: each width (``hidden``, ``heads``, ``head_dim``, ``intermediate``, ``moe_intermediate``) keeps at
least 1/``MAX_NARROWING`` of the model's own (``hidden=1`` of Llama's 4096 is refused). Published
structured prunings stay far inside that: Sheared-LLaMA keeps half of Llama-2-7B's hidden size, heads
and MLP width, Minitron three quarters of Llama-3.1-8B's. Depth (``layers``: a self-speculating draft is
the first few layers), ``kv_heads`` (down to one: multi-query attention) and ``experts`` (at least the
top-k) have their own bounds. Multi-head latent attention
(DeepSeek-V2/V3): ``layers``, ``hidden``, ``heads``, ``intermediate``, ``experts`` and
``moe_intermediate`` are supported (the latent ranks and the per-head query/key/value sizes stay);
``kv_heads`` (MLA caches a latent, not KV heads) and ``head_dim`` (it is qk_nope_head_dim +
qk_rope_head_dim there) are refused.

Qwen-MoE's dense layers may sit anywhere (``mlp_only_layers``, ``decoder_sparse_step``); the
ModelSpec keeps only their number, and depth pruning caps that number as if they led.
"""
from __future__ import annotations

import numbers
import re
from dataclasses import replace

from basis.errors import DseError
from workloads.model import MAX_SIZE, ModelSpec

#: the dimensions a pruning sets, in the order a pruned model's name lists them
PRUNE_KEYS = ("layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate", "experts", "moe_intermediate")
#: ModelSpec field each key sets
_FIELDS = {"layers": "num_layers", "hidden": "hidden_size", "heads": "num_heads", "kv_heads": "num_kv_heads",
           "head_dim": "head_dim", "intermediate": "intermediate_size", "experts": "num_experts",
           "moe_intermediate": "moe_intermediate_size"}
#: MoE families whose one config key (intermediate_size, ffn_config.ffn_hidden_size) gives both the
#: dense and the expert width (see workloads.model.spec_from_config)
_ONE_WIDTH_MOE = ("mixtral", "gpt_oss", "dbrx")
_DEEPSEEK = ("deepseek_v2", "deepseek_v3")
_EXAMPLE = "e.g. 'layers=24,hidden=2048,heads=16,intermediate=5504'"
_ALLOWED = f"expected 'none' or key=value pairs separated by commas, keys from {', '.join(PRUNE_KEYS)} ({_EXAMPLE})"
_POSITIVE = "expected a positive integer (1 to 2**40)"
#: a pruning keeps each width at least 1/MAX_NARROWING of the model's own (module docstring)
MAX_NARROWING = 16
#: the widths that bound applies to
_WIDTHS = ("hidden", "heads", "head_dim", "intermediate", "moe_intermediate")


def _shown(v, limit: int = 40) -> str:
    """``v`` quoted, control characters escaped, cut to ``limit`` characters (one-line messages)."""
    text = repr(v)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def parse_prune(text: str, where: str = "prune") -> dict[str, int]:
    """The pruning a text names, as {key: value} (keys from ``PRUNE_KEYS``, values positive
    integers in the units of the ModelSpec field each sets: layers, heads, experts, or elements of
    width); {} for ``none``. Keys are read case-insensitively, spaces around items are ignored.
    Raises DseError, one line naming ``where`` and the key, for an unknown or repeated key, a value
    that is not a positive integer, or text of another form."""
    if not isinstance(text, str):
        raise DseError(f"{where}: got {_shown(text)}; {_ALLOWED}")
    s = text.strip()
    if s.lower() == "none":
        return {}
    if not s:
        raise DseError(f"{where}: got an empty text; {_ALLOWED}")
    out: dict[str, int] = {}
    for item in s.split(","):
        key, sep, value = (part.strip() for part in item.partition("="))
        if not sep or not key:
            raise DseError(f"{where}: got {_shown(item.strip() or text)}, not key=value; {_ALLOWED}")
        key = key.lower()
        if key not in PRUNE_KEYS:
            raise DseError(f"{where}: {_shown(key)}: not a dimension pruning sets; expected one of "
                           f"{', '.join(PRUNE_KEYS)} ({_EXAMPLE})")
        if key in out:
            raise DseError(f"{where}: {key}: given twice; give each dimension once")
        if not re.fullmatch(r"[0-9]+", value):
            what = ("nothing" if not value else
                    f"{_shown(value)}, not a whole number" if re.fullmatch(r"[-+]?[0-9]*\.[0-9]*([eE][-+]?[0-9]+)?",
                                                                          value) else _shown(value))
            raise DseError(f"{where}: {key}: got {what}; {_POSITIVE}")
        out[key] = _positive(int(value), key, where)
    return out


def _positive(v: int, key: str, where: str) -> int:
    if v < 1:
        raise DseError(f"{where}: {key}: got {v}; {_POSITIVE} (pruning keeps at least one)")
    if v > MAX_SIZE:
        raise DseError(f"{where}: {key}: got an integer above 2**40; {_POSITIVE}")
    return v


def _checked(spec, where: str) -> dict[str, int]:
    """A {key: value} pruning checked as parse_prune checks its text; in ``PRUNE_KEYS`` order."""
    if not isinstance(spec, dict):
        raise DseError(f"{where}: got {_shown(spec)}; {_ALLOWED}, or a dict of them")
    out = {}
    for key, v in spec.items():
        if key not in PRUNE_KEYS:
            raise DseError(f"{where}: {_shown(key)}: not a dimension pruning sets; expected one of "
                           f"{', '.join(PRUNE_KEYS)} ({_EXAMPLE})")
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise DseError(f"{where}: {key}: got {_shown(v)}; {_POSITIVE}")
        out[key] = _positive(int(v), key, where)
    return {k: out[k] for k in PRUNE_KEYS if k in out}


def prune_text(spec: dict[str, int]) -> str:
    """``key=value,...`` of a pruning in ``PRUNE_KEYS`` order ('none' for {}): how a pruned
    model's name and source state it, and a text parse_prune reads back."""
    return ",".join(f"{k}={spec[k]}" for k in PRUNE_KEYS if k in spec) or "none"


def prune(model: ModelSpec, spec: dict | str, where: str = "prune") -> ModelSpec:
    """The ModelSpec of ``model`` pruned to the dimensions ``spec`` gives (a dict from
    parse_prune, or its text; the module docstring says what each key sets), frozen and hashable
    like any ModelSpec. Its ``name`` is ``{name}[pruned {key=value,...}]`` and its ``source`` notes
    the transform. {} or 'none' returns ``model`` itself. Raises DseError, one line naming
    ``where`` and the key, for a value above the model's own (pruning never grows a model), a width
    below 1/``MAX_NARROWING`` of it (a degenerate model), heads
    that KV heads do not divide, experts below the top-k, a key the model has no such dimension
    for, or one its attention (MLA) does not support."""
    dims = parse_prune(spec, where) if isinstance(spec, str) else _checked(spec, where)
    if not dims:
        return model
    m = model
    dims = {k: dims[k] for k in PRUNE_KEYS if k in dims}

    def fail(key: str, problem: str) -> DseError:
        return DseError(f"{where}: {key}: {problem}")

    if not m.is_moe:
        for key in ("experts", "moe_intermediate"):
            if key in dims:
                raise fail(key, f"model '{m.name}' has no routed experts (a dense model); "
                           "the keys it takes are layers, hidden, heads, kv_heads, head_dim, intermediate")
    if m.is_mla:
        for key, why in (("kv_heads", "MLA caches a latent per token, not KV heads; prune heads instead"),
                         ("head_dim", "MLA's head size is qk_nope_head_dim + qk_rope_head_dim "
                                      f"({m.qk_nope_head_dim} + {m.qk_rope_head_dim}), which pruning does not change")):
            if key in dims:
                raise fail(key, f"not supported for model '{m.name}' (multi-head latent attention): {why}; "
                           "supported: layers, hidden, heads, intermediate, experts, moe_intermediate")
    one_width = m.is_moe and m.model_type in _ONE_WIDTH_MOE
    if one_width and "intermediate" in dims and "moe_intermediate" in dims \
            and dims["intermediate"] != dims["moe_intermediate"]:
        raise fail("moe_intermediate", f"got {dims['moe_intermediate']}, not intermediate ({dims['intermediate']}); "
                   f"in model '{m.name}' ({m.model_type}) one width serves the MLP and the experts: give one")
    for key, v in dims.items():
        own = getattr(m, _FIELDS[key])
        if v > own:
            raise fail(key, f"got {v}, more than model '{m.name}' has ({own}); pruning never grows a model: "
                       f"expected an integer from 1 to {own}")
        low = -(-own // MAX_NARROWING)
        if key in _WIDTHS and v < low:
            raise fail(key, f"got {v}, a degenerate model: more than {MAX_NARROWING}x narrower than model "
                       f"'{m.name}' ({own}); expected an integer from {low} to {own}")

    layers = dims.get("layers", m.num_layers)
    heads = dims.get("heads", m.num_heads)
    if "kv_heads" in dims:
        kv = dims["kv_heads"]
        if kv > heads or heads % kv:
            raise fail("kv_heads", f"got {kv}, not a divisor of the {heads} attention heads; "
                       "heads must be a multiple of kv_heads")
    elif m.num_kv_heads == m.num_heads:     # MHA (and MLA's nominal KV heads): one per query head
        kv = heads
    else:
        kv = m.num_kv_heads
        if heads % kv:
            raise fail("heads", f"got {heads}, not a multiple of the {kv} KV heads of model '{m.name}'; "
                       "give a multiple of them, or kv_heads too (a divisor of heads)")

    kw: dict = dict(num_layers=layers, hidden_size=dims.get("hidden", m.hidden_size), num_heads=heads,
                    num_kv_heads=kv, head_dim=dims.get("head_dim", m.head_dim))
    inter = dims.get("intermediate", m.intermediate_size)
    moe_inter = dims.get("moe_intermediate", m.moe_intermediate_size)
    if one_width:
        inter = moe_inter = dims.get("intermediate", dims.get("moe_intermediate", m.intermediate_size))
    kw.update(intermediate_size=inter, moe_intermediate_size=moe_inter)

    if m.is_moe:
        experts = dims.get("experts", m.num_experts)
        if experts < m.experts_per_token:
            raise fail("experts", f"got {experts}, fewer than the {m.experts_per_token} experts each token uses "
                       f"(top-k of model '{m.name}'); expected an integer from {m.experts_per_token} to "
                       f"{m.num_experts}")
        kw.update(num_experts=experts, first_dense_layers=min(m.first_dense_layers, layers))
        if m.model_type in _DEEPSEEK and "moe_intermediate" in dims:
            kw.update(shared_expert_intermediate_size=m.num_shared_experts * moe_inter)
        if "intermediate" in dims and not one_width and kw["first_dense_layers"] == 0:
            raise fail("intermediate", f"model '{m.name}' has no dense MLP layer (every layer is an MoE layer"
                       f"{' after depth pruning' if m.first_dense_layers else ''}); moe_intermediate prunes "
                       "the experts' width")

    sliding = tuple(i for i in m.sliding_layers if i < layers)
    kw.update(sliding_layers=sliding, sliding_window=m.sliding_window if sliding else 0)
    if m.is_hybrid:                         # the first ``layers`` layers keep their kinds
        kw.update(layer_mixers=m.layer_mixers[:layers], layer_ffns=m.layer_ffns[:layers])

    text = prune_text(dims)
    kw.update(name=f"{m.name}[pruned {text}]",
              source=f"{m.source or 'its config'}, pruned to {text} (workloads.pruning)")
    return replace(m, **kw)
