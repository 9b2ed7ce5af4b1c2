"""Where the data dse ships lives: presets, model configs, studies, the calibration and the
measured results it was fitted on.

In a checkout they are the top-level folders ``configs/``, ``studies/`` and ``data/``. In an
installed wheel they are package data of ``dse`` (``dse/configs``, ``dse/studies``,
``dse/data``: ``pyproject.toml`` maps the folders there), found where the import system finds
the ``dse`` package (``importlib.util.find_spec``, without importing it).
A missing file is an error naming what is missing, never a silent fallback.
"""
from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path

from basis.errors import DseError

#: the folders of shipped data (top level in a checkout, inside ``dse`` in a wheel)
FOLDERS = ("configs", "studies", "data")

_CHECKOUT = Path(__file__).resolve().parent.parent


def _package_root() -> Path:
    """The installed ``dse`` package's folder (its source folder in a checkout)."""
    spec = find_spec("dse")
    places = list(spec.submodule_search_locations or []) if spec else []
    return Path(places[0]) if places else _CHECKOUT / "dse"


def shipped(*parts: str) -> Path:
    """The path of shipped data ``parts`` (e.g. ``shipped("configs", "hardware")``): inside the
    installed ``dse`` package when it holds the folder ``parts[0]``, else in the checkout.
    The path may not exist; ``shipped_file`` and ``shipped_folder`` check."""
    if parts[0] not in FOLDERS:
        raise ValueError(f"not a shipped folder: {parts[0]}")
    packaged = _package_root() / parts[0]
    root = packaged.parent if packaged.is_dir() else _CHECKOUT
    return root.joinpath(*parts)


def _missing(p: Path, what: str) -> DseError:
    return DseError(f"{p}: {what} shipped with dse is missing from this installation; "
                    f"reinstall the package (pip install --force-reinstall dse-llm) or use a complete checkout")


def shipped_file(*parts: str, what: str = "the data file") -> Path:
    """``shipped(*parts)``, a file that exists; DseError naming it otherwise."""
    p = shipped(*parts)
    if not p.is_file():
        raise _missing(p, what)
    return p


def shipped_folder(*parts: str, what: str = "the data folder") -> Path:
    """``shipped(*parts)``, a folder that exists; DseError naming it otherwise."""
    p = shipped(*parts)
    if not p.is_dir():
        raise _missing(p, what)
    return p
