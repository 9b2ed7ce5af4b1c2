import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = ROOT.parent / "shared" / "data"
VENDORED = Path(__file__).resolve().parent / "data"
#: tests of processes and storage (workers, kills and resume, locks, Dask, plot helpers, Optuna
#: storages and PostgreSQL, the browser, the wheel): all in the slow tier
PROCESS_TESTS = Path(__file__).resolve().parent / "process"


def pytest_collection_modifyitems(items):
    """Mark every test under ``PROCESS_TESTS`` ``slow`` (the folder is the tier; ``-m "not slow"``
    deselects them)."""
    for item in items:
        if item.path.is_relative_to(PROCESS_TESTS):
            item.add_marker(pytest.mark.slow)


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


#: a calibration that stays put when the shipped one is refitted (tests/data/calibration_fixed.yaml)
FIXED_CALIBRATION = VENDORED / "calibration_fixed.yaml"


@pytest.fixture(scope="module")
def fixed_calibration():
    """Every default of the module's tests from ``FIXED_CALIBRATION`` (``$DSE_CALIBRATION``,
    subprocesses included): for tests of the model's behaviour, not of the fitted values."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DSE_CALIBRATION", str(FIXED_CALIBRATION))
        yield FIXED_CALIBRATION


@pytest.fixture
def keep_signals():
    """`dse run` installs its SIGTERM handler in the test's process: put the old handlers back."""
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, h in old.items():
        signal.signal(s, h)
