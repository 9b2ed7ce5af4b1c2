"""Hand-run benchmark: design points per second through the roofline kernel.

Llama-2-70B FP16, TP 1, batch 64, prompt 2048, 128 generated tokens; every design
point a GPU with its own compute peak and HBM bandwidth. Per point: prefill time,
exact decode total over the generation (closed form) and TTFT/TPOT.

    python benchmarks/bench_kernel.py [points]
"""
import sys
import time

import numpy as np

from dse.efficiency import DEFAULT
from dse.metrics import serving_metrics
from dse.roofline import PEAK_COLUMNS, OpArrays, SystemArrays, decode_total_time, step_time
from hwmodels.presets import load_device
from workloads import optable
from workloads.model import load_model
from workloads.scenario import Scenario


def main(points: int = 1_000_000):
    rng = np.random.default_rng(0)
    m, d = load_model("llama-2-70b"), load_device("h100-sxm")
    sc = Scenario.make(batch=64, prompt_len=2048, gen_len=128)
    pre = OpArrays.from_table(optable.prefill(m, sc))
    d0, slope = (OpArrays.from_table(t) for t in optable.decode_linear(m, sc, sc.prompt_len + 1))
    base = SystemArrays.from_devices([d], 1)
    scale_c = rng.uniform(0.25, 4, points)
    scale_b = rng.uniform(0.25, 4, points)
    system = SystemArrays(base.peak * scale_c[:, None], base.bandwidth * scale_b, np.full(points, base.capacity[0]),
                          np.full(points, np.nan), np.zeros(points), np.ones(points))
    t = time.perf_counter()
    chunk = 100_000
    out = []
    for i in range(0, points, chunk):
        sl = slice(i, i + chunk)
        sub = SystemArrays(system.peak[sl], system.bandwidth[sl], system.capacity[sl], system.link_bandwidth[sl],
                           system.link_latency[sl], system.tp[sl])
        ttft = step_time(pre, sub, DEFAULT)
        dec = decode_total_time(d0, slope, np.full(sub.size, sc.gen_len - 1), sub, DEFAULT)
        out.append(serving_metrics(ttft, dec, sc.batch, sc.prompt_len, sc.gen_len, 1)["tpot_s"])
    dt = time.perf_counter() - t
    print(f"{points} points x {len(pre.ops)} prefill + {len(d0.ops)} decode operators ({len(PEAK_COLUMNS)} peak columns): "
          f"{dt:.2f} s, {points / dt:,.0f} points/s")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000)
