"""The one exception type user-facing code raises for bad input, and the number check
every input reader shares."""
import math
import re

#: the largest figure (SI units: ops/s, bytes, bytes/s, seconds, watts, dollars) any input
#: may give: far beyond any machine, and small enough that products of two stay finite
MAX_FIGURE = 1e30


class DseError(Exception):
    """Bad input or an impossible request; the CLI prints its message on one line
    and exits non-zero. ``verbatim_from``: where the message starts quoting another
    (a file's error), which callers rewording the message leave as it is."""

    def __init__(self, message: str = "", *, verbatim_from: int | None = None):
        super().__init__(message)
        self.verbatim_from = verbatim_from


def shown_path(path) -> str:
    """A file's path for a message: control characters (a newline in a name) escaped, so the
    message stays one line."""
    return "".join(c if c >= " " else repr(c)[1:-1] for c in str(path))


def verbatim(e: DseError) -> DseError:
    """``e`` as a message about a file, to be shown as it is (``verbatim_from`` 0: a key of the
    file is not a parameter's name that the command line would write as its flag)."""
    return e if e.verbatim_from is not None else DseError(str(e), verbatim_from=0)


def first_unknown(keys, allowed) -> str | None:
    """The first of ``keys`` (in the file's order) not in ``allowed``, on one line and cut to 40
    characters, with how many more there are ('x (and 3 more)'), or None: an error names that
    key alone, never the rest of the file."""
    bad = [k for k in keys if k not in allowed]
    if not bad:
        return None
    return shown_key(bad[0]) + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else "")


def shown_key(k, limit: int = 40) -> str:
    """A key read from a file, for a message: on one line (control characters escaped), cut to
    ``limit`` characters."""
    text = shown_path(k)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def as_number(v, where: str) -> float:
    """``v`` as a finite float, accepting numeric strings (YAML 1.1 reads ``1.0e12`` as a
    string); DseError naming ``where`` for anything else (booleans, NaN, infinities and
    numbers too large for a float included)."""
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise DseError(f"{where}: expected a number, got {kind_of(v)}")
    try:
        x = float(v) if not isinstance(v, str) or v.isascii() else float("not ASCII")   # float() reads '١٢'
    except (ValueError, OverflowError):
        raise DseError(f"{where}: expected a finite number, got "
                       f"{'text that is not a number' if isinstance(v, str) and v.strip() else kind_of(v)}") from None
    if not math.isfinite(x):
        raise DseError(f"{where}: expected a finite number, got {x}")
    return x


def cited_number(node, where: str, positive: bool = True, signed: bool = False) -> float:
    """The value of a cited figure ``{value: NUMBER, source: TEXT[, note: TEXT]}`` (a preset's or a
    technology table's): finite, positive (with ``positive`` False: not negative; ``signed``: any
    sign, a fitted coefficient), at most ``MAX_FIGURE`` in size, with a non-empty source; DseError
    naming ``where`` otherwise."""
    if not isinstance(node, dict) or "value" not in node:
        raise DseError(f"{where}: expected {{value: NUMBER, source: ...}}, got {kind_of(node)}")
    extra = first_unknown(node, ("value", "source", "note"))
    if extra:
        raise DseError(f"{where}: unknown key(s) {extra}; allowed: value, source, note")
    v = as_number(node["value"], f"{where}.value")
    if positive and not v > 0:
        raise DseError(f"{where}.value: must be positive, got {v:g}")
    if not positive and not signed and v < 0:
        raise DseError(f"{where}.value: must not be negative, got {v:g}")
    if abs(v) > MAX_FIGURE:
        raise DseError(f"{where}.value: at most {MAX_FIGURE:g} (SI units), got {v:g}")
    src = node.get("source")
    if not isinstance(src, str) or not src.strip():
        raise DseError(f"{where}: every number needs a 'source' (a key of 'sources' or a citation)")
    return float(v)


#: a value short and plain enough to be named in a message like a key (a family, a class, an engine)
_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,39}")


def name_or_kind(v) -> str:
    """A value read from a file where a name was expected: quoted when it is a short plain name
    (like a key: 'quantum'), else described by ``kind_of`` (never a line of free text)."""
    return repr(v) if isinstance(v, str) and _PLAIN_NAME.fullmatch(v) else kind_of(v)


def kind_of(v) -> str:
    """What a value read from a file is, in words that never quote its text: a number as
    written ('1e-300'), else 'nothing', 'true', 'empty text', 'text', 'a list', 'a mapping'."""
    if v is None:
        return "nothing"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, (int, float)):
        return shown_key(repr(v))
    if isinstance(v, str):
        return "empty text" if not v.strip() else "text"
    return "a list" if isinstance(v, list) else "a mapping" if isinstance(v, dict) else type(v).__name__
