"""The one exception type user-facing code raises for bad input."""


class DseError(Exception):
    """Bad input or an impossible request; the CLI prints its message on one line
    and exits non-zero."""
