"""Continuous batching: the iteration model against the operator tables, the simulator's
bookkeeping, the steady-state model against the simulator, and the physics of load."""
from dataclasses import replace

import numpy as np
import pytest
from agreement import load_ladder, model_vs_simulator, requests_for

from dse import evaluate
from dse.core.efficiency import DEFAULT
from dse.core.roofline import OpArrays
from dse.core.simulator import EngineConfig, simulate
from dse.system.iteration import _interp_columns, iteration_model
from workloads import optable
from workloads.footprint import kv_cache_bytes_per_token
from workloads.model import load_model
from workloads.scenario import Scenario

#: the model's behaviour under a calibration that stays put when the shipped one is refitted
pytestmark = pytest.mark.usefixtures("fixed_calibration")

FIELDS = ("ops", "weight_bytes", "act_bytes", "kv_bytes", "comm_bytes", "p2p_bytes")
SMALL = {"model": "llama-3.1-8b", "hardware": "h100-sxm", "prompt_len": 512, "gen_len": 64, "weights": "fp8",
         "activations": "fp8", "kv": "fp8"}


# ------------------------------------------------------------------ the iteration model

@pytest.mark.parametrize("name,tp", [("llama-3.1-8b", 1), ("llama-3.1-70b", 4), ("qwen2.5-7b-instruct", 1)])
def test_iteration_is_the_decode_step_and_the_prefill_of_the_tables(name, tp):
    """Dense models: an iteration of b decode tokens over L keys each is the decode step of
    batch b at L keys, and one of a whole prompt is its prefill (unfused attention: every
    count is exact)."""
    m = load_model(name)
    it = iteration_model(m, 1000, "fp8", "fp8", "fp8", tp, False, 0.0)
    sc = Scenario.make(batch=24, prompt_len=700, gen_len=1, weights="fp8", activations="fp8", kv="fp8", tp=tp)
    dec = OpArrays.from_table(optable.decode_step(m, sc, 1300))
    pre = OpArrays.from_table(optable.prefill(m, replace(sc, batch=1)))
    a = it.arrays(24, 24 * 1300, 0, 0, 0)
    b = it.arrays(0, 0, 700, 700 * 699 / 2, 1)
    for f in FIELDS:
        np.testing.assert_allclose(getattr(a, f)[0], getattr(dec, f), rtol=1e-9, atol=1e-6, err_msg=f)
        np.testing.assert_allclose(getattr(b, f)[0], getattr(pre, f), rtol=1e-9, atol=1e-6, err_msg=f)


def test_a_mixture_of_experts_reads_the_experts_its_tokens_touch():
    m = load_model("mixtral-8x7b")
    it = iteration_model(m, 512, "fp16", "fp16", "fp16", 2, True, 228 * 1024.0)
    for b in (1, 4, 64):
        sc = Scenario.make(batch=b, prompt_len=512, gen_len=1, tp=2, flash_attention=True)
        ref = OpArrays.from_table(optable.decode_step(m, sc, 513, 228 * 1024.0)).weight_bytes
        np.testing.assert_allclose(it.arrays(b, b * 513, 0, 0, 0).weight_bytes[0], ref, rtol=1e-9)
    assert it.arrays(1, 513, 0, 0, 0).weight_bytes.sum() < it.arrays(64, 64 * 513, 0, 0, 0).weight_bytes.sum()


def test_weight_interpolation_is_numpys_to_the_bit():
    """The iteration model interpolates every growing operator's weight bytes at once
    (``_interp_columns``): the same numbers as ``np.interp`` column by column, at the knots, between
    them and outside them."""
    rng = np.random.default_rng(3)
    xp = np.array([2.0 ** k for k in range(15)])
    fp = np.cumsum(rng.random((15, 9)) * 1e6, axis=0)
    x = np.concatenate([rng.random(400) * 3e4, xp, [0.0, 0.5, 1e9]])
    want = np.stack([np.interp(x, xp, fp[:, k]) for k in range(fp.shape[1])], axis=1)
    assert np.array_equal(_interp_columns(x, xp, fp), want)


# ------------------------------------------------------------------ the simulator's bookkeeping

def _affine_step(d, dctx, c, pctx, ends):
    """A made-up iteration cost: 2 ms, 10 us per token, 1 ns per key attended."""
    return 2e-3 + 1e-5 * (d + c) + 1e-9 * (dctx + pctx)


