"""Storage cost of each data format, block scales included (OCP MX v1.0, NVFP4, grouped INT4)."""
import pytest

from basis.errors import DseError
from hwmodels.formats import FORMATS, get_format

EXPECTED_BITS = {
    "fp32": 32, "bf16": 16, "fp16": 16, "fp8": 8, "fp8-e5m2": 8, "fp6": 6, "fp4": 4, "int8": 8,
    "int4": 4 + 16 / 128,     # FP16 scale per group of 128
    "int3": 3 + 16 / 128,
    "int2": 2 + 16 / 128,
    "mxfp8": 8 + 8 / 32,      # E8M0 scale per block of 32
    "mxfp6": 6 + 8 / 32,
    "mxfp4": 4 + 8 / 32,
    "mxint8": 8 + 8 / 32,
    "nvfp4": 4 + 8 / 16,      # E4M3 scale per block of 16
    "q4_0": 4 + 16 / 32,      # GGUF: FP16 scale per block of 32
    "q8_0": 8 + 16 / 32,
    "q4_k_s": 4.6672,         # GGUF K-quant mixes: llama.cpp's Llama-3.1-8B averages (tests/test_formats_gguf.py)
    "q4_k_m": 4.8944,
    "q5_k_m": 5.7036,
    "q6_k": 6.5633,
    "mlx-4bit": 4 + 32 / 64,  # MLX: FP16 scale and bias per group of 64
    "mlx-8bit": 8 + 32 / 64,
}


def test_all_formats_present():
    assert set(FORMATS) == set(EXPECTED_BITS)


@pytest.mark.parametrize("name", sorted(EXPECTED_BITS))
def test_storage_bits(name):
    assert get_format(name).bits == pytest.approx(EXPECTED_BITS[name])
    assert get_format(name).bytes == pytest.approx(EXPECTED_BITS[name] / 8)


@pytest.mark.parametrize("name, bits", [("int4-g32", 4 + 16 / 32), ("int4-g64", 4 + 16 / 64), ("int4-g128", 4.125),
                                        ("int3-g64", 3 + 16 / 64), ("int2-g16", 2 + 1.0), ("int8-g1024", 8 + 16 / 1024)])
def test_grouped_integer_formats_pay_their_scales(name, bits):
    # one FP16 scale per group: the smaller the group, the more bits per weight
    f = get_format(name)
    assert f.bits == pytest.approx(bits) and f.compute == ("int8" if name.startswith("int8") else "int4")


@pytest.mark.parametrize("bad", ["int5-g64", "int4-g48", "int4-g8", "int4-g2048", "int4-g"])
def test_grouped_formats_outside_the_allowed_set_are_refused(bad):
    with pytest.raises(DseError, match=r"int<b>-g<N>"):
        get_format(bad)


def test_unknown_format_lists_valid_names():
    with pytest.raises(DseError, match="valid formats: fp32, bf16"):
        get_format("fp5")
