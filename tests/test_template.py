"""The accelerator template (hwmodels/template.py): A100/H100 from their published microarchitecture
against the presets' datasheet figures and published die areas and board powers; dies per wafer and
yield against their textbook closed forms."""
import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from basis.errors import DseError
from hwmodels.energy import load_technology
from hwmodels.presets import load_device
from hwmodels.template import (
    AcceleratorTemplate,
    a100,
    board_power_w,
    chiplets_needed,
    cost,
    die_area,
    die_area_m2,
    die_cost_usd,
    die_yield,
    dies_per_wafer,
    exceeds_reticle,
    h100,
    memory_bandwidth_bytes_per_s,
    memory_capacity_bytes,
    peak_dynamic_power_w,
    peak_ops_per_s,
    peak_power_demand_w,
    vector_ops_per_s,
    yield_murphy,
    yield_negative_binomial,
    yield_poisson,
)

# Published die areas (m^2): A100 826 mm^2 (A100 whitepaper; LLMCompass Table IV), H100 814 mm^2
# (H100 whitepaper). The A100 is near the area model's calibration set (LLMCompass fitted its
# overheads on GA100 and MI210); the H100 is held out.
A100_DIE_M2 = 826e-6
H100_DIE_M2 = 814e-6

# Half a unit in the last digit the datasheet prints, per class (the presets copy the datasheet;
# H100 dense figures are its sparse figures halved, so half of half a unit of those).
A100_PRINT_HALF_UNIT = {"fp16": 0.5e12, "bf16": 0.5e12, "tf32": 0.5e12, "int8": 0.5e12, "fp32": 0.05e12}
H100_PRINT_HALF_UNIT = {"fp16": 0.25e12, "bf16": 0.25e12, "tf32": 0.25e12, "fp8": 0.25e12, "int8": 0.25e12,
                        "fp32": 0.5e12}


@pytest.mark.parametrize("make, preset, half_unit", [(a100, "a100-80gb", A100_PRINT_HALF_UNIT),
                                                      (h100, "h100-sxm", H100_PRINT_HALF_UNIT)])
def test_peaks_equal_the_datasheet_to_its_printed_precision(make, preset, half_unit):
    """SMs x MACs/clock/SM x 2 x the published clock gives the datasheet's (dense) peaks; the datasheet
    rounds them (A100: 108 x 2048 x 1.41 GHz = 311.87 TFLOPS, printed 312), so they agree to within
    half a unit of the printed last digit, and no class differs by more than 0.2 %."""
    t, d = make(), load_device(preset)
    peaks = peak_ops_per_s(t)
    assert set(half_unit) <= set(peaks) and set(half_unit) <= set(d.peak_ops_per_s)
    for cls, tol in half_unit.items():
        assert abs(peaks[cls] - d.peak_ops_per_s[cls]) <= tol, cls
        assert abs(peaks[cls] / d.peak_ops_per_s[cls] - 1) < 2e-3, cls
    assert abs(vector_ops_per_s(t) - d.vector_ops_per_s) <= half_unit["fp32"]


def test_a100_and_h100_peaks_by_hand():
    assert peak_ops_per_s(a100())["fp16"] == 108 * 1024 * 2 * 1410e6 == 311.86944e12
    assert peak_ops_per_s(h100())["fp16"] == 132 * 2048 * 2 * 1830e6
    assert peak_ops_per_s(h100())["fp8"] == 2 * peak_ops_per_s(h100())["bf16"]


@pytest.mark.parametrize("make, preset", [(a100, "a100-80gb"), (h100, "h100-sxm")])
def test_memory_bandwidth_and_capacity_equal_the_presets_exactly(make, preset):
    t, d = make(), load_device(preset)
    tier = d.memory_tiers[0]
    assert memory_bandwidth_bytes_per_s(t) == tier.bandwidth_bytes_per_s
    assert memory_capacity_bytes(t) == tier.capacity_bytes == 5 * 16 * 2 ** 30


def test_memory_bandwidth_from_the_technology_table():
    """Without a template pin rate the memory table's is used: HBM3 6.4 Gb/s x 1024 / 8 = 819.2 GB/s."""
    t = replace(h100(), memory_pin_rate_bps=None, memory_stacks=6)
    assert memory_bandwidth_bytes_per_s(t) == pytest.approx(6 * 819.2e9)
    assert memory_capacity_bytes(replace(t, memory_capacity_per_stack_bytes=None)) == 6 * 24 * 2 ** 30


