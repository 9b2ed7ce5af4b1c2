"""The Optuna study of a dse study: its name, sampler, parameter distributions and baselines.

- Its Optuna name is the study's ``name`` (``study_name``), so one shared storage holds one
  Optuna study per dse study. A storage holding a study created before studies were named
  (Optuna name ``"dse"``, ``LEGACY_STUDY_NAME``) with the same space (fingerprint) resumes
  under that old name (``stored_study_name``); one with another space is left alone and a
  new study is created.
- Objectives are named (``study.metric_names``: the objective keys, in the study's order).
- Parameters have the distributions the space declares (``distributions``): choices are
  categorical (names as strings), integer ranges IntDistribution, float ranges
  FloatDistribution with ``log`` for log-scaled ranges, values in SI units.
- Presets named in the space are enqueued first as baselines (user attr ``baseline``: the
  preset's name).
"""
from __future__ import annotations

from basis.errors import DseError
from dse.explore.space import PARAMS
from dse.explore.spec import SAMPLERS
from dse.explore.storage import optuna_quiet, study_id
from dse.system.hardware import check_design

#: the Optuna name of a study with no ``name`` (a SweepSpec built in Python), and of every
#: study created before studies were named; such a run folder or storage still resumes
LEGACY_STUDY_NAME = "dse"


def make_sampler(name: str, seed: int, population: int | None):
    """The Optuna sampler called ``name`` with an explicit seed."""
    optuna = optuna_quiet()
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
    optuna = optuna_quiet()
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


def baselines(space) -> list[tuple[str, dict]]:
    """(preset name, parameters) of each preset named in the space, for the ranges that
    contain its own figures."""
    hw = next(a for a in space.axes if a.name == "hardware")
    out = []
    for name in hw.values:
        d = check_design(name)           # a derived design's base preset
        own = {"memory_bandwidth": d.memory.bandwidth_bytes_per_s, "memory_capacity": d.memory.capacity_bytes,
               **{f"peak_{c}": v for c, v in d.peak_ops_per_s.items()}}
        p = {"hardware": name} if len(hw.values) > 1 else {}
        for a in space.axes:
            if a.is_range and a.name in own and a.low <= own[a.name] <= a.high and a.low < a.high:
                p[a.name] = own[a.name]
        if p:
            out.append((name, p))
    return out


def study_name(spec) -> str:
    """The Optuna name a new study of ``spec`` gets: the study's ``name`` (its file's
    ``name``, else the file's stem), or ``LEGACY_STUDY_NAME`` for a spec without one."""
    return spec.name or LEGACY_STUDY_NAME


def stored_study_name(storage, spec) -> str:
    """The Optuna name of ``spec``'s study in ``storage``: ``study_name(spec)``, unless the
    study of that name is not this space's (or does not exist) and the storage holds a
    study of this space (same fingerprint) created before studies were named
    (``LEGACY_STUDY_NAME``), which is then resumed."""
    name, fingerprint = study_name(spec), spec.fingerprint()
    if name == LEGACY_STUDY_NAME:
        return name
    new = study_id(storage, name)
    if new is not None and storage.get_study_user_attrs(new).get("fingerprint") in (None, fingerprint):
        return name
    old = study_id(storage, LEGACY_STUDY_NAME)
    if old is not None and storage.get_study_user_attrs(old).get("fingerprint") == fingerprint:
        return LEGACY_STUDY_NAME
    return name


def open_study(spec, storage, name: str, seed: int):
    """Create or load the study called ``name`` in ``storage`` (directions, objective names,
    fingerprint, baselines enqueued once), sampling with ``spec``'s sampler and ``seed``.
    DseError if the storage's study of that name has another space."""
    optuna = optuna_quiet()
    names = list(spec.objectives)
    directions = ["maximize" if spec.objectives[k] == "max" else "minimize" for k in names]
    sampler = make_sampler(spec.sampler, seed, spec.population)
    study = optuna.create_study(study_name=name, storage=storage, sampler=sampler, directions=directions,
                                load_if_exists=True)
    if study.user_attrs.get("fingerprint") not in (None, spec.fingerprint()):
        raise DseError(f"storage already holds a study '{name}' with another space; use another --out "
                       f"or --storage")
    if study.metric_names != names:
        study.set_metric_names(names)
    if not study.user_attrs.get("baselines_enqueued"):
        study.set_user_attr("fingerprint", spec.fingerprint())
        study.set_user_attr("baselines_enqueued", True)
        for preset, p in baselines(spec.space):
            study.enqueue_trial(p, user_attrs={"baseline": preset}, skip_if_exists=True)
    return study
