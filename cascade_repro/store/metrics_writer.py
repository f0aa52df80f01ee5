"""Deliver the run's metric events from the spool to MLflow in batches of at most 1000 points.

The events files are the queue: the writer holds one batch at most, and remembers in the spool
(`metrics.json`) how far each file is delivered, so memory stays bounded whatever the outage, and
`cascade sync` (or a recoverer, after the parent died) goes on from there.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable

from cascade_repro.store import mlflow_store, spool
from cascade_repro.store.delivery import Delivery, summary_of
from cascade_repro.store.spool import EVENT_FILES, PARENT_EVENTS_FILE, Point

log = logging.getLogger(__name__)
POLL_S = 0.2
HEARTBEAT_S = 60.0  # how often a running run tells the store it is alive (cascade.heartbeat)
RETRY_BASE_S = 2.0
RETRY_MAX_S = 30.0


class MetricsWriter:
    """Tails the events files; writes when 1000 points are pending or `flush_s` has passed.

    For N points logged faster than `flush_s`, that is ceil(N / 1000) MLflow requests. When the
    store does not answer, the batch waits (2 s, 4 s, ... 30 s between tries) and the points after
    it stay on disk. Summary figures (last, min, max, count per key) count stored points only.
    """

    def __init__(
        self,
        delivery: Delivery,
        run_dir: Path,
        flush_s: float = 5.0,
        sample: Callable[[], dict[str, float]] | None = None,
        sample_every_s: float = 30.0,
        notify: Callable[[str], None] = lambda message: None,
        heartbeat_s: float | None = None,
    ) -> None:
        self._delivery = delivery
        self._run_dir = run_dir
        self._flush_s = flush_s
        self._sample = sample
        self._sample_every_s = sample_every_s
        self._notify = notify
        self._heartbeat_s = heartbeat_s
        saved = spool.read_json(run_dir / spool.OFFSETS_FILE)
        self._delivered: dict[str, int] = {
            name: int((saved.get("offsets") or {}).get(name, 0)) for name in EVENT_FILES
        }
        self._read = dict(self._delivered)
        self._batch: list[Point] = []
        self._unspooled: list[Point] = []  # the parent's own points its spool file could not take
        self._batch_in_memory = False  # the batch is such points (not in any file)
        self._batch_since: float | None = None
        self._failures = 0
        self._failed_at = 0.0
        self._retry_at = 0.0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.points = int(saved.get("points", 0))
        self.requests = int(saved.get("requests", 0))
        self.errors: list[str] = []
        self.failing: str | None = None  # why the store last did not take a batch
        self.summary: dict[str, dict[str, float]] = {}
        self._thread = threading.Thread(target=self._loop, name="cascade-metrics", daemon=True)

    def start(self) -> MetricsWriter:
        self._thread.start()
        return self

    def add(self, values: dict[str, float], step: int = 0) -> None:
        """Points from the parent itself (resource figures), spooled like the child's (kept in
        memory, and sent with the next batch, where the disk is full)."""
        if not values:
            return
        floats = {k: float(v) for k, v in values.items()}
        try:
            spool.append_event(self._run_dir / PARENT_EVENTS_FILE, floats, step)
        except OSError:
            now = int(time.time() * 1000)
            self._unspooled.extend((k, v, now, step) for k, v in floats.items())

    def stop(self) -> None:
        """Deliver what is left of the events files (one more try if the store was failing); safe
        to call twice, and without `start` (a recoverer drains a dead run's spool this way)."""
        stop_called = time.monotonic()
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        with self._lock:
            # A try that failed while we waited for the thread was the last try: another would wait
            # out MLflow's whole retry budget again.
            failed_just_now = self.failing is not None and self._failed_at >= stop_called
            while not failed_just_now:
                self._top_up()
                if not self._batch or not self._write():
                    break

    @property
    def delivered(self) -> dict[str, int]:
        """How far each events file is in the store (byte offsets)."""
        return dict(self._delivered)

    def pending(self) -> int:
        """Points written to the spool and not yet in the store (counted from the files)."""
        count = len(self._unspooled) + (len(self._batch) if self._batch_in_memory else 0)
        for name in EVENT_FILES:
            offset = self._delivered[name]
            while True:
                points, after, _ = spool.read_points(self._run_dir / name, offset, 10000)
                if after == offset:
                    break
                count += len(points)
                offset = after
        return count

    def _loop(self) -> None:
        next_sample = time.monotonic() + self._sample_every_s
        next_beat = time.monotonic() + (self._heartbeat_s or 0)
        while not self._stop.wait(POLL_S):
            with self._lock:
                if self._sample is not None and time.monotonic() >= next_sample:
                    next_sample = time.monotonic() + self._sample_every_s
                    self.add(self._sample())
                self._top_up()
                while self._due() and self._write():
                    self._top_up()
            # a beat only while the store takes the points: one that does not answer is not waited on twice
            if self._heartbeat_s and time.monotonic() >= next_beat and self.failing is None:
                next_beat = time.monotonic() + self._heartbeat_s
                self._delivery.heartbeat(time.time())

    def _due(self) -> bool:
        if not self._batch or time.monotonic() < self._retry_at or self._stop.is_set():
            return False
        full = len(self._batch) >= mlflow_store.MAX_METRICS_PER_BATCH
        return full or (
            self._batch_since is not None and time.monotonic() - self._batch_since >= self._flush_s
        )

    def _top_up(self) -> None:
        """Read whole lines into the batch until it holds 1000 points (never more than one batch)."""
        if self._unspooled and self._batch_since is None:  # a batch of its own: resent as it is
            self._batch, self._unspooled = self._unspooled, []
            self._batch_since, self._batch_in_memory = time.monotonic(), True
            return
        for name in EVENT_FILES:
            room = mlflow_store.MAX_METRICS_PER_BATCH - len(self._batch)
            if room <= 0:
                return
            points, self._read[name], bad = spool.read_points(self._run_dir / name, self._read[name], room)
            if bad:
                self.errors.append(f"{bad} unreadable metric event line(s) in {name}")
            if points:
                if self._batch_since is None:
                    self._batch_since = time.monotonic()
                self._batch.extend(points)

    def _write(self) -> bool:
        batch = self._batch
        try:
            self.requests += self._delivery.send(batch)
        except Exception as exc:  # keep training: the points stay in the spool
            self._failures += 1
            self._failed_at = time.monotonic()
            self._retry_at = self._failed_at + self._wait_s()
            reason = mlflow_store.first_line(exc)
            if self.failing is None:
                self._notify(
                    f"warning: the store did not take {len(batch)} metric points ({reason}); they stay in "
                    f"{self._run_dir} and are sent again"
                )
            self.failing = reason
            return False
        if self.failing is not None:
            self._notify("the store answers again; sending the spooled metric points")
        self.failing, self._failures = None, 0
        self.points += len(batch)
        summary_of(batch, self.summary)
        self._delivered = dict(self._read)
        self._batch, self._batch_since, self._batch_in_memory = [], None, False
        try:
            spool.write_json(
                self._run_dir / spool.OFFSETS_FILE,
                {"offsets": self._delivered, "points": self.points, "requests": self.requests},
            )
        except OSError:  # a full disk: this process goes on from memory
            pass
        log.debug("wrote %d metric points (%d so far)", len(batch), self.points)
        return True

    def _wait_s(self) -> float:
        return min(RETRY_MAX_S, RETRY_BASE_S * 2 ** max(0, self._failures - 1))

    def summary_dict(self) -> dict[str, Any]:
        return {
            "points": self.points,
            "requests": self.requests,
            "pending": self.pending(),
            "errors": self.errors[:20],
            "keys": {k: dict(v) for k, v in sorted(self.summary.items())},
        }


def full_summary(run_dir: Path, delivered: dict[str, int]) -> dict[str, dict[str, float]]:
    """Per-key figures of every point delivered so far, read back from the spool (a recoverer's
    record covers the points the dead parent delivered too)."""
    keys: dict[str, dict[str, float]] = {}
    for name in EVENT_FILES:
        summary_of(spool.iter_points(run_dir / name, delivered.get(name, 0)), keys)
    return keys
