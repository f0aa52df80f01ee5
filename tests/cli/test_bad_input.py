"""Bad input: a clear message naming the fix, the right exit code, and nothing half-written."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.conftest import Project, git


def _nothing_recorded(project: Project) -> None:
    assert project.runs() == []
    assert not (project.root / "out").exists(), "the script must not have started"
    runs_dir = project.root / ".cascade" / "runs"
    assert not runs_dir.exists() or not any(runs_dir.iterdir())


def test_not_a_git_repository(project: Project, tmp_path: Path) -> None:
    elsewhere = tmp_path / "plain"
    elsewhere.mkdir()
    (elsewhere / "train.py").write_text("print('hi')\n")
    result = Project(elsewhere).cascade("run", "train.py")
    assert result.returncode == 1
    assert "not inside a git repository" in result.stderr and "git init" in result.stderr


def test_repository_without_commit(tmp_path: Path) -> None:
    root = tmp_path / "fresh"
    root.mkdir()
    git(root, "init", "-q")
    (root / "train.py").write_text("print('hi')\n")
    result = Project(root).cascade("run", "train.py")
    assert result.returncode == 1
    assert "no commit yet" in result.stderr and "git commit" in result.stderr


def test_script_not_found(project: Project) -> None:
    result = project.cascade("run", "trian.py")
    assert result.returncode == 2
    assert "script not found: trian.py" in result.stderr
    _nothing_recorded(project)


def test_malformed_yaml_names_file_and_line(project: Project) -> None:
    project.write("hyperparameters.yaml", "seed: 1\noptimizer:\n  lr: 0.1\n   momentum: [0.9\n")
    result = project.cascade("run", "train.py")
    assert result.returncode == 1
    assert "malformed YAML in" in result.stderr and "hyperparameters.yaml:4" in result.stderr
    _nothing_recorded(project)


def test_malformed_cascade_yaml(project: Project) -> None:
    project.write("cascade.yaml", "determinism: sometimes\n")
    result = project.cascade("run", "train.py")
    assert result.returncode == 1
    assert "determinism must be off, warn or strict" in result.stderr
    _nothing_recorded(project)
    project.write("cascade.yaml", "trace_grads: sometimes\n")
    result = project.cascade("run", "train.py")
    assert result.returncode == 1
    assert "trace_grads must be true, false or auto, not 'sometimes'" in result.stderr
    _nothing_recorded(project)


def test_unknown_override_key_names_the_closest(project: Project) -> None:
    result = project.cascade("run", "--set", "optimiser.lr=0.2", "train.py")
    assert result.returncode == 2
    assert "no such key" in result.stderr and "did you mean optimizer.lr?" in result.stderr
    assert "--add optimiser.lr" in result.stderr
    _nothing_recorded(project)


def test_unreachable_store(project: Project) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again below: nothing listens there
    result = project.cascade("run", "train.py", env={"MLFLOW_TRACKING_URI": f"http://127.0.0.1:{port}"})
    assert result.returncode == 1
    assert "unreachable" in result.stderr and "MLFLOW_TRACKING_URI" in result.stderr
    _nothing_recorded(project)


def test_require_clean_refuses_a_dirty_tree(project: Project) -> None:
    project.write("train.py", (project.root / "train.py").read_text() + "# edit\n")
    result = project.cascade("run", "--require-clean", "train.py")
    assert result.returncode == 1
    assert "uncommitted changes (train.py)" in result.stderr and "commit or stash" in result.stderr
    _nothing_recorded(project)


@pytest.mark.slow
def test_require_clean_accepts_a_clean_tree_and_show_suggests_close_ids(project: Project) -> None:
    project.cascade("run", "--require-clean", "train.py", check=True)
    run_id = project.only_run().info.run_id
    typo = run_id[:-1] + ("0" if run_id[-1] != "0" else "1")
    result = project.cascade("show", typo)
    assert result.returncode == 1
    assert f"no run '{typo}'" in result.stderr and f"did you mean {run_id}" in result.stderr


def test_bad_seed_is_a_usage_error(project: Project) -> None:
    result = project.cascade("run", "--seed", "abc", "train.py")
    assert result.returncode == 2 and "--seed must be an integer or 'random'" in result.stderr
    _nothing_recorded(project)


def test_a_run_not_made_by_cascade_is_named_as_such(project: Project) -> None:
    client = project.client()
    experiment = client.create_experiment("plain", artifact_location=(project.root / "mlruns").as_uri())
    foreign = client.create_run(experiment).info.run_id
    for command in (["show", foreign], ["verify", foreign, foreign]):
        result = project.cascade(*command)
        assert result.returncode == 1
        assert f"run {foreign} has no cascade record" in result.stderr
        assert "not made by `cascade run`" in result.stderr
