"""The run directory as the spool of a run: who owns it, what of it is stored, what is still pending.

Everything the child and the parent write goes to `.cascade/runs/<dir>/` first. The directory is
removed only once all of it is in the store, so the next cascade command, `cascade sync` or
`cascade recover` can finish a run whose parent died or whose store stopped answering.

    lock            flock held by the live parent for its whole life (and by a recoverer meanwhile)
    reserve         space set aside; the first of the run's last words to meet a full disk frees it
    parent.json     the parent's pid, start time (/proc/<pid>/stat ticks), boot id and host, and its
                    child's; its mtime is the parent's heartbeat
    plan.json       what a recoverer needs to open the run itself: store, experiment, tags, params
    run.json        the newest local copy of the run record
    delivery.json   the outbox: every store write of the run, in order, with its state
    metrics.json    how far events.jsonl and parent_events.jsonl are delivered (byte offsets)

Only the standard library here: listing the spool is on every command's path.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

from cascade_repro.child import protocol
from cascade_repro.errors import CascadeError

LOCK_FILE = "lock"
OWNER_FILE = "parent.json"
PLAN_FILE = "plan.json"
RECORD_FILE = "run.json"
LEDGER_FILE = "delivery.json"
OFFSETS_FILE = "metrics.json"
PARENT_EVENTS_FILE = "parent_events.jsonl"  # the parent's own points (resources), format of events.jsonl
EVENT_FILES = (protocol.EVENTS_FILE, PARENT_EVENTS_FILE)
SPOOL_TAG = "cascade.spool"  # on the MLflow run: its directory's name, so a recoverer finds a run it opened

HEARTBEAT_S = 5.0
STALE_S = 120.0  # a parent on another host silent this long is taken for dead
YOUNG_S = 30.0  # a directory without parent.json this young may still be in the making

# States of a run directory, as `scan` sees it.
DEAD = "dead"  # its parent is gone without finishing: deliver, close KILLED (or as the script ended)
PENDING = "pending"  # its parent finished but the store did not take everything: `cascade sync`

# States of an outbox operation.
STORED = "stored"
WAITING = "pending"  # not tried yet, or the store did not answer: tried again by `cascade sync`
FAILED = "failed"  # the store refused it (an invalid request): recorded as not stored, not retried

Point = tuple[str, float, int, int]  # key, value, timestamp ms, step


# -- ownership ------------------------------------------------------------------------------------
def make_run_dir(base: Path) -> tuple[Path, int]:
    """A new run directory, already locked by this process and stamped with its owner.

    Made under a hidden name and renamed into place, so a scan never sees it without its lock.
    """
    stamp = time.strftime("%Y%m%d-%H%M%S")
    name = f"{stamp}-{os.getpid()}"
    hidden = base / f".{name}.new"
    fd: int | None = None
    made = False
    try:
        base.mkdir(parents=True, exist_ok=True)
        hidden.mkdir(mode=0o700)  # what the script logs and reads is its owner's only
        made = True
        fd = _lock(hidden / LOCK_FILE)
        assert fd is not None  # nobody else knows the directory yet
        write_owner(hidden)
        protocol.set_aside_reserve(hidden)
        run_dir = base / name
        os.rename(hidden, run_dir)
    except OSError as exc:  # a full disk, a read-only one: said before anything runs, nothing left
        if fd is not None:
            release(fd)
        if made:  # (never another process's: one of the same pid in another container)
            shutil.rmtree(hidden, ignore_errors=True)
        raise cannot_make(base, exc) from exc
    return run_dir, fd


def cannot_make(base: Path, exc: OSError, what: str = "make") -> CascadeError:
    """Why no run directory could be made (or, once made, prepared for the script) in `base`, and the
    fix."""
    where = f"{base.parent.name}/{base.name}"
    reason = exc.strerror or str(exc)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        hint = f"free space on the disk that holds {base} (a run needs room for its log, trace and record)"
    else:
        hint = f"make {base} writable by you"
    return CascadeError(f"cannot {what} the run's directory in {where}: {reason}; the script did not run",
                        hint=hint)  # fmt: skip


def disk_full(run_dir: Path) -> bool:
    """Whether the run directory's disk has no room left for what a run writes at its end."""
    try:
        room = os.statvfs(run_dir)
    except OSError:
        return False
    return room.f_bavail * room.f_frsize < protocol.RESERVE_BYTES


