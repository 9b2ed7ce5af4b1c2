"""The energy model and the technology table (hwmodels/energy.py, configs/technology.yaml): cited
values come back exactly, the step energy is the linear sum over arrays of design points, and a
malformed table is a DseError naming the file and the key."""
import numpy as np
import pytest
import yaml

from basis.errors import DseError
from hwmodels.energy import (
    TECHNOLOGY_FILE,
    WIDER,
    arithmetic_energy_j,
    bit_energy_j,
    dynamic_energy_j,
    energy_per_step_j,
    load_technology,
    mac_energy_j,
    op_energy,
    static_power_w,
    technology_from_dict,
)
from hwmodels.template import a100, h100


def test_measured_device_coefficients_equal_sc25_table3():
    """SC'25 Table 3 (A100, GH200's Hopper GPU): M-FP16 pJ/FLOP, L1/L2/HBM pJ/bit; Table 2: 54 W."""
    assert op_energy("a100-sxm4-40gb", "fp16") == (0.70e-12, "fp16")
    assert op_energy("a100-sxm4-40gb", "fp64") == (13.35e-12, "fp64")
    assert op_energy("a100-sxm4-40gb", "fp64_vector") == (28.50e-12, "fp64_vector")
    assert [bit_energy_j("a100-sxm4-40gb", lv) for lv in ("l1", "l2", "hbm")] == [1.59e-12, 4.71e-12, 13.11e-12]
    assert op_energy("gh200-hopper", "fp16") == (0.52e-12, "fp16")
    assert [bit_energy_j("gh200-hopper", lv) for lv in ("l1", "l2", "hbm")] == [1.45e-12, 4.87e-12, 11.68e-12]
    tech = load_technology()
    assert tech.profile("a100-sxm4-40gb").constant_power_w == 54
    assert tech.profile("gh200-hopper").constant_power_w is None


def test_circuit_energies_equal_horowitz_and_jouppi():
    """Horowitz ISSCC 2014 Fig. 1.1.9 (45 nm) and Jouppi et al. ISCA 2021 Table 2 (7 nm)."""
    assert arithmetic_energy_j("horowitz-45nm", "fp16_mult") == 1.1e-12
    assert arithmetic_energy_j("horowitz-45nm", "fp32_add") == 0.9e-12
    assert arithmetic_energy_j("horowitz-45nm", "int8_mult") == 0.2e-12
    assert arithmetic_energy_j("horowitz-45nm", "fp32_mult") == 3.7e-12
    assert arithmetic_energy_j("jouppi-7nm", "bf16_mult") == 0.21e-12
    assert arithmetic_energy_j("jouppi-7nm", "int8_mult") == 0.07e-12
    # a MAC is the multiply plus its accumulator's add (FP32 for FP16/BF16, INT32 for INT8)
    assert mac_energy_j("horowitz-45nm", "fp16") == pytest.approx(1.1e-12 + 0.9e-12)
    assert mac_energy_j("horowitz-45nm", "int8") == pytest.approx(0.2e-12 + 0.1e-12)
    assert mac_energy_j("jouppi-7nm", "bf16") == pytest.approx(0.21e-12 + 0.38e-12)
    assert mac_energy_j("jouppi-7nm", "int8") == pytest.approx(0.07e-12 + 0.03e-12)
    tech = load_technology()
    assert tech.access_64bit["horowitz-45nm"]["sram_8kib"] == 10e-12
    assert tech.access_64bit["horowitz-45nm"]["dram_low"] == 1.3e-9
    assert tech.access_64bit["jouppi-7nm"]["sram_1mib"] == 14e-12
    with pytest.raises(DseError, match="jouppi-7nm has no 'fp16_mult'"):
        mac_energy_j("jouppi-7nm", "fp16")


def test_memory_and_link_energies_per_bit():
    tech = load_technology()
    assert tech.memory_tech("hbm2").access_energy_j_per_bit == 3.97e-12   # O'Connor MICRO 2017 Sec. 1
    assert tech.memory_tech("gddr5").access_energy_j_per_bit == 14.0e-12  # O'Connor Fig. 1a
    assert tech.link_tech("nvlink-c2c").energy_j_per_bit == 1.3e-12       # NVIDIA Grace Hopper blog


def test_unmeasured_classes_widen_to_the_nearest_measured_one():
    for cls in ("fp8", "int8", "int4", "fp4", "fp6", "bf16"):
        assert op_energy("a100-sxm4-40gb", cls) == (0.70e-12, "fp16"), cls
    assert op_energy("a100-sxm4-40gb", "fp32") == (28.50e-12, "fp64_vector")
    assert op_energy("a100-sxm4-40gb", "tf32") == (28.50e-12, "fp64_vector")
    assert op_energy("gh200-hopper", "fp64") == (23.60e-12, "fp64_vector")
    assert all(v in WIDER or v in ("fp16", "fp64_vector") for v in WIDER.values())
    with pytest.raises(DseError, match="unknown compute class 'fp99'"):
        op_energy("a100-sxm4-40gb", "fp99")
    with pytest.raises(DseError, match="no measured energy per bit at level 'dram'"):
        bit_energy_j("a100-sxm4-40gb", "dram")
    with pytest.raises(DseError, match="unknown energy profile"):
        op_energy("tpu-v9", "fp16")