def test_every_request_finishes_once_with_its_tokens_in_order():
    rng = np.random.default_rng(1)
    prompts, gens = rng.integers(10, 300, 400), rng.integers(1, 80, 400)
    arrivals = np.cumsum(rng.exponential(0.01, 400))
    res = simulate(_affine_step, EngineConfig(kv_blocks=200, kv_block=16, token_budget=256, max_running=32),
                   prompts, gens, arrivals=arrivals)
    assert res.completed == 400
    assert np.all(res.arrival <= res.admitted) and np.all(res.admitted < res.first_token)
    assert np.all(res.first_token <= res.finish)
    assert np.all((gens > 1) | (res.first_token == res.finish))
    assert res.preemptions > 0                        # 200 blocks of 16 cannot hold 32 such sequences


def test_closed_loop_keeps_the_concurrency_in_flight():
    res = simulate(_affine_step, EngineConfig(kv_blocks=10_000), [100] * 300, [20] * 300, concurrency=7)
    # a request arrives when another finishes: at any time 7 are in the system
    times = np.sort(np.concatenate([res.arrival, res.finish]))[1:-1]
    inside = [(np.sum(res.arrival <= t) - np.sum(res.finish <= t)) for t in times[::37]]
    assert max(inside) == 7 and min(inside) >= 6


def test_a_request_that_can_never_fit_is_refused():
    from basis.errors import DseError
    with pytest.raises(DseError, match="needs 7 KV blocks"):
        simulate(_affine_step, EngineConfig(kv_blocks=6, kv_block=16), [90], [10], concurrency=1)


# ------------------------------------------------------------------ physics of load

def test_concurrency_one_is_the_static_batch_of_one():
    ev = evaluate({**SMALL, "serving": ["static", "continuous"], "batch": 1})
    assert ev["tpot_s"][1] == pytest.approx(ev["tpot_s"][0], rel=2e-3)
    assert ev["ttft_s"][1] == pytest.approx(ev["ttft_s"][0], rel=2e-3)


def test_throughput_never_falls_with_concurrency_and_saturates_at_the_kv_capacity():
    conc = np.array([1, 2, 4, 16, 64, 256, 1024, 4096, 16384])
    cols = {**SMALL, "hardware": "l40s", "model": "llama-3.1-8b", "prompt_len": 4096, "gen_len": 256,
            "weights": "fp16", "activations": "fp16", "kv": "fp16", "concurrency": conc}
    ev = evaluate(cols)
    x = ev["output_tokens_per_s"]
    assert np.all(np.diff(x) >= -1e-9 * x[:-1])
    # saturated: the KV cache holds the running sequences, each its prompt and half its output
    m = load_model("llama-3.1-8b")
    per_token = kv_cache_bytes_per_token(m, Scenario.make(prompt_len=4096, gen_len=256))
    room = ev["capacity_bytes"][-1] - ev["weights_bytes"][-1] - ev["activation_bytes"][-1]
    held = ev["running_batch"][-1] * (4096 + 128 + 8) * per_token
    assert room - (4096 + 256) * per_token < held <= room
    assert ev["running_batch"][-1] == ev["running_batch"][-2] and x[-1] == x[-2]
    # past saturation the extra requests wait: TTFT grows by Little's law
    extra = (conc[-1] - conc[-2]) / ev["requests_per_s"][-1]
    assert ev["ttft_s"][-1] - ev["ttft_s"][-2] == pytest.approx(extra, rel=1e-9)
    assert ev["queue_s"][-1] > ev["queue_s"][-2] > 0


def test_chunked_prefill_costs_no_less_and_fits_where_a_whole_prompt_does_not():
    cols = {"model": "llama-3.1-405b", "hardware": "mi300x", "devices": 8, "batch": 1, "prompt_len": 128000,
            "gen_len": 150}
    ev = evaluate({**cols, "serving": ["static", "continuous", "continuous"], "prefill_chunk": [8192, 8192, 2048]})
    assert ev["feasible"].all()
    assert ev["ttft_s"][2] >= ev["ttft_s"][1] >= ev["ttft_s"][0]          # smaller chunks re-read more KV
    assert ev["activation_bytes"][1] < ev["activation_bytes"][0] / 8
    tight = {"model": "llama-3.1-70b", "hardware": "h100-sxm", "devices": 2, "batch": 1, "prompt_len": 120000,
             "gen_len": 100, "weights": "fp8", "kv": "fp8", "activations": "fp16", "flash_attention": False}
    # unfused, a chunk's score matrix spans its whole prefix (chunk x 120,000 keys a head): 8,192-token
    # chunks hold 60 GiB of it, 512-token ones 3.7 GiB, where the whole prompt's 120,000^2 never fits
    ev = evaluate({**tight, "serving": ["static", "continuous", "continuous"], "prefill_chunk": [8192, 8192, 512],
                   "max_running": 256})
    assert ev.reason_key(0) == "device_memory" and ev.reason_key(1) == "device_memory" and ev["feasible"][2]


