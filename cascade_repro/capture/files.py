"""Files the run opened in the repository: inputs git and DVC cannot see, and outputs it wrote.

The child notes the paths it opened (child/file_access.py); here, after the script ended, they are
sorted out. An output is a file the run wrote (opened for writing, or the stdout/stderr `cascade
run` was redirected to): it is never snapshotted as an untracked input. An input is a file the
script read that git does not track (ignored, like nanoGPT's `*.bin`), that is not untracked (the
dirty state keeps those) and that no DVC output covers: it is hashed once here, and with
`--track-inputs` put into the DVC cache.

A file the script read and then rewrote (a counter, a state file, a resume checkpoint saved over) is
both: an output, and an input whose bytes as read the child hashed just before its first write and
kept a copy of in the run directory (`read_before_write/`, up to 64 MiB; child/file_access.py). So is
one it read and then removed or renamed away (HF's checkpoint rotation): only an input, as read, though
it is gone at the end. The entry says `rewritten`;
the parent puts that copy into the DVC cache when the project has one, so restore takes it from
there, and otherwise restore refuses, naming the file (the checkout holds what the run wrote).

Files written other than through Python's `open` (sqlite, a subprocess, a C library) are outputs
too when they are untracked and their mtime or ctime is not older than the run's start: one
`git ls-files --others` and one `lstat` each at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

from cascade_repro.capture.git import excluded
from cascade_repro.child.file_access import KEPT_DIR, library_or_system
from cascade_repro.child.protocol import CHECKPOINTS_FILE
from cascade_repro.file_hashes import FileHashes, sha256_and_size
from cascade_repro.store import git_repo

MAX_OUTSIDE_NAMED = 100  # files read outside the repository the record names (the child notes as many)
MAX_INPUTS = 10_000  # record_shape.MAX_FILE_ENTRIES: the rest are counted, and the record says how many
MAX_OUTPUTS = 10_000
_BATCH = 200  # paths per `git ls-files` call
MAX_OPENED_LINES = 100_000  # of the child's files.jsonl (each process notes a path once)


@dataclass(frozen=True)
class RunFiles:
    inputs: list[dict[str, Any]] = field(default_factory=list)  # path, size, sha256 (md5 once cached)
    outputs: list[dict[str, Any]] = field(default_factory=list)  # path, size
    left_out: int = 0  # inputs beyond MAX_INPUTS, not recorded
    kept: dict[str, Path] = field(default_factory=dict)  # a rewritten input → its bytes as read (a copy)
    # read through a symlink that leads out of the repository: their real paths (read outside it)
    elsewhere: list[str] = field(default_factory=list)


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


def read_opened(path: Path, root: Path | None = None) -> dict[str, Any]:
    """The child's `files.jsonl` as {"read": [...], "written": [...], "as_read": {path: {"sha256",
    "size", "kept"}}} (first seen first, no repeats); a line cut short by a killed process is
    skipped. Given the `root`, the checkpoints the child announced beside it (`checkpoints.jsonl`)
    are written too: torch.save by path writes through torch's own file writer, which the open()
    hook never sees, so a checkpoint read back later (the best model, loaded for the test set) was
    taken for an input."""
    opened: dict[str, dict[str, None]] = {"read": {}, "written": {}}
    as_read: dict[str, dict[str, Any]] = {}
    outside: dict[str, None] = {}  # absolute paths read outside the repository (named, never hashed)
    for entry in _json_lines(path):
        far = entry.get("read_outside")
        if isinstance(far, str):
            if len(outside) < MAX_OUTSIDE_NAMED and far.startswith("/"):
                outside[far] = None
            continue
        rewritten = entry.get("as_read")
        if isinstance(rewritten, str):
            if rewritten not in as_read and _hex64(entry.get("sha256")) and _size(entry.get("size")):
                as_read[rewritten] = {"sha256": entry["sha256"], "size": entry["size"],
                                      "kept": entry.get("kept") is True}  # fmt: skip
            continue
        for kind, rel in entry.items():
            if kind in opened and isinstance(rel, str):
                opened[kind][rel] = None
    if root is not None:
        opened["written"].update(dict.fromkeys(_checkpoints_saved(path.parent / CHECKPOINTS_FILE, root)))
    return {**{kind: list(paths) for kind, paths in opened.items()}, "as_read": as_read,
            "outside": list(outside)}  # fmt: skip


def _checkpoints_saved(path: Path, root: Path) -> Iterator[str]:
    """The root-relative paths the child announced as checkpoints saved (`checkpoints.jsonl`)."""
    real_root = root.resolve()
    for entry in _json_lines(path):
        saved = entry.get("path") if entry.get("event") == "saved" else None
        if isinstance(saved, str):
            with contextlib.suppress(ValueError, OSError):  # outside the repository: not its file
                yield Path(saved).resolve().relative_to(real_root).as_posix()


def _hex64(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def _size(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


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
               untracked: Iterable[str], dvc_outs: Iterable[str], run_dir: Path | None = None,
               changed_since_ns: int | None = None) -> RunFiles:  # fmt: skip
    """`opened`: the child's {"read": [...], "written": [...], "as_read": {...}} (root-relative);
    `exclude`: cascade's own paths and the checkpoints directory; `untracked`: paths the dirty state
    already holds; `dvc_outs`: paths DVC tracks (a file, or a directory covering what is under it);
    `run_dir`: where the child kept the bytes of files it read and then rewrote; `changed_since_ns`:
    the run's start, when untracked files changed since then (by any process) are outputs too."""
    read = [p for p in _paths(opened.get("read")) if not excluded(p, exclude)]
    written = [p for p in (*redirected, *_paths(opened.get("written"))) if not excluded(p, exclude)]
    if changed_since_ns is not None:
        written += [p for p in changed_untracked(root, changed_since_ns) if not excluded(p, exclude)]
    outputs: list[dict[str, Any]] = []
    for rel in dict.fromkeys(written):
        path = root / rel
        if path.is_file() and len(outputs) < MAX_OUTPUTS:  # a temporary file already gone is no output
            outputs.append({"path": rel, "size": path.stat().st_size})
    as_read = _as_read(opened.get("as_read"), exclude)
    out_paths = set(written) - set(as_read)  # read, then rewritten: its bytes as read are an input
    known = set(untracked) - set(as_read)  # (the dirty state drops a file the run wrote)
    outs = tuple(dvc_outs)
    readable = [p for p in dict.fromkeys(read)
                if p not in out_paths and p not in known and not excluded(p, outs)]  # fmt: skip
    candidates = [p for p in readable if p in as_read or regular_inside(root, p)]
    tracked = _git_tracked(root, candidates)
    hashes = FileHashes(root)  # (a dataset of many GB is read once, not at the end of every run)
    inputs: list[dict[str, Any]] = []
    kept: dict[str, Path] = {}
    left_out = 0
    for rel in candidates:
        if rel in tracked:
            continue
        if len(inputs) >= MAX_INPUTS:
            left_out += 1
            continue
        before = as_read.get(rel)
        if before is None:
            digest, size = hashes.sha256_and_size(root / rel)
            inputs.append({"path": rel, "size": size, "sha256": digest})
            continue
        inputs.append({"path": rel, "size": before["size"], "sha256": before["sha256"], "rewritten": True})
        copy = _kept_copy(run_dir, rel, before) if before["kept"] else None
        if copy is not None:
            kept[rel] = copy
    hashes.save()
    chosen = set(candidates)
    elsewhere = _through_links(root, [p for p in readable if p not in chosen])
    return RunFiles(sorted(inputs, key=lambda i: i["path"]), outputs, left_out, kept, elsewhere)


