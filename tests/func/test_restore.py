"""`cascade run --tag`, `cascade tag`, `cascade restore` on real git repos, MLflow stores and torch runs."""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from tests.plugin import Project, git

pytestmark = pytest.mark.slow


def _restore(project: Project, *args: str, cwd: Path | None = None,
             env: dict[str, str] | None = None) -> tuple[int, dict[str, Any], str]:  # fmt: skip
    if cwd is None:
        result = project.cascade("restore", *args, "--json", env=env)
    else:
        result = Project(cwd).cascade("restore", *args, "--json", env=env)
    data = json.loads(result.stdout)["data"] if result.stdout.strip() else {}
    return result.returncode, data, result.stderr


def _artifact_dir(project: Project, run_id: str) -> Path:
    return Path(urlparse(project.client().get_run(run_id).info.artifact_uri).path)


@pytest.fixture
def tagged(project: Project) -> tuple[Project, str, str]:
    """v1: a run with a tracked change and an untracked file, then the code moves on."""
    project.write("train.py", (project.root / "train.py").read_text() + "# tuned by hand\n")
    project.write("notes/extra.txt", "untracked, read by nobody, restored all the same\n")
    commit = git(project.root, "rev-parse", "HEAD").strip()
    run_id = project.record("--tag", "v1", "train.py")
    snapshot = project.root.parent / "as-run"
    snapshot.mkdir()
    for name in ("train.py", "hyperparameters.yaml"):
        (snapshot / name).write_bytes((project.root / name).read_bytes())
    git(project.root, "stash", "-u", "-q")
    project.write(
        "hyperparameters.yaml", (project.root / "hyperparameters.yaml").read_text().replace("0.1", "0.3")
    )
    project.commit("later: another learning rate")
    return project, run_id, commit


def test_tag_is_an_mlflow_tag_and_an_annotated_git_tag(tagged: tuple[Project, str, str]) -> None:
    project, run_id, commit = tagged
    run = project.client().get_run(run_id)
    assert run.data.tags["cascade.version"] == "v1"
    assert git(project.root, "rev-list", "-n1", "v1").strip() == commit
    assert git(project.root, "cat-file", "-t", "v1").strip() == "tag"  # annotated
    message = git(project.root, "tag", "-l", "--format=%(contents)", "v1")
    assert f"cascade-run: {run_id}" in message and "dirty: true" in message
    listed = json.loads(project.cascade("ls", "--versions", "--json", check=True).stdout)["data"]
    assert [(r["run_id"], r["version"]) for r in listed] == [(run_id, "v1")]


def test_restore_rebuilds_the_dirty_state_and_reproduces_bit_for_bit(
    tagged: tuple[Project, str, str],
) -> None:
    project, run_id, commit = tagged
    head_before = git(project.root, "rev-parse", "HEAD").strip()
    code, data, stderr = _restore(project, "v1")
    assert code == 0, stderr
    assert data["verdict"]["verdict"] == "BITWISE_IDENTICAL"
    assert data["verdict"]["steps"] == {"a": 20, "b": 20, "compared": 20}
    new_id = data["run"]["run_id"]
    new = project.client().get_run(new_id)
    assert new.data.tags["cascade.restored_from"] == run_id
    assert new.data.tags["cascade.verdict"] == "BITWISE_IDENTICAL"
    original, restored = project.manifest(run_id), project.manifest(new_id)
    assert restored["git"]["commit"] == commit
    assert restored["git"]["patch"]["sha256"] == original["git"]["patch"]["sha256"]
    assert restored["git"]["untracked"] == original["git"]["untracked"]
    assert restored["params"]["values"]["optimizer"]["lr"] == 0.1  # HEAD now says 0.3
    assert restored["experiment"] == original["experiment"]
    worktree = Path(data["worktree"]["path"])
    assert worktree == project.root / ".cascade" / "restore" / "v1"
    assert git(worktree, "rev-parse", "HEAD").strip() == commit
    assert (worktree / "notes" / "extra.txt").read_text().startswith("untracked")
    snapshot = project.root.parent / "as-run"
    for name in ("train.py", "hyperparameters.yaml"):  # byte for byte as the run had them
        assert (worktree / name).read_bytes() == (snapshot / name).read_bytes()
    assert restored["torch"]["num_threads"] == original["torch"]["num_threads"]
    # the user's checkout is untouched
    assert git(project.root, "rev-parse", "HEAD").strip() == head_before
    assert git(project.root, "status", "--porcelain").strip() == ""
    assert "0.3" in (project.root / "hyperparameters.yaml").read_text()


