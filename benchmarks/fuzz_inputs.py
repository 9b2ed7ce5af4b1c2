"""Fuzzing the inputs of ``python -m dse.study``: bad and edge inputs, each run as a subprocess.

Every case is written here by hand or drawn from pools with a seeded generator (``--seed``), so a run
is reproducible. The classes follow issue 41: the flags of ``analyze``, ``compare``, ``run``,
``validate``, ``calibrate``, ``show`` and ``list`` (numbers out of range, NaN and infinities,
non-ASCII digits, empty and path-like names, repeated options, contradictions between flags), study
YAML files (unknown and duplicate keys, bad types, NaN/inf, out of range, empty spaces, contradictory
options), hardware presets and model configs given as paths, calibration files (``DSE_CALIBRATION``),
measured-results CSVs, length traces, and special files (/dev/zero and a symlink to it, a FIFO with
no writer, folders, empty, huge, non-UTF-8 and NUL-bearing files, non-ASCII digits).

Each case runs in its own temporary folder with a timeout (short for FIFOs), a memory limit and
``stdin`` closed; its outcome is one of

  refused        non-zero exit, one line 'dse.study: error: ...' naming the input (the good refusal)
  accepted       exit 0, and the case's input may be accepted
  wrongly-ok     exit 0 where the input should have been refused (silent acceptance)
  wrongly-no     a one-line refusal of an input that should have been accepted
  traceback      a Python traceback on stderr
  hang           still running at the timeout (killed with its process group)
  killed         ended by a signal (out of memory, ...)
  multi-line     a refusal of more than one line, or a success with warnings on stderr
  unnamed        a one-line refusal that names neither the flag, the file nor the key
  echo           the output contains the marker planted in the file's content (a file quoted back)
  not-json       ``--format json`` whose stdout does not parse as JSON

A content marker is planted in the values of the files a case writes (never in their keys: an
error may name the first offending key). Names that are short and plain may be quoted back like
keys (``basis.errors.name_or_kind``), so markers sit in values that are not such names.

    python benchmarks/fuzz_inputs.py [--seed 41] [--jobs 2] [--csv fuzz.csv] [--only CLASS] [--show OUTCOME]

prints a table of counts per class and outcome and, with ``--csv``, one row per case."""
from __future__ import annotations

import argparse
import csv
import json
import os
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
OUTCOMES = ("refused", "accepted", "wrongly-ok", "wrongly-no", "traceback", "hang", "killed", "multi-line",
            "unnamed", "echo", "not-json")
BAD = ("wrongly-ok", "wrongly-no", "traceback", "hang", "killed", "multi-line", "unnamed", "echo", "not-json")


@dataclass
class Case:
    """One input: ``argv`` after ``python -m dse.study``; ``files``: name -> bytes written in the case's
    folder first (or a special: 'fifo', 'dir', 'devzero-link', 'huge'); ``expect``: 'refuse', 'accept' or
    'either'; ``names``: words of which a refusal must name one (a flag, a file's name, a key)."""

    cls: str
    label: str
    argv: list[str]
    expect: str = "refuse"
    names: tuple[str, ...] = ()
    files: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)
    marker: str | None = None
    timeout: float = 60.0
    json_out: bool = False


# ----------------------------------------------------------------------------------------------- helpers

BASE = ["analyze", "--model", "llama-3.2-1b-instruct", "--hardware", "h100-sxm", "--prompt-len", "128",
        "--gen-len", "16"]
SERVED = [*BASE, "--concurrency", "4"]
#: an analyze run of one small point, to which a case adds its flags
TINY_STUDY = """name: fuzz-tiny
description: one point
space:
  hardware: h100-sxm
  model: llama-3.2-1b-instruct
  batch: 1
  prompt_len: 128
  gen_len: 16
objectives:
  tpot_s: min
method: grid
"""
#: a measured-results CSV (calibration schema), the header of the shipped one
MEASURED_HEADER = (ROOT / "data" / "measured_calibration.csv").read_text().splitlines()[0]
MEASURED_ROWS = (ROOT / "data" / "measured_calibration.csv").read_text().splitlines()[1:]


def marker(rng: random.Random) -> str:
    """A unique text that no message would write unless it quoted a file: 'QZX' and 10 hex digits."""
    return f"QZX{rng.getrandbits(40):010x}"


def study_text(space_extra: str = "", top_extra: str = "", replace: dict | None = None) -> str:
    """The tiny study with lines added to its space and top level, and lines replaced."""
    text = TINY_STUDY
    for old, new in (replace or {}).items():
        text = text.replace(old, new)
    text = text.replace("  gen_len: 16\n", "  gen_len: 16\n" + space_extra)
    return text + top_extra


def measured_csv(rows: list[dict] | None = None, header: str = MEASURED_HEADER, base_row: int = 0) -> str:
    """A measured CSV: the shipped header, and shipped row ``base_row`` with each dict's cells replaced."""
    cols = next(csv.reader([header]))
    base = next(csv.reader([MEASURED_ROWS[base_row]]))
    out = [header]
    for r in rows or [{}]:
        cells = dict(zip(cols, base))
        cells.update(r)
        buf = [cells.get(c, "") for c in cols]
        out.append(",".join(f'"{c}"' if ("," in c or '"' in c) else c for c in buf))
    return "\n".join(out) + "\n"


SPECIALS = ("missing", "dir", "devzero", "devzero-link", "devnull", "fifo", "empty", "huge", "binary",
            "nul", "latin1", "newline-name", "dangling-link", "long-name")


def special_file(kind: str, name: str) -> tuple[str, dict]:
    """(the path to give, files to make) for a special file ``kind`` standing where ``name`` is read."""
    if kind == "missing":
        return "nothere/" + name, {}
    if kind == "dir":
        return name, {name: "dir"}
    if kind == "devzero":
        return "/dev/zero", {}
    if kind == "devnull":
        return "/dev/null", {}
    if kind == "devzero-link":
        return name, {name: "devzero-link"}
    if kind == "fifo":
        return name, {name: "fifo"}
    if kind == "empty":
        return name, {name: b""}
    if kind == "huge":
        return name, {name: "huge"}
    if kind == "binary":
        return name, {name: bytes(range(256)) * 64}
    if kind == "nul":
        return name, {name: b"a: 1\x00\nb: 2\n"}
    if kind == "latin1":
        return name, {name: "name: caf\xe9\nspace: {}\n".encode("latin-1")}
    if kind == "newline-name":
        return "bad\nname" + Path(name).suffix, {"bad\nname" + Path(name).suffix: b"x: 1\n"}
    if kind == "dangling-link":
        return name, {name: "dangling-link"}
    if kind == "long-name":
        return "x" * 300 + Path(name).suffix, {}
    raise ValueError(kind)


# ----------------------------------------------------------------------------------------------- cases

def flag_cases(rng: random.Random) -> list[Case]:
    """Every numeric flag of analyze with values no number check should let through, and edge values."""
    numeric = {"--batch": "int", "--prompt-len": "int", "--gen-len": "int", "--devices": "int", "--tp": "int",
               "--pp": "int", "--ep": "int", "--cpu-layers": "int", "--max-context": "int",
               "--concurrency": "int", "--request-rate": "float", "--kv-block": "int", "--prefill-chunk": "int",
               "--max-running": "int", "--prefix-hit": "float", "--slo-ttft": "float", "--slo-tpot": "float",
               "--slo-percentile": "float", "--weight-density": "float", "--activation-sparsity": "float",
               "--layers-used": "float", "--kv-budget": "int", "--spec-tokens": "int",
               "--spec-acceptance": "float", "--price-usd": "float", "--static-power-w": "float",
               "--electricity-usd-per-kwh": "float", "--amortization-years": "float", "--utilization": "float"}
    always_bad = ["nan", "inf", "abc", "", "\u0661\u0662", "1e309", "--"]
    cases = []
    for flag, kind in numeric.items():
        base = SERVED if flag in ("--kv-block", "--prefill-chunk", "--max-running", "--prefix-hit", "--slo-ttft",
                                  "--slo-tpot", "--slo-percentile") else BASE
        if flag in ("--batch",):
            base = BASE
        if flag in ("--concurrency", "--request-rate"):
            base = BASE
        for v in always_bad + (["2.5", "-1", "99999999999999999999999"] if kind == "int" else ["-1", "-0.5"]):
            expect = "refuse"
            if v == "-1" and flag in ():
                expect = "either"
            cases.append(Case("flags-numeric", f"{flag}={v!r}", [*base, flag + "=" + v if v.startswith("-") else flag, *([] if v.startswith("-") else [v])],
                              expect, (flag,)))
    # edge values that are valid, under a served load too (a shape mismatch hides there)
    edges = {"--layers-used": ["0.5", "1"], "--activation-sparsity": ["0.3", "1"], "--weight-density": ["0.5"],
             "--kv-budget": ["64", "1"], "--prefix-hit": ["0.99", "0"], "--kv-block": ["1", "4096"],
             "--prefill-chunk": ["1", "0"], "--max-running": ["1"], "--slo-percentile": ["50", "99.9", "100"],
             "--slo-ttft": ["1e-9", "1e6"], "--slo-tpot": ["1e-9"], "--spec-tokens": ["1", "64"],
             "--cpu-layers": ["1", "16"], "--max-context": ["145", "1000000"], "--utilization": ["1e-6", "1"],
             "--amortization-years": ["0.01", "100"], "--price-usd": ["1e-3", "1e12"]}
    for flag, values in edges.items():
        for v in values:
            extra = ["--spec-draft", "self:1"] if flag == "--spec-tokens" else []
            for load in (BASE, SERVED, [*BASE, "--request-rate", "2"]):
                if flag in ("--kv-block", "--prefill-chunk", "--max-running", "--prefix-hit", "--slo-percentile",
                            "--slo-ttft", "--slo-tpot") and load is BASE:
                    continue
                cases.append(Case("flags-edge", f"{flag} {v} {'static' if load is BASE else load[-2]}",
                                  [*load, flag, v, *extra], "either", (flag,)))
    # the point of issue 41: SLOs on several devices of a preset without an interconnect
    cases.append(Case("flags-edge", "slo on rtx-4090 x2", ["analyze", "--model", "llama-3.2-1b-instruct", "--hardware",
                      "rtx-4090", "--devices", "2", "--concurrency", "4", "--slo-ttft", "0.5"], "either",
                      ("--devices", "interconnect", "rtx-4090")))
    return cases


