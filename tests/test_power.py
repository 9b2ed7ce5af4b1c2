"""The power model of every preset (hwmodels/power.py, configs/power.yaml) and power caps: its
shares against SC'25's measured profiles and the datasheets, energy per token against ML.ENERGY's
A100/H100 runs under leave-source-out, the DVFS relation in closed form, and the cap's direction."""
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from basis.errors import DseError
from basis.shipped import shipped
from basis.yamlfile import load_yaml
from dse.system.evaluator import evaluate
from hwmodels.energy import LEVELS, load_technology
from hwmodels.power import (
    class_power,
    clock_fraction,
    energy_band,
    fit_floor_fraction,
    load_power,
    power_of,
    power_table_from_dict,
    serving_floor_w,
    tdp_coefficients,
)
from hwmodels.presets import available_hardware, load_device

POWER = load_power()


def test_headroom_shares_are_the_measured_devices_at_their_datasheet_peaks():
    """ops/bits shares of configs/power.yaml = SC'25 J/op x dense BF16 peak (and J/bit through
    HBM, L2, L1 x 8 x bandwidth) over TDP - floor, averaged over the A100 and the Hopper GPU."""
    tech = load_technology()
    ops, bits = [], []
    for preset, profile in (("a100-40gb", "a100-sxm4-40gb"), ("h100-sxm", "gh200-hopper")):
        d, p = load_device(preset), tech.profile(profile)
        head = d.tdp_w - serving_floor_w(d.tdp_w)
        ops.append(p.op_j["fp16"] * d.peak_ops_per_s["bf16"] / head)
        bits.append(sum(p.bit_j[lv] for lv in LEVELS) * 8 * d.memory.bandwidth_bytes_per_s / head)
    assert POWER.ops_fraction == pytest.approx(np.mean(ops), abs=0.01)
    assert POWER.bits_fraction == pytest.approx(np.mean(bits), abs=0.01)


def test_a_chip_from_its_tdp_spends_the_shares_at_its_peaks():
    d = load_device("mi300x")
    p = tdp_coefficients(d.tdp_w, d.peak_ops_per_s, d.vector_ops_per_s, d.memory.bandwidth_bytes_per_s)
    head = 750 - 0.24 * 750
    assert p.floor_w == pytest.approx(0.24 * 750) and p.basis == "tdp"
    assert p.op_j["bf16"] * d.peak_ops_per_s["bf16"] == pytest.approx(POWER.ops_fraction * head)
    assert p.bit_j * 8 * d.memory.bandwidth_bytes_per_s == pytest.approx(POWER.bits_fraction * head)


def test_every_preset_has_power_coefficients_and_a_basis():
    bases = {n: power_of(load_device(n)).basis for n in available_hardware()}
    assert bases["h100-sxm"] == "measured" and bases["b200"] == "tdp" and bases["tpu-v5e"] == "class"
    for n in available_hardware():
        p = power_of(load_device(n))
        assert p.floor_w > 0 and p.bit_j > 0, n
        assert any(np.isfinite(p.op_j[c]) for c in p.op_j), n


def test_a_class_figure_is_the_median_of_its_members():
    a, b, c = (power_of(load_device(n)) for n in ("gaudi2", "gaudi3", "tpu-v4"))
    m = class_power([a, b, c], [])
    assert m.floor_w == pytest.approx(np.median([a.floor_w, b.floor_w, c.floor_w]))
    assert m.bit_j == pytest.approx(np.median([a.bit_j, b.bit_j, c.bit_j])) and m.basis == "class"


def test_clock_fraction_is_the_cube_root_of_the_dynamic_headroom():
    f = clock_fraction([100.0, 100.0, 100.0, 100.0, np.nan], [400.0, 150.0, 400.0, 10000.0, 400.0],
                       [300.0, 300.0, 200.0, 150.0, 300.0])
    assert f[0] == pytest.approx((200 / 400) ** (1 / 3))       # (cap - static) / dynamic, cube root
    assert f[1] == 1.0 and f[4] == 1.0                          # under its cap; static unknown
    assert f[2] == pytest.approx((100 / 400) ** (1 / 3))
    assert f[3] == POWER.min_clock_fraction                     # no clock above the lowest meets it


def test_a_malformed_power_table_is_one_line_naming_the_key():
    d = load_yaml(str(shipped("configs", "power.yaml")), "power table")
    with pytest.raises(DseError, match="serving_floor_fraction_of_tdp.*fraction"):
        power_table_from_dict({**d, "serving_floor_fraction_of_tdp": {"value": 3, "source": "x"}}, "p.yaml")
    with pytest.raises(DseError, match="unknown key.*bogus"):
        power_table_from_dict({**d, "bogus": 1}, "p.yaml")


