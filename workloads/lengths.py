"""Request lengths of a served workload: fixed, lognormal, or a trace of measured lengths.

A serving workload's prompt and output lengths are a distribution, named by a spec:

- ``fixed``: every request has ``prompt_len`` and ``gen_len`` tokens;
- ``lognormal`` (``lognormal:sigma=S``, or ``lognormal:prompt_sigma=S,gen_sigma=S``):
  prompt and output lengths independent and lognormal with means ``prompt_len`` and
  ``gen_len`` and shape sigma (the standard deviation of the log; default 1.0 each);
- a CSV file (``path.csv``) with columns ``prompt_len`` and ``gen_len``, one request per
  row (a public trace): its rows as they are, and its means stand for ``prompt_len`` and
  ``gen_len``. An optional column ``arrival_s`` (seconds, non-decreasing) gives each request's
  arrival: the trace's rate, (rows - 1) / (last - first arrival), and its burstiness, the gamma
  shape whose squared coefficient of variation is that of the gaps (mean^2 / variance, the
  moment fit), stand for ``request_rate`` and ``burstiness`` where a point gives none, and the
  simulator replays the arrivals with their rows (``LengthSpec.replay``).

The steady-state serving model works on a few length classes (``Lengths``): strata of the
distribution's quantiles, each at its conditional mean, so that the class means add up to
the distribution's mean exactly; the simulator draws requests from the distribution itself.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from basis.errors import DseError
from basis.files import read_csv

#: quantile edges of the strata a lognormal is cut into: fifths, then finer into the tail,
#: where the 90th and 99th percentiles of latency come from (each stratum keeps its variance)
LOGNORMAL_EDGES = (0.0, 0.2, 0.4, 0.6, 0.8, 0.9, 0.95, 0.99, 0.999, 1.0)
#: a trace is cut into this many prompt strata, each into this many output strata
TRACE_STRATA = 8
#: the default sigma of a lognormal length
DEFAULT_SIGMA = 1.0
#: the burstiness a trace's gaps are read at most as (dse.system.params' ``burstiness`` range; a trace
#: of equal gaps, variance 0, is the most regular arrival process that range holds)
MAX_BURSTINESS = 100.0
FIXED = "fixed"


@dataclass(frozen=True)
class Lengths:
    """Request lengths as K classes: prompt [K] and gen [K] tokens (class means, >= 1),
    weight [K], the share of requests in each (summing to 1), and the variance of the lengths
    within each class (prompt_var, gen_var [K], tokens^2; zero for fixed lengths)."""

    prompt: np.ndarray
    gen: np.ndarray
    weight: np.ndarray
    prompt_var: np.ndarray | None = None
    gen_var: np.ndarray | None = None

    def __post_init__(self):
        for key in ("prompt_var", "gen_var"):
            if getattr(self, key) is None:
                object.__setattr__(self, key, np.zeros(len(self.weight)))

    @classmethod
    def fixed(cls, prompt_len: float, gen_len: float) -> "Lengths":
        """One class: every request ``prompt_len`` and ``gen_len`` tokens."""
        return cls(np.array([float(prompt_len)]), np.array([float(gen_len)]), np.array([1.0]))

    @property
    def mean_prompt(self) -> float:
        """Mean prompt tokens per request."""
        return float(self.weight @ self.prompt)

    @property
    def mean_gen(self) -> float:
        """Mean output tokens per request."""
        return float(self.weight @ self.gen)


@dataclass(frozen=True)
class LengthSpec:
    """A parsed length distribution: kind ``fixed``, ``lognormal`` (prompt_sigma, gen_sigma)
    or ``trace`` (prompts, gens: the trace's rows; arrivals: their arrival times, s, or empty;
    path its file)."""

    kind: str
    prompt_sigma: float = 0.0
    gen_sigma: float = 0.0
    prompts: tuple = ()
    gens: tuple = ()
    path: str = ""
    arrivals: tuple = ()

    @property
    def trace_rate(self) -> float:
        """Requests/s of a trace's arrivals: (rows - 1) / (last - first arrival); NaN without them."""
        if not self.arrivals:
            return math.nan
        return (len(self.arrivals) - 1) / (self.arrivals[-1] - self.arrivals[0])

    @property
    def trace_burstiness(self) -> float:
        """The gamma shape of a trace's arrival gaps by moments, mean^2 / variance (1: as regular as a
        Poisson process's), at most ``MAX_BURSTINESS``; NaN without arrivals."""
        if not self.arrivals:
            return math.nan
        gaps = np.diff(np.asarray(self.arrivals, dtype=float))
        var = float(np.var(gaps))
        return MAX_BURSTINESS if var <= 0 else min(float(np.mean(gaps)) ** 2 / var, MAX_BURSTINESS)

    @property
    def name(self) -> str:
        """The spec as written (``fixed``, ``lognormal:prompt_sigma=..,gen_sigma=..`` or the file)."""
        if self.kind == "lognormal":
            return f"lognormal:prompt_sigma={self.prompt_sigma:g},gen_sigma={self.gen_sigma:g}"
        return self.path or FIXED

    def trace_means(self) -> tuple[int, int]:
        """(prompt, gen) mean tokens of a trace, rounded."""
        return int(round(float(np.mean(self.prompts)))), int(round(float(np.mean(self.gens))))

    def classes(self, prompt_len: float, gen_len: float, max_tokens: float = math.inf) -> Lengths:
        """The length classes with means ``prompt_len`` and ``gen_len`` (a trace: its own rows),
        each class's prompt + gen at most ``max_tokens`` (the model's context; the prompt
        shortened where a class would pass it)."""
        if self.kind == "fixed":
            return Lengths.fixed(prompt_len, gen_len)
        if self.kind == "lognormal":
            pv, pw, ps = _lognormal_strata(prompt_len, self.prompt_sigma)
            gv, gw, gs = _lognormal_strata(gen_len, self.gen_sigma)
            prompt, gen = np.repeat(pv, len(gv)), np.tile(gv, len(pv))
            prompt_var, gen_var = np.repeat(ps, len(gv)), np.tile(gs, len(pv))
            weight = np.outer(pw, gw).ravel()
        else:
            prompt, gen, weight, prompt_var, gen_var = _trace_strata(np.asarray(self.prompts, float),
                                                                     np.asarray(self.gens, float))
        prompt, gen = np.maximum(prompt, 1.0), np.maximum(gen, 1.0)
        prompt = np.maximum(np.minimum(prompt, max_tokens - gen), 1.0)
        return Lengths(prompt, gen, weight / weight.sum(), prompt_var, gen_var)

    def clamp_note(self, prompt_len: float, gen_len: float, max_tokens: float) -> str:
        """'' when no request of the distribution passes ``max_tokens`` (the model's context),
        else in words what ``classes`` models: the mean prompt left after the prompts that would
        pass it are shortened, against the mean given (a trace: its rows' mean)."""
        if self.kind == "fixed" or not np.isfinite(max_tokens):
            return ""
        given = self.trace_means()[0] if self.kind == "trace" else prompt_len
        modelled = self.classes(prompt_len, gen_len, max_tokens).mean_prompt
        if modelled >= given - 0.5:
            return ""
        where = "in the trace" if self.kind == "trace" else "given"
        return (f"prompts past the {max_tokens:,.0f}-token context shortened to fit it: mean prompt "
                f"{modelled:,.0f} tokens modelled, {given:,.0f} {where}")

    def sample(self, n: int, prompt_len: int, gen_len: int, rng: np.random.Generator,
               max_tokens: float = math.inf) -> tuple[np.ndarray, np.ndarray]:
        """(prompts, gens) of ``n`` requests drawn from the distribution (integers >= 1, each
        prompt + gen at most ``max_tokens``): fixed lengths, lognormal draws, or trace rows.
        Stratified (Latin hypercube): each of n equal-probability strata of a length's
        distribution (each row of a trace as evenly as n allows) once, in random order, so
        that a sample's mean strays far less from the distribution's than independent draws."""
        if self.kind == "fixed":
            p, g = np.full(n, float(prompt_len)), np.full(n, float(gen_len))
        elif self.kind == "lognormal":
            p = _lognormal_draw(prompt_len, self.prompt_sigma, n, rng)
            g = _lognormal_draw(gen_len, self.gen_sigma, n, rng)
        else:
            rows = np.floor(_strata(n, rng) * len(self.prompts)).astype(np.int64)
            p, g = np.asarray(self.prompts, float)[rows], np.asarray(self.gens, float)[rows]
        g = np.maximum(np.round(g), 1)
        p = np.maximum(np.minimum(np.round(p), max_tokens - g), 1)
        return p.astype(np.int64), g.astype(np.int64)

    def replay(self, n: int, max_tokens: float = math.inf) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(arrival times s, prompts, gens) of ``n`` requests replaying a trace's rows in order with
        their arrivals (from 0), the trace repeated as often as ``n`` needs, each repeat one mean gap
        after the last; prompts cut as ``sample`` cuts them. DseError for a trace without arrivals."""
        if not self.arrivals:
            raise DseError(f"{self.path}: a replay needs the trace's arrival_s column")
        t = np.asarray(self.arrivals, dtype=float) - self.arrivals[0]
        span = t[-1] + 1.0 / self.trace_rate
        rows = np.arange(n) % len(t)
        times = t[rows] + (np.arange(n) // len(t)) * span
        g = np.asarray(self.gens, float)[rows]
        p = np.maximum(np.minimum(np.asarray(self.prompts, float)[rows], max_tokens - g), 1)
        return times, p.astype(np.int64), g.astype(np.int64)


def _lognormal_strata(mean: float, sigma: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(conditional mean [S], probability [S], conditional variance [S]) of a lognormal of
    this mean and sigma within each quantile stratum of ``LOGNORMAL_EDGES`` (sigma 0: one
    stratum at the mean)."""
    from scipy.special import ndtr, ndtri  # scipy on first use: importing dse stays light
    if sigma == 0:
        return np.array([float(mean)]), np.array([1.0]), np.array([0.0])
    u = np.asarray(LOGNORMAL_EDGES)
    z = ndtri(u)                                       # -inf .. +inf at the ends
    prob = np.diff(u)
    # E[X^m; X in (q_a, q_b)] = E[X^m] (Phi(z_b - m sigma) - Phi(z_a - m sigma)), E[X^2] = mean^2 e^(sigma^2)
    first = mean * np.diff(ndtr(z - sigma)) / prob
    second = mean ** 2 * math.exp(sigma ** 2) * np.diff(ndtr(z - 2.0 * sigma)) / prob
    return first, prob, np.maximum(second - first ** 2, 0.0)