def name_flag_cases(rng: random.Random) -> list[Case]:
    """Flags that take a name or a small language: empty, path-like, unknown, repeated options."""
    m = marker(rng)
    table = {
        "--engine": ["", "../vllm", "vllm/", "VLLM", "vllm ", m, "default,vllm", "/etc/passwd"],
        "--hardware": ["", "nothere", "h100-sxm ", "H100-SXM", "../h100-sxm", "configs/hardware"],
        "--model": ["", "nothere", "llama-3.2-1b-instruct ", "configs/models"],
        "--weights": ["", "fp7", "FP8", "fp8,int4", "int4 "],
        "--activations": ["fp4x", "", "int3"],
        "--kv": ["", "fp8e4", "int2"],
        "--offload": ["weights=2", "weights=0.5,weights=0.2", "kv=-1", "greedy,weights=0.5", "weights=nan",
                      "weights=\u0660.5", "foo=0.5", "weights", "weights=", "=0.5", "weights=inf"],
        "--sparsity": ["1:4", "4:2", "0:4", "2:0", "a:b", "2:4:8", "2:\u0664", "2:4,2:4", "-2:4", ""],
        "--prune": ["hidden=1", "hidden=0", "layers=0.5", "foo=1", "hidden=1,hidden=2", "hidden=-1", "hidden=nan",
                    "layers=\u0661", "hidden", "layers=0", "heads=1"],
        "--spec-draft": ["self:\u0661", "self:0", "self:-1", "nothere", "self:", "self:999", "self:1.5", "self:nan",
                         "self:1,self:2", ""],
        "--disaggregate": ["1:0", "0:1", "a:b", "1:1:1", "\u0661:\u0661", "1:", ":1", "1:1"],
        "--link": ["", "nothere", "../links"],
        "--host-tier": ["", "nothere"],
        "--host-cpu": ["", "nothere", "h100-sxm"],
        "--lengths": ["lognormal:sigma=1,sigma=2", "lognormal:sigma=-1", "lognormal:sigma=nan", "lognormal:foo=1",
                      "lognormal:", "lognormal:sigma", "LOGNORMAL", "fixed:1", "uniform", "lognormal:sigma=1e309",
                      "lognormal:prompt_sigma=1,sigma=1", "lognormal:sigma=\u0661", ""],
        "--weights-edge": ["", "fp7", "nothere"],
        "--serving": ["", "dynamic"],
    }
    # may be accepted: valid values (int3/int2 and 1:4 are formats and patterns dse has), engine names that
    # get_engine reads case- and space-insensitively by design, a GPU named as host CPU (refused or not)
    either = {("--disaggregate", "1:1"), ("--host-cpu", "h100-sxm"), ("--weights", "FP8"), ("--hardware", "H100-SXM"),
              ("--engine", "VLLM"), ("--engine", "vllm "), ("--prune", "heads=1"), ("--activations", "int3"),
              ("--kv", "int2"), ("--sparsity", "1:4")}
    cases = []
    for flag, values in table.items():
        served = flag in ("--lengths", "--disaggregate")
        for v in values:
            argv = [*(SERVED if served else BASE)]
            if flag in ("--hardware", "--model"):
                i = argv.index(flag)
                argv[i + 1] = v
            else:
                argv += [flag + "=" + v] if v.startswith("-") else [flag, v]
            if flag == "--disaggregate":
                argv += ["--devices", "2"]
            names = (flag, "engine") if flag == "--engine" else (flag,)
            cases.append(Case("flags-names", f"{flag} {v!r}", argv, "either" if (flag, v) in either else "refuse",
                              names))
    return cases


def contradiction_cases(rng: random.Random) -> list[Case]:
    """Flags that contradict each other or repeat: each should be refused (or say which value won)."""
    c = [
        ("--sparse + --sparsity 1:4", [*BASE, "--sparse", "--sparsity", "1:4"], ("--sparse", "--sparsity")),
        ("--sparse + --sparsity 2:4", [*BASE, "--sparse", "--sparsity", "2:4"], ("--sparse", "--sparsity")),
        ("--batch + --concurrency", [*BASE, "--batch", "4", "--concurrency", "4"], ("--batch",)),
        ("--concurrency + --request-rate", [*BASE, "--concurrency", "4", "--request-rate", "1"],
         ("--concurrency", "--request-rate")),
        ("--tp 3 --devices 2", [*BASE, "--tp", "3", "--devices", "2"], ("--tp", "--devices")),
        ("--tp 2 --pp 2 --devices 2", [*BASE, "--tp", "2", "--pp", "2", "--devices", "2"], ("--tp", "--pp", "--devices")),
        ("--spec-tokens without draft", [*BASE, "--spec-tokens", "4"], ("--spec-tokens", "--spec-draft")),
        ("--spec-acceptance without draft", [*BASE, "--spec-acceptance", "0.5"], ("--spec-acceptance", "--spec-draft")),
        ("--serving static + --concurrency", [*BASE, "--serving", "static", "--concurrency", "4"],
         ("--serving", "--concurrency")),
        ("--serving static + --request-rate", [*BASE, "--serving", "static", "--request-rate", "1"],
         ("--serving", "--request-rate")),
        ("--kv-block static", [*BASE, "--kv-block", "32"], ("--kv-block",)),
        ("--slo-ttft static", [*BASE, "--slo-ttft", "0.5"], ("--slo-ttft",)),
        ("--simulate static", [*BASE, "--simulate", "20"], ("--simulate",)),
        ("--lengths lognormal static", [*BASE, "--lengths", "lognormal"], ("--lengths",)),
        ("--prefix-hit static", [*BASE, "--prefix-hit", "0.5"], ("--prefix-hit",)),
        ("--ep 2 dense model", [*BASE, "--ep", "2"], ("--ep",)),
        ("--cpu-layers > layers", [*BASE, "--cpu-layers", "999"], ("--cpu-layers",)),
        ("--max-context < prompt", [*BASE, "--max-context", "64"], ("--max-context",)),
        ("--disaggregate 1:1 --devices 4", [*SERVED, "--disaggregate", "1:1", "--devices", "4"],
         ("--disaggregate", "--devices")),
        ("--disaggregate static", [*BASE, "--disaggregate", "1:1", "--devices", "2"], ("--disaggregate",)),
        ("--offload + --cpu-layers", [*BASE, "--offload", "weights=0.5", "--cpu-layers", "2"],
         ("--offload", "--cpu-layers")),
        ("repeated --batch", [*BASE, "--batch", "4", "--batch", "8"], ("--batch",)),
        ("repeated --hardware", [*BASE, "--hardware", "h200"], ("--hardware",)),
        ("repeated --weights", [*BASE, "--weights", "fp8", "--weights", "int4"], ("--weights",)),
        ("repeated --concurrency", [*SERVED, "--concurrency", "8"], ("--concurrency",)),
        ("--flash-attention --no-flash-attention", [*BASE, "--flash-attention", "--no-flash-attention"],
         ("--flash-attention", "--no-flash-attention")),
        ("--quiet --progress simulate", [*SERVED, "--simulate", "20", "--quiet", "--progress"], ("--quiet", "--progress")),
        ("--flash-attention on t4?", ["analyze", "--model", "llama-3.2-1b-instruct", "--hardware", "epyc-genoa",
                                      "--flash-attention"], ("--flash-attention",)),
        ("--activations fp8 --weights fp16", [*BASE, "--weights", "fp16", "--activations", "fp8"], ("--activations",)),
        ("--weight-density + --sparsity", [*BASE, "--weight-density", "0.5", "--sparsity", "2:4"],
         ("--weight-density", "--sparsity")),
        ("--spec-draft self:1 + --spec-tokens 0?", [*BASE, "--spec-draft", "self:1", "--spec-tokens", "0"],
         ("--spec-tokens",)),
        ("--request-rate saturating", [*BASE, "--request-rate", "1e6"], ("--request-rate",)),
        ("--kv-block huge", [*SERVED, "--kv-block", "1000000"], ("--kv-block",)),
        ("--batch max + --concurrency", [*BASE, "--batch", "max", "--concurrency", "4"], ("--batch",)),
        ("--simulate 5", [*SERVED, "--simulate", "5"], ("--simulate",)),
        ("--simulate 1e9", [*SERVED, "--simulate", "1000000000"], ("--simulate",)),
        ("--simulate nan", [*SERVED, "--simulate", "nan"], ("--simulate",)),
        ("--layers-used + --prune layers", [*BASE, "--layers-used", "0.5", "--prune", "layers=0.5"],
         ("--layers-used", "--prune")),
        ("--kv-budget > context", [*BASE, "--kv-budget", "100000"], ("--kv-budget",)),
    ]
    # may be accepted: SLOs, length distributions, prefix caching and disaggregation switch a point to
    # continuous batching (a closed loop at --batch: --serving's help), a huge KV block is a result
    either = {"--sparse + --sparsity 2:4", "--activations fp8 --weights fp16", "--kv-budget > context",
              "--slo-ttft static", "--lengths lognormal static", "--prefix-hit static", "--disaggregate static",
              "--kv-block huge",
              "--flash-attention on t4?", "--request-rate saturating", "--spec-draft self:1 + --spec-tokens 0?",
              "--weight-density + --sparsity", "--quiet --progress simulate", "--disaggregate 1:1 --devices 4",
              "--layers-used + --prune layers", "--offload + --cpu-layers"}
    return [Case("contradictions", label, argv, "either" if label in either else "refuse", names)
            for label, argv, names in c]


