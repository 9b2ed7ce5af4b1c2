"""Scheduling policies of an in-flight-batching engine, one object read by both the simulator
(``dse.core.simulator``: which waiting request is admitted next, which one is dropped) and the
steady-state model (``dse.core.serving``'s figures turned into per-class ones here).

- **FCFS** (``Fcfs``): requests are admitted in arrival order (vLLM's default; today's engine,
  bit-identical: the simulator's queue and the model's figures are untouched).
- **Priority classes** (``PriorityClasses``): a share ``high_share`` of the requests (spread evenly
  over them: request i is high when floor((i + 1) s) > floor(i s)) is high priority, admitted before
  any waiting low-priority request; a request admitted runs to its end (non-preemptive: a high
  request never evicts a running low one). The steady-state model keeps the FCFS engine's
  figures and re-divides its admission wait W (the seconds a request waits behind the prompts
  ahead of it) between the classes by the textbook non-preemptive priority queue (Cobham 1954):
  in an M/G/1 queue of load rho = sum_k rho_k, class k (1 = highest) waits
  W_k = W_0 / ((1 - sigma_{k-1})(1 - sigma_k)), sigma_k = rho_1 + ... + rho_k, and FCFS waits
  W = W_0 / (1 - rho); so W_k = W (1 - rho) / ((1 - sigma_{k-1})(1 - sigma_k)) (their rate-weighted
  mean is W again: Kleinrock's conservation law). rho is the point's rate over its capacity (the
  largest rate the engine serves), each class's rho_k its share of it.
- **SLO-aware admission** (``SloAdmission``): a request still waiting for admission when its
  wait reaches what its TTFT SLO leaves after its own prefill (``patience_s``) is dropped (it could
  no longer meet the SLO; dropping it costs no engine time). The model (``impatient_share``): the
  M/G/1+D loss (1 - u) G / (1 - u G) (Boots and Tijms 1999; exact for one server with u = rho), G the
  FCFS engine's own probability of waiting past tau for admission (its admission-wait mixture:
  the iteration in progress, then the prompts ahead; ``dse.core.serving.admission_tail``), u the
  load times the share of that wait which is prompts queued ahead (the part a drop removes: a
  batch engine's arrival mostly waits for the iteration in progress, which no drop shortens), both
  at the rate the engine admits, lambda (1 - p) (a reduced-load fixed point: the engine serves only
  what it admits). M/M/1+D's closed form (``dropped_share``:
  (1 - rho) rho e^(-theta tau) / (1 - rho^2 e^(-theta tau)), theta = mu - lambda) is its M/M/1 case.

Sources (facts, not code): A. Cobham, "Priority assignment in waiting line problems", J. Operations
Research Society of America 2(1), 1954 (non-preemptive priority M/G/1); L. Kleinrock, "Queueing
Systems, vol. II", 1976, sec. 3.4-3.6 (conservation law, Cobham's formula); F. Baccelli, P. Boyer,
G. Hebuterne, "Single-server queues with impatient customers", Adv. Appl. Prob. 16, 1984 (M/M/1+D,
the abandonment probability above); P. Boots, H. Tijms, "A multiserver queueing system with
impatient customers", Management Science 45(3), 1999 (the loss (1 - rho) pi(tau) / (1 - rho pi(tau)),
pi(tau) the delay probability beyond tau without impatience; exact for M/G/1+D); F. Kelly, "Loss
networks", Ann. Appl. Prob. 1(3), 1991 (the reduced-load fixed point); vLLM's scheduler (FCFS, and its 'priority' policy: lower
value first, ties by arrival).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from basis.errors import DseError

#: the policies' codes, in the order of ``dse.system.params.SCHEDULERS``
FCFS, PRIORITY, SLO_ADMISSION = 0, 1, 2
#: request classes: high priority first (lower value first, as vLLM's priority policy)
HIGH, LOW = 0, 1


@dataclass(frozen=True)
class Fcfs:
    """First come, first served: one class, nothing dropped."""

    code = FCFS
    classes = 1
    reorders = False         # the simulator's queue keeps arrival order
    drops = False            # nothing is refused

    def priority(self, index: int) -> int:
        """The class of the ``index``-th request (0: the only one)."""
        return HIGH

    def shares(self) -> np.ndarray:
        """Each class's share of the requests [K]."""
        return np.ones(1)

    def dropped(self, waited_s: float) -> bool:
        """Whether a request that has waited ``waited_s`` seconds for admission is dropped."""
        return False


