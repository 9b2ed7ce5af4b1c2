"""Flags and study keys added since the first validation layer: each bad value, silent choice or
contradiction refused in one line that names the flag (or key) and what is allowed, the same words
from the command line, a study file and ``evaluate``; never a traceback."""
from __future__ import annotations

import argparse
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from basis.errors import DseError
from dse.core.engines import get_engine
from dse.explore.space import DesignSpace
from dse.explore.spec import SweepSpec
from dse.study.cli import flag_type, main
from dse.system.evaluator import METRICS, evaluate
from dse.system.params import SPEC, TABLE
from dse.system.techniques import parse_draft
from workloads.lengths import parse_lengths
from workloads.model import load_model
from workloads.pruning import prune
from workloads.techniques import parse_sparsity

ROOT = Path(__file__).resolve().parents[1]
POINT = {"model": "llama-2-7b", "hardware": "h100-sxm"}
ANALYZE = ["analyze", "--model", "llama-2-7b", "--hardware", "h100-sxm"]
SPACE = {"hardware": "h100-sxm", "model": "llama-2-7b", "batch": [1, 8]}


def _cli(argv: list[str], capsys) -> tuple[int, str]:
    """(exit status, stderr) of the command line run in this process."""
    rc = main(argv)
    return rc, capsys.readouterr().err


def _one_line(rc: int, err: str) -> str:
    """The message of a one-line refusal (status 2, one line, no traceback), without its prefix."""
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("dse.study: error: "), lines
    return lines[0].removeprefix("dse.study: error: ")


# ---- numbers: ASCII digits only, in one declared range -------------------------------------

NUMERIC_FLAGS = [p for p in TABLE if p.flag and p.numeric]


@pytest.mark.parametrize("p", NUMERIC_FLAGS, ids=lambda p: p.flag)
@pytest.mark.parametrize("text", ["١٢", "²", "１２"])
def test_a_numeric_flag_refuses_digits_of_other_scripts(p, text):
    # int('١٢') and float('１２') are 12 in Python; the command line takes ASCII digits, as a study does
    with pytest.raises(argparse.ArgumentTypeError, match=f"got '{text}'"):
        flag_type(p)(text)
    ascii_value = "1" if p.type is int else str(p.at_least or 0.5)   # allowed by the flag's declared range
    assert flag_type(p)(ascii_value) == float(ascii_value)


def test_a_study_and_evaluate_refuse_digits_of_other_scripts_too():
    with pytest.raises(DseError, match=r"^columns: prompt_len: expected numbers, got '١٢'$"):
        evaluate({**POINT, "prompt_len": "١٢"})
    # a value read from a study file is described, never quoted (the file's content is not echoed)
    with pytest.raises(DseError, match=r"space\.prompt_len: expected a finite number, got text that is not a number"):
        DesignSpace({**SPACE, "prompt_len": "١٢"}, where="s.yaml: space")


def test_kv_block_has_one_declared_bound_for_flag_and_column():
    high = 2**20                           # the declared largest page (params.MAX_KV_BLOCK)
    assert flag_type(SPEC["kv_block"])(str(high)) == high
    with pytest.raises(argparse.ArgumentTypeError) as flag_error:
        flag_type(SPEC["kv_block"])("1000000000")
    with pytest.raises(DseError) as column_error:
        evaluate({**POINT, "concurrency": 2, "kv_block": high + 1})
    allowed = "a positive integer up to 1,048,576"
    assert allowed in str(flag_error.value) and allowed in str(column_error.value)
    assert str(column_error.value).startswith("columns: kv_block: ")


# ---- silent choices and contradictions -------------------------------------------------------

@pytest.mark.parametrize("text, words", [
    ("lognormal:sigma=1,sigma=2", "sigma given twice"),
    ("lognormal:gen_sigma=1,gen_sigma=1", "gen_sigma given twice"),
    ("lognormal:sigma=1,prompt_sigma=2", "sigma and prompt_sigma given together"),
    ("lognormal:gen_sigma=2,sigma=1", "gen_sigma and sigma given together"),
    ("lognormal:", "nothing after 'lognormal:'"),
    ("lognormal:sigma=١", "from 0 to 4, got '١'"),
])
def test_a_lognormal_spec_that_would_keep_one_of_two_values_is_refused(text, words):
    with pytest.raises(DseError, match=f"^lengths: .*{words}"):
        parse_lengths(text)


def test_lognormal_specs_that_say_each_sigma_once_are_taken():
    assert parse_lengths("lognormal:sigma=0.5").name == "lognormal:prompt_sigma=0.5,gen_sigma=0.5"
    assert parse_lengths("lognormal:prompt_sigma=2,gen_sigma=0.5").name == "lognormal:prompt_sigma=2,gen_sigma=0.5"
    assert parse_lengths("lognormal:gen_sigma=0.5").name == "lognormal:prompt_sigma=1,gen_sigma=0.5"


