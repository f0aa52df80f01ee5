"""Checkpoints in the child: `cascade_repro.checkpoint(...)` with top-k, and the `torch.save` hook
(framework_checkpoints.py puts the same hook on `safetensors.torch.save_file`).

Each save is announced to the parent as one line of `checkpoints.jsonl` (path, step, metrics, and
the file's inode/size/mtime so the parent can tell the bytes it hashes are the ones announced).
The parent hashes and caches them in its own process: nothing here reads a checkpoint back.

A path that is saved again is unlinked first, so a new inode is written: the DVC cache may
hold the old bytes by hardlink, and truncating that inode in place would corrupt the cache. Before
that, the old file gets a second name in the run directory (a hardlink, no copy), announced as
`superseded`: a version the parent had not hashed yet (nanoGPT saves ckpt.pt every eval) is hashed
from there instead of being lost as "overwritten". The unlink goes through file_access's hook: a file
the run read before it saves over it (a resume checkpoint) keeps its bytes as read, an input. Each
save is then noted as written there (torch's writer is not Python's `open`), so a checkpoint the run
read back after saving it is its own output, inside the repository or outside.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping, NamedTuple

from cascade_repro.child import file_access, protocol

SUPERSEDED_DIR = "superseded"  # in the run directory: second names of files saved over


class Policy(NamedTuple):
    monitor: str | None = None
    mode: str = "min"
    save_top_k: int = 3  # -1 keeps every checkpoint
    save_last: bool = True

    @classmethod
    def from_env(cls) -> Policy:
        raw = os.environ.get(protocol.ENV_CHECKPOINT_POLICY)
        data = json.loads(raw) if raw else {}
        return cls(
            monitor=data.get("monitor"),
            mode=str(data.get("mode") or "min"),
            save_top_k=int(data.get("save_top_k", 3)),
            save_last=bool(data.get("save_last", True)),
        )


class _Saved(NamedTuple):
    path: Path
    step: int
    value: float | None


class CheckpointLog:
    """The child's side of checkpoints.jsonl (None path: plain `python train.py`, nothing announced).

    Plain classes, not dataclasses, here: the child's start is a measured target (dataclasses pulls in
    inspect, ~10 ms).
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.current_step: Callable[[], int | None] = lambda: None
        self.saved: list[_Saved] = []
        self.inside_api = threading.local()
        self.lock = threading.Lock()
        self.warned_monitor = False
        self.superseded = 0
        self.unwritten: list[str] = []  # notes the run directory could not take yet (a full disk)
        self.cut = False  # the last write stopped short of its line's end
        self.warned_full = False
        os.register_at_fork(after_in_child=self._forked)

    def make_room(self, path: Path) -> None:
        """Before a save over an existing file: keep its bytes for the parent under a second name,
        then unlink it so the save writes a new inode."""
        if not path.exists() or path.is_symlink() or path.is_dir():
            return
        if self.path is not None:
            with self.lock:
                self.superseded += 1
                keep = self.path.parent / SUPERSEDED_DIR / f"{os.getpid()}-{self.superseded}-{path.name}"
            try:
                keep.parent.mkdir(mode=0o700, exist_ok=True)
                os.link(path, keep)
            except OSError:  # another file system, or none with hardlinks: the old bytes go
                pass
            else:
                self.announce("superseded", path, kept_as=str(keep), **_identity(keep))
        path.unlink()  # (through file_access's hook: a file the run read keeps its bytes as read)

    def announce(self, event: str, path: Path, **fields: Any) -> None:
        if self.path is None:
            return
        record: dict[str, Any] = {"event": event, "path": str(path), "ts": time.time(), **fields}
        if event == "saved":
            try:
                record.update(_identity(path))
            except OSError:
                return
        with self.lock:
            self.unwritten.append(json.dumps(record, default=str) + "\n")
            self.write_unwritten()

    def write_unwritten(self) -> str | None:
        """The notes not written yet, appended in order (under `lock`). Where the run directory cannot
        take them (its disk full) they wait in memory, for the next save or the script's end
        (`runtime.write_checkpoint_notes`, after the reserve is given up): the script's own save never
        fails for them. Returns the error that kept them, if any. A line a full disk cut short stays
        as it is (the parent skips it; cutting it back could take a line another process appended
        since): the next note starts a line of its own."""
        assert self.path is not None
        written, fd = 0, None
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            for line in self.unwritten:
                data = (b"\n" if self.cut else b"") + line.encode()
                if os.write(fd, data) != len(data):
                    self.cut = True
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                self.cut = False
                written += 1
        except OSError as exc:
            return self._kept(exc)
        finally:
            del self.unwritten[:written]
            if fd is not None:
                with contextlib.suppress(OSError):  # (NFS reports a full quota at close)
                    os.close(fd)
        return None

    def _forked(self) -> None:
        """A forked process (a DataLoader worker) starts with none of its parent's notes to write."""
        self.unwritten.clear()
        self.cut = False

    def _kept(self, exc: OSError) -> str:
        error = f"{exc.strerror or exc}"
        if not self.warned_full:
            self.warned_full = True
            sys.stderr.write(f"cascade: checkpoint notes wait in memory: the run directory cannot take them "
                             f"({error}); the script goes on\n")  # fmt: skip
        return error


