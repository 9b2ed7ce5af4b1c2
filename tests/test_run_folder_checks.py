"""A study whose space holds a value only the evaluator can check (an unknown engine, a choice not
declared, a pool's hardware that is no preset, a length distribution it cannot read) is refused before
its run folder is written: one line naming the study file and the key, exit 2, nothing on disk, so
the file fixed runs into the same folder without --overwrite."""
from __future__ import annotations

import pytest
import yaml

from dse.study.cli import main

BASE = {"hardware": ["h100-sxm", "a100-80gb"], "model": "llama-3.1-8b", "batch": [1, 8]}

#: (key, the listed values with one bad, its fix, extra space keys it needs, words of the error)
CASES = [
    ("engine", ["vllm", "nope"], ["vllm", "sglang"], {}, "unknown engine 'nope'"),
    ("kernel_layer", ["fitted", "abc"], ["fitted", "learned"], {}, "expected one of fitted, learned"),
    ("router", ["round-robin", "abc"], ["round-robin"], {"serving": "continuous"}, "router: expected one of"),
    ("decode_hardware", ["same", "nope"], ["same", "h200"],
     {"serving": "continuous", "disaggregate": "1:1"}, "unknown hardware 'nope'"),
    ("lengths", ["fixed", "zzz"], ["fixed", "lognormal"], {"serving": "continuous"}, "lengths: expected"),
    ("pue", [1.2, 0.5], [1.2, 1.5], {}, "at least 1"),
]


def _study(path, key, values, extra):
    path.write_text(yaml.safe_dump({"name": "probe", "space": {**BASE, **extra, key: values},
                                    "objectives": {"output_tokens_per_s": "max"}}))


@pytest.mark.parametrize("key,bad,fixed,extra,words", CASES, ids=[c[0] for c in CASES])
def test_a_bad_value_leaves_no_run_folder(tmp_path, capsys, key, bad, fixed, extra, words):
    study, out = tmp_path / "s.yaml", tmp_path / "out"
    _study(study, key, bad, extra)
    assert main(["run", str(study), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(study) in err[0] and key in err[0] and words in err[0], err
    assert not out.exists()
    _study(study, key, fixed, extra)           # the file fixed: the same folder, no --overwrite
    assert main(["run", str(study), "--out", str(out), "--quiet"]) == 0
    assert (out / "results.parquet").exists()
