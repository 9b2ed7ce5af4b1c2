"""Predictions against measured results: read a measured-results CSV, predict every
scored row with ``dse.system.analysis`` and report the error.

CSV format (``data/measured_calibration.csv``, shipped): one measurement per row with the
columns ``model_slug, hardware_slug, devices, batch, prompt_len, gen_len, weights,
activations, kv, metric, value`` (SI units; ``batch`` may be ``max``). Optional columns:
``id``, ``scored`` (``no`` rows are context only), ``tp``/``pp`` (default: all devices
tensor parallel), ``framework`` (selects an engine profile, below), and per-row
overrides ``flash_attention`` (yes/no), ``gqa_kv_sharing`` (yes/no), ``batching``
(static/inflight).

How a row is predicted:
- ``batch=max``: the largest batch whose footprint fits in the devices' memory (never
  grown into host memory).
- A row whose model does not fit on its devices is predicted with greedy overflow to the
  host tier (``analyze --offload greedy``); a row that does not fit even so, or that the
  model cannot express, is listed as unpredictable with the reason.
- Engine profile (``ENGINES``, matched on the ``framework`` column): whether the serving
  engine fuses attention (FlashAttention-style traffic), whether its decode attention
  reads K/V once per GQA group or once per query head, and whether it batches
  statically or in flight. These describe the measured software, not the hardware, and
  are never fitted.
- ``--ideal`` predicts with the pure roofline bound; every measured throughput should
  then be at or below its prediction and every measured latency at or above it.
"""
from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from basis.errors import DseError
from basis.shipped import shipped_file
from basis.units import bytes_text
from dse.core.efficiency import IDEAL, Efficiency, efficiency_for
from dse.present import display
from dse.present.plots import validation_plot
from dse.system.evaluator import evaluate, prepare
from dse.system.reasons import MEMORY_CODES
from hwmodels.formats import get_format
from hwmodels.presets import load_device
from workloads.model import load_model
from workloads.optable import kv_heads_per_device


REQUIRED = ("model_slug", "hardware_slug", "devices", "batch", "prompt_len", "gen_len", "weights",
            "activations", "kv", "metric", "value")
METRICS = ("ttft_s", "tpot_s", "e2e_latency_s", "output_tokens_per_s", "output_tokens_per_s_per_user",
           "output_tokens_per_s_per_device", "prefill_tokens_per_s")
#: metrics where smaller is better (the ideal bound is a lower bound)
LATENCY_METRICS = ("ttft_s", "tpot_s", "e2e_latency_s")


@dataclass(frozen=True)
class Engine:
    """What a serving engine does that the roofline must know (not fitted).

    flash_attention: attention is one fused kernel (no score matrix in memory).
    gqa_kv_sharing: decode attention reads each K/V head once for all the query heads of
        its group (else once per query head).
    batching: 'static' (prefill, then decode, one batch at a time) or 'inflight' (a
        scheduler mixes new prefills into running decode batches).
    """

    name: str
    pattern: str
    flash_attention: bool = True
    gqa_kv_sharing: bool = True
    batching: str = "static"
    source: str = ""


#: Engine profiles, first match on the ``framework`` column wins.
ENGINES = (
    Engine("TensorRT-LLM before 0.8", r"TensorRT-LLM v0\.[0-7]\b", gqa_kv_sharing=False,
           source="TensorRT-LLM docs/source/blogs/XQA-kernel.md: the XQA kernel 'provides optimization for MQA "
                  "and GQA during generation phase ... reducing data loading' and 'will be included in the v0.8 "
                  "releases' (Llama-70B on one H200, 128/2048: 1,227 tok/s/GPU without XQA, 2,941 with it); "
                  "before it the masked multi-head attention kernel runs one thread block per query head"),
    Engine("TensorRT-LLM trtllm-bench", r"trtllm-bench", batching="inflight",
           source="trtllm-bench offline runs: in-flight batching with the XQA generation kernel "
                  "(TensorRT-LLM docs/source/performance/perf-overview.md)"),
    Engine("FlexGen", r"FlexGen", flash_attention=False,
           source="FlexGen (github.com/FMInference/FlexiGen) computes attention with PyTorch matmuls and softmax"),
)
DEFAULT_ENGINE = Engine("default", "", source="fused attention, GQA-aware decode, static batches")


