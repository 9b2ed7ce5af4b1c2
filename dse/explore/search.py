"""Optuna multi-objective search over a design space (``method: optuna``).

Trials are asked in population-sized batches, the batch is evaluated at once by the
vectorized evaluator, and every trial is told its objective values. Presets named in
the space are enqueued first as baselines (user attr ``baseline``: the preset's name).

What a study shows (in optuna-dashboard or through Optuna's API):

- Its Optuna name is the study's ``name`` (``study_name``), so one shared storage holds one
  Optuna study per dse study. A storage holding a study created before studies were named
  (Optuna name ``"dse"``, ``LEGACY_STUDY_NAME``) with the same space (fingerprint) resumes
  under that old name; one with another space is left alone and a new study is created.
- Objectives are named (``study.metric_names``: the objective keys, in the study's order).
- Each complete trial carries as user attrs every metric of the evaluated design that is a
  finite number (``dse.system.evaluator.METRICS``, SI units: ``ttft_s`` s, ``tpot_s`` s,
  ``memory_bytes`` bytes per device, ``output_tokens_per_s`` tokens/s, ``devices``, ...), the
  same values as its row in ``results.parquet``; ``feasible`` (bool); and for an
  infeasible design ``reason`` (the key stored in ``results.parquet``, e.g.
  ``device_memory`` or ``tpot_s > 0.1``) and ``why`` (the sentence, as ``dse analyze`` says it).
- Constraints (fits in memory, runs at all, the study's SLOs and budgets) are the trial
  system attr ``constraints``: a list of violations, <= 0 satisfied, the format Optuna's
  ``constraints_func`` writes and optuna-dashboard reads; the study user attr
  ``constraint_names`` names its entries. Every sampler reads them through
  ``FrozenTrial.constraints`` (Optuna 5; ``constraints_func`` is deprecated there and is
  not used), so infeasible designs are never in ``study.best_trials``. An infeasible
  design keeps its own (finite) objective values; NaN or infinite ones become a very bad
  finite value (``_finite``).
- Parameters have the distributions the space declares (``distributions``): choices are
  categorical (names as strings), integer ranges IntDistribution, float ranges
  FloatDistribution with ``log`` for log-scaled ranges, values in SI units.

The per-trial records (user attrs and constraints of a batch) are written in one storage
write per batch (``_record``), not one per attribute: a journal file fsyncs every write.
With the default journal file a whole population (its asks, records and tells) reaches
the file in one write and one fsync (``dse.explore.optuna_journal``): the population runs
against the journal held in memory, under the ask lock, and is written whole at its end, so
a killed run resumes from the last population written whole (a torn write is cut at the
next start) and the file holds the same records Optuna writes op by op (plus one study
system attr per population, ``dse:population``). Worker processes on one journal take
turns, a population each (the sampler ran one at a time already); SQLAlchemy storages
(SQLite, PostgreSQL) are written as before, op by op, each worker evaluating its batch
while the others ask theirs. ``DSE_JOURNAL_BATCH=0`` writes the journal op by op too.

Time. ``rows.attrs["trials"]`` (and the last stderr line of a run that is not quiet) says
how the run's wall time went: ``wall_s`` (this ``run_search``), ``evaluation_s`` (inside
dse's vectorized evaluation, summed over workers), ``evaluation_share`` (evaluation_s over
wall_s times the worker processes) and ``journal_write_s`` (writing and fsyncing the
journal file; None for other storages).

Storage: by default a journal file inside the run folder (``optuna.journal``, no
server, opens in optuna-dashboard); ``--storage`` takes any SQLAlchemy URL (SQLite
file, PostgreSQL) so that worker processes on many machines share one study. An
in-memory SQLite (``sqlite:///:memory:``) is refused: workers cannot share it and a
rerun cannot resume it. A URL that cannot be opened is one DseError line; passwords
never appear in messages (``display_url``).

Exact counts. Each batch's rows are written to ``chunks/`` before its trials are told,
and the study stops at exactly ``trials`` complete trials: a rerun after an
interruption resumes with the trials still missing. Counting the trials and asking the
next batch is one critical section among the processes asking trials of the study
(``_AskLock``: a file lock in the run folder for a journal, beside the database for
SQLite, a PostgreSQL advisory lock), so workers never ask beyond the target. Where no
such lock spans every asking process (another database, runs on other machines), a
trial asked beyond the target is told PRUNED with the user attr ``discarded`` saying
why, never evaluated and never FAIL. A trial left RUNNING by a killed process is marked
failed (FAIL) and replaced by a new one:

- journal file: at the start of a run, since the run folder is locked by its run (no
  other process can be using its journal), every RUNNING trial is a killed run's; a
  journal lock file left by a killed writer is removed at once instead of waiting
  Optuna's 30 s grace period.
- SQLAlchemy storages: other machines may be running trials of the same study, so a
  RUNNING trial is failed only when its heartbeat is older than a grace period. Each
  worker records the heartbeat of the trials it runs every ``HEARTBEAT_S`` seconds
  (env ``DSE_HEARTBEAT_S``); a trial whose heartbeat is older than ``GRACE_S`` (env
  ``DSE_HEARTBEAT_GRACE_S``, default three intervals) is stale. A RUNNING trial with no
  heartbeat at all (killed within its first interval, or left by an older version) is
  given one when first seen, so it too goes stale a grace period later. A run that
  has its target minus such trials waits for them (saying so on stderr), fails them,
  and replaces them.

Processes. SIGINT and SIGTERM are handled alike: the current batch (milliseconds) is
finished and told, then the run stops with "interrupted after N of M trials", N the
study's complete trials at that moment. With ``workers > 1`` the parent forwards the
stop to its workers (SIGTERM), waits for them and kills any that do not stop in
``STOP_WAIT_S``. Workers die with their parent however it dies: on Linux through
``PR_SET_PDEATHSIG`` (the kernel sends SIGTERM), elsewhere (and as a fallback) a
watchdog thread that sees the parent process id change; a worker then finishes its
batch and exits, and exits hard after ``STOP_WAIT_S`` if it cannot.

Shared studies. ``trial_counts`` gives the states of the study's trials and how many of
the complete ones have a row in this run folder. Each run folder's ``results.parquet``
(and so its Pareto front and report) holds the trials evaluated by that folder's
workers only; with one ``--storage`` shared by runs with different ``--out`` folders
the study's other complete trials have their rows in those folders. ``run_search``
says so on stderr and in ``rows.attrs["trials"]``; the Optuna study itself (in the
shared storage) holds every trial's parameters and objective values.
"""
from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import threading
import time
import uuid
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from basis.errors import DseError
from dse.explore import optuna_journal as journal_mod
from dse.explore.runio import Progress, write_atomic
from dse.explore.space import PARAMS
from dse.explore.spec import SAMPLERS
from dse.explore.sweep import COUNTS, evaluate_columns
from dse.system.evaluator import METRICS
from hwmodels.presets import load_device

