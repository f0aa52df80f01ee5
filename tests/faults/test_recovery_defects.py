"""What a recovery must keep when the `cascade run` parent is SIGKILLed: the checkpoint versions it
had already hashed, the bytes of a file read and then rewritten, the outputs noted for the next run,
the script's real status when it ended by itself, and how long the run lasted."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from tests.faults.helpers import Background, process_gone, small_tmpfs
from tests.plugin import Project, git

pytestmark = pytest.mark.slow

# Saves out/ckpt.pt at every step (a new version each time: nanoGPT's ckpt.pt every eval), and with
# --state reads state/counter.txt first and rewrites it (a counter: read, then written); --read FILE
# reads a file (each one given).
# (the tests kill it once the parent is where they want it: --steps 3000, 5 minutes, leaves a loaded
# machine's parent all the time it needs to get there)
SAVER = """\
import argparse, os, time
from pathlib import Path
import torch

cli = argparse.ArgumentParser()
cli.add_argument("--steps", type=int, default=60)
cli.add_argument("--sleep", type=float, default=0.1)
cli.add_argument("--state", action="store_true")
cli.add_argument("--read", action="append", default=[])
args = cli.parse_args()
for name in args.read:
    Path(name).read_bytes()
out = Path("out")
out.mkdir(exist_ok=True)
if args.state:
    count = int(Path("state/counter.txt").read_text())
    Path("state/counter.txt").write_text(str(count + 1))
(out / "started").write_text(str(os.getpid()))
for step in range(args.steps):
    torch.save({"w": torch.full((256,), float(step))}, "out/ckpt.pt")
    (out / "step").write_text(str(step))
    print("step", step, flush=True)
    time.sleep(args.sleep)
