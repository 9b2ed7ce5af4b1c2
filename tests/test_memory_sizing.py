"""Two wrong memory figures of issue 41, each against a closed form: a static batch sized its
prefill activations for the whole prompt where the engine prefills in chunks, and under
continuous batching ``kv_cache_bytes`` was the whole page pool rather than the requests' cache."""
from __future__ import annotations

import numpy as np
import pytest

from dse import evaluate
from workloads.footprint import kv_cache_bytes_per_token
from workloads.model import load_model
from workloads.scenario import Scenario

GiB = 2**30
M8 = load_model("llama-3.1-8b")        # hidden 4,096, intermediate 14,336, 32 heads, 8 K/V heads
FP16 = 2


def mlp_live_bytes(tokens: int) -> float:
    """The largest live set of an 8B prefill of ``tokens`` tokens under fused attention: the gated
    MLP's SiLU-and-multiply reads the gate and up outputs (2 x tokens x intermediate) and writes
    tokens x intermediate, beside the residual stream (tokens x hidden), all FP16."""
    return (3 * tokens * M8.intermediate_size + tokens * M8.hidden_size) * FP16


def test_a_long_prompt_prefilled_in_chunks_holds_one_chunks_activations():
    """vLLM prefills 8,192 tokens an iteration (max_num_batched_tokens), so a static batch of one
    120,000-token prompt holds one chunk's activations, 8,192 x (3 x 14,336 + 4,096) x 2 bytes =
    0.72 GiB, not the whole prompt's 10.5 GiB: on a 24 GiB RTX 4090 (FP8 weights and KV cache)
    it fits under vLLM (even with its 10 % kept back) where the whole prompt is refused."""
    cols = {"model": "llama-3.1-8b", "hardware": "rtx-4090", "batch": 1, "prompt_len": 120000, "gen_len": 128,
            "weights": "fp8", "kv": "fp8", "activations": "fp16"}
    ev = evaluate({**cols, "engine": ["vllm", "default"]})
    assert ev["activation_bytes"][0] == pytest.approx(mlp_live_bytes(8192), rel=1e-12)
    assert ev["activation_bytes"][1] == pytest.approx(mlp_live_bytes(120000), rel=1e-12)
    assert ev["feasible"][0] and ev.reason_key(1) == "device_memory"


def test_a_batch_of_prompts_is_chunked_across_its_sequences():
    """The chunk counts the batch's tokens: 8 prompts of 1,024 tokens are exactly one 8,192-token
    iteration (whole-prefill sizing), 16 of them are two, each holding 8,192 tokens' activations."""
    ev = evaluate({"model": "llama-3.1-8b", "hardware": "h100-sxm", "batch": [8, 16], "prompt_len": 1024,
                   "gen_len": 128, "engine": "vllm"})
    assert ev["activation_bytes"][0] == pytest.approx(mlp_live_bytes(8192), rel=1e-12)
    assert ev["activation_bytes"][1] == pytest.approx(mlp_live_bytes(8192), rel=1e-12)
    whole = evaluate({"model": "llama-3.1-8b", "hardware": "h100-sxm", "batch": 16, "prompt_len": 1024,
                      "gen_len": 128})
    assert whole["activation_bytes"][0] == pytest.approx(mlp_live_bytes(16384), rel=1e-12)


def test_vllm_keeps_a_whole_chunks_activations_back_whatever_the_prompts():
    """vLLM sizes its KV cache after a profiling pass of max_num_batched_tokens (8,192) dummy
    tokens, so even a 128-token prompt leaves 8,192 x (3 x 14,336 + 4,096) x 2 bytes = 0.72 GiB
    of activations kept back, in a static batch and under continuous batching alike; SGLang
    (activations in its 12 % share) and a point naming no engine hold the prompt's own."""
    base = {"model": "llama-3.1-8b", "hardware": "h100-sxm", "prompt_len": 128, "gen_len": 128}
    for load in ({"batch": 1}, {"concurrency": 4}):
        ev = evaluate({**base, **load, "engine": ["vllm", "sglang", "default"]})
        assert ev["activation_bytes"][0] == pytest.approx(mlp_live_bytes(8192), rel=1e-12)
        assert ev["activation_bytes"][1] == ev["activation_bytes"][2] < mlp_live_bytes(256)


