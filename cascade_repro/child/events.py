"""The child's event sink: metrics enqueued in microseconds, written to the run dir by a thread."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Mapping

from cascade_repro.child import exit_work
from cascade_repro.child.protocol import open_private

FLUSH_INTERVAL_S = 0.25
CLOSE_WAIT_S = 30.0  # at exit, for the thread's last write


class EventSink:
    """Append-only metric queue; a daemon thread serializes it to `events.jsonl`.

    `add` only converts values to float and appends to a deque (thread-safe, no lock), so a
    training step pays a few microseconds. Every line is one JSON array `[ts_ms, step, {key: value}]`.
    The file is flushed at exit, so a crash or Ctrl-C keeps everything logged before it.

    Only the thread takes points off the queue and writes them: `flush()` asks it and waits. A signal
    handler's exception (the SIGTERM of a dead parent, a Ctrl-C) is raised in the main thread wherever
    it is; raised in the middle of a write there, it lost the points already taken off the queue.
    """

    def __init__(self, path: Path) -> None:
        self._queue: collections.deque[tuple[int, int, dict[str, float]]] = collections.deque()
        self._file = open_private(path)  # closed in close()
        self._lock = threading.Lock()  # the file, and taking points off the queue
        self._closed = threading.Event()
        self._wake = threading.Event()
        self._served = threading.Condition()
        self._asked = 0  # flushes asked of the thread, and done by it
        self._done = 0
        self._pid = os.getpid()
        self._auto_step = 0
        self.lost = 0  # points dropped on a full disk: counted to say it once (on stderr)
        self._thread = threading.Thread(target=self._loop, name="cascade-events", daemon=True)
        self._thread.start()
        exit_work.at_exit(self.close)

    def add(self, metrics: Mapping[str, Any], step: int | None) -> None:
        if step is None:
            step = self._auto_step
            self._auto_step += 1
        try:
            values = {str(k): float(v) for k, v in metrics.items()}
        except (TypeError, ValueError):
            bad = [k for k, v in metrics.items() if not _is_number(v)]
            raise TypeError(f"log_metrics: values must be numbers; not numeric: {bad}") from None
        self._queue.append((time.time_ns() // 1_000_000, int(step), values))

    def flush(self) -> None:
        """Every point queued so far written to the file when this returns."""
        if not self._writer_runs():  # a forked process (a DataLoader worker), or after close
            self._drain()
            return
        with self._served:
            self._asked += 1
            ticket = self._asked
        self._wake.set()
        with self._served:
            while self._done < ticket and self._thread.is_alive():
                self._served.wait(0.1)

    def _writer_runs(self) -> bool:
        return (
            os.getpid() == self._pid
            and self._thread.is_alive()
            and threading.current_thread() is not self._thread
        )

    def _drain(self) -> None:
        with self._lock:
            if self._file.closed:
                return
            lines = []
            queue = self._queue
            while True:
                try:
                    ts, step, values = queue.popleft()
                except IndexError:
                    break
                lines.append(json.dumps([ts, step, values]))
            if lines:
                self._write(lines)

    def _write(self, lines: list[str]) -> None:
        """A write that fails (disk full) drops its points and says so once: the training goes on
        and memory stays bounded; the parent, whose log write fails on the same disk, records the
        run as incomplete."""
        try:
            self._file.write("\n".join(lines) + "\n")
            self._file.flush()
        except OSError as exc:
            if not self.lost:
                sys.stderr.write(f"cascade: metric points are being dropped: {exc.strerror or exc}\n")
            self.lost += len(lines)

    def close(self) -> None:
        """At exit: the thread writes what is queued and ends; a second signal meanwhile (its
        exception) does not stop the wait, and what is left after it is written here."""
        self._closed.set()
        self._wake.set()
        if os.getpid() == self._pid and threading.current_thread() is not self._thread:
            deadline = time.monotonic() + CLOSE_WAIT_S
            while self._thread.is_alive() and time.monotonic() < deadline:
                try:
                    self._thread.join(deadline - time.monotonic())
                except BaseException:  # noqa: BLE001 - exiting already; the points come first
                    continue
        if self._thread.is_alive() and os.getpid() == self._pid:
            return  # a write that hangs (a dead network disk): leave the file to it
        self._drain()
        with self._lock, contextlib.suppress(OSError):  # a full disk: the loss was counted already
            self._file.close()

    def _loop(self) -> None:
        while True:
            self._wake.wait(FLUSH_INTERVAL_S)
            self._wake.clear()
            with self._served:
                ticket = self._asked
            self._drain()
            with self._served:
                self._done = ticket
                self._served.notify_all()
            if self._closed.is_set():
                return


def _is_number(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True
