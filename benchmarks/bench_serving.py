"""Hand-run benchmark: served design points per second through the evaluator's serving model.

Llama-3.1-8B FP8 on an H100 SXM template whose HBM bandwidth and FP8 peak vary per point,
1,024-token prompts and 256-token answers: a closed loop (concurrency 1 to 512) and an open
loop (Poisson, 0.5 to 15 requests/s; past a design's capacity a point is saturated), each with
fixed and lognormal lengths; goodput under a TTFT and a TPOT SLO; disaggregated pools. Per point: the iteration model priced by the roofline, the steady state, the
percentiles and, for goodput, the bisection over the request rate.

    python benchmarks/bench_serving.py [points] [--only CASE] [--against DIR]
    python benchmarks/bench_serving.py [points] --memory [--case CASE] [--slice N]
    python benchmarks/bench_serving.py --study [NAME] [--against DIR]

``--memory``: one ``evaluate`` of the open loop with lognormal lengths (the case whose
steady state holds the most per point) and nothing else, its wall time and the process's
peak resident memory (``getrusage``; run it under ``/usr/bin/time -v`` for the kernel's
figure of the whole process). The evaluator prices served points in slices of
``dse.system.served.SERVED_SLICE``, so the peak should not grow with the points; ``--slice N``
prices them N at a time instead (0: the whole group in one call, as before slicing); ``--case``
runs another case's points (``goodput ...``: a served sweep under SLOs, e.g. 10^5 points).

``--study``: the shipped served study (``capacity-planning`` by default) end to end, ``python -m
dse.study run NAME`` in a child process: its wall time and the CPU seconds it used (this box is
shared: CPU seconds are the steadier figure).

``--against DIR``: every line run twice, alternately, with the ``dse`` of checkout DIR (e.g. main,
or the previous commit's ``git worktree``) and with this one's, each in its own child process,
so both see the same load (figures side by side in one run).

Measured (2 loaded cores, CPU seconds on one core, ``512 --only CASE --against`` main at 6a6ac11,
before -> after the batched chain): closed loop, lognormal lengths 508 -> 1,049 points/s; open loop,
fixed lengths 1,334 -> 2,176; open loop, lognormal lengths 143 -> 829; goodput 62 -> 125;
``--study capacity-planning`` 11.5 -> 7.9 CPU-s, ``serving-cost`` 2.5 -> 2.3 CPU-s (its 84 points
are closed-loop waves: fixed costs); ``10000 --memory`` 201 s at 376 MiB -> 12 s at 157 MiB.
Then (side by side with main at a88ef61, CPU seconds): naming 2 x 256 distinct designs 3.73 ->
1.53 ms; ``--study capacity-planning`` 10.1 -> 11.0, ``serving-cost`` 3.2 -> 2.8, ``llama70b-slo``
6.0 -> 5.5 (within this box's noise); ``100000 --memory``: 156 CPU-s (394 s wall at 42 % of a
core), peak resident memory 314 MiB (``/usr/bin/time -v``), every metric equal to main's.
Then every served group's goodput searched together (``served.deferring_goodput``; the groups of one
Efficiency and operator layout priced by one roofline call a step of the chain), whole processes side
by side with main at b1ab0aa (A B A B, 3 runs each, medians, CPU seconds of the process and its
children): ``run capacity-planning`` 12.1 -> 5.9 CPU-s (x0.48; wall 31.4 -> 19.6 s on the loaded box),
``serving-cost`` 3.4 -> 3.2 (no goodput: imports, preparation and the report are its time),
``llama70b-slo`` 5.5 -> 5.7 (one large group: unchanged within noise); every column of the three
equal to main's (worst relative difference 0). Left in capacity-planning's 5.9 CPU-s: imports
(~1.2 s), the 64 iteration models (``iteration_model``, ~1 s), each group's own steady state (~0.6 s),
the goodput chain's per-group ``IterationModel.arrays`` and roofline calls (~1 s) and the report.
Then (2026-11-29, ``512 --only goodput... --against`` main at f7f60ec, CPU seconds on one core) each
rate's open loop started from the secant through the two rates tried before it (the capacity's from
the cap, a trickle from an idle engine): 26 % fewer fixed-point states, goodput 127 -> 170 points/s,
every answer bit-identical; ``--study capacity-planning`` 3.1 -> 3.0 CPU-s.
Then (2026-11-29, ``512 --against`` df2871a, CPU seconds on one core) a mixture's percentiles
bracketed by Newton's method and the 36 halvings replayed against the bracket, goodput's rate
bracketed by regula falsi (Illinois) on x / p - 1 of the binding percentile and its 12 halvings
replayed (45 % fewer open loops solved), the chain's shifted rows one gather a pair: goodput 176 ->
316 points/s, closed lognormal 1,784 -> 2,542, open fixed 2,155 -> 2,411, open lognormal 547 -> 710,
closed fixed and disaggregated unchanged; every answer bit-identical (38 studies). Then (``4096
--against`` df2871a) with the template's die area and cost priced for every distinct die at once and
the designs' names spelled when read (each point here a design of its own): closed fixed 11,421 ->
39,525, closed lognormal 1,570 -> 2,352, open fixed 1,792 -> 2,157, open lognormal 519 -> 663,
goodput 149 -> 257, disaggregated 2,306 -> 2,943; ``--study capacity-planning`` 3.2 -> 3.0 CPU-s,
``serving-cost`` 1.8 -> 1.8 (imports, preparation and the report are their time). Then the first rate
tried between the trickle and the capacity started from an idle engine, not the secant through those
two (15 % fewer chain states): goodput ``512 --against`` 7af087d 262-266 -> 313-317 points/s, ``4096
--against`` df2871a 133 -> 281 (the same answers, 38 studies identical).
Then (2026-11-29, ``2048 --against`` 7dd6708, CPU seconds on one core) the mixing regime's fixed point
started from the mean-value iteration, its first step the residual's own (chain states a point: closed
lognormal 11.1 -> 5.1, open lognormal 17.3 -> 10.2, goodput 43 -> 38), and each chain first given the
next half power of two of the states its arrivals need (the next power of two, as before, where more than
1e-6 of its iterations spill past the last): closed lognormal 1,890 -> 2,957, open fixed 1,919 -> 2,530,
open lognormal 695 -> 1,085, goodput 252 -> 270, disaggregated 2,127 -> 2,749, closed fixed and the
repeated goodput unchanged (44.7k, 11.9k at 4,096); ``--study capacity-planning`` 3.7 -> 3.7 CPU-s.
Every metric within 7e-6 on the benchmark's points; 38 studies within 1.8e-7 but two goodputs,
one bisection step apart (disaggregation -0.19 %, kv-tier-cxl +0.09 %).
"""
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")     # one core: CPU seconds are one core's
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import argparse  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from dse.system import served  # noqa: E402
from dse.system.evaluator import evaluate  # noqa: E402

