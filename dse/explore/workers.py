"""The processes of an Optuna search: signals, worker processes, heartbeats and clocks.

- Signals. SIGINT and SIGTERM are handled alike (``Stop``): the current batch (milliseconds)
  is finished and told, then the run stops with ``Interrupted`` ("interrupted after N of M
  trials").
- Workers (``run_workers``). With ``workers > 1`` the parent spawns them, forwards a stop
  to them (SIGTERM), waits for them and kills any that do not stop in ``STOP_WAIT_S``.
  Workers die with their parent however it dies (``die_with_parent``): on Linux through
  ``PR_SET_PDEATHSIG`` (the kernel sends SIGTERM), elsewhere (and as a fallback) a watchdog
  thread that sees the parent process id change; a worker then finishes its batch and
  exits, and exits hard after ``STOP_WAIT_S`` if it cannot.
- Heartbeats (SQLAlchemy storages). ``Heartbeat`` records, every interval, the heartbeat of
  the trials a worker runs; ``reap_stale`` fails RUNNING trials whose heartbeat is older
  than the grace period and gives a first heartbeat to RUNNING trials first seen here, so
  that a trial left by a process killed before its first beat goes stale in turn.
- ``WorkerClock``: the seconds a worker spent evaluating and writing the journal, shared
  with its parent.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

from basis.errors import DseError
from dse.explore.storage import storage_errors

STOP_WAIT_S = 20.0     # how long a stop may take before workers are killed / exit hard
TICK_S = 0.2           # how often the parent of worker processes wakes while they run (s)
_EXIT_INTERRUPTED, _EXIT_ERROR, _EXIT_ORPHANED = 130, 2, 143


class Interrupted(DseError):
    """The study stopped on SIGINT/SIGTERM after telling its last batch."""


def interrupted(n: int, trials: int) -> Interrupted:
    """The Interrupted error of a study stopped with ``n`` of its ``trials`` complete."""
    if n >= trials:
        return Interrupted(f"interrupted after all {trials:,} trials were complete; run the same command again to "
                           f"write the results")
    return Interrupted(f"interrupted after {n:,} of {trials:,} trials; run the same command again to resume")


class Stop:
    """SIGINT/SIGTERM (handled alike): finish the batch in hand, then stop (``requested``)."""

    def __init__(self):
        self.requested = False
        self.signum = None
        self._old = {}

    def __enter__(self):
        for s in (signal.SIGINT, signal.SIGTERM):
            try:
                self._old[s] = signal.signal(s, self._handle)
            except ValueError:       # not the main thread
                pass
        return self

    def _handle(self, signum, frame):
        self.requested = True
        self.signum = signum

    def __exit__(self, *exc):
        for s, h in self._old.items():
            signal.signal(s, h)


class WorkerClock:
    """Seconds a worker spent inside dse's evaluation and writing the journal file, and its
    study (in this process); with ``shared`` (a multiprocessing Array of ``3 * workers``
    doubles) every update is also written to the worker's ``slot`` there, for its parent."""

    FIELDS = ("evaluation_s", "journal_write_s", "journal_writes")

    def __init__(self, shared=None, slot: int = 0):
        self.values = dict.fromkeys(self.FIELDS, 0.0)
        self.shared, self.slot = shared, slot
        self.study = None

    def add(self, name: str, seconds: float) -> None:
        self.set(name, self.values[name] + seconds)

    def set(self, name: str, value: float) -> None:
        self.values[name] = value
        if self.shared is not None:
            self.shared[len(self.FIELDS) * self.slot + self.FIELDS.index(name)] = value

    @classmethod
    def totals(cls, shared, workers: int) -> dict:
        """{field: its sum over the ``workers`` slots of ``shared``}."""
        n = len(cls.FIELDS)
        return {f: sum(shared[n * i + k] for i in range(workers)) for k, f in enumerate(cls.FIELDS)}


# ------------------------------------------------------------ heartbeats (SQLAlchemy storages)

def _running_numbers(study) -> list[int]:
    from optuna.trial import TrialState
    return [t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))]


class Heartbeat:
    """A thread recording, every interval, the heartbeat of the trials this worker runs
    (``running``: their numbers). ``storage``: the study's storage if it records heartbeats
    (``dse.explore.storage.heartbeat_storage``), else None (no thread).

    A batch takes milliseconds, so most batches are told before the first beat; a trial
    of a batch killed before any beat has no heartbeat and is given one by the first
    process that sees it (``reap_stale``)."""

    def __init__(self, storage, study_id: int | None):
        self.storage, self.study_id = storage, study_id
        self._numbers: list[int] = []
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = None

    def __enter__(self):
        if self.storage is not None:
            self.interval = float(self.storage.get_heartbeat_interval())
            self._thread = threading.Thread(target=self._run, name="dse-heartbeat", daemon=True)
            self._thread.start()
        return self

    def running(self, numbers) -> None:
        """The trials (numbers) this worker runs from now on."""
        with self._lock:
            self._numbers = list(numbers)

    def _run(self):
        while not self._done.wait(self.interval):
            with self._lock:
                numbers = list(self._numbers)
            for n in numbers:
                try:
                    self.storage.record_heartbeat(self.storage.get_trial_id_from_study_id_trial_number(
                        self.study_id, n))
                except (*storage_errors(), KeyError):   # a concurrent first beat, a network blip: next time
                    pass

    def __exit__(self, *exc):
        self._done.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


