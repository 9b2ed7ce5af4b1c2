"""The device memory a serving engine keeps back from the model (issue 41: a model could "fit"
with 0.8 GiB to spare and no engine reserve). Each expectation is the engine's documented rule,
written out in closed form from its cited default (configs/engines.yaml)."""
from __future__ import annotations

import re

import numpy as np
import pytest

from basis.errors import DseError
from dse import evaluate
from dse.core.engines import _profiles, get_engine
from workloads.footprint import kv_cache_bytes_per_token
from workloads.model import load_model
from workloads.scenario import Scenario

GiB = 2**30
H100 = 80 * GiB                                        # h100-sxm's HBM3
POINT = {"model": "llama-3.1-8b", "hardware": "h100-sxm", "batch": 8, "prompt_len": 1024, "gen_len": 256}


def test_each_engine_keeps_back_its_documented_share():
    """vLLM: gpu_memory_utilization 0.9 of the device's memory, so 10 % of 80 GiB = 8 GiB kept back.
    SGLang: mem_fraction_static 0.88 of the device holds weights and KV pool; the other 12 % holds
    its activations, so what it keeps back beyond them is 0.12 x 80 GiB - activations.
    TensorRT-LLM: free_gpu_memory_fraction 0.9 of what weights and activations leave, so 10 % of
    (80 GiB - weights - activations). TGI: cuda-memory-fraction 1.0, nothing. A point that names no
    engine keeps the generic footprint: nothing kept back."""
    ev = evaluate({**POINT, "engine": ["vllm", "sglang", "trt-llm", "tgi", "default"]})
    reserve, w, a = ev["engine_reserve_bytes"], ev["weights_bytes"], ev["activation_bytes"]
    assert ev["capacity_bytes"][0] == H100
    assert reserve[0] == pytest.approx(0.1 * H100, rel=1e-12)
    assert reserve[1] == pytest.approx(0.12 * H100 - a[1], rel=1e-12)
    assert reserve[2] == pytest.approx(0.1 * (H100 - w[2] - a[2]), rel=1e-12)
    assert reserve[3] == 0 and reserve[4] == 0
    assert ev["feasible"].all()


def test_a_footprint_that_fits_the_device_but_not_the_engines_share_is_refused():
    """The largest static batch that fits under vLLM holds weights + KV + activations within 90 %
    of the device (72 GiB of 80), one more sequence does not, though it fits the whole 80 GiB under
    an engine that prefills in the same 8,192-token chunks and keeps nothing back (LMDeploy): the
    issue's 'fits with 0.8 GiB to spare'."""
    cols = {**POINT, "prompt_len": 4096, "gen_len": 1024, "batch": "max"}
    ev = evaluate({**cols, "engine": ["vllm", "lmdeploy"]})
    b_vllm, b_whole = ev["batch_used"]
    assert ev["memory_bytes"][0] <= 0.9 * H100 * (1 + 1e-12) and ev["memory_bytes"][1] <= H100 * (1 + 1e-12)
    assert b_whole > b_vllm + 1
    over = evaluate({**cols, "batch": int(b_vllm) + 1, "engine": ["vllm", "lmdeploy"]})
    assert over.reason_key(0) == "device_memory" and over["feasible"][1]
    assert over["memory_bytes"][0] > 0.9 * H100


def test_the_paged_pool_is_what_the_engines_share_leaves():
    """Under continuous batching vLLM's KV pool is every page that fits in
    0.9 x 80 GiB - weights - one iteration's activations (vllm/v1/worker: available KV memory =
    requested memory - non-KV peak), in 16-token pages of K and V bytes."""
    ev = evaluate({**POINT, "concurrency": 8, "engine": ["vllm", "default"]})
    per_token = kv_cache_bytes_per_token(load_model("llama-3.1-8b"), Scenario.make(prompt_len=1024, gen_len=256))
    for j, share in enumerate((0.9, 1.0)):
        left = share * H100 - ev["weights_bytes"][j] - ev["activation_bytes"][j]
        assert ev["kv_pool_bytes"][j] == np.floor(left / (16 * per_token)) * 16 * per_token
    # vLLM's pool is smaller by its 8 GiB and by the whole 8,192-token chunk it profiles
    a = ev["activation_bytes"]
    assert ev["kv_pool_bytes"][1] - ev["kv_pool_bytes"][0] == pytest.approx(0.1 * H100 + a[0] - a[1],
                                                                             abs=16 * per_token)


def test_engine_memory_figures_are_checked_and_cited(tmp_path):
    """A share of memory outside (0, 1], or a figure without its source, is refused in one line
    naming the file's key."""
    body = """default_engine: e
engines:
  e:
    label: e
    match: 'e'
    batching: inflight
    graphs: true
    attention: fused
    gqa_kv_sharing: true
    allreduce: one-shot
    memory: {MEMORY}
    sources: {batching: b, graphs: g, attention: a, allreduce: r{MORE}}
"""
    cases = {"{utilization: 1.5}": ("", "engines.e.memory.utilization: expected a share of memory in (0, 1]"),
             "{utilization: 0.9}": ("", "engines.e.sources: every attribute needs a source; missing: utilization"),
             "{prefill_chunk: -1}": (", prefill_chunk: c", "engines.e.memory.prefill_chunk: expected a whole number"),
             "{share_of: total}": ("", "engines.e.memory.share_of: expected one of device, free"),
             "{reserve: 1}": ("", "engines.e.memory: unknown key(s) reserve")}
    for i, (memory, (more, said)) in enumerate(cases.items()):
        path = tmp_path / f"engines{i}.yaml"
        path.write_text(body.replace("{MEMORY}", memory).replace("{MORE}", more))
        with pytest.raises(DseError, match=re.escape(said)) as e:
            _profiles(str(path))
        assert "\n" not in str(e.value)


def test_default_is_the_default_engines_costs_with_the_generic_footprint():
    """'default' prices with vLLM's costs but the generic footprint (no share kept back, whole
    prompts): naming vllm is what asks for its memory rule."""
    assert get_engine("default").name == "vllm"
    assert get_engine("default").memory.utilization is None and get_engine("default").memory.prefill_chunk == 0
    assert get_engine("vllm").memory.utilization == 0.9 and get_engine("vllm").memory.prefill_chunk == 8192


def test_a_dataflow_machine_keeps_nothing_back_under_any_engine():
    """A spatial chip runs a compiled program, not a serving engine: naming vLLM on Groq must not
    keep a whole 8,192-token chunk's activations back (the residual add's two inputs and output
    beside the residual stream, 8,192 x 4 x 4,096 x 2 bytes = 256 MiB, more than a 230 MiB chip
    holds, which would leave no layout). Every engine lays it out on the same chips, sized by the
    rule its check applies (both read ``feasibility.engine_memory``)."""
    ev = evaluate({"model": "llama-3.1-8b", "hardware": "groq-lpu", "batch": 1, "engine": ["vllm", "default", "groq"]})
    assert 8192 * 4 * 4096 * 2 == 256 * 2**20 > ev["capacity_bytes"][0]
    assert ev["feasible"].all()
    assert len(set(ev["devices"].tolist())) == 1 and (ev["engine_reserve_bytes"] == 0).all()
