"""Pareto mask, ranks and hypervolume against brute-force definitions written here."""
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from basis.errors import DseError
from dse.explore.pareto import _mask_blockwise, hypervolume, normalize, pareto_mask, pareto_ranks

SIGN = {"min": 1.0, "max": -1.0}


# ------------------------------------------------------------ brute force

def to_min(values, senses):
    """Minimization copy of ``values`` (independent of dse.explore.pareto.normalize)."""
    return np.asarray(values, dtype=float) * np.array([SIGN[s] for s in senses])


def dominance_matrix(v):
    """Bool [N, N]: entry [j, i] says minimization row j dominates row i (NaN rows never do)."""
    with np.errstate(invalid="ignore"):
        d = np.all(v[:, None] <= v[None], axis=2) & np.any(v[:, None] < v[None], axis=2)
    return d & ~np.isnan(v).any(axis=1)[:, None]


def brute_mask(values, senses):
    """Points no other point dominates; NaN rows are never on the front."""
    v = to_min(values, senses)
    return ~dominance_matrix(v).any(axis=0) & ~np.isnan(v).any(axis=1)


def brute_hypervolume(values, senses, reference):
    """Exact union volume of the boxes [p, ref] by cells of the coordinate grid.

    The distinct coordinates (and the reference) cut space into cells; a cell lies
    inside the union iff some point is <= its lower corner.
    """
    v = to_min(values, senses)
    ref = to_min([reference], senses)[0]
    v = v[~np.isnan(v).any(axis=1)]
    v = v[np.all(v < ref, axis=1)]
    if len(v) == 0:
        return 0.0
    axes = [np.unique(np.append(v[:, j], ref[j])) for j in range(v.shape[1])]
    total = 0.0
    for cell in itertools.product(*(range(len(a) - 1) for a in axes)):
        lower = np.array([axes[j][c] for j, c in enumerate(cell)])
        if np.any(np.all(v <= lower, axis=1)):
            total += np.prod([axes[j][c + 1] - axes[j][c] for j, c in enumerate(cell)])
    return float(total)


# ------------------------------------------------------------- strategies

@st.composite
def point_sets(draw, m, nan=True, max_points=30, levels=(0, 1, 2, 3)):
    """(values [N, m], senses): small-integer values (many ties), duplicated rows, some NaN."""
    n = draw(st.integers(0, max_points))
    elements = st.sampled_from(levels)
    if nan:
        elements = st.one_of(elements, st.just(float("nan"))) if draw(st.booleans()) else elements
    rows = draw(st.lists(st.lists(elements, min_size=m, max_size=m), min_size=n, max_size=n))
    if rows:
        rows += [rows[i] for i in draw(st.lists(st.integers(0, len(rows) - 1), max_size=10))]
    senses = draw(st.lists(st.sampled_from(["min", "max"]), min_size=m, max_size=m))
    values = np.array(rows, dtype=float).reshape(len(rows), m)
    return values, senses


# -------------------------------------------------------------- the mask

@pytest.mark.parametrize("m", [1, 2, 3, 5])
@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_pareto_mask_matches_brute_force(m, data):
    values, senses = data.draw(point_sets(m))
    mask = pareto_mask(values, senses)
    assert mask.dtype == bool and mask.shape == (len(values),)
    np.testing.assert_array_equal(mask, brute_mask(values, senses))


@pytest.mark.parametrize("m", [2, 3, 4])
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_blockwise_path_matches_brute_force(m, data):
    values, senses = data.draw(point_sets(m, nan=False))
    v = to_min(values, senses)
    np.testing.assert_array_equal(_mask_blockwise(v, block=4) if len(v) else np.zeros(0, bool),
                                  brute_mask(values, senses))


