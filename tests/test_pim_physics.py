"""Near-memory (PIM) priced by its own physics, each check against an expectation written here:

- a PIM never changes its host's prefill (exact equality, any host, any model, any PIM figures);
- a decode attention operator the PIM runs costs the closed form
  max(ops / (PIM peak x f), KV and weight bytes / (units x unit bandwidth x f) + activation bytes /
  (bus x f)) + mode switches x switch time + coordination, f the host's achieved attention
  fraction of its own stream (the PIM's units run on the commands the host issues);
- a PIM-attached design is never faster than the ideal bandwidth ratio allows: the internal
  bandwidth over the bus (a blocked host), one more bus' worth when the host overlaps it.
"""
from dataclasses import replace

import numpy as np
import pytest

from dse import evaluate
from dse.core import operator_cost
from dse.core.efficiency import IDEAL, Efficiency
from dse.core.roofline import OpArrays, op_costs
from dse.system.hardware import system_arrays
from hwmodels.device import PimUnit
from hwmodels.presets import load_device
from workloads import optable
from workloads.model import load_model
from workloads.scenario import Scenario

HOSTS = ["h100-sxm", "a100-80gb", "mi300x", "l40s", "b200", "tpu-v5e"]
MODELS = ["llama-2-7b", "llama-3.1-8b", "mixtral-8x7b", "qwen2.5-7b-instruct", "deepseek-v2-lite"]


def _attached(host, multiple=8.0, peak=30e12, operators=("attention", "gemv"), concurrent=False,
              switch_s=48e-9, switches=4, coordination_s=176e-9):
    """``host`` with PIM units in its memory: every figure a parameter of the test."""
    d = load_device(host) if isinstance(host, str) else host
    bw = d.memory.bandwidth_bytes_per_s
    units = 1024.0
    return replace(d, name=f"{d.name}+pim", device_class="pim",
                   pim=PimUnit({"fp16": peak, "bf16": peak, "fp8": peak}, multiple, tuple(operators), concurrent,
                               units=units, unit_bandwidth_bytes_per_s=multiple * bw / units,
                               mode_switch_s=switch_s, mode_switches=switches, coordination_s=coordination_s))


def _alone(pim_device):
    """The host of a shipped PIM preset without its PIM units."""
    return replace(pim_device, name=f"{pim_device.name}-host", device_class="gpu", pim=None)


# ---------------------------------------------------------------- the host's prefill is its own

@pytest.mark.parametrize("model", MODELS)
def test_pim_never_changes_the_hosts_prefill(model):
    rng = np.random.default_rng(sum(map(ord, model)))
    hosts = [load_device(h) for h in HOSTS]
    pims = [_attached(h, multiple=float(rng.uniform(1, 16)), peak=float(rng.uniform(1e12, 2e15)),
                      concurrent=bool(rng.integers(2)), switch_s=float(rng.uniform(0, 1e-6)),
                      coordination_s=float(rng.uniform(0, 1e-5)),
                      operators=(("attention",), ("gemv",), ("attention", "gemv", "experts"))[rng.integers(3)])
            for h in hosts]
    n = 24
    # power unlimited: a PIM design's power is not modelled (no cited in-bank access energy), so it is
    # never capped, while its host alone may be (dse.system.evaluator._capped)
    cols = {"model": model, "batch": rng.choice([1, 4, 32, 128], n), "prompt_len": rng.choice([16, 512, 4000], n),
            "gen_len": 8, "devices": rng.choice([1, 8], n), "tdp_w": 1e6}
    pick = rng.integers(len(hosts), size=n)
    with_pim = evaluate({**cols, "hardware": [pims[i] for i in pick]})
    alone = evaluate({**cols, "hardware": [hosts[i] for i in pick]})
    feasible = alone.feasible & with_pim.feasible
    assert feasible.sum() >= n // 4
    assert np.array_equal(with_pim["ttft_s"][feasible], alone["ttft_s"][feasible])


