"""``validate`` and ``calibrate`` subcommands of ``python -m dse.study``.

Both import scipy and matplotlib only when they run, so the ``analyze`` path
stays light. Both show progress with the time left on stderr (tqdm) when stderr is a
terminal (``--progress``: always; ``--quiet``: never); stdout carries only the report.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from basis import progress
from basis.errors import DseError, shown_path
from basis.files import exists, is_regular_file, output_file
from dse.core.efficiency import CALIBRATION_ENV, calibration_file
from dse.fit import calibrate as C
from dse.fit import refit as R
from dse.fit import validate as V
from dse.present import display
from dse.system.params import SPEC


def nonempty_path(what: str, instead: str):
    """An argparse type for a path given as is: ArgumentTypeError for an empty text, which would
    otherwise fall back to ``instead`` without a word."""
    def path(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"expected {what}, got an empty text (leave the flag out for {instead})")
        return text
    return path


_csv_path = nonempty_path("a CSV file's path", "the measured results dse ships")


def _out_file(text: str) -> str:
    """The calibration file to write, as given; ArgumentTypeError for an empty text."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected a file name, got an empty text (leave --out out for {C.DEFAULT_OUT})")
    return text


def add_parsers(command) -> None:
    """Add the two subcommands; ``command(name, text)`` makes a subparser (with its examples)."""
    v = command("validate", "predict measured results (CSV) and report the error")
    v.add_argument("--measured", default=None, type=_csv_path,
                   help="measured-results CSV (default: the measured results dse ships, "
                        "data/measured_calibration.csv, on which the shipped calibration was fitted)")
    v.add_argument("--out", default="runs/validate",
                   help="folder for validation.csv, summary.md and predicted_vs_measured.png")
    v.add_argument("--ideal", action="store_true",
                   help="predict with the pure roofline bound and check that no measurement beats it")
    v.add_argument(SPEC["kernel_layer"].flag, choices=SPEC["kernel_layer"].choices, default=None,
                   help="which layer prices every row's GPU matmuls and attention: fitted (the calibrated family "
                  "fractions) or learned (the measured kernel tables); default: the parameter's default, fitted")
    _progress_args(v)
    c = command("calibrate", "fit the efficiency parameters to measured results")
    c.add_argument("--measured", default=None, nargs="+", metavar="CSV", type=_csv_path,
                   help="measured-results CSV file(s) (default: every measured file dse ships: "
                        "data/measured_calibration.csv and data/gathered/*.csv)")
    c.add_argument("--out", default=None, metavar="FILE", type=_out_file,
                   help=f"calibration file to write (default: {C.DEFAULT_OUT}); every command uses it when "
                        f"{CALIBRATION_ENV}=FILE is set (in a checkout, --out configs/calibration.yaml replaces "
                        "the shipped default)")
    c.add_argument("--starts", type=_whole(1, 3), default=3, metavar="N",
                   help="starting points of the full fit, the best kept (1-3; default 3: the documented start, then "
                        "the low and high quarters of the box); each cross-validation fold starts once, at the full fit")
    c.add_argument("--workers", type=_whole(1, 64), default=1, metavar="N",
                   help="processes fitting the cross-validation folds at once (1-64; default 1); the results are "
                        "the same")
    c.add_argument("--leave-out", nargs="+", choices=C.CV_KEYS, default=list(C.CV_KEYS), metavar="KEY",
                   help=f"the groupings cross-validated, one group left out at a time ({', '.join(C.CV_KEYS)}; "
                        "default all; the band of unseen engines needs 'engine')")
    c.add_argument("--fold-evaluations", type=_whole(1, 1000), default=C.WARM_NFEV, metavar="N",
                   help=f"evaluations each cross-validation fold's fit may take from the full fit's values "
                        f"(1-1000; default {C.WARM_NFEV})")
    c.add_argument("--bands-only", action="store_true",
                   help=f"no fit: recompute the error bands and their coverage of the calibration file (--out, "
                        f"default {C.DEFAULT_OUT}) from the residuals calibrate stored beside it "
                        f"(NAME_residuals.csv), and write both files back")
    c.add_argument("--engine", nargs="+", default=None, metavar="NAME",
                   help="refit only these engines' own values (scheduler cost, scales, request cost, overlap) on "
                        "their rows, every other value held at the calibration in use (the shipped file, or "
                        f"{CALIBRATION_ENV}); their residuals replace theirs beside it and the bands are recomputed "
                        "(default: fit every engine and class at once)")
    c.add_argument("--no-cross-validation", action="store_true",
                   help="skip the cross-validation fits that leave out sources, vendors and engines (and the error bands they give; default: run them)")
    _progress_args(c)


