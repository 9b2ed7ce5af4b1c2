"""Writing output files safely: checked output folders and files, atomic replacement
through a temporary file of a name no other process uses, nothing left behind on failure."""
from __future__ import annotations

import csv
import os
import uuid
from collections.abc import Callable
from pathlib import Path

from basis.errors import DseError


def output_folder(path: str | Path, what: str = "--out") -> Path:
    """``path`` as a folder that exists (created with its parents) and that this process
    can write; DseError on one line naming ``what`` otherwise (a file, /proc, no permission)."""
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise DseError(f"{what} {p}: is a file, not a folder") from None
    except OSError as e:
        raise DseError(f"{what} {p}: cannot create the folder: {e.strerror or e}") from None
    if not p.is_dir():
        raise DseError(f"{what} {p}: is not a folder")
    probe = p / f".dse-probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise DseError(f"{what} {p}: cannot write there: {e.strerror or e}") from None
    return p


def output_file(path: str | Path, what: str) -> Path:
    """``path`` as a file whose folder exists and can be written; DseError naming ``what``."""
    p = Path(path)
    if p.is_dir():
        raise DseError(f"{what} {p}: is a folder, not a file name")
    if not p.parent.is_dir():
        raise DseError(f"{what} {p}: no such folder {p.parent}")
    output_folder(p.parent, what)
    return p


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Call ``write(temporary path)`` then rename the temporary file onto ``path``: readers
    see the old file or the new one, never a part. The temporary name is unique to this
    call, so concurrent writers cannot mix their bytes; it is removed if ``write`` fails."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def read_csv(path: str | Path, what: str) -> tuple[list[str], csv.DictReader]:
    """(the header's column names, stripped; a DictReader over the rows) of the CSV file
    ``path`` (UTF-8, a byte-order mark allowed); DseError on one line naming the file and
    ``what`` it was read as when it cannot be read."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise DseError(f"{p}: cannot read {what}: {getattr(e, 'strerror', None) or e}") from None
    reader = csv.DictReader(text.splitlines())
    return [h.strip() for h in (reader.fieldnames or [])], reader
