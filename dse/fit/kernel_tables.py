"""Read measured kernel tables and fit the kernel layer (``dse.core.kernel_model``) on them.

A calibrate-time tool, never needed at run time: the product ships the fitted coefficients
(``configs/kernel_model.yaml``). The tables are NVIDIA's aiconfigurator-core wheel
(``aiconfigurator_core/systems``, Apache-2.0, version 0.12.0 on PyPI): per GPU, engine and
version, Parquet files of measured kernel latencies in milliseconds
(``data/<gpu>/gemm/<engine>/<version>/gemm_perf.parquet``, ``attention/.../context_attention_perf``
and ``generation_attention_perf``, ``comm/nccl/<version>/nccl_perf``) and a ``<gpu>.yaml`` of the
GPU's peaks, memory bandwidth and link bandwidth.

    python -m dse.fit.kernel_tables AIC_SYSTEMS_DIR [--out runs/kernel_model.yaml] [--transfer]

refits the model on the chosen engine version (``ENGINE``: TensorRT-LLM 1.3.0rc20, the one
version measured on the most GPUs: 8) and, with ``--transfer``, reports leave-one-GPU-out,
leave-one-engine-out and (collectives) leave-one-GPU-count-out errors.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from scipy.optimize import least_squares

from basis.errors import DseError
from dse.core.kernel_model import (
    COLLECTIVES,
    GEMM_FORMATS,
    KERNEL_MODEL_FILE,
    SMEM_DEFAULT,
    SMEM_SOURCE,
    Hardware,
    collective_time,
    context_attention_time,
    gemm_time,
    generation_attention_time,
    grouped_gemm_time,
)

#: the engine and version fitted: measured on the most GPUs (H100, H200, B200, GB200, B300, GB300,
#: L40S, RTX PRO 6000 Server), with every format (BF16, FP8, FP8 block-scaled, NVFP4 on Blackwell)
ENGINE = ("trtllm", "1.3.0rc20")
#: engines held out whole to measure transfer to another kernel library
OTHER_ENGINES = (("vllm", "0.24.0"), ("sglang", "0.5.14"))
#: the aiconfigurator-core system names fitted
GPUS = ("h100_sxm", "h200_sxm", "b200_sxm", "gb200", "b300_sxm", "gb300", "l40s", "rtx_pro_6000_server")
#: rows per GPU each error figure is measured on (a fixed-seed sample; the tables hold ~10^5 per GPU)
EVAL_ROWS = 5000
#: aiconfigurator's gemm_dtype -> our GEMM format
GEMM_DTYPES = {"bfloat16": "bf16", "fp8": "fp8", "fp8_block": "fp8_block", "nvfp4": "nvfp4"}

#: What the tables' system YAML does not give: SM count, L2 size (bytes) and shared memory per SM
#: (bytes, by compute capability: ``kernel_model.SMEM_SOURCE``), each with its source.
#: (peaks, bandwidth and link bandwidth come from aiconfigurator's ``systems/<gpu>.yaml``; the compute
#: capability from its ``sm_version``: 80 A100, 89 L40S, 90 H100/H200, 100 B200/GB200, 103 B300/GB300,
#: 120 RTX PRO 6000.) The per-block maxima NVIDIA's CUTLASS builds against agree, each 1 KiB less than
#: the SM's: sm90_smem_capacity_bytes = 232448 (include/cutlass/gemm/collective/builders/sm90_common.inl),
#: sm100 232448 and sm120 101376 (include/cutlass/arch/arch.h), and the CUTLASS Python DSL's
#: SmemCapacity: SM80 (164 - 1) KiB, SM86 and SM89 (100 - 1) KiB.
SMEM_KB = {80: 164, 89: 100, 90: 228, 100: 228, 103: 228, 120: 100}
GPU_FEATURES = {
    "a100_sxm": dict(sms=108, l2_bytes=40 * 2**20, smem_bytes=SMEM_KB[80] * 1024,
                     source="NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020): A100 SXM4, 108 SMs, "
                     "40 MB L2; shared memory 164 KB per SM (compute capability 8.0)"),
    "h100_sxm": dict(sms=132, l2_bytes=50 * 2**20, smem_bytes=SMEM_KB[90] * 1024,
                     source="NVIDIA H100 Tensor Core GPU Architecture whitepaper "
                     "(2022): H100 SXM5, 132 SMs, 50 MB L2; shared memory 228 KB per SM (compute capability 9.0)"),
    "h200_sxm": dict(sms=132, l2_bytes=50 * 2**20, smem_bytes=SMEM_KB[90] * 1024,
                     source="the H100 SXM5 configuration of the GH100 die (132 SMs, "
                     "50 MB L2; H100 whitepaper), which H200 keeps with HBM3e memory; 228 KB shared memory per SM "
                     "(compute capability 9.0)"),
    "b200_sxm": dict(sms=148, l2_bytes=126 * 2**20, smem_bytes=SMEM_KB[100] * 1024,
                     source="Chips and Cheese, 'Nvidia's B200: Keeping the CUDA "
                     "Juggernaut Rolling' (2025): 74 of 80 SMs per die enabled, 148 SMs; L2 126 MB; 228 KB shared "
                     "memory per SM (compute capability 10.0)"),
    "gb200": dict(sms=148, l2_bytes=126 * 2**20, smem_bytes=SMEM_KB[100] * 1024,
                  source="the B200 GPU's configuration (Chips and Cheese 2025); "
                  "GB200 pairs that GPU with a Grace CPU (assumed the same SM count and L2); 228 KB shared memory per "
                  "SM (compute capability 10.0)"),
    "b300_sxm": dict(sms=160, l2_bytes=126 * 2**20, smem_bytes=SMEM_KB[103] * 1024,
                     source="NVIDIA 'Inside NVIDIA Blackwell Ultra' (Hot Chips "
                     "2025, reported by TweakTown 2025-08-26): 160 SMs; L2 not published there, taken as "
                     "B200's 126 MB (assumption); 228 KB shared memory per SM (compute capability 10.3)"),
    "gb300": dict(sms=160, l2_bytes=126 * 2**20, smem_bytes=SMEM_KB[103] * 1024,
                  source="as b300_sxm (Blackwell Ultra GPU with a Grace CPU)"),
    "l40s": dict(sms=142, l2_bytes=48 * 2**20, smem_bytes=SMEM_KB[89] * 1024,
                 source="TechPowerUp GPU database entry for L40S (AD102): SM count "
                 "142, L2 48 MB (as reproduced on computizer.com's L40S product page); 100 KB shared memory per SM "
                 "(compute capability 8.9)"),
    "rtx_pro_6000_server": dict(sms=188, l2_bytes=128 * 2**20, smem_bytes=SMEM_KB[120] * 1024,
                                source="NVIDIA GTC 2025 RTX PRO 6000 Blackwell "
                                "announcement as reported by topcpu.net (2025-03): 188 of GB202's 192 SMs, 128 MB L2; "
                                "100 KB shared memory per SM (compute capability 12.0)"),
}
TABLES_SOURCE = ("aiconfigurator-core 0.12.0 (PyPI wheel, Apache-2.0, NVIDIA): "
                 "aiconfigurator_core/systems/data/<gpu>/<op>/<engine>/<version>/*.parquet, "
                 "latencies in ms measured by NVIDIA's collectors (collection_meta.yaml: provenance collected)")


# ---- reading ------------------------------------------------------------------------------------

def _version_dir(root: Path, gpu: str, op: str, engine: str, version: str | None) -> Path | None:
    """The table folder of ``gpu``/``op``/``engine``/``version`` (None: the newest version there), or None."""
    base = root / "data" / gpu / op / engine
    if version is not None:
        return base / version if (base / version).is_dir() else None
    versions = sorted((p for p in base.glob("*") if p.is_dir()), key=lambda p: _version_key(p.name))
    return versions[-1] if versions else None


def _version_key(v: str) -> tuple:
    return tuple(int(x) if x.isdigit() else -1 for x in v.replace("rc", ".").replace("post", ".").split("."))


def hardware_table(root: str | Path, gpus=GPUS) -> pd.DataFrame:
    """One row per GPU: its physical description (``kernel_model.Hardware`` fields), peaks,
    memory and link bandwidth from aiconfigurator's ``systems/<gpu>.yaml``, SMs and L2 from
    ``GPU_FEATURES``. DseError naming the file if a YAML is missing or lacks a figure."""
    root = Path(root)
    rows = []
    for g in gpus:
        p = root / f"{g}.yaml"
        try:
            gpu = (yaml.safe_load(p.read_text()) or {})["gpu"]
            node = (yaml.safe_load(p.read_text()) or {}).get("node") or {}
        except (OSError, KeyError, yaml.YAMLError) as e:
            raise DseError(f"{p}: cannot read the GPU's 'gpu' section ({type(e).__name__})") from None
        try:
            p16, p8 = float(gpu["bfloat16_tc_flops"]), float(gpu.get("fp8_tc_flops", gpu["bfloat16_tc_flops"]))
            rows.append(dict(gpu=g, peak_16=p16, peak_8=p8, peak_4=float(gpu.get("fp4_tc_flops", p8)),
                             bandwidth=float(gpu["mem_bw"]), link_bandwidth=float(node.get("intra_node_bw", np.nan)),
                             link_latency=0.0, **{k: v for k, v in GPU_FEATURES[g].items() if k != "source"}))
        except KeyError as e:
            raise DseError(f"{p}: gpu.{e.args[0]}: missing") from None
    return pd.DataFrame(rows).set_index("gpu")


def _read(root: Path, gpu: str, op: str, name: str, engine: str, version: str | None) -> pd.DataFrame | None:
    d = _version_dir(root, gpu, op, engine, version)
    if d is None or not (d / f"{name}.parquet").exists():
        return None
    df = pd.read_parquet(d / f"{name}.parquet")
    df["gpu"], df["engine"], df["version"] = gpu, engine, d.name
    return df


def read_gemm(root, gpus=GPUS, engine=ENGINE) -> pd.DataFrame:
    """GEMM rows: gpu, engine, version, m, n, k, fmt, seconds (formats of GEMM_DTYPES only)."""
    root = Path(root)
    out = [d for g in gpus if (d := _read(root, g, "gemm", "gemm_perf", *engine)) is not None]
    if not out:
        raise DseError(f"{root}: no GEMM table of {engine[0]} {engine[1]} for {', '.join(gpus)}")
    df = pd.concat(out, ignore_index=True)
    df = df[df.gemm_dtype.isin(list(GEMM_DTYPES))]
    return pd.DataFrame(dict(gpu=df.gpu, engine=df.engine, version=df.version, m=df.m.astype(float),
                             n=df.n.astype(float), k=df.k.astype(float), fmt=df.gemm_dtype.map(GEMM_DTYPES),
                             seconds=df.latency * 1e-3)).reset_index(drop=True)


def read_attention(root, kind: str, gpus=GPUS, engine=ENGINE) -> pd.DataFrame:
    """Attention rows of ``kind`` ('generation' or 'context'): gpu, engine, version, batch, length
    (cached tokens for generation, sequence for context), heads, kv_heads, head_dim, window,
    fmt ('bf16'/'fp8' of the attention math), kv_bytes, seconds (beam width 1 only)."""
    root = Path(root)
    out = [d for g in gpus if (d := _read(root, g, "attention", f"{kind}_attention_perf", *engine)) is not None]
    if not out:
        raise DseError(f"{root}: no {kind}-attention table of {engine[0]} {engine[1]}")
    df = pd.concat(out, ignore_index=True)
    df = df[df.beam_width == 1]
    length = df.step if kind == "generation" else df.isl
    return pd.DataFrame(dict(gpu=df.gpu, engine=df.engine, version=df.version, batch=df.batch_size.astype(float),
                             length=length.astype(float), heads=df.num_heads.astype(float),
                             kv_heads=df.num_key_value_heads.astype(float), head_dim=df.head_dim.astype(float),
                             window=df.window_size.astype(float),
                             fmt=np.where(df.attn_dtype == "fp8", "fp8", "bf16"),
                             kv_bytes=np.where(df.kv_cache_dtype == "fp8", 1.0, 2.0),
                             seconds=df.latency * 1e-3)).reset_index(drop=True)


def read_collectives(root, gpus=GPUS) -> pd.DataFrame:
    """NCCL rows of each GPU's newest NCCL version: gpu, version, op, message_bytes, gpus, seconds
    (16-bit messages only)."""
    root = Path(root)
    out = [d for g in gpus if (d := _read(root, g, "comm", "nccl_perf", "nccl", None)) is not None]
    if not out:
        raise DseError(f"{root}: no NCCL table for {', '.join(gpus)}")
    df = pd.concat(out, ignore_index=True)
    df = df[(df.nccl_dtype == "half") & df.op_name.isin(COLLECTIVES)]
    return pd.DataFrame(dict(gpu=df.gpu, version=df.version, op=df.op_name, message_bytes=df.message_size.astype(float),
                             gpus=df.num_gpus.astype(float), seconds=df.latency * 1e-3)).reset_index(drop=True)


#: aiconfigurator's moe_dtype -> our GEMM format (the weight-only MXFP4 rows are left out)
MOE_DTYPES = {"bfloat16": "bf16", "fp8": "fp8", "fp8_block": "fp8_block", "nvfp4": "nvfp4"}


def read_moe(root, gpus=GPUS, engine=ENGINE) -> pd.DataFrame:
    """MoE-block rows (``moe/<engine>/<version>/moe_perf``: the routed experts' gate, up and down
    projections with their routing and permutation, on one rank), balanced routing and gated
    experts only: gpu, engine, version, tokens, hidden, inter (an expert's, per tensor-parallel
    rank), groups (experts the rank runs: min(E, tokens x top-k) spread over the EP ranks),
    m (tokens an expert), fmt, seconds."""
    root = Path(root)
    out = [d for g in gpus if (d := _read(root, g, "moe", "moe_perf", *engine)) is not None]
    if not out:
        raise DseError(f"{root}: no MoE table of {engine[0]} {engine[1]} for {', '.join(gpus)}")
    df = pd.concat(out, ignore_index=True)
    df = df[(df.distribution == "balanced") & df.moe_dtype.isin(list(MOE_DTYPES))
            & (df.kernel_source != "moe_torch_flow_nongated")]
    tokens, k, E, ep = (df[c].astype(float).to_numpy() for c in ("num_tokens", "topk", "num_experts", "moe_ep_size"))
    groups = np.maximum(np.minimum(E, tokens * k) / ep, 1.0)
    return pd.DataFrame(dict(gpu=df.gpu, engine=df.engine, version=df.version, tokens=tokens,
                             hidden=df.hidden_size.astype(float).to_numpy(),
                             inter=(df.inter_size / df.moe_tp_size).astype(float).to_numpy(), groups=groups,
                             m=tokens * k / ep / groups, fmt=df.moe_dtype.map(MOE_DTYPES).to_numpy(),
                             seconds=df.latency.to_numpy() * 1e-3)).reset_index(drop=True)


def moe_block_time(m, groups, hidden, inter, fmt, hw: Hardware, prm: dict) -> np.ndarray:
    """Seconds of a gated expert block as dse prices it: its gate and up projections (n = inter,
    k = hidden) and its down projection (n = hidden, k = inter), each a grouped GEMM."""
    return (2.0 * grouped_gemm_time(m, groups, inter, hidden, fmt, hw, prm)
            + grouped_gemm_time(m, groups, hidden, inter, fmt, hw, prm))


# ---- the model on table rows ----------------------------------------------------------------------

def _hw_rows(df: pd.DataFrame, hw: pd.DataFrame) -> Hardware:
    """The Hardware of each row's GPU (arrays aligned with ``df``)."""
    h = hw.loc[df.gpu.to_numpy()]
    smem = h["smem_bytes"].to_numpy() if "smem_bytes" in h else SMEM_DEFAULT   # a table written before it
    return Hardware.of(**{c: h[c].to_numpy() for c in ("peak_16", "peak_8", "peak_4", "bandwidth", "sms", "l2_bytes",
                                                       "link_bandwidth", "link_latency")}, smem_bytes=smem)