def output_cases(rng: random.Random) -> list[Case]:
    """--format json|csv stays machine-readable whatever else is asked; other subcommands' flags."""
    cases = [
        Case("output", "analyze json", [*BASE, "--format", "json"], "accept", json_out=True),
        Case("output", "analyze json simulate", [*SERVED, "--simulate", "20", "--format", "json"], "accept",
             json_out=True),
        Case("output", "analyze json simulate progress", [*SERVED, "--simulate", "20", "--progress", "--format", "json"],
             "accept", json_out=True),
        Case("output", "analyze json does-not-fit", ["analyze", "--model", "llama-3.1-405b", "--hardware", "rtx-4090",
                                                      "--format", "json"], "either", ("does not fit",), json_out=True),
        Case("output", "analyze json saturated", [*BASE, "--request-rate", "1e6", "--format", "json"], "either",
             ("--request-rate",), json_out=True),
        Case("output", "analyze json open loop lognormal", [*BASE, "--request-rate", "1", "--lengths", "lognormal",
                                                            "--format", "json"], "accept", json_out=True),
        Case("output", "analyze json slo", [*SERVED, "--slo-ttft", "0.5", "--format", "json"], "accept", json_out=True),
        Case("output", "compare json", ["compare", "--model", "llama-3.2-1b-instruct", "--hardware", "h100-sxm", "h200",
                                        "--format", "json"], "accept", json_out=True),
        Case("output", "compare json unfit", ["compare", "--model", "llama-3.1-405b", "--hardware", "h100-sxm",
                                              "rtx-4090", "--format", "json"], "either", json_out=True),
        Case("output", "list json", ["list", "hardware", "--format", "json"], "accept", json_out=True),
        Case("output", "list engines json", ["list", "engines", "--format", "json"], "accept", json_out=True),
        Case("output", "show json", ["show", "hardware", "h100-sxm", "--format", "json"], "accept", json_out=True),
        Case("output", "show study json", ["show", "study", "quant-roofline", "--format", "json"], "accept",
             json_out=True),
        Case("output", "analyze csv simulate", [*SERVED, "--simulate", "20", "--format", "csv"], "accept"),
        Case("output", "compare --plot to a folder", ["compare", "--model", "llama-3.2-1b-instruct", "--hardware",
                                                      "h100-sxm", "--plot", "."], "refuse", ("--plot",)),
        Case("output", "compare --plot no folder", ["compare", "--model", "llama-3.2-1b-instruct", "--hardware",
                                                    "h100-sxm", "--plot", "no/such/x.png"], "refuse", ("--plot", "x.png")),
        Case("output", "compare --plot .txt", ["compare", "--model", "llama-3.2-1b-instruct", "--hardware",
                                               "h100-sxm", "--plot", "x.txt"], "either", ("--plot",)),
        Case("output", "compare same preset twice", ["compare", "--model", "llama-3.2-1b-instruct", "--hardware",
                                                     "h100-sxm", "h100-sxm"], "either", ("--hardware", "h100-sxm")),
        Case("output", "show hardware nothere", ["show", "hardware", "nothere"], "refuse", ("nothere",)),
        Case("output", "show model nothere", ["show", "model", "nothere"], "refuse", ("nothere",)),
        Case("output", "show study nothere", ["show", "study", "nothere"], "refuse", ("nothere",)),
        Case("output", "list nothere", ["list", "nothere"], "refuse", ("nothere", "list")),
        Case("output", "no command", [], "refuse", ("command",)),
        Case("output", "unknown option", [*BASE, "--bogus", "1"], "refuse", ("--bogus",)),
        Case("output", "abbreviated option", [*BASE, "--con", "4"], "either", ("--con",)),
        Case("output", "ambiguous abbreviation", [*BASE, "--s", "4"], "refuse", ("--s",)),
    ]
    run_flags = [
        ("--seed -1", ["--seed=-1"], "refuse", ("--seed",)), ("--seed 2**32", ["--seed", str(2**32)], "refuse", ("--seed",)),
        ("--seed arabic", ["--seed", "\u0661"], "refuse", ("--seed",)), ("--seed 1.5", ["--seed", "1.5"], "refuse", ("--seed",)),
        ("--trials 0", ["--trials", "0"], "refuse", ("--trials",)), ("--workers 0", ["--workers", "0"], "refuse", ("--workers",)),
        ("--workers nan", ["--workers", "nan"], "refuse", ("--workers",)),
        ("--workers 100000", ["--workers", "100000"], "refuse", ("--workers",)),
        ("--out empty", ["--out", ""], "refuse", ("--out",)), ("--out /proc", ["--out", "/proc/fuzz"], "refuse", ("--out", "/proc")),
        ("--out a file", ["--out", "afile"], "refuse", ("--out", "afile")),
        ("--rows bogus", ["--rows", "bogus"], "refuse", ("--rows",)),
        ("--storage bogus", ["--storage", "bogus://x"], "refuse", ("--storage",)),
        ("--storage sqlite no folder", ["--storage", "sqlite:///no/such/dir/x.db"], "refuse", ("--storage", "x.db")),
        ("--trials on a grid", ["--trials", "5"], "refuse", ("--trials",)),
        ("--storage on a grid", ["--storage", "sqlite:///x.db"], "refuse", ("--storage",)),
        ("--scheduler unreachable", ["--scheduler", "tcp://127.0.0.1:9"], "refuse", ("--scheduler",)),
        ("--overwrite fresh", ["--overwrite"], "accept", ()),
    ]
    for label, flags, expect, names in run_flags:
        cases.append(Case("run-flags", label, ["run", "s.yaml", "--quiet", *flags], expect, names,
                          files={"s.yaml": TINY_STUDY, "afile": b"x"}))
    for label, argv, expect, names in [
        ("study unknown", ["run", "nothere"], "refuse", ("nothere",)),
        ("study ../", ["run", "../../etc/passwd"], "refuse", ("passwd",)),
        ("study name with newline", ["run", "a\nb"], "refuse", ("study",)),
    ]:
        cases.append(Case("run-flags", label, argv, expect, names))
    # validate and calibrate flags
    good = measured_csv([{}])
    for label, argv, expect, names in [
        ("validate --out file", ["validate", "--measured", "m.csv", "--out", "afile"], "refuse", ("--out", "afile")),
        ("validate --out /proc", ["validate", "--measured", "m.csv", "--out", "/proc/x"], "refuse", ("--out",)),
        ("validate --measured dir", ["validate", "--measured", "."], "refuse", ("--measured", ".")),
        ("validate --measured empty text", ["validate", "--measured", ""], "refuse", ("--measured",)),
        ("validate ok", ["validate", "--measured", "m.csv", "--out", "v", "--quiet"], "accept", ()),
        ("calibrate --out dir", ["calibrate", "--measured", "m.csv", "--out", "."], "refuse", ("--out",)),
        ("calibrate --out /dev/null", ["calibrate", "--measured", "m.csv", "--out", "/dev/null"], "refuse", ("--out",)),
        ("calibrate --out no folder", ["calibrate", "--measured", "m.csv", "--out", "no/such/c.yaml"], "refuse", ("--out", "c.yaml")),
        ("calibrate too few rows", ["calibrate", "--measured", "m.csv", "--out", "c.yaml", "--quiet"], "refuse", ("m.csv",)),
        ("calibrate same file twice", ["calibrate", "--measured", "m.csv", "m.csv", "--out", "c.yaml", "--quiet"],
         "refuse", ("m.csv",)),
    ]:
        cases.append(Case("fit-flags", label, argv, expect, names, files={"m.csv": good, "afile": b"x"}))
    return cases


