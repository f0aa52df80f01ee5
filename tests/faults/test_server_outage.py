"""Defect 6: a tracking server down for longer than MLflow's retry budget in the middle of a run.

Points, output and record stay spooled in the run directory; `cascade run` says so and exits 4 (the
script exited 0); `cascade ls` shows the run PENDING-SYNC; once the server answers, `cascade sync`
delivers everything and closes the run with its real status.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.faults.helpers import Background, add_faults_script, points_in, stored_points
from tests.plugin import Project

pytestmark = pytest.mark.slow

# A short retry budget, so "longer than the budget" is seconds, not minutes.
FAST_FAIL = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "3"}


class Server:
    """A real `mlflow server` (sqlite backend, proxied artifacts) that the test stops and starts."""

    def __init__(self, base: Path) -> None:
        self.base = base
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.uri = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 120) -> None:
        log = open(self.base / "server.log", "ab")  # noqa: SIM115 - the server's lifetime
        db = f"sqlite:///{self.base / 'srv.db'}"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", db,
             "--artifacts-destination", str(self.base / "artifacts"), "--host", "127.0.0.1",
             "--port", str(self.port), "--workers", "1"],
            stdout=log, stderr=log, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process.poll() is None, (self.base / "server.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(self.uri + "/health", timeout=2):
                    return
            except OSError:
                time.sleep(0.3)
        raise AssertionError("the MLflow server did not start")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
        self.process = None


@pytest.fixture
def server(tmp_path: Path) -> Server:
    base = tmp_path / "server"
    base.mkdir()
    srv = Server(base)
    srv.start()
    yield srv
    srv.stop()


def test_points_output_and_record_wait_in_the_spool_until_the_server_returns(
    project: Project, server: Server
) -> None:
    add_faults_script(project)
    project.write("cascade.yaml", f"tracking_uri: {server.uri}\nmetrics_flush_s: 0.5\n")
    project.commit("a tracking server")
    run = Background(
        project, "faults.py", "--steps", "100", "--step-sleep", "0.1", "--bulk", "3000", env=FAST_FAIL
    )
    run.wait_for(
        lambda: (run.run_dir() or Path("/none")).joinpath("mlflow_run_id").exists(), "the run to open"
    )
    spool = run.run_dir()
    assert spool is not None
    run.wait_for(lambda: (spool / "metrics.json").exists(), "the first points in the store")
    server.stop()  # down for the rest of the run, and then some
    code = run.finish(timeout=300)
    output = run.output()
    assert code == 4, output
    assert "the record is incomplete" in output and "cascade sync" in output
    assert str(spool) in output
    logged = points_in(spool / "events.jsonl")
    assert logged["loss"] == 100 and logged["bulk"] == 3000
    assert (spool / "run.json").exists() and (spool / "output.log").exists()

    server.start()
    listed = project.cascade("ls", "--json", env=FAST_FAIL)
    assert listed.returncode == 0, listed.stderr
    (row,) = json.loads(listed.stdout)["data"]
    assert row["status"] == "PENDING-SYNC" and row["pending"] is True

    synced = project.cascade("sync", env=FAST_FAIL)
    assert synced.returncode == 0, synced.stderr
    client = _client(server.uri)
    run_id = (spool / "mlflow_run_id").read_text() if spool.exists() else row["run_id"]
    assert not spool.exists()
    stored = stored_points(project, run_id, list(logged), client)
    print(
        f"\nFIGURES server outage: logged {logged}, stored after sync {stored}, run exit {code}, "
        f"sync exit {synced.returncode}, status {client.get_run(run_id).info.status}\n{output}"
    )
    assert stored == logged
    stored = client.get_run(run_id)
    assert stored.info.status == "FINISHED"
    assert "cascade.incomplete" not in stored.data.tags
    local = client.download_artifacts(run_id, "cascade/run.json", str(project.root / ".dl"))
    manifest = json.loads(Path(local).read_text())
    assert manifest["outcome"]["status"] == "FINISHED"
    assert "undelivered" not in manifest["outcome"], manifest["outcome"]["undelivered"]
    assert manifest["metrics"]["pending"] == 0
    assert manifest["metrics"]["keys"]["bulk"]["count"] == 3000
    assert (
        "faults script done"
        in Path(
            client.download_artifacts(run_id, "cascade/output.log", str(project.root / ".dl"))
        ).read_text()
    )
    again = project.cascade("ls", "--json", env=FAST_FAIL)
    assert [r["status"] for r in json.loads(again.stdout)["data"]] == ["FINISHED"]


def _client(uri: str):  # noqa: ANN202 - mlflow's type
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri)