def test_restore_reuses_an_unchanged_worktree_and_refuses_a_modified_one(
    tagged: tuple[Project, str, str],
) -> None:
    project, _, commit = tagged
    runs_before = len(project.runs())
    code, first, stderr = _restore(project, "v1", "--no-run")
    assert code == 0, stderr
    assert first["run"] is None and first["worktree"]["reused"] is False
    assert sorted(first["worktree"]["restored_files"]) == ["notes/extra.txt"]
    code, again, stderr = _restore(project, "v1", "--no-run")
    assert code == 0 and again["worktree"]["reused"] is True
    worktree = Path(again["worktree"]["path"])
    (worktree / "train.py").write_text("print('my experiment')\n")
    code, _, stderr = _restore(project, "v1", "--no-run")
    assert code == 1 and "was modified since the last restore" in stderr
    assert (worktree / "train.py").read_text() == "print('my experiment')\n"  # not clobbered
    assert len(project.runs()) == runs_before
    assert git(worktree, "rev-parse", "HEAD").strip() == commit


def test_the_command_restore_no_run_prints_records_into_the_project_s_store(
    tagged: tuple[Project, str, str], tmp_path: Path,
) -> None:
    """`run it: cd WORKTREE && cascade run ...` recorded into a new mlflow.db in the worktree, invisible
    to the project's `cascade ls` and `verify v1 RUN`; a directory that is not a restore worktree was
    refused with a hint (`git worktree remove`) that fails there."""
    import os
    import subprocess
    import sys

    project, _, _ = tagged
    plain = tmp_path / "my files"
    plain.mkdir()
    (plain / "mine.txt").write_text("keep")
    code, _, stderr = _restore(project, "v1", "--no-run", "--workdir", str(plain))
    assert code == 1 and "is not a cascade restore worktree" in stderr
    assert "git worktree remove" not in stderr and "--workdir" in stderr
    result = project.cascade("restore", "v1", "--no-run")
    assert result.returncode == 0, result.stderr
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("cascade: run it: ")]
    runs_before = {r.info.run_id for r in project.runs()}
    on_path = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}  # (cascade)
    subprocess.run(["bash", "-c", line.removeprefix("cascade: run it: ")], check=True, capture_output=True,
                   timeout=300, env=on_path)  # fmt: skip
    (new,) = {r.info.run_id for r in project.runs()} - runs_before
    assert project.cascade("verify", "v1", new).returncode == 0


def test_restore_steps_reruns_and_verifies_a_prefix(tagged: tuple[Project, str, str]) -> None:
    project, _, _ = tagged
    code, data, stderr = _restore(project, "v1", "--steps", "5")
    assert code == 0, stderr
    assert data["verdict"]["verdict"] == "BITWISE_IDENTICAL"
    assert data["verdict"]["steps"] == {"a": 5, "b": 5, "compared": 5}
    restored = project.manifest(data["run"]["run_id"])
    assert restored["trace"]["steps"] == 5 and restored["trace"]["stopped_after_steps"] == 5
    assert restored["outcome"]["status"] == "FINISHED"


def test_restore_sets_the_variables_the_script_read(project: Project) -> None:
    run_id = project.record("--tag", "perturbed", "train.py", env={"PERTURB_AT_STEP": "4"})
    assert project.manifest(run_id)["environment_read"]["PERTURB_AT_STEP"] == "4"
    code, data, stderr = _restore(project, "perturbed")
    assert code == 0, stderr
    assert data["plan"]["environment"]["PERTURB_AT_STEP"] == "4"
    assert data["verdict"]["verdict"] == "BITWISE_IDENTICAL"


def test_restore_that_cannot_set_a_secret_variable_exits_3_and_names_it(project: Project) -> None:
    # every facet every step, so that the write at step 4 is seen there (under the default budget the
    # weights may be read at other steps only: then the loss at step 5 shows it first, bracketed)
    run_id = project.record("--tag", "secret", "--trace-budget", "0", "train.py",
                            env={"PERTURB_SECRET_STEP": "4"})  # fmt: skip
    assert project.manifest(run_id)["environment_read"]["PERTURB_SECRET_STEP"] == "<redacted>"
    code, data, stderr = _restore(project, "secret")
    assert code == 3, stderr
    verdict = data["verdict"]
    assert verdict["verdict"] == "DIVERGED" and verdict["run_a"] == run_id
    assert verdict["first_divergence"]["step"] == 4
    assert any("PERTURB_SECRET_STEP" in c["summary"] for c in verdict["likely_causes"])
    assert project.client().get_run(data["run"]["run_id"]).data.tags["cascade.verdict"] == "DIVERGED"


