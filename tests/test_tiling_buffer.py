"""Designs that differ only in an on-chip buffer larger than FlashAttention's tiles fill share their
operator tables (``optable.full_tile_buffer``), and so one group of the evaluator.

FlashAttention's row block is Br = min(M / (4 d), d) for a buffer of M elements (Dao et al. 2022,
Algorithm 1): from 4 d^2 elements of the widest head on, every block is its head size and the
buffer no longer changes a table."""
from __future__ import annotations

import math

import numpy as np
import pytest

from dse.system.columns import Columns
from dse.system.evaluator import evaluate, prepare
from dse.system.hardware import assemble
from dse.system.inputs import workload_columns
from workloads import optable
from workloads.model import available_models, load_model
from workloads.scenario import Scenario

#: on-chip buffers of shipped presets, bytes: Apple's 32 KB threadgroup memory, 64 KiB LDS (MI300X),
#: 100 KiB (L40S), 164 KiB (A100), 228 KiB (H100) shared memory per SM, a NeuronCore's 24 MiB SBUF
PRESET_BUFFERS = (32768, 65536, 102400, 167936, 233472, 25165824)
FORMATS = (("fp8", "fp8"), ("bf16", "fp8"), ("bf16", "bf16"), ("fp32", "fp32"))


def _prefill(model, acts, kv, buffer):
    sc = Scenario.make(batch=2, prompt_len=3000, gen_len=8, weights="bf16", activations=acts, kv=kv, tp=1, pp=1,
                       ep=1, flash_attention=True)
    return optable.prefill(model, sc, buffer)


@pytest.mark.parametrize("name", available_models())
def test_the_tiles_read_only_the_listed_head_sizes(name, monkeypatch):
    """Every head size the prefill's FlashAttention tiles is one ``flash_head_sizes`` lists (what the
    saturation is worked out from)."""
    model = load_model(name)
    seen = set()
    real = optable._flash_row_blocks

    def recording(seq, head_dim, buffer_bytes, elem_bytes):
        seen.add(head_dim)
        return real(seq, head_dim, buffer_bytes, elem_bytes)
    monkeypatch.setattr(optable, "_flash_row_blocks", recording)
    _prefill(model, "bf16", "bf16", 65536.0)
    assert seen <= set(optable.flash_head_sizes(model))
    assert bool(seen) == (model.num_attention_layers > 0)


@pytest.mark.parametrize("name", available_models())
def test_a_buffer_past_full_tiles_changes_no_table(name):
    """The prefill built for each preset's buffer equals the one built for that buffer capped at
    ``full_tile_buffer``: operator by operator, every count."""
    model = load_model(name)
    for acts, kv in FORMATS:
        sc = Scenario.make(batch=1, prompt_len=1, gen_len=1, weights="bf16", activations=acts, kv=kv, tp=1, pp=1,
                           ep=1, flash_attention=True)
        full = optable.full_tile_buffer(model, max(sc.activations.bytes, sc.kv.bytes))
        for buffer in PRESET_BUFFERS:
            capped = min(buffer, float(full))
            assert _prefill(model, acts, kv, buffer).operators == _prefill(model, acts, kv, capped).operators, \
                (name, acts, kv, buffer)


def test_full_tiles_start_at_four_head_sizes_squared():
    """The closed form: a head of 128 in FP8 fills its row blocks from 4 x 128^2 = 65,536 bytes on
    (128 rows a block), not below (127 rows: one block more over 128 x 127 tokens)."""
    model = load_model("llama-3.1-8b")
    assert optable.flash_head_sizes(model) == (128,)
    full = float(optable.full_tile_buffer(model, 1.0))
    assert full == pytest.approx(65536.0, rel=1e-6)
    seq = 128 * 127
    assert optable._flash_row_blocks(seq, 128, full, 1.0) == 127
    assert optable._flash_row_blocks(seq, 128, 65535.0, 1.0) == math.ceil(seq / 127)
    mla = load_model("deepseek-v3")              # MLA's prefill tiles its decompressed heads: 128 + 64
    assert optable.flash_head_sizes(mla) == (192,)


def _mixed(n=60, seed=3):
    rng = np.random.default_rng(seed)
    return {"model": np.array(["llama-3.1-8b", "mistral-7b", "llama-3.1-70b"])[rng.integers(0, 3, n)],
            "hardware": np.array(["h100-sxm", "a100-80gb", "l40s", "h200"])[rng.integers(0, 4, n)],
            "batch": rng.integers(1, 65, n), "prompt_len": rng.integers(128, 4097, n),
            "gen_len": rng.integers(16, 513, n), "weights": "fp8", "activations": "fp8", "kv": "fp8", "tp": 8}


def test_gpus_whose_buffers_all_fill_the_tiles_share_groups():
    """In FP8, a head of 128 fills its tiles in 64 KiB: H100, A100, L40S and H200 (228, 164, 100 and
    228 KiB) share one group per model; in BF16 (128 KiB) L40S has its own."""
    cols = _mixed()
    assert len(prepare(cols).groups) == 3
    assert len(prepare({**cols, "activations": "bf16", "kv": "bf16"}).groups) == 6


def test_shared_groups_price_each_design_as_alone():
    """Every metric of a point priced in a table of other GPUs and models equals the point priced
    on its own (1e-9 relative)."""
    cols = _mixed(40)
    together = evaluate(cols)
    for i in range(0, 40, 3):
        alone = evaluate({k: (v[i:i + 1] if np.ndim(v) else v) for k, v in cols.items()})
        assert together["feasible"][i] == alone["feasible"][0]
        for k in ("ttft_s", "tpot_s", "output_tokens_per_s", "memory_bytes", "activation_bytes", "energy_per_token_j",
                  "cost_per_million_tokens_usd", "band_throughput_low"):
            assert together[k][i] == pytest.approx(alone[k][0], rel=1e-9, nan_ok=True), (i, k)


def test_a_drafted_point_keeps_its_devices_buffer():
    """A draft model is priced with the target's buffer, and its heads need not be the target's: a
    point with a draft keeps the device's whole buffer."""
    cols = {"model": "llama-3.1-70b", "hardware": "h100-sxm", "batch": 4, "prompt_len": 1024, "gen_len": 128,
            "weights": "fp8", "activations": "fp8", "kv": "fp8", "tp": 4}
    assert float(_buffer_of(cols)) == pytest.approx(65536.0, rel=1e-6)
    assert float(_buffer_of({**cols, "spec_draft": "llama-3.2-1b-instruct", "spec_tokens": 4})) == 233472.0


def _buffer_of(given: dict) -> float:
    cols = Columns(given)
    return workload_columns(cols, assemble(cols)).buffer[0]
