"""Checkpoints and data in DVC: real torch.save, a real DVC repo, cache and local remote."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.plugin import SCRIPTS, Project, git

pytestmark = pytest.mark.slow
DVC = [sys.executable, "-m", "dvc"]  # the venv's dvc, whether or not the venv is on PATH


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def _remote_dir(project: Project) -> Path:
    text = (project.root / ".dvc" / "config.local").read_text()
    return Path(text.split("url = ", 1)[1].splitlines()[0].strip())


def _object(base: Path, md5: str) -> Path:
    return base / "files" / "md5" / md5[:2] / md5[2:]


@pytest.fixture
def dvc_project(project: Project) -> Project:
    project.write("ckpt.py", (SCRIPTS / "ckpt.py").read_text())
    project.cascade("init", check=True)
    project.commit("cascade init")
    return project


def _run(project: Project, *args: str) -> tuple[str, dict[str, Any]]:
    run_id = project.record(*args)
    return run_id, project.manifest(run_id)


def test_top_k_checkpoints_enter_the_dvc_cache_and_the_remote(dvc_project: Project) -> None:
    project = dvc_project
    run_id, manifest = _run(project, "--log-checkpoints", "ckpt.py")
    by_path = {c["path"]: c for c in manifest["checkpoints"]}
    heavy = {
        Path(f.path).name
        for f in project.client().list_artifacts(run_id, "cascade/checkpoint_files/checkpoints")
    }
    assert heavy == {Path(p).name for p, c in by_path.items() if c["status"] == "kept"}  # asked for: logged
    kept = sorted(p for p, c in by_path.items() if c["status"] == "kept")
    pruned = sorted(p for p, c in by_path.items() if c["status"] == "pruned")
    # best 3 by val_loss (steps 3, 4, 1) + the last (step 5), and the plain torch.save
    assert kept == ["checkpoints/final.pt"] + [f"checkpoints/step-0000000{s}.pt" for s in (1, 3, 4, 5)]
    assert pruned == ["checkpoints/step-00000000.pt", "checkpoints/step-00000002.pt"]
    on_disk = sorted(p.relative_to(project.root).as_posix() for p in (project.root / "checkpoints").iterdir())
    assert on_disk == kept
    assert (
        by_path["checkpoints/final.pt"]["source"] == "torch.save"
        and by_path["checkpoints/final.pt"]["step"] == 5
    )
    remote = _remote_dir(project)
    for path in kept:
        entry = by_path[path]
        assert (
            entry["md5"] == _md5(project.root / path)
            and entry["size"] == (project.root / path).stat().st_size
        )
        assert _md5(_object(project.root / ".dvc" / "cache", entry["md5"])) == entry["md5"]
        assert _object(remote, entry["md5"]).is_file() and entry["pushed"] is True
    tags = project.client().get_run(run_id).data.tags
    assert tags["cascade.checkpoints"] == "5 kept, 2 pruned"
    artifact = "cascade/checkpoints/checkpoints/step-00000003.pt.dvc"
    pointer = project.client().download_artifacts(run_id, artifact, str(project.root.parent))
    assert f"md5: {by_path['checkpoints/step-00000003.pt']['md5']}" in Path(pointer).read_text()
    assert git(project.root, "status", "--porcelain") == ""  # no git-visible change from the run

    # stock DVC agrees: a pointer committed for the best checkpoint is up to date without a re-read...
    best = by_path["checkpoints/step-00000003.pt"]
    project.write("best.dvc", f"outs:\n- md5: {best['md5']}\n  size: {best['size']}\n  hash: md5\n"
                              "  path: checkpoints/step-00000003.pt\n")  # fmt: skip
    status = subprocess.run([*DVC, "status"], cwd=project.root, capture_output=True, text=True, check=True)
    assert "up to date" in status.stdout
    from dvc.repo import Repo

    with Repo(str(project.root)) as repo:
        _, hash_info = repo.state.get(str(project.root / best["path"]), repo.fs)
        assert hash_info is not None and hash_info.value == best["md5"]  # DVC's state knows it: no re-hash
    # ...and `dvc pull` in a fresh clone brings the bytes back from the remote
    project.commit("track the best checkpoint")
    clone = project.root.parent / "clone"
    subprocess.run(["git", "clone", "-q", str(project.root), str(clone)], check=True)
    (clone / ".dvc" / "config.local").write_text((project.root / ".dvc" / "config.local").read_text())
    subprocess.run([*DVC, "pull", "-q"], cwd=clone, check=True)
    assert _md5(clone / best["path"]) == best["md5"]


def test_checkout_verifies_md5_from_cache_and_remote_and_refuses_tampering(
    dvc_project: Project, tmp_path: Path
) -> None:
    project = dvc_project
    run_id, manifest = _run(project, "--tag", "v1", "ckpt.py")
    assert project.client().list_artifacts(run_id, "cascade/checkpoint_files") == []  # not unless asked
    best = next(c for c in manifest["checkpoints"] if c["path"] == "checkpoints/step-00000003.pt")
    out = tmp_path / "restored"
    result = project.cascade("checkout", "v1", "--checkpoint", "best", "--to", str(out), "--json")
    assert result.returncode == 0, result.stderr
    (item,) = json.loads(result.stdout)["data"]["items"]
    assert item["source"] == "local cache" and _md5(out / "step-00000003.pt") == best["md5"]

    cache_object = _object(project.root / ".dvc" / "cache", best["md5"])
    original = cache_object.read_bytes()
    cache_object.chmod(0o644)
    cache_object.write_bytes(bytes([original[0] ^ 0xFF]) + original[1:])
    refused = project.cascade("checkout", "v1", "--to", str(tmp_path / "bad"))
    assert refused.returncode == 1 and "corrupt" in refused.stderr and best["md5"] in refused.stderr
    assert not (tmp_path / "bad").exists()

    cache_object.unlink()  # gone from the cache: fetched from the remote, verified
    result = project.cascade("checkout", "v1", "--to", str(tmp_path / "again"), "--json")
    assert result.returncode == 0, result.stderr
    (item,) = json.loads(result.stdout)["data"]["items"]
    assert (
        item["source"].startswith("remote") and _md5(tmp_path / "again" / "step-00000003.pt") == best["md5"]
    )

    remote_object = _object(_remote_dir(project), best["md5"])
    remote_object.chmod(0o644)
    remote_object.write_bytes(b"not a checkpoint")
    cache_object.chmod(0o644)
    cache_object.unlink()
    refused = project.cascade("checkout", "v1", "--to", str(tmp_path / "worse"))
    assert (
        refused.returncode == 1 and "remote cascade-local" in refused.stderr and best["md5"] in refused.stderr
    )
    assert "nor intact in the remote" in refused.stderr
    assert not (tmp_path / "worse").exists()

    remote_object.parent.mkdir(parents=True, exist_ok=True)
    remote_object.write_bytes(original)
    code = (
        "import cascade_repro, torch;"
        "s = cascade_repro.load_checkpoint('v1', 'last', map_location='cpu');"
        "print(s['weight'].sum().item() == torch.load('checkpoints/final.pt')['weight'].sum().item())"
    )
    loaded = subprocess.run([sys.executable, "-c", code], cwd=project.root, capture_output=True, text=True)
    assert loaded.stdout.strip() == "True", loaded.stderr
    missing = project.cascade("checkout", "v1", "--checkpoint", "9")
    assert missing.returncode == 2 and "no kept checkpoint matches '9'" in missing.stderr


def test_a_failed_push_keeps_the_run_and_cascade_push_retries(dvc_project: Project, tmp_path: Path) -> None:
    project = dvc_project
    good = _remote_dir(project)
    broken = tmp_path / "not-a-directory"
    broken.write_text("x")
    subprocess.run([*DVC, "remote", "modify", "--local", "cascade-local", "url", str(broken)],
                   cwd=project.root, check=True)  # fmt: skip
    result = project.cascade("run", "ckpt.py")
    assert result.returncode == 0, result.stderr
    run = project.only_run()
    run_id, manifest = run.info.run_id, project.manifest(run.info.run_id)
    assert run.info.status == "FINISHED"
    assert "push to the DVC remote failed" in result.stderr and f"cascade push {run_id[:8]}" in result.stderr
    kept = [c for c in manifest["checkpoints"] if c["status"] == "kept"]
    assert kept and all(c["pushed"] is False for c in kept)
    assert all(_object(project.root / ".dvc" / "cache", c["md5"]).is_file() for c in kept)  # safe locally
    subprocess.run([*DVC, "remote", "modify", "--local", "cascade-local", "url", str(good)],
                   cwd=project.root, check=True)  # fmt: skip
    pushed = project.cascade("push", run_id[:8])
    assert pushed.returncode == 0, pushed.stderr
    assert all(_object(good, c["md5"]).is_file() for c in kept)
    after = [c for c in project.manifest(run_id)["checkpoints"] if c["status"] == "kept"]
    assert [c["md5"] for c in after] == [c["md5"] for c in kept] and all(c["pushed"] is True for c in after)
    listed = project.cascade("show", run_id[:8], "--checkpoints").stdout
    assert " NO" not in listed and listed.count(" yes") == len(kept)


def test_dvc_tracked_data_is_recorded_as_read_and_restored(dvc_project: Project, tmp_path: Path) -> None:
    project = dvc_project
    project.write("data/input.bin", bytes([10]) * 1000)
    subprocess.run([*DVC, "add", "-q", "data/input.bin"], cwd=project.root, check=True)
    project.commit("track data")
    committed = _md5(project.root / "data" / "input.bin")
    (project.root / "data" / "input.bin").chmod(0o644)
    project.write("data/input.bin", bytes([200]) * 1000)  # the workspace differs from the pointer
    refused = project.cascade("run", "--require-clean", "ckpt.py")
    assert refused.returncode == 1 and "data/input.bin (DVC)" in refused.stderr
    run_id, manifest = _run(project, "ckpt.py", str(tmp_path))
    (item,) = manifest["data"]
    assert item["path"] == "data/input.bin" and item["md5"] == committed and item["matches"] is False
    assert item["workspace_md5"] == _md5(project.root / "data" / "input.bin") and item["committed_to_cache"]
    assert git(project.root, "diff", "HEAD", "--stat") == ""  # the .dvc pointer is left as committed
    outside = next(c for c in manifest["checkpoints"] if c["path"].endswith("outside.pt"))
    assert outside["status"] == "not_cached" and "outside the repository" in outside["reason"]
    (project.root / "data" / "input.bin").write_bytes(bytes([1]) * 1000)
    out = tmp_path / "data-back"
    result = project.cascade("checkout", run_id[:8], "--data", "--to", str(out))
    assert result.returncode == 0, result.stderr
    assert (out / "data" / "input.bin").read_bytes() == bytes([200]) * 1000


def test_restore_brings_back_the_data_the_run_read(dvc_project: Project) -> None:
    project = dvc_project
    project.write("data/input.bin", bytes([10]) * 1000)
    subprocess.run([*DVC, "add", "-q", "data/input.bin"], cwd=project.root, check=True)
    project.commit("track data")
    (project.root / "data" / "input.bin").chmod(0o644)
    project.write("data/input.bin", bytes([200]) * 1000)  # read by the run, never committed
    run_id, _ = _run(project, "--tag", "v-data", "ckpt.py")
    project.write("data/input.bin", bytes([77]) * 1000)  # the workspace moves on
    result = project.cascade("restore", "v-data", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)["data"]
    assert data["verdict"]["verdict"] == "BITWISE_IDENTICAL"
    worktree = Path(data["worktree"]["path"])
    assert (worktree / "data" / "input.bin").read_bytes() == bytes([200]) * 1000
    restored = project.manifest(data["run"]["run_id"])
    assert restored["data"][0]["workspace_md5"] == project.manifest(run_id)["data"][0]["workspace_md5"]
    kept = [c for c in restored["checkpoints"] if c["status"] == "kept"]
    assert kept and all(c["pushed"] for c in kept)  # the worktree shares this cache and remote
    assert all(_object(project.root / ".dvc" / "cache", c["md5"]).is_file() for c in kept)
    assert (project.root / "data" / "input.bin").read_bytes() == bytes([77]) * 1000  # yours, untouched

    read = project.manifest(run_id)["data"][0]["workspace_md5"]  # gone from cache and remote:
    for base in (project.root / ".dvc" / "cache", _remote_dir(project)):
        _object(base, read).chmod(0o644)
        _object(base, read).unlink()
    elsewhere = project.root.parent / "elsewhere"
    refused = project.cascade("restore", "v-data", "--workdir", str(elsewhere))
    assert (
        refused.returncode == 1
        and f"data/input.bin ({read}) is neither in the local DVC cache" in refused.stderr
    )
    assert not elsewhere.exists()  # refused before the worktree was made


def test_restore_in_a_fresh_clone_from_the_dvc_remote_and_a_copied_store(dvc_project: Project,
                                                                         tmp_path: Path) -> None:  # fmt: skip
    project = dvc_project
    project.write("data/input.bin", bytes([10]) * 1000)
    subprocess.run([*DVC, "add", "-q", "data/input.bin"], cwd=project.root, check=True)
    project.commit("track data")
    (project.root / "data" / "input.bin").chmod(0o644)
    project.write("data/input.bin", bytes([99]) * 1000)  # read by the run from the workspace
    run_id, manifest = _run(project, "--tag", "v-clone", "ckpt.py")
    assert _object(_remote_dir(project), manifest["data"][0]["workspace_md5"]).is_file()  # pushed too
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(project.root), str(clone)], check=True)
    (clone / ".dvc" / "config.local").write_text((project.root / ".dvc" / "config.local").read_text())
    (clone / "mlflow.db").write_bytes((project.root / "mlflow.db").read_bytes())  # the copied store
    result = Project(clone).cascade("restore", "v-clone", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)["data"]
    assert data["verdict"]["verdict"] == "BITWISE_IDENTICAL" and data["verdict"]["run_a"] == run_id
    assert (Path(data["worktree"]["path"]) / "data" / "input.bin").read_bytes() == bytes([99]) * 1000


RESAVE = """
import os, torch
model = torch.nn.Linear(64, 64)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
os.makedirs("out", exist_ok=True)
for it in range(6):
    opt.zero_grad(); model(torch.randn(8, 64)).pow(2).mean().backward(); opt.step()
    if it % 2 == 1:  # nanoGPT: the same ckpt.pt every eval, faster than the parent can hash it
        torch.save({"model": model.state_dict(), "iter": it}, os.path.join("out", "ckpt.pt"))
