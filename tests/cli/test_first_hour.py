"""What a new user trips over in the first hour (issue 19, items 3, 4 and 6; issue 14, item 9).

Each test drives the real CLI in a real git repository and asserts on what the user reads.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
from pathlib import Path
from urllib.parse import urlparse

import pytest

from cascade_repro.store.ui_server import JOBS_SETTING
from tests.plugin import CASCADE, Project

STRICT = """\
import argparse

import cascade_repro

cli = argparse.ArgumentParser()
cli.add_argument("--epochs", type=int, default=1)
cli.add_argument("--late", action="store_true", help="log a step, then refuse the arguments")
args = cli.parse_args()
if args.late:
    cascade_repro.log_metrics({"loss": 1.0}, step=0)
    cascade_repro.flush()
    cli.error("argument --epochs: refused after the first step")
print("epochs", args.epochs)
"""

SAVES = """\
from pathlib import Path

Path("checkpoints").mkdir(exist_ok=True)
Path("checkpoints/model.bin").write_bytes(b"weights")
print("saved")
"""


def _no_init(project: Project) -> Project:
    """The fixture's project without the ignore entries `cascade init` would add."""
    (project.root / ".gitignore").write_text("")
    project.write("strict.py", STRICT)
    project.write("saves.py", SAVES)
    project.commit("no cascade ignores")
    return project


# -- 19.3: a cascade option after the script ------------------------------------------------------


def test_a_cascade_option_after_the_script_is_named_and_nothing_is_kept(project: Project) -> None:
    project.write("strict.py", STRICT)
    project.commit("strict script")
    result = project.cascade("run", "strict.py", "--epochs", "2", "--seed", "7")
    assert result.returncode == 2
    assert "unrecognized arguments: --seed 7" in result.stderr  # the script's own message stays
    assert "--seed is an option of `cascade run`" in result.stderr
    assert "cascade run --seed 7 strict.py --epochs 2" in result.stderr
    assert "not kept" in result.stderr and "see it: cascade show" not in result.stderr
    assert project.runs() == []
    assert "no runs yet" in project.cascade("ls", check=True).stdout

    flags = project.cascade("run", "strict.py", "--deterministic=strict", "--log-checkpoints")
    assert flags.returncode == 2
    assert "--deterministic, --log-checkpoints are options of `cascade run`" in flags.stderr
    assert "cascade run --deterministic=strict --log-checkpoints strict.py" in flags.stderr
    assert project.runs() == []


def test_a_usage_error_without_a_cascade_option_is_not_blamed_on_the_order(project: Project) -> None:
    project.write("strict.py", STRICT)
    project.commit("strict script")
    result = project.cascade("run", "strict.py", "--epcohs", "2")
    assert result.returncode == 2
    assert "unrecognized arguments: --epcohs 2" in result.stderr
    assert "option of `cascade run`" not in result.stderr
    assert "not kept: the script stopped in argument parsing" in result.stderr
    assert project.runs() == []


def test_a_usage_error_after_the_first_step_is_recorded(project: Project) -> None:
    project.write("strict.py", STRICT)
    project.commit("strict script")
    result = project.cascade("run", "strict.py", "--late")
    assert result.returncode == 2
    run = project.only_run()
    assert run.info.status == "FAILED" and run.data.metrics["loss"] == 1.0
    error = project.manifest(run.info.run_id)["outcome"]["error"]
    assert error["type"] == "SystemExit" and "refused after the first step" in error["usage_error"]
    assert "not kept" not in result.stderr


def test_script_not_found_offers_the_closest_script(project: Project) -> None:
    project.write("examples/mnist/train_mnist.py", "print('hi')\n")
    project.commit("example")
    result = project.cascade("run", "trian.py")
    assert result.returncode == 2
    assert "script not found: trian.py" in result.stderr and "did you mean train.py?" in result.stderr
    nested = project.cascade("run", "examples/mnist/train_minst.py")
    assert "did you mean examples/mnist/train_mnist.py?" in nested.stderr
    far = project.cascade("run", "zzzzzz.py")
    assert "did you mean" not in far.stderr and "give a path relative to" in far.stderr


# -- 19.4: running before `cascade init` ----------------------------------------------------------