def test_restore_from_a_fresh_clone_with_only_the_remote_and_the_store(
    tagged: tuple[Project, str, str], tmp_path: Path
) -> None:
    project, run_id, _ = tagged
    clone = tmp_path / "elsewhere"
    subprocess.run(["git", "clone", "-q", str(project.root), str(clone)], check=True)
    env = {"MLFLOW_TRACKING_URI": project.tracking_uri}
    code, data, stderr = _restore(project, "v1", cwd=clone, env=env)
    assert code == 0, stderr
    assert data["verdict"]["verdict"] == "BITWISE_IDENTICAL" and data["verdict"]["run_a"] == run_id
    assert Path(data["worktree"]["path"]) == clone / ".cascade" / "restore" / "v1"


def test_versions_are_unique_unless_forced_and_the_move_is_recorded(tagged: tuple[Project, str, str]) -> None:
    project, first, _ = tagged
    refused = project.cascade("run", "--tag", "v1", "train.py")
    assert refused.returncode == 1 and f"version v1 is already run {first}" in refused.stderr
    assert len([r for r in project.runs() if r.data.tags.get("cascade.version") == "v1"]) == 1
    second = project.record("train.py")
    head = git(project.root, "rev-parse", "HEAD").strip()
    assert project.cascade("tag", second, "v1").returncode == 1
    project.cascade("tag", second, "v1", "--force", check=True)
    old, new = project.client().get_run(first), project.client().get_run(second)
    assert "cascade.version" not in old.data.tags
    assert old.data.tags["cascade.version_moved"].startswith(f"v1 → {second}")
    assert new.data.tags["cascade.version"] == "v1" and new.data.tags["cascade.version_moved_from"] == first
    assert git(project.root, "rev-list", "-n1", "v1").strip() == head
    project.cascade("tag", second, "v1", check=True)  # again, the same run: nothing changes
    assert git(project.root, "rev-list", "-n1", "v1").strip() == head
    # a run carries one version: another label replaces it only when forced, and says so
    relabel = project.cascade("tag", second, "v2")
    assert relabel.returncode == 1 and f"run {second[:12]} is already version v1" in relabel.stderr
    assert project.client().get_run(second).data.tags["cascade.version"] == "v1"
    project.cascade("tag", second, "v2", "--force", check=True)
    tags = project.client().get_run(second).data.tags
    assert tags["cascade.version"] == "v2" and tags["cascade.version_replaced"].startswith("v1 → v2 at ")
    assert "no run 'v1'" in project.cascade("show", "v1").stderr
    bad = project.cascade("tag", second, "not a version")
    assert bad.returncode == 2 and "invalid version" in bad.stderr


def test_restore_refuses_tampered_and_unsafe_records_before_writing(
    tagged: tuple[Project, str, str], tmp_path: Path
) -> None:
    project, run_id, _ = tagged
    artifacts = _artifact_dir(project, run_id)
    worktree = project.root / ".cascade" / "restore" / "v1"

    unknown = project.cascade("restore", "v11")
    assert unknown.returncode == 1 and "did you mean v1" in unknown.stderr

    patch = artifacts / "cascade" / "git.patch"
    original_patch = patch.read_bytes()
    patch.write_bytes(original_patch.replace(b"tuned", b"tamed"))
    code, _, stderr = _restore(project, "v1")
    assert code == 1 and "does not match the sha256" in stderr
    assert not worktree.exists()
    patch.write_bytes(original_patch)

    record_file = artifacts / "cascade" / "run.json"
    original_record = record_file.read_text()
    record = json.loads(original_record)
    record["git"]["untracked"].append(
        {"path": "../../escaped.txt", "size": 1, "sha256": "0" * 64, "stored": True}
    )
    record_file.write_text(json.dumps(record))
    code, _, stderr = _restore(project, "v1")
    assert code == 1 and "escapes the worktree" in stderr
    assert not worktree.exists() and not (project.root.parent / "escaped.txt").exists()

    record = json.loads(original_record)
    record["git"]["commit"] = "0123456789abcdef0123456789abcdef01234567"
    record_file.write_text(json.dumps(record))
    code, _, stderr = _restore(project, "v1")
    assert code == 1 and "is not in this repository" in stderr and "git fetch" in stderr
    assert not worktree.exists()

    # history rewritten under the record: its commit now names one where the patch cannot apply
    project.write("train.py", (project.root / "train.py").read_text() + "# a line where the patch goes\n")
    rewritten = project.commit("conflicting edit")
    record = json.loads(original_record)
    record["git"]["commit"] = rewritten
    record_file.write_text(json.dumps(record))
    code, _, stderr = _restore(project, "v1")
    assert code == 1 and "does not apply" in stderr
    assert not worktree.exists() and len(git(project.root, "worktree", "list").splitlines()) == 1
    record_file.write_text(original_record)


