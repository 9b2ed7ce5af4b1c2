"""``python -m dse.study``: analyze, list, show.

Every user error prints one line ``dse.study: error: ...`` and exits with status 2;
nothing heavier than numpy and PyYAML is imported on the analyze path.
"""
from __future__ import annotations

import argparse
import difflib
import math
import os
import re
import signal
import sys
import threading
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from basis.errors import MAX_FIGURE, DseError, shown_path
from basis.files import output_folder, write_error_cause
from basis.memory import free_nothing_at_exit, keep_freed_memory
from basis.progress import set_total
from basis.units import axis_scale
from dse.app import cli as app_cli
from dse.core.bands import COVERAGE
from dse.core.engines import default_engine, engines
from dse.explore.executors import start_server
from dse.explore.spec import SEED_LIMIT
from dse.present import display, plots
from dse.present.compare import check_plot_path, compare_rows, show
from dse.present.drawing import Drawer
from dse.study import calibration_cli, deploy_cli, fleet_cli, plan_cli
from dse.study.studyfile import available_studies, load_study, study_path
from dse.system.analysis import (
    ENERGY_COST_METRICS,
    MAX_SIMULATED,
    ROW_KEYS,
    SCHEDULER_METRICS,
    SERVING_LOAD_METRICS,
    analyze_point,
    simulate_point,
)
from dse.system.evaluator import evaluate
from dse.system.hardware import check_design
from dse.system.params import SPEC, TABLE, Param
from dse.system.reasons import MEMORY_CODES
from hwmodels.formats import FORMATS
from hwmodels.links import available_links, load_link
from hwmodels.presets import available_hardware, load_device
from hwmodels.template import template_figures
from hwmodels.tiers import available_tiers, load_tier
from hwmodels.topology import topology_rows
from workloads.encoder import with_images
from workloads.footprint import active_parameter_count, parameter_count
from workloads.model import available_models, load_model
from workloads.vision import parameter_count as vision_parameter_count
from workloads.vision import parse_image_size

#: how the command was started, for usage lines: the console script `dse`, or the module
PROG = "dse" if Path(sys.argv[0]).name == "dse" else "python -m dse.study"


class _Help(argparse.RawDescriptionHelpFormatter):
    """Help that states every option's default ('(default: 512)', '(default: off)') unless its
    text already does, and keeps the example lines of an epilog as written."""

    def _get_help_string(self, action):
        text = action.help or ""
        d = action.default
        if not action.option_strings or "default" in text or d is None or d is argparse.SUPPRESS:
            return text
        return f"{text} (default: {('on' if d else 'off') if isinstance(d, bool) else d})"


class _Parser(argparse.ArgumentParser):
    def __init__(self, *a, **kw):
        kw.setdefault("formatter_class", _Help)
        super().__init__(*a, **kw)

    def error(self, message):  # one line, non-zero exit
        if "required: command" in message:
            message = "choose a command: analyze, compare, plan, fleet, deploy, explore, run, validate, calibrate, list, show (see --help)"
        raise DseError(f"{self.prog.replace(PROG, '').strip() or 'usage'}: {message}")


def flag_type(p: Param):
    """The argparse ``type`` of parameter ``p``'s flag: a number of its type in its declared range
    (``Param.out_of_range``, the check of its column; 0 refused where 0 means "none", the flag then
    left out), or one of its ``words``; ArgumentTypeError saying what is allowed."""
    q = replace(p, zero_allowed=False) if p.zero_is_unset else p

    def parse(text: str):
        if text in q.words:
            return text
        try:    # ASCII only: Python's int() and float() also read other scripts' digits ('١٢', but not '²')
            v = (int(text) if q.type is int else float(text)) if text.isascii() else None
        except ValueError:
            v = None
        x = math.nan if v is None else float(v) if abs(v) <= MAX_FIGURE else math.inf
        bad, allowed = q.out_of_range(np.array([x]))
        if bad[0]:
            words = "".join(f" or '{w}'" for w in q.words)
            raise argparse.ArgumentTypeError(f"expected {q.noun + ': ' if q.noun else ''}{allowed}{words}, "
                                             f"got '{text}'")
        return v
    parse.__name__ = p.name
    return parse


#: the argparse ``type`` of a positive count that is no parameter (--trials, --workers)
_positive_int = flag_type(Param("count", int, group="run"))
#: the most worker processes ``run`` starts on this machine: 8 a CPU (more only share the same CPUs;
#: an optuna study started one process per worker asked, so --workers 100000 was a fork bomb)
MAX_WORKERS = 8 * (os.cpu_count() or 1)
#: the argparse ``type`` of --workers
_workers = flag_type(Param("workers", int, group="run", at_most=MAX_WORKERS,
                           noun=f"worker processes on this machine's {os.cpu_count() or 1} CPU(s)"))
#: the argparse ``type`` of --simulate: requests, at most what the simulator runs (``MAX_SIMULATED``;
#: its lower bound, 10, is the simulator's own check)
_requests = flag_type(Param("simulate", int, group="run", at_most=MAX_SIMULATED, noun="a number of requests"))


def _seed(text: str) -> int:
    try:
        v = int(text) if text.isascii() else int("not ASCII")
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer from 0 to {SEED_LIMIT - 1}, got '{text}'") from None
    if not 0 <= v < SEED_LIMIT:
        raise argparse.ArgumentTypeError(f"expected an integer from 0 to {SEED_LIMIT - 1}, got {v}")
    return v


_folder = calibration_cli.nonempty_path("a folder path", "runs/<study name>")


