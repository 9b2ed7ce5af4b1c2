"""Regressions found by fuzzing the inputs (``benchmarks/fuzz_inputs.py``): each test states the right
behaviour for one class of input that ended in a traceback, a silent choice, a message that did not
name its input, or a message that quoted a file back.

The rule they share (README, errors): one line naming the file or flag, the key or column and what is
allowed, a non-zero exit, never a traceback, never a file's content."""
import csv
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from basis.errors import DseError
from dse import evaluate
from dse.fit import validate as V
from dse.study.cli import main
from workloads.lengths import parse_lengths
from workloads.model import load_model

ROOT = Path(__file__).resolve().parents[1]
POINT = ["--model", "llama-3.2-1b-instruct", "--hardware", "h100-sxm", "--prompt-len", "128", "--gen-len", "16"]
#: a text no message writes unless it quotes a file back
MARK = "QZXfuzz41"
#: the header and rows of the measured results dse ships
V_ROWS = (ROOT / "data" / "measured_calibration.csv").read_text().splitlines()


def refused(capsys, argv: list[str], *needles: str) -> str:
    """The one-line refusal of ``main(argv)`` (exit 2), checked to hold every needle and no traceback."""
    rc = main([str(a) for a in argv])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("dse.study: error: "), err
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


# ------------------------------------------------------------------ flags: repeated, '--', words

@pytest.mark.parametrize("extra, needles", [
    (["--batch", "4", "--batch", "8"], ("--batch given twice",)),
    (["--weights", "fp8", "--weights", "int4"], ("--weights given twice",)),
    (["--flash-attention", "--no-flash-attention"], ("--flash-attention and --no-flash-attention",)),
    (["--concurrency", "4", "--con", "8"], ("--concurrency and --con",)),
])
def test_a_flag_given_twice_is_refused(capsys, extra, needles):
    """argparse keeps the last of a repeated option without a word (``--batch 4 --batch 8`` ran batch 8):
    the two values contradict each other, so the command is refused naming the flag."""
    refused(capsys, ["analyze", *POINT, *extra], *needles)


def test_an_option_given_the_value_double_dash_is_refused(capsys):
    """``--batch=--``: argparse dropped the '--' and left the option an empty list, refused later as
    'no design points (empty columns)', which names no flag."""
    refused(capsys, ["analyze", *POINT, "--batch=--"], "--batch", "expected a value")


@pytest.mark.parametrize("extra, flag", [(["--tp", "3"], "--tp: tensor parallelism 3"),
                                         (["--pp", "5"], "--pp: pipeline parallelism 5"),
                                         (["--ep", "2"], "--ep: expert parallelism 2")])
def test_layout_refusals_name_their_flag(capsys, extra, flag):
    """Llama-3.2-1B has 32 heads, 16 layers and no experts: tp 3 and pp 5 divide neither and ep 2 has nothing
    to split; the refusal starts with the flag the user typed, not only its prose."""
    refused(capsys, ["analyze", *POINT, *extra], flag)


@pytest.mark.parametrize("extra, needle", [(["--simulate", "20"], "--simulate: simulating needs"),
                                           (["--concurrency", "4", "--simulate", "5"], "--simulate: expected")])
def test_simulate_refusals_name_the_flag(capsys, extra, needle):
    refused(capsys, ["analyze", *POINT, *extra], needle)


def test_unknown_model_and_hardware_name_their_flag(capsys):
    refused(capsys, ["analyze", "--model", "nothere", "--hardware", "h100-sxm"], "--model: unknown model")
    refused(capsys, ["compare", "--model", "llama-3.2-1b-instruct", "--hardware", "h100-sxm", "nothere"],
            "--hardware: unknown hardware")


def test_a_non_ascii_digit_in_disaggregate_is_refused(capsys):
    """int() reads Arabic-Indic digits: '١:١' ran as 1:1. Only ASCII digits are numbers on the command line."""
    refused(capsys, ["analyze", *POINT, "--concurrency", "4", "--devices", "2", "--disaggregate", "\u0661:\u0661"],
            "--disaggregate", "positive integers")