@pytest.mark.parametrize("make, published", [(a100, A100_DIE_M2), (h100, H100_DIE_M2)])
def test_die_area_within_15_percent(make, published):
    area = die_area_m2(make())
    assert abs(area / published - 1) < 0.15, area * 1e6


def test_die_area_components_add_up_and_scale():
    t = a100()
    a = die_area(t)
    parts = [getattr(a, f) for f in a.__dataclass_fields__ if f != "chiplets"]
    assert a.total_m2 == pytest.approx(sum(parts)) and all(p >= 0 for p in parts)
    # the HBM PHY area is the fixed 10.45 mm^2 per interface (LLMCompass), six on GA100
    assert a.memory_phy == pytest.approx(6 * 10.45e-6)
    # more SMs, more area; a smaller node, less logic area
    assert die_area_m2(replace(t, cores_on_die=160, cores=108)) > a.total_m2
    assert die_area(replace(t, node="N5")).control < a.control


def test_reticle_and_chiplets():
    tech = load_technology()
    assert tech.reticle_area_m2 == 858e-6
    assert not exceeds_reticle(a100()) and not exceeds_reticle(h100())
    big = replace(h100(), cores_on_die=288, cores=264, global_sram_bytes_on_die=120 * 2 ** 20,
                  global_sram_bytes=100 * 2 ** 20)
    assert exceeds_reticle(big)
    need = int(chiplets_needed(die_area(big).total_m2, tech.reticle_area_m2))
    assert need == 2
    split = replace(big, chiplets=need)
    assert not exceeds_reticle(split)
    assert die_area_m2(split) == pytest.approx(die_area(big).total_m2 / 2)
    assert list(chiplets_needed(np.array([100e-6, 858e-6, 859e-6, 2000e-6]), 858e-6)) == [1, 1, 2, 3]


def test_dies_per_wafer_closed_form():
    """pi (d/2)^2 / A - pi d / sqrt(2 A) (Hennessy & Patterson Sec. 1.6): a 1.0 cm x 1.0 cm die on a
    300 mm wafer gives 706.86 - 66.64 = 640.2 dies; 1.5 cm x 1.5 cm gives 314.16 - 44.43 = 269.7."""
    assert dies_per_wafer(100e-6, 0.300) == pytest.approx(math.pi * 150 ** 2 / 100 - math.pi * 300 / math.sqrt(200))
    assert dies_per_wafer(100e-6) == pytest.approx(640.2, abs=0.05)
    assert dies_per_wafer(225e-6) == pytest.approx(269.7, abs=0.05)
    arr = dies_per_wafer(np.array([100e-6, 225e-6]))
    assert arr.shape == (2,) and arr[0] > arr[1]


def test_yield_models_closed_forms():
    # A x D = 1: Murphy ((1 - 1/e) / 1)^2, Poisson 1/e, negative binomial (1 + 1/2)^-2 at alpha = 2
    A, D = 1e-4, 1e4
    assert yield_murphy(A, D) == pytest.approx((1 - math.exp(-1)) ** 2)
    assert yield_poisson(A, D) == pytest.approx(math.exp(-1))
    assert yield_negative_binomial(A, D, 2.0) == pytest.approx(1.5 ** -2)
    # large alpha tends to Poisson; no defects, full yield; vectorised
    assert yield_negative_binomial(A, D, 1e7) == pytest.approx(math.exp(-1), rel=1e-6)
    assert yield_murphy(A, 0.0) == 1.0
    assert yield_murphy(np.array([1e-5, 1e-4]), D).shape == (2,)
    # Murphy lies between Poisson and full yield
    assert yield_poisson(A, D) < yield_murphy(A, D) < 1


