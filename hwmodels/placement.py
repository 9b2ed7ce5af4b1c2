"""Where tensors live: placement of weights, activations and KV cache over the device
memory and the tier behind it (host DRAM over the host link, a CXL expander, NVMe).

Policies:
- ``none``: everything in device memory (the footprint must fit).
- ``greedy``: activations stay on the device; then the KV cache, then the weights
  fill what is left; whatever overflows goes to the host tier.
- explicit fractions per tensor class placed on the host tier, as FlexGen's policy
  does: ``{"weights": 0.5, "kv": 0.2, "activations": 0.0}``.

Everything here works on arrays of design points (bytes per device); the fit test
``fits_within`` is the one every part of dse uses.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from basis.errors import DseError

CLASSES = ("weights", "activations", "kv")
#: relative slack of the fit test: a sum that fills a tier exactly still fits
FIT_TOLERANCE = 1e-12


def parse_policy(text) -> str | dict:
    """'none' | 'greedy' | 'weights=0.5,kv=0.2[,activations=0]' -> policy (a dict of
    fractions for the explicit form); DseError on bad input."""
    if isinstance(text, dict):
        return text
    t = str(text).strip().lower()
    if t in ("none", "greedy"):
        return t
    out = {}
    for part in t.split(","):
        key, eq, val = part.partition("=")
        key = key.strip()
        if not eq or key not in CLASSES:
            raise DseError(f"offload '{text}': expected none, greedy, or fractions like weights=0.5,kv=0.2 "
                           f"(classes: {', '.join(CLASSES)})")
        if key in out:          # else the last would win without a word
            raise DseError(f"offload '{text}': {key} given twice; give each class once")
        try:
            f = float(val) if val.isascii() else float("not ASCII")     # float() reads '١'
        except ValueError:
            raise DseError(f"offload '{text}': {key} fraction '{val}' is not a number") from None
        if not 0 <= f <= 1:
            raise DseError(f"offload '{text}': {key} fraction must be in [0, 1], got {f}")
        out[key] = f
    return out


def policy_name(policy) -> str:
    """The canonical text of a parsed policy: 'none', 'greedy' or 'weights=0.5,kv=0.2'."""
    if isinstance(policy, str):
        return policy
    return ",".join(f"{c}={policy[c]:g}" for c in CLASSES if c in policy) or "none"


def fits_within(need, capacity):
    """need <= capacity, allowing the rounding of a sum that fills a tier exactly (scalars or arrays)."""
    return need <= capacity * (1 + FIT_TOLERANCE)


def greedy_fractions(weights, activations, kv, capacity):
    """Fractions (weights, activations, KV) [..., 3] in the host tier under the greedy
    policy: activations stay on the device; the KV cache, then the weights, fill what is
    left of ``capacity``; the rest overflows. Works on scalars or arrays (bytes)."""
    w, a, k, cap = (np.asarray(x, dtype=float) for x in (weights, activations, kv, capacity))
    left = np.maximum(cap - a, 0.0)
    kv_dev = np.minimum(k, left)
    w_dev = np.minimum(w, left - kv_dev)
    with np.errstate(divide="ignore", invalid="ignore"):
        fw = np.where(w > 0, 1 - w_dev / w, 0.0)
        fk = np.where(k > 0, 1 - kv_dev / k, 0.0)
    return np.stack(np.broadcast_arrays(fw, np.zeros_like(fw), fk), axis=-1)


@dataclass(frozen=True)
class Placement:
    """Where the footprint of each design point lives (arrays over points, bytes per device).

    fractions: [P, 3] share of weights, activations and KV cache in the host tier.
    device_bytes, host_bytes: what each tier holds for one device.
    host_need: host-tier bytes of the whole system (the devices sharing one host memory).
    """

    fractions: np.ndarray
    device_bytes: np.ndarray
    host_bytes: np.ndarray
    host_need: np.ndarray

    def memory_violation(self, capacity, host_capacity) -> np.ndarray:
        """How far the fullest tier is over its capacity, as a fraction of it (<= 0: fits)."""
        cap = np.asarray(capacity, dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            if (cap > 0).all():
                dev = self.device_bytes / cap - 1
            else:
                dev = np.where(cap > 0, self.device_bytes / cap - 1, np.where(self.device_bytes > 0, np.inf, -1.0))
            if self.host_empty:                           # nothing in the host tier: the device's alone
                return np.maximum(dev, -np.inf)
            hcap = np.nan_to_num(np.asarray(host_capacity, dtype=float), nan=0.0)
            host = np.where(self.host_need > 0, np.where(hcap > 0, self.host_need / hcap - 1, np.inf), -np.inf)
        return np.maximum(dev, host)

    def device_fits(self, capacity) -> np.ndarray:
        return fits_within(self.device_bytes, np.asarray(capacity, dtype=float))

    @cached_property
    def host_empty(self) -> bool:
        """True when no point puts anything in the host tier (NaN needs count as something)."""
        return bool((np.asarray(self.host_need) <= 0).all())

    def host_fits(self, host_capacity) -> np.ndarray:
        if self.host_empty:                               # nothing in the host tier
            return np.ones(np.broadcast(self.host_need, host_capacity).shape, dtype=bool)
        hcap = np.nan_to_num(np.asarray(host_capacity, dtype=float), nan=0.0)
        return (self.host_need <= 0) | fits_within(self.host_need, hcap)


def place(policy, weights, activations, kv, capacity, devices=1) -> Placement:
    """Place a per-device footprint (bytes per class, arrays over points) under ``policy``
    (a parsed policy: 'none', 'greedy' or a dict of fractions) on devices of ``capacity``
    bytes; ``devices`` of a system share one host memory."""
    if policy == "none":                  # all on the devices: a footprint as given, nothing in the host tier
        parts = [np.asarray(x, dtype=float) for x in (weights, activations, kv, capacity)]
        shape = np.broadcast(*parts).shape
        zeros = np.broadcast_to(0.0, shape)
        return Placement(np.broadcast_to(0.0, shape + (3,)), np.broadcast_to(parts[0] + parts[1] + parts[2], shape),
                         zeros, zeros if np.ndim(devices) == 0 else np.broadcast_to(0.0, np.broadcast(zeros, devices).shape))
    w, a, k, cap = np.broadcast_arrays(*(np.asarray(x, dtype=float) for x in (weights, activations, kv, capacity)))
    if policy == "greedy":
        frac = greedy_fractions(w, a, k, cap)
    else:                                 # fractions per class: scalars, or arrays over points
        frac = np.stack(np.broadcast_arrays(*(np.asarray(policy.get(c, 0.0), dtype=float) for c in CLASSES),
                                            w), axis=-1)[..., :3]
    host = w * frac[..., 0] + a * frac[..., 1] + k * frac[..., 2]
    return Placement(frac, w + a + k - host, host, host * np.asarray(devices, dtype=float))
