"""Hand-run benchmark: a 2,000-trial NSGA-II study with 3 objectives, storage on disk.

    python benchmarks/bench_optuna.py [OUT_DIR] [--repeat N] [--unbatched] [--no-grid]

A parametric GPU (H100, B200 and MI300X as bases) serving Llama-2-70B in FP8: maximize
tokens/s, minimize HBM bandwidth and FP8 peak, with TPOT <= 100 ms; trials asked and
evaluated in populations of 100; the journal file storage lives in OUT_DIR.

Prints, per repetition and the best of them (the machine is shared): wall time, trials/s,
the share of the wall time spent inside dse's evaluation, and the share spent in fsync
(every fsync of the process, timed; the journal's are nearly all of them). ``--unbatched``
writes the journal op by op as Optuna does (``DSE_JOURNAL_BATCH=0``), for comparison.

Then the search's quality: the hypervolume of the NSGA-II Pareto front against that of
an exhaustive grid of the same space (``GRID``: every hardware base, batch and a log grid
of each range; evaluated chunk by chunk, its front kept). Objectives are compared as
losses in log10 (-log10 tokens/s, log10 bandwidth, log10 FP8 peak: the space is
log-scaled), normalised to [0, 1] between the best and worst value either front reaches,
with the reference point 1.1 in every objective; the hypervolume is Optuna's exact one
(``optuna._hypervolume.compute_hypervolume``, WFG). A ratio near 1 means the 2,000 trials
found about the front that the grid's evaluations did; above 1 is possible (the search's
continuous values fall between the grid's).
"""
import argparse
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pandas as pd

from dse.explore.space import DesignSpace
from dse.explore.spec import SweepSpec
from dse.explore.study import run_study

SPACE = {
    "hardware": ["h100-sxm", "b200", "mi300x"], "model": "llama-2-70b", "weights": "fp8", "activations": "fp8",
    "kv": "fp8", "flash_attention": True, "batch": {"min": 1, "max": 256},
    "memory_bandwidth": {"min": 1e12, "max": 1.6e13, "scale": "log"},
    "memory_capacity": {"min": 4e10, "max": 4e11, "scale": "log"},
    "peak_fp8": {"min": 2.5e14, "max": 1e16, "scale": "log"},
}
OBJECTIVES = {"output_tokens_per_s": "max", "memory_bandwidth": "min", "peak_fp8": "min"}
CONSTRAINTS = {"tpot_s": {"max": 0.1}}
TRIALS, POPULATION = 2000, 100
#: the exhaustive grid the search is measured against (3 x 256 x 24 x 12 x 24 = 5.3 M points)
GRID = {**SPACE, "batch": {"min": 1, "max": 256, "step": 1},
        "memory_bandwidth": {"min": 1e12, "max": 1.6e13, "scale": "log", "count": 24},
        "memory_capacity": {"min": 4e10, "max": 4e11, "scale": "log", "count": 12},
        "peak_fp8": {"min": 2.5e14, "max": 1e16, "scale": "log", "count": 24}}


class _FsyncTimer:
    """Time every os.fsync of this process (the journal's, Optuna's or dse's)."""

    def __init__(self):
        self.seconds, self.calls, self._real = 0.0, 0, None

    def __enter__(self):
        self._real = real = os.fsync

        def timed(fd):
            t = time.perf_counter()
            try:
                return real(fd)
            finally:
                self.seconds += time.perf_counter() - t
                self.calls += 1
        os.fsync = timed
        return self

    def __exit__(self, *exc):
        os.fsync = self._real


def run_once(out: Path) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    spec = SweepSpec(DesignSpace(SPACE), method="optuna", sampler="nsga2", trials=TRIALS, population=POPULATION,
                     seed=0, objectives=OBJECTIVES, constraints=CONSTRAINTS)
    with _FsyncTimer() as fs:
        t = time.perf_counter()
        front = run_study(spec, out)
        wall = time.perf_counter() - t
    info = front.attrs.get("trials", {})
    return {"wall_s": wall, "trials_per_s": TRIALS / wall, "evaluation_s": info.get("evaluation_s", float("nan")),
            "evaluation_share": info.get("evaluation_s", float("nan")) / wall, "fsync_s": fs.seconds,
            "fsync_share": fs.seconds / wall, "fsyncs": fs.calls, "front": front}


