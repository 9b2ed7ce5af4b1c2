"""Vision-language models: image -> patches -> tokens by each family's processor rules, the vision
tower's parameters against the published counts, the encoder's operators against a closed-form
ViT count, TTFT with images, images 0 unchanged, bad values refused, and the serving model against
the simulator for a VLM under load."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from agreement import model_vs_simulator

from basis.errors import DseError
from dse import evaluate
from workloads.encoder import encoder_operators, prefill, with_images
from workloads.footprint import parameter_count
from workloads.model import load_model, spec_from_config
from workloads.optable import prefill as text_prefill
from workloads.scenario import Scenario
from workloads.vision import canvas, image_patches, image_tokens, parse_image_size, tiles, window_pairs
from workloads.vision import parameter_count as vision_parameters

pytestmark = pytest.mark.usefixtures("fixed_calibration")
ROOT = Path(__file__).resolve().parents[1]
QWEN = "qwen3-vl-8b-instruct"
GEMMA = "gemma-3-27b-it"
QWEN25 = "qwen2.5-vl-7b-instruct"
SCOUT = "llama-4-scout-17b-16e-instruct"


@pytest.mark.parametrize("h,w", [(1024, 1024), (768, 1024), (448, 640), (1024, 2048)])
def test_qwen_tokens_of_a_patch_aligned_image_are_the_closed_form(h, w):
    """Qwen3-VL: an image whose sides are multiples of patch x merge (32 px) inside the pixel bounds
    is not resized: (H / 16)(W / 16) patches, / 2^2 tokens (Qwen3-VL model card and processor)."""
    v = load_model(QWEN).vision
    assert image_patches(v, h, w) == (h // 16) * (w // 16)
    assert image_tokens(v, h, w) == (h // 16) * (w // 16) // 4


def test_qwen_resize_rounds_to_the_merge_grid_and_keeps_the_pixel_bounds():
    """smart_resize: 1000 x 1000 rounds to 992 x 992 (31 x 32 px); a 100 px image is scaled up to at
    least 65,536 pixels (256 x 256: 64 tokens); a 5000 px one down to at most 16,777,216."""
    v = load_model(QWEN).vision
    assert image_tokens(v, 1000, 1000) == (992 // 16) ** 2 // 4
    assert image_tokens(v, 100, 100) == 64
    assert image_patches(v, 5000, 5000) * 16 * 16 <= 16_777_216


def test_qwen25_tokens_and_windows_are_the_closed_form():
    """Qwen2.5-VL: sides rounded to multiples of 28 px (1024 -> 1036: 74 x 74 patches, 1,369 tokens);
    on a grid of whole 8 x 8-patch windows (1008 px: 72 x 72) a windowed block's query attends to
    its window's 64 patches."""
    v = load_model(QWEN25).vision
    assert image_tokens(v, 1024, 1024) == 74 * 74 // 4
    assert image_patches(v, 1008, 1008) == 72 * 72
    assert window_pairs(v, 1008, 1008) == 72 * 72 * 64


@pytest.mark.parametrize("rows,cols", [(1, 1), (2, 3), (4, 4), (1, 16), (3, 5)])
def test_llama4_an_image_of_whole_tiles_is_its_own_canvas(rows, cols):
    """Llama 4: an image of exactly rows x cols tiles of 336 px (rows x cols <= 16) fits its own
    canvas at scale 1, the least upscaling; tokens = (tiles + a global tile when there are several)
    x (336 / 14)^2 / 2^2 = 144 a tile (Llama4ImageProcessorFast, pixel_shuffle_ratio 0.5)."""
    v = load_model(SCOUT).vision
    n = rows * cols
    assert canvas(v, rows * 336, cols * 336) == (rows, cols)
    assert image_tokens(v, rows * 336, cols * 336) == (n + (n > 1)) * 144


def test_llama4_canvas_least_upscaling_then_smallest():
    """1024 x 1024: no canvas of <= 16 tiles holds it at scale 1; the least upscaling is 4 x 4 tiles
    (1344 / 1024); 100 x 2000 fits 1 x 6 (2016 px wide, the least upscaling); a 10,000 px image must
    shrink: the least downscaling is 4 x 4."""
    v = load_model(SCOUT).vision
    assert canvas(v, 1024, 1024) == (4, 4) and tiles(v, 1024, 1024) == 17
    assert canvas(v, 100, 2000) == (1, 6)
    assert canvas(v, 10_000, 10_000) == (4, 4)


@pytest.mark.parametrize("h,w", [(1024, 1024), (300, 2000)])
def test_gemma3_images_are_256_tokens_of_4096_patches(h, w):
    """Gemma 3: every image resized to 896 x 896, (896 / 14)^2 = 4096 patches pooled to 256 soft
    tokens (Gemma 3 Technical Report, arXiv 2503.19786, Sec. 2.1)."""
    v = load_model(GEMMA).vision
    assert image_patches(v, h, w) == 4096 and image_tokens(v, h, w) == 256


