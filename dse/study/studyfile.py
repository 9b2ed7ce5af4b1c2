"""Study files (``studies/*.yaml``): the design space, objectives, constraints and method.

    name: gpu-sweep-1m
    description: what question the study answers
    space:            # parameters of dse.explore.space: fixed values, lists of choices, ranges
      hardware: h100-sxm
      model: llama-2-70b
      memory_bandwidth: {min: 1.0e12, max: 8.0e12, count: 100}
    objectives: {output_tokens_per_s: max, memory_bandwidth: min}
    constraints: {tpot_s: {max: 0.05}}
    method: grid      # grid | random | sobol | optuna
    samples: 100000   # random and sobol
    sampler: nsga2    # optuna: nsga2 | nsga3 | tpe | random | qmc
    trials: 2000      # optuna
    population: 50    # optuna: trials asked and evaluated per batch (NSGA population)
    seed: 0
    max_points: 10000000
    chunk_size: 250000
    ideal: false
    outputs:          # sweeps: what the output folder keeps besides pareto.csv and aggregates.csv
      rows: all       # all: results.parquet | sample: sample.parquet, a uniform sample | none
                      # (default: all up to 10,000,000 points, sample above)
      sample: 100000  # rows in the sample
    report:           # the figures and the answer table the report draws (dse.present.report_spec)

Everything is validated before any work starts; an error names the file and the key.
"""
from __future__ import annotations

import re
from pathlib import Path

from basis.errors import DseError, first_unknown, kind_of, shown_key, verbatim
from basis.files import exists, is_regular_file
from basis.shipped import shipped, shipped_folder
from basis.yamlfile import load_yaml
from dse.explore.space import DesignSpace
from dse.explore.spec import METHODS, SweepSpec
from dse.present.report_spec import report_spec

#: a study name: it is also the default output folder runs/<name>, so no paths
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
#: the shipped studies (``studies/``; package data in a wheel)
STUDY_DIR = shipped("studies")
KEYS = {"name", "description", "space", "objectives", "constraints", "method", "samples", "seed", "max_points",
        "chunk_size", "ideal", "sampler", "trials", "population", "outputs", "plan", "fleet", "report"}
#: the keys of ``outputs``
OUTPUT_KEYS = ("rows", "sample")


def available_studies() -> list[str]:
    """Names of the study files shipped in studies/ (DseError when the folder is missing)."""
    return sorted(p.stem for p in shipped_folder("studies", what="the shipped studies").glob("*.yaml"))


def study_path(name_or_path: str) -> Path:
    """The file of a study name or path; DseError listing the shipped studies."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or "/" in str(name_or_path):
        if not exists(p):
            raise DseError(f"{p}: no such study file")
        return p                # what is not a regular file is refused when read (load_yaml)
    f = STUDY_DIR / f"{name_or_path}.yaml"
    if not is_regular_file(f):
        raise DseError(f"unknown study '{shown_key(name_or_path)}'; shipped studies: {', '.join(available_studies())}")
    return f


def load_study(name_or_path: str, seed: int | None = None, trials: int | None = None,
               rows: str | None = None) -> tuple[dict, SweepSpec]:
    """(raw mapping, validated SweepSpec) of a study file; ``seed``, ``trials`` and ``rows``
    (``outputs.rows``) override the file's."""
    path = study_path(name_or_path)
    try:
        data = load_yaml(path, "study file")
    except DseError as e:
        raise verbatim(e) from None
    if not isinstance(data, dict):
        raise DseError(f"{path}: expected a study, a mapping with keys {', '.join(sorted(KEYS))}; this file is not one")
    unknown = first_unknown(data, KEYS)
    if unknown:
        raise DseError(f"{path}: unknown key(s) {unknown}; allowed: {', '.join(sorted(KEYS))}")
    if "space" not in data:
        raise DseError(f"{path}: missing 'space' (the parameters to explore)")
    for key, kind in (("objectives", dict), ("constraints", dict)):
        if key in data and not isinstance(data[key], kind):
            raise DseError(f"{path}: {key}: expected a mapping, got {kind_of(data[key])}")
    ints = {key: data[key] for key in ("samples", "seed", "max_points", "chunk_size", "trials", "population")
            if key in data}         # ranges checked by SweepSpec
    if "name" in data and not (isinstance(data["name"], str) and NAME.fullmatch(data["name"])):
        raise DseError(f"{path}: name: the name given is not a plain name (it names the output folder "
                       f"runs/<name>); allowed: letters, digits, '.', '_' and '-', starting with a letter or digit, "
                       f"at most 100 characters")
    if not isinstance(data.get("description", ""), str):
        raise DseError(f"{path}: description: expected text, got {kind_of(data['description'])}")
    if "ideal" in data and not isinstance(data["ideal"], bool):
        raise DseError(f"{path}: ideal: expected true or false, got {kind_of(data['ideal'])}")
    if seed is not None:
        ints["seed"] = seed
    if "sampler" in data and not isinstance(data["sampler"], str):
        raise DseError(f"{path}: sampler: expected a name, got {kind_of(data['sampler'])}")
    if trials is not None:
        ints["trials"] = trials
    if "sampler" in data:
        ints["sampler"] = str(data["sampler"])
    ints.update(_outputs(path, data.get("outputs", {}), rows))
    _check_method_keys(path, data)
    space = DesignSpace(data["space"], where=f"{path}: space")
    report_spec(data.get("report"), str(path), space.names)        # its plots and answer: checked before any work
    spec = SweepSpec(space, method=str(data.get("method", "grid")), objectives=data.get("objectives") or {},
                     constraints=data.get("constraints") or {}, ideal=bool(data.get("ideal", False)),
                     where=str(path), name=str(data.get("name") or path.stem), **ints)
    return data, spec


