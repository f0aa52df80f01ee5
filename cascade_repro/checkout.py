"""Getting a run's checkpoints and data back: pick one, fetch it from the DVC cache or remote, verify it.

Nothing is handed over before its bytes hash to the md5 in the record.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any, Sequence

from cascade_repro import confined
from cascade_repro.errors import DataError, UnsafeRecord, UsageError
from cascade_repro.record_sections import CheckpointEntry
from cascade_repro.store.dvc_store import Cache, Progress, md5_of


@dataclass(frozen=True)
class Fetched:
    path: str  # as recorded, relative to the repository root
    md5: str
    size: int | None
    source: str  # "local cache" or "remote <name>"
    object_path: Path  # the verified cache object
    written_to: Path | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: str(v) if isinstance(v, Path) else v for k, v in vars(self).items()}


@dataclass(frozen=True)
class Chosen:
    entry: CheckpointEntry  # the checkpoint's entry in the record
    why: str  # "best by val_loss", "last: no metric monitored", "step 3", ...


def choose_checkpoint(checkpoints: Sequence[CheckpointEntry], which: str | None) -> Chosen:
    """A checkpoint and why it was taken. `which` None (the default): the best by the monitored
    metric when the run monitored one, else the last."""
    kept = [c for c in checkpoints if c.kept]
    if which is None:
        which = "best" if _monitored(kept) else "last"
        if which == "last":
            return Chosen(select_checkpoint(checkpoints, "last"), "last: no metric monitored")
    entry = select_checkpoint(checkpoints, which)
    if which == "best":
        why = f"best by {entry.monitor}"
    elif which == "last":
        why = "last"
    elif which.isdigit() and entry.step == int(which):
        why = f"step {which}"
    elif Path(entry.path).name == which or entry.path == which.strip("./"):
        why = f"path {which}"
    else:
        why = f"md5 {str(entry.md5)[:12]}"
    return Chosen(entry, why)


def _monitored(kept: Sequence[CheckpointEntry]) -> list[CheckpointEntry]:
    return [c for c in kept if c.monitor and c.monitor in c.metrics]


def select_checkpoint(checkpoints: Sequence[CheckpointEntry], which: str) -> CheckpointEntry:
    """`best` (by the monitored metric), `last`, a step number, or a path."""
    kept = [c for c in checkpoints if c.kept]
    if not kept:
        pruned = len([c for c in checkpoints if c.status == "pruned"])
        raise DataError(
            "this run has no kept checkpoint in the DVC cache"
            + (f" ({pruned} were pruned)" if pruned else ""),
            hint="checkpoints are files written by torch.save or cascade_repro.checkpoint during the run",
        )
    if which == "last":
        return max(kept, key=lambda c: (c.step if c.step is not None else -1, kept.index(c)))
    if which == "best":
        monitored = _monitored(kept)
        if not monitored:
            raise UsageError(
                "no kept checkpoint has a monitored metric, so none is 'best'",
                hint="use --checkpoint last, a step number or a path (see `cascade show RUN --checkpoints`)",
            )
        sign = 1.0 if monitored[0].mode == "min" else -1.0
        return min(monitored, key=lambda c: sign * float(c.metrics[str(c.monitor)]))
    matches = [c for c in kept if c.step == int(which)] if which.isdigit() else []
    if not matches:
        wanted = which.strip("./")
        matches = [c for c in kept if c.path == wanted or Path(c.path).name == which]
    if not matches and len(which) >= 6 and all(ch in "0123456789abcdef" for ch in which.lower()):
        # an md5 (or its first digits, as show prints them): the one version of a path saved many times
        matches = [c for c in kept if (c.md5 or "").startswith(which.lower())]
        if len({c.md5 for c in matches}) > 1:
            raise UsageError(f"{which!r} is the start of the md5 of {len(matches)} checkpoints",
                             hint="give more of its digits (`cascade show RUN --checkpoints`)")  # fmt: skip
    if not matches:
        listed = ", ".join(f"{c.path} ({c.when}, md5 {str(c.md5)[:12]})" for c in kept[:6])
        raise UsageError(f"no kept checkpoint matches {which!r}",
                         hint=f"kept: {listed}; name one by step, path or md5")  # fmt: skip
    return matches[-1]


def fetch(cache: Cache, path: str, md5: str, remote: str | None, progress: Progress | None = None) -> Fetched:
    """The verified cache object for `md5`, pulled from the remote when the cache lacks it."""
    target = cache.verified_object(md5, progress)
    source = "local cache"
    if target is None:
        name = remote or cache.default_remote() or "(default)"
        if not cache.pull(md5, remote):
            raise DataError(
                f"{path} ({md5}) is neither in the local DVC cache nor intact in the remote {name} "
                "(DVC drops a remote object whose bytes do not match its md5)",
                hint="push it again from the machine that has it (`cascade push RUN`), or check the remote",
            )
        source = f"remote {name}"
        try:
            target = cache.verified_object(md5, progress)
        except DataError as exc:
            raise DataError(f"{path}: the object fetched from the {source} is corrupt: {exc.message}",
                            hint=exc.hint) from None  # fmt: skip
        assert target is not None
    size = target.stat().st_size
    return Fetched(path, md5, size, source, target)


def deliver(fetched: Fetched, base: Path, relative: str, force: bool) -> Fetched:
    """Copy a verified object to `base/relative`, a path from a record (not trusted): it is written
    only where its real path, resolved now, is inside `base`. An existing different file is refused
    unless forced; a symlink there is replaced, never written through."""
    if not relative or PurePosixPath(relative).is_absolute() or ".." in PurePosixPath(relative).parts:
        raise UnsafeRecord(f"unsafe record: the path {relative!r} leads out of {base}")
    confined.refuse_git_dir(relative, "the path")
    destination = base / relative
    if destination.is_dir() and not destination.is_symlink():
        raise UsageError(f"{destination} is a directory", hint="give a file path, or --to DIR")
    if destination.is_file() and not destination.is_symlink():
        same = destination.stat().st_size == fetched.size and md5_of(destination)[0] == fetched.md5
        if same:
            return replace(fetched, written_to=destination)
        if not force:
            raise UsageError(
                f"{destination} exists with other content",
                hint="pass --to DIR to write elsewhere, or --force to overwrite it",
            )
    elif destination.is_symlink() and not force:
        raise UsageError(
            f"{destination} is a symlink", hint="pass --to DIR to write elsewhere, or --force to replace it"
        )
    base.mkdir(parents=True, exist_ok=True)  # `--to DIR`: made once something verified goes into it
    written = confined.write_file(base, relative, fetched.object_path, f"the path {relative}")
    return replace(fetched, written_to=written)
