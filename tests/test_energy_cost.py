"""Energy per token, power, the TDP check and the cost of serving in the evaluator, against the
scalar energy model of hwmodels/energy.py applied by hand to the operator tables, closed forms
of the cost; measured energy per token is tests/test_power.py."""
import math
import subprocess
import sys

import numpy as np
import pytest

from basis.errors import DseError
from dse.core.economics import economics_defaults
from dse.core.efficiency import IDEAL
from dse.core.metrics import SECONDS_PER_YEAR
from dse.core.roofline import decode_total_energy_j, step_energy_j
from dse.system.evaluator import evaluate
from dse.system.hardware import system_arrays
from dse.system.workload import resolve_model, tables
from hwmodels.energy import LEVELS, energy_per_step_j
from hwmodels.power import serving_floor_w
from hwmodels.presets import device_from_dict, load_device
from hwmodels.template import a100, h100, physical_figures, varied

pytestmark = pytest.mark.usefixtures("fixed_calibration")

A100_BUFFER = load_device("a100-40gb").onchip_buffer_bytes


def _by_hand(table, profile: str, tp: int) -> float:
    """Dynamic energy (J) of one step on all tp ranks: the scalar model over the table's ops by
    compute class and its device-memory bytes, each byte crossing HBM, L2 and L1 once."""
    ops: dict[str, float] = {}
    for cls, n, count in zip(table.compute_classes, table.ops, table.counts):
        key = "fp32" if cls in ("vector", "none") else cls
        ops[key] = ops.get(key, 0.0) + float(n * count)
    nbytes = float(((table.weight_bytes + table.act_bytes + table.kv_bytes) * table.counts).sum())
    return tp * energy_per_step_j(ops, {lv: nbytes for lv in LEVELS}, profile)


def test_static_batch_energy_is_the_scalar_model_over_its_steps():
    # one decode step (gen_len 2): the run is the prefill, one decode step and static power over it
    m = resolve_model("llama-3.1-8b")
    t = tables(m, 8, 256, 2, "fp16", "fp16", "fp16", 1, 1, 1, True, A100_BUFFER)
    ev = evaluate({"hardware": "a100-40gb", "model": "llama-3.1-8b", "batch": 8, "prompt_len": 256, "gen_len": 2},
                  efficiency=IDEAL)
    dynamic = _by_hand(t.prefill_table, "a100-sxm4-40gb", 1) + _by_hand(t.decode_table, "a100-sxm4-40gb", 1)
    static = serving_floor_w(400.0)          # the A100's serving floor: the fitted share of its 400 W TDP
    energy = dynamic + static * ev["e2e_latency_s"][0]
    assert ev["energy_per_token_j"][0] == pytest.approx(energy / (8 * 2), rel=2e-3)
    assert ev["power_w"][0] == pytest.approx(energy / ev["e2e_latency_s"][0], rel=2e-3)
    assert ev["tokens_per_joule"][0] == pytest.approx(1 / ev["energy_per_token_j"][0])


def test_decode_energy_over_many_steps_is_the_sum_of_each_step():
    m = resolve_model("llama-3.1-8b")
    t = tables(m, 4, 128, 64, "fp16", "fp16", "fp16", 2, 1, 1, True, A100_BUFFER)
    sys_ = system_arrays(["a100-40gb", "h100-sxm"], tp=2)
    (d0, slope, n), = t.decode_steps(40)
    one_by_one = sum(step_energy_j(d0, sys_) + j * step_energy_j(slope, sys_) for j in range(n))
    assert decode_total_energy_j(d0, slope, n, sys_) == pytest.approx(one_by_one, rel=1e-12)
    # a ring all-reduce over 2 devices moves its message once per device, read and written
    assert np.all(step_energy_j(d0, sys_) > step_energy_j(d0, system_arrays(["a100-40gb", "h100-sxm"], tp=1)))


def test_continuous_serving_of_one_request_costs_what_a_batch_of_one_does():
    # in flight alone, a request does the same work as a static batch of one: the same energy per token
    common = {"hardware": "a100-40gb", "model": "llama-3.1-8b", "prompt_len": 512, "gen_len": 256}
    static = evaluate({**common, "batch": 1})
    served = evaluate({**common, "serving": "continuous", "concurrency": 1, "prefill_chunk": 0})
    assert served["energy_per_token_j"][0] == pytest.approx(static["energy_per_token_j"][0], rel=0.05)
    # and batching spreads the weights over more tokens
    many = evaluate({**common, "serving": "continuous", "concurrency": 64})
    assert many["energy_per_token_j"][0] < 0.3 * served["energy_per_token_j"][0]


