"""``compare``: one workload on several hardware presets, side by side."""
import json
import re

import pytest
from conftest import run_cli

from dse.study.cli import main

WORKLOAD = ["--model", "llama-2-7b", "--batch", "8", "--prompt-len", "256", "--gen-len", "64", "--weights", "fp8",
            "--kv", "fp8"]


def _json(capsys, argv):
    capsys.readouterr()
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_compare_equals_analyze_per_hardware(capsys):
    from dse.present.bottleneck import step_bound
    rows = _json(capsys, ["compare", *WORKLOAD, "--hardware", "h100-sxm", "b200", "mi300x", "--format", "json"])
    assert [r["hardware"] for r in rows] == ["h100-sxm", "b200", "mi300x"]
    for r in rows:
        a = _json(capsys, ["analyze", *WORKLOAD, "--hardware", r["hardware"], "--format", "json"])
        for k, v in a["summary"].items():
            assert r[k] == v, (r["hardware"], k)
        bound, share = step_bound(a["decode"])
        assert r["decode_bound"] == bound and r["decode_bound_share"] == pytest.approx(share)
        assert r["prefill_bound"] == step_bound(a["prefill"])[0]
    assert rows[1]["output_tokens_per_s"] > rows[0]["output_tokens_per_s"]     # B200 beats H100 on decode


def test_compare_table_and_csv(capsys):
    from dse.present import display
    from dse.present.compare import COLUMNS
    rows = _json(capsys, ["compare", *WORKLOAD, "--hardware", "h100-sxm", "a100-80gb", "--format", "json"])
    assert main(["compare", *WORKLOAD, "--hardware", "h100-sxm", "a100-80gb"]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    cells = lambda key: re.split(r"\s{2,}", next(line for line in lines if line.startswith(key)).strip())
    assert cells("metric") == ["metric", "h100-sxm", "a100-80gb"]
    assert cells("ttft_s")[1:] == [display.si(r["ttft_s"], "s") for r in rows]
    assert cells("tpot_s")[1:] == [display.si(r["tpot_s"], "s") for r in rows]
    assert all(c.endswith(" ms") for c in cells("tpot_s")[1:])
    assert next(line for line in lines if line.startswith("fits")).split()[1:] == ["yes", "yes"]
    assert next(line for line in lines if line.startswith("decode_bound ")).split()[1:] == \
        [r["decode_bound"] for r in rows]
    assert main(["compare", *WORKLOAD, "--hardware", "h100-sxm", "a100-80gb", "--format", "csv"]) == 0
    csv = capsys.readouterr().out.splitlines()
    assert csv[0].split(",") == list(COLUMNS) and len(csv) == 3
    assert [float(line.split(",")[COLUMNS.index("tpot_s")]) for line in csv[1:]] == [r["tpot_s"] for r in rows]


def test_compare_not_fitting_is_a_row_not_an_error(capsys):
    rows = _json(capsys, ["compare", "--model", "llama-2-70b", "--hardware", "t4", "h100-sxm", "--weights", "fp8",
                          "--format", "json"])
    assert [r["fits"] for r in rows] == [False, True]
    assert "why" in rows[0]
    assert main(["compare", "--model", "llama-2-70b", "--hardware", "t4", "h100-sxm", "--weights", "fp8"]) == 0
    out = capsys.readouterr().out
    assert "NO" in out and "t4 does not fit" in out


def test_compare_plot(tmp_path, capsys):
    png = tmp_path / "cmp.png"
    assert main(["compare", *WORKLOAD, "--hardware", "h100-sxm", "l40s", "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from dse.present.plots import compare_plot
    from dse.study.cli import build_parser, compare_from_args
    args = build_parser().parse_args(["compare", *WORKLOAD, "--hardware", "h100-sxm", "l40s"])
    rec = compare_plot(tmp_path / "again.png", compare_from_args(args))
    assert rec["hardware"] == ["h100-sxm", "l40s"]
    assert rec["y_labels"]["ttft_s"] == "TTFT (ms)" and rec["y_labels"]["output_tokens_per_s"].endswith("(tokens/s)")
    assert rec["y_labels"]["peak_memory_bytes"].endswith("(GiB)")


def test_compare_unknown_hardware_is_one_line():
    r = run_cli("compare", "--model", "llama-2-7b", "--hardware", "h100-sxm", "no-such-gpu")
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert "unknown hardware 'no-such-gpu'" in r.stderr and r.stdout == ""
    r = run_cli("compare", "--model", "llama-2-7b", "--hardware", "h100-sxm", "--plot", "x.txt")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--plot" in r.stderr and r.stdout == ""


def test_compare_without_plot_imports_no_plotting_library():
    import subprocess
    import sys
    code = ("import sys; from dse.study.cli import main; main(['compare','--model','llama-2-7b','--hardware',"
            "'a100-80gb','h100-sxm','--format','json']); heavy = {'pandas','optuna','seaborn','matplotlib','scipy'}"
            " & set(m.split('.')[0] for m in sys.modules); sys.stderr.write(repr(sorted(heavy)))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False,
                       cwd=run_cli.__globals__["ROOT"])
    assert r.returncode == 0 and r.stderr.strip() == "[]", r.stderr