try:                       # POSIX file locks (the ask lock); elsewhere the beyond-target check alone
    import fcntl
except ImportError:        # pragma: no cover (Windows)
    fcntl = None

HEARTBEAT_S = 10.0     # seconds between heartbeats of running trials (SQLAlchemy storages)
GRACE_S = None         # a heartbeat older than this marks a trial stale; None: 3 * HEARTBEAT_S
STOP_WAIT_S = 20.0     # how long a stop may take before workers are killed / exit hard
_ENV_HEARTBEAT, _ENV_GRACE = "DSE_HEARTBEAT_S", "DSE_HEARTBEAT_GRACE_S"
#: the Optuna name of a study with no ``name`` (a SweepSpec built in Python), and of every
#: study created before studies were named; such a run folder or storage still resumes
LEGACY_STUDY_NAME = "dse"
#: trial system attr holding the constraint violations (list, <= 0 satisfied): Optuna's key
CONSTRAINTS_ATTR = "constraints"


def _optuna():
    import optuna
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    # heartbeats are recorded here for asked trials (ask/tell, not Study.optimize)
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
    return optuna


def make_sampler(name: str, seed: int, population: int | None):
    """The Optuna sampler called ``name`` with an explicit seed."""
    optuna = _optuna()
    import warnings
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    pop = population or 50
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(population_size=pop, seed=seed)
    if name == "nsga3":
        return optuna.samplers.NSGAIIISampler(population_size=pop, seed=seed)
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "qmc":
        return optuna.samplers.QMCSampler(seed=seed, qmc_type="sobol", scramble=True)
    raise DseError(f"sampler '{name}' is not one of {', '.join(SAMPLERS)}")


def distributions(space) -> tuple[dict, dict]:
    """(Optuna distributions of the varying parameters, constant parameters)."""
    optuna = _optuna()
    dists, fixed = {}, {}
    for a in space.axes:
        if len(a.values) == 1 and not a.is_range:
            fixed[a.name] = a.values[0]
        elif a.is_range:
            if a.low == a.high:
                fixed[a.name] = a.values[0] if a.values else (int(a.low) if PARAMS[a.name] is int else a.low)
            elif PARAMS[a.name] is int:
                dists[a.name] = optuna.distributions.IntDistribution(int(a.low), int(a.high), log=a.log)
            else:
                dists[a.name] = optuna.distributions.FloatDistribution(a.low, a.high, log=a.log)
        else:
            dists[a.name] = optuna.distributions.CategoricalDistribution(list(a.values))
    return dists, fixed


def display_url(url: str | None) -> str | None:
    """``url`` with its password masked (``***``), for messages: user:secret@host becomes
    user:***@host, and a password given as a query parameter is masked too."""
    if url is None:
        return None
    shown = None
    try:
        from sqlalchemy.engine import make_url
        u = make_url(url)
        if u.password is not None:
            shown = u.render_as_string(hide_password=True)
    except Exception:         # not parseable by SQLAlchemy (or no SQLAlchemy): mask by pattern
        pass
    if shown is None:
        shown = re.sub(r"(://[^/?#@]*?:)[^/?#@]*@", r"\1***@", str(url))
    return re.sub(r"(?i)([?&](?:password|passwd|pwd)=)[^&#]*", r"\1***", shown)


def _scrub(text: str, url: str) -> str:
    """``text`` (an error message about ``url``) with the URL and its password masked."""
    text = text.replace(url, display_url(url))
    secrets = []
    try:
        from sqlalchemy.engine import make_url
        u = make_url(url)
        secrets = [u.password] + [v for k, v in u.query.items() if k.lower() in ("password", "passwd", "pwd")]
    except Exception:
        m = re.search(r"://[^/?#@]*?:([^/?#@]*)@", url)
        secrets = [m.group(1)] if m else []
    for secret in secrets:
        if isinstance(secret, str) and len(secret) >= 4:     # shorter: masked where the URL is, only
            text = text.replace(secret, "***")
    return text


def heartbeat_settings() -> tuple[float, float]:
    """(heartbeat interval, grace period) in seconds: ``HEARTBEAT_S`` and ``GRACE_S``,
    overridden by the environment variables DSE_HEARTBEAT_S and DSE_HEARTBEAT_GRACE_S
    (the environment reaches spawned workers; module constants would not)."""
    def env(name, default):
        v = os.environ.get(name)
        if v in (None, ""):
            return default
        try:
            f = float(v)
        except ValueError:
            f = -1.0
        if not (f > 0 and np.isfinite(f)):
            raise DseError(f"{name}={v!r}: expected a positive number of seconds")
        return f
    interval = env(_ENV_HEARTBEAT, float(HEARTBEAT_S))
    grace = env(_ENV_GRACE, float(GRACE_S) if GRACE_S else 3.0 * interval)
    if grace <= interval:
        raise DseError(f"heartbeat grace period {grace:g} s must be longer than its interval {interval:g} s")
    return interval, grace


def _check_url(url: str) -> None:
    """DseError (one line, password masked) for a URL that cannot hold a shared, resumable study."""
    shown = display_url(url)
    if "://" not in url:
        raise DseError(f"--storage '{shown}': expected an SQLAlchemy URL such as sqlite:///study.db or "
                       f"postgresql://user@host/db")
    try:
        from sqlalchemy.engine import make_url
        u = make_url(url)
    except ImportError:
        return
    except Exception as e:
        raise DseError(f"--storage '{shown}': not a valid SQLAlchemy URL ({_scrub(_first_line(e), url)})") from None
    if u.get_backend_name() == "sqlite":
        db = u.database or ""
        if db in ("", ":memory:") or db.startswith("file::memory:") or "mode=memory" in db \
                or u.query.get("mode") == "memory":
            raise DseError(f"--storage '{shown}': an in-memory SQLite database cannot be shared by worker "
                           f"processes nor resumed by a rerun; use a file URL such as sqlite:///study.db")
        path = db[5:].split("?")[0] if db.startswith("file:") else db
        parent = Path(path).expanduser().parent
        if not parent.is_dir():
            raise DseError(f"--storage '{shown}': no such folder {parent} for the SQLite file")


