"""MoE routing: how a step's routed tokens spread over the experts and the expert-parallel ranks.

``Routing`` says where the tokens go; ``expert_load`` turns it into what the operator tables need
for a model with E routed experts, top-k routing and ``ep`` ranks (``ExpertLoad``).

- **Popularity.** Each expert's share of the routed token-slots, in expert-id order: uniform
  (skew 0), a Zipf power law p_i proportional to i^-s over the expert ids (expert 0 the hottest:
  with contiguous placement the adversarial ordering, every hot expert on rank 0), or a measured
  histogram of tokens per expert (per layer, optional: ``load_histogram``).
- **Selection probabilities.** A token picks k distinct experts, so expert i is chosen by a token
  with probability pi_i <= 1, sum pi_i = k. From the shares p: pi_i = min(1, c p_i), c such that
  the sum is k (water-filling; pi = k p where no expert saturates).
- **Capacity factor** c_f (0: none): an expert takes at most c_f x (mean tokens per expert); the
  rest are dropped (GShard: Lepikhin et al., "GShard", ICLR 2021, Sec. 2.2, "expert capacity").
  Expected over the popularity: dropped share = sum_i max(0, pi_i / k - c_f / E).
- **Placement.** Without redundant experts the E experts sit contiguously, E/ep per rank (how the
  engines place them by default). With r redundant experts (DeepSeek's EPLB, github.com/deepseek-ai/
  EPLB, README: "duplicate heavy-loaded experts" then "heuristically pack the duplicated experts to
  GPUs"): each of r extra replicas goes in turn to the expert with the highest load per replica, a
  replica taking an equal part of its expert's load; then the E + r physical experts are packed, the
  heaviest first, each onto the least loaded rank with a free slot, (E + r)/ep slots per rank.
- **Imbalance.** The step waits for the busiest rank (most routed tokens) of each layer: the
  imbalance factor is its load over the mean rank load, averaged over layers (the expert time of a
  layer is proportional to its busiest rank's tokens). This is the **popularity-only** factor: the
  expected loads, without the extra spread a finite batch of T tokens adds by chance (the expected
  maximum of a multinomial has no closed form). ``finite`` (opt-in, ``expert_load: finite``) adds it
  by an approximation (``finite_busiest``): rank g's count of the T_total k routed token-slots has mean
  mu_g = T_total k q_g (q_g its share) and, each token picking k distinct of the E + r physical
  experts, the variance of a hypergeometric draw summed over independent tokens, sigma_g^2 = T_total
  k q_g (1 - q_g)(E + r - k)/(E + r - 1); the counts taken as independent normals, the busiest
  rank's expected count is the expected maximum of those normals, integral of 1 - prod_g Phi((x -
  mu_g)/sigma_g) (numerical quadrature, exact for the normals under skew too), capped at T_total
  min(k, (E + r)/ep), the most a rank can receive. (The simpler mean + sigma sqrt(2 ln ep), the
  Gaussian bound on balls into bins, Raab & Steger, RANDOM 1998, Thm. 1, runs 6-24 % high over the
  test's uniform cases and far higher under skew, where one hot rank decides the maximum.) Against a Monte-Carlo of
  top-k picks (tests/test_parallel_agreement_moe.py) it is within 5 % from Mixtral's 1 token on
  2 ranks (1.37 against 1.42 token-slots; mean 1) to DeepSeek-V3's 1,024 tokens on 32, and tends to
  the popularity-only load as T grows. Under uniform routing below 8 slots a rank on average the
  busiest rank comes from the exact per-rank count law instead (``_uniform_small_busiest``). The weights a rank reads are the
  distinct experts (replicas) its tokens touch, expected sum over its replicas of
  1 - (1 - pi_i / n_i)^T_total for T_total tokens over every rank (independent tokens;
  E/ep (1 - (1 - k/E)^T_total) when uniform); the step reads the most any rank reads. Under skew a
  cold rank may read more experts than the busiest computes with: taking both maxima bounds the
  slowest rank's roofline time from above, and equals it when one rank has both.

Every function here is pure; loops run over experts or replicas, never over design points.
"""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from basis.errors import DseError

