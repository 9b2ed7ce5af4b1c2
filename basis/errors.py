"""The one exception type user-facing code raises for bad input, and the number check
every input reader shares."""
import math

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


def as_number(v, where: str) -> float:
    """``v`` as a finite float, accepting numeric strings (YAML 1.1 reads ``1.0e12`` as a
    string); DseError naming ``where`` for anything else (booleans, NaN, infinities and
    numbers too large for a float included)."""
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise DseError(f"{where}: expected a number, got {_short(v)}")
    try:
        x = float(v) if not isinstance(v, str) or v.isascii() else float("not ASCII")   # float() reads '١٢'
    except (ValueError, OverflowError):
        raise DseError(f"{where}: expected a finite number, got {_short(v)}") from None
    if not math.isfinite(x):
        raise DseError(f"{where}: expected a finite number, got {_short(v)}")
    return x


def cited_number(node, where: str, positive: bool = True, signed: bool = False) -> float:
    """The value of a cited figure ``{value: NUMBER, source: TEXT[, note: TEXT]}`` (a preset's or a
    technology table's): finite, positive (with ``positive`` False: not negative; ``signed``: any
    sign, a fitted coefficient), at most ``MAX_FIGURE`` in size, with a non-empty source; DseError
    naming ``where`` otherwise."""
    if not isinstance(node, dict) or "value" not in node:
        raise DseError(f"{where}: expected {{value: NUMBER, source: ...}}, got {node!r}")
    extra = set(node) - {"value", "source", "note"}
    if extra:
        raise DseError(f"{where}: unknown key(s) {', '.join(sorted(extra))}; allowed: value, source, note")
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


def _short(v, limit: int = 60) -> str:
    """``repr(v)`` cut to ``limit`` characters (a message stays one line)."""
    text = " ".join(repr(v).split())
    return text if len(text) <= limit else text[:limit - 1] + "…"
