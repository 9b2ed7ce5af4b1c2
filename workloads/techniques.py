"""Inference techniques that change what a step costs, as one value a Scenario carries.

``Techniques`` holds the settings the operator tables and the footprint read:

- **N:M structured sparsity** (``sparsity``, e.g. 2:4): N of every M consecutive weights kept,
  stored compressed with an index of ceil(log2 M) bits per kept weight (NVIDIA's 2:4 format keeps
  a 2-bit index per non-zero: Mishra et al., "Accelerating Sparse Deep Neural Networks", arXiv
  2104.08378, Sec. 3). The compute speed-up is the device's own (its 2:4 sparse peak); elsewhere
  the matmul runs dense on the decompressed weights.
- **Unstructured sparsity** at a density ``weight_density`` d: the cheaper of a bitmask (1 bit per
  dense weight, plus d x bits) and CSR (a 16-bit column index per kept weight, plus d x bits; row
  pointers negligible), computed dense.
  Both apply to the weight matmuls of the layers (attention and MLP projections, experts); the
  embedding, the LM head, norms and the router stay dense, as SparseGPT and Wanda prune them.
- **Contextual (activation) sparsity** as in Deja Vu (``activation_density``: the fraction of MLP
  neurons and attention heads active per token): in decode, the MLP's projections and the
  attention's query and output projections and attention core compute only the active share; the
  weights read are those of the neurons or heads at least one of the step's T tokens uses,
  1 - (1 - f)^T of them (independent choices); K and V are still written for every head. Each
  layer adds the predictors: two low-rank MLPs of rank ``PREDICTOR_RANK`` (hidden -> rank ->
  neurons, hidden -> rank -> heads; FMInference/DejaVu, sparse_predictor/main_mlp.py and
  main_att.py, ``--D`` "low rank dimension", default 1000). Prefill runs dense.
- **Early exit** (``layers_used``): the mean fraction f of the layers a generated token runs; the
  decode step's layer operators cost f of their work, except that K and V are still projected and
  written in every layer (the exited token's state is copied to the layers it skips, CALM's state
  propagation: Schuster et al., "Confident Adaptive Language Modeling", NeurIPS 2022, Sec. 3.3),
  plus a linear exit classifier (hidden -> 1) after each layer run (CALM's "early-exit
  classifier" confidence measure). Prefill runs every layer.
- **Mixed precision by layer** (``edge_bits``): the first and the last layer's weights stored at
  other bits than the rest (e.g. 8-bit edges around 4-bit layers, as weight-only schemes commonly
  keep the layers most sensitive to quantization); computed in the bulk format's class.
- **KV token budget** (``kv_budget``, H2O / StreamingLLM / SnapKV): each sequence keeps at most k
  tokens of K and V per layer; a decode step attends to min(context, k) keys and the cache holds
  as many. The prefill attends to the whole prompt (the scores choose what to keep).
- **MoE routing** (``routing``, ``workloads.routing``): the experts' popularity (uniform, a Zipf skew or
  a measured histogram), redundant experts and a capacity factor; the expert step waits for the
  busiest expert-parallel rank.
- **Query tokens per decode step** (``query_tokens``): a decode step processes q tokens of each
  sequence at once (speculative decoding's verification of q - 1 drafted tokens and the bonus
  one): q times the matmul work and logits, K and V read once per sequence.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from basis.errors import DseError
from workloads.routing import UNIFORM, Routing

#: rank of Deja Vu's low-rank predictors (FMInference/DejaVu sparse_predictor, ``--D`` default 1000)
PREDICTOR_RANK = 1000
#: bits of one CSR column index (a layer's width stays below 2^16)
CSR_INDEX_BITS = 16


@dataclass(frozen=True)
class Techniques:
    """What a scenario does beyond the plain model (see the module docstring); the defaults
    change nothing. ``sparsity``: (N, M) kept of every M, or () for none."""

    sparsity: tuple = ()
    weight_density: float = 1.0
    activation_density: float = 1.0
    layers_used: float = 1.0
    kv_budget: int = 0
    query_tokens: int = 1
    edge_bits: float = 0.0
    routing: Routing = UNIFORM
    sequence_parallel: bool = False

    def __post_init__(self):
        for name in ("weight_density", "activation_density", "layers_used"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and 0.0 < float(v) <= 1.0):
                raise DseError(f"{name}: expected a fraction in (0, 1], got {v!r}")
        if self.sparsity and self.weight_density < 1.0:
            raise DseError("sparsity and weight_density: give one kind of weight sparsity (N:M structured, or an "
                           "unstructured density), not both")
        if self.kv_budget < 0 or self.query_tokens < 1:
            raise DseError(f"kv_budget must be >= 0 and query_tokens >= 1, got {self.kv_budget}, {self.query_tokens}")

    @property
    def weight_sparse(self) -> bool:
        return bool(self.sparsity) or self.weight_density < 1.0

    @property
    def layer_weights_changed(self) -> bool:
        """True when the layers' weights are stored otherwise than dense in the weights format."""
        return self.weight_sparse or self.edge_bits > 0

    def layer_weight_factor(self, bits: float, layers: int) -> float:
        """Stored bits of the layers' weights per dense weight in the ``bits``-bit format, over
        ``bits``: the sparse storage (``weight_storage_factor``) times the mean over ``layers``
        layers of the first and last at ``edge_bits`` and the others at ``bits``."""
        edge = 1.0
        if self.edge_bits > 0 and layers >= 2:
            edge = ((layers - 2) * bits + 2 * self.edge_bits) / (layers * bits)
        return self.weight_storage_factor(bits) * edge

    def weight_storage_factor(self, bits: float) -> float:
        """Stored bits of a sparse layer weight per dense weight, over ``bits`` (the format's
        bits per element): 1 for dense weights."""
        if self.sparsity:
            n, m = self.sparsity
            return n / m * (bits + math.ceil(math.log2(m))) / bits
        if self.weight_density < 1.0:
            d = self.weight_density
            return min(d * bits + 1.0, d * (bits + CSR_INDEX_BITS)) / bits
        return 1.0

    def weights_touched(self, tokens: float) -> float:
        """Share of the neurons (or heads) ``tokens`` tokens use under contextual sparsity:
        1 - (1 - f)^tokens (1 when dense)."""
        f = self.activation_density
        return 1.0 if f >= 1.0 else 1.0 - (1.0 - f) ** np.maximum(tokens, 1.0)


