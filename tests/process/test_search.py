"""Optuna search: exact trial counts, resume after SIGINT/SIGTERM, shared storage across
worker processes (journal file and a real PostgreSQL server), determinism."""
import glob
import os
import shutil
import signal
import socket
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from basis.errors import DseError
from dse.explore import search as search_mod
from dse.explore.space import DesignSpace
from dse.explore.spec import SweepSpec
from dse.explore.study import run_study

SPACE = dict(hardware=["h100-sxm", "b200"], model="llama-2-7b", batch={"min": 1, "max": 128},
             memory_bandwidth={"min": 1e12, "max": 1.6e13, "scale": "log"},
             peak_fp16={"min": 1e14, "max": 4e15, "scale": "log"}, flash_attention=True)
OBJECTIVES = {"output_tokens_per_s": "max", "memory_bandwidth": "min", "peak_fp16": "min"}


def _spec(trials=60, sampler="nsga2", seed=0, **kw):
    return SweepSpec(DesignSpace(dict(SPACE)), method="optuna", sampler=sampler, trials=trials, population=20,
                     seed=seed, objectives=OBJECTIVES, constraints={"tpot_s": {"max": 0.05}}, **kw)


def _states(out, storage=None):
    import optuna
    study = optuna.load_study(study_name="dse", storage=search_mod.open_storage(storage, Path(out)))
    return pd.Series([t.state.name for t in study.trials]).value_counts().to_dict(), study


@pytest.mark.parametrize("sampler", ["nsga2", "nsga3", "tpe", "random", "qmc"])
def test_exact_trials_results_and_pareto(tmp_path, sampler):
    front = run_study(_spec(sampler=sampler), tmp_path)
    counts, study = _states(tmp_path)
    assert counts.get("COMPLETE") == 60
    res = pd.read_parquet(tmp_path / "results.parquet")
    assert sorted(res.trial) == sorted(t.number for t in study.trials if t.state.name == "COMPLETE")
    assert res.feasible.dtype == bool and res.trial.is_unique
    # every told value is the evaluated metric of that trial
    by_trial = res.set_index("trial")
    for t in study.trials[:10]:
        assert t.values[0] == pytest.approx(by_trial.loc[t.number, "output_tokens_per_s"])
        c = t.constraints.values() if isinstance(t.constraints, dict) else t.constraints
        assert (max(c) <= 0) == bool(by_trial.loc[t.number, "feasible"])
    pareto = pd.read_csv(tmp_path / "pareto.csv")
    assert set(pareto.trial) <= set(res[res.feasible].trial) and len(pareto) == len(front)
    # presets are enqueued as baselines: the first trials are the two presets' own designs
    first = {t.params["hardware"] for t in study.trials[:2]}
    assert first == {"h100-sxm", "b200"}


def test_same_seed_same_trials(tmp_path):
    run_study(_spec(seed=5), tmp_path / "a")
    run_study(_spec(seed=5), tmp_path / "b")
    a = pd.read_parquet(tmp_path / "a" / "results.parquet")
    b = pd.read_parquet(tmp_path / "b" / "results.parquet")
    pd.testing.assert_frame_equal(a, b)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_then_rerun_ends_with_exact_trials(tmp_path, monkeypatch, sig):
    real = search_mod.evaluate_columns
    calls = []

    def evaluate_then_signal(*a, **kw):
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), sig)       # arrives mid-batch: the batch is finished, then it stops
        return real(*a, **kw)
    monkeypatch.setattr(search_mod, "evaluate_columns", evaluate_then_signal)
    with pytest.raises(search_mod.Interrupted, match="interrupted after 60 of 100 trials"):
        run_study(_spec(trials=100), tmp_path)
    counts, _ = _states(tmp_path)
    assert counts == {"COMPLETE": 60}
    assert len(pd.read_parquet(tmp_path / "results.parquet")) == 60   # partial results kept
    monkeypatch.setattr(search_mod, "evaluate_columns", real)
    run_study(_spec(trials=100), tmp_path)
    counts, study = _states(tmp_path)
    assert counts == {"COMPLETE": 100}
    res = pd.read_parquet(tmp_path / "results.parquet")
    assert len(res) == 100 and res.trial.is_unique


def test_two_workers_share_one_journal(tmp_path):
    front = run_study(_spec(trials=120), tmp_path, workers=2)
    counts, study = _states(tmp_path)
    assert counts == {"COMPLETE": 120}        # racing workers ask no trial beyond the target
    res = pd.read_parquet(tmp_path / "results.parquet")
    assert len(res) == 120 and res.trial.is_unique
    # the workers wrote the journal a whole population at a time, in turns
    assert (tmp_path / "optuna.journal").read_text().count('"dse:population"') == 120 // 20
    # the evaluation time of both workers is counted
    info = front.attrs["trials"]
    assert 0 < info["evaluation_s"] and 0 < info["evaluation_share"] < 1


def test_bad_optuna_settings():
    with pytest.raises(DseError, match="sampler"):
        _spec(sampler="annealing")
    with pytest.raises(DseError, match="trials"):
        SweepSpec(DesignSpace(dict(SPACE)), method="optuna", objectives=OBJECTIVES)
    with pytest.raises(DseError, match="at least one objective"):
        SweepSpec(DesignSpace(dict(SPACE)), method="optuna", trials=5)
    with pytest.raises(DseError, match="storage"):
        search_mod.open_storage("not-a-url", Path("."))


# ------------------------------------------------------------ a real PostgreSQL server

def _pg_bin(name):
    found = shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))), None)
    return found


@pytest.fixture
def postgres(tmp_path):
    """A throwaway PostgreSQL server on a Unix socket; yields its SQLAlchemy URL."""
    pytest.importorskip("psycopg2", reason="psycopg2 (the PostgreSQL driver) is not installed")
    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    if not (initdb and pg_ctl):
        pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl) on this machine")
    import tempfile
    data = Path(tempfile.mkdtemp(prefix="dse-pg-"))     # under /tmp: reachable by the server's user
    run_as = []
    if os.geteuid() == 0:                      # the server refuses to run as root
        if shutil.which("runuser") is None or subprocess.run(["id", "postgres"], capture_output=True).returncode:
            pytest.skip("running as root without a 'postgres' user to start the server as")
        shutil.chown(data, "postgres")
        run_as = ["runuser", "-u", "postgres", "--"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    subprocess.run(run_as + [initdb, "-D", str(data), "-U", "postgres", "--auth=trust"], check=True,
                   capture_output=True)
    subprocess.run(run_as + [pg_ctl, "-D", str(data), "-w", "-l", str(data / "log"), "-o",
                             f"-k {data} -p {port} -c listen_addresses=''", "start"], check=True, capture_output=True)
    try:
        yield f"postgresql+psycopg2://postgres@/postgres?host={data}&port={port}"
    finally:
        subprocess.run(run_as + [pg_ctl, "-D", str(data), "-w", "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(data, ignore_errors=True)


def test_postgresql_storage_two_workers(tmp_path, postgres):
    out = tmp_path / "run"
    run_study(_spec(trials=40), out, storage=postgres, workers=2)
    counts, study = _states(out, postgres)
    assert counts == {"COMPLETE": 40}         # the advisory lock: no trial asked beyond the target
    res = pd.read_parquet(out / "results.parquet")
    assert len(res) == 40 and res.trial.is_unique
    # rerunning against the finished study adds nothing
    run_study(_spec(trials=40), out, storage=postgres)
    assert _states(out, postgres)[0]["COMPLETE"] == 40