def reap_stale(study, storage, seen: set) -> int:
    """Fail the study's RUNNING trials whose heartbeat is older than the grace period, and
    give a first heartbeat to RUNNING trials not ``seen`` here before (so that one left
    with no heartbeat goes stale in turn if nobody runs it). ``storage``: the study's
    storage if it records heartbeats, else None (nothing to do). Returns how many RUNNING
    trials are left."""
    import optuna
    if storage is None:
        return len(_running_numbers(study))
    try:
        optuna.storages.fail_stale_trials(study)
    except (*storage_errors(), optuna.exceptions.UpdateFinishedTrialError):   # raced by another process
        pass
    running = _running_numbers(study)
    sid = storage.get_study_id_from_name(study.study_name)
    for n in running:
        if n in seen:
            continue
        seen.add(n)
        try:
            storage.record_heartbeat(storage.get_trial_id_from_study_id_trial_number(sid, n))
        except (*storage_errors(), KeyError):     # a concurrent first beat: it has one
            pass
    return len(running)


# ------------------------------------------------------------ worker processes

def die_with_parent(parent_pid: int) -> None:
    """Make this worker stop when its parent dies, however it dies: SIGTERM from the kernel
    on Linux (PR_SET_PDEATHSIG), and a watchdog thread everywhere that sees the parent
    process id change. SIGTERM makes the worker finish its batch and exit; if it has not
    exited ``STOP_WAIT_S`` later, the watchdog ends it."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            PR_SET_PDEATHSIG = 1
            libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        except (OSError, AttributeError):    # no libc or no prctl: the watchdog alone
            pass

    def orphaned() -> bool:
        return os.getppid() != parent_pid

    def watch():
        while not orphaned():
            time.sleep(0.25)
        try:
            os.kill(os.getpid(), signal.SIGTERM)
        except OSError:
            pass
        time.sleep(STOP_WAIT_S)
        os._exit(_EXIT_ORPHANED)

    if orphaned():             # the parent died before the death signal was armed
        os._exit(_EXIT_ORPHANED)
    threading.Thread(target=watch, name="dse-parent-watchdog", daemon=True).start()


def worker_main(target, args: tuple, parent_pid: int | None = None, shared=None, slot: int = 0) -> None:
    """A worker process: ``target(*args, clock=WorkerClock(shared, slot))`` until done; exit
    130 when interrupted, 2 with the error's line on stderr when it raises a DseError."""
    if parent_pid is not None:
        die_with_parent(parent_pid)
    try:
        target(*args, clock=WorkerClock(shared, slot))
    except Interrupted:
        os._exit(_EXIT_INTERRUPTED)
    except DseError as e:
        print(f"dse.study: error: {e}", file=sys.stderr)
        os._exit(_EXIT_ERROR)


def run_workers(target, args_of, workers: int, on_failure=None, on_tick=None):
    """Run ``workers`` spawned processes, worker ``i`` running ``target(*args_of(i), clock=...)``
    (``worker_main``), to the end or until a stop; return (whether SIGINT/SIGTERM stopped
    them, the exit codes of workers that failed, their ``WorkerClock`` totals). On a stop or
    a failure the others are sent SIGTERM (they finish their batch) and killed after
    ``STOP_WAIT_S``; ``on_failure()`` runs first after a failure (a killed worker may hold
    a lock). ``on_tick()`` (e.g. progress) runs each time this thread wakes while they run:
    when one exits, else every ``TICK_S`` seconds. Workers are started by this thread:
    PR_SET_PDEATHSIG fires when it exits, so call this from the thread that lives as long as
    the run."""
    import multiprocessing as mp
    from multiprocessing.connection import wait
    ctx = mp.get_context("spawn")
    shared = ctx.Array("d", len(WorkerClock.FIELDS) * workers, lock=False)   # a slot each: no lock to die holding
    procs = [ctx.Process(target=worker_main, name=f"dse-worker-{i}",
                         args=(target, args_of(i), os.getpid(), shared, i))
             for i in range(workers)]
    failed, stopping_since, ended = [], None, False
    with Stop() as stop:
        try:
            for p in procs:
                if stop.requested:
                    break
                p.start()
            started = [p for p in procs if p.pid is not None]
            while True:
                alive = [p for p in started if p.exitcode is None]
                if not alive:
                    break
                wait([p.sentinel for p in alive], timeout=TICK_S)
                if on_tick is not None:
                    on_tick()
                for p in started:
                    stopped_by_us = stopping_since is not None and p.exitcode in (-signal.SIGTERM, -signal.SIGKILL)
                    if p.exitcode not in (None, 0, _EXIT_INTERRUPTED) and not stopped_by_us \
                            and p not in [q for q, _ in failed]:
                        failed.append((p, p.exitcode))
                if (stop.requested or failed) and stopping_since is None:
                    stopping_since = time.monotonic()
                    if failed and on_failure is not None:
                        on_failure()
                    for p in started:
                        if p.exitcode is None:
                            p.terminate()       # SIGTERM: the worker finishes its batch and exits
                if stopping_since is not None and time.monotonic() - stopping_since > STOP_WAIT_S:
                    for p in started:
                        if p.exitcode is None:
                            p.kill()
            ended = True
        finally:
            if not ended:         # this process is stopping on an error: leave no worker behind
                for p in procs:
                    if p.pid is not None and p.exitcode is None:
                        p.kill()
            for p in procs:
                if p.pid is not None:
                    p.join(timeout=STOP_WAIT_S)
    return stop.requested, [c for _, c in failed], WorkerClock.totals(shared, workers)
