"""What an Optuna study shows in optuna-dashboard, read back through Optuna's own API from
the storage a real `dse.study run` wrote: the study's name, named objectives, every metric,
`feasible` and `reason` on each trial (equal to results.parquet), constraints that keep
infeasible designs out of the best trials, no phantom failed trials from racing workers,
declared distributions; several studies in one shared storage; a study created before
studies were named still resumes."""
import math

import optuna
import pandas as pd
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.storages.journal import JournalFileBackend
from optuna.study._constrained_optimization import _CONSTRAINTS_KEY

from dse.explore import search as search_mod
from dse.study.cli import main
from dse.study.studyfile import load_study
from dse.system.evaluator import METRICS

STUDY_YAML = """\
name: {name}
space:
  hardware: [h100-sxm, b200]
  model: llama-2-70b
  weights: fp8
  activations: fp8
  kv: [fp8, fp16]
  flash_attention: true
  prompt_len: 2048
  gen_len: 256
  batch: {{min: 1, max: 64}}
  memory_bandwidth: {{min: 1.0e12, max: 1.6e13, scale: log}}
  memory_capacity: {{min: 4.0e10, max: 4.0e11, scale: log}}
objectives:
  output_tokens_per_s: max
  tpot_s: min
constraints:
  tpot_s: {{max: {tpot}}}
method: optuna
sampler: nsga2
trials: {trials}
population: 10
seed: 0
"""
OBJECTIVES = ["output_tokens_per_s", "tpot_s"]



def _study_file(tmp_path, name, trials=40, tpot=0.05):
    path = tmp_path / f"{name}.yaml"
    path.write_text(STUDY_YAML.format(name=name, trials=trials, tpot=tpot))
    return path


def _run(*args):
    rc = main(["run", *map(str, args), "--quiet"])
    assert rc == 0


def _front(rows: pd.DataFrame, feasible_only: bool = True) -> set[int]:
    """Trial numbers of the non-dominated rows (output_tokens_per_s max, tpot_s min) among the
    feasible ones, or among all (``feasible_only`` False: as optuna-dashboard's "Best Trials")."""
    feas = rows[rows.feasible] if feasible_only else rows
    pts = list(zip(feas.trial, feas.output_tokens_per_s, feas.tpot_s))
    front = set()
    for n, tok, tpot in pts:
        if not any(t2 >= tok and p2 <= tpot and (t2 > tok or p2 < tpot) for _, t2, p2 in pts):
            front.add(int(n))
    return front


def test_a_run_reads_in_optuna_as_the_study_declares(tmp_path, keep_signals):
    out = tmp_path / "run"
    _run(_study_file(tmp_path, "tiny-optuna"), "--out", out, "--workers", 2)
    storage = optuna.storages.JournalStorage(JournalFileBackend(str(out / "optuna.journal")))
    assert optuna.get_all_study_names(storage) == ["tiny-optuna"]
    study = optuna.load_study(study_name="tiny-optuna", storage=storage)
    assert study.metric_names == OBJECTIVES
    assert [d.name for d in study.directions] == ["MAXIMIZE", "MINIMIZE"]

    # two racing workers leave no failed (nor discarded) trial: exactly the trials asked
    states = pd.Series([t.state.name for t in study.trials]).value_counts().to_dict()
    assert states == {"COMPLETE": 40}

    rows = pd.read_parquet(out / "results.parquet").set_index("trial", drop=False)
    trials = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert sorted(t.number for t in trials) == sorted(rows.trial)
    names = study.user_attrs["constraint_names"]
    assert "memory" in names and "tpot_s.max" in names
    for t in trials:
        row = rows.loc[t.number]
        # every finite metric of the row, and nothing else, is a user attr with the row's value
        finite = {m: row[m] for m in METRICS if pd.notna(row[m]) and math.isfinite(row[m])}
        assert {k: t.user_attrs.get(k) for k in finite} == finite
        assert not set(METRICS) - set(finite) & set(t.user_attrs)
        assert t.user_attrs["feasible"] is bool(row.feasible)
        if row.feasible:
            assert "reason" not in t.user_attrs and "why" not in t.user_attrs
        else:
            assert t.user_attrs["reason"] == row.reason != ""
            assert isinstance(t.user_attrs["why"], str) and t.user_attrs["why"]
        # the objective values told are the row's metrics
        assert list(t.values) == [pytest.approx(row[k]) for k in OBJECTIVES]
        # constraints as Optuna's constraints_func writes them (a list), read back by Optuna
        listed = t.system_attrs[_CONSTRAINTS_KEY]
        assert len(listed) == len(names) and list(t.constraints.values()) == listed
        assert (max(listed) > 0) == (not row.feasible)

    infeasible = {t.number for t in trials if not t.user_attrs["feasible"]}
    assert infeasible and len(infeasible) < len(trials)       # the test needs both kinds
    best = {t.number for t in study.best_trials}
    assert best and not best & infeasible
    assert rows.loc[sorted(best), "feasible"].all()      # per the run's own feasibility column
    assert best == _front(rows)            # Optuna's best trials: the feasible non-dominated rows

    # the three fronts as the README counts them: pareto.csv lists each design of Optuna's best
    # trials once (a design sampled twice is two best trials); optuna-dashboard's "Best Trials"
    # is the front of every complete trial, constraints ignored: its feasible ones are best trials
    pareto = pd.read_csv(out / "pareto.csv")
    assert set(pareto.trial) <= best
    assert len(pareto) == len({tuple(sorted(t.params.items())) for t in study.best_trials})
    everything = _front(rows, feasible_only=False)
    assert everything - infeasible <= best

    # distributions as the study declares them
    dists = {}
    for t in trials:
        dists.update(t.distributions)
    assert dists["hardware"] == CategoricalDistribution(["h100-sxm", "b200"])
    assert dists["kv"] == CategoricalDistribution(["fp8", "fp16"])
    assert dists["batch"] == IntDistribution(1, 64)
    assert dists["memory_bandwidth"] == FloatDistribution(1.0e12, 1.6e13, log=True)
    assert dists["memory_capacity"] == FloatDistribution(4.0e10, 4.0e11, log=True)
    assert all(isinstance(t.params["hardware"], str) and isinstance(t.params["batch"], int) for t in trials)
    # the presets' own designs come first, marked as baselines
    assert {t.user_attrs.get("baseline") for t in study.trials[:2]} == {"h100-sxm", "b200"}


