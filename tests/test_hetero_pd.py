"""Disaggregated pools on different hardware (decode_hardware, pd_link): the decode pool's memory,
peaks, price and power are its own preset's; the KV cache crosses the pd link. Closed forms, a
Splitwise-style finding (Patel et al., "Splitwise: Efficient Generative LLM Inference Using Phase
Splitting", ISCA 2024, arXiv 2311.18677), and one-line refusals."""
from __future__ import annotations

import numpy as np
import pytest
from agreement import model_vs_simulator

from basis.errors import DseError
from dse import evaluate
from dse.study.cli import main
from hwmodels.links import load_link
from hwmodels.presets import load_device

#: Llama-2-70B (one of Splitwise's two models) on 8:8 pools of TP-8 engines, Splitwise's conversation
#: trace's median-like request (1,024-token prompt, 128 generated: its Table 'Conversation' row, rounded)
BASE = {"model": "llama-2-70b", "hardware": "h100-sxm", "weights": "fp16", "activations": "fp16", "kv": "fp16",
        "prompt_len": 1024, "gen_len": 128, "tp": 8, "disaggregate": "8:8", "slo_ttft": 1.0, "slo_tpot": 0.05,
        "request_rate": 2.0}


def _rows(**cols):
    n = max(len(v) for v in cols.values() if isinstance(v, list))
    return evaluate({**BASE, **{k: (np.array(v, dtype=object if isinstance(v[0], str) else float)
                                    if isinstance(v, list) else v) for k, v in cols.items()}}), n


def test_same_hardware_named_is_today():
    """Naming the point's own hardware as the decode pool's changes nothing (the same physics)."""
    ev, _ = _rows(decode_hardware=["same", "h100-sxm"])
    for k in ("goodput", "ttft_s", "tpot_s", "requests_per_s", "cost_usd"):
        assert ev[k][0] == ev[k][1]


def test_price_and_tdp_sum_both_pools():
    """H100 SXM prefill feeding a Gaudi 3 decode pool: its price and TDP are 8 of each preset's."""
    ev, _ = _rows(decode_hardware=["gaudi3"], pd_link="ib-ndr", weights="fp8", activations="fp8", kv="fp8")
    h, g = load_device("h100-sxm"), load_device("gaudi3")
    assert ev.feasible[0]
    assert ev["cost_usd"][0] == pytest.approx(8 * h.price_usd + 8 * g.price_usd)
    assert ev["system_tdp_w"][0] == pytest.approx(8 * h.tdp_w + 8 * g.tdp_w)


def test_kv_link_default_is_the_slower_nic():
    """H100 -> B200: both topologies cite 400G NDR NICs (configs/topologies.yaml), so the default link
    is ib-ndr, and naming it gives the same figures; a slower pd_link (100G Ethernet) lengthens TPOT
    (the KV transfer sits between the first token and the rest)."""
    ev, _ = _rows(decode_hardware=["b200", "b200", "b200"], pd_link=["default", "ib-ndr", "ethernet-100g"])
    assert ev["tpot_s"][0] == ev["tpot_s"][1]
    assert ev["tpot_s"][2] > ev["tpot_s"][1]
    # the transfer's share: 1,024 prompt tokens of KV per device over the link, spread over 127 later tokens
    assert load_link("ethernet-100g").bandwidth_bytes_per_s < load_link("ib-ndr").bandwidth_bytes_per_s


def test_decode_pool_uses_its_own_memory():
    """A decode pool on the MI355X (288 GiB) at TP 1 holds the 70B model in FP16 (140 GB) where an H100
    (80 GiB) at TP 1 cannot: its KV blocks come from its own memory."""
    ev, _ = _rows(decode_hardware=["mi355x", "same"], decode_tp=[1, 1], pd_link="ib-ndr")
    assert ev.feasible[0]
    assert not ev.feasible[1] and ev.reason_key(1) == "device_memory"


def test_splitwise_token_machines_on_the_older_gpu():
    """Splitwise (Sec. 3 and Table 'H100 vs A100': 3.43x compute, 1.64x bandwidth, 1.75x power): token
    generation is memory-bound and does not need the newest GPU; H100 prompt machines with A100 token
    machines (Splitwise-HA) reach up to 1.4x throughput at 20 % lower cost, or 2.35x throughput at the
    same power and cost (abstract). Here H100 prefill + A100 decode serves the same goodput as all-H100
    on 21 % less provisioned power (TDP): 1.1-2.35x the goodput per watt; the reverse split (A100 prefill,
    H100 decode) serves less, per watt, than the Splitwise split: prefill wants the compute."""
    ev, _ = _rows(hardware=["h100-sxm", "h100-sxm", "a100-80gb"], decode_hardware=["same", "a100-80gb", "h100-sxm"],
                  pd_link="ib-ndr")
    assert ev.feasible.all()
    per_watt = ev["goodput"] / ev["system_tdp_w"]
    assert ev["goodput"][1] >= 0.95 * ev["goodput"][0]
    assert 1.1 <= per_watt[1] / per_watt[0] <= 2.35
    assert per_watt[2] < per_watt[1]


def test_no_link_known_is_refused():
    """H100 -> A100 without pd_link: the A100 platform cites no scale-out NIC, so the KV cache has no
    known link (reason interconnect, naming pd_link); a GH200 decode engine of 8 devices has no cited
    scale-up link (interconnect)."""
    ev, _ = _rows(decode_hardware=["a100-80gb", "gh200"], pd_link=["default", "ib-ndr"])
    assert ev.reason_key(0) == "interconnect" and "pd_link" in ev.reason_text(0)
    assert ev.reason_key(1) == "interconnect"


def test_decode_hardware_needs_pools():
    ev = evaluate({**BASE, "disaggregate": "none", "decode_hardware": "b200"})
    assert ev.reason_key(0) == "layout" and "disaggregate" in ev.reason_text(0)


@pytest.mark.parametrize("bad", ["abc", "", "1e300", "nan"])
def test_unknown_decode_hardware_one_line(bad):
    with pytest.raises(DseError) as e:
        evaluate({**BASE, "decode_hardware": bad})
    assert "decode_hardware" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("flag, value", [("--decode-hardware", "abc"), ("--pd-link", "abc"), ("--pd-link", "0")])
def test_cli_refuses_in_one_line(flag, value, capsys):
    code = main(["analyze", "--model", "llama-2-70b", "--hardware", "h100-sxm", "--disaggregate", "8:8", "--tp", "8",
                 "--request-rate", "1", flag, value])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.slow
def test_model_agrees_with_the_simulator_across_hardware():
    """H100 SXM prefill feeding an A100 decode engine over 400G NDR (Llama-3.1-8B, 1:1, open loop):
    the steady-state model against the discrete-event simulator of the same pools, each pool's
    iterations priced on its own hardware: throughput within 5 %, mean TTFT and TPOT within 10 %."""
    point = {"model": "llama-3.1-8b", "hardware": "h100-sxm", "disaggregate": "1:1", "decode_hardware": "a100-80gb",
             "pd_link": "ib-ndr", "request_rate": 10.0, "prompt_len": 1000, "gen_len": 200}
    x, ttft, tpot = model_vs_simulator(point, 1500)
    assert abs(x) <= 0.05 and abs(ttft) <= 0.10 and abs(tpot) <= 0.10, (x, ttft, tpot)
