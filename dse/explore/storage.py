"""Where an Optuna study of dse is stored: opening a storage, its URL in messages, its locks.

- ``open_storage``: the run folder's journal file (``optuna.journal``, written a population
  at a time, ``dse.explore.optuna_journal``) by default, else any SQLAlchemy URL
  (``RDBStorage`` with heartbeats, ``heartbeat_settings``). A URL that cannot hold a shared,
  resumable study (an in-memory SQLite) or cannot be opened is one DseError line.
- ``display_url``: a URL with its password masked, the only way a URL reaches a message.
- ``AskLock``: the critical section "count the study's trials, then ask a batch" among the
  processes asking trials of one study.
- The journal at a run's start (no writer alive): ``repair_journal`` cuts what a killed
  writer left, ``fail_stale`` fails the trials a killed run left RUNNING,
  ``remove_stale_lock`` removes a journal lock a killed writer left.

Optuna is used through its public API only (``optuna.storages``, ``BaseStorage``'s methods).
"""
from __future__ import annotations

import importlib.util
import os
import re
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from basis.errors import DseError
from dse.explore import optuna_journal as journal_mod

try:                       # POSIX file locks (the ask lock); elsewhere the beyond-target check alone
    import fcntl
except ImportError:        # pragma: no cover (Windows)
    fcntl = None

HEARTBEAT_S = 10.0     # seconds between heartbeats of running trials (SQLAlchemy storages)
GRACE_S = None         # a heartbeat older than this marks a trial stale; None: 3 * HEARTBEAT_S
_ENV_HEARTBEAT, _ENV_GRACE = "DSE_HEARTBEAT_S", "DSE_HEARTBEAT_GRACE_S"
JOURNAL = "optuna.journal"       # the run folder's journal file
_PASSWORD_KEYS = ("password", "passwd", "pwd")


def optuna_quiet():
    """The optuna module, its logging at WARNING and its warnings that do not concern dse off."""
    import optuna
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    # heartbeats are recorded here for asked trials (ask/tell, not Study.optimize)
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
    return optuna


def _parsed(url: str):
    """SQLAlchemy's parse of ``url``, or None if it is not an SQLAlchemy URL."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError
    try:
        return make_url(url)
    except (ArgumentError, ValueError):        # not a URL; a port that is not a number
        return None


def display_url(url: str | None) -> str | None:
    """``url`` with its password masked (``***``), for messages: user:secret@host becomes
    user:***@host, and a password given as a query parameter is masked too."""
    if url is None:
        return None
    u = _parsed(url)
    shown = u.render_as_string(hide_password=True) if u is not None and u.password is not None else None
    if shown is None:          # no password SQLAlchemy sees (or not its URL): mask by pattern
        shown = re.sub(r"(://[^/?#@]*?:)[^/?#@]*@", r"\1***@", str(url))
    return re.sub(r"(?i)([?&](?:password|passwd|pwd)=)[^&#]*", r"\1***", shown)


def scrub(text: str, url: str) -> str:
    """``text`` (an error message about ``url``) with the URL and its password masked."""
    text = text.replace(url, display_url(url))
    u = _parsed(url)
    if u is not None:
        secrets = [u.password] + [v for k, v in u.query.items() if k.lower() in _PASSWORD_KEYS]
    else:
        m = re.search(r"://[^/?#@]*?:([^/?#@]*)@", url)
        secrets = [m.group(1)] if m else []
    for secret in secrets:
        if isinstance(secret, str) and len(secret) >= 4:     # shorter: masked where the URL is, only
            text = text.replace(secret, "***")
    return text


def first_line(e: BaseException) -> str:
    """The first non-empty line of ``e``'s message (its type's name if none)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[0] if lines else type(e).__name__


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


def _sqlite_path(database: str) -> str:
    """The file of an SQLite URL's database (``file:`` URIs without their query)."""
    return database[5:].split("?")[0] if database.startswith("file:") else database


