"""The run's files as the parent sorts them (capture/files.sort_files): reads through a symlink that
leads out of the repository."""

from __future__ import annotations

import subprocess
from pathlib import Path

from cascade_repro.capture.files import MAX_OUTSIDE_NAMED, sort_files


def test_reads_through_a_link_out_of_the_repository_are_named_outside_up_to_the_bound(
    tmp_path: Path,
) -> None:
    outside = tmp_path / "datasets"
    outside.mkdir()
    for index in range(MAX_OUTSIDE_NAMED + 50):  # a linked image folder: many files
        (outside / f"{index:04d}.jpg").write_bytes(b"x")
    (outside / "loader.py").write_text("pass\n")  # code reached through the link: no data
    root = tmp_path / "repo"
    root.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    (root / "data").symlink_to("../datasets")
    read = ["data/loader.py", *(f"data/{index:04d}.jpg" for index in range(MAX_OUTSIDE_NAMED + 50))]
    files = sort_files(root, {"read": read}, [], (), [], [])
    assert files.inputs == []
    named = [str((outside / f"{index:04d}.jpg").resolve()) for index in range(MAX_OUTSIDE_NAMED)]
    assert files.elsewhere == named
