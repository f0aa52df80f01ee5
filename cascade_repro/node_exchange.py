"""The store as the meeting point of a torchrun job's nodes: the other nodes' ranks into rank 0's run.

Rank 0's `cascade run` tags its run with the job (`distributed.JOB_TAG`: the rendezvous id). The
first rank of each other node, once its node's scripts have ended, finds that run by the tag (the
newest RUNNING one: rank 0's waits for the others before it finishes) and stores its node's ranks in
it, each in `cascade/ranks/K/`: `trace.jsonl`, `output.log`, then `exit.json` (how rank K ended, the
entry rank 0 makes itself for the ranks of its own node). Rank 0's waits for each `exit.json`, at most
`RANK_WAIT_S`, and reads it as the untrusted input a shared store's file is.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

from cascade_repro.child import protocol
from cascade_repro.distributed import (
    JOB_TAG,
    RANK_WAIT_S,
    Distributed,
    collect_ranks,
    leave_job_dir,
    rank_entry,
    trace_artifact,
)
from cascade_repro.errors import StoreError, UsageError
from cascade_repro.store.run_store import RunStore

EXIT_FILE = "exit.json"
POLL_S = 0.5
MAX_TEXT = 2000  # of an error's message read back from another node
MAX_EXIT_BYTES = 1 << 20  # an exit.json longer than this is not one cascade wrote
CLOCK_SKEW_MS = 10 * 60 * 1000  # how far the nodes' clocks and the store's may disagree
MAX_WAITS = 4  # rank 0 waits up to this many RANK_WAIT_S while other nodes' ranks keep arriving
UNNAMED_JOBS = ("none", "job")  # torchrun's default --rdzv-id, and a job whose id was unusable


def deliver_node(layout: Distributed, store: RunStore, job_dir: Path, notify: Callable[[str], None],
                 started_ms: int, wait_s: float = RANK_WAIT_S) -> str | None:  # fmt: skip
    """This node's ranks (this one first, then the others once they have ended) into rank 0's run,
    the newest RUNNING one of the job that started after this node's scripts began (less
    CLOCK_SKEW_MS); the run's id, or None when none was found in `wait_s` (the files then stay in
    `job_dir`)."""
    if layout.job in UNNAMED_JOBS:
        raise UsageError(
            f"the torchrun job has no id of its own ({layout.job!r}): its ranks on this node cannot tell "
            "rank 0's run from another job's",
            hint="give torchrun --rdzv-id NAME (unique to the job), or use cascade run --nnodes",
        )
    own = protocol.rank_dir(job_dir, layout.rank)
    entries = [rank_entry(layout.rank, own, own / protocol.RANK_EXIT_FILE)]
    entries += collect_ranks(layout, job_dir, notify, wait_s)
    run_id = _job_run(store, str(layout.job), started_ms - CLOCK_SKEW_MS, wait_s)
    if run_id is None:
        notify(f"rank 0's run of job {layout.job} is not in the store ({store.tracking_uri}): ranks "
               f"{_span(layout)} are not recorded; their files stay in {job_dir}")  # fmt: skip
        return None
    for entry in entries:
        rank = entry["rank"]
        files = protocol.rank_dir(job_dir, rank)
        for name in (protocol.TRACE_FILE, protocol.OUTPUT_LOG):
            if (files / name).is_file():
                store.log_file(run_id, files / name, f"cascade/ranks/{rank}")
        store.log_json(run_id, entry, f"cascade/ranks/{rank}/{EXIT_FILE}")  # last: the rank is complete
    leave_job_dir(job_dir, layout.node_ranks)
    notify(f"ranks {_span(layout)} of this node are recorded in run {run_id}")
    return run_id


def collect_remote(layout: Distributed, store: RunStore, run_id: str, notify: Callable[[str], None],
                   wait_s: float = RANK_WAIT_S) -> list[dict[str, Any]]:  # fmt: skip
    """Rank 0: the entry of each rank on another node, as its node delivered it into the run."""
    waiting = list(layout.remote_ranks)
    found: dict[int, dict[str, Any]] = {}
    started, told = time.monotonic(), False
    deadline, seen = started + wait_s, 0
    while waiting:
        present = _delivered_dirs(store, run_id)
        if len(present) > seen:  # a node is uploading: give it time (at most MAX_WAITS waits in all)
            seen = len(present)
            deadline = min(time.monotonic() + wait_s, started + MAX_WAITS * wait_s)
        for rank in [r for r in waiting if f"cascade/ranks/{r}" in present]:
            try:
                text = store.text(run_id, f"cascade/ranks/{rank}/{EXIT_FILE}")
            except StoreError:
                continue  # its trace is there, its exit not yet
            except (OSError, UnicodeDecodeError):  # a directory by that name, bytes that are not text
                text = ""
            found[rank] = remote_entry(rank, text)
            waiting.remove(rank)
        if not waiting or time.monotonic() > deadline:
            break
        if not told and time.monotonic() - started > 2:
            notify(f"waiting for the other nodes' ranks ({len(waiting)} of them) to be recorded, up to "
                   f"{wait_s:.0f} s")  # fmt: skip
            told = True
        time.sleep(POLL_S)
    for rank in waiting:
        found[rank] = {"rank": rank, "error": None, "exit_code": None,
                       "missing": f"its node did not record it in time ({wait_s:.0f} s) (its cascade run "
                       "failed, cannot reach the store, or is still running)"}  # fmt: skip
    return [found[rank] for rank in sorted(found)]


def remote_entry(rank: int, text: str) -> dict[str, Any]:
    """Rank `rank`'s entry from the `exit.json` another node stored: only its checked facts are kept,
    and the trace's artifact name is made here from the rank, never read."""
    try:
        data = json.loads(text) if len(text) <= MAX_EXIT_BYTES else None
    except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
        data = None
    if not isinstance(data, dict) or data.get("rank") != rank:
        return {"rank": rank, "error": None, "exit_code": None, "missing": f"its {EXIT_FILE} is not readable"}
    exit_code = data.get("exit_code")
    error = data.get("error")
    entry: dict[str, Any] = {
        "rank": rank,
        "exit_code": exit_code if isinstance(exit_code, int) and not isinstance(exit_code, bool) else None,
        "error": {"type": str(error.get("type"))[:200], "message": str(error.get("message"))[:MAX_TEXT]}
        if isinstance(error, dict) else None,
    }  # fmt: skip
    trace = data.get("trace")
    steps = trace.get("steps") if isinstance(trace, dict) else None
    if isinstance(steps, int) and not isinstance(steps, bool) and steps >= 0:
        entry["trace"] = {"artifact": trace_artifact(rank), "steps": steps}
    return entry


def _job_run(store: RunStore, job: str, since_ms: int, wait_s: float) -> str | None:
    """The newest RUNNING run tagged with the job (the id is letters, digits and `._-` only) that
    started at `since_ms` or later: an earlier one is a stale run of an earlier job of that id."""
    where = (f"tags.`{JOB_TAG}` = '{job}' AND attributes.status = 'RUNNING' AND "
             f"attributes.start_time >= {int(since_ms)}")  # fmt: skip
    started = time.monotonic()
    while True:
        found = store.search(limit=1, where=where)
        if found:
            return found[0].run_id
        if time.monotonic() - started > wait_s:
            return None
        time.sleep(POLL_S)


def _delivered_dirs(store: RunStore, run_id: str) -> set[str]:
    try:
        return store.artifact_names(run_id, "cascade/ranks")
    except StoreError:
        return set()


def _span(layout: Distributed) -> str:
    ranks = layout.node_ranks
    return f"{ranks.start}-{ranks.stop - 1}" if len(ranks) > 1 else str(ranks.start)
