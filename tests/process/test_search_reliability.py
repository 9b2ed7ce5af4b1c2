"""Reliability of Optuna searches (dse/explore/search.py, workers.py, storage.py): workers die with their parent,
killed trials are failed and replaced (journal at start, SQLAlchemy storages by heartbeat),
true trial counts, masked passwords, one-line errors for bad storage URLs, no wait on a
killed writer's journal lock, SIGINT and SIGTERM alike."""
import glob
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from test_search import _spec, postgres  # noqa: F401  (postgres: the fixture, used by name)

from basis.errors import DseError
from dse.explore import search as search_mod
from dse.explore.study import run_study
from dse.study.studyfile import load_study

ROOT = Path(__file__).resolve().parents[2]

STUDY_YAML = """\
name: reliability
space:
  hardware: [h100-sxm, b200]
  model: llama-2-7b
  batch: {{min: 1, max: 128}}
  memory_bandwidth: {{min: 1.0e12, max: 1.6e13, scale: log}}
  peak_fp16: {{min: 1.0e14, max: 4.0e15, scale: log}}
  flash_attention: true
objectives:
  output_tokens_per_s: max
  memory_bandwidth: min
  peak_fp16: min
constraints:
  tpot_s: {{max: 0.05}}
method: optuna
sampler: random
trials: {trials}
population: 10
seed: 0
"""

needs_proc = pytest.mark.skipif(not Path("/proc/self/stat").exists(),
                                reason="finds worker processes through /proc (Linux)")


def _study_file(tmp_path, trials):
    path = tmp_path / "study.yaml"
    path.write_text(STUDY_YAML.format(trials=trials))
    return path


