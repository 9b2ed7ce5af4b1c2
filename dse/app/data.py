"""What ``dse explore`` reads: the controls of a design point, derived from the parameter table
(``dse.system.params.TABLE``), their values as the columns of one design point, and the rows a
run folder kept (results.parquet, sample.parquet or pareto.csv), read column by column as the
report reads them (``dse.explore.runio``)."""
from __future__ import annotations

import json
import math
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from basis.errors import DseError
from dse.core.engines import engines
from dse.explore.online import FRONT_METRICS
from dse.explore.runio import STUDY_FILE, FrameResults, ResultsFile
from dse.present.report import ROW_FILES
from dse.system.params import SPEC, TABLE, Param
from hwmodels.formats import FORMATS
from hwmodels.links import available_links
from hwmodels.presets import available_hardware
from hwmodels.tiers import available_tiers
from workloads.model import available_models

# --------------------------------------------------------------------------- controls

#: the section of the design-point view each workload parameter sits in; the others of the workload
#: group are techniques, a hardware figure overrides the preset's, a cost parameter is a cost
SECTIONS = {
    "model": "model and lengths", "batch": "model and lengths", "prompt_len": "model and lengths",
    "gen_len": "model and lengths", "max_context": "model and lengths",
    "weights": "formats", "activations": "formats", "kv": "formats", "weights_edge": "formats",
    "devices": "parallelism", "tp": "parallelism", "pp": "parallelism", "ep": "parallelism",
    "cpu_layers": "parallelism", "disaggregate": "parallelism",
    **{p.name: "serving" for p in TABLE if p.name in (
        "serving", "concurrency", "request_rate", "kv_block", "prefill_chunk", "max_running", "lengths",
        "prefix_hit", "slo_ttft", "slo_tpot", "slo_percentile", "target_rate", "engine", "kernel_layer")},
    "hardware": "hardware",
}
#: the order of the sections on the page; the hardware figures and the costs start folded
SECTION_ORDER = ("model and lengths", "hardware", "formats", "parallelism", "serving", "techniques",
                 "hardware figures (override the preset's)", "cost")
FOLDED = ("hardware figures (override the preset's)", "cost")


def _formats() -> list[str]:
    return list(FORMATS)


#: the names a parameter takes from a registry (the others of type str are free text)
REGISTRIES = {
    "model": available_models, "hardware": available_hardware, "host_cpu": available_hardware,
    "weights": _formats, "activations": _formats, "kv": _formats,
    "weights_edge": lambda: ["none", *FORMATS], "spec_draft": lambda: ["none", *available_models()],
    "engine": lambda: ["default", *engines()], "link": available_links, "host_tier": available_tiers,
}
#: how a flag is shown in a dropdown
ON_OFF = {"on": True, "off": False}


@dataclass(frozen=True)
class Control:
    """One control of the design-point view, for parameter ``name``: a ``dropdown`` of
    ``options``, a ``number`` input, or ``text``; ``value`` its starting value (None: left
    out, the evaluator's default, said by ``placeholder``)."""

    name: str
    kind: str
    section: str
    options: tuple = ()
    value: object = None
    placeholder: str = ""
    help: str = ""
    step: object = "any"
    low: float | None = None
    high: float | None = None


def _section(p: Param) -> str:
    if p.name in SECTIONS:
        return SECTIONS[p.name]
    return {"hardware": "hardware figures (override the preset's)", "cost": "cost"}.get(p.group, "techniques")


def _shown(value) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return f"{value:g}" if isinstance(value, float) else str(value)


def control_of(p: Param) -> Control:
    """The control of parameter ``p`` from its declaration: its choices, a registry's names,
    on/off for a flag, a number with its range, or text; starting at its default where the
    command line's flag does (``flag_default``), else left out."""
    value = p.default if p.flag_default else None
    placeholder = f"default: {_shown(p.default)}" if p.default is not None else "default: derived"
    if p.group == "hardware" and p.name != "hardware":
        placeholder = "the preset's"
    common = {"name": p.name, "section": _section(p), "placeholder": placeholder, "help": p.help}
    if p.type is bool:
        return Control(kind="dropdown", options=tuple(ON_OFF), value=None if value is None else _shown(value), **common)
    if p.choices or p.name in REGISTRIES:
        options = tuple(p.choices or REGISTRIES[p.name]())
        return Control(kind="dropdown", options=options, value=value, **common)
    if p.numeric and not p.words:
        high = p.below if p.below is not None else (1.0 if p.at_most_one else p.at_most)
        return Control(kind="number", value=value, step=1 if p.type is int else "any",
                       low=0 if p.zero_allowed else (1 if p.type is int else None), high=high, **common)
    return Control(kind="text", value=None if value is None else str(value), **common)


def controls() -> tuple[Control, ...]:
    """Every parameter's control, in the order of ``TABLE`` (``SECTION_ORDER`` groups them)."""
    return tuple(control_of(p) for p in TABLE)