def test_an_open_loop_past_capacity_is_saturated():
    cap = evaluate({**SMALL, "concurrency": 100000})["requests_per_s"][0]
    ev = evaluate({**SMALL, "request_rate": [0.5 * cap, 1.01 * cap]})
    assert ev["feasible"][0] and ev.reason_key(1) == "saturated"
    assert ev["requests_per_s"][0] == pytest.approx(0.5 * cap) and ev["requests_per_s"][1] == pytest.approx(cap)


# ------------------------------------------------------------------ the model against the simulator

MATRIX = [
    ({"model": "llama-3.1-8b", "hardware": "h100-sxm", "prompt_len": 512, "gen_len": 64, "weights": "fp8",
      "activations": "fp8", "kv": "fp8", "max_running": 48}, "chunked"),
    ({"model": "llama-3.1-70b", "hardware": "h100-sxm", "devices": 4, "prompt_len": 1024, "gen_len": 64,
      "weights": "fp8", "activations": "fp8", "kv": "fp8", "max_running": 48}, "chunked"),
    ({"model": "mixtral-8x7b", "hardware": "a100-80gb", "devices": 2, "prompt_len": 512, "gen_len": 48,
      "max_running": 32}, "chunked"),
    ({"model": "qwen3-8b", "hardware": "mi300x", "prompt_len": 2048, "gen_len": 48, "max_running": 32,
      "prefill_chunk": 0}, "prefill-first"),
]


#: TTFT at a concurrency equal to the running cap (the waves of prompts beside the decoders
#: settle a little differently in the simulator) is 10-12 % high; TPOT is within 3 % except
#: prefill-first at half load (-9 %)
TTFT_TOLERANCE, TPOT_TOLERANCE = 0.12, 0.10


@pytest.mark.slow
@pytest.mark.parametrize("cols,kind", MATRIX, ids=[f"{c['model']}-{k}" for c, k in MATRIX])
def test_steady_state_agrees_with_the_simulator(cols, kind):
    """Light load to past saturation: throughput within 5 %; mean TTFT and TPOT within 10 % at
    most points, with the known exceptions the tolerances below admit."""
    errors = []
    for key, v in load_ladder(cols):
        x, ttft, tpot = model_vs_simulator({**cols, key: v}, requests_for(key, v))
        what = f"{key} {v:g}: throughput {x:+.1%}, TTFT {ttft:+.1%}, TPOT {tpot:+.1%}"
        errors.append((what, abs(x) <= 0.05 and abs(ttft) <= TTFT_TOLERANCE and abs(tpot) <= TPOT_TOLERANCE))
    assert all(ok for _, ok in errors), [w for w, ok in errors if not ok]


def test_a_cache_that_holds_no_request_and_a_budget_below_the_running_limit_are_refused():
    from basis.errors import DseError
    ev = evaluate({**SMALL, "kv": "fp16", "concurrency": 2, "kv_block": [16, 2**20]})   # 2**20: the largest page
    assert ev["feasible"][0] and ev.reason_key(1) == "device_memory" and "less than one request" in ev.reason_text(1)
    with pytest.raises(DseError, match=r"study\.yaml: space: prefill_chunk: .*\(512\) must be at least max_running"):
        evaluate({**SMALL, "concurrency": 4, "prefill_chunk": 512}, where="study.yaml: space")


def test_one_request_cannot_hide_its_prefill_under_its_own_decode():
    """A static batch of one request under an engine that hides half of the shorter phase runs
    prefill then decode: the end-to-end latency is their sum; of 8 requests, 7 can decode while
    another prefills, so a batch of 8 hides 7/8 of that half."""
    point = {"model": "llama-3.1-8b", "hardware": "h100-sxm", "prompt_len": 1024, "gen_len": 256}
    eff = replace(DEFAULT, prefill_decode_overlap=0.5)
    one = evaluate({**point, "batch": 1}, efficiency=eff)
    assert one["e2e_latency_s"][0] == pytest.approx(one["ttft_s"][0] + one["tpot_s"][0] * 255, rel=1e-12)
    eight = evaluate({**point, "batch": 8}, efficiency=eff)
    ttft, decode = eight["ttft_s"][0], eight["tpot_s"][0] * 255
    hidden = ttft + decode - eight["e2e_latency_s"][0]
    assert hidden == pytest.approx(0.5 * 7 / 8 * min(ttft, decode), rel=1e-9)
