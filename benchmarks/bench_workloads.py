"""Hand-run benchmark: evaluations per second on one core when every design point is its own workload.

Llama-2-70B in FP8 (weights, activations, KV) on an H100 SXM template whose HBM bandwidth varies
per point, the batch from 1 to 256, prompts of 128-4,096 tokens and 64-1,024 generated tokens
drawn per point, so (almost) no two points share a workload. Per point: prefill, the exact decode
total, footprint, feasibility, serving metrics and energy (``from dse import evaluate``).

    python benchmarks/bench_workloads.py [points] [--model MODEL] [--llm-analysis PYTHON] [--default-malloc]
    python benchmarks/bench_workloads.py --shared [MODEL]
    python benchmarks/bench_workloads.py --small [ROWS] [--llm-analysis PYTHON] [--against DIR]

``--model`` prices another shipped model on the same points (default Llama-2-70B): one whose
decode fills a sliding window (mistral-7b, gemma-2-9b-it), a sparse attention's top-k
(deepseek-v3.2, on 8 devices) or none.

``--shared`` measures where sharing a workload starts to pay: 65,536 points whose workloads
(batch and lengths drawn per workload) are each shared by 16 to 8,192 points (the bandwidth varies
per point), priced with the workloads that differ only in batch and lengths (one operator table per
distinct workload), and priced one workload at a time; ``dse.system.grouping.MANY_BELOW`` is set
from the crossover.

``--small`` measures a small call (what a search's trial, ``analyze``, ``compare`` and the explorer
pay): one ``evaluate`` of ROWS rows (default 256), each its own workload (batch 1-256, prompts of
128-4,096 and 64-1,024 generated tokens) of one of five shipped models (Llama-3.1-8B and 70B,
Llama-2-70B, Mistral-7B, Qwen3-30B-A3B) on one of five GPUs (H100 SXM, A100 80GB, H200, L40S,
B200), models and GPUs given as text arrays, FP8, TP 8: the median CPU time of 20 calls and the
evaluations per second it gives. ``--against DIR`` runs it with checkout DIR's ``dse`` and this
one's alternately, three times each, in child processes.

The process is set up as ``dse run`` sets up its evaluating processes: malloc keeps what it
frees for the next arrays (``dse.keep_freed_memory``, glibc; ``--default-malloc`` leaves
malloc as it is, to see what that is worth).

With ``--llm-analysis`` the same points (the first 2,000) are also priced by llm-analysis
(``pip install llm-analysis`` in the interpreter PYTHON's own environment; it is not a dependency
of dse), one ``LLMAnalysis(...).inference(...)`` per point (its bandwidth, as an HBM efficiency,
is a constructor argument), side by side on this machine. BLAS runs on one thread for both.
"""
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from basis.errors import DseError  # noqa: E402
from dse import evaluate, keep_freed_memory  # noqa: E402
from dse.system import grouping  # noqa: E402

#: the llm-analysis side: the same points, one analysis each (run in its own interpreter)
LLM_ANALYSIS = r"""
import json, logging, sys, time
from llm_analysis.analysis import LLMAnalysis, logger
from llm_analysis.config import (ParallelismConfig, get_dtype_config_by_name, get_gpu_config_by_name,
                                 get_model_config_by_name)
logger.setLevel(logging.ERROR)
pts = json.load(sys.stdin)
model = get_model_config_by_name("upstage_Llama-2-70b-instruct-v2")
gpu = get_gpu_config_by_name("h100-sxm-80gb")
dtype = get_dtype_config_by_name("w8a8e16")
t = time.perf_counter()
for b, p, g, bw in zip(pts["batch"], pts["prompt_len"], pts["gen_len"], pts["bandwidth"]):
    # its achieved bandwidth may not exceed the GPU's: the point's bandwidth maps onto (0.3, 1] of it
    a = LLMAnalysis(model, gpu, dtype, ParallelismConfig(), hbm_memory_efficiency=0.3 + 0.7 * (bw - 1e12) / 1.5e13)
    try:
        a.inference(batch_size_per_gpu=b, seq_len=p, num_tokens_to_generate=g, kv_cache_dtype_bytes=1)
    except AssertionError:      # a design it finds does not fit: its answer for that point
        pass
print(json.dumps({"seconds": time.perf_counter() - t, "points": len(pts["batch"])}))
"""