def test_energy_per_step_is_linear_and_vectorised():
    ops = {"fp16": np.array([1e12, 2e12, 0.0]), "fp8": np.array([0.0, 1e12, 1e12])}
    nbytes = {"hbm": np.array([1e9, 0.0, 2e9]), "l2": 1e9}
    secs = np.array([1e-3, 2e-3, 3e-3])
    e = energy_per_step_j(ops, nbytes, "a100-sxm4-40gb", seconds=secs, static_w=54.0)
    expected = ((ops["fp16"] + ops["fp8"]) * 0.70e-12 + 8 * nbytes["hbm"] * 13.11e-12 + 8 * 1e9 * 4.71e-12
                + 54.0 * secs)
    assert e.shape == (3,) and np.allclose(e, expected, rtol=1e-15)
    # a scalar step returns a float; the dynamic part alone has no static term
    one = energy_per_step_j({"fp16": 1e12}, {"hbm": 1e9}, "a100-sxm4-40gb", seconds=0.01, static_w=54.0)
    assert isinstance(one, float) and one == pytest.approx(0.70 + 8 * 13.11e-3 + 0.54)
    assert dynamic_energy_j({}, {}, "gh200-hopper") == 0.0
    # a node name means the node's default measured profile (4N -> the Hopper GPU)
    assert dynamic_energy_j({"fp16": 1e12}, {}, "4N") == dynamic_energy_j({"fp16": 1e12}, {}, "gh200-hopper")
    # doubling the work doubles the dynamic energy
    d1 = dynamic_energy_j(ops, nbytes, "gh200-hopper")
    d2 = dynamic_energy_j({k: 2 * v for k, v in ops.items()}, {k: 2 * np.asarray(v) for k, v in nbytes.items()},
                          "gh200-hopper")
    assert np.allclose(d2, 2 * d1)


def test_static_power():
    assert static_power_w(a100()) == 54
    with pytest.raises(DseError, match="gh200-hopper has no published constant power"):
        static_power_w(h100())
    from dataclasses import replace
    assert static_power_w(replace(h100(), static_power_w=70.0)) == 70.0


def test_shipped_table_cites_every_number():
    """Every {value: ...} leaf of the shipped table names a key of its sources map."""
    raw = yaml.safe_load(TECHNOLOGY_FILE.read_text())
    sources = set(raw["sources"])
    leaves = []

    def walk(node, where):
        if isinstance(node, dict):
            if "value" in node:
                leaves.append((where, node))
                return
            for k, v in node.items():
                walk(v, f"{where}.{k}")

    walk({k: v for k, v in raw.items() if k not in ("sources", "not_found", "description")}, "")
    assert len(leaves) > 80
    for where, leaf in leaves:
        assert leaf["source"] in sources, where
    tech = load_technology()
    assert tech.not_found and tech.node("4N").alias_of == "N5"
    assert tech.node("4N").wafer_price_usd == tech.node("N5").wafer_price_usd == 16988


def _write(tmp_path, mutate):
    raw = yaml.safe_load(TECHNOLOGY_FILE.read_text())
    mutate(raw)
    p = tmp_path / "technology.yaml"
    p.write_text(yaml.safe_dump(raw))
    return p


@pytest.mark.parametrize("mutate, key, allowed", [
    (lambda r: r["nodes"]["N7"]["wafer_price_usd"].pop("source"), "nodes.N7.wafer_price_usd", "source"),
    (lambda r: r["nodes"]["N7"].update(wafer_prize_usd=r["nodes"]["N7"]["wafer_price_usd"]), "nodes.N7",
     "allowed: defect_density_per_m2"),
    (lambda r: r["memory"]["hbm3"]["pin_rate_bps"].update(value=-1), "memory.hbm3.pin_rate_bps.value",
     "must be positive"),
    (lambda r: r["memory"]["hbm3"]["pin_rate_bps"].update(value="fast"), "memory.hbm3.pin_rate_bps.value",
     "finite number"),
    (lambda r: r["area_model"].pop("fpu64_transistors"), "area_model", "missing required key 'fpu64_transistors'"),
    (lambda r: r["nodes"]["4N"].update(same_as="N2"), "nodes.4N.same_as", "own figures; allowed:"),
    (lambda r: r["energy"]["devices"]["gh200-hopper"].update(node="N9"), "energy.devices.gh200-hopper.node",
     "not a node of this file; allowed:"),
    (lambda r: r["energy"]["devices"]["gh200-hopper"].update(op_fp99={"value": 1, "source": "x"}),
     "energy.devices.gh200-hopper", "allowed:"),
    (lambda r: r["nodes"]["N7"].update(energy_profile="v100"), "nodes.N7.energy_profile", "energy.devices"),
    (lambda r: r["wafer"]["reticle_area_m2"].update(note="x", sauce=1), "wafer.reticle_area_m2",
     "allowed: value, source, note"),
    (lambda r: r.pop("links"), "", "missing required key 'links'"),
])
def test_malformed_table_names_file_and_key(tmp_path, mutate, key, allowed):
    p = _write(tmp_path, mutate)
    with pytest.raises(DseError) as e:
        load_technology(p)
    msg = str(e.value)
    assert str(p) in msg and key in msg and allowed in msg, msg
    assert "\n" not in msg


def test_bad_yaml_and_top_level():
    with pytest.raises(DseError, match="expected a mapping"):
        technology_from_dict([1, 2], "x.yaml")
    with pytest.raises(DseError, match="unknown key"):
        technology_from_dict({**yaml.safe_load(TECHNOLOGY_FILE.read_text()), "extra": 1}, "x.yaml")
