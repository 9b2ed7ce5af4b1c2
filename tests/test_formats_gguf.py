"""llama.cpp's GGUF and MLX's quantized formats (issue 42: rows run in them are predictable): their
storage bits from the block layouts, and the weights of Llama-3.1-8B against the file sizes the
llama.cpp quantize README publishes (meta-llama/Llama-3.1-8B: Q4_K_M 4.58 GiB, Q5_K_M 5.33, Q6_K
6.14, Q8_0 7.95; github.com/ggml-org/llama.cpp tools/quantize/README.md, commit 311c2c9f)."""
import subprocess
import sys

import pytest

from basis.errors import DseError
from dse import evaluate
from hwmodels.formats import get_format
from workloads.footprint import parameter_count
from workloads.model import load_model

GIB = 2 ** 30


@pytest.mark.parametrize("name,bits", [("q4_0", 4 + 16 / 32), ("q8_0", 8 + 16 / 32),
                                       ("mlx-4bit", 4 + 2 * 16 / 64), ("mlx-8bit", 8 + 2 * 16 / 64)])
def test_block_layouts(name, bits):
    """Q4_0 / Q8_0: 32 weights and one FP16 scale a block; MLX: 64 weights, an FP16 scale and bias."""
    assert get_format(name).bits == bits


@pytest.mark.parametrize("name,gib", [("q4_k_m", 4.58), ("q5_k_m", 5.33), ("q6_k", 6.14), ("q8_0", 7.95)])
def test_llama31_8b_weights_are_the_published_file_sizes(name, gib):
    ev = evaluate({"model": "llama-3.1-8b", "hardware": "rtx-4090", "weights": name, "batch": 1,
                   "prompt_len": 128, "gen_len": 16})
    assert ev["weights_bytes"][0] / GIB == pytest.approx(gib, abs=0.006)


def test_q4_0_weights_are_parameters_times_its_bits():
    m = load_model("mistral-7b")
    ev = evaluate({"model": "mistral-7b", "hardware": "m2-ultra", "weights": "q4_0", "batch": 1,
                   "prompt_len": 128, "gen_len": 16})
    assert ev["weights_bytes"][0] == pytest.approx(parameter_count(m) * 4.5 / 8, rel=1e-9)


def test_a_bandwidth_bound_decode_reads_its_weights_once_a_token():
    """Batch 1 on an RTX 4090 (1,008 GB/s): TPOT at least the weight bytes over the bandwidth, and
    Q4_K_M faster than Q8_0 by at most their bytes' ratio."""
    run = {f: evaluate({"model": "llama-3.1-8b", "hardware": "rtx-4090", "weights": f, "batch": 1,
                        "prompt_len": 128, "gen_len": 128}) for f in ("q4_k_m", "q8_0")}
    for ev in run.values():
        assert ev["tpot_s"][0] >= ev["weights_bytes"][0] / 1008e9
    ratio = run["q8_0"]["weights_bytes"][0] / run["q4_k_m"]["weights_bytes"][0]
    assert 1.0 < run["q8_0"]["tpot_s"][0] / run["q4_k_m"]["tpot_s"][0] <= ratio


def test_unknown_names_still_refused():
    with pytest.raises(DseError, match="unknown format 'q4_k_x'"):
        get_format("q4_k_x")
    done = subprocess.run([sys.executable, "-m", "dse.study", "analyze", "--model", "llama-3.1-8b", "--hardware",
                           "rtx-4090", "--weights", "q4_k_x"], capture_output=True, text=True)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1 and "q4_k_x" in done.stderr
