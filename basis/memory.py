"""How a process whose job is evaluating design points asks malloc to treat the memory it frees.

An evaluation allocates and frees arrays of its table's size by the hundred. By default glibc
hands large freed blocks back to the system, and the next array of that size faults fresh
zeroed pages in again: on a virtual machine a page fault costs microseconds, so a megabyte
array costs about a millisecond before a byte of it is computed. ``keep_freed_memory`` keeps
them for the next arrays instead."""
from __future__ import annotations

import ctypes

#: glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3


def keep_freed_memory() -> None:
    """Let this process's malloc (glibc) keep the large blocks it frees for the next ones
    instead of handing them back to the system and faulting fresh zeroed pages in again. It
    saves the kernel time of those page faults (a third of a sweep process's system time, ~10 %
    of a sweep's wall time with two processes on two cores, 10-15 % of ``evaluate``'s time when
    every point is its own workload; the peak memory stays the same). For processes whose job
    is evaluating (``dse run``'s sweep processes, the benchmarks, a script pricing large tables):
    what is freed stays with the process, for its next arrays, until it ends (up to 1 GiB of free
    heap is kept). Elsewhere than glibc, nothing."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(M_MMAP_THRESHOLD, 256 << 20)      # blocks below 256 MiB from the heap, not mmap
    mallopt(M_TRIM_THRESHOLD, 1 << 30)        # the heap's free top returned past 1 GiB only
    mallopt(M_TOP_PAD, 64 << 20)              # and grown 64 MiB at a time


__all__ = ["keep_freed_memory"]
