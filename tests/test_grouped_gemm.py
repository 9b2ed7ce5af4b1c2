"""The experts of a mixture priced as grouped GEMMs (``dse.core.kernel_model.grouped_gemm_time``):
each expert a rank runs is one group of the tokens routed to it, every group's weights read once,
so that as tokens per expert shrink an expert matmul's time per token rises toward one whole
weight read per token; checked against the law's closed form and against NVIDIA's measured MoE
tables (aiconfigurator)."""
import numpy as np
import pytest

from dse import evaluate
from dse.core.efficiency import Efficiency, KernelHardware, kernel_fractions
from dse.core.kernel_arrays import _COL, OpArrays
from dse.core.kernel_model import (
    GEMM_FORMATS,
    OUT_BYTES,
    grouped_gemm_time,
    grouped_parameters,
    hardware_of,
    load_kernel_model,
)
from hwmodels.formats import COMPUTE_CLASSES
from workloads.optable import expected_experts_touched

#: H100 SXM as the evaluator sees it (configs/hardware/h100-sxm.yaml's dense BF16/FP8 peaks and
#: bandwidth; SMs and L2 from configs/kernel_model.yaml hardware.h100_sxm)
H100 = hardware_of(989.5e12, 1979e12, 1979e12, 3.35e12, sms=132, l2_bytes=52428800)
BARE = Efficiency(name="bare", op_overhead_s=0.0, step_overhead_s=0.0)
#: Qwen3-30B-A3B (configs/models/qwen3-30b-a3b.json): hidden 2048, expert MLP 768, 128 experts, top-8
HIDDEN, EXPERT, EXPERTS, TOP_K = 2048, 768, 128, 8
EXPERT_OPS = ("expert_gate_proj", "expert_up_proj", "expert_down_proj", "expert_act_fn")


def _decode_rows(**columns) -> list[dict]:
    """Each point's decode-step explain rows (by name) on the learned kernel layer, no engine costs."""
    n = max(len(np.atleast_1d(v)) for v in columns.values())
    point = {"prompt_len": 128, "gen_len": 2, "kernel_layer": "learned", **columns}
    ev = evaluate(point, efficiency=BARE, explain=list(range(n)))
    return [{r["name"]: r for r in ev.explained[j]["decode"]} for j in range(n)]


def test_the_law_streams_every_groups_weights_when_tokens_per_expert_are_few():
    # one token for each of 64 experts, bf16: weights 64 x 2048 x 768 x 2 B = 201 MB, far above the
    # L2, and 0.2 GFLOP: the law is its memory term, bytes / (fm x bandwidth), plus its fixed cost; the
    # bandwidth what the 132 SMs draw, the memory's in series with bw_sm each (Little's law)
    prm = grouped_parameters({"gemm": load_kernel_model()["parameters"]["gemm"]})   # the GEMM's, no correction
    g, m, n, k = 64, 1.0, EXPERT, HIDDEN
    nbytes = g * ((m * k + k * n) * GEMM_FORMATS["bf16"][1] + m * n * OUT_BYTES)
    device = 1.0 / (1.0 / 3.35e12 + 1.0 / (132 * prm.get("bw_sm", np.inf)))
    closed = nbytes / (prm["fm"] * device) + prm["t0"]["bf16"]
    assert float(grouped_gemm_time(m, g, n, k, "bf16", H100, prm)) == pytest.approx(closed, rel=0.05)
    # the same 64 routed rows as ONE group read one expert's weights: the 63 other experts' weights,
    # streamed from memory, are the difference
    one = float(grouped_gemm_time(64.0, 1, n, k, "bf16", H100, prm))
    extra = (g - 1) * k * n * GEMM_FORMATS["bf16"][1] / (prm["fm"] * device)
    assert float(grouped_gemm_time(m, g, n, k, "bf16", H100, prm)) - one == pytest.approx(extra, rel=0.05)


def test_expert_matmul_time_per_token_rises_as_tokens_per_expert_shrink():
    batches = np.array([1, 4, 16, 64, 256, 1024])
    rows = _decode_rows(hardware="h100-sxm", model="qwen3-30b-a3b", batch=batches)
    prm = grouped_parameters(load_kernel_model()["parameters"])
    per_token = []
    for b, r in zip(batches, rows):
        touched = expected_experts_touched(EXPERTS, TOP_K, float(b))
        routed = b * TOP_K
        # the operator is the grouped law of its own shape: `touched` groups of routed / touched rows
        expected = float(grouped_gemm_time(routed / touched, touched, EXPERT, HIDDEN, "bf16", H100, prm))
        assert r["expert_up_proj"]["time_s"] == pytest.approx(expected, rel=1e-9)
        per_token.append(r["expert_up_proj"]["time_s"] / routed)
    # fewer tokens per expert, more time per token: strictly, and by far between one and ~64 tokens an expert
    assert all(a > b for a, b in zip(per_token, per_token[1:]))
    assert per_token[0] > 20 * per_token[-1]


