"""``validate`` and ``calibrate`` subcommands of ``python -m dse.study``.

Both import scipy, matplotlib and seaborn only when they run, so the ``analyze`` path
stays light.
"""
from __future__ import annotations

from pathlib import Path

from dse.core.efficiency import CALIBRATION_ENV, calibration_file
from dse.fit import calibrate as C
from dse.fit import validate as V


def add_parsers(sub) -> None:
    """Add the two subcommands to the CLI's subparsers."""
    v = sub.add_parser("validate", help="predict measured results (CSV) and report the error")
    v.add_argument("--measured", default=None,
                   help="measured-results CSV (default: the measured results dse ships, "
                        "data/measured_calibration.csv, on which the shipped calibration was fitted)")
    v.add_argument("--out", default="runs/validate",
                   help="folder for validation.csv, summary.md and predicted_vs_measured.png (default runs/validate)")
    v.add_argument("--ideal", action="store_true",
                   help="predict with the pure roofline bound and check that no measurement beats it")
    c = sub.add_parser("calibrate", help="fit the efficiency parameters to measured results")
    c.add_argument("--measured", default=None, help="measured-results CSV (default as for validate)")
    c.add_argument("--out", default=None, metavar="FILE",
                   help=f"calibration file to write (default {C.DEFAULT_OUT}); every command uses it when "
                        f"{CALIBRATION_ENV}=FILE is set (in a checkout, --out configs/calibration.yaml replaces "
                        "the shipped default)")
    c.add_argument("--no-cross-validation", action="store_true",
                   help="skip the leave-one-hardware-out and leave-one-model-out fits")


def cmd_validate(args) -> int:

    res = V.validate(args.measured, ideal=args.ideal)
    stats = V.summarize(res.rows)
    print(V.report_text(res, stats))
    if args.ideal:
        bad = V.bound_violations(res.rows)
        print()
        if bad:
            print(f"Ideal bound broken by {len(bad)} row(s) (a bug in the model or in the row):")
            for r in bad:
                print(f"  {r['id']} (line {r['line']}) {r['metric']}: measured {r['measured']:.4g}, "
                      f"bound {r['predicted']:.4g}")
        else:
            print(f"Ideal bound holds: every measured throughput is at or below it and every measured latency "
                  f"at or above it ({len(res.rows)} rows)")
    paths = V.write_outputs(res, Path(args.out), stats)
    print()
    for k, p in paths.items():
        print(f"  {k + ':':9s}{p}")
    return 0


def cmd_calibrate(args) -> int:

    cal = C.calibrate(args.measured, args.out, cross_validation=not args.no_cross_validation)
    print(C.report_text(cal))
    res = V.validate(cal.measured, calibration=cal.out)
    s = V.summarize(res.rows)["overall"]
    print(f"\nvalidated through the one evaluator with the new calibration: median APE {100 * s['median_ape']:.1f} %, "
          f"p90 {100 * s['p90_ape']:.1f} % over {s['n']} rows")
    if cal.out.resolve() != calibration_file().resolve():
        print(f"use it: {CALIBRATION_ENV}={cal.out} dse analyze ...   (or any other command)")
    return 0


COMMANDS = {"validate": cmd_validate, "calibrate": cmd_calibrate}