def _first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[0] if lines else type(e).__name__


def open_storage(url: str | None, out: Path):
    """The study storage: a journal file in ``out`` by default, else an SQLAlchemy URL
    (an RDBStorage with heartbeats, see ``heartbeat_settings``)."""
    optuna = _optuna()
    if url is None:
        return journal_mod.open_journal(out / "optuna.journal")
    _check_url(url)
    interval, grace = heartbeat_settings()
    try:
        return optuna.storages.RDBStorage(_with_installed_driver(url), heartbeat_interval=interval, grace_period=grace)
    except Exception as e:    # unknown dialect, driver missing, server down, bad URL: one line
        msg = _scrub(_first_line(e), url)
        if isinstance(e, ImportError):
            cause = _scrub(_first_line(e.__cause__ or e), url)
            msg = f"its database driver is not installed ({cause})"
            if url.startswith("postgres"):
                msg += "; pip install -e '.[postgres]' and use postgresql+psycopg2://..."
        raise DseError(f"--storage '{display_url(url)}': cannot open: {msg}") from None


def _with_installed_driver(url: str) -> str:
    """``url`` with an installed PostgreSQL driver when it names none: SQLAlchemy 2.1
    defaults to psycopg 3, the ``postgres`` extra installs psycopg2."""
    import importlib.util
    try:
        from sqlalchemy.engine import make_url
        u = make_url(url)
    except Exception:
        return url
    if u.drivername == "postgresql" and importlib.util.find_spec("psycopg") is None \
            and importlib.util.find_spec("psycopg2") is not None:
        return u.set(drivername="postgresql+psycopg2").render_as_string(hide_password=False)
    return url


def _baselines(space) -> list[tuple[str, dict]]:
    """(preset name, parameters) of each preset named in the space, for the ranges that
    contain its own figures."""
    hw = next(a for a in space.axes if a.name == "hardware")
    out = []
    for name in hw.values:
        d = load_device(name)
        own = {"memory_bandwidth": d.memory.bandwidth_bytes_per_s, "memory_capacity": d.memory.capacity_bytes,
               **{f"peak_{c}": v for c, v in d.peak_ops_per_s.items()}}
        p = {"hardware": name} if len(hw.values) > 1 else {}
        for a in space.axes:
            if a.is_range and a.name in own and a.low <= own[a.name] <= a.high and a.low < a.high:
                p[a.name] = own[a.name]
        if p:
            out.append((name, p))
    return out


class Interrupted(DseError):
    """The study stopped on SIGINT/SIGTERM after telling its last batch."""


def _interrupted(n: int, trials: int) -> Interrupted:
    if n >= trials:
        return Interrupted(f"interrupted after all {trials:,} trials were complete; run the same command again to "
                           f"write the results")
    return Interrupted(f"interrupted after {n:,} of {trials:,} trials; run the same command again to resume")


class _Stop:
    """SIGINT/SIGTERM (handled alike): finish the batch in hand, then stop."""

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


def _count(study, states) -> int:
    return len(study.get_trials(deepcopy=False, states=states))


def study_name(spec) -> str:
    """The Optuna name a new study of ``spec`` gets: the study's ``name`` (its file's
    ``name``, else the file's stem), or ``LEGACY_STUDY_NAME`` for a spec without one."""
    return spec.name or LEGACY_STUDY_NAME


def stored_study_name(storage, spec) -> str:
    """The Optuna name of ``spec``'s study in ``storage``: ``study_name(spec)``, unless the
    study of that name is not this space's (or does not exist) and the storage holds a
    study of this space (same fingerprint) created before studies were named
    (``LEGACY_STUDY_NAME``), which is then resumed."""
    name, fingerprint = study_name(spec), spec.fingerprint()
    if name == LEGACY_STUDY_NAME:
        return name
    new = _study_id(storage, name)
    if new is not None and storage.get_study_user_attrs(new).get("fingerprint") in (None, fingerprint):
        return name
    old = _study_id(storage, LEGACY_STUDY_NAME)
    if old is not None and storage.get_study_user_attrs(old).get("fingerprint") == fingerprint:
        return LEGACY_STUDY_NAME
    return name


def _study_id(storage, name: str) -> int | None:
    try:
        return storage.get_study_id_from_name(name)
    except KeyError:
        return None


def _open_study(spec, out: Path, storage_url: str | None, study_name: str, seed: int):
    """Create or load the study (schema, directions, objective names, fingerprint,
    baselines enqueued once)."""
    optuna = _optuna()
    storage = open_storage(storage_url, out)
    names = list(spec.objectives)
    directions = ["maximize" if spec.objectives[k] == "max" else "minimize" for k in names]
    sampler = make_sampler(spec.sampler, seed, spec.population)
    study = optuna.create_study(study_name=study_name, storage=storage, sampler=sampler, directions=directions,
                                load_if_exists=True)
    if study.user_attrs.get("fingerprint") not in (None, spec.fingerprint()):
        raise DseError(f"storage already holds a study '{study_name}' with another space; use another --out "
                       f"or --storage")
    if study.metric_names != names:
        study.set_metric_names(names)
    if not study.user_attrs.get("baselines_enqueued"):
        study.set_user_attr("fingerprint", spec.fingerprint())
        study.set_user_attr("baselines_enqueued", True)
        for name, p in _baselines(spec.space):
            study.enqueue_trial(p, user_attrs={"baseline": name}, skip_if_exists=True)
    return study


# ------------------------------------------------------------ heartbeats (SQLAlchemy storages)

def _heartbeat_storage(study):
    """The study's storage if it records heartbeats (RDBStorage with an interval), else None."""
    from optuna.storages._heartbeat import is_heartbeat_enabled
    storage = study._storage
    return storage if is_heartbeat_enabled(storage) else None


