"""The steady-state serving model against the discrete-event simulator at one design point: the
relative errors the agreement tests bound (tests/test_serving*.py, test_bursty_arrivals.py)."""
from __future__ import annotations

from dse.system.analysis import simulate_point
from dse.system.evaluator import evaluate


def model_vs_simulator(point: dict, requests: int) -> tuple[float, float, float]:
    """(throughput, mean TTFT, mean TPOT) of the model over the simulator's, minus 1, at ``point``
    (the simulator run on ``requests`` requests)."""
    ev, sim = evaluate(point), simulate_point(point, requests)
    return tuple(ev[a][0] / sim[b] - 1 for a, b in (("requests_per_s", "requests_per_s"),
                                                    ("ttft_s", "ttft_mean_s"), ("tpot_s", "tpot_mean_s")))


def load_ladder(cols: dict, low: tuple = (1, 8)) -> list[tuple[str, float]]:
    """Loads from light to past saturation: closed loops at ``low`` requests, at the running cap and
    twice it, open loops at 20 % and 50 % of the capacity (both found by a closed loop at 10^5)."""
    cap = evaluate({**cols, "concurrency": 100000})
    x_max, b_max = cap["requests_per_s"][0], cap["running_batch"][0]
    return ([("concurrency", c) for c in low] + [("concurrency", int(b_max)), ("concurrency", int(2 * b_max)),
                                                  ("request_rate", 0.2 * x_max), ("request_rate", 0.5 * x_max)])


def requests_for(key: str, v: float) -> int:
    """Requests the simulator runs at a load: 1,500 for an open loop, 12 per request in flight (at
    least 300) for a closed one."""
    return 1500 if key == "request_rate" else max(300, int(12 * v))
