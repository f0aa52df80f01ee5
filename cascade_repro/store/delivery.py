"""Every store write of a run, each on its own, through the spool's outbox: nothing fails for another.

An operation (params, tags, one artifact, the record, closing the run) is first put in the outbox
(`delivery.json`), then tried. The store refusing it (an invalid request) marks it failed with
MLflow's reason and the record says so; the store not answering (server down, disk full, database
locked) leaves it pending for `cascade sync`, and the operations after it are not even tried (each
try would wait out MLflow's whole retry budget) until a write succeeds again.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cascade_repro.store import mlflow_store, spool
from cascade_repro.store.local_record import HEARTBEAT_TAG
from cascade_repro.store.spool import FAILED, STORED, WAITING, Ledger, Point

if TYPE_CHECKING:
    from mlflow import MlflowClient

log = logging.getLogger(__name__)

RECORD_OP = "record"
CLOSE_OP = "close"
END_TAGS_OP = "tags:end"  # sent after the record (a projection of it): never listed in it
ARTIFACT_KINDS = frozenset({"file", "dir", "text", RECORD_OP})
INCOMPLETE_TAG = "cascade.incomplete"  # what the store lacks, while it lacks something


refused = mlflow_store.refused


def file_op(path: Path, artifact_dir: str) -> dict[str, Any]:
    return {
        "id": f"artifact:{artifact_dir}/{path.name}",
        "kind": "file",
        "path": str(path),
        "dir": artifact_dir,
    }


def dir_op(path: Path, artifact_dir: str) -> dict[str, Any]:
    return {"id": f"artifact:{artifact_dir}", "kind": "dir", "path": str(path), "dir": artifact_dir}


def text_op(text: str, artifact_file: str) -> dict[str, Any]:
    return {"id": f"artifact:{artifact_file}", "kind": "text", "text": text, "file": artifact_file}


def record_op(artifact_file: str) -> dict[str, Any]:
    """The local run.json (as it is when the operation runs) to `artifact_file`."""
    return {"id": RECORD_OP, "kind": RECORD_OP, "file": artifact_file}


def params_op(section: dict[str, Any]) -> dict[str, Any]:
    """The MLflow params of a record's params section (logged beside what the script logged itself)."""
    from cascade_repro.params import mlflow_params

    return {"id": "params", "kind": "params", "params": mlflow_params(section)}


def tags_op(name: str, tags: dict[str, Any]) -> dict[str, Any]:
    return {"id": f"tags:{name}", "kind": "tags", "tags": {k: v for k, v in tags.items() if v is not None}}


