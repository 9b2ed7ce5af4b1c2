"""A served point's goodput does not depend on the groups priced beside it: the evaluator searches
every group's goodput together (``dse.system.served.deferring_goodput``: groups of equal request
lengths stacked, the groups of one Efficiency and operator layout priced by one roofline call), and
each point of a table of many groups (hardware, devices, formats, SLOs and loads varying) equals the
same point evaluated alone, every metric to 1e-9 relative (feasibility and reason exactly). The
expectation is independent of the stacking: a point alone is a group of one."""
import numpy as np

from dse.system import reasons as R
from dse.system.evaluator import evaluate
from tests.test_serving_batched import _same

#: 2 x 2 x 2 x 3 = 24 points, each its own group (hardware, devices, formats); two percentiles
SPACE = {"hardware": ["h100-sxm", "mi300x"], "devices": [1, 2], "weights": ["fp8", "fp16"],
         "concurrency": [4, 32, 128]}


def _table() -> dict:
    grid = np.array(np.meshgrid(*[np.arange(len(v)) for v in SPACE.values()], indexing="ij")).reshape(len(SPACE), -1)
    cols = {k: np.asarray(v)[grid[i]] for i, (k, v) in enumerate(SPACE.items())}
    n = grid.shape[1]
    rng = np.random.default_rng(5)
    return {**cols, "model": "llama-3.1-8b", "activations": "fp8", "kv": "fp8", "prompt_len": 1024, "gen_len": 256,
            "slo_ttft": rng.uniform(0.1, 1.0, n), "slo_tpot": rng.uniform(0.01, 0.05, n),
            "slo_percentile": rng.choice([90.0, 99.0], n), "target_rate": 10.0}


def test_goodput_of_many_groups_equals_each_point_alone():
    cols = _table()
    table = evaluate(cols)
    assert (table["goodput"] > 0).sum() >= 20 and (table["goodput"] == 0).any()   # searched; one misses its SLOs
    for i in np.random.default_rng(3).choice(len(table["goodput"]), 4, replace=False):
        alone = evaluate({k: (v[i:i + 1] if isinstance(v, np.ndarray) else v) for k, v in cols.items()})
        assert bool(alone["feasible"][0]) == bool(table["feasible"][i])
        assert int(alone["reason"][0]) == int(table["reason"][i])
        for k in ("goodput", "replicas", "service_devices", "ttft_p99_s", "tpot_p90_s", "requests_per_s"):
            assert _same(alone[k][:1], table[k][i:i + 1]), (int(i), k, alone[k][0], table[k][i])


def test_a_group_over_its_power_cap_keeps_its_capped_goodput():
    # the first point draws more than its 300 W cap: it is priced again at a lower clock, and that
    # pricing's goodput stands (searched at once), the others' searched together after the loop
    cols = {"hardware": np.array(["h100-sxm", "h100-sxm", "mi300x", "h200"]), "devices": np.array([1, 2, 1, 2]),
            "model": "llama-3.1-8b", "weights": "fp8", "activations": "fp8", "kv": "fp8", "prompt_len": 1024,
            "gen_len": 256, "slo_ttft": 0.3, "slo_tpot": 0.03, "target_rate": 20.0,
            "power_cap_w": np.array([300.0, 700.0, 350.0, 400.0])}
    table = evaluate(cols)
    assert table["clock_fraction"][0] < 1.0 and (table["clock_fraction"][1:] == 1.0).all()
    for i in range(4):
        alone = evaluate({k: (v[i:i + 1] if isinstance(v, np.ndarray) else v) for k, v in cols.items()})
        for k in ("goodput", "replicas", "clock_fraction", "ttft_p99_s"):
            assert _same(alone[k][:1], table[k][i:i + 1]), (i, k, alone[k][0], table[k][i])


def test_a_point_without_a_link_keeps_no_goodput():
    # two GH200 without a scale-up link in the presets are priced on a stand-in link and every timed
    # figure dropped (reason interconnect): its goodput too, while the H100 pair beside it has one
    cols = {"hardware": np.array(["gh200", "h100-sxm"]), "devices": 2, "model": "llama-3.1-8b", "weights": "fp8",
            "activations": "fp8", "kv": "fp8", "prompt_len": 1024, "gen_len": 256, "slo_ttft": 0.3,
            "slo_tpot": 0.03, "target_rate": 20.0}
    table = evaluate(cols)
    assert int(table["reason"][0]) == R.CODE["interconnect"]
    assert np.isnan(table["goodput"][0]) and np.isnan(table["replicas"][0]) and np.isnan(table["ttft_p99_s"][0])
    assert table["goodput"][1] > 0 and table["replicas"][1] >= 1
