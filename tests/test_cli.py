"""The command line: outputs, listing and one-line errors (never a traceback)."""
import json
import sys
from pathlib import Path

import pytest
from conftest import run_cli


def test_analyze_json_structure():
    r = run_cli("analyze", "--model", "mixtral-8x7b", "--hardware", "h100-sxm", "--devices", "2",
                "--batch", "8", "--prompt-len", "256", "--gen-len", "64", "--weights", "fp8", "--kv", "fp8",
                "--flash-attention", "--format", "json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert set(data) == {"prefill", "decode", "summary"}
    for row in data["prefill"] + data["decode"]:
        assert {"name", "ops", "memory_bytes", "arithmetic_intensity", "bound", "time_s"} <= set(row)
    for key in ("ttft_s", "tpot_s", "e2e_latency_s", "output_tokens_per_s", "output_tokens_per_s_per_user",
                "batch", "weights_bytes", "kv_cache_bytes", "peak_memory_bytes", "fits"):
        assert key in data["summary"]
    names = {r["name"] for r in data["decode"]}
    assert {"flash_attention", "router", "expert_up_proj", "attn_all_reduce", "lm_head"} <= names


@pytest.mark.parametrize("fmt", ["table", "csv"])
def test_analyze_table_and_csv(fmt):
    r = run_cli("analyze", "--model", "llama-2-7b", "--hardware", "a100-80gb", "--no-flash-attention", "--format", fmt)
    assert r.returncode == 0, r.stderr
    for word in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "qk_matmul",
                 "softmax", "sv_matmul", "attn_norm", "mlp_add", "act_fn", "lm_head", "ttft_s", "tpot_s", "fits"):
        assert word in r.stdout


def test_batch_max_and_not_fitting():
    r = run_cli("analyze", "--model", "llama-2-70b", "--hardware", "a100-80gb", "--batch", "max", "--format", "json")
    # the report is printed, then one error line and a non-zero exit
    assert r.returncode == 3
    s = json.loads(r.stdout)["summary"]
    assert s["fits"] is False and "does not fit" in s["why"]
    line, = r.stderr.strip().splitlines()
    assert "memory_tiers[0].capacity_bytes" in line and "--offload greedy" in line and "Traceback" not in line
    r = run_cli("analyze", "--model", "llama-2-7b", "--hardware", "h100-sxm", "--batch", "max", "--format", "json")
    assert json.loads(r.stdout)["summary"]["fits"] is True and json.loads(r.stdout)["summary"]["batch"] > 1


@pytest.mark.parametrize("what,expect", [("models", "deepseek-v3"), ("hardware", "h100-sxm"), ("formats", "nvfp4")])
def test_list(what, expect):
    r = run_cli("list", what)
    assert r.returncode == 0 and expect in r.stdout


BAD = [
    (["--model", "llama-9"], "unknown model 'llama-9'; valid models:"),
    (["--hardware", "h900"], "unknown hardware 'h900'; valid hardware:"),
    (["--weights", "fp5"], "unknown weights format 'fp5'; valid formats:"),
    (["--kv", "int5"], "unknown kv format"),
    (["--batch", "0"], "expected a positive integer"),
    (["--prompt-len", "-5"], "expected a positive integer"),
    (["--gen-len", "abc"], "expected a positive integer"),
    (["--devices", "3", "--model", "llama-2-70b"], "does not divide"),
    (["--format", "xml"], "invalid choice"),
]


@pytest.mark.parametrize("extra,message", BAD, ids=[m for _, m in BAD])
def test_bad_input_one_line(extra, message):
    args = {"--model": "llama-2-7b", "--hardware": "a100-80gb"}
    it = iter(extra)
    flags = []
    for k in it:
        v = next(it)
        if k in args:
            args[k] = v
        else:
            flags += [k, v]
    r = run_cli("analyze", *[x for kv in args.items() for x in kv], *flags)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], r.stderr


