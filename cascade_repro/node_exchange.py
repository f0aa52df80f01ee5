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
import shutil
import time
from pathlib import Path
from typing import Any, Callable

from cascade_repro.child import protocol
from cascade_repro.distributed import (
    JOB_TAG,
    RANK_WAIT_S,
    Distributed,
    collect_ranks,
    rank_entry,
    trace_artifact,
)
from cascade_repro.errors import StoreError
from cascade_repro.store.run_store import RunStore

EXIT_FILE = "exit.json"
POLL_S = 0.5
MAX_TEXT = 2000  # of an error's message read back from another node


def deliver_node(layout: Distributed, store: RunStore, job_dir: Path, notify: Callable[[str], None],
                 wait_s: float = RANK_WAIT_S) -> str | None:  # fmt: skip
    """This node's ranks (this one first, then the others once they have ended) into rank 0's run;
    the run's id, or None when no such run was found in `wait_s` (the files then stay in `job_dir`)."""
    own = protocol.rank_dir(job_dir, layout.rank)
    entries = [rank_entry(layout.rank, own, own / protocol.RANK_EXIT_FILE)]
    entries += collect_ranks(layout, job_dir, notify, wait_s)
    run_id = _job_run(store, str(layout.job), wait_s)
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
    shutil.rmtree(job_dir, ignore_errors=True)
    notify(f"ranks {_span(layout)} of this node are recorded in run {run_id}")
    return run_id


def collect_remote(layout: Distributed, store: RunStore, run_id: str, notify: Callable[[str], None],
                   wait_s: float = RANK_WAIT_S) -> list[dict[str, Any]]:  # fmt: skip
    """Rank 0: the entry of each rank on another node, as its node delivered it into the run."""
    waiting = list(layout.remote_ranks)
    found: dict[int, dict[str, Any]] = {}
    started, told = time.monotonic(), False
    while waiting:
        present = _delivered_dirs(store, run_id)
        for rank in [r for r in waiting if f"cascade/ranks/{r}" in present]:
            try:
                text = store.text(run_id, f"cascade/ranks/{rank}/{EXIT_FILE}")
            except StoreError:
                continue  # its trace is there, its exit not yet
            found[rank] = remote_entry(rank, text)
            waiting.remove(rank)
        if not waiting or time.monotonic() - started > wait_s:
            break
        if not told and time.monotonic() - started > 2:
            notify(f"waiting for the other nodes' ranks ({len(waiting)} of them) to be recorded, up to "
                   f"{wait_s:.0f} s")  # fmt: skip
            told = True
        time.sleep(POLL_S)
    for rank in waiting:
        found[rank] = {"rank": rank, "error": None, "exit_code": None,
                       "missing": f"its node did not record it within {wait_s:.0f} s (its cascade run "
                       "failed, cannot reach the store, or is still running)"}  # fmt: skip
    return [found[rank] for rank in sorted(found)]


def remote_entry(rank: int, text: str) -> dict[str, Any]:
    """Rank `rank`'s entry from the `exit.json` another node stored: only its checked facts are kept,
    and the trace's artifact name is made here from the rank, never read."""
    try:
        data = json.loads(text)
    except ValueError:
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


def _job_run(store: RunStore, job: str, wait_s: float) -> str | None:
    """The newest RUNNING run tagged with the job (the id is letters, digits and `._-` only)."""
    where = f"tags.`{JOB_TAG}` = '{job}' AND attributes.status = 'RUNNING'"
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