def test_sparse_beside_another_n_m_sparsity_is_refused_and_beside_2_4_is_the_same_point():
    with pytest.raises(DseError, match=r"^columns: sparse and sparsity: sparse is sparsity 2:4, and sparsity "
                                       r"asks 1:4 at the same point; give one"):
        evaluate({**POINT, "sparse": True, "sparsity": "1:4"})
    with pytest.raises(DseError, match="asks 1:4"):        # only the point that asks both
        evaluate({**POINT, "sparse": [False, True], "sparsity": ["2:4", "1:4"]})
    both = evaluate({**POINT, "sparse": True, "sparsity": "2:4"})
    alone = evaluate({**POINT, "sparsity": "2:4"})
    assert both["tpot_s"][0] == alone["tpot_s"][0] and both["weights_bytes"][0] == alone["weights_bytes"][0]


@pytest.mark.parametrize("text", ["", "١:٤", "²:4", "2:٤"])
def test_sparsity_text_is_empty_or_not_ascii_refused(text):
    with pytest.raises(DseError, match=r"^sparsity: expected 'none' or 'N:M'"):
        parse_sparsity(text)


@pytest.mark.parametrize("text", ["self:²", "self:١", "medusa:²", "self:" + "9" * 5000, "self:0", ""])
def test_a_draft_count_in_other_digits_or_empty_is_refused_in_one_line(text):
    with pytest.raises(DseError) as e:
        parse_draft(text)
    said = str(e.value)
    assert said.startswith("spec_draft: ") and "\n" not in said and len(said) < 200


def test_a_draft_in_ascii_digits_is_taken():
    assert parse_draft("self:4").layers == 4 and parse_draft("medusa:3").heads == 3 and parse_draft("none") is None


@pytest.mark.parametrize("model, key", [("llama-2-7b", "hidden"), ("llama-2-7b", "intermediate"),
                                        ("llama-2-7b", "head_dim"), ("llama-2-7b", "heads"),
                                        ("mixtral-8x7b", "moe_intermediate")])
def test_a_pruned_width_below_a_sixteenth_of_the_model_is_refused_with_its_range(model, key):
    m = load_model(model)
    own = {"hidden": m.hidden_size, "intermediate": m.intermediate_size, "head_dim": m.head_dim,
           "heads": m.num_heads, "moe_intermediate": m.moe_intermediate_size}[key]
    low = math.ceil(own / 16)
    with pytest.raises(DseError, match=rf"^prune: {key}: got 1, a degenerate model: .*expected an integer from "
                                       rf"{low} to {own}$"):
        prune(m, f"{key}=1")
    if key != "heads" and low > 1:     # the bound itself is taken (heads: a GQA model needs a multiple)
        assert prune(m, f"{key}={low}").name.endswith(f"{key}={low}]")


def test_depth_and_kv_heads_may_go_down_to_one():
    m = load_model("llama-3.1-8b")
    assert prune(m, "layers=1").num_layers == 1 and prune(m, "kv_heads=1").num_kv_heads == 1


@pytest.mark.parametrize("name, why", [("", "(an empty name)"), ("configs/engines.yaml", "(a path"),
                                       ("..\\x", "(a path")])
def test_an_empty_or_path_like_engine_says_why_and_lists_the_engines(name, why):
    with pytest.raises(DseError) as e:
        get_engine(name)
    assert str(e.value).startswith(f"engine: unknown engine {name!r} {why}") and "known: default (" in str(e.value)


# ---- study objectives ------------------------------------------------------------------------

@pytest.mark.parametrize("objectives, words", [
    ({"feasible": "max"}, "objectives.feasible: not a metric to rank by"),
    ({}, "objectives: none given"),
    ({"speed": "max"}, "objectives.speed: unknown metric or parameter"),
    ({"hardware": "min"}, "objectives.hardware: a name or a switch"),
    ({"peak_fp8": "max"}, "objectives.peak_fp8: a parameter the space does not set"),   # was a KeyError traceback
    ({1: "max"}, "objectives.1: unknown metric"),
])
def test_a_study_objective_that_ranks_nothing_is_refused_naming_the_file_key_and_metrics(objectives, words):
    with pytest.raises(DseError) as e:
        SweepSpec(DesignSpace(dict(SPACE)), objectives=objectives, where="my-study.yaml")
    said = str(e.value)
    assert said.startswith(f"my-study.yaml: {words}") and "\n" not in said
    assert f"allowed: {', '.join(METRICS)}" in said


def test_a_sweep_made_in_python_without_objectives_still_runs():
    assert SweepSpec(DesignSpace(dict(SPACE))).objectives == {}


# ---- the command line: one line naming the flag; the same words as a study ----------------