def _shown(value) -> str:
    """A default as --help states it: on/off for a flag, '90' for 90.0."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _flag_help(p: Param) -> str:
    """The --help text of ``p``'s flag: its declared help, with its default where neither the help
    nor argparse (a flag whose default is the declared one: ``_Help``) states it ('none' where 0
    means none)."""
    if p.flag_default or p.default is None or "default" in p.help:
        return p.help
    return f"{p.help} (default: {'none' if p.zero_is_unset and p.default == 0 else _shown(p.default)})"


def add_flag(parser: argparse.ArgumentParser, p: Param, **kw) -> None:
    """Parameter ``p``'s flag on ``parser``, its type, check, choices, default and help from its
    declaration (``dse.system.params.TABLE``); ``kw`` adds or replaces argparse arguments."""
    args = {"default": p.default if p.flag_default else None, "help": _flag_help(p)}
    if p.type is bool:
        args["action"] = argparse.BooleanOptionalAction
    elif p.numeric:
        args["type"] = flag_type(p)
    for key in ("choices", "metavar", "required"):
        if getattr(p, key):
            args[key] = getattr(p, key)
    parser.add_argument(p.flag, dest=p.name, **{**args, **kw})


#: the order of the parameters' flags in --help: the workload first
_FLAG_ORDER = ("workload", "hardware", "cost")


def _add_workload_args(p):
    """The flags of every parameter that has one (``dse.system.params.TABLE``), but ``--hardware``:
    each command adds that in its own words; and ``--ideal``."""
    for group in _FLAG_ORDER:
        for param in TABLE:
            if param.group == group and param.flag and param.name != "hardware":
                add_flag(p, param)
    p.add_argument("--ideal", action="store_true",
                   help="pure roofline bound: efficiency 1, no overheads (default: off, the calibrated "
                        "efficiency model)")


#: example command lines of each subcommand (shown under its --help), and of the whole tool
EXAMPLES = {
    "analyze": ("dse analyze --model llama-3.1-8b --hardware h100-sxm --batch 16 --prompt-len 1024 --gen-len 256 "
                "--weights fp8 --activations fp8 --kv fp8",
                "dse analyze --model llama-3.1-405b --hardware h100-sxm --tp 8 --pp 2 --link ib-ndr --batch 8",
                "dse analyze --model llama-2-70b --hardware h100-sxm --offload greedy --no-overlap",
                "dse analyze --model llama-2-7b --hardware tpu-v5e --no-flash-attention --format json"),
    "compare": ("dse compare --model llama-3.1-70b --hardware h100-sxm h200 b200 mi300x --devices 2 --weights fp8 "
                "--activations fp8 --kv fp8",
                "dse compare --model llama-2-7b --hardware h100-sxm l40s --batch max --plot compare.png",
                "dse compare --model mixtral-8x7b --hardware h100-sxm mi300x --format csv"),
    "run": ("dse run quant-roofline",
            "dse run gpu-sweep-1m --out runs/gpu-sweep-1m --quiet",
            "dse run gpu-pareto-optuna --workers 2 --trials 500",
            "dse run my-study.yaml --overwrite --workers 2 --rows none"),
    "list": ("dse list models", "dse list hardware", "dse list hardware --format names",
             "dse list models --format csv > models.csv"),
    "show": ("dse show hardware h100-sxm", "dse show model deepseek-v3",
             "dse show study gpu-sweep-1m --format json"),
    "validate": ("dse validate", "dse validate --ideal", "dse validate --measured my-measurements.csv --out runs/mine"),
    "deploy": ("dse deploy --model llama-3.1-70b --hardware h100-sxm --tp 8 --weights fp8 --activations fp8 --kv fp8 "
               "--concurrency 64 --engine vllm",
               "dse deploy --run runs/capacity-planning --point 61 --engine sglang --out deploy/",
               "dse deploy --model mixtral-8x7b --hardware h100-sxm --tp 2 --ep 4 --engine trtllm --manifest llm-d"),
    "plan": ("dse plan --model llama-3.1-70b --hardware h100-sxm mi300x --request-rate 20 --prompt-len 2048 "
             "--gen-len 256 --slo-ttft 1 --slo-tpot 0.05",
             "dse plan --model llama-3.1-8b --hardware l40s h100-sxm --request-rate 50 --slo-tpot 0.03 --format json",
             "dse plan --study plan-llama70b"),
    "fleet": ("dse fleet --model llama-3.1-8b --hardware rtx-4090 h100-sxm --rate-curve 8:5,10:40,6:15 "
              "--buckets 0.8:256:256,0.2:8192:256 --slo-ttft 1 --slo-tpot 0.04",
              "dse fleet --study fleet-mix"),
    "calibrate": ("dse calibrate", "dse calibrate --no-cross-validation --quiet",
                  "DSE_CALIBRATION=runs/calibrate/calibration.yaml dse validate"),
    "explore": ("dse explore", "dse explore runs/quant-roofline", "dse explore runs/gpu-sweep-1m --port 8051"),
}
EXAMPLES["top"] = (EXAMPLES["analyze"][0], EXAMPLES["compare"][0], EXAMPLES["run"][0], "dse list hardware")


def examples(command: str) -> str:
    """The 'examples:' epilog of ``command`` ('top' for the whole tool)."""
    return "examples:\n" + "\n".join(f"  {line}" for line in EXAMPLES[command])


#: what ``list`` prints for each kind of thing (``--format``): a table of key figures, the bare
#: names (one a line, for scripts), or the same rows as JSON or CSV (SI units)
LIST_FORMATS = ("table", "names", "json", "csv")


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog=PROG, description="Design-space exploration of LLM-inference hardware "
                 "(also installed as the command 'dse').", epilog=examples("top"))
    sub = ap.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def command(name: str, text: str):
        return sub.add_parser(name, help=text, description=text, epilog=examples(name))

    a = command("analyze", "per-operator roofline of a prefill and a decode step")
    _add_workload_args(a)
    a.add_argument("--simulate", type=_requests, default=None, metavar="N",
                   help="also run N requests through the discrete-event simulator of the same engine and print "
                        "its metrics beside the steady-state model's (continuous batching only; N from 10); "
                        "progress with the time left on stderr")
    a.add_argument("--progress", action="store_true",
                   help="--simulate's progress on stderr even when it is not a terminal (default: only on a terminal)")
    a.add_argument("--quiet", action="store_true", help="no progress output on stderr")
    add_flag(a, SPEC["hardware"])
    a.add_argument("--format", choices=("table", "csv", "json"), default="table", help="output format")
    r = command("run", "run a study file: sweep a design space, write results and Pareto fronts")
    r.add_argument("study", help="study name (see 'list studies') or path to a study YAML file")
    r.add_argument("--out", default=None, type=_folder,
                   help="output folder (default: runs/<study name>); the same study run again resumes there")
    r.add_argument("--overwrite", action="store_true",
                   help="delete this run's own files in --out first (results, chunks, reports, Optuna journal) "
                        "and run afresh, e.g. after changing the study")
    r.add_argument("--seed", type=_seed, default=None,
                   help="override the study's seed (0 to 2**32 - 1; default: the study's)")
    r.add_argument("--trials", type=_positive_int, default=None,
                   help="override the study's trials (optuna; default: the study's)")
    r.add_argument("--workers", type=_workers, default=1,
                   help="worker processes on this machine: an optuna study's trials, or a sweep's chunks (the same "
                        "results as one)")
    r.add_argument("--storage", default=None,
                   help="SQLAlchemy URL of a shared study storage (optuna; default: a journal file in --out)")
    r.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="run a sweep's chunks on a Dask distributed cluster, e.g. tcp://host:8786 (dse installed on "
                        "every worker; pip install 'dse-llm[distributed]'); the results land in --out here "
                        "(default: this machine)")
    r.add_argument("--rows", choices=("all", "sample", "none"), default=None,
                   help="what a sweep keeps of its rows besides pareto.csv and aggregates.csv: all (results.parquet), "
                        "a uniform sample (sample.parquet, outputs.sample rows) or none (default: the study's "
                        "outputs.rows, else all up to 10,000,000 points and sample above)")
    r.add_argument("--quiet", action="store_true", help="no progress output on stderr")
    r.add_argument("--progress", action="store_true", help="an optuna study's progress bar on stderr even when it is not a terminal (default: only on a terminal)")
    c = command("compare", "the same workload on several hardware presets, side by side")
    _add_workload_args(c)
    add_flag(c, SPEC["hardware"], nargs="+", help="hardware presets (see 'list hardware') or preset YAML paths")
    c.add_argument("--format", choices=("table", "csv", "json"), default="table", help="output format")
    c.add_argument("--plot", default=None, metavar="FILE.png",
                   help="also draw the comparison as bar charts (default: no plot)")
    ls = command("list", "list models, hardware, formats, links, topologies, tiers or studies with their key figures")
    ls.add_argument("what", choices=tuple(LISTS))
    ls.add_argument("--format", choices=LIST_FORMATS, default="table",
                    help="table of key figures, bare names (one a line), or json/csv rows in SI units")
    sh = command("show", "show one hardware preset, model or study, every figure with its unit")
    sh.add_argument("what", choices=("hardware", "model", "study"))
    sh.add_argument("name")
    sh.add_argument("--format", choices=("table", "json"), default="table",
                    help="table (units) or json (SI units)")
    calibration_cli.add_parsers(command)
    deploy_cli.add_parsers(command, deploy_cli.Hooks(lambda p: (_add_workload_args(p), add_flag(p, SPEC["hardware"])),
                                                     point_columns, (check_contradictions, check_named), cli_words))
    plan_cli.add_parsers(command, _add_workload_args, point_columns)
    fleet_cli.add_parsers(command, _add_workload_args, point_columns)
    app_cli.add_parsers(command)
    return ap


#: column names that are also words of the messages' prose ("the weights do not fit"): ``flagged``
#: leaves them as they are
_PROSE = ("hardware", "model", "weights", "activations", "kv", "overlap", "engine")
#: command-line flags of the design-point columns, for messages in the words the user typed
FLAGS = {p.name: p.flag for p in TABLE if p.flag and p.name not in _PROSE}


#: every parameter's flag, the words of ``_PROSE`` included: a message that starts with the name
#: ('engine: unknown engine ...') is about that flag
_LEADING = {p.name: p.flag for p in TABLE if p.flag}


#: the words messages use for parameters whose names are abbreviations: a message that starts with
#: them ('tensor parallelism 3 does not divide ...') is about that flag
_PROSE_FLAGS = {"tensor parallelism": "--tp", "pipeline parallelism": "--pp", "expert parallelism": "--ep"}


def flagged(text: str) -> str:
    """``text`` with column names written as the command-line flags that set them (a name in
    backquotes, such as a study key `flash_attention: false`, stays as it is); a message that
    starts with a parameter's name ('engine: ...') starts with its flag, one that starts with its
    words ('tensor parallelism 3 ...') with the flag and a colon."""
    lead = next((flag for words, flag in _PROSE_FLAGS.items() if text.startswith(words)), None)
    if lead:
        return f"{lead}: {_flag_words(text)}"
    head, sep, rest = text.partition(": ")
    if head in _LEADING:            # also a message cut where its verbatim part starts: 'engine'
        return _LEADING[head] + sep + flagged(rest)
    return _flag_words(text)


def _flag_words(text: str) -> str:
    """``text`` with each column name written as its flag (``FLAGS``; not one in backquotes)."""
    return re.sub(r"(?<!`)\b(" + "|".join(FLAGS) + r")\b(?![-.\w])", lambda m: FLAGS[m.group(1)], text)


#: the parameters of continuous batching alone, whose flags have a default: typed at a point that runs one
#: static batch, they would be left unused without a word
CONTINUOUS_ONLY = ("kv_block", "max_running", "prefill_chunk", "slo_percentile", "router", "think_time")


def typed_flags(argv: list[str]) -> frozenset[str]:
    """The parameters whose flags ``argv`` gives (``--batch 4``, ``--batch=4``, an abbreviation argparse
    takes, ``--no-overlap``), by name: what the user typed, told apart from a flag's default."""
    by_flag = {p.flag: p.name for p in TABLE if p.flag}
    by_flag.update({f"--no-{f.removeprefix('--')}": n for f, n in list(by_flag.items())})
    out = set()
    for tok in argv:
        if tok == "--":
            break
        flag = tok.split("=", 1)[0]
        if not flag.startswith("--"):
            continue
        hits = [f for f in by_flag if f == flag] or [f for f in by_flag if f.startswith(flag)]
        if len(hits) == 1:
            out.add(by_flag[hits[0]])
    return frozenset(out)


