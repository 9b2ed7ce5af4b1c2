"""From a chosen design to a deployment: a serving engine's launch command and a Kubernetes
manifest, written from the design's own columns.

A ``Design`` holds what a design point says about serving it: its model, hardware, parallel
layout (tp, pp, ep), scheduler limits (max_running, the batched-token budget prefill_chunk,
kv_block), formats and speculative decoding. ``launch(design, engine)`` turns it into the
command of vLLM, SGLang or TensorRT-LLM, one table per engine of column -> flag (each flag
checked against the engine's documentation, cited beside its table); what an engine cannot
express is never dropped without a word: it becomes a note ('# left out: ...') in the output,
or, where nothing could run (a CPU, a TPU, TensorRT-LLM on an AMD GPU), a DseError.
``manifest(design, launch, kind)`` wraps the command in Kubernetes objects: a plain apps/v1
Deployment and Service, or an NVIDIA Dynamo DynamoGraphDeployment. Pure functions: no I/O.
"""
from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field

import yaml

from basis.errors import DseError

#: the engines ``launch`` writes commands for, by dse engine name (``dse list engines``)
ENGINES = ("vllm", "sglang", "trt-llm")
#: what the engines are also called on a command line
ENGINE_ALIASES = {"trtllm": "trt-llm", "tensorrt-llm": "trt-llm"}
#: the manifests ``manifest`` writes: a plain Deployment + Service; the same for llm-d (whose
#: ModelService is a Helm chart, not a custom resource: it renders Deployments like this one);
#: NVIDIA Dynamo's DynamoGraphDeployment custom resource
MANIFESTS = ("deployment", "llm-d", "dynamo")

#: the Kubernetes extended resource a pod asks for, per GPU vendor (NVIDIA's and AMD's device
#: plugins: https://github.com/NVIDIA/k8s-device-plugin, https://github.com/ROCm/k8s-device-plugin)
GPU_RESOURCE = {"nvidia": "nvidia.com/gpu", "amd": "amd.com/gpu"}

#: the port each engine's server listens on in the manifests (set with its --port flag)
PORT = 8000

#: the Hugging Face Hub repository of each shipped model (``configs/models``): what the engines
#: load. Sources: the ``_name_or_path`` of the config file itself (llama-2-*, opt-30b), the table of
#: configs/models/SOURCES.md (the configs added with the newer families), else the model's Hub page
#: https://huggingface.co/<repo>. A base repository where the shipped config is the base model's
#: (an instruct repository has the same config.json); opt-175b is not on the Hub (its weights are
#: given on request), so it has none: give --checkpoint.
HF_REPOS = {
    "llama-2-7b": "meta-llama/Llama-2-7b-hf", "llama-2-13b": "meta-llama/Llama-2-13b-hf",
    "llama-2-70b": "meta-llama/Llama-2-70b-hf", "llama-3-70b": "meta-llama/Meta-Llama-3-70B",
    "llama-3.1-8b": "meta-llama/Llama-3.1-8B", "llama-3.1-70b": "meta-llama/Llama-3.1-70B",
    "llama-3.1-405b": "meta-llama/Llama-3.1-405B", "llama-3.3-70b": "meta-llama/Llama-3.3-70B-Instruct",
    "llama-3.2-1b-instruct": "meta-llama/Llama-3.2-1B-Instruct",
    "llama-3.2-3b-instruct": "meta-llama/Llama-3.2-3B-Instruct",
    "mistral-7b": "mistralai/Mistral-7B-v0.1", "mixtral-8x7b": "mistralai/Mixtral-8x7B-v0.1",
    "mixtral-8x22b": "mistralai/Mixtral-8x22B-v0.1",
    "qwen2.5-72b": "Qwen/Qwen2.5-72B", "qwen2.5-7b-instruct": "Qwen/Qwen2.5-7B-Instruct",
    "qwen3-0.6b": "Qwen/Qwen3-0.6B", "qwen3-8b": "Qwen/Qwen3-8B", "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B",
    "qwen3-235b-a22b": "Qwen/Qwen3-235B-A22B",
    "gpt-oss-20b": "openai/gpt-oss-20b", "gpt-oss-120b": "openai/gpt-oss-120b",
    "deepseek-v3": "deepseek-ai/DeepSeek-V3", "deepseek-r1": "deepseek-ai/DeepSeek-R1",
    "deepseek-v2-lite": "deepseek-ai/DeepSeek-V2-Lite", "kimi-k2-instruct": "moonshotai/Kimi-K2-Instruct",
    "llama-4-scout-17b-16e-instruct": "meta-llama/Llama-4-Scout-17B-16E-Instruct",
    "llama-4-maverick-17b-128e-instruct": "meta-llama/Llama-4-Maverick-17B-128E-Instruct",
    "gemma-2-9b-it": "google/gemma-2-9b-it", "gemma-3-27b-it": "google/gemma-3-27b-it",
    "gpt-j-6b": "EleutherAI/gpt-j-6b", "falcon-180b": "tiiuae/falcon-180B", "opt-6.7b": "facebook/opt-6.7b",
    "opt-30b": "facebook/opt-30b", "bloom-176b": "bigscience/bloom",
}

