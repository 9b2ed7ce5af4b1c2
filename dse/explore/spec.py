"""What a study asks for: the design space, the method, objectives and constraints."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np

from basis.errors import DseError, kind_of, name_or_kind, shown_key
from dse.explore.space import PARAMS, DesignSpace
from dse.system.evaluator import METRICS

SAMPLERS = ("nsga2", "nsga3", "tpe", "random", "qmc")
METHODS = ("grid", "random", "sobol", "optuna")
#: seeds are 32-bit (what numpy's legacy generators and Optuna's samplers accept)
SEED_LIMIT = 2**32
#: the most points one chunk may hold, and the most samples or trials a study may ask for
MAX_CHUNK = 10_000_000
MAX_TRIALS = 10_000_000
#: what a sweep with an output folder keeps of its rows (``outputs.rows``): every row in
#: results.parquet, a uniform random sample of them in sample.parquet, or none (the Pareto
#: front and the per-parameter aggregates are kept in every case)
ROWS = ("all", "sample", "none")
#: a sweep of more points than this keeps a sample of its rows unless the study says ``rows: all``
ROWS_ALL_LIMIT = 10_000_000
#: rows in the sample of ``rows: sample`` unless the study says ``outputs.sample``
SAMPLE_ROWS = 100_000


@dataclass
class SweepSpec:
    """What to sweep and how.

    objectives: {name: 'min'|'max'} over metrics or numeric parameters; a study file's must name at least
    one (an empty mapping is refused; left out in Python, None: a sweep that ranks nothing).
    constraints: {metric: {'min': x} | {'max': x}} on top of fitting in memory.
    """

    space: DesignSpace
    method: str = "grid"
    samples: int | None = None
    seed: int = 0
    objectives: dict | None = None
    constraints: dict = field(default_factory=dict)
    chunk_size: int = 250_000
    max_points: int = 10_000_000
    ideal: bool = False
    where: str = "study"
    sampler: str = "nsga2"
    trials: int | None = None
    population: int | None = None
    #: the study's name (its file's ``name``, else the file name): names its Optuna study
    name: str | None = None
    #: ``outputs.rows`` (one of ROWS; None: ``all`` up to ROWS_ALL_LIMIT points, else ``sample``)
    rows: str | None = None
    #: ``outputs.sample``: rows in the sample of ``rows: sample``
    sample: int = SAMPLE_ROWS

    def __post_init__(self):
        where = self.where
        if self.method not in METHODS:
            raise DseError(f"{where}: method: expected one of {', '.join(METHODS)}, got {name_or_kind(self.method)}")
        for key, low, high in (("seed", 0, SEED_LIMIT - 1), ("chunk_size", 1, MAX_CHUNK), ("max_points", 1, None),
                               ("samples", 1, None), ("trials", 1, MAX_TRIALS), ("population", 2, MAX_CHUNK),
                               ("sample", 1, MAX_CHUNK)):
            v = getattr(self, key)
            if v is None and key in ("samples", "trials", "population"):
                continue
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low or (high and v > high):
                name = "outputs.sample" if key == "sample" else key
                raise DseError(f"{where}: {name}: expected an integer from {low:,}"
                               f"{f' to {high:,}' if high else ' up'}, got {kind_of(v)}")
        if self.rows is not None and self.rows not in ROWS:
            raise DseError(f"{where}: outputs.rows: expected one of {', '.join(ROWS)}, got {name_or_kind(self.rows)}")
        if self.method == "optuna" and self.rows not in (None, "all"):
            raise DseError(f"{where}: outputs.rows: applies to sweeps (grid, random, sobol); an optuna study "
                           f"keeps every trial")
        if self.method in ("random", "sobol") and (not isinstance(self.samples, int) or self.samples < 1):
            raise DseError(f"{where}: samples: a {self.method} sweep needs a positive number of samples")
        if self.method == "optuna":
            if self.sampler not in SAMPLERS:
                raise DseError(f"{where}: sampler: expected one of {', '.join(SAMPLERS)}, got {name_or_kind(self.sampler)}")
            if not isinstance(self.trials, int) or self.trials < 1:
                raise DseError(f"{where}: trials: an optuna study needs a positive number of trials")
            if not self.objectives:
                raise DseError(f"{where}: objectives: an optuna study needs at least one objective")
        self._check_objectives()
        for k, bound in self.constraints.items():
            if k not in METRICS:
                raise DseError(f"{where}: constraints.{shown_key(k)}: unknown metric; allowed: {', '.join(METRICS)}")
            if not isinstance(bound, dict) or not bound or set(bound) - {"min", "max"}:
                raise DseError(f"{where}: constraints.{k}: expected {{min: x}} and/or {{max: x}}, got {kind_of(bound)}")
            for s, v in list(bound.items()):
                try:
                    bound[s] = float(v) if not isinstance(v, bool) else None
                except (TypeError, ValueError, OverflowError):
                    bound[s] = None
                if bound[s] is None or not math.isfinite(bound[s]):
                    raise DseError(f"{where}: constraints.{k}.{s}: expected a finite number, got {kind_of(v)}")
            if "min" in bound and "max" in bound and bound["min"] > bound["max"]:
                raise DseError(f"{where}: constraints.{k}: contradictory, min {bound['min']} > max {bound['max']}")
        if self.points > self.max_points:
            raise DseError(f"{where}: the space has {self.points:,} points, more than max_points "
                           f"{self.max_points:,}; narrow it or raise max_points")

    def _check_objectives(self) -> None:
        """DseError, one line naming the study (``where``), the key and the metrics allowed, for an
        empty mapping of objectives, an objective that is no numeric metric or parameter (``feasible``
        included: a design is feasible or not, which ranks nothing), or a sense other than min or max.
        ``None`` (objectives left out in Python) is no objective."""
        where, given = self.where, self.objectives
        numeric = [k for k, kind in PARAMS.items() if kind in (int, float)]
        allowed = f"allowed: {', '.join(METRICS)} or a numeric parameter ({', '.join(numeric)})"
        if given is None:
            self.objectives = {}
            return
        if not isinstance(given, dict):
            raise DseError(f"{where}: objectives: expected a mapping of metrics to min or max, got "
                           f"{type(given).__name__}; {allowed}")
        if not given:
            raise DseError(f"{where}: objectives: none given; a study ranks its designs by at least one, e.g. "
                           f"{{output_tokens_per_s: max}}; {allowed}")
        for k, sense in given.items():
            if k == "feasible":
                raise DseError(f"{where}: objectives.feasible: not a metric to rank by (a design is feasible or "
                               f"not; feasible designs are the ones ranked, and constraints narrow them); {allowed}")
            if not isinstance(k, str) or (k not in METRICS and k not in numeric):
                what = "a name or a switch, which has no order" if k in PARAMS else "unknown metric or parameter"
                raise DseError(f"{where}: objectives.{shown_key(k)}: {what}; {allowed}")
            if k not in METRICS and k not in self.space.names:
                raise DseError(f"{where}: objectives.{k}: a parameter the space does not set (it has no value to "
                               f"rank by); give space.{k} a value or a range, or rank by a metric ({allowed})")
            if sense not in ("min", "max"):
                raise DseError(f"{where}: objectives.{k}: expected min or max, got {name_or_kind(sense)}")

    @property
    def points(self) -> int:
        if self.method == "optuna":
            return int(self.trials)
        return self.space.grid_size if self.method == "grid" else int(self.samples)

    @property
    def chunks(self) -> int:
        return -(-self.points // self.chunk_size)

    @property
    def rows_kept(self) -> str:
        """What a sweep into a folder keeps of its rows: 'all', 'sample' or 'none' (``rows``,
        else 'all' for up to ROWS_ALL_LIMIT points and 'sample' above)."""
        if self.rows is not None:
            return self.rows
        return "all" if self.method == "optuna" or self.points <= ROWS_ALL_LIMIT else "sample"

    def fingerprint(self) -> str:
        """The settings that identify the study's results (JSON): not how many processes run it.
        ``outputs`` appears only when rows are not all kept, so runs that keep them all (every
        run before outputs existed) keep their fingerprint."""
        settings = {"space": self.space.fingerprint(), "method": self.method, "samples": self.samples,
                    "seed": self.seed, "chunk_size": self.chunk_size, "ideal": self.ideal,
                    "constraints": self.constraints, "sampler": self.sampler,
                    "objectives": self.objectives, "population": self.population}
        if self.rows_kept != "all":
            settings["outputs"] = {"rows": self.rows_kept, **({"sample": self.sample} if self.rows_kept == "sample"
                                                              else {})}
        return json.dumps(settings, sort_keys=True)

    def chunk_columns(self, k: int) -> dict[str, np.ndarray]:
        """Parameter columns of chunk ``k`` (deterministic: the same chunk always has the same points)."""
        start = k * self.chunk_size
        stop = min(start + self.chunk_size, self.points)
        if self.method == "grid":
            return self.space.grid_chunk(start, stop)
        d = len(self.space.axes)
        if self.method == "random":
            unit = np.random.default_rng([self.seed, k]).random((stop - start, d))
        else:
            from scipy.stats import qmc
            sob = qmc.Sobol(d, scramble=True, seed=self.seed)
            if start:
                sob.fast_forward(start)
            unit = sob.random(stop - start)
        return self.space.sample_chunk(unit)
