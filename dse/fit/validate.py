"""Predictions against measured results: read a measured-results CSV, predict every
scored row through the one evaluator and report the error.

Two CSV schemas, one measurement per row (SI units):

- **calibration** (``data/measured_calibration.csv``, shipped): the columns ``model_slug,
  hardware_slug, devices, batch, prompt_len, gen_len, weights, activations, kv, metric, value``
  (``batch`` may be ``max``). Optional: ``id``, ``scored`` (``no`` rows are context only),
  ``tp``/``pp`` (default: all devices tensor parallel), ``framework`` (selects an engine profile,
  below), per-row overrides ``flash_attention`` (yes/no), ``gqa_kv_sharing`` (yes/no),
  ``batching`` (static/inflight: the engine profile's batching when the row is priced as one
  static batch), and the serving columns below. A value that cannot be read (a typo, an unknown
  model) is reported as a bad row, naming its line, and the other rows go on; a value left empty
  (not stated) makes its row unpredictable.
- **gathered** (``data/gathered/*.csv``: a file whose software is in an ``engine`` column, not
  ``framework``): ``model_slug, hardware_slug, devices, engine, prompt_len, gen_len, weights,
  activations, kv, metric, value`` plus optional ``engine_version, serving, concurrency,
  request_rate, num_prompts, dataset, batch, tp, pp``. Metric names are the benchmark clients'
  (``ttft_mean_s``, ``itl_mean_s``, ``ttft_median_s``, ...; ``MEAN_METRICS``,
  ``MEDIAN_METRICS``). Every row the model cannot express is listed as unpredictable with its
  reason; none rejects the file. Lengths that are means of a distribution (non-integers) are
  rounded to the nearest token. Formats left empty take the serving engine's defaults: 16-bit
  weights compute in their own format, and K/V are stored in the model's 16-bit dtype
  (``--kv-cache-dtype auto`` of vLLM and SGLang): the activations' format when 16-bit, else bf16
  (the 8-bit checkpoints shipped here, DeepSeek-V3/R1's block FP8, declare ``torch_dtype``
  bfloat16).

Serving columns (both schemas): ``serving`` (static|continuous), ``concurrency`` (a closed loop:
N requests always in flight), ``request_rate`` (requests/s of an open loop; ``inf``: every
request sent at once), ``num_prompts`` (requests the run sent), and optional engine settings
``kv_block``, ``prefill_chunk``, ``max_running``. A load implies continuous; a continuous row
with no load is a closed loop at its batch; a static row's ``concurrency`` is its batch (a
static benchmark at concurrency N runs batches of N). Without these columns every row is a
static batch, exactly as before they existed.

How a row is predicted:
- Static: ``batch=max`` is the largest batch whose footprint fits in the devices' memory (never
  grown into host memory); a row whose model does not fit on its devices is predicted with
  greedy overflow to the host tier (``analyze --offload greedy``).
- Continuous: through the evaluator's in-flight batching model with the row's load (offload is
  not modelled there). A row's ``num_prompts`` N is the evaluator's ``num_prompts``: a finite open
  loop of N requests arriving faster than the design serves them (``request_rate inf``: all N sent
  at once, a rate of ``ALL_AT_ONCE``) queues and drains (``dse.core.serving.burst_waits``), its
  TTFT and end-to-end latency the wait.
- A row that does not fit even so, or that the model cannot express, is unpredictable, with
  the reason.
- Engine profile (``dse.core.engines``, ``configs/engines.yaml``, matched on the ``framework``
  column, or ``engine`` and ``engine_version``; the default engine when none matches): whether the serving engine fuses attention (FlashAttention-style
  traffic), whether its decode attention reads K/V once per GQA group or once per query head,
  and whether it batches statically or in flight. These describe the measured software, not
  the hardware, and are never fitted.
- ``--ideal`` predicts with the pure roofline bound; every measured throughput should then be
  at or below its prediction and every measured latency at or above it.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from basis.errors import DseError
from basis.files import output_folder, read_csv, write_text_atomic
from basis.shipped import shipped_file
from basis.units import bytes_text
from dse.core.bands import (
    COVERAGE,
    band_engine,
    band_for,
    band_on,
    band_source,
    covered,
    family_of_metric,
    shipped_bands,
)
from dse.core.efficiency import IDEAL, Efficiency, efficiency_for
from dse.core.engines import (
    GENERIC_MEMORY,
    UNFUSED_FALLBACK,
    Engine,
    attention_on,
    default_engine,
    engine_efficiency,
    engine_matching,
    get_engine,
)
from dse.present import display
from dse.present.plots import validation_plot
from dse.system.evaluator import METRICS as EVALUATOR_METRICS
from dse.system.evaluator import evaluate, prepare
from dse.system.params import DEFAULTS, WORKLOAD_PARAMS
from dse.system.reasons import MEMORY_CODES
from hwmodels.formats import get_format
from hwmodels.presets import load_device
from workloads.head_padding import padded_model
from workloads.model import load_model
from workloads.optable import kv_heads_per_device

#: the columns of the calibration schema
REQUIRED = ("model_slug", "hardware_slug", "devices", "batch", "prompt_len", "gen_len", "weights",
            "activations", "kv", "metric", "value")
#: the columns of the gathered schema (recognised by ``engine`` in place of ``framework``)
GATHERED_REQUIRED = ("model_slug", "hardware_slug", "devices", "engine", "prompt_len", "gen_len", "weights",
                     "activations", "kv", "metric", "value")
CALIBRATION, GATHERED = "calibration", "gathered"
#: the evaluator's metrics a measured row may name directly
METRICS = ("ttft_s", "tpot_s", "e2e_latency_s", "output_tokens_per_s", "output_tokens_per_s_per_user",
           "output_tokens_per_s_per_device", "prefill_tokens_per_s", "requests_per_s", "total_tokens_per_s")
#: metrics where smaller is better (the ideal bound is a lower bound); percentiles too (``is_latency``)
LATENCY_METRICS = ("ttft_s", "tpot_s", "e2e_latency_s")
#: benchmark clients' means (vLLM and SGLang ``bench_serving``) -> the evaluator's mean metrics.
#: ``itl_mean_s`` -> ``tpot_s``: the clients' mean ITL is the mean of every inter-token gap of every
#: request pooled, sum(e2e - ttft) / sum(output - 1), and their mean TPOT the mean over requests of
#: (e2e - ttft) / (output - 1). The two are equal when every request has the same output length
#: (fixed lengths, ignore-eos: the rows here that give ITL) and each streamed chunk carries one token,
#: and the evaluator's ``tpot_s`` is that same mean decode time per token of requests of one length.
#: An engine that streams several tokens per chunk (vLLM multi-step scheduling,
#: ``--num-scheduler-steps``; speculative decoding) has fewer, longer gaps: its ITL is not its TPOT
#: (sglang's benchmark_vllm_060 table: vLLM with 10 scheduler steps, median ITL 129 ms, TPOT 14 ms).
MEAN_METRICS = {"ttft_mean_s": "ttft_s", "tpot_mean_s": "tpot_s", "e2e_mean_s": "e2e_latency_s",
                "itl_mean_s": "tpot_s"}
#: benchmark clients' medians -> the evaluator's 50th percentiles (used only where it has them;
#: a median is never predicted by a mean)
MEDIAN_METRICS = {"ttft_median_s": "ttft_p50_s", "tpot_median_s": "tpot_p50_s", "e2e_median_s": "e2e_latency_p50_s"}
_PERCENTILE = re.compile(r"(ttft|tpot|e2e_latency)_p\d+_s")
#: metric families the report gives errors for (the metric name's prefix); the rest are throughputs
FAMILIES = (("TTFT", "ttft_"), ("TPOT", "tpot_"), ("E2E", "e2e_latency_"))
#: the request rate of N requests sent at once (requests/s): their waits within 10^-12 s of an instant burst's
ALL_AT_ONCE = 1e12
#: published mean lengths (prompt, output tokens) of benchmark datasets, for rows that name a dataset
#: but not their lengths; used only when the evaluator has a ``lengths`` column. The means are of the
#: paper's own sample (OPT tokenizer); benchmark clients sample and tokenize differently (SGLang's
#: bench_serving ShareGPT runs with Llama-3's tokenizer average ~224 / ~190 tokens in
#: data/gathered/serving_gpu.csv G035-G038, G061).
DATASET_MEANS = {
    "sharegpt": (161.31, 337.99, "ShareGPT mean lengths of Kwon et al., PagedAttention (SOSP 2023), Fig. 11"),
    "alpaca": (19.31, 58.45, "Alpaca mean lengths of Kwon et al., PagedAttention (SOSP 2023), Fig. 11"),
}
#: metrics of a static batch that the prompt alone decides (a row may leave gen_len empty)
PREFILL_ONLY = ("ttft_s", "ttft_mean_s", "ttft_median_s", "prefill_tokens_per_s")
#: engine settings a row may give for continuous batching (the evaluator's columns)
ENGINE_SETTINGS = ("kv_block", "prefill_chunk", "max_running")
_SIXTEEN_BIT = ("bf16", "fp16")


@dataclass(frozen=True)
class MeasuredRow:
    """One scored measurement (``line`` is its line number in the file; the header is line 1).

    ``metric`` is the evaluator's metric it is compared with, ``metric_given`` the name in the
    file when that differs. Serving: ``concurrency`` requests in a closed loop, or
    ``request_rate`` requests/s (``inf``: all at once) of ``num_prompts`` requests (0: not
    stated); ``settings`` are engine settings for continuous batching (evaluator columns)."""

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
    serving: str = "static"
    concurrency: int = 0
    request_rate: float = 0.0
    num_prompts: int = 0
    metric_given: str = ""
    settings: dict = field(default_factory=dict)
    lengths_from: str = ""
    source: str = ""
    vendor: str = ""

    @property
    def load(self) -> str:
        """The load as text ('' for a static batch): 'concurrency 16', '4 req/s x 1200', 'all 5000 at once'."""
        return load_text(self.serving, self.concurrency, self.request_rate, self.num_prompts)

    def load_columns(self) -> dict:
        """The evaluator's load columns of a continuous row (requests sent all at once: at
        ``ALL_AT_ONCE`` requests/s)."""
        rate = ALL_AT_ONCE if self.request_rate == math.inf else float(self.request_rate)
        return {"concurrency": self.concurrency, "request_rate": rate, "num_prompts": self.num_prompts}


@dataclass(frozen=True)
class RowRef:
    """A row that could not be read into a MeasuredRow: what identifies it in a report."""

    line: int
    id: str
    model: str
    hardware: str
    devices: str
    metric: str
    value: float
    serving: str = ""
    load: str = ""


def load_text(serving: str, concurrency: int, request_rate: float, num_prompts: int) -> str:
    """A load as text ('' for a static batch)."""
    if serving != "continuous":
        return ""
    if request_rate == math.inf:
        return f"all {num_prompts} at once"
    if request_rate:
        return f"{request_rate:g} req/s" + (f" x {num_prompts}" if num_prompts else "")
    return f"concurrency {concurrency}" if concurrency else "no load stated"


class Reason(str):
    """Why a row is unpredictable: its text (the reasons joined by '; '), and ``kinds``, the kind
    of each reason (``reason_key``) for tallies."""

    kinds: tuple = ()


def reason(clauses: list[str], kinds: list[str] | None = None) -> Reason:
    """A Reason of ``clauses``; their kinds are ``kinds`` or each clause's ``reason_key``."""
    why = Reason("; ".join(clauses))
    why.kinds = tuple(dict.fromkeys(kinds or [reason_key(c) for c in clauses]))
    return why


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

    def efficiency(self, eff: Efficiency, parameters: dict | None = None) -> Efficiency:
        """The efficiency this row runs with: the family efficiency ``eff`` under the row's engine
        (``engine_efficiency``) with the engine-side ``parameters`` (None: the calibration's; ``{}``:
        the costs ``eff`` carries, only the engine's attention and batching behaviour). The ideal
        bound stays the ideal bound."""
        if eff is IDEAL or eff.name == "ideal":
            return eff
        return engine_efficiency(eff, self.engine, self.kv_group, parameters=parameters,
                                 family=self.device.efficiency_family)


