"""What determines a run's numbers, recorded in its folder: the dse version and a fingerprint
of the model (the Python code of the packages that compute results and the shipped data they
read). A run folder is resumed only by the model that wrote it (``dse.explore.runio``)."""
from __future__ import annotations

import hashlib
from functools import lru_cache
from importlib import metadata
from importlib.util import find_spec
from pathlib import Path

from basis.shipped import shipped

#: the distribution dse installs as (pyproject.toml)
DISTRIBUTION = "dse-llm"
#: the packages whose code determines results
MODEL_PACKAGES = ("dse", "workloads", "hwmodels", "basis")
#: the shipped data folders the model reads (studies are compared on their own: ``study.json``)
MODEL_DATA = ("configs", "data")


def _package_folder(name: str) -> Path | None:
    """The folder of the importable package ``name`` (found without importing it), or None."""
    spec = find_spec(name)
    places = list(spec.submodule_search_locations or []) if spec else []
    return Path(places[0]) if places else None


def _model_files() -> list[tuple[str, Path]]:
    """(name relative to its root, path) of every file the fingerprint covers, sorted by name."""
    files = []
    for name in MODEL_PACKAGES:
        root = _package_folder(name)
        if root is not None:
            files += [(f"{name}/{p.relative_to(root).as_posix()}", p) for p in root.rglob("*.py")]
    for name in MODEL_DATA:
        root = shipped(name)
        if root.is_dir():
            files += [(f"{name}/{p.relative_to(root).as_posix()}", p) for p in root.rglob("*")
                      if p.is_file() and "__pycache__" not in p.parts]
    return sorted(files)


@lru_cache(maxsize=1)
def model_fingerprint() -> str:
    """A hex digest (16 characters) over the names and bytes of the model's files
    (``MODEL_PACKAGES``' .py files, ``MODEL_DATA``'s files): it changes when any of them does.
    Computed once per process (about 10 ms)."""
    h = hashlib.blake2b(digest_size=8)
    for name, path in _model_files():
        h.update(name.encode() + b"\0")
        try:
            h.update(path.read_bytes())
        except OSError:
            h.update(b"\1unreadable")
        h.update(b"\0")
    return h.hexdigest()


@lru_cache(maxsize=1)
def dse_version() -> str:
    """The installed dse's version (its distribution, ``DISTRIBUTION``), or 'unknown' where it is not installed."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"


def model_stamp() -> dict:
    """What a run folder records of the model that wrote it: {'dse_version', 'model'}."""
    return {"dse_version": dse_version(), "model": model_fingerprint()}


def stamp_differences(stored, current: dict) -> list[str]:
    """The parts of ``current`` (``model_stamp``) that the ``stored`` stamp does not match, as
    words for a message: 'dse version 0.1.0 there, 0.2.0 now', 'model code and data (a1b2 there,
    c3d4 now)'; ['no record of the model that wrote it (an earlier dse)'] when ``stored`` is not a stamp."""
    if not isinstance(stored, dict) or not all(isinstance(stored.get(k), str) for k in current):
        return ["no record of the model that wrote it (an earlier dse)"]
    out = []
    if stored["dse_version"] != current["dse_version"]:
        out.append(f"dse version {_cut(stored['dse_version'])} there, {current['dse_version']} now")
    if stored["model"] != current["model"]:
        out.append(f"model code and data {_cut(stored['model'])} there, {current['model']} now")
    return out


def _cut(text: str, limit: int = 24) -> str:
    """``text`` on one line, at most ``limit`` characters (a stored value named in a message)."""
    text = text.encode("unicode_escape").decode("ascii")
    return text if len(text) <= limit else text[:limit - 1] + "…"