@pytest.mark.parametrize("argv, words", [
    (["--sparse", "--sparsity", "1:4"], "--sparse and --sparsity: --sparse is --sparsity 2:4"),
    (["--concurrency", "4", "--lengths", "lognormal:sigma=1,sigma=2"], "--lengths: sigma given twice"),
    (["--spec-draft", "self:²", "--spec-tokens", "2"], "--spec-draft: 'self:N' takes N"),
    (["--prune", "hidden=1"], "--prune: hidden: got 1, a degenerate model"),
    (["--engine", ""], "--engine: unknown engine '' (an empty name)"),
    (["--engine", "configs/engines.yaml"], "--engine: unknown engine 'configs/engines.yaml' (a path"),
    (["--kv-block", "1000000000"], "analyze: argument --kv-block: expected a positive integer up to 1,048,576"),
    (["--batch", "١٢"], "analyze: argument --batch: expected a positive integer"),
])
def test_the_command_line_refuses_in_one_line_naming_the_flag(argv, words, capsys):
    said = _one_line(*_cli([*ANALYZE, *argv], capsys))
    assert said.startswith(words), said


def test_a_saturated_request_rate_is_a_note_naming_the_flag_the_rate_and_the_most_served(capsys):
    rc, err = _cli([*ANALYZE, "--request-rate", "1e6", "--format", "json"], capsys)
    lines = err.strip().splitlines()
    assert rc == 3 and len(lines) == 1 and "Traceback" not in err
    ev = evaluate({**POINT, "request_rate": 1e6})
    most = ev["requests_per_s"][0]          # what the design serves when saturated
    assert lines[0].startswith("dse.study: note: --request-rate 1e+06 requests/s saturates this design: it serves "
                               f"at most {most:.3g}"), lines[0]
    assert lines[0].endswith("for a run of N requests that queue and drain (a benchmark's), --num-prompts N")


def test_a_saturated_request_rate_on_compare_names_the_flag_and_the_most_each_design_serves(capsys):
    said = _one_line(*_cli(["compare", "--model", "llama-2-7b", "--hardware", "h100-sxm", "l40s", "--request-rate",
                            "1e6"], capsys))
    most = evaluate({**POINT, "hardware": ["h100-sxm", "l40s"], "request_rate": 1e6})["requests_per_s"]
    assert said.startswith(f"--request-rate 1e+06 requests/s saturates h100-sxm (it serves at most {most[0]:.3g} "
                           f"requests/s), l40s (it serves at most {most[1]:.3g} requests/s)"), said


def _study(tmp_path: Path, space: dict, objectives=None) -> Path:
    f = tmp_path / "bad-study.yaml"
    f.write_text(yaml.safe_dump({"name": "bad", "space": space,
                                 "objectives": {"tpot_s": "min"} if objectives is None else objectives}))
    return f


def _as_study_words(cli_words: str) -> str:
    """A command-line message in a study's words: flags written as their column names."""
    for p in TABLE:
        if p.flag:
            cli_words = cli_words.replace(p.flag, p.name)
    return cli_words


@pytest.mark.parametrize("flags, key", [
    (["--sparse", "--sparsity", "1:4"], {"sparse": True, "sparsity": "1:4"}),
    (["--concurrency", "4", "--lengths", "lognormal:sigma=1,sigma=2"],
     {"concurrency": 4, "lengths": "lognormal:sigma=1,sigma=2"}),
    (["--prune", "hidden=1"], {"prune": "hidden=1"}),
])
def test_the_command_line_and_a_study_refuse_in_the_same_words(flags, key, tmp_path, capsys):
    cli = _one_line(*_cli([*ANALYZE, *flags], capsys))
    study = _study(tmp_path, {**SPACE, "batch": 1, **key})
    said = _one_line(*_cli(["run", str(study), "--out", str(tmp_path / "out"), "--quiet"], capsys))
    assert said == f"{study}: space: {_as_study_words(cli)}"