"""


def test_a_file_saved_again_under_its_name_keeps_every_version(dvc_project: Project) -> None:
    """nanoGPT saves out/ckpt.pt at every eval: each version is in the DVC cache with its step, none
    lost as "overwritten before it could be hashed" (the child keeps the old file under a second
    name in the run directory, a hardlink, before the next save writes a new inode)."""
    import torch

    dvc_project.write("resave.py", RESAVE)
    dvc_project.commit("a script that saves over its checkpoint")
    run_id, manifest = _run(dvc_project, "resave.py")
    entries = manifest["checkpoints"]
    assert [(c["path"], c["step"], c["status"]) for c in entries] == [
        ("out/ckpt.pt", step, "kept") for step in (1, 3, 5)
    ]
    cache = dvc_project.root / ".dvc" / "cache"
    saved = [torch.load(_object(cache, c["md5"]), weights_only=True) for c in entries]
    assert [s["iter"] for s in saved] == [1, 3, 5]  # each object holds the version of its step
    assert _md5(dvc_project.root / "out" / "ckpt.pt") == entries[-1]["md5"]
    assert not list((dvc_project.root / ".cascade" / "runs").rglob("superseded/*"))  # second names gone
    # restore --no-run places each path as the run left it (it stopped: "out/ckpt.pt exists with other
    # content", hint --force, an option restore does not have, exit 2)
    restored = dvc_project.cascade("restore", run_id, "--no-run")
    assert restored.returncode == 0, restored.stderr
    (tree,) = (dvc_project.root / ".cascade" / "restore").iterdir()
    assert _md5(tree / "out" / "ckpt.pt") == entries[-1]["md5"]
    (tree / "out" / "ckpt.pt").write_bytes(b"another version")  # a re-run there wrote another
    again = dvc_project.cascade("restore", run_id, "--no-run")
    assert again.returncode == 1, again.stderr
    assert f"{tree} already has out/ckpt.pt with other bytes" in again.stderr and "--workdir" in again.stderr
    assert "--force to overwrite" not in again.stderr  # (an option restore does not have)


THROUGH_A_HANDLE = """
import os, torch
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
os.makedirs("out", exist_ok=True)
for it in range(3):
    opt.zero_grad(); model(torch.randn(4, 8)).pow(2).mean().backward(); opt.step()
