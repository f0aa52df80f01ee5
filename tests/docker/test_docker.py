"""`cascade run --docker`, `cascade image build`, `cascade restore --docker` against a real Docker engine."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.docker.conftest import write_docker_project
from tests.plugin import CASCADE, Project, git

# One worker runs the whole file under `make test` (--dist loadfile): its session fixtures share
# test-artifacts/wheelhouse and remove the project images when that worker ends.
pytestmark = [pytest.mark.slow, pytest.mark.requires_docker]


def _artifact(project: Project, run_id: str, path: str) -> bytes:
    local = project.client().download_artifacts(run_id, path, str(project.root.parent / f"dl-{run_id[:8]}"))
    return Path(local).read_bytes()


def _trace(project: Project, run_id: str) -> list[dict[str, Any]]:
    return [
        json.loads(line) for line in _artifact(project, run_id, "cascade/trace.jsonl").splitlines() if line
    ]


def _json(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert result.stdout.strip(), result.stderr
    return dict(json.loads(result.stdout)["data"])


def test_run_in_docker_records_the_image_and_matches_the_run_outside(docker_project: Project,
                                                                     docker_client: Any) -> None:  # fmt: skip
    project = docker_project
    commit = git(project.root, "rev-parse", "HEAD").strip()
    # every facet every step (not as a timed budget allows), so the two traces below compare whole
    run_id = project.record("--docker", "--trace-budget", "0", "train.py")
    manifest = project.manifest(run_id)
    container = manifest["container"]
    image = docker_client.images.get(container["image_id"])
    assert container["image"] == f"cascade/proj:{commit[:12]}"
    assert container["image"] in image.tags
    inspected = subprocess.run(["docker", "image", "inspect", "-f", "{{.Id}}", container["image"]],
                               capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    assert container["image_id"] == inspected
    dockerfile = _artifact(project, run_id, "cascade/Dockerfile")
    assert hashlib.sha256(dockerfile).hexdigest() == container["dockerfile_sha256"]
    assert image.labels["cascade.dockerfile"] == container["dockerfile_sha256"]
    assert (
        _artifact(project, run_id, "cascade/requirements.txt")
        == (project.root / "requirements.lock").read_bytes()
    )
    assert container["requirements_source"] == "requirements.lock"
    assert project.client().get_run(run_id).data.tags["cascade.image_id"] == inspected
    # The record describes the image's Python, not this machine's.
    assert manifest["python"]["executable"] == "/opt/venv/bin/python"
    assert manifest["python"]["packages"]["torch"]["version"].startswith(manifest["torch"]["version"][:6])
    assert "mlflow" not in manifest["python"]["packages"]
    assert manifest["outcome"]["status"] == "FINISHED"
    # The CA bundle was used in the build stage only: the final image does not carry it.
    assert b"ca.pem" in dockerfile
    probe = subprocess.run(["docker", "run", "--rm", inspected, "sh", "-c", "ls /tmp/cascade 2>&1; echo end"],
                           capture_output=True, text=True)  # fmt: skip
    assert "ca.pem" not in probe.stdout and "wheelhouse" not in probe.stdout, probe.stdout
    # The container is gone; its files in the workspace belong to the calling user.
    assert docker_client.containers.list(all=True, filters={"ancestor": inspected}) == []
    assert (project.root / "out" / "losses.json").stat().st_uid == os.getuid()

    outside = project.record("--trace-budget", "0", "train.py")
    # Same torch build, CPU and thread count inside and outside: the traces are equal bit for bit.
    other = project.manifest(outside)
    assert (other["torch"]["version"], other["torch"]["cpu_capability"], other["torch"]["num_threads"]) == (
        manifest["torch"]["version"],
        manifest["torch"]["cpu_capability"],
        manifest["torch"]["num_threads"],
    )
    assert _trace(project, outside) == _trace(project, run_id)
    verified = project.cascade("verify", run_id, outside, "--json")
    assert verified.returncode == 0, verified.stderr
    verdict = _json(verified)
    assert verdict["verdict"] == "BITWISE_IDENTICAL"
    assert any(d["kind"] == "image" for d in verdict["record_differences"])


def test_image_is_reused_for_the_same_inputs_and_rebuilt_for_new_code(docker_project: Project) -> None:
    project = docker_project
    first = _json(project.cascade("image", "build", "--json", check=True))
    again = _json(project.cascade("image", "build", "--json", check=True))
    assert again["built"] is False and again["image_id"] == first["image_id"]
    assert again["inputs_sha256"] == first["inputs_sha256"]
    project.write("train.py", (project.root / "train.py").read_text() + "# edited, not committed\n")
    dirty = _json(project.cascade("image", "build", "--json", check=True))
    commit = git(project.root, "rev-parse", "HEAD").strip()
    assert dirty["built"] is True and dirty["image_id"] != first["image_id"]
    assert dirty["image"].startswith(f"cascade/proj:{commit[:12]}-") and dirty["image"] != first["image"]


def test_restore_docker_reuses_the_recorded_image_then_rebuilds_and_reports_drift(
    docker_project: Project, docker_client: Any, wheelhouse: Path
) -> None:
    project = docker_project
    run_id = project.record("--docker", "--tag", "v1", "train.py")
    recorded = project.manifest(run_id)["container"]
    builds = project.root / ".cascade" / "builds"
    logs_before = sorted(builds.iterdir()) if builds.exists() else []

    reused = project.cascade("restore", "v1", "--docker", "--json")
    assert reused.returncode == 0, reused.stderr
    data = _json(reused)
    assert data["image"]["source"] == "recorded" and data["image"]["built"] is False
    assert data["image"]["image_id"] == recorded["image_id"]
    assert (sorted(builds.iterdir()) if builds.exists() else []) == logs_before  # no build ran
    assert data["verdict"]["verdict"] == "BITWISE_IDENTICAL"
    rerun = project.manifest(data["run"]["run_id"])
    assert rerun["container"]["image_id"] == recorded["image_id"]

    # The image is gone, and the wheelhouse now has another filelock: rebuilt, the drift reported.
    docker_client.images.remove(recorded["image_id"], force=True)
    recorded_filelock = project.manifest(run_id)["python"]["packages"]["filelock"]["version"]
    other = project.root.parent / "wheelhouse-drift"
    other.mkdir()
    for wheel in wheelhouse.iterdir():
        if not wheel.name.startswith("filelock-"):
            os.link(wheel, other / wheel.name)
    older = "3.16.1" if recorded_filelock != "3.16.1" else "3.15.4"
    got = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(other),
                          f"filelock=={older}"], capture_output=True, text=True)  # fmt: skip
    assert got.returncode == 0, got.stderr
    settings = (project.root / "cascade.yaml").read_text().replace(str(wheelhouse), str(other))
    (project.root / "cascade.yaml").write_text(settings)

    rebuilt = project.cascade("restore", "v1", "--docker", "--json")
    assert rebuilt.returncode == 0, rebuilt.stderr
    data = _json(rebuilt)
    assert data["image"]["source"] == "rebuilt" and data["image"]["built"] is True
    assert data["image"]["image_id"] != recorded["image_id"]
    assert data["image"]["dockerfile_sha256"] == recorded["dockerfile_sha256"]
    assert data["image"]["drift"] == [{"name": "filelock", "recorded": recorded_filelock, "now": older}]
    assert f"filelock {recorded_filelock} → {older}" in rebuilt.stderr  # said before the re-run
    assert rebuilt.stderr.index("image drift") < rebuilt.stderr.index("re-running")
    tags = project.client().get_run(data["run"]["run_id"]).data.tags
    assert tags["cascade.image_source"] == "rebuilt"
    assert tags["cascade.image_drift"] == f"filelock {recorded_filelock} → {older}"
    verdict = data["verdict"]
    assert verdict["verdict"] == "BITWISE_IDENTICAL"  # filelock does not touch the numbers...
    summaries = " ".join(d["summary"] for d in verdict["record_differences"])
    assert f"filelock {recorded_filelock} → {older}" in summaries  # ...but the verdict names it


def test_exit_code_and_interrupt_reach_through_the_container(
    docker_project: Project, docker_client: Any
) -> None:
    project = docker_project
    failed = project.cascade("run", "--docker", "train.py", "--exit", "3")
    assert failed.returncode == 3, failed.stderr
    (run,) = project.runs()
    assert run.info.status == "FAILED"
    assert project.manifest(run.info.run_id)["outcome"]["exit_code"] == 3

    ready = project.root / "out" / "ready"
    ready.unlink(missing_ok=True)
    process = subprocess.Popen([*CASCADE, "run", "--docker", "train.py", "--hang"], cwd=project.root,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 240
    while not ready.exists() and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.2)
    assert ready.exists(), process.stderr.read() if process.poll() is not None else "script never got ready"
    process.send_signal(signal.SIGINT)  # what Ctrl-C in a terminal sends cascade
    out, err = process.communicate(timeout=120)
    assert process.returncode == 130, err
    killed = next(r for r in project.runs() if r.info.run_id != run.info.run_id)
    assert killed.info.status == "KILLED"
    assert killed.data.metrics["loss"] > 0  # what the script logged before Ctrl-C is kept
    assert docker_client.containers.list(all=True, filters={"label": "cascade.run_dir"}) == []


def test_clear_errors_record_nothing(docker_project: Project, tmp_path: Path, base_image: str,
                                     wheelhouse: Path) -> None:  # fmt: skip
    project = docker_project
    no_engine = project.cascade(
        "run", "--docker", "train.py", env={"DOCKER_HOST": "unix:///nonexistent.sock"}
    )
    assert no_engine.returncode == 1
    assert "no Docker engine answers" in no_engine.stderr and "run without --docker" in no_engine.stderr

    no_gpu = project.cascade("run", "--docker", "--gpus", "all", "train.py")
    assert no_gpu.returncode == 1
    assert "GPUs were asked for (--gpus all) but this machine has none" in no_gpu.stderr

    usage = project.cascade("run", "--gpus", "all", "train.py")
    assert usage.returncode == 2 and "go with --docker" in usage.stderr
    assert project.runs() == []

    missing = write_docker_project(tmp_path / "nobase", "cascade-test/absent:1", wheelhouse)
    refused = missing.cascade("run", "--docker", "train.py")
    assert refused.returncode == 1
    assert "the base image cascade-test/absent:1 is not here and cannot be pulled" in refused.stderr
    assert missing.runs() == []

    broken = write_docker_project(tmp_path / "broken", base_image, wheelhouse)
    broken.write("requirements.lock", "no-such-package-anywhere==1.0\n")
    broken.commit("a requirement the wheelhouse lacks")
    failed = broken.cascade("run", "--docker", "train.py")
    assert failed.returncode == 1
    assert "failed" in failed.stderr and "the full build log is" in failed.stderr
    log = Path(failed.stderr.split("the full build log is ")[1].split(";")[0].strip())
    assert "no-such-package-anywhere" in log.read_text()
    assert broken.runs() == []


def test_docker_enabled_in_cascade_yaml_makes_it_the_default(docker_project: Project) -> None:
    project = docker_project
    settings = (project.root / "cascade.yaml").read_text().replace("docker:\n", "docker:\n  enabled: true\n")
    project.write("cascade.yaml", settings)
    project.commit("docker by default")
    inside = project.record("train.py")
    outside = project.record("--no-docker", "train.py")
    assert project.manifest(inside)["container"]["runtime"] == "docker"
    assert project.manifest(outside)["container"].get("runtime") is None
    assert project.manifest(outside)["python"]["executable"] != "/opt/venv/bin/python"
    # A run recorded on the host, restored in the project's image: built (or reused), drift reported.
    project.cascade("tag", outside, "host-v1", check=True)
    restored = project.cascade("restore", "host-v1", "--docker", "--json")
    assert restored.returncode == 0, restored.stderr
    data = _json(restored)
    assert "the run was not recorded in Docker" in restored.stderr
    assert data["image"]["source"] == "rebuilt" and data["image"]["runtime"] == "docker"
    drifted = {c["name"]: c for c in data["image"]["drift"]}
    assert drifted["mlflow"]["now"] is None  # on the host, not in the image: reported before the run
    assert data["verdict"]["verdict"] == "BITWISE_IDENTICAL"  # same torch, numpy and xxhash inside
    assert project.manifest(data["run"]["run_id"])["container"]["image_id"] == data["image"]["image_id"]


def test_sigkill_of_cascade_stops_the_container_and_the_next_command_recovers_the_run(
    docker_project: Project, docker_client: Any
) -> None:
    """PR_SET_PDEATHSIG does not reach into a container: recovery stops it by its run-directory
    label (SIGTERM, so the script flushes), removes it, and delivers what it wrote."""
    project = docker_project
    ready = project.root / "out" / "ready"
    process = subprocess.Popen([*CASCADE, "run", "--docker", "train.py", "--hang"], cwd=project.root,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 240
    while not ready.exists() and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.2)
    assert ready.exists(), process.stderr.read() if process.poll() is not None else "script never got ready"
    time.sleep(2.0)  # the parent opens the run meanwhile
    process.kill()
    process.wait(timeout=30)
    assert docker_client.containers.list(filters={"label": "cascade.run_dir"})  # orphaned, still training
    listed = project.cascade("ls")
    assert listed.returncode == 0 and "stopping container" in listed.stderr, listed.stderr
    assert docker_client.containers.list(all=True, filters={"label": "cascade.run_dir"}) == []
    (run,) = project.runs()
    assert run.info.status == "KILLED"
    steps = [m.step for m in project.client().get_metric_history(run.info.run_id, "loss")]
    assert steps == list(range(12))  # every step the script logged before it hung (steps: 12)


def test_a_restore_after_a_killed_docker_restore_stops_its_container_first(
    docker_project: Project, docker_client: Any
) -> None:
    """`cascade restore v1 --docker` SIGKILLed during its re-run: the container gets no signal
    (PR_SET_PDEATHSIG does not cross into it) and goes on writing in the worktree. The next restore
    into it must stop it first, before it writes there: the recovery it runs before opening the store
    finds the dead run in the worktree's spool and stops its container by the run directory's label.
    Then it reproduces, and no container is left."""
    from tests.plugin import SCRIPTS

    project = docker_project
    project.write("faults.py", (SCRIPTS / "faults.py").read_text())
    project.commit("a script that can hold")
    holding = project.root / "out" / "holding"  # (the project's root is in the container: the store is)
    recorded = project.cascade("run", "--docker", "--tag", "v1", "faults.py", "--steps", "6",
                               "--hold-at", "2", "--hold-s", "300", "--hold-while", str(holding))  # fmt: skip
    assert recorded.returncode == 0, recorded.stderr
    holding.parent.mkdir(exist_ok=True)
    holding.touch()
    first = subprocess.Popen([*CASCADE, "restore", "v1", "--docker"], cwd=project.root, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             start_new_session=True)  # fmt: skip
    held = project.root / ".cascade" / "restore" / "v1" / "out" / "hold"
    second = None
    try:
        deadline = time.monotonic() + 240
        while not held.exists():
            assert first.poll() is None and time.monotonic() < deadline, "the restore's re-run never held"
            time.sleep(0.2)
        first.kill()
        first.wait(timeout=30)
        (orphan,) = docker_client.containers.list(filters={"label": "cascade.run_dir"})  # still holding
        second = subprocess.Popen([*CASCADE, "restore", "v1", "--docker", "--json"], cwd=project.root,
                                  text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
        assert second.stderr is not None
        said = []
        for line in second.stderr:  # (until it stops the orphan: its own re-run must not hold)
            said.append(line)
            if "stopping container" in line:
                break
        assert f"stopping container {orphan.short_id}" in "".join(said), "".join(said)
        holding.unlink()
        out, err = second.communicate(timeout=300)
    finally:
        holding.unlink(missing_ok=True)
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.kill()
    assert second.returncode == 0, err
    assert json.loads(out)["data"]["verdict"]["verdict"] == "BITWISE_IDENTICAL"
    assert docker_client.containers.list(all=True, filters={"label": "cascade.run_dir"}) == []
