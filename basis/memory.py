"""How a process whose job is evaluating design points asks malloc to treat the memory it frees.

An evaluation allocates and frees arrays of its table's size by the hundred. By default glibc
hands large freed blocks back to the system, and the next array of that size faults fresh
zeroed pages in again: on a virtual machine a page fault costs microseconds, so a megabyte
array costs about a millisecond before a byte of it is computed. ``keep_freed_memory`` keeps
them for the next arrays instead, and has Arrow (Parquet reading and writing) allocate from
that same heap."""
from __future__ import annotations

import atexit
import ctypes
import functools
import gc
import os
import sys

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
    heap is kept); Arrow allocates from that heap too (``arrow_from_malloc``). Elsewhere than
    glibc, nothing."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(M_MMAP_THRESHOLD, 256 << 20)      # blocks below 256 MiB from the heap, not mmap
    mallopt(M_TRIM_THRESHOLD, 1 << 30)        # the heap's free top returned past 1 GiB only
    mallopt(M_TOP_PAD, 64 << 20)              # and grown 64 MiB at a time
    arrow_from_malloc()


def arrow_from_malloc() -> None:
    """Have Arrow allocate from malloc (its 'system' memory pool) instead of its own jemalloc, in
    this process and in the processes it starts (``ARROW_DEFAULT_MEMORY_POOL``): the buffers of
    the Parquet files a sweep writes and its report reads then reuse the heap the evaluation
    freed (``keep_freed_memory``) instead of faulting fresh pages in. ``dse run gpu-sweep-1m``, 10
    interleaved runs each: median wall 2.98 s against 3.10 s with jemalloc; its largest process's
    peak memory 728-739 MiB against 764-771 MiB."""
    os.environ["ARROW_DEFAULT_MEMORY_POOL"] = "system"
    arrow = sys.modules.get("pyarrow")       # imported already (pandas imports it): switch its default now
    if arrow is not None:
        arrow.set_memory_pool(arrow.system_memory_pool())


@functools.cache
def free_nothing_at_exit() -> None:
    """At this process's exit, leave what it holds to the operating system, which takes the whole
    heap back at once, instead of having the interpreter's last garbage collections walk and
    free it object by object. Registers ``gc.freeze`` to run at exit (atexit handlers run
    before those collections; files, pools and the other atexit handlers are closed as before:
    only garbage in reference cycles is left uncollected). For a process whose job ends with
    its command (``dse run``): after a 1,016,064-point sweep and its report the exit took
    0.22-0.31 s, and 0.06-0.07 s with this. Registered once however often it is called."""
    atexit.register(gc.freeze)

__all__ = ["arrow_from_malloc", "free_nothing_at_exit", "keep_freed_memory"]