def predict_rows(kind: str, df: pd.DataFrame, hw: pd.DataFrame, prm: dict) -> np.ndarray:
    """Predicted seconds of each table row of operator ``kind`` with parameters ``prm``."""
    H = _hw_rows(df, hw)
    if kind == "gemm":
        return gemm_time(df.m.to_numpy(), df.n.to_numpy(), df.k.to_numpy(), df.fmt.to_numpy(), H, prm)
    if kind == "grouped_gemm":
        args = (df.m.to_numpy(), df.groups.to_numpy(), df.hidden.to_numpy(), df.inter.to_numpy(), df.fmt.to_numpy(), H)
        if prm.get("design"):            # the fitter's call: one design matrix of the block (the gate's)
            base, X = grouped_gemm_time(df.m.to_numpy(), df.groups.to_numpy(), df.inter.to_numpy(),
                                        df.hidden.to_numpy(), df.fmt.to_numpy(), H, prm)
            return moe_block_time(*args, {**prm, "design": False, "correction": None}), X
        return moe_block_time(*args, prm)
    if kind == "generation_attention":
        return generation_attention_time(df.batch.to_numpy(), df.length.to_numpy(), df.heads.to_numpy(),
                                         df.kv_heads.to_numpy(), df.head_dim.to_numpy(), df.kv_bytes.to_numpy(),
                                         H, prm, window=df.window.to_numpy())
    if kind == "context_attention":
        return context_attention_time(df.batch.to_numpy(), df.length.to_numpy(), df.heads.to_numpy(),
                                      df.kv_heads.to_numpy(), df.head_dim.to_numpy(), df.fmt.to_numpy(), H, prm,
                                      window=df.window.to_numpy())
    if kind == "collective":
        return collective_time(df.op.to_numpy(), df.message_bytes.to_numpy(), df.gpus.to_numpy(), H, prm)
    raise DseError(f"unknown operator kind '{kind}'")