@dataclass(frozen=True)
class MeasuredRow:
    """One scored measurement (``line`` is its line number in the file; the header is line 1)."""

    line: int
    id: str
    model: str
    hardware: str
    devices: int
    tp: int
    pp: int
    batch: int | str
    prompt_len: int
    gen_len: int
    weights: str
    activations: str
    kv: str
    metric: str
    value: float
    framework: str = ""
    overrides: dict = field(default_factory=dict)


@dataclass
class Case:
    """A measured row made ready to predict: resolved batch, offload policy and engine."""

    row: MeasuredRow
    model: object
    device: object
    columns: dict         # the design point (scalars), batch resolved and offload chosen
    engine: Engine
    kv_group: float       # query heads per K/V head on one device

    @property
    def batch(self) -> int:
        return int(self.columns["batch"])

    @property
    def offload(self) -> str:
        return self.columns["offload"]

    def efficiency(self, eff: Efficiency) -> Efficiency:
        """The efficiency this row runs with: ``eff`` plus its engine's attention and
        batching behaviour (the ideal bound stays the ideal bound)."""
        if eff is IDEAL or eff.name == "ideal":
            return eff
        return replace(eff, attention_kv_reads=1.0 if self.engine.gqa_kv_sharing else max(self.kv_group, 1.0),
                       prefill_decode_overlap=eff.prefill_decode_overlap if self.engine.batching == "inflight"
                       else 0.0)


def default_measured() -> Path:
    """The measured results dse ships (``data/measured_calibration.csv``: the rows the shipped
    calibration was fitted on, each citing its source); DseError when missing."""
    return shipped_file("data", "measured_calibration.csv", what="the measured results")


# --------------------------------------------------------------------------- reading

def _int(text: str, what: str) -> int:
    try:
        v = float(text)
    except (TypeError, ValueError):
        raise ValueError(f"{what} '{text}' is not a number") from None
    if not math.isfinite(v) or v != int(v) or v <= 0:
        raise ValueError(f"{what} must be a positive integer, got '{text}'")
    return int(v)


def _yes_no(text: str, what: str) -> bool:
    t = text.strip().lower()
    if t in ("yes", "true", "1", "y"):
        return True
    if t in ("no", "false", "0", "n"):
        return False
    raise ValueError(f"{what} must be yes or no, got '{text}'")


