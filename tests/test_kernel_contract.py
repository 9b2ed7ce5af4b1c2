"""The kernel's contract: its speed layer (``dse.core.kernel_fast``) and its per-operator reference
(``dse.core.operator_cost``) give the same answers. Random design points over every hardware preset,
every technique and every serving mode are evaluated (``dse.evaluate``) once with the reference
forced (``dse.core.roofline.reference_kernel``) and once without; every metric agrees to 1e-12
relative, and so do feasibility, the reason and every violation. Seeds are explicit."""
import numpy as np
import pytest

from basis.errors import DseError
from dse import evaluate
from dse.core import kernel_fast, roofline
from dse.core.roofline import KERNEL_VARIABLE, kernel_in_use, reference_kernel
from hwmodels.presets import available_hardware, load_device

PRESETS = available_hardware()
#: a Llama-2-7B pruned as Sheared-LLaMA-1.3B is (Xia et al., arXiv 2310.06694)
SHEARED = "layers=24,hidden=2048,heads=16,intermediate=5504"


def _pick(rng, values, n):
    return np.array([values[i] for i in rng.integers(0, len(values), n)], dtype=object)


def _every_preset(rng, n_each=3):
    """Every shipped preset, a few points each: models, formats, FlashAttention, 2:4 sparse peaks,
    offload and parallel layouts (spatial presets' chip layouts sized from capacity or given)."""
    n = len(PRESETS) * n_each
    hw = np.repeat(np.array(PRESETS, dtype=object), n_each)
    spatial = np.array([load_device(h).device_class == "spatial" for h in hw])
    tp = np.where(rng.random(n) < 0.5, rng.choice([1.0, 2.0, 4.0], n), np.nan)
    pp = np.where(np.isfinite(tp), rng.choice([1.0, 2.0], n), np.nan)
    return {"hardware": hw, "model": _pick(rng, ["llama-2-7b", "mixtral-8x7b", "llama-3.1-8b", "gpt-j-6b"], n),
            "batch": rng.choice([1, 4, 16, 64], n), "prompt_len": rng.integers(16, 2048, n),
            "gen_len": rng.integers(1, 256, n), "weights": _pick(rng, ["fp16", "fp8", "int8", "int4", "int4-g128"], n),
            "kv": _pick(rng, ["fp16", "fp8"], n), "flash_attention": rng.random(n) < 0.5,
            "sparse": (rng.random(n) < 0.3) & ~spatial,
            "offload": np.where(spatial, "none", _pick(rng, ["none", "none", "greedy", "weights=0.5,kv=0.2"], n)),
            "tp": tp, "pp": pp}


def _template_sweep(rng, n=400):
    """A GPU template's figures swept with a few batches and lengths (each workload shared by a
    dozen points: priced with its row of the workloads' tables), tensor parallel over NVLink."""
    return {"hardware": "h100-sxm", "model": "llama-2-13b", "weights": "fp8", "activations": "fp8", "kv": "fp8",
            "batch": rng.choice([1, 16, 128], n), "prompt_len": rng.choice([128, 512, 2048], n),
            "gen_len": rng.choice([16, 256], n), "devices": rng.choice([1, 2], n),
            "memory_bandwidth": rng.uniform(1e12, 1.6e13, n), "memory_capacity": rng.uniform(4e10, 4e11, n),
            "peak_fp8": rng.uniform(2.5e14, 1e16, n), "link_bandwidth": rng.uniform(5e10, 1e12, n)}


def _own_workloads(rng, n=200):
    """Nearly every point its own batch and lengths (priced as [points, operators] arrays)."""
    return {"hardware": _pick(rng, ["h100-sxm", "a100-80gb"], n), "model": "llama-2-7b", "weights": "fp8",
            "batch": rng.integers(1, 257, n), "prompt_len": rng.integers(16, 4096, n), "gen_len": rng.integers(1, 512, n),
            "memory_bandwidth": rng.uniform(1e12, 1.6e13, n), "devices": rng.choice([1, 2], n)}


def _one_workload(rng, n=200):
    """One workload on many designs (one operator table for all of them), pipeline and expert
    parallel (point-to-point hops and all-to-alls)."""
    return {"hardware": _pick(rng, ["h100-sxm", "a100-80gb", "mi300x", "b200"], n), "model": "mixtral-8x7b",
            "batch": 32, "prompt_len": 1024, "gen_len": 128, "devices": 8, "pp": 2, "ep": 2,
            "memory_bandwidth": rng.uniform(1e12, 8e12, n), "compute_scale": rng.uniform(0.5, 3, n)}


