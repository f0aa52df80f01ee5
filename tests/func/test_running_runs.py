"""Who is training what (issue 15): `cascade ls --user` and `--running`, stale runs told by the
heartbeat a run's cascade process keeps in the store. Real MLflow stores, real runs."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from cascade_repro.store import spool
from cascade_repro.store.delivery import Delivery
from cascade_repro.store.metrics_writer import MetricsWriter
from cascade_repro.store.run_store import HEARTBEAT_TAG, RunStore
from tests.plugin import Project


def _open_run(project: Project, experiment: str, user: str, status: str, started_s_ago: float,
              heartbeat_s_ago: float | None) -> str:  # fmt: skip
    """A run as another machine's `cascade run` leaves it in the shared store."""
    client = project.client()
    found = client.get_experiment_by_name(experiment)
    experiment_id = found.experiment_id if found else client.create_experiment(experiment)
    start_ms = int((time.time() - started_s_ago) * 1000)
    tags = {"mlflow.user": user}  # the heartbeat is stored to the second: times here are mid-minute
    if heartbeat_s_ago is not None:
        tags[HEARTBEAT_TAG] = f"{time.time() - heartbeat_s_ago:.0f}"
    run = client.create_run(experiment_id, start_time=start_ms, tags=tags)
    if status != "RUNNING":
        client.set_terminated(run.info.run_id, status, end_time=start_ms + 1000)
    return str(run.info.run_id)


def test_ls_filters_by_user_and_running_and_marks_stale_runs(project: Project) -> None:
    project.cascade("ls", check=True)  # creates the store
    name = project.root.name  # no remote, no cascade.yaml experiment: the directory's name
    alive = _open_run(project, name, "ana", "RUNNING", started_s_ago=3600, heartbeat_s_ago=20)
    silent = _open_run(project, name, "ana", "RUNNING", started_s_ago=3610, heartbeat_s_ago=930)
    old_cascade = _open_run(project, name, "bo", "RUNNING", started_s_ago=3630, heartbeat_s_ago=None)
    fresh = _open_run(project, name, "bo", "RUNNING", started_s_ago=5, heartbeat_s_ago=None)
    done = _open_run(project, name, "ana", "FINISHED", started_s_ago=7200, heartbeat_s_ago=7000)

    def listed(*args: str) -> dict[str, dict[str, object]]:
        out = json.loads(project.invoke("ls", "--json", *args, check=True).stdout)
        return {r["run_id"]: r for r in out["data"]}

    running = listed("--running")
    assert set(running) == {alive, silent, old_cascade, fresh}
    assert {run_id for run_id, r in running.items() if r["stale"]} == {silent, old_cascade}
    stored = float(project.client().get_run(alive).data.tags[HEARTBEAT_TAG])  # (20 s before it was made)
    assert abs(float(running[alive]["heartbeat"]) - stored) <= 1  # type: ignore[arg-type]
    assert set(listed("--user", "ana")) == {alive, silent, done}
    assert set(listed("--user", "ana", "--running")) == {alive, silent}
    assert listed("--user", "nobody") == {}
    table = project.invoke("ls", "--running", check=True).stdout
    # (15m30s and 1h00m30s when made: a loaded machine may take more than 30 s to list them)
    assert len(re.findall(r"STALE \(no heartbeat 1[56]m\)", table)) == 1, table
    assert len(re.findall(r"STALE \(no heartbeat 1h0[01]m\)", table)) == 1, table
    assert "no runs match" in project.invoke("ls", "--user", "nobody", check=True).stdout

    # MLflow's own search (a tracking server's path) answers the same as the embedded store's tables
    store = RunStore(project.tracking_uri, name)
    for user, running_only in (("ana", False), ("bo", True), (None, True)):
        fast = RunStore(project.tracking_uri, name, fast_reads=True).listed(user=user, running=running_only)
        assert [r.run_id for r in store.listed(user=user, running=running_only)] == [r.run_id for r in fast]


def test_a_run_in_progress_keeps_its_heartbeat_in_the_store(project: Project, tmp_path: Path) -> None:
    project.cascade("ls", check=True)
    run_id = _open_run(project, "beats", "ana", "RUNNING", started_s_ago=0, heartbeat_s_ago=None)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    delivery = Delivery(project.client(), run_id, spool.Ledger.load(run_dir), project.tracking_uri)
    writer = MetricsWriter(delivery, run_dir, flush_s=0.2, heartbeat_s=0.3).start()
    try:
        first = _heartbeat(project, run_id, wait_s=60)
        time.sleep(1.2)
        second = _heartbeat(project, run_id, wait_s=60)
    finally:
        writer.stop()
    assert first is not None and second is not None and second >= first
    assert abs(second - time.time()) < 30  # fresh (a stale one is 15 min old), on a loaded machine too


def _heartbeat(project: Project, run_id: str, wait_s: float) -> float | None:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        value = project.client().get_run(run_id).data.tags.get(HEARTBEAT_TAG)
        if value:
            return float(value)
        time.sleep(0.1)
    return None


SLOW = """
import pathlib, time, torch
model = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    opt.zero_grad(); model(torch.randn(4, 2)).sum().backward(); opt.step()
pathlib.Path("started").write_text("1")
deadline = time.time() + 120
while not pathlib.Path("stop").exists() and time.time() < deadline:
    time.sleep(0.1)
"""


def test_verify_of_a_run_still_running_says_so(project: Project) -> None:
    """It said INCOMPARABLE, "run ... has no step trace (recorded with --trace-interval 0)", exit 3: the
    trace of a run in progress is stored when it ends."""
    import subprocess

    from tests.plugin import CASCADE, wait_for_file

    project.write("slow.py", SLOW)
    project.write(".gitignore", "mlflow.db\nmlruns/\n.cascade/\nout/\nstarted\nstop\n")
    project.commit("a slow script")
    done = project.record("train.py")
    running = subprocess.Popen([*CASCADE, "run", "slow.py"], cwd=project.root, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        wait_for_file(project.root / "started", running)
        # and the parent (niced below the script) has opened the run and stored its record
        deadline = time.monotonic() + 120
        while not any('"stage": "captured"' in p.read_text()
                      for p in (project.root / ".cascade" / "runs").glob("*/delivery.json")):  # fmt: skip
            assert running.poll() is None and time.monotonic() < deadline, "the run's record never came"
            time.sleep(0.1)
        (other,) = {r.info.run_id for r in project.runs()} - {done}
        result = project.invoke("verify", done, other)
        assert result.returncode == 1, result.stderr
        assert f"run {other[:12]} is still RUNNING" in result.stderr
        assert "--trace-interval" not in result.stderr
        shown = " ".join(project.invoke("show", other, "--trace", check=True).stdout.split())
        assert "still running: its outcome, trace and files are recorded when it ends" in shown  # not
        assert "not stored yet: the run is still RUNNING" in shown  # "no exit code seen after Nones"
        assert "--trace-interval" not in shown
        rows = json.loads(project.invoke("ls", "--json", check=True).stdout)["data"]
        listed = {r["run_id"]: r for r in rows}
        assert listed[other]["duration_s"] > 0  # so far (it was empty while running)
    finally:
        (project.root / "stop").write_text("1")
        running.wait(timeout=120)