def study_cases(rng: random.Random) -> list[Case]:
    """Study YAML files: the tiny study with one fault each."""
    faults = []

    def add(label, text, names, expect="refuse", plant=True):
        faults.append((label, text, names, expect, plant))
    m = "{M}"   # replaced by the case's marker
    add("unknown top key", study_text(top_extra="colour: blue\n"), ("colour",))
    add("duplicate top key", study_text(top_extra="method: random\n"), ("method",))
    add("duplicate space key", study_text(space_extra="  batch: 4\n"), ("batch",))
    add("unknown space param", study_text(space_extra=f"  batchh: [1, 2]\n  note: '{m}'\n"), ("batchh",))
    add("space value text", study_text(replace={"  batch: 1\n": f"  batch: '{m} x'\n"}), ("batch",))
    add("space value list with text", study_text(replace={"  batch: 1\n": f"  batch: [1, '{m} x']\n"}), ("batch",))
    add("space value mapping", study_text(replace={"  batch: 1\n": "  batch: {a: 1}\n"}), ("batch",))
    add("space value true", study_text(replace={"  batch: 1\n": "  batch: true\n"}), ("batch",))
    add("space value null", study_text(replace={"  batch: 1\n": "  batch: null\n"}), ("batch",))
    add("space value empty list", study_text(replace={"  batch: 1\n": "  batch: []\n"}), ("batch",))
    add("space .nan", study_text(replace={"  prompt_len: 128\n": "  prompt_len: .nan\n"}), ("prompt_len",))
    add("space .inf", study_text(replace={"  prompt_len: 128\n": "  prompt_len: .inf\n"}), ("prompt_len",))
    add("space -.inf", study_text(space_extra="  request_rate: -.inf\n"), ("request_rate",))
    add("space 1e400", study_text(replace={"  prompt_len: 128\n": "  prompt_len: 1e400\n"}), ("prompt_len",))
    add("space negative", study_text(replace={"  gen_len: 16\n": "  gen_len: -16\n"}), ("gen_len",))
    add("space zero", study_text(replace={"  gen_len: 16\n": "  gen_len: 0\n"}), ("gen_len",))
    add("space float int", study_text(replace={"  gen_len: 16\n": "  gen_len: 16.5\n"}), ("gen_len",))
    add("space huge int", study_text(replace={"  gen_len: 16\n": "  gen_len: 99999999999999999999999\n"}), ("gen_len",))
    add("space arabic digits", study_text(replace={"  gen_len: 16\n": "  gen_len: '\u0661\u0662'\n"}), ("gen_len",))
    add("space spec_draft arabic", study_text(space_extra="  spec_draft: 'self:\u0661'\n"), ("spec_draft",))
    add("space range bad", study_text(replace={"  gen_len: 16\n": "  gen_len: {min: 10, max: 1}\n"}), ("gen_len",))
    add("space range nan", study_text(replace={"  gen_len: 16\n": "  gen_len: {min: .nan, max: 10}\n"}), ("gen_len",))
    add("space range unknown key", study_text(replace={"  gen_len: 16\n": "  gen_len: {min: 1, max: 10, stepp: 2}\n"}),
        ("gen_len", "stepp"))
    add("space hardware unknown", study_text(replace={"  hardware: h100-sxm\n": f"  hardware: '{m} not a name'\n"}),
        ("hardware",))
    add("space hardware path missing", study_text(replace={"  hardware: h100-sxm\n": "  hardware: nothere/x.yaml\n"}),
        ("x.yaml",))
    add("space model unknown", study_text(replace={"  model: llama-3.2-1b-instruct\n": f"  model: '{m} y'\n"}),
        ("model",))
    add("space empty", study_text().replace("space:\n  hardware: h100-sxm\n  model: llama-3.2-1b-instruct\n  batch: 1\n"
                                             "  prompt_len: 128\n  gen_len: 16\n", "space: {}\n"), ("space",))
    add("space missing", "name: x\nobjectives: {tpot_s: min}\n", ("space",))
    add("space a list", study_text().replace("space:\n", "space: [1]\nspace_was:\n"), ("space",))
    add("space sparse + sparsity", study_text(space_extra="  sparse: true\n  sparsity: '1:4'\n"), ("sparse", "sparsity"))
    add("space batch + concurrency", study_text(space_extra="  concurrency: 4\n"), ("batch", "concurrency"), "either")
    add("space tp 3 devices 2 (a sweep marks it infeasible)", study_text(space_extra="  tp: 3\n  devices: 2\n"),
        ("tp", "devices"), "either")
    add("space concurrency + rate", study_text(space_extra="  concurrency: 4\n  request_rate: 1\n"),
        ("concurrency", "request_rate"))
    add("space spec_tokens no draft", study_text(space_extra="  spec_tokens: 4\n"), ("spec_tokens", "spec_draft"))
    add("space lengths repeated option", study_text(space_extra="  concurrency: 4\n  lengths: 'lognormal:sigma=1,sigma=2'\n"),
        ("lengths", "sigma"))
    add("space prune hidden=1", study_text(space_extra="  prune: 'hidden=1'\n"), ("prune",))
    add("space offload bad", study_text(space_extra="  offload: 'weights=2'\n"), ("offload",))
    add("space engine path", study_text(space_extra="  engine: ../vllm\n"), ("engine",))
    add("space engine empty", study_text(space_extra="  engine: ''\n"), ("engine",))
    add("space weights unknown", study_text(space_extra="  weights: fp7\n"), ("weights",))
    add("space lengths trace missing", study_text(space_extra="  concurrency: 4\n  lengths: no/trace.csv\n"),
        ("trace.csv", "lengths"))
    add("space huge grid", study_text(replace={"  gen_len: 16\n": "  gen_len: {min: 1, max: 100000000, step: 1}\n"})
        + "", ("max_points", "points", "gen_len"))
    add("objectives empty", study_text().replace("objectives:\n  tpot_s: min\n", "objectives: {}\n"), ("objectives",))
    add("objectives missing", study_text().replace("objectives:\n  tpot_s: min\n", ""), ("objectives",), "either")
    add("objectives unknown metric", study_text().replace("tpot_s: min", "tpot_ss: min"), ("tpot_ss",))
    add("objectives feasible", study_text().replace("tpot_s: min", "feasible: max"), ("feasible",))
    add("objectives bad sense", study_text().replace("tpot_s: min", f"tpot_s: '{m} x'"), ("tpot_s",))
    add("objectives list", study_text().replace("objectives:\n  tpot_s: min\n", "objectives: [tpot_s]\n"),
        ("objectives",))
    add("objectives nan cost", study_text().replace("tpot_s: min", "tpot_s: min\n  cost_per_million_tokens_usd: min")
        .replace("  hardware: h100-sxm\n", "  hardware: h100-sxm\n  price_usd: .nan\n"), ("price_usd",))
    add("constraints unknown", study_text(top_extra="constraints:\n  tpot_ss: {max: 1}\n"), ("tpot_ss",))
    add("constraints bad bound", study_text(top_extra=f"constraints:\n  tpot_s: {{max: '{m} x'}}\n"), ("tpot_s",))
    add("constraints nan", study_text(top_extra="constraints:\n  tpot_s: {max: .nan}\n"), ("tpot_s",))
    add("constraints min>max", study_text(top_extra="constraints:\n  tpot_s: {min: 1, max: 0.1}\n"), ("tpot_s",))
    add("constraints unknown bound", study_text(top_extra="constraints:\n  tpot_s: {below: 1}\n"), ("tpot_s", "below"))
    add("method unknown", study_text().replace("method: grid", "method: annealing"), ("method",))
    add("method text marker", study_text().replace("method: grid", f"method: '{m} x'"), ("method",))
    add("samples negative", study_text().replace("method: grid", "method: random\nsamples: -5"), ("samples",))
    add("samples on grid", study_text().replace("method: grid", "method: grid\nsamples: 5"), ("samples",))
    add("random without samples", study_text().replace("method: grid", "method: random"), ("samples",), "either")
    add("seed negative", study_text(top_extra="seed: -1\n"), ("seed",))
    add("seed 2**40", study_text(top_extra="seed: 1099511627776\n"), ("seed",))
    add("seed text", study_text(top_extra=f"seed: '{m}'\n"), ("seed",))
    add("seed float", study_text(top_extra="seed: 1.5\n"), ("seed",))
    add("seed true", study_text(top_extra="seed: true\n"), ("seed",))
    add("max_points 0", study_text(top_extra="max_points: 0\n"), ("max_points",))
    add("chunk_size 0", study_text(top_extra="chunk_size: 0\n"), ("chunk_size",))
    add("chunk_size nan", study_text(top_extra="chunk_size: .nan\n"), ("chunk_size",))
    add("ideal text", study_text(top_extra="ideal: 'yes'\n"), ("ideal",))
    add("sampler bad", study_text().replace("method: grid", "method: optuna\ntrials: 4\nsampler: annealer"), ("sampler",))
    add("sampler on grid", study_text(top_extra="sampler: tpe\n"), ("sampler",))
    add("trials 0", study_text().replace("method: grid", "method: optuna\ntrials: 0"), ("trials",))
    add("trials on grid", study_text(top_extra="trials: 5\n"), ("trials",))
    add("population 1", study_text().replace("method: grid", "method: optuna\ntrials: 4\npopulation: 1"), ("population",))
    add("outputs bad rows", study_text(top_extra="outputs: {rows: some}\n"), ("rows",))
    add("outputs unknown key", study_text(top_extra="outputs: {rowz: all}\n"), ("rowz",))
    add("outputs sample 0", study_text(top_extra="outputs: {rows: sample, sample: 0}\n"), ("sample",))
    add("name with slash", study_text().replace("name: fuzz-tiny", "name: ../evil"), ("name",))
    add("name marker text", study_text().replace("name: fuzz-tiny", f"name: '{m} with spaces'"), ("name",))
    add("description list", study_text().replace("description: one point", "description: [a]"), ("description",))
    add("a list", "- 1\n- 2\n", ("s.yaml",))
    add("a scalar", f"'{m} just text'\n", ("s.yaml",))
    add("comments only", f"# {m}\n", ("s.yaml",))
    add("tabs", "name: x\nspace:\n\thardware: h100-sxm\n", ("s.yaml",))
    add("python tag", "!!python/object/apply:os.system ['true']\n", ("s.yaml",))
    add("custom tag", f"!{m} x\n", ("s.yaml",))
    add("alias bomb", "a: &a [x,x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
        "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d]\nf: [*e,*e,*e,*e,*e,*e,*e,*e,*e,*e]\n",
        ("s.yaml",))
    add("deep nesting", "a: " + "[" * 5000 + "]" * 5000 + "\n", ("s.yaml",))
    add("unclosed quote", f"name: '{m}\nspace: {{}}\n", ("s.yaml",))
    add("bad indentation", "name: x\n space:\n hardware: h\n", ("s.yaml",))
    add("BOM", "\ufeff" + study_text(), (), "accept", False)
    add("CRLF", study_text().replace("\n", "\r\n"), (), "accept", False)
    add("merge key", "base: &b {hardware: h100-sxm}\n" + study_text(), ("base",))
    add("key is a number", study_text(top_extra="1: x\n"), ("1",))
    add("key is a list", study_text(top_extra="[a]: x\n"), ("s.yaml",))
    add("unicode key", study_text(top_extra="n\u0101me: x\n"), ("n\u0101me",))
    add("huge string value", study_text().replace("description: one point", "description: " + "y" * 2_000_000),
        (), "either", False)
    cases = []
    for label, text, names, expect, plant in faults:
        mk = marker(rng)
        body = text.replace("{M}", mk)
        cases.append(Case("study-yaml", label, ["run", "s.yaml", "--quiet", "--out", "o"], expect, (*names, "s.yaml"),
                          files={"s.yaml": body}, marker=mk if "{M}" in text or plant else None))
    return cases


