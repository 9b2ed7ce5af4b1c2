"""Optuna multi-objective search over a design space (``method: optuna``): the search loop.

Trials are asked in population-sized batches, the batch is evaluated at once by the
vectorized evaluator, and every trial is told its objective values. Where its parts live:

- ``dse.explore.optuna_study``: the study's Optuna name, sampler, distributions, baselines;
- ``dse.explore.trial_records``: what a trial carries (metrics as user attrs, constraints);
- ``dse.explore.storage``: opening the storage (journal file or SQLAlchemy URL), URLs in
  messages, the ask lock, the journal at a run's start;
- ``dse.explore.optuna_journal``: the journal file written a population at a time;
- ``dse.explore.workers``: signals, worker processes, heartbeats.

Every name other modules import from here stays importable from here.

With the default journal file a whole population (its asks, records and tells) reaches
the file in one write and one fsync (``dse.explore.optuna_journal``): the population runs
against the journal held in memory, under the ask lock, and is written whole at its end, so
a killed run resumes from the last population written whole (a torn write is cut at the
next start) and the file holds the same records Optuna writes op by op (plus one study
system attr per population, ``dse:population``). Worker processes on one journal take
turns, a population each (the sampler ran one at a time already); SQLAlchemy storages
(SQLite, PostgreSQL) are written op by op, each worker evaluating its batch while the
others ask theirs. ``DSE_JOURNAL_BATCH=0`` writes the journal op by op too.

Time. ``rows.attrs["trials"]`` (and the last stderr line of a run that is not quiet) says
how the run's wall time went: ``wall_s`` (this ``run_search``), ``evaluation_s`` (inside
dse's vectorized evaluation, summed over workers), ``evaluation_share`` (evaluation_s over
wall_s times the worker processes) and ``journal_write_s`` (writing and fsyncing the
journal file; None for other storages).

Progress. A tqdm bar on stderr (``basis.progress``: on a terminal, or with ``progress``;
never ``quiet``) counts the study's complete trials against ``trials`` with the time left:
one worker moves it after each population; with worker processes the parent reads the
count from the storage (every worker's trials, and other machines' on a shared one) at
most once a second, waking only when a worker exits or every ``workers.TICK_S`` seconds.

Storage: by default a journal file inside the run folder (``optuna.journal``, no
server, opens in optuna-dashboard); ``--storage`` takes any SQLAlchemy URL (SQLite
file, PostgreSQL) so that worker processes on many machines share one study.

Exact counts. Each batch's rows are written to ``chunks/`` before its trials are told,
and the study stops at exactly ``trials`` complete trials: a rerun after an
interruption resumes with the trials still missing. Counting the trials and asking the
next batch is one critical section among the processes asking trials of the study
(``AskLock``: a file lock in the run folder for a journal, beside the database for
SQLite, a PostgreSQL advisory lock), so workers never ask beyond the target. Where no
such lock spans every asking process (another database, runs on other machines), a
trial asked beyond the target is told PRUNED with the user attr ``discarded`` saying
why, never evaluated and never FAIL. A trial left RUNNING by a killed process is marked
failed (FAIL) and replaced by a new one:

- journal file: at the start of a run, since the run folder is locked by its run (no
  other process can be using its journal), every RUNNING trial is a killed run's; a
  journal lock file left by a killed writer is removed at once instead of waiting
  Optuna's 30 s grace period.
- SQLAlchemy storages: other machines may be running trials of the same study, so a
  RUNNING trial is failed only when its heartbeat is older than a grace period. Each
  worker records the heartbeat of the trials it runs every ``HEARTBEAT_S`` seconds
  (env ``DSE_HEARTBEAT_S``); a trial whose heartbeat is older than ``GRACE_S`` (env
  ``DSE_HEARTBEAT_GRACE_S``, default three intervals) is stale. A RUNNING trial first
  seen by a process is given a heartbeat (one killed within its first interval, or left
  by an older version, has none), so it too goes stale a grace period later. A run that
  has its target minus such trials waits for them (saying so on stderr), fails them,
  and replaces them.

Processes. SIGINT and SIGTERM are handled alike: the current batch (milliseconds) is
finished and told, then the run stops with "interrupted after N of M trials", N the
study's complete trials at that moment. With ``workers > 1`` the parent forwards the
stop to its workers (SIGTERM), waits for them and kills any that do not stop in
``STOP_WAIT_S``. Workers die with their parent however it dies: on Linux through
``PR_SET_PDEATHSIG`` (the kernel sends SIGTERM), elsewhere (and as a fallback) a
watchdog thread that sees the parent process id change; a worker then finishes its
batch and exits, and exits hard after ``STOP_WAIT_S`` if it cannot.

Shared studies. ``trial_counts`` gives the states of the study's trials and how many of
the complete ones have a row in this run folder. Each run folder's ``results.parquet``
(and so its Pareto front and report) holds the trials evaluated by that folder's
workers only; with one ``--storage`` shared by runs with different ``--out`` folders
the study's other complete trials have their rows in those folders. ``run_search``
says so on stderr and in ``rows.attrs["trials"]``; the Optuna study itself (in the
shared storage) holds every trial's parameters and objective values.
"""
from __future__ import annotations