class Delivery:
    """The store writes of one run: `do` an operation, `retry` what is pending, `send` metric points."""

    def __init__(self, mlflow: MlflowClient, run_id: str, ledger: Ledger, tracking_uri: str = "") -> None:
        self.mlflow = mlflow
        self.run_id = run_id
        self.ledger = ledger
        # Behind a tracking server, artifacts and the database answer or not together; a local
        # store's database and artifact directory may fail apart (one disk full, not the other).
        self._apart = not tracking_uri.startswith(("http:", "https:"))
        self._down: dict[str, str] = {}  # why each part last did not answer; cleared by a success
        self.warnings: list[str] = []
        self.record: dict[str, Any] | None = None  # the newest record, when this process made it
        if not logging.getLogger("cascade_repro").isEnabledFor(logging.DEBUG):
            # MLflow logs a database error with its traceback before raising it; we say it in one line.
            logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)

    @property
    def down(self) -> str | None:
        """Why the store last did not answer (None: it did)."""
        return next(iter(self._down.values()), None)

    def _part(self, kind: str) -> str:
        return "artifacts" if self._apart and kind in ARTIFACT_KINDS else "database"

    # -- operations ------------------------------------------------------------------------------
    def do(self, op: dict[str, Any]) -> bool:
        """Put `op` in the outbox and try it now (unless the store is down); True once stored."""
        op = {**op, "state": WAITING}
        self.ledger.put(op)
        return self._attempt(op)

    def retry(self, skip: tuple[str, ...] = ()) -> None:
        """Try again every pending operation, in order (`cascade sync`)."""
        for op in self.ledger.ops():
            if op.get("state") == WAITING and op["id"] not in skip:
                self._attempt(op)

    def state(self, op_id: str) -> dict[str, Any] | None:
        for op in self.ledger.ops():
            if op["id"] == op_id:
                return op
        return None

    def heartbeat(self, at_s: float) -> None:
        """Tell the store this run's cascade process is alive (`cascade ls --running` calls a RUNNING
        run without a recent beat stale). Never queued: a beat the store missed, the next replaces."""
        if self._down:
            return
        try:
            mlflow_store.set_tags(self.mlflow, self.run_id, {HEARTBEAT_TAG: f"{at_s:.0f}"})
        except Exception as exc:  # the next beat, or the metric points, will say the store is down
            log.debug("heartbeat not stored: %s", mlflow_store.first_line(exc))

    def pending(self) -> list[dict[str, Any]]:
        return [op for op in self.ledger.ops() if op.get("state") == WAITING and op["id"] != CLOSE_OP]

    def _attempt(self, op: dict[str, Any]) -> bool:
        part = self._part(op["kind"])
        if part in self._down:
            return False
        try:
            self._run(op)
        except Exception as exc:  # MLflow raises many types; each is this operation's alone
            reason = mlflow_store.first_line(exc)
            if refused(exc):
                log.warning("the store refused %s: %s", op["id"], reason)
                self.ledger.put({**op, "state": FAILED, "error": reason})
            else:
                log.warning("the store did not take %s: %s", op["id"], reason)
                self._down[part] = reason
                self.ledger.put({**op, "state": WAITING, "error": reason})
            return False
        self._down.pop(part, None)
        stored = {k: v for k, v in op.items() if k != "error"}
        self.ledger.put({**stored, "state": STORED})
        return True

    def _run(self, op: dict[str, Any]) -> None:
        kind, run_id, mlflow = op["kind"], self.run_id, self.mlflow
        if kind == "params":
            self.warnings += mlflow_store.log_params(mlflow, run_id, op["params"], op.get("existing"))
        elif kind == "tags":
            self.warnings += mlflow_store.set_tags(mlflow, run_id, op["tags"])
        elif kind == "file":
            mlflow_store.log_file(mlflow, run_id, Path(op["path"]), op["dir"])
        elif kind == "dir":
            mlflow_store.log_dir(mlflow, run_id, Path(op["path"]), op["dir"])
        elif kind == "text":
            mlflow.log_text(run_id, op["text"], op["file"])
        elif kind == RECORD_OP:
            record = self.record or spool.read_json(self.ledger.run_dir / spool.RECORD_FILE)
            mlflow_store.log_json(mlflow, run_id, record, op["file"])
        elif kind == "untag":
            mlflow.delete_tag(run_id, op["key"])
        elif kind == CLOSE_OP:
            mlflow_store.finish_run(mlflow, run_id, op["status"], int(op["end_ms"]))
        else:
            raise ValueError(f"unknown outbox operation {kind}")

    # -- metric points ---------------------------------------------------------------------------
    def send(self, points: list[Point]) -> int:
        """Write points (≤ 1000 a request); returns the requests made. Raises when the store does
        not answer; a refused batch is split by key so only the refused keys are lost (and named)."""
        try:
            requests = mlflow_store.log_metric_points(self.mlflow, self.run_id, points)
        except Exception as exc:
            if not refused(exc):
                self._down["database"] = mlflow_store.first_line(exc)
                raise
            requests = self._send_by_key(points)
        self._down.pop("database", None)
        return requests

    def _send_by_key(self, points: list[Point]) -> int:
        by_key: dict[str, list[Point]] = {}
        for point in points:
            by_key.setdefault(point[0], []).append(point)
        requests = 0
        for key, group in by_key.items():
            try:
                requests += mlflow_store.log_metric_points(self.mlflow, self.run_id, group)
            except Exception as exc:
                if not refused(exc):
                    raise
                reason = mlflow_store.first_line(exc)
                self.warnings.append(f"MLflow refused {len(group)} point(s) of metric {key[:80]!r}: {reason}")
        return requests

    # -- the end of a run ---------------------------------------------------------------------------
    def conclude(self, record: dict[str, Any], artifact_file: str, pending_points: int,
                 end_tags: dict[str, Any], status: str, end_ms: int) -> list[str]:  # fmt: skip
        """Write the record (saying what is not stored), the end tags, then close the run with `status`
        unless something is still pending. Returns what the store lacks (empty: complete)."""
        self.keep_record(self.annotate(record, pending_points), last_words=True)
        self.ledger.update(stage="final")
        self.do(record_op(artifact_file))
        earlier = self.state(END_TAGS_OP) or {}
        lacking = self.missing(pending_points)
        tags = {k: v for k, v in end_tags.items() if k != INCOMPLETE_TAG}
        if lacking:  # the MLflow UI says it too, where the store takes tags
            tags[INCOMPLETE_TAG] = "; ".join(lacking)[: mlflow_store.MAX_TAG_VALUE]
        elif INCOMPLETE_TAG in (earlier.get("tags") or {}) and earlier.get("state") == STORED:
            self.do({"id": "untag:incomplete", "kind": "untag", "key": INCOMPLETE_TAG})
        self.do(tags_op("end", tags))
        if not pending_points and not self.pending():
            self.do({"id": CLOSE_OP, "kind": CLOSE_OP, "status": status, "end_ms": end_ms})
        return self.missing(pending_points)

    def keep_record(self, record: dict[str, Any], last_words: bool = False) -> None:
        """The record to send: kept in memory, and in the spool where the disk allows (`last_words`:
        the final one, which may take the run directory's reserve; the early one, mid-run, not)."""
        self.record = record
        with contextlib.suppress(OSError):
            spool.write_json(self.ledger.run_dir / spool.RECORD_FILE, record, last_words=last_words)

    def missing(self, pending_points: int) -> list[str]:
        """What the store lacks, one line each (pending for `cascade sync`, or refused and why)."""
        lines = [
            f"{_name(op)}: {_why(op)}" for op in self.ledger.ops() if op.get("state") != STORED and _data(op)
        ]
        if pending_points:
            reason = f" (the store did not answer: {self.down})" if self.down else ""
            lines.insert(0, f"{pending_points} metric point(s) pending (`cascade sync`){reason}")
        return lines

    # -- what the record says about it ------------------------------------------------------------
    def annotate(self, record: dict[str, Any], pending_points: int) -> dict[str, Any]:
        """Mark in the record every artifact it names that is not stored, and list what is missing."""
        states = {op["id"]: op for op in self.ledger.ops()}
        git = record.get("git") if isinstance(record.get("git"), dict) else {}
        patch = git.get("patch") if git else None
        if isinstance(patch, dict) and patch.get("artifact"):
            patch.update(_stored(states.get(f"artifact:{patch['artifact']}")))
        untracked_op = states.get("artifact:cascade/untracked")
        lost = untracked_op is not None and untracked_op.get("state") != STORED
        for item in (git or {}).get("untracked") or []:
            if lost and item.get("stored") and item.get("symlink_target") is None:
                item["stored"] = False
                item["reason"] = _why(untracked_op or {})
        trace = record.get("trace")
        if isinstance(trace, dict) and trace.get("artifact"):
            trace.update(_stored(states.get(f"artifact:{trace['artifact']}")))
        missing = [
            f"{op['id'].removeprefix('artifact:')}: {_why(op)}"
            for op in states.values()
            if op.get("state") != STORED and _data(op) and op["id"] != RECORD_OP
        ]
        if pending_points:
            missing.append(f"metrics: {pending_points} point(s) not in the store yet")
        outcome = record.get("outcome")
        if isinstance(outcome, dict):
            if missing:
                outcome["undelivered"] = missing
            else:
                outcome.pop("undelivered", None)
        return record


