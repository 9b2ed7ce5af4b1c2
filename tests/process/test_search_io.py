"""The Optuna journal written a population at a time (dse/explore/optuna_journal.py): the
same trials and records as Optuna's op-by-op writes, resume exact to one population after
a kill (between populations, mid-write), a writer from outside during a population, the
repair of a torn end, and the share of the time spent in dse's evaluation."""
import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pandas as pd
import pytest
from optuna.storages.journal import JournalFileBackend
from test_search import _spec

from dse.explore import optuna_journal as oj
from dse.explore import search as search_mod

ROOT = Path(__file__).resolve().parents[2]
POP = 20          # _spec's population


def _plain(out: Path, name: str = "dse"):
    """The study as plain Optuna reads the run folder's journal."""
    storage = optuna.storages.JournalStorage(JournalFileBackend(str(out / "optuna.journal")))
    return optuna.load_study(study_name=name, storage=storage)


def _trial_record(t) -> tuple:
    return (t.number, t.state.name, t.params, t.distributions, t.values, t.user_attrs, t.system_attrs)


def _records(out: Path) -> list[dict]:
    """The journal's records minus population markers, worker ids and times."""
    logs = [json.loads(line) for line in (out / "optuna.journal").read_text().splitlines()]
    drop = ("worker_id", "datetime_start", "datetime_complete")
    return [{k: v for k, v in log.items() if k not in drop} for log in logs
            if oj.POPULATION_ATTR not in log.get("system_attr", {})]


def test_batched_journal_holds_what_optuna_writes_op_by_op(tmp_path, monkeypatch):
    monkeypatch.setenv("DSE_JOURNAL_BATCH", "0")
    search_mod.run_search(_spec(trials=60), tmp_path / "op")
    monkeypatch.setenv("DSE_JOURNAL_BATCH", "1")
    search_mod.run_search(_spec(trials=60), tmp_path / "pop")
    # the same records in the same order, plus one marker per population
    assert _records(tmp_path / "pop") == _records(tmp_path / "op")
    text = (tmp_path / "pop" / "optuna.journal").read_text()
    assert text.count(f'"{oj.POPULATION_ATTR}"') == 60 // POP
    assert f'"{oj.POPULATION_ATTR}"' not in (tmp_path / "op" / "optuna.journal").read_text()
    # so plain Optuna reads the same study: parameters, values, user attrs, constraints
    a, b = _plain(tmp_path / "op"), _plain(tmp_path / "pop")
    assert [_trial_record(t) for t in a.trials] == [_trial_record(t) for t in b.trials]
    assert all(t.state.name == "COMPLETE" and t.constraints for t in b.trials)
    assert a.user_attrs == b.user_attrs and a.metric_names == b.metric_names
    sys_a, sys_b = (s._storage.get_study_system_attrs(s._study_id) for s in (a, b))
    assert set(sys_b.pop(oj.POPULATION_ATTR)) == {"lines"} and sys_b == sys_a
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "op" / "results.parquet"),
                                  pd.read_parquet(tmp_path / "pop" / "results.parquet"))


CHILD = """
import os, sys
from pathlib import Path
from test_search import _spec
from dse.explore import optuna_journal as oj, search
how, out = sys.argv[1], Path(sys.argv[2])
cls = oj.JournalFile
real_write, real_record = cls._write, search.record
state = {"populations": 0, "records": 0}

def record(storage, study_id, items):      # population 3 evaluated, its rows written: killed
    state["records"] += 1
    if how == "between" and state["records"] == 3:
        os._exit(9)
    return real_record(storage, study_id, items)

def write(self, lines, expect_size=None):  # population 3 killed in the middle of its write
    if expect_size is None:
        return real_write(self, lines, expect_size)
    state["populations"] += 1
    if state["populations"] == 3:
        data = ("\\n".join(lines) + "\\n").encode()
        cut = data.index(b"\\n", len(data) // 2) + 1 if how == "mid-write-at-a-line" else len(data) // 2 + 7
        with open(self.path, "ab") as f:
            f.write(data[:cut])
        os._exit(9)
    return real_write(self, lines, expect_size)

search.record = record
cls._write = write
search.run_search(_spec(trials=100), out)
"""


