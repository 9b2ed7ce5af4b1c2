"""Hand-run benchmark: how long validation and calibration take on the reference data.

    python benchmarks/bench_calibrate.py [measured.csv]

Prints the time to read and prepare the rows, to predict them all through analyze
(validate), one prediction sweep through the fast kernel path the fit uses, and one fit
of the default parameters (no cross-validation, written to a temporary file).
"""
import sys
import tempfile
import time
from pathlib import Path

from dse.core.efficiency import efficiency_for
from dse.fit import calibrate as C
from dse.fit import validate as V


def main(path=None):
    path = Path(path) if path else V.default_measured()
    t0 = time.perf_counter()
    rows, _ = V.read_measured(path)
    cases, skipped = V.prepare_all(rows)
    t1 = time.perf_counter()
    V.validate(path, cases=cases, skipped=skipped)
    t2 = time.perf_counter()
    preds = [C.Predictor(c) for c in cases]
    t3 = time.perf_counter()
    eff = efficiency_for("gpu")
    for p in preds:
        p(eff)
    t4 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        C.calibrate(path, Path(d) / "calibration.yaml", cross_validation=False)
    t5 = time.perf_counter()
    print(f"{len(rows)} scored rows ({len(cases)} predictable) from {path}")
    print(f"  read + prepare        {t1 - t0:7.3f} s")
    print(f"  validate (analyze)    {t2 - t1:7.3f} s")
    print(f"  build fast predictors {t3 - t2:7.3f} s")
    print(f"  one fast sweep        {1e3 * (t4 - t3):7.1f} ms")
    print(f"  calibrate, no CV      {t5 - t4:7.3f} s")


if __name__ == "__main__":
    main(*sys.argv[1:2])