GRACEFUL = """\
import sys
import time
from pathlib import Path

import torch

model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(64, 8)
try:
    for step in range(400):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True)).backward()
        opt.step()
        if step == 150:
            Path("out").mkdir(exist_ok=True)
            Path("out/hold").touch()
            while Path(sys.argv[1]).exists():  # the test's run: until its Ctrl-C; not its restore
                time.sleep(0.05)
except KeyboardInterrupt:
    print("Exiting from training early")
torch.save(model.state_dict(), "out/model.pt")
"""


def test_restore_of_a_run_the_script_ended_itself_on_ctrl_c_reruns_the_steps_it_ran(project: Project) -> None:
    """pytorch/examples' word_language_model catches KeyboardInterrupt and exits 0: the run was
    FINISHED with the signal recorded, and its restore re-ran all 400 steps ("INCOMPARABLE: the
    runs have 151 and 400 steps"), exit 3. A Ctrl-C decided where it ended, as for a KILLED run."""
    import signal

    from tests.faults.helpers import Background, marker

    project.write("graceful.py", GRACEFUL)
    project.commit("a script that stops cleanly on Ctrl-C")
    holding = project.root.parent / "holding"
    holding.touch()
    run = Background(project, "--trace-budget", "0", "graceful.py", str(holding))
    run.wait_for(lambda: marker(project, "hold").exists(), "step 150")
    run.process.send_signal(signal.SIGINT)
    run.finish()
    holding.unlink()
    stopped = project.only_run()
    recorded = project.manifest(stopped.info.run_id)
    assert recorded["outcome"]["signal"] == signal.SIGINT and recorded["trace"]["steps"] == 151
    code, data, stderr = _restore(project, stopped.info.run_id[:12])
    assert code == 0, stderr
    assert "the recorded run stopped on SIGINT (the script ended itself, FINISHED) after 151 steps" in stderr
    assert data["verdict"]["verdict"] == "BITWISE_IDENTICAL"
    assert data["verdict"]["steps"]["a"] == data["verdict"]["steps"]["b"] == 151


def test_restore_of_a_killed_run_reruns_the_steps_it_ran(project: Project) -> None:
    """A run stopped by Ctrl-C after step 150 of 400: its restore re-ran all 400 steps and said
    INCOMPARABLE ("the runs have 151 and 400 steps"), exit 3. The re-run stops where the recorded one
    did, and the verdict is about those steps. (A tiny budget thins the records after the first 128:
    the steps it ran are its last record's step + 1, not its count of records.)"""
    import signal

    from tests.faults.helpers import Background, add_faults_script, marker

    add_faults_script(project)
    holding = project.root.parent / "holding"  # held until the Ctrl-C, however late a loaded machine
    holding.touch()  # delivers it (3 s was once too short); not for the restore's re-run
    run = Background(project, "--trace-budget", "0.0001", "faults.py", "--steps", "400", "--hold-at", "150",
                     "--hold-s", "300", "--hold-while", str(holding))  # fmt: skip
    run.wait_for(lambda: marker(project, "hold").exists(), "step 150")
    run.process.send_signal(signal.SIGINT)
    assert run.finish() == 130, run.stderr
    holding.unlink()
    killed = project.only_run()
    recorded = project.manifest(killed.info.run_id)
    assert recorded["outcome"]["status"] == "KILLED" and recorded["trace"]["steps"] < 151  # records
    code, data, stderr = _restore(project, killed.info.run_id[:12])
    assert code == 0, stderr
    assert "KILLED after 151 steps" in stderr
    assert data["verdict"]["verdict"] == "BITWISE_IDENTICAL"
    assert data["verdict"]["steps"]["a"] == data["verdict"]["steps"]["b"] == 151
    restored = project.manifest(data["run"]["run_id"])
    assert restored["trace"]["stopped_after_steps"] == 151 and restored["outcome"]["status"] == "FINISHED"


def test_a_second_restore_into_a_worktree_in_use_is_refused_naming_the_first(project: Project) -> None:
    """Two `cascade restore v1` at once: the second found the first's half-made worktree and said
    "exists and is not a cascade restore worktree". It is told that another restore holds it."""

    from tests.faults.helpers import add_faults_script

    add_faults_script(project)
    holding = _record_one_that_holds_in_its_restores(project)
    first = _restore_held_in_its_rerun(project, "--json")
    second = project.cascade("restore", "v1")
    assert second.returncode == 1, second.stderr
    said = " ".join(second.stderr.split())
    assert f"another cascade restore is using {project.root / '.cascade' / 'restore' / 'v1'} (pid " \
        f"{first.pid})" in said and "--workdir" in said, said  # fmt: skip
    holding.unlink()
    out, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    assert json.loads(out)["data"]["verdict"]["verdict"] == "BITWISE_IDENTICAL"


