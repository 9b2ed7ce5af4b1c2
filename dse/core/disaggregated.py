"""Disaggregated prefill and decode (DistServe, Splitwise): prompts run on a pool of prefill
engines, the KV cache they build moves over a link to a pool of decode engines, which
decode. Vectorized over design points, on the machinery of ``dse.core.serving``.

At a request throughput X, spread evenly over the instances:

- **prefill pool**: each of its instances sees X / prefill requests/s of prompts only (one
  output token, the first, comes out of the prompt's last iteration): the mixing regime of
  ``dse.core.serving`` with no decoders. TTFT is its TTFT.
- **link**: each prefill instance sends every request's KV (the computed prompt tokens;
  the shared prefix is cached on both sides) over its link, one transfer at a time: an
  M/G/1 queue (Pollaczek-Khinchine mean wait λ E[S^2] / 2(1 - ρ)).
- **decode pool**: each instance runs b sequences, b = (X / decode) x E[G - 1] x T(b) by
  Little's law, T(b) the decode-only iteration; capped by its KV cache (the whole context of
  a decoding sequence) and max_running.

- **encoder pool** (E:P:D, ``pools.encoders`` instances; vision-language requests): each
  instance encodes a request's images and sends their embeddings to a prefill instance over the
  same link pricing as the KV (``pools.transfer``), one request at a time: an M/D/1 queue
  (every request carries the same images: the Pollaczek-Khinchine wait of a constant service s,
  lambda s^2 / 2(1 - rho)); its wait, the encoding and the send come before the prefill's TTFT.

TPOT is (link wait + transfer + decode iterations) / (G - 1): the time between the first
token and the last, per token. The capacity is the least of the three stages'. A closed
loop at concurrency N runs at the X where X x E[end-to-end latency] = N (Little's law;
bisection); past the capacity the rest wait before the prefill pool.

Sources (facts): Zhong et al., "DistServe", OSDI 2024; Patel et al., "Splitwise", ISCA 2024;
Pollaczek-Khinchine formula for the M/G/1 mean wait.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from dse.core.serving import (
    IterationTime,
    Load,
    _assign,
    _blocks_per_sequence,
    _Classes,
    _classes,
    _closed_loop,
    _mixed,
    _mixing_mixtures,
    _percentiles,
    _priced,
    _row_quantile,
    _with_queue,
    largest_rate,
    running_cap,
)

#: bisection steps over the throughput of a closed loop and of goodput (precision capacity / 2^n)
_BISECT = 24
#: fixed-point steps of a decode pool's running batch at most
_DECODE_FIXED_POINT = 60


def _prompt_only(cls: _Classes) -> _Classes:
    """The classes as a prefill pool sees them: one output token each, no decoding."""
    one = np.ones_like(cls.gen)
    return replace(cls, gen=one, steps=np.zeros_like(cls.steps), keys=cls.prompt)


def _cap(load: Load, cls: _Classes, held_per_seq) -> np.ndarray:
    """Sequences one engine runs at once, [A]: max_running or what its KV cache (less the
    shared prefix) holds at ``held_per_seq`` blocks each; at least 1."""
    return np.maximum(running_cap(load, cls, held_per_seq), 1.0)


def mg1_wait(lam, s1, s2) -> np.ndarray:
    """Mean seconds a request waits in an M/G/1 queue at ``lam`` requests/s whose service has mean
    ``s1`` (seconds) and second moment ``s2`` (s^2): Pollaczek-Khinchine, lam s2 / 2(1 - lam s1); inf
    at or past saturation. The KV link of each prefill instance, and an encoder instance (M/D/1:
    s2 = s1^2)."""
    rho = lam * s1
    return np.where(rho < 1, lam * s2 / (2.0 * np.maximum(1.0 - rho, 1e-300)), np.inf)


class _Stages:
    """The three stages of a group's points (arrays [A]) and their capacities (requests/s)."""

    def __init__(self, load: Load, iteration_time: IterationTime, rows):
        self.load, self.it, self.rows = load, iteration_time, rows
        pools = load.pools
        # a decode pool of its own layout: its engines and iterations (else the prefill pool's)
        self.dload = load if pools.decode_load is None else pools.decode_load
        self.dit = iteration_time if pools.decode_time is None else pools.decode_time
        cls = _classes(load)
        self.cls, self.pcls = cls, _prompt_only(cls)
        self.cap_p = _cap(load, self.pcls, _blocks_per_sequence(load, self.pcls))
        self.x_prefill = pools.prefill * _closed_loop(self.cap_p, load, self.pcls, iteration_time, rows, self.cap_p)["x"]
        w = cls.weight
        self.es = cls.steps @ w
        self.ctx = np.where(self.es > 0, ((cls.steps * cls.keys) @ w) / np.maximum(self.es, 1e-300), cls.keys @ w)
        self.held_d = _blocks_per_sequence(self.dload, cls, cls.weight * np.maximum(cls.steps, 1e-9))   # decoding
        self.cap_d = _cap(self.dload, cls, self.held_d)
        t_full = self._decode_iteration(self.cap_d, np.arange(len(rows)))
        self.x_decode = np.where(self.es > 0, pools.decode * self.cap_d / (np.maximum(self.es, 1e-300) * t_full), np.inf)
        self.xfer = pools.transfer(pools.kv_token_bytes[:, None] * cls.work, rows)      # [A, K] seconds
        self.s1, self.s2 = self.xfer @ w, (self.xfer ** 2) @ w
        self.x_link = np.where(self.s1 > 0, pools.prefill / np.maximum(self.s1, 1e-300), np.inf)
        self.capacity = np.minimum(np.minimum(self.x_prefill, self.x_decode), self.x_link)
        self.enc = np.zeros(len(rows)) if pools.encoders is None else np.asarray(pools.encoders, float)
        self.s_enc = np.zeros(len(rows))          # seconds an encoder instance takes a request: encode + send
        if pools.encoders is not None:
            embed = pools.transfer(np.asarray(pools.embed_bytes, float)[:, None], rows)[:, 0]
            self.s_enc = np.where(self.enc > 0, pools.encode_s + embed, 0.0)
            x_enc = np.where(self.s_enc > 0, self.enc / np.maximum(self.s_enc, 1e-300), np.inf)
            self.capacity = np.minimum(self.capacity, x_enc)

    def _encoder_delay(self, x, at) -> np.ndarray:
        """Seconds [A'] before a request of points ``at`` at ``x`` requests/s reaches the prefill pool:
        the encoder pool's M/D/1 wait, the encoding and the embeddings' send (0 without an encoder pool)."""
        s, e = self.s_enc[at], self.enc[at]
        return np.where(e > 0, mg1_wait(x / np.maximum(e, 1e-300), s, s * s) + s, 0.0)

    def _decode_iteration(self, b, at) -> np.ndarray:
        """Seconds of a decode-only iteration of ``b`` sequences on points ``at``."""
        zero = np.zeros(len(at))
        return _priced(self.dit, self.rows[at], b, b * self.ctx[at], zero, zero, zero)

    def at(self, x, at) -> dict:
        """Metrics of points ``at`` at throughput ``x`` [A'] (below capacity): TTFT, TPOT and
        end-to-end means and mixtures, the decode engines' running batch."""
        load, cls, pools = self.load.take(at), self.cls.take(at), self.load.pools
        pcls = self.pcls.take(at)
        m = _mixed(load, pcls, self.it, self.rows[at], self.cap_p[at], rate=x / pools.prefill[at])
        first = _mixing_mixtures(m, pcls, 0.0)
        wait = mg1_wait(x / pools.prefill[at], self.s1[at], self.s2[at])
        b, t_d = self._decode_batch(x / pools.decode[at], at)
        after = wait[:, None] + self.xfer[at] + cls.steps * t_d[:, None]      # first token to last, [A', K]
        steps = np.maximum(cls.steps, 1.0)
        tpot_k = after / steps
        decoding = np.where(cls.steps > 0, cls.weight, 0.0)
        tpot = (tpot_k * decoding).sum(axis=1) / np.maximum(decoding.sum(axis=1), 1e-300)
        ttft_k, ttft_sd = first["ttft_class"]
        enc = self._encoder_delay(x, at)
        e2e = ttft_k + enc[:, None] + after
        zero = np.zeros_like(e2e)
        w = np.broadcast_to(cls.weight, e2e.shape)
        e2e_sd = np.sqrt(ttft_sd ** 2 + cls.gen_var * t_d[:, None] ** 2)
        return {"ttft": first["ttft"] + enc, "tpot": tpot, "e2e": e2e @ cls.weight, "b": b,
                "ttft_mix": _with_queue(first["ttft_mix"], enc), "tpot_mix": (tpot_k, zero, decoding),
                "e2e_mix": (e2e, e2e_sd, w)}

    def waves(self, conc, at) -> dict:
        """A closed loop of ``conc`` requests [A'] of one length class at points ``at``: they
        move in waves, as many as the prefill instances take in one iteration together (the
        requests a decode engine finishes together come back together), spread over the
        engines of both pools: each prefill instance prefills its share in one iteration,
        sends their KV one after another, and the decode engines run the rest. Returns x (requests/s), the queue
        before the prefill pool (past its capacity) and the metrics of ``at``."""
        load, cls, pools = self.load.take(at), self.cls.take(at), self.load.pools
        c, pairs = cls.work[:, 0], cls.pairs[:, 0]
        per_iteration = np.maximum(np.floor(load.token_budget / c), 1.0) * pools.prefill[at]
        wave = np.minimum(conc, per_iteration)
        # a wave leaves a decode engine together; spread over the engines of both pools (each request
        # to the least-loaded), a prefill engine sees its share of one engine's share
        each = np.maximum(wave / (pools.prefill[at] * pools.decode[at]), 1.0)
        zero = np.zeros(len(at))
        t_p = _priced(self.it, self.rows[at], zero, zero, each * c, each * pairs, each)
        e = self.enc[at]                                       # the wave's encodings, one after another
        t_p = t_p + np.where(e > 0, self.s_enc[at] * (np.maximum(wave / np.maximum(e, 1e-300), 1.0) + 1.0) / 2.0, 0.0)
        xfer = self.xfer[at][:, 0]
        link = xfer * (each + 1.0) / 2.0                       # the wave's transfers, one after another
        steps = cls.steps[:, 0]
        b = conc / pools.decode[at]
        for _ in range(_DECODE_FIXED_POINT):
            t_d = self._decode_iteration(np.maximum(b, 1e-9), at)
            cycle = t_p + link + steps * t_d
            b = np.minimum(conc / pools.decode[at] * steps * t_d / cycle, self.cap_d[at])
        t_d = self._decode_iteration(np.maximum(b, 1e-9), at)
        cycle = t_p + link + steps * t_d
        x = np.minimum(conc / cycle, self.capacity[at] * (1.0 - 1e-9))
        queue = np.maximum(conc / x - cycle, 0.0)
        after = link + xfer + steps * t_d
        e2e = t_p + after
        tpot = np.where(steps > 0, after / np.maximum(steps, 1.0), t_d)
        one, none = np.ones((len(at), 1)), np.zeros((len(at), 1))
        return {"x": x, "queue": queue, "ttft": t_p, "tpot": tpot, "e2e": e2e, "b": b,
                "ttft_mix": (t_p[:, None], none, one), "tpot_mix": (tpot[:, None], none, one),
                "e2e_mix": (e2e[:, None], none, one)}

    def _decode_batch(self, rate, at) -> tuple[np.ndarray, np.ndarray]:
        """(running batch, iteration seconds) of decode engines of points ``at`` at ``rate``
        requests/s each: b = rate x E[G - 1] x T(b), by a damped fixed point."""
        b = np.minimum(np.maximum(rate * self.es[at] * self._decode_iteration(np.ones(len(at)), at), 1e-9),
                       self.cap_d[at])
        live = np.arange(len(at))
        for _ in range(_DECODE_FIXED_POINT):
            if not len(live):
                break
            t = self._decode_iteration(b[live], at[live])
            new = np.minimum(rate[live] * self.es[at[live]] * t, self.cap_d[at[live]])
            settled = np.isclose(new, b[live], rtol=1e-9, atol=1e-12)
            b[live] = 0.5 * (b[live] + new)
            live = live[~settled]
        return b, self._decode_iteration(np.maximum(b, 1e-9), at)