def _strata(n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` uniform draws on (0, 1), one in each of n equal strata, in random order."""
    return (rng.permutation(n) + rng.random(n)) / n


def _lognormal_draw(mean: float, sigma: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` stratified draws of a lognormal of this mean and sigma."""
    from scipy.special import ndtri  # scipy on first use: importing dse stays light
    if sigma <= 0:
        return np.full(n, float(mean))
    return np.exp(math.log(mean) - sigma * sigma / 2.0 + sigma * ndtri(_strata(n, rng)))


def _trace_strata(prompts: np.ndarray, gens: np.ndarray) -> tuple[np.ndarray, ...]:
    """(prompt [K], gen [K], count [K], prompt variance [K], gen variance [K]) of a trace cut
    into prompt strata and, within each, output strata of equal counts (up to ``TRACE_STRATA``
    each), each at its rows' means."""
    order = np.argsort(prompts, kind="stable")
    parts = []
    for chunk in np.array_split(order, min(TRACE_STRATA, len(order))):
        inner = chunk[np.argsort(gens[chunk], kind="stable")]
        parts += np.array_split(inner, min(TRACE_STRATA, len(inner)))
    return tuple(np.array([f(x[p]) for p in parts]) for f, x in
                 ((np.mean, prompts), (np.mean, gens), (len, prompts), (np.var, prompts), (np.var, gens)))


def parse_lengths(spec) -> LengthSpec:
    """The LengthSpec of a spec string (``fixed``, ``lognormal[:sigma=S | prompt_sigma=S,gen_sigma=S]``
    or a CSV path); DseError naming what is allowed."""
    if isinstance(spec, LengthSpec):
        return spec
    text = str(spec).strip()
    if text == FIXED:
        return LengthSpec(FIXED)
    if text == "lognormal" or text.startswith("lognormal:"):
        return _parse_lognormal(text)
    if text.lower().endswith(".csv"):
        return _read_trace(text)
    raise DseError(f"lengths: expected 'fixed', 'lognormal[:sigma=S]', 'lognormal:prompt_sigma=S,gen_sigma=S' "
                   f"or a CSV file of prompt_len,gen_len rows, got {text!r}")


def _parse_lognormal(text: str) -> LengthSpec:
    """A lognormal LengthSpec from ``lognormal[:key=value,...]``; DseError for a key given twice, or
    ``sigma`` beside ``prompt_sigma``/``gen_sigma`` (either would silently win), an empty list after
    the colon, or a value that is not a number from 0 to 4 in ASCII digits."""
    sig = {"prompt_sigma": DEFAULT_SIGMA, "gen_sigma": DEFAULT_SIGMA}
    _, colon, body = text.partition(":")
    items = [s.strip() for s in body.split(",")] if colon else []
    if colon and not any(items):
        raise DseError(f"lengths: got {_cut(text)!r}, nothing after 'lognormal:'; expected 'lognormal', "
                       f"'lognormal:sigma=S' or 'lognormal:prompt_sigma=S,gen_sigma=S'")
    seen: list[str] = []
    for item in filter(None, items):
        key, _, value = item.partition("=")
        key = key.strip()
        if key not in ("sigma", "prompt_sigma", "gen_sigma"):
            raise DseError(f"lengths: unknown lognormal parameter {_cut(key)!r}; allowed: sigma, prompt_sigma, "
                           f"gen_sigma")
        if key in seen or (key == "sigma" and seen) or (seen == ["sigma"]):
            both = key if key in seen else f"{seen[0]} and {key}"
            raise DseError(f"lengths: {both} given {'twice' if key in seen else 'together'} in {_cut(text)!r}; "
                           f"give each sigma once: 'lognormal:sigma=S' (both lengths) or "
                           f"'lognormal:prompt_sigma=S,gen_sigma=S'")
        seen.append(key)
        try:
            v = float(value) if value.isascii() else math.nan     # float() also reads other scripts' digits
        except ValueError:
            v = math.nan
        if not (math.isfinite(v) and 0 <= v <= 4):
            raise DseError(f"lengths: lognormal {key} must be a number from 0 to 4, got {_cut(value.strip())!r}")
        for k in (("prompt_sigma", "gen_sigma") if key == "sigma" else (key,)):
            sig[k] = v
    return LengthSpec("lognormal", sig["prompt_sigma"], sig["gen_sigma"])


def _cut(text: str, limit: int = 40) -> str:
    """``text`` cut to ``limit`` characters, for one-line messages."""
    return text if len(text) <= limit else text[:limit - 1] + "…"


@lru_cache(maxsize=64)
def _read_trace(path: str) -> LengthSpec:
    """A trace LengthSpec from a CSV with ``prompt_len`` and ``gen_len`` columns; DseError
    naming the file, line and column of what cannot be used."""
    p = Path(path)
    header, reader = read_csv(p, "length trace")
    if "prompt_len" not in header or "gen_len" not in header:
        raise DseError(f"{p}: a length trace needs columns prompt_len and gen_len, found {', '.join(header) or 'none'}")
    prompts, gens, arrivals = [], [], []
    timed = "arrival_s" in header
    for line, row in enumerate(reader, start=2):
        if timed:
            arrivals.append(_arrival(p, line, row.get("arrival_s"), arrivals[-1] if arrivals else 0.0))
        for key, out in (("prompt_len", prompts), ("gen_len", gens)):
            raw = (row.get(key) or "").strip()
            v = _number(raw)
            if not (math.isfinite(v) and v >= 1 and v == int(v) and v <= 2**40):
                raise DseError(f"{p}: line {line}: {key} must be a positive integer (at most 2**40), got "
                               f"{f'{v:g}' if math.isfinite(v) else 'empty' if not raw else 'text that is not a number'}")
            out.append(int(v))
    if not prompts:
        raise DseError(f"{p}: a length trace needs at least one row")
    if timed and (len(arrivals) < 2 or arrivals[-1] <= arrivals[0]):
        raise DseError(f"{p}: arrival_s: a trace's arrivals need at least two rows and a last arrival after the "
                       f"first (its rate is rows - 1 over that span)")
    return LengthSpec("trace", prompts=tuple(prompts), gens=tuple(gens), path=str(path), arrivals=tuple(arrivals))


def _number(raw: str) -> float:
    """A trace cell as a float; NaN where it is not an ASCII number (float() also reads other
    scripts' digits, '١٠٠')."""
    try:
        return float(raw) if raw.isascii() else math.nan
    except ValueError:
        return math.nan


def _arrival(path: Path, line: int, raw, last: float) -> float:
    """The arrival time (s) of a trace row: finite, at least 0 and at least the row before's; DseError
    naming the file and line otherwise."""
    raw = (raw or "").strip()
    v = _number(raw)
    if not (math.isfinite(v) and 0 <= v <= 1e9):
        raise DseError(f"{path}: line {line}: arrival_s must be a number of seconds from 0 to 1e9, got "
                       f"{'empty' if not raw else _cut(raw)}")
    if v < last:
        raise DseError(f"{path}: line {line}: arrival_s must not decrease (got {v:g} after {last:g}); give the rows "
                       f"in arrival order")
    return v


__all__ = ["Lengths", "LengthSpec", "parse_lengths", "FIXED", "LOGNORMAL_EDGES"]