def _cli(*args, env=None, **kw):
    e = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {})}
    return subprocess.Popen([sys.executable, "-m", "dse.study", *map(str, args)], cwd=ROOT, env=e,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _children(pid: int) -> list[int]:
    """Process ids whose parent is ``pid`` (from /proc/*/stat)."""
    kids = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            text = Path(stat).read_text()
        except OSError:
            continue
        if int(text[text.rindex(")") + 2:].split()[1]) == pid:
            kids.append(int(stat.split("/")[2]))
    return kids


def _alive(pid: int) -> bool:
    """Running (a zombie nobody reaps yet counts as dead)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return text[text.rindex(")") + 2:].split()[0] not in ("Z", "X")


def _wait_dead(pids, timeout=8.0) -> list[int]:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        left = [p for p in pids if _alive(p)]
        if not left:
            return []
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


def _wait_for_chunks(out: Path, n: int, proc, timeout=60.0):
    t0 = time.monotonic()
    while len(list((out / "chunks").glob("trials-*.parquet"))) < n:
        if proc.poll() is not None:
            pytest.fail(f"the run ended before it was killed: {proc.communicate()}")
        if time.monotonic() - t0 > timeout:
            proc.kill()
            pytest.fail("no trials after a minute")
        time.sleep(0.05)


def _counts(out, storage=None, study="dse"):
    """Trial counts of the Optuna study named ``study`` ("reliability" for STUDY_YAML's runs,
    "dse" for a spec built in Python)."""
    return search_mod.trial_counts(storage, Path(out), study)


# ------------------------------------------------------------ 1, 7: workers die with their parent

@needs_proc
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_workers_die_with_their_parent_and_rerun_is_exact(tmp_path, sig):
    trials, out = 80, tmp_path / "run"
    study = _study_file(tmp_path, trials)
    proc = _cli("run", study, "--out", out, "--workers", 2, "--quiet")
    _wait_for_chunks(out, 2, proc)
    workers = _children(proc.pid)
    assert len(workers) >= 2            # two workers (and multiprocessing's resource tracker)
    os.kill(proc.pid, sig)
    _, err = proc.communicate(timeout=30)
    left = _wait_dead(workers)
    assert not left, f"worker processes {left} outlived their parent"
    counts = _counts(out, study="reliability")
    assert counts["running"] == 0       # a stopped worker finishes its batch: no trial left running
    if sig == signal.SIGTERM:
        assert proc.returncode == 130
        # the message is the truth: the study's complete trials at the end (all of them when the
        # signal came after the last batch was told: a fast machine gets there between two polls)
        if counts["complete"] < trials:
            assert f"interrupted after {counts['complete']:,} of {trials:,} trials" in err
            assert len(pd.read_parquet(out / "results.parquet")) == counts["complete"]
        else:
            assert f"interrupted after all {trials:,} trials were complete" in err
    # the rerun (in this process: the report is not the point) finishes with exactly the trials asked
    run_study(load_study(str(study))[1], out, workers=2)
    counts = _counts(out, study="reliability")
    assert counts["complete"] == trials and counts["running"] == 0 and counts["waiting"] == 0
    res = pd.read_parquet(out / "results.parquet")
    assert len(res) == trials and res.trial.is_unique


@needs_proc
def test_watchdog_stops_a_worker_without_prctl(tmp_path):
    """The portable fallback alone (no PR_SET_PDEATHSIG): the worker sees its parent's
    process id change and stops."""
    child = ("import os, sys, time\n"
             "sys.platform = 'other'            # no prctl: the watchdog thread only\n"
             "from dse.explore import workers\n"
             "workers.die_with_parent(os.getppid())\n"
             "print(os.getpid(), flush=True)\n"
             "time.sleep(60)\n")
    parent = ("import subprocess, sys, time\n"
              f"p = subprocess.Popen([sys.executable, '-c', {child!r}], cwd={str(ROOT)!r})\n"
              "time.sleep(60)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", parent], env=env, cwd=ROOT)
    t0 = time.monotonic()
    kids = []
    while not kids and time.monotonic() - t0 < 20:
        time.sleep(0.1)
        kids = _children(proc.pid)
    assert kids
    time.sleep(1.0)                     # the child has armed its watchdog
    proc.kill()
    proc.wait()
    assert not _wait_dead(kids, timeout=5.0)


def test_a_failing_batch_leaves_no_trial_running(tmp_path, monkeypatch):
    real, calls = search_mod.evaluate_columns, []

    def fail_second(*a, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("evaluator bug")
        return real(*a, **kw)
    monkeypatch.setattr(search_mod, "evaluate_columns", fail_second)
    with pytest.raises(RuntimeError, match="evaluator bug"):
        run_study(_spec(trials=60), tmp_path)
    counts = _counts(tmp_path)
    assert counts["running"] == 0 and counts["complete"] == 20 and counts["fail"] == 20
    monkeypatch.setattr(search_mod, "evaluate_columns", real)
    rows = search_mod.run_search(_spec(trials=60), tmp_path)
    assert len(rows) == 60 and rows.attrs["trials"]["complete"] == 60


# ------------------------------------------------------------ 6: a killed writer's journal lock

def test_stale_journal_lock_and_running_trials_do_not_stall_a_rerun(tmp_path):
    import optuna
    run_study(_spec(trials=20), tmp_path)
    study = optuna.load_study(study_name="dse", storage=search_mod.open_storage(None, tmp_path))
    left = [study.ask() for _ in range(3)]           # a killed run's trials, still RUNNING
    assert _counts(tmp_path)["running"] == 3
    lock = tmp_path / "optuna.journal.lock"
    os.symlink(tmp_path / "optuna.journal", lock)     # a killed writer's lock, just now
    with open(tmp_path / "optuna.journal", "ab") as f:
        f.write(b'{"op_code": 5, "worker_id": "killed-mid-wr')   # and its unfinished last line
    t0 = time.monotonic()
    rows = search_mod.run_search(_spec(trials=40), tmp_path)
    assert time.monotonic() - t0 < 10                 # not Optuna's 30 s lock grace period
    counts = rows.attrs["trials"]
    assert counts["complete"] == 40 and counts["running"] == 0 and counts["fail"] >= len(left)
    assert len(rows) == 40 and not lock.exists()


# ------------------------------------------------------------ 2: heartbeats on SQLAlchemy storages

def test_heartbeat_settings(monkeypatch):
    monkeypatch.delenv("DSE_HEARTBEAT_S", raising=False)
    monkeypatch.delenv("DSE_HEARTBEAT_GRACE_S", raising=False)
    assert search_mod.heartbeat_settings() == (search_mod.HEARTBEAT_S, 3 * search_mod.HEARTBEAT_S)
    monkeypatch.setenv("DSE_HEARTBEAT_S", "0.5")
    assert search_mod.heartbeat_settings() == (0.5, 1.5)
    monkeypatch.setenv("DSE_HEARTBEAT_GRACE_S", "4")
    assert search_mod.heartbeat_settings() == (0.5, 4.0)
    monkeypatch.setenv("DSE_HEARTBEAT_S", "soon")
    with pytest.raises(DseError, match="DSE_HEARTBEAT_S"):
        search_mod.heartbeat_settings()


def test_sqlite_running_trials_failed_by_heartbeat(tmp_path, monkeypatch, capfd):
    """A trial left RUNNING (no heartbeat, as left by a worker killed at once or by an older
    version) in an SQLAlchemy storage is failed once stale and replaced: exact count."""
    monkeypatch.setenv("DSE_HEARTBEAT_S", "0.5")
    monkeypatch.setenv("DSE_HEARTBEAT_GRACE_S", "3")
    url = f"sqlite:///{tmp_path / 'study.db'}"
    spec = _spec(trials=12, sampler="random")
    study = search_mod._open_study(spec, tmp_path / "a", url, "dse", 0)
    for _ in range(3):
        study.ask()
    t0 = time.monotonic()
    rows = run_study(spec, tmp_path / "a", storage=url)
    assert 2.5 < time.monotonic() - t0 < 15        # waited about the grace period, no more
    counts = search_mod.trial_counts(url, tmp_path / "a")
    assert counts["complete"] == 12 and counts["running"] == 0 and counts["fail"] >= 3
    assert len(pd.read_parquet(tmp_path / "a" / "results.parquet")) == 12 and len(rows) > 0
    assert "heartbeat is older than 3 s" in capfd.readouterr().err


def test_postgresql_killed_worker_trials_are_replaced(tmp_path, postgres, monkeypatch):  # noqa: F811
    import optuna
    monkeypatch.setenv("DSE_HEARTBEAT_S", "0.5")
    monkeypatch.setenv("DSE_HEARTBEAT_GRACE_S", "3")
    out, spec = tmp_path / "run", _spec(trials=12, sampler="random")
    study = search_mod._open_study(spec, out, postgres, "dse", 0)
    stale = [study.ask() for _ in range(2)]                  # killed before its first heartbeat
    beaten = study.ask()
    study._storage.record_heartbeat(beaten._trial_id)         # killed after a heartbeat
    run_study(spec, out, storage=postgres, workers=2)
    counts = search_mod.trial_counts(postgres, out)
    assert counts["complete"] == 12 and counts["running"] == 0 and counts["fail"] >= len(stale) + 1
    res = pd.read_parquet(out / "results.parquet")
    assert len(res) == 12 and res.trial.is_unique
    states = {t.number: t.state.name for t in optuna.load_study(study_name="dse", storage=postgres).trials}
    assert all(states[t.number] == "FAIL" for t in stale + [beaten])


@needs_proc
def test_postgresql_sigkilled_worker_then_rerun(tmp_path, postgres, monkeypatch):  # noqa: F811
    """A worker SIGKILLed mid-run: the run fails (not exit 0 with fewer trials), the other
    worker stops, and the rerun fails the dead worker's trials by heartbeat and ends exact."""
    trials, out = 50, tmp_path / "run"
    study = _study_file(tmp_path, trials)
    env = {"DSE_HEARTBEAT_S": "0.5", "DSE_HEARTBEAT_GRACE_S": "2"}
    proc = _cli("run", study, "--out", out, "--workers", 2, "--quiet", "--storage", postgres, env=env)
    _wait_for_chunks(out, 2, proc)
    workers = [p for p in _children(proc.pid) if "spawn_main" in Path(f"/proc/{p}/cmdline").read_text()]
    assert len(workers) == 2
    os.kill(workers[0], signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "worker processes failed" in err
    assert not _wait_dead(workers)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    run_study(load_study(str(study))[1], out, storage=postgres, workers=2)
    counts = search_mod.trial_counts(postgres, out, "reliability")
    assert counts["complete"] == trials and counts["running"] == 0
    assert len(pd.read_parquet(out / "results.parquet")) == trials


# ------------------------------------------------------------ 3: true counts, shared storages

def test_trial_counts_and_rows_of_a_shared_storage(tmp_path, capfd):
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    assert search_mod.trial_counts(url, tmp_path / "a")["complete"] == 0
    assert search_mod.trial_counts(None, tmp_path / "nothing") == {
        "running": 0, "complete": 0, "pruned": 0, "fail": 0, "waiting": 0, "rows": 0}
    rows_a = search_mod.run_search(_spec(trials=10, sampler="random"), tmp_path / "a", storage_url=url)
    assert rows_a.attrs["trials"]["complete"] == 10 and rows_a.attrs["trials"]["rows"] == 10
    rows_b = search_mod.run_search(_spec(trials=25, sampler="random"), tmp_path / "b", storage_url=url)
    info = rows_b.attrs["trials"]
    assert info["asked"] == 25 and info["complete"] == 25 and info["rows"] == 15 and len(rows_b) == 15
    assert "15 of the study's 25 complete trials were evaluated in" in capfd.readouterr().err
    assert search_mod.trial_counts(url, tmp_path / "a")["rows"] == 10


# ------------------------------------------------------------ 4, 5: storage URLs

def test_display_url_masks_passwords():
    show = search_mod.display_url
    assert show("postgresql://bob:hunter22@db.example/dse") == "postgresql://bob:***@db.example/dse"
    assert "hunter22" not in show("postgresql+psycopg2://bob:hunter22@/dse?host=/tmp&port=5432")
    assert show("postgresql://bob@db/dse?password=hunter22&sslmode=require") == \
        "postgresql://bob@db/dse?password=***&sslmode=require"
    assert show("sqlite:///study.db") == "sqlite:///study.db" and show(None) is None
    assert "hunter22" not in show("weird scheme://bob:hunter22@host/x")


@pytest.mark.parametrize("url, expect", [
    ("sqlite:///:memory:", "in-memory SQLite"),
    ("sqlite://", "in-memory SQLite"),
    ("foo://bob:hunter22@x/db", "cannot open"),
    ("mysql://bob:hunter22@localhost/db", "driver"),
    ("postgresql+psycopg2://bob:hunter22@127.0.0.1:1/db", "cannot open"),
    ("sqlite:////no/such/folder/study.db", "no such folder"),
    ("postgresql://bob:hunter22@host:port/db", "not a valid"),
    ("not-a-url", "expected an SQLAlchemy URL"),
])
def test_bad_storage_urls_are_one_line(tmp_path, url, expect):
    with pytest.raises(DseError, match=expect) as e:
        run_study(_spec(trials=5), tmp_path, storage=url)
    msg = str(e.value)
    assert "\n" not in msg and "hunter22" not in msg


def test_cli_refuses_memory_sqlite_in_one_line(tmp_path):
    proc = _cli("run", _study_file(tmp_path, 5), "--out", tmp_path / "run", "--storage", "sqlite:///:memory:")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "Traceback" not in err
    assert err.strip().count("\n") == 0 and "sqlite:///study.db" in err