#: the most rows an expert histogram file may hold (layers x experts): far above any shipped model's
#: (DeepSeek-V3: 58 MoE layers x 256 experts)
MAX_HISTOGRAM_ROWS = 1 << 20


@dataclass(frozen=True)
class Routing:
    """Where a MoE step's routed tokens go (module docstring): ``skew`` the Zipf exponent s >= 0 of
    the experts' popularity (0: uniform), ``redundant`` the extra expert replicas (EPLB), ``capacity``
    the capacity factor (0: no dropping), ``histogram`` measured tokens per expert, one tuple per layer
    (() none; then ``skew`` is 0), ``source`` the file it came from (for messages), ``finite`` whether
    the busiest rank's load adds the chance spread of a finite batch (``finite_busiest``)."""

    skew: float = 0.0
    redundant: int = 0
    capacity: float = 0.0
    histogram: tuple = ()
    source: str = ""
    finite: bool = False

    def __post_init__(self):
        if not (math.isfinite(self.skew) and self.skew >= 0):
            raise DseError(f"moe_skew: expected a finite number >= 0, got {self.skew!r}")
        if isinstance(self.redundant, bool) or not isinstance(self.redundant, int) or self.redundant < 0:
            raise DseError(f"redundant_experts: expected a non-negative integer, got {self.redundant!r}")
        if not (math.isfinite(self.capacity) and self.capacity >= 0):
            raise DseError(f"capacity_factor: expected a finite number > 0, or 0 for none, got {self.capacity!r}")
        if self.histogram and self.skew:
            raise DseError(f"moe_skew and expert_histogram: two popularities of the experts ({self.source}); "
                           f"give one of them")

    @property
    def uniform(self) -> bool:
        """True when the routing is the uniform expectation with nothing dropped, replicated or skewed:
        the operator tables are then priced as without routing (bit for bit)."""
        return self.skew == 0 and not self.histogram and self.redundant == 0 and not self.finite and \
            (self.capacity == 0 or self.capacity >= 1)


UNIFORM = Routing()


@dataclass(frozen=True)
class ExpertLoad:
    """How the routed tokens of a MoE layer land on the ranks (``expert_load``); shares are of the
    routed token-slots of a step (T_total k), averaged over layers where the popularity is per layer.

    ``imbalance``: the busiest rank's kept tokens over the mean rank's (>= 1). ``dropped``: the share
    of routed token-slots over capacity. ``busiest``: the busiest rank's share of all routed
    token-slots (kept), so its tokens are T_total k ``busiest``. ``picks`` [L, ep, (E + r)/ep]: the
    probability one token picks each replica, by layer and rank. ``shares`` [L, ep]: each rank's share
    of the routed token-slots (kept). ``top_k``: the experts a token picks."""

    imbalance: float
    dropped: float
    busiest: float
    picks: np.ndarray
    shares: np.ndarray = None
    top_k: int = 1

    def busiest_tokens(self, tokens, finite: bool = False):
        """Routed token-slots the busiest rank runs when ``tokens`` tokens (a number or an array, over
        every rank) are routed: T k ``busiest`` (the popularity-only expectation) or, ``finite``, the
        expected maximum of the finite batch's counts (``finite_busiest``), averaged over layers."""
        t = np.asarray(tokens, dtype=float)
        if not finite:
            out = t * self.top_k * self.busiest
        else:
            slots = self.picks.shape[1] * self.picks.shape[2]
            out = np.mean([finite_busiest(t, row, self.top_k, slots) for row in self.shares], axis=0)
        return float(out) if np.ndim(out) == 0 else out

    def experts_touched(self, tokens):
        """Expected distinct experts (replicas) the rank that reads the most reads when ``tokens`` tokens
        (a number or an array, over every rank) are routed, averaged over layers: the most over the ranks
        of the sum over a rank's replicas of 1 - (1 - q)^tokens."""
        t = np.asarray(tokens, dtype=float)
        total = 0.0
        for row in self.picks:                       # a loop over layers, each over the points at once
            total = total + (1.0 - (1.0 - row) ** t[..., None, None]).sum(axis=-1).max(axis=-1)
        out = total / len(self.picks)
        return float(out) if np.ndim(out) == 0 else out


