"""A study whose objectives are empty (NaN) for every design (no preset prices it) still gets
its report: each Pareto plot it cannot draw is left out with the reason stated in summary.md,
never a crash (issue 43: a ZeroDivisionError in the Pareto plot)."""
import json

import pytest
import yaml

from dse.study.cli import main

#: h200 and mi300x: neither preset cites a price, so every cost column is empty
SPACE = {"hardware": ["h200", "mi300x"], "model": "llama-3.1-8b", "batch": [1, 4]}


@pytest.mark.parametrize("objectives", [
    {"output_tokens_per_s": "max", "cost_per_million_tokens_usd": "min"},
    {"tpot_s": "min", "cost_per_million_tokens_usd": "min", "cost_usd": "min"},     # no throughput objective
])
def test_a_pareto_plot_of_an_empty_objective_is_left_out_with_its_reason(tmp_path, objectives):
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump({"name": "unpriced", "description": "every cost objective empty " * 4,
                                    "space": SPACE, "objectives": objectives, "method": "grid"}))
    out = tmp_path / "run"
    assert main(["run", str(path), "--out", str(out), "--quiet"]) == 0
    plots = json.loads((out / "plots.json").read_text())
    pareto = {f: r for f, r in plots.items() if r["kind"] == "pareto"}
    assert pareto and all("skipped" in r for r in pareto.values()), pareto
    summary = (out / "summary.md").read_text()
    assert "no feasible design has a value of cost_per_million_tokens_usd" in summary
    for f, r in pareto.items():
        assert f"{f}: {r['skipped']}." in summary