#: the container image each engine's server runs in, on NVIDIA GPUs (the version whose flags the
#: tables below were checked against, where the project publishes one): vLLM's own image on
#: Docker Hub (https://docs.vllm.ai/en/v0.8.5/deployment/docker.html: vllm/vllm-openai), SGLang's
#: (https://docs.sglang.io, "docker run ... lmsysorg/sglang"), TensorRT-LLM's NGC release
#: (https://nvidia.github.io/TensorRT-LLM/1.0.0/commands/trtllm-serve/run-benchmark-with-trtllm-serve.html:
#: nvcr.io/nvidia/tensorrt-llm/release:1.0.0). None on AMD GPUs: give --image.
IMAGES = {"vllm": "vllm/vllm-openai:v0.8.5", "sglang": "lmsysorg/sglang:latest",
          "trt-llm": "nvcr.io/nvidia/tensorrt-llm/release:1.0.0"}


@dataclass(frozen=True)
class Design:
    """A design point as a deployment reads it (its columns as the evaluator resolved them).

    model: dse model name; checkpoint: what the engine loads (a Hub repo or a folder);
    hardware, vendor, device_class: the device preset and who makes it; tp, pp, ep: the
    parallel layout (devices = tp x pp x ep); max_running: sequences running at once;
    batched_tokens: tokens one iteration processes (prefill_chunk; 0 = whole prompts first);
    kv_block: tokens per KV page; weights, activations, kv: format names; spec_draft,
    spec_tokens, draft_checkpoint: speculative decoding ('none', 0, '' when off);
    max_context: context limit in tokens (0: the model's); replicas: engines the service needs;
    unexpressed: (column, words) of
    settings no engine flag expresses (techniques, offload, disaggregation), each a note."""
    model: str
    checkpoint: str
    hardware: str
    vendor: str
    device_class: str
    tp: int = 1
    pp: int = 1
    ep: int = 1
    max_running: int = 1024
    batched_tokens: int = 8192
    kv_block: int = 16
    weights: str = "fp16"
    activations: str = "fp16"
    kv: str = "fp16"
    spec_draft: str = "none"
    spec_tokens: int = 0
    draft_checkpoint: str = ""
    max_context: int = 0
    replicas: int = 1
    unexpressed: tuple = ()

    @property
    def devices(self) -> int:
        """Devices one engine runs on: tp x pp x ep."""
        return self.tp * self.pp * self.ep


@dataclass(frozen=True)
class Launch:
    """An engine's launch command: ``argv`` (the program and its arguments); ``notes``: one line
    each, what the design says that the command does not (or says otherwise); ``files``:
    (name, text) of files the command reads, written beside it; ``source``: the documentation the
    flags were checked against."""
    engine: str
    argv: tuple
    notes: tuple = ()
    files: tuple = ()
    source: str = ""
    env: dict = field(default_factory=dict)


def engine_name(name: str) -> str:
    """The dse name of engine ``name`` ('trtllm' -> 'trt-llm'); DseError naming the allowed ones."""
    n = ENGINE_ALIASES.get(str(name).lower(), str(name).lower())
    if n not in ENGINES:
        raise DseError(f"--engine {name}: dse deploy writes launch commands for {', '.join(ENGINES)} "
                       f"(also 'trtllm'), not '{name}'")
    return n


