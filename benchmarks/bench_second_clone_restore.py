"""Restore on a second machine (issue 15): a fresh clone, a tracking server, a DVC remote. From nothing
to the script's first line, `git clone` + `cascade restore v1`, beside the same work by hand: `git
clone`, `git checkout` of the recorded commit, the patch and the untracked file downloaded from the
server (MLflow's client, one process), `git apply`, the copy, `dvc pull`, `python script`.

No numeric target in the issue: reported. Both start with an empty DVC cache and take the data from
the remote; cascade also finds the run by its version, checks every sha256 and md5, and prints its
plan first. The server is `mlflow server --serve-artifacts` on sqlite, the remote a local directory.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import CASCADE, HERE, clean_env, median, scratch_repo, start_server, stop_server

REPEATS = 3
DOWNLOAD = """
import sys
from mlflow import MlflowClient
client = MlflowClient()
(run,) = client.search_runs([e.experiment_id for e in client.search_experiments()],
                            filter_string="tags.`cascade.version` = 'v1'")
for path in ("cascade/git.patch", "cascade/untracked/notes.txt"):
    client.download_artifacts(run.info.run_id, path, sys.argv[1])
"""


def _git(*args: str, cwd: Path) -> None:
    # stderr is left alone: every call is -q, so it only carries git's reason for a failure
    subprocess.run(["git", "-c", "user.name=b", "-c", "user.email=b@e", *args], cwd=cwd, check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip


def recorded_project(url: str, remote: Path, env: dict[str, str]) -> Path:
    """Machine A: a DVC-tracked data file on the remote, a dirty tree, an untracked file, run v1."""
    repo = scratch_repo({"first_line.py": HERE / "scripts" / "first_line.py"})
    dvc = [sys.executable, "-m", "dvc"]
    subprocess.run([*dvc, "init", "-q"], cwd=repo, check=True, env=env)
    (repo / "data").mkdir()
    (repo / "data" / "train.bin").write_bytes(os.urandom(32 * 1024 * 1024))
    subprocess.run([*dvc, "add", "-q", "data/train.bin"], cwd=repo, check=True, env=env)
    subprocess.run([*dvc, "remote", "add", "-d", "team", str(remote)], cwd=repo, check=True, env=env)
    _git("add", "-A", cwd=repo)
    _git("commit", "-qm", "data on the remote", cwd=repo)
    with open(repo / "first_line.py", "a") as script:
        script.write("# a local edit: the run is dirty\n")
    (repo / "notes.txt").write_text("an untracked file the run had\n")
    subprocess.run([*CASCADE, "run", "--tag", "v1", "first_line.py"], cwd=repo,
                   env={**env, "MLFLOW_TRACKING_URI": url}, check=True, capture_output=True)  # fmt: skip
    return repo


def by_hand(repo: Path, commit: str, tree: Path, env: dict[str, str]) -> float:
    started = time.time()
    _git("clone", "-q", str(repo), str(tree), cwd=tree.parent)
    _git("checkout", "-q", "--detach", commit, cwd=tree)
    downloaded = tree.parent / f"{tree.name}-artifacts"
    downloaded.mkdir()
    subprocess.run([sys.executable, "-c", DOWNLOAD, str(downloaded)], cwd=tree, env=env, check=True,
                   stderr=subprocess.DEVNULL)  # fmt: skip
    # download_artifacts puts a file artifact at dst/<its name>, not dst/<its artifact path>
    _git("apply", "--binary", str(downloaded / "git.patch"), cwd=tree)
    shutil.copyfile(downloaded / "notes.txt", tree / "notes.txt")
    subprocess.run([sys.executable, "-m", "dvc", "pull", "-q"], cwd=tree, check=True, env=env)
    subprocess.run([sys.executable, "first_line.py"], cwd=tree, check=True, env=env)
    return float((tree / "first_line.json").read_text()) - started


def with_cascade(repo: Path, tree: Path, env: dict[str, str]) -> float:
    started = time.time()
    _git("clone", "-q", str(repo), str(tree), cwd=tree.parent)
    workdir = tree.parent / f"{tree.name}-restored"
    # exit 3 is expected: first_line.py has no optimizer, so there is no trace to verify
    restored = subprocess.run([*CASCADE, "restore", "v1", "--workdir", str(workdir)], cwd=tree, env=env,
                              capture_output=True, text=True)  # fmt: skip
    if not (workdir / "first_line.json").exists():
        sys.exit(f"cascade restore did not reach the script's first line:\n{restored.stderr[-2000:]}")
    return float((workdir / "first_line.json").read_text()) - started


def main() -> None:
    workdir = Path(tempfile.mkdtemp(prefix="cascade-bench-clone-"))
    url, server = start_server(workdir)
    try:
        remote = workdir / "remote"
        remote.mkdir()
        env = clean_env()
        repo = recorded_project(url, remote, env)
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout
        server_env = {**env, "MLFLOW_TRACKING_URI": url}
        hand, ours = [], []
        for index in range(REPEATS):
            hand.append(by_hand(repo, commit.strip(), workdir / f"hand-{index}", server_env))
            ours.append(with_cascade(repo, workdir / f"cascade-{index}", server_env))
    finally:
        stop_server(server)
    print(f"by hand: clone + checkout + download + apply + copy + dvc pull + python : {median(hand):.2f} s "
          f"(median of {REPEATS})")  # fmt: skip
    print(f"git clone + cascade restore v1, to the first line                       : {median(ours):.2f} s"
          f"  ratio {median(ours) / median(hand):.2f}")  # fmt: skip
    shutil.rmtree(workdir, ignore_errors=True)
    shutil.rmtree(repo, ignore_errors=True)


if __name__ == "__main__":
    main()