def test_a_restore_killed_during_its_rerun_can_be_restored_again(project: Project) -> None:
    """`cascade restore v1` SIGKILLed while its re-run trained: the next restore refused ("the restore
    worktree was modified since the last restore (untracked: out/...)"), and the hint, `git worktree
    remove --force`, deleted the cut re-run's spool (its run RUNNING for ever). Now the next restore
    reuses the worktree: the cut re-run's files are its outputs; its run is recovered, KILLED, by the
    next cascade command in the worktree (the next restore's re-run, or any command there). A file
    added since is told apart from them by nothing: every new file is moved aside, never deleted."""
    import os
    import signal

    from tests.faults.helpers import add_faults_script, process_gone

    add_faults_script(project)
    project.write(".gitignore", "mlflow.db\nmlruns/\n.cascade/\n")  # out/ not ignored: untracked files
    project.commit("outputs not ignored")
    holding = _record_one_that_holds_in_its_restores(project)
    first = _restore_held_in_its_rerun(project)
    os.kill(first.pid, signal.SIGKILL)
    first.wait(timeout=30)
    holding.unlink()
    worktree = project.root / ".cascade" / "restore" / "v1"
    (worktree / "notes.txt").write_text("mine, written after the kill\n")  # never deleted
    code, data, stderr = _restore(project, "v1")
    assert code == 0, stderr
    assert data["verdict"]["verdict"] == "BITWISE_IDENTICAL"
    assert not (worktree / "notes.txt").exists()  # the re-run started from the recorded state ...
    (aside,) = (project.root / ".cascade" / "set-aside").iterdir()  # ... and it was moved aside
    assert (aside / "notes.txt").read_text() == "mine, written after the kill\n"
    assert "moved the" in stderr and str(aside) in " ".join(stderr.split()), stderr
    project.cascade("ls", check=True)  # (the next command delivers a dead re-run's spool, as any run's)
    statuses = sorted(r.data.tags.get("cascade.status", "") for r in project.runs())
    assert statuses.count("KILLED") == 1, statuses  # the cut re-run, recovered
    assert not [r for r in project.runs() if r.info.status == "RUNNING"]
    assert process_gone(first.pid)


def test_ctrl_c_during_a_restore_ends_it_as_interrupted_without_a_verdict(project: Project) -> None:
    """Found on nanoGPT: Ctrl-C during `cascade restore v3` ended the re-run KILLED (130), then judged
    the cut re-run against the whole recorded run, INCOMPARABLE, recorded that verdict on it and exited
    3: a user's abort read as "not reproduced" by a script or CI."""
    import signal

    from tests.faults.helpers import add_faults_script

    add_faults_script(project)
    holding = _record_one_that_holds_in_its_restores(project)
    restoring = _restore_held_in_its_rerun(project)
    restoring.send_signal(signal.SIGINT)  # (the parent forwards it to the re-run, as a terminal's would)
    _, stderr = restoring.communicate(timeout=300)
    holding.unlink()
    assert restoring.returncode == 130, stderr
    assert "INCOMPARABLE" not in stderr and "interrupted" in stderr and "no verdict" in stderr, stderr
    tags = [r.data.tags for r in project.runs()]
    assert not [t for t in tags if "cascade.verdict" in t], tags  # nothing judged, nothing recorded
    code, data, stderr = _restore(project, "v1")  # and the next restore re-runs it whole
    assert code == 0, stderr
    assert data["verdict"]["verdict"] == "BITWISE_IDENTICAL"


DIES_OF_A_SIGNAL_IN_THE_RERUN = """
import os, signal, sys, torch
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(6):
    opt.zero_grad(); model(torch.randn(8, 4)).pow(2).mean().backward(); opt.step()
    if step == 2 and os.path.exists(sys.argv[1]):  # (there for the re-run only: the OOM killer, as it were)
        os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_rerun_killed_by_a_signal_nobody_sent_to_restore_is_still_judged(
    project: Project, tmp_path: Path
) -> None:
    """From a review of the Ctrl-C fix: a re-run that died of a signal of its own (the OOM killer, a
    segfault) was taken for the user's interrupt: no verdict, exit 137. It did not reproduce."""
    flag = tmp_path / "die"
    project.write("dies.py", DIES_OF_A_SIGNAL_IN_THE_RERUN)
    project.commit("dies in the re-run")
    project.record("--tag", "v-dies", "dies.py", str(flag))
    flag.write_text("")
    code, data, stderr = _restore(project, "v-dies")
    assert code == 3, stderr
    assert "interrupted" not in stderr and data["interrupted"] is None, stderr
    assert data["verdict"]["verdict"] != "BITWISE_IDENTICAL", data["verdict"]


