"""Invariants of the steady-state serving model over random served points, and its agreement
with the discrete-event simulator at outputs of 1-16 tokens.

The invariants hold whatever the load (physics, not fits):

- a closed loop's throughput never falls when its concurrency doubles (more requests in
  flight never make the engine slower: the extra ones at worst wait);
- Little's law: a closed loop of N requests serves X requests/s with a mean end-to-end
  latency of N / X;
- no throughput above what the hardware can do: every token (prompt and output) passes the
  model's weight matrices, 2 operations per weight, so tokens/s x 2 x weights <= the peak
  operations per second of the devices; and an iteration reads every weight once, so at most
  N output tokens (closed loop) come out per weight read: output tokens/s <= N x memory
  bandwidth / weight bytes per device.

All the random points go through one ``evaluate`` call (vectorized over points; about 40 s of
one core, so the tests are marked slow)."""
import numpy as np
import pytest

from dse import evaluate
from dse.system.analysis import simulate_point
from hwmodels.presets import load_device
from workloads.model import load_model

pytestmark = pytest.mark.usefixtures("fixed_calibration")

#: dense models on their hardware (model, hardware, devices, weight format, bytes a weight, peak format)
SYSTEMS = [
    ("llama-3.1-8b", "h100-sxm", 1, "fp8", 1, "fp8"),
    ("qwen2.5-7b-instruct", "a100-80gb", 1, "fp16", 2, "fp16"),
    ("llama-3.1-70b", "h100-sxm", 4, "fp8", 1, "fp8"),
    ("llama-3.1-8b", "l40s", 1, "fp16", 2, "fp16"),
]
#: closed loops (pairs at N and 2N) and open loops drawn
PAIRS, OPEN = 800, 500


def _draw(seed=41):
    """Random served points: closed loops in pairs (N, 2N) first, then open loops; columns
    for ``evaluate`` and each point's system index."""
    rng = np.random.default_rng(seed)
    n = 2 * PAIRS + OPEN
    system = np.concatenate([np.repeat(rng.integers(0, len(SYSTEMS), PAIRS), 2), rng.integers(0, len(SYSTEMS), OPEN)])
    prompt = np.concatenate([np.repeat(np.round(np.exp(rng.uniform(np.log(16), np.log(4096), PAIRS))), 2),
                             np.round(np.exp(rng.uniform(np.log(16), np.log(4096), OPEN)))]).astype(int)
    gen = np.concatenate([np.repeat(np.round(np.exp(rng.uniform(0, np.log(4096), PAIRS))), 2),
                          np.round(np.exp(rng.uniform(0, np.log(4096), OPEN)))]).astype(int)
    lengths = np.array(["fixed", "lognormal:sigma=0.5", "lognormal:sigma=1"])[
        np.concatenate([np.repeat(rng.integers(0, 3, PAIRS), 2), rng.integers(0, 3, OPEN)])]
    base = 2 ** rng.integers(0, 12, PAIRS)
    conc = np.concatenate([np.stack([base, 2 * base], 1).ravel(), np.zeros(OPEN, dtype=int)])
    rate = np.concatenate([np.zeros(2 * PAIRS), np.exp(rng.uniform(np.log(0.05), np.log(300), OPEN))])
    s = [SYSTEMS[i] for i in system]
    cols = {"model": [x[0] for x in s], "hardware": [x[1] for x in s], "devices": [x[2] for x in s],
            "weights": [x[3] for x in s], "activations": [x[3] for x in s], "kv": [x[3] for x in s],
            "prompt_len": prompt, "gen_len": gen, "lengths": list(lengths), "concurrency": conc,
            "request_rate": rate}
    assert n == len(prompt)
    return cols, system


@pytest.fixture(scope="module")
def drawn():
    cols, system = _draw()
    return cols, system, evaluate(cols)


@pytest.mark.slow
def test_enough_random_points_are_served(drawn):
    _, _, ev = drawn
    assert len(ev["feasible"]) >= 2000
    assert ev["feasible"].sum() >= 1500