#: the keys that apply to some methods only (a study giving one to another method would see it ignored)
METHOD_KEYS = {"samples": ("random", "sobol"), "sampler": ("optuna",), "trials": ("optuna",), "population": ("optuna",)}


def _check_method_keys(path: Path, data: dict) -> None:
    """DseError naming the first key of ``METHOD_KEYS`` the study gives for a method it does not
    apply to (``samples`` beside ``method: grid``, ``trials`` beside a sweep): it would be left unused."""
    method = data.get("method", "grid")
    if method not in METHODS:           # refused by SweepSpec, naming what is allowed
        return
    for key, methods in METHOD_KEYS.items():
        if key in data and method not in methods:
            raise DseError(f"{path}: {key}: applies to method {' or '.join(methods)}, and this study's method is "
                           f"{method}, so it would be left unused; leave {key} out or change the method")


def _outputs(path: Path, outputs, rows: str | None) -> dict:
    """The SweepSpec fields of a study's ``outputs`` mapping (``rows``, ``sample``), ``rows``
    overriding the file's; DseError naming the key (values are checked by SweepSpec)."""
    if not isinstance(outputs, dict):
        raise DseError(f"{path}: outputs: expected a mapping with keys {', '.join(OUTPUT_KEYS)}, "
                       f"got {kind_of(outputs)}")
    unknown = first_unknown(outputs, OUTPUT_KEYS)
    if unknown:
        raise DseError(f"{path}: outputs: unknown key(s) {unknown}; allowed: "
                       f"{', '.join(OUTPUT_KEYS)}")
    out = {k: outputs[k] for k in OUTPUT_KEYS if k in outputs}
    if "rows" in out and not isinstance(out["rows"], str):
        raise DseError(f"{path}: outputs.rows: expected all, sample or none, got {kind_of(out['rows'])}")
    if rows is not None:
        out["rows"] = rows
    return out


def has_section(data, section: str) -> bool:
    """True when a study's mapping has a ``section`` (``plan:``, ``fleet:``): a study that asks for
    that command's answer instead of a sweep."""
    return isinstance(data, dict) and section in data


def load_section_study(name_or_path: str, section: str) -> dict:
    """The mapping of a study file (a shipped name or a path) that has a ``section`` (``has_section``);
    DseError naming the file otherwise."""
    path = study_path(name_or_path)
    data = load_yaml(path, "study file")
    if not has_section(data, section):
        raise DseError(f"{path}: not a {section} study: it has no '{section}:' section (run it with 'dse run')")
    return data
