"""Optuna multi-objective search over a design space (``method: optuna``).

Trials are asked in population-sized batches, the batch is evaluated at once by the
vectorized evaluator, and every trial is told its objective values and its constraint
violations (``trial.set_constraint``: fits in memory, SLOs, budgets; <= 0 is
feasible). Presets named in the space are enqueued first as baselines.

Storage: by default a journal file inside the run folder (``optuna.journal``, no
server, opens in optuna-dashboard); ``--storage`` takes any SQLAlchemy URL (SQLite,
PostgreSQL) so that worker processes on many machines share one study. Each batch's
rows are written to ``chunks/`` before its trials are told, and the study stops at
exactly ``trials`` complete trials: a rerun after an interruption resumes with the
trials still missing, and a trial asked beyond the target by a concurrent worker is
marked failed, never evaluated twice. SIGINT and SIGTERM finish the current batch
(milliseconds) before stopping, so no asked trial is left running.
"""
from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import numpy as np
import pandas as pd

from basis.errors import DseError
from dse.explore.runio import Progress, write_atomic
from dse.explore.space import PARAMS
from dse.explore.spec import SAMPLERS
from dse.explore.sweep import evaluate_columns
from hwmodels.presets import load_device


def _optuna():
    import optuna
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def make_sampler(name: str, seed: int, population: int | None):
    """The Optuna sampler called ``name`` with an explicit seed."""
    optuna = _optuna()
    import warnings
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    pop = population or 50
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(population_size=pop, seed=seed)
    if name == "nsga3":
        return optuna.samplers.NSGAIIISampler(population_size=pop, seed=seed)
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "qmc":
        return optuna.samplers.QMCSampler(seed=seed, qmc_type="sobol", scramble=True)
    raise DseError(f"sampler '{name}' is not one of {', '.join(SAMPLERS)}")


def distributions(space) -> tuple[dict, dict]:
    """(Optuna distributions of the varying parameters, constant parameters)."""
    optuna = _optuna()
    dists, fixed = {}, {}
    for a in space.axes:
        if len(a.values) == 1 and not a.is_range:
            fixed[a.name] = a.values[0]
        elif a.is_range:
            if a.low == a.high:
                fixed[a.name] = a.values[0] if a.values else (int(a.low) if PARAMS[a.name] is int else a.low)
            elif PARAMS[a.name] is int:
                dists[a.name] = optuna.distributions.IntDistribution(int(a.low), int(a.high), log=a.log)
            else:
                dists[a.name] = optuna.distributions.FloatDistribution(a.low, a.high, log=a.log)
        else:
            dists[a.name] = optuna.distributions.CategoricalDistribution(list(a.values))
    return dists, fixed


def open_storage(url: str | None, out: Path):
    """The study storage: a journal file in ``out`` by default, else an SQLAlchemy URL."""
    optuna = _optuna()
    if url is None:
        from optuna.storages.journal import JournalFileBackend
        return optuna.storages.JournalStorage(JournalFileBackend(str(out / "optuna.journal")))
    if "://" not in url:
        raise DseError(f"--storage '{url}': expected an SQLAlchemy URL such as sqlite:///study.db or "
                       f"postgresql://user@host/db")
    try:
        return optuna.storages.RDBStorage(url, heartbeat_interval=None)
    except Exception as e:    # driver missing, server down, bad URL: one line
        hint = ""
        if "import" in str(e).lower() and url.startswith("postgres"):
            hint = " (install the PostgreSQL driver: pip install -e '.[postgres]')"
        raise DseError(f"--storage '{url}': cannot open: {str(e).splitlines()[0]}{hint}") from None


def _baselines(space) -> list[dict]:
    """Parameters of each preset named in the space, for the ranges that contain its own figures."""
    hw = next(a for a in space.axes if a.name == "hardware")
    out = []
    for name in hw.values:
        d = load_device(name)
        own = {"memory_bandwidth": d.memory.bandwidth_bytes_per_s, "memory_capacity": d.memory.capacity_bytes,
               **{f"peak_{c}": v for c, v in d.peak_ops_per_s.items()}}
        p = {"hardware": name} if len(hw.values) > 1 else {}
        for a in space.axes:
            if a.is_range and a.name in own and a.low <= own[a.name] <= a.high and a.low < a.high:
                p[a.name] = own[a.name]
        if p:
            out.append(p)
    return out