class _Heartbeat:
    """A thread recording, every interval, the heartbeat of the trials this worker runs.

    A batch takes milliseconds, so most batches are told before the first beat; a trial
    of a batch killed before any beat has no heartbeat and is given one by the first
    process that sees it (``_reap_stale``)."""

    def __init__(self, study):
        self.storage = _heartbeat_storage(study)
        self._ids: list[int] = []
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = None

    def __enter__(self):
        if self.storage is not None:
            self.interval = float(self.storage.get_heartbeat_interval())
            self._thread = threading.Thread(target=self._run, name="dse-heartbeat", daemon=True)
            self._thread.start()
        return self

    def running(self, trial_ids) -> None:
        with self._lock:
            self._ids = list(trial_ids)

    def _run(self):
        while not self._done.wait(self.interval):
            with self._lock:
                ids = list(self._ids)
            for i in ids:
                try:
                    self.storage.record_heartbeat(i)
                except Exception:     # a finished trial, a concurrent first beat, a network blip: next time
                    pass

    def __exit__(self, *exc):
        self._done.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


def _unbeaten_running(storage, study_id: int) -> list[int] | None:
    """Ids of the study's RUNNING trials that have no heartbeat at all (None: cannot tell)."""
    try:
        import sqlalchemy
        from optuna.storages._rdb import models
        from optuna.trial import TrialState
        backend = getattr(storage, "_backend", storage)
        t, h = models.TrialModel, models.TrialHeartbeatModel
        q = sqlalchemy.select(t.trial_id).where(t.study_id == study_id, t.state == TrialState.RUNNING,
                                                ~sqlalchemy.exists().where(h.trial_id == t.trial_id))
        with sqlalchemy.orm.Session(backend.engine) as session:
            return list(session.scalars(q))
    except Exception:
        return None


def _reap_stale(study, seen: set) -> int:
    """Fail the study's RUNNING trials whose heartbeat is older than the grace period, and
    give a first heartbeat to RUNNING trials that have none (so that they go stale in
    turn if nobody runs them). Returns how many RUNNING trials are left."""
    from optuna.trial import TrialState
    storage = _heartbeat_storage(study)
    if storage is None:
        return _count(study, (TrialState.RUNNING,))
    optuna = _optuna()
    try:
        optuna.storages.fail_stale_trials(study)
    except Exception:
        pass
    study_id = study._study_id
    ids = _unbeaten_running(storage, study_id)
    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    if ids is None:         # cannot query heartbeats: give a first beat to trials not yet seen here
        ids = [t._trial_id for t in running if t._trial_id not in seen]
    for i in ids:
        seen.add(i)
        try:
            storage.record_heartbeat(i)
        except Exception:
            pass
    return len(running)


# ------------------------------------------------------------ a worker

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
        n = len(cls.FIELDS)
        return {f: sum(shared[n * i + k] for i in range(workers)) for k, f in enumerate(cls.FIELDS)}


def run_worker(spec, out: Path, storage_url: str | None, study_name: str, seed: int, quiet: bool = True,
               say: bool = True, clock: WorkerClock | None = None) -> int:
    """Run trials of the study until it has ``spec.trials`` complete ones; return how many
    this worker completed. ``say``: this worker tells stderr why it waits, if it waits.
    ``clock``: receives the seconds spent evaluating and writing the journal, and the study."""
    from optuna.trial import TrialState
    clock = clock if clock is not None else WorkerClock()
    if storage_url is None:       # the run's workers write the journal in turns: see ``_population``
        with _AskLock(None, storage_url, out):
            study = _open_study(spec, out, storage_url, study_name, seed)
    else:
        study = _open_study(spec, out, storage_url, study_name, seed)
    clock.study = study
    journal = journal_mod.population_backend(study._storage)
    dists, fixed = distributions(spec.space)
    chunk_dir = out / "chunks"
    chunk_dir.mkdir(parents=True, exist_ok=True)
    batch_size = spec.population or 50
    done_here = 0
    progress = Progress(spec.trials, quiet, "optuna " + spec.sampler, unit="trials")
    progress.resume(_count(study, (TrialState.COMPLETE,)))
    seen: set = set()
    waiting_since = None
    told_wait = False
    conflicts = 0
    with _Stop() as stop, _Heartbeat(study) as heart:
        while not stop.requested:
            n_complete = _count(study, (TrialState.COMPLETE,))
            room = spec.trials - n_complete - _count(study, (TrialState.RUNNING,))
            if room <= 0:
                if n_complete >= spec.trials or heart.storage is None:
                    break       # done; or (journal) this run's other workers finish the trials they hold
                # trials held by other processes: live ones finish in milliseconds, killed ones go stale
                running = _reap_stale(study, seen)
                now = time.monotonic()
                waiting_since = waiting_since or now
                interval, grace = heartbeat_settings()
                if say and not told_wait and now - waiting_since > min(2.0, interval) and running:
                    print(f"dse.study: {n_complete:,} of {spec.trials:,} trials complete; waiting for {running:,} "
                          f"trial(s) still marked running, perhaps by a killed process: a trial whose heartbeat "
                          f"is older than {grace:g} s is failed and replaced", file=sys.stderr, flush=True)
                    told_wait = True
                time.sleep(min(0.2 if now - waiting_since < 2.0 else 1.0, interval / 2))
                continue
            waiting_since = None
            n_told = _population(spec, study, storage_url, out, journal, batch_size, dists, fixed, chunk_dir,
                                 heart, clock)
            if journal is not None:
                clock.set("journal_write_s", journal.write_s)
                clock.set("journal_writes", journal.writes)
            if n_told is None:         # not written: something else wrote the journal meanwhile
                conflicts += 1
                if conflicts > 5:
                    raise DseError(f"{out / 'optuna.journal'}: written by another program during each of the "
                                   f"last {conflicts} populations; stop it (or use another --out) and run again")
                continue
            conflicts = 0
            if n_told:
                done_here += n_told
                wall = time.perf_counter() - progress.t0
                progress.update(n_told, f", evaluation {clock.values['evaluation_s'] / wall:.0%} of the time"
                                if wall > 0 else "")
        if stop.requested:
            raise _interrupted(_count(study, (TrialState.COMPLETE,)), spec.trials)
    return done_here


