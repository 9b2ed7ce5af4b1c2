"""The command line as architects meet it: help with defaults and examples, `list` tables of
key figures, `show` with units, Parquet types, FlashAttention on by default, progress on
stderr, and a changed study rerun into its folder (refused with the remedy, --overwrite,
resume). Expected figures are read from the shipped YAML/JSON here, not from the code."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from dse import evaluate
from dse.explore import sweep as sweep_mod
from dse.study.cli import main
from dse.system.params import DEFAULTS

ROOT = Path(__file__).resolve().parents[1]
HW = ROOT / "configs" / "hardware"
MODELS = ROOT / "configs" / "models"
COMMANDS = ("analyze", "compare", "plan", "deploy", "explore", "run", "list", "show", "validate", "calibrate")


def cli(capsys, *argv) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def help_text(capsys, monkeypatch, *argv) -> str:
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit) as e:
        main([*argv, "--help"])
    assert e.value.code == 0
    return capsys.readouterr().out


def flat(text: str) -> str:
    return " ".join(text.split())


def preset(name: str) -> dict:
    return yaml.safe_load((HW / f"{name}.yaml").read_text())


def figure(entry) -> float:
    """A preset figure (``{value: ..., source: ...}`` or a bare number; YAML 1.1 reads 3.35e12 as text)."""
    return float(entry["value"] if isinstance(entry, dict) else entry)


def row_of(table: str, name: str) -> str:
    return next(line for line in table.splitlines() if line.split() and line.split()[0] == name)


# ------------------------------------------------------------------------------ help

@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_examples(capsys, monkeypatch, command):
    text = help_text(capsys, monkeypatch, command)
    lines = text.split("examples:", 1)[1].splitlines()
    examples = [ln for ln in lines if ln.strip().startswith(("dse ", "DSE_"))]
    assert 2 <= len(examples) <= 4, text
    assert all(command in ln for ln in examples[:2])


def test_top_level_help_has_examples(capsys, monkeypatch):
    text = help_text(capsys, monkeypatch)
    assert "examples:" in text and text.count("\n  dse ") >= 3


def option_help(text: str, flag: str) -> str:
    """The help of option ``flag`` in an argparse help text (its lines, joined)."""
    lines = text.split("options:", 1)[1].splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.strip().startswith(flag + " ") or ln.strip() == flag
                 or ln.strip().startswith(flag + ","))
    end = next((j for j in range(start + 1, len(lines)) if lines[j].startswith("  -") or not lines[j].strip()),
               len(lines))
    return flat(" ".join(lines[start:end]))


def test_help_states_the_defaults(capsys, monkeypatch):
    raw = help_text(capsys, monkeypatch, "analyze")
    for flag, default in (("--prompt-len", 512), ("--gen-len", 128), ("--batch", 1), ("--weights", "fp16"),
                          ("--activations", "fp16"), ("--kv", "fp16"), ("--ep", 1), ("--offload", "none"),
                          ("--cpu-layers", 0), ("--format", "table"), ("--max-context", 0)):
        assert f"(default: {default}" in option_help(raw, flag), flag
    assert "(default: off)" in option_help(raw, "--sparse") and "(default: on)" in option_help(raw, "--overlap")
    analyze = flat(raw)
    assert "default: on where the hardware has an on-chip buffer" in analyze     # FlashAttention
    assert "the calibrated efficiency model" in option_help(raw, "--ideal")
    run = flat(help_text(capsys, monkeypatch, "run"))
    assert "default: runs/<study name>" in run and "--overwrite" in run and "(default: 1)" in run
    lst = flat(help_text(capsys, monkeypatch, "list"))
    assert "(default: table)" in lst and "names" in lst
    val = flat(help_text(capsys, monkeypatch, "validate"))
    assert "(default: runs/validate)" in val and "--progress" in val and "--quiet" in val


# ------------------------------------------------------------------------------ list

def test_list_hardware_shows_figures_from_the_presets(capsys):
    rc, out, _ = cli(capsys, "list", "hardware")
    assert rc == 0
    h100 = preset("h100-sxm")
    tier = h100["memory_tiers"][0]
    row = row_of(out, "h100-sxm")
    assert figure(tier["capacity_bytes"]) / 2**30 == 80 and "80 GiB" in row
    assert f"{figure(tier['bandwidth_bytes_per_s']) / 1e12:.3g} TB/s" in row          # 3.35 TB/s
    assert f"{figure(h100['peak_ops_per_s']['fp8']) / 1e12:,.0f} TFLOP/s" in row   # 1,979
    assert f"{figure(h100['tdp_w']):,.0f} W" in row
    b200 = preset("b200")
    assert f"{figure(b200['memory_tiers'][0]['capacity_bytes']) / 2**30:.0f} GiB" in row_of(out, "b200")
    header = out.splitlines()[0]
    for word in ("memory", "bandwidth", "fp16", "fp8", "TDP", "price"):
        assert word in header


def test_list_models_shows_the_architecture(capsys):
    rc, out, _ = cli(capsys, "list", "models")
    assert rc == 0
    cfg = json.loads((MODELS / "llama-3.1-8b.json").read_text())
    cells = row_of(out, "llama-3.1-8b").split()
    for key in ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
                "max_position_embeddings"):
        assert f"{cfg[key]:,}" in cells, key
    assert cfg["model_type"] in cells
    assert "8.03 B" in row_of(out, "llama-3.1-8b")          # Meta's published 8.03B parameters
    mix = json.loads((MODELS / "mixtral-8x7b.json").read_text())
    cells = row_of(out, "mixtral-8x7b").split()
    assert str(mix["num_local_experts"]) in cells and str(mix["num_experts_per_tok"]) in cells


def test_list_names_json_and_csv_for_scripts(capsys):
    rc, out, _ = cli(capsys, "list", "hardware", "--format", "names")
    assert rc == 0 and out.split() == sorted(p.stem for p in HW.glob("*.yaml"))
    rc, out, _ = cli(capsys, "list", "models", "--format", "names")
    assert out.split() == sorted(p.stem for p in MODELS.glob("*.json"))
    rc, out, _ = cli(capsys, "list", "hardware", "--format", "json")
    rows = {r["name"]: r for r in json.loads(out)}
    assert rows["h100-sxm"]["capacity_bytes"] == figure(preset("h100-sxm")["memory_tiers"][0]["capacity_bytes"])
    rc, out, _ = cli(capsys, "list", "models", "--format", "csv")
    df = pd.read_csv(pd.io.common.StringIO(out)).set_index("name")
    assert df.loc["llama-3.1-8b", "layers"] == 32 and df["parameters"].dtype.kind == "i"


# ------------------------------------------------------------------------------ show

def test_show_prints_every_figure_with_its_unit(capsys):
    rc, out, _ = cli(capsys, "show", "hardware", "h100-sxm")
    assert rc == 0
    lines = {}
    for ln in out.splitlines():          # the first of a name: the device's own tier, not the host's
        if len(ln.split()) > 1:
            lines.setdefault(ln.split()[0], " ".join(ln.split()[1:]))
    assert lines["capacity_bytes"] == "80 GiB"
    assert lines["bandwidth_bytes_per_s"] == "3.35 TB/s"
    assert lines["fp8"] == "1.98 PFLOP/s" and lines["int8"] == "1.98 POP/s"
    assert lines["onchip_buffer_bytes"] == f"{233472 // 1024} KiB"
    assert lines["tdp_w"] == "700 W"
    assert "e+" not in out and "85899345920" not in out
    rc, out, _ = cli(capsys, "show", "study", "gpu-pareto-optuna")
    assert rc == 0 and "TB/s" in out and "e+1" not in out


# ------------------------------------------------------------------------------ FlashAttention default

def test_flash_attention_is_on_by_default():
    assert DEFAULTS["flash_attention"] is True
    cols = {"model": "llama-2-7b", "hardware": "h100-sxm", "prompt_len": 4096, "batch": 8}
    default, on, off = (evaluate(c) for c in (cols, {**cols, "flash_attention": True},
                                              {**cols, "flash_attention": False}))
    assert default["ttft_s"][0] == on["ttft_s"][0] != off["ttft_s"][0]
    assert default["activation_bytes"][0] < off["activation_bytes"][0]      # no score matrix in memory


def test_hardware_without_a_buffer_runs_unfused_unless_asked():
    lacking = sorted(p.stem for p in HW.glob("*.yaml") if "onchip_buffer_bytes" not in yaml.safe_load(p.read_text()))
    assert "gaudi2" in lacking                # no cited TPC local-memory size (configs/hardware/gaudi2.yaml)
    cols = {"model": "llama-2-7b", "hardware": np.array(lacking, dtype=object), "weights": "int8",
            "activations": "int8", "kv": "int8"}
    default, off = evaluate(cols), evaluate({**cols, "flash_attention": False})
    assert not any(default.point(i)["flash_attention"] for i in range(len(lacking)))
    assert (default.feasible == off.feasible).all()
    for k in ("ttft_s", "tpot_s", "memory_bytes"):
        np.testing.assert_array_equal(default[k], off[k])
    asked = evaluate({"model": "llama-2-7b", "hardware": "gaudi2", "flash_attention": True})
    assert not asked.feasible[0] and asked.reason_key(0) == "onchip_buffer"


def test_analyze_says_when_the_default_falls_back(capsys):
    rc, out, _ = cli(capsys, "analyze", "--model", "llama-2-7b", "--hardware", "gaudi2")
    assert rc == 0 and "FlashAttention off (gaudi2 has no on-chip buffer" in out.splitlines()[0]
    assert "qk_matmul" in out
    rc, out, _ = cli(capsys, "analyze", "--model", "llama-2-7b", "--hardware", "h100-sxm")
    assert "FlashAttention on" in out.splitlines()[0] and "qk_matmul" not in out
    rc, _, err = cli(capsys, "analyze", "--model", "llama-2-7b", "--hardware", "gaudi2", "--flash-attention")
    assert rc == 2 and "no onchip_buffer_bytes" in err and len(err.strip().splitlines()) == 1


# ------------------------------------------------------------------------------ units in analyze

def test_analyze_writes_sizes_in_binary_units(capsys):
    rc, out, _ = cli(capsys, "analyze", "--model", "llama-2-7b", "--hardware", "h100-sxm")
    summary = {ln.split()[0]: " ".join(ln.split()[1:]) for ln in out.split("Summary", 1)[1].splitlines() if ln.strip()}
    assert summary["capacity_bytes"] == "80 GiB"
    ev = evaluate({"model": "llama-2-7b", "hardware": "h100-sxm"})
    assert summary["weights_bytes"] == f"{ev['weights_bytes'][0] / 2**30:.3g} GiB"
    assert summary["tpot_s"] == f"{ev['tpot_s'][0] * 1e3:.3g} ms"
    assert "GB" not in out.replace("GiB", "")


# ------------------------------------------------------------------------------ Parquet

STUDY = """\
name: surface
space:
  hardware: [h100-sxm, t4]
  model: llama-2-7b
  batch: [1, 64, 512]
  prompt_len: {prompts}
  devices: [1, 2]
