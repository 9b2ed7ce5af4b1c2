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
