"""The files of a sweep in its output folder, written so that a killed run loses none of
the chunks it finished and leaves no file half-written (every file is written under a
temporary name and renamed):

- ``chunks/part-NNNNNN.parquet``: the rows of chunk N (when the sweep keeps every row),
  encoded where the chunk was evaluated and written by the process that owns the folder;
- ``chunks/front-NNNNNN.parquet``: chunk N's Pareto front (a resumed run needs no other row
  of it for the sweep's front), written after its part;
- ``chunks/state-NNNNNN.parquet``: the rest of what chunk N adds to the online summaries (its
  sample candidates; its counts and aggregates in the file's metadata), written last: a
  chunk is finished when its state file exists.
- ``results.parquet``: when every chunk is finished, the part files move into a staging
  folder that is then renamed to ``results.parquet``: a Parquet dataset (a folder of one
  file per chunk, in point order) that ``pd.read_parquet``, ``pyarrow.parquet.read_table``
  and ``ResultsFile`` read as one table. Each row is encoded once; nothing is merged.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from basis.files import atomic_write
from dse.explore.online import ChunkSummary

#: the folder the part files move through on their way to results.parquet
STAGING = ".results.parquet.staging"
#: the key of a state file's metadata holding the chunk's counts and aggregates
STATE_KEY = b"dse.chunk"
#: rows per Parquet row group of results.parquet
ROW_GROUP = 65_536
#: the page compression of results.parquet: LZ4 (Parquet's LZ4_RAW) encodes a sweep's rows in
#: 0.6x the time Snappy with float dictionaries took, into 0.8x the bytes (gpu-sweep-1m's rows,
#: 250,000 a chunk), and reads back faster
ROWS_CODEC = "lz4"


def digits(chunks: int) -> int:
    """Digits of the chunk numbers in file names (at least 6), so names sort in chunk order."""
    return max(6, len(str(max(chunks - 1, 0))))


def part_name(k: int, chunks: int) -> str:
    """The file name of chunk ``k``'s rows."""
    return f"part-{k:0{digits(chunks)}d}.parquet"


def state_name(k: int, chunks: int) -> str:
    """The file name of chunk ``k``'s state."""
    return f"state-{k:0{digits(chunks)}d}.parquet"


def front_name(k: int, chunks: int) -> str:
    """The file name of chunk ``k``'s Pareto front."""
    return f"front-{k:0{digits(chunks)}d}.parquet"


def _table(df: pd.DataFrame) -> pa.Table:
    """``df`` as an Arrow table of the types every chunk shares: text as ``string`` (a column
    that is all missing too), names as dictionaries of ``string``."""
    table = pa.Table.from_pandas(df, preserve_index=False)
    fields = []
    for f in table.schema:
        t = f.type
        if pa.types.is_null(t) or pa.types.is_large_string(t):
            t = pa.string()
        elif pa.types.is_dictionary(t) and (pa.types.is_large_string(t.value_type) or pa.types.is_string(t.value_type)):
            t = pa.dictionary(pa.int32(), pa.string())
        fields.append(f.with_type(t))
    schema = pa.schema(fields, metadata=table.schema.metadata)
    return table if schema.equals(table.schema) else table.cast(schema)


def encode_rows(df: pd.DataFrame) -> bytes:
    """The rows ``df`` of one chunk as the bytes of a Parquet file (row groups of ``ROW_GROUP``
    rows, so that reading a few rows back decodes little). Names, flags and integers are
    dictionary-encoded; floats, nearly all distinct in a sweep, and the point ids, all distinct,
    are not (a dictionary would be built for each and dropped: for the ids of 250,000 rows that
    took 8.1 ms of a chunk's 121, plain 3.2 ms, into 0.67x the bytes); pages are LZ4-compressed
    (``ROWS_CODEC``). A row group is handed to the encoder as one batch, not Arrow's default of
    1,024 rows (gpu-sweep-1m's 250,000-row chunks: 0.118 -> 0.103 s, the same bytes)."""
    return encode_table(rows_table(df))


def rows_table(df: pd.DataFrame) -> pa.Table:
    """The rows ``df`` of one chunk as the Arrow table ``encode_table`` encodes."""
    return _table(df)


def encode_table(table: pa.Table) -> bytes:
    """The rows of one chunk (``rows_table``) as the bytes of a Parquet file (``encode_rows``)."""
    coded = [f.name for f in table.schema if not pa.types.is_floating(f.type) and f.name != "point"]
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=ROW_GROUP, use_dictionary=coded, compression=ROWS_CODEC,
                   write_batch_size=ROW_GROUP)
    return sink.getvalue().to_pybytes()


def write_part(chunk_dir: Path, k: int, chunks: int, data: bytes) -> None:
    """Write chunk ``k``'s rows (``encode_rows``) into ``chunk_dir``, atomically."""
    atomic_write(chunk_dir / part_name(k, chunks), lambda tmp: tmp.write_bytes(data))


