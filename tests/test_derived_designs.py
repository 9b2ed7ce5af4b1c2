"""Derived designs (hwmodels/derived.py): a preset with overrides is named as what it is, its
price, die area and TDP are its template's or unknown, never the preset's, and its physics is
that of the override columns its name stands for."""
import csv

import numpy as np
import pytest
from conftest import run_cli

from basis.errors import DseError
from dse import evaluate
from dse.study.cli import main
from hwmodels.derived import KEYS, design_name, overrides, parse_design, terms_of
from hwmodels.presets import load_device
from hwmodels.template import die_area_m2, h100

CANONICAL = [
    "h100-sxm+bw6.7T+fp8x0.5",
    "h100-sxm+bw4.8T+mem141Gi",
    "h100-sxm+fp8=989.5T+int8x0.25",
    "h100-sxm+computex1.5+tdp1k",
    "a100-80gb+cores96+clock1.6G+l2=64Mi+stacks6+memtype=hbm3e+plim500",
    "h100-sxm+bw561.2310241546871G",
    "h100-sxm+formats=fp16,bf16",
]


@pytest.mark.parametrize("name", CANONICAL)
def test_a_canonical_name_round_trips(name):
    base, terms = parse_design(name)
    assert design_name(base, terms) == name


def test_numbers_read_back_exactly():
    rng = np.random.default_rng(0)
    for v in rng.uniform(0, 1, 200) * 10.0 ** rng.integers(-3, 19, 200):
        values = {"memory_bandwidth": float(v), "memory_capacity": float(v), "peak_fp8": float(v)}
        base, terms = parse_design(design_name("h100-sxm", terms_of(values)))
        assert overrides(terms, load_device(base)) == values


def test_terms_take_the_canonical_order_and_spelling():
    assert design_name(*parse_design("h100-sxm+fp8x0.5+bw6700G")) == "h100-sxm+bw6.7T+fp8x0.5"
    assert design_name(*parse_design("h100-sxm+mem85899345920")) == "h100-sxm+mem80Gi"
    assert [k.key for k in KEYS][:2] == ["bw", "mem"]


def test_a_factor_multiplies_the_base_figure():
    d = load_device("h100-sxm")
    values = overrides(parse_design("h100-sxm+fp8x0.5+bwx2")[1], d)
    assert values == {"peak_fp8": 0.5 * 1979.0e12, "memory_bandwidth": 2 * 3.35e12}


def _point(hardware, **kw):
    cols = {"model": "llama-3.1-8b", "hardware": hardware, "batch": 1, "prompt_len": 1024, "gen_len": 256, **kw}
    return evaluate(cols, ideal=True)


def test_memory_bound_decode_follows_the_bandwidth():
    """Batch-1 decode on the ideal roofline reads the weights once a step: TPOT is the bytes over the
    bandwidth, so doubling the bandwidth halves it; halving FP8 compute leaves it alone."""
    ev = _point(["h100-sxm", "h100-sxm+bw6.7T", "h100-sxm+bw6.7T+fp8x0.5"])
    base, fast, derived = ev["tpot_s"]
    assert fast == pytest.approx(base / 2, rel=1e-9)
    assert derived == pytest.approx(fast, rel=1e-9)
    # Llama-3.1-8B in FP16 (Meta's model card: 8.03 B parameters; config.json: vocab 128,256 x hidden
    # 4,096, untied): every weight but the input embedding table, of which a step reads one row, 2 bytes
    weights = (8.03e9 - 128256 * 4096) * 2
    assert fast == pytest.approx(weights / 6.7e12, rel=0.03)


def test_compute_bound_prefill_follows_the_fp8_peak():
    """A 8k-token FP8 prefill is compute-bound: half the FP8 peak, about twice the time."""
    ev = _point(["h100-sxm", "h100-sxm+fp8x0.5"], weights="fp8", activations="fp8", kv="fp8", prompt_len=8192)
    base, half = ev["ttft_s"]
    assert 1.8 < half / base <= 2.0 + 1e-9


def test_the_name_is_the_override_columns():
    """A name's terms are the override columns: the same numbers either way."""
    by_name = evaluate({"model": "llama-3.1-8b", "hardware": "h100-sxm+bw6.7T+fp8x0.5", "weights": "fp8"})
    by_column = evaluate({"model": "llama-3.1-8b", "hardware": "h100-sxm", "memory_bandwidth": 6.7e12,
                          "peak_fp8": 0.5 * 1979.0e12, "weights": "fp8"})
    for k in ("ttft_s", "tpot_s", "output_tokens_per_s"):
        assert by_name[k][0] == by_column[k][0]
    assert by_column.point(0)["hardware_name"] == "h100-sxm+bw6.7T+fp8=989.5T"
    assert by_name.point(0)["hardware_name"] == "h100-sxm+bw6.7T+fp8x0.5"


