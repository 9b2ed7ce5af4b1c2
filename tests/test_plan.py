"""``dse plan`` (dse.explore.plan, dse.study.plan_cli): the fewest devices and the cheapest fleet
per hardware for a request rate within SLOs; plan studies; objectives no design can have refused."""
import json
import math

import pytest
import yaml
from conftest import run_cli

from basis.errors import DseError
from dse import evaluate
from dse.core.economics import economics_defaults
from dse.explore.plan import ROW_KEYS, PlanAsk, plan
from dse.study.cli import main

pytestmark = pytest.mark.usefixtures("fixed_calibration")

#: a small question: Llama-3.1-8B on H100s, 2 layouts x 3 formats, one engine setting
BASE = dict(model="llama-3.1-8b", prompt_len=1024, gen_len=128, slo_ttft=0.5, slo_tpot=0.02)
FIXED = {"tp": [1, 2], "pp": [1], "max_running": [256], "prefill_chunk": [8192]}
SMALL = ["--model", "llama-3.1-8b", "--prompt-len", "1024", "--gen-len", "128", "--tp", "1", "--pp", "1",
         "--max-running", "256", "--prefill-chunk", "8192", "--weights", "fp8", "--activations", "fp8", "--kv", "fp8"]


def small(**kw) -> PlanAsk:
    args = dict(base=BASE, hardware=("h100-sxm", "mi300x"), rate=30.0, fixed=FIXED)
    return PlanAsk(**{**args, **kw})


@pytest.fixture(scope="module")
def answer():
    return plan(small())


def test_device_count_is_rate_over_the_chosen_engines_goodput(answer):
    for rows in answer.layouts.values():
        r = rows[0]
        # the chosen engine alone, evaluated again as one point: its goodput under the SLOs
        one = evaluate({**BASE, "hardware": r["hardware"], "tp": r["tp"], "pp": r["pp"], "weights": r["weights"],
                        "activations": r["activations"], "kv": r["kv"], "max_running": r["max_running"],
                        "prefill_chunk": r["prefill_chunk"], "serving": "continuous"})
        good = float(one["goodput"][0])
        assert r["replicas"] == math.ceil(30.0 / good)
        assert r["devices"] == math.ceil(30.0 / good) * r["tp"] * r["pp"]
        assert r["rate_per_replica"] <= good          # each replica carries no more than it serves in the SLOs
        assert r["ttft_s"] <= BASE["slo_ttft"] and r["tpot_s"] <= BASE["slo_tpot"]
    best = answer.fewest
    assert best["devices"] == min(rows[0]["devices"] for rows in answer.layouts.values())


def test_a_looser_slo_never_needs_more_devices(answer):
    loose = plan(small(base={**BASE, "slo_ttft": 2.0, "slo_tpot": 0.05}))
    for h, rows in answer.layouts.items():
        assert loose.layouts[h][0]["devices"] <= rows[0]["devices"]
    more = plan(small(rate=60.0))                     # and twice the rate never needs fewer
    for h, rows in answer.layouts.items():
        assert more.layouts[h][0]["devices"] >= rows[0]["devices"]


def test_rows_are_ranked_fewest_devices_first_with_distinct_layouts(answer):
    for rows in answer.layouts.values():
        assert [r["devices"] for r in rows] == sorted(r["devices"] for r in rows)
        keys = [(r["tp"], r["pp"], r["weights"], r["activations"], r["kv"]) for r in rows]
        assert len(keys) == len(set(keys))
        assert all(list(r) == list(ROW_KEYS) for r in rows)