# ------------------------------------------------------------------ ML.ENERGY, leave source out

def _ml_energy(prompt_len):
    """(measured J/token, modelled dynamic J/token, TDP, devices, measured tokens/s, is v3) of the
    25 ML.ENERGY runs, each modelled as a closed loop at its concurrency (prompts unpublished)."""
    d = pd.read_csv(shipped("data", "gathered", "energy.csv"))
    e = d[d.metric == "energy_per_token_j"].reset_index(drop=True)
    rate = d[d.metric == "output_tokens_per_s"].set_index(["model_slug", "hardware_slug", "batch", "engine_version"]).value
    tps = np.array([rate[(r.model_slug, r.hardware_slug, r.batch, r.engine_version)] for r in e.itertuples()])
    ev = evaluate({"hardware": e.hardware_slug.values, "model": e.model_slug.values, "tp": e.tp.values,
                   "serving": "continuous", "concurrency": e.batch.values, "prompt_len": prompt_len,
                   "gen_len": np.round(e.gen_len.values).astype(int), "engine": "vllm", "static_power_w": 0.0})
    tdp = np.array([load_device(h).tdp_w for h in e.hardware_slug])
    return (e.value.to_numpy(), ev["energy_per_token_j"], tdp, e.devices.to_numpy(), tps,
            e.engine_version.str.startswith("0.11").to_numpy())


@pytest.mark.parametrize("prompt_len", [256, 512])
def test_energy_per_token_against_ml_energy_leave_source_out(prompt_len):
    """ML.ENERGY v2 (A100 SXM4 40GB and H100, vLLM 0.5.4) and v3 (H100, vLLM 0.11.1): the GPUs'
    energy over the steady window, the engine's non-kernel time included, so each run's energy is
    the serving floor over its measured wall time plus the modelled dynamic energy. The floor
    fitted on one source predicts the other (measured 2026-11-28: median |error| 7 % / 11 %, p90
    29 % / 20 % at 256 / 512 prompt tokens); the shipped 0.24 is the fit on both at 256."""
    y, dyn, tdp, dev, tps, v3 = _ml_energy(prompt_len)
    errors = []
    for train in (v3, ~v3):
        f = fit_floor_fraction(y[train], dyn[train], tdp[train], dev[train], tps[train])
        assert 0.15 < f < 0.35
        errors.append(np.abs((f * tdp * dev / tps + dyn) / y - 1)[~train])
    err = np.concatenate(errors)
    assert np.median(err) <= 0.15 and np.quantile(err, 0.9) <= 0.30, np.round(err, 2)
    shipped_err = np.abs((POWER.floor_fraction * tdp * dev / tps + dyn) / y - 1)
    assert np.median(shipped_err) <= 0.15 and np.quantile(shipped_err, 0.9) <= 0.30
    if prompt_len == 256:
        assert fit_floor_fraction(y, dyn, tdp, dev, tps) == pytest.approx(POWER.floor_fraction, abs=0.01)


# ------------------------------------------------------------------------------- power caps

def test_a_lower_cap_saves_energy_per_token_until_compute_binds():
    """Llama-3.1-8B on an H100 serving 128 requests in flight: caps under its demand lower the
    clock, throughput and power; energy per token first falls (J/op ~ f^2), then rises as the
    serving floor over a longer run outweighs it (the published direction, Samsi et al. 2023)."""
    caps = [700.0, 350.0, 250.0]
    ev = evaluate({"hardware": "h100-sxm", "model": "llama-3.1-8b", "serving": "continuous", "concurrency": 128,
                   "prompt_len": 512, "gen_len": 256, "power_cap_w": caps})
    assert ev.feasible.all() and ev["clock_fraction"][0] == 1 and 0.3 < ev["clock_fraction"][2] < ev["clock_fraction"][1] < 1
    assert np.all(np.diff(ev["output_tokens_per_s"]) < 0) and np.all(np.diff(ev["power_w"]) < 0)
    assert np.all(ev["power_demand_w"][1:] <= np.array(caps[1:]) * 1.001)
    e = ev["energy_per_token_j"]
    assert e[1] < e[0] < e[2]