def check_hardware(design: Design, engine: str) -> None:
    """DseError when ``engine`` cannot run on the design's hardware: the three engines serve on
    NVIDIA GPUs (and vLLM and SGLang on AMD GPUs through ROCm); a CPU, TPU, LPU or PIM design
    has no deployment here."""
    vendor = design.vendor.lower()
    if design.device_class != "gpu" or vendor not in GPU_RESOURCE:
        article = "an" if design.device_class[:1] in "aeiou" else "a"
        raise DseError(f"--hardware {design.hardware}: {article} {design.device_class} from {design.vendor or 'an unknown vendor'}; "
                       f"dse deploy writes engines for NVIDIA and AMD GPUs (Kubernetes resources "
                       f"{' and '.join(GPU_RESOURCE.values())}) only")
    if engine == "trt-llm" and vendor != "nvidia":
        raise DseError(f"--engine trt-llm: TensorRT-LLM runs on NVIDIA GPUs, and {design.hardware} is from {design.vendor}; "
                       f"use --engine vllm or sglang")


# ---- vLLM -----------------------------------------------------------------------------------
# Flags checked against vLLM v0.8.5, "Engine Arguments", https://docs.vllm.ai/en/v0.8.5/serving/engine_args.html
# (the `vllm serve` usage block: --tensor-parallel-size, --pipeline-parallel-size, --data-parallel-size,
# --enable-expert-parallel, --block-size {8,16,32,64,128}, --max-num-batched-tokens, --max-num-seqs,
# --kv-cache-dtype {auto,fp8,fp8_e5m2,fp8_e4m3}, --quantization {...,fp8,...}, --dtype, --max-model-len,
# --enable-chunked-prefill, --speculative-config, --host, --port); speculative-config keys 'model' and
# 'num_speculative_tokens': https://docs.vllm.ai/en/v0.8.5/features/spec_decode.html
VLLM_SOURCE = "vLLM v0.8.5 engine arguments, https://docs.vllm.ai/en/v0.8.5/serving/engine_args.html"
#: design column -> vLLM flag
VLLM_FLAGS = {"tp": "--tensor-parallel-size", "pp": "--pipeline-parallel-size", "ep": "--data-parallel-size",
              "ep_on": "--enable-expert-parallel", "max_running": "--max-num-seqs",
              "batched_tokens": "--max-num-batched-tokens", "chunked": "--enable-chunked-prefill",
              "kv": "--kv-cache-dtype", "kv_block": "--block-size", "weights": "--quantization",
              "activations": "--dtype", "spec": "--speculative-config", "max_context": "--max-model-len",
              "host": "--host", "port": "--port"}
VLLM_BLOCKS = (8, 16, 32, 64, 128)
#: KV format -> --kv-cache-dtype ('auto': the model's dtype)
VLLM_KV = {"fp16": "auto", "bf16": "auto", "fp8": "fp8_e4m3", "fp8-e5m2": "fp8_e5m2"}
#: weight format -> --quantization applied to a 16-bit checkpoint at load time (vLLM's dynamic FP8)
VLLM_QUANT = {"fp8": "fp8"}
#: activation format -> --dtype
DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}

# ---- SGLang ---------------------------------------------------------------------------------
# Flags checked against SGLang's "Server Arguments" (docs/advanced_features/server_arguments.md,
# sgl-project/sglang at commit b36e8e198b71553316b55bce53de6ecf9b3a9a47; https://docs.sglang.io/advanced_features/server_arguments.html):
# --model-path, --tp-size, --pp-size, --ep-size, --max-running-requests, --chunked-prefill-size (-1: off),
# --page-size, --kv-cache-dtype {auto,fp8_e5m2,fp8_e4m3}, --quantization {...,fp8,w8a8_int8,modelopt_fp4,mxfp4,...},
# --dtype, --context-length, --speculative-algorithm {...,STANDALONE,...}, --speculative-draft-model-path,
# --speculative-num-steps, --speculative-eagle-topk, --speculative-num-draft-tokens, --host, --port;
# --dp-size with --enable-dp-attention ("DP for attention, TP for FFN": docs.sglang.io cookbook, server arguments
# reference; the DeepSeek-V3.2-Exp model card launches '--tp 8 --dp 8 --enable-dp-attention')
SGLANG_SOURCE = ("SGLang server arguments, https://docs.sglang.io/advanced_features/server_arguments.html "
                 "(sgl-project/sglang b36e8e19)")