import contextlib
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pandas as pd

from basis.errors import DseError
from basis.progress import progress_bar, progress_shown
from dse.explore.optuna_journal import batching_enabled
from dse.explore.optuna_study import (
    LEGACY_STUDY_NAME,
    distributions,
    make_sampler,
    open_study,
    stored_study_name,
    study_name,
)
from dse.explore.runio import write_atomic
from dse.explore.storage import (
    GRACE_S,
    HEARTBEAT_S,
    JOURNAL,
    AskLock,
    close_storage,
    display_url,
    fail_stale,
    heartbeat_settings,
    heartbeat_storage,
    open_storage,
    open_study_storage,
    optuna_quiet,
    remove_stale_lock,
    repair_journal,
    storage_errors,
    study_id,
)
from dse.explore.sweep import evaluate_columns
from dse.explore.trial_records import (
    CONSTRAINTS_ATTR,
    batch_constraint_values,
    batch_trial_attrs,
    constraint_values,
    objective_value,
    record,
    trial_attrs,
)
from dse.explore.workers import (
    STOP_WAIT_S,
    Heartbeat,
    Interrupted,
    Stop,
    WorkerClock,
    interrupted,
    reap_stale,
    run_workers,
)

# names imported from here by other modules, tests and benchmarks (they moved out by concern)
__all__ = ["CONSTRAINTS_ATTR", "GRACE_S", "HEARTBEAT_S", "LEGACY_STUDY_NAME", "STOP_WAIT_S", "Interrupted",
           "WorkerClock", "batch_constraint_values", "batch_trial_attrs", "constraint_values", "display_url",
           "distributions", "evaluate_columns", "heartbeat_settings", "make_sampler", "open_storage", "run_search",
           "run_worker", "stored_study_name", "study_name", "trial_attrs", "trial_counts"]


def _count(study, states) -> int:
    return len(study.get_trials(deepcopy=False, states=states))


def _open_study(spec, out: Path, storage_url: str | None, name: str, seed: int):
    """The study ``name`` in the storage of ``storage_url`` / ``out``, created or loaded
    (``optuna_study.open_study``)."""
    return open_study(spec, open_storage(storage_url, out), name, seed)


# ------------------------------------------------------------ a worker

class _Searcher:
    """One process's view of the study: its storage as opened here (``opened``), the study
    and its id. ``reopen`` replaces them after a population the journal refused."""

    def __init__(self, spec, out: Path, storage_url: str | None, name: str, seed: int):
        self.spec, self.out, self.storage_url, self.name = spec, out, storage_url, name
        self.opened = open_study_storage(storage_url, out)
        self.study = open_study(spec, self.opened.storage, name, seed)
        self.study_id = self.opened.storage.get_study_id_from_name(name)
        self.journal_s = self.journal_writes = 0.0     # of journal backends replaced by ``reopen``

    @property
    def storage(self):
        return self.opened.storage

    @property
    def journal(self):
        """The run folder's journal backend (a ``PopulationJournal``), None for a database."""
        return self.opened.journal

    @property
    def batched(self) -> bool:
        """Whether a population reaches the journal in one write."""
        return self.journal is not None and batching_enabled()

    def reopen(self) -> None:
        """Open the journal afresh and load the study from it (same sampler): the storage
        held records that never reached the file."""
        optuna = optuna_quiet()
        self.journal_s += self.journal.write_s
        self.journal_writes += self.journal.writes
        self.opened = open_study_storage(self.storage_url, self.out)
        self.study = optuna.load_study(study_name=self.name, storage=self.opened.storage, sampler=self.study.sampler)

    def clock_journal(self, clock: WorkerClock) -> None:
        if self.journal is not None:
            clock.set("journal_write_s", self.journal_s + self.journal.write_s)
            clock.set("journal_writes", self.journal_writes + self.journal.writes)