"""


def _saver_project(project: Project, ignore: str = "mlflow.db\nmlruns/\n.cascade/\nout/\n") -> None:
    project.write("saver.py", SAVER)
    project.write(".gitignore", ignore)
    project.cascade("init", check=True)
    project.commit("saver, cascade init")


def _cache_objects(project: Project) -> set[str]:
    cache = project.root / ".dvc" / "cache" / "files" / "md5"
    if not cache.is_dir():
        return set()
    return {p.parent.name + p.name for p in cache.glob("*/*") if p.is_file() and "." not in p.name}


def _kill_when(run: Background, project: Project, ready: object, what: str) -> None:
    run.wait_for(ready, what, timeout=180)  # type: ignore[arg-type]
    run.kill()
    child = int((project.root / "out" / "started").read_text())
    assert process_gone(child, 20), "the script outlived cascade"


def _captured(run: Background) -> bool:
    """Whether the parent has opened the run and written its record with the capture (git, packages)."""
    spool = run.run_dir()
    ledger = spool / "delivery.json" if spool is not None else None
    return ledger is not None and ledger.exists() and '"stage": "captured"' in ledger.read_text()


def _recover(project: Project) -> dict[str, object]:
    recovered = project.cascade("recover", "--json")
    assert recovered.returncode == 0, recovered.stderr
    (item,) = json.loads(recovered.stdout)["data"]
    assert item["recovered"] is True
    return item


def test_sigkill_keeps_every_checkpoint_version_the_parent_had_hashed(project: Project) -> None:
    """Defect 4: the versions the live parent hashed into the DVC cache (and whose second names it then
    removed) were recorded as overwritten by the recovery."""
    _saver_project(project)
    run = Background(project, "--seed", "777", "saver.py", "--steps", "3000")
    _kill_when(run, project, lambda: len(_cache_objects(project)) >= 12, "12 versions in the DVC cache")
    hashed = _cache_objects(project)  # only this run put objects there

    item = _recover(project)
    checkpoints = project.manifest(str(item["run_id"]))["checkpoints"]
    kept = {c["md5"] for c in checkpoints if c["status"] == "kept"}
    lost = sum(c["status"] == "overwritten" for c in checkpoints)
    print(f"\nFIGURES defect 4: {len(hashed)} objects in the cache at the kill, {len(kept)} kept, "
          f"{lost} overwritten of {len(checkpoints)}")  # fmt: skip
    assert hashed <= kept, f"hashed by the parent but not recorded: {sorted(hashed - kept)}"
    assert all(c["path"] == "out/ckpt.pt" for c in checkpoints)
    assert len(kept) == sum(c["status"] == "kept" for c in checkpoints), "one version recorded twice"
    for entry in checkpoints:
        if entry["status"] == "kept":
            cached = project.root / ".dvc/cache/files/md5" / entry["md5"][:2] / entry["md5"][2:]
            assert entry["size"] == cached.stat().st_size


def test_sigkill_keeps_the_bytes_of_a_file_read_then_rewritten(project: Project) -> None:
    """Defect 5: the recovered input had `rewritten: true` and no md5 (its bytes as read, kept by the
    child in the run directory, went with it), so `restore` refused it as changed since the run."""
    _saver_project(project, ignore="mlflow.db\nmlruns/\n.cascade/\nout/\nstate/\n")
    project.write("state/counter.txt", "41\n")
    run = Background(project, "saver.py", "--state", "--steps", "3000")
    started = project.root / "out" / "started"  # (after the counter's rewrite)
    _kill_when(run, project, lambda: _captured(run) and started.exists(), "capture's end and the rewrite")
    assert (project.root / "state" / "counter.txt").read_text() == "42"

    item = _recover(project)
    md5 = hashlib.md5(b"41\n").hexdigest()
    (counter,) = [
        i for i in project.manifest(str(item["run_id"]))["inputs"] if i["path"] == "state/counter.txt"
    ]
    assert counter == {"path": "state/counter.txt", "size": 3, "sha256": hashlib.sha256(b"41\n").hexdigest(),
                       "rewritten": True, "md5": md5}  # fmt: skip
    assert (project.root / ".dvc/cache/files/md5" / md5[:2] / md5[2:]).read_bytes() == b"41\n"
    restored = project.cascade("restore", str(item["run_id"]), "--no-run", "--json")
    assert restored.returncode == 0, restored.stderr
    worktree = Path(json.loads(restored.stdout)["data"]["worktree"]["path"])
    assert (worktree / "state" / "counter.txt").read_text() == "41\n"


def test_sigkill_caches_the_inputs_of_a_run_with_track_inputs(project: Project) -> None:
    """`--track-inputs` puts the files a run read that neither git nor DVC tracks into the DVC cache
    when it ends; a run whose parent was SIGKILLed recorded them by their hashes only: a restore
    could not give them back once they changed. One changed after the run stopped is not taken for
    what it read."""
    _saver_project(project, ignore="mlflow.db\nmlruns/\n.cascade/\nout/\nstate/\n")
    table = bytes(range(256)) * 64
    (project.root / "state").mkdir()
    (project.root / "state" / "table.bin").write_bytes(table)
    (project.root / "state" / "notes.txt").write_text("as read")
    run = Background(project, "--track-inputs", "saver.py", "--read", "state/table.bin", "--read",
                     "state/notes.txt", "--steps", "3000")  # fmt: skip
    started = project.root / "out" / "started"  # (after the read)
    _kill_when(run, project, lambda: _captured(run) and started.exists(), "capture's end and the read")
    time.sleep(2.5)  # (past the moment a file written by the run itself still counts as its own)
    (project.root / "state" / "notes.txt").write_text("edited after the run")

    item = _recover(project)
    md5 = hashlib.md5(table).hexdigest()
    (read,) = [i for i in project.manifest(str(item["run_id"]))["inputs"] if i["path"] == "state/table.bin"]
    assert read.get("md5") == md5, read
    (notes,) = [i for i in project.manifest(str(item["run_id"]))["inputs"] if i["path"] == "state/notes.txt"]
    assert "md5" not in notes, notes  # not cached as the bytes the run read
    assert (project.root / ".dvc/cache/files/md5" / md5[:2] / md5[2:]).read_bytes() == table
    (project.root / "state" / "table.bin").write_bytes(b"changed since")
    restored = project.cascade("restore", str(item["run_id"]), "--no-run", "--json")
    assert restored.returncode == 0, restored.stderr
    worktree = Path(json.loads(restored.stdout)["data"]["worktree"]["path"])
    assert (worktree / "state" / "table.bin").read_bytes() == table


def test_sigkill_notes_the_recovered_runs_outputs_for_the_next_run(project: Project) -> None:
    """Defect 6: the recovered run's outputs were not noted in .cascade/outputs.json, so the next run
    recorded the killed run's checkpoint as an untracked file of its dirty state."""
    _saver_project(project, ignore="mlflow.db\nmlruns/\n.cascade/\n")  # out/ is untracked, not ignored
    project.write("noop.py", "print('nothing')\n")
    project.commit("noop")
    run = Background(project, "saver.py", "--steps", "3000")
    _kill_when(run, project, lambda: (project.root / "out" / "step").exists(), "the first step")

    item = _recover(project)
    index = json.loads((project.root / ".cascade" / "outputs.json").read_text())["files"]
    assert index["out/ckpt.pt"]["run_id"] == item["run_id"]
    assert index["out/step"]["run_id"] == item["run_id"]
    assert index["out/ckpt.pt"]["size"] == (project.root / "out" / "ckpt.pt").stat().st_size
    after = project.manifest(project.record("noop.py"))
    earlier = {e["path"]: e["run_id"] for e in after["git"]["earlier_outputs"]}
    assert {"out/ckpt.pt", "out/step", "out/started"} <= set(earlier)
    assert earlier["out/ckpt.pt"] == item["run_id"]
    assert not [u for u in after["git"]["untracked"] if u["path"].startswith("out/")]
    assert after["git"]["dirty"] is False