with open(os.path.join("out", "model.pt"), "wb") as f:  # pytorch/examples' word_language_model
    torch.save(model, f)
with open(os.path.join("out", "log.txt"), "w") as f:  # a text file: torch.save never sees it
    f.write("done")
"""


def test_a_checkpoint_saved_through_an_open_file_is_kept_as_a_copy(dvc_project: Project) -> None:
    """`with open(path, "wb") as f: torch.save(model, f)`: 'no checkpoints: the run wrote none with
    torch.save'. It is kept, and copied into the cache rather than linked: the script's next open()
    of that path would truncate the very inode a hardlink shares with the cache."""
    dvc_project.write("handle.py", THROUGH_A_HANDLE)
    dvc_project.commit("a script saving through a file handle")
    _, manifest = _run(dvc_project, "handle.py")
    (entry,) = manifest["checkpoints"]
    assert (entry["path"], entry["step"], entry["status"]) == ("out/model.pt", 2, "kept")
    written = dvc_project.root / "out" / "model.pt"
    assert entry["md5"] == _md5(written) and entry["size"] == written.stat().st_size
    cached = _object(dvc_project.root / ".dvc" / "cache", entry["md5"])
    assert cached.read_bytes() == written.read_bytes()
    assert cached.stat().st_ino != written.stat().st_ino  # a copy: rewriting the file leaves it whole


SAVED_THEN_READ = """
import os, torch
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for it in range(3):
    opt.zero_grad(); model(torch.randn(4, 8)).pow(2).mean().backward(); opt.step()
