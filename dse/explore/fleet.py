"""The cheapest (or lowest-power) fleet of mixed hardware that serves a request rate, or a daily
rate curve, within latency SLOs (``fleet``).

Every candidate engine (each hardware preset x the parallel layouts and formats of
``dse.explore.plan.layouts``) is evaluated on every request-size bucket in ONE call of the one
``evaluate`` (``target_rate`` and the SLOs: its goodput, the largest Poisson rate meeting them,
requests/s per replica), then once more at that goodput (its power there, W per replica). A
replica's cost an hour is its capital (price with the host and network shares) spread over the
amortization plus the facility's electricity of its power (``dse.core.metrics.tco_usd_per_s`` at
utilization 1, the same rule as the evaluator's cost of ownership).

The mix is a mixed-integer program (``scipy.optimize.milp``, HiGHS), Mélange's formulation (Griggs
et al., "Mélange: Cost Efficient Large Language Model Serving by Exploiting GPU Heterogeneity",
arXiv 2404.14527, Sec. 5: integer GPUs per type, each bucket's load split over types, a GPU's load
the sum over buckets of rate / that bucket's max throughput on it) extended over the periods of a
day: integer replicas ``owned[e]`` of each engine e (bought for the peak), ``running[e, t]`` <=
``owned[e]`` in period t (the others switched off, 0 W), rates ``x[e, b, t]`` >= 0 with
sum_e x[e, b, t] >= rate_t x share_b and sum_b x[e, b, t] / goodput[e, b] <= running[e, t].
Cost (a day of ``sum(hours)``): owned x capital an hour x hours + sum_t hours_t x running x energy an
hour; power: sum_t hours_t x running x watts (its mean over the day). A running replica draws
its power at its goodput (the most demanding bucket's, where it serves several): an upper bound
where it runs below it. One period, one bucket and one engine give ceil(rate / goodput) replicas,
the evaluator's ``replicas``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from basis.errors import DseError
from dse.core.economics import COST_COLUMNS, economics_defaults
from dse.core.metrics import SECONDS_PER_HOUR, capital_usd, tco_usd_per_s
from dse.explore.plan import ENUMERATED, MAX_DEVICES, PlanAsk, check_ask, layouts
from dse.system.evaluator import evaluate
from dse.system.params import SPEC
from hwmodels.presets import available_hardware

#: what a fleet may minimise: its cost a day ($: capital amortized + electricity), or its mean power (W)
OBJECTIVES = ("cost", "power")
#: hours a day: a rate curve's periods are read as a day's when they sum to this (else as given)
HOURS_PER_DAY = 24.0
#: the engine settings a fleet leaves at their defaults (vLLM's, ``dse.system.params``) unless the
#: caller gives values to try: a fleet varies the hardware, the layout and the formats
ENGINE_SETTINGS = ("max_running", "prefill_chunk")


@dataclass(frozen=True)
class Bucket:
    """Requests of one size: ``share`` of the rate, ``prompt_len`` and ``gen_len`` tokens."""

    share: float
    prompt_len: int
    gen_len: int


@dataclass(frozen=True)
class PdPair:
    """A disaggregated replica (DistServe, Splitwise): ``prefill_devices`` of ``hardware`` computing
    the prompts, ``decode_devices`` of ``decode_hardware`` ("same": the prefill's) decoding, the KV
    cache sent over ``pd_link`` ("default": the evaluator's choice), priced as the evaluator prices
    a ``disaggregate P:D`` point (``dse.core.disaggregated``); its engines are the fleet's layouts
    whose devices divide both pools."""

    hardware: str
    decode_hardware: str
    prefill_devices: int
    decode_devices: int
    pd_link: str = "default"

    @property
    def label(self) -> str:
        """The pair's name as a fleet's hardware: the prefill preset, '>' and the decode's where it differs."""
        same = self.decode_hardware in ("same", self.hardware)
        return self.hardware if same else f"{self.hardware}>{self.decode_hardware}"


@dataclass(frozen=True)
class FleetAsk:
    """A fleet question. ``base``: the scalar columns of every candidate (model, SLOs, engine, cost
    columns, ...; no hardware, no load); ``hardware``: the presets to mix; ``periods``: (hours, requests/s)
    of a rate curve (one period: a constant rate); ``buckets``: request sizes (empty: the base's
    lengths, share 1); ``fixed``: {column: values} restricting ``ENUMERATED``; ``objective``: of
    ``OBJECTIVES``; ``pairs``: disaggregated (P/D) replicas to try as well (``PdPair``)."""

    base: dict
    hardware: tuple[str, ...]
    periods: tuple[tuple[float, float], ...]
    buckets: tuple[Bucket, ...] = ()
    fixed: dict = field(default_factory=dict)
    objective: str = "cost"
    max_devices: int = MAX_DEVICES
    ideal: bool = False
    pairs: tuple[PdPair, ...] = ()   # disaggregated candidates beside the colocated engines

    @property
    def peak(self) -> float:
        """The largest rate of the curve, requests/s."""
        return max(r for _, r in self.periods)


@dataclass(frozen=True)
class Engines:
    """The candidate engines of a fleet, evaluated: one row per engine (hardware x layout), one
    column per bucket. ``goodput`` requests/s per replica (0: misses the SLOs); ``capital_usd_h`` and
    ``energy_usd_h`` $ an hour of one replica; ``power_w`` W of one running replica; ``devices`` a
    replica's; ``tdp_bound``: its power is its TDP (the energy model has no figure)."""

    hardware: tuple[str, ...]
    layout: tuple[dict, ...]
    goodput: np.ndarray           # [E, B]
    capital_usd_h: np.ndarray     # [E]
    energy_usd_h: np.ndarray      # [E]
    power_w: np.ndarray           # [E]
    devices: np.ndarray           # [E]
    price_usd: np.ndarray         # [E] a replica's price (NaN: unknown)
    tdp_bound: np.ndarray         # [E] bool


@dataclass(frozen=True)
class Mix:
    """A fleet: ``owned`` replicas per engine (only engines with some), ``running`` per period,
    its cost a day ($, capital and energy), mean power (W), and mean utilization (the share of
    the owned replicas' capacity the rate uses over the day, routed to keep the fewest busy:
    ``_least_busy``)."""

    rows: tuple[dict, ...]        # {hardware, layout, devices, owned, running: [per period], goodput}
    usd_per_day: float
    capital_usd_per_day: float
    energy_usd_per_day: float
    mean_power_w: float
    peak_power_w: float
    utilization: float
    devices: int

    def as_dict(self) -> dict:
        return {"rows": list(self.rows), "usd_per_day": self.usd_per_day,
                "capital_usd_per_day": self.capital_usd_per_day, "energy_usd_per_day": self.energy_usd_per_day,
                "mean_power_w": self.mean_power_w, "peak_power_w": self.peak_power_w,
                "utilization": self.utilization, "devices": self.devices}


@dataclass(frozen=True)
class Fleet:
    """What ``fleet`` answers: the best ``mix`` over every hardware, the best ``single`` mix of each
    hardware alone (None: it cannot serve the rate), the engines evaluated and notes in words."""

    mix: Mix
    single: dict
    candidates: int
    notes: tuple[str, ...] = ()
    objective: str = "cost"

    def saving(self, hardware: str) -> float:
        """The mix's saving on the objective against ``hardware`` alone (a share; NaN: it cannot serve)."""
        s = self.single.get(hardware)
        return math.nan if s is None else 1.0 - self._value(self.mix) / self._value(s)

    def _value(self, m: Mix) -> float:
        return m.usd_per_day if self.objective == "cost" else m.mean_power_w

    def as_dict(self) -> dict:
        return {"objective": self.objective, "mix": self.mix.as_dict(),
                "single": {h: (None if m is None else m.as_dict()) for h, m in self.single.items()},
                "saving": {h: self.saving(h) for h in self.single}, "candidates": self.candidates,
                "notes": list(self.notes)}


def check_fleet(ask: FleetAsk, where: str = "fleet") -> None:
    """DseError, one line starting with ``where``, for a question no fleet answers: the checks of a
    plan (``dse.explore.plan.check_ask``: hardware, SLOs, device cap) at the curve's peak, a period
    whose hours or rate are not finite numbers > 0 (a rate may be 0), bucket shares that are not
    > 0 or do not sum to 1, bucket lengths that are not whole tokens >= 1, an unknown objective."""
    if not ask.periods:
        raise DseError(f"{where}: rate: give a rate (requests/s) or a curve of [hours, rate] periods")
    for k, (h, r) in enumerate(ask.periods):
        for name, v, low in (("hours", h, 0.0), ("rate", r, None)):
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and \
                (v > 0 if low is not None else v >= 0) and v < 1e12
            if not ok:
                raise DseError(f"{where}: rate_curve[{k}].{name}: expected a number "
                               f"{'> 0' if low is not None else '>= 0'} (hours, requests/s), got {v!r}")
    if not ask.peak > 0:
        raise DseError(f"{where}: rate_curve: every period's rate is 0; give a rate > 0 in some period")
    check_ask(PlanAsk(ask.base, ask.hardware, ask.peak, ask.fixed, ("devices",), ask.max_devices), where)
    if ask.objective not in OBJECTIVES:
        raise DseError(f"{where}: objective: expected one of {', '.join(OBJECTIVES)}, got {ask.objective!r}")
    for k, b in enumerate(ask.buckets):
        if not (isinstance(b.share, (int, float)) and math.isfinite(b.share) and 0 < b.share <= 1):
            raise DseError(f"{where}: buckets[{k}].share: expected a share in (0, 1], got {b.share!r}")
        for name in ("prompt_len", "gen_len"):
            v = getattr(b, name)
            if not (isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 2**24):
                raise DseError(f"{where}: buckets[{k}].{name}: expected whole tokens from 1 to {2**24}, got {v!r}")
    for k, pair in enumerate(ask.pairs):
        for name in ("hardware", "decode_hardware", "pd_link"):
            if not isinstance(getattr(pair, name), str) or not getattr(pair, name):
                raise DseError(f"{where}: pd_pairs[{k}].{name}: expected a preset name, got {getattr(pair, name)!r}")
        for name in ("hardware", "decode_hardware"):
            hw = getattr(pair, name)
            if hw != "same" and hw not in available_hardware() and not Path(hw).is_file():
                raise DseError(f"{where}: pd_pairs[{k}].{name}: unknown hardware {hw!r}; expected a preset "
                               f"(see 'list hardware'), a hardware YAML file or 'same'")
        for name in ("prefill_devices", "decode_devices"):
            v = getattr(pair, name)
            if not (isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= ask.max_devices):
                raise DseError(f"{where}: pd_pairs[{k}].{name}: expected whole devices from 1 to max_devices "
                               f"({ask.max_devices}), got {v!r}")
    if ask.buckets and abs(sum(b.share for b in ask.buckets) - 1.0) > 1e-6:
        raise DseError(f"{where}: buckets: their shares sum to {sum(b.share for b in ask.buckets):g}; expected 1")


def _buckets(ask: FleetAsk) -> tuple[Bucket, ...]:
    if ask.buckets:
        return ask.buckets
    return (Bucket(1.0, int(ask.base.get("prompt_len", 0) or 0), int(ask.base.get("gen_len", 0) or 0)),)


def candidate_columns(ask: FleetAsk) -> tuple[dict, list[tuple[str, dict]]]:
    """(the columns of every candidate engine on every bucket, engine-major: row e x B + b; the
    engines as (hardware, layout)): the service's peak as ``target_rate``."""
    fixed = {**{k: [SPEC[k].default] for k in ENGINE_SETTINGS},
             **{k: [v] for k, v in ask.base.items() if k in ENUMERATED}, **ask.fixed}
    rows = layouts(str(ask.base["model"]), ask.max_devices, fixed)
    engines = [(h, r) for h in ask.hardware for r in rows] + [
        (p.label, {**r, "disaggregate": f"{p.prefill_devices}:{p.decode_devices}", "decode_hardware": p.decode_hardware,
                   "pd_link": p.pd_link, "prefill_hardware": p.hardware})
        for p in ask.pairs for r in rows
        if p.prefill_devices % (r["tp"] * r["pp"] * r["ep"]) == 0 and p.decode_devices % (r["tp"] * r["pp"] * r["ep"]) == 0]
    buckets = _buckets(ask)
    nb = len(buckets)
    cols = {k: v for k, v in ask.base.items() if k not in ENUMERATED and k not in (
        "request_rate", "concurrency", "devices", "batch", "prompt_len", "gen_len")
        and not (ask.pairs and k in ("disaggregate", "decode_hardware", "pd_link"))}
    cols.update(serving="continuous", target_rate=float(max(ask.peak, 1e-9)))
    cols["hardware"] = np.repeat(np.array([r.get("prefill_hardware", h) for h, r in engines], dtype=object), nb)
    if ask.pairs:                            # colocated engines beside the pairs: no pools
        for k, none in (("disaggregate", "none"), ("decode_hardware", "same"), ("pd_link", "default")):
            cols[k] = np.repeat(np.array([r.get(k, none) for _, r in engines], dtype=object), nb)
    for k in ENUMERATED:
        v = [r[k] for _, r in engines]
        cols[k] = np.repeat(np.array(v, dtype=object if isinstance(v[0], str) else None), nb)
    if buckets[0].prompt_len:
        cols["prompt_len"] = np.tile([b.prompt_len for b in buckets], len(engines))
        cols["gen_len"] = np.tile([b.gen_len for b in buckets], len(engines))
    return cols, engines


def evaluate_engines(ask: FleetAsk) -> tuple[Engines, list[str]]:
    """(every candidate engine's goodput per bucket, price and power, evaluated: ``Engines``; notes):
    one ``evaluate`` of every engine on every bucket, and one of those meeting the SLOs at their
    goodput (power there; the TDP where the energy model has no figure: noted)."""
    cols, engines = candidate_columns(ask)
    nb = len(_buckets(ask))
    first = evaluate(cols, ideal=ask.ideal)
    good = np.where(first.feasible & np.isfinite(first["goodput"]), np.nan_to_num(first["goodput"]), 0.0)
    # a point missing its SLO at the peak is infeasible ('slo') yet has a goodput: a replica still serves that much
    slo = np.array([first.reason_key(i) == "slo" for i in range(len(first))])
    good = np.where(slo & np.isfinite(first["goodput"]), np.nan_to_num(first["goodput"]), good)
    at = np.flatnonzero(good > 0)
    power = np.full(len(good), np.nan)
    if len(at):
        load = {k: (v[at] if isinstance(v, np.ndarray) else v) for k, v in cols.items() if k != "target_rate"}
        load["request_rate"] = good[at] * (1.0 - 1e-6)
        second = evaluate(load, ideal=ask.ideal)
        power[at] = second["power_w"]
    tdp = np.asarray(first["system_tdp_w"], dtype=float)
    bound = np.isnan(power) & (good > 0)
    power = np.where(np.isnan(power), tdp, power)
    E = len(engines)
    good = good.reshape(E, nb)
    served = good > 0
    power_e = np.where(served, power.reshape(E, nb), -np.inf).max(axis=1)
    power_e = np.where(np.isfinite(power_e), power_e, np.nan)
    price = np.asarray(first["cost_usd"], dtype=float).reshape(E, nb)[:, 0]
    econ = _economics(ask.base)
    capital = usd_per_hour(price, 0.0, econ)
    energy = usd_per_hour(0.0, power_e, econ)
    notes = []
    hw = np.array([h for h, _ in engines], dtype=object)
    for h in dict.fromkeys([*ask.hardware, *(p.label for p in ask.pairs)]):
        on = hw == h
        if not served[on].any():
            notes.append(f"{h}: no layout meets the SLOs on {'every bucket' if nb > 1 else 'the workload'}")
        elif ask.objective == "cost" and np.isnan(price[on]).all():
            notes.append(f"{h}: left out: the preset cites no price (price_usd)")
        elif np.isnan(power_e[on & served.any(axis=1)]).all():
            notes.append(f"{h}: left out: neither the energy model nor the preset gives its power")
        elif bound.reshape(E, nb)[on].any():
            notes.append(f"{h}: power taken as its TDP (the energy model has no figure for it): an upper bound")
    return Engines(tuple(hw), tuple(r for _, r in engines), good, capital, energy, power_e,
                   np.asarray(first["devices"], dtype=float).reshape(E, nb)[:, 0], price,
                   bound.reshape(E, nb).any(axis=1)), notes


def _economics(base: dict) -> dict:
    """The cost columns of ``base`` (a number each), the shipped cited defaults where left out."""
    d = economics_defaults()
    return {k: float(base[k]) if base.get(k) is not None else float(d[k]) for k in COST_COLUMNS}


def usd_per_hour(price_usd, power_w, econ: dict):
    """$ an hour of one replica of ``price_usd`` drawing ``power_w``, busy all the time: its capital
    (with the host and network shares: ``capital_usd``) over the amortization plus the facility's
    electricity (x PUE), the evaluator's cost of ownership (``tco_usd_per_s``) at utilization 1."""
    capital = capital_usd(price_usd, econ["host_cost_share"], econ["network_cost_share"])
    return tco_usd_per_s(capital, power_w, 0.0, econ["electricity_usd_per_kwh"], econ["amortization_years"], 1.0,
                         econ["pue"]) * SECONDS_PER_HOUR


def cheapest_mix(eng: Engines, periods, shares, objective: str, use: np.ndarray) -> Mix | None:
    """The best ``Mix`` of the engines ``use`` ([E] bool) serving ``periods`` ((hours, requests/s)) split
    over buckets by ``shares``, under ``objective``; None where they cannot serve every bucket."""
    good = np.where(use[:, None], eng.goodput, 0.0)
    need = np.array([[r * s for s in shares] for _, r in periods])         # [T, B]
    if np.any((need > 0) & ~(good > 0).any(axis=0)[None, :]):
        return None
    keep = np.flatnonzero((good > 0).any(axis=1))
    g = good[keep]
    E, B, T = len(keep), len(shares), len(periods)
    hours = np.array([h for h, _ in periods], dtype=float)
    nN, nn = E, E * T
    nx = E * B * T

    def n_at(e, t):
        return nN + e * T + t

    def x_at(e, b, t):
        return nN + nn + (e * B + b) * T + t

    c = np.zeros(nN + nn + nx)
    if objective == "cost":
        c[:nN] = eng.capital_usd_h[keep] * hours.sum()
        c[nN:nN + nn] = (eng.energy_usd_h[keep][:, None] * hours[None, :]).ravel()
    else:
        c[nN:nN + nn] = (eng.power_w[keep][:, None] * hours[None, :]).ravel() / hours.sum()
        cap = eng.capital_usd_h[keep]          # a tie-break: own no replica more than needed
        c[:nN] = 1e-9 * np.where(np.isfinite(cap), cap, 1.0)
    rows, cols_, vals, lo, hi = [], [], [], [], []
    r = 0
    for b in range(B):                       # demand: sum_e x[e, b, t] >= need[t, b]
        for t in range(T):
            for e in range(E):
                rows.append(r)
                cols_.append(x_at(e, b, t))
                vals.append(1.0)
            lo.append(need[t, b])
            hi.append(np.inf)
            r += 1
    for e in range(E):                       # capacity: sum_b x / goodput - running <= 0
        for t in range(T):
            for b in range(B):
                if g[e, b] > 0:
                    rows.append(r)
                    cols_.append(x_at(e, b, t))
                    vals.append(1.0 / g[e, b])
            rows.append(r)
            cols_.append(n_at(e, t))
            vals.append(-1.0)
            lo.append(-np.inf)
            hi.append(0.0)
            r += 1
            rows += [r, r]                   # running <= owned
            cols_ += [n_at(e, t), e]
            vals += [1.0, -1.0]
            lo.append(-np.inf)
            hi.append(0.0)
            r += 1
    # scipy is imported here, not at the top: the CLI imports this module, and its light commands
    # (analyze, compare) must not pay scipy's import
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix
    A = coo_matrix((vals, (rows, cols_)), shape=(r, len(c))).tocsr()
    upper = np.full(len(c), np.inf)
    for e in range(E):
        for b in range(B):
            if not g[e, b] > 0:
                upper[[x_at(e, b, t) for t in range(T)]] = 0.0
    integrality = np.r_[np.ones(nN + nn), np.zeros(nx)]
    res = milp(c, constraints=LinearConstraint(A, lo, hi), integrality=integrality,
               bounds=Bounds(np.zeros(len(c)), upper), options={"mip_rel_gap": 1e-9})
    if not res.success:
        return None
    owned = np.round(res.x[:nN]).astype(int)
    running = np.round(res.x[nN:nN + nn]).reshape(E, T).astype(int)
    load = _least_busy(g, need, running)      # [E, T] replicas' worth busy
    capital = float(owned @ eng.capital_usd_h[keep]) * hours.sum() if objective == "cost" or \
        np.isfinite(eng.capital_usd_h[keep][owned > 0]).all() else math.nan
    energy = float(((running * eng.energy_usd_h[keep][:, None]) * hours[None, :]).sum())
    watts = (running * eng.power_w[keep][:, None]).sum(axis=0)           # [T]
    scale = HOURS_PER_DAY / hours.sum()      # a curve of other length: its figures per day
    out = []
    for j in np.flatnonzero(owned > 0):
        e = keep[j]
        out.append({"hardware": eng.hardware[e], **eng.layout[e], "devices_per_replica": int(eng.devices[e]),
                    "owned": int(owned[j]), "running": [int(v) for v in running[j]],
                    "goodput_per_replica": [float(v) for v in eng.goodput[e]],
                    "price_usd": float(eng.price_usd[e]) * int(owned[j]), "power_w": float(eng.power_w[e]),
                    "tdp_bound": bool(eng.tdp_bound[e])})
    return Mix(tuple(out), (capital + energy) * scale, capital * scale, energy * scale,
               float(watts @ hours / hours.sum()), float(watts.max()),
               float((load.sum(axis=0) @ hours) / max(owned.sum() * hours.sum(), 1e-300)),
               int(owned @ eng.devices[keep]))


def _least_busy(g: np.ndarray, need: np.ndarray, running: np.ndarray) -> np.ndarray:
    """[E, T] replicas' worth of each engine busy in each period when the demand ``need`` [T, B]
    (requests/s) is routed over the ``running`` [E, T] replicas (goodput ``g`` [E, B] requests/s a
    replica) so that it keeps the fewest replicas busy: per period the linear program min sum_e,b
    x[e, b] / g[e, b] with sum_e x[e, b] = need[b] and sum_b x[e, b] / g[e, b] <= running[e]
    (``scipy.optimize.linprog``, HiGHS). The cost program leaves the split free where several cost
    the same (its solution is one vertex of many); this reading is unique, so the fleet's
    utilization does not depend on which vertex the solver returns."""
    from scipy.optimize import linprog  # (scipy at call time, as ``cheapest_mix``'s milp)
    E, B = g.shape
    inv = np.where(g > 0, 1.0 / np.where(g > 0, g, 1.0), 0.0)          # [E, B]
    c = inv.ravel()                                                     # x[e, b] at e * B + b
    demand = np.tile(np.eye(B), E)                                      # sum_e x[e, b] = need[t, b]
    capacity = np.kron(np.eye(E), np.ones(B)) * c                       # sum_b x[e, b] / g[e, b] <= running[e, t]
    bounds = [(0.0, None if ok else 0.0) for ok in (g > 0).ravel()]
    out = np.zeros(running.shape)
    for t in range(need.shape[0]):
        if not need[t].any():
            continue
        res = linprog(c, A_ub=capacity, b_ub=running[:, t], A_eq=demand, b_eq=need[t], bounds=bounds, method="highs")
        x = res.x.reshape(E, B) if res.success else np.zeros((E, B))
        out[:, t] = (x * inv).sum(axis=1)
    return out


def fleet(ask: FleetAsk) -> Fleet:
    """The ``Fleet`` answering ``ask``: the best mix over every hardware and each hardware alone;
    DseError (one line) for a bad question (``check_fleet``) or where no mix serves the rate."""
    check_fleet(ask)
    eng, notes = evaluate_engines(ask)
    shares = [b.share for b in _buckets(ask)]
    usable = (eng.goodput > 0).any(axis=1) & np.isfinite(eng.power_w)
    if ask.objective == "cost":
        usable &= np.isfinite(eng.capital_usd_h)
    best = cheapest_mix(eng, ask.periods, shares, ask.objective, usable)
    hw = np.array(eng.hardware, dtype=object)
    if best is None:
        raise DseError(f"fleet: no mix of {', '.join(ask.hardware)} serves {ask.peak:g} requests/s within the SLOs"
                       + (f" ({'; '.join(notes)})" if notes else ""))
    kinds = list(dict.fromkeys([*ask.hardware, *(p.label for p in ask.pairs)]))   # a P/D pair of two presets: its own kind
    single = {h: cheapest_mix(eng, ask.periods, shares, ask.objective, usable & (hw == h)) for h in kinds}
    return Fleet(best, single, len(eng.hardware), tuple(notes), ask.objective)


__all__ = ["FleetAsk", "Bucket", "PdPair", "Fleet", "Mix", "Engines", "fleet", "check_fleet", "evaluate_engines",
           "cheapest_mix", "usd_per_hour", "candidate_columns", "OBJECTIVES"]