def _number(p: Param, text: str):
    """``text`` read as parameter ``p``'s number, or one of its words; DseError saying what is allowed."""
    if text in p.words:
        return text
    try:
        v = float(text) if text.isascii() else math.nan
    except ValueError:
        v = math.nan
    if math.isfinite(v) and p.type is int and v == round(v):
        return int(v)
    if p.type is float and math.isfinite(v):
        return v
    allowed = p.out_of_range(np.array([math.nan]))[1]
    words = "".join(f" or '{w}'" for w in p.words)
    raise DseError(f"{p.name}: expected {allowed}{words}, got '{text}'")


def point_columns(values: dict) -> dict:
    """The columns of the design point that the controls' ``values`` (by parameter name) set:
    a value left empty is left out (the evaluator's default), as ``dse analyze`` leaves out a
    flag not given; on/off as a flag, a number of an int parameter as an int. DseError naming
    the parameter for a text that is not its number."""
    cols = {}
    for p in TABLE:
        v = values.get(p.name)
        if v is None or (isinstance(v, str) and not v.strip()):
            continue
        if p.type is bool:
            v = ON_OFF[v] if isinstance(v, str) else bool(v)
        elif p.numeric:
            if isinstance(v, str):
                v = _number(p, v.strip())
            elif p.type is int and float(v) == round(float(v)):
                v = int(v)
        cols[p.name] = v
    return cols


def control_values(design: dict) -> dict:
    """The controls' values of a stored design (a run's row): each parameter it holds, a flag
    as on/off, a missing number (NaN) left out; every other control back to its start."""
    cs = {c.name: c for c in controls()}
    out = {c.name: c.value for c in cs.values()}
    for name, v in design.items():
        p = SPEC.get(name)
        if p is None:
            continue
        if isinstance(v, np.generic):
            v = v.item()
        if v is None or (isinstance(v, float) and math.isnan(v)):
            out[name] = None
        elif p.type is bool:
            out[name] = _shown(bool(v))
        elif p.numeric and not isinstance(v, str):
            v = int(v) if p.type is int and float(v) == round(float(v)) else float(v)
            out[name] = str(v) if cs[name].kind == "text" else v
        else:
            out[name] = str(v)
    return out


# --------------------------------------------------------------------------- runs

#: the file of a run's Pareto designs
FRONT_FILE = "pareto.csv"
#: the column that marks a run's Pareto designs in the run view
ON_FRONT = "pareto"
#: at most this many categories a column may hold to be offered as a filter, colour or facet
MAX_CATEGORIES = 50


@dataclass
class Run:
    """A run folder opened for the run view: where its rows come from (``source``: the file read),
    their columns (``names``), the id column (``key``: point or trial), the parameter columns,
    the study's objectives and whether it ran the ideal roofline (study.json), and the columns
    read so far (``frame``, filled column by column)."""

    path: Path
    source: str
    reader: object
    names: list[str]
    key: str
    params: list[str]
    objectives: dict
    ideal: bool
    front_ids: np.ndarray
    frame: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: the server answers callbacks in threads: one reads columns into ``frame`` at a time
    lock: threading.Lock = field(default_factory=threading.Lock)

    def columns(self, cols) -> pd.DataFrame:
        """The rows' columns ``cols`` (those the run holds; ``ON_FRONT`` included), read once."""
        with self.lock:
            return self._columns(cols)

    def _columns(self, cols) -> pd.DataFrame:
        want = [c for c in dict.fromkeys(cols) if c in self.names or c == ON_FRONT]
        missing = [c for c in dict.fromkeys([self.key, *want]) if c not in self.frame and c != ON_FRONT]
        if missing:
            got = self.reader.columns(missing)
            self.frame = pd.concat([self.frame, got.reset_index(drop=True)], axis=1) if len(self.frame.columns) \
                else got.reset_index(drop=True)
        if ON_FRONT not in self.frame:
            ids = self.frame[self.key].to_numpy(np.int64)
            self.frame[ON_FRONT] = np.isin(ids, self.front_ids)
        return self.frame[[self.key, *[c for c in want if c != self.key]]]

    @property
    def rows(self) -> int:
        return int(self.reader.rows)

    def categorical(self) -> list[str]:
        """Columns of names or flags with at most ``MAX_CATEGORIES`` values (and ``ON_FRONT``)."""
        types = self._types()
        cands = [c for c in self.names if types.get(c) == "categorical"]
        df = self.columns(cands)
        return [c for c in cands if df[c].nunique(dropna=True) <= MAX_CATEGORIES] + [ON_FRONT]

    def numeric(self) -> list[str]:
        """Columns of numbers (not the id)."""
        types = self._types()
        return [c for c in self.names if types.get(c) == "numeric" and c != self.key]

    def _types(self) -> dict:
        if isinstance(self.reader, ResultsFile):
            import pyarrow as pa
            out = {}
            for f in self.reader.schema:
                t = f.type.value_type if pa.types.is_dictionary(f.type) else f.type
                out[f.name] = ("categorical" if pa.types.is_string(t) or pa.types.is_large_string(t)
                               or pa.types.is_boolean(t) else "numeric" if pa.types.is_integer(t)
                               or pa.types.is_floating(t) else "other")
            return out
        df = self.reader.df
        return {c: "categorical" if df[c].dtype == bool or not pd.api.types.is_numeric_dtype(df[c]) else "numeric"
                for c in df.columns}

    def design(self, ident: int) -> dict:
        """The stored row of the design with id ``ident`` (every column the run kept)."""
        ids = self.columns([self.key])[self.key].to_numpy(np.int64)
        pos = np.flatnonzero(ids == int(ident))
        if not len(pos):
            raise DseError(f"{self.path}: no design {self.key} {ident} in {self.source}")
        return self.reader.rows_at([int(pos[0])])[0]


