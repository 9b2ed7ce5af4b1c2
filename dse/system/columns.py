"""Design points as columns: one entry per point, scalars broadcast.

A column is a scalar (the same for every point), a numpy array, a list or a pandas
Categorical (how sweeps pass names: cheap to group). Names may also be objects (a
``Device`` for ``hardware``, a ``ModelSpec`` for ``model``). Every numeric entry must be
finite and in range; every name is checked by whoever resolves it.
"""
from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from basis.errors import DseError
from dse.system.params import (
    BATCH_MAX,
    DEFAULTS,
    DERIVED_FROM,
    MAY_BE_MISSING,
    PARAMS,
    REQUIRED,
    SPEC,
    out_of_range,
)


def _given(v) -> np.ndarray | bool:
    """Where a column's entries are given (not NaN, None or empty text): True for a scalar that is."""
    a = np.asarray(v, dtype=object) if _is_array(v) else np.array([v], dtype=object)
    return np.array([not (x is None or x == "" or (isinstance(x, float) and math.isnan(x))) for x in a.reshape(-1)])


def _overlap(a, b) -> bool:
    """True when two columns are both given at some point (a scalar given is given at every one)."""
    x, y = _given(a), _given(b)
    return bool(np.any(x & y) if len(x) == len(y) else (x.any() and y.any()))


def _is_array(v) -> bool:
    return hasattr(v, "codes") or (np.ndim(v) > 0 and not isinstance(v, (str, bytes)))