def run_worker(spec, out: Path, storage_url: str | None, study_name: str, seed: int, bar=None,
               say: bool = True, clock: WorkerClock | None = None) -> int:
    """Run trials of the study until it has ``spec.trials`` complete ones; return how many
    this worker completed. ``bar`` (a tqdm bar, optional) follows the study's complete trials
    (``_show_complete``). ``say``: this worker tells stderr why it waits, if it waits.
    ``clock``: receives the seconds spent evaluating and writing the journal, and the study."""
    from optuna.trial import TrialState
    clock = clock if clock is not None else WorkerClock()
    if storage_url is None:       # the run's workers write the journal in turns: see ``_population``
        with AskLock(None, study_name, storage_url, out):
            here = _Searcher(spec, out, storage_url, study_name, seed)
    else:
        here = _Searcher(spec, out, storage_url, study_name, seed)
    clock.study = here.study
    dists, fixed = distributions(spec.space)
    chunk_dir = out / "chunks"
    chunk_dir.mkdir(parents=True, exist_ok=True)
    batch_size = spec.population or 50
    done_here = 0
    t0 = time.perf_counter()
    seen: set = set()
    waiting_since = None
    told_wait = False
    conflicts = 0
    beats = heartbeat_storage(here.storage)
    with Stop() as stop, Heartbeat(beats, here.study_id) as heart:
        while not stop.requested:
            study = here.study
            n_complete = _count(study, (TrialState.COMPLETE,))
            _show_complete(bar, n_complete)
            room = spec.trials - n_complete - _count(study, (TrialState.RUNNING,))
            if room <= 0:
                if n_complete >= spec.trials or beats is None:
                    break       # done; or (journal) this run's other workers finish the trials they hold
                # trials held by other processes: live ones finish in milliseconds, killed ones go stale
                running = reap_stale(study, beats, seen)
                now = time.monotonic()
                waiting_since = waiting_since or now
                interval, grace = heartbeat_settings()
                if say and not told_wait and now - waiting_since > min(2.0, interval) and running:
                    print(f"dse.study: {n_complete:,} of {spec.trials:,} trials complete; waiting for {running:,} "
                          f"trial(s) still marked running, perhaps by a killed process: a trial whose heartbeat "
                          f"is older than {grace:g} s is failed and replaced", file=sys.stderr, flush=True)
                    told_wait = True
                time.sleep(min(0.2 if now - waiting_since < 2.0 else 1.0, interval / 2))
                continue
            waiting_since = None
            n_told = _population(spec, here, out, batch_size, dists, fixed, chunk_dir, heart, clock)
            here.clock_journal(clock)
            if n_told is None:         # not written: something else wrote the journal meanwhile
                conflicts += 1
                if conflicts > 5:
                    raise DseError(f"{out / JOURNAL}: written by another program during each of the "
                                   f"last {conflicts} populations; stop it (or use another --out) and run again")
                here.reopen()
                clock.study = here.study
                continue
            conflicts = 0
            if n_told:
                done_here += n_told
                wall = time.perf_counter() - t0
                if bar is not None and wall > 0:
                    bar.set_postfix_str(f"evaluation {clock.values['evaluation_s'] / wall:.0%} of the time",
                                        refresh=False)
        if stop.requested:
            raise interrupted(_count(here.study, (TrialState.COMPLETE,)), spec.trials)
    return done_here


def _show_complete(bar, complete: int) -> None:
    """Move ``bar`` (a tqdm bar, or None) up to ``complete`` trials."""
    if bar is not None and complete > bar.n:
        bar.update(complete - bar.n)


class _CompletePoll:
    """Moves ``bar`` to the study's complete trials, read from its storage (every worker's,
    and other machines' on a shared storage) at most once per ``every`` seconds: the parent
    of worker processes calls it each time it wakes (``run_workers``'s ``on_tick``)."""

    def __init__(self, study, bar, every: float = 1.0):
        self.study, self.bar, self.every = study, bar, every
        self.last = time.monotonic()

    def __call__(self) -> None:
        from optuna.trial import TrialState
        now = time.monotonic()
        if now - self.last < self.every:
            return
        self.last = now
        try:
            _show_complete(self.bar, _count(self.study, (TrialState.COMPLETE,)))
        except storage_errors():         # a busy database, a blip: the next tick reads it
            pass