@pytest.mark.parametrize("ideal", [False, True])
def test_shipped_pim_presets_keep_their_hosts_prefill(ideal):
    cols = {"model": "llama-2-7b", "batch": [1, 4, 8], "prompt_len": [128, 512, 1024], "gen_len": 16}
    pairs = [(load_device("attacc"), load_device("h100-sxm")),
             (load_device("hbm-pim"), _alone(load_device("hbm-pim"))),
             (load_device("gddr6-aim"), _alone(load_device("gddr6-aim")))]
    for pim, host in pairs:
        a = evaluate({**cols, "hardware": pim}, ideal=ideal)
        h = evaluate({**cols, "hardware": host}, ideal=ideal)
        assert np.array_equal(a.feasible, h.feasible) and a.feasible[:2].all(), pim.name
        assert np.array_equal(a["ttft_s"][a.feasible], h["ttft_s"][a.feasible]), pim.name


# ---------------------------------------------------------------- decode attention: the closed form

def test_pim_decode_attention_follows_the_closed_form():
    m = load_model("llama-2-7b")
    eff = Efficiency(compute=0.5, memory=0.6, attention_memory=0.55, attention_compute=0.4, op_overhead_s=3e-6,
                     name="test")
    f = 0.55                                            # the host's achieved attention fraction
    for units, unit_bw, peak, sw, n_sw, coord in ((2560, 10.47e9, 26.8e12, 48e-9, 4, 176e-9),
                                                  (512, 9.59e9, 1e18, 1e-6, 2, 5e-6),
                                                  (4096, 1e10, 2e12, 0.0, 0, 0.0)):
        host = load_device("h100-sxm")
        bus = host.memory.bandwidth_bytes_per_s
        d = replace(host, device_class="pim",
                    pim=PimUnit({"fp16": peak}, units * unit_bw / bus, ("attention",), False, units=units,
                                unit_bandwidth_bytes_per_s=unit_bw, mode_switch_s=sw, mode_switches=n_sw,
                                coordination_s=coord))
        for batch, ctx in ((1, 512), (16, 2048), (64, 4000)):
            table = optable.decode_step(m, Scenario.make(batch=batch, prompt_len=ctx), ctx)
            cost = op_costs(OpArrays.from_table(table), system_arrays([d], 1), eff)
            for name in ("qk_matmul", "sv_matmul"):
                i = table.names.index(name)
                ops, kv, w, act = table.ops[i], table.kv_bytes[i], table.weight_bytes[i], table.act_bytes[i]
                expected = (max(ops / (peak * f), (kv + w) / (units * unit_bw * f) + act / (bus * f))
                            + n_sw * sw + coord + eff.op_overhead_s)
                host_time = max(ops / (host.peak_ops_per_s["fp16"] * 0.4), (kv + w + act) / (bus * f)) \
                    + eff.op_overhead_s
                if expected < host_time:
                    assert cost.on_pim[0, i], (name, batch, ctx)
                    assert cost.time_s[0, i] == pytest.approx(expected, rel=1e-12)
                else:                                   # slower in memory: it stays on the host
                    assert not cost.on_pim[0, i]
                    assert cost.time_s[0, i] == pytest.approx(host_time, rel=1e-12)


