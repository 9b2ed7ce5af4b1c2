"""The one exception type user-facing code raises for bad input, and the number check
every input reader shares."""


class DseError(Exception):
    """Bad input or an impossible request; the CLI prints its message on one line
    and exits non-zero."""


def as_number(v, where: str) -> float:
    """``v`` as a float, accepting numeric strings (YAML 1.1 reads ``1.0e12`` as a
    string); DseError naming ``where`` for anything else (booleans included)."""
    if isinstance(v, str):
        try:
            v = float(v)
        except ValueError:
            raise DseError(f"{where}: expected a number, got {v!r}") from None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise DseError(f"{where}: expected a number, got {v!r}")
    return float(v)