SGLANG_FLAGS = {"model": "--model-path", "tp": "--tp-size", "pp": "--pp-size", "ep": "--ep-size",
                "dp": "--dp-size", "dp_attention": "--enable-dp-attention",
                "max_running": "--max-running-requests", "batched_tokens": "--chunked-prefill-size",
                "kv": "--kv-cache-dtype", "kv_block": "--page-size", "weights": "--quantization",
                "activations": "--dtype", "spec": "--speculative-algorithm",
                "draft": "--speculative-draft-model-path", "spec_steps": "--speculative-num-steps",
                "spec_topk": "--speculative-eagle-topk", "spec_tokens": "--speculative-num-draft-tokens",
                "max_context": "--context-length", "host": "--host", "port": "--port"}
SGLANG_KV = {"fp16": "auto", "bf16": "auto", "fp8": "fp8_e4m3", "fp8-e5m2": "fp8_e5m2"}
#: (weight format, activation format) -> --quantization (SGLang's on-the-fly FP8 and W8A8 INT8)
SGLANG_QUANT = {("fp8", "fp8"): "fp8", ("fp8", "fp16"): "fp8", ("fp8", "bf16"): "fp8", ("int8", "int8"): "w8a8_int8"}

# ---- TensorRT-LLM ---------------------------------------------------------------------------
# Flags checked against `trtllm-serve` of TensorRT-LLM: https://nvidia.github.io/TensorRT-LLM/0.18.2/commands/trtllm-serve.html
# (MODEL, --host, --port, --backend, --max_batch_size, --max_num_tokens, --max_seq_len, --tp_size, --pp_size),
# https://nvidia.github.io/TensorRT-LLM/0.20.0rc1/commands/trtllm-serve.html (--ep_size) and
# https://nvidia.github.io/TensorRT-LLM/1.0.0/commands/trtllm-serve/run-benchmark-with-trtllm-serve.html
# (--extra_llm_api_options, a YAML of LLM API settings: kv_cache_config.dtype, kv_cache_config.tokens_per_block,
# enable_attention_dp, as NVIDIA's example configs under https://nvidia.github.io/TensorRT-LLM/ set them)
TRTLLM_SOURCE = "TensorRT-LLM trtllm-serve, https://nvidia.github.io/TensorRT-LLM/0.18.2/commands/trtllm-serve.html"
TRTLLM_FLAGS = {"tp": "--tp_size", "pp": "--pp_size", "ep": "--ep_size", "max_running": "--max_batch_size",
                "batched_tokens": "--max_num_tokens", "max_context": "--max_seq_len", "backend": "--backend",
                "options": "--extra_llm_api_options", "host": "--host", "port": "--port"}
TRTLLM_KV = {"fp8": "fp8"}
TRTLLM_OPTIONS_FILE = "trtllm-options.yaml"


def _checkpoint_note(engine: str, design: Design) -> list[str]:
    """Notes on the weight format ``engine`` takes from the checkpoint rather than a flag."""
    w = design.weights
    if w in ("fp16", "bf16", "fp32"):
        return []
    return [f"weights {w}: {engine} reads this format from a pre-quantized checkpoint (its quantization_config), "
            f"not from a flag; give --checkpoint such a checkpoint of {design.model}"]


