"""Serving-engine profiles: what the software that runs a model does that costs time.

A profile (``configs/engines.yaml``, every attribute with its source) says how an engine batches
(static or in flight), whether its decode kernels are replayed from a captured graph or compiled
program (``graphs``: the launch class; ``compiled``: the whole step one program compiled ahead
of time, which launches no kernel), whether attention is one fused kernel, whether decode
attention reads each K/V head once per GQA group, and its all-reduce algorithm. The times these
cost are fitted parameters of the calibration (``configs/calibration.yaml``):

- ``launch.<graphs|eager>.op_overhead_s``: fixed time per operator instance (an engine of the
  ``compiled`` class pays none: no kernel is launched, and nothing of it is fitted; fitted on the
  AWS Neuron rows, 204 of them, its cost went to its 10 ns floor, 2026-11-29);
- ``allreduce.<one-shot|ring>.collective_latency_s``: software latency of one all-reduce;
- ``engines.<name>``: the engine's own scheduler cost per step (``step_overhead_s``), per
  request (``request_overhead_s``) and, where its rows show it, the share of the hardware's
  achievable bandwidth and compute its kernels reach (``memory_scale``, ``compute_scale``).

A profile may also say what the engine does with device memory (``memory``, each figure with its
source, ``EngineMemory``): the share of device memory it lets itself use (vLLM's
``gpu_memory_utilization``, SGLang's ``mem_fraction_static``, TensorRT-LLM's
``free_gpu_memory_fraction``) and the tokens it prefills an iteration (``prefill_chunk``: vLLM's
``max_num_batched_tokens``, llama.cpp's ``n_ubatch``). ``reserve_bytes`` is what it keeps back;
``chunked_prefill`` whether a prompt of so many tokens is prefilled in chunks. A profile without
one keeps no reserve and prefills whole prompts, as does the engine a point gets without naming one
(``default``: the generic footprint, the whole device memory).

``engine_efficiency`` turns a hardware family's Efficiency (``dse.core.efficiency``: the kernel
layer, never fitted end to end) into the Efficiency of that hardware under one engine (the engine
layer); it is the only place the two are combined. An engine with fitted values of its own
(``calibrate`` fits an engine with ``dse.fit.calibrate.MIN_ROWS`` rows or more) is a
"calibrated engine"; any other is a "prior engine": neutral scales (1.0) and no scheduler or
request cost beyond its launch and all-reduce classes' (``NEUTRAL``), its band the wide band of
engines predicted without rows of their own (``dse.core.bands``). It never takes another engine's
fit. The Efficiency's name says which ("prior gpu + calibrated engine vllm", "prior gpu + prior
engine tgi"), and names an engine value that ended on its fit's bound (``at_bound`` section).

A prior engine's kernels may reach a cited share of what a hardware family's kernel layer says
(``kernel_scales``: ``{family: {memory_scale | compute_scale: value}}``, each with its source):
achieved bandwidth depends on the kernel library, and a family's fraction is what its best library
reaches. llama.cpp's Metal kernels read weights at 0.55-0.59 of an Apple GPU's bandwidth where MLX's
reach 0.83-0.95 of it: the Apple family says 0.90, llama.cpp's profile 0.61 of that on Apple. The
name says so ("prior apple + prior engine llama.cpp (memory_scale 0.61 cited on apple)"); a fit of
the engine's own on the family's rows replaces it.

An engine's fitted values hold only on the hardware families its calibration rows covered (the
calibration's ``engine_families`` section, ``{engine: [family, ...]}``, written by ``calibrate``):
on any other family the engine is a prior engine there ("prior cpu + prior engine vllm (fitted on
gpu only)"): vLLM's scales fitted on GPU rows never derate a CPU. A calibration file without the
section (written before it) applies each engine's values to every family, as it did then.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from basis.errors import DseError
from basis.shipped import shipped
from basis.yamlfile import load_yaml
from dse.core.efficiency import FAMILY_PRIORS, Efficiency, calibration_file, load_calibration

#: the shipped engine profiles (package data in a wheel)
ENGINES_FILE = shipped("configs", "engines.yaml")
BATCHING = ("static", "inflight")
ATTENTION = ("fused", "unfused")
ALLREDUCE = ("one-shot", "ring", "none")
LAUNCH = ("graphs", "eager", "compiled")
#: the launch class of an engine whose whole step is one program compiled ahead of time (XLA,
#: Neuron, a statically scheduled chip): no kernel launches, so no cost per operator
COMPILED = "compiled"
#: parameters an engine fits for itself (``engines`` section of the calibration)
ENGINE_PARAMS = ("step_overhead_s", "request_overhead_s", "memory_scale", "compute_scale", "prefill_decode_overlap")
#: the engine's costs that a family Efficiency may also carry (a calibration written before engine
#: profiles fitted them per family): where no engine-side value is fitted, the family's stays
COSTS = ("op_overhead_s", "collective_latency_s", "step_overhead_s", "request_overhead_s")
#: a prior engine's values (no fit of its own): its kernels reach what the kernel layer says
#: (scales 1.0), no scheduler or request cost beyond its launch and all-reduce classes', no
#: prefill hidden under decode; its uncertainty is the band of unseen engines (``dse.core.bands``)
NEUTRAL = {"memory_scale": 1.0, "compute_scale": 1.0, "step_overhead_s": 0.0, "request_overhead_s": 0.0,
           "prefill_decode_overlap": 0.0}
#: the words an Efficiency's name uses for the engine layer's two kinds of values
CALIBRATED, PRIOR = "calibrated engine", "prior engine"
_KEYS = {"label", "match", "batching", "graphs", "attention", "gqa_kv_sharing", "allreduce", "memory", "sources",
         "head_padding", "kernel_scales"}
#: the engine values a profile may cite per hardware family (``kernel_scales``), and the range they
#: may take, cited or fitted (``dse.fit.calibrate``'s bounds of the same parameters)
KERNEL_SCALES = ("memory_scale", "compute_scale")
SCALE_RANGE = (0.2, 1.25)
#: what a share of device memory is a share of: all of it, or what the weights and activations leave
SHARE_OF = ("device", "free")
_MEMORY_KEYS = {"utilization", "share_of", "reserve_holds_activations", "prefill_chunk", "profiles_chunk"}


@dataclass(frozen=True)
class EngineMemory:
    """What an engine does with device memory (every figure with its source in the profile).

    ``utilization``: the share of memory the engine lets itself use (None: all of it), a share of
    the device's memory (``share_of`` 'device': vLLM, SGLang) or of what the weights and
    activations leave free ('free': TensorRT-LLM's KV cache); ``reserve_holds_activations``: the
    share left over is where the engine's activations live (SGLang: its static share holds weights
    and the KV pool only); ``prefill_chunk``: tokens one iteration prefills (0: whole prompts);
    ``profiles_chunk``: the engine reserves a whole chunk's activations at start-up, whatever the
    prompts (vLLM sizes its KV cache after a profiling pass of max_num_batched_tokens tokens)."""

    utilization: float | None = None
    share_of: str = "device"
    reserve_holds_activations: bool = False
    prefill_chunk: int = 0
    profiles_chunk: bool = False


#: the engine a point gets without naming one: the whole device memory, whole prompts
GENERIC_MEMORY = EngineMemory()


@dataclass(frozen=True)
class Engine:
    """One engine profile (see the module docstring); ``sources`` cite each attribute."""

    name: str
    label: str
    match: str
    batching: str = "inflight"
    graphs: bool | str = True      # True (captured graphs), False (eager) or ``COMPILED``
    attention: str = "fused"
    gqa_kv_sharing: bool = True
    allreduce: str = "one-shot"
    sources: tuple = ()
    memory: EngineMemory = GENERIC_MEMORY
    head_padding: bool = False     # pads attention heads to the cores it shards over (``workloads.head_padding``)
    kernel_scales: tuple = ()      # ((family, parameter, value), ...): cited shares of a family's fractions

    @property
    def flash_attention(self) -> bool:
        return self.attention == "fused"

    @property
    def launch(self) -> str:
        return COMPILED if self.graphs == COMPILED else "graphs" if self.graphs else "eager"


@lru_cache(maxsize=4)
def _profiles(path: str) -> tuple[dict, str]:
    data = load_yaml(path, what="engine profiles")
    if not isinstance(data, dict) or not isinstance(data.get("engines"), dict):
        raise DseError(f"{path}: expected a mapping with 'engines' (name -> profile) and 'default_engine'")
    out = {}
    for name, node in data["engines"].items():
        where = f"{path}: engines.{name}"
        if not isinstance(node, dict):
            raise DseError(f"{where}: expected a mapping")
        extra = set(node) - _KEYS
        if extra:
            raise DseError(f"{where}: unknown key(s) {', '.join(sorted(extra))}; allowed: {', '.join(sorted(_KEYS))}")
        for key, allowed in (("batching", BATCHING), ("attention", ATTENTION), ("allreduce", ALLREDUCE)):
            if node.get(key) not in allowed:
                raise DseError(f"{where}.{key}: expected one of {', '.join(allowed)}, got {node.get(key)!r}")
        if not isinstance(node.get("head_padding", False), bool):
            raise DseError(f"{where}.head_padding: expected true or false, got {node.get('head_padding')!r}")
        if not isinstance(node.get("graphs"), bool) and node.get("graphs") != COMPILED:
            raise DseError(f"{where}.graphs: expected true, false or {COMPILED}, got {node.get('graphs')!r}")
        if not isinstance(node.get("gqa_kv_sharing"), bool):
            raise DseError(f"{where}.gqa_kv_sharing: expected true or false, got {node.get('gqa_kv_sharing')!r}")
        try:
            re.compile(str(node.get("match", "")))
        except re.error as e:
            raise DseError(f"{where}.match: not a regular expression: {e}") from None
        sources = node.get("sources") or {}
        memory = _memory(node.get("memory"), f"{where}.memory")
        cited = ("batching", "graphs", "attention", "allreduce", *(("head_padding",) if node.get("head_padding") else ()),
                 *(k for k in ("utilization", "prefill_chunk", "profiles_chunk")
                   if (node.get("memory") or {}).get(k) is not None),
                 *(("kernel_scales",) if node.get("kernel_scales") else ()))
        missing = [k for k in cited if not sources.get(k)]
        if missing:
            raise DseError(f"{where}.sources: every attribute needs a source; missing: {', '.join(missing)}")
        out[str(name)] = Engine(str(name), str(node.get("label", name)), str(node.get("match", "")),
                                node["batching"], node["graphs"], node["attention"], node["gqa_kv_sharing"],
                                node["allreduce"], tuple(sorted(sources.items())), memory,
                                node.get("head_padding", False),
                                _kernel_scales(node.get("kernel_scales"), f"{where}.kernel_scales"))
    default = data.get("default_engine")
    if default not in out:
        raise DseError(f"{path}: default_engine: expected one of {', '.join(out)}, got {default!r}")
    return out, default


def _kernel_scales(node, where: str) -> tuple:
    """((family, parameter, value), ...) of a profile's ``kernel_scales`` mapping (absent: none);
    DseError naming the key and what is allowed."""
    if node is None:
        return ()
    if not isinstance(node, dict):
        raise DseError(f"{where}: expected a mapping of hardware families to {{{' | '.join(KERNEL_SCALES)}: value}}")
    out = []
    for family, scales in node.items():
        if family not in FAMILY_PRIORS:
            raise DseError(f"{where}: unknown hardware family {family!r}; known: {', '.join(FAMILY_PRIORS)}")
        if not isinstance(scales, dict) or not scales:
            raise DseError(f"{where}.{family}: expected a mapping of {' or '.join(KERNEL_SCALES)} to a value")
        for name, v in scales.items():
            if name not in KERNEL_SCALES:
                raise DseError(f"{where}.{family}: unknown key {name!r}; allowed: {', '.join(KERNEL_SCALES)}")
            lo, hi = SCALE_RANGE
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
                raise DseError(f"{where}.{family}.{name}: expected a number from {lo} to {hi}, got {v!r}")
            out.append((str(family), str(name), float(v)))
    return tuple(out)


def _memory(node, where: str) -> EngineMemory:
    """The EngineMemory of a profile's ``memory`` mapping (absent: the generic one); DseError
    naming the key and what is allowed."""
    if node is None:
        return GENERIC_MEMORY
    if not isinstance(node, dict):
        raise DseError(f"{where}: expected a mapping of {', '.join(sorted(_MEMORY_KEYS))}")
    extra = set(node) - _MEMORY_KEYS
    if extra:
        raise DseError(f"{where}: unknown key(s) {', '.join(sorted(extra))}; allowed: {', '.join(sorted(_MEMORY_KEYS))}")
    u = node.get("utilization")
    if u is not None and (isinstance(u, bool) or not isinstance(u, (int, float)) or not 0 < u <= 1):
        raise DseError(f"{where}.utilization: expected a share of memory in (0, 1], got {u!r}")
    share_of = node.get("share_of", "device")
    if share_of not in SHARE_OF:
        raise DseError(f"{where}.share_of: expected one of {', '.join(SHARE_OF)}, got {share_of!r}")
    holds = node.get("reserve_holds_activations", False)
    if not isinstance(holds, bool):
        raise DseError(f"{where}.reserve_holds_activations: expected true or false, got {holds!r}")
    chunk = node.get("prefill_chunk", 0)
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 0:
        raise DseError(f"{where}.prefill_chunk: expected a whole number of tokens >= 0, got {chunk!r}")
    profiles = node.get("profiles_chunk", False)
    if not isinstance(profiles, bool) or (profiles and not chunk):
        raise DseError(f"{where}.profiles_chunk: expected true or false (true needs a prefill_chunk), got {profiles!r}")
    return EngineMemory(None if u is None else float(u), share_of, holds, chunk, profiles)


def reserve_bytes(memory: EngineMemory, capacity, weights, activations):
    """Bytes of device memory an engine keeps back from a model (``memory``, per device, arrays
    broadcast): (1 - utilization) of the device's ``capacity``, or of what ``weights`` and
    ``activations`` leave free (share_of 'free'), less the activations where they live in that
    share (``reserve_holds_activations``); 0 without a utilization. A point fits when weights,
    KV cache and activations fit in ``capacity`` less this."""
    if memory.utilization is None:
        return np.zeros(np.broadcast(capacity, weights, activations).shape) if np.ndim(capacity) else 0.0
    base = np.asarray(capacity, dtype=float)
    if memory.share_of == "free":
        base = np.maximum(base - weights - activations, 0.0)
    kept = (1.0 - memory.utilization) * base
    if memory.reserve_holds_activations:
        kept = np.maximum(kept - activations, 0.0)
    return kept


def chunked_prefill(memory: EngineMemory, tokens):
    """Whether the engine prefills ``tokens`` prompt tokens of a batch in chunks (its
    ``prefill_chunk`` is smaller), [P] bool or one bool."""
    return (memory.prefill_chunk > 0) & (np.asarray(tokens) > memory.prefill_chunk)


def engines() -> dict[str, Engine]:
    """The engine profiles by name, in matching order."""
    return _profiles(str(ENGINES_FILE))[0]


def default_engine() -> str:
    """The name of the engine a design point runs when it names none (a modern serving engine)."""
    return _profiles(str(ENGINES_FILE))[1]


def get_engine(name: str, what: str = "engine") -> Engine:
    """The profile called ``name`` (``default``: the default engine's costs with the generic
    footprint, ``GENERIC_MEMORY``: no engine named, no reserve); DseError naming the known ones."""
    key = str(name).strip().lower()
    if key == "default":
        return replace(engines()[default_engine()], memory=GENERIC_MEMORY)
    found = engines().get(key)
    if found is None:
        why = (" (an empty name)" if not key else
               " (a path: an engine is a profile's name in configs/engines.yaml, see 'list engines', not a file)"
               if "/" in key or "\\" in key or key.endswith((".yaml", ".yml", ".json")) else "")
        raise DseError(f"{what}: unknown engine {name!r}{why}; known: default ({default_engine()}), "
                       f"{', '.join(engines())}")
    return found


def engine_matching(text: str) -> Engine | None:
    """The first profile whose ``match`` finds ``text`` (a measured row's framework), else None."""
    if not text:
        return None
    return next((e for e in engines().values() if e.match and re.search(e.match, text)), None)


def covered_families(engine: Engine, path: str | None = None, sections: dict | None = None) -> tuple[str, ...] | None:
    """The hardware families whose rows fitted ``engine``'s values (the calibration's
    ``engine_families`` section, from ``sections`` or the file ``path``: default the one in use);
    () for an engine the section does not list; None when the calibration has no such section (a
    file written before it: the engine's values apply to every family). DseError naming the key
    when the section is not a mapping of engines to lists of family names."""
    cal = sections if sections is not None else load_calibration(path)
    table = cal.get("engine_families")
    if table is None:
        return None
    where = f"{path or calibration_file()}: engine_families"
    if not isinstance(table, dict):
        raise DseError(f"{where}: expected a mapping of engine names to lists of hardware families")
    found = table.get(engine.name, [])
    if not isinstance(found, list) or not all(isinstance(f, str) and f in FAMILY_PRIORS for f in found):
        raise DseError(f"{where}.{engine.name}: expected a list of hardware families; known: "
                       f"{', '.join(FAMILY_PRIORS)}")
    return tuple(found)


def _foreign(engine: Engine, family: str | None, path: str | None, cal: dict) -> bool:
    """Whether the calibration ``cal`` says ``engine``'s rows never covered hardware ``family``
    (False for family None or a calibration without ``engine_families``)."""
    covered = covered_families(engine, path, cal) if family is not None else None
    return covered is not None and family not in covered


def runs_as_prior(engine: Engine, family: str, path: str | None = None, sections: dict | None = None) -> bool:
    """Whether ``engine`` runs as a prior engine on hardware ``family`` (``engine_efficiency``): it
    has no fitted values of its own, or its rows never covered ``family``; such a prediction takes
    the band of unseen engines (``dse.core.bands``)."""
    cal = sections if sections is not None else load_calibration(path)
    return not is_calibrated(engine, path, cal) or _foreign(engine, family, path, cal)


def engine_parameters(engine: Engine, path: str | None = None, sections: dict | None = None,
                      family: str | None = None) -> tuple[dict, list[str]]:
    """(the engine-side parameters of ``engine``, notes on them): the calibration's launch and
    all-reduce classes and the engine's own fitted values (``sections``, else read from the
    calibration ``path``: default the one in use). An engine without fitted values of its own gets
    none here (``engine_efficiency`` gives it ``NEUTRAL``), never another engine's; nor does one
    whose rows did not cover the hardware ``family`` (``covered_families``; None: any family), and
    a note says on which families it was fitted; such a prior engine gets its profile's
    ``kernel_scales`` cited for ``family``, a note naming each. Notes name each of its values that
    ended on its fit's bound (the calibration's ``at_bound`` section)."""
    cal = sections if sections is not None else load_calibration(path)
    out, notes = {}, []
    foreign = _foreign(engine, family, path, cal)

    def value(node):
        return float(node["value"] if isinstance(node, dict) else node)
    launch = (cal.get("launch") or {}).get(engine.launch) or {}
    if engine.launch == COMPILED:          # one compiled program: no kernel launched, no cost per operator
        out["op_overhead_s"] = 0.0
    elif "op_overhead_s" in launch:
        out["op_overhead_s"] = value(launch["op_overhead_s"])
    if engine.allreduce != "none":
        algo = (cal.get("allreduce") or {}).get(engine.allreduce) or {}
        if "collective_latency_s" in algo:
            out["collective_latency_s"] = value(algo["collective_latency_s"])
    own = {} if foreign else (cal.get("engines") or {}).get(engine.name) or {}
    for k, v in own.items():
        if k in ENGINE_PARAMS:
            out[k] = value(v)
    if foreign and (cal.get("engines") or {}).get(engine.name):
        notes.append(f"fitted on {', '.join(covered_families(engine, path, cal)) or 'no family'} only")
    if not any(k in out for k in ENGINE_PARAMS):      # a prior engine on ``family``: its cited kernel scales
        for fam, k, v in engine.kernel_scales:
            if fam == family:
                out[k] = v
                notes.append(f"{k} {v:g} cited on {fam}")
    used = {f"launch.{engine.launch}", f"allreduce.{engine.allreduce}"} | (set() if foreign else {f"engines.{engine.name}"})
    for key, node in (cal.get("at_bound") or {}).items():
        if key.rsplit(".", 1)[0] in used and isinstance(node, dict):
            notes.append(f"{key.rsplit('.', 1)[1]} of {key.rsplit('.', 1)[0]} at its {node.get('bound')} bound "
                         f"{node.get('limit')}")
    return out, notes


def without_message_notes(name: str) -> str:
    """``name`` (an Efficiency name of ``engine_efficiency``) without its notes on the all-reduce
    class's values (``allreduce.<algorithm>``, e.g. a latency at its bound): what a point that sends
    no collective or message (one device a replica) shows, since those values never price it."""
    head, sep, notes = name.partition(" (")
    if not sep or not notes.endswith(")"):
        return name
    kept = [n for n in notes[:-1].split("; ") if " of allreduce." not in n]
    return head + (f" ({'; '.join(kept)})" if kept else "")


def efficiency_source(name: str) -> str:
    """Which layer's values an Efficiency called ``name`` (``engine_efficiency``'s) uses, in words:
    'kernel layer: prior gpu; engine layer: calibrated engine vllm' (with any value at its bound),
    'ideal roofline (no efficiency)', or the name itself for an Efficiency given by the caller."""
    if name == "ideal":
        return "ideal roofline (no efficiency)"
    hardware, _, engine = name.partition(" + ")
    if " dataflow" in hardware:                    # dse.core.dataflow.dataflow_efficiency's name: no engine runs
        family, _, latency = hardware.partition(" dataflow")
        return f"kernel layer: {family}; dataflow layer: compiler-scheduled, no engine{latency}"
    if not engine.startswith((CALIBRATED, PRIOR)):
        return f"given: {name}"
    return f"kernel layer: {hardware}; engine layer: {engine}"


def is_calibrated(engine: Engine, path: str | None = None, sections: dict | None = None) -> bool:
    """Whether ``engine`` has fitted values of its own in the calibration (else it is a prior engine)."""
    cal = sections if sections is not None else load_calibration(path)
    return bool((cal.get("engines") or {}).get(engine.name))


def engine_efficiency(base: Efficiency, engine: Engine, kv_group: float = 1.0, *,
                      parameters: dict | None = None, path: str | None = None,
                      family: str | None = None) -> Efficiency:
    """The Efficiency of hardware of ``family`` whose family efficiency is ``base`` under ``engine``:
    its launch, all-reduce and scheduler costs (``parameters``, default ``engine_parameters``: the
    engine's fitted values only where its rows covered ``family``; None: any family), its share of
    the achievable bandwidth and compute, and its attention kernel (``kv_group``: query heads per
    K/V head on one device; decode attention without GQA sharing reads K/V once per query head).
    Static engines hide nothing of prefill under decode. The ideal bound stays the ideal bound."""
    if base.name == "ideal":
        return base
    notes, kind = [], ""
    if parameters is None:
        parameters, notes = engine_parameters(engine, path, family=family)
        kind = (PRIOR if runs_as_prior(engine, family, path) else CALIBRATED) + " "
    p = {**NEUTRAL, **{k: getattr(base, k) for k in (*COSTS, "prefill_decode_overlap")}, **parameters}
    name = f"{base.name} + {kind}{engine.name}" + (f" ({'; '.join(notes)})" if notes else "")
    try:
        return replace(base, name=name, op_overhead_s=p["op_overhead_s"],
                       collective_latency_s=p["collective_latency_s"], step_overhead_s=p["step_overhead_s"],
                       request_overhead_s=p["request_overhead_s"],
                       memory=min(base.memory * p["memory_scale"], 1.0),
                       attention_memory=None if base.attention_memory is None else
                       min(base.attention_memory * p["memory_scale"], 1.0),
                       compute=min(base.compute * p["compute_scale"], 1.0),
                       **{k: None if getattr(base, k) is None else min(getattr(base, k) * p["compute_scale"], 1.0)
                          for k in ("compute_narrow", "compute_fp8", "compute_fp4", "compute_int8")},
                       attention_kv_reads=1.0 if engine.gqa_kv_sharing else max(kv_group, 1.0),
                       prefill_decode_overlap=p["prefill_decode_overlap"] if engine.batching == "inflight" else 0.0)
    except ValueError as e:
        raise DseError(f"engine {engine.name}: {e}") from None


#: what ``attention_on`` says of an engine whose fused attention the hardware cannot tile
UNFUSED_FALLBACK = "attention unfused: the hardware cites no on-chip buffer for the fused kernel to tile in"


def attention_on(engine: Engine, onchip_buffer_bytes: float) -> tuple[Engine, str]:
    """(``engine`` as it runs on hardware with ``onchip_buffer_bytes`` of on-chip buffer, what
    changed in words or ''): a fused attention kernel (FlashAttention) tiles attention in the
    on-chip buffer, so on hardware that cites none (Gaudi 2/3) the engine runs unfused attention,
    the README's fall back (``UNFUSED_FALLBACK``)."""
    if engine.flash_attention and not onchip_buffer_bytes > 0:
        return replace(engine, attention="unfused"), UNFUSED_FALLBACK
    return engine, ""


#: how each launch class runs its kernels, in words
_KERNELS = {"graphs": "graph-replayed", "eager": "eager", COMPILED: "ahead-of-time compiled (no launches)"}


def describe(engine: Engine) -> str:
    """One line: the profile's name, label and what it does."""
    mem = engine.memory
    uses = ("all device memory" if mem.utilization is None else
            f"{mem.utilization:.0%} of {'device' if mem.share_of == 'device' else 'free'} memory")
    chunks = f", prefill in chunks of {mem.prefill_chunk:,} tokens" if mem.prefill_chunk else ""
    return (f"{engine.name}: {engine.label} — {engine.batching} batching, "
            f"{_KERNELS[engine.launch]} kernels, {engine.attention} attention, "
            f"{'GQA-shared' if engine.gqa_kv_sharing else 'per-head'} K/V reads, all-reduce {engine.allreduce}, "
            f"{'attention heads padded to the cores it shards over, ' if engine.head_padding else ''}"
            f"uses {uses}{chunks}")