def disaggregated_state(load: Load, iteration_time: IterationTime) -> dict[str, np.ndarray]:
    """``dse.core.serving.steady_state`` of disaggregated points (``load.pools`` given): the
    same metrics (running_batch and kv_utilization of a decode engine)."""
    n = len(load.kv_block)
    rows = np.arange(n)
    st = _Stages(load, iteration_time, rows)
    closed = np.isfinite(load.concurrency)
    rate = np.nan_to_num(load.request_rate, nan=0.0)
    conc = np.nan_to_num(load.concurrency, nan=1.0)
    top = st.capacity * (1.0 - 1e-9)
    x = np.where(closed, 0.0, np.minimum(rate, top))
    saturated = ~closed & (rate >= st.capacity)
    queue = np.zeros(n)
    c = np.flatnonzero(closed)
    waved = None
    if len(c) and len(st.cls.weight) == 1:     # one length class: waves
        waved = st.waves(conc[c], c)
        x[c], queue[c] = waved["x"], waved["queue"]
        c = c[:0]
    if len(c):          # X x E[e2e](X) = N, by bisection; past the capacity the rest queue
        full = st.at(top[c], c)
        over = top[c] * full["e2e"] <= conc[c]
        x[c[over]] = top[c[over]]
        queue[c[over]] = conc[c[over]] / top[c[over]] - full["e2e"][over]
        live = c[~over]
        lo, hi = np.zeros(len(live)), top[live].copy()
        for _ in range(_BISECT):
            if not len(live):
                break
            mid = 0.5 * (lo + hi)
            short = mid * st.at(mid, live)["e2e"] < conc[live]
            lo, hi = np.where(short, mid, lo), np.where(short, hi, mid)
        x[live] = 0.5 * (lo + hi)
    r = st.at(np.maximum(x, 1e-12), rows)
    if waved is not None:
        r = _merge(r, waved, np.flatnonzero(closed))
    cls = st.cls
    ttft = np.where(saturated, np.inf, r["ttft"] + queue)
    mix = {"ttft_mix": _with_queue(r["ttft_mix"], queue), "tpot_mix": r["tpot_mix"],
           "e2e_mix": _with_queue(r["e2e_mix"], queue)}
    g_mean, p_mean = cls.mean(cls.gen), cls.mean(cls.prompt)
    out = {
        "ttft_s": ttft,
        "tpot_s": r["tpot"],
        "e2e_latency_s": np.where(saturated, np.inf, r["e2e"] + queue),
        "queue_s": np.where(saturated, np.inf, queue),
        "requests_per_s": np.where(saturated, st.capacity, x),
        "output_tokens_per_s": np.where(saturated, st.capacity, x) * g_mean,
        "total_tokens_per_s": np.where(saturated, st.capacity, x) * (g_mean + p_mean),
        "running_batch": np.where(saturated, st.cap_d, r["b"]),
        "kv_utilization": np.minimum((r["b"] * st.held_d + cls.shared_blocks) / np.maximum(st.dload.kv_blocks, 1.0), 1.0),
        "saturated": saturated,
    }
    out.update(_percentiles(mix, saturated))
    return out


