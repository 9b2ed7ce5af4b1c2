"""Hand-run benchmark: the 10^6-point grid study from the CLI, wall time and peak memory.

    python benchmarks/bench_sweep.py [OUT_DIR]

Runs ``python -m dse.study run gpu-sweep-1m --out OUT_DIR`` afresh (results.parquet,
pareto.csv) and reports its wall time and maximum resident memory.
"""
import resource
import shutil
import subprocess
import sys
import time


def main(out: str = "/tmp/dse-bench-gpu-sweep-1m"):
    shutil.rmtree(out, ignore_errors=True)
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "dse.study", "run", "gpu-sweep-1m", "--out", out, "--quiet"],
                       capture_output=True, text=True)
    dt = time.perf_counter() - t
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(r.stdout.strip() or r.stderr.strip())
    print(f"wall {dt:.2f} s, peak memory {rss:.0f} MiB")


if __name__ == "__main__":
    main(*sys.argv[1:])
