"""Technique columns -> what each design point runs: its Techniques (``workloads.techniques``), its
pruned model (``workloads.pruning``) and its speculative-decoding draft.

Columns (defaults change nothing):

- ``sparsity`` (``none`` | ``N:M``), ``weight_density`` (unstructured, (0, 1]),
  ``activation_sparsity`` (Deja Vu: the fraction of MLP neurons and attention heads *active* per
  token, (0, 1]), ``layers_used`` (early exit: the mean fraction of layers a token runs, (0, 1]),
  ``kv_budget`` (tokens of K and V kept per sequence and layer, 0: all). ``sparse: true`` (the
  older switch) is ``sparsity: 2:4``.
- ``weights_edge``: the format of the first and the last layer's weights (``none``: the weights format).
- ``prune``: ``none`` or ``layers=..,heads=..,kv_heads=..,intermediate=..,hidden=..``: the model
  with those dimensions, costed like any other.
- ``spec_draft`` (``none``, a model name or config path, ``self:N``: the target's first N layers, or
  ``medusa:N``: N Medusa heads drafting N tokens in one pass, ``spec_tokens`` then the candidate
  tokens verified, a tree at least N wide; ``mtp:N``: the model's N chained MTP modules, and
  ``eagle``: an EAGLE head, each a one-layer draft at the target's layout sharing its embedding and
  LM head, ``workloads.model.draft_head_model``; these two may end in ``@a1,a2,...``, the acceptance
  by depth, replacing ``spec_acceptance``),
  ``spec_tokens`` (tokens drafted per step, g; ignored without a draft, so a grid may cross both)
  and ``spec_acceptance`` (per-token acceptance rate, a in [0, 1]): decoding runs rounds of g draft
  steps and one target step verifying g + 1 tokens, each round yielding (1 - a^(g+1)) / (1 - a)
  tokens; in a static batch, and under continuous batching (all but Medusa heads) where every
  running sequence gains that many tokens an iteration. A draft model of its
  own runs at tensor parallelism 1 on one of the target's devices, its weights and KV cache beside
  the target's there; a self-speculating draft shares the target's weights and KV cache (LayerSkip:
  Elhoushi et al., "LayerSkip: Enabling Early Exit Inference and Self-Speculative Decoding", ACL
  2024, Sec. 4).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from basis.errors import DseError
from dse.system.columns import Columns, anywhere, group, per_code, pointwise
from dse.system.moe import ROUTING_COLUMNS, routing_columns
from dse.system.params import DEFAULTS, MAX_SPEC_TOKENS
from dse.system.workload import resolve_model
from hwmodels.formats import get_format
from workloads.model import ModelSpec, draft_head_model
from workloads.pruning import parse_prune, prune
from workloads.quality import quality_loss
from workloads.techniques import Techniques, parse_sparsity, sparsity_text

#: columns that set a point's Techniques
TECHNIQUE_COLUMNS = ("sparse", "sparsity", "weight_density", "activation_sparsity", "layers_used", "kv_budget",
                     "spec_tokens", "spec_draft", "weights_edge", "sequence_parallel", *ROUTING_COLUMNS)


@dataclass(frozen=True)
class Draft:
    """A speculative-decoding draft: a model of its own (``model``), the target's first ``layers``
    layers (self-speculation, weights and KV cache shared), or ``heads`` Medusa heads on the
    target's last hidden state (all drafted in one pass; ``spec_tokens`` is then the width of the
    candidate tree verified, at least the heads)."""

    name: str
    model: ModelSpec | None = None
    layers: int = 0
    heads: int = 0
    kind: str = ""              # a native draft head of the target: 'mtp' or 'eagle' (``draft_head_model``)
    depth: int = 0              # mtp:N: the chained MTP modules, one token each
    by_depth: tuple = ()        # acceptance by depth (a_1, a_2, ...), replacing spec_acceptance where given

    @property
    def shares_target(self) -> bool:
        return self.model is None


#: what ``spec_draft`` takes
_DRAFTS = ("'none', a model name or config.json, 'self:N', 'medusa:N', 'mtp:N' or 'eagle' (N from 1; "
           "mtp, eagle: @a1,a2,... acceptance by depth)")


def _by_depth(text: str, whole: str) -> tuple:
    """The acceptance by depth of '@a1,a2,...' (each in [0, 1]); DseError naming what is allowed."""
    try:
        rates = tuple(float(x) for x in text.split(","))
    except ValueError:
        rates = ()
    if not rates or len(rates) > MAX_SPEC_TOKENS or not all(0.0 <= a <= 1.0 for a in rates):
        raise DseError(f"spec_draft: {whole if len(whole) <= 40 else whole[:39] + '…'!r}: after '@' give the "
                       "acceptance by depth, numbers from 0 to 1 separated by commas (e.g. mtp:2@0.85,0.7)")
    return rates


def _native_head(text: str) -> Draft | None:
    """The Draft of 'mtp:N[@a1,...]' or 'eagle[@a1,...]', None for any other text."""
    low = text.lower()
    head, _, rates = low.partition("@")
    if head != "eagle" and not head.startswith("mtp:"):
        return None
    by_depth = _by_depth(rates, text) if "@" in low else ()
    if head == "eagle":
        return Draft(low, kind="eagle", by_depth=by_depth)
    n = head[4:]
    if not (n.isascii() and n.isdigit() and len(n) <= 12) or not 1 <= int(n) <= MAX_SPEC_TOKENS:
        raise DseError(f"spec_draft: 'mtp:N' takes N, the chained MTP modules, from 1 to {MAX_SPEC_TOKENS:,}, got "
                       f"{text if len(text) <= 40 else text[:39] + '…'!r}")
    if by_depth and len(by_depth) != int(n):
        raise DseError(f"spec_draft: {text!r}: mtp:{int(n)} drafts {int(n)} tokens; give {int(n)} acceptance rates "
                       f"after '@', got {len(by_depth)}")
    return Draft(low, kind="mtp", depth=int(n), by_depth=by_depth)


def parse_draft(value) -> Draft | None:
    """The Draft a ``spec_draft`` value names (None for ``none``); DseError naming what is allowed."""
    text = str(value).strip()
    if text.lower() == "none":
        return None
    if not text:
        raise DseError(f"spec_draft: got an empty text; expected {_DRAFTS}")
    native = _native_head(text)
    if native is not None:
        return native
    for kind, what in (("self", "the target's first N layers as the draft"), ("medusa", "N Medusa heads")):
        if text.lower().startswith(kind + ":"):
            n = text.split(":", 1)[1]
            # ASCII digits, a few of them: int() reads '١', fails on '²' and on thousands of digits
            if not (n.isascii() and n.isdigit() and len(n) <= 12) or int(n) < 1:
                raise DseError(f"spec_draft: '{kind}:N' takes N, {what} (a positive integer), got "
                               f"{text if len(text) <= 40 else text[:39] + '…'!r}")
            if kind == "medusa" and int(n) > MAX_SPEC_TOKENS:       # each head drafts a token: spec_tokens' bound
                raise DseError(f"spec_draft: 'medusa:N' takes N, {what}, from 1 to {MAX_SPEC_TOKENS:,} (the most "
                               f"tokens spec_tokens verifies), got {int(n):,}")
            return Draft(text.lower(), **({"layers": int(n)} if kind == "self" else {"heads": int(n)}))
    return Draft(text, model=resolve_model(text))


def draft_model(draft: Draft, target: ModelSpec) -> ModelSpec:
    """The model a draft runs: its own, a native draft head's one pass (``draft_head_model``), or the
    target's first ``layers`` layers."""
    if draft.model is not None:
        return draft.model
    if draft.kind:
        return draft_head_model(target, draft.kind)
    if draft.layers >= target.num_layers:
        raise DseError(f"spec_draft: {draft.name} takes {draft.layers} of the target's {target.num_layers} layers; "
                       f"a self-speculating draft must use fewer")
    return prune(target, {"layers": draft.layers}, "spec_draft")