def _population(spec, study, storage_url, out: Path, journal, batch_size: int, dists: dict, fixed: dict,
                chunk_dir: Path, heart, clock: WorkerClock) -> int | None:
    """Ask a batch of trials, evaluate it at once, write its rows, record and tell it;
    return how many trials were told complete (None: the batch was not written, see below).

    Counting the trials and asking is one critical section (``_AskLock``). With the run
    folder's journal (``journal``, a ``PopulationJournal``) the whole batch is: it runs
    against the journal held in memory and is written in one write at its end, so no other
    process of the run writes the journal meanwhile; if something else did, the batch is
    dropped whole (its chunk file too) and None returned, to be asked again."""
    from optuna.trial import TrialState
    live = (TrialState.COMPLETE, TrialState.RUNNING)
    chunk = None
    with contextlib.ExitStack() as held:
        held.enter_context(_AskLock(study, storage_url, out))  # count and ask at once: no trial beyond the target
        if journal is not None:
            journal.begin(study._storage)
        written = False
        try:
            n_live = _count(study, live)
            trials = [study.ask(dists) for _ in range(min(batch_size, spec.trials - n_live))]
            if journal is None:
                held.close()       # the batch is evaluated and told while other workers ask theirs
            if not trials:
                written = True
                return 0
            heart.running([t._trial_id for t in trials])
            try:
                n_told, chunk = _evaluate_and_tell(spec, study, trials, dists, fixed, chunk_dir, clock)
            finally:
                heart.running([])
            written = True
        finally:
            if journal is not None and journal.holding:
                # also after an error: the trials told FAIL are written, as each op would have been
                written = journal.commit(study._storage, study._study_id) and written
    if not written:
        if chunk is not None:
            chunk.unlink(missing_ok=True)
        return None
    return n_told


def _evaluate_and_tell(spec, study, trials: list, dists: dict, fixed: dict, chunk_dir: Path,
                       clock: WorkerClock) -> tuple[int, Path | None]:
    """Evaluate the asked ``trials`` in one vectorized call, write their rows (a chunk file)
    and tell them; (trials told complete, the chunk file). Trials asked beyond the target by
    a concurrent worker are discarded (PRUNED), never evaluated; after an error no trial of
    the batch is left running (told FAIL)."""
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState
    live = (TrialState.COMPLETE, TrialState.RUNNING)
    names = list(spec.objectives)
    settled = set()
    try:
        # where no lock spans every asking process, a concurrent worker may have asked
        # too: trials beyond the target are discarded (PRUNED), never evaluated
        numbers = sorted(t.number for t in study.get_trials(deepcopy=False, states=live))
        allowed = set(numbers[:spec.trials]) | {t.number for t in study.get_trials(
            deepcopy=False, states=(TrialState.COMPLETE,))}
        keep = [t for t in trials if t.number in allowed]
        for t in trials:
            if t.number not in allowed:
                _discard(study, t, spec.trials)
                settled.add(t.number)
        if not keep:
            return 0, None
        cols = {name: _column([t.params[name] for t in keep]) for name in dists}
        cols.update(fixed)
        t0 = time.perf_counter()
        df, ev = evaluate_columns(spec, cols, [t.number for t in keep], "trial")
        clock.add("evaluation_s", time.perf_counter() - t0)
        chunk = chunk_dir / f"trials-{keep[0].number:08d}-{uuid.uuid4().hex[:8]}.parquet"
        write_atomic(df, chunk)
        constraint_names = list(ev.violations)
        if study.user_attrs.get("constraint_names") != constraint_names:
            study.set_user_attr("constraint_names", constraint_names)
        _record(study, list(zip(keep, batch_trial_attrs(df, ev), batch_constraint_values(ev))))
        objectives = [[_finite(v, spec.objectives[k]) for v in df[k].tolist()] for k in names]
        n_told = 0
        for i, t in enumerate(keep):
            try:
                study.tell(t, [col[i] for col in objectives])
                n_told += 1
            except UpdateFinishedTrialError:
                pass        # failed meanwhile as stale by another process: it is replaced
            settled.add(t.number)
        return n_told, chunk
    finally:
        for t in trials:     # an error mid-batch: leave no trial of it running
            if t.number not in settled:
                _tell_fail(study, t)


def trial_attrs(df: pd.DataFrame, ev, i: int) -> dict:
    """The user attrs of the trial in row ``i`` of ``df`` (evaluated as ``ev``): every metric
    (``METRICS``, SI units) that is a finite number, as stored in ``results.parquet``
    (counts as int); ``feasible``; and, when infeasible, ``reason`` (the key in
    ``results.parquet``) and ``why`` (the sentence)."""
    return batch_trial_attrs(df.iloc[i:i + 1].reset_index(drop=True), ev, offset=i)[0]


def batch_trial_attrs(df: pd.DataFrame, ev, offset: int = 0) -> list[dict]:
    """``trial_attrs`` of every row of ``df`` (row ``j`` is point ``offset + j`` of ``ev``),
    column by column."""
    n = len(df)
    attrs = [{} for _ in range(n)]
    for name in METRICS:
        v = df[name].to_numpy()
        finite = np.isfinite(v.astype(float, copy=False)) if v.dtype != object else \
            np.array([x is not None and np.isfinite(x) for x in v], dtype=bool)
        cast = int if name in COUNTS else float
        for j, x in zip(np.flatnonzero(finite).tolist(), v[finite].tolist()):
            attrs[j][name] = cast(x)
    feasible = df["feasible"].to_numpy(dtype=bool).tolist()
    reasons = df["reason"].tolist()
    for j in range(n):
        attrs[j]["feasible"] = feasible[j]
        if not feasible[j]:
            attrs[j]["reason"] = str(reasons[j])
            attrs[j]["why"] = ev.reason_text(offset + j)
    return attrs


def constraint_values(ev, i: int) -> list[float]:
    """Constraint violations of point ``i`` in the order of ``ev.violations`` (<= 0
    satisfied); NaN and infinities become +-1e300 (JSON and Optuna take finite floats)."""
    return [float(np.clip(np.nan_to_num(v[i], nan=1e300), -1e300, 1e300)) for v in ev.violations.values()]


