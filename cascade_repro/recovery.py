"""Finish runs whose `cascade run` process is gone: deliver what their spool holds, then close them.

A run directory whose parent died (SIGKILL, the OOM killer, a closed terminal, a preempted node) is
delivered by the next cascade command that touches the store: metrics from the events files, the
output log, the trace, checkpoints into DVC, and the record, which says what happened and what was
never captured. The run is opened if the parent died before it could, and closed KILLED (or with
the script's own status when the parent saw it end). A run whose parent finished while the store
did not answer waits for `cascade sync` (`cascade recover` is the same), which closes it with its
real status once everything is stored.
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cascade_repro import distributed
from cascade_repro.child import protocol
from cascade_repro.errors import CascadeError
from cascade_repro.manifest import ARTIFACT_PATH, SCHEMA
from cascade_repro.params import used_params
from cascade_repro.run_plan import Notify
from cascade_repro.settings import Settings
from cascade_repro.store import spool
from cascade_repro.store.delivery import CLOSE_OP, END_TAGS_OP, RECORD_OP, Delivery, file_op, params_op
from cascade_repro.store.metrics_writer import MetricsWriter, full_summary
from cascade_repro.store.run_store import RunStore

log = logging.getLogger(__name__)
PENDING_SYNC = "PENDING-SYNC"  # what `cascade ls` shows for a run whose record is not all stored yet
PARENT_DIED = "CascadeProcessDied"
STOP_SLACK_S = 2.0  # a recovered run's files changed this long after it stopped are still its own


@dataclass(frozen=True)
class Delivered:
    """One spooled run after a delivery attempt."""

    spool: str
    run_id: str | None
    status: str  # the status it was closed with, or PENDING-SYNC
    points: int  # metric points in the store
    missing: tuple[str, ...]  # what the store still lacks (pending, or refused and why)
    recovered: bool  # its parent had died

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def recover_dead(settings: Settings, notify: Notify, command: str,
                 entries: list[spool.SpoolEntry] | None = None) -> list[Delivered]:  # fmt: skip
    """Runs whose parent died (among `entries`, a scan already made, else a new one), delivered and
    closed; costs one directory listing when there are none."""
    scanned = spool.scan_all(settings.paths.spool_dirs()) if entries is None else entries
    dead = [entry for entry in scanned if entry.state == spool.DEAD]
    return [found for entry in dead if (found := deliver(entry.path, settings, notify, command))]


def sync(settings: Settings, notify: Notify, command: str = "sync") -> list[Delivered]:
    """Every run whose parent is gone and whose record is not all stored: delivered, closed if complete."""
    return [
        found
        for entry in spool.scan_all(settings.paths.spool_dirs())
        if (found := deliver(entry.path, settings, notify, command))
    ]


def deliver(run_dir: Path, settings: Settings, notify: Notify, command: str) -> Delivered | None:
    """Deliver one run directory (None: its parent lives, or another command is at it)."""
    fd = spool.try_claim(run_dir)
    if fd is None:
        return None
    try:
        state = spool.claimed_state(run_dir)
        if state is None:
            return None
        _clean_temporary(run_dir)
        return _deliver(run_dir, settings, notify, command, died=_died(state, spool.Ledger.load(run_dir)))
    finally:
        spool.release(fd)


def _died(state: str, ledger: spool.Ledger) -> bool:
    """Whether the parent died rather than exited with the store unanswering: its record is completed
    from the run directory, and says so (with the script's own status where the parent saw it end:
    `_recovered_record`). A parent that died stays "died" after a first recovery that could not
    finish ("gone")."""
    return state == spool.DEAD or ledger.parent == "gone"


def _clean_temporary(run_dir: Path) -> None:
    """Siblings of an atomic write that never happened (a full disk, a process killed mid-write)."""
    for leftover in run_dir.glob(".*.tmp"):
        leftover.unlink(missing_ok=True)


def _deliver(run_dir: Path, settings: Settings, notify: Notify, command: str, died: bool) -> Delivered:
    ledger = spool.Ledger.load(run_dir)
    plan = spool.read_json(run_dir / spool.PLAN_FILE)
    if died and plan.get("in_container"):
        _stop_container(run_dir, notify)
    store = RunStore(str(plan.get("tracking_uri") or settings.tracking_uri),
                     str(plan.get("experiment") or settings.experiment))  # fmt: skip
    client = store.client
    try:
        run_id = ledger.run_id or _open(store, plan, run_dir, settings, ledger)
    except CascadeError as exc:
        ledger.update(parent="gone" if died else ledger.parent)
        notify(f"run directory {run_dir.name} not delivered: {exc.message}; `cascade sync` tries again")
        return Delivered(str(run_dir), None, PENDING_SYNC, 0, (exc.message,), died)
    delivery = Delivery(client, run_id, ledger, str(plan.get("tracking_uri") or settings.tracking_uri))
    delivery.retry(skip=(RECORD_OP, END_TAGS_OP, CLOSE_OP))
    if died and delivery.state("params") is None:  # the dead parent had not logged them (finish does)
        _deliver_params(run_dir, plan, delivery)
    writer = MetricsWriter(delivery, run_dir)
    writer.stop()  # every point in the spool, from where the last writer stopped
    end_tags = dict((delivery.state(END_TAGS_OP) or {}).get("tags") or {})
    if died:
        record, status, end_ms = _recovered_record(run_dir, ledger, plan, settings, delivery, notify, command)
        end_tags.update({"cascade.status": status, "cascade.recovered": "true"})
    else:
        record = spool.read_json(run_dir / spool.RECORD_FILE)
        ended = ledger.ended or {}
        status, end_ms = (
            str(ended.get("status") or "FINISHED"),
            int(ended.get("end_ms") or time.time() * 1000),
        )
    pending = writer.pending()
    record["metrics"] = {
        **(record.get("metrics") or {}),
        "points": writer.points,
        "requests": writer.requests,
        "pending": pending,
        "keys": {k: dict(v) for k, v in sorted(full_summary(run_dir, writer.delivered).items())},
    }
    missing = delivery.conclude(record, ARTIFACT_PATH, pending, end_tags, status, end_ms)
    for warning in dict.fromkeys(delivery.warnings):
        notify(f"warning: {warning}")
    complete = not pending and not delivery.pending()
    if complete:
        shutil.rmtree(run_dir, ignore_errors=True)
    else:
        ledger.update(parent="gone" if died else "exited")
    shown = status if complete else PENDING_SYNC
    how = "recovered" if died else "synced"
    why = "its cascade process had died; " if died else ""
    later = "" if complete else f"; still pending in {run_dir}: `cascade sync` when the store answers"
    notify(f"{how} run {run_id} ({why}{writer.points} metric points stored): {shown}{later}")
    return Delivered(str(run_dir), run_id, shown, writer.points, tuple(missing), died)


def _stop_container(run_dir: Path, notify: Notify) -> None:
    """A container's script gets no signal when its `cascade` dies (PR_SET_PDEATHSIG does not cross
    into the container): stop it by its run-directory label before delivering what it wrote."""
    try:
        from cascade_repro.images import engine

        docker = engine.connect()
        for container in docker.containers.list(filters={"label": f"cascade.run_dir={run_dir}"}):
            notify(f"stopping container {container.short_id}: its cascade process died")
            container.stop(timeout=10)  # SIGTERM first: the script flushes what it logged
            container.remove(force=True)
    except Exception as exc:  # no engine here: the container cannot be running on this machine
        log.debug("no container to stop for %s: %s", run_dir, exc)


def _open(store: RunStore, plan: dict[str, Any], run_dir: Path, settings: Settings,
          ledger: spool.Ledger) -> str:  # fmt: skip
    """The parent died before the run was opened (or before it noted the id): find it by its spool
    tag, else open it as the parent would have."""
    experiment = str(store.experiment)
    found = store.search(limit=1, where=f"tags.`{spool.SPOOL_TAG}` = '{run_dir.name}'")
    if found:
        run_id = found[0].run_id
    else:
        tags = dict(plan.get("tags") or {spool.SPOOL_TAG: run_dir.name})
        start_ms = int(plan.get("start_ms") or spool.last_heartbeat(run_dir) * 1000)
        artifacts = plan.get("artifact_root") or settings.artifact_root
        opened = store.open_run(artifacts, plan.get("run_name"), tags, start_ms, plan.get("existing_run_id"))
        run_id = opened.run_id
    (run_dir / protocol.RUN_ID_FILE).write_text(run_id, encoding="utf-8")
    ledger.update(run_id=run_id, experiment=experiment)
    return run_id


def _deliver_params(run_dir: Path, plan: dict[str, Any], delivery: Delivery) -> None:
    """The params the script used, as `finish` would have logged them, from the plan and child.json."""
    if isinstance(plan.get("resolved_params"), dict):
        facts = spool.read_json(run_dir / protocol.FACTS_FILE)
        delivery.do(params_op(used_params(plan["resolved_params"], facts)))
    elif plan.get("params"):  # a spool of an earlier cascade: the flat params it planned to log
        delivery.do({"id": "params", "kind": "params", "params": plan["params"]})


def _recovered_record(run_dir: Path, ledger: spool.Ledger, plan: dict[str, Any], settings: Settings,
                      delivery: Delivery, notify: Notify,
                      command: str) -> tuple[dict[str, Any], str, int]:  # fmt: skip
    """The newest local record, completed with what the child left and the truth about the end."""
    local = spool.read_json(run_dir / spool.RECORD_FILE)
    record = local or _bare_record(run_dir, settings)
    record["run_id"], record["experiment"] = (
        delivery.run_id,
        ledger.data.get("experiment") or record.get("experiment"),
    )
    facts = spool.read_json(run_dir / protocol.FACTS_FILE)
    missing = []
    if ledger.stage == "skeleton" or not local:  # (no local record: it died before even the skeleton)
        missing.append(
            "capture: git state, packages, system and environment (the cascade process died first)"
        )
    if ledger.stage != "final":
        missing += _complete_from_run_dir(record, run_dir, plan, facts, settings, delivery, notify)
    if not facts.get("ended_at"):
        missing.append("the script's exit facts (torch stack, GPU memory): it was stopped, not ended")
    missing += spool.trace_cut_short(facts)
    outcome, status, end_ms = _recovered_outcome(record, ledger, plan, facts, run_dir, command, missing)
    record["outcome"] = outcome
    return record, status, end_ms


def _complete_from_run_dir(record: dict[str, Any], run_dir: Path, plan: dict[str, Any], facts: dict[str, Any],
                           settings: Settings, delivery: Delivery, notify: Notify) -> list[str]:  # fmt: skip
    """What finish() would have added to the record, from what the child left in the run directory
    (params used, torch stack, trace, ranks, checkpoints, inputs and outputs); returns what is lost."""
    stopped = _stopped(run_dir)  # (before this recovery writes in the run directory)
    if isinstance(plan.get("resolved_params"), dict):  # what the script used, as finish() says it
        record["params"] = used_params(plan["resolved_params"], facts)
    if facts.get("torch"):
        record["torch"] = facts["torch"]
    if facts.get("determinism"):
        record["determinism"] = facts["determinism"]
    record["trace"] = spool.trace_section(run_dir, facts.get("trace"))
    layout = distributed.from_section(record.get("distributed") or {})
    if layout is not None:  # a torchrun job: the other ranks' traces, as finish() stores them
        entries = distributed.collect_ranks(layout, run_dir, notify, wait_s=0)
        for path, artifact_dir in distributed.gather(layout, run_dir, run_dir):
            delivery.do(file_op(path, artifact_dir))
        record["distributed"] = layout.section(entries)
    record["checkpoints"] = _checkpoints(run_dir, plan, settings, delivery, notify)
    record["inputs"], record["outputs"] = _files(run_dir, plan, record, settings, notify, stopped)
    _remember_outputs(plan, settings, delivery.run_id, record, stopped)
    for name in (protocol.OUTPUT_LOG, protocol.TRACE_FILE):
        if (run_dir / name).exists():
            delivery.do(file_op(run_dir / name, "cascade"))
    return [] if (run_dir / protocol.OUTPUT_LOG).exists() else ["the output log"]


def _recovered_outcome(record: dict[str, Any], ledger: spool.Ledger, plan: dict[str, Any],
                       facts: dict[str, Any], run_dir: Path, command: str,
                       missing: list[str]) -> tuple[dict[str, Any], str, int]:  # fmt: skip
    """The outcome as it really ended: the status the parent saw (else KILLED), and when."""
    ended = ledger.ended or {}
    died_at = spool.last_activity(run_dir)
    end_ms = int(ended.get("end_ms") or (facts.get("ended_at") or died_at) * 1000)
    status = str(ended.get("status") or "KILLED")
    note = (
        f"the cascade process died (SIGKILL?) at about {_when(died_at)} (the run's last activity); recovered "
        f"by {command} at {_when(time.time())}"
    )
    outcome = dict(record.get("outcome") or {})
    start = outcome.get("start_time") or plan.get("start_ms", end_ms) / 1000
    outcome.update(status=status, end_time=end_ms / 1000, duration_s=round(end_ms / 1000 - start, 3),
                   recovered=note)  # fmt: skip
    outcome.setdefault("exit_code", ended.get("exit_code"))
    if not outcome.get("error"):
        outcome["error"] = facts.get("exception") or (
            None if status == "FINISHED" else {"type": PARENT_DIED, "message": note}
        )
    said = (record.get("outcome") or {}).get("missing") or []
    outcome["missing"] = list(dict.fromkeys([*said, *missing]))
    if facts.get("errors"):  # parts of the child's exit facts it could not take, as `finish` keeps them
        outcome["child_errors"] = facts["errors"]
    return outcome, status, end_ms


def _checkpoints(run_dir: Path, plan: dict[str, Any], settings: Settings, delivery: Delivery,
                 notify: Notify) -> list[dict[str, Any]]:  # fmt: skip
    """What the dead parent's checkpoint keeper would have finished: hash into DVC, pointers, push."""
    events = run_dir / protocol.CHECKPOINTS_FILE
    if not events.exists():
        return []
    from cascade_repro.store.checkpoint_keeper import CheckpointKeeper, finish_checkpoints
    from cascade_repro.store.dvc_store import Cache

    root = Path(plan.get("root") or settings.root)
    keeper = CheckpointKeeper(root, events, Cache(root) if Cache.exists_for(root) else None, log.debug,
                              hardlink=settings.checkpoint_link == "hardlink")  # fmt: skip
    try:
        log_files = bool(plan.get("log_checkpoints"))
        recorded = finish_checkpoints(keeper, delivery, plan.get("dvc_remote"), log_files, notify)
    except Exception as exc:  # the rest of the run is still delivered
        notify(f"warning: checkpoints of {run_dir.name} not fully recorded: {type(exc).__name__}: {exc}")
        return [e.to_dict() for e in keeper.entries]
    finally:
        if keeper.cache is not None:
            keeper.cache.close()
    for warning in recorded.warnings:
        notify(f"warning: {warning}")
    return recorded.entries