def release(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


def try_claim(run_dir: Path) -> int | None:
    """The run directory's lock, or None when a live parent or another recoverer holds it."""
    return _lock(run_dir / LOCK_FILE)


def _lock(path: Path) -> int | None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return None
        raise
    return fd


def write_owner(run_dir: Path, child_pid: int | None = None) -> None:
    """parent.json: this process (and its child) as /proc identifies them, so pid reuse is seen."""
    pid = os.getpid()
    owner: dict[str, Any] = {
        "pid": pid,
        "start_ticks": _start_ticks(pid),
        "boot_id": _boot_id(),
        "host": socket.gethostname(),
        "started_at": time.time(),
    }
    if child_pid is not None:
        owner["child_pid"] = child_pid
        owner["child_start_ticks"] = _start_ticks(child_pid)
    write_json(run_dir / OWNER_FILE, owner)


class Heartbeat:
    """Touches parent.json every few seconds while the parent lives (read where pids cannot be)."""

    def __init__(self, run_dir: Path, every_s: float = HEARTBEAT_S) -> None:
        self._path = run_dir / OWNER_FILE
        self._every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="cascade-heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self._every_s):
            with contextlib.suppress(OSError):
                os.utime(self._path)


def owner_alive(run_dir: Path) -> bool:
    """Whether the parent named in parent.json (or its child) still runs."""
    owner = read_json(run_dir / OWNER_FILE)
    if not owner:
        return False
    if owner.get("host") != socket.gethostname() or owner.get("boot_id") != _boot_id():
        if owner.get("host") != socket.gethostname():  # pids mean nothing here: the heartbeat decides
            return time.time() - last_heartbeat(run_dir) < STALE_S
        return False  # the machine rebooted since
    for pid_key, ticks_key in (("pid", "start_ticks"), ("child_pid", "child_start_ticks")):
        pid = owner.get(pid_key)
        if isinstance(pid, int) and _running(pid, owner.get(ticks_key)):
            return True
    return False


def last_heartbeat(run_dir: Path) -> float:
    """When the parent was last known alive: parent.json's mtime, else the newest file's."""
    try:
        return (run_dir / OWNER_FILE).stat().st_mtime
    except OSError:
        pass
    try:
        return max((entry.stat().st_mtime for entry in os.scandir(run_dir)), default=run_dir.stat().st_mtime)
    except OSError:
        return time.time()


ACTIVITY_FILES = (OWNER_FILE, protocol.EVENTS_FILE, PARENT_EVENTS_FILE, protocol.TRACE_FILE,
                  protocol.OUTPUT_LOG, protocol.CHECKPOINTS_FILE, protocol.FILES_FILE,
                  protocol.FACTS_FILE)  # fmt: skip  (the child's facts: written as it exits)


def last_activity(run_dir: Path) -> float:
    """When the run was last seen doing something: the newest of the heartbeat and the files the
    child and the parent append to as it goes (its events, trace, output log, checkpoints, files),
    the end of a run whose parent died between two heartbeats."""
    times = []
    for name in ACTIVITY_FILES:
        with contextlib.suppress(OSError):
            times.append((run_dir / name).stat().st_mtime)
    return max(times) if times else last_heartbeat(run_dir)


def _running(pid: int, start_ticks: Any) -> bool:
    stat = proc_stat(pid)
    if stat is None or stat[0] in ("Z", "X"):
        return False
    return start_ticks is None or stat[1] == start_ticks


def _start_ticks(pid: int) -> int | None:
    stat = proc_stat(pid)
    return stat[1] if stat else None


def proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks since boot) from /proc/<pid>/stat, or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
        fields = text.rsplit(")", 1)[1].split()  # the command name may hold spaces and parentheses
        return fields[0], int(fields[19])  # fields 3 (state) and 22 (starttime) of proc(5)
    except (OSError, IndexError, ValueError):
        return None


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text(encoding="utf-8").strip()
    except OSError:
        return None


