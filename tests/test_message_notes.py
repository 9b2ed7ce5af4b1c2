"""A note on an all-reduce value at its fit's bound speaks only where the point sends messages:
a point of one device a replica (TP, PP, EP, CP 1, not disaggregated) runs no collective, so
``analyze`` shows neither the note nor its band warning there; a TP 2 point keeps both."""
import pytest

from dse.core.efficiency import load_calibration
from dse.core.engines import without_message_notes
from dse.system.analysis import analyze_point

NOTE = "collective_latency_s of allreduce.one-shot at its lower bound 1e-08"


def test_only_the_all_reduce_notes_are_dropped():
    name = f"prior gpu + calibrated engine vllm ({NOTE}; step_overhead_s of engines.vllm at its upper bound 1)"
    assert without_message_notes(name) == ("prior gpu + calibrated engine vllm "
                                           "(step_overhead_s of engines.vllm at its upper bound 1)")
    assert without_message_notes(f"prior gpu + calibrated engine vllm ({NOTE})") == "prior gpu + calibrated engine vllm"
    assert without_message_notes("ideal") == "ideal"


@pytest.mark.skipif(not any(k.startswith("allreduce.") for k in (load_calibration().get("at_bound") or {})),
                    reason="the shipped calibration has no all-reduce value at its bound")
def test_a_one_device_point_shows_no_all_reduce_note_a_tp2_point_does():
    base = {"model": "llama-3.1-8b", "hardware": "h100-sxm", "engine": "vllm"}
    one, _ = analyze_point({**base, "tp": 1})
    two, _ = analyze_point({**base, "tp": 2})
    assert "allreduce" not in one.summary["efficiency"] and "WARNING" not in one.summary["band"]
    assert "allreduce" in two.summary["efficiency"] and "WARNING" in two.summary["band"]
