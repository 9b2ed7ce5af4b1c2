"""The cost of ownership (dse/core/metrics.py capital_usd, tco_usd_per_s, token_costs; defaults in
configs/economics.yaml) against a hand calculation of the formula on one-row points, the split of
$/Mtok into input and output tokens (the prefill's and the decode's machine time) summing to the
whole, and the checks of the new columns from the command line and from Python."""
import math

import numpy as np
import pytest

from basis.errors import DseError
from basis.shipped import shipped
from basis.yamlfile import load_yaml
from dse.core.economics import COST_COLUMNS, cost_items_text, economics_defaults
from dse.study.cli import main
from dse.system.evaluator import evaluate
from hwmodels.presets import available_hardware, load_device

pytestmark = pytest.mark.usefixtures("fixed_calibration")

#: a one-row point whose every cost item is given (H100 SXM with a static power, so its energy is known)
GIVEN = {"hardware": "h100-sxm", "model": "llama-3.1-8b", "batch": 16, "prompt_len": 512, "gen_len": 128,
         "static_power_w": 80.0, "price_usd": 20000.0, "host_cost_share": 0.5, "network_cost_share": 0.2,
         "pue": 1.25, "electricity_usd_per_kwh": 0.10, "amortization_years": 4.0, "utilization": 0.5}


def test_tco_of_one_point_is_the_hand_calculation():
    ev = evaluate(GIVEN)
    # by hand: capital = 20,000 x (1 + 0.5) / (1 - 0.2) = $37,500
    assert ev["capital_usd"][0] == pytest.approx(37500.0)
    life_s = 4.0 * 365.25 * 24 * 3600                              # 126,230,400 s
    power, tps = float(ev["power_w"][0]), float(ev["output_tokens_per_s"][0])
    avg_w = 0.5 * power + 0.5 * 80.0                                # busy half the time, static power the rest
    usd_per_s = 37500.0 / life_s + avg_w * 1.25 / 3.6e6 * 0.10
    assert ev["tco_usd_per_hour"][0] == pytest.approx(usd_per_s * 3600, rel=1e-12)
    whole = 1e6 * usd_per_s / (tps * 0.5)                           # tokens are made half the time
    assert ev["cost_per_million_tokens_usd"][0] == pytest.approx(whole, rel=1e-12)
    assert ev["tokens_per_dollar"][0] == pytest.approx(1e6 / whole, rel=1e-12)
    # the same point's energy share: a PUE of 1.25 vs 1 adds a quarter of the electricity, nothing else
    one = evaluate({**GIVEN, "pue": 1.0})
    elec = avg_w / 3.6e6 * 0.10 * 3600
    assert ev["tco_usd_per_hour"][0] - one["tco_usd_per_hour"][0] == pytest.approx(0.25 * elec, rel=1e-9)


def test_static_split_charges_the_prefill_time_to_input_tokens():
    # ideal roofline: no request overhead, so TTFT is the prefill and TPOT x (gen - 1) the decode
    ev = evaluate(GIVEN, ideal=True)
    ttft, tpot = float(ev["ttft_s"][0]), float(ev["tpot_s"][0])
    share = ttft / (ttft + tpot * 127)
    assert ev["prefill_time_share"][0] == pytest.approx(share, rel=1e-9)
    usd_per_s = ev["tco_usd_per_hour"][0] / 3600
    e2e = float(ev["e2e_latency_s"][0])
    input_tps = 16 * 512 / e2e                                      # the run's prompt tokens over its length
    assert ev["cost_per_mtok_input_usd"][0] == pytest.approx(1e6 * usd_per_s * share / (input_tps * 0.5), rel=1e-9)
    assert ev["cost_per_mtok_output_usd"][0] == pytest.approx(
        1e6 * usd_per_s * (1 - share) / (ev["output_tokens_per_s"][0] * 0.5), rel=1e-9)


@pytest.mark.parametrize("extra", [{}, {"serving": "continuous", "concurrency": 16},
                                   {"serving": "continuous", "request_rate": 2.0}])