def points(n: int, seed: int = 0) -> dict:
    """The benchmark's design points as columns (every point its own workload)."""
    rng = np.random.default_rng(seed)
    return dict(batch=rng.integers(1, 257, n), prompt_len=rng.integers(128, 4097, n),
                gen_len=rng.integers(64, 1025, n), memory_bandwidth=rng.uniform(1e12, 1.6e13, n))


def dse_rate(n: int, chunk: int = 100_000, repeats: int = 3, model: str = "llama-2-70b") -> tuple[float, int]:
    """(best evaluations per second over ``repeats`` runs, distinct workloads among the points)."""
    cols = points(n)
    fixed = dict(hardware="h100-sxm", model=model, weights="fp8", activations="fp8", kv="fp8",
                 flash_attention=True)
    evaluate({**fixed, **{k: v[:1000] for k, v in cols.items()}})          # imports and presets loaded
    best = np.inf
    for _ in range(repeats):
        t = time.perf_counter()
        for i in range(0, n, chunk):
            evaluate({**fixed, **{k: v[i:i + chunk] for k, v in cols.items()}})
        best = min(best, time.perf_counter() - t)
    distinct = len({(b, p, g) for b, p, g in zip(cols["batch"], cols["prompt_len"], cols["gen_len"])})
    return n / best, distinct


def shared_rates(model: str = "llama-2-70b", total: int = 65_536, repeats: int = 3) -> None:
    """Print, for workloads each shared by 16 to 8,192 points, the best time of ``evaluate`` with
    every workload priced with the others and with each priced alone."""
    rng = np.random.default_rng(0)
    for shared in (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192):
        n = total // shared
        at = np.repeat(np.arange(n), shared)
        work = {k: v[at] for k, v in points(n, seed=int(rng.integers(1 << 30))).items() if k != "memory_bandwidth"}
        cols = dict(hardware="h100-sxm", model=model, weights="fp8", activations="fp8", kv="fp8", flash_attention=True,
                    memory_bandwidth=rng.uniform(1e12, 1.6e13, n * shared), **work)
        best = {}
        for path, below in (("together", 1 << 62), ("alone", 0)):
            grouping.MANY_BELOW = below
            evaluate(cols)                                              # tables of the workloads kept alike
            times = []
            for _ in range(repeats):
                t = time.perf_counter()
                evaluate(cols)
                times.append(time.perf_counter() - t)
            best[path] = min(times)
        print(f"{model}: {n * shared:,} points, {n:,} workloads of {shared:,} points: priced together "
              f"{best['together'] * 1e3:,.0f} ms, each workload alone {best['alone'] * 1e3:,.0f} ms", flush=True)


#: the small call's models and GPUs (``--small``)
SMALL_MODELS = ("llama-3.1-8b", "llama-2-70b", "mistral-7b", "qwen3-30b-a3b", "llama-3.1-70b")
SMALL_GPUS = ("h100-sxm", "a100-80gb", "h200", "l40s", "b200")


def small_columns(rows: int, seed: int = 0) -> dict:
    """The small call's columns (``--small``): every row its own workload, model and GPU as text."""
    rng = np.random.default_rng(seed)
    return {"model": np.array(SMALL_MODELS)[rng.integers(0, len(SMALL_MODELS), rows)],
            "hardware": np.array(SMALL_GPUS)[rng.integers(0, len(SMALL_GPUS), rows)],
            "batch": rng.integers(1, 257, rows), "prompt_len": rng.integers(128, 4097, rows),
            "gen_len": rng.integers(64, 1025, rows), "weights": "fp8", "activations": "fp8", "kv": "fp8", "tp": 8}


def small_call(rows: int = 256, calls: int = 20) -> float:
    """Median CPU seconds of one ``evaluate`` of the small call's ``rows`` rows (after one to warm)."""
    cols = small_columns(rows)
    evaluate(cols)
    times = []
    for _ in range(calls):
        t = time.process_time()
        evaluate(cols)
        times.append(time.process_time() - t)
    return float(np.median(times))