def test_published_parameter_counts():
    """Qwen3-VL-8B-Instruct, vision + text: 8.8 B (https://haimaker.ai/models/qwen/qwen3-vl-8b-instruct, the
    Hub's count; huggingface.co/Qwen/Qwen3-VL-8B-Instruct lists 8.77B params); Gemma 3 27B's SigLIP
    vision encoder: 417 M (Gemma 3 Technical Report, arXiv 2503.19786, Table 1), the projector apart."""
    q = load_model(QWEN)
    assert parameter_count(q) + vision_parameters(q.vision) == pytest.approx(8.8e9, rel=0.01)
    q25 = load_model(QWEN25)          # 8.29B params: huggingface.co/Qwen/Qwen2.5-VL-7B-Instruct (the Hub's count)
    assert parameter_count(q25) + vision_parameters(q25.vision) == pytest.approx(8.29e9, rel=0.01)
    scout = load_model(SCOUT)         # 109B total: the Llama 4 Scout model card (model table), vision included
    assert parameter_count(scout) + vision_parameters(scout.vision) == pytest.approx(109e9, rel=0.01)
    g = load_model(GEMMA).vision
    projector = g.hidden_size + g.hidden_size * g.out_hidden_size
    assert vision_parameters(g) - projector == pytest.approx(417e6, rel=0.01)


def test_encoder_flops_are_the_closed_form_vit_count():
    """The blocks' matmuls and attention: 2 x block matmul params x patches + 4 x patches^2 x hidden,
    per block, per image (a ViT's count), for two requests of three 1024 x 1024 images."""
    m = with_images(load_model(QWEN), 3, 1024, 1024)
    v = m.vision
    ops = encoder_operators(v, Scenario.make(batch=2, prompt_len=8, gen_len=1, flash_attention=True), 50e6)
    p, h, i = 4096, v.hidden_size, v.intermediate_size
    blocks = [o for o in ops if o.count == v.depth and o.kind in ("matmul", "attention")]
    got = sum(o.count * o.ops for o in blocks) - sum(o.count * 5 * 2 * 3 * v.num_heads * p * p
                                                        for o in blocks if o.kind == "attention")
    closed = 2 * 3 * v.depth * (2 * (4 * h * h + 2 * h * i) * p + 4 * p * p * h)
    assert got == pytest.approx(closed, rel=1e-12)


def test_qwen25_encoder_flops_with_windows_are_the_closed_form():
    """Qwen2.5-VL at 1008 x 1008 (5,184 patches): 2 x the block's matmul params (a gated MLP: 3 h i)
    x patches, plus 4 h x pairs: P^2 in its 4 full blocks, P x 64 in its 28 windowed ones."""
    v = with_images(load_model(QWEN25), 1, 1008, 1008).vision
    ops = encoder_operators(v, Scenario.make(batch=1, prompt_len=8, gen_len=1, flash_attention=True), 50e6)
    p, h, i = 72 * 72, v.hidden_size, v.intermediate_size
    blocks = [o for o in ops if o.count in (v.depth, 4, 28) and o.kind in ("matmul", "attention")]
    softmax = sum(o.count * 5 * v.num_heads * (p * p if o.count == 4 else p * 64) for o in blocks
                  if o.kind == "attention")
    closed = 2 * v.depth * (4 * h * h + 3 * h * i) * p + 4 * h * (4 * p * p + 28 * p * 64)
    assert sum(o.count * o.ops for o in blocks) - softmax == pytest.approx(closed, rel=1e-12)


def test_llama4_encoder_flops_per_tile_are_the_closed_form():
    """Llama 4 at 1024 x 1024 (17 tiles, each 576 patches and a class token): 2 x the block's matmul
    params x 577 + 4 x 577^2 x hidden, per block and tile."""
    v = with_images(load_model(SCOUT), 1, 1024, 1024).vision
    ops = encoder_operators(v, Scenario.make(batch=1, prompt_len=8, gen_len=1, flash_attention=True), 50e6)
    p, h, i = 577, v.hidden_size, v.intermediate_size
    blocks = [o for o in ops if o.count == v.depth and o.kind in ("matmul", "attention")]
    softmax = sum(o.count * 5 * 17 * v.num_heads * p * p for o in blocks if o.kind == "attention")
    closed = 17 * v.depth * (2 * (4 * h * h + 2 * h * i) * p + 4 * p * p * h)
    assert sum(o.count * o.ops for o in blocks) - softmax == pytest.approx(closed, rel=1e-12)


def test_images_zero_leaves_every_table_and_metric_unchanged():
    """images 0 (or left out) prices the text decoder alone: the same prefill table as the text
    model's and the same metrics, bit for bit."""
    m = load_model(QWEN)
    sc = Scenario.make(batch=4, prompt_len=300, gen_len=10, flash_attention=True)
    assert prefill(m, sc, 50e6) == text_prefill(m, sc, 50e6)
    base = {"hardware": "h100-sxm", "prompt_len": 700, "gen_len": 64, "batch": 4}
    for model in (QWEN, QWEN25, GEMMA, "llama-3.1-8b"):
        a, b = evaluate({**base, "model": model}), evaluate({**base, "model": model, "images": 0})
        for k in ("ttft_s", "tpot_s", "weights_bytes", "kv_cache_bytes"):
            assert np.array_equal(a[k], b[k]), (model, k)


