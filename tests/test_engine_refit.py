"""Engines whose whole step is one program compiled ahead of time pay no launch per operator (issue
42: every class by its own physics, never another class's constants), and ``calibrate --engine``
refits one engine's own values on its rows with every other value held."""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

from basis.errors import DseError
from basis.shipped import shipped
from dse import evaluate
from dse.core.efficiency import CALIBRATION_ENV, efficiency_for, load_calibration
from dse.core.engines import (
    COMPILED,
    ENGINES_FILE,
    _profiles,
    engine_efficiency,
    engine_parameters,
    engines,
    get_engine,
)
from dse.fit import calibrate as C
from dse.fit.refit import refit
from hwmodels.presets import load_device

NEURON_POINT = {"hardware": "inferentia2", "devices": 12, "tp": 12, "batch": 1, "prompt_len": 128, "gen_len": 128,
                "weights": "bf16", "activations": "bf16", "engine": "neuron"}
#: operator instances of a Llama decode step under tensor parallelism: per layer the attention's
#: norm, q, k, v, attention, o, all-reduce and residual add, the MLP's norm, gate, up, activation,
#: down, all-reduce and residual add (15); per step the embedding, final norm and LM head (3)
PER_LAYER, PER_STEP = 15, 3


def test_the_profiles_that_compile_their_whole_step():
    """XLA (JetStream), Neuron and a statically scheduled chip (Groq) launch no kernels; CUDA, HPU
    graphs and TT-Metal traces replay captured launches."""
    launch = {name: e.launch for name, e in engines().items()}
    assert {n for n, v in launch.items() if v == COMPILED} == {"jetstream", "neuron", "groq"}
    assert launch["vllm"] == launch["gaudi"] == launch["tt-metal"] == "graphs"
    assert launch["hf-transformers"] == "eager"


@pytest.mark.parametrize("model,layers", [("llama-2-7b", 32), ("llama-2-13b", 40)])
def test_a_compiled_engine_pays_no_launch_per_operator(model, layers):
    """The same Neuron point under its profile and under the profile with captured graphs: the
    decode step differs by one graph launch per operator instance, (15 L + 3) of them."""
    base = efficiency_for(load_device("inferentia2"))
    neuron = get_engine("neuron")
    compiled = engine_efficiency(base, neuron, family="neuron")
    graphs = engine_efficiency(base, replace(neuron, graphs=True), family="neuron")
    assert compiled.op_overhead_s == 0.0 < graphs.op_overhead_s
    point = {**NEURON_POINT, "model": model}
    t_compiled = evaluate(point, efficiency=compiled)["tpot_s"][0]
    t_graphs = evaluate(point, efficiency=graphs)["tpot_s"][0]
    assert evaluate(point)["tpot_s"][0] == t_compiled
    assert (t_graphs - t_compiled) / graphs.op_overhead_s == pytest.approx(PER_LAYER * layers + PER_STEP, rel=1e-9)


def test_a_compiled_engine_takes_no_launch_value_and_a_file_cannot_give_it_one(tmp_path):
    p = tmp_path / "cal.yaml"
    p.write_text(yaml.safe_dump({"families": {}, "launch": {"graphs": {"op_overhead_s": 2e-6}}}))
    assert engine_parameters(get_engine("neuron"), str(p))[0]["op_overhead_s"] == 0.0
    assert engine_parameters(get_engine("vllm"), str(p))[0]["op_overhead_s"] == 2e-6
    p.write_text(yaml.safe_dump({"families": {}, "launch": {"compiled": {"op_overhead_s": 1e-3}}}))
    with pytest.raises(DseError, match=r"cal\.yaml: launch\.compiled: unknown launch class; known: eager, graphs$"):
        load_calibration(str(p))


def test_the_compiled_class_is_never_fitted():
    """Rows enough of two compiled engines fit their own values, never a launch value."""
    row = SimpleNamespace(metric="output_tokens_per_s", serving="static", tp=1)
    stand_ins = [SimpleNamespace(engine=get_engine(name), row=row)
                 for name in ("neuron", "jetstream") for _ in range(C.MIN_ROWS)]
    slots = C.slots_for(stand_ins)
    assert not [s for s in slots if s.section == "launch"]
    assert {s.group for s in slots if s.section == "engines"} == {"neuron", "jetstream"}
    only = C.slots_for(stand_ins, only=("neuron",))
    assert {(s.section, s.group) for s in only} == {("engines", "neuron")}


def test_an_engine_profile_with_another_launch_word_is_refused(tmp_path):
    bad = tmp_path / "engines.yaml"
    bad.write_text(ENGINES_FILE.read_text().replace("    graphs: compiled\n", "    graphs: jit\n", 1))
    with pytest.raises(DseError, match=r"engines\.jetstream\.graphs: expected true, false or compiled, got 'jit'"):
        _profiles(str(bad))