def test_a_restore_killed_in_a_worktree_of_its_own_is_recovered_by_the_projects_commands(
    project: Project, tmp_path: Path
) -> None:
    """A restore into `--workdir` elsewhere, killed during its re-run: its run stayed RUNNING until a
    command was run in that directory (the project's commands looked in `.cascade/restore/` only)."""
    import os
    import signal

    from tests.faults.helpers import add_faults_script, process_gone

    add_faults_script(project)
    holding = _record_one_that_holds_in_its_restores(project)
    elsewhere = tmp_path / "my restores" / "v1"
    first = _restore_held_in_its_rerun(project, workdir=elsewhere)
    os.kill(first.pid, signal.SIGKILL)
    first.wait(timeout=30)
    holding.unlink()
    (owner,) = (elsewhere / ".cascade" / "runs").glob("*/parent.json")
    assert process_gone(int(json.loads(owner.read_text()).get("child_pid") or first.pid))  # (its script)
    project.cascade("ls", check=True)
    statuses = sorted(r.data.tags.get("cascade.status", "") for r in project.runs())
    assert statuses.count("KILLED") == 1, statuses
    assert not [r for r in project.runs() if r.info.status == "RUNNING"]


UNWINDS_SLOWLY = """
import signal, sys, time
from pathlib import Path

import torch


def unwind(signum, frame):  # a script's own clean-up on SIGTERM, which takes a while
    while Path(sys.argv[2]).exists():
        time.sleep(0.05)
    Path("out/unwound").write_text(str(time.time()))
    sys.exit(143)


signal.signal(signal.SIGTERM, unwind)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
Path("out").mkdir(exist_ok=True)
for step in range(4):
    opt.zero_grad(); model(torch.ones(8, 4)).pow(2).mean().backward(); opt.step()
    if step == 1:
        Path("out/hold").write_text("1")
        while Path(sys.argv[1]).exists():
            time.sleep(0.05)
"""


