"""`cascade ui`: the stock MLflow UI (`mlflow server`) on cascade's store, started, awaited, stopped.

The server runs under a guard (store/ui_guard.py) that leads its process group, so Ctrl-C here stops
it and every worker it started; on Linux the guard also stops them when `cascade ui` ends any other
way, a SIGKILL included: no server is left serving the store for nobody.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from cascade_repro.errors import EXIT_ERROR, EXIT_OK, StoreError, UsageError

READY_TIMEOUT_S = 90.0
# MLflow's server otherwise starts 8 job workers (GenAI jobs), each importing MLflow: ~1.1 GB held and
# ~20 s of CPU, for work cascade's runs never queue. A user's own setting is kept.
JOBS_SETTING = "MLFLOW_SERVER_ENABLE_JOB_EXECUTION"


def server_environment(environ: dict[str, str]) -> dict[str, str]:
    """The server's environment: the user's, with MLflow's job workers off unless they set it."""
    return {JOBS_SETTING: "false", **environ}


@dataclass
class UiServer:
    """A running `mlflow server` on the project's store: its process, URL and log."""

    process: subprocess.Popen[bytes]
    url: str
    log: Path
    store: str = ""  # the backend store URI it serves

    def wait(self) -> int:
        return self.process.wait()

    def stop(self, timeout_s: float = 15.0) -> None:
        if self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        except ProcessLookupError:
            pass


@dataclass(frozen=True)
class UiOutcome:
    """How a `cascade ui` session ended: stopped by the user (Ctrl-C, SIGTERM), or the server exited."""

    url: str
    log: Path
    server_exit: int | None  # None: stopped by the user

    @property
    def exit_status(self) -> int:
        return EXIT_OK if self.server_exit is None else EXIT_ERROR


def serve(server: UiServer, started: Callable[[UiServer], None]) -> UiOutcome:
    """Wait on a started server until it exits or the user stops it (Ctrl-C, or SIGTERM from a
    supervisor), and stop it and its workers in that case. `started` is told once it answers."""

    def interrupted(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupted)
    try:  # Ctrl-C right after the URL is shown stops the server as well
        started(server)
        return UiOutcome(server.url, server.log, server.wait())
    except KeyboardInterrupt:
        server.stop()
        return UiOutcome(server.url, server.log, None)
    finally:
        signal.signal(signal.SIGTERM, previous)


def start(tracking_uri: str, artifact_root: str, host: str, port: int, log: Path) -> UiServer:
    """Start `mlflow server` and return once it answers on /health (or raise with its log)."""
    _refuse_taken_port(host, port)
    log.parent.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "cascade_repro.store.ui_guard", str(os.getpid()),
        sys.executable, "-m", "mlflow", "server", "--backend-store-uri", tracking_uri,
        "--default-artifact-root", artifact_root, "--host", host, "--port", str(port), "--workers", "1",
    ]  # fmt: skip
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                   env=server_environment(dict(os.environ)))  # fmt: skip
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
    server = UiServer(process, f"http://{shown}:{port}", log, tracking_uri)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-5:]
            raise StoreError(f"mlflow server exited with {process.returncode}: " + " | ".join(tail),
                             hint=f"see {log}")  # fmt: skip
        if _answers(server.url + "/health"):
            return server
        time.sleep(0.3)
    server.stop()
    raise StoreError(f"mlflow server did not answer within {READY_TIMEOUT_S:.0f} s", hint=f"see {log}")


def _refuse_taken_port(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host or "127.0.0.1", port))
        except OSError:
            raise UsageError(f"port {port} on {host} is already in use",
                             hint=f"pass another --port, e.g. --port {port + 1}") from None  # fmt: skip


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1.0) as response:  # noqa: S310 - our own server
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False
