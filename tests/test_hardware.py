"""Hardware library: presets, links, offload tiers, pipeline parallelism, against hand calculations."""
from dataclasses import replace

import pytest
from conftest import run_cli

from basis.errors import DseError
from dse.system.analysis import analyze
from hwmodels.links import available_links, load_link
from hwmodels.placement import parse_policy
from hwmodels.presets import available_hardware, load_device
from workloads.footprint import parameter_count
from workloads.model import load_model
from workloads.scenario import Scenario


def test_every_preset_loads_with_sources():
    for name in available_hardware():
        d = load_device(name)
        assert d.sources and d.memory.capacity_bytes > 0 and d.memory.bandwidth_bytes_per_s > 0, name
        assert all(v > 0 for v in d.peak_ops_per_s.values()), name


def test_link_presets():
    assert {"nvlink3", "nvlink4", "nvlink5", "pcie3-x16", "pcie6-x16", "ib-hdr", "ib-ndr", "ib-xdr",
            "ethernet-400g"} <= set(available_links())
    assert load_link("pcie5-x16").bandwidth_bytes_per_s == 64e9
    with pytest.raises(DseError, match="valid links"):
        load_link("warp-drive")


def test_link_override_changes_all_reduce():
    m, d = load_model("llama-2-70b"), load_device("h100-sxm")
    d = replace(d, interconnect=replace(d.interconnect, latency_s=0.0))   # bandwidth alone (pcie4-x16 has none)
    sc = Scenario.make(batch=4, prompt_len=128, tp=4)
    slow = replace(d, interconnect=load_link("pcie4-x16"))
    t_fast = next(r for r in analyze(m, d, sc, ideal=True).prefill if r["name"] == "attn_all_reduce")["time_s"]
    t_slow = next(r for r in analyze(m, slow, sc, ideal=True).prefill if r["name"] == "attn_all_reduce")["time_s"]
    assert t_slow / t_fast == pytest.approx(450e9 / 32e9)


def _with_host(d):
    if d.host_memory is None:
        pytest.skip(f"{d.name} names no host memory")
    return d


def test_greedy_offload_decode_bounded_by_link():
    # Llama-2-70B FP16 on one H100: what does not fit in HBM streams over PCIe gen 5 every step
    m, d = load_model("llama-2-70b"), _with_host(load_device("h100-sxm"))
    sc = Scenario.make(batch=1, prompt_len=512, gen_len=16)
    s = analyze(m, d, sc, offload="greedy", ideal=True).summary
    assert s["fits"] is True
    total = s["weights_bytes"] + s["kv_cache_bytes"] + s["activation_bytes"]
    assert s["offloaded_bytes"] == pytest.approx(total - d.memory.capacity_bytes, rel=1e-9)
    link = min(d.host_link.bandwidth_bytes_per_s, d.host_memory.bandwidth_bytes_per_s)
    assert s["tpot_s"] >= s["offloaded_bytes"] / link
    # transfers that do not overlap compute add to it: the compute-bound prefill gets slower
    s2 = analyze(m, d, sc, offload="greedy", ideal=True, overlap=False).summary
    assert s2["ttft_s"] > s["ttft_s"] and s2["tpot_s"] >= s["tpot_s"]
    # without offload it does not fit, and says so
    assert analyze(m, d, sc).summary["fits"] is False


def test_host_memory_is_shared_by_the_devices_of_a_node():
    m, d = load_model("llama-3.1-405b"), _with_host(load_device("h100-sxm"))
    sc = Scenario.make(batch=1, prompt_len=128, tp=8)
    s = analyze(m, d, sc, offload="weights=1").summary
    assert s["offloaded_bytes"] * 8 > d.host_memory.capacity_bytes or s["fits"]
    tiny = replace(d, host_memory=replace(d.host_memory, capacity_bytes=s["offloaded_bytes"] * 4))
    s = analyze(m, tiny, sc, offload="weights=1").summary
    assert s["fits"] is False and "host" in s["why"]


def test_explicit_offload_fractions():
    m, d = load_model("llama-2-13b"), _with_host(load_device("h100-sxm"))
    s = analyze(m, d, Scenario.make(batch=2, prompt_len=256), offload=parse_policy("weights=0.5,kv=0.25")).summary
    assert s["offloaded_bytes"] == pytest.approx(0.5 * s["weights_bytes"] + 0.25 * s["kv_cache_bytes"])
    for bad in ("weights=2", "brains=0.5", "weights=abc", "sometimes"):
        with pytest.raises(DseError, match="offload"):
            parse_policy(bad)