@dataclass
class Measured:
    """A measured-results file as read: its schema, scored rows, context rows (``scored=no``) and
    rows that cannot be predicted as written (with the reason)."""

    path: Path
    schema: str
    rows: list[MeasuredRow]
    context: list[dict]
    unpredictable: list[tuple[MeasuredRow | RowRef, str]]
    bad: list[str] = field(default_factory=list)    # rows whose values cannot be read: 'FILE: line N: ...'


def default_measured() -> Path:
    """The measured results dse ships (``data/measured_calibration.csv``: the rows the shipped
    calibration was fitted on, each citing its source); DseError when missing."""
    return shipped_file("data", "measured_calibration.csv", what="the measured results")


def measured_files() -> list[Path]:
    """Every measured-results file dse ships: ``data/measured_calibration.csv`` and the gathered
    files ``data/gathered/*.csv`` (each row citing its source)."""
    first = default_measured()
    gathered = first.parent / "gathered"
    return [first] + (sorted(gathered.glob("*.csv")) if gathered.is_dir() else [])


def family_of(metric: str) -> str:
    """The family of an evaluator metric: 'TTFT', 'TPOT' (with one user's token rate, 1 / TPOT),
    'E2E' or 'throughput'."""
    return {"ttft": "TTFT", "tpot": "TPOT", "e2e": "E2E"}.get(family_of_metric(metric), "throughput")


