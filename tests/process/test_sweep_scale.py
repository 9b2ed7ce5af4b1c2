"""Sweeps at scale: results.parquet written once (a dataset of one file per chunk), streaming
outputs (Pareto front, per-parameter aggregates, a seeded uniform sample) equal to what a
full in-memory run gives, one worker or two or a Dask cluster giving the same files, and a
killed run (its workers with it) resuming exactly without evaluating a finished chunk again."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import ROOT

from basis.errors import DseError
from dse.explore import chunkfiles, executors
from dse.explore import sweep as sweep_mod
from dse.explore.online import BINS, SAMPLE_KEY, ChunkSummary, OnlineSummary, sample_keys
from dse.explore.pareto import pareto_mask
from dse.explore.runio import ResultsFile
from dse.explore.space import DesignSpace
from dse.explore.spec import ROWS_ALL_LIMIT, SweepSpec
from dse.explore.sweep import run_sweep
from dse.study.cli import main
from dse.study.studyfile import load_study

OBJECTIVES = {"output_tokens_per_s": "max", "memory_bandwidth": "min"}
#: 2 x 3 x 2 x 15 = 180 points, some infeasible (a 20 GB device cannot hold batch 64's KV cache)
GRID = {"hardware": ["h100-sxm", "a100-80gb"], "model": "llama-2-7b", "batch": [1, 8, 64],
        "memory_capacity": [2.0e10, 8.0e10], "memory_bandwidth": {"min": 1.0e12, "max": 8.0e12, "count": 15}}
#: drawn at random: a continuous log range (aggregated in bins) and choices
RANDOM = {"hardware": ["h100-sxm", "a100-80gb"], "model": "llama-2-7b", "batch": [1, 8, 64, 256],
          "memory_bandwidth": {"min": 5.0e11, "max": 8.0e12, "scale": "log"}}


def _grid(**kw) -> SweepSpec:
    return SweepSpec(DesignSpace(GRID), objectives=dict(OBJECTIVES), constraints={"tpot_s": {"max": 0.03}},
                     chunk_size=23, **kw)


def _random(**kw) -> SweepSpec:
    return SweepSpec(DesignSpace(RANDOM), method="random", samples=300, seed=7, objectives=dict(OBJECTIVES),
                     chunk_size=41, **kw)


def _files(out: Path) -> dict[str, object]:
    """What a sweep folder holds: every output as a DataFrame or text."""
    got = {f: (out / f).read_text() for f in ("pareto.csv", "aggregates.csv") if (out / f).exists()}
    for f in ("results.parquet", "sample.parquet"):
        if (out / f).exists():
            got[f] = pd.read_parquet(out / f)
    state = json.loads((out / "sweep.json").read_text())
    got["totals"] = {k: state[k] for k in ("points", "feasible", "reasons", "rows")}
    return got


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k, mine in a.items():
        if isinstance(mine, pd.DataFrame):
            pd.testing.assert_frame_equal(mine, b[k])
        else:
            assert mine == b[k], k


# ------------------------------------------------------------------ results.parquet written once

def test_results_are_a_dataset_of_one_file_per_chunk_read_as_the_in_memory_rows(tmp_path):
    spec = _grid()
    run_sweep(spec, tmp_path / "run")
    res = tmp_path / "run" / "results.parquet"
    assert sorted(p.name for p in res.iterdir()) == [f"part-{k:06d}.parquet" for k in range(spec.chunks)]
    assert not (tmp_path / "run" / "chunks").exists()
    disk = pd.read_parquet(res)
    full, _ = run_sweep(spec)
    assert list(disk["point"]) == list(range(spec.points))
    for df in (disk, full):
        df["reason"] = df["reason"].astype(str)          # a category in memory and in each file
    pd.testing.assert_frame_equal(disk, full, check_dtype=False, check_categorical=False)
    rf = ResultsFile(res)                                # what the report and best.json read
    assert rf.rows == spec.points and rf.names == list(disk.columns)
    picks = [0, 22, 23, spec.points - 1]                 # across files
    assert [r["point"] for r in rf.rows_at(picks)] == picks
    assert dict(rf.reasons()) == disk.loc[~disk.feasible, "reason"].value_counts().to_dict()


# ------------------------------------------------------------------ streaming outputs

def _expected_aggregates(spec: SweepSpec, full: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Per swept parameter, per cell in order: points, feasible, best feasible objective values
    (pandas group-bys over every row)."""
    out = {}
    feas = full["feasible"].to_numpy(bool)
    for a in spec.space.axes:
        if spec.method != "grid" and a.is_range:
            edges = np.geomspace(a.low, a.high, BINS + 1) if a.log else np.linspace(a.low, a.high, BINS + 1)
            cell = np.minimum(np.digitize(full[a.name].to_numpy(float), edges) - 1, BINS - 1)
            cells = range(BINS)
        elif len(a.values) > 1:
            cell = full[a.name].astype(str).map({str(v): i for i, v in enumerate(a.values)}).to_numpy()
            cells = range(len(a.values))
        else:
            continue
        g = pd.DataFrame({"cell": cell, "feasible": feas})
        table = pd.DataFrame(index=pd.Index(cells, name="cell"))
        table["points"] = g.groupby("cell").size()
        table["feasible"] = g.groupby("cell")["feasible"].sum()
        for o, sense in spec.objectives.items():
            v = full[o].where(feas).to_numpy(float)
            best = pd.Series(v).groupby(cell).max() if sense == "max" else pd.Series(v).groupby(cell).min()
            table[f"best_{o}"] = best
        out[a.name] = table.fillna({"points": 0, "feasible": 0}).reset_index(drop=True)
    return out