@pytest.mark.parametrize("layer", ["fitted", "learned"])
def test_ttft_grows_by_the_encoder_and_the_image_tokens(layer):
    """One 1024 x 1024 image: the prompt grows by its 1,024 tokens, and TTFT by more than that
    longer prompt's: by at least the encoder's FLOPs at the H100's dense fp16 peak (989.4 TFLOP/s,
    NVIDIA H100 datasheet), a roofline lower bound, and at most at a tenth of it (the encoder's
    GEMMs and attention are large: 4,096 rows, 16 heads of 4,096 keys), with either kernel layer."""
    base = {"hardware": "h100-sxm", "model": QWEN, "gen_len": 64, "kernel_layer": layer}
    img = evaluate({**base, "prompt_len": 512, "images": 1, "image_size": "1024"})
    txt = evaluate({**base, "prompt_len": 512 + 1024})
    v = load_model(QWEN).vision
    p, h, i = 4096, v.hidden_size, v.intermediate_size
    flops = v.depth * (2 * (4 * h * h + 2 * h * i) * p + 4 * p * p * h)
    assert img["kv_cache_bytes"][0] == txt["kv_cache_bytes"][0]
    assert flops / 989.4e12 <= img["ttft_s"][0] - txt["ttft_s"][0] <= flops / 98.94e12
    assert img["tpot_s"][0] == pytest.approx(txt["tpot_s"][0], rel=0.02)


@pytest.mark.parametrize("cols,said", [
    ({"images": -1}, "images"), ({"images": 1, "image_size": "big"}, "image_size"),
    ({"images": 1, "image_size": "10x5000"}, "image_size"), ({"images": 1, "model": "llama-3.1-8b"}, "vision tower"),
    ({"images": 1.5}, "images"), ({"images": 1, "cpu_layers": 4}, "cpu_layers"),
])
def test_bad_values_are_refused_naming_the_column(cols, said):
    with pytest.raises(DseError, match=said):
        evaluate({"hardware": "h100-sxm", "model": QWEN, **cols})


def test_image_size_forms():
    assert parse_image_size("1024") == (1024, 1024) == parse_image_size(1024)
    assert parse_image_size("768x1024") == (768, 1024)


def test_cli_bad_image_size_is_one_line_and_exit_2():
    r = subprocess.run([sys.executable, "-m", "dse.study", "analyze", "--hardware", "h100-sxm", "--model", QWEN,
                        "--images", "1", "--image-size", "huge"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and "image-size" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("model,load", [(QWEN, {"concurrency": 16}), (QWEN, {"request_rate": 4.0}),
                                        (QWEN25, {"concurrency": 64}), (QWEN25, {"request_rate": 4.0}),
                                        (SCOUT, {"concurrency": 32, "hardware": "h200", "tp": 4})])
def test_the_serving_model_agrees_with_the_simulator_for_a_vlm(model, load):
    """A VLM under load (one 1024 x 1024 image a request): throughput within 5 %, mean TTFT and TPOT
    within 10 % of the simulator's (both price the encoder once per request, in the iteration that
    finishes its prompt)."""
    cols = {"hardware": "h100-sxm", "model": model, "prompt_len": 256, "gen_len": 128, "images": 1,
            "image_size": "1024", **load}
    x, ttft, tpot = model_vs_simulator(cols, 1000)
    assert abs(x) <= 0.05 and abs(ttft) <= 0.10 and abs(tpot) <= 0.10, f"{x:+.1%} / {ttft:+.1%} / {tpot:+.1%}"


def test_images_with_a_trace_of_lengths_are_refused(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("prompt_len,gen_len\n100,20\n300,40\n")
    with pytest.raises(DseError, match="trace"):
        evaluate({"hardware": "h100-sxm", "model": QWEN, "images": 1, "lengths": str(trace), "concurrency": 4})


VISION = {"depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16, "out_hidden_size": 4096,
          "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2, "num_position_embeddings": 2304,
          "deepstack_visual_indexes": [8, 16, 24]}


@pytest.mark.parametrize("change,said", [
    ({"depth": 0}, "vision_config.depth"), ({"out_hidden_size": 1024}, "vision_config.out_hidden_size"),
    ({"num_heads": 7}, "vision_config.hidden_size"), ({"deepstack_visual_indexes": 3}, "deepstack"),
    (None, "vision_config"),
])
def test_a_bad_vision_config_is_one_line_naming_the_key(change, said):
    cfg = json.loads((ROOT / "configs" / "models" / f"{QWEN}.json").read_text())
    if change is None:
        del cfg["vision_config"]
    else:
        cfg["vision_config"] = {**VISION, **change}
    with pytest.raises(DseError, match=said) as e:
        spec_from_config(cfg, "x", "cfg.json")
    assert "\n" not in str(e.value) and str(e.value).startswith("cfg.json: ")