def read_measured(path) -> tuple[list[MeasuredRow], list[dict]]:
    """(scored rows, context rows) of a measured-results CSV.

    DseError naming the file and every bad row (line number) when columns are missing
    or values cannot be used: unknown model, hardware, format or metric, non-numeric or
    non-positive numbers."""

    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise DseError(f"{p}: cannot read measured results: {getattr(e, 'strerror', None) or e}") from None
    reader = csv.DictReader(text.splitlines())
    header = [h.strip() for h in (reader.fieldnames or [])]
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise DseError(f"{p}: missing column(s) {', '.join(missing)}; required: {', '.join(REQUIRED)}")
    known_models: dict[str, str | None] = {}
    known_hw: dict[str, str | None] = {}

    def check(cache, name, loader):
        if name not in cache:
            try:
                loader(name)
                cache[name] = None
            except DseError as e:
                cache[name] = str(e).split(";")[0]
        if cache[name]:
            raise ValueError(cache[name])

    rows, context, bad = [], [], []
    for i, raw in enumerate(reader, start=2):
        r = {(k or "").strip(): (v or "").strip() if isinstance(v, str) else "" for k, v in raw.items()}
        if r.get("scored", "yes").lower() in ("no", "false", "0"):
            context.append({"line": i, **r})
            continue
        errs = []

        def take(fn, *a):
            try:
                return fn(*a)
            except ValueError as e:
                errs.append(str(e))
                return None
        take(check, known_models, r["model_slug"], load_model)
        take(check, known_hw, r["hardware_slug"], load_device)
        devices = take(_int, r["devices"], "devices")
        tp = take(_int, r["tp"], "tp") if r.get("tp") else None
        pp = take(_int, r["pp"], "pp") if r.get("pp") else None
        batch = "max" if r["batch"].lower() == "max" else take(_int, r["batch"], "batch")
        prompt = take(_int, r["prompt_len"], "prompt_len")
        gen = take(_int, r["gen_len"], "gen_len")
        for key in ("weights", "activations", "kv"):
            try:
                get_format(r[key], f"{key} format")
            except DseError as e:
                errs.append(str(e).split(";")[0])
        if r["metric"] not in METRICS:
            errs.append(f"unknown metric '{r['metric']}'")
        try:
            value = float(r["value"])
            if not math.isfinite(value) or value <= 0:
                errs.append(f"value must be a positive number, got '{r['value']}'")
        except ValueError:
            errs.append(f"value '{r['value']}' is not a number")
            value = None
        overrides = {}
        for key in ("flash_attention", "gqa_kv_sharing"):
            if r.get(key):
                v = take(_yes_no, r[key], key)
                if v is not None:
                    overrides[key] = v
        if r.get("batching"):
            if r["batching"] in ("static", "inflight"):
                overrides["batching"] = r["batching"]
            else:
                errs.append(f"batching must be static or inflight, got '{r['batching']}'")
        if devices is not None and not errs:
            tp = tp or (devices // (pp or 1))
            pp = pp or 1
            if tp * pp != devices:
                errs.append(f"tp {tp} x pp {pp} does not equal devices {devices}")
        if errs:
            bad.append(f"line {i}: " + ", ".join(errs))
            continue
        rows.append(MeasuredRow(i, r.get("id") or f"line{i}", r["model_slug"], r["hardware_slug"], devices, tp, pp,
                                batch, prompt, gen, r["weights"], r["activations"], r["kv"], r["metric"], value,
                                r.get("framework", ""), overrides))
    if bad:
        raise DseError(f"{p}: {len(bad)} bad row(s): " + "; ".join(bad))
    if not rows:
        raise DseError(f"{p}: no scored rows to validate")
    return rows, context


def engine_of(row: MeasuredRow) -> Engine:
    """The engine profile of a row: the first of ENGINES matching its framework, then the
    row's own overrides."""
    eng = next((e for e in ENGINES if row.framework and re.search(e.pattern, row.framework)), DEFAULT_ENGINE)
    return replace(eng, **row.overrides) if row.overrides else eng


# --------------------------------------------------------------------------- predicting

def row_columns(row: MeasuredRow, engine: Engine) -> dict:
    """The design point of a measured row (scalars). The row's context is what it measured: an
    engine that served prompt + generation past the config's ``max_position_embeddings``
    (GPT-J at 2048 + 128 in TensorRT-LLM's tables) ran it with a longer context."""
    return {"model": row.model, "hardware": row.hardware, "batch": row.batch, "prompt_len": row.prompt_len,
            "gen_len": row.gen_len, "weights": row.weights, "activations": row.activations, "kv": row.kv,
            "flash_attention": engine.flash_attention, "tp": row.tp, "pp": row.pp, "offload": "none",
            "max_context": row.prompt_len + row.gen_len}


def table_of(points: list[dict]) -> dict:
    """Columns of a list of design points (dicts of scalars with the same keys)."""
    return {k: np.array([p[k] for p in points], dtype=object if isinstance(points[0][k], str) or k == "batch"
                        else None) for k in points[0]}


def prepare_all(rows: list[MeasuredRow]) -> tuple[list[Case], list[tuple[MeasuredRow, str]]]:
    """(cases, unpredictable rows with the reason): every row's batch resolved (``max``:
    the largest that fits in the devices' memory, never grown into host memory) and, for a
    row that does not fit, greedy overflow to the host tier; one evaluation of all rows."""

    engines = [engine_of(r) for r in rows]
    points = [row_columns(r, e) for r, e in zip(rows, engines)]
    ev = evaluate(table_of(points), ideal=True)
    greedy = []
    for i, p in enumerate(points):
        p["batch"] = int(ev["batch_used"][i])
        if not ev.feasible[i] and int(ev.reason[i]) in MEMORY_CODES:
            p["offload"] = "greedy"
            greedy.append(i)
    why = {i: ev.reason_text(i) for i in range(len(rows)) if not ev.feasible[i] and i not in greedy}
    if greedy:
        ev2 = evaluate(table_of([points[i] for i in greedy]), ideal=True)
        for j, i in enumerate(greedy):
            if ev2.feasible[j]:
                continue
            if int(ev2.reason[j]) not in MEMORY_CODES:
                why[i] = f"does not fit in device memory and cannot overflow to the host: {ev2.reason_text(j)}"
            else:
                host = ev2["offloaded_bytes"][j] * ev2["devices"][j]
                why[i] = (f"does not fit even with greedy overflow to the host: {ev2.reason_text(j)} (per device: "
                          f"weights {bytes_text(ev2['weights_bytes'][j])}, KV cache "
                          f"{bytes_text(ev2['kv_cache_bytes'][j])}, activations "
                          f"{bytes_text(ev2['activation_bytes'][j])}; {bytes_text(host)} to the host; "
                          f"tiers below the host memory, such as disk, are not modelled)")
    cases, skipped = [], []
    for i, (r, e, p) in enumerate(zip(rows, engines, points)):
        if i in why:
            skipped.append((r, why[i]))
            continue
        model = load_model(r.model)
        group = 1.0 if model.is_mla else (model.num_heads / r.tp) / kv_heads_per_device(model, r.tp)
        cases.append(Case(r, model, load_device(r.hardware), p, e, group))
    return cases, skipped


class Predictions:
    """The prepared rows of ``cases`` as one plan: ``values(eff)`` predicts each row's
    measured metric under an efficiency (each row with its engine's behaviour), through
    the one evaluator; the plan is built once, so a fit prices it many times cheaply."""

    def __init__(self, cases: list[Case]):
        self.cases = cases
        self.plan = prepare(table_of([c.columns for c in cases]))
        self.metric = [c.row.metric for c in cases]

    def evaluation(self, eff: Efficiency | None, ideal: bool = False, calibration: Path | None = None):
        """The Evaluation of every row under ``eff`` (None: each row's class default, from the
        calibration file ``calibration`` when given)."""
        if ideal:
            return self.plan.run(ideal=True)
        memo: dict = {}
        effs = []
        for c in self.cases:
            base = eff or efficiency_for(c.device, str(calibration) if calibration else None)
            key = (id(base), c.engine.gqa_kv_sharing, c.engine.batching, c.kv_group)
            if key not in memo:
                memo[key] = c.efficiency(base)
            effs.append(memo[key])
        return self.plan.run(efficiency=effs)

    def values(self, eff: Efficiency | None = None, ideal: bool = False) -> np.ndarray:
        ev = self.evaluation(eff, ideal)
        return np.array([ev[m][i] for i, m in enumerate(self.metric)], dtype=float)


@dataclass
class Validation:
    """Per-row results, unpredictable rows and context rows of one validation run."""

    path: Path
    efficiency: str
    rows: list[dict]
    unpredictable: list[tuple[MeasuredRow, str]]
    context: list[dict]


#: steps of ``validate`` reported to its ``progress`` (rows prepared, rows predicted)
VALIDATE_STEPS = 2


def validate(path=None, *, ideal: bool = False, efficiency: Efficiency | None = None,
             cases: list[Case] | None = None, skipped=None, calibration: Path | None = None,
             progress=None) -> Validation:
    """Predict every scored row of ``path`` (default: ``default_measured()``) under ``efficiency``,
    else the class defaults of the calibration file ``calibration`` (default: the one in use).
    ``progress`` (a tqdm-like object, optional) is advanced by one per step (``VALIDATE_STEPS``)."""
    p = Path(path) if path else default_measured()
    rows, context = read_measured(p)
    if cases is None:
        cases, skipped = prepare_all(rows)
    _advance(progress)
    out = []
    if cases:
        ev = Predictions(cases).evaluation(efficiency, ideal, calibration)
        for i, c in enumerate(cases):
            out.append(result_row(c, float(ev[c.row.metric][i]), ev.efficiency_name(i)))
    _advance(progress)
    names = sorted({r["efficiency"] for r in out}) or ["ideal" if ideal else "default"]
    return Validation(p, ", ".join(names), out, list(skipped or []), context)


def _advance(progress, n: int = 1) -> None:
    """Advance a tqdm-like ``progress`` by ``n`` steps (nothing without one)."""
    if progress is not None:
        progress.update(n)


def result_row(case: Case, predicted: float, eff_name: str = "") -> dict:
    r = case.row
    err = predicted / r.value - 1.0
    latency = r.metric in LATENCY_METRICS
    return {
        "id": r.id, "line": r.line, "model": r.model, "hardware": r.hardware, "devices": r.devices,
        "batch": case.batch, "batch_given": str(r.batch), "prompt_len": r.prompt_len,
        "gen_len": r.gen_len, "formats": f"{r.weights}/{r.activations}/{r.kv}", "metric": r.metric,
        "measured": r.value, "predicted": predicted, "error": err, "ape": abs(err),
        "optimistic": (err < 0) if latency else (err > 0), "offload": case.offload,
        "engine": case.engine.name, "efficiency": eff_name,
    }


# --------------------------------------------------------------------------- statistics

def ape_stats(apes) -> dict:
    a = np.asarray(list(apes), dtype=float)
    if a.size == 0:
        return {"n": 0, "median_ape": float("nan"), "p90_ape": float("nan"), "max_ape": float("nan")}
    return {"n": int(a.size), "median_ape": float(np.median(a)), "p90_ape": float(np.percentile(a, 90)),
            "max_ape": float(a.max())}


def summarize(rows: list[dict]) -> dict:
    """Median and 90th-percentile absolute percentage error: overall, per metric, per
    hardware and per model."""
    out = {"overall": ape_stats(r["ape"] for r in rows)}
    for key in ("metric", "hardware", "model"):
        groups: dict[str, list] = {}
        for r in rows:
            groups.setdefault(r[key], []).append(r["ape"])
        out[key] = {k: ape_stats(v) for k, v in sorted(groups.items())}
    return out


def bound_violations(rows: list[dict]) -> list[dict]:
    """Rows of an ideal run whose measurement beats the bound (throughput above it,
    latency below it), beyond a 1e-9 relative tolerance."""
    return [r for r in rows if (r["measured"] > r["predicted"] * (1 + 1e-9) if r["metric"] not in LATENCY_METRICS
                                else r["measured"] < r["predicted"] * (1 - 1e-9))]


# --------------------------------------------------------------------------- reporting

def _pct(x: float) -> str:
    return "-" if x != x else f"{100 * x:.1f}%"


def report_text(v: Validation, stats: dict | None = None) -> str:
    stats = stats or summarize(v.rows)
    cols = [("id", "id", str), ("model", "model", str), ("hardware", "hardware", str),
            ("devices", "dev", str), ("batch", "batch", str), ("prompt_len", "prompt", str),
            ("gen_len", "gen", str), ("metric", "metric", str), ("measured_text", "measured", str),
            ("predicted_text", "predicted", str), ("error", "error", lambda x: f"{100 * x:+.1f}%"),
            ("offload", "offload", str), ("engine", "engine", str)]
    shown = [{**r, "measured_text": display.quantity_text(r["metric"], r["measured"]),
              "predicted_text": display.quantity_text(r["metric"], r["predicted"])} for r in v.rows]
    out = [f"Predicted vs measured: {v.path} ({len(v.rows)} rows, {v.efficiency} efficiency)", "",
           display.text_table(shown, cols, left=("model", "hardware", "metric", "offload", "engine"))]
    if v.unpredictable:
        out += ["", f"Unpredictable rows ({len(v.unpredictable)})"]
        out += [f"  {r.id} (line {r.line}) {r.model} on {r.devices}x {r.hardware}: {why}" for r, why in v.unpredictable]
    out += ["", "Absolute percentage error (APE)"]
    rows = [{"group": "all rows", **stats["overall"]}]
    for key in ("metric", "hardware", "model"):
        rows += [{"group": f"{key} {k}", **s} for k, s in stats[key].items()]
    out.append(display.text_table(rows, [("group", "group", str), ("n", "n", str),
                                         ("median_ape", "median", _pct), ("p90_ape", "p90", _pct),
                                         ("max_ape", "max", _pct)]))
    return "\n".join(out)


def write_outputs(v: Validation, out_dir, stats: dict | None = None) -> dict[str, Path]:
    """validation.csv, summary.md and predicted_vs_measured.png in ``out_dir``."""
    d = Path(out_dir)
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DseError(f"cannot create output folder {d}: {e.strerror}") from None
    stats = stats or summarize(v.rows)
    paths = {"csv": d / "validation.csv", "summary": d / "summary.md", "plot": d / "predicted_vs_measured.png"}
    rows = v.rows + [{"id": r.id, "line": r.line, "model": r.model, "hardware": r.hardware, "devices": r.devices,
                      "metric": r.metric, "measured": r.value, "unpredictable": why} for r, why in v.unpredictable]
    keys = list(v.rows[0]) + ["unpredictable"] if v.rows else ["id", "line", "unpredictable"]
    paths["csv"].write_text(display.csv_text(rows, keys))
    paths["summary"].write_text("```\n" + report_text(v, stats) + "\n```\n")
    validation_plot(paths["plot"], v.rows, title=f"{v.path.name}: {v.efficiency} efficiency")
    return paths