def _vllm(design: Design) -> Launch:
    f = VLLM_FLAGS
    argv = ["vllm", "serve", design.checkpoint, f["tp"], str(design.tp)]
    notes = []
    if design.pp > 1:
        argv += [f["pp"], str(design.pp)]
    if design.ep > 1:
        argv += [f["ep"], str(design.ep), f["ep_on"]]
        notes.append(f"expert parallel: dse's {design.ep} groups of tp {design.tp} (each expert split tp ways, "
                     f"attention data parallel) run as --data-parallel-size {design.ep} --enable-expert-parallel, "
                     f"which places whole experts over all {design.tp * design.ep} ranks: the same bytes per device")
    argv += [f["max_running"], str(design.max_running)]
    if design.batched_tokens:
        argv += [f["batched_tokens"], str(design.batched_tokens)]
    else:
        argv += [f["chunked"], "false"]
    argv += _kv_flags(design, f["kv"], VLLM_KV, "vLLM", notes)
    if design.kv_block in VLLM_BLOCKS:
        argv += [f["kv_block"], str(design.kv_block)]
    else:
        notes.append(f"kv_block {design.kv_block}: vLLM's --block-size takes {', '.join(map(str, VLLM_BLOCKS))}; "
                     f"left at its default")
    if design.weights in VLLM_QUANT:
        argv += [f["weights"], VLLM_QUANT[design.weights]]
        if design.activations != design.weights:
            notes.append(f"weights {design.weights} with activations {design.activations}: vLLM's --quantization fp8 "
                         f"computes in FP8 where the GPU has it and keeps weight-only FP8 where not")
    else:
        notes += _checkpoint_note("vLLM", design)
    argv += _dtype_flags(design, f["activations"], notes)
    if design.max_context:
        argv += [f["max_context"], str(design.max_context)]
    argv += _spec_vllm(design, notes)
    argv += [f["host"], "0.0.0.0", f["port"], str(PORT)]
    return Launch("vllm", tuple(argv), tuple(notes), source=VLLM_SOURCE)


def _spec_vllm(design: Design, notes: list) -> list[str]:
    kind = _draft_kind(design.spec_draft)
    if kind is None:
        return []
    if kind != "model":
        notes.append(f"spec_draft {design.spec_draft}: vLLM's --speculative-config needs a draft checkpoint "
                     f"({_DRAFT_NEEDS[kind]}); "
                     f"left out")
        return []
    cfg = {"model": design.draft_checkpoint, "num_speculative_tokens": int(design.spec_tokens)}
    return [VLLM_FLAGS["spec"], json.dumps(cfg, separators=(",", ":"))]


#: what a draft other than a draft model needs that a launch line does not give
_DRAFT_NEEDS = {"medusa": "Medusa heads trained for the target", "self": "layer-skip self-drafting has none",
                "mtp": "the model's MTP method, not written here", "eagle": "EAGLE heads trained for the target"}


def _draft_kind(draft: str) -> str | None:
    """None (no speculative decoding), 'self', 'medusa', 'mtp', 'eagle' or 'model' (a draft model)."""
    text = str(draft).strip().lower()
    if text in ("", "none"):
        return None
    if text.partition("@")[0] == "eagle":
        return "eagle"
    return next((k for k in ("self", "medusa", "mtp") if text.startswith(k + ":")), "model")


def _kv_flags(design: Design, flag: str, table: dict, engine: str, notes: list) -> list[str]:
    if design.kv in table:
        return [flag, table[design.kv]]
    notes.append(f"kv {design.kv}: {engine}'s {flag} takes {', '.join(sorted(set(table.values())))}; "
                 f"the KV cache is left in the model's dtype")
    return []


def _dtype_flags(design: Design, flag: str, notes: list) -> list[str]:
    a = design.activations
    if a in DTYPES:
        return [flag, DTYPES[a]]
    if a != design.weights:                     # fp8 activations beside fp8 weights: the quantization says it
        notes.append(f"activations {a}: no engine dtype; the engine computes in the model's dtype")
    return []


def _sglang(design: Design) -> Launch:
    f = SGLANG_FLAGS
    notes = []
    world = design.tp * design.ep
    argv = ["python3", "-m", "sglang.launch_server", f["model"], design.checkpoint, f["tp"], str(world)]
    if design.pp > 1:
        argv += [f["pp"], str(design.pp)]
    if design.ep > 1:
        argv += [f["ep"], str(world), f["dp"], str(design.ep), f["dp_attention"]]
        notes.append(f"expert parallel: dse's {design.ep} groups of tp {design.tp} run as --tp-size {world} "
                     f"--ep-size {world} --dp-size {design.ep} --enable-dp-attention: whole experts over {world} "
                     f"ranks (the same bytes per device) and attention data parallel over {design.ep} groups of "
                     f"{design.tp}, each its own batch and KV cache, as dse runs it")
    argv += [f["max_running"], str(design.max_running), f["batched_tokens"], str(design.batched_tokens or -1)]
    argv += _kv_flags(design, f["kv"], SGLANG_KV, "SGLang", notes)
    argv += [f["kv_block"], str(design.kv_block)]
    quant = SGLANG_QUANT.get((design.weights, design.activations))
    if quant:
        argv += [f["weights"], quant]
    else:
        notes += _checkpoint_note("SGLang", design)
    argv += _dtype_flags(design, f["activations"], notes)
    if design.max_context:
        argv += [f["max_context"], str(design.max_context)]
    kind = _draft_kind(design.spec_draft)
    if kind == "model":       # a draft model: STANDALONE, gamma draft steps of one token (the root token + gamma)
        n = int(design.spec_tokens)
        argv += [f["spec"], "STANDALONE", f["draft"], design.draft_checkpoint, f["spec_steps"], str(n),
                 f["spec_topk"], "1", f["spec_tokens"], str(n + 1)]
    elif kind is not None:
        notes.append(f"spec_draft {design.spec_draft}: SGLang's speculative algorithms need a draft checkpoint "
                     f"(EAGLE heads or a draft model); left out")
    argv += [f["host"], "0.0.0.0", f["port"], str(PORT)]
    return Launch("sglang", tuple(argv), tuple(notes), source=SGLANG_SOURCE)