def test_pipeline_parallel():
    m, d = load_model("llama-2-70b"), load_device("h100-sxm")
    one = analyze(m, d, Scenario.make(batch=8, prompt_len=512, tp=2), ideal=True).summary
    pp = analyze(m, d, Scenario.make(batch=8, prompt_len=512, tp=2, pp=2), ideal=True).summary
    assert pp["devices"] == 4
    # each stage holds half of the layers (plus the embedding or the head)
    layers = parameter_count(m, 2) - 2 * 32000 * 8192 / 2 - 8192
    assert pp["weights_bytes"] == pytest.approx((layers / 2 + 32000 * 8192 / 2) * 2, rel=1e-6)
    assert pp["kv_cache_bytes"] == pytest.approx(one["kv_cache_bytes"] / 2)
    # batch 8 in 2 micro-batches of 4: the pipeline adds its bubble to TTFT, not to a decode step of 4
    assert pp["ttft_s"] > 0 and pp["tpot_s"] < one["tpot_s"]
    with pytest.raises(DseError, match="pipeline parallelism 3 does not divide num_hidden_layers"):
        analyze(m, d, Scenario.make(pp=3))


def test_decode_at_batch1_memory_bound_on_every_gpu_preset():
    m = load_model("llama-2-7b")
    for name in available_hardware():
        d = load_device(name)
        if d.device_class != "gpu":
            continue
        res = analyze(m, d, Scenario.make(batch=1, prompt_len=512), ideal=True)
        bounds = {r["bound"] for r in res.decode if r["ops"] > 0}
        assert bounds == {"memory"}, (name, bounds)


def test_bandwidth_speeds_decode_linears_until_compute_bound():
    # the survey's Fig. 20: more bandwidth helps decode linear layers until they turn compute-bound
    m, d = load_model("llama-2-7b"), load_device("a100-80gb")
    sc = Scenario.make(batch=64, prompt_len=512)
    times, bounds = [], []
    for scale in (0.25, 0.5, 1, 2, 4, 8, 16):
        dd = replace(d, memory_tiers=(replace(d.memory, bandwidth_bytes_per_s=scale * d.memory.bandwidth_bytes_per_s),))
        row = next(r for r in analyze(m, dd, sc, ideal=True).decode if r["name"] == "gate_proj")
        times.append(row["time_s"])
        bounds.append(row["bound"])
    assert bounds[0] == "memory" and bounds[-1] == "compute"
    assert all(a >= b for a, b in zip(times, times[1:]))
    flat = [t for t, b in zip(times, bounds) if b == "compute"]
    assert max(flat) == pytest.approx(min(flat))


def test_cli_parallel_and_offload_errors():
    base = ["analyze", "--model", "llama-2-7b", "--hardware", "h100-sxm"]
    r = run_cli(*base, "--devices", "4", "--tp", "2", "--pp", "1")
    assert r.returncode == 2 and "--devices 4 must equal --tp 2 x --pp 1 x --ep 1" in r.stderr
    r = run_cli(*base, "--offload", "weights=7")
    assert r.returncode == 2 and "--offload" in r.stderr and "Traceback" not in r.stderr
    r = run_cli(*base, "--link", "nope", "--devices", "2")
    assert r.returncode == 2 and "link 'nope'" in r.stderr and "valid links" in r.stderr
    r = run_cli("list", "links")
    assert r.returncode == 0 and "nvlink4" in r.stdout


def test_weights_in_host_ddr_gpu_compute_wins_at_large_batch():
    # the survey's Fig. 18: with the weights in host DDR, computing on the CPU (DDR at its own
    # bandwidth) wins at small batch; streaming them to the GPU over PCIe wins once the batch is large
    m = load_model("llama-2-7b")
    gpu, cpu = _with_host(load_device("h100-sxm")), load_device("xeon-spr")

    def tpot(dev, batch, offload):
        sc = Scenario.make(batch=batch, prompt_len=512, gen_len=64, weights="bf16", activations="bf16", kv="bf16")
        return analyze(m, dev, sc, offload=offload, ideal=True).summary["tpot_s"]

    assert tpot(cpu, 1, "none") < tpot(gpu, 1, "weights=1")
    assert tpot(cpu, 256, "none") > tpot(gpu, 256, "weights=1")