def pruned_models(cols: Columns, codes: np.ndarray, models: list) -> tuple[np.ndarray, list]:
    """(code per point, model of each code) with the ``prune`` column applied to the models."""
    if not cols.has("prune"):
        return codes, models
    pcodes, specs = cols.labels("prune")
    try:
        parsed = [parse_prune(s, "prune") for s in specs]
    except DseError as e:
        raise DseError(f"{cols.where}: {e}") from None
    inv, order, starts = group([codes, pcodes], cols.n)
    out = []
    for g in range(len(starts) - 1):
        i = int(order[starts[g]])
        spec = parsed[pcodes[i]]
        try:
            out.append(prune(models[codes[i]], spec, "prune") if spec else models[codes[i]])
        except DseError as e:
            raise DseError(f"{cols.where}: {e}") from None
    return inv, out


def technique_columns(cols: Columns, w: dict) -> None:
    """Fill ``w`` (the evaluator's workload arrays) with each point's Techniques (``tech``: code,
    ``techniques``: values), whether its N:M sparsity may use 2:4 sparse units (``sparse_units``),
    and its draft (``draft`` code, ``drafts``), ``spec_tokens`` and ``spec_acceptance``."""
    scodes, svalues = cols.labels("sparsity")
    try:
        pairs = [parse_sparsity(v) for v in svalues]
    except DseError as e:
        raise DseError(f"{cols.where}: {e}") from None
    dense = per_code([p == () for p in pairs], scodes)
    other = per_code([p not in ((), (2, 4)) for p in pairs], scodes)     # N:M that is not 2:4
    legacy = cols.flags("sparse")
    clash = pointwise(lambda on, o: on & o, legacy, other)
    if anywhere(clash):
        k = 0 if np.ndim(clash) == 0 else int(np.flatnonzero(clash)[0])
        raise DseError(f"{cols.where}: sparse and sparsity: sparse is sparsity 2:4, and sparsity asks "
                       f"{sparsity_text(pairs[scodes[k]])} at the same point; give one of them (sparsity N:M alone)")
    pairs = pairs + [(2, 4)]                    # sparse: true (the older switch) is 2:4
    sparsity = pointwise(lambda on, d, c: np.where(on & d, len(pairs) - 1, c), legacy, dense, scodes)
    w["draft"], w["drafts"] = _drafts(cols)
    w["spec_tokens"] = cols.numbers("spec_tokens")
    w["spec_acceptance"] = cols.numbers("spec_acceptance")
    has_draft = per_code([d is not None for d in w["drafts"]], w["draft"])
    # set to other than their defaults (0: no speculation), as a table of every parameter gives them
    given = [k for k in ("spec_tokens", "spec_acceptance") if cols.has(k) and np.any(np.asarray(w[k]) != DEFAULTS[k])]
    if given and not anywhere(has_draft):     # a grid may cross them with drafts; with none they do nothing
        raise DseError(f"{cols.where}: {' and '.join(given)}: describe speculative decoding, and no point has a draft; "
                       f"give spec_draft too (a model, or self:N), or leave {' and '.join(given)} out")
    if anywhere(pointwise(lambda d, t: d & ~(t > 0), has_draft, w["spec_tokens"])):
        raise DseError(f"{cols.where}: spec_draft and spec_tokens: a draft (spec_draft) needs the tokens it drafts "
                       f"per step (spec_tokens >= 1)")
    heads = per_code([(d.heads or d.depth) if d is not None else 0 for d in w["drafts"]], w["draft"])
    if anywhere(pointwise(lambda t, h: t < h, w["spec_tokens"], heads)):
        k = int(np.flatnonzero(w["spec_tokens"] < heads)[0])
        raise DseError(f"{cols.where}: spec_tokens: {w['drafts'][w['draft'][k]].name} drafts {int(heads[k])} tokens a "
                       f"step; the tree it verifies (spec_tokens) must hold at least as many, got "
                       f"{int(w['spec_tokens'][k])}")
    numbers = {k: cols.numbers(k) for k in ("weight_density", "activation_sparsity", "layers_used", "kv_budget")}
    query = pointwise(lambda d, t: np.where(d, t + 1, 1), has_draft, w["spec_tokens"])
    ecodes, evalues = cols.labels("weights_edge")
    try:
        edge = per_code([0.0 if str(v).strip().lower() == "none" else get_format(str(v), "weights_edge format").bits
                         for v in evalues], ecodes)
    except DseError as e:
        raise DseError(f"{cols.where}: weights_edge: {e}") from None
    rcodes, routings = routing_columns(cols)
    seq = np.broadcast_to(np.asarray(cols.flags("sequence_parallel"), dtype=bool), (cols.n,))
    keys = [sparsity, *numbers.values(), query, edge, rcodes, seq]
    inv, order, starts = group(keys, cols.n)
    techniques = []
    for g in range(len(starts) - 1):
        i = int(order[starts[g]])
        try:
            techniques.append(Techniques(
                sparsity=pairs[sparsity[i]], weight_density=float(numbers["weight_density"][i]),
                activation_density=float(numbers["activation_sparsity"][i]),
                layers_used=float(numbers["layers_used"][i]), kv_budget=int(numbers["kv_budget"][i]),
                query_tokens=int(query[i]), edge_bits=float(edge[i]), routing=routings[rcodes[i]],
                sequence_parallel=bool(seq[i])))
        except DseError as e:
            raise DseError(f"{cols.where}: {e}") from None
    w["tech"], w["techniques"] = inv, techniques
    w["sparse_units"] = per_code([t.sparsity == (2, 4) for t in techniques], inv)