def check_contradictions(args) -> None:
    """DseError for flags that contradict each other before anything is evaluated: a batch beside a
    load (--concurrency or --request-rate sets what runs; the batch would be left unused), a
    speculative-decoding setting without its draft."""
    typed = getattr(args, "typed", frozenset())
    load = next((f"--{k.replace('_', '-')}" for k in ("concurrency", "request_rate") if getattr(args, k, None)), None)
    if "batch" in typed and load:
        raise DseError(f"--batch and {load}: under a load the requests in flight follow from {load} (capped by "
                       f"--max-running), and --batch would be left unused; give one of them")
    if args.spec_draft is None and (args.spec_tokens is not None or args.spec_acceptance is not None):
        raise DseError("--spec-tokens and --spec-acceptance describe speculative decoding: give its draft too "
                       "(--spec-draft MODEL, or --spec-draft self:N)")


def check_named(args) -> None:
    """DseError naming the flag of a model or preset that cannot be loaded (--model, --hardware,
    --host-cpu, --host-tier): the loaders' own messages ('unknown hardware ...') do not say which flag
    gave the name, and --host-cpu names hardware beside --hardware."""
    hardware = getattr(args, "hardware", None)
    for flag, names, load in (("--model", [getattr(args, "model", None)], load_model),
                              ("--hardware", hardware if isinstance(hardware, list) else [hardware], check_design),
                              ("--host-cpu", [getattr(args, "host_cpu", None)], load_device),
                              ("--host-tier", [getattr(args, "host_tier", None)], load_tier)):
        for name in names:
            if name is None:
                continue
            try:
                load(name)
            except DseError as e:
                raise DseError(f"{flag}: {e}") from None