def _merge(r: dict, part: dict, idx) -> dict:
    """Metrics ``r`` with rows ``idx`` replaced by ``part`` (arrays, and mixtures by ``_assign``)."""
    out = {}
    for k, v in r.items():
        if isinstance(v, tuple):
            out[k] = _assign(v, idx, part[k])
        else:
            out[k] = v.copy()
            out[k][idx] = part[k]
    return out


def disaggregated_goodput(load: Load, iteration_time: IterationTime, slo_ttft, slo_tpot, percentile) -> np.ndarray:
    """``dse.core.serving.goodput`` of disaggregated points: the largest request rate
    (requests/s, [P]) whose TTFT and TPOT percentiles meet the SLOs (0 or NaN: none)."""
    n = len(load.kv_block)
    rows = np.arange(n)
    st = _Stages(load, iteration_time, rows)
    ttft_slo = np.where(np.nan_to_num(slo_ttft) > 0, slo_ttft, np.inf)
    tpot_slo = np.where(np.nan_to_num(slo_tpot) > 0, slo_tpot, np.inf)
    q = np.asarray(percentile, float)

    def meets(x, at):
        r = st.at(x, at)
        return ((_row_quantile(r["ttft_mix"], q[at]) <= ttft_slo[at])
                & (_row_quantile(r["tpot_mix"], q[at]) <= tpot_slo[at]))

    return largest_rate(meets, st.capacity, _BISECT // 2)


__all__ = ["disaggregated_state", "disaggregated_goodput", "mg1_wait"]
