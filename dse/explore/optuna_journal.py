"""The run folder's Optuna journal file, written one population at a time.

Optuna's journal file backend appends and fsyncs every storage operation (creating a
trial, each parameter, each attribute, each state: ~10 per trial), which costs a 2,000-trial
study more than half its time. ``PopulationJournal`` is that backend with one addition: a
population (ask a batch, evaluate it, tell it) can run against the journal held in memory
(``begin``) and reach the file in one write and one fsync (``commit``).

- What reaches the file is what Optuna would have written, operation by operation, in the
  same order and the same JSON (Optuna's own records, serialized as Optuna does), preceded
  by one more record: the study system attr ``POPULATION_ATTR`` = ``{"lines": n}``, the
  number of records of the population that follow it. Plain Optuna and optuna-dashboard
  read the file as any journal; a trial's parameters, values, user attrs and constraints
  are those an unbatched run writes.
- While a population is held, the journal's reader sees the file as it was at ``begin``
  followed by the held records (parsed back from their JSON, as a reader of the file
  would), and reads nothing from the file: the caller guarantees that no other process of
  the run writes the journal meanwhile (``dse.explore.search`` holds its ask lock over the
  whole population). A record written by anything else meanwhile (optuna-dashboard saving
  a note) is seen at ``commit``: the file's size is not the one ``begin`` saw, the
  population is not written (``commit`` returns False), the storage is replayed afresh
  from the file, and the caller runs the population again. Trial ids follow the order of
  the records in the file, so nothing is written after a record the held ones did not see.
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
import uuid
from pathlib import Path

from basis.errors import DseError

#: study system attr recorded first in each population's write: {"lines": records that follow}
POPULATION_ATTR = "dse:population"
_ENV_BATCH = "DSE_JOURNAL_BATCH"
_MARKER = b'"' + POPULATION_ATTR.encode() + b'"'
_SET_STUDY_SYSTEM_ATTR = 3        # optuna.storages.journal._storage.JournalOperation


class TornJournal(DseError):
    """The journal ends in a record a killed process left unfinished."""


def batching_enabled() -> bool:
    """Whether journal writes are grouped by population (env ``DSE_JOURNAL_BATCH`` not ``0``)."""
    return os.environ.get(_ENV_BATCH, "1").strip().lower() not in ("0", "false", "no", "off")


def _dumps(log: dict) -> str:
    return json.dumps(log, separators=(",", ":"))      # as JournalFileBackend.append_logs writes it


def _backend_class():
    from optuna.storages.journal import JournalFileBackend
    from optuna.storages.journal._file import get_lock_file

    class PopulationJournal(JournalFileBackend):
        """A JournalFileBackend that can hold a population's records and write them at once."""

        def __init__(self, file_path: str, lock_obj=None) -> None:
            super().__init__(file_path, lock_obj)
            self._pending: list[str] | None = None    # records of the held population (JSON lines)
            self._base = 0             # log number of the first held record
            self._base_size = 0        # the file's size at ``begin``
            self.write_s = 0.0         # seconds spent writing the file (lock, write, fsync)
            self.writes = 0            # writes to the file (each one fsync)

        @property
        def holding(self) -> bool:
            return self._pending is not None

        # ---------------------------------------------------------------- Optuna's backend API

        def read_logs(self, log_number_from: int):
            if self._pending is None:
                yield from super().read_logs(log_number_from)
                return
            n = log_number_from
            if n < self._base:        # records of the file before the population, up to ``begin``
                for log in super().read_logs(n):
                    yield log
                    n += 1
                    if n >= self._base:
                        break
            for line in self._pending[n - self._base:]:
                yield json.loads(line)

        def append_logs(self, logs: list[dict]) -> None:
            lines = [_dumps(log) for log in logs]
            if self._pending is not None:
                self._pending.extend(lines)
            else:
                self._write(lines)

        # ---------------------------------------------------------------- populations

        def begin(self, storage) -> None:
            """Hold the records ``storage`` (the JournalStorage over this backend) writes
            from now on, until ``commit`` or ``discard``."""
            if self._pending is not None:
                raise RuntimeError("a population is already held")
            with storage._thread_lock:
                storage._sync_with_backend()
                self._base = storage._replay_result.log_number_read
                self._base_size = self._log_number_offset[self._base]
                self._pending = []

        def commit(self, storage, study_id: int) -> bool:
            """Write the held records after their marker in one write (one fsync). False
            (nothing written, the storage replayed afresh from the file) if the file changed
            since ``begin``; TornJournal if it ends in an unfinished record."""
            lines, self._pending = self._pending, None
            if not lines:
                return True
            marker = _dumps({"op_code": _SET_STUDY_SYSTEM_ATTR, "worker_id": storage._replay_result.worker_id,
                             "study_id": study_id, "system_attr": {POPULATION_ATTR: {"lines": len(lines)}}})
            with storage._thread_lock:
                try:
                    size = self._write([marker] + lines, expect_size=self._base_size)
                except BaseException:
                    self._replay_afresh(storage)       # the held records are not in the file
                    raise
                if size is None:
                    self._replay_afresh(storage)
                    return False
                # the held records are applied already; the marker (a study attr: it commutes
                # with them) is applied now, so that the replay has read as many records as
                # the file holds
                storage._replay_result.apply_logs([json.loads(marker)])
                offset = self._base_size
                for i, line in enumerate([marker] + lines):
                    offset += len(line.encode("utf-8")) + 1
                    self._log_number_offset[self._base + i + 1] = offset
            return True

        def discard(self, storage) -> None:
            """Drop the held records: the storage is replayed afresh from the file."""
            if self._pending is None:
                return
            self._pending = None
            with storage._thread_lock:
                self._replay_afresh(storage)

        def _replay_afresh(self, storage) -> None:
            """Replay the file from its start, as a new JournalStorage would: under a new
            worker id (a replay raises again the errors its own records raised once, such
            as the study created twice that ``load_if_exists`` caught)."""
            from optuna.storages.journal._storage import JournalStorageReplayResult
            storage._worker_id_prefix = str(uuid.uuid4()) + "-"
            storage._replay_result = JournalStorageReplayResult(storage._worker_id_prefix)
            self._log_number_offset = {0: 0}
            storage._sync_with_backend()

        def _write(self, lines: list[str], expect_size: int | None = None) -> int | None:
            """Append ``lines`` under the journal's lock in one write and one fsync; the file's
            size before it, or None (nothing written) if that is not ``expect_size``."""
            data = ("\n".join(lines) + "\n").encode("utf-8")
            t0 = time.perf_counter()
            try:
                with get_lock_file(self._lock), open(self._file_path, "a+b") as f:
                    size = f.seek(0, os.SEEK_END)
                    if size:
                        f.seek(size - 1)
                        if f.read(1) != b"\n":
                            raise TornJournal(f"{self._file_path}: ends in a record left unfinished by a killed "
                                              f"process; run the same command again to repair it and resume")
                    if expect_size is not None and size != expect_size:
                        return None
                    f.write(data)            # O_APPEND: at the end
                    f.flush()
                    os.fsync(f.fileno())
                    self.writes += 1
                    return size
            finally:
                self.write_s += time.perf_counter() - t0

    return PopulationJournal


_CLASS = None


def population_journal_class():
    """The ``PopulationJournal`` class (a JournalFileBackend subclass; optuna imported lazily)."""
    global _CLASS
    if _CLASS is None:
        _CLASS = _backend_class()
    return _CLASS


def open_journal(path: Path | str):
    """A JournalStorage over the journal file ``path``: a ``PopulationJournal`` when
    ``batching_enabled()``, else Optuna's JournalFileBackend."""
    import optuna
    from optuna.storages.journal import JournalFileBackend
    backend = population_journal_class()(str(path)) if batching_enabled() else JournalFileBackend(str(path))
    return optuna.storages.JournalStorage(backend)


def population_backend(storage):
    """The storage's ``PopulationJournal`` backend, or None (another storage or backend)."""
    backend = getattr(storage, "_backend", None)
    return backend if _CLASS is not None and isinstance(backend, _CLASS) else None


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
                if log.get("op_code") == _SET_STUDY_SYSTEM_ATTR and POPULATION_ATTR in log.get("system_attr", {}):
                    return base + line_start
            except (ValueError, AttributeError, TypeError):
                pass
            k = line_start
        first = block.find(b"\n")
        tail = block[:first + 1] if first >= 0 else block
        pos = base
    return None