def check_unused(args, modes) -> None:
    """DseError for a flag of continuous batching alone (``CONTINUOUS_ONLY``) typed where every design
    point runs one static batch (``modes``: each point's serving mode, as the evaluator decided)."""
    typed = getattr(args, "typed", frozenset())
    unused = [SPEC[k].flag for k in CONTINUOUS_ONLY if k in typed]
    if unused and all(m != "continuous" for m in modes):
        raise DseError(f"{unused[0]}: a parameter of continuous batching, and this point runs one static batch "
                       f"(no --concurrency, --request-rate or --serving continuous), so it would be left unused; "
                       f"give a load, or leave {unused[0]} out")


def point_columns(args, hardware) -> dict:
    """The columns of the design point the workload options of ``args`` describe on ``hardware``
    (an option left at None is left out: the evaluator's default, e.g. FlashAttention on where the
    hardware has an on-chip buffer)."""
    cols = {"model": args.model, "hardware": hardware}
    for p in TABLE:
        if p.flag and p.name not in cols and getattr(args, p.name) is not None:
            cols[p.name] = getattr(args, p.name)
    return cols


def _simulate(args) -> dict:
    """``--simulate N``: the simulator's metrics of the point, its progress (output tokens
    produced of all the requests' from the first iteration on, requests finished, the time
    left) on stderr as ``validate`` shows it: on a terminal or with ``--progress``,
    never with ``--quiet`` (50,000 requests take minutes, the 1,000,000 allowed hours)."""
    with calibration_cli.progress_bar(args, "simulate", None, unit="output token") as bar:
        finished = [0]

        def requests(n: int) -> None:
            finished[0] += n
            bar.set_postfix_str(f"{finished[0]:,}/{args.simulate:,} requests", refresh=False)

        def tokens(n: int, total: int) -> None:
            if bar.total != total:
                set_total(bar, total)
            bar.update(n)
        try:
            return simulate_point(point_columns(args, args.hardware), args.simulate, ideal=args.ideal,
                                  progress=requests, tokens=tokens)
        except DseError as e:               # the simulator's words, with the flag that asked for it
            if type(e) is not DseError:
                raise
            raise DseError("--simulate: " + str(e).removeprefix("simulate: ")) from None


def cmd_analyze(args) -> int:
    check_contradictions(args)
    check_named(args)
    with cli_words():
        res, ev = analyze_point(point_columns(args, args.hardware), ideal=args.ideal)
    check_unused(args, [res.summary.get("serving")])
    model = with_images(load_model(args.model), args.images, *parse_image_size(args.image_size))
    for note in model.notes:      # what of the model is not modelled, or read as another family; its images
        print(f"dse.study: note: model {args.model}: {note}", file=sys.stderr)
    saturated = ev.reason_key(0) == "saturated"
    if not ev.feasible[0] and int(ev.reason[0]) not in MEMORY_CODES and not saturated:
        raise DseError(flagged(ev.reason_text(0)))
    offload = args.offload
    # the simulator's figures go inside the one document asked for: --format json|csv stays machine-readable
    sim = _simulate(args) if args.simulate else None
    if args.format == "json":
        doc = {"prefill": res.prefill, "decode": res.decode, "summary": res.summary}
        print(display.json_text(doc if sim is None else {**doc, "simulation": sim}))
    elif args.format == "csv":
        rows = [{"stage": st, **r} for st, rs in (("prefill", res.prefill), ("decode", res.decode)) for r in rs]
        print(display.csv_text(rows, ["stage", *ROW_KEYS]), end="")
        print()
        print(display.csv_text([res.summary]), end="")
        if sim is not None:
            print()
            print(display.csv_text([sim]), end="")
    else:
        print(_table_report(res, display, args.flash_attention))
        if sim is not None:
            print(_simulation_text(res.summary, sim))
    if saturated:       # a result, not an input error: the rate given is more than the design carries
        most = display.quantity_text("requests_per_s", res.summary["requests_per_s"])
        print(f"dse.study: note: --request-rate {args.request_rate:g} requests/s saturates this design: it serves "
              f"at most {most}, so its queue grows without bound and latencies have no steady state; for one, give "
              f"--request-rate below {most}, or more --devices, a narrower --weights/--kv format; for a run of N "
              f"requests that queue and drain (a benchmark's), --num-prompts N", file=sys.stderr)
        return 3
    if not res.summary["feasible"]:
        where = args.hardware if args.hardware.endswith((".yaml", ".yml")) else f"configs/hardware/{args.hardware}.yaml"
        why = flagged(res.summary.get("why", ""))
        pages = f", a smaller --kv-block (now {args.kv_block:,})" if "less than one request" in why else ""
        print(f"dse.study: error: does not fit: {why} ({where}: memory_tiers[0].capacity_bytes"
              f"{', host_memory.capacity_bytes' if offload.strip().lower() != 'none' else ''}); allowed remedies: --offload greedy, "
              f"more --devices, a narrower --weights/--kv format, a smaller --batch{pages}", file=sys.stderr)
        return 3
    return 0


def _simulation_text(summary: dict, sim: dict) -> str:
    """The steady-state model's serving metrics beside the simulator's, a line each."""
    pairs = [("ttft_s", "ttft_mean_s"), ("tpot_s", "tpot_mean_s"), ("e2e_latency_s", "e2e_mean_s"),
             ("requests_per_s", "requests_per_s"), ("output_tokens_per_s", "output_tokens_per_s"),
             ("queue_s", "queue_mean_s"), ("running_batch", "running_mean"), ("kv_utilization", "kv_utilization")]
    q = display.quantity_text
    out = ["", "Steady-state model against the discrete-event simulator (means; p90 / p99 in brackets)",
           f"  {'metric':32s} {'model':>36s} {'simulator':>36s}"]
    for k, sk in pairs:
        mine, theirs = q(k, summary[k]), q(k, sim[sk])
        if sk.endswith("_mean_s") and sk.replace("mean", "p90") in sim:
            head = k.removesuffix("_s")
            mine += f" ({q(k, summary[f'{head}_p90_s'])} / {q(k, summary[f'{head}_p99_s'])})"
            theirs += f" ({q(k, sim[sk.replace('mean', 'p90')])} / {q(k, sim[sk.replace('mean', 'p99')])})"
        out.append(f"  {k:32s} {mine:>36s} {theirs:>36s}")
    out.append(f"  {'preemptions':32s} {'':>36s} {int(sim['preemptions']):>36,d}")
    return "\n".join(out)