class Columns:
    """Validated columns of ``n`` design points (see the module docstring)."""

    def __init__(self, columns: Mapping, where: str = "columns"):
        if not isinstance(columns, Mapping):
            raise DseError(f"{where}: expected a mapping of parameter names to values or arrays")
        unknown = sorted(set(columns) - set(PARAMS))
        if unknown:
            raise DseError(f"{where}: unknown parameter(s) {', '.join(unknown)}; allowed: {', '.join(PARAMS)}")
        for key in REQUIRED:
            if key not in columns:
                raise DseError(f"{where}: '{key}' is required")
        for figure, sources in DERIVED_FROM.items():      # two spellings of one figure: one would win unsaid
            both = [s for s in sources if s in columns and _overlap(columns[figure], columns[s])] \
                if figure in columns else []
            if both:
                raise DseError(f"{where}: {figure} and {both[0]}: two spellings of one figure: {both[0]} sets "
                               f"{figure} through the preset's template, and {figure} gives it; give one of them")
        self.where = where
        cols = {}
        n = None
        for k, v in columns.items():
            if isinstance(v, (list, tuple)):
                v = np.array(v, dtype=object) if any(isinstance(x, (str, bool)) or not np.isscalar(x) for x in v) \
                    else np.asarray(v)
            if _is_array(v):
                m = len(v)
                if n is not None and m != n:
                    raise DseError(f"{where}: column '{k}' has {m} entries, others have {n}")
                n = m
            cols[k] = v
        self.n = 1 if n is None else n
        self.given = cols
        self._checked: set[str] = set()       # numeric columns whose every entry is known to be allowed
        self._labels: dict[str, tuple] = {}   # codes of the columns of names, worked out once a call
        if self.n == 0:
            raise DseError(f"{where}: no design points (empty columns)")
        for k in cols:
            if SPEC[k].numeric and not SPEC[k].words:   # a number that also takes words (batch): ``batch``
                self.numbers(k)       # range check of every numeric column before any work

    def take(self, order: np.ndarray) -> "Columns":
        """The same columns with the points in ``order`` (positions)."""
        out = Columns.__new__(Columns)
        out.where, out.n = self.where, len(order)
        out.given = {k: (v[order] if _is_array(v) else v) for k, v in self.given.items()}
        out._checked = set(self._checked)    # its points' entries are these points'
        out._labels = {}
        return out

    def has(self, name: str) -> bool:
        """True when the column was given (not left to its default)."""
        return name in self.given

    def raw(self, name: str):
        """The column as given, or its default (None if it has none)."""
        return self.given.get(name, DEFAULTS.get(name))

    def is_fixed(self, name: str) -> bool:
        return not _is_array(self.raw(name))

    def numbers(self, name: str) -> np.ndarray:
        """A numeric column as a float array of length n (NaN where not given); DseError
        naming the column for a non-number, a non-finite or an out-of-range entry. A column
        with one value for every point (left out, or given as one number) is a read-only view
        of that number (``constant``: nothing to write n times, nothing to group by)."""
        v = self.raw(name)
        if v is None:
            return constant(np.nan, self.n)
        try:
            if _non_ascii_text(v):       # float() reads other scripts' digits ('١٢'); the command line does not
                raise ValueError
            a = np.asarray(v, dtype=float)
        except (TypeError, ValueError):
            raise DseError(f"{self.where}: {name}: expected numbers, got {_sample(v)!r}") from None
        if name not in self._checked and name in self.given:   # each given column checked once (defaults are valid)
            bad, allowed = out_of_range(name, a.reshape(-1))      # a fixed value is checked once
            if name in MAY_BE_MISSING:
                bad &= ~np.isnan(a.reshape(-1))
            if bad.any():
                raise DseError(f"{self.where}: {name}: expected {allowed}, "
                               f"got {a.reshape(-1)[np.flatnonzero(bad)[0]].item()!r}")
            self._checked.add(name)
        return constant(float(a), self.n) if a.ndim == 0 else a

    def flags(self, name: str) -> np.ndarray:
        """A boolean column as a bool array of length n; DseError for anything else."""
        v = self.raw(name)
        a = np.asarray(v)
        if a.dtype != bool:
            if a.dtype == object and all(isinstance(x, (bool, np.bool_)) for x in np.ravel(a)):
                a = a.astype(bool)
            else:
                raise DseError(f"{self.where}: {name}: expected true or false, got {_sample(v)!r}")
        return constant(bool(a), self.n) if a.ndim == 0 else a

    def batch(self) -> tuple[np.ndarray, np.ndarray]:
        """(batch per point, NaN where 'max'; True where 'max')."""
        v = self.raw("batch")
        if isinstance(v, str):
            if v != BATCH_MAX:
                raise DseError(f"{self.where}: batch: expected a positive integer or '{BATCH_MAX}', got {v!r}")
            return np.full(self.n, np.nan), np.ones(self.n, dtype=bool)
        if hasattr(v, "codes"):
            v = np.asarray(v, dtype=object)
        a = np.asarray(v)
        if a.dtype.kind in "OUS":
            is_max = np.array([x == BATCH_MAX for x in np.ravel(a)], dtype=bool).reshape(a.shape)
            rest = np.where(is_max, 1, a)
            try:
                nums = np.asarray(rest, dtype=float)
            except (TypeError, ValueError):
                raise DseError(f"{self.where}: batch: expected positive integers or '{BATCH_MAX}', "
                               f"got {_sample(v)!r}") from None
        else:                                          # numbers alone: no point asks for 'max'
            is_max, nums = None, a.astype(float)
        one = nums.ndim == 0                           # one batch for every point: checked once
        nums = nums.reshape(-1)
        bad, allowed = out_of_range("batch", nums)
        if is_max is not None:
            is_max = np.reshape(is_max, -1)
            bad &= ~is_max
        if bad.any():
            raise DseError(f"{self.where}: batch: expected {allowed} or '{BATCH_MAX}', "
                           f"got {nums[np.flatnonzero(bad)[0]].item()!r}")
        if is_max is None:
            return (constant(nums[0], self.n) if one else nums), constant(False, self.n)
        batch = np.where(is_max, np.nan, nums)
        return (constant(batch[0], self.n), constant(is_max[0], self.n)) if one else (batch, is_max)

    def labels(self, name: str) -> tuple[np.ndarray, list]:
        """(code per point, distinct values) of a column of names or objects: encoded once (every
        module that groups or resolves a column of names asks again; the answer is read-only)."""
        got = self._labels.get(name)
        if got is None:
            codes, values = factorize(self.raw(name), self.n)
            if isinstance(codes, np.ndarray) and codes.flags.writeable:
                codes.flags.writeable = False
            got = self._labels[name] = (codes, values)
        return got[0], list(got[1])