@dataclass(frozen=True)
class PriorityClasses(Fcfs):
    """Two classes: ``high_share`` of the requests (in (0, 1)) admitted before the others."""

    high_share: float = 0.1
    code = PRIORITY
    classes = 2
    reorders = True

    def __post_init__(self):
        s = self.high_share
        if isinstance(s, bool) or not isinstance(s, (int, float, np.integer, np.floating)) or not 0 < s < 1:
            raise DseError(f"scheduler: priority_share must be a number in (0, 1), got {s!r}")

    def priority(self, index: int) -> int:
        s = float(self.high_share)
        return HIGH if np.floor((index + 1) * s) > np.floor(index * s) else LOW

    def shares(self) -> np.ndarray:
        return np.array([float(self.high_share), 1.0 - float(self.high_share)])


@dataclass(frozen=True)
class SloAdmission(Fcfs):
    """One class; a request waiting ``patience_s`` seconds (> 0) for admission is dropped."""

    patience_s: float = 1.0
    code = SLO_ADMISSION
    drops = True

    def __post_init__(self):
        p = self.patience_s
        if isinstance(p, bool) or not isinstance(p, (int, float, np.integer, np.floating)) or not 0 < p < np.inf:
            raise DseError(f"scheduler: the admission patience must be a finite number of seconds > 0, got {p!r}")

    def dropped(self, waited_s: float) -> bool:
        return waited_s >= float(self.patience_s)


def cobham_waits(w0, rho_k) -> np.ndarray:
    """Mean waits (seconds, [..., K]) of the K classes (highest first) of a non-preemptive priority
    M/G/1 queue: W_0 / ((1 - sigma_{k-1})(1 - sigma_k)), ``w0`` [...] the mean residual work found
    (sum of lambda_k E[S_k^2] / 2, seconds), ``rho_k`` [..., K] each class's load; inf where
    sigma_k >= 1 (that class saturated)."""
    rho_k = np.asarray(rho_k, dtype=float)
    sigma = np.cumsum(rho_k, axis=-1)
    before = sigma - rho_k
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.asarray(w0, dtype=float)[..., None] / ((1.0 - before) * (1.0 - sigma))
    return np.where(sigma < 1.0, out, np.inf)


def priority_waits(wait_fcfs, rho, shares) -> np.ndarray:
    """Each class's mean admission wait (seconds, [P, K]) under non-preemptive priority, from the
    FCFS engine's ``wait_fcfs`` [P] (seconds) at load ``rho`` [P] (rate over capacity, in [0, 1)) with
    the classes' ``shares`` [K] of the requests (highest first): Cobham's W_k with W_0 = W (1 - rho)."""
    rho = np.clip(np.asarray(rho, dtype=float), 0.0, 1.0)
    w0 = np.asarray(wait_fcfs, dtype=float) * (1.0 - rho)
    return cobham_waits(w0, rho[:, None] * np.asarray(shares, dtype=float)[None, :])


