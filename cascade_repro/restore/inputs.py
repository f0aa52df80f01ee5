"""Inputs git and DVC could not see: where restore takes each recorded input file from."""

from __future__ import annotations

import contextlib
import os
import posixpath
from dataclasses import replace
from pathlib import Path
from typing import Mapping, Sequence

from cascade_repro import confined
from cascade_repro.capture.git import sha256_of
from cascade_repro.errors import RestoreRefused
from cascade_repro.file_hashes import FileHashes
from cascade_repro.record_sections import FileEntry
from cascade_repro.restore.plan import RestorePlan

MAX_RESTORES_LOOKED_AT = 100  # worktrees of earlier restores searched for an input written again
RESTORED = "restore:"  # a source: the worktree of an earlier restore, by its name in the restores' directory


def locate_inputs(plan: RestorePlan, root: Path, restores: Path | None = None) -> RestorePlan:
    """Where each recorded input comes from: the DVC cache (--track-inputs), else the user's checkout
    when the file there still has the recorded size and sha256; else, for one an earlier run wrote
    (`written_by`), the worktree of a restore in `restores` that wrote it again, the same bytes (the
    training run restored for its evaluation's model); else it is missing or changed."""
    return replace(plan, input_sources=input_sources(plan.inputs, root, restores))


def input_sources(inputs: Sequence[FileEntry], root: Path, restores: Path | None = None) -> dict[str, str]:
    """Each recorded input by its path: "dvc", "checkout", RESTORED + a worktree's name, "missing" or
    "changed" (locate_inputs)."""
    sources: dict[str, str] = {}
    hashes = FileHashes(root)  # (a file of many GB unchanged since the run, or the last check: not read)
    for item in inputs:
        rel = posixpath.normpath(item.path)
        if item.md5:
            sources[rel] = "dvc"
            continue
        here = _same_file(root, rel, item, hashes)
        if here != "checkout" and item.written_by and restores is not None:
            here = _written_again(restores, rel, item, hashes) or here
        sources[rel] = here
    hashes.save()
    return sources


def _same_file(root: Path, rel: str, item: FileEntry, hashes: FileHashes) -> str:
    """"checkout" where `root` has the file as the run read it (size and sha256), inside `root`;
    else "missing" or "changed"."""
    real = os.path.realpath(root / rel)
    if not real.startswith(os.path.realpath(root) + os.sep) or not os.path.isfile(real):
        return "missing"
    if os.path.getsize(real) != item.size or hashes.sha256(Path(real)) != item.sha256:
        return "changed"
    return "checkout"


def _written_again(restores: Path, rel: str, item: FileEntry, hashes: FileHashes) -> str | None:
    """The source of the first worktree in `restores` holding the input as the run read it."""
    for worktree in _worktrees(restores):
        if _same_file(worktree, rel, item, hashes) == "checkout":
            return RESTORED + worktree.name
    return None


def _worktrees(restores: Path) -> list[Path]:
    """The worktrees of earlier restores (directories, not links), the newest first."""
    found = []
    try:
        for entry in os.scandir(restores):
            with contextlib.suppress(OSError):  # (one a concurrent restore discards meanwhile: left out)
                if entry.is_dir(follow_symlinks=False):
                    found.append((entry.stat(follow_symlinks=False).st_mtime, entry.path))
    except OSError:
        return []
    found.sort(reverse=True)
    return [Path(path) for _, path in found[:MAX_RESTORES_LOOKED_AT]]


def missing_inputs_said(inputs: Sequence[FileEntry], sources: Mapping[str, str]) -> tuple[str, str] | None:
    """What restore (which refuses) and check (NOT_RUNNABLE) say of the inputs located by
    `input_sources` that are not here, and the fix; None when every one is. An input an earlier run
    of this checkout wrote (`written_by`: the training run of an evaluation) names that run."""
    recorded = {posixpath.normpath(i.path): i for i in inputs}
    not_here, writers = [], []
    for rel, source in sources.items():
        item = recorded[rel]
        if source == "missing":
            said = f"{rel} (missing in your checkout"
        elif source == "changed":
            said = (f"{rel} (changed since the run: it read {item.size} bytes with sha256 "
                    f"{str(item.sha256)[:12]}…")  # fmt: skip
        else:
            continue
        if item.written_by:
            said += f"; run {item.written_by[:8]} wrote it"
            writers.append(item.written_by[:8])
        not_here.append(said + ")")
    if not not_here:
        return None
    remake = ""
    if writers:
        runs = ", ".join(f"`cascade restore {run}`" for run in dict.fromkeys(writers))
        remake = (f"; or {runs} first: it re-runs the run that wrote them, and this restore then takes "
                  "them from its worktree")
    return (f"the run read {len(not_here)} file(s) that neither git nor DVC tracks, and your checkout "
            f"does not have them as the run read them: {'; '.join(not_here[:5])}",
            f"put back the files the run read (the same bytes), then restore again{remake}; next time "
            "track them with `dvc add PATH` or `cascade run --track-inputs`")  # fmt: skip


def deliver_inputs(plan: RestorePlan, root: Path, workdir: Path, restores: Path | None = None) -> list[str]:
    """Copy the inputs taken from the checkout (or an earlier restore's worktree, in `restores`) into
    the worktree (confined), each checked again there."""
    recorded = {posixpath.normpath(i.path): i for i in plan.inputs}
    copied = []
    hashes = FileHashes(root)
    for rel, source in plan.input_sources.items():
        if source == "checkout":
            origin, where = root, "your checkout"
        elif source.startswith(RESTORED) and restores is not None:
            origin, where = restores / source.removeprefix(RESTORED), "the restore's worktree it came from"
        else:
            continue
        expected = str(recorded[rel].sha256)
        existing = workdir / rel
        if existing.is_file() and not existing.is_symlink() and hashes.sha256(existing) == expected:
            continue  # a reused worktree has it already
        original = Path(os.path.realpath(origin / rel))
        written = confined.write_file(workdir, rel, original, f"the input file {rel}")
        if sha256_of(written) != expected:
            written.unlink(missing_ok=True)
            raise RestoreRefused(f"the input file {rel} changed in {where} while it was copied",
                                 hint="let whatever writes it finish, then restore again")  # fmt: skip
        copied.append(rel)
    hashes.save()
    return copied
