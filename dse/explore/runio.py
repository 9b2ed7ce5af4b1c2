"""Run-folder I/O shared by sweeps, searches and reports: atomic writes, a progress line,
column-wise reading of results.parquet."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd


def write_atomic(df: pd.DataFrame, path: Path, kind: str = "parquet") -> None:
    tmp = path.with_name(path.name + ".tmp")
    if kind == "parquet":
        df.to_parquet(tmp, index=False)
    else:
        df.to_csv(tmp, index=False)
    os.replace(tmp, path)


class Progress:
    """A progress line on stderr: rewritten in place on a terminal, else one line per
    tenth of the work."""

    def __init__(self, total: int, quiet: bool, what: str = "sweep", unit: str = "points"):
        self.total, self.quiet, self.t0, self.done = total, quiet, time.perf_counter(), 0
        self.what, self.unit, self._shown = what, unit, -1

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
        end = "\n" if self.done >= self.total or not tty else ""
        print(f"\r[{self.what}] {self.done:,}/{self.total:,} {self.unit} ({100 * self.done / self.total:.0f}%) "
              f"{dt:.1f} s{note}", end=end, file=sys.stderr, flush=True)


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


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