torch.save(model.state_dict(), "best.pt")  # at the repository's root, by path
model.load_state_dict(torch.load("best.pt"))  # the best model, read back for the test set
"""


def test_a_checkpoint_the_run_read_back_is_its_output_not_an_input(dvc_project: Project) -> None:
    """word_language_model saves its best model and loads it at the end: `best.pt` was recorded as an
    input ("dvc add it"), and with it gone `restore` refused: "best.pt (missing in your checkout)"."""
    dvc_project.write("best.py", SAVED_THEN_READ)
    dvc_project.commit("a script reading back its checkpoint")
    run_id, manifest = _run(dvc_project, "best.py")
    assert [c["path"] for c in manifest["checkpoints"]] == ["best.pt"]
    assert manifest["inputs"] == [], manifest["inputs"]
    assert "best.pt" in [o["path"] for o in manifest["outputs"]]
    (dvc_project.root / "best.pt").unlink()
    planned = dvc_project.cascade("restore", run_id, "--no-run")
    assert planned.returncode == 0, planned.stderr


SAVES_ONE_PATH = """
import sys, torch
model = torch.nn.Linear(64, 64)
model.bias.data.fill_(float(sys.argv[1]))
torch.save(model.state_dict(), "ckpt.pt")  # nanoGPT's way: one path, saved over at each eval
"""


def test_the_workspace_checkpoint_stays_the_scripts_own_file(dvc_project: Project) -> None:
    """Found on nanoGPT: after a `cascade run`, out/ckpt.pt was a read-only hardlink of its DVC cache
    object. nanoGPT's own resume without cascade then failed (a user's PermissionError at its next
    save) or, as root, rewrote the cache object in place: `checkout` found it corrupt. The cache
    takes its own copy (a reflink where the file system can), and the workspace file stays as the
    script wrote it; `checkpoint_link: hardlink` in cascade.yaml opts into linking."""
    project = dvc_project
    project.write("one.py", SAVES_ONE_PATH)
    project.commit("saves one path")
    run_id, manifest = _run(project, "--tag", "v1", "one.py", "1")
    (entry,) = manifest["checkpoints"]
    written = project.root / "ckpt.pt"
    cached = _object(project.root / ".dvc" / "cache", entry["md5"])
    assert entry["link"] in ("copy", "reflink"), entry
    assert written.stat().st_ino != cached.stat().st_ino and written.stat().st_nlink == 1
    assert os.access(written, os.W_OK) and written.stat().st_mode & 0o200  # writable, as it was saved
    with open(written, "r+b") as handle:  # a later run outside cascade saves over it in place
        handle.write(b"\0" * 16)
    out = project.root / "restored"
    checked = project.cascade("checkout", "v1", "--checkpoint", "last", "--to", str(out))
    assert checked.returncode == 0, checked.stderr
    assert _md5(out / "ckpt.pt") == entry["md5"]

    project.write("cascade.yaml", (project.root / "cascade.yaml").read_text() + "checkpoint_link: hardlink\n")
    project.commit("link checkpoints")
    _, linked = _run(project, "one.py", "2")
    (entry,) = linked["checkpoints"]
    assert entry["link"] == "hardlink" and written.stat().st_nlink == 2, entry


SAVES_ONE_PATH_AT_EACH_EVAL = """
import torch
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(6):
    opt.zero_grad(); model(torch.randn(4, 8)).pow(2).mean().backward(); opt.step()
    if step % 2 == 1:
        torch.save(model.state_dict(), "ckpt.pt")  # nanoGPT's eval: the same path each time
