"""Progress with the time left on stderr for the long commands (issue 43): an Optuna study
with worker processes, ``analyze --simulate`` and ``calibrate``. With ``--progress`` (stderr is
not a terminal under pytest) the last frame of each bar reads total/total with a time-left
estimate; ``--quiet`` leaves stderr empty. The counts are checked against what the work is
(trials asked, requests times their output lengths), not against the code's own totals."""
from __future__ import annotations

import re

import pytest

from dse.study.cli import main
from dse.system.analysis import simulate_point
from dse.system.params import DEFAULTS

STUDY = """\
name: tiny-progress
space:
  hardware: [h100-sxm, b200]
  model: llama-2-70b
  weights: fp8
  activations: fp8
  kv: [fp8, fp16]
  prompt_len: 2048
  gen_len: 256
  batch: {min: 1, max: 64}
  memory_bandwidth: {min: 1.0e12, max: 1.6e13, scale: log}
objectives:
  output_tokens_per_s: max
  tpot_s: min
method: optuna
sampler: nsga2
trials: 120
population: 10
seed: 0
"""
#: a frame of a bar: done/total unit(s) [elapsed, time left ...]
FRAME = re.compile(r"(\d+)/(\d+) ([a-z ]+?)s? \[(\d\d:\d\d) elapsed, (\d\d:\d\d|\?) left")



def cli(capsys, *argv) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def frames(err: str, what: str) -> list[tuple[int, int, str]]:
    """(done, total, time left) of every frame of the bar named ``what`` in ``err``."""
    out = []
    for line in err.replace("\r", "\n").splitlines():
        m = FRAME.search(line)
        if line.startswith(what + ":") and m:
            out.append((int(m[1]), int(m[2]), m[5]))
    return out


def assert_ends_done(err: str, what: str, total: int) -> None:
    shown = frames(err, what)
    assert shown, err
    done, last_total, left = shown[-1]
    assert (done, last_total) == (total, total)
    assert left != "?"                         # an estimate, not "? left"
    assert [d for d, _, _ in shown] == sorted(d for d, _, _ in shown)     # never goes back


@pytest.mark.slow   # worker processes start (spawn) and run 120 trials
def test_an_optuna_study_with_workers_shows_its_trials(tmp_path, capsys, keep_signals):
    study = tmp_path / "tiny.yaml"
    study.write_text(STUDY)
    rc, _, err = cli(capsys, "run", study, "--out", tmp_path / "a", "--workers", "2", "--progress")
    assert rc == 0, err
    assert_ends_done(err, "optuna nsga2", 120)
    rc, _, err = cli(capsys, "run", study, "--out", tmp_path / "b", "--workers", "2", "--quiet")
    assert rc == 0 and err == ""


def test_simulate_counts_output_tokens_from_the_first_iteration(capsys):
    args = ("analyze", "--hardware", "h100-sxm", "--model", "llama-3.1-8b", "--concurrency", "8",
            "--prompt-len", "512", "--gen-len", "64", "--simulate", "40")
    rc, _, err = cli(capsys, *args, "--progress")
    assert rc == 0, err
    assert_ends_done(err, "simulate", 40 * 64)      # 40 requests of 64 output tokens each
    assert "40/40 requests" in err
    rc, _, err = cli(capsys, *args, "--quiet")
    assert rc == 0 and err == ""


@pytest.mark.parametrize("disaggregate", ["none", "1:1"])
def test_the_simulator_reports_every_output_token_once(disaggregate):
    """Every output token is reported by the iteration that produces it, closed and open loop,
    colocated and disaggregated: the reports add up to the requests' output lengths."""
    for extra in ({"concurrency": 6}, {"request_rate": 20.0}):
        calls, order = [], []
        cols = {**DEFAULTS, "hardware": "h100-sxm", "model": "llama-3.1-8b", "serving": "continuous",
                "prompt_len": 300, "gen_len": 17, "disaggregate": disaggregate, **extra}
        simulate_point(cols, 30, progress=lambda n: order.append("request"),
                       tokens=lambda n, total: (calls.append((n, total)), order.append("token") if n else None))
        assert sum(n for n, _ in calls) == 30 * 17
        assert {total for _, total in calls} == {30 * 17} and all(n >= 0 for n, _ in calls)
        # the first request needs 17 iterations: its tokens are reported before it finishes
        assert order.index("token") < order.index("request")


def test_calibrate_estimates_its_evaluations_as_runs_finish():
    """The total of calibrate's bar: unknown until a run finishes, then the evaluations done
    plus each run to come at the mean of the finished runs of its kind; done/done at the end."""
    from tqdm import tqdm

    from dse.study.calibration_cli import FitProgress
    bar = tqdm(total=None, disable=True)
    p = FitProgress(bar)
    p.plan(3, 2)                     # 3 cold starts, 2 warm folds
    p.update(4)
    assert bar.total is None         # nothing finished: no estimate
    p.update(6)
    p.run_done(False)                # a cold start of 10 evaluations
    assert bar.total == 10 + 2 * 10 + 2 * 10       # folds at the cold mean until one finishes
    for n in (20, 30):
        p.update(n)
        p.run_done(False)            # cold starts of 10, 20, 30: mean 20
    assert bar.total == 60 + 2 * 20
    p.update(5)
    p.run_done(True)                 # a fold of 5
    assert bar.total == 65 + 5
    p.update(7)
    assert bar.total == 65 + 5       # within the last fold: still the estimate
    p.run_done(True)
    p.close()
    assert p.done == bar.total == 72
