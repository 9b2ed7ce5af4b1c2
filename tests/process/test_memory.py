"""basis.memory: a process that keeps what malloc frees (``dse.keep_freed_memory``) has a large
freed array's memory still in its heap for the next arrays, where by default glibc hands it back
to the system (and faults fresh pages in for the next). Checked in a fresh interpreter each, from
glibc's own count of the free bytes its heap holds (mallinfo2)."""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import pytest
from conftest import ROOT

FREED_MIB = 64

PROBE = f"""
import ctypes, sys
import numpy as np
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
if sys.argv[1] == "keep":
    import dse
    dse.keep_freed_memory()
a = np.ones({FREED_MIB} << 17)          # {FREED_MIB} MiB of float64
del a
print(libc.mallinfo2().fordblks >> 20)
"""


def _glibc_mallinfo2() -> bool:
    try:
        return hasattr(ctypes.CDLL(None), "mallinfo2")
    except OSError:
        return False


def _free_heap_mib(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], cwd=ROOT, capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not _glibc_mallinfo2(), reason="needs glibc's mallinfo2 (glibc >= 2.33)")
def test_a_process_that_keeps_freed_memory_has_a_freed_array_left_in_its_heap():
    assert _free_heap_mib("keep") >= FREED_MIB
    assert _free_heap_mib("default") < FREED_MIB       # glibc's default: a block this large goes back at once


EXIT_PROBE = """
import atexit, gc, sys
from basis.memory import free_nothing_at_exit
class Held:
    def __del__(self):                      # runs only if the cycle it is in is collected
        sys.stdout.write("collected\\n")
atexit.register(lambda: sys.stdout.write(f"frozen at exit: {gc.get_freeze_count() > 0}\\n"))
if sys.argv[1] == "free-nothing":
    free_nothing_at_exit()
    free_nothing_at_exit()
h = Held()
h.self = h                                  # a reference cycle: garbage once h is gone
del h
gc.disable()                                # (so no collection happens before the exit)
print("handlers", atexit._ncallbacks())
"""


def _exit_probe(mode: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", EXIT_PROBE, mode], cwd=ROOT, capture_output=True, text=True,
                         check=True)
    assert out.stderr == ""
    return out.stdout.splitlines()


def test_a_run_leaves_its_garbage_to_the_system_at_exit_and_still_runs_every_exit_handler():
    # by default the interpreter's last collection finds the cycle; registered (twice: once counts),
    # gc.freeze runs at exit after the handlers registered later and before those collections
    assert _exit_probe("default") == ["handlers 1", "frozen at exit: False", "collected"]
    assert _exit_probe("free-nothing") == ["handlers 2", "frozen at exit: True"]


ARROW_PROBE = """
import sys
if sys.argv[1] == "imported-before":
    import pyarrow
from basis.memory import keep_freed_memory
keep_freed_memory()
import os, subprocess, pyarrow
child = subprocess.run([sys.executable, "-c", "import pyarrow; print(pyarrow.default_memory_pool().backend_name)"],
                       capture_output=True, text=True, check=True).stdout.strip()
print(pyarrow.default_memory_pool().backend_name, child)
"""


@pytest.mark.parametrize("when", ["imported-before", "imported-after"])
def test_a_process_that_keeps_freed_memory_has_arrow_and_its_children_allocate_from_malloc(when):
    # Arrow's own default is jemalloc (mimalloc on some builds), never 'system'
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    out = subprocess.run([sys.executable, "-c", "import pyarrow; print(pyarrow.default_memory_pool().backend_name)"],
                         cwd=ROOT, capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() != "system"
    out = subprocess.run([sys.executable, "-c", ARROW_PROBE, when], cwd=ROOT, capture_output=True, text=True,
                         check=True, env=env)
    assert out.stdout.split() == ["system", "system"]
