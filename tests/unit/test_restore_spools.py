"""Where a command looks for the spools of restores killed during their re-runs: `.cascade/restore/`
and each linked worktree of the repository that a restore made (`--workdir` elsewhere), found from
git's own files however git wrote them."""

from __future__ import annotations

from pathlib import Path

from cascade_repro.settings import RESTORE_MARKER, ProjectPaths
from tests.plugin import git


def _linked(common: Path, name: str, gitdir: str, marked: bool = True) -> None:
    entry = common / "worktrees" / name
    entry.mkdir(parents=True)
    (entry / "gitdir").write_text(gitdir + "\n")
    if marked:
        (entry / RESTORE_MARKER).write_text("{}")


def test_restore_worktrees_elsewhere_are_found_however_git_named_them(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    (root / ".cascade" / "restore" / "v1").mkdir(parents=True)
    _linked(root / ".git", "v1", str(root / ".cascade" / "restore" / "v1" / ".git"))  # counted once
    _linked(root / ".git", "abs", str(tmp_path / "mine" / "abs" / ".git"))
    _linked(root / ".git", "rel", "../../../../mine/rel/.git")  # worktree.useRelativePaths
    _linked(root / ".git", "plain", str(tmp_path / "mine" / "plain" / ".git"), marked=False)  # the user's
    found = ProjectPaths(root).spool_dirs()
    assert found[0] == root / ".cascade" / "runs" and len(found) == len(set(found)) == 4, found
    assert set(found[1:]) == {
        root / ".cascade" / "restore" / "v1" / ".cascade" / "runs",
        tmp_path / "mine" / "abs" / ".cascade" / "runs",
        tmp_path / "mine" / "rel" / ".cascade" / "runs",
    }


def test_a_project_that_is_itself_a_linked_worktree_finds_them_in_the_common_git_dir(tmp_path: Path) -> None:
    main = tmp_path / "main"
    main.mkdir()
    git(main, "init", "-q")
    git(main, "commit", "-q", "--allow-empty", "-m", "one")
    project = tmp_path / "proj"
    git(main, "worktree", "add", "-q", "--detach", str(project))
    _linked(main / ".git", "r1", str(tmp_path / "restored" / ".git"))
    assert tmp_path / "restored" / ".cascade" / "runs" in ProjectPaths(project).spool_dirs()