def _population(spec, here: _Searcher, out: Path, batch_size: int, dists: dict, fixed: dict,
                chunk_dir: Path, heart: Heartbeat, clock: WorkerClock) -> int | None:
    """Ask a batch of trials, evaluate it at once, write its rows, record and tell it;
    return how many trials were told complete (None: the batch was not written, see below).

    Counting the trials and asking is one critical section (``AskLock``). With the run
    folder's journal written a population at a time (``here.batched``) the whole batch is:
    it runs against the journal held in memory and is written in one write at its end, so
    no other process of the run writes the journal meanwhile; if something else did, the
    batch is dropped whole (its chunk file too) and None returned, to be asked again on the
    journal opened afresh."""
    from optuna.trial import TrialState
    study, journal = here.study, here.journal if here.batched else None
    live = (TrialState.COMPLETE, TrialState.RUNNING)
    chunk = None
    with contextlib.ExitStack() as held:
        held.enter_context(AskLock(here.storage, here.name, here.storage_url, out))  # count and ask at once
        if journal is not None:
            journal.begin()
        written = False
        try:
            n_live = _count(study, live)
            trials = [study.ask(dists) for _ in range(min(batch_size, spec.trials - n_live))]
            if journal is None:
                held.close()       # the batch is evaluated and told while other workers ask theirs
            if not trials:
                written = True
                return 0
            heart.running([t.number for t in trials])
            try:
                n_told, chunk = _evaluate_and_tell(spec, here, trials, dists, fixed, chunk_dir, clock)
            finally:
                heart.running([])
            written = True
        finally:
            if journal is not None and journal.holding:
                # also after an error: the trials told FAIL are written, as each op would have been
                written = journal.commit(here.storage, here.study_id) and written
    if not written:
        if chunk is not None:
            chunk.unlink(missing_ok=True)
        return None
    return n_told


def _evaluate_and_tell(spec, here: _Searcher, trials: list, dists: dict, fixed: dict, chunk_dir: Path,
                       clock: WorkerClock) -> tuple[int, Path | None]:
    """Evaluate the asked ``trials`` in one vectorized call, write their rows (a chunk file)
    and tell them; (trials told complete, the chunk file). Trials asked beyond the target by
    a concurrent worker are discarded (PRUNED), never evaluated; after an error no trial of
    the batch is left running (told FAIL)."""
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState
    study = here.study
    live = (TrialState.COMPLETE, TrialState.RUNNING)
    names = list(spec.objectives)
    settled = set()
    try:
        # where no lock spans every asking process, a concurrent worker may have asked
        # too: trials beyond the target are discarded (PRUNED), never evaluated
        numbers = sorted(t.number for t in study.get_trials(deepcopy=False, states=live))
        allowed = set(numbers[:spec.trials]) | {t.number for t in study.get_trials(
            deepcopy=False, states=(TrialState.COMPLETE,))}
        keep = [t for t in trials if t.number in allowed]
        for t in trials:
            if t.number not in allowed:
                _discard(study, t, spec.trials)
                settled.add(t.number)
        if not keep:
            return 0, None
        cols = {name: _column([t.params[name] for t in keep]) for name in dists}
        cols.update(fixed)
        t0 = time.perf_counter()
        df, ev = evaluate_columns(spec, cols, [t.number for t in keep], "trial")
        clock.add("evaluation_s", time.perf_counter() - t0)
        chunk = chunk_dir / f"trials-{keep[0].number:08d}-{uuid.uuid4().hex[:8]}.parquet"
        write_atomic(df, chunk)
        constraint_names = list(ev.violations)
        if study.user_attrs.get("constraint_names") != constraint_names:
            study.set_user_attr("constraint_names", constraint_names)
        record(here.storage, here.study_id, list(zip(keep, batch_trial_attrs(df, ev), batch_constraint_values(ev))))
        objectives = [[objective_value(v, spec.objectives[k]) for v in df[k].tolist()] for k in names]
        n_told = 0
        for i, t in enumerate(keep):
            try:
                study.tell(t, [col[i] for col in objectives])
                n_told += 1
            except UpdateFinishedTrialError:
                pass        # failed meanwhile as stale by another process: it is replaced
            settled.add(t.number)
        return n_told, chunk
    finally:
        for t in trials:     # an error mid-batch: leave no trial of it running
            if t.number not in settled:
                _tell_fail(study, t)


