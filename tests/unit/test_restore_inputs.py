"""Where restore takes an input git and DVC could not see (restore/inputs.py): an earlier restore's
worktree holds one an earlier run wrote only as the run read it, and only inside that worktree."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from cascade_repro.record_sections import FileEntry
from cascade_repro.restore.inputs import input_sources

READ = b"version 0 loss 0.25\n"


def _entry(written_by: str | None = "e" * 32) -> FileEntry:
    read = {"path": "runs/0/notes.txt", "size": len(READ), "sha256": hashlib.sha256(READ).hexdigest()}
    return FileEntry({**read, "written_by": written_by})


def _worktree(restores: Path, name: str, data: bytes | None = None, link_to: Path | None = None) -> Path:
    path = restores / name / "runs/0/notes.txt"
    path.parent.mkdir(parents=True)
    if link_to is not None:
        path.symlink_to(link_to)
    elif data is not None:
        path.write_bytes(data)
    return path


def test_an_input_an_earlier_run_wrote_is_taken_from_the_restore_that_wrote_it_again(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    restores = root / ".cascade/restore"
    root.mkdir()
    assert input_sources([_entry()], root, restores) == {"runs/0/notes.txt": "missing"}
    _worktree(restores, "other", b"version 0 loss 0.99\n")  # another run's bytes
    outside = tmp_path / "elsewhere.txt"
    outside.write_bytes(READ)
    _worktree(restores, "linked", link_to=outside)  # the right bytes, through a link out of the worktree
    assert input_sources([_entry()], root, restores) == {"runs/0/notes.txt": "missing"}
    again = _worktree(restores, "v1", READ)
    os.utime(again.parents[2], (1, 1))  # the oldest worktree: searched all the same
    assert input_sources([_entry()], root, restores) == {"runs/0/notes.txt": "restore:v1"}
    # only for an input the record says an earlier run wrote; the checkout's own copy comes first
    assert input_sources([_entry(written_by=None)], root, restores) == {"runs/0/notes.txt": "missing"}
    (root / "runs/0").mkdir(parents=True)
    (root / "runs/0/notes.txt").write_bytes(READ)
    assert input_sources([_entry()], root, restores) == {"runs/0/notes.txt": "checkout"}