def factorize(v, n: int) -> tuple[np.ndarray, list]:
    """(code per point, distinct values) of a scalar, array or Categorical of names or objects
    (objects that are not strings are told apart by identity)."""
    if not _is_array(v):
        return constant(np.int64(0), n), [v]
    if hasattr(v, "codes"):
        codes = np.asarray(v.codes, dtype=np.int64)
        if (codes < 0).any():
            raise DseError("a column of names has missing entries")
        return codes, list(v.categories)
    a = np.asarray(v)
    if a.dtype.kind in "USb":
        uniq, codes = np.unique(a.astype(str), return_inverse=True)
        return codes.astype(np.int64).ravel(), [str(u) for u in uniq]
    if a.dtype == object and isinstance(a[0], str):
        text = _text_codes(a)
        if text is not None:
            return text
    keys, uniq, codes = {}, [], np.empty(len(a), dtype=np.int64)
    for i, x in enumerate(a):
        k = x if isinstance(x, (str, bool, int, float)) else ("id", id(x))
        if k not in keys:
            keys[k] = len(uniq)
            uniq.append(x)
        codes[i] = keys[k]
    return codes, uniq


def _text_codes(a: np.ndarray) -> tuple[np.ndarray, list] | None:
    """``factorize`` of an object array of text: (codes in the sorted order of the distinct names,
    those names), by hashing (no sort of the points); None when some entry is not text."""
    items = a.ravel().tolist()
    if not all(type(x) is str for x in items):         # a mix of names and objects (dicts: unhashable)
        return None
    first = dict.fromkeys(items)                       # the distinct entries, by hash
    uniq = sorted(first)
    if len(uniq) == 1:
        return constant(np.int64(0), len(items)), uniq
    at = {x: i for i, x in enumerate(uniq)}
    return np.fromiter(map(at.__getitem__, items), dtype=np.int64, count=len(items)), uniq


