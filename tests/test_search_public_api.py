"""dse uses Optuna through its public API only: no private Optuna module (``optuna.x._y``)
and none of Optuna's private attributes or helpers, anywhere in dse/ (an Optuna minor
release may change them); and an objective with no value (NaN) is said, never a front
silently empty."""
import re
from pathlib import Path

import numpy as np
import pandas as pd

from dse.explore import search as search_mod
from dse.explore import sweep as sweep_mod
from dse.explore.space import DesignSpace
from dse.explore.spec import SweepSpec
from dse.explore.study import run_study
from dse.present.report import write_report

ROOT = Path(__file__).resolve().parents[1]
PRIVATE_MODULE = re.compile(r"\boptuna(\.\w+)*\._\w+")
# Optuna objects' private attributes and private helpers that dse once reached for
PRIVATE_NAMES = re.compile(r"\._(storage|study_id|trial_id|backend|replay_result|thread_lock|sync_with_backend|"
                           r"log_number_offset|cached_frozen_trial|worker_id_prefix|file_path)\b|"
                           r"\b(JournalOperation|JournalStorageReplayResult|get_lock_file|is_heartbeat_enabled|"
                           r"_create_scoped_session|_set_trial_attr_without_commit)\b")


def test_dse_uses_no_private_optuna_api():
    found = []
    for path in sorted((ROOT / "dse").rglob("*.py")):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if PRIVATE_MODULE.search(code) or PRIVATE_NAMES.search(code):
                found.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not found, "private Optuna API used:\n" + "\n".join(found)


SPACE = dict(hardware=["h100-sxm", "b200"], model="llama-2-7b", batch=[1, 8, 64], flash_attention=True)
OBJECTIVES = {"output_tokens_per_s": "max", "memory_bytes": "min"}


def _no_throughput(evaluate, share):
    """``evaluate`` with ``output_tokens_per_s`` NaN in the first ``share`` of its rows."""
    def wrapped(*a, **k):
        out = evaluate(*a, **k)
        df = out[0] if isinstance(out, tuple) else out
        df.loc[df.index[:int(round(len(df) * share))], "output_tokens_per_s"] = np.nan
        return out
    return wrapped


def test_an_optuna_study_says_why_its_front_is_empty(tmp_path, monkeypatch, capfd):
    monkeypatch.setattr(search_mod, "evaluate_columns", _no_throughput(search_mod.evaluate_columns, 1.0))
    spec = SweepSpec(DesignSpace(dict(SPACE)), method="optuna", sampler="random", trials=12, population=6, seed=0,
                     objectives=dict(OBJECTIVES))
    front = run_study(spec, tmp_path / "run", quiet=False)
    rows = pd.read_parquet(tmp_path / "run" / "results.parquet")
    n = int(rows["feasible"].sum())
    assert len(front) == 0 and n > 0
    note = front.attrs["front_note"]
    assert f"objective output_tokens_per_s for {n} of {n} feasible designs" in note and "front is empty" in note
    assert f"dse.study: {note}" in capfd.readouterr().err


def test_a_sweep_says_why_its_front_is_smaller(tmp_path, monkeypatch, capfd):
    monkeypatch.setattr(sweep_mod, "evaluate_chunk", _no_throughput(sweep_mod.evaluate_chunk, 0.5))
    spec = SweepSpec(DesignSpace(dict(SPACE)), objectives=dict(OBJECTIVES))
    front = run_study(spec, tmp_path / "run", quiet=False)
    rows = pd.read_parquet(tmp_path / "run" / "results.parquet")
    missing = int((rows["feasible"] & rows["output_tokens_per_s"].isna()).sum())
    assert len(front) > 0 and missing > 0
    note = front.attrs["front_note"]
    assert f"output_tokens_per_s for {missing} of {int(rows['feasible'].sum())} feasible" in note
    assert "empty" not in note and note in capfd.readouterr().err
    again = run_study(spec, tmp_path / "run", quiet=True)        # a complete sweep, resumed: the same note
    assert again.attrs["front_note"] == note


def test_no_note_without_nan(tmp_path):
    spec = SweepSpec(DesignSpace(dict(SPACE)), objectives=dict(OBJECTIVES))
    assert run_study(spec, tmp_path / "run").attrs["front_note"] is None


def test_the_report_says_why_the_front_is_smaller(tmp_path, monkeypatch):
    # summary.md carries the same line as the run (counted again from the stored rows)
    monkeypatch.setattr(sweep_mod, "evaluate_chunk", _no_throughput(sweep_mod.evaluate_chunk, 0.5))
    spec = SweepSpec(DesignSpace(dict(SPACE)), objectives=dict(OBJECTIVES))
    front = run_study(spec, tmp_path / "run")
    write_report(tmp_path / "run", {"name": "nan-front"}, spec)
    assert front.attrs["front_note"] in (tmp_path / "run" / "summary.md").read_text()
