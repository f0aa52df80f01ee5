"""What a record's text can reach, checked where it is used and not only when the record is read (a
record's shape check refuses these too, so the commands' tests pass without the guards below)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cascade_repro import confined
from cascade_repro.errors import UnsafeRecord
from cascade_repro.store import git_repo
from tests.plugin import git


@pytest.mark.parametrize("value", ["--output=/tmp/x", "HEAD", "a" * 39, "A" * 40, "a" * 40 + "\n", "main..x",
                                   None, 40, "g" * 40])  # fmt: skip
def test_only_a_full_lowercase_commit_id_is_one(value: object) -> None:
    assert not git_repo.is_commit_id(value)


def test_a_commit_id_is_one_and_has_commit_asks_git_only_for_one(tmp_path: Path) -> None:
    git(tmp_path, "init", "-q")
    (tmp_path / "f").write_text("x")
    git(tmp_path, "add", "f")
    git(tmp_path, "commit", "-qm", "one")
    head = git(tmp_path, "rev-parse", "HEAD").strip()
    assert git_repo.is_commit_id(head) and git_repo.is_commit_id("0" * 64)
    assert git_repo.has_commit(tmp_path, head)
    assert not git_repo.has_commit(tmp_path, "--output=" + str(tmp_path / "f"))
    assert (tmp_path / "f").read_text() == "x"


@pytest.mark.parametrize("path", [".git/config", "a/.git/hooks/pre-commit", ".GIT/config", "x/.Git",
                                  # what other file systems read as .git (git refuses the same names):
                                  # NTFS drops trailing dots and spaces, reads a stream after ":" and
                                  # names .git by its 8.3 short name; HFS+ ignores some code points
                                  ".git./config", ".git . /config", ".git::$INDEX_ALLOCATION/config",
                                  "GIT~1/config", "a/git~1/hooks/x", ".g\u200cit/config",
                                  "\ufeff.GIT/config"])
def test_no_path_into_a_git_directory_is_written(path: str, tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.write_text("[core]\n\tfsmonitor = touch /tmp/ran\n")
    root = tmp_path / "repo"
    (root / ".git").mkdir(parents=True)
    with pytest.raises(UnsafeRecord, match="in a .git directory"):
        confined.write_file(root, path, source, "a data path")
    assert not (root / ".git" / "config").exists()


def test_a_symlink_to_the_git_directory_is_not_written_through(tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.write_text("x")
    root = tmp_path / "repo"
    (root / ".git").mkdir(parents=True)
    (root / "meta").symlink_to(".git")
    with pytest.raises(UnsafeRecord, match="into"):
        confined.write_file(root, "meta/config", source, "a data path")
    assert not (root / ".git" / "config").exists()


def test_an_interrupted_write_leaves_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C during a multi-GB copy left `.NAME.cascade.tmp` behind (only OSError removed it). The
    interruption is simulated: it cannot be timed to the copy for real."""
    import shutil

    source = tmp_path / "source"
    source.write_bytes(b"x" * 1000)
    root = tmp_path / "repo"
    root.mkdir()

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(shutil, "copyfileobj", interrupted)
    with pytest.raises(KeyboardInterrupt):
        confined.write_file(root, "data/big.bin", source, "a data path")
    assert [p.name for p in (root / "data").iterdir()] == []


@pytest.mark.parametrize("path", [".git./config", "GIT~1/hooks/post-checkout", ".g\u200dit/config"])
def test_a_record_naming_a_git_directory_another_way_is_refused_up_front(path: str) -> None:
    from cascade_repro.restore.safety import safe_path

    with pytest.raises(UnsafeRecord):
        safe_path(path, "the data path")


@pytest.mark.parametrize("path", [".github/workflows/ci.yml", ".gitignore", "git/x", "a/git~1x", ".git-x/y",
                                  "a/.gitattributes"])  # fmt: skip
def test_names_that_only_start_like_git_are_written(path: str, tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.write_text("x")
    root = tmp_path / "repo"
    (root / ".git").mkdir(parents=True)
    confined.write_file(root, path, source, "a data path")
    assert (root / path).read_text() == "x"