def flash_note(summary: dict, asked) -> str:
    """How attention ran, for a headline: 'FlashAttention on', 'FlashAttention off', or (the
    default on hardware without an on-chip buffer) 'FlashAttention off (... no on-chip buffer ...)'."""
    if summary["flash_attention"]:
        return "FlashAttention on"
    if asked is None:
        return (f"FlashAttention off ({summary['hardware']} has no on-chip buffer, onchip_buffer_bytes, to tile "
                f"it in: unfused attention)")
    return "FlashAttention off"


def _table_report(res, display, asked_flash=None) -> str:
    si, size = display.si, display.binary_bytes
    cols = [("name", "operator", str), ("count", "x", lambda v: f"{v:g}"), ("place", "on", str),
            ("compute_format", "format", str),
            ("ops", "ops", si), ("weight_bytes", "weights", size), ("act_bytes", "activations", size),
            ("kv_bytes", "KV cache", size), ("arithmetic_intensity", "ops/byte", lambda v: f"{v:.3g}"),
            ("bound", "bound", str), ("time_s", "time", lambda v: si(v, "s")),
            ("total_time_s", "x time", lambda v: si(v, "s")), ("share", "share", lambda v: f"{100 * v:.1f} %")]
    s = res.summary
    par = f", {s['devices']} devices ({s['layout']})" if s["devices"] > 1 else ""
    par += f", {s['chips_required']} chips needed by capacity" if "chips_required" in s else ""
    par += f", {s['cpu_layers']} layers on {s['host_cpu']}" if "cpu_layers" in s else ""
    par += "".join(f", {text}" for text in s.get("techniques", {}).values())
    par += f", offload {s['offload']}" if s["offload"] != "none" else ""
    load = f"batch {s['batch']}"
    if s.get("serving") == "continuous":
        load = ("continuous batching at " + (f"{s['request_rate']:g} requests/s (Poisson)" if s.get("request_rate")
                                             else f"concurrency {s['concurrency'] or s['batch']}"))
        load += f", {s['num_prompts']:,} requests in all" if s.get("request_rate") and s.get("num_prompts") else ""
        load += f", lengths {s['lengths']}" if s["lengths"] != "fixed" else ""
        load += f", prefix hit {100 * s['prefix_hit']:g} %" if s["prefix_hit"] else ""
        load += f", disaggregated {s['disaggregate']} (prefill:decode devices)" if s["disaggregate"] != "none" else ""
        load += f" and an encoder pool of {s['encoder_devices']} devices" if s.get("encoder_devices") else ""
        load += (f" over {s['router_replicas']} replicas ({s['router']}; metrics one replica's)"
                 if s.get("router_replicas", 1) > 1 else "")
        load += (f", sessions of {s['session_turns']} turns, think time {s['think_time']:g} s"
                 if s.get("session_turns", 1) > 1 else "")
        slos = [f"{k.removeprefix('slo_').upper()} {display.quantity_text(k, s[k])}" for k in ("slo_ttft", "slo_tpot")
                if s[k]]
        load += f", SLO {' and '.join(slos)} at p{s['slo_percentile']:g}" if slos else ""
    head = (f"{s['model']} on {s['hardware']}{par}: {load}, prompt {s['prompt_len']}, "
            f"generate {s['gen_len']}, weights {s['weights']} / activations {s['activations']} / KV {s['kv']}, "
            f"{flash_note(s, asked_flash)}, {s['efficiency']} roofline")
    words = ("place", "compute_format", "bound")
    out = [head, *([f"Heads: {s['heads']}"] if s.get("heads") else []),
           *([f"Collectives: {s['collectives']}"] if s.get("collectives") else []), "",
           "Prefill (per device; rows are one instance, 'x' instances per step)",
           display.text_table(res.prefill, cols, left=words), "",
           f"Decode step attending to {s['prompt_len']} cached tokens",
           display.text_table(res.decode, cols, left=words), "", "Summary"]
    for k in ("ttft_s", "tpot_s", "tokens_per_target_step", "e2e_latency_s", "output_tokens_per_s", "output_tokens_per_s_per_user",
              "output_tokens_per_s_per_device", "prefill_tokens_per_s", "requests_per_s", "total_tokens_per_s",
              "queue_s", "running_batch", "kv_utilization", *SERVING_LOAD_METRICS[5:], *SCHEDULER_METRICS, "goodput", "batch",
              "weights_bytes", "kv_cache_bytes", "kv_pool_bytes", "state_bytes",
              "activation_bytes", "peak_memory_bytes", "capacity_bytes", "engine_reserve_bytes", "offloaded_bytes",
              *ENERGY_COST_METRICS, "energy_basis", "clock_fraction",
              "quality_loss", "quality_source", "moe_imbalance", "moe_dropped_fraction",
              "chips_required", "fits", "why", "energy_note", "cost_note", "hardware_note", "lengths_note"):
        if k in s:
            out.append(f"  {k:32s} {display.quantity_text(k, s[k])}")
    if s.get("kernel_source"):
        out += ["", f"Kernel layer: {s['kernel_source']}"]
        out += [f"  {kind:20s} x{low:.2f} .. x{high:.2f} (kernel time, 90 % of held-out rows)"
                for kind, (low, high) in s.get("kernel_bands", {}).items()]
    if s.get("bands"):
        out += ["", f"Error bands: a measurement is expected within predicted x low .. x high ({100 * COVERAGE:.0f} % "
                    f"of rows like it; where the band comes from below)"]
        for fam, (low, high) in s["bands"].items():
            out.append(f"  {fam:10s} x{low:.2f} .. x{high:.2f}")
        out.append(f"  ({s['band']})")
    elif s.get("band", "").startswith("none:"):
        out += ["", f"Error bands: {s['band']}"]
    if s.get("energy_band"):
        low, high = s["energy_band"]
        out.append(f"Energy band: x{low:.2f} .. x{high:.2f} (power figures: {s.get('energy_basis', '')}, "
                   f"configs/power.yaml)")
    if s.get("efficiency_source"):
        out.append(f"Values used: {s['efficiency_source']}")
    return "\n".join(out)