def _discard(study, trial, target: int) -> None:
    """Tell ``trial``, asked beyond the ``target`` complete trials by a concurrent worker,
    PRUNED (never evaluated; FAIL is for trials that crashed), saying so in its user attr
    ``discarded``."""
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState
    try:
        trial.set_user_attr("discarded", f"asked beyond the study's {target:,} trials by a concurrent worker; "
                                         f"not evaluated")
        study.tell(trial, state=TrialState.PRUNED)
    except UpdateFinishedTrialError:     # already finished (failed as stale by another process)
        pass


def _tell_fail(study, trial) -> None:
    """Tell ``trial`` FAIL unless it is finished already (failed as stale by another process)."""
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState
    try:
        study.tell(trial, state=TrialState.FAIL)
    except UpdateFinishedTrialError:
        pass


def _column(values: list):
    if values and isinstance(values[0], str):
        return np.array(values, dtype=object)
    return np.asarray(values)


# ------------------------------------------------------------ the run

def _state_counts(trials) -> dict[str, int]:
    """{state name in lower case: how many of ``trials``} for every Optuna trial state."""
    from optuna.trial import TrialState
    counts = {s.name.lower(): 0 for s in TrialState}
    for t in trials:
        counts[t.state.name.lower()] += 1
    return counts


def trial_counts(storage_url: str | None, out: Path, study=LEGACY_STUDY_NAME) -> dict[str, int]:
    """How many trials of the study are in each state, and how many of the complete ones
    have their row in ``out/results.parquet``.

    ``study``: the study's spec (its Optuna name found as ``stored_study_name`` does) or an
    Optuna study name. Keys: ``complete``, ``fail``, ``running``, ``waiting``, ``pruned``
    (the study's trials in that state, over every run folder sharing the storage) and
    ``rows`` (complete trials with a row in this folder's results.parquet). All zero for a
    study that does not exist yet. DseError (one line) if the storage cannot be opened."""
    from optuna.trial import TrialState
    out = Path(out)
    counts = {**_state_counts([]), "rows": 0}
    if storage_url is None and not (out / JOURNAL).exists():
        return counts
    storage = open_storage(storage_url, out)
    try:
        sid = study_id(storage, study if isinstance(study, str) else stored_study_name(storage, study))
        if sid is None:
            return counts
        trials = storage.get_all_trials(sid, deepcopy=False)
    finally:
        close_storage(storage)       # this process keeps no connection open
    counts.update(_state_counts(trials))
    complete = {t.number for t in trials if t.state == TrialState.COMPLETE}
    res = out / "results.parquet"
    if res.exists():
        try:
            numbers = pd.read_parquet(res, columns=["trial"])["trial"]
            counts["rows"] = int(numbers[numbers.isin(complete)].nunique())
        except (OSError, ValueError, KeyError):     # unreadable, or no trial column: no rows here
            pass
    return counts


