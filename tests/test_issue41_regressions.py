"""Issue 41 regressions: tracebacks and wrong numbers in evaluation and plotting, each with the
right answer and why."""
import subprocess
import sys
from pathlib import Path

import numpy as np

from dse import evaluate

ROOT = Path(__file__).resolve().parents[1]
BASE = {"model": "llama-3.1-8b", "prompt_len": 1024, "gen_len": 256}


def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dse.study", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


# ------------------------------------------------------------------ 1. SLOs without an interconnect

def test_slos_on_devices_without_a_link_are_infeasible_not_a_crash():
    """An RTX 4090 has no interconnect: two of them cannot run one engine, so the point is
    infeasible for ``interconnect`` and its goodput unknown (NaN); the one-device point beside
    it in the same sweep is still priced (a goodput > 0 at a 0.5 s TTFT SLO)."""
    ev = evaluate({**BASE, "hardware": ["rtx-4090"] * 2, "devices": [1, 2], "concurrency": 4, "slo_ttft": 0.5})
    assert list(ev["feasible"]) == [True, False]
    assert ev.reason_key(1) == "interconnect"
    assert ev["goodput"][0] > 0 and np.isnan(ev["goodput"][1])


def test_slos_without_a_link_refused_in_one_line_by_analyze():
    done = _cli("analyze", "--model", "llama-3.1-8b", "--hardware", "rtx-4090", "--devices", "2",
                "--concurrency", "4", "--slo-ttft", "0.5")
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == ["dse.study: error: hardware 'rtx-4090' has no interconnect "
                                                "to run over 2 --devices"]
