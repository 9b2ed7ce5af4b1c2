"""The bytes a collective puts on each device's link, one rule for every layer that prices it
(the reference and fast kernels, the energy of link traffic, the kernel layer's NCCL model)."""
from __future__ import annotations


def allreduce_share(n):
    """Bytes each of ``n`` devices sends per byte of message in a ring all-reduce (a reduce-scatter
    then an all-gather, each moving (n - 1) / n of it): 2 (n - 1) / n; 0 for one device. Broadcasts."""
    return 2 * (n - 1) / n