"""


def test_each_version_of_a_path_saved_again_has_its_own_pointer(dvc_project: Project) -> None:
    """Found on nanoGPT: a run that saved ckpt.pt 25 times had all 25 in its record and the DVC cache,
    but one `.dvc` pointer in MLflow, the last version's (each overwrote the one before)."""
    import yaml

    project = dvc_project
    project.write("evals.py", SAVES_ONE_PATH_AT_EACH_EVAL)
    project.commit("saves one path at each eval")
    run_id, manifest = _run(project, "evals.py")
    saved = [(c["step"], c["md5"]) for c in manifest["checkpoints"] if c["status"] == "kept"]
    assert [step for step, _ in saved] == [1, 3, 5], manifest["checkpoints"]
    listed = project.client().list_artifacts(run_id, "cascade/checkpoints")
    pointers = {}
    for artifact in listed:
        local = project.client().download_artifacts(run_id, artifact.path, str(project.root / ".dl"))
        pointers[Path(artifact.path).name] = yaml.safe_load(Path(local).read_text())["outs"][0]["md5"]
    assert pointers["ckpt.pt.dvc"] == saved[-1][1]  # the path's own name: its last version
    assert sorted(pointers.values()) == sorted(md5 for _, md5 in saved), pointers
    assert f"ckpt.pt.step-1.{saved[0][1][:8]}.dvc" in pointers, sorted(pointers)
