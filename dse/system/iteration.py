"""One iteration of an in-flight-batching engine as operator arrays: decode tokens and
prompt chunks priced together, every weight read once (Sarathi-Serve's hybrid batch).

An iteration processes ``d`` decode tokens, one per running sequence past its prompt,
attending to ``dctx`` cached keys in all, and ``c`` prompt tokens of ``s`` sequences,
attending to ``pctx`` keys in all (a prompt token at position j attends to the j before
it). Every element and op count of such an iteration is, per operator,

    base + d x per_decode + dctx x per_key + c x per_prompt_token + pctx x per_pair + s x per_prompt

read off the workload's own operator tables (``workloads.optable``): the decode step at
batch 1 and 2 and at one more key, and the prefill at three prompt lengths. The weight
bytes are what the iteration reads of the weights: most once, but the embedding rows of
its tokens and, for a mixture of experts, the experts its tokens are routed to grow with the
tokens; they are read off decode steps of 1, 2, 4, ... 16,384 tokens (exact there, linear
between). The
iteration's time is the roofline's ``step_time`` of these arrays, so the serving model and
its simulator price an iteration exactly as a static batch's step is priced.

A layer with a sliding window is costed with the window as filled at the prompt's end
(exact from a prompt at least as long as the window).

A vision-language model whose requests carry images (``workloads.encoder``) puts its vision
encoder on the prompt's side: the encoder's operators are zero in a decode step and constant in the
prompt's length, so they land in ``per_prompt`` and run once per request, in the iteration that
finishes its prompt (the serving model and the simulator both price iterations by these arrays, so
they agree). Their weight bytes are left out of an iteration (read under the encoder's compute).

Techniques that change the decode step only (contextual sparsity, early exit:
``workloads.techniques``; prefill runs dense) apply to the decode tokens, as in a static batch's
decode step; the prompt tokens beside them run the dense prefill's operators (its amounts are
read onto the decode step's operators by name: the predictors and exit classifiers the decode
step adds do nothing for a prompt token), and an iteration with prompt tokens reads the dense
weights (every layer, every neuron) that many tokens read.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property, lru_cache

import numpy as np

from dse.core.roofline import OpArrays
from workloads import encoder, optable
from workloads.model import ModelSpec
from workloads.scenario import WORKLOAD_DIMS, Scenario
from workloads.techniques import NONE, Techniques

#: token counts at which a mixture of experts' weight traffic is read off the decode step
WEIGHT_TOKENS = tuple(2**k for k in range(15))

#: the OpArrays fields that count work or traffic (the rest describe the operators)
_AMOUNTS = ("ops", "act_bytes", "kv_bytes", "comm_bytes", "p2p_bytes")


@dataclass(frozen=True)
class IterationModel:
    """Per-operator coefficients of an iteration (arrays [O]; see the module docstring).

    template: the decode step's OpArrays (operator kinds, counts, peak columns, PIM roles);
    base, per_decode, per_key, per_prompt_token, per_pair, per_prompt: {field: [O]};
    weight_tokens [T], weight_bytes [T, O]: weight bytes an iteration of that many tokens
    reads (the decode step's, exact at each of these token counts, linear between them);
    dense_weight_bytes [T, O]: the same without the decode-only techniques, read by an
    iteration that has prompt tokens (None when there are none)."""

    template: OpArrays
    base: dict
    per_decode: dict
    per_key: dict
    per_prompt_token: dict
    per_pair: dict
    per_prompt: dict
    weight_tokens: np.ndarray
    weight_bytes: np.ndarray
    dense_weight_bytes: np.ndarray | None = None
    shared: np.ndarray | None = None       # [O] bool: operators fed by every expert-parallel rank's tokens

    def arrays(self, d, dctx, c, pctx, s) -> OpArrays:
        """OpArrays [P, O] of iterations with ``d`` decode tokens over ``dctx`` keys and ``c``
        prompt tokens of ``s`` sequences over ``pctx`` keys (arrays [P] or scalars)."""
        d, dctx, c, pctx, s = (np.atleast_1d(np.asarray(x, dtype=float)) for x in (d, dctx, c, pctx, s))
        n = max(len(d), len(dctx), len(c), len(pctx), len(s))
        terms = np.empty((n, 6))
        terms[:, 0] = 1.0
        for j, x in enumerate((d, dctx, c, pctx, s), start=1):
            terms[:, j] = x
        amounts = np.maximum(terms @ self._coefficients, 0.0)              # [P, F x O], one product
        o = len(self.weight_bytes[0])
        fields = {f: amounts[:, i * o:(i + 1) * o] for i, f in enumerate(_AMOUNTS)}
        tokens = d + c if len(d) == n and len(c) == n else np.broadcast_to(d + c, (n,))
        weight = np.broadcast_to(self.weight_bytes[0], (n, o)).copy()
        if len(self._growing):              # embedding rows, experts touched
            weight[:, self._growing] = _interp_columns(tokens, self.weight_tokens, self.weight_bytes[:, self._growing])
        if self.dense_weight_bytes is not None:     # prompt tokens run dense: every layer's weights
            prompt = np.broadcast_to(c, (n,)) > 0
            if prompt.any():
                weight[prompt] = _interp_columns(tokens[prompt], self.weight_tokens, self.dense_weight_bytes)
        weight[tokens <= 0] = 0.0
        vector = self.template.vector_ops               # dequantization: once an iteration that has work
        if vector is not None:
            vector = np.where((tokens > 0)[:, None], np.broadcast_to(vector, (n, o)), 0.0)
        return replace(self.template, weight_bytes=weight, vector_ops=vector, **fields)

    def lockstep_arrays(self, d, dctx, c, pctx, s, ranks: int, streams: int = 1) -> OpArrays:
        """OpArrays [P, O] of the busiest rank of an engine of ``streams`` streams of ``ranks``
        attention data-parallel ranks in lock-step (``dse.system.served.group_pricer``) running an
        iteration of ``d`` decode tokens over ``dctx`` keys and ``c`` prompt tokens of ``s``
        prompts over ``pctx`` keys, in all: the decode tokens spread evenly over every rank, each
        prompt on one rank, over as many as there are prompts (at least one, at most all). The
        experts' operators (``shared``: the routed matmuls and their all-to-all, fed by every rank
        of the stream) carry the amounts of the mean rank of that stream; the rest the busiest
        rank's."""
        k = ranks * streams
        s = np.asarray(s, dtype=float)
        busy = np.clip(s, 1.0, k)                                   # ranks that hold a prompt
        own = self.arrays(*busiest_rank_counts(d, dctx, c, pctx, s, k))
        if self.shared is None or not self.shared.any() or ranks == 1:
            return own
        share = np.clip(busy / streams, 1.0, ranks) / (busy * ranks)   # the stream's prompts over its ranks
        mean = self.arrays(np.asarray(d) / k, np.asarray(dctx) / k, np.asarray(c) * share,
                           np.asarray(pctx) * share, s * share)
        return self.fed_by_all(own, mean)

    def fed_by_all(self, own: OpArrays, mean: OpArrays) -> OpArrays:
        """``own`` (a rank's arrays) with the ``shared`` operators' amounts taken from ``mean`` (the
        mean rank's of its expert-parallel group): what a rank runs in lock-step with the others."""
        m = self.shared
        return replace(own, **{f: np.where(m, getattr(mean, f), getattr(own, f)) for f in (*_AMOUNTS, "weight_bytes")})

    @cached_property
    def _coefficients(self) -> np.ndarray:
        """[6, F x O]: the base, per-decode, per-key, per-prompt-token, per-pair and per-prompt
        rows of every amount field side by side."""
        rows = (self.base, self.per_decode, self.per_key, self.per_prompt_token, self.per_pair, self.per_prompt)
        return np.stack([np.concatenate([np.asarray(r[f], float) for f in _AMOUNTS]) for r in rows])

    @cached_property
    def _growing(self) -> np.ndarray:
        """Operators whose weight bytes grow with the iteration's tokens."""
        return np.flatnonzero(np.ptp(self.weight_bytes, axis=0))