#: quadrature nodes of the expected maximum of independent normal counts (``finite_busiest``)
MAX_NODES = 257


def finite_busiest(tokens, shares: np.ndarray, top_k: int, physical: int):
    """Expected routed token-slots of the busiest of the ranks whose shares of the slots are ``shares``
    [G] when ``tokens`` tokens (a number or an array) each pick ``top_k`` distinct of ``physical``
    experts (replicas included): the expected maximum of independent normal counts N(mu_g, sigma_g^2),
    lo + integral from lo of (1 - prod_g Phi((x - mu_g)/sigma_g)) dx (trapezoids from lo = max mu - 8
    max sigma to max (mu + 8 sigma)), capped at tokens x min(k, physical/G) (module docstring, Imbalance)."""
    t = np.asarray(tokens, dtype=float)[..., None]
    q = np.asarray(shares, dtype=float)
    G, k = len(q), top_k
    mu = t * k * q                                                    # [..., G]
    shrink = (physical - k) / (physical - 1) if physical > 1 else 0.0
    sigma = np.sqrt(t * k * q * (1.0 - q) * shrink)
    spread = sigma.max(axis=-1)
    lo = mu.max(axis=-1) - 8.0 * spread
    hi = (mu + 8.0 * sigma).max(axis=-1)
    x = lo[..., None] + (hi - lo)[..., None] * np.linspace(0.0, 1.0, MAX_NODES)          # [..., N]
    with np.errstate(divide="ignore", invalid="ignore"):
        z = (x[..., None, :] - mu[..., None]) / sigma[..., None]                           # [..., G, N]
    z = np.where(sigma[..., None] > 0, z, np.where(x[..., None, :] >= mu[..., None], np.inf, -np.inf))
    from scipy.special import ndtr  # scipy on first use (a finite expert load): importing dse stays light
    below = np.prod(ndtr(z), axis=-2)                                                       # P(max <= x)
    dx = (hi - lo) / (MAX_NODES - 1)
    tail = 1.0 - below
    most = lo + dx * (tail.sum(axis=-1) - 0.5 * (tail[..., 0] + tail[..., -1]))
    normal = np.minimum(np.maximum(most, mu.max(axis=-1)), t[..., 0] * min(k, physical // G))
    exact = _uniform_small_busiest(t[..., 0], q, k, physical)
    return np.where(np.isnan(exact), normal, exact)


#: below this mean count a rank (T k / G) the uniform busiest rank is taken from the exact count law
EXACT_BELOW_MEAN = 8.0
#: the most token-slots a rank's exact count law is convolved up to
EXACT_SLOT_CAP = 4096


def _uniform_small_busiest(tokens, shares: np.ndarray, top_k: int, physical: int):
    """Expected routed token-slots of the busiest of G ranks of equal shares (uniform routing, physical/G
    replicas each) for integer ``tokens`` whose mean a rank T k/G is under ``EXACT_BELOW_MEAN``; nan
    elsewhere (skewed shares, non-integer tokens, larger counts: the normal quadrature). One token's
    count on a rank is hypergeometric (k of ``physical``, physical/G on the rank); tokens independent,
    a rank's count is the T-fold convolution of it (exact). E[max] = sum_m>=1 P(max >= m) with
    P(max < m) = prod_g P(X_g < m), exact for independent ranks, and 0 for m <= ceil(T k / G) (the T k
    slots on G ranks: some rank holds at least that many); the ranks' counts are negatively associated
    (sampling without replacement, Joag-Dev & Proschan, Ann. Stat. 11(1), 1983, sec. 3.2), so P(max < m)
    <= the product and this runs low (a lower bound), by 0-7 % against a Monte-Carlo
    (tests/test_parallel_agreement_moe.py)."""
    t = np.asarray(tokens, dtype=float)
    q = np.asarray(shares, dtype=float)
    G, k = len(q), top_k
    out = np.full(t.shape, np.nan)
    per = physical // G
    if G < 2 or physical % G or not np.allclose(q, 1.0 / G, rtol=1e-9, atol=0) or k > physical:
        return out
    whole = np.round(t)
    small = (np.abs(t - whole) < 1e-9) & (whole >= 1) & (whole * k / G < EXACT_BELOW_MEAN)
    small &= whole * min(k, per) <= EXACT_SLOT_CAP
    if not small.any():
        return out
    from scipy.stats import hypergeom  # scipy on first use, as ndtr above
    one = hypergeom.pmf(np.arange(min(k, per) + 1), physical, per, k)       # one token's count on a rank
    need = int(whole[small].max())
    pmf, most = np.array([1.0]), np.zeros(need + 1)
    for n in range(1, need + 1):                                            # a loop over token counts, not points
        pmf = np.convolve(pmf, one)
        m = np.arange(1, len(pmf))                                           # m = 1 .. n min(k, per)
        below = np.clip(np.cumsum(pmf)[:-1], 0.0, 1.0)                       # P(X_g < m)
        sure = m <= -(-n * k // G)              # the n k slots on G ranks: some rank has >= ceil(n k / G)
        most[n] = np.sum(np.where(sure, 1.0, 1.0 - below ** G))
    out[small] = most[whole[small].astype(int)]
    return out


def zipf_shares(num_experts: int, skew: float) -> np.ndarray:
    """[E] each expert's share of the routed token-slots under a Zipf popularity: i^-s / sum_j j^-s
    for expert ids i = 1 .. E (s = 0: 1/E each)."""
    w = np.arange(1, num_experts + 1, dtype=float) ** -float(skew)
    return w / w.sum()


def selection_probabilities(shares: np.ndarray, top_k: int) -> np.ndarray:
    """[L, E] the probability a token picks each expert, pi = min(1, c p) with sum pi = k per layer
    (water-filling; pi = k p where no k p exceeds 1), from shares ``p`` [L, E] (rows summing to 1).
    DseError when a layer has fewer than k experts with tokens (no k distinct picks)."""
    p = np.asarray(shares, dtype=float)
    if np.any((p > 0).sum(axis=1) < top_k):
        raise DseError(f"expert popularity: a layer has fewer than top_k ({top_k}) experts with tokens")
    order = np.argsort(-p, axis=1, kind="stable")
    s = np.take_along_axis(p, order, axis=1)
    tail = np.cumsum(s[:, ::-1], axis=1)[:, ::-1]       # sum of the sorted shares from m on
    m = np.arange(top_k)                                 # experts saturated (pi = 1): fewer than k
    with np.errstate(divide="ignore", invalid="ignore"):
        c = (top_k - m) / tail[:, :top_k]                # scale of the others with m saturated
        fits = c * s[:, :top_k] <= 1.0 + 1e-12           # the (m+1)-th hottest not saturated
    first = np.argmax(fits, axis=1)
    scale = c[np.arange(len(p)), first]
    pi = np.minimum(1.0, scale[:, None] * p)
    return pi


def replicas(loads: np.ndarray, redundant: int) -> np.ndarray:
    """[L, E] replicas of each expert (>= 1) after ``redundant`` extra ones, each given in turn to
    the expert with the highest load per replica (EPLB; ties to the lowest id)."""
    n = np.ones(loads.shape, dtype=np.int64)
    rows = np.arange(len(loads))
    for _ in range(redundant):
        n[rows, np.argmax(loads / n, axis=1)] += 1
    return n


def packed_ranks(slot_loads: np.ndarray, ranks: int) -> np.ndarray:
    """[L, S] the rank of each replica (S of them a layer, ``slot_loads`` [L, S]) packed onto ``ranks``
    ranks of S/ranks slots each: the heaviest first, each onto the least loaded rank with a free slot."""
    layers, slots = slot_loads.shape
    per = slots // ranks
    order = np.argsort(-slot_loads, axis=1, kind="stable")
    rank_load = np.zeros((layers, ranks))
    used = np.zeros((layers, ranks), dtype=np.int64)
    out = np.empty((layers, slots), dtype=np.int64)
    rows = np.arange(layers)
    for j in range(slots):
        slot = order[:, j]
        r = np.argmin(np.where(used < per, rank_load, np.inf), axis=1)
        out[rows, slot] = r
        rank_load[rows, r] += slot_loads[rows, slot]
        used[rows, r] += 1
    return out


def check_expert_parallel(num_experts: int, redundant: int, ep: int, model: str = "") -> None:
    """DseError unless ``ep`` ranks divide the physical experts, the ``num_experts`` routed experts
    plus the ``redundant`` replicas (each rank holds (E + r)/ep of them: DeepSeek's decode places
    256 + 32 = 288 on 144 GPUs, 2 each, its prefill 9 each on 32; DeepSeek, "Day 6: One More Thing,
    DeepSeek-V3/R1 Inference System Overview", github.com/deepseek-ai/open-infra-index, March 2025)."""
    if (num_experts + redundant) % ep:
        of = f" of model '{model}'" if model else ""
        raise DseError(f"expert parallelism {ep} does not divide num_experts ({num_experts}) + redundant_experts "
                       f"({redundant}) = {num_experts + redundant} physical experts{of}")


def popularity(routing: Routing, num_experts: int, model: str = "") -> np.ndarray:
    """[L, E] each expert's share of the routed token-slots, per layer (L = 1 but for a histogram
    by layer); DseError naming the histogram file when its experts are not the model's."""
    if not routing.histogram:
        return zipf_shares(num_experts, routing.skew)[None, :]
    counts = np.array(routing.histogram, dtype=float)
    if counts.shape[1] != num_experts:
        raise DseError(f"expert_histogram {routing.source}: counts {counts.shape[1]} experts a layer; model "
                       f"'{model}' has {num_experts} routed experts")
    return counts / counts.sum(axis=1, keepdims=True)


@lru_cache(maxsize=256)
def expert_load(routing: Routing, num_experts: int, top_k: int, ep: int, model: str = "") -> ExpertLoad:
    """The ExpertLoad of ``routing`` for E = ``num_experts`` routed experts, top-``top_k`` routing
    and ``ep`` expert-parallel ranks (module docstring). DseError when the experts and their replicas
    do not divide over the ranks, or a histogram's experts are not the model's."""
    E, r = num_experts, routing.redundant
    check_expert_parallel(E, r, ep, model)
    pi = selection_probabilities(popularity(routing, E, model), top_k)      # [L, E]
    share = pi / top_k
    kept = np.minimum(share, routing.capacity / E) if routing.capacity > 0 else share
    dropped = np.maximum(1.0 - kept.sum(axis=1), 0.0) if routing.capacity > 0 else np.zeros(len(pi))   # [L]
    n = replicas(kept, r)
    slot_expert = np.repeat(np.arange(E)[None, :], len(pi), axis=0) if not r else \
        np.stack([np.repeat(np.arange(E), row) for row in n])               # [L, S]
    rows = np.arange(len(pi))[:, None]
    slot_load = kept[rows, slot_expert] / n[rows, slot_expert]
    slot_pick = pi[rows, slot_expert] / n[rows, slot_expert]
    rank = np.repeat(np.arange(ep), (E + r) // ep)[None, :].repeat(len(pi), axis=0) if not r else \
        packed_ranks(slot_load, ep)
    rank_load = np.zeros((len(pi), ep))
    np.add.at(rank_load, (np.broadcast_to(rows, rank.shape), rank), slot_load)
    by_rank = np.argsort(rank, axis=1, kind="stable")                      # every rank holds (E + r)/ep
    picks = np.take_along_axis(slot_pick, by_rank, axis=1).reshape(len(pi), ep, (E + r) // ep)
    busiest = float(rank_load.max(axis=1).mean())
    mean_kept = float((1.0 - dropped).mean())
    return ExpertLoad(imbalance=busiest * ep / mean_kept, dropped=float(dropped.mean()), busiest=busiest,
                      picks=picks, shares=rank_load, top_k=top_k)


def _where(path: str) -> str:
    return f"expert_histogram {path}"


def load_histogram(path: str) -> tuple:
    """The tokens per expert of a CSV file, one tuple per layer (in layer order): a header with columns
    ``expert`` and ``count`` (and ``layer`` where the counts are per layer), then one row per expert
    (of each layer), the experts of a layer numbered 0 .. E-1, each once. DseError in one line naming
    the file and what is wrong (never its content)."""
    where = _where(path)
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            fields = [c.strip().lower() for c in (reader.fieldnames or [])]
            for key in ("expert", "count"):
                if key not in fields:
                    raise DseError(f"{where}: no '{key}' column; expected a header 'expert,count' or "
                                   f"'layer,expert,count'")
            reader.fieldnames = fields
            by_layer: dict[int, dict[int, float]] = {}
            for n, row in enumerate(reader, start=2):
                if n > MAX_HISTOGRAM_ROWS + 1:
                    raise DseError(f"{where}: more than {MAX_HISTOGRAM_ROWS:,} rows")
                layer = _integer(row.get("layer", "0") if "layer" in fields else "0", where, n, "layer")
                expert = _integer(row.get("expert"), where, n, "expert")
                count = _count(row.get("count"), where, n)
                experts = by_layer.setdefault(layer, {})
                if expert in experts:
                    raise DseError(f"{where}: line {n}: expert {expert} of layer {layer} given twice")
                experts[expert] = count
    except OSError as e:
        raise DseError(f"{where}: cannot read it ({e.strerror or type(e).__name__})") from None
    except (UnicodeDecodeError, csv.Error):
        raise DseError(f"{where}: not a CSV text file") from None
    if not by_layer:
        raise DseError(f"{where}: no rows of counts")
    sizes = {len(v) for v in by_layer.values()}
    if len(sizes) != 1:
        raise DseError(f"{where}: the layers count different numbers of experts ({min(sizes)} to {max(sizes)})")
    size = sizes.pop()
    out = []
    for layer in sorted(by_layer):
        experts = by_layer[layer]
        if set(experts) != set(range(size)):
            raise DseError(f"{where}: layer {layer}: experts must be numbered 0 .. {size - 1}, each once")
        counts = tuple(experts[i] for i in range(size))
        if not sum(counts) > 0:
            raise DseError(f"{where}: layer {layer}: the counts sum to 0")
        out.append(counts)
    return tuple(out)


def _integer(text, where: str, line: int, key: str) -> int:
    t = (text or "").strip()
    if not (t.isascii() and t.isdigit() and len(t) <= 9):
        raise DseError(f"{where}: line {line}: '{key}' must be a non-negative integer")
    return int(t)


def _count(text, where: str, line: int) -> float:
    t = (text or "").strip()
    try:
        v = float(t) if t.isascii() else math.nan
    except ValueError:
        v = math.nan
    if not (math.isfinite(v) and v >= 0):
        raise DseError(f"{where}: line {line}: 'count' must be a finite number >= 0")
    return v


__all__ = ["Routing", "UNIFORM", "ExpertLoad", "expert_load", "finite_busiest", "zipf_shares", "selection_probabilities", "replicas",
           "packed_ranks", "popularity", "load_histogram", "MAX_HISTOGRAM_ROWS"]
