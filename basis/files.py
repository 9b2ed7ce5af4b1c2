"""Reading input files and writing output files safely.

Reading: every file the tool opens (presets, model configs, studies, length traces, measured CSVs,
calibration files) is read by ``read_input``: a regular file only (a device such as /dev/zero, a
symlink to one, a FIFO or a folder is refused before it is read, so nothing hangs or fills memory),
at most a size that depends on its kind, and errors that name the file and never quote it.

Writing: checked output folders and files, atomic replacement through a temporary file of a name
no other process uses, nothing left behind on failure."""
from __future__ import annotations

import csv
import errno
import os
import stat
import uuid
from collections.abc import Callable
from pathlib import Path

from basis.errors import DseError, shown_path


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


#: errors of a write that the user can remedy (room, quota, permissions), said in one line
_WRITE_ERRNOS = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
                 errno.EROFS: "read-only file system", errno.EACCES: "permission denied",
                 errno.EPERM: "operation not permitted", errno.EFBIG: "file too large"}


def write_error_cause(e: BaseException) -> str | None:
    """The cause, in words, of a failed write the user can remedy ('no space left on device'),
    or None for any other error. Arrow's writers raise OSError with the errno, or only its text."""
    if not isinstance(e, OSError):
        return None
    cause = _WRITE_ERRNOS.get(e.errno)
    if cause is None and "No space left on device" in str(e):
        cause = _WRITE_ERRNOS[errno.ENOSPC]
    return cause


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Call ``write(temporary path)`` then rename the temporary file onto ``path``: readers
    see the old file or the new one, never a part. The temporary name is unique to this
    call, so concurrent writers cannot mix their bytes; it is removed if ``write`` fails.
    A write that fails for want of room (ENOSPC: a full disk), quota or permission is a
    DseError on one line naming ``path`` and the cause (the temporary file removed, ``path``
    as it was); other errors propagate."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException as e:
        try:
            tmp.unlink()
        except OSError:
            pass
        cause = write_error_cause(e)
        if cause:
            raise DseError(f"{shown_path(path)}: cannot write: {cause}") from None
        raise


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


#: the largest input of each kind read (bytes): YAML and JSON files (presets, studies, model
#: configs, calibration; the largest shipped is 140 KB) and CSV tables (length traces, measured
#: results: 64 MiB holds about four million rows of a two-column trace)
MAX_TEXT_BYTES = 16 * 2**20
MAX_CSV_BYTES = 64 * 2**20
#: the longest CSV field read (characters); the csv module's own default (128 KiB)
MAX_CSV_FIELD = 2**17