CASES = {
    "closed, fixed lengths": {"concurrency": "closed"},
    "closed, lognormal lengths": {"concurrency": "closed", "lengths": "lognormal:sigma=0.8"},
    "open, fixed lengths": {"request_rate": "open"},
    "open, lognormal lengths": {"request_rate": "open", "lengths": "lognormal:sigma=0.8"},
    "goodput (TTFT 200 ms, TPOT 30 ms at p90)": {"concurrency": "closed", "slo_ttft": 0.2, "slo_tpot": 0.03},
    "disaggregated 1:1, open": {"request_rate": "open", "disaggregate": "1:1"},
    "goodput, 1 design in 64 (prices swept)": {"concurrency": "closed", "slo_ttft": 0.2, "slo_tpot": 0.03,
                                               "repeated": 64},
}
#: the case ``--memory`` runs
MEMORY_CASE = "open, lognormal lengths"
#: this checkout
ROOT = Path(__file__).resolve().parent.parent


def columns(points: int, case: dict) -> dict:
    """The evaluate columns of ``points`` points of a CASES entry (seeded: the same every run)."""
    rng = np.random.default_rng(0)
    case = dict(case)
    k = case.pop("repeated", 1)             # each design and load repeated k times, at prices of their own
    n = -(-points // k)
    hw = dict(memory_bandwidth=rng.uniform(2e12, 8e12, n), peak_fp8=rng.uniform(1e15, 4e15, n))
    load = {"closed": rng.integers(1, 513, n), "open": rng.uniform(0.5, 15.0, n)}
    fixed = dict(hardware="h100-sxm", model="llama-3.1-8b", weights="fp8", activations="fp8", kv="fp8",
                 prompt_len=1024, gen_len=256)
    cols = {**hw, **{c: (load[v] if isinstance(v, str) and v in load else v) for c, v in case.items()}}
    cols = {c: (np.repeat(v, k)[:points] if isinstance(v, np.ndarray) else v) for c, v in cols.items()}
    return {**fixed, **cols, **({"price_usd": rng.uniform(2e4, 4e4, points)} if k > 1 else {})}


def memory(points: int, case: str = MEMORY_CASE) -> None:
    """One evaluate of ``case``: wall time and peak resident memory of this process."""
    cols = columns(points, CASES[case])
    t = time.perf_counter()
    out = evaluate(cols)
    dt = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024     # Linux: kilobytes
    slices = "one call" if served.SERVED_SLICE >= points else f"slices of {served.SERVED_SLICE:,}"
    print(f"[memory] {case}, {points:,} points, {slices}: evaluate {dt:.2f} s ({points / dt:,.0f} points/s), "
          f"peak resident memory {peak / 2**20:,.0f} MiB ({int(out['feasible'].sum()):,} feasible)")


def study(name: str) -> None:
    """``dse.study run NAME`` end to end in a child process: wall time and CPU seconds."""
    with tempfile.TemporaryDirectory() as out:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "dse.study", "run", name, "--out", str(Path(out) / name)],
                              capture_output=True, text=True)
        dt = time.perf_counter() - t
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    status = "ok" if done.returncode == 0 else f"failed: {(done.stderr.strip().splitlines() or [''])[-1]}"
    print(f"[study] run {name}: wall {dt:.1f} s, CPU {cpu:.1f} s ({status})")


