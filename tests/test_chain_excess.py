"""The decode iterations that follow one's own prompt in an open loop, followed through the iteration
chain (``dse.core.serving.chain_excess``), against matrix powers and the chain's infinite sum
computed here independently: the first K excesses are the chain's own, start P^i tau - pi tau, and
the geometric tail after them sums to the rest of the total."""
from __future__ import annotations

import numpy as np
import pytest

from dse.core.serving import _decode_excess, _Mixing, chain_excess


def _chains(a: int, j: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(start, transitions, iteration seconds, stationary distribution) of ``a`` lazy random chains
    of ``j`` states; the stationary distribution from the left eigenvector of eigenvalue 1."""
    rng = np.random.default_rng(seed)
    q = rng.random((a, j, j))
    trans = 0.6 * np.eye(j) + 0.4 * q / q.sum(axis=2, keepdims=True)
    start = rng.random((a, j))
    start /= start.sum(axis=1, keepdims=True)
    tau = rng.uniform(0.005, 0.4, (a, j))
    pi = np.empty((a, j))
    for r in range(a):
        w, v = np.linalg.eig(trans[r].T)
        p = np.real(v[:, np.argmin(np.abs(w - 1.0))])
        pi[r] = p / p.sum()
    return start, trans, tau, pi


def test_the_first_steps_are_the_chains_own():
    start, trans, tau, pi = _chains(4, 6, seed=1)
    summed, after, _ = chain_excess(start, trans, tau, pi, 9)
    t1 = (pi * tau).sum(axis=1)
    for r in range(4):
        each = [start[r] @ np.linalg.matrix_power(trans[r], i) @ tau[r] - t1[r] for i in range(10)]
        np.testing.assert_allclose(summed[r], np.concatenate([[0.0], np.cumsum(each[:9])]), rtol=1e-10, atol=1e-15)
        assert after[r] == pytest.approx(each[9], rel=1e-10, abs=1e-15)


def test_the_tail_sums_to_the_rest_of_the_chains_excess():
    start, trans, tau, pi = _chains(16, 5, seed=2)
    k = 6
    summed, after, relax = chain_excess(start, trans, tau, pi, k)
    t1 = (pi * tau).sum(axis=1)
    state, infinite = start.copy(), np.zeros(16)
    for _ in range(4000):                         # lazy chains of 5 states: settled long before
        infinite += (state * tau).sum(axis=1) - t1
        state = np.einsum("aj,ajk->ak", state, trans)
    geometric = relax > 0
    assert geometric.sum() >= 4
    np.testing.assert_allclose((summed[:, -1] + after / (1.0 - relax))[geometric], infinite[geometric],
                               rtol=1e-8, atol=1e-12)


def test_a_chain_that_starts_stationary_has_no_excess():
    _, trans, tau, pi = _chains(3, 7, seed=3)
    summed, after, _ = chain_excess(pi, trans, tau, pi, 12)
    assert np.abs(summed).max() < 1e-12 and np.abs(after).max() < 1e-12


def test_a_requests_decode_reads_the_sums_then_the_tail():
    """``_decode_excess`` at s steps: the chain's sums up to K = 3, linear between whole steps, then
    the geometric tail e r^i (here e = 1/8 and 1/4, r = 1/2: 1/4 and 1/2 in all); NaN steps give NaN."""
    m = _Mixing(*([np.zeros(2)] * 16), excess=np.array([[0, 1, 1.5, 1.75], [0, 2, 3, 3.5]]),
                after=np.array([0.125, 0.25]), relax=np.array([0.5, 0.5]))
    got = _decode_excess(m, np.array([[2.5, 10.0, np.nan], [3.0, 3.5, 1e6]]))
    np.testing.assert_allclose(got[0, :2], [1.5 + 0.5 * 0.25, 1.75 + 0.25 * (1 - 0.5 ** 7)], rtol=1e-15)
    assert np.isnan(got[0, 2])
    np.testing.assert_allclose(got[1], [3.5, 3.5 + 0.5 * 0.25, 3.5 + 0.5], rtol=1e-15)