def test_an_unfused_chunk_holds_its_score_matrix_against_the_whole_prompt():
    """llama.cpp computes a prompt 512 tokens a pass (n_ubatch) with unfused attention: the last
    pass's softmax reads and writes 32 heads x 512 queries x 16,384 keys of FP16 scores,
    2 x 32 x 512 x 16,384 x 2 bytes = 1 GiB, beside 512 tokens of residual stream; the whole
    prompt's score matrix would be 32 times that."""
    ev = evaluate({"model": "llama-3.1-8b", "hardware": "h100-sxm", "batch": 1, "prompt_len": 16384,
                   "gen_len": 16, "engine": ["llama.cpp", "default"], "flash_attention": False})
    scores = 2 * M8.num_heads * 512 * 16384 * FP16
    assert ev["activation_bytes"][0] == pytest.approx(scores + 512 * M8.hidden_size * FP16, rel=1e-12)
    assert ev["activation_bytes"][1] == pytest.approx(2 * M8.num_heads * 16384**2 * FP16
                                                      + 16384 * M8.hidden_size * FP16, rel=1e-12)


def test_kv_cache_bytes_under_continuous_batching_is_the_requests_cache():
    """A closed loop of 8 requests of 1,024 + 256 tokens holds 8 x ceil(1,280 / 16) pages of 16
    tokens of K and V, 8 x 1,280 x 128 KiB = 1.25 GiB, whatever the pool the rest of the memory
    makes (``kv_pool_bytes``, 65 GiB here); a loop of more requests than the pool holds holds the
    pool; an open loop, its steady state's mean running batch (Little's law: about 2.6 requests at
    1 request/s, 75 at 10/s) times the same 80 pages each."""
    per_token = kv_cache_bytes_per_token(M8, Scenario.make(prompt_len=1024, gen_len=256))
    assert per_token == 32 * 8 * 128 * 2 * FP16                  # 128 KiB
    base = {"model": "llama-3.1-8b", "hardware": "h100-sxm", "prompt_len": 1024, "gen_len": 256}
    ev = evaluate({**base, "concurrency": [8, 10**6]})
    assert ev["kv_cache_bytes"][0] == 8 * np.ceil(1280 / 16) * 16 * per_token == 1.25 * GiB
    assert ev["kv_pool_bytes"][0] > 60 * GiB
    assert ev["kv_cache_bytes"][1] == ev["kv_pool_bytes"][1]
    assert ev["memory_bytes"][0] == pytest.approx(ev["weights_bytes"][0] + ev["activation_bytes"][0] + 1.25 * GiB)
    odd = evaluate({**base, "gen_len": 250, "concurrency": 8})          # 1,274 tokens: 80 whole pages
    assert odd["kv_cache_bytes"][0] == 8 * 80 * 16 * per_token
    rate = evaluate({**base, "request_rate": [1.0, 10.0]})
    assert rate["kv_cache_bytes"] == pytest.approx(rate["running_batch"] * 80 * 16 * per_token, rel=1e-12)
    assert rate["kv_cache_bytes"][0] < 0.5 * GiB < 5 * GiB < rate["kv_cache_bytes"][1] < rate["kv_pool_bytes"][1]
    assert rate["memory_bytes"] == pytest.approx(rate["weights_bytes"] + rate["activation_bytes"]
                                                 + rate["kv_cache_bytes"], rel=1e-12)
    static = evaluate({**base, "batch": 8})                                # a static batch: unchanged
    assert static["kv_cache_bytes"][0] == 8 * 1280 * per_token and np.isnan(static["kv_pool_bytes"][0])
