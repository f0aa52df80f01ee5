"""Each outside tool has one adapter (issue 16): git in store/git_repo.py, DVC's Python API in
store/dvc_store.py, the Docker engine in images/. The sources above them never reach the tool
themselves; these tests read them, the way test_store_seam.py does for MLflow."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from cascade_repro.errors import CascadeError, NotAGitRepository
from cascade_repro.store import git_repo
from tests.sources import matching_lines

PACKAGE = Path(__file__).resolve().parents[2] / "cascade_repro"
# A command list that starts with the tool (`["git", "status"]`), or the tool's Python API imported.
ADAPTERS = {
    "git": (("store/git_repo.py",), re.compile(r"""\[\s*["']git["']\s*,""")),
    "dvc": (("store/dvc_store.py",), re.compile(r"^\s*(import|from) dvc\b")),
    "docker": (
        ("images/",),
        re.compile(r"""^\s*(import|from) docker\b|\[\s*["']docker["']\s*,|which\(["']docker"""),
    ),
}


@pytest.mark.parametrize("tool", sorted(ADAPTERS))
def test_the_tool_is_reached_only_through_its_adapter(tool: str) -> None:
    allowed, pattern = ADAPTERS[tool]
    assert matching_lines(pattern, skip=allowed) == []


def test_the_patterns_find_a_bypass() -> None:
    """The greps above would see the calls they forbid (a pattern that matches nothing proves nothing)."""
    samples = {
        "git": 'out = subprocess.run(["git", "status"], cwd=root)',
        "docker": 'subprocess.run([ "docker", "info"])',
        "dvc": "    from dvc.repo import Repo",
    }
    for tool, line in samples.items():
        assert ADAPTERS[tool][1].search(line), tool


def _repo(tmp_path: Path) -> Path:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "ignored.log").write_text("")
    (tmp_path / ".gitignore").write_text("*.log\n")
    subprocess.run(["git", "add", "a.py", ".gitignore"], cwd=tmp_path, check=True)
    identity = ["-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", *identity, "commit", "-qm", "init"], cwd=tmp_path, check=True)
    return tmp_path


def test_the_git_adapter_answers_from_a_real_repository(tmp_path: Path) -> None:
    root = _repo(tmp_path)
    (root / "new file.py").write_text("")
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True
    ).stdout.strip()
    assert git_repo.head_commit(root) == head
    assert git_repo.has_commit(root, head) and not git_repo.has_commit(root, "0" * 40)
    assert git_repo.toplevel(root / ".git" / "..") == root.resolve()
    assert sorted(git_repo.visible_files(root)) == [".gitignore", "a.py", "new file.py"]
    assert git_repo.tracked(root, ["a.py", "new file.py", "ignored.log"], batch=1) == {"a.py"}
    assert git_repo.git_dir(root) == (root / ".git").resolve()
    assert git_repo.remote_url(root, "origin") is None
    subprocess.run(["git", "remote", "add", "origin", "git@host:org/vision.git"], cwd=root, check=True)
    subprocess.run(["git", "remote", "add", "mirror", "https://h/x.git"], cwd=root, check=True)
    assert git_repo.remote_url(root, "origin") == "git@host:org/vision.git"  # as `git config` says
    assert git_repo.remote_url(root, "mirror") == "https://h/x.git"
    assert git_repo.remote_url(root, "nope") is None


def test_git_failures_are_cascade_errors_that_name_the_command(tmp_path: Path) -> None:
    with pytest.raises(NotAGitRepository, match="not inside a git repository"):
        git_repo.toplevel(tmp_path)
    root = _repo(tmp_path / "repo")
    with pytest.raises(CascadeError, match="git rev-parse nope failed: .*nope"):
        git_repo.output(root, "rev-parse", "nope")
