"""The parent's side of checkpoints: tail `checkpoints.jsonl`, hash each file once, put it in the DVC cache.

Runs in a thread of the parent process, so training never waits for hashing. A checkpoint file
was just written, so its single read comes from the page cache; the cache object is a reflink or a
hardlink of it (a copy only where neither works).

Each hash result is appended to `checkpoints_hashed.jsonl` in the run directory before anything that
depends on it happens (the second name of a version saved over is unlinked right after): a parent
killed mid-run leaves its results there, and the keeper a recovery makes takes them up instead of
hashing again files that are gone by then.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from cascade_repro.store import dvc_store
from cascade_repro.store.jsonl_tail import read_new_lines

if TYPE_CHECKING:
    from cascade_repro.store.delivery import Delivery

log = logging.getLogger(__name__)
POLL_S = 0.3
SUPERSEDED_DIR = "superseded"  # child/checkpoints.py keeps files saved over there, as hardlinks
HASHED_FILE = "checkpoints_hashed.jsonl"  # in the run directory: each save's hash result, as it came
_OBJECT_NAME = re.compile(r"[0-9a-f]{32}(\.dir)?")  # what a spooled result may name in the cache


@dataclass
class CheckpointEntry:
    path: str  # relative to the repository root (absolute when outside it)
    step: int | None
    metrics: dict[str, float]
    source: str  # "checkpoint" (cascade_repro.checkpoint) or "torch.save"
    md5: str | None = None
    size: int | None = None
    status: str = "kept"  # kept | pruned | overwritten | not_cached
    reason: str | None = None
    link: str | None = None  # how it entered the cache: reflink, hardlink, copy, present
    monitor: str | None = None
    mode: str | None = None
    files: int | None = None  # a directory checkpoint's number of files
    tensors: str | None = None  # the fingerprint of the tensors saved (child/saved_tensors.py)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None or k in ("md5", "step")}


@dataclass
class CheckpointKeeper:
    root: Path
    events: Path
    cache: dvc_store.Cache | None
    notify: Callable[[str], None] = lambda message: None
    # where no reflink can be made: a hardlink of the workspace file (which turns read-only), not a copy
    hardlink: bool = False
    entries: list[CheckpointEntry] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _offset: int = 0
    # saves whose file was replaced before it could be hashed, by (path, inode): a `superseded`
    # event (the child kept the old file under a second name) lets them be hashed after all
    _missing: dict[tuple[str, Any], CheckpointEntry] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    # results an earlier keeper of this run directory spooled (its parent died): by save number
    _hashed: dict[int, dict[str, Any]] = field(default_factory=dict)
    _numbers: dict[int, tuple[int, Any]] = field(default_factory=dict)  # id(entry) → (save number, inode)

    def __post_init__(self) -> None:
        self._hashed = _spooled_results(self.events.parent / HASHED_FILE)

    def start(self) -> CheckpointKeeper:
        self._thread = threading.Thread(target=self._loop, name="cascade-checkpoints", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> list[CheckpointEntry]:
        """After the child ended: take what is left, then return every entry."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._drain()
        for entry in self.entries:
            if entry.status == "missing":
                entry.status = "overwritten"
        return self.entries

    def _loop(self) -> None:
        while not self._stop.wait(POLL_S):
            self._drain()

    def _drain(self) -> None:
        lines, self._offset = read_new_lines(self.events, self._offset)
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            try:
                self._handle(event)
            except Exception as exc:  # one bad checkpoint must not lose the others
                log.debug("checkpoint event %s failed", event, exc_info=True)
                self.errors.append(f"checkpoint {event.get('path')}: {type(exc).__name__}: {exc}")

    def _pruned(self, rel: str) -> None:
        for entry in reversed(self.entries):
            if entry.path == rel and entry.status in ("kept", "missing"):
                entry.status, entry.reason = "pruned", None
                return

    def _left_out(self, entry: CheckpointEntry, path: Path) -> bool:
        """A checkpoint no DVC cache takes (outside the repository, or no DVC): said why, and a
        directory's size counted here (the size announced is the directory's own, 4 KB)."""
        if os.path.isabs(entry.path):
            entry.reason = "outside the repository: save checkpoints inside it"
        elif self.cache is None:
            entry.reason = "no DVC repository (run `cascade init`)"
        else:
            return False
        entry.status = "not_cached"
        if path.is_dir() and not path.is_symlink():
            entry.size, entry.files = _directory_size(path)
        return True

    def _handle(self, event: dict[str, Any]) -> None:
        path = Path(str(event["path"]))
        rel = dvc_store.relative_posix(path, self.root)
        if event.get("event") == "superseded":
            self._superseded(rel, event)
            return
        if event.get("event") == "pruned":
            self._pruned(rel)
            return
        for entry in self.entries:  # a version in the cache stays kept; one never hashed was overwritten
            if entry.path == rel and entry.status == "kept" and entry.md5 is None:
                entry.status = "overwritten"
        entry = CheckpointEntry(
            path=rel,
            step=event.get("step"),
            metrics=dict(event.get("metrics") or {}),
            source=str(event.get("source") or "torch.save"),
            size=event.get("size"),
            monitor=event.get("monitor"),
            mode=event.get("mode"),
            tensors=event.get("tensors") if isinstance(event.get("tensors"), str) else None,
        )
        self._numbers[id(entry)] = (len(self.entries), event.get("inode"))
        self.entries.append(entry)
        if self._left_out(entry, path):
            return
        assert self.cache is not None  # (`_left_out` takes every checkpoint without one)
        announced = (event.get("inode"), event.get("size"), event.get("mtime_ns"))
        earlier = self._earlier_result(entry)
        if earlier is not None:  # hashed by the keeper of a parent that died: the file may be gone now
            self._stored(entry, earlier, spool=False)
            return
        if path.is_dir() and not path.is_symlink():  # HF's checkpoint-500/: one DVC directory object
            stored = self.cache.add_directory(path)
        else:
            # (a file the script wrote through its own handle is rewritten in place: copied, never linked)
            linked = self.hardlink and not event.get("in_place")
            stored = self.cache.add(path, expect=announced, hardlink=linked)
        if stored is None:  # pruned or replaced before it could be hashed: the next events say which
            entry.status, entry.reason = "missing", "deleted or replaced before it could be hashed"
            self._missing[(rel, event.get("inode"))] = entry
            return
        self._stored(entry, stored)

    def _stored(self, entry: CheckpointEntry, stored: Any, spool: bool = True) -> None:
        entry.md5, entry.size, entry.link, entry.files = stored.md5, stored.size, stored.link, stored.files
        if spool:
            self._spool(entry)
        self.notify(
            f"checkpoint {entry.path} ({'before step 0' if entry.step is None else f'step {entry.step}'}) "
            f"→ DVC cache {stored.md5[:12]} ({stored.link})"
        )

    def _superseded(self, rel: str, event: dict[str, Any]) -> None:
        """The child saved over `rel`, keeping the old file under `kept_as` first: a version not hashed
        yet is hashed from there (the same inode, checked), then the second name goes."""
        kept_as = Path(str(event.get("kept_as")))
        if kept_as.parent != self.events.parent / SUPERSEDED_DIR:  # only the run directory's own
            return
        try:
            entry = self._missing.pop((rel, event.get("inode")), None)
            if entry is not None and self.cache is not None and entry.status == "missing":
                announced = (event.get("inode"), event.get("size"), event.get("mtime_ns"))
                stored = self.cache.add(kept_as, expect=announced, hardlink=True)
                if stored is not None:
                    entry.status, entry.reason = "kept", None
                    self._stored(entry, stored)
        finally:
            kept_as.unlink(missing_ok=True)

    def _spool(self, entry: CheckpointEntry) -> None:
        """The result, appended before the second name it may come from goes (no fsync: a dead
        process loses no written page, and a machine that crashed loses the cache's links as well)."""
        number, inode = self._numbers.get(id(entry), (None, None))
        if number is None:
            return
        line = json.dumps({"n": number, "path": entry.path, "inode": inode, "md5": entry.md5,
                           "size": entry.size, "link": entry.link, "files": entry.files})  # fmt: skip
        try:
            fd = os.open(self.events.parent / HASHED_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, (line + "\n").encode("utf-8"))
            finally:
                os.close(fd)
        except OSError as exc:  # a full disk: only a recovery after this parent's death would miss it
            log.debug("checkpoint result not spooled: %s", exc)

    def _earlier_result(self, entry: CheckpointEntry) -> dvc_store.Stored | None:
        """This save's result as a dead parent's keeper spooled it, if it names this save (its path
        and inode) and the cache still holds the object."""
        number, inode = self._numbers.get(id(entry), (None, None))
        found = self._hashed.get(number) if number is not None else None
        if found is None or self.cache is None or found.get("path") != entry.path:
            return None
        if found.get("inode") != inode:  # (a spool that is not this run directory's own)
            return None
        md5, size, files = found.get("md5"), found.get("size"), found.get("files")
        if not isinstance(md5, str) or not isinstance(size, int) or not _OBJECT_NAME.fullmatch(md5):
            return None
        if not self.cache.object_path(md5).exists():
            return None
        return dvc_store.Stored(md5, size, str(found.get("link") or "present"),
                                files if isinstance(files, int) else None)  # fmt: skip