def _whole(lo: int, hi: int):
    """An argparse type: a whole number from ``lo`` to ``hi`` (an error naming the range otherwise)."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number from {lo} to {hi}, got {text!r}") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"expected a whole number from {lo} to {hi}, got {v}")
        return v
    return parse


def _progress_args(p) -> None:
    p.add_argument("--quiet", action="store_true", help="no progress output on stderr")
    p.add_argument("--progress", action="store_true",
                   help="progress on stderr even when it is not a terminal (default: only on a terminal)")


def progress_bar(args, what: str, total: int | None = 1, unit: str = "step"):
    """A tqdm progress bar of ``total`` ``unit``s with the time left on stderr: shown on a terminal
    or with ``--progress``, never with ``--quiet`` (``basis.progress``). The work may set its
    total (``reset(total=n)``)."""
    return progress.progress_bar(what, total, unit=unit, shown=progress.progress_shown(args.quiet, args.progress))


class FitProgress:
    """``calibrate``'s progress on a tqdm ``bar`` in evaluations (the measured rows priced once:
    the residuals or their Jacobian, in a least-squares run). Runs differ (a cold start of the
    full fit takes many evaluations, a warm-started cross-validation fold a few), so the total
    is estimated as they finish: the evaluations done, plus each run to come at the mean of the
    finished runs of its kind (a fold before any fold finished: at the cold starts' mean).
    Unknown (``?``) until the first run finishes; exact (done/done) at the end (``close``)."""

    def __init__(self, bar):
        self.bar = bar
        self.left = {False: 0, True: 0}             # runs to come, the current one included
        self.runs: dict[bool, list[int]] = {False: [], True: []}   # evaluations of each finished run
        self.current = 0                            # evaluations of the current run so far
        self.done = 0                               # evaluations so far

    def plan(self, cold: int, warm: int) -> None:
        """The runs to come: ``cold`` starts, ``warm`` folds."""
        self.left = {False: cold, True: warm}
        self.bar.set_postfix_str(f"{cold + warm} least-squares runs", refresh=False)
        self._estimate()

    def update(self, n: int = 1) -> None:
        """``n`` evaluations done."""
        self.current += n
        self.done += n
        self.bar.update(n)

    def run_done(self, warm: bool) -> None:
        """A least-squares run (a fold if ``warm``) finished."""
        self.runs[warm].append(self.current)
        self.current = 0
        self.left[warm] = max(self.left[warm] - 1, 0)
        done = sum(map(len, self.runs.values()))
        self.bar.set_postfix_str(f"{done}/{done + sum(self.left.values())} least-squares runs", refresh=False)
        self._estimate()

    def _estimate(self) -> None:
        mean = {k: sum(v) / len(v) for k, v in self.runs.items() if v}
        mean.setdefault(True, mean.get(False))
        if any(self.left[k] and mean.get(k) is None for k in self.left):
            progress.set_total(self.bar, None)
        else:
            ahead = sum(self.left[k] * mean[k] for k in self.left if self.left[k])
            progress.set_total(self.bar, max(self.done, round(self.done - self.current + ahead)))

    def close(self) -> None:
        """The work is done: the total is what was done."""
        progress.set_total(self.bar, self.done)


def cmd_validate(args) -> int:
    with progress_bar(args, "validate", V.VALIDATE_STEPS + 1) as bar:
        res = V.validate(args.measured, ideal=args.ideal, progress=bar, kernel_layer=args.kernel_layer)
        stats = V.summarize(res.rows)
        paths = V.write_outputs(res, Path(args.out), stats)
        bar.update(1)
    for line in res.bad:
        print(f"dse.study: validate: bad row skipped: {line}", file=sys.stderr)
    print(V.report_text(res, stats))
    if args.ideal:
        bad = V.bound_violations(res.rows)
        print()
        if bad:
            print(f"Ideal bound broken by {len(bad)} row(s) (a bug in the model or in the row):")
            for r in bad:
                print(f"  {r['id']} (line {r['line']}) {r['metric']}: measured "
                      f"{display.quantity_text(r['metric'], r['measured'])}, bound "
                      f"{display.quantity_text(r['metric'], r['predicted'])}")
        else:
            print(f"Ideal bound holds: every measured throughput is at or below it and every measured latency "
                  f"at or above it ({len(res.rows)} rows)")
    print()
    for k, p in paths.items():
        print(f"  {k + ':':9s}{p}")
    return 0


def cmd_calibrate(args) -> int:
    if args.bands_only and args.engine:
        raise DseError("calibrate: --bands-only recomputes bands without a fit; --engine refits engines: give one")
    if args.bands_only:
        out = Path(args.out) if args.out is not None else C.DEFAULT_OUT
        data = C.recompute_bands(out)
        print(f"Bands of {out} recomputed from {C.residuals_path(out)} (no refit)")
        print("\n".join(C.bands_text(data)).lstrip("\n"))
        return 0
    if args.out is not None:            # before the fit, not after minutes of it
        out = output_file(args.out, "--out")
        if exists(out) and not is_regular_file(out):
            raise DseError(f"--out {shown_path(out)}: not a regular file (a device, a FIFO); give the name of a "
                           f"calibration file to write")
    if args.engine:
        return _refit(args)
    with progress_bar(args, "calibrate", None, unit="evaluation") as bar:
        progress = FitProgress(bar)
        cal = C.calibrate(args.measured, args.out, cross_validation=not args.no_cross_validation, progress=progress,
                          starts=args.starts, workers=args.workers, leave_out=tuple(args.leave_out),
                          fold_evaluations=args.fold_evaluations)
        progress.close()
        bar.set_description_str("calibrate (validating the new calibration)")
        files = cal.measured if isinstance(cal.measured, list) else [cal.measured]
        rows = [r for f in files for r in V.validate(f, calibration=cal.out).rows]
    print(C.report_text(cal))
    return _validated(rows, cal.out)


def _refit(args) -> int:
    """``calibrate --engine NAME ...``: the named engines' own values refitted (``dse.fit.refit``)."""
    with progress_bar(args, "calibrate --engine", None, unit="evaluation") as bar:
        progress = FitProgress(bar)
        r = R.refit(args.engine, args.measured, args.out, progress=progress, starts=args.starts, workers=args.workers,
                    cross_validation=not args.no_cross_validation and "source" in args.leave_out,
                    fold_evaluations=args.fold_evaluations)
        progress.close()
        bar.set_description_str("calibrate (validating the new calibration)")
        rows = [row for f in r.files for row in V.validate(f, calibration=r.out).rows]
    print(R.refit_text(r))
    return _validated(rows, r.out)


def _validated(rows: list, out: Path) -> int:
    """Print the new calibration ``out``'s error on the measured ``rows`` (validated through the
    evaluator) and how to use it; 0."""
    s = V.summarize(rows)["overall"]
    print(f"\nvalidated through the one evaluator with the new calibration: median APE {100 * s['median_ape']:.1f} %, "
          f"p90 {100 * s['p90_ape']:.1f} % over {s['n']} rows")
    if out.resolve() != calibration_file().resolve():
        print(f"use it: {CALIBRATION_ENV}={out} dse analyze ...   (or any other command)")
    return 0


COMMANDS = {"validate": cmd_validate, "calibrate": cmd_calibrate}
