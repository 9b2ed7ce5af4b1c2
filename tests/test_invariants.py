"""Physical invariants of the one evaluator, checked with hypothesis against ``dse.evaluate``.

Every property compares the same design points with one knob changed, all else equal, on
the points feasible both ways: more compute, memory bandwidth, capacity, link bandwidth,
host-link bandwidth, PIM peak or PIM multiple never slows a design; a longer context or
wider KV cache never speeds decode up; the ideal roofline is never slower than the
calibrated model. Each example evaluates many points at once (hardware figures as arrays).
Plus the placement rule of PIM designs (``dispatch``) against brute force.
"""
from dataclasses import replace
from itertools import product

import numpy as np
import pytest
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st

from dse import evaluate
from dse.core.roofline import EXACT_PIM_OPERATORS, dispatch
from hwmodels.classes import device_class
from hwmodels.device import Device, PimUnit
from hwmodels.formats import WIDENING, get_format, matmul_compute_class
from hwmodels.presets import load_device

#: relative slack for float noise
TOL = 1e-9
#: points per example
N = 24

GPUS = ["h100-sxm", "a100-80gb", "mi300x", "tpu-v5e", "b200"]
#: a concurrent PIM that may run every PIM role: more operators than the exact placement search takes
CONCURRENT_ALL = replace(load_device("h100-sxm"), name="h100-pim-all", device_class="pim",
                         pim=PimUnit({"fp16": 100e12, "fp8": 200e12}, 8.0, ("attention", "gemv", "experts"), True))
PIMS = ["attacc", "gddr6-aim", "hbm-pim", CONCURRENT_ALL]
SPATIAL = ["groq-lpu", "sn40l"]
HARDWARE = GPUS + PIMS + SPATIAL
MODELS = ["llama-3.1-8b", "mistral-7b", "opt-6.7b", "mixtral-8x7b", "deepseek-v3"]
FORMATS = ["fp16", "bf16", "fp8", "int8", "fp6", "fp4", "int4", "nvfp4", "mxfp8", "mxfp4"]
#: a wider KV format of each narrower one
WIDER_KV = {"fp4": "fp8", "nvfp4": "fp8", "mxfp4": "mxfp8", "int4": "int8", "fp6": "fp8", "fp8": "fp16",
            "int8": "fp16", "mxfp8": "fp16", "bf16": "fp32", "fp16": "fp32"}


@st.composite
def scenarios(draw, hardware=HARDWARE):
    """(columns of N design points of one workload on one preset, the preset)."""
    hw = draw(st.sampled_from(hardware))
    d = hw if isinstance(hw, Device) else load_device(hw)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    w, a, kv = (draw(st.sampled_from(FORMATS)) for _ in range(3))
    cols = dict(hardware=hw, model=draw(st.sampled_from(MODELS)), weights=w, activations=a, kv=kv,
                batch=draw(st.integers(1, 64)), prompt_len=draw(st.integers(1, 8192)),
                gen_len=draw(st.integers(1, 512)),
                flash_attention=bool(d.onchip_buffer_bytes) and draw(st.booleans()),
                memory_bandwidth=d.memory.bandwidth_bytes_per_s * rng.uniform(0.3, 3, N),
                compute_scale=rng.uniform(0.3, 3, N))
    if device_class(d.device_class).sized_by_capacity:      # a fixed chip count: chips sized from capacity are not "all else equal"
        cols["devices"] = draw(st.sampled_from([8, 64, 256, 576]))
        cols["memory_capacity"] = d.memory.capacity_bytes * rng.uniform(1, 4, N)
    else:
        cols["devices"] = draw(st.sampled_from([1, 1, 2, 4, 8]))
        cols["memory_capacity"] = d.memory.capacity_bytes * rng.uniform(1, 50, N)
    if cols["devices"] > 1:
        cols["link_bandwidth"] = (d.interconnect.bandwidth_bytes_per_s if d.interconnect else 1e11) * rng.uniform(
            0.3, 3, N)
    if d.pim:
        cols["pim_multiple"] = rng.uniform(1, 16, N)
        cols["pim_peak"] = 10 ** rng.uniform(12, 15, N)
    if d.host_link and draw(st.booleans()):
        cols.update(offload=draw(st.sampled_from(["greedy", "weights=0.5", "kv=0.3,weights=0.2"])),
                    memory_capacity=d.memory.capacity_bytes * rng.uniform(0.05, 2, N),
                    host_link_bandwidth=d.host_link.bandwidth_bytes_per_s * rng.uniform(0.3, 3, N),
                    host_memory_capacity=1e14, overlap=draw(st.booleans()))
    # the roofline's invariants with power unlimited: under a power limit more bandwidth or a shorter
    # context can leave less power for compute, and a capped design runs a lower clock
    # (dse.system.evaluator._capped; its own properties: tests/test_power.py)
    cols["tdp_w"] = 1e6
    return cols, d