def read_outside(opened: Mapping[str, Any], files: RunFiles) -> list[str]:
    """Every file the script read outside the repository: named by the child, or read through a
    symlink out of it (their real paths), first seen first."""
    return list(dict.fromkeys([*(opened.get("outside") or []), *files.elsewhere]))


def outside_noted(paths: Sequence[str]) -> tuple[dict[str, Any], str]:
    """The outcome's `read_outside` (named in the record, never hashed: verify names them where the
    runs differ) and what the run says of them."""
    shown = ", ".join(paths[:3]) + (" …" if len(paths) > 3 else "")
    said = (
        f"the script read {len(paths)} file(s) outside the repository ({shown}): not recorded, so "
        "neither restore nor verify can check them; keep data inside the repository (`dvc add` it) to "
        "have it recorded"
    )  # fmt: skip
    return {"count": len(paths), "paths": list(paths[:20])}, said


def _through_links(root: Path, paths: Sequence[str]) -> list[str]:
    """The real paths of files read through a symlink in the repository that leads out of it (a
    dataset directory linked in): read outside it, not its inputs. Not a library's code. The first
    MAX_OUTSIDE_NAMED, as the child names those it reads outside (a linked ImageNet is a million)."""
    found: list[str] = []
    for rel in paths:
        if len(found) >= MAX_OUTSIDE_NAMED:
            break
        real = os.path.realpath(root / rel)
        if os.path.isfile(real) and not library_or_system(real):
            found.append(real)
    return found