@pytest.mark.parametrize("make", [_grid, _random])
def test_aggregates_sample_and_front_match_a_full_in_memory_run(tmp_path, make):
    spec = make(rows="sample", sample=25)
    run_sweep(spec, tmp_path / "run")
    got = _files(tmp_path / "run")
    full, front = run_sweep(spec)
    assert "results.parquet" not in got
    # aggregates: every cell of every swept parameter, in order
    agg = pd.read_csv(tmp_path / "run" / "aggregates.csv")
    want = _expected_aggregates(spec, full)
    assert list(dict.fromkeys(agg["parameter"])) == list(want)
    for name, table in want.items():
        mine = agg[agg["parameter"] == name].reset_index(drop=True)
        assert mine["points"].sum() == spec.points
        np.testing.assert_array_equal(mine["points"], table["points"].astype(int))
        np.testing.assert_array_equal(mine["feasible"], table["feasible"].astype(int))
        for o in spec.objectives:
            np.testing.assert_array_equal(mine[f"best_{o}"].to_numpy(float), table[f"best_{o}"].to_numpy(float))
    # the sample: the points of the smallest keys of (seed, point), with their rows
    keys = sample_keys(spec.seed, full["point"].to_numpy())
    picked = np.sort(full["point"].to_numpy()[np.argsort(keys, kind="stable")[:spec.sample]])
    sample = got["sample.parquet"]
    assert list(sample["point"]) == list(picked)
    ref = full.set_index("point").loc[picked].reset_index()
    for c in ("output_tokens_per_s", "tpot_s", "memory_bandwidth", "feasible", "batch"):
        np.testing.assert_array_equal(sample[c].to_numpy(), ref[c].to_numpy())
    # the front and the totals
    assert list(pd.read_csv(tmp_path / "run" / "pareto.csv")["point"]) == list(front["point"])
    totals = got["totals"]
    assert totals["points"] == spec.points and totals["feasible"] == int(full["feasible"].sum())
    assert totals["reasons"] == full.loc[~full.feasible, "reason"].astype(str).value_counts().to_dict()
    assert totals["feasible"] < spec.points                # the test sees infeasible points


@pytest.mark.parametrize("objectives", [{"tpot_s": "min"},
                                        {"output_tokens_per_s": "max", "memory_bandwidth": "min", "tpot_s": "min"},
                                        {"output_tokens_per_s": "max", "memory_bandwidth": "min", "tpot_s": "min",
                                         "memory_bytes": "min"}])
