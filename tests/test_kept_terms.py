"""What the kernel's speed layer keeps of a workload (``dse.core.kernel_fast.KEPT``: the
intensity-sorted sums, the decode's split) changes no result: pricing workloads one after
another under different efficiencies, in any order, gives what each gives priced with nothing
kept."""
from dataclasses import replace

import numpy as np

from dse import evaluate
from dse.core.efficiency import efficiency_for
from dse.core.roofline import forget_kept

N = 60
RNG = np.random.default_rng(8)
WORKLOADS = [
    dict(model="llama-2-7b", batch=8, prompt_len=512, gen_len=64),
    dict(model="llama-2-7b", batch=64, prompt_len=512, gen_len=64),
    dict(model="mixtral-8x7b", batch=16, prompt_len=1024, gen_len=128, devices=2),
    dict(model="gemma-2-9b-it", batch=4, prompt_len=4096, gen_len=2048),          # sliding window: two decode pieces
]
BASE = efficiency_for("gpu")
EFFICIENCIES = [None, BASE, replace(BASE, compute=BASE.compute / 2, compute_fp8=BASE.compute_fp8 / 2,
                                    memory=BASE.memory / 2, name="half"),
                replace(BASE, compute_half_ops=1e10, memory_half_bytes=1e6, name="small operators slow")]


def _cols(w):
    return {"hardware": RNG.choice(["h100-sxm", "a100-80gb", "mi300x"], N), "weights": "fp8", **w,
            "memory_bandwidth": RNG.uniform(1e12, 8e12, N), "peak_fp8": RNG.uniform(2e14, 4e15, N)}


def test_kept_terms_change_no_result():
    cases = [(c, e) for c in map(_cols, WORKLOADS) for e in EFFICIENCIES]
    kept = [evaluate(c, efficiency=e) for c, e in cases]
    again = [evaluate(c, efficiency=e) for c, e in reversed(cases)][::-1]     # every term kept now
    for (c, e), first, second in zip(cases, kept, again):
        forget_kept()
        fresh = evaluate(c, efficiency=e)
        assert fresh.feasible.any()
        for k in fresh.metrics:
            np.testing.assert_array_equal(first[k], fresh[k], err_msg=k)
            np.testing.assert_array_equal(second[k], fresh[k], err_msg=k)
    base, slow = kept[1], kept[2]                    # the efficiencies did reach the results
    assert np.all(slow["ttft_s"] > base["ttft_s"])
