"""The steady-state serving model against the discrete-event simulator over the parallel layouts of
issue 44 (pipeline, expert parallelism with attention data-parallel ranks, context parallelism at
32k-128k prompts), each under two closed loops (4 requests, the running cap) and two open loops
(20 % and 50 % of the model's capacity): throughput within 5 %, mean TTFT and TPOT within 10 %.

The points outside are strict xfails carrying the measured errors (model / simulator - 1, 2026-11-28;
the long prompts' open loops after the decode iterations that follow one's own prompt started from
the chunks left waiting behind it, ``serving._Chain._after_own``, which brought three of their four
TPOTs inside from -21 to -56 %): they are the open gaps this matrix tracks, and one that closes fails here until its
mark is lifted. Both sides derive their iterations from one pricer (``dse.system.served.group_pricer``);
what differs is the scheduling each side assumes: the pipeline's streams run a closed loop's
prompt iterations as one phase, staggered at its edges (``dse.core.serving._pipeline_phase``: PP 2/4
at the running cap went from TTFT +16/+30 %, throughput -8/-11 % to inside when the fill was charged
to the phase's first iteration and the drain after its last instead of to every prompt iteration;
the full engine, ``serving._full``, one endless phase whose iterations all hold prompts, pays no fill:
PP 4 at the cap +4.7 -> +5.6 % throughput, TTFT +8.0 -> +2.8 %; PP 2 unchanged),
and 128k-token prompts under an open loop at half the capacity (TPOT +14.5 %, +24.8 % before the first
decode iterations after one's own prompt were followed through the chain one by one, ``serving.chain_excess``:
a decoder waits out the next prompts' chunks; the same at cp 1, tests/test_context_parallel.py: the serving
model's prefill-heavy regime, not context parallelism). CP 2 at the cap came inside (TTFT -15.0 -> +1.4 %,
2026-11-29) when a closed loop's wave of prompts longer than an iteration's budget counted the
iteration holding its last chunk whole, a full one where the next wave fills the rest of its budget
(``serving._waves``)."""
from __future__ import annotations

import pytest
from agreement import model_vs_simulator

from dse.system.evaluator import evaluate

FP8 = {"weights": "fp8", "activations": "fp8", "kv": "fp8"}
LAYOUTS = {
    "pp2": {"model": "llama-3.1-70b", "hardware": "h100-sxm", "tp": 2, "pp": 2, "prompt_len": 1024, "gen_len": 64,
            "max_running": 32, **FP8},
    "pp4": {"model": "llama-3.1-70b", "hardware": "h100-sxm", "tp": 2, "pp": 4, "prompt_len": 1024, "gen_len": 64,
            "max_running": 32, **FP8},
    "ep8-dp": {"model": "qwen3-30b-a3b", "hardware": "h100-sxm", "ep": 8, "prompt_len": 512, "gen_len": 64,
               "max_running": 32, **FP8},
    "cp2-32k": {"model": "llama-3.1-8b", "hardware": "h100-sxm", "cp": 2, "tp": 1, "prompt_len": 32768, "gen_len": 64,
                "max_running": 16, **FP8},
    "cp4-128k": {"model": "llama-3.1-8b", "hardware": "h100-sxm", "cp": 4, "tp": 1, "prompt_len": 131072,
                 "gen_len": 64, "max_running": 8, **FP8},
}
#: the loads: a closed loop of 4 requests, one at the running cap, open loops at 20 % and 50 % of capacity
LOADS = ("closed-4", "closed-cap", "open-0.2", "open-0.5")

#: requests the simulator runs for an open loop: 600 leave its own spread past the tolerance (32k-token
#: prompts on one H100 at 50 % load, seed 0: mean TTFT 2.06 s and TPOT 42.8 ms with 600 requests,
#: 2.21-2.28 s and 49.2-53.8 ms over three seeds of 3,000; 2026-11-28; PP 4 at 50 %: throughput +12.7 % at
#: 600 requests, +1.6 % at 2,000, the 600 requests' window of arrivals short against a request's 8 s in the
#: engine; EP 8 at 50 %: +5.0 % at 600, -2.0 % at 2,000; 2026-11-29)
OPEN_REQUESTS = 2000

#: (layout, load) -> the measured errors (throughput, TTFT, TPOT) of the points outside the bounds
GAPS = {
    ("pp4", "closed-cap"): "+5.6 % / +2.8 % / -6.9 % (the full engine's pass without the fill, ``serving._full``: "
                           "+4.7 % / +8.0 % / -6.9 % with the fill charged to every iteration)",
    ("pp4", "open-0.5"): "+1.6 % / -14.3 % / -5.7 % (2,000 requests; seeds 1 and 2: TTFT -12.3 %; at 600 requests "
                         "+12.7 % / -18.8 % / -12.9 %, the simulator's window too short). The gap is the simulator's "
                         "dispatch: a request joins the least-loaded stream (vLLM V0's virtual engines, ties to the "
                         "first), most often the one whose iteration just ended with a completion, so it waits "
                         "nearly a whole cycle (admission 103 ms, the model 83 ms); the simulator dispatching round "
                         "robin gives -0.5 % / +2.3 % / +8.7 %, at random +1.0 % / -41.1 % / -26.2 % (2026-11-29)",
    ("cp4-128k", "open-0.5"): "-2.7 % / +2.1 % / +14.5 % (2,000 requests; seeds 1 and 2: TPOT +19.2 %, +16.2 %; "
                              "-76.1 % TPOT before the decode iterations after one's own prompt started from the "
                              "chunks left waiting, +24.8 % while their excess decayed geometrically from the first "
                              "one's, not as the chain runs, ``serving.chain_excess``, 2026-11-29)",
}


def _cases():
    for name in LAYOUTS:
        for load in LOADS:
            gap = GAPS.get((name, load))
            marks = [pytest.mark.xfail(strict=True, reason=f"measured {gap}")] if gap else []
            yield pytest.param(name, load, marks=marks, id=f"{name}-{load}")


@pytest.mark.slow
@pytest.mark.parametrize("name,load", list(_cases()))
def test_model_agrees_with_the_simulator(name, load):
    cols = LAYOUTS[name]
    cap = evaluate({**cols, "concurrency": 100000})
    if load.startswith("closed"):
        key, v = "concurrency", 4 if load == "closed-4" else int(cap["running_batch"][0])
        requests = max(200, 8 * v)
    else:
        key, v = "request_rate", float(load.split("-")[1]) * cap["requests_per_s"][0]
        requests = OPEN_REQUESTS
    x, ttft, tpot = model_vs_simulator({**cols, key: v}, requests)
    assert abs(x) <= 0.05 and abs(ttft) <= 0.10 and abs(tpot) <= 0.10, \
        f"{name} {key} {v:.4g}: throughput {x:+.1%}, TTFT {ttft:+.1%}, TPOT {tpot:+.1%}"
