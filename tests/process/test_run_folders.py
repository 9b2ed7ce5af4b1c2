"""Run folders that never adopt stale results and never write outside themselves: a run that
another model (dse version, model code or shipped data) wrote is refused in one line naming
what differs, and resumed when the same model wrote it; a run file or chunks/ that is a
symbolic link leading outside the folder is refused before anything is written or deleted
there; a full disk ends a run in one line, leaving no partial file. Also: --simulate shows
its progress on stderr (stdout stays JSON), and the validation plot names a bounded number
of rows."""
from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from basis.errors import DseError
from basis.files import atomic_write
from dse.explore import modelstamp
from dse.explore import sweep as sweep_mod
from dse.explore.modelstamp import model_stamp
from dse.present import plots
from dse.study.cli import main
from dse.system.analysis import simulate_point
from dse.system.params import DEFAULTS


def _study(tmp_path: Path) -> Path:
    """A 16-point grid in 4 chunks (about a second of work)."""
    f = tmp_path / "folders.yaml"
    f.write_text(yaml.safe_dump({
        "name": "folders",
        "space": {"hardware": ["h100-sxm", "t4"], "model": "llama-2-7b", "batch": [1, 64],
                  "prompt_len": [512, 2048], "devices": [1, 2]},
        "objectives": {"output_tokens_per_s": "max", "tpot_s": "min"},
        "method": "grid", "chunk_size": 4}))
    return f


def cli(capsys, *argv) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _no_work(*a, **k):
    raise AssertionError("a finished chunk was evaluated again")


def _edit_json(path: Path, edit) -> None:
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))


# ------------------------------------------------------------------------ the model that wrote a run