def test_a_restore_after_a_killed_one_waits_for_its_rerun_to_stop(project: Project) -> None:
    """`cascade restore v1` SIGKILLed: its re-run is told to stop (SIGTERM), but a script's own clean-up
    may take a while, and the next restore into the same worktree did not wait: the worktree lock
    was the dead restore's alone. It now waits for the re-run (by its run directory), and says so."""
    import os
    import signal

    from tests.plugin import CASCADE

    holding, unwinding = project.root.parent / "holding", project.root.parent / "unwinding"
    project.write("unwinds.py", UNWINDS_SLOWLY)
    project.commit("a script that cleans up slowly on SIGTERM")
    project.record("--tag", "v1", "unwinds.py", str(holding), str(unwinding))
    unwinding.touch()
    first = _restore_held_in_its_rerun(project)
    second = None
    try:
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
        holding.unlink()
        second = subprocess.Popen([*CASCADE, "restore", "v1", "--json"], cwd=project.root, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
        assert second.stderr is not None
        said = []
        for line in second.stderr:  # (until it waits: the killed re-run is still cleaning up)
            said.append(line)
            if "waiting for the re-run of an earlier cascade restore" in line:
                break
        assert "waiting for the re-run" in "".join(said), "".join(said)
        unwinding.unlink()
        out, err = second.communicate(timeout=300)
    finally:
        for each in (holding, unwinding):
            each.unlink(missing_ok=True)
        if second is not None and second.poll() is None:
            second.kill()
    assert second.returncode == 0, err
    data = json.loads(out)["data"]
    # what the killed re-run wrote as it ended (in the worktree, or set aside): before the next began
    (unwound_at,) = [float(p.read_text()) for p in (project.root / ".cascade").rglob("unwound")]
    started_at = project.client().get_run(data["run"]["run_id"]).info.start_time / 1000
    assert started_at > unwound_at, (started_at, unwound_at)
    assert data["verdict"]["verdict"] == "BITWISE_IDENTICAL"


def _record_one_that_holds_in_its_restores(project: Project) -> Path:
    """v1, a run of faults.py whose re-runs hold after step 2 for as long as the file returned exists
    (a test acts on a restore meanwhile, however slowly a loaded machine lets it; then removes it)."""
    holding = project.root.parent / "holding"
    project.record("--tag", "v1", "faults.py", "--steps", "6", "--hold-at", "2", "--hold-s", "300",
                   "--hold-while", str(holding))  # fmt: skip
    return holding


def _restore_held_in_its_rerun(project: Project, *options: str,
                               workdir: Path | None = None) -> subprocess.Popen[str]:  # fmt: skip
    """`cascade restore v1` started, returned once its re-run of faults.py holds (out/hold) while
    the file of `_record_one_that_holds_in_its_restores` exists."""
    from tests.plugin import CASCADE

    (project.root.parent / "holding").touch()
    where = ("--workdir", str(workdir)) if workdir is not None else ()
    started = subprocess.Popen([*CASCADE, "restore", "v1", *where, *options], cwd=project.root, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    held = (workdir or project.root / ".cascade" / "restore" / "v1") / "out" / "hold"
    deadline = time.monotonic() + 120
    while not held.exists():
        assert started.poll() is None and time.monotonic() < deadline, "the restore's re-run never held"
        time.sleep(0.1)
    return started


RESUMES = """
import os
import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
start = 0
if os.path.exists("ckpt/last.pt"):  # resume where the last run left off, as many scripts do
    state = torch.load("ckpt/last.pt")
    model.load_state_dict(state["model"])
    start = state["step"]
for step in range(start, 6):
    opt.zero_grad()
    model(torch.randn(8, 4)).pow(2).mean().backward()
    opt.step()
os.makedirs("ckpt", exist_ok=True)
torch.save({"model": model.state_dict(), "step": 6}, "ckpt/last.pt")
print("trained from step", start)
"""


def test_a_reused_worktree_has_no_ignored_outputs_of_the_last_re_run(project: Project) -> None:
    """A re-run's outputs that git ignores (a checkpoints directory) stayed in the worktree: restoring
    the run again resumed from the last re-run's checkpoint and trained no step (INCOMPARABLE). A
    reused worktree is the restore's again, ignored files included; an ignored file someone added
    after the re-run is not the re-run's to remove, one they changed is moved aside, and nothing is
    removed through a directory made a symlink since."""
    project.write("resume.py", RESUMES)
    project.write(".gitignore", (project.root / ".gitignore").read_text() + "ckpt\nscratch/\n")
    project.commit("a script that resumes")
    project.record("--tag", "v-resume", "resume.py")
    code, first, stderr = _restore(project, "v-resume")
    assert code == 0 and first["verdict"]["verdict"] == "BITWISE_IDENTICAL", stderr
    worktree = Path(first["worktree"]["path"])
    assert (worktree / "ckpt" / "last.pt").is_file()
    (worktree / "scratch").mkdir()
    (worktree / "scratch" / "mine.txt").write_text("my notes on the re-run")
    code, again, stderr = _restore(project, "v-resume")
    assert again["worktree"]["reused"] is True, stderr
    assert code == 0 and again["verdict"]["verdict"] == "BITWISE_IDENTICAL", (again["verdict"], stderr)
    assert "removed 1 file(s) the last re-run wrote" in stderr, stderr
    assert (worktree / "scratch" / "mine.txt").read_text() == "my notes on the re-run"

    (worktree / "ckpt" / "last.pt").write_bytes(b"fine-tuned since, by hand")
    code, _, stderr = _restore(project, "v-resume", "--no-run")
    assert code == 0 and "moved 1 it wrote, changed since" in stderr, stderr
    (aside,) = (project.root / ".cascade" / "set-aside").iterdir()
    assert (aside / "ckpt" / "last.pt").read_bytes() == b"fine-tuned since, by hand"

    code, _, stderr = _restore(project, "v-resume")  # the re-run writes ckpt/last.pt again
    assert code == 0, stderr
    outside = project.root.parent / "elsewhere"
    (worktree / "ckpt").rename(outside)
    (worktree / "ckpt").symlink_to(outside)  # the same name, another directory now
    code, _, stderr = _restore(project, "v-resume", "--no-run")
    assert code == 0, stderr
    assert (outside / "last.pt").is_file()  # not the re-run's to remove


RESUMES_FOR_MORE = RESUMES.replace("range(start, 6)", "range(start, start + 3)").replace(
    '"step": 6}', '"step": start + 3}'
)


def test_a_run_resumed_from_a_checkpoint_it_saved_over_restores_again_and_without_running(
    project: Project, tmp_path: Path
) -> None:
    """Found on nanoGPT (`--init_from=resume`): its ckpt.pt is the run's input, read, then saved over
    as its checkpoint. A second restore found the last re-run's ckpt.pt in the reused worktree ("already
    has ckpt/last.pt with other bytes than the run's"), and `restore --no-run` into a new directory
    failed the same way: it placed the input as read and the last checkpoint at the same path."""
    project.cascade("init", check=True)
    project.write("resume.py", RESUMES_FOR_MORE)
    project.write(".gitignore", (project.root / ".gitignore").read_text() + "ckpt\n")
    project.commit("a script that resumes")
    project.record("resume.py")  # steps 0-2, then saves ckpt/last.pt
    project.record("--tag", "v-resumed", "resume.py")  # reads it, steps 3-5, saves over it
    records = [project.manifest(r.info.run_id) for r in project.runs()]
    (read,) = [i for record in records for i in record["inputs"] if i["path"] == "ckpt/last.pt"]
    for attempt in ("first", "reused"):
        code, data, stderr = _restore(project, "v-resumed")
        assert code == 0, (attempt, stderr)
        assert data["verdict"]["verdict"] == "BITWISE_IDENTICAL", (attempt, data["verdict"])
        assert data["worktree"]["reused"] is (attempt == "reused")
    fresh = tmp_path / "fresh"
    code, data, stderr = _restore(project, "v-resumed", "--no-run", "--workdir", str(fresh))
    assert code == 0, stderr
    placed = fresh / "ckpt" / "last.pt"  # as the run read it: the printed command re-runs from there
    assert hashlib.sha256(placed.read_bytes()).hexdigest() == read["sha256"], read


APPENDS = """
import os
import time

import torch

torch.manual_seed(open("state.txt").read().count("\\n"))  # what the run starts from: this file as it is
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    opt.zero_grad()
    model(torch.randn(8, 4)).pow(2).mean().backward()
    opt.step()
with open("state.txt", "a") as f:
    f.write("ran\\n")
if os.path.exists({flag!r}):
    open("hold", "w").write(str(os.getpid()))
    time.sleep(120)
"""


def test_an_untracked_input_a_killed_rerun_wrote_over_is_placed_again(project: Project) -> None:
    """Left from the last stop, tried with an untracked file that is not ignored: a script reads
    state.txt and appends to it (its bytes as read are kept in DVC). Restored twice, each re-run starts
    from the bytes the run read. But a restore killed after its re-run appended left the worktree
    unusable: the next one refused it ("modified since the last restore (untracked: hold,
    state.txt)"); only ignored inputs written over were moved aside. Now an untracked one is too, and
    it is placed again."""
    import os
    import signal

    from tests.faults.helpers import process_gone
    from tests.plugin import CASCADE

    flag = project.root.parent / "hold-after-append"
    project.write("appends.py", APPENDS.format(flag=str(flag)))
    project.cascade("init", check=True)  # (DVC keeps the bytes it read, which it then wrote over)
    project.commit("a script that appends to its state file")
    project.write("state.txt", "one\n")  # untracked, not ignored: in the record
    project.record("--tag", "s1", "appends.py")
    worktree = project.root / ".cascade" / "restore" / "s1"
    for attempt in range(2):  # the second reuses the worktree the first re-run wrote in
        code, data, stderr = _restore(project, "s1")
        assert code == 0, stderr
        assert data["verdict"]["verdict"] == "BITWISE_IDENTICAL", (attempt, data["verdict"]["summary"])
        assert (worktree / "state.txt").read_text() == "one\nran\n"  # (the re-run appended once)

    flag.write_text("")  # a restore killed after its re-run appended
    killed = subprocess.Popen([*CASCADE, "restore", "s1"], cwd=project.root, text=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 120
    while not ((worktree / "hold").exists() and (worktree / "hold").read_text()):
        assert killed.poll() is None and time.monotonic() < deadline, "the restore's re-run never held"
        time.sleep(0.1)
    os.kill(killed.pid, signal.SIGKILL)
    killed.wait(timeout=30)
    assert process_gone(int((worktree / "hold").read_text()), 30), "the re-run outlived its restore"
    flag.unlink()
    code, data, stderr = _restore(project, "s1")
    assert code == 0, stderr
    assert data["verdict"]["verdict"] == "BITWISE_IDENTICAL", data["verdict"]["summary"]
    assert (worktree / "state.txt").read_text() == "one\nran\n"  # placed again, appended to once
    (aside,) = (project.root / ".cascade" / "set-aside").iterdir()  # the cut re-run's, kept
    assert sorted(p.name for p in aside.iterdir()) == ["hold", "state.txt"]
    assert (aside / "state.txt").read_text() == "one\nran\n" and str(aside) in " ".join(stderr.split())
