"""Storage cost of each data format, block scales included (OCP MX v1.0, NVFP4, grouped INT4)."""
import pytest

from basis.errors import DseError
from hwmodels.formats import FORMATS, get_format

EXPECTED_BITS = {
    "fp32": 32, "bf16": 16, "fp16": 16, "fp8": 8, "fp8-e5m2": 8, "fp6": 6, "fp4": 4, "int8": 8,
    "int4": 4 + 16 / 128,     # FP16 scale per group of 128
    "mxfp8": 8 + 8 / 32,      # E8M0 scale per block of 32
    "mxfp6": 6 + 8 / 32,
    "mxfp4": 4 + 8 / 32,
    "mxint8": 8 + 8 / 32,
    "nvfp4": 4 + 8 / 16,      # E4M3 scale per block of 16
}


def test_all_formats_present():
    assert set(FORMATS) == set(EXPECTED_BITS)


@pytest.mark.parametrize("name", sorted(EXPECTED_BITS))
def test_storage_bits(name):
    assert get_format(name).bits == pytest.approx(EXPECTED_BITS[name])
    assert get_format(name).bytes == pytest.approx(EXPECTED_BITS[name] / 8)


def test_unknown_format_lists_valid_names():
    with pytest.raises(DseError, match="valid formats: fp32, bf16"):
        get_format("fp5")