def test_a_recovered_run_lasts_until_its_last_activity(project: Project) -> None:
    """Defect 10: the end of a run whose parent and script were killed together was the parent's last
    heartbeat (parent.json's mtime, every 5 s), so a run killed 4 s in lasted 0.006 s; its last activity
    is its output, events and trace."""
    _saver_project(project)
    run = Background(project, "saver.py", "--steps", "400")
    step = project.root / "out" / "step"

    def ready() -> bool:  # the parent's last heartbeat is 1.5 s old: the end must not be taken from it
        spool = run.run_dir()
        beat = spool / "parent.json" if spool is not None else None
        if beat is None or not step.exists() or int(step.read_text() or 0) < 25:
            return False
        try:
            return time.time() - beat.stat().st_mtime > 1.5
        except FileNotFoundError:
            return False

    run.wait_for(ready, "step 25, 1.5 s after a heartbeat", timeout=180)
    os.killpg(run.process.pid, signal.SIGKILL)  # the script too (`kill -9 -PGID`): no exit facts from it
    run.process.wait(timeout=30)
    assert process_gone(int((project.root / "out" / "started").read_text()), 20)
    last_step = step.stat().st_mtime

    item = _recover(project)
    outcome = project.manifest(str(item["run_id"]))["outcome"]
    print(f"\nFIGURES defect 10: duration {outcome['duration_s']} s, last step "
          f"{last_step - outcome['start_time']:.2f} s after the start")  # fmt: skip
    assert outcome["status"] == "KILLED"
    assert outcome["end_time"] >= last_step - 0.3, "the run ended before its last step"
    assert outcome["duration_s"] >= last_step - outcome["start_time"] - 0.3
    assert outcome["end_time"] <= time.time()


FILL = """\
from pathlib import Path
import torch

Path("out").mkdir(exist_ok=True)
for i in range(12):
    torch.save({"w": torch.zeros(256 * 1024)}, f"out/ckpt{i}.pt")  # 1 MB each
print("saved them all")
"""