@pytest.mark.slow
def test_cascade_files_and_earlier_outputs_are_never_dirty_state(project: Project) -> None:
    project = _no_init(project)
    first = project.cascade("run", "saves.py", check=True)
    assert "`cascade init`" in first.stderr and ".gitignore" in first.stderr
    for entry in ("mlflow.db", "mlruns/", ".cascade/", "/checkpoints/"):
        assert entry in first.stderr
    project.write("notes.txt", "the user's own untracked file\n")
    second = project.cascade("run", "saves.py", check=True)
    assert "`cascade init`" not in second.stderr  # said once, remembered in .cascade/
    runs = {r.info.run_id: r for r in project.runs()}
    assert len(runs) == 2
    for run_id in runs:
        git_state = project.manifest(run_id)["git"]
        untracked = [u["path"] for u in git_state["untracked"]]
        assert not [p for p in untracked if p.startswith(("mlflow.db", "mlruns", ".cascade", "checkpoints"))]
    latest = max(runs.values(), key=lambda r: r.info.start_time)
    shown = project.cascade("show", latest.info.run_id, check=True).stdout
    assert "1 untracked file(s)" in shown  # notes.txt, and only it
    assert [u["path"] for u in project.manifest(latest.info.run_id)["git"]["untracked"]] == ["notes.txt"]


# -- 19.6: small output that misleads ---------------------------------------------------------------


def _artifact_dir(project: Project, run_id: str) -> Path:
    return Path(urlparse(project.client().get_run(run_id).info.artifact_uri).path)


@pytest.mark.slow
def test_show_says_no_container_for_a_host_run_and_hints_only_at_an_unknown_image(project: Project) -> None:
    project.write("hello.py", "print('hi')\n")
    project.commit("hello")
    run_id = project.record("hello.py")
    record_path = _artifact_dir(project, run_id) / "cascade" / "run.json"
    record = json.loads(record_path.read_text())

    def shown(container: dict[str, object]) -> str:
        record_path.write_text(json.dumps({**record, "container": container}))
        out = project.cascade("show", run_id, check=True).stdout
        (line,) = [line for line in out.splitlines() if line.strip().startswith("container")]
        return line

    host = shown({"in_container": False, "evidence": [], "image": None})
    assert host.split() == ["container", "no"]
    unknown = shown({"in_container": True, "evidence": ["/.dockerenv"], "image": None})
    assert "CASCADE_IMAGE" in unknown and "not known" not in unknown
    assert "yes" in unknown and "/.dockerenv" in unknown
    known = shown({"in_container": True, "evidence": [], "image": "team/train:1", "runtime": "docker"})
    assert "team/train:1" in known and "CASCADE_IMAGE" not in known
    lost = shown({"unavailable": "not captured: the cascade process ended before capture finished"})
    assert "not captured" in lost and lost.split()[:2] != ["container", "no"]


@pytest.mark.slow
def test_diff_against_current_leaves_out_results(project: Project) -> None:
    project.write("saves.py", SAVES + _TORCH_SAVE)
    project.cascade("init", check=True)
    project.commit("init")
    run_id = project.record("saves.py")
    assert project.manifest(run_id)["checkpoints"], "the run must have checkpoints to compare"
    out = project.cascade("diff", run_id, "current", check=True).stdout
    assert "removed" not in out
    assert "not compared against `current`" in out
    headings = [line.split(" (")[0] for line in out.splitlines() if " equal)" in line]
    equal = [line for line in out.splitlines() if line.startswith("equal:")]
    for results in ("metrics", "checkpoints", "trace"):
        assert results not in headings and all(results not in line for line in equal)
    data = json.loads(project.cascade("diff", run_id, "current", "--json", check=True).stdout)["data"]
    assert {s["name"] for s in data["sections"]}.isdisjoint({"metrics", "checkpoints", "trace"})
    asked = project.cascade("diff", run_id, "current", "--only", "checkpoints")
    assert asked.returncode == 2 and "not compared against `current`" in asked.stderr


_TORCH_SAVE = """
import torch

torch.save({"w": torch.zeros(2)}, "checkpoints/final.pt")
"""


