"""What the user sees while the script runs: its output, live, and the run's progress below it.

The script's stdout and stderr are relayed to ours and appended to the run's output log as whole
lines, in the order the script wrote them (an unbuffered `print` writes its text and its newline
separately; relayed byte by byte, stdout and stderr would interleave mid-line). A line without its
end yet (a prompt, a bar drawn with `\\r`) is passed on after PARTIAL_LINE_WAIT_S. cascade's own
notices go between the script's lines: after a prompt they wait for its answer's newline (at most
PROMPT_HOLD_S); after a bar, which may stay for an epoch, they start a line of their own.

Progress (the last traced step, the last metric logged, the time) is read from the run directory's
trace and events files. On a terminal it is one line kept at the bottom and redrawn in place; when
stderr is redirected it is a plain line every LINE_EVERY_S (CASCADE_PROGRESS_EVERY seconds; 0: none),
so a log reads in the order things happened. A full disk ends the log, never the relay: the script
must not block on a pipe nobody drains.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import IO, Callable, Iterator

from cascade_repro.child import protocol

PARTIAL_LINE_WAIT_S = 0.1
PROMPT_HOLD_S = 5.0
REDRAW_EVERY_S = 0.5
LINE_EVERY_S = 15.0
TAIL_BYTES = 8192
STDOUT, STDERR = 1, 2


class RunOutput:
    """Relays the child's output (`feed`) and shows the run's progress; `close` when the child ended."""

    def __init__(self, log_path: Path, run_dir: Path | None = None, progress: bool = True) -> None:
        for stream in (sys.stdout, sys.stderr):  # what cascade printed so far goes first
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        self._log: IO[bytes] = protocol.open_private(log_path, "ab")
        self._lock = threading.RLock()
        self.log_error: str | None = None  # why the output log stopped short (a full disk), if it did
        self._logged = 0
        self._sinks: dict[int, IO[bytes] | None] = {
            STDOUT: getattr(sys.stdout, "buffer", None),
            STDERR: getattr(sys.stderr, "buffer", None),
        }
        self._partial: dict[int, bytes] = {STDOUT: b"", STDERR: b""}
        self._partial_since: dict[int, float] = {}
        self._progress = Progress(run_dir) if progress and run_dir is not None else None
        self._in_place = _is_terminal(sys.stderr)
        self._shown = ""  # the progress line on the terminal now
        self._mid_line = False  # the script's last output did not end its line (a prompt, a bar)
        self._bar = False  # the script's line now has a \r in it: a bar drawn in place
        self._held: list[tuple[Callable[[str], None], str]] = []  # notices waiting for a prompt's line
        self._held_since = 0.0
        self._line_every_s = _line_every_s()
        self._line_due = time.monotonic() + self._line_every_s
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick, name="cascade-output", daemon=True)
        self._ticker.start()

    def feed(self, stream: int, chunk: bytes) -> None:
        """Bytes the script wrote to `stream` (STDOUT or STDERR): complete lines go out now."""
        with self._lock:
            data = self._partial[stream] + chunk
            cut = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
            if cut:
                self._emit(stream, data[:cut])
            self._partial[stream] = data[cut:]
            if not data[cut:]:
                self._partial_since.pop(stream, None)
            elif cut or stream not in self._partial_since:
                self._partial_since[stream] = time.monotonic()

    def wrap(self, notify: Callable[[str], None]) -> Callable[[str], None]:
        """`notify` that prints between the script's lines, never inside one or over the progress line."""

        def between_lines(message: str) -> None:
            with self._lock:
                if self._mid_line and not self._bar:  # a prompt: after its line ends
                    self._held_since = self._held_since if self._held else time.monotonic()
                    self._held.append((notify, message))
                    return
                self._notify_now(notify, message)

        return between_lines

    def _notify_now(self, notify: Callable[[str], None], message: str) -> None:
        with self._terminal_free():
            if self._mid_line:  # after a bar drawn with \r, or a prompt left unanswered: a line of our own
                self._write_stderr("\n")
                self._mid_line = False
            notify(message)

    def _release_held(self) -> None:
        held, self._held = self._held, []
        for notify, message in held:
            self._notify_now(notify, message)

    def close(self) -> str | None:
        """Pass on what is left, take the progress line away, close the log; why the log stopped short."""
        self._stop.set()
        self._ticker.join(timeout=5)
        with self._lock:
            for stream, rest in self._partial.items():
                if rest:
                    self._emit(stream, rest)
                    self._partial[stream] = b""
            self._release_held()
            self._clear()
            with contextlib.suppress(OSError):
                self._log.close()
        return self.log_error

    def _emit(self, stream: int, data: bytes) -> None:
        if not self._log.closed and self.log_error is None:  # a grandchild may outlive the child
            try:
                self._log.write(data)
                self._log.flush()
                self._logged += len(data)
            except OSError as exc:
                self.log_error = f"{exc.strerror or exc} after {self._logged} bytes"
                with contextlib.suppress(OSError):
                    self._log.close()
        self._mid_line = not data.endswith(b"\n")
        line_start = data.rfind(b"\n") + 1
        self._bar = b"\r" in data[line_start:] or (self._bar and not line_start)
        sink = self._sinks[stream]
        if sink is not None:
            with self._terminal_free():
                try:
                    sink.write(data)
                    sink.flush()
                except (OSError, ValueError):
                    self._sinks[stream] = None  # the terminal went away; the log still gets everything
        if self._held and not self._mid_line:
            self._release_held()

    @contextlib.contextmanager
    def _terminal_free(self) -> Iterator[None]:
        with self._lock:
            shown = self._shown
            self._clear()
            try:
                yield
            finally:
                if shown and not self._mid_line:
                    self._draw(shown)

    def _tick(self) -> None:
        while not self._stop.wait(PARTIAL_LINE_WAIT_S):
            now = time.monotonic()
            with self._lock:
                for stream, since in list(self._partial_since.items()):
                    if now - since >= PARTIAL_LINE_WAIT_S and self._partial[stream]:
                        self._emit(stream, self._partial[stream])
                        self._partial[stream] = b""
                        del self._partial_since[stream]
                if self._held and now - self._held_since >= PROMPT_HOLD_S:
                    self._release_held()
            if self._progress is None or not self._progress_due(now):
                continue
            line = self._progress.line(now)  # reads the ends of two files: only when it is shown
            with self._lock:
                if self._in_place:
                    if not self._mid_line:  # the script draws its own bar there: leave it that line
                        self._draw(line)
                else:
                    self._line_due = now + self._line_every_s
                    if self._progress.moved():  # a stalled run prints nothing
                        self._write_stderr(f"{chr(10) if self._mid_line else ''}cascade: {line}\n")
                        self._mid_line = False

    def _progress_due(self, now: float) -> bool:
        if self._in_place:
            return self._progress is not None and self._progress.due(now, REDRAW_EVERY_S)
        return bool(self._line_every_s) and now >= self._line_due

    def _draw(self, line: str) -> None:
        width = shutil.get_terminal_size((100, 24)).columns - 1
        if self._write_stderr(f"\r\x1b[K{f'cascade: {line}'[:width]}"):
            self._shown = line

    def _clear(self) -> None:
        if self._shown:
            self._shown = ""
            self._write_stderr("\r\x1b[K")

    def _write_stderr(self, text: str) -> bool:
        try:
            sys.stderr.write(text)
            sys.stderr.flush()
            return True
        except (OSError, ValueError):
            return False


