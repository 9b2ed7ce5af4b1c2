"""MoE routing columns -> each design point's Routing (``workloads.routing``), and the routing figures
every point reports: ``moe_imbalance`` (the busiest expert-parallel rank's routed tokens over the mean
rank's) and ``moe_dropped_fraction`` (the share of routed token-slots over the capacity factor); NaN for
a dense model or a layout that does not divide the experts."""
from __future__ import annotations

import numpy as np

from basis.errors import DseError
from dse.system.columns import Columns, group
from dse.system.params import checked_choice
from workloads.routing import ExpertLoad, Routing, expert_load, load_histogram

#: the columns that set a point's Routing
ROUTING_COLUMNS = ("moe_skew", "redundant_experts", "capacity_factor", "expert_histogram", "expert_load")


def routing_columns(cols: Columns) -> tuple[np.ndarray, list]:
    """(code per point, the Routing of each code) of the routing columns; each histogram file read
    once; DseError naming the column (or the file) and what is allowed."""
    numbers = [cols.numbers(k) for k in ROUTING_COLUMNS[:3]]
    hcodes, files = cols.labels("expert_histogram")
    histograms = [None if str(f).strip().lower() == "none" else _histogram(cols, str(f)) for f in files]
    lcodes, loads = cols.labels("expert_load")
    inv, order, starts = group([*numbers, hcodes, lcodes], cols.n)
    routings = []
    for g in range(len(starts) - 1):
        i = int(order[starts[g]])
        hist = histograms[hcodes[i]]
        try:
            routings.append(Routing(skew=float(numbers[0][i]), redundant=int(numbers[1][i]),
                                    capacity=float(numbers[2][i]), histogram=hist or (),
                                    source=str(files[hcodes[i]]) if hist else "",
                                    finite=checked_choice("expert_load", str(loads[lcodes[i]])) == "finite"))
        except DseError as e:
            raise DseError(f"{cols.where}: {e}") from None
    return inv, routings


def _histogram(cols: Columns, path: str) -> tuple:
    if not path.strip():
        raise DseError(f"{cols.where}: expert_histogram: expected 'none' or a CSV file path, got an empty text")
    try:
        return load_histogram(path)
    except DseError as e:
        raise DseError(f"{cols.where}: {e}") from None


def moe_figures(models: list, model: np.ndarray, ep: np.ndarray, techniques: list, tech: np.ndarray,
                tokens: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(moe_imbalance, moe_dropped_fraction) of every point [P], from its model (codes ``model`` into
    ``models``), expert parallelism ``ep`` and Techniques (codes ``tech`` into ``techniques``, whose
    ``routing`` it reads); NaN for a dense model or experts that do not divide over the ranks (the
    point is refused for that). ``moe_imbalance`` is the busiest rank's kept token-slots over the mean
    rank's: the popularity's (``ExpertLoad.imbalance``) under ``expert_load: expected``; under
    ``finite`` that of the decode step of ``tokens`` [P] sequences (the batch of a static point, the
    running batch of a served one; at least 1, times the query tokens of a decode step) over every rank
    (``finite_imbalance``), the popularity's where ``tokens`` is None."""
    n = len(model)
    imbalance, dropped = np.full(n, np.nan), np.full(n, np.nan)
    inv, order, starts = group([model, ep, tech], n)
    for g in range(len(starts) - 1):
        i = int(order[starts[g]])
        m = models[model[i]]
        if not m.is_moe:
            continue
        at = order[starts[g]:starts[g + 1]]
        t = techniques[tech[i]]
        try:
            load = expert_load(t.routing, m.num_experts, m.experts_per_token, int(ep[i]), m.name)
        except DseError:
            continue
        imbalance[at], dropped[at] = load.imbalance, load.dropped
        if t.routing.finite and tokens is not None:
            steps = np.maximum(np.asarray(tokens, dtype=float)[at], 1.0) * t.query_tokens
            imbalance[at] = finite_imbalance(load, steps, int(ep[i]))
    return imbalance, dropped


#: token counts ``finite_imbalance`` works out at once (its quadrature holds [counts, ranks, nodes])
FINITE_CHUNK = 64


def finite_imbalance(load: ExpertLoad, tokens: np.ndarray, ep: int) -> np.ndarray:
    """[P] the busiest of ``ep`` ranks' expected kept token-slots over the mean rank's when ``tokens``
    [P] tokens (> 0; NaN stays NaN) are routed over every rank: ``ExpertLoad.busiest_tokens(tokens,
    finite=True)`` / (tokens k (1 - dropped) / ep); worked out once per distinct count (a sweep has
    few), ``FINITE_CHUNK`` counts at a time."""
    t = np.asarray(tokens, dtype=float)
    out = np.full(t.shape, np.nan)
    ok = np.isfinite(t)
    counts, where = np.unique(t[ok], return_inverse=True)
    ratio = np.empty(len(counts))
    for lo in range(0, len(counts), FINITE_CHUNK):
        c = counts[lo:lo + FINITE_CHUNK]
        ratio[lo:lo + FINITE_CHUNK] = np.atleast_1d(load.busiest_tokens(c, finite=True)) / (
            c * load.top_k * (1.0 - load.dropped) / ep)
    out[ok] = ratio[where]
    return out


__all__ = ["ROUTING_COLUMNS", "routing_columns", "moe_figures", "finite_imbalance", "FINITE_CHUNK"]
