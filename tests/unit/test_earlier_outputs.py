"""The index of files earlier runs wrote (capture/earlier_outputs.py): what it vouches for, and what not."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from cascade_repro.capture import earlier_outputs
from cascade_repro.capture.earlier_outputs import INDEX, SCHEMA, Written, load, remember, unchanged
from cascade_repro.capture.git import GitState, capture_git, is_dirty
from tests.plugin import git


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q")
    (root / ".gitignore").write_text(".cascade/\n")
    (root / "train.py").write_text("print('hi')\n")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "initial")
    return root


def _write(root: Path, rel: str, data: bytes) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_a_remembered_file_is_left_out_until_it_changes(repo: Path) -> None:
    ckpt = _write(repo, "lightning_logs/version_0/checkpoints/epoch=0.ckpt", b"weights" * 100)
    _write(repo, "lightning_logs/version_0/metrics.csv", b"epoch,loss\n0,1.0\n")
    assert remember(repo, "run1", ["lightning_logs/version_0/checkpoints/epoch=0.ckpt",
                                   "lightning_logs/version_0/metrics.csv"]) == 2  # fmt: skip
    state = capture_git(repo, (".cascade",), 1 << 20, earlier=load(repo))
    assert state.untracked == () and state.dirty is False
    assert {e.path for e in state.earlier_outputs} == {"lightning_logs/version_0/checkpoints/epoch=0.ckpt",
                                                      "lightning_logs/version_0/metrics.csv"}  # fmt: skip
    assert state.to_dict()["earlier_outputs"][0]["run_id"] == "run1"
    assert is_dirty(repo, (".cascade",)) == []

    stat = ckpt.stat()
    ckpt.write_bytes(b"WEIGHTS" * 100)  # same size
    os.utime(ckpt, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    state = capture_git(repo, (".cascade",), 1 << 20, earlier=load(repo))
    assert [u.path for u in state.untracked] == ["lightning_logs/version_0/checkpoints/epoch=0.ckpt"]
    assert state.dirty is True
    assert is_dirty(repo, (".cascade",)) == ["lightning_logs/version_0/checkpoints/epoch=0.ckpt"]


def test_without_the_index_every_untracked_file_is_captured(repo: Path) -> None:
    _write(repo, "sub/out.txt", b"x")
    remember(repo, "run1", ["sub/out.txt"])
    state = capture_git(repo, (".cascade",), 1 << 20)  # restore's reuse check, `cascade diff` of the tree
    assert [u.path for u in state.untracked] == ["sub/out.txt"] and state.earlier_outputs == ()
    assert "earlier_outputs" not in state.to_dict()


def test_a_directory_checkpoint_is_remembered_file_by_file_symlinks_never(repo: Path, tmp_path: Path) -> None:
    _write(repo, "model/config.json", b"{}")
    _write(repo, "model/weights.safetensors", b"w" * 10)
    (repo / "model" / "link").symlink_to(tmp_path)
    (repo / "elsewhere").symlink_to(tmp_path)
    _write(tmp_path, "outside.txt", b"o")
    claimed = ["model", "elsewhere/outside.txt", "../outside.txt", "/etc/passwd", ".cascade/x"]
    noted = remember(repo, "run1", claimed)
    assert noted == 2
    assert set(load(repo)) == {"model/config.json", "model/weights.safetensors"}


def test_the_index_is_read_as_untrusted_input(repo: Path) -> None:
    path = _write(repo, "out.txt", b"data")
    st = path.stat()
    good = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino, "ctime_ns": st.st_ctime_ns,
            "run_id": "r"}  # fmt: skip
    files = {
        "out.txt": good,
        "../up": good, "/abs": good, "a//b": good, "./a": good, ".cascade/runs/x": good,
        "neg": {**good, "size": -1}, "bool": {**good, "ino": True}, "noid": {**good, "run_id": ""},
        "long": {**good, "run_id": "r" * 500}, "str": "x", "list": [1],
    }  # fmt: skip
    _write(repo, INDEX, json.dumps({"schema": SCHEMA, "files": files}).encode())
    assert set(load(repo)) == {"out.txt"}
    for broken in (b"{", b"[]", json.dumps({"schema": "other/1", "files": files}).encode(),
                   json.dumps({"schema": SCHEMA, "files": []}).encode(),
                   b'{"schema": "cascade.outputs/1", "files": ' + b"[" * 200_000 + b"]" * 200_000 + b"}",
                   json.dumps({"schema": SCHEMA, "files": {"out.txt": {**good, "ctime_ns": None}}}).encode(),
                   ):  # fmt: skip
        _write(repo, INDEX, broken)
        assert load(repo) == {}
    _write(repo, INDEX, b" " * (earlier_outputs.MAX_INDEX_BYTES + 1))
    assert load(repo) == {}


def test_a_symlink_never_matches(repo: Path, tmp_path: Path) -> None:
    target = _write(tmp_path, "t", b"x")
    (repo / "link").symlink_to(target)
    st = os.lstat(repo / "link")
    assert not unchanged(repo, "link", Written(st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns, "r"))


def test_the_index_stays_bounded_newest_runs_kept_and_stale_entries_pruned(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(earlier_outputs, "MAX_ENTRIES", 3)
    for run in range(3):
        for i in range(2):
            _write(repo, f"runs/{run}/{i}.txt", f"{run}{i}".encode())
        remember(repo, f"run{run}", [f"runs/{run}/0.txt", f"runs/{run}/1.txt"])
    kept = load(repo)
    assert list(kept) == ["runs/1/1.txt", "runs/2/0.txt", "runs/2/1.txt"]
    (repo / "runs/2/0.txt").write_text("edited by hand, longer")
    _write(repo, "runs/3/0.txt", b"30")
    remember(repo, "run3", ["runs/3/0.txt"])
    assert list(load(repo)) == ["runs/1/1.txt", "runs/2/1.txt", "runs/3/0.txt"]  # the edited one dropped


def test_a_rewritten_output_belongs_to_the_run_that_wrote_it_last(repo: Path) -> None:
    _write(repo, "sub/out.txt", b"one")
    remember(repo, "run1", ["sub/out.txt"])
    _write(repo, "sub/out.txt", b"two!")
    remember(repo, "run2", ["sub/out.txt"])
    assert load(repo)["sub/out.txt"].run_id == "run2"


def test_a_record_lists_a_bounded_number_of_files_left_out(repo: Path) -> None:
    from cascade_repro.capture.git import MAX_EARLIER_LISTED, EarlierOutput

    many = tuple(EarlierOutput(f"f{i}", 1, "r") for i in range(MAX_EARLIER_LISTED + 5))
    state = GitState("c" * 40, "main", {}, False, b"", (), many)
    section = state.to_dict()
    assert len(section["earlier_outputs"]) == MAX_EARLIER_LISTED  # type: ignore[arg-type]
    assert section["earlier_outputs_more"] == 5


def test_an_edit_whose_mtime_was_put_back_is_captured(repo: Path) -> None:
    """Same size, the mtime restored with utime, the same inode: the ctime still tells."""
    path = _write(repo, "out.txt", b"data")
    remember(repo, "r", ["out.txt"])
    before = path.stat()
    time.sleep(0.01)
    with open(path, "r+b") as handle:
        handle.write(b"DATA")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_mtime_ns == before.st_mtime_ns and path.stat().st_size == before.st_size
    assert not unchanged(repo, "out.txt", load(repo)["out.txt"])


def test_a_file_changed_after_a_dead_run_s_last_activity_is_not_noted_as_its_output(repo: Path) -> None:
    """Recovery notes a dead run's outputs as it finds them, maybe while the user's next run already
    goes: a file edited since the dead run stopped was credited to it and left out of the next run's
    dirty state (its restore then lacked the edit). Only files unchanged since `not_after` are noted."""
    _write(repo, "out/metrics.csv", b"0,1.0\n")
    stopped = time.time()
    time.sleep(0.05)
    _write(repo, "out/notes.txt", b"edited after the run stopped\n")
    assert remember(repo, "dead", ["out/metrics.csv", "out/notes.txt"], not_after=stopped) == 1
    assert set(load(repo)) == {"out/metrics.csv"}


def test_an_input_an_earlier_run_wrote_names_it_only_while_unchanged_and_only_by_a_run_id(repo: Path) -> None:
    trained, evaluation = "a" * 32, "b" * 32
    _write(repo, "model.pt", b"weights")
    _write(repo, "notes.txt", b"notes")
    _write(repo, "forged.txt", b"forged")
    remember(repo, trained, ["model.pt", "notes.txt"])
    remember(repo, "`rm -rf ~`", ["forged.txt"])  # (the index is a file in the tree: anything may be in it)
    _write(repo, "notes.txt", b"NOTES")  # changed since that run wrote it
    inputs = [{"path": p} for p in ("model.pt", "notes.txt", "forged.txt", "never-written.txt")]
    named = earlier_outputs.name_writers(repo, inputs, evaluation)
    assert named == [{"path": "model.pt", "written_by": trained}]
    assert [i.get("written_by") for i in inputs] == [trained, None, None, None]
    assert earlier_outputs.name_writers(repo, [{"path": "model.pt"}], trained) == []  # its own output