def _knobs(cols):
    """Resource columns of ``cols`` whose increase must not slow a design."""
    knobs = ["compute_scale", "memory_bandwidth", "memory_capacity", "peak"]
    knobs += [k for k in ("link_bandwidth", "host_link_bandwidth", "pim_multiple", "pim_peak") if k in cols]
    return knobs


def _raised(cols, d, knob, factor):
    """(columns before, columns after) raising ``knob`` by ``factor`` [N]."""
    if knob == "peak":         # the peak of the class the weight matmuls run in, from the preset's own figure
        c = matmul_compute_class(get_format(cols["activations"]), get_format(cols["weights"]))
        own = d.peak_ops_per_s.get(c, 0.0)
        assume(own > 0)
        return {**cols, f"peak_{c}": np.full(N, own)}, {**cols, f"peak_{c}": own * factor}
    return cols, {**cols, knob: cols[knob] * factor}


def _not_worse(before, after, keys, sign=1):
    """``after`` is not slower (sign 1) / not faster (sign -1) than ``before`` on the points feasible in both."""
    both = before.feasible & after.feasible
    for k in keys:
        x, y = before[k][both], after[k][both]
        bad = (y - x) * sign > TOL * np.abs(x)
        assert not bad.any(), (k, x[bad][:3], y[bad][:3], np.flatnonzero(both)[bad][:3])
    event("points compared: " + ("none" if not both.any() else "some" if not both.all() else "all"))
    return both.sum()


# ---------------------------------------------------------------- more resources never slow a design

@settings(max_examples=300, deadline=None)
@given(sc=scenarios(), data=st.data(), ideal=st.booleans())
def test_more_resources_never_slow_a_design(sc, data, ideal):
    cols, d = sc
    knob = data.draw(st.sampled_from(_knobs(cols)))
    factor = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1))).uniform(1.001, 4, N)
    before, after = _raised(cols, d, knob, factor)
    _not_worse(evaluate(before, ideal=ideal), evaluate(after, ideal=ideal), ("tpot_s", "ttft_s"))


@settings(max_examples=150, deadline=None)
@given(sc=scenarios(PIMS), data=st.data(), ideal=st.booleans())
def test_more_pim_resources_never_slow_a_pim_design(sc, data, ideal):
    cols, d = sc
    knob = data.draw(st.sampled_from(["pim_multiple", "pim_peak", "memory_bandwidth", "compute_scale", "peak"]))
    before, after = _raised(cols, d, knob, data.draw(st.floats(1.001, 4)))
    _not_worse(evaluate(before, ideal=ideal), evaluate(after, ideal=ideal), ("tpot_s", "ttft_s"))


# ---------------------------------------------------------------- more work never speeds decode up

@settings(max_examples=120, deadline=None)
@given(sc=scenarios(), extra=st.integers(1, 4096), ideal=st.booleans())
def test_longer_context_never_speeds_decode_up(sc, extra, ideal):
    cols, _ = sc
    longer = {**cols, "prompt_len": cols["prompt_len"] + extra}
    _not_worse(evaluate(cols, ideal=ideal), evaluate(longer, ideal=ideal), ("tpot_s",), sign=-1)


@settings(max_examples=150, deadline=None)
@given(sc=scenarios([h for h in HARDWARE if h is not CONCURRENT_ALL]), ideal=st.booleans())
def test_wider_kv_cache_never_speeds_decode_up(sc, ideal):
    # not on CONCURRENT_ALL: a KV format the PIM cannot compute takes attention off its list, and past
    # EXACT_PIM_OPERATORS operators the placement search runs over blocks, so the two workloads are
    # searched over different sets of placements (llama-3.1-8b fp16 -> fp32 KV: 2.5045 -> 2.4815 ms)
    cols, d = sc
    assume(cols["kv"] in WIDER_KV)
    wider = {**cols, "kv": WIDER_KV[cols["kv"]]}
    # a wider KV format may move attention to a faster compute class: fp4 activations x int4 KV compute
    # in fp4 (bf16 on a TPU v5e, which has no fp4), x int8 KV in int8 (native, twice the bf16 peak)
    for peaks in (d.peak_ops_per_s, d.pim.peak_ops_per_s if d.pim else {}):
        before, after = (_widened_peak(peaks, cols["activations"], c["kv"]) for c in (cols, wider))
        assume(after <= before)
    _not_worse(evaluate(cols, ideal=ideal), evaluate(wider, ideal=ideal), ("tpot_s",), sign=-1)


def _widened_peak(peaks, activations, kv):
    """ops/s of the class an activations x KV product runs in on a device with ``peaks`` (0: none)."""
    c = matmul_compute_class(get_format(activations), get_format(kv))
    return next((peaks[w] for w in WIDENING[c] if peaks.get(w, 0) > 0), 0.0)


# ---------------------------------------------------------------- the ideal roofline is an upper bound

@settings(max_examples=120, deadline=None)
@given(sc=scenarios())
def test_ideal_never_slower_than_calibrated(sc):
    cols, _ = sc
    _not_worse(evaluate(cols), evaluate(cols, ideal=True), ("tpot_s", "ttft_s"))


# ---------------------------------------------------------------- regressions (PIM placement)