def test_cost_ranks_by_price_and_energy_where_given():
    # a price and a static power given to every hardware: $ per million tokens is known everywhere,
    # the cheapest fleet is the lowest of it, and fleet $/h is that rate times the fleet's tokens
    a = plan(small(base={**BASE, "price_usd": 25000.0, "static_power_w": 88.0}, hardware=("h100-sxm",),
                   objectives=("devices", "cost")))
    rows = a.layouts["h100-sxm"]
    assert a.cheapest["cost_per_million_tokens_usd"] == min(r["cost_per_million_tokens_usd"] for r in rows)
    c = a.cheapest
    assert c["fleet_usd_per_hour"] == pytest.approx(c["cost_per_million_tokens_usd"] * c["output_tokens_per_s"]
                                                    * 3600 / 1e6)
    assert c["output_tokens_per_s"] == pytest.approx(30.0 * 128, rel=1e-6)   # the service's rate x answer length
    assert c["fleet_price_usd"] == pytest.approx(25000.0 * c["devices"])
    # the fleet's price spread over its life (configs/economics.yaml) is a floor of its $/h: electricity adds to it
    years = economics_defaults()["amortization_years"]
    capital = c["fleet_price_usd"] / (years * 365.25 * 24)
    assert capital < c["fleet_usd_per_hour"] < capital + c["devices"] * 0.7 * 1.0   # at most 700 W TDP at $1/kWh


def test_json_keys_are_stable():
    r = run_cli("plan", *SMALL, "--hardware", "h100-sxm", "--request-rate", "30", "--slo-ttft", "0.5",
                "--slo-tpot", "0.02", "--format", "json", timeout=120)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert set(doc) == {"answer", "hardware", "candidates", "slo_percentile", "notes"}
    assert set(doc["answer"]) == {"fewest_devices", "cheapest"}
    assert list(doc["answer"]["fewest_devices"]) == list(ROW_KEYS)
    assert set(doc["hardware"]["h100-sxm"]) == {"fewest_devices", "layouts"}
    assert doc["candidates"] == 1 and doc["slo_percentile"] == 90
    assert doc["answer"]["cheapest"]["cost_per_million_tokens_usd"] > 0   # the H100's price and power are known


@pytest.mark.parametrize("extra, words", [
    (["--hardware", "nope", "--request-rate", "20", "--slo-ttft", "1"], "--hardware: unknown hardware 'nope'"),
    (["--hardware", "h100-sxm", "--request-rate", "0", "--slo-ttft", "1"], "--request-rate"),
    (["--hardware", "h100-sxm", "--request-rate", "20", "--slo-ttft", "0"], "--slo-ttft"),
    (["--hardware", "h100-sxm", "--request-rate", "20", "--slo-tpot", "-1"], "--slo-tpot"),
    (["--hardware", "h100-sxm", "--request-rate", "nan", "--slo-ttft", "1"], "--request-rate"),
    (["--hardware", "h100-sxm", "--request-rate", "20"], "give slo_ttft and/or slo_tpot"),
    (["--hardware", "h100-sxm", "--slo-ttft", "1"], "--request-rate"),
    (["--hardware", "h100-sxm", "--request-rate", "20", "--slo-ttft", "1", "--batch", "4"], "--batch"),
    (["--hardware", "h100-sxm", "--request-rate", "20", "--slo-ttft", "0.0001", "--slo-tpot", "0.0001"],
     "best TTFT p90 reached"),
    (["--hardware", "h100-sxm", "l40s", "--request-rate", "20", "--slo-ttft", "1", "--objective", "cost"],
     "cost asked, and l40s has no $ per million tokens: cost per token unknown: the device has no cited price"),
    (["--hardware", "l40s", "--request-rate", "20", "--slo-ttft", "1", "--objective", "cost"],
     "l40s has no $ per million tokens: cost per token unknown: the device has no cited price"),
])
def test_bad_inputs_are_one_line_exit_2(extra, words):
    r = run_cli("plan", *SMALL, *extra, timeout=120)
    assert r.returncode == 2, r.stdout
    assert words in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_the_plan_answers_below_its_ceiling_of_devices():
    # a replica of at most 1 device: every layout of the answer has 1, and the model has to fit one
    a = plan(small(fixed={k: v for k, v in FIXED.items() if k != "tp"}, max_devices=1))
    assert {r["devices_per_replica"] for rows in a.layouts.values() for r in rows} == {1}
    with pytest.raises(DseError, match="no layout of h100-sxm .* runs the model|no layout of h100-sxm"):
        plan(small(base={**BASE, "model": "llama-3.1-405b"}, hardware=("h100-sxm",), max_devices=1,
                   fixed={**FIXED, "tp": [1]}))