objectives:
  output_tokens_per_s: max
  tpot_s: min
method: grid
chunk_size: 8
"""


def study_file(tmp_path, prompts="[512, 2048]") -> Path:
    f = tmp_path / "surface.yaml"
    f.write_text(STUDY.format(prompts=prompts))
    return f


INTEGERS = ("devices", "batch", "prompt_len", "batch_used", "tp_used", "pp_used")


def check_types(path: Path) -> None:
    schema = pq.read_table(path).schema          # a file, or a sweep's dataset (a folder of parts)
    for name in INTEGERS:
        if name in schema.names:
            assert pa.types.is_integer(schema.field(name).type), (name, schema.field(name).type)
    df = pd.read_parquet(path)
    assert df.loc[df.feasible, "reason"].isna().all(), "a feasible row has no reason (null)"
    assert df.loc[~df.feasible, "reason"].notna().all() and (df.loc[~df.feasible, "reason"] != "").all()


@pytest.mark.slow   # a CLI run end to end
def test_sweep_parquet_types(tmp_path, capsys):
    out = tmp_path / "run"
    rc, _, err = cli(capsys, "run", study_file(tmp_path), "--out", out, "--quiet")
    assert rc == 0, err
    check_types(out / "results.parquet")
    df = pd.read_parquet(out / "results.parquet")
    assert len(df) == 2 * 3 * 2 * 2 and df.feasible.any() and (~df.feasible).any()


@pytest.mark.slow   # a CLI run end to end
def test_optuna_parquet_types(tmp_path, capsys):
    f = tmp_path / "opt.yaml"
    f.write_text("name: opt\nspace:\n  hardware: [h100-sxm, t4]\n  model: llama-2-7b\n  batch: {min: 1, max: 512}\n"
                 "  devices: [1, 2]\nobjectives:\n  output_tokens_per_s: max\nmethod: optuna\nsampler: random\n"
                 "trials: 20\npopulation: 10\nseed: 0\n")
    rc, _, err = cli(capsys, "run", f, "--out", tmp_path / "o", "--quiet")
    assert rc == 0, err
    check_types(tmp_path / "o" / "results.parquet")


# ------------------------------------------------------------------------------ progress

@pytest.mark.slow   # a CLI run end to end
def test_validate_progress_goes_to_stderr(tmp_path, capsys):
    rc, out, err = cli(capsys, "validate", "--out", tmp_path / "v", "--progress")
    assert rc == 0
    assert "validate" in err and "100%" in err and "left" in err
    assert "\r" not in out and "%|" not in out and out.startswith("Predicted vs measured")
    rc, out2, err = cli(capsys, "validate", "--out", tmp_path / "v", "--quiet")
    assert rc == 0 and err == "" and out2 == out


@pytest.mark.slow   # a CLI run end to end
def test_calibrate_progress_counts_its_fits(tmp_path, capsys):
    # the shipped measured_calibration.csv alone: one class with enough rows, as with every file (~20x faster)
    rc, out, err = cli(capsys, "calibrate", "--measured", ROOT / "data" / "measured_calibration.csv",
                       "--out", tmp_path / "cal.yaml", "--no-cross-validation", "--progress")
    assert rc == 0, err
    final = err.replace("\r", "\n").strip().splitlines()
    done = [ln for ln in final if "100%" in ln]
    assert done and "left" in done[-1] and "? left" not in done[-1]
    # one fit of 3 starts without cross-validation, counted in evaluations: n/n at the end
    assert "3/3 least-squares runs" in done[-1]
    n = re.search(r"(\d+)/(\d+) evaluations", done[-1])
    assert n and n[1] == n[2] and int(n[1]) > 3
    assert "%|" not in out and out.startswith("Calibrated on")


# ------------------------------------------------------------------------------ a changed study

@pytest.mark.slow   # a CLI run end to end
def test_changed_study_is_refused_with_the_remedy(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli(capsys, "run", study_file(tmp_path), "--out", out, "--quiet")[0] == 0
    rc, _, err = cli(capsys, "run", study_file(tmp_path, "[512, 4096]"), "--out", out, "--quiet")
    assert rc == 2
    line = err.strip()
    assert "\n" not in line
    assert "space.prompt_len" in line and "--overwrite" in line and "new --out" in line
    assert "space.batch" not in line


@pytest.mark.slow   # a CLI run end to end
def test_overwrite_runs_afresh_and_matches_a_fresh_run(tmp_path, capsys):
    out, fresh = tmp_path / "run", tmp_path / "fresh"
    assert cli(capsys, "run", study_file(tmp_path), "--out", out, "--quiet")[0] == 0
    (out / "notes.txt").write_text("mine")
    changed = study_file(tmp_path, "[512, 4096]")
    rc, _, err = cli(capsys, "run", changed, "--out", out, "--overwrite", "--quiet")
    assert rc == 0, err
    assert (out / "notes.txt").read_text() == "mine"            # only the run's own files were deleted
    assert cli(capsys, "run", changed, "--out", fresh, "--quiet")[0] == 0
    a, b = pd.read_parquet(out / "results.parquet"), pd.read_parquet(fresh / "results.parquet")
    assert sorted(a.prompt_len.unique()) == [512, 4096]
    pd.testing.assert_frame_equal(a, b)
    assert (out / "pareto.csv").read_text() == (fresh / "pareto.csv").read_text()


@pytest.mark.slow   # a CLI run end to end
def test_unchanged_study_resumes_without_redoing_work(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    assert cli(capsys, "run", study_file(tmp_path), "--out", out, "--quiet")[0] == 0
    before = pd.read_parquet(out / "results.parquet")

    def no_work(*a, **k):
        raise AssertionError("a finished chunk was evaluated again")
    monkeypatch.setattr(sweep_mod, "evaluate_chunk", no_work)
    rc, _, err = cli(capsys, "run", study_file(tmp_path), "--out", out, "--quiet")
    assert rc == 0, err
    pd.testing.assert_frame_equal(pd.read_parquet(out / "results.parquet"), before)


# ------------------------------------------------------------------------------ one declaration per parameter

def test_every_parameter_flag_states_its_default(capsys, monkeypatch):
    """Each parameter's flag (``dse.system.params.TABLE``) is on analyze and compare, and its help
    states its default (required flags aside)."""
    from dse.system.params import TABLE
    for command in ("analyze", "compare"):
        lines = help_text(capsys, monkeypatch, command).split("options:", 1)[1].splitlines()
        for p in TABLE:
            if p.flag and not p.required:
                start = next(i for i, ln in enumerate(lines) if ln.startswith(f"  {p.flag} ")
                             or ln == f"  {p.flag}" or ln.startswith(f"  {p.flag},"))
                end = next(j for j in range(start + 1, len(lines)) if lines[j].startswith("  -") or not lines[j])
                assert "default" in " ".join(lines[start:end]), (command, p.flag)


def test_every_numeric_flag_accepts_what_its_column_accepts():
    """A numeric flag is checked by its parameter's declared range, the same check as its column
    (``Param.out_of_range``); 0 is refused where 0 means "none" (the flag is then left out)."""
    import argparse
    import math

    from dse.study.cli import flag_type
    from dse.system.params import TABLE
    texts = ("0", "1", "2", "0.5", "1.5", "-1", "99.5", "100", "1e30", "1e31", "nan", "inf", "abc",
             str(2**40), str(2**40 + 1), "max")
    for p in (p for p in TABLE if p.flag and p.numeric):
        parse = flag_type(p)
        for text in texts:
            try:
                value = float(text) if p.type is float else int(text)
            except ValueError:
                value = None
            column_ok = value is not None and not p.out_of_range(np.array([float(value)]))[0][0]
            expected = text in p.words or (column_ok and not (p.zero_is_unset and value == 0))
            try:
                got = parse(text)
                ok = True
            except argparse.ArgumentTypeError as e:
                ok = False
                assert str(e).startswith("expected ") and f"got '{text}'" in str(e), (p.name, e)
            assert ok == expected, (p.name, text)
            if ok and text not in p.words:
                assert type(got) is p.type and (math.isnan(got) or got == value)


def test_flags_and_point_columns_come_from_the_declarations():
    """``FLAGS`` names every flagged column but the words of the messages' prose, and the columns of
    a command line are exactly the declared parameters given on it (model, hardware, the flags with a
    declared default, the others only where given)."""
    from dse.study.cli import FLAGS, build_parser, point_columns
    from dse.system.params import SPEC, TABLE
    assert all(SPEC[k].flag == f for k, f in FLAGS.items())
    args = build_parser().parse_args(["analyze", "--model", "llama-3.1-8b", "--hardware", "h100-sxm",
                                      "--request-rate", "2", "--utilization", "0.5"])
    cols = point_columns(args, "h100-sxm")
    assert set(cols) == {"model", "hardware", "request_rate", "utilization",
                         *(p.name for p in TABLE if p.flag and p.flag_default)}
    assert cols["request_rate"] == 2.0 and cols["utilization"] == 0.5 and cols["batch"] == DEFAULTS["batch"]


def test_no_command_lists_every_command(capsys):
    rc, _, err = cli(capsys)
    assert rc == 2 and all(c in err for c in COMMANDS), err