# --------------------------------------------------------------------------- calibrate --engine

MEASURED = shipped("data", "gathered", "other_vendors.csv")
SHIPPED = shipped("configs", "calibration.yaml")


@pytest.fixture(scope="module")
def refitted(tmp_path_factory):
    out = tmp_path_factory.mktemp("refit") / "calibration.yaml"
    return refit(["neuron"], MEASURED, out, starts=1)


def _values(data: dict, skip: str) -> dict:
    return {sec: {g: v for g, v in (data.get(sec) or {}).items() if not (sec == "engines" and g == skip)}
            for sec in ("families", "launch", "allreduce", "engines")}


def test_a_refit_holds_every_other_value_and_every_other_engines_predictions(refitted, monkeypatch):
    source = yaml.safe_load(SHIPPED.read_text())
    assert _values(refitted.data, "neuron") == _values(source, "neuron")
    assert set(refitted.data["engines"]["neuron"]) == {"step_overhead_s", "memory_scale", "compute_scale",
                                                       "request_overhead_s"}
    assert refitted.data["engine_families"]["neuron"] == ["neuron"]
    point = {"model": "llama-3.1-8b", "hardware": "h100-sxm", "engine": "vllm", "batch": 8, "prompt_len": 512,
             "gen_len": 128}
    before = evaluate(point)["tpot_s"][0]
    monkeypatch.setenv(CALIBRATION_ENV, str(refitted.out))
    load_calibration.cache_clear()
    assert evaluate(point)["tpot_s"][0] == before
    assert "calibrated engine neuron" in evaluate({**NEURON_POINT, "model": "llama-2-7b"}).efficiency_name(0)


def test_a_refit_lowers_its_rows_loss_from_the_values_in_use(refitted):
    """The fit's weighted robust loss on the engine's rows is below the loss at the values it
    started from (the calibration in use, under the same profiles)."""
    w = C.source_weights(refitted.cases)

    def loss(errors):
        return float(np.sum(C.weighted_robust(np.log1p(errors), w) ** 2))
    assert loss(refitted.errors["in_sample"]) < loss(refitted.errors["before"])


def test_a_refit_replaces_its_rows_residuals_and_keeps_the_others(refitted):
    old = C.read_residuals(C.residuals_path(SHIPPED))
    new = C.read_residuals(C.residuals_path(refitted.out))
    keep = [r for r in old if r["layer"] == "engine" and r["engine"] != "neuron"]
    assert [r for r in new if r["layer"] == "engine" and r["engine"] != "neuron"] == keep
    mine = [r for r in new if r["engine"] == "neuron"]
    assert len(mine) == len(refitted.cases)
    assert all(np.isfinite([r["log_lso"], r["log_leo"], r["log_in_sample"]]).all() for r in mine)
    record = refitted.data["refits"]["neuron"]
    assert record["rows"] == len(refitted.cases)
    assert record["leave_sources_out"]["totals"]["folds"] == len({c.row.source for c in refitted.cases})
    assert refitted.data["band_coverage"]["rows"] == len(keep) + len(mine)


def test_a_refit_refuses_an_unknown_engine_and_one_without_enough_rows(tmp_path):
    with pytest.raises(DseError, match=r"unknown engine 'vlm'; allowed: .*vllm"):
        refit(["vlm"], MEASURED, tmp_path / "c.yaml")
    with pytest.raises(DseError, match=rf"calibrate --engine tgi: 0 predictable rows of tgi in .*; a refit needs "
                                       rf"{C.MIN_ROWS} or more"):
        refit(["tgi"], MEASURED, tmp_path / "c.yaml")


def test_calibrate_engine_and_bands_only_together_are_refused(cli, tmp_path):
    r = cli("calibrate", "--engine", "neuron", "--bands-only", "--out", tmp_path / "c.yaml")
    assert r.returncode != 0
    assert r.stderr.strip().splitlines()[-1].endswith("--engine refits engines: give one")
    assert "Traceback" not in r.stderr


def test_a_refit_of_an_engine_the_calibration_never_fitted_holds_on_its_rows_families(tmp_path):
    """mlx-lm is a prior engine of the shipped calibration (listed in no engine_families): refitted on
    its 8 Apple rows, its values act on them and hold on the Apple family."""
    assert "mlx-lm" not in yaml.safe_load(SHIPPED.read_text())["engine_families"]
    r = refit(["mlx-lm"], MEASURED, tmp_path / "c.yaml", starts=1, cross_validation=False)
    assert r.data["engine_families"]["mlx-lm"] == ["apple"]
    assert not np.allclose(r.errors["in_sample"], r.errors["before"])
    assert np.array_equal(r.errors["before"], r.errors["leave_engines_out"])      # both: a prior engine
