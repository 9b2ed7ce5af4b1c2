"""The ``explore`` subcommand of ``python -m dse.study``: ``dse explore [RUN_DIR] [--port N] [--host H]``.

Dash, Plotly and pandas are imported when ``explore`` runs, so that the ``analyze`` path stays light.
"""
from __future__ import annotations

import argparse
import logging
import socket
import sys

from basis.errors import DseError

#: the address served by default: this machine only
HOST = "127.0.0.1"
PORT = 8050


def _port(text: str) -> int:
    try:
        v = int(text) if text.isascii() else -1
    except ValueError:
        v = -1
    if not 0 < v < 65536:
        raise argparse.ArgumentTypeError(f"expected a TCP port from 1 to 65535, got '{text}'")
    return v


def add_parsers(command) -> None:
    """Add the ``explore`` subcommand; ``command(name, text)`` makes a subparser (with its examples)."""
    e = command("explore", "a local web app: a design point's operators on the roofline, live, and a run's "
                           "designs to plot, filter, hover and compare")
    e.add_argument("run", nargs="?", default=None, metavar="RUN_DIR",
                   help="a run folder to open in the run view (runs/<study name>; default: pick one of ./runs)")
    e.add_argument("--port", type=_port, default=PORT, help="TCP port to serve on")
    e.add_argument("--host", default=HOST,
                   help="address to serve on (default: 127.0.0.1, this machine only; the page fetches nothing "
                        "from elsewhere)")


def cmd_explore(args) -> int:
    """Check the run folder (one line and exit 2 when it holds no run), then serve the app until Ctrl-C."""
    from dse.app.callbacks import get_run  # dash, plotly and pandas: only when explore runs
    from dse.app.layout import make_app
    if args.run is not None:
        get_run(args.run)
    _check_free(args.host, args.port)
    app = make_app(args.run)
    print(f"dse explore: serving on http://{args.host}:{args.port}/ (Ctrl-C to stop)", file=sys.stderr)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)    # no line per request on the terminal
    try:
        app.run(host=args.host, port=args.port, debug=False, dev_tools_ui=False, dev_tools_hot_reload=False,
                dev_tools_disable_version_check=True)
    except KeyboardInterrupt:
        pass                                                   # Ctrl-C: the server stops, nothing to keep
    return 0


def _check_free(host: str, port: int) -> None:
    """DseError naming --port or --host when this process cannot listen on ``host``:``port``
    (in use, not an address of this machine)."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
    except OSError as e:
        raise DseError(f"--port {port} / --host {host}: cannot serve there ({e.strerror or e}); give another "
                       f"--port") from None


COMMANDS = {"explore": cmd_explore}