def _interp_columns(x, xp, fp) -> np.ndarray:
    """[n, K]: ``np.interp(x, xp, fp[:, k])`` for every column k of ``fp`` [T, K] at once, by numpy's
    own arithmetic (the segment's slope times the distance from its left knot, plus its left value;
    the end values outside ``xp``), so the results are numpy's to the bit."""
    x = np.asarray(x, dtype=float)
    j = np.clip(np.searchsorted(xp, x, side="right") - 1, 0, len(xp) - 2)
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = (fp[1:] - fp[:-1]) / (xp[1:] - xp[:-1])[:, None]
        out = slope[j] * (x - xp[j])[:, None] + fp[j]
    out = np.where((x < xp[0])[:, None], fp[0], out)
    return np.where((x >= xp[-1])[:, None], fp[-1], out)


def busiest_rank_counts(d, dctx, c, pctx, s, ranks: int) -> tuple:
    """(decode tokens, their keys, prompt tokens, their keys, prompts) of the busiest of ``ranks``
    ranks sharing an iteration of these counts in all: the decode tokens spread evenly, each prompt
    on one rank, over as many ranks as there are prompts (at least one, at most all)."""
    s = np.asarray(s, dtype=float)
    busy = np.clip(s, 1.0, ranks)
    return (np.asarray(d) / ranks, np.asarray(dctx) / ranks, np.asarray(c) / busy, np.asarray(pctx) / busy,
            s / busy)