def _trtllm(design: Design) -> Launch:
    f = TRTLLM_FLAGS
    notes = []
    argv = ["trtllm-serve", design.checkpoint, f["backend"], "pytorch", f["tp"], str(design.tp * design.ep)]
    options: dict = {}
    if design.pp > 1:
        argv += [f["pp"], str(design.pp)]
    if design.ep > 1:
        argv += [f["ep"], str(design.ep)]
        options["enable_attention_dp"] = True
        notes.append(f"expert parallel: dse's {design.ep} groups of tp {design.tp} run as --tp_size "
                     f"{design.tp * design.ep} --ep_size {design.ep} (experts {design.ep} ways, each split "
                     f"{design.tp} ways) with attention data parallel (enable_attention_dp)")
    argv += [f["max_running"], str(design.max_running)]
    if design.batched_tokens:
        argv += [f["batched_tokens"], str(design.batched_tokens)]
    else:
        notes.append("prefill_chunk 0 (whole prompts first): left to TensorRT-LLM's default --max_num_tokens")
    if design.max_context:
        argv += [f["max_context"], str(design.max_context)]
    kv = {"tokens_per_block": int(design.kv_block)}
    if design.kv in TRTLLM_KV:
        kv["dtype"] = TRTLLM_KV[design.kv]
    elif design.kv not in ("fp16", "bf16"):
        notes.append(f"kv {design.kv}: TensorRT-LLM's kv_cache_config.dtype is written for fp8 only here; "
                     f"left in the model's dtype")
    options["kv_cache_config"] = kv
    notes += _checkpoint_note("TensorRT-LLM", design)
    if design.activations not in DTYPES and design.activations != design.weights:
        notes.append(f"activations {design.activations}: TensorRT-LLM takes them from the checkpoint's quantization")
    if _draft_kind(design.spec_draft) is not None:
        notes.append(f"spec_draft {design.spec_draft}: TensorRT-LLM's speculative_config is not written here; left out")
    argv += [f["options"], TRTLLM_OPTIONS_FILE, f["host"], "0.0.0.0", f["port"], str(PORT)]
    text = yaml.safe_dump(options, sort_keys=True)
    return Launch("trt-llm", tuple(argv), tuple(notes), files=((TRTLLM_OPTIONS_FILE, text),), source=TRTLLM_SOURCE)


_LAUNCHERS = {"vllm": _vllm, "sglang": _sglang, "trt-llm": _trtllm}


def launch(design: Design, engine: str) -> Launch:
    """The launch command of ``engine`` ('vllm', 'sglang' or 'trt-llm') for ``design``, with a
    note for each design setting it leaves out; DseError where the engine cannot run it."""
    engine = engine_name(engine)
    check_hardware(design, engine)
    out = _LAUNCHERS[engine](design)
    notes = list(out.notes) + [f"{col}: {words}" for col, words in design.unexpressed]
    if design.devices > 8:
        notes.append(f"{design.devices} GPUs in one pod: more than an 8-GPU node holds; a multi-node launch "
                     f"(LeaderWorkerSet, Ray) is not written here")
    return Launch(out.engine, out.argv, tuple(notes), out.files, out.source, out.env)