def test_a_derived_design_is_not_priced_as_its_preset():
    ev = _point(["h100-sxm", "h100-sxm+bw6.7T", "h100-sxm+fp16x2+bf16x2", "mi300x+bw8T"])
    base, bw, wide, mi = range(4)
    assert ev["cost_usd"][base] == 25000.0
    assert np.isnan(ev["cost_usd"][[bw, wide, mi]]).all()
    assert "price unknown" in ev.point(bw)["hardware_note_name"]
    # the template's power limit (NVIDIA's 700 W) is the TDP of every H100 derivative
    assert ev["system_tdp_w"][bw] == ev["system_tdp_w"][wide] == 700.0
    # twice the FP16 MACs per SM: a larger die than the H100's, by the template's area model
    assert ev["die_area_mm2"][wide] > ev["die_area_mm2"][base] == pytest.approx(die_area_m2(h100()) * 1e6)
    # no template: every figure unknown, and the reason names it
    assert np.isnan([ev["die_area_mm2"][mi], ev["system_tdp_w"][mi]]).all()
    assert "'mi300x' has no template" in ev.point(mi)["hardware_note_name"]


def test_fewer_cores_make_a_smaller_die():
    ev = _point(["h100-sxm", "h100-sxm+cores100"])
    assert ev["die_area_mm2"][1] < ev["die_area_mm2"][0]
    assert ev.point(1)["hardware_name"] == "h100-sxm+cores100"


def test_a_given_price_prices_a_derived_design():
    ev = _point("h100-sxm+bw6.7T", price_usd=40000.0)
    assert ev["cost_usd"][0] == 40000.0


def test_an_override_equal_to_the_preset_is_the_preset():
    ev = _point("h100-sxm", memory_bandwidth=3.35e12)
    assert ev.point(0)["hardware_name"] == "h100-sxm" and ev["cost_usd"][0] == 25000.0


def test_a_name_and_a_column_must_agree():
    with pytest.raises(DseError, match="memory_bandwidth"):
        _point("h100-sxm+bw6.7T", memory_bandwidth=4e12)
    assert _point("h100-sxm+bw6.7T", memory_bandwidth=6.7e12)["tpot_s"][0] > 0