#: the per-SM parameters (``kernel_model._device_bandwidth``, ``_floor``): bytes/s one SM keeps in
#: flight from device memory, and the exponent of a kernel's fixed floor on the SM's size
_BW_SM = (("bw_sm",), 1.5e11, 1e9, 1e13)
_T0_EXP = (("t0_exp",), 0.3, 0.01, 3.0)
#: GEMM formats whose activations the library quantizes in a pass before the GEMM (16-bit in, the
#: format out). NVFP4 is left out: a pass fitted for it transferred worse (leaving one GPU out,
#: 1,000 rows a GPU: GEMM 10.2 % / 39.3 % with it, 10.3 % / 38.0 % without; RTX PRO 6000 p90 112 % / 70 %)
QUANTIZED = ("fp8", "fp8_block")
#: the GEMM's coefficients: the on-chip cache's bandwidth is per SM (``l2_sm``, bytes/s of one SM's
#: share of the L2), what the SMs draw from device memory limited per SM (``bw_sm``)
_GEMM = [(("top", "bf16"), 0.8, 0.2, 1.0), (("top", "fp8"), 0.7, 0.2, 1.0), (("top", "fp8_block"), 0.6, 0.1, 1.0),
         (("top", "nvfp4"), 0.5, 0.1, 1.0), (("fm",), 0.85, 0.2, 1.0), (("alpha",), 0.5, 0.01, 1.0),
         (("t_k",), 1e-9, 1e-13, 1e-7), (("p",), 3.0, 1.0, 20.0), (("l2_share",), 0.5, 0.05, 2.0),
         (("l2_sm",), 3e10, 1e9, 1e12), (("t0", "bf16"), 3e-6, 1e-7, 1e-4), (("t0", "fp8"), 1e-5, 1e-7, 1e-4),
         (("t0", "fp8_block"), 1e-5, 1e-7, 1e-4), (("t0", "nvfp4"), 6e-6, 1e-7, 1e-4), _BW_SM]
