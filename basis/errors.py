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
        x = float(v)
    except (ValueError, OverflowError):
        raise DseError(f"{where}: expected a finite number, got {_short(v)}") from None
    if not math.isfinite(x):
        raise DseError(f"{where}: expected a finite number, got {_short(v)}")
    return x


def _short(v, limit: int = 60) -> str:
    """``repr(v)`` cut to ``limit`` characters (a message stays one line)."""
    text = " ".join(repr(v).split())
    return text if len(text) <= limit else text[:limit - 1] + "…"