#: Measured MoE blocks (routed experts' gate/up, activation and down with their routing), in us, from
#: NVIDIA aiconfigurator-core 0.12.0 (github.com/ai-dynamo/aiconfigurator; PyPI wheel, Apache-2.0),
#: aiconfigurator_core/systems/data/<gpu>/moe/trtllm/1.3.0rc20/moe_perf.parquet: balanced routing, moe_tp 1,
#: the faster of the gated kernel sources; num_tokens the tokens entering the layer across the EP group.
#: (dse preset, model, weights/activations, ep, tokens, measured us)
MEASURED = [
    ("h200", "qwen3-30b-a3b", "bf16", 1, 8, 164.06), ("h200", "qwen3-30b-a3b", "bf16", 1, 64, 307.04),
    ("h200", "qwen3-30b-a3b", "bf16", 1, 2048, 478.89), ("h200", "qwen3-30b-a3b", "bf16", 8, 16, 57.86),
    ("h200", "qwen3-30b-a3b", "bf16", 8, 512, 74.89),
    ("h200", "deepseek-v3", "fp8", 8, 16, 194.68),      # measured fp8_block; dse prices fp8
    ("h200", "deepseek-v3", "fp8", 8, 128, 364.65), ("h200", "deepseek-v3", "fp8", 8, 2048, 525.90),
    ("b200", "qwen3-235b-a22b", "fp8", 8, 16, 74.38), ("b200", "qwen3-235b-a22b", "fp8", 8, 512, 90.78),
    ("h100-sxm", "mixtral-8x7b", "bf16", 1, 1, 261.54), ("h100-sxm", "mixtral-8x7b", "bf16", 1, 128, 1011.10),
]


def test_expert_block_matches_measured_moe_tables_within_25_percent():
    errors = []
    for hw, model, fmt, ep, tokens, measured_us in MEASURED:
        r = _decode_rows(hardware=hw, model=model, batch=tokens, weights=fmt, activations=fmt, ep=ep, devices=ep)[0]
        predicted_us = 1e6 * sum(r[n]["time_s"] for n in EXPERT_OPS if n in r)
        errors.append(predicted_us / measured_us - 1)
        assert predicted_us == pytest.approx(measured_us, rel=0.25), (hw, model, ep, tokens)
    assert np.median(np.abs(errors)) < 0.12


def _expert_up(weight_bytes, rows=512):
    """One expert up projection of Qwen3-30B-A3B's shape (bf16), ``rows`` routed tokens, whose
    ``weight_bytes`` are what its step or iteration reads; one group is one expert's 2048 x 768 x 2 B;
    its recorded shape is the template step's (64 experts touched) whatever the weights."""
    one = HIDDEN * EXPERT * 2.0
    f = lambda v: np.array([v], dtype=float)          # noqa: E731
    return OpArrays(ops=f(2 * rows * HIDDEN * EXPERT), weight_bytes=f(weight_bytes), act_bytes=f(rows * (HIDDEN + EXPERT) * 2),
                    kv_bytes=f(0), comm_bytes=f(0), p2p_bytes=f(0), peak_column=np.array([_COL["bf16"]]),
                    count=f(1), shape_m=f(rows / 64), shape_n=f(EXPERT), shape_k=f(HIDDEN),
                    heads=f(0), kv_heads=f(0), group_weight_bytes=f(one))


def test_an_iterations_groups_follow_the_expert_weights_it_reads():
    """Continuous batching reuses a step's operator shapes for iterations of other sizes, their weight
    bytes interpolated to the experts each touches: the groups priced are those weights over one
    expert's (64 experts, then 16 for the same 512 rows), not the template's."""
    peaks = tuple(989.5e12 if c in ("bf16", "fp16") else 1979e12 for c in COMPUTE_CLASSES) + (60e12, np.inf)
    eff = Efficiency(name="bare", op_overhead_s=0.0, step_overhead_s=0.0,
                     kernel=KernelHardware(peaks, 3.35e12, 132.0, 52428800.0))
    prm = grouped_parameters(load_kernel_model()["parameters"])
    one = HIDDEN * EXPERT * 2.0
    for experts in (64, 16):
        op = _expert_up(experts * one)
        fc, fm = kernel_fractions(op, eff)
        moved = (512 * HIDDEN + experts * HIDDEN * EXPERT) * 2.0 + 512 * EXPERT * 2.0
        time = max(op.ops[0] / (989.5e12 * fc[0]), moved / (3.35e12 * fm[0]))
        expected = float(grouped_gemm_time(512 / experts, experts, EXPERT, HIDDEN, "bf16", H100, prm))
        assert time == pytest.approx(expected, rel=1e-9), experts