def batch_constraint_values(ev) -> list[list[float]]:
    """``constraint_values`` of every point of ``ev``, computed per constraint."""
    cols = [np.clip(np.nan_to_num(np.asarray(v, dtype=float), nan=1e300), -1e300, 1e300).tolist()
            for v in ev.violations.values()]
    n = len(cols[0]) if cols else len(ev.feasible)
    return [[c[i] for c in cols] for i in range(n)]


def _record(study, items) -> None:
    """Write the user attrs and the constraint list (system attr ``CONSTRAINTS_ATTR``) of
    running trials, ``items`` = [(trial, user attrs, constraints)], in one storage write:
    one journal append (one fsync) or one database transaction, where the storage allows;
    else attribute by attribute through the storage's public API. A trial finished
    meanwhile (failed as stale by another process) is skipped."""
    from optuna.exceptions import UpdateFinishedTrialError
    optuna = _optuna()
    storage = study._storage
    per_trial = [(t._trial_id, {**attrs}, {CONSTRAINTS_ATTR: cons}) for t, attrs, cons in items]
    if isinstance(storage, optuna.storages.JournalStorage) and hasattr(storage, "_backend"):
        from optuna.storages.journal._storage import JournalOperation
        worker = storage._replay_result.worker_id
        logs = []
        for tid, user, system in per_trial:
            logs += [{"op_code": JournalOperation.SET_TRIAL_USER_ATTR, "worker_id": worker, "trial_id": tid,
                      "user_attr": {k: v}} for k, v in user.items()]
            logs += [{"op_code": JournalOperation.SET_TRIAL_SYSTEM_ATTR, "worker_id": worker, "trial_id": tid,
                      "system_attr": {k: v}} for k, v in system.items()]
        with storage._thread_lock:      # the journal's replay skips records of finished trials
            storage._backend.append_logs(logs)
            storage._sync_with_backend()
        return
    backend = getattr(storage, "_backend", storage)
    if isinstance(backend, optuna.storages.RDBStorage):
        from optuna.storages._rdb import models
        from optuna.storages._rdb.storage import _create_scoped_session

        def write(batch):
            with _create_scoped_session(backend.scoped_session, True) as session:
                for tid, user, system in batch:
                    for model, attrs in ((models.TrialUserAttributeModel, user),
                                         (models.TrialSystemAttributeModel, system)):
                        for k, v in attrs.items():
                            backend._set_trial_attr_without_commit(session, model, tid, k, v)
        try:
            write(per_trial)
            return
        except UpdateFinishedTrialError:     # one trial failed as stale meanwhile: trial by trial
            pass
    for tid, user, system in per_trial:
        try:
            for k, v in user.items():
                storage.set_trial_user_attr(tid, k, v)
            for k, v in system.items():
                storage.set_trial_system_attr(tid, k, v)
        except UpdateFinishedTrialError:
            pass


