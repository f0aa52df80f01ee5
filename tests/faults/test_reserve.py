"""The run directory's reserve (space set aside for the run's last words on a full disk) is kept for
them: a write in the middle of the run that meets a full disk does not give it up."""

from __future__ import annotations

import contextlib
import errno
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from cascade_repro.child import protocol
from cascade_repro.store import spool
from cascade_repro.store.delivery import Delivery
from tests.faults.helpers import small_tmpfs

pytestmark = pytest.mark.requires_root


def _fill(directory: Path) -> None:
    """Write until the disk is full (what a script saving checkpoints does to it)."""
    fd = os.open(directory / f"filler{len(list(directory.iterdir()))}", os.O_WRONLY | os.O_CREAT)
    try:
        for size in (64 << 10, 4 << 10):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, bytes(size))
    finally:
        os.close(fd)
    with pytest.raises(OSError) as full:
        (directory / "one-more").write_bytes(b"x" * 4096)
    assert full.value.errno == errno.ENOSPC


def test_a_write_in_the_middle_of_a_run_leaves_the_reserve_for_its_end(tmp_path: Path) -> None:
    """The review's defect: the first atomic write to meet a full disk took the reserve, mid-run too
    (the delivery ledger saving a batch of points); the script filled the space it freed, and the
    run's end (`ended`, then the record) could not be written: the next command read it as died."""
    with small_tmpfs(tmp_path / "small", "8m") as mount:
        run_dir, lock = spool.make_run_dir(mount / "runs")
        try:
            assert (run_dir / protocol.RESERVE_FILE).stat().st_size == protocol.RESERVE_BYTES
            ledger = spool.Ledger(run_dir, {"ops": []})
            _fill(mount)
            ledger.put({"id": "points:1", "kind": "points", "state": "pending"})  # mid-run
            assert ledger.unsaved is not None  # it waits, in memory, for room or the end
            early = SimpleNamespace(ledger=ledger, record=None)  # the record made after capture, mid-run
            Delivery.keep_record(early, {"run_id": "r", "stage": "captured"})  # type: ignore[arg-type]
            assert early.record is not None and not (run_dir / spool.RECORD_FILE).exists()
            assert (run_dir / protocol.RESERVE_FILE).exists()
            _fill(mount)  # the script goes on writing
            ledger.update(ended={"status": "FAILED", "exit_code": 1})  # the run's end
            assert ledger.unsaved is None
            saved = json.loads((run_dir / spool.LEDGER_FILE).read_text())
            assert saved["ended"]["status"] == "FAILED" and saved["ops"][0]["id"] == "points:1"
            final = SimpleNamespace(ledger=ledger, record=None)
            Delivery.keep_record(final, {"run_id": "r"}, last_words=True)  # type: ignore[arg-type]
            assert json.loads((run_dir / spool.RECORD_FILE).read_text()) == {"run_id": "r"}
        finally:
            os.close(lock)


def test_a_full_quota_is_a_full_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """EDQUOT (a user over quota on a shared disk) is a full disk for the run's last words too. It is
    simulated: no quota can be set on this machine's file systems (tmpfs without quota support)."""
    run_dir, lock = spool.make_run_dir(tmp_path / "runs")
    original = protocol.open_private
    refused = []

    def over_quota(path: Path, mode: str = "w") -> object:
        if (run_dir / protocol.RESERVE_FILE).exists():
            refused.append(path)
            raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))
        return original(path, mode)

    monkeypatch.setattr(protocol, "open_private", over_quota)
    try:
        protocol.write_json_atomic(run_dir / "child.json", {"exit_code": 1}, last_words=True)
    finally:
        os.close(lock)
    assert refused and json.loads((run_dir / "child.json").read_text()) == {"exit_code": 1}


def test_a_rank_of_a_torchrun_job_keeps_room_for_its_last_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last stop's named gap: rank K > 0 writes its exit facts in ranks/K/, where no reserve was
    set aside (only the run directory had one), so a script that filled the disk lost that rank's end."""
    from cascade_repro.child import bootstrap

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv(protocol.ENV_RUN_DIR, str(tmp_path))  # (the bootstrap points it at ranks/1)
    with small_tmpfs(tmp_path / "small", "8m") as mount:
        own = bootstrap._own_directory(mount / "job")
        assert own == mount / "job" / protocol.RANKS_DIR / "1"
        assert (own / protocol.RESERVE_FILE).stat().st_size == protocol.RESERVE_BYTES
        _fill(mount)  # the script fills the disk, then ends
        protocol.write_json_atomic(own / protocol.FACTS_FILE, {"exit_code": 3}, last_words=True)
        assert json.loads((own / protocol.FACTS_FILE).read_text()) == {"exit_code": 3}


def test_a_checkpoint_note_cut_short_by_a_full_disk_is_followed_by_whole_lines(tmp_path: Path) -> None:
    """A note the full disk cut mid-line is left (cutting it back could take a line another process
    appended); the notes written once there is room start on a line of their own, each once."""
    from cascade_repro.child.checkpoints import CheckpointLog

    with small_tmpfs(tmp_path / "small", "1m") as mount:
        log = CheckpointLog(mount / "checkpoints.jsonl")
        log.announce("pruned", mount / "first.pt", step=1)  # the file's first page, mostly free
        _fill(mount)
        log.announce("pruned", mount / "second.pt", step=2, note="x" * 6000)  # more than that page holds
        assert log.cut and len(log.unwritten) == 1  # part of it written, all of it kept
        for filler in mount.glob("filler*"):
            filler.unlink()
        log.announce("pruned", mount / "third.pt", step=3)
        assert not log.unwritten
        lines = (mount / "checkpoints.jsonl").read_text().splitlines()
        parsed = []
        for line in lines:
            with contextlib.suppress(ValueError):  # (as the parent's reader skips a line cut short)
                parsed.append(json.loads(line)["step"])
        assert parsed == [1, 2, 3] and len(lines) == 4