def check_url(url: str) -> None:
    """DseError (one line, password masked) for a URL that cannot hold a shared, resumable study."""
    shown = display_url(url)
    if "://" not in url:
        raise DseError(f"--storage '{shown}': expected an SQLAlchemy URL such as sqlite:///study.db or "
                       f"postgresql://user@host/db")
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError
    try:
        u = make_url(url)
    except (ArgumentError, ValueError) as e:
        raise DseError(f"--storage '{shown}': not a valid SQLAlchemy URL ({scrub(first_line(e), url)})") from None
    if u.get_backend_name() == "sqlite":
        db = u.database or ""
        if db in ("", ":memory:") or db.startswith("file::memory:") or "mode=memory" in db \
                or u.query.get("mode") == "memory":
            raise DseError(f"--storage '{shown}': an in-memory SQLite database cannot be shared by worker "
                           f"processes nor resumed by a rerun; use a file URL such as sqlite:///study.db")
        parent = Path(_sqlite_path(db)).expanduser().parent
        if not parent.is_dir():
            raise DseError(f"--storage '{shown}': no such folder {parent} for the SQLite file")


def _with_installed_driver(url: str) -> str:
    """``url`` with an installed PostgreSQL driver when it names none: SQLAlchemy 2.1
    defaults to psycopg 3, the ``postgres`` extra installs psycopg2."""
    u = _parsed(url)
    if u is not None and u.drivername == "postgresql" and importlib.util.find_spec("psycopg") is None \
            and importlib.util.find_spec("psycopg2") is not None:
        return u.set(drivername="postgresql+psycopg2").render_as_string(hide_password=False)
    return url


@dataclass(frozen=True)
class OpenedStorage:
    """A study storage as opened here: ``storage`` (what Optuna's study API takes) and, for the
    run folder's journal, its ``journal`` backend (a ``PopulationJournal``; else None)."""

    storage: object
    journal: object | None = None


def open_study_storage(url: str | None, out: Path) -> OpenedStorage:
    """The study storage: the journal file ``out/optuna.journal`` by default, else the
    SQLAlchemy URL ``url`` (an RDBStorage with heartbeats, see ``heartbeat_settings``).
    DseError (one line, password masked) if it cannot be opened."""
    optuna = optuna_quiet()
    if url is None:
        storage, journal = journal_mod.open_journal_with_backend(Path(out) / JOURNAL)
        return OpenedStorage(storage, journal)
    check_url(url)
    interval, grace = heartbeat_settings()
    from sqlalchemy.exc import SQLAlchemyError
    try:
        return OpenedStorage(optuna.storages.RDBStorage(_with_installed_driver(url), heartbeat_interval=interval,
                                                        grace_period=grace))
    except ImportError as e:            # the dialect's driver is not installed
        cause = scrub(first_line(e.__cause__ or e), url)
        msg = f"its database driver is not installed ({cause})"
        if url.startswith("postgres"):
            msg += "; pip install -e '.[postgres]' and use postgresql+psycopg2://..."
        raise DseError(f"--storage '{display_url(url)}': cannot open: {msg}") from None
    # unknown dialect, server down, refused login (SQLAlchemyError); bad arguments in the URL
    # (ValueError, TypeError); a schema of another Optuna version (RuntimeError)
    except (SQLAlchemyError, optuna.exceptions.StorageInternalError, ValueError, TypeError, RuntimeError) as e:
        raise DseError(f"--storage '{display_url(url)}': cannot open: {scrub(first_line(e), url)}") from None


def open_storage(url: str | None, out: Path):
    """The study storage (``open_study_storage``'s ``storage``): what Optuna's API takes."""
    return open_study_storage(url, out).storage


def close_storage(storage) -> None:
    """Close the connections ``storage`` holds (an RDBStorage's pool), so that this process
    keeps none open; nothing for a journal."""
    engine = getattr(storage, "engine", None)      # RDBStorage.engine: SQLAlchemy's engine
    if engine is not None:
        engine.dispose()


def heartbeat_storage(storage):
    """``storage`` if it records heartbeats (an RDBStorage with an interval), else None."""
    import optuna
    if isinstance(storage, optuna.storages.RDBStorage) and storage.get_heartbeat_interval() is not None:
        return storage
    return None


