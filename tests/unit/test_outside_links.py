"""Committed links out of the repository in a restore's worktree (restore/outside_links.py): what a
link of cascade's own beside the worktree may reach, and what it never may (the commit is as
untrusted as the record: a shared server's)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from cascade_repro.errors import RestoreRefused
from cascade_repro.restore.outside_links import reach_outside
from cascade_repro.restore.plan import RestorePlan
from cascade_repro.restore.worktree import materialize


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=cwd, check=True,
                   capture_output=True)  # fmt: skip


def _checkout_with_links(base: Path, links: dict[str, str], made: bool = False) -> tuple[Path, Path]:
    """A checkout at base/ws/proj with `links` committed, and its restore worktree (`made`: the
    checkout's directory is there already)."""
    root = base / "ws" / "proj"
    root.mkdir(parents=True, exist_ok=made)
    _git(root, "init", "-q")
    (root / "train.py").write_text("print(1)\n")
    for link, target in links.items():
        (root / link).parent.mkdir(parents=True, exist_ok=True)
        (root / link).symlink_to(target)
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "links")
    workdir = root / ".cascade" / "restore" / "v1"
    workdir.parent.mkdir(parents=True, exist_ok=made)
    _git(root, "worktree", "add", "-q", "--detach", str(workdir), "HEAD")
    return root, workdir


def test_a_link_one_level_out_reaches_from_the_worktree_what_it_does_from_checkout(tmp_path: Path) -> None:
    (tmp_path / "ws" / "datasets").mkdir(parents=True)
    (tmp_path / "ws" / "datasets" / "train.bin").write_bytes(b"tokens")
    root, workdir = _checkout_with_links(tmp_path, {"data": "../datasets", "sub/more": "../../datasets"})
    said: list[str] = []
    reach_outside(root, workdir, said.append)
    assert (workdir / "data" / "train.bin").read_bytes() == b"tokens"
    assert (workdir / "sub" / "more" / "train.bin").read_bytes() == b"tokens"
    assert os.readlink(workdir.parent / "datasets") == str(tmp_path / "ws" / "datasets")
    assert len(said) == 2 and all("outside the repository: not recorded" in s for s in said), said
    said.clear()
    reach_outside(root, workdir, said.append)  # again (a reused worktree): the same link serves
    assert len(said) == 2 and all("not recorded" in s for s in said), said


def test_a_link_that_would_land_elsewhere_than_it_does_from_the_checkout_gets_no_link(tmp_path: Path) -> None:
    """From a review: `l -> ../../restore/proj` lands in .cascade/restore/proj from the worktree but in
    the checkout's grandparent from the checkout; a link of ours there reached the user's checkout
    (`root.parent/proj`), so the re-run wrote into it."""
    (tmp_path / "restore" / "proj").mkdir(parents=True)
    links = {"l": "../../restore/proj", "up": "..", "self": "../proj/train.py", "hidden": "../.config"}
    (tmp_path / "ws" / ".config").mkdir(parents=True)
    root, workdir = _checkout_with_links(tmp_path, links)
    said: list[str] = []
    reach_outside(root, workdir, said.append)
    assert sorted(p.name for p in workdir.parent.iterdir()) == ["v1"]  # no link of ours at all
    assert not os.path.exists(workdir / "l") and os.path.realpath(workdir / "up") == str(workdir.parent)
    assert [s.split(" -> ")[0] for s in said] == ["the committed link hidden", "the committed link l",
                                                  "the committed link up"]  # fmt: skip
    assert all("the re-run cannot reach it from the restore's worktree" in s for s in said), said