def _lists(x):
    """Arrays in ``x`` (nested dicts) as lists, for JSON."""
    if isinstance(x, dict):
        return {k: _lists(v) for k, v in x.items()}
    return x.tolist() if isinstance(x, np.ndarray) else x


def write_state(chunk_dir: Path, k: int, chunks: int, part: ChunkSummary) -> None:
    """Write chunk ``k``'s front, then its state (its sample candidates, and in the metadata
    its counts and aggregates), each atomically."""
    front = _table(part.front)
    atomic_write(chunk_dir / front_name(k, chunks), lambda tmp: pq.write_table(front, tmp))
    table = _table(part.sample if part.sample is not None else pd.DataFrame())
    meta = {"first": part.first, "points": part.points, "feasible": part.feasible, "reasons": part.reasons,
            "cells": _lists(part.cells), "sample": part.sample is not None, "unvalued": part.unvalued}
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), STATE_KEY: json.dumps(meta).encode()})
    atomic_write(chunk_dir / state_name(k, chunks), lambda tmp: pq.write_table(table, tmp))


def read_state(chunk_dir: Path, k: int, chunks: int) -> ChunkSummary | None:
    """The summary finished chunk ``k`` stored, or None when its files are missing or cannot
    be read (the chunk is then evaluated again)."""
    try:
        table = pq.read_table(chunk_dir / state_name(k, chunks))
        meta = json.loads(table.schema.metadata[STATE_KEY])
        sample = table.to_pandas() if meta["sample"] else None
        front = pq.read_table(chunk_dir / front_name(k, chunks)).to_pandas()
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException):
        return None
    cells = {name: {"cell": np.asarray(st["cell"], dtype=np.int64), "points": np.asarray(st["points"], np.int64),
                    "feasible": np.asarray(st["feasible"], np.int64),
                    "best": {o: np.asarray(v, dtype=float) for o, v in st["best"].items()}}
             for name, st in meta["cells"].items()}
    return ChunkSummary(first=int(meta["first"]), points=int(meta["points"]), feasible=int(meta["feasible"]),
                        reasons=dict(meta["reasons"]), cells=cells, front=front, sample=sample,
                        unvalued=dict(meta.get("unvalued", {})))


def finished(chunk_dir: Path, chunks: int, with_parts: bool) -> list[int]:
    """The chunks with a state file (and, ``with_parts``, a part file) in ``chunk_dir``."""
    if not chunk_dir.is_dir():
        return []
    names = {p.name for p in chunk_dir.iterdir()}
    return [k for k in range(chunks)
            if state_name(k, chunks) in names and (not with_parts or part_name(k, chunks) in names)]


def recover(out: Path, chunk_dir: Path, results: Path) -> None:
    """Undo a publication a killed run left unfinished: part files in the staging folder, or
    in a results.parquet folder the manifest does not yet call complete, go back to
    ``chunk_dir``; a results.parquet file of such a run is deleted."""
    for folder in (out / STAGING, results):
        if folder.is_dir():
            chunk_dir.mkdir(exist_ok=True)
            for p in folder.glob("part-*.parquet"):
                back = chunk_dir / p.name
                if back.exists():
                    p.unlink()
                else:
                    os.replace(p, back)
            _rmdir(folder)
        elif folder == results and folder.is_file():
            folder.unlink()


def publish(out: Path, chunk_dir: Path, chunks: int, results: Path) -> None:
    """Turn the part files of ``chunks`` chunks into the dataset ``results``: moved into the
    staging folder, which is renamed to ``results`` (readers see all of it or nothing)."""
    staging = out / STAGING
    staging.mkdir(exist_ok=True)
    for k in range(chunks):
        os.replace(chunk_dir / part_name(k, chunks), staging / part_name(k, chunks))
    os.rename(staging, results)


def clean(chunk_dir: Path, chunks: int) -> None:
    """Delete the chunk files of this sweep, and the temporary ones a killed run was writing
    (and ``chunk_dir`` if nothing else is in it)."""
    if not chunk_dir.is_dir():
        return
    for k in range(chunks):
        for name in (state_name(k, chunks), front_name(k, chunks), part_name(k, chunks)):
            (chunk_dir / name).unlink(missing_ok=True)
    for pattern in (".part-*.parquet.*.tmp", ".state-*.parquet.*.tmp", ".front-*.parquet.*.tmp"):   # atomic_write's
        for p in chunk_dir.glob(pattern):
            p.unlink(missing_ok=True)
    _rmdir(chunk_dir)


def _rmdir(folder: Path) -> None:
    """Remove ``folder`` if it is empty (files someone else put there stay, and so does it)."""
    try:
        folder.rmdir()
    except OSError:
        pass
