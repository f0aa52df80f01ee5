"""diff, verify, check and restore read one comparison of two records (issue 19 item 5, issue 14
defect 8): on real runs, the causes verify ranks are the differences diff shows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from tests.plugin import Project

pytestmark = pytest.mark.slow


def _data(project: Project, *args: str) -> dict[str, Any]:
    result = project.cascade(*args, "--json")
    assert result.returncode in (0, 3), result.stderr
    return dict(json.loads(result.stdout)["data"])


def test_verify_ranks_the_seed_first_when_the_rng_differs_at_step_zero_and_agrees_with_diff(
    project: Project,
) -> None:
    a = project.record("train.py")
    b = project.record("--seed", "7", "--set", "optimizer.lr=0.05", "train.py")
    verdict = _data(project, "verify", a, b)
    first = verdict["first_divergence"]
    assert first["step"] == 0 and first["facets"][0]["facet"] == "rng"
    causes = [c["summary"] for c in verdict["likely_causes"]]
    assert causes == ["seed 3 → 7", "params differ: optimizer.lr 0.1 → 0.05"]
    assert not any("PYTHONHASHSEED" in c for c in causes)  # derived from the seed: part of it
    # the same comparison: verify's record differences are exactly diff's class A/B changes
    diff = _data(project, "diff", a, b)
    changed = {s["name"] for s in diff["sections"] if s["changes"] and s["class"] in ("A", "B")}
    assert changed == {"seed", "params"}
    assert {d["kind"] for d in verdict["record_differences"]} == {"seed", "params"}
    human = project.cascade("verify", a, b).stdout
    assert human.index("seed 3 → 7") < human.index("optimizer.lr") and "PYTHONHASHSEED" not in human


def test_a_torch_version_without_its_local_label_is_the_same_build_everywhere(project: Project) -> None:
    """PyPI's CUDA torch: package metadata `2.14.1`, `torch.__version__` `2.14.1+cu130`."""
    import torch

    public = torch.__version__.partition("+")[0]
    run_id = project.record("--tag", "v1", "train.py")
    path = Path(urlparse(project.client().get_run(run_id).info.artifact_uri).path) / "cascade" / "run.json"
    record = json.loads(path.read_text())
    assert record["torch"]["version"] == torch.__version__
    record["torch"]["version"] = public  # the other side of the same build: only one has the label
    path.write_text(json.dumps(record))
    plan = _data(project, "restore", "v1", "--no-run")["plan"]
    assert not [d for d in plan["differences"] if d["kind"] == "torch"], plan["differences"]
    assert _data(project, "check", "v1")["verdict"] == "BITWISE_REPRODUCIBLE"
    stack = [s for s in _data(project, "diff", "v1", "current")["sections"] if s["name"] == "stack"]
    assert stack[0]["changes"] == []