def grid_front() -> tuple[pd.DataFrame, int, float]:
    """(the exhaustive grid's Pareto front, its points, seconds)."""
    from dse.explore.sweep import evaluate_chunk, front_of
    spec = SweepSpec(DesignSpace(GRID), method="grid", objectives=OBJECTIVES, constraints=CONSTRAINTS)
    t = time.perf_counter()
    cands = []
    for k in range(spec.chunks):
        df = evaluate_chunk(spec, k)
        cands.append(front_of(df, OBJECTIVES)[list(OBJECTIVES)])
    front = front_of(pd.concat(cands, ignore_index=True).assign(feasible=True), OBJECTIVES)
    return front, spec.points, time.perf_counter() - t


def _losses(front: pd.DataFrame) -> np.ndarray:
    cols = [(-1.0 if OBJECTIVES[k] == "max" else 1.0) * np.log10(front[k].to_numpy(dtype=float)) for k in OBJECTIVES]
    return np.column_stack(cols)


def hypervolume_ratio(search: pd.DataFrame, grid: pd.DataFrame) -> tuple[float, float, float]:
    """(hypervolume of the search's front, of the grid's, their ratio), objectives normalised
    between the best and worst value of either front, reference point 1.1."""
    from optuna._hypervolume import compute_hypervolume
    a, b = _losses(search), _losses(grid)
    both = np.vstack([a, b])
    lo, hi = both.min(axis=0), both.max(axis=0)
    span = np.where(hi > lo, hi - lo, 1.0)
    ref = np.full(len(OBJECTIVES), 1.1)
    hv_a = compute_hypervolume((a - lo) / span, ref)
    hv_b = compute_hypervolume((b - lo) / span, ref)
    return hv_a, hv_b, hv_a / hv_b


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", nargs="?", default="/tmp/dse-bench-optuna")
    p.add_argument("--repeat", type=int, default=1, help="run the study N times; report each and the best")
    p.add_argument("--unbatched", action="store_true", help="write the journal op by op (DSE_JOURNAL_BATCH=0)")
    p.add_argument("--no-grid", action="store_true", help="skip the exhaustive grid and the hypervolume")
    args = p.parse_args(argv)
    if args.unbatched:
        os.environ["DSE_JOURNAL_BATCH"] = "0"
    mode = "journal written op by op" if args.unbatched else "journal written a population at a time"
    runs = []
    for i in range(args.repeat):
        r = run_once(Path(args.out))
        runs.append(r)
        print(f"run {i + 1}: {TRIALS:,} NSGA-II trials, 3 objectives, journal storage on disk ({mode}): "
              f"{r['wall_s']:.2f} s ({r['trials_per_s']:.0f} trials/s); evaluation {r['evaluation_s']:.2f} s "
              f"({r['evaluation_share']:.0%}); fsync {r['fsync_s']:.2f} s ({r['fsync_share']:.0%}, "
              f"{r['fsyncs']:,} calls); {len(r['front'])} Pareto designs", flush=True)
    best = min(runs, key=lambda r: r["wall_s"])
    print(f"best of {len(runs)}: {best['wall_s']:.2f} s wall, {best['trials_per_s']:.0f} trials/s, evaluation share "
          f"{best['evaluation_share']:.0%}, fsync share {best['fsync_share']:.0%}")
    if not args.no_grid:
        grid, points, dt = grid_front()
        hv_s, hv_g, ratio = hypervolume_ratio(best["front"], grid)
        print(f"quality: hypervolume of the NSGA-II front {hv_s:.4f} vs the exhaustive grid's {hv_g:.4f} "
              f"({points:,} points, {len(grid)} on its front, {dt:.1f} s): ratio {ratio:.3f}")


if __name__ == "__main__":
    main()
