"""What a run's record lacks of the script's end (`run_record.lost_at_the_end`): only what a full
run directory took, never a trace that stopped for another reason (found in review: every run whose
trace stopped, a batch of nested tensors among them, had exited 4)."""

from __future__ import annotations

from pathlib import Path

from cascade_repro.run_record import lost_at_the_end
from cascade_repro.supervisor import ChildExit


def test_only_a_trace_a_full_disk_stopped_makes_the_record_incomplete(tmp_path: Path) -> None:
    ended = ChildExit(exit_code=0, signal_received=None, killed_by_signal=None)
    other = {"ended_at": 1.0, "trace": {"stopped": {"step": 3, "error": "RuntimeError: nested"}}}
    assert lost_at_the_end(ended, other, tmp_path, None) == []
    stopped = {"step": 3, "error": "OSError: [Errno 28]", "full_disk": True}
    full = {"ended_at": 1.0, "trace": {"stopped": stopped}}
    (said,) = lost_at_the_end(ended, full, tmp_path, None)
    assert said.startswith("the step trace stopped at step 3 (OSError: [Errno 28]): the run directory's disk")
    hostile = {"ended_at": 1.0, "trace": {"stopped": {"step": 3, "full_disk": "yes"}}}
    assert lost_at_the_end(ended, hostile, tmp_path, None) == []


def test_exit_facts_never_written_count_only_with_a_sign_of_a_full_disk(tmp_path: Path) -> None:
    ended = ChildExit(exit_code=0, signal_received=None, killed_by_signal=None)
    assert lost_at_the_end(ended, {}, tmp_path, None) == []  # os._exit on a disk with room: nothing said
    (said,) = lost_at_the_end(ended, {}, tmp_path, "No space left on device")  # the parent's writes failed
    assert said.startswith("the script's exit facts, never written: the run directory's disk is full")
    killed = ChildExit(exit_code=137, signal_received=None, killed_by_signal=9)
    assert lost_at_the_end(killed, {}, tmp_path, "No space left on device") == []
