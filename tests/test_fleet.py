"""The fleet search (dse.explore.fleet): closed forms (one type is today's ``replicas``; a rate curve
sized for its peak), Mélange's findings (Griggs et al. 2024, arXiv 2404.14527), the power objective,
and bad questions refused in one line."""
from __future__ import annotations

import math

import numpy as np
import pytest

from basis.errors import DseError
from dse import evaluate
from dse.core.economics import economics_defaults
from dse.core.metrics import SECONDS_PER_YEAR
from dse.explore.fleet import (
    Bucket,
    FleetAsk,
    PdPair,
    _least_busy,
    cheapest_mix,
    check_fleet,
    evaluate_engines,
    fleet,
)
from dse.study.cli import main

#: Llama-3.1-8B in FP8 on one device, an interactive SLO (Mélange's tight TPOT SLO, 40 ms: Sec. 6.1)
BASE = {"model": "llama-3.1-8b", "slo_ttft": 1.0, "slo_tpot": 0.04, "tp": 1, "pp": 1, "weights": "fp8",
        "activations": "fp8", "kv": "fp8", "prompt_len": 256, "gen_len": 256}
#: Mélange's two request sizes: short (conversational, Arena) and long (document, PubMed); ours 256 and 8,192
#: prompt tokens, 256 generated each
SHORT, LONG = (256, 256), (8192, 256)


@pytest.fixture(scope="module")
def mixed_engines():
    """The RTX 4090 and H100 SXM engines on a short and a long bucket (one evaluation, reused)."""
    ask = FleetAsk(BASE, ("rtx-4090", "h100-sxm"), ((24.0, 1.0),), (Bucket(0.8, *SHORT), Bucket(0.2, *LONG)))
    return evaluate_engines(ask)[0]


def test_one_type_is_todays_replicas():
    """One hardware at one rate: the fleet owns ceil(rate / goodput) replicas, the evaluator's
    ``replicas`` at that ``target_rate``, and its capital a day is their price with the host and network
    shares over 5 years."""
    rate = 37.0
    f = fleet(FleetAsk(BASE, ("h100-sxm",), ((24.0, rate),)))
    ev = evaluate({**BASE, "hardware": "h100-sxm", "target_rate": rate, "serving": "continuous"})
    (row,) = f.mix.rows
    assert row["owned"] == ev["replicas"][0] == math.ceil(rate / ev["goodput"][0])
    econ = economics_defaults()
    capital = ev["service_cost_usd"][0] * (1 + econ["host_cost_share"]) / (1 - econ["network_cost_share"])
    assert f.mix.capital_usd_per_day == pytest.approx(capital / (econ["amortization_years"] * SECONDS_PER_YEAR) * 86400)


def test_curve_sized_for_its_peak(mixed_engines):
    """A day's curve on one engine: owned = ceil(peak / goodput), running in each period =
    ceil(rate / goodput), the day's energy that of the running replicas, utilization the rate's mean
    over the owned capacity."""
    e = mixed_engines
    g = e.goodput[1, 0]
    periods = ((8.0, 10.0), (10.0, 100.0), (6.0, 40.0))
    m = cheapest_mix(e, periods, [1.0, 0.0], "cost", np.array([False, True]))
    (row,) = m.rows
    assert row["owned"] == math.ceil(100.0 / g)
    assert row["running"] == [math.ceil(r / g) for _, r in periods]
    hours = sum(h for h, _ in periods)
    assert m.energy_usd_per_day == pytest.approx(sum(h * math.ceil(r / g) for h, r in periods) * e.energy_usd_h[1])
    assert m.utilization == pytest.approx(sum(h * r for h, r in periods) / g / (row["owned"] * hours))


def test_utilization_routes_each_bucket_where_it_keeps_the_fewest_replicas_busy():
    """Two engines, two buckets: engine 0 serves bucket 0 at 10 requests/s a replica and bucket 1 at 2,
    engine 1 both at 5; 10 and 4 requests/s to serve on 2 + 1 running replicas. By hand: bucket 0 on
    engine 0 (0.1 replica per request/s against 0.2), bucket 1 on engine 1 (0.2 against 0.5): 1.0 and
    0.8 replicas busy (1.8 in all; the split 10 + 2 on engine 0 and 2 on engine 1 would also serve
    it, at 2.4)."""
    busy = _least_busy(np.array([[10.0, 2.0], [5.0, 5.0]]), np.array([[10.0, 4.0]]), np.array([[2], [1]]))
    assert busy[:, 0] == pytest.approx([1.0, 0.8])