def test_a_study_with_overrides_writes_the_derived_names(tmp_path):
    study = tmp_path / "bw.yaml"
    study.write_text("name: bw\nideal: true\nspace:\n  hardware: [h100-sxm, h100-sxm+fp8x0.5]\n"
                     "  model: llama-3.1-8b\n  batch: 1\n  prompt_len: 512\n  gen_len: 64\n"
                     "  memory_bandwidth: [3.35e12, 6.7e12]\nobjectives:\n  tpot_s: min\n  memory_bandwidth: min\n"
                     "method: grid\n")
    assert main(["run", str(study), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    with open(tmp_path / "out" / "pareto.csv") as f:
        rows = list(csv.DictReader(f))
    # beside the preset as given (the parameter), what each design is
    for r in rows:
        bw = "" if float(r["memory_bandwidth"]) == 3.35e12 else "+bw6.7T"
        fp8 = "+fp8x0.5" if r["hardware"] == "h100-sxm+fp8x0.5" else ""
        assert r["design"] == f"h100-sxm{bw}{fp8}"
    assert "h100-sxm+bw6.7T" in {r["design"] for r in rows}


BAD = [
    ("h100-sxm+zz3", "'zz3': unknown key"),
    ("h100-sxm+bw6.7Q", "'bw6.7Q'"),
    ("h100-sxm+bwnan", "'bwnan'"),
    ("h100-sxm+bw-1T", "'bw-1T'"),
    ("h100-sxm+fp8x0", "positive finite"),
    ("h100-sxm+bw1T+bw2T", "given twice"),
    ("h100-sxm+fp6x2", "no peak_fp6"),
]


@pytest.mark.parametrize("name,message", BAD, ids=[m for _, m in BAD])
def test_bad_notation_is_one_line(name, message):
    r = run_cli("analyze", "--model", "llama-3.1-8b", "--hardware", name)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dse.study: error: --hardware: ") and message in lines[0], r.stderr
    if "unknown key" in message:
        assert "allowed keys: bw, mem" in lines[0]


def test_bad_notation_in_a_study_names_the_file(tmp_path):
    study = tmp_path / "bad.yaml"
    study.write_text("name: bad\nspace:\n  hardware: h100-sxm+bw2X\n  model: llama-3.1-8b\n"
                     "objectives:\n  tpot_s: min\nmethod: grid\n")
    r = run_cli("run", study, "--out", tmp_path / "out")
    assert r.returncode == 2
    line = r.stderr.strip()
    assert "\n" not in line and "bad.yaml" in line and "space.hardware" in line and "'bw2X'" in line, line


def test_compare_names_both_designs_and_their_prices():
    r = run_cli("compare", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "h100-sxm+bw6.7T+fp8x0.5",
                "--weights", "fp8")
    assert r.returncode == 0, r.stderr
    assert "h100-sxm+bw6.7T+fp8x0.5" in r.stdout and "$25,000" in r.stdout
    assert "h100-sxm+bw6.7T+fp8x0.5: price unknown" in r.stdout


def test_the_template_built_to_a_design_has_its_figures():
    """The template a derived design is priced with computes the design's own peaks, bandwidth,
    capacity and link rate back (so its area, cost and power are those of that design)."""
    from hwmodels.template import (
        link_bandwidth_bytes_per_s,
        memory_bandwidth_bytes_per_s,
        memory_capacity_bytes,
        peak_ops_per_s,
        with_figures,
    )
    t = with_figures(h100(), memory_bandwidth=6.7e12, memory_capacity=141e9, peak_fp8=989.5e12,
                     link_bandwidth=900e9, tdp_w=1000.0)
    assert memory_bandwidth_bytes_per_s(t) == pytest.approx(6.7e12, rel=1e-12)
    assert memory_capacity_bytes(t) == pytest.approx(141e9, rel=1e-12)
    assert peak_ops_per_s(t)["fp8"] == pytest.approx(989.5e12, rel=1e-12)
    assert link_bandwidth_bytes_per_s(t) == pytest.approx(900e9, rel=1e-12)
    assert t.power_limit_w == 1000.0
    with pytest.raises(DseError, match="onchip_buffer_bytes"):
        with_figures(h100(), onchip_buffer_bytes=1e6)


def test_a_figure_the_template_does_not_model_leaves_the_figures_unknown():
    ev = _point(["h100-sxm+buf1Mi", "mi300x+bw8T+tdp1k"])
    assert np.isnan([ev["die_area_mm2"][0], ev["system_tdp_w"][0], ev["cost_usd"][0]]).all()
    assert "does not model onchip_buffer_bytes" in ev.point(0)["hardware_note_name"]
    assert ev["system_tdp_w"][1] == 1000.0            # a TDP given is the TDP still
    assert ev.point(1)["hardware_note_name"].startswith("price, die area unknown")


def test_formats_and_template_names_mix_with_presets():
    ev = _point(["h100-sxm", "h100-sxm+stacks6+memtype=hbm3e", "a100-80gb+formats=fp16,bf16",
                 "h100-sxm+formats=int8,fp32,tf32,bf16,fp16,fp8"])
    names = [ev.point(i)["hardware_name"] for i in range(4)]
    # the H100's own formats in another order are the H100 itself
    assert names == ["h100-sxm", "h100-sxm+stacks6+memtype=hbm3e", "a100-80gb+formats=fp16,bf16", "h100-sxm"]
    assert ev["cost_usd"][3] == 25000.0 and np.isnan(ev["cost_usd"][1])
    # six HBM3E stacks: more bandwidth than five HBM3 stacks, so a faster memory-bound decode
    assert ev["tpot_s"][1] < ev["tpot_s"][0]


def test_names_of_many_designs_are_spelled_when_read():
    """Designs given as columns are named when their names are read (``dse.system.hardware.DesignNames``),
    with the names a design given by name has; a pickled evaluation carries them as a list."""
    import pickle
    bw = np.array([6.7e12, 4.8e12, 3.35e12, 6.7e12])
    ev = evaluate({"model": "llama-3.1-8b", "hardware": "h100-sxm", "memory_bandwidth": bw,
                   "peak_fp8": [989.5e12, np.nan, 989.5e12, 989.5e12], "weights": "fp8"})
    codes, names = ev.labels["hardware"]
    assert len(names) == 3 and type(names).__name__ == "DesignNames"
    expected = ["h100-sxm+bw6.7T+fp8=989.5T", "h100-sxm+bw4.8T", "h100-sxm+fp8=989.5T", "h100-sxm+bw6.7T+fp8=989.5T"]
    assert [ev.point(i)["hardware_name"] for i in range(4)] == expected
    assert [names[c] for c in codes] == expected
    assert pickle.loads(pickle.dumps(names)) == list(names)
    by_name = evaluate({"model": "llama-3.1-8b", "hardware": expected, "weights": "fp8"})
    assert [by_name.point(i)["hardware_name"] for i in range(4)] == expected
