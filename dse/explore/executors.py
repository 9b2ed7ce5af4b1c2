"""Where a sweep's chunks run: in this process, on worker processes of this machine, or on
a Dask distributed cluster of many machines. Each runs ``task(spec, k, arg)`` for the chunks
``k`` asked and yields the results as they finish (in any order); the caller decides what
they mean. ``arg`` is read from ``arg_of(here)`` when a chunk is handed out (``here``: the
chunk runs in this process), so it can carry what the sweep learnt meanwhile (its sample
threshold) and what to do where (encode rows in the worker, or leave that to this process).

- Processes (``workers`` > 1): a ``ProcessPoolExecutor`` of ``workers`` processes of the
  'forkserver' context (forked from a clean server process that has imported the task's
  module; 'spawn' where there is no forkserver). The spec is sent once per worker.
  Workers ignore Ctrl-C (the parent stops them), end as soon as their parent ends, however
  it ends, and write no file: a killed parent leaves nothing half-written, and no process.
- Dask (``scheduler``, an address such as ``tcp://host:8786``): the spec is scattered to
  every worker once; each chunk is a task. The workers need ``dse`` installed.

At most ``IN_FLIGHT`` chunks per worker process or Dask thread are handed out at a time, so
finished results wait in memory in bounded number. A worker that dies, or a Dask task that
fails, reaches the caller as a one-line DseError.
"""
from __future__ import annotations

import collections
import functools
import multiprocessing
import multiprocessing.forkserver
import os
import select
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool

from basis.errors import DseError
from basis.memory import keep_freed_memory

#: seconds to wait for a Dask scheduler to answer
CONNECT_S = 10
#: chunks handed out per worker process or Dask thread at a time
IN_FLIGHT = 2

_worker: dict = {}          # in a worker process: the task and the spec it runs on


def run_tasks(task: Callable, spec, ks: Iterable[int], arg_of: Callable[[bool], object], workers: int = 1,
              scheduler: str | None = None) -> Iterator:
    """The results of ``task(spec, k, arg_of(here))`` for each chunk ``k`` of ``ks``, as they
    finish (``here``: whether chunk ``k`` runs in this process): in this process (``workers``
    1), on ``workers`` worker processes, or on the Dask cluster of ``scheduler``."""
    ks = list(ks)
    if scheduler is not None:
        return _on_dask(task, spec, ks, arg_of, scheduler)
    if workers > 1 and len(ks) > 1:
        return _on_processes(task, spec, ks, arg_of, min(workers, len(ks)))
    return (task(spec, k, arg_of(True)) for k in ks)


# ---------------------------------------------------------------- processes of this machine

def _context():
    """The multiprocessing context of the worker processes: forkserver, else spawn."""
    try:
        return multiprocessing.get_context("forkserver")
    except ValueError:
        return multiprocessing.get_context("spawn")


def exit_with(parent: int) -> None:
    """End this process as soon as process ``parent`` ends: a thread waits on a pidfd
    (Linux), else checks every second. (A forkserver's children cannot rely on the parent
    death signal: their parent is the server, which lives while they do.)"""
    try:
        fd = os.pidfd_open(parent)
        wait_for_exit = functools.partial(select.select, [fd], [], [])
    except (AttributeError, OSError):
        def wait_for_exit():
            while _alive(parent):
                time.sleep(1.0)
    threading.Thread(target=lambda: (wait_for_exit(), os._exit(1)), daemon=True).start()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        pass
    return True


#: the module whose ``chunk_task`` a sweep's worker processes run (``dse.explore.sweep``), named
#: here so that the server they fork from can be started before this process imports it
SWEEP_MODULE = "dse.explore.sweep"


def start_server(module: str = SWEEP_MODULE) -> None:
    """Start now the server that worker processes fork from ('forkserver'; nothing where there
    is none), with ``module`` imported. A run that will hand its chunks to worker processes
    calls this as soon as it knows so: the server's own start (a fresh interpreter importing
    the sweep's modules, ~0.6 s) then overlaps with this process's start (its imports, the
    study file) instead of coming between it and the first chunk."""
    ctx = _context()
    if ctx.get_start_method() == "forkserver":
        ctx.set_forkserver_preload([module])
        multiprocessing.forkserver.ensure_running()