def run_search(spec, out: Path, storage_url: str | None = None, workers: int = 1, quiet: bool = True,
               study_name: str | None = None, progress: bool | None = None) -> pd.DataFrame:
    """Run (or resume) an Optuna study with ``workers`` processes; merge the rows of its
    complete trials into ``out/results.parquet`` and return them. ``study_name``: the
    Optuna study's name; None: ``stored_study_name`` (the study's own name, or the name a
    study of the same space was created under before studies were named). ``progress``:
    the bar of complete trials even when stderr is not a terminal (``quiet``: never).

    ``rows.attrs["trials"]`` is ``trial_counts`` after the run plus ``asked`` (``spec.trials``)
    and the run's time: ``wall_s``, ``evaluation_s``, ``evaluation_share``, ``journal_write_s``
    (see the module's docstring). Raises Interrupted on SIGINT/SIGTERM (partial results
    written), DseError if a worker failed or the study ended short of its target."""
    optuna = optuna_quiet()
    from optuna.trial import TrialState
    t_start = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    if study_name is None:
        if storage_url is None:
            repair_journal(out)
        storage = open_storage(storage_url, out)
        study_name = stored_study_name(storage, spec)
        close_storage(storage)       # workers open their own connections
    if storage_url is None:
        fail_stale(study_name, out)
    opened = open_study_storage(storage_url, out)
    study = open_study(spec, opened.storage, study_name, spec.seed)     # schema and study exist before workers
    reap_stale(study, heartbeat_storage(opened.storage), set())
    stopped, failed = False, []
    shown = progress_shown(quiet, progress)
    bar = progress_bar(f"optuna {spec.sampler}", spec.trials, unit="trial", shown=shown,
                       initial=min(_count(study, (TrialState.COMPLETE,)), spec.trials))
    with bar:
        if workers <= 1:
            clock = WorkerClock()
            try:
                run_worker(spec, out, storage_url, study_name, spec.seed, bar, clock=clock)
            except Interrupted:
                stopped = True
            spent = dict(clock.values)
            study = clock.study if clock.study is not None else \
                optuna.load_study(study_name=study_name, storage=open_storage(storage_url, out))
        else:
            on_failure = (lambda: remove_stale_lock(out / (JOURNAL + ".lock"))) if storage_url is None else None
            stopped, failed, spent = run_workers(
                run_worker, lambda i: (spec, out, storage_url, study_name, spec.seed + i, None, i == 0), workers,
                on_failure, _CompletePoll(study, bar) if shown else None)  # a killed worker may hold the journal lock
            if storage_url is None and (stopped or failed):
                fail_stale(study_name, out)         # all of this run's workers are gone
            study = optuna.load_study(study_name=study_name, storage=open_storage(storage_url, out))
        all_trials = study.get_trials(deepcopy=False)
        _show_complete(bar, sum(t.state == TrialState.COMPLETE for t in all_trials))
    rows = _merge_rows(out, all_trials)
    write_atomic(rows, out / "results.parquet")
    counts = {**_state_counts(all_trials), "rows": len(rows)}
    wall = time.perf_counter() - t_start
    timing = {"wall_s": round(wall, 6), "evaluation_s": round(spent["evaluation_s"], 6),
              "evaluation_share": round(spent["evaluation_s"] / (wall * max(workers, 1)), 6) if wall > 0 else 0.0,
              "journal_write_s": round(spent["journal_write_s"], 6) if storage_url is None else None}
    rows.attrs["trials"] = {**counts, "asked": spec.trials, **timing}
    if not quiet:
        over = f" of {workers} workers" if workers > 1 else ""
        journal = f", {timing['journal_write_s']:.2f} s writing the journal ({int(spent['journal_writes']):,} " \
                  f"writes)" if storage_url is None else ""
        print(f"dse.study: {wall:.1f} s in this run: {timing['evaluation_s']:.2f} s in dse's evaluation "
              f"({timing['evaluation_share']:.0%} of the time{over}){journal}; the rest in Optuna's sampler and "
              f"storage and the run's files", file=sys.stderr)
    if stopped:
        raise interrupted(counts["complete"], spec.trials)
    if failed:
        raise DseError(f"{len(failed)} of {workers} worker processes failed (exit codes {failed}); "
                       f"{counts['complete']:,} of {spec.trials:,} trials complete: run the same command again "
                       f"to resume")
    if counts["complete"] < spec.trials:
        raise DseError(f"the study has {counts['complete']:,} of {spec.trials:,} trials complete "
                       f"({counts['running']:,} still running elsewhere); run the same command again to resume")
    if storage_url is not None and counts["rows"] < counts["complete"]:
        print(f"dse.study: note: {counts['rows']:,} of the study's {counts['complete']:,} complete trials were "
              f"evaluated in {out}; the others were evaluated by runs with another --out on the shared "
              f"storage: results.parquet and the Pareto front here cover these {counts['rows']:,} only",
              file=sys.stderr)
    return rows


def _merge_rows(out: Path, trials) -> pd.DataFrame:
    """The rows (from ``out/chunks``) of the complete ``trials``, one per trial, by number.

    A row is its trial's only if it holds the trial's parameters: a population that never
    reached the journal (killed before its write, or dropped and asked again) may have left
    a chunk whose trial numbers were given to other trials since."""
    from optuna.trial import TrialState
    complete = {t.number: t.params for t in trials if t.state == TrialState.COMPLETE}
    parts = [pd.read_parquet(p) for p in sorted((out / "chunks").glob("trials-*.parquet"))] \
        if (out / "chunks").is_dir() else []
    rows = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame({"trial": pd.Series([], dtype="int64")})
    rows = rows[rows["trial"].isin(complete)]
    if len(rows):
        numbers = rows["trial"].tolist()
        ok = np.ones(len(rows), dtype=bool)
        for name in sorted({k for p in complete.values() for k in p} & set(rows.columns)):
            ok &= np.array([name not in complete[n] or complete[n][name] == v
                            for n, v in zip(numbers, rows[name].tolist())], dtype=bool)
        rows = rows[ok]
    return rows.drop_duplicates("trial").sort_values("trial").reset_index(drop=True)