@pytest.mark.parametrize("bad", ["0", "-1", "nan", "inf", "1e300", "abc"])
def test_a_bad_power_cap_is_one_line_and_exit_2(bad):
    r = subprocess.run([sys.executable, "-m", "dse.study", "analyze", "--model", "llama-3.1-8b", "--hardware",
                        "h100-sxm", "--power-cap-w", bad], capture_output=True, text=True)
    assert r.returncode == 2 and "--power-cap-w" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    if bad not in ("abc", "nan"):          # a column (NaN there: not given, the TDP): the same check
        with pytest.raises(DseError, match="power_cap_w"):
            evaluate({"hardware": "h100-sxm", "model": "llama-3.1-8b", "power_cap_w": float(bad)})


def test_the_energy_band_widens_away_from_measured_coefficients():
    """measured: 1 -/+ the ML.ENERGY p90 error; x1.5 wider from a chip's TDP, x2.25 from its class."""
    ev = evaluate({"hardware": ["h100-sxm", "b200", "tpu-v6e"], "model": "llama-3.1-8b", "batch": 8})
    e = POWER.energy_error
    assert ev["energy_band_high"] == pytest.approx([1 + e, 1 + 1.5 * e, 1 + 2.25 * e])
    assert ev["energy_band_low"][0] == pytest.approx(1 - e)
    with pytest.raises(DseError, match="basis 'guess'"):
        energy_band("guess")


def test_analyze_prints_the_clock_a_cap_leaves():
    r = subprocess.run([sys.executable, "-m", "dse.study", "analyze", "--model", "llama-3.1-8b", "--hardware",
                        "h100-sxm", "--batch", "256", "--power-cap-w", "350"], capture_output=True, text=True, check=True)
    line = next(x for x in r.stdout.splitlines() if x.strip().startswith("clock_fraction"))
    assert 0.3 <= float(line.split()[-1]) < 1 and "energy_basis                     measured" in r.stdout


@pytest.mark.parametrize("hardware, basis, steps", [("h100-sxm", "measured", 0), ("mi300x", "tdp", 1)])
def test_analyze_prints_the_energy_band_of_the_basis(hardware, basis, steps):
    # the band is the shipped p90 error widened band_widening per step away from measured
    # coefficients (configs/power.yaml read here, not through hwmodels.power)
    table = load_yaml(shipped("configs", "power.yaml"), "power")
    e = table["energy_error"]["value"] * table["band_widening"]["value"] ** steps
    r = subprocess.run([sys.executable, "-m", "dse.study", "analyze", "--model", "llama-3.1-8b", "--hardware",
                        hardware, "--batch", "16"], capture_output=True, text=True, check=True)
    line = next(x for x in r.stdout.splitlines() if x.startswith("Energy band:"))
    assert line.startswith(f"Energy band: x{1 - e:.2f} .. x{1 + e:.2f} (power figures: {basis}"), line


def test_the_power_missed_at_high_load_is_the_kv_traffic_of_a_longer_context():
    """At each ML.ENERGY v3 run's measured throughput, floor + dynamic per H100 against the measured
    power: with a 256-token prompt the missing power grows with load (Llama-3.1-8B, 8 -> 512 in
    flight: -3 -> +240 W; 70B TP4: -51 -> +118 W), as the KV reads the short context leaves out do;
    with a 768-token context (LM-Arena's multi-turn histories; their length is not published) the
    growth is gone (8B: spread 96 W, each run within 10 %; 70B: a flat offset, spread 35 W), so the
    missing term is the workload's KV traffic, not a device power term (measured 2026-11-28)."""
    d = pd.read_csv(shipped("data", "gathered", "energy.csv"))
    e = d[d.metric == "energy_per_token_j"].reset_index(drop=True)
    spreads = {}
    for prompt_len in (256, 768):
        y, dyn, tdp, dev, tps, v3 = _ml_energy(prompt_len)
        measured_w = y * tps / dev
        model_w = POWER.floor_fraction * tdp + dyn * tps / dev
        for model in ("llama-3.1-8b", "llama-3.1-70b"):
            rows = v3 & (e.model_slug == model).to_numpy()
            order = np.argsort(e.batch.to_numpy()[rows])
            missing = (measured_w - model_w)[rows][order]
            spreads[prompt_len, model] = (missing[-1] - missing[0], np.ptp(missing), model_w[rows] / measured_w[rows] - 1)
    assert spreads[256, "llama-3.1-8b"][0] > 150 and spreads[256, "llama-3.1-70b"][0] > 100
    assert spreads[768, "llama-3.1-8b"][1] < 120 and np.all(np.abs(spreads[768, "llama-3.1-8b"][2]) < 0.10)
    assert spreads[768, "llama-3.1-70b"][1] < 60