class Interrupted(DseError):
    """The study stopped on SIGINT/SIGTERM after telling its last batch."""


class _Stop:
    """SIGINT/SIGTERM: finish the batch in hand, then stop."""

    def __init__(self):
        self.requested = False
        self._old = {}

    def __enter__(self):
        for s in (signal.SIGINT, signal.SIGTERM):
            try:
                self._old[s] = signal.signal(s, self._handle)
            except ValueError:       # not the main thread
                pass
        return self

    def _handle(self, signum, frame):
        self.requested = True

    def __exit__(self, *exc):
        for s, h in self._old.items():
            signal.signal(s, h)


def _count(study, states) -> int:
    return len(study.get_trials(deepcopy=False, states=states))


def _open_study(spec, out: Path, storage_url: str | None, study_name: str, seed: int):
    """Create or load the study (schema, directions, fingerprint, baselines enqueued once)."""
    optuna = _optuna()
    storage = open_storage(storage_url, out)
    names = list(spec.objectives)
    directions = ["maximize" if spec.objectives[k] == "max" else "minimize" for k in names]
    sampler = make_sampler(spec.sampler, seed, spec.population)
    study = optuna.create_study(study_name=study_name, storage=storage, sampler=sampler, directions=directions,
                                load_if_exists=True)
    if study.user_attrs.get("fingerprint") not in (None, spec.fingerprint()):
        raise DseError(f"storage already holds a study '{study_name}' with another space; use another --out "
                       f"or --storage")
    if not study.user_attrs.get("baselines_enqueued"):
        study.set_user_attr("fingerprint", spec.fingerprint())
        study.set_user_attr("baselines_enqueued", True)
        for p in _baselines(spec.space):
            study.enqueue_trial(p, skip_if_exists=True)
    return study


def run_worker(spec, out: Path, storage_url: str | None, study_name: str, seed: int, quiet: bool = True) -> int:
    """Run trials of the study until it has ``spec.trials`` complete ones; return how many
    this worker completed."""
    from optuna.trial import TrialState
    study = _open_study(spec, out, storage_url, study_name, seed)
    names = list(spec.objectives)
    dists, fixed = distributions(spec.space)
    chunk_dir = out / "chunks"
    chunk_dir.mkdir(parents=True, exist_ok=True)
    batch_size = spec.population or 50
    done_here = 0
    live = (TrialState.COMPLETE, TrialState.RUNNING, TrialState.WAITING)
    progress = Progress(spec.trials, quiet, "optuna " + spec.sampler, unit="trials")
    progress.done = _count(study, (TrialState.COMPLETE,))
    with _Stop() as stop:
        while not stop.requested:
            room = spec.trials - _count(study, (TrialState.COMPLETE, TrialState.RUNNING))
            if room <= 0:
                break
            trials = []
            for _ in range(min(batch_size, room)):
                t = study.ask(dists)
                trials.append(t)
            # a concurrent worker may have asked too: trials beyond the target are failed, not run
            numbers = sorted(t.number for t in study.get_trials(deepcopy=False, states=live[:2]))
            allowed = set(numbers[:spec.trials]) | {t.number for t in study.get_trials(
                deepcopy=False, states=(TrialState.COMPLETE,))}
            keep = [t for t in trials if t.number in allowed]
            for t in trials:
                if t.number not in allowed:
                    study.tell(t, state=TrialState.FAIL)
            if not keep:
                break
            cols = {name: _column([t.params[name] for t in keep]) for name in dists}
            cols.update(fixed)
            df, ev = evaluate_columns(spec, cols, [t.number for t in keep], "trial")
            write_atomic(df, chunk_dir / f"trials-{keep[0].number:08d}-{uuid.uuid4().hex[:8]}.parquet")
            violations = {k: np.clip(np.nan_to_num(v, nan=1e300), -1e300, 1e300) for k, v in ev.violations.items()}
            for i, t in enumerate(keep):
                for key, v in violations.items():
                    t.set_constraint(key, float(v[i]))
                vals = [_finite(df[k].iloc[i], spec.objectives[k]) for k in names]
                study.tell(t, vals)
            done_here += len(keep)
            progress.update(len(keep))
        if stop.requested:
            n = _count(study, (TrialState.COMPLETE,))
            raise Interrupted(f"interrupted after {n:,} of {spec.trials:,} trials; run the same command again "
                              f"to resume")
    return done_here