def preset_cases(rng: random.Random) -> list[Case]:
    """Hardware presets given as a path (analyze --hardware x.yaml; in a study's space): faults in a copy of
    rtx-4090."""
    src = (ROOT / "configs" / "hardware" / "rtx-4090.yaml").read_text()
    faults = [
        ("unknown key", src + "colour: '{M} x'\n", ("colour",)),
        ("duplicate key", src + "tdp_w: {value: 500, source: specs}\n", ("tdp_w",)),
        ("value nan", src.replace("tdp_w: {value: 450", "tdp_w: {value: .nan"), ("tdp_w",)),
        ("value inf", src.replace("tdp_w: {value: 450", "tdp_w: {value: .inf"), ("tdp_w",)),
        ("value negative", src.replace("tdp_w: {value: 450", "tdp_w: {value: -450"), ("tdp_w",)),
        ("value text marker", src.replace("tdp_w: {value: 450", "tdp_w: {value: '{M} x'"), ("tdp_w",)),
        ("value 1e400", src.replace("bandwidth_bytes_per_s: {value: 1008.0e9", "bandwidth_bytes_per_s: {value: 1e400"),
         ("bandwidth_bytes_per_s",)),
        ("capacity 0", src.replace("capacity_bytes: {value: 25769803776", "capacity_bytes: {value: 0"),
         ("capacity_bytes",)),
        ("no source", src.replace("tdp_w: {value: 450, source: specs}", "tdp_w: {value: 450}"), ("tdp_w", "source")),
        ("source unknown key", src.replace("tdp_w: {value: 450, source: specs}", "tdp_w: {value: 450, source: nosuch}"),
         ("tdp_w", "nosuch", "source")),
        ("class unknown", src.replace("class: gpu", "class: '{M} x'"), ("class",)),
        ("family unknown", src.replace("family: gpu", "family: quantum"), ("family",)),
        ("memory_tiers empty", src.split("memory_tiers:")[0] + "memory_tiers: []\n" + src.split("onchip_buffer_bytes")[1]
         .join(["onchip_buffer_bytes", ""]), ("memory_tiers",)),
        ("peak empty", src.replace("peak_ops_per_s:\n", "peak_ops_per_s: {}\npeak_was:\n"), ("peak_ops_per_s", "peak_was")),
        ("peak unknown format", src.replace("  fp32: {value: 82.6e12", "  fp33: {value: 82.6e12"), ("fp33",)),
        ("peak arabic digits", src.replace("fp32: {value: 82.6e12", "fp32: {value: '\u0668\u0662'"), ("fp32",)),
        ("onchip negative", src.replace("onchip_buffer_bytes: {value: 102400", "onchip_buffer_bytes: {value: -1"),
         ("onchip_buffer_bytes",)),
        ("price text", src.replace("price_usd: {value: 1599", "price_usd: {value: '{M}'"), ("price_usd",)),
        ("name mismatch", src.replace("name: rtx-4090", "name: '{M} other name'"), ("name",)),
        ("not a mapping", "- {M} a\n- b\n", ("p.yaml",)),
        ("a study", TINY_STUDY.replace("one point", "{M} desc"), ("p.yaml",)),
        ("the links table", (ROOT / "configs" / "links.yaml").read_text(), ("p.yaml",)),
        ("the tiers table", (ROOT / "configs" / "tiers.yaml").read_text(), ("p.yaml",)),
        ("a model config", (ROOT / "configs" / "models" / "llama-3.1-8b.json").read_text(), ("p.yaml",)),
        ("tier bandwidth 0", src.replace("bandwidth_bytes_per_s: {value: 1008.0e9", "bandwidth_bytes_per_s: {value: 0"),
         ("bandwidth_bytes_per_s",)),
        ("sparse peak above 2x", src.replace("fp16: {value: 330.3e12", "fp16: {value: 330.3e20"), ("sparse",)),
        ("interconnect half", src + "interconnect: {bandwidth_bytes_per_s: {value: 1e9, source: specs}}\n",
         ("interconnect",)),
        ("host_memory bad", src + "host_memory: {capacity_bytes: {value: -1, source: specs}}\n", ("host_memory",)),
    ]
    # may be accepted: a source may be a citation's text rather than a key of 'sources'
    either = {"sparse peak above 2x", "name mismatch", "source unknown key"}
    cases = []
    for label, text, names in faults:
        mk = marker(rng)
        body = text.replace("{M}", mk)
        exp = "either" if label in either else "refuse"
        cases.append(Case("preset-path", label, ["analyze", "--model", "llama-3.2-1b-instruct", "--hardware", "p.yaml",
                                                 "--prompt-len", "128", "--gen-len", "16"], exp, (*names, "p.yaml"),
                          files={"p.yaml": body}, marker=None if label == "name mismatch" else mk))
        # (a preset's name is the name analyze shows its results under: not a message quoting the file)
        if label in ("unknown key", "a study", "the links table", "value text marker", "not a mapping"):
            cases.append(Case("preset-path", label + " (in a study)", ["run", "s.yaml", "--quiet", "--out", "o"], exp,
                              (*names, "p.yaml"), files={"p.yaml": body, "s.yaml": TINY_STUDY.replace(
                                  "hardware: h100-sxm", "hardware: p.yaml")}, marker=mk))
            cases.append(Case("preset-path", label + " (--host-cpu)", [*BASE, "--host-cpu", "p.yaml"], exp,
                              (*names, "p.yaml", "--host-cpu"), files={"p.yaml": body}, marker=mk))
    return cases