def is_latency(metric: str) -> bool:
    """True for a latency metric (smaller is better; the ideal bound is a lower bound)."""
    return metric.startswith(tuple(prefix for _, prefix in FAMILIES))


# --------------------------------------------------------------------------- reading

def _cell(text: str) -> float:
    """A cell as a number (ASCII only: Python's float() also reads other scripts' digits); ValueError
    otherwise."""
    if not isinstance(text, str) or not text.isascii():
        raise ValueError
    return float(text)


def _got(text: str) -> str:
    """What a cell that is not the number asked for holds, in words that never quote it: 'text that is
    not a number', 'a number that is not finite', 'zero', 'a negative number', 'a fraction'."""
    try:
        v = _cell(text)
    except (TypeError, ValueError):
        return "text that is not a number" if text.strip() else "nothing"
    if not math.isfinite(v):
        return "a number that is not finite"
    return "zero" if v == 0 else "a negative number" if v < 0 else "a fraction" if v != int(v) else "a number out of range"


def _int(text: str, what: str) -> int:
    """A positive integer; ValueError naming the column ``what`` and what is allowed (never the cell)."""
    try:
        v = _cell(text)
    except (TypeError, ValueError):
        v = math.nan
    if not math.isfinite(v) or v != int(v) or v <= 0 or v > 2**53:
        raise ValueError(f"{what}: expected a positive integer, got {_got(text)}")
    return int(v)


def _tokens(text: str, what: str) -> int:
    """A length of the gathered schema in tokens: a mean (non-integer) is rounded to the nearest token."""
    try:
        v = _cell(text)
    except (TypeError, ValueError):
        v = math.nan
    if not math.isfinite(v) or v < 0.5 or v > 2**53:
        raise ValueError(f"{what}: expected a positive number of tokens, got {_got(text)}")
    return int(round(v))


def _rate(text: str, what: str) -> float:
    """A request rate in requests/s: positive, or ``inf`` (every request sent at once)."""
    try:
        v = _cell(text)
    except (TypeError, ValueError):
        v = math.nan
    if not v > 0:
        raise ValueError(f"{what}: expected a positive number or inf, got {_got(text)}")
    return v


def _yes_no(text: str, what: str) -> bool:
    t = text.strip().lower()
    if t in ("yes", "true", "1", "y"):
        return True
    if t in ("no", "false", "0", "n"):
        return False
    raise ValueError(f"{what}: expected yes or no, got {_got(text)}")


def schema_of(header: list[str]) -> str:
    """GATHERED for a file naming its software in ``engine`` (and no ``framework``), else CALIBRATION."""
    return GATHERED if "engine" in header and "framework" not in header else CALIBRATION


def metric_of(name: str) -> tuple[str | None, str]:
    """(the evaluator metric a measured metric name is compared with, '') or (None, the reason
    it cannot be: an unknown name, or a percentile the evaluator does not give)."""
    if name in MEAN_METRICS:
        return MEAN_METRICS[name], ""
    target = MEDIAN_METRICS.get(name, name)
    if name in METRICS or (_PERCENTILE.fullmatch(target) and target in EVALUATOR_METRICS):
        return target, ""
    if _PERCENTILE.fullmatch(target):
        return None, (f"percentile not modelled: '{name}' needs the evaluator's {target}, which it does not "
                      f"give (a median is not predicted by a mean)")
    return None, (f"metric: unknown; allowed: {', '.join(METRICS)}, a client's mean or median (ttft_mean_s, "
                  f"ttft_median_s, ...) or a percentile (ttft_p90_s, ...)")


def target_metric(name: str) -> str:
    """The evaluator metric a measured metric name stands for, whether or not the evaluator gives it."""
    return MEAN_METRICS.get(name) or MEDIAN_METRICS.get(name) or name