def cmd_run(args) -> int:
    data, spec = load_study(args.study, seed=args.seed, rows=args.rows)
    if plan_cli.is_plan_study(data):        # a plan study: its answer, not a sweep (dse.study.plan_cli)
        name = str(data.get("name") or Path(args.study).stem)
        return plan_cli.run_plan_study(data, name, args.out or Path("runs") / name, where=str(study_path(args.study)))
    if fleet_cli.is_fleet_study(data):      # a fleet study: its answer (dse.study.fleet_cli)
        name = str(data.get("name") or Path(args.study).stem)
        return fleet_cli.run_fleet_study(data, name, args.out or Path("runs") / name, where=str(study_path(args.study)))
    for flag, given in (("--trials", args.trials), ("--storage", args.storage)):
        if given is not None and spec.method != "optuna":    # an option of optuna studies, left unused
            raise DseError(f"{flag}: applies to an optuna study, and {args.study} is a {spec.method} sweep; "
                           f"leave {flag} out")
    if args.trials is not None:
        data, spec = load_study(args.study, seed=args.seed, trials=args.trials, rows=args.rows)
    if spec.method != "optuna" and args.workers > 1 and args.scheduler is None:
        start_server()                      # the workers' server starts while this process gets ready
    from dse.explore.runio import RunLock, check_study, remove_run_files  # pandas: only when a study runs
    from dse.explore.study import check_study_inputs

    if args.overwrite and args.storage:
        raise DseError("--overwrite deletes a run's own files in its folder, not a study in --storage; give a new "
                       "--storage (or delete that study there) instead")
    name = str(data.get("name") or Path(args.study).stem)
    check_study_inputs(spec)                # refused before its folder is made
    out = output_folder(args.out or Path("runs") / name)
    signal.signal(signal.SIGTERM, _interrupt)     # SIGTERM stops a run as Ctrl-C does: work done is kept
    with RunLock(out):
        if args.overwrite:
            gone = remove_run_files(out)
            if gone and not args.quiet:
                print(f"dse.study: --overwrite: deleted {len(gone)} file(s) of the earlier run in {out}",
                      file=sys.stderr)
        check_study(out, spec)              # a changed study is refused, naming what changed
        return _run_locked(args, data, spec, name, out)


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _run_locked(args, data: dict, spec, name: str, out: Path) -> int:
    """``run`` in its locked output folder: the study, then its report."""
    free_nothing_at_exit()                  # a run's heap goes back with the process, not object by object
    if spec.method != "optuna":
        keep_freed_memory()                 # this process's job is the sweep: fewer page faults
    # the processes that draw the report's plots, started now where no worker processes run the
    # study (before any thread starts here, so that the first can be forked from this process);
    # else this process imports matplotlib while the study runs, and they start (forked) after it
    with Drawer(helper=args.workers == 1 and args.scheduler is None) as drawer:
        preloading = None if drawer.helper else plots.preload()
        return _study_and_report(args, data, spec, name, out, drawer, preloading)


def _study_and_report(args, data: dict, spec, name: str, out: Path, drawer: Drawer,
                      preloading: threading.Thread | None = None) -> int:
    """The study, then its report (its plots drawn by ``drawer``); the exit code.
    ``preloading``: the thread importing matplotlib here, if one was started."""
    import time

    from dse.explore.search import display_url, trial_counts  # optuna: only when a study runs
    from dse.explore.study import run_study
    t0 = time.perf_counter()
    front = run_study(spec, out, storage=args.storage, workers=args.workers, quiet=args.quiet,
                      scheduler=args.scheduler, progress=args.progress, checked=True)
    dt = time.perf_counter() - t0
    if spec.method == "optuna":
        counts = trial_counts(args.storage, out, spec)
        what = f"{counts['complete']:,} trials complete of {spec.trials:,} asked ({spec.sampler})" + (
            f", {counts['rows']:,} evaluated in this folder" if counts["rows"] < counts["complete"] else "")
    else:
        what = f"{spec.points:,} design points ({spec.method})"
    print(f"{name}: {what} in {dt:.1f} s; {len(front)} on the Pareto front")
    if spec.method == "optuna":
        where = display_url(args.storage) or f"{out / 'optuna.journal'} (optuna-dashboard {out / 'optuna.journal'})"
        print(f"  storage: {where}")
    if spec.method != "optuna" and spec.rows_kept != "all":
        _streamed(spec, out)
    else:
        print(f"  results: {out / 'results.parquet'}")
        print(f"  pareto:  {out / 'pareto.csv'}")
    from dse.present.report import write_report  # pandas, matplotlib: only when a report is written
    if preloading is not None:
        preloading.join()                        # so that the helpers forked now have matplotlib
    drawer.start()                               # (if not yet: the study's workers are done)
    write_report(out, data, spec, front, drawer)  # reads results.parquet, sample.parquet or the front alone
    print(f"  summary: {out / 'summary.md'}")
    print(f"  report:  {out / 'report.html'} (self-contained: open it in a browser)")
    best = _markdown_section((out / "summary.md").read_text(), "## Best feasible design per objective")
    if best:
        print("\nBest feasible design per objective (details, bottlenecks and plots in report.html):")
        print(best)
    return 0


def _streamed(spec, out: Path) -> None:
    """Print the files of a sweep that kept a sample of its rows or none (its report follows:
    drawn from the sample, or from the Pareto front alone)."""
    if spec.rows_kept == "sample":
        print(f"  sample:  {out / 'sample.parquet'} (a uniform sample of {min(spec.sample, spec.points):,} rows)")
    print(f"  pareto:  {out / 'pareto.csv'}")
    print(f"  aggregates: {out / 'aggregates.csv'} (per value of each swept parameter)")
    print(f"  best:    {out / 'best.json'}")
    print(f"  totals:  {out / 'sweep.json'} (points, feasible, infeasible by reason; the report's counts)")


def _markdown_section(text: str, heading: str) -> str:
    """The table under ``heading`` in a Markdown text ('' if absent)."""
    lines = text.splitlines()
    if heading not in lines:
        return ""
    body = []
    for line in lines[lines.index(heading) + 1:]:
        if line.startswith("#"):
            break
        if line.startswith("|"):
            body.append(line)
    return "\n".join(body)


def cmd_compare(args) -> int:
    plot = check_plot_path(args.plot)
    show(compare_from_args(args), args.format, plot)
    return 0


