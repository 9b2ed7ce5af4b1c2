"""SambaNova SN40L across sockets: the inter-RDU link has no cited bandwidth or latency
(configs/hardware/sn40l.yaml says what was searched), so a run over more than one socket is refused
with that precise reason, never priced over an invented link; one socket runs as dataflow from its
HBM (Hot Chips 2024: 1.6 TB/s per socket, 25.6 TB/s per 16)."""
import numpy as np
from conftest import run_cli

from dse import evaluate
from hwmodels.presets import load_device

LLAMA_31_8B_PARAMS = 8.03e9          # Meta's model card
HBM_PER_SOCKET = 25.6e12 / 16        # B/s


def _point(devices):
    return {"hardware": ["sn40l"] * len(devices), "model": "llama-3.1-8b", "weights": "bf16",
            "activations": "bf16", "kv": "bf16", "batch": [1] * len(devices), "prompt_len": 512,
            "gen_len": 256, "devices": list(devices)}


def test_sn40l_has_no_cited_socket_link():
    assert load_device("sn40l").interconnect is None


def test_more_than_one_socket_is_refused_as_no_interconnect():
    ev = evaluate(_point([1, 2, 16]))
    assert list(ev["feasible"]) == [True, False, False]
    assert [ev.reason_key(i) for i in (1, 2)] == ["interconnect", "interconnect"]
    assert np.all(np.isnan(np.asarray(ev["output_tokens_per_s"])[1:]))
    r = run_cli("analyze", "--model", "llama-3.1-8b", "--hardware", "sn40l", "--devices", "2")
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert "'sn40l' has no interconnect" in r.stderr


def test_one_socket_streams_its_weights_from_hbm():
    """Batch-1 decode on one socket reads the 16-bit weights once a token: no faster than the HBM
    peak, and, with no launch or engine cost on a dataflow machine, within 25 % of that stream."""
    tpot = float(evaluate(_point([1]))["tpot_s"][0])
    stream = 2 * LLAMA_31_8B_PARAMS / HBM_PER_SOCKET
    assert stream <= tpot <= 1.25 * stream