@pytest.mark.slow
def test_throughput_never_falls_when_the_concurrency_doubles(drawn):
    _, _, ev = drawn
    x, ok = ev["requests_per_s"][:2 * PAIRS], ev["feasible"][:2 * PAIRS]
    lo, hi = x[0::2], x[1::2]
    both = ok[0::2] & ok[1::2]
    assert both.sum() >= 500
    fell = both & (hi < lo * (1 - 1e-6))
    assert not fell.any(), [(int(i), lo[i], hi[i]) for i in np.flatnonzero(fell)[:5]]


@pytest.mark.slow
def test_littles_law_holds_in_closed_loops(drawn):
    """N requests in flight at X requests/s stay N / X each, from arrival to their last token,
    the engine profile's fixed request overhead included (each request spends it in flight,
    before the scheduler sees it; it was added to the latencies outside the loop, so that
    X x end-to-end exceeded N by X x the overhead), within 2 %."""
    cols, system, ev = drawn
    closed = (cols["concurrency"] > 0) & ev["feasible"]
    assert closed.sum() >= 1000
    err = ev["requests_per_s"][closed] * ev["e2e_latency_s"][closed] / cols["concurrency"][closed] - 1
    assert np.all(np.abs(err) <= 0.02), np.sort(np.abs(err))[-5:]


@pytest.mark.slow
def test_no_throughput_above_the_compute_and_bandwidth_bounds(drawn):
    cols, system, ev = drawn
    ok = ev["feasible"]
    for i, (model, hw, _, _, per_weight, peak_format) in enumerate(SYSTEMS):
        at = ok & (system == i)
        if not at.any():
            continue
        m, d = load_model(model), load_device(hw)
        weight_bytes = ev["weights_bytes"][at]                  # each device's share
        shards = ev["tp_used"][at] * ev["pp_used"][at]
        # matrix weights: all but one vocab x hidden table (the embedding lookup is not a product)
        params = weight_bytes * shards / per_weight - m.vocab_size * m.hidden_size
        assert np.all(params > 0.5 * weight_bytes * shards / per_weight)
        peak = d.peak_ops_per_s[peak_format] * shards
        used = ev["total_tokens_per_s"][at] * 2.0 * params
        assert np.all(used <= peak), (model, hw, float(np.max(used / peak)))
        # an iteration reads each device's share of the weights once and gives at most one output
        # token per sequence in flight (closed loop: N), at most its token budget
        reads = d.memory_tiers[0].bandwidth_bytes_per_s / weight_bytes
        conc = cols["concurrency"][at]
        most = np.where(conc > 0, np.minimum(conc, 8192), 8192) * reads
        assert np.all(ev["output_tokens_per_s"][at] <= most * (1 + 1e-9)), (model, hw)


# ------------------------------------------------------------------ short outputs against the simulator

SHORT = {"model": "llama-3.1-8b", "hardware": "h100-sxm", "weights": "fp8", "activations": "fp8", "kv": "fp8",
         "prompt_len": 1024}
CLOSED = ([{**SHORT, "gen_len": g, "lengths": "fixed", "concurrency": n} for g in (1, 2, 4, 8, 16) for n in (12, 128)]
          + [{**SHORT, "gen_len": g, "lengths": "lognormal", "concurrency": n} for g in (1, 2, 4, 8, 16)
             for n in (12, 128)])
#: a closed loop whose waves of prompts fill the budget exactly but for the decoders' few tokens:
#: the scheduler packs them whole, 7, 7 and 2 (the model's equal waves of 8 had TTFT 25 % high)
EDGE = [{**SHORT, "gen_len": g, "lengths": "fixed", "concurrency": 16} for g in (4, 8, 16)]
OPEN_LOOPS = [{**SHORT, "gen_len": g, "lengths": lengths, "request_rate": 30.0}
              for lengths in ("fixed", "lognormal:sigma=0.5") for g in (1, 2, 4, 8, 16)]