def test_every_preset_has_energy_and_says_on_what_basis():
    """No preset prints nothing: a measured profile (H100), its own TDP (B200) or its class's
    (TPU v5e: no TDP cited); a given static power replaces the serving floor."""
    ev = evaluate({"hardware": ["b200", "h100-sxm", "h100-sxm", "tpu-v5e"], "model": "llama-3.1-8b",
                   "static_power_w": [np.nan, np.nan, 70.0, np.nan]})
    assert np.all(ev["energy_per_token_j"] > 0) and np.all(ev["power_w"] > 0) and ev.feasible.all()
    assert list(ev.to_frame()["energy_basis"]) == ["tdp", "measured", "measured", "class"]
    # the serving floor 0.24 x 700 W against the given 70 W: the same dynamic energy, more static power
    assert ev["power_w"][1] - ev["power_w"][2] == pytest.approx(0.24 * 700 - 70, rel=1e-6)


def test_a_design_over_its_limit_runs_at_a_lower_clock_and_below_its_floor_is_refused():
    """A100 at batch 64 asks ~300 W in its prefill: a 250 W limit throttles it (slower, cooler,
    clock < 1, its demand at the limit); an 80 W one is under its 96 W serving floor, so no clock
    meets it."""
    ev = evaluate({"hardware": "a100-40gb", "model": "llama-3.1-8b", "batch": 64, "tdp_w": [400.0, 250.0, 80.0]})
    assert ev.feasible[0] and ev["power_demand_w"][0] < 400 and ev["clock_fraction"][0] == 1
    assert ev.feasible[1] and ev["clock_fraction"][1] < 1
    assert ev["power_demand_w"][1] <= 250 * 1.001 and ev["power_demand_w"][1] > 250 * 0.9   # bisected to ~4 %
    assert ev["output_tokens_per_s"][1] < ev["output_tokens_per_s"][0] and ev["power_w"][1] < ev["power_w"][0]
    assert not ev.feasible[2] and ev.reason_key(2) == "power" and "TDP" in ev.reason_text(2)


def test_cost_per_million_tokens_is_price_over_life_plus_electricity():
    ev = evaluate({"hardware": "h100-sxm", "model": "llama-3.1-8b", "batch": 16, "static_power_w": 70.0,
                   "electricity_usd_per_kwh": 0.2, "amortization_years": 4.0, "utilization": 0.5,
                   "pue": 1.0, "host_cost_share": 0.0, "network_cost_share": 0.0})   # the device alone
    life = 4.0 * 365.25 * 86400
    busy = 0.5 * life
    energy = ev["power_w"][0] * busy + 70.0 * (life - busy)
    usd = 25000.0 + energy / 3.6e6 * 0.2
    assert ev["cost_per_million_tokens_usd"][0] == pytest.approx(1e6 * usd / (ev["output_tokens_per_s"][0] * busy))
    # defaults: configs/economics.yaml
    d = economics_defaults()
    plain = evaluate({"hardware": "h100-sxm", "model": "llama-3.1-8b", "batch": 16, "static_power_w": 70.0})
    tokens = plain["output_tokens_per_s"][0] * d["utilization"] * d["amortization_years"] * SECONDS_PER_YEAR
    capital = 25000.0 * (1 + d["host_cost_share"]) / (1 - d["network_cost_share"])
    assert plain["cost_per_million_tokens_usd"][0] == pytest.approx(
        1e6 * (capital + plain["power_w"][0] * d["pue"] * tokens / plain["output_tokens_per_s"][0] / 3.6e6
               * d["electricity_usd_per_kwh"]) / tokens)


def test_economics_file_errors_name_the_file_and_key(tmp_path):
    f = tmp_path / "e.yaml"
    f.write_text("sources: {a: b}\nelectricity_usd_per_kwh: {value: 0.1, source: a}\namortization_years: 3\n"
                 "utilization: {value: 1, source: a}\n")
    with pytest.raises(DseError, match="amortization_years"):
        economics_defaults(str(f))
    assert set(economics_defaults()) == {"electricity_usd_per_kwh", "amortization_years", "utilization", "pue",
                                         "host_cost_share", "network_cost_share"}


