"""Processes that stop with their parent: the bootstrap of a script and cascade's torchrun agent stop
with `cascade run`; `cascade ui`'s server guard (store/ui_guard.py) stops with `cascade ui`."""

from __future__ import annotations

import os
import signal
import sys
from typing import Callable

from cascade_repro.child import protocol

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def parent_death_signal() -> Callable[[int], bool] | None:
    """Linux's "send me this signal when my parent ends" (prctl PR_SET_PDEATHSIG; kept across exec,
    and it is the end of the parent's thread that spawned us that counts), for this process to ask
    for. None where there is no such thing."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda signum: bool(prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0)


def stop_with_parent() -> None:
    """SIGTERM when `cascade run` dies (SIGKILL, OOM killer): the script unwinds and flushes to the
    run directory, and the next cascade command delivers it. Linux only; elsewhere the script runs on."""
    expected = os.environ.get(protocol.ENV_PARENT_PID)
    set_signal = parent_death_signal()
    if not expected or set_signal is None:
        return
    try:
        if not set_signal(signal.SIGTERM):
            return
    except ValueError:
        return
    if os.getppid() != int(expected):  # it died before prctl took effect: nobody will signal us
        sys.stderr.write("cascade: the cascade process is gone; not starting the script\n")
        raise SystemExit(128 + signal.SIGTERM)