class _AskLock:
    """The critical section "count the study's trials, then ask a batch" among the
    processes asking trials of one study, so that no trial is asked beyond the target:

    - journal file (the run folder's, used by this run's workers only): an exclusive
      ``flock`` on ``optuna.ask.lock`` in the run folder;
    - SQLite file: an exclusive ``flock`` on ``<database>.ask.lock`` beside it;
    - PostgreSQL: a session advisory lock keyed by the study's name (every machine);
    - other databases: the run folder's file lock (this run's workers; other runs on the
      storage fall back to the beyond-target check in ``run_worker``).

    A lock dies with its process (the kernel releases a ``flock``, the server an advisory
    lock), so a killed worker never leaves one held."""

    def __init__(self, study, storage_url: str | None, out: Path):
        self.study, self.path, self.pg = study, Path(out) / "optuna.ask.lock", None
        self._file = self._conn = None
        if storage_url is None:
            return
        try:
            from sqlalchemy.engine import make_url
            u = make_url(storage_url)
        except Exception:
            return
        if u.get_backend_name() == "sqlite" and u.database:
            db = u.database[5:].split("?")[0] if u.database.startswith("file:") else u.database
            self.path = Path(db).expanduser().with_name(Path(db).name + ".ask.lock")
        elif u.get_backend_name() == "postgresql":
            self.pg = getattr(study._storage, "_backend", study._storage)

    def __enter__(self):
        if self.pg is not None:
            import sqlalchemy
            self._conn = self.pg.engine.connect()
            self._conn.execute(sqlalchemy.text("SELECT pg_advisory_lock(hashtext(:k))"),
                               {"k": "dse-ask:" + self.study.study_name})
        elif fcntl is not None:
            self._file = open(self.path, "a")
            fcntl.flock(self._file.fileno(), fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        if self._conn is not None:
            import sqlalchemy
            try:
                self._conn.execute(sqlalchemy.text("SELECT pg_advisory_unlock(hashtext(:k))"),
                                   {"k": "dse-ask:" + self.study.study_name})
            except Exception:
                self._conn.invalidate()     # never back to the pool still holding the lock
                raise
            finally:
                self._conn.close()
                self._conn = None
        if self._file is not None:
            try:
                fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
            finally:
                self._file.close()
                self._file = None


def _discard(study, trial, target: int) -> None:
    """Tell ``trial``, asked beyond the ``target`` complete trials by a concurrent worker,
    PRUNED (never evaluated; FAIL is for trials that crashed), saying so in its user attr
    ``discarded``."""
    from optuna.trial import TrialState
    try:
        study._storage.set_trial_user_attr(trial._trial_id, "discarded",
                                           f"asked beyond the study's {target:,} trials by a concurrent worker; "
                                           f"not evaluated")
        study.tell(trial, state=TrialState.PRUNED)
    except Exception:          # already finished (failed as stale by another process)
        pass


def _tell_fail(study, trial) -> None:
    from optuna.trial import TrialState
    try:
        study.tell(trial, state=TrialState.FAIL)
    except Exception:          # already finished (failed as stale by another process)
        pass


def _column(values: list):
    if values and isinstance(values[0], str):
        return np.array(values, dtype=object)
    return np.asarray(values)


def _finite(v, sense: str) -> float:
    """An objective value Optuna accepts: NaN and infinities become a very bad finite value."""
    v = float(v)
    if np.isfinite(v):
        return v
    return -1e300 if sense == "max" else 1e300


# ------------------------------------------------------------ the run

def _state_counts(trials) -> dict[str, int]:
    """{state name in lower case: how many of ``trials``} for every Optuna trial state."""
    from optuna.trial import TrialState
    counts = {s.name.lower(): 0 for s in TrialState}
    for t in trials:
        counts[t.state.name.lower()] += 1
    return counts


def trial_counts(storage_url: str | None, out: Path, study=LEGACY_STUDY_NAME) -> dict[str, int]:
    """How many trials of the study are in each state, and how many of the complete ones
    have their row in ``out/results.parquet``.

    ``study``: the study's spec (its Optuna name found as ``stored_study_name`` does) or an
    Optuna study name. Keys: ``complete``, ``fail``, ``running``, ``waiting``, ``pruned``
    (the study's trials in that state, over every run folder sharing the storage) and
    ``rows`` (complete trials with a row in this folder's results.parquet). All zero for a
    study that does not exist yet. DseError (one line) if the storage cannot be opened."""
    from optuna.trial import TrialState
    out = Path(out)
    counts = {**_state_counts([]), "rows": 0}
    if storage_url is None and not (out / "optuna.journal").exists():
        return counts
    storage = open_storage(storage_url, out)
    try:
        study_id = _study_id(storage, study if isinstance(study, str) else stored_study_name(storage, study))
        if study_id is None:
            return counts
        trials = storage.get_all_trials(study_id, deepcopy=False)
    finally:
        if hasattr(storage, "engine"):
            storage.engine.dispose()       # this process keeps no connection open
    counts.update(_state_counts(trials))
    complete = {t.number for t in trials if t.state == TrialState.COMPLETE}
    res = out / "results.parquet"
    if res.exists():
        try:
            numbers = pd.read_parquet(res, columns=["trial"])["trial"]
            counts["rows"] = int(numbers[numbers.isin(complete)].nunique())
        except Exception:
            pass
    return counts


def run_search(spec, out: Path, storage_url: str | None = None, workers: int = 1, quiet: bool = True,
               study_name: str | None = None) -> pd.DataFrame:
    """Run (or resume) an Optuna study with ``workers`` processes; merge the rows of its
    complete trials into ``out/results.parquet`` and return them. ``study_name``: the
    Optuna study's name; None: ``stored_study_name`` (the study's own name, or the name a
    study of the same space was created under before studies were named).

    ``rows.attrs["trials"]`` is ``trial_counts`` after the run plus ``asked`` (``spec.trials``)
    and the run's time: ``wall_s``, ``evaluation_s``, ``evaluation_share``, ``journal_write_s``
    (see the module's docstring). Raises Interrupted on SIGINT/SIGTERM (partial results
    written), DseError if a worker failed or the study ended short of its target."""
    optuna = _optuna()
    t_start = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    if study_name is None:
        if storage_url is None:
            _repair_journal(out)
        storage = open_storage(storage_url, out)
        study_name = stored_study_name(storage, spec)
        if hasattr(storage, "engine"):
            storage.engine.dispose()       # workers open their own connections
    if storage_url is None:
        _fail_stale(study_name, out)
    study = _open_study(spec, out, storage_url, study_name, spec.seed)  # schema and study exist before workers
    _reap_stale(study, set())
    stopped, failed = False, []
    if workers <= 1:
        clock = WorkerClock()
        try:
            run_worker(spec, out, storage_url, study_name, spec.seed, quiet, clock=clock)
        except Interrupted:
            stopped = True
        spent = dict(clock.values)
        study = clock.study if clock.study is not None else \
            optuna.load_study(study_name=study_name, storage=open_storage(storage_url, out))
    else:
        stopped, failed, spent = _run_workers(spec, out, storage_url, study_name, workers)
        if storage_url is None and (stopped or failed):
            _fail_stale(study_name, out)         # all of this run's workers are gone
        study = optuna.load_study(study_name=study_name, storage=open_storage(storage_url, out))
    all_trials = study.get_trials(deepcopy=False)
    rows = _merge_rows(out, all_trials)
    write_atomic(rows, out / "results.parquet")
    counts = {**_state_counts(all_trials), "rows": len(rows)}
    wall = time.perf_counter() - t_start
    timing = {"wall_s": round(wall, 6), "evaluation_s": round(spent["evaluation_s"], 6),
              "evaluation_share": round(spent["evaluation_s"] / (wall * max(workers, 1)), 6) if wall > 0 else 0.0,
              "journal_write_s": round(spent["journal_write_s"], 6) if storage_url is None else None}
    rows.attrs["trials"] = {**counts, "asked": spec.trials, **timing}
    if not quiet:
        over = f" of {workers} workers" if workers > 1 else ""
        journal = f", {timing['journal_write_s']:.2f} s writing the journal ({int(spent['journal_writes']):,} " \
                  f"writes)" if storage_url is None else ""
        print(f"dse.study: {wall:.1f} s in this run: {timing['evaluation_s']:.2f} s in dse's evaluation "
              f"({timing['evaluation_share']:.0%} of the time{over}){journal}; the rest in Optuna's sampler and "
              f"storage and the run's files", file=sys.stderr)
    if stopped:
        raise _interrupted(counts["complete"], spec.trials)
    if failed:
        raise DseError(f"{len(failed)} of {workers} worker processes failed (exit codes {failed}); "
                       f"{counts['complete']:,} of {spec.trials:,} trials complete: run the same command again "
                       f"to resume")
    if counts["complete"] < spec.trials:
        raise DseError(f"the study has {counts['complete']:,} of {spec.trials:,} trials complete "
                       f"({counts['running']:,} still running elsewhere); run the same command again to resume")
    if storage_url is not None and counts["rows"] < counts["complete"]:
        print(f"dse.study: note: {counts['rows']:,} of the study's {counts['complete']:,} complete trials were "
              f"evaluated in {out}; the others were evaluated by runs with another --out on the shared "
              f"storage: results.parquet and the Pareto front here cover these {counts['rows']:,} only",
              file=sys.stderr)
    return rows


def _merge_rows(out: Path, trials) -> pd.DataFrame:
    """The rows (from ``out/chunks``) of the complete ``trials``, one per trial, by number.

    A row is its trial's only if it holds the trial's parameters: a population that never
    reached the journal (killed before its write, or dropped and asked again) may have left
    a chunk whose trial numbers were given to other trials since."""
    from optuna.trial import TrialState
    complete = {t.number: t.params for t in trials if t.state == TrialState.COMPLETE}
    parts = [pd.read_parquet(p) for p in sorted((out / "chunks").glob("trials-*.parquet"))] \
        if (out / "chunks").is_dir() else []
    rows = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame({"trial": pd.Series([], dtype="int64")})
    rows = rows[rows["trial"].isin(complete)]
    if len(rows):
        numbers = rows["trial"].tolist()
        ok = np.ones(len(rows), dtype=bool)
        for name in sorted({k for p in complete.values() for k in p} & set(rows.columns)):
            ok &= np.array([name not in complete[n] or complete[n][name] == v
                            for n, v in zip(numbers, rows[name].tolist())], dtype=bool)
        rows = rows[ok]
    return rows.drop_duplicates("trial").sort_values("trial").reset_index(drop=True)


def _run_workers(spec, out: Path, storage_url, study_name: str, workers: int):
    """Run ``workers`` spawned worker processes to the end or until a stop; return
    (whether SIGINT/SIGTERM stopped them, the exit codes of workers that failed, their
    ``WorkerClock`` totals). On a stop or a failure the others are sent SIGTERM (they
    finish their batch) and killed after ``STOP_WAIT_S``. Workers are started by this
    thread: PR_SET_PDEATHSIG fires when it exits, so call this from the thread that lives
    as long as the run."""
    import multiprocessing as mp
    from multiprocessing.connection import wait
    ctx = mp.get_context("spawn")
    shared = ctx.Array("d", len(WorkerClock.FIELDS) * workers, lock=False)   # a slot each: no lock to die holding
    procs = [ctx.Process(target=_worker_main, name=f"dse-worker-{i}",
                         args=(spec, str(out), storage_url, study_name, spec.seed + i, os.getpid(), i == 0,
                               shared, i))
             for i in range(workers)]
    failed, stopping_since = [], None
    with _Stop() as stop:
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
                wait([p.sentinel for p in alive], timeout=0.2)
                for p in started:
                    stopped_by_us = stopping_since is not None and p.exitcode in (-signal.SIGTERM, -signal.SIGKILL)
                    if p.exitcode not in (None, 0, 130) and not stopped_by_us and p not in [q for q, _ in failed]:
                        failed.append((p, p.exitcode))
                if (stop.requested or failed) and stopping_since is None:
                    stopping_since = time.monotonic()
                    if failed and storage_url is None:   # a killed worker may hold the journal lock
                        _remove_stale_lock(out / "optuna.journal.lock")
                    for p in started:
                        if p.exitcode is None:
                            p.terminate()       # SIGTERM: the worker finishes its batch and exits
                if stopping_since is not None and time.monotonic() - stopping_since > STOP_WAIT_S:
                    for p in started:
                        if p.exitcode is None:
                            p.kill()
        except BaseException:
            for p in procs:
                if p.pid is not None and p.exitcode is None:
                    p.kill()
            raise
        finally:
            for p in procs:
                if p.pid is not None:
                    p.join(timeout=STOP_WAIT_S)
    return stop.requested, [c for _, c in failed], WorkerClock.totals(shared, workers)


def _fail_stale(study_name: str, out: Path) -> None:
    """Mark failed the trials a killed run left running in the run folder's journal (no
    other process can be using it: the run folder is locked by its run, and this run's
    workers are not started or are gone); they are replaced by new trials, so no
    unfinished trial counts and none runs twice. A journal lock left by a killed writer is
    removed at once (a live writer holds it for milliseconds), not after Optuna's 30 s."""
    from optuna.trial import TrialState
    if not _repair_journal(out):
        return
    storage = open_storage(None, out)
    try:
        study_id = storage.get_study_id_from_name(study_name)
    except KeyError:
        return
    for t in storage.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,)):
        try:
            storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
        except Exception:
            pass


