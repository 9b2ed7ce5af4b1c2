"""The wheel carries everything dse needs, and works outside the checkout.

A wheel is built from the checkout, installed (without its dependencies, which this
environment has) into a folder outside it, and run from another folder with that folder
first on the path, so every import and every data file comes from the installed copy.
"""
import importlib.metadata
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
DATA_FOLDERS = {"configs": "dse.configs", "studies": "dse.studies", "data": "dse.data"}


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_package_list_matches_the_folders():
    # every code folder with an __init__.py is listed, and every folder of shipped data with files
    cfg = _pyproject()["tool"]["setuptools"]
    code = {str(p.parent.relative_to(ROOT)).replace("/", ".")
            for top in ("dse", "hwmodels", "workloads", "basis") for p in (ROOT / top).rglob("__init__.py")}
    data = {DATA_FOLDERS[top] + "".join("." + part for part in p.relative_to(ROOT / top).parts)
            for top in DATA_FOLDERS for p in [ROOT / top, *(ROOT / top).rglob("*")] if p.is_dir()
            and any(f.is_file() for f in p.iterdir())}
    assert set(cfg["packages"]) == code | data
    assert cfg["package-dir"] == {v: k for k, v in DATA_FOLDERS.items()}
    assert _pyproject()["project"]["name"] == "dse-llm"
    assert _pyproject()["project"]["scripts"]["dse"] == "dse.study.cli:main"


def _setuptools_major() -> int:
    try:
        return int(importlib.metadata.version("setuptools").split(".")[0])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return 0


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(folder the wheel is installed in, the wheel) for this module's tests."""
    if shutil.which("pip") is None and subprocess.run([sys.executable, "-m", "pip", "--version"],
                                                       capture_output=True).returncode:
        pytest.skip("pip is not available to build a wheel")
    tmp = tmp_path_factory.mktemp("wheel")
    build = tmp / "build"
    shutil.copytree(ROOT, build, ignore=shutil.ignore_patterns(".git", ".venv*", "runs", "build", "*.egg-info",
                                                              "__pycache__", ".hypothesis"))
    # build with this environment's setuptools when it is recent enough (no download), else in
    # pip's isolated build environment (as `pip install` does)
    isolation = ["--no-build-isolation"] if _setuptools_major() >= 77 else []
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-q", str(build),
                        "-w", str(tmp / "dist")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    wheel, = (tmp / "dist").glob("dse_llm-*.whl")
    site = tmp / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return site, wheel


def _run(site: Path, cwd: Path, *args, timeout=300):
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site), "HOME": str(cwd), "MPLBACKEND": "Agg"}
    return subprocess.run([sys.executable, "-m", "dse.study", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _checkout(*args):
    return subprocess.run([sys.executable, "-m", "dse.study", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_wheel_holds_every_shipped_file(installed):
    _, wheel = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    for top, package in DATA_FOLDERS.items():
        for f in (ROOT / top).rglob("*"):
            if f.is_file() and f.suffix in (".yaml", ".json", ".csv", ".md"):
                inside = package.replace(".", "/") + "/" + str(f.relative_to(ROOT / top))
                assert inside in names, inside
    assert not any(n.startswith(("configs/", "studies/", "data/", "tests/")) for n in names)


def test_installed_wheel_gives_the_checkouts_numbers(installed, tmp_path):
    site, _ = installed
    where = subprocess.run(
        [sys.executable, "-c", "import dse, workloads; print(dse.__file__); print(workloads.__file__)"],
        cwd=tmp_path, env={"PYTHONPATH": str(site)}, capture_output=True, text=True)
    assert all(line.startswith(str(site)) for line in where.stdout.split()), where.stdout
    for args in (("list", "models"), ("list", "hardware"), ("list", "studies"),
                 ("analyze", "--model", "llama-2-7b", "--hardware", "h100-sxm", "--batch", "8", "--weights", "fp8"),
                 ("analyze", "--model", str(ROOT / "configs" / "models" / "qwen3-8b.json"),
                  "--hardware", str(ROOT / "configs" / "hardware" / "mi300x.yaml"))):
        out = _run(site, tmp_path, *args)
        ref = _checkout(*args)
        assert out.returncode == ref.returncode == 0, out.stderr
        assert out.stdout == ref.stdout, args
    assert "calibrated" in _run(site, tmp_path, "analyze", "--model", "llama-2-7b", "--hardware", "h100-sxm").stdout


def test_installed_wheel_runs_a_shipped_study_outside_the_checkout(installed, tmp_path):
    site, _ = installed
    r = _run(site, tmp_path, "run", "decode-bandwidth", "--out", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    assert all((tmp_path / "out" / f).is_file() for f in ("summary.md", "report.html"))
    assert len(pd.read_parquet(tmp_path / "out" / "results.parquet")) > 0     # a dataset: one file per chunk
    assert not (tmp_path / "runs").exists()
    # the same study in the checkout gives the same rows
    ref = tmp_path / "ref"
    assert _checkout("run", "decode-bandwidth", "--out", ref).returncode == 0
    a, b = pd.read_parquet(tmp_path / "out" / "results.parquet"), pd.read_parquet(ref / "results.parquet")
    pd.testing.assert_frame_equal(a, b)


def test_missing_shipped_data_is_an_error_not_a_fallback(installed, tmp_path):
    site, _ = installed
    broken = tmp_path / "site"
    shutil.copytree(site, broken)
    (broken / "dse" / "configs" / "calibration.yaml").unlink()
    r = _run(broken, tmp_path, "analyze", "--model", "llama-2-7b", "--hardware", "h100-sxm")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    line, = r.stderr.strip().splitlines()
    assert "calibration.yaml" in line and "reinstall" in line
    shutil.rmtree(broken / "dse" / "configs" / "models")
    r = _run(broken, tmp_path, "list", "models")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "model configs" in r.stderr
    shutil.rmtree(broken / "dse" / "studies")
    r = _run(broken, tmp_path, "run", "quant-roofline", "--out", tmp_path / "x")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "shipped studies" in r.stderr
