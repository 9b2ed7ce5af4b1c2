"""Hand-run benchmark of sweeps: wall time, points/s and peak memory.

    python benchmarks/bench_sweep.py [1m] [scaling] [stream] [--repeat N] [--workers N]
                                     [--scaling-points N] [--stream-points N] [--objectives two|gpu]
                                     [--out DIR]

- ``1m``: ``dse run gpu-sweep-1m`` afresh (results.parquet, pareto.csv, the report),
  end to end, on 1 process and on ``--workers``: wall time and peak memory.
- ``scaling``: a grid of ``--scaling-points`` (default 4,064,256: gpu-sweep-1m with 4x the
  capacities) with ``--rows none``, on 1 and on 2 worker processes: wall time, points/s,
  speed-up end to end and of the sweep itself (the time the run reports for its study,
  without the start and the report, which one process does either way).
- ``stream``: a ~10^8-point grid (gpu-sweep-1m's space, every axis finer) streamed with
  ``--rows sample`` on ``--workers`` processes: wall time, points/s and peak memory (the
  largest process, and the whole process tree sampled every 0.2 s).

The scaling and stream cases optimize ``--objectives``: ``two`` (tokens/s max, bandwidth
min; a small front) or ``gpu`` (gpu-sweep-1m's three; a front of ~4 % of the points, whose
merging and pareto.csv run in one process and bound the speed-up).

Each run is ``python -m dse.study run`` in a subprocess of the checkout this file is in;
``--repeat`` runs each case that many times and reports the best (the machine is shared).
The spec files are written to ``--out``; nothing else of the checkout is touched.
"""
from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]

#: gpu-sweep-1m's space (studies/gpu-sweep-1m.yaml), its axes given point counts
BASE = {"hardware": "h100-sxm", "model": "llama-2-70b", "weights": "fp8", "activations": "fp8", "kv": "fp8",
        "flash_attention": True, "prompt_len": 2048, "gen_len": 256, "batch": [1, 2, 4, 8, 16, 32, 64, 128, 256]}
#: objectives of the scaling and stream cases (``--objectives``): gpu-sweep-1m's three, whose
#: front holds ~4 % of the points of such a grid (every bandwidth and compute pair has its
#: best design), or two, tokens/s against bandwidth, whose front stays small
OBJECTIVES = {"gpu": {"output_tokens_per_s": "max", "memory_bandwidth": "min", "peak_fp8": "min"},
              "two": {"output_tokens_per_s": "max", "memory_bandwidth": "min"}}


def grid_study(name: str, bandwidths: int, capacities: int, peaks: int, objectives: str = "two") -> dict:
    """A study of gpu-sweep-1m's kind with the given number of values per swept figure and
    the ``objectives`` named (a key of OBJECTIVES)."""
    space = dict(BASE, memory_bandwidth={"min": 1.0e12, "max": 1.6e13, "count": bandwidths, "scale": "log"},
                 memory_capacity={"min": 4.0e10, "max": 4.0e11, "count": capacities, "scale": "log"},
                 peak_fp8={"min": 2.5e14, "max": 1.0e16, "count": peaks, "scale": "log"})
    points = 9 * bandwidths * capacities * peaks
    return {"name": name, "space": space, "objectives": OBJECTIVES[objectives], "constraints": {"tpot_s": {"max": 0.1}},
            "method": "grid", "max_points": max(points, 10_000_000)}