@pytest.mark.parametrize("m", [2, 3, 4, 6])
@pytest.mark.parametrize("kind", ["uniform", "grid", "anticorrelated"])
def test_pareto_mask_large_sets_match_vectorized_brute_force(m, kind):
    rng = np.random.default_rng(m)
    n = 1500
    if kind == "uniform":
        v = rng.random((n, m))
    elif kind == "grid":
        v = rng.integers(0, 4, size=(n, m)).astype(float)
    else:  # near a simplex: large fronts
        v = rng.random((n, m))
        v /= v.sum(axis=1, keepdims=True)
        v += rng.normal(scale=0.01, size=v.shape)
    senses = ["min", "max"] * (m // 2) + ["min"] * (m % 2)
    w = to_min(v, senses)
    le = np.all(w[None] <= w[:, None], axis=2)
    eq = np.all(w[None] == w[:, None], axis=2)
    expected = ~np.any(le & ~eq, axis=1)
    np.testing.assert_array_equal(pareto_mask(v, senses), expected)
    np.testing.assert_array_equal(_mask_blockwise(w, block=64), expected)


def test_pareto_mask_duplicates_ties_nan_and_infinities():
    v = np.array([[1, 2], [1, 2], [2, 1], [1, 3], [2, 2], [np.nan, 0], [0, np.nan], [3, 0], [3, 0]])
    assert pareto_mask(v, ["min", "min"]).tolist() == [1, 1, 1, 0, 0, 0, 0, 1, 1]
    assert pareto_mask(v, ["max", "max"]).tolist() == [0, 0, 0, 1, 1, 0, 0, 1, 1]
    inf = np.inf
    w = np.array([[-inf, inf], [-inf, inf], [-inf, 5], [0, -inf], [1, -inf]])
    assert pareto_mask(w, ["min", "min"]).tolist() == [0, 0, 1, 1, 0]
    assert pareto_mask(np.array([[2.0], [1.0], [1.0], [np.nan]]), ["min"]).tolist() == [0, 1, 1, 0]
    assert pareto_mask(np.empty((0, 3)), ["min"] * 3).shape == (0,)
    assert not pareto_mask(np.full((3, 3), np.nan), ["min"] * 3).any()


# ------------------------------------------------------------------ ranks

@pytest.mark.parametrize("m", [2, 3, 5])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_pareto_ranks_are_the_peeled_fronts(m, data):
    values, senses = data.draw(point_sets(m, max_points=25))
    ranks = pareto_ranks(values, senses)
    assert ranks.shape == (len(values),) and ranks.dtype.kind == "i"
    v = to_min(values, senses)
    nan_rows = np.isnan(v).any(axis=1)
    assert np.all(ranks[nan_rows] == -1) and np.all(ranks[~nan_rows] >= 0)
    np.testing.assert_array_equal(ranks == 0, brute_mask(values, senses))
    dom = dominance_matrix(v)
    ok = np.flatnonzero(~nan_rows)
    for i in ok:
        r = ranks[i]
        if r > 0:  # some point of the previous front dominates it
            assert np.any(dom[ok, i] & (ranks[ok] == r - 1))
        # nothing of the same or a later front dominates it
        assert not np.any(dom[ok, i] & (ranks[ok] >= r))
    if len(ok):
        assert set(ranks[ok]) == set(range(ranks.max() + 1))  # no empty front


def test_pareto_ranks_chain_and_large_2d_against_peeling():
    chain = np.arange(6.0)[:, None].repeat(2, axis=1)
    assert pareto_ranks(chain, ["min", "min"]).tolist() == [0, 1, 2, 3, 4, 5]
    assert pareto_ranks(chain, ["max", "max"]).tolist() == [5, 4, 3, 2, 1, 0]
    rng = np.random.default_rng(3)
    v = rng.integers(0, 30, size=(2000, 2)).astype(float)
    ranks = pareto_ranks(v, ["min", "max"])
    left, r = np.arange(len(v)), 0
    while len(left):  # peel fronts with the mask
        front = pareto_mask(v[left], ["min", "max"])
        assert np.all(ranks[left[front]] == r) and np.all(ranks[left[~front]] > r)
        left, r = left[~front], r + 1


# ------------------------------------------------------------ hypervolume

def test_hypervolume_known_values():
    assert hypervolume([[1, 1]], ["min", "min"], [2, 2]) == 1.0
    assert hypervolume([[1, 2], [2, 1]], ["min", "min"], [3, 3]) == 3.0
    assert hypervolume([[3, 5]], ["max", "max"], [1, 2]) == 6.0
    assert hypervolume([[1, 1, 1]], ["min"] * 3, [2, 3, 4]) == 6.0
    # points not strictly better than the reference, and NaN rows, add nothing
    assert hypervolume([[1, 2], [2, 1], [3, 0], [0, np.nan]], ["min", "min"], [3, 3]) == 3.0
    assert hypervolume(np.empty((0, 3)), ["min"] * 3, [0, 0, 0]) == 0.0
    assert hypervolume([[-np.inf, 0]], ["min", "min"], [1, 1]) == np.inf
    # the positive octant of the unit ball, sampled densely on its surface
    x = np.abs(np.random.default_rng(0).normal(size=(20000, 3)))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    assert hypervolume(x, ["max"] * 3, [0, 0, 0]) == pytest.approx(np.pi / 6, rel=0.02)


@pytest.mark.parametrize("m", [2, 3])
@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_hypervolume_matches_cell_counting_on_integers(m, data):
    values, senses = data.draw(point_sets(m, max_points=12, levels=tuple(range(-3, 4))))
    reference = data.draw(st.lists(st.integers(-3, 4), min_size=m, max_size=m))
    # integer coordinates: the cell union is exact, and so must the sweep be
    assert hypervolume(values, senses, reference) == brute_hypervolume(values, senses, reference)


@pytest.mark.parametrize("m", [2, 3])
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_hypervolume_matches_cell_counting_on_floats(m, data):
    n = data.draw(st.integers(1, 15))
    coords = st.floats(0, 1, allow_nan=False, allow_subnormal=False)
    values = np.array(data.draw(st.lists(st.lists(coords, min_size=m, max_size=m), min_size=n, max_size=n)))
    senses = data.draw(st.lists(st.sampled_from(["min", "max"]), min_size=m, max_size=m))
    reference = [1.0 if s == "min" else 0.0 for s in senses]
    assert hypervolume(values, senses, reference) == pytest.approx(
        brute_hypervolume(values, senses, reference), rel=1e-9, abs=1e-12)


# ----------------------------------------------------------------- errors

def test_normalize_negates_maximized_objectives():
    v = np.array([[1.0, 2.0, 3.0]])
    np.testing.assert_array_equal(normalize(v, ["min", "max", "min"]), [[1.0, -2.0, 3.0]])
    assert normalize(v, ("max", "max", "max")) is not v


@pytest.mark.parametrize("senses", [["min", "minimize"], ["min"], ["min", "min", "min"], "mm", ["MIN", "max"]])
def test_bad_senses_raise(senses):
    for f in (normalize, pareto_mask, pareto_ranks):
        with pytest.raises(DseError):
            f(np.zeros((3, 2)), senses)
    with pytest.raises(DseError):
        hypervolume(np.zeros((3, 2)), senses, [1, 1])


def test_bad_shapes_and_hypervolume_dimensions_raise():
    with pytest.raises(DseError):
        pareto_mask(np.zeros(3), ["min"])
    with pytest.raises(DseError):
        pareto_mask(np.zeros((3, 0)), [])
    with pytest.raises(DseError, match="2 or 3 objectives"):
        hypervolume(np.zeros((3, 4)), ["min"] * 4, [1] * 4)
    with pytest.raises(DseError):
        hypervolume(np.zeros((3, 1)), ["min"], [1])
    with pytest.raises(DseError):
        hypervolume(np.zeros((3, 2)), ["min", "min"], [1, 1, 1])
    with pytest.raises(DseError):
        hypervolume(np.zeros((3, 2)), ["min", "min"], [1, np.inf])


# ---------------------------------------------------------------- points with no value (NaN)

def test_unvalued_counts_and_the_note_that_says_why_a_front_is_smaller():
    from dse.explore.pareto import front_note, unvalued_counts
    v = np.array([[1.0, np.nan], [2.0, np.nan], [np.nan, 3.0], [4.0, 5.0]])
    assert unvalued_counts(v, ["a", "b"]) == {"a": 1, "b": 2}
    assert unvalued_counts(v[3:], ["a", "b"]) == {} and unvalued_counts(np.empty((0, 0)), []) == {}
    assert front_note({}, 4, 1) is None
    note = front_note(unvalued_counts(v, ["a", "b"]), 4, int(pareto_mask(v, ["min", "min"]).sum()))
    assert "\n" not in note and "objective a for 1 of 4, b for 2 of 4 feasible designs" in note
    assert "empty" not in note
    every = front_note(unvalued_counts(np.full((3, 1), np.nan), ["tpot_s"]), 3, 0)
    assert "tpot_s for 3 of 3" in every and "(the front is empty)" in every