def small_against(other: str, rows: int, repeats: int = 3) -> None:
    """The small call with checkout ``other``'s dse and this one's, alternately, in child processes."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for _ in range(repeats):
        for label, root in (("before", os.path.abspath(other)), ("after ", here)):
            env = {**os.environ, "PYTHONPATH": root}
            done = subprocess.run([sys.executable, os.path.abspath(__file__), "--small", str(rows)], cwd=root, env=env,
                                  capture_output=True, text=True)
            print(f"{label} {done.stdout.strip() or (done.stderr.strip().splitlines() or ['?'])[-1]}", flush=True)


def llm_analysis_rate(python: str, n: int = 2000) -> float:
    """Evaluations per second of llm-analysis on the first ``n`` of the same points."""
    cols = {k: v[:n].tolist() for k, v in points(n).items()}
    cols["bandwidth"] = cols.pop("memory_bandwidth")
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    r = subprocess.run([python, "-c", LLM_ANALYSIS], input=json.dumps(cols), capture_output=True, text=True, env=env)
    if r.returncode:
        raise SystemExit(f"llm-analysis run failed: {r.stderr.strip().splitlines()[-1:]}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    return out["points"] / out["seconds"]


#: the most design points a run of this benchmark takes (bounds its memory)
MOST_POINTS = 10**7


def _count(text: str, what: str) -> int:
    """``text`` as a count of design points, 1 .. ``MOST_POINTS``; else exit with one line (status 2)."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= MOST_POINTS:
        print(f"bench_workloads.py: {what}: expected a whole number of design points from 1 to {MOST_POINTS:,}, "
              f"got {text!r}", file=sys.stderr)
        raise SystemExit(2)
    return n


def main(argv: list[str]) -> None:
    python = None
    if "--llm-analysis" in argv:
        k = argv.index("--llm-analysis")
        python = argv[k + 1]
        argv = argv[:k] + argv[k + 2:]
    model = "llama-2-70b"
    if "--model" in argv:
        k = argv.index("--model")
        model = argv[k + 1]
        argv = argv[:k] + argv[k + 2:]
    against = None
    if "--against" in argv:
        k = argv.index("--against")
        against = argv[k + 1]
        argv = argv[:k] + argv[k + 2:]
    plain = "--default-malloc" in argv
    argv = [a for a in argv if a != "--default-malloc"]
    if not plain:
        keep_freed_memory()
    if "--small" in argv:
        argv.remove("--small")
        rows = _count(argv[0], "--small ROWS") if argv else 256
        if against:
            small_against(against, rows)
            return
        per_call = small_call(rows)
        print(f"dse: {rows} rows, each its own workload, {len(SMALL_MODELS)} models x {len(SMALL_GPUS)} GPUs as text: "
              f"{per_call * 1e3:.1f} ms a call (median CPU), {rows / per_call:,.0f} evaluations/s on one core")
        if python:
            other = llm_analysis_rate(python)
            print(f"llm-analysis: {other:,.0f} evaluations/s on one core; dse is {rows / per_call / other:,.1f}x faster")
        return
    if "--shared" in argv:
        argv.remove("--shared")
        try:
            shared_rates(*argv[:1])
        except DseError as e:             # an unknown model: one line, exit 1
            raise SystemExit(f"bench_workloads.py --shared: {e}") from None
        return
    n = _count(argv[0], "points") if argv else 200_000
    try:
        rate, distinct = dse_rate(n, model=model)
    except DseError as e:                 # an unknown model: one line, exit 1
        raise SystemExit(f"bench_workloads.py --model: {e}") from None
    print(f"dse: {model}, {n:,} design points ({distinct:,} distinct workloads), {rate:,.0f} evaluations/s on one core"
          f"{' (malloc as it is)' if plain else ''}")
    if python:
        other = llm_analysis_rate(python)
        print(f"llm-analysis: {other:,.0f} evaluations/s on one core; dse is {rate / other:,.1f}x faster")


if __name__ == "__main__":
    main(sys.argv[1:])
