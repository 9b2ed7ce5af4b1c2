"""Hand-run benchmark: served design points per second through the evaluator's serving model.

Llama-3.1-8B FP8 on an H100 SXM template whose HBM bandwidth and FP8 peak vary per point,
1,024-token prompts and 256-token answers: a closed loop (concurrency 1 to 512) and an open
loop (Poisson, 0.5 to 15 requests/s; past a design's capacity a point is saturated), each with
fixed and lognormal lengths; goodput under a TTFT and a TPOT SLO; disaggregated pools. Per point: the iteration model priced by the roofline, the steady state, the
percentiles and, for goodput, the bisection over the request rate.

    python benchmarks/bench_serving.py [points]
"""
import sys
import time

import numpy as np

from dse.system.evaluator import evaluate

CASES = {
    "closed, fixed lengths": {"concurrency": "closed"},
    "closed, lognormal lengths": {"concurrency": "closed", "lengths": "lognormal:sigma=0.8"},
    "open, fixed lengths": {"request_rate": "open"},
    "open, lognormal lengths": {"request_rate": "open", "lengths": "lognormal:sigma=0.8"},
    "goodput (TTFT 200 ms, TPOT 30 ms at p90)": {"concurrency": "closed", "slo_ttft": 0.2, "slo_tpot": 0.03},
    "disaggregated 1:1, open": {"request_rate": "open", "disaggregate": "1:1"},
}


def main(points: int = 2_000, repeats: int = 3):
    rng = np.random.default_rng(0)
    hw = dict(memory_bandwidth=rng.uniform(2e12, 8e12, points), peak_fp8=rng.uniform(1e15, 4e15, points))
    load = {"closed": rng.integers(1, 513, points), "open": rng.uniform(0.5, 15.0, points)}
    fixed = dict(hardware="h100-sxm", model="llama-3.1-8b", weights="fp8", activations="fp8", kv="fp8",
                 prompt_len=1024, gen_len=256)
    for name, case in CASES.items():
        cols = {**fixed, **hw, **{k: (load[v] if isinstance(v, str) and v in load else v) for k, v in case.items()}}
        evaluate({k: (v[:10] if isinstance(v, np.ndarray) else v) for k, v in cols.items()})   # warm the caches
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            out = evaluate(cols)
            times.append(time.perf_counter() - t)
        median = sorted(times)[len(times) // 2]
        print(f"{name:45s} {points:,} points: median {median:.2f} s = {points / median:,.0f} served points/s "
              f"({int(out['feasible'].sum()):,} feasible)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2_000)
