"""A finite run of N requests (``num_prompts``, vLLM's and SGLang's benchmark_serving --num-prompts) at a
request rate past what the design serves: its requests queue and drain (``dse.core.serving.burst_waits``)
instead of the endless open loop's saturation. Checked against a closed form of the queue (the places'
recurrence computed request by request) and against the discrete-event simulator, which runs the same N
requests and measures every one of them."""
from __future__ import annotations

import numpy as np
import pytest
from agreement import model_vs_simulator

from dse import evaluate
from dse.core.serving import burst_waits
from dse.study.cli import main

BASE = {"model": "llama-3.1-8b", "hardware": "h100-sxm", "prompt_len": 1024, "gen_len": 256, "max_running": 64,
        "weights": "fp8", "activations": "fp8", "kv": "fp8"}
#: N requests "all at once", as ``dse.fit.validate`` sends them
AT_ONCE = 1e12


def _recurrence(n: int, running: int, x: float, rate: float, prefill: float) -> np.ndarray:
    """Each request's wait, request by request: the first ``running`` queue for the prefill one after
    another (a D/D/1 queue of ``prefill`` seconds each); the i-th after them starts when its place's
    request before it ends, E = running / x seconds after that one started (its own wait included)."""
    t = np.arange(n) / rate
    start = t.copy()
    done_prefill = -np.inf
    for i in range(min(n, running)):
        done_prefill = max(t[i], done_prefill) + prefill
        start[i] = done_prefill - prefill
    for i in range(running, n):
        start[i] = max(t[i], start[i - running] + running / x)
    return start - t


@pytest.mark.parametrize("n,running,x,rate,prefill", [(640, 64, 14.8, AT_ONCE, 0.0), (500, 64, 14.8, 29.6, 0.0),
                                                      (40, 64, 14.8, AT_ONCE, 0.03), (60, 64, 14.8, 100.0, 0.03),
                                                      (3000, 128, 20.0, 25.0, 0.02)])
def test_waits_follow_the_places_recurrence(n, running, x, rate, prefill):
    wait, weight, last, rest = burst_waits(np.array([n]), np.array([running]), np.array([x]), np.array([rate]),
                                           np.array([prefill]))
    exact = _recurrence(n, running, x, rate, prefill)
    assert weight.sum() == pytest.approx(1.0, rel=1e-12)
    assert (weight * wait).sum() == pytest.approx(exact.mean(), rel=0.02, abs=1e-9)
    if n <= wait.shape[1]:                     # a small run: every request, exactly
        np.testing.assert_allclose(wait[0, :n], exact, rtol=1e-12, atol=1e-12)


def test_a_run_below_the_capacity_is_the_endless_open_loop():
    """Where the rate is below what the design serves, the number of requests changes nothing."""
    endless = evaluate({**BASE, "request_rate": 5.0})
    finite = evaluate({**BASE, "request_rate": 5.0, "num_prompts": 300})
    for k in ("ttft_s", "ttft_p90_s", "tpot_s", "e2e_latency_s", "requests_per_s", "running_batch"):
        assert finite[k][0] == endless[k][0], k


def test_an_endless_run_past_the_capacity_stays_saturated():
    ev = evaluate({**BASE, "request_rate": 30.0})
    assert not ev.feasible[0] and ev.reason_key(0) == "saturated"
    assert evaluate({**BASE, "request_rate": 30.0, "num_prompts": 300}).feasible[0]


def test_waits_grow_with_the_run_and_the_rate():
    ttft = [evaluate({**BASE, "request_rate": r, "num_prompts": n})["ttft_s"][0]
            for r, n in ((20.0, 500), (20.0, 1000), (40.0, 1000), (AT_ONCE, 1000))]
    assert ttft[0] < ttft[1] < ttft[2] < ttft[3]


#: model / simulator - 1 measured 2026-11-29 (TTFT mean, TTFT p90, E2E mean, requests/s): all at once
#: +0.5 / +0.0 / +0.7 / +1.0 %; 300 at 1.3x the capacity +7.6 / +9.6 / +2.6 / +5.5 %; 2000 at 30 requests/s
#: (2x) +4.2 / +3.7 / +3.5 / +0.2 %; 500 at once into a running cap of 1,024 (one turn: the prompts'
#: prefill queue alone) -3.3 / -5.1 / +3.2 % (TPOT +6.3 %)
@pytest.mark.slow
@pytest.mark.parametrize("cols,n", [({"request_rate": AT_ONCE}, 500), ({"request_rate": 19.2}, 300),
                                    ({"request_rate": 30.0}, 2000),
                                    ({"request_rate": AT_ONCE, "max_running": 1024}, 500)])
def test_finite_runs_agree_with_the_simulator(cols, n):
    point = {**BASE, **cols, "num_prompts": n}
    x, ttft, tpot = model_vs_simulator(point, n)
    assert abs(ttft) < 0.10 and abs(tpot) < 0.10 and abs(x) < 0.08, (x, ttft, tpot)


def test_analyze_names_the_run(capsys):
    rc = main(["analyze", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--max-running", "64",
               "--request-rate", "30", "--num-prompts", "2000"])
    out = capsys.readouterr().out
    assert rc == 0 and "2,000 requests in all" in out.splitlines()[0]


@pytest.mark.parametrize("bad", ["-1", "nan", "1.5", "abc", "1e300", "inf"])
def test_bad_num_prompts_is_one_line_exit_2(bad, capsys):
    rc = main(["analyze", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--request-rate", "30",
               "--num-prompts", bad])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and "--num-prompts" in err and "Traceback" not in err
