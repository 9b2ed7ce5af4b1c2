"""Run-folder I/O shared by sweeps, searches and reports: the folder's lock, the study it
holds (``study.json``: a changed study is refused, naming what changed; so is a run another
model wrote, ``dse.explore.modelstamp``), a folder whose files lead outside it (refused), removing a run's
own files (``--overwrite``), atomic writes, a progress line, column-wise reading of
results.parquet (a file, or a sweep's dataset folder of one file per chunk)."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from basis.errors import DseError
from basis.files import atomic_write, write_text_atomic
from dse.explore.modelstamp import model_stamp, stamp_differences


def write_atomic(df: pd.DataFrame, path: Path, kind: str = "parquet") -> None:
    """Write ``df`` to ``path`` as Parquet or CSV, atomically. CSV goes through Arrow's writer
    (ten times pandas' on a 43,000-row front; names quoted, every float in its shortest
    round-trip form), or pandas' for columns Arrow cannot type (mixed objects)."""
    if kind == "parquet":
        atomic_write(path, lambda tmp: df.to_parquet(tmp, index=False))
        return
    import pyarrow as pa  # with pandas' Parquet, only where a file is written
    import pyarrow.csv as pa_csv
    try:
        table = pa.Table.from_pandas(df, preserve_index=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        atomic_write(path, lambda tmp: df.to_csv(tmp, index=False))
        return
    atomic_write(path, lambda tmp: pa_csv.write_csv(table, str(tmp)))


LOCK_FILE = ".dse-run.lock"
#: the study a run folder holds: its fingerprint and settings (``study_settings``), written when a run starts
STUDY_FILE = "study.json"
#: files a run writes into its folder under fixed names (plots are listed in ``plots.json``)
RUN_FILES = ("results.parquet", "pareto.csv", "sweep.json", STUDY_FILE, "best.json", "summary.md", "report.html",
             "plots.json", "roofline.png", "breakdown.png", "sweep_batch.png", "sweep_seq.png", "optuna.journal",
             "optuna.journal.lock", "aggregates.csv", "sample.parquet")
#: folders of part files a sweep writes (``dse.explore.chunkfiles``): results.parquet as a dataset, its staging
RUN_FOLDERS = ("results.parquet", ".results.parquet.staging")
#: plots a report writes under names of this pattern (``dse.present.report``: one per objective pair)
PLOT_PATTERNS = ("pareto_*.png",)
#: chunk files a sweep or a search writes under ``chunks/``
CHUNK_PATTERNS = ("part-*.parquet", "trials-*.parquet", "state-*.parquet", "front-*.parquet",
                  ".part-*.parquet.*.tmp", ".state-*.parquet.*.tmp", ".front-*.parquet.*.tmp")  # .tmp: a killed run's


def study_settings(spec) -> dict:
    """The settings that identify a study in its run folder (what its fingerprint covers): one
    key per parameter of the design space ('space.batch', 'space.hardware'), then 'method',
    'seed', 'objectives', 'constraints', ... (JSON values)."""
    top = json.loads(spec.fingerprint())
    top.pop("space", None)
    settings = {f"space.{k}": v for k, v in spec.space.spec.items()}
    settings.update(top)
    return json.loads(json.dumps(settings, sort_keys=True, default=str))


def changed_keys(old: dict, new: dict) -> list[str]:
    """The settings in which two studies differ (keys of ``study_settings``), sorted."""
    return sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))


def changed_study_error(out: Path, keys: list[str]) -> DseError:
    """The one-line error for a run folder that holds another study, naming what changed and both remedies."""
    what = ", ".join(keys) if keys else "its settings"
    return DseError(f"{out}: holds a run of another version of this study ({what} changed); to run the new one "
                    f"there, add --overwrite (deletes that run's files first), or give a new --out to keep both")


def stale_run_error(out: Path, differences: list[str]) -> DseError:
    """The one-line error for a run folder that another model wrote (``stamp_differences``):
    its numbers would not be current; names what differs and both remedies."""
    return DseError(f"{out}: holds a run written by another dse model ({'; '.join(differences)}), whose numbers "
                    f"would not be current; to run afresh there, add --overwrite (deletes that run's files first), "
                    f"or give a new --out to keep both")


