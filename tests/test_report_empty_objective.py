"""A study whose objectives are empty (NaN) for every design (no preset prices it) is refused up
front with the reason, never a crash (issue 43: a ZeroDivisionError in the Pareto plot)."""
import pytest
import yaml

from dse.study.cli import main

#: l40s and gh200: neither preset cites a price, so every cost column is empty
SPACE = {"hardware": ["l40s", "gh200"], "model": "llama-3.1-8b", "batch": [1, 4]}


@pytest.mark.parametrize("objectives", [
    {"output_tokens_per_s": "max", "cost_per_million_tokens_usd": "min"},
    {"tpot_s": "min", "cost_per_million_tokens_usd": "min", "cost_usd": "min"},     # no throughput objective
])
def test_a_study_whose_objective_is_empty_for_every_design_is_refused_up_front(tmp_path, capsys, objectives):
    """Neither preset can have a cost: the study is refused before it runs, in one line naming the
    study file, the objective and what each hardware lacks, and writes nothing (the report's own
    handling of an empty Pareto panel is tested on pareto_plot directly, in test_issue41_regressions)."""
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump({"name": "unpriced", "description": "every cost objective empty " * 4,
                                    "space": SPACE, "objectives": objectives, "method": "grid"}))
    out = tmp_path / "run"
    assert main(["run", str(path), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "study.yaml: objectives.cost_" in err and "no design can have a value" in err
    assert "l40s" in err and "gh200" in err
    assert not (out / "plots.json").exists()
