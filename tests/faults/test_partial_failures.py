"""Defect 8: one failing part must not take the others with it.

A hyperparameter key over MLflow's 250 characters used to make the whole params batch fail, so 0
params were stored and `git.patch` was never uploaded although run.json said the run had a patch.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.plugin import Project

pytestmark = pytest.mark.slow

LONG = "k" * 300


def test_a_bad_param_key_costs_only_itself(project: Project, tmp_path: Path) -> None:
    project.write(
        "hyperparameters.yaml",
        "seed: 3\nsteps: 5\noptimizer:\n  lr: 0.1\n  momentum: 0.9\nmodel:\n  hidden: 16\n"
        f"{LONG}: 1\n'a@b': 1\n'a#b': 2\n",  # the last two are both a_b in MLflow: the store refuses one
    )
    project.commit("odd params")
    project.write("train.py", (project.root / "train.py").read_text() + "\n# uncommitted change\n")

    result = project.cascade("run", "train.py")
    assert result.returncode == 0, result.stderr
    assert "longer than MLflow's 250 characters" in result.stderr
    assert "refused param 'a_b'" in result.stderr
    run = project.only_run()
    params = run.data.params
    for key in ("optimizer.lr", "optimizer.momentum", "model.hidden", "steps", "seed"):
        assert key in params
    assert [k for k in params if k.startswith("kkkk")] == [next(k for k in params if k.startswith("kkkk"))]
    assert len(next(k for k in params if k.startswith("kkkk"))) <= 250
    assert params["a_b"] in ("1", "2")

    manifest = project.manifest(run.info.run_id)
    assert manifest["params"]["values"][LONG] == 1  # the record keeps the real key
    patch = manifest["git"]["patch"]
    assert patch["stored"] is True
    local = project.client().download_artifacts(run.info.run_id, patch["artifact"], str(tmp_path))
    assert b"uncommitted change" in Path(local).read_bytes()
    assert manifest["trace"]["stored"] is True
    assert "undelivered" not in manifest["outcome"]
    assert run.info.status == "FINISHED"
    restored = project.cascade("restore", run.info.run_id[:8], "--no-run", "--workdir", str(tmp_path / "wt"))
    assert restored.returncode == 0, restored.stderr
    assert "uncommitted change" in (tmp_path / "wt" / "train.py").read_text()
