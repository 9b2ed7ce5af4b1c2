"""The run folder's Optuna journal file, written one population at a time.

Optuna's journal file backend appends and fsyncs every storage operation (creating a
trial, each parameter, each attribute, each state: ~10 per trial), which costs a 2,000-trial
study more than half its time. ``PopulationJournal`` is a journal file backend of our own
(Optuna's public ``BaseJournalBackend``, locked with Optuna's public
``JournalFileSymlinkLock``, so Optuna and optuna-dashboard share the file and its lock)
that writes records as Optuna's file backend does, plus one thing: a population (ask a
batch, evaluate it, tell it) can run against the journal held in memory (``begin``) and
reach the file in one write and one fsync (``commit``). It uses Optuna through its public
API only: the records are those ``JournalStorage`` hands its backend, never built here.

- What reaches the file is what Optuna would have written, operation by operation, in the
  same order and the same JSON, preceded by one more record: the study system attr
  ``POPULATION_ATTR`` = ``{"lines": n}`` (written by the storage's public
  ``set_study_system_attr``), the number of records of the population that follow it.
  Plain Optuna and optuna-dashboard read the file as any journal; a trial's parameters,
  values, user attrs and constraints are those an unbatched run writes.
- While a population is held, the journal's reader sees the file as it was at ``begin``
  followed by the held records (parsed back from their JSON, as a reader of the file
  would), and reads nothing new from the file: the caller guarantees that no other process
  of the run writes the journal meanwhile (``dse.explore.search`` holds its ask lock over
  the whole population). A record written by anything else meanwhile (optuna-dashboard
  saving a note) is seen at ``commit``: the file's size is not the one ``begin`` saw, the
  population is not written and ``commit`` returns False; the storage over this backend
  then holds records the file does not, so the caller opens the journal afresh (a new
  ``JournalStorage``) and runs the population again. Trial ids follow the order of the
  records in the file, so nothing is written after a record the held ones did not see.
- A population is in the file whole or not at all: a killed run leaves no trial of a
  population it had not written, and ``repair`` (at a run's start, no writer alive) cuts a
  population whose write was cut short (its marker counts more records than follow it, or
  its last record is unfinished), so that a resumed study starts from the last population
  written whole. No write ever follows an unfinished record (a writer killed mid-write):
  ``TornJournal`` is raised instead, and the next run repairs the file.

``batching_enabled()``: off with the environment variable ``DSE_JOURNAL_BATCH=0`` (every
operation written at once, as Optuna does; for comparisons and benchmarks).
"""
from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

from basis.errors import DseError

#: study system attr recorded first in each population's write: {"lines": records that follow}
POPULATION_ATTR = "dse:population"
_ENV_BATCH = "DSE_JOURNAL_BATCH"
_MARKER = b'"' + POPULATION_ATTR.encode() + b'"'


class TornJournal(DseError):
    """The journal ends in a record a killed process left unfinished."""


def batching_enabled() -> bool:
    """Whether journal writes are grouped by population (env ``DSE_JOURNAL_BATCH`` not ``0``)."""
    return os.environ.get(_ENV_BATCH, "1").strip().lower() not in ("0", "false", "no", "off")


def _dumps(log: dict) -> str:
    return json.dumps(log, separators=(",", ":"))      # as Optuna's JournalFileBackend writes a record