def _amounts(a: OpArrays) -> dict:
    return {f: np.asarray(getattr(a, f), dtype=float) for f in _AMOUNTS}


def _onto(a: OpArrays, names: list[str], into: list[str]) -> dict:
    """The amounts of ``a`` (operators ``names``) on the operators ``into``: zero for an operator
    ``a`` lacks; ValueError naming an operator of ``a`` that ``into`` lacks."""
    got = _amounts(a)
    where = {name: i for i, name in enumerate(into)}
    missing = [name for name in names if name not in where]
    if missing:
        raise ValueError(f"iteration model: the prefill's operator {missing[0]!r} has no decode counterpart")
    at = np.array([where[name] for name in names], dtype=int)
    out = {}
    for f, v in got.items():
        out[f] = np.zeros(len(into))
        out[f][at] = v
    return out


def _fit_points(prompt_len: int) -> tuple[int, int, int]:
    """Three distinct prompt lengths to read the prefill's coefficients from, the longest the prompt."""
    p = max(int(prompt_len), 3)
    pts = sorted({p, max(p // 2, 2), max(p // 4, 1)})
    while len(pts) < 3:
        pts = sorted(set(pts) | {pts[0] + len(pts)})
    return tuple(pts[-3:])


@lru_cache(maxsize=1024)
def iteration_model(model: ModelSpec, prompt_len: int, weights: str, activations: str, kv: str, tp: int,
                    flash_attention: bool, buffer: float, techniques: Techniques = NONE, pp: int = 1,
                    ep: int = 1, cp: int = 1) -> IterationModel:
    """The IterationModel of ``model`` on ``tp`` devices with these formats, read off the
    operator tables at the prompt length ``prompt_len`` (tokens); DseError when the layout does
    not divide the model. With ``pp`` stages the iteration is one micro-batch's pass through the
    whole pipeline (every stage's operators on one tp group, and the ``pp - 1`` hops between
    them); with ``ep`` it is one attention data-parallel rank's: its own tokens through attention,
    the experts of its 1 / ep share fed by the tokens of all ``ep`` ranks (``workloads.optable``); with
    ``cp`` one context-parallel rank's: an iteration's prompt tokens split over the cp ranks (ring
    attention), its decode attending its 1/cp shard of each sequence's KV (``workloads.context_parallel``)."""
    sc = Scenario.make(batch=1, prompt_len=prompt_len, gen_len=1, weights=weights, activations=activations, kv=kv,
                       tp=tp, pp=pp, ep=ep, flash_attention=flash_attention, techniques=techniques, cp=cp)
    keys = prompt_len + 1
    # a VLM's encoder operators: zero in a decode step, per prompt in the prefill (``workloads.encoder``)
    images = encoder.prefill(model, sc, buffer)
    t1 = encoder.zeroed(optable.decode_step(model, sc, keys, buffer), images)
    d1 = OpArrays.from_table(t1)
    d2 = OpArrays.from_table(encoder.zeroed(optable.decode_step(model, replace(sc, batch=2), keys, buffer), images))
    dk = OpArrays.from_table(encoder.zeroed(optable.decode_step(model, sc, keys + 1, buffer), images))
    one, two, more = _amounts(d1), _amounts(d2), _amounts(dk)
    per_key = {f: more[f] - one[f] for f in _AMOUNTS}
    per_seq = {f: two[f] - one[f] for f in _AMOUNTS}
    per_decode = {f: per_seq[f] - keys * per_key[f] for f in _AMOUNTS}
    base = {f: one[f] - per_seq[f] for f in _AMOUNTS}
    # prefill(p) - base = s + p x per_prompt_token + p(p - 1)/2 x per_pair, at three lengths
    pts = _fit_points(prompt_len)
    pre = []
    for p in pts:
        table = encoder.prefill(model, replace(sc, prompt_len=p), buffer)
        pre.append(_onto(OpArrays.from_table(table), table.names, t1.names))
    lhs = np.array([[1.0, p, p * (p - 1) / 2.0] for p in pts])
    inv = np.linalg.inv(lhs)
    coef = {f: inv @ np.stack([pre[j][f] - base[f] for j in range(3)]) for f in _AMOUNTS}
    grid = WEIGHT_TOKENS
    weight = _weight_grid(model, sc, keys, buffer, t1.names)
    dense = None
    if techniques.activation_density < 1.0 or techniques.layers_used < 1.0:
        dense_tech = replace(techniques, activation_density=1.0, layers_used=1.0)
        dense = _weight_grid(model, replace(sc, techniques=dense_tech), keys, buffer, t1.names)
    shared = np.array([n.startswith("expert_") or n in ("moe_dispatch", "moe_combine") for n in t1.names]) \
        if ep > 1 else None
    return IterationModel(d1, base, per_decode, per_key, {f: coef[f][1] for f in _AMOUNTS},
                          {f: coef[f][2] for f in _AMOUNTS}, {f: coef[f][0] for f in _AMOUNTS},
                          np.asarray(grid, dtype=float), weight, dense, shared)


def _weight_grid(model: ModelSpec, sc: Scenario, keys: int, buffer: float, into: list[str]) -> np.ndarray:
    """[T, O]: the weight bytes a decode step of ``sc`` reads at each of ``WEIGHT_TOKENS`` tokens,
    on the operators ``into`` (zero for one the step lacks)."""
    tokens = np.asarray(WEIGHT_TOKENS, dtype=np.int64)      # one table of as many workloads, one a token count
    many = replace(sc, **{k: (tokens if k == "batch" else np.full(len(tokens), getattr(sc, k), dtype=np.int64))
                          for k in WORKLOAD_DIMS})
    table = optable.decode_step(model, many, keys, buffer)
    where = {name: i for i, name in enumerate(into)}
    grid = np.zeros((len(tokens), len(into)))
    grid[:, [where[name] for name in table.names]] = np.asarray(table.weight_bytes, float)   # (its OpArrays' own)
    return grid
