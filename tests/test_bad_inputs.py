"""Bad-input fuzzing of the command line: every case is an input that must be refused, and
each one must end in one line ``dse.study: error: ...`` with a non-zero exit, never a
traceback, a hang or an exit 0. A test per kind of input; run as a script for the counts:

    python tests/test_bad_inputs.py [--show-all]

Cases are built by mutating shipped inputs (a study file, the h100-sxm preset, the
llama-2-7b and mixtral config.json, the command-line flags) with values of each bad kind:
wrong type, NaN, infinities, 1e400, zero and negative where not allowed, non-integers,
huge integers, unknown names, malformed or hostile YAML/JSON. Prints the count per
outcome and every case that did not end as expected.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import resource
import signal
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from dse.study.cli import main

ROOT = Path(__file__).resolve().parent.parent

BAD_NUMBERS = [0, -1, float("nan"), float("inf"), -float("inf"), "1e400", "abc", True, None, [], {}]
BAD_COUNTS = [1.5, 2**70, -(2**70)]      # for integer fields
BAD_FIGURES = [1e31, -1e31]              # for figures in SI units (beyond any machine)
#: values that are allowed for some keys (cpu_layers 0, seed 0, link latency 0, ...)
ZERO_OK = {"cpu_layers", "seed", "link_latency", "onchip_buffer_bytes", "host_memory_capacity", "latency_s"}
FLOAT_OK = {"memory_bandwidth", "memory_capacity", "peak_fp16", "compute_scale", "link_bandwidth",
            "vector_ops_per_s", "host_link_bandwidth", "link_latency", "onchip_buffer_bytes",
            "host_memory_capacity", "value"}
BOMB = "".join(f"{c}: &{c} [{', '.join([f'*{p}'] * 9) if p else ', '.join(['x'] * 9)}]\n"
               for p, c in zip([None, *"abcdefgh"], "abcdefghi"))


def bad_values(key: str) -> list:
    """Values that key must refuse (a count or, for ``FLOAT_OK`` keys, a figure)."""
    extra = BAD_FIGURES if key in FLOAT_OK else BAD_COUNTS
    return [v for v in BAD_NUMBERS + extra if not (v == 0 and key in ZERO_OK)]


def yaml_text(obj) -> str:
    text = yaml.safe_dump(obj, sort_keys=False)
    return text.replace("'1e400'", "1e400")


class Case:
    def __init__(self, kind: str, label: str, argv: list[str], expect_in: str = ""):
        self.kind, self.label, self.argv, self.expect_in = kind, label, argv, expect_in


def study_cases(tmp: Path) -> list[Case]:
    base = {"name": "fz", "space": {"hardware": "h100-sxm", "model": "llama-2-7b", "batch": [1, 8]},
            "objectives": {"output_tokens_per_s": "max"}}
    cases = []

    def add(label, obj=None, text=None, extra=()):
        f = tmp / f"study-{len(cases):04d}.yaml"
        f.write_bytes(text if isinstance(text, bytes) else (text if text is not None else yaml_text(obj)).encode())
        cases.append(Case("study", label, ["run", str(f), "--quiet", "--out", str(tmp / f"out-{len(cases):04d}"),
                                           *extra], expect_in=f.name))

    for key in ("memory_bandwidth", "memory_capacity", "peak_fp16", "compute_scale", "vector_ops_per_s",
                "batch", "prompt_len", "gen_len", "devices", "tp", "pp", "ep", "cpu_layers", "link_bandwidth",
                "link_latency", "host_link_bandwidth", "onchip_buffer_bytes"):
        for v in bad_values(key):
            s = copy.deepcopy(base)
            s["space"][key] = v
            add(f"space.{key}={v!r}", s)
        for rng in ({"min": 0, "max": 1, "scale": "log"}, {"min": 2, "max": 1, "count": 2},
                    {"min": 1, "max": 10, "count": 10**12}, {"min": 1, "max": 10, "step": 0},
                    {"min": 1, "max": 1e12, "step": 1e-6}, {"min": float("nan"), "max": 1, "count": 2},
                    {"min": 1}, {"min": 1, "max": 2, "foo": 1}, {"min": 1, "max": 2, "count": 0},
                    {"min": 1, "max": 2, "count": 2.5}, {"min": -5, "max": 2, "count": 3}):
            if rng.get("scale") == "log" and key in ZERO_OK - {"seed"}:
                pass
            s = copy.deepcopy(base)
            s["space"][key] = rng
            add(f"space.{key}={rng!r}", s)
    for key, vals in (("seed", [-1, 2**70, 1.5, "x", True]), ("samples", [0, -1, 1.5, "x", 2**70]),
                      ("trials", [0, -3, "x"]), ("chunk_size", [0, -1, "x", 1.5]),
                      ("max_points", [0, "x", -1]), ("population", [1, "x"]), ("ideal", ["yes", 1]),
                      ("method", ["gird", 3]), ("sampler", ["nsga9"]), ("name", ["/tmp/x-abs", "../../x", "a/b", "", 5]),
                      ("description", [{"a": 1}]), ("objectives", [{"hardware": "max"}, {"model": "min"},
                                                                   {"tpot_s": "up"}, {"nope": "max"}, ["tpot_s"]]),
                      ("constraints", [{"tpot_s": {"max": float("nan")}}, {"tpot_s": {"max": float("inf")}},
                                       {"tpot_s": 5}, {"tpot_s": {"min": 2, "max": 1}}, {"nope": {"max": 1}},
                                       {"tpot_s": {"max": "abc"}}, {"hardware": {"max": 1}}])):
        for v in vals:
            s = copy.deepcopy(base)
            s[key] = v
            if key in ("samples",):
                s["method"] = "random"
            if key in ("trials", "population", "sampler"):
                s["method"] = "optuna"
                s.setdefault("trials", 4)
            add(f"{key}={v!r}", s)
    for key, v in (("hardware", "nope"), ("model", "nope"), ("weights", "fp7"), ("kv", 16), ("offload", "weights=2"),
                   ("offload", "foo=0.5"), ("link", "nope"), ("host_tier", "nope"), ("host_cpu", "h100-sxm"),
                   ("native_formats", "fp99"), ("flash_attention", "yes"), ("nope", 1), ("hardware", ["h100-sxm", 3])):
        s = copy.deepcopy(base)
        s["space"][key] = v
        add(f"space.{key}={v!r}", s)
    for label, text in (("unclosed bracket", "space: [\n"), ("bad indent", "a: b: c\n"), ("alias bomb", BOMB + "space: {}\n"),
                        ("recursive alias", "space: &a {hardware: *a}\n"), ("empty file", ""), ("a list", "- 1\n"),
                        ("a scalar", "3\n"), ("tab indent", "space:\n\thardware: x\n"), ("python tag", "!!python/object:os.system {}\n"),
                        ("deep nesting", "[" * 5000 + "]" * 5000 + "\n")):
        add(label, text=text)
    add("non-UTF-8", text=b"name: \xff\xfe\n")
    add("binary", text=bytes(range(256)))
    return cases


def preset_cases(tmp: Path) -> list[Case]:
    base = yaml.safe_load((ROOT / "configs/hardware/h100-sxm.yaml").read_text())
    cases = []

    def add(label, obj=None, text=None):
        f = tmp / f"preset-{len(cases):04d}.yaml"
        f.write_bytes(text if isinstance(text, bytes) else (text if text is not None else yaml_text(obj)).encode())
        cases.append(Case("preset", label, ["analyze", "--model", "llama-2-7b", "--hardware", str(f)], f.name))

    paths = []

    def walk(node, path):
        if isinstance(node, dict):
            if "value" in node:
                paths.append(path)
            else:
                for k, v in node.items():
                    walk(v, [*path, k])
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, [*path, i])

    walk({k: v for k, v in base.items() if k != "sources"}, [])
    for path in paths:
        for v in bad_values("value"):
            if v == 0 and path[-1] in ZERO_OK:
                continue
            d = copy.deepcopy(base)
            node = d
            for k in path:
                node = node[k]
            node["value"] = v
            add(f"{'.'.join(map(str, path))}={v!r}", d)
    for key in ("name", "class", "peak_ops_per_s", "memory_tiers", "sources", "vector_ops_per_s"):
        d = copy.deepcopy(base)
        del d[key]
        add(f"without {key}", d)
    for key, v in (("class", "gpus"), ("bogus", 1), ("memory_tiers", []), ("peak_ops_per_s", {"fp99": 1}),
                   ("host_cpu", 5), ("sources", [])):
        d = copy.deepcopy(base)
        d[key] = v
        add(f"{key}={v!r}", d)
    d = copy.deepcopy(base)
    d["peak_ops_per_s"]["fp16"] = {"value": 1e15}
    add("value without source", d)
    add("alias bomb", text=BOMB)
    add("non-UTF-8", text=b"name: \xff\n")
    add("binary", text=bytes(range(256)) * 4)
    return cases


def model_cases(tmp: Path) -> list[Case]:
    cases = []
    for shipped in ("llama-2-7b", "mixtral-8x7b", "deepseek-v3"):
        base = json.loads((ROOT / f"configs/models/{shipped}.json").read_text())
        for key, val in base.items():
            if isinstance(val, bool) or not isinstance(val, int):
                continue
            for v in bad_values(key):
                if v == 0 and key in ("first_k_dense_replace", "n_shared_experts", "q_lora_rank", "bos_token_id",
                                      "eos_token_id", "pad_token_id", "initializer_range", "n_group", "topk_group"):
                    continue
                if key.endswith("token_id") or key in ("n_group", "topk_group", "rope_theta", "num_nextn_predict_layers",
                                                       "moe_layer_freq", "max_position_embeddings",
                                                       "original_max_position_embeddings", "sliding_window",
                                                       "routed_scaling_factor", "pretraining_tp", "ep_size"):
                    continue      # fields the model does not read
                if v is None and key in ("num_key_value_heads", "first_k_dense_replace", "kv_lora_rank",
                                         "n_shared_experts", "q_lora_rank"):
                    continue      # null: the Hugging Face default (as many KV heads as heads, none)
                cfg = dict(base)
                cfg[key] = v
                f = tmp / f"model-{len(cases):04d}" / "config.json"
                f.parent.mkdir()
                text = json.dumps(cfg, allow_nan=True).replace('"1e400"', "1e400")
                f.write_text(text)
                cases.append(Case("model", f"{shipped}.{key}={v!r}",
                                  ["analyze", "--model", str(f), "--hardware", "b200", "--devices", "8",
                                   "--weights", "fp8"], f"{f.parent.name}/config.json"))
    for label, text in (("not JSON", "{"), ("a list", "[1]"), ("empty", ""), ("non-UTF-8", b"\xff{}")):
        f = tmp / f"model-{len(cases):04d}.json"
        f.write_bytes(text if isinstance(text, bytes) else text.encode())
        cases.append(Case("model", label, ["analyze", "--model", str(f), "--hardware", "h100-sxm"], f.name))
    return cases


def flag_cases(tmp: Path) -> list[Case]:
    cases = []
    base = ["analyze", "--model", "llama-2-7b", "--hardware", "h100-sxm"]
    for flag in ("--batch", "--prompt-len", "--gen-len", "--devices", "--tp", "--pp", "--ep", "--cpu-layers"):
        for v in ("0" if flag != "--cpu-layers" else "-1", "-1", "1.5", "abc", "1e400", "nan", "", "9" * 30):
            cases.append(Case("flags", f"{flag} {v!r}", [*base, flag, v]))
    for flag, v in (("--weights", "fp7"), ("--kv", ""), ("--offload", "weights=2"), ("--offload", "x"),
                    ("--link", "nope"), ("--host-tier", "nope"), ("--host-cpu", "h100-sxm"), ("--model", "nope"),
                    ("--hardware", "nope"), ("--hardware", "/proc/self/mem"), ("--model", "/proc/self/mem"),
                    ("--model", "/nonexistent/config.json")):
        argv = list(base)
        argv[argv.index(flag) + 1] if flag in argv else None
        if flag in argv:
            argv[argv.index(flag) + 1] = v
        else:
            argv += [flag, v]
        cases.append(Case("flags", f"{flag} {v!r}", argv))
    cases.append(Case("flags", "mistyped --promt-len", [*base, "--promt-len", "8"], "--prompt-len"))
    cases.append(Case("flags", "mistyped --hardwre", ["analyze", "--model", "llama-2-7b", "--hardwre", "h100-sxm"],
                      "--hardware"))
    run = ["run", "gpu-sweep", "--quiet"]
    (tmp / "a-file").write_text("x")
    for extra in (["--seed", "-1"], ["--seed", str(10**23)], ["--seed", "abc"], ["--trials", "0"], ["--workers", "0"],
                  ["--out", "/proc/dse-out"], ["--out", str(tmp / "a-file")], ["--out", "/dev/null/x"],
                  ["--out", str(tmp / "a-file" / "sub")], ["--storage", "sqlite:///:memory:"],
                  ["--storage", "nope"], ["--storage", "foo://x"]):
        cases.append(Case("flags", " ".join(extra), [*run, *extra]))
    cases.append(Case("flags", "compare --plot /proc/x.png",
                      ["compare", "--model", "llama-2-7b", "--hardware", "h100-sxm", "--plot", "/proc/x.png"]))
    return cases


class Hang(Exception):
    pass


def run_case(case: Case, timeout: int = 30) -> tuple[str, str]:
    """(outcome, detail): refused | traceback | accepted | hang | unclear."""
    err, out = io.StringIO(), io.StringIO()

    def alarm(*_):
        raise Hang()

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(timeout)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            rc = main(case.argv)
    except Hang:
        return "hang", f"over {timeout} s"
    except MemoryError:
        return "hang", "out of memory"
    except BaseException as e:  # noqa: BLE001 - everything that escapes main is a failure
        return "traceback", f"{type(e).__name__}: {str(e)[:200]}"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    lines = [line for line in err.getvalue().splitlines() if line.strip()]
    if rc in (0, 3):          # 3: evaluated, and found not to fit
        return "accepted", (" | ".join(lines) or out.getvalue()[-200:].replace("\n", " | "))[:300]
    if len(lines) != 1 or not lines[0].startswith("dse.study: error:"):
        return "unclear", " | ".join(lines)[:300]
    if case.expect_in and case.expect_in not in lines[0]:
        return "unclear", lines[0]
    return "refused", lines[0]


KINDS = {"study": study_cases, "preset": preset_cases, "model": model_cases, "flags": flag_cases}


@pytest.mark.parametrize("kind", KINDS)
def test_every_bad_input_is_refused_in_one_line(kind, tmp_path):
    cases = KINDS[kind](tmp_path)
    assert len(cases) > 30
    failed = [f"{outcome} {c.label}: {detail}" for c in cases for outcome, detail in [run_case(c)]
              if outcome != "refused"]
    assert not failed, f"{len(failed)} of {len(cases)} bad inputs not refused:\n" + "\n".join(failed[:20])


def test_the_inputs_mutated_are_accepted_as_shipped(tmp_path):
    """The fuzz means something only if the unmutated inputs pass: the base study, preset and configs."""
    study = tmp_path / "base.yaml"
    study.write_text(yaml_text({"name": "fz", "space": {"hardware": "h100-sxm", "model": "llama-2-7b", "batch": [1, 8]},
                                "objectives": {"output_tokens_per_s": "max"}}))
    preset = tmp_path / "preset.yaml"
    preset.write_text((ROOT / "configs/hardware/h100-sxm.yaml").read_text())
    for argv in (["run", str(study), "--quiet", "--out", str(tmp_path / "out")],
                 ["analyze", "--model", "llama-2-7b", "--hardware", str(preset)],
                 *(["analyze", "--model", str(ROOT / f"configs/models/{m}.json"), "--hardware", "b200", "--devices", "8",
                    "--weights", "fp8"] for m in ("llama-2-7b", "mixtral-8x7b", "deepseek-v3"))):
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            assert main(argv) == 0, argv


def main_fuzz(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--show-all", action="store_true", help="print every case, not only the failures")
    args = ap.parse_args(argv)
    resource.setrlimit(resource.RLIMIT_AS, (8 * 2**30, resource.RLIM_INFINITY))
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        cases = study_cases(tmp) + preset_cases(tmp) + model_cases(tmp) + flag_cases(tmp)
        counts: dict[str, int] = {}
        t0 = time.perf_counter()
        for c in cases:
            outcome, detail = run_case(c)
            counts[outcome] = counts.get(outcome, 0) + 1
            if args.show_all or outcome != "refused":
                print(f"{outcome:9s} [{c.kind}] {c.label}: {detail}")
    print(f"\n{len(cases)} bad inputs in {time.perf_counter() - t0:.0f} s: "
          + ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])))
    return 0 if counts.get("refused", 0) == len(cases) else 1


if __name__ == "__main__":
    sys.exit(main_fuzz())