def test_pim_generation_pays_its_fixed_costs_every_step():
    # over a generation, an attention operator in memory costs the sum of the per-step closed form:
    # its bytes grow with the context, its switches and coordination are paid once a step
    m = load_model("llama-2-7b")
    sw, n_sw, coord, mult = 2e-6, 4, 7e-6, 8.0
    d = _attached("h100-sxm", multiple=mult, peak=1e18, operators=("attention",), switch_s=sw, switches=n_sw,
                  coordination_s=coord)
    bus = d.memory.bandwidth_bytes_per_s
    prompt, gen = 1000, 6
    sc = Scenario.make(batch=8, prompt_len=prompt, gen_len=gen)
    tables = [optable.decode_step(m, sc, prompt + j) for j in range(gen)]
    op0, op1 = OpArrays.from_table(tables[0]), OpArrays.from_table(tables[1])
    slope = replace(op0, **{f: getattr(op1, f) - getattr(op0, f)
                            for f in ("ops", "weight_bytes", "act_bytes", "kv_bytes", "comm_bytes", "p2p_bytes")})
    sys = system_arrays([d], 1)
    on = np.zeros((1, len(op0.ops)), dtype=bool)
    for name in ("qk_matmul", "sv_matmul"):
        on[0, tables[0].names.index(name)] = True
    totals = operator_cost.decode_op_totals(op0, slope, np.array([gen]), sys, IDEAL, on)
    for name in ("qk_matmul", "sv_matmul"):
        i = tables[0].names.index(name)
        expected = sum((t.kv_bytes[i] + t.weight_bytes[i]) / (mult * bus) + t.act_bytes[i] / bus + n_sw * sw + coord
                       for t in tables)
        assert totals[0, i] == pytest.approx(expected, rel=1e-9)


# ---------------------------------------------------------------- the speedup a PIM may bring

def _ratio(d) -> float:
    """The ideal bandwidth ratio of a PIM-attached design over its host: the internal bandwidth
    over the bus, plus the bus itself when the host works while the PIM does."""
    return d.pim.internal_bandwidth_multiple + (1.0 if d.pim.concurrent else 0.0)


@pytest.mark.parametrize("ideal", [False, True])
def test_pim_speedup_never_exceeds_the_ideal_bandwidth_ratio(ideal):
    rng = np.random.default_rng(7)
    n = 48
    cols = {"model": rng.choice(["llama-2-7b", "llama-3.1-8b", "mistral-7b"], n),
            "batch": rng.choice([1, 4, 16, 64], n), "prompt_len": rng.choice([128, 1024, 3968], n),
            "gen_len": 64, "kv": rng.choice(["fp16", "fp8"], n)}
    designs = [(load_device("attacc"), load_device("h100-sxm")),
               (load_device("hbm-pim"), _alone(load_device("hbm-pim"))),
               (load_device("gddr6-aim"), _alone(load_device("gddr6-aim"))),
               (_attached("h100-sxm", multiple=6.0, peak=1e18, concurrent=True), load_device("h100-sxm")),
               (_attached("mi300x", multiple=12.0, peak=5e13, operators=("attention", "gemv", "experts")),
                load_device("mi300x"))]
    for pim, host in designs:
        a, h = evaluate({**cols, "hardware": pim}, ideal=ideal), evaluate({**cols, "hardware": host}, ideal=ideal)
        ok = a.feasible & h.feasible
        assert ok.sum() >= n // 3, pim.name
        speedup = h["tpot_s"][ok] / a["tpot_s"][ok]
        assert (speedup <= _ratio(pim) * (1 + 1e-9)).all(), (pim.name, speedup.max())
        assert (speedup >= 1 - 1e-9).all(), pim.name        # the PIM only takes what it runs faster


def test_attacc_internal_bandwidth_is_its_banks():
    # the shipped per-bank design: 5 HBM3 stacks x 32 pseudo-channels x 16 banks, each bank at half
    # its pseudo-channel's bus rate (tCCD_L = 2 tCCD_S): 8x the 3.35 TB/s bus
    d = load_device("attacc")
    banks = 5 * 32 * 16
    bank_bw = 3.35e12 / (5 * 32) / 2
    assert d.pim.units == banks
    assert d.pim.internal_bandwidth_multiple == pytest.approx(banks * bank_bw / 3.35e12, rel=1e-3)
    assert d.pim.internal_bandwidth_multiple == pytest.approx(8.0, rel=1e-3)
    assert d.efficiency_family == load_device("h100-sxm").efficiency_family
