"""The contract between the parent (`cascade run`) and the child: environment names and run-dir files."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import threading
from pathlib import Path
from typing import IO, Any, Mapping

# Environment variables the parent sets for the child.
ENV_RUN_DIR = "CASCADE_RUN_DIR"
ENV_SEED = "CASCADE_SEED"
ENV_DETERMINISM = "CASCADE_DETERMINISM"
ENV_TRACE_INTERVAL = "CASCADE_TRACE_INTERVAL"  # record every Nth optimizer step; 0: no trace
ENV_TRACE_BUDGET = "CASCADE_TRACE_BUDGET"  # weights fingerprinted within this share of step time; 0: always
ENV_TRACE_SCHEDULE = "CASCADE_TRACE_SCHEDULE"  # `cascade restore`: the recorded sampling schedule (JSON)
ENV_TRACE_RECORDS = "CASCADE_TRACE_RECORDS"  # ... and the recorded steps with a record (JSON)
ENV_TRACE_GRADS = "CASCADE_TRACE_GRADS"  # "1" / "0": gradient fingerprints always / never; else where cheap
ENV_CHECKPOINTS_DIR = "CASCADE_CHECKPOINTS_DIR"  # absolute: where cascade_repro.checkpoint() writes
ENV_CHECKPOINT_POLICY = "CASCADE_CHECKPOINT_POLICY"  # JSON: monitor, mode, save_top_k, save_last
ENV_NUM_THREADS = "CASCADE_NUM_THREADS"  # `cascade restore`: torch.set_num_threads(N) as recorded
ENV_STOP_AFTER = "CASCADE_STOP_AFTER_STEPS"  # `cascade restore --steps N`: exit 0 once N steps are traced
ENV_TRACE_DUMP = "CASCADE_TRACE_DUMP"  # `verify --replay`: "FIRST:LAST:DIR", those steps' tensors saved there
ENV_PARENT_PID = "CASCADE_PARENT_PID"  # the child stops (SIGTERM) when this process dies
ENV_MLFLOW_RUN_ID = "CASCADE_MLFLOW_RUN_ID"  # the child's own note of the run id its MLflow hook logs to
ENV_ROOT = "CASCADE_ROOT"  # the repository root: files opened under it are noted in FILES_FILE
# `cascade restore`: {"checkout", "worktree", "own"}: modules found in the checkout are imported from the
# worktree (child/restored_code.py)
ENV_RESTORED_CODE = "CASCADE_RESTORED_CODE"
DUMP_FILE = "tensors.pt"  # DIR/stepN/: {"params_before"|"grads"|"params_after": {name: tensor}}

# Files inside the run directory.
PARAMS_FILE = "params.json"  # parent → child: resolved hyperparameters
RUN_ID_FILE = "mlflow_run_id"  # parent → child: written once the MLflow run exists
EVENTS_FILE = "events.jsonl"  # child → parent: metric events, one JSON array per line
FACTS_FILE = "child.json"  # child → parent: flags applied, torch stack, exception, GPU memory
TRACE_FILE = "trace.jsonl"  # child → parent: one JSON record per traced step
# its rule, as the record's trace.format says: /2, a step holds every batch and loss it trained on;
# /3, under a GradScaler, the loss the script scaled and a step the scaler skipped as its own
# (determinism/trace_formats.py compares older traces with it as far as they allow)
TRACE_FORMAT = "cascade.trace/3"
CHECKPOINTS_FILE = "checkpoints.jsonl"  # child → parent: one line per checkpoint saved or pruned
FILES_FILE = "files.jsonl"  # child → parent: {"read"|"written": path} per repository file opened
OUTPUT_LOG = "output.log"  # parent: the script's stdout and stderr as the terminal saw them
RANKS_DIR = "ranks"  # multi-process runs: rank K > 0 writes its files in ranks/K/ (rank 0 in the run dir)
RANK_EXIT_FILE = "exit.json"  # in ranks/K/, by the `cascade run` of a rank under the user's torchrun
RESERVE_FILE = "reserve"  # space set aside at the start, given up on a full disk (the run's end)
RESERVE_BYTES = 256 << 10  # the final record, the outbox and the child's exit facts, on a full disk
FULL_DISK = (errno.ENOSPC, errno.EDQUOT)  # a full disk, or the user's quota on it

DETERMINISM_MODES = ("off", "warn", "strict")
# How torch words a nondeterministic op, as a warning (mode warn) or an error (mode strict).
NONDETERMINISTIC_MARKER = " does not have a deterministic implementation"


def process_rank(environ: Mapping[str, str]) -> int:
    """This process's rank in a job of several (torchrun, or any launcher that sets RANK and
    WORLD_SIZE); 0 when there is none, or a RANK without a world of more than one process."""
    try:
        rank, world_size = int(environ.get("RANK", "0")), int(environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 0
    return rank if 0 <= rank < world_size else 0


def rank_dir(run_dir: Path, rank: int) -> Path:
    """Where rank `rank` writes its trace, facts and events: the run directory itself for rank 0."""
    return run_dir if rank == 0 else run_dir / RANKS_DIR / str(rank)


def nondeterministic_op(message: str) -> str | None:
    """The op's name in torch's nondeterminism alert ("max_unpooling2d_forward_out does not have a
    deterministic implementation, but you set ..."), else None."""
    if NONDETERMINISTIC_MARKER not in message:
        return None
    return message.split(NONDETERMINISTIC_MARKER, 1)[0].strip().splitlines()[-1].strip() or None


def open_private(path: Path, mode: str = "a") -> IO[Any]:
    """Open a run-directory file readable by its owner only (0600), whatever the umask: hand-off
    files hold what the script logged and read."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if mode.startswith("w") else os.O_APPEND)
    fd = os.open(path, flags, 0o600)
    try:
        os.fchmod(fd, 0o600)  # os.open keeps an existing file's mode
    except OSError:
        pass  # a file system without modes
    return os.fdopen(fd, mode, encoding=None if "b" in mode else "utf-8")


def write_json_atomic(path: Path, data: Any, last_words: bool = False) -> None:
    """Write JSON so a reader never sees half a file (write a sibling, then rename), mode 0600; a
    sibling that could not be written is removed, never left behind. `last_words` (the run's end: the
    exit facts, the ledger's `ended`, the record): on a full disk (or quota) the directory's
    RESERVE_FILE, if any, is given up for it. A write in the middle of the run fails as the disk does
    and leaves the reserve for the end (the script would fill what it freed)."""
    text = json.dumps(data, indent=2, sort_keys=True, default=str)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")  # threads too
    for attempt in (1, 2):
        try:
            with open_private(tmp, "w") as handle:
                handle.write(text)
            os.replace(tmp, path)
            return
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            full = last_words and exc.errno in FULL_DISK
            if attempt == 2 or not full or not _release_reserve(path.parent):
                raise


def set_aside_reserve(directory: Path) -> None:
    """Space set aside in `directory` for the run's last words (the run directory's, by the parent; a
    rank's ranks/K/, by that rank's child): a script that fills the disk must not keep its end
    (status, exit code, exception) from the spool. Allocated, not written, where the file system can;
    none on a file system with little room left (the run's own files need it more)."""
    path = directory / RESERVE_FILE
    try:
        room = os.statvfs(directory)
        if room.f_bavail * room.f_frsize < 16 * RESERVE_BYTES:
            return
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except OSError:
        return
    try:
        try:
            os.posix_fallocate(fd, 0, RESERVE_BYTES)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
            if os.write(fd, bytes(RESERVE_BYTES)) != RESERVE_BYTES:  # no fallocate on this file system
                raise OSError(errno.ENOSPC, "short write") from exc
    except OSError:  # no room to set aside: nothing is
        with contextlib.suppress(OSError):
            os.unlink(path)
    finally:
        os.close(fd)


def _release_reserve(directory: Path) -> bool:
    try:
        os.unlink(directory / RESERVE_FILE)
    except OSError:
        return False
    return True
