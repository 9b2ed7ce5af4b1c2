"""A run folder under concurrency, signals and hostile names: a second run on a folder in
use is refused and corrupts nothing, SIGTERM stops a sweep as Ctrl-C does, a killed run
leaves nothing locked, a run writes and deletes only its own files in its own folder."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import ROOT

from basis.errors import DseError
from basis.yamlfile import MAX_NODES, load_yaml
from dse.explore.runio import LOCK_FILE, RunLock
from dse.study.studyfile import load_study

POINTS = 400 * 500


def _study(tmp_path: Path, name: str = "race", small: bool = False, **extra) -> Path:
    """A hardware-only grid of ``POINTS`` points in 20 chunks (a few seconds of work), or of 4."""
    f = tmp_path / f"{name}.yaml"
    f.write_text(yaml.safe_dump({
        "name": name,
        "space": {"hardware": "h100-sxm", "model": "llama-2-7b",
                  "memory_bandwidth": {"min": 1.0e12, "max": 8.0e12, "count": 2 if small else 400},
                  "memory_capacity": {"min": 4.0e10, "max": 2.0e11, "count": 2 if small else 500}},
        "objectives": {"output_tokens_per_s": "max", "memory_bandwidth": "min"},
        "chunk_size": 1 if small else POINTS // 20, **extra}))
    return f


def _start(*args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "dse.study", *map(str, args)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(cond, timeout=60.0):
    t0 = time.time()
    while not cond():
        if time.time() - t0 > timeout:
            raise TimeoutError
        time.sleep(0.02)


def _complete(out: Path, points: int = POINTS) -> None:
    res = pd.read_parquet(out / "results.parquet")
    assert len(res) == points and res["point"].is_unique
    assert not (out / "chunks").exists()


def test_second_run_on_a_folder_in_use_is_refused_and_corrupts_nothing(tmp_path, cli):
    study, out = _study(tmp_path), tmp_path / "out"
    first = _start("run", study, "--out", out, "--quiet")
    _wait_for(lambda: any((out / "chunks").glob("part-*.parquet")) or first.poll() is not None)
    second = cli("run", study, "--out", out, "--quiet")
    assert first.wait(120) == 0, first.stderr.read()
    assert second.returncode == 2 and "Traceback" not in second.stderr
    assert "another dse run is using this folder" in second.stderr and len(second.stderr.splitlines()) == 1
    _complete(out)
    assert cli("run", study, "--out", out, "--quiet").returncode == 0        # free again once the first is done
    _complete(out)


def test_runs_started_together_leave_one_complete_result(tmp_path):
    study, out = _study(tmp_path), tmp_path / "out"
    procs = [_start("run", study, "--out", out, "--quiet") for _ in range(3)]
    codes = [p.wait(180) for p in procs]
    errs = [p.stderr.read() for p in procs]
    assert 0 in codes
    for rc, err in zip(codes, errs):
        assert rc == 0 or (rc == 2 and "another dse run is using this folder" in err), err
    _complete(out)
    assert not list(out.glob("*.tmp")) and not list(out.glob(".*.tmp"))


def test_a_lock_held_in_this_process_refuses_the_cli_and_is_reentrant(tmp_path, cli):
    out = tmp_path / "out"
    out.mkdir()
    with RunLock(out), RunLock(out):             # re-entrant within one process
        r = cli("run", _study(tmp_path, small=True), "--out", out, "--quiet")
        assert r.returncode == 2 and f"(process {os.getpid()})" in r.stderr
    assert (out / LOCK_FILE).exists()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_a_sweep_and_the_rerun_resumes(tmp_path, cli, sig):
    study, out = _study(tmp_path), tmp_path / "out"
    p = _start("run", study, "--out", out, "--quiet")
    _wait_for(lambda: len(list((out / "chunks").glob("part-*.parquet"))) >= 2 or p.poll() is not None)
    p.send_signal(sig)
    rc, err = p.wait(60), p.stderr.read()
    if rc == 0:
        pytest.skip("the sweep finished before the signal arrived")
    assert rc == 130 and "interrupted" in err and "Traceback" not in err, err
    kept = sorted((out / "chunks").glob("part-*.parquet"))
    assert kept and all(pd.read_parquet(f).shape[0] == POINTS // 20 for f in kept)
    r = cli("run", study, "--out", out, "--quiet")
    assert r.returncode == 0, r.stderr
    _complete(out)


def test_a_killed_run_leaves_the_folder_free(tmp_path, cli):
    study, out = _study(tmp_path), tmp_path / "out"
    p = _start("run", study, "--out", out, "--quiet")
    _wait_for(lambda: any((out / "chunks").glob("part-*.parquet")) or p.poll() is not None)
    p.kill()
    p.wait(30)
    t0 = time.time()
    r = cli("run", study, "--out", out, "--quiet")
    assert r.returncode == 0, r.stderr
    assert time.time() - t0 < 60
    _complete(out)


def test_a_run_deletes_only_its_own_files(tmp_path, cli):
    study, out = _study(tmp_path, small=True), tmp_path / "out"
    (out / "chunks").mkdir(parents=True)
    mine = out / "chunks" / "notes.txt"
    mine.write_text("the user's")
    (out / "other.txt").write_text("the user's")
    r = cli("run", study, "--out", out, "--quiet")
    assert r.returncode == 0, r.stderr
    assert mine.read_text() == "the user's" and (out / "other.txt").exists()
    assert not list((out / "chunks").glob("part-*"))


@pytest.mark.parametrize("name", ["/tmp/dse-abs-name", "../../escape", "a/b", "", ".hidden", "x" * 101])
def test_a_study_name_that_is_a_path_is_refused(tmp_path, name):
    f = _study(tmp_path)
    data = yaml.safe_load(f.read_text())
    data["name"] = name
    f.write_text(yaml.safe_dump(data))
    with pytest.raises(DseError, match=r"name: .* is not a plain name"):
        load_study(str(f))


def test_the_default_folder_is_under_runs(tmp_path):
    study = _study(tmp_path, name="plain.name-1", small=True)
    r = subprocess.run([sys.executable, "-m", "dse.study", "run", study, "--quiet"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "runs" / "plain.name-1" / "results.parquet").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain.name-1.yaml", "runs"]


@pytest.mark.parametrize("out", ["/proc/dse-out", "{file}", "{file}/sub", "/dev/null/x"])
def test_an_output_folder_that_cannot_be_written_is_one_line(tmp_path, cli, out):
    f = tmp_path / "a-file"
    f.write_text("x")
    r = cli("run", _study(tmp_path, small=True), "--out", out.format(file=f), "--quiet")
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    assert r.stderr.startswith("dse.study: error: --out ")
    assert f.read_text() == "x"


def test_a_changed_study_names_what_changed(tmp_path, cli):
    study, out = _study(tmp_path, small=True), tmp_path / "out"
    assert cli("run", study, "--out", out, "--quiet").returncode == 0
    r = cli("run", study, "--out", out, "--quiet", "--seed", "7")
    assert r.returncode == 2
    line = r.stderr.strip()
    assert "\n" not in line and "seed changed" in line and "--overwrite" in line and "new --out" in line, line


def test_alias_bomb_is_refused_quickly_everywhere(tmp_path, cli):
    levels = "".join(f"{c}: &{c} [{', '.join([f'*{p}'] * 9) if p else ', '.join(['x'] * 9)}]\n"
                     for p, c in zip([None, *"abcdefgh"], "abcdefghi"))     # 9**9 strings from 1 KB
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(levels + "name: bomb\nspace: {hardware: h100-sxm, model: llama-2-7b}\n")
    assert len(bomb.read_bytes()) < 1200
    t0 = time.time()
    for args in (("run", bomb, "--out", tmp_path / "o"), ("show", "study", bomb),
                 ("analyze", "--model", "llama-2-7b", "--hardware", bomb)):
        r = cli(*args, timeout=30)
        assert r.returncode == 2 and f"beyond {MAX_NODES:,} values" in r.stderr, r.stderr
    assert time.time() - t0 < 20


def test_anchors_within_the_bound_still_work(tmp_path):
    f = tmp_path / "a.yaml"
    f.write_text("base: &b {min: 1, max: 2}\nx: *b\ny: *b\n")
    assert load_yaml(f, "test") == {"base": {"min": 1, "max": 2}, "x": {"min": 1, "max": 2},
                                    "y": {"min": 1, "max": 2}}