def compare_from_args(args) -> list[dict]:
    """The rows of ``compare``: the workload of ``args`` on each of ``args.hardware``, one evaluation."""

    names = list(dict.fromkeys(args.hardware))
    check_contradictions(args)
    check_named(args)
    with cli_words():
        ev = evaluate(point_columns(args, np.array(names, dtype=object)), ideal=args.ideal, explain=True)
        saturated = [i for i in range(len(names)) if ev.reason_key(i) == "saturated"]
        if saturated:              # the rate given, and the most each saturated design serves
            most = ", ".join(f"{names[i]} (it serves at most "
                             f"{display.quantity_text('requests_per_s', ev['requests_per_s'][i])})" for i in saturated)
            raise DseError(f"--request-rate {args.request_rate:g} requests/s saturates {most}: a queue that grows "
                           f"without bound has no steady state to compare; give a --request-rate below that")
        rows = compare_rows(ev)
    check_unused(args, [r.get("serving") for r in rows])
    for r, h in zip(rows, names):
        r["source"] = h
    return rows


class cli_words:
    """Re-raise a DseError from the evaluator in the words of the command line (its flags)."""

    def __enter__(self):
        return self

    def __exit__(self, kind, e, tb):
        if isinstance(e, DseError) and type(e) is DseError:
            text = str(e)
            cut = len(text) if e.verbatim_from is None else e.verbatim_from
            raise DseError(flagged(text[:cut].removeprefix("columns: ")) + text[cut:]) from None
        return False


def _first_sentence(text: str, limit: int = 110) -> str:
    """The first sentence (or question) of ``text``, at most ``limit`` characters."""
    text = " ".join(text.split())
    for i, ch in enumerate(text):
        if ch in ".?" and (i + 1 == len(text) or text[i + 1] == " "):
            text = text[:i + 1]
            break
    return text if len(text) <= limit else text[:limit - 1].rstrip() + "…"


def _model_rows() -> list[dict]:
    rows = []
    for n in available_models():
        m = load_model(n)
        rows.append({"name": n, "type": m.model_type, "parameters": int(parameter_count(m)),
                     "active_parameters": int(active_parameter_count(m)), "layers": m.num_layers,
                     "hidden_size": m.hidden_size, "heads": m.num_heads, "kv_heads": m.num_kv_heads,
                     "experts": m.num_experts, "experts_per_token": m.experts_per_token,
                     "max_context": m.max_position_embeddings})
    return rows


def _hardware_rows() -> list[dict]:
    rows = []
    for n in available_hardware():
        d = load_device(n)
        rows.append({"name": n, "class": d.device_class, "capacity_bytes": d.memory.capacity_bytes,
                     "bandwidth_bytes_per_s": d.memory.bandwidth_bytes_per_s,
                     "peak_fp16": d.peak_ops_per_s.get("fp16"), "peak_fp8": d.peak_ops_per_s.get("fp8"),
                     "onchip_buffer_bytes": d.onchip_buffer_bytes or None, "tdp_w": d.tdp_w,
                     "price_usd": d.price_usd})
    return rows


def _billions(v) -> str:
    return display.fixed_text(v, 1e9, "B")


def _count_or_dash(v) -> str:
    return f"{int(v):,}" if v else "-"


#: what ``list`` shows of each kind: (rows in SI units, table columns (key, header, formatter),
#: keys of left-aligned columns)
LISTS = {
    "models": (_model_rows, [
        ("name", "model", str), ("type", "type", str), ("parameters", "parameters", _billions),
        ("active_parameters", "active", _billions), ("layers", "layers", _count_or_dash),
        ("hidden_size", "hidden", _count_or_dash), ("heads", "heads", _count_or_dash),
        ("kv_heads", "KV heads", _count_or_dash), ("experts", "experts", _count_or_dash),
        ("experts_per_token", "top-k", _count_or_dash), ("max_context", "max context", _count_or_dash)],
        ("name", "type")),
    "hardware": (_hardware_rows, [
        ("name", "hardware", str), ("class", "class", str),
        ("capacity_bytes", "memory", lambda v: display.fixed_text(v, *axis_scale("bytes"))),
        ("bandwidth_bytes_per_s", "bandwidth", lambda v: display.fixed_text(v, 1e12, "TB/s")),
        ("peak_fp16", "fp16 peak", lambda v: display.fixed_text(v, 1e12, "TFLOP/s")),
        ("peak_fp8", "fp8 peak", lambda v: display.fixed_text(v, 1e12, "TFLOP/s")),
        ("onchip_buffer_bytes", "on-chip buffer", display.binary_bytes),
        ("tdp_w", "TDP", lambda v: display.fixed_text(v, 1, "W")),
        ("price_usd", "price", lambda v: "-" if v is None else f"${v:,.0f}")],
        ("name", "class")),
    "formats": (lambda: [{"name": f.name, "bits": f.bits, "compute": f.compute, "description": f.description}
                         for f in FORMATS.values()],
                [("name", "format", str), ("bits", "bits", lambda v: f"{v:.3g}"), ("compute", "computes as", str),
                 ("description", "description", str)], ("name", "compute", "description")),
    "links": (lambda: [{"name": n, "bandwidth_bytes_per_s": load_link(n).bandwidth_bytes_per_s,
                        "latency_s": load_link(n).latency_s} for n in available_links()],
              [("name", "link", str),
               ("bandwidth_bytes_per_s", "bandwidth per direction", lambda v: display.fixed_text(v, 1e9, "GB/s")),
               ("latency_s", "latency", lambda v: display.quantity_text("latency_s", v))], ("name",)),
    "topologies": (topology_rows, [("name", "topology", str), ("scale_up_size", "domain", lambda v: f"{v:g}"),
                                   ("shape", "shape", str), ("scale_out", "scale-out", str),
                                   ("hardware", "default of", str)], ("name", "shape", "scale_out", "hardware")),
    "tiers": (lambda: [{"name": n, "capacity_bytes": load_tier(n).capacity_bytes,
                        "bandwidth_bytes_per_s": load_tier(n).bandwidth_bytes_per_s,
                        "latency_s": load_tier(n).latency_s} for n in available_tiers()],
              [("name", "tier", str), ("capacity_bytes", "capacity", lambda v: display.fixed_text(v, *axis_scale("bytes"))),
               ("bandwidth_bytes_per_s", "bandwidth", lambda v: display.fixed_text(v, 1e9, "GB/s")),
               ("latency_s", "latency", lambda v: display.quantity_text("latency_s", v))], ("name",)),
    "engines": (lambda: [{"name": e.name, "label": e.label, "batching": e.batching,
                          "launch": e.launch, "attention": e.attention,
                          "kv_reads": "per GQA group" if e.gqa_kv_sharing else "per query head",
                          "allreduce": e.allreduce, "heads": "padded to its cores" if e.head_padding else "",
                          "kernel_scales": ", ".join(f"{k} {v:g} on {fam}" for fam, k, v in e.kernel_scales),
                          "default": "yes" if e.name == default_engine() else ""}
                         for e in engines().values()],
                [("name", "engine", str), ("batching", "batching", str), ("launch", "kernels", str),
                 ("attention", "attention", str), ("kv_reads", "K/V reads", str), ("allreduce", "all-reduce", str),
                 ("heads", "heads (TP not dividing)", str), ("kernel_scales", "cited kernel scales", str),
                 ("default", "default", str), ("label", "what", str)],
                ("name", "batching", "launch", "attention", "kv_reads", "allreduce", "heads", "kernel_scales", "default",
                 "label")),
    "studies": (lambda: [{"name": n, "description": _first_sentence(str(load_study(n)[0].get("description", "")))}
                         for n in available_studies()],
                [("name", "study", str), ("description", "question", str)], ("name", "description")),
}


