"""A repository whose path is not ASCII (a tester's `prøject 日本`): `cascade init` stopped at
DVC's config writer (UnicodeEncodeError: 'ascii' codec) with the project half set up, no remote, and
a second `init` failing the same way."""

from __future__ import annotations

import shlex
from pathlib import Path

from tests.plugin import SCRIPTS, Project, git


def test_init_and_a_run_in_a_repository_whose_path_is_not_ascii(tmp_path: Path) -> None:
    root = tmp_path / "prøject 日本"
    root.mkdir()
    git(root, "init", "-q")
    project = Project(root)
    project.write("train.py", (SCRIPTS / "train.py").read_text())
    project.write("hyperparameters.yaml", "seed: 3\nsteps: 3\noptimizer:\n  lr: 0.1\n  momentum: 0.9\n"
                                          "model:\n  hidden: 4\n")  # fmt: skip
    project.commit("initial")
    result = project.invoke("init")
    assert result.returncode == 0, result.stderr
    local = (root / ".dvc" / "config.local").read_text(encoding="utf-8")
    assert "cascade-local" in local and "prøject" in local  # the remote, named after the project
    again = project.invoke("init")
    assert again.returncode == 0, again.stderr
    project.commit("cascade init")
    ran = project.cascade("run", "train.py", check=True)
    (run,) = project.runs()
    assert run.info.status == "FINISHED"
    (see,) = [line for line in ran.stderr.splitlines() if "mlflow ui --backend-store-uri" in line]
    command = shlex.split(see.split("·", 1)[1])  # what a user pastes into a shell (it split at the space)
    assert command == ["mlflow", "ui", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}"]