# -- finding runs to finish ---------------------------------------------------------------------------
@dataclass(frozen=True)
class SpoolEntry:
    path: Path
    state: str  # DEAD or PENDING
    run_id: str | None


def scan_all(runs_dirs: list[Path]) -> list[SpoolEntry]:
    """`scan` of each directory (a project's and its restore worktrees': `ProjectPaths.spool_dirs`)."""
    return [entry for runs_dir in runs_dirs for entry in scan(runs_dir)]


def run_dirs(runs_dir: Path) -> list[Path]:
    """The run directories in `runs_dir`, by name (none being made: those are hidden until locked)."""
    try:
        names = sorted(
            entry.name for entry in os.scandir(runs_dir) if entry.is_dir() and entry.name[0] != "."
        )
    except OSError:  # no run there (yet)
        return []
    return [runs_dir / name for name in names]


def scan(runs_dir: Path) -> list[SpoolEntry]:
    """Run directories whose parent is gone: one directory listing, a lock try and a read or two each."""
    found = []
    for path in run_dirs(runs_dir):
        state = classify(path)
        if state is not None:
            found.append(SpoolEntry(path, state, Ledger.load(path).run_id))
    return found


def classify(run_dir: Path) -> str | None:
    """DEAD, PENDING, or None when its parent runs (or another command is finishing it)."""
    try:
        fd = try_claim(run_dir)
    except OSError:
        return None
    if fd is None:
        return None
    try:
        return claimed_state(run_dir)
    finally:
        release(fd)


def claimed_state(run_dir: Path) -> str | None:
    """The state of a run directory whose lock the caller holds."""
    if not (run_dir / OWNER_FILE).exists():
        # Made by a cascade without spool ownership, or an empty leftover: old enough means dead.
        try:
            age = time.time() - run_dir.stat().st_mtime
        except OSError:
            return None
        has_events = (run_dir / protocol.EVENTS_FILE).exists()
        return DEAD if age > YOUNG_S and has_events else None
    if owner_alive(run_dir):
        return None
    return PENDING if Ledger.load(run_dir).parent in ("exited", "gone") else DEAD


# -- the outbox ------------------------------------------------------------------------------------
class Ledger:
    """delivery.json: the run id, how far the parent got, and every store write with its state."""

    def __init__(self, run_dir: Path, data: dict[str, Any]) -> None:
        self.run_dir = run_dir
        self.data = data
        self.unsaved: str | None = None  # why the last save failed
        self._lock = threading.Lock()

    @classmethod
    def load(cls, run_dir: Path) -> Ledger:
        data = read_json(run_dir / LEDGER_FILE)
        data.setdefault("ops", [])
        return cls(run_dir, data)

    @property
    def run_id(self) -> str | None:
        value = self.data.get("run_id")
        if not value:  # an older spool: only the file the child reads
            with contextlib.suppress(OSError):
                value = (self.run_dir / protocol.RUN_ID_FILE).read_text(encoding="utf-8").strip()
        return value or None

    @property
    def parent(self) -> str:
        """running | exited (finished with something pending) | gone (died; a recoverer tried)."""
        return str(self.data.get("parent") or "running")

    @property
    def stage(self) -> str:
        """How far the local record got: skeleton | captured | final."""
        return str(self.data.get("stage") or "skeleton")

    @property
    def ended(self) -> dict[str, Any] | None:
        """How the script ended, once the parent saw it."""
        return self.data.get("ended")

    def ops(self) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(op) for op in self.data["ops"]]

    def update(self, **values: Any) -> None:
        with self._lock:
            self.data.update(values)
            self._save()

    def put(self, op: dict[str, Any]) -> None:
        """Add an operation, or replace the one with the same id (a newer record, say)."""
        with self._lock:
            ops = self.data["ops"]
            for index, existing in enumerate(ops):
                if existing["id"] == op["id"]:
                    ops[index] = op
                    break
            else:
                ops.append(op)
            self._save()

    def _save(self) -> None:
        # The live parent works from memory; the file is for a recoverer. A full disk must not stop
        # the delivery (the run then cannot be recovered if this process dies too: said once).
        try:
            # once the run has ended, what is saved is its end (the record, the close): the reserve's
            write_json(self.run_dir / LEDGER_FILE, self.data, last_words="ended" in self.data)
            self.unsaved = None
        except OSError as exc:
            self.unsaved = f"{exc.strerror or exc}"


