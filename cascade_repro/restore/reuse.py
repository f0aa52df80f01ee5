"""Reusing a restore worktree: only when it is exactly what the last restore left (a marker in git)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Callable, Mapping

from cascade_repro.capture.git import capture_git
from cascade_repro.errors import RestoreRefused
from cascade_repro.restore.plan import RestorePlan
from cascade_repro.restore.safety import safe_path
from cascade_repro.settings import OWN_ENTRIES, RESTORE_MARKER
from cascade_repro.store import git_repo, spool

MARKER = RESTORE_MARKER  # in the worktree's own git dir, never in its files


def state_fingerprint(workdir: Path) -> dict[str, Any]:
    """Commit, tracked changes and untracked files of a worktree: what "unchanged" means."""
    state = capture_git(workdir, OWN_ENTRIES, 1 << 62)
    return {
        "commit": state.commit,
        "patch_sha256": state.patch_sha256,
        "untracked": sorted([u.path, u.sha256] for u in state.untracked),
    }


def write_marker(workdir: Path, plan: RestorePlan, rerun: str | None = None) -> None:
    """The worktree's state as this restore leaves it. `rerun` "started": the re-run starts now, and a
    restore killed during it leaves new files that only it wrote (its outputs, removed on reuse), the
    files git ignores now noted; "ended": the ignored files it added are noted with their size and
    time (a checkpoints directory it would resume from), to be removed on reuse while unchanged. An
    ignored file added after the re-run is nobody's to remove; one changed since is moved aside."""
    marker = git_repo.git_dir(workdir) / MARKER
    body: dict[str, Any] = {"run_id": plan.run_id, "version": plan.version,
                            "state": state_fingerprint(workdir)}  # fmt: skip
    if rerun == "started":
        body["rerun"] = "started"
        body["ignored"] = _ignored(workdir, plan)
        body["inputs"] = {rel: _stamp(workdir / rel) for rel in _input_paths(plan)}  # as placed
    elif rerun == "ended":
        started = spool.read_json(marker)
        before, placed = started.get("ignored"), started.get("inputs")
        if isinstance(before, list):
            kept = set(map(str, before))
            placed = placed if isinstance(placed, dict) else {}
            # the ignored files it added, and the inputs placed for it that it wrote over (a resume
            # checkpoint saved again: placed as read again on reuse)
            now = [(rel, _stamp(workdir / rel)) for rel in _ignored(workdir, plan)]
            added = [(rel, stamp) for rel, stamp in now if rel not in kept or placed.get(rel, stamp) != stamp]
            body["rerun_ignored"] = [[rel, *stamp] for rel, stamp in added if stamp is not None]
    spool.write_json(marker, body)  # (atomic: a restore killed while writing it leaves the last one)


def _ignored(workdir: Path, plan: RestorePlan) -> list[str]:
    """Ignored files now: not cascade's own entries, nor inside the DVC-tracked data the restore
    places (a dataset's million files: never a re-run's to remove), nor a nested repository."""
    excluded = [f":(exclude,literal){path}" for path in (*OWN_ENTRIES, *(d.path for d in plan.data))]
    return sorted(p for p in git_repo.ignored_files(workdir, ".", *excluded) if not p.endswith("/"))


def _input_paths(plan: RestorePlan) -> list[str]:
    """The run's inputs that the restore places in the worktree (from the DVC cache or the checkout)."""
    return sorted({os.path.normpath(i.path) for i in plan.inputs if not os.path.isabs(i.path)})


def _stamp(path: Path) -> list[int] | None:
    """The size and modification time of the file itself (a symlink's own), to tell it unchanged."""
    try:
        status = os.lstat(path)
    except OSError:
        return None
    return [status.st_size, status.st_mtime_ns]


