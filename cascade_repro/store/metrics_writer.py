"""Drain the child's metric events into MLflow in batches of at most 1000 points, off the main thread."""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from cascade_repro.store import mlflow_store
from cascade_repro.store.jsonl_tail import read_new_lines

if TYPE_CHECKING:
    from mlflow import MlflowClient

log = logging.getLogger(__name__)
POLL_S = 0.2

Point = tuple[str, float, int, int]  # key, value, timestamp ms, step


class MetricsWriter:
    """Tails `events.jsonl`; writes when 1000 points are pending or `flush_s` has passed.

    For N points logged faster than `flush_s`, that is ceil(N / 1000) MLflow requests. Summary
    figures (last, min, max, count per key) are kept for the run record.
    """

    def __init__(
        self,
        mlflow: MlflowClient,
        run_id: str,
        events: Path,
        flush_s: float = 5.0,
        sample: Callable[[], dict[str, float]] | None = None,
        sample_every_s: float = 30.0,
    ) -> None:
        self._mlflow = mlflow
        self._run_id = run_id
        self._events = events
        self._flush_s = flush_s
        self._sample = sample
        self._sample_every_s = sample_every_s
        self._pending: list[Point] = []
        self._pending_since: float | None = None
        self._offset = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.points = 0
        self.requests = 0
        self.errors: list[str] = []
        self.summary: dict[str, dict[str, float]] = {}
        self._thread = threading.Thread(target=self._loop, name="cascade-metrics", daemon=True)

    def start(self) -> MetricsWriter:
        self._thread.start()
        return self

    def add(self, values: dict[str, float], step: int = 0) -> None:
        """Points from the parent itself (resource figures)."""
        now = int(time.time() * 1000)
        with self._lock:
            self._queue([(k, float(v), now, step) for k, v in values.items()])

    def stop(self) -> None:
        """Read what is left of the events file and write everything; safe to call twice."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        with self._lock:
            self._read_events()
            self._write()

    def _loop(self) -> None:
        next_sample = time.monotonic() + self._sample_every_s
        while not self._stop.wait(POLL_S):
            with self._lock:
                self._read_events()
                if self._sample is not None and time.monotonic() >= next_sample:
                    next_sample = time.monotonic() + self._sample_every_s
                    sampled = self._sample()
                    if sampled:
                        now = int(time.time() * 1000)
                        self._queue([(k, v, now, 0) for k, v in sampled.items()])
                due = (
                    self._pending_since is not None
                    and time.monotonic() - self._pending_since >= self._flush_s
                )
                while len(self._pending) >= mlflow_store.MAX_METRICS_PER_BATCH or (due and self._pending):
                    self._write(limit=mlflow_store.MAX_METRICS_PER_BATCH)
                    due = False

    def _read_events(self) -> None:
        lines, self._offset = read_new_lines(self._events, self._offset)
        if not lines:
            return
        points: list[Point] = []
        for line in lines:
            try:
                ts, step, values = json.loads(line)
                points.extend((str(k), float(v), int(ts), int(step)) for k, v in values.items())
            except (ValueError, TypeError) as exc:
                self.errors.append(f"unreadable metric event: {exc}")
        self._queue(points)

    def _queue(self, points: list[Point]) -> None:
        if not points:
            return
        if self._pending_since is None:
            self._pending_since = time.monotonic()
        self._pending.extend(points)
        for key, value, _, _ in points:
            stats = self.summary.setdefault(key, {"count": 0, "last": value, "min": value, "max": value})
            stats["count"] += 1
            stats["last"] = value
            if not math.isnan(value):
                stats["min"] = value if math.isnan(stats["min"]) else min(stats["min"], value)
                stats["max"] = value if math.isnan(stats["max"]) else max(stats["max"], value)

    def _write(self, limit: int | None = None) -> None:
        if not self._pending:
            return
        batch = self._pending if limit is None else self._pending[:limit]
        try:
            self.requests += mlflow_store.log_metric_points(self._mlflow, self._run_id, batch)
            self.points += len(batch)
            log.debug("wrote %d metric points in one request (%d so far)", len(batch), self.points)
        except Exception as exc:  # keep training; report at the end of the run
            message = f"MLflow refused {len(batch)} metric points: {exc}"
            log.warning(message)
            self.errors.append(message)
        del self._pending[: len(batch)]
        self._pending_since = time.monotonic() if self._pending else None

    def summary_dict(self) -> dict[str, Any]:
        return {
            "points": self.points,
            "requests": self.requests,
            "errors": self.errors[:20],
            "keys": {k: dict(v) for k, v in sorted(self.summary.items())},
        }
