"""The step trace's file: records appended as JSON lines, encoded and written in batches.

A record is kept as it was read when its step happened (the loss tensor, copies of the generator
states, fingerprints still on a device) and turned into bits and fingerprints here, at flush:
encoding 30 at once costs less than one at a time between training steps (cold caches), and a
device is waited for once per flush rather than at every step. What a crash loses is the same: the
last half second. Records are written with their keys in a fixed order and numbers in one
notation, so equal records are equal lines (determinism/trace_file.py compares them as text).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from cascade_repro.child import step_values
from cascade_repro.child.protocol import open_private
from cascade_repro.child.step_tensors import settle

FLUSH_EVERY_S = 0.5  # a crash keeps the trace up to here; an exception or Ctrl-C keeps all of it
# what json.dumps(record, separators=(",", ":")) writes, without building an encoder per record
_JSON = json.JSONEncoder(separators=(",", ":"))


class TraceWriter:
    """`trace.jsonl`, open from the first step to `close()`."""

    def __init__(self, torch: Any, path: Path) -> None:
        self.torch = torch
        self._file = open_private(path)  # closed in close()
        self._unwritten: list[dict[str, Any]] = []
        self._lines: list[str] = []  # the first of them encoded, not written yet
        self._flushed_at = time.perf_counter()

    @property
    def closed(self) -> bool:
        return self._file.closed

    def write(self, record: dict[str, Any]) -> None:
        """Queue a record (written with the others every FLUSH_EVERY_S)."""
        self._unwritten.append(record)
        if time.perf_counter() - self._flushed_at >= FLUSH_EVERY_S:
            self.flush()

    def flush(self) -> None:
        """The queued records encoded and written. A signal handler's exception (the SIGTERM of a dead
        parent, a Ctrl-C) may come at any point of it: the records stay queued until written (with the
        lines encoded so far), so `close()` at exit writes them; at worst a line twice, never none."""
        try:
            settle(self.torch, self._unwritten)  # device fingerprints: one copy back for all of them
            step_values.read_losses(self.torch, self._unwritten)  # and the losses held as tensors
            while len(self._lines) < len(self._unwritten):
                self._lines.append(self._encode(self._unwritten[len(self._lines)]))
        except Exception:  # records that cannot be read (a device in error) are not tried again
            self._unwritten.clear()
            self._lines.clear()
            raise
        if self._lines:
            self._file.write("".join(self._lines))
            self._unwritten.clear()
            self._lines.clear()
            self._file.flush()
        self._flushed_at = time.perf_counter()

    def close(self) -> None:
        self.flush()
        self._file.close()

    def abandon(self) -> None:
        """Close the file without the records not written yet: the trace keeps what was flushed
        before, as a crashed run's does."""
        self._unwritten.clear()
        self._lines.clear()
        self._file.close()

    def _encode(self, record: dict[str, Any]) -> str:
        """The loss tensor and the RNG state copies as bits and fingerprints, then one JSON line. The
        record is left as it was (encoded again, if this one is cut short, it gives the same line)."""
        record = dict(record)
        if "loss" in record:  # (the final weights' own record has none)
            record["loss"] = step_values.loss_record(self.torch, record["loss"])
        rng = record.get("rng")
        if rng:  # (a dict shared by records: replaced, not changed)
            record["rng"] = {name: step_values.rng_hash(state) for name, state in rng.items()}
        return _JSON.encode(record) + "\n"
