"""Where tensors live: placement of weights, activations and KV cache over the
device memory and the host tier behind the host link.

Policies:
- ``none``: everything in device memory (the footprint must fit).
- ``greedy``: activations stay on the device; then the KV cache, then the weights
  fill what is left; whatever overflows goes to the host tier.
- explicit fractions per tensor class placed on the host tier, as FlexGen's policy
  does: ``{"weights": 0.5, "kv": 0.2, "activations": 0.0}``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from basis.errors import DseError
from hwmodels.device import Device

CLASSES = ("weights", "activations", "kv")


@dataclass(frozen=True)
class Placement:
    """Fractions of each tensor class in the host tier and what each tier holds (bytes)."""

    policy: str
    offload: tuple[float, float, float]   # weights, activations, kv
    device_bytes: float
    host_bytes: float
    fits: bool
    why: str = ""


def parse_policy(text: str) -> str | dict:
    """'none' | 'greedy' | 'weights=0.5,kv=0.2[,activations=0]' -> policy; DseError on bad input."""
    t = str(text).strip().lower()
    if t in ("none", "greedy"):
        return t
    out = {}
    for part in t.split(","):
        key, eq, val = part.partition("=")
        key = key.strip()
        if not eq or key not in CLASSES:
            raise DseError(f"--offload '{text}': expected none, greedy, or fractions like weights=0.5,kv=0.2 "
                           f"(classes: {', '.join(CLASSES)})")
        try:
            f = float(val)
        except ValueError:
            raise DseError(f"--offload '{text}': {key} fraction '{val}' is not a number") from None
        if not 0 <= f <= 1:
            raise DseError(f"--offload '{text}': {key} fraction must be in [0, 1], got {f}")
        out[key] = f
    return out


def fits_within(need, capacity):
    """need <= capacity, allowing the rounding of a sum that fills a tier exactly (scalars or arrays)."""
    return need <= capacity * (1 + 1e-12)


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


def place(weights: float, activations: float, kv: float, device: Device, policy="none",
          devices: int = 1) -> Placement:
    """Place a per-device footprint (bytes per class) on ``device`` under ``policy``;
    the ``devices`` of a system share one host memory."""
    if isinstance(policy, str):
        policy = parse_policy(policy)
    cap = device.memory.capacity_bytes
    total = weights + activations + kv
    if policy == "none":
        fits = total <= cap
        why = "" if fits else (f"needs {total / 1e9:.2f} GB per device (weights {weights / 1e9:.2f} GB, KV cache "
                               f"{kv / 1e9:.2f} GB, activations {activations / 1e9:.2f} GB) but {device.name} has "
                               f"{cap / 1e9:.2f} GB")
        return Placement("none", (0.0, 0.0, 0.0), total, 0.0, fits, why)
    missing = [k for k in ("host_link", "host_memory") if getattr(device, k) is None]
    if missing:
        raise DseError(f"hardware '{device.name}' names no {' or '.join(missing)}, so nothing can be offloaded "
                       f"(--offload {policy if isinstance(policy, str) else 'fractions'})")
    if policy == "greedy":
        frac = tuple(float(f) for f in greedy_fractions(weights, activations, kv, cap))
        name = "greedy"
    else:
        frac = tuple(float(policy.get(c, 0.0)) for c in CLASSES)
        name = ",".join(f"{c}={policy[c]:g}" for c in CLASSES if c in policy)
    host = weights * frac[0] + activations * frac[1] + kv * frac[2]
    dev = total - host
    hcap = device.host_memory.capacity_bytes
    why = ""
    if not fits_within(dev, cap):
        why = f"device part {dev / 1e9:.2f} GB exceeds {device.name}'s {cap / 1e9:.2f} GB"
    elif not fits_within(host * devices, hcap):
        why = (f"host part {host * devices / 1e9:.2f} GB ({devices} x {host / 1e9:.2f} GB) exceeds the host "
               f"memory's {hcap / 1e9:.2f} GB")
    return Placement(name, frac, dev, host, not why, why)