def _tree_rss(pid: int) -> tuple[int, int]:
    """(resident bytes of process ``pid`` and its descendants, of the largest of them) (Linux /proc)."""
    parent, rss = {}, {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            status = (d / "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        parent[int(d.name)] = int(fields.get("PPid", "0").strip() or 0)
        rss[int(d.name)] = int(fields.get("VmRSS", "0 kB").split()[0]) * 1024
    total, largest, todo = 0, 0, [pid]
    while todo:
        p = todo.pop()
        total += rss.get(p, 0)
        largest = max(largest, rss.get(p, 0))
        todo += [c for c, pp in parent.items() if pp == p]
    return total, largest


def run(study: str, out: Path, *extra: str) -> dict:
    """Run ``dse run STUDY --out OUT --quiet EXTRA`` afresh; {'wall_s', 'max_rss', 'tree_rss', 'stdout'}
    (max_rss: the largest process, tree_rss: the process tree, both the largest sampled every 0.2 s;
    max_rss also at least the command's own peak, from the kernel)."""
    shutil.rmtree(out, ignore_errors=True)
    t = time.perf_counter()
    with tempfile.TemporaryFile("w+") as so, tempfile.TemporaryFile("w+") as se:
        p = subprocess.Popen([sys.executable, "-m", "dse.study", "run", study, "--out", str(out), "--quiet", *extra],
                             cwd=ROOT, stdout=so, stderr=se, text=True)
        peak = [0, 0]
        stop = threading.Event()

        def sample():
            while not stop.wait(0.2):
                total, largest = _tree_rss(p.pid)
                peak[0], peak[1] = max(peak[0], total), max(peak[1], largest)
        if Path("/proc/self/status").exists():
            threading.Thread(target=sample, daemon=True).start()
        _, status, usage = os.wait4(p.pid, 0)           # the command's own peak memory, from the kernel
        dt = time.perf_counter() - t
        stop.set()
        p.returncode = os.waitstatus_to_exitcode(status)
        so.seek(0)
        se.seek(0)
        stdout, stderr = so.read(), se.read()
    if p.returncode:
        raise SystemExit(f"{study}: exit {p.returncode}: {stderr.strip()}")
    return {"wall_s": dt, "max_rss": max(peak[1], usage.ru_maxrss * 1024) or None, "tree_rss": peak[0] or None,
            "stdout": stdout}


def _sweep_s(stdout: str) -> float:
    """Seconds of the study itself, as the run reports it ('... design points (grid) in 2.4 s; ...'):
    its chunks (worker processes started), its Pareto front and best designs; not the
    interpreter's start, the study file or the report."""
    m = re.search(r" in ([0-9.]+) s;", stdout)
    return float(m.group(1)) if m else math.nan


def _mib(b) -> str:
    return "n/a" if not b else f"{b / 2**20:,.0f} MiB"


def best_of(n: int, *args) -> dict:
    """The fastest of ``n`` runs of ``run(*args)``, with the largest memory seen in any."""
    runs = [run(*args) for _ in range(n)]
    best = min(runs, key=lambda r: r["wall_s"])
    best["walls"] = [r["wall_s"] for r in runs]
    best["sweeps"] = [_sweep_s(r["stdout"]) for r in runs]
    best["tree_rss"] = max((r["tree_rss"] or 0) for r in runs) or None
    best["max_rss"] = max((r["max_rss"] or 0) for r in runs) or None
    return best


def bench_1m(out: Path, repeat: int, workers: int) -> None:
    for w in sorted({1, workers}):
        extra = ("--workers", str(w)) if w > 1 else ()
        r = best_of(repeat, "gpu-sweep-1m", out / "gpu-sweep-1m", *extra)
        if w == 1:
            print(r["stdout"].splitlines()[0])
        print(f"[1m] gpu-sweep-1m end to end{f', --workers {w}' if w > 1 else ''}: best wall {r['wall_s']:.2f} s "
              f"(runs: {', '.join(f'{x:.2f}' for x in r['walls'])}), peak memory {_mib(r['max_rss'])} (largest "
              f"process), {_mib(r['tree_rss'])} (process tree)")


def scaled_study(name: str, points: int, objectives: str) -> tuple[dict, int]:
    """(a gpu-sweep-1m-like study of about ``points`` points, its exact number of points):
    capacities scaled first up to 64 values, then every axis."""
    if points <= 9 * 84 * 64 * 84:
        b, c, p = 84, max(2, round(points / (9 * 84 * 84))), 84
    else:
        scale = (points / (9 * 84 * 64 * 84)) ** (1 / 3)
        b, c, p = (max(2, math.ceil(n * scale)) for n in (84, 64, 84))
    return grid_study(name, b, c, p, objectives), 9 * b * c * p


def bench_scaling(out: Path, repeat: int, points: int, objectives: str) -> None:
    study, points = scaled_study("sweep-scaling", points, objectives)
    path = out / f"sweep-scaling-{points}-{objectives}.yaml"
    path.write_text(yaml.safe_dump(study))
    walls, sweeps = {}, {}
    for w in (1, 2):
        r = best_of(repeat, str(path), out / f"sweep-scaling-w{w}", "--rows", "none", "--workers", str(w))
        walls[w], sweeps[w] = r["wall_s"], min(r["sweeps"])
        print(f"[scaling] {points:,} points ({objectives} objectives), --rows none, --workers {w}: "
              f"best wall {r['wall_s']:.2f} s "
              f"({points / r['wall_s']:,.0f} points/s; runs {', '.join(f'{x:.2f}' for x in r['walls'])}), "
              f"the sweep itself {sweeps[w]:.1f} s (runs {', '.join(f'{x:.1f}' for x in r['sweeps'])}), "
              f"peak memory {_mib(r['tree_rss'])} (process tree); {r['stdout'].splitlines()[0].split('; ')[-1]}")
    print(f"[scaling] speed-up with 2 workers: {walls[1] / walls[2]:.2f}x end to end (start, sweep, report), "
          f"{sweeps[1] / sweeps[2]:.2f}x the sweep itself")


def bench_stream(out: Path, points: int, workers: int, objectives: str) -> None:
    study, n = scaled_study("sweep-stream", points, objectives)
    path = out / "sweep-stream.yaml"
    path.write_text(yaml.safe_dump(study))
    r = run(str(path), out / "sweep-stream", "--rows", "sample", "--workers", str(workers))
    print(r["stdout"].splitlines()[0])
    print(f"[stream] {n:,} points ({objectives} objectives), --rows sample, --workers {workers}: "
          f"wall {r['wall_s']:.1f} s, "
          f"{n / r['wall_s']:,.0f} points/s, peak memory {_mib(r['max_rss'])} (largest process), "
          f"{_mib(r['tree_rss'])} (process tree)")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="*", choices=("1m", "scaling", "stream"), default=None)
    ap.add_argument("--repeat", type=int, default=1, help="runs of each 1m and scaling case; the best is reported")
    ap.add_argument("--workers", type=int, default=2, help="worker processes of the 1m (besides 1) and stream cases")
    ap.add_argument("--scaling-points", type=int, default=4_064_256, help="points of the scaling case (about)")
    ap.add_argument("--stream-points", type=int, default=100_000_000, help="points of the stream case (about)")
    ap.add_argument("--objectives", choices=tuple(OBJECTIVES), default="two",
                    help="objectives of the scaling and stream cases")
    ap.add_argument("--out", default="/tmp/dse-bench-sweep", help="folder of the runs")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cases = args.cases or ["1m"]
    if "1m" in cases:
        bench_1m(out, args.repeat, args.workers)
    if "scaling" in cases:
        bench_scaling(out, args.repeat, args.scaling_points, args.objectives)
    if "stream" in cases:
        bench_stream(out, args.stream_points, args.workers, args.objectives)


if __name__ == "__main__":
    main()