#: known gaps, measured against the simulator (1,500 requests), each a failure expected until the
#: model is right there: lognormal lengths at 12 in flight and 4 output tokens, where the engine
#: is busy (``_busy``) a small share of the time: TTFT +12.2 % (+12.5 % and +15.5 % against two
#: runs of 6,000 requests), TTFT being what Little's law leaves of N / X after the decode steps
#: (throughput +0.3 %, TPOT -3.9 %); +2.0 % before the busy regime, +1.8 % with the throughput a
#: blend of the mixing regime's and the busy engine's, but that blend fell as the concurrency doubled
KNOWN: dict[str, str] = {}          # cases outside the tolerance, each with its error (none now)
#: requests simulated where 1,500 leave the simulator's own spread past the tolerance: lognormal
#: lengths (sigma 1: prompts up to 17,000 tokens) at 128 in flight and 16 output tokens, where the
#: engine is busy: four seeds of 1,500 requests gave a mean TTFT of 0.296-0.392 s, two of 6,000
#: 0.262 and 0.247 s (measured 2026-11-28, tests/data/calibration_fixed.yaml)
REQUESTS = {"g16-lognormal-c128": 6000}
CASES = CLOSED + EDGE + OPEN_LOOPS


def _name(c):
    load = f"c{c['concurrency']}" if "concurrency" in c else f"r{c['request_rate']:g}"
    return f"g{c['gen_len']}-{c['lengths'].split(':')[0]}-{load}"


@pytest.mark.slow
@pytest.mark.parametrize("cols", [pytest.param(c, marks=pytest.mark.xfail(strict=True, reason=KNOWN[_name(c)]))
                                  if _name(c) in KNOWN else c for c in CASES], ids=[_name(c) for c in CASES])
def test_short_outputs_agree_with_the_simulator(cols):
    """Outputs of 1-16 tokens, prompt 1,024: closed loops where the prompts' compute is the
    bottleneck (the issue's case: the model said TTFT 0.11 s where the simulator waits
    1.4-1.8 s, and 549 requests/s where it serves 71) and open loops at a rate that keeps the
    engine busy (the simulator's mean over two seeds: one seed's open loop moves by +-4 %).
    Throughput within 5 %, mean TPOT within 10 % and end-to-end latency within 10 %, mean
    TTFT within 12 % (an open loop's light load: an arrival finds the engine idle and starts
    at once, the model lets it wait for the rest of an iteration, +5-12 %): the tolerances of
    ``tests/test_serving.py``'s agreement test."""
    ev = evaluate(cols)
    seeds = (0,) if "concurrency" in cols else (0, 1)
    runs = [simulate_point(cols, REQUESTS.get(_name(cols), 1500), seed=s) for s in seeds]
    sim = {k: float(np.mean([r[k] for r in runs])) for k in runs[0]}
    pairs = [("requests_per_s", "requests_per_s"), ("ttft_s", "ttft_mean_s"), ("e2e_latency_s", "e2e_mean_s")]
    if np.isfinite(sim["tpot_mean_s"]):
        pairs.append(("tpot_s", "tpot_mean_s"))
    err = {a: ev[a][0] / sim[b] - 1 for a, b in pairs}
    limits = {"requests_per_s": 0.05, "ttft_s": 0.12, "tpot_s": 0.10, "e2e_latency_s": 0.10}
    assert all(abs(err[k]) <= limits[k] for k in err), {k: f"{v:+.1%}" for k, v in err.items()}


def test_latencies_stay_continuous_where_the_engine_turns_busy():
    """Lognormal lengths, 16 output tokens, 96-160 requests in flight: the closed loop goes from
    mixing to an engine full most of the time (the full engine holds about 127). The simulator's
    TTFT moves by a few % a request there (0.285 s at 127, 0.297 s at 128, 1,500 requests; TPOT
    0.110 and 0.111 s), so the model's may not jump: neighbouring concurrencies within 10 % in
    TTFT and TPOT (the regime switch once gave 0.402 s at 127 and 0.142 s at 128), and the
    throughput never falls as the concurrency grows."""
    n = np.arange(96, 161)
    ev = evaluate({**SHORT, "gen_len": 16, "lengths": "lognormal", "concurrency": list(n)})
    for k in ("ttft_s", "tpot_s"):
        step = ev[k][1:] / ev[k][:-1]
        assert np.all(np.abs(step - 1) <= 0.10), (k, n[1:][np.abs(step - 1) > 0.10])
    assert np.all(np.diff(ev["requests_per_s"]) >= -1e-9 * ev["requests_per_s"][1:])