def command_text(launch: Launch) -> str:
    """The command of ``launch`` as shell text, quoted: the program and its positional arguments,
    then one flag (with its value) a line."""
    lines: list[list[str]] = [[]]
    for w in launch.argv:
        if w.startswith("--"):
            lines.append([])
        lines[-1].append(shlex.quote(w))
    return " \\\n".join(("  " if i else "") + " ".join(ws) for i, ws in enumerate(lines))


def launch_script(design: Design, launch: Launch) -> str:
    """launch.sh: a POSIX shell script that writes the files the command reads and runs it, with
    the design and every note as comments."""
    out = ["#!/bin/sh", f"# {design.model} on {design.devices} x {design.hardware} "
           f"(tp {design.tp} x pp {design.pp} x ep {design.ep}), {launch.engine}",
           f"# flags checked against: {launch.source}"]
    out += [f"# left out / mapped: {n}" for n in launch.notes]
    out.append("set -e")
    for name, text in launch.files:
        out += [f"cat > {shlex.quote(name)} <<'EOF'", text.rstrip("\n"), "EOF"]
    out.append("exec " + command_text(launch))
    return "\n".join(out) + "\n"


def resource_name(design: Design) -> str:
    """A Kubernetes object name (RFC 1123 label: lower case, digits, '-', at most 63) for the design."""
    raw = f"{design.model}-{design.hardware}-tp{design.tp}" + (f"-pp{design.pp}" if design.pp > 1 else "") + (
        f"-ep{design.ep}" if design.ep > 1 else "")
    name = "".join(c if c.isalnum() else "-" for c in raw.lower())
    while "--" in name:
        name = name.replace("--", "-")
    return name.strip("-")[:63].rstrip("-") or "dse-design"


def _container_args(launch: Launch) -> tuple[list[str], list[str]]:
    """(command, args) of the container running ``launch``: the program and its arguments, or a
    shell that first writes the files it reads."""
    if not launch.files:
        return [launch.argv[0]], list(launch.argv[1:])
    script = "\n".join(f"cat > {shlex.quote(n)} <<'EOF'\n{t.rstrip()}\nEOF" for n, t in launch.files)
    return ["/bin/sh", "-c"], [script + "\nexec " + " ".join(shlex.quote(w) for w in launch.argv)]


def _notes_annotation(launch: Launch) -> dict:
    return {"dse/left-out": "; ".join(launch.notes)} if launch.notes else {}


def manifest(design: Design, launch: Launch, kind: str = "deployment", image: str | None = None,
             name: str | None = None) -> list[dict]:
    """Kubernetes objects that run ``launch`` for ``design``: kind 'deployment' or 'llm-d' (an
    apps/v1 Deployment of ``design.replicas`` pods, each asking for ``design.devices`` GPUs,
    and a Service on its port), or 'dynamo' (an NVIDIA Dynamo DynamoGraphDeployment, nvidia.com/v1alpha1:
    a Frontend and a worker running the engine through Dynamo's wrapper). DseError for a kind
    not in ``MANIFESTS``, an image unknown for the hardware, or Dynamo with an engine or GPU it
    does not take."""
    if kind not in MANIFESTS:
        raise DseError(f"--manifest {kind}: allowed: {', '.join(MANIFESTS)}")
    name = name or resource_name(design)
    vendor = design.vendor.lower()
    if kind == "dynamo":
        return [_dynamo(design, launch, image, name)]
    if image is None:
        if vendor != "nvidia":
            raise DseError(f"--image: no default {launch.engine} image for {design.vendor} GPUs here; give the "
                           f"engine's ROCm image with --image")
        image = IMAGES[launch.engine]
    command, args = _container_args(launch)
    gpus = str(design.devices)
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/component": launch.engine}
    container = {"name": launch.engine.replace(".", "-"), "image": image, "command": command, "args": args,
                 "ports": [{"containerPort": PORT, "name": "http"}],
                 "resources": {"limits": {GPU_RESOURCE[vendor]: gpus}, "requests": {GPU_RESOURCE[vendor]: gpus}},
                 "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}]}
    meta = {"name": name, "labels": labels, "annotations": {"dse/engine-flags": launch.source,
                                                            **_notes_annotation(launch)}}
    if kind == "llm-d":
        meta["annotations"]["dse/llm-d"] = ("llm-d deploys model servers with its ModelService Helm chart (values, "
                                            "not a custom resource); this is the plain Deployment + Service it renders")
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
        "spec": {"replicas": int(design.replicas), "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
                 "template": {"metadata": {"labels": dict(labels)},
                              "spec": {"containers": [container],
                                       "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory"}}]}}}}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "labels": dict(labels)},
               "spec": {"selector": {"app.kubernetes.io/name": name},
                        "ports": [{"name": "http", "port": PORT, "targetPort": PORT}]}}
    return [deployment, service]