def _identity(path: Path) -> dict[str, int]:
    """What tells the parent the bytes it hashes are the ones announced."""
    stat = os.stat(path)
    return {"inode": stat.st_ino, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def checkpoints_dir() -> Path:
    configured = os.environ.get(protocol.ENV_CHECKPOINTS_DIR)
    return Path(configured) if configured else Path("checkpoints")


def save(log: CheckpointLog, torch: Any, obj: Any, step: int | None, metrics: Mapping[str, Any] | None,
         policy: Policy, filename: str | None) -> Path:  # fmt: skip
    """torch.save into the checkpoints dir, announce it, then prune to the best `save_top_k`."""
    if step is None:
        step = log.current_step()
    if step is None:
        step = len(log.saved)
    values = {str(k): float(v) for k, v in (metrics or {}).items()}
    directory = checkpoints_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = (directory / (filename or f"step-{int(step):08d}.pt")).absolute()
    log.inside_api.active = True
    try:
        torch.save(obj, path)
    finally:
        log.inside_api.active = False
    from cascade_repro.child.saved_tensors import tensors_fingerprint  # (once torch is in use)

    log.announce("saved", path, step=int(step), metrics=values, source="checkpoint", monitor=policy.monitor,
                 mode=policy.mode, tensors=tensors_fingerprint(torch, obj))  # fmt: skip
    value = values.get(policy.monitor) if policy.monitor else None
    if policy.monitor and value is None and not log.warned_monitor:
        log.warned_monitor = True
        sys.stderr.write(f"cascade: checkpoint: no metric {policy.monitor!r} given; keeping them all\n")
    log.saved = [s for s in log.saved if s.path != path] + [_Saved(path, int(step), value)]
    for pruned in _to_prune(log.saved, policy):
        log.saved = [s for s in log.saved if s is not pruned]
        try:
            pruned.path.unlink()
        except FileNotFoundError:
            pass
        log.announce("pruned", pruned.path, step=pruned.step)
    return path


def _to_prune(saved: list[_Saved], policy: Policy) -> list[_Saved]:
    if policy.save_top_k < 0 or policy.monitor is None or any(s.value is None for s in saved):
        return []
    last = saved[-1] if policy.save_last else None
    sign = 1.0 if policy.mode == "min" else -1.0
    ranked = sorted(saved, key=lambda s: sign * (s.value or 0.0))
    keep = {id(s) for s in ranked[: policy.save_top_k]}
    if last is not None:
        keep.add(id(last))
    return [s for s in saved if id(s) not in keep]


def install_torch_save_hook(torch: Any, log: CheckpointLog) -> None:
    """Every `torch.save(obj, path)` is announced with the step it happened at."""
    wrap_save_function(torch, "save", "f", log, source="torch.save")


def wrap_save_function(owner: Any, name: str, keyword: str, log: CheckpointLog, source: str) -> None:
    """`owner.name(obj, path, ...)` (the path second, or passed as `keyword`) announces the file it
    wrote, with the step it happened at, unless a checkpoint API it is part of announces it."""
    original = getattr(owner, name)

    def save_and_announce(*args: Any, **kwargs: Any) -> Any:
        f = args[1] if len(args) > 1 else kwargs.get(keyword)
        path = Path(os.fspath(f)).absolute() if isinstance(f, (str, os.PathLike)) else None
        if path is not None:
            log.make_room(path)  # a new inode: the cache may hold the old one by hardlink
        result = original(*args, **kwargs)
        if path is not None:
            file_access.note_saved(path)  # its own file from now on, read back or saved over
        if getattr(log.inside_api, "active", False):
            return result
        opened = path or _opened_for_writing(f)
        if opened is None:
            return result
        from cascade_repro.child.saved_tensors import tensors_fingerprint  # (once torch is in use)

        torch = sys.modules.get("torch")
        obj = args[0] if args else kwargs.get("obj", kwargs.get("tensors"))
        tensors = tensors_fingerprint(torch, obj) if torch is not None else None
        if path is not None:
            log.announce("saved", path, step=log.current_step(), metrics={}, source=source, tensors=tensors)
        else:  # `with open(path, "wb") as f: torch.save(model, f)` (pytorch/examples): the file it names;
            # in place: the next open() truncates this inode, so the cache copies it
            log.announce("saved", opened, step=log.current_step(), metrics={}, source=source, in_place=True,
                         tensors=tensors)  # fmt: skip
        return result

    save_and_announce.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(owner, name, save_and_announce)


def _opened_for_writing(f: Any) -> Path | None:
    """The path of a file object the script opened by name for writing, its bytes flushed (what it
    wrote so far is what the parent hashes); None for a buffer, a socket, a descriptor."""
    name = getattr(f, "name", None)
    writable = getattr(f, "writable", None)
    if not isinstance(name, str) or not callable(writable):
        return None
    try:
        if not writable():
            return None
        f.flush()
    except (OSError, ValueError):  # closed, or not a file
        return None
    path = Path(name).absolute()
    return path if path.is_file() else None