def test_die_cost_is_wafer_price_over_good_dies():
    tech = load_technology()
    t = a100()
    A = die_area_m2(t)
    expected = 9346 / (math.floor(dies_per_wafer(A)) * yield_murphy(A, 900.0))
    assert tech.node("N7").wafer_price_usd == 9346 and tech.node("N7").defect_density_per_m2 == 900
    assert die_cost_usd(t) == pytest.approx(expected)
    assert die_yield(t, model="negative_binomial", alpha=3.0) == pytest.approx(
        yield_negative_binomial(A, 900.0, 3.0))
    c = cost(t)
    # memory: 80 GiB of HBM2e at LLMCompass's USD 7 per GB
    assert c.memory_usd == pytest.approx(5 * 16 * 2 ** 30 * 7e-9)
    assert c.packaging_usd is None and any("packaging" in m for m in c.missing)
    assert c.known_usd == pytest.approx(c.die_usd + c.memory_usd)
    # H100's 4N uses the N5 row; HBM3 has no published price, so it is reported missing
    ch = cost(h100())
    assert ch.memory_usd is None and any("hbm3" in m for m in ch.missing)
    with pytest.raises(DseError, match="negative_binomial needs a positive alpha"):
        die_yield(t, model="negative_binomial")


@pytest.mark.parametrize("make, tdp", [(a100, 400.0), (h100, 700.0)])
def test_board_power_within_20_percent_and_power_limited(make, tdp):
    """SC'25's measured coefficients at the ridge (matrix FP16 at peak + HBM at full bandwidth) ask
    for more than the TDP (A100 432 W dynamic, H100 828 W), i.e. both GPUs are power-limited at peak,
    as SC'25's min(TDP, ...) says; the board power is then the limit."""
    t = make()
    dyn = peak_dynamic_power_w(t)
    assert tdp < dyn < 1.25 * tdp
    assert abs(board_power_w(t) / tdp - 1) <= 0.20
    assert board_power_w(t) == tdp


def test_a100_power_by_hand():
    t = a100()
    dyn = 311.86944e12 * 0.70e-12 + 2.039e12 * 8 * 13.11e-12
    assert peak_dynamic_power_w(t) == pytest.approx(dyn)
    assert peak_power_demand_w(t) == pytest.approx(54 + dyn)
    # without a limit the board power is the demand; with a high one, too
    assert board_power_w(replace(t, power_limit_w=None)) == pytest.approx(54 + dyn)
    assert board_power_w(replace(t, power_limit_w=1000.0)) == pytest.approx(54 + dyn)


def test_h100_static_power_is_not_published():
    t = h100()
    with pytest.raises(DseError, match="no published constant power"):
        peak_power_demand_w(t)
    assert peak_power_demand_w(replace(t, static_power_w=10.0)) == pytest.approx(10.0 + peak_dynamic_power_w(t))


def test_template_validation():
    with pytest.raises(DseError, match="cores .* exceeds cores_on_die"):
        replace(a100(), cores=200)
    with pytest.raises(DseError, match="clock_hz must be positive"):
        replace(a100(), clock_hz=0)
    with pytest.raises(DseError, match="unknown class"):
        replace(a100(), matrix_macs_per_cycle_per_core={"fp99": 1})
    with pytest.raises(DseError, match="unknown process node 'N1'"):
        die_area(replace(a100(), node="N1"))
    with pytest.raises(DseError, match="unknown memory type"):
        memory_bandwidth_bytes_per_s(replace(a100(), memory_type="hbm9"))
    with pytest.raises(DseError, match="wafer_price_usd is not published"):
        die_cost_usd(replace(a100(), node="N3"))
    t = a100()
    assert isinstance(t, AcceleratorTemplate) and hash(t.name)
    with pytest.raises(TypeError):
        t.matrix_macs_per_cycle_per_core["fp16"] = 1


def test_hwmodels_does_not_import_dse_or_workloads():
    from pathlib import Path
    for name in ("template.py", "energy.py"):
        text = (Path(__file__).resolve().parent.parent / "hwmodels" / name).read_text()
        assert "import dse" not in text and "from dse" not in text
        assert "import workloads" not in text and "from workloads" not in text


@pytest.mark.parametrize("preset, area_mm2, power_w", [("a100-80gb", 826, 400), ("h100-sxm", 814, 700)])
def test_show_hardware_reports_the_templates_die_area_and_board_power(preset, area_mm2, power_w):
    # the check: `show hardware NAME --format json` carries die_area_mm2 and board_power_w
    r = subprocess.run([sys.executable, "-m", "dse.study", "show", "hardware", preset, "--format", "json"],
                       capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent, timeout=60)
    assert r.returncode == 0, r.stderr
    shown = json.loads(r.stdout)
    assert shown["die_area_mm2"] == pytest.approx(area_mm2, rel=0.15)
    assert shown["board_power_w"] == pytest.approx(power_w, rel=0.20)