class Progress:
    """The run's progress as the child's files tell it: the last traced step and the last metric."""

    def __init__(self, run_dir: Path) -> None:
        self._run_dir = run_dir
        self._started = time.monotonic()
        self._checked = 0.0
        self._step: int | None = None
        self._reported: int | None = None
        self._metric = ""

    def due(self, now: float, every_s: float) -> bool:
        if now - self._checked < every_s:
            return False
        self._checked = now
        return True

    def line(self, now: float) -> str:
        """`step 1,234 · train_loss 0.0812 · 21s`, from the files as they are now."""
        trace = _last_record(self._run_dir / protocol.TRACE_FILE)
        event = _last_record(self._run_dir / protocol.EVENTS_FILE)
        if isinstance(trace, dict) and isinstance(trace.get("step"), int):
            self._step = trace["step"] + 1  # steps done
        elif isinstance(event, list) and len(event) == 3 and isinstance(event[1], int):
            self._step = event[1]
        if isinstance(event, list) and len(event) == 3 and isinstance(event[2], dict) and event[2]:
            key = min(event[2], key=lambda k: ("loss" not in k.lower(), k))
            value = event[2][key]
            if isinstance(value, (int, float)):
                self._metric = f"{key} {value:.4g}"
        step = "running" if self._step is None else f"step {self._step:,}"
        parts = [step, self._metric, _elapsed(now - self._started)]
        return " · ".join(part for part in parts if part)

    def moved(self) -> bool:
        """Whether the step moved since the last time this was asked (plain lines skip a stalled run)."""
        moved = self._step is not None and self._step != self._reported
        self._reported = self._step
        return moved


def _last_record(path: Path) -> object:
    """The last complete JSON line of a file the child appends to (its end only is read)."""
    try:
        with open(path, "rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(0, size - TAIL_BYTES))
            tail = handle.read()
    except OSError:
        return None
    lines = tail.split(b"\n")
    for line in reversed(lines[:-1]):  # the last element is a line still being written (or empty)
        try:
            return json.loads(line)
        except ValueError:
            continue
    return None


def _line_every_s() -> float:
    try:
        return max(0.0, float(os.environ.get("CASCADE_PROGRESS_EVERY", LINE_EVERY_S)))
    except ValueError:
        return LINE_EVERY_S


def _elapsed(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}:{secs:02d}" if minutes else f"{secs}s"


def _is_terminal(stream: IO[str]) -> bool:
    try:
        return stream.isatty() and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError):
        return False
