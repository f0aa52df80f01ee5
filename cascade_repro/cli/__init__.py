"""The `cascade` command: parse → one api call → render (Hatch-style, a module per group of commands).

    base.py       the group, the error guard, stdout kept clean for --json
    run.py        run
    records.py    ls, show, verify, tag, diff, check
    restoring.py  restore, checkout, push, sync, recover
    project.py    init, image build, ui

Exit codes are the results' own (`exit_status`, errors.py's table); a command only returns them.
"""

from cascade_repro.cli import project, records, restoring, run  # noqa: F401  (registers the commands)
from cascade_repro.cli.base import main

__all__ = ["main"]