def model_cases(rng: random.Random) -> list[Case]:
    """Model configs given as a path (analyze --model x.json): faults in a copy of llama-3.2-1b-instruct."""
    base = json.loads((ROOT / "configs" / "models" / "llama-3.2-1b-instruct.json").read_text())

    def mut(**kw):
        d = dict(base)
        for k, v in kw.items():
            if v is ...:
                d.pop(k, None)
            else:
                d[k] = v
        return json.dumps(d)
    faults = [
        ("hidden_size 0", mut(hidden_size=0), ("hidden_size",)),
        ("hidden_size negative", mut(hidden_size=-2048), ("hidden_size",)),
        ("hidden_size text", mut(hidden_size="{M} x"), ("hidden_size",)),
        ("hidden_size float", mut(hidden_size=2048.5), ("hidden_size",)),
        ("hidden_size true", mut(hidden_size=True), ("hidden_size",)),
        ("hidden_size missing", mut(hidden_size=...), ("hidden_size",)),
        ("layers huge", mut(num_hidden_layers=10**12), ("num_hidden_layers",)),
        ("layers 0", mut(num_hidden_layers=0), ("num_hidden_layers",)),
        ("heads not dividing", mut(num_attention_heads=7), ("num_attention_heads", "hidden_size")),
        ("kv heads > heads", mut(num_key_value_heads=64), ("num_key_value_heads",)),
        ("kv heads not dividing", mut(num_key_value_heads=5), ("num_key_value_heads",)),
        ("vocab 1e30", mut(vocab_size=1e30), ("vocab_size",)),
        ("vocab NaN", mut(vocab_size=float("nan")), ("vocab_size",)),
        ("max_position 0", mut(max_position_embeddings=0), ("max_position_embeddings",)),
        ("intermediate missing", mut(intermediate_size=...), ("intermediate_size",)),
        ("model_type unknown", mut(model_type="{M} x"), ("model_type",)),
        ("experts without top-k", mut(num_local_experts=8), ("num_local_experts", "experts")),
        ("rope_scaling text", mut(rope_scaling="{M} x"), ("rope_scaling",)),
        ("head_dim 0", mut(head_dim=0), ("head_dim",)),
        ("torch_dtype odd", mut(torch_dtype="{M}"), ("torch_dtype",)),
        ("a list", json.dumps([1, 2]), ("m.json",)),
        ("not json", "{M} {", ("m.json",)),
        ("duplicate key", mut()[:-1] + ', "hidden_size": 1024}', ("hidden_size",)),
        ("trailing comma", mut()[:-1] + ",}", ("m.json",)),
        ("deep nesting", "[" * 100000 + "]" * 100000, ("m.json",)),
        ("a yaml preset", (ROOT / "configs" / "hardware" / "rtx-4090.yaml").read_text(), ("m.json",)),
        ("Infinity", mut()[:-1] + ', "rms_norm_eps": Infinity}', ("rms_norm_eps",)),
        ("BOM", "\ufeff" + mut(), (), ),
    ]
    # may be accepted: keys dse does not read (rope_scaling leaves the shapes as they are; torch_dtype)
    either = {"torch_dtype odd", "Infinity", "BOM", "head_dim 0", "rope_scaling text"}
    cases = []
    for label, text, names in faults:
        mk = marker(rng)
        body = text.replace("{M}", mk)
        exp = "accept" if label == "BOM" else "either" if label in either else "refuse"
        cases.append(Case("model-path", label, ["analyze", "--model", "m.json", "--hardware", "h100-sxm", "--prompt-len",
                                                "128", "--gen-len", "16"], exp, (*names, "m.json"),
                          files={"m.json": body}, marker=mk if "{M}" in text else None))
    for label in ("hidden_size text", "a list", "duplicate key"):
        text = next(t for lab, t, _ in faults if lab == label)
        mk = marker(rng)
        cases.append(Case("model-path", label + " (--spec-draft)", [*BASE, "--spec-draft", "m.json"], "refuse",
                          ("m.json", "--spec-draft"), files={"m.json": text.replace("{M}", mk)},
                          marker=mk if "{M}" in text else None))
    return cases


def calibration_cases(rng: random.Random) -> list[Case]:
    """DSE_CALIBRATION files: the shipped file cut down and broken one way each."""
    ok = ("families:\n  gpu:\n    compute: {value: 0.5, note: '{M} note'}\n    memory: {value: 0.6}\n"
          "bands:\n  all: {n: 10, low: 0.8, high: 1.2}\n")
    faults = [
        ("good small", ok, (), "accept"),
        ("empty", "", ("c.yaml",), "refuse"),
        ("comment only", "# {M}\n", ("c.yaml",), "refuse"),
        ("unknown section", ok + "extras: {a: '{M} x'}\n", ("extras",), "refuse"),
        ("families empty", "families: {}\n", ("families",), "refuse"),
        ("families list", "families: ['{M} x']\n", ("families",), "refuse"),
        ("unknown family", ok.replace("  gpu:", "  quantum:"), ("quantum",), "refuse"),
        ("unknown parameter", ok.replace("memory:", "memroy:"), ("memroy",), "refuse"),
        ("value text", ok.replace("value: 0.6", "value: '{M} x'"), ("memory",), "refuse"),
        ("value abc", ok.replace("value: 0.6", "value: abc"), ("memory",), "refuse"),
        ("value nan", ok.replace("value: 0.6", "value: .nan"), ("memory",), "refuse"),
        ("value 1e-300", ok.replace("value: 0.6", "value: 1e-300"), ("memory",), "refuse"),
        ("value negative", ok.replace("value: 0.6", "value: -0.6"), ("memory",), "refuse"),
        ("value 5", ok.replace("value: 0.6", "value: 5"), ("memory",), "refuse"),
        ("value list", ok.replace("value: 0.6", "value: [0.6]"), ("memory",), "refuse"),
        ("value arabic", ok.replace("value: 0.6", "value: '\u0660.\u0666'"), ("memory",), "refuse"),
        ("extra key", ok.replace("memory: {value: 0.6}", "memory: {value: 0.6, sigma: 1}"), ("memory", "sigma"), "refuse"),
        ("duplicate section", ok + "families:\n  gpu:\n    compute: {value: 0.9}\n", ("families",), "refuse"),
        ("duplicate parameter", ok.replace("    memory: {value: 0.6}\n", "    memory: {value: 0.6}\n    memory: {value: 0.7}\n"),
         ("memory",), "refuse"),
        ("band low > high", ok.replace("low: 0.8, high: 1.2", "low: 1.5, high: 1.2"), ("bands",), "refuse"),
        ("band text", ok.replace("low: 0.8", "low: 'abc'"), ("bands", "low"), "refuse"),
        ("band n 0", ok.replace("n: 10", "n: 0"), ("bands", "n"), "refuse"),
        ("band extra key", ok.replace("high: 1.2}", "high: 1.2, mid: 1}"), ("bands", "mid"), "refuse"),
        ("band huge", ok.replace("high: 1.2", "high: 1e300"), ("bands", "high"), "refuse"),
        ("engines unknown", ok + "engines:\n  nosuch: {step_overhead_s: {value: 0.001}}\n", ("nosuch", "engines"), "refuse"),
        ("launch unknown", ok + "launch:\n  warp: {op_overhead_s: {value: 1e-6}}\n", ("warp", "launch"), "refuse"),
        ("engines param unknown", ok + "engines:\n  vllm: {nosuch_s: {value: 0.001}}\n", ("nosuch_s",), "refuse"),
        ("a study", TINY_STUDY, ("c.yaml",), "refuse"),
        ("a list", "- '{M} x'\n", ("c.yaml",), "refuse"),
        ("fitted text", ok + "fitted: '{M} x'\n", ("fitted",), "refuse"),
    ]
    cases = []
    for label, text, names, exp in faults:
        mk = marker(rng)
        body = text.replace("{M}", mk)
        cases.append(Case("calibration", label, BASE, exp, (*names, "c.yaml", "DSE_CALIBRATION"),
                          files={"c.yaml": body}, env={"DSE_CALIBRATION": "c.yaml"},
                          marker=mk if "{M}" in text else None))
    for label in ("value text", "unknown family", "band low > high"):
        text = next(t for lab, t, _, _ in faults if lab == label)
        mk = marker(rng)
        cases.append(Case("calibration", label + " (validate)", ["validate", "--quiet", "--out", "v"], "refuse",
                          ("c.yaml", "DSE_CALIBRATION"), files={"c.yaml": text.replace("{M}", mk)},
                          env={"DSE_CALIBRATION": "c.yaml"}, marker=mk))
        cases.append(Case("calibration", label + " (run)", ["run", "s.yaml", "--quiet", "--out", "o"], "refuse",
                          ("c.yaml", "DSE_CALIBRATION"), files={"c.yaml": text.replace("{M}", mk), "s.yaml": TINY_STUDY},
                          env={"DSE_CALIBRATION": "c.yaml"}, marker=mk))
    return cases