def _data(op: dict[str, Any]) -> bool:
    """Whether the operation stores part of the run (not the end tags, a projection of the record,
    nor closing it or clearing a tag)."""
    return op["id"] not in (END_TAGS_OP, CLOSE_OP) and op["kind"] != "untag"


def _name(op: dict[str, Any]) -> str:
    if op["kind"] == RECORD_OP:
        return f"{op.get('file')} (the record)"
    return str(op["id"]).removeprefix("artifact:")


def _stored(op: dict[str, Any] | None) -> dict[str, Any]:
    if op is None:
        return {"stored": False, "error": "never sent: the recording stopped before it"}
    if op.get("state") == STORED:
        return {"stored": True}
    return {"stored": False, "error": _why(op)}


def _why(op: dict[str, Any]) -> str:
    if op.get("state") == FAILED:
        return f"refused by the store: {op.get('error')}"
    if op.get("error"):
        return f"pending (`cascade sync`): the store did not answer: {op['error']}"
    return "pending (`cascade sync`): not sent yet"


def summary_of(points: Any, keys: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Fold points into per-key count, last, min and max (NaN never becomes a min or max)."""
    import math

    for key, value, _, _ in points:
        stats = keys.setdefault(key, {"count": 0, "last": value, "min": value, "max": value})
        stats["count"] += 1
        stats["last"] = value
        if not math.isnan(value):
            stats["min"] = value if math.isnan(stats["min"]) else min(stats["min"], value)
            stats["max"] = value if math.isnan(stats["max"]) else max(stats["max"], value)
    return keys
