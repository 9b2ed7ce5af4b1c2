"""Run-folder I/O shared by sweeps, searches and reports: the folder's lock, atomic
writes, a progress line, column-wise reading of results.parquet."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from basis.errors import DseError
from basis.files import atomic_write


def write_atomic(df: pd.DataFrame, path: Path, kind: str = "parquet") -> None:
    """Write ``df`` to ``path`` as Parquet or CSV, atomically."""
    if kind == "parquet":
        atomic_write(path, lambda tmp: df.to_parquet(tmp, index=False))
    else:
        atomic_write(path, lambda tmp: df.to_csv(tmp, index=False))


LOCK_FILE = ".dse-run.lock"
_held: dict[Path, list] = {}      # run folders this process has locked: [open lock file, depth]


class RunLock:
    """Exclusive use of a run folder while a run writes it (re-entrant within a process).

    An advisory ``flock`` on ``<folder>/.dse-run.lock``: the kernel drops it when the
    holder exits, however it exits, so a killed run never leaves the folder locked and a
    second run on a folder in use is refused at once, with the holder's process id."""

    def __init__(self, folder: Path):
        self.folder = Path(folder).resolve()

    def __enter__(self):
        held = _held.get(self.folder)
        if held is not None:
            held[1] += 1
            return self
        import fcntl
        f = open(self.folder / LOCK_FILE, "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.seek(0)
            holder = f.read().strip() or "unknown"
            f.close()
            raise DseError(f"{self.folder}: another dse run is using this folder (process {holder}); wait for it "
                           f"to finish, or use another --out") from None
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        _held[self.folder] = [f, 1]
        return self

    def __exit__(self, *exc):
        held = _held[self.folder]
        held[1] -= 1
        if held[1] == 0:
            del _held[self.folder]
            held[0].close()        # releases the lock; the file stays (removing it would race a waiter)
        return False


class Progress:
    """A progress line on stderr: rewritten in place on a terminal, else one line per
    tenth of the work."""

    def __init__(self, total: int, quiet: bool, what: str = "sweep", unit: str = "points"):
        self.total, self.quiet, self.t0, self.done = total, quiet, time.perf_counter(), 0
        self.what, self.unit, self._shown = what, unit, -1
        self.start = 0         # work already done when this run started (resumed), not timed by it

    def resume(self, done: int) -> None:
        """Count ``done`` units finished by an earlier run (not in the time estimate)."""
        self.done = self.start = done

    def update(self, n: int, note: str = ""):
        self.done += n
        if self.quiet:
            return
        tty = sys.stderr.isatty()
        tenth = 10 * self.done // max(self.total, 1)
        if not tty and tenth == self._shown and self.done < self.total:
            return
        self._shown = tenth
        dt = time.perf_counter() - self.t0
        done_here = self.done - self.start
        left = (self.total - self.done) * dt / done_here if 0 < done_here and self.done < self.total else None
        eta = f", ~{left:.0f} s left" if left is not None else ""
        end = "\n" if self.done >= self.total or not tty else ""
        print(f"\r[{self.what}] {self.done:,}/{self.total:,} {self.unit} ({100 * self.done / self.total:.0f}%) "
              f"{dt:.1f} s{eta}{note}", end=end, file=sys.stderr, flush=True)


class ResultsFile:
    """Lazy, column-wise access to a results.parquet file."""

    def __init__(self, path: Path):
        import pyarrow as pa
        import pyarrow.parquet as pq
        self.path = path
        schema = pq.read_schema(path)
        strings = [f.name for f in schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)]
        self.file = pq.ParquetFile(path, read_dictionary=strings)   # names as categoricals: small, fast
        self.schema = schema
        self.names = list(schema.names)
        self.rows = self.file.metadata.num_rows
        sizes = [self.file.metadata.row_group(i).num_rows for i in range(self.file.metadata.num_row_groups)]
        self.starts = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)

    def columns(self, cols: list[str]):
        """A DataFrame of ``cols`` (names stored as categoricals), one row per point."""
        cols = [c for c in dict.fromkeys(cols) if c in self.names]
        return self.file.read(columns=cols).to_pandas(split_blocks=True, self_destruct=True)

    def reasons(self) -> list[tuple[str, int]]:
        """(reason key, points) of the infeasible points, most frequent first."""
        import pyarrow as pa
        import pyarrow.compute as pc
        if "reason" not in self.names:
            return []
        counts: dict[str, int] = {}
        for chunk in self.file.read(columns=["reason"]).column(0).chunks:
            if pa.types.is_dictionary(chunk.type):
                idx = chunk.indices.to_numpy(zero_copy_only=False)
                n = np.bincount(idx[idx >= 0] if chunk.null_count == 0 else idx[chunk.is_valid().to_numpy(
                    zero_copy_only=False)], minlength=len(chunk.dictionary))
                pairs = zip(chunk.dictionary.to_pylist(), n.tolist())
            else:
                pairs = ((d["values"], d["counts"]) for d in pc.value_counts(chunk).to_pylist())
            for text, c in pairs:
                if c and text:
                    counts[text] = counts.get(text, 0) + c
        return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))

    def rows_at(self, positions) -> list[dict]:
        """Full rows (every column) at row ``positions``, reading only their row groups."""
        positions = [int(p) for p in positions]
        out: dict[int, dict] = {}
        groups = np.searchsorted(self.starts, positions, side="right") - 1
        for g in sorted(set(groups.tolist())):
            want = [p for p, gg in zip(positions, groups) if gg == g]
            table = self.file.read_row_group(int(g)).take([p - int(self.starts[g]) for p in want])
            for p, rec in zip(want, table.to_pylist()):
                out[p] = rec
        return [out[p] for p in positions]


