"""Defect 7, the store half: the disk under the MLflow database fills up during a run.

The run must not be FINISHED-and-silent: `cascade run` says what the store lacks and exits 4, the
points it could not store stay in the spool, `show` claims no more points than are stored, and
`cascade sync` delivers the rest once there is room.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterator

import pytest

from tests.faults.helpers import add_faults_script, points_in, small_tmpfs, stored_points
from tests.plugin import Project

pytestmark = [pytest.mark.slow, pytest.mark.requires_root]

BULK = 100_000


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 MiB tmpfs of its own (root only): a real ENOSPC, not a mock."""
    with small_tmpfs(tmp_path / "store-disk", "64m") as mount:
        yield mount


def _fill(disk: Path, leave: int) -> Path:
    """A filler file that leaves `leave` bytes free on `disk`."""
    stat = os.statvfs(disk)
    free = stat.f_bavail * stat.f_frsize
    filler = disk / "filler"
    with open(filler, "wb") as handle:
        handle.write(b"\0" * max(0, free - leave))
    return filler


def test_a_full_store_disk_is_said_and_synced_later(project: Project, small_disk: Path) -> None:
    add_faults_script(project)
    db = small_disk / "mlflow.db"
    project.write("cascade.yaml", f"tracking_uri: sqlite:///{db}\n")
    project.commit("the store on a small disk")
    project.cascade("run", "faults.py", "--steps", "2", check=True)  # the database exists, migrated
    filler = _fill(small_disk, 1024 * 1024)

    result = project.cascade("run", "faults.py", "--steps", "3", "--bulk", str(BULK))
    assert result.returncode == 4, result.stderr
    assert "the record is incomplete" in result.stderr and "metric point(s) pending" in result.stderr
    assert "database or disk is full" in result.stderr  # the reason, as sqlite gave it
    spools = [p for p in (project.root / ".cascade" / "runs").iterdir() if not p.name.startswith(".")]
    (spool,) = spools
    logged = points_in(spool / "events.jsonl")
    assert logged == {"loss": 3, "bulk": BULK}
    run_id = (spool / "mlflow_run_id").read_text()

    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    stored = stored_points(project, run_id, ["bulk"], client)["bulk"]
    assert stored < BULK
    run = client.get_run(run_id)
    assert run.info.status == "RUNNING"  # not closed FINISHED while part of it is missing
    shown = project.cascade("show", run_id[:8], "--json")
    assert shown.returncode == 0, shown.stderr
    manifest = json.loads(shown.stdout)["data"]["manifest"]
    claimed = manifest["metrics"]["keys"]["bulk"]["count"]
    assert 0 < claimed == stored  # what the store has, never more
    print(
        f"\nFIGURES store disk full: {sum(logged.values())} logged, {stored} of {BULK} bulk stored, status "
        f"{run.info.status}, exit {result.returncode}, show claims {claimed}\n{result.stderr}"
    )
    assert any("metric" in line for line in manifest["outcome"]["undelivered"])
    listed = json.loads(project.cascade("ls", "--json").stdout)["data"]
    assert [r["status"] for r in listed if r["run_id"] == run_id] == ["PENDING-SYNC"]

    filler.unlink()  # room again
    synced = project.cascade("sync")
    assert synced.returncode == 0, synced.stderr
    assert stored_points(project, run_id, ["bulk", "loss"], client) == {"bulk": BULK, "loss": 3}
    assert client.get_run(run_id).info.status == "FINISHED"
    assert "cascade.incomplete" not in client.get_run(run_id).data.tags
    final = json.loads(project.cascade("show", run_id[:8], "--json").stdout)["data"]["manifest"]
    assert final["metrics"]["keys"]["bulk"]["count"] == BULK
    assert "undelivered" not in final["outcome"]
    assert not spool.exists()