#: Each kind's free parameters: (path in the parameter dict, start, low, high). Fitted in log space.
SPECS = {
    # the GEMM's activations quantized to its format first (``quant``: passes over their bytes)
    "gemm": _GEMM + [(("quant", f), 0.5, 1e-3, 20.0) for f in QUANTIZED],
    # the grouped GEMM keeps the cache's bandwidth on the peak and no per-SM limit: with them (leaving one
    # GPU out, 1,000 rows a GPU) 14.7 % / 54.9 % against 14.0 % / 58.2 %, a worse median
    "grouped_gemm": [(("l2_ratio",), 0.005, 1e-4, 0.1) if s[0] == ("l2_sm",) else s for s in _GEMM if s is not _BW_SM],
    "generation_attention": [(("top",), 0.5, 0.05, 1.0), (("fm",), 0.8, 0.1, 1.0), (("split",), 512.0, 16.0, 1e5),
                             (("p",), 3.0, 1.0, 20.0), (("t0",), 5e-6, 1e-7, 1e-4),
                             (("t_cta",), 1.5e-6, 1e-8, 1e-4), _BW_SM, _T0_EXP,
                             # the per-head fallback's ops/s per SM (h / hk > GROUPED_HEADS_MAX)
                             (("v_sm",), 4.5e10, 1e9, 1e12)],
    "context_attention": [(("top", "bf16"), 0.6, 0.1, 1.0), (("top", "fp8"), 0.5, 0.1, 1.0), (("fm",), 0.8, 0.1, 1.0),
                          (("alpha",), 0.5, 0.01, 1.0), (("d_fill",), 32.0, 0.1, 1e3), (("s_fill",), 64.0, 0.1, 1e4),
                          (("p",), 3.0, 1.0, 20.0), (("t0",), 1e-5, 1e-7, 1e-4), _BW_SM, _T0_EXP,
                          # the tile's rows its shared memory allows: compute x (1 + r_fill / rows)
                          (("r_fill",), 16.0, 0.1, 1e3)],
    "collective": [((op, key), start, lo, hi) for op in COLLECTIVES
                   for key, start, lo, hi in (("f", 0.7, 0.05, 1.5), ("lat0", 1e-5, 1e-7, 1e-3),
                                              ("lat_hop", 2e-6, 1e-8, 1e-3))],
}
#: parameters held fixed (not fitted): the collective model reads no link latency (the tables'
#: systems give only an 'unofficial' 10 us for every GPU), its per-hop latency is fitted instead, and
#: its correction has the link's terms (``kernel_model._link_terms``); the attention kinds' corrections
#: have the SM's terms (``kernel_model._hardware_terms``); a format not quantized first has no pass
FIXED = {"collective": {**{op: {"hop_links": 0.0} for op in COLLECTIVES}, "link_terms": True},
         "gemm": {"quant": {f: 0.0 for f in GEMM_FORMATS if f not in QUANTIZED}},
         "generation_attention": {"hardware_terms": True, "floor_hinge": True}, "context_attention": {"hardware_terms": True}}


