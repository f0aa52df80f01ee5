"""DVC-tracked directories (`dvc add DIR`): recorded, committed when modified, restored file by file."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np
import pytest

from tests.plugin import Project, git

pytestmark = pytest.mark.slow
DVC = [sys.executable, "-m", "dvc"]

SHARDS = """
import glob
import numpy as np
import torch

files = sorted(glob.glob("shards/**/*.bin", recursive=True))
X = np.concatenate([np.frombuffer(open(f, "rb").read(), dtype=np.float32).reshape(-1, 3) for f in files])
x = torch.from_numpy(X.copy())
torch.manual_seed(0)
model = torch.nn.Linear(3, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(10):
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    opt.step()
"""
NAMES = [f"s{i}.bin" for i in range(5)] + ["sub/s5.bin"]  # a nested file too: a relpath with a /


def _shard(seed: int) -> bytes:
    return np.random.default_rng(seed).random((4, 3), dtype=np.float32).tobytes()


def _md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def _object(base: Path, md5: str) -> Path:
    return base / "files" / "md5" / md5[:2] / md5[2:]


def _listing(project: Project, md5: str) -> dict[str, str]:
    entries = json.loads(_object(project.root / ".dvc" / "cache", md5).read_bytes())
    return {e["relpath"]: e["md5"] for e in entries}


def _restore(project: Project, *args: str) -> tuple[int, dict[str, Any], str]:
    result = project.cascade("restore", *args, "--json")
    data = json.loads(result.stdout)["data"] if result.stdout.strip() else {}
    return result.returncode, data, result.stderr


@pytest.fixture
def sharded(project: Project) -> Project:
    """`dvc add shards` committed; a script that reads every file of it (a glob, as loaders do)."""
    project.cascade("init", check=True)
    for i, name in enumerate(NAMES):
        project.write(f"shards/{name}", _shard(i))
    subprocess.run([*DVC, "add", "-q", "shards"], cwd=project.root, check=True)
    project.write("train2.py", SHARDS)
    project.commit("shards in DVC")
    return project


def test_restore_and_checkout_place_every_file_of_a_dvc_tracked_directory(
    sharded: Project, tmp_path: Path
) -> None:
    project = sharded
    run_id = project.record("--tag", "s1", "train2.py")
    (item,) = project.manifest(run_id)["data"]
    committed = (project.root / "shards.dvc").read_text().split("md5: ")[1].split()[0]
    assert item["path"] == "shards" and item["md5"] == committed and committed.endswith(".dir")
    assert item["matches"] is True and "note" not in item
    assert _listing(project, committed) == {n: _md5(_shard(i)) for i, n in enumerate(NAMES)}

    workdir = tmp_path / "wt"
    code, _, stderr = _restore(project, "s1", "--no-run", "--workdir", str(workdir))
    assert code == 0, stderr
    assert sorted(p.relative_to(workdir / "shards").as_posix()
                  for p in (workdir / "shards").rglob("*") if p.is_file()) == sorted(NAMES)  # fmt: skip
    assert all((workdir / "shards" / n).read_bytes() == _shard(i) for i, n in enumerate(NAMES))

    code, data, stderr = _restore(project, "s1")  # the re-run reads them: the same trace
    assert code == 0, stderr
    assert data["verdict"]["verdict"] == "BITWISE_IDENTICAL"
    assert (Path(data["worktree"]["path"]) / "shards" / "sub" / "s5.bin").read_bytes() == _shard(5)
    assert project.manifest(data["run"]["run_id"])["data"][0]["md5"] == committed

    out = tmp_path / "co"
    result = project.cascade("checkout", "s1", "--data", "--to", str(out))
    assert result.returncode == 0, result.stderr
    assert all((out / "shards" / n).read_bytes() == _shard(i) for i, n in enumerate(NAMES))


def test_a_modified_directory_is_committed_as_read_and_named_by_diff_verify_and_restore(
    sharded: Project, tmp_path: Path
) -> None:
    project = sharded
    s1 = project.record("--tag", "s1", "train2.py")
    committed = project.manifest(s1)["data"][0]["md5"]
    shard3 = project.root / "shards" / "s3.bin"
    shard3.unlink()  # (DVC may have linked it to its cache object: never written through)
    shard3.write_bytes(bytes(48))  # the workspace differs from the pointer
    s2 = project.record("--tag", "s2", "train2.py")
    (item,) = project.manifest(s2)["data"]
    assert item["md5"] == committed and item["matches"] is False and item["committed_to_cache"] is True
    assert (
        "note" not in item and item["workspace_md5"].endswith(".dir") and item["workspace_md5"] != committed
    )
    read = {n: _md5(_shard(i)) for i, n in enumerate(NAMES)} | {"s3.bin": _md5(bytes(48))}
    assert _listing(project, item["workspace_md5"]) == read
    assert item["workspace_size"] == sum(len(_shard(i)) for i in range(len(NAMES)))
    assert git(project.root, "diff", "HEAD", "--stat") == ""  # shards.dvc left as committed

    diff = json.loads(project.cascade("diff", "s1", "s2", "--only", "data", "--json", check=True).stdout)
    (section,) = diff["data"]["sections"]
    assert [(c["key"], c["a"], c["b"]) for c in section["changes"]] == [
        ("shards", committed, item["workspace_md5"])
    ]
    verify = project.cascade("verify", "s1", "s2", "--json")
    assert verify.returncode == 3, verify.stderr
    causes = json.loads(verify.stdout)["data"]["likely_causes"]
    assert causes[0]["summary"].startswith("data differs: shards")

    shard3.unlink()
    shard3.write_bytes(_shard(99))  # the workspace moves on
    code, _, stderr = _restore(project, "s2", "--no-run", "--workdir", str(tmp_path / "wt"))
    assert code == 0, stderr
    assert (tmp_path / "wt" / "shards" / "s3.bin").read_bytes() == bytes(48)
    assert (tmp_path / "wt" / "shards" / "s0.bin").read_bytes() == _shard(0)
    code, data, stderr = _restore(project, "s2")
    assert code == 0, stderr
    assert data["verdict"]["verdict"] == "BITWISE_IDENTICAL"
    assert shard3.read_bytes() == _shard(99)  # yours, untouched


def test_an_old_record_of_a_modified_directory_still_loads(sharded: Project) -> None:
    """Records before directories were committed kept the pointer's md5 and a note: they still show,
    diff and restore (without that directory, whose bytes they never kept)."""
    project = sharded
    run_id = project.record("--tag", "old", "train2.py")
    artifacts = Path(urlparse(project.client().get_run(run_id).info.artifact_uri).path) / "cascade"
    record = json.loads((artifacts / "run.json").read_text())
    record["data"][0].update(matches=False, workspace="modified", note="not restorable: a modified directory")
    (artifacts / "run.json").write_text(json.dumps(record))
    shown = project.cascade("show", "old", "--json")
    assert shown.returncode == 0, shown.stderr
    diff = project.cascade("diff", "old", "old", "--only", "data", "--json")
    assert diff.returncode == 0, diff.stderr


def test_a_directory_listing_that_leads_out_is_refused_before_anything_is_written(
    sharded: Project, tmp_path: Path
) -> None:
    """The `.dir` object comes from a cache or remote others write to: its paths are not trusted."""
    project = sharded
    run_id = project.record("--tag", "s1", "train2.py")
    member = _md5(_shard(0))  # an object that is in the cache
    listing = json.dumps([{"md5": member, "relpath": "../../outside.bin"}], sort_keys=True).encode()
    hostile = _md5(listing) + ".dir"
    _object(project.root / ".dvc" / "cache", hostile).parent.mkdir(parents=True, exist_ok=True)
    _object(project.root / ".dvc" / "cache", hostile).write_bytes(listing)
    artifacts = Path(urlparse(project.client().get_run(run_id).info.artifact_uri).path) / "cascade"
    record = json.loads((artifacts / "run.json").read_text())
    record["data"][0]["md5"] = hostile
    (artifacts / "run.json").write_text(json.dumps(record))
    workdir = tmp_path / "deep" / "wt"
    for args in (("--no-run", "--workdir", str(workdir)), ("--workdir", str(workdir))):
        code, _, stderr = _restore(project, "s1", *args)
        assert code == 1 and "unsafe record" in stderr, stderr
        assert not workdir.exists() and not (tmp_path / "outside.bin").exists()
    refused = project.cascade("checkout", "s1", "--data", "--to", str(tmp_path / "co" / "x"))
    assert refused.returncode == 1 and "unsafe record" in refused.stderr
    assert not (tmp_path / "co" / "outside.bin").exists()


def test_a_committed_symlink_in_place_of_the_directory_is_never_written_through(
    sharded: Project, tmp_path: Path
) -> None:
    project = sharded
    run_id = project.record("--tag", "s1", "train2.py")
    outside = tmp_path / "outside"
    outside.mkdir()
    subprocess.run(["git", "rm", "-q", "--cached", "shards.dvc"], cwd=project.root, check=True)
    (project.root / "shards.dvc").rename(tmp_path / "shards.dvc")
    link = tmp_path / "link-repo"  # a commit whose `shards` is a symlink out, and the run's record on it
    subprocess.run(["git", "clone", "-q", str(project.root), str(link)], check=True)
    (link / "shards").symlink_to(outside)
    git(link, "add", "-f", "shards")
    git(link, "commit", "-qm", "shards is a link")
    git(project.root, "fetch", "-q", str(link), "HEAD")
    commit = git(project.root, "rev-parse", "FETCH_HEAD").strip()
    (project.root / "shards.dvc").write_text((tmp_path / "shards.dvc").read_text())
    artifacts = Path(urlparse(project.client().get_run(run_id).info.artifact_uri).path) / "cascade"
    record = json.loads((artifacts / "run.json").read_text())
    record["git"]["commit"] = commit
    (artifacts / "run.json").write_text(json.dumps(record))
    code, _, stderr = _restore(project, "s1", "--no-run", "--workdir", str(tmp_path / "wt"))
    assert code == 1 and "unsafe record" in stderr and "shards/" in stderr, stderr
    assert list(outside.iterdir()) == [] and not (tmp_path / "wt").exists()


def test_diff_against_current_compares_modified_data_by_its_bytes(sharded: Project) -> None:
    """`cascade diff RUN current` after a DVC-tracked directory was modified: "current" had no md5 for
    it (the workspace was not hashed), so diff said the data was missing here rather than whether it
    is what the run read. The workspace is hashed (nothing enters the DVC cache)."""
    project = sharded
    run_id = project.record("train2.py")
    original = project.manifest(run_id)["data"][0]["md5"]
    project.write("shards/s0.bin", _shard(99))  # a modified file: another directory object
    cache = project.root / ".dvc" / "cache"
    objects_before = sorted(p for p in cache.rglob("*") if p.is_file())
    (data,) = [s for s in _diff_json(project, run_id, "current")["sections"] if s["name"] == "data"]
    (change,) = data["changes"]
    assert change["key"] == "shards" and change["a"] == original, change
    entries = [{"md5": _md5(_shard(99 if n == "s0.bin" else i)), "relpath": n} for i, n in enumerate(NAMES)]
    listing = json.dumps(sorted(entries, key=lambda e: e["relpath"]), sort_keys=True)
    assert change["b"] == hashlib.md5(listing.encode()).hexdigest() + ".dir", change
    assert sorted(p for p in cache.rglob("*") if p.is_file()) == objects_before  # read only
    project.write("shards/s0.bin", _shard(0))  # as the run read it again: equal
    (data,) = [s for s in _diff_json(project, run_id, "current")["sections"] if s["name"] == "data"]
    assert not data["changes"], data


def _diff_json(project: Project, *args: str) -> dict[str, Any]:
    result = project.cascade("diff", *args, "--json")
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout)["data"])
