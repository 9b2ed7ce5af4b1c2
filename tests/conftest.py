import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = ROOT.parent / "shared" / "data"
VENDORED = Path(__file__).resolve().parent / "data"


def reference_file(name: str) -> Path:
    """A reference-data file: ../shared/data when present, else the copy dse ships (data/) or
    the copy in tests/data."""
    for p in (SHARED_DATA / name, ROOT / "data" / name, VENDORED / name):
        if p.is_file():
            return p
    return VENDORED / name


def run_cli(*args, timeout=60):
    """Run ``python -m dse.study ARGS`` in a subprocess; return CompletedProcess."""
    return subprocess.run([sys.executable, "-m", "dse.study", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def cli():
    return run_cli