@pytest.mark.parametrize("how", ["between", "mid-write", "mid-write-at-a-line"])
def test_a_killed_run_resumes_from_the_last_population_written_whole(tmp_path, how):
    ref = tmp_path / "ref"
    search_mod.run_search(_spec(trials=100), ref)
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(Path(__file__).resolve().parent)])}
    proc = subprocess.run([sys.executable, "-c", CHILD, how, str(out)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 9, proc.stderr
    if how == "between":     # population 3's rows are in a chunk file; its trials never reached the journal
        stale = list((out / "chunks").glob(f"trials-{2 * POP:08d}-*.parquet"))
        assert len(stale) == 1 and len(list((out / "chunks").glob("trials-*.parquet"))) == 3
        stale[0].rename(stale[0].with_name(f"trials-{2 * POP:08d}-00000000.parquet"))   # read first
    else:                    # the journal ends in a part of population 3
        assert (out / "optuna.journal").stat().st_size > 0

    rows = search_mod.run_search(_spec(trials=100), out)      # the rerun

    counts = rows.attrs["trials"]
    assert counts["complete"] == 100 and counts["fail"] == 0 and counts["running"] == 0
    study = _plain(out)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 100   # no trial of a half population
    # the two populations written before the kill are kept as they were (the same seed's
    # reference run asked the same ones); none is asked again
    kept = [_trial_record(t)[:5] for t in study.trials[:2 * POP]]
    assert kept == [_trial_record(t)[:5] for t in _plain(ref).trials[:2 * POP]]
    # every generation of NSGA-II is one whole population
    generations = pd.Series([t.system_attrs["NSGAIISampler:generation"] for t in study.trials]).value_counts()
    assert set(generations) == {POP}
    # one row per trial, and it is that trial's (population 3's stale rows, numbered as the
    # trials that replaced it, are not)
    assert len(rows) == 100 and rows.trial.is_unique
    for t in study.trials:
        row = rows.set_index("trial").loc[t.number]
        assert {k: row[k] for k in t.params} == t.params
        assert t.values[0] == pytest.approx(row["output_tokens_per_s"])


def test_a_record_written_from_outside_during_a_population(tmp_path, monkeypatch):
    """optuna-dashboard (or anything) writing the journal while a population is held: the
    population is not written over it but asked again; nothing is lost or doubled."""
    real, calls = search_mod.evaluate_columns, []

    def evaluate_and_write_a_note(*a, **kw):
        calls.append(1)
        if len(calls) == 2:
            other = optuna.storages.JournalStorage(JournalFileBackend(str(tmp_path / "optuna.journal")))
            study_id = other.get_study_id_from_name("dse")
            other.set_study_user_attr(study_id, "note", "written from outside")
        return real(*a, **kw)
    monkeypatch.setattr(search_mod, "evaluate_columns", evaluate_and_write_a_note)
    rows = search_mod.run_search(_spec(trials=60), tmp_path)
    assert len(calls) == 4                          # the second population was asked again
    counts = rows.attrs["trials"]
    assert counts["complete"] == 60 and counts["fail"] == 0 and len(rows) == 60 and rows.trial.is_unique
    study = _plain(tmp_path)
    assert study.user_attrs["note"] == "written from outside" and len(study.trials) == 60
    assert not list(tmp_path.glob("chunks/*.tmp")) and len(list(tmp_path.glob("chunks/trials-*"))) == 3


def test_evaluation_share_is_reported(tmp_path, capfd):
    rows = search_mod.run_search(_spec(trials=40), tmp_path / "a", quiet=False)
    info = rows.attrs["trials"]
    assert info["complete"] == 40 and info["asked"] == 40             # the keys that were there stay
    assert 0 < info["evaluation_s"] <= info["wall_s"]
    assert info["evaluation_share"] == pytest.approx(info["evaluation_s"] / info["wall_s"], rel=1e-3)
    assert 0 <= info["journal_write_s"] < info["wall_s"]
    err = capfd.readouterr().err
    assert "in dse's evaluation (" in err and "of the time" in err and "writing the journal" in err
    # an SQLAlchemy storage: no journal
    rows = search_mod.run_search(_spec(trials=20), tmp_path / "b", storage_url=f"sqlite:///{tmp_path / 's.db'}")
    assert rows.attrs["trials"]["journal_write_s"] is None and rows.attrs["trials"]["evaluation_s"] > 0


# ------------------------------------------------------------ the journal file itself

def _write_lines(path: Path, logs: list[dict], tail: bytes = b"") -> None:
    path.write_bytes(b"".join(json.dumps(log).encode() + b"\n" for log in logs) + tail)


def _marker(n: int) -> dict:
    return {"op_code": 3, "worker_id": "w", "study_id": 0, "system_attr": {oj.POPULATION_ATTR: {"lines": n}}}


def test_repair_cuts_a_population_written_in_part(tmp_path):
    path = tmp_path / "optuna.journal"
    head = [{"op_code": 0, "worker_id": "w", "study_name": "s", "directions": [1]}]
    pop = [{"op_code": 2, "worker_id": "w", "study_id": 0, "user_attr": {f"k{i}": i}} for i in range(3)]
    whole = head + [_marker(3)] + pop
    _write_lines(path, whole)
    size = path.stat().st_size
    assert oj.repair(path) == 0 and path.stat().st_size == size          # whole: untouched
    _write_lines(path, whole + [_marker(3)] + pop[:2])                    # cut at a record's end
    assert oj.repair(path) > 0 and path.stat().st_size == size
    _write_lines(path, whole + [_marker(3)] + pop[:1], tail=b'{"op_code": 2, "wor')   # cut mid-record
    assert oj.repair(path) > 0 and path.stat().st_size == size
    _write_lines(path, whole + [{"op_code": 2, "worker_id": "w", "study_id": 0, "user_attr": {"x": 1}}],
                 tail=b'{"op_')                                           # records after it, unbatched
    oj.repair(path)
    assert len(path.read_text().splitlines()) == len(whole) + 1 and path.read_text().endswith("\n")
    _write_lines(path, head, tail=b'{"op_')                               # an unbatched journal
    oj.repair(path)
    assert path.read_text().splitlines() == [json.dumps(head[0])]


def test_repair_finds_a_marker_far_from_the_end(tmp_path):
    path = tmp_path / "optuna.journal"
    pop = [{"op_code": 2, "worker_id": "w", "study_id": 0, "user_attr": {"k": "x" * 1000}}] * 3000   # ~3 MB
    _write_lines(path, [_marker(3000)] + pop)
    size = path.stat().st_size
    _write_lines(path, [_marker(3000)] + pop + [_marker(3000)] + pop[:2500])
    assert oj.repair(path) > 0 and path.stat().st_size == size


def test_no_write_after_an_unfinished_record(tmp_path):
    path = tmp_path / "optuna.journal"
    storage = oj.open_journal(path)
    optuna.create_study(study_name="s", storage=storage)
    with open(path, "ab") as f:
        f.write(b'{"op_code": 2, "worker_id": "killed-mid-wr')
    with pytest.raises(oj.TornJournal, match="run the same command again"):
        optuna.create_study(study_name="t", storage=storage)
    assert path.read_bytes().endswith(b"killed-mid-wr")
