"""Hand-run benchmark: a 2,000-trial NSGA-II study with 3 objectives, storage on disk.

    python benchmarks/bench_optuna.py [OUT_DIR]

A parametric GPU (H100, B200 and MI300X as bases) serving Llama-2-70B in FP8: maximize
tokens/s, minimize HBM bandwidth and FP8 peak, with TPOT <= 100 ms; trials asked and
evaluated in populations of 100; the journal file storage lives in OUT_DIR.
"""
import shutil
import sys
import time
from pathlib import Path

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


def main(out: str = "/tmp/dse-bench-optuna"):
    shutil.rmtree(out, ignore_errors=True)
    spec = SweepSpec(DesignSpace(SPACE), method="optuna", sampler="nsga2", trials=2000, population=100, seed=0,
                     objectives={"output_tokens_per_s": "max", "memory_bandwidth": "min", "peak_fp8": "min"},
                     constraints={"tpot_s": {"max": 0.1}})
    t = time.perf_counter()
    front = run_study(spec, Path(out))
    dt = time.perf_counter() - t
    print(f"2,000 NSGA-II trials, 3 objectives, journal storage on disk: {dt:.1f} s "
          f"({2000 / dt:.0f} trials/s), {len(front)} Pareto designs")


if __name__ == "__main__":
    main(*sys.argv[1:])
