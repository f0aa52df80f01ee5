"""Files an earlier run wrote into the repository are not the next run's uncommitted changes.

Two runs of one clean commit are both clean, although the first left its checkpoints and outputs in
the work tree (Lightning's `lightning_logs/version_N/`, a plain `sub/out.txt`): the second names them
as earlier runs' outputs, left out, and stores none of them again. A file the user edited after the
run wrote it, or one no run wrote, is still part of the dirty state and restored with it.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.plugin import Project

pytestmark = pytest.mark.slow

WRITES = """\
import sys
from pathlib import Path

import torch

runs = Path("runs")
version = len(list(runs.glob("*"))) if runs.is_dir() else 0  # like Lightning's version_N
here = runs / str(version)
here.mkdir(parents=True)
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
if "--resume" in sys.argv:  # from the first run's checkpoint
    model.load_state_dict(torch.load(runs / "0" / "model.pt"))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    loss = model(torch.ones(8, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
torch.save(model.state_dict(), here / "model.pt")
(here / "notes.txt").write_text(f"version {version} loss {loss.item()}\\n")
Path("sub").mkdir(exist_ok=True)
Path("sub/out.txt").write_text("the same path each run\\n")
print("done", version)
"""


@pytest.fixture
def writer(project: Project) -> Project:
    """`cascade init`, committed, and a script that writes checkpoints and outputs into the tree."""
    project.write("writes.py", WRITES)
    project.commit("a script that writes into the repository")
    project.cascade("init", check=True)
    project.commit("cascade init")
    return project


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _written(record: dict[str, Any]) -> set[str]:
    """The run's outputs and its checkpoints (torch.save's files are recorded as checkpoints)."""
    return {o["path"] for o in record["outputs"]} | {c["path"] for c in record["checkpoints"]}


def _two_runs(project: Project) -> tuple[dict[str, Any], dict[str, Any], str, str]:
    first = project.record("writes.py")
    second = project.record("writes.py")
    return project.manifest(first), project.manifest(second), first, second


def test_two_runs_of_one_clean_commit_are_both_clean(writer: Project) -> None:
    project = writer
    first, second, first_id, second_id = _two_runs(project)
    assert first["git"]["dirty"] is False and first["git"]["untracked"] == []
    assert _written(first) >= {"runs/0/model.pt", "runs/0/notes.txt", "sub/out.txt"}
    assert second["git"]["dirty"] is False, second["git"]["untracked"]
    assert second["git"]["untracked"] == []
    assert second["git"]["patch"] is None
    left_out = {e["path"]: e for e in second["git"]["earlier_outputs"]}
    assert {"runs/0/model.pt", "runs/0/notes.txt"} <= set(left_out)  # named, not silent
    assert left_out["runs/0/model.pt"]["run_id"] == first_id
    assert left_out["runs/0/model.pt"]["size"] == (project.root / "runs/0/model.pt").stat().st_size
    assert project.client().list_artifacts(second_id, "cascade/untracked") == []  # nothing stored again
    assert project.client().get_run(second_id).data.tags["cascade.dirty"] == "false"
    shown = project.cascade("show", second_id, check=True).stdout  # the dirty row names them too
    dirty = next(line for line in shown.splitlines() if line.strip().startswith("dirty "))
    assert "no (" in dirty and "file(s) earlier runs wrote left out, unchanged: " in dirty, dirty
    # the second run's own outputs are recorded as such, for the run after it
    assert _written(second) >= {"runs/1/model.pt", "sub/out.txt"}

    third = project.manifest(project.record("writes.py"))
    assert third["git"]["dirty"] is False and third["git"]["untracked"] == []
    assert {"runs/0/model.pt", "runs/1/model.pt"} <= {e["path"] for e in third["git"]["earlier_outputs"]}

    verified = project.cascade("verify", first_id, second_id, "--json")
    assert "uncommitted changes differ" not in verified.stdout + verified.stderr
    assert json.loads(verified.stdout)["data"]["verdict"] == "BITWISE_IDENTICAL", verified.stdout


def test_require_clean_accepts_a_tree_holding_only_earlier_outputs(writer: Project) -> None:
    writer.record("writes.py")
    result = writer.cascade("run", "--require-clean", "writes.py")
    assert result.returncode == 0, result.stderr


def test_an_output_edited_after_the_run_is_captured_and_restored(writer: Project) -> None:
    project = writer
    project.record("writes.py")
    edited = b"the user's own words now\n"
    (project.root / "runs/0/notes.txt").write_bytes(edited)
    project.write("notes/mine.txt", "no run wrote this\n")
    second_id = project.record("writes.py")
    second = project.manifest(second_id)
    assert second["git"]["dirty"] is True
    untracked = {u["path"]: u for u in second["git"]["untracked"]}
    assert set(untracked) == {"runs/0/notes.txt", "notes/mine.txt"}
    assert untracked["runs/0/notes.txt"]["sha256"] == _sha256(edited)
    assert untracked["runs/0/notes.txt"]["stored"] is True
    assert "runs/0/model.pt" in {e["path"] for e in second["git"]["earlier_outputs"]}
    assert "runs/0/notes.txt" not in {e["path"] for e in second["git"]["earlier_outputs"]}

    workdir = project.root.parent / "restored"
    result = project.cascade("restore", second_id, "--no-run", "--workdir", str(workdir))
    assert result.returncode == 0, result.stderr
    assert (workdir / "runs/0/notes.txt").read_bytes() == edited
    assert (workdir / "notes/mine.txt").read_text() == "no run wrote this\n"
    assert not (workdir / "runs/0/model.pt").exists()  # an output, not the run's state


def test_an_earlier_checkpoint_the_next_run_reads_is_its_input(writer: Project) -> None:
    """Resuming from the first run's checkpoint: left out of the dirty state, recorded as an input
    (size, sha256), and a restore puts it in the worktree from the checkout."""
    project = writer
    project.record("writes.py")
    second_id = project.record("writes.py", "--resume")
    second = project.manifest(second_id)
    assert second["git"]["dirty"] is False and second["git"]["untracked"] == []
    data = (project.root / "runs/0/model.pt").read_bytes()
    inputs = {i["path"]: i for i in second["inputs"]}
    assert inputs["runs/0/model.pt"]["sha256"] == _sha256(data)
    workdir = project.root.parent / "restored"
    result = project.cascade("restore", second_id, "--no-run", "--workdir", str(workdir))
    assert result.returncode == 0, result.stderr
    assert (workdir / "runs/0/model.pt").read_bytes() == data
    # the checkpoint is in the DVC cache (the first run kept it there): the input names its md5, so a
    # restore takes it from there once the checkout's copy is gone (it refused: "changed since the run")
    assert inputs["runs/0/model.pt"]["md5"] == hashlib.md5(data).hexdigest()
    (project.root / "runs/0/model.pt").unlink()  # a later run's torch.save over it (a new inode, as
    (project.root / "runs/0/model.pt").write_bytes(b"overwritten by a later run")  # cascade's hook does)
    again = project.cascade("restore", second_id, "--no-run", "--workdir", str(workdir.parent / "again"))
    assert again.returncode == 0, again.stderr
    assert (workdir.parent / "again" / "runs/0/model.pt").read_bytes() == data


EVALUATES = """\
from pathlib import Path

import torch

state = torch.load("runs/0/model.pt")
print(Path("runs/0/notes.txt").read_text(), float(state["weight"].sum()))
"""


def test_an_input_an_earlier_run_wrote_names_that_run_and_a_restore_without_it_says_which(
    writer: Project,
) -> None:
    """An evaluation reading the training run's outputs: its record names the run that wrote each
    (the restore's refusal said only "put back the files"; nothing said where they came from), and
    once that run is restored, the evaluation's restore takes them from its worktree."""
    project = writer
    project.write("evaluates.py", EVALUATES)
    project.commit("an evaluation")
    trained = project.record("writes.py")
    evaluated = project.record("evaluates.py")
    inputs = {i["path"]: i for i in project.manifest(evaluated)["inputs"]}
    assert inputs["runs/0/model.pt"]["written_by"] == trained
    assert inputs["runs/0/notes.txt"]["written_by"] == trained
    assert "md5" in inputs["runs/0/model.pt"] and "md5" not in inputs["runs/0/notes.txt"]  # (a checkpoint)
    shown = project.cascade("show", evaluated, check=True).stdout
    size = inputs["runs/0/notes.txt"]["size"]
    assert f"runs/0/notes.txt ({size} bytes, written by run {trained[:8]})" in shown, shown
    assert "written_by" not in {k for i in project.manifest(trained)["inputs"] for k in i}  # (its own)

    (project.root / "runs/0/notes.txt").unlink()
    refused = project.cascade("restore", evaluated, "--no-run")
    assert refused.returncode != 0
    assert f"runs/0/notes.txt (missing in your checkout; run {trained[:8]} wrote it)" in refused.stderr
    assert f"`cascade restore {trained[:8]}` first: it re-runs the run that wrote them" in refused.stderr
    # the run that wrote it, restored, writes it again as the evaluation read it: the evaluation's
    # restore takes it from that restore's worktree (the checkout still lacks it)
    project.cascade("restore", trained[:8], check=True)
    workdir = project.root.parent / "evaluated"
    again = project.cascade("restore", evaluated, "--no-run", "--workdir", str(workdir))
    assert again.returncode == 0, again.stderr
    assert f"written again by an earlier restore (its worktree {trained[:8]}" in again.stderr  # (a label)
    assert "copied 1 input file(s) from an earlier restore's worktree into the worktree" in again.stderr
    assert _sha256((workdir / "runs/0/notes.txt").read_bytes()) == inputs["runs/0/notes.txt"]["sha256"]
    assert not (project.root / "runs/0/notes.txt").exists()


def test_a_file_replaced_with_the_same_size_is_captured(writer: Project) -> None:
    """Size alone never vouches: the file's mtime (and inode) must be those the run left."""
    project = writer
    project.record("writes.py")
    path = project.root / "runs/0/notes.txt"
    original = path.read_bytes()
    replacement = bytes(reversed(original))
    path.unlink()
    path.write_bytes(replacement)
    second = project.manifest(project.record("writes.py"))
    untracked = {u["path"]: u for u in second["git"]["untracked"]}
    assert untracked["runs/0/notes.txt"]["sha256"] == _sha256(replacement)


def test_an_index_from_elsewhere_cannot_hide_a_file(writer: Project) -> None:
    """The index is this checkout's own file, read as untrusted: entries that do not match the file
    on disk, malformed ones, and paths outside the tree are ignored; the file is captured."""
    project = writer
    project.write("mine.txt", "mine\n")
    stat = (project.root / "mine.txt").stat()
    index = project.root / ".cascade" / "outputs.json"
    index.parent.mkdir(exist_ok=True)
    index.write_text(json.dumps({
        "schema": "cascade.outputs/1",
        "files": {"mine.txt": {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns + 1, "ino": stat.st_ino,
                               "run_id": "x"},
                  "../escape": {"size": 1, "mtime_ns": 1, "ino": 1, "run_id": "y"},
                  "bad": "not an object"},
    }))  # fmt: skip
    record = project.manifest(project.record("writes.py"))
    assert "mine.txt" in {u["path"] for u in record["git"]["untracked"]}
    index.write_text("{not json")
    record = project.manifest(project.record("writes.py"))
    assert "mine.txt" in {u["path"] for u in record["git"]["untracked"]}


def test_outputs_are_known_by_this_checkout_only(writer: Project, tmp_path: Path) -> None:
    """A clone whose tree holds the same files (copied, not written by a run there) captures them."""
    project = writer
    project.record("writes.py")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(project.root), str(clone)], check=True)
    (clone / "runs/0").mkdir(parents=True)
    (clone / "runs/0/notes.txt").write_bytes((project.root / "runs/0/notes.txt").read_bytes())
    other = Project(clone)
    record = other.manifest(other.record("writes.py"))
    assert "runs/0/notes.txt" in {u["path"] for u in record["git"]["untracked"]}