def _study(tmp_path, **plan_section) -> str:
    doc = {"name": "plan-small", "description": "A small plan study for the tests of dse plan. " * 3,
           "space": {"hardware": ["h100-sxm"], **BASE, "target_rate": 30, "tp": [1, 2], "pp": 1,
                     "max_running": 256, "prefill_chunk": 8192},
           "objectives": {"service_devices": "min"}, "plan": plan_section}
    path = tmp_path / "plan-small.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_a_plan_study_runs_into_plan_json_and_answers_as_the_command(tmp_path):
    study = _study(tmp_path, objectives=["devices"], top=3)
    r = run_cli("run", study, "--out", tmp_path / "out", timeout=180)
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert (tmp_path / "out" / "plan.csv").read_text().startswith(",".join(ROW_KEYS))
    summary = (tmp_path / "out" / "summary.md").read_text()
    fewest = doc["hardware"]["h100-sxm"]["fewest_devices"]
    # the answer table: the fewest devices of each hardware, as plan.json has them
    assert "## The study's answer: the fewest devices per hardware" in summary
    assert f"| h100-sxm | {fewest['devices']} | {fewest['replicas']} |" in summary
    assert "answer-table" in (tmp_path / "out" / "report.html").read_text()
    same = json.loads(run_cli("plan", "--study", study, "--format", "json", timeout=180).stdout)
    assert same == doc
    direct = plan(small(hardware=("h100-sxm",)))
    assert doc["answer"]["fewest_devices"]["devices"] == direct.fewest["devices"]


def test_a_plan_study_names_its_bad_keys(tmp_path):
    r = run_cli("plan", "--study", _study(tmp_path, objective=["devices"]))
    assert r.returncode == 2 and "plan: unknown key(s) objective" in r.stderr


def test_a_study_whose_objective_no_design_can_have_is_refused_before_it_runs(tmp_path):
    # the L40S preset cites no price: $ per million tokens is empty for
    # every design, which ended in a ZeroDivisionError in the Pareto plot (issue 43)
    path = tmp_path / "nocost.yaml"
    path.write_text(yaml.safe_dump({"name": "nocost", "space": {"hardware": ["l40s"], "model": "llama-2-7b",
                                                                "batch": [1, 4]},
                                    "objectives": {"cost_per_million_tokens_usd": "min", "tpot_s": "min"}}))
    r = run_cli("run", path, "--out", tmp_path / "o")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "objectives.cost_per_million_tokens_usd: no design can have a value" in r.stderr
    assert "no cited price" in r.stderr
    assert not (tmp_path / "o" / "results.parquet").exists()
    # one hardware with a price and an energy figure: the study runs (its other designs have no value)
    path.write_text(yaml.safe_dump({"name": "nocost", "space": {"hardware": ["l40s", "h100-sxm"],
                                                                "model": "llama-2-7b", "static_power_w": 88},
                                    "objectives": {"cost_per_million_tokens_usd": "min"}}))
    r = run_cli("run", path, "--out", tmp_path / "o2", timeout=180)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("key, value", [("max_devices", 0), ("top", -3), ("top", float("nan")),
                                        ("max_devices", float("inf")), ("top", 10 ** 6), ("max_devices", True)])
def test_a_plan_studys_bad_count_is_refused_naming_the_file_before_its_folder(tmp_path, capsys, key, value):
    study = _study(tmp_path, **{key: value})
    out = tmp_path / "out"
    assert main(["run", study, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"plan-small.yaml: plan: {key}: expected an integer from 1 to 1024" in err
    assert not out.exists()