def side_by_side(other: str, argv: list[str]) -> None:
    """Each line of this benchmark run with checkout ``other``'s dse, then this one's, alternately."""
    lines = [["--study", a] for a in argv[argv.index("--study") + 1:][:1]] if "--study" in argv else None
    if lines is None:
        only = [argv[argv.index("--only") + 1]] if "--only" in argv else list(CASES)
        points = [a for a in argv if a.isdigit()][:1]
        lines = [[*points, "--only", c] for c in only]
    for line in lines:
        for label, root in (("before", Path(other).resolve()), ("after ", ROOT)):
            env = {**os.environ, "PYTHONPATH": str(root)}
            done = subprocess.run([sys.executable, str(Path(__file__).resolve()), *line], cwd=root, env=env,
                                  capture_output=True, text=True)
            text = done.stdout.strip() or (done.stderr.strip().splitlines() or ["?"])[-1]
            print(f"{label} {text}", flush=True)


def main(points: int = 2_000, repeats: int = 3, only: str | None = None):
    for name, case in CASES.items():
        if only is not None and name != only:
            continue
        cols = columns(points, case)
        evaluate({k: (v[:10] if isinstance(v, np.ndarray) else v) for k, v in cols.items()})   # warm the caches
        times, cpus = [], []
        for _ in range(repeats):
            t, c = time.perf_counter(), time.process_time()
            out = evaluate(cols)
            times.append(time.perf_counter() - t)
            cpus.append(time.process_time() - c)
        median, cpu = sorted(times)[len(times) // 2], sorted(cpus)[len(cpus) // 2]
        print(f"{name:45s} {points:,} points: median CPU {cpu:.2f} s = {points / cpu:,.0f} served points/s "
              f"on one core (wall {median:.2f} s; {int(out['feasible'].sum()):,} feasible)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("points", nargs="?", type=int, default=2_000)
    ap.add_argument("--memory", action="store_true", help="one evaluate of the open lognormal case: time, peak memory")
    ap.add_argument("--slice", type=int, default=None,
                    help="served points priced at once (default SERVED_SLICE; 0: a whole group in one call)")
    ap.add_argument("--case", default=MEMORY_CASE, choices=list(CASES), help="the case --memory runs")
    ap.add_argument("--only", default=None, choices=list(CASES), help="run this case alone")
    ap.add_argument("--study", nargs="?", const="capacity-planning", default=None,
                    help="a shipped served study end to end (default capacity-planning)")
    ap.add_argument("--against", default=None, help="another checkout: every line run with its dse, then this one's")
    args = ap.parse_args()
    if args.slice is not None:
        served.SERVED_SLICE = args.slice or 2**62
    if args.against:
        side_by_side(args.against, sys.argv[1:])
    elif args.study:
        study(args.study)
    elif args.memory:
        memory(args.points, args.case)
    else:
        main(args.points, only=args.only)