def test_input_and_output_dollars_sum_to_the_whole(extra):
    ev = evaluate({**GIVEN, **extra})
    out_tps = float(ev["output_tokens_per_s"][0])
    in_tps = float(ev["total_tokens_per_s"][0]) - out_tps
    share = float(ev["prefill_time_share"][0])
    assert 0 < share < 1
    # $ per second of the input tokens plus that of the output tokens is the whole $ per second
    whole = ev["cost_per_million_tokens_usd"][0] * out_tps
    parts = ev["cost_per_mtok_input_usd"][0] * in_tps + ev["cost_per_mtok_output_usd"][0] * out_tps
    assert parts == pytest.approx(whole, rel=1e-12)
    # a prompt token is cheaper than an output token (prefill is batched over the prompt)
    assert ev["cost_per_mtok_input_usd"][0] < ev["cost_per_mtok_output_usd"][0]


def test_disaggregated_split_is_the_prefill_pool_share():
    ev = evaluate({**GIVEN, "model": "llama-3.1-8b", "serving": "continuous", "request_rate": 2.0,
                   "disaggregate": "1:3"})
    assert ev["prefill_time_share"][0] == pytest.approx(0.25)


def test_defaults_are_cited_and_their_checks_name_the_file(tmp_path):
    d = economics_defaults()
    assert set(d) == set(COST_COLUMNS)
    assert d["pue"] == 1.58 and d["host_cost_share"] == 0.64 and d["network_cost_share"] == 0.19
    base = ("sources: {a: b}\nelectricity_usd_per_kwh: {value: 0.1, source: a}\namortization_years: {value: 5, source: a}\n"
            "utilization: {value: 1, source: a}\nhost_cost_share: {value: 0, source: a}\n")
    for tail, key in (("pue: {value: 0.9, source: a}\nnetwork_cost_share: {value: 0.1, source: a}\n", "pue"),
                      ("pue: {value: 1.2, source: a}\nnetwork_cost_share: {value: 1, source: a}\n", "network_cost_share"),
                      ("pue: {value: 1.2}\nnetwork_cost_share: {value: 0.1, source: a}\n", "pue")):
        f = tmp_path / f"{key}.yaml"
        f.write_text(base + tail)
        with pytest.raises(DseError, match=f"{f.name}.*{key}"):
            economics_defaults(str(f))


def test_an_unpriced_preset_has_no_cost_and_says_so():
    ev = evaluate({"hardware": "l40s", "model": "llama-3.1-8b", "batch": 4})
    assert math.isnan(ev["capital_usd"][0]) and math.isnan(ev["tokens_per_dollar"][0])
    assert "MISSING" in cost_items_text("missing") and "pue" not in cost_items_text("cited").lower().split("; ")[0]
    assert "PUE given" in cost_items_text("cited", True, ["pue"])


@pytest.mark.parametrize("flag,value", [("--pue", "0"), ("--pue", "-1"), ("--pue", "nan"), ("--pue", "inf"),
                                        ("--pue", "1e300"), ("--pue", "abc"), ("--host-cost-share", "-1"),
                                        ("--network-cost-share", "1"), ("--network-cost-share", "abc")])
def test_bad_cost_flags_are_one_line_and_exit_2(capsys, flag, value):
    try:
        rc = main(["analyze", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", flag, value])
    except SystemExit as e:
        rc = e.code
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert flag in err[-1] and "Traceback" not in "\n".join(err)


def test_a_pue_below_one_is_refused_from_the_cli_and_from_columns(capsys):
    rc = main(["analyze", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--pue", "0.5"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "pue" in err[0]
    with pytest.raises(DseError, match="pue"):
        evaluate({**GIVEN, "pue": np.array([1.2, 0.9]), "batch": np.array([1, 2])})
    with pytest.raises(DseError, match="network_cost_share"):
        evaluate({**GIVEN, "network_cost_share": 1.5})


def test_analyze_prints_the_split_and_the_cost_note(capsys):
    rc = main(["analyze", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--batch", "16",
               "--static-power-w", "80", "--pue", "1.2"])
    out = capsys.readouterr().out
    assert rc == 0
    for key in ("cost_per_mtok_input_usd", "cost_per_mtok_output_usd", "tokens_per_dollar", "tco_usd_per_hour",
                "cost_note"):
        assert key in out
    note = next(line for line in out.splitlines() if "cost_note" in line)
    assert "accelerator price cited" in note and "PUE given" in note and "host power not modelled" in note


def test_the_tco_study_covers_every_priced_preset():
    study = load_yaml(str(shipped("studies", "tco-70b.yaml")), "study")
    priced = {n for n in available_hardware() if load_device(n).price_usd is not None}
    assert set(study["space"]["hardware"]) == priced