def _front(path: Path) -> pd.DataFrame:
    try:
        return pd.read_csv(path / FRONT_FILE)
    except (FileNotFoundError, pd.errors.EmptyDataError):
        return pd.DataFrame()
    except (OSError, UnicodeDecodeError, ValueError, pd.errors.ParserError) as e:
        raise DseError(f"{path / FRONT_FILE}: not a readable CSV file ({type(e).__name__})") from None


def _study(path: Path) -> dict:
    """The settings study.json records (empty when there is none or it is not one)."""
    try:
        settings = json.loads((path / STUDY_FILE).read_text())["settings"]
        return settings if isinstance(settings, dict) else {}
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
        return {}


def open_run(folder) -> Run:
    """The run in ``folder``: its rows from results.parquet (every row), else sample.parquet (a
    uniform sample), else pareto.csv (the Pareto designs alone), as the run kept them. DseError
    on one line naming the folder when it is no folder or holds none of them."""
    path = Path(folder)
    if not path.is_dir():
        raise DseError(f"{path}: no such run folder (give runs/<study name>, a folder 'dse run' wrote)")
    front = _front(path)
    source, reader = None, None
    for kept in ("all", "sample"):
        f = path / ROW_FILES[kept]
        if f.exists():
            try:
                reader = ResultsFile(f)
            except (OSError, ValueError) as e:
                raise DseError(f"{f}: not a readable Parquet file ({type(e).__name__})") from None
            source = ROW_FILES[kept]
            break
    if reader is None:
        if not len(front.columns):
            raise DseError(f"{path}: holds no rows of a run ({', '.join(ROW_FILES.values())} or {FRONT_FILE}); "
                           f"give a folder 'dse run' wrote")
        reader, source = FrameResults(front), FRONT_FILE
    names = list(reader.names)
    key = next((k for k in ("point", "trial") if k in names), None)
    if key is None:
        raise DseError(f"{path / source}: has no 'point' or 'trial' column naming its designs")
    ids = front[key].to_numpy(np.int64) if key in front else np.zeros(0, dtype=np.int64)
    settings = _study(path)
    objectives = settings.get("objectives") if isinstance(settings.get("objectives"), dict) else {}
    return Run(path=path, source=source, reader=reader, names=names, key=key,
               params=[p.name for p in TABLE if p.name in names], objectives=dict(objectives),
               ideal=bool(settings.get("ideal", False)), front_ids=ids)


def run_folders(root: Path = Path("runs")) -> list[str]:
    """The run folders under ``root`` (those holding rows or a front), sorted."""
    if not root.is_dir():
        return []
    return sorted(str(d) for d in root.iterdir() if d.is_dir() and any(
        (d / f).exists() for f in (*ROW_FILES.values(), FRONT_FILE)))


def filter_mask(df: pd.DataFrame, categories: dict, ranges: dict) -> np.ndarray:
    """True where a row of ``df`` passes the filters: for each column of ``categories`` its value
    (as text) is one of those listed (an empty list: no filter), for each column of ``ranges``
    its value lies in [low, high] (None: unbounded on that side)."""
    keep = np.ones(len(df), dtype=bool)
    for c, allowed in categories.items():
        if allowed and c in df:
            keep &= df[c].astype(str).isin([str(a) for a in allowed]).to_numpy()
    for c, (low, high) in ranges.items():
        if c not in df or (low is None and high is None):
            continue
        v = df[c].to_numpy(dtype=float)
        with np.errstate(invalid="ignore"):
            if low is not None:
                keep &= v >= float(low)
            if high is not None:
                keep &= v <= float(high)
    return keep


def shown_columns(run: Run) -> list[str]:
    """The columns a hover and a comparison show: the parameters, the objectives, the key metrics."""
    return list(dict.fromkeys([*run.params, *run.objectives, *[m for m in FRONT_METRICS if m in run.names],
                               "feasible", "reason"]))