@pytest.mark.parametrize("argv, words", [
    (["analyze", "--model", "llama-2-7b", "--hardware", "h100-sxm", "--spec-draft", "self:²", "--spec-tokens", "2"],
     "--spec-draft: 'self:N' takes N"),
    (["run", "STUDY", "--out", "OUT", "--quiet"], "STUDY: objectives.feasible: not a metric to rank by"),
])
def test_a_refusal_from_a_fresh_process_is_one_line_without_a_traceback(argv, words, tmp_path):
    study = _study(tmp_path, SPACE, {"feasible": "max"})
    argv = [str(study) if a == "STUDY" else str(tmp_path / "out") if a == "OUT" else a for a in argv]
    r = subprocess.run([sys.executable, "-m", "dse.study", *argv], capture_output=True, text=True, cwd=ROOT,
                       check=False, timeout=120)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith("dse.study: error: " + words.replace("STUDY", str(study))), lines[0]
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@pytest.mark.parametrize("argv, words", [
    (["--batch", "8", "--concurrency", "4"], "--batch and --concurrency: under a load"),
    (["--batch=max", "--request-rate", "2"], "--batch and --request-rate: under a load"),
    (["--kv-block", "32"], "--kv-block: a parameter of continuous batching, and this point runs one static batch"),
    (["--max-running", "8"], "--max-running: a parameter of continuous batching"),
    (["--prefill-chunk", "4096"], "--prefill-chunk: a parameter of continuous batching"),
    (["--slo-percentile", "99"], "--slo-percentile: a parameter of continuous batching"),
    (["--spec-acceptance", "0.5"], "--spec-tokens and --spec-acceptance describe speculative decoding"),
    (["--offload", "weights=0.5,weights=0.2"], "--offload 'weights=0.5,weights=0.2': weights given twice"),
    (["--spec-draft", "self:4", "--spec-tokens", str(2**40)],
     "analyze: argument --spec-tokens: expected a positive integer up to 4,096"),
    (["--spec-draft", "medusa:5000", "--spec-tokens", "4096"],
     "--spec-draft: 'medusa:N' takes N, N Medusa heads, from 1 to 4,096"),
])
def test_flags_that_contradict_or_would_be_left_unused_are_refused(argv, words, capsys):
    said = _one_line(*_cli([*ANALYZE, *argv], capsys))
    assert said.startswith(words), said


def test_the_same_flags_under_the_load_they_belong_to_are_taken(capsys):
    rc, err = _cli([*ANALYZE, "--concurrency", "4", "--kv-block", "32", "--max-running", "8", "--format", "json"],
                   capsys)
    assert rc == 0 and not err.strip()
    rc, err = _cli([*ANALYZE, "--batch", "8", "--format", "json"], capsys)
    assert rc == 0 and not err.strip()


def test_a_continuous_only_flag_on_compare_is_refused_too(capsys):
    said = _one_line(*_cli(["compare", "--model", "llama-2-7b", "--hardware", "h100-sxm", "l40s", "--kv-block", "32"],
                           capsys))
    assert said.startswith("--kv-block: a parameter of continuous batching")


def test_an_empty_out_folder_is_refused_not_replaced_by_the_default(capsys):
    said = _one_line(*_cli(["run", "quant-roofline", "--out", "", "--quiet"], capsys))
    assert said.startswith("run: argument --out: expected a folder path, got an empty text")


def test_kv_block_numbers_are_declared_once():
    # the flag's check is the column's: one declaration, so no second bound can drift from it
    bad, allowed = SPEC["kv_block"].out_of_range(np.array([2**20, 2**20 + 1, 0]))
    assert bad.tolist() == [False, True, True] and allowed == "a positive integer up to 1,048,576"


@pytest.mark.parametrize("given, words", [
    ({"memory_capacity": 40e9, "memory_stacks": 6}, "memory_capacity and memory_stacks: two spellings of one figure"),
    ({"memory_bandwidth": 2e12, "memory_type": "hbm3e"}, "memory_bandwidth and memory_type: two spellings"),
    ({"peak_fp16": 1e15, "cores": [100, 120]}, "peak_fp16 and cores: two spellings"),
    ({"tdp_w": 500, "power_limit_w": 600}, "tdp_w and power_limit_w: two spellings"),
])
def test_a_space_that_sets_one_figure_twice_is_refused(given, words):
    # the explicit figure used to win over the template's without a word (memory_stacks 6 of h100-sxm: 96 GiB,
    # memory_capacity 40 GB: 40 GB modelled)
    with pytest.raises(DseError, match=rf"^s\.yaml: space: {words}"):
        evaluate({**POINT, **given}, where="s.yaml: space")


def test_a_template_change_beside_another_figure_is_taken():
    ev = evaluate({**POINT, "memory_capacity": 40e9, "cores": 100})
    assert ev["capacity_bytes"][0] == 40e9


def test_a_page_that_leaves_no_room_for_one_request_names_kv_block_among_the_remedies(capsys):
    rc, err = _cli([*ANALYZE, "--kv", "fp16", "--concurrency", "2", "--kv-block", str(2**20), "--format", "json"],
                   capsys)
    lines = err.strip().splitlines()
    assert rc == 3 and len(lines) == 1 and "Traceback" not in err
    assert "(--kv-block tokens each)" in lines[0] and lines[0].endswith("a smaller --kv-block (now 1,048,576)")


@pytest.mark.parametrize("argv, words", [
    (["--host-cpu", ""], "--host-cpu: unknown hardware ''"),
    (["--host-tier", ""], "--host-tier: unknown tier ''"),
])
def test_a_host_preset_that_cannot_be_loaded_names_its_flag(argv, words, capsys):
    assert _one_line(*_cli([*ANALYZE, *argv], capsys)).startswith(words)
