"""Every file the tool opens is read one bounded, typed way (``basis.files.read_input``): regular
files only (a device, a symlink to one, a FIFO or a folder refused before anything is read, so
nothing hangs or fills memory), a size limit per kind, duplicate YAML keys refused, calibration
files checked key by key (sections, groups, numbers, ranges, bands), and every refusal one line
that names the file and the key and never quotes the file's content (a marker written into each
refused file must not appear in the message)."""
import json
import os
import shutil
import signal
from pathlib import Path

import pytest
import yaml

import basis.files as F
from basis.errors import DseError, first_unknown, kind_of, name_or_kind
from basis.files import read_csv, read_input
from basis.yamlfile import load_yaml
from dse.core.efficiency import load_calibration
from dse.fit.validate import read_table
from dse.study.studyfile import load_study
from hwmodels.presets import HARDWARE_DIR, _link, load_device, load_device_file, load_named_table
from tests.conftest import FIXED_CALIBRATION, run_cli
from workloads.lengths import parse_lengths
from workloads.model import MODELS_DIR, load_model

#: written into every refused file: no message may show it
MARKER = "SECRET-MARKER-41"


@pytest.fixture(autouse=True)
def _no_hang():
    """Fail (rather than hang the suite) should a read ever block, e.g. on a FIFO with no writer."""
    def fail(*_):
        raise TimeoutError("a file read blocked")
    old = signal.signal(signal.SIGALRM, fail)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def refused(call, *where: str) -> str:
    """The message of the DseError ``call()`` raises, checked: one line, naming each of ``where``,
    never the marker."""
    with pytest.raises(DseError) as e:
        call()
    text = str(e.value)
    assert "\n" not in text and MARKER not in text, text
    for w in where:
        assert w in text, (w, text)
    return text


@pytest.fixture
def special(tmp_path):
    """{kind: path} of files that are not regular: /dev/zero, a symlink to it, a FIFO with no
    writer, a folder; each with a suffix that each loader accepts as a path."""
    def make(suffix: str) -> dict[str, Path]:
        link = tmp_path / f"zero{suffix}"
        link.symlink_to("/dev/zero")
        fifo = tmp_path / f"fifo{suffix}"
        os.mkfifo(fifo)
        folder = tmp_path / f"folder{suffix}"
        folder.mkdir()
        return {"device": Path("/dev/zero"), "symlink": link, "fifo": fifo, "folder": folder}
    return make


# ------------------------------------------------------------------ the reading layer

@pytest.mark.parametrize("kind", ["device", "symlink", "fifo", "folder"])
def test_only_regular_files_are_read(special, kind):
    path = special(".yaml")[kind]
    words = {"device": "a device", "symlink": "a device", "fifo": "a FIFO", "folder": "a folder"}[kind]
    refused(lambda: read_input(path, "hardware preset"), str(path), "hardware preset", words, "not a regular file")


def test_a_file_beyond_its_kinds_limit_is_refused_by_its_size(tmp_path):
    p = tmp_path / "big.csv"
    p.write_text("prompt_len,gen_len\n" + f"1,{MARKER}\n" * 100)
    assert read_input(p, "trace", limit=p.stat().st_size) == p.read_bytes()
    refused(lambda: read_input(p, "length trace", limit=1000), "big.csv", "at most 1000 bytes")
    refused(lambda: read_csv(p, "length trace", limit=1000), "big.csv", "a length trace is at most 1000 bytes")


def test_the_limits_are_generous_for_each_kind():
    # a 64 MiB trace holds millions of rows; the largest shipped YAML file is far below its limit
    assert F.MAX_CSV_BYTES == 64 * 2**20
    biggest = max(p.stat().st_size for p in Path(HARDWARE_DIR).parent.rglob("*.yaml"))
    assert biggest * 20 < F.MAX_TEXT_BYTES