def _nest(spec, x, fixed) -> dict:
    out: dict = {}
    for (path, *_), v in zip(spec, x):
        d = out
        for key in path[:-1]:
            d = d.setdefault(key, {})
        d[path[-1]] = float(v)
    for k, v in (fixed or {}).items():
        if isinstance(v, dict):
            out.setdefault(k, {}).update(v)
        else:
            out[k] = v
    return out


def fit_kind(kind: str, df: pd.DataFrame, hw: pd.DataFrame, start: dict | None = None, ridge: float = 1.0) -> dict:
    """The parameters of ``kind``: first its physical model's few coefficients (robust, soft-L1,
    least squares of log(predicted / measured) on ``df``), then the weights of its correction
    (``dse.core.kernel_model._corrected``: hinge features of the same physical quantities, fitted
    by iteratively reweighted ridge regression on the remaining log error, an L1-like loss)."""
    spec, fixed = SPECS[kind], FIXED.get(kind)
    x0 = []
    for path, s, lo, hi in spec:
        v = start
        for key in path:
            v = v.get(key) if isinstance(v, dict) else None
        x0.append(np.log(np.clip(v if isinstance(v, float) else s, lo * 1.0001, hi * 0.9999)))
    lo = np.log([s[2] for s in spec])
    hi = np.log([s[3] for s in spec])
    y = np.log(df.seconds.to_numpy())

    def resid(z):
        pred = predict_rows(kind, df, hw, _nest(spec, np.exp(z), fixed))
        return np.log(np.maximum(pred, 1e-12)) - y
    res = least_squares(resid, np.array(x0), bounds=(lo, hi), loss="soft_l1", f_scale=0.1,
                        max_nfev=60 if start else 200)
    prm = _nest(spec, np.exp(res.x), fixed)
    base, X = predict_rows(kind, df, hw, {**prm, "design": True})
    r = y - np.log(np.maximum(base, 1e-12))
    w = np.zeros(X.shape[1])
    for _ in range(6):                       # IRLS toward the median of the log error
        wt = 1.0 / np.maximum(np.abs(r - X @ w), 0.02)
        Xw = X * wt[:, None]
        w = np.linalg.solve(X.T @ Xw + ridge * np.eye(X.shape[1]), Xw.T @ r)
    prm["correction"] = [round(float(v), 6) for v in w]
    return prm


