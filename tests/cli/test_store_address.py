"""A store address MLflow cannot use at all is refused before the script starts (a tester's
`tracking_uri: bogus://x`: the script trained to its end, then "cannot record the run: Model registry
functionality is unavailable ..." and nothing was kept)."""

from __future__ import annotations

import pytest

from tests.plugin import Project


@pytest.mark.parametrize("where", ["cascade.yaml", "MLFLOW_TRACKING_URI"])
def test_a_store_address_of_no_known_kind_is_refused_before_the_script(project: Project, where: str) -> None:
    env = {"MLFLOW_TRACKING_URI": "bogus://x"} if where == "MLFLOW_TRACKING_URI" else None
    if where == "cascade.yaml":
        project.write("cascade.yaml", "tracking_uri: bogus://x\n")
        project.commit("a store of no known kind")
    result = project.invoke("run", "train.py", env=env)
    assert result.returncode == 1, result.stderr
    assert "bogus://x" in result.stderr and "not a kind of store MLflow can use" in result.stderr
    assert where in result.stderr and "Model registry" not in result.stderr
    assert not (project.root / "out").exists(), "the script must not have started"
    listed = project.invoke("ls", env=env)  # a read command says the same, not MLflow's own text
    assert listed.returncode == 1 and "not a kind of store MLflow can use" in listed.stderr