NONE = Techniques()


def parse_sparsity(text, where: str = "sparsity") -> tuple:
    """(N, M) of an ``N:M`` text (ASCII digits, N < M, M a power of two up to 64), () for ``none`` (or
    ``dense``); DseError naming ``where`` and what is allowed (an empty text included)."""
    s = str(text).strip().lower()
    if s in ("none", "dense"):
        return ()
    head, sep, tail = s.partition(":")
    n = int(head) if head.isascii() and head.isdigit() else 0      # ASCII digits only ('١:٤', '²:4': refused)
    m = int(tail) if tail.isascii() and tail.isdigit() else 0
    if not sep or not (0 < n < m <= 64) or m & (m - 1):
        raise DseError(f"{where}: expected 'none' or 'N:M' (N of every M weights kept, 0 < N < M, M a power of "
                       f"two up to 64, e.g. '2:4'), got {text!r}")
    return (n, m)


def sparsity_text(pair: tuple) -> str:
    """'N:M', or 'none'."""
    return f"{pair[0]}:{pair[1]}" if pair else "none"


def tokens_per_target_step(acceptance, drafted):
    """Expected tokens a speculative-decoding target step yields: (1 - a^(g+1)) / (1 - a) for
    per-token acceptance rate a and g drafted tokens (Leviathan et al., "Fast Inference from
    Transformers via Speculative Decoding", ICML 2023, Eq. 1); g + 1 at a = 1; 1 without drafts.
    Works on numbers or numpy arrays. A tuple is the acceptance by depth (a_1, a_2, ...: the
    probability that the d-th drafted token is accepted given the ones before it were), as native
    draft heads report it: 1 + sum_{d=1..g} prod_{j<=d} a_j, depths past the tuple accepting none
    (a scalar a is a_j = a at every depth: the closed form above)."""
    if isinstance(acceptance, tuple):
        g = int(drafted)
        return 1.0 + float(np.sum(np.cumprod(np.asarray(acceptance[:g], dtype=float))))
    a = np.asarray(acceptance, dtype=float)
    g = np.asarray(drafted, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        e = np.where(a >= 1.0, g + 1.0, (1.0 - a ** (g + 1.0)) / (1.0 - a))
    e = np.where(g > 0, e, 1.0)
    return float(e) if e.ndim == 0 else e