@pytest.mark.requires_root
def test_a_script_failed_on_a_full_disk_is_synced_as_failed_not_killed(tmp_path: Path) -> None:
    """Defect 7: the script's own torch.save met ENOSPC and it exited 1; its parent said FAILED and kept
    the spool for `cascade sync`, but its end was never on disk (and zero-byte temporary files were),
    so the next command took it for a dead parent: KILLED, the exit code and the error lost."""
    with small_tmpfs(tmp_path / "small", "20m") as mount:
        root = mount / "proj"
        root.mkdir()
        git(root, "init", "-q")
        project = Project(root)
        project.write("fill.py", FILL)
        project.write(".gitignore", "mlflow.db\nmlruns/\n.cascade/\nout/\n")
        project.cascade("init", check=True)
        with open(root / "cascade.yaml", "a") as settings:  # (a copy each would fill the disk at once)
            settings.write("checkpoint_link: hardlink\n")
        project.commit("fill")
        project.cascade("run", "fill.py", check=True)  # 12 MB of checkpoints, in DVC by hardlink
        failed = project.cascade("run", "fill.py")  # saved over: the old versions stay in the cache
        assert failed.returncode == 1, failed.stderr
        assert "FAILED" in failed.stderr, failed.stderr
        runs = root / ".cascade" / "runs"
        spools = list(runs.iterdir()) if runs.is_dir() else []
        for spool in spools:  # kept for `cascade sync` where the store could not take it all
            assert not [p.name for p in spool.iterdir() if p.name.endswith(".tmp")], "temporary files left"
            assert "ended" in json.loads((spool / "delivery.json").read_text()), "the end is not on disk"
        shutil.rmtree(root / "out")  # the user makes room, then syncs
        shutil.rmtree(root / ".dvc" / "cache")

        synced = project.cascade("sync", "--json")
        assert synced.returncode == 0, synced.stderr
        delivered = json.loads(synced.stdout)["data"]
        assert [(i["status"], i["recovered"]) for i in delivered] == [("FAILED", False)] * len(spools)
        assert not (runs.is_dir() and list(runs.iterdir()))
        run_id = next(r.info.run_id for r in project.runs() if r.info.status != "FINISHED")
        outcome = project.manifest(run_id)["outcome"]
        assert (outcome["status"], outcome["exit_code"]) == ("FAILED", 1)
        assert outcome["error"]["type"] == "RuntimeError", outcome  # torch.save's, on the full disk
        assert "died" not in json.dumps(outcome)
        assert outcome["duration_s"] > 0.5  # twelve saves of 1 MB and torch's import, not 0.013 s
        statuses = sorted(r.info.status for r in project.runs())
        assert statuses == ["FAILED", "FINISHED"]


def test_sigkill_keeps_the_names_of_files_read_outside_the_repository(project: Project) -> None:
    """Left from the last stop: a run's own end names the files its script read outside the
    repository (`outcome.read_outside`, which verify names where two runs differ); a run whose parent
    was SIGKILLed was recovered without them, those read through a linked dataset included."""
    _saver_project(project)
    outside = project.root.parent / "datasets"
    outside.mkdir()
    (outside / "train.bin").write_bytes(b"tokens " * 100)
    (outside / "vocab.txt").write_text("a b c")
    (project.root / "data").symlink_to("../datasets")
    project.commit("a linked dataset")
    run = Background(project, "saver.py", "--read", "data/train.bin", "--read", str(outside / "vocab.txt"),
                     "--steps", "3000")  # fmt: skip
    started = project.root / "out" / "started"  # (after the reads)
    _kill_when(run, project, lambda: _captured(run) and started.exists(), "capture's end and the reads")

    recovered = project.cascade("recover", "--json")
    assert recovered.returncode == 0, recovered.stderr
    (item,) = json.loads(recovered.stdout)["data"]
    outcome = project.manifest(str(item["run_id"]))["outcome"]
    assert outcome["status"] == "KILLED"
    real = [str((outside / name).resolve()) for name in ("vocab.txt", "train.bin")]
    assert sorted(outcome["read_outside"]["paths"]) == sorted(real) and outcome["read_outside"]["count"] == 2
    assert "the script read 2 file(s) outside the repository" in " ".join(recovered.stderr.split())