def test_two_studies_share_one_storage(tmp_path, keep_signals):
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    _run(_study_file(tmp_path, "study-a", trials=12), "--out", tmp_path / "a", "--storage", url)
    _run(_study_file(tmp_path, "study-b", trials=15, tpot=0.1), "--out", tmp_path / "b", "--storage", url)
    assert sorted(optuna.get_all_study_names(url)) == ["study-a", "study-b"]
    for name, n in (("study-a", 12), ("study-b", 15)):
        study = optuna.load_study(study_name=name, storage=url)
        assert len(study.trials) == n and all(t.state.name == "COMPLETE" for t in study.trials)
        assert study.metric_names == OBJECTIVES
        assert all(_CONSTRAINTS_KEY in t.system_attrs and "feasible" in t.user_attrs for t in study.trials)


def test_a_study_created_before_studies_were_named_resumes(tmp_path):
    path = _study_file(tmp_path, "tiny-optuna", trials=10)
    spec = load_study(str(path))[1]
    old = tmp_path / "old"
    search_mod.run_search(spec, old, study_name=search_mod.LEGACY_STUDY_NAME)   # as before this change
    more = load_study(str(path), trials=20)[1]
    rows = search_mod.run_search(more, old)
    storage = search_mod.open_storage(None, old)
    assert optuna.get_all_study_names(storage) == [search_mod.LEGACY_STUDY_NAME]
    assert rows.attrs["trials"]["complete"] == 20 and len(rows) == 20
    assert search_mod.trial_counts(None, old, more)["complete"] == 20
    # in a shared storage, a legacy study of another space is left alone: the named study
    # is created beside it
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    search_mod.run_search(spec, tmp_path / "a", url, study_name=search_mod.LEGACY_STUDY_NAME)
    other = load_study(str(_study_file(tmp_path, "tiny-optuna", trials=5, tpot=0.2)))[1]
    search_mod.run_search(other, tmp_path / "b", url)
    assert sorted(optuna.get_all_study_names(url)) == ["dse", "tiny-optuna"]
    assert search_mod.trial_counts(url, tmp_path / "b", other)["complete"] == 5
    assert search_mod.trial_counts(url, tmp_path / "a", spec)["complete"] == 10


def test_trials_asked_beyond_the_target_are_discarded_not_failed(tmp_path, monkeypatch):
    """Where no lock spans the asking processes, a worker may count before another's asks
    land and ask too many: those trials are PRUNED with a reason, never evaluated nor FAIL."""
    import contextlib
    spec = load_study(str(_study_file(tmp_path, "tiny-optuna", trials=12)))[1]
    real_count, lied = search_mod._count, []

    def stale_count(study, states):     # the ask section's second count misses 4 trials
        n = real_count(study, states)
        if set(states) == {optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.RUNNING} and n >= 4 \
                and not lied:
            lied.append(1)
            return n - 4
        return n
    monkeypatch.setattr(search_mod, "AskLock", lambda *a: contextlib.nullcontext())
    monkeypatch.setattr(search_mod, "_count", stale_count)
    rows = search_mod.run_search(spec, tmp_path / "run", study_name="tiny-optuna")
    counts = rows.attrs["trials"]
    assert counts["complete"] == 12 and counts["fail"] == 0 and counts["pruned"] == 4 and len(rows) == 12
    study = optuna.load_study(study_name="tiny-optuna", storage=search_mod.open_storage(None, tmp_path / "run"))
    pruned = [t for t in study.trials if t.state.name == "PRUNED"]
    assert all("beyond the study's 12 trials" in t.user_attrs["discarded"] for t in pruned)
    assert not {t.number for t in pruned} & set(rows.trial)


def test_constraint_key_is_optunas():
    assert search_mod.CONSTRAINTS_ATTR == _CONSTRAINTS_KEY
