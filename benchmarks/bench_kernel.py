"""Hand-run benchmark: full design points per second through the vectorized evaluator.

Llama-2-70B FP8, prompt 2048, 256 generated tokens, FlashAttention; a GPU template
(H100 SXM base) with its own HBM bandwidth, capacity and FP8 peak per point, and the
batch from 1 to 256. Per point: prefill, the exact decode total over the generation,
the memory footprint, feasibility and the serving metrics (``from dse import evaluate``).
Every metric is computed; the benchmark reads ``READ`` and feasibility (a metric is put back in
the caller's order when read: ``dse.system.evaluator.Reordered``; ``--read-all`` reads all).

    python benchmarks/bench_kernel.py [points] [--read-all] [--default-malloc] [--kernel-layer=learned]

``--kernel-layer=learned`` prices the GPU matmuls and attention by the kernel layer's model of the
measured tables (each point a GPU design of its own: 'learned transfer'); default: the parameter's.

The process is set up as ``dse run`` sets up its evaluating processes: malloc keeps what it
frees for the next arrays (``dse.keep_freed_memory``, glibc; ``--default-malloc`` leaves
malloc as it is).

Measured (2026-11-29, one core of this 2-core machine, 10^6 points, median of 5): 13,470 points/s
at df2871a, where every distinct design's die area and cost went through a Python loop and its
canonical name was spelled whether read or not; 376,915 points/s once both were array work and
names are spelled when read, every answer bit-identical.
"""
import sys
import time

import numpy as np

from dse import evaluate, keep_freed_memory

#: the metrics read of every point
READ = ("ttft_s", "tpot_s", "e2e_latency_s", "output_tokens_per_s", "memory_bytes")


def main(points: int = 1_000_000, chunk: int = 1_000_000, repeats: int = 5, read_all: bool = False,
         kernel_layer: str | None = None):
    rng = np.random.default_rng(0)
    cols_all = dict(batch=rng.integers(1, 257, points), memory_bandwidth=rng.uniform(1e12, 1.6e13, points),
                    memory_capacity=rng.uniform(4e10, 4e11, points), peak_fp8=rng.uniform(2.5e14, 1e16, points))
    fixed = dict(hardware="h100-sxm", model="llama-2-70b", weights="fp8", activations="fp8", kv="fp8",
                 prompt_len=2048, gen_len=256, flash_attention=True)
    if kernel_layer:
        fixed["kernel_layer"] = kernel_layer
    evaluate({**fixed, **{k: v[:1000] for k, v in cols_all.items()}})      # warm the table cache
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        feasible = 0
        for i in range(0, points, chunk):
            out = evaluate({**fixed, **{k: v[i:i + chunk] for k, v in cols_all.items()}})
            feasible += int(out["feasible"].sum())
            for name in out.metrics if read_all else READ:
                out[name]
        times.append(time.perf_counter() - t)
    best, median = min(times), sorted(times)[len(times) // 2]
    print(f"{points:,} design points (256 batch sizes x GPU designs), {repeats} runs: best {best:.2f} s = "
          f"{points / best:,.0f} points/s, median {median:.2f} s = {points / median:,.0f} points/s "
          f"({feasible:,} feasible; {'every metric' if read_all else ', '.join(READ)} read; kernel layer "
          f"{kernel_layer or 'default'})")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if "--default-malloc" not in sys.argv:
        keep_freed_memory()
    layer = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--kernel-layer=")), None)
    main(int(args[0]) if args else 1_000_000, read_all="--read-all" in sys.argv, kernel_layer=layer)