def _column(values: list):
    if values and isinstance(values[0], str):
        return np.array(values, dtype=object)
    return np.asarray(values)


def _finite(v, sense: str) -> float:
    """An objective value Optuna accepts: NaN and infinities become a very bad finite value."""
    v = float(v)
    if np.isfinite(v):
        return v
    return -1e300 if sense == "max" else 1e300


def run_search(spec, out: Path, storage_url: str | None = None, workers: int = 1, quiet: bool = True,
               study_name: str = "dse") -> pd.DataFrame:
    """Run (or resume) an Optuna study with ``workers`` processes; merge the rows of its
    complete trials into ``out/results.parquet`` and return them."""
    optuna = _optuna()
    from optuna.trial import TrialState
    out.mkdir(parents=True, exist_ok=True)
    if storage_url is None:
        _fail_stale(study_name, out)
    stopped = None
    if workers <= 1:
        try:
            run_worker(spec, out, storage_url, study_name, spec.seed, quiet)
        except Interrupted as e:
            stopped = e
    else:
        _open_study(spec, out, storage_url, study_name, spec.seed)   # schema and study exist before workers race
        import multiprocessing as mp
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=_worker_main, args=(spec, out, storage_url, study_name, spec.seed + i))
                 for i in range(workers)]
        for p in procs:
            p.start()
        try:
            for p in procs:
                p.join()
        except KeyboardInterrupt:
            for p in procs:
                p.terminate()
                p.join()
            raise
        bad = [p.exitcode for p in procs if p.exitcode]
        if bad:
            raise DseError(f"{len(bad)} of {workers} worker processes failed (exit codes {bad})")
    study = optuna.load_study(study_name=study_name, storage=open_storage(storage_url, out))
    complete = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))}
    parts = [pd.read_parquet(p) for p in sorted((out / "chunks").glob("trials-*.parquet"))]
    rows = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame({"trial": []})
    rows = rows[rows["trial"].isin(complete)].drop_duplicates("trial").sort_values("trial").reset_index(drop=True)
    write_atomic(rows, out / "results.parquet")
    if stopped is not None:
        raise stopped
    return rows


def _fail_stale(study_name: str, out: Path) -> None:
    """Mark failed the trials a killed run left running in the embedded storage (no
    worker can be using that storage before this run starts its own); they are
    replaced by new trials, so no unfinished trial counts and none runs twice."""
    from optuna.trial import TrialState
    if not (out / "optuna.journal").exists():
        return
    lock = out / "optuna.journal.lock"     # held for milliseconds per write: an old one is a killed run's
    try:
        if lock.exists() and time.time() - lock.lstat().st_mtime > 2.0:
            lock.unlink()
    except OSError:
        pass
    storage = open_storage(None, out)
    try:
        study_id = storage.get_study_id_from_name(study_name)
    except KeyError:
        return
    for t in storage.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,)):
        storage.set_trial_state_values(t._trial_id, TrialState.FAIL)


def _worker_main(spec, out, storage_url, study_name, seed):
    try:
        run_worker(spec, Path(out), storage_url, study_name, seed, quiet=True)
    except Interrupted:
        os._exit(130)
    except DseError as e:
        print(f"dse.study: error: {e}", file=__import__("sys").stderr)
        os._exit(2)