#: Dynamo's worker modules, per engine: ``python3 -m dynamo.<engine>`` takes the engine's own
#: arguments (https://github.com/ai-dynamo/dynamo components/backends/vllm/deploy/README.md:
#: "vLLM workers are configured through command-line arguments"; the Dynamo vLLM guide: "full
#: compatibility with vLLM's native engine arguments"); TensorRT-LLM's worker takes its own flag
#: set (DynamoTrtllmConfig) and is not written here
DYNAMO_WORKERS = {"vllm": "dynamo.vllm", "sglang": "dynamo.sglang"}


def _dynamo(design: Design, launch: Launch, image: str | None, name: str) -> dict:
    """A DynamoGraphDeployment (nvidia.com/v1alpha1: spec.services.<name> with dynamoNamespace,
    componentType, replicas, resources.limits.gpu, extraPodSpec.mainContainer image/command/args,
    as ai-dynamo/dynamo components/backends/vllm/deploy/agg.yaml and its README lay it out)."""
    if launch.engine not in DYNAMO_WORKERS:
        raise DseError("--manifest dynamo: Dynamo's TensorRT-LLM worker takes its own flags (not trtllm-serve's); "
                       "use --engine vllm or sglang with Dynamo, or --manifest deployment")
    if design.vendor.lower() != "nvidia":
        raise DseError(f"--manifest dynamo: NVIDIA Dynamo's operator schedules NVIDIA GPUs, and {design.hardware} is "
                       f"from {design.vendor}; use --manifest deployment")
    if image is None:
        raise DseError(f"--manifest dynamo: give --image, the Dynamo {launch.engine} runtime image of your Dynamo release "
                       f"(such as nvcr.io/nvidia/ai-dynamo/vllm-runtime:0.4.1); dse ships no default")
    args = _dynamo_args(launch)
    main = {"image": image, "command": ["python3", "-m", DYNAMO_WORKERS[launch.engine]], "args": args}
    return {"apiVersion": "nvidia.com/v1alpha1", "kind": "DynamoGraphDeployment",
            "metadata": {"name": name, "annotations": {"dse/engine-flags": launch.source, **_notes_annotation(launch)}},
            "spec": {"services": {
                "Frontend": {"dynamoNamespace": name, "componentType": "frontend", "replicas": 1,
                             "extraPodSpec": {"mainContainer": {"image": image,
                                                                "command": ["python3", "-m", "dynamo.frontend"],
                                                                "args": ["--http-port", str(PORT)]}}},
                "Worker": {"dynamoNamespace": name, "componentType": "worker", "replicas": int(design.replicas),
                           "resources": {"limits": {"gpu": str(design.devices)}},
                           "extraPodSpec": {"mainContainer": main}}}}}


def _dynamo_args(launch: Launch) -> list[str]:
    """The engine's arguments as Dynamo's worker takes them: the model as --model (vLLM) or
    --model-path (SGLang), without the server's own --host/--port (the Frontend serves)."""
    argv = list(launch.argv)
    if launch.engine == "vllm":
        argv = ["--model", argv[2]] + argv[3:]
    else:
        argv = argv[3:]
    out, skip = [], False
    for w in argv:
        if skip:
            skip = False
            continue
        if w in ("--host", "--port"):
            skip = True
            continue
        out.append(w)
    return out


def manifest_yaml(design: Design, launch: Launch, objects: list[dict]) -> str:
    """manifest.yaml: the objects as YAML documents, the notes as comments at the top."""
    head = [f"# {design.model} on {design.hardware}: {launch.engine}, {design.replicas} replica(s) of "
            f"{design.devices} GPU(s); flags checked against {launch.source}"]
    head += [f"# left out / mapped: {n}" for n in launch.notes]
    body = yaml.safe_dump_all(objects, sort_keys=False, default_flow_style=False, width=120)
    return "\n".join(head) + "\n" + body