@pytest.mark.parametrize("body, problem", [
    (f"a,b\n1,2\n3,\"{MARKER}" + "x" * F.MAX_CSV_FIELD + "\"\n", "line 3"),  # a field past the csv limit
    (f"a,a\n1,{MARKER}\n", "column 'a' appears twice"),
    ("", "is empty"),
])
def test_a_malformed_csv_is_one_line_naming_file_and_line(tmp_path, body, problem):
    p = tmp_path / "m.csv"
    p.write_text(body)
    refused(lambda: list(read_csv(p, "measured-results CSV")[1]), "m.csv", problem)


def test_a_non_utf8_csv_names_the_byte(tmp_path):
    p = tmp_path / "t.csv"
    p.write_bytes(b"prompt_len,gen_len\n1,2\n\xff\xfe" + MARKER.encode())
    refused(lambda: read_csv(p, "length trace"), "t.csv", "must be UTF-8", "byte 23")


# ------------------------------------------------------------------ duplicate YAML keys

def test_a_key_given_twice_is_refused_at_any_depth(tmp_path):
    p = tmp_path / "d.yaml"
    p.write_text(f"a: 1\nb:\n  c: {MARKER}\n  c: 2\n")
    refused(lambda: load_yaml(p, "study file"), "d.yaml", "the key 'c' appears twice", "line 4")
    p.write_text("a: 1\na: 1\n")                      # the same value twice is still refused
    refused(lambda: load_yaml(p, "study file"), "key 'a' appears twice")
    p.write_text("1: x\n1.0: y\n")                    # YAML keys equal as values collide too
    refused(lambda: load_yaml(p, "study file"), "appears twice")


def test_merge_keys_may_be_overridden(tmp_path):
    p = tmp_path / "m.yaml"
    p.write_text("base: &b {a: 1, b: 2}\nx:\n  <<: *b\n  a: 5\n")
    assert load_yaml(p, "study file")["x"] == {"a": 5, "b": 2}


def test_a_hardware_preset_with_a_duplicate_key_is_refused(tmp_path):
    p = tmp_path / "hw.yaml"
    p.write_text((Path(HARDWARE_DIR) / "h100-sxm.yaml").read_text() + f"notes: {MARKER}\nnotes: again\n")
    refused(lambda: load_device_file(p), "hw.yaml", "'notes' appears twice")


