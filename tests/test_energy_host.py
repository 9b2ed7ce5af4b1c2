"""The host server's power (``host_power_w``, W per device; dse/system/pricing.py ``floor_w``): energy
per token, power and $ per million tokens rise by it, worked out by hand; the device's own power
check does not see it; bad values are refused in one line from the command line and a study file."""
import contextlib
import io

import numpy as np
import pytest
import yaml

from dse.study.cli import main
from dse.system.evaluator import evaluate

pytestmark = pytest.mark.usefixtures("fixed_calibration")

HOST_W = 575.0          # a DGX H100's 10.2 kW maximum less 8 x 700 W, per GPU (README, Energy)
BASE = {"hardware": "a100-80gb", "model": "llama-3.1-8b", "batch": 16, "prompt_len": 512, "gen_len": 64}
BAD = ["-1", "nan", "inf", "1e300", "abc"]


def _pair(**point):
    """Evaluations of ``point`` without and with the host's power, and the points' devices."""
    off = evaluate({**BASE, **point})
    on = evaluate({**BASE, **point, "host_power_w": HOST_W})
    return off, on, np.asarray(off["devices"], dtype=float)


@pytest.mark.parametrize("point", [{}, {"tp": 2}, {"serving": "continuous", "concurrency": 8},
                                   {"serving": "continuous", "request_rate": 2.0, "disaggregate": "1:1"},
                                   {"spec_draft": "self:4", "spec_tokens": 3, "spec_acceptance": 0.7}])
def test_energy_per_token_rises_by_host_power_times_devices_over_tokens_per_s(point):
    off, on, devices = _pair(**point)
    tps = np.asarray(off["output_tokens_per_s"], dtype=float)
    assert np.all(np.isfinite(off["energy_per_token_j"]))
    # speed is the device's: the host's power changes no time
    np.testing.assert_allclose(on["output_tokens_per_s"], tps, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(on["energy_per_token_j"]) - off["energy_per_token_j"],
                               HOST_W * devices / tps, rtol=1e-9)
    np.testing.assert_allclose(np.asarray(on["power_w"]) - off["power_w"], HOST_W * devices, rtol=1e-9)
    np.testing.assert_allclose(on["tokens_per_joule"], 1.0 / np.asarray(on["energy_per_token_j"]), rtol=1e-12)
    # the device's demand and its TDP check leave the host out
    np.testing.assert_allclose(on["power_demand_w"], off["power_demand_w"], rtol=1e-12)


def test_left_out_is_zero_and_zero_is_the_accelerators_alone():
    a, b = evaluate(BASE), evaluate({**BASE, "host_power_w": 0.0})
    for k in ("energy_per_token_j", "power_w", "cost_per_million_tokens_usd"):
        assert a[k][0] == b[k][0]


def test_cost_per_million_tokens_counts_the_host_serving_and_idle():
    """$/Mtok = 1e6 x TCO per s / (tokens per s x utilization); the host draws its power all the time
    (serving and idle), so TCO per s rises by host x devices x PUE x $/kWh / 3.6e6."""
    econ = {"electricity_usd_per_kwh": 0.1, "pue": 1.3, "utilization": 0.5}
    off, on, devices = _pair(tp=2, **econ)
    tps = float(off["output_tokens_per_s"][0])
    extra_per_s = HOST_W * devices[0] * 1.3 * 0.1 / 3.6e6
    assert on["cost_per_million_tokens_usd"][0] - off["cost_per_million_tokens_usd"][0] == pytest.approx(
        1e6 * extra_per_s / (tps * 0.5), rel=1e-6)


def _one_line_exit_2(argv) -> str:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(argv)
    lines = [x for x in err.getvalue().splitlines() if x.strip()]
    assert rc == 2 and len(lines) == 1, (argv, rc, lines)
    return lines[0]


@pytest.mark.parametrize("value", BAD)
def test_a_bad_host_power_is_refused_in_one_line_from_the_command_line(value):
    line = _one_line_exit_2(["analyze", "--model", "llama-3.1-8b", "--hardware", "a100-80gb",
                             f"--host-power-w={value}"])
    assert "--host-power-w" in line


@pytest.mark.parametrize("value", BAD)
def test_a_bad_host_power_is_refused_in_one_line_from_a_study_file(value, tmp_path):
    f = tmp_path / "host.yaml"
    v = {"-1": -1, "nan": float("nan"), "inf": float("inf"), "1e300": 1e300}.get(value, value)
    f.write_text(yaml.safe_dump({"name": "host", "space": {**BASE, "host_power_w": v},
                                 "objectives": {"tokens_per_joule": "max"}}))
    line = _one_line_exit_2(["run", str(f), "--quiet", "--out", str(tmp_path / "out")])
    assert "host_power_w" in line and "host.yaml" in line


def test_zero_is_accepted_from_both(tmp_path):
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["analyze", "--model", "llama-3.1-8b", "--hardware", "a100-80gb", "--host-power-w", "0"]) == 0
    f = tmp_path / "host.yaml"
    f.write_text(yaml.safe_dump({"name": "host", "space": {**BASE, "host_power_w": [0, HOST_W]},
                                 "objectives": {"tokens_per_joule": "max"}}))
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["run", str(f), "--quiet", "--out", str(tmp_path / "out")]) == 0
