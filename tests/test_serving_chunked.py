"""Chunked prefill with a small token budget against the simulator (issue 48's case: Llama-2-70B on
four A100s with 512-token chunks, where the steady-state model was 24-42 % below the simulator on
TTFT and 17-33 % on TPOT). A prompt cut into n chunks comes to the iteration chain as n chunks at
once (``serving._Chain``): its whole prompt is priced, and the queue it joins varies as batches do.
Tolerances of the agreement matrix: throughput within 5 %, mean TTFT and TPOT within 10 %."""
from __future__ import annotations

import pytest
from agreement import model_vs_simulator

from dse import evaluate

BASE = {"hardware": "a100-80gb", "model": "llama-2-70b", "devices": 4, "tp": 4, "serving": "continuous",
        "prompt_len": 1024, "gen_len": 256, "weights": "fp16", "activations": "fp16", "kv": "fp16",
        "max_running": 128}
#: (chunk tokens, lengths, share of the engine's capacity offered as a Poisson rate)
CASES = [(512, "fixed", 0.3), (512, "fixed", 0.6), (256, "fixed", 0.6), (512, "lognormal", 0.3)]


@pytest.mark.slow
@pytest.mark.parametrize("chunk,lengths,load", CASES, ids=[f"{c}-{s}-{u}" for c, s, u in CASES])
def test_small_chunks_agree_with_the_simulator(chunk, lengths, load):
    cols = {**BASE, "prefill_chunk": chunk, "lengths": lengths}
    capacity = evaluate({**cols, "concurrency": 100000})["requests_per_s"][0]
    x, ttft, tpot = model_vs_simulator({**cols, "request_rate": load * capacity}, 800)
    assert abs(x) < 0.05 and abs(ttft) < 0.10 and abs(tpot) < 0.10, (x, ttft, tpot)


#: 32k-token prompts on 8,192-token chunks (five iterations each) under an open loop on one H100:
#: the engine is mostly prefilling, and a request's 63 decode iterations start right after its own
#: prompt, when the chunks of the prompts that arrived meanwhile are still waiting (FCFS) and keep
#: them long. Priced from a random iteration instead, the model's TPOT was 33 % (20 % load) and 60 %
#: (50 %) below the simulator's; now at 50 %: throughput -1.3 %, TTFT -2.8 %, TPOT -3.9 % (2026-11-28;
#: 20 % is the matrix's cp2-32k-open-0.2 in tests/test_parallel_agreement.py). The simulator runs
#: 3,000 requests: 600 leave its own spread past the tolerance (mean TTFT 2.06 s against 2.21-2.28 s
#: over three seeds of 3,000).
LONG = {"model": "llama-3.1-8b", "hardware": "h100-sxm", "tp": 1, "prompt_len": 32768, "gen_len": 64,
        "max_running": 16, "weights": "fp8", "activations": "fp8", "kv": "fp8"}


@pytest.mark.slow
def test_long_prompts_decode_behind_the_next_prompts_chunks():
    capacity = evaluate({**LONG, "concurrency": 100000})["requests_per_s"][0]
    x, ttft, tpot = model_vs_simulator({**LONG, "request_rate": 0.5 * capacity}, 3000)
    assert abs(x) < 0.05 and abs(ttft) < 0.10 and abs(tpot) < 0.10, (x, ttft, tpot)


#: prompts 2.5 budgets long in a closed loop with room to spare: a prompt's first token comes as the
#: iteration holding its last, half-budget chunk ends, an iteration of that chunk alone (nothing waits
#: to fill the rest of its budget), after two full ones; the cycle holds those three and the decode
#: iterations. The model charged that iteration as half a full one (at 1, 3 and 6 requests TTFT
#: -0.19 %, throughput +0.1 to -0.4 %, TPOT up to +0.5 %; at the running cap, where the next prompt
#: fills the rest, TTFT -15 %: tests/test_parallel_agreement.py's cp2-32k-closed-cap); the simulator
#: prices the same iterations one by one, its steady state past a few cycles.
@pytest.mark.parametrize("concurrency,requests", [(1, 10), (3, 120), (6, 200)])
def test_a_prompt_past_the_budget_waits_for_its_last_chunks_iteration(concurrency, requests):
    point = {**LONG, "prompt_len": 20480, "gen_len": 32, "prefill_chunk": 8192, "concurrency": concurrency}
    errors = model_vs_simulator(point, requests)
    assert max(abs(e) for e in errors) < 1e-6, errors


#: prompts of 0.6 budgets at the running cap: the model packs one whole prompt an iteration (the
#: greedy packing of ``serving._waves``, which holds for 1,024-token prompts), TTFT 0.157 s; the
#: simulator keeps pairs of prompts that arrived together, the second cut across two iterations
#: (TTFT 0.25 and 0.47 s), cycle after cycle: the cut prompt's first token comes with the next
#: one's, so both come back together. Measured 2026-11-29: throughput +1.0 %, TTFT -39.5 %, TPOT +3.1 %.
@pytest.mark.xfail(strict=True, reason="measured +1.0 % / -39.5 % / +3.1 %: the simulator's prompts stay paired")
def test_prompts_of_most_of_a_budget_at_the_running_cap():
    point = {**LONG, "prompt_len": 5000, "gen_len": 32, "prefill_chunk": 8192, "concurrency": 16}
    x, ttft, tpot = model_vs_simulator(point, 200)
    assert abs(x) < 0.05 and abs(ttft) < 0.10 and abs(tpot) < 0.10, (x, ttft, tpot)
