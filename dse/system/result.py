"""What ``evaluate`` returns: the metric names (``METRICS``, SI units), the ``Evaluation`` of a
table of design points (metric arrays, feasibility, reasons, violations, explanations) and
``Reordered``, the metric arrays put back in the caller's order when first read."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from basis.units import bytes_text
from dse.core.bands import FAMILIES as BAND_FAMILIES
from dse.core.serving import CLASS_PERCENTILES, PERCENTILES
from dse.system import reasons as R
from dse.system.columns import Columns
from dse.system.hardware import design_codes
from dse.system.params import PARAMS
from hwmodels.formats import get_format, matmul_compute_class
from workloads.lengths import FIXED, parse_lengths
from workloads.model import context_limit, load_model

#: what every design point gets (SI units); the first ones are serving metrics
METRICS = ("ttft_s", "tpot_s", "e2e_latency_s", "output_tokens_per_s", "output_tokens_per_s_per_user",
           "output_tokens_per_s_per_device", "prefill_tokens_per_s", "weights_bytes", "kv_cache_bytes",
           "activation_bytes", "memory_bytes", "capacity_bytes", "offloaded_bytes", "engine_reserve_bytes",
           "kv_pool_bytes", "devices", "power_w",
           "cost_usd", "system_tdp_w", "power_demand_w", "energy_per_token_j", "tokens_per_joule",
           "cost_per_million_tokens_usd", "die_area_mm2", "build_cost_usd", "batch_used", "tp_used", "pp_used", "chips_required", "requests_per_s", "total_tokens_per_s",
           "queue_s", "running_batch", "kv_utilization",
           *(f"{m}_p{q}_s" for m in ("ttft", "tpot", "e2e_latency") for q in PERCENTILES), "goodput",
           "goodput_per_device", "replicas", "service_devices", "service_cost_usd", "service_power_w", "service_tdp_w",
           *(f"band_{f}_{end}" for f in BAND_FAMILIES for end in ("low", "high")), "tokens_per_target_step",
           "quality_loss", "moe_imbalance", "moe_dropped_fraction", "state_bytes",
           "prefill_time_share", "capital_usd", "cost_per_mtok_input_usd", "cost_per_mtok_output_usd",
           "tokens_per_dollar", "tco_usd_per_hour", "clock_fraction", "energy_band_low", "energy_band_high",
           "ttft_high_s", "ttft_low_s", "tpot_high_s", "tpot_low_s", "dropped_share", *CLASS_PERCENTILES)
#: the latency metrics that have percentiles (``ttft_p90_s``, ...)
PERCENTILE_METRICS = ("ttft", "tpot", "e2e_latency")


#: built-in checks whose violations are kept as numbers (<= 0: satisfied)
CHECKS = ("memory", "support")


class Reordered(Mapping):
    """Metric arrays computed in the evaluator's held order (points grouped by workload),
    each put back in the caller's order when first read (``back``: the held position of
    each caller position): a caller that reads a few metrics of many points does not pay
    for reordering the others. Reading every one (``dict(...)``, ``items()``) reorders all."""

    def __init__(self, held: dict, back: np.ndarray):
        self._held, self._back, self._done = held, back, {}

    def __getitem__(self, name: str) -> np.ndarray:
        v = self._done.get(name)
        if v is None:
            v = self._done[name] = self._held[name][self._back]
        return v

    def __iter__(self):
        return iter(self._held)

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, name) -> bool:
        return name in self._held


@dataclass
class Evaluation:
    """What ``evaluate`` returns: one entry per design point of every array.

    ``result["tpot_s"]`` (any of METRICS), ``result["feasible"]``, ``result["reason"]`` (an
    integer code, 0 when feasible; ``reason_keys[code]`` names it) and ``violations`` (one
    array per check and per constraint, <= 0 when satisfied). ``explained`` holds the
    per-operator tables of the points asked for (``explain``). A metric that holds one value
    for every point (NaN where nothing models it, an error band of one engine and device)
    is a read-only array; every other is the caller's own to write into."""

    columns: Columns
    metrics: Mapping[str, np.ndarray]        # a dict, or ``Reordered`` (each reordered when read)
    feasible: np.ndarray
    reason: np.ndarray
    violations: dict
    reason_keys: tuple
    efficiency: np.ndarray
    efficiency_names: list
    failed: dict = field(default_factory=dict)
    labels: dict = field(default_factory=dict)
    details: list = field(default_factory=list)
    explained: dict = field(default_factory=dict)
    flash_attention: np.ndarray | None = None   # FlashAttention as run (the default falls back where no buffer)

    def __len__(self) -> int:
        return len(self.feasible)

    def __getitem__(self, name: str) -> np.ndarray:
        if name == "feasible":
            return self.feasible
        if name == "reason":
            return self.reason
        return self.metrics[name]

    def __contains__(self, name: str) -> bool:
        return name in self.metrics or name in ("feasible", "reason")

    def keys(self):
        return (*self.metrics, "feasible", "reason")

    def reason_key(self, i: int) -> str:
        return self.reason_keys[int(self.reason[i])]

    def reason_labels(self):
        """The reason of every point as a pandas Categorical of keys (missing, stored as null,
        when feasible)."""
        import pandas as pd
        codes = self.reason.astype(np.int64)
        used = np.unique(codes[codes != 0])
        cats = [self.reason_keys[c] for c in used]
        return pd.Categorical.from_codes(np.where(codes == 0, -1, np.searchsorted(used, codes)),
                                         dtype=pd.CategoricalDtype(pd.Index(cats, dtype="str")))

    def detail(self, i: int) -> str | None:
        """The words of the check that failed at point ``i``, where the check gave some."""
        for idx, text in self.details:
            if np.any(idx == i):
                return text
        return None

    def point(self, i: int) -> dict:
        """Parameters (as given; ``flash_attention`` as run, ``flash_attention_given`` whether it
        was given; ``serving_name`` the scheduling as run; ``lengths_clamped``, where request lengths
        were shortened to the context, what was modelled) and resolved layout of point ``i``, and its footprint as text
        (``reasons.SIZE_FIELDS``: '80 GiB', by ``basis.units``) for the reason templates."""
        cols = self.columns
        out = {}
        for k in PARAMS:
            v = cols.raw(k)
            if v is None:
                continue
            v = v if np.ndim(v) == 0 and not hasattr(v, "codes") else np.asarray(v, dtype=object)[i]
            out[k] = v.item() if hasattr(v, "item") else v
        for k, (codes, names) in self.labels.items():
            out[k + "_name"] = names[int(codes[i])]
        trace = parse_lengths(out.get("lengths_name", FIXED))
        if trace.kind == "trace":                 # its means stand for prompt_len and gen_len
            out["prompt_len"], out["gen_len"] = trace.trace_means()
        if trace.kind != "fixed":                 # what the model shortened to fit the context, in words
            limit = _context(str(out.get("model_name") or out["model"]), int(out.get("max_context") or 0))
            note = trace.clamp_note(out["prompt_len"], out["gen_len"], limit or np.inf)
            if note:
                out["lengths_clamped"] = note
        if self.flash_attention is not None:      # as run: the default is unfused without a buffer
            out["flash_attention"] = bool(self.flash_attention[i])
        out["flash_attention_given"] = cols.has("flash_attention")
        m = self.metrics
        given = {k: cols.numbers(k)[i] for k in ("devices", "tp", "pp")}
        out.update({k + "_given": ("?" if np.isnan(v) else int(v)) for k, v in given.items()})
        out.update(devices=int(m["devices"][i]), tp=int(m["tp_used"][i]), pp=int(m["pp_used"][i]),
                   ep=int(cols.numbers("ep")[i]))
        out.update({k: bytes_text(m[v][i]) for k, v in R.SIZE_FIELDS.items()})
        out["format"] = matmul_compute_class(get_format(str(out.get("activations", "fp16"))),
                                             get_format(str(out.get("weights", "fp16"))))
        return out

    def reason_text(self, i: int) -> str:
        """Why point ``i`` is infeasible, in words ('' when feasible)."""
        return R.describe(self.reason_key(i), self.point(i), self.detail(i))

    def efficiency_name(self, i: int) -> str:
        return self.efficiency_names[int(self.efficiency[i])]

    def to_frame(self):
        """A pandas DataFrame: the parameters given, every metric, feasible and reason (keys)."""
        import pandas as pd
        df = pd.DataFrame(index=np.arange(len(self)))
        for k, v in self.columns.given.items():
            df[k] = v if np.ndim(v) or hasattr(v, "codes") else [v] * len(self) if not np.isscalar(v) else v
        for k, v in self.metrics.items():
            df[k] = v
        if (designs := design_codes(self.labels)) is not None:     # beside its preset, what each design is
            df.insert(list(df.columns).index("hardware") + 1, "design", pd.Categorical.from_codes(*designs))
        df["feasible"] = self.feasible
        df["reason"] = self.reason_labels()
        for key in ("kernel_source", "energy_basis"):   # which layer's values priced each point; its power's basis
            if key in self.labels:
                codes, names = self.labels[key]
                df[key] = np.asarray(names, dtype=object)[np.asarray(codes)]
        return df


@lru_cache(maxsize=64)
def _context(model: str, max_context: int) -> int:
    """Tokens a sequence of ``model`` may hold under ``max_context`` (``context_limit``; 0: unchecked)."""
    return context_limit(load_model(model), max_context)
