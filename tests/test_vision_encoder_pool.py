"""An encoder pool in the disaggregated layout (E:P:D, ``encoder_devices``): the vision encoder runs
on engines of its own, one request at a time, and sends the image embeddings to the prefill pool over
the P/D link. Checked against independent expectations: the TTFT over that of the text-only request
of as many prompt tokens is the M/D/1 queue's (Pollaczek-Khinchine wait of a constant service s,
lambda s^2 / 2(1 - rho), plus s), s the encoder's time on one request (a static batch's TTFT with
the images less the text-only one) plus the embeddings' transfer (bytes / link bandwidth); the
encoder devices count in the devices; bad values are refused in one line; the serving model agrees
with the simulator's encoder pool under load."""
import numpy as np
import pytest
from agreement import model_vs_simulator
from conftest import run_cli

from basis.errors import DseError
from dse import evaluate
from hwmodels.presets import load_device
from workloads.encoder import with_images
from workloads.model import load_model
from workloads.vision import request_image_tokens

QWEN = "qwen3-vl-8b-instruct"
IMAGES, SIZE, PROMPT, GEN = 2, 896, 256, 64
POOL = {"model": QWEN, "hardware": "h100-sxm", "prompt_len": PROMPT, "gen_len": GEN, "disaggregate": "1:1", "tp": 1}


def image_tokens() -> int:
    return request_image_tokens(with_images(load_model(QWEN), IMAGES, SIZE, SIZE).vision)


def ttft(point: dict) -> float:
    return float(np.asarray(evaluate(point)["ttft_s"])[0])


def test_the_encoder_pool_adds_its_m_d_1_queue_to_ttft():
    it = image_tokens()                                   # 2 x 784 tokens at 896 px (14 x 14 merged patches)
    img = {**POOL, "images": IMAGES, "image_size": str(SIZE)}
    text = {**POOL, "prompt_len": PROMPT + it}            # the same prefill, no encoder
    # s: the encoder on one request (static: with the images less without) + the embeddings' send
    static = {"model": QWEN, "hardware": "h100-sxm", "gen_len": GEN}
    encode = ttft({**static, "prompt_len": PROMPT, "images": IMAGES, "image_size": str(SIZE)}) \
        - ttft({**static, "prompt_len": PROMPT + it})
    link = load_device("h100-sxm").interconnect
    send = it * load_model(QWEN).hidden_size * 2 / link.bandwidth_bytes_per_s     # fp16 embeddings
    s = ttft({**img, "encoder_devices": 1, "request_rate": 1e-4}) - ttft({**text, "request_rate": 1e-4})
    assert s == pytest.approx(encode + send, rel=0.01)
    for e, x in ((1, 3.0), (1, 6.0), (2, 6.0)):
        lam = x / e
        wait = lam * s * s / (2 * (1 - lam * s))
        got = ttft({**img, "encoder_devices": e, "request_rate": x}) - ttft({**text, "request_rate": x})
        assert got == pytest.approx(s + wait, rel=1e-3)


def test_the_encoder_devices_count_and_take_the_encoder_off_the_prefill_pool():
    base = {**POOL, "images": 4, "image_size": "1344", "request_rate": 2.0, "slo_ttft": 2.0, "slo_tpot": 0.05}
    on = evaluate({**base, "encoder_devices": 1})
    off = evaluate(base)
    assert on["devices"][0] == 3 and off["devices"][0] == 2
    assert on["goodput_per_device"][0] == pytest.approx(on["goodput"][0] / 3)
    assert on["ttft_s"][0] < off["ttft_s"][0]              # the prefill pool no longer encodes


@pytest.mark.parametrize("cols, said", [
    ({"encoder_devices": 1}, "encoder_devices"),                                     # no images
    ({"encoder_devices": 1, "images": 1, "disaggregate": "none"}, "encoder_devices"),  # no pools
    ({"encoder_devices": -1, "images": 1}, "encoder_devices"),
    ({"encoder_devices": 1.5, "images": 1}, "encoder_devices"),
])
def test_bad_encoder_pools_are_refused_naming_the_column(cols, said):
    with pytest.raises(DseError, match=said):
        evaluate({**POOL, "request_rate": 1.0, **cols})


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "1e300", "abc"])
def test_cli_bad_encoder_devices_is_one_line_and_exit_2(value):
    r = run_cli("analyze", "--hardware", "h100-sxm", "--model", QWEN, "--images", "1", "--disaggregate", "1:1",
                "--request-rate", "1", "--encoder-devices", value)
    assert r.returncode == 2 and "encoder-devices" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.parametrize("encoders, rate", [(1, 4.0), (2, 4.0)])
def test_the_serving_model_agrees_with_the_simulator_on_an_encoder_pool(encoders, rate):
    """A VLM on E:P:D under an open loop (two 896 px images a request): throughput within 5 %, mean
    TTFT and TPOT within 10 % of the simulator's, whose encoder instances serve requests first come,
    first served before the prefill pool."""
    cols = {**POOL, "images": IMAGES, "image_size": str(SIZE), "encoder_devices": encoders, "request_rate": rate}
    x, ttft, tpot = model_vs_simulator(cols, 1000)
    assert abs(x) <= 0.05 and abs(ttft) <= 0.10 and abs(tpot) <= 0.10, f"{x:+.1%} / {ttft:+.1%} / {tpot:+.1%}"