def ape(pred: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """Absolute percentage error of each prediction, in %."""
    return 100.0 * np.abs(pred - measured) / measured


def _figures(err: np.ndarray) -> dict:
    return {"rows": int(err.size), "median_ape_pct": round(float(np.median(err)), 1),
            "p90_ape_pct": round(float(np.percentile(err, 90)), 1)}


def sample(df: pd.DataFrame, per_group: int, by=("gpu",), seed: int = 0) -> pd.DataFrame:
    """At most ``per_group`` rows of each group ``by``, drawn with a fixed seed."""
    shuffled = df.sample(frac=1.0, random_state=seed)
    return shuffled.groupby(list(by), sort=False).head(per_group).reset_index(drop=True)


def leave_one_out(kind: str, df: pd.DataFrame, hw: pd.DataFrame, column: str, fit_rows: int = 4000,
                  start: dict | None = None, band_of: bool = True) -> dict:
    """Transfer figures of ``kind``: for each value of ``column`` (a GPU, a GPU count), fit on the
    other rows (at most ``fit_rows`` per GPU) and predict the held-out ones. {held out: figures,
    'all': figures of every held-out row together}."""
    out, errs, ratios = {}, [], []
    for value in sorted(df[column].unique(), key=str):
        train = sample(df[df[column] != value], fit_rows, by=("gpu",))
        prm = fit_kind(kind, train, hw, start)
        test = sample(df[df[column] == value], EVAL_ROWS, seed=1)
        pred = predict_rows(kind, test, hw, prm)
        e = ape(pred, test.seconds.to_numpy())
        out[str(value)] = _figures(e)
        errs.append(e)
        ratios.append(test.seconds.to_numpy() / pred)
    out["all"] = _figures(np.concatenate(errs))
    if band_of:
        out["band"] = band(np.concatenate(ratios))
    return out


def engine_versions(root, op: str, gpus=GPUS) -> list[tuple[str, str]]:
    """Every (engine, version) with a table of ``op`` ('gemm' or 'attention') on any of ``gpus``."""
    root = Path(root)
    found = {(p.parent.name, p.name) for g in gpus for p in (root / "data" / g / op).glob("*/*") if p.is_dir()}
    return sorted(found, key=lambda ev: (ev[0], _version_key(ev[1])))


#: each kind the engine-version transfer measures: (reader of one engine version's rows, table folder)
ENGINE_KINDS = {"gemm": (lambda root, ev: read_gemm(root, GPUS, ev), "gemm"),
                "generation_attention": (lambda root, ev: read_attention(root, "generation", GPUS, ev), "attention"),
                "context_attention": (lambda root, ev: read_attention(root, "context", GPUS, ev), "attention")}


def leave_one_engine_version_out(kind: str, root, hw: pd.DataFrame, fit_rows: int = 1500,
                                 start: dict | None = None) -> dict:
    """Transfer figures of ``kind`` to a kernel library version the fit never saw: every (engine,
    version) measured is held out in turn, the model fitted on the other versions' rows (at most
    ``fit_rows`` per GPU) and the held-out rows predicted. {'engine version': figures, 'all': every
    held-out row together}."""
    read, op = ENGINE_KINDS[kind]
    frames = []
    for ev in engine_versions(root, op):
        try:
            d = read(root, ev)
        except DseError:                     # a version with no table of this kind on these GPUs
            continue
        frames.append(d.assign(engine_version=f"{ev[0]} {ev[1]}"))
    df = pd.concat(frames, ignore_index=True)
    return leave_one_out(kind, df, hw, "engine_version", fit_rows=fit_rows, start=start, band_of=False)


def record_transfer(path: str | Path, figures: dict) -> None:
    """Write ``figures`` ({'<kind> leave one engine version out': figures, ...}) into the model
    file ``path``'s ``transfer`` section beside the leave-one-GPU-out figures (the file's header
    comment kept, every other key as it was)."""
    p = Path(path)
    text = p.read_text()
    head = "".join(line for line in text.splitlines(True) if line.startswith("#"))
    doc = yaml.safe_load(text)
    doc.setdefault("transfer", {}).update(figures)
    p.write_text(head + yaml.safe_dump(doc, sort_keys=False, width=110))


def band(ratios: np.ndarray, coverage: float = 0.9) -> dict:
    """The band {n, low, high} (factors on a prediction, ``dse.core.bands``' layout) holding the
    central ``coverage`` of measured / predicted ``ratios``."""
    lo, hi = np.percentile(ratios, [50 * (1 - coverage), 50 * (1 + coverage)])
    return {"n": int(ratios.size), "low": round(float(lo), 4), "high": round(float(hi), 4)}


# ---- the command ------------------------------------------------------------------------------

#: each kind's reader of one engine's rows on some GPUs (collectives: each GPU's newest NCCL)
READERS = {"gemm": read_gemm,
           "generation_attention": lambda root, gpus, engine: read_attention(root, "generation", gpus, engine),
           "context_attention": lambda root, gpus, engine: read_attention(root, "context", gpus, engine),
           "collective": lambda root, gpus, engine: read_collectives(root, gpus),
           "grouped_gemm": read_moe}


def read_all(root: Path, engine=ENGINE, gpus=GPUS, kinds=tuple(READERS)) -> dict:
    """Every kind's rows (of ``kinds``) of ``engine`` (collectives: each GPU's newest NCCL) on ``gpus``."""
    return {kind: READERS[kind](root, gpus, engine) for kind in kinds}


def fit_all(tables: dict, hw: pd.DataFrame, fit_rows: int = 6000) -> dict:
    """Each kind's parameters fitted on at most ``fit_rows`` rows per GPU (fixed seed); the grouped
    GEMM's start from the GEMM's."""
    out = {}
    for kind, df in tables.items():
        out[kind] = fit_kind(kind, sample(df, fit_rows), hw, out.get("gemm") if kind == "grouped_gemm" else None)
    return out


def _hardware_doc(hw: pd.DataFrame) -> dict:
    return {g: {**{k: float(v) for k, v in row.items()}, "source": GPU_FEATURES[g]["source"]
                + "; peaks, bandwidth and link bandwidth: aiconfigurator systems/" + g + ".yaml"
                + "; shared memory per SM: " + SMEM_SOURCE}
            for g, row in hw.iterrows()}


def _write(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("# The kernel layer's fitted coefficients (dse.core.kernel_model), written by\n"
                    "# python -m dse.fit.kernel_tables. Do not edit by hand: refit.\n"
                    + yaml.safe_dump(doc, sort_keys=False, width=110))


def _refit_one(kind: str, out: Path, doc: dict, params: dict, record: dict, transfer: dict, hw: pd.DataFrame) -> None:
    """Write ``kind``'s refit into the model ``doc`` (read from ``out``): its parameters, fit error,
    transfer figures and band replaced, the hardware table rewritten, every other kind as it was."""
    doc["parameters"][kind] = params[kind]
    doc["hardware"] = _hardware_doc(hw)
    doc.setdefault("fit_error", {})[kind] = record[kind]
    doc.setdefault("transfer", {}).update(transfer)
    for k, v in transfer.items():
        if "band" in v:
            doc.setdefault("bands", {})[kind] = dict(v["band"])
    doc["date"] = _dt.date.today().isoformat()
    _write(out, doc)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dse.fit.kernel_tables", description=__doc__.split("\n\n")[0])
    ap.add_argument("systems", help="aiconfigurator_core/systems folder (the tables and the GPUs' YAML)")
    ap.add_argument("--out", default="runs/kernel_model.yaml",
                    help=f"where to write the fitted model (YAML; default runs/kernel_model.yaml, the shipped one is "
                         f"{KERNEL_MODEL_FILE.name} in configs/)")
    ap.add_argument("--transfer", action="store_true", help="also measure leave-one-GPU-out transfer (slow)")
    ap.add_argument("--fit-rows", type=int, default=6000, help="rows per GPU each fit uses (default 6000)")
    ap.add_argument("--kind", choices=list(READERS),
                    help="refit this operator kind only, in the model file --out (which must exist), every other "
                         "kind kept as it is")
    a = ap.parse_args(argv)
    root = Path(a.systems)
    try:
        if a.kind:
            out = Path(a.out)
            try:
                doc = yaml.safe_load(out.read_text())
            except (OSError, yaml.YAMLError) as e:
                raise DseError(f"{out}: cannot read the model to refit '{a.kind}' in ({type(e).__name__})") from None
            if not isinstance(doc, dict) or not isinstance(doc.get("parameters"), dict):
                raise DseError(f"{out}: expected a kernel model with 'parameters'")
        hw = hardware_table(root)
        tables = read_all(root, kinds=(a.kind,) if a.kind else tuple(READERS))
        params = fit_all(tables, hw, a.fit_rows)
        print("fitted", file=sys.stderr, flush=True)
        record = {kind: _figures(ape(predict_rows(kind, d, hw, params[kind]), d.seconds.to_numpy()))
                  for kind, df in tables.items() for d in [sample(df, EVAL_ROWS, seed=1)]}
        transfer = {}
        if a.transfer:
            for kind, df in tables.items():
                col = "gpus" if kind == "collective" else "gpu"
                print("transfer", kind, file=sys.stderr, flush=True)
                transfer[f"{kind} leave one {'GPU count' if col == 'gpus' else 'GPU'} out"] = leave_one_out(
                    kind, df, hw, col, fit_rows=min(a.fit_rows, 1500), start=params[kind])
            for eng in OTHER_ENGINES:
                for kind in (k for k in ENGINE_KINDS if k in tables):
                    other = sample(READERS[kind](root, GPUS, eng), EVAL_ROWS, seed=1)
                    e = ape(predict_rows(kind, other, hw, params[kind]), other.seconds.to_numpy())
                    transfer[f"{kind} on {eng[0]} {eng[1]} (fitted on {ENGINE[0]} {ENGINE[1]})"] = _figures(e)
    except DseError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.kind:
        _refit_one(a.kind, Path(a.out), doc, params, record, transfer, hw)
    else:
        _write(Path(a.out), {
            "source": TABLES_SOURCE,
            "fitted_on": f"{ENGINE[0]} {ENGINE[1]} tables of {', '.join(GPUS)}; collectives: each GPU's newest NCCL",
            "date": _dt.date.today().isoformat(),
            "conditions": f"robust (soft-L1) least squares of log(predicted/measured), at most {a.fit_rows} rows per "
                          "GPU and kind (fixed seed); beam width 1; 16-bit NCCL messages",
            "parameters": params,
            "hardware": _hardware_doc(hw),
            "fit_error": record,
            **({"transfer": transfer} if transfer else {}),
            **({"bands": {k.split(" ")[0]: dict(v["band"]) for k, v in transfer.items() if "band" in v}}
               if transfer else {}),
        })
    print(yaml.safe_dump({"fit_error": record, **({"transfer": transfer} if transfer else {})}, sort_keys=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