def _as_read(value: Any, exclude: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    if not isinstance(value, Mapping):
        return {}
    return {p: value[p] for p in _paths(list(value)) if not excluded(p, exclude)}


def _kept_copy(run_dir: Path | None, rel: str, before: Mapping[str, Any]) -> Path | None:
    """The child's copy of `rel` as the run read it, when it is still exactly those bytes."""
    if run_dir is None:
        return None
    copy = run_dir / KEPT_DIR / rel
    if not regular_inside(run_dir / KEPT_DIR, rel):
        return None
    return copy if sha256_and_size(copy) == (before["sha256"], before["size"]) else None


def changed_untracked(root: Path, since_ns: int) -> list[str]:
    """Untracked (not ignored) files whose mtime or ctime is not older than `since_ns`: written
    during the run by any process (sqlite, a subprocess), not only through the hooked `open`."""
    listing = git_repo.output(root, "ls-files", "-z", "--others", "--exclude-standard")
    changed = []
    for rel in git_repo.names(listing):
        try:
            now = os.lstat(root / rel)
        except OSError:
            continue
        if stat.S_ISREG(now.st_mode) and max(now.st_mtime_ns, now.st_ctime_ns) >= since_ns:
            changed.append(rel)
    return changed


def inputs_warning(inputs: Sequence[Mapping[str, Any]]) -> str | None:
    """What to do about inputs only this checkout has (None when every one is in the DVC cache)."""
    loose = [str(i["path"]) for i in inputs if not i.get("md5") and not i.get("rewritten")]
    lost = [str(i["path"]) for i in inputs if not i.get("md5") and i.get("rewritten")]
    said = []
    if loose:
        shown = " ".join(loose[:8]) + (" ..." if len(loose) > 8 else "")
        said.append(
            f"the script read {len(loose)} file(s) that neither git nor DVC tracks ({shown}): a restore "
            f"takes them from your checkout only while they stay as they are. Track them: `dvc add {shown}` "
            "(then commit the .dvc files), or `cascade run --track-inputs ...` to keep them in the DVC cache"
        )
    if lost:
        shown = " ".join(lost[:8]) + (" ..." if len(lost) > 8 else "")
        said.append(
            f"the script read {len(lost)} file(s) and then rewrote or removed them ({shown}): the bytes it "
            "read are recorded by their sha256 but kept nowhere, so a restore cannot provide them. "
            "`cascade init` (DVC) keeps them next time, up to 64 MiB each; or have the script write a new "
            "file instead"
        )
    return "; ".join(said) or None


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
