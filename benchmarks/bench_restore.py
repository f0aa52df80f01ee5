"""`cascade restore` overhead: time from the command to the script's first line, when code and data
are local, beside doing the same by hand: `git worktree add` + `git apply` of the patch + copying the
untracked file + `dvc cache dir --local` (a new worktree has an empty `.dvc/cache` of its own; cascade
points it at the main checkout's cache in the same way) + `dvc checkout` of the run's data (32 MiB,
DVC-tracked: both sides check it out of the cache), then `python script`.

No numeric target in the issue: reported. restore also reads the record (from a local sqlite store
without importing MLflow), checks sha256s, and prints a plan before it starts the script.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import CASCADE, HERE, clean_env, median, scratch_repo

REPEATS = 3


def _check_data(tree: Path) -> None:
    data = tree / "data" / "train.bin"
    if not data.is_file() or data.stat().st_size != 32 * 1024 * 1024:
        sys.exit(f"{tree}: the run's data was not checked out")


def main() -> None:
    repo = scratch_repo({"first_line.py": HERE / "scripts" / "first_line.py"})
    env = clean_env()
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], cwd=repo, check=True, env=env)
    # data the run has, so that both sides check it out of the DVC cache: the same work
    (repo / "data").mkdir()
    (repo / "data" / "train.bin").write_bytes(os.urandom(32 * 1024 * 1024))
    subprocess.run([sys.executable, "-m", "dvc", "add", "-q", "data/train.bin"], cwd=repo, check=True,
                   env=env)  # fmt: skip
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    subprocess.run(
        ["git", "-c", "user.name=b", "-c", "user.email=b@e", "commit", "-qm", "dvc"], cwd=repo, check=True
    )
    with open(repo / "first_line.py", "a") as script:
        script.write("# a local edit: the run is dirty\n")
    (repo / "notes.txt").write_text("an untracked file the run had\n")
    subprocess.run([*CASCADE, "run", "--tag", "v1", "first_line.py"], cwd=repo, env=env, check=True,
                   capture_output=True)  # fmt: skip
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True
    ).stdout.strip()
    patch = subprocess.run(["git", "diff", "HEAD", "--binary"], cwd=repo, capture_output=True).stdout
    scratch = Path(tempfile.mkdtemp(prefix="cascade-bench-restore-"))
    (scratch / "git.patch").write_bytes(patch)
    shutil.copyfile(repo / "notes.txt", scratch / "notes.txt")
    cache = repo / ".dvc" / "cache"

    by_hand, restore, reuse = [], [], []
    for index in range(REPEATS):
        tree = scratch / f"hand-{index}"
        started = time.time()
        subprocess.run(["git", "worktree", "add", "-q", "--detach", str(tree), commit], cwd=repo, check=True)
        subprocess.run(["git", "apply", "--binary", str(scratch / "git.patch")], cwd=tree, check=True)
        shutil.copyfile(scratch / "notes.txt", tree / "notes.txt")
        # the cache is git-ignored, so the worktree's own .dvc/cache is empty: share the main one
        subprocess.run([sys.executable, "-m", "dvc", "cache", "dir", "--local", str(cache)], cwd=tree,
                       check=True, env=env)  # fmt: skip
        subprocess.run([sys.executable, "-m", "dvc", "checkout", "-q"], cwd=tree, check=True, env=env)
        subprocess.run([sys.executable, "first_line.py"], cwd=tree, check=True, env=env)
        by_hand.append(float((tree / "first_line.json").read_text()) - started)
        _check_data(tree)

        tree = scratch / f"restore-{index}"
        started = time.time()
        # exit 3 is expected: first_line.py has no optimizer, so there is no trace to verify
        subprocess.run([*CASCADE, "restore", "v1", "--workdir", str(tree)], cwd=repo, env=env, check=False,
                       capture_output=True)  # fmt: skip
        restore.append(float((tree / "first_line.json").read_text()) - started)
        _check_data(tree)

        started = time.time()
        # exit 3 is expected: first_line.py has no optimizer, so there is no trace to verify
        subprocess.run([*CASCADE, "restore", "v1", "--workdir", str(tree)], cwd=repo, env=env, check=False,
                       capture_output=True)  # fmt: skip
        reuse.append(float((tree / "first_line.json").read_text()) - started)

    hand = median(by_hand)
    print(f"by hand: worktree + apply + copy + dvc cache dir + checkout + python : {hand:.2f} s "
          f"(median of {REPEATS})")  # fmt: skip
    print(f"cascade restore (new worktree), to the first line                    : {median(restore):.2f} s"
          f"  ratio {median(restore) / hand:.2f}")  # fmt: skip
    print(f"cascade restore (worktree reused), to the first line                 : {median(reuse):.2f} s"
          f"  ratio {median(reuse) / hand:.2f}")  # fmt: skip
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.rmtree(repo, ignore_errors=True)


if __name__ == "__main__":
    main()