def _size(n: int) -> str:
    """A byte count for a message: '16 MiB', '3.2 KiB'."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} bytes"


def exists(path: str | Path) -> bool:
    """True when something is at ``path`` (following symlinks); False, not an error, for a name
    the system cannot look up (too long, a NUL byte, a component that is a file)."""
    try:
        os.stat(path)
    except (OSError, ValueError):
        return False
    return True


def is_regular_file(path: str | Path) -> bool:
    """True when ``path`` is a regular file (following symlinks); False for any name the system
    cannot look up."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def read_input(path: str | Path, what: str, limit: int = MAX_TEXT_BYTES) -> bytes:
    """The bytes of the input file ``path`` (a ``what``: "hardware preset", "study file", ...).

    DseError on one line naming the file and ``what`` when it is missing or unreadable, is not a
    regular file (a folder, a device such as /dev/zero or a symlink to one, a FIFO, a socket:
    checked with ``os.stat`` before anything is opened, so a FIFO with no writer cannot hang the
    read), or holds more than ``limit`` bytes (read at most ``limit`` + 1, whatever its size claims,
    so a file that grows while read, or /proc's files whose size reads 0, stay bounded)."""
    p = Path(path)
    name = shown_path(p)
    try:
        st = os.stat(p)
    except (OSError, ValueError) as e:    # ValueError: a NUL byte in the path
        raise DseError(f"{name}: cannot read the {what}: {getattr(e, 'strerror', None) or e}") from None
    if not stat.S_ISREG(st.st_mode):
        kind = ("a folder" if stat.S_ISDIR(st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
                else "a FIFO (named pipe)" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode)
                else "not a regular file")
        raise DseError(f"{name}: cannot read the {what}: it is {kind}, not a regular file")
    if st.st_size > limit:
        raise DseError(f"{name}: a {what} is at most {_size(limit)}; this file is {_size(st.st_size)}")
    try:
        # O_NONBLOCK: should the path be swapped for a FIFO after the check, opening it does not wait
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise DseError(f"{name}: cannot read the {what}: {e.strerror or e}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise DseError(f"{name}: cannot read the {what}: it is not a regular file")
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 2**20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as e:
        raise DseError(f"{name}: cannot read the {what}: {e.strerror or e}") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:
        raise DseError(f"{name}: a {what} is at most {_size(limit)}; this file is larger")
    return data


def read_input_text(path: str | Path, what: str, limit: int = MAX_TEXT_BYTES, expected: str = "text") -> str:
    """The UTF-8 text (a byte-order mark dropped) of the input file ``path`` (``read_input``);
    DseError naming the file and the offset of the first byte that is not UTF-8 (``expected``
    says what text the file should hold)."""
    raw = read_input(path, what, limit)
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise DseError(f"{shown_path(path)}: a {what} must be UTF-8 {expected}; byte {e.start} is not "
                       f"(a binary file?)") from None


class CsvRows:
    """The rows of a CSV input file as dicts (column -> text), iterated once, in file order;
    ``fieldnames``: the header's names as written. A malformed row (a NUL byte, a field beyond
    ``MAX_CSV_FIELD`` characters, an unclosed quote) is a DseError naming the file and line."""

    def __init__(self, path: Path, what: str, lines: list[str]):
        self.path, self.what = path, what
        self._lines = lines
        self._reader = csv.DictReader(lines)
        self.fieldnames = self._read(lambda: self._reader.fieldnames) or []

    def _read(self, step):
        start = self._reader.line_num
        try:
            return step()
        except csv.Error as e:
            line = start + 1                      # the row began on the line after the last one read
            raise DseError(f"{shown_path(self.path)}: line {line}: not a valid CSV row of the {self.what}: "
                           f"{str(e).split(chr(10))[0][:80]}") from None

    def __iter__(self):
        while True:
            row = self._read(lambda: next(self._reader, None))
            if row is None:
                return
            if None in row:         # cells past the header's columns: they would be dropped without a word
                raise DseError(f"{shown_path(self.path)}: line {self._reader.line_num}: {len(row[None])} more cell(s) "
                               f"than the header's {len(self.fieldnames)} columns in this row of the {self.what}; "
                               f"give each row one cell per column (quote a cell that holds a comma)")
            yield row


def read_csv(path: str | Path, what: str, limit: int = MAX_CSV_BYTES) -> tuple[list[str], CsvRows]:
    """(the header's column names, stripped; the rows, ``CsvRows``) of the CSV input file ``path``
    (``read_input_text``: a regular UTF-8 file of at most ``limit`` bytes, a byte-order mark
    allowed); DseError on one line naming the file and ``what`` it was read as when it cannot be
    read, has no header or names a column twice (one column would silently replace the other)."""
    p = Path(path)
    text = read_input_text(p, what, limit, expected="CSV text")
    nul = text.find("\x00")
    if nul >= 0:                    # newer csv modules read a NUL as text: a cell would carry it on
        raise DseError(f"{shown_path(p)}: line {text.count(chr(10), 0, nul) + 1}: a NUL byte, which no CSV text of "
                       f"the {what} holds (a binary file?)")
    csv.field_size_limit(MAX_CSV_FIELD)
    rows = CsvRows(p, what, text.splitlines())
    header = [h.strip() if isinstance(h, str) else "" for h in rows.fieldnames]
    if not header:
        raise DseError(f"{shown_path(p)}: the {what} is empty; expected a header line of column names")
    seen: set[str] = set()
    for h in header:
        if h and h in seen:
            raise DseError(f"{shown_path(p)}: column {_cut(h)!r} appears twice in the header of the {what}; give each column once")
        seen.add(h)
    return header, rows


def _cut(text: str, limit: int = 40) -> str:
    """``text`` on one line, cut to ``limit`` characters (a key named in a message)."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 1] + "…"