@pytest.mark.parametrize("make", [_grid, _random])
def test_the_front_merged_chunk_by_chunk_is_the_front_of_every_row(tmp_path, make, objectives):
    # chunks of ~30 points: their fronts are merged many times over (OnlineSummary), on
    # objective values alone; the in-memory run takes the front of all rows at once
    spec = make(rows="none")
    spec.objectives = objectives
    run_sweep(spec, tmp_path / "run")
    full, front = run_sweep(spec)
    assert spec.chunks > 5 and len(front) >= 1
    merged = pd.read_csv(tmp_path / "run" / "pareto.csv")
    assert list(merged["point"]) == list(front["point"])
    for o in objectives:
        np.testing.assert_array_equal(merged[o].to_numpy(float), front[o].to_numpy(float))


def test_summaries_merged_in_any_order_keep_the_front_and_sample_of_every_row():
    # chunks in random order, of random sizes, with tied objectives and a sample of 40: after
    # every chunk the threshold handed to the next ones is no smaller than any key of the
    # final sample (else a chunk would leave out a row that belongs in it), and in the end
    # the front and the sample are those of all the rows at once
    rng = np.random.default_rng(5)
    spec = _grid()
    spec.objectives = {"output_tokens_per_s": "max", "tpot_s": "min"}
    summary = OnlineSummary(spec, sample=40)
    fronts, samples, thresholds = [], [], []
    for k in rng.permutation(60):
        n = int(rng.integers(0, 25))
        points = k * 100 + np.arange(n)
        front = pd.DataFrame({"point": points, "output_tokens_per_s": rng.integers(0, 12, n).astype(float),
                              "tpot_s": rng.integers(0, 12, n).astype(float), "feasible": True})
        sample = pd.DataFrame({"point": points, "x": rng.random(n), SAMPLE_KEY: rng.random(n)})
        summary.add(ChunkSummary(first=int(k * 100), points=n, feasible=n, reasons={}, cells={}, front=front,
                                 sample=sample))
        fronts.append(front)
        samples.append(sample)
        thresholds.append(summary.threshold)
    rows = pd.concat(fronts, ignore_index=True)
    on_front = pareto_mask(rows[list(spec.objectives)].to_numpy(float), list(spec.objectives.values()))
    assert list(summary.front["point"]) == sorted(rows.loc[on_front, "point"])
    every = pd.concat(samples, ignore_index=True).sort_values([SAMPLE_KEY, "point"]).head(40)
    assert list(summary.sample["point"]) == list(every["point"])             # by key
    np.testing.assert_array_equal(summary.sample["x"].to_numpy(), every["x"].to_numpy())
    assert min(thresholds) >= every[SAMPLE_KEY].max() and np.isfinite(thresholds[-1])