def rerun_outputs(workdir: Path, plan: RestorePlan, state: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """What the last re-run left in the worktree: (files to remove, files to move aside). Untracked
    files the record does not name; the ignored files it added by its end (those since changed:
    aside), or, cut short, any not ignored when it began and the inputs placed for it that it wrote
    over (placed again). An ignored path is taken only while git
    still ignores it (never a tracked file, never one through a symlinked directory)."""
    recorded = {u.path for u in plan.untracked}
    remove = [str(rel) for rel, _digest in state.get("untracked") or [] if rel not in recorded]
    aside: list[str] = []
    marker = spool.read_json(git_repo.git_dir(workdir) / MARKER)
    added, before = marker.get("rerun_ignored"), marker.get("ignored")
    if isinstance(added, list):
        ignored = set(_ignored(workdir, plan))
        for entry in added:
            if not (isinstance(entry, list) and len(entry) == 3 and str(entry[0]) in ignored):
                continue
            (remove if _stamp(workdir / str(entry[0])) == entry[1:] else aside).append(str(entry[0]))
    elif marker.get("rerun") == "started" and isinstance(before, list):
        kept = set(map(str, before))
        aside += [rel for rel in _ignored(workdir, plan) if rel not in kept]
        placed = marker.get("inputs")  # (a resume checkpoint placed for it, saved over before the kill)
        if isinstance(placed, dict):
            written_over = [rel for rel in _input_paths(plan) if rel in placed and rel not in aside
                            and rel not in remove and _stamp(workdir / rel) != placed[rel]]  # fmt: skip
            aside += written_over
    return remove, aside


def remove_rerun_outputs(workdir: Path, plan: RestorePlan, state: Mapping[str, Any],
                         set_aside: Callable[[], Path], cut: bool) -> tuple[list[str], list[str]]:
    """The files a previous re-run wrote (`rerun_outputs`; unchanged since: the state check passed)
    removed, so the next re-run starts from the recorded state, not from the last one's outputs.
    `cut`: the last re-run was cut short, so a new file may as well be one someone added since: each
    is moved into `set_aside()` (its path kept), never deleted; so is a changed one. Returns (removed,
    moved aside). Nothing outside the worktree is touched (a directory made a symlink since)."""
    remove, aside = rerun_outputs(workdir, plan, state)
    if cut:
        remove, aside = [], remove + aside
    real = os.path.realpath(workdir)
    removing = set(remove)  # (a re-run's many thousands of outputs: one lookup each)
    removed: list[str] = []
    moved: list[str] = []
    for rel in remove + aside:
        path = workdir / safe_path(rel, "a re-run output")
        parent = os.path.realpath(path.parent)
        if parent != real and not parent.startswith(real + os.sep):
            continue
        if rel in removing:
            path.unlink(missing_ok=True)
            removed.append(rel)
        elif os.path.lexists(path):
            target = set_aside() / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(path, target)  # (another file system than the project's: copied)
            moved.append(rel)
        _remove_empty_parents(workdir, path.parent)
    return removed, moved


def _remove_empty_parents(workdir: Path, directory: Path) -> None:
    while directory != workdir and directory.is_dir() and not directory.is_symlink() \
            and not any(directory.iterdir()):  # fmt: skip
        directory.rmdir()
        directory = directory.parent


def check_reusable(root: Path, workdir: Path, plan: RestorePlan) -> tuple[Mapping[str, Any], bool]:
    """The worktree's state, if it is what the last restore left, and whether that restore was killed
    during its re-run (new files besides: the cut re-run's, or added since)."""
    refuse_hint = f"remove it (`git worktree remove --force {workdir}`) or pass --workdir elsewhere"
    marker = git_repo.git_dir(workdir) / MARKER if (workdir / ".git").is_file() else None
    if marker is None or not marker.is_file():
        raise RestoreRefused(f"{workdir} exists and is not a cascade restore worktree",
                             hint="restore into a new directory: --workdir NEW_DIR")  # fmt: skip
    recorded = spool.read_json(marker)
    if not recorded:
        raise RestoreRefused(f"{workdir} has a restore marker that cannot be read ({marker})",
                             hint=refuse_hint)  # fmt: skip
    if recorded.get("run_id") != plan.run_id:
        raise RestoreRefused(
            f"{workdir} holds a restore of run {str(recorded.get('run_id'))[:12]}, not {plan.run_id[:12]}",
            hint=refuse_hint,
        )
    now = state_fingerprint(workdir)
    inputs = recorded.get("inputs")  # (the record's inputs only: the marker is read as any file is)
    placed = set(map(str, inputs)) & set(_input_paths(plan)) if isinstance(inputs, dict) else set()
    if recorded.get("rerun") == "started" and _only_added(recorded.get("state") or {}, now, placed):
        return now, True  # a re-run cut short (the restore was killed): new files besides
    if now != recorded.get("state"):
        changed = _changed_paths(recorded.get("state") or {}, now)
        raise RestoreRefused(
            f"the restore worktree {workdir} was modified since the last restore ({changed})",
            hint="keep your changes elsewhere, then " + refuse_hint,
        )
    return now, False


def _only_added(before: Mapping[str, Any], now: Mapping[str, Any], placed: set[str]) -> bool:
    """The same commit and tracked changes, every untracked file as it was, and only new ones besides;
    an input `placed` for the cut re-run (untracked, not ignored) may have been written over by it (it
    is moved aside and placed again: `rerun_outputs`)."""
    if (before.get("commit"), before.get("patch_sha256")) != (now.get("commit"), now.get("patch_sha256")):
        return False
    files_now = {p: h for p, h in now.get("untracked") or []}
    return all(files_now.get(p) == h for p, h in before.get("untracked") or [] if p not in placed)


def _changed_paths(before: Mapping[str, Any], now: Mapping[str, Any]) -> str:
    if before.get("commit") != now.get("commit"):
        return f"HEAD moved to {str(now.get('commit'))[:12]}"
    files_before = {p: h for p, h in before.get("untracked") or []}
    files_now = {p: h for p, h in now.get("untracked") or []}
    changed = sorted(p for p in set(files_before) | set(files_now) if files_before.get(p) != files_now.get(p))
    parts = []
    if before.get("patch_sha256") != now.get("patch_sha256"):
        parts.append("tracked files changed")
    if changed:
        parts.append("untracked: " + ", ".join(changed[:5]))
    return "; ".join(parts) or "state differs"