def _files(run_dir: Path, plan: dict[str, Any], record: dict[str, Any], settings: Settings, notify: Notify,
           stopped: float) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:  # fmt: skip
    """The inputs git and DVC cannot see and the outputs, from what the child noted (as finish()
    records them; the hashes are of the files as they are now, which the recoverer says it read, but
    for a file read and then rewritten: the child's hash and copy of its bytes as read, cached as
    finish() caches them); the files read outside the repository are named in the outcome, and said."""
    from cascade_repro.capture import earlier_outputs
    from cascade_repro.capture.files import read_opened, read_outside, sort_files
    from cascade_repro.run_engine import own_paths

    root = Path(plan.get("root") or settings.root)
    git = record.get("git")
    git = git if isinstance(git, dict) else {}
    untracked = [str(u.get("path")) for u in git.get("untracked") or [] if isinstance(u, dict)]
    data = [str(d.get("path")) for d in record.get("data") or [] if isinstance(d, dict)]
    opened: dict[str, Any] = {}
    try:
        opened = read_opened(run_dir / protocol.FILES_FILE, root)
        files = sort_files(root, opened, [], own_paths(settings), untracked, data, run_dir)
    except Exception as exc:  # the rest of the record still goes in
        log.warning("inputs and outputs not recovered: %s", exc)
        _note_outside(record, list(opened.get("outside") or []), notify)
        return list(record.get("inputs") or []), list(record.get("outputs") or [])
    _note_outside(record, read_outside(opened, files), notify)
    # (`stopped`: read before this recovery wrote in the run directory, which would move it later)
    track_inputs = plan.get("track_inputs") is True
    _cache_inputs(root, files.inputs, files.kept, notify, stopped if track_inputs else None)
    earlier_outputs.name_writers(root, files.inputs, str(record.get("run_id")))
    return files.inputs, files.outputs


