"""The columns of a design point: every hardware, workload and cost parameter ``evaluate`` reads,
each declared once in ``TABLE``.

A design point is one entry of each column. Hardware columns start from the base preset
named in ``hardware`` (a preset name, a preset YAML path, or a ``Device``) and override
its figures; workload columns describe what runs on it. A column left out takes its
default (``DEFAULTS``); ``tp``, ``pp`` and ``devices`` left out mean "not given": the
parallel layout is then derived (``dse.system.layout``). Values are SI units (bytes,
bytes/s, ops/s, seconds, watts, dollars).

``batch`` also takes ``"max"`` (the largest batch that fits). ``flash_attention`` defaults to on
(fused attention, as the serving engines architects deploy run it); left to its default, a point
runs its engine's attention kernel (unfused for llama.cpp and FlexGen), and a point on hardware
without an on-chip buffer (no ``onchip_buffer_bytes``: Gaudi 2 and 3, GDDR6-AiM, whose presets cite
none) runs unfused attention instead of being infeasible (``Evaluation.point`` says which ran); given explicitly as true, such a point is infeasible (reason ``onchip_buffer``). ``offload`` takes ``none``,
``greedy`` or explicit fractions such as ``weights=0.5,kv=0.2``.

Serving (``serving``): ``static`` (one batch of ``batch`` sequences starts, prefills and decodes
together: static-batch benchmarks) or ``continuous`` (in-flight batching under a load: a paged KV
cache, at most ``max_running`` sequences running, prompts cut into chunks that fill a per-iteration
budget of ``prefill_chunk`` tokens). Giving a load, a length distribution, a prefix, an SLO or pools
means continuous. The serving defaults are vLLM's for its OpenAI server on a GPU of 70 GiB or more:
block_size 16, max_num_batched_tokens 8192, max_num_seqs 1024, chunked prefill on
(vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults; smaller GPUs get 2048 and 256 there).

Everything else is derived from ``TABLE``: the groups (``HARDWARE_PARAMS``, ``WORKLOAD_PARAMS``,
``COST_PARAMS``, ``PARAMS``: name -> type), ``DEFAULTS``, the ranges (``ZERO_ALLOWED``, ``BELOW``,
``AT_MOST_ONE``, ``MAY_BE_MISSING``, ``out_of_range``), the display units (``UNITS``), and the command
line's flags, checks and help (``dse.study.cli``). Adding a parameter is one entry here, plus the
physics that reads it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from basis.errors import MAX_FIGURE, DseError
from dse.core.kv_tiers import MAX_PREFIXES
from hwmodels.formats import COMPUTE_CLASSES

#: the largest count (batch, tokens, devices, layers) a design point may ask for
MAX_COUNT = 2**40
#: the largest KV-cache page a design point may ask for, in tokens (``kv_block``): 2**20, far above the pages
#: engines use (vLLM's --block-size choices stop at a few hundred tokens; its default is 16): a page is a part
#: of a context, not a multiple of the longest one
MAX_KV_BLOCK = 2**20
#: the most tokens a speculative-decoding step may draft (``spec_tokens``): far above the trees verified in
#: practice (Medusa's and EAGLE's hold tens of candidates), and small enough that a step's token counts stay
#: exact in the operator tables' integer arithmetic
MAX_SPEC_TOKENS = 4096
#: the largest Zipf exponent of the experts' popularity (``moe_skew``): at 100 the second expert already
#: gets 2^-100 of the first's tokens (every token's top-k is then the first k experts); larger adds nothing
MAX_MOE_SKEW = 100.0
#: the most redundant expert replicas (``redundant_experts``): far above DeepSeek's 32 for 256 experts
#: (DeepSeek-V3 Technical Report, arXiv 2412.19437, Sec. 3.4.1), and few enough to place at once
MAX_REDUNDANT_EXPERTS = 4096
#: how requests are scheduled (``serving``)
SERVING_MODES = ("static", "continuous")
#: how a router in front of ``router_replicas`` engines picks one (``dse.core.router``)
ROUTERS = ("round-robin", "least-outstanding", "session-affinity", "prefix-affinity")
#: the most engine replicas behind one router (``router_replicas``): far above the fleets the simulator
#: runs; enough to state any real fleet
MAX_REPLICAS = 4096
#: the most turns a session may have (``session_turns``): each turn's prompt carries every earlier one
MAX_TURNS = 1024
#: which layer prices a GPU's matmuls and attention (``kernel_layer``): the calibrated per-family
#: fractions (``fitted``), or the kernel model's achieved time per operator shape (``learned``,
#: ``dse.core.kernel_model``)
KERNEL_LAYERS = ("fitted", "learned")
#: the KV cache's second tier (``kv_tier``; ``dse.system.served``) and what preemption does (``preemption``)
KV_TIERS = ("none", "host", "cxl", "ssd")
PREEMPTIONS = ("unpriced", "recompute", "swap")
#: the scheduling policies (``scheduler``; ``dse.core.scheduling``, codes in this order)
SCHEDULERS = ("fcfs", "priority", "slo-admission")
#: how the busiest expert-parallel rank's routed tokens are taken (``expert_load``, ``workloads.routing``)
EXPERT_LOADS = ("expected", "finite")
#: the value of ``batch`` that asks for the largest batch that fits
BATCH_MAX = "max"
#: the groups of parameters: hardware (override the base preset named by ``hardware``), the
#: workload, and the cost of serving (``dse.core.economics``)
GROUPS = ("hardware", "workload", "cost")


@dataclass(frozen=True)
class Param:
    """One parameter of a design point, declared once.

    ``type``: int, float, str or bool. ``default``: its value when left out (None: "not given", the
    base preset's figure or a derived value; a numeric parameter without a default may then be NaN
    at a point: ``MAY_BE_MISSING``). The range of a number: positive, or ``zero_allowed`` (>= 0);
    at most ``MAX_COUNT`` (int) or ``MAX_FIGURE`` (float), or ``at_most`` where it declares a
    smaller bound; ``at_least`` a lower bound above 0 (a PUE); ``below`` an upper bound it must stay
    under; ``at_most_one`` a fraction.
    ``zero_is_unset``: 0 means "none" (the default), so the
    command line, where one leaves the flag out instead, refuses it. ``words``: words taken besides
    numbers (``batch``: 'max'); ``choices``: the only values of a name. ``unit``: the quantity it
    measures for display (a kind of ``dse.present.display.kind_of``: 'bytes', 'bytes_per_s',
    'ops_per_s', 'seconds', 'watts', 'dollars', 'requests_per_s', 'share'; None: a count, a name, a
    flag, or a figure shown as it is). ``flag``: its command-line option (None: study files and
    Python only); ``flag_default``: the option's default is ``default`` (stated by --help), else it
    is left out unless given (the evaluator decides; ``help`` says what happens); ``noun``: what
    a value is, for the option's error message; ``metavar``: the option's value in --help.
    ``help``: what it is, in its unit. ``required``: every design point names one. ``derived_from``: the
    template parameters that also set this figure (a point may not give both: two spellings of one figure).
    """

    name: str
    type: type
    group: str = "workload"
    help: str = ""
    default: object = None
    zero_allowed: bool = False
    below: float | None = None
    at_most: float | None = None
    at_least: float | None = None
    at_most_one: bool = False
    zero_is_unset: bool = False
    words: tuple[str, ...] = ()
    choices: tuple[str, ...] | None = None
    unit: str | None = None
    flag: str | None = None
    flag_default: bool = False
    noun: str = ""
    metavar: str | None = None
    required: bool = False
    derived_from: tuple[str, ...] = ()

    @property
    def numeric(self) -> bool:
        return self.type in (int, float)

    @property
    def may_be_missing(self) -> bool:
        """True when a NaN entry means "not given" at that point (a number without a default)."""
        return self.numeric and self.default is None

    def out_of_range(self, values: np.ndarray) -> tuple[np.ndarray, str]:
        """(True where an entry of ``values`` is not allowed, a phrase saying what is): finite, an
        integer for counts, positive (or >= 0 when ``zero_allowed``), at most ``MAX_COUNT`` /
        ``MAX_FIGURE`` (or ``at_most``), below ``below``, at most 1 for ``at_most_one``. NaN entries are flagged;
        callers that accept "not given" mask them out."""
        a = np.asarray(values, dtype=float)
        zero = self.zero_allowed
        with np.errstate(invalid="ignore"):
            if self.type is int:
                high = MAX_COUNT if self.at_most is None else self.at_most
                bad = ~np.isfinite(a) | (a != np.round(a)) | (a < (0 if zero else 1)) | (a > high)
                return bad, f"{'a non-negative' if zero else 'a positive'} integer up to {high:,}"
            bad = ~np.isfinite(a) | ((a < 0) if zero else (a <= 0)) | (a > MAX_FIGURE)
            if self.below is not None:
                bad |= a >= self.below
                return bad, f"a number {'>= 0' if zero else '> 0'} and below {self.below:g}"
            if self.at_most_one:
                bad |= a > 1.0
                return bad, f"a fraction {'>= 0' if zero else '> 0'} and at most 1"
        if self.at_most is not None:
            bad |= a > self.at_most
            return bad, f"a number {'>= 0' if zero else '> 0'} up to {self.at_most:g}"
        if self.at_least is not None:
            bad |= a < self.at_least
            return bad, f"a number at least {self.at_least:g} up to {MAX_FIGURE:g}"
        return bad, f"a finite number {'>= 0' if zero else '> 0'} up to {MAX_FIGURE:g}"


def _hardware(name: str, type_: type, help_: str, **kw) -> Param:
    return Param(name, type_, "hardware", help_, **kw)


def _cost(name: str, help_: str, **kw) -> Param:
    return Param(name, float, "cost", help_, **kw)


_CONFIG_ECONOMICS = "(default: configs/economics.yaml, cited)"
#: the template parameters that set a preset's compute peaks and its device memory
#: (``hwmodels.template.template_device``)
_COMPUTE = ("cores", "clock_hz")
_MEMORY = ("memory_stacks", "memory_type")

#: every parameter, once: hardware, then workload, then cost (the order of ``PARAMS``)
TABLE: tuple[Param, ...] = (
    # ---- hardware: override the base preset named by ``hardware``
    _hardware("hardware", str, "hardware preset (see 'list hardware') or a preset YAML path", flag="--hardware",
              required=True),
    *(_hardware(f"peak_{c}", float, f"dense peak of the {c} compute class, ops/s (a multiply-accumulate is 2 ops)",
                unit="ops_per_s", derived_from=_COMPUTE) for c in COMPUTE_CLASSES),
    _hardware("compute_scale", float, "factor on every compute peak of the preset"),
    _hardware("vector_ops_per_s", float, "peak of the vector units, ops/s", unit="ops_per_s", derived_from=_COMPUTE),
    _hardware("memory_bandwidth", float, "bandwidth of device memory, bytes/s", unit="bytes_per_s",
              derived_from=_MEMORY),
    _hardware("memory_capacity", float, "capacity of device memory, bytes", unit="bytes", derived_from=_MEMORY),
    _hardware("onchip_buffer_bytes", float, "on-chip buffer that FlashAttention tiles in, bytes (0: none)",
              zero_allowed=True, unit="bytes"),
    _hardware("link", str, "scale-up link preset replacing the device's (see 'list links'; default: the preset's)",
              flag="--link"),
    _hardware("link_bandwidth", float, "scale-up link bandwidth per direction, bytes/s", unit="bytes_per_s"),
    _hardware("link_latency", float, "scale-up link latency, seconds", zero_allowed=True, unit="seconds"),
    _hardware("topology", str, "system topology preset (configs/topologies.yaml: devices per scale-up domain, its "
              "shape, each device's scale-out NIC; default: the hardware preset's own, else one scale-up link for "
              "every device)", flag="--topology", metavar="NAME"),
    _hardware("scale_up_size", int, "devices per scale-up domain; a tensor- or expert-parallel group larger than it "
              "pays the scale-out tier for its inter-domain part (default: the topology's)", flag="--scale-up-size",
              noun="a device count"),
    _hardware("scale_out", str, "each device's scale-out NIC, a configs/links.yaml name such as ib-ndr (default: "
              "the topology's)", flag="--scale-out", metavar="LINK"),
    _hardware("host_tier", str, "offload to this tier instead of host DRAM (see 'list tiers': CXL expanders, NVMe; "
              "default: the preset's host memory)", flag="--host-tier"),
    _hardware("host_link_bandwidth", float, "bandwidth of the link to the host tier, bytes/s", unit="bytes_per_s"),
    _hardware("host_memory_capacity", float, "host memory to offload to, bytes (0: none)", zero_allowed=True,
              unit="bytes"),
    _hardware("host_memory_bandwidth", float, "bandwidth of host memory, bytes/s", unit="bytes_per_s"),
    _hardware("host_cpu", str, "CPU preset computing --cpu-layers (default: the device's host_cpu)",
              flag="--host-cpu"),
    _hardware("pim_multiple", float, "internal bandwidth of processing-in-memory as a multiple of the external"),
    _hardware("pim_peak", float, "compute peak of processing-in-memory, ops/s", unit="ops_per_s"),
    _hardware("native_formats", str, "the formats the device computes natively, comma-separated"),
    _hardware("tdp_w", float, "thermal design power of one device, W", unit="watts", derived_from=("power_limit_w",)),
    _hardware("price_usd", float, "price of one device in $ (default: the preset's cited price, if any)",
              unit="dollars", flag="--price-usd", noun="an amount in $"),
    _hardware("static_power_w", float, "static (idle) power of one device in W (default: the preset's cited figure "
              "or its measured energy profile's; energy per token is unknown without one)", zero_allowed=True,
              unit="watts", flag="--static-power-w", noun="a power in W"),
    _hardware("host_power_w", float, "power of the host server beyond the accelerators (CPUs, memory, NICs, "
              "fans, power conversion) in W per device, drawn whenever the system is on: added to energy per "
              "token, power and $ per million tokens (default: 0, the accelerators alone, as ML.ENERGY "
              "measures them; a DGX H100's rated maximum leaves 575 W per GPU, README 'Energy')",
              zero_allowed=True, unit="watts", flag="--host-power-w", noun="a power in W"),
    _hardware("power_cap_w", float, "operator's power cap of one device in W (nvidia-smi -pl; default: none, "
              "the TDP is the limit): a design whose demand exceeds its limit runs at lower clocks, slower and "
              "cooler (configs/power.yaml dvfs), instead of being refused", unit="watts", flag="--power-cap-w",
              noun="a power in W"),
    # the accelerator template (``hwmodels.template.TEMPLATE_COLUMNS``): vary the microarchitecture of a
    # preset that has one (a100-80gb, h100-sxm)
    _hardware("cores", int, "template: compute cores (SMs)"),
    _hardware("clock_hz", float, "template: clock, Hz"),
    _hardware("l2_bytes", float, "template: L2 cache, bytes", unit="bytes"),
    _hardware("memory_stacks", int, "template: memory stacks (HBM)"),
    _hardware("memory_type", str, "template: memory technology (hwmodels.template)"),
    _hardware("process_node", str, "template: process node (hwmodels.template)"),
    _hardware("power_limit_w", float, "template: board power limit, W", unit="watts"),
    # ---- workload (``devices`` alone sets tp = devices / (pp x ep))
    Param("model", str, help="model name (see 'list models') or path to a config.json", flag="--model",
          required=True),
    Param("batch", int, help="sequences per batch, or 'max' (the largest that fits)", default=1, words=(BATCH_MAX,),
          flag="--batch", flag_default=True),
    Param("prompt_len", int, help="prompt tokens", default=512, flag="--prompt-len", flag_default=True),
    Param("gen_len", int, help="generated tokens", default=128, flag="--gen-len", flag_default=True),
    Param("images", int, default=0, zero_allowed=True, flag="--images", flag_default=True, noun="a number of images",
          help="vision-language models: still images each request carries; their tokens (by the model's own "
               "processor rules, workloads.vision) join the prompt and its vision encoder runs before the "
               "prefill (default: 0, text only)"),
    Param("image_size", str, default="1024", flag="--image-size", flag_default=True, metavar="PIXELS",
          help="vision-language models: each image's size in pixels, a side ('1024', a square) or "
               "'HEIGHTxWIDTH' ('768x1024') (default: 1024)"),
    Param("weights", str, help="weights format (see 'list formats')", default="fp16", flag="--weights",
          flag_default=True),
    Param("activations", str, help="activations format", default="fp16", flag="--activations", flag_default=True),
    Param("kv", str, help="KV-cache format", default="fp16", flag="--kv", flag_default=True),
    Param("devices", int, help="devices (default: tp x pp x ep; given alone, all of them tensor parallel)",
          flag="--devices"),
    Param("tp", int, help="tensor-parallel degree (default: devices / (pp x ep), else 1)", flag="--tp"),
    Param("pp", int, help="pipeline-parallel stages (default: 1)", flag="--pp"),
    Param("ep", int, help="expert-parallel groups for MoE models (devices = tp x pp x ep)", default=1, flag="--ep",
          flag_default=True),
    Param("cp", int, default=1, flag="--cp", flag_default=True,
          help="context-parallel ranks: a long prompt's tokens split over cp rings of tp devices, its K/V "
               "chunks sent around the ring (ring attention), the KV cache sharded cp ways; devices = "
               "tp x pp x ep x cp (default: 1)"),
    Param("flash_attention", bool, default=True, flag="--flash-attention",
          help="fused attention, one operator tiled in the on-chip buffer, as serving engines run it "
               "(default: on where the hardware has an on-chip buffer, onchip_buffer_bytes; on hardware "
               "without one, unfused with a note; --flash-attention there is an error; "
               "--no-flash-attention: separate qk, softmax and sv operators)"),
    Param("offload", str, help="none | greedy | fractions on the host tier, e.g. weights=0.5,kv=0.2", default="none",
          flag="--offload", flag_default=True),
    Param("overlap", bool, help="host-tier transfers overlap compute (--no-overlap: add to it)", default=True,
          flag="--overlap", flag_default=True),
    Param("sequence_parallel", bool, default=False, flag="--sequence-parallel", flag_default=True,
          help="sequence-parallel activations (Korthikanti et al., 'Reducing Activation Recomputation in Large "
               "Transformer Models', MLSys 2023, Sec. 4.2.2; vLLM's sequence-parallelism pass): under tensor "
               "parallelism each all-reduce becomes a reduce-scatter and an all-gather (the ring all-reduce's "
               "own two halves: the same bytes and hops) and the norms and residual adds between them run on "
               "1/tp of the tokens a device (default: off)"),
    Param("two_batch_overlap", bool, default=False, flag="--two-batch-overlap", flag_default=True,
          help="two-batch overlap (DeepSeek-V3 report Sec. 3.4, SGLang's TBO): each step runs as two "
               "micro-batches of half the sequences, one's collectives (all-reduces, expert dispatch and "
               "combine) under the other's computation; each reads the weights (default: off)"),
    Param("sparse", bool, help="2:4 sparse weights: the same as --sparsity 2:4", default=False, flag="--sparse",
          flag_default=True),
    Param("cpu_layers", int, help="run this many layers on the host CPU (llama.cpp-style split)", default=0,
          zero_allowed=True, flag="--cpu-layers", flag_default=True),
    Param("max_context", int, default=0, zero_allowed=True, flag="--max-context", flag_default=True,
          help="context limit in tokens for prompt + generation (default: 0, the model's "
               "max_position_embeddings; larger serves a longer one with RoPE scaling)"),
    Param("serving", str, default="static", choices=SERVING_MODES, flag="--serving",
          help="static: one batch of --batch sequences starts, prefills and decodes together (static-batch "
               "benchmarks); continuous: in-flight batching under a load, paged KV cache, chunked prefill "
               "(default: static, continuous when --concurrency or --request-rate is given; continuous "
               "without a load runs --batch requests in a closed loop)"),
    Param("concurrency", int, help="continuous batching, closed loop: this many requests always in flight",
          default=0, zero_allowed=True, zero_is_unset=True, flag="--concurrency"),
    Param("request_rate", float, help="continuous batching, open loop: requests/s arriving as a Poisson process",
          default=0.0, zero_allowed=True, zero_is_unset=True, unit="requests_per_s", flag="--request-rate",
          noun="requests per second"),
    Param("num_prompts", int, default=0, zero_allowed=True, zero_is_unset=True, flag="--num-prompts",
          help="continuous batching, open loop: the run sends this many requests in all (vLLM's and SGLang's "
               "benchmark_serving --num-prompts); at a request rate past what the design serves they queue and "
               "drain instead of the steady state's saturation, their TTFT and end-to-end latency the wait "
               "(default: none, an endless run)"),
    Param("burstiness", float, default=1.0, flag="--burstiness", at_most=100.0,
          help="continuous batching, open loop: arrival gaps drawn from a gamma distribution of this shape "
               "(vLLM's benchmark_serving --burstiness: 1 a Poisson process, below 1 burstier, above 1 more "
               "regular); the gaps' squared coefficient of variation is 1 / burstiness"),
    Param("kv_block", int, help="tokens per KV-cache page (vLLM's block_size)", default=16, at_most=MAX_KV_BLOCK,
          flag="--kv-block", flag_default=True),
    Param("prefill_chunk", int, default=8192, zero_allowed=True, flag="--prefill-chunk", flag_default=True,
          help="tokens one iteration processes, decode plus prompt chunks (Sarathi-Serve; vLLM's "
               "max_num_batched_tokens); 0: whole prompts, prefill-first"),
    Param("max_running", int, help="sequences running at once (vLLM's max_num_seqs)", default=1024,
          flag="--max-running", flag_default=True),
    Param("lengths", str, default="fixed", flag="--lengths",
          help="continuous batching: request lengths, 'fixed' (--prompt-len and --gen-len), 'lognormal' "
               "(those means, sigma 1), 'lognormal:sigma=S' or 'lognormal:prompt_sigma=S,gen_sigma=S', or "
               "a CSV file of prompt_len,gen_len rows (a trace; its means replace --prompt-len and "
               "--gen-len)"),
    Param("prefix_hit", float, default=0.0, zero_allowed=True, below=1.0, unit="share", flag="--prefix-hit",
          noun="a share",
          help="continuous batching: share of the mean prompt that is a prefix every request shares, "
               "cached once (automatic prefix caching: whole KV blocks, not recomputed)"),
    Param("slo_ttft", float, default=0.0, zero_allowed=True, zero_is_unset=True, unit="seconds", flag="--slo-ttft",
          noun="seconds",
          help="SLO on time to first token, seconds, at --slo-percentile: goodput is the largest "
               "request rate meeting the SLOs"),
    Param("slo_tpot", float, help="SLO on time per output token, seconds, at --slo-percentile", default=0.0,
          zero_allowed=True, zero_is_unset=True, unit="seconds", flag="--slo-tpot", noun="seconds"),
    Param("slo_percentile", float, help="the percentile the SLOs hold at", default=90.0, below=100.0,
          flag="--slo-percentile", noun="a percentile"),
    Param("disaggregate", str, default="none", flag="--disaggregate", metavar="P:D",
          help="continuous batching on two pools: prompts on P devices, decoding on D others, the KV "
               "cache sent over the link (DistServe, Splitwise); engines of --tp devices (default: the "
               "largest dividing P and D)"),
    Param("encoder_devices", int, default=0, zero_allowed=True, zero_is_unset=True, flag="--encoder-devices",
          noun="a number of devices",
          help="disaggregated vision-language models (E:P:D): devices of a pool of their own running the vision "
               "encoder, engines of the prefill pool's layout; each request's image embeddings cross the P/D "
               "link to the prefill pool and the encoder pool's queue adds to TTFT (0: the encoder runs on the "
               "prefill engines)"),
    Param("decode_tp", int, flag="--decode-tp",
          help="disaggregated: the decode pool's tensor-parallel degree (default: tp, the prefill pool's)"),
    Param("decode_ep", int, flag="--decode-ep",
          help="disaggregated: the decode pool's expert-parallel degree (default: ep, the prefill pool's; "
               "DeepSeek prefills on EP 32 and decodes on EP 144)"),
    Param("decode_hardware", str, default="same", flag="--decode-hardware", metavar="HW",
          help="disaggregated: the decode pool's hardware preset (see 'list hardware'), e.g. an MI355X decode pool "
               "fed by H200 prefill engines (Splitwise's H100 prompt and A100 token machines); its memory, peaks "
               "and price are its own (default: same, the point's hardware)"),
    Param("pd_link", str, default="default", flag="--pd-link", metavar="LINK",
          help="disaggregated: the link the KV cache crosses from the prefill to the decode pool (see 'list links'; "
               "default: the scale-up link when both pools are one hardware, else the slower of the two "
               "hardware's scale-out NICs, configs/topologies.yaml)"),
    Param("target_rate", float, default=0.0, zero_allowed=True, zero_is_unset=True,
          help="requests/s a whole service must carry: it takes ceil(target_rate / goodput) engines like this one "
               "(``replicas``; needs an SLO; 0: none)"),
    Param("engine", str, default="default", flag="--engine",
          help="serving-engine profile (see 'list engines'): launch, all-reduce and scheduler costs, "
               "attention kernel and batching of vllm, sglang, trt-llm, trt-llm-legacy, tgi, lmdeploy, "
               "mlc-llm, llama.cpp, gaudi, jetstream, neuron, ... (default: vllm, a modern engine: CUDA "
               "graphs, custom one-shot all-reduce, fused attention, continuous batching)"),
    Param("kernel_layer", str, default="fitted", choices=KERNEL_LAYERS, flag="--kernel-layer",
          help="how a GPU's matmuls and attention are priced: fitted (the calibrated family fractions) or "
               "learned (the kernel layer's achieved time of each operator's shape on the point's hardware, "
               "configs/kernel_model.yaml; other hardware classes keep their fractions) (default: fitted)"),
    Param("sparsity", str, default="none", flag="--sparsity",
          help="N:M structured weight sparsity, e.g. 2:4: weights stored compressed (kept values plus a "
               "ceil(log2 M)-bit index each), computed at the device's 2:4 sparse peak where it has one, "
               "else dense (default: none)"),
    Param("weight_density", float, default=1.0, at_most_one=True, flag="--weight-density",
          help="unstructured weight sparsity: the share of weights kept, stored as a bitmask or CSR "
               "(the smaller), computed dense (default: 1, dense)"),
    Param("activation_sparsity", float, default=1.0, at_most_one=True, flag="--activation-sparsity",
          help="contextual sparsity (Deja Vu): the fraction of MLP neurons and attention heads active "
               "per token in decode, with its predictors' cost (default: 1, dense)"),
    Param("layers_used", float, default=1.0, at_most_one=True, flag="--layers-used",
          help="early exit: the mean fraction of layers a generated token runs, with an exit "
               "classifier per layer (default: 1, every layer)"),
    Param("kv_budget", int, default=0, zero_allowed=True, flag="--kv-budget",
          help="tokens of K and V kept per sequence and layer (H2O, StreamingLLM, SnapKV): caps the KV "
               "cache and the keys a decode step reads (default: 0, all)"),
    Param("prune", str, default="none", flag="--prune",
          help="structured pruning as a transform of the model: 'layers=N,heads=N,kv_heads=N,"
               "intermediate=N,hidden=N' (any of them; default: none)"),
    Param("spec_draft", str, default="none", flag="--spec-draft",
          help="speculative decoding: the draft model (see 'list models', or a config.json), run at tp 1 "
               "beside the target, 'self:N', the target's first N layers, 'medusa:N' heads, 'mtp:N' (the "
               "model's MTP modules chained N deep) or 'eagle' (one decoder layer on the target's features); "
               "mtp and eagle may end in @a1,a2,...: the acceptance by depth (default: none)"),
    Param("spec_tokens", int, help="speculative decoding: tokens drafted per target step (gamma)", default=0,
          zero_allowed=True, zero_is_unset=True, at_most=MAX_SPEC_TOKENS, flag="--spec-tokens"),
    Param("spec_acceptance", float, default=0.0, zero_allowed=True, at_most_one=True, flag="--spec-acceptance",
          noun="an acceptance rate",
          help="speculative decoding: the per-token acceptance rate alpha, 0 to 1 (default: 0)"),
    Param("weights_edge", str, default="none", flag="--weights-edge",
          help="mixed precision by layer: the format of the first and the last layer's weights, e.g. int8 "
               "around --weights int4 (default: none, every layer in --weights)"),
    # ---- MoE routing (``workloads.routing``): how the routed tokens spread over the experts and the EP ranks
    Param("moe_skew", float, default=0.0, zero_allowed=True, at_most=MAX_MOE_SKEW, flag="--moe-skew",
          noun="a Zipf exponent",
          help="MoE models: Zipf skew s of the experts' popularity, p_i proportional to i^-s over expert ids "
               "(0: uniform; expert 0 the hottest, so contiguous placement puts the hot experts on one rank); "
               "the expert step waits for the busiest expert-parallel rank (default: 0)"),
    Param("redundant_experts", int, default=0, zero_allowed=True, at_most=MAX_REDUNDANT_EXPERTS,
          flag="--redundant-experts",
          noun="a number of expert replicas",
          help="MoE models: extra replicas of the hottest experts, packed onto the EP ranks to balance their "
               "load (DeepSeek's EPLB); experts plus replicas must divide over --ep (default: 0)"),
    Param("capacity_factor", float, default=0.0, zero_allowed=True, flag="--capacity-factor",
          noun="a capacity factor",
          help="MoE models: an expert takes at most this many times the mean tokens per expert, the rest are "
               "dropped (moe_dropped_fraction) (default: 0, no dropping)"),
    Param("expert_histogram", str, default="none", flag="--expert-histogram", metavar="FILE",
          help="MoE models: measured tokens per expert, a CSV file with a header 'expert,count' or "
               "'layer,expert,count' (experts numbered from 0), instead of --moe-skew (default: none)"),
    Param("expert_load", str, default="expected", choices=EXPERT_LOADS, flag="--expert-load",
          help="MoE models: the busiest expert-parallel rank's routed tokens: expected (the popularity "
               "alone) or finite (plus the chance spread of a finite batch: the expected most of the ranks' "
               "counts taken as normal, which exceeds the mean even under uniform routing at "
               "small batches) (default: expected)"),
    # ---- the cost of serving (``dse.core.economics``); left out, the cited defaults of configs/economics.yaml
    _cost("electricity_usd_per_kwh", f"electricity price for $ per million tokens {_CONFIG_ECONOMICS}",
          flag="--electricity-usd-per-kwh", noun="an amount in $"),
    _cost("amortization_years", f"years a system's price is spread over {_CONFIG_ECONOMICS}",
          flag="--amortization-years", noun="a number of years"),
    _cost("utilization", "share of the time the system serves at the modelled rate, in (0, 1] (default: 1)",
          at_most_one=True, flag="--utilization"),
    _cost("pue", "facility power usage effectiveness: facility energy over the IT energy, at least 1 "
          f"{_CONFIG_ECONOMICS}", flag="--pue", noun="a PUE", at_least=1.0),
    _cost("host_cost_share", "the host server's cost (CPUs, memory, board, chassis) per $ of accelerator, >= 0 "
          f"{_CONFIG_ECONOMICS}", zero_allowed=True, flag="--host-cost-share", noun="a share"),
    _cost("network_cost_share", "the network's share of the whole hardware cost, in [0, 1) "
          f"{_CONFIG_ECONOMICS}", zero_allowed=True, below=1.0, flag="--network-cost-share", noun="a share"),
    # ---- replicas behind a router, and multi-turn sessions (``dse.core.router``, ``dse.core.sessions``)
    Param("router_replicas", int, default=1, at_most=MAX_REPLICAS, flag="--replicas", flag_default=True,
          noun="a number of engine replicas",
          help="continuous batching: engines like this one behind a router sharing the load (request_rate and "
               "concurrency are the whole fleet's; a point's metrics are one replica's) (default: 1)"),
    Param("router", str, default="round-robin", choices=ROUTERS, flag="--router", flag_default=True,
          help="how the router picks a replica: round-robin (in turn), least-outstanding (fewest requests queued "
               "and running), session-affinity (a session's turns on the replica of its first, which the fewest "
               "outstanding picked), prefix-affinity (every request of a shared prefix, --prefix-count, on one "
               "replica: prefix rank p on replica p mod N; its cache sees only its own prefixes, at the cost of "
               "balance under a skewed popularity) (default: round-robin)"),
    Param("session_turns", int, default=1, at_most=MAX_TURNS, flag="--session-turns", flag_default=True,
          noun="a number of turns",
          help="continuous batching, open loop: requests come in sessions of this many turns, each turn's "
               "prompt the session's history (every earlier prompt and output) plus prompt_len new tokens; "
               "request_rate counts turns (default: 1, no sessions)"),
    Param("think_time", float, default=0.0, zero_allowed=True, unit="seconds", flag="--think-time",
          flag_default=True, noun="seconds",
          help="sessions: mean seconds from a turn's last token to the session's next turn (exponential: "
               "users and tools vary) (default: 0)"),
    # ---- the scheduling policy (``dse.core.scheduling``)
    Param("scheduler", str, default="fcfs", choices=SCHEDULERS, flag="--scheduler", flag_default=True,
          help="continuous batching, open loop: the order the engine admits waiting requests in: fcfs (arrival "
               "order, vLLM's default), priority (a share --priority-share of the requests admitted before the "
               "others, non-preemptive; metrics ttft_high_s, ttft_low_s, tpot_high_s, tpot_low_s) or "
               "slo-admission (a request still waiting for admission after --slo-ttft seconds is dropped: it "
               "can no longer meet its SLO; metric dropped_share) (default: fcfs)"),
    Param("priority_share", float, default=0.1, below=1.0, unit="share", flag="--priority-share",
          flag_default=True, noun="a share",
          help="--scheduler priority: the share of the requests in the high-priority class, in (0, 1) "
               "(default: 0.1)"),
    Param("slo_ttft_high", float, default=0.0, zero_allowed=True, zero_is_unset=True, unit="seconds",
          flag="--slo-ttft-high", noun="seconds",
          help="--scheduler priority: the high class's own TTFT SLO, seconds, at --slo-percentile (--slo-ttft "
               "is then the low class's); goodput is the largest rate at which each class meets its own "
               "(default: 0, the high class held to --slo-ttft too)"),
    # ---- the KV cache's second tier under load and preemption (``dse.core.kv_tiers``)
    Param("kv_tier", str, default="none", choices=KV_TIERS, flag="--kv-tier",
          help="continuous batching: a second tier for the KV cache, 'host' (the device's host DRAM over its "
               "host link), 'cxl' (a CXL memory box, configs/tiers.yaml cxl-cmm-b-16tb) or 'ssd' (an NVMe "
               "drive, nvme-990pro-2tb), at its achieved bandwidth: it holds shared prefixes the device "
               "evicted (reloaded instead of recomputed) and swapped-out sequences (default: none)"),
    Param("preemption", str, default="unpriced", choices=PREEMPTIONS, flag="--preemption",
          help="continuous batching: what the scheduler does to the latest sequence when the device's KV "
               "blocks run out, priced in the steady state: recompute (drop its KV, prefill it again; vLLM's "
               "default) or swap (write its KV to --kv-tier and read it back); unpriced: the steady state "
               "leaves preemption out, as before this option (the simulator recomputes) (default: unpriced)"),
    Param("prefix_count", int, default=1, flag="--prefix-count", flag_default=True, at_most=MAX_PREFIXES,
          help="continuous batching with --prefix-hit: distinct shared prefixes (system prompts, documents) "
               "the prompts start with, drawn with a Zipf popularity (--prefix-zipf); the device keeps one, "
               "--kv-tier the least recently used others its capacity holds: the hit rate follows (Che's "
               "approximation) (default: 1, every prompt the same prefix)"),
    Param("prefix_zipf", float, default=1.0, zero_allowed=True, at_most=MAX_MOE_SKEW, flag="--prefix-zipf",
          flag_default=True, noun="a Zipf exponent",
          help="the Zipf exponent of the shared prefixes' popularity, share of rank i proportional to i^-s "
               "(0: uniform) (default: 1)"),
)
#: each parameter's declaration by name
SPEC: dict[str, Param] = {p.name: p for p in TABLE}


def _types(group: str) -> dict[str, type]:
    return {p.name: p.type for p in TABLE if p.group == group}


#: hardware-template parameters (override the base preset named by ``hardware``): name -> type
HARDWARE_PARAMS = _types("hardware")
#: workload parameters: name -> type
WORKLOAD_PARAMS = _types("workload")
#: the cost of ownership: electricity price ($/kWh), the years a system's price is spread over, the
#: share of the time it serves, the facility's PUE, the host's and the network's shares of the capital;
#: left out, the cited defaults of ``configs/economics.yaml``
COST_PARAMS = _types("cost")
PARAMS = {**HARDWARE_PARAMS, **WORKLOAD_PARAMS, **COST_PARAMS}
#: the value of each parameter left out (those without one are "not given")
DEFAULTS = {p.name: p.default for p in TABLE if p.default is not None}
#: numeric parameters that may be 0 (all others must be positive)
ZERO_ALLOWED = tuple(p.name for p in TABLE if p.numeric and p.zero_allowed)
#: numeric parameters with an upper bound they must stay below (a share, a percentile)
BELOW = {p.name: p.below for p in TABLE if p.below is not None}
#: numeric parameters that are fractions: at most 1
AT_MOST_ONE = tuple(p.name for p in TABLE if p.at_most_one)
#: numeric parameters whose NaN entries mean "not given" at that point (the layout follows
#: from the others; a hardware figure is the base preset's own; a cost, economics.yaml's)
MAY_BE_MISSING = tuple(p.name for p in TABLE if p.may_be_missing)
#: parameters every design point must name
REQUIRED = tuple(p.name for p in TABLE if p.required)
#: figures a template parameter also sets: figure -> those parameters (a point gives one spelling)
DERIVED_FROM = {p.name: p.derived_from for p in TABLE if p.derived_from}
#: the quantity each parameter measures, for display (``dse.present.display.kind_of``; None: shown as it is)
UNITS = {p.name: p.unit for p in TABLE}


def checked_choice(name: str, value) -> str:
    """``value`` when it is one of parameter ``name``'s declared ``choices``; DseError naming the
    parameter and what it allows otherwise."""
    allowed = SPEC[name].choices
    if value not in allowed:
        raise DseError(f"{name}: expected one of {', '.join(allowed)}, got {value!r}")
    return value


def out_of_range(name: str, values: np.ndarray) -> tuple[np.ndarray, str]:
    """(True where an entry of numeric parameter ``name`` is not allowed, a phrase saying
    what is): ``Param.out_of_range`` of its declaration."""
    return SPEC[name].out_of_range(values)


__all__ = ["Param", "TABLE", "SPEC", "checked_choice", "out_of_range", "MAX_COUNT", "MAX_FIGURE", "PARAMS", "HARDWARE_PARAMS",
           "WORKLOAD_PARAMS", "COST_PARAMS", "DEFAULTS", "ZERO_ALLOWED", "BELOW", "AT_MOST_ONE", "BATCH_MAX",
           "MAY_BE_MISSING", "REQUIRED", "MAX_KV_BLOCK", "MAX_SPEC_TOKENS", "DERIVED_FROM", "SERVING_MODES", "KERNEL_LAYERS",
           "UNITS", "GROUPS", "ROUTERS", "KV_TIERS", "PREEMPTIONS", "SCHEDULERS", "EXPERT_LOADS"]