def _spooled_results(path: Path) -> dict[int, dict[str, Any]]:
    """The hash results a keeper of this run directory spooled, by save number (none: a new run)."""
    results: dict[int, dict[str, Any]] = {}
    lines, _ = read_new_lines(path, 0)
    for line in lines:
        try:
            found = json.loads(line)
        except ValueError:
            continue
        if isinstance(found, dict) and isinstance(found.get("n"), int):
            results[found["n"]] = found
    return results


@dataclass(frozen=True)
class CheckpointsRecorded:
    entries: list[dict[str, Any]]
    warnings: list[str]
    tags: dict[str, str]


def _pointer_name(entry: CheckpointEntry, last: bool) -> str:
    """The `.dvc` pointer's artifact name: the path's own for its last version, and for each earlier
    version of a path saved again its step and md5 as well (each version has a pointer of its own)."""
    if last:
        return f"{entry.path}.dvc"
    step = "before-0" if entry.step is None else str(entry.step)
    return f"{entry.path}.step-{step}.{str(entry.md5)[:8]}.dvc"


def finish_checkpoints(keeper: CheckpointKeeper, delivery: Delivery, remote: str | None,
                       log_files: bool, notify: Callable[[str], None],
                       data_md5s: list[str] | None = None) -> CheckpointsRecorded:  # fmt: skip
    """After the child ended: pointers to MLflow (each its own outbox operation); kept checkpoints and
    the data the run read (when it was not committed yet, only this cache has it) pushed to the DVC
    remote."""
    from cascade_repro.store.delivery import file_op, text_op

    run_id = delivery.run_id
    entries = keeper.stop()
    warnings = list(keeper.errors[:5])
    kept = [e for e in entries if e.status == "kept" and e.md5 and e.size is not None]
    last = {e.path: e for e in kept}  # a path saved many times (nanoGPT's ckpt.pt): its last version
    for entry in kept:
        assert entry.md5 is not None and entry.size is not None
        pointer = dvc_store.pointer_text(entry.md5, entry.size, Path(entry.path).name, entry.files)
        name = _pointer_name(entry, last=last[entry.path] is entry)
        delivery.do(text_op(pointer, f"cascade/checkpoints/{name}"))
        if log_files and entry.files is None:  # files only: a directory stays in DVC
            parent = Path(entry.path).parent.as_posix()
            directory = "cascade/checkpoint_files" + ("" if parent == "." else f"/{parent}")
            delivery.do(file_op(keeper.root / entry.path, directory))
    warnings += _not_cached(entries)
    records = [e.to_dict() for e in entries]
    if keeper.cache is not None and data_md5s:  # inputs never cached here are not ours to push
        data_md5s = [m for m in data_md5s if keeper.cache.object_path(m).exists()]
    if (kept or data_md5s) and keeper.cache is not None:
        notify(
            f"pushing {len(kept)} checkpoint(s) and {len(data_md5s or [])} data object(s) to the DVC remote"
        )
        pushed = keeper.cache.push([e.md5 for e in kept if e.md5] + list(data_md5s or []), remote)
        for record in records:
            if record.get("status") == "kept" and record.get("md5"):
                record["remote"] = pushed.remote
                record["pushed"] = record["md5"] not in pushed.failed and pushed.error is None
        if not pushed.ok:
            reason = pushed.error or f"{len(pushed.failed)} object(s) failed"
            warnings.append(
                f"push to the DVC remote failed ({reason}); the checkpoints are safe in the local DVC cache, "
                f"`cascade push {run_id[:8]}` retries"
            )
    counts: dict[str, int] = {}
    for entry in entries:
        counts[entry.status] = counts.get(entry.status, 0) + 1
    tags = (
        {"cascade.checkpoints": ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))} if entries else {}
    )
    return CheckpointsRecorded(records, warnings, tags)


def _not_cached(entries: list[CheckpointEntry]) -> list[str]:
    """The warning for checkpoints left out of the DVC cache: each path once (one saved every epoch)."""
    left_out = [e for e in entries if e.status == "not_cached"]
    outside = list(dict.fromkeys(e.path for e in left_out))
    if not outside:
        return []
    more = f" and {len(outside) - 3} more" if len(outside) > 3 else ""
    return [f"checkpoints not in the DVC cache: {', '.join(outside[:3])}{more} ({left_out[-1].reason})"]


def _directory_size(path: Path) -> tuple[int, int]:
    """A directory checkpoint's bytes and files (HF's checkpoint-500/), where no DVC cache counts them."""
    size = files = 0
    for directory, _, names in os.walk(path):
        for name in names:
            try:
                status = os.lstat(os.path.join(directory, name))
            except OSError:  # (removed while it is counted: a rotation by save_total_limit)
                continue
            size, files = size + status.st_size, files + 1
    return size, files
