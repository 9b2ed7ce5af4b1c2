"""``dse explore``'s callbacks without a browser: the design-point view shows the numbers
``dse analyze --format json`` prints, a reason and never a traceback for a point that cannot run,
a run's filters keep the rows an independent pandas filter keeps, a design opened from a run
reproduces its stored metrics, and a bad run folder is one line and exit 2."""
import json

import numpy as np
import pandas as pd
import pytest

from dse.app.callbacks import compare_table, design_point, design_text, explain_values, get_run, run_points, toggled
from dse.app.data import controls, filter_mask, point_columns
from dse.present.display import quantity_text
from dse.study.cli import main
from dse.system.params import TABLE


def _analyze_json(capsys, *flags) -> dict:
    capsys.readouterr()
    assert main(["analyze", *flags, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def _values(**given) -> dict:
    """The design-point controls at their start, with ``given`` set (as a user sets them)."""
    return {**{c.name: c.value for c in controls()}, **given}


@pytest.mark.parametrize("flags, given", [
    (["--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--batch", "16", "--prompt-len", "1024", "--gen-len", "256",
      "--weights", "fp8", "--activations", "fp8", "--kv", "fp8"],
     {"model": "llama-3.1-8b", "hardware": "h100-sxm", "batch": "16", "prompt_len": 1024, "gen_len": 256,
      "weights": "fp8", "activations": "fp8", "kv": "fp8"}),
    (["--model", "llama-3.1-70b", "--hardware", "mi300x", "--tp", "2", "--request-rate", "2", "--no-flash-attention"],
     {"model": "llama-3.1-70b", "hardware": "mi300x", "tp": 2, "request_rate": 2.0, "flash_attention": "off"}),
])
def test_the_operator_table_is_what_analyze_prints(capsys, flags, given):
    printed = _analyze_json(capsys, *flags)
    view = design_point(_values(**given))
    assert view["message"] == ""
    for stage in ("prefill", "decode"):
        mine = [{k: v for k, v in r.items() if k != "stage"} for r in view["rows"] if r["stage"] == stage]
        assert mine == printed[stage] and len(mine) > 3
    # the summary shows the same point: its hardware, layout and TPOT as analyze's summary gives them
    summary = {r["figure"]: r["value"] for r in view["summary"]}
    assert summary["hardware"] == printed["summary"]["hardware"] and summary["tp"] == str(printed["summary"]["tp"])
    # the roofline draws each operator with ops at ops / time (attained) and intensity as printed
    dots = [t for t in view["roofline"].data if t.mode == "markers"]
    drawn = sorted((x, y) for t in dots for x, y in zip(t.x, t.y))
    expected = sorted((r["arithmetic_intensity"], r["ops"] / r["time_s"]) for st in ("prefill", "decode")
                      for r in printed[st] if r["ops"] and r["arithmetic_intensity"] not in (None, 0))
    assert len(drawn) == len(expected) > 3
    assert np.allclose(np.array(drawn), np.array(expected), rtol=1e-12, atol=0)


def test_every_parameter_has_one_control_from_its_declaration():
    cs = {c.name: c for c in controls()}
    assert list(cs) == [p.name for p in TABLE]
    assert cs["serving"].options == ("static", "continuous")          # its declared choices
    assert "h100-sxm" in cs["hardware"].options and "llama-3.1-8b" in cs["model"].options
    assert cs["prefix_hit"].high == 1.0 and cs["prefix_hit"].low == 0   # below 1, zero allowed
    assert cs["batch"].kind == "text"                                   # a number or 'max'
    # the start of every control is the command line's default: no column beyond what analyze sets
    assert point_columns({c.name: c.value for c in controls()}) == {
        p.name: p.default for p in TABLE if p.flag_default}


def test_a_point_that_cannot_run_shows_its_reason_not_a_traceback():
    big = design_point(_values(model="llama-3.1-405b", hardware="l40s"))
    assert big["message"].startswith("does not fit: ") and "\n" not in big["message"]
    bad = design_point(_values(model="llama-3.1-8b", hardware="h100-sxm", batch="lots"))
    assert bad["message"].startswith("batch: expected a positive integer") and "'max'" in bad["message"]
    assert bad["rows"] == []
    layout = design_point(_values(model="llama-3.1-8b", hardware="h100-sxm", tp=3))
    assert "3" in layout["message"] and layout["message"].startswith("infeasible: ")
    assert design_point(_values(hardware="h100-sxm", model=None))["message"] == (
        "choose the model: every design point names one")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("explore") / "quant-roofline"
    assert main(["run", "quant-roofline", "--out", str(out), "--quiet"]) == 0
    return out


def test_a_filter_keeps_what_pandas_keeps(run):
    r = get_run(str(run))
    df = pd.read_parquet(run / "results.parquet")
    cats, ranges = {"weights": ["fp8", "int4"], "kv": ["fp16"]}, {"batch": (4, 64), "prompt_len": (None, 4096)}
    expected = df[df["weights"].astype(str).isin(["fp8", "int4"]) & (df["kv"].astype(str) == "fp16")
                  & df["batch"].between(4, 64) & (df["prompt_len"] <= 4096)]
    got = r.columns(["weights", "kv", "batch", "prompt_len"])
    keep = filter_mask(got, cats, ranges)
    assert sorted(got.loc[keep, "point"]) == sorted(expected["point"]) and 0 < len(expected) < len(df)
    fig, text = run_points(r, "tpot_s", "output_tokens_per_s", "weights", "activations", cats, ranges)
    shown = expected[expected[["tpot_s", "output_tokens_per_s"]].notna().all(axis=1)]
    assert sum(len(t.x) for t in fig.data) == len(shown)
    assert sorted(int(c[0]) for t in fig.data for c in t.customdata) == sorted(shown["point"])
    assert text.startswith(f"{len(shown):,} designs drawn; {len(expected):,} of the {len(df):,} rows")


def test_a_design_opened_from_the_run_reproduces_its_stored_metrics(run):
    r = get_run(str(run))
    df = pd.read_parquet(run / "results.parquet")
    row = df[df["feasible"]].iloc[7]
    values = explain_values(r, int(row["point"]))
    assert values["weights"] == row["weights"] and values["batch"] == str(row["batch"])
    view = design_point(values, ideal=r.ideal)
    assert r.ideal is True      # quant-roofline runs the ideal roofline: the view must too
    summary = dict(zip((x["figure"] for x in view["summary"]), (x["value"] for x in view["summary"])))
    assert summary["tpot_s"] == quantity_text("tpot_s", float(row["tpot_s"]))
    assert summary["output_tokens_per_s"] == quantity_text("output_tokens_per_s", float(row["output_tokens_per_s"]))


def test_hover_and_comparison_show_the_designs_parameters(run):
    r = get_run(str(run))
    df = pd.read_parquet(run / "results.parquet").set_index("point")
    shown = {x["column"]: x["value"] for x in design_text(r, 5)}
    for c in ("weights", "activations", "kv", "batch", "prompt_len"):
        assert shown[c] == (f"{df.loc[5, c]:,}" if c in ("batch", "prompt_len") else str(df.loc[5, c]))
    rows, cols = compare_table(r, [5, 900])
    assert [c["id"] for c in cols] == ["column", "5", "900"]
    weights = next(x for x in rows if x["column"] == "weights")
    assert (weights["5"], weights["900"]) == (str(df.loc[5, "weights"]), str(df.loc[900, "weights"]))
    assert toggled(toggled([1, 2], 3), 2) == [1, 3]


@pytest.mark.parametrize("make", ["missing", "empty", "broken"])
def test_a_bad_run_folder_is_one_line_and_exit_2(tmp_path, capsys, make):
    folder = tmp_path / "run"
    if make != "missing":
        folder.mkdir()
    if make == "broken":
        (folder / "results.parquet").write_bytes(b"not parquet at all")
    assert main(["explore", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"dse.study: error: {folder}") and "Traceback" not in err


def test_an_unusable_port_is_one_line_and_exit_2(capsys):
    assert main(["explore", "--port", "0"]) == 2
    assert "--port: expected a TCP port" in capsys.readouterr().err


def test_a_large_run_draws_a_uniform_sample_and_says_so(tmp_path):
    # a run that kept its Pareto designs alone (pareto.csv), 25,000 of them, a tenth without a TPOT
    rng = np.random.default_rng(1)
    n = 25_000
    tpot = rng.uniform(0.01, 0.1, n)
    tpot[::10] = np.nan
    pd.DataFrame({"point": np.arange(n), "weights": np.where(np.arange(n) % 2, "fp8", "fp16"),
                  "output_tokens_per_s": rng.uniform(10, 1000, n), "tpot_s": tpot}).to_csv(tmp_path / "pareto.csv",
                                                                                         index=False)
    r = get_run(str(tmp_path))
    fig, text = run_points(r, "tpot_s", "output_tokens_per_s", "weights", None, {}, {})
    ids = np.concatenate([np.asarray(t.customdata)[:, 0] for t in fig.data]).astype(int)
    assert len(ids) == 20_000 == len(set(ids)) and not np.isin(ids, np.arange(0, n, 10)).any()
    assert text == ("20,000 designs drawn (a uniform sample of 22,500); 25,000 of the 25,000 rows in pareto.csv pass "
                    "the filters, 2,500 of them without a value of tpot_s or output_tokens_per_s")
