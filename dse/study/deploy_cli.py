"""``deploy`` subcommand of ``python -m dse.study``: a chosen design's engine launch command and
Kubernetes manifest (``dse.present.deploy``).

The design comes from the workload and hardware flags ``analyze`` takes, or from a run: the
stored row of ``--point N`` (its ``point``, or ``trial`` for a search) in ``pareto.csv``, else in
the rows the run kept. Either way it is evaluated once more (the same evaluator, as ``best.json``
is written) so that its layout, batch and serving mode are the ones its metrics came from; an
infeasible design is refused with its reason.
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from basis.errors import DseError
from basis.files import output_folder, write_text_atomic
from dse.core.engines import default_engine
from dse.present import deploy as D
from dse.system.analysis import analyze_point
from dse.system.params import DEFAULTS, HARDWARE_PARAMS, PARAMS
from hwmodels.presets import load_device

#: the files ``--out`` writes
LAUNCH_FILE, MANIFEST_FILE = "launch.sh", "manifest.yaml"
#: design columns that change what runs but that no engine flag sets: each is a note when set
#: away from its default (speculative decoding is mapped; the rest of the techniques come
#: from the evaluator's summary)
_UNEXPRESSED = {"offload": "none", "cpu_layers": 0, "disaggregate": "none"}


@dataclass(frozen=True)
class Hooks:
    """What ``deploy`` takes from the command line's module: the workload flags, the columns of
    those flags, their checks, and the context that words evaluator errors as flags."""
    flags: Callable
    columns: Callable
    checks: tuple
    words: Callable


def _non_negative(text: str) -> int:
    if not (text.isascii() and text.isdigit()):
        raise argparse.ArgumentTypeError(f"expected a design's id, an integer from 0, got '{text}'")
    return int(text)


def add_parsers(command, hooks: Hooks) -> None:
    """Add ``deploy``; ``command(name, text)`` makes a subparser (with its examples)."""
    d = command("deploy", "the launch command of vLLM, SGLang or TensorRT-LLM and a Kubernetes manifest for one "
                          "design (the workload flags, or --run and --point)")
    hooks.flags(d)
    for a in d._actions:                  # --model and --hardware: not with --run
        if a.dest in ("model", "hardware"):
            a.required = False
        if a.dest == "engine":
            a.help = ("the engine to deploy with, vllm, sglang or trtllm (trt-llm), whose profile the design is "
                      "evaluated with (default: vllm; with --run, the engine the run evaluated it with)")
    d.add_argument("--run", default=None, metavar="FOLDER",
                   help="a run folder 'dse run' wrote (runs/<study name>): deploy its design --point instead of "
                        "the workload flags")
    d.add_argument("--point", default=None, type=_non_negative, metavar="N",
                   help="with --run: the design's id, its 'point' (a sweep) or 'trial' (a search) in pareto.csv "
                        "or the run's rows")
    d.add_argument("--manifest", choices=D.MANIFESTS, default="deployment",
                   help="deployment: apps/v1 Deployment + Service; llm-d: the same (llm-d's ModelService is a Helm "
                        "chart rendering such objects); dynamo: an NVIDIA Dynamo DynamoGraphDeployment")
    d.add_argument("--checkpoint", default=None, metavar="REPO",
                   help="the Hugging Face repository or folder the engine loads (default: the model's Hub "
                        "repository, where dse knows it)")
    d.add_argument("--draft-checkpoint", default=None, metavar="REPO",
                   help="the same for a speculative draft model (default: its Hub repository)")
    d.add_argument("--image", default=None, help="container image of the engine (default: the engine's own, "
                                                  "on NVIDIA GPUs)")
    d.add_argument("--name", default=None, help="Kubernetes object name (default: from model, hardware, layout)")
    d.add_argument("--out", default=None, metavar="DIR",
                   help=f"write {LAUNCH_FILE} and {MANIFEST_FILE} there (atomically; default: print both)")
    d.set_defaults(deploy_hooks=hooks)


def cmd_deploy(args) -> int:
    hooks: Hooks = args.deploy_hooks
    typed = set(getattr(args, "typed", frozenset()))
    if args.run is None:
        if args.point is not None:
            raise DseError("--point: names a design of a run: give --run FOLDER too")
        for flag, v in (("--model", args.model), ("--hardware", args.hardware)):
            if v is None:
                raise DseError(f"{flag}: required (or --run FOLDER --point N for a design a study found)")
        if args.engine is not None:
            args.engine = D.engine_name(args.engine)
        for check in hooks.checks:
            check(args)
        row = hooks.columns(args, args.hardware)
    else:
        extra = sorted(typed - {"engine"})
        if extra:
            raise DseError(f"--run: the design is the run's stored row; leave out the workload flags "
                           f"(given: {', '.join('--' + k.replace('_', '-') for k in extra)})")
        if args.point is None:
            raise DseError("--run: give --point N, the design's id (its 'point' or 'trial' in pareto.csv)")
        row = stored_row(Path(args.run), args.point)
    target = D.engine_name(args.engine) if "engine" in typed and args.engine else None
    with hooks.words():
        design, engine = design_of(row, target, args.checkpoint, args.draft_checkpoint)
    launch = D.launch(design, engine)
    objects = D.manifest(design, launch, args.manifest, args.image, args.name)
    script, text = D.launch_script(design, launch), D.manifest_yaml(design, launch, objects)
    if args.out is None:
        print(script, end="")
        print(f"\n# ---- {MANIFEST_FILE}")
        print(text, end="")
        return 0
    out = output_folder(args.out)
    write_text_atomic(out / LAUNCH_FILE, script)
    (out / LAUNCH_FILE).chmod(0o755)
    write_text_atomic(out / MANIFEST_FILE, text)
    print(f"  launch:   {out / LAUNCH_FILE}")
    print(f"  manifest: {out / MANIFEST_FILE}")
    for n in launch.notes:
        print(f"  left out / mapped: {n}")
    return 0


def stored_row(run: Path, point: int) -> dict:
    """The stored row of design ``point`` of the run in ``run``: from pareto.csv, else from the
    rows the run kept (results.parquet or sample.parquet); DseError naming what is there."""
    import pandas as pd  # only when a run is read

    from dse.explore.runio import ResultsFile

    if not run.is_dir():
        raise DseError(f"--run {run}: no such run folder (one 'dse run' wrote, such as runs/<study name>)")
    ids: list[int] = []
    front = run / "pareto.csv"
    if front.is_file():
        try:
            df = pd.read_csv(front)
        except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError):
            raise DseError(f"{front}: not a Pareto table 'dse run' wrote; run the study again") from None
        key = next((k for k in ("point", "trial") if k in df), None)
        if key is not None:
            hit = df.index[df[key] == point]
            if len(hit):
                return _plain(df.loc[hit[0]].to_dict())
            ids += [int(v) for v in df[key]]
    for name in ("results.parquet", "sample.parquet"):
        path = run / name
        if not path.exists():
            continue
        res = ResultsFile(path)
        key = next((k for k in ("point", "trial") if k in res.names), None)
        if key is None:
            continue
        col = res.columns([key])[key].to_numpy()
        pos = (col == point).nonzero()[0]
        if len(pos):
            return _plain(res.rows_at([int(pos[0])])[0])
        ids += [int(col.min()), int(col.max())] if len(col) else []
    if not ids:
        raise DseError(f"--run {run}: holds no pareto.csv or rows of designs; run the study there first")
    raise DseError(f"--point {point}: no design {point} in {run} (its designs are numbered {min(ids)} to "
                   f"{max(ids)}; pareto.csv lists the Pareto designs)")


def _plain(row: dict) -> dict:
    """A stored row with numpy scalars as Python values and NaN (a column the design left unset) dropped."""
    out = {}
    for k, v in row.items():
        v = v.item() if hasattr(v, "item") else v
        if v is None or (isinstance(v, float) and math.isnan(v)):
            continue
        out[k] = v
    return out


def _value(row: dict, key: str):
    """Column ``key`` of ``row``, else its declared default."""
    v = row.get(key)
    return DEFAULTS.get(key) if v is None else v


def design_of(row: dict, engine: str | None, checkpoint: str | None, draft_checkpoint: str | None):
    """(the Design of a design point's columns ``row`` as the evaluator resolves them, the engine
    to deploy it with: ``engine``, else the one it was evaluated with). DseError for an
    infeasible design, or a model (or draft) whose checkpoint dse does not know."""
    cols = {k: v for k, v in row.items() if k in PARAMS}
    if engine is not None:
        cols["engine"] = engine
    if str(cols.get("spec_draft", "none")).lower() == "none":   # a swept row without a draft: its gamma unused
        cols.pop("spec_tokens", None)
        cols.pop("spec_acceptance", None)
    res, ev = analyze_point(cols)
    s = res.summary
    if not ev.feasible[0]:
        raise DseError(f"the design is not feasible: {ev.reason_text(0)}; nothing to deploy")
    profile = str(s.get("engine") or cols.get("engine") or default_engine())
    profile = default_engine() if profile == "default" else profile
    if engine is None and D.ENGINE_ALIASES.get(profile, profile) not in D.ENGINES:
        raise DseError(f"the design was evaluated with the {profile} engine profile; give --engine vllm, sglang or "
                       f"trtllm to deploy it (and evaluate it again) with one of those")
    target = engine or D.engine_name(profile)
    model = str(cols["model"])
    ckpt = checkpoint or D.HF_REPOS.get(model)
    if not ckpt:
        raise DseError(f"--checkpoint: dse knows no Hugging Face repository of model '{model}'; give the one "
                       f"(or the folder) the engine loads")
    draft = str(_value(cols, "spec_draft"))
    draft_ckpt = ""
    if draft.lower() != "none" and ":" not in draft and draft.lower().partition("@")[0] != "eagle":  # a draft model
        draft_ckpt = draft_checkpoint or D.HF_REPOS.get(draft, "")
        if not draft_ckpt:
            raise DseError(f"--draft-checkpoint: dse knows no Hugging Face repository of the draft '{draft}'; give it")
    device = load_device(str(cols["hardware"]))
    serving = s.get("serving", "static")
    batch = int(s.get("batch") or 1)
    running = int(_value(cols, "max_running")) if serving == "continuous" else batch
    unexpressed = [(k, f"{w}: no engine flag; left out") for k, w in (s.get("techniques") or {}).items()
                   if k != "spec_draft"]
    unexpressed += [(k, f"{cols[k]}: no engine flag; left out") for k, default in _UNEXPRESSED.items()
                    if cols.get(k, default) != default]
    if serving != "continuous":
        unexpressed.append(("serving", f"a static batch of {batch}; the engines batch continuously, so "
                                       f"the running sequences are capped at {batch}"))
    stored = str(row.get("engine", "default"))
    stored = default_engine() if stored == "default" else stored
    if engine is not None and stored != engine:
        unexpressed.append(("engine", f"the run evaluated it as {stored}; evaluated again as {engine}"))
    if s.get("flash_attention") is False:
        unexpressed.append(("flash_attention", "off: the engines run fused attention kernels; left out"))
    overrides = sorted(k for k in cols if k in HARDWARE_PARAMS and k != "hardware")
    if overrides:
        unexpressed.append(("hardware", f"{cols['hardware']} with {', '.join(overrides)} changed: a device that is "
                                        f"not sold; the manifest asks for {cols['hardware']}'s GPUs"))
    replicas = float(ev["replicas"][0]) if "replicas" in ev else math.nan      # a service of target_rate
    replicas = int(math.ceil(replicas)) if math.isfinite(replicas) else 1
    design = D.Design(
        model=model, checkpoint=ckpt, hardware=str(cols["hardware"]), vendor=device.vendor,
        device_class=device.device_class, tp=int(s["tp"]), pp=int(s["pp"]), ep=int(s["ep"]),
        max_running=running, batched_tokens=int(_value(cols, "prefill_chunk")),
        kv_block=int(_value(cols, "kv_block")), weights=str(s["weights"]), activations=str(s["activations"]),
        kv=str(s["kv"]), spec_draft=draft, spec_tokens=int(_value(cols, "spec_tokens")),
        draft_checkpoint=draft_ckpt, max_context=int(_value(cols, "max_context")), replicas=max(replicas, 1),
        unexpressed=tuple(unexpressed))
    return design, target


COMMANDS = {"deploy": cmd_deploy}