@pytest.mark.slow   # a CLI run end to end (about 10 s)
def test_a_run_folder_records_the_model_that_wrote_it(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli(capsys, "run", _study(tmp_path), "--out", out, "--quiet")[0] == 0
    for name in ("study.json", "sweep.json"):
        assert json.loads((out / name).read_text())["model"] == model_stamp(), name


@pytest.mark.slow   # a CLI run end to end (about 10 s)
@pytest.mark.parametrize("key, words", [("model", "model code and data"), ("dse_version", "dse version")])
def test_a_run_another_model_wrote_is_refused_naming_what_differs(tmp_path, capsys, monkeypatch, key, words):
    study, out = _study(tmp_path), tmp_path / "run"
    assert cli(capsys, "run", study, "--out", out, "--quiet")[0] == 0
    before = pd.read_parquet(out / "results.parquet")
    _edit_json(out / "study.json", lambda d: d["model"].__setitem__(key, "0ld"))
    monkeypatch.setattr(sweep_mod, "evaluate_chunk", _no_work)
    rc, stdout, err = cli(capsys, "run", study, "--out", out, "--quiet")
    assert rc == 2 and stdout == ""
    line = err.strip()
    assert "\n" not in line and "Traceback" not in line
    assert words in line and "0ld there" in line and f"{model_stamp()[key]} now" in line
    assert "--overwrite" in line and "new --out" in line
    other = "dse version" if key == "model" else "model code and data"
    assert other not in line                         # only what differs is named
    pd.testing.assert_frame_equal(pd.read_parquet(out / "results.parquet"), before)   # nothing touched


@pytest.mark.slow   # a CLI run end to end (about 10 s)
def test_a_run_of_an_earlier_dse_that_recorded_no_model_is_refused(tmp_path, capsys, monkeypatch):
    study, out = _study(tmp_path), tmp_path / "run"
    assert cli(capsys, "run", study, "--out", out, "--quiet")[0] == 0
    _edit_json(out / "study.json", lambda d: d.pop("model"))       # as dse wrote study.json before stamps
    monkeypatch.setattr(sweep_mod, "evaluate_chunk", _no_work)
    rc, _, err = cli(capsys, "run", study, "--out", out, "--quiet")
    assert rc == 2 and "\n" not in err.strip() and "earlier dse" in err and "--overwrite" in err


@pytest.mark.slow   # a CLI run end to end (about 10 s)
def test_a_sweep_manifest_another_model_wrote_is_refused_and_overwrite_runs_afresh(tmp_path, capsys):
    study, out = _study(tmp_path), tmp_path / "run"
    assert cli(capsys, "run", study, "--out", out, "--quiet")[0] == 0
    before = pd.read_parquet(out / "results.parquet")
    _edit_json(out / "sweep.json", lambda d: d["model"].__setitem__("model", "0ld"))   # study.json as written
    rc, _, err = cli(capsys, "run", study, "--out", out, "--quiet")
    assert rc == 2 and "model code and data 0ld there" in err and "\n" not in err.strip()
    rc, _, err = cli(capsys, "run", study, "--out", out, "--overwrite", "--quiet")
    assert rc == 0, err
    assert json.loads((out / "sweep.json").read_text())["model"] == model_stamp()
    pd.testing.assert_frame_equal(pd.read_parquet(out / "results.parquet"), before)


@pytest.mark.slow   # a CLI run end to end (about 10 s)
def test_the_same_model_resumes_without_redoing_work(tmp_path, capsys, monkeypatch):
    study, out = _study(tmp_path), tmp_path / "run"
    assert cli(capsys, "run", study, "--out", out, "--quiet")[0] == 0
    before = pd.read_parquet(out / "results.parquet")
    monkeypatch.setattr(sweep_mod, "evaluate_chunk", _no_work)
    rc, _, err = cli(capsys, "run", study, "--out", out, "--quiet")
    assert rc == 0, err
    pd.testing.assert_frame_equal(pd.read_parquet(out / "results.parquet"), before)


def test_the_model_fingerprint_changes_with_any_model_file(tmp_path, monkeypatch):
    code, configs = tmp_path / "pkg", tmp_path / "configs"
    (code / "sub").mkdir(parents=True)
    configs.mkdir()
    (code / "sub" / "roofline.py").write_text("PEAK = 1\n")
    (code / "notes.txt").write_text("not code")
    (configs / "engines.yaml").write_text("vllm: {}\n")
    monkeypatch.setattr(modelstamp, "MODEL_PACKAGES", ("pkg",))
    monkeypatch.setattr(modelstamp, "MODEL_DATA", ("configs",))
    monkeypatch.setattr(modelstamp, "_package_folder", lambda name: tmp_path / name)
    monkeypatch.setattr(modelstamp, "shipped", lambda name: tmp_path / name)

    def fingerprint() -> str:
        modelstamp.model_fingerprint.cache_clear()
        return modelstamp.model_fingerprint()
    try:
        first = fingerprint()
        assert fingerprint() == first                                   # deterministic
        (code / "notes.txt").write_text("other notes")                  # not model code
        assert fingerprint() == first
        (code / "sub" / "roofline.py").write_text("PEAK = 2\n")
        second = fingerprint()
        assert second != first
        (configs / "engines.yaml").write_text("vllm: {block: 16}\n")
        third = fingerprint()
        assert third not in (first, second)
        (configs / "engines.yaml").rename(configs / "engine.yaml")      # the name counts too
        assert fingerprint() not in (first, second, third)
    finally:
        modelstamp.model_fingerprint.cache_clear()


# ------------------------------------------------------------------------ links leading outside

def test_a_symlinked_chunks_folder_leading_outside_is_refused_and_its_target_untouched(tmp_path, capsys):
    study, out, elsewhere = _study(tmp_path), tmp_path / "run", tmp_path / "elsewhere"
    elsewhere.mkdir()
    theirs = elsewhere / "part-000000.parquet"              # a name a run would write and delete
    theirs.write_bytes(b"someone else's")
    out.mkdir()
    (out / "chunks").symlink_to(elsewhere)
    for extra in ((), ("--overwrite",)):
        rc, _, err = cli(capsys, "run", study, "--out", out, "--quiet", *extra)
        assert rc == 2, extra
        line = err.strip()
        assert "\n" not in line and "chunks" in line and "symbolic link" in line and "outside" in line
        assert sorted(p.name for p in elsewhere.iterdir()) == ["part-000000.parquet"]
        assert theirs.read_bytes() == b"someone else's"
    assert sorted(p.name for p in out.iterdir()) == ["chunks"]   # no lock, no study.json written


def test_a_symlinked_result_file_leading_outside_is_refused(tmp_path, capsys):
    study, out = _study(tmp_path), tmp_path / "run"
    target = tmp_path / "precious.csv"
    target.write_text("keep me")
    out.mkdir()
    (out / "pareto.csv").symlink_to(target)
    rc, _, err = cli(capsys, "run", study, "--out", out, "--quiet", "--overwrite")
    assert rc == 2 and "pareto.csv" in err and "symbolic link" in err
    assert target.read_text() == "keep me" and (out / "pareto.csv").is_symlink()


@pytest.mark.slow   # a CLI run end to end (about 10 s)
def test_a_symlink_inside_the_folder_is_allowed(tmp_path, capsys):
    study, out = _study(tmp_path), tmp_path / "run"
    (out / "mine").mkdir(parents=True)
    (out / "chunks").symlink_to(out / "mine")
    rc, _, err = cli(capsys, "run", study, "--out", out, "--quiet")
    assert rc == 0, err


# ------------------------------------------------------------------------ a full disk

def test_atomic_write_on_a_full_disk_leaves_the_old_file_and_no_part(tmp_path):
    target = tmp_path / "pareto.csv"
    target.write_text("old, complete")

    def half_then_full(tmp: Path) -> None:
        tmp.write_text("half")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    with pytest.raises(DseError) as e:
        atomic_write(target, half_then_full)
    assert str(e.value) == f"{target}: cannot write: no space left on device"
    assert target.read_text() == "old, complete" and sorted(tmp_path.iterdir()) == [target]


@pytest.mark.slow   # a CLI run end to end (about 10 s)
def test_a_full_disk_during_a_run_ends_in_one_line_and_no_partial_file(tmp_path, capsys, monkeypatch):
    study, out = _study(tmp_path), tmp_path / "run"
    real = pq.write_table
    calls = []

    def full(table, where, *a, **k):
        calls.append(where)
        if isinstance(where, (str, Path)):       # a file (a chunk's front or state); not an in-memory sink
            Path(where).write_bytes(b"PAR1 half")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(table, where, *a, **k)
    monkeypatch.setattr(pq, "write_table", full)
    rc, stdout, err = cli(capsys, "run", study, "--out", out, "--quiet")
    assert rc == 2 and stdout == ""
    line = err.strip()
    assert "\n" not in line and "Traceback" not in line
    assert "no space left on device" in line and ".parquet" in line and str(out) in line
    chunks = out / "chunks"
    assert not list(chunks.glob("front-*")) and not list(chunks.glob("state-*")) and not list(chunks.glob(".*tmp"))
    assert not (out / "results.parquet").exists() and not (out / "pareto.csv").exists()
    monkeypatch.setattr(pq, "write_table", real)       # room again: the same command finishes the run
    rc, _, err = cli(capsys, "run", study, "--out", out, "--quiet")
    assert rc == 0, err
    assert len(pd.read_parquet(out / "results.parquet")) == 16


# ------------------------------------------------------------------------ --simulate's progress

def test_simulate_shows_progress_on_stderr_and_keeps_stdout_json(capsys):
    rc, stdout, err = cli(capsys, "analyze", "--hardware", "h100-sxm", "--model", "llama-3.1-8b", "--concurrency", "8",
                          "--simulate", "200", "--format", "json", "--progress")
    assert rc == 0, err
    assert json.loads(stdout)["simulation"]["requests_per_s"] > 0
    assert "simulate" in err and "200/200 requests" in err and "left" in err
    rc, stdout, err = cli(capsys, "analyze", "--hardware", "h100-sxm", "--model", "llama-3.1-8b", "--concurrency", "8",
                          "--simulate", "200", "--format", "json")
    assert rc == 0 and err == ""                 # stderr is not a terminal here: no progress unless asked
    json.loads(stdout)


def test_the_simulator_reports_every_request_finished_once():
    counts = []
    cols = {**DEFAULTS, "hardware": "h100-sxm", "model": "llama-3.1-8b", "concurrency": 4, "serving": "continuous"}
    simulate_point(cols, 60, progress=counts.append)
    assert sum(counts) == 60 and all(c > 0 for c in counts)


# ------------------------------------------------------------------------ the validation plot

def test_the_validation_plot_names_a_bounded_number_of_rows_in_ratio_order(tmp_path):
    rng = np.random.default_rng(1)
    n = 3 * plots.RATIO_LABELS + 7
    rows = [{"metric": "ttft_s", "measured": 1.0, "predicted": float(rng.uniform(0.5, 1.5)), "hardware": "h100-sxm",
             "id": f"r{i}"} for i in range(n)]
    rec = plots.validation_plot(tmp_path / "v.png", rows, "t")
    ratio = sorted(rows, key=lambda r: r["predicted"])
    assert rec["ratio_ids"] == [r["id"] for r in ratio]                 # every row still ranked
    named = rec["ratio_labels"]
    assert len(named) <= plots.RATIO_LABELS
    assert named[0] == f"{ratio[0]['id']} {plots.words_of('ttft_s')}"  # the lowest ratio is named first
