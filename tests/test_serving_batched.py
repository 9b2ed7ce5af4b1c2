"""A served point's figures do not depend on the points priced beside it: the steady state, the
chain of iterations, the percentiles and the goodput search are worked out for many points at
once (batched arrays, points grouped by their chain's number of states, sliced in bounded
memory), and each point priced inside a table of 1,000 others equals the same point priced
alone, every metric to 1e-9 relative (feasibility, reason and saturation exactly). The
expectation is independent of how the points are batched: a point alone is a table of one."""
import numpy as np
import pytest

from dse.system.evaluator import evaluate

N = 1_000
PICKED = 4
BASE = {"model": "llama-3.1-8b", "hardware": "h100-sxm", "weights": "fp8", "activations": "fp8", "kv": "fp8",
        "prompt_len": 1024, "gen_len": 256}


def _table(seed: int, case: str) -> dict:
    """N served points whose hardware, load and engine vary per point (seeded)."""
    rng = np.random.default_rng(seed)
    cols = {**BASE, "memory_bandwidth": rng.uniform(2e12, 8e12, N), "peak_fp8": rng.uniform(1e15, 4e15, N),
            "prefill_chunk": rng.choice([0, 1024, 2048, 8192], N)}
    if case == "open":
        cols.update(request_rate=rng.uniform(0.5, 40.0, N), lengths="lognormal:sigma=0.8")
    elif case == "closed":
        cols.update(concurrency=rng.integers(1, 513, N), lengths="lognormal:sigma=0.8")
    else:                                  # goodput under SLOs, a closed loop
        cols.update(concurrency=rng.integers(1, 513, N), slo_ttft=rng.uniform(0.1, 1.0, N),
                    slo_tpot=rng.uniform(0.02, 0.08, N))
    return cols


def _same(a, b) -> bool:
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if not np.array_equal(np.isnan(a), np.isnan(b)) or not np.array_equal(np.isinf(a), np.isinf(b)):
        return False
    f = np.isfinite(a)
    return bool(np.all(np.abs(a[f] - b[f]) <= 1e-9 * np.maximum(np.abs(a[f]), 1e-300)))


@pytest.mark.slow
@pytest.mark.parametrize("case", ["open", "closed", "goodput"])
def test_a_point_in_a_table_of_a_thousand_equals_the_point_alone(case):
    cols = _table(7, case)
    table = evaluate(cols)
    picked = np.random.default_rng(11).choice(N, PICKED, replace=False)
    for i in picked:
        alone = evaluate({k: (v[i:i + 1] if isinstance(v, np.ndarray) else v) for k, v in cols.items()})
        assert bool(alone["feasible"][0]) == bool(table["feasible"][i])
        assert int(alone["reason"][0]) == int(table["reason"][i])
        for k in table.keys():
            if k in ("feasible", "reason") or np.asarray(table[k]).dtype.kind not in "fb":
                continue
            assert _same(alone[k][:1], table[k][i:i + 1]), (case, int(i), k, alone[k][0], table[k][i])