def test_a_path_with_a_newline_gives_a_one_line_message(tmp_path):
    """A message naming a file whose name holds a newline stays on one line (the newline written as \\n)."""
    bad = tmp_path / "bad\nname.yaml"
    bad.write_text("x: 1\n")
    r = subprocess.run([sys.executable, "-m", "dse.study", "analyze", "--model", "llama-3.2-1b-instruct",
                        "--hardware", str(bad)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "bad\\nname.yaml" in r.stderr


# ------------------------------------------------------------------ validate and calibrate flags

def test_an_empty_measured_path_is_refused_not_the_shipped_file(capsys):
    """``--measured ''`` validated the shipped file without a word (an empty path read as 'not given')."""
    refused(capsys, ["validate", "--measured", ""], "--measured", "empty")


@pytest.mark.parametrize("out, needle", [(".", "is a folder"), ("/dev/null", "not a regular file"),
                                         ("no/such/c.yaml", "no such folder")])
def test_calibrate_checks_its_out_before_the_fit(capsys, tmp_path, monkeypatch, out, needle):
    """A one-row CSV cannot be fitted, but --out is checked first: the user learns of a bad --out before
    minutes of fitting, not after (and /dev/null is never replaced by a file)."""
    m = tmp_path / "m.csv"
    lines = V_ROWS[:2]
    m.write_text("\n".join(lines) + "\n")
    monkeypatch.chdir(tmp_path)
    refused(capsys, ["calibrate", "--measured", m, "--out", out], "--out", needle)


# ------------------------------------------------------------------ studies: contradictions, no echo

TINY = """name: fuzz-tiny
space:
  hardware: h100-sxm
  model: llama-3.2-1b-instruct
  batch: 1
  prompt_len: 128
  gen_len: 16
objectives:
  tpot_s: min
method: grid
"""


def _study(tmp_path, text: str) -> Path:
    p = tmp_path / "s.yaml"
    p.write_text(text)
    return p


@pytest.mark.parametrize("extra, key", [("samples: 5\n", "samples"), ("sampler: tpe\n", "sampler"),
                                        ("trials: 5\n", "trials"), ("population: 8\n", "population")])
def test_a_study_key_of_another_method_is_refused(capsys, tmp_path, extra, key):
    """``samples`` beside a grid, or an optuna setting beside a sweep, did nothing: refused naming the key."""
    refused(capsys, ["run", _study(tmp_path, TINY + extra), "--out", tmp_path / "o", "--quiet"],
            f"s.yaml: {key}: applies to method")


@pytest.mark.parametrize("flag, value", [("--trials", "5"), ("--storage", "sqlite:///x.db")])
def test_an_optuna_flag_on_a_sweep_is_refused(capsys, tmp_path, flag, value):
    refused(capsys, ["run", _study(tmp_path, TINY), "--out", tmp_path / "o", "--quiet", flag, value],
            f"{flag}: applies to an optuna study")


@pytest.mark.parametrize("edit, key", [
    (lambda t: t.replace("tpot_s: min", f"tpot_s: '{MARK} x'"), "objectives.tpot_s: expected min or max, got text"),
    (lambda t: t + f"constraints:\n  tpot_s: {{max: '{MARK} x'}}\n", "constraints.tpot_s.max: expected a finite number"),
    (lambda t: t.replace("method: grid", f"method: '{MARK} x'"), "method: expected one of grid"),
    (lambda t: t + f"seed: '{MARK}'\n", "seed: expected an integer"),
    (lambda t: t.replace("hardware: h100-sxm", f"hardware: '{MARK} not a name'"), "space.hardware: expected a name"),
    (lambda t: t.replace("model: llama-3.2-1b-instruct", f"model: '{MARK} y'"), "space.model: expected a name"),
    (lambda t: f"!{MARK} x\n", "a tag (!...) that is not plain YAML"),
])
def test_a_bad_study_value_is_described_never_quoted(capsys, tmp_path, edit, key):
    """The study's text never comes back in a message: a value that is not a short plain name is
    described ('got text'), with the key and what is allowed."""
    msg = refused(capsys, ["run", _study(tmp_path, edit(TINY)), "--out", tmp_path / "o", "--quiet"], "s.yaml", key)
    assert MARK not in msg


def test_a_plain_unknown_name_in_a_study_is_still_named(capsys, tmp_path):
    """A short plain name is named like a key, so a typo can be seen ('h100-sx')."""
    refused(capsys, ["run", _study(tmp_path, TINY.replace("h100-sxm", "h100-sx")), "--out", tmp_path / "o"],
            "space.hardware: unknown hardware 'h100-sx'")


def test_speculative_settings_without_any_draft_are_refused():
    """spec_tokens and spec_acceptance describe speculative decoding; with no draft anywhere they did
    nothing (a study ran them silently as plain decoding). A grid crossing them with drafts still runs."""
    base = {"model": "llama-3.2-1b-instruct", "hardware": "h100-sxm", "prompt_len": 128, "gen_len": 16}
    for key, v in (("spec_tokens", 4), ("spec_acceptance", 0.5)):
        with pytest.raises(DseError, match=f"{key}: describe speculative decoding, and no point has a draft"):
            evaluate({**base, key: v})
    ev = evaluate({**base, "spec_tokens": [4, 4], "spec_draft": ["none", "self:1"]})
    assert len(ev) == 2 and ev["feasible"].all()


# ------------------------------------------------------------------ measured CSVs: no cell quoted

HEADER = V_ROWS[0]
COLUMNS = next(csv.reader([HEADER]))


def _row(**cells) -> str:
    base = dict(zip(COLUMNS, next(csv.reader([V_ROWS[1]]))))
    base.update(cells)
    return ",".join(f'"{c}"' if "," in c else c for c in (base[k] for k in COLUMNS))


@pytest.mark.parametrize("cells, needle", [
    ({"devices": f"{MARK}x"}, "devices: expected a positive integer, got text that is not a number"),
    ({"devices": "1.5"}, "devices: expected a positive integer, got a fraction"),
    ({"devices": "\u0661"}, "devices: expected a positive integer, got text that is not a number"),
    ({"value": f"12{MARK}"}, "value: expected a positive number, got text that is not a number"),
    ({"value": "-5"}, "value: expected a positive number, got a negative number"),
    ({"value": "1e400"}, "value: expected a positive number, got a number that is not finite"),
    ({"value": "\u0668\u0660"}, "value: expected a positive number, got text that is not a number"),
    ({"model_slug": f"{MARK}-model"}, "model_slug: no model of that name; allowed: the names of 'dse list models'"),
    ({"hardware_slug": f"{MARK}-hw"}, "hardware_slug: no hardware of that name"),
    ({"metric": f"{MARK}_metric"}, "metric: unknown; allowed: ttft_s"),
    ({"weights": f"{MARK}fmt"}, "weights: unknown format; allowed: the formats of 'dse list formats'"),
    ({"batch": MARK}, "batch: expected a positive integer"),
])
def test_a_bad_measured_cell_is_named_by_line_and_column_never_quoted(tmp_path, cells, needle):
    """Issue 41's open item: a bad cell was quoted back (up to 40 characters). The message names the file,
    the line and the column and says what is allowed; the report shows '?' where the cell was."""
    p = tmp_path / "m.csv"
    p.write_text(f"{HEADER}\n{_row(**cells)}\n{V_ROWS[2]}\n")
    table = V.read_table(p)
    assert len(table.bad) == 1 and table.bad[0].startswith(f"{p}: line 2: {needle}"), table.bad
    report = "\n".join(V._unpredictable_lines(V.Validation(p, "", [], table.unpredictable, [], bad=table.bad)))
    for text in (table.bad[0], report, str(table.unpredictable)):
        assert MARK not in text and "\u0661" not in text and "\u0668" not in text


@pytest.mark.parametrize("body, needle", [
    (f"{_row()},{MARK},extra\n", "line 2: 2 more cell(s) than the header's"),
    (f"{_row()}\x00\n", "line 2: a NUL byte"),
])
def test_a_malformed_measured_row_is_refused(tmp_path, body, needle):
    """A row with more cells than the header lost them without a word (csv.DictReader files them under
    None); a NUL byte is read as text by newer csv modules. Both are refused naming the line."""
    p = tmp_path / "m.csv"
    p.write_text(f"{HEADER}\n{body}")
    with pytest.raises(DseError, match=re.escape(needle)) as e:
        V.read_table(p)
    assert MARK not in str(e.value)


# ------------------------------------------------------------------ length traces

@pytest.mark.parametrize("row, needle", [("\u0661\u0660\u0660,10", "line 3: prompt_len must be a positive integer"),
                                         (f"100,10,{MARK}", "line 3: 1 more cell(s) than the header's 2 columns")])
def test_a_bad_trace_row_is_refused(tmp_path, row, needle):
    """'١٠٠' read as 100 (float() reads other scripts' digits), and a third cell was dropped silently."""
    p = tmp_path / "t.csv"
    p.write_text(f"prompt_len,gen_len\n100,10\n{row}\n")
    with pytest.raises(DseError, match=re.escape(needle)) as e:
        parse_lengths(str(p))
    assert MARK not in str(e.value)


# ------------------------------------------------------------------ model configs, served points

def test_a_model_with_absurdly_many_layers_is_refused_before_any_table(tmp_path):
    """10^12 layers asked numpy for 931 GiB (a per-layer table) and ended in a MemoryError traceback."""
    cfg = (ROOT / "configs" / "models" / "llama-3.2-1b-instruct.json").read_text()
    p = tmp_path / "m.json"
    p.write_text(cfg.replace('"num_hidden_layers": 16', '"num_hidden_layers": 1000000000000'))
    with pytest.raises(DseError, match=r"num_hidden_layers: got 1000000000000, above 100000"):
        load_model(str(p))


@pytest.mark.parametrize("load", [{"request_rate": 1.0}, {"concurrency": 4, "lengths": "lognormal"},
                                  {"request_rate": 1.0, "lengths": "lognormal", "slo_ttft": 1.0}])
def test_served_points_on_devices_without_a_link_are_infeasible_not_a_crash(load):
    """HBM-PIM has no interconnect: two devices cannot run one engine. Open loops and length distributions
    went through the Markov chain with a NaN iteration time and ended in 'cannot convert float NaN to
    integer'. The point is infeasible for 'interconnect' with unknown (NaN) latencies; the one-device point
    beside it is priced as it would be alone."""
    base = {"model": "llama-3.2-1b-instruct", "hardware": "hbm-pim", "prompt_len": 128, "gen_len": 16, **load}
    ev = evaluate({**base, "devices": [1, 2]})
    alone = evaluate({**base, "devices": 1})
    assert list(ev["feasible"]) == [True, False] and ev.reason_key(1) == "interconnect"
    assert math.isnan(ev["ttft_s"][1]) and math.isnan(ev["requests_per_s"][1])
    assert ev["ttft_s"][0] == pytest.approx(alone["ttft_s"][0], rel=1e-9) and np.isfinite(ev["ttft_s"][0])


def test_run_refuses_more_workers_than_the_machine_can_use(capsys, tmp_path):
    """An optuna study started one process per worker asked: --workers 100000 was a fork bomb. At most 8
    processes a CPU (more only share the same CPUs), refused naming the flag and the bound."""
    from dse.study.cli import MAX_WORKERS
    refused(capsys, ["run", _study(tmp_path, TINY), "--workers", str(MAX_WORKERS + 1)], "--workers",
            f"up to {MAX_WORKERS}")


def test_a_layout_the_hardware_chooses_is_served_under_a_load(capsys):
    """Groq's LPU spreads a model over many chips (pipeline stages): under a load the refusal asked for
    '--pp 1, --ep 1, --offload none' though none was given. Pipeline stages are now served under
    continuous batching (issue 44): the point runs, on the layout its chips take."""
    assert main(["analyze", "--model", "llama-3.2-1b-instruct", "--hardware", "groq-lpu", "--request-rate", "0.01"]) == 0
    out = capsys.readouterr().out
    assert "(TP 8 x PP 2 x EP 1 x DP 1 x CP 1)" in out and "continuous batching at 0.01 requests/s" in out