def check_model(out: Path, stored) -> None:
    """DseError (``stale_run_error``) unless ``stored``, the stamp a file of run folder ``out``
    records, is this process's ``model_stamp``."""
    differences = stamp_differences(stored, model_stamp())
    if differences:
        raise stale_run_error(out, differences)


def check_study(out: Path, spec) -> None:
    """Record ``spec`` as the study of run folder ``out`` with the model that runs it
    (``model_stamp``), or DseError when the folder holds a run that another model wrote
    (``stale_run_error``) or a run of a study with other settings (``changed_study_error``).
    An unchanged study of the same model resumes."""
    path = Path(out) / STUDY_FILE
    new = study_settings(spec)
    if path.exists():
        try:
            stored = json.loads(path.read_text())
            old = stored["settings"]
            if not isinstance(old, dict):
                raise TypeError
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
            raise DseError(f"{path}: not a dse study record; add --overwrite to run afresh in {out}, or give a new "
                           f"--out") from None
        check_model(out, stored.get("model"))
        if stored.get("fingerprint") != spec.fingerprint():
            raise changed_study_error(out, changed_keys(old, new))
        return
    write_text_atomic(path, json.dumps({"fingerprint": spec.fingerprint(), "model": model_stamp(), "settings": new},
                                       indent=1))


#: what a run writes directly in its folder besides ``RUN_FILES``: its lock and the chunk folder
_OTHER_NAMES = (LOCK_FILE, "chunks")


def check_contained(out: Path) -> None:
    """DseError on one line when a file or folder that a run writes, deletes or reads in its
    folder ``out`` (``RUN_FILES``, ``RUN_FOLDERS``, the lock, ``chunks/`` and the files in
    these folders) is a symbolic link leading outside ``out``: the run would write into, or
    delete from, the link's target."""
    out = Path(out)
    root = out.resolve()
    names = list(dict.fromkeys(RUN_FILES + RUN_FOLDERS + _OTHER_NAMES))
    places = [out / n for n in names]
    for folder in ("chunks", *RUN_FOLDERS):
        d = out / folder
        if d.is_dir() and not d.is_symlink():
            places += sorted(d.iterdir())
    for p in places:
        if p.is_symlink():
            target = p.resolve()
            if target != root and root not in target.parents:
                inside = p.relative_to(out)
                raise DseError(f"{out}: {inside} is a symbolic link leading outside the run folder (to {target}); "
                               f"a run writes and deletes there: remove the link, or give a new --out")


def remove_run_files(out: Path) -> list[Path]:
    """Delete the files a run wrote into its folder ``out`` (``RUN_FILES``, the plots listed in
    plots.json, its chunk files) and nothing else; the folder and other files stay. Call it
    holding the folder's ``RunLock``. Returns the paths deleted."""
    out = Path(out)
    names = list(RUN_FILES)
    try:
        plots = json.loads((out / "plots.json").read_text())
        names += [n for n in plots if isinstance(n, str) and "/" not in n and "\\" not in n and not n.startswith(".")]
    except (OSError, UnicodeDecodeError, ValueError, TypeError):
        pass
    names += [p.name for pattern in PLOT_PATTERNS for p in out.glob(pattern)]
    gone = []
    for n in dict.fromkeys(names):
        p = out / n
        if p.is_file():
            p.unlink()
            gone.append(p)
    for folder, patterns in [(out / "chunks", CHUNK_PATTERNS)] + [(out / f, ("part-*.parquet",)) for f in RUN_FOLDERS]:
        if folder.is_dir():
            for pattern in patterns:
                for p in folder.glob(pattern):
                    p.unlink()
                    gone.append(p)
            try:
                folder.rmdir()
            except OSError:
                pass            # other files in it: not ours
    return gone
_held: dict[Path, list] = {}      # run folders this process has locked: [open lock file, depth]