class _Reader:
    """Reads the rows of one measured-results file: each row's problems go to ``errors`` (a value
    that cannot be read) or ``gaps`` (a condition not stated or not expressible)."""

    def __init__(self, schema: str):
        self.schema = schema
        self.known: dict[tuple[str, str], str | None] = {}

    def check(self, kind: str, column: str, name: str, loader) -> str | None:
        """None when preset or config ``name`` (the cell of ``column``) loads, else why not, in words
        that never quote the cell: no such name, or (a path) the loader's first clause with the path
        written as 'the file it names'."""
        if (kind, name) not in self.known:
            try:
                loader(name)
                self.known[kind, name] = None
            except DseError as e:
                path_like = "/" in name or name.endswith((".yaml", ".yml", ".json"))
                self.known[kind, name] = (
                    f"{column}: {str(e).split(';')[0].replace(name, 'the file it names')}" if path_like else
                    f"{column}: no {kind} of that name; allowed: the names of 'dse list "
                    f"{'models' if kind == 'model' else kind}' or a path to a {kind} file")
        return self.known[kind, name]

    def read(self, r: dict, line: int) -> tuple[MeasuredRow | None, list[str], list[str]]:
        """(the row, errors, gaps); the row is None when there is either."""
        errors, gaps = [], []

        def take(fn, *a):
            try:
                return fn(*a)
            except ValueError as e:
                errors.append(str(e))
                return None
        self._names(r, errors, gaps)
        devices = take(_int, r["devices"], "devices") if r["devices"] else None
        if not r["devices"]:
            gaps.append("devices not stated")
        tp = take(_int, r["tp"], "tp") if r.get("tp") else None
        pp = take(_int, r["pp"], "pp") if r.get("pp") else None
        prompt, gen, lengths_from = self._lengths(r, take, gaps)
        formats = self._formats(r, errors, gaps)
        metric, value = self._measurement(r, errors, gaps)
        load = self._load(r, take, gaps)
        overrides = self._overrides(r, take, errors, load)
        settings = {k: take(_setting, r[k], k) for k in ENGINE_SETTINGS if r.get(k)}
        if devices is not None and not errors:
            tp = tp or (devices // (pp or 1))
            pp = pp or 1
            if tp * pp != devices:
                errors.append(f"tp {tp} x pp {pp} does not equal devices {devices}")
        if errors or gaps:
            return None, errors, gaps
        framework = r.get("framework") or " ".join(filter(None, (r.get("engine"), r.get("engine_version"))))
        return MeasuredRow(line, r.get("id") or f"line{line}", r["model_slug"], r["hardware_slug"], devices, tp, pp,
                           load["batch"], prompt, gen, *formats, metric, value, framework, overrides,
                           load["serving"], load["concurrency"], load["request_rate"], load["num_prompts"],
                           r["metric"] if r["metric"] != metric else "", settings, lengths_from,
                           source_of(r), r.get("vendor", "").lower()), [], []

    def _names(self, r: dict, errors: list, gaps: list) -> None:
        """The model and hardware: not stated or without a config (gaps in the gathered schema)."""
        for key, text_key, kind, loader in (("model_slug", "model", "model", load_model),
                                            ("hardware_slug", "hardware", "hardware", load_device)):
            if not r[key]:
                said = r.get(text_key)
                gaps.append(f"no {kind} preset for the {text_key} named (no {key})" if said else f"{kind} not stated")
                continue
            problem = self.check(kind, key, r[key], loader)
            if problem:
                (gaps if self.schema == GATHERED else errors).append(problem)

    def _lengths(self, r: dict, take, gaps: list) -> tuple[int | None, int | None, str]:
        """(prompt tokens, output tokens, where they come from when not the row)."""
        read = _tokens if self.schema == GATHERED else _int
        prompt = take(read, r["prompt_len"], "prompt_len") if r["prompt_len"] else None
        gen = take(read, r["gen_len"], "gen_len") if r["gen_len"] else None
        if r["prompt_len"] and r["gen_len"]:
            return prompt, gen, ""
        static = r.get("serving", "").lower() in ("", "static") and not r.get("concurrency") and not r.get("request_rate")
        if r["prompt_len"] and static and r["metric"] in PREFILL_ONLY:
            return prompt, 1, "prefill only: gen_len not needed"
        means = DATASET_MEANS.get(r.get("dataset", "").lower())
        if not r["prompt_len"] and not r["gen_len"] and means and "lengths" in WORKLOAD_PARAMS:
            return int(round(means[0])), int(round(means[1])), means[2]
        missing = [k for k in ("prompt_len", "gen_len") if not r[k]]
        gaps.append("lengths not stated" if len(missing) == 2 else f"lengths not stated ({missing[0]})")
        return None, None, ""

    def _formats(self, r: dict, errors: list, gaps: list) -> tuple:
        """(weights, activations, kv) format names; the gathered schema's defaults for empty ones."""
        names = {k: r[k].replace("_", "-") if self.schema == GATHERED else r[k]
                 for k in ("weights", "activations", "kv")}
        if self.schema == GATHERED:
            names = _engine_default_formats(names)
        for key, name in names.items():
            if not name:
                gaps.append(f"{key} format not stated")
                break               # the later formats' defaults follow from this one
            try:
                get_format(name, f"{key} format")
            except DseError:
                (gaps if self.schema == GATHERED else errors).append(
                    f"{key}: unknown format; allowed: the formats of 'dse list formats'")
        return names["weights"], names["activations"], names["kv"]

    def _measurement(self, r: dict, errors: list, gaps: list) -> tuple[str | None, float | None]:
        """(the evaluator metric, the measured value)."""
        metric, why = metric_of(r["metric"]) if r["metric"] else (None, "metric not stated")
        if why:
            unknown = why.startswith("metric: unknown") and self.schema == CALIBRATION
            (errors if unknown else gaps).append(why)
        value = None
        if not r["value"]:
            gaps.append("value not stated")
            return metric, value
        try:
            value = _cell(r["value"])
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value <= 0:
            errors.append(f"value: expected a positive number, got {_got(r['value'])}")
        return metric, value

    def _load(self, r: dict, take, gaps: list) -> dict:
        """The serving mode, load and batch of a row (see the module's "Serving columns")."""
        serving = r.get("serving", "").lower()
        if serving not in ("", "static", "continuous"):
            take(_bad_choice, "serving", r["serving"], "static or continuous")
        conc = (take(_int, r["concurrency"], "concurrency") if r.get("concurrency") else 0) or 0
        rate = (take(_rate, r["request_rate"], "request_rate") if r.get("request_rate") else 0.0) or 0.0
        prompts = (take(_int, r["num_prompts"], "num_prompts") if r.get("num_prompts") else 0) or 0
        text = r.get("batch", "")
        batch = "max" if text.lower() == "max" else take(_int, text, "batch") if text else None
        if rate == math.inf and conc:      # all at once, at most N in flight: a closed loop at N
            rate = 0.0
        if serving == "static":
            if rate:
                gaps.append("serving static with a request rate")
            elif conc and batch not in (None, conc):
                gaps.append(f"serving static with batch {batch} and concurrency {conc}")
            batch, conc = batch or conc or None, 0
        mode = serving or ("continuous" if conc or rate else "static")
        if conc and rate:
            gaps.append(f"an open loop at {rate:g} req/s capped at concurrency {conc} is not modelled")
        if mode == "continuous" and not conc and not rate:
            if isinstance(batch, int):
                conc = batch
            else:
                gaps.append("continuous serving with no load stated (concurrency, request_rate or batch)")
        if rate == math.inf and not prompts:
            gaps.append("request_rate inf (all requests at once) without num_prompts")
        if mode == "static" and batch is None:
            gaps.append("batch not stated")
        return {"serving": mode, "concurrency": conc if mode == "continuous" else 0, "request_rate": rate,
                "num_prompts": prompts, "batch": batch if mode == "static" else 1}

    def _overrides(self, r: dict, take, errors: list, load: dict) -> dict:
        """Per-row engine overrides; a gathered row batches as its serving column says."""
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
                errors.append(f"batching: expected static or inflight, got {_got(r['batching'])}")
        elif self.schema == GATHERED and r.get("serving"):
            overrides["batching"] = "static" if load["serving"] == "static" else "inflight"
        return overrides


def source_of(r: dict) -> str:
    """A row's source, as a key that groups rows of one publication: its URL (``source_url``) or
    ``source`` text up to the first space or '@' (a commit or a section named after it)."""
    text = r.get("source_url") or r.get("source") or ""
    return re.split(r"[\s@#]", text.strip(), maxsplit=1)[0]


def _setting(text: str, what: str) -> int:
    """An engine setting: a positive integer (``prefill_chunk`` may be 0: whole prompts, prefill-first)."""
    if what == "prefill_chunk" and text.strip() in ("0", "0.0"):
        return 0
    return _int(text, what)


def _bad_choice(key: str, value: str, allowed: str):
    raise ValueError(f"{key}: expected {allowed}, got {_got(value)}")


def _engine_default_formats(names: dict) -> dict:
    """Formats a serving engine uses where a gathered row leaves them empty: 16-bit weights
    compute in their own format; K/V in the model's 16-bit dtype (``--kv-cache-dtype auto``)."""
    out = dict(names)
    if not out["activations"] and out["weights"].lower() in _SIXTEEN_BIT:
        out["activations"] = out["weights"].lower()
    if not out["kv"] and out["activations"]:
        out["kv"] = out["activations"].lower() if out["activations"].lower() in _SIXTEEN_BIT else "bf16"
    return out


def _number(text: str) -> float:
    """``text`` as a finite number, 0 when empty, not a number or not finite (for identifying a row only)."""
    try:
        v = _cell(text or "0")
    except ValueError:
        return 0.0
    return v if math.isfinite(v) and abs(v) < 2**53 else 0.0


def _reference(r: dict, line: int, bad: frozenset = frozenset()) -> RowRef:
    """What identifies a row that could not be read: its names, metric, value and load as written,
    each cell of a column in ``bad`` (one that could not be read) shown as '?', never quoted."""
    r = {k: ("?" if k in bad else v) for k, v in r.items()}
    value = _number(r.get("value")) or float("nan")
    conc, rate = _number(r.get("concurrency")), _number(r.get("request_rate"))
    rate = math.inf if r.get("request_rate", "").strip().lower() == "inf" else rate    # all sent at once
    serving = r.get("serving", "").lower() or ("continuous" if conc or rate else "")
    conc = conc or (_number(r.get("batch")) if serving == "continuous" else 0)
    return RowRef(line, r.get("id") or f"line{line}", r.get("model_slug") or r.get("model", ""),
                  r.get("hardware_slug") or r.get("hardware", ""), r.get("devices", ""), r.get("metric", ""), value,
                  serving, load_text(serving, int(conc), rate, int(_number(r.get("num_prompts")))))


def _columns_of(errors: list[str]) -> frozenset:
    """The columns the errors of a row are about (each error starts with its column: 'devices: ...')."""
    return frozenset(e.split(":", 1)[0] for e in errors if ":" in e)


def read_table(path) -> Measured:
    """The rows of a measured-results CSV, its schema read from its header.

    DseError when the file cannot be read, lacks a required column or has no row to validate. A
    row whose values cannot be read (calibration schema: unknown model, hardware, format or metric,
    non-numeric or non-positive numbers) is reported in ``bad`` and listed as unpredictable, and the
    rest go on; rows that leave a condition unstated (either schema), or that the model cannot
    express (gathered schema), are listed in ``unpredictable``."""
    p = Path(path)
    header, reader = read_csv(p, "measured-results CSV")
    schema = schema_of(header)
    required = GATHERED_REQUIRED if schema == GATHERED else REQUIRED
    missing = [c for c in required if c not in header]
    if missing:
        raise DseError(f"{p}: missing column(s) {', '.join(missing)}; required: {', '.join(required)}")
    rows, context, unpredictable, bad = [], [], [], []
    rd = _Reader(schema)
    for i, raw in enumerate(reader, start=2):
        r = {(k or "").strip(): (v or "").strip() if isinstance(v, str) else "" for k, v in raw.items()}
        if r.get("scored", "yes").lower() in ("no", "false", "0"):
            context.append({"line": i, **r})
            continue
        row, errors, gaps = rd.read(r, i)
        if errors and schema == CALIBRATION:
            bad.append(f"line {i}: " + ", ".join(errors))
            unpredictable.append((_reference(r, i, _columns_of(errors)),
                                  reason([f"bad row: {e}" for e in errors], ["bad row"] * len(errors))))
        elif errors or gaps:
            unpredictable.append((_reference(r, i, _columns_of(errors)), reason(errors + gaps)))
        else:
            rows.append(row)
    if bad and not rows:
        raise DseError(f"{p}: {len(bad)} bad row(s) and none to validate: " + "; ".join(bad[:3])
                       + (f"; and {len(bad) - 3} more" if len(bad) > 3 else ""))
    if not rows and not unpredictable:
        raise DseError(f"{p}: no scored rows to validate")
    return Measured(p, schema, rows, context, unpredictable, [f"{p}: {b}" for b in bad])


def read_measured(path) -> tuple[list[MeasuredRow], list[dict]]:
    """(scored rows, context rows) of a measured-results CSV (``read_table``; rows that cannot
    be predicted as written are left out)."""
    m = read_table(path)
    return m.rows, m.context


def engine_of(row: MeasuredRow) -> Engine:
    """The engine profile of a row: the first profile (``dse.core.engines``) whose pattern matches
    its framework (the default engine when none does), then the row's own overrides; a fused
    attention kernel the row does not ask for falls back to unfused attention on hardware that
    cites no on-chip buffer (``attention_on``)."""
    eng = engine_matching(row.framework) or get_engine("default")
    over = dict(row.overrides)
    if "flash_attention" in over:
        over["attention"] = "fused" if over.pop("flash_attention") else "unfused"
    eng = replace(eng, **over) if over else eng
    return eng if "attention" in over else attention_on(eng, _buffer_of(row.hardware))[0]


def _buffer_of(hardware: str) -> float:
    """The on-chip buffer (bytes) of the preset ``hardware``; NaN where none loads (the row is
    refused for it elsewhere)."""
    try:
        return load_device(hardware).onchip_buffer_bytes
    except DseError:
        return math.nan


# --------------------------------------------------------------------------- predicting

def row_columns(row: MeasuredRow, engine: Engine) -> dict:
    """The design point of a measured row (scalars). The row's context is what it measured: an
    engine that served prompt + generation past the config's ``max_position_embeddings``
    (GPT-J at 2048 + 128 in TensorRT-LLM's tables) ran it with a longer context. A continuous
    row adds its serving mode, load and engine settings."""
    named = engine.name != default_engine() or engine.memory != GENERIC_MEMORY     # else: no engine matched
    cols = {"model": row.model, "hardware": row.hardware, "engine": engine.name if named else "default",
            "batch": row.batch, "prompt_len": row.prompt_len,
            "gen_len": row.gen_len, "weights": row.weights, "activations": row.activations, "kv": row.kv,
            "flash_attention": engine.flash_attention, "tp": row.tp, "pp": row.pp, "offload": "none",
            "max_context": row.prompt_len + row.gen_len}
    if row.serving == "continuous":
        cols.update(serving="continuous", batch=1, **row.load_columns(), **row.settings)
    return cols


def table_of(points: list[dict]) -> dict:
    """Columns of a list of design points (dicts of scalars); a key some points lack takes its
    default there (``dse.system.params.DEFAULTS``)."""
    keys = list(dict.fromkeys(k for p in points for k in p))
    return {k: np.array([p.get(k, DEFAULTS.get(k)) for p in points],
                        dtype=object if isinstance(points[0].get(k, DEFAULTS.get(k)), str) or k == "batch" else None)
            for k in keys}


def _evaluate_each(points: list[dict], **kw) -> tuple[object, list[int], dict[int, str]]:
    """(the Evaluation of the points that evaluate, their positions, {position: the evaluator's
    error}): all points at once, and point by point only when that raises."""
    try:
        return evaluate(table_of(points), **kw), list(range(len(points))), {}
    except DseError:
        pass
    failed = {}
    for i, p in enumerate(points):
        try:
            evaluate(table_of([p]), **kw)
        except DseError as e:
            failed[i] = reason([f"the evaluator refuses it: {e}"])
    good = [i for i in range(len(points)) if i not in failed]
    return (evaluate(table_of([points[i] for i in good]), **kw) if good else None), good, failed


def _greedy_reasons(points: list[dict], greedy: list[int]) -> dict[int, str]:
    """{position: why} of the rows of ``greedy`` that do not fit even with greedy overflow to the host."""
    ev2 = evaluate(table_of([points[i] for i in greedy]), ideal=True)
    why = {}
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
    return why


def prepare_all(rows: list[MeasuredRow]) -> tuple[list[Case], list[tuple[MeasuredRow, str]]]:
    """(cases, unpredictable rows with the reason): every static row's batch resolved (``max``:
    the largest that fits in the devices' memory, never grown into host memory) and, for a
    static row that does not fit, greedy overflow to the host tier; a continuous row as given
    (a finite open loop past what the design serves queues and drains: its number of prompts is
    the evaluator's ``num_prompts``). One evaluation of all rows."""

    engines = [engine_of(r) for r in rows]
    points = [row_columns(r, e) for r, e in zip(rows, engines)]
    why: dict[int, str] = {}
    greedy = []
    if points:
        ev, good, failed = _evaluate_each(points, ideal=True)
        why.update(failed)
        for j, i in enumerate(good):
            if rows[i].serving == "continuous":
                if not ev.feasible[j]:
                    why[i] = reason([f"{ev.reason_key(j)}: {ev.reason_text(j)}"], [ev.reason_key(j)])
                continue
            points[i]["batch"] = int(ev["batch_used"][j])
            if not ev.feasible[j] and int(ev.reason[j]) in MEMORY_CODES:
                points[i]["offload"] = "greedy"
                greedy.append(i)
            elif not ev.feasible[j]:
                why[i] = ev.reason_text(j)
    if greedy:
        why.update(_greedy_reasons(points, greedy))
    cases, skipped = [], []
    for i, (r, e, p) in enumerate(zip(rows, engines, points)):
        if i in why:
            skipped.append((r, why[i]))
            continue
        model, device = load_model(r.model), load_device(r.hardware)
        if e.head_padding:               # the heads the engine runs (AWS Neuron pads them to its cores)
            model = padded_model(model, r.tp * device.shard_cores)
        group = 1.0 if model.is_mla else (model.num_heads / r.tp) / kv_heads_per_device(model, r.tp)
        cases.append(Case(r, model, device, p, e, group))
    return cases, skipped


@dataclass
class Predicted:
    """Predictions of a plan's rows under one efficiency (arrays in case order).

    values: the predicted metric of each row (NaN where ``why`` says why there is none);
    burst: a finite open loop past what the design serves (its requests queued and drained);
    running: the running batch of a continuous row (NaN for a static batch); efficiency: names."""

    values: np.ndarray
    why: dict
    burst: np.ndarray
    running: np.ndarray
    efficiency: list


class Predictions:
    """The prepared rows of ``cases`` as one plan: ``values(eff)`` predicts each row's
    measured metric under an efficiency (each row with its engine's behaviour), through
    the one evaluator; the plan is built once, so a fit prices it many times cheaply."""

    def __init__(self, cases: list[Case]):
        self.cases = cases
        self.plan = prepare(table_of([c.columns for c in cases]))
        self.metric = [c.row.metric for c in cases]

    def efficiencies(self, eff: Efficiency | list | None, calibration: Path | None = None) -> list[Efficiency]:
        """Each row's efficiency: a list of them is taken as it is (one per row, engines already
        applied); ``eff`` with the engine's attention and batching behaviour; None: the row's family
        default under its engine, both from the calibration file ``calibration`` when given."""
        if isinstance(eff, list):
            return eff
        memo: dict = {}
        effs = []
        path = str(calibration) if calibration else None
        for c in self.cases:
            base = eff or efficiency_for(c.device, path)
            key = (id(base), c.engine, c.kv_group, c.device.efficiency_family)
            if key not in memo:
                memo[key] = (c.efficiency(base, {}) if eff is not None else
                             engine_efficiency(base, c.engine, c.kv_group, path=path,
                                               family=c.device.efficiency_family))
            effs.append(memo[key])
        return effs

    def evaluation(self, eff: Efficiency | None, ideal: bool = False, calibration: Path | None = None):
        """The Evaluation of every row under ``eff`` (None: each row's class default, from the
        calibration file ``calibration`` when given)."""
        if ideal:
            return self.plan.run(ideal=True)
        return self.plan.run(efficiency=self.efficiencies(eff, calibration))

    def predict(self, eff: Efficiency | list | None = None, ideal: bool = False,
                calibration: Path | None = None) -> Predicted:
        """Every row's prediction under ``eff`` (as ``evaluation``); a row the design does not run
        under it (a saturated endless open loop) gets NaN and a reason."""
        effs = None if ideal else self.efficiencies(eff, calibration)
        ev = self.plan.run(ideal=True) if ideal else self.plan.run(efficiency=effs)
        n = len(self.cases)
        values = np.array([ev[m][i] for i, m in enumerate(self.metric)], dtype=float)
        running = np.array([ev["running_batch"][i] if c.row.serving == "continuous" else np.nan
                            for i, c in enumerate(self.cases)], dtype=float)
        queue = np.asarray(ev["queue_s"], dtype=float)       # an open loop queues only as a finite run's burst
        burst = np.array([c.row.serving == "continuous" and c.row.num_prompts > 0 and not c.row.concurrency
                          and queue[i] > 0 for i, c in enumerate(self.cases)], dtype=bool)
        why = {}
        for i in np.flatnonzero(~np.asarray(ev.feasible, dtype=bool)):
            i = int(i)
            values[i] = np.nan
            why[i] = reason([f"{ev.reason_key(i)}: {ev.reason_text(i)}"], [ev.reason_key(i)])
        return Predicted(values, why, burst, running, [ev.efficiency_name(i) for i in range(n)])

    def values(self, eff: Efficiency | list | None = None, ideal: bool = False) -> np.ndarray:
        """Each row's predicted metric (``predict``; NaN where the design does not run it)."""
        return self.predict(eff, ideal).values


@dataclass
class Validation:
    """Per-row results, unpredictable rows and context rows of one validation run."""

    path: Path
    efficiency: str
    rows: list[dict]
    unpredictable: list[tuple[MeasuredRow | RowRef, str]]
    context: list[dict]
    schema: str = CALIBRATION
    bad: list[str] = field(default_factory=list)


#: steps of ``validate`` reported to its ``progress`` (rows prepared, rows predicted)
VALIDATE_STEPS = 2


def with_kernel_layer(case: Case, layer: str) -> Case:
    """``case`` with its design point priced by the kernel layer
    ``layer`` (``kernel_layer``: 'fitted' or 'learned')."""
    return replace(case, columns={**case.columns, "kernel_layer": layer})


def validate(path=None, *, ideal: bool = False, efficiency: Efficiency | None = None,
             cases: list[Case] | None = None, skipped=None, calibration: Path | None = None,
             progress=None, kernel_layer: str | None = None) -> Validation:
    """Predict every scored row of ``path`` (default: ``default_measured()``) under ``efficiency``,
    else the class defaults of the calibration file ``calibration`` (default: the one in use),
    each row's kernels priced by ``kernel_layer`` (None: the parameter's default).
    ``progress`` (a tqdm-like object, optional) is advanced by one per step (``VALIDATE_STEPS``).
    Returns a Validation: one result dict per predicted row, the others with their reason."""
    p = Path(path) if path else default_measured()
    measured = read_table(p)
    if cases is None:
        cases, skipped = prepare_all(measured.rows)
    if kernel_layer is not None:
        cases = [with_kernel_layer(c, kernel_layer) for c in cases]
    _advance(progress)
    out, late = [], []
    if cases:
        pr = Predictions(cases).predict(efficiency, ideal, calibration)
        for i, c in enumerate(cases):
            if i in pr.why:
                late.append((c.row, pr.why[i]))
                continue
            out.append(result_row(c, float(pr.values[i]), pr.efficiency[i], running=float(pr.running[i]),
                                  burst=bool(pr.burst[i])))
    _advance(progress)
    names = sorted({r["efficiency"] for r in out}) or ["ideal" if ideal else "default"]
    unpredictable = sorted(measured.unpredictable + list(skipped or []) + late, key=lambda t: t[0].line)
    return Validation(p, ", ".join(names), out, unpredictable, measured.context, measured.schema, measured.bad)


def _advance(progress, n: int = 1) -> None:
    """Advance a tqdm-like ``progress`` by ``n`` steps (nothing without one)."""
    if progress is not None:
        progress.update(n)


def result_row(case: Case, predicted: float, eff_name: str = "", *, running: float = float("nan"),
               burst: bool = False) -> dict:
    """One predicted row: its conditions, measured and predicted value (SI), error = predicted /
    measured - 1, APE, and whether the prediction is optimistic. ``batch``: the static batch, or
    the predicted running batch of a continuous row; ``load``: the load as text."""
    r = case.row
    err = predicted / r.value - 1.0
    continuous = r.serving == "continuous"
    vendor = r.vendor or getattr(case.device, "vendor", "") or ""
    low, high, _ = (band_for(shipped_bands(), band_engine(eff_name, case.engine.name), vendor,
                             family_of_metric(r.metric))
                    if band_source(eff_name) else (math.nan, math.nan, ""))
    low, high = band_on(r.metric, low, high)          # a band on TPOT is one on 1 / tokens per second per user
    load = r.load + (" (past the capacity: queued and drained)" if burst else "")
    return {
        "id": r.id, "line": r.line, "model": r.model, "hardware": r.hardware, "devices": r.devices,
        "batch": int(round(running)) if continuous and math.isfinite(running) else case.batch,
        "batch_given": str(r.batch), "prompt_len": r.prompt_len,
        "gen_len": r.gen_len, "formats": f"{r.weights}/{r.activations}/{r.kv}", "metric": r.metric,
        "measured": r.value, "predicted": predicted, "error": err, "ape": abs(err),
        "optimistic": (err < 0) if is_latency(r.metric) else (err > 0), "offload": case.offload,
        "engine": case.engine.name + (f" ({UNFUSED_FALLBACK})" if _fell_back(case) else ""), "efficiency": eff_name,
        "serving": r.serving, "load": load, "queued": burst, "family": family_of(r.metric), "measured_as": r.metric_given or r.metric,
        "framework": r.framework, "lengths_from": r.lengths_from, "vendor": vendor, "source": r.source,
        "request_rate": r.request_rate, "num_prompts": r.num_prompts, "band_low": predicted * low, "band_high": predicted * high,
        "in_band": bool(covered(r.value, predicted, low, high)) if low == low else "",
    }


def _fell_back(case: Case) -> bool:
    """Whether the case's engine runs unfused attention because its hardware has no on-chip
    buffer for the fused kernel its profile names (``attention_on``), not because the row says so."""
    asked = "flash_attention" in case.row.overrides
    return not asked and bool(attention_on(get_engine(case.engine.name), case.device.onchip_buffer_bytes)[1])


# --------------------------------------------------------------------------- statistics

def ape_stats(apes) -> dict:
    """{n, median_ape, p90_ape, max_ape} of absolute percentage errors (fractions; NaN when none)."""
    a = np.asarray(list(apes), dtype=float)
    if a.size == 0:
        return {"n": 0, "median_ape": float("nan"), "p90_ape": float("nan"), "max_ape": float("nan")}
    return {"n": int(a.size), "median_ape": float(np.median(a)), "p90_ape": float(np.percentile(a, 90)),
            "max_ape": float(a.max())}


def summarize(rows: list[dict]) -> dict:
    """Median and 90th-percentile absolute percentage error: overall, per metric family
    (throughput, TTFT, TPOT, E2E), per metric, per hardware and per model, and per serving mode
    when static and continuous rows are both present."""
    out = {"overall": ape_stats(r["ape"] for r in rows)}
    keys = ["family", "metric", "hardware", "model"]
    if len({r.get("serving", "static") for r in rows}) > 1:
        keys.insert(1, "serving")
    for key in keys:
        groups: dict[str, list] = {}
        for r in rows:
            groups.setdefault(_group_of(r, key), []).append(r["ape"])
        out[key] = {k: ape_stats(v) for k, v in sorted(groups.items())}
    return out


def _group_of(row: dict, key: str) -> str:
    """A result row's group under ``key`` (rows made before families and serving modes were
    recorded take their metric's family and 'static')."""
    if key == "family":
        return row.get("family") or family_of(row["metric"])
    return row.get(key, "static") if key == "serving" else row[key]


def reason_key(clause: str) -> str:
    """The kind of one reason, for tallies: its text before the first ':', '(' or quoted name,
    numbers written N."""
    k = re.split(r"[:('\"]", clause)[0]
    return re.sub(r"\d+(\.\d+)?", "N", k).strip(" ,;")


def tally(unpredictable: list) -> dict[str, int]:
    """{reason kind: rows} of unpredictable rows, most frequent first; a row with several reasons
    (``Reason.kinds``) counts under each, any other reason under the kind of its text."""
    counts: dict[str, int] = {}
    for _, why in unpredictable:
        for k in getattr(why, "kinds", ()) or (reason_key(why),):
            counts[k] = counts.get(k, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def bound_violations(rows: list[dict]) -> list[dict]:
    """Rows of an ideal run whose measurement beats the bound (throughput above it, latency below
    it), beyond a 1e-9 relative tolerance. An open loop's throughput is its offered load, which a
    finite run of N Poisson arrivals realises only within sampling error (relative standard
    deviation 1 / sqrt(N)): its throughput may exceed the ideal by three such deviations. The
    latencies of a finite run past the capacity (``queued``) are not checked: they are the wait in
    its queue, set by how many requests the engine admits at once (its running cap, a software
    setting the ideal roofline does not bound)."""
    def slack(r: dict) -> float:
        open_loop = 0 < r.get("request_rate", 0) < math.inf and r.get("num_prompts")
        return 3.0 / math.sqrt(r["num_prompts"]) if open_loop and not is_latency(r["metric"]) else 0.0
    return [r for r in rows if (r["measured"] > r["predicted"] * (1 + 1e-9 + slack(r)) if not is_latency(r["metric"])
                                else not r.get("queued") and r["measured"] < r["predicted"] * (1 - 1e-9))]


# --------------------------------------------------------------------------- reporting

def _pct(x: float) -> str:
    return "-" if x != x else f"{100 * x:.1f}%"


def _has_serving(v: Validation) -> bool:
    """True when any row, predicted or not, is under continuous batching."""
    return any(r.get("serving") == "continuous" for r in v.rows) or any(
        getattr(r, "serving", "") == "continuous" for r, _ in v.unpredictable)


def _unpredictable_lines(v: Validation) -> list[str]:
    """The unpredictable rows, one line each, and their reasons tallied."""
    out = ["", f"Unpredictable rows ({len(v.unpredictable)})"]
    for r, why in v.unpredictable:
        load = getattr(r, "load", "")
        where = f", {r.serving} {load}" if load else ""
        metric = f", {r.metric}" if _has_serving(v) else ""
        out.append(f"  {r.id} (line {r.line}) {r.model} on {r.devices}x {r.hardware}{where}{metric}: {why}")
    if _has_serving(v):
        out += ["", "Unpredictable rows by reason (a row with several reasons counts under each)"]
        out += [f"  {n:4d}  {k}" for k, n in tally(v.unpredictable).items()]
    return out


def report_text(v: Validation, stats: dict | None = None) -> str:
    """The report: every predicted row (with serving mode and load when any row is continuous),
    the unpredictable rows with their reasons, and the APE table (overall, per family, ...)."""
    stats = stats or summarize(v.rows)
    cols = [("id", "id", str), ("model", "model", str), ("hardware", "hardware", str),
            ("devices", "dev", str), ("batch", "batch", str), ("prompt_len", "prompt", str),
            ("gen_len", "gen", str), ("metric", "metric", str), ("measured_text", "measured", str),
            ("predicted_text", "predicted", str), ("error", "error", lambda x: f"{100 * x:+.1f}%"),
            ("offload", "offload", str), ("engine", "engine", str)]
    left = ("model", "hardware", "metric", "offload", "engine")
    if _has_serving(v):
        cols[4:5] = [("serving", "serving", str), ("load", "load", str), ("batch", "batch", str)]
        cols[-2:-1] = [("measured_as", "measured as", str), ("offload", "offload", str)]
        left = ("model", "hardware", "serving", "load", "metric", "measured_as", "offload", "engine")
    shown = [{**r, "measured_text": display.quantity_text(r["metric"], r["measured"]),
              "predicted_text": display.quantity_text(r["metric"], r["predicted"])} for r in v.rows]
    out = [f"Predicted vs measured: {v.path} ({len(v.rows)} rows, {v.efficiency} efficiency)", "",
           display.text_table(shown, cols, left=left)]
    if v.unpredictable:
        out += _unpredictable_lines(v)
    banded = [r for r in v.rows if r.get("in_band") != ""]
    if banded:
        inside = sum(bool(r["in_band"]) for r in banded)
        out += ["", f"Error bands: {inside} of {len(banded)} measured rows ({100 * inside / len(banded):.0f} %) lie "
                    f"within the band of their prediction (bands are made to cover {100 * COVERAGE:.0f} % of rows they "
                    f"did not see: dse.core.bands)"]
    out += ["", "Absolute percentage error (APE)"]
    rows = [{"group": "all rows", **stats["overall"]}]
    for key in [k for k in stats if k != "overall"]:
        rows += [{"group": f"{key} {k}", **s} for k, s in stats[key].items()]
    out.append(display.text_table(rows, [("group", "group", str), ("n", "n", str),
                                         ("median_ape", "median", _pct), ("p90_ape", "p90", _pct),
                                         ("max_ape", "max", _pct)]))
    return "\n".join(out)


def write_outputs(v: Validation, out_dir, stats: dict | None = None) -> dict[str, Path]:
    """validation.csv, summary.md and predicted_vs_measured.png in ``out_dir``, each written
    atomically; returns their paths."""
    d = output_folder(out_dir)
    stats = stats or summarize(v.rows)
    paths = {"csv": d / "validation.csv", "summary": d / "summary.md", "plot": d / "predicted_vs_measured.png"}
    rows = v.rows + [{"id": r.id, "line": r.line, "model": r.model, "hardware": r.hardware, "devices": r.devices,
                      "metric": r.metric, "measured": r.value, "serving": getattr(r, "serving", ""),
                      "load": getattr(r, "load", ""), "unpredictable": why} for r, why in v.unpredictable]
    keys = list(v.rows[0]) + ["unpredictable"] if v.rows else ["id", "line", "model", "hardware", "devices",
                                                               "metric", "measured", "serving", "load",
                                                               "unpredictable"]
    write_text_atomic(paths["csv"], display.csv_text(rows, keys))
    write_text_atomic(paths["summary"], "```\n" + report_text(v, stats) + "\n```\n")
    validation_plot(paths["plot"], v.rows, title=f"{v.path.name}: {v.efficiency} efficiency")
    return paths
