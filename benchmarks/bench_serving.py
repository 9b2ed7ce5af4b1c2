"""Hand-run benchmark: served design points per second through the evaluator's serving model.

Llama-3.1-8B FP8 on an H100 SXM template whose HBM bandwidth and FP8 peak vary per point,
1,024-token prompts and 256-token answers: a closed loop (concurrency 1 to 512) and an open
loop (Poisson, 0.5 to 15 requests/s; past a design's capacity a point is saturated), each with
fixed and lognormal lengths; goodput under a TTFT and a TPOT SLO; disaggregated pools. Per point: the iteration model priced by the roofline, the steady state, the
percentiles and, for goodput, the bisection over the request rate.

    python benchmarks/bench_serving.py [points] [--memory [--slice N]]

``--memory``: one ``evaluate`` of the open loop with lognormal lengths (the case whose
steady state holds the most per point) and nothing else, its wall time and the process's
peak resident memory (``getrusage``; run it under ``/usr/bin/time -v`` for the kernel's
figure of the whole process). The evaluator prices served points in slices of
``dse.system.served.SERVED_SLICE``, so the peak should not grow with the points; ``--slice N``
prices them N at a time instead (0: the whole group in one call, as before slicing).
"""
import argparse
import resource
import time

import numpy as np

from dse.system import served
from dse.system.evaluator import evaluate

CASES = {
    "closed, fixed lengths": {"concurrency": "closed"},
    "closed, lognormal lengths": {"concurrency": "closed", "lengths": "lognormal:sigma=0.8"},
    "open, fixed lengths": {"request_rate": "open"},
    "open, lognormal lengths": {"request_rate": "open", "lengths": "lognormal:sigma=0.8"},
    "goodput (TTFT 200 ms, TPOT 30 ms at p90)": {"concurrency": "closed", "slo_ttft": 0.2, "slo_tpot": 0.03},
    "disaggregated 1:1, open": {"request_rate": "open", "disaggregate": "1:1"},
}
#: the case ``--memory`` runs
MEMORY_CASE = "open, lognormal lengths"


def columns(points: int, case: dict) -> dict:
    """The evaluate columns of ``points`` points of a CASES entry (seeded: the same every run)."""
    rng = np.random.default_rng(0)
    hw = dict(memory_bandwidth=rng.uniform(2e12, 8e12, points), peak_fp8=rng.uniform(1e15, 4e15, points))
    load = {"closed": rng.integers(1, 513, points), "open": rng.uniform(0.5, 15.0, points)}
    fixed = dict(hardware="h100-sxm", model="llama-3.1-8b", weights="fp8", activations="fp8", kv="fp8",
                 prompt_len=1024, gen_len=256)
    return {**fixed, **hw, **{k: (load[v] if isinstance(v, str) and v in load else v) for k, v in case.items()}}


def memory(points: int) -> None:
    """One evaluate of MEMORY_CASE: wall time and peak resident memory of this process."""
    cols = columns(points, CASES[MEMORY_CASE])
    t = time.perf_counter()
    out = evaluate(cols)
    dt = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024     # Linux: kilobytes
    slices = "one call" if served.SERVED_SLICE >= points else f"slices of {served.SERVED_SLICE:,}"
    print(f"[memory] {MEMORY_CASE}, {points:,} points, {slices}: evaluate {dt:.2f} s ({points / dt:,.0f} points/s), "
          f"peak resident memory {peak / 2**20:,.0f} MiB ({int(out['feasible'].sum()):,} feasible)")


def main(points: int = 2_000, repeats: int = 3):
    for name, case in CASES.items():
        cols = columns(points, case)
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
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("points", nargs="?", type=int, default=2_000)
    ap.add_argument("--memory", action="store_true", help="one evaluate of the open lognormal case: time, peak memory")
    ap.add_argument("--slice", type=int, default=None,
                    help="served points priced at once (default SERVED_SLICE; 0: a whole group in one call)")
    args = ap.parse_args()
    if args.slice is not None:
        served.SERVED_SLICE = args.slice or 2**62
    memory(args.points) if args.memory else main(args.points)