class JournalFile:
    """The records of a journal file, read and appended as Optuna's ``JournalFileBackend``
    does (one JSON object per line; an unfinished last line is not a record yet), under
    Optuna's public ``JournalFileSymlinkLock`` (the lock file ``<path>.lock``), with a
    population held in memory between ``begin`` and ``commit``. ``write_s``: seconds spent
    writing (lock, write, fsync); ``writes``: the writes (each one fsync)."""

    def __init__(self, path: str, lock) -> None:
        self.path = path
        self.lock = lock
        if not os.path.exists(path):
            open(path, "ab").close()
        self._offsets: dict[int, int] = {0: 0}     # log number -> byte offset of its record
        self._pending: list[str] | None = None    # records of the held population (JSON lines)
        self._base = 0             # log number of the first held record
        self._base_size = 0        # the file's size at ``begin``
        self.write_s = 0.0
        self.writes = 0

    @property
    def holding(self) -> bool:
        """Whether a population is held (``begin`` without its ``commit``)."""
        return self._pending is not None

    # ---------------------------------------------------------------- the backend's two calls

    def read_logs(self, log_number_from: int) -> Iterator[dict]:
        """The records from number ``log_number_from`` on: the file's, and while a population
        is held the file's up to ``begin`` followed by the held ones."""
        if self._pending is None:
            yield from self._read_file(log_number_from, None)
            return
        yield from self._read_file(log_number_from, self._base)
        for line in self._pending[max(log_number_from - self._base, 0):]:
            yield json.loads(line)

    def append_logs(self, logs: list[dict]) -> None:
        """Append ``logs``: held while a population is, else written at once (one fsync)."""
        lines = [_dumps(log) for log in logs]
        if self._pending is not None:
            self._pending.extend(lines)
        else:
            self._write(lines)

    def _read_file(self, first: int, stop: int | None) -> Iterator[dict]:
        """The file's whole records numbered ``first`` up to ``stop`` (None: the end), noting
        where each one starts; a record another process is writing is left for later."""
        if stop is not None and first >= stop:
            return
        start = first if first in self._offsets else max(n for n in self._offsets if n <= first)
        with open(self.path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            offset = self._offsets[start]
            f.seek(offset)
            bad = None
            for number, line in enumerate(f, start=start):
                if offset + len(line) > size or (stop is not None and number >= stop):
                    break
                if bad is not None:
                    raise bad
                if not line.endswith(b"\n"):         # unfinished: not a record (yet)
                    bad = ValueError(f"{self.path}: a record is unfinished")
                    continue
                offset += len(line)
                self._offsets.setdefault(number + 1, offset)
                if number >= first:
                    try:
                        yield json.loads(line)
                    except json.JSONDecodeError as e:
                        del self._offsets[number + 1]
                        bad = e

    # ---------------------------------------------------------------- populations

    def begin(self) -> None:
        """Hold every record appended from now on, until ``commit``."""
        if self._pending is not None:
            raise RuntimeError("a population is already held")
        for _ in self._read_file(max(self._offsets), None):     # note where the file's records end
            pass
        self._base = max(self._offsets)
        self._base_size = self._offsets[self._base]
        self._pending = []

    def commit(self, storage, study_id: int) -> bool:
        """Write the held records after their marker (the study system attr
        ``POPULATION_ATTR``, recorded now through ``storage``, the JournalStorage over this
        backend) in one write and one fsync. False (nothing written) if the file changed
        since ``begin``: ``storage`` then holds records the file does not, open the journal
        afresh. TornJournal if the file ends in an unfinished record."""
        if not self._pending:
            self._pending = None
            return True
        n = len(self._pending)
        # the marker, a study attr, commutes with the held trial records: the storage applies
        # it after them, the file holds it first
        storage.set_study_system_attr(study_id, POPULATION_ATTR, {"lines": n})
        lines, self._pending = self._pending, None
        lines = lines[n:] + lines[:n]
        if self._write(lines, expect_size=self._base_size) is None:
            return False
        offset = self._base_size
        for i, line in enumerate(lines):
            offset += len(line.encode("utf-8")) + 1
            self._offsets[self._base + i + 1] = offset
        return True

    def _write(self, lines: list[str], expect_size: int | None = None) -> int | None:
        """Append ``lines`` under the journal's lock in one write and one fsync; the file's
        size before it, or None (nothing written) if that is not ``expect_size``."""
        data = ("\n".join(lines) + "\n").encode("utf-8")
        t0 = time.perf_counter()
        self.lock.acquire()
        try:
            with open(self.path, "a+b") as f:
                size = f.seek(0, os.SEEK_END)
                if size:
                    f.seek(size - 1)
                    if f.read(1) != b"\n":
                        raise TornJournal(f"{self.path}: ends in a record left unfinished by a killed "
                                          f"process; run the same command again to repair it and resume")
                if expect_size is not None and size != expect_size:
                    return None
                f.write(data)            # O_APPEND: at the end
                f.flush()
                os.fsync(f.fileno())
                self.writes += 1
                return size
        finally:
            self.lock.release()
            self.write_s += time.perf_counter() - t0


_CLASS = None


def population_journal_class():
    """The ``PopulationJournal`` class: ``JournalFile`` as an Optuna ``BaseJournalBackend``
    (optuna imported when first asked for)."""
    global _CLASS
    if _CLASS is None:
        from optuna.storages.journal import BaseJournalBackend

        class PopulationJournal(JournalFile, BaseJournalBackend):
            """A journal file backend that can hold a population's records and write them at once."""

            def __init__(self, file_path: str) -> None:
                from optuna.storages.journal import JournalFileSymlinkLock
                super().__init__(file_path, JournalFileSymlinkLock(file_path))

        _CLASS = PopulationJournal
    return _CLASS


def open_journal(path: Path | str):
    """A JournalStorage over the journal file ``path`` (a ``PopulationJournal``)."""
    return open_journal_with_backend(path)[0]


def open_journal_with_backend(path: Path | str):
    """(a JournalStorage over the journal file ``path``, its ``PopulationJournal``)."""
    import optuna
    backend = population_journal_class()(str(path))
    return optuna.storages.JournalStorage(backend), backend


# ------------------------------------------------------------ repair (no writer alive)

def repair(path: Path | str) -> int:
    """Cut what a killed writer left at the end of the journal ``path``: an unfinished last
    record, and the records of a population whose write was cut short (from its marker
    on). Call only while no process writes the file. Returns the bytes cut."""
    try:
        with open(path, "r+b") as f:
            size = f.seek(0, os.SEEK_END)
            keep = _complete_prefix(f, size)
            if keep < size:
                f.truncate(keep)
                f.flush()
                os.fsync(f.fileno())
            return size - keep
    except OSError:
        return 0


def _complete_prefix(f, size: int) -> int:
    """The length of the journal's prefix that ends with a whole population (or with whole
    records written outside populations)."""
    end = _last_newline_end(f, size)                 # whole records only
    if end == 0:
        return 0
    start = _last_marker_line(f, end)
    if start is None:
        return end                                   # no population marker: an unbatched journal
    f.seek(start)
    head = f.readline()
    try:
        need = json.loads(head)["system_attr"][POPULATION_ATTR]["lines"]
    except (ValueError, KeyError, TypeError):
        return end
    have = f.read(end - start - len(head)).count(b"\n")
    return end if have >= need else start


def _last_newline_end(f, size: int) -> int:
    pos = size
    while pos > 0:
        step = min(1 << 16, pos)
        f.seek(pos - step)
        block = f.read(step)
        k = block.rfind(b"\n")
        if k >= 0:
            return pos - step + k + 1
        pos -= step
    return 0


def _is_marker(log) -> bool:
    """Whether the record ``log`` is a population marker: the study system attr
    ``POPULATION_ATTR`` (a study's record names its study, a trial's its trial)."""
    return isinstance(log, dict) and "study_id" in log and "trial_id" not in log \
        and POPULATION_ATTR in (log.get("system_attr") or {})


def _last_marker_line(f, end: int) -> int | None:
    """Byte offset of the last record before ``end`` that is a population marker."""
    pos, tail = end, b""
    while pos > 0:
        step = min(1 << 20, pos)
        base = pos - step
        f.seek(base)
        block = f.read(step) + tail          # ``tail``: the end of this block's last line
        k = len(block)
        while True:
            k = block.rfind(_MARKER, 0, k)
            if k < 0:
                break
            line_start = block.rfind(b"\n", 0, k) + 1
            if line_start == 0 and base > 0:
                break                        # the line starts in an earlier block
            line_end = block.find(b"\n", k)
            try:
                log = json.loads(block[line_start:line_end])
                if _is_marker(log):
                    return base + line_start
            except (ValueError, AttributeError, TypeError):
                pass
            k = line_start
        first = block.find(b"\n")
        tail = block[:first + 1] if first >= 0 else block
        pos = base
    return None