def _repair_journal(out: Path) -> bool:
    """Whether the run folder has a journal; if so remove a lock and cut what a killed writer
    left at its end: an unfinished last record, a population written in part
    (``journal.repair``). Call only while no process of this run writes it."""
    journal = out / "optuna.journal"
    if not journal.exists():
        return False
    _remove_stale_lock(out / "optuna.journal.lock")
    journal_mod.repair(journal)
    return True


def _remove_stale_lock(lock: Path, settle_s: float = 0.3) -> None:
    """Remove the journal lock ``lock`` unless it changes within ``settle_s`` (a writer
    finishing its last write)."""
    def ident():
        try:
            st = lock.lstat()
            return (st.st_ino, st.st_mtime_ns)
        except OSError:
            return None
    first = ident()
    if first is None:
        return
    deadline = time.monotonic() + settle_s
    while time.monotonic() < deadline:
        time.sleep(0.02)
        now = ident()
        if now is None:
            return              # released by its writer
        if now != first:
            first, deadline = now, time.monotonic() + settle_s
    try:
        lock.unlink()
    except OSError:
        pass


# ------------------------------------------------------------ worker processes

def _die_with_parent(parent_pid: int) -> None:
    """Make this worker stop when its parent dies, however it dies: SIGTERM from the kernel
    on Linux (PR_SET_PDEATHSIG), and a watchdog thread everywhere that sees the parent
    process id change. SIGTERM makes the worker finish its batch and exit; if it has not
    exited ``STOP_WAIT_S`` later, the watchdog ends it."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            PR_SET_PDEATHSIG = 1
            libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        except Exception:
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
        os._exit(143)

    if orphaned():             # the parent died before the death signal was armed
        os._exit(143)
    threading.Thread(target=watch, name="dse-parent-watchdog", daemon=True).start()


def _worker_main(spec, out, storage_url, study_name, seed, parent_pid=None, say=False, shared=None, slot=0):
    if parent_pid is not None:
        _die_with_parent(parent_pid)
    try:
        run_worker(spec, Path(out), storage_url, study_name, seed, quiet=True, say=say,
                   clock=WorkerClock(shared, slot))
    except Interrupted:
        os._exit(130)
    except DseError as e:
        print(f"dse.study: error: {e}", file=sys.stderr)
        os._exit(2)