def _note_outside(record: dict[str, Any], outside: list[str], notify: Notify) -> None:
    """The files read outside the repository, in the outcome and said (as the run's own end does)."""
    from cascade_repro.capture.files import outside_noted

    if outside:
        outcome = record["outcome"] = dict(record.get("outcome") or {})
        outcome["read_outside"], said = outside_noted(outside)
        notify(f"warning: {said}")


def _cache_inputs(root: Path, inputs: list[dict[str, Any]], kept: dict[str, Path], notify: Notify,
                  every_until: float | None) -> None:  # fmt: skip
    """The bytes as read of the files the script read and then rewrote (the child's copies, which go
    with the run directory) into the DVC cache, as finish() puts them there: `restore` gives them back.
    `every_until` (the run's --track-inputs, and when it stopped): every input, the others as they are
    now where unchanged since the run stopped (one edited since is not what it read)."""
    from cascade_repro.store.dvc_store import Cache

    chosen = [i for i in inputs if i["path"] in kept and (every_until is not None or i.get("rewritten"))]
    if every_until is not None:  # (the others: as they are now)
        for item in inputs:
            if item["path"] in kept or item.get("rewritten"):
                continue
            try:
                changed = (root / item["path"]).stat().st_mtime > every_until
            except OSError:
                continue
            if changed:
                notify(f"warning: --track-inputs: {item['path']} changed after the run stopped: not cached")
            else:
                chosen.append(item)
    if not chosen or not Cache.exists_for(root):
        return
    cache = Cache(root)
    try:
        for item in chosen:
            try:
                stored = cache.add(kept.get(item["path"]) or root / item["path"])
            except Exception as exc:  # DataError, OSError: the input stays recorded by its hash
                notify(f"warning: {item['path']} as the run read it not cached: {exc}")
                continue
            if stored is not None and stored.size == item["size"]:
                item["md5"] = stored.md5
            else:
                notify(f"warning: {item['path']} changed while it was cached: not cached")
    finally:
        cache.close()