def measured_cases(rng: random.Random) -> list[Case]:
    """Measured-results CSVs for validate (and calibrate): a shipped row with one cell broken."""
    cols = next(csv.reader([MEASURED_HEADER]))
    faults = [
        ("devices text", [{"devices": "{M}x"}], ("devices",)),
        ("devices 0", [{"devices": "0"}], ("devices",)),
        ("devices 1.5", [{"devices": "1.5"}], ("devices",)),
        ("devices arabic", [{"devices": "\u0661"}], ("devices",)),
        ("value text", [{"value": "{M}"}], ("value",)),
        ("value text number-ish", [{"value": "12{M}"}], ("value",)),
        ("value nan", [{"value": "nan"}], ("value",)),
        ("value inf", [{"value": "inf"}], ("value",)),
        ("value negative", [{"value": "-5"}], ("value",)),
        ("value 1e400", [{"value": "1e400"}], ("value",)),
        ("value arabic", [{"value": "\u0668\u0660\u0661\u0661"}], ("value",)),
        ("model unknown", [{"model_slug": "{M}-model"}], ("model_slug", "model")),
        ("hardware unknown", [{"hardware_slug": "{M}-hw"}], ("hardware_slug", "hardware")),
        ("hardware path", [{"hardware_slug": "/dev/zero"}], ("hardware_slug", "hardware")),
        ("model path", [{"model_slug": "../{M}/x.json"}], ("model_slug", "model")),
        ("metric unknown", [{"metric": "{M}_metric"}], ("metric",)),
        ("weights unknown", [{"weights": "{M}fmt"}], ("weights",)),
        ("prompt_len 1.5", [{"prompt_len": "1.5"}], ("prompt_len",)),
        ("prompt_len text", [{"prompt_len": "{M}"}], ("prompt_len",)),
        ("gen_len 0", [{"gen_len": "0"}], ("gen_len",)),
        ("batch text", [{"batch": "{M}"}], ("batch",)),
        ("tp x pp != devices", [{"tp": "3", "pp": "1", "devices": "2"}], ("tp", "devices")),
        ("serving bogus", [{"serving": "{M}"}], ("serving",)) if "serving" in cols else None,
        ("all rows bad", [{"value": "{M}"}, {"value": "x{M}"}, {"devices": "{M}"}, {"value": "-1"}], ("value",)),
    ]
    faults = [f for f in faults if f]
    structural = [
        ("header only", MEASURED_HEADER + "\n", ("m.csv",)),
        ("empty", "", ("m.csv",)),
        ("renamed optional column", measured_csv([{}]).replace("metric_value", "metric_valu"), ("m.csv",)),
        ("duplicate column", MEASURED_HEADER + ",value\n" + MEASURED_ROWS[0] + ",1\n", ("value", "m.csv")),
        ("missing required", "id,model_slug\n1,{M}\n", ("m.csv",)),
        ("unclosed quote", MEASURED_HEADER + '\n"{M}' + MEASURED_ROWS[0] + "\n", ("m.csv",)),
        ("NUL byte", MEASURED_HEADER + "\n" + MEASURED_ROWS[0] + "\x00\n", ("m.csv",)),
        ("row too long", MEASURED_HEADER + "\n" + MEASURED_ROWS[0] + ",{M},extra\n", ("m.csv",)),
        ("row too short", MEASURED_HEADER + "\nM1,{M}\n", ("m.csv",)),
        ("BOM CRLF", "\ufeff" + measured_csv([{}]).replace("\n", "\r\n"), ()),
        ("huge field", MEASURED_HEADER + "\n" + MEASURED_ROWS[0].replace("M002", "M" + "9" * 200_000) + "\n", ("m.csv",)),
        ("a yaml file", TINY_STUDY.replace("one point", "{M}"), ("m.csv",)),
        ("only context rows", measured_csv([{"scored": "no", "notes": "{M}"}]), ("m.csv",)),
    ]
    cases = []
    for label, rows, names in faults:
        mk = marker(rng)
        body = measured_csv([{k: v.replace("{M}", mk) for k, v in r.items()} for r in rows])
        # one good row beside the bad one: validate goes on and lists the bad row
        for cmd, exp in ((["validate", "--measured", "m.csv", "--out", "v", "--quiet"], "either"),):
            cases.append(Case("measured-csv", label + " (+good row)", cmd, exp, (*names, "m.csv"),
                              files={"m.csv": body + MEASURED_ROWS[1] + "\n"}, marker=mk))
            cases.append(Case("measured-csv", label, cmd, "refuse", (*names, "m.csv"), files={"m.csv": body}, marker=mk))
    for label, text, names in structural:
        mk = marker(rng)
        exp = "accept" if label == "BOM CRLF" else "either" if label == "renamed optional column" else "refuse"
        cases.append(Case("measured-csv", label, ["validate", "--measured", "m.csv", "--out", "v", "--quiet"], exp,
                          (*names, "m.csv"), files={"m.csv": text.replace("{M}", mk)},
                          marker=mk if "{M}" in text else None))
    for label, rows, names in faults[:6] + faults[11:16]:
        mk = marker(rng)
        body = measured_csv([{k: v.replace("{M}", mk) for k, v in r.items()} for r in rows])
        cases.append(Case("measured-csv", label + " (calibrate)", ["calibrate", "--measured", "m.csv", "--out", "c.yaml",
                                                                    "--quiet", "--no-cross-validation"], "refuse",
                          (*names, "m.csv"), files={"m.csv": body}, marker=mk))
    return cases


def trace_cases(rng: random.Random) -> list[Case]:
    """Length traces (analyze --concurrency 4 --lengths t.csv)."""
    good = "prompt_len,gen_len\n" + "".join(f"{100 + 7 * i},{10 + i}\n" for i in range(20))
    faults = [
        ("good", good, (), "accept"),
        ("header only", "prompt_len,gen_len\n", ("t.csv",), "refuse"),
        ("missing column", "prompt_len\n100\n", ("t.csv", "gen_len"), "refuse"),
        ("wrong header", "p,g\n100,10\n", ("t.csv",), "refuse"),
        ("negative", good + "-5,10\n", ("t.csv",), "refuse"),
        ("zero prompt", good + "0,10\n", ("t.csv",), "refuse"),
        ("zero gen", good + "100,0\n", ("t.csv",), "refuse"),
        ("nan", good + "nan,10\n", ("t.csv",), "refuse"),
        ("inf", good + "inf,10\n", ("t.csv",), "refuse"),
        ("text", good + "{M},10\n", ("t.csv",), "refuse"),
        ("float", good + "100.5,10\n", ("t.csv",), "either"),
        ("arabic digits", good + "\u0661\u0660\u0660,10\n", ("t.csv",), "refuse"),
        ("1e309", good + "1e309,10\n", ("t.csv",), "refuse"),
        ("huge int", good + "99999999999999999999,10\n", ("t.csv",), "refuse"),
        ("past context", good + "200000,10\n", ("t.csv", "context", "clamp"), "either"),
        ("extra column", "prompt_len,gen_len,x\n100,10,{M}\n", ("t.csv",), "either"),
        ("duplicate column", "prompt_len,gen_len,gen_len\n100,10,20\n", ("t.csv", "gen_len"), "refuse"),
        ("one row", "prompt_len,gen_len\n100,10\n", (), "accept"),
        ("empty cell", good + ",10\n", ("t.csv",), "refuse"),
        ("row too long", good + "100,10,{M}\n", ("t.csv",), "refuse"),
        ("row too short", good + "100\n", ("t.csv",), "refuse"),
        ("blank lines", good.replace("\n", "\n\n"), (), "either"),
        ("unclosed quote", good + '"{M},10\n', ("t.csv",), "refuse"),
        ("semicolons", "prompt_len;gen_len\n100;10\n", ("t.csv",), "refuse"),
    ]
    cases = []
    for label, text, names, exp in faults:
        mk = marker(rng)
        cases.append(Case("lengths-trace", label, [*SERVED, "--lengths", "t.csv"], exp, (*names, "--lengths"),
                          files={"t.csv": text.replace("{M}", mk)}, marker=mk if "{M}" in text else None))
    for label in ("text", "negative", "row too long"):
        text = next(t for lab, t, _, _ in faults if lab == label)
        mk = marker(rng)
        cases.append(Case("lengths-trace", label + " (in a study)", ["run", "s.yaml", "--quiet", "--out", "o"], "refuse",
                          ("t.csv", "lengths"), files={"t.csv": text.replace("{M}", mk), "s.yaml": study_text(
                              space_extra="  concurrency: 4\n  lengths: t.csv\n").replace("  batch: 1\n", "")},
                          marker=mk if "{M}" in text else None))
    return cases


def special_cases(rng: random.Random) -> list[Case]:
    """Every file input with special files in its place."""
    inputs = {
        "--hardware": ("p.yaml", lambda p: ["analyze", "--model", "llama-3.2-1b-instruct", "--hardware", p]),
        "--model": ("m.json", lambda p: ["analyze", "--model", p, "--hardware", "h100-sxm"]),
        "--lengths": ("t.csv", lambda p: [*SERVED, "--lengths", p]),
        "--measured": ("m.csv", lambda p: ["validate", "--measured", p, "--out", "v", "--quiet"]),
        "calibrate --measured": ("m.csv", lambda p: ["calibrate", "--measured", p, "--out", "c.yaml", "--quiet"]),
        "run STUDY": ("s.yaml", lambda p: ["run", p, "--quiet", "--out", "o"]),
        "DSE_CALIBRATION": ("c.yaml", lambda p: BASE),
        "study space hardware": ("p.yaml", lambda p: ["run", "s.yaml", "--quiet", "--out", "o"]),
        "--spec-draft": ("m.json", lambda p: [*BASE, "--spec-draft", p]),
        "show hardware": ("p.yaml", lambda p: ["show", "hardware", p]),
    }
    cases = []
    for what, (name, argv_of) in inputs.items():
        for kind in SPECIALS:
            path, files = special_file(kind, name)
            env = {}
            if what == "DSE_CALIBRATION":
                env = {"DSE_CALIBRATION": path}
            if what == "study space hardware":
                files = {**files, "s.yaml": TINY_STUDY.replace("hardware: h100-sxm", f"hardware: {json.dumps(path)}")}
            names = (what.split()[-1], Path(path).name[:20]) if kind != "newline-name" else (what.split()[-1], "bad\\nname")
            if kind in ("devzero", "devnull"):
                names = (*names, "/dev/")
            cases.append(Case("special-files", f"{what} {kind}", argv_of(path), "refuse", names, files=files, env=env,
                              timeout=20.0 if kind == "fifo" else 60.0))
    return cases