def _start_worker(task: Callable, spec, parent: int) -> None:
    """Initializer of a worker process: keep the task and spec; leave Ctrl-C to the parent
    and end with it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    exit_with(parent)
    keep_freed_memory()
    _worker.update(task=task, spec=spec)


def _in_worker(k: int, arg):
    """Run the worker's task on chunk ``k``; its result."""
    return _worker["task"](_worker["spec"], k, arg)


def _on_processes(task: Callable, spec, ks: list[int], arg_of: Callable, workers: int) -> Iterator:
    """A pool of ``workers`` processes at work; this one hands out chunks and gathers the
    results. (Measured on 2 cores: better than this process running chunks too, which then
    wait on its bookkeeping.)"""
    ctx = _context()
    if ctx.get_start_method() == "forkserver":
        ctx.set_forkserver_preload([task.__module__])      # workers fork from a server that imported it
    pool = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_start_worker,
                               initargs=(task, spec, os.getpid()))
    todo, running = collections.deque(ks), {}
    try:
        while todo or running:
            while todo and len(running) < IN_FLIGHT * workers:
                k = todo.popleft()
                running[pool.submit(_in_worker, k, arg_of(False))] = k
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for f in sorted(done, key=running.get):
                k = running.pop(f)
                try:
                    result = f.result()
                except BrokenProcessPool:
                    raise DseError(f"a worker process died while evaluating chunk {k} (killed, or out of memory: "
                                   f"try fewer --workers or a smaller chunk_size); finished chunks are kept, run "
                                   f"the same command again to resume") from None
                yield result
    finally:
        stop_pool(pool)


def stop_pool(pool: ProcessPoolExecutor) -> None:
    """Shut ``pool`` down now: queued chunks cancelled, running ones stopped."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    if hasattr(pool, "terminate_workers"):          # Python 3.14
        pool.terminate_workers()
    for p in processes:
        if p.is_alive():
            p.terminate()
    for p in processes:
        p.join(5)


# ---------------------------------------------------------------- a Dask distributed cluster

def _distributed():
    """The ``distributed`` package; DseError saying how to install it."""
    try:
        import distributed
    except ImportError:
        raise DseError("--scheduler needs Dask distributed, which is not installed: pip install "
                       "'dse-llm[distributed]'") from None
    return distributed


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def _on_dask(task: Callable, spec, ks: list[int], arg_of: Callable, scheduler: str) -> Iterator:
    distributed = _distributed()
    if not ks:
        return
    try:                                 # a malformed address fails here, before a Client exists to clean up
        scheme, where = distributed.comm.addressing.parse_address(scheduler)
        distributed.comm.addressing.parse_host_port(where)
    except (ValueError, TypeError) as e:
        raise DseError(f"--scheduler {scheduler}: expected a Dask scheduler address such as tcp://HOST:8786 "
                       f"({_first_line(e)})") from None
    try:
        client = distributed.Client(scheduler, timeout=CONNECT_S, set_as_default=False)
    # no such host, refused, timed out (OSError; Dask's CommClosedError is one), a bad address
    # or a version Dask refuses (ValueError, TypeError, RuntimeError): the user's to fix
    except (OSError, ValueError, TypeError, RuntimeError) as e:
        raise DseError(f"--scheduler {scheduler}: cannot connect to a Dask scheduler ({_first_line(e)})") from None
    tag = uuid.uuid4().hex[:12]
    futures = []
    try:
        threads = max(sum(client.nthreads().values()), 1)
        shared = client.scatter(spec, broadcast=True, hash=False)
        todo = iter(ks)

        def submit():
            k = next(todo, None)
            if k is None:
                return None
            f = client.submit(task, shared, k, arg_of(False), key=f"dse-chunk-{tag}-{k}", pure=False)
            futures.append(f)
            return f
        first = [f for f in (submit() for _ in range(IN_FLIGHT * threads)) if f is not None]
        ready = distributed.as_completed(first, loop=client.loop)
        for f in ready:
            try:
                result = f.result()
            except DseError:
                raise
            # a process boundary: a worker on another machine fails in its own environment (dse
            # missing there, other versions) with any exception; the run says it in one line
            except Exception as e:  # noqa: BLE001
                raise DseError(f"--scheduler {scheduler}: a Dask worker failed on a chunk ({_first_line(e)}); "
                               f"finished chunks are kept, run the same command again to resume") from None
            f = submit()
            if f is not None:
                ready.add(f)
            yield result
    finally:
        client.cancel([f for f in futures if not f.done()])
        client.close()
