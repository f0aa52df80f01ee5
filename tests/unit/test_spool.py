"""The spool's own logic: bounded reads of the events files, ownership by lock and /proc, the outbox."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from cascade_repro.store import spool


def _events(path: Path, lines: int, keys: int = 1) -> None:
    with open(path, "w") as handle:
        for i in range(lines):
            handle.write(json.dumps([1000 + i, i, {f"k{j}": float(i) for j in range(keys)}]) + "\n")


def test_read_points_takes_whole_lines_up_to_the_limit_and_says_where_it_stopped(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    _events(events, 2500)
    points, offset, bad = spool.read_points(events, 0, 1000, chunk=4096)
    assert len(points) == 1000 and bad == 0
    assert points[0] == ("k0", 0.0, 1000, 0) and points[-1][3] == 999
    rest, end, _ = spool.read_points(events, offset, 10_000)
    assert [p[3] for p in rest] == list(range(1000, 2500)) and end == events.stat().st_size
    assert spool.read_points(events, end, 1000) == ([], end, 0)


def test_a_line_being_written_is_left_for_later_and_a_bad_line_is_counted(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    events.write_text('[1, 0, {"a": 1}]\nnot json\n[2, 1, {"a": 2}]\n[3, 2, {"a"')
    points, offset, bad = spool.read_points(events, 0, 1000)
    assert [p[1] for p in points] == [1.0, 2.0] and bad == 1
    assert offset == len('[1, 0, {"a": 1}]\nnot json\n[2, 1, {"a": 2}]\n')
    assert [p[3] for p in spool.iter_points(events, offset)] == [0, 1]


def test_a_wide_line_is_one_batch_and_memory_stays_one_chunk(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    _events(events, 3, keys=1500)
    points, offset, _ = spool.read_points(events, 0, 1000, chunk=1024)
    assert len(points) == 1500  # whole lines: the writer splits a batch into requests of ≤ 1000


def test_a_live_owner_holds_the_lock_and_a_dead_one_is_found(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    run_dir, fd = spool.make_run_dir(runs)
    (run_dir / "events.jsonl").write_text("")
    assert spool.scan(runs) == []  # locked: its parent lives
    spool.release(fd)
    assert spool.scan(runs) == []  # the lock is free but parent.json names this live process
    owner = json.loads((run_dir / spool.OWNER_FILE).read_text())
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    owner["pid"] = int(dead.stdout)  # a process that has exited
    spool.write_json(run_dir / spool.OWNER_FILE, owner)
    (entry,) = spool.scan(runs)
    assert entry.state == spool.DEAD and entry.path == run_dir
    owner["pid"], owner["start_ticks"] = os.getpid(), 1  # pid reused by another process
    spool.write_json(run_dir / spool.OWNER_FILE, owner)
    assert [e.state for e in spool.scan(runs)] == [spool.DEAD]
    spool.Ledger.load(run_dir).update(parent="exited")
    assert [e.state for e in spool.scan(runs)] == [spool.PENDING]


def test_the_outbox_replaces_an_operation_of_the_same_id(tmp_path: Path) -> None:
    ledger = spool.Ledger.load(tmp_path)
    ledger.put({"id": "record", "state": "pending"})
    ledger.put({"id": "params", "state": "stored"})
    ledger.put({"id": "record", "state": "stored"})
    again = spool.Ledger.load(tmp_path)
    assert [(op["id"], op["state"]) for op in again.ops()] == [("record", "stored"), ("params", "stored")]
    assert oct((tmp_path / spool.LEDGER_FILE).stat().st_mode & 0o777) == "0o600"
