"""Version labels: an MLflow tag (`cascade.version`) plus an annotated git tag at the run's commit.

A version is unique within an experiment, and a run carries one. Moving a version to another run
(`--force`) is recorded on both runs; relabelling a run (`--force`) on it. Every check happens before
the first write, so a refused tag leaves MLflow and git as they were.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from pathlib import Path

from cascade_repro.errors import CascadeError, UsageError, VersionTaken
from cascade_repro.store import git_repo
from cascade_repro.store.git_repo import has_commit
from cascade_repro.store.run_store import VERSION_TAG, RunStore, StoredRun

GIT_TRAILER = "cascade-run:"
_RUN_ID = re.compile(r"[0-9a-f]{32}")


@dataclass(frozen=True)
class TagResult:
    """A version given to a run: the MLflow tag, the git tag, and the run it was moved from (--force)."""

    version: str
    run_id: str
    commit: str
    git_tag: bool
    moved_from: str | None  # the run that held the version before --force


def validate_version(version: str, root: Path) -> None:
    """A version must be a valid git tag name, short, and not look like a run id."""
    fix = "use a label like v1.2.3 or baseline-2026-12 (letters, digits, . _ - /)"
    if not version or len(version) > 100 or any(c.isspace() for c in version):
        raise UsageError(f"invalid version {version!r}: empty, too long or contains whitespace", hint=fix)
    if _RUN_ID.fullmatch(version):
        raise UsageError(f"invalid version {version!r}: it looks like a run id", hint=fix)
    if not git_repo.succeeds(root, "check-ref-format", f"refs/tags/{version}"):
        raise UsageError(f"invalid version {version!r}: not a valid git tag name", hint=fix)


def check_free(store: RunStore, root: Path, version: str, experiment_id: str | None, run_id: str | None,
               force: bool, git_tag: bool) -> str | None:  # fmt: skip
    """Refuse a version held by another run (unless force). Returns the run that holds it, if any."""
    holder = holder_of(store, version, experiment_id) if experiment_id is not None else None
    if holder is not None and holder != run_id and not force:
        raise VersionTaken(
            f"version {version} is already run {holder}",
            hint="choose another version, or pass --force to move it to this run (the move is recorded)",
        )
    if git_tag and not force:
        existing = _git_tag_message(root, version)
        if existing is not None and (run_id is None or f"{GIT_TRAILER} {run_id}" not in existing):
            raise VersionTaken(
                f"git tag {version} already exists in this repository",
                hint="choose another version, pass --force to move it, or --no-git-tag",
            )
    return holder if holder != run_id else None


def holder_of(store: RunStore, version: str, experiment_id: str) -> str | None:
    """The run of the experiment that carries `version`, or None."""
    runs = store.tagged(experiment_id, VERSION_TAG, version)
    return runs[0] if runs else None


def tag_run(store: RunStore, root: Path, run: StoredRun, version: str, force: bool = False,
            git_tag: bool = True) -> TagResult:  # fmt: skip
    """Give `run` the version: MLflow tag, then the annotated git tag. Refusals come first."""
    validate_version(version, root)
    run_id, experiment_id = run.run_id, run.experiment_id
    commit = run.tags.get("mlflow.source.git.commit")
    if not commit:
        raise CascadeError(f"run {run_id} has no recorded git commit; it cannot carry a version")
    current = run.tags.get(VERSION_TAG)  # a run carries one version: relabelling it drops the old one
    if current and current != version and not force:
        shown = current if current.isprintable() else repr(current)  # the record's: no forged lines
        raise VersionTaken(
            f"run {run_id[:12]} is already version {shown}",
            hint=f"a run carries one version: pass --force to relabel it {version} ({shown} then names "
            "no run; the change is recorded on it), or tag another run",
        )
    moved_from = check_free(store, root, version, experiment_id, run_id, force, git_tag)
    if git_tag and not has_commit(root, commit):
        raise CascadeError(
            f"commit {commit[:12]} of run {run_id[:12]} is not in this repository",
            hint="git fetch the branch it was made on, or pass --no-git-tag",
        )
    now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    if moved_from:
        store.delete_tag(moved_from, VERSION_TAG)
        store.set_tags(moved_from, {"cascade.version_moved": f"{version} → {run_id} at {now}"})
    tags = {VERSION_TAG: version, "cascade.versioned_at": now}
    if moved_from:
        tags["cascade.version_moved_from"] = moved_from
    if current and current != version:
        tags["cascade.version_replaced"] = f"{current} → {version} at {now}"
    store.set_tags(run_id, tags)
    existing = _git_tag_message(root, version) if git_tag else None
    already_ours = existing is not None and f"{GIT_TRAILER} {run_id}" in existing  # tagging again: no-op
    if git_tag and not already_ours:
        dirty = run.tags.get("cascade.dirty", "unknown")
        message = (
            f"cascade version {version}\n\nexperiment run {run_id}; dirty: {dirty}"
            + (
                " (the uncommitted changes are in the run's record, cascade/git.patch)"
                if dirty == "true"
                else ""
            )
            + f"\n\n{GIT_TRAILER} {run_id}\n"
        )
        _git(root, "tag", "-a", *(["-f"] if force else []), "-m", message, version, commit)
    return TagResult(version, run_id, commit, git_tag, moved_from)


def _git_tag_message(root: Path, version: str) -> str | None:
    out = git_repo.run(root, "for-each-ref", f"refs/tags/{version}", "--format=%(contents)")
    if out.returncode != 0 or not out.stdout:
        return "" if git_repo.succeeds(root, "rev-parse", "-q", "--verify", f"refs/tags/{version}") else None
    return out.stdout.decode(errors="replace")


def _git(root: Path, *args: str) -> None:
    out = git_repo.as_committer(root, *args)
    if out.returncode != 0:
        raise CascadeError(f"git {args[0]} failed: {git_repo.stderr(out)}")
