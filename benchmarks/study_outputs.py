"""Hand-run check that a change leaves every shipped study's numbers as they were.

    python benchmarks/study_outputs.py OUT [--against BASE] [--studies NAME ...]

Runs each shipped study (``studies/*.yaml``; ``--studies`` picks some) with this checkout's
``python -m dse.study run NAME --out OUT/NAME`` and, with ``--against``, compares its
``results.parquet`` (a file, or a folder of chunks for a sweep; a plan study's ``plan.csv``) with ``BASE/NAME``'s (the same command run at an earlier
commit): the same columns in the same order, the same rows, every value equal (floats exactly,
NaN equal to NaN). Prints one line per study (``same``, or what differs) and the wall time of
each run; exits 1 if any study differs or fails.

To compare two commits: check the earlier one out beside this one (``git worktree add``), run
this script there into BASE, then here with ``--against BASE``.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent


def study_names() -> list[str]:
    """The shipped studies' names, sorted."""
    return sorted(p.stem for p in (ROOT / "studies").glob("*.yaml"))


def run_study(name: str, out: Path) -> tuple[int, float, str]:
    """(exit code, wall seconds, the last line of stderr) of ``dse.study run NAME --out OUT``."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "dse.study", "run", name, "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True)
    tail = (done.stderr.strip().splitlines() or [""])[-1]
    return done.returncode, time.perf_counter() - start, tail


#: what a run keeps of its rows, in the order compared: a sweep's or search's results, a plan's answer, a fleet's
RESULTS = ("results.parquet", "plan.csv", "fleet.csv")


def results_file(run: Path) -> Path:
    """The file of ``run`` that holds its rows (``RESULTS``; the first name if it has none)."""
    return next((run / n for n in RESULTS if (run / n).exists()), run / RESULTS[0])


def difference(a: Path, b: Path) -> str:
    """'' where the two results files hold the same table, else a phrase saying what differs."""
    read = pd.read_csv if a.suffix == ".csv" else pd.read_parquet
    x, y = read(a), read(b)
    if list(x.columns) != list(y.columns):
        return f"columns differ: only here {sorted(set(x.columns) - set(y.columns))}, " \
               f"only there {sorted(set(y.columns) - set(x.columns))}"
    if len(x) != len(y):
        return f"{len(x)} rows here, {len(y)} there"
    try:
        pd.testing.assert_frame_equal(x, y, check_exact=True)
    except AssertionError as e:
        return " ".join(str(e).split())[:300]
    return ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="folder for the runs (one subfolder per study)")
    p.add_argument("--against", type=Path, help="a folder of the same runs at another commit")
    p.add_argument("--studies", nargs="+", default=None, help="study names (default: every shipped study)")
    args = p.parse_args(argv)
    failed = 0
    for name in args.studies or study_names():
        rc, wall, tail = run_study(name, args.out / name)
        if rc != 0:
            print(f"{name:28s} FAILED (exit {rc}): {tail}")
            failed += 1
            continue
        line = f"{name:28s} {wall:6.2f} s"
        if args.against is not None:
            here = results_file(args.out / name)
            base = args.against / name / here.name
            if not base.exists():
                line += f"  no {base}"
                failed += 1
            else:
                diff = difference(here, base)
                line += "  same" if not diff else f"  DIFFERS: {diff}"
                failed += bool(diff)
        print(line, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