@pytest.mark.parametrize("weights, kv, activations", [("nvfp4", "fp8", "nvfp4"), ("nvfp4", "fp8", "fp8"),
                                                      ("nvfp4", "nvfp4", "fp8"), ("fp8", "fp4", "fp8")])
def test_attacc_more_bandwidth_never_raises_tpot(weights, kv, activations):
    # an operator used to leave the PIM when the host's ridge moved with the bandwidth: 8.276 -> 8.570 ms
    ev = evaluate({"hardware": "attacc", "model": "deepseek-v3", "batch": 1, "prompt_len": 128, "gen_len": 128,
                   "weights": weights, "kv": kv, "activations": activations, "memory_capacity": 1e13,
                   "memory_bandwidth": np.array([12.6e12, 14.7e12])})
    assert ev.feasible.all()
    assert ev["tpot_s"][1] <= ev["tpot_s"][0] and ev["ttft_s"][1] <= ev["ttft_s"][0]


def test_attacc_concurrent_placement_is_not_per_operator_greedy():
    # "each operator where it finishes sooner" alone moved attention to the faster but busier host
    # here (concurrent PIM: step = max(host, PIM)): 6.12 -> 11.51 ms for 10 % more bandwidth
    bw = 1.176e13
    ev = evaluate({"hardware": "attacc", "model": "llama-3.1-8b", "batch": 238, "prompt_len": 3332, "gen_len": 488,
                   "weights": "fp8", "activations": "fp8", "kv": "fp8", "memory_capacity": 1e13,
                   "pim_multiple": 6.74, "pim_peak": 1.5e14, "memory_bandwidth": np.array([bw, 1.1 * bw])})
    assert ev.feasible.all() and ev["tpot_s"][1] <= ev["tpot_s"][0]


# ---------------------------------------------------------------- the placement rule against brute force

def _times(draw, n, o):
    t = st.floats(0, 10, allow_nan=False)
    host = np.array(draw(st.lists(t, min_size=n * o, max_size=n * o))).reshape(n, o)
    pim = np.array(draw(st.lists(t, min_size=n * o, max_size=n * o))).reshape(n, o)
    eligible = np.array(draw(st.lists(st.booleans(), min_size=n * o, max_size=n * o))).reshape(n, o)
    return host, pim, eligible


def _step(host, pim, on_pim, concurrent):
    h, p = np.where(on_pim, 0, host).sum(-1), np.where(on_pim, pim, 0).sum(-1)
    return np.where(concurrent, np.maximum(h, p), h + p)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), n=st.integers(1, 6), o=st.integers(1, 6))
def test_dispatch_is_the_best_placement(data, n, o):
    host, pim, eligible = _times(data.draw, n, o)
    concurrent = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    on_pim = dispatch(host, pim, eligible, concurrent)
    assert not (on_pim & ~eligible).any()
    got = _step(host, pim, on_pim, concurrent)
    best = np.full(n, np.inf)
    for bits in product((False, True), repeat=o):
        mask = np.array(bits)[None, :] & eligible
        best = np.minimum(best, _step(host, pim, mask, concurrent))
    assert np.allclose(got, best, rtol=1e-12, atol=0)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), o=st.integers(1, 2 * EXACT_PIM_OPERATORS + 3), concurrent=st.booleans())
def test_dispatch_faster_side_never_lengthens_the_step(data, o, concurrent):
    # any operator count (past EXACT_PIM_OPERATORS the concurrent search runs over blocks)
    host, pim, eligible = _times(data.draw, 1, o)
    f_host = np.array(data.draw(st.lists(st.floats(0.1, 1), min_size=o, max_size=o)))
    f_pim = np.array(data.draw(st.lists(st.floats(0.1, 1), min_size=o, max_size=o)))
    c = np.array([concurrent])
    before = _step(host, pim, dispatch(host, pim, eligible, c), c)
    h2, p2 = host * f_host, pim * f_pim
    after = _step(h2, p2, dispatch(h2, p2, eligible, c), c)
    assert after[0] <= before[0] * (1 + 1e-12)


def test_pim_placement_of_a_point_does_not_depend_on_the_others():
    # concurrent PIMs of two kinds (attention only; every role, past the exact search) in one kernel call
    hw = np.array(["attacc", CONCURRENT_ALL, "gddr6-aim", "attacc", CONCURRENT_ALL], dtype=object)
    bw = np.array([3e12, 4e12, 1e12, 5e12, 6e12])
    common = dict(model="deepseek-v3", weights="fp8", activations="fp8", kv="fp8", batch=8, prompt_len=2048,
                  gen_len=64, memory_capacity=1e13)
    together = evaluate({**common, "hardware": hw, "memory_bandwidth": bw})
    alone = [evaluate({**common, "hardware": h, "memory_bandwidth": b}) for h, b in zip(hw, bw)]
    assert together.feasible.all()
    for k in ("tpot_s", "ttft_s"):
        assert np.allclose(together[k], [a[k][0] for a in alone], rtol=1e-12, atol=0)