def test_a_name_taken_beside_the_worktree_is_said_and_a_restore_into_a_link_refused(tmp_path: Path) -> None:
    (tmp_path / "ws" / "taken").mkdir(parents=True)  # a dataset named as another restore's worktree
    (tmp_path / "ws" / "v2").mkdir(parents=True)  # ... and as a version restored later
    root, workdir = _checkout_with_links(tmp_path, {"data": "../taken", "more": "../v2"})
    (workdir.parent / "taken").mkdir()
    said: list[str] = []
    reach_outside(root, workdir, said.append)
    (taken,) = [s for s in said if "data -> ../taken" in s]
    assert f"{workdir.parent / 'taken'} is taken" in taken, said
    assert os.readlink(workdir.parent / "v2") == str(tmp_path / "ws" / "v2")

    plan = RestorePlan.__new__(RestorePlan)
    object.__setattr__(plan, "workdir", workdir.parent / "v2")
    with pytest.raises(RestoreRefused, match="is a symbolic link"):
        materialize(plan, root, None, lambda _: None)  # type: ignore[arg-type]
    assert list((tmp_path / "ws" / "v2").iterdir()) == []  # nothing made through it


def test_a_committed_link_reaching_the_checkout_through_a_link_of_ours_removes_them(tmp_path: Path) -> None:
    """From a second review: the kernel takes `..` after following a link, so with a link of ours at
    .cascade/restore/datasets, `m -> ../datasets/../proj/secret.txt` reached the user's checkout."""
    (tmp_path / "ws" / "datasets").mkdir(parents=True)
    links = {"data": "../datasets", "m": "../datasets/../proj/secret.txt"}
    root, workdir = _checkout_with_links(tmp_path, links)

    # an absolute link into the checkout (the user's own, benign) is not ours to answer for
    absolute = _checkout_with_links(tmp_path / "other", {"data": "../datasets"})[1]
    (absolute / "config").symlink_to(absolute.parents[2] / "train.py")
    _git(absolute, "add", "config")
    (tmp_path / "other" / "ws" / "datasets").mkdir()
    reach_outside(absolute.parents[2], absolute, lambda _: None)
    assert (absolute.parent / "datasets").is_symlink()

    (root / "secret.txt").write_text("the user's")
    said: list[str] = []
    reach_outside(root, workdir, said.append)
    assert not os.path.lexists(workdir.parent / "datasets")
    assert not os.path.exists(workdir / "m")  # dangling again, as before
    assert any("the committed link m would reach your checkout" in s for s in said), said
    assert any("data -> ../datasets" in s and "cannot reach it" in s for s in said), said


def test_no_link_of_ours_leads_into_the_checkout_or_what_holds_it(tmp_path: Path) -> None:
    """From a second review: a link beside the checkout (`current -> proj`) made a link of ours into it."""
    root, workdir = _checkout_with_links(tmp_path, {"tool": "../current/bin/tool", "up": "../here/x"})
    (tmp_path / "ws" / "current").symlink_to("proj")
    (root / "bin").mkdir()
    (root / "bin" / "tool").symlink_to("/usr/bin/env")  # (ignored in the checkout, out of it)
    (tmp_path / "ws" / "here").symlink_to(".")
    (tmp_path / "ws" / "x").write_text("beside")
    said: list[str] = []
    reach_outside(root, workdir, said.append)
    assert sorted(p.name for p in workdir.parent.iterdir()) == ["v1"], said
    assert len(said) == 2 and all("cannot reach it" in s for s in said), said


def test_a_link_that_cannot_be_made_is_said_and_the_restore_goes_on(tmp_path: Path) -> None:
    """From the reread: a full or read-only disk where the link of ours goes raised out of the restore
    (an OSError other than FileExistsError), which then discarded the worktree it had just made."""
    from tests.faults.helpers import small_tmpfs

    (tmp_path / "ws" / "datasets").mkdir(parents=True)
    root = tmp_path / "ws" / "proj"
    with small_tmpfs(root / ".cascade" / "restore", "16m") as ours:
        _, workdir = _checkout_with_links(tmp_path, {"data": "../datasets"}, made=True)
        subprocess.run(["mount", "-o", "remount,ro", str(ours)], check=True)  # a real EROFS
        said: list[str] = []
        reach_outside(root, workdir, said.append)
        assert len(said) == 1 and "could not be made (Read-only file system" in said[0], said
        assert not os.path.lexists(ours / "datasets")