def dropped_share(wait_fcfs, rho, patience_s) -> np.ndarray:
    """The share [P] of requests an M/M/1+D queue drops at a fixed ``patience_s`` [P] (seconds):
    (1 - rho) rho e^(-theta tau) / (1 - rho^2 e^(-theta tau)), theta = rho / W (``wait_fcfs``, the
    FCFS queue's mean wait, seconds; 0: no queue, nothing dropped); rho >= 1: the share the overload
    leaves unserved at least (1 - 1 / rho)."""
    rho = np.asarray(rho, dtype=float)
    w = np.asarray(wait_fcfs, dtype=float)
    tau = np.asarray(patience_s, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        e = np.exp(-np.where(w > 0, rho / w, np.inf) * tau)
        share = (1.0 - rho) * rho * e / (1.0 - rho ** 2 * e)
    share = np.where(w > 0, np.nan_to_num(share, nan=0.0), 0.0)
    return np.where(rho >= 1.0, np.maximum(1.0 - 1.0 / np.maximum(rho, 1e-300), 0.0), np.clip(share, 0.0, 1.0))


def impatient_share(tail, rho, queued_share) -> np.ndarray:
    """The share [P] of requests dropped at a fixed patience by a queue whose FCFS wait exceeds the
    patience with probability ``tail`` [P] (G): (1 - u) G / (1 - u G), u = ``rho`` x ``queued_share``
    [P] (the load times the share of the wait that is work queued ahead, which a dropped request
    takes away). With u = rho (an M/G/1 queue: every wait is work ahead) this is the exact loss of
    M/G/1+D (Boots and Tijms 1999, for one server; M/M/1+D's closed form ``dropped_share`` with
    G = rho e^(-(mu - lambda) tau)); with u = 0 (arrivals wait only for the iteration in progress,
    which no drop shortens) it is G itself."""
    g = np.clip(np.asarray(tail, dtype=float), 0.0, 1.0)
    u = np.clip(np.nan_to_num(np.asarray(rho, dtype=float) * np.asarray(queued_share, dtype=float), nan=0.0,
                              posinf=0.0), 0.0, 1.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = (1.0 - u) * g / (1.0 - u * g)
    return np.where(g >= 1.0, 1.0, np.nan_to_num(out, nan=0.0))


def policy(code: int, high_share: float = 0.1, patience_s: float = 1.0) -> Fcfs:
    """The policy object of a scheduler ``code`` (``FCFS``, ``PRIORITY``, ``SLO_ADMISSION``)."""
    if code == FCFS:
        return Fcfs()
    if code == PRIORITY:
        return PriorityClasses(high_share)
    if code == SLO_ADMISSION:
        return SloAdmission(patience_s)
    raise DseError(f"scheduler: a scheduler code must be 0 (fcfs), 1 (priority) or 2 (slo-admission), got {code!r}")


def priority_ttft(ttft, wait_fcfs, rho, high_share) -> tuple[np.ndarray, np.ndarray]:
    """(the high class's mean TTFT, the low class's) [P], seconds: the FCFS engine's ``ttft`` [P] with
    its admission wait ``wait_fcfs`` [P] replaced by each class's (``priority_waits``, two classes,
    ``high_share`` [P] of the requests high) at load ``rho`` [P]."""
    share = np.asarray(high_share, dtype=float)
    rho = np.clip(np.asarray(rho, dtype=float), 0.0, 1.0)
    w = np.asarray(wait_fcfs, dtype=float)
    w0 = np.where(np.isfinite(w), w, 0.0) * (1.0 - rho)
    k = cobham_waits(w0, np.stack([rho * share, rho * (1.0 - share)], axis=-1))
    base = np.asarray(ttft, dtype=float) - np.where(np.isfinite(w), w, 0.0)
    hi, lo = base + k[..., 0], base + k[..., 1]
    return np.where(np.isfinite(w), hi, np.inf), np.where(np.isfinite(w), lo, np.inf)


def class_ttft_mixes(ttft_mix, wait_parts, wait_fcfs, rho, high_share) -> tuple[tuple, tuple]:
    """(the high class's TTFT mixture, the low class's), each (mean, sd, weight) [A, J] seconds, of
    non-preemptive priority classes (``high_share`` [A] of the requests high) at load ``rho`` [A]:
    the FCFS engine's ``ttft_mix`` with the wait behind others in each of its components
    (``wait_parts``: mean and second moment [A, J], seconds; their landing-weighted mean
    ``wait_fcfs`` [A]) scaled by the class's W_k / W (``priority_waits``, Cobham): the class waits
    as FCFS does, stretched or shrunk so that its mean is Cobham's (the shape of an M/G/1 wait is
    kept, its scale is the class's; each component's wait variance scales by the square)."""
    mean, sd, weight = (np.asarray(a, dtype=float) for a in ttft_mix)
    w1, w2 = (np.asarray(a, dtype=float) for a in wait_parts)
    w = np.asarray(wait_fcfs, dtype=float)
    share = np.asarray(high_share, dtype=float)
    rho_c = np.clip(np.asarray(rho, dtype=float), 0.0, 1.0)
    waits = cobham_waits(np.where(np.isfinite(w), w, 0.0) * (1.0 - rho_c),
                         np.stack([rho_c * share, rho_c * (1.0 - share)], axis=-1))
    out = []
    for c in (0, 1):
        with np.errstate(invalid="ignore", divide="ignore"):
            r = np.where(w > 0, waits[:, c] / w, 1.0)[:, None]
            var_w = np.maximum(w2 - w1 ** 2, 0.0)
            shift = np.where(w1 > 0, (r - 1.0) * w1, 0.0)
            spread = np.where(var_w > 0, (r ** 2 - 1.0) * var_w, 0.0)
        out.append((mean + shift, np.sqrt(np.maximum(sd ** 2 + spread, 0.0)), weight))
    return out[0], out[1]