def _drafts(cols: Columns) -> tuple[np.ndarray, list]:
    codes, values = cols.labels("spec_draft")
    try:
        return codes, [parse_draft(v) for v in values]
    except DseError as e:
        said = str(e)
        raise DseError(f"{cols.where}: {said}" if said.startswith("spec_draft") else
                       f"{cols.where}: spec_draft: {said}") from None


def settings_text(point: dict) -> dict[str, str]:
    """The techniques a design point runs (its ``Evaluation.point``), {column: words}, those left
    at their defaults out."""
    out = {}
    pair = parse_sparsity(point.get("sparsity", "none"))
    if pair or point.get("sparse"):
        out["sparsity"] = f"{sparsity_text(pair or (2, 4))} sparse weights"
    words = {"weight_density": "weights kept {:.0%}", "activation_sparsity": "{:.0%} of neurons and heads active",
             "layers_used": "{:.0%} of layers used", "kv_budget": "KV budget {:g} tokens"}
    for key, text in words.items():
        v = point.get(key, DEFAULTS[key])
        if v != DEFAULTS[key]:
            out[key] = text.format(float(v))
    if point.get("sequence_parallel"):
        out["sequence_parallel"] = "sequence-parallel activations (norms and adds on 1/tp of the tokens)"
    if str(point.get("weights_edge", "none")) != "none":
        out["weights_edge"] = f"first and last layers' weights {point['weights_edge']}"
    if str(point.get("prune", "none")) != "none":
        out["prune"] = f"pruned {point['prune']}"
    if str(point.get("spec_draft", "none")) != "none":
        by_depth = "@" in str(point["spec_draft"])       # a native head's acceptance by depth, in its name
        out["spec_draft"] = (f"speculative decoding: draft {point['spec_draft']}, {int(point.get('spec_tokens', 0))} "
                             f"tokens a step" + ("" if by_depth else
                                                 f", acceptance {float(point.get('spec_acceptance', 0.0)):g}"))
    return out