def _techniques(rng, n=60):
    """Unstructured density, contextual sparsity, early exit and a KV budget at once."""
    return {"hardware": _pick(rng, ["h100-sxm", "a100-80gb", "l40s"], n), "model": "llama-2-7b",
            "batch": rng.choice([1, 8, 64], n), "prompt_len": rng.integers(64, 4000, n), "gen_len": rng.integers(1, 96, n),
            "weight_density": rng.uniform(0.3, 1.0, n), "activation_sparsity": rng.uniform(0.3, 1.0, n),
            "layers_used": rng.uniform(0.5, 1.0, n), "kv_budget": rng.choice([0, 256, 1024], n)}


def _sparsity_prune_edges(rng, n=40):
    """N:M sparsity at the devices' 2:4 peaks, a structured-pruned model, INT4 weights with
    wider first and last layers."""
    return {"hardware": _pick(rng, ["h100-sxm", "a100-80gb", "b200", "mi300x"], n), "model": "llama-2-7b",
            "batch": rng.choice([1, 16, 128], n), "prompt_len": 512, "gen_len": 64, "weights": "int4",
            "sparsity": _pick(rng, ["none", "2:4"], n), "prune": _pick(rng, ["none", SHEARED], n),
            "weights_edge": _pick(rng, ["none", "int8", "fp16"], n)}


def _speculative(rng, n=40):
    """Speculative decoding: a draft model, self-speculation, Medusa heads."""
    return {"hardware": "h100-sxm", "model": "llama-3.1-8b", "prompt_len": rng.choice([256, 1024], n),
            "gen_len": 128, "batch": rng.choice([1, 4, 64], n),
            "spec_draft": _pick(rng, ["none", "llama-3.2-1b-instruct", "self:8", "medusa:2"], n),
            "spec_tokens": rng.choice([2, 4], n), "spec_acceptance": rng.uniform(0.3, 0.95, n)}


def _offload(rng, n=40):
    """Weights, activations and KV in host memory over PCIe or C2C, overlapped with compute or not,
    and CPU presets computing next to their DDR."""
    return {"hardware": _pick(rng, ["a100-80gb", "h100-sxm", "gh200", "xeon-spr", "epyc-genoa"], n),
            "model": "llama-2-70b", "batch": rng.choice([1, 8, 64], n), "prompt_len": 512, "gen_len": 64,
            "offload": _pick(rng, ["greedy", "weights=0.5,kv=0.2", "weights=1.0"], n), "overlap": rng.random(n) < 0.5}


def _cpu_layers(rng, n=24):
    """Layers on the host CPU beside the GPU's (a hop each way per step)."""
    return {"hardware": _pick(rng, ["l40s", "rtx-4090"], n), "model": "llama-2-7b", "host_cpu": "xeon-spr",
            "cpu_layers": rng.integers(0, 9, n), "batch": rng.choice([1, 4], n), "prompt_len": 128, "gen_len": 32}


def _pim(rng, n=60):
    """PIM presets, blocked and concurrent, their internal multiple swept, one device or eight."""
    return {"hardware": _pick(rng, ["attacc", "hbm-pim", "gddr6-aim"], n), "model": "llama-2-7b",
            "kv": _pick(rng, ["fp16", "fp8"], n), "devices": rng.choice([1, 8], n), "batch": rng.choice([1, 16, 256], n),
            "prompt_len": rng.choice([256, 2048], n), "gen_len": 128, "pim_multiple": rng.uniform(2.0, 16.0, n)}


def _spatial(rng, n=40):
    """Spatial chips (SRAM only): layouts given, and sized from capacity."""
    return {"hardware": _pick(rng, ["groq-lpu", "cerebras-wse3", "sn40l", "tenstorrent-n300"], n),
            "model": "llama-2-7b", "weights": "int8", "activations": "int8", "kv": "int8",
            "tp": rng.choice([1.0, 8.0, np.nan], n), "pp": rng.choice([1.0, 4.0, np.nan], n),
            "batch": rng.choice([1, 8], n), "prompt_len": 512, "gen_len": 64}


def _continuous(rng, n=30):
    """In-flight batching under a closed loop (concurrency) or an open one (request rate),
    lognormal lengths and a shared prefix."""
    closed = rng.random(n) < 0.5
    return {"hardware": _pick(rng, ["h100-sxm", "mi300x", "l40s"], n), "model": "llama-3.1-8b", "weights": "fp8",
            "kv": "fp8", "prompt_len": 1024, "gen_len": 256, "serving": "continuous",
            "concurrency": np.where(closed, rng.choice([1, 16, 256, 2048], n), 0),
            "request_rate": np.where(closed, 0.0, rng.uniform(0.5, 40.0, n)), "prefix_hit": rng.choice([0.0, 0.5], n)}