def _proc(pid: int, name: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/{name}").read_bytes()
    except OSError:  # gone since
        return b""


def _descendants(pid: int) -> list[int]:
    children = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread ended since
            children += [int(c) for c in (task / "children").read_text().split()]
    return [*children, *(d for c in children for d in _descendants(c))]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.slow
def test_ui_names_the_store_and_prints_the_url_once(project: Project) -> None:
    project.cascade("ls", check=True)  # creates the store
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != JOBS_SETTING}  # the user left it unset
    env["CASCADE_TEST_MARK"] = "the user's environment"
    process = subprocess.Popen([*CASCADE, "ui", "--port", str(port)], cwd=project.root, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)  # fmt: skip
    assert process.stdout is not None
    servers: list[int] = []
    try:
        url = process.stdout.readline().strip()
        # the server it started (answering now) got the user's environment, MLflow's jobs turned off:
        # no job runner (started with the server, before it answers) and none of its workers
        servers = [pid for pid in _descendants(process.pid)  # (not its guard, whose arguments name it)
                   if _proc(pid, "cmdline").split(b"\0")[1:4] == [b"-m", b"mlflow", b"server"]]  # fmt: skip
        assert len(servers) == 1
        environ = _proc(servers[0], "environ").split(b"\0")
        assert f"{JOBS_SETTING}=false".encode() in environ
        assert b"CASCADE_TEST_MARK=the user's environment" in environ
        assert not [p for p in _descendants(process.pid) if b"mlflow.server.jobs" in _proc(p, "cmdline")]
    finally:  # a failed check leaves no server behind: Ctrl-C stops it and its workers
        process.send_signal(signal.SIGINT)
        try:
            stdout_rest, stderr = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            for pid in servers:  # its own process group
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)
            raise
    assert process.returncode == 0, stderr
    assert url == f"http://127.0.0.1:{port}"
    assert (url + stdout_rest + stderr).count(f"127.0.0.1:{port}") == 1
    assert "cascade's" not in stderr
    assert f"sqlite:///{project.root / 'mlflow.db'}" in stderr


@pytest.mark.slow
def test_a_killed_ui_leaves_no_server_serving_the_store(project: Project) -> None:
    """A SIGKILL of `cascade ui` left `mlflow server` (in a session of its own, for Ctrl-C) and its
    uvicorn serving on the port for nobody. They now end with it."""
    from tests.faults.helpers import process_gone

    project.cascade("ls", check=True)  # creates the store
    port = _free_port()
    process = subprocess.Popen([*CASCADE, "ui", "--port", str(port)], cwd=project.root, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    assert process.stdout is not None
    servers: list[int] = []
    try:
        url = process.stdout.readline().strip()
        assert url == f"http://127.0.0.1:{port}", process.stderr and process.stderr.read()
        servers = _descendants(process.pid)
        assert any(b"uvicorn" in _proc(pid, "cmdline") for pid in servers), servers  # the one serving
        process.kill()
        process.wait(timeout=30)
        left = [pid for pid in servers if not process_gone(pid, timeout=60)]
        assert not left, [_proc(pid, "cmdline") for pid in left]
        with pytest.raises(ConnectionRefusedError):  # nothing listens on the port any more
            socket.create_connection(("127.0.0.1", port), timeout=10).close()
    finally:
        with contextlib.suppress(OSError):
            process.kill()
        for pid in servers[:1]:  # the server's own process group
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)


# -- 14.9: checkout's default checkpoint ------------------------------------------------------------


@pytest.mark.slow
def test_checkout_defaults_to_the_last_checkpoint_without_a_monitor_and_says_why(
    project: Project, tmp_path: Path
) -> None:
    project.write("saves.py", SAVES + _TORCH_SAVE + _TORCH_SAVE.replace("final", "later"))
    project.cascade("init", check=True)
    project.commit("init")
    run_id = project.record("saves.py")
    result = project.cascade("checkout", run_id[:8], "--to", str(tmp_path / "out"), check=True)
    assert "checkpoints/later.pt" in result.stderr
    assert "last: no metric monitored" in result.stderr
    assert (tmp_path / "out" / "later.pt").is_file()
    data = json.loads(project.cascade("checkout", run_id[:8], "--to", str(tmp_path / "json"), "--json",
                                      check=True).stdout)["data"]  # fmt: skip
    assert data["chosen"] == {"path": "checkpoints/later.pt", "why": "last: no metric monitored"}
    best = project.cascade("checkout", run_id[:8], "--checkpoint", "best")
    assert best.returncode == 2 and "none is 'best'" in best.stderr  # asked for by name: still refused


@pytest.mark.slow
def test_checkout_defaults_to_the_best_by_the_monitored_metric(project: Project, tmp_path: Path) -> None:
    from tests.plugin import SCRIPTS

    project.write("ckpt.py", (SCRIPTS / "ckpt.py").read_text())
    project.cascade("init", check=True)
    project.commit("init")
    run_id = project.record("ckpt.py")
    result = project.cascade("checkout", run_id[:8], "--to", str(tmp_path / "out"), check=True)
    assert "checkpoints/step-00000003.pt" in result.stderr and "best by val_loss" in result.stderr
