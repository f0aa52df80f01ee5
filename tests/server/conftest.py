"""The team-scale suite's services, real processes started here and stopped at the end: a PostgreSQL
cluster of its own (Debian's binaries; `make test` installs them as root), a fresh database per test,
and an MLflow tracking server with proxied artifact storage on sqlite or on PostgreSQL."""

from __future__ import annotations

import glob
import itertools
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest

_databases = itertools.count()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _pg_bin(name: str) -> str:
    found = shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))), None)
    assert found, f"{name} not found (the suite is marked requires_postgres)"
    return found


def _as_postgres(argv: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: as root, run it as the postgres user the package made."""
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[tuple[str, int]]:
    """A cluster in a temp dir (trust auth on 127.0.0.1, no fsync: test data), on a free port."""
    base = Path(tempfile.mkdtemp(prefix="cascade-pg-"))
    data, port = base / "data", free_port()
    if os.geteuid() == 0:
        shutil.chown(base, "postgres", "postgres")
    log = base / "server.log"
    subprocess.run(_as_postgres([_pg_bin("initdb"), "-D", str(data), "-A", "trust", "-U", "postgres",
                                 "--no-sync"]), check=True, capture_output=True)  # fmt: skip
    options = f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c fsync=off"
    started = subprocess.run(_as_postgres([_pg_bin("pg_ctl"), "-D", str(data), "-o", options, "-l", str(log),
                                           "-w", "start"]), capture_output=True, text=True)  # fmt: skip
    assert started.returncode == 0, started.stderr + (log.read_text() if log.exists() else "")
    try:
        yield "127.0.0.1", port
    finally:
        subprocess.run(_as_postgres([_pg_bin("pg_ctl"), "-D", str(data), "-m", "fast", "stop"]),
                       capture_output=True)  # fmt: skip
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def postgres_db(postgres_cluster: tuple[str, int]) -> str:
    """A fresh database of the cluster, as MLflow's SQLAlchemy URL (psycopg2, as MLflow needs)."""
    host, port = postgres_cluster
    name = f"mlflow_{os.getpid()}_{next(_databases)}"
    subprocess.run([_pg_bin("createdb"), "-h", host, "-p", str(port), "-U", "postgres", name], check=True)
    return f"postgresql+psycopg2://postgres@{host}:{port}/{name}"


def start_tracking_server(
    backend: str, artifacts: Path, log_path: Path
) -> tuple[str, subprocess.Popen[bytes]]:
    """`mlflow server` on `backend` with proxied artifacts in `artifacts`, once it answers /health."""
    port = free_port()
    log = log_path.open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", backend,
         "--serve-artifacts", "--artifacts-destination", str(artifacts),
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    log.close()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                return url, process
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise AssertionError(
                    f"mlflow server did not start:\n{log_path.read_text()[-3000:]}"
                ) from None
            time.sleep(0.5)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.requires_postgres)])
def tracking_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A tracking server of its own on sqlite, and on PostgreSQL; (its URL, its artifact directory)."""
    if request.param == "postgresql":
        backend = request.getfixturevalue("postgres_db")
    else:
        backend = f"sqlite:///{tmp_path / 'server.db'}"
    artifacts = tmp_path / "server-artifacts"
    url, process = start_tracking_server(backend, artifacts, tmp_path / "server.log")
    try:
        yield url, artifacts
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
