"""The isolated git worktree: the recorded commit with the exact dirty state, never the user's checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, Mapping

from cascade_repro import confined
from cascade_repro.errors import CascadeError, RestoreRefused
from cascade_repro.restore.plan import RestorePlan, Worktree
from cascade_repro.restore.reuse import check_reusable, remove_rerun_outputs, write_marker
from cascade_repro.restore.safety import check_sha256, safe_link, safe_path, untracked_links
from cascade_repro.settings import ProjectPaths
from cascade_repro.store import git_repo
from cascade_repro.store.git_repo import has_commit
from cascade_repro.store.run_store import RunStore


def stage_dirty_state(
    plan: RestorePlan, store: RunStore, staging: Path
) -> tuple[Path | None, dict[str, Path]]:
    """Download the patch and untracked files and check each against its sha256 (before any write)."""
    patch_file = None
    if plan.patch:
        local = _download(store, plan.run_id, str(plan.patch.get("artifact") or "cascade/git.patch"), staging)
        check_sha256(local, str(plan.patch.get("sha256")), "the recorded patch (cascade/git.patch)")
        patch_file = local
    files: dict[str, Path] = {}
    for item in plan.untracked:
        if item.symlink_target is not None:
            continue
        rel = item.path
        local = _download(store, plan.run_id, f"cascade/untracked/{rel}", staging / "untracked")
        check_sha256(local, str(item.sha256), f"the untracked file {rel}")
        files[rel] = local
    return patch_file, files


def materialize(plan: RestorePlan, root: Path, store: RunStore, notify: Callable[[str], None]) -> Worktree:
    """A git worktree at the recorded commit with the patch applied and untracked files restored.

    An existing worktree is reused when it is exactly what the last restore left; a worktree
    someone modified is refused, never overwritten.
    """
    if plan.workdir.is_symlink():  # (no worktree made through it: restore/outside_links.py makes such links)
        raise RestoreRefused(
            f"the restore worktree {plan.workdir} is a symbolic link (to {os.readlink(plan.workdir)})",
            hint="restore with --workdir NEW_DIR",
        )
    if not has_commit(root, plan.commit):
        raise RestoreRefused(
            f"commit {plan.commit[:12]} of run {plan.run_id[:12]} is not in this repository",
            hint="git fetch it (e.g. `git fetch --all`) from the remote the run came from",
        )
    workdir = plan.workdir
    if workdir.exists() and any(workdir.iterdir()):
        state, cut = check_reusable(root, workdir, plan)
        aside: list[Path] = []

        def set_aside() -> Path:  # (made for the first file moved there)
            if not aside:
                aside.append(_set_aside_dir(root, workdir))
            return aside[0]

        removed, moved = remove_rerun_outputs(workdir, plan, state, set_aside, cut)
        write_marker(workdir, plan)
        if cut and moved:
            notify(f"reusing the restore worktree {workdir}: its last restore was killed during its re-run; "
                   f"moved the {len(moved)} file(s) added since that restore to {aside[0]}")  # fmt: skip
            return Worktree(workdir, reused=True)
        notify(f"reusing the restore worktree {workdir} (unchanged since the last restore"
               + (f"; removed {len(removed)} file(s) the last re-run wrote" if removed else "")
               + (f"; moved {len(moved)} it wrote, changed since, to {aside[0]}" if moved else "") + ")")
        return Worktree(workdir, reused=True)
    with tempfile.TemporaryDirectory(prefix="cascade-restore-") as tmp:
        patch_file, files = stage_dirty_state(plan, store, Path(tmp))
        patch_links = _check_patch_paths(root, patch_file) if patch_file is not None else {}
        record_links = untracked_links(plan.untracked)
        confined.refuse_escapes({**record_links, **patch_links}, plan.written_paths())
        workdir.parent.mkdir(parents=True, exist_ok=True)
        _git(root, "worktree", "add", "--detach", "--force", str(workdir), plan.commit)
        try:
            restored = _apply_dirty_state(plan, workdir, patch_file, files)
        except BaseException:
            discard(root, workdir)
            raise
    write_marker(workdir, plan)
    return Worktree(workdir, reused=False, restored_files=tuple(restored))


def _set_aside_dir(root: Path, workdir: Path) -> Path:
    """A new directory for the files found in a worktree after a restore killed during its re-run."""
    parent = ProjectPaths(root).set_aside
    parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{workdir.name}-{time.strftime('%Y%m%d-%H%M%S')}-", dir=parent))


def discard(root: Path, workdir: Path) -> None:
    """Remove a worktree this restore made (a failure after it was made leaves nothing behind)."""
    _git(root, "worktree", "remove", "--force", str(workdir), check=False)
    shutil.rmtree(workdir, ignore_errors=True)
    _git(root, "worktree", "prune", check=False)


def _apply_dirty_state(plan: RestorePlan, workdir: Path, patch_file: Path | None,
                       files: Mapping[str, Path]) -> list[str]:  # fmt: skip
    if patch_file is not None:
        out = _git(workdir, "apply", "--binary", "--whitespace=nowarn", str(patch_file), check=False)
        if out.returncode != 0:
            raise RestoreRefused(
                f"the recorded patch does not apply at {plan.commit[:12]}: {git_repo.stderr(out)[:300]}",
                hint="the commit in this repository differs from the one recorded (rewritten history?)",
            )
        confined.refuse_links_out(workdir, _changed_paths_of(workdir))
    restored = []
    for item in plan.untracked:
        rel = item.path
        if os.path.lexists(workdir / rel):
            raise RestoreRefused(f"the untracked file {rel} of the record is tracked at {plan.commit[:12]}")
        link = item.symlink_target
        if link is not None:
            confined.make_symlink(workdir, rel, link, f"the untracked symlink {rel}")
        else:
            confined.write_file(workdir, rel, files[rel], f"the untracked file {rel}")
        restored.append(rel)
    return restored


def _changed_paths_of(workdir: Path) -> list[str]:
    """Files the patch touched (new ones are untracked in the worktree: the patch is not staged)."""
    out = _git(workdir, "status", "--porcelain", "-z", "--untracked-files=all")
    return [entry[3:] for entry in git_repo.names(out.stdout) if len(entry) > 3]


def _check_patch_paths(root: Path, patch_file: Path) -> dict[str, str]:
    """Every path the patch writes stays inside; returns the symlinks it makes (path → target)."""
    out = _git(root, "apply", "--numstat", "-z", str(patch_file), check=False)
    if out.returncode != 0:
        raise RestoreRefused(f"the recorded patch cannot be read: {git_repo.stderr(out)[:300]}")
    for entry in git_repo.names(out.stdout):
        path = entry.split("\t")[-1] if "\t" in entry else entry
        if path:
            safe_path(path, "the recorded patch")
    links = confined.symlinks_in_patch(patch_file.read_bytes())
    for path, target in links.items():
        safe_link(safe_path(path, "the recorded patch"), target, "the patch's symlink")
    return links


def _download(store: RunStore, run_id: str, artifact: str, into: Path) -> Path:
    into.mkdir(parents=True, exist_ok=True)
    try:
        return Path(store.download_artifacts(run_id, artifact, str(into)))
    except (CascadeError, OSError, KeyError) as exc:  # a missing artifact, an unreachable store
        said = exc.message if isinstance(exc, CascadeError) else str(exc)
        raise RestoreRefused(
            f"run {run_id[:12]}: the artifact {artifact} cannot be read: {said}",
            hint="the artifact store is incomplete or unreachable from here",
        ) from None


def _git(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[bytes]:
    out = git_repo.run(cwd, *args)
    if check and out.returncode != 0:
        raise RestoreRefused(f"git {' '.join(args[:2])} failed: {git_repo.stderr(out)[:300]}")
    return out
