"""Plots checked against the data they draw: each plotting function returns a record of
what it put on the canvas (groups with their colours and markers, tick labels, units,
labels), and the report writes the records to plots.json."""
import json

import numpy as np
import pandas as pd
import pytest
from conftest import run_cli

from basis.units import bytes_text
from dse.explore.pareto import pareto_mask
from dse.present import plots
from dse.present.display import quantity_text

# --------------------------------------------------------------------------- units

def test_axis_units_follow_the_one_unit_policy():
    assert plots.unit_of("memory_capacity")[:2] == (2**30, "GiB")
    assert plots.unit_of("peak_fp8")[1] == "TFLOP/s" and plots.unit_of("peak_int8")[1] == "TOP/s"
    assert plots.axis_unit("memory_bandwidth", [1e12, 1.6e13])[:2] == (1e12, "TB/s")
    assert plots.axis_unit("memory_capacity", [4e10, 4e11])[:2] == (2**30, "GiB")
    assert plots.axis_unit("onchip_buffer_bytes", [228 * 1024])[:2] == (1024, "KiB")
    assert plots.axis_unit("tpot_s", [1e-3, 8e-3])[:2] == (1e-3, "ms")
    assert plots.axis_unit("ttft_s", [0.2, 80.0])[:2] == (1.0, "s")
    h100 = 80 * 2**30
    assert plots.human("memory_capacity", h100) == quantity_text("memory_capacity", h100) == bytes_text(h100) \
        == "80 GiB"
    assert plots.label_of("devices") == "devices" and plots.label_of("batch") == "batch (sequences)"


def test_log_axes_label_1_2_5_under_two_decades_and_each_decade_beyond(tmp_path):
    fig, (ax,) = plots._figure()
    v = np.array([200.0, 20_000.0])
    ax.plot([1, 2], v)
    plots._log_axis(ax, "y", v)
    fig.draw_without_rendering()
    assert plots._tick_labels(ax.yaxis) == ["200", "500", "1,000", "2,000", "5,000", "10,000", "20,000"]
    fig, (ax,) = plots._figure()
    v = np.array([1e-3, 1e4])
    ax.plot([1, 2], v)
    plots._log_axis(ax, "y", v)
    fig.draw_without_rendering()
    labels = plots._tick_labels(ax.yaxis)
    assert {"0.001", "0.01", "0.1", "1", "10", "100", "1,000", "10,000"} <= set(labels) and "2" not in labels


# --------------------------------------------------------------------------- Pareto

