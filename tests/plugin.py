"""cascade's pytest plugin: the shared helpers every suite imports (`Project`, `git`, `CASCADE`,
`SCRIPTS`, `wait_for_file`), the fixtures (an isolated environment, a real tmp git project) and the
capability markers.

A test that needs a service says so with a marker, and skips in one place with the reason:

    requires_docker     a Docker engine answers (`make test` as root starts one: scripts/services.sh)
    requires_chromium   Chromium and chromedriver are installed (Debian's, from scripts/services.sh)
    requires_cuda       torch sees a CUDA device (the GPU machines some tasks are lent)
    requires_postgres   PostgreSQL's server binaries are installed (the team-scale suite starts one)
    requires_root       the test mounts filesystems (tmpfs) and needs root
    requires_sshd       an OpenSSH server can be started here (a DVC remote over SSH)

Registered by tests/conftest.py (`pytest_plugins`); test modules import from here, never from a
conftest.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.capabilities import CAPABILITIES, missing

# The suite sends Ctrl-C (SIGINT) to `cascade run` and `cascade ui`. A shell without job control
# starts a background job (`.ci/run &`) with SIGINT ignored, and every process inherits that, so
# none of them would ever see the signal. Handled here, it reaches the children at its default.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

SCRIPTS = Path(__file__).parent / "func" / "scripts"
CASCADE = [sys.executable, "-m", "cascade_repro.cli"]


@pytest.fixture(autouse=True)
def isolated_env(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No test sees the developer's HOME, git identity, MLflow or cascade settings. The user cache
    (cascade's empty MLflow store, per-image facts) is the session's own, shared by its tests;
    MLflow servers start without their job workers."""
    home = tmp_path_factory.mktemp("home")
    for name in list(os.environ):
        if name.startswith(("MLFLOW_", "CASCADE_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.getbasetemp() / "user-cache"))
    # Every `mlflow server` the suite starts (tracking servers, `cascade ui`) would start 8 job
    # workers, each importing MLflow (~20 s of CPU a start), for GenAI jobs no test runs.
    monkeypatch.setenv("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    gitconfig = home / ".gitconfig"
    gitconfig.write_text(
        "[user]\n\tname = Test\n\temail = test@example.com\n[init]\n\tdefaultBranch = main\n"
    )
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(gitconfig))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    return home


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout


def as_record(record: dict[str, Any]) -> Any:
    """A record a test built as JSON, as the store hands it over: schema and shape checked, typed
    (`Manifest.from_dict`). A partial one (this machine, `current`) gets an empty id and experiment."""
    from cascade_repro.manifest import SCHEMA, Manifest

    return Manifest.from_dict({"schema": SCHEMA, "run_id": "", "experiment": "", **record})


def wait_for_file(path: Path, process: subprocess.Popen[str], timeout: float = 120) -> None:
    """Until the background `cascade` process's script writes `path` (a marker); fails with its output
    if it ends first or the time runs out."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, f"the script never wrote {path.name}"
        time.sleep(0.1)


@dataclass
class Project:
    """A real git repository with a training script, driven through the real `cascade` CLI."""

    root: Path

    def write(self, rel: str, content: str | bytes) -> Path:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        return path

    def commit(self, message: str = "change") -> str:
        git(self.root, "add", "-A")
        git(self.root, "commit", "-qm", message)
        return git(self.root, "rev-parse", "HEAD").strip()

    def cascade(self, *args: str, env: dict[str, str] | None = None, check: bool = False,
                timeout: float = 300) -> subprocess.CompletedProcess[str]:  # fmt: skip
        result = subprocess.run(
            [*CASCADE, *args], cwd=self.root, capture_output=True, text=True, timeout=timeout,
            env={**os.environ, **(env or {})},
        )  # fmt: skip
        if check and result.returncode != 0:
            raise AssertionError(f"cascade {' '.join(args)} exited {result.returncode}:\n{result.stderr}")
        return result

    def invoke(self, *args: str, env: dict[str, str] | None = None,
               check: bool = False) -> subprocess.CompletedProcess[str]:  # fmt: skip
        """`cascade ARGS` inside this process (click's CliRunner), for refusals and reads where no
        child process is the point: the same exit code, stdout and stderr, without a new interpreter."""
        from click.testing import CliRunner

        from cascade_repro.cli import main
        from cascade_repro.cli.base import IN_PROCESS

        with contextlib.chdir(self.root):
            result = CliRunner().invoke(main, list(args), env=env, obj=IN_PROCESS, catch_exceptions=False)
        if check and result.exit_code != 0:
            raise AssertionError(f"cascade {' '.join(args)} exited {result.exit_code}:\n{result.stderr}")
        return subprocess.CompletedProcess(["cascade", *args], result.exit_code, result.stdout, result.stderr)

    def record(self, *args: str, env: dict[str, str] | None = None) -> str:
        """`cascade run ARGS`, which must succeed; the id of the run it made."""
        before = {r.info.run_id for r in self.runs()}
        self.cascade("run", *args, env=env, check=True)
        (new,) = {r.info.run_id for r in self.runs()} - before
        return str(new)

    @property
    def tracking_uri(self) -> str:
        return f"sqlite:///{self.root / 'mlflow.db'}"

    def client(self) -> Any:
        from mlflow import MlflowClient

        return MlflowClient(tracking_uri=self.tracking_uri)

    def runs(self) -> list[Any]:
        if not (self.root / "mlflow.db").exists():
            return []
        client = self.client()
        experiments = client.search_experiments()
        return list(client.search_runs([e.experiment_id for e in experiments])) if experiments else []

    def only_run(self) -> Any:
        runs = self.runs()
        assert len(runs) == 1, f"expected one run, found {len(runs)}"
        return runs[0]

    def manifest(self, run_id: str) -> dict[str, Any]:
        local = self.client().download_artifacts(run_id, "cascade/run.json", str(self.root / ".dl"))
        data = json.loads(Path(local).read_text())
        shutil.rmtree(self.root / ".dl")
        return data

    def trace(self, run_id: str) -> list[dict[str, Any]]:
        """The run's step trace as recorded: a record per line."""
        local = self.client().download_artifacts(run_id, "cascade/trace.jsonl", str(self.root / ".dl"))
        lines = Path(local).read_text().splitlines()
        shutil.rmtree(self.root / ".dl")
        return [json.loads(line) for line in lines]


@pytest.fixture
def project(tmp_path: Path) -> Project:
    """A committed repo with tests/func/scripts/train.py as train.py and a hyperparameters.yaml."""
    root = tmp_path / "proj"
    root.mkdir()
    git(root, "init", "-q")
    proj = Project(root)
    proj.write("train.py", (SCRIPTS / "train.py").read_text())
    proj.write(
        "hyperparameters.yaml",
        "seed: 3\nsteps: 20\noptimizer:\n  lr: 0.1\n  momentum: 0.9\nmodel:\n  hidden: 16\n",
    )
    proj.write(".gitignore", "mlflow.db\nmlruns/\n.cascade/\nout/\n")
    proj.commit("initial")
    return proj


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "slow: runs real training or several cascade runs (still run by .ci/run)"
    )
    for name, (what, _probe) in CAPABILITIES.items():
        config.addinivalue_line("markers", f"{name}: skips, saying why, unless {what}")


def pytest_runtest_setup(item: pytest.Item) -> None:
    for marker in item.iter_markers():
        if marker.name in CAPABILITIES and (reason := missing(marker.name)):
            pytest.skip(reason)