def test_melange_short_requests_cheaper_on_the_small_gpu(mixed_engines):
    """Mélange (Griggs et al. 2024, arXiv 2404.14527, abstract and Sec. 6.2): on short (conversational)
    requests a fleet chosen over GPU types costs up to 77 % less than a single high-end type; here the
    search picks the RTX 4090 alone and saves 40-80 % against the H100 SXM alone at 20 requests/s
    (measured: 59 %)."""
    e = mixed_engines
    both = cheapest_mix(e, ((24.0, 20.0),), [1.0, 0.0], "cost", np.ones(2, bool))
    h100 = cheapest_mix(e, ((24.0, 20.0),), [1.0, 0.0], "cost", np.array([False, True]))
    assert {r["hardware"] for r in both.rows} == {"rtx-4090"}
    assert 0.40 <= 1.0 - both.usd_per_day / h100.usd_per_day <= 0.80


def test_melange_mixed_sizes_need_a_mix(mixed_engines):
    """Mélange's mixed setting (short and long requests, abstract: 51 % saving): short requests are cheaper
    on the small GPU, long ones only fit the SLOs on the big one, so the cheapest fleet holds both and
    costs less than every single type that serves the load (the RTX 4090 alone cannot: its 8,192-token
    prompts miss the 1 s TTFT). Direction only: the saving here is 6-9 % (90 % short requests at 100-200
    requests/s; at 50 requests/s the H100s the long requests need have room for the short ones too),
    smaller than Mélange's, with purchase prices (H100 SXM 15.6x an RTX 4090) instead of its cloud rental
    prices."""
    e = mixed_engines
    assert e.goodput[0, 0] > 0 and e.goodput[0, 1] == 0 and e.goodput[1, 1] > 0
    for rate, share in ((100.0, 0.9), (200.0, 0.9)):
        mix = cheapest_mix(e, ((24.0, rate),), [share, 1 - share], "cost", np.ones(2, bool))
        h100 = cheapest_mix(e, ((24.0, rate),), [share, 1 - share], "cost", np.array([False, True]))
        assert cheapest_mix(e, ((24.0, rate),), [share, 1 - share], "cost", np.array([True, False])) is None
        assert {r["hardware"] for r in mix.rows} == {"rtx-4090", "h100-sxm"}
        assert 0.05 <= 1.0 - mix.usd_per_day / h100.usd_per_day <= 0.51


def test_power_objective_draws_no_more(mixed_engines):
    """Minimising power gives a mean power no higher than the cheapest fleet's, and costs no less."""
    e = mixed_engines
    args = (((12.0, 30.0), (12.0, 80.0)), [0.8, 0.2])
    cost = cheapest_mix(e, *args, "cost", np.ones(2, bool))
    power = cheapest_mix(e, *args, "power", np.ones(2, bool))
    assert power.mean_power_w <= cost.mean_power_w + 1e-6
    assert power.usd_per_day >= cost.usd_per_day - 1e-6


def test_unpriced_hardware_is_named_and_left_out():
    """A preset citing no price (the L40S) is left out of a cost fleet and named in the notes."""
    f = fleet(FleetAsk(BASE, ("l40s", "h100-sxm"), ((24.0, 5.0),)))
    assert f.single["l40s"] is None
    assert {r["hardware"] for r in f.mix.rows} == {"h100-sxm"}
    assert any(n.startswith("l40s: left out") and "price" in n for n in f.notes)


