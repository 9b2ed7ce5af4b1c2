"""What a study asks of its report: the ``report:`` section of a study file.

    report:
      compare:                    # figures the study's question needs, drawn in this order
        - x: prompt_len           # a column: a parameter or a metric
          y: [ttft_s, activation_bytes]       # one panel row per y
          colour: flash_attention # one line per value (legend toggles it in report.html)
          facet: hardware         # one panel column per value
          fixed: {batch: 1}       # rows kept: these columns at these values (a value or a list)
          best: {ttft_s: min}     # optional: how a point is chosen among the parameters left free
          kind: line              # line (points joined along x) | scatter
          title: text             # optional: what the figure shows
      answer:                     # the table that answers the question
        best_per: hardware        # one row per value (or per combination of a list of columns)
        rank: {service_devices: min, service_tdp_w: min}   # best: the first, ties by the next
        fixed: {weights: fp8}     # optional: only these rows
        columns: [replicas, goodput]           # optional: shown after best_per and rank
        title: text               # optional: the question, as the heading's words
      metrics: [service_devices, goodput]      # optional: the metrics named for each best design

Every varied parameter of the space not drawn as x, colour or facet, nor ``fixed``, is left
free: at each (facet, colour, x) the figure shows the one feasible design best by ``best``
(by default the first y that is an objective, in its sense, else the study's first objective
other than x; the record in plots.json and the caption say so). ``fixed`` on a drawn column
narrows the values drawn. A study with no ``report:``
gets the generic plots alone (``dse.present.report``).

:func:`report_spec` checks the section when the study file is read, before any work: an
unknown key, a column that is neither a parameter nor a metric, or a value of the wrong
kind is one line naming the study file, the key and what is allowed (``DseError``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from basis.errors import DseError, first_unknown, kind_of, shown_key
from dse.explore.space import PARAMS
from dse.system.evaluator import METRICS

#: the keys of ``report``, of one comparison and of the answer
REPORT_KEYS = ("compare", "answer", "metrics")
COMPARE_KEYS = ("x", "y", "colour", "facet", "fixed", "best", "kind", "title")
ANSWER_KEYS = ("best_per", "rank", "fixed", "columns", "title")
#: how a comparison joins its points
KINDS = ("line", "scatter")
SENSES = ("min", "max")
#: columns of every run's rows besides parameters and metrics
ROW_COLUMNS = ("point", "trial", "feasible")
#: the most comparisons a study may declare (each is a figure in report.html)
MAX_COMPARISONS = 8


@dataclass(frozen=True)
class Comparison:
    """One declared figure: ``ys`` against ``x``, a line (or points) per ``colour`` value,
    a panel column per ``facet`` value, the rows with the ``fixed`` parameters at their
    values (name -> tuple of allowed values); ``best``: (column, 'min' | 'max') choosing a
    point among the parameters left free (None: the report's default)."""
    x: str
    ys: tuple[str, ...]
    colour: str | None = None
    facet: str | None = None
    fixed: tuple[tuple[str, tuple], ...] = ()
    kind: str = "line"
    title: str = ""
    best: tuple[str, str] | None = None

    @property
    def columns(self) -> tuple[str, ...]:
        """Every column the figure reads."""
        return tuple(dict.fromkeys([self.x, *self.ys, *(c for c in (self.colour, self.facet) if c),
                                    *(k for k, _ in self.fixed), *(self.best[:1] if self.best else ())]))


@dataclass(frozen=True)
class Answer:
    """The table that answers the study: per value of ``best_per`` the feasible design
    best by ``rank`` ((column, 'min' | 'max'), the first decides, ties go to the next),
    among the rows with the ``fixed`` values; ``columns`` shown besides."""
    best_per: tuple[str, ...]
    rank: tuple[tuple[str, str], ...]
    fixed: tuple[tuple[str, tuple], ...] = ()
    columns: tuple[str, ...] = ()
    title: str = ""

    @property
    def reads(self) -> tuple[str, ...]:
        """Every column the table reads."""
        return tuple(dict.fromkeys([*self.best_per, *(c for c, _ in self.rank), *(k for k, _ in self.fixed),
                                    *self.columns]))


@dataclass(frozen=True)
class ReportSpec:
    """A study's ``report:`` section, checked (an empty one: the generic report alone)."""
    compare: tuple[Comparison, ...] = ()
    answer: Answer | None = None
    metrics: tuple[str, ...] = ()

    @property
    def columns(self) -> tuple[str, ...]:
        """Every column the declared figures and table read."""
        cols = [c for f in self.compare for c in f.columns] + list(self.answer.reads if self.answer else ())
        return tuple(dict.fromkeys(cols + list(self.metrics)))


#: the columns a report may name
COLUMNS = frozenset((*PARAMS, *METRICS, *ROW_COLUMNS))


def _allowed_columns(names) -> str:
    params = ", ".join(names) if names is not None else "dse list parameters"
    return f"a parameter of the study's space ({params}) or a metric ({', '.join(METRICS[:6])}, ...)"


def _column(where: str, key: str, value, names=None) -> str:
    """``value`` as a column name: a metric, or a parameter of the space's ``names`` (None:
    any parameter); DseError naming ``key`` when it is none."""
    if not isinstance(value, str):
        raise DseError(f"{where}: {key}: expected a column name, got {kind_of(value)}; "
                       f"allowed: {_allowed_columns(names)}")
    if value not in COLUMNS or (names is not None and value not in names and value not in METRICS
                                and value not in ROW_COLUMNS):
        raise DseError(f"{where}: {key}: '{shown_key(value)}' is not a column of this study's results; "
                       f"allowed: {_allowed_columns(names)}")
    return value


def _columns(where: str, key: str, value, names, at_least: int = 1) -> tuple[str, ...]:
    """A column or a list of columns, as a tuple of names."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or len(items) < at_least:
        raise DseError(f"{where}: {key}: expected a column name or a list of them, got {kind_of(value)}")
    return tuple(dict.fromkeys(_column(where, f"{key}[{i}]" if len(items) > 1 else key, v, names)
                               for i, v in enumerate(items)))


def _mapping(where: str, key: str, value, keys: tuple[str, ...] | None = None) -> dict:
    if not isinstance(value, dict):
        allowed = f" with keys {', '.join(keys)}" if keys else ""
        raise DseError(f"{where}: {key}: expected a mapping{allowed}, got {kind_of(value)}")
    if keys is not None:
        unknown = first_unknown(value, keys)
        if unknown:
            raise DseError(f"{where}: {key}: unknown key(s) {unknown}; allowed: {', '.join(keys)}")
    return value


def _text(where: str, key: str, value) -> str:
    if not isinstance(value, str):
        raise DseError(f"{where}: {key}: expected text, got {kind_of(value)}")
    return value


def _fixed(where: str, key: str, value, names) -> tuple[tuple[str, tuple], ...]:
    """``{column: value or [values]}`` as ((column, values), ...); DseError naming the key."""
    out = []
    for k, v in _mapping(where, key, value).items():
        _column(where, f"{key}.{k}" if isinstance(k, str) else key, k, names)
        vs = v if isinstance(v, list) else [v]
        if not vs or any(not isinstance(x, (str, int, float, bool)) for x in vs):
            raise DseError(f"{where}: {key}.{k}: expected a value or a list of values (numbers, names or "
                           f"true/false), got {kind_of(v)}")
        out.append((k, tuple(vs)))
    return tuple(out)


def _comparison(where: str, key: str, raw, names) -> Comparison:
    raw = _mapping(where, key, raw, COMPARE_KEYS)
    for need in ("x", "y"):
        if need not in raw:
            raise DseError(f"{where}: {key}: missing '{need}' (a column); keys: {', '.join(COMPARE_KEYS)}")
    x = _column(where, f"{key}.x", raw["x"], names)
    ys = _columns(where, f"{key}.y", raw["y"], names)
    colour = _column(where, f"{key}.colour", raw["colour"], names) if raw.get("colour") is not None else None
    facet = _column(where, f"{key}.facet", raw["facet"], names) if raw.get("facet") is not None else None
    kind = raw.get("kind", "line")
    if kind not in KINDS:
        raise DseError(f"{where}: {key}.kind: '{shown_key(kind)}' is not a kind of figure; allowed: "
                       f"{', '.join(KINDS)}")
    fixed = _fixed(where, f"{key}.fixed", raw["fixed"], names) if "fixed" in raw else ()
    best = _ranking(where, f"{key}.best", raw["best"], names) if "best" in raw else ()
    if len(best) > 1:
        raise DseError(f"{where}: {key}.best: expected one column and its sense ({{ttft_s: min}}), got {len(best)}")
    return Comparison(x, ys, colour, facet, fixed, kind, _text(where, f"{key}.title", raw.get("title", "")),
                      best[0] if best else None)


def _ranking(where: str, key: str, raw, names) -> tuple[tuple[str, str], ...]:
    """``{column: min | max, ...}`` as ((column, sense), ...), in the file's order; DseError naming the key."""
    out = []
    for c, s in _mapping(where, key, raw).items():
        _column(where, key, c, names)
        if s not in SENSES:
            raise DseError(f"{where}: {key}.{shown_key(c)}: expected min or max, got {kind_of(s)}")
        out.append((c, s))
    if not out:
        raise DseError(f"{where}: {key}: expected a mapping of columns to min or max, got an empty one")
    return tuple(out)


def _answer(where: str, key: str, raw, names) -> Answer:
    raw = _mapping(where, key, raw, ANSWER_KEYS)
    for need in ("best_per", "rank"):
        if need not in raw:
            raise DseError(f"{where}: {key}: missing '{need}'; keys: {', '.join(ANSWER_KEYS)}")
    best_per = _columns(where, f"{key}.best_per", raw["best_per"], names)
    rank = _ranking(where, f"{key}.rank", raw["rank"], names)
    fixed = _fixed(where, f"{key}.fixed", raw["fixed"], names) if "fixed" in raw else ()
    cols = _columns(where, f"{key}.columns", raw["columns"], names) if "columns" in raw else ()
    return Answer(best_per, tuple(rank), fixed, cols, _text(where, f"{key}.title", raw.get("title", "")))


def report_spec(raw, where: str, names=None) -> ReportSpec:
    """The checked ``report:`` section ``raw`` of the study file ``where`` (None: none, the
    generic report); ``names``: the parameters of the study's space (None: any parameter); DseError, one line naming the file and the key, when it is not one."""
    if raw is None:
        return ReportSpec()
    raw = _mapping(where, "report", raw, REPORT_KEYS)
    compare = raw.get("compare", [])
    if not isinstance(compare, list):
        raise DseError(f"{where}: report.compare: expected a list of figures (mappings with keys "
                       f"{', '.join(COMPARE_KEYS)}), got {kind_of(compare)}")
    if len(compare) > MAX_COMPARISONS:
        raise DseError(f"{where}: report.compare: {len(compare)} figures; allowed: at most {MAX_COMPARISONS}")
    figures = tuple(_comparison(where, f"report.compare[{i}]", c, names) for i, c in enumerate(compare))
    answer = _answer(where, "report.answer", raw["answer"], names) if raw.get("answer") is not None else None
    metrics = _columns(where, "report.metrics", raw["metrics"], names) if "metrics" in raw else ()
    return ReportSpec(figures, answer, metrics)


# --------------------------------------------------------------------------- the rows they show

def _matching(df, fixed) -> np.ndarray:
    """Mask of the rows of ``df`` with every ``fixed`` column at one of its values."""
    mask = np.ones(len(df), dtype=bool)
    for k, values in fixed:
        col = df[k]
        if col.dtype.kind in "fiu":
            mask &= np.isin(col.to_numpy(float), np.asarray([float(v) for v in values
                                                            if not isinstance(v, str)], dtype=float))
        elif col.dtype.kind == "b":
            mask &= col.isin([v for v in values if isinstance(v, bool)]).to_numpy(bool)
        else:
            mask &= col.astype(str).isin([str(v) for v in values]).to_numpy(bool)
    return mask


def chooser(c: Comparison, objectives: dict) -> tuple[str, str] | None:
    """How comparison ``c`` chooses a point among the parameters it leaves free: its ``best``;
    else its first y that is one of the study's ``objectives`` ({name: sense}); else the
    first objective that is not its x; None when there is none."""
    if c.best:
        return c.best
    y = next((y for y in c.ys if y in objectives), None) or next((o for o in objectives if o != c.x), None)
    return (y, objectives[y]) if y else None


def comparison_rows(df, c: Comparison, varied, best: tuple[str, str] | None) -> tuple:
    """(rows, left) that the declared comparison ``c`` draws from ``df`` (the run's rows, with
    ``point`` and ``feasible``): the rows with its ``fixed`` values; when the study varies
    parameters the figure neither draws nor fixes (``left``, a tuple of names), at each
    (facet, colour, x) only the feasible row best by ``best`` ((column, 'min' | 'max'); rows
    with no value of it dropped; ties: the lowest ``point``), else every row, feasible or not."""
    sub = df[_matching(df, c.fixed)]
    drawn = {c.x, c.colour, c.facet, *(k for k, _ in c.fixed)}
    left = tuple(v for v in varied if v not in drawn)
    if not left or best is None or best[0] not in sub:
        return sub, left
    first, sense = best
    ok = sub[sub["feasible"].to_numpy(bool) & sub[first].notna().to_numpy(bool)]
    keys = [k for k in (c.facet, c.colour, c.x) if k]
    order = ok.sort_values([first, "point"], ascending=[sense == "min", True], kind="stable")
    return order.drop_duplicates(keys, keep="first").sort_values("point", kind="stable"), left


def answer_rows(df, a: Answer):
    """The rows of ``df`` that answer the study: per value of ``a.best_per`` (among the
    feasible rows with ``a.fixed``'s values and a value of the first ranked column) the best
    by ``a.rank`` (ties by the next column, then the lowest ``point``), best first; and the
    values of ``best_per`` (as tuples of text) that no such row has."""
    sub = df[_matching(df, a.fixed)]
    groups = sub[list(a.best_per)].astype(str).drop_duplicates()
    first = a.rank[0][0]
    ok = sub[sub["feasible"].to_numpy(bool) & sub[first].notna().to_numpy(bool)]
    cols = [c for c, _ in a.rank] + ["point"]
    ranked = ok.sort_values(cols, ascending=[s == "min" for _, s in a.rank] + [True], kind="stable",
                            na_position="last")
    best = ranked.drop_duplicates(list(a.best_per), keep="first")
    have = set(map(tuple, best[list(a.best_per)].astype(str).to_numpy().tolist()))
    missing = [g for g in map(tuple, groups.to_numpy().tolist()) if g not in have]
    return best, missing