def _lognormal(rng, n=6):
    return {"hardware": "h100-sxm", "model": "llama-3.1-8b", "weights": "fp8", "prompt_len": 1024, "gen_len": 256,
            "serving": "continuous", "request_rate": rng.uniform(1.0, 20.0, n), "lengths": "lognormal"}


def _goodput(rng, n=8):
    """Goodput under SLOs, colocated or disaggregated prefill and decode pools."""
    return {"hardware": "h100-sxm", "model": "llama-3.1-70b", "weights": "fp8", "activations": "fp8", "kv": "fp8",
            "tp": 2, "prompt_len": rng.choice([512, 4096], n), "gen_len": 256,
            "disaggregate": _pick(rng, ["none", "2:2", "2:4", "4:2"], n), "slo_ttft": rng.choice([0.45, 2.0], n),
            "slo_tpot": rng.choice([0.04, 0.2], n), "slo_percentile": 99.0}


FAMILIES = {f.__name__.lstrip("_"): f for f in (_every_preset, _template_sweep, _own_workloads, _one_workload,
                                                   _techniques, _sparsity_prune_edges, _speculative, _offload, _cpu_layers, _pim,
                                                   _spatial, _continuous, _lognormal, _goodput)}


def _assert_same(fast, ref):
    assert fast.metrics.keys() == ref.metrics.keys()
    for k in ref.metrics:
        a, b = np.asarray(fast[k]), np.asarray(ref[k])
        if a.dtype.kind in "fc":
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=0, equal_nan=True, err_msg=k)
        else:
            np.testing.assert_array_equal(a, b, err_msg=k)
    np.testing.assert_array_equal(fast.feasible, ref.feasible)
    assert [fast.reason_keys[c] for c in fast.reason] == [ref.reason_keys[c] for c in ref.reason]
    assert fast.violations.keys() == ref.violations.keys()
    for k in ref.violations:
        np.testing.assert_allclose(fast.violations[k], ref.violations[k], rtol=1e-12, atol=0, equal_nan=True, err_msg=k)


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("seed", [11, 12])
def test_speed_layer_equals_reference(family, seed):
    columns = FAMILIES[family](np.random.default_rng(seed))
    fast = evaluate(columns)
    with reference_kernel():
        ref = evaluate(columns)
    assert len(ref) > 0
    _assert_same(fast, ref)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_speed_layer_equals_reference_on_the_learned_kernel_layer(family):
    # kernel_layer=learned: a GPU's matmuls and attention at the kernel model's fractions of their
    # shapes on each point's hardware; both paths read the same fractions
    columns = {**FAMILIES[family](np.random.default_rng(11)), "kernel_layer": "learned"}
    fast = evaluate(columns)
    with reference_kernel():
        ref = evaluate(columns)
    _assert_same(fast, ref)


def test_ideal_roofline_and_explained_operators_agree():
    # the ideal bound (efficiency 1, no overheads: ties between compute and memory are common)
    # and the per-operator tables of explain
    columns = _every_preset(np.random.default_rng(3), 1)
    fast = evaluate(columns, ideal=True, explain=[0, 5, 17])
    with reference_kernel():
        ref = evaluate(columns, ideal=True, explain=[0, 5, 17])
    _assert_same(fast, ref)


def test_the_reference_is_forced_by_the_environment_or_a_block(monkeypatch):
    monkeypatch.delenv(KERNEL_VARIABLE, raising=False)
    assert kernel_in_use() == "fast"
    with reference_kernel():
        assert kernel_in_use() == "reference"
    assert kernel_in_use() == "fast"
    monkeypatch.setenv(KERNEL_VARIABLE, "reference")
    assert kernel_in_use() == "reference"
    columns = _template_sweep(np.random.default_rng(1), 20)

    def refused(*args, **kwargs):
        raise AssertionError("the speed layer ran under DSE_KERNEL=reference")
    for name in ("step_time", "decode_total_time", "step_energy_j", "decode_total_energy_j", "step_work",
                 "decode_total_work", "energy_j"):
        monkeypatch.setattr(kernel_fast, name, refused)
    assert evaluate(columns).feasible.any()                   # every entry ran the reference
    monkeypatch.setenv(KERNEL_VARIABLE, "fastest")
    with pytest.raises(DseError, match=KERNEL_VARIABLE):
        roofline.kernel_in_use()