def cmd_list(args) -> int:
    rows_of, columns, left = LISTS[args.what]
    rows = rows_of()
    if args.format == "names":
        print("\n".join(r["name"] for r in rows))
    elif args.format == "json":
        print(display.json_text(rows))
    elif args.format == "csv":
        print(display.csv_text(rows), end="")
    else:
        print(display.text_table(rows, columns, left=left))
    return 0


def cmd_show(args) -> int:
    if args.what == "hardware":
        d = load_device(args.name)
        obj = {
            "name": d.name, "description": d.description, "class": d.device_class,
            "peak_ops_per_s": d.peak_ops_per_s, "vector_ops_per_s": d.vector_ops_per_s,
            "memory_tiers": [{"name": t.name, "capacity_bytes": t.capacity_bytes,
                              "bandwidth_bytes_per_s": t.bandwidth_bytes_per_s, "latency_s": t.latency_s}
                             for t in d.memory_tiers],
            "onchip_buffer_bytes": d.onchip_buffer_bytes,
            "interconnect": None if d.interconnect is None else vars(d.interconnect),
            "host_link": None if d.host_link is None else vars(d.host_link),
            "host_memory": None if d.host_memory is None else vars(d.host_memory),
            "host_cpu": d.host_cpu, "sparse_peak_ops_per_s": d.sparse_peak_ops_per_s or None,
            "pim": None if d.pim is None else vars(d.pim),
            "tdp_w": d.tdp_w, "price_usd": d.price_usd, "energy_profile": d.energy_profile or None,
            "static_power_w": d.static_power_w, "shard_cores": d.shard_cores, "sources": d.sources,
        }
        made = template_figures(d.name)          # the chip's template, where one is built (hwmodels.template)
        if made:
            obj.update(die_area_mm2=made["die_area_mm2"], board_power_w=made["board_power_w"], template=made)
    elif args.what == "study":
        data, spec = load_study(args.name)
        obj = {**data, "points": spec.points, "chunks": spec.chunks}
    else:
        m = load_model(args.name)
        obj = {**{k: v for k, v in asdict(m).items() if k != "padding_note"},   # (a model as read: never padded)
               "attention": m.attention_kind, "parameters": parameter_count(m),
               "active_parameters": active_parameter_count(m),
               "vision_parameters": vision_parameter_count(m.vision) if m.vision else 0}
    if args.format == "json":
        print(display.json_text(obj))
    else:
        print(display.figures_text(obj))
    return 0


def check_flags(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """DseError naming the first option of ``argv`` that its command does not have, with the
    nearest one it does (argparse would report a required option as missing instead)."""
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    cmd = next((i for i, tok in enumerate(argv) if tok in commands), None)
    if cmd is None:
        return
    actions = commands[argv[cmd]]._actions
    known = [s for a in actions for s in a.option_strings]
    given: dict[str, str] = {}          # each option's destination -> the flag that first set it
    for tok in argv[cmd + 1:]:
        if tok == "--":
            return
        flag, eq, value = tok.partition("=")
        if flag.startswith("--") and flag not in known and not any(k.startswith(flag) for k in known):
            near = difflib.get_close_matches(flag, known, n=1)
            raise DseError(f"{argv[cmd]}: unknown option {flag}" + (f"; did you mean {near[0]}?" if near else
                                                                      f"; allowed: {', '.join(sorted(known))}"))
        if not flag.startswith("--"):
            continue
        if eq and value == "--":        # argparse would drop it and leave the option empty
            raise DseError(f"{argv[cmd]}: {flag}: expected a value, got '--'")
        hits = [a for a in actions if flag in a.option_strings] or [a for a in actions
                                                                  if any(o.startswith(flag) for o in a.option_strings)]
        if len(hits) == 1 and hits[0].dest != "help":
            dest = hits[0].dest
            if dest in given:           # argparse would keep the last one without a word
                raise DseError(f"{argv[cmd]}: {flag} given twice: give it once" if flag == given[dest] else
                               f"{argv[cmd]}: {given[dest]} and {flag} set the same option: give one of them")
            given[dest] = flag


def main(argv: list[str] | None = None) -> int:
    try:
        parser = build_parser()
        check_flags(parser, sys.argv[1:] if argv is None else list(argv))
        args = parser.parse_args(argv)
        args.typed = typed_flags(sys.argv[1:] if argv is None else list(argv))
        return {"analyze": cmd_analyze, "list": cmd_list, "show": cmd_show, "run": cmd_run,
                "compare": cmd_compare, **calibration_cli.COMMANDS,
                **deploy_cli.COMMANDS, **plan_cli.COMMANDS, **fleet_cli.COMMANDS, **app_cli.COMMANDS}[args.command](args)
    except DseError as e:
        from_signal = type(e).__name__ == "Interrupted"     # on one line: a path's newline escaped
        print(f"dse.study: {'' if from_signal else 'error: '}{shown_path(e)}", file=sys.stderr)
        return 130 if from_signal else 2
    except KeyboardInterrupt:
        print("dse.study: interrupted; finished chunks are kept: run the same command again to resume",
              file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except OSError as e:            # a write outside ``atomic_write`` (a journal, a helper's file) on a full disk
        cause = write_error_cause(e)
        if cause is None:
            raise
        print(f"dse.study: error: {shown_path(e.filename or 'an output file')}: cannot write: {cause}", file=sys.stderr)
        return 2