def test_the_sample_is_uniform():
    keys = sample_keys(3, np.arange(200_000))
    picked = np.argsort(keys)[:20_000]
    counts = np.bincount(picked // 20_000, minlength=10)           # 2,000 expected per tenth of the ids
    assert ((counts > 1_800) & (counts < 2_200)).all(), counts
    assert 0 <= keys.min() and keys.max() < 1 and len(np.unique(keys)) == len(keys)


def test_rows_none_keeps_front_and_aggregates_only(tmp_path):
    run_sweep(_grid(rows="none"), tmp_path / "run")
    names = {p.name for p in (tmp_path / "run").iterdir()}
    assert {"pareto.csv", "aggregates.csv", "sweep.json"} <= names
    assert not names & {"results.parquet", "sample.parquet", "chunks"}


def test_a_large_space_keeps_a_sample_by_default_and_old_run_folders_keep_their_fingerprint():
    small = _grid()
    assert small.rows_kept == "all" and "outputs" not in json.loads(small.fingerprint())
    big = SweepSpec(DesignSpace(RANDOM), method="random", samples=ROWS_ALL_LIMIT + 1, max_points=10 ** 9)
    assert big.rows_kept == "sample"
    assert json.loads(big.fingerprint())["outputs"] == {"rows": "sample", "sample": big.sample}
    assert SweepSpec(DesignSpace(RANDOM), method="random", samples=ROWS_ALL_LIMIT + 1, max_points=10 ** 9,
                     rows="all").rows_kept == "all"


# ------------------------------------------------------------------ workers, resume, Dask

@pytest.mark.parametrize("rows", ["all", "sample"])
def test_two_workers_write_what_one_writes(tmp_path, rows):
    spec = _random(rows=rows, sample=30)
    run_sweep(spec, tmp_path / "one")
    run_sweep(spec, tmp_path / "two", workers=2)
    _same(_files(tmp_path / "one"), _files(tmp_path / "two"))


def test_the_server_started_ahead_of_the_workers_imports_the_module_their_chunks_run(tmp_path):
    # `dse run --workers N` starts the workers' server before it imports the sweep (start_server)
    assert sweep_mod.chunk_task.__module__ == executors.SWEEP_MODULE
    executors.start_server()
    spec = _random(rows="all")
    run_sweep(spec, tmp_path / "one")
    run_sweep(spec, tmp_path / "two", workers=2)
    _same(_files(tmp_path / "one"), _files(tmp_path / "two"))


def test_an_interrupted_streaming_sweep_resumes_from_its_chunk_states(tmp_path, monkeypatch):
    spec = _random(rows="sample", sample=30)
    run_sweep(spec, tmp_path / "ref")
    real, calls, failed = sweep_mod.evaluate_chunk, [], []

    def flaky(spec_, k):
        calls.append(k)
        if k == 4 and not failed:
            failed.append(k)
            raise RuntimeError("interrupted")
        return real(spec_, k)
    monkeypatch.setattr(sweep_mod, "evaluate_chunk", flaky)
    with pytest.raises(RuntimeError, match="interrupted"):
        run_sweep(spec, tmp_path / "run")
    assert sorted(p.name for p in (tmp_path / "run" / "chunks").iterdir()) == sorted(
        f"{kind}-{k:06d}.parquet" for k in range(4) for kind in ("front", "state"))
    calls.clear()
    run_sweep(spec, tmp_path / "run")
    assert calls == list(range(4, spec.chunks))          # chunks 0-3 came from their states
    _same(_files(tmp_path / "ref"), _files(tmp_path / "run"))


def _descendants(pid: int) -> set[int]:
    """Process ids of the descendants of ``pid`` (from /proc)."""
    parent = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out.update(kids)
        todo += kids
    return out


def _alive(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_a_killed_parent_takes_its_workers_and_the_rerun_resumes_exactly(tmp_path, monkeypatch):
    study = tmp_path / "kill.yaml"
    study.write_text(yaml.safe_dump({
        "name": "kill", "space": {"hardware": "h100-sxm", "model": "llama-2-7b", "batch": [1, 16],
                                  "memory_bandwidth": {"min": 1.0e12, "max": 8.0e12, "count": 300},
                                  "memory_capacity": {"min": 4.0e10, "max": 2.0e11, "count": 200}},
        "objectives": {"output_tokens_per_s": "max", "memory_capacity": "min"}, "chunk_size": 1500}))
    out = tmp_path / "out"
    p = subprocess.Popen([sys.executable, "-m", "dse.study", "run", study, "--out", out, "--quiet", "--workers", "2"],
                         cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    t0 = time.time()
    while len(list((out / "chunks").glob("state-*.parquet"))) < 3 and p.poll() is None:
        if time.time() - t0 > 120:
            p.kill()
            raise TimeoutError
        time.sleep(0.02)
    workers = _descendants(p.pid)
    p.kill()
    p.wait(30)
    if p.returncode == 0:
        pytest.skip("the sweep finished before the kill")
    t0 = time.time()
    while any(_alive(w) for w in workers) and time.time() - t0 < 20:
        time.sleep(0.05)
    assert workers and not any(_alive(w) for w in workers), "a worker outlived its parent"
    # nothing half-written under a real name: every part and state reads back whole
    _, spec = load_study(str(study))
    chunk_dir = out / "chunks"
    done = chunkfiles.finished(chunk_dir, spec.chunks, with_parts=True)
    assert len(done) >= 3
    for f in chunk_dir.glob("part-*.parquet"):
        assert len(pd.read_parquet(f)) == spec.chunk_size
    assert all(chunkfiles.read_state(chunk_dir, k, spec.chunks) for k in done)
    # the rerun evaluates only the chunks not finished, and gives a fresh run's files
    real, calls = sweep_mod.evaluate_chunk, []
    monkeypatch.setattr(sweep_mod, "evaluate_chunk", lambda s, k: (calls.append(k), real(s, k))[1])
    run_sweep(spec, out)
    assert sorted(calls) == sorted(set(range(spec.chunks)) - set(done))
    monkeypatch.setattr(sweep_mod, "evaluate_chunk", real)
    run_sweep(spec, tmp_path / "fresh")
    _same(_files(tmp_path / "fresh"), _files(out))


def test_a_dask_cluster_gives_the_same_rows(tmp_path):
    distributed = pytest.importorskip("distributed")
    spec = _grid()
    run_sweep(spec, tmp_path / "one")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as c:
        run_sweep(spec, tmp_path / "dask", scheduler=c.scheduler_address)
    _same(_files(tmp_path / "one"), _files(tmp_path / "dask"))


# ------------------------------------------------------------------ errors: one line

def _cli(capsys, *argv) -> tuple[int, str]:
    rc = main([str(a) for a in argv])
    return rc, capsys.readouterr().err


def _study(tmp_path: Path, **extra) -> Path:
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump({"name": "s", "space": {"hardware": "h100-sxm", "model": "llama-2-7b",
                                                        "batch": [1, 8]}, "objectives": {"tpot_s": "min"}, **extra}))
    return f


@pytest.mark.parametrize("outputs, message", [
    ({"rows": "some"}, "outputs.rows: expected one of all, sample, none"),
    ({"rows": ["all"]}, "outputs.rows: expected all, sample or none"),
    ({"sample": 0}, "outputs.sample: expected an integer from 1"),
    ({"keep": "all"}, "outputs: unknown key(s) keep"),
    ("all", "outputs: expected a mapping")])
def test_bad_outputs_are_one_line(tmp_path, capsys, outputs, message):
    rc, err = _cli(capsys, "run", _study(tmp_path, outputs=outputs), "--out", tmp_path / "o")
    assert rc == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_scheduler_errors_are_one_line(tmp_path, capsys, monkeypatch):
    study = _study(tmp_path)
    rc, err = _cli(capsys, "run", study, "--out", tmp_path / "b", "--scheduler", "tcp://127.0.0.1:9", "--workers", "2")
    assert rc == 2 and "not both" in err
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "distributed", None)          # not installed
        rc, err = _cli(capsys, "run", study, "--out", tmp_path / "c", "--scheduler", "tcp://127.0.0.1:9")
    assert rc == 2 and "pip install 'dse-llm[distributed]'" in err and len(err.strip().splitlines()) == 1, err
    pytest.importorskip("distributed")
    monkeypatch.setattr(executors, "CONNECT_S", 1)
    rc, err = _cli(capsys, "run", study, "--out", tmp_path / "a", "--scheduler", "tcp://127.0.0.1:9")
    assert rc == 2 and "cannot connect to a Dask scheduler" in err and len(err.strip().splitlines()) == 1, err


def test_a_malformed_scheduler_address_is_one_line_and_leaves_no_client_behind(tmp_path):
    """Refused before a Dask client exists: nothing is printed at exit after the one line."""
    pytest.importorskip("distributed")
    r = subprocess.run([sys.executable, "-m", "dse.study", "run", str(_study(tmp_path)), "--out", str(tmp_path / "o"),
                        "--scheduler", "bogus", "--quiet"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "tcp://HOST:8786" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_streaming_run_prints_its_files_and_its_report(tmp_path, capsys):
    rc = main(["run", str(_study(tmp_path)), "--out", str(tmp_path / "o"), "--rows", "sample", "--quiet"])
    text = capsys.readouterr().out
    assert rc == 0 and "sample.parquet" in text and "aggregates.csv" in text and "report.html" in text
    assert (tmp_path / "o" / "best.json").exists() and (tmp_path / "o" / "report.html").exists()    # from the sample
    # the same folder with every row kept is another study: refused, naming outputs
    rc, err = _cli(capsys, "run", _study(tmp_path), "--out", tmp_path / "o", "--rows", "all")
    assert rc == 2 and "outputs" in err and "--overwrite" in err


def test_workers_need_an_output_folder():
    with pytest.raises(DseError, match="output folder"):
        run_sweep(_grid(), workers=2)
