"""`cascade ui`'s server, stopped with `cascade ui`, whatever MLflow version it is.

`python -m cascade_repro.store.ui_guard PARENT_PID COMMAND...` leads the server's process group (its
own session: a terminal's Ctrl-C goes to `cascade ui`, which stops it). On SIGTERM, from `cascade ui`
or from Linux once `cascade ui` has ended (a SIGKILL included: the parent-death signal), it passes
SIGTERM to the whole group: `mlflow server`, its uvicorn and any job workers, which older MLflow
versions' `mlflow server` would leave running. Then it ends with the server's exit status.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from types import FrameType

from cascade_repro.child.parent_watch import parent_death_signal


def main(argv: list[str]) -> int:
    parent, command = int(argv[0]), argv[1:]
    stopped: list[int] = []

    def stop(signum: int, frame: FrameType | None) -> None:
        stopped.append(signum)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # (the group's SIGTERM reaches this process too)
        os.killpg(0, signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    set_signal = parent_death_signal()
    if set_signal is not None:
        set_signal(signal.SIGTERM)
    if stopped or os.getppid() != parent:  # stopped, or `cascade ui` gone, before the server started
        return 128 + signal.SIGTERM
    server = subprocess.Popen(command)
    code = server.wait()
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