def test_a_study_with_a_duplicate_key_is_refused(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text(f"name: s\ndescription: {MARKER}\nspace: {{hardware: h100-sxm, model: llama-3.1-8b}}\n"
                 "space: {hardware: a100-80gb}\n")
    refused(lambda: load_study(str(p)), "s.yaml", "'space' appears twice")


# ------------------------------------------------------------------ every loader through the layer

@pytest.mark.parametrize("kind", ["device", "symlink", "fifo"])
def test_every_loader_refuses_a_special_file(special, kind):
    yml, csv, js = special(".yaml")[kind], special(".csv")[kind], special(".json")[kind]
    regular = "not a regular file"
    refused(lambda: load_device_file(yml), str(yml), "hardware preset", regular)
    refused(lambda: load_study(str(yml)), str(yml), "study file", regular)
    if kind != "device":                                    # /dev/zero itself is not a .csv name
        refused(lambda: parse_lengths(str(csv)), str(csv), "length trace", regular)
    refused(lambda: read_table(csv), str(csv), "measured-results CSV", regular)
    refused(lambda: load_calibration(str(yml)), str(yml), "calibration file", regular)
    refused(lambda: load_model(str(js)), str(js), "model config", regular)


def test_a_path_with_a_newline_stays_one_line(tmp_path):
    p = tmp_path / "a\nb.yaml"
    os.mkfifo(p)
    refused(lambda: load_yaml(p, "hardware preset"), "a\\nb.yaml", "a FIFO")


# ------------------------------------------------------------------ calibration files

GOOD = {"families": {"gpu": {"compute": {"value": 0.6}, "memory": {"value": 0.8}}}}


def _cal(tmp_path, text: str) -> Path:
    p = tmp_path / "cal.yaml"
    p.write_text(text)
    load_calibration.cache_clear()
    return p


@pytest.mark.parametrize("text, where", [
    ("", "the calibration file is empty"),
    (f"# {MARKER}\n", "the calibration file is empty"),
    (f"- {MARKER}\n", "not a mapping"),
    ("families: {}\n", "families: expected the fitted parameters of at least one hardware family"),
    ("families:\n  gpu: {compute: 0.6}\nengines:\n  nosuch-engine: {step_overhead_s: {value: 0.001}}\n",
     "engines.nosuch-engine: unknown engine; known:"),
    ("families:\n  gpu: {compute: 0.6}\nengine: {vllm: {}}\n", "engine: unknown section"),
    ("families:\n  gpu: {compute: 0.6}\nlaunch:\n  warp: {op_overhead_s: 1.0e-6}\n", "launch.warp: unknown launch class"),
    ("families:\n  quantum: {compute: 0.6}\n", "families.quantum: unknown hardware family"),
    (f"families:\n  gpu: {{compute: {{value: {MARKER}}}}}\n", "families.gpu.compute: expected a finite number"),
    ("families:\n  gpu: {compute: {value: 1e-300}}\n", "families.gpu.compute: must be from 0.001 to 1, got 1e-300"),
    ("families:\n  gpu: {compute: {value: 1.0e-300}}\n", "families.gpu.compute: must be from 0.001 to 1"),
    ("families:\n  gpu: {memory: {value: .nan}}\n", "families.gpu.memory: expected a finite number"),
    ("families:\n  gpu: {memory: {value: 1.5}}\n", "families.gpu.memory: must be from 0.001 to 1, got 1.5"),
    ("families:\n  gpu: {compute: 0.6}\nlaunch:\n  eager: {op_overhead_s: {value: -1.0e-6}}\n",
     "launch.eager.op_overhead_s: must be from 0 to 1"),
    ("families:\n  gpu: {compute: 0.6}\nengines:\n  vllm: {compute_scale: {value: 1.0e+9}}\n",
     "engines.vllm.compute_scale: must be from 0.01 to 100"),
    (f"families:\n  gpu: {{compute: {{value: 0.6, sauce: {MARKER}}}}}\n", "families.gpu.compute: expected {value"),
    (f"families:\n  gpu: {{compute: 0.6}}\nfitted: {MARKER}\n", "fitted: expected a mapping"),
    ("families:\n  gpu: {compute: 0.6}\nbands:\n  all: {n: 5, low: abc, high: 2}\n",
     "bands.all.low: expected a finite number"),
    ("families:\n  gpu: {compute: 0.6}\nbands:\n  all: {n: 5, low: 1.5, high: 0.5}\n",
     "bands.all: low (1.5) exceeds high (0.5)"),
    ("families:\n  gpu: {compute: 0.6}\nbands:\n  all: {n: 0, low: 0.5, high: 1.5}\n", "bands.all.n: expected a whole number"),
    ("families:\n  gpu: {compute: 0.6}\nbands:\n  all: {n: 5, low: 0.5}\n", "bands.all: expected {n: ROWS"),
    ("families:\n  gpu: {compute: 0.6}\nfamilies:\n  gpu: {compute: 0.7}\n", "the key 'families' appears twice"),
])
def test_a_calibration_file_is_refused_naming_the_key(tmp_path, text, where):
    p = _cal(tmp_path, text)
    refused(lambda: load_calibration(str(p)), "cal.yaml", where)


def test_well_formed_calibration_files_are_read(tmp_path):
    load_calibration.cache_clear()
    shipped = load_calibration()         # the engine layer alone: the family fractions kept at their priors
    assert shipped["families"] == {} and shipped["engines"] and set(shipped["engine_families"]) <= set(shipped["engines"])
    assert load_calibration(str(FIXED_CALIBRATION))["families"]  # written before families (classes)
    p = _cal(tmp_path, yaml.safe_dump({**GOOD, "bands": {"all": {"n": 9, "low": 0.7, "high": 1.6}},
                                       "engines": {"vllm": {"step_overhead_s": {"value": 1e-3, "note": "x"}}}}))
    assert load_calibration(str(p))["bands"]["all"]["high"] == 1.6
    # a fit that kept every family's prior says so: no family fitted, and why
    p = _cal(tmp_path, "families: {}\npriors_kept: {gpu: fewer than 5 predictable rows}\n")
    assert load_calibration(str(p))["families"] == {}
    p = _cal(tmp_path, "families:\n  gpu: {compute: {value: 1e-3}}\n")     # the floor itself, as YAML text
    assert load_calibration(str(p))["families"]["gpu"]["compute"]["value"] == "1e-3"


# ------------------------------------------------------------------ no content echoed

def test_a_file_that_is_not_a_preset_is_named_not_quoted(tmp_path):
    p = tmp_path / "system.yaml"
    # a system file of 'key: value' lines: the first unknown key is named, no other line is shown
    p.write_text("kernel: 6.1\n" + "".join(f"{MARKER}-{i}: value {MARKER}\n" for i in range(49)))
    refused(lambda: load_device_file(p), "system.yaml: unknown key(s) kernel (and 49 more)")
    for body in (f"{MARKER} line one\n{MARKER} line two\n", f"- {MARKER}\n"):
        p.write_text(body)
        refused(lambda: load_device_file(p), "system.yaml", "not one")
    refused(lambda: load_study(str(p)), "system.yaml", "this file is not one")


def test_a_study_names_its_first_unknown_key_only(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text("space: {hardware: h100-sxm}\nextra: 1\n" + "".join(f"{MARKER}{i}: 1\n" for i in range(29)))
    refused(lambda: load_study(str(p)), "s.yaml: unknown key(s) extra (and 29 more); allowed:")
    p.write_text(f"space: {{hardware: h100-sxm}}\nobjectives: {MARKER}\n")
    refused(lambda: load_study(str(p)), "s.yaml", "objectives: expected a mapping, got text")
    p.write_text(f"space: {{hardware: h100-sxm}}\nideal: {MARKER}\n")
    refused(lambda: load_study(str(p)), "s.yaml", "ideal: expected true or false, got text")


def test_a_trace_cell_is_described_not_quoted(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text(f"prompt_len,gen_len\n10,{MARKER}\n")
    refused(lambda: parse_lengths(str(p)), "t.csv", "line 2: gen_len", "text that is not a number")


def test_kind_of_never_quotes_text():
    assert [kind_of(v) for v in (None, True, "", MARKER, "1e-300", [1], {"a": 1}, 2.5)] == \
        ["nothing", "true", "empty text", "text", "text", "a list", "a mapping", "2.5"]
    assert first_unknown([MARKER * 10, "b"], {"b"}) == (MARKER * 10)[:39] + "…"
    assert first_unknown(["a", "b"], {"a", "b"}) is None
    assert name_or_kind("quantum") == "'quantum'" and name_or_kind(f"{MARKER} and a line of text") == "text"


# ------------------------------------------------------------------ through the command line

def _one_line_refusal(r, *where: str) -> None:
    assert r.returncode not in (0, None), r.stdout[-500:]
    err = r.stderr.strip()
    assert "Traceback" not in r.stderr and len(err.splitlines()) == 1, err[-2000:]
    assert MARKER not in r.stdout + r.stderr
    for w in where:
        assert w in err, (w, err)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("inputs")
    (d / "zero.yaml").symlink_to("/dev/zero")
    (d / "zero.csv").symlink_to("/dev/zero")
    os.mkfifo(d / "fifo.yaml")
    (d / "dup-hw.yaml").write_text((Path(HARDWARE_DIR) / "h100-sxm.yaml").read_text()
                                   + f"notes: {MARKER}\nnotes: again\n")
    (d / "dup-study.yaml").write_text(f"name: dup\ndescription: {MARKER}\nspace: {{hardware: h100-sxm, model: "
                                      "llama-3.1-8b}\nspace: {hardware: a100-80gb}\n")
    shutil.copy(Path(HARDWARE_DIR) / "h100-sxm.yaml", d / "fine.yaml")
    return d


ANALYZE = ("analyze", "--model", "llama-3.1-8b")


@pytest.mark.parametrize("args, where", [
    (ANALYZE + ("--hardware", "/dev/zero"), "/dev/zero: cannot read the hardware preset: it is a device"),
    (ANALYZE + ("--hardware", "{d}/zero.yaml"), "zero.yaml: cannot read the hardware preset: it is a device"),
    (ANALYZE + ("--hardware", "{d}/fifo.yaml"), "fifo.yaml: cannot read the hardware preset: it is a FIFO"),
    (ANALYZE + ("--hardware", "h100-sxm", "--lengths", "{d}/zero.csv"), "zero.csv: cannot read the length trace"),
    (("validate", "--measured", "/dev/zero"), "/dev/zero: cannot read the measured-results CSV"),
    (ANALYZE + ("--hardware", "{d}/dup-hw.yaml"), "dup-hw.yaml: not valid YAML for a hardware preset: the key 'notes'"),
    (("run", "{d}/dup-study.yaml", "--out", "{d}/out"), "dup-study.yaml: not valid YAML for a study file: the key 'space'"),
])
def test_the_cli_refuses_in_one_line(files, args, where):
    r = run_cli(*(a.format(d=files) for a in args), timeout=60)
    _one_line_refusal(r, where)


def test_the_cli_refuses_a_calibration_that_is_not_a_file(files, monkeypatch):
    monkeypatch.setenv("DSE_CALIBRATION", "/dev/null")
    r = run_cli(*ANALYZE, "--hardware", "h100-sxm", timeout=60)
    _one_line_refusal(r, "/dev/null: cannot read the calibration file: it is a device")


def test_a_model_config_value_is_described_not_quoted(tmp_path):
    cfg = json.loads((MODELS_DIR / "llama-3.1-8b.json").read_text())
    p = tmp_path / "config.json"
    p.write_text(json.dumps({**cfg, "hidden_size": MARKER}))
    refused(lambda: load_model(str(p)), "config.json", "hidden_size: got a string of 16 characters")
    p.write_text(json.dumps({**cfg, "hidden_size": [MARKER]}))
    refused(lambda: load_model(str(p)), "hidden_size: got a list of 1 item;")


def test_names_the_system_cannot_look_up_are_refused_in_one_line(tmp_path):
    """Fuzzing found 'File name too long' tracebacks from a preset, study or measured cell name."""
    for load in (load_device, load_study, load_model):
        for name in ("h" * 5000, "a\x00b"):
            text = refused(lambda: load(name))
            assert len(text) < 1000, text[:200]
    p = tmp_path / "m.csv"
    long = "Q" * 5000
    p.write_text("id,model_slug,hardware_slug,devices,batch,prompt_len,gen_len,weights,activations,kv,metric,value\n"
                 + "".join(f"{i}," + ",".join([long] * 11) + "\n" for i in range(3)))
    text = refused(lambda: read_table(p), "m.csv", "3 bad row(s) and none to validate")
    assert "Q" * 80 not in text and len(text) < 5000


def test_a_table_of_links_or_tiers_is_checked_entry_by_entry(tmp_path):
    p = tmp_path / "links.yaml"
    for body, where in ((f"links: {MARKER}\n", "links: expected a mapping of names to entries, got text"),
                        (f"links:\n  nv: {MARKER}\n", "links.nv: expected a mapping, got text")):
        p.write_text(body)
        refused(lambda: load_named_table(p, "links", _link), "links.yaml", where)


def test_a_model_config_edited_between_calls_is_read_again(tmp_path):
    """A config.json is read once while it is unchanged (``model._spec_of``), and again once it is
    edited: the spec follows the file."""
    cfg = json.loads((MODELS_DIR / "llama-3.1-8b.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    first = load_model(str(path))
    assert load_model(str(path)) is first                       # read once
    cfg["num_hidden_layers"] = 16
    path.write_text(json.dumps(cfg, indent=1))
    assert load_model(str(path)).num_layers == 16 != first.num_layers
    path.unlink()
    with pytest.raises(DseError, match="not found"):
        load_model(str(path))
