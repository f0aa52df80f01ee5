"""Files the run opened in the repository: inputs git and DVC cannot see, and outputs it wrote.

The child notes the paths it opened (child/file_access.py); here, after the script ended, they are
sorted out. An output is a file the run wrote (opened for writing, or the stdout/stderr `cascade
run` was redirected to): it is never snapshotted as an untracked input. An input is a file the
script read that git does not track (ignored, like nanoGPT's `*.bin`), that is not untracked (the
dirty state keeps those) and that no DVC output covers: it is hashed once here, and with
`--track-inputs` put into the DVC cache.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

from cascade_repro.capture.git import excluded
from cascade_repro.child.protocol import CHECKPOINTS_FILE
from cascade_repro.store import git_repo

MAX_INPUTS = 1000  # the record stays bounded; the rest are named as left out
MAX_OUTPUTS = 1000
_BATCH = 200  # paths per `git ls-files` call
MAX_OPENED_LINES = 100_000  # of the child's files.jsonl (each process notes a path once)


@dataclass(frozen=True)
class RunFiles:
    inputs: list[dict[str, Any]] = field(default_factory=list)  # path, size, sha256 (md5 once cached)
    outputs: list[dict[str, Any]] = field(default_factory=list)  # path, size
    left_out: int = 0  # inputs beyond MAX_INPUTS, not recorded


def redirected_outputs(root: Path) -> tuple[str, ...]:
    """Root-relative paths of the regular files this process's stdout and stderr go to
    (`cascade run train.py > run.log`): written while the run lasts, so outputs, never inputs."""
    found = []
    for fd in (1, 2):
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                continue
            target = Path(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # no such fd, or no /proc (not Linux): nothing to leave out
            continue
        rel = _inside(root, target)
        if rel is not None:
            found.append(rel)
    return tuple(dict.fromkeys(found))


def read_opened(path: Path, root: Path | None = None) -> dict[str, list[str]]:
    """The child's `files.jsonl` as {"read": [...], "written": [...]} (first seen first, no repeats);
    a line cut short by a killed process is skipped. Given the `root`, the checkpoints the child
    announced beside it (`checkpoints.jsonl`) are written too: torch.save by path writes through
    torch's own file writer, which the open() hook never sees, so a checkpoint read back later (the
    best model, loaded for the test set) was taken for an input."""
    opened: dict[str, dict[str, None]] = {"read": {}, "written": {}}
    for entry in _json_lines(path):
        for kind, rel in entry.items():
            if kind in opened and isinstance(rel, str):
                opened[kind][rel] = None
    if root is not None:
        real_root = root.resolve()
        for entry in _json_lines(path.parent / CHECKPOINTS_FILE):
            saved = entry.get("path") if entry.get("event") == "saved" else None
            if isinstance(saved, str):
                with contextlib.suppress(ValueError, OSError):  # outside the repository: not its file
                    opened["written"][Path(saved).resolve().relative_to(real_root).as_posix()] = None
    return {kind: list(paths) for kind, paths in opened.items()}


def _json_lines(path: Path) -> Iterator[dict[str, Any]]:
    """The objects of a JSON-lines file the child appends to, at most MAX_OPENED_LINES of them."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            for number, line in enumerate(handle):
                if number >= MAX_OPENED_LINES:
                    break
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                if isinstance(entry, dict):
                    yield entry
    except FileNotFoundError:  # no root given to the child, or it opened nothing in the repository
        pass


def sort_files(root: Path, opened: Mapping[str, Any], redirected: Sequence[str], exclude: tuple[str, ...],
               untracked: Iterable[str], dvc_outs: Iterable[str]) -> RunFiles:  # fmt: skip
    """`opened`: the child's {"read": [...], "written": [...]} (root-relative); `exclude`: cascade's
    own paths and the checkpoints directory; `untracked`: paths the dirty state already holds;
    `dvc_outs`: paths DVC tracks (a file, or a directory covering what is under it)."""
    read = [p for p in _paths(opened.get("read")) if not excluded(p, exclude)]
    written = [p for p in (*redirected, *_paths(opened.get("written"))) if not excluded(p, exclude)]
    outputs: list[dict[str, Any]] = []
    for rel in dict.fromkeys(written):
        path = root / rel
        if path.is_file() and len(outputs) < MAX_OUTPUTS:  # a temporary file already gone is no output
            outputs.append({"path": rel, "size": path.stat().st_size})
    out_paths = set(written)
    known = set(untracked)
    outs = tuple(dvc_outs)
    candidates = [
        p for p in dict.fromkeys(read)
        if p not in out_paths and p not in known and not excluded(p, outs) and regular_inside(root, p)
    ]  # fmt: skip
    tracked = _git_tracked(root, candidates)
    inputs: list[dict[str, Any]] = []
    left_out = 0
    for rel in candidates:
        if rel in tracked:
            continue
        if len(inputs) >= MAX_INPUTS:
            left_out += 1
            continue
        digest, size = sha256_and_size(root / rel)
        inputs.append({"path": rel, "size": size, "sha256": digest})
    return RunFiles(sorted(inputs, key=lambda i: i["path"]), outputs, left_out)


def sha256_and_size(path: Path) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def inputs_warning(inputs: Sequence[Mapping[str, Any]]) -> str | None:
    """What to do about inputs only this checkout has (None when every one is in the DVC cache)."""
    loose = [str(i["path"]) for i in inputs if not i.get("md5")]
    if not loose:
        return None
    shown = " ".join(loose[:8]) + (" ..." if len(loose) > 8 else "")
    return (
        f"the script read {len(loose)} file(s) that neither git nor DVC tracks ({shown}): a restore takes "
        f"them from your checkout only while they stay as they are. Track them: `dvc add {shown}` (then "
        "commit the .dvc files), or `cascade run --track-inputs ...` to keep them in the DVC cache"
    )


def _paths(value: Any) -> list[str]:
    """The child's list as root-relative POSIX paths that stay inside (it is the script's process)."""
    if not isinstance(value, list):
        return []
    out = []
    for item in value:
        if isinstance(item, str) and item and not item.startswith("/") and ".." not in item.split("/"):
            out.append(item)
    return out


def regular_inside(root: Path, rel: str) -> bool:
    """Whether `rel` is a regular file inside `root`, symlinks resolved (`rel` may be untrusted)."""
    path = root / rel
    real = os.path.realpath(path)
    return os.path.isfile(real) and _inside(root, Path(real)) is not None


def _inside(root: Path, path: Path) -> str | None:
    try:
        rel = Path(os.path.realpath(path)).relative_to(os.path.realpath(root)).as_posix()
    except ValueError:
        return None
    return None if rel in (".", "") else rel


def _git_tracked(root: Path, paths: Sequence[str]) -> set[str]:
    return git_repo.tracked(root, list(paths), _BATCH)