@pytest.mark.parametrize("periods, buckets, objective, words", [
    (((0.0, 5.0),), (), "cost", "rate_curve[0].hours"),
    (((float("nan"), 5.0),), (), "cost", "rate_curve[0].hours"),
    (((24.0, -1.0),), (), "cost", "rate_curve[0].rate"),
    (((24.0, float("inf")),), (), "cost", "rate_curve[0].rate"),
    (((24.0, 1e300),), (), "cost", "rate_curve[0].rate"),
    (((24.0, "abc"),), (), "cost", "rate_curve[0].rate"),
    (((24.0, 5.0),), (Bucket(0.5, 256, 256),), "cost", "sum to 0.5"),
    (((24.0, 5.0),), (Bucket(1.0, 0, 256),), "cost", "buckets[0].prompt_len"),
    (((24.0, 5.0),), (), "speed", "objective"),
    (((24.0, 0.0),), (), "cost", "every period's rate is 0"),
])
def test_bad_questions_refused(periods, buckets, objective, words):
    with pytest.raises(DseError, match=None) as e:
        check_fleet(FleetAsk(BASE, ("h100-sxm",), periods, buckets, objective=objective))
    assert words in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("argv", [
    ["--rate-curve", "abc"], ["--rate-curve", "0:5"], ["--rate-curve", "24:nan"], ["--rate-curve", "24:-1"],
    ["--rate-curve", "24:1e300"], ["--buckets", "1:abc:2", "--request-rate", "5"],
    ["--request-rate", "5", "--rate-curve", "24:5"], [],
    ["--request-rate", "5", "--pd-pairs", "h100-sxm:same:2"], ["--request-rate", "5", "--pd-pairs", "h100-sxm:same:0:2"],
    ["--request-rate", "5", "--pd-pairs", "h100-sxm:same:x:2"],
])
def test_cli_refuses_in_one_line(argv, capsys):
    code = main(["fleet", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--slo-tpot", "0.04", *argv])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err


def test_cli_prints_the_mix_beside_each_type(capsys):
    code = main(["fleet", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--tp", "1", "--weights", "fp8",
                 "--activations", "fp8", "--kv", "fp8", "--slo-tpot", "0.04", "--request-rate", "20"])
    out = capsys.readouterr().out
    assert code == 0 and "Answer (cost)" in out and "h100-sxm:" in out


def test_study_run_writes_the_answer(tmp_path, capsys):
    """A study with a ``fleet:`` section runs through ``dse run`` into fleet.json, fleet.csv, summary.md
    and report.html; the power objective is one key."""
    study = tmp_path / "tiny-fleet.yaml"
    study.write_text("""name: tiny-fleet
description: one H100 SXM engine of Llama-3.1-8B in FP8 at a two-period day, lowest mean power; a test of the fleet study path
space: {hardware: [h100-sxm, gaudi3], model: llama-3.1-8b, prompt_len: 256, gen_len: 256, tp: 1, pp: 1,
        weights: fp8, activations: fp8, kv: fp8, slo_tpot: 0.04}
objectives: {service_cost_usd: min}
fleet: {rate_curve: [[12, 10], [12, 40]], objective: power}
""")
    assert main(["run", str(study), "--out", str(tmp_path / "run")]) == 0
    for f in ("fleet.json", "fleet.csv", "summary.md", "report.html"):
        assert (tmp_path / "run" / f).exists()
    assert "Answer (power)" in capsys.readouterr().out


def test_a_fleet_of_one_pd_pair_is_that_pairs_own_evaluation():
    """A fleet whose only candidate is one disaggregated pair (2 H100 prefill devices and 2 decode, one
    layout) owns the evaluator's ``replicas`` of that P:D point at the rate, each serving its ``goodput``,
    at its price: a P/D replica is priced by the disaggregated model, nothing of its own."""
    rate = 30.0
    pair = PdPair("h100-sxm", "same", 2, 2)
    ask = FleetAsk(BASE, ("h100-sxm",), ((24.0, rate),), pairs=(pair,))
    eng, _ = evaluate_engines(ask)
    pd = np.array(["disaggregate" in r for r in eng.layout])
    assert pd.sum() == 1 and eng.hardware[int(np.flatnonzero(pd)[0])] == "h100-sxm"
    ev = evaluate({**BASE, "hardware": "h100-sxm", "target_rate": rate, "serving": "continuous", "disaggregate": "2:2"})
    m = cheapest_mix(eng, ((24.0, rate),), [1.0], "cost", pd)
    (row,) = m.rows
    assert row["disaggregate"] == "2:2" and row["devices_per_replica"] == ev["devices"][0] == 4
    assert row["goodput_per_replica"][0] == pytest.approx(ev["goodput"][0], rel=1e-9)
    assert row["owned"] == ev["replicas"][0] == math.ceil(rate / ev["goodput"][0])
    assert row["price_usd"] == pytest.approx(ev["cost_usd"][0] * row["owned"])


def test_a_pd_pair_of_two_presets_is_its_own_kind():
    """A pair of two presets (an H100 prefill pool feeding an MI300X decode pool over InfiniBand NDR) is
    beside each single type as a kind of its own, named 'h100-sxm>mi300x'."""
    ask = FleetAsk(BASE, ("h100-sxm",), ((24.0, 10.0),), pairs=(PdPair("h100-sxm", "mi300x", 1, 1, "ib-ndr"),))
    f = fleet(ask)
    assert set(f.single) == {"h100-sxm", "h100-sxm>mi300x"}
    alone = f.single["h100-sxm>mi300x"]
    assert alone is not None and {r["decode_hardware"] for r in alone.rows} == {"mi300x"}
    assert f.mix.usd_per_day <= min(m.usd_per_day for m in f.single.values() if m is not None) * (1 + 1e-9)


@pytest.mark.parametrize("pair, key", [(PdPair("h100-sxm", "same", 0, 2), "prefill_devices"),
                                       (PdPair("h100-sxm", "same", 2, 99), "decode_devices"),
                                       (PdPair("h100-sxm", "", 2, 2), "decode_hardware"),
                                       (PdPair("h100-sxm", "no-such-gpu", 2, 2), "decode_hardware"),
                                       (PdPair("no-such-gpu", "same", 2, 2), "hardware")])
def test_a_bad_pd_pair_is_refused(pair, key):
    with pytest.raises(DseError, match=f"pd_pairs\\[0\\].{key}"):
        check_fleet(FleetAsk(BASE, ("h100-sxm",), ((24.0, 10.0),), pairs=(pair,)))
