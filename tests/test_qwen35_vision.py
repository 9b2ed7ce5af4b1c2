"""Qwen3.5's vision tower (issue 45): read from the VLM config's own ``vision_config`` as Qwen3-VL's
tower without the DeepStack mergers (transformers' Qwen3_5VisionModel deletes them), checked
against a hand count of those mergers and against Qwen3-VL's tokens per image."""
import pytest

from dse import evaluate
from workloads.model import load_model
from workloads.vision import image_tokens
from workloads.vision import parameter_count as vision_parameters

pytestmark = pytest.mark.usefixtures("fixed_calibration")


def _merger(hidden: int, merge: int, out: int) -> int:
    """One patch merger's parameters by hand: LayerNorm over m = hidden x merge^2 (weight and bias),
    Linear(m, m) and Linear(m, out) with biases."""
    m = hidden * merge ** 2
    return 2 * m + (m * m + m) + (m * out + out)


def test_qwen35_tower_is_qwen3vl_less_its_deepstack_mergers():
    """Qwen3-VL-8B's tower has 1 + 3 mergers (deepstack_visual_indexes [8, 16, 24]); Qwen3.5-27B's the
    same blocks and one merger writing its 5,120-wide decoder: their difference is three mergers of
    Qwen3-VL's width plus the last merger's wider output."""
    vl, q = load_model("qwen3-vl-8b-instruct").vision, load_model("qwen3.5-27b").vision
    assert (q.family, q.mergers, q.depth, q.hidden_size) == ("qwen3_vl", 1, vl.depth, vl.hidden_size)
    h, k = vl.hidden_size, vl.spatial_merge_size
    expected = (vision_parameters(vl) - 3 * _merger(h, k, vl.out_hidden_size)
                - _merger(h, k, vl.out_hidden_size) + _merger(h, k, q.out_hidden_size))
    assert vision_parameters(q) == expected
    assert q.out_hidden_size == load_model("qwen3.5-27b").hidden_size


@pytest.mark.parametrize("h,w", [(1024, 1024), (768, 1024)])
def test_qwen35_tokens_are_qwen3vl_rule(h, w):
    """16 px patches, 2 x 2 merged: (H / 16)(W / 16) / 4 tokens, as Qwen3-VL."""
    assert image_tokens(load_model("qwen3.5-35b-a3b").vision, h, w) == (h // 16) * (w // 16) // 4


def test_an_image_adds_its_tokens_and_the_encoder_to_ttft():
    """One 1024 x 1024 image on Qwen3.5-27B: TTFT exceeds that of the text prompt grown by the image's
    1,024 tokens (the encoder runs before the prefill), and without images nothing changes."""
    base = {"model": "qwen3.5-27b", "hardware": "h200", "weights": "fp8", "activations": "fp8", "kv": "fp8",
            "gen_len": 64}
    with_image = evaluate({**base, "prompt_len": 512, "images": 1, "image_size": "1024"})
    grown = evaluate({**base, "prompt_len": 512 + 1024})
    text = evaluate({**base, "prompt_len": 512})
    assert with_image["ttft_s"][0] > grown["ttft_s"][0] > text["ttft_s"][0]
    assert evaluate({**base, "prompt_len": 512, "images": 0})["ttft_s"][0] == text["ttft_s"][0]
