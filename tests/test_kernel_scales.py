"""A kernel library's share of what the hardware reaches (issue 42: achieved bandwidth depends on the
kernel library, not only on the family): the Apple family's memory fraction is what MLX's decode
kernels reach, and llama.cpp's 2023 Metal kernels keep the lower share their own rows measured,
through the llama.cpp profile's ``kernel_scales`` on Apple only. Checked against the measured rows
dse ships (data/gathered/other_vendors.csv V094: mlx-lm 0.20.4 on an M3 Max; data/
measured_calibration.csv M201: llama.cpp Metal on an M2 Max) and the engine layer's rules."""
import pytest

from basis.errors import DseError
from dse import evaluate
from dse.core import engines as E
from dse.core.efficiency import efficiency_for


def test_mlx_decodes_a_70b_model_near_its_measured_speed_on_an_m3_max():
    """V094: Llama-3.3-70B-Instruct-4bit (MLX), 260-token prompt, 309 generated, 9.351 tokens/s a
    user (github.com/ml-explore/mlx-examples/issues/1029); with the family's old 0.55 it came out 41 % slow."""
    ev = evaluate({"model": "llama-3.3-70b", "hardware": "m3-max", "weights": "mlx-4bit", "activations": "fp16",
                   "kv": "fp16", "batch": 1, "prompt_len": 260, "gen_len": 309, "engine": "mlx-lm"})
    assert 1.0 / ev["tpot_s"][0] == pytest.approx(9.351, rel=0.10)


def test_llama_cpp_keeps_its_own_measured_share_on_apple():
    """M201: LLaMA-7B Q4_0 on an M2 Max (400 GB/s), 61.71 tokens/s in tg128 (github.com/ggml-org/
    llama.cpp/pull/2959): ~236 GB/s, 0.59 of peak; MLX on the same hardware reads far faster."""
    point = {"model": "llama-2-7b", "hardware": "m2-max", "weights": "q4_0", "activations": "fp16", "kv": "fp16",
             "batch": 1, "prompt_len": 1, "gen_len": 128}
    cpp, mlx = evaluate({**point, "engine": "llama.cpp"}), evaluate({**point, "engine": "mlx-lm"})
    assert 1.0 / cpp["tpot_s"][0] == pytest.approx(61.71, rel=0.20)
    assert mlx["tpot_s"][0] < 0.75 * cpp["tpot_s"][0]
    assert "memory_scale 0.61 cited on apple" in cpp.efficiency_name(0)
    assert "cited" not in mlx.efficiency_name(0)


def test_a_cited_scale_holds_on_its_family_only():
    cpp = E.get_engine("llama.cpp")
    on_apple = E.engine_efficiency(efficiency_for("apple"), cpp, family="apple")
    on_gpu = E.engine_efficiency(efficiency_for("gpu"), cpp, family="gpu")
    assert on_apple.memory == pytest.approx(efficiency_for("apple").memory * 0.61)
    assert on_gpu.memory == efficiency_for("gpu").memory and "cited" not in on_gpu.name
    assert on_apple.name.startswith("prior apple + prior engine llama.cpp")   # still a prior engine: its band


def test_an_engines_own_fit_on_the_family_replaces_its_cited_scale():
    sections = {"engines": {"llama.cpp": {"memory_scale": 0.8}}, "engine_families": {"llama.cpp": ["apple"]}}
    params, notes = E.engine_parameters(E.get_engine("llama.cpp"), sections=sections, family="apple")
    assert params["memory_scale"] == 0.8 and not any("cited" in n for n in notes)
    # fitted on GPU rows only: on Apple it is a prior engine again, with its cited share
    sections["engine_families"] = {"llama.cpp": ["gpu"]}
    params, notes = E.engine_parameters(E.get_engine("llama.cpp"), sections=sections, family="apple")
    assert params["memory_scale"] == 0.61 and "memory_scale 0.61 cited on apple" in notes


PROFILE = """default_engine: e
engines:
  e:
    batching: static
    graphs: false
    attention: fused
    gqa_kv_sharing: true
    allreduce: none
    sources: {batching: x, graphs: x, attention: x, allreduce: x%s}
    kernel_scales: %s
"""


@pytest.mark.parametrize("scales, source, says", [
    ("{fpga: {memory_scale: 0.5}}", ", kernel_scales: x", "kernel_scales: unknown hardware family 'fpga'"),
    ("{apple: {memory: 0.5}}", ", kernel_scales: x", "kernel_scales.apple: unknown key 'memory'"),
    ("{apple: {memory_scale: 1.5}}", ", kernel_scales: x", "kernel_scales.apple.memory_scale: expected a number from 0.2"),
    ("{apple: {memory_scale: .nan}}", ", kernel_scales: x", "kernel_scales.apple.memory_scale: expected a number"),
    ("{apple: 0.5}", ", kernel_scales: x", "kernel_scales.apple: expected a mapping"),
    ("{apple: {memory_scale: 0.5}}", "", "every attribute needs a source; missing: kernel_scales"),
])
def test_a_malformed_kernel_scale_is_one_line_naming_the_key(tmp_path, scales, source, says):
    p = tmp_path / "engines.yaml"
    p.write_text(PROFILE % (source, scales))
    with pytest.raises(DseError) as e:
        E._profiles(str(p))
    assert says in str(e.value) and str(p) in str(e.value) and "\n" not in str(e.value)