# -- metric points on disk --------------------------------------------------------------------------
def read_points(path: Path, offset: int, limit: int, chunk: int = 1 << 20) -> tuple[list[Point], int, int]:
    """At least `limit` points (whole lines) from `offset` when there are that many, the offset after
    the last line read, and the number of unreadable lines skipped. Memory: one chunk and the points."""
    points: list[Point] = []
    bad = 0
    try:
        handle = open(path, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        return points, offset, bad
    with handle:
        handle.seek(offset)
        rest = b""
        while len(points) < limit:
            data = handle.read(chunk)
            if not data:
                break
            data = rest + data
            end = data.rfind(b"\n") + 1
            rest = data[end:]
            lines = data[:end].split(b"\n")[:-1] if end else []
            for line in lines:
                offset += len(line) + 1
                if line.strip():
                    try:
                        points.extend(parse_event(line))
                    except (ValueError, TypeError):
                        bad += 1
                if len(points) >= limit:
                    break
    return points, offset, bad


def parse_event(line: bytes) -> list[Point]:
    ts, step, values = json.loads(line)
    return [(str(k), float(v), int(ts), int(step)) for k, v in values.items()]


def iter_points(path: Path, end: int, chunk: int = 1 << 20) -> Iterator[Point]:
    """Every point of an events file up to offset `end` (a line boundary), one chunk in memory at a time."""
    try:
        handle = open(path, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        return
    with handle:
        offset, rest = 0, b""
        while offset < end:
            data = handle.read(min(chunk, end - offset))
            if not data:
                break
            offset += len(data)
            lines = (rest + data).split(b"\n")
            rest = lines.pop()
            for line in lines:
                if line.strip():
                    with contextlib.suppress(ValueError, TypeError):
                        yield from parse_event(line)


def append_event(path: Path, values: dict[str, float], step: int = 0) -> None:
    """One line of the events format, for the parent's own points."""
    line = json.dumps([int(time.time() * 1000), step, values]) + "\n"
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(line)


def trace_cut_short(facts: Mapping[str, Any]) -> list[str]:
    """The step trace, where a full disk stopped it (its header says where and why; a trace stopped by
    another failure is said when it stops, and its record is whole up to there)."""
    trace = facts.get("trace")
    stopped = trace.get("stopped") if isinstance(trace, Mapping) else None
    if not isinstance(stopped, Mapping) or stopped.get("full_disk") is not True:
        return []
    return [f"the step trace stopped at step {stopped.get('step')} ({stopped.get('error')}): the run "
            "directory's disk is full, and the steps after it are not in it"]  # fmt: skip


def trace_section(run_dir: Path, header: dict[str, Any] | None) -> dict[str, Any] | None:
    """The record's `trace` section for the step trace the child wrote (None: no trace)."""
    path = run_dir / protocol.TRACE_FILE
    if header is None or not path.exists():
        return None
    with open(path, "rb") as handle:
        steps = sum(1 for line in handle if line.strip())
    return {
        "artifact": f"cascade/{protocol.TRACE_FILE}",
        "format": protocol.TRACE_FORMAT,
        "steps": steps,
        **header,
    }


# -- files -----------------------------------------------------------------------------------------
def write_json(path: Path, data: Any, last_words: bool = False) -> None:
    """Atomic, private (0600: plans and records may hold what the script was given); `last_words`
    (the run's end) may take the run directory's reserve (`protocol.write_json_atomic`)."""
    protocol.write_json_atomic(path, data, last_words)


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
