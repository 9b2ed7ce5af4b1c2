"""Grouping design points by their keys (``dse.system.columns.group``): points share a group exactly
when every key is equal for them, groups are contiguous in the returned order, and points keep their
relative order within a group. Checked against grouping the key tuples with Python dictionaries."""
import numpy as np
import pytest

from dse.system.columns import group

RNG = np.random.default_rng(5)
N = 3000


def _by_tuples(keys, n):
    """Groups of points by their key tuples, each a list of positions in increasing order."""
    cols = [np.broadcast_to(np.asarray(k), (n,)) for k in keys]
    groups = {}
    for i in range(n):
        groups.setdefault(tuple("NaN" if c[i] != c[i] else c[i].item() for c in cols), []).append(i)
    return sorted(groups.values())


def _check(keys, n):
    inv, order, starts = group(keys, n)
    got = sorted(order[starts[g]:starts[g + 1]].tolist() for g in range(len(starts) - 1))
    assert got == _by_tuples(keys, n)
    for g in range(len(starts) - 1):                        # every member of a group carries its number
        assert (inv[order[starts[g]:starts[g + 1]]] == g).all()
    assert sorted(order.tolist()) == list(range(n))


KEYS = {
    "one varying key among constants": lambda: [RNG.integers(0, 9, N), np.full(N, 2048.0), np.zeros(N, bool), 3],
    "every key constant": lambda: [np.full(N, 7), np.full(N, 1.5), np.ones(N, bool), "fp8"],
    "a column of NaN": lambda: [RNG.integers(0, 3, N), np.full(N, np.nan)],
    "floats, whole and not": lambda: [RNG.choice([1.0, 2.0, 64.0], N), RNG.choice([0.5, 1e12, 3.25], N)],
    "large codes renumbered": lambda: [RNG.integers(0, 2**40, N) // 2**38 * 2**38, RNG.integers(0, 5, N),
                                       RNG.choice([1e15, 2e15], N)],
    "scalars only": lambda: [1, 2.0, "x"],
}


@pytest.mark.parametrize("case", list(KEYS))
def test_points_share_a_group_exactly_when_their_keys_are_equal(case):
    _check(KEYS[case](), N)


def test_a_single_point_is_one_group():
    inv, order, starts = group([np.array([3.0]), np.array([np.nan])], 1)
    assert inv.tolist() == [0] and order.tolist() == [0] and starts.tolist() == [0, 1]