#: the source of a point's quality_loss when nothing is published for its model and setting
UNPUBLISHED = "none published for this model and setting (configs/quality.yaml): left empty"


def quality_columns(cols: Columns, base_codes: np.ndarray, base_models: list, w: dict) -> None:
    """Fill ``w`` with each point's ``quality_loss`` (the relative WikiText-2 perplexity increase
    published for its model and settings, ``workloads.quality``; NaN where none is) and the source
    of each value (``quality_source`` codes into ``quality_sources``). Speculative decoding
    verifies every token and does not change the output; the layout, batch and engine do not
    enter."""
    names = {k: w[k + "_names"] for k in ("weights", "activations", "kv")}
    setting_codes = [w[k] for k in ("weights", "activations", "kv")]
    texts = {}
    for k in ("sparsity", "prune"):
        codes, values = cols.labels(k)
        texts[k] = values
        setting_codes.append(codes)
    numbers = {k: cols.numbers(k) for k in ("weight_density", "activation_sparsity", "kv_budget", "layers_used")}
    legacy = cols.flags("sparse")
    edge_codes, edges = cols.labels("weights_edge")
    inv, order, starts = group([base_codes, *setting_codes, *numbers.values(), legacy, edge_codes], cols.n)
    loss = np.full(len(starts) - 1, np.nan)
    sources = [UNPUBLISHED]
    source = np.zeros(len(starts) - 1, dtype=np.int64)
    for g in range(len(starts) - 1):
        i = int(order[starts[g]])
        sparsity = sparsity_text(parse_sparsity(texts["sparsity"][setting_codes[3][i]]) or
                                 ((2, 4) if legacy[i] else ()))
        setting = {k: str(names[k][w[k][i]]) for k in names}
        setting.update(sparsity=sparsity, prune=str(texts["prune"][setting_codes[4][i]]),
                       **{k: float(v[i]) for k, v in numbers.items()})
        setting["kv_budget"] = int(setting["kv_budget"])
        if str(edges[edge_codes[i]]).strip().lower() != "none":      # no published figure is by layer
            value, cited = float("nan"), ""
        else:
            value, cited = quality_loss(base_models[base_codes[i]].name, **setting)
        loss[g] = value
        cited = cited or UNPUBLISHED
        if cited not in sources:
            sources.append(cited)
        source[g] = sources.index(cited)
    w["quality_loss"], w["quality_source"], w["quality_sources"] = per_code(loss, inv), per_code(source, inv), sources