def test_a_preset_naming_an_unknown_energy_profile_is_an_error():
    d = {"name": "x", "class": "gpu", "sources": {"s": "t"}, "peak_ops_per_s": {"fp16": {"value": 1e12, "source": "s"}},
         "vector_ops_per_s": {"value": 1e11, "source": "s"},
         "memory_tiers": [{"name": "hbm", "capacity_bytes": {"value": 1e9, "source": "s"},
                           "bandwidth_bytes_per_s": {"value": 1e11, "source": "s"}}],
         "energy_profile": "h100-made-up"}
    with pytest.raises(DseError, match="energy_profile.*allowed: a100-sxm4-40gb"):
        device_from_dict(d, "x.yaml")


# ------------------------------------------------------------------ template columns

def test_template_columns_change_the_design_as_its_microarchitecture_does():
    base = {"hardware": "h100-sxm", "model": "llama-3.1-8b", "batch": 8, "static_power_w": 70.0}
    ev = evaluate({**base, "cores": [132, 66], "memory_stacks": [5, 6]}, efficiency=IDEAL)
    t0 = varied(h100(), cores=132, memory_stacks=5)
    assert ev["die_area_mm2"][0] == pytest.approx(physical_figures(t0)["die_area_m2"] * 1e6)
    assert ev["die_area_mm2"][1] < ev["die_area_mm2"][0]                  # half the cores, a smaller die
    assert ev["capacity_bytes"][1] == pytest.approx(6 * 16 * 2 ** 30)      # six 16 GiB HBM3 stacks
    # half the SMs, the same memory: the (compute-bound) prefill takes about twice as long
    half = evaluate({**base, "cores": [132, 66], "prompt_len": 2048}, efficiency=IDEAL)
    assert half["ttft_s"][1] / half["ttft_s"][0] == pytest.approx(2.0, rel=0.05)
    assert ev["system_tdp_w"][0] == 700 and np.isnan(ev["cost_usd"][0])          # a new design has no price
    # A100: die and HBM2e have published prices, so its build cost is known (packaging aside)
    a = evaluate({"hardware": "a100-80gb", "model": "llama-3.1-8b", "l2_bytes": 40 * 2 ** 20})
    assert a["build_cost_usd"][0] == pytest.approx(physical_figures(varied(a100(), global_sram_bytes=40 * 2 ** 20))
                                                   ["build_cost_usd"])


def test_template_columns_on_a_preset_without_a_template_are_an_error():
    with pytest.raises(DseError, match="cores.*presets with a template: a100-80gb, h100-sxm"):
        evaluate({"hardware": "b200", "model": "llama-3.1-8b", "cores": 100})
    # a memory whose PHY area is unpublished cannot make a die: one line naming the design and the key
    with pytest.raises(DseError, match="template of 'h100-sxm' with memory_type gddr6.*gddr6.phy_area_m2"):
        evaluate({"hardware": "h100-sxm", "model": "llama-3.1-8b", "memory_type": "gddr6"})


# measured energy per token (ML.ENERGY): tests/test_power.py, leave-source-out


def test_analyze_json_summary_has_energy_power_and_cost():
    out = subprocess.run([sys.executable, "-m", "dse.study", "analyze", "--model", "llama-3.1-8b", "--hardware",
                          "h100-sxm", "--batch", "16", "--static-power-w", "70", "--format", "json"],
                         capture_output=True, text=True, check=True)
    import json
    s = json.loads(out.stdout)["summary"]
    assert s["energy_per_token_j"] > 0 and s["power_w"] > 70 and s["cost_per_million_tokens_usd"] > 0
    assert math.isclose(s["tokens_per_joule"], 1 / s["energy_per_token_j"])
    plain = subprocess.run([sys.executable, "-m", "dse.study", "analyze", "--model", "llama-3.1-8b", "--hardware",
                            "b200"], capture_output=True, text=True, check=True).stdout
    assert "energy_per_token_j" in plain and "energy_basis" in plain and " tdp" in plain