def storage_errors() -> tuple[type[BaseException], ...]:
    """The errors a database storage raises when its server fails or another process raced
    this one (Optuna wraps SQLAlchemy's in StorageInternalError; some pass through)."""
    import optuna
    from sqlalchemy.exc import SQLAlchemyError
    return (optuna.exceptions.StorageInternalError, SQLAlchemyError)


def study_id(storage, name: str) -> int | None:
    """The id of the study called ``name`` in ``storage``, None if there is none."""
    try:
        return storage.get_study_id_from_name(name)
    except KeyError:
        return None


class AskLock:
    """The critical section "count the study's trials, then ask a batch" among the
    processes asking trials of one study, so that no trial is asked beyond the target:

    - journal file (the run folder's, used by this run's workers only): an exclusive
      ``flock`` on ``optuna.ask.lock`` in the run folder;
    - SQLite file: an exclusive ``flock`` on ``<database>.ask.lock`` beside it;
    - PostgreSQL: a session advisory lock keyed by the study's name (every machine);
    - other databases: the run folder's file lock (this run's workers; other runs on the
      storage fall back to the beyond-target check of ``dse.explore.search``).

    A lock dies with its process (the kernel releases a ``flock``, the server an advisory
    lock), so a killed worker never leaves one held. ``storage``: the study's storage (its
    ``engine`` takes the advisory lock), ``name`` the study's name."""

    def __init__(self, storage, name: str, storage_url: str | None, out: Path):
        self.name, self.path, self.engine = name, Path(out) / "optuna.ask.lock", None
        self._file = self._conn = None
        u = _parsed(storage_url) if storage_url is not None else None
        if u is None:
            return
        if u.get_backend_name() == "sqlite" and u.database:
            db = _sqlite_path(u.database)
            self.path = Path(db).expanduser().with_name(Path(db).name + ".ask.lock")
        elif u.get_backend_name() == "postgresql":
            self.engine = storage.engine

    def __enter__(self):
        if self.engine is not None:
            import sqlalchemy
            self._conn = self.engine.connect()
            self._conn.execute(sqlalchemy.text("SELECT pg_advisory_lock(hashtext(:k))"), {"k": "dse-ask:" + self.name})
        elif fcntl is not None:
            self._file = open(self.path, "a")
            fcntl.flock(self._file.fileno(), fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        if self._conn is not None:
            import sqlalchemy
            try:
                self._conn.execute(sqlalchemy.text("SELECT pg_advisory_unlock(hashtext(:k))"),
                                   {"k": "dse-ask:" + self.name})
            except sqlalchemy.exc.SQLAlchemyError:
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


# ------------------------------------------------------------ the run folder's journal at a run's start

def fail_stale(study_name: str, out: Path) -> None:
    """Mark failed the trials a killed run left running in the run folder's journal (no
    other process can be using it: the run folder is locked by its run, and this run's
    workers are not started or are gone); they are replaced by new trials, so no
    unfinished trial counts and none runs twice. A journal lock left by a killed writer is
    removed at once (a live writer holds it for milliseconds), not after Optuna's 30 s."""
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState
    if not repair_journal(out):
        return
    storage = open_storage(None, out)
    sid = study_id(storage, study_name)
    if sid is None:
        return
    for t in storage.get_all_trials(sid, deepcopy=False, states=(TrialState.RUNNING,)):
        try:
            storage.set_trial_state_values(storage.get_trial_id_from_study_id_trial_number(sid, t.number),
                                           TrialState.FAIL)
        except UpdateFinishedTrialError:       # finished meanwhile: nothing to fail
            pass


def repair_journal(out: Path) -> bool:
    """Whether the run folder has a journal; if so remove a lock and cut what a killed writer
    left at its end: an unfinished last record, a population written in part
    (``optuna_journal.repair``). Call only while no process of this run writes it."""
    journal = Path(out) / JOURNAL
    if not journal.exists():
        return False
    remove_stale_lock(Path(out) / (JOURNAL + ".lock"))
    journal_mod.repair(journal)
    return True


def remove_stale_lock(lock: Path, settle_s: float = 0.3) -> None:
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
    except OSError:             # released meanwhile
        pass