def random_cases(rng: random.Random, n: int = 60) -> list[Case]:
    """Random analyze command lines: 2 to 4 flags drawn from pools of odd but plausible values."""
    pools = {
        "--batch": ["1", "max", "7", "1024", "0"], "--prompt-len": ["1", "2", "8191", "131072", "200000"],
        "--gen-len": ["1", "2", "4096", "0"], "--devices": ["2", "3", "8", "1024"], "--tp": ["2", "3", "16"],
        "--pp": ["2", "16", "100"], "--concurrency": ["1", "3", "4096"], "--request-rate": ["0.01", "50", "1e5"],
        "--lengths": ["lognormal", "lognormal:sigma=3", "lognormal:prompt_sigma=0,gen_sigma=2"],
        "--prefix-hit": ["0.5", "1"], "--kv-block": ["1", "256"], "--prefill-chunk": ["0", "1", "64"],
        "--max-running": ["1", "2"], "--slo-ttft": ["1e-6", "10"], "--slo-tpot": ["1e-6", "1"],
        "--weights": ["int4", "fp4", "nvfp4", "fp8"], "--kv": ["int4", "fp8"], "--activations": ["fp8", "int8"],
        "--offload": ["greedy", "weights=0.5", "kv=1"], "--cpu-layers": ["1", "15"], "--sparsity": ["2:4", "1:8"],
        "--weight-density": ["0.01", "0.9"], "--activation-sparsity": ["0.1", "0.9"], "--layers-used": ["0.1", "0.9"],
        "--kv-budget": ["1", "128"], "--prune": ["layers=0.5", "heads=0.5"], "--spec-draft": ["self:1", "self:8"],
        "--engine": ["vllm", "sglang", "trt-llm", "llama.cpp", "tgi"], "--hardware": ["rtx-4090", "tpu-v5e", "groq-lpu",
                                                                                     "hbm-pim", "epyc-genoa", "m2-ultra"],
        "--disaggregate": ["1:1", "2:1"], "--max-context": ["256", "4096"], "--ep": ["2"],
        "--no-flash-attention": [None], "--no-overlap": [None], "--ideal": [None],
    }
    keys = sorted(pools)
    cases = []
    for i in range(n):
        argv = list(BASE)
        chosen = rng.sample(keys, rng.randint(2, 4))
        for k in chosen:
            v = rng.choice(pools[k])
            if k in argv:                       # a flag of BASE: its value replaced (a flag given twice is refused)
                argv[argv.index(k) + 1] = v
            elif v is None:
                argv.append(k)
            else:
                argv += [k, v]
        if rng.random() < 0.3:
            argv += ["--format", "json"]
        # the refusal names one of the inputs: a flag, or a name given (the hardware's, ...)
        named = tuple(a for a in argv if a.startswith("--") or (a[:1].isalpha() and a not in ("analyze", "json")))
        cases.append(Case("random-combos", " ".join(argv[len(BASE):]), argv, "either", named,
                          json_out="json" in argv))
    return cases


CLASSES = {"flags-numeric": flag_cases, "flags-names": name_flag_cases, "contradictions": contradiction_cases,
           "output": output_cases, "study-yaml": study_cases, "preset-path": preset_cases, "model-path": model_cases,
           "calibration": calibration_cases, "measured-csv": measured_cases, "lengths-trace": trace_cases,
           "special-files": special_cases, "random-combos": random_cases}


def all_cases(seed: int) -> list[Case]:
    """Every case, in a reproducible order (one generator per class, seeded from ``seed`` and the class)."""
    out = []
    for name, make in CLASSES.items():
        out += make(random.Random(f"{seed}:{name}"))
    return out


# ----------------------------------------------------------------------------------------------- running

def _make_files(folder: Path, files: dict) -> None:
    for name, content in files.items():
        p = folder / name
        if content == "dir":
            p.mkdir()
        elif content == "fifo":
            os.mkfifo(p)
        elif content == "devzero-link":
            p.symlink_to("/dev/zero")
        elif content == "dangling-link":
            p.symlink_to(folder / "no-such-target")
        elif content == "huge":
            with open(p, "wb") as f:          # sparse: 200 MiB that take no room
                f.truncate(200 * 2**20)
        else:
            p.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))


def _limits():
    """In the child: its own session (killed as a group) and at most 6 GiB of address space."""
    resource.setrlimit(resource.RLIMIT_AS, (6 * 2**30, 6 * 2**30))


@dataclass
class Result:
    case: Case
    outcome: str
    rc: int | None
    seconds: float
    message: str


def run_case(case: Case) -> Result:
    """Run ``case`` in a fresh temporary folder and classify how it ended."""
    folder = Path(tempfile.mkdtemp(prefix="dse-fuzz-"))
    try:
        _make_files(folder, case.files)
        env = {k: v for k, v in os.environ.items() if k != "DSE_CALIBRATION"}
        env.update(PYTHONPATH=str(ROOT), PYTHONDONTWRITEBYTECODE="1", MPLBACKEND="Agg", **case.env)
        t0 = time.perf_counter()
        p = subprocess.Popen([PY, "-m", "dse.study", *case.argv], cwd=folder, env=env, stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                             preexec_fn=_limits)
        try:
            out, err = p.communicate(timeout=case.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate()
            return Result(case, "hang", None, time.perf_counter() - t0, err.decode("utf-8", "replace")[-200:])
        dt = time.perf_counter() - t0
        return Result(case, classify(case, p.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")),
                      p.returncode, dt, err.decode("utf-8", "replace").strip()[:300])
    finally:
        shutil.rmtree(folder, ignore_errors=True)


_NOISE = re.compile(r"Warning|warn\(|^\s*\^", re.M)


def classify(case: Case, rc: int, out: str, err: str) -> str:
    """One outcome of ``OUTCOMES`` for a finished run of ``case``."""
    if "Traceback (most recent call last)" in err or "Traceback (most recent call last)" in out:
        return "traceback"
    if rc < 0:
        return "killed"
    if case.marker and (case.marker in err or case.marker in out):
        return "echo"
    if case.json_out and out.strip():
        try:
            json.loads(out)
        except ValueError:
            return "not-json"
    lines = [ln for ln in err.splitlines() if ln.strip()]
    if rc == 0:
        if _NOISE.search(err):
            return "multi-line"
        return "wrongly-ok" if case.expect == "refuse" else "accepted"
    if len(lines) != 1:
        return "multi-line"
    msg = lines[0]
    if case.names and not any(n.lower() in msg.lower() for n in case.names):
        return "unnamed"
    return "wrongly-no" if case.expect == "accept" else "refused"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=41)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--csv", default=None, help="write one row per case here")
    ap.add_argument("--only", default=None, help="run only these classes (comma-separated)")
    ap.add_argument("--label", default=None, help="run only the cases whose label contains this")
    ap.add_argument("--show", default=",".join(BAD), help="print the cases with these outcomes (comma-separated)")
    args = ap.parse_args(argv)
    only = None if args.only is None else args.only.split(",")
    cases = [c for c in all_cases(args.seed) if (only is None or c.cls in only)
             and (args.label is None or args.label in c.label)]
    print(f"{len(cases)} cases, {args.jobs} at a time", file=sys.stderr)
    t0 = time.perf_counter()
    results = []
    with ThreadPoolExecutor(args.jobs) as pool:
        for i, r in enumerate(pool.map(run_case, cases), 1):
            results.append(r)
            if i % 50 == 0:
                print(f"  {i}/{len(cases)} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    counts: dict[str, Counter] = defaultdict(Counter)
    for r in results:
        counts[r.case.cls][r.outcome] += 1
    shown = [o for o in OUTCOMES if any(c[o] for c in counts.values())]
    width = max(len(k) for k in counts) + 2
    print(f"{'class':{width}s}" + "".join(f"{o:>11s}" for o in shown) + f"{'total':>8s}")
    total = Counter()
    for k in sorted(counts):
        total.update(counts[k])
        print(f"{k:{width}s}" + "".join(f"{counts[k][o]:>11d}" for o in shown) + f"{sum(counts[k].values()):>8d}")
    print(f"{'all':{width}s}" + "".join(f"{total[o]:>11d}" for o in shown) + f"{sum(total.values()):>8d}")
    print(f"{len(results)} inputs in {time.perf_counter() - t0:.0f} s")
    show = set(args.show.split(",")) if args.show else set()
    for r in results:
        if r.outcome in show:
            print(f"\n[{r.outcome}] {r.case.cls} / {r.case.label}  (exit {r.rc}, {r.seconds:.1f} s)\n"
                  f"  argv: {' '.join(map(repr, r.case.argv))}\n  {r.message[-300:]!r}")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["class", "label", "outcome", "expect", "exit", "seconds", "argv", "message"])
            for r in results:
                w.writerow([r.case.cls, r.case.label, r.outcome, r.case.expect, r.rc, f"{r.seconds:.2f}",
                            " ".join(r.case.argv), r.message.replace("\n", " | ")[:300]])
    return 0


if __name__ == "__main__":
    sys.exit(main())