def group(keys: list, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Group points by the combination of ``keys`` (integer code arrays or scalars):
    (group of each point, point order sorted by group, start of each group in that order).
    A stable sort of small integers is a radix sort in numpy: O(n)."""
    inv = group_codes(keys, n)
    if inv is None:                                     # every key the same for every point: one group
        return constant(np.int64(0), n), np.arange(n), np.array([0, n])
    return groups_of(inv)


def group_codes(keys: list, n: int) -> np.ndarray | None:
    """Each point's group (0 .. k-1) by the combination of ``keys`` (``group``), without sorting
    the points by it; None when every key is the same for every point (one group)."""
    codes = None
    for k in keys:
        if np.ndim(k) == 0 or _constant(k):
            continue
        k = _small_codes(np.asarray(k))
        if codes is None:
            codes = np.zeros(n, dtype=np.int64)
        m = int(k.max()) + 1 if len(k) else 1
        if m > 1:
            codes = codes * m + k
            if codes.max(initial=0) > 2**52:          # keep the mixed radix small: renumber
                codes = _dense_codes(codes)
    return None if codes is None else _dense_codes(codes)


def groups_of(inv: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``group``'s answer for the groups ``inv`` (each point's group, 0 .. k-1, every one used):
    (``inv``, point order sorted by group, start of each group in that order)."""
    counts = np.bincount(inv)
    if len(counts) == 1:
        order = np.arange(len(inv))
    else:
        order = np.argsort(inv.astype(np.uint16) if len(counts) <= 2**16 else inv, kind="stable")
    starts = np.concatenate(([0], np.cumsum(counts)))
    return inv, order, starts


def constant(value, n: int) -> np.ndarray:
    """A read-only array of ``n`` entries, every one ``value`` (one element in memory)."""
    a = np.asarray(value)
    if a.ndim or a.dtype.hasobject:
        return np.broadcast_to(a, (n,))
    out = np.ndarray((n,), a.dtype, a, 0, (0,))    # the view broadcast_to makes, a quarter of its cost
    out.flags.writeable = False
    return out


def is_constant(a) -> bool:
    """True when ``a`` is a ``constant`` view (one element in memory for every point)."""
    return isinstance(a, np.ndarray) and a.ndim == 1 and len(a) > 0 and a.strides[0] == 0


def pointwise(f, *args):
    """``f(*args)`` of per-point arrays (and numbers): worked out once, as a ``constant`` view
    (one per result where ``f`` returns a tuple), when every array among ``args`` is one."""
    arrays = [a for a in args if np.ndim(a)]
    if arrays and all(is_constant(a) for a in arrays):
        out, n = f(*(a[0] if np.ndim(a) else a for a in args)), len(arrays[0])
        return tuple(constant(x, n) for x in out) if isinstance(out, tuple) else constant(out, n)
    return f(*args)


def anywhere(a) -> bool:
    """True when some point's entry of ``a`` is true (one look for a ``constant`` view)."""
    return bool(a[0]) if is_constant(a) else bool(np.any(a))


def per_code(values, codes) -> np.ndarray:
    """``values[codes]``: each point's entry of ``values`` (one per distinct name or group), a
    ``constant`` view when ``codes`` is one (every point the same: nothing gathered)."""
    values = np.asarray(values)
    if is_constant(codes):
        return constant(values[codes[0]], len(codes))
    return values[codes]


def _constant(a) -> bool:
    """True when the numeric array ``a`` holds one value (or only NaN) at every point: a key that
    splits no group: at once for a ``constant`` view, else two reductions, no copy."""
    a = np.asarray(a)
    if a.dtype.kind not in "iufb" or len(a) == 0:
        return False
    if is_constant(a):
        return True
    lo, hi = a.min(), a.max()
    if lo == hi:
        return True
    return a.dtype.kind == "f" and bool(np.isnan(lo)) and bool(np.isnan(a).all())


def _small_codes(a: np.ndarray) -> np.ndarray:
    """``a`` as non-negative integer codes, equal where its values are equal: itself when its
    values are already small non-negative integers (whole floats included: a batch), else
    ``_dense_codes``."""
    if a.dtype.kind in "iub" or (a.dtype.kind == "f" and len(a)):
        with np.errstate(invalid="ignore"):
            whole = a.astype(np.int64) if a.dtype.kind == "f" else a
            lo, hi = (int(whole.min()), int(whole.max())) if len(a) else (0, 0)
            if lo >= 0 and hi <= max(4 * len(a), 1 << 16) and (a.dtype.kind != "f" or (whole == a).all()):
                return whole.astype(np.int64, copy=False)
    return _dense_codes(a)


def _dense_codes(a: np.ndarray) -> np.ndarray:
    """Codes 0..k-1 of the distinct values of ``a``, in increasing order of value for small
    non-negative integers (a count of each value), else by hashing for large arrays and
    sorting for small."""
    if a.dtype.kind in "iu" and len(a) and 0 <= a.min() and a.max() <= max(4 * len(a), 1 << 16):
        present = np.bincount(a) > 0
        return (np.cumsum(present) - 1)[a]
    if len(a) > 4096:
        import pandas as pd  # large tables come from sweeps, which have pandas loaded already
        return np.asarray(pd.factorize(a)[0], dtype=np.int64)
    return np.unique(a, return_inverse=True)[1].astype(np.int64).ravel()


def _non_ascii_text(v) -> bool:
    """True when ``v`` is text, or an array of text, with a character that is not ASCII."""
    if isinstance(v, str):
        return not v.isascii()
    a = v if isinstance(v, np.ndarray) else None
    if a is not None and a.dtype.kind in "US" and a.size:
        return not bool(np.all(np.char.isascii(a))) if hasattr(np.char, "isascii") else \
            not all(str(x).isascii() for x in a.ravel())
    return False


def _sample(v):
    """One entry of ``v`` for an error message."""
    if _is_array(v):
        a = np.asarray(v, dtype=object)
        return a[0] if len(a) else v
    return v


def finite_or_nan(x) -> float:
    """``x`` as a float, NaN for None."""
    return math.nan if x is None else float(x)
