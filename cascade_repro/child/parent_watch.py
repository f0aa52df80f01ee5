"""The child stops with `cascade run`: the bootstrap of a script, and cascade's torchrun agent."""

from __future__ import annotations

import os
import signal
import sys

from cascade_repro.child import protocol


def stop_with_parent() -> None:
    """SIGTERM when `cascade run` dies (SIGKILL, OOM killer): the script unwinds and flushes to the
    run directory, and the next cascade command delivers it. Linux only; elsewhere the script runs on."""
    expected = os.environ.get(protocol.ENV_PARENT_PID)
    if not expected or not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        pr_set_pdeathsig = 1
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0) != 0:
            return
    except (OSError, AttributeError, ValueError):
        return
    if os.getppid() != int(expected):  # it died before prctl took effect: nobody will signal us
        sys.stderr.write("cascade: the cascade process is gone; not starting the script\n")
        raise SystemExit(128 + signal.SIGTERM)