def test_config_missing_field_is_one_line(tmp_path):
    p = tmp_path / "broken.json"
    p.write_text(json.dumps({"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32}))
    r = run_cli("analyze", "--model", p, "--hardware", "a100-80gb")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "missing 'num_attention_heads'" in r.stderr and str(p) in r.stderr
    p.write_text("{not json")
    r = run_cli("analyze", "--model", p, "--hardware", "a100-80gb")
    assert r.returncode == 2 and "cannot read config.json" in r.stderr


def test_bad_preset_is_one_line(tmp_path):
    src = open("configs/hardware/a100-80gb.yaml").read()
    p = tmp_path / "neg.yaml"
    p.write_text(src.replace("bandwidth_bytes_per_s: {value: 2.039e12", "bandwidth_bytes_per_s: {value: -2.0e12"))
    r = run_cli("analyze", "--model", "llama-2-7b", "--hardware", p)
    assert r.returncode == 2 and "memory_tiers[0].bandwidth_bytes_per_s.value: must be positive" in r.stderr
    p.write_text(src.replace("tdp_w: {value: 400, source: datasheet}", "tdp_w: 400"))
    r = run_cli("show", "hardware", p)
    assert r.returncode == 2 and "tdp_w" in r.stderr


def test_analyze_path_imports_no_heavy_library():
    code = ("import sys; from dse.study.cli import main; main(['analyze','--model','llama-2-7b','--hardware',"
            "'a100-80gb','--format','json']); heavy = {'pandas','optuna','seaborn','matplotlib','scipy'} & "
            "set(m.split('.')[0] for m in sys.modules); sys.stderr.write(repr(sorted(heavy)))")
    import subprocess
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=run_cli.__globals__["ROOT"])
    assert r.returncode == 0 and r.stderr.strip() == "[]", r.stderr


def test_show_hardware_json():
    r = run_cli("show", "hardware", "h100-sxm", "--format", "json")
    d = json.loads(r.stdout)
    assert d["peak_ops_per_s"]["fp8"] == 1979e12
    assert d["memory_tiers"][0]["bandwidth_bytes_per_s"] == 3.35e12
    assert d["tdp_w"] == 700 and d["sources"]


def test_format_no_compute_unit_can_run(tmp_path):
    # a preset that computes only int8: fp16 work has no native or wider format to run on
    import yaml
    d = yaml.safe_load((Path(__file__).resolve().parent.parent / "configs/hardware/t4.yaml").read_text())
    d["peak_ops_per_s"] = {"int8": d["peak_ops_per_s"]["int8"]}
    d.pop("sparse_peak_ops_per_s", None)
    f = tmp_path / "int8-only.yaml"
    f.write_text(yaml.safe_dump(d))
    r = run_cli("analyze", "--model", "llama-2-7b", "--hardware", f)
    assert r.returncode == 2 and "cannot compute fp16 nor any wider format" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_host_tier_too_small_is_an_error():
    # DeepSeek-V3 in FP32 is 2.7 TB: more than one H100 plus the node's 2 TiB of host memory
    r = run_cli("analyze", "--model", "deepseek-v3", "--hardware", "h100-sxm", "--offload", "greedy",
                "--weights", "fp32")
    assert r.returncode == 3 and "host" in r.stderr and "host_memory.capacity_bytes" in r.stderr


def test_analyze_with_the_simulator_stays_machine_readable(capsys):
    # --simulate puts the simulator's figures inside the document asked for, never a text table after it
    from dse.study.cli import main
    argv = ["analyze", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--concurrency", "16", "--gen-len", "8",
            "--simulate", "100"]
    assert main([*argv, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {"prefill", "decode", "summary", "simulation"}
    assert doc["simulation"]["requests_per_s"] > 0 and doc["summary"]["requests_per_s"] > 0
    assert main([*argv, "--format", "csv"]) == 0
    blocks = capsys.readouterr().out.strip().split("\n\n")
    assert len(blocks) == 3 and blocks[2].splitlines()[0].startswith("ttft_mean_s,")
    assert float(blocks[2].splitlines()[1].split(",")[0]) > 0
