"""The image's inputs hash, on a real git repository (no Docker engine needed)."""

from __future__ import annotations

import pytest

from cascade_repro.images import context
from cascade_repro.run_engine import own_paths
from cascade_repro.settings import load_settings
from tests.plugin import Project, git


def _collect(project: Project, dirty: bool = False) -> context.BuildContext:
    settings = load_settings(project.root)
    docker = context.docker_settings({}, project.root)
    reqs = context.Requirements("torch==2.13.0\n", "requirements.lock")
    commit = git(project.root, "rev-parse", "HEAD").strip()
    exclude = own_paths(settings)
    dockerfile = "FROM base\n"
    return context.collect(
        project.root, docker, dockerfile, reqs, "proj", commit, dirty, "base", "b", exclude
    )


@pytest.mark.parametrize("own", ["mlflow.db", ".cascade/builds/x.log", "mlruns/0/meta.yaml"])
def test_cascade_own_files_never_enter_the_image_even_when_not_ignored(project: Project, own: str) -> None:
    project.write(".gitignore", "out/\n")  # a project that never ran `cascade init`
    project.commit("no ignores")
    before = _collect(project)
    project.write(own, "written by cascade, not by the user")
    after = _collect(project)
    assert after.inputs_sha256 == before.inputs_sha256
    assert not any(rel.endswith(own) for rel, _ in after.sources)


def test_a_code_change_changes_the_inputs_and_the_dirty_tag(project: Project) -> None:
    clean = _collect(project)
    project.write("train.py", (project.root / "train.py").read_text() + "# edited\n")
    dirty = _collect(project, dirty=True)
    assert dirty.inputs_sha256 != clean.inputs_sha256
    commit = git(project.root, "rev-parse", "HEAD").strip()
    assert clean.tag == f"cascade/proj:{commit[:12]}"
    assert dirty.tag.startswith(f"cascade/proj:{commit[:12]}-") and len(dirty.tag) == len(clean.tag) + 9