def _designs(n_per=2, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for w in ("fp16", "fp8", "int4"):
        for kv in ("fp16", "fp8"):
            for a in ("fp16", "fp8"):
                for _ in range(n_per):
                    rows.append({"weights": w, "kv": kv, "activations": a, "tpot_s": rng.uniform(1e-3, 9e-3),
                                 "output_tokens_per_s": rng.uniform(200, 20_000), "feasible": True})
    df = pd.DataFrame(rows)
    df["point"] = np.arange(len(df))
    return df


def test_pareto_colours_markers_and_panels_follow_the_categorical_parameters(tmp_path):
    df = _designs()
    senses = {"output_tokens_per_s": "max", "tpot_s": "min"}
    front = df[pareto_mask(df[["output_tokens_per_s", "tpot_s"]].to_numpy(), ["max", "min"])]
    rec = plots.pareto_plot(tmp_path / "p.png", df, front, "tpot_s", "output_tokens_per_s", senses,
                            hue="weights", style="kv", facet="activations")
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    assert rec["mode"] == "points" and rec["x_unit"] == "ms" and rec["y_log"]
    colour = {g["hue"]: g["colour"] for g in rec["groups"]}
    assert len(set(colour.values())) == 3                           # one colour per weights format
    for g in rec["groups"]:                                         # ... the same in every panel and marker
        assert g["colour"] == colour[g["hue"]]
        sub = df[(df["weights"] == g["hue"]) & (df["kv"] == g["style"]) & (df["activations"] == g["facet"])]
        assert g["background_points"] == len(sub)
        assert sorted(g["points"]) == sorted(front.loc[front.index.isin(sub.index), "point"])
    marker = {g["style"]: g["marker"] for g in rec["groups"]}
    assert len(set(marker.values())) == 2 and all(g["marker"] == marker[g["style"]] for g in rec["groups"])
    assert sorted(p for g in rec["groups"] for p in g["points"]) == sorted(front["point"])
    assert {f"  {w}" for w in ("fp16", "fp8", "int4")} <= set(rec["legend"]) and "colour: weights" in rec["legend"]
    assert [p["facet"] for p in rec["panels"]] == ["fp16", "fp8"]
    for p in rec["panels"]:                                         # each panel's own 2-objective front
        f = front[front["activations"] == p["facet"]]
        m = pareto_mask(f[["tpot_s", "output_tokens_per_s"]].to_numpy(), ["min", "max"])
        assert sorted(p["front_2d"]) == sorted(f["point"][m])
    assert "colour: weights, marker: kv, panels: activations" in rec["title"]


def test_a_large_front_is_drawn_as_density_with_its_2d_front_on_top(tmp_path):
    rng = np.random.default_rng(1)
    n = plots.LARGE_FRONT + 1000
    front = pd.DataFrame({"memory_bandwidth": rng.uniform(1e12, 1.6e13, n), "peak_fp8": rng.uniform(2.5e14, 1e16, n),
                          "output_tokens_per_s": rng.uniform(10, 4000, n), "point": np.arange(n)})
    senses = {"output_tokens_per_s": "max", "memory_bandwidth": "min", "peak_fp8": "min"}
    rec = plots.pareto_plot(tmp_path / "d.png", front.iloc[:500], front, "memory_bandwidth", "output_tokens_per_s",
                            senses, title="t")
    assert rec["mode"] == "density" and rec["density_designs"] == n
    m = pareto_mask(front[["memory_bandwidth", "output_tokens_per_s"]].to_numpy(), ["min", "max"])
    assert sorted(rec["front_2d"]) == sorted(front["point"][m])
    assert rec["colour_by"] == "peak_fp8" and rec["colour_unit"] == "TFLOP/s"
    np.testing.assert_allclose(sorted(rec["colour_values"]), sorted(front["peak_fp8"][m] / 1e12))
    assert f"{n:,} Pareto designs drawn as density" in rec["title"] and "coloured by peak FP8" in rec["title"]
    assert rec["x_unit"] == "TB/s"


# --------------------------------------------------------------------------- roofline and breakdown

@pytest.fixture(scope="module")
def analyses():
    from dse.system.analysis import analyze_point
    a = analyze_point({"model": "llama-3.1-8b", "hardware": "h100-sxm", "batch": 16, "prompt_len": 1024,
                       "gen_len": 128, "weights": "fp8", "activations": "fp8", "kv": "fp8",
                       "flash_attention": True})[0]
    b = analyze_point({"model": "mixtral-8x7b", "hardware": "h100-sxm", "tp": 2, "ep": 4, "batch": 64,
                       "prompt_len": 512, "gen_len": 64})[0]
    return a, b


def test_roofline_numbers_every_operator_once_and_labels_each_point(tmp_path, analyses):
    a, _ = analyses
    rec = plots.roofline_plot(tmp_path / "r.png", a)
    plotted = [o for o in rec["operators"] if o["plotted"]]
    assert list(rec["numbers"]) == list(dict.fromkeys(o["name"] for o in plotted))
    assert sorted(rec["numbers"].values()) == list(range(1, len(rec["numbers"]) + 1))
    labelled = [op for lab in rec["labels"] for op in lab["operators"]]
    assert sorted(labelled) == sorted(f"{o['stage']}:{o['name']}" for o in plotted)     # each point, once
    for lab in rec["labels"]:
        assert lab["numbers"] == sorted({rec["numbers"][op.split(":")[1]] for op in lab["operators"]})
    assert rec["colours"] == {n: plots.op_colour(n) for n in rec["numbers"]}
    assert rec["y_unit"] == "TFLOP/s" and "10^" not in "".join(rec["y_ticks"])


def test_breakdown_colours_are_fixed_per_operator_across_panels_and_plots(tmp_path, analyses):
    a, b = analyses
    r1 = plots.breakdown_plot(tmp_path / "b1.png", [{"label": "a", "point": 0, "analysis": a}])
    r2 = plots.breakdown_plot(tmp_path / "b2.png", [{"label": "b", "point": 1, "analysis": b},
                                                    {"label": "a", "point": 0, "analysis": a}])
    for rec in (r1, r2):
        for st in rec["stages"].values():
            assert st["colours"] == {n: plots.op_colour(n) for n in st["operators"]}
    shared = set(r1["colours"]) & set(r2["colours"])
    assert {"q_proj", "o_proj"} <= shared or shared                     # the same operator, the same colour
    assert all(r1["colours"][n] == r2["colours"][n] for n in shared)
    assert len(set(plots.OP_COLOURS.values())) == len(plots.OP_COLOURS)  # no two operators share a colour
    assert plots.op_colour("sliding_qk_matmul") == plots.op_colour("qk_matmul")


# --------------------------------------------------------------------------- sweep and validation

def test_sweep_legend_lists_the_series_and_lines_keep_their_style(tmp_path):
    rows = [{"point": i, "feasible": p < 16384 or w != "fp16", "prompt_len": p, "weights": w,
             "ttft_s": p * 1e-4 * (2 if w == "fp16" else 1), "tpot_s": 2e-3 + p * 1e-8}
            for i, (w, p) in enumerate((w, p) for w in ("fp16", "fp8", "int4") for p in (1024, 4096, 16384))]
    rec = plots.sweep_plot(tmp_path / "s.png", [{"data": pd.DataFrame(rows), "x": "prompt_len",
                                                 "ys": ["ttft_s", "tpot_s"], "hue": "weights", "log_y": True}], "t")
    assert rec["legend"] == ["weights = fp16", "weights = fp8", "weights = int4",
                             "infeasible (not fitting, or an SLO missed)"]
    panel = rec["panels"][0]
    assert panel["y_units"] == {"ttft_s": "s", "tpot_s": "ms"} and panel["x_ticks"] == ["1,024", "4,096", "16,384"]
    style = {}
    for line in panel["lines"]:
        assert style.setdefault(line["hue"], (line["colour"], line["marker"], line["dash"])) == \
            (line["colour"], line["marker"], line["dash"])
        expect = [r for r in rows if r["weights"] == line["hue"]]
        assert line["x_values"] == [r["prompt_len"] for r in expect if r["feasible"]]
        assert line["infeasible_points"] == [r["point"] for r in expect if not r["feasible"]]
    assert len({s[0] for s in style.values()}) == 3


def test_validation_plot_has_one_panel_per_metric_in_its_unit(tmp_path):
    rows = [{"id": "a", "metric": "ttft_s", "measured": 0.020, "predicted": 0.022, "hardware": "h100-sxm"},
            {"id": "b", "metric": "ttft_s", "measured": 0.050, "predicted": 0.045, "hardware": "a100-80gb"},
            {"id": "c", "metric": "output_tokens_per_s", "measured": 900.0, "predicted": 1000.0,
             "hardware": "h100-sxm"}]
    rec = plots.validation_plot(tmp_path / "v.png", rows, "t")
    by = {p["metric"]: p for p in rec["panels"]}
    assert list(by) == ["ttft_s", "output_tokens_per_s"]
    assert by["ttft_s"]["unit"] == "ms" and by["ttft_s"]["x_label"] == "measured TTFT (ms)"
    np.testing.assert_allclose(by["ttft_s"]["measured"], [20.0, 50.0])
    np.testing.assert_allclose(by["ttft_s"]["predicted"], [22.0, 45.0])
    assert by["output_tokens_per_s"]["unit"] == "tokens/s" and by["output_tokens_per_s"]["predicted"] == [1000.0]
    assert rec["ratio_ids"] == ["b", "a", "c"]        # 0.9, 1.1, 1.11


# --------------------------------------------------------------------------- the report's choices

STUDY = """\
name: plot-choices
space:
  hardware: [l40s, gaudi3]
  model: llama-3.1-8b
  weights: [fp16, fp8]
  kv: [fp16, fp8]
  batch: [1, 256]
  devices: [1, 2]
  prompt_len: [1024, 8192]
  gen_len: 64
  flash_attention: false         # gaudi3 has no on-chip buffer size for it
objectives:
  output_tokens_per_s: max
  tpot_s: min
method: grid
"""


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    d = tmp_path_factory.mktemp("choices")
    (d / "study.yaml").write_text(STUDY)
    r = run_cli("run", d / "study.yaml", "--out", d / "out", "--quiet")
    assert r.returncode == 0, r.stderr
    return {"plots": json.loads((d / "out" / "plots.json").read_text()),
            "results": pd.read_parquet(d / "out" / "results.parquet"), "out": d / "out"}


def test_report_encodes_the_categorical_parameters_in_pareto_plots(report):
    rec = report["plots"]["pareto_tpot_s.png"]
    assert (rec["hue"], rec["style"], rec["facet"]) == ("hardware", "weights", "kv")   # ties: study order
    res = report["results"].set_index("point")
    for g in rec["groups"]:
        assert (res.loc[g["points"], "hardware"] == g["hue"]).all() and (res.loc[g["points"], "kv"] == g["facet"]).all()


def test_cost_plot_draws_only_priced_designs_and_says_so(report):
    rec = report["plots"]["pareto_cost_usd.png"]
    res = report["results"]
    assert "skipped" not in rec and "presets with price_usd: gaudi3" in rec["note"]
    priced = res["feasible"] & res["cost_usd"].notna()
    assert rec["background_points"] == int(priced.sum()) and set(res.loc[priced, "hardware"]) == {"gaudi3"}
    assert (report["out"] / "pareto_cost_usd.png").is_file()


def test_cost_plot_is_skipped_with_a_note_when_no_preset_has_a_price(tmp_path):
    (tmp_path / "s.yaml").write_text(STUDY.replace("[l40s, gaudi3]", "[l40s, gh200]"))
    r = run_cli("run", tmp_path / "s.yaml", "--out", tmp_path / "o", "--quiet")
    assert r.returncode == 0, r.stderr
    rec = json.loads((tmp_path / "o" / "plots.json").read_text())["pareto_cost_usd.png"]
    assert rec["skipped"].startswith("no cost plot: no preset in this study has price_usd")
    assert not (tmp_path / "o" / "pareto_cost_usd.png").exists()
    assert rec["skipped"] in (tmp_path / "o" / "summary.md").read_text()


def test_sequence_sweep_covers_the_swept_axis_with_few_series(report):
    rec = report["plots"]["sweep_seq.png"]
    res = report["results"].set_index("point")
    panel = rec["panels"][0]
    assert panel["x"] == "prompt_len" and panel["hue"] == "hardware"
    xs = {x for line in panel["lines"] for x in line["x_values"]}
    assert xs == {1024, 8192}                       # the base design (batch 256) fits only the short prompt
    assert rec["fixed"]["batch"] == 1
    assert len(rec["legend"]) <= res["hardware"].nunique() + 1
    for line in panel["lines"]:
        pts = res.loc[line["points"] + line["infeasible_points"]]
        assert (pts["hardware"] == line["hue"]).all()
        assert all((pts[k] == v).all() for k, v in rec["fixed"].items())


# --------------------------------------------------------------------------- declared comparisons and charts

def _flash_designs():
    """12 designs: 2 GPUs x FlashAttention on/off x 3 prompt lengths, the longest unfused ones infeasible."""
    d = pd.DataFrame({"point": np.arange(12), "hardware": np.repeat(["a", "b"], 6),
                      "flash_attention": np.tile(np.repeat([True, False], 3), 2),
                      "prompt_len": np.tile([1024, 4096, 16384], 4),
                      "memory_bandwidth": np.repeat([2.0e12, 3.35e12], 6)})
    d["ttft_s"] = d["prompt_len"] * np.where(d["flash_attention"], 1e-5, 1.5e-5)
    d["feasible"] = ~((~d["flash_attention"]) & (d["prompt_len"] == 16384))
    return d


def test_a_comparison_draws_a_panel_per_y_and_facet_and_a_line_per_colour(tmp_path):
    d = _flash_designs()
    panels = [{"data": d[d["hardware"] == h], "x": "prompt_len", "y": "ttft_s", "colour": "flash_attention",
               "row": 1, "col": i, "label": f"hardware = {h}"} for i, h in enumerate(["a", "b"], 1)]
    rec = plots.comparison_plot(tmp_path / "c.png", panels, "t")
    assert (tmp_path / "c.png").stat().st_size > 5_000
    assert [p["label"] for p in rec["panels"]] == ["hardware = a", "hardware = b"]
    lines = {(t["panel"], t["colour"]): t for t in rec["traces"]}
    assert len(lines) == 4
    # a line holds the feasible designs of its panel and colour, along x; the infeasible ones are crosses
    assert lines[("hardware = a", False)]["points"] == [3, 4] and lines[("hardware = b", True)]["points"] == [6, 7, 8]
    assert lines[("hardware = a", True)]["y_values"] == pytest.approx([0.01024, 0.04096, 0.16384])
    assert rec["legend"] == ["flash_attention = False", "flash_attention = True", "infeasible"]


def test_a_chart_hover_shows_each_designs_parameters_in_display_units():
    from dse.present.interactive import panels_chart, pareto_chart
    d = _flash_designs()
    chart = pareto_chart(d[d["feasible"]], d.iloc[[0, 6]], "memory_bandwidth", "ttft_s", "hardware",
                         ["point", "hardware", "memory_bandwidth"], "t")
    front = [t for t in chart["data"] if t["name"].startswith("hardware = ")]
    assert [t["name"] for t in front] == ["hardware = a", "hardware = b"]
    assert front[1]["customdata"] == [[6, "b", 3.35]]                  # TB/s, as the axis
    assert front[1]["hovertemplate"].split("<br>")[2] == "memory_bandwidth: %{customdata[2]:.4~g} TB/s<extra></extra>"
    assert chart["layout"]["xaxis"]["title"]["text"] == "memory bandwidth (TB/s)"
    panels = [{"data": d, "x": "prompt_len", "y": "ttft_s", "colour": "flash_attention", "row": 1, "col": 1,
               "label": ""}]
    traces = panels_chart(panels, ["point"], "t")["data"]
    crosses = [t for t in traces if t["name"] == "infeasible"]
    assert len(crosses) == 1 and [c[0] for c in crosses[0]["customdata"]] == [5, 11]
    assert sum(len(t["x"]) for t in traces) == len(d)                 # every design once
