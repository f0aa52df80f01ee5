"""Run the child process: relay its output (run_output.py), forward signals, report how it ended."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO, Callable, Mapping, Protocol, Sequence

from cascade_repro.run_output import STDERR, STDOUT, RunOutput

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# Once the script ended, its output is waited for until it stays quiet this long (a process it
# started may hold the pipes open for good), and at most OUTPUT_WAIT_S in all.
OUTPUT_QUIET_S = 1.0
OUTPUT_WAIT_S = 10.0


@dataclass(frozen=True)
class ChildExit:
    """How the training process ended: its exit code, the signal the parent got, the signal that killed it."""

    exit_code: int  # shell convention: 128 + N when killed by signal N
    signal_received: int | None  # a signal the parent got (Ctrl-C, SIGTERM) while the child ran
    killed_by_signal: int | None  # the signal that ended the child, if any
    log_error: str | None = None  # why the output log stopped short (a full disk), if it did


class RunningChild(Protocol):
    """What the recorder needs of the training process, local (Child) or in a container."""

    @property
    def pid(self) -> int: ...

    def wait(self) -> ChildExit: ...

    def restore_signals(self) -> None: ...

    def terminate(self, timeout_s: float = 10.0) -> None: ...


class Child:
    """The training process. Its output goes to `output` (the terminal and the run's log) as it comes."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], cwd: Path, output: RunOutput,
                 notify: Callable[[str], None]) -> None:  # fmt: skip
        self._output = output  # closed in wait()
        self._notify = notify
        self._last_output = time.monotonic()  # when the script's output last came (the pumps)
        self._received: int | None = None
        self._signal_count = 0
        self.process = subprocess.Popen(
            list(argv), env=dict(env), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        # from the spawn on, not from wait(): the run is being recorded meanwhile, and a Ctrl-C then
        # is the script's to unwind from, as during the wait
        self._signals = ForwardedSignals(self._forward, notify)
        self._pumps = [
            threading.Thread(target=self._pump, args=(self.process.stdout, STDOUT), daemon=True),
            threading.Thread(target=self._pump, args=(self.process.stderr, STDERR), daemon=True),
        ]
        for pump in self._pumps:
            pump.start()

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait(self) -> ChildExit:
        """Wait for the child; Ctrl-C/SIGTERM/SIGHUP are forwarded to it meanwhile (ForwardedSignals)."""
        try:
            # a blocking waitpid: the forwarding handlers run while it waits (PEP 475 retries it), and
            # the child's exit is seen at once (a wait with a timeout polls, up to 50 ms late)
            code = self.process.wait()
        finally:
            self._signals.child_ended()
        self._drain()
        log_error = self._output.close()
        killed = -code if code < 0 else None
        return ChildExit(128 + killed if killed else code, self._received, killed, log_error)

    def _drain(self) -> None:
        """The script's output to its end: the pipes' end, or, where a process the script started
        still holds them (a server, a daemon), until they stay quiet (OUTPUT_QUIET_S): what the script
        wrote before it ended is in the pipes already, read at once."""
        ended = time.monotonic()
        while True:
            alive = [pump for pump in self._pumps if pump.is_alive()]
            if not alive:
                return
            alive[0].join(timeout=0.05)
            now = time.monotonic()
            if now - max(ended, self._last_output) > OUTPUT_QUIET_S or now - ended > OUTPUT_WAIT_S:
                break
        self._notify("a process the script started still holds its output: cascade does not wait for "
                     "it, and what it prints from now on is not in the run's log")  # fmt: skip

    def restore_signals(self) -> None:
        self._signals.restore()

    def terminate(self, timeout_s: float = 10.0) -> None:
        """Stop the child (used when the run cannot be recorded at all)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()

    def _forward(self, signum: int, frame: FrameType | None) -> None:
        self._received = self._received or signum
        self._signal_count += 1
        if self.process.poll() is not None:
            return
        if self._signal_count >= 3:
            self.process.kill()
            return
        self.process.send_signal(signal.SIGINT if signum == signal.SIGINT else signal.SIGTERM)

    def _pump(self, source: IO[bytes] | None, stream: int) -> None:
        if source is None:
            return
        fd = source.fileno()
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            self._last_output = time.monotonic()
            self._output.feed(stream, chunk)
        source.close()


class ForwardedSignals:
    """Ctrl-C/SIGTERM/SIGHUP go to `handler` from the child's start (it forwards them to the child);
    once the child ended (`child_ended`) they only warn through `notify`: nothing may cut the record
    short. `restore` puts back the handlers they replaced.

    A signal ignored when cascade starts (SIGHUP under `nohup`) is left ignored. A terminal's Ctrl-C
    reaches both processes; the child's bootstrap ignores a repeat within a second, so forwarding is
    always safe. The third signal kills the child outright (the handler's
    choice). Signal handlers belong to the main thread: elsewhere (a test's thread) nothing changes.
    """

    def __init__(self, handler: Callable[[int, FrameType | None], None],
                 notify: Callable[[str], None]) -> None:  # fmt: skip
        self._notify = notify
        self._previous: dict[int, object] = {}
        if threading.current_thread() is threading.main_thread():
            # one ignored when cascade started stays ignored, by both processes (the child inherits
            # it): `nohup cascade run` must outlive the terminal's SIGHUP
            self._previous = {sig: signal.getsignal(sig) for sig in FORWARDED}
            self._previous = {sig: was for sig, was in self._previous.items() if was != signal.SIG_IGN}
            for sig in self._previous:
                signal.signal(sig, handler)

    def child_ended(self) -> None:
        for sig in self._previous:
            signal.signal(sig, self._finishing)

    def restore(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)  # type: ignore[arg-type]

    def _finishing(self, signum: int, frame: FrameType | None) -> None:
        self._notify("finishing the run record, one moment...")