def _stopped(run_dir: Path) -> float:
    """When the run stopped writing, as late as can be told (its last activity: the child's exit facts
    among it), and a moment for a file the script wrote after it (a user's edit comes later)."""
    return spool.last_activity(run_dir) + STOP_SLACK_S


def _remember_outputs(plan: dict[str, Any], settings: Settings, run_id: str, record: dict[str, Any],
                      stopped: float) -> None:  # fmt: skip
    """The recovered run's outputs and checkpoints, as it left them, noted for the next run's capture
    as finish() notes them (capture/earlier_outputs.py): not that run's dirty state while unchanged.
    A file changed after the run `stopped` (its last activity) is not noted: someone edited it since."""
    from cascade_repro.capture import earlier_outputs
    from cascade_repro.capture.git import excluded
    from cascade_repro.run_engine import own_paths

    written = [str(o.get("path")) for o in record.get("outputs") or [] if isinstance(o, dict)]
    written += [str(c.get("path")) for c in record.get("checkpoints") or []
                if isinstance(c, dict) and c.get("status") != "pruned"]  # fmt: skip
    written = [p for p in written if not excluded(p, own_paths(settings))]
    if not written:
        return
    try:
        earlier_outputs.remember(Path(plan.get("root") or settings.root), run_id, written, not_after=stopped)
    except Exception as exc:  # the next run then records them as untracked files, as it would have
        log.warning("the recovered run's outputs are not noted for the next run's capture: %s", exc)


def _bare_record(run_dir: Path, settings: Settings) -> dict[str, Any]:
    """A spool from a cascade that wrote no local record: what can be said without one."""
    unavailable = {"unavailable": "not recorded: the cascade process died before writing a record"}
    return {
        "schema": SCHEMA, "run_id": "", "experiment": settings.experiment, "cascade_version": "",
        "command": {}, "params": {"values": spool.read_json(run_dir / protocol.PARAMS_FILE)},
        "determinism": {}, "git": dict(unavailable), "python": dict(unavailable), "torch": {},
        "hardware": dict(unavailable), "environment": {}, "container": dict(unavailable),
        "outcome": {"status": "RUNNING"},
    }  # fmt: skip


def _when(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))