class RunLock:
    """Exclusive use of a run folder while a run writes it (re-entrant within a process). A
    folder whose run files lead outside it is refused first (``check_contained``).

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
        check_contained(self.folder)
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


def result_files(path: Path) -> list[Path]:
    """The Parquet files of results ``path``: the file itself, or a dataset folder's files in
    the order ``pd.read_parquet`` reads them (by name: chunk order)."""
    import pyarrow.parquet as pq
    path = Path(path)
    return [Path(f) for f in pq.ParquetDataset(path).files] if path.is_dir() else [path]


class ResultsFile:
    """Lazy, column-wise access to results.parquet: one Parquet file (a search's), or a
    sweep's dataset folder of one file per chunk, read as one table."""

    def __init__(self, path: Path):
        import pyarrow as pa
        import pyarrow.parquet as pq
        self.path = Path(path)
        self.paths = result_files(self.path)
        schema = pq.read_schema(self.paths[0])
        strings = [f.name for f in schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)]
        self.strings = strings
        self.files = [pq.ParquetFile(p, read_dictionary=strings) for p in self.paths]  # names as categoricals
        self.file = self.files[0]
        self.schema = schema
        self.names = list(schema.names)
        #: the row groups of all files in order: (file, group in it)
        self.groups = [(i, g) for i, f in enumerate(self.files) for g in range(f.metadata.num_row_groups)]
        sizes = [self.files[i].metadata.row_group(g).num_rows for i, g in self.groups]
        self.rows = int(sum(sizes))
        self.starts = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)

    def _read(self, cols: list[str]):
        """An Arrow table of ``cols`` over every file."""
        import pyarrow as pa
        tables = [f.read(columns=cols) for f in self.files]
        return tables[0] if len(tables) == 1 else pa.concat_tables(tables, promote_options="permissive")

    def columns(self, cols: list[str]):
        """A DataFrame of ``cols`` (names stored as categoricals), one row per point."""
        cols = [c for c in dict.fromkeys(cols) if c in self.names]
        return self._read(cols).to_pandas(split_blocks=True, self_destruct=True)

    def reasons(self) -> list[tuple[str, int]]:
        """(reason key, points) of the infeasible points, most frequent first."""
        import pyarrow as pa
        import pyarrow.compute as pc
        if "reason" not in self.names:
            return []
        counts: dict[str, int] = {}
        for chunk in self._read(["reason"]).column(0).chunks:
            if pa.types.is_dictionary(chunk.type):
                idx = chunk.indices.filter(chunk.is_valid()) if chunk.null_count else chunk.indices
                n = np.bincount(idx.to_numpy(zero_copy_only=False).astype(np.int64), minlength=len(chunk.dictionary))
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
            i, group = self.groups[int(g)]
            table = self.files[i].read_row_group(group).take([p - int(self.starts[g]) for p in want])
            for p, rec in zip(want, table.to_pylist()):
                out[p] = rec
        return [out[p] for p in positions]


class FrameResults:
    """The reading interface of ``ResultsFile`` over rows held in memory (the Pareto front of
    a sweep that keeps no results.parquet)."""

    def __init__(self, df: pd.DataFrame):
        self.df = df.reset_index(drop=True)
        self.names = list(self.df.columns)
        self.rows = len(self.df)

    def columns(self, cols: list[str]) -> pd.DataFrame:
        """A DataFrame of ``cols`` (those present), one row per row held."""
        return self.df[[c for c in dict.fromkeys(cols) if c in self.names]].copy()

    def reasons(self) -> list[tuple[str, int]]:
        """(reason key, rows) of the infeasible rows held, most frequent first."""
        if "reason" not in self.names or "feasible" not in self.names:
            return []
        counts = self.df.loc[~self.df["feasible"].astype(bool), "reason"].astype("str").value_counts()
        return sorted(((str(k), int(v)) for k, v in counts.items() if v and k), key=lambda kv: (-kv[1], kv[0]))

    def rows_at(self, positions) -> list[dict]:
        """Full rows (every column held) at row ``positions``."""
        return self.df.iloc[[int(p) for p in positions]].to_dict("records")
